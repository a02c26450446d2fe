//! RayService conditions with KubeRay's types, reasons and messages, and the "did anything change" test
//! that keeps the controller from writing status on every pass (KubeRay bug 9.1).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::rayservice::RayServiceStatuses;

pub const READY: &str = "Ready";
pub const UPGRADE_IN_PROGRESS: &str = "UpgradeInProgress";
pub const ROLLBACK_IN_PROGRESS: &str = "RollbackInProgress";

/// Reasons (KubeRay's names where KubeRay has one).
pub mod reason {
    pub const INITIALIZING: &str = "Initializing";
    pub const INITIALIZING_TIMEOUT: &str = "InitializingTimeout";
    pub const NON_ZERO_SERVE_ENDPOINTS: &str = "NonZeroServeEndpoints";
    pub const ZERO_SERVE_ENDPOINTS: &str = "ZeroServeEndpoints";
    pub const VALIDATION_FAILED: &str = "ValidationFailed";
    pub const BOTH_CLUSTERS_EXIST: &str = "BothActivePendingClustersExist";
    pub const NO_PENDING_CLUSTER: &str = "NoPendingCluster";
    pub const DASHBOARD_UNREACHABLE: &str = "DashboardUnreachable";
    pub const GATEWAY_API_UNAVAILABLE: &str = "GatewayAPIUnavailable";
}

/// A condition to set: type, status, reason, message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub type_: &'static str,
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

impl Wanted {
    pub fn new(type_: &'static str, on: bool, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: if on { "True" } else { "False" },
            reason,
            message: message.into(),
        }
    }
}

/// Whether a Ready condition says the RayService is still initializing: `Initializing`, or rayshift's own
/// `DashboardUnreachable` before any cluster was active (a first head's dashboard not answering yet).
pub fn says_initializing(ready: &Condition, had_active: bool) -> bool {
    ready.reason == reason::INITIALIZING || (ready.reason == reason::DASHBOARD_UNREACHABLE && !had_active)
}

/// The Ready condition from the number of serve endpoints, as KubeRay words it.
pub fn ready(endpoints: i32, previous: &[Condition], had_active: bool) -> Wanted {
    if endpoints > 0 {
        return Wanted::new(
            READY,
            true,
            reason::NON_ZERO_SERVE_ENDPOINTS,
            "Number of serve endpoints is greater than 0",
        );
    }
    let was_initializing = previous
        .iter()
        .find(|c| c.type_ == READY)
        .is_none_or(|c| says_initializing(c, had_active));
    if was_initializing {
        Wanted::new(READY, false, reason::INITIALIZING, "RayService is initializing")
    } else {
        Wanted::new(
            READY,
            false,
            reason::ZERO_SERVE_ENDPOINTS,
            "Number of serve endpoints dropped to 0",
        )
    }
}

/// The UpgradeInProgress condition from which clusters are named.
pub fn upgrade_in_progress(active: bool, pending: bool) -> Wanted {
    match (active, pending) {
        (true, true) => Wanted::new(
            UPGRADE_IN_PROGRESS,
            true,
            reason::BOTH_CLUSTERS_EXIST,
            "Both active and pending Ray clusters exist",
        ),
        (true, false) => Wanted::new(
            UPGRADE_IN_PROGRESS,
            false,
            reason::NO_PENDING_CLUSTER,
            "Active Ray cluster exists and no pending Ray cluster",
        ),
        (false, _) => Wanted::new(
            UPGRADE_IN_PROGRESS,
            false,
            reason::INITIALIZING,
            "RayService is initializing",
        ),
    }
}

/// Merges wanted conditions into `previous`: transition times move only when the status changes;
/// types listed in `remove` are dropped (KubeRay removes RollbackInProgress rather than setting False).
pub fn merge(
    previous: &[Condition],
    wanted: &[Wanted],
    remove: &[&str],
    generation: i64,
    now: &Time,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = previous
        .iter()
        .filter(|c| !remove.contains(&c.type_.as_str()) && !wanted.iter().any(|w| w.type_ == c.type_))
        .cloned()
        .collect();
    for w in wanted {
        let old = previous.iter().find(|c| c.type_ == w.type_);
        let transition = match old {
            Some(o) if o.status == w.status => o.last_transition_time.clone(),
            _ => now.clone(),
        };
        out.push(Condition {
            type_: w.type_.to_string(),
            status: w.status.to_string(),
            reason: w.reason.to_string(),
            message: w.message.clone(),
            observed_generation: Some(generation),
            last_transition_time: transition,
        });
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

/// Whether `new` differs from `old` in anything worth a status write. Like KubeRay (1.5 to 1.7), a
/// cluster's copied `.status` alone is not: it is for display, and a RayService write costs the
/// apiserver as much as the whole object. The next write carries the copy as it is then.
pub fn status_changed(old: Option<&RayServiceStatuses>, new: &RayServiceStatuses) -> bool {
    let strip = |s: &RayServiceStatuses| {
        let mut s = s.clone();
        s.last_update_time = None;
        for c in s.conditions.iter_mut().flatten() {
            c.last_transition_time = Time(jiff::Timestamp::UNIX_EPOCH);
        }
        let sides = [&mut s.active_service_status, &mut s.pending_service_status];
        for side in sides.into_iter().flatten() {
            side.ray_cluster_status = None;
            // No answer yet and an answer of no apps read alike, as KubeRay's length check does.
            side.application_statuses.take_if(|apps| apps.is_empty());
        }
        s
    };
    old.map(strip) != Some(strip(new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rayservice::{AppStatus, ClusterServiceStatus};
    use serde_json::{Value, json};
    use std::collections::BTreeMap;

    fn t(s: i64) -> Time {
        Time(jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn ready_follows_endpoints_with_kuberay_reasons() {
        assert_eq!(ready(0, &[], true).reason, reason::INITIALIZING);
        assert_eq!(ready(2, &[], true).status, "True");
        let was_ready = merge(&[], &[ready(2, &[], true)], &[], 1, &t(1));
        assert_eq!(ready(0, &was_ready, true).reason, reason::ZERO_SERVE_ENDPOINTS);
        // A first head whose dashboard did not answer yet: still initializing, not "dropped to 0".
        let unreachable = [Wanted::new(
            READY,
            false,
            reason::DASHBOARD_UNREACHABLE,
            "refused",
        )];
        let unreachable = merge(&[], &unreachable, &[], 1, &t(1));
        assert_eq!(ready(0, &unreachable, false).reason, reason::INITIALIZING);
        assert_eq!(ready(0, &unreachable, true).reason, reason::ZERO_SERVE_ENDPOINTS);
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let first = merge(&[], &[ready(1, &[], true)], &[], 1, &t(10));
        let same = merge(&first, &[ready(3, &first, true)], &[], 2, &t(20));
        assert_eq!(same[0].last_transition_time, t(10));
        assert_eq!(same[0].observed_generation, Some(2));
        let flipped = merge(&same, &[ready(0, &same, true)], &[], 2, &t(30));
        assert_eq!(flipped[0].last_transition_time, t(30));
    }

    #[test]
    fn removed_types_disappear() {
        let with = merge(
            &[],
            &[Wanted::new(
                ROLLBACK_IN_PROGRESS,
                true,
                "DesiredClusterSpecChanged",
                "x",
            )],
            &[],
            1,
            &t(1),
        );
        assert!(merge(&with, &[], &[ROLLBACK_IN_PROGRESS], 1, &t(2)).is_empty());
    }

    #[test]
    fn bookkeeping_timestamps_are_not_changes() {
        let a = RayServiceStatuses {
            conditions: Some(merge(&[], &[ready(1, &[], true)], &[], 1, &t(1))),
            last_update_time: Some(t(1)),
            ..Default::default()
        };
        let mut b = a.clone();
        b.last_update_time = Some(t(99));
        b.conditions.as_mut().unwrap()[0].last_transition_time = t(99);
        assert!(!status_changed(Some(&a), &b));
        b.num_serve_endpoints = Some(3);
        assert!(status_changed(Some(&a), &b));
        assert!(status_changed(None, &b));
    }

    #[test]
    fn a_clusters_copied_status_alone_is_not_a_change() {
        let side = |apps: Option<BTreeMap<String, AppStatus>>, cluster: Option<Value>| ClusterServiceStatus {
            ray_cluster_name: Some("llm-a".into()),
            application_statuses: apps,
            ray_cluster_status: cluster,
            ..Default::default()
        };
        let with = |pending| RayServiceStatuses {
            pending_service_status: Some(pending),
            ..Default::default()
        };
        let a = with(side(None, None));
        let copied = with(side(Some(BTreeMap::new()), Some(json!({"state": "ready"}))));
        assert!(!status_changed(Some(&a), &copied));
        let running = AppStatus {
            status: Some("RUNNING".into()),
            ..Default::default()
        };
        let apps = BTreeMap::from([("llm".to_string(), running)]);
        assert!(status_changed(Some(&copied), &with(side(Some(apps), None))));
        let mut renamed = side(None, None);
        renamed.ray_cluster_name = Some("llm-b".into());
        assert!(status_changed(Some(&a), &with(renamed)));
        // The active side counts alike.
        let active = RayServiceStatuses {
            active_service_status: Some(side(None, Some(json!({"state": "ready"})))),
            ..Default::default()
        };
        let mut active_changed = active.clone();
        active_changed
            .active_service_status
            .as_mut()
            .unwrap()
            .ray_cluster_status = None;
        assert!(!status_changed(Some(&active), &active_changed));
        active_changed.active_service_status = None;
        assert!(status_changed(Some(&active), &active_changed));
    }
}
