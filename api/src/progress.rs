//! rayshift's own record of a running upgrade, kept in the RayService status beside KubeRay's fields, so a
//! restarted controller resumes where the last one stopped.
//!
//! The fields are top-level status fields (`status.upgradeStartTime`, `status.lastProgressTime`,
//! `status.lastTrafficStepTime`, `status.upgradeExpectedCompletionTime`, `status.rejectedSpecDigest`,
//! `status.upgradeAbort`); KubeRay's released
//! schema has no place for them, so the reconcile component (`manifests/components/reconcile`) adds them.
//! Times keep sub-second precision: pacing is exact to the millisecond, and a metav1.Time has whole seconds.

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::{
    slo::Outcome,
    upgrade::Direction,
    upgrade_control::{self, Control},
};

/// The upgrade's own state; every field is absent when no upgrade runs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeProgress {
    /// When the running upgrade was first seen (its duration survives a restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_start_time: Option<Timestamp>,
    /// The last progress of the running upgrade: the progress deadline counts from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_progress_time: Option<Timestamp>,
    /// When traffic last moved: the next step is due an interval after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_traffic_step_time: Option<Timestamp>,
    /// The spec digest an upgrade was rolled back from on purpose; not retried until the spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected_spec_digest: Option<String>,
    /// When the running upgrade should end (`upgrade::expected_completion`), recomputed at each of its steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_expected_completion_time: Option<Timestamp>,
    /// Why the running upgrade is rolling back, when a user, the deadline or an SLO check said so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_abort: Option<Abort>,
    /// The last evaluation of each SLO check (`rayshift.io/slo-checks`) in the running upgrade.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slo_checks: Vec<SloCheckStatus>,
    /// What the pending cluster's unschedulable Pods lack, while they do (`stall::Stall::describe`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_stall: Option<String>,
    /// When the running upgrade took ResourceAware pacing: at its first pass with `rayshift.io/resource-aware:
    /// always`, at its stall with `on-stall`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_aware_since: Option<Timestamp>,
}

/// A check's last evaluation, and how many failed in a row.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SloCheckStatus {
    pub name: String,
    pub outcome: Outcome,
    /// The value Prometheus returned, or why there was none.
    pub value: String,
    /// The query as sent, placeholders filled in.
    pub query: String,
    pub time: Timestamp,
    pub failures: u32,
}

/// A rollback that sticks until it finishes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Abort {
    pub reason: AbortReason,
    pub message: String,
    pub time: Timestamp,
}

/// Who stopped the upgrade.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// The `rayshift.io/upgrade-control: abort` annotation.
    UpgradeAborted,
    /// No progress within the progress deadline.
    ProgressDeadlineExceeded,
    /// An SLO check with `onFailure: rollback` failed `failureLimit` times in a row.
    SloCheckFailed,
}

impl AbortReason {
    pub fn as_str(self) -> &'static str {
        match self {
            AbortReason::UpgradeAborted => "UpgradeAborted",
            AbortReason::ProgressDeadlineExceeded => "ProgressDeadlineExceeded",
            AbortReason::SloCheckFailed => "SloCheckFailed",
        }
    }
}

impl UpgradeProgress {
    /// Seconds since the upgrade started.
    pub fn duration(&self, now: Timestamp) -> Option<f64> {
        Some(now.duration_since(self.upgrade_start_time?).as_secs_f64())
    }

    /// What stays once an upgrade is over: only the rejected digest (so a rolled-back spec is not retried).
    pub fn finished(&self, rejected: Option<String>) -> Self {
        Self {
            rejected_spec_digest: rejected,
            ..Self::default()
        }
    }
}

/// What steers a running upgrade before its next step is chosen.
#[derive(Clone, Copy, Debug)]
pub struct Steering {
    pub control: Control,
    /// The pending cluster runs the current spec (else the spec changed: roll back).
    pub pending_runs_goal: bool,
    pub deadline: SignedDuration,
    pub interval: SignedDuration,
    /// When traffic last moved, from rayshift's own record or KubeRay's whole-second fields.
    pub last_traffic_step: Option<Timestamp>,
    pub now: Timestamp,
}

impl UpgradeProgress {
    /// Records an abort (the annotation, or the deadline passed while going forward) and returns it when it
    /// is new; an abort sticks until the rollback finishes. Also starts the deadline clock of a new upgrade.
    pub fn steer(&mut self, s: &Steering) -> Option<Abort> {
        let last_progress = *self.last_progress_time.get_or_insert(s.now);
        let new = if self.upgrade_abort.is_some() {
            None
        } else if s.control == Control::Abort {
            Some((
                AbortReason::UpgradeAborted,
                "aborted by the rayshift.io/upgrade-control annotation".to_string(),
            ))
        } else if s.pending_runs_goal
            && s.control != Control::Pause
            && upgrade_control::stalled(
                last_progress,
                s.last_traffic_step.map(|t| t + s.interval),
                s.deadline,
                s.now,
            )
        {
            let secs = s.deadline.as_secs();
            Some((
                AbortReason::ProgressDeadlineExceeded,
                format!("no upgrade step succeeded for {secs} s"),
            ))
        } else {
            None
        };
        let abort = new.map(|(reason, message)| Abort {
            reason,
            message,
            time: s.now,
        });
        if abort.is_some() {
            self.upgrade_abort.clone_from(&abort);
        }
        abort
    }

    /// Forward to the pending cluster, unless aborted or the spec moved on.
    pub fn direction(&self, pending_runs_goal: bool) -> Direction {
        if self.upgrade_abort.is_none() && pending_runs_goal {
            Direction::Forward
        } else {
            Direction::Rollback
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn wire_form_is_the_documented_status_fields() {
        let t: Timestamp = "2026-11-24T10:00:00.250Z".parse().unwrap();
        let p = UpgradeProgress {
            upgrade_start_time: Some(t),
            last_traffic_step_time: Some(t),
            upgrade_abort: Some(Abort {
                reason: AbortReason::ProgressDeadlineExceeded,
                message: "no step for 60 s".into(),
                time: t,
            }),
            ..Default::default()
        };
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(
            v,
            json!({"upgradeStartTime": "2026-11-24T10:00:00.25Z", "lastTrafficStepTime": "2026-11-24T10:00:00.25Z",
                   "upgradeAbort": {"reason": "ProgressDeadlineExceeded", "message": "no step for 60 s",
                                    "time": "2026-11-24T10:00:00.25Z"}})
        );
        assert_eq!(serde_json::from_value::<UpgradeProgress>(v).unwrap(), p);
        assert_eq!(
            p.finished(Some("d".into())).rejected_spec_digest.as_deref(),
            Some("d")
        );
        assert_eq!(p.finished(None), UpgradeProgress::default());
    }

    fn steering(control: Control, now_secs: i64) -> Steering {
        let t0: Timestamp = "2026-11-24T10:00:00Z".parse().unwrap();
        Steering {
            control,
            pending_runs_goal: true,
            deadline: SignedDuration::from_secs(300),
            interval: SignedDuration::from_secs(600),
            last_traffic_step: Some(t0),
            now: t0 + SignedDuration::from_secs(now_secs),
        }
    }

    #[test]
    fn an_interval_longer_than_the_deadline_does_not_roll_back() {
        let mut p = UpgradeProgress {
            last_progress_time: Some("2026-11-24T10:00:00Z".parse().unwrap()),
            ..Default::default()
        };
        // 400 s after the last step, with a 300 s deadline: the next step is not due until 600 s.
        assert_eq!(p.steer(&steering(Control::Run, 400)), None);
        assert_eq!(p.direction(true), Direction::Forward);
        // Due at 600 s and still nothing at 901 s: now it has stalled.
        let abort = p.steer(&steering(Control::Run, 901)).expect("deadline");
        assert_eq!(abort.reason, AbortReason::ProgressDeadlineExceeded);
        assert_eq!(p.direction(true), Direction::Rollback);
        // It sticks, and is not reported twice.
        assert_eq!(p.steer(&steering(Control::Run, 950)), None);
        assert!(p.upgrade_abort.is_some());
    }

    #[test]
    fn abort_and_pause() {
        let mut p = UpgradeProgress::default();
        assert_eq!(
            p.steer(&steering(Control::Pause, 5000)),
            None,
            "the clock starts now"
        );
        assert!(p.last_progress_time.is_some());
        assert_eq!(
            p.steer(&steering(Control::Pause, 99999)),
            None,
            "paused: no deadline"
        );
        let abort = p.steer(&steering(Control::Abort, 5)).unwrap();
        assert_eq!(abort.reason, AbortReason::UpgradeAborted);
        assert_eq!(p.direction(true), Direction::Rollback);
        assert_eq!(UpgradeProgress::default().direction(false), Direction::Rollback);
    }
}
