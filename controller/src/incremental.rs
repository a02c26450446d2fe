//! `NewClusterWithIncrementalUpgrade`: the Gateway, the HTTPRoute and per-cluster serve Services, and one
//! step of the pure upgrade planner ([`rayshift_api::upgrade`]) per pass: raise or lower a Serve
//! `target_capacity`, move route weight, promote, or finish a rollback.
//!
//! State lives in the RayService status (capacity and traffic per cluster, and rayshift's typed
//! [`UpgradeProgress`]), so a restarted controller resumes where the last one stopped.

use std::time::Duration;

use gateway_api::{gateways::Gateway, httproutes::HttpRoute};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{Api, ResourceExt};
use rayshift_api::{
    RayCluster, RayService,
    cluster_spec::SPEC_HASH_ANNOTATION,
    conditions::{self, Wanted},
    progress::{AbortReason, Steering, UpgradeProgress},
    rayservice::{ClusterServiceStatus, RayServiceStatuses},
    upgrade::{self, Action, Direction, Levels, Observed, Role, UpgradeOptions, WaitReason},
    upgrade_control::{self, Control},
};

use crate::{
    children,
    dashboard::{self, ServeStatus},
    error::{Error, Result},
    events::EventType,
    reconcile::{Context, SERVE_CONFIG_ANNOTATION},
};

pub const PROGRESSING: &str = "Progressing";
/// How long before a traffic step is due the pass that makes it starts.
const STEP_LEAD_MS: i64 = 250;

/// What the incremental pass needs from the reconcile that calls it.
pub struct Pass<'a> {
    pub rs: &'a RayService,
    pub ctx: &'a Context,
    pub ns: &'a str,
    pub active: Option<&'a RayCluster>,
    pub pending: Option<&'a RayCluster>,
    pub active_serve: Option<&'a ServeStatus>,
    pub pending_serve: Option<&'a ServeStatus>,
    pub goal_spec: &'a str,
    pub now: Timestamp,
}

/// When traffic last moved (sub-second when rayshift moved it).
pub fn last_step_time(status: &RayServiceStatuses) -> Option<Timestamp> {
    status.progress.last_traffic_step_time.or_else(|| {
        [
            time(status.active_service_status.as_ref()),
            time(status.pending_service_status.as_ref()),
        ]
        .into_iter()
        .flatten()
        .max()
    })
}

/// Levels of one side, with KubeRay's defaults.
fn levels(side: Option<&ClusterServiceStatus>, role: Role) -> Levels {
    Levels::from_status(side, role)
}

fn time(side: Option<&ClusterServiceStatus>) -> Option<Timestamp> {
    side.and_then(|s| s.last_traffic_migrated_time.as_ref())
        .map(|t| t.0)
}

/// Runs after the cluster lifecycle; edits `status` in place and returns when to come back.
pub async fn advance(p: &Pass<'_>, status: &mut RayServiceStatuses) -> Result<Option<Duration>> {
    let Some(options) =
        p.rs.spec
            .cluster_upgrade_options()
            .and_then(UpgradeOptions::from_spec)
    else {
        return Err(Error::UnusableUpgradeOptions);
    };
    // Fresh sides start where KubeRay starts them: a first cluster at full capacity, a new pending one at 0.
    let first = status
        .active_service_status
        .as_ref()
        .and_then(|a| a.ray_cluster_name.as_ref())
        .is_none();
    if let Some(pending) = status.pending_service_status.as_mut()
        && pending.target_capacity.is_none()
    {
        pending.target_capacity = Some(if first { 100 } else { 0 });
        pending.traffic_routed_percent = Some(if first { 100 } else { 0 });
    }
    if let Some(active) = status.active_service_status.as_mut() {
        active.target_capacity.get_or_insert(100);
        active.traffic_routed_percent.get_or_insert(100);
    }

    for cluster in [p.active, p.pending].into_iter().flatten() {
        apply_cluster_serve_service(p, cluster).await?;
    }
    apply_gateway(p).await?;
    if p.active.is_some() {
        apply_route(p, status).await?;
    }
    let (Some(active), Some(pending)) = (p.active, p.pending) else {
        set_progressing(p, status, None);
        return Ok(None);
    };
    step(p, status, &options, active, pending).await
}

/// The two clusters of a running upgrade and what this pass knows about them.
struct Upgrade<'a> {
    active: &'a RayCluster,
    pending: &'a RayCluster,
    /// The spec digest the pending cluster was built from.
    pending_digest: Option<String>,
    /// Levels and steering as this pass began.
    observed: Observed,
}

async fn step(
    p: &Pass<'_>,
    status: &mut RayServiceStatuses,
    options: &UpgradeOptions,
    active: &RayCluster,
    pending: &RayCluster,
) -> Result<Option<Duration>> {
    let u = steer(p, status, options, active, pending).await?;
    let action = paced_action(options, &u.observed).await;
    match action {
        Action::Wait { until, reason } => return Ok(Some(wait(p, status, options, &u, until, reason).await)),
        Action::SetTargetCapacity { role, percent } => {
            if !set_target_capacity(p, status, &u, role, percent).await? {
                return Ok(Some(p.ctx.options.serve_poll_interval));
            }
        }
        Action::SetTraffic { active, pending } => set_traffic(p, status, &u, active, pending).await?,
        Action::Promote => promote(p, status, &u).await,
        Action::FinishRollback => finish_rollback(p, status, &u).await,
    }
    if status.pending_service_status.is_some() {
        status.progress.last_progress_time = Some(p.now);
    }
    set_progressing(p, status, None);
    // Act again at once: the next decision needs fresh observations.
    Ok(Some(Duration::from_millis(20)))
}

/// Abort, deadline and pause first (pure, [`UpgradeProgress::steer`]), with their events; then what the
/// planner sees.
async fn steer<'a>(
    p: &Pass<'_>,
    status: &mut RayServiceStatuses,
    options: &UpgradeOptions,
    active: &'a RayCluster,
    pending: &'a RayCluster,
) -> Result<Upgrade<'a>> {
    let annotations = p.rs.annotations();
    let control = upgrade_control::control(annotations);
    let pending_digest = pending.annotations().get(SPEC_HASH_ANNOTATION).cloned();
    let pending_runs_goal = pending_digest.as_deref() == Some(p.goal_spec);
    let deadline = upgrade_control::progress_deadline(annotations, p.ctx.options.progress_deadline_seconds);
    let last_step = last_step_time(status);
    let steering = Steering {
        control,
        pending_runs_goal,
        deadline: SignedDuration::from_secs(deadline),
        interval: options.interval,
        last_traffic_step: last_step,
        now: p.now,
    };
    if let Some(abort) = status.progress.steer(&steering) {
        let note = format!("Rolling back the incremental upgrade: {}", abort.message);
        p.ctx
            .event(p.rs, EventType::Warning, abort.reason.as_str(), "Reconcile", note)
            .await;
    }
    let direction = status.progress.direction(pending_runs_goal);
    set_rollback_condition(p, status, direction);
    if was_paused(status) && control != Control::Pause {
        let note =
            "Incremental upgrade resumed: rayshift.io/upgrade-control no longer says pause".to_string();
        p.ctx
            .event(p.rs, EventType::Normal, "UpgradeResumed", "Reconcile", note)
            .await;
    }
    let a = levels(status.active_service_status.as_ref(), Role::Active);
    let pl = levels(status.pending_service_status.as_ref(), Role::Pending);
    let observed = Observed {
        active: a,
        pending: pl,
        last_traffic_step: last_step,
        direction,
        route_ready: p.ctx.options.skip_gateway_status_check || route_ready(p).await?,
        pending_capacity_ready: p.pending_serve.is_some_and(|s| s.capacity_verified(pl.capacity)),
        active_capacity_ready: p.active_serve.is_some_and(|s| s.capacity_verified(a.capacity)),
        pending_reachable: p.pending_serve.is_some(),
        paused: control == Control::Pause,
        hurry: control == Control::Promote,
        now: p.now,
    };
    Ok(Upgrade {
        active,
        pending,
        pending_digest,
        observed,
    })
}

/// The planner's action. Exact pacing: the pass wakes a little before a step is due (observing takes a few
/// API calls), then writes the weights at the due instant, on observations a few hundred ms old at most.
async fn paced_action(options: &UpgradeOptions, observed: &Observed) -> Action {
    let action = upgrade::next_action(options, observed);
    let Action::Wait {
        until: Some(due),
        reason: WaitReason::Interval,
    } = action
    else {
        return action;
    };
    let left = due.duration_since(Timestamp::now());
    if left > SignedDuration::from_millis(STEP_LEAD_MS) {
        return action;
    }
    if left.is_positive() {
        tokio::time::sleep(Duration::from_secs_f64(left.as_secs_f64())).await;
    }
    upgrade::next_action(
        options,
        &Observed {
            now: due,
            ..*observed
        },
    )
}

/// Records why the upgrade waits and returns when to look again.
async fn wait(
    p: &Pass<'_>,
    status: &mut RayServiceStatuses,
    options: &UpgradeOptions,
    u: &Upgrade<'_>,
    until: Option<Timestamp>,
    reason: WaitReason,
) -> Duration {
    let paused_before = was_paused(status);
    set_progressing(p, status, Some(reason));
    if reason == WaitReason::Paused && !paused_before {
        let note = "Incremental upgrade paused by rayshift.io/upgrade-control".to_string();
        p.ctx
            .event(p.rs, EventType::Normal, "UpgradePaused", "Reconcile", note)
            .await;
    }
    match until {
        Some(t) => {
            let wake = t.duration_since(Timestamp::now()).as_secs_f64() - STEP_LEAD_MS as f64 / 1000.0;
            Duration::from_secs_f64(wake.max(0.0))
        }
        None => {
            let due = u.observed.last_traffic_step.map(|t| t + options.interval);
            capacity_wake(p, reason, due)
        }
    }
}

/// PUTs the new target_capacity; `false` when that cluster's Serve cannot take it yet.
async fn set_target_capacity(
    p: &Pass<'_>,
    status: &mut RayServiceStatuses,
    u: &Upgrade<'_>,
    role: Role,
    percent: i32,
) -> Result<bool> {
    let (cluster, serve, from) = match role {
        Role::Active => (u.active, p.active_serve, u.observed.active.capacity),
        Role::Pending => (u.pending, p.pending_serve, u.observed.pending.capacity),
    };
    // Serve must be up on that cluster (and hold its config) before its capacity can change.
    if serve.is_none() {
        let reason = match role {
            Role::Active => WaitReason::ActiveCapacityNotReady,
            Role::Pending => WaitReason::PendingCapacityNotReady,
        };
        set_progressing(p, status, Some(reason));
        return Ok(false);
    }
    set_capacity(p, cluster, percent).await?;
    p.ctx
        .metrics
        .capacity_change(p.ns, &p.rs.name_any(), role.as_str());
    let side = match role {
        Role::Active => &mut status.active_service_status,
        Role::Pending => &mut status.pending_service_status,
    };
    if let Some(s) = side.as_mut() {
        s.target_capacity = Some(percent);
    }
    let note = format!(
        "Set target_capacity of {} RayCluster {}/{}: {from}% → {percent}%{}",
        role.as_str(),
        p.ns,
        cluster.name_any(),
        rolling_back(u.observed.direction)
    );
    p.ctx
        .event(
            p.rs,
            EventType::Normal,
            "UpdatedServeTargetCapacity",
            "Update",
            note,
        )
        .await;
    Ok(true)
}

async fn set_traffic(
    p: &Pass<'_>,
    status: &mut RayServiceStatuses,
    u: &Upgrade<'_>,
    wa: i32,
    wp: i32,
) -> Result<()> {
    // Stamped when the weights are written, not when the pass began: the next step is due an interval after
    // the traffic really moved.
    let written = Timestamp::now();
    let waited = u
        .observed
        .last_traffic_step
        .map(|t| written.duration_since(t).as_secs_f64());
    p.ctx.metrics.traffic_step(p.ns, &p.rs.name_any(), waited);
    let stamp = Some(Time(written));
    status.progress.last_traffic_step_time = Some(written);
    if let Some(s) = status.active_service_status.as_mut() {
        s.traffic_routed_percent = Some(wa);
        s.last_traffic_migrated_time = stamp.clone();
    }
    if let Some(s) = status.pending_service_status.as_mut() {
        s.traffic_routed_percent = Some(wp);
        s.last_traffic_migrated_time = stamp;
    }
    apply_route(p, status).await?;
    let note = format!(
        "Moved traffic: {} {}% → {wa}%, {} {}% → {wp}%{}",
        u.active.name_any(),
        u.observed.active.traffic,
        u.pending.name_any(),
        u.observed.pending.traffic,
        rolling_back(u.observed.direction)
    );
    p.ctx
        .event(p.rs, EventType::Normal, "UpdatedHTTPRoute", "Update", note)
        .await;
    Ok(())
}

async fn promote(p: &Pass<'_>, status: &mut RayServiceStatuses, u: &Upgrade<'_>) {
    let mut promoted = status.pending_service_status.take().unwrap_or_default();
    promoted.target_capacity = Some(100);
    promoted.traffic_routed_percent = Some(100);
    status.active_service_status = Some(promoted);
    let took = status.progress.duration(p.now);
    p.ctx.metrics.upgrade(p.ns, &p.rs.name_any(), "completed", took);
    status.progress = UpgradeProgress::default();
    let note = format!(
        "Promoted RayCluster {}/{}: it serves all traffic now; {} will be deleted",
        p.ns,
        u.pending.name_any(),
        u.active.name_any()
    );
    p.ctx
        .event(p.rs, EventType::Normal, "Promoted", "Reconcile", note)
        .await;
}

async fn finish_rollback(p: &Pass<'_>, status: &mut RayServiceStatuses, u: &Upgrade<'_>) {
    status.pending_service_status = None;
    if let Some(s) = status.active_service_status.as_mut() {
        s.target_capacity = Some(100);
        s.traffic_routed_percent = Some(100);
    }
    // An abort or a missed deadline rejects the spec the pending cluster ran; a spec change does not.
    let (result, rejected) = match &status.progress.upgrade_abort {
        Some(a) if a.reason == AbortReason::UpgradeAborted => ("aborted", u.pending_digest.clone()),
        Some(_) => ("rolled_back", u.pending_digest.clone()),
        None => ("rolled_back", status.progress.rejected_spec_digest.clone()),
    };
    let took = status.progress.duration(p.now);
    p.ctx.metrics.upgrade(p.ns, &p.rs.name_any(), result, took);
    status.progress = status.progress.finished(rejected);
    let conds = status.conditions.take().unwrap_or_default();
    status.conditions = Some(conditions::merge(
        &conds,
        &[],
        &[conditions::ROLLBACK_IN_PROGRESS],
        generation(p),
        &Time(p.now),
    ));
    let note = format!(
        "Rollback complete: all traffic and capacity are back on RayCluster {}/{}",
        p.ns,
        u.active.name_any()
    );
    p.ctx
        .event(p.rs, EventType::Normal, "RolledBack", "Reconcile", note)
        .await;
}

/// When to look again while a step waits for Serve capacity. A step is due at `last step + interval` or at
/// the instant its capacity is verified, whichever is later; that instant is only seen by reading Serve, so
/// once the interval has passed Serve is read at the short capacity poll, and before that at the due
/// instant (or the usual poll, if sooner).
fn capacity_wake(p: &Pass<'_>, reason: WaitReason, due: Option<Timestamp>) -> Duration {
    let options = &p.ctx.options;
    let capacity = matches!(
        reason,
        WaitReason::PendingCapacityNotReady | WaitReason::ActiveCapacityNotReady
    );
    if !capacity {
        return options.serve_poll_interval;
    }
    let left = due.map_or(0.0, |d| d.duration_since(Timestamp::now()).as_secs_f64());
    if left <= 0.0 {
        options.capacity_poll_interval
    } else {
        options.serve_poll_interval.min(Duration::from_secs_f64(left))
    }
}

fn rolling_back(direction: Direction) -> &'static str {
    match direction {
        Direction::Forward => "",
        Direction::Rollback => " (rolling back)",
    }
}

fn generation(p: &Pass<'_>) -> i64 {
    p.rs.metadata.generation.unwrap_or_default()
}

fn was_paused(status: &RayServiceStatuses) -> bool {
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == PROGRESSING && c.reason == WaitReason::Paused.as_str())
}

fn set_rollback_condition(p: &Pass<'_>, status: &mut RayServiceStatuses, direction: Direction) {
    let conds = status.conditions.take().unwrap_or_default();
    let merged = if direction == Direction::Rollback {
        let (reason, message) = match &status.progress.upgrade_abort {
            Some(a) => (a.reason.as_str(), a.message.clone()),
            None => (
                "DesiredClusterSpecChanged",
                "Goal state changed mid-upgrade, rolling back to original cluster.".to_string(),
            ),
        };
        conditions::merge(
            &conds,
            &[Wanted::new(
                conditions::ROLLBACK_IN_PROGRESS,
                true,
                reason,
                message,
            )],
            &[],
            generation(p),
            &Time(p.now),
        )
    } else {
        conditions::merge(
            &conds,
            &[],
            &[conditions::ROLLBACK_IN_PROGRESS],
            generation(p),
            &Time(p.now),
        )
    };
    status.conditions = Some(merged);
}

/// `Progressing`: True while steps happen on schedule, False with the reason when the upgrade waits.
fn set_progressing(p: &Pass<'_>, status: &mut RayServiceStatuses, waiting: Option<WaitReason>) {
    let upgrading = status
        .pending_service_status
        .as_ref()
        .and_then(|s| s.ray_cluster_name.as_ref())
        .is_some()
        && status
            .active_service_status
            .as_ref()
            .and_then(|s| s.ray_cluster_name.as_ref())
            .is_some();
    let conds: Vec<Condition> = status.conditions.take().unwrap_or_default();
    let wanted = match (upgrading, waiting) {
        (false, _) => None,
        (true, Some(WaitReason::Interval)) | (true, None) => Some(Wanted::new(
            PROGRESSING,
            true,
            "StepsOnSchedule",
            "The incremental upgrade is moving step by step",
        )),
        (true, Some(r)) => Some(Wanted::new(PROGRESSING, false, r.as_str(), waiting_message(r))),
    };
    let merged = match wanted {
        Some(w) => conditions::merge(&conds, &[w], &[], generation(p), &Time(p.now)),
        None => conditions::merge(&conds, &[], &[PROGRESSING], generation(p), &Time(p.now)),
    };
    status.conditions = Some(merged);
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
    }
}

/// PUTs the cluster's own Serve config with a new `target_capacity`. The active cluster keeps the config it
/// runs (recorded on the cluster), never the new spec's (KubeRay bug 9.3).
async fn set_capacity(p: &Pass<'_>, cluster: &RayCluster, percent: i32) -> Result<()> {
    let text = cluster
        .annotations()
        .get(SERVE_CONFIG_ANNOTATION)
        .cloned()
        .or_else(|| {
            (cluster
                .annotations()
                .get(SPEC_HASH_ANNOTATION)
                .map(String::as_str)
                == Some(p.goal_spec))
            .then(|| p.rs.spec.serve_config_v2.clone().unwrap_or_default())
        })
        .ok_or_else(|| Error::UnknownServeConfig {
            cluster: cluster.name_any(),
        })?;
    let config = dashboard::serve_config_json(&text, Some(percent))?;
    p.ctx.ensure_leader()?;
    p.ctx
        .dashboard
        .put_config(p.ns, &cluster.name_any(), &config)
        .await
}

async fn apply_cluster_serve_service(p: &Pass<'_>, cluster: &RayCluster) -> Result<()> {
    let body = children::cluster_serve_service(p.rs, cluster);
    crate::reconcile::apply_child::<k8s_openapi::api::core::v1::Service>(p.ctx, p.ns, body).await
}

async fn apply_gateway(p: &Pass<'_>) -> Result<()> {
    let gateway = children::gateway(p.rs, p.ns);
    let body = serde_json::to_value(&gateway).expect("Gateways serialize");
    crate::reconcile::apply_child::<Gateway>(p.ctx, p.ns, body).await
}

/// The route from the status' weights: the active cluster, and the pending one while it exists.
async fn apply_route(p: &Pass<'_>, status: &RayServiceStatuses) -> Result<()> {
    let exists = |name: &String| {
        [p.active, p.pending]
            .into_iter()
            .flatten()
            .any(|c| &c.name_any() == name)
    };
    let weights: Vec<(String, i32)> = [&status.active_service_status, &status.pending_service_status]
        .into_iter()
        .flatten()
        .filter_map(|side| {
            Some((
                side.ray_cluster_name.clone()?,
                side.traffic_routed_percent.unwrap_or(0),
            ))
        })
        .filter(|(name, _)| exists(name))
        .collect();
    let route = children::http_route(p.rs, p.ns, &weights);
    let body = serde_json::to_value(&route).expect("routes serialize");
    crate::reconcile::apply_child::<HttpRoute>(p.ctx, p.ns, body).await
}

/// Gateway Accepted and Programmed, route Accepted and ResolvedRefs for its current generation.
async fn route_ready(p: &Pass<'_>) -> Result<bool> {
    let rs_name = p.rs.name_any();
    let gateways: Api<Gateway> = Api::namespaced(p.ctx.client.clone(), p.ns);
    let routes: Api<HttpRoute> = Api::namespaced(p.ctx.client.clone(), p.ns);
    let Some(gw) = gateways.get_opt(&children::gateway_name(&rs_name)).await? else {
        return Ok(false);
    };
    let Some(route) = routes.get_opt(&children::route_name(&rs_name)).await? else {
        return Ok(false);
    };
    let true_ = |conds: &[Condition], t: &str, generation: Option<i64>| {
        conds.iter().any(|c| {
            c.type_ == t
                && c.status == "True"
                && (c.observed_generation.is_none() || c.observed_generation == generation)
        })
    };
    let gw_conditions = gw
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let gw_ok = true_(&gw_conditions, "Accepted", gw.metadata.generation)
        && true_(&gw_conditions, "Programmed", gw.metadata.generation);
    let parents = route
        .status
        .as_ref()
        .map(|s| s.parents.clone())
        .unwrap_or_default();
    let route_ok = parents.iter().any(|parent| {
        parent.parent_ref.name == children::gateway_name(&rs_name)
            && true_(&parent.conditions, "Accepted", route.metadata.generation)
            && true_(&parent.conditions, "ResolvedRefs", route.metadata.generation)
    });
    Ok(gw_ok && route_ok)
}
