//! `NewClusterWithIncrementalUpgrade`: the Gateway, the HTTPRoute and per-cluster serve Services, and one
//! decision of the pure upgrade ([`rayshift_api::upgrade::decide`]) per pass, applied: a Serve
//! `target_capacity` PUT, the route weights, the events, the metrics.
//!
//! State lives in the RayService status (capacity and traffic per cluster, and rayshift's typed
//! [`rayshift_api::progress::UpgradeProgress`]), so a restarted controller resumes where the last one stopped.

use std::time::Duration;

use gateway_api::{gateways::Gateway, httproutes::HttpRoute};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use rayshift_api::{
    RayCluster, RayService,
    cluster_spec::SPEC_HASH_ANNOTATION,
    rayservice::RayServiceStatuses,
    upgrade::{
        self, Levels, Role, StepDecision, UpgradeOptions,
        decide::{ClusterSeen, Effect, Observation, Settings, Tally},
    },
    upgrade_control,
};

use crate::{
    children,
    context::{self, Context, SERVE_CONFIG_ANNOTATION},
    dashboard::{self, ServeStatus},
    error::{Error, Result},
    events::EventType,
};

/// How long before a traffic step is due the pass that makes it starts. Without it a step lands when a pass
/// started at its due instant reaches the route write: measured with the read caches, 20–200 ms late with two
/// upgrades on two cores (a pass woken by this controller's own writes can hold the object just then), so the
/// pass observes early and decides again at the due instant.
const STEP_LEAD: SignedDuration = SignedDuration::from_millis(250);

/// What the incremental pass needs from the reconcile that calls it.
pub struct Pass<'a> {
    pub rs: &'a RayService,
    pub ctx: &'a Context,
    pub ns: &'a str,
    pub active: Option<&'a RayCluster>,
    pub pending: Option<&'a RayCluster>,
    pub active_serve: Option<&'a ServeStatus>,
    pub pending_serve: Option<&'a ServeStatus>,
    /// The cluster's serve Service has a ready endpoint (its head, unless excluded).
    pub active_serving: bool,
    pub pending_serving: bool,
    pub goal_spec: &'a str,
    pub now: Timestamp,
}

/// Runs after the cluster lifecycle: observes, decides (pure), applies; edits `status` in place and returns
/// when to come back.
pub async fn advance(p: &Pass<'_>, status: &mut RayServiceStatuses) -> Result<Option<Duration>> {
    let settings = settings(p)?;
    for cluster in [p.active, p.pending].into_iter().flatten() {
        apply_cluster_serve_service(p, cluster).await?;
    }
    apply_gateway(p).await?;
    let seen = observe(p, status).await?;
    // Decided at the instant it is applied (a step is stamped when traffic really moves), not when the pass
    // began.
    let mut decision = upgrade::decide(&seen, status, &settings, Timestamp::now());
    // The step is due within the lead: decide again at its due instant, on these observations.
    if let Some(due) = decision
        .step_due
        .filter(|due| due.duration_since(Timestamp::now()) <= STEP_LEAD)
    {
        let left = due.duration_since(Timestamp::now());
        if left.is_positive() {
            tokio::time::sleep(Duration::from_secs_f64(left.as_secs_f64())).await;
        }
        decision = upgrade::decide(&seen, status, &settings, Timestamp::now().max(due));
    }
    apply(p, &decision).await?;
    *status = decision.status;
    let wake = match decision.step_due {
        Some(due) => Some(due - STEP_LEAD),
        None => decision.wake,
    };
    let until = |w: Timestamp| w.duration_since(Timestamp::now()).as_secs_f64().max(0.0);
    Ok(wake.map(|w| Duration::from_secs_f64(until(w))))
}

/// What a decision counts, into the metrics.
pub fn count(ctx: &Context, rs: &RayService, tallies: &[Tally]) {
    let (ns, name) = (rs.namespace().unwrap_or_default(), rs.name_any());
    let metrics = &ctx.metrics;
    for tally in tallies {
        match *tally {
            Tally::Started => metrics.upgrade(&ns, &name, "started", None),
            Tally::CapacityChange(role) => metrics.capacity_change(&ns, &name, role.as_str()),
            Tally::TrafficStep { waited_seconds } => metrics.traffic_step(&ns, &name, waited_seconds),
            Tally::Finished { result, seconds } => metrics.upgrade(&ns, &name, result.as_str(), seconds),
        }
    }
}

/// The spec's pacing and control, and the operator's settings.
fn settings(p: &Pass<'_>) -> Result<Settings> {
    let options =
        p.rs.spec
            .cluster_upgrade_options()
            .and_then(UpgradeOptions::from_spec);
    let options = options.ok_or(Error::UnusableUpgradeOptions)?;
    let annotations = p.rs.annotations();
    let deadline = upgrade_control::progress_deadline(annotations, p.ctx.options.progress_deadline_seconds);
    let duration = |d: Duration| SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
    Ok(Settings {
        options,
        control: upgrade_control::control(annotations),
        deadline: SignedDuration::from_secs(deadline),
        goal_digest: p.goal_spec.to_string(),
        namespace: p.ns.to_string(),
        generation: p.rs.metadata.generation.unwrap_or_default(),
        serve_poll: duration(p.ctx.options.serve_poll_interval),
        capacity_poll: duration(p.ctx.options.capacity_poll_interval),
    })
}

/// The clusters as the pure decision needs them: reachable, capacity verified against the status' levels (and
/// behind their serve Service: a Gateway has nowhere to send a share without an endpoint, KubeRay #5148), and
/// (while both exist) whether the Gateway and route are ready.
async fn observe(p: &Pass<'_>, status: &RayServiceStatuses) -> Result<Observation> {
    let seen = |cluster: Option<&RayCluster>, serve: Option<&ServeStatus>, serving: bool, role: Role| {
        let side = match role {
            Role::Active => status.active_service_status.as_ref(),
            Role::Pending => status.pending_service_status.as_ref(),
        };
        let capacity = Levels::from_status(side, role).capacity;
        cluster.map(|c| ClusterSeen {
            name: c.name_any(),
            spec_digest: c.annotations().get(SPEC_HASH_ANNOTATION).cloned(),
            reachable: serve.is_some(),
            capacity_verified: serving && serve.is_some_and(|s| s.capacity_verified(capacity)),
            serve_capacity: serve.and_then(|s| s.target_capacity).map(|c| c.round() as i32),
        })
    };
    let both = p.active.is_some() && p.pending.is_some();
    Ok(Observation {
        active: seen(p.active, p.active_serve, p.active_serving, Role::Active),
        pending: seen(p.pending, p.pending_serve, p.pending_serving, Role::Pending),
        route_ready: both && (p.ctx.options.skip_gateway_status_check || route_ready(p, status).await?),
    })
}

/// The decision's one write, the route from the decided weights, then its metrics and events.
async fn apply(p: &Pass<'_>, decision: &StepDecision) -> Result<()> {
    if let Some(Effect::TargetCapacity { role, percent, .. }) = &decision.effect {
        let cluster = match role {
            Role::Active => p.active,
            Role::Pending => p.pending,
        };
        if let Some(cluster) = cluster {
            set_capacity(p, cluster, *percent).await?;
        }
    }
    if p.active.is_some() {
        apply_route(p, &decision.status).await?;
    }
    count(p.ctx, p.rs, &decision.tallies);
    for notice in &decision.notices {
        let type_ = if notice.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        p.ctx
            .event(p.rs, type_, notice.reason, notice.action, notice.note.clone())
            .await;
    }
    Ok(())
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
    context::apply_child::<k8s_openapi::api::core::v1::Service>(p.ctx, p.ns, body).await
}

async fn apply_gateway(p: &Pass<'_>) -> Result<()> {
    let gateway = children::gateway(p.rs, p.ns);
    let body = serde_json::to_value(&gateway).expect("Gateways serialize");
    context::apply_child::<Gateway>(p.ctx, p.ns, body).await
}

/// The route from the status' weights: the active cluster, and the pending one while it exists.
async fn apply_route(p: &Pass<'_>, status: &RayServiceStatuses) -> Result<()> {
    context::apply_child::<HttpRoute>(p.ctx, p.ns, route_body(p, status)).await
}

fn route_body(p: &Pass<'_>, status: &RayServiceStatuses) -> serde_json::Value {
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
    serde_json::to_value(&route).expect("routes serialize")
}

/// Gateway Accepted and Programmed, route Accepted and ResolvedRefs for its current generation, and the
/// route is the one with the status' weights (a cache behind this controller's last write is not ready).
async fn route_ready(p: &Pass<'_>, status: &RayServiceStatuses) -> Result<bool> {
    let rs_name = p.rs.name_any();
    let (gateway_name, route_name) = (children::gateway_name(&rs_name), children::route_name(&rs_name));
    let Some(gw) = context::read_child::<Gateway>(p.ctx, p.ns, &gateway_name).await? else {
        return Ok(false);
    };
    let Some(route) = context::read_child::<HttpRoute>(p.ctx, p.ns, &route_name).await? else {
        return Ok(false);
    };
    let (_, digest) = children::stamp(route_body(p, status));
    if route.annotations().get(children::APPLIED_ANNOTATION) != Some(&digest) {
        return Ok(false);
    }
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
