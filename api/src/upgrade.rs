//! The incremental-upgrade state machine, as one pure function.
//!
//! [`next_action`] looks at the capacities and traffic weights of the active and pending clusters and
//! says what to do next: raise or lower a Ray Serve `target_capacity`, move route weight, promote, finish
//! a rollback, or wait (with the instant to come back, or the reason). The controller applies the action,
//! observes again and asks again, so every decision is made on fresh state and can be unit-tested.
//!
//! Semantics follow KubeRay (behaviour reference 6.5): capacity moves by `maxSurgePercent` once traffic has
//! caught up with it, traffic moves by `stepSizePercent` every `intervalSeconds` up to the pending capacity.
//! Deliberate differences:
//! - a traffic step needs the pending capacity *verified* (replicas RUNNING), not only apps RUNNING;
//! - pacing is exact: the next step is due at `last step + interval`, and the planner says so;
//! - a rollback never lowers the pending capacity below the traffic it still carries (KubeRay bug 6.5/9.7);
//! - states that break an invariant (hand edits, another controller) are repaired first.

use jiff::{SignedDuration, Timestamp};

use crate::{
    RayService,
    rayservice::{ClusterServiceStatus, ClusterUpgradeOptions, DEFAULT_MAX_SURGE_PERCENT},
    upgrade_control::{self, DEFAULT_DRAIN_SECONDS},
};

/// Serve reads in a row that must find a cluster's capacity RUNNING before traffic moves onto it: an app
/// flapping between RUNNING and UNHEALTHY is not verified capacity.
pub const CAPACITY_VERIFIED_READS: u32 = 2;

/// Which of the two clusters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Active,
    Pending,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Active => "active",
            Role::Pending => "pending",
        }
    }
}

/// Validated pacing of an incremental upgrade.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpgradeOptions {
    /// Percent of capacity added (pending) or removed (active) per capacity step, 1..=100.
    pub max_surge_percent: i32,
    /// Percent of traffic moved per traffic step, 1..=100.
    pub step_size_percent: i32,
    /// Minimum time between two traffic steps.
    pub interval: SignedDuration,
    /// How long a cluster whose traffic went to 0 keeps its last replicas after that step (see `lower`).
    pub drain: SignedDuration,
    /// Lower the active cluster first, for clusters without room for a surge (issue 18).
    pub resource_aware: Option<resource_aware::ResourceAware>,
}

impl UpgradeOptions {
    /// Reads the spec's options; `None` when they could never finish an upgrade (admission denies those).
    pub fn from_spec(o: &ClusterUpgradeOptions) -> Option<Self> {
        let surge = o.max_surge_percent.unwrap_or(DEFAULT_MAX_SURGE_PERCENT);
        let step = o.step_size_percent?;
        let interval = o.interval_seconds?;
        let pct = 1..=100;
        (pct.contains(&surge) && pct.contains(&step) && interval >= 0).then(|| Self {
            max_surge_percent: surge,
            step_size_percent: step,
            interval: SignedDuration::from_secs(i64::from(interval)),
            drain: SignedDuration::from_secs(DEFAULT_DRAIN_SECONDS),
            resource_aware: None,
        })
    }

    /// The options an incremental upgrade of `rs` runs with: its clusterUpgradeOptions, and the drain time of
    /// its annotation, else `default_drain_seconds` (the operator's). `None` as for `from_spec`.
    pub fn of(rs: &RayService, default_drain_seconds: i64) -> Option<Self> {
        let drain = rs
            .metadata
            .annotations
            .as_ref()
            .map_or(default_drain_seconds, |a| {
                upgrade_control::drain_seconds(a, default_drain_seconds)
            });
        Some(Self::from_spec(rs.spec.cluster_upgrade_options()?)?.with_drain_seconds(drain))
    }

    /// The same options with another drain time, in seconds.
    pub fn with_drain_seconds(self, seconds: i64) -> Self {
        Self {
            drain: SignedDuration::from_secs(seconds),
            ..self
        }
    }
}

/// Capacity and traffic of one cluster, in percent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Levels {
    /// Ray Serve `target_capacity`.
    pub capacity: i32,
    /// Route weight.
    pub traffic: i32,
}

impl Levels {
    /// Reads a status side, using KubeRay's defaults for unset values (active 100/100, pending 0/0).
    pub fn from_status(status: Option<&ClusterServiceStatus>, role: Role) -> Self {
        let default = match role {
            Role::Active => 100,
            Role::Pending => 0,
        };
        let clamp = |v: Option<i32>| v.unwrap_or(default).clamp(0, 100);
        Self {
            capacity: clamp(status.and_then(|s| s.target_capacity)),
            traffic: clamp(status.and_then(|s| s.traffic_routed_percent)),
        }
    }
}

/// Going to the pending cluster, or back to the active one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Forward,
    Rollback,
}

/// Everything the planner needs to know, as observed by the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed {
    pub active: Levels,
    pub pending: Levels,
    /// When the route weights last changed.
    pub last_traffic_step: Option<Timestamp>,
    pub direction: Direction,
    /// Gateway Accepted+Programmed and route Accepted+ResolvedRefs for the current generation.
    pub route_ready: bool,
    /// The pending cluster's apps are RUNNING with the replicas its target capacity implies.
    pub pending_capacity_ready: bool,
    /// The same for the active cluster (checked before traffic moves back to it).
    pub active_capacity_ready: bool,
    /// The last read found the pending cluster's capacity, whether or not enough reads in a row verified it.
    pub pending_capacity_found: bool,
    /// The same for the active cluster.
    pub active_capacity_found: bool,
    /// The pending cluster's dashboard answers, so its capacity can be changed.
    pub pending_reachable: bool,
    /// The pending cluster's Pods cannot be scheduled for lack of a resource.
    pub pending_stalled: bool,
    /// Paused by the user: hold everything.
    pub paused: bool,
    /// Promote requested by the user: skip the interval waits.
    pub hurry: bool,
    pub now: Timestamp,
}

impl Observed {
    /// The levels of one cluster.
    pub fn levels(&self, role: Role) -> Levels {
        match role {
            Role::Active => self.active,
            Role::Pending => self.pending,
        }
    }
}

/// Why the upgrade is not moving right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitReason {
    /// The next traffic step is due at a known instant.
    Interval,
    RouteNotReady,
    PendingCapacityNotReady,
    ActiveCapacityNotReady,
    /// A cluster whose traffic just went to 0 keeps its replicas until the drain time has passed.
    Draining,
    Paused,
    /// A forward traffic step waits for every SLO check to pass on data from after the last step.
    SloChecks,
    /// ResourceAware: the active cluster is at its floor and the cluster has no room for more.
    NoRoom,
}

impl WaitReason {
    /// CamelCase reason for conditions and events.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Interval => "WaitingForInterval",
            WaitReason::RouteNotReady => "WaitingForGateway",
            WaitReason::PendingCapacityNotReady => "WaitingForPendingCapacity",
            WaitReason::ActiveCapacityNotReady => "WaitingForActiveCapacity",
            WaitReason::Draining => "Draining",
            WaitReason::Paused => "Paused",
            WaitReason::SloChecks => "WaitingForSloChecks",
            WaitReason::NoRoom => "WaitingForRoom",
        }
    }
}

/// The one thing to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// PUT the Serve config of that cluster with this `target_capacity`.
    SetTargetCapacity { role: Role, percent: i32 },
    /// Write these route weights (they sum to 100).
    SetTraffic { active: i32, pending: i32 },
    /// The pending cluster carries all traffic at full capacity: make it active.
    Promote,
    /// Traffic and capacity are back on the active cluster: drop the pending one.
    FinishRollback,
    /// Nothing to do until `until` (if known) or until something observed changes.
    Wait {
        until: Option<Timestamp>,
        reason: WaitReason,
    },
}

/// Decides the next step of an incremental upgrade (or its rollback).
pub fn next_action(opts: &UpgradeOptions, obs: &Observed) -> Action {
    if let Some(repair) = repair(opts, obs) {
        return repair;
    }
    if obs.paused {
        return Action::Wait {
            until: None,
            reason: WaitReason::Paused,
        };
    }
    if let Some(ra) = opts.resource_aware {
        return resource_aware::next(opts, ra, obs);
    }
    match obs.direction {
        Direction::Forward => forward(opts, obs),
        Direction::Rollback => rollback(opts, obs),
    }
}

/// Restores the invariants if the observed state breaks them; traffic safety comes before pacing.
fn repair(opts: &UpgradeOptions, obs: &Observed) -> Option<Action> {
    let (a, p) = (obs.active, obs.pending);
    // ResourceAware: a cluster giving way may carry up to maxUnavailablePercent more than its capacity (the
    // pending one only while rolling back).
    let dip = opts.resource_aware.map_or(0, |ra| ra.max_unavailable_percent);
    let pending_dip = if obs.direction == Direction::Rollback && p.capacity > 0 {
        dip
    } else {
        0
    };
    // Weights must sum to 100 and pending weight must not exceed pending capacity.
    if a.traffic + p.traffic != 100 || p.traffic > p.capacity + pending_dip {
        let pending = p.traffic.min(p.capacity + pending_dip);
        return Some(Action::SetTraffic {
            active: 100 - pending,
            pending,
        });
    }
    // Traffic the active cluster carries needs capacity behind it.
    if a.traffic > a.capacity + dip || (a.traffic > 0 && a.capacity == 0) {
        return Some(Action::SetTargetCapacity {
            role: Role::Active,
            percent: (a.traffic - dip).max(1),
        });
    }
    None
}

fn forward(opts: &UpgradeOptions, obs: &Observed) -> Action {
    let (a, p) = (obs.active, obs.pending);
    if p.traffic == 100 && a.capacity == 0 {
        return Action::Promote;
    }
    // Lowering a capacity relies on the traffic having left it: the data plane must have the status' weights.
    if !obs.route_ready {
        return wait(WaitReason::RouteNotReady);
    }
    if let Some(lower) = over_surge(opts, obs) {
        return lower;
    }
    // Capacity moves only once traffic has caught up with the pending capacity.
    if p.traffic == p.capacity {
        if a.capacity + p.capacity > 100 {
            // Never below the traffic the active cluster still carries.
            let percent = (a.capacity - opts.max_surge_percent).max(a.traffic).max(0);
            return lower(opts, obs, Role::Active, percent);
        }
        if p.capacity < 100 {
            let percent = (p.capacity + opts.max_surge_percent).min(100);
            return Action::SetTargetCapacity {
                role: Role::Pending,
                percent,
            };
        }
    }
    traffic_step(opts, obs)
}

/// The next traffic step onto the pending cluster's verified capacity, once it is due.
fn traffic_step(opts: &UpgradeOptions, obs: &Observed) -> Action {
    if !obs.pending_capacity_ready {
        return wait(WaitReason::PendingCapacityNotReady);
    }
    if let Some(due) = step_due(opts, obs) {
        return Action::Wait {
            until: Some(due),
            reason: WaitReason::Interval,
        };
    }
    let p = obs.pending;
    let pending = (p.traffic + opts.step_size_percent).min(p.capacity).min(100);
    Action::SetTraffic {
        active: 100 - pending,
        pending,
    }
}

fn rollback(opts: &UpgradeOptions, obs: &Observed) -> Action {
    let (a, p) = (obs.active, obs.pending);
    // An unreachable pending cluster cannot be scaled; count only what it still serves.
    let pending_capacity = if obs.pending_reachable {
        p.capacity
    } else {
        p.traffic
    };
    if a.capacity == 100 && a.traffic == 100 && pending_capacity == 0 {
        return Action::FinishRollback;
    }
    // As going forward: the pending capacity is lowered only once the route has moved traffic off it.
    if !obs.route_ready {
        return wait(WaitReason::RouteNotReady);
    }
    if a.traffic == a.capacity {
        if a.capacity + pending_capacity > 100 {
            // Never below the traffic the pending cluster still carries (KubeRay bug 9.7).
            let percent = (p.capacity - opts.max_surge_percent).max(p.traffic).max(0);
            return lower(opts, obs, Role::Pending, percent);
        }
        if a.capacity < 100 {
            let percent = (a.capacity + opts.max_surge_percent).min(100);
            return Action::SetTargetCapacity {
                role: Role::Active,
                percent,
            };
        }
        // Active is at 100/100 and the sum is within bounds: only the pending capacity is left.
        return lower(opts, obs, Role::Pending, 0);
    }
    if !obs.active_capacity_ready {
        return wait(WaitReason::ActiveCapacityNotReady);
    }
    if let Some(due) = step_due(opts, obs) {
        return Action::Wait {
            until: Some(due),
            reason: WaitReason::Interval,
        };
    }
    let active = (a.traffic + opts.step_size_percent).min(a.capacity).min(100);
    Action::SetTraffic {
        active,
        pending: 100 - active,
    }
}

/// Capacity above `100 + maxSurgePercent` going forward (left by a rollback that was reverted, or a hand
/// edit): lowered first, the active side before the pending one, never below the traffic either carries.
fn over_surge(opts: &UpgradeOptions, obs: &Observed) -> Option<Action> {
    let (a, p) = (obs.active, obs.pending);
    let bound = 100 + opts.max_surge_percent;
    if a.capacity + p.capacity <= bound {
        return None;
    }
    let active = (bound - p.capacity).max(a.traffic);
    if active < a.capacity {
        return Some(Action::SetTargetCapacity {
            role: Role::Active,
            percent: active,
        });
    }
    Some(Action::SetTargetCapacity {
        role: Role::Pending,
        percent: (bound - a.capacity).max(p.traffic),
    })
}

/// Lowers a cluster's capacity; a cut to 0 waits until `drain` after the traffic step that took the
/// cluster's last traffic. The gateway may still send it requests under the previous weights for a moment
/// (the route's status can come before the data plane, and requests already dispatched are on their way), and
/// Ray Serve holds a request for a deployment without replicas until one appears, which at target_capacity 0
/// never happens: the request hangs. Partial cuts leave replicas to serve such stragglers.
fn lower(opts: &UpgradeOptions, obs: &Observed, role: Role, percent: i32) -> Action {
    let until = obs.last_traffic_step.and_then(|t| t.checked_add(opts.drain).ok());
    match until {
        Some(until) if percent == 0 && until > obs.now => Action::Wait {
            until: Some(until),
            reason: WaitReason::Draining,
        },
        _ => Action::SetTargetCapacity { role, percent },
    }
}

/// When the next traffic step is due, if that is still in the future.
fn step_due(opts: &UpgradeOptions, obs: &Observed) -> Option<Timestamp> {
    if obs.hurry {
        return None;
    }
    let due = obs.last_traffic_step?.checked_add(opts.interval).ok()?;
    (due > obs.now).then_some(due)
}

fn wait(reason: WaitReason) -> Action {
    Action::Wait { until: None, reason }
}

/// Applies an action to the levels, as the controller would after a successful write.
pub fn apply(obs: &mut Observed, action: Action) {
    match action {
        Action::SetTargetCapacity {
            role: Role::Active,
            percent,
        } => obs.active.capacity = percent,
        Action::SetTargetCapacity {
            role: Role::Pending,
            percent,
        } => obs.pending.capacity = percent,
        Action::SetTraffic { active, pending } => {
            obs.active.traffic = active;
            obs.pending.traffic = pending;
            obs.last_traffic_step = Some(obs.now);
        }
        Action::Promote | Action::FinishRollback | Action::Wait { .. } => {}
    }
}

/// One row of a planned timeline.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PlanStep {
    pub t_seconds: f64,
    pub active_capacity: i32,
    pub pending_capacity: i32,
    pub active_traffic: i32,
    pub pending_traffic: i32,
    pub action: String,
}

/// The timeline of an upgrade whose clusters become ready instantly.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Plan {
    pub steps: Vec<PlanStep>,
    pub peak_total_capacity: i32,
    pub traffic_steps: usize,
    /// Serve `target_capacity` changes: each waits for its replicas in a real upgrade.
    pub capacity_changes: usize,
    pub min_duration_seconds: f64,
    /// The lowest serving capacity on the way: the active capacity plus the pending capacity traffic may
    /// already use (a raise counts once it is verified). 100 unless ResourceAware dips.
    pub min_serving_capacity: i32,
}

/// Upper bound on actions of any upgrade: each traffic step moves >= 1%, each capacity step >= 1%.
pub const MAX_ACTIONS: usize = 4 * 101 + 8;

/// A fresh upgrade at `now`: active 100/100, pending 0/0, every cluster ready at once.
fn fresh_start(now: Timestamp) -> Observed {
    Observed {
        active: Levels {
            capacity: 100,
            traffic: 100,
        },
        pending: Levels {
            capacity: 0,
            traffic: 0,
        },
        last_traffic_step: None,
        direction: Direction::Forward,
        route_ready: true,
        pending_capacity_ready: true,
        active_capacity_ready: true,
        pending_capacity_found: true,
        active_capacity_found: true,
        pending_reachable: true,
        pending_stalled: false,
        paused: false,
        hurry: false,
        now,
    }
}

/// `obs` with every cluster and route ready and nothing paused: what a plan assumes.
fn ready_at_once(obs: &Observed) -> Observed {
    Observed {
        route_ready: true,
        pending_capacity_ready: true,
        active_capacity_ready: true,
        pending_capacity_found: true,
        active_capacity_found: true,
        pending_reachable: true,
        pending_stalled: false,
        paused: false,
        ..*obs
    }
}

/// Runs the planner from `obs` with every wait for readiness over at once, calling `visit` after each
/// applied action; `true` once the upgrade is promoted or rolled back, `false` if it cannot get there.
fn simulate(opts: &UpgradeOptions, obs: &mut Observed, mut visit: impl FnMut(&Observed, Action)) -> bool {
    for _ in 0..MAX_ACTIONS {
        let action = next_action(opts, obs);
        match action {
            Action::Wait { until: Some(t), .. } => {
                obs.now = t;
                continue;
            }
            Action::Wait { until: None, .. } => return false,
            _ => {}
        }
        apply(obs, action);
        visit(obs, action);
        if matches!(action, Action::Promote | Action::FinishRollback) {
            return true;
        }
    }
    false
}

/// Simulates an upgrade from a fresh pending cluster (active 100/100, pending 0/0) to promotion.
pub fn plan(opts: &UpgradeOptions) -> Plan {
    plan_from(
        opts,
        &fresh_start(Timestamp::UNIX_EPOCH),
        "start: pending cluster created",
    )
}

/// Simulates the rest of an upgrade from `from` (a running one's levels and last step), its clusters ready
/// at once; times count from `from.now`, the first row (`first`) is where it stands.
pub fn plan_from(opts: &UpgradeOptions, from: &Observed, first: &str) -> Plan {
    let start = from.now;
    let mut obs = ready_at_once(from);
    let row = |obs: &Observed, action: String| PlanStep {
        t_seconds: obs.now.duration_since(start).as_secs_f64(),
        active_capacity: obs.active.capacity,
        pending_capacity: obs.pending.capacity,
        active_traffic: obs.active.traffic,
        pending_traffic: obs.pending.traffic,
        action,
    };
    let mut steps = vec![row(&obs, first.to_string())];
    let mut peak = obs.active.capacity + obs.pending.capacity;
    let (mut traffic_steps, mut capacity_changes) = (0, 0);
    let mut verified_pending = obs.pending.traffic;
    let mut min_serving = (obs.active.capacity + verified_pending).min(100);
    simulate(opts, &mut obs, |o, action| {
        traffic_steps += usize::from(matches!(action, Action::SetTraffic { .. }));
        capacity_changes += usize::from(matches!(action, Action::SetTargetCapacity { .. }));
        peak = peak.max(o.active.capacity + o.pending.capacity);
        let raised = matches!(action, Action::SetTargetCapacity { role: Role::Pending, percent } if percent > verified_pending);
        if !raised {
            verified_pending = o.pending.capacity;
        }
        min_serving = min_serving.min(o.active.capacity + verified_pending);
        steps.push(row(o, describe(action)));
    });
    Plan {
        min_duration_seconds: obs.now.duration_since(start).as_secs_f64(),
        steps,
        peak_total_capacity: peak,
        traffic_steps,
        capacity_changes,
        min_serving_capacity: min_serving.min(100),
    }
}

/// What is left of an upgrade when its clusters are ready at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Remaining {
    pub duration: SignedDuration,
    pub capacity_changes: u32,
}

/// The rest of the upgrade from `obs` (its pacing from the last traffic step on), every wait for readiness
/// over at once; `None` while paused or when it cannot finish.
pub fn remaining(opts: &UpgradeOptions, obs: &Observed) -> Option<Remaining> {
    if obs.paused {
        return None;
    }
    let start = obs.now;
    let mut rest = ready_at_once(obs);
    let mut capacity_changes = 0;
    let finished = simulate(opts, &mut rest, |_, action| {
        capacity_changes += u32::from(matches!(action, Action::SetTargetCapacity { .. }));
    });
    finished.then(|| Remaining {
        duration: rest.now.duration_since(start),
        capacity_changes,
    })
}

/// When the running upgrade, started at `started`, should end: the planned rest from `obs`, plus, for each
/// capacity change left, the time each capacity change so far took beyond the plan (Serve bringing its
/// replicas up, the gateway taking a route). Going forward only; a rollback gets its planned rest.
pub fn expected_completion(opts: &UpgradeOptions, obs: &Observed, started: Timestamp) -> Option<Timestamp> {
    let left = remaining(opts, obs)?;
    let per_change = match obs.direction {
        Direction::Forward => {
            let whole = remaining(opts, &fresh_start(started))?;
            let done = whole.capacity_changes.saturating_sub(left.capacity_changes);
            let planned = whole.duration - left.duration;
            let late = (obs.now.duration_since(started) - planned).max(SignedDuration::ZERO);
            if done == 0 {
                SignedDuration::ZERO
            } else {
                late / i32::try_from(done).unwrap_or(i32::MAX)
            }
        }
        Direction::Rollback => SignedDuration::ZERO,
    };
    let waits = per_change * i32::try_from(left.capacity_changes).unwrap_or(i32::MAX);
    Some(obs.now + left.duration + waits)
}

/// Human wording of an action (events, plan tables).
pub fn describe(action: Action) -> String {
    match action {
        Action::SetTargetCapacity { role, percent } => format!("scale {} to {percent}%", role.as_str()),
        Action::SetTraffic { active, pending } => format!("route traffic {active}/{pending}"),
        Action::Promote => "promote pending to active".to_string(),
        Action::FinishRollback => "rollback complete".to_string(),
        Action::Wait { reason, .. } => format!("wait: {}", reason.as_str()),
    }
}

pub mod decide;
pub mod resource_aware;
pub mod slo_gate;
pub use decide::{StepDecision, decide};

#[cfg(test)]
mod tests;
