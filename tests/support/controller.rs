//! Runs the real `rayshift controller` process against a test control plane, one namespace per test.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
};

use super::{cluster::ControlPlane, webhook::free_port};

pub struct ControllerProcess {
    pub child: Child,
    pub metrics_port: u16,
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl ControllerProcess {
    pub fn start(cp: &ControlPlane, ns: &str, dashboard_template: &str, extra: &[&str]) -> Self {
        Self::start_as(&cp.kubeconfig, ns, dashboard_template, extra)
    }

    /// Runs the controller with the given identity (e.g. rayshift's least-privilege ServiceAccount).
    pub fn start_as(
        kubeconfig: &std::path::Path,
        ns: &str,
        dashboard_template: &str,
        extra: &[&str],
    ) -> Self {
        let metrics_port = free_port();
        // The fake dashboard also plays the heads' Serve proxies (their Pod IPs are made up).
        let health = format!("{dashboard_template}/-/healthz");
        let health_args: &[&str] = if extra
            .iter()
            .any(|a| a.starts_with("--serve-health-url-template") || *a == "--use-kubernetes-proxy")
        {
            &[]
        } else {
            &["--serve-health-url-template", &health]
        };
        // Debug for rayshift itself: a failed wait shows which passes ran (RAYSHIFT_TEST_CONTROLLER_LOG
        // replaces the filter, e.g. with kube_runtime=debug).
        let log_level = std::env::var("RAYSHIFT_TEST_CONTROLLER_LOG")
            .unwrap_or_else(|_| "info,rayshift_controller=debug,kube=warn,kube_client=error".into());
        let unless_given = |flag: &str, value: &str| {
            let given = extra.iter().any(|a| a.starts_with(flag));
            if given {
                vec![]
            } else {
                vec![flag.to_string(), value.to_string()]
            }
        };
        // An empty namespace: every namespace.
        let namespace: &[&str] = if ns.is_empty() { &[] } else { &["--namespace", ns] };
        let child = Command::new(env!("CARGO_BIN_EXE_rayshift"))
            .arg("controller")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(namespace)
            .args(unless_given("--dashboard-url-template", dashboard_template))
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
            .args(["--log-format", "plain"])
            .args(unless_given("--serve-poll-interval-seconds", "0.3"))
            .args(unless_given("--log-level", &log_level))
            .args(health_args)
            .args(if extra.iter().any(|a| a.starts_with("--mode")) {
                &[][..]
            } else {
                &["--mode=reconcile"][..]
            })
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rayshift controller");
        Self::capturing(child, metrics_port)
    }

    /// A started controller whose stderr is piped: its lines are kept (and copied to
    /// RAYSHIFT_TEST_CONTROLLER_LOG_FILE when set, for a benchmark to read after the run).
    pub fn capturing(mut child: Child, metrics_port: u16) -> Self {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let stderr = child.stderr.take().unwrap();
        let mut copy = std::env::var("RAYSHIFT_TEST_CONTROLLER_LOG_FILE")
            .ok()
            .map(|path| std::fs::File::create(path).expect("create the controller log file"));
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(file) = copy.as_mut() {
                    let _ = writeln!(file, "{line}");
                }
                sink.lock().unwrap().push(line);
            }
        });
        Self {
            child,
            metrics_port,
            logs,
        }
    }

    pub fn metrics(&self) -> String {
        super::webhook::plain_http::text(&format!("http://127.0.0.1:{}/metrics", self.metrics_port))
    }

    /// HTTP status of `/readyz` (0 when it does not answer).
    pub fn readyz(&self) -> u16 {
        super::webhook::plain_http::status(&format!("http://127.0.0.1:{}/readyz", self.metrics_port))
            .unwrap_or(0)
    }

    /// Sum of a counter over all its label sets.
    pub fn counter_sum(&self, name: &str) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The process's established TCP connections to `port` (its sockets, matched in the kernel's tables).
    pub fn connections_to(&self, port: u16) -> usize {
        let pid = self.child.id();
        let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|dir| {
                dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                    .filter_map(|l| {
                        let l = l.to_string_lossy().into_owned();
                        Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                    })
                    .collect()
            })
            .unwrap_or_default();
        let remote_port = format!(":{port:04X}");
        ["tcp", "tcp6"]
            .iter()
            .filter_map(|t| std::fs::read_to_string(format!("/proc/{pid}/net/{t}")).ok())
            .flat_map(|table| table.lines().skip(1).map(str::to_string).collect::<Vec<_>>())
            .filter(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                // Fields: sl, local, remote, state (01 established), ..., inode (the 10th).
                f.len() > 9 && f[2].ends_with(&remote_port) && f[3] == "01" && inodes.contains(f[9])
            })
            .count()
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
