//! The controller's Prometheus metrics, registered on a registry passed in.

use prometheus::{GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use rayshift_api::rayservice::{ClusterServiceStatus, RayServiceStatuses};

pub use crate::rayservice_gauges::ServiceView;
use crate::rayservice_gauges::{RayServiceGauges, Row};

const RECONCILE_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const DASHBOARD_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

const ROLES: &[&str] = &["active", "pending"];
const RESULTS: &[&str] = &["started", "completed", "rolled_back", "aborted"];
const STEP_BUCKETS: &[f64] = &[0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];
const UPGRADE_BUCKETS: &[f64] = &[
    10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0,
];

#[derive(Clone)]
pub struct Metrics {
    health: Health,
    /// The gauges of each RayService's phase, capacity and traffic.
    services: RayServiceGauges,
    upgrades: IntCounterVec,
    traffic_steps: IntCounterVec,
    capacity_changes: IntCounterVec,
    upgrade_duration: HistogramVec,
    step_wait: HistogramVec,
    slo_evaluations: IntCounterVec,
    slo_value: GaugeVec,
}

impl Metrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let r = Registrar(registry);
        let svc = &["namespace", "name"];
        let role = &["namespace", "name", "role"];
        let result = &["namespace", "name", "result"];
        let m = Self {
            health: Health::register(&r)?,
            services: r.add(RayServiceGauges::new()?)?,
            upgrades: r.counters(
                "rayshift_upgrades_total",
                "Upgrades by outcome: started, completed, rolled_back, aborted.",
                result,
            )?,
            traffic_steps: r.counters(
                "rayshift_traffic_steps_total",
                "HTTPRoute weight changes made by incremental upgrades.",
                svc,
            )?,
            capacity_changes: r.counters(
                "rayshift_capacity_changes_total",
                "Ray Serve target_capacity changes, by cluster role.",
                role,
            )?,
            upgrade_duration: r.histograms(
                "rayshift_upgrade_duration_seconds",
                "Time from an upgrade's start to its promotion or rollback.",
                result,
                UPGRADE_BUCKETS,
            )?,
            step_wait: r.histograms(
                "rayshift_traffic_step_wait_seconds",
                "Time between consecutive traffic steps of an upgrade.",
                svc,
                STEP_BUCKETS,
            )?,
            slo_evaluations: r.counters(
                "rayshift_slo_check_evaluations_total",
                "SLO check evaluations in incremental upgrades, by check and outcome: pass, fail, no_data, unavailable.",
                &["namespace", "name", "check", "outcome"],
            )?,
            slo_value: r.gauges(
                "rayshift_slo_check_value",
                "The value of each SLO check's query at its last evaluation that returned one.",
                &["namespace", "name", "check"],
            )?,
        };
        Ok(m)
    }

    pub fn set_leader(&self, on: bool) {
        self.health.leader.set(if on { 1.0 } else { 0.0 });
        if !on {
            // A replica that does not lead runs no passes, so none fail there (its last count would alert).
            self.health.failing.set(0);
        }
    }

    pub fn reconcile_timer(&self) -> prometheus::HistogramTimer {
        self.health.reconcile_duration.start_timer()
    }

    pub fn reconcile_error(&self, reason: &str) {
        self.health.reconcile_errors.with_label_values(&[reason]).inc();
    }

    /// The gauge of RayServices whose last pass failed (kept by `retry::Retries`).
    pub fn failing_rayservices(&self) -> prometheus::IntGauge {
        self.health.failing.clone()
    }

    pub fn api_write(&self, kind: &str, verb: &str) {
        self.health.api_writes.with_label_values(&[kind, verb]).inc();
    }

    pub fn dashboard_latency(&self, op: &str) -> prometheus::HistogramTimer {
        self.health
            .dashboard_latency
            .with_label_values(&[op])
            .start_timer()
    }

    pub fn health_check(&self, outcome: &str) {
        self.health.health_checks.with_label_values(&[outcome]).inc();
    }

    pub fn dashboard_error(&self, op: &str) {
        self.health.dashboard_errors.with_label_values(&[op]).inc();
    }

    /// Gauges of one RayService from its status after a pass.
    pub fn observe_service(&self, ns: &str, name: &str, status: &RayServiceStatuses, view: &ServiceView) {
        let side = |s: &Option<ClusterServiceStatus>, default: f64| {
            let s = s.as_ref().filter(|s| s.ray_cluster_name.is_some())?;
            let percent = |v: Option<i32>| v.map_or(default, f64::from);
            Some((percent(s.target_capacity), percent(s.traffic_routed_percent)))
        };
        let row = Row {
            sides: [
                side(&status.active_service_status, 100.0),
                side(&status.pending_service_status, 0.0),
            ],
            view: view.clone(),
            expected_completion_unix: status
                .progress
                .upgrade_expected_completion_time
                .map(|t| t.as_millisecond() as f64 / 1000.0),
        };
        self.services.set(ns, name, row);
    }

    pub fn upgrade(&self, ns: &str, name: &str, result: &str, duration_seconds: Option<f64>) {
        self.upgrades.with_label_values(&[ns, name, result]).inc();
        if let Some(d) = duration_seconds {
            self.upgrade_duration
                .with_label_values(&[ns, name, result])
                .observe(d);
        }
    }

    pub fn traffic_step(&self, ns: &str, name: &str, waited_seconds: Option<f64>) {
        self.traffic_steps.with_label_values(&[ns, name]).inc();
        if let Some(w) = waited_seconds {
            self.step_wait.with_label_values(&[ns, name]).observe(w);
        }
    }

    pub fn capacity_change(&self, ns: &str, name: &str, role: &str) {
        self.capacity_changes.with_label_values(&[ns, name, role]).inc();
    }

    /// Drops the series of every RayService not in `present` (namespace, name).
    pub fn forget_services_except(&self, present: &std::collections::HashSet<(&str, &str)>) {
        for (ns, name) in self.services.rayservices() {
            if !present.contains(&(ns.as_str(), name.as_str())) {
                self.forget_service(&ns, &name);
            }
        }
    }

    /// Drops every series of a deleted RayService.
    pub fn forget_service(&self, ns: &str, name: &str) {
        self.services.remove(ns, name);
        for role in ROLES {
            let _ = self.capacity_changes.remove_label_values(&[ns, name, role]);
        }
        for result in RESULTS {
            let _ = self.upgrades.remove_label_values(&[ns, name, result]);
            let _ = self.upgrade_duration.remove_label_values(&[ns, name, result]);
        }
        let _ = self.traffic_steps.remove_label_values(&[ns, name]);
        let _ = self.step_wait.remove_label_values(&[ns, name]);
        remove_service_series(&self.slo_evaluations, ns, name);
        remove_service_series(&self.slo_value, ns, name);
    }

    /// One SLO check evaluated: its outcome counted, its value (when there is one) kept.
    pub fn slo_evaluation(
        &self,
        ns: &str,
        name: &str,
        check: &str,
        outcome: rayshift_api::slo::Outcome,
        value: Option<f64>,
    ) {
        self.slo_evaluations
            .with_label_values(&[ns, name, check, outcome.as_str()])
            .inc();
        if let Some(v) = value {
            self.slo_value.with_label_values(&[ns, name, check]).set(v);
        }
    }
}

/// Drops the series of one RayService from a family whose other labels (a check's name) are not known here.
fn remove_service_series<T: prometheus::core::MetricVecBuilder>(
    family: &prometheus::core::MetricVec<T>,
    ns: &str,
    name: &str,
) {
    use prometheus::core::Collector;
    for f in family.collect() {
        for m in f.get_metric() {
            let labels: std::collections::HashMap<&str, &str> =
                m.get_label().iter().map(|l| (l.name(), l.value())).collect();
            if labels.get("namespace") == Some(&ns) && labels.get("name") == Some(&name) {
                let _ = family.remove(&labels);
            }
        }
    }
}

/// The controller's own health: leadership, passes, API writes, dashboard requests.
#[derive(Clone)]
struct Health {
    leader: prometheus::Gauge,
    reconcile_duration: Histogram,
    reconcile_errors: IntCounterVec,
    failing: prometheus::IntGauge,
    api_writes: IntCounterVec,
    dashboard_latency: HistogramVec,
    dashboard_errors: IntCounterVec,
    health_checks: IntCounterVec,
}

impl Health {
    fn register(r: &Registrar<'_>) -> prometheus::Result<Self> {
        let h = Self {
            leader: r.add(prometheus::Gauge::new(
                "rayshift_controller_leader",
                "1 while this replica holds the leader Lease and reconciles.",
            )?)?,
            reconcile_duration: r.add(Histogram::with_opts(
                HistogramOpts::new(
                    "rayshift_reconcile_duration_seconds",
                    "Time of one RayService reconcile pass.",
                )
                .buckets(RECONCILE_BUCKETS.to_vec()),
            )?)?,
            reconcile_errors: r.counters(
                "rayshift_reconcile_errors_total",
                "Reconcile passes that failed, by reason.",
                &["reason"],
            )?,
            failing: r.add(prometheus::IntGauge::new(
                "rayshift_rayservices_failing",
                "RayServices whose last reconcile pass failed, or whose Ray dashboard refused it; they are retried, \
                 with backoff when the failure persists (a refused write or token, a spec rayshift cannot act on).",
            )?)?,
            api_writes: r.counters(
                "rayshift_kubernetes_writes_total",
                "Writes the controller sent to the Kubernetes API, by kind and verb.",
                &["kind", "verb"],
            )?,
            dashboard_latency: r.histograms(
                "rayshift_ray_dashboard_request_duration_seconds",
                "Latency of Ray dashboard requests.",
                &["operation"],
                DASHBOARD_BUCKETS,
            )?,
            dashboard_errors: r.counters(
                "rayshift_ray_dashboard_errors_total",
                "Failed Ray dashboard requests (each attempt).",
                &["operation"],
            )?,
            health_checks: r.counters(
                "rayshift_health_checks_total",
                "Settled RayServices checked by the shared health timer, by outcome: unchanged (no pass), changed \
                 (a pass follows), resync (a full pass was due).",
                &["outcome"],
            )?,
        };
        h.start_known_series();
        Ok(h)
    }

    /// Known label values start at zero, so dashboards and alerts see the series before the first error.
    fn start_known_series(&self) {
        let reasons = [
            "conflict",
            "kubernetes",
            "dashboard",
            "serve_config",
            "invalid",
            "metrics",
            "not_leader",
            "cache",
            "timeout",
        ];
        for reason in reasons {
            self.reconcile_errors.with_label_values(&[reason]);
        }
        for op in ["get", "put"] {
            self.dashboard_errors.with_label_values(&[op]);
        }
        for outcome in ["unchanged", "changed", "resync"] {
            self.health_checks.with_label_values(&[outcome]);
        }
    }
}

/// Creates each metric family and registers it at once.
struct Registrar<'a>(&'a Registry);

impl Registrar<'_> {
    fn add<C: prometheus::core::Collector + Clone + 'static>(&self, c: C) -> prometheus::Result<C> {
        self.0.register(Box::new(c.clone()))?;
        Ok(c)
    }

    fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<GaugeVec> {
        self.add(GaugeVec::new(Opts::new(name, help), labels)?)
    }

    fn counters(&self, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
        self.add(IntCounterVec::new(Opts::new(name, help), labels)?)
    }

    fn histograms(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> prometheus::Result<HistogramVec> {
        self.add(HistogramVec::new(
            HistogramOpts::new(name, help).buckets(buckets.to_vec()),
            labels,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_that_stops_leading_counts_no_failing_rayservices() {
        let metrics = Metrics::register(&Registry::new()).unwrap();
        metrics.set_leader(true);
        metrics.failing_rayservices().set(3);
        assert_eq!(metrics.health.failing.get(), 3);
        metrics.set_leader(false);
        assert_eq!(metrics.health.failing.get(), 0);
    }
}
