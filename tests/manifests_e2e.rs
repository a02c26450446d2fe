//! The shipped manifests on a real apiserver: a server-side dry run of the kustomization, and the
//! controller running under exactly the ClusterRole it ships (the apiserver authorizes with RBAC): a full
//! incremental upgrade and a cluster deletion without a single 403.

mod support;

use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use rayshift_api::RayService;
use serde_json::json;
use support::{
    cluster::{control_plane_with_kuberay, repo},
    controller::ControllerProcess,
    dashboard::FakeDashboard,
    traefik::{self, TraefikGateway},
};

/// rayshift-system, created once for both tests (two concurrent applies would race to create it).
fn system_namespace(cp: &support::cluster::ControlPlane) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        cp.kubectl(&[
            "apply",
            "-f",
            &repo().join("manifests/deploy/namespace.yaml").to_string_lossy(),
        ]);
    });
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
    for kind in [
        "deployment.apps/rayshift",
        "clusterrole.rbac.authorization.k8s.io/rayshift",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/rayshift-validating",
        "configmap/rayshift-grafana-dashboard",
        "service/rayshift-webhook",
    ] {
        assert!(
            stdout.contains(kind) && stdout.contains("(server dry run)"),
            "{kind} missing:\n{stdout}"
        );
    }
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
    cp.kubectl(&[
        "apply",
        "-f",
        &repo().join("manifests/deploy/rbac.yaml").to_string_lossy(),
    ]);
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
    let api: Api<RayService> = Api::namespaced(client.clone(), &ns);
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
    let clusters: Api<rayshift_api::RayCluster> = Api::namespaced(client.clone(), &ns);
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
        !logs.contains("403") && !logs.to_lowercase().contains("forbidden"),
        "RBAC denied something:\n{logs}"
    );
}
