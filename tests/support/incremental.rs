//! One RayService under NewClusterWithIncrementalUpgrade on the real apiserver: the real KubeRay operator runs
//! its RayClusters (kube-scheduler and kwok their Pods), the fake dashboard plays Ray (kwok's Pods run none),
//! Traefik is the Gateway controller, and the real controller process runs the upgrade.

use std::{future::Future, time::Duration};

use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, Resource,
    api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use rayshift_api::RayService;
use serde_json::{Value, json};

use super::{
    cluster::{ControlPlane, control_plane_with_kuberay},
    controller::ControllerProcess,
    dashboard::FakeDashboard,
    observer::Observer,
    status::{active, condition_message, pending},
    traefik::{self, TraefikGateway},
};

pub struct Env {
    pub cp: &'static ControlPlane,
    pub client: Client,
    pub ns: String,
    pub infra: Option<String>,
    pub dashboard: FakeDashboard,
    pub gateway: TraefikGateway,
    pub controller: Option<ControllerProcess>,
}

pub const GATE: &str = "--feature-gates=RayServiceIncrementalUpgrade=true";

impl Env {
    pub async fn new(prefix: &str) -> Self {
        Self::start(prefix, false).await
    }

    /// With a second namespace, `infra`, where a platform team runs a shared Gateway (Traefik serves both).
    pub async fn start(prefix: &str, with_infra: bool) -> Self {
        let cp = control_plane_with_kuberay();
        let client = cp.client().await;
        assert!(cp.crds_established(&client).await);
        let ns = cp.namespace(&client, prefix).await;
        let infra = match with_infra {
            true => Some(cp.namespace(&client, "infra").await),
            false => None,
        };
        let dashboard = FakeDashboard::start().await;
        let also: Vec<&str> = infra.iter().map(String::as_str).collect();
        let gateway = TraefikGateway::start_watching(cp, client.clone(), &ns, &also).await;
        let mut env = Env {
            cp,
            client,
            ns,
            infra,
            dashboard,
            gateway,
            controller: None,
        };
        env.start_controller();
        env
    }

    pub fn start_controller(&mut self) {
        self.start_controller_with(&[]);
    }

    pub fn start_controller_with(&mut self, extra: &[&str]) {
        self.controller = None;
        let args: Vec<&str> = std::iter::once(GATE).chain(extra.iter().copied()).collect();
        self.controller = Some(ControllerProcess::start(
            self.cp,
            &self.ns,
            &self.dashboard.url_template(),
            &args,
        ));
    }

    pub fn rayservices(&self) -> Api<RayService> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub async fn get(&self) -> RayService {
        self.rayservices().get("llm").await.unwrap()
    }

    pub async fn patch(&self, patch: Value) {
        self.rayservices()
            .patch("llm", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    pub async fn eventually<T, F, Fut>(&self, what: &str, secs: u64, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        super::wait::eventually(what, secs, Duration::from_millis(50), check, || async {
            let logs = self.controller.as_ref().map(|c| c.logs()).unwrap_or_default();
            let status = serde_json::to_string_pretty(&self.get().await.status).unwrap();
            let routes = Api::<HttpRoute>::namespaced(self.client.clone(), &self.ns).list(&Default::default()).await;
            let routes: Vec<_> = routes.map(|l| l.items).unwrap_or_default().into_iter().map(|r| (r.metadata.name, r.status)).collect();
            format!(
                "status: {status}\n--- HTTPRoutes ---\n{routes:#?}\n--- controller logs ---\n{}\n--- KubeRay ---\n{}",
                super::wait::tail(&logs, 400),
                self.cp.kuberay_log(15)
            )
        })
        .await
    }

    /// Creates the RayService and waits until its first cluster serves all traffic.
    pub async fn deploy(&self, surge: i32, step: i32, interval: i32) -> String {
        self.deploy_annotated(surge, step, interval, json!({})).await
    }

    pub async fn deploy_annotated(&self, surge: i32, step: i32, interval: i32, annotations: Value) -> String {
        let mut rs = rayservice(surge, step, interval, "ray:1");
        rs["metadata"]["annotations"] = annotations;
        self.deploy_rayservice(rs).await
    }

    /// Waits until the `K` named `name` of this namespace is gone.
    pub async fn gone<K>(&self, name: &str, secs: u64)
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), &self.ns);
        let what = format!("{} {name} gone", K::kind(&()));
        self.eventually(&what, secs, || async {
            api.get_opt(name).await.unwrap().is_none().then_some(())
        })
        .await;
    }

    /// Creates `rs` (a RayService named `llm`) and waits until its first cluster serves all traffic.
    pub async fn deploy_rayservice(&self, rs: Value) -> String {
        let rs: RayService = serde_json::from_value(rs).unwrap();
        self.rayservices()
            .create(&PostParams::default(), &rs)
            .await
            .unwrap();
        self.eventually("the first cluster active at 100/100", 60, || async {
            let s = self.get().await.status?;
            let a = s.active_service_status?;
            (a.traffic_routed_percent == Some(100)
                && a.target_capacity == Some(100)
                && s.pending_service_status.is_none())
            .then_some(a.ray_cluster_name?)
        })
        .await
    }

    /// Changes the image: an upgrade starts; returns the pending cluster's name.
    pub async fn upgrade_to(&self, image: &str) -> String {
        self.patch(json!({"spec": {"rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [head(image)]}}}}}})).await;
        self.eventually("a pending cluster", 30, || async { pending(&self.get().await) })
            .await
    }

    pub fn dynamic<K: Resource<DynamicType = ()>>(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &ApiResource::erase::<K>(&()))
    }

    /// An object as the apiserver stores it, every field kept.
    pub async fn raw<K: Resource<DynamicType = ()>>(&self, ns: &str, name: &str) -> Value {
        serde_json::to_value(self.dynamic::<K>(ns).get(name).await.unwrap()).unwrap()
    }

    pub async fn create_raw<K: Resource<DynamicType = ()>>(&self, ns: &str, body: Value) {
        let object: DynamicObject = serde_json::from_value(body).unwrap();
        self.dynamic::<K>(ns)
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }

    pub async fn levels(&self) -> ((i32, i32), (i32, i32)) {
        let s = self.get().await.status.unwrap_or_default();
        let l = |side: Option<&rayshift_api::rayservice::ClusterServiceStatus>| {
            side.map_or((0, 0), |s| {
                (
                    s.target_capacity.unwrap_or(0),
                    s.traffic_routed_percent.unwrap_or(0),
                )
            })
        };
        (
            l(s.active_service_status.as_ref()),
            l(s.pending_service_status.as_ref()),
        )
    }

    /// The message of RollbackInProgress once it is True (waited for up to 20 s).
    pub async fn rollback_message(&self) -> String {
        self.eventually("RollbackInProgress", 20, || async {
            let (status, message) = condition_message(&self.get().await, "RollbackInProgress")?;
            (status == "True").then_some(message)
        })
        .await
    }

    /// Ready Pods of `cluster` that its serve Service selects (`ray.io/serve=true`).
    pub async fn serving_pods(&self, cluster: &str) -> i32 {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let selector = format!("ray.io/cluster={cluster},ray.io/serve=true");
        let list = pods.list(&ListParams::default().labels(&selector)).await.unwrap();
        list.items.iter().filter(|p| super::autoscaler::ready(p)).count() as i32
    }

    /// Waits until the pending cluster carries at least `percent` of the traffic.
    pub async fn pending_traffic_at_least(&self, percent: i32, secs: u64) {
        self.eventually(
            &format!("{percent}% of traffic on the pending cluster"),
            secs,
            || async { (self.levels().await.1.1 >= percent).then_some(()) },
        )
        .await;
    }

    pub async fn promoted_to(&self, cluster: &str, secs: u64) {
        self.eventually(&format!("{cluster} promoted"), secs, || async {
            let rs = self.get().await;
            (active(&rs).as_deref() == Some(cluster) && pending(&rs).is_none()).then_some(())
        })
        .await;
    }

    /// `kubectl rayshift ARGS -n NS`, through the real kubectl: the rayshift binary is on PATH as
    /// `kubectl-rayshift`, as krew installs it.
    pub fn kubectl_rayshift(&self, args: &[&str]) -> std::process::Command {
        let plugins = self.cp.dir.join("plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        let link = plugins.join("kubectl-rayshift");
        if !link.exists() {
            std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rayshift"), &link).unwrap();
        }
        let path = format!(
            "{}:{}",
            plugins.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = std::process::Command::new(super::cluster::kubectl());
        command
            .env("PATH", path)
            .env("KUBECONFIG", &self.cp.kubeconfig)
            .arg("rayshift")
            .args(args)
            .args(["-n", &self.ns]);
        command
    }

    /// Runs `kubectl rayshift ARGS`; its stdout, after checking it succeeded.
    pub fn rayshift_plugin(&self, args: &[&str]) -> String {
        let out = self.kubectl_rayshift(args).output().unwrap();
        assert!(
            out.status.success(),
            "kubectl rayshift {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn observe(&self, surge: i64) -> Observer {
        Observer::start(
            self.client.clone(),
            &self.ns,
            "llm",
            surge,
            self.dashboard.serving(&self.ns),
        )
    }

    /// `rayshift_upgrades_total` of this RayService with the given result.
    pub fn upgrades(&self, result: &str) -> f64 {
        let text = self.controller.as_ref().unwrap().metrics();
        let series = format!(
            "rayshift_upgrades_total{{name=\"llm\",namespace=\"{}\",result=\"{result}\"}}",
            self.ns
        );
        super::webhook::metric(&text, &series)
    }

    /// Notes of this namespace's events with `reason`, as `kubectl get events` lists them (each Event object
    /// once, with its series count when a message repeated).
    pub fn event_notes(&self, reason: &str) -> Vec<(String, i64)> {
        self.cp
            .events(&self.ns)
            .iter()
            .filter(|e| e["reason"] == reason)
            .map(|e| {
                let count = e["series"]["count"].as_i64().unwrap_or(1);
                (e["note"].as_str().unwrap_or_default().to_string(), count)
            })
            .collect()
    }

    pub async fn events(&self) -> Vec<String> {
        self.cp
            .events(&self.ns)
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
            .collect()
    }
}

pub fn head(image: &str) -> Value {
    json!({"name": "ray-head", "image": image, "ports": [{"name": "dashboard", "containerPort": 8265}, {"name": "serve", "containerPort": 8000}]})
}

pub fn rayservice(surge: i32, step: i32, interval: i32, image: &str) -> Value {
    json!({
        "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "llm"},
        "spec": {
            "managedBy": "rayshift.io/controller",
            "rayClusterDeletionDelaySeconds": 2,
            "upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": {
                "gatewayClassName": traefik::CLASS, "maxSurgePercent": surge, "stepSizePercent": step, "intervalSeconds": interval}},
            "serveConfigV2": "applications:\n  - name: llm\n    import_path: serve_llm:app\n    route_prefix: /\n    deployments:\n      - name: LLM\n        num_replicas: 10\n",
            "rayClusterConfig": {
                "enableInTreeAutoscaling": true,
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [head(image)]}}},
                "workerGroupSpecs": [{"groupName": "gpu", "replicas": 5, "minReplicas": 0, "maxReplicas": 5,
                    "template": {"spec": {"containers": [{"name": "ray-worker", "image": image}]}}}]
            }
        }
    })
}
