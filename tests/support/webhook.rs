//! Starts the real `rayshift webhook` process on loopback ports with certificates from
//! `rayshift certs generate`, and talks to it over real TLS.

use std::{
    hash::BuildHasher,
    io::{BufRead, BufReader},
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

pub fn rayshift_bin() -> &'static str {
    env!("CARGO_BIN_EXE_rayshift")
}

/// Runs `rayshift certs generate` into `dir` for a loopback webhook.
pub fn generate_certs(dir: &Path, reuse_ca: bool) {
    let mut cmd = Command::new(rayshift_bin());
    cmd.args([
        "certs",
        "generate",
        "--service",
        "rayshift-webhook",
        "--namespace",
        "rayshift-system",
        "--ip",
        "127.0.0.1",
    ])
    .arg("--out")
    .arg(dir);
    if reuse_ca {
        cmd.arg("--reuse-ca");
    }
    let out = cmd.output().expect("run rayshift certs generate");
    assert!(
        out.status.success(),
        "certs generate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A free loopback port for a server started later, never the same one twice in this test binary. It is taken
/// below the kernel's ephemeral range: a port from bind(0) is in that range, where any outgoing connection on the
/// machine may take it before the server binds it (as tests/env/control-plane.sh does, for the same reason).
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let first = low.saturating_sub(12000).max(1024);
    let random = std::hash::RandomState::new();
    for draw in 0u32.. {
        let port = first + (random.hash_one(draw) % u64::from(low - first)) as u16;
        let mut seen = HANDED_OUT.lock().unwrap();
        if !seen.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            seen.push(port);
            return port;
        }
    }
    unreachable!("u32 draws are enough to find one free port")
}

/// A running webhook process; killed on drop.
pub struct WebhookProcess {
    pub child: Child,
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub dir: PathBuf,
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl WebhookProcess {
    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let metrics_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut child = Command::new(rayshift_bin())
            .arg("webhook")
            .arg("--webhook-addr")
            .arg(addr.to_string())
            .arg("--metrics-addr")
            .arg(metrics_addr.to_string())
            .arg("--tls-cert-file")
            .arg(dir.join("tls.crt"))
            .arg("--tls-key-file")
            .arg(dir.join("tls.key"))
            .args(["--cert-reload-interval-seconds", "1"])
            .args(if extra.iter().any(|a| a.starts_with("--feature-gates")) {
                &[][..]
            } else {
                &["--feature-gates=RayServiceIncrementalUpgrade=true"][..]
            })
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rayshift webhook");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let process = Self {
            child,
            addr,
            metrics_addr,
            dir: dir.to_path_buf(),
            logs,
        };
        process.wait_ready();
        process
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(resp) = plain_http::status(&format!("http://{}/readyz", self.metrics_addr))
                && resp == 200
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "webhook not ready; logs:\n{}",
            self.logs.lock().unwrap().join("\n")
        );
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.addr.port())
    }

    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.crt")).unwrap()
    }

    /// A webhook serving certificates `rayshift certs generate` made in a directory of its own (kept with it).
    pub fn with_generated_certs() -> (Self, tempfile::TempDir) {
        let certs = tempfile::tempdir().unwrap();
        generate_certs(certs.path(), false);
        (Self::start(certs.path(), &[]), certs)
    }

    /// An HTTPS client that trusts this webhook's CA and nothing else.
    pub fn client(&self) -> reqwest::Client {
        client_trusting(&self.ca_pem())
    }

    /// The text of /metrics.
    pub fn metrics(&self) -> String {
        plain_http::text(&format!("http://{}/metrics", self.metrics_addr))
    }
}

impl Drop for WebhookProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTPS client that trusts the CA in `ca_pem` and nothing else.
pub fn client_trusting(ca_pem: &[u8]) -> reqwest::Client {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem).unwrap())
        .build()
        .unwrap()
}

/// A RayService that only rayshift denies (stepSizePercent over 100; KubeRay's CRD allows it).
pub fn denied_only_by_rayshift(name: &str) -> Value {
    json!({
        "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": name},
        "spec": {"upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": {
                    "gatewayClassName": "g", "maxSurgePercent": 50, "stepSizePercent": 150, "intervalSeconds": 60}},
                 "serveConfigV2": "applications:\n  - name: a\n    import_path: m:app\n",
                 "rayClusterConfig": {"enableInTreeAutoscaling": true, "headGroupSpec": {"rayStartParams": {},
                    "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.46.0"}]}}}}}
    })
}

/// The value of one sample line of a Prometheus text exposition, 0 when absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0)
}

/// An AdmissionReview for `object` as the apiserver sends it.
pub fn admission_review(operation: &str, object: Option<&Value>, old: Option<&Value>) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "ray.io", "version": "v1", "kind": "RayService"},
            "resource": {"group": "ray.io", "version": "v1", "resource": "rayservices"},
            "requestKind": {"group": "ray.io", "version": "v1", "kind": "RayService"},
            "requestResource": {"group": "ray.io", "version": "v1", "resource": "rayservices"},
            "name": object.and_then(|o| o["metadata"]["name"].as_str()).unwrap_or("llm"),
            "namespace": "serving",
            "operation": operation,
            "userInfo": {"username": "admin", "groups": ["system:masters", "system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// Tiny blocking HTTP helpers for plain-HTTP admin endpoints (no extra client runtime needed).
pub mod plain_http {
    use std::{
        io::{Read, Write},
        net::TcpStream,
        time::Duration,
    };

    fn get(url: &str) -> std::io::Result<(u16, String)> {
        let rest = url.strip_prefix("http://").expect("plain http url");
        let (host, path) = rest
            .split_once('/')
            .map(|(h, p)| (h, format!("/{p}")))
            .unwrap_or((rest, "/".into()));
        let mut s = TcpStream::connect(host)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )?;
        let mut buf = String::new();
        s.read_to_string(&mut buf)?;
        let code = buf
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = buf
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((code, body))
    }

    pub fn status(url: &str) -> std::io::Result<u16> {
        get(url).map(|(c, _)| c)
    }

    pub fn text(url: &str) -> String {
        get(url).map(|(_, b)| b).unwrap_or_default()
    }
}

/// A `rayshift webhook` registered with a control plane for one namespace (selected by a label it sets), the
/// way an operator installs it; the configurations are removed on drop.
pub struct AdmissionWebhook {
    pub process: WebhookProcess,
    pub name: String,
    kubeconfig: PathBuf,
    _certs: tempfile::TempDir,
}

impl AdmissionWebhook {
    pub async fn register(
        cp: &super::cluster::ControlPlane,
        client: &kube::Client,
        ns: &str,
        extra: &[&str],
    ) -> Self {
        use kube::api::{Patch, PatchParams};
        let certs = tempfile::tempdir().unwrap();
        generate_certs(certs.path(), false);
        let process = WebhookProcess::start(certs.path(), extra);
        let name = format!("e2e-{ns}");
        let label = json!({"metadata": {"labels": {"rayshift-e2e": name}}});
        kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .patch(ns, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .unwrap();
        let config = Command::new(rayshift_bin())
            .args(["certs", "webhook-config", "--name", &name, "--ca"])
            .arg(certs.path().join("ca.crt"))
            .args(["--url", &format!("https://127.0.0.1:{}", process.addr.port())])
            .args(["--namespace-selector", &format!("rayshift-e2e={name}")])
            .output()
            .unwrap();
        assert!(
            config.status.success(),
            "{}",
            String::from_utf8_lossy(&config.stderr)
        );
        let file = certs.path().join("webhooks.yaml");
        std::fs::write(&file, &config.stdout).unwrap();
        cp.kubectl(&["apply", "-f", &file.to_string_lossy()]);
        let hook = Self {
            process,
            name,
            kubeconfig: cp.kubeconfig.clone(),
            _certs: certs,
        };
        hook.wait_until_answering(client, ns).await;
        hook
    }

    /// The apiserver picks up new webhook configurations asynchronously: probe with a dry run that only
    /// rayshift denies (stepSizePercent over 100).
    async fn wait_until_answering(&self, client: &kube::Client, ns: &str) {
        use kube::api::PostParams;
        let api: kube::Api<rayshift_api::RayService> = kube::Api::namespaced(client.clone(), ns);
        let probe: rayshift_api::RayService =
            serde_json::from_value(denied_only_by_rayshift("probe")).unwrap();
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        for _ in 0..100 {
            if let Err(e) = api.create(&dry, &probe).await
                && e.to_string().contains("admission webhook")
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the webhook never started answering for namespace {ns}");
    }

    /// Requests the webhook denied so far.
    pub fn denied(&self) -> f64 {
        self.process
            .metrics()
            .lines()
            .filter(|l| l.starts_with("rayshift_admission_denials_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for AdmissionWebhook {
    fn drop(&mut self) {
        let _ = Command::new(super::cluster::kubectl())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args([
                "delete",
                "validatingwebhookconfiguration,mutatingwebhookconfiguration",
            ])
            .args([
                format!("{}-validating", self.name),
                format!("{}-mutating", self.name),
            ])
            .output();
    }
}
