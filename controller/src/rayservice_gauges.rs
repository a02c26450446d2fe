//! The per-RayService gauges, kept as one row per RayService and turned into their metric families only
//! when scraped. As prometheus `GaugeVec`s they were 16 series per RayService of about 600 bytes each (every
//! series holds its own copy of the family's descriptor and of its labels): about 9 MiB at 1,000
//! RayServices, for numbers a row holds in 150 bytes (issue 16: controller RSS).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, RwLock},
};

use prometheus::{
    core::{Collector, Desc},
    proto::{Gauge, LabelPair, Metric, MetricFamily, MetricType},
};

use crate::metrics::PHASES;

/// What the gauges of one RayService show.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    /// (target capacity, traffic) in percent of the active and of the pending cluster, where there is one.
    pub sides: [Option<(f64, f64)>; 2],
    pub phase: &'static str,
    pub upgrade_in_progress: bool,
    pub rollback: bool,
    pub paused: bool,
    pub resource_aware: bool,
    pub stalled: bool,
    pub capacity_dip: f64,
    pub capacity_freed: f64,
    pub seconds_until_next_step: f64,
    /// Kept once set: the last step of the last upgrade.
    pub last_step_unix: Option<f64>,
    pub expected_completion_unix: Option<f64>,
}

/// How a family's series come from a row.
enum Series {
    /// One per cluster role with a cluster, labelled `role`.
    PerRole(fn(&(f64, f64)) -> f64),
    /// One per phase, labelled `phase`: 1 for the row's phase, 0 for the others (a state set).
    PerPhase,
    /// One, if the row has a value.
    Single(fn(&Row) -> Option<f64>),
}

const ROLES: [&str; 2] = ["active", "pending"];

fn flag(on: bool) -> Option<f64> {
    Some(if on { 1.0 } else { 0.0 })
}

/// The families, with their help texts, in the order they were registered before.
#[rustfmt::skip]
const FAMILIES: &[(&str, &str, Series)] = &[
    ("rayshift_rayservice_target_capacity_percent",
     "Ray Serve target_capacity of the RayService's active or pending cluster.",
     Series::PerRole(|s| s.0)),
    ("rayshift_rayservice_traffic_percent",
     "HTTPRoute weight (percent of traffic) of the active or pending cluster.",
     Series::PerRole(|s| s.1)),
    ("rayshift_rayservice_upgrade_phase",
     "Upgrade phase of the RayService: 1 for the current phase, 0 for the others.",
     Series::PerPhase),
    ("rayshift_rayservice_upgrade_in_progress",
     "1 while the RayService has a pending cluster.",
     Series::Single(|r| flag(r.upgrade_in_progress))),
    ("rayshift_rayservice_rollback_in_progress",
     "1 while an incremental upgrade is being rolled back.",
     Series::Single(|r| flag(r.rollback))),
    ("rayshift_rayservice_upgrade_paused",
     "1 while the incremental upgrade is paused.",
     Series::Single(|r| flag(r.paused))),
    ("rayshift_rayservice_upgrade_resource_aware",
     "1 while the incremental upgrade paces ResourceAware (rayshift.io/resource-aware: always, or on-stall after its pending cluster stalled).",
     Series::Single(|r| flag(r.resource_aware))),
    ("rayshift_rayservice_pending_cluster_unschedulable",
     "1 while the pending cluster's Pods cannot be scheduled for lack of a resource.",
     Series::Single(|r| flag(r.stalled))),
    ("rayshift_rayservice_capacity_dip_percent",
     "How far a cluster's Serve target_capacity is below the traffic it carries: a ResourceAware upgrade's dip, at most maxUnavailablePercent; 0 otherwise.",
     Series::Single(|r| Some(r.capacity_dip))),
    ("rayshift_rayservice_capacity_freed_percent",
     "What the active cluster gave back (100 - its target_capacity, in percent of a full copy) for the pending one while a ResourceAware upgrade runs; 0 otherwise.",
     Series::Single(|r| Some(r.capacity_freed))),
    ("rayshift_rayservice_last_traffic_step_timestamp_seconds",
     "Unix time of the last traffic step.",
     Series::Single(|r| r.last_step_unix)),
    ("rayshift_rayservice_seconds_until_next_traffic_step",
     "Seconds until the next traffic step is due (0 when due or waiting on something else).",
     Series::Single(|r| Some(r.seconds_until_next_step))),
    ("rayshift_rayservice_upgrade_expected_completion_timestamp_seconds",
     "Unix time the running incremental upgrade should end (recomputed at each step; absent while paused).",
     Series::Single(|r| r.expected_completion_unix)),
];

/// The rows, one per RayService by (namespace, name), and the families they are scraped as.
#[derive(Clone)]
pub struct RayServiceGauges {
    descs: Arc<Vec<Desc>>,
    rows: Arc<RwLock<BTreeMap<(String, String), Row>>>,
}

impl RayServiceGauges {
    pub fn new() -> prometheus::Result<Self> {
        let descs = FAMILIES
            .iter()
            .map(|(name, help, series)| {
                let mut labels = vec!["namespace".to_string(), "name".to_string()];
                match series {
                    Series::PerRole(_) => labels.push("role".into()),
                    Series::PerPhase => labels.push("phase".into()),
                    Series::Single(_) => {}
                }
                Desc::new(name.to_string(), help.to_string(), labels, HashMap::new())
            })
            .collect::<prometheus::Result<_>>()?;
        Ok(Self {
            descs: Arc::new(descs),
            rows: Arc::default(),
        })
    }

    /// Sets the row of one RayService; a last step already shown is kept when `row` has none.
    pub fn set(&self, ns: &str, name: &str, mut row: Row) {
        let mut rows = self.rows.write().unwrap_or_else(|e| e.into_inner());
        let key = (ns.to_string(), name.to_string());
        if row.last_step_unix.is_none() {
            row.last_step_unix = rows.get(&key).and_then(|r| r.last_step_unix);
        }
        rows.insert(key, row);
    }

    pub fn remove(&self, ns: &str, name: &str) {
        let mut rows = self.rows.write().unwrap_or_else(|e| e.into_inner());
        rows.remove(&(ns.to_string(), name.to_string()));
    }

    /// The RayServices that have a row.
    pub fn rayservices(&self) -> Vec<(String, String)> {
        let rows = self.rows.read().unwrap_or_else(|e| e.into_inner());
        rows.keys().cloned().collect()
    }
}

fn label(name: &str, value: &str) -> LabelPair {
    let mut pair = LabelPair::default();
    pair.set_name(name.to_string());
    pair.set_value(value.to_string());
    pair
}

fn gauge(labels: Vec<LabelPair>, value: f64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(value);
    let mut metric = Metric::from_label(labels);
    metric.set_gauge(g);
    metric
}

/// The series of one family for one row.
fn series_of(series: &Series, (ns, name): &(String, String), row: &Row, out: &mut Vec<Metric>) {
    let labels = |extra: Option<(&str, &str)>| {
        let mut pairs = vec![label("namespace", ns), label("name", name)];
        pairs.extend(extra.map(|(k, v)| label(k, v)));
        pairs
    };
    match series {
        Series::PerRole(value) => {
            for (role, side) in ROLES.iter().zip(&row.sides) {
                if let Some(side) = side {
                    out.push(gauge(labels(Some(("role", role))), value(side)));
                }
            }
        }
        Series::PerPhase => {
            for phase in PHASES {
                let on = if *phase == row.phase { 1.0 } else { 0.0 };
                out.push(gauge(labels(Some(("phase", phase))), on));
            }
        }
        Series::Single(value) => {
            if let Some(v) = value(row) {
                out.push(gauge(labels(None), v));
            }
        }
    }
}

impl Collector for RayServiceGauges {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let rows = self.rows.read().unwrap_or_else(|e| e.into_inner());
        let mut families = Vec::new();
        for ((name, help, series), _) in FAMILIES.iter().zip(self.descs.iter()) {
            let mut metrics = Vec::new();
            for (key, row) in rows.iter() {
                series_of(series, key, row, &mut metrics);
            }
            if metrics.is_empty() {
                continue;
            }
            let mut family = MetricFamily::default();
            family.set_name(name.to_string());
            family.set_help(help.to_string());
            family.set_field_type(MetricType::GAUGE);
            family.set_metric(metrics);
            families.push(family);
        }
        families
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(gauges: &RayServiceGauges) -> String {
        let registry = prometheus::Registry::new();
        registry.register(Box::new(gauges.clone())).unwrap();
        prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap()
    }

    fn upgrading() -> Row {
        Row {
            sides: [Some((100.0, 75.0)), Some((50.0, 25.0))],
            phase: "Upgrading",
            upgrade_in_progress: true,
            seconds_until_next_step: 1.5,
            last_step_unix: Some(1_700_000_000.0),
            ..Row::default()
        }
    }

    #[test]
    fn a_row_is_scraped_as_the_series_the_gauge_vecs_had() {
        let gauges = RayServiceGauges::new().unwrap();
        gauges.set("ns", "svc", upgrading());
        let text = scrape(&gauges);
        for line in [
            r#"rayshift_rayservice_traffic_percent{namespace="ns",name="svc",role="active"} 75"#,
            r#"rayshift_rayservice_traffic_percent{namespace="ns",name="svc",role="pending"} 25"#,
            r#"rayshift_rayservice_target_capacity_percent{namespace="ns",name="svc",role="pending"} 50"#,
            r#"rayshift_rayservice_upgrade_phase{namespace="ns",name="svc",phase="Upgrading"} 1"#,
            r#"rayshift_rayservice_upgrade_phase{namespace="ns",name="svc",phase="Idle"} 0"#,
            r#"rayshift_rayservice_upgrade_in_progress{namespace="ns",name="svc"} 1"#,
            r#"rayshift_rayservice_upgrade_paused{namespace="ns",name="svc"} 0"#,
            r#"rayshift_rayservice_seconds_until_next_traffic_step{namespace="ns",name="svc"} 1.5"#,
            r#"rayshift_rayservice_last_traffic_step_timestamp_seconds{namespace="ns",name="svc"} 1700000000"#,
            "# TYPE rayshift_rayservice_capacity_dip_percent gauge",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        // No expected completion set: no series, as a removed GaugeVec child.
        assert!(!text.contains("expected_completion"), "{text}");
        assert_eq!(
            text.matches("rayshift_rayservice_upgrade_phase{").count(),
            PHASES.len()
        );
    }

    #[test]
    fn a_side_without_a_cluster_has_no_series_and_the_last_step_is_kept() {
        let gauges = RayServiceGauges::new().unwrap();
        gauges.set("ns", "svc", upgrading());
        let idle = Row {
            sides: [Some((100.0, 100.0)), None],
            phase: "Idle",
            ..Row::default()
        };
        gauges.set("ns", "svc", idle);
        let text = scrape(&gauges);
        assert!(!text.contains(r#"role="pending""#), "{text}");
        assert!(
            text.contains(r#"rayshift_rayservice_last_traffic_step_timestamp_seconds{namespace="ns",name="svc"} 1700000000"#),
            "{text}"
        );
    }

    #[test]
    fn a_removed_rayservice_has_no_series_left() {
        let gauges = RayServiceGauges::new().unwrap();
        gauges.set("ns", "gone", upgrading());
        gauges.set("ns", "kept", upgrading());
        gauges.remove("ns", "gone");
        let text = scrape(&gauges);
        assert!(!text.contains(r#"name="gone""#), "{text}");
        assert!(text.contains(r#"name="kept""#), "{text}");
        assert_eq!(gauges.rayservices(), vec![("ns".to_string(), "kept".to_string())]);
    }
}
