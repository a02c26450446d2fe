//! A real kube-apiserver + etcd (+ kube-controller-manager) for the tests of one test binary, started by
//! the project's own `tests/env/control-plane.sh`, with the upstream KubeRay and Gateway API CRDs installed
//! unmodified (KubeRay's with rayshift's reconcile component, as a user running rayshift's controller would).
//!
//! One control plane per test binary (started on first use); every test gets a fresh namespace. The
//! control plane stops when the test binary exits (the script's watchdog watches our PID).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::Namespace, apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, Config,
    api::{ObjectMeta, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn script() -> PathBuf {
    repo().join("tests/env/control-plane.sh")
}

/// A running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub server: String,
    /// Niceness of its processes (and KubeRay's, kwok's and kube-scheduler's).
    nice: u8,
}

static SHARED: OnceLock<ControlPlane> = OnceLock::new();
static BESIDE_RAY: OnceLock<ControlPlane> = OnceLock::new();
static WITHOUT_GATEWAY: OnceLock<ControlPlane> = OnceLock::new();
static WITH_KUBERAY: OnceLock<ControlPlane> = OnceLock::new();

/// Upstream CRDs, exactly as released (tests/env/upstream.sh reads them from their Go modules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crds {
    /// KubeRay's RayService, RayCluster and RayJob CRDs, CEL rules included.
    KubeRay,
    /// KubeRay's CRDs with rayshift's reconcile component (manifests/components/reconcile) applied.
    KubeRayForRayshift,
    /// The Gateway API standard channel.
    GatewayApi,
}

/// A control plane of this test binary with KubeRay's CRDs (reconcile component applied) but no Gateway API,
/// and the real KubeRay operator running the RayClusters.
pub fn control_plane_without_gateway_api() -> &'static ControlPlane {
    WITHOUT_GATEWAY.get_or_init(|| {
        ControlPlane::start()
            .with_crds(&[Crds::KubeRayForRayshift])
            .with_kuberay()
    })
}

/// The control plane of this test binary, started (and given the CRDs) on first use.
pub fn control_plane() -> &'static ControlPlane {
    SHARED.get_or_init(|| ControlPlane::start().with_crds(&[Crds::KubeRayForRayshift, Crds::GatewayApi]))
}

/// Like `control_plane()`, with the real KubeRay operator running every RayCluster (its head and worker Pods,
/// Services and status), kube-scheduler binding those Pods to a kwok fake node and kwok running them.
pub fn control_plane_with_kuberay() -> &'static ControlPlane {
    WITH_KUBERAY.get_or_init(|| {
        ControlPlane::start()
            .with_crds(&[Crds::KubeRayForRayshift, Crds::GatewayApi])
            .with_kuberay()
    })
}

/// Like `control_plane_with_kuberay()`, for tests whose real Ray heads share these cores: the control plane,
/// KubeRay, kube-scheduler and kwok run at nice 19 so that they cannot starve the Serve replicas (on a real
/// cluster they have nodes of their own).
pub fn control_plane_beside_ray() -> &'static ControlPlane {
    BESIDE_RAY.get_or_init(|| {
        ControlPlane::start_with_nice(19)
            .with_crds(&[Crds::KubeRayForRayshift, Crds::GatewayApi])
            .with_kuberay()
    })
}

/// Paths of an upstream CRD set.
pub fn upstream_crds(set: &str) -> Vec<PathBuf> {
    let out = succeeded(
        Command::new("bash")
            .arg(repo().join("tests/env/upstream.sh"))
            .args(["crds", set]),
        &format!("upstream CRDs {set}"),
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect()
}

/// KubeRay's CRDs through a kustomization that adds rayshift's reconcile component, as a user would.
fn kuberay_crds_with_component() -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut resources = Vec::new();
    for f in upstream_crds("kuberay") {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        std::fs::copy(&f, dir.path().join(&name)).unwrap();
        resources.push(name);
    }
    // kustomize takes only relative paths: from the temporary directory up to / and down to the repository.
    let up = "../".repeat(dir.path().components().count() - 1);
    let component = format!(
        "{up}{}",
        repo()
            .join("manifests/components/reconcile")
            .to_string_lossy()
            .trim_start_matches('/')
    );
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [{}]\ncomponents: [{}]\n",
            resources.join(", "),
            component
        ),
    )
    .unwrap();
    let out = Command::new(kubectl())
        .args(["kustomize", &dir.path().to_string_lossy()])
        .output()
        .expect("run kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize with the reconcile component: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl ControlPlane {
    /// Installs upstream CRD sets (server-side: KubeRay's are too large for a last-applied annotation) and
    /// waits until they are established.
    pub fn with_crds(self, sets: &[Crds]) -> Self {
        for set in sets {
            match set {
                Crds::KubeRayForRayshift => {
                    self.kubectl_stdin(
                        &["apply", "--server-side", "-f", "-"],
                        &kuberay_crds_with_component(),
                    );
                }
                Crds::KubeRay | Crds::GatewayApi => {
                    let name = if *set == Crds::KubeRay {
                        "kuberay"
                    } else {
                        "gateway-api"
                    };
                    for f in upstream_crds(name) {
                        self.kubectl(&["apply", "--server-side", "-f", &f.to_string_lossy()]);
                    }
                }
            }
        }
        // kubectl wait fails on a CRD that has no status yet ("accessor error"): retry that moment.
        let wait = [
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "--all",
        ];
        for _ in 0..20 {
            if self.kubectl_output(&wait).status.success() {
                return self;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        self.kubectl(&wait);
        self
    }

    /// Starts the real KubeRay operator, kube-scheduler and kwok against it (tests/env/kuberay.sh); they stop
    /// with the control plane, or when this process exits.
    pub fn with_kuberay(self) -> Self {
        succeeded(
            Command::new("bash")
                .arg(repo().join("tests/env/kuberay.sh"))
                .arg("start")
                .arg(self.kuberay_dir())
                .arg(&self.kubeconfig)
                .env("RAYSHIFT_OWNER_PID", std::process::id().to_string())
                .env("RAYSHIFT_CP_NICE", self.nice.to_string()),
            "KubeRay and kwok did not start",
        );
        self
    }

    fn kuberay_dir(&self) -> PathBuf {
        self.dir.join("kuberay")
    }

    /// The last lines of the KubeRay operator's log (empty without it).
    pub fn kuberay_log(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.kuberay_dir().join("kuberay.log")).unwrap_or_default();
        super::wait::tail(&log, lines)
    }

    /// Runs kubectl with `input` on stdin; panics on failure.
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> String {
        use std::io::Write as _;
        let mut child = Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run kubectl");
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts a new control plane in a fresh directory; it stops when this process exits.
    pub fn start() -> Self {
        Self::start_with_nice(0)
    }

    /// `start()`, with the control plane's processes at this niceness.
    pub fn start_with_nice(nice: u8) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("rayshift-cp-")
            .tempdir()
            .unwrap()
            .keep();
        let started = Instant::now();
        succeeded(
            Command::new("bash")
                .arg(script())
                .arg("start")
                .arg(&dir)
                .env("RAYSHIFT_OWNER_PID", std::process::id().to_string())
                .env("RAYSHIFT_CP_NICE", nice.to_string()),
            "control plane did not start",
        );
        let server = std::fs::read_to_string(dir.join("server"))
            .unwrap()
            .trim()
            .to_string();
        eprintln!(
            "control plane {server} up in {:?} ({})",
            started.elapsed(),
            dir.display()
        );
        Self {
            kubeconfig: dir.join("kubeconfig"),
            dir,
            server,
            nice,
        }
    }

    /// SIGKILLs kube-apiserver and starts it again over the same etcd (with `compact`, etcd is compacted while it
    /// is down, so resumed watches get 410 Gone); returns once it is ready again.
    pub fn restart_apiserver(&self, compact: bool) {
        let mut cmd = Command::new("bash");
        cmd.arg(script()).arg("restart-apiserver").arg(&self.dir);
        if compact {
            cmd.arg("compact");
        }
        succeeded(
            cmd.env("RAYSHIFT_CP_NICE", self.nice.to_string()),
            "kube-apiserver did not restart",
        );
    }

    /// Stops it now and waits until its processes are gone.
    pub fn stop(&self) {
        let pids = self.pids();
        let kuberay = Command::new("bash")
            .arg(repo().join("tests/env/kuberay.sh"))
            .arg("stop")
            .arg(self.kuberay_dir())
            .status()
            .unwrap();
        assert!(kuberay.success());
        let status = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status()
            .unwrap();
        assert!(status.success());
        for pid in pids {
            assert!(!alive(pid), "process {pid} still running after stop");
        }
    }

    /// Its processes, KubeRay's and kwok's included.
    pub fn pids(&self) -> Vec<u32> {
        [self.dir.join("pids"), self.kuberay_dir().join("pids")]
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .unwrap_or_default()
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Runs kubectl against this control plane and returns stdout; panics on failure.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_output(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A namespace's Events as `kubectl get events` lists them (events.k8s.io/v1, one object each).
    pub fn events(&self, ns: &str) -> Vec<serde_json::Value> {
        let out = self.kubectl(&["get", "events.events.k8s.io", "-n", ns, "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["items"].as_array().cloned().unwrap_or_default()
    }

    pub fn kubectl_output(&self, args: &[&str]) -> std::process::Output {
        Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .expect("run kubectl")
    }

    async fn config(&self) -> Config {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).unwrap();
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap()
    }

    /// A kube-rs client for this control plane.
    pub async fn client(&self) -> Client {
        Client::try_from(self.config().await).unwrap()
    }

    /// A client that hands the apiserver's 429s to its caller: kube's default client retries them, with backoff,
    /// for minutes (an eviction a disruption budget refuses answers 429).
    pub async fn client_without_retries(&self) -> Client {
        let mut config = self.config().await;
        config.default_retry = false;
        Client::try_from(config).unwrap()
    }

    /// A fresh namespace for one test.
    pub async fn namespace(&self, client: &Client, prefix: &str) -> String {
        let api: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(format!("{prefix}-")),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let created = api.create(&PostParams::default(), &ns).await.unwrap();
        created.metadata.name.unwrap()
    }

    /// True once every CRD rayshift needs is established.
    pub async fn crds_established(&self, client: &Client) -> bool {
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let names: Vec<String> = api
                .list(&Default::default())
                .await
                .map(|l| l.items.into_iter().filter_map(|c| c.metadata.name).collect())
                .unwrap_or_default();
            if [
                "rayservices.ray.io",
                "rayclusters.ray.io",
                "httproutes.gateway.networking.k8s.io",
            ]
            .iter()
            .all(|n| names.iter().any(|m| m == n))
            {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// kubectl of the control plane's own release, built by the control-plane script.
pub fn kubectl() -> PathBuf {
    static KUBECTL: OnceLock<PathBuf> = OnceLock::new();
    KUBECTL
        .get_or_init(|| {
            let out = Command::new("bash").arg(script()).arg("bin").output().unwrap();
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("kubectl")
        })
        .clone()
}

pub fn alive(pid: u32) -> bool {
    // Zombies count as gone: /proc/<pid>/stat state 'Z'.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Runs one of the environment scripts; panics with its output unless it succeeded.
fn succeeded(cmd: &mut Command, what: &str) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
