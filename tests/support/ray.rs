//! Real Ray Serve heads for the RayClusters of one namespace (the real-Ray test).
//!
//! - The real KubeRay operator runs every RayCluster: it creates the head Pod, kube-scheduler binds it to the
//!   kwok node, and kwok gives it an IP in 10.250.128.0/20. For each head Pod with an IP, a real Ray head starts
//!   in a network namespace of its own, at exactly that IP (`tests/env/ray.sh start ... ADDRESS`), so the Pod
//!   KubeRay made leads to that head: its Services, EndpointSlices and the apiserver's proxy reach the real
//!   Ray. When the RayCluster is gone, its head is stopped.
//! - A dashboard router at `http://127.0.0.1:PORT/{namespace}/{cluster}/...` stands in for cluster DNS: it
//!   forwards the controller's calls to that cluster's real dashboard, unchanged, and keeps every answer
//!   (what the controller was told, and when).
//! - A sampler asks every head directly, every 250 ms, what Serve really runs.
//! - A token-auth RayCluster's head wants the token KubeRay's operator put in the cluster's Secret, as the
//!   Pods KubeRay makes do (`RAY_AUTH_MODE`, `RAY_AUTH_TOKEN`): the router forwards the controller's
//!   `x-ray-authorization` as it came, and only the sampler is given the token by the test.

use std::{
    collections::{BTreeMap, BTreeSet},
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
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::{Api, Client, ResourceExt, api::ListParams};
use rayshift_api::RayCluster;
use serde_json::Value;

use super::{cluster::repo, observer::Serving};

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
    /// IPs of the nodes that run a replica (any state).
    pub replica_nodes: BTreeSet<String>,
    /// IPs of the nodes that run a RUNNING replica.
    pub running_nodes: BTreeSet<String>,
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
                let mut running = 0;
                for r in replicas.into_iter().flatten() {
                    let is_running = r.get("state").and_then(Value::as_str) == Some("RUNNING");
                    running += usize::from(is_running);
                    if let Some(ip) = r.get("node_ip").and_then(Value::as_str) {
                        view.replica_nodes.insert(ip.to_string());
                        if is_running {
                            view.running_nodes.insert(ip.to_string());
                        }
                    }
                }
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

/// A cluster's head, once it answers: (network namespace, IP).
pub type HeadLookup = dyn Fn(&str) -> Option<(String, String)> + Send + Sync;

#[derive(Clone, Debug)]
pub struct Head {
    pub netns: String,
    pub index: u32,
    /// The head Pod's IP, which the head takes.
    pub address: String,
    /// None while the head starts.
    pub ip: Option<String>,
    pub started: Instant,
    /// At `BACKGROUND_NICE` until its Serve apps are first RUNNING (see there).
    pub background: bool,
    /// The token a token-auth cluster's head wants.
    pub token: Option<String>,
}

/// Niceness of a head until its Serve apps are first RUNNING, where a test asks for it. On a real cluster a new
/// head and its replicas start on nodes of their own; here they share 2 cores with the serving head, and their
/// start (Ray's daemons, then Serve's controller, proxy and replicas, all Python) starved the serving head until
/// requests to it timed out while it still carried all the traffic (CI of 2026-11-27 14:29, CPU pressure 93 %).
/// A cluster gets traffic only once RUNNING, so from then on both run at the same priority. A test stand-in for
/// separate nodes.
pub const BACKGROUND_NICE: &str = "10";

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
    /// New heads start at `BACKGROUND_NICE` (`RayHeads::start_new_heads_in_background`).
    background_starts: AtomicBool,
}

pub struct RayHeads {
    shared: Arc<Shared>,
    router_addr: std::net::SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RayHeads {
    /// Installs nothing (`ray.sh install` runs before the tests); serves the RayClusters of `ns`.
    pub async fn start(client: Client, ns: &str) -> Self {
        super::local_routes::require();
        let shared = Arc::new(Shared::default());
        // Private addresses per test process, so a head left by a killed run cannot clash.
        shared
            .next_index
            .store(1 + (std::process::id() % 50) * 5, Ordering::Relaxed);
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
            tasks,
        }
    }

    /// From now on a new head and its Serve processes start at `BACKGROUND_NICE`, until its apps are first
    /// RUNNING. For a test whose load must not fail while a new head starts beside the serving one; tests that
    /// bound how fast a new cluster converges leave it off.
    pub fn start_new_heads_in_background(&self) {
        self.shared.background_starts.store(true, Ordering::Relaxed);
    }

    /// The `--dashboard-url-template` that reaches every cluster's real dashboard.
    pub fn url_template(&self) -> String {
        format!("http://{}/{{namespace}}/{{cluster}}", self.router_addr)
    }

    /// Every head that answers, as (RayCluster, IP), whenever asked.
    pub fn address_book(&self) -> impl Fn() -> Vec<(String, String)> + Send + 'static {
        let shared = self.shared.clone();
        move || {
            let heads = shared.heads.lock().unwrap();
            heads
                .iter()
                .filter_map(|(cluster, h)| Some((cluster.clone(), h.ip.clone()?)))
                .collect()
        }
    }

    /// A cluster's head, once it answers: (network namespace, IP), whenever asked.
    pub fn head_lookup(&self) -> Arc<HeadLookup> {
        let shared = self.shared.clone();
        Arc::new(move |cluster| {
            let heads = shared.heads.lock().unwrap();
            let h = heads.get(cluster)?;
            Some((h.netns.clone(), h.ip.clone()?))
        })
    }

    pub fn head(&self, cluster: &str) -> Option<Head> {
        self.shared.heads.lock().unwrap().get(cluster).cloned()
    }

    /// Sends `STOP` or `CONT` to the dashboard process of `cluster`'s head; false when there is none.
    pub fn signal_dashboard(&self, cluster: &str, signal: &str) -> bool {
        self.head(cluster).is_some_and(|head| {
            Command::new("bash")
                .arg(script())
                .args(["dashboard-signal", &head.netns, signal])
                .status()
                .is_ok_and(|s| s.success())
        })
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
        let head = self.head(cluster)?;
        look(&self.shared.http, head.ip.as_deref()?, head.token.as_deref()).await
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

/// What Serve runs on the head at `ip`, asked directly (with its token if it wants one).
pub async fn look(http: &reqwest::Client, ip: &str, token: Option<&str>) -> Option<ServeView> {
    let mut req = http
        .get(format!("http://{ip}:8265/api/serve/applications/"))
        .timeout(Duration::from_secs(2));
    if let Some(token) = token {
        req = req.header(TOKEN_HEADER, format!("Bearer {token}"));
    }
    let resp = req.send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    ServeView::parse(&resp.bytes().await.ok()?)
}

/// Starts a head for every new RayCluster once KubeRay's head Pod has an IP, and stops the heads of RayClusters
/// that are gone.
async fn lifecycle(client: Client, ns: String, shared: Arc<Shared>) {
    let clusters: Api<RayCluster> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    loop {
        let heads = pods
            .list(&ListParams::default().labels("ray.io/node-type=head"))
            .await;
        if let (Ok(list), Ok(heads)) = (clusters.list(&ListParams::default()).await, heads) {
            let live: Vec<&RayCluster> = list
                .items
                .iter()
                .filter(|c| c.metadata.deletion_timestamp.is_none())
                .collect();
            for cluster in &live {
                let name = &cluster.name_any();
                if shared.heads.lock().unwrap().contains_key(name) {
                    continue;
                }
                let Some(address) = pod_ip(&heads.items, name) else {
                    continue;
                };
                // KubeRay creates the Secret before the head Pod; a head wanting a token waits for it.
                let token = match cluster.spec.auth_token_secret(name) {
                    Some(secret) => match token(&secrets, &secret).await {
                        Some(t) => Some(t),
                        None => continue,
                    },
                    None => None,
                };
                // kwok may hand a freed address to a new Pod while the old head is still being stopped.
                if shared
                    .heads
                    .lock()
                    .unwrap()
                    .values()
                    .any(|h| h.address == address)
                {
                    continue;
                }
                let index = shared.next_index.fetch_add(1, Ordering::Relaxed);
                let head = Head {
                    netns: format!("rayshift-{}-{index}", std::process::id()),
                    index,
                    address,
                    ip: None,
                    started: Instant::now(),
                    background: shared.background_starts.load(Ordering::Relaxed),
                    token,
                };
                shared.heads.lock().unwrap().insert(name.clone(), head.clone());
                tokio::spawn(start_head(shared.clone(), name.clone(), head));
            }
            let gone: Vec<(String, Head)> = shared
                .heads
                .lock()
                .unwrap()
                .iter()
                .filter(|(n, h)| !live.iter().any(|c| &c.name_any() == *n) && h.ip.is_some())
                .map(|(n, h)| (n.clone(), h.clone()))
                .collect();
            for (name, head) in gone {
                stop_head(&shared, name, head).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The header Ray's token auth reads (beside `Authorization`), as KubeRay's dashboard client sends it.
pub const TOKEN_HEADER: &str = "x-ray-authorization";

/// The `auth_token` of a Secret, once it has one.
async fn token(secrets: &Api<Secret>, name: &str) -> Option<String> {
    let secret = secrets.get_opt(name).await.ok()??;
    let bytes = secret.data?.remove("auth_token")?;
    Some(String::from_utf8(bytes.0).ok()?.trim().to_string())
}

/// The IP kwok gave the head Pod of `cluster`.
fn pod_ip(heads: &[Pod], cluster: &str) -> Option<String> {
    heads
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.labels().get("ray.io/cluster").map(String::as_str) == Some(cluster))
        .find_map(|p| p.status.as_ref()?.pod_ip.clone())
}

async fn stop_head(shared: &Shared, name: String, head: Head) {
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

async fn start_head(shared: Arc<Shared>, cluster: String, head: Head) {
    let app_dir = repo().join("tests/env/ray-app");
    let (netns, index, address) = (head.netns.clone(), head.index, head.address.clone());
    let nice = if head.background { BACKGROUND_NICE } else { "0" };
    let token = head.token.clone();
    let out = tokio::task::spawn_blocking(move || {
        let mut start = Command::new("bash");
        start
            .arg(script())
            .args([
                "start",
                &netns,
                &index.to_string(),
                &app_dir.to_string_lossy(),
                &address,
            ])
            .env("RAYSHIFT_OWNER_PID", std::process::id().to_string())
            .env("RAYSHIFT_RAY_NICE", nice);
        if let Some(token) = token {
            start.env("RAY_AUTH_MODE", "token").env("RAY_AUTH_TOKEN", token);
        }
        start.output()
    })
    .await;
    match out {
        Ok(Ok(o)) if o.status.success() && !shared.closing.load(Ordering::Relaxed) => {
            let took = head.started.elapsed();
            shared.ready_after.lock().unwrap().insert(cluster.clone(), took);
            if let Some(h) = shared.heads.lock().unwrap().get_mut(&cluster) {
                h.ip = Some(head.address);
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

async fn sample(shared: Arc<Shared>) {
    loop {
        let heads: Vec<(String, Head)> = shared
            .heads
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, h)| h.ip.is_some())
            .map(|(n, h)| (n.clone(), h.clone()))
            .collect();
        for (cluster, head) in heads {
            let ip = head.ip.as_deref().unwrap_or_default();
            let view = look(&shared.http, ip, head.token.as_deref()).await;
            if head.background {
                let running = view.as_ref().is_some_and(ServeView::all_running);
                set_priority(&head.netns, if running { "0" } else { BACKGROUND_NICE }).await;
                if running && let Some(h) = shared.heads.lock().unwrap().get_mut(&cluster) {
                    h.background = false;
                }
            }
            shared.samples.lock().unwrap().push(Sample {
                at: Instant::now(),
                cluster,
                view,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Renices a head's processes, the ones Ray started since the last call included.
async fn set_priority(netns: &str, nice: &'static str) {
    let netns = netns.to_string();
    let _ = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .arg(script())
            .args(["priority", &netns, nice])
            .status()
    })
    .await;
}

/// Forwards one dashboard call to the cluster's real head, unchanged, and keeps the answer.
async fn forward(
    State(shared): State<Arc<Shared>>,
    Path((_ns, cluster, rest)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    method: Method,
    headers: axum::http::HeaderMap,
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
    if let Some(token) = headers.get(TOKEN_HEADER) {
        req = req.header(TOKEN_HEADER, token.clone());
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
