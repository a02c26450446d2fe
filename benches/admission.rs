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
    certs::{self, ServingCertRequest},
    metrics::Metrics,
    server::{self, ServerSettings},
    tls::CertStore,
};
use serde_json::{Value, json};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--noop-server") {
        noop_server(&args[i + 1], &args[i + 2]);
        return;
    }
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
    let body = serde_json::to_vec(&review()).unwrap();
    println!(
        "AdmissionReview body: {} bytes; {seconds} s per phase; {connections} connections for throughput",
        body.len()
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut results = Vec::new();
    for which in [Server::Webhook, Server::Noop] {
        let mut child = which.spawn(dir.path());
        let addr = child.1;
        wait_up(addr);
        let ca = std::fs::read(dir.path().join("ca.crt")).unwrap();
        let url = format!("https://127.0.0.1:{}{}", addr.port(), server::VALIDATE_PATH);
        let r = runtime.block_on(async {
            load(&url, &ca, &body, 1, Duration::from_secs(1)).await; // warm-up
            let latency = load(&url, &ca, &body, 1, Duration::from_secs(seconds)).await;
            let throughput = load(&url, &ca, &body, connections, Duration::from_secs(seconds)).await;
            (latency, throughput)
        });
        let rss = rss_kib(child.0.id());
        let _ = child.0.kill();
        let _ = child.0.wait();
        results.push((which, r.0, r.1, rss));
    }
    report(&results, connections);
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
    fn spawn(self, dir: &Path) -> (Child, SocketAddr) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let mut cmd = match self {
            Server::Webhook => {
                let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
                    .port();
                let mut c = Command::new(env!("CARGO_BIN_EXE_rayshift"));
                c.arg("webhook")
                    .args([
                        "--webhook-addr",
                        &addr.to_string(),
                        "--metrics-addr",
                        &format!("127.0.0.1:{metrics_port}"),
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
        (child, addr)
    }
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

struct Run {
    latencies: Vec<Duration>,
    elapsed: Duration,
    errors: usize,
}

async fn load(url: &str, ca: &[u8], body: &[u8], connections: usize, duration: Duration) -> Run {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(ca).unwrap())
            .pool_max_idle_per_host(1)
            .http1_only()
            .build()
            .unwrap();
        let (url, body) = (url.to_string(), body.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0;
            while started.elapsed() < duration {
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

fn report(results: &[(Server, Run, Run, (u64, u64))], connections: usize) {
    println!();
    println!(
        "| server | p50 ms (1 conn) | p99 ms (1 conn) | req/s (1 conn) | p50 ms ({connections} conns) | p99 ms ({connections} conns) | req/s ({connections} conns) | errors | RSS MiB (peak) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (which, lat, thr, (rss, hwm)) in results {
        println!(
            "| {} | {:.3} | {:.3} | {:.0} | {:.3} | {:.3} | {:.0} | {} | {:.1} ({:.1}) |",
            match which {
                Server::Webhook => "rayshift webhook",
                Server::Noop => "no-op axum+rustls",
            },
            pct(&lat.latencies, 0.5),
            pct(&lat.latencies, 0.99),
            lat.latencies.len() as f64 / lat.elapsed.as_secs_f64(),
            pct(&thr.latencies, 0.5),
            pct(&thr.latencies, 0.99),
            thr.latencies.len() as f64 / thr.elapsed.as_secs_f64(),
            lat.errors + thr.errors,
            *rss as f64 / 1024.0,
            *hwm as f64 / 1024.0,
        );
    }
    let rate = |r: &Run| r.latencies.len() as f64 / r.elapsed.as_secs_f64();
    let (w, n) = (&results[0], &results[1]);
    println!();
    println!(
        "throughput ratio webhook/no-op: {:.2} (1 conn), {:.2} ({connections} conns); p99 webhook {:.3} ms (1 conn)",
        rate(&w.1) / rate(&n.1),
        rate(&w.2) / rate(&n.2),
        pct(&w.1.latencies, 0.99)
    );
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
