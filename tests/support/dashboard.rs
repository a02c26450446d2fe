//! A fake Ray dashboard that follows the real Serve REST API's shapes (see
//! `../shared/reference/ray-serve-dashboard-api.md`), one per test, serving every cluster under
//! `http://127.0.0.1:PORT/{namespace}/{cluster}/api/serve/applications/`.
//!
//! A PUT replaces the whole config (declarative); GET reports each app and its deployments with replicas
//! scaled by `target_capacity` the way Serve does (round half up, at least 1 when capacity > 0). The test
//! controls app states, holds replicas below target, or takes a dashboard down. It also plays each head's
//! Serve proxy health check at `.../{namespace}/{cluster}/-/healthz`.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use axum::{
    Router,
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
};
use serde_json::{Value, json};

#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    /// Last config PUT (None: Serve not started).
    pub config: Option<Value>,
    /// Every PUT body, in order.
    pub puts: Vec<Value>,
    /// Forced app status (e.g. "DEPLOYING"); None: RUNNING.
    pub app_status: Option<String>,
    /// Answer 503 to everything.
    pub down: bool,
    /// Cap on RUNNING replicas per deployment (the rest are STARTING).
    pub max_running: Option<usize>,
    /// GET requests served.
    pub gets: usize,
    /// The head's Serve proxy fails its health check (`/-/healthz`).
    pub proxy_down: bool,
    /// Replicas a PUT adds start RUNNING only this long after it (as real replicas take time to start).
    pub start_delay: Option<std::time::Duration>,
    /// When each PUT arrived, in order (beside `puts`).
    pub put_times: Vec<std::time::Instant>,
    /// How the status GET misbehaves (faulty dashboards: a chaos test turns these).
    pub fault: Option<Fault>,
    /// Refuse every config PUT with 400 and a pydantic error, as Ray 2.60 answers a config its schema refuses.
    pub refuse_puts: bool,
    /// PUTs refused so far.
    pub refused_puts: usize,
    /// Refuse every Serve API call as Ray 2.52+'s token auth refuses a wrong token: 403 when the call carries one
    /// (`x-ray-authorization`), 401 when it carries none.
    pub refuse_tokens: bool,
    /// Calls refused so, and how many of those carried a token.
    pub refused_tokens: usize,
    pub refused_with_token: usize,
}

/// A dashboard that answers, but not well.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// 500 with an error text, as a dashboard whose Serve controller crashed answers.
    ServerError,
    /// The answer comes after this long (beyond the controller's client timeout).
    Slow(std::time::Duration),
    /// The JSON is cut off half way.
    Truncated,
    /// Every other answer has the apps UNHEALTHY (replicas crash-looping): RUNNING never holds two reads in a row.
    Flapping,
}

#[derive(Clone, Default)]
pub struct FakeDashboard {
    pub addr: Option<SocketAddr>,
    state: Arc<Mutex<HashMap<(String, String), ClusterState>>>,
    /// Template for clusters seen for the first time (e.g. apps held in DEPLOYING, dashboard down).
    pub new_clusters: Arc<Mutex<ClusterState>>,
}

impl FakeDashboard {
    pub async fn start() -> Self {
        let mut dash = FakeDashboard::default();
        let router = Router::new()
            .route(
                "/{ns}/{cluster}/api/serve/applications/",
                get(get_apps).put(put_apps),
            )
            .route("/{ns}/{cluster}/-/healthz", get(healthz))
            .with_state(dash.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        dash.addr = Some(listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        dash
    }

    /// Serve status GETs answered so far, every cluster together.
    pub fn total_gets(&self) -> u64 {
        self.state.lock().unwrap().values().map(|s| s.gets as u64).sum()
    }

    /// The `--dashboard-url-template` that points the controller here.
    pub fn url_template(&self) -> String {
        format!("http://{}/{{namespace}}/{{cluster}}", self.addr.unwrap())
    }

    pub fn with<R>(&self, ns: &str, cluster: &str, f: impl FnOnce(&mut ClusterState) -> R) -> R {
        let template = self.new_clusters.lock().unwrap().clone();
        let mut map = self.state.lock().unwrap();
        f(map
            .entry((ns.to_string(), cluster.to_string()))
            .or_insert(template))
    }

    /// Clusters this dashboard has seen in a namespace.
    pub fn clusters(&self, ns: &str) -> Vec<String> {
        self.state
            .lock()
            .unwrap()
            .keys()
            .filter(|(n, _)| n == ns)
            .map(|(_, c)| c.clone())
            .collect()
    }

    /// `count` summed over the clusters seen in `ns`.
    pub fn sum_in(&self, ns: &str, count: impl Fn(&ClusterState) -> usize) -> usize {
        let map = self.state.lock().unwrap();
        map.iter()
            .filter(|((n, _), _)| n == ns)
            .map(|(_, s)| count(s))
            .sum()
    }

    /// Changes every cluster seen in `ns`.
    pub fn with_each(&self, ns: &str, change: impl Fn(&mut ClusterState)) {
        let mut map = self.state.lock().unwrap();
        map.iter_mut()
            .filter(|((n, _), _)| n == ns)
            .for_each(|(_, s)| change(s));
    }

    pub fn get(&self, ns: &str, cluster: &str) -> ClusterState {
        self.with(ns, cluster, |s| s.clone())
    }
}

/// Serve's replica count under a target capacity.
pub fn scaled(replicas: usize, capacity: Option<f64>) -> usize {
    match capacity {
        None => replicas,
        Some(c) if c <= 0.0 => 0,
        Some(c) => ((replicas as f64 * c / 100.0) + 0.5).floor().max(1.0) as usize,
    }
}

/// Replicas running already: within `start_delay` of the last PUT, only those of the PUT before it.
fn started(s: &ClusterState, declared: usize) -> usize {
    let (Some(delay), Some(last)) = (s.start_delay, s.put_times.last()) else {
        return usize::MAX;
    };
    if last.elapsed() >= delay {
        return usize::MAX;
    }
    let before = s.puts.len().checked_sub(2).map(|i| &s.puts[i]);
    before.map_or(0, |p| {
        scaled(declared, p.get("target_capacity").and_then(Value::as_f64))
    })
}

fn status_body(s: &ClusterState) -> Value {
    let Some(config) = &s.config else {
        return json!({"controller_info": {}, "proxies": {}, "applications": {}, "target_capacity": null});
    };
    let capacity = config.get("target_capacity").and_then(Value::as_f64);
    let mut apps = BTreeMap::new();
    for app in config
        .get("applications")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = app
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let mut deployments = BTreeMap::new();
        let declared = app
            .get("deployments")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_else(|| vec![json!({"name": "Default"})]);
        for d in declared {
            let dname = d
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("Default")
                .to_string();
            let num = d.get("num_replicas").and_then(Value::as_u64).unwrap_or(1) as usize;
            let target = scaled(num, capacity);
            let running = s
                .max_running
                .map_or(target, |m| m.min(target))
                .min(started(s, num));
            let replicas: Vec<Value> = (0..target)
                .map(|i| json!({"replica_id": format!("{dname}-{i}"), "state": if i < running { "RUNNING" } else { "STARTING" }}))
                .collect();
            deployments.insert(
                dname.clone(),
                json!({"name": dname, "status": if running == target { "HEALTHY" } else { "UPSCALING" }, "message": "",
                       "target_num_replicas": target, "deployment_config": {"num_replicas": num}, "replicas": replicas}),
            );
        }
        let status = s.app_status.clone().unwrap_or_else(|| "RUNNING".into());
        apps.insert(
            name.clone(),
            json!({"name": name, "route_prefix": app.get("route_prefix").cloned().unwrap_or(json!("/")),
            "status": status, "message": "", "source": "declarative", "deployments": deployments}),
        );
    }
    json!({"controller_info": {"node_id": "fake"}, "proxy_location": "HeadOnly", "http_options": {"host": "0.0.0.0", "port": 8000},
           "proxies": {}, "applications": apps, "target_capacity": capacity})
}

/// The head's Serve proxy: up once Serve runs there (a config was PUT), unless the test took it down.
async fn healthz(State(d): State<FakeDashboard>, Path((ns, cluster)): Path<(String, String)>) -> Response {
    let up = d.with(&ns, &cluster, |s| s.config.is_some() && !s.down && !s.proxy_down);
    if up {
        (StatusCode::OK, "success").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "proxy down").into_response()
    }
}

/// Ray 2.60's answers when its token auth refuses a call (`http_server_head.py`).
fn token_refusal(d: &FakeDashboard, ns: &str, cluster: &str, headers: &HeaderMap) -> Option<Response> {
    let carried = headers.contains_key("x-ray-authorization");
    d.with(ns, cluster, |s| {
        if !s.refuse_tokens {
            return None;
        }
        s.refused_tokens += 1;
        s.refused_with_token += usize::from(carried);
        Some(match carried {
            true => (StatusCode::FORBIDDEN, "Forbidden: Invalid authentication token").into_response(),
            false => (
                StatusCode::UNAUTHORIZED,
                "Unauthorized: Missing authentication token",
            )
                .into_response(),
        })
    })
}

async fn get_apps(
    State(d): State<FakeDashboard>,
    Path((ns, cluster)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = token_refusal(&d, &ns, &cluster, &headers) {
        return refused;
    }
    let (body, fault, gets) = d.with(&ns, &cluster, |s| {
        s.gets += 1;
        ((!s.down).then(|| status_body(s)), s.fault, s.gets)
    });
    let Some(body) = body else {
        return (StatusCode::SERVICE_UNAVAILABLE, "dashboard down").into_response();
    };
    match fault {
        None => axum::Json(body).into_response(),
        Some(Fault::ServerError) => {
            (StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error").into_response()
        }
        Some(Fault::Slow(delay)) => {
            tokio::time::sleep(delay).await;
            axum::Json(body).into_response()
        }
        Some(Fault::Flapping) if gets % 2 == 0 => {
            let mut body = body;
            for app in body["applications"]
                .as_object_mut()
                .into_iter()
                .flat_map(|a| a.values_mut())
            {
                app["status"] = json!("UNHEALTHY");
                app["message"] = json!("a replica of the app's deployment died");
            }
            axum::Json(body).into_response()
        }
        Some(Fault::Flapping) => axum::Json(body).into_response(),
        Some(Fault::Truncated) => {
            let text = body.to_string();
            let cut = text[..text.len() / 2].to_string();
            ([(axum::http::header::CONTENT_TYPE, "application/json")], cut).into_response()
        }
    }
}

async fn put_apps(
    State(d): State<FakeDashboard>,
    Path((ns, cluster)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = token_refusal(&d, &ns, &cluster, &headers) {
        return refused;
    }
    let Ok(config) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "invalid JSON").into_response();
    };
    if config
        .get("target_capacity")
        .and_then(Value::as_f64)
        .is_some_and(|c| !(0.0..=100.0).contains(&c))
    {
        return (
            StatusCode::BAD_REQUEST,
            "Input should be less than or equal to 100",
        )
            .into_response();
    }
    let answer = d.with(&ns, &cluster, |s| {
        if s.refuse_puts {
            s.refused_puts += 1;
            return Err((StatusCode::BAD_REQUEST, REFUSED_CONFIG));
        }
        if s.down {
            return Err((StatusCode::SERVICE_UNAVAILABLE, "dashboard down"));
        }
        s.puts.push(config.clone());
        s.put_times.push(std::time::Instant::now());
        s.config = Some(config);
        Ok(())
    });
    match answer {
        Ok(()) => StatusCode::OK.into_response(),
        Err(refused) => refused.into_response(),
    }
}

/// Ray 2.60's answer to a config its schema refuses: the repr of pydantic 2's ValidationError, as its
/// `serve_head.py` sends it (taken from the cached Ray venv for a config without an `import_path`).
const REFUSED_CONFIG: &str = "1 validation error for ServeDeploySchema\napplications.0.import_path\n  Field required \
                              [type=missing, input_value={'name': 'llm', 'route_prefix': '/'}, input_type=dict]\n    \
                              For further information visit https://errors.pydantic.dev/2.14/v/missing";
