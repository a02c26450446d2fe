//! What every pass shares: the controller's options and mode, its clients, read caches, records and
//! metrics, the leader check before every write, events, and the two ways a pass touches a child object
//! (read it, apply it). Both the reconcile and the incremental step use it; it uses neither.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::reflector,
};
use rayshift_api::{
    FeatureGates, RayCluster, RayService,
    observed::{self, Levels},
};
use serde_json::Value;

use crate::{
    children::{self, APPLIED_ANNOTATION, CLUSTER_LABEL, NODE_TYPE_LABEL, SERVE_LABEL},
    cluster_records::ClusterRecords,
    dashboard::{self, Dashboard},
    error::{Error, Result},
    events::{EventLog, EventType, Occurrence},
    health_timer::HealthTimer,
    label_index::LabelIndex,
    metrics::{Metrics, ServiceView},
    waiting::{self, Waiting},
};

/// What the controller does with the RayServices it sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Reconcile nothing, write nothing: export the capacity and traffic metrics of every RayService, read from
    /// the status KubeRay writes (the mode for an unmodified KubeRay).
    Observe,
    /// Run the RayServices whose `managedBy` is rayshift's, and observe the others as in `Observe`.
    Reconcile,
}

/// How the controller behaves.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// `spec.managedBy` value of the RayServices this controller owns.
    pub managed_by: String,
    /// Whether this controller runs the RayServices it owns, or only watches them all.
    pub mode: Mode,
    pub feature_gates: FeatureGates,
    /// Re-read dashboards this often while waiting for Serve apps (nothing to watch there).
    pub serve_poll_interval: Duration,
    /// Re-read Serve this often while a traffic step is due and waits only for its capacity to be verified
    /// (the step then lands this late at most, plus one pass).
    pub capacity_poll_interval: Duration,
    /// A full pass of a settled RayService this often (the health timer checks it in between); writes only if
    /// something changed.
    pub resync_interval: Duration,
    pub field_manager: String,
    /// Do not wait for Gateway/HTTPRoute status (for Gateway controllers that publish none).
    pub skip_gateway_status_check: bool,
    /// Operator default of the progress deadline (the annotation overrides it).
    pub progress_deadline_seconds: i64,
    /// Default drain time before a cluster that lost its traffic goes to target_capacity 0.
    pub drain_seconds: i64,
    /// How often the health timer checks a settled RayService's Serve status and head proxies.
    pub serve_health_interval: Duration,
    /// Where a head Pod's Serve proxy health check is (template route): `{podIP}`, `{port}`, `{pod}`,
    /// `{cluster}` and `{namespace}` are filled in.
    pub serve_health_url_template: String,
    /// RayServices reconciled at once (0: no bound).
    pub concurrency: u16,
    /// The Prometheus that evaluates SLO checks.
    pub prometheus_url: Option<String>,
    /// ResourceAware pacing of RayServices without `rayshift.io/resource-aware`.
    pub resource_aware: rayshift_api::upgrade_control::ResourceAwareMode,
    /// KubeRay's `ENABLE_ZERO_DOWNTIME`: off, a RayService with no upgrade type gets no new cluster.
    pub zero_downtime: bool,
    /// KubeRay's `ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE`: the head Service gets a cluster IP, not headless.
    pub head_cluster_ip: bool,
}

/// A pass mostly waits on the apiserver and dashboards, so a few per core keep two cores busy; unbounded,
/// a controller starting beside 1,000 RayServices sends a request per pass at once. 16 was not faster to Ready
/// at 1,000 once the apiserver's CPU was the bound (BENCHMARKS.md, scale).
pub const DEFAULT_CONCURRENCY: u16 = 8;

impl Default for ControllerOptions {
    fn default() -> Self {
        Self {
            managed_by: rayshift_api::rayservice::RAYSHIFT_MANAGER.to_string(),
            mode: Mode::Reconcile,
            feature_gates: FeatureGates::default(),
            serve_poll_interval: Duration::from_secs(2),
            capacity_poll_interval: Duration::from_millis(50),
            resync_interval: Duration::from_secs(300),
            field_manager: "rayshift".to_string(),
            skip_gateway_status_check: false,
            progress_deadline_seconds: rayshift_api::upgrade_control::DEFAULT_PROGRESS_DEADLINE_SECONDS,
            drain_seconds: rayshift_api::upgrade_control::DEFAULT_DRAIN_SECONDS,
            serve_health_interval: Duration::from_secs(10),
            serve_health_url_template: dashboard::DEFAULT_HEALTH_URL_TEMPLATE.to_string(),
            concurrency: DEFAULT_CONCURRENCY,
            prometheus_url: None,
            resource_aware: Default::default(),
            zero_downtime: true,
            head_cluster_ip: false,
        }
    }
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub events: EventLog,
    pub dashboard: Dashboard,
    pub options: ControllerOptions,
    pub metrics: Metrics,
    /// Serve config last pushed and proxy health, per cluster, grouped by owner uid.
    records: Mutex<ClusterRecords>,
    /// Whether the Gateway API (HTTPRoute) is served by this cluster.
    pub gateway_api: std::sync::atomic::AtomicBool,
    /// The resourceVersion of each RayService (by uid) as this controller last read or wrote it: a cached
    /// copy at that version is as fresh as a read (see `reconcile::current`).
    versions: Mutex<HashMap<String, String>>,
    /// Last levels seen of each RayService someone else runs (by uid), to tell what changed.
    observed: Mutex<HashMap<String, Levels>>,
    /// RayServices deleted lately (uid → when): a pass that began before the delete must not publish
    /// their series again after they were dropped.
    deleted: Mutex<HashMap<String, Timestamp>>,
    started: Timestamp,
    /// Whether this replica holds the leader Lease; `None` without leader election.
    leading: Option<Arc<crate::leader::Leadership>>,
    /// Where a pass reads clusters, head Pods and the objects it applies; `None`: the apiserver.
    pub(crate) caches: Option<Caches>,
    /// Checks settled RayServices between their passes.
    pub(crate) health: Arc<HealthTimer>,
    /// Evaluates SLO checks; `None` without `--prometheus-url` (checks then never pass).
    pub(crate) prometheus: Option<crate::slo::Prometheus>,
    /// Failed passes in a row per RayService: when each runs again.
    pub(crate) retries: crate::retry::Retries,
    /// The `--concurrency` bound, due traffic steps first.
    pub(crate) slots: Arc<crate::slots::ReconcileSlots>,
}

/// Read caches fed by the controller's own trigger streams: an object's change reaches its store before it
/// triggers a pass, so a pass never reads an object older than the change that woke it.
#[derive(Clone)]
pub struct Caches {
    /// Indexed by their RayService (KubeRay's `ray.io/originated-from-cr-name`).
    pub clusters: Indexed<RayCluster>,
    /// Indexed by their cluster (`ray.io/cluster`).
    pub heads: Indexed<Pod>,
    /// Worker Pods while they carry the serve label, slim (labels and conditions), indexed by their cluster.
    pub serving_workers: Indexed<Pod>,
    /// The Services rayshift creates (KubeRay's association labels).
    pub services: reflector::Store<Service>,
    /// Filled only where the Gateway API is served.
    pub gateways: reflector::Store<gateway_api::gateways::Gateway>,
    pub routes: reflector::Store<gateway_api::httproutes::HttpRoute>,
    pub grpc_routes: reflector::Store<gateway_api::grpcroutes::GrpcRoute>,
    /// The namespace the watches are limited to (`--namespace`); objects elsewhere (a shared Gateway) are
    /// read from the apiserver.
    pub namespace: Option<String>,
}

impl Caches {
    /// A child object as its cache holds it: `None` when no cache holds that kind or it has not listed
    /// yet (then the caller asks the apiserver), `Some(None)` when it does not exist.
    pub(crate) fn child<K>(&self, ns: &str, name: &str) -> Option<Option<Arc<K>>>
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        if self.namespace.as_deref().is_some_and(|scope| scope != ns) {
            return None;
        }
        let stores: [&dyn std::any::Any; 4] =
            [&self.services, &self.gateways, &self.routes, &self.grpc_routes];
        let store = stores
            .into_iter()
            .find_map(|s| s.downcast_ref::<reflector::Store<K>>())?;
        futures::FutureExt::now_or_never(store.wait_until_ready())?.ok()?;
        Some(store.get(&reflector::ObjectRef::new(name).within(ns)))
    }

    /// Names of the routes of `ns` (HTTPRoutes, and GRPCRoutes once their cache has listed) that attach to
    /// its Gateway `gateway`; `None` until the HTTPRoute cache has listed.
    pub(crate) fn routes_attached_to(&self, ns: &str, gateway: &str) -> Option<Vec<String>> {
        if self.namespace.as_deref().is_some_and(|scope| scope != ns) {
            return None;
        }
        let mut attached = attached_in(&self.routes, ns, gateway)?;
        // GRPCRoutes only where their watch synced (a cluster may not serve the GRPCRoute API).
        attached.extend(attached_in(&self.grpc_routes, ns, gateway).into_iter().flatten());
        Some(attached)
    }

    /// The RayService's clusters (by KubeRay's association labels).
    pub(crate) async fn clusters_of(&self, ns: &str, rs: &str) -> Result<Vec<RayCluster>> {
        let wanted = children::association_labels(rs);
        self.clusters.find(ns, rs, &wanted).await
    }

    /// The head Pods of a cluster.
    pub(crate) async fn heads_of(&self, ns: &str, cluster: &str) -> Result<Vec<Pod>> {
        let wanted = BTreeMap::from([
            (CLUSTER_LABEL.to_string(), cluster.to_string()),
            (NODE_TYPE_LABEL.to_string(), "head".to_string()),
        ]);
        self.heads.find(ns, cluster, &wanted).await
    }

    /// The worker Pods of a cluster that carry the serve label.
    pub(crate) async fn serving_workers_of(&self, ns: &str, cluster: &str) -> Result<Vec<Pod>> {
        let wanted = BTreeMap::from([
            (CLUSTER_LABEL.to_string(), cluster.to_string()),
            (NODE_TYPE_LABEL.to_string(), "worker".to_string()),
            (SERVE_LABEL.to_string(), "true".to_string()),
        ]);
        self.serving_workers.find(ns, cluster, &wanted).await
    }
}

/// A read cache of one kind, the gate of its first list, and its objects' names by one label.
#[derive(Clone)]
pub struct Indexed<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: reflector::Store<K>,
    listed: Listed,
    index: LabelIndex,
    /// For what a pass waits on, and errors.
    kind: &'static str,
}

impl<K> Indexed<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// Must be made before anything else waits on `store` (see `Listed`).
    pub fn new(store: reflector::Store<K>, index: LabelIndex, kind: &'static str) -> Self {
        let listed = Listed::of(&store);
        Self {
            store,
            listed,
            index,
            kind,
        }
    }

    /// The objects in `ns` carrying every label of `wanted`, once the cache has its first list: by name
    /// from the index (its label's `value`), or by a scan while the index has not listed yet (it follows
    /// the store by a moment).
    async fn find(&self, ns: &str, value: &str, wanted: &BTreeMap<String, String>) -> Result<Vec<K>> {
        waiting::on(Waiting::Cache(self.kind));
        if !self.listed.wait().await {
            return Err(Error::CacheClosed(self.kind));
        }
        let matches = |k: &K| {
            k.meta().namespace.as_deref() == Some(ns)
                && wanted.iter().all(|(key, v)| k.labels().get(key) == Some(v))
        };
        let found = match self.index.names(ns, value) {
            Some(names) => names
                .iter()
                .filter_map(|n| self.store.get(&reflector::ObjectRef::new(n).within(ns)))
                .filter(|k| matches(k))
                .collect(),
            None => self.store.state_filter(matches),
        };
        Ok(found.iter().map(|k| (**k).clone()).collect())
    }
}

/// Whether a cache has had its first list, for any number of tasks to wait on. kube-runtime's
/// `Store::wait_until_ready` keeps one waker (a oneshot's): of passes waiting there in tasks of their own, only
/// the last to poll was woken, and the others waited for their timeout (BENCHMARKS.md, the stall). So one task
/// waits there and passes wait here.
#[derive(Clone)]
struct Listed(tokio::sync::watch::Receiver<bool>);

impl Listed {
    /// Must be made before anything else waits on `store`, and nothing else may wait on it.
    fn of<K>(store: &reflector::Store<K>) -> Self
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let store = store.clone();
        tokio::spawn(async move {
            if store.wait_until_ready().await.is_ok() {
                let _ = tx.send(true);
            }
        });
        Listed(rx)
    }

    /// False when the cache's writer is gone without a first list.
    async fn wait(&self) -> bool {
        self.0.clone().wait_for(|listed| *listed).await.is_ok()
    }
}

impl Context {
    pub fn new(
        client: Client,
        dashboard: Dashboard,
        options: ControllerOptions,
        metrics: Metrics,
        health: Arc<HealthTimer>,
    ) -> Self {
        Self {
            retries: crate::retry::Retries::new(metrics.failing_rayservices()),
            slots: crate::slots::ReconcileSlots::new(options.concurrency),
            events: EventLog::new(client.clone(), "rayshift", std::env::var("POD_NAME").ok()),
            client,
            dashboard,
            options,
            metrics,
            records: Mutex::new(ClusterRecords::default()),
            gateway_api: std::sync::atomic::AtomicBool::new(false),
            versions: Mutex::new(HashMap::new()),
            observed: Mutex::new(HashMap::new()),
            deleted: Mutex::new(HashMap::new()),
            started: Timestamp::now(),
            leading: None,
            caches: None,
            health,
            prometheus: None,
        }
    }

    pub fn with_prometheus(mut self, prometheus: Option<crate::slo::Prometheus>) -> Self {
        self.prometheus = prometheus;
        self
    }

    /// Reads clusters and head Pods from these caches instead of the apiserver.
    pub fn with_caches(mut self, caches: Caches) -> Self {
        self.caches = Some(caches);
        self
    }

    /// Writes only while `leading` says this replica holds the Lease.
    pub fn with_leadership(mut self, leading: Option<Arc<crate::leader::Leadership>>) -> Self {
        self.leading = leading;
        self
    }

    pub(crate) fn owns(&self, rs: &RayService) -> bool {
        self.options.mode == Mode::Reconcile
            && rs.spec.managed_by.as_deref() == Some(&self.options.managed_by)
    }

    /// Metrics and events of a RayService someone else runs, from the status it writes.
    pub(crate) async fn observe(&self, rs: &RayService) {
        let (ns, name) = (rs.namespace().unwrap_or_default(), rs.name_any());
        let uid = rs.uid().unwrap_or_default();
        if rs.meta().deletion_timestamp.is_some() {
            self.metrics.forget_service(&ns, &name);
            self.observed_levels().remove(&uid);
            return;
        }
        let status = rs.status.clone().unwrap_or_default();
        let view = ServiceView::of(rs, &status, Timestamp::now());
        self.metrics.observe_service(&ns, &name, &status, &view);
        let now = Levels::of(&status);
        // A RayService older than this controller is told from its first change on (a restarted controller
        // does not repeat what happened before it); a newer one from its creation.
        let created = rs.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second());
        let newer = created.is_some_and(|c| c >= self.started.as_second());
        let before = self
            .observed_levels()
            .insert(uid, now.clone())
            .or_else(|| newer.then(Levels::default));
        for change in before.map(|b| observed::changes(&b, &now)).unwrap_or_default() {
            self.event(rs, EventType::Normal, change.reason(), "Observe", change.note());
        }
    }

    /// Right before every write: only the leader writes (a replica that lost its Lease mid-pass stops here),
    /// and the write is counted.
    pub(crate) fn before_write(&self, kind: impl Into<Cow<'static, str>>, verb: &'static str) -> Result<()> {
        self.ensure_leader()?;
        let kind = kind.into();
        self.metrics.api_write(&kind, verb);
        waiting::on(Waiting::api(verb, kind));
        Ok(())
    }

    /// Fails unless this replica leads (always true without leader election).
    pub(crate) fn ensure_leader(&self) -> Result<()> {
        match &self.leading {
            Some(leadership) if !leadership.leading() => Err(Error::NotLeader),
            _ => Ok(()),
        }
    }

    /// Whether the RayService was deleted lately (by uid: a new one of the same name is another object).
    pub(crate) fn was_deleted(&self, rs: &RayService) -> bool {
        let uid = rs.uid().unwrap_or_default();
        self.deleted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&uid)
    }

    /// Whether `rs` is at the version this controller last read or wrote.
    pub(crate) fn is_known_version(&self, rs: &RayService) -> bool {
        let (uid, version) = (rs.uid().unwrap_or_default(), rs.resource_version());
        version.is_some() && self.known_versions().get(&uid) == version.as_ref()
    }

    /// Remembers the version of a RayService this controller just read or wrote.
    pub(crate) fn saw_version(&self, rs: &RayService) {
        if let (Some(uid), Some(version)) = (rs.uid(), rs.resource_version()) {
            self.known_versions().insert(uid, version);
        }
    }

    /// The next pass reads the RayService from the apiserver.
    pub(crate) fn forget_version(&self, rs: &RayService) {
        self.known_versions().remove(&rs.uid().unwrap_or_default());
    }

    fn known_versions(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.versions.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn observed_levels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Levels>> {
        self.observed.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn records(&self) -> std::sync::MutexGuard<'_, ClusterRecords> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops everything kept about a RayService that is gone: its metric series, what was observed of it and
    /// the records of its clusters.
    pub fn forget(&self, ns: &str, name: &str, uid: &str) {
        {
            let mut deleted = self.deleted.lock().unwrap_or_else(|e| e.into_inner());
            let now = Timestamp::now();
            deleted.retain(|_, at| now.duration_since(*at) < SignedDuration::from_mins(10));
            deleted.insert(uid.to_string(), now);
        }
        self.metrics.forget_service(ns, name);
        self.health.forget(&reflector::ObjectRef::new(name).within(ns));
        self.observed_levels().remove(uid);
        self.known_versions().remove(uid);
        self.records().forget_owner(uid);
        self.retries.succeeded(uid);
        self.events.forget(uid);
    }

    /// After a re-list: forgets every RayService that is no longer there (its delete event may have been
    /// missed while the watch was down).
    pub fn forget_all_but(&self, present: &[(String, String, String)]) {
        let uids: std::collections::HashSet<&str> = present.iter().map(|(_, _, u)| u.as_str()).collect();
        let names: std::collections::HashSet<(&str, &str)> =
            present.iter().map(|(n, s, _)| (n.as_str(), s.as_str())).collect();
        self.metrics.forget_services_except(&names);
        self.health
            .forget_all_but(|rs| names.contains(&(rs.namespace.as_deref().unwrap_or_default(), &rs.name)));
        self.observed_levels()
            .retain(|uid, _| uids.contains(uid.as_str()));
        self.known_versions().retain(|uid, _| uids.contains(uid.as_str()));
        self.retries.retain(|uid| uids.contains(uid));
        self.records().retain_owners(|owner| uids.contains(owner));
    }

    /// Queues an Event (the pass does not wait for its write).
    pub(crate) fn event(&self, rs: &RayService, type_: EventType, reason: &str, action: &str, note: String) {
        let occurrence = Occurrence {
            type_,
            reason: reason.into(),
            action: action.into(),
            note,
        };
        if self.ensure_leader().is_err() {
            return;
        }
        // Counted once queued: a dropped Event is never written.
        match self.events.record(rs.object_ref(&()), occurrence) {
            Ok(()) => self.metrics.api_write("Event", "create"),
            Err(why) => tracing::warn!(reason, why = why.as_str(), "event dropped"),
        }
    }
}

/// Server-side apply of a child, skipped when what rayshift applied last is unchanged.
pub(crate) async fn apply_child<K>(ctx: &Context, ns: &str, body: Value) -> Result<()>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + 'static
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let (body, digest) = children::stamp(body);
    let name = body["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    // A cache that has not yet seen this controller's last apply only costs one idempotent apply more.
    let existing = read_child::<K>(ctx, ns, &name).await?;
    if existing.is_some_and(|k| k.annotations().get(APPLIED_ANNOTATION) == Some(&digest)) {
        return Ok(());
    }
    ctx.before_write(K::kind(&()), "apply")?;
    api.patch(
        &name,
        &PatchParams::apply(&ctx.options.field_manager).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// A child object from its cache, or from the apiserver where no cache holds it.
pub(crate) async fn read_child<K>(ctx: &Context, ns: &str, name: &str) -> Result<Option<K>>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + 'static,
{
    match ctx.caches.as_ref().and_then(|c| c.child::<K>(ns, name)) {
        Some(cached) => Ok(cached.map(|k| (*k).clone())),
        None => {
            waiting::on(Waiting::api("get", K::kind(&())));
            Ok(Api::<K>::namespaced(ctx.client.clone(), ns).get_opt(name).await?)
        }
    }
}

/// The Gateways a route names as parents: (kind, namespace, name) of each parentRef.
pub(crate) trait ParentRefs {
    fn parents(&self) -> Vec<(Option<&str>, Option<&str>, &str)>;
}

macro_rules! parent_refs {
    ($($route:ty),*) => {$(
        impl ParentRefs for $route {
            fn parents(&self) -> Vec<(Option<&str>, Option<&str>, &str)> {
                (self.spec.parent_refs.iter().flatten())
                    .map(|p| (p.kind.as_deref(), p.namespace.as_deref(), p.name.as_str()))
                    .collect()
            }
        }
    )*};
}
parent_refs!(
    gateway_api::httproutes::HttpRoute,
    gateway_api::grpcroutes::GrpcRoute
);

/// The routes of `ns` in `store` attached to Gateway `gateway` of `ns`; `None` until the store synced.
fn attached_in<K>(store: &reflector::Store<K>, ns: &str, gateway: &str) -> Option<Vec<String>>
where
    K: Resource<DynamicType = ()> + ParentRefs + Clone + 'static,
{
    futures::FutureExt::now_or_never(store.wait_until_ready())?.ok()?;
    // A parentRef without kind or namespace names a Gateway of the route's own namespace.
    let names_it = |(kind, namespace, name): (Option<&str>, Option<&str>, &str)| {
        kind.unwrap_or("Gateway") == "Gateway" && namespace.unwrap_or(ns) == ns && name == gateway
    };
    let attached = (store.state().iter())
        .filter(|r| r.meta().namespace.as_deref() == Some(ns))
        .filter(|r| r.parents().into_iter().any(names_it))
        .map(|r| r.name_any())
        .collect();
    Some(attached)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::{reflector, watcher};

    use super::Listed;

    /// Passes in tasks of their own, all waiting for a cache's first list, are all woken by it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_task_waiting_for_a_first_list_is_woken() {
        let (store, mut writer) = reflector::store::<Pod>();
        let listed = Listed::of(&store);
        let waiters: Vec<_> = (0..16)
            .map(|_| {
                let listed = listed.clone();
                tokio::spawn(async move { listed.wait().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        for waiter in waiters {
            let woken = tokio::time::timeout(Duration::from_secs(5), waiter).await;
            assert!(woken.expect("a waiter was never woken").unwrap());
        }
    }

    /// A cache whose writer is gone before its first list ends the wait with false, not never.
    #[tokio::test]
    async fn a_cache_that_never_lists_ends_the_wait() {
        let (store, writer) = reflector::store::<Pod>();
        let listed = Listed::of(&store);
        drop(writer);
        let ended = tokio::time::timeout(Duration::from_secs(5), listed.wait()).await;
        assert_eq!(ended, Ok(false));
    }
}
