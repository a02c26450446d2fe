use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

use super::*;
use crate::lifecycle::initializing::Initialization;

fn goal(tag: &str) -> SpecDigests {
    SpecDigests {
        spec: format!("spec-{tag}"),
        scale: format!("scale-{tag}"),
        prefixes: vec![format!("p0-{tag}"), format!("spec-{tag}")],
    }
}

fn cluster(name: &str, tag: &str, ready: bool) -> ClusterFacts {
    ClusterFacts {
        name: name.into(),
        spec_digest: Some(format!("spec-{tag}")),
        scale_digest: Some(format!("scale-{tag}")),
        worker_groups: 1,
        delete_after: None,
        serving_ready: ready,
    }
}

fn facts(
    strategy: UpgradeType,
    tag: &str,
    active: Option<&str>,
    pending: Option<&str>,
    clusters: Vec<ClusterFacts>,
) -> Facts {
    Facts {
        strategy,
        goal: goal(tag),
        active: active.map(Into::into),
        pending: pending.map(Into::into),
        clusters,
        deletion_delay: SignedDuration::from_secs(60),
        now: Timestamp::from_second(1_000).unwrap(),
        new_name: "rs-new".into(),
        incremental: false,
        rejected_spec: None,
        initialization: Initialization::Unlimited,
    }
}

#[test]
fn first_deployment_creates_a_pending_cluster_then_promotes_it() {
    let d = decide(&facts(UpgradeType::NewCluster, "a", None, None, vec![]));
    assert_eq!(d.pending.as_deref(), Some("rs-new"));
    assert_eq!(
        d.actions,
        vec![ClusterAction::Create {
            name: "rs-new".into()
        }]
    );
    assert_eq!(d.serve_target, None, "nothing to serve yet");
    assert_eq!(d.config_targets, vec!["rs-new".to_string()]);

    let not_ready = decide(&facts(
        UpgradeType::NewCluster,
        "a",
        None,
        Some("rs-1"),
        vec![cluster("rs-1", "a", false)],
    ));
    assert!(not_ready.actions.is_empty());
    assert_eq!(not_ready.pending.as_deref(), Some("rs-1"));

    let ready = decide(&facts(
        UpgradeType::NewCluster,
        "a",
        None,
        Some("rs-1"),
        vec![cluster("rs-1", "a", true)],
    ));
    assert_eq!(ready.promoted.as_deref(), Some("rs-1"));
    assert_eq!(ready.active.as_deref(), Some("rs-1"));
    assert_eq!(ready.serve_target.as_deref(), Some("rs-1"));
}

#[test]
fn a_cluster_created_but_never_recorded_is_adopted_not_duplicated() {
    // A controller killed between creating the pending cluster and writing status: the next pass finds a
    // cluster built from the current spec that nothing records, and makes it the pending cluster.
    let f = facts(
        UpgradeType::NewCluster,
        "b",
        Some("rs-1"),
        None,
        vec![cluster("rs-1", "a", true), cluster("rs-2", "b", false)],
    );
    let d = decide(&f);
    assert_eq!(d.pending.as_deref(), Some("rs-2"));
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, ClusterAction::Create { .. })),
        "{:?}",
        d.actions
    );
    // One scheduled for deletion (left by a rollback) is not taken back; neither is one of another spec.
    let mut dropped = cluster("rs-2", "b", false);
    dropped.delete_after = Some(Timestamp::from_second(2_000).unwrap());
    let f = facts(
        UpgradeType::NewCluster,
        "b",
        Some("rs-1"),
        None,
        vec![cluster("rs-1", "a", true), dropped, cluster("rs-3", "c", false)],
    );
    assert_eq!(decide(&f).pending.as_deref(), Some("rs-new"));
}

#[test]
fn steady_state_does_nothing() {
    let d = decide(&facts(
        UpgradeType::NewCluster,
        "a",
        Some("rs-1"),
        None,
        vec![cluster("rs-1", "a", true)],
    ));
    assert!(d.actions.is_empty());
    assert_eq!(d.wake_at, None);
    assert!(!d.upgrading());
}

#[test]
fn new_cluster_upgrade_keeps_traffic_on_active_until_pending_is_ready() {
    let f = facts(
        UpgradeType::NewCluster,
        "b",
        Some("rs-1"),
        None,
        vec![cluster("rs-1", "a", true)],
    );
    let d = decide(&f);
    assert_eq!(d.pending.as_deref(), Some("rs-new"));
    assert_eq!(
        d.actions,
        vec![ClusterAction::Create {
            name: "rs-new".into()
        }]
    );
    assert_eq!(d.serve_target.as_deref(), Some("rs-1"));
    assert_eq!(
        d.config_targets,
        vec!["rs-new".to_string()],
        "the new config never goes to the old cluster"
    );

    let waiting = facts(
        UpgradeType::NewCluster,
        "b",
        Some("rs-1"),
        Some("rs-2"),
        vec![cluster("rs-1", "a", true), cluster("rs-2", "b", false)],
    );
    let d = decide(&waiting);
    assert_eq!(d.serve_target.as_deref(), Some("rs-1"));
    assert!(d.upgrading());

    let ready = facts(
        UpgradeType::NewCluster,
        "b",
        Some("rs-1"),
        Some("rs-2"),
        vec![cluster("rs-1", "a", true), cluster("rs-2", "b", true)],
    );
    let d = decide(&ready);
    assert_eq!(d.promoted.as_deref(), Some("rs-2"));
    assert_eq!(d.serve_target.as_deref(), Some("rs-2"));
    let at = Timestamp::from_second(1_060).unwrap();
    assert_eq!(
        d.actions,
        vec![ClusterAction::ScheduleDeletion {
            name: "rs-1".into(),
            at
        }]
    );
    assert_eq!(d.wake_at, Some(at));
}

#[test]
fn old_cluster_is_deleted_only_after_the_delay() {
    let mut old = cluster("rs-1", "a", true);
    old.delete_after = Some(Timestamp::from_second(1_030).unwrap());
    let f = facts(
        UpgradeType::NewCluster,
        "b",
        Some("rs-2"),
        None,
        vec![old.clone(), cluster("rs-2", "b", true)],
    );
    let d = decide(&f);
    assert!(d.actions.is_empty());
    assert_eq!(d.wake_at, old.delete_after);
    old.delete_after = Some(Timestamp::from_second(1_000).unwrap());
    let d = decide(&facts(
        UpgradeType::NewCluster,
        "b",
        Some("rs-2"),
        None,
        vec![old, cluster("rs-2", "b", true)],
    ));
    assert_eq!(d.actions, vec![ClusterAction::Delete { name: "rs-1".into() }]);
}

#[test]
fn none_strategy_updates_in_place() {
    let d = decide(&facts(
        UpgradeType::None,
        "b",
        Some("rs-1"),
        None,
        vec![cluster("rs-1", "a", true)],
    ));
    assert_eq!(d.actions, vec![ClusterAction::UpdateSpec { name: "rs-1".into() }]);
    assert_eq!(d.pending, None);
    assert_eq!(d.config_targets, vec!["rs-1".to_string()]);
}

#[test]
fn scale_only_changes_are_applied_in_place() {
    let mut c = cluster("rs-1", "a", true);
    c.scale_digest = Some("scale-old".into());
    let d = decide(&facts(UpgradeType::NewCluster, "a", Some("rs-1"), None, vec![c]));
    assert_eq!(
        d.actions,
        vec![ClusterAction::UpdateScale { name: "rs-1".into() }]
    );
}

#[test]
fn appended_worker_groups_update_in_place() {
    let mut g = goal("b");
    g.prefixes = vec!["p0".into(), "spec-a".into(), "spec-b".into()];
    let mut f = facts(
        UpgradeType::NewCluster,
        "b",
        Some("rs-1"),
        None,
        vec![cluster("rs-1", "a", true)],
    );
    f.goal = g;
    let d = decide(&f);
    assert_eq!(d.actions, vec![ClusterAction::UpdateSpec { name: "rs-1".into() }]);
}

#[test]
fn a_spec_change_mid_upgrade_replaces_the_pending_cluster() {
    let f = facts(
        UpgradeType::NewCluster,
        "c",
        Some("rs-1"),
        Some("rs-2"),
        vec![cluster("rs-1", "a", true), cluster("rs-2", "b", false)],
    );
    let d = decide(&f);
    assert_eq!(d.replaced_pending.as_deref(), Some("rs-2"));
    assert_eq!(d.pending.as_deref(), Some("rs-new"));
    assert!(d.actions.contains(&ClusterAction::Create {
        name: "rs-new".into()
    }));
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, ClusterAction::ScheduleDeletion { name, .. } if name == "rs-2"))
    );
    assert_eq!(d.serve_target.as_deref(), Some("rs-1"));
}

#[test]
fn a_vanished_active_cluster_is_recreated() {
    let d = decide(&facts(
        UpgradeType::NewCluster,
        "a",
        Some("rs-gone"),
        None,
        vec![],
    ));
    assert_eq!(d.active, None);
    assert_eq!(d.pending.as_deref(), Some("rs-new"));
}

proptest! {
    /// Random spec changes, readiness flips and clock moves: the serving cluster is never scheduled for
    /// deletion, traffic only moves to a ready cluster, and there is at most one pending cluster.
    #[test]
    fn lifecycle_invariants(steps in prop::collection::vec((0u8..3, any::<bool>(), 0i64..90), 1..40)) {
        let mut active: Option<String> = None;
        let mut pending: Option<String> = None;
        let mut clusters: Vec<ClusterFacts> = Vec::new();
        let mut now = Timestamp::from_second(0).unwrap();
        for (i, (tag, ready, advance)) in steps.into_iter().enumerate() {
            now = now.checked_add(SignedDuration::from_secs(advance)).unwrap();
            for c in clusters.iter_mut() {
                if Some(&c.name) == pending.as_ref() { c.serving_ready = ready; }
            }
            let f = Facts {
                strategy: UpgradeType::NewCluster, goal: goal(&tag.to_string()), active: active.clone(),
                pending: pending.clone(), clusters: clusters.clone(), deletion_delay: SignedDuration::from_secs(60),
                now, new_name: format!("rs-{i}"), incremental: false, rejected_spec: None,
                initialization: Initialization::Unlimited,
            };
            let d = decide(&f);
            if let Some(target) = &d.serve_target {
                let c = clusters.iter().find(|c| &c.name == target);
                prop_assert!(c.is_some_and(|c| c.serving_ready || Some(target) == active.as_ref()), "traffic to an unready cluster");
            }
            for a in &d.actions {
                if let ClusterAction::Delete { name } | ClusterAction::ScheduleDeletion { name, .. } = a {
                    prop_assert!(Some(name) != d.serve_target.as_ref() && Some(name) != d.pending.as_ref());
                }
            }
            // Apply, as the controller would.
            for a in &d.actions {
                match a {
                    ClusterAction::Create { name } => clusters.push(ClusterFacts {
                        name: name.clone(), spec_digest: Some(f.goal.spec.clone()), scale_digest: Some(f.goal.scale.clone()),
                        worker_groups: 1, delete_after: None, serving_ready: false }),
                    ClusterAction::ScheduleDeletion { name, at } => {
                        if let Some(c) = clusters.iter_mut().find(|c| &c.name == name) { c.delete_after = Some(*at); }
                    }
                    ClusterAction::Delete { name } => clusters.retain(|c| &c.name != name),
                    ClusterAction::UpdateSpec { name } | ClusterAction::UpdateScale { name } => {
                        if let Some(c) = clusters.iter_mut().find(|c| &c.name == name) {
                            c.spec_digest = Some(f.goal.spec.clone()); c.scale_digest = Some(f.goal.scale.clone());
                        }
                    }
                }
            }
            active = d.active.clone();
            pending = d.pending.clone();
            prop_assert!(active.is_none() || active != pending);
        }
    }
}

#[test]
fn incremental_mode_leaves_promotion_and_rollback_to_the_planner() {
    let mut f = facts(
        UpgradeType::NewClusterWithIncrementalUpgrade,
        "b",
        Some("rs-1"),
        Some("rs-2"),
        vec![cluster("rs-1", "a", true), cluster("rs-2", "b", true)],
    );
    f.incremental = true;
    let d = decide(&f);
    assert_eq!(d.promoted, None, "a ready pending cluster is not promoted here");
    assert_eq!(d.serve_target.as_deref(), Some("rs-1"));
    assert_eq!(d.config_targets, vec!["rs-2".to_string()]);
    // The spec went back to rs-1's: no replacement, no new config for rs-2.
    f.goal = goal("a");
    let d = decide(&f);
    assert_eq!(d.pending.as_deref(), Some("rs-2"));
    assert!(d.config_targets.is_empty());
    assert!(d.actions.is_empty());
    // The first cluster is still promoted when ready.
    let mut first = facts(
        UpgradeType::NewClusterWithIncrementalUpgrade,
        "a",
        None,
        Some("rs-1"),
        vec![cluster("rs-1", "a", true)],
    );
    first.incremental = true;
    assert_eq!(decide(&first).promoted.as_deref(), Some("rs-1"));
}

#[test]
fn a_rejected_spec_is_not_upgraded_to_again() {
    let mut f = facts(
        UpgradeType::NewClusterWithIncrementalUpgrade,
        "b",
        Some("rs-1"),
        None,
        vec![cluster("rs-1", "a", true)],
    );
    f.incremental = true;
    f.rejected_spec = Some("spec-b".into());
    let d = decide(&f);
    assert_eq!(d.pending, None);
    assert!(d.actions.is_empty());
    // The real-Ray test found it: after an abort the active cluster was given the rejected spec's Serve
    // config and answered with the aborted version.
    assert!(d.config_targets.is_empty(), "{:?}", d.config_targets);
    // A new spec, or the active cluster's own, is served as usual.
    f.rejected_spec = Some("spec-c".into());
    assert!(!decide(&f).config_targets.is_empty());
    f.rejected_spec = Some("spec-b".into());
    f.goal = goal("a");
    assert_eq!(decide(&f).config_targets, vec!["rs-1".to_string()]);
}

#[test]
fn a_timed_out_initialization_lets_every_cluster_go_and_creates_none() {
    let timed_out = Initialization::TimedOut {
        timeout: SignedDuration::from_secs(30),
        spent: SignedDuration::from_secs(31),
    };
    let mut f = facts(
        UpgradeType::NewCluster,
        "a",
        None,
        Some("rs-1"),
        vec![cluster("rs-1", "a", false)],
    );
    f.initialization = timed_out;
    let d = decide(&f);
    assert_eq!((d.active.as_deref(), d.pending.as_deref()), (None, None));
    assert_eq!(
        d.actions,
        vec![ClusterAction::ScheduleDeletion {
            name: "rs-1".into(),
            at: Timestamp::from_second(1_060).unwrap()
        }]
    );
    assert_eq!((d.serve_target.as_deref(), d.config_targets.len()), (None, 0));
    assert_eq!(d.initialization, timed_out);

    // Failed before: a new spec creates nothing; the cluster goes when its time comes.
    let mut later = facts(
        UpgradeType::NewCluster,
        "b",
        None,
        None,
        vec![cluster("rs-1", "a", false)],
    );
    later.clusters[0].delete_after = Some(later.now);
    later.initialization = Initialization::Failed;
    let d = decide(&later);
    assert_eq!(d.actions, vec![ClusterAction::Delete { name: "rs-1".into() }]);
    assert_eq!(d.pending, None);
}

#[test]
fn a_first_cluster_serving_at_the_deadline_is_promoted_not_failed() {
    let mut f = facts(
        UpgradeType::NewCluster,
        "a",
        None,
        Some("rs-1"),
        vec![cluster("rs-1", "a", true)],
    );
    f.initialization = Initialization::TimedOut {
        timeout: SignedDuration::from_secs(30),
        spent: SignedDuration::from_secs(30),
    };
    let d = decide(&f);
    assert_eq!(d.promoted.as_deref(), Some("rs-1"));
    assert_eq!(d.initialization, Initialization::Unlimited);

    // Before the deadline the pass wakes at it, even with nothing else due.
    let deadline = Timestamp::from_second(1_020).unwrap();
    f.clusters[0].serving_ready = false;
    f.initialization = Initialization::Until { deadline };
    assert_eq!(decide(&f).wake_at, Some(deadline));
}
