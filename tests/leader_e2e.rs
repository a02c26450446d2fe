//! Two controller processes with leader election on the real apiserver: one writer at a time, and the
//! other takes over within 15 s after the leader is killed. The real KubeRay operator runs the clusters.

mod support;

use std::time::{Duration, Instant};

use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use rayshift_api::RayService;
use serde_json::json;
use support::{
    cluster::control_plane_with_kuberay,
    controller::ControllerProcess,
    dashboard::FakeDashboard,
    signal::{self, Sig},
};

fn leader(c: &ControllerProcess) -> bool {
    support::webhook::metric(&c.metrics(), "rayshift_controller_leader") == 1.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_writes_and_the_other_takes_over_after_a_kill() {
    let cp = control_plane_with_kuberay();
    let client = cp.client().await;
    assert!(cp.crds_established(&client).await);
    let ns = cp.namespace(&client, "leader").await;
    let dashboard = FakeDashboard::start().await;
    let args = [
        "--leader-elect",
        "--leader-election-namespace",
        ns.as_str(),
        "--resync-interval-seconds",
        "2",
    ];
    let a = ControllerProcess::start(cp, &ns, &dashboard.url_template(), &args);
    let b = ControllerProcess::start(cp, &ns, &dashboard.url_template(), &args);
    let mut controllers = [a, b];
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        let leaders: Vec<usize> = (0..2).filter(|i| leader(&controllers[*i])).collect();
        if leaders.len() == 1 {
            break leaders[0];
        }
        assert!(
            leaders.len() < 2,
            "two leaders at once\n{}\n---\n{}",
            controllers[0].logs(),
            controllers[1].logs()
        );
        assert!(Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let other = 1 - first;
    // Both replicas are ready once each knows who leads (the leader also once its cache has synced).
    let deadline = Instant::now() + Duration::from_secs(10);
    while controllers.iter().any(|c| c.readyz() != 200) {
        assert!(
            Instant::now() < deadline,
            "/readyz: {} and {}",
            controllers[0].readyz(),
            controllers[1].readyz()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let api: Api<RayService> = Api::namespaced(client.clone(), &ns);
    let rs: RayService = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "llm"},
        "spec": {"managedBy": "rayshift.io/controller", "rayClusterDeletionDelaySeconds": 1,
            "serveConfigV2": "applications:\n  - name: app\n    import_path: m:app\n",
            "rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "ray:1",
                "ports": [{"name": "serve", "containerPort": 8000}]}]}}}}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &rs).await.unwrap();
    let ready = |rs: &RayService| {
        rs.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready(&api.get("llm").await.unwrap()) {
        assert!(
            Instant::now() < deadline,
            "not ready\n{}",
            controllers[first].logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // One writer at a time: the follower made no write.
    let writes = |c: &ControllerProcess| c.counter_sum("rayshift_kubernetes_writes_total");
    assert!(writes(&controllers[first]) > 0.0);
    assert_eq!(writes(&controllers[other]), 0.0, "the follower wrote");
    assert!(!leader(&controllers[other]));

    // Kill the leader (no chance to release the Lease) and change the spec: the follower takes over.
    assert!(signal::process(controllers[first].child.id(), Sig::KILL));
    let killed = Instant::now();
    let patch = json!({"spec": {"rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head",
        "image": "ray:2", "ports": [{"name": "serve", "containerPort": 8000}]}]}}}}}});
    api.patch("llm", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    while !leader(&controllers[other]) {
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "no failover within 15 s\n{}",
            controllers[other].logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let failover = killed.elapsed();
    println!("failover after {failover:?}");
    let old = api
        .get("llm")
        .await
        .unwrap()
        .status
        .unwrap()
        .active_service_status
        .unwrap()
        .ray_cluster_name
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = api.get("llm").await.unwrap().status.unwrap();
        let active = s.active_service_status.and_then(|a| a.ray_cluster_name);
        if active.is_some_and(|a| a != old) && s.pending_service_status.is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new leader did not finish the upgrade\n{}",
            controllers[other].logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(writes(&controllers[other]) > 0.0);
    let _ = controllers[first].child.wait();
    controllers[first].alive();
}

fn freeze(c: &ControllerProcess, sig: Sig) {
    assert!(signal::process(c.child.id(), sig));
}

/// A leader frozen (SIGSTOP, as a long GC pause or a partition would) while the other replica takes over
/// must write nothing when it wakes: its own clock tells it the last renewal is too old, before its campaign
/// has even re-read the Lease. The new leader is frozen too while the spec changes, so any write that
/// happens after the wake-up can only be the old leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_wakes_after_losing_its_lease_writes_nothing() {
    let cp = control_plane_with_kuberay();
    let client = cp.client().await;
    assert!(cp.crds_established(&client).await);
    let ns = cp.namespace(&client, "frozen").await;
    let dashboard = FakeDashboard::start().await;
    let args = ["--leader-elect", "--leader-election-namespace", ns.as_str()];
    let controllers = [
        ControllerProcess::start(cp, &ns, &dashboard.url_template(), &args),
        ControllerProcess::start(cp, &ns, &dashboard.url_template(), &args),
    ];
    let wait_leader = |i: usize, secs: u64| {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let c = &controllers[i];
        async move {
            while !leader(c) {
                assert!(
                    Instant::now() < deadline,
                    "controller {i} never led\n{}",
                    c.logs()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        if let Some(i) = (0..2).find(|i| leader(&controllers[*i])) {
            break i;
        }
        assert!(Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let other = 1 - first;
    let api: Api<RayService> = Api::namespaced(client.clone(), &ns);
    let rs: RayService = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "llm"},
        "spec": {"managedBy": "rayshift.io/controller",
            "serveConfigV2": "applications:\n  - name: app\n    import_path: m:app\n",
            "rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "ray:1",
                "ports": [{"name": "serve", "containerPort": 8000}]}]}}}}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &rs).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while api
        .get("llm")
        .await
        .unwrap()
        .status
        .and_then(|s| s.active_service_status)
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "no active cluster\n{}",
            controllers[first].logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let writes = |c: &ControllerProcess| c.counter_sum("rayshift_kubernetes_writes_total");
    let clusters: Api<rayshift_api::RayCluster> = Api::namespaced(client.clone(), &ns);
    let count = || async { clusters.list(&Default::default()).await.unwrap().items.len() };
    // Let the leader settle, then freeze it until the other replica leads.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = writes(&controllers[first]);
    freeze(&controllers[first], Sig::STOP);
    wait_leader(other, 20).await;
    // Freeze the new leader too, with a fresh Lease, and give the old one work to do.
    freeze(&controllers[other], Sig::STOP);
    let clusters_before = count().await;
    let patch = json!({"spec": {"rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head",
        "image": "ray:2", "ports": [{"name": "serve", "containerPort": 8000}]}]}}}}}});
    api.patch("llm", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    freeze(&controllers[first], Sig::CONT);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = writes(&controllers[first]);
    let clusters_after = count().await;
    freeze(&controllers[other], Sig::CONT);
    assert_eq!(
        (after, clusters_after),
        (before, clusters_before),
        "the old leader wrote after it woke\n{}",
        support::wait::tail(&controllers[first].logs(), 30)
    );
    assert!(!leader(&controllers[first]), "it still says it leads");
    // The real leader goes on and starts the upgrade.
    let deadline = Instant::now() + Duration::from_secs(60);
    while count().await <= clusters_before {
        assert!(
            Instant::now() < deadline,
            "the leader did not go on\n{}",
            controllers[other].logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `/readyz` says 503 while the replica cannot tell who leads (here: the Lease's namespace does not exist yet),
/// and 200 once it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_until_it_knows_who_leads() {
    use k8s_openapi::api::core::v1::Namespace;
    let cp = control_plane_with_kuberay();
    let client = cp.client().await;
    assert!(cp.crds_established(&client).await);
    let ns = cp.namespace(&client, "readyz").await;
    let dashboard = FakeDashboard::start().await;
    let lease_ns = format!("{ns}-leases");
    let args = ["--leader-elect", "--leader-election-namespace", lease_ns.as_str()];
    let c = ControllerProcess::start(cp, &ns, &dashboard.url_template(), &args);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(c.readyz(), 503, "ready without knowing the leader\n{}", c.logs());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": lease_ns}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while c.readyz() != 200 {
        assert!(Instant::now() < deadline, "never ready\n{}", c.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(leader(&c));
}
