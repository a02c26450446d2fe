//! The controller's Prometheus metrics, registered on a registry passed in.

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

const RECONCILE_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const DASHBOARD_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

#[derive(Clone)]
pub struct Metrics {
    reconcile_duration: Histogram,
    reconcile_errors: IntCounterVec,
    api_writes: IntCounterVec,
    dashboard_latency: HistogramVec,
    dashboard_errors: IntCounterVec,
}

impl Metrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self {
            reconcile_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "rayshift_reconcile_duration_seconds",
                    "Time of one RayService reconcile pass.",
                )
                .buckets(RECONCILE_BUCKETS.to_vec()),
            )?,
            reconcile_errors: IntCounterVec::new(
                Opts::new(
                    "rayshift_reconcile_errors_total",
                    "Reconcile passes that failed, by reason.",
                ),
                &["reason"],
            )?,
            api_writes: IntCounterVec::new(
                Opts::new(
                    "rayshift_kubernetes_writes_total",
                    "Writes the controller sent to the Kubernetes API, by kind and verb.",
                ),
                &["kind", "verb"],
            )?,
            dashboard_latency: HistogramVec::new(
                HistogramOpts::new(
                    "rayshift_ray_dashboard_request_duration_seconds",
                    "Latency of Ray dashboard requests.",
                )
                .buckets(DASHBOARD_BUCKETS.to_vec()),
                &["operation"],
            )?,
            dashboard_errors: IntCounterVec::new(
                Opts::new(
                    "rayshift_ray_dashboard_errors_total",
                    "Failed Ray dashboard requests (each attempt).",
                ),
                &["operation"],
            )?,
        };
        registry.register(Box::new(m.reconcile_duration.clone()))?;
        registry.register(Box::new(m.reconcile_errors.clone()))?;
        registry.register(Box::new(m.api_writes.clone()))?;
        registry.register(Box::new(m.dashboard_latency.clone()))?;
        registry.register(Box::new(m.dashboard_errors.clone()))?;
        Ok(m)
    }

    pub fn reconcile_timer(&self) -> prometheus::HistogramTimer {
        self.reconcile_duration.start_timer()
    }

    pub fn reconcile_error(&self, reason: &str) {
        self.reconcile_errors.with_label_values(&[reason]).inc();
    }

    pub fn api_write(&self, kind: &str, verb: &str) {
        self.api_writes.with_label_values(&[kind, verb]).inc();
    }

    pub fn dashboard_latency(&self, op: &str) -> prometheus::HistogramTimer {
        self.dashboard_latency.with_label_values(&[op]).start_timer()
    }

    pub fn dashboard_error(&self, op: &str) {
        self.dashboard_errors.with_label_values(&[op]).inc();
    }
}
