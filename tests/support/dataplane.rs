//! A weighted data plane that follows the HTTPRoute: test code playing the Gateway controller in front of
//! a real nginx (Debian's, run by `tests/env/nginx.sh`).
//!
//! For the namespace's HTTPRoute it resolves every backendRef the way a Gateway implementation does
//! (Service -> selector -> Ready Pods -> podIP:targetPort), writes an nginx upstream with the route's
//! weights, reloads nginx gracefully and waits until the new workers answer with the new config's
//! generation. Only then does it report the route Accepted for that generation, so "the route is ready"
//! means "the traffic really follows these weights".

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::PathBuf,
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use gateway_api::{gateways::Gateway, httproutes::HttpRoute};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{Api, Client, api::ListParams};

use super::{
    cluster::repo,
    gateway::{accept_gateways, accept_route},
    webhook::free_port,
};

const MESSAGE: &str = "programmed into the test nginx";

/// One config nginx really served: when its workers first answered, and the weight per RayCluster.
#[derive(Clone, Debug)]
pub struct Live {
    /// When the reload was asked for: from here until `at`, old and new workers both take requests.
    pub requested: Instant,
    pub at: Instant,
    pub generation: u64,
    pub weights: BTreeMap<String, i64>,
}

pub struct NginxGateway {
    pub port: u16,
    dir: PathBuf,
    live: Arc<Mutex<Vec<Live>>>,
    errors: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

fn script() -> PathBuf {
    repo().join("tests/env/nginx.sh")
}

fn nginx(args: &[&str]) -> Result<(), String> {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .env("RAYSHIFT_OWNER_PID", std::process::id().to_string())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// One upstream server: address and weight (nginx has no weight 0: those are left out).
type Upstream = Vec<(String, i64)>;

fn config(port: u16, dir: &std::path::Path, generation: u64, upstream: &Upstream) -> String {
    let mut servers = String::new();
    for (addr, weight) in upstream.iter().filter(|(_, w)| *w > 0) {
        let _ = writeln!(servers, "    server {addr} weight={weight};");
    }
    if servers.is_empty() {
        // No backend yet: nothing listens there, every request fails (and the test would see it).
        servers.push_str("    server 127.0.0.1:9 down;\n");
    }
    let d = dir.display();
    format!(
        "worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log error;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/tmp/body;
  proxy_temp_path {d}/tmp/proxy;
  upstream serve {{
{servers}  }}
  server {{
    listen 127.0.0.1:{port};
    location = /-/generation {{ return 200 '{generation}'; }}
    location / {{
      proxy_pass http://serve;
      # Failures must show, not be retried away on the other cluster.
      proxy_next_upstream off;
      proxy_connect_timeout 2s;
      proxy_read_timeout 30s;
    }}
  }}
}}
"
    )
}

impl NginxGateway {
    pub async fn start(client: Client, ns: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("rayshift-nginx-")
            .tempdir()
            .unwrap()
            .keep();
        let port = free_port();
        std::fs::write(dir.join("nginx.conf"), config(port, &dir, 0, &Vec::new())).unwrap();
        nginx(&["start", &dir.to_string_lossy()]).expect("start nginx");
        let live = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(follow(
            client,
            ns.to_string(),
            port,
            dir.clone(),
            live.clone(),
            errors.clone(),
        ));
        NginxGateway {
            port,
            dir,
            live,
            errors,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// Every config nginx served, in order.
    pub fn live(&self) -> Vec<Live> {
        self.live.lock().unwrap().clone()
    }

    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }

    /// nginx's own error log (upstream failures are logged there).
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }
}

impl Drop for NginxGateway {
    fn drop(&mut self) {
        self.task.abort();
        let _ = nginx(&["stop", &self.dir.to_string_lossy()]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn follow(
    client: Client,
    ns: String,
    port: u16,
    dir: PathBuf,
    live: Arc<Mutex<Vec<Live>>>,
    errors: Arc<Mutex<Vec<String>>>,
) {
    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &ns);
    let routes: Api<HttpRoute> = Api::namespaced(client.clone(), &ns);
    let mut current: Option<Upstream> = None;
    // No idle connections: each probe must be accepted by whichever workers accept now.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut generation = 0u64;
    loop {
        accept_gateways(&gateways, MESSAGE).await;
        let all = match routes.list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(e) => {
                errors.lock().unwrap().push(format!("listing HTTPRoutes: {e}"));
                Vec::new()
            }
        };
        // One RayService per test namespace: one route.
        if let Some(route) = all.first() {
            match resolve(&client, &ns, route).await {
                Ok((upstream, weights)) => {
                    if current.as_ref() != Some(&upstream) {
                        generation += 1;
                        let requested = Instant::now();
                        match program(&http, port, &dir, generation, &upstream).await {
                            Ok(at) => {
                                live.lock().unwrap().push(Live {
                                    requested,
                                    at,
                                    generation,
                                    weights,
                                });
                                current = Some(upstream);
                            }
                            Err(e) => errors.lock().unwrap().push(e),
                        }
                    }
                    if current.is_some() {
                        accept_route(&routes, &ns, route, "rayshift.io/test-nginx-gateway", MESSAGE).await;
                    }
                }
                Err(e) => {
                    let mut errs = errors.lock().unwrap();
                    if errs.last() != Some(&e) {
                        errs.push(e);
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// backendRefs -> (upstream servers, weight per RayCluster).
async fn resolve(
    client: &Client,
    ns: &str,
    route: &HttpRoute,
) -> Result<(Upstream, BTreeMap<String, i64>), String> {
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut upstream = Vec::new();
    let mut weights = BTreeMap::new();
    for backend in route
        .spec
        .rules
        .iter()
        .flatten()
        .flat_map(|r| r.backend_refs.iter().flatten())
    {
        let weight = i64::from(backend.weight.unwrap_or(1));
        let svc = services
            .get(&backend.name)
            .await
            .map_err(|e| format!("backend Service {}: {e}", backend.name))?;
        let spec = svc.spec.unwrap_or_default();
        let selector = spec.selector.unwrap_or_default();
        let cluster = selector.get("ray.io/cluster").cloned().unwrap_or_default();
        weights.insert(cluster, weight);
        if weight == 0 {
            continue;
        }
        let target = spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .find(|p| Some(p.port) == backend.port)
            .and_then(|p| p.target_port)
            .map(|t| match t {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i) => i.to_string(),
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s,
            })
            .ok_or_else(|| format!("backend Service {} has no port {:?}", backend.name, backend.port))?;
        let labels = selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut ips: Vec<String> = pods
            .list(&ListParams::default().labels(&labels))
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter_map(|p| {
                let status = p.status?;
                let ready = status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ready.then_some(status.pod_ip).flatten()
            })
            .collect();
        ips.sort();
        ips.dedup();
        if ips.is_empty() {
            return Err(format!("backend Service {} has no ready endpoints", backend.name));
        }
        // The route's weight is split over the backend's endpoints.
        let share = (weight / ips.len() as i64).max(1);
        upstream.extend(ips.into_iter().map(|ip| (format!("{ip}:{target}"), share)));
    }
    Ok((upstream, weights))
}

/// Writes and reloads the config; returns when nginx's workers answer with the new generation.
async fn program(
    http: &reqwest::Client,
    port: u16,
    dir: &std::path::Path,
    generation: u64,
    upstream: &Upstream,
) -> Result<Instant, String> {
    std::fs::write(dir.join("nginx.conf"), config(port, dir, generation, upstream))
        .map_err(|e| e.to_string())?;
    let d = dir.to_string_lossy().to_string();
    tokio::task::spawn_blocking(move || nginx(&["reload", &d]))
        .await
        .map_err(|e| e.to_string())??;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(r) = http
            .get(format!("http://127.0.0.1:{port}/-/generation"))
            .send()
            .await
            && r.text().await.ok().as_deref() == Some(generation.to_string().as_str())
        {
            return Ok(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(format!("nginx did not take config generation {generation}"))
}
