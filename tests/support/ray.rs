//! Real Ray Serve heads for the RayClusters of one namespace (the real-Ray test).
//!
//! - Every RayCluster gets its own real Ray head, started by `tests/env/ray.sh` in a network namespace of
//!   its own (10.250.N.2); when the RayCluster is gone, its head is stopped. Test code still plays KubeRay
//!   for the Kubernetes side ([`KubeRayStandIn`]): the cluster turns ready, and its Pods carry the head's
//!   address, once the head answers.
//! - A dashboard router at `http://127.0.0.1:PORT/{namespace}/{cluster}/...` stands in for cluster DNS: it
//!   forwards the controller's calls to that cluster's real dashboard, unchanged, and keeps every answer
//!   (what the controller was told, and when).
//! - A sampler asks every head directly, every 250 ms, what Serve really runs.
//! - Like KubeRay, each cluster gets a `{cluster}-head-svc` Service; its Endpoints (written here, as no
//!   endpoints controller runs) hold the head's address, so the apiserver's service proxy reaches it too.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::Command,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Bytes,
    extract::{Path, RawQuery, State},
    http::{Method, StatusCode},
    response::{IntoResponse, Response},
    routing::any,
};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, PostParams},
};
use rayshift_api::RayCluster;
use serde_json::{Value, json};

use super::{
    cluster::repo,
    kuberay::{HeadAddress, KubeRayStandIn},
    observer::Serving,
};

pub fn script() -> PathBuf {
    repo().join("tests/env/ray.sh")
}

/// What Serve runs on one cluster, read from `GET /api/serve/applications/`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServeView {
    pub target_capacity: Option<f64>,
    /// App name -> status.
    pub apps: BTreeMap<String, String>,
    /// Deployment -> replicas in state RUNNING.
    pub running: BTreeMap<String, usize>,
    /// Deployment -> replicas in any state.
    pub replicas: BTreeMap<String, usize>,
}

impl ServeView {
    pub fn parse(body: &[u8]) -> Option<Self> {
        let v: Value = serde_json::from_slice(body).ok()?;
        let mut view = ServeView {
            target_capacity: v.get("target_capacity").and_then(Value::as_f64),
            ..Default::default()
        };
        for (name, app) in v.get("applications")?.as_object()? {
            let status = app.get("status").and_then(Value::as_str).unwrap_or_default();
            view.apps.insert(name.clone(), status.to_string());
            for (d, dep) in app
                .get("deployments")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                let replicas = dep.get("replicas").and_then(Value::as_array);
                let running = replicas
                    .into_iter()
                    .flatten()
                    .filter(|r| r.get("state").and_then(Value::as_str) == Some("RUNNING"))
                    .count();
                view.running.insert(d.clone(), running);
                view.replicas.insert(d.clone(), replicas.map_or(0, Vec::len));
            }
        }
        Some(view)
    }

    pub fn all_running(&self) -> bool {
        !self.apps.is_empty() && self.apps.values().all(|s| s == "RUNNING")
    }

    /// RUNNING replicas of the one deployment (the test app has one).
    pub fn running_replicas(&self) -> usize {
        self.running.values().copied().min().unwrap_or(0)
    }

    /// Serve has settled: every replica it has is RUNNING (none starting or stopping).
    pub fn settled(&self) -> bool {
        self.all_running() && self.running == self.replicas
    }
}

/// Serve's replica count for `replicas` at a target capacity: round half up, at least 1 above 0.
pub fn replicas_at(replicas: usize, capacity: f64) -> usize {
    if capacity <= 0.0 {
        0
    } else {
        ((replicas as f64 * capacity / 100.0) + 0.5).floor().max(1.0) as usize
    }
}

#[derive(Clone, Debug)]
pub enum Call {
    /// The controller read the status and was told this.
    Get(Option<ServeView>),
    /// The controller PUT a config with this target capacity.
    Put(Option<f64>),
}

/// One answer the real dashboard gave the controller.
#[derive(Clone, Debug)]
pub struct Answer {
    pub at: Instant,
    pub cluster: String,
    pub call: Call,
    pub status: u16,
}

/// One look at a head by the sampler.
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: Instant,
    pub cluster: String,
    pub view: Option<ServeView>,
}

#[derive(Clone, Debug)]
pub struct Head {
    pub netns: String,
    pub index: u32,
    /// None while the head starts.
    pub ip: Option<String>,
    pub started: Instant,
}

#[derive(Default)]
struct Shared {
    /// One client for the router's forwarding and the sampler's looks.
    http: reqwest::Client,
    heads: Mutex<BTreeMap<String, Head>>,
    answers: Mutex<Vec<Answer>>,
    samples: Mutex<Vec<Sample>>,
    /// RayCluster name -> when its head was stopped.
    stopped: Mutex<BTreeMap<String, Instant>>,
    /// RayCluster name -> how long its head took to start.
    ready_after: Mutex<BTreeMap<String, Duration>>,
    failures: Mutex<Vec<String>>,
    next_index: AtomicU32,
    closing: AtomicBool,
}

pub struct RayHeads {
    shared: Arc<Shared>,
    router_addr: std::net::SocketAddr,
    _kuberay: KubeRayStandIn,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RayHeads {
    /// Installs nothing (`ray.sh install` runs before the tests); serves the RayClusters of `ns`.
    pub async fn start(client: Client, ns: &str) -> Self {
        let shared = Arc::new(Shared::default());
        // Private addresses per test process, so a head left by a killed run cannot clash.
        shared
            .next_index
            .store(1 + (std::process::id() % 50) * 5, Ordering::Relaxed);
        let lookup = shared.clone();
        let address: HeadAddress = Arc::new(move |cluster: &str| {
            lookup
                .heads
                .lock()
                .unwrap()
                .get(cluster)
                .and_then(|h| h.ip.clone())
        });
        // Serve runs on the head only (HeadOnly proxy, no worker Pods): traffic reaches a cluster only once
        // the controller has put its head behind the serve Service.
        let kuberay = KubeRayStandIn::start_with(client.clone(), ns, address, false);

        let router = Router::new()
            .route("/{ns}/{cluster}/{*rest}", any(forward))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let router_addr = listener.local_addr().unwrap();
        let mut tasks = vec![tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap()
        })];
        tasks.push(tokio::spawn(lifecycle(client, ns.to_string(), shared.clone())));
        tasks.push(tokio::spawn(sample(shared.clone())));
        RayHeads {
            shared,
            router_addr,
            _kuberay: kuberay,
            tasks,
        }
    }

    /// The `--dashboard-url-template` that reaches every cluster's real dashboard.
    pub fn url_template(&self) -> String {
        format!("http://{}/{{namespace}}/{{cluster}}", self.router_addr)
    }

    pub fn head(&self, cluster: &str) -> Option<Head> {
        self.shared.heads.lock().unwrap().get(cluster).cloned()
    }

    pub fn answers(&self) -> Vec<Answer> {
        self.shared.answers.lock().unwrap().clone()
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.shared.samples.lock().unwrap().clone()
    }

    pub fn ready_after(&self, cluster: &str) -> Option<Duration> {
        self.shared.ready_after.lock().unwrap().get(cluster).copied()
    }

    pub fn stopped(&self, cluster: &str) -> Option<Instant> {
        self.shared.stopped.lock().unwrap().get(cluster).copied()
    }

    /// Heads that failed to start or stop.
    pub fn failures(&self) -> Vec<String> {
        self.shared.failures.lock().unwrap().clone()
    }

    /// The latest view the controller was given for `cluster` before `t`.
    pub fn told_before(&self, cluster: &str, t: Instant) -> Option<(Instant, ServeView)> {
        latest_view(&self.shared.answers.lock().unwrap(), cluster, t)
    }

    /// For the invariant observer: a cluster may carry `weight`% only if the real dashboard last told the
    /// controller that its apps are RUNNING with the replicas that weight needs.
    pub fn serving(&self, replicas: usize) -> Serving {
        let shared = self.shared.clone();
        Arc::new(move |cluster, weight| {
            let told = latest_view(&shared.answers.lock().unwrap(), cluster, Instant::now()).map(|(_, v)| v);
            let need = replicas_at(replicas, weight as f64);
            match told {
                Some(v) if v.all_running() && v.running_replicas() >= need => Ok(()),
                Some(v) => Err(format!(
                    "Ray last reported apps {:?} with {} RUNNING replicas (needs {need})",
                    v.apps,
                    v.running_replicas()
                )),
                None => Err("Ray never reported its Serve status".into()),
            }
        })
    }

    /// Reads a head's Serve status directly (not through the router).
    pub async fn view(&self, cluster: &str) -> Option<ServeView> {
        let ip = self.head(cluster)?.ip?;
        look(&self.shared.http, &ip).await
    }
}

/// The latest Serve status the real dashboard gave the controller for `cluster` at or before `t`.
fn latest_view(answers: &[Answer], cluster: &str, t: Instant) -> Option<(Instant, ServeView)> {
    answers
        .iter()
        .filter(|a| a.cluster == cluster && a.at <= t && a.status == 200)
        .filter_map(|a| match &a.call {
            Call::Get(Some(v)) => Some((a.at, v.clone())),
            _ => None,
        })
        .next_back()
}

impl Drop for RayHeads {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Relaxed);
        self.tasks.iter().for_each(|t| t.abort());
        let heads: Vec<Head> = self.shared.heads.lock().unwrap().values().cloned().collect();
        for h in heads {
            let _ = Command::new("bash")
                .arg(script())
                .args(["stop", &h.netns])
                .status();
        }
    }
}

async fn look(http: &reqwest::Client, ip: &str) -> Option<ServeView> {
    let resp = http
        .get(format!("http://{ip}:8265/api/serve/applications/"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    ServeView::parse(&resp.bytes().await.ok()?)
}

/// Starts a head for every new RayCluster and stops the heads of RayClusters that are gone.
async fn lifecycle(client: Client, ns: String, shared: Arc<Shared>) {
    let clusters: Api<RayCluster> = Api::namespaced(client, &ns);
    loop {
        if let Ok(list) = clusters.list(&ListParams::default()).await {
            let live: Vec<String> = list
                .items
                .iter()
                .filter(|c| c.metadata.deletion_timestamp.is_none())
                .map(|c| c.name_any())
                .collect();
            for name in &live {
                if shared.heads.lock().unwrap().contains_key(name) {
                    continue;
                }
                let index = shared.next_index.fetch_add(1, Ordering::Relaxed);
                let head = Head {
                    netns: format!("rayshift-{}-{index}", std::process::id()),
                    index,
                    ip: None,
                    started: Instant::now(),
                };
                shared.heads.lock().unwrap().insert(name.clone(), head.clone());
                tokio::spawn(start_head(clusters.clone(), shared.clone(), name.clone(), head));
            }
            let gone: Vec<(String, Head)> = shared
                .heads
                .lock()
                .unwrap()
                .iter()
                .filter(|(n, h)| !live.contains(n) && h.ip.is_some())
                .map(|(n, h)| (n.clone(), h.clone()))
                .collect();
            for (name, head) in gone {
                let netns = head.netns.clone();
                let ok = tokio::task::spawn_blocking(move || {
                    Command::new("bash")
                        .arg(script())
                        .args(["stop", &netns])
                        .status()
                        .is_ok_and(|s| s.success())
                })
                .await
                .unwrap_or(false);
                if !ok {
                    shared
                        .failures
                        .lock()
                        .unwrap()
                        .push(format!("stopping the head of {name} failed"));
                }
                shared.heads.lock().unwrap().remove(&name);
                shared.stopped.lock().unwrap().insert(name, Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn start_head(clusters: Api<RayCluster>, shared: Arc<Shared>, cluster: String, head: Head) {
    let app_dir = repo().join("tests/env/ray-app");
    let (netns, index) = (head.netns.clone(), head.index);
    let out = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .arg(script())
            .args(["start", &netns, &index.to_string(), &app_dir.to_string_lossy()])
            .env("RAYSHIFT_OWNER_PID", std::process::id().to_string())
            .output()
    })
    .await;
    let ip = format!("10.250.{index}.2");
    match out {
        Ok(Ok(o)) if o.status.success() && !shared.closing.load(Ordering::Relaxed) => {
            if let Err(e) = publish_head_service(&clusters, &cluster, &ip).await {
                shared
                    .failures
                    .lock()
                    .unwrap()
                    .push(format!("the head Service of {cluster}: {e}"));
            }
            let took = head.started.elapsed();
            shared.ready_after.lock().unwrap().insert(cluster.clone(), took);
            if let Some(h) = shared.heads.lock().unwrap().get_mut(&cluster) {
                h.ip = Some(ip);
            }
        }
        other => {
            let why = match other {
                Ok(Ok(o)) => String::from_utf8_lossy(&o.stderr).to_string(),
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            shared
                .failures
                .lock()
                .unwrap()
                .push(format!("the head of {cluster} did not start: {why}"));
        }
    }
}

/// `{cluster}-head-svc` and its Endpoints, owned by the RayCluster (garbage-collected with it).
async fn publish_head_service(
    clusters: &Api<RayCluster>,
    cluster: &str,
    ip: &str,
) -> Result<(), kube::Error> {
    let rc = clusters.get(cluster).await?;
    let ns = rc.namespace().unwrap_or_default();
    let client = clusters.clone().into_client();
    let name = format!("{cluster}-head-svc");
    let owner = json!([{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster, "uid": rc.metadata.uid, "controller": true}]);
    let ports = json!([{"name": "dashboard", "port": 8265, "protocol": "TCP"}, {"name": "serve", "port": 8000, "protocol": "TCP"}]);
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "ownerReferences": owner, "labels": {"ray.io/cluster": cluster}},
        "spec": {"ports": ports}
    }))
    .unwrap();
    let endpoints: Endpoints = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": name, "ownerReferences": owner, "labels": {"ray.io/cluster": cluster}},
        // The apiserver's proxy only goes to addresses that name the Pod holding them.
        "subsets": [{"addresses": [{"ip": ip, "targetRef": {"kind": "Pod", "name": format!("{cluster}-head"), "namespace": ns}}],
                     "ports": ports}]
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &service)
        .await?;
    Api::<Endpoints>::namespaced(client, &ns)
        .create(&PostParams::default(), &endpoints)
        .await?;
    Ok(())
}

async fn sample(shared: Arc<Shared>) {
    loop {
        let heads: Vec<(String, String)> = shared
            .heads
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(n, h)| Some((n.clone(), h.ip.clone()?)))
            .collect();
        for (cluster, ip) in heads {
            let view = look(&shared.http, &ip).await;
            shared.samples.lock().unwrap().push(Sample {
                at: Instant::now(),
                cluster,
                view,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Forwards one dashboard call to the cluster's real head, unchanged, and keeps the answer.
async fn forward(
    State(shared): State<Arc<Shared>>,
    Path((_ns, cluster, rest)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    method: Method,
    body: Bytes,
) -> Response {
    let Some(ip) = shared
        .heads
        .lock()
        .unwrap()
        .get(&cluster)
        .and_then(|h| h.ip.clone())
    else {
        return (StatusCode::BAD_GATEWAY, format!("no Ray head for {cluster}")).into_response();
    };
    let mut url = format!("http://{ip}:8265/{rest}");
    if let Some(q) = query {
        url = format!("{url}?{q}");
    }
    let mut req = shared
        .http
        .request(method.clone(), &url)
        .timeout(Duration::from_secs(30));
    if !body.is_empty() {
        req = req.header("content-type", "application/json").body(body.clone());
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.unwrap_or_default();
    let call = if method == Method::PUT {
        let sent: Option<Value> = serde_json::from_slice(&body).ok();
        Some(Call::Put(
            sent.and_then(|v| v.get("target_capacity").and_then(Value::as_f64)),
        ))
    } else if method == Method::GET && rest.starts_with("api/serve/applications") {
        Some(Call::Get(ServeView::parse(&bytes)))
    } else {
        None
    };
    if let Some(call) = call {
        shared.answers.lock().unwrap().push(Answer {
            at: Instant::now(),
            cluster,
            call,
            status,
        });
    }
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        bytes,
    )
        .into_response()
}
