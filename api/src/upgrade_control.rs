//! What users (and deadlines) say about a running incremental upgrade, and how much capacity Serve must
//! show before traffic may follow it.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};

/// `pause`, `resume`, `promote` (finish without waiting the intervals) or `abort` (roll back now).
pub const UPGRADE_CONTROL_ANNOTATION: &str = "rayshift.io/upgrade-control";
/// Seconds without a successful step before the upgrade rolls back by itself.
pub const PROGRESS_DEADLINE_ANNOTATION: &str = "rayshift.io/progress-deadline-seconds";
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: i64 = 600;
/// Seconds a cluster whose traffic went to 0 keeps its last replicas before its target_capacity goes to 0.
pub const DRAIN_ANNOTATION: &str = "rayshift.io/drain-seconds";
pub const DEFAULT_DRAIN_SECONDS: i64 = 5;

/// When an incremental upgrade runs ResourceAware (issue 18): `always`, `on-stall` (once the pending cluster's
/// Pods cannot be scheduled for lack of a resource) or `never`; absent: the operator's default.
pub const RESOURCE_AWARE_ANNOTATION: &str = "rayshift.io/resource-aware";
/// How far below 100 % the serving capacity may dip in ResourceAware mode (1–99); absent: stepSizePercent.
pub const MAX_UNAVAILABLE_ANNOTATION: &str = "rayshift.io/max-unavailable-percent";
/// The bounds of maxUnavailablePercent: at 100 the serving capacity could reach nothing.
pub const MAX_UNAVAILABLE_PERCENT: std::ops::RangeInclusive<i32> = 1..=99;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResourceAwareMode {
    #[default]
    Never,
    OnStall,
    Always,
}

impl ResourceAwareMode {
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "never" => Some(Self::Never),
            "on-stall" => Some(Self::OnStall),
            "always" => Some(Self::Always),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Never => "never",
            Self::OnStall => "on-stall",
            Self::Always => "always",
        }
    }
}

/// The mode annotation: `None` when absent, else its mode or `Err` with its raw value.
fn annotated_mode(annotations: &BTreeMap<String, String>) -> Option<Result<ResourceAwareMode, &str>> {
    let raw = annotations.get(RESOURCE_AWARE_ANNOTATION)?;
    Some(ResourceAwareMode::parse(raw).ok_or(raw.as_str()))
}

/// The RayService's ResourceAware mode: its annotation, else `default` (the operator's; also when the
/// annotation is none of the three, which admission denies).
pub fn resource_aware_mode(
    annotations: &BTreeMap<String, String>,
    default: ResourceAwareMode,
) -> ResourceAwareMode {
    annotated_mode(annotations)
        .and_then(Result::ok)
        .unwrap_or(default)
}

/// The mode annotation's value when it is none of the three (admission denies it).
pub fn invalid_resource_aware_mode(annotations: &BTreeMap<String, String>) -> Option<&str> {
    annotated_mode(annotations).and_then(Result::err)
}

/// The maxUnavailablePercent annotation: `None` when absent, else a whole percent in
/// [`MAX_UNAVAILABLE_PERCENT`] or `Err` with its raw value.
fn annotated_max_unavailable(annotations: &BTreeMap<String, String>) -> Option<Result<i32, &str>> {
    let raw = annotations.get(MAX_UNAVAILABLE_ANNOTATION)?;
    Some(
        raw.trim()
            .parse::<i32>()
            .ok()
            .filter(|v| MAX_UNAVAILABLE_PERCENT.contains(v))
            .ok_or(raw.as_str()),
    )
}

/// maxUnavailablePercent: the annotation, else the step size (within [`MAX_UNAVAILABLE_PERCENT`]; also when
/// the annotation is not a whole percent there, which admission denies).
pub fn max_unavailable_percent(annotations: &BTreeMap<String, String>, step: i32) -> i32 {
    let default = step.clamp(*MAX_UNAVAILABLE_PERCENT.start(), *MAX_UNAVAILABLE_PERCENT.end());
    annotated_max_unavailable(annotations)
        .and_then(Result::ok)
        .unwrap_or(default)
}

/// The maxUnavailablePercent annotation's value when it is not a whole percent in 1..99 (admission denies it).
pub fn invalid_max_unavailable(annotations: &BTreeMap<String, String>) -> Option<&str> {
    annotated_max_unavailable(annotations).and_then(Result::err)
}

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

/// A whole-seconds annotation: `None` when absent, `Ok` when at least `min`, else `Err` with its raw value.
fn seconds<'a>(
    annotations: &'a BTreeMap<String, String>,
    key: &str,
    min: i64,
) -> Option<Result<i64, &'a str>> {
    let raw = annotations.get(key)?;
    Some(
        raw.trim()
            .parse::<i64>()
            .ok()
            .filter(|v| *v >= min)
            .ok_or(raw.as_str()),
    )
}

/// The progress deadline in seconds: the annotation, else the operator default.
pub fn progress_deadline(annotations: &BTreeMap<String, String>, default: i64) -> i64 {
    seconds(annotations, PROGRESS_DEADLINE_ANNOTATION, 1)
        .and_then(Result::ok)
        .unwrap_or(default)
}

/// The annotation's value when it is not a positive number of seconds (admission denies it; the
/// controller falls back to its default).
pub fn invalid_progress_deadline(annotations: &BTreeMap<String, String>) -> Option<&str> {
    seconds(annotations, PROGRESS_DEADLINE_ANNOTATION, 1).and_then(Result::err)
}

/// The drain time in seconds: the annotation (0 or more), else the operator default.
pub fn drain_seconds(annotations: &BTreeMap<String, String>, default: i64) -> i64 {
    seconds(annotations, DRAIN_ANNOTATION, 0)
        .and_then(Result::ok)
        .unwrap_or(default)
}

/// The drain annotation's value when it is not a whole number of seconds ≥ 0 (admission denies it).
pub fn invalid_drain(annotations: &BTreeMap<String, String>) -> Option<&str> {
    seconds(annotations, DRAIN_ANNOTATION, 0).and_then(Result::err)
}

/// Whether the upgrade has gone longer than the deadline without progress. Waiting for a step that is not
/// due yet is not a stall: the deadline counts from the later of the last progress and the instant the
/// next step became due, so an interval longer than the deadline still works.
pub fn stalled(
    last_progress: Timestamp,
    next_step_due: Option<Timestamp>,
    deadline: SignedDuration,
    now: Timestamp,
) -> bool {
    let since = next_step_due.map_or(last_progress, |due| due.max(last_progress));
    now.duration_since(since) > deadline
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
    fn waiting_for_a_due_step_is_not_a_stall() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let at = |s: i64| t0 + SignedDuration::from_secs(s);
        let deadline = SignedDuration::from_secs(300);
        // Interval 600 s, deadline 300 s: 400 s after the last step the next one is not even due.
        assert!(!stalled(t0, Some(at(600)), deadline, at(400)));
        // 300 s after it became due, nothing happened: that is a stall.
        assert!(!stalled(t0, Some(at(600)), deadline, at(900)));
        assert!(stalled(t0, Some(at(600)), deadline, at(901)));
        // No step yet (waiting for capacity): the deadline counts from the last progress.
        assert!(stalled(t0, None, deadline, at(301)));
        // Progress after the due instant restarts the count.
        assert!(!stalled(at(700), Some(at(600)), deadline, at(950)));
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
        assert_eq!(invalid_progress_deadline(&d), None);
        let bad = BTreeMap::from([(PROGRESS_DEADLINE_ANNOTATION.to_string(), "10m".to_string())]);
        assert_eq!(invalid_progress_deadline(&bad), Some("10m"));
        let drain = |v: &str| BTreeMap::from([(DRAIN_ANNOTATION.to_string(), v.to_string())]);
        assert_eq!(drain_seconds(&drain("0"), 5), 0);
        assert_eq!(drain_seconds(&drain("30"), 5), 30);
        assert_eq!(drain_seconds(&BTreeMap::new(), 5), 5);
        assert_eq!(invalid_drain(&drain("-1")), Some("-1"));
        assert_eq!(invalid_drain(&drain("5s")), Some("5s"));
        assert_eq!(invalid_drain(&drain("5")), None);
    }
}
