//! Admission load benchmark: a ~10 KB RayService AdmissionReview over TLS keep-alive, sent to the real
//! `rayshift webhook` process and, in the same run, to a no-op axum+rustls server (same TLS stack and
//! accept loop, fixed "allowed" answer). Reports p50/p99 latency, throughput, their ratio and the
//! webhook's RSS.
//!
//!   cargo bench --bench admission                # defaults: 10 s per phase
//!   BENCH_SECONDS=5 BENCH_CONNECTIONS=8 cargo bench --bench admission
//!
//! The no-op server is this same binary re-run with `--noop-server`, so both servers are separate
//! processes on equal footing.

use std::{
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use axum::{Router, routing::post};
use rayshift_webhook::{
    admission::{self, AdmissionConfig, Hook},
    certs::{self, ServingCertRequest},
    metrics::Metrics,
    server::{self, ServerSettings},
    tls::CertStore,
};
use serde_json::{Value, json};

/// The same allocator as the `rayshift` binary, so the two servers differ only in their handlers.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--noop-server") {
        noop_server(&args[i + 1], &args[i + 2]);
        return;
    }
    let body = serde_json::to_vec(&review()).unwrap();
    if let Some(i) = args.iter().position(|a| a == "--review-loop") {
        // For `valgrind --tool=callgrind`: nothing but the in-process review, N times.
        review_loop(&body, args[i + 1].parse().unwrap());
        return;
    }
    let same = std::slice::from_ref(&body);
    // A config the webhook has not parsed before in every request: the memo of parsed texts never helps.
    let fresh = new_configs(1024);
    let seconds: u64 = env("BENCH_SECONDS", 10);
    let connections: usize = env("BENCH_CONNECTIONS", 8);
    let dir = tempfile::tempdir().unwrap();
    let req = ServingCertRequest {
        service: "bench".into(),
        namespace: "bench".into(),
        ips: vec!["127.0.0.1".parse().unwrap()],
        extra_dns: vec![],
        valid_days: 1,
    };
    certs::generate(&req, dir.path(), false).unwrap();
    println!(
        "AdmissionReview body: {} bytes; {seconds} s per phase; {connections} connections for throughput",
        body.len()
    );

    println!(
        "in-process CPU per review (one thread, no TLS or HTTP): validate {:.1} µs (a new serveConfigV2 each \
         time: {:.1} µs), mutate {:.1} µs",
        cpu_per_review(same, Hook::Validate),
        cpu_per_review(&fresh, Hook::Validate),
        cpu_per_review(same, Hook::Mutate)
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let ca = std::fs::read(dir.path().join("ca.crt")).unwrap();
    let mut servers: Vec<Started> = [Server::Webhook, Server::Noop]
        .into_iter()
        .map(|which| Started::new(which, dir.path()))
        .collect();
    let phase = Duration::from_secs(seconds);
    runtime.block_on(async {
        for s in &mut servers {
            load(&s.url, &ca, same, 1, Duration::from_secs(1), None).await; // warm-up
            s.latency = load(&s.url, &ca, same, 1, phase, None).await;
        }
        // Interleaved, so that both servers see the machine as it is in each round.
        let round = phase / 2;
        for _ in 0..ROUNDS {
            for (i, bodies, new_config) in [(0, same, false), (1, same, false), (0, &fresh[..], true)] {
                let s = &mut servers[i];
                let run = s.measured(&ca, bodies, connections, round).await;
                if new_config {
                    s.new_configs.push(run);
                } else {
                    s.throughput.push(run);
                }
            }
        }
    });
    let webhook = &servers[0];
    let rotation = runtime.block_on(rotate_under_load(
        &req,
        dir.path(),
        &webhook.url,
        same,
        webhook.metrics,
        connections,
        seconds,
    ));
    rotation.report(rss_kib(webhook.child.id()));
    for s in &mut servers {
        s.rss = rss_kib(s.child.id());
        let _ = s.child.kill();
        let _ = s.child.wait();
    }
    report(&servers, connections);
}

/// Throughput rounds per server: each round is half a phase, webhook and no-op in turn.
const ROUNDS: usize = 3;

/// A server under test and what was measured of it.
struct Started {
    which: Server,
    child: Child,
    url: String,
    metrics: SocketAddr,
    latency: Run,
    throughput: Vec<Run>,
    /// The webhook with a new serveConfigV2 in every request.
    new_configs: Vec<Run>,
    rss: (u64, u64),
}

impl Started {
    fn new(which: Server, dir: &Path) -> Self {
        let (child, addr, metrics) = which.spawn(dir);
        wait_up(addr);
        Self {
            which,
            child,
            url: format!("https://127.0.0.1:{}{}", addr.port(), server::VALIDATE_PATH),
            metrics,
            latency: Run::default(),
            throughput: Vec::new(),
            new_configs: Vec::new(),
            rss: (0, 0),
        }
    }

    /// A load run with the server's CPU over it.
    async fn measured(&self, ca: &[u8], bodies: &[Vec<u8>], connections: usize, time: Duration) -> Run {
        let cpu = cpu_ns(self.child.id());
        let mut run = load(&self.url, ca, bodies, connections, time, None).await;
        run.server_cpu = Duration::from_nanos(cpu_ns(self.child.id()) - cpu);
        run
    }
}

/// What `rayshift webhook` runs with: the incremental gate on, parsed serveConfigV2 texts kept.
fn webhook_config() -> AdmissionConfig {
    let mut config = AdmissionConfig::incremental();
    config.validation.serve_configs =
        rayshift_api::validation::ServeConfigMemo::with_capacity(admission::SERVE_CONFIGS_KEPT);
    config
}

fn review_loop(body: &[u8], n: usize) {
    let config = webhook_config();
    for _ in 0..n {
        std::hint::black_box(admission::review(Hook::Validate, body, &config).unwrap());
    }
}

/// Mean wall time of one in-process review over 2 s (the thread does nothing else), the bodies in turn.
fn cpu_per_review(bodies: &[Vec<u8>], hook: Hook) -> f64 {
    let config = webhook_config();
    let (started, mut n) = (Instant::now(), 0u32);
    while started.elapsed() < Duration::from_secs(2) {
        let body = &bodies[n as usize % bodies.len()];
        std::hint::black_box(admission::review(hook, body, &config).unwrap());
        n += 1;
    }
    started.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Server {
    Webhook,
    Noop,
}

impl Server {
    /// The process, its TLS address and (the webhook's) metrics address.
    fn spawn(self, dir: &Path) -> (Child, SocketAddr, SocketAddr) {
        let addr = free_addr();
        let metrics = free_addr();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let mut cmd = match self {
            Server::Webhook => {
                let mut c = Command::new(env!("CARGO_BIN_EXE_rayshift"));
                c.arg("webhook")
                    .args([
                        "--webhook-addr",
                        &addr.to_string(),
                        "--metrics-addr",
                        &metrics.to_string(),
                        "--cert-reload-interval-seconds",
                        "1",
                    ])
                    .arg("--tls-cert-file")
                    .arg(&cert)
                    .arg("--tls-key-file")
                    .arg(&key)
                    .args([
                        "--feature-gates=RayServiceIncrementalUpgrade=true",
                        "--log-level",
                        "warn",
                    ]);
                c
            }
            Server::Noop => {
                let mut c = Command::new(std::env::current_exe().unwrap());
                c.arg("--noop-server").arg(addr.to_string()).arg(dir);
                c
            }
        };
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        (child, addr, metrics)
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn wait_up(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The baseline: same rustls config, same accept loop, a handler that always allows.
fn noop_server(addr: &str, dir: &str) {
    let addr: SocketAddr = addr.parse().unwrap();
    let dir = Path::new(dir);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let registry = prometheus::Registry::new();
            let metrics = Metrics::register(&registry).unwrap();
            let certs = CertStore::new(dir.join("tls.crt"), dir.join("tls.key"));
            certs.reload(&metrics).unwrap();
            let allow = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": {"uid": "bench", "allowed": true}});
            let router = Router::new().route(
                server::VALIDATE_PATH,
                post(move |_body: axum::body::Bytes| {
                    let allow = allow.clone();
                    async move { axum::Json(allow) }
                }),
            );
            let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
            let (_tx, rx) = tokio::sync::watch::channel(false);
            server::serve_tls(listener, certs, router, metrics, ServerSettings::default(), rx)
                .await
                .unwrap();
        });
}

#[derive(Default)]
struct Run {
    latencies: Vec<Duration>,
    elapsed: Duration,
    errors: usize,
    /// CPU the server process spent during the run, all threads.
    server_cpu: Duration,
}

impl Run {
    fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }

    fn cpu_per_request_us(&self) -> f64 {
        self.server_cpu.as_secs_f64() * 1e6 / self.latencies.len() as f64
    }
}

/// CPU time of every thread of `pid` so far (the scheduler's own count, in ns).
fn cpu_ns(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn client(ca: &[u8]) -> reqwest::Client {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca).unwrap())
        .pool_max_idle_per_host(1)
        .http1_only()
        .build()
        .unwrap()
}

/// `connections` keep-alive connections sending `bodies` in turn for `duration` (connection i starts at the
/// i-th); with `reconnect_every`, each opens a new connection (a new TLS handshake) after that many requests.
async fn load(
    url: &str,
    ca: &[u8],
    bodies: &[Vec<u8>],
    connections: usize,
    duration: Duration,
    reconnect_every: Option<usize>,
) -> Run {
    let started = Instant::now();
    let mut tasks = Vec::new();
    // One copy shared by the connections (1,024 bodies of 11 KB with new configs).
    let bodies: std::sync::Arc<[Vec<u8>]> = bodies.into();
    for task in 0..connections {
        let ca = ca.to_vec();
        let (url, bodies) = (url.to_string(), bodies.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = client(&ca);
            let mut lat = Vec::new();
            let mut errors = 0;
            while started.elapsed() < duration {
                if reconnect_every.is_some_and(|n| (lat.len() + errors + 1) % n == 0) {
                    client = self::client(&ca);
                }
                let body = &bodies[(task + (lat.len() + errors) * connections) % bodies.len()];
                let t = Instant::now();
                match client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                {
                    Ok(r) if r.status().is_success() => {
                        let _ = r.bytes().await;
                        lat.push(t.elapsed());
                    }
                    _ => errors += 1,
                }
            }
            (lat, errors)
        }));
    }
    let mut run = Run {
        latencies: Vec::new(),
        elapsed: Duration::ZERO,
        errors: 0,
        server_cpu: Duration::ZERO,
    };
    for t in tasks {
        let (lat, errors) = t.await.unwrap();
        run.latencies.extend(lat);
        run.errors += errors;
    }
    run.elapsed = started.elapsed();
    run.latencies.sort();
    run
}

const RECONNECT_EVERY: usize = 50;

async fn rotate_under_load(
    req: &ServingCertRequest,
    dir: &Path,
    url: &str,
    body: &[Vec<u8>],
    metrics: SocketAddr,
    connections: usize,
    seconds: u64,
) -> Rotation {
    let reloads_before = reloads(metrics, "success").await;
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let (req, dir) = (req.clone(), dir.to_path_buf());
    let rotations = tokio::spawn(async move {
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(seconds) / 4).await;
            // Same CA, new key and certificate, each file replaced by a rename.
            let (req, dir) = (req.clone(), dir.clone());
            tokio::task::spawn_blocking(move || certs::generate(&req, &dir, true).unwrap())
                .await
                .unwrap();
        }
    });
    let run = load(
        url,
        &ca,
        body,
        connections,
        Duration::from_secs(seconds),
        Some(RECONNECT_EVERY),
    )
    .await;
    rotations.await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await; // one reload interval
    Rotation {
        connections,
        run,
        reloads_before,
        reloads_after: reloads(metrics, "success").await,
        reload_errors: reloads(metrics, "error").await,
    }
}

/// `rayshift_webhook_certificate_reloads_total{result}` from the webhook's metrics endpoint.
async fn reloads(metrics: SocketAddr, result: &str) -> f64 {
    let text = reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = format!("rayshift_webhook_certificate_reloads_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Load with new connections all along while the serving certificate is replaced 3 times.
struct Rotation {
    connections: usize,
    run: Run,
    reloads_before: f64,
    reloads_after: f64,
    reload_errors: f64,
}

impl Rotation {
    fn report(&self, (rss, hwm): (u64, u64)) {
        println!(
            "certificate rotated 3 times under load ({} conns, a new TLS connection every {RECONNECT_EVERY} \
             requests): {} requests at {:.0}/s, {} failed; p99 {:.3} ms; reloads seen {} (errors {}); webhook \
             RSS {:.1} MiB (peak {:.1})",
            self.connections,
            self.run.latencies.len(),
            self.run.rate(),
            self.run.errors,
            pct(&self.run.latencies, 0.99),
            self.reloads_after - self.reloads_before,
            self.reload_errors,
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0,
        );
        assert_eq!(
            self.run.errors, 0,
            "requests failed while the certificate rotated"
        );
        assert!(
            self.reloads_after - self.reloads_before >= 3.0,
            "the webhook did not load each new certificate"
        );
    }
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The rounds' runs as one.
fn merged(runs: &[Run]) -> Run {
    let mut all = Run::default();
    for r in runs {
        all.latencies.extend_from_slice(&r.latencies);
        all.elapsed += r.elapsed;
        all.errors += r.errors;
        all.server_cpu += r.server_cpu;
    }
    all.latencies.sort();
    all
}

/// Each round's webhook figure over the no-op's of the same round, in order, and their median.
fn round_ratios(webhook: &[Run], noop: &[Run], figure: fn(&Run) -> f64) -> (Vec<f64>, f64) {
    let ratios: Vec<f64> = webhook
        .iter()
        .zip(noop)
        .map(|(w, n)| figure(w) / figure(n))
        .collect();
    let mut sorted = ratios.clone();
    sorted.sort_by(f64::total_cmp);
    (ratios, sorted[sorted.len() / 2])
}

fn report(servers: &[Started], connections: usize) {
    println!();
    println!(
        "| server | p50 ms (1 conn) | p99 ms (1 conn) | req/s (1 conn) | p50 ms ({connections} conns) | p99 ms ({connections} conns) | req/s ({connections} conns) | server CPU µs/request ({connections} conns) | errors | RSS MiB (peak) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let (webhook, noop) = (&servers[0], &servers[1]);
    let rows = [
        ("rayshift webhook", webhook, &webhook.throughput),
        (
            "rayshift webhook, a new serveConfigV2 each request",
            webhook,
            &webhook.new_configs,
        ),
        ("no-op axum+rustls", noop, &noop.throughput),
    ];
    for (name, s, runs) in rows {
        let (lat, thr, (rss, hwm)) = (&s.latency, merged(runs), s.rss);
        println!(
            "| {name} | {:.3} | {:.3} | {:.0} | {:.3} | {:.3} | {:.0} | {:.1} | {} | {:.1} ({:.1}) |",
            pct(&lat.latencies, 0.5),
            pct(&lat.latencies, 0.99),
            lat.rate(),
            pct(&thr.latencies, 0.5),
            pct(&thr.latencies, 0.99),
            thr.rate(),
            thr.cpu_per_request_us(),
            lat.errors + thr.errors,
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0,
        );
    }
    assert_eq!(webhook.which, Server::Webhook);
    println!();
    for (what, runs) in [
        ("same config", &webhook.throughput),
        ("a new config each request", &webhook.new_configs),
    ] {
        let (rates, rate) = round_ratios(runs, &noop.throughput, Run::rate);
        let (cpus, cpu) = round_ratios(runs, &noop.throughput, Run::cpu_per_request_us);
        let list = |v: &[f64]| v.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ");
        println!(
            "webhook/no-op, {what}, {connections} conns, {ROUNDS} interleaved rounds: throughput {} (median \
             {rate:.2}); server CPU per request {} (median {cpu:.2})",
            list(&rates),
            list(&cpus),
        );
    }
    println!(
        "throughput ratio, 1 conn: {:.2}; p99 webhook {:.3} ms (1 conn), {:.3} ms ({connections} conns)",
        webhook.latency.rate() / noop.latency.rate(),
        pct(&webhook.latency.latencies, 0.99),
        pct(&merged(&webhook.throughput).latencies, 0.99),
    );
}

/// `n` reviews that each change serveConfigV2 (a comment naming the revision heads the text).
fn new_configs(n: usize) -> Vec<Vec<u8>> {
    let review = review();
    let text = review["request"]["object"]["spec"]["serveConfigV2"]
        .as_str()
        .unwrap()
        .to_string();
    (0..n)
        .map(|i| {
            let mut r = review.clone();
            r["request"]["object"]["spec"]["serveConfigV2"] = Value::from(format!("# revision {i}\n{text}"));
            serde_json::to_vec(&r).unwrap()
        })
        .collect()
}

/// A realistic ~10 KB AdmissionReview: the incremental sample with kubectl's last-applied annotation.
fn review() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/manifests/samples/rayservice-incremental.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let mut object = rayshift_api::documents::parse_stream(&text).unwrap().remove(0);
    let applied = serde_json::to_string(&object).unwrap();
    object["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] =
        Value::from(applied);
    object["metadata"]["uid"] = json!("6f1c2b7e-0d8a-4f37-9b1e-3c2d1a0e9f88");
    object["metadata"]["generation"] = json!(3);
    object["metadata"]["managedFields"] = json!([{"manager": "kubectl-client-side-apply", "operation": "Update",
        "apiVersion": "ray.io/v1", "time": "2026-11-01T10:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}}},
                     "f:spec": {".": {}, "f:rayClusterConfig": {}, "f:serveConfigV2": {}, "f:upgradeStrategy": {}}}}]);
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "bench", "kind": {"group": "ray.io", "version": "v1", "kind": "RayService"},
            "resource": {"group": "ray.io", "version": "v1", "resource": "rayservices"},
            "requestKind": {"group": "ray.io", "version": "v1", "kind": "RayService"},
            "requestResource": {"group": "ray.io", "version": "v1", "resource": "rayservices"},
            "name": "rayservice-incremental", "namespace": "default", "operation": "UPDATE",
            "userInfo": {"username": "alice", "uid": "1", "groups": ["system:authenticated"]},
            "object": object.clone(), "oldObject": object, "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions", "fieldManager": "kubectl-client-side-apply"}
        }
    })
}
