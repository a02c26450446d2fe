//! Without the Gateway API installed, blue/green keeps working and an incremental RayService gets a clear
//! condition and event instead of a crash (the REP's key requirement). Also: with the feature gate off,
//! the controller refuses an incremental RayService with a condition.

mod support;

use std::time::{Duration, Instant};

use kube::{
    Api,
    api::{ListParams, PostParams},
};
use rayshift_api::{RayCluster, RayService};
use serde_json::{Value, json};
use support::{
    cluster::control_plane_without_gateway_api, controller::ControllerProcess, dashboard::FakeDashboard,
};

fn rayservice(name: &str, incremental: bool) -> Value {
    let mut rs = json!({
        "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": name},
        "spec": {
            "managedBy": "rayshift.io/controller",
            "serveConfigV2": "applications:\n  - name: app\n    import_path: m:app\n",
            "rayClusterConfig": {
                "enableInTreeAutoscaling": true,
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "ray",
                    "ports": [{"name": "serve", "containerPort": 8000}]}]}}},
                "workerGroupSpecs": [{"groupName": "g", "replicas": 1, "minReplicas": 0, "maxReplicas": 2,
                    "template": {"spec": {"containers": [{"name": "w", "image": "ray"}]}}}]
            }
        }
    });
    if incremental {
        rs["spec"]["upgradeStrategy"] = json!({"type": "NewClusterWithIncrementalUpgrade",
            "clusterUpgradeOptions": {"gatewayClassName": "x", "stepSizePercent": 10, "intervalSeconds": 30}});
    }
    rs
}

async fn wait_condition(
    api: &Api<RayService>,
    name: &str,
    reason: &str,
    logs: impl Fn() -> String,
) -> RayService {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rs = api.get(name).await.unwrap();
        let ready = rs
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready").cloned());
        if ready.as_ref().is_some_and(|c| c.reason == reason) {
            return rs;
        }
        assert!(
            Instant::now() < deadline,
            "no Ready reason {reason} on {name}: {ready:?}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blue_green_works_and_incremental_reports_the_missing_gateway_api() {
    let cp = control_plane_without_gateway_api();
    let client = cp.client().await;
    let ns = cp.namespace(&client, "nogw").await;
    let dashboard = FakeDashboard::start().await;
    let mut controller = ControllerProcess::start(
        cp,
        &ns,
        &dashboard.url_template(),
        &["--feature-gates=RayServiceIncrementalUpgrade=true"],
    );
    let api: Api<RayService> = Api::namespaced(client.clone(), &ns);
    for (name, incremental) in [("bluegreen", false), ("incremental", true)] {
        let rs: RayService = serde_json::from_value(rayservice(name, incremental)).unwrap();
        api.create(&PostParams::default(), &rs).await.unwrap();
    }
    wait_condition(&api, "bluegreen", "NonZeroServeEndpoints", || controller.logs()).await;
    let rs = wait_condition(&api, "incremental", "GatewayAPIUnavailable", || controller.logs()).await;
    let message = rs
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap()
        .message;
    assert!(message.contains("Gateway API"), "{message}");
    let clusters: Api<RayCluster> = Api::namespaced(client.clone(), &ns);
    let for_incremental = clusters
        .list(&ListParams::default().labels("ray.io/originated-from-cr-name=incremental"))
        .await
        .unwrap();
    assert!(for_incremental.items.is_empty(), "nothing half-built");
    let events = cp.kubectl(&[
        "get",
        "events.events.k8s.io",
        "-n",
        &ns,
        "-o",
        "jsonpath={.items[*].reason}",
    ]);
    assert!(events.contains("GatewayAPIUnavailable"), "{events}");
    assert!(controller.alive(), "no crash");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_gate_off_the_controller_refuses_incremental_with_a_condition() {
    let cp = control_plane_without_gateway_api();
    let client = cp.client().await;
    let ns = cp.namespace(&client, "gateoff").await;
    let dashboard = FakeDashboard::start().await;
    let controller = ControllerProcess::start(cp, &ns, &dashboard.url_template(), &[]);
    let api: Api<RayService> = Api::namespaced(client.clone(), &ns);
    let rs: RayService = serde_json::from_value(rayservice("incremental", true)).unwrap();
    api.create(&PostParams::default(), &rs).await.unwrap();
    let rs = wait_condition(&api, "incremental", "ValidationFailed", || controller.logs()).await;
    let message = rs
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap()
        .message;
    assert!(message.contains("RayServiceIncrementalUpgrade"), "{message}");
}
