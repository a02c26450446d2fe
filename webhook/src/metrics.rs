//! The webhook's Prometheus metrics, registered on a registry passed in (no global registry).

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use crate::admission::{Hook, Record};

/// Latency buckets in seconds: admission must stay far below the apiserver's 5 s timeout.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

#[derive(Clone)]
pub struct Metrics {
    requests: IntCounterVec,
    denials: IntCounterVec,
    warnings: IntCounterVec,
    patches: IntCounter,
    bad_requests: IntCounterVec,
    latency: HistogramVec,
    tls_handshake_errors: IntCounter,
    cert_expiry: IntGauge,
    cert_reloads: IntCounterVec,
}

impl Metrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let counters = |name: &str, help: &str, labels: &[&str]| {
            registered(registry, IntCounterVec::new(Opts::new(name, help), labels)?)
        };
        let counter = |name: &str, help: &str| registered(registry, IntCounter::new(name, help)?);
        let m = Self {
            requests: counters(
                "rayshift_admission_requests_total",
                "Admission reviews answered, by webhook, operation and verdict.",
                &["webhook", "operation", "verdict"],
            )?,
            denials: counters(
                "rayshift_admission_denials_total",
                "Rule violations that denied a RayService, by rule.",
                &["rule"],
            )?,
            warnings: counters(
                "rayshift_admission_warnings_total",
                "Warnings returned with admitted RayServices, by rule.",
                &["rule"],
            )?,
            patches: counter(
                "rayshift_admission_patches_total",
                "Mutating reviews that returned a defaulting patch.",
            )?,
            bad_requests: counters(
                "rayshift_admission_bad_requests_total",
                "Requests refused before review, by HTTP status.",
                &["code"],
            )?,
            latency: registered(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "rayshift_admission_request_duration_seconds",
                        "Time to answer an admission review.",
                    )
                    .buckets(LATENCY_BUCKETS.to_vec()),
                    &["webhook"],
                )?,
            )?,
            tls_handshake_errors: counter(
                "rayshift_webhook_tls_handshake_errors_total",
                "TLS handshakes with the webhook that failed.",
            )?,
            cert_expiry: registered(
                registry,
                IntGauge::new(
                    "rayshift_webhook_certificate_expiry_timestamp_seconds",
                    "Expiry (notAfter, Unix seconds) of the serving certificate in use.",
                )?,
            )?,
            cert_reloads: counters(
                "rayshift_webhook_certificate_reloads_total",
                "Serving certificate reloads from disk, by result.",
                &["result"],
            )?,
        };
        // Known label values start at zero, so the series exist before the first event.
        for code in ["400", "408", "413", "500"] {
            m.bad_requests.with_label_values(&[code]);
        }
        for result in ["success", "error"] {
            m.cert_reloads.with_label_values(&[result]);
        }
        Ok(m)
    }

    pub fn observe(&self, hook: Hook, record: &Record) {
        let verdict = if record.allowed { "allowed" } else { "denied" };
        self.requests
            .with_label_values(&[hook.as_str(), record.operation, verdict])
            .inc();
        for rule in &record.denied_rules {
            self.denials.with_label_values(&[rule]).inc();
        }
        for rule in &record.warned_rules {
            self.warnings.with_label_values(&[rule]).inc();
        }
        if record.patched {
            self.patches.inc();
        }
    }

    pub fn bad_request(&self, code: u16) {
        self.bad_requests.with_label_values(&[&code.to_string()]).inc();
    }

    pub fn latency(&self, hook: Hook) -> Histogram {
        self.latency.with_label_values(&[hook.as_str()])
    }

    pub fn tls_handshake_error(&self) {
        self.tls_handshake_errors.inc();
    }

    pub fn cert_loaded(&self, not_after_unix: i64) {
        self.cert_expiry.set(not_after_unix);
        self.cert_reloads.with_label_values(&["success"]).inc();
    }

    pub fn cert_load_failed(&self) {
        self.cert_reloads.with_label_values(&["error"]).inc();
    }
}

/// The text exposition of a registry.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    // Encoding to a Vec cannot fail for well-formed metric families.
    let _ = TextEncoder::new().encode(&registry.gather(), &mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// A metric family, registered as it is made.
fn registered<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    c: C,
) -> prometheus::Result<C> {
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}
