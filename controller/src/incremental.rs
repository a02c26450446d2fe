//! `NewClusterWithIncrementalUpgrade`: the Gateway, the HTTPRoute and per-cluster serve Services, and one
//! decision of the pure upgrade ([`rayshift_api::upgrade::decide`]) per pass, applied: a Serve
//! `target_capacity` PUT, the route weights, the events, the metrics.
//!
//! State lives in the RayService status (capacity and traffic per cluster, and rayshift's typed
//! [`rayshift_api::progress::UpgradeProgress`]), so a restarted controller resumes where the last one stopped.

use std::time::Duration;

use gateway_api::{gateways::Gateway, grpcroutes::GrpcRoute, httproutes::HttpRoute};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
    runtime::reflector::ObjectRef,
};
use rayshift_api::{
    RayCluster, RayService,
    cluster_spec::SPEC_HASH_ANNOTATION,
    gateway_attachment::Attachment,
    rayservice::{ClusterServiceStatus, RayServiceStatuses},
    slo::{Bindings, Evaluation, Reading},
    upgrade::{
        self, CAPACITY_VERIFIED_READS, Levels, Role, StepDecision, UpgradeOptions,
        decide::{ClusterSeen, Effect, Observation, Settings, Tally},
    },
    upgrade_control,
};

use crate::{
    children,
    context::{self, Context, ParentRefs},
    dashboard::{self, ServeStatus, Target},
    error::{Error, Result},
    events::EventType,
    waiting::{self, Waiting},
};

/// How long before a traffic step is due the pass that makes it starts. Without it a step lands when a pass
/// started at its due instant reaches the route write: measured with the read caches, 20–200 ms late with two
/// upgrades on two cores (a pass woken by this controller's own writes can hold the object just then), so the
/// pass observes early and decides again at the due instant. It gives its reconcile slot back through the
/// rest of the lead and takes one again first at the due instant (`slots`). Too short a lead leaves too little
/// time to observe. Measured while the pass held its slot through the lead, with 50 steps due at once at 1,000
/// RayServices: 250 ms kept 136–145 of 150 on time, 120 ms 147–150, 60 ms 128 (BENCHMARKS.md, "The step lead").
const STEP_LEAD: SignedDuration = SignedDuration::from_millis(120);

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

/// What a pass leaves for the reconcile that called it.
pub struct Advanced {
    /// When to come back.
    pub wake: Option<Duration>,
    /// An SLO check paused the upgrade: write the pause annotation once the status is written.
    pub pause: bool,
}

/// Runs after the cluster lifecycle: observes, decides (pure), applies; edits `status` in place and returns
/// when to come back.
pub async fn advance(p: &Pass<'_>, status: &mut RayServiceStatuses) -> Result<Advanced> {
    let settings = settings(p)?;
    let attachment =
        Attachment::from_annotations(p.rs.annotations(), p.ns).map_err(Error::GatewayAttachment)?;
    for cluster in [p.active, p.pending].into_iter().flatten() {
        apply_cluster_serve_service(p, cluster).await?;
    }
    if attachment == Attachment::Owned {
        apply_gateway(p).await?;
    }
    let mut seen = observe(p, &attachment, status).await?;
    seen.slo = evaluate_slo_checks(p, &settings, &seen, status).await;
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
            let lead = tokio::time::sleep(Duration::from_secs_f64(left.as_secs_f64()));
            p.ctx.slots.away_until(due, lead).await;
        }
        decision = upgrade::decide(&seen, status, &settings, Timestamp::now().max(due));
    }
    apply(p, &attachment, &decision).await?;
    // While it steps, this RayService's passes near its next step's due instant go first for a slot.
    let next_due = upgrade::decide::next_step_due(&decision.status, settings.options.interval);
    p.ctx.slots.next_step(ObjectRef::from_obj(p.rs), next_due);
    *status = decision.status;
    let wake = match decision.step_due {
        Some(due) => Some(due - STEP_LEAD),
        None => decision.wake,
    };
    let until = |w: Timestamp| w.duration_since(Timestamp::now()).as_secs_f64().max(0.0);
    Ok(Advanced {
        wake: wake.map(|w| Duration::from_secs_f64(until(w))),
        pause: decision.pause,
    })
}

/// After a switch from `NewClusterWithIncrementalUpgrade` to another strategy, rayshift's own HTTPRoute (and
/// GRPCRoute) keep carrying the traffic: all of it to the active cluster, through that cluster's serve Service,
/// moved at each promotion. The Gateway's clients keep working; KubeRay leaves the route on a cluster that the
/// next upgrade deletes (KubeRay bug 9.17). So does an adopted route whose managed rule rayshift routed (it
/// names only this RayService's cluster serve Services). A RayService that has no route of rayshift's gets
/// none, and a rule the user points elsewhere is left as it is.
pub async fn follow_active(rs: &RayService, ctx: &Context, active: Option<&RayCluster>) -> Result<()> {
    let served = ctx.gateway_api.load(std::sync::atomic::Ordering::Relaxed);
    let Some(active) = active.filter(|_| served) else {
        return Ok(());
    };
    let ns = rs.namespace().unwrap_or_default();
    // Annotations the webhook refuses leave the routing as it is.
    let Ok(attachment) = Attachment::from_annotations(rs.annotations(), &ns) else {
        return Ok(());
    };
    let Some(routed) = routed_rule(ctx, rs, &ns, &attachment).await? else {
        return Ok(());
    };
    let pass = Pass {
        rs,
        ctx,
        ns: &ns,
        active: Some(active),
        pending: None,
        active_serve: None,
        pending_serve: None,
        active_serving: true,
        pending_serving: false,
        goal_spec: "",
        now: Timestamp::now(),
    };
    let all_on_active = RayServiceStatuses {
        active_service_status: Some(ClusterServiceStatus {
            ray_cluster_name: Some(active.name_any()),
            traffic_routed_percent: Some(100),
            ..ClusterServiceStatus::default()
        }),
        ..RayServiceStatuses::default()
    };
    apply_cluster_serve_service(&pass, active).await?;
    apply_route(&pass, &attachment, &all_on_active).await?;
    let serve_service = children::cluster_serve_service_name(&active.name_any());
    if !children::all_traffic_to(&routed.route, routed.rule, &serve_service) {
        let note = format!(
            "Moved all traffic to the active cluster {} on HTTPRoute {ns}/{}: since the switch from \
             NewClusterWithIncrementalUpgrade the route follows the active cluster",
            active.name_any(),
            routed.name
        );
        ctx.event(rs, EventType::Normal, "UpdatedHTTPRoute", "Update", note);
    }
    Ok(())
}

/// The route rayshift routes for a RayService, and the index of the rule it manages there.
struct RoutedRule {
    name: String,
    route: serde_json::Value,
    rule: usize,
}

/// The route the attachment uses, if rayshift routes it: its own HTTPRoute, or the adopted one while its
/// managed rule still goes to this RayService's clusters. Read from the cache once it has listed, so a pass
/// right after a restart does not miss it.
async fn routed_rule(
    ctx: &Context,
    rs: &RayService,
    ns: &str,
    attachment: &Attachment,
) -> Result<Option<RoutedRule>> {
    let own = children::route_name(&rs.name_any());
    let (name, rule) = match attachment {
        Attachment::AdoptedRoute { name, rule } => (name.as_str(), Some(rule.as_deref())),
        _ => (own.as_str(), None),
    };
    let Some(route) = context::read_child::<HttpRoute>(ctx, ns, name).await? else {
        return Ok(None);
    };
    let owned = owned_by(rs, &route);
    let route = serde_json::to_value(&route).expect("routes serialize");
    let routed = match rule {
        None => owned.then_some(0),
        Some(rule) => children::adopted_rule_index(&route, rule)
            .filter(|index| children::routes_to_clusters_of(&route, *index, &rs.name_any())),
    };
    Ok(routed.map(|rule| RoutedRule {
        name: name.to_string(),
        route,
        rule,
    }))
}

/// Asks Prometheus the SLO checks that are due (on the pending cluster, beside the active one), and counts
/// their outcomes.
async fn evaluate_slo_checks(
    p: &Pass<'_>,
    settings: &Settings,
    seen: &Observation,
    status: &RayServiceStatuses,
) -> Vec<Evaluation> {
    let due = upgrade::slo_gate::due(status, settings, seen.pending.as_ref(), Timestamp::now());
    let (Some(active), Some(pending), false) = (&seen.active, &seen.pending, due.is_empty()) else {
        return Vec::new();
    };
    let name = p.rs.name_any();
    let bindings = Bindings {
        cluster: &pending.name,
        active_cluster: &active.name,
        namespace: p.ns,
        rayservice: &name,
        window_seconds: 0,
    };
    let evaluations = crate::slo::evaluate(p.ctx.prometheus.as_ref(), &due, bindings).await;
    for (check, e) in due.iter().zip(&evaluations) {
        let value = match e.reading {
            Reading::Value(v) => Some(v),
            _ => None,
        };
        p.ctx
            .metrics
            .slo_evaluation(p.ns, &name, &check.name, check.outcome(&e.reading), value);
    }
    evaluations
}

/// Writes `rayshift.io/upgrade-control: pause`: an SLO check paused the upgrade, and a person resumes or
/// aborts it as any pause (`kubectl rayshift resume|abort`).
pub async fn pause(ctx: &Context, rs: &RayService) -> Result<()> {
    let api: Api<RayService> = Api::namespaced(ctx.client.clone(), &rs.namespace().unwrap_or_default());
    let patch = serde_json::json!({"metadata": {"annotations": {
        upgrade_control::UPGRADE_CONTROL_ANNOTATION: "pause"
    }}});
    ctx.before_write("RayService", "patch")?;
    let written = api
        .patch(&rs.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    ctx.saw_version(&written);
    Ok(())
}

/// What a decision counts, into the metrics.
pub fn count(ctx: &Context, rs: &RayService, tallies: &[Tally]) {
    let (ns, name) = (rs.namespace().unwrap_or_default(), rs.name_any());
    let metrics = &ctx.metrics;
    for tally in tallies {
        match *tally {
            Tally::Started => metrics.upgrade(&ns, &name, "started", None),
            Tally::CapacityChange(role) => metrics.capacity_change(&ns, &name, role.as_str()),
            Tally::TrafficStep { waited_seconds } => {
                // Counted once its route is written: the log line's own time is when traffic moved.
                tracing::debug!(target: "rayshift::pacing", ?waited_seconds, "traffic step written");
                metrics.traffic_step(&ns, &name, waited_seconds);
            }
            Tally::Finished { result, seconds } => metrics.upgrade(&ns, &name, result.as_str(), seconds),
        }
    }
}

/// The spec's pacing and control, and the operator's settings.
fn settings(p: &Pass<'_>) -> Result<Settings> {
    let options =
        UpgradeOptions::of(p.rs, p.ctx.options.drain_seconds).ok_or(Error::UnusableUpgradeOptions)?;
    let annotations = p.rs.annotations();
    let deadline = upgrade_control::progress_deadline(annotations, p.ctx.options.progress_deadline_seconds);
    let duration = |d: Duration| SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
    Ok(Settings {
        options,
        control: upgrade_control::control(annotations),
        deadline: SignedDuration::from_secs(deadline),
        goal_digest: p.goal_spec.to_string(),
        slo_checks: rayshift_api::slo::of(annotations),
        resource_aware: upgrade_control::resource_aware_mode(annotations, p.ctx.options.resource_aware),
        max_unavailable_percent: upgrade_control::max_unavailable_percent(
            annotations,
            options.step_size_percent,
        ),
        namespace: p.ns.to_string(),
        generation: p.rs.metadata.generation.unwrap_or_default(),
        serve_poll: duration(p.ctx.options.serve_poll_interval),
        capacity_poll: duration(p.ctx.options.capacity_poll_interval),
    })
}

/// The clusters as the pure decision needs them: reachable, capacity verified against the status' levels (and
/// behind their serve Service: a Gateway has nowhere to send a share without an endpoint, KubeRay #5148), and
/// (while both exist) whether the Gateway and route are ready.
async fn observe(p: &Pass<'_>, attachment: &Attachment, status: &RayServiceStatuses) -> Result<Observation> {
    let owner = p.rs.uid().unwrap_or_default();
    let seen = |cluster: Option<&RayCluster>, serve: Option<&ServeStatus>, serving: bool, role: Role| {
        let side = match role {
            Role::Active => status.active_service_status.as_ref(),
            Role::Pending => status.pending_service_status.as_ref(),
        };
        let capacity = Levels::from_status(side, role).capacity;
        cluster.map(|c| {
            let verified = serving && serve.is_some_and(|s| s.capacity_verified(capacity));
            let reads = p
                .ctx
                .records()
                .capacity_read(&owner, &c.name_any(), capacity, verified);
            ClusterSeen {
                name: c.name_any(),
                spec_digest: c.annotations().get(SPEC_HASH_ANNOTATION).cloned(),
                reachable: serve.is_some(),
                capacity_verified: reads >= CAPACITY_VERIFIED_READS,
                capacity_found: verified,
                serve_capacity: serve.and_then(|s| s.target_capacity).map(|c| c.round() as i32),
            }
        })
    };
    let both = p.active.is_some() && p.pending.is_some();
    let pending = seen(p.pending, p.pending_serve, p.pending_serving, Role::Pending);
    let pending_stall = match (&pending, both) {
        (Some(c), true) if !(c.reachable && c.capacity_verified) => pending_stall(p, &c.name).await?,
        (Some(c), _) => {
            p.ctx.records().capacity_arrived(&owner, &c.name);
            None
        }
        (None, _) => None,
    };
    Ok(Observation {
        active: seen(p.active, p.active_serve, p.active_serving, Role::Active),
        pending,
        route_ready: both
            && (p.ctx.options.skip_gateway_status_check || route_ready(p, attachment, status).await?),
        slo: Vec::new(),
        pending_stall,
    })
}

/// What the pending cluster's Pods lack, asked while the upgrade waits for its capacity (so a settled
/// RayService costs no Pod list), from one serve poll into the wait on, at most once per serve poll.
async fn pending_stall(p: &Pass<'_>, cluster: &str) -> Result<Option<rayshift_api::stall::Stall>> {
    let owner = p.rs.uid().unwrap_or_default();
    let fresh = p.ctx.options.serve_poll_interval;
    if let Some(known) = p.ctx.records().stall_known(&owner, cluster, fresh) {
        return Ok(known);
    }
    let pods: Api<Pod> = Api::namespaced(p.ctx.client.clone(), p.ns);
    let selector = format!("{}={cluster}", children::CLUSTER_LABEL);
    waiting::on(Waiting::api("list", "Pod"));
    // From the apiserver's watch cache (resourceVersion 0), not a quorum read of every Pod in the namespace
    // from etcd: this is a diagnosis, and 50 upgrades at once ask it together.
    let list = pods
        .list(&ListParams::default().labels(&selector).match_any())
        .await?;
    let stall = rayshift_api::stall::of(&list.items);
    p.ctx.records().set_stall(&owner, cluster, stall.clone());
    Ok(stall)
}

/// The decision's Serve writes, the route from the decided weights, then its metrics and events.
async fn apply(p: &Pass<'_>, attachment: &Attachment, decision: &StepDecision) -> Result<()> {
    // In order, each only once the one before it was written: a raise relies on its lowering.
    for effect in &decision.effects {
        let Effect::TargetCapacity { role, percent, .. } = effect else {
            continue;
        };
        let cluster = match role {
            Role::Active => p.active,
            Role::Pending => p.pending,
        };
        if let Some(cluster) = cluster {
            set_capacity(p, cluster, *percent).await?;
        }
    }
    if p.active.is_some() {
        apply_route(p, attachment, &decision.status).await?;
    }
    count(p.ctx, p.rs, &decision.tallies);
    for notice in &decision.notices {
        let type_ = if notice.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        p.ctx
            .event(p.rs, type_, notice.reason, notice.action, notice.note.clone());
    }
    Ok(())
}

/// PUTs the cluster's own Serve config with a new `target_capacity`. The active cluster keeps the config it
/// runs (recorded on the cluster), never the new spec's (KubeRay bug 9.3).
async fn set_capacity(p: &Pass<'_>, cluster: &RayCluster, percent: i32) -> Result<()> {
    let name = cluster.name_any();
    let text = crate::reconcile::recorded_config(p.rs, p.ctx, &name, Some(cluster))
        .or_else(|| {
            (cluster
                .annotations()
                .get(SPEC_HASH_ANNOTATION)
                .map(String::as_str)
                == Some(p.goal_spec))
            .then(|| p.rs.spec.serve_config_v2.clone().unwrap_or_default())
        })
        .ok_or_else(|| Error::UnknownServeConfig {
            cluster: name.clone(),
        })?;
    let config = dashboard::serve_config_json(&text, Some(percent))?;
    p.ctx.ensure_leader()?;
    p.ctx.dashboard.put_config(&Target::of(cluster), &config).await
}

async fn apply_cluster_serve_service(p: &Pass<'_>, cluster: &RayCluster) -> Result<()> {
    let body = children::cluster_serve_service(p.rs, cluster).ok_or(Error::NoServePort)?;
    context::apply_child::<k8s_openapi::api::core::v1::Service>(p.ctx, p.ns, body).await
}

async fn apply_gateway(p: &Pass<'_>) -> Result<()> {
    let gateway = children::gateway(p.rs, p.ns);
    let body = serde_json::to_value(&gateway).expect("Gateways serialize");
    context::apply_child::<Gateway>(p.ctx, p.ns, body).await
}

/// The route from the status' weights: rayshift's own, or the managed rule of the adopted one; the GRPCRoute
/// while Serve has a gRPC port. Then what the attachment no longer uses goes.
async fn apply_route(p: &Pass<'_>, attachment: &Attachment, status: &RayServiceStatuses) -> Result<()> {
    match attachment {
        Attachment::AdoptedRoute { name, rule } => {
            patch_adopted_route(p, name, rule.as_deref(), status).await?;
        }
        _ => {
            context::apply_child::<HttpRoute>(p.ctx, p.ns, route_body(p, attachment, status)).await?;
            if children::grpc_port(p.rs).is_some() {
                let body = grpc_route_body(p, attachment, status);
                context::apply_child::<GrpcRoute>(p.ctx, p.ns, body).await?;
            }
        }
    }
    remove_unused_routing(p, attachment).await
}

/// rayshift's own routing objects that nothing uses any more: the GRPCRoute once Serve has no gRPC port (or an
/// adopted HTTPRoute carries the traffic), the HTTPRoute once an adopted one does, and the Gateway once the
/// RayService attaches elsewhere and no other route of its namespace attaches to it. Left behind, a route
/// keeps sending calls to serve Services that go with the next upgrade, and a Gateway keeps its load balancer.
async fn remove_unused_routing(p: &Pass<'_>, attachment: &Attachment) -> Result<()> {
    let rs = p.rs.name_any();
    let (route, grpc_route) = (children::route_name(&rs), children::grpc_route_name(&rs));
    let elsewhere =
        (!matches!(attachment, Attachment::Owned)).then_some(Unused::TrafficElsewhere(attachment));
    let grpc_gone = match attachment {
        Attachment::AdoptedRoute { .. } => elsewhere,
        _ => children::grpc_port(p.rs).is_none().then_some(Unused::NoGrpcPort),
    };
    if let Some(why) = grpc_gone {
        delete_owned::<GrpcRoute>(p, &grpc_route, why).await?;
    }
    let Some(why) = elsewhere else {
        return Ok(());
    };
    if matches!(attachment, Attachment::AdoptedRoute { name, .. } if *name != route) {
        delete_owned::<HttpRoute>(p, &route, why).await?;
    }
    let gateway = children::gateway_name(&rs);
    let Some(caches) = p.ctx.caches.as_ref() else {
        return Ok(());
    };
    if !matches!(caches.child::<Gateway>(p.ns, &gateway), Some(Some(_))) {
        return Ok(());
    }
    // The RayService's own routes attach elsewhere now (or are gone), whatever a cache a write behind says.
    let attached = caches.routes_attached_to(p.ns, &gateway);
    let others = attached.map(|names| names.iter().any(|n| *n != route && *n != grpc_route));
    if others == Some(false) {
        delete_owned::<Gateway>(p, &gateway, why).await?;
    }
    Ok(())
}

/// Why a routing object of the RayService is no longer used: the words of its deletion's Event, built only
/// when something is deleted.
#[derive(Clone, Copy)]
enum Unused<'a> {
    NoGrpcPort,
    TrafficElsewhere(&'a Attachment),
}

impl std::fmt::Display for Unused<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unused::NoGrpcPort => f.write_str("Serve has no gRPC port"),
            Unused::TrafficElsewhere(Attachment::Owned) => f.write_str("its own Gateway carries the traffic"),
            Unused::TrafficElsewhere(Attachment::SharedGateway(gw)) => {
                write!(
                    f,
                    "the shared Gateway {}/{} carries the traffic",
                    gw.namespace, gw.name
                )
            }
            Unused::TrafficElsewhere(Attachment::AdoptedRoute { name, .. }) => {
                write!(f, "the adopted HTTPRoute {name} carries the traffic")
            }
        }
    }
}

/// Whether the RayService is among the object's owners (by uid: a RayService of the same name made again is
/// another).
fn owned_by(rs: &RayService, object: &impl kube::Resource) -> bool {
    let uid = rs.metadata.uid.as_ref();
    object.owner_references().iter().any(|o| Some(&o.uid) == uid)
}

/// Deletes `name` if the cache holds it and this RayService owns it, with an Event. Only the cache is read, so
/// a settled pass (or an apiserver that does not serve the kind) costs no request.
async fn delete_owned<K>(p: &Pass<'_>, name: &str, why: Unused<'_>) -> Result<()>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + 'static,
{
    let cached = p.ctx.caches.as_ref().and_then(|c| c.child::<K>(p.ns, name));
    if !cached.flatten().is_some_and(|object| owned_by(p.rs, &*object)) {
        return Ok(());
    }
    let kind = K::kind(&());
    p.ctx.before_write(kind.clone(), "delete")?;
    let api: Api<K> = Api::namespaced(p.ctx.client.clone(), p.ns);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let note = format!("Deleted {kind} {}/{name}: {why}", p.ns);
    p.ctx
        .event(p.rs, EventType::Normal, &format!("Deleted{kind}"), "Delete", note);
    Ok(())
}

/// Sets the backendRefs of the adopted route's managed rule, and nothing else of it.
async fn patch_adopted_route(
    p: &Pass<'_>,
    name: &str,
    rule: Option<&str>,
    status: &RayServiceStatuses,
) -> Result<()> {
    let backends = children::backend_refs(p.rs, p.ns, &route_weights(p, status));
    let cached = context::read_child::<HttpRoute>(p.ctx, p.ns, name).await?;
    if patch_for_adopted_route(cached, name, rule, &backends)?.is_none() {
        return Ok(());
    }
    // Patched from a fresh read: its resourceVersion test fails (422) on a cache one write behind.
    let routes = Api::<HttpRoute>::namespaced(p.ctx.client.clone(), p.ns);
    waiting::on(Waiting::api("get", "HTTPRoute"));
    let Some(patch) = patch_for_adopted_route(routes.get_opt(name).await?, name, rule, &backends)? else {
        return Ok(());
    };
    p.ctx.before_write("HTTPRoute", "patch")?;
    let params = PatchParams {
        field_manager: Some(p.ctx.options.field_manager.clone()),
        ..PatchParams::default()
    };
    routes
        .patch(name, &params, &Patch::Json::<()>(patch))
        .await
        .map_err(|e| Error::from_route_patch(e, name))?;
    Ok(())
}

/// The patch that gives the adopted route `backends`, if it needs one; a missing route or rule is an error.
fn patch_for_adopted_route(
    route: Option<HttpRoute>,
    name: &str,
    rule: Option<&str>,
    backends: &serde_json::Value,
) -> Result<Option<json_patch::Patch>> {
    let route = route.ok_or_else(|| Error::AdoptedRouteMissing {
        route: name.to_string(),
    })?;
    let route = serde_json::to_value(&route).expect("routes serialize");
    let index = children::adopted_rule_index(&route, rule).ok_or_else(|| Error::AdoptedRuleMissing {
        route: name.to_string(),
        rule: rule.map(str::to_string),
    })?;
    Ok(children::adopted_route_patch(&route, index, rule, backends))
}

/// The status' weights: the active cluster, and the pending one while it exists.
fn route_weights(p: &Pass<'_>, status: &RayServiceStatuses) -> Vec<(String, i32)> {
    let exists = |name: &String| {
        [p.active, p.pending]
            .into_iter()
            .flatten()
            .any(|c| &c.name_any() == name)
    };
    [&status.active_service_status, &status.pending_service_status]
        .into_iter()
        .flatten()
        .filter_map(|side| {
            Some((
                side.ray_cluster_name.clone()?,
                side.traffic_routed_percent.unwrap_or(0),
            ))
        })
        .filter(|(name, _)| exists(name))
        .collect()
}

fn grpc_route_body(p: &Pass<'_>, attachment: &Attachment, status: &RayServiceStatuses) -> serde_json::Value {
    let route = children::grpc_route(p.rs, p.ns, attachment, &route_weights(p, status));
    serde_json::to_value(&route).expect("routes serialize")
}

fn route_body(p: &Pass<'_>, attachment: &Attachment, status: &RayServiceStatuses) -> serde_json::Value {
    let route = children::http_route(p.rs, p.ns, attachment, &route_weights(p, status));
    serde_json::to_value(&route).expect("routes serialize")
}

/// Gateway Accepted and Programmed, route Accepted and ResolvedRefs for its current generation, and the
/// route is the one with the status' weights (a cache behind this controller's last write is not ready).
async fn route_ready(p: &Pass<'_>, attachment: &Attachment, status: &RayServiceStatuses) -> Result<bool> {
    let route_name = match attachment {
        Attachment::AdoptedRoute { name, .. } => name.clone(),
        _ => children::route_name(&p.rs.name_any()),
    };
    let Some(route) = context::read_child::<HttpRoute>(p.ctx, p.ns, &route_name).await? else {
        return Ok(false);
    };
    if !route_carries(p, attachment, &route, status) {
        return Ok(false);
    }
    let parents = parent_gateways(p, attachment, &route);
    let mut routes = vec![serde_json::to_value(&route).expect("routes serialize")];
    if children::grpc_port(p.rs).is_some() {
        match grpc_route_carrying(p, attachment, status).await? {
            Some(grpc) => routes.push(grpc),
            None => return Ok(false),
        }
    }
    for (ns, name) in parents {
        let gateway = context::read_child::<Gateway>(p.ctx, &ns, &name).await?;
        let gateway = gateway.map(|gw| serde_json::to_value(&gw).expect("Gateways serialize"));
        if !gateway.is_some_and(|gw| gateway_ready(&gw))
            || !routes.iter().all(|r| route_accepted_by(r, p.ns, &ns, &name))
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The GRPCRoute (as JSON) when it carries the status' weights.
async fn grpc_route_carrying(
    p: &Pass<'_>,
    attachment: &Attachment,
    status: &RayServiceStatuses,
) -> Result<Option<serde_json::Value>> {
    let name = children::grpc_route_name(&p.rs.name_any());
    let Some(route) = context::read_child::<GrpcRoute>(p.ctx, p.ns, &name).await? else {
        return Ok(None);
    };
    let (_, digest) = children::stamp(grpc_route_body(p, attachment, status));
    let carries = route.annotations().get(children::APPLIED_ANNOTATION) == Some(&digest);
    Ok(carries.then(|| serde_json::to_value(&route).expect("routes serialize")))
}

/// The route is the one with the status' weights (a cache behind this controller's last write is not).
fn route_carries(
    p: &Pass<'_>,
    attachment: &Attachment,
    route: &HttpRoute,
    status: &RayServiceStatuses,
) -> bool {
    match attachment {
        Attachment::AdoptedRoute { rule, .. } => {
            let route = serde_json::to_value(route).expect("routes serialize");
            let backends = children::backend_refs(p.rs, p.ns, &route_weights(p, status));
            children::adopted_rule_index(&route, rule.as_deref())
                .is_some_and(|i| route["spec"]["rules"][i]["backendRefs"] == backends)
        }
        _ => {
            let (_, digest) = children::stamp(route_body(p, attachment, status));
            route.annotations().get(children::APPLIED_ANNOTATION) == Some(&digest)
        }
    }
}

/// `(namespace, name)` of the Gateways the route attaches to.
fn parent_gateways(p: &Pass<'_>, attachment: &Attachment, route: &HttpRoute) -> Vec<(String, String)> {
    match attachment {
        Attachment::AdoptedRoute { .. } => (route.parents().into_iter())
            .filter(|(kind, _, _)| kind.unwrap_or("Gateway") == "Gateway")
            .map(|(_, namespace, name)| (namespace.unwrap_or(p.ns).to_string(), name.to_string()))
            .collect(),
        Attachment::SharedGateway(gw) => vec![(gw.namespace.clone(), gw.name.clone())],
        Attachment::Owned => vec![(p.ns.to_string(), children::gateway_name(&p.rs.name_any()))],
    }
}

/// A `conditions` list has `type_` True for `generation` (or without an observed generation).
fn condition_true(conditions: &serde_json::Value, type_: &str, generation: Option<i64>) -> bool {
    conditions.as_array().into_iter().flatten().any(|c| {
        c["type"] == type_
            && c["status"] == "True"
            && (c["observedGeneration"].is_null() || c["observedGeneration"].as_i64() == generation)
    })
}

/// Gateway Accepted and Programmed for its current generation.
fn gateway_ready(gw: &serde_json::Value) -> bool {
    let generation = gw["metadata"]["generation"].as_i64();
    let conditions = &gw["status"]["conditions"];
    condition_true(conditions, "Accepted", generation) && condition_true(conditions, "Programmed", generation)
}

/// The route (HTTP or gRPC) Accepted with its refs resolved by that Gateway, for its current generation.
fn route_accepted_by(route: &serde_json::Value, route_ns: &str, ns: &str, name: &str) -> bool {
    let generation = route["metadata"]["generation"].as_i64();
    route["status"]["parents"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|parent| {
            let parent_ref = &parent["parentRef"];
            parent_ref["name"] == name
                && parent_ref["namespace"].as_str().unwrap_or(route_ns) == ns
                && condition_true(&parent["conditions"], "Accepted", generation)
                && condition_true(&parent["conditions"], "ResolvedRefs", generation)
        })
}
