//! What users (and deadlines) say about a running incremental upgrade, and how much capacity Serve must
//! show before traffic may follow it.

use std::collections::BTreeMap;

/// `pause`, `resume`, `promote` (finish without waiting the intervals) or `abort` (roll back now).
pub const UPGRADE_CONTROL_ANNOTATION: &str = "rayshift.io/upgrade-control";
/// Seconds without a successful step before the upgrade rolls back by itself.
pub const PROGRESS_DEADLINE_ANNOTATION: &str = "rayshift.io/progress-deadline-seconds";
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: i64 = 600;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    Run,
    Pause,
    Promote,
    Abort,
}

/// The control annotation; unknown values (and `resume`) mean run normally.
pub fn control(annotations: &BTreeMap<String, String>) -> Control {
    match annotations
        .get(UPGRADE_CONTROL_ANNOTATION)
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        Some("pause") => Control::Pause,
        Some("promote") => Control::Promote,
        Some("abort") => Control::Abort,
        _ => Control::Run,
    }
}

/// The progress deadline in seconds: the annotation, else the operator default.
pub fn progress_deadline(annotations: &BTreeMap<String, String>, default: i64) -> i64 {
    annotations
        .get(PROGRESS_DEADLINE_ANNOTATION)
        .and_then(|v| v.trim().parse::<i64>().ok())
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

/// Replicas Serve runs for a deployment of `declared` replicas at `capacity` percent: rounded half up,
/// at least one when the capacity is above zero (Serve's `get_capacity_adjusted_num_replicas`).
pub fn implied_replicas(declared: u64, capacity: i32) -> u64 {
    if capacity <= 0 || declared == 0 {
        return 0;
    }
    let scaled = (declared as f64 * f64::from(capacity.min(100)) / 100.0 + 0.5).floor() as u64;
    scaled.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_rounding() {
        assert_eq!(implied_replicas(4, 50), 2);
        assert_eq!(implied_replicas(4, 0), 0);
        assert_eq!(implied_replicas(4, 100), 4);
        assert_eq!(implied_replicas(10, 5), 1, "at least one above zero");
        assert_eq!(implied_replicas(10, 25), 3, "2.5 rounds half up");
        assert_eq!(implied_replicas(3, 20), 1);
    }

    #[test]
    fn annotations() {
        let a = |v: &str| BTreeMap::from([(UPGRADE_CONTROL_ANNOTATION.to_string(), v.to_string())]);
        assert_eq!(control(&a("Pause")), Control::Pause);
        assert_eq!(control(&a("resume")), Control::Run);
        assert_eq!(control(&a("abort")), Control::Abort);
        assert_eq!(control(&BTreeMap::new()), Control::Run);
        let d = BTreeMap::from([(PROGRESS_DEADLINE_ANNOTATION.to_string(), "30".to_string())]);
        assert_eq!(progress_deadline(&d, 600), 30);
        assert_eq!(progress_deadline(&BTreeMap::new(), 600), 600);
    }
}
