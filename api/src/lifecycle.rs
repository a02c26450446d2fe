//! Which RayCluster is active, which is being prepared, and what to create, update or delete: the pure
//! decisions behind the `None` and `NewCluster` strategies (the incremental strategy adds capacity and
//! traffic steps from [`crate::upgrade`] on top of the same cluster lifecycle).
//!
//! The controller observes, calls [`decide`], and applies the result. Deletion times are part of the
//! observed state (an annotation on the cluster), so they survive a controller restart (KubeRay keeps
//! them in memory, reference 9.14).

use jiff::{SignedDuration, Timestamp};

use crate::{cluster_spec::SpecDigests, rayservice::UpgradeType};
use initializing::Initialization;

/// Annotation holding the time after which an unused cluster is deleted.
pub const DELETE_AFTER_ANNOTATION: &str = "rayshift.io/delete-after";

/// One RayCluster of the RayService, as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterFacts {
    pub name: String,
    /// Digest annotation (`None`: not built by rayshift, or adopted without one).
    pub spec_digest: Option<String>,
    pub scale_digest: Option<String>,
    pub worker_groups: usize,
    pub delete_after: Option<Timestamp>,
    /// Head is up (RayCluster status and the Ray container itself) and every Serve app is RUNNING.
    pub serving_ready: bool,
}

/// Everything [`decide`] looks at.
#[derive(Clone, Debug)]
pub struct Facts {
    pub strategy: UpgradeType,
    pub goal: SpecDigests,
    /// Names recorded in status.
    pub active: Option<String>,
    pub pending: Option<String>,
    /// Every RayCluster labelled as belonging to this RayService.
    pub clusters: Vec<ClusterFacts>,
    pub deletion_delay: SignedDuration,
    pub now: Timestamp,
    /// A fresh cluster name, in case one is needed.
    pub new_name: String,
    /// Incremental mode: promotion and rollback are driven by the upgrade planner, not here.
    pub incremental: bool,
    /// A spec digest that was rolled back (abort, progress deadline): not upgraded to again.
    pub rejected_spec: Option<String>,
    /// Against `ray.io/initializing-timeout` ([`initializing::judge`]).
    pub initialization: Initialization,
}

/// A change to one RayCluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterAction {
    /// Create the cluster from the current spec.
    Create { name: String },
    /// Rebuild the cluster's spec from the current one, in place.
    UpdateSpec { name: String },
    /// Apply min/max replica changes in place (replicas stay with the autoscaler).
    UpdateScale { name: String },
    /// Mark an unused cluster for deletion at `at`.
    ScheduleDeletion { name: String, at: Timestamp },
    /// Delete an unused cluster whose time has come.
    Delete { name: String },
}

/// What to do this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub active: Option<String>,
    pub pending: Option<String>,
    pub actions: Vec<ClusterAction>,
    /// The cluster the head and serve Services should select; `None`: leave them alone.
    pub serve_target: Option<String>,
    /// Clusters that should run the spec's Serve config (never an old cluster mid-upgrade).
    pub config_targets: Vec<String>,
    /// The pending cluster became active this pass.
    pub promoted: Option<String>,
    /// The pending cluster was replaced because the spec changed again.
    pub replaced_pending: Option<String>,
    /// When something is due without any event (a deletion, the initializing timeout).
    pub wake_at: Option<Timestamp>,
    /// Against the initializing timeout, after this pass's promotion: a first cluster that serves in time
    /// does not fail.
    pub initialization: Initialization,
}

impl Decision {
    pub fn upgrading(&self) -> bool {
        self.active.is_some() && self.pending.is_some()
    }
}

impl Facts {
    fn cluster(&self, name: &str) -> Option<&ClusterFacts> {
        self.clusters.iter().find(|c| c.name == name)
    }

    fn matches_goal(&self, c: &ClusterFacts) -> bool {
        c.spec_digest.as_deref() == Some(self.goal.spec.as_str())
    }

    /// The cluster a new pending one should be: one built from the current spec that nothing records and
    /// nothing has scheduled for deletion (created by a pass that ended before it could record it: a killed
    /// controller), else a fresh name. Adopting it keeps one RayCluster per upgrade.
    fn new_pending(&self, d: &Decision) -> String {
        self.clusters
            .iter()
            .filter(|c| Some(&c.name) != d.active.as_ref() && Some(&c.name) != self.pending.as_ref())
            .find(|c| self.matches_goal(c) && c.delete_after.is_none())
            .map_or_else(|| self.new_name.clone(), |c| c.name.clone())
    }

    fn appended_only(&self, c: &ClusterFacts) -> bool {
        c.spec_digest
            .as_deref()
            .is_some_and(|d| self.goal.only_appends_to(d, c.worker_groups))
    }
}

/// Decides one pass of the cluster lifecycle.
pub fn decide(f: &Facts) -> Decision {
    let mut d = Decision {
        active: f.active.clone().filter(|a| f.cluster(a).is_some()),
        pending: f.pending.clone(),
        actions: Vec::new(),
        serve_target: None,
        config_targets: Vec::new(),
        promoted: None,
        replaced_pending: None,
        wake_at: None,
        initialization: f.initialization,
    };
    let first_serves = f
        .pending
        .as_deref()
        .and_then(|p| f.cluster(p))
        .is_some_and(|c| c.serving_ready);
    match f.initialization {
        Initialization::Failed => return let_everything_go(f, d),
        Initialization::TimedOut { .. } if !first_serves => return let_everything_go(f, d),
        Initialization::TimedOut { .. } => d.initialization = Initialization::Unlimited,
        Initialization::Until { deadline } => d.wake_at = Some(deadline),
        Initialization::Unlimited => {}
    }
    choose_clusters(f, &mut d);
    update_pending(f, &mut d);
    promote_and_target(f, &mut d);
    schedule_deletions(f, &mut d);
    d
}

/// A RayService that failed to initialize keeps no cluster: each goes after the deletion delay, as KubeRay
/// 1.6 clears the names and cleans up.
fn let_everything_go(f: &Facts, mut d: Decision) -> Decision {
    d.active = None;
    d.pending = None;
    schedule_deletions(f, &mut d);
    d
}

/// Which cluster is active and which pending, and what the active one needs in place.
fn choose_clusters(f: &Facts, d: &mut Decision) {
    let builds_new_clusters = f.strategy != UpgradeType::None;

    // A pending cluster from an older spec is replaced (the spec changed again mid-upgrade); in
    // incremental mode the upgrade planner rolls back instead.
    if !f.incremental
        && let Some(p) = d.pending.clone().and_then(|p| f.cluster(&p).cloned())
        && !f.matches_goal(&p)
        && !f.appended_only(&p)
    {
        d.replaced_pending = Some(p.name.clone());
        d.pending = Some(f.new_pending(d));
    }
    match (d.active.clone(), d.pending.clone()) {
        (None, None) => d.pending = Some(f.new_pending(d)),
        (Some(a), None) => {
            let c = f.cluster(&a).expect("active exists");
            let rejected = f.rejected_spec.as_deref() == Some(f.goal.spec.as_str());
            if rejected {
                // Rolled back on purpose: stay on the active cluster until the spec changes again.
            } else if !f.matches_goal(c) {
                if f.appended_only(c) || !builds_new_clusters {
                    d.actions.push(ClusterAction::UpdateSpec { name: a.clone() });
                } else {
                    d.pending = Some(f.new_pending(d));
                }
            } else if c.scale_digest.as_deref() != Some(f.goal.scale.as_str()) {
                d.actions.push(ClusterAction::UpdateScale { name: a.clone() });
            }
        }
        _ => {}
    }
}

/// The pending cluster is created, or updated in place where only its worker groups or scale changed.
fn update_pending(f: &Facts, d: &mut Decision) {
    if let Some(p) = d.pending.clone() {
        match f.cluster(&p) {
            None => d.actions.push(ClusterAction::Create { name: p }),
            Some(c) if f.appended_only(c) => d.actions.push(ClusterAction::UpdateSpec { name: p }),
            Some(c) if c.scale_digest.as_deref() != Some(f.goal.scale.as_str()) && f.matches_goal(c) => {
                d.actions.push(ClusterAction::UpdateScale { name: p })
            }
            Some(_) => {}
        }
    }
}

/// Promotion (a pending cluster whose apps all run takes the Services over), and where Services and Serve
/// configs go.
fn promote_and_target(f: &Facts, d: &mut Decision) {
    let pending_ready = d
        .pending
        .as_deref()
        .and_then(|p| f.cluster(p))
        .is_some_and(|c| c.serving_ready);
    // In incremental mode only the first cluster is promoted here; later ones by the upgrade planner.
    if pending_ready && (!f.incremental || d.active.is_none()) {
        d.promoted = d.pending.take();
        d.active = d.promoted.clone();
    }
    d.serve_target = d.active.clone();
    d.config_targets = match (&d.active, &d.pending) {
        // While rolling back, the pending cluster (built from another spec) gets nothing new.
        (_, Some(p)) if f.incremental && f.cluster(p).is_some_and(|c| !f.matches_goal(c)) => Vec::new(),
        (_, Some(p)) => vec![p.clone()],
        // Rolled back on purpose (abort, deadline): the active cluster keeps its own Serve config, not the
        // rejected spec's (whose apps it was never meant to run).
        (Some(a), None)
            if f.rejected_spec.as_deref() == Some(f.goal.spec.as_str())
                && f.cluster(a).is_some_and(|c| !f.matches_goal(c)) =>
        {
            Vec::new()
        }
        (Some(a), None) => vec![a.clone()],
        (None, None) => Vec::new(),
    };
}

/// Everything else is unused: delete it after the delay, never the cluster that serves.
fn schedule_deletions(f: &Facts, d: &mut Decision) {
    for c in &f.clusters {
        if Some(&c.name) == d.active.as_ref() || Some(&c.name) == d.pending.as_ref() {
            continue;
        }
        match c.delete_after {
            None => {
                let at = f.now.checked_add(f.deletion_delay).unwrap_or(f.now);
                d.actions.push(ClusterAction::ScheduleDeletion {
                    name: c.name.clone(),
                    at,
                });
                d.wake_at = earliest(d.wake_at, at);
            }
            Some(at) if at <= f.now => d.actions.push(ClusterAction::Delete { name: c.name.clone() }),
            Some(at) => d.wake_at = earliest(d.wake_at, at),
        }
    }
}

fn earliest(a: Option<Timestamp>, b: Timestamp) -> Option<Timestamp> {
    Some(a.map_or(b, |a| a.min(b)))
}

pub mod initializing;
pub mod status;

#[cfg(test)]
mod tests;
