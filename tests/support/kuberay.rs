//! Test code playing KubeRay's RayCluster controller, for the states the real operator (with kwok) cannot
//! produce at will: for every RayCluster in a namespace it writes the status KubeRay would, creates the head
//! Pod and one serving worker Pod owned by the cluster, at a made-up IP, and sets their container statuses.
//! The test can break every head: its Ray container terminates while the Pod stays Running (a sidecar).
//! Every other test runs on the real KubeRay operator (`cluster::control_plane_with_kuberay`).

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use rayshift_api::RayCluster;
use serde_json::{Value, json};

/// Addresses of Pods and Services that have no host behind them (10.250.0.0/24 is never a head's).
pub const MADE_UP_POD_IP: &str = "10.250.0.12";
pub const MADE_UP_SERVICE_IP: &str = "10.250.0.11";

#[derive(Clone, Default)]
pub struct KubeRayStandIn {
    /// Every head's Ray container has terminated (the Pod stays Running because of a sidecar).
    pub all_heads_broken: Arc<std::sync::atomic::AtomicBool>,
    task: Option<Arc<tokio::task::JoinHandle<()>>>,
}

impl Drop for KubeRayStandIn {
    fn drop(&mut self) {
        if let Some(t) = self.task.take().and_then(|t| Arc::try_unwrap(t).ok()) {
            t.abort();
        }
    }
}

impl KubeRayStandIn {
    pub fn start(client: Client, ns: &str) -> Self {
        super::local_routes::require();
        let mut me = KubeRayStandIn::default();
        let all = me.all_heads_broken.clone();
        let ns = ns.to_string();
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = pass(&client, &ns, &all).await {
                    eprintln!("kuberay stand-in: {e}");
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        });
        me.task = Some(Arc::new(task));
        me
    }
}

/// `broken` is read for each Pod, after its cluster was listed: a cluster created after the test set it is
/// never given a healthy head first.
async fn pass(client: &Client, ns: &str, broken: &std::sync::atomic::AtomicBool) -> Result<(), kube::Error> {
    let clusters: Api<RayCluster> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // Made up, but inside the test hosts' range, whose unreachable route keeps anything sent there local.
    let ip = MADE_UP_POD_IP;
    for c in clusters.list(&ListParams::default()).await?.items {
        let name = c.name_any();
        if c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if c.status.as_ref().and_then(|s| s.state.as_deref()) != Some("ready") {
            let status = json!({"status": {
                "state": "ready", "readyWorkerReplicas": 1, "availableWorkerReplicas": 1, "desiredWorkerReplicas": 1,
                "observedGeneration": c.metadata.generation,
                "head": {"podIP": ip, "serviceIP": MADE_UP_SERVICE_IP, "podName": format!("{name}-head"), "serviceName": format!("{name}-head-svc")},
                "conditions": [{"type": "HeadPodReady", "status": "True", "reason": "HeadPodRunningAndReady", "message": "",
                                "lastTransitionTime": "2026-01-01T00:00:00Z"}]
            }});
            clusters
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
        }
        let ray_container = c
            .spec
            .head_group_spec
            .template
            .ray_container()
            .and_then(|r| r.name())
            .unwrap_or("ray-head")
            .to_string();
        let owner = json!([{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": name, "uid": c.metadata.uid, "controller": true}]);
        // Like KubeRay for a RayService: the head starts outside the serve Services, workers inside.
        let nodes = [
            (format!("{name}-head"), "head", "false"),
            (format!("{name}-worker"), "worker", "true"),
        ];
        for (pod_name, node_type, serve) in nodes {
            if pods.get_opt(&pod_name).await?.is_none() {
                let pod: Pod = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod_name, "ownerReferences": owner,
                                 "labels": {"ray.io/cluster": name, "ray.io/node-type": node_type, "ray.io/serve": serve}},
                    "spec": {"containers": [{"name": ray_container, "image": "rayproject/ray"}, {"name": "log-sidecar", "image": "busybox"}]}
                }))
                .unwrap();
                pods.create(&PostParams::default(), &pod).await?;
            }
            let is_broken = broken.load(std::sync::atomic::Ordering::SeqCst);
            let ray_ok = !(is_broken && node_type == "head");
            let state: Value = if ray_ok {
                json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}})
            } else {
                json!({"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:01:00Z"}})
            };
            let status = json!({"status": {
                "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                "conditions": [{"type": "Ready", "status": if ray_ok { "True" } else { "False" }}],
                "containerStatuses": [
                    {"name": ray_container, "ready": ray_ok, "restartCount": 0, "image": "rayproject/ray", "imageID": "", "state": state},
                    {"name": "log-sidecar", "ready": true, "restartCount": 0, "image": "busybox", "imageID": "",
                     "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
                ]
            }});
            let current = pods.get(&pod_name).await?;
            let want_ready = ray_ok;
            let is_ready = current
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.name == ray_container))
                .map(|c| c.ready);
            if is_ready != Some(want_ready) {
                pods.patch_status(&pod_name, &PatchParams::default(), &Patch::Merge(&status))
                    .await?;
            }
        }
    }
    Ok(())
}
