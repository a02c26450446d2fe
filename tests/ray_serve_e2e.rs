//! Real Ray Serve end to end: the real controller process against a real kube-apiserver, real Ray heads
//! (one per RayCluster, each in its own network namespace), Traefik as the Gateway API implementation, and
//! 50 requests per second through it during an incremental upgrade and during a rollback.
//!
//! The real KubeRay operator runs the RayClusters (head Pods, Services, status); kwok runs the Pods on a fake
//! node, and each head Pod's IP is taken by the real Ray head of its cluster. Traefik reads rayshift's Gateway
//! and HTTPRoute, writes their status, and sends each request to a ready EndpointSlice address of a serve
//! Service by the route's weights. Everything Ray says is real: the controller's dashboard calls reach the
//! real dashboards, and an independent sampler reads what Serve really runs.

mod support;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    future::Future,
    time::{Duration, Instant},
};

use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use rayshift_api::RayService;
use serde_json::{Value, json};
use support::{
    cluster::control_plane_beside_ray,
    controller::ControllerProcess,
    load::{Load, Response},
    observer::Observer,
    ray::{Call, RayHeads, replicas_at},
    status::{active, pending},
    traefik::{self, TraefikGateway},
};

const GATE: &str = "--feature-gates=RayServiceIncrementalUpgrade=true";
/// Replicas of the one deployment at full capacity.
const REPLICAS: usize = 4;
const SURGE: i64 = 50;
const RATE: u32 = 50;
/// A request taking longer than this counts as failed: the load's client timeout. (Serve queues requests
/// it cannot place yet; on 2 cores a Ray head starting next to the serving one costs seconds of latency.)
const LATENCY_BOUND: Duration = Duration::from_secs(10);
/// How long Ray may take to reach the replica count of a new target capacity.
const CONVERGENCE: Duration = Duration::from_secs(30);

fn serve_config(version: &str) -> String {
    format!(
        "proxy_location: HeadOnly
http_options:
  host: 0.0.0.0
  port: 8000
applications:
  - name: versioned
    import_path: versioned:build
    route_prefix: /
    args:
      version: {version}
    deployments:
      - name: Versioned
        num_replicas: {REPLICAS}
"
    )
}

/// A new version changes the cluster (a new RayCluster) and the app.
fn spec(version: &str) -> Value {
    json!({
        "serveConfigV2": serve_config(version),
        "rayClusterConfig": {
            "enableInTreeAutoscaling": true,
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{
                "name": "ray-head", "image": "rayproject/ray:2.60.0",
                "env": [{"name": "APP_VERSION", "value": version}],
                "ports": [{"name": "dashboard", "containerPort": 8265}, {"name": "serve", "containerPort": 8000}]}]}}},
            "workerGroupSpecs": [{"groupName": "cpu", "replicas": 0, "minReplicas": 0, "maxReplicas": 1,
                "template": {"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.60.0"}]}}}]
        }
    })
}

fn rayservice(version: &str) -> RayService {
    let mut spec = spec(version);
    spec["managedBy"] = json!("rayshift.io/controller");
    // Long enough to see the old cluster drained to 0 replicas before its head goes away.
    spec["rayClusterDeletionDelaySeconds"] = json!(8);
    spec["upgradeStrategy"] = json!({"type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": {
        "gatewayClassName": traefik::CLASS, "maxSurgePercent": SURGE, "stepSizePercent": 25, "intervalSeconds": 3}});
    serde_json::from_value(
        json!({"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "llm"}, "spec": spec}),
    )
    .unwrap()
}

/// Two real Ray heads at a time are what a 2-core machine can take: the tests here run one after another.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Env {
    client: Client,
    ns: String,
    heads: RayHeads,
    gateway: TraefikGateway,
    controller: ControllerProcess,
    report: String,
}

/// How the controller reaches the dashboards.
enum DashboardRoute {
    /// Through the test's router, with rayshift's admin kubeconfig.
    Template,
    /// Through the apiserver's service proxy, as rayshift's least-privilege ServiceAccount.
    ApiserverProxy,
}

impl Env {
    async fn new(prefix: &str, route: DashboardRoute) -> Self {
        let cp = control_plane_beside_ray();
        let client = cp.client().await;
        assert!(cp.crds_established(&client).await);
        let ns = cp.namespace(&client, prefix).await;
        let heads = RayHeads::start(client.clone(), &ns).await;
        let gateway = TraefikGateway::start(cp, client.clone(), &ns).await;
        let controller = match route {
            // The heads' Serve proxies are reachable at their Pod IPs: the default health check works.
            DashboardRoute::Template => ControllerProcess::start(
                cp,
                &ns,
                &heads.url_template(),
                &[
                    GATE,
                    "--serve-health-url-template=http://{podIP}:{port}/-/healthz",
                ],
            ),
            DashboardRoute::ApiserverProxy => {
                for f in ["manifests/deploy/namespace.yaml", "manifests/deploy/rbac.yaml"] {
                    cp.kubectl(&["apply", "-f", &support::cluster::repo().join(f).to_string_lossy()]);
                }
                // A template that leads nowhere: every dashboard call must take the apiserver's proxy.
                ControllerProcess::start_as(
                    &cp.dir.join("kubeconfig-rayshift"),
                    &ns,
                    "http://127.0.0.1:9/{namespace}/{cluster}",
                    &[GATE, "--use-kubernetes-proxy"],
                )
            }
        };
        Env {
            client,
            ns,
            heads,
            gateway,
            controller,
            report: String::new(),
        }
    }

    /// Creates the RayService at v1; returns its first cluster once that alone serves all traffic.
    async fn deploy(&self) -> String {
        self.rayservices()
            .create(&PostParams::default(), &rayservice("v1"))
            .await
            .unwrap();
        let first = self
            .eventually("a first RayCluster", 30, || async {
                let rs = self.get().await;
                active(&rs).or_else(|| pending(&rs))
            })
            .await;
        self.settled_on(&first, 240).await;
        first
    }

    fn rayservices(&self) -> Api<RayService> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn get(&self) -> RayService {
        self.rayservices().get("llm").await.unwrap()
    }

    async fn set_version(&self, version: &str) {
        self.rayservices()
            .patch(
                "llm",
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": spec(version) })),
            )
            .await
            .unwrap();
    }

    async fn eventually<T, F, Fut>(&self, what: &str, secs: u64, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        support::wait::eventually(what, secs, Duration::from_millis(100), check, || async {
            let status = serde_json::to_string_pretty(&self.get().await.status).unwrap();
            format!(
                "status: {status}\nhead failures: {:?}\nTraefik errors: {:?}\nroute weights: {:?}\n--- controller logs ---\n{}",
                self.heads.failures(),
                self.gateway.errors(),
                self.gateway.routes(),
                support::wait::tail(&self.controller.logs(), 40)
            )
        })
        .await
    }

    /// Waits until `cluster` alone carries traffic at full capacity, and Traefik accepted that.
    async fn settled_on(&self, cluster: &str, secs: u64) {
        self.eventually(&format!("{cluster} active at 100/100 alone"), secs, || async {
            let rs = self.get().await;
            let a = rs.status.as_ref()?.active_service_status.as_ref()?;
            (active(&rs).as_deref() == Some(cluster)
                && pending(&rs).is_none()
                && a.target_capacity == Some(100)
                && a.traffic_routed_percent == Some(100))
            .then_some(())
        })
        .await;
        self.eventually("Traefik routing only to that cluster", 30, || async {
            let last = self.gateway.accepted()?;
            (last.weights.get(cluster) == Some(&100)).then_some(())
        })
        .await;
    }

    async fn head_stopped(&self, cluster: &str) {
        self.eventually(&format!("the head of {cluster} stopped"), 90, || async {
            self.heads.stopped(cluster)
        })
        .await;
    }

    async fn traffic_of(&self, cluster: &str) -> i32 {
        let rs = self.get().await;
        let status = rs.status.unwrap_or_default();
        [status.active_service_status, status.pending_service_status]
            .into_iter()
            .flatten()
            .find(|s| s.ray_cluster_name.as_deref() == Some(cluster))
            .and_then(|s| s.traffic_routed_percent)
            .unwrap_or(0)
    }
}

/// Memory in use on the machine (MemTotal - MemAvailable), sampled until dropped.
struct MemoryPeak {
    baseline_mib: u64,
    peak_mib: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

fn used_mib() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field("MemTotal:").saturating_sub(field("MemAvailable:")) / 1024
}

impl MemoryPeak {
    fn start() -> Self {
        let baseline_mib = used_mib();
        let peak_mib = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(baseline_mib));
        let peak = peak_mib.clone();
        let task = tokio::spawn(async move {
            loop {
                peak.fetch_max(used_mib(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        MemoryPeak {
            baseline_mib,
            peak_mib,
            task,
        }
    }

    fn peak(&self) -> u64 {
        self.peak_mib.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for MemoryPeak {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Failed responses: not 2xx, no response, an unknown body, or slower than the bound.
fn failures(responses: &[Response], versions: &[&str], from: Instant) -> Vec<String> {
    responses
        .iter()
        .filter_map(|r| {
            let why = match r.body() {
                None => format!("{:?}", r.outcome),
                Some(b) if !versions.contains(&b) => format!("unexpected body {b:?}"),
                Some(_) if r.latency > LATENCY_BOUND => format!("took {:?}", r.latency),
                Some(_) => return None,
            };
            Some(format!(
                "sent at {:.3} s: {why}",
                r.sent.saturating_duration_since(from).as_secs_f64()
            ))
        })
        .collect()
}

fn latency_line(responses: &[Response]) -> String {
    let mut l: Vec<Duration> = responses.iter().map(|r| r.latency).collect();
    l.sort();
    let q = |p: f64| l[((l.len() as f64 * p) as usize).min(l.len() - 1)];
    format!(
        "latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        q(0.5).as_secs_f64() * 1e3,
        q(0.99).as_secs_f64() * 1e3,
        l[l.len() - 1].as_secs_f64() * 1e3
    )
}

/// The share of `new` responses per version of the route's weights during the load, against the route
/// weight. A version's window opens `SETTLE` after Traefik accepted it (it applies what it accepted within
/// milliseconds; requests already in flight finish where they went) and closes when the next version
/// reached the apiserver. Returns the table and the windows of ≥ 40 requests that miss the weight by more
/// than 5 points (Traefik's weighted round robin is deterministic: the share is the weight within a request
/// or two).
fn share_table(
    env: &Env,
    from: Instant,
    to: Instant,
    responses: &[Response],
    new_cluster: &str,
    new: &str,
) -> (String, Vec<String>) {
    const SETTLE: Duration = Duration::from_millis(300);
    let routes = env.gateway.routes();
    let mut table = String::from(
        "| from (s) | for (s) | weights (RayCluster: %) | requests | `new` share | route weight of new | max latency (ms) |\n|---|---|---|---|---|---|---|\n",
    );
    table = table.replace("`new`", new);
    let mut misses = Vec::new();
    for (i, cfg) in routes.iter().enumerate() {
        let Some(accepted) = cfg.accepted else {
            continue;
        };
        let start = (accepted + SETTLE).max(from);
        let end = routes.get(i + 1).map_or(to, |n| n.seen).min(to);
        if end <= start {
            continue;
        }
        let in_window: Vec<&Response> = responses
            .iter()
            .filter(|r| r.sent >= start && r.sent < end)
            .collect();
        let hits = in_window.iter().filter(|r| r.body() == Some(new)).count();
        let share = if in_window.is_empty() {
            0.0
        } else {
            100.0 * hits as f64 / in_window.len() as f64
        };
        let weight = cfg.weights.get(new_cluster).copied().unwrap_or(0);
        let weights = cfg
            .weights
            .iter()
            .map(|(c, w)| format!("{c}: {w}"))
            .collect::<Vec<_>>()
            .join(", ");
        let slowest = in_window.iter().map(|r| r.latency).max().unwrap_or_default();
        let _ = writeln!(
            table,
            "| {:.1} | {:.1} | {weights} | {} | {share:.1}% | {weight}% | {:.0} |",
            start.duration_since(from).as_secs_f64(),
            end.duration_since(start).as_secs_f64(),
            in_window.len(),
            slowest.as_secs_f64() * 1e3
        );
        if in_window.len() >= 40 && (share - weight as f64).abs() > 5.0 {
            misses.push(format!(
                "{weights}: {share:.1}% {new} over {} requests",
                in_window.len()
            ));
        }
    }
    (table, misses)
}

/// Every target capacity the controller PUT on a cluster must show up in Ray as that many RUNNING
/// replicas (within Ray's convergence) and stay so until the next change. Returns the table and problems.
fn capacity_table(env: &Env, clusters: &[&str], from: Instant) -> (String, Vec<String>) {
    let answers = env.heads.answers();
    let samples = env.heads.samples();
    let mut table = String::from(
        "| RayCluster | at (s) | target_capacity | expected replicas | RUNNING after (s) |\n|---|---|---|---|---|\n",
    );
    let mut problems = Vec::new();
    for cluster in clusters {
        let puts: Vec<(Instant, Option<f64>)> = answers
            .iter()
            .filter(|a| &a.cluster == cluster && a.status == 200 && a.at >= from)
            .filter_map(|a| match a.call {
                Call::Put(tc) => Some((a.at, tc)),
                Call::Get(_) => None,
            })
            .collect();
        let end_of_head = env.heads.stopped(cluster).unwrap_or_else(Instant::now);
        for (i, (at, tc)) in puts.iter().enumerate() {
            let until = puts.get(i + 1).map_or(end_of_head, |n| n.0);
            let expected = tc.map_or(REPLICAS, |c| replicas_at(REPLICAS, c));
            let window: Vec<_> = samples
                .iter()
                .filter(|s| &s.cluster == cluster && s.at > *at && s.at < until)
                .collect();
            let converged = window.iter().position(|s| {
                s.view.as_ref().is_some_and(|v| {
                    v.target_capacity == *tc && v.all_running() && v.running_replicas() == expected
                })
            });
            let after = converged.map(|k| window[k].at.duration_since(*at));
            let _ = writeln!(
                table,
                "| {cluster} | {:.1} | {} | {expected} | {} |",
                at.saturating_duration_since(from).as_secs_f64(),
                tc.map_or("unset".into(), |c| format!("{c}")),
                after.map_or("superseded".into(), |d| format!("{:.1}", d.as_secs_f64()))
            );
            match converged {
                None if until.duration_since(*at) >= CONVERGENCE => problems.push(format!(
                    "{cluster}: target_capacity {tc:?} never showed {expected} RUNNING replicas"
                )),
                None => {}
                Some(k) => {
                    if let Some(off) = window[k..].iter().find(|s| {
                        s.view
                            .as_ref()
                            .is_some_and(|v| v.target_capacity == *tc && v.running_replicas() != expected)
                    }) {
                        problems.push(format!(
                            "{cluster}: at capacity {tc:?} RUNNING replicas left {expected}: {:?}",
                            off.view
                        ));
                    }
                }
            }
        }
    }
    (table, problems)
}

/// Every raise of a cluster's weight in the route came after the real dashboard had told the controller
/// that the cluster's replicas for it were RUNNING (the route is written before the data plane can carry it).
fn raises_checked(env: &Env, from: Instant) -> (String, Vec<String>) {
    let mut table = String::from(
        "| RayCluster | weight | written at (s) | Ray's last answer before (s earlier) | RUNNING replicas then |\n|---|---|---|---|---|\n",
    );
    let mut problems = Vec::new();
    let routes = env.gateway.routes();
    let mut last: BTreeMap<String, i64> = routes
        .iter()
        .rfind(|c| c.seen < from)
        .map(|c| c.weights.clone())
        .unwrap_or_default();
    for cfg in routes.iter().filter(|c| c.seen >= from) {
        for (cluster, w) in &cfg.weights {
            let before = last.get(cluster).copied().unwrap_or(0);
            if *w > before {
                let need = replicas_at(REPLICAS, *w as f64);
                match env.heads.told_before(cluster, cfg.seen) {
                    Some((t, v)) => {
                        let _ = writeln!(
                            table,
                            "| {cluster} | {before}% → {w}% | {:.1} | {:.2} | {} of {need} needed, apps {:?} |",
                            cfg.seen.duration_since(from).as_secs_f64(),
                            cfg.seen.duration_since(t).as_secs_f64(),
                            v.running_replicas(),
                            v.apps.values().collect::<Vec<_>>()
                        );
                        if !(v.all_running() && v.running_replicas() >= need) {
                            problems.push(format!("{cluster} got {w}% while Ray reported {v:?}"));
                        }
                    }
                    None => problems.push(format!("{cluster} got {w}% before Ray reported anything")),
                }
            }
        }
        last = cfg.weights.clone();
    }
    (table, problems)
}

struct Phase<'a> {
    title: &'a str,
    old_cluster: &'a str,
    new_cluster: &'a str,
    new: &'a str,
    versions: &'a [&'a str],
}

/// Checks one phase's load and Ray records, appends the tables to the report, and returns the problems.
fn check_phase(
    env: &mut Env,
    phase: &Phase<'_>,
    from: Instant,
    to: Instant,
    ran: Duration,
    responses: &[Response],
) -> Vec<String> {
    let failed = failures(responses, phase.versions, from);
    let (shares, misses) = share_table(env, from, to, responses, phase.new_cluster, phase.new);
    let (capacities, capacity_problems) = capacity_table(env, &[phase.old_cluster, phase.new_cluster], from);
    let (raises, raise_problems) = raises_checked(env, from);
    let mut problems = Vec::new();
    if !failed.is_empty() {
        problems.push(format!(
            "{} of {} requests failed, first: {:?}",
            failed.len(),
            responses.len(),
            &failed[..failed.len().min(5)]
        ));
    }
    problems.extend(misses.into_iter().map(|m| format!("share off the weight: {m}")));
    problems.extend(capacity_problems);
    problems.extend(raise_problems);
    let _ = write!(
        env.report,
        "\n## {}\n\n{} requests in {:.1} s ({:.1}/s), {} failed; {}.\n\n### Share of {} responses per version of the route (through Traefik)\n\n{shares}\n### Target capacity vs RUNNING replicas (real Ray)\n\n{capacities}\n### Weight raises\n\n{raises}",
        phase.title,
        responses.len(),
        ran.as_secs_f64(),
        responses.len() as f64 / ran.as_secs_f64(),
        failed.len(),
        latency_line(responses),
        phase.new,
    );
    problems
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_ray_serve_upgrade_and_rollback_fail_no_request() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let began = Instant::now();
    let memory = MemoryPeak::start();
    let mut env = Env::new("realray", DashboardRoute::Template).await;
    let first = env.deploy().await;
    let deployed = began.elapsed();
    let observer = Observer::start(
        env.client.clone(),
        &env.ns,
        "llm",
        SURGE,
        env.heads.serving(REPLICAS),
    );

    // Phase 1: v1 -> v2 under load.
    let load = Load::start(&env.gateway.url(), RATE, LATENCY_BOUND);
    let from = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first_head = env.heads.head(&first).unwrap();
    env.set_version("v2").await;
    let second = env
        .eventually("a pending RayCluster", 30, || async { pending(&env.get().await) })
        .await;
    env.settled_on(&second, 300).await;
    let promoted = from.elapsed();
    // The old cluster drains to 0 replicas, then goes (after rayClusterDeletionDelaySeconds).
    env.head_stopped(&first).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let to = Instant::now();
    let (ran, responses) = load.stop().await;
    let mut problems = check_phase(
        &mut env,
        &Phase {
            title: "Incremental upgrade v1 → v2 (maxSurgePercent 50, stepSizePercent 25, intervalSeconds 3)",
            old_cluster: &first,
            new_cluster: &second,
            new: "v2",
            versions: &["v1", "v2"],
        },
        from,
        to,
        ran,
        &responses,
    );
    let last_old = env
        .heads
        .samples()
        .into_iter()
        .rfind(|s| s.cluster == first && s.view.is_some())
        .and_then(|s| s.view);
    if last_old.as_ref().is_none_or(|v| v.running_replicas() != 0) {
        problems.push(format!(
            "the old cluster still ran replicas before it went: {last_old:?}"
        ));
    }
    // Its RayCluster is gone and so is its head: no process, no network namespace left.
    let netns = first_head.netns.clone();
    let left = std::process::Command::new("ip")
        .args(["netns", "pids", &netns])
        .output()
        .map(|o| o.status.success() || !o.stdout.is_empty())
        .unwrap_or(false);
    if left {
        problems.push(format!("the old cluster's head ({netns}) is still there"));
    }
    let tail: Vec<_> = responses
        .iter()
        .filter(|r| r.sent > to - Duration::from_secs(2))
        .collect();
    if tail.is_empty() || tail.iter().any(|r| r.body() != Some("v2")) {
        problems.push("after the promotion not every answer came from v2".into());
    }

    // Phase 2: v2 -> v3, reverted to v2 once v3 carries half the traffic.
    let load = Load::start(&env.gateway.url(), RATE, LATENCY_BOUND);
    let from2 = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.set_version("v3").await;
    let third = env
        .eventually("a pending RayCluster", 30, || async { pending(&env.get().await) })
        .await;
    env.eventually("v3 carrying 50% of traffic", 240, || async {
        (env.traffic_of(&third).await >= 50).then_some(())
    })
    .await;
    let reverted_at = from2.elapsed();
    env.set_version("v2").await;
    env.settled_on(&second, 240).await;
    let rolled_back = from2.elapsed();
    env.head_stopped(&third).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let to2 = Instant::now();
    let (ran2, responses2) = load.stop().await;
    problems.extend(check_phase(
        &mut env,
        &Phase {
            title: "Rollback: v2 → v3, spec reverted to v2 once v3 had 50% of traffic",
            old_cluster: &second,
            new_cluster: &third,
            new: "v3",
            versions: &["v2", "v3"],
        },
        from2,
        to2,
        ran2,
        &responses2,
    ));
    let tail: Vec<_> = responses2
        .iter()
        .filter(|r| r.sent > to2 - Duration::from_secs(2))
        .collect();
    if tail.is_empty() || tail.iter().any(|r| r.body() != Some("v2")) {
        problems.push("after the rollback not every answer came from v2".into());
    }
    let v3_served = responses2.iter().filter(|r| r.body() == Some("v3")).count();
    if v3_served == 0 {
        problems.push("v3 never served a request before the rollback".into());
    }

    problems.extend(
        observer
            .violations()
            .into_iter()
            .map(|v| format!("invariant: {v}")),
    );
    let server_errors = env.gateway.server_errors();
    if !server_errors.is_empty() {
        problems.push(format!("Traefik answered 5xx, by backend: {server_errors:?}"));
    }

    problems.extend(env.heads.failures());
    let head_start: Vec<String> = [&first, &second, &third]
        .iter()
        .map(|c| {
            let took = env.heads.ready_after(c).unwrap_or_default();
            format!("{c} up in {:.1} s", took.as_secs_f64())
        })
        .collect();
    let summary = format!(
        "# Real Ray Serve end to end\n\nRay {} heads ({}), first deploy ready after {:.1} s; promotion {:.1} s after the v2 spec; \
         rollback: reverted {:.1} s after the v3 spec, back on v2 alone {:.1} s after it. \
         Test wall time {:.1} s; machine memory in use: baseline {} MiB, peak {} MiB (+{} MiB).\n",
        "2.60.0",
        head_start.join(", "),
        deployed.as_secs_f64(),
        promoted.as_secs_f64(),
        reverted_at.as_secs_f64(),
        rolled_back.as_secs_f64(),
        began.elapsed().as_secs_f64(),
        memory.baseline_mib,
        memory.peak(),
        memory.peak().saturating_sub(memory.baseline_mib),
    );
    let traefik_errors = env.gateway.errors();
    let report = format!(
        "{summary}Traefik {} logged {} errors (transient ones, such as a new serve Service whose EndpointSlice \
         did not exist yet, are expected; failed requests are what counts):\n{}\n{}",
        traefik::VERSION,
        traefik_errors.len(),
        traefik_errors.join("\n"),
        env.report
    );
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ray-serve-e2e-report.md");
    std::fs::write(&path, &report).unwrap();
    println!("{report}\n(report written to {})", path.display());
    assert!(
        problems.is_empty(),
        "problems:\n{}\n\n{report}",
        problems.join("\n")
    );
}

/// `--use-kubernetes-proxy`: the controller reaches the real dashboard through the apiserver's service proxy
/// (`{cluster}-head-svc:dashboard`), as rayshift's own least-privilege identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_dashboard_through_the_apiserver_service_proxy() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let env = Env::new("realproxy", DashboardRoute::ApiserverProxy).await;
    let first = env.deploy().await;
    let view = env.heads.view(&first).await.expect("the head answers");
    assert_eq!(view.target_capacity, Some(100.0), "{view:?}");
    assert_eq!(view.running_replicas(), REPLICAS, "{view:?}");
    // Traefik writes the route's status as it builds its configuration, and serves it a moment later.
    let url = env.gateway.url();
    env.eventually("v1 answering through Traefik", 30, || async {
        let body = reqwest::get(&url).await.ok()?.text().await.ok()?;
        (body.trim() == "v1").then_some(())
    })
    .await;
    assert!(
        env.heads.answers().is_empty(),
        "the controller used the URL template: {:?}",
        env.heads.answers()
    );
}
