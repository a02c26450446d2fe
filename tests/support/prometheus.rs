//! A real Prometheus (Debian's package, unpacked by tests/env/prometheus.sh) scraping rayshift's processes on
//! loopback every second, with rayshift's alert rules loaded, queried over its HTTP API. It also scrapes the
//! real Ray heads' metrics export ports (`ray` job, from a file the test keeps current), each labelled
//! `ray_io_cluster` as KubeRay's PodMonitor labels a head Pod's series.

use std::{
    path::PathBuf,
    process::{Child, Command},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::cluster::repo;

pub struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

/// The Grafana dashboard's queries, its variables filled in for one RayService.
pub fn dashboard_queries() -> Vec<String> {
    let path = repo().join("manifests/grafana/rayshift-dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queries = Vec::new();
    collect_queries(&dashboard, &mut queries);
    queries
}

fn collect_queries(v: &Value, out: &mut Vec<String>) {
    match v {
        // A datasource variable's "query" names a datasource type, not a query.
        Value::Object(m) if m.get("type").is_some_and(|t| t == "datasource") => {}
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "query" | "definition", Value::String(s)) => out.push(s.clone()),
                    _ => collect_queries(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect_queries(v, out)),
        _ => {}
    }
}

/// The metric names an expression reads (`rayshift_*` and `up`).
pub fn metric_names(expr: &str) -> Vec<String> {
    let mut names: Vec<String> = expr
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|t| t.starts_with("rayshift_") || *t == "up")
        .map(str::to_string)
        .collect();
    names.dedup();
    names
}

/// Makes Prometheus scrape these Ray heads' metrics export ports (RayCluster, head IP), and no others.
pub fn write_ray_heads(file: &std::path::Path, heads: &[(String, String)]) {
    let groups: Vec<Value> = heads
        .iter()
        .map(|(cluster, ip)| {
            serde_json::json!({"targets": [format!("{ip}:8080")], "labels": {"ray_io_cluster": cluster}})
        })
        .collect();
    let text = serde_json::to_string(&groups).unwrap();
    if std::fs::read_to_string(file).is_ok_and(|old| old == text) {
        return;
    }
    // Written whole, then renamed: Prometheus never reads half a file.
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, file).unwrap();
}

impl Prometheus {
    /// Scrapes `targets` (job name, host:port) every second and evaluates rayshift's rules every second.
    pub fn start(targets: &[(&str, String)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let rules = repo().join("manifests/monitoring/rayshift-alerts.rules.yaml");
        let jobs: Vec<String> = targets
            .iter()
            .map(|(job, addr)| {
                format!("  - job_name: {job}\n    static_configs:\n      - targets: [\"{addr}\"]\n")
            })
            .collect();
        let heads = dir.path().join("ray-heads.json");
        std::fs::write(&heads, "[]").unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [\"{}\"]\nscrape_configs:\n{}  - job_name: ray\n    file_sd_configs:\n      - files: [\"{}\"]\n        refresh_interval: 1s\n",
            rules.display(),
            jobs.concat(),
            heads.display()
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let port = super::webhook::free_port();
        let child = Command::new(bin().join("prometheus"))
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .expect("start prometheus");
        let prometheus = Prometheus {
            child,
            port,
            _dir: dir,
        };
        prometheus.wait_ready();
        prometheus
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = format!("http://127.0.0.1:{}/-/ready", self.port);
        while super::webhook::plain_http::status(&url).ok() != Some(200) {
            assert!(Instant::now() < deadline, "Prometheus not ready: {}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server's root URL (for `--prometheus-url`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The file naming the Ray heads it scrapes ([`write_ray_heads`]).
    pub fn ray_heads_file(&self) -> PathBuf {
        self._dir.path().join("ray-heads.json")
    }

    /// The value of an instant query now: `None` when it returns no series.
    pub async fn value(&self, expr: &str) -> Option<f64> {
        let data = self.api("query", &[("query", expr.to_string())]).await;
        let first = data["result"].as_array()?.first()?.clone();
        first["value"][1].as_str()?.parse().ok()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    async fn api(&self, path: &str, form: &[(&str, String)]) -> Value {
        let url = format!("http://127.0.0.1:{}/api/v1/{path}", self.port);
        let answer = reqwest::Client::new().get(&url).query(form).send().await;
        let text = answer.unwrap().text().await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: {e}: {text}"));
        assert_eq!(v["status"], "success", "{url} {form:?}: {v}");
        v["data"].clone()
    }

    /// The series `expr` returns at one-second steps over the last `seconds`.
    pub async fn query_range(&self, expr: &str, seconds: u64) -> Vec<Value> {
        let end = jiff::Timestamp::now().as_second();
        let start = end - i64::try_from(seconds).unwrap();
        let form = [
            ("query", expr.to_string()),
            ("start", start.to_string()),
            ("end", end.to_string()),
            ("step", "1".to_string()),
        ];
        let data = self.api("query_range", &form).await;
        data["result"].as_array().cloned().unwrap_or_default()
    }

    /// The loaded rules, each with its health and last error.
    pub async fn rules(&self) -> Vec<Value> {
        let data = self.api("rules", &[]).await;
        let groups = data["groups"].as_array().cloned().unwrap_or_default();
        groups
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bin() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo().join("tests/env/prometheus.sh"))
        .arg("bin")
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}
