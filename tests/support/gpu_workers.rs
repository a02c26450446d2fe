//! Real Ray GPU workers for the real-Ray ResourceAware test (issue 18).
//!
//! KubeRay creates each cluster's GPU worker Pods, kube-scheduler places them on a kwok node with a fixed number
//! of `nvidia.com/gpu`, and kwok runs them. For every such Pod that is Ready, a real Ray worker node joins its
//! cluster's real head, declaring one GPU (`tests/env/ray.sh worker`): inside the head's network namespace, at
//! the Pod's IP. Serve's replicas each need a GPU, so they run only on workers whose Pod got a GPU from the
//! scheduler. When KubeRay deletes the Pod, its Ray node is stopped.
//!
//! Worker Pods carry no Serve proxy (`proxy_location: HeadOnly`): on a real node KubeRay's readiness probe (the
//! worker's proxy health) would keep them out of the serve Service, but kwok marks every Pod Ready without
//! probing. So the worker template holds each Pod back with a scheduling gate (`SERVE_GATE`) until this code
//! has taken it out of the serve Service (`ray.io/serve: "false"`), then lifts the gate: the scheduler places
//! it only after that, and no request is ever sent to a worker.
//!
//! The autoscaler is a stand-in (the real one runs beside a head with its Kubernetes credentials; here it
//! would also need kwok's Pods to be real): each cluster gets as many workers as Serve has replicas, in any
//! state, and going down only Pods whose Ray node runs no replica are named in `workersToDelete`, as the real
//! autoscaler removes idle nodes.

use std::{
    collections::{BTreeMap, BTreeSet},
    os::unix::process::CommandExt,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;

/// The scheduling gate of the GPU workers' template, lifted once a Pod is out of the serve Service.
pub const SERVE_GATE: &str = "rayshift-test/out-of-serve-service";

use super::{
    autoscaler::{ready, scale, workers},
    cluster::repo,
    ray::{BACKGROUND_NICE, HeadLookup, RayHeads, look, script},
    signal::{self, Sig},
};

/// A Ray worker node for one Pod.
struct Worker {
    /// `ray start --block`, leader of the node's process group; None once reaped.
    child: Option<Child>,
    group: u32,
    log: String,
    /// The Pod's IP, the node's Ray address.
    ip: String,
    /// At `BACKGROUND_NICE` until a replica on it is RUNNING (see `join`).
    background: bool,
}

impl Worker {
    /// `ray start` said the node runs.
    fn up(&self) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|l| l.contains("Ray runtime started"))
    }

    /// `ray start` gave up (a node that timed out registering): started again on the next pass.
    fn failed(&mut self) -> bool {
        let exited = self
            .child
            .as_mut()
            .is_none_or(|c| c.try_wait().is_ok_and(|s| s.is_some()));
        if exited {
            // Reaped: its PID, the group's ID, may be handed out again, so no delayed KILL may reach it.
            self.child = None;
        }
        exited
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // The whole group: `ray start --block` and the node's processes it started. An idle node goes at
        // SIGTERM; what is left a moment later is killed, off the async runtime. The leader is reaped only after
        // that KILL, so until then the group's ID cannot belong to anyone else.
        signal::group(self.group, Sig::TERM);
        if let Some(mut child) = self.child.take() {
            let group = self.group;
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(2));
                signal::group(group, Sig::KILL);
                let _ = child.wait();
            });
        }
        if self.up() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

#[derive(Default)]
struct Nodes {
    /// Pod name -> its Ray worker node.
    running: BTreeMap<String, Worker>,
    /// Every Pod that got a Ray node, in order, with its cluster.
    started: Vec<(String, String)>,
    next_index: u32,
}

pub struct GpuWorkers {
    nodes: Arc<Mutex<Nodes>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GpuWorkers {
    fn drop(&mut self) {
        self.task.abort();
        self.nodes.lock().unwrap().running.clear();
    }
}

impl GpuWorkers {
    pub fn start(client: Client, ns: &str, heads: &RayHeads) -> Self {
        let nodes = Arc::new(Mutex::new(Nodes::default()));
        let (mine, ns, head_of) = (nodes.clone(), ns.to_string(), heads.head_lookup());
        let task = tokio::spawn(async move {
            let http = reqwest::Client::new();
            loop {
                match pass(&client, &ns, &http, &*head_of, &mine).await {
                    // Another writer came first (KubeRay, rayshift): the next pass reads it again.
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => eprintln!("GPU workers: {e}"),
                    Ok(()) => {}
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        GpuWorkers { nodes, task }
    }

    /// Pods that got a Ray worker node, per cluster.
    pub fn started(&self, cluster: &str) -> usize {
        let nodes = self.nodes.lock().unwrap();
        nodes.started.iter().filter(|(_, c)| c == cluster).count()
    }
}

async fn pass(
    client: &Client,
    ns: &str,
    http: &reqwest::Client,
    head_of: &HeadLookup,
    nodes: &Mutex<Nodes>,
) -> Result<(), kube::Error> {
    let (clusters, workers) = workers(client, ns).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let live: Vec<&Pod> = workers.iter().collect();
    for pod in live.iter().filter(|p| gated(p)) {
        let patch =
            json!({"metadata": {"labels": {"ray.io/serve": "false"}}, "spec": {"schedulingGates": null}});
        pods.patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    // Pods gone (or going): their Ray nodes stop. Nodes that failed to start are started again.
    nodes
        .lock()
        .unwrap()
        .running
        .retain(|pod, w| live.iter().any(|p| p.name_any() == *pod) && !w.failed());
    for cluster in clusters.list(&ListParams::default()).await? {
        let name = cluster.name_any();
        let Some((netns, head_ip)) = head_of(&name) else {
            continue;
        };
        let mine: Vec<&Pod> = live
            .iter()
            .copied()
            .filter(|p| p.labels().get("ray.io/cluster") == Some(&name))
            .collect();
        for pod in mine.iter().filter(|p| ready(p)) {
            join(nodes, &name, &netns, &head_ip, pod);
        }
        if let Some(serve) = look(http, &head_ip, None).await {
            to_foreground(nodes, &mine, &serve.running_nodes).await;
            let wanted = serve.replicas.values().sum();
            scale(&clusters, &cluster, &mine, wanted, &serve.replica_nodes).await?;
        }
    }
    Ok(())
}

fn gated(pod: &Pod) -> bool {
    let gates = pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref());
    gates.is_some_and(|g| g.iter().any(|g| g.name == SERVE_GATE))
}

/// Gives the background worker nodes of `pods` that now run a RUNNING replica normal priority. The renice
/// runs on a blocking thread with the lock released: `join` and `started` must not wait for a subprocess.
async fn to_foreground(nodes: &Mutex<Nodes>, pods: &[&Pod], running_nodes: &BTreeSet<String>) {
    let due: Vec<(String, u32)> = {
        let nodes = nodes.lock().unwrap();
        pods.iter()
            .map(|pod| pod.name_any())
            .filter_map(|pod| {
                let w = nodes.running.get(&pod)?;
                (w.background && running_nodes.contains(&w.ip)).then_some((pod, w.group))
            })
            .collect()
    };
    for (pod, group) in due {
        let raised = tokio::task::spawn_blocking(move || {
            Command::new("bash")
                .arg(script())
                .args(["tree-priority", &group.to_string(), "0"])
                .status()
                .is_ok_and(|s| s.success())
        })
        .await
        .unwrap_or(false);
        // The node may have gone (or been started again) meanwhile; a failed renice is tried again next pass.
        let mut nodes = nodes.lock().unwrap();
        if let Some(worker) = nodes.running.get_mut(&pod).filter(|w| w.group == group) {
            worker.background = !raised;
        }
    }
}

/// Starts the Ray worker node of a Ready Pod, once. It starts at `BACKGROUND_NICE`, as a new head does
/// where a test asks (`RayHeads::start_new_heads_in_background`): on a real cluster a worker Pod starts on a
/// GPU node of its own, and here its start (raylet, Ray's agents, then the replica's Python worker) shared 2
/// cores with the old cluster's last replica serving half the traffic during ResourceAware's dip (CI of
/// 2026-11-27 15:13: 248 requests timed out at 90 % CPU pressure). No request reaches a node before a replica on it is RUNNING; from then on it runs at normal
/// priority. A test stand-in for separate nodes.
fn join(nodes: &Mutex<Nodes>, cluster: &str, netns: &str, head_ip: &str, pod: &Pod) {
    let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
        return;
    };
    let mut nodes = nodes.lock().unwrap();
    // One node starting at a time: several raylets registering at once on 2 cores time out.
    if nodes.running.contains_key(&pod.name_any()) || nodes.running.values().any(|w| !w.up()) {
        return;
    }
    // Ports offset by index; 40 slots stay below the ephemeral range.
    let index = nodes.next_index % 40;
    nodes.next_index += 1;
    let path = format!("/tmp/{netns}-worker-{index}.log");
    let log = std::fs::File::create(&path).unwrap();
    let app_dir = repo().join("tests/env/ray-app");
    let child = Command::new("nice")
        .args(["-n", BACKGROUND_NICE, "bash"])
        .arg(script())
        .args(["worker", netns, head_ip, &ip, &index.to_string()])
        .arg(&app_dir)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    nodes.started.push((pod.name_any(), cluster.to_string()));
    let group = child.id();
    let worker = Worker {
        child: Some(child),
        group,
        log: path,
        ip,
        background: true,
    };
    nodes.running.insert(pod.name_any(), worker);
}
