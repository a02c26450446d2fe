//! GPU-limited scheduling for the ResourceAware tests (issue 18).
//!
//! - `gpu_node`: a kwok node that advertises a fixed number of `nvidia.com/gpu`, tainted so that only the
//!   GPU workers of the test that made it land there. The real kube-scheduler places Pods on it by their GPU
//!   requests.
//! - `Autoscaler`: test code playing the Ray autoscaler, a stand-in because the real one reads demand from a
//!   running Ray head and kwok's Pods run no Ray. For every RayCluster of a namespace it sets the worker
//!   group's replicas to what Serve's `target_capacity` needs (one GPU worker per replica) and, on the way
//!   down, names the workers to remove in `scaleStrategy.workersToDelete`, as the real autoscaler does. The
//!   real KubeRay operator creates and deletes the Pods, so freed GPUs come from Pods really going away. The
//!   fake dashboard runs only as many replicas as the cluster has Ready workers: the controller verifies
//!   capacity against Pods that got a GPU.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use rayshift_api::RayCluster;
use serde_json::{Value, json};

use super::dashboard::{FakeDashboard, scaled};

/// The taint that keeps every other test's Pods off a GPU node.
pub const GPU_TAINT: &str = "rayshift-test/gpu";

/// Creates a kwok node with `gpus` GPUs whose Pods get addresses in `pod_cidr` (inside the test range, whose
/// unreachable route keeps them local) and waits until it takes Pods that tolerate `GPU_TAINT`.
pub async fn gpu_node(client: &Client, name: &str, gpus: u32, pod_cidr: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let resources = json!({"cpu": "1k", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": gpus.to_string()});
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"type": "kwok", "kubernetes.io/hostname": name},
                     "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
        "status": {"allocatable": resources, "capacity": resources},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    super::wait::eventually(
        "the GPU node Ready",
        60,
        Duration::from_millis(100),
        || async {
            let node = nodes.get(name).await.ok()?;
            let status = node.status?;
            let ready = status
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let gpus_seen = status.allocatable?.get("nvidia.com/gpu")?.0 == gpus.to_string();
            (ready && gpus_seen).then_some(())
        },
        || async { String::new() },
    )
    .await;
    // The apiserver taints a new node not-ready; no node lifecycle controller runs here to lift it (kuberay.sh).
    let taints = json!({"spec": {"taints": [{"key": GPU_TAINT, "value": name, "effect": "NoSchedule"}]}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&taints))
        .await
        .unwrap();
}

/// What the autoscaler stand-in saw on one pass, per cluster: its Ready GPU workers, and the Serve replicas
/// running on them (the fake dashboard's RUNNING: what its target capacity asks, at most one per worker).
pub type Sample = (Instant, BTreeMap<String, Workers>);

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Workers {
    pub ready: usize,
    pub running: usize,
}

pub struct Autoscaler {
    /// Every pass, in order.
    pub samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Autoscaler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Autoscaler {
    /// Scales every RayCluster of `ns` to `per_copy` GPU workers at full capacity.
    pub fn start(client: Client, ns: &str, dashboard: FakeDashboard, per_copy: usize) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (seen, ns) = (samples.clone(), ns.to_string());
        let task = tokio::spawn(async move {
            loop {
                match pass(&client, &ns, &dashboard, per_copy).await {
                    Ok(ready) => seen.lock().unwrap().push((Instant::now(), ready)),
                    // Another writer came first (KubeRay, rayshift): the next pass reads it again.
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => eprintln!("autoscaler stand-in: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        });
        Autoscaler { samples, task }
    }

    /// The lowest serving capacity seen between two instants, in percent of one full copy (capped at 100):
    /// the Serve replicas running on Ready GPU workers, every cluster of the namespace together. The pass that
    /// scales a cluster up sees it before its new workers exist, so a dip lasting one pass is never missed.
    pub fn min_serving(&self, from: Instant, to: Instant, per_copy: usize) -> usize {
        let samples = self.samples.lock().unwrap();
        samples
            .iter()
            .filter(|(t, _)| (from..=to).contains(t))
            .map(|(_, w)| (w.values().map(|w| w.running).sum::<usize>() * 100 / per_copy).min(100))
            .min()
            .unwrap_or(0)
    }

    /// Each distinct sample from `from` on, with seconds since then.
    pub fn transitions(&self, from: Instant) -> Vec<(f64, BTreeMap<String, Workers>)> {
        let samples = self.samples.lock().unwrap();
        let mut out: Vec<(f64, BTreeMap<String, Workers>)> = Vec::new();
        for (t, ready) in samples.iter().filter(|(t, _)| *t >= from) {
            if out.last().is_none_or(|(_, r)| r != ready) {
                out.push((t.duration_since(from).as_secs_f64(), ready.clone()));
            }
        }
        out
    }

    /// The most Serve replicas `cluster` ran on Ready workers at any pass before `t`.
    pub fn running_before(&self, cluster: &str, t: Instant) -> usize {
        let samples = self.samples.lock().unwrap();
        samples
            .iter()
            .filter(|(at, _)| *at < t)
            .filter_map(|(_, w)| Some(w.get(cluster)?.running))
            .max()
            .unwrap_or(0)
    }
}

pub fn ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The namespace's RayClusters (raw: every field kept for a patch) and its worker Pods not being deleted.
pub async fn workers(client: &Client, ns: &str) -> Result<(Api<DynamicObject>, Vec<Pod>), kube::Error> {
    let clusters = Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<RayCluster>(&()));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let workers = pods
        .list(&ListParams::default().labels("ray.io/node-type=worker"))
        .await?;
    let live = workers
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none());
    Ok((clusters, live.collect()))
}

/// One look at every cluster: its Ready workers (what the fake dashboard may run), and the replicas its
/// Serve target capacity needs.
async fn pass(
    client: &Client,
    ns: &str,
    dashboard: &FakeDashboard,
    per_copy: usize,
) -> Result<BTreeMap<String, Workers>, kube::Error> {
    let (clusters, workers) = workers(client, ns).await?;
    let mut live: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for pod in &workers {
        if let Some(cluster) = pod.labels().get("ray.io/cluster") {
            live.entry(cluster.clone()).or_default().push(pod);
        }
    }
    let mut seen = BTreeMap::new();
    for cluster in clusters.list(&ListParams::default()).await? {
        let name = cluster.name_any();
        let mine = live.remove(&name).unwrap_or_default();
        let up = mine.iter().filter(|p| ready(p)).count();
        let config = dashboard.with(ns, &name, |s| {
            s.max_running = Some(up);
            s.config.clone()
        });
        // Serve not started: no demand yet.
        let capacity = config
            .as_ref()
            .map(|c| c.get("target_capacity").and_then(Value::as_f64));
        let desired = capacity.map_or(0, |c| scaled(per_copy, c));
        seen.insert(
            name.clone(),
            Workers {
                ready: up,
                running: desired.min(up),
            },
        );
        if config.is_some() {
            scale(&clusters, &cluster, &mine, desired, &Default::default()).await?;
        }
    }
    Ok(seen)
}

/// Sets the first worker group to `desired` replicas; going down, names the workers to remove, those that
/// never started first (the autoscaler drops nodes that never came up before idle ones), never one whose IP
/// is in `busy` (a Ray node still running a replica).
pub async fn scale(
    clusters: &Api<DynamicObject>,
    cluster: &DynamicObject,
    live: &[&Pod],
    desired: usize,
    busy: &BTreeSet<String>,
) -> Result<(), kube::Error> {
    let mut groups = cluster.data["spec"]["workerGroupSpecs"].clone();
    let group = &mut groups[0];
    let named: Vec<String> =
        serde_json::from_value(group["scaleStrategy"]["workersToDelete"].clone()).unwrap_or_default();
    // A deletion under way: KubeRay has not removed those Pods yet.
    if named.iter().any(|n| live.iter().any(|p| p.name_any() == *n)) {
        return Ok(());
    }
    let ip = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default()
    };
    let mut idle: Vec<&Pod> = live.iter().copied().filter(|p| !busy.contains(&ip(p))).collect();
    idle.sort_by_key(|p| ready(p));
    let remove: Vec<String> = idle
        .iter()
        .take(live.len().saturating_sub(desired))
        .map(|p| p.name_any())
        .collect();
    if group["replicas"] == json!(desired) && named == remove {
        return Ok(());
    }
    group["replicas"] = json!(desired);
    group["scaleStrategy"] = json!({"workersToDelete": remove});
    let patch = json!({"metadata": {"resourceVersion": cluster.resource_version()},
                       "spec": {"workerGroupSpecs": groups}});
    clusters
        .patch(
            &cluster.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}
