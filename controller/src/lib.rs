//! rayshift's RayService controller (kube-runtime): observe → plan (pure, in `rayshift-api`) → apply.

pub mod apiserver;
pub mod children;
pub mod cluster_records;
pub mod context;
pub mod dashboard;
mod direct_http;
pub mod error;
pub mod events;
pub mod health_timer;
pub mod incremental;
pub mod label_index;
pub mod leader;
pub mod metrics;
mod rayservice_gauges;
pub mod reconcile;
pub mod retry;
pub mod slo;
pub mod slots;
pub mod waiting;

use std::{sync::Arc, time::Duration};

pub use error::{Error, Result};
use futures::StreamExt;
use gateway_api::{gateways::Gateway, grpcroutes::GrpcRoute, httproutes::HttpRoute};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{
        Controller, WatchStreamExt, controller,
        reflector::{self, ObjectRef},
        watcher,
    },
};
use rayshift_api::{
    RayCluster, RayService, gateway_attachment::Attachment, rayservice::LAST_APPLIED_ANNOTATION,
};
use tokio::sync::watch as signal;

pub use crate::context::{Context, ControllerOptions, DEFAULT_CONCURRENCY, Mode};
use crate::{health_timer::HealthTimer, label_index::LabelIndex};

/// `/readyz` of the controller: ready once it knows whether it leads and, while it leads (or without leader
/// election), once its RayService cache has synced.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    synced: Arc<std::sync::atomic::AtomicBool>,
    leadership: Option<Arc<leader::Leadership>>,
}

impl Readiness {
    pub fn for_config(config: &RunConfig) -> Self {
        Self {
            synced: config.readiness.synced.clone(),
            leadership: config.leader_election.as_ref().map(|e| e.leadership.clone()),
        }
    }

    pub fn ready(&self) -> bool {
        let synced = self.synced.load(std::sync::atomic::Ordering::Relaxed);
        match &self.leadership {
            None => synced,
            Some(l) => l.known() && (!l.leading() || synced),
        }
    }

    fn set_synced(&self, synced: bool) {
        self.synced.store(synced, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Everything [`run`] needs besides the client.
pub struct RunConfig {
    pub namespace: Option<String>,
    pub options: ControllerOptions,
    pub dashboard_route: dashboard::Route,
    pub dashboard_timeout: Duration,
    /// Dashboard requests in flight at once, every cluster together.
    pub dashboard_max_in_flight: u16,
    /// `None`: this replica always reconciles.
    pub leader_election: Option<leader::LeaderElection>,
    pub readiness: Readiness,
}

/// Runs the controller until `shutdown` flips to true; with leader election, only while leading.
pub async fn run(
    client: Client,
    mut config: RunConfig,
    registry: &prometheus::Registry,
    shutdown: signal::Receiver<bool>,
) -> Result<()> {
    let metrics = metrics::Metrics::register(registry)?;
    let Some(election) = config.leader_election.take() else {
        metrics.set_leader(true);
        return run_controller(client, &config, metrics, None, shutdown).await;
    };
    let leadership = election.leadership.clone();
    let (leader_tx, mut leading) = signal::channel(false);
    let campaign = tokio::spawn(election.run(client.clone(), leader_tx, shutdown.clone()));
    let mut global = shutdown.clone();
    loop {
        metrics.set_leader(false);
        tokio::select! {
            _ = global.wait_for(|s| *s) => break,
            r = leading.wait_for(|l| *l) => if r.is_err() { break },
        }
        metrics.set_leader(true);
        // Stop reconciling as soon as leadership is lost (or on shutdown).
        let (stop_tx, stop_rx) = signal::channel(false);
        let (mut lost, mut global2) = (leading.clone(), shutdown.clone());
        let watchdog = tokio::spawn(async move {
            tokio::select! {
                _ = lost.wait_for(|l| !*l) => {},
                _ = global2.wait_for(|s| *s) => {},
            }
            let _ = stop_tx.send(true);
        });
        // A pass still running when leadership goes checks it again right before each write.
        let writes_while = Some(leadership.clone());
        run_controller(client.clone(), &config, metrics.clone(), writes_while, stop_rx).await?;
        config.readiness.set_synced(false);
        watchdog.abort();
        if *shutdown.borrow() {
            break;
        }
        tracing::warn!("leadership lost: reconciling stopped until it is regained");
    }
    metrics.set_leader(false);
    let _ = campaign.await;
    Ok(())
}

fn forget_gone(ctx: &Context, listed: &reflector::Store<Listed>, event: &watcher::Event<Listed>) {
    match event {
        watcher::Event::Delete(rs) => {
            let ns = rs.namespace().unwrap_or_default();
            tracing::info!(rayservice = %rs.name_any(), namespace = %ns, "deleted: its series and records are dropped");
            ctx.forget(&ns, &rs.name_any(), &rs.uid().unwrap_or_default());
        }
        watcher::Event::InitDone => {
            let present: Vec<(String, String, String)> = listed
                .state()
                .iter()
                .map(|rs| {
                    (
                        rs.namespace().unwrap_or_default(),
                        rs.name_any(),
                        rs.uid().unwrap_or_default(),
                    )
                })
                .collect();
            ctx.forget_all_but(&present);
        }
        _ => {}
    }
}

/// One namespace, or all of them.
fn api<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Retries of one broken watch: from 100 ms, doubling, at most 2 s, back to 100 ms once events flow
/// (kube-runtime's default, client-go's, goes from 800 ms up to 30 s).
#[derive(Clone, Debug)]
pub struct RecoveryBackoff {
    next: Duration,
}

impl RecoveryBackoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(2);

    pub fn new() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Default for RecoveryBackoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Iterator for RecoveryBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (now * 2).min(Self::MAX);
        Some(now)
    }
}

impl kube::runtime::utils::Backoff for RecoveryBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// The controller's merged trigger stream never pauses on an error: each watch backs off on its own. By
/// default kube-runtime pauses all triggers after each error; after a kube-apiserver restart the 410s of
/// the eight watches then surfaced one pause at a time, the pause grew past 50 s, and an upgrade waited
/// that long for a route status it had already been sent (tests/chaos_e2e.rs).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPause;

impl Iterator for NoPause {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl kube::runtime::utils::Backoff for NoPause {
    fn reset(&mut self) {}
}

/// RayClusters created for RayServices (KubeRay's label), the ones rayshift owns and watches.
fn owned() -> watcher::Config {
    watcher::Config::default().labels("ray.io/originated-from-crd=RayService")
}

async fn run_controller(
    client: Client,
    config: &RunConfig,
    metrics: metrics::Metrics,
    leading: Option<Arc<leader::Leadership>>,
    mut shutdown: signal::Receiver<bool>,
) -> Result<()> {
    let ns = config.namespace.as_deref();
    let services: Api<RayService> = api(&client, ns);
    // Fail early and clearly when the CRD is missing.
    services
        .list(&kube::api::ListParams::default().limit(1))
        .await
        .map_err(Error::RayServiceCrdMissing)?;
    let (caches, fills) = read_caches(ns);
    let started = start_context(&client, config, metrics, leading, caches)?;
    let ctx = started.ctx;
    let gateway_api = detect_gateway_api(&client, ns, &ctx).await;
    let forget_task = forget_deleted(api(&client, ns), ctx.clone(), config.readiness.clone());
    // The trigger streams fill the read caches: a change is in the store before it wakes a pass.
    let cluster_stream = indexed(
        &client,
        ns,
        owned(),
        (fills.clusters, fills.clusters_by_owner),
        trim,
    );
    let head_stream = indexed(
        &client,
        ns,
        head_pods(),
        (fills.heads, fills.heads_by_cluster),
        trim,
    );
    let worker_stream = indexed(
        &client,
        ns,
        serving_workers(),
        (fills.workers, fills.workers_by_cluster),
        slim,
    );
    let (rayservices, rayservice_writer) = reflector::store::<RayService>();
    let rayservice_stream =
        reflected(services, watcher::Config::default(), rayservice_writer, trim).applied_objects();
    let mut controller = Controller::for_stream(rayservice_stream, rayservices)
        // `ctx.slots` holds `--concurrency`, due traffic steps first, among the passes kube-runtime starts:
        // enough more for every upgrade's pass to be among them, not one per RayService (each costs memory).
        .with_config(controller::Config::default().concurrency(config.options.concurrency.saturating_mul(8)))
        .trigger_backoff(NoPause)
        .reconcile_on(started.unsettled)
        .owns_stream(cluster_stream)
        .owns_stream(cached(&client, ns, owned(), fills.services));
    if gateway_api {
        controller = watch_gateway_api(controller, &client, ns, fills.gateway_api).await;
    }
    let slots = ctx.slots.clone();
    let stop = async move {
        let _ = shutdown.wait_for(|s| *s).await;
        slots.close();
    };
    let (clusters, worker_clusters) = (fills.cluster_store.clone(), fills.cluster_store);
    controller
        .watches_stream(head_stream, move |pod| owner_of_pod(&clusters, &pod))
        .watches_stream(worker_stream, move |pod| owner_of_pod(&worker_clusters, &pod))
        .graceful_shutdown_on(stop)
        .run(reconcile::reconcile, reconcile::error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile result");
            }
        })
        .await;
    // The last passes' Events, before the process exits.
    ctx.events.flush(Duration::from_secs(2)).await;
    forget_task.abort();
    started.health_task.abort();
    tracing::info!("controller stopped");
    Ok(())
}

/// What fills the read caches: a writer per store (and the label indexes that follow two of them).
struct CacheFills {
    clusters: reflector::store::Writer<RayCluster>,
    clusters_by_owner: LabelIndex,
    /// The RayCluster store, to map a head Pod to its RayService.
    cluster_store: reflector::Store<RayCluster>,
    heads: reflector::store::Writer<Pod>,
    heads_by_cluster: LabelIndex,
    workers: reflector::store::Writer<Pod>,
    workers_by_cluster: LabelIndex,
    services: reflector::store::Writer<Service>,
    gateway_api: GatewayApiFills,
}

struct GatewayApiFills {
    gateways: reflector::store::Writer<Gateway>,
    routes: reflector::store::Writer<HttpRoute>,
    grpc_routes: reflector::store::Writer<GrpcRoute>,
}

/// The controller's read caches, empty until their watches fill them.
fn read_caches(ns: Option<&str>) -> (context::Caches, CacheFills) {
    let (clusters, cluster_writer) = reflector::store::<RayCluster>();
    let (heads, head_writer) = reflector::store::<Pod>();
    let (workers, worker_writer) = reflector::store::<Pod>();
    let (services, service_writer) = reflector::store::<Service>();
    let (gateways, gateway_writer) = reflector::store::<Gateway>();
    let (routes, route_writer) = reflector::store::<HttpRoute>();
    let (grpc_routes, grpc_route_writer) = reflector::store::<GrpcRoute>();
    let clusters_by_owner = LabelIndex::new(children::ORIGINATED_FROM_CR_NAME);
    let heads_by_cluster = LabelIndex::new(children::CLUSTER_LABEL);
    let workers_by_cluster = LabelIndex::new(children::CLUSTER_LABEL);
    let caches = context::Caches {
        clusters: context::Indexed::new(clusters.clone(), clusters_by_owner.clone(), "RayCluster"),
        heads: context::Indexed::new(heads, heads_by_cluster.clone(), "Pod"),
        serving_workers: context::Indexed::new(workers, workers_by_cluster.clone(), "Pod"),
        services,
        gateways,
        routes,
        grpc_routes,
        namespace: ns.map(str::to_string),
    };
    let fills = CacheFills {
        clusters: cluster_writer,
        clusters_by_owner,
        cluster_store: clusters,
        heads: head_writer,
        heads_by_cluster,
        workers: worker_writer,
        workers_by_cluster,
        services: service_writer,
        gateway_api: GatewayApiFills {
            gateways: gateway_writer,
            routes: route_writer,
            grpc_routes: grpc_route_writer,
        },
    };
    (caches, fills)
}

/// The passes' shared context, with the health timer running beside it.
struct Started {
    ctx: Arc<Context>,
    /// RayServices the health timer found changed, to reconcile.
    unsettled: futures::channel::mpsc::UnboundedReceiver<ObjectRef<RayService>>,
    health_task: tokio::task::JoinHandle<()>,
}

fn start_context(
    client: &Client,
    config: &RunConfig,
    metrics: metrics::Metrics,
    leading: Option<Arc<leader::Leadership>>,
    caches: context::Caches,
) -> Result<Started> {
    let dashboard = dashboard::Dashboard::new(
        config.dashboard_route.clone(),
        config.dashboard_timeout,
        config.dashboard_max_in_flight,
        client.clone(),
        metrics.clone(),
    )?;
    let options = &config.options;
    let (health, unsettled) = HealthTimer::new(options.serve_health_interval, options.resync_interval);
    let health = Arc::new(health);
    let health_task = tokio::spawn(health.clone().run(
        dashboard.clone(),
        options.serve_health_url_template.clone(),
        metrics.clone(),
    ));
    let prometheus = options
        .prometheus_url
        .as_deref()
        .map(|url| slo::Prometheus::new(url, config.dashboard_timeout))
        .transpose()?;
    let ctx = Context::new(client.clone(), dashboard, options.clone(), metrics, health);
    let ctx = ctx
        .with_leadership(leading)
        .with_caches(caches)
        .with_prometheus(prometheus);
    Ok(Started {
        ctx: Arc::new(ctx),
        unsettled,
        health_task,
    })
}

/// Routes and Gateways wake the RayServices that refer to them (adopted routes, shared Gateways); GRPCRoutes
/// are owned.
async fn watch_gateway_api(
    controller: Controller<RayService>,
    client: &Client,
    ns: Option<&str>,
    fills: GatewayApiFills,
) -> Controller<RayService> {
    let any = watcher::Config::default;
    let (by_route, by_gateway) = (controller.store(), controller.store());
    let controller = controller
        .watches_stream(cached(client, ns, any(), fills.routes), move |route| {
            let ns = route.namespace().unwrap_or_default();
            referrers(&by_route, &route, |rs_ns, a| {
                matches!(a, Attachment::AdoptedRoute { name, .. } if *name == route.name_any() && rs_ns == ns)
            })
        })
        .watches_stream(cached(client, ns, any(), fills.gateways), move |gw| {
            let ns = gw.namespace().unwrap_or_default();
            referrers(&by_gateway, &gw, |_, a| {
                matches!(a, Attachment::SharedGateway(r) if r.name == gw.name_any() && r.namespace == ns)
            })
        });
    // GRPCRoute is in the standard channel since Gateway API v1.1; older installs lack it.
    if served::<GrpcRoute>(client, ns).await {
        return controller.owns_stream(cached(client, ns, any(), fills.grpc_routes));
    }
    controller
}

/// Whether the apiserver serves this kind (its CRD is installed).
async fn served<K>(client: &Client, ns: Option<&str>) -> bool
where
    K: Watched + kube::Resource<Scope = kube::core::NamespaceResourceScope>,
{
    api::<K>(client, ns)
        .list(&kube::api::ListParams::default().limit(1))
        .await
        .is_ok()
}

/// Gateway API objects are watched only where the CRDs exist (the REP: blue/green must work without).
async fn detect_gateway_api(client: &Client, ns: Option<&str>, ctx: &Context) -> bool {
    let found = served::<HttpRoute>(client, ns).await;
    ctx.gateway_api.store(found, std::sync::atomic::Ordering::Relaxed);
    if !found {
        tracing::warn!(
            "Gateway API CRDs not found: NewClusterWithIncrementalUpgrade RayServices will wait with a condition"
        );
    }
    found
}

/// What a watched kind with a read cache must be.
trait Watched:
    kube::Resource<DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// A watch that fills a read cache, then triggers the controller.
fn cached<K>(
    client: &Client,
    ns: Option<&str>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
) -> impl futures::Stream<Item = std::result::Result<K, watcher::Error>> + Send + 'static
where
    K: Watched + kube::Resource<Scope = kube::core::NamespaceResourceScope>,
{
    reflected(api::<K>(client, ns), config, writer, trim).touched_objects()
}

/// `cached`, with `index` following the cache, and `keep` deciding what of an object the cache keeps.
fn indexed<K>(
    client: &Client,
    ns: Option<&str>,
    config: watcher::Config,
    (writer, index): (reflector::store::Writer<K>, LabelIndex),
    keep: fn(&mut K),
) -> impl futures::Stream<Item = std::result::Result<K, watcher::Error>> + Send + 'static
where
    K: Watched + kube::Resource<Scope = kube::core::NamespaceResourceScope>,
{
    reflected(api::<K>(client, ns), config, writer, keep)
        .map(move |event| {
            if let Ok(event) = &event {
                index.apply(event);
            }
            event
        })
        .touched_objects()
}

/// A watch, retried with `RecoveryBackoff`, whose events fill a read cache with what `keep` leaves of each object.
fn reflected<K: Watched>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    keep: fn(&mut K),
) -> impl futures::Stream<Item = std::result::Result<watcher::Event<K>, watcher::Error>> + Send + 'static {
    watcher(api, config)
        .backoff(RecoveryBackoff::new())
        .modify(keep)
        .reflect(writer)
}

/// What no pass reads is not kept: managed fields and kubectl's copy of the last applied object were most of
/// a cached object's size (issue 16: RSS at 1,000 RayServices). Nothing cached is ever written back whole
/// (writes are patches built from scratch), so the live objects keep both.
fn trim<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
    if let Some(annotations) = object.meta_mut().annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// The RayServices a Gateway API object matters to: its owner, and those whose annotations name it (a
/// shared Gateway, an adopted route), so its status wakes them as an owned object's would.
fn referrers<K: Resource>(
    rayservices: &reflector::Store<RayService>,
    object: &K,
    names: impl Fn(&str, &Attachment) -> bool,
) -> Vec<ObjectRef<RayService>> {
    let ns = object.namespace().unwrap_or_default();
    let owners = object
        .owner_references()
        .iter()
        .filter(|o| o.kind == "RayService")
        .map(|o| ObjectRef::new(&o.name).within(&ns));
    let annotated = rayservices.state().into_iter().filter(|rs| {
        let rs_ns = rs.namespace().unwrap_or_default();
        Attachment::from_annotations(rs.annotations(), &rs_ns).is_ok_and(|a| names(&rs_ns, &a))
    });
    owners
        .chain(annotated.map(|rs| ObjectRef::from_obj(&*rs)))
        .collect()
}

/// Head Pods, whole (a pass judges the head's health from its containers).
fn head_pods() -> watcher::Config {
    watcher::Config::default().labels("ray.io/node-type=head")
}

/// Worker Pods while they carry the serve label, for `numServeEndpoints` without a Pod list per pass: a worker
/// that leaves the serve Service leaves the watch. Worker Pods can be thousands, so the cache keeps them `slim`.
fn serving_workers() -> watcher::Config {
    watcher::Config::default().labels("ray.io/node-type=worker,ray.io/serve=true")
}

/// A Pod as a count of serving Pods reads it: its name, labels, deletion and conditions.
fn slim(pod: &mut Pod) {
    trim(pod);
    let meta = &mut pod.metadata;
    (meta.annotations, meta.owner_references) = (None, None);
    pod.spec = None;
    pod.status = pod.status.take().map(|s| k8s_openapi::api::core::v1::PodStatus {
        conditions: s.conditions,
        ..Default::default()
    });
}

/// The RayService owning a head Pod, through its cluster.
fn owner_of_pod(clusters: &reflector::Store<RayCluster>, pod: &Pod) -> Option<ObjectRef<RayService>> {
    let ns = pod.namespace().unwrap_or_default();
    let cluster = pod.labels().get("ray.io/cluster")?;
    let cluster = clusters.get(&ObjectRef::new(cluster).within(&ns))?;
    let owner = cluster
        .owner_references()
        .iter()
        .find(|o| o.kind == "RayService")?;
    Some(ObjectRef::new(&owner.name).within(&ns))
}

/// What the deletion watch keeps of a RayService: its metadata only (the controller's own cache has the rest).
type Listed = kube::core::PartialObjectMeta<RayService>;

/// A deleted RayService is never reconciled, so its metric series and records are dropped here, on its
/// delete event (or, after a re-list, when it is no longer listed). A watch of its own: kube-runtime's
/// controller does not share its trigger stream without an unstable feature. Its first full list also
/// makes the controller ready.
fn forget_deleted(
    services: Api<Listed>,
    ctx: Arc<Context>,
    readiness: Readiness,
) -> tokio::task::JoinHandle<()> {
    let (rayservices, writer) = reflector::store::<Listed>();
    tokio::spawn(
        reflected(services, watcher::Config::default(), writer, trim).for_each(move |event| {
            if let Ok(event) = event {
                if matches!(event, watcher::Event::InitDone) {
                    readiness.set_synced(true);
                }
                forget_gone(&ctx, &rayservices, &event);
            }
            futures::future::ready(())
        }),
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    /// A serving worker keeps what the count reads (labels, Ready) and nothing of its spec or annotations.
    #[test]
    fn a_slim_pod_keeps_its_labels_and_conditions() {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "w", "labels": {"ray.io/serve": "true"}, "annotations": {"a": "b"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        super::slim(&mut pod);
        assert_eq!(
            serde_json::to_value(&pod).unwrap(),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", "labels": {"ray.io/serve": "true"}},
                   "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        );
    }
}
