//! NewClusterWithIncrementalUpgrade end to end: real kube-apiserver with Gateway API CRDs, the real KubeRay
//! operator running the RayClusters (kube-scheduler and kwok running their Pods), fake Ray dashboard (kwok's
//! Pods run no Ray), Traefik as the Gateway controller, the real controller process. An observer
//! checks the invariants on every version of the RayService, HTTPRoute and RayClusters it sees.

mod support;

use std::{
    cell::{Cell, RefCell},
    collections::BTreeSet,
    time::{Duration, Instant},
};

use gateway_api::{gateways::Gateway, grpcroutes::GrpcRoute, httproutes::HttpRoute};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::PostParams;
use rayshift_api::RayCluster;
use serde_json::{Value, json};
use support::{
    autoscaler::{Autoscaler, GPU_TAINT, gpu_node},
    controller::ControllerProcess,
    dashboard::Fault,
    incremental::{self, Env, head},
    observer::Observer,
    status::{active, cluster_names, condition, pending},
    traefik,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_example_is_promoted_with_invariants_and_exact_pacing() {
    let env = Env::new("seed").await;
    let old = env.deploy(20, 5, 1).await;
    let observer = env.observe(20);
    let new = env.upgrade_to("ray:2").await;
    // Scrape the controller's /metrics throughout the upgrade.
    let controller = env.controller.as_ref().unwrap();
    let mut scrapes: Vec<(f64, f64, f64)> = Vec::new();
    let mut mid_upgrade = String::new();
    // (seen at, expected completion) each time the status's estimate changed.
    let mut estimates: Vec<(jiff::Timestamp, jiff::Timestamp)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = controller.metrics();
        let pending_cap = support::webhook::metric(
            &text,
            &format!(
                "rayshift_rayservice_target_capacity_percent{{name=\"llm\",namespace=\"{}\",role=\"pending\"}}",
                env.ns
            ),
        );
        let pending_traffic = support::webhook::metric(
            &text,
            &format!(
                "rayshift_rayservice_traffic_percent{{name=\"llm\",namespace=\"{}\",role=\"pending\"}}",
                env.ns
            ),
        );
        let active_cap = support::webhook::metric(
            &text,
            &format!(
                "rayshift_rayservice_target_capacity_percent{{name=\"llm\",namespace=\"{}\",role=\"active\"}}",
                env.ns
            ),
        );
        if pending_traffic > 0.0 && mid_upgrade.is_empty() {
            mid_upgrade = text.clone();
        }
        if scrapes.last() != Some(&(active_cap, pending_cap, pending_traffic)) {
            scrapes.push((active_cap, pending_cap, pending_traffic));
        }
        let rs = env.get().await;
        let eta = rs
            .status
            .as_ref()
            .and_then(|s| s.progress.upgrade_expected_completion_time);
        if let Some(eta) = eta.filter(|e| estimates.last().is_none_or(|(_, last)| last != e)) {
            estimates.push((jiff::Timestamp::now(), eta));
        }
        if active(&rs).as_deref() == Some(new.as_str()) && pending(&rs).is_none() {
            break;
        }
        assert!(Instant::now() < deadline, "upgrade did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check_expected_completion(&estimates, jiff::Timestamp::now());
    // The gauges followed the plan: pending traffic never above pending capacity, both only rising.
    assert!(scrapes.iter().all(|(_, c, t)| t <= c), "{scrapes:?}");
    assert!(
        scrapes
            .windows(2)
            .all(|w| w[1].2 >= w[0].2 || w[1] == (0.0, 0.0, 0.0) || w[1].1 == 0.0),
        "{scrapes:?}"
    );
    let capacities: Vec<f64> = scrapes.iter().map(|s| s.1).fold(Vec::new(), |mut v, c| {
        if v.last() != Some(&c) && c > 0.0 {
            v.push(c)
        }
        v
    });
    assert_eq!(
        capacities,
        vec![20.0, 40.0, 60.0, 80.0, 100.0],
        "pending capacity seen in /metrics: {scrapes:?}"
    );
    assert!(
        scrapes.iter().filter(|s| s.2 > 0.0).count() >= 10,
        "traffic steps seen in /metrics: {scrapes:?}"
    );
    check_dashboard_against(&mid_upgrade, controller).await;

    // The new cluster was created with worker replicas unset (it scales from minReplicas); KubeRay's released
    // schema stores the unset count as its default, 0, never the user's 5.
    let clusters: Api<RayCluster> = Api::namespaced(env.client.clone(), &env.ns);
    assert_eq!(
        clusters.get(&new).await.unwrap().spec.worker_groups()[0]
            .replicas
            .unwrap_or(0),
        0
    );
    // The old cluster goes after the deletion delay; the Gateway and HTTPRoute stay.
    env.eventually("old cluster deleted", 30, || async {
        clusters.get_opt(&old).await.unwrap().is_none().then_some(())
    })
    .await;
    let routes: Api<gateway_api::httproutes::HttpRoute> = Api::namespaced(env.client.clone(), &env.ns);
    let route = routes.get("llm-httproute").await.unwrap();
    let backends = route.spec.rules.unwrap()[0].backend_refs.clone().unwrap();
    assert_eq!(backends.len(), 1);
    assert_eq!(backends[0].name, format!("{new}-serve-svc"));
    assert_eq!(backends[0].weight, Some(100));

    let violations = observer.violations();
    assert!(violations.is_empty(), "invariants broken: {violations:#?}");
    let raises = observer.raises(&new);

    let weights: Vec<i64> = raises.iter().map(|r| r.1).collect();
    assert_eq!(
        weights,
        (5..=100).step_by(5).collect::<Vec<_>>(),
        "20 traffic steps of 5%"
    );
    // Exact pacing: each step lands within interval + 100 ms of the previous one (the goal: 3 in 4 must, on the
    // controller's clock below; every one within 300 ms, which holds on a loaded machine).
    let gaps: Vec<Duration> = raises.windows(2).map(|w| w[1].0 - w[0].0).collect();
    let worst = gaps.iter().max().unwrap();
    // A step the watch delivered late makes the next gap short by as much (the next step is paced from when
    // traffic really moved, and the planner never steps early, asserted below): that much of a gap is the
    // observer's delay, not the step's (CI saw 1.100 s then 0.884 s under load).
    let one_s = Duration::from_secs(1);
    let next_short = gaps
        .iter()
        .skip(1)
        .map(|g| one_s.saturating_sub(*g))
        .chain([Duration::ZERO]);
    let lateness = gaps
        .iter()
        .zip(next_short)
        .map(|(g, delay)| g.saturating_sub(one_s).saturating_sub(delay))
        .max()
        .unwrap();
    println!(
        "pacing: {} steps, worst gap {worst:?}, worst lateness {lateness:?} (less observer delay)",
        gaps.len() + 1
    );
    // Never early, on the controller's own clock: the watch delivers each step with its own jitter (CI saw a
    // first step delivered 57 ms later than the second), so observed gaps cannot show a step early by less.
    let step_gaps = observer.step_gaps();
    assert_eq!(
        step_gaps.len(),
        19,
        "gaps between step times in status: {step_gaps:?}"
    );
    let shortest = step_gaps.iter().copied().fold(f64::INFINITY, f64::min);
    let longest = step_gaps.iter().copied().fold(0.0, f64::max);
    let on_time = step_gaps.iter().filter(|g| **g <= 1.1).count();
    println!(
        "pacing on the controller's clock: gaps {shortest:.4}–{longest:.4} s, {on_time} of {} ≤ 100 ms late",
        step_gaps.len()
    );
    assert!(shortest >= 1.0, "a step came early: {step_gaps:?}");
    // Bounds that hold on a loaded 2-core machine, with the other incremental tests beside this one (the CI of
    // 7e28838 saw one pass decide a step 108 ms late, every other step within 20 ms); the goal is the count above.
    assert!(longest <= 1.3, "a step was over 300 ms late: {step_gaps:?}");
    assert!(
        on_time * 4 >= step_gaps.len() * 3,
        "under 3 in 4 steps ≤ 100 ms late: {step_gaps:?}"
    );
    // And as observed, allowing the watch its jitter: credit each gap with the previous one's lateness.
    let credited = gaps
        .iter()
        .zip(std::iter::once(&Duration::ZERO).chain(gaps.iter()))
        .map(|(g, prev)| *g + prev.saturating_sub(Duration::from_secs(1)));
    assert!(
        credited.into_iter().all(|g| g >= Duration::from_millis(800)),
        "a step was seen early: {gaps:?}"
    );
    assert!(
        lateness <= Duration::from_millis(300),
        "a step was {lateness:?} late: {gaps:?}"
    );
    let peak = observer.seen.lock().unwrap().peak_total_capacity;
    assert_eq!(peak, 120);
    // Capacity went up on the new cluster with target_capacity in the PUTs.
    let caps: Vec<f64> = env
        .dashboard
        .get(&env.ns, &new)
        .puts
        .iter()
        .filter_map(|p| p["target_capacity"].as_f64())
        .collect();
    assert_eq!(caps, vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
    let old_caps: Vec<f64> = env
        .dashboard
        .get(&env.ns, &old)
        .puts
        .iter()
        .filter_map(|p| p["target_capacity"].as_f64())
        .collect();
    assert_eq!(
        old_caps,
        vec![100.0, 80.0, 60.0, 40.0, 20.0, 0.0],
        "the old cluster kept its own config"
    );
    let events = env.events().await;
    for reason in ["UpdatedServeTargetCapacity", "UpdatedHTTPRoute", "Promoted"] {
        assert!(events.iter().any(|e| e == reason), "{reason} missing: {events:?}");
    }
    // The counters the dashboard shows agree with what happened.
    let text = controller.metrics();
    let labels = format!("name=\"llm\",namespace=\"{}\"", env.ns);
    let counter = |series: String| support::webhook::metric(&text, &series);
    assert_eq!(counter(format!("rayshift_traffic_steps_total{{{labels}}}")), 20.0);
    for role in ["active", "pending"] {
        let series = format!("rayshift_capacity_changes_total{{{labels},role=\"{role}\"}}");
        assert_eq!(counter(series), 5.0, "{role}");
    }
    assert_eq!(
        counter(format!(
            "rayshift_upgrades_total{{{labels},result=\"completed\"}}"
        )),
        1.0
    );
    assert_eq!(
        counter(format!(
            "rayshift_upgrade_duration_seconds_count{{{labels},result=\"completed\"}}"
        )),
        1.0
    );
    // Every step is its own Event with the weights it moved, none folded into another's series.
    let steps = env.event_notes("UpdatedHTTPRoute");
    assert_eq!(steps.len(), 20, "{steps:#?}");
    assert!(steps.iter().all(|(_, count)| *count == 1), "{steps:#?}");
    let last = format!("Moved traffic: {old} 5% → 0%, {new} 95% → 100%");
    assert!(
        steps.iter().any(|(n, _)| n == &last),
        "{last} missing: {steps:#?}"
    );
    let capacity = env.event_notes("UpdatedServeTargetCapacity");
    assert_eq!(
        capacity.len(),
        10,
        "5 raises of the new cluster, 5 cuts of the old: {capacity:#?}"
    );
    let first_raise = format!(
        "Set target_capacity of pending RayCluster {}/{new}: 0% → 20%",
        env.ns
    );
    assert!(capacity.iter().any(|(n, _)| n == &first_raise), "{capacity:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_waits_for_verified_pending_capacity() {
    let env = Env::new("capacity").await;
    env.deploy(50, 25, 1).await;
    let observer = env.observe(50);
    // New clusters run no replica beyond one until released.
    env.dashboard.new_clusters.lock().unwrap().max_running = Some(0);
    let new = env.upgrade_to("ray:2").await;
    env.eventually("pending capacity raised to 50", 30, || async {
        (env.levels().await.1.0 == 50).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        env.levels().await.1.1,
        0,
        "no traffic moved onto unverified capacity"
    );
    let rs = env.get().await;
    assert_eq!(
        condition(&rs, "Progressing"),
        Some(("False".into(), "WaitingForPendingCapacity".into()))
    );
    env.dashboard.with(&env.ns, &new, |s| s.max_running = None);
    env.promoted_to(&new, 60).await;
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverting_the_spec_rolls_back_step_by_step() {
    let env = Env::new("rollback").await;
    let old = env.deploy(50, 25, 1).await;
    let observer = env.observe(50);
    let new = env.upgrade_to("ray:2").await;
    env.pending_traffic_at_least(25, 30).await;
    // Back to the original spec.
    env.patch(json!({"spec": {"rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [head("ray:1")]}}}}}})).await;
    let message = env.rollback_message().await;
    assert_eq!(
        message, "Goal state reverted to original cluster, rolling back.",
        "KubeRay's words for A→B→A"
    );
    env.eventually("rollback complete", 60, || async {
        let rs = env.get().await;
        (pending(&rs).is_none() && condition(&rs, "RollbackInProgress").is_none()).then_some(rs)
    })
    .await;
    assert_eq!(active(&env.get().await).as_deref(), Some(old.as_str()));
    assert_eq!(env.levels().await.0, (100, 100));
    let clusters: Api<RayCluster> = Api::namespaced(env.client.clone(), &env.ns);
    env.eventually("the pending cluster removed", 30, || async {
        clusters.get_opt(&new).await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    // Traffic moved back in steps, never in one jump.
    let back = observer
        .seen
        .lock()
        .unwrap()
        .routes
        .iter()
        .filter_map(|(_, w)| w.get(&old).copied())
        .collect::<Vec<_>>();
    assert!(back.windows(2).all(|w| (w[1] - w[0]).abs() <= 25), "{back:?}");
    assert!(env.events().await.iter().any(|e| e == "RolledBack"));
    // Each rollback step is an event of its own, saying so.
    let steps = env.event_notes("UpdatedHTTPRoute");
    let back_steps: Vec<_> = steps
        .iter()
        .filter(|(n, _)| n.ends_with("(rolling back)"))
        .collect();
    assert!(!back_steps.is_empty(), "{steps:#?}");
    assert!(
        back_steps
            .iter()
            .any(|(n, _)| n.contains(&format!("{new} 25% → 0%"))),
        "{steps:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_spec_mid_upgrade_rolls_back_then_upgrades_to_it() {
    let env = Env::new("third").await;
    let old = env.deploy(50, 25, 1).await;
    let observer = env.observe(50);
    let b = env.upgrade_to("ray:2").await;
    env.pending_traffic_at_least(25, 30).await;
    env.patch(json!({"spec": {"rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [head("ray:3")]}}}}}})).await;
    let message = env.rollback_message().await;
    assert_eq!(
        message,
        "Goal state changed mid-upgrade, rolling back to original cluster."
    );
    let c = env
        .eventually("a new pending cluster C after the rollback", 90, || async {
            pending(&env.get().await).filter(|p| p != &b)
        })
        .await;
    assert_ne!(c, old);
    env.promoted_to(&c, 90).await;
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_promote() {
    let env = Env::new("control").await;
    env.deploy(50, 10, 2).await;
    let observer = env.observe(50);
    let new = env.upgrade_to("ray:2").await;
    env.pending_traffic_at_least(10, 30).await;
    env.patch(json!({"metadata": {"annotations": {"rayshift.io/upgrade-control": "pause"}}}))
        .await;
    env.eventually("Paused", 20, || async {
        let rs = env.get().await;
        (condition(&rs, "Progressing") == Some(("False".into(), "Paused".into()))).then_some(())
    })
    .await;
    let held = env.levels().await;
    // Both clusters serve through the route, so both count in numServeEndpoints (as KubeRay counts them).
    let old = active(&env.get().await).expect("an active cluster");
    let counted = env
        .eventually("numServeEndpoints counts both clusters", 20, || async {
            let (a, p) = (env.serving_pods(&old).await, env.serving_pods(&new).await);
            let counted = env.get().await.status?.num_serve_endpoints?;
            (p > 0 && counted == a + p).then_some((counted, a, p))
        })
        .await;
    println!("numServeEndpoints while paused: {counted:?} (total, active, pending)");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(env.levels().await, held, "nothing moves while paused");
    // Promote: the remaining steps without waiting the 2 s intervals.
    env.patch(json!({"metadata": {"annotations": {"rayshift.io/upgrade-control": "promote"}}}))
        .await;
    let started = Instant::now();
    env.promoted_to(&new, 30).await;
    let took = started.elapsed();
    let remaining_steps = (100 - held.1.1) / 10;
    assert!(
        took < Duration::from_secs(u64::try_from(remaining_steps).unwrap() * 2),
        "promote still waited: {took:?}"
    );
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    let events = env.events().await;
    assert!(events.iter().any(|e| e == "UpgradePaused"), "{events:?}");
    assert!(events.iter().any(|e| e == "UpgradeResumed"), "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_rolls_back_and_stays_back() {
    let env = Env::new("abort").await;
    let old = env.deploy(50, 25, 1).await;
    let observer = env.observe(50);
    env.upgrade_to("ray:2").await;
    env.pending_traffic_at_least(25, 30).await;
    env.patch(json!({"metadata": {"annotations": {"rayshift.io/upgrade-control": "abort"}}}))
        .await;
    env.eventually("rolled back", 60, || async {
        let rs = env.get().await;
        (pending(&rs).is_none() && active(&rs).as_deref() == Some(old.as_str())).then_some(())
    })
    .await;
    // The aborted spec is not retried while it stays the same.
    env.patch(json!({"metadata": {"annotations": {"rayshift.io/upgrade-control": null}}}))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(pending(&env.get().await), None);
    assert!(env.events().await.iter().any(|e| e == "UpgradeAborted"));
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    assert_eq!(env.upgrades("aborted"), 1.0);
    assert_eq!(env.upgrades("rolled_back"), 0.0);
    // A new spec upgrades again.
    let next = env.upgrade_to("ray:3").await;
    env.promoted_to(&next, 60).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_deadline_rolls_back() {
    let env = Env::new("deadline").await;
    let old = env.deploy(50, 25, 1).await;
    env.patch(json!({"metadata": {"annotations": {"rayshift.io/progress-deadline-seconds": "4"}}}))
        .await;
    env.dashboard.new_clusters.lock().unwrap().max_running = Some(0);
    env.upgrade_to("ray:2").await;
    env.eventually("rolled back by the deadline", 60, || async {
        let rs = env.get().await;
        (pending(&rs).is_none() && active(&rs).as_deref() == Some(old.as_str())).then_some(())
    })
    .await;
    assert!(env.events().await.iter().any(|e| e == "ProgressDeadlineExceeded"));
    assert_eq!(env.upgrades("rolled_back"), 1.0);
}

/// Faulty dashboards (issue 16): while the pending cluster's dashboard answers 500, answers later than the
/// controller's 2 s timeout, or cuts its JSON in half, no traffic moves onto that cluster and Progressing says
/// the upgrade waits; once it answers well the upgrade completes. A fault that lasts rolls the next upgrade back
/// at the progress deadline, though that cluster's dashboard still answers badly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faulty_dashboards_hold_traffic_then_the_deadline_rolls_back() {
    let env = Env::new("faulty").await;
    env.deploy(50, 25, 1).await;
    let observer = env.observe(50);
    let new = env.upgrade_to("ray:2").await;
    env.pending_traffic_at_least(25, 30).await;
    for fault in [
        Fault::ServerError,
        Fault::Slow(Duration::from_secs(3)),
        Fault::Truncated,
        Fault::Flapping,
    ] {
        env.dashboard.with(&env.ns, &new, |s| s.fault = Some(fault));
        // A step already decided on good answers may still land: hold from the next one.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let held = env.levels().await.1.1;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let (_, pending_levels) = env.levels().await;
        assert!(
            pending_levels.1 <= held,
            "{fault:?}: traffic moved onto {new}: {held}% → {}%",
            pending_levels.1
        );
        let rs = env.get().await;
        let progressing = condition(&rs, "Progressing");
        assert_eq!(
            progressing.as_ref().map(|(s, _)| s.as_str()),
            Some("False"),
            "{fault:?}: {progressing:?}"
        );
        env.dashboard.with(&env.ns, &new, |s| s.fault = None);
    }
    env.promoted_to(&new, 60).await;
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    env.patch(json!({"metadata": {"annotations": {"rayshift.io/progress-deadline-seconds": "4"}}}))
        .await;
    env.dashboard.new_clusters.lock().unwrap().fault = Some(Fault::Truncated);
    env.upgrade_to("ray:3").await;
    env.eventually("rolled back by the deadline", 60, || async {
        let rs = env.get().await;
        (pending(&rs).is_none() && active(&rs).as_deref() == Some(new.as_str())).then_some(())
    })
    .await;
    assert_eq!(env.upgrades("rolled_back"), 1.0);
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
}

/// Everything of an object its authors wrote: not status, resourceVersion or managedFields (Traefik writes
/// status), as the apiserver stores it.
fn authored(object: &Value) -> String {
    let mut object = object.clone();
    object.as_object_mut().unwrap().remove("status");
    let metadata = object["metadata"].as_object_mut().unwrap();
    metadata.remove("resourceVersion");
    metadata.remove("managedFields");
    serde_json::to_string(&object).unwrap()
}

fn managers(object: &Value) -> Vec<String> {
    object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| f["manager"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_gateway_in_another_namespace_carries_the_upgrade_untouched() {
    let env = Env::start("shared", true).await;
    let infra = env.infra.clone().unwrap();
    env.create_raw::<Gateway>(&infra, json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "edge", "labels": {"team": "platform"}, "annotations": {"owner": "platform"}},
        "spec": {"gatewayClassName": traefik::CLASS, "listeners": [{"name": "web", "protocol": "HTTP", "port": 80,
            "allowedRoutes": {"namespaces": {"from": "All"}}}]}
    }))
    .await;
    let before = env.raw::<Gateway>(&infra, "edge").await;
    let annotations =
        json!({"rayshift.io/gateway": format!("{infra}/edge"), "rayshift.io/gateway-listener": "web"});
    env.deploy_annotated(50, 25, 1, annotations).await;
    let observer = env.observe(50);
    let new = env.upgrade_to("ray:2").await;
    env.promoted_to(&new, 90).await;
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    assert_eq!(
        observer.raises(&new).len(),
        4,
        "25% steps through the shared Gateway"
    );
    let route = env.raw::<HttpRoute>(&env.ns, "llm-httproute").await;
    assert_eq!(
        route["spec"]["parentRefs"],
        json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge", "namespace": infra, "sectionName": "web"}])
    );
    let accepted = route["status"]["parents"].as_array().unwrap().iter().any(|p| {
        p["parentRef"]["namespace"] == infra.as_str()
            && p["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["type"] == "Accepted" && c["status"] == "True")
    });
    assert!(
        accepted,
        "Traefik accepted the route on the shared Gateway: {route:#}"
    );
    let gateways: Api<Gateway> = Api::namespaced(env.client.clone(), &env.ns);
    assert!(
        gateways.get_opt("llm-gateway").await.unwrap().is_none(),
        "no Gateway of its own"
    );
    let after = env.raw::<Gateway>(&infra, "edge").await;
    assert_eq!(
        authored(&after),
        authored(&before),
        "the shared Gateway is unchanged"
    );
    assert!(
        !managers(&after).iter().any(|m| m.contains("rayshift")),
        "{:?}",
        managers(&after)
    );
}

/// Serve stops serving gRPC: the GRPCRoute rayshift made for it goes, with an Event, and so does the
/// Gateway's `grpc` listener; the HTTPRoute stays and carries all traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_route_goes_when_serve_stops_serving_grpc() {
    let env = Env::new("grpcoff").await;
    let mut rs = incremental::rayservice(50, 25, 1, "ray:1");
    let plain = rs["spec"]["serveConfigV2"].as_str().unwrap().to_string();
    let grpc = format!(
        "grpc_options:\n  port: 9000\n  grpc_servicer_functions: [app_grpc.add_AppServicer_to_server]\n{plain}"
    );
    rs["spec"]["serveConfigV2"] = json!(grpc);
    let active = env.deploy_rayservice(rs).await;
    let routes: Api<GrpcRoute> = Api::namespaced(env.client.clone(), &env.ns);
    let listeners = || async {
        let gateway = env.raw::<Gateway>(&env.ns, "llm-gateway").await;
        let names = gateway["spec"]["listeners"].as_array().unwrap().iter();
        names
            .map(|l| l["name"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    env.eventually("the GRPCRoute", 30, || async {
        routes.get_opt("llm-grpcroute").await.unwrap()
    })
    .await;
    assert!(
        listeners().await.contains(&"grpc".to_string()),
        "{:?}",
        listeners().await
    );
    assert!(env.event_notes("DeletedGRPCRoute").is_empty());

    env.patch(json!({"spec": {"serveConfigV2": plain}})).await;
    env.gone::<GrpcRoute>("llm-grpcroute", 30).await;
    env.eventually("the Gateway without its grpc listener", 30, || async {
        (!listeners().await.contains(&"grpc".to_string())).then_some(())
    })
    .await;
    let route = env.raw::<HttpRoute>(&env.ns, "llm-httproute").await;
    let backends = &route["spec"]["rules"][0]["backendRefs"];
    assert_eq!(backends.as_array().map(Vec::len), Some(1), "{backends:#}");
    assert_eq!(backends[0]["name"], format!("{active}-serve-svc"));
    assert_eq!(backends[0]["weight"], 100);
    let notes = env.event_notes("DeletedGRPCRoute");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].0.contains("Serve has no gRPC port"), "{notes:?}");
}

/// Switched from NewClusterWithIncrementalUpgrade to NewCluster, a RayService keeps its Gateway and HTTPRoute
/// carrying the traffic: its blue/green upgrade moves the route, all of it, to the new active cluster's serve
/// Service (KubeRay leaves it on the cluster that upgrade deletes), and Traefik accepts it with its backend
/// resolved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_switch_to_new_cluster_the_route_follows_the_active_cluster() {
    let env = Env::new("switched").await;
    let first = env.deploy(50, 25, 1).await;
    let second = switched_to_new_cluster(&env, &first).await;
    env.eventually("the HTTPRoute on the new active cluster, accepted", 30, || {
        route_on(&env, "llm-httproute", 0, &second)
    })
    .await;
    told_route_followed(&env, "llm-httproute", &second).await;
    env.gone::<RayCluster>(&first, 60).await;
    env.gone::<Service>(&format!("{first}-serve-svc"), 60).await;
    let gateways: Api<Gateway> = Api::namespaced(env.client.clone(), &env.ns);
    assert!(gateways.get_opt("llm-gateway").await.unwrap().is_some());
    assert!(
        route_on(&env, "llm-httproute", 0, &second).await.is_some(),
        "the route still carries the traffic to {second}"
    );
}

/// Switches the RayService to NewCluster with a new image; the new active cluster once promoted.
async fn switched_to_new_cluster(env: &Env, first: &str) -> String {
    env.patch(json!({"spec": {
        "upgradeStrategy": {"type": "NewCluster", "clusterUpgradeOptions": null},
        "rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [head("ray:2")]}}}}
    }}))
    .await;
    env.eventually("a new active cluster, promoted", 90, || async {
        let rs = env.get().await;
        active(&rs).filter(|a| a != first && pending(&rs).is_none())
    })
    .await
}

/// The Event that tells a person the route moved to the new active cluster, once.
async fn told_route_followed(env: &Env, route: &str, cluster: &str) {
    let wanted = format!(
        "Moved all traffic to the active cluster {cluster} on HTTPRoute {}/{route}",
        env.ns
    );
    let moved = || {
        let notes = env.event_notes("UpdatedHTTPRoute");
        notes
            .into_iter()
            .filter(|(n, _)| n.starts_with(&wanted))
            .collect::<Vec<_>>()
    };
    env.eventually(
        "the Event of the route following the active cluster",
        30,
        || async { (!moved().is_empty()).then_some(()) },
    )
    .await;
    let followed: Vec<_> = moved();
    assert_eq!(followed.len(), 1, "{followed:?}");
}

/// Some when `rule` of the route sends all of its traffic to `cluster`'s serve Service and Traefik has accepted
/// the route's generation with its backends resolved.
async fn route_on(env: &Env, route: &str, rule: usize, cluster: &str) -> Option<()> {
    let route = env.raw::<HttpRoute>(&env.ns, route).await;
    let backends = route["spec"]["rules"][rule]["backendRefs"].as_array()?.clone();
    let generation = &route["metadata"]["generation"];
    let holds = |type_: &str| {
        route["status"]["parents"].as_array().is_some_and(|parents| {
            parents.iter().any(|p| {
                p["conditions"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c["type"] == type_ && c["status"] == "True" && c["observedGeneration"] == *generation
                    })
                })
            })
        })
    };
    let only_on = backends.len() == 1
        && backends[0]["name"] == format!("{cluster}-serve-svc")
        && backends[0]["weight"] == 100;
    (only_on && holds("Accepted") && holds("ResolvedRefs")).then_some(())
}

/// The same switch with an adopted route: the rule rayshift routed follows the new active cluster, and the
/// rest of the user's route stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_switch_an_adopted_route_follows_the_active_cluster() {
    let env = Env::new("switchadopt").await;
    let first = env.deploy(50, 25, 1).await;
    // The user's other rule resolves too, so the route's ResolvedRefs speaks for the rule rayshift moves.
    create_docs_service(&env).await;
    adopt_a_route_on_its_own_gateway(&env).await;
    env.eventually("the adopted rule on the active cluster", 30, || {
        route_on(&env, "public", 1, &first)
    })
    .await;
    let adopted = env.raw::<HttpRoute>(&env.ns, "public").await;
    let second = switched_to_new_cluster(&env, &first).await;
    env.eventually("the adopted rule on the new active cluster, accepted", 30, || {
        route_on(&env, "public", 1, &second)
    })
    .await;
    told_route_followed(&env, "public", &second).await;
    env.gone::<RayCluster>(&first, 60).await;
    let after = env.raw::<HttpRoute>(&env.ns, "public").await;
    assert_eq!(
        without_managed_backends(&after),
        without_managed_backends(&adopted),
        "the rest of the route is unchanged"
    );
    let routes: Api<HttpRoute> = Api::namespaced(env.client.clone(), &env.ns);
    assert!(routes.get_opt("llm-httproute").await.unwrap().is_none());
}

/// A RayService moves from a Gateway of its own to a shared one: its HTTPRoute attaches to the shared Gateway
/// at once, and its own Gateway stays while a route of the user's still attaches to it, then goes (with an
/// Event) as soon as that route is gone: Traefik's new `attachedRoutes` on the Gateway wakes the RayService.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn its_own_gateway_goes_when_a_shared_one_takes_over_and_no_route_uses_it() {
    let env = Env::start("moving", true).await;
    let infra = env.infra.clone().unwrap();
    env.create_raw::<Gateway>(&infra, json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "edge"},
        "spec": {"gatewayClassName": traefik::CLASS, "listeners": [{"name": "web", "protocol": "HTTP", "port": 80,
            "allowedRoutes": {"namespaces": {"from": "All"}}}]}
    }))
    .await;
    env.deploy(50, 25, 1).await;
    let gateways: Api<Gateway> = Api::namespaced(env.client.clone(), &env.ns);
    assert!(gateways.get_opt("llm-gateway").await.unwrap().is_some());
    env.create_raw::<HttpRoute>(&env.ns, json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "docs"},
        "spec": {"parentRefs": [{"name": "llm-gateway"}], "rules": [{"backendRefs": [{"name": "docs", "port": 80}]}]}
    }))
    .await;

    env.patch(json!({"metadata": {"annotations": {
        "rayshift.io/gateway": format!("{infra}/edge"), "rayshift.io/gateway-listener": "web"}}}))
        .await;
    env.eventually("the HTTPRoute on the shared Gateway", 30, || async {
        let route = env.raw::<HttpRoute>(&env.ns, "llm-httproute").await;
        (route["spec"]["parentRefs"][0]["name"] == "edge").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        gateways.get_opt("llm-gateway").await.unwrap().is_some(),
        "the user's route still attaches to it"
    );
    assert!(env.event_notes("DeletedGateway").is_empty());

    let routes: Api<HttpRoute> = Api::namespaced(env.client.clone(), &env.ns);
    routes.delete("docs", &Default::default()).await.unwrap();
    env.gone::<Gateway>("llm-gateway", 30).await;
    let notes = env.event_notes("DeletedGateway");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0]
            .0
            .contains(&format!("the shared Gateway {infra}/edge carries the traffic")),
        "{notes:?}"
    );
    assert!(
        routes.get_opt("llm-httproute").await.unwrap().is_some(),
        "its route stays"
    );
}

/// A RayService with its own Gateway adopts a route of the user's that attaches to that Gateway: the adopted
/// rule gets the backends, rayshift's own HTTPRoute goes (with an Event), and the Gateway stays, since the
/// adopted route still uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopting_a_route_deletes_its_own_and_keeps_the_gateway_the_adopted_one_uses() {
    let env = Env::new("adopting").await;
    let active = env.deploy(50, 25, 1).await;
    adopt_a_route_on_its_own_gateway(&env).await;
    let adopted = env.raw::<HttpRoute>(&env.ns, "public").await;
    let backends = &adopted["spec"]["rules"][1]["backendRefs"];
    assert_eq!(backends[0]["name"], format!("{active}-serve-svc"), "{adopted:#}");
    assert_eq!(backends[0]["weight"], 100, "{adopted:#}");
    let notes = env.event_notes("DeletedHTTPRoute");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0]
            .0
            .contains("the adopted HTTPRoute public carries the traffic"),
        "{notes:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let gateways: Api<Gateway> = Api::namespaced(env.client.clone(), &env.ns);
    assert!(
        gateways.get_opt("llm-gateway").await.unwrap().is_some(),
        "the adopted route attaches to it"
    );
    assert!(env.event_notes("DeletedGateway").is_empty());
}

/// The user's route, attached to the RayService's own Gateway, adopted; once rayshift's own route is gone.
async fn adopt_a_route_on_its_own_gateway(env: &Env) {
    let mut route = user_route();
    route["spec"]["parentRefs"] = json!([{"name": "llm-gateway", "sectionName": "http"}]);
    env.create_raw::<HttpRoute>(&env.ns, route).await;
    env.patch(json!({"metadata": {"annotations": {
        "rayshift.io/http-route": "public", "rayshift.io/http-route-rule": "serve"}}}))
        .await;
    env.gone::<HttpRoute>("llm-httproute", 30).await;
}

/// The Service behind the user's own `docs` rule.
async fn create_docs_service(env: &Env) {
    env.create_raw::<Service>(
        &env.ns,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "docs"},
        "spec": {"selector": {"app": "docs"}, "ports": [{"port": 80}]}}),
    )
    .await;
}

/// The user's route with a rule of its own (`docs`) before the one rayshift manages (`serve`).
fn user_route() -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "public", "labels": {"app": "shop"}, "annotations": {"owner": "team-x"}},
        "spec": {
            "hostnames": ["shop.example.com"],
            "parentRefs": [{"name": "public", "sectionName": "web"}],
            "rules": [
                {"name": "docs", "matches": [{"path": {"type": "PathPrefix", "value": "/docs"}}],
                 "backendRefs": [{"name": "docs", "port": 80}]},
                {"name": "serve", "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                 "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x-served-by", "value": "ray"}]}}]}
            ]
        }
    })
}

/// The route without what rayshift may change: the managed rule's backendRefs (and so the generation).
fn without_managed_backends(route: &Value) -> String {
    let mut route = route.clone();
    route["spec"]["rules"][1]
        .as_object_mut()
        .unwrap()
        .remove("backendRefs");
    route["metadata"].as_object_mut().unwrap().remove("generation");
    authored(&route)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_route_keeps_everything_but_the_backends_rayshift_manages() {
    let env = Env::new("adopt").await;
    let ns = env.ns.clone();
    env.create_raw::<Gateway>(&ns, json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "public"},
        "spec": {"gatewayClassName": traefik::CLASS, "listeners": [{"name": "web", "protocol": "HTTP", "port": 80}]}
    }))
    .await;
    create_docs_service(&env).await;
    env.create_raw::<HttpRoute>(&ns, user_route()).await;
    let before = env.raw::<HttpRoute>(&ns, "public").await;
    let annotations = json!({"rayshift.io/http-route": "public", "rayshift.io/http-route-rule": "serve"});
    env.deploy_annotated(50, 25, 1, annotations).await;
    let observer = Observer::start_on(
        env.client.clone(),
        &ns,
        "llm",
        "public",
        50,
        env.dashboard.serving(&ns),
    );
    let new = env.upgrade_to("ray:2").await;
    env.promoted_to(&new, 90).await;
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    assert_eq!(observer.raises(&new).len(), 4, "25% steps on the adopted rule");
    let after = env.raw::<HttpRoute>(&ns, "public").await;
    assert_eq!(
        after["spec"]["rules"][1]["backendRefs"],
        json!([{"group": "", "kind": "Service", "name": format!("{new}-serve-svc"), "namespace": ns, "port": 8000, "weight": 100}])
    );
    assert_eq!(
        without_managed_backends(&after),
        without_managed_backends(&before),
        "the rest of the route is unchanged"
    );
    let gateways: Api<Gateway> = Api::namespaced(env.client.clone(), &ns);
    let routes: Api<HttpRoute> = Api::namespaced(env.client.clone(), &ns);
    assert!(gateways.get_opt("llm-gateway").await.unwrap().is_none());
    assert!(routes.get_opt("llm-httproute").await.unwrap().is_none());
    env.rayservices()
        .delete("llm", &Default::default())
        .await
        .unwrap();
    let rayservices = env.rayservices();
    env.eventually("the RayService gone", 60, || {
        support::wait::gone(&rayservices, "llm")
    })
    .await;
    let kept = env.raw::<HttpRoute>(&ns, "public").await;
    assert_eq!(
        without_managed_backends(&kept),
        without_managed_backends(&before),
        "the route outlives the RayService"
    );
}

/// How late each traffic step of `cluster` landed after it was due: at `last step + interval` or when the
/// dashboard had its capacity RUNNING (`delay` after the PUT that asked for it), whichever is later.
fn lateness_after_capacity(
    env: &Env,
    observer: &Observer,
    cluster: &str,
    delay: Duration,
    interval: Duration,
) -> Vec<Duration> {
    let state = env.dashboard.get(&env.ns, cluster);
    let mut previous: Option<Instant> = None;
    let mut late = Vec::new();
    for (at, weight) in observer.raises(cluster) {
        let put = state
            .puts
            .iter()
            .zip(&state.put_times)
            .find(|(p, _)| p["target_capacity"].as_f64() == Some(weight as f64))
            .map(|(_, t)| *t)
            .expect("a PUT for the capacity this step needs");
        let verified = put + delay;
        // Never before the capacity was there (the observer sees a step a few ms after it was written).
        assert!(at >= verified, "a step to {weight}% before its capacity ran");
        let due = previous.map_or(verified, |p| verified.max(p + interval));
        late.push(at.saturating_duration_since(due));
        previous = Some(at);
    }
    late
}

/// p50, mean and max.
fn summary(late: &[Duration]) -> (Duration, Duration, Duration) {
    let mut sorted = late.to_vec();
    sorted.sort();
    let mean = sorted.iter().sum::<Duration>() / u32::try_from(sorted.len()).unwrap();
    (sorted[sorted.len() / 2], mean, *sorted.last().unwrap())
}

/// Upgrades to `ray:2` (maxSurgePercent 10, stepSizePercent 10) and returns the lateness of its 10 steps.
async fn upgrade_measured(env: &Env, delay: Duration, interval: Duration) -> (Duration, Duration, Duration) {
    let observer = env.observe(10);
    let new = env.upgrade_to("ray:2").await;
    env.promoted_to(&new, 120).await;
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    let late = lateness_after_capacity(env, &observer, &new, delay, interval);
    assert_eq!(late.len(), 10, "{late:?}");
    summary(&late)
}

/// A step that waits only for its capacity lands when that capacity is verified, not at the next Serve poll.
/// Replicas here start 1.5 s after each PUT, longer than the 1 s interval, so every step waits for them. Two
/// RayServices upgrade side by side, each in its own namespace with its own controller: one polling Serve only
/// at its usual period (as before), one as it does now. Side by side, both see the same load from whatever else
/// runs on the machine, so the comparison holds where a measurement taken one after the other did not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_waiting_for_capacity_lands_when_it_is_verified() {
    let delay = Duration::from_millis(1500);
    let interval = Duration::from_secs(1);
    let mut envs = Vec::new();
    for (prefix, poll) in [("verified-before", "0.3"), ("verified-after", "0.05")] {
        let mut env = Env::new(prefix).await;
        env.start_controller_with(&["--capacity-poll-interval-seconds", poll]);
        env.deploy(10, 10, 1).await;
        env.dashboard.new_clusters.lock().unwrap().start_delay = Some(delay);
        envs.push((poll, env));
    }
    let (before, after) = tokio::join!(
        upgrade_measured(&envs[0].1, delay, interval),
        upgrade_measured(&envs[1].1, delay, interval)
    );
    let runs = [(envs[0].0, before), (envs[1].0, after)];
    for (poll, (p50, mean, max)) in &runs {
        println!(
            "step lateness after capacity, capacity poll {poll} s: p50 {p50:?}, mean {mean:?}, max {max:?}"
        );
    }
    // The goal is 100 ms (BENCHMARKS.md has measured values). A loaded machine makes every pass slower, for
    // both alike, so the test compares the two: reading Serve every 50 ms must beat reading it every 300 ms
    // on average (that alone is 125 ms apart), and no step may wait anything like a poll period.
    assert!(
        after.1 < before.1,
        "no earlier than polling at the serve period: {runs:?}"
    );
    assert!(
        after.2 <= Duration::from_secs(1),
        "a step landed {:?} after its capacity was verified",
        after.2
    );
}

/// Waiting for a step that is not due yet is progress: an interval longer than the progress deadline used to
/// roll every upgrade back after its first step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_longer_than_the_deadline_still_completes() {
    let env = Env::new("slowsteps").await;
    env.deploy(50, 50, 4).await;
    env.patch(json!({"metadata": {"annotations": {"rayshift.io/progress-deadline-seconds": "2"}}}))
        .await;
    let new = env.upgrade_to("ray:2").await;
    env.promoted_to(&new, 60).await;
    let events = env.events().await;
    assert!(
        !events.iter().any(|e| e == "ProgressDeadlineExceeded"),
        "{events:?}"
    );
    assert_eq!(env.upgrades("completed"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_resumes_from_status() {
    let mut env = Env::new("restart").await;
    let old = env.deploy(20, 10, 1).await;
    let observer = env.observe(20);
    let new = env.upgrade_to("ray:2").await;
    env.pending_traffic_at_least(20, 60).await;
    drop(env.controller.take());
    // A status write sent just before the kill can still land (CI saw the active capacity go 100 → 80 after
    // the kill); what must hold is that nothing moves after that.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let frozen = env.levels().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(env.levels().await, frozen, "nothing moves without a controller");
    env.start_controller();
    env.promoted_to(&new, 120).await;
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    // After the restart the old cluster still got capacity changes with its own (old) config.
    let old_puts = env.dashboard.get(&env.ns, &old).puts;
    assert!(old_puts.len() >= 3);
    assert!(
        old_puts
            .iter()
            .all(|p| p["applications"][0]["import_path"] == "serve_llm:app")
    );
    let all = cluster_names(&Api::<RayCluster>::namespaced(env.client.clone(), &env.ns), "").await;
    assert!(all.contains(&new));
}

/// The upgrade's expected completion was published and kept up to date: reports each estimate's error
/// against the promotion seen at `ended` (by a 100 ms poll, so up to that late), and checks that the
/// estimates made once traffic moved were close. Exact when clusters are ready at once (a property test in
/// `api`); here capacity waits on the real KubeRay operator and the fake dashboards add to it.
fn check_expected_completion(estimates: &[(jiff::Timestamp, jiff::Timestamp)], ended: jiff::Timestamp) {
    assert!(
        estimates.len() >= 3,
        "the estimate was not updated as the upgrade moved: {estimates:?}"
    );
    let errors: Vec<f64> = estimates
        .iter()
        .map(|(_, eta)| eta.duration_since(ended).as_secs_f64())
        .collect();
    let whole = ended.duration_since(estimates[0].0).as_secs_f64();
    eprintln!(
        "expected completion: {} estimates over a {whole:.1} s upgrade; error (estimate - end) first {:+.2} s, last {:+.2} s, worst {:+.2} s",
        errors.len(),
        errors[0],
        errors[errors.len() - 1],
        errors
            .iter()
            .cloned()
            .fold(0.0_f64, |w, e| if e.abs() > w.abs() { e } else { w })
    );
    // The last estimate is made at the last step; what remains is the drain and the promotion.
    let last = errors[errors.len() - 1];
    assert!(
        last.abs() < 5.0,
        "the last estimate was {last:+.2} s off: {estimates:?}"
    );
}

/// Every metric the Grafana dashboard queries is one rayshift exports (a real scrape of the controller
/// taken mid-upgrade, plus a real webhook's after a few reviews).
async fn check_dashboard_against(controller_scrape: &str, controller: &ControllerProcess) {
    use support::webhook::{WebhookProcess, admission_review};
    let (webhook, _certs) = WebhookProcess::with_generated_certs();
    let client = webhook.client();
    for object in [
        json!({"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "x"}, "spec": {"rayClusterConfig": {"headGroupSpec": {}}}}),
    ] {
        let review = admission_review("CREATE", Some(&object), None);
        for path in ["/validate-ray-io-v1-rayservice", "/mutate-ray-io-v1-rayservice"] {
            client.post(webhook.url(path)).json(&review).send().await.unwrap();
        }
    }
    let families = |text: &str| -> std::collections::BTreeSet<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect()
    };
    let mut exported = families(controller_scrape);
    exported.extend(families(&controller.metrics()));
    exported.extend(families(&webhook.metrics()));
    let path = format!(
        "{}/manifests/grafana/rayshift-dashboard.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let queries = support::prometheus::dashboard_queries();
    assert!(queries.len() >= 20, "{queries:?}");
    let mut missing = Vec::new();
    for q in &queries {
        for name in q
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|t| t.starts_with("rayshift_"))
        {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
            if !exported.contains(family) {
                missing.push(name.to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics rayshift does not export: {missing:?}\nexported: {exported:?}"
    );
    for panel in [
        "Capacity and traffic per cluster",
        "Upgrade phase",
        "Admission verdicts",
        "Reconcile errors by reason; RayServices failing",
    ] {
        assert!(
            dashboard["panels"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["title"] == panel),
            "{panel}"
        );
    }
}

/// `kubectl rayshift` through the real kubectl against the real apiserver: status (text, JSON, YAML, -w)
/// during an upgrade, plan of the live object, pause / resume / promote, and abort of a second upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_plugin_follows_and_steers_upgrades() {
    let env = Env::new("plugin").await;
    let old = env.deploy(50, 10, 2).await;
    let idle: Value = serde_json::from_str(&env.rayshift_plugin(&["status", "llm", "-o", "json"])).unwrap();
    assert_eq!(idle["phase"], "Idle", "{idle}");
    let new = env.upgrade_to("ray:2").await;
    env.pending_traffic_at_least(10, 60).await;

    let text = env.rayshift_plugin(&["status", "llm"]);
    eprintln!("kubectl rayshift status llm:\n{text}");
    for want in [
        "Upgrading",
        "traffic step ",
        "/10",
        "expected to end in",
        &old,
        &new,
        "pending",
        "Events:",
    ] {
        assert!(text.contains(want), "{want:?} not in:\n{text}");
    }
    let json: Value = serde_json::from_str(&env.rayshift_plugin(&["status", "llm", "-o", "json"])).unwrap();
    assert_eq!(json["clusters"].as_array().unwrap().len(), 2, "{json}");
    assert_eq!(json["trafficStep"]["total"], 10, "{json}");
    assert!(json["expectedCompletion"].is_string(), "{json}");
    let wide = env.rayshift_plugin(&["status", "llm", "-o", "wide"]);
    assert!(wide.contains("Last traffic step: 20"), "{wide}");
    let plan = env.rayshift_plugin(&["plan", "llm"]);
    assert!(plan.contains("Rest of the running upgrade of llm"), "{plan}");

    // Pause: it holds, and says so; a follower sees the resume.
    assert!(env.rayshift_plugin(&["pause", "llm"]).contains("upgrade paused"));
    env.eventually("Paused", 30, || async {
        let v: Value = serde_json::from_str(&env.rayshift_plugin(&["status", "llm", "-o", "json"])).ok()?;
        (v["phase"] == "Paused" && v["expectedCompletion"].is_null()).then_some(())
    })
    .await;
    let follower = follow(env.kubectl_rayshift(&["status", "llm", "-w"]));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        env.rayshift_plugin(&["resume", "llm"])
            .contains("upgrade resumed")
    );
    let seen = follower.until(|out| out.contains("Paused") && out.contains("Upgrading"), 30);
    assert!(seen.contains("---"), "{seen}");

    // Promote: the intervals are skipped.
    assert!(
        env.rayshift_plugin(&["promote", "llm"])
            .contains("upgrade promoted")
    );
    env.promoted_to(&new, 60).await;
    let yaml = env.rayshift_plugin(&["status", "llm", "-o", "yaml"]);
    assert!(yaml.contains("phase: Idle"), "{yaml}");
    env.patch(json!({"metadata": {"annotations": {"rayshift.io/upgrade-control": null}}}))
        .await;

    // Abort: a second upgrade goes back to the cluster that serves.
    let third = env.upgrade_to("ray:3").await;
    env.pending_traffic_at_least(10, 60).await;
    assert!(env.rayshift_plugin(&["abort", "llm"]).contains("rolling back"));
    env.eventually("rolled back", 60, || async {
        let rs = env.get().await;
        (active(&rs).as_deref() == Some(new.as_str()) && pending(&rs).is_none()).then_some(())
    })
    .await;
    let events = env.rayshift_plugin(&["status", "llm"]);
    assert!(
        events.contains("RolledBack") || events.contains("UpgradeAborted"),
        "{events}"
    );
    assert_ne!(third, new);

    let sample = format!(
        "{}/manifests/samples/rayservice-incremental.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    env.rayshift_plugin(&["validate", "-f", &sample, support::incremental::GATE]);
    let missing = env.kubectl_rayshift(&["status", "nope"]).output().unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("not found"),
        "{missing:?}"
    );
}

/// A running `kubectl rayshift status -w`, its output collected as it comes.
struct Follower {
    child: std::process::Child,
    out: std::sync::Arc<std::sync::Mutex<String>>,
}

fn follow(mut command: std::process::Command) -> Follower {
    use std::io::Read;
    let mut child = command.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let out = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = out.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    Follower { child, out }
}

impl Follower {
    /// Its output once `done` holds (or the deadline passes: then a panic with what it printed).
    fn until(mut self, done: impl Fn(&str) -> bool, secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let out = self.out.lock().unwrap().clone();
            if done(&out) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return out;
            }
            assert!(Instant::now() < deadline, "status -w printed:\n{out}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// SLO checks, evaluated by a real Prometheus (constant queries: this test's clusters run no Ray, so there are
/// no Serve metrics to read; the real-Ray test reads them). With Prometheus unreachable, the step after the
/// first waits and says why; a check that fails twice with `onFailure: pause` writes the pause annotation and
/// holds the upgrade, quoting the query and value; once the check passes and a person resumes, the upgrade
/// completes, each gated step at least the check's window after the one before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slo_checks_wait_for_prometheus_pause_on_failure_and_pass() {
    let mut env = Env::new("slo").await;
    // Nothing listens on loopback port 9: Prometheus is unreachable.
    env.start_controller_with(&["--prometheus-url=http://127.0.0.1:9"]);
    let checks = |query: &str| {
        json!({"rayshift.io/slo-checks": format!(
            "[{{name: constant, query: '{query}', comparison: '<=', threshold: 0.01, windowSeconds: 10, intervalSeconds: 1, failureLimit: 2, onFailure: pause}}]"
        )})
    };
    env.deploy_annotated(50, 50, 1, checks("vector(0.5)")).await;
    let observer = env.observe(50);
    let new = env.upgrade_to("ray:2").await;
    env.pending_traffic_at_least(50, 30).await;
    let waiting = env
        .eventually("WaitingForSloChecks, Prometheus unreachable", 30, || async {
            let (reason, message) = support::status::progressing(&env.get().await)?;
            (reason == "WaitingForSloChecks" && message.contains("unavailable")).then_some(message)
        })
        .await;
    assert!(
        waiting.contains("vector(0.5) = unavailable: Prometheus"),
        "{waiting}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.levels().await.1.1, 50, "a step without a verdict");
    // A real Prometheus: the check fails twice and pauses the upgrade.
    let prometheus = support::prometheus::Prometheus::start(&[]);
    env.start_controller_with(&[&format!("--prometheus-url={}", prometheus.url())]);
    let paused = env
        .eventually("paused by the SLO check", 60, || async {
            let rs = env.get().await;
            let control = rs
                .metadata
                .annotations
                .as_ref()?
                .get("rayshift.io/upgrade-control")?
                .clone();
            let c = rs
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Progressing")?;
            (control == "pause" && c.reason == "Paused").then_some(c.message)
        })
        .await;
    assert!(
        paused.contains("last failed SLO check constant: vector(0.5) = 0.5"),
        "{paused}"
    );
    let failed = env.event_notes("SloCheckEvaluationFailed");
    assert!(
        failed
            .iter()
            .any(|(n, _)| n.contains("vector(0.5) = 0.5, wanted <= 0.01")),
        "{failed:?}"
    );
    assert_eq!(env.event_notes("UpgradePausedBySloCheck").len(), 1);
    let held = env.levels().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.levels().await, held, "nothing moves while paused");
    // The check passes now; a person resumes: the upgrade completes through the gated steps.
    let mut patch = json!({"metadata": {"annotations": checks("vector(0)")}});
    patch["metadata"]["annotations"]["rayshift.io/upgrade-control"] = json!("resume");
    let resumed = Instant::now();
    env.patch(patch).await;
    env.promoted_to(&new, 90).await;
    // Two gated moves (50 → 100, then the promotion), each 10 s after the step before it.
    assert!(
        resumed.elapsed() >= Duration::from_secs(8),
        "gated steps came early: {:?}",
        resumed.elapsed()
    );
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    let metrics = env.controller.as_ref().unwrap().metrics();
    let passed = support::webhook::metric(
        &metrics,
        &format!(
            r#"rayshift_slo_check_evaluations_total{{check="constant",name="llm",namespace="{}",outcome="pass"}}"#,
            env.ns
        ),
    );
    assert!(passed >= 1.0, "{metrics}");
}

/// GPU workers in one full copy of the RayService (one Serve replica each); its node holds one more.
const GPU_WORKERS: usize = 4;

/// A RayService whose Serve replicas each need a GPU worker, four for a full copy, all on `node`; surge 50 %
/// (two workers), step 25 % (one).
fn gpu_rayservice(node: &str, annotations: Value) -> rayshift_api::RayService {
    let mut rs = support::incremental::rayservice(50, 25, 1, "ray:1");
    rs["metadata"]["annotations"] = annotations;
    rs["spec"]["serveConfigV2"] = json!(
        "applications:\n  - name: llm\n    import_path: serve_llm:app\n    route_prefix: /\n    deployments:\n      - name: LLM\n        num_replicas: 4\n        ray_actor_options: {num_gpus: 1}\n"
    );
    let workers = &mut rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0];
    workers["replicas"] = json!(0);
    workers["maxReplicas"] = json!(GPU_WORKERS);
    let pod = &mut workers["template"]["spec"];
    pod["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    pod["tolerations"] =
        json!([{"key": GPU_TAINT, "operator": "Equal", "value": node, "effect": "NoSchedule"}]);
    pod["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
    serde_json::from_value(rs).unwrap()
}

/// Capacity changes in a cluster's sequence of target capacities (a pending cluster starts from 0).
fn capacity_changes(levels: &[i64], from: i64) -> usize {
    let mut last = from;
    levels
        .iter()
        .filter(|&&l| std::mem::replace(&mut last, l) != l)
        .count()
}

/// Issue 18's acceptance, through the real kube-scheduler and the real KubeRay operator: a kwok node holds
/// exactly one full copy of GPU workers plus one; an autoscaler stand-in scales each cluster's workers with
/// its Serve target capacity, and the fake dashboard runs only as many replicas as a cluster has Ready
/// workers.
/// - Without ResourceAware, the surge (two workers) cannot be placed: the upgrade says what is short
///   (Progressing=False InsufficientResources, naming the GPUs) and the progress deadline rolls it back.
/// - With `rayshift.io/resource-aware: on-stall`, it switches and completes: the active cluster gives way,
///   KubeRay deletes its workers, the pending cluster's take their GPUs. The invariants hold throughout (the
///   active cluster's dip bounded by maxUnavailablePercent), traffic goes only onto Ready workers, and
///   `rayshift plan --resource-aware` predicts the serving capacity's dip (counted in Ready GPU workers) and
///   the numbers of traffic steps and capacity changes exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_aware_upgrade_through_the_real_scheduler_on_gpu_limited_nodes() {
    let env = Env::new("gpu").await;
    let node = format!("gpu-{}", env.ns);
    let gpus = u32::try_from(GPU_WORKERS).unwrap() + 1;
    gpu_node(&env.client, &node, gpus, "10.250.160.0/24").await;
    let autoscaler = Autoscaler::start(env.client.clone(), &env.ns, env.dashboard.clone(), GPU_WORKERS);
    let deadline = |secs: u32| json!({"rayshift.io/progress-deadline-seconds": secs.to_string()});
    env.rayservices()
        .create(&PostParams::default(), &gpu_rayservice(&node, deadline(8)))
        .await
        .unwrap();
    let old = env
        .eventually("the first cluster active on its 4 GPU workers", 90, || async {
            let rs = env.get().await;
            let a = active(&rs).filter(|_| pending(&rs).is_none())?;
            (autoscaler.running_before(&a, Instant::now()) == GPU_WORKERS).then_some(a)
        })
        .await;

    // Without the mode: stalled, then rolled back.
    let observer = env.observe(50);
    let stuck = env.upgrade_to("ray:2").await;
    let said = env
        .eventually("Progressing=False, InsufficientResources", 60, || async {
            let (reason, message) = support::status::progressing(&env.get().await)?;
            (reason == "InsufficientResources").then_some(message)
        })
        .await;
    assert!(
        said.contains("nvidia.com/gpu for") && said.contains("Insufficient nvidia.com/gpu"),
        "{said}"
    );
    env.eventually("rolled back by the deadline", 60, || async {
        let rs = env.get().await;
        (pending(&rs).is_none() && active(&rs).as_deref() == Some(old.as_str())).then_some(())
    })
    .await;
    let events = env.events().await;
    for reason in ["PendingClusterUnschedulable", "ProgressDeadlineExceeded"] {
        assert!(events.iter().any(|e| e == reason), "{reason}: {events:?}");
    }
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    assert_eq!(
        observer.capacities(&old),
        [100],
        "the active cluster kept its capacity"
    );
    let clusters: Api<RayCluster> = Api::namespaced(env.client.clone(), &env.ns);
    env.eventually("the stalled cluster gone", 60, || {
        support::wait::gone(&clusters, &stuck)
    })
    .await;
    drop(observer);

    // on-stall: switched, and completed.
    env.patch(json!({"metadata": {"annotations": {
        "rayshift.io/resource-aware": "on-stall", "rayshift.io/max-unavailable-percent": "25",
        "rayshift.io/progress-deadline-seconds": "120"}}}))
        .await;
    let observer = env.observe(50).with_dip(25);
    let from = Instant::now();
    let new = env.upgrade_to("ray:3").await;
    let why = env
        .eventually("kubectl rayshift status saying why ResourceAware", 60, || async {
            let text = env.rayshift_plugin(&["status", "llm"]);
            text.lines()
                .find(|l| l.starts_with("ResourceAware since"))
                .map(str::to_string)
        })
        .await;
    assert!(
        why.contains("the pending cluster stalled for lack of a resource"),
        "{why}"
    );
    // The controller's gauges while it runs: the mode, and the dip (never beyond maxUnavailablePercent).
    let gauge = |metric: &str| {
        let series = format!("{metric}{{name=\"llm\",namespace=\"{}\"}}", env.ns);
        support::webhook::metric(&env.controller.as_ref().unwrap().metrics(), &series)
    };
    let (dips, mode) = (RefCell::new(BTreeSet::new()), Cell::new(false));
    let freed = RefCell::new(BTreeSet::new());
    env.eventually(&format!("{new} promoted"), 240, || async {
        dips.borrow_mut()
            .insert(gauge("rayshift_rayservice_capacity_dip_percent") as i64);
        freed
            .borrow_mut()
            .insert(gauge("rayshift_rayservice_capacity_freed_percent") as i64);
        mode.set(mode.get() || gauge("rayshift_rayservice_upgrade_resource_aware") == 1.0);
        let rs = env.get().await;
        (active(&rs).as_deref() == Some(new.as_str()) && pending(&rs).is_none()).then_some(())
    })
    .await;
    assert!(mode.get(), "the ResourceAware gauge never showed 1");
    assert_eq!(dips.borrow().last(), Some(&25), "dips seen in /metrics: {dips:?}");
    // The active cluster gave back 25 %, then 75 % (the last 25 % goes with the promotion).
    assert!(
        [25, 75].iter().all(|f| freed.borrow().contains(f)),
        "freed seen in /metrics: {freed:?}"
    );
    let to = Instant::now();
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    let raises = observer.raises(&new);
    for (at, weight) in &raises {
        let running = autoscaler.running_before(&new, *at);
        let verified = i64::try_from(running * 100 / GPU_WORKERS).unwrap();
        assert!(
            *weight <= verified,
            "{weight}% of traffic onto {running} replicas on Ready GPU workers"
        );
    }
    let switched = env.event_notes("ResourceAwareMode");
    assert!(
        switched
            .iter()
            .any(|(n, _)| n.contains("at or above 75%") && n.contains("nvidia.com/gpu")),
        "{switched:?}"
    );
    // The GPUs the new workers took were freed by KubeRay deleting the old cluster's workers.
    let deleted = env
        .cp
        .events(&env.ns)
        .into_iter()
        .filter(|e| {
            e["reason"] == "DeletedWorkerPod" && e["regarding"]["name"].as_str() == Some(old.as_str())
        })
        .count();
    assert!(deleted >= 1, "KubeRay deleted none of {old}'s workers");

    // What `rayshift plan` said before the upgrade, against what happened.
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("llm.json");
    let mut stored = serde_json::to_value(env.get().await).unwrap();
    stored.as_object_mut().unwrap().remove("status");
    std::fs::write(&manifest, stored.to_string()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rayshift"))
        .args(["plan", "-o", "json", "--resource-aware", "-f"])
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let dip = autoscaler.min_serving(from, to, GPU_WORKERS);
    let (old_levels, new_levels) = (observer.capacities(&old), observer.capacities(&new));
    let changes = capacity_changes(&old_levels, 100) + capacity_changes(&new_levels, 0);
    assert_eq!(
        (dip as i64, raises.len() as i64, changes as i64),
        (
            plan["min_serving_capacity"].as_i64().unwrap(),
            plan["traffic_steps"].as_i64().unwrap(),
            plan["capacity_changes"].as_i64().unwrap()
        ),
        "observed (dip, traffic steps, capacity changes) against the plan; capacities {old_levels:?} then \
         {new_levels:?}; workers {:?}",
        autoscaler.transitions(from)
    );
    assert!(dip < 100, "no dip: the upgrade did not need ResourceAware");
}
