//! The controller end to end on a real kube-apiserver: the real KubeRay operator running the RayClusters
//! (kube-scheduler and kwok running their Pods), a fake Ray dashboard with the real API's shapes (kwok's Pods
//! run no Ray), the real `rayshift controller` process.
//!
//! Two tests keep test code in KubeRay's place, each for a reason given there.

mod support;

use std::{
    future::Future,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use rayshift_api::{RayCluster, RayService};
use serde_json::{Value, json};
use support::{
    cluster::{ControlPlane, control_plane, control_plane_with_kuberay},
    controller::ControllerProcess,
    dashboard::FakeDashboard,
    kuberay::KubeRayStandIn,
    status::{active, cluster_names, condition, pending},
};

struct Env {
    cp: &'static ControlPlane,
    client: Client,
    ns: String,
    dashboard: FakeDashboard,
    /// `None`: the real KubeRay operator runs the clusters.
    kuberay: Option<KubeRayStandIn>,
    controller: ControllerProcess,
}

/// Who runs the RayClusters.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Clusters {
    /// The real KubeRay operator (its RayCluster controller), with kube-scheduler and kwok.
    KubeRay,
    /// Test code, for a state the real operator cannot produce quickly. On a control plane of its own, where
    /// KubeRay does not run.
    StandIn,
}

/// Test code creates these before the controller starts (a RayService KubeRay used to manage).
type Before = Box<dyn FnOnce(Client, String) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

impl Env {
    async fn new(prefix: &str) -> Self {
        Self::with(prefix, |_| {}, &[]).await
    }

    async fn with(prefix: &str, setup: impl FnOnce(&FakeDashboard), extra: &[&str]) -> Self {
        Self::full(prefix, setup, extra, None, Clusters::KubeRay).await
    }

    async fn full(
        prefix: &str,
        setup: impl FnOnce(&FakeDashboard),
        extra: &[&str],
        before: Option<Before>,
        clusters: Clusters,
    ) -> Self {
        let cp = match clusters {
            Clusters::KubeRay => control_plane_with_kuberay(),
            Clusters::StandIn => control_plane(),
        };
        let client = cp.client().await;
        assert!(cp.crds_established(&client).await);
        let ns = cp.namespace(&client, prefix).await;
        let dashboard = FakeDashboard::start().await;
        setup(&dashboard);
        if let Some(before) = before {
            before(client.clone(), ns.clone()).await;
        }
        let kuberay = (clusters == Clusters::StandIn).then(|| KubeRayStandIn::start(client.clone(), &ns));
        let controller = ControllerProcess::start(cp, &ns, &dashboard.url_template(), extra);
        Env {
            cp,
            client,
            ns,
            dashboard,
            kuberay,
            controller,
        }
    }

    fn rayservices(&self) -> Api<RayService> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn clusters(&self) -> Api<RayCluster> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn create(&self, rs: Value) -> RayService {
        let rs: RayService = serde_json::from_value(rs).unwrap();
        self.rayservices()
            .create(&PostParams::default(), &rs)
            .await
            .unwrap()
    }

    async fn get(&self, name: &str) -> RayService {
        self.rayservices().get(name).await.unwrap()
    }

    /// Polls `check` until it returns Some, or fails with the controller's logs.
    async fn eventually<T, F, Fut>(&self, what: &str, secs: u64, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        support::wait::eventually(what, secs, Duration::from_millis(100), check, || async {
            format!(
                "--- objects ---\n{}\n--- controller logs (last 25 lines) ---\n{}\n--- KubeRay ---\n{}",
                self.cp.kubectl(&[
                    "get",
                    "rayservices,rayclusters,pods,events",
                    "-n",
                    &self.ns,
                    "-o",
                    "wide"
                ]) + &self.cp.kubectl(&[
                    "get",
                    "rayservices",
                    "-n",
                    &self.ns,
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name}: {.status}{\"\\n\"}{end}"
                ]),
                support::wait::tail(&self.controller.logs(), 25),
                self.cp.kuberay_log(15)
            )
        })
        .await
    }

    async fn ready(&self, name: &str) -> RayService {
        self.eventually(&format!("{name} Ready"), 60, || async {
            let rs = self.get(name).await;
            let ready = condition(&rs, "Ready").is_some_and(|c| c.0 == "True");
            ready.then_some(rs)
        })
        .await
    }

    async fn serve_selector(&self, name: &str) -> Option<String> {
        let svc = self
            .services()
            .get_opt(&format!("{name}-serve-svc"))
            .await
            .unwrap()?;
        svc.spec?.selector?.get("ray.io/cluster").cloned()
    }

    /// The first Event of `reason` in the namespace, waited for up to 90 s.
    async fn first_event(&self, reason: &str) -> Value {
        self.eventually(&format!("a {reason} Event"), 90, || async {
            self.cp
                .events(&self.ns)
                .into_iter()
                .find(|e| e["reason"] == reason)
        })
        .await
    }

    /// Asserts that a failure every pass meets again backs off: `count` (its attempts so far) grows by 1–4 over
    /// 40 s, counted from 5 s after now (passes woken by the cluster's last changes fail too), and it is one
    /// Event of `reason` whose series counts the repeats.
    async fn assert_backs_off(&self, attempts: &str, count: impl Fn() -> f64, reason: &str) {
        self.assert_attempts_back_off(attempts, count).await;
        let events = self.events_of(reason);
        assert!(
            events[0]["series"]["count"].as_i64().unwrap_or(1) >= 2,
            "its repeats are counted in its series: {events:#?}"
        );
    }

    /// The attempts half of `assert_backs_off`.
    async fn assert_attempts_back_off(&self, attempts: &str, count: impl Fn() -> f64) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let before = count();
        tokio::time::sleep(Duration::from_secs(40)).await;
        let grew = count() - before;
        println!("{grew} {attempts} in 40 s");
        // Backing off (5, 10, 20, 40 s ...) fits at most 3 retries in 40 s, and a woken pass; every 5 s would be 8.
        assert!(
            (1.0..=4.0).contains(&grew),
            "{grew} {attempts} in 40 s\n{}",
            support::wait::tail(&self.controller.logs(), 20)
        );
    }

    /// The one Event of `reason` (one message, one Event).
    fn events_of(&self, reason: &str) -> Vec<Value> {
        let events: Vec<_> = self
            .cp
            .events(&self.ns)
            .into_iter()
            .filter(|e| e["reason"] == reason)
            .collect();
        assert_eq!(events.len(), 1, "one message, one Event: {events:#?}");
        events
    }

    async fn events(&self) -> Vec<(String, String)> {
        self.cp
            .events(&self.ns)
            .iter()
            .map(|e| {
                (
                    e["reason"].as_str().unwrap_or_default().to_string(),
                    e["note"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }
}

fn rayservice(name: &str, strategy: Option<&str>, image: &str) -> Value {
    let mut spec = json!({
        "managedBy": "rayshift.io/controller",
        "rayClusterDeletionDelaySeconds": 3,
        "serveConfigV2": "applications:\n  - name: llm\n    import_path: serve_llm:app\n    route_prefix: /\n    deployments:\n      - name: LLM\n        num_replicas: 2\n",
        "rayClusterConfig": {
            "rayVersion": "2.46.0",
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "ray-head", "image": image,
                "ports": [{"name": "dashboard", "containerPort": 8265}, {"name": "serve", "containerPort": 8000}]}]}}},
            "workerGroupSpecs": [{"groupName": "cpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 2,
                "template": {"spec": {"containers": [{"name": "ray-worker", "image": image}], "runtimeClassName": "nvidia"}}}]
        }
    });
    if let Some(s) = strategy {
        spec["upgradeStrategy"] = json!({"type": s});
    }
    json!({"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": name, "labels": {"team": "ml"}}, "spec": spec})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_deployment_becomes_ready() {
    let env = Env::new("first").await;
    env.create(rayservice("llm", None, "ray:1")).await;
    let rs = env.ready("llm").await;
    let active = active(&rs).expect("an active cluster");
    assert_eq!(pending(&rs), None);
    assert_eq!(
        condition(&rs, "UpgradeInProgress"),
        Some(("False".into(), "NoPendingCluster".into()))
    );
    let status = rs.status.as_ref().unwrap();
    assert_eq!(status.service_status.as_deref(), Some("Running"));
    // The worker, and the head once its Serve proxy answered its health check.
    assert_eq!(status.num_serve_endpoints, Some(2));
    assert_eq!(status.observed_generation, rs.metadata.generation);
    let apps = status
        .active_service_status
        .as_ref()
        .unwrap()
        .application_statuses
        .as_ref()
        .unwrap();
    assert_eq!(apps["llm"].status.as_deref(), Some("RUNNING"));

    // The cluster: KubeRay's labels, owned by the RayService, every field the user wrote.
    let cluster = env.clusters().get(&active).await.unwrap();
    assert_eq!(cluster.labels()["ray.io/originated-from-crd"], "RayService");
    assert_eq!(cluster.labels()["ray.io/originated-from-cr-name"], "llm");
    assert_eq!(cluster.labels()["team"], "ml");
    assert_eq!(cluster.owner_references()[0].kind, "RayService");
    // (KubeRay's released CRD prunes fields it does not know, so the user's fields are the ones it knows.)
    assert_eq!(
        serde_json::to_value(&cluster.spec.worker_groups()[0]).unwrap()["template"]["spec"]["runtimeClassName"],
        json!("nvidia")
    );
    // Services select it; the dashboard got the config once.
    assert_eq!(env.serve_selector("llm").await.as_deref(), Some(active.as_str()));
    let head = env.services().get("llm-head-svc").await.unwrap();
    assert_eq!(head.spec.unwrap().selector.unwrap()["ray.io/cluster"], active);
    let dash = env.dashboard.get(&env.ns, &active);
    assert_eq!(dash.puts.len(), 1);
    assert_eq!(
        dash.puts[0]["applications"][0]["deployments"][0]["num_replicas"],
        2
    );
    // The cluster records the Serve config it runs from its creation on: no second write to say so.
    let config = rs.spec.serve_config_v2.clone().unwrap();
    assert_eq!(
        cluster.annotations().get("rayshift.io/serve-config"),
        Some(&config)
    );
    let writes = |kind: &str| -> Vec<String> {
        let kind = format!("kind=\"{kind}\"");
        env.controller
            .metrics()
            .lines()
            .filter(|l| l.starts_with("rayshift_kubernetes_writes_total{") && l.contains(&kind))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        writes("RayCluster"),
        ["rayshift_kubernetes_writes_total{kind=\"RayCluster\",verb=\"apply\"} 1"],
        "one write of the cluster: its creation"
    );
    // KubeRay writes the cluster's status several times on the way (head ready, then every Pod); the
    // RayService's copy of it is for display, so only the pending cluster's name and Ready are writes.
    assert_eq!(
        writes("RayService"),
        ["rayshift_kubernetes_writes_total{kind=\"RayService\",verb=\"status\"} 2"],
        "status writes of the RayService"
    );
    let events = env.events().await;
    assert!(events.iter().any(|(r, _)| r == "CreatedRayCluster"), "{events:?}");
    assert!(
        events.iter().any(|(r, _)| r == "UpdatedServeApplications"),
        "{events:?}"
    );
    // `kubectl describe` shows readable conditions and events.
    let described = env.cp.kubectl(&["describe", "rayservice", "llm", "-n", &env.ns]);
    assert!(described.contains("NonZeroServeEndpoints"), "{described}");
    assert!(described.contains("Created RayCluster"), "{described}");
}

/// The Services as KubeRay builds them (`BuildServiceForHeadPod`, `BuildServeService`): `serviceType` types both,
/// a `headService` is the head Service's base. A head with no Serve port gets an Event that says so, not a
/// serve Service the apiserver refuses for having no port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_follow_the_head_group_and_a_missing_serve_port_is_named() {
    let env = Env::new("services").await;
    let mut typed = rayservice("typed", None, "ray:1");
    let head = &mut typed["spec"]["rayClusterConfig"]["headGroupSpec"];
    head["serviceType"] = json!("NodePort");
    head["headService"] = json!({"metadata": {"annotations": {"lb.example/internal": "true"}},
        "spec": {"externalTrafficPolicy": "Local"}});
    env.create(typed).await;
    let mut portless = rayservice("portless", None, "ray:1");
    portless["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"] =
        json!([{"name": "dashboard", "containerPort": 8265}]);
    env.create(portless).await;

    env.ready("typed").await;
    let head = env.services().get("typed-head-svc").await.unwrap();
    let spec = head.spec.clone().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("NodePort"), "{head:#?}");
    assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
    assert_ne!(spec.cluster_ip.as_deref(), Some("None"), "not headless");
    assert_eq!(head.annotations()["lb.example/internal"], "true");
    let serve = env.services().get("typed-serve-svc").await.unwrap();
    assert_eq!(serve.spec.unwrap().type_.as_deref(), Some("NodePort"));

    let failed = env.first_event("ReconcileFailed").await;
    let note = failed["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("no Serve port") && note.contains("'serve'"),
        "{note}"
    );
    assert_eq!(failed["regarding"]["name"], "portless");
    assert!(
        env.services()
            .get_opt("portless-serve-svc")
            .await
            .unwrap()
            .is_none()
    );
    let rs = env.get("portless").await;
    assert_ne!(condition(&rs, "Ready").map(|c| c.0), Some("True".into()));
}

/// The dashboard is asked on the head's port named `dashboard` (`{dashboardPort}`, in the default URL template
/// too), as KubeRay's client reads it off the head Service. Cluster DNS does not resolve here, so the fake
/// dashboard stands for every head and the template puts the port where the fake sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_is_asked_on_the_heads_dashboard_port() {
    let cp = control_plane_with_kuberay();
    let client = cp.client().await;
    let ns = cp.namespace(&client, "dashport").await;
    let dashboard = FakeDashboard::start().await;
    let base = dashboard.url_template();
    let template = format!("--dashboard-url-template={base}-{{dashboardPort}}");
    let health = format!("--serve-health-url-template={base}/-/healthz");
    let controller = ControllerProcess::start(cp, &ns, &base, &[&template, &health]);
    let env = Env {
        cp,
        client,
        ns,
        dashboard,
        kuberay: None,
        controller,
    };
    let mut rs = rayservice("llm", None, "ray:1");
    rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"] =
        json!([{"name": "dashboard", "containerPort": 8266}, {"name": "serve", "containerPort": 8000}]);
    env.create(rs).await;
    let rs = env.ready("llm").await;
    let active = active(&rs).expect("an active cluster");
    let asked = env.dashboard.get(&env.ns, &format!("{active}-8266"));
    assert_eq!(asked.puts.len(), 1, "the Serve config went to port 8266");
    assert!(asked.gets > 0);
    assert_eq!(env.dashboard.get(&env.ns, &format!("{active}-8265")).gets, 0);
}

/// A restarted controller (or a new leader) reads the Serve config a cluster runs from the cluster: no second
/// PUT and no `UpdatedServeApplications` event for a config that did not change; a changed one is pushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_pushes_only_a_changed_serve_config() {
    let mut env = Env::new("repush").await;
    env.create(rayservice("llm", None, "ray:1")).await;
    let rs = env.ready("llm").await;
    let cluster = active(&rs).unwrap();
    let puts = || env.dashboard.get(&env.ns, &cluster).puts.len();
    let pushed = |events: Vec<(String, String)>| {
        events
            .iter()
            .filter(|(r, _)| r == "UpdatedServeApplications")
            .count()
    };
    let (puts_before, pushed_before) = (puts(), pushed(env.events().await));
    assert_eq!((puts_before, pushed_before), (1, 1));
    let _ = env.controller.child.kill();
    let _ = env.controller.child.wait();
    env.controller = ControllerProcess::start(env.cp, &env.ns, &env.dashboard.url_template(), &[]);
    let passes = || {
        env.controller
            .counter_sum("rayshift_reconcile_duration_seconds_count")
    };
    env.eventually("a pass of the restarted controller", 30, || async {
        (passes() >= 1.0).then_some(())
    })
    .await;
    // Its first pass read Serve (the apps run) and the cluster's record; give a second one time too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(puts(), puts_before, "the same config PUT again after a restart");
    assert_eq!(pushed(env.events().await), pushed_before);
    let changed = format!("{}# revised\n", rs.spec.serve_config_v2.clone().unwrap());
    env.rayservices()
        .patch(
            "llm",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"serveConfigV2": changed}})),
        )
        .await
        .unwrap();
    env.eventually("the changed config pushed and recorded", 30, || async {
        let c = env.clusters().get(&cluster).await.unwrap();
        let recorded = c.annotations().get("rayshift.io/serve-config") == Some(&changed);
        (puts() == puts_before + 1 && recorded).then_some(())
    })
    .await;
    assert_eq!(pushed(env.events().await), pushed_before + 1);
}

/// The controller talks HTTP/2 to kube-apiserver: its watches and writes share one connection, where kube's
/// HTTP/1.1 stack holds one per watch and per request in flight (`--kube-api-http2=false`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_watches_share_one_http2_connection() {
    let env = Env::new("http2").await;
    env.create(rayservice("llm", None, "ray:1")).await;
    env.ready("llm").await;
    let port: u16 = env
        .cp
        .server
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let http2 = env.controller.connections_to(port);
    let ns = env.cp.namespace(&env.client, "http1").await;
    let http1 = ControllerProcess::start(
        env.cp,
        &ns,
        &env.dashboard.url_template(),
        &["--kube-api-http2=false"],
    );
    env.eventually("the HTTP/1.1 controller ready", 30, || async {
        (http1.readyz() == 200).then_some(())
    })
    .await;
    // Ready means every cache has listed, not that every watch has opened its connection yet (the CI of
    // f9882e9 counted 2 at readiness): wait for them, as the HTTP/2 count is taken well after readiness.
    let http1_count = env
        .eventually("5 or more HTTP/1.1 connections (one per watch)", 30, || async {
            let n = http1.connections_to(port);
            (n >= 5).then_some(n)
        })
        .await;
    println!("connections to the apiserver: HTTP/2 {http2}, HTTP/1.1 {http1_count}");
    assert!((1..=2).contains(&http2), "HTTP/2: {http2} connections");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_cluster_upgrade_switches_only_to_a_ready_cluster_and_deletes_the_old_one_after_the_delay() {
    let env = Env::new("bluegreen").await;
    env.create(rayservice("llm", Some("NewCluster"), "ray:1")).await;
    let old = active(&env.ready("llm").await).unwrap();

    // New clusters' apps stay DEPLOYING until the test releases them.
    env.dashboard.new_clusters.lock().unwrap().app_status = Some("DEPLOYING".into());
    let patch = json!({"spec": {"rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [
        {"name": "ray-head", "image": "ray:2", "ports": [{"name": "dashboard", "containerPort": 8265}, {"name": "serve", "containerPort": 8000}]}]}}}}}});
    env.rayservices()
        .patch("llm", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let new = env
        .eventually("a pending cluster", 30, || async {
            pending(&env.get("llm").await)
        })
        .await;
    assert_ne!(new, old);
    let rs = env.get("llm").await;
    assert_eq!(
        condition(&rs, "UpgradeInProgress"),
        Some(("True".into(), "BothActivePendingClustersExist".into()))
    );
    // The new config reached only the new cluster; traffic stays on the old one while the new is not ready.
    env.eventually("the new cluster's config", 20, || async {
        (!env.dashboard.get(&env.ns, &new).puts.is_empty()).then_some(())
    })
    .await;
    for _ in 0..15 {
        assert_eq!(
            env.serve_selector("llm").await.as_deref(),
            Some(old.as_str()),
            "traffic moved to an unready cluster"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        env.dashboard.get(&env.ns, &old).puts.len(),
        1,
        "the old cluster never receives the new config"
    );

    // Release: promotion, Services switch, the old cluster lives until the deletion delay.
    env.dashboard.with(&env.ns, &new, |s| s.app_status = None);
    env.eventually("promotion", 30, || async {
        let rs = env.get("llm").await;
        (active(&rs).as_deref() == Some(new.as_str()) && pending(&rs).is_none()).then_some(())
    })
    .await;
    let promoted_at = Instant::now();
    assert_eq!(env.serve_selector("llm").await.as_deref(), Some(new.as_str()));
    assert!(
        env.clusters().get_opt(&old).await.unwrap().is_some(),
        "old cluster kept for the deletion delay"
    );
    let clusters = env.clusters();
    env.eventually("old cluster deleted", 30, || support::wait::gone(&clusters, &old))
        .await;
    let waited = promoted_at.elapsed();
    assert!(
        waited >= Duration::from_millis(2000),
        "deleted after {waited:?}, before the 3 s delay"
    );
    let events = env.events().await;
    assert!(events.iter().any(|(r, _)| r == "Promoted"), "{events:?}");
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "DeletedRayCluster" && n.contains(&old)),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_serves_only_while_its_serve_proxy_is_healthy() {
    let env = Env::new("headlabel").await;
    env.create(rayservice("llm", None, "ray:1")).await;
    let rs = env.ready("llm").await;
    let cluster = active(&rs).unwrap();
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let heads = pods
        .list(&ListParams::default().labels(&format!("ray.io/cluster={cluster},ray.io/node-type=head")))
        .await
        .unwrap();
    let head = heads.items[0].name_any();
    let label = |want: &'static str| {
        let pods = pods.clone();
        let head = head.clone();
        move || {
            let (pods, head) = (pods.clone(), head.clone());
            async move {
                let pod = pods.get(&head).await.unwrap();
                (pod.labels().get("ray.io/serve").map(String::as_str) == Some(want)).then_some(())
            }
        }
    };
    // KubeRay starts the head outside the serve Service; a healthy proxy brings it in.
    env.eventually("the head labelled ray.io/serve=true", 30, label("true"))
        .await;
    assert!(
        env.events()
            .await
            .iter()
            .any(|(reason, note)| reason == "UpdatedHeadPodServeLabel" && note.contains("\"true\"")),
        "{:?}",
        env.events().await
    );
    // A failing proxy takes it out (after a few failed checks), a healthy one brings it back.
    env.dashboard.with(&env.ns, &cluster, |s| s.proxy_down = true);
    env.eventually("the head labelled ray.io/serve=false", 30, label("false"))
        .await;
    env.eventually("numServeEndpoints 1", 30, || async {
        (env.get("llm").await.status?.num_serve_endpoints == Some(1)).then_some(())
    })
    .await;
    env.dashboard.with(&env.ns, &cluster, |s| s.proxy_down = false);
    env.eventually("the head labelled ray.io/serve=true again", 30, label("true"))
        .await;
    // excludeHeadPodFromServeSvc keeps it out whatever its health.
    env.rayservices()
        .patch(
            "llm",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"excludeHeadPodFromServeSvc": true}})),
        )
        .await
        .unwrap();
    env.eventually("the head excluded", 30, label("false")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn none_strategy_updates_the_cluster_in_place() {
    let env = Env::new("inplace").await;
    env.create(rayservice("llm", Some("None"), "ray:1")).await;
    updates_in_place(&env).await;
}

/// KubeRay's operator settings, read as KubeRay reads them: with `ENABLE_ZERO_DOWNTIME=false` a RayService that
/// names no upgrade type is updated as with None; with `ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE=true` its head
/// Service has a cluster IP instead of being headless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kuberay_settings_zero_downtime_off_and_a_head_cluster_ip() {
    let flags = [
        "--enable-zero-downtime=FALSE",
        "--enable-ray-head-cluster-ip-service=True",
    ];
    let env = Env::with("kuberayenv", |_| {}, &flags).await;
    env.create(rayservice("llm", None, "ray:1")).await;
    updates_in_place(&env).await;
    let head = env.services().get("llm-head-svc").await.unwrap().spec.unwrap();
    let ip = head.cluster_ip.unwrap_or_default();
    assert!(
        !ip.is_empty() && ip != "None",
        "a cluster IP, not headless: {ip:?}"
    );
}

/// Changes the worker image of `llm`, which runs one cluster: the cluster takes it, no new cluster is built.
async fn updates_in_place(env: &Env) {
    let cluster = active(&env.ready("llm").await).unwrap();
    let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": [{"groupName": "cpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 2,
        "template": {"spec": {"containers": [{"name": "ray-worker", "image": "ray:2"}]}}}]}}});
    env.rayservices()
        .patch("llm", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    env.eventually("in-place update", 30, || async {
        let c = env.clusters().get(&cluster).await.unwrap();
        let image = serde_json::to_value(&c.spec.worker_groups()[0].template).unwrap()["spec"]["containers"]
            [0]["image"]
            .clone();
        (image == "ray:2").then_some(())
    })
    .await;
    let all = env.clusters().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all.len(), 1, "no new cluster with strategy None");
    let rs = env.get("llm").await;
    assert_eq!(active(&rs).as_deref(), Some(cluster.as_str()));
    assert_eq!(pending(&rs), None);
}

/// Without the Ray autoscaler, nothing but rayshift can apply a change of `replicas`: it goes to the running
/// cluster in place, for both strategies, and the real KubeRay operator scales the worker Pods to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_replicas_are_applied_in_place_without_the_autoscaler() {
    let env = Env::new("replicas").await;
    env.create(rayservice("llm", None, "ray:1")).await;
    env.create(rayservice("fixed", Some("None"), "ray:1")).await;
    for name in ["llm", "fixed"] {
        let cluster = active(&env.ready(name).await).unwrap();
        let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": [{"groupName": "cpu", "replicas": 2, "minReplicas": 1, "maxReplicas": 2,
            "template": {"spec": {"containers": [{"name": "ray-worker", "image": "ray:1"}], "runtimeClassName": "nvidia"}}}]}}});
        env.rayservices()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
        let workers = format!("ray.io/cluster={cluster},ray.io/node-type=worker");
        env.eventually(&format!("{name}: two worker Pods"), 60, || async {
            let c = env.clusters().get(&cluster).await.unwrap();
            let listed = pods.list(&ListParams::default().labels(&workers)).await.unwrap();
            (c.spec.worker_groups()[0].replicas == Some(2) && listed.items.len() == 2).then_some(())
        })
        .await;
        let rs = env.get(name).await;
        assert_eq!(
            active(&rs).as_deref(),
            Some(cluster.as_str()),
            "{name}: no new cluster"
        );
        assert_eq!(pending(&rs), None, "{name}");
    }
    let all = env.clusters().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all.len(), 2, "one cluster each");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rayservice_managed_by_another_controller_is_left_alone() {
    // Test code in KubeRay's place: with nothing else reconciling it, any status or cluster would be rayshift's.
    // (With the real operator reconciling it instead: tests/kuberay_operator_e2e.rs.)
    let env = Env::full("foreign", |_| {}, &[], None, Clusters::StandIn).await;
    let mut rs = rayservice("kuberays", None, "ray:1");
    rs["spec"]["managedBy"] = json!("ray.io/kuberay-operator");
    env.create(rs).await;
    env.create(rayservice("ours", None, "ray:1")).await;
    env.ready("ours").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let theirs = env.get("kuberays").await;
    assert!(theirs.status.is_none(), "no status written: {:?}", theirs.status);
    let clusters = env
        .clusters()
        .list(&ListParams::default().labels("ray.io/originated-from-cr-name=kuberays"))
        .await
        .unwrap();
    assert!(clusters.items.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_down_is_a_condition_and_an_event_then_recovers() {
    let env = Env::with("dashdown", |d| d.new_clusters.lock().unwrap().down = true, &[]).await;
    env.create(rayservice("llm", None, "ray:1")).await;
    let rs = env
        .eventually("DashboardUnreachable", 60, || async {
            let rs = env.get("llm").await;
            (condition(&rs, "Ready").map(|c| c.1).as_deref() == Some("DashboardUnreachable")).then_some(rs)
        })
        .await;
    assert_eq!(condition(&rs, "Ready").unwrap().0, "False");
    let events = env.events().await;
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "DashboardUnreachable" && n.contains("503")),
        "{events:?}"
    );
    let gets = env.dashboard.sum_in(&env.ns, |s| s.gets);
    assert!(gets >= 2, "retried");
    // The dashboard's error counter (each failed attempt) is what its panel shows.
    assert!(env.controller.counter_sum("rayshift_ray_dashboard_errors_total") >= 2.0);
    env.dashboard.with_each(&env.ns, |s| s.down = false);
    env.ready("llm").await;
    let mut controller = env.controller;
    assert!(controller.alive(), "no crash");
}

/// KubeRay 1.6's `ray.io/initializing-timeout`: a RayService whose first cluster never serves (its apps stay
/// DEPLOYING) fails at the timeout, for good: Ready False `InitializingTimeout` in KubeRay's words, a
/// `RayServiceInitializingTimeout` Event, no cluster named, the cluster deleted after the deletion delay (the GPUs
/// it held are free), and a new spec builds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rayservice_that_never_serves_fails_at_its_initializing_timeout() {
    const TIMEOUT: u64 = 20;
    let deploying = |d: &FakeDashboard| d.new_clusters.lock().unwrap().app_status = Some("DEPLOYING".into());
    let env = Env::with("inittimeout", deploying, &[]).await;
    let mut rs = rayservice("llm", None, "ray:1");
    rs["metadata"]["annotations"] = json!({"ray.io/initializing-timeout": format!("{TIMEOUT}s")});
    env.create(rs).await;
    let first = env
        .eventually("a first cluster", 60, || async { pending(&env.get("llm").await) })
        .await;
    let failed = env
        .eventually("Ready=False/InitializingTimeout", 90, || async {
            let rs = env.get("llm").await;
            (condition(&rs, "Ready").map(|c| c.1).as_deref() == Some("InitializingTimeout")).then_some(rs)
        })
        .await;
    let ready = failed
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready");
    let message = ready.unwrap().message.clone();
    let prefix = format!(
        "RayService failed to become ready within the configured timeout of {TIMEOUT}s. Time spent initializing: "
    );
    let spent = message
        .strip_prefix(&prefix)
        .and_then(|s| s.strip_suffix('s'))
        .and_then(|s| s.parse::<f64>().ok());
    let spent = spent.unwrap_or_else(|| panic!("KubeRay's message: {message}"));
    // The pass wakes at the deadline; the bound is for a loaded machine.
    assert!(
        (TIMEOUT as f64..TIMEOUT as f64 + 10.0).contains(&spent),
        "{message}"
    );
    println!("initializing timeout {TIMEOUT} s: failed after {spent} s");
    assert_eq!((active(&failed), pending(&failed)), (None, None));
    assert_eq!(condition(&failed, "Ready").unwrap().0, "False");
    let event = env.first_event("RayServiceInitializingTimeout").await;
    let note = event["note"].as_str().unwrap_or_default();
    assert!(
        note.contains(&format!("(configured timeout: {TIMEOUT}s)")),
        "{note}"
    );
    assert_eq!(event["type"], "Warning");
    env.eventually(&format!("{first} deleted"), 60, || async {
        env.clusters()
            .get_opt(&first)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;

    // Terminal: a new spec builds no cluster and the condition stays.
    let image = json!({"spec": {"rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [
        {"name": "ray-head", "image": "ray:2"}]}}}}}});
    env.rayservices()
        .patch("llm", &PatchParams::default(), &Patch::Merge(&image))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let clusters = env.clusters().list(&ListParams::default()).await.unwrap();
    assert!(
        clusters.items.is_empty(),
        "{:?}",
        clusters.items.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );
    let after = env.get("llm").await;
    assert_eq!(
        condition(&after, "Ready").map(|c| c.1).as_deref(),
        Some("InitializingTimeout")
    );
    let events = env.events().await;
    let timeouts = events
        .iter()
        .filter(|(r, _)| r == "RayServiceInitializingTimeout")
        .count();
    assert_eq!(timeouts, 1, "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pod_whose_ray_container_died_is_not_healthy() {
    // Test code in KubeRay's place: kwok runs every container of a Pod alike, so a Running head Pod whose Ray
    // container terminated (a sidecar keeps the Pod Running) is a state only the stand-in produces at will.
    let env = Env::full("deadray", |_| {}, &[], None, Clusters::StandIn).await;
    let kuberay = env.kuberay.as_ref().unwrap();
    kuberay
        .all_heads_broken
        .store(true, std::sync::atomic::Ordering::SeqCst);
    env.create(rayservice("llm", None, "ray:1")).await;
    let cluster = env
        .eventually("a cluster", 30, || async { pending(&env.get("llm").await) })
        .await;
    // The head Pod exists and its phase is Running, but its Ray container terminated.
    env.eventually("head pod", 30, || async {
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
        let pod = pods.get_opt(&format!("{cluster}-head")).await.unwrap()?;
        (pod.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rs = env.get("llm").await;
    assert_ne!(condition(&rs, "Ready").map(|c| c.0).as_deref(), Some("True"));
    assert!(
        env.dashboard.get(&env.ns, &cluster).puts.is_empty(),
        "no dashboard call before the Ray container is up"
    );
    kuberay
        .all_heads_broken
        .store(false, std::sync::atomic::Ordering::Relaxed);
    env.ready("llm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_rayservice_removes_what_rayshift_created() {
    let env = Env::new("delete").await;
    env.create(rayservice("llm", None, "ray:1")).await;
    env.ready("llm").await;
    let series = format!("namespace=\"{}\"", env.ns);
    assert!(
        env.controller.metrics().contains(&series),
        "per-RayService series exist"
    );
    // A plain delete (background, as kubectl does): the RayService is gone at once and never reconciled again.
    env.rayservices()
        .delete("llm", &DeleteParams::default())
        .await
        .unwrap();
    env.eventually("children garbage-collected", 60, || async {
        let clusters = env.clusters().list(&ListParams::default()).await.unwrap().items;
        let services = env.services().list(&ListParams::default()).await.unwrap().items;
        (clusters.is_empty() && services.is_empty()).then_some(())
    })
    .await;
    let left = || -> Vec<String> {
        env.controller
            .metrics()
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains(&series))
            .map(str::to_string)
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !left().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        left().is_empty(),
        "series of the deleted RayService stayed: {:#?}\n{}",
        left(),
        support::wait::tail(&env.controller.logs(), 30)
    );
}

/// Records are kept per owner: deleting `llm` (foreground, so it is reconciled while it goes) must not make
/// rayshift forget the Serve config it pushed to `llm-v2`'s cluster, whose name starts with `llm-` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_llm_leaves_llm_v2_alone() {
    let env = Env::new("prefix").await;
    env.create(rayservice("llm", None, "ray:1")).await;
    env.create(rayservice("llm-v2", None, "ray:1")).await;
    env.ready("llm").await;
    let v2 = active(&env.ready("llm-v2").await).unwrap();
    let puts = env.dashboard.get(&env.ns, &v2).puts.len();
    env.rayservices()
        .delete("llm", &DeleteParams::foreground())
        .await
        .unwrap();
    let rayservices = env.rayservices();
    env.eventually("llm gone", 60, || support::wait::gone(&rayservices, "llm"))
        .await;
    let series = |name: &str| format!("name=\"{name}\",namespace=\"{}\"", env.ns);
    env.eventually("llm's series gone", 10, || async {
        (!env.controller.metrics().contains(&series("llm"))).then_some(())
    })
    .await;
    assert!(
        env.controller.metrics().contains(&series("llm-v2")),
        "llm-v2's series went too"
    );
    // A pass of llm-v2 (any change wakes it) must find its config record and push nothing.
    let nudge = json!({"metadata": {"annotations": {"test/nudge": "1"}}});
    env.rayservices()
        .patch("llm-v2", &PatchParams::default(), &Patch::Merge(&nudge))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        env.dashboard.get(&env.ns, &v2).puts.len(),
        puts,
        "llm-v2's Serve config was pushed again: its record was dropped with llm's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state_makes_zero_api_writes() {
    let env = Env::with("steady", |_| {}, &["--resync-interval-seconds", "3"]).await;
    env.create(rayservice("llm", None, "ray:1")).await;
    let rs = env.ready("llm").await;
    let cluster = active(&rs).unwrap();
    // Let the last status write and its echo settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let versions = || async {
        let rs = env.get("llm").await.resource_version();
        let c = env.clusters().get(&cluster).await.unwrap().resource_version();
        let s1 = env
            .services()
            .get("llm-serve-svc")
            .await
            .unwrap()
            .resource_version();
        let s2 = env
            .services()
            .get("llm-head-svc")
            .await
            .unwrap()
            .resource_version();
        (rs, c, s1, s2)
    };
    let before = versions().await;
    let writes_before = env.controller.counter_sum("rayshift_kubernetes_writes_total");
    let gets_before = env.dashboard.get(&env.ns, &cluster).gets;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(versions().await, before, "an object changed in steady state");
    assert_eq!(
        env.controller.counter_sum("rayshift_kubernetes_writes_total"),
        writes_before,
        "the controller wrote in steady state"
    );
    let gets = env.dashboard.get(&env.ns, &cluster).gets - gets_before;
    assert!(gets >= 5, "it kept watching Serve health ({gets} reads in 30 s)");
    assert!(
        gets <= 20,
        "no fixed 2 s polling when settled ({gets} reads in 30 s)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_over_from_kuberay_starts_no_upgrade() {
    // KubeRay created and reconciled this RayService (status at the current generation, its own cluster,
    // no rayshift digests); then the RayService is handed to rayshift.
    let before: Before = Box::new(|client: Client, ns: String| {
        Box::pin(async move {
            let services: Api<RayService> = Api::namespaced(client.clone(), &ns);
            let rs: RayService = serde_json::from_value(rayservice("llm", None, "ray:1")).unwrap();
            let rs = services.create(&PostParams::default(), &rs).await.unwrap();
            let spec = serde_json::to_value(&rs.spec.ray_cluster_config).unwrap();
            let cluster: RayCluster = serde_json::from_value(json!({
                "apiVersion": "ray.io/v1", "kind": "RayCluster",
                "metadata": {"name": "llm-kuber", "labels": {"ray.io/originated-from-cr-name": "llm", "ray.io/originated-from-crd": "RayService"},
                    "annotations": {"ray.io/hash-without-replicas-and-workers-to-delete": "SOMEGOHASH", "ray.io/num-worker-groups": "1"},
                    "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayService", "name": "llm", "uid": rs.metadata.uid, "controller": true}]},
                "spec": spec
            }))
            .unwrap();
            Api::<RayCluster>::namespaced(client.clone(), &ns)
                .create(&PostParams::default(), &cluster)
                .await
                .unwrap();
            let status = json!({"status": {"observedGeneration": rs.metadata.generation, "serviceStatus": "Running",
                "activeServiceStatus": {"rayClusterName": "llm-kuber"}}});
            services
                .patch_status("llm", &PatchParams::default(), &Patch::Merge(&status))
                .await
                .unwrap();
        })
    });
    let env = Env::full("adopt", |_| {}, &[], Some(before), Clusters::KubeRay).await;
    env.eventually("the KubeRay cluster adopted", 30, || async {
        let c = env.clusters().get("llm-kuber").await.unwrap();
        c.annotations()
            .contains_key("rayshift.io/spec-hash")
            .then_some(())
    })
    .await;
    let rs = env.ready("llm").await;
    assert_eq!(active(&rs).as_deref(), Some("llm-kuber"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rs = env.get("llm").await;
    assert_eq!(pending(&rs), None, "no upgrade started");
    let names = cluster_names(&env.clusters(), "").await;
    assert_eq!(names, vec!["llm-kuber".to_string()]);
    assert!(env.events().await.iter().any(|(r, _)| r == "AdoptedRayCluster"));
}

/// Creates rayshift's head Service `llm-head-svc` in a server-side dry run: what the test's policy denies.
fn head_service_dry_run(env: &Env) -> std::process::Output {
    env.cp.kubectl_output(&[
        "create",
        "service",
        "clusterip",
        "llm-head-svc",
        "--tcp=80",
        "-n",
        &env.ns,
        "--dry-run=server",
    ])
}

/// A write the apiserver refuses on its merits (here a ValidatingAdmissionPolicy denies rayshift's head
/// Service, as a cluster's own policy might) fails every pass the same way: the RayService shows why in one
/// Warning Event (a series), its retries back off instead of repeating every 5 s, and once the policy is gone a
/// change of the RayService runs a pass at once and it becomes Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_is_an_event_and_its_retries_back_off() {
    let env = Env::new("refused").await;
    let policy = format!("rayshift-test-{}", env.ns);
    let denial = "llm-head-svc is not allowed in this namespace";
    env.cp.kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: {policy}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - {{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE", "UPDATE"], resources: ["services"]}}
  validations:
    - {{expression: "object.metadata.name != 'llm-head-svc'", message: "{denial}"}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: {policy}}}
spec:
  policyName: {policy}
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {{kubernetes.io/metadata.name: {ns}}}
"#,
            ns = env.ns
        ),
    );
    // The apiserver takes a policy in from its informers a moment after it is stored: before that, rayshift's
    // head Service was created and the test waited for a denial in vain (CI of 6affdbd).
    env.eventually("the policy denies", 30, || async {
        let dry_run = head_service_dry_run(&env);
        String::from_utf8_lossy(&dry_run.stderr)
            .contains(denial)
            .then_some(())
    })
    .await;
    env.create(rayservice("llm", None, "ray:1")).await;
    let first = env.first_event("ReconcileFailed").await;
    assert_eq!(first["type"], "Warning");
    let note = first["note"].as_str().unwrap_or_default();
    assert!(note.contains(denial), "the Event says why: {note}");
    let errors = || {
        env.controller
            .metrics()
            .lines()
            .filter(|l| l.starts_with("rayshift_reconcile_errors_total{reason=\"kubernetes\"}"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    env.assert_backs_off("failed passes", errors, "ReconcileFailed")
        .await;
    let rs = env.get("llm").await;
    assert_ne!(condition(&rs, "Ready").map(|c| c.0).as_deref(), Some("True"));
    // What RayshiftRayServiceFailing alerts on.
    assert_eq!(env.controller.counter_sum("rayshift_rayservices_failing"), 1.0);

    env.cp
        .kubectl(&["delete", "validatingadmissionpolicybinding", &policy]);
    env.eventually("the policy no longer denies", 30, || async {
        head_service_dry_run(&env).status.success().then_some(())
    })
    .await;
    // A change of the RayService wakes it at once, whatever its backoff.
    let touch = json!({"metadata": {"annotations": {"example.com/touched": "1"}}});
    env.rayservices()
        .patch("llm", &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .unwrap();
    env.ready("llm").await;
    // The pass that wrote Ready ends just after.
    env.eventually("rayshift_rayservices_failing 0", 10, || async {
        (env.controller.counter_sum("rayshift_rayservices_failing") == 0.0).then_some(())
    })
    .await;
    env.cp.kubectl(&["delete", "validatingadmissionpolicy", &policy]);
}

/// A dashboard that refuses the cluster's token (Ray 2.52+'s token auth: 403 to a token it does not know) refuses
/// it again: the Serve status reads back off (5, 10, 20 s ...) instead of coming every serve poll (0.3 s here, 2 s
/// by default; 128 reads in the 40 s before the fix), with one `DashboardUnreachable` Event and the RayService
/// counted as failing. Once the dashboard takes the token again, the next retry finds it and the RayService
/// becomes Ready. The token is read from the Secret KubeRay's real operator made for the cluster, and sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_that_refuses_the_token_is_asked_again_with_backoff() {
    let env = Env::with(
        "refusedtoken",
        |d| d.new_clusters.lock().unwrap().refuse_tokens = true,
        &[],
    )
    .await;
    let mut rs = rayservice("llm", None, "ray:1");
    // KubeRay wants Ray 2.52 or later for token auth.
    rs["spec"]["rayClusterConfig"]["rayVersion"] = json!("2.60.0");
    rs["spec"]["rayClusterConfig"]["authOptions"] = json!({"mode": "token"});
    env.create(rs).await;
    let first = env.first_event("DashboardUnreachable").await;
    let note = first["note"].as_str().unwrap_or_default();
    // The Event says which Secret's token the head refused (KubeRay names it after the cluster).
    let cluster = env.dashboard.clusters(&env.ns).pop().unwrap_or_default();
    assert!(
        note.contains("403")
            && note.contains("Invalid authentication token")
            && note.contains(&format!("sent the token of Secret {}/{cluster}", env.ns)),
        "{note}"
    );
    let refused = || env.dashboard.sum_in(&env.ns, |s| s.refused_tokens) as f64;
    env.assert_attempts_back_off("refused Serve status reads", refused)
        .await;
    env.events_of("DashboardUnreachable");
    let carried = env.dashboard.sum_in(&env.ns, |s| s.refused_with_token);
    assert_eq!(
        carried as f64,
        refused(),
        "every call carried the token from KubeRay's Secret"
    );
    assert_eq!(env.controller.counter_sum("rayshift_rayservices_failing"), 1.0);
    let rs = env.get("llm").await;
    assert_eq!(
        condition(&rs, "Ready").map(|c| c.1).as_deref(),
        Some("DashboardUnreachable"),
        "{:?}",
        rs.status
    );

    // The head takes the token again (say it restarted with the Secret's): the next retry, at most 40 s away
    // by now, finds it.
    env.dashboard.with_each(&env.ns, |s| s.refuse_tokens = false);
    env.eventually("Ready after the backoff", 90, || async {
        let rs = env.get("llm").await;
        condition(&rs, "Ready")
            .is_some_and(|c| c.0 == "True")
            .then_some(())
    })
    .await;
    env.eventually("no longer counted as failing", 30, || async {
        (env.controller.counter_sum("rayshift_rayservices_failing") == 0.0).then_some(())
    })
    .await;
}

/// A Serve config the Ray dashboard refuses (400, as Ray 2.60 answers a config its schema or its controller
/// refuses) is refused again until the spec changes: one `FailedToUpdateServeApplications` Event whose series
/// counts the repeats, PUTs backing off instead of one every 5 s, and the corrected config pushed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_config_ray_refuses_backs_off_until_the_spec_changes() {
    let env = Env::with(
        "refusedcfg",
        |d| d.new_clusters.lock().unwrap().refuse_puts = true,
        &[],
    )
    .await;
    env.create(rayservice("llm", None, "ray:1")).await;
    let first = env.first_event("FailedToUpdateServeApplications").await;
    assert_eq!(first["type"], "Warning");
    let note = first["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("400") && note.contains("validation error for ServeDeploySchema"),
        "{note}"
    );
    let refused = || env.dashboard.sum_in(&env.ns, |s| s.refused_puts) as f64;
    env.assert_backs_off("refused PUTs", refused, "FailedToUpdateServeApplications")
        .await;
    let reconcile_failed = env
        .events()
        .await
        .into_iter()
        .filter(|(r, _)| r == "ReconcileFailed")
        .count();
    assert_eq!(
        reconcile_failed, 0,
        "the refusal has its own Event, not a second one"
    );
    assert_eq!(env.controller.counter_sum("rayshift_rayservices_failing"), 1.0);

    // The user corrects the config: the change runs a pass at once, whatever the backoff.
    env.dashboard.with_each(&env.ns, |s| s.refuse_puts = false);
    let fixed = json!({"spec": {"serveConfigV2": "applications:\n  - name: llm\n    import_path: serve_llm:app\n    route_prefix: /\n    deployments:\n      - name: LLM\n        num_replicas: 1\n"}});
    env.rayservices()
        .patch("llm", &PatchParams::default(), &Patch::Merge(&fixed))
        .await
        .unwrap();
    env.ready("llm").await;
}
