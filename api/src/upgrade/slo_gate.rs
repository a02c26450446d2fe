//! SLO checks in a running upgrade (issue 17): which checks the controller evaluates in a pass, what their
//! evaluations do to the status (failures in a row; rollback or pause at the limit), and whether a forward
//! traffic step may go. A step needs every check to have passed on an evaluation made at least its window
//! after the last step, so the data it judged came from the traffic that step moved. No data and an
//! unreachable Prometheus are never a pass: the step waits, and the progress deadline ends a wait that lasts.

use jiff::{SignedDuration, Timestamp};

use super::{
    Action, Direction, Levels, Observed, Role,
    decide::{ClusterSeen, Notice, Settings, StepDecision},
};
use crate::{
    progress::{Abort, AbortReason, SloCheckStatus},
    rayservice::RayServiceStatuses,
    slo::{Evaluation, OnFailure, Outcome, SloCheck},
    upgrade_control::Control,
};

fn seconds(s: u32) -> SignedDuration {
    SignedDuration::from_secs(i64::from(s))
}

fn record<'a>(status: &'a RayServiceStatuses, name: &str) -> Option<&'a SloCheckStatus> {
    status.progress.slo_checks.iter().find(|r| r.name == name)
}

/// The checks to evaluate now: while the upgrade goes forward, unpaused, with traffic on the pending cluster,
/// each check once per its interval.
pub fn due<'a>(
    status: &RayServiceStatuses,
    s: &'a Settings,
    pending: Option<&ClusterSeen>,
    now: Timestamp,
) -> Vec<&'a SloCheck> {
    let Some(pending) = pending else {
        return Vec::new();
    };
    let runs_goal = pending.spec_digest.as_deref() == Some(s.goal_digest.as_str());
    let forward = status.progress.direction(runs_goal) == Direction::Forward;
    let traffic = Levels::from_status(status.pending_service_status.as_ref(), Role::Pending).traffic;
    if !forward || traffic <= 0 || s.control == Control::Pause {
        return Vec::new();
    }
    s.slo_checks
        .iter()
        .filter(|c| record(status, &c.name).is_none_or(|r| r.time + seconds(c.interval_seconds) <= now))
        .collect()
}

/// Records the pass's evaluations, with an event for each that did not pass, and acts on a check that failed
/// `failureLimit` times in a row: a rollback (as an abort) or a pause. `true` when it paused the upgrade.
pub(super) fn judge(d: &mut StepDecision, evaluations: &[Evaluation], s: &Settings, now: Timestamp) -> bool {
    let mut reached: Option<(&SloCheck, String)> = None;
    for e in evaluations {
        let Some(check) = s.slo_checks.iter().find(|c| c.name == e.check) else {
            continue;
        };
        let (outcome, failures) = record_evaluation(d, check, e, now);
        if outcome == Outcome::Fail && failures >= check.failure_limit && reached.is_none() {
            let message = format!(
                "SLO check {} failed {failures} times in a row: {} = {}, wanted {}",
                check.name,
                e.query,
                e.reading.shown(),
                check.wanted()
            );
            reached = Some((check, message));
        }
    }
    reached.is_some_and(|(check, message)| act_on_failure(d, check, message, now))
}

/// Keeps the check's latest outcome and its count of failures in a row in the status; an event if it did not pass.
fn record_evaluation(
    d: &mut StepDecision,
    check: &SloCheck,
    e: &Evaluation,
    now: Timestamp,
) -> (Outcome, u32) {
    let outcome = check.outcome(&e.reading);
    let before = record(&d.status, &check.name).map_or(0, |r| r.failures);
    let failures = match outcome {
        Outcome::Pass => 0,
        Outcome::Fail => before + 1,
        Outcome::NoData | Outcome::Unavailable => before,
    };
    let entry = SloCheckStatus {
        name: check.name.clone(),
        outcome,
        value: e.reading.shown(),
        query: e.query.clone(),
        time: now,
        failures,
    };
    let records = &mut d.status.progress.slo_checks;
    match records.iter_mut().find(|r| r.name == check.name) {
        Some(r) => *r = entry,
        None => records.push(entry),
    }
    d.notices.extend(notice(check, e, outcome, failures));
    (outcome, failures)
}

/// A check reached its failure limit: roll back (as an abort) or pause. `true` when it paused the upgrade.
fn act_on_failure(d: &mut StepDecision, check: &SloCheck, message: String, now: Timestamp) -> bool {
    match check.on_failure {
        OnFailure::Rollback => {
            let progress = &mut d.status.progress;
            if progress.upgrade_abort.is_none() {
                let note = format!("Rolling back the incremental upgrade: {message}");
                progress.upgrade_abort = Some(Abort {
                    reason: AbortReason::SloCheckFailed,
                    message,
                    time: now,
                });
                d.notices
                    .push(Notice::warning("SloCheckFailed", "Reconcile", note));
            }
            false
        }
        OnFailure::Pause => {
            // Counted afresh once a person resumes, so one more failure does not pause it again at once.
            for r in &mut d.status.progress.slo_checks {
                r.failures = 0;
            }
            let note = format!(
                "Pausing the incremental upgrade (rayshift.io/upgrade-control: pause; resume or abort it): {message}"
            );
            d.notices
                .push(Notice::warning("UpgradePausedBySloCheck", "Reconcile", note));
            true
        }
    }
}

fn notice(check: &SloCheck, e: &Evaluation, outcome: Outcome, failures: u32) -> Option<Notice> {
    let (reason, note) = match outcome {
        Outcome::Pass => return None,
        Outcome::Fail => (
            "SloCheckEvaluationFailed",
            format!(
                "SLO check {} failed ({failures} of {} in a row): {} = {}, wanted {}",
                check.name,
                check.failure_limit,
                e.query,
                e.reading.shown(),
                check.wanted()
            ),
        ),
        Outcome::NoData | Outcome::Unavailable => (
            "SloCheckNotEvaluated",
            format!(
                "SLO check {} has no verdict, so traffic does not move: {} = {}",
                check.name,
                e.query,
                e.reading.shown()
            ),
        ),
    };
    Some(Notice::warning(reason, "Reconcile", note))
}

/// Whether the SLO checks hold back this action: a forward traffic step, or the promotion, once the pending
/// cluster carries traffic. `promote` (a person's decision) is not held.
pub(super) fn holds(action: &Action, o: &Observed, status: &RayServiceStatuses, s: &Settings) -> bool {
    let stepping = matches!(action, Action::SetTraffic { .. } | Action::Promote);
    if !stepping || s.slo_checks.is_empty() || o.direction != Direction::Forward || o.hurry {
        return false;
    }
    if o.pending.traffic <= 0 {
        return false;
    }
    !s.slo_checks
        .iter()
        .all(|c| passed_since_step(c, status, o.last_traffic_step))
}

fn passed_since_step(c: &SloCheck, status: &RayServiceStatuses, step: Option<Timestamp>) -> bool {
    record(status, &c.name).is_some_and(|r| {
        r.outcome == Outcome::Pass && step.is_none_or(|t| r.time >= t + seconds(c.window_seconds))
    })
}

/// When a held step looks again: the earliest next evaluation.
pub(super) fn wake(status: &RayServiceStatuses, s: &Settings, now: Timestamp) -> Timestamp {
    let next = s
        .slo_checks
        .iter()
        .map(|c| record(status, &c.name).map_or(now, |r| r.time + seconds(c.interval_seconds)))
        .min()
        .unwrap_or(now);
    next.max(now + SignedDuration::from_millis(20))
}

/// The Progressing message while a step waits for the checks: each check that has not passed since the step.
pub(super) fn waiting(status: &RayServiceStatuses, s: &Settings, step: Option<Timestamp>) -> String {
    let open: Vec<String> = s
        .slo_checks
        .iter()
        .filter(|c| !passed_since_step(c, status, step))
        .map(|c| match record(status, &c.name) {
            Some(r) => format!(
                "{} {} ({} = {}, wanted {}; {} of {} failures in a row)",
                c.name,
                r.outcome.as_str(),
                r.query,
                r.value,
                c.wanted(),
                r.failures,
                c.failure_limit
            ),
            None => format!("{} not evaluated yet", c.name),
        })
        .collect();
    format!(
        "Waiting for the SLO checks (rayshift.io/slo-checks) to pass on data from at least their window after the last traffic step: {}",
        open.join("; ")
    )
}

/// What paused the upgrade, when an SLO check did: its last failed evaluation.
pub(super) fn pause_cause(status: &RayServiceStatuses) -> Option<String> {
    let r = status
        .progress
        .slo_checks
        .iter()
        .filter(|r| r.outcome == Outcome::Fail)
        .max_by_key(|r| r.time)?;
    Some(format!(
        "last failed SLO check {}: {} = {}",
        r.name, r.query, r.value
    ))
}
