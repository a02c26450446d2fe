//! The per-RayService gauges, kept as one row per RayService and turned into their metric families only
//! when scraped. As prometheus `GaugeVec`s they were 16 series per RayService of about 600 bytes each (every
//! series holds its own copy of the family's descriptor and of its labels): about 9 MiB at 1,000
//! RayServices, for numbers one row of about 200 bytes holds (issue 16: controller RSS).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, RwLock},
};

use jiff::Timestamp;
use prometheus::{
    core::{Collector, Desc},
    proto::{Gauge, LabelPair, Metric, MetricFamily, MetricType},
};
use rayshift_api::{
    RayService,
    rayservice::{ClusterServiceStatus, RayServiceStatuses},
};

/// Phases of a RayService, exported as a state set (one series per phase, 1 for the current one).
const PHASES: &[&str] = &[
    "Idle",
    "Initializing",
    "Upgrading",
    "Waiting",
    "Paused",
    "RollingBack",
];
/// What the metrics show of one RayService after a pass.
#[derive(Clone, Debug, Default)]
pub struct ServiceView {
    pub phase: &'static str,
    pub paused: bool,
    /// The running upgrade paces ResourceAware, switched on a stall (issue 18).
    pub resource_aware: bool,
    /// Its pending cluster's Pods cannot be scheduled for lack of a resource.
    pub stalled: bool,
    /// How far a cluster's target capacity is below the traffic it carries (ResourceAware's dip), in percent.
    pub capacity_dip: f64,
    /// What the active cluster gave back for the pending one while the upgrade paces ResourceAware, in percent
    /// of a full copy.
    pub capacity_freed: f64,
    pub rollback: bool,
    pub seconds_until_next_step: Option<f64>,
    pub last_step_unix: Option<f64>,
}

impl ServiceView {
    /// The metrics' view of a RayService from its status.
    pub fn of(rs: &RayService, status: &RayServiceStatuses, now: Timestamp) -> Self {
        let named =
            |s: &Option<ClusterServiceStatus>| s.as_ref().and_then(|s| s.ray_cluster_name.as_ref()).is_some();
        let cond = |t: &str| status.conditions.iter().flatten().find(|c| c.type_ == t).cloned();
        let rollback =
            cond(rayshift_api::conditions::ROLLBACK_IN_PROGRESS).is_some_and(|c| c.status == "True");
        let progressing = cond(rayshift_api::upgrade::decide::PROGRESSING);
        let paused = progressing.as_ref().is_some_and(|c| c.reason == "Paused");
        let phase = match (
            named(&status.active_service_status),
            named(&status.pending_service_status),
        ) {
            (false, _) => "Initializing",
            (true, false) => "Idle",
            (true, true) if rollback => "RollingBack",
            (true, true) if paused => "Paused",
            (true, true) if progressing.as_ref().is_some_and(|c| c.status == "False") => "Waiting",
            (true, true) => "Upgrading",
        };
        let last_step = rayshift_api::upgrade::decide::last_step_time(status);
        let interval = rs
            .spec
            .cluster_upgrade_options()
            .and_then(|o| o.interval_seconds)
            .map(f64::from);
        let until = match (phase, last_step, interval) {
            ("Upgrading" | "RollingBack", Some(t), Some(i)) => {
                Some((i - now.duration_since(t).as_secs_f64()).max(0.0))
            }
            _ => None,
        };
        ServiceView {
            phase,
            paused,
            resource_aware: status.progress.resource_aware_since.is_some(),
            stalled: status.progress.pending_stall.is_some(),
            capacity_dip: capacity_dip(status),
            capacity_freed: capacity_freed(status),
            rollback,
            seconds_until_next_step: until,
            last_step_unix: last_step.map(|t| t.as_millisecond() as f64 / 1000.0),
        }
    }
}

/// The largest gap between a cluster's traffic and its target capacity (0 unless ResourceAware dips).
fn capacity_dip(status: &RayServiceStatuses) -> f64 {
    let sides = [&status.active_service_status, &status.pending_service_status];
    let gaps = sides
        .into_iter()
        .flatten()
        .filter_map(|s| Some(s.traffic_routed_percent? - s.target_capacity?));
    f64::from(gaps.max().unwrap_or(0).max(0))
}

/// 100 − the active cluster's target capacity, while a ResourceAware upgrade runs (0 otherwise).
fn capacity_freed(status: &RayServiceStatuses) -> f64 {
    let running = status.progress.resource_aware_since.is_some() && status.pending_service_status.is_some();
    let active = status
        .active_service_status
        .as_ref()
        .and_then(|s| s.target_capacity);
    match (running, active) {
        (true, Some(c)) => f64::from(100 - c),
        _ => 0.0,
    }
}

/// What the gauges of one RayService show.
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// (target capacity, traffic) in percent of the active and of the pending cluster, where there is one.
    pub sides: [Option<(f64, f64)>; 2],
    pub expected_completion_unix: Option<f64>,
    /// Its last step is kept once set: the last step of the last upgrade.
    pub view: ServiceView,
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
     Series::Single(|r| flag(r.sides.iter().all(Option::is_some)))),
    ("rayshift_rayservice_rollback_in_progress",
     "1 while an incremental upgrade is being rolled back.",
     Series::Single(|r| flag(r.view.rollback))),
    ("rayshift_rayservice_upgrade_paused",
     "1 while the incremental upgrade is paused.",
     Series::Single(|r| flag(r.view.paused))),
    ("rayshift_rayservice_upgrade_resource_aware",
     "1 while the incremental upgrade paces ResourceAware (rayshift.io/resource-aware: always, or on-stall after its pending cluster stalled).",
     Series::Single(|r| flag(r.view.resource_aware))),
    ("rayshift_rayservice_pending_cluster_unschedulable",
     "1 while the pending cluster's Pods cannot be scheduled for lack of a resource.",
     Series::Single(|r| flag(r.view.stalled))),
    ("rayshift_rayservice_capacity_dip_percent",
     "How far a cluster's Serve target_capacity is below the traffic it carries: a ResourceAware upgrade's dip, at most maxUnavailablePercent; 0 otherwise.",
     Series::Single(|r| Some(r.view.capacity_dip))),
    ("rayshift_rayservice_capacity_freed_percent",
     "What the active cluster gave back (100 - its target_capacity, in percent of a full copy) for the pending one while a ResourceAware upgrade runs; 0 otherwise.",
     Series::Single(|r| Some(r.view.capacity_freed))),
    ("rayshift_rayservice_last_traffic_step_timestamp_seconds",
     "Unix time of the last traffic step.",
     Series::Single(|r| r.view.last_step_unix)),
    ("rayshift_rayservice_seconds_until_next_traffic_step",
     "Seconds until the next traffic step is due (0 when due or waiting on something else).",
     Series::Single(|r| Some(r.view.seconds_until_next_step.unwrap_or(0.0)))),
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
        if row.view.last_step_unix.is_none() {
            row.view.last_step_unix = rows.get(&key).and_then(|r| r.view.last_step_unix);
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
        // Sorted by name, as prometheus orders a vector's labels (queries and tests match the text).
        let mut pairs = vec![label("name", name), label("namespace", ns)];
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
                let on = if *phase == row.view.phase { 1.0 } else { 0.0 };
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
        for (name, help, series) in FAMILIES {
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
            expected_completion_unix: None,
            view: ServiceView {
                phase: "Upgrading",
                seconds_until_next_step: Some(1.5),
                last_step_unix: Some(1_700_000_000.0),
                ..ServiceView::default()
            },
        }
    }

    #[test]
    fn a_row_is_scraped_as_the_series_the_gauge_vecs_had() {
        let gauges = RayServiceGauges::new().unwrap();
        gauges.set("ns", "svc", upgrading());
        let text = scrape(&gauges);
        for line in [
            r#"rayshift_rayservice_traffic_percent{name="svc",namespace="ns",role="active"} 75"#,
            r#"rayshift_rayservice_traffic_percent{name="svc",namespace="ns",role="pending"} 25"#,
            r#"rayshift_rayservice_target_capacity_percent{name="svc",namespace="ns",role="pending"} 50"#,
            r#"rayshift_rayservice_upgrade_phase{name="svc",namespace="ns",phase="Upgrading"} 1"#,
            r#"rayshift_rayservice_upgrade_phase{name="svc",namespace="ns",phase="Idle"} 0"#,
            r#"rayshift_rayservice_upgrade_in_progress{name="svc",namespace="ns"} 1"#,
            r#"rayshift_rayservice_upgrade_paused{name="svc",namespace="ns"} 0"#,
            r#"rayshift_rayservice_seconds_until_next_traffic_step{name="svc",namespace="ns"} 1.5"#,
            r#"rayshift_rayservice_last_traffic_step_timestamp_seconds{name="svc",namespace="ns"} 1700000000"#,
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
            view: ServiceView {
                phase: "Idle",
                ..ServiceView::default()
            },
            ..Row::default()
        };
        gauges.set("ns", "svc", idle);
        let text = scrape(&gauges);
        assert!(!text.contains(r#"role="pending""#), "{text}");
        assert!(
            text.contains(r#"rayshift_rayservice_last_traffic_step_timestamp_seconds{name="svc",namespace="ns"} 1700000000"#),
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
