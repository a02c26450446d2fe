//! A steady HTTP load: `rate` requests per second, open loop (a slow answer never delays the next
//! request), every response kept with its status, body and latency.
//!
//! Each request uses a new connection (`Connection: close` semantics), as many independent clients would: a
//! client-side keep-alive race with the gateway closing an idle connection is the client's business, not the
//! upgrade's, and would blur the count.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::signal::{self, Sig};

#[derive(Clone, Debug)]
pub enum Outcome {
    /// 2xx with this body.
    Ok(String),
    /// Any other status, with its body.
    Status(u16, String),
    /// No response (connect error, reset, or the client timeout).
    Error(String),
}

#[derive(Clone, Debug)]
pub struct Response {
    pub sent: Instant,
    pub latency: Duration,
    pub outcome: Outcome,
}

impl Response {
    pub fn body(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Ok(b) => Some(b.trim()),
            _ => None,
        }
    }
}

pub struct Load {
    responses: Arc<Mutex<Vec<Response>>>,
    in_flight: Arc<tokio::sync::Semaphore>,
    task: tokio::task::JoinHandle<()>,
    started: Instant,
}

/// Requests never in flight at once beyond this (a bound well above rate × timeout).
const MAX_IN_FLIGHT: u32 = 10_000;

impl Load {
    pub fn start(url: &str, rate: u32, timeout: Duration) -> Self {
        let responses = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT as usize));
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(timeout)
            .build()
            .unwrap();
        let (url, sink, permits) = (url.to_string(), responses.clone(), in_flight.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
            loop {
                tick.tick().await;
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let (http, url, sink) = (http.clone(), url.clone(), sink.clone());
                tokio::spawn(async move {
                    let sent = Instant::now();
                    let outcome = match http.get(&url).send().await {
                        Ok(r) => {
                            let status = r.status();
                            match r.text().await {
                                Ok(body) if status.is_success() => Outcome::Ok(body),
                                Ok(body) => Outcome::Status(status.as_u16(), body),
                                Err(e) => Outcome::Error(chain(&e)),
                            }
                        }
                        Err(e) => Outcome::Error(chain(&e)),
                    };
                    sink.lock().unwrap().push(Response {
                        sent,
                        latency: sent.elapsed(),
                        outcome,
                    });
                    drop(permit);
                });
            }
        });
        Load {
            responses,
            in_flight,
            task,
            started: Instant::now(),
        }
    }

    /// Stops sending, waits for every request in flight, and returns all responses in send order.
    pub async fn stop(self) -> (Duration, Vec<Response>) {
        self.task.abort();
        let ran = self.started.elapsed();
        let _all = self.in_flight.acquire_many(MAX_IN_FLIGHT).await;
        let mut out = self.responses.lock().unwrap().clone();
        out.sort_by_key(|r| r.sent);
        (ran, out)
    }

    /// Responses so far.
    pub fn responses(&self) -> Vec<Response> {
        self.responses.lock().unwrap().clone()
    }
}

/// An error with its causes ("error sending request" alone does not say timed out from refused).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// Open-loop gRPC load through the Gateway's gRPC listener: `tests/env/ray-app/grpc_load.py`, run by the Ray
/// venv's Python (grpcio comes with Ray). Its answers are read from a file when it stops.
pub struct GrpcLoad {
    child: std::process::Child,
    out: tempfile::NamedTempFile,
    started: Instant,
    timeout: Duration,
}

impl GrpcLoad {
    pub fn start(address: &str, rate: u32, timeout: Duration) -> Self {
        let repo = super::cluster::repo();
        let venv = std::process::Command::new("bash")
            .arg(repo.join("tests/env/ray.sh"))
            .arg("venv")
            .output()
            .expect("ray.sh venv");
        let python = format!("{}/bin/python", String::from_utf8_lossy(&venv.stdout).trim());
        let out = tempfile::NamedTempFile::new().unwrap();
        let child = std::process::Command::new(python)
            .arg(repo.join("tests/env/ray-app/grpc_load.py"))
            .args([address, &rate.to_string(), &timeout.as_secs_f64().to_string()])
            .stdout(out.reopen().unwrap())
            .spawn()
            .expect("start grpc_load.py");
        GrpcLoad {
            child,
            out,
            started: Instant::now(),
            timeout,
        }
    }

    /// Stops sending, waits for the calls in flight; every answer, as `Response`s.
    pub async fn stop(self) -> (Duration, Vec<Response>) {
        let ran = self.started.elapsed();
        signal::process(self.child.id(), Sig::TERM);
        let mut child = self.child;
        let pid = child.id();
        let waiting = tokio::task::spawn_blocking(move || child.wait());
        // grpc_load.py ends its last calls 5 s after their deadline; a process that still runs later is hung.
        let status = match tokio::time::timeout(self.timeout + Duration::from_secs(20), waiting).await {
            Ok(status) => status.unwrap(),
            Err(_) => {
                signal::process(pid, Sig::KILL);
                panic!("grpc_load.py did not stop within 20 s of its calls' deadline");
            }
        };
        assert!(
            status.as_ref().is_ok_and(|s| s.success()),
            "grpc_load.py: {status:?}"
        );
        let text = std::fs::read_to_string(self.out.path()).unwrap();
        (ran, text.lines().filter_map(grpc_response).collect())
    }
}

/// One line of `grpc_load.py`: its Unix send time becomes an `Instant` of this process.
fn grpc_response(line: &str) -> Option<Response> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let unix_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    let ago = Duration::from_secs_f64((unix_now - v["sent"].as_f64()?).max(0.0));
    let outcome = match v["version"].as_str() {
        Some(version) => Outcome::Ok(version.to_string()),
        None => Outcome::Error(v["error"].as_str().unwrap_or("no answer").to_string()),
    };
    Some(Response {
        sent: Instant::now() - ago,
        latency: Duration::from_secs_f64(v["latency"].as_f64()?),
        outcome,
    })
}

/// The machine's CPU pressure (Linux PSI, `/proc/pressure/cpu`, "some"): the share of wall time in which a
/// runnable task waited for a CPU, since `start`.
pub struct CpuPressure {
    since: Instant,
    waited_us: Option<u64>,
}

impl CpuPressure {
    pub fn start() -> Self {
        CpuPressure {
            since: Instant::now(),
            waited_us: cpu_waited_us(),
        }
    }

    /// Percent of the wall time since `start`; `None` where the kernel has no PSI.
    pub fn percent(&self) -> Option<f64> {
        let waited = cpu_waited_us()?.checked_sub(self.waited_us?)?;
        Some(100.0 * waited as f64 / self.since.elapsed().as_micros().max(1) as f64)
    }
}

fn cpu_waited_us() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    let some = text.lines().find(|l| l.starts_with("some "))?;
    some.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}
