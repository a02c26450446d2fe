//! One reconcile pass: observe (Kubernetes objects, Ray dashboards) → decide (pure, `rayshift-api`) →
//! apply (server-side apply, status subresource, events).

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use jiff::{SignedDuration, Timestamp};
use json_patch::{PatchOperation, ReplaceOperation, TestOperation};
use k8s_openapi::{
    api::core::v1::{Pod, Service},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
    runtime::{controller::Action, reflector::ObjectRef},
};
use rayshift_api::rayservice::KUBERAY_FINALIZER;
use rayshift_api::{
    RayCluster, RayService, UpgradeType,
    cluster_spec::{
        Adoption, NUM_WORKER_GROUPS_ANNOTATION, SCALE_HASH_ANNOTATION, SPEC_HASH_ANNOTATION, SpecDigests,
    },
    conditions::{self, Wanted, reason},
    lifecycle::{
        self, ClusterAction, ClusterFacts, DELETE_AFTER_ANNOTATION, Decision, Facts,
        initializing::{self, Initialization},
        status::{ClusterView, StatusInputs},
    },
    rayservice::{AppStatus, ClusterServiceStatus, RayServiceStatuses, ServeDeploymentStatus},
    validation::{self, ValidationConfig},
};
use serde_json::{Value, json};

use crate::{
    children::{self, CLUSTER_LABEL, NODE_TYPE_LABEL, SERVE_CONFIG_ANNOTATION, SERVE_LABEL},
    cluster_records::LabelWrite,
    context::{Context, ControllerOptions, apply_child},
    dashboard::{self, HeadProxy, ServeStatus, Target},
    error::{Error, Result},
    events::EventType,
    health_timer::{Baseline, ProxyAddress, ServingCluster},
    metrics::ServiceView,
    waiting::{self, Waiting},
};

/// What was seen of one cluster this pass.
struct Seen {
    cluster: RayCluster,
    head_ready: bool,
    head_message: String,
    head_pod: Option<Pod>,
    serve: Option<ServeStatus>,
    dashboard_error: Option<String>,
    /// The Serve status read was refused, and would be again (`Error::is_persistent`).
    dashboard_refused: bool,
}

/// A pass never takes this long (its dashboard calls time out in seconds, its API calls answer in milliseconds),
/// but kube's client has no read timeout: a request left unanswered would hold its reconcile slot forever. A pass
/// is idempotent (observe, decide, apply), so an abandoned one is simply retried; its error names what it was
/// waiting on (that is how the stall at `--concurrency 64` was found: BENCHMARKS.md).
const PASS_TIMEOUT: Duration = Duration::from_secs(30);

pub async fn reconcile(cached: Arc<RayService>, ctx: Arc<Context>) -> Result<Action> {
    let queued = Timestamp::now();
    let Some(slot) = ctx.slots.take(&ObjectRef::from_obj(&*cached)).await else {
        // The controller is stopping: this pass does not run.
        return Ok(Action::await_change());
    };
    let _timer = ctx.metrics.reconcile_timer();
    let started = Timestamp::now();
    // Every log line of the pass names its RayService.
    let span = tracing::info_span!(
        "reconcile",
        rayservice = %cached.name_any(),
        namespace = %cached.namespace().unwrap_or_default()
    );
    let tracker = waiting::Tracker::default();
    let run = {
        let (cached, ctx, tracker) = (cached.clone(), ctx.clone(), tracker.clone());
        async move { tracker.run(pass(&cached, &ctx)).await }
    };
    // Each pass is a task of its own: kube-runtime polls every running reconcile from one task, where a pass
    // whose reply had arrived sometimes was not polled again until its timeout (BENCHMARKS.md, the stall), and
    // where all passes shared one thread.
    let task = spawn_pass(crate::slots::holding(
        slot,
        tracing::Instrument::instrument(run, span),
    ));
    let result = match tokio::time::timeout(PASS_TIMEOUT, task).await {
        Ok(Ok(result)) => result,
        // Only a panic ends it without a result: it is aborted only once nobody awaits it.
        Ok(Err(_)) => Err(Error::PassPanicked),
        Err(_) => Err(Error::PassTimedOut {
            after: PASS_TIMEOUT,
            waiting: tracker.last(),
        }),
    };
    // Inside kube-runtime's span, which names the trigger: what held the reconcile slots, and how long.
    let ms = Timestamp::now().duration_since(started).as_millis();
    let queued_ms = started.duration_since(queued).as_millis();
    tracing::debug!(target: "rayshift::pass", %started, ms, queued_ms, next = ?result.as_ref().ok(), "pass ended");
    // Deleted while this pass ran: whatever it published or counted is dropped again, in one place.
    if ctx.was_deleted(&cached) {
        ctx.metrics
            .forget_service(&cached.namespace().unwrap_or_default(), &cached.name_any());
    }
    result
}

/// A pass's task, aborted when its reconcile is dropped (timed out, or the controller stopping).
fn spawn_pass<F>(pass: F) -> tokio_util::task::AbortOnDropHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio_util::task::AbortOnDropHandle::new(tokio::spawn(pass))
}

/// One pass: observe → decide (pure, `rayshift_api::lifecycle`) → apply, then the status and the next wake-up.
async fn pass(cached: &RayService, ctx: &Context) -> Result<Action> {
    // This pass runs it: the health timer hands it back only if the pass ends settled.
    ctx.health.forget(&ObjectRef::from_obj(cached));
    let uid = cached.uid().unwrap_or_default();
    let Some(rs) = current(cached, ctx).await? else {
        ctx.retries.succeeded(&uid);
        return Ok(Action::await_change());
    };
    let previous = rs.status.clone().unwrap_or_default();
    if let Some(held) = held(&rs, ctx, &previous).await? {
        ctx.retries.succeeded(&uid);
        return Ok(held);
    }
    let now = Timestamp::now();
    let mut seen = observe(&rs, ctx, &previous).await?;
    adopt_kuberay_clusters(&rs, ctx, &seen.goal.clone(), &mut seen.clusters).await?;
    let decision = lifecycle::decide(&seen.facts(&rs, ctx, &previous, now));
    confirm_clusters(&rs, ctx, &seen, &decision).await?;
    let applied = apply(&rs, ctx, &previous, &seen, &decision).await?;
    let settled = settle_status(&rs, ctx, &previous, &seen, &decision, now).await?;
    if seen.dashboard_refused() {
        return Ok(Action::requeue(refused_wake(ctx, &uid, &seen, &decision, now)));
    }
    ctx.retries.succeeded(&uid);
    let next = next_wake(ctx, &seen, &decision, &applied, &settled, now);
    Ok(Action::requeue(watch_health(
        &rs, ctx, &seen, &decision, &applied, next,
    )))
}

/// Settled (nothing due within a health period, every proxy healthy): the shared health timer checks the
/// serving clusters from here on and wakes a pass on a change or at the resync; this pass's own requeue is
/// only a safety net behind the timer's resync.
fn watch_health(
    rs: &RayService,
    ctx: &Context,
    seen: &Observation,
    decision: &Decision,
    applied: &Applied,
    next: Duration,
) -> Duration {
    let period = ctx.options.serve_health_interval;
    let baseline = match health_baseline(rs, seen, decision) {
        Some(b) if next >= period && !applied.proxy_failing => b,
        _ => return next.min(period),
    };
    ctx.health
        .watch(ObjectRef::from_obj(rs), baseline, std::time::Instant::now());
    if next < ctx.options.resync_interval {
        next
    } else {
        ctx.options.resync_interval + period
    }
}

/// What the health timer expects of the active and pending clusters: the Serve status seen this pass and a
/// healthy proxy on each head in the serve Service. `None` when a cluster's Serve status was not read.
fn health_baseline(rs: &RayService, seen: &Observation, decision: &Decision) -> Option<Baseline> {
    let ns = rs.namespace().unwrap_or_default();
    let excluded = rs.spec.exclude_head_pod_from_serve_svc == Some(true);
    [&decision.active, &decision.pending]
        .into_iter()
        .flatten()
        .map(|name| {
            let s = seen.clusters.get(name)?;
            let proxy = s
                .head_pod
                .as_ref()
                .filter(|_| !excluded)
                .and_then(|pod| head_proxy(rs, &ns, name, pod))
                .map(|h| ProxyAddress {
                    pod: h.pod.to_string(),
                    pod_ip: h.pod_ip.to_string(),
                    port: h.port,
                });
            Some(ServingCluster {
                target: Target::of(&s.cluster),
                serve: s.serve.clone()?,
                proxy,
            })
        })
        .collect()
}

/// The RayService to act on, as fresh as this controller's own last write (the watch cache can lag behind it,
/// and acting on a stale status would move route weights backwards): the cached copy when it is at the
/// version last read or written here, else a read; `None` when there is nothing to do: someone else runs it
/// (then it is observed), it is gone, or it is being deleted.
async fn current(cached: &RayService, ctx: &Context) -> Result<Option<RayService>> {
    if !ctx.owns(cached) {
        ctx.observe(cached).await;
        return Ok(None);
    }
    // Handed over from KubeRay: observing it ends.
    ctx.observed_levels().remove(&cached.uid().unwrap_or_default());
    let ns = cached.namespace().unwrap_or_default();
    let rs = if ctx.is_known_version(cached) {
        cached.clone()
    } else {
        waiting::on(Waiting::api("get", "RayService"));
        let read = Api::<RayService>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&cached.name_any())
            .await?;
        let Some(rs) = read else {
            ctx.metrics.forget_service(&ns, &cached.name_any());
            return Ok(None);
        };
        ctx.saw_version(&rs);
        rs
    };
    if !ctx.owns(&rs) {
        return Ok(None);
    }
    let rs = release_kuberay_finalizer(rs, ctx).await?;
    if rs.meta().deletion_timestamp.is_some() {
        // Owner references let the garbage collector remove clusters and Services.
        ctx.forget(&ns, &rs.name_any(), &rs.uid().unwrap_or_default());
        return Ok(None);
    }
    Ok(Some(rs))
}

/// A RayService held back until the user acts: an invalid spec, or incremental mode without the Gateway API.
async fn held(rs: &RayService, ctx: &Context, previous: &RayServiceStatuses) -> Result<Option<Action>> {
    let verdict = validation::validate(rs, None, &validation_config(&ctx.options));
    if !verdict.allowed() {
        return invalid(rs, ctx, previous, &verdict.denial_message())
            .await
            .map(Some);
    }
    let ns = rs.namespace().unwrap_or_default();
    if incremental(rs, ctx) && !gateway_api_available(ctx, &ns).await {
        return gateway_api_missing(rs, ctx, previous).await.map(Some);
    }
    Ok(None)
}

fn incremental(rs: &RayService, ctx: &Context) -> bool {
    rs.spec.upgrade_type() == Some(UpgradeType::NewClusterWithIncrementalUpgrade)
        && ctx.options.feature_gates.incremental_upgrade()
}

/// Everything one pass reads: the RayService's clusters, their heads and (for the active and pending ones)
/// their Serve status.
struct Observation {
    incremental: bool,
    active: Option<String>,
    pending: Option<String>,
    goal: SpecDigests,
    clusters: BTreeMap<String, Seen>,
}

impl Observation {
    fn facts(&self, rs: &RayService, ctx: &Context, previous: &RayServiceStatuses, now: Timestamp) -> Facts {
        let zero_downtime = ctx.options.zero_downtime;
        Facts {
            strategy: rs
                .spec
                .upgrade_type_with(zero_downtime)
                .unwrap_or(UpgradeType::NewCluster),
            goal: self.goal.clone(),
            active: self.active.clone(),
            pending: self.pending.clone(),
            clusters: self.clusters.values().map(cluster_facts).collect(),
            deletion_delay: SignedDuration::from_secs(i64::from(rs.spec.deletion_delay_seconds().max(0))),
            now,
            new_name: children::cluster_name(&rs.name_any()),
            incremental: self.incremental,
            rejected_spec: self
                .incremental
                .then(|| previous.progress.rejected_spec_digest.clone())
                .flatten(),
            initialization: initializing::judge(
                rs.annotations(),
                previous.conditions.as_deref().unwrap_or_default(),
                self.active.is_some(),
                now,
            ),
        }
    }

    fn cluster(&self, name: &Option<String>) -> Option<&Seen> {
        name.as_ref().and_then(|n| self.clusters.get(n))
    }

    /// The first dashboard failure seen this pass.
    fn dashboard_problem(&self) -> Option<String> {
        self.clusters.values().find_map(|s| s.dashboard_error.clone())
    }

    fn dashboard_refused(&self) -> bool {
        self.clusters.values().any(|s| s.dashboard_refused)
    }
}

async fn observe(rs: &RayService, ctx: &Context, previous: &RayServiceStatuses) -> Result<Observation> {
    let ns = rs.namespace().unwrap_or_default();
    let side = |s: &Option<ClusterServiceStatus>| {
        s.as_ref()
            .and_then(|s| s.ray_cluster_name.clone())
            .filter(|n| !n.is_empty())
    };
    let (active, pending) = (
        side(&previous.active_service_status),
        side(&previous.pending_service_status),
    );
    let listed = match &ctx.caches {
        Some(caches) => caches.clusters_of(&ns, &rs.name_any()).await?,
        None => list_clusters(ctx, &ns, &rs.name_any()).await?,
    };
    // The clusters' Serve reads side by side: a pass waits for one dashboard answer, not one per cluster
    // (a step's pass observes inside its lead, and every pass holds a reconcile slot while it waits).
    let seen = futures::future::try_join_all(listed.into_iter().map(|cluster| {
        let name = cluster.name_any();
        let watched = Some(&name) == active.as_ref() || Some(&name) == pending.as_ref();
        observe_cluster(ctx, &ns, cluster, watched)
    }))
    .await?;
    let clusters = seen.into_iter().map(|s| (s.cluster.name_any(), s)).collect();
    Ok(Observation {
        incremental: incremental(rs, ctx),
        active,
        pending,
        goal: SpecDigests::of(&rs.spec.ray_cluster_config),
        clusters,
    })
}

async fn list_clusters(ctx: &Context, ns: &str, rs: &str) -> Result<Vec<RayCluster>> {
    let params = ListParams::default().labels(&children::cluster_selector(rs));
    waiting::on(Waiting::api("list", "RayCluster"));
    Ok(Api::<RayCluster>::namespaced(ctx.client.clone(), ns)
        .list(&params)
        .await?
        .items)
}

/// Before anything is created from cached reads: the apiserver must list the same clusters, or a cache that
/// has not yet seen a cluster this controller just created could make it create a second one.
async fn confirm_clusters(
    rs: &RayService,
    ctx: &Context,
    seen: &Observation,
    decision: &Decision,
) -> Result<()> {
    let creates = decision
        .actions
        .iter()
        .any(|a| matches!(a, ClusterAction::Create { .. }));
    if ctx.caches.is_none() || !creates {
        return Ok(());
    }
    let live = list_clusters(ctx, &rs.namespace().unwrap_or_default(), &rs.name_any()).await?;
    let same =
        live.len() == seen.clusters.len() && live.iter().all(|c| seen.clusters.contains_key(&c.name_any()));
    if same { Ok(()) } else { Err(Error::CacheBehind) }
}

/// One cluster's head and, when it is active or pending and its head is ready, its Serve status.
async fn observe_cluster(ctx: &Context, ns: &str, cluster: RayCluster, watched: bool) -> Result<Seen> {
    let (head_ready, head_message, head_pod) = head_health(ctx, ns, &cluster).await?;
    let (serve, dashboard_error, dashboard_refused) = if watched && head_ready {
        match ctx.dashboard.status(&Target::of(&cluster)).await {
            Ok(s) => (Some(s), None, false),
            Err(e) => (None, Some(e.to_string()), e.is_persistent()),
        }
    } else {
        (None, None, false)
    };
    Ok(Seen {
        cluster,
        head_ready,
        head_message,
        head_pod,
        serve,
        dashboard_error,
        dashboard_refused,
    })
}

/// What applying the decision found that decides when to look again.
struct Applied {
    pushed: bool,
    proxy_failing: bool,
}

/// Clusters, Serve configs, the head's serve label and the Services, as decided.
async fn apply(
    rs: &RayService,
    ctx: &Context,
    previous: &RayServiceStatuses,
    seen: &Observation,
    decision: &Decision,
) -> Result<Applied> {
    let ns = rs.namespace().unwrap_or_default();
    let clusters_api: Api<RayCluster> = Api::namespaced(ctx.client.clone(), &ns);
    apply_cluster_actions(rs, ctx, &clusters_api, decision, &seen.clusters, seen.incremental).await?;
    let pushed = push_serve_configs(rs, ctx, previous, seen, decision).await?;
    let mut applied = Applied {
        pushed,
        proxy_failing: false,
    };
    // Both heads' proxy checks side by side, as the Serve reads.
    let labels = [&decision.active, &decision.pending]
        .into_iter()
        .flatten()
        .filter_map(|name| seen.clusters.get(name).filter(|s| s.head_ready))
        .filter_map(|s| Some((s.cluster.name_any(), s.head_pod.as_ref()?)))
        .map(|(cluster, pod)| {
            let ns = ns.as_str();
            async move { update_head_serve_label(rs, ctx, ns, &cluster, pod).await }
        });
    for failing in futures::future::try_join_all(labels).await? {
        applied.proxy_failing |= failing;
    }
    if let Some(target) = &decision.serve_target {
        let head = children::head_service(rs, target, ctx.options.head_cluster_ip);
        apply_child::<Service>(ctx, &ns, head).await?;
        // Incremental mode routes through the Gateway to per-cluster serve Services instead.
        if !seen.incremental {
            let serve = children::serve_service(rs, target).ok_or(Error::NoServePort)?;
            apply_child::<Service>(ctx, &ns, serve).await?;
        }
    }
    // Clusters no longer active or pending need neither their config record nor their health count.
    let current: Vec<&str> = [&decision.active, &decision.pending]
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
    ctx.records().keep_only(&rs.uid().unwrap_or_default(), &current);
    if let Initialization::TimedOut { timeout, spent } = decision.initialization {
        let (spent, timeout) = (
            initializing::go_duration(spent),
            initializing::go_duration(timeout),
        );
        let note =
            format!("RayService initializing timeout exceeded after {spent} (configured timeout: {timeout})");
        ctx.event(
            rs,
            EventType::Warning,
            "RayServiceInitializingTimeout",
            "Reconcile",
            note,
        );
    }
    if let Some(p) = &decision.promoted {
        let from = seen.active.clone().unwrap_or_else(|| "none".into());
        let note = format!("Promoted RayCluster {ns}/{p} (was {from}): it serves all traffic now");
        ctx.event(rs, EventType::Normal, "Promoted", "Reconcile", note);
    }
    Ok(applied)
}

/// Serve config goes only to the clusters built from the current spec; returns whether any was pushed.
async fn push_serve_configs(
    rs: &RayService,
    ctx: &Context,
    previous: &RayServiceStatuses,
    seen: &Observation,
    decision: &Decision,
) -> Result<bool> {
    let ns = rs.namespace().unwrap_or_default();
    let mut pushed = false;
    for target in &decision.config_targets {
        if let Some(s) = seen
            .clusters
            .get(target)
            .filter(|s| s.head_ready && s.dashboard_error.is_none())
        {
            // In incremental mode the config carries the cluster's target_capacity (a new pending cluster: 0).
            let capacity = seen
                .incremental
                .then(|| target_capacity(previous, target, decision.active.is_none()))
                .flatten();
            pushed |= push_serve_config(rs, ctx, &ns, &s.cluster, capacity, s.serve.as_ref()).await?;
        }
    }
    Ok(pushed)
}

/// What writing the status left to wait for.
struct Settled {
    incremental_wake: Option<Duration>,
    dashboard_problem: Option<String>,
}

/// The new status (with the incremental upgrade's step, if any), its metrics, and the write if it changed.
async fn settle_status(
    rs: &RayService,
    ctx: &Context,
    previous: &RayServiceStatuses,
    seen: &Observation,
    decision: &Decision,
    now: Timestamp,
) -> Result<Settled> {
    let ns = rs.namespace().unwrap_or_default();
    let dashboard_problem = seen.dashboard_problem();
    let inputs = Settling {
        previous,
        seen,
        decision,
        dashboard_problem: dashboard_problem.as_deref(),
        now,
    };
    let mut status = lifecycle_status(rs, ctx, &ns, &inputs).await?;
    let advanced = match seen.incremental {
        // Failed to initialize: no cluster to step between (KubeRay skips the rest of its pass too).
        true if decision.initialization.failed() => None,
        true => Some(advance_upgrade(rs, ctx, seen, decision, &mut status, now).await?),
        false => {
            let active = seen.cluster(&decision.active).map(|s| &s.cluster);
            crate::incremental::follow_active(rs, ctx, active).await?;
            None
        }
    };
    ctx.metrics
        .observe_service(&ns, &rs.name_any(), &status, &ServiceView::of(rs, &status, now));
    if conditions::status_changed(Some(previous), &status) {
        write_status(rs, ctx, &status).await?;
    }
    // After the status: the annotation changes the resourceVersion the status write is checked against.
    if advanced.as_ref().is_some_and(|a| a.pause) {
        crate::incremental::pause(ctx, rs).await?;
    }
    let incremental_wake = advanced.and_then(|a| a.wake);
    if let Some(problem) = &dashboard_problem {
        tell_dashboard_problem(rs, ctx, previous, problem).await;
    }
    Ok(Settled {
        incremental_wake,
        dashboard_problem,
    })
}

/// What a pass settles the status from.
struct Settling<'a> {
    previous: &'a RayServiceStatuses,
    seen: &'a Observation,
    decision: &'a Decision,
    dashboard_problem: Option<&'a str>,
    now: Timestamp,
}

/// The lifecycle's status for what the pass saw (before the incremental step), counted in the metrics.
async fn lifecycle_status(
    rs: &RayService,
    ctx: &Context,
    ns: &str,
    s: &Settling<'_>,
) -> Result<RayServiceStatuses> {
    // Incremental mode serves from both clusters through the route: KubeRay counts the pending one's too.
    let pending = (s.seen.incremental && s.decision.serve_target.is_some())
        .then_some(s.decision.pending.as_ref())
        .flatten()
        .filter(|p| Some(*p) != s.decision.serve_target.as_ref());
    let mut endpoints = 0;
    for cluster in [s.decision.serve_target.as_ref(), pending].into_iter().flatten() {
        endpoints += serve_endpoints(ctx, &rs.uid().unwrap_or_default(), ns, cluster).await?;
    }
    let views = (s.seen.clusters.iter())
        .map(|(name, c)| (name.clone(), cluster_view(c)))
        .collect();
    let (status, tallies) = lifecycle::status::settle(&StatusInputs {
        generation: rs.metadata.generation.unwrap_or_default(),
        previous: s.previous,
        decision: s.decision,
        clusters: &views,
        endpoints,
        dashboard_problem: s.dashboard_problem,
        had_active: s.seen.active.is_some(),
        incremental: s.seen.incremental,
        now: s.now,
    });
    crate::incremental::count(ctx, rs, &tallies);
    let newest = s.decision.pending.as_ref().or(s.decision.active.as_ref());
    if let Some(c) = newest
        .and_then(|c| s.seen.clusters.get(c))
        .filter(|c| !c.head_ready)
    {
        tracing::debug!(note = %c.head_message, "head not ready");
    }
    Ok(status)
}

/// The incremental upgrade's step of this pass, on the clusters the lifecycle kept.
async fn advance_upgrade(
    rs: &RayService,
    ctx: &Context,
    seen: &Observation,
    decision: &Decision,
    status: &mut RayServiceStatuses,
    now: Timestamp,
) -> Result<crate::incremental::Advanced> {
    let (a, p) = (seen.cluster(&decision.active), seen.cluster(&decision.pending));
    fn serve(s: Option<&Seen>) -> Option<&ServeStatus> {
        s.filter(|s| s.head_ready).and_then(|s| s.serve.as_ref())
    }
    // A Gateway sends a cluster's share to its serve Service's ready endpoints: without one, that share fails.
    let excluded = rs.spec.exclude_head_pod_from_serve_svc == Some(true);
    let serving =
        |s: Option<&Seen>| excluded || s.and_then(|s| s.head_pod.as_ref()).is_some_and(in_serve_service);
    let pass = crate::incremental::Pass {
        rs,
        ctx,
        ns: &rs.namespace().unwrap_or_default(),
        active: a.map(|s| &s.cluster),
        pending: p.map(|s| &s.cluster),
        active_serve: serve(a),
        pending_serve: serve(p),
        active_serving: serving(a),
        pending_serving: serving(p),
        goal_spec: &seen.goal.spec,
        now,
    };
    crate::incremental::advance(&pass, status).await
}

/// One Warning event when a dashboard starts failing (not at every pass while it stays down).
async fn tell_dashboard_problem(
    rs: &RayService,
    ctx: &Context,
    previous: &RayServiceStatuses,
    problem: &str,
) {
    let conditions = previous.conditions.as_deref().unwrap_or_default();
    if conditions
        .iter()
        .any(|c| c.reason == reason::DASHBOARD_UNREACHABLE)
    {
        return;
    }
    let note = problem.to_string();
    ctx.event(rs, EventType::Warning, "DashboardUnreachable", "Reconcile", note);
}

/// Requeue only when something is due: a step, a deletion, a cluster still starting or Serve apps still
/// settling (nothing can be watched there; a starting cluster is watched, but a lost wake-up would otherwise
/// cost a whole resync), or a proxy to check.
fn next_wake(
    ctx: &Context,
    seen: &Observation,
    decision: &Decision,
    applied: &Applied,
    settled: &Settled,
    now: Timestamp,
) -> Duration {
    let settling = [&decision.active, &decision.pending]
        .into_iter()
        .flatten()
        .any(|c| {
            seen.clusters
                .get(c)
                .is_none_or(|s| !s.head_ready || !s.serve.as_ref().is_some_and(ServeStatus::all_running))
        });
    let waiting_for_serve = settling
        || applied.pushed
        || applied.proxy_failing
        || settled.dashboard_problem.is_some()
        || decision.promoted.is_some();
    let mut next = ctx.options.resync_interval;
    if let Some(wake) = settled.incremental_wake {
        next = next.min(wake);
    }
    if waiting_for_serve {
        next = next.min(ctx.options.serve_poll_interval);
    }
    if let Some(at) = decision.wake_at {
        next = next.min(until(at, now));
    }
    next
}

/// When to ask a dashboard that refused the call again: asked again, Ray (or RBAC) refuses again, so this
/// RayService backs off as a refused write does. A scheduled deletion or the initializing deadline still falls due
/// on time, and a cluster serving beside the refusing one is still looked at every health period.
fn refused_wake(
    ctx: &Context,
    uid: &str,
    seen: &Observation,
    decision: &Decision,
    now: Timestamp,
) -> Duration {
    let mut next = ctx.retries.failed(uid, true);
    if seen.clusters.values().any(|s| s.serve.is_some()) {
        next = next.min(ctx.options.serve_health_interval);
    }
    if let Some(at) = decision.wake_at {
        next = next.min(until(at, now));
    }
    next
}

/// How long from `now` to `at`, at least a moment.
fn until(at: Timestamp, now: Timestamp) -> Duration {
    Duration::from_secs_f64(at.duration_since(now).as_secs_f64().max(0.05))
}

pub fn validation_config(options: &ControllerOptions) -> ValidationConfig {
    let mut config = ValidationConfig {
        feature_gates: options.feature_gates.clone(),
        progress_deadline_seconds: options.progress_deadline_seconds,
        ..ValidationConfig::default()
    };
    if !config.managed_by_values.contains(&options.managed_by) {
        config.managed_by_values.push(options.managed_by.clone());
    }
    config
}

async fn invalid(
    rs: &RayService,
    ctx: &Context,
    previous: &RayServiceStatuses,
    message: &str,
) -> Result<Action> {
    let note = format!(
        "{}/{}: {message}",
        rs.namespace().unwrap_or_default(),
        rs.name_any()
    );
    let held = NotReady {
        reason: reason::VALIDATION_FAILED,
        event: "InvalidRayServiceSpec",
        action: "Validate",
    };
    held.record(rs, ctx, previous, message, note).await?;
    // Existing clusters keep running; nothing to do until the spec changes.
    Ok(Action::await_change())
}

/// Holding a RayService not Ready for a reason the user must fix: the condition, one Warning event when it
/// first appears, and a status write only then.
struct NotReady {
    reason: &'static str,
    event: &'static str,
    action: &'static str,
}

impl NotReady {
    async fn record(
        &self,
        rs: &RayService,
        ctx: &Context,
        previous: &RayServiceStatuses,
        message: &str,
        note: String,
    ) -> Result<()> {
        let mut status = previous.clone();
        let wanted = [Wanted::new(conditions::READY, false, self.reason, message)];
        let generation = rs.metadata.generation.unwrap_or_default();
        let prev = previous.conditions.as_deref().unwrap_or_default();
        status.conditions = Some(conditions::merge(
            prev,
            &wanted,
            &[],
            generation,
            &Time(Timestamp::now()),
        ));
        status.service_status = Some(String::new());
        if conditions::status_changed(Some(previous), &status) {
            ctx.event(rs, EventType::Warning, self.event, self.action, note);
            write_status(rs, ctx, &status).await?;
        }
        Ok(())
    }
}

fn cluster_facts(s: &Seen) -> ClusterFacts {
    let a = s.cluster.annotations();
    ClusterFacts {
        name: s.cluster.name_any(),
        spec_digest: a.get(SPEC_HASH_ANNOTATION).cloned(),
        scale_digest: a.get(SCALE_HASH_ANNOTATION).cloned(),
        worker_groups: a
            .get(NUM_WORKER_GROUPS_ANNOTATION)
            .and_then(|n| n.parse().ok())
            .unwrap_or(usize::MAX),
        delete_after: a.get(DELETE_AFTER_ANNOTATION).and_then(|t| t.parse().ok()),
        serving_ready: s.head_ready && s.serve.as_ref().is_some_and(ServeStatus::all_running),
    }
}

/// Head health from the RayCluster status and the head Pod's Ray container.
async fn head_health(ctx: &Context, ns: &str, cluster: &RayCluster) -> Result<(bool, String, Option<Pod>)> {
    if let Some(unready) = head_pod_unready(cluster) {
        return Ok((false, unready, None));
    }
    let name = cluster.name_any();
    let heads = match &ctx.caches {
        Some(caches) => caches.heads_of(ns, &name).await?,
        None => {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
            let selector = format!("{CLUSTER_LABEL}={name},{NODE_TYPE_LABEL}=head");
            waiting::on(Waiting::api("list", "Pod"));
            pods.list(&ListParams::default().labels(&selector)).await?.items
        }
    };
    Ok(judge_head(cluster, &heads))
}

/// Why the RayCluster's own status says its head is not ready, if it does.
fn head_pod_unready(cluster: &RayCluster) -> Option<String> {
    let conditions = cluster.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == "HeadPodReady")?;
    (c.status != "True").then(|| {
        let name = cluster.name_any();
        format!("RayCluster {name}: HeadPodReady is {} ({})", c.status, c.reason)
    })
}

/// The one head Pod's Ray container, found by name, must be running and ready (a Pod stays Running while a
/// sidecar lives, so the Pod phase says nothing about Ray).
fn judge_head(cluster: &RayCluster, heads: &[Pod]) -> (bool, String, Option<Pod>) {
    let [pod] = heads else {
        let name = cluster.name_any();
        return (
            false,
            format!("RayCluster {name}: {} head Pods", heads.len()),
            None,
        );
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return (false, format!("head Pod {} is terminating", pod.name_any()), None);
    }
    let template = &cluster.spec.head_group_spec.template;
    let ray = template
        .ray_container()
        .and_then(|c| c.name())
        .unwrap_or("ray-head");
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref());
    let Some(container) = statuses.and_then(|cs| cs.iter().find(|c| c.name == ray)) else {
        let why = format!("head Pod {} has no status for container {ray}", pod.name_any());
        return (false, why, Some(pod.clone()));
    };
    let running = container.state.as_ref().is_some_and(|s| s.running.is_some());
    if running && container.ready {
        (true, String::new(), Some(pod.clone()))
    } else {
        let why = format!(
            "Ray container {ray} of head Pod {} is not running and ready",
            pod.name_any()
        );
        (false, why, Some(pod.clone()))
    }
}

/// KubeRay's `updateHeadPodServeLabel`: the head Pod is behind the serve Services (`ray.io/serve=true`)
/// only while its Serve proxy answers its health check, and never with `excludeHeadPodFromServeSvc`.
/// A healthy proxy joins at once; an unhealthy one leaves after a few failed checks in a row, so one slow
/// answer on a busy head does not take it out of service.
/// Returns whether the proxy failed its check (then it is checked again soon).
async fn update_head_serve_label(
    rs: &RayService,
    ctx: &Context,
    ns: &str,
    cluster: &str,
    pod: &Pod,
) -> Result<bool> {
    let pod_name = pod.name_any();
    let owner = rs.uid().unwrap_or_default();
    let current = pod.labels().get(SERVE_LABEL).map(String::as_str);
    let (want, failing) = match rs.spec.exclude_head_pod_from_serve_svc {
        Some(true) => (false, false),
        _ => serve_label_wanted(rs, ctx, ns, &owner, cluster, pod, current == Some("true")).await,
    };
    let want = if want { "true" } else { "false" };
    let pod_uid = pod.uid().unwrap_or_default();
    let version = pod.resource_version().unwrap_or_default();
    if current == Some(want)
        || ctx
            .records()
            .serve_label_written_over(&owner, cluster, &pod_uid, &version, want)
    {
        return Ok(failing);
    }
    let patch = json!({"metadata": {"labels": {SERVE_LABEL: want}}});
    ctx.before_write("Pod", "patch")?;
    Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .patch(&pod_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let write = LabelWrite {
        pod_uid,
        replaced_version: version,
        value: want,
    };
    ctx.records().set_serve_label(&owner, cluster, write);
    ctx.event(
        rs,
        EventType::Normal,
        "UpdatedHeadPodServeLabel",
        "Update",
        format!("Updated the serve label to \"{want}\" for the Head Pod {ns}/{pod_name}"),
    );
    Ok(failing)
}

/// Whether the head belongs in the serve Service, and whether its proxy's health check failed: in while
/// healthy, out after 3 failed checks in a row (one failure does not take a serving head out).
async fn serve_label_wanted(
    rs: &RayService,
    ctx: &Context,
    ns: &str,
    owner: &str,
    cluster: &str,
    pod: &Pod,
    serving: bool,
) -> (bool, bool) {
    const FAILURES_BEFORE_REMOVAL: u32 = 3;
    let healthy = match head_proxy(rs, ns, cluster, pod) {
        Some(head) => {
            ctx.dashboard
                .proxy_healthy(&ctx.options.serve_health_url_template, &head)
                .await
        }
        None => false,
    };
    let mut records = ctx.records();
    if healthy {
        records.proxy_healthy(owner, cluster);
        return (true, false);
    }
    let n = records.proxy_failed(owner, cluster);
    (serving && n < FAILURES_BEFORE_REMOVAL, true)
}

/// Where the head Pod's Serve proxy takes requests, once the Pod has an IP.
fn head_proxy<'a>(rs: &RayService, ns: &'a str, cluster: &'a str, pod: &'a Pod) -> Option<HeadProxy<'a>> {
    Some(HeadProxy {
        namespace: ns,
        cluster,
        pod: pod.metadata.name.as_deref()?,
        pod_ip: pod.status.as_ref()?.pod_ip.as_deref()?,
        port: children::serve_port(rs),
    })
}

/// A Ready Pod carrying the serve label: an endpoint of its cluster's serve Service.
fn in_serve_service(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.labels().get(SERVE_LABEL).map(String::as_str) == Some("true")
        && pod_ready(pod)
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Serving Pods behind a cluster's serve Service (Ready and carrying the serve label): its head and serving
/// workers from the caches, or listed where the context has none. A head's serve label written earlier in
/// this pass counts at once, as a list after the write would show it.
async fn serve_endpoints(ctx: &Context, owner: &str, ns: &str, cluster: &str) -> Result<i32> {
    let pods = match &ctx.caches {
        Some(caches) => {
            let heads = caches.heads_of(ns, cluster).await?;
            let mut pods: Vec<Pod> = (heads.into_iter())
                .map(|head| with_written_serve_label(ctx, owner, cluster, head))
                .collect();
            pods.extend(caches.serving_workers_of(ns, cluster).await?);
            pods
        }
        None => {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
            let selector = format!("{CLUSTER_LABEL}={cluster},{SERVE_LABEL}=true");
            waiting::on(Waiting::api("list", "Pod"));
            pods.list(&ListParams::default().labels(&selector)).await?.items
        }
    };
    let ready = pods.iter().filter(|p| in_serve_service(p)).count();
    Ok(i32::try_from(ready).unwrap_or(i32::MAX))
}

/// The head as the cache will show it once it catches up with the serve label this controller wrote.
fn with_written_serve_label(ctx: &Context, owner: &str, cluster: &str, mut head: Pod) -> Pod {
    let (uid, version) = (
        head.uid().unwrap_or_default(),
        head.resource_version().unwrap_or_default(),
    );
    if let Some(value) = ctx.records().serve_label_over(owner, cluster, &uid, &version) {
        head.labels_mut()
            .insert(SERVE_LABEL.to_string(), value.to_string());
    }
    head
}

/// Taking over from KubeRay (a handover): each of the RayService's clusters that KubeRay built gets
/// rayshift's digests of its own spec, so that the lifecycle keeps a cluster that already runs the current
/// spec instead of starting a needless upgrade.
async fn adopt_kuberay_clusters(
    rs: &RayService,
    ctx: &Context,
    goal: &SpecDigests,
    seen: &mut BTreeMap<String, Seen>,
) -> Result<()> {
    let api: Api<RayCluster> = Api::namespaced(ctx.client.clone(), &rs.namespace().unwrap_or_default());
    for s in seen
        .values_mut()
        .filter(|s| !s.cluster.annotations().contains_key(SPEC_HASH_ANNOTATION))
    {
        let adoption = Adoption::of(&s.cluster.spec, goal);
        let patch = json!({"metadata": {"annotations": {
            SPEC_HASH_ANNOTATION: adoption.digests.spec, SCALE_HASH_ANNOTATION: adoption.digests.scale,
            NUM_WORKER_GROUPS_ANNOTATION: adoption.worker_groups.to_string()}}});
        ctx.before_write("RayCluster", "patch")?;
        s.cluster = api
            .patch(
                &s.cluster.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        let outcome = if adoption.matches_goal {
            "it runs the current spec and is kept as it is"
        } else {
            "its spec differs from the current one"
        };
        let note = format!(
            "Adopted RayCluster {} (built by KubeRay): {outcome}",
            s.cluster.name_any()
        );
        ctx.event(rs, EventType::Normal, "AdoptedRayCluster", "Reconcile", note);
    }
    Ok(())
}

/// KubeRay (v1.6.2+) puts its finalizer on the RayServices it runs and never removes it from one handed over
/// to another controller; left there, the RayService could never be deleted. rayshift's owner references do
/// that finalizer's work (the garbage collector removes the clusters).
/// Returns the RayService as it is after the patch (the pass goes on with its new resourceVersion).
async fn release_kuberay_finalizer(rs: RayService, ctx: &Context) -> Result<RayService> {
    let finalizers = rs.finalizers();
    if !finalizers.iter().any(|f| f == KUBERAY_FINALIZER) {
        return Ok(rs);
    }
    let kept: Vec<&String> = finalizers.iter().filter(|f| *f != KUBERAY_FINALIZER).collect();
    // `test` first: a finalizer added or removed meanwhile makes the patch fail instead of dropping it.
    let path = || json_patch::jsonptr::PointerBuf::from_tokens(["metadata", "finalizers"]);
    let patch = json_patch::Patch(vec![
        PatchOperation::Test(TestOperation {
            path: path(),
            value: json!(finalizers),
        }),
        PatchOperation::Replace(ReplaceOperation {
            path: path(),
            value: json!(kept),
        }),
    ]);
    let api: Api<RayService> = Api::namespaced(ctx.client.clone(), &rs.namespace().unwrap_or_default());
    ctx.before_write("RayService", "patch")?;
    let released = api
        .patch(&rs.name_any(), &PatchParams::default(), &Patch::Json::<()>(patch))
        .await?;
    ctx.saw_version(&released);
    let note = format!("Removed KubeRay's finalizer {KUBERAY_FINALIZER}: rayshift runs this RayService now");
    ctx.event(
        &released,
        EventType::Normal,
        "ReleasedKubeRayFinalizer",
        "Reconcile",
        note,
    );
    Ok(released)
}

async fn apply_cluster_actions(
    rs: &RayService,
    ctx: &Context,
    api: &Api<RayCluster>,
    decision: &Decision,
    seen: &BTreeMap<String, Seen>,
    incremental: bool,
) -> Result<()> {
    let w = ClusterWrites {
        rs,
        ctx,
        api,
        ns: rs.namespace().unwrap_or_default(),
    };
    for action in &decision.actions {
        match action {
            // A pending cluster of an incremental upgrade starts from minReplicas, as in KubeRay.
            ClusterAction::Create { name } => {
                w.create(name, incremental && decision.active.is_some()).await?
            }
            ClusterAction::UpdateSpec { name } => w.update_spec(name, seen.get(name)).await?,
            ClusterAction::UpdateScale { name } => {
                let Some(s) = seen.get(name) else { continue };
                w.update_scale(name, s).await?;
            }
            ClusterAction::ScheduleDeletion { name, at } => {
                let patch = json!({"metadata": {"annotations": {DELETE_AFTER_ANNOTATION: at.to_string()}}});
                w.merge(name, &patch).await?;
            }
            ClusterAction::Delete { name } => w.delete(name).await?,
        }
    }
    Ok(())
}

/// The writes of a pass's cluster actions, with their Events.
struct ClusterWrites<'a> {
    rs: &'a RayService,
    ctx: &'a Context,
    api: &'a Api<RayCluster>,
    ns: String,
}

impl ClusterWrites<'_> {
    async fn create(&self, name: &str, unset_replicas: bool) -> Result<()> {
        let config = self.rs.spec.serve_config_v2.as_deref().unwrap_or_default();
        let body = children::ray_cluster(self.rs, name, None, unset_replicas, Some(config));
        self.apply(name, &body).await?;
        let note = format!("Created RayCluster {}/{name}", self.ns);
        self.ctx
            .event(self.rs, EventType::Normal, "CreatedRayCluster", "Create", note);
        Ok(())
    }

    async fn update_spec(&self, name: &str, seen: Option<&Seen>) -> Result<()> {
        // Keep the replica counts the autoscaler chose.
        let keep = seen
            .filter(|_| self.rs.spec.ray_cluster_config.autoscaling_enabled())
            .map(|s| current_replicas(&s.cluster));
        let config = recorded_config(self.rs, self.ctx, name, seen.map(|s| &s.cluster));
        let body = children::ray_cluster(self.rs, name, keep.as_ref(), false, config.as_deref());
        self.apply(name, &body).await?;
        let note = format!("Updated RayCluster {}/{name} in place", self.ns);
        self.ctx
            .event(self.rs, EventType::Normal, "UpdatedRayCluster", "Update", note);
        Ok(())
    }

    async fn update_scale(&self, name: &str, seen: &Seen) -> Result<()> {
        self.merge(name, &scale_patch(self.rs, &seen.cluster)).await?;
        let note = format!(
            "Updated worker replicas of RayCluster {}/{name} in place",
            self.ns
        );
        self.ctx
            .event(self.rs, EventType::Normal, "UpdatedRayCluster", "Update", note);
        Ok(())
    }

    /// Server-side apply of a whole RayCluster with rayshift's field manager.
    async fn apply(&self, name: &str, body: &Value) -> Result<()> {
        self.ctx.before_write("RayCluster", "apply")?;
        let params = PatchParams::apply(&self.ctx.options.field_manager).force();
        self.api.patch(name, &params, &Patch::Apply(body)).await?;
        Ok(())
    }

    async fn merge(&self, name: &str, patch: &Value) -> Result<()> {
        self.ctx.before_write("RayCluster", "patch")?;
        self.api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        Ok(())
    }

    /// Deletes a cluster rayshift no longer needs, never the one the serve Service still selects.
    async fn delete(&self, name: &str) -> Result<()> {
        let (rs, ctx, ns) = (self.rs, self.ctx, &self.ns);
        if serving_cluster(&ctx.client, rs).await?.as_deref() == Some(name) {
            tracing::warn!(cluster = %name, "not deleting: the serve Service still selects it");
            return Ok(());
        }
        ctx.before_write("RayCluster", "delete")?;
        match self.api.delete(name, &DeleteParams::background()).await {
            Ok(_) => ctx.event(
                rs,
                EventType::Normal,
                "DeletedRayCluster",
                "Delete",
                format!("Deleted RayCluster {ns}/{name}"),
            ),
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => {
                ctx.event(
                    rs,
                    EventType::Warning,
                    "FailedToDeleteRayCluster",
                    "Delete",
                    format!("{ns}/{name}: {e}"),
                );
                return Err(e.into());
            }
        }
        Ok(())
    }
}

/// The Serve config recorded on a cluster: what this controller last pushed to it, else its annotation (the
/// cache can lag behind the patch that recorded a push, and a stale text would undo that push).
pub(crate) fn recorded_config(
    rs: &RayService,
    ctx: &Context,
    name: &str,
    cluster: Option<&RayCluster>,
) -> Option<String> {
    let owner = rs.uid().unwrap_or_default();
    ctx.records()
        .pushed_config(&owner, name)
        .map(str::to_string)
        .or_else(|| cluster?.annotations().get(SERVE_CONFIG_ANNOTATION).cloned())
}

fn current_replicas(cluster: &RayCluster) -> BTreeMap<String, Value> {
    cluster
        .spec
        .worker_groups()
        .iter()
        .filter_map(|g| g.replicas.map(|r| (g.group_name.clone(), Value::from(r))))
        .collect()
}

/// min/max replicas from the spec onto the existing groups, and `replicas` too when no autoscaler owns it
/// (the list is replaced whole by a merge patch).
fn scale_patch(rs: &RayService, cluster: &RayCluster) -> Value {
    let config = &rs.spec.ray_cluster_config;
    let goal: BTreeMap<&str, _> = config
        .worker_groups()
        .iter()
        .map(|g| {
            (
                g.group_name.as_str(),
                (g.min_replicas, g.max_replicas, g.replicas),
            )
        })
        .collect();
    let replicas_too = !config.autoscaling_enabled();
    let mut groups = serde_json::to_value(cluster.spec.worker_groups()).unwrap_or(Value::Array(Vec::new()));
    for g in groups.as_array_mut().into_iter().flatten() {
        let Some((min, max, replicas)) = g
            .get("groupName")
            .and_then(Value::as_str)
            .and_then(|n| goal.get(n))
            .copied()
        else {
            continue;
        };
        g["minReplicas"] = min.map_or(Value::Null, Value::from);
        g["maxReplicas"] = max.map_or(Value::Null, Value::from);
        if replicas_too && let Some(r) = replicas {
            g["replicas"] = Value::from(r);
        }
    }
    let digests = SpecDigests::of(&rs.spec.ray_cluster_config);
    // The groups list is replaced whole: only on top of the cluster as it was read.
    json!({"metadata": {"resourceVersion": cluster.resource_version(), "annotations": {SCALE_HASH_ANNOTATION: digests.scale}},
           "spec": {"workerGroupSpecs": groups}})
}

/// The cluster the serve Service selects now, if any.
async fn serving_cluster(client: &Client, rs: &RayService) -> Result<Option<String>> {
    let services: Api<Service> = Api::namespaced(client.clone(), &rs.namespace().unwrap_or_default());
    waiting::on(Waiting::api("get", "Service"));
    let svc = services.get_opt(&children::serve_service_name(rs)).await?;
    Ok(svc
        .and_then(|s| s.spec)
        .and_then(|s| s.selector)
        .and_then(|sel| sel.get(CLUSTER_LABEL).cloned()))
}

/// PUTs the spec's Serve config when it differs from what this cluster runs (`recorded_config`) or it lost
/// its apps, then records on the cluster which config it runs; returns whether it pushed.
async fn push_serve_config(
    rs: &RayService,
    ctx: &Context,
    ns: &str,
    cluster: &RayCluster,
    target_capacity: Option<i32>,
    serve: Option<&ServeStatus>,
) -> Result<bool> {
    let name = cluster.name_any();
    let text = rs.spec.serve_config_v2.clone().unwrap_or_default();
    let owner = rs.uid().unwrap_or_default();
    // The cluster's record, not only this process's: a restarted controller or a new leader pushes nothing
    // (and says nothing) for a config the cluster already runs.
    let unchanged = recorded_config(rs, ctx, &name, Some(cluster)).as_deref() == Some(text.as_str());
    let has_apps = serve.is_some_and(|s| !s.applications.is_empty());
    if unchanged && has_apps {
        return Ok(false);
    }
    let config = dashboard::serve_config_json(&text, target_capacity)?;
    ctx.ensure_leader()?;
    match ctx.dashboard.put_config(&Target::of(cluster), &config).await {
        Ok(()) => {
            ctx.records().set_pushed_config(&owner, &name, &text);
            if cluster.annotations().get(SERVE_CONFIG_ANNOTATION) != Some(&text) {
                let patch = json!({"metadata": {"annotations": {SERVE_CONFIG_ANNOTATION: text}}});
                ctx.before_write("RayCluster", "patch")?;
                Api::<RayCluster>::namespaced(ctx.client.clone(), ns)
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            ctx.event(
                rs,
                EventType::Normal,
                "UpdatedServeApplications",
                "Update",
                format!("Updated serve applications on RayCluster {ns}/{name}"),
            );
            Ok(true)
        }
        Err(e) => {
            ctx.event(
                rs,
                EventType::Warning,
                "FailedToUpdateServeApplications",
                "Update",
                e.to_string(),
            );
            Err(e)
        }
    }
}

/// The target capacity recorded for a cluster; a cluster not yet in status gets KubeRay's start value.
fn target_capacity(status: &RayServiceStatuses, cluster: &str, first: bool) -> Option<i32> {
    let recorded = [&status.active_service_status, &status.pending_service_status]
        .into_iter()
        .flatten()
        .find(|s| s.ray_cluster_name.as_deref() == Some(cluster))
        .and_then(|s| s.target_capacity);
    Some(recorded.unwrap_or(if first { 100 } else { 0 }))
}

async fn gateway_api_available(ctx: &Context, ns: &str) -> bool {
    use std::sync::atomic::Ordering;
    if ctx.gateway_api.load(Ordering::Relaxed) {
        return true;
    }
    let routes: Api<gateway_api::httproutes::HttpRoute> = Api::namespaced(ctx.client.clone(), ns);
    waiting::on(Waiting::api("list", "HTTPRoute"));
    let ok = routes.list(&ListParams::default().limit(1)).await.is_ok();
    ctx.gateway_api.store(ok, Ordering::Relaxed);
    ok
}

/// The REP's key requirement: no Gateway API, no crash, a clear condition and event.
async fn gateway_api_missing(
    rs: &RayService,
    ctx: &Context,
    previous: &RayServiceStatuses,
) -> Result<Action> {
    let message = "NewClusterWithIncrementalUpgrade needs the Gateway API (gateway.networking.k8s.io/v1 Gateway and HTTPRoute CRDs) and a Gateway controller; install them or use NewCluster";
    let held = NotReady {
        reason: reason::GATEWAY_API_UNAVAILABLE,
        event: "GatewayAPIUnavailable",
        action: "Reconcile",
    };
    held.record(rs, ctx, previous, message, message.to_string())
        .await?;
    Ok(Action::requeue(Duration::from_secs(60)))
}

/// A cluster as the status shows it: its head, its Serve apps (when the dashboard answered), its status.
fn cluster_view(s: &Seen) -> ClusterView {
    ClusterView {
        head_ready: s.head_ready,
        apps: s.serve.as_ref().map(app_statuses),
        cluster_status: s
            .cluster
            .status
            .as_ref()
            .and_then(|st| serde_json::to_value(st).ok()),
    }
}

fn app_statuses(serve: &ServeStatus) -> BTreeMap<String, AppStatus> {
    serve
        .applications
        .iter()
        .map(|(name, app)| {
            let deployments = app
                .deployments
                .iter()
                .map(|(d, s)| {
                    (
                        d.clone(),
                        ServeDeploymentStatus {
                            status: Some(s.status.clone()),
                            message: Some(s.message.clone()),
                            ..Default::default()
                        },
                    )
                })
                .collect();
            let name = if name.is_empty() {
                "default".to_string()
            } else {
                name.clone()
            };
            (
                name,
                AppStatus {
                    status: Some(app.status.clone()),
                    message: Some(app.message.clone()),
                    serve_deployment_statuses: Some(deployments),
                    ..Default::default()
                },
            )
        })
        .collect()
}

/// Writes the status with a merge patch; sides that are gone are removed explicitly.
async fn write_status(rs: &RayService, ctx: &Context, status: &RayServiceStatuses) -> Result<()> {
    let mut status = status.clone();
    status.last_update_time = Some(Time(Timestamp::now()));
    let new = serde_json::to_value(&status).expect("status serializes");
    // A merge patch removes only what it sets to null: compute it against the stored status so that
    // anything rayshift dropped (a pending side, a finished abort) really goes away.
    let old = rs
        .status
        .as_ref()
        .map(|s| serde_json::to_value(s).expect("status serializes"))
        .unwrap_or(Value::Null);
    let api: Api<RayService> = Api::namespaced(ctx.client.clone(), &rs.namespace().unwrap_or_default());
    // The patch is a diff against the status this pass read: with its resourceVersion, a status changed
    // meanwhile makes the write a conflict (the pass is retried on a fresh read), never an overwrite.
    let body = json!({
        "metadata": {"resourceVersion": rs.resource_version()},
        "status": merge_patch(&old, &new),
    });
    ctx.before_write("RayService", "status")?;
    let written = api
        .patch_status(&rs.name_any(), &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    ctx.saw_version(&written);
    Ok(())
}

/// The RFC 7386 merge patch that turns `old` into `new`.
pub(crate) fn merge_patch(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = serde_json::Map::new();
            for (k, v) in n {
                match o.get(k) {
                    Some(ov) if ov == v => {}
                    Some(ov) => {
                        patch.insert(k.clone(), merge_patch(ov, v));
                    }
                    None => {
                        patch.insert(k.clone(), v.clone());
                    }
                }
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                patch.insert(k.clone(), Value::Null);
            }
            Value::Object(patch)
        }
        _ => new.clone(),
    }
}

/// Requeue with backoff after an error; the error is logged and counted, never fatal.
pub fn error_policy(rs: Arc<RayService>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_error(error.category());
    // A conflict means the cache may be behind a write it has not seen: the next pass reads.
    ctx.forget_version(&rs);
    if error.is_conflict() || matches!(error, Error::CacheBehind) {
        // Someone wrote in between, or the cache has not seen it yet: read again soon rather than back off.
        tracing::info!(rayservice = %rs.name_any(), namespace = ?rs.namespace(), %error, "write conflict: re-reading");
        return Action::requeue(Duration::from_millis(200));
    }
    let retry = ctx
        .retries
        .failed(&rs.uid().unwrap_or_default(), error.is_persistent());
    tracing::warn!(rayservice = %rs.name_any(), namespace = ?rs.namespace(), %error, ?retry, "reconcile failed");
    if error.is_worth_an_event() {
        // The same message again joins its series, so a RayService failing for one reason shows one Event.
        ctx.event(
            &rs,
            EventType::Warning,
            "ReconcileFailed",
            "Reconcile",
            error.to_string(),
        );
    }
    Action::requeue(retry)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::merge_patch;

    /// A pass abandoned at its timeout stops: its task is aborted, so it writes nothing afterwards.
    #[tokio::test]
    async fn a_dropped_pass_task_stops() {
        let wrote = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = super::spawn_pass({
            let wrote = wrote.clone();
            async move {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                wrote.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let timed_out = tokio::time::timeout(std::time::Duration::from_millis(10), task).await;
        assert!(timed_out.is_err());
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!wrote.load(std::sync::atomic::Ordering::SeqCst));
    }

    /// The head is judged by its Ray container, found by the template's name, not by the Pod's phase.
    #[test]
    fn a_head_is_healthy_only_with_its_ray_container_running_and_ready() {
        let cluster: rayshift_api::RayCluster = serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "llm-abcde"},
            "spec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray"}, {"name": "sidecar", "image": "busybox"}]}}}}
        }))
        .unwrap();
        let pod = |ray_ready: bool, deleting: bool| -> k8s_openapi::api::core::v1::Pod {
            let running = json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}});
            let mut pod = json!({"metadata": {"name": "llm-abcde-head"}, "status": {"phase": "Running",
                "containerStatuses": [
                    {"name": "sidecar", "ready": true, "restartCount": 0, "image": "", "imageID": "", "state": running},
                    {"name": "ray-head", "ready": ray_ready, "restartCount": 0, "image": "", "imageID": "", "state": running}]}});
            if deleting {
                pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            serde_json::from_value(pod).unwrap()
        };
        let judged = |heads: &[k8s_openapi::api::core::v1::Pod]| {
            let (healthy, why, _) = super::judge_head(&cluster, heads);
            (healthy, why)
        };
        assert_eq!(judged(&[pod(true, false)]), (true, String::new()));
        let (healthy, why) = judged(&[pod(false, false)]);
        assert!(!healthy && why.contains("Ray container ray-head"), "{why}");
        let (healthy, why) = judged(&[pod(true, true)]);
        assert!(!healthy && why.contains("terminating"), "{why}");
        let (healthy, why) = judged(&[pod(true, false), pod(true, false)]);
        assert!(!healthy && why.contains("2 head Pods"), "{why}");
        assert!(!judged(&[]).0);
    }

    #[test]
    fn merge_patch_removes_what_is_gone() {
        let old = json!({"a": 1, "pending": {"name": "x"}, "extra": {"abort": {"r": 1}, "keep": 2}});
        let new = json!({"a": 2, "extra": {"keep": 2}});
        let patch = merge_patch(&old, &new);
        assert_eq!(patch, json!({"a": 2, "pending": null, "extra": {"abort": null}}));
        let mut applied = old.clone();
        json_patch::merge(&mut applied, &patch);
        assert_eq!(applied, new);
    }
}
