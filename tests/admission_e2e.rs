//! Admission end to end through a real kube-apiserver: `rayshift webhook` registered with the
//! configurations from `rayshift certs webhook-config --url`, RayServices created and updated with kube-rs
//! and kubectl.

mod support;

use std::{path::PathBuf, process::Output};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{DynamicObject, ObjectMeta, Patch, PatchParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use rayshift_api::{RayService, documents};
use serde_json::{Value, json};
use support::{
    cluster::{ControlPlane, control_plane},
    webhook::AdmissionWebhook,
};

/// A namespace whose RayServices are admitted by this test's own webhook.
struct Admitted {
    _webhook: AdmissionWebhook,
    /// Manifests written for kubectl.
    files: tempfile::TempDir,
    cp: &'static ControlPlane,
    client: Client,
    ns: String,
}

impl Admitted {
    async fn new(test: &str) -> Self {
        let cp = control_plane();
        let client = cp.client().await;
        assert!(cp.crds_established(&client).await);
        let ns = format!("e2e-{test}");
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
        let webhook = AdmissionWebhook::register(cp, &client, &ns, &[]).await;
        Self {
            _webhook: webhook,
            files: tempfile::tempdir().unwrap(),
            cp,
            client,
            ns,
        }
    }

    fn rayservices(&self) -> Api<RayService> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Writes `object` (moved into this namespace) to a file for kubectl.
    fn manifest(&self, object: &Value) -> PathBuf {
        let mut object = object.clone();
        object["metadata"]["namespace"] = json!(self.ns);
        let path = self
            .files
            .path()
            .join(format!("{}.json", object["metadata"]["name"].as_str().unwrap()));
        std::fs::write(&path, serde_json::to_vec(&object).unwrap()).unwrap();
        path
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        self.cp.kubectl_output(args)
    }

    /// Unregisters the webhook (on drop).
    async fn cleanup(self) {}
}

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/validate/{name}.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut doc = documents::parse_stream(&std::fs::read_to_string(path).unwrap())
        .unwrap()
        .remove(0);
    doc["metadata"].as_object_mut().unwrap().remove("namespace");
    doc
}

fn typed(v: Value) -> RayService {
    serde_json::from_value(v).unwrap()
}

fn api_error(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rayservices_are_rejected_with_the_webhook_message() {
    let a = Admitted::new("deny").await;
    let api = a.rayservices();
    for (name, field) in [
        (
            "step-size-range",
            "spec.upgradeStrategy.clusterUpgradeOptions.stepSizePercent",
        ),
        (
            "autoscaler-required",
            "spec.rayClusterConfig.enableInTreeAutoscaling",
        ),
        ("serve-config-yaml", "spec.serveConfigV2"),
        (
            "rc-worker-replica-bounds",
            "spec.rayClusterConfig.workerGroupSpecs[0].minReplicas",
        ),
    ] {
        let mut obj = fixture(name);
        obj["metadata"]["name"] = json!(name);
        let status = api_error(api.create(&PostParams::default(), &typed(obj)).await.unwrap_err());
        assert_eq!(status.code, 422, "{name}: {status:?}");
        assert!(
            status
                .message
                .contains("admission webhook \"vrayservice.rayshift.io\" denied the request"),
            "{name}: {}",
            status.message
        );
        assert!(
            status.message.contains(&format!("{field}: ")),
            "{name}: {}",
            status.message
        );
        assert!(
            api.get_opt(name).await.unwrap().is_none(),
            "{name} was not stored"
        );
    }
    // Every violated rule is in the one message (the name is fixed first: the apiserver checks names itself).
    let mut many = fixture("many-errors");
    many["metadata"]["name"] = json!("many-errors");
    // KubeRay's own schema refuses a negative deletion delay before any webhook is asked (schema validation
    // runs first); without it, every other violation is rayshift's and comes in one message.
    let schema = api_error(
        api.create(&PostParams::default(), &typed(many.clone()))
            .await
            .unwrap_err(),
    );
    assert!(
        schema.message.contains("spec.rayClusterDeletionDelaySeconds"),
        "{}",
        schema.message
    );
    many["spec"]
        .as_object_mut()
        .unwrap()
        .remove("rayClusterDeletionDelaySeconds");
    let status = api_error(
        api.create(&PostParams::default(), &typed(many))
            .await
            .unwrap_err(),
    );
    assert!(status.message.contains("admission webhook"), "{}", status.message);
    for field in ["stepSizePercent", "intervalSeconds"] {
        assert!(
            status.message.contains(field),
            "{field} missing: {}",
            status.message
        );
    }
    // kubectl users see the same.
    let mut obj = fixture("step-size-range");
    obj["metadata"]["name"] = json!("via-kubectl");
    let out = a.kubectl(&["apply", "-f", &a.manifest(&obj).to_string_lossy()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    // kubectl renders the webhook's Invalid status from its causes.
    assert!(
        stderr.contains("\"via-kubectl\" is invalid") || stderr.contains("denied the request"),
        "{stderr}"
    );
    assert!(stderr.contains("stepSizePercent: Invalid value: 150"), "{stderr}");
    a.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warnings_defaults_updates_and_dry_run() {
    let a = Admitted::new("flow").await;
    let api = a.rayservices();

    // Warnings reach kubectl.
    let mut warned = fixture("warn-interval-short");
    warned["metadata"]["name"] = json!("warned");
    let out = a.kubectl(&["apply", "-f", &a.manifest(&warned).to_string_lossy()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Warning: spec.upgradeStrategy.clusterUpgradeOptions.intervalSeconds"),
        "{stderr}"
    );

    // A RayService without maxSurgePercent is stored with 100.
    let mut no_surge = fixture("max-surge-defaulted");
    no_surge["metadata"]["name"] = json!("defaulted");
    api.create(&PostParams::default(), &typed(no_surge))
        .await
        .unwrap();
    let stored = api.get("defaulted").await.unwrap();
    let options = stored.spec.cluster_upgrade_options().unwrap();
    assert_eq!(options.max_surge_percent, Some(100));
    assert_eq!(options.step_size_percent, Some(5), "what the user wrote is kept");

    // An UPDATE that breaks a rule is rejected; the stored object is unchanged.
    let patch = json!({"spec": {"upgradeStrategy": {"clusterUpgradeOptions": {"stepSizePercent": 0}}}});
    let status = api_error(
        api.patch("defaulted", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 422);
    assert!(status.message.contains("stepSizePercent"), "{}", status.message);
    assert_eq!(
        api.get("defaulted")
            .await
            .unwrap()
            .spec
            .cluster_upgrade_options()
            .unwrap()
            .step_size_percent,
        Some(5)
    );
    // managedBy can be set once (a handover: KubeRay's CEL transition rule allows it, and so does the webhook),
    // and is immutable after that.
    let patch = json!({"spec": {"managedBy": "ray.io/kuberay-operator"}});
    api.patch("defaulted", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("setting managedBy on a RayService without one is a handover");
    let patch = json!({"spec": {"managedBy": "rayshift.io/controller"}});
    let status = api_error(
        api.patch("defaulted", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_err(),
    );
    assert!(status.message.contains("spec.managedBy"), "{}", status.message);
    // A good UPDATE goes through.
    let patch = json!({"spec": {"upgradeStrategy": {"clusterUpgradeOptions": {"intervalSeconds": 90}}}});
    api.patch("defaulted", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();

    // Server-side dry run: allowed objects pass without being stored, bad ones fail.
    let mut dry = fixture("allowed-incremental");
    dry["metadata"]["name"] = json!("dry");
    let out = a.kubectl(&[
        "apply",
        "--dry-run=server",
        "-f",
        &a.manifest(&dry).to_string_lossy(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("(server dry run)"));
    assert!(api.get_opt("dry").await.unwrap().is_none());
    let mut bad = fixture("interval-zero");
    bad["metadata"]["name"] = json!("dry-bad");
    let out = a.kubectl(&[
        "apply",
        "--dry-run=server",
        "-f",
        &a.manifest(&bad).to_string_lossy(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("intervalSeconds"));
    a.cleanup().await;
}

/// Stores `object` in `ns` and reads it back as raw JSON (not through rayshift's types, so nothing can hide a
/// loss); with `status`, also writes that status.
async fn stored(client: &Client, ns: &str, kind: &str, object: &Value, status: Option<&Value>) -> Value {
    let gvk = GroupVersionKind::gvk("ray.io", "v1", kind);
    let raw: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk));
    let mut object = object.clone();
    object["metadata"]["namespace"] = json!(ns);
    let name = object["metadata"]["name"].as_str().unwrap().to_string();
    raw.create(&PostParams::default(), &serde_json::from_value(object).unwrap())
        .await
        .unwrap();
    if let Some(status) = status {
        raw.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await
        .unwrap();
    }
    serde_json::to_value(raw.get(&name).await.unwrap()).unwrap()
}

/// KubeRay's released CRD prunes fields its schema does not know and defaults some (a port's protocol): that is
/// the apiserver's doing. rayshift's admission must add nothing to it and lose nothing: the sample stored through
/// rayshift's webhook equals the same sample stored in a namespace the webhook does not select.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kuberay_sample_is_stored_and_read_back_without_losing_fields() {
    let a = Admitted::new("lossless").await;
    let path = format!(
        "{}/tests/fixtures/roundtrip/kuberay-future-fields.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let docs = documents::parse_stream(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut sample = docs[0].clone();
    let mut status = sample.as_object_mut().unwrap().remove("status").unwrap();
    status["futureStatusField"] = json!(43);
    let mut cluster = docs[1].clone();
    cluster.as_object_mut().unwrap().remove("status");
    let plain = a.cp.namespace(&a.client, "no-webhook").await;

    let through = stored(&a.client, &a.ns, "RayService", &sample, Some(&status)).await;
    let without = stored(&a.client, &plain, "RayService", &sample, Some(&status)).await;
    assert_eq!(
        through["spec"], without["spec"],
        "rayshift's admission changed the spec"
    );
    assert_eq!(through["status"], without["status"]);
    assert_eq!(through["metadata"]["labels"], sample["metadata"]["labels"]);
    // What the released schema keeps is kept whole (the sample's fields that KubeRay knows).
    assert_eq!(
        through["spec"]["serveService"]["metadata"], sample["spec"]["serveService"]["metadata"],
        "{through}"
    );
    assert_eq!(
        through["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["scaleStrategy"],
        sample["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["scaleStrategy"]
    );
    assert!(
        through["status"]["activeServiceStatus"]["rayClusterName"].is_string(),
        "{through}"
    );

    // A RayCluster (as KubeRay's controller would see it) as well.
    let through = stored(&a.client, &a.ns, "RayCluster", &cluster, None).await;
    let without = stored(&a.client, &plain, "RayCluster", &cluster, None).await;
    assert_eq!(through["spec"], without["spec"]);
    a.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_api_objects_install_and_keep_weights() {
    let cp = control_plane();
    let client = cp.client().await;
    let ns = cp.namespace(&client, "gateway").await;
    let gw_gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway");
    let route_gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute");
    let gateways: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &ApiResource::from_gvk(&gw_gvk));
    let routes: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &ApiResource::from_gvk(&route_gvk));
    let gateway: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "llm-gateway"},
        "spec": {"gatewayClassName": "istio", "listeners": [{"name": "http", "protocol": "HTTP", "port": 80}]}
    }))
    .unwrap();
    gateways.create(&PostParams::default(), &gateway).await.unwrap();
    let route: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "llm-httproute"},
        "spec": {
            "parentRefs": [{"name": "llm-gateway", "namespace": ns}],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                       "backendRefs": [{"name": "llm-a-serve-svc", "port": 8000, "weight": 95},
                                       {"name": "llm-b-serve-svc", "port": 8000, "weight": 5}]}]
        }
    }))
    .unwrap();
    routes.create(&PostParams::default(), &route).await.unwrap();
    let stored = serde_json::to_value(routes.get("llm-httproute").await.unwrap()).unwrap();
    let weights: Vec<i64> = stored["spec"]["rules"][0]["backendRefs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["weight"].as_i64().unwrap())
        .collect();
    assert_eq!(weights, vec![95, 5]);
}

#[test]
fn control_plane_stop_leaves_no_process() {
    let cp = ControlPlane::start();
    let pids = cp.pids();
    assert_eq!(pids.len(), 3, "etcd, kube-apiserver, kube-controller-manager");
    assert!(pids.iter().all(|p| support::cluster::alive(*p)));
    cp.stop();
    assert!(!cp.dir.exists(), "the control plane's directory is removed");
}
