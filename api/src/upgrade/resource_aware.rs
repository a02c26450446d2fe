//! ResourceAware pacing (issue 18): an incremental upgrade on a cluster without room for a surge. The active
//! cluster gives up capacity first, at most `maxUnavailablePercent` below the traffic it carries (Serve drains
//! the replicas it removes, so their requests finish); the pending cluster is raised by what was freed, takes
//! traffic as its capacity is verified, and the cycle repeats. KServe's ResourceAware strategy does this for
//! Deployments; no Ray operator does.
//!
//! Invariants (property-tested): the pending cluster never carries more traffic than its verified capacity;
//! the active cluster's capacity is at most `maxUnavailablePercent` below its traffic, so the serving capacity
//! (active capacity + the pending capacity traffic was moved onto) never falls below 100 − maxUnavailablePercent;
//! a cluster carrying traffic keeps at least 1 %; both together never exceed 100 + the spare capacity; and
//! with any spare capacity the upgrade finishes. Without any, the last replica of the active cluster has
//! nowhere to go: a cluster needs one full copy plus one step's workers (issue 18's acceptance).

use super::{Action, Direction, Observed, Role, UpgradeOptions, WaitReason, lower, traffic_step, wait};

/// How far a ResourceAware upgrade may dip, and how much room the cluster has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResourceAware {
    /// Serving capacity may fall this many percent below 100 (1..=100).
    pub max_unavailable_percent: i32,
    /// Capacity the cluster can hold beyond one full copy, in percent of it: the most the two clusters'
    /// capacities may add up to above 100. Live, what the upgrade had verified beyond 100 when it stalled.
    pub spare_percent: i32,
}

impl ResourceAware {
    /// What a running upgrade assumes: the room beyond one full copy is one step's workers, what a cluster
    /// needs to finish (the controller cannot see free GPUs ahead of scheduling). `rayshift plan` assumes the
    /// same unless told the spare room.
    pub fn live(max_unavailable_percent: i32, opts: &UpgradeOptions) -> Self {
        ResourceAware {
            max_unavailable_percent,
            spare_percent: opts.step_size_percent,
        }
    }

    /// The lowest capacity a cluster carrying `traffic` may have.
    fn floor(self, traffic: i32) -> i32 {
        let least = i32::from(traffic > 0);
        (traffic - self.max_unavailable_percent).max(least)
    }
}

/// The next action going forward; a rollback is the same walk with the clusters' roles swapped.
pub(super) fn next(opts: &UpgradeOptions, ra: ResourceAware, obs: &Observed) -> Action {
    match obs.direction {
        Direction::Forward => forward(opts, ra, obs),
        Direction::Rollback => back(forward(opts, ra, &swapped(obs))),
    }
}

fn forward(opts: &UpgradeOptions, ra: ResourceAware, obs: &Observed) -> Action {
    let (a, p) = (obs.active, obs.pending);
    if p.traffic == 100 && a.capacity == 0 {
        return Action::Promote;
    }
    // Capacity is lowered only once the data plane has the weights that took traffic off it.
    if !obs.route_ready {
        return wait(WaitReason::RouteNotReady);
    }
    let bound = 100 + ra.spare_percent;
    // More than the cluster holds (a surge that stalled): the active cluster gives way first, within the dip,
    // then the pending raise shrinks to what fits.
    if a.capacity + p.capacity > bound {
        let active = ra.floor(a.traffic).max(bound - p.capacity);
        if active < a.capacity {
            return lower(opts, obs, Role::Active, active);
        }
        return Action::SetTargetCapacity {
            role: Role::Pending,
            percent: (bound - a.capacity).max(p.traffic),
        };
    }
    // Traffic follows the pending cluster's verified capacity, step by step. A raise the scheduler cannot place
    // first gets what the active cluster can still give.
    if p.traffic < p.capacity {
        let floor = ra.floor(a.traffic);
        if obs.pending_stalled && !obs.pending_capacity_ready && floor < a.capacity {
            return lower(opts, obs, Role::Active, floor);
        }
        return traffic_step(opts, obs);
    }
    // Caught up. The active cluster gives way first, down to its floor (0 once it carries nothing): what it
    // frees is what a full cluster has to give ... but only to a pending cluster that can take it: one whose
    // head does not answer yet would leave the dip standing for nothing.
    let floor = ra.floor(a.traffic);
    if floor < a.capacity && !obs.pending_reachable {
        return wait(WaitReason::PendingCapacityNotReady);
    }
    if floor < a.capacity {
        return lower(opts, obs, Role::Active, floor);
    }
    // ... then the room goes to the pending cluster, a surge at a time.
    let room = bound - a.capacity - p.capacity;
    if room > 0 && p.capacity < 100 {
        let percent = (p.capacity + room.min(opts.max_surge_percent)).min(100);
        return Action::SetTargetCapacity {
            role: Role::Pending,
            percent,
        };
    }
    // A cluster without spare room: the active cluster's last 1 % has nowhere to go.
    wait(WaitReason::NoRoom)
}

/// The rollback seen as an upgrade onto the active cluster.
fn swapped(obs: &Observed) -> Observed {
    Observed {
        active: obs.pending,
        pending: obs.active,
        pending_capacity_ready: obs.active_capacity_ready,
        active_capacity_ready: obs.pending_capacity_ready,
        pending_capacity_found: obs.active_capacity_found,
        active_capacity_found: obs.pending_capacity_found,
        // The cluster rolled back onto is the active one, which serves.
        pending_reachable: true,
        pending_stalled: false,
        // A rollback is never held by a promote's hurry.
        hurry: false,
        ..*obs
    }
}

/// An action of the swapped walk, for the real roles.
fn back(action: Action) -> Action {
    let other = |role| match role {
        Role::Active => Role::Pending,
        Role::Pending => Role::Active,
    };
    match action {
        Action::SetTargetCapacity { role, percent } => Action::SetTargetCapacity {
            role: other(role),
            percent,
        },
        Action::SetTraffic { active, pending } => Action::SetTraffic {
            active: pending,
            pending: active,
        },
        Action::Promote => Action::FinishRollback,
        Action::Wait {
            until,
            reason: WaitReason::PendingCapacityNotReady,
        } => Action::Wait {
            until,
            reason: WaitReason::ActiveCapacityNotReady,
        },
        other => other,
    }
}
