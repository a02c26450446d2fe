//! The shipped manifests on a real apiserver: a server-side dry run of the kustomization, and the
//! controller running under exactly the ClusterRole it ships (the apiserver authorizes with RBAC): a full
//! incremental upgrade and a cluster deletion without a single 403; the same from the container image's static
//! binary, run as the Deployment runs it; and the Helm chart.

mod support;

use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use rayshift_api::RayService;
use serde_json::json;
use support::{
    autoscaler::GPU_TAINT,
    cluster::{control_plane_with_kuberay, repo},
    controller::ControllerProcess,
    dashboard::FakeDashboard,
    image::{self, ImageRoot},
    traefik::{self, TraefikGateway},
    wait::eventually,
    webhook::free_port,
};

/// rayshift-system and rayshift's RBAC (manifests/deploy), applied once for every test (two concurrent applies
/// would race to create them).
fn system_namespace(cp: &support::cluster::ControlPlane) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for file in ["namespace.yaml", "rbac.yaml"] {
            let path = repo().join("manifests/deploy").join(file);
            cp.kubectl(&["apply", "-f", &path.to_string_lossy()]);
        }
    });
}

/// `kubectl apply --dry-run=server` printed each of `objects` as applied in a server dry run.
fn dry_run_applied(out: &str, objects: &[&str]) {
    for object in objects {
        assert!(
            out.contains(object) && out.contains("(server dry run)"),
            "{object} missing:\n{out}"
        );
    }
}

#[test]
fn kustomization_passes_a_server_side_dry_run() {
    let cp = control_plane_with_kuberay();
    let overlay = repo().join("manifests/overlays/no-cert-manager");
    // Namespaced objects need their namespace to exist, even in a dry run.
    system_namespace(cp);
    let out = cp.kubectl_output(&["apply", "-k", &overlay.to_string_lossy(), "--dry-run=server"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    dry_run_applied(
        &stdout,
        &[
            "deployment.apps/rayshift",
            "poddisruptionbudget.policy/rayshift",
            "clusterrole.rbac.authorization.k8s.io/rayshift",
            "validatingwebhookconfiguration.admissionregistration.k8s.io/rayshift-validating",
            "configmap/rayshift-grafana-dashboard",
            "service/rayshift-webhook",
        ],
    );
    // The production kustomization renders (cert-manager and Prometheus Operator kinds included).
    let full = std::process::Command::new(support::cluster::kubectl())
        .args(["kustomize"])
        .arg(repo().join("manifests"))
        .output()
        .unwrap();
    assert!(full.status.success(), "{}", String::from_utf8_lossy(&full.stderr));
    let text = String::from_utf8_lossy(&full.stdout);
    for kind in [
        "kind: ServiceMonitor",
        "kind: Certificate",
        "cert-manager.io/inject-ca-from",
    ] {
        assert!(text.contains(kind), "{kind}");
    }
    // No wildcards in the ClusterRole.
    let rbac = std::fs::read_to_string(repo().join("manifests/deploy/rbac.yaml")).unwrap();
    assert!(!rbac.contains("\"*\""), "wildcard in RBAC");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_needs_nothing_beyond_its_cluster_role() {
    let cp = control_plane_with_kuberay();
    system_namespace(cp);
    let restricted = cp.dir.join("kubeconfig-rayshift");
    // RBAC is enforced: rayshift's identity cannot read Secrets.
    let denied = std::process::Command::new(support::cluster::kubectl())
        .arg("--kubeconfig")
        .arg(&restricted)
        .args(["get", "secrets", "-A"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&denied.stderr).contains("forbidden"));

    let client = cp.client().await;
    assert!(cp.crds_established(&client).await);
    let ns = cp.namespace(&client, "rbac").await;
    let dashboard = FakeDashboard::start().await;
    let _gateway = TraefikGateway::start(cp, client.clone(), &ns).await;
    let controller = ControllerProcess::start_as(
        &restricted,
        &ns,
        &dashboard.url_template(),
        &["--feature-gates=RayServiceIncrementalUpgrade=true"],
    );
    upgrade_without_a_403(&client, &ns, &controller).await;
}

/// The image as manifests/deploy runs it: the static binary alone in a root with distroless/static's files, as
/// user 65532 on a read-only root, with the Deployment's own arguments and environment, the in-cluster
/// configuration from the ServiceAccount's mount and the webhook's certificate from its Secret's. The webhook
/// answers over TLS and the controller runs an upgrade under the shipped RBAC, reaching the dashboard by a name
/// from /etc/hosts (the static libc's own lookup).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_as_the_deployment_ships_it() {
    let binary = std::fs::read(image::static_binary()).unwrap();
    assert!(
        !image::has_interpreter(&binary),
        "the image's binary is linked dynamically"
    );
    // The check tells them apart: the usual build names its loader.
    let usual = std::fs::read(support::webhook::rayshift_bin()).unwrap();
    assert!(image::has_interpreter(&usual));
    let cp = control_plane_with_kuberay();
    system_namespace(cp);
    let client = cp.client().await;
    assert!(cp.crds_established(&client).await);
    let ns = cp.namespace(&client, "image").await;
    let dashboard = FakeDashboard::start().await;
    let _gateway = TraefikGateway::start(cp, client.clone(), &ns).await;
    let root = ImageRoot::new("127.0.0.1\tdashboards.rayshift.test\n");
    mount_pod_volumes(cp, &root);
    let (webhook_port, metrics_port) = (free_port(), free_port());
    let template = dashboard
        .url_template()
        .replace("127.0.0.1", "dashboards.rayshift.test");
    let mut args = deployment_args(webhook_port, metrics_port);
    args.extend([
        format!("--namespace={ns}"),
        format!("--dashboard-url-template={template}"),
        format!("--serve-health-url-template={template}/-/healthz"),
        "--serve-poll-interval-seconds=0.3".into(),
    ]);
    let api_port = cp.server.rsplit(':').next().unwrap().to_string();
    let env = [
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_string()),
        ("KUBERNETES_SERVICE_PORT", api_port),
        ("POD_NAME", POD_NAME.to_string()),
        ("POD_NAMESPACE", "rayshift-system".to_string()),
    ];
    let controller = ControllerProcess::capturing(root.spawn(&args, &env), metrics_port);
    let ready = eventually(
        "the image's /readyz",
        60,
        Duration::from_millis(200),
        || async { (controller.readyz() == 200).then_some(()) },
        || async { controller.logs() },
    );
    ready.await;
    let process = running_as(&format!("--metrics-addr=127.0.0.1:{metrics_port}"));
    assert_eq!(process.uid, image::NONROOT, "runAsUser");
    assert!(process.root_read_only, "readOnlyRootFilesystem");
    webhook_denies_over_tls(&root, webhook_port).await;
    upgrade_without_a_403(&client, &ns, &controller).await;
    stops_on_sigterm_as_pid_1(&client, controller, process.pid).await;
}

/// The image's Pod name (its downward-API `POD_NAME`), which its leader Lease names as holder.
const POD_NAME: &str = "rayshift-image";

/// In the image rayshift is the container's PID 1, which the kernel shields from every signal it has no handler
/// for: the kubelet's SIGTERM must stop it within the Pod's grace period (30 s), its Lease released for the
/// next leader. Not killed by the test's drop: its exit status is the launcher's.
async fn stops_on_sigterm_as_pid_1(client: &kube::Client, mut controller: ControllerProcess, pid: u32) {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "rayshift-system");
    let holder = |lease: Lease| lease.spec.and_then(|s| s.holder_identity);
    let lease = leases.get("rayshift-controller").await.unwrap();
    assert_eq!(holder(lease).as_deref(), Some(POD_NAME));
    let in_pid_1 = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        in_pid_1
            .lines()
            .any(|l| l.starts_with("NSpid:") && l.ends_with("\t1")),
        "rayshift is not its namespace's PID 1:\n{in_pid_1}"
    );
    assert!(support::signal::process(pid, support::signal::Sig::TERM));
    let ControllerProcess { child, logs, .. } = &mut controller;
    let child = std::cell::RefCell::new(child);
    let exited = || async { child.borrow_mut().try_wait().unwrap() };
    let every = Duration::from_millis(100);
    let diagnose = || async { logs.lock().unwrap().join("\n") };
    let status = eventually("its exit within 30 s of SIGTERM", 30, every, exited, diagnose).await;
    assert!(status.success(), "{status}\n{}", controller.logs());
    let lease = leases.get("rayshift-controller").await.unwrap();
    assert_eq!(holder(lease), None, "the Lease was not released");
}

/// What the kubelet mounts for the Deployment's Pod: the ServiceAccount (its token, the apiserver's CA, the
/// namespace) and the webhook's TLS Secret.
fn mount_pod_volumes(cp: &support::cluster::ControlPlane, root: &ImageRoot) {
    let kubeconfig = std::fs::read_to_string(cp.dir.join("kubeconfig-rayshift")).unwrap();
    let token = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .expect("rayshift's token");
    let account = image::SERVICE_ACCOUNT;
    root.put(&format!("{account}/token"), token.as_bytes());
    let ca = std::fs::read(cp.dir.join("certs/apiserver.crt")).unwrap();
    root.put(&format!("{account}/ca.crt"), &ca);
    root.put(&format!("{account}/namespace"), b"rayshift-system");
    let certs = tempfile::tempdir().unwrap();
    support::webhook::generate_certs(certs.path(), false);
    for file in ["tls.crt", "tls.key", "ca.crt"] {
        let content = std::fs::read(certs.path().join(file)).unwrap();
        root.put(&format!("etc/rayshift/tls/{file}"), &content);
    }
}

/// The Deployment's container arguments, on loopback ports of this test and reconciling (the shipped default
/// only observes).
fn deployment_args(webhook_port: u16, metrics_port: u16) -> Vec<String> {
    let yaml = std::fs::read_to_string(repo().join("manifests/deploy/deployment.yaml")).unwrap();
    let deployment = &objects(&yaml)[&("Deployment".to_string(), "rayshift".to_string())];
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    let user = &deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"];
    assert_eq!(user.as_u64(), Some(u64::from(image::NONROOT)));
    let replaced = |arg: &str| match arg.split_once('=') {
        Some(("--webhook-addr", _)) => format!("--webhook-addr=127.0.0.1:{webhook_port}"),
        Some(("--metrics-addr", _)) => format!("--metrics-addr=127.0.0.1:{metrics_port}"),
        Some(("--mode", _)) => "--mode=reconcile".to_string(),
        _ => arg.to_string(),
    };
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| replaced(a.as_str().unwrap()))
        .collect();
    assert!(args.iter().any(|a| a == "--leader-elect"), "{args:?}");
    args
}

struct RunningAs {
    pid: u32,
    uid: u32,
    root_read_only: bool,
}

/// The image's process (found by one of its arguments): its user and whether its root is mounted read-only.
fn running_as(argument: &str) -> RunningAs {
    let pid = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args[0] == b"/rayshift" && args.contains(&argument.as_bytes())
        })
        .expect("the image's rayshift process");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next()?.parse().ok())
        .unwrap();
    // mountinfo fields: id, parent, major:minor, root, mount point (seen from the process's root), options.
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root_read_only = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 5 && f[4] == "/" && f[5].split(',').any(|o| o == "ro")
    });
    RunningAs {
        pid,
        uid,
        root_read_only,
    }
}

/// A RayService with stepSizePercent 150, reviewed by the image's webhook over TLS: denied, the field named.
async fn webhook_denies_over_tls(root: &ImageRoot, port: u16) {
    let ca = std::fs::read(root.path().join("etc/rayshift/tls/ca.crt")).unwrap();
    let client = support::webhook::client_trusting(&ca);
    let bad = support::webhook::denied_only_by_rayshift("bad");
    let review = support::webhook::admission_review("CREATE", Some(&bad), None);
    let url = format!("https://127.0.0.1:{port}/validate-ray-io-v1-rayservice");
    let answer: serde_json::Value = client
        .post(url)
        .json(&review)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(answer.to_string().contains("stepSizePercent"), "{answer}");
}

/// An incremental upgrade of a new RayService in `ns` to its end and the old cluster's deletion, run by `controller`,
/// and not one request of it forbidden.
async fn upgrade_without_a_403(client: &kube::Client, ns: &str, controller: &ControllerProcess) {
    let api: Api<RayService> = Api::namespaced(client.clone(), ns);
    let rs: RayService = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "llm"},
        "spec": {
            "managedBy": "rayshift.io/controller", "rayClusterDeletionDelaySeconds": 1,
            "upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": {
                "gatewayClassName": traefik::CLASS, "maxSurgePercent": 50, "stepSizePercent": 50, "intervalSeconds": 1}},
            "serveConfigV2": "applications:\n  - name: app\n    import_path: m:app\n",
            "rayClusterConfig": {"enableInTreeAutoscaling": true,
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "ray:1", "ports": [{"name": "serve", "containerPort": 8000}]}]}}},
                "workerGroupSpecs": [{"groupName": "g", "replicas": 1, "minReplicas": 0, "maxReplicas": 2,
                    "template": {"spec": {"containers": [{"name": "w", "image": "ray:1"}]}}}]}
        }
    }))
    .unwrap();
    api.create(&PostParams::default(), &rs).await.unwrap();
    let wait = |what: &'static str, check: fn(&RayService) -> bool| {
        let api = api.clone();
        let logs = || controller.logs();
        async move {
            let deadline = Instant::now() + Duration::from_secs(90);
            loop {
                if check(&api.get("llm").await.unwrap()) {
                    return;
                }
                assert!(Instant::now() < deadline, "timed out: {what}\n{}", logs());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let active = |rs: &RayService| {
        rs.status
            .as_ref()
            .and_then(|s| s.active_service_status.as_ref())
            .and_then(|a| a.ray_cluster_name.clone())
    };
    let pending = |rs: &RayService| {
        rs.status
            .as_ref()
            .and_then(|s| s.pending_service_status.as_ref())
            .and_then(|a| a.ray_cluster_name.clone())
    };
    wait("first cluster active", |rs| {
        rs.status
            .as_ref()
            .and_then(|s| s.active_service_status.as_ref())
            .and_then(|a| a.traffic_routed_percent)
            == Some(100)
    })
    .await;
    let first = active(&api.get("llm").await.unwrap()).unwrap();
    let patch = json!({"spec": {"rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [
        {"name": "ray-head", "image": "ray:2", "ports": [{"name": "serve", "containerPort": 8000}]}]}}}}}});
    api.patch("llm", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait("an upgrade", |rs| {
        rs.status
            .as_ref()
            .and_then(|s| s.pending_service_status.as_ref())
            .is_some()
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let rs = api.get("llm").await.unwrap();
        if active(&rs).is_some_and(|a| a != first) && pending(&rs).is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "upgrade under RBAC did not finish\n{}",
            controller.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The old cluster is deleted (the delete verb), then nothing was ever forbidden.
    let clusters: Api<rayshift_api::RayCluster> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    while clusters.get_opt(&first).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "old cluster not deleted\n{}",
            controller.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs = controller.logs();
    assert!(
        // kube's error reads `reason: "Forbidden", code: 403`; a bare "403" also matches timestamps.
        !logs.contains("code: 403") && !logs.to_lowercase().contains("forbidden"),
        "RBAC denied something:\n{logs}"
    );
}

/// The alert rules ship twice, as a plain rules file and as a PrometheusRule: the same groups.
#[test]
fn the_prometheus_rule_carries_the_rules_file() {
    let read = |path: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(repo().join(path)).unwrap();
        yaml_serde::from_str(&text).unwrap()
    };
    let plain = read("manifests/monitoring/rayshift-alerts.rules.yaml");
    let operator = read("manifests/monitoring/prometheusrule.yaml");
    assert_eq!(operator["spec"], plain);
    assert!(plain["groups"][0]["rules"].as_array().unwrap().len() >= 4);
}

/// The Helm chart (built from Helm's Go module by tests/env/helm.sh).
fn helm(cp: &support::cluster::ControlPlane, args: &[&str]) -> std::process::Output {
    let bin = std::process::Command::new("bash")
        .arg(repo().join("tests/env/helm.sh"))
        .arg("bin")
        .output()
        .unwrap();
    let dir = String::from_utf8_lossy(&bin.stdout).trim().to_string();
    std::process::Command::new(format!("{dir}/helm"))
        .arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .args(args)
        .output()
        .unwrap()
}

fn succeeded(out: &std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Rendered objects by (kind, name).
fn objects(yaml: &str) -> std::collections::BTreeMap<(String, String), serde_json::Value> {
    yaml_serde::Deserializer::from_str(yaml)
        .map(|doc| <serde_json::Value as serde::Deserialize>::deserialize(doc).unwrap())
        .filter(|o| !o.is_null())
        .map(|o| {
            let key = (
                o["kind"].as_str().unwrap().to_string(),
                o["metadata"]["name"].as_str().unwrap().to_string(),
            );
            (key, o)
        })
        .collect()
}

/// Values for a cluster without cert-manager and the Prometheus Operator (as the test control plane).
const WITHOUT_OPERATORS: [&str; 6] = [
    "--set",
    "certificates.source=self-signed",
    "--set",
    "metrics.serviceMonitor.enabled=false",
    "--set",
    "metrics.prometheusRule.enabled=false",
];

/// A field of the release's webhook TLS Secret, base64 as stored.
fn tls_secret_field(cp: &support::cluster::ControlPlane, ns: &str, key: &str) -> String {
    let path = format!("jsonpath={{.data.{}}}", key.replace('.', "\\."));
    cp.kubectl(&[
        "get",
        "secret",
        "rayshift-helm-webhook-tls",
        "-n",
        ns,
        "-o",
        &path,
    ])
}

fn chart() -> String {
    repo().join("charts/rayshift").to_string_lossy().into_owned()
}

/// The Pod values of a production install: labels and annotations (the selector's label kept), a priority class,
/// registry credentials and the ServiceAccount's annotations.
fn pod_values_reach_the_pods(cp: &support::cluster::ControlPlane) {
    let values = [
        r#"podLabels={"team":"ml","app.kubernetes.io/name":"other"}"#,
        r#"podAnnotations={"example.com/owner":"ml"}"#,
        r#"imagePullSecrets=[{"name":"regcred"}]"#,
        r#"priorityClassName="system-cluster-critical""#,
        r#"serviceAccount={"annotations":{"example.com/role":"rayshift"}}"#,
    ];
    let chart = chart();
    let mut args = vec!["template", "r", chart.as_str(), "-n", "x"];
    for v in &values {
        args.extend(["--set-json", v]);
    }
    let rendered = objects(&succeeded(&helm(cp, &args), "helm template with Pod values"));
    let key = |kind: &str| (kind.to_string(), "rayshift".to_string());
    let deployment = &rendered[&key("Deployment")]["spec"];
    let pod = &deployment["template"];
    assert_eq!(
        pod["metadata"]["labels"],
        json!({"app.kubernetes.io/name": "rayshift", "team": "ml"})
    );
    assert_eq!(
        deployment["selector"]["matchLabels"],
        json!({"app.kubernetes.io/name": "rayshift"})
    );
    assert_eq!(pod["metadata"]["annotations"], json!({"example.com/owner": "ml"}));
    assert_eq!(pod["spec"]["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod["spec"]["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(
        rendered[&key("ServiceAccount")]["metadata"]["annotations"],
        json!({"example.com/role": "rayshift"})
    );
}

/// The chart's defaults render exactly what the kustomize production install applies (but the Namespace,
/// which `helm install --create-namespace` makes); its values switch modes and certificates.
#[test]
fn helm_chart_renders_what_kustomize_installs() {
    let cp = control_plane_with_kuberay();
    succeeded(&helm(cp, &["lint", "--strict", &chart()]), "helm lint");
    let rendered = succeeded(
        &helm(cp, &["template", "rayshift", &chart(), "-n", "rayshift-system"]),
        "helm template",
    );
    let kustomized = std::process::Command::new(support::cluster::kubectl())
        .arg("kustomize")
        .arg(repo().join("manifests"))
        .output()
        .unwrap();
    let mut want = objects(&succeeded(&kustomized, "kubectl kustomize"));
    want.remove(&("Namespace".to_string(), "rayshift-system".to_string()));
    let got = objects(&rendered);
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    for (key, object) in &want {
        assert_eq!(
            &got[key], object,
            "{key:?} differs between the chart and kustomize"
        );
    }

    let args = |set: &str| {
        let out = helm(cp, &["template", "r", &chart(), "-n", "x", "--set", set]);
        let objects = objects(&succeeded(&out, set));
        objects[&("Deployment".to_string(), "rayshift".to_string())]["spec"]["template"]["spec"]["containers"]
            [0]["args"]
            .clone()
    };
    let webhook_only = args("mode=webhook");
    assert_eq!(webhook_only[0], "webhook", "{webhook_only}");
    assert!(
        !webhook_only.to_string().contains("--leader-elect"),
        "{webhook_only}"
    );
    assert!(
        args("mode=reconcile")
            .to_string()
            .contains("\"--mode=reconcile\"")
    );
    pod_values_reach_the_pods(cp);
    let bad = helm(cp, &["template", "r", &chart(), "--set", "mode=everything"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("mode must be webhook, observe or reconcile"));

    // Self-signed: the Secret's CA is the one both webhook configurations trust; no cert-manager object.
    let out = helm(
        cp,
        &[
            "template",
            "r",
            &chart(),
            "-n",
            "x",
            "--set",
            "certificates.source=self-signed",
        ],
    );
    let signed = objects(&succeeded(&out, "self-signed"));
    let ca = signed[&("Secret".to_string(), "rayshift-webhook-tls".to_string())]["data"]["ca.crt"].clone();
    assert!(ca.as_str().is_some_and(|c| c.len() > 100), "{ca}");
    for config in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
        let key = (
            config.to_string(),
            format!("rayshift-{}", &config[..config.len() - 20].to_lowercase()),
        );
        assert_eq!(
            signed[&key]["webhooks"][0]["clientConfig"]["caBundle"], ca,
            "{key:?}"
        );
    }
    assert!(
        !signed
            .keys()
            .any(|(kind, _)| kind == "Certificate" || kind == "Issuer")
    );

    // What installs without cert-manager and the Prometheus Operator passes the apiserver's own checks.
    system_namespace(cp);
    let chart = chart();
    let args = [
        &["template", "rayshift", &chart, "-n", "rayshift-system"][..],
        &WITHOUT_OPERATORS,
    ]
    .concat();
    let plain = helm(cp, &args);
    let applied = cp.kubectl_stdin(
        &["apply", "--dry-run=server", "-f", "-"],
        &succeeded(&plain, "helm template"),
    );
    dry_run_applied(
        &applied,
        &[
            "deployment.apps/rayshift",
            "poddisruptionbudget.policy/rayshift",
            "secret/rayshift-webhook-tls",
            "configmap/rayshift-grafana-dashboard",
        ],
    );
}

/// The release's own kwok node: its Pods land there and nowhere else, so the test can cordon it.
const HELM_NODE: &str = "rayshift-helm-node";

/// A node drain, as `kubectl drain` makes it: the node cordoned, then its Pods evicted through the Eviction API.
/// The release's disruption budget lets one replica go and refuses the other, since the first one's replacement
/// cannot be scheduled (kwok would make it Ready within milliseconds on a schedulable node, and the budget would
/// rightly allow the next eviction). Then the node is uncordoned and the replacement runs.
async fn one_replica_at_a_time_is_evicted(
    cp: &support::cluster::ControlPlane,
    client: &kube::Client,
    ns: &str,
) {
    use k8s_openapi::api::{
        core::v1::{Node, Pod},
        policy::v1::PodDisruptionBudget,
    };
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let budget = || async {
        budgets
            .get("rayshift-helm")
            .await
            .unwrap()
            .status
            .unwrap_or_default()
    };
    let every = Duration::from_millis(250);
    let allows_one = || async {
        let status = budget().await;
        (status.current_healthy == 2 && status.disruptions_allowed == 1).then_some(())
    };
    let diagnose = || async { format!("{:?}", budget().await) };
    eventually(
        "the budget allowing one disruption",
        60,
        every,
        allows_one,
        diagnose,
    )
    .await;
    let nodes: Api<Node> = Api::all(client.clone());
    let cordon = |unschedulable: bool| {
        let patch = json!({"spec": {"unschedulable": unschedulable}});
        let nodes = nodes.clone();
        async move {
            nodes
                .patch(HELM_NODE, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    };
    cordon(true).await;
    // The refused eviction's 429 must reach the test, not be retried by the client.
    let pods: Api<Pod> = Api::namespaced(cp.client_without_retries().await, ns);
    let selector = kube::api::ListParams::default().labels("app.kubernetes.io/name=rayshift-helm");
    let names: Vec<String> = pods
        .list(&selector)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    let evict = kube::api::EvictParams::default();
    pods.evict(&names[0], &evict).await.expect("one replica may go");
    let second = pods.evict(&names[1], &evict).await;
    // What kept the budget at 0: the replacement could not be scheduled on the cordoned node.
    let unschedulable = |p: &Pod| {
        let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
        conditions
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
    };
    let found = || async {
        let items = pods.list(&selector).await.unwrap().items;
        items.iter().any(unschedulable).then_some(())
    };
    let diagnose = || async { String::new() };
    eventually("the replacement found unschedulable", 30, every, found, diagnose).await;
    cordon(false).await;
    match second {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 429, "{e:?}"),
        other => panic!("the second replica was evicted too: {other:?}"),
    }
}

/// `helm install` on the test control plane (the real scheduler, kwok's node): the release's Deployment
/// becomes Available, and the certificate Helm generated serves TLS in the real webhook for the Service's
/// name, trusted through the CA the webhook configurations carry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_becomes_ready() {
    let cp = control_plane_with_kuberay();
    let ns = "rayshift-helm";
    let client = cp.client().await;
    // The GPU tests' node helper, with no GPU: a node of the release's own, tainted for every other Pod.
    support::autoscaler::gpu_node(&client, HELM_NODE, 0, "10.250.162.0/24").await;
    let out = helm(
        cp,
        &[
            "install",
            "rayshift",
            &chart(),
            "-n",
            ns,
            "--create-namespace",
            "--wait",
            "--timeout",
            "180s",
            "--set",
            "fullnameOverride=rayshift-helm",
            // Reviews nothing the other tests create: no namespace carries this label.
            "--set",
            "webhook.namespaceSelector.matchLabels.rayshift-helm-test=on",
            "--set-json",
            &format!(r#"nodeSelector={{"kubernetes.io/hostname":"{HELM_NODE}"}}"#),
            "--set-json",
            &format!(r#"tolerations=[{{"key":"{GPU_TAINT}","value":"{HELM_NODE}","effect":"NoSchedule"}}]"#),
        ]
        .iter()
        .chain(&WITHOUT_OPERATORS)
        .copied()
        .collect::<Vec<_>>(),
    );
    succeeded(&out, "helm install");
    let available = cp.kubectl(&[
        "get",
        "deployment",
        "rayshift-helm",
        "-n",
        ns,
        "-o",
        "jsonpath={.status.availableReplicas}",
    ]);
    assert_eq!(available, "2");
    let status = succeeded(&helm(cp, &["status", "rayshift", "-n", ns]), "helm status");
    assert!(status.contains("STATUS: deployed"), "{status}");
    one_replica_at_a_time_is_evicted(cp, &client, ns).await;

    let secret = |key: &str| {
        use base64::Engine;
        let b64 = tls_secret_field(cp, ns, key);
        base64::engine::general_purpose::STANDARD.decode(b64).unwrap()
    };
    let certs = tempfile::tempdir().unwrap();
    for file in ["tls.crt", "tls.key", "ca.crt"] {
        std::fs::write(certs.path().join(file), secret(file)).unwrap();
    }
    let ca_bundle = cp.kubectl(&[
        "get",
        "validatingwebhookconfiguration",
        "rayshift-helm-validating",
        "-o",
        "jsonpath={.webhooks[0].clientConfig.caBundle}",
    ]);
    let ca_b64 = tls_secret_field(cp, ns, "ca.crt");
    assert!(!ca_bundle.is_empty());
    assert_eq!(
        ca_bundle, ca_b64,
        "the webhook configuration trusts another CA than the Secret's"
    );
    let webhook = support::webhook::WebhookProcess::start(certs.path(), &[]);
    let port = webhook.url("").rsplit(':').next().unwrap().to_string();
    let host = format!("rayshift-helm-webhook.{ns}.svc");
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&secret("ca.crt")).unwrap())
        .resolve(&host, format!("127.0.0.1:{port}").parse().unwrap())
        .build()
        .unwrap();
    let review = support::webhook::admission_review(
        "CREATE",
        Some(
            &json!({"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "x"}, "spec": {}}),
        ),
        None,
    );
    let answer = client
        .post(format!("https://{host}:{port}/validate-ray-io-v1-rayservice"))
        .json(&review)
        .send()
        .await
        .expect("TLS with Helm's certificate, trusted through its CA");
    assert!(answer.status().is_success(), "{answer:?}");
    // An upgrade keeps the certificate (Helm's lookup of the Secret): running Pods keep being trusted.
    let upgrade = helm(
        cp,
        &[
            "upgrade",
            "rayshift",
            &chart(),
            "-n",
            ns,
            "--reuse-values",
            "--wait",
        ],
    );
    succeeded(&upgrade, "helm upgrade");
    let ca_after = tls_secret_field(cp, ns, "ca.crt");
    assert_eq!(ca_after, ca_b64, "helm upgrade replaced the CA");
    succeeded(
        &helm(cp, &["uninstall", "rayshift", "-n", ns, "--wait"]),
        "helm uninstall",
    );
}
