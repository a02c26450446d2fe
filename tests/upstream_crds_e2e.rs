//! KubeRay's CRDs exactly as released, on today's apiserver: a RayService managed by rayshift is refused by
//! KubeRay's own CEL rule until rayshift's reconcile component is applied, and rayshift's upgrade progress in
//! the status survives only with it (the apiserver prunes fields the schema does not know).

mod support;

use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use rayshift_api::RayService;
use serde_json::{Value, json};
use support::cluster::{ControlPlane, Crds, repo};

fn rayservice(name: &str, managed_by: &str) -> RayService {
    serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": name},
        "spec": {
            "managedBy": managed_by,
            "serveConfigV2": "applications:\n  - name: app\n    import_path: m:app\n",
            "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.46.0"}]}}}}
        }
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rayshift_managed_rayservices_need_the_reconcile_component() {
    let cp = ControlPlane::start().with_crds(&[Crds::KubeRay]);
    let client = cp.client().await;
    let ns = cp.namespace(&client, "upstream").await;
    let api: Api<RayService> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();

    // As released: KubeRay's CEL rule names the only two values it allows.
    let refused = api
        .create(&pp, &rayservice("mine", "rayshift.io/controller"))
        .await
        .expect_err("KubeRay's CRD refuses managedBy rayshift.io/controller");
    assert!(
        refused
            .to_string()
            .contains("the managedBy field value must be either"),
        "{refused}"
    );
    api.create(&pp, &rayservice("theirs", "ray.io/kuberay-operator"))
        .await
        .unwrap();
    // Unknown status fields are pruned: without the component rayshift could not keep its progress.
    let progress =
        json!({"status": {"upgradeStartTime": "2026-01-01T00:00:00Z", "rejectedSpecDigest": "abc"}});
    api.patch_status("theirs", &PatchParams::default(), &Patch::Merge(&progress))
        .await
        .unwrap();
    let stored = serde_json::to_value(api.get("theirs").await.unwrap()).unwrap();
    assert_eq!(stored["status"]["upgradeStartTime"], Value::Null, "{stored}");

    // The component, as `kubectl patch` of a live cluster (the other tests apply it through kustomize).
    let patch = repo().join("manifests/components/reconcile/rayservice-crd.yaml");
    let apply_component = || {
        cp.kubectl_output(&[
            "patch",
            "crd",
            "rayservices.ray.io",
            "--type=json",
            "--patch-file",
            &patch.to_string_lossy(),
        ])
    };
    let applied = apply_component();
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    // The apiserver takes a moment to serve the new schema.
    let mut created = Err(String::new());
    for _ in 0..100 {
        created = api
            .create(&pp, &rayservice("mine", "rayshift.io/controller"))
            .await
            .map_err(|e| e.to_string());
        if created.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    created.expect("accepted with the reconcile component");
    api.patch_status("mine", &PatchParams::default(), &Patch::Merge(&progress))
        .await
        .unwrap();
    let stored = serde_json::to_value(api.get("mine").await.unwrap()).unwrap();
    assert_eq!(stored["status"]["upgradeStartTime"], "2026-01-01T00:00:00Z");
    assert_eq!(stored["status"]["rejectedSpecDigest"], "abc");

    // KubeRay's other rule is kept: managedBy cannot change once set.
    let handover = json!({"spec": {"managedBy": "rayshift.io/controller"}});
    let immutable = api
        .patch("theirs", &PatchParams::default(), &Patch::Merge(&handover))
        .await
        .expect_err("managedBy is immutable");
    assert!(immutable.to_string().contains("immutable"), "{immutable}");
    // The patch's guard: applied twice, its `test` operation refuses a rule it does not know.
    let again = apply_component();
    assert!(
        !again.status.success(),
        "the patch must not apply to an already widened rule"
    );
    cp.stop();
}
