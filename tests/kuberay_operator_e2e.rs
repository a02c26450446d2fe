//! rayshift beside the real KubeRay operator (built from its Go module) on KubeRay's released CRDs, with the
//! real kube-scheduler binding Pods to a kwok fake node and kwok running them:
//! - a RayService managed by rayshift is upgraded incrementally end to end; KubeRay's RayCluster controller runs
//!   its clusters (head Pods, Services, RayCluster status) while KubeRay's RayService controller never touches it;
//! - a RayService KubeRay manages, in the same namespace, is left alone by rayshift's controller, still gets
//!   rayshift's admission, and shows in rayshift's metrics (observe);
//! - the KubeRay-managed one is then handed over (`managedBy` set): rayshift removes KubeRay's finalizer and
//!   serves it on the cluster KubeRay built (same spec: no new cluster, no needless upgrade);
//! - both delete cleanly (no finalizer of KubeRay's is left on either).
//!
//! Traefik is the Gateway controller. The stand-in that remains: the Ray dashboard (a fake with the real API's
//! shapes: the Pods kwok runs have no Ray in them).

mod support;

use std::time::Duration;

use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use rayshift_api::{RayCluster, RayService};
use serde_json::{Value, json};
use support::{
    cluster::{ControlPlane, Crds},
    controller::ControllerProcess,
    dashboard::FakeDashboard,
    status::{active, cluster_names, pending},
    traefik::{self, TraefikGateway},
    wait::eventually,
    webhook::AdmissionWebhook,
};

const GATE: &str = "--feature-gates=RayServiceIncrementalUpgrade=true";

fn rayservice(name: &str, managed_by: Option<&str>, image: &str) -> RayService {
    let mut spec = json!({
        "rayClusterDeletionDelaySeconds": 1,
        "upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": {
            "gatewayClassName": traefik::CLASS, "maxSurgePercent": 50, "stepSizePercent": 50, "intervalSeconds": 1}},
        "serveConfigV2": "applications:\n  - name: llm\n    import_path: serve_llm:app\n    route_prefix: /\n",
        "rayClusterConfig": {
            "enableInTreeAutoscaling": true,
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "ray-head", "image": image,
                "ports": [{"name": "dashboard", "containerPort": 8265}, {"name": "serve", "containerPort": 8000}]}]}}},
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 2,
                "template": {"spec": {"containers": [{"name": "ray-worker", "image": image}]}}}]
        }
    });
    if let Some(m) = managed_by {
        spec["managedBy"] = json!(m);
    } else {
        spec["upgradeStrategy"] = json!({"type": "NewCluster"});
    }
    serde_json::from_value(
        json!({"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": name}, "spec": spec}),
    )
    .unwrap()
}

/// Node label that lets KubeRay's head Pod of "theirs" be scheduled. Until the test sets it, the head stays
/// Pending, so KubeRay (whose dashboard calls cannot reach kwok's Ray-less Pods) writes its pending cluster into
/// the status before it starts failing on the dashboard; a head that turned Ready first raced that write away.
const THEIRS_HOLD: (&str, &str) = ("rayshift-test/theirs", "schedulable");

/// "theirs" with its head Pod held until the node gets [`THEIRS_HOLD`].
fn held(rs: RayService) -> RayService {
    let mut v = serde_json::to_value(&rs).unwrap();
    v["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["nodeSelector"] =
        json!({THEIRS_HOLD.0: THEIRS_HOLD.1});
    serde_json::from_value(v).unwrap()
}

/// Field managers that wrote to an object (from its managedFields).
fn managers(meta: &kube::api::ObjectMeta) -> Vec<String> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter_map(|f| f.manager.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rayshift_and_the_real_kuberay_operator_share_a_namespace() {
    let cp = ControlPlane::start()
        .with_crds(&[Crds::KubeRayForRayshift, Crds::GatewayApi])
        .with_kuberay();
    let client = cp.client().await;
    let ns = cp.namespace(&client, "kuberay").await;
    let webhook = AdmissionWebhook::register(&cp, &client, &ns, &[GATE]).await;
    let dashboard = FakeDashboard::start().await;
    let _gateway = TraefikGateway::start(&cp, client.clone(), &ns).await;
    let controller = ControllerProcess::start(&cp, &ns, &dashboard.url_template(), &[GATE]);
    let services: Api<RayService> = Api::namespaced(client.clone(), &ns);
    let clusters: Api<RayCluster> = Api::namespaced(client.clone(), &ns);
    let logs = |what: &'static str| {
        let (cp, controller) = (&cp, &controller);
        move || async move {
            format!(
                "{what}\n--- KubeRay ---\n{}\n--- rayshift ---\n{}",
                cp.kuberay_log(30),
                support::wait::tail(&controller.logs(), 30)
            )
        }
    };
    // "theirs" must be newer than the controller: one older than it is told from its first change on, and
    // KubeRay may write its pending cluster before rayshift's first look (a CI run saw no event then).
    eventually(
        "rayshift's controller ready",
        60,
        Duration::from_millis(100),
        || async { (controller.readyz() == 200).then_some(()) },
        logs("the controller never got ready"),
    )
    .await;
    let pp = PostParams::default();
    services
        .create(
            &pp,
            &rayservice("mine", Some("rayshift.io/controller"), "rayproject/ray:2.46.0"),
        )
        .await
        .unwrap();
    services
        .create(&pp, &held(rayservice("theirs", None, "rayproject/ray:2.46.0")))
        .await
        .unwrap();

    // rayshift's: Ready on a cluster KubeRay's RayCluster controller brought up (its status, its Pods).
    let first = eventually(
        "mine serving on a cluster KubeRay runs",
        120,
        Duration::from_millis(250),
        || async {
            let rs = services.get("mine").await.ok()?;
            let name = active(&rs)?;
            let traffic = rs
                .status
                .as_ref()?
                .active_service_status
                .as_ref()?
                .traffic_routed_percent;
            let rc = clusters.get(&name).await.ok()?;
            (traffic == Some(100) && rc.status.as_ref()?.state.as_deref() == Some("ready")).then_some(name)
        },
        logs("mine never served"),
    )
    .await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let head = pods
        .list(&ListParams::default().labels(&format!("ray.io/cluster={first},ray.io/node-type=head")))
        .await
        .unwrap();
    assert_eq!(head.items.len(), 1, "KubeRay created the head Pod");
    let pod_ip = head.items[0]
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    assert!(
        pod_ip.starts_with("10.250."),
        "kwok's Pod IP is in the local test range: {pod_ip}"
    );

    // The upgrade, through the real RayCluster controller for the new cluster too.
    let patch = json!({"spec": {"rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head",
        "image": "rayproject/ray:2.47.0", "ports": [{"name": "dashboard", "containerPort": 8265}, {"name": "serve", "containerPort": 8000}]}]}}}}}});
    services
        .patch("mine", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let second = eventually(
        "the incremental upgrade completes",
        120,
        Duration::from_millis(250),
        || async {
            let rs = services.get("mine").await.ok()?;
            let name = active(&rs)?;
            (name != first && pending(&rs).is_none()).then_some(name)
        },
        logs("the upgrade did not complete"),
    )
    .await;
    eventually(
        "the old cluster and its Pods are gone",
        60,
        Duration::from_millis(250),
        || async {
            let gone = clusters.get_opt(&first).await.ok()?.is_none();
            let left = pods
                .list(&ListParams::default().labels(&format!("ray.io/cluster={first}")))
                .await
                .ok()?;
            (gone && left.items.is_empty()).then_some(())
        },
        logs("the old cluster stayed"),
    )
    .await;

    // KubeRay's RayService controller never touched rayshift's: no finalizer, no status or cluster of its own.
    let mine = services.get("mine").await.unwrap();
    assert!(
        !mine.finalizers().iter().any(|f| f.starts_with("ray.io/")),
        "{:?}",
        mine.finalizers()
    );
    let written_by = managers(&mine.metadata);
    assert!(
        !written_by
            .iter()
            .any(|m| m.contains("ray-operator") || m.contains("kuberay")),
        "{written_by:?}"
    );
    for rc in clusters.list(&ListParams::default()).await.unwrap().items {
        let owner = rc
            .owner_references()
            .first()
            .map(|o| o.name.clone())
            .unwrap_or_default();
        if owner == "mine" {
            assert_eq!(rc.name_any(), second, "one cluster for mine, made by rayshift");
            assert!(
                managers(&rc.metadata).iter().any(|m| m == "rayshift"),
                "{:?}",
                managers(&rc.metadata)
            );
        }
    }

    // KubeRay's: reconciled by KubeRay (its finalizer and status, naming its pending cluster while the head is
    // held), never by rayshift.
    let theirs = eventually(
        "KubeRay reconciles theirs",
        90,
        Duration::from_millis(250),
        || async {
            let rs = services.get("theirs").await.ok()?;
            pending(&rs)?;
            Some(rs)
        },
        logs("KubeRay never wrote theirs' pending cluster"),
    )
    .await;
    let label = format!("{}={}", THEIRS_HOLD.0, THEIRS_HOLD.1);
    cp.kubectl(&["label", "nodes", "--all", "--overwrite", &label]);
    assert!(
        theirs
            .finalizers()
            .iter()
            .any(|f| f == "ray.io/rayservice-finalizer"),
        "{:?}",
        theirs.finalizers()
    );
    assert!(
        !managers(&theirs.metadata).iter().any(|m| m == "rayshift"),
        "{:?}",
        managers(&theirs.metadata)
    );
    // ... and observed: its capacity and traffic series are on rayshift's /metrics.
    eventually(
        "theirs in rayshift's metrics",
        30,
        Duration::from_millis(250),
        || async {
            controller
                .metrics()
                .lines()
                .any(|l| l.starts_with("rayshift_rayservice_upgrade_phase") && l.contains("name=\"theirs\""))
                .then_some(())
        },
        logs("theirs is not observed"),
    )
    .await;
    // ... with its progress as events, from the status KubeRay writes (KubeRay made a pending cluster for it).
    eventually(
        "theirs' progress in rayshift's events",
        30,
        Duration::from_millis(250),
        || async {
            let events = cp.kubectl(&["get", "events.events.k8s.io", "-n", &ns, "-o", "json"]);
            let events: Value = serde_json::from_str(&events).ok()?;
            events["items"]
                .as_array()?
                .iter()
                .any(|e| {
                    e["regarding"]["name"] == "theirs"
                        && e["reason"] == "ObservedPendingCluster"
                        && e["reportingController"] == "rayshift"
                })
                .then_some(())
        },
        logs("theirs' progress is not in events"),
    )
    .await;
    // ... and admitted by rayshift's webhook like any other.
    let mut bad = rayservice("theirs-bad", None, "rayproject/ray:2.46.0");
    bad.spec.serve_config_v2 = Some("applications: [{name: a}]".into());
    let denied = services
        .create(&pp, &bad)
        .await
        .expect_err("rayshift's webhook denies it");
    assert!(denied.to_string().contains("admission webhook"), "{denied}");
    assert!(webhook.denied() >= 1.0);

    handover(
        &services,
        &clusters,
        &client,
        &ns,
        logs("the handover did not complete"),
    )
    .await;

    // Deletion: rayshift's goes at once (nothing of KubeRay's holds it), with its clusters.
    services.delete("mine", &DeleteParams::default()).await.unwrap();
    eventually(
        "mine and its clusters are gone",
        60,
        Duration::from_millis(250),
        || async {
            let gone = services.get_opt("mine").await.ok()?.is_none();
            let owned: Vec<Value> = clusters
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .iter()
                .filter(|c| c.owner_references().iter().any(|o| o.name == "mine"))
                .map(|c| json!(c.name_any()))
                .collect();
            (gone && owned.is_empty()).then_some(())
        },
        logs("mine was not deleted"),
    )
    .await;
    // The one handed over goes too: KubeRay's finalizer no longer holds it, the garbage collector takes its cluster.
    services.delete("theirs", &DeleteParams::default()).await.unwrap();
    eventually(
        "theirs and its cluster are gone",
        60,
        Duration::from_millis(250),
        || async {
            let gone = services.get_opt("theirs").await.ok()?.is_none();
            let owned = clusters
                .list(&ListParams::default().labels("ray.io/originated-from-cr-name=theirs"))
                .await
                .ok()?;
            (gone && owned.items.is_empty()).then_some(())
        },
        logs("theirs was not deleted"),
    )
    .await;

    drop(controller);
    cp.stop();
}

/// Hands KubeRay's RayService "theirs" over to rayshift by setting `managedBy`, as a user would.
async fn handover<F, Fut>(
    services: &Api<RayService>,
    clusters: &Api<RayCluster>,
    client: &kube::Client,
    ns: &str,
    logs: F,
) where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let built_by_kuberay = clusters
        .list(&ListParams::default().labels("ray.io/originated-from-cr-name=theirs"))
        .await
        .unwrap()
        .items;
    assert_eq!(built_by_kuberay.len(), 1, "KubeRay built one cluster for theirs");
    let kuberays = built_by_kuberay[0].name_any();
    assert!(
        built_by_kuberay[0]
            .annotations()
            .contains_key("ray.io/hash-without-replicas-and-workers-to-delete"),
        "built by KubeRay (its hash), not by rayshift"
    );
    let patch = json!({"spec": {"managedBy": "rayshift.io/controller"}});
    services
        .patch("theirs", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the reconcile component and rayshift's webhook allow setting managedBy once");

    // rayshift serves it on KubeRay's cluster, with KubeRay's finalizer gone.
    eventually(
        "rayshift serves theirs on the cluster KubeRay built",
        90,
        Duration::from_millis(250),
        || async {
            let rs = services.get("theirs").await.ok()?;
            let serving = active(&rs)? == kuberays
                && rs
                    .status
                    .as_ref()?
                    .active_service_status
                    .as_ref()?
                    .traffic_routed_percent
                    .is_none_or(|t| t == 100)
                && pending(&rs).is_none();
            (serving && !rs.finalizers().iter().any(|f| f.starts_with("ray.io/"))).then_some(())
        },
        logs,
    )
    .await;
    let now = cluster_names(clusters, "ray.io/originated-from-cr-name=theirs").await;
    assert_eq!(
        now,
        vec![kuberays.clone()],
        "no new cluster: the spec did not change"
    );

    // Both steps are visible to `kubectl describe`.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    let notes: Vec<(String, String)> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("theirs"))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect();
    for (reason, says) in [
        ("AdoptedRayCluster", "kept as it is"),
        ("ReleasedKubeRayFinalizer", "ray.io/rayservice-finalizer"),
    ] {
        assert!(
            notes.iter().any(|(r, n)| r == reason && n.contains(says)),
            "{reason}: {notes:?}"
        );
    }
}
