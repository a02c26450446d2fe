//! The RayService status a pass leaves, from the lifecycle [`Decision`] and what was observed: KubeRay's
//! fields (conditions Ready and UpgradeInProgress, serve endpoints, per-cluster app statuses) and the start
//! or end of an upgrade in rayshift's typed progress. Pure; the incremental upgrade's own fields come after
//! it, from [`crate::upgrade::decide`].

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use super::{ClusterAction, Decision, initializing::Initialization};
use crate::{
    conditions::{self, Wanted, reason},
    progress::UpgradeProgress,
    rayservice::{AppStatus, ClusterServiceStatus, RayServiceStatuses},
    upgrade::decide::{Tally, UpgradeResult},
};

/// One cluster as the status shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    pub head_ready: bool,
    /// Serve's applications, when its dashboard answered this pass.
    pub apps: Option<BTreeMap<String, AppStatus>>,
    /// The RayCluster's own status, copied as KubeRay does.
    pub cluster_status: Option<Value>,
}

/// What the status is built from.
#[derive(Clone, Debug)]
pub struct StatusInputs<'a> {
    pub generation: i64,
    pub previous: &'a RayServiceStatuses,
    pub decision: &'a Decision,
    pub clusters: &'a BTreeMap<String, ClusterView>,
    /// Ready Pods behind the serve Service.
    pub endpoints: i32,
    /// A dashboard that failed this pass, in words.
    pub dashboard_problem: Option<&'a str>,
    /// An active cluster was recorded before this pass (a new cluster beside it is an upgrade).
    pub had_active: bool,
    pub incremental: bool,
    pub now: Timestamp,
}

/// The status, and the upgrades it started or (blue/green) completed, for the metrics.
pub fn settle(i: &StatusInputs<'_>) -> (RayServiceStatuses, Vec<Tally>) {
    let mut status = kuberay_fields(i);
    let mut tallies = Vec::new();
    let started = i.decision.active.is_some()
        && i.decision
            .actions
            .iter()
            .any(|a| matches!(a, ClusterAction::Create { .. }));
    if started {
        tallies.push(Tally::Started);
        status.progress.upgrade_start_time = Some(i.now);
    }
    // Blue/green completes at promotion; an incremental upgrade completes in its own decision.
    if !i.incremental && i.decision.promoted.is_some() && i.had_active {
        tallies.push(Tally::Finished {
            result: UpgradeResult::Completed,
            seconds: status.progress.duration(i.now),
        });
        status.progress = UpgradeProgress::default();
    }
    (status, tallies)
}

fn kuberay_fields(i: &StatusInputs<'_>) -> RayServiceStatuses {
    let prev_conditions = i.previous.conditions.as_deref().unwrap_or_default();
    let d = i.decision;
    let ready = match d.initialization {
        Initialization::TimedOut { timeout, spent } => Wanted::new(
            conditions::READY,
            false,
            reason::INITIALIZING_TIMEOUT,
            Initialization::message(timeout, spent),
        ),
        // Failed before: the condition stays as it was written then.
        Initialization::Failed => {
            let message = prev_conditions.iter().find(|c| c.type_ == conditions::READY);
            let message = message.map(|c| c.message.clone()).unwrap_or_default();
            Wanted::new(conditions::READY, false, reason::INITIALIZING_TIMEOUT, message)
        }
        _ => match (i.dashboard_problem, i.endpoints > 0) {
            (Some(problem), false) => {
                Wanted::new(conditions::READY, false, reason::DASHBOARD_UNREACHABLE, problem)
            }
            _ => conditions::ready(i.endpoints, prev_conditions, i.had_active),
        },
    };
    let wanted = [
        ready,
        conditions::upgrade_in_progress(d.active.is_some(), d.pending.is_some()),
    ];
    let mut status = i.previous.clone();
    status.conditions = Some(conditions::merge(
        prev_conditions,
        &wanted,
        &[],
        i.generation,
        &Time(i.now),
    ));
    status.observed_generation = Some(i.generation);
    status.num_serve_endpoints = Some(i.endpoints);
    status.service_status = Some(if i.endpoints > 0 {
        "Running".into()
    } else {
        String::new()
    });
    let prev_active = i.previous.active_service_status.as_ref();
    let prev_pending = i.previous.pending_service_status.as_ref();
    // A promoted cluster carries its pending-side fields over to the active side.
    let active_prev = if d.promoted.is_some() {
        prev_pending
    } else {
        prev_active
    };
    status.active_service_status = side(&d.active, i.clusters, active_prev);
    status.pending_service_status = side(&d.pending, i.clusters, prev_pending);
    status
}

fn side(
    name: &Option<String>,
    clusters: &BTreeMap<String, ClusterView>,
    previous: Option<&ClusterServiceStatus>,
) -> Option<ClusterServiceStatus> {
    let name = name.as_ref()?;
    let view = clusters.get(name);
    // Keep what is not computed here (capacity, traffic: incremental mode) if it is the same cluster.
    let mut out = previous
        .filter(|p| p.ray_cluster_name.as_ref() == Some(name))
        .cloned()
        .unwrap_or_default();
    out.ray_cluster_name = Some(name.clone());
    out.application_statuses = view
        .and_then(|v| v.apps.clone())
        .or(out.application_statuses)
        .filter(|_| view.is_some_and(|v| v.head_ready));
    out.ray_cluster_status = view.and_then(|v| v.cluster_status.clone());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(active: &str, pending: Option<&str>) -> Decision {
        Decision {
            active: Some(active.into()),
            pending: pending.map(Into::into),
            actions: Vec::new(),
            serve_target: Some(active.into()),
            config_targets: Vec::new(),
            promoted: None,
            replaced_pending: None,
            wake_at: None,
            initialization: Initialization::Unlimited,
        }
    }

    fn inputs<'a>(
        previous: &'a RayServiceStatuses,
        decision: &'a Decision,
        clusters: &'a BTreeMap<String, ClusterView>,
    ) -> StatusInputs<'a> {
        StatusInputs {
            generation: 2,
            previous,
            decision,
            clusters,
            endpoints: 1,
            dashboard_problem: None,
            had_active: true,
            incremental: false,
            now: "2026-11-24T10:00:00Z".parse().unwrap(),
        }
    }

    #[test]
    fn a_new_cluster_beside_the_active_one_starts_an_upgrade_and_promotion_completes_it() {
        let previous = RayServiceStatuses::default();
        let clusters = BTreeMap::from([(
            "a".to_string(),
            ClusterView {
                head_ready: true,
                apps: Some(BTreeMap::from([("app".into(), AppStatus::default())])),
                cluster_status: None,
            },
        )]);
        let mut d = decision("a", Some("b"));
        d.actions.push(ClusterAction::Create { name: "b".into() });
        let (status, tallies) = settle(&inputs(&previous, &d, &clusters));
        assert_eq!(tallies, vec![Tally::Started]);
        assert!(status.progress.upgrade_start_time.is_some());
        let active = status.active_service_status.as_ref().unwrap();
        assert!(active.application_statuses.as_ref().unwrap().contains_key("app"));
        assert_eq!(status.pending_service_status.unwrap().application_statuses, None);
        let ready = status
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.observed_generation),
            ("True", Some(2))
        );

        let mut promoted = decision("b", None);
        promoted.promoted = Some("b".into());
        let (status, tallies) = settle(&inputs(&status_with_start(), &promoted, &clusters));
        assert!(
            matches!(tallies[..], [Tally::Finished { result: UpgradeResult::Completed, seconds: Some(s) }] if s == 60.0)
        );
        assert_eq!(status.progress, UpgradeProgress::default());
    }

    fn status_with_start() -> RayServiceStatuses {
        let mut s = RayServiceStatuses::default();
        s.progress.upgrade_start_time = Some("2026-11-24T09:59:00Z".parse().unwrap());
        s
    }

    fn ready_of(status: &RayServiceStatuses) -> (String, String, String) {
        let c = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    /// KubeRay 1.6's Ready condition for a RayService past its initializing timeout, kept in later passes (with
    /// no cluster named, no dashboard answers: the reason must not turn into another).
    #[test]
    fn a_timed_out_initialization_is_the_ready_reason_for_good() {
        let previous = RayServiceStatuses::default();
        let clusters = BTreeMap::new();
        let mut d = decision("a", None);
        (d.active, d.serve_target) = (None, None);
        d.initialization = Initialization::TimedOut {
            timeout: jiff::SignedDuration::from_secs(30),
            spent: jiff::SignedDuration::from_millis(31_250),
        };
        let mut i = inputs(&previous, &d, &clusters);
        (i.endpoints, i.had_active) = (0, false);
        let (failed, _) = settle(&i);
        let message = "RayService failed to become ready within the configured timeout of 30s. Time spent \
                       initializing: 31.25s";
        let want = (
            "False".to_string(),
            "InitializingTimeout".to_string(),
            message.to_string(),
        );
        assert_eq!(ready_of(&failed), want);
        assert_eq!(failed.active_service_status, None);

        d.initialization = Initialization::Failed;
        let mut later = inputs(&failed, &d, &clusters);
        (later.endpoints, later.had_active) = (0, false);
        later.dashboard_problem = Some("connection refused");
        assert_eq!(ready_of(&settle(&later).0), want);
    }

    #[test]
    fn a_failing_dashboard_without_endpoints_is_the_ready_reason() {
        let previous = RayServiceStatuses::default();
        let clusters = BTreeMap::new();
        let d = decision("a", None);
        let mut i = inputs(&previous, &d, &clusters);
        i.endpoints = 0;
        i.dashboard_problem = Some("connection refused");
        let (status, _) = settle(&i);
        let ready = status
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(
            (ready.reason.as_str(), ready.message.as_str()),
            ("DashboardUnreachable", "connection refused")
        );
    }
}
