//! Client of the Ray dashboard's Serve REST API (`/api/serve/applications/`).
//!
//! Reached directly (URL from `--dashboard-url-template`, `{cluster}` and `{namespace}` filled in; a path
//! prefix works) or through the apiserver's service proxy (`--use-kubernetes-proxy`). Every call has a
//! timeout and a bounded number of retries; failures are errors for the caller to surface as events and
//! conditions, never panics.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};

use serde::Deserialize;
use serde_json::Value;

use crate::{
    direct_http::DirectHttp,
    error::{DashboardFailure, Error, Result},
    metrics::Metrics,
    waiting::{self, Waiting},
};

pub const DEFAULT_URL_TEMPLATE: &str =
    "http://{cluster}-head-svc.{namespace}.svc.{clusterDomain}:{dashboardPort}";
/// The Serve proxy's health check on a head Pod, as KubeRay probes it.
pub const DEFAULT_HEALTH_URL_TEMPLATE: &str = "http://{podIP}:{port}/-/healthz";
const APPLICATIONS: &str = "api/serve/applications/";
/// The header KubeRay's dashboard client sends a token-auth cluster's token in: Ray reads it beside
/// `Authorization`, which the apiserver's proxy would take as its own credential and drop.
const TOKEN_HEADER: &str = "x-ray-authorization";
/// The key of the token in its Secret, as KubeRay writes and reads it.
const TOKEN_KEY: &str = "auth_token";

/// Dashboard tokens by (namespace, Secret), each with when it was last used.
#[derive(Default)]
struct Tokens(HashMap<(String, String), (Arc<str>, Instant)>);

impl Tokens {
    /// Beyond this many, tokens unused for `IDLE` go (those of deleted clusters would otherwise pile up); a
    /// serving cluster's is used every health period.
    const LIMIT: usize = 1024;
    const IDLE: Duration = Duration::from_secs(600);

    fn get(&mut self, key: &(String, String), now: Instant) -> Option<Arc<str>> {
        let (token, used) = self.0.get_mut(key)?;
        *used = now;
        Some(token.clone())
    }

    fn insert(&mut self, key: (String, String), token: Arc<str>, now: Instant) {
        if self.0.len() >= Self::LIMIT {
            self.0
                .retain(|_, (_, used)| now.saturating_duration_since(*used) < Self::IDLE);
        }
        self.0.insert(key, (token, now));
    }

    fn remove(&mut self, key: &(String, String)) {
        self.0.remove(key);
    }
}

/// One cluster's dashboard: which cluster, and the Secret of its token when it wants one.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub namespace: String,
    pub cluster: String,
    pub token_secret: Option<String>,
    /// The head's port named `dashboard` (`{dashboardPort}` in the URL template).
    pub dashboard_port: i64,
}

impl Target {
    /// Its token's place in the cache; `None` when it wants no token.
    fn token_key(&self) -> Option<(String, String)> {
        let secret = self.token_secret.clone()?;
        Some((self.namespace.clone(), secret))
    }

    pub fn of(cluster: &rayshift_api::RayCluster) -> Self {
        let name = cluster.name_any();
        Self {
            namespace: cluster.namespace().unwrap_or_default(),
            token_secret: cluster.spec.auth_token_secret(&name),
            dashboard_port: cluster.spec.dashboard_port(),
            cluster: name,
        }
    }
}

/// Where the dashboards are.
#[derive(Clone, Debug)]
pub enum Route {
    /// `http://...{cluster}...{namespace}...`
    Template(String),
    /// Through the apiserver: `/api/v1/namespaces/{ns}/services/{cluster}-head-svc:dashboard/proxy/`.
    KubernetesProxy,
}

/// A head Pod's Serve proxy: where its requests go.
pub struct HeadProxy<'a> {
    pub namespace: &'a str,
    pub cluster: &'a str,
    pub pod: &'a str,
    pub pod_ip: &'a str,
    pub port: i64,
}

/// Dashboard requests in flight at once by default, every cluster together (`--dashboard-max-in-flight`).
pub const DEFAULT_MAX_IN_FLIGHT: u16 = 32;

#[derive(Clone)]
pub struct Dashboard {
    route: Route,
    timeout: Duration,
    /// One permit per request in flight: slow dashboards hold their permits, so at most this many requests
    /// wait on them and the rest of the controller's reads are not swamped.
    in_flight: Arc<tokio::sync::Semaphore>,
    http: DirectHttp,
    kube: kube::Client,
    /// Tokens read once: a settled RayService's health checks read no Secret. An
    /// answer of 401 or 403 drops its token, so a Secret put right is read again.
    tokens: Arc<Mutex<Tokens>>,
    attempts: u32,
    metrics: Metrics,
}

/// Status of one Serve application, as the dashboard reports it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ServeApp {
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub deployments: BTreeMap<String, ServeDeployment>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ServeDeployment {
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub target_num_replicas: Option<i64>,
    #[serde(default)]
    pub deployment_config: Option<Value>,
    #[serde(default)]
    pub replicas: Vec<Replica>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Replica {
    #[serde(default)]
    pub state: String,
}

impl ServeDeployment {
    /// Replicas actually in state RUNNING (not the declared target).
    pub fn running_replicas(&self) -> usize {
        self.replicas.iter().filter(|r| r.state == "RUNNING").count()
    }

    /// Replicas that must be RUNNING at `capacity`: a fixed `num_replicas` scaled the way Serve scales it;
    /// for an autoscaling deployment (`num_replicas` null) Serve's own `target_num_replicas`, which already
    /// has the capacity applied (scaling it again would ask for too few).
    pub fn replicas_needed(&self, capacity: i32) -> u64 {
        let fixed = self
            .deployment_config
            .as_ref()
            .and_then(|c| c.get("num_replicas"))
            .and_then(Value::as_u64);
        match (fixed, self.target_num_replicas) {
            (Some(n), _) => rayshift_api::upgrade_control::implied_replicas(n, capacity),
            (None, Some(t)) => u64::try_from(t).unwrap_or(0),
            (None, None) => rayshift_api::upgrade_control::implied_replicas(1, capacity),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ServeStatus {
    #[serde(default)]
    pub applications: BTreeMap<String, ServeApp>,
    #[serde(default)]
    pub target_capacity: Option<f64>,
}

impl ServeStatus {
    /// At least one app, and every app RUNNING (KubeRay's readiness rule).
    pub fn all_running(&self) -> bool {
        !self.applications.is_empty() && self.applications.values().all(|a| a.status == "RUNNING")
    }

    /// Serve has taken `capacity` and runs, in every deployment, at least the replicas it implies, counting
    /// replicas in state RUNNING (an app can be RUNNING long before the new replicas are).
    pub fn capacity_verified(&self, capacity: i32) -> bool {
        let taken = self.target_capacity.map(|c| c.round() as i32) == Some(capacity);
        taken
            && self.all_running()
            && self
                .applications
                .values()
                .flat_map(|a| a.deployments.values())
                .all(|d| d.running_replicas() as u64 >= d.replicas_needed(capacity))
    }
}

impl Dashboard {
    pub fn new(
        route: Route,
        timeout: Duration,
        max_in_flight: u16,
        kube: kube::Client,
        metrics: Metrics,
    ) -> Result<Self> {
        // Idle connections are kept per host, up to the in-flight limit: a dashboard per cluster keeps the one
        // its reads use, and dashboards behind one address (a shared gateway, the tests' one server) keep as many
        // as a burst of checks opened, instead of opening them again for every burst (issue 16's settled CPU).
        let http = DirectHttp::new(timeout, usize::from(max_in_flight.max(1)))?;
        Ok(Self {
            route,
            timeout,
            in_flight: Arc::new(tokio::sync::Semaphore::new(usize::from(max_in_flight.max(1)))),
            http,
            kube,
            tokens: Arc::default(),
            attempts: 3,
            metrics,
        })
    }

    /// A URL template with `{clusterDomain}` filled in (KubeRay's `CLUSTER_DOMAIN`, default `cluster.local`).
    pub fn in_domain(template: &str, cluster_domain: &str) -> String {
        template.replace("{clusterDomain}", cluster_domain)
    }

    /// The base URL of a cluster's dashboard (template route) ending in `/`.
    pub fn base_url(template: &str, target: &Target) -> String {
        let url = template
            .replace("{cluster}", &target.cluster)
            .replace("{namespace}", &target.namespace)
            .replace("{dashboardPort}", &target.dashboard_port.to_string());
        if url.ends_with('/') {
            url
        } else {
            format!("{url}/")
        }
    }

    fn where_(&self, target: &Target) -> String {
        match &self.route {
            Route::Template(t) => Self::base_url(t, target),
            Route::KubernetesProxy => {
                let (namespace, cluster) = (&target.namespace, &target.cluster);
                format!("/api/v1/namespaces/{namespace}/services/{cluster}-head-svc:dashboard/proxy/")
            }
        }
    }

    /// `GET /api/serve/applications/?api_type=declarative`.
    pub async fn status(&self, target: &Target) -> Result<ServeStatus> {
        let body = self
            .call(http::Method::GET, target, "?api_type=declarative", None)
            .await?;
        serde_json::from_slice(&body).map_err(|e| Error::Dashboard {
            url: self.where_(target),
            failure: Box::new(DashboardFailure::Json(e)),
        })
    }

    /// Whether the Serve proxy on a head Pod answers `GET /-/healthz` with 200: directly (`template`, with
    /// `{podIP}`, `{port}`, `{pod}`, `{cluster}`, `{namespace}`) or through the apiserver's Pod proxy.
    pub async fn proxy_healthy(&self, template: &str, head: &HeadProxy<'_>) -> bool {
        waiting::on(Waiting::DashboardSlot);
        let _permit = self.in_flight.acquire().await;
        waiting::on(Waiting::Dashboard("healthz"));
        let timer = self.metrics.dashboard_latency("healthz");
        let healthy = match &self.route {
            Route::Template(_) => {
                let url = template
                    .replace("{podIP}", head.pod_ip)
                    .replace("{port}", &head.port.to_string())
                    .replace("{pod}", head.pod)
                    .replace("{cluster}", head.cluster)
                    .replace("{namespace}", head.namespace);
                match request(&http::Method::GET, &url, None, None) {
                    Ok(req) => self.http.send(req).await.is_ok_and(|(s, _)| s.is_success()),
                    Err(_) => false,
                }
            }
            Route::KubernetesProxy => {
                let (ns, pod, port) = (head.namespace, head.pod, head.port);
                let path = format!("/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/-/healthz");
                self.proxied(&http::Method::GET, &path, None, None).await.is_ok()
            }
        };
        timer.observe_duration();
        if !healthy {
            self.metrics.dashboard_error("healthz");
        }
        healthy
    }

    /// `PUT /api/serve/applications/` with the whole config (declarative: apps left out are deleted).
    pub async fn put_config(&self, target: &Target, config: &Value) -> Result<()> {
        let body = serde_json::to_vec(config).expect("JSON values serialize");
        self.call(http::Method::PUT, target, "", Some(body))
            .await
            .map(|_| ())
    }

    async fn call(
        &self,
        method: http::Method,
        target: &Target,
        query: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let url = format!("{}{APPLICATIONS}{query}", self.where_(target));
        let token = self.token(target).await.map_err(|failure| Error::Dashboard {
            url: url.clone(),
            failure: Box::new(failure),
        })?;
        let token = token.as_deref();
        let op = if method == http::Method::GET { "get" } else { "put" };
        let mut last = None;
        for attempt in 0..self.attempts {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
            waiting::on(Waiting::DashboardSlot);
            let permit = self.in_flight.acquire().await;
            waiting::on(Waiting::Dashboard(op));
            let timer = self.metrics.dashboard_latency(op);
            let result = match &self.route {
                Route::Template(_) => self.direct(&method, &url, token, body.clone()).await,
                Route::KubernetesProxy => self.proxied(&method, &url, token, body.clone()).await,
            };
            timer.observe_duration();
            drop(permit);
            match result {
                Ok(bytes) => return Ok(bytes),
                Err((retry, failure)) => {
                    self.metrics.dashboard_error(op);
                    if failure.is_unauthorized() {
                        self.forget_token(target);
                    }
                    last = Some(failure);
                    if !retry {
                        break;
                    }
                }
            }
        }
        let failure = last
            .expect("at least one attempt was made")
            .naming_token(&target.namespace, target.token_secret.as_deref());
        Err(Error::Dashboard {
            url,
            failure: Box::new(failure),
        })
    }

    /// The token `target` wants, from the cache or its Secret; `None` when it wants none.
    async fn token(&self, target: &Target) -> Result<Option<Arc<str>>, DashboardFailure> {
        let (Some(key), Some(secret)) = (target.token_key(), &target.token_secret) else {
            return Ok(None);
        };
        let cached = self
            .tokens
            .lock()
            .expect("not poisoned")
            .get(&key, Instant::now());
        if let Some(token) = cached {
            return Ok(Some(token));
        }
        let missing = || DashboardFailure::TokenMissing {
            namespace: target.namespace.clone(),
            secret: secret.clone(),
        };
        waiting::on(Waiting::api("get", "Secret"));
        let read = Api::<Secret>::namespaced(self.kube.clone(), &target.namespace)
            .get_opt(secret)
            .await
            .map_err(|e| DashboardFailure::TokenSecret {
                namespace: target.namespace.clone(),
                secret: secret.clone(),
                source: e,
            })?
            .ok_or_else(missing)?;
        let bytes = read
            .data
            .and_then(|mut d| d.remove(TOKEN_KEY))
            .ok_or_else(missing)?;
        let token: Arc<str> = String::from_utf8_lossy(&bytes.0).trim().into();
        let mut tokens = self.tokens.lock().expect("not poisoned");
        tokens.insert(key, token.clone(), Instant::now());
        Ok(Some(token))
    }

    fn forget_token(&self, target: &Target) {
        if let Some(key) = target.token_key() {
            self.tokens.lock().expect("not poisoned").remove(&key);
        }
    }

    /// Err((retryable, message)).
    async fn direct(
        &self,
        method: &http::Method,
        url: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, (bool, DashboardFailure)> {
        let req = request(method, url, token, body)?;
        let (status, bytes) = self.http.send(req).await.map_err(|e| (true, e))?;
        if status.is_success() {
            Ok(Vec::from(bytes))
        } else {
            Err(not_ok(status, &String::from_utf8_lossy(&bytes)))
        }
    }

    async fn proxied(
        &self,
        method: &http::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, (bool, DashboardFailure)> {
        let req = request(method, path, token, body)?;
        // The apiserver proxies without a deadline of its own (a long-running request), so a dashboard that
        // accepts and never answers would hold a slot for kube's 295 s read timeout.
        match tokio::time::timeout(self.timeout, self.kube.request_text(req)).await {
            Ok(answer) => answer.map(String::into_bytes).map_err(proxy_failure),
            Err(_) => Err((true, DashboardFailure::TimedOut(self.timeout))),
        }
    }
}

/// A dashboard request: to a URL (template route) or an apiserver path (proxy route), never retried at
/// once when it cannot be made (a template that yields no URI).
// The failure is the one the async callers return anyway; made once per HTTP exchange, its size costs nothing.
#[allow(clippy::result_large_err)]
fn request(
    method: &http::Method,
    url: &str,
    token: Option<&str>,
    body: Option<Vec<u8>>,
) -> Result<http::Request<Vec<u8>>, (bool, DashboardFailure)> {
    let uri: http::Uri = url.parse().map_err(|e| (false, DashboardFailure::Url(e)))?;
    let mut req = http::Request::builder().method(method.clone()).uri(uri);
    if let Some(t) = token {
        req = req.header(TOKEN_HEADER, format!("Bearer {t}"));
    }
    if body.is_some() {
        req = req.header(http::header::CONTENT_TYPE, "application/json");
    }
    req.body(body.unwrap_or_default())
        .map_err(|e| (false, DashboardFailure::Build(e)))
}

/// The proxy relays the dashboard's own answer (kube makes any non-2xx an `Api` error): judged as a direct
/// answer is, so Ray's 400 to a config it refuses is neither retried at once nor taken for a passing fault.
fn proxy_failure(e: kube::Error) -> (bool, DashboardFailure) {
    match e {
        kube::Error::Api(s) => not_ok(
            http::StatusCode::from_u16(s.code).unwrap_or(http::StatusCode::BAD_GATEWAY),
            &s.message,
        ),
        e => (true, DashboardFailure::Proxy(e)),
    }
}

/// A dashboard's non-2xx answer, on either route: retried at once only when the server failed (5xx).
fn not_ok(status: http::StatusCode, body: &str) -> (bool, DashboardFailure) {
    let body = body.trim().to_string();
    (
        status.is_server_error(),
        DashboardFailure::Status { status, body },
    )
}

/// The dashboard's JSON config from serveConfigV2 (YAML text), with `target_capacity` when given.
pub fn serve_config_json(text: &str, target_capacity: Option<i32>) -> Result<Value> {
    let mut config = rayshift_api::validation::parse_serve_config(text)
        .map_err(|e| Error::ServeConfig(rayshift_api::Error::from(e)))?;
    if config.is_null() {
        config = Value::Object(Default::default());
    }
    let obj = config.as_object_mut().ok_or(Error::ServeConfigNotAMapping)?;
    match target_capacity {
        Some(tc) => obj.insert("target_capacity".into(), Value::from(tc)),
        None => obj.remove("target_capacity"),
    };
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A template can make something that is no URL: a failure that names it, not retried, never a panic.
    #[test]
    fn a_url_that_is_none_is_a_failure_not_retried() {
        let (retry, failure) = request(&http::Method::GET, "http://host/a b/", None, None).unwrap_err();
        assert!(!retry);
        assert!(matches!(failure, DashboardFailure::Url(_)), "{failure}");
        let req = request(
            &http::Method::PUT,
            "http://h:8265/x",
            Some("t"),
            Some(b"{}".to_vec()),
        )
        .unwrap();
        assert_eq!(req.headers()[TOKEN_HEADER], "Bearer t");
        assert_eq!(req.headers()[http::header::CONTENT_TYPE], "application/json");
    }

    /// What kube 4.2 makes of Ray's 400 through the proxy (a body that is not a Status) and of the apiserver's
    /// own 503 when the Service has no endpoint.
    #[test]
    fn proxied_refusals_are_judged_as_direct_ones() {
        let refused =
            kube::core::Status::failure("ValidationError(...)", "Failed to parse error data").with_code(400);
        let (retry, failure) = proxy_failure(kube::Error::Api(refused.boxed()));
        assert!(!retry);
        let error = Error::Dashboard {
            url: "/api/v1/namespaces/ns/services/c-head-svc:dashboard/proxy/api/serve/applications/".into(),
            failure: Box::new(failure),
        };
        assert!(error.is_persistent(), "{error}");
        assert!(
            error
                .to_string()
                .contains("400 Bad Request: ValidationError(...)"),
            "{error}"
        );

        let no_endpoint =
            kube::core::Status::failure("no endpoints available", "ServiceUnavailable").with_code(503);
        let (retry, failure) = proxy_failure(kube::Error::Api(no_endpoint.boxed()));
        assert!(
            retry && matches!(failure, DashboardFailure::Status { status, .. } if status.as_u16() == 503)
        );
    }

    #[test]
    fn url_template_with_and_without_path_prefix() {
        let cluster = |ports: Value| -> rayshift_api::RayCluster {
            serde_json::from_value(json!({"metadata": {"name": "rs-abcde", "namespace": "ns"}, "spec": {
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "ports": ports}]}}}}}))
            .unwrap()
        };
        let default = Target::of(&cluster(json!([])));
        let template = Dashboard::in_domain(DEFAULT_URL_TEMPLATE, "cluster.local");
        assert_eq!(
            Dashboard::base_url(&template, &default),
            "http://rs-abcde-head-svc.ns.svc.cluster.local:8265/"
        );
        assert_eq!(
            Dashboard::base_url(
                &Dashboard::in_domain(DEFAULT_URL_TEMPLATE, "corp.internal"),
                &default
            ),
            "http://rs-abcde-head-svc.ns.svc.corp.internal:8265/",
            "CLUSTER_DOMAIN, as KubeRay reads it"
        );
        let moved = Target::of(&cluster(json!([{"name": "dashboard", "containerPort": 8266}])));
        assert_eq!(
            Dashboard::base_url(&template, &moved),
            "http://rs-abcde-head-svc.ns.svc.cluster.local:8266/",
            "the head's port named dashboard, as KubeRay reads it"
        );
        assert_eq!(
            Dashboard::base_url("http://127.0.0.1:9000/ray/{namespace}/{cluster}", &default),
            "http://127.0.0.1:9000/ray/ns/rs-abcde/"
        );
    }

    #[test]
    fn serve_config_keeps_integers_and_sets_capacity() {
        let v = serve_config_json(
            "applications:\n  - name: a\n    import_path: m:app\n    num_replicas: 2\n",
            Some(20),
        )
        .unwrap();
        assert_eq!(v["applications"][0]["num_replicas"], Value::from(2));
        assert_eq!(v["target_capacity"], Value::from(20));
        let v = serve_config_json("target_capacity: 5\napplications: []\n", None).unwrap();
        assert!(v.get("target_capacity").is_none());
        assert!(serve_config_json("- a\n- b\n", None).is_err());
    }

    fn deployment(config: Value, target: Option<i64>, running: usize, starting: usize) -> ServeDeployment {
        let state = |s: &str| Replica { state: s.into() };
        ServeDeployment {
            deployment_config: Some(config),
            target_num_replicas: target,
            replicas: std::iter::repeat_n(state("RUNNING"), running)
                .chain(std::iter::repeat_n(state("STARTING"), starting))
                .collect(),
            ..Default::default()
        }
    }

    fn serve(capacity: f64, d: ServeDeployment) -> ServeStatus {
        let mut s = ServeStatus {
            target_capacity: Some(capacity),
            ..Default::default()
        };
        s.applications.insert(
            "a".into(),
            ServeApp {
                status: "RUNNING".into(),
                deployments: BTreeMap::from([("D".to_string(), d)]),
                ..Default::default()
            },
        );
        s
    }

    #[test]
    fn capacity_is_verified_by_running_replicas() {
        // Fixed num_replicas 4 at 50%: 2 must run (shapes as Ray 2.60 reports them).
        let fixed = |running, starting| {
            deployment(serde_json::json!({"num_replicas": 4}), Some(2), running, starting)
        };
        assert!(serve(50.0, fixed(2, 0)).capacity_verified(50));
        assert!(!serve(50.0, fixed(1, 1)).capacity_verified(50));
        assert!(
            !serve(100.0, fixed(2, 0)).capacity_verified(50),
            "capacity not taken yet"
        );
        // Autoscaling (num_replicas null): Serve's target_num_replicas already has the capacity applied.
        let auto = |target, running, starting| {
            deployment(
                serde_json::json!({"num_replicas": null, "autoscaling_config": {"min_replicas": 1, "initial_replicas": 4}}),
                Some(target),
                running,
                starting,
            )
        };
        assert!(serve(50.0, auto(2, 2, 0)).capacity_verified(50));
        assert!(
            !serve(50.0, auto(2, 1, 1)).capacity_verified(50),
            "one of two replicas still starting"
        );
        assert!(serve(100.0, auto(4, 4, 0)).capacity_verified(100));
        assert!(!serve(100.0, auto(4, 2, 2)).capacity_verified(100));
    }

    #[test]
    fn readiness_needs_apps_all_running() {
        let mut s = ServeStatus::default();
        assert!(!s.all_running());
        s.applications.insert(
            "a".into(),
            ServeApp {
                status: "RUNNING".into(),
                ..Default::default()
            },
        );
        assert!(s.all_running());
        s.applications.insert(
            "b".into(),
            ServeApp {
                status: "DEPLOYING".into(),
                ..Default::default()
            },
        );
        assert!(!s.all_running());
    }

    /// A local server that answers every request on a connection with 200 after `delay` (so a burst's
    /// requests overlap), counting the connections it accepted.
    async fn counting_server(delay: Duration) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    // One GET per read is enough for reqwest's requests (no body, small headers).
                    while conn.read(&mut buf).await.is_ok_and(|n| n > 0) {
                        tokio::time::sleep(delay).await;
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if conn.write_all(ok).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        (format!("http://{addr}/-/healthz"), accepted)
    }

    /// A dashboard under token auth, as Ray 2.60's middleware answers: 200 to the expected token in
    /// `x-ray-authorization`, 403 to another, 401 to none.
    async fn token_server(expected: Arc<Mutex<String>>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let expected = expected.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    while let Ok(n @ 1..) = conn.read(&mut buf).await {
                        let request = String::from_utf8_lossy(&buf[..n]).to_lowercase();
                        let sent = request
                            .lines()
                            .find_map(|l| l.strip_prefix("x-ray-authorization: bearer "));
                        let want = expected.lock().unwrap().to_lowercase();
                        let (status, body) = match sent {
                            Some(t) if t.trim() == want => ("200 OK", r#"{"applications": {}}"#),
                            Some(_) => ("403 Forbidden", "Forbidden: Invalid authentication token"),
                            None => ("401 Unauthorized", "Unauthorized: Missing authentication token"),
                        };
                        let answer = format!(
                            "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if conn.write_all(answer.as_bytes()).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        format!("http://{addr}/{{namespace}}/{{cluster}}")
    }

    /// The token goes in KubeRay's header; a refused one is forgotten, so the next call reads its Secret
    /// again (here an apiserver that is not there: the read fails and says which Secret).
    #[tokio::test]
    async fn a_refused_token_is_read_again() {
        let expected = Arc::new(Mutex::new("t1".to_string()));
        let template = token_server(expected.clone()).await;
        let kube = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let metrics = Metrics::register(&prometheus::Registry::new()).unwrap();
        let dashboard = Dashboard::new(
            Route::Template(template),
            Duration::from_secs(5),
            4,
            kube,
            metrics,
        )
        .unwrap();
        let target = Target {
            namespace: "ns".into(),
            cluster: "c".into(),
            token_secret: Some("c".into()),
            dashboard_port: 8265,
        };
        let key = ("ns".to_string(), "c".to_string());
        let now = Instant::now();
        dashboard
            .tokens
            .lock()
            .unwrap()
            .insert(key.clone(), "t1".into(), now);
        assert!(dashboard.status(&target).await.is_ok());
        let open = Target {
            token_secret: None,
            ..target.clone()
        };
        let none = dashboard.status(&open).await.unwrap_err().to_string();
        assert!(none.contains("401 Unauthorized"), "{none}");
        assert!(dashboard.tokens.lock().unwrap().0.contains_key(&key));

        *expected.lock().unwrap() = "t2".into();
        let refused = dashboard.status(&target).await.unwrap_err().to_string();
        assert!(refused.contains("403 Forbidden"), "{refused}");
        assert!(!dashboard.tokens.lock().unwrap().0.contains_key(&key));
        let reread = dashboard.status(&target).await.unwrap_err().to_string();
        assert!(reread.contains("auth token Secret ns/c"), "{reread}");
    }

    /// Tokens of clusters gone pile up only to the limit: then those unused for 10 minutes go, not the ones in use.
    #[test]
    fn idle_tokens_go_once_there_are_many() {
        let start = Instant::now();
        let key = |i: usize| ("ns".to_string(), format!("c{i}"));
        let mut tokens = Tokens::default();
        for i in 0..Tokens::LIMIT {
            tokens.insert(key(i), "t".into(), start);
        }
        let later = start + Duration::from_secs(601);
        assert!(tokens.get(&key(7), later).is_some(), "in use");
        tokens.insert(key(Tokens::LIMIT), "t".into(), later);
        let kept: Vec<_> = tokens.0.keys().cloned().collect();
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert!(kept.contains(&key(7)) && kept.contains(&key(Tokens::LIMIT)));
    }

    /// Dashboards behind one address: a burst of checks as large as the in-flight limit opens its connections
    /// once; the next burst reuses them (with 2 idle kept, as before, it opened new ones).
    #[tokio::test]
    async fn a_second_burst_to_one_host_reuses_the_first_bursts_connections() {
        let (template, accepted) = counting_server(Duration::from_millis(100)).await;
        let kube = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let metrics = Metrics::register(&prometheus::Registry::new()).unwrap();
        let route = Route::Template("http://127.0.0.1:9/{namespace}/{cluster}".into());
        let dashboard = Dashboard::new(route, Duration::from_secs(5), 16, kube, metrics).unwrap();
        let burst = || {
            futures::future::join_all((0..16).map(|i| {
                let (dashboard, template, pod) = (&dashboard, &template, format!("head-{i}"));
                async move {
                    let head = HeadProxy {
                        namespace: "ns",
                        cluster: "c",
                        pod: &pod,
                        pod_ip: "x",
                        port: 8000,
                    };
                    dashboard.proxy_healthy(template, &head).await
                }
            }))
        };
        assert!(burst().await.into_iter().all(|healthy| healthy));
        let first = accepted.load(std::sync::atomic::Ordering::SeqCst);
        assert!(first > 2, "the burst overlapped: {first} connections");
        assert!(burst().await.into_iter().all(|healthy| healthy));
        let second = accepted.load(std::sync::atomic::Ordering::SeqCst) - first;
        assert_eq!(
            second, 0,
            "new connections in the second burst ({first} in the first)"
        );
    }
}
