//! One pass of an incremental upgrade, decided whole and without I/O: steering (abort, progress deadline,
//! pause), the planner's next action, the status it leaves (levels, typed progress, conditions), the events
//! and counts that follow, and when to look again. The controller observes, calls [`decide`], and applies
//! the [`StepDecision`]: its Serve `target_capacity` PUTs (one, or a lowering and the raise it makes room
//! for), the route from the status, the events, the status write.

use std::borrow::Cow;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{Action, Direction, Levels, Observed, Role, UpgradeOptions, WaitReason, next_action, slo_gate};
use crate::{
    conditions::{self, Wanted},
    progress::{AbortReason, Steering},
    rayservice::{ClusterServiceStatus, RayServiceStatuses},
    slo::{Evaluation, SloCheck},
    stall::Stall,
    upgrade_control::{Control, ResourceAwareMode},
};

/// Condition type: True while steps happen on schedule, False with the reason while the upgrade waits.
pub const PROGRESSING: &str = "Progressing";

/// What the spec and the operator ask of the upgrade.
#[derive(Clone, Debug)]
pub struct Settings {
    pub options: UpgradeOptions,
    pub control: Control,
    pub deadline: SignedDuration,
    /// The spec digest of the current spec: a pending cluster built from another one is rolled back.
    pub goal_digest: String,
    pub namespace: String,
    pub generation: i64,
    /// How often Serve is read while the upgrade waits for it.
    pub serve_poll: SignedDuration,
    /// How often Serve is read once a step is due and waits only for its capacity to be verified.
    pub capacity_poll: SignedDuration,
    /// The RayService's SLO checks (`rayshift.io/slo-checks`): forward traffic steps wait for them.
    pub slo_checks: Vec<SloCheck>,
    /// When the upgrade paces ResourceAware (`rayshift.io/resource-aware`, else the operator's default).
    pub resource_aware: ResourceAwareMode,
    /// How far the serving capacity may dip then (`rayshift.io/max-unavailable-percent`).
    pub max_unavailable_percent: i32,
}

/// One cluster of the upgrade as the pass saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterSeen {
    pub name: String,
    /// The spec digest it was built from.
    pub spec_digest: Option<String>,
    /// Its head is ready and Serve answered: its capacity can be changed.
    pub reachable: bool,
    /// Serve runs the replicas that the cluster's target capacity in the status implies, all RUNNING, and
    /// the cluster's serve Service has a ready endpoint (a Gateway could not send it a share otherwise), in
    /// [`super::CAPACITY_VERIFIED_READS`] reads in a row.
    pub capacity_verified: bool,
    /// This read found that capacity, verified or not yet in enough reads in a row: one more read confirms it.
    pub capacity_found: bool,
    /// The `target_capacity` Serve reported, when its dashboard answered and one was set.
    pub serve_capacity: Option<i32>,
}

/// What the controller observed this pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observation {
    pub active: Option<ClusterSeen>,
    pub pending: Option<ClusterSeen>,
    /// Gateway Accepted+Programmed and route Accepted+ResolvedRefs for their current generations.
    pub route_ready: bool,
    /// The SLO checks evaluated this pass (those [`slo_gate::due`] named).
    pub slo: Vec<Evaluation>,
    /// The pending cluster's Pods the scheduler cannot place for lack of a resource.
    pub pending_stall: Option<Stall>,
}

/// A write the pass makes besides the route and the status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// PUT this cluster's own Serve config with this `target_capacity`.
    TargetCapacity {
        role: Role,
        cluster: String,
        percent: i32,
    },
    /// The route weights in the status changed: write the route.
    Traffic,
}

/// An event for `kubectl describe`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

/// How an upgrade ended, for `rayshift_upgrades_total{result}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpgradeResult {
    Completed,
    RolledBack,
    Aborted,
}

impl UpgradeResult {
    pub fn as_str(self) -> &'static str {
        match self {
            UpgradeResult::Completed => "completed",
            UpgradeResult::RolledBack => "rolled_back",
            UpgradeResult::Aborted => "aborted",
        }
    }
}

/// What the metrics count of the pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tally {
    /// A new cluster beside the active one: an upgrade began.
    Started,
    CapacityChange(Role),
    /// Traffic moved, this long after the step before it.
    TrafficStep {
        waited_seconds: Option<f64>,
    },
    Finished {
        result: UpgradeResult,
        seconds: Option<f64>,
    },
}

/// The whole outcome of one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct StepDecision {
    /// The status to write (levels, progress and conditions of the upgrade).
    pub status: RayServiceStatuses,
    /// In order: a raise that follows a lowering is written only once the lowering was.
    pub effects: Vec<Effect>,
    pub notices: Vec<Notice>,
    pub tallies: Vec<Tally>,
    /// When to look again; `None`: only when something changes (or at the resync).
    pub wake: Option<Timestamp>,
    /// The next traffic step, when it waits only for its interval.
    pub step_due: Option<Timestamp>,
    /// An SLO check paused the upgrade: write `rayshift.io/upgrade-control: pause`, so a person resumes or
    /// aborts it as any pause.
    pub pause: bool,
}

/// When traffic last moved: rayshift's own record (sub-second), else KubeRay's whole-second fields.
pub fn last_step_time(status: &RayServiceStatuses) -> Option<Timestamp> {
    let kuberay = [&status.active_service_status, &status.pending_service_status]
        .into_iter()
        .flatten()
        .filter_map(|s| s.last_traffic_migrated_time.as_ref().map(|t| t.0))
        .max();
    status.progress.last_traffic_step_time.or(kuberay)
}

/// When a running upgrade's next traffic step is due: an interval after the last one (`None` before the first
/// step, or once no pending cluster is left).
pub fn next_step_due(status: &RayServiceStatuses, interval: SignedDuration) -> Option<Timestamp> {
    status.pending_service_status.as_ref()?;
    Some(last_step_time(status)? + interval)
}

/// Decides one pass of an incremental upgrade from the status the last pass left and what was observed.
pub fn decide(seen: &Observation, status: &RayServiceStatuses, s: &Settings, now: Timestamp) -> StepDecision {
    let mut d = StepDecision {
        status: status.clone(),
        effects: Vec::new(),
        notices: Vec::new(),
        tallies: Vec::new(),
        wake: None,
        step_due: None,
        pause: false,
    };
    seed_levels(&mut d.status);
    let (Some(active), Some(pending)) = (&seen.active, &seen.pending) else {
        set_progressing(&mut d.status, None, s, now);
        return d;
    };
    let judged = judge_slo_checks(&mut d, seen, s, now);
    let s = judged.as_ref();
    let observed = steer(&mut d, seen, pending, s, now);
    if restore_capacity(
        &mut d,
        [(Role::Active, active), (Role::Pending, pending)],
        &observed,
        s,
        now,
    ) {
        return d;
    }
    let pacing = pacing(&mut d, seen, &observed, s, now);
    let mut action = next_action(&pacing, &observed);
    if slo_gate::holds(&action, &observed, &d.status, s) {
        action = Action::Wait {
            until: None,
            reason: WaitReason::SloChecks,
        };
    }
    let sides = Sides {
        active,
        pending,
        observed: &observed,
        namespace: &s.namespace,
    };
    if !act(&mut d, &sides, action, &pacing, s, now) {
        return d;
    }
    raise_after_lowering(&mut d, &sides, action, &pacing, s);
    acted(&mut d, &observed, s, &pacing, now);
    d
}

/// A lowered capacity makes room for the other cluster's raise: planned again on the same observations and
/// made in the same pass. The next pass would only have re-read the same levels (a raise never waits for a
/// lowering to be verified), and with many upgrades at once that pass queued for a slot while the next step's
/// interval ran (BENCHMARKS.md, "Capacity changes in one pass"). Nothing follows a raise: the next step
/// needs the raised capacity verified by reads.
fn raise_after_lowering(
    d: &mut StepDecision,
    u: &Sides<'_>,
    done: Action,
    pacing: &UpgradeOptions,
    s: &Settings,
) {
    let Action::SetTargetCapacity { role, percent } = done else {
        return;
    };
    if percent >= u.observed.levels(role).capacity {
        return;
    }
    let after = Observed {
        active: Levels::from_status(d.status.active_service_status.as_ref(), Role::Active),
        pending: Levels::from_status(d.status.pending_service_status.as_ref(), Role::Pending),
        ..*u.observed
    };
    let next = next_action(pacing, &after);
    let Action::SetTargetCapacity { role: other, percent } = next else {
        return;
    };
    if other == role
        || percent <= after.levels(other).capacity
        || slo_gate::holds(&next, &after, &d.status, s)
    {
        return;
    }
    let sides = Sides {
        observed: &after,
        ..*u
    };
    set_target_capacity(d, &sides, other, percent);
}

/// The settings this pass decides with: paused when an SLO check just reached its limit with `Pause`.
fn judge_slo_checks<'s>(
    d: &mut StepDecision,
    seen: &Observation,
    s: &'s Settings,
    now: Timestamp,
) -> Cow<'s, Settings> {
    if !slo_gate::judge(d, &seen.slo, s, now) {
        return Cow::Borrowed(s);
    }
    d.pause = true;
    Cow::Owned(Settings {
        control: Control::Pause,
        ..s.clone()
    })
}

/// After an action was taken: the expected completion, progress, and a wake to observe its effect.
fn acted(d: &mut StepDecision, observed: &Observed, s: &Settings, pacing: &UpgradeOptions, now: Timestamp) {
    expect_completion(d, observed, s, pacing);
    if d.status.pending_service_status.is_some() {
        d.status.progress.last_progress_time = Some(now);
    }
    set_progressing(&mut d.status, None, s, now);
    // Act again at once: the next decision needs fresh observations.
    d.wake = Some(now + SignedDuration::from_millis(20));
}

/// Carries out `action`; `false` when the pass stops there: it waits, or a cluster's Serve cannot take the
/// new capacity yet.
fn act(
    d: &mut StepDecision,
    sides: &Sides<'_>,
    action: Action,
    pacing: &UpgradeOptions,
    s: &Settings,
    now: Timestamp,
) -> bool {
    match action {
        Action::Wait { until, reason } => {
            wait(d, sides.observed, s, pacing, until, reason);
            return false;
        }
        Action::SetTargetCapacity { role, percent } => {
            if !set_target_capacity(d, sides, role, percent) {
                let wait_reason = match role {
                    Role::Active => WaitReason::ActiveCapacityNotReady,
                    Role::Pending => WaitReason::PendingCapacityNotReady,
                };
                set_progressing(&mut d.status, Some(wait_reason), s, now);
                d.wake = Some(now + s.serve_poll);
                return false;
            }
        }
        Action::SetTraffic { active, pending } => set_traffic(d, sides, active, pending),
        Action::Promote => promote(d, sides),
        Action::FinishRollback => finish_rollback(d, sides, s, now),
    }
    true
}

/// Serve runs another `target_capacity` than the status records: a pass applied it but its status write was
/// lost (a spec edit in between makes the write conflict), or someone else set it. The status is the plan
/// every invariant was checked on, so Serve is set back to it before anything else moves; otherwise the
/// upgrade would wait forever for a capacity nobody sets. Not right after a change (Serve may still
/// report the old value for a moment).
fn restore_capacity(
    d: &mut StepDecision,
    sides: [(Role, &ClusterSeen); 2],
    o: &Observed,
    s: &Settings,
    now: Timestamp,
) -> bool {
    let settled = d
        .status
        .progress
        .last_progress_time
        .is_none_or(|t| t + s.serve_poll <= now);
    if !settled {
        return false;
    }
    for (role, cluster) in sides {
        let recorded = o.levels(role).capacity;
        let Some(running) = cluster
            .serve_capacity
            .filter(|c| cluster.reachable && *c != recorded)
        else {
            continue;
        };
        d.effects.push(Effect::TargetCapacity {
            role,
            cluster: cluster.name.clone(),
            percent: recorded,
        });
        d.tallies.push(Tally::CapacityChange(role));
        let note = format!(
            "Serve of {} RayCluster {}/{} ran target_capacity {running}%, the upgrade's record says {recorded}%: set it back to {recorded}%",
            role.as_str(),
            s.namespace,
            cluster.name
        );
        d.notices
            .push(Notice::warning("RestoredServeTargetCapacity", "Update", note));
        d.wake = Some(now + SignedDuration::from_millis(20));
        return true;
    }
    false
}

/// Fresh sides start where KubeRay starts them: a first cluster at full capacity, a new pending one at 0.
fn seed_levels(status: &mut RayServiceStatuses) {
    let first = status
        .active_service_status
        .as_ref()
        .and_then(|a| a.ray_cluster_name.as_ref())
        .is_none();
    if let Some(pending) = status.pending_service_status.as_mut()
        && pending.target_capacity.is_none()
    {
        let level = if first { 100 } else { 0 };
        pending.target_capacity = Some(level);
        pending.traffic_routed_percent = Some(level);
    }
    if let Some(active) = status.active_service_status.as_mut() {
        active.target_capacity.get_or_insert(100);
        active.traffic_routed_percent.get_or_insert(100);
    }
}

/// Abort, deadline and pause first, with their events and the rollback condition; then what the planner
/// sees.
fn steer(
    d: &mut StepDecision,
    seen: &Observation,
    pending: &ClusterSeen,
    s: &Settings,
    now: Timestamp,
) -> Observed {
    let last_step = last_step_time(&d.status);
    let pending_runs_goal = pending.spec_digest.as_deref() == Some(s.goal_digest.as_str());
    let steering = Steering {
        control: s.control,
        pending_runs_goal,
        deadline: s.deadline,
        // The drain after the last step is scheduled waiting too, not a stall.
        interval: s.options.interval.max(s.options.drain),
        last_traffic_step: last_step,
        now,
    };
    if let Some(abort) = d.status.progress.steer(&steering) {
        let note = format!("Rolling back the incremental upgrade: {}", abort.message);
        d.notices
            .push(Notice::warning(abort.reason.as_str(), "Reconcile", note));
    }
    let direction = d.status.progress.direction(pending_runs_goal);
    let reverted =
        seen.active.as_ref().and_then(|a| a.spec_digest.as_deref()) == Some(s.goal_digest.as_str());
    set_rollback_condition(&mut d.status, direction, reverted, s, now);
    if was_paused(&d.status) && s.control != Control::Pause {
        let note = "Incremental upgrade resumed: rayshift.io/upgrade-control no longer says pause";
        d.notices
            .push(Notice::normal("UpgradeResumed", "Reconcile", note.into()));
    }
    let active = seen.active.clone().unwrap_or_default();
    Observed {
        active: Levels::from_status(d.status.active_service_status.as_ref(), Role::Active),
        pending: Levels::from_status(d.status.pending_service_status.as_ref(), Role::Pending),
        last_traffic_step: last_step,
        direction,
        route_ready: seen.route_ready,
        pending_capacity_ready: pending.reachable && pending.capacity_verified,
        active_capacity_ready: active.reachable && active.capacity_verified,
        pending_capacity_found: pending.reachable && pending.capacity_found,
        active_capacity_found: active.reachable && active.capacity_found,
        pending_reachable: pending.reachable,
        pending_stalled: seen.pending_stall.is_some(),
        paused: s.control == Control::Pause,
        hurry: s.control == Control::Promote,
        now,
    }
}

/// The pacing of this pass: the spec's, ResourceAware when the RayService says `always`, or once an upgrade
/// with `on-stall` found its pending cluster unschedulable for lack of a resource (recorded, so it stays so).
/// Records the stall itself, with an event when it begins.
fn pacing(
    d: &mut StepDecision,
    seen: &Observation,
    o: &Observed,
    s: &Settings,
    now: Timestamp,
) -> UpgradeOptions {
    let progress = &mut d.status.progress;
    let stall = seen.pending_stall.as_ref().map(Stall::describe);
    if stall.is_some() && progress.pending_stall.is_none() {
        let note = format!("Pending RayCluster {}", stall.clone().unwrap_or_default());
        d.notices
            .push(Notice::warning("PendingClusterUnschedulable", "Reconcile", note));
    }
    progress.pending_stall.clone_from(&stall);
    let switch = s.resource_aware == ResourceAwareMode::OnStall
        && stall.is_some()
        && o.direction == Direction::Forward
        && progress.resource_aware_since.is_none();
    if switch {
        progress.resource_aware_since = Some(now);
        let note = format!(
            "Switched to ResourceAware pacing (rayshift.io/resource-aware: on-stall): the active cluster gives way first, serving capacity stays at or above {}%; {}",
            100 - s.max_unavailable_percent,
            stall.unwrap_or_default()
        );
        d.notices
            .push(Notice::warning("ResourceAwareMode", "Reconcile", note));
    }
    // `always` is recorded too, at its first pass: the status, the gauge and `kubectl rayshift status` show it.
    if s.resource_aware == ResourceAwareMode::Always && progress.resource_aware_since.is_none() {
        progress.resource_aware_since = Some(now);
        let note = format!(
            "ResourceAware pacing (rayshift.io/resource-aware: always): the active cluster gives way first, serving capacity stays at or above {}%",
            100 - s.max_unavailable_percent
        );
        d.notices
            .push(Notice::normal("ResourceAwareMode", "Reconcile", note));
    }
    let on = progress.resource_aware_since.is_some();
    UpgradeOptions {
        resource_aware: on
            .then(|| super::resource_aware::ResourceAware::live(s.max_unavailable_percent, &s.options)),
        ..s.options
    }
}

/// Records why the upgrade waits and when to look again.
fn wait(
    d: &mut StepDecision,
    o: &Observed,
    s: &Settings,
    pacing: &UpgradeOptions,
    until: Option<Timestamp>,
    reason: WaitReason,
) {
    let paused_before = was_paused(&d.status);
    set_progressing(&mut d.status, Some(reason), s, o.now);
    if reason == WaitReason::Paused && !paused_before {
        let note = "Incremental upgrade paused by rayshift.io/upgrade-control";
        d.notices
            .push(Notice::normal("UpgradePaused", "Reconcile", note.into()));
    }
    let progress = &mut d.status.progress;
    if reason == WaitReason::Paused {
        progress.upgrade_expected_completion_time = None;
    } else if progress.upgrade_expected_completion_time.is_none() {
        expect_completion(d, o, s, pacing);
    }
    d.step_due = until;
    d.wake = Some(match until {
        Some(due) => due,
        None if reason == WaitReason::SloChecks => slo_gate::wake(&d.status, s, o.now),
        None => capacity_wake(o, s, reason),
    });
}

/// The expected completion, from the levels this pass leaves, under the pacing it runs (ResourceAware or
/// not). Recomputed only when the upgrade moves (or has none yet): between steps it stays put and costs no
/// status write.
fn expect_completion(d: &mut StepDecision, before: &Observed, s: &Settings, pacing: &UpgradeOptions) {
    let progress = &d.status.progress;
    let Some(started) = progress.upgrade_start_time else {
        return;
    };
    if d.status.pending_service_status.is_none() {
        return;
    }
    let after = Observed {
        active: Levels::from_status(d.status.active_service_status.as_ref(), Role::Active),
        pending: Levels::from_status(d.status.pending_service_status.as_ref(), Role::Pending),
        last_traffic_step: last_step_time(&d.status),
        ..*before
    };
    // A step gated by SLO checks comes at least their longest window after the one before it.
    let window = s.slo_checks.iter().map(|c| c.window_seconds).max().unwrap_or(0);
    let options = UpgradeOptions {
        interval: pacing.interval.max(SignedDuration::from_secs(i64::from(window))),
        ..*pacing
    };
    d.status.progress.upgrade_expected_completion_time =
        super::expected_completion(&options, &after, started);
}

/// When to look again while a step waits for Serve. A step is due at `last step + interval` or at the
/// instant its capacity is verified, whichever is later; that instant is only seen by reading Serve, so
/// once the interval has passed Serve is read at the short capacity poll, and before that at the due
/// instant (or the usual poll, if sooner). A read that found the capacity is confirmed at the capacity poll,
/// so the step is ready before its due instant (the controller comes a lead early for it) instead of being
/// confirmed only at that instant and made late by the pass that confirms it.
fn capacity_wake(o: &Observed, s: &Settings, reason: WaitReason) -> Timestamp {
    let found = match reason {
        WaitReason::PendingCapacityNotReady => o.pending_capacity_found,
        WaitReason::ActiveCapacityNotReady => o.active_capacity_found,
        _ => return o.now + s.serve_poll,
    };
    match o.last_traffic_step.map(|t| t + s.options.interval) {
        Some(due) if due > o.now && !found => (o.now + s.serve_poll).min(due),
        _ => o.now + s.capacity_poll,
    }
}

/// The two clusters of a running upgrade, as the pass began.
#[derive(Clone, Copy)]
struct Sides<'a> {
    active: &'a ClusterSeen,
    pending: &'a ClusterSeen,
    observed: &'a Observed,
    namespace: &'a str,
}

/// Sets the new `target_capacity`; `false` when that cluster's Serve cannot take it yet.
fn set_target_capacity(d: &mut StepDecision, u: &Sides<'_>, role: Role, percent: i32) -> bool {
    let from = u.observed.levels(role).capacity;
    let (cluster, side) = match role {
        Role::Active => (u.active, &mut d.status.active_service_status),
        Role::Pending => (u.pending, &mut d.status.pending_service_status),
    };
    if !cluster.reachable {
        return false;
    }
    if let Some(side) = side.as_mut() {
        side.target_capacity = Some(percent);
    }
    d.effects.push(Effect::TargetCapacity {
        role,
        cluster: cluster.name.clone(),
        percent,
    });
    d.tallies.push(Tally::CapacityChange(role));
    let note = format!(
        "Set target_capacity of {} RayCluster {}/{}: {from}% → {percent}%{}",
        role.as_str(),
        u.namespace,
        cluster.name,
        rolling_back(u.observed.direction)
    );
    d.notices
        .push(Notice::normal("UpdatedServeTargetCapacity", "Update", note));
    true
}

fn set_traffic(d: &mut StepDecision, u: &Sides<'_>, active: i32, pending: i32) {
    let now = u.observed.now;
    let waited = u
        .observed
        .last_traffic_step
        .map(|t| now.duration_since(t).as_secs_f64());
    d.tallies.push(Tally::TrafficStep {
        waited_seconds: waited,
    });
    d.status.progress.last_traffic_step_time = Some(now);
    for (side, weight) in [
        (&mut d.status.active_service_status, active),
        (&mut d.status.pending_service_status, pending),
    ] {
        if let Some(side) = side.as_mut() {
            side.traffic_routed_percent = Some(weight);
            side.last_traffic_migrated_time = Some(Time(now));
        }
    }
    d.effects.push(Effect::Traffic);
    let (a, p) = (u.observed.active.traffic, u.observed.pending.traffic);
    let note = format!(
        "Moved traffic: {} {a}% → {active}%, {} {p}% → {pending}%{}",
        u.active.name,
        u.pending.name,
        rolling_back(u.observed.direction)
    );
    d.notices.push(Notice::normal("UpdatedHTTPRoute", "Update", note));
}

fn promote(d: &mut StepDecision, u: &Sides<'_>) {
    let mut promoted: ClusterServiceStatus = d.status.pending_service_status.take().unwrap_or_default();
    promoted.target_capacity = Some(100);
    promoted.traffic_routed_percent = Some(100);
    d.status.active_service_status = Some(promoted);
    d.tallies.push(Tally::Finished {
        result: UpgradeResult::Completed,
        seconds: d.status.progress.duration(u.observed.now),
    });
    d.status.progress = Default::default();
    let note = format!(
        "Promoted RayCluster {}/{}: it serves all traffic now; {} will be deleted",
        u.namespace, u.pending.name, u.active.name
    );
    d.notices.push(Notice::normal("Promoted", "Reconcile", note));
}

fn finish_rollback(d: &mut StepDecision, u: &Sides<'_>, s: &Settings, now: Timestamp) {
    d.status.pending_service_status = None;
    if let Some(a) = d.status.active_service_status.as_mut() {
        a.target_capacity = Some(100);
        a.traffic_routed_percent = Some(100);
    }
    let progress = &d.status.progress;
    // An abort or a missed deadline rejects the spec the pending cluster ran; a spec change does not.
    let (result, rejected) = match &progress.upgrade_abort {
        Some(a) if a.reason == AbortReason::UpgradeAborted => {
            (UpgradeResult::Aborted, u.pending.spec_digest.clone())
        }
        Some(_) => (UpgradeResult::RolledBack, u.pending.spec_digest.clone()),
        None => (UpgradeResult::RolledBack, progress.rejected_spec_digest.clone()),
    };
    d.tallies.push(Tally::Finished {
        result,
        seconds: progress.duration(now),
    });
    d.status.progress = progress.finished(rejected);
    merge_conditions(&mut d.status, &[], &[conditions::ROLLBACK_IN_PROGRESS], s, now);
    let note = format!(
        "Rollback complete: all traffic and capacity are back on RayCluster {}/{}",
        u.namespace, u.active.name
    );
    d.notices.push(Notice::normal("RolledBack", "Reconcile", note));
}

fn rolling_back(direction: Direction) -> &'static str {
    match direction {
        Direction::Forward => "",
        Direction::Rollback => " (rolling back)",
    }
}

fn was_paused(status: &RayServiceStatuses) -> bool {
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == PROGRESSING && c.reason == WaitReason::Paused.as_str())
}

fn merge_conditions(
    status: &mut RayServiceStatuses,
    wanted: &[Wanted],
    drop: &[&str],
    s: &Settings,
    now: Timestamp,
) {
    let old = status.conditions.take().unwrap_or_default();
    status.conditions = Some(conditions::merge(&old, wanted, drop, s.generation, &Time(now)));
}

/// RollbackInProgress with KubeRay's two messages: the spec went back to the active cluster's (A→B→A), or
/// on to a third one that comes after the rollback.
fn set_rollback_condition(
    status: &mut RayServiceStatuses,
    direction: Direction,
    reverted: bool,
    s: &Settings,
    now: Timestamp,
) {
    if direction == Direction::Forward {
        merge_conditions(status, &[], &[conditions::ROLLBACK_IN_PROGRESS], s, now);
        return;
    }
    let (reason, message) = match &status.progress.upgrade_abort {
        Some(a) => (a.reason.as_str(), a.message.clone()),
        None if reverted => (
            "DesiredClusterSpecChanged",
            "Goal state reverted to original cluster, rolling back.".to_string(),
        ),
        None => (
            "DesiredClusterSpecChanged",
            "Goal state changed mid-upgrade, rolling back to original cluster.".to_string(),
        ),
    };
    let wanted = Wanted::new(conditions::ROLLBACK_IN_PROGRESS, true, reason, message);
    merge_conditions(status, &[wanted], &[], s, now);
}

/// `Progressing` while both clusters exist: True when steps happen on schedule, False with the reason when
/// the upgrade waits for something other than its interval.
fn set_progressing(
    status: &mut RayServiceStatuses,
    waiting: Option<WaitReason>,
    s: &Settings,
    now: Timestamp,
) {
    let named = |side: &Option<ClusterServiceStatus>| {
        side.as_ref().and_then(|x| x.ray_cluster_name.as_ref()).is_some()
    };
    let upgrading = named(&status.active_service_status) && named(&status.pending_service_status);
    match (upgrading, waiting) {
        (false, _) => merge_conditions(status, &[], &[PROGRESSING], s, now),
        (true, Some(WaitReason::Interval | WaitReason::Draining) | None) => {
            let w = Wanted::new(
                PROGRESSING,
                true,
                "StepsOnSchedule",
                "The incremental upgrade is moving step by step",
            );
            merge_conditions(status, &[w], &[], s, now);
        }
        (true, Some(WaitReason::PendingCapacityNotReady)) if status.progress.pending_stall.is_some() => {
            let message = status.progress.pending_stall.clone().unwrap_or_default();
            let w = Wanted::new(PROGRESSING, false, "InsufficientResources", message);
            merge_conditions(status, &[w], &[], s, now);
        }
        (true, Some(r)) => {
            let message = match r {
                WaitReason::SloChecks => slo_gate::waiting(status, s, last_step_time(status)),
                WaitReason::Paused => match slo_gate::pause_cause(status) {
                    Some(cause) => format!("{} ({cause})", waiting_message(r)),
                    None => waiting_message(r).to_string(),
                },
                _ => waiting_message(r).to_string(),
            };
            let w = Wanted::new(PROGRESSING, false, r.as_str(), message);
            merge_conditions(status, &[w], &[], s, now);
        }
    }
}

fn waiting_message(r: WaitReason) -> &'static str {
    match r {
        WaitReason::RouteNotReady => {
            "Waiting for the Gateway (Accepted, Programmed) and the HTTPRoute (Accepted, ResolvedRefs) to report the current generation"
        }
        WaitReason::PendingCapacityNotReady => {
            "Waiting for the pending cluster's Serve replicas for its target_capacity to be RUNNING before moving traffic"
        }
        WaitReason::ActiveCapacityNotReady => {
            "Waiting for the active cluster's Serve replicas for its target_capacity to be RUNNING before moving traffic back"
        }
        WaitReason::Paused => "Paused by the rayshift.io/upgrade-control annotation",
        WaitReason::Interval => "Waiting for the next interval",
        WaitReason::SloChecks => "Waiting for the SLO checks (rayshift.io/slo-checks) to pass",
        WaitReason::NoRoom => {
            "ResourceAware: the active cluster is at its floor (maxUnavailablePercent below its traffic) and the cluster has no room for the pending cluster's next raise"
        }
        WaitReason::Draining => {
            "Waiting for the drain time (rayshift.io/drain-seconds) before the cluster that lost its traffic goes to target_capacity 0"
        }
    }
}

impl Notice {
    pub(super) fn normal(reason: &'static str, action: &'static str, note: String) -> Self {
        Self {
            warning: false,
            reason,
            action,
            note,
        }
    }

    pub(super) fn warning(reason: &'static str, action: &'static str, note: String) -> Self {
        Self {
            warning: true,
            ..Self::normal(reason, action, note)
        }
    }
}

/// The planner's view of a running upgrade from its status alone, readiness assumed as a plan assumes it (for
/// `kubectl rayshift`, which sees no dashboard); `None` when no upgrade runs.
pub fn observed_in_status(status: &RayServiceStatuses, control: Control, now: Timestamp) -> Option<Observed> {
    let named = |s: &Option<ClusterServiceStatus>| s.as_ref().is_some_and(|s| s.ray_cluster_name.is_some());
    if !named(&status.active_service_status) || !named(&status.pending_service_status) {
        return None;
    }
    let rolling_back = status.progress.upgrade_abort.is_some()
        || status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == conditions::ROLLBACK_IN_PROGRESS && c.status == "True");
    Some(Observed {
        active: Levels::from_status(status.active_service_status.as_ref(), Role::Active),
        pending: Levels::from_status(status.pending_service_status.as_ref(), Role::Pending),
        last_traffic_step: last_step_time(status),
        direction: if rolling_back {
            Direction::Rollback
        } else {
            Direction::Forward
        },
        route_ready: true,
        pending_capacity_ready: true,
        active_capacity_ready: true,
        pending_capacity_found: true,
        active_capacity_found: true,
        pending_reachable: true,
        pending_stalled: false,
        paused: control == Control::Pause,
        hurry: control == Control::Promote,
        now,
    })
}
