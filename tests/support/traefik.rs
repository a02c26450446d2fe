//! Traefik, a real Gateway API implementation, as the tests' Gateway controller and data plane
//! (`tests/env/traefik.sh`): it accepts the namespace's Gateways and HTTPRoutes (writing their status itself),
//! resolves every backendRef to the ready EndpointSlice addresses of its Service, and balances the route's
//! weights round robin. It listens on a loopback address of its own, port 80 (rayshift's Gateway listener).
//!
//! Test code only watches: the routes' weights as the apiserver had them, and when Traefik accepted each
//! generation, so a test can tell which split the data plane was asked to carry when. The HTTPRoute and the
//! GRPCRoute are followed apart: rayshift writes the GRPCRoute after the HTTPRoute, and Traefik accepts each
//! on its own.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::Command,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Instant,
};

use futures::StreamExt;
use gateway_api::{gatewayclasses::GatewayClass, grpcroutes::GrpcRoute, httproutes::HttpRoute};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::PostParams,
    runtime::{WatchStreamExt, watcher},
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

use super::cluster::{ControlPlane, repo};

/// Traefik's Gateway API controller name.
pub const CONTROLLER: &str = "traefik.io/gateway-controller";
/// The version `tests/env/traefik.sh` pins.
pub const VERSION: &str = "3.7.15";
/// The GatewayClass the tests' RayServices name.
pub const CLASS: &str = "traefik";

/// One version of the route's weights: when the apiserver had it, and when Traefik accepted it.
#[derive(Clone, Debug)]
pub struct RouteWeights {
    pub generation: i64,
    /// When the watch saw this generation (the data plane cannot carry it earlier).
    pub seen: Instant,
    /// When the watch saw Traefik's status for it (Traefik writes it as it builds the configuration).
    pub accepted: Option<Instant>,
    /// Weight per RayCluster (from the `<cluster>-serve-svc` backendRefs).
    pub weights: BTreeMap<String, i64>,
}

/// How many ready endpoints a Service's EndpointSlices listed, from when the watch saw it.
#[derive(Clone, Debug)]
pub struct Endpoints {
    pub at: Instant,
    pub service: String,
    pub ready: usize,
}

pub struct TraefikGateway {
    pub address: String,
    dir: PathBuf,
    routes: Arc<Mutex<Vec<RouteWeights>>>,
    grpc_routes: Arc<Mutex<Vec<RouteWeights>>>,
    endpoints: Arc<Mutex<Vec<Endpoints>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn script() -> PathBuf {
    repo().join("tests/env/traefik.sh")
}

/// A loopback address no other Traefik of this machine's test runs uses.
fn loopback_address() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("127.77.{}.{}", std::process::id() % 250, n % 250 + 1)
}

impl TraefikGateway {
    /// Starts Traefik for `ns` of this control plane (and its GatewayClass, once per control plane).
    pub async fn start(cp: &ControlPlane, client: Client, ns: &str) -> Self {
        Self::start_watching(cp, client, ns, &[]).await
    }

    /// Starts Traefik for `ns` and `also` (a shared Gateway's namespace); the watches follow `ns` only.
    pub async fn start_watching(cp: &ControlPlane, client: Client, ns: &str, also: &[&str]) -> Self {
        let namespaces = std::iter::once(ns)
            .chain(also.iter().copied())
            .collect::<Vec<_>>()
            .join(",");
        // Tests start Traefiks side by side: the first creates the class, the others find it.
        let class: GatewayClass = serde_json::from_value(
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
                   "metadata": {"name": CLASS}, "spec": {"controllerName": CONTROLLER}}),
        )
        .unwrap();
        match Api::<GatewayClass>::all(client.clone())
            .create(&PostParams::default(), &class)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("creating GatewayClass {CLASS}: {e}"),
        }
        let dir = tempfile::Builder::new()
            .prefix("rayshift-traefik-")
            .tempdir()
            .unwrap()
            .keep();
        let address = loopback_address();
        let out = Command::new("bash")
            .arg(script())
            .args([
                "start",
                &dir.to_string_lossy(),
                &cp.kubeconfig.to_string_lossy(),
                &namespaces,
                &address,
            ])
            .env("RAYSHIFT_OWNER_PID", std::process::id().to_string())
            .output()
            .expect("run traefik.sh");
        assert!(
            out.status.success(),
            "traefik did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let routes = Arc::new(Mutex::new(Vec::new()));
        let grpc_routes = Arc::new(Mutex::new(Vec::new()));
        let endpoints = Arc::new(Mutex::new(Vec::new()));
        let tasks = vec![
            tokio::spawn(follow(
                Api::<HttpRoute>::namespaced(client.clone(), ns),
                routes.clone(),
            )),
            tokio::spawn(follow(
                Api::<GrpcRoute>::namespaced(client.clone(), ns),
                grpc_routes.clone(),
            )),
            tokio::spawn(count_endpoints(Api::namespaced(client, ns), endpoints.clone())),
        ];
        TraefikGateway {
            address,
            dir,
            routes,
            grpc_routes,
            endpoints,
            tasks,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.address)
    }

    /// `host:port` of the gRPC entryPoint (Ray Serve's default gRPC port, a listener of rayshift's Gateway).
    pub fn grpc_address(&self) -> String {
        format!("{}:9000", self.address)
    }

    /// Every version of the HTTPRoute's weights, in order.
    pub fn routes(&self) -> Vec<RouteWeights> {
        self.routes.lock().unwrap().clone()
    }

    /// Every version of the GRPCRoute's weights, in order (none without a gRPC listener).
    pub fn grpc_routes(&self) -> Vec<RouteWeights> {
        self.grpc_routes.lock().unwrap().clone()
    }

    /// Every change of a Service's ready endpoint count, in order.
    pub fn endpoints(&self) -> Vec<Endpoints> {
        self.endpoints.lock().unwrap().clone()
    }

    /// The ready endpoints `service` had at `at` (0 before the watch saw any).
    pub fn ready_at(&self, service: &str, at: Instant) -> usize {
        self.endpoints()
            .into_iter()
            .rfind(|e| e.service == service && e.at <= at)
            .map_or(0, |e| e.ready)
    }

    /// The last weights Traefik accepted.
    pub fn accepted(&self) -> Option<RouteWeights> {
        self.routes().into_iter().rfind(|r| r.accepted.is_some())
    }

    /// Traefik's own log lines at level error (or worse).
    pub fn errors(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("traefik.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .is_ok_and(|v| matches!(v["level"].as_str(), Some("error" | "fatal" | "panic")))
            })
            .map(str::to_string)
            .collect()
    }

    /// Requests Traefik answered with a 5xx itself or passed on from a backend, by backend service.
    pub fn server_errors(&self) -> BTreeMap<String, usize> {
        let mut by_service = BTreeMap::new();
        for line in std::fs::read_to_string(self.dir.join("access.log"))
            .unwrap_or_default()
            .lines()
        {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if v["DownstreamStatus"].as_u64().is_some_and(|s| s >= 500) {
                let service = v["ServiceName"].as_str().unwrap_or("(none)").to_string();
                *by_service.entry(service).or_default() += 1;
            }
        }
        by_service
    }

    /// Access-log lines of requests that took at least `bound` or that Traefik answered 499/5xx: which server
    /// each went to, when, and how long the server took (a timed-out request names the backend that hung).
    pub fn slow_requests(&self, bound: std::time::Duration) -> Vec<String> {
        let bound = bound.as_nanos() as u64;
        std::fs::read_to_string(self.dir.join("access.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| {
                v["Duration"].as_u64().is_some_and(|d| d >= bound)
                    || v["DownstreamStatus"]
                        .as_u64()
                        .is_some_and(|s| s == 499 || s >= 500)
            })
            .map(|v| {
                format!(
                    "{} {} → {} ({}) status {}/{} took {:.3} s, origin {:.3} s, retries {}",
                    v["StartUTC"].as_str().unwrap_or("?"),
                    v["RequestPath"].as_str().unwrap_or("?"),
                    v["ServiceURL"].as_str().unwrap_or("(none)"),
                    v["ServiceName"].as_str().unwrap_or("(none)"),
                    v["OriginStatus"],
                    v["DownstreamStatus"],
                    v["Duration"].as_f64().unwrap_or_default() / 1e9,
                    v["OriginDuration"].as_f64().unwrap_or_default() / 1e9,
                    v["RetryAttempts"],
                )
            })
            .collect()
    }

    /// Stops Traefik (a Gateway controller that is down: nothing accepts new generations).
    pub fn stop(&self) {
        let _ = Command::new("bash")
            .arg(script())
            .args(["stop", &self.dir.to_string_lossy()])
            .output();
    }
}

impl Drop for TraefikGateway {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
        self.stop();
        if std::thread::panicking() {
            eprintln!("Traefik's logs are kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Whether Traefik's parent status accepts the route's current generation (HTTPRoute and GRPCRoute alike).
fn accepted_by_traefik(route: &Value) -> bool {
    let generation = &route["metadata"]["generation"];
    let parents = route["status"]["parents"].as_array().into_iter().flatten();
    parents
        .filter(|p| p["controllerName"] == CONTROLLER)
        .flat_map(|p| p["conditions"].as_array().into_iter().flatten())
        .any(|c| c["type"] == "Accepted" && c["status"] == "True" && &c["observedGeneration"] == generation)
}

/// Records each generation of the routes with its weights, and when Traefik accepted it.
async fn follow<K>(routes: Api<K>, seen: Arc<Mutex<Vec<RouteWeights>>>)
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug + Send + 'static,
{
    let mut events = watcher(routes, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(event) = events.next().await {
        let Ok(route) = event else { continue };
        let Ok(route) = serde_json::to_value(&route) else {
            continue;
        };
        let generation = route["metadata"]["generation"].as_i64().unwrap_or_default();
        let now = Instant::now();
        let mut seen = seen.lock().unwrap();
        if seen.last().is_none_or(|r| r.generation != generation) {
            seen.push(RouteWeights {
                generation,
                seen: now,
                accepted: None,
                weights: super::observer::route_weights(&route),
            });
        }
        let last = seen.last_mut().expect("pushed above");
        if last.accepted.is_none() && accepted_by_traefik(&route) {
            last.accepted = Some(now);
        }
    }
}

/// Ready endpoints per Service, summed over its EndpointSlices, as the watch sees them change.
async fn count_endpoints(slices: Api<EndpointSlice>, seen: Arc<Mutex<Vec<Endpoints>>>) {
    let mut per_slice: BTreeMap<String, (String, usize)> = BTreeMap::new();
    let mut events = watcher(slices, watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        let (slice, gone) = match event {
            Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => (s, false),
            Ok(watcher::Event::Delete(s)) => (s, true),
            _ => continue,
        };
        let Some(service) = slice.labels().get("kubernetes.io/service-name").cloned() else {
            continue;
        };
        let ready = if gone {
            0
        } else {
            slice
                .endpoints
                .iter()
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .count()
        };
        per_slice.insert(slice.name_any(), (service.clone(), ready));
        let total = per_slice
            .values()
            .filter(|(s, _)| *s == service)
            .map(|(_, r)| r)
            .sum();
        let mut seen = seen.lock().unwrap();
        let last = seen.iter().rfind(|e| e.service == service).map(|e| e.ready);
        if last != Some(total) {
            seen.push(Endpoints {
                at: Instant::now(),
                service,
                ready: total,
            });
        }
    }
}
