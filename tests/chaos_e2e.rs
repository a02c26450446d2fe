//! Chaos on the real apiserver, with the real KubeRay operator running the RayClusters (kwok's Pods; the fake
//! dashboard plays Ray) and Traefik as the Gateway controller:
//! - the controller killed with SIGKILL at random instants of incremental upgrades (random options, some
//!   reverted mid-upgrade so they roll back), alone or as the leader of two replicas, then started again;
//! - kube-apiserver killed and started again mid-upgrade over the same etcd, once with etcd compacted while it
//!   was down (every resumed watch gets 410 Gone and must list again).
//!
//! Every upgrade must end as its spec says (completed, or rolled back), no RayCluster may be created twice,
//! nothing rayshift created may be left behind, and the invariant observer must see no broken invariant.
//! `RAYSHIFT_CHAOS_RUNS` sets the number of kill runs (a few in the suite; `scripts/bench.sh` runs 50) and
//! `RAYSHIFT_CHAOS_SEED` replays a run's random choices.

mod support;

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use gateway_api::{gateways::Gateway, httproutes::HttpRoute};
use k8s_openapi::api::core::v1::Service;
use kube::{Api, ResourceExt};
use rayshift_api::RayCluster;
use serde_json::json;
use support::{
    controller::ControllerProcess,
    incremental::{Env, GATE, head},
    observer::Observer,
    status::{active, pending},
};

/// The tests here restart the apiserver every test of this binary shares: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A small deterministic generator (xorshift64*), so a failed run can be replayed from its seed.
struct Dice(u64);

impl Dice {
    fn from_env() -> (u64, Self) {
        let seed = std::env::var("RAYSHIFT_CHAOS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        (seed, Dice(seed.max(1)))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[(self.next() % from.len() as u64) as usize]
    }

    /// Uniform in [lo, hi].
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo + 1))
    }
}

/// What one kill run does.
#[derive(Clone, Copy, Debug)]
struct Run {
    surge: i32,
    step: i32,
    /// Revert the spec this long after the upgrade starts (the upgrade rolls back).
    revert_after: Option<Duration>,
    /// Kill this long after the upgrade starts (or after the revert).
    kill_after: Duration,
    /// Start again this long after the kill.
    down_for: Duration,
    /// Two replicas with leader election; the leader is killed.
    leader_election: bool,
}

impl Run {
    fn roll(dice: &mut Dice, leader_election: bool) -> Self {
        let revert_after = dice.next().is_multiple_of(3).then(|| dice.millis(1_000, 4_000));
        let surge = dice.pick(&[20, 25, 50, 100]);
        // stepSizePercent ≤ maxSurgePercent (admission's rule).
        let steps: Vec<i32> = [10, 20, 25, 50].into_iter().filter(|s| *s <= surge).collect();
        Run {
            surge,
            step: dice.pick(&steps),
            revert_after,
            kill_after: dice.millis(0, 7_000),
            down_for: dice.millis(0, 2_000),
            leader_election,
        }
    }
}

const LEASE: [&str; 6] = [
    "--leader-elect-lease-duration",
    "3s",
    "--leader-elect-renew-deadline",
    "2s",
    "--leader-elect-retry-period",
    "500ms",
];

fn runs() -> usize {
    std::env::var("RAYSHIFT_CHAOS_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4)
}

/// The controllers of one run: one, or two with leader election.
struct Controllers {
    processes: Vec<ControllerProcess>,
    args: Vec<String>,
}

impl Controllers {
    fn start(env: &Env, leader_election: bool) -> Self {
        let mut args = vec![GATE.to_string()];
        if leader_election {
            args.extend([
                "--leader-elect".into(),
                "--leader-election-namespace".into(),
                env.ns.clone(),
            ]);
            args.extend(LEASE.iter().map(|s| s.to_string()));
        }
        let mut c = Controllers {
            processes: Vec::new(),
            args,
        };
        for _ in 0..if leader_election { 2 } else { 1 } {
            c.add(env);
        }
        c
    }

    fn add(&mut self, env: &Env) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.processes.push(ControllerProcess::start(
            env.cp,
            &env.ns,
            &env.dashboard.url_template(),
            &args,
        ));
    }

    /// SIGKILLs the leader (the only one without leader election) and returns how many were running.
    fn kill_leader(&mut self) -> usize {
        let n = self.processes.len();
        let leader = self
            .processes
            .iter()
            .position(|c| support::webhook::metric(&c.metrics(), "rayshift_controller_leader") == 1.0)
            .unwrap_or(0);
        let mut killed = self.processes.remove(leader);
        let _ = killed.child.kill();
        let _ = killed.child.wait();
        n
    }

    fn logs(&self) -> String {
        self.processes
            .iter()
            .map(|c| support::wait::tail(&c.logs(), 30))
            .collect::<Vec<_>>()
            .join("\n---\n")
    }
}

/// Objects named after a RayCluster that is gone (`<cluster>-serve-svc`, `<cluster>-head-svc`, ...) that
/// nothing will remove: without an ownerReference. Those with one are the garbage collector's to remove (it
/// learns of a new CRD's objects only at its periodic discovery resync, so on a young control plane that can
/// take a while).
async fn orphans(env: &Env, live: &BTreeSet<String>, ever: &BTreeSet<String>) -> Vec<String> {
    let mut objects = named::<Service>(env).await;
    objects.extend(named::<HttpRoute>(env).await);
    objects.extend(named::<Gateway>(env).await);
    objects
        .into_iter()
        .filter(|(n, owned)| {
            !owned
                && ever
                    .iter()
                    .any(|c| !live.contains(c) && n.starts_with(&format!("{c}-")))
        })
        .map(|(n, _)| n)
        .collect()
}

/// Every object of a kind in the namespace: its name, and whether it has an owner.
async fn named<K>(env: &Env) -> Vec<(String, bool)>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(env.client.clone(), &env.ns);
    let list = api.list(&Default::default()).await.unwrap();
    list.items
        .iter()
        .map(|o| {
            let owned = o.meta().owner_references.as_ref().is_some_and(|r| !r.is_empty());
            (o.name_any(), owned)
        })
        .collect()
}

async fn live_clusters(env: &Env) -> BTreeSet<String> {
    let clusters: Api<RayCluster> = Api::namespaced(env.client.clone(), &env.ns);
    clusters
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .map(|c| c.name_any())
        .collect()
}

/// Sets the head image (the change that starts an upgrade, or reverts one) and the run's options.
async fn set_spec(env: &Env, image: &str, run: &Run) {
    env.patch(json!({"spec": {
        "upgradeStrategy": {"clusterUpgradeOptions": {"maxSurgePercent": run.surge, "stepSizePercent": run.step}},
        "rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [head(image)]}}}}
    }}))
    .await;
}

/// One kill run: upgrade (maybe revert), SIGKILL the controller at the chosen instant, start it again, and
/// wait for the end the spec asks for. Returns the outcome ("completed" or "rolled back") or what went wrong.
async fn kill_run(env: &mut Env, n: usize, run: Run, serving: &mut String) -> Result<&'static str, String> {
    let before = live_clusters(env).await;
    let old = active(&env.get().await).ok_or("no active cluster before the run")?;
    let observer = Observer::start(
        env.client.clone(),
        &env.ns,
        "llm",
        i64::from(run.surge),
        env.dashboard.serving(&env.ns),
    );
    let mut controllers = Controllers::start(env, run.leader_election);
    let image = format!("ray:{n}");
    set_spec(env, &image, &run).await;
    if let Some(after) = run.revert_after {
        tokio::time::sleep(after).await;
        set_spec(env, serving, &run).await;
    }
    tokio::time::sleep(run.kill_after).await;
    let running = controllers.kill_leader();
    tokio::time::sleep(run.down_for).await;
    if controllers.processes.len() < running {
        controllers.add(env);
    }
    let expected = if run.revert_after.is_some() {
        old.clone()
    } else {
        serving.clone_from(&image);
        String::new()
    };
    // The end: one active cluster (the old one after a revert, a new one otherwise), nothing pending, and the
    // other cluster gone after the deletion delay.
    let deadline = Instant::now() + Duration::from_secs(90);
    let end = loop {
        let rs = env.get().await;
        let live = live_clusters(env).await;
        if let (Some(a), None) = (active(&rs), pending(&rs)) {
            let settled = live.len() == 1 && live.contains(&a);
            let right = if expected.is_empty() {
                a != old
            } else {
                a == expected
            };
            if settled && right {
                break a;
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "did not end within 90 s: status {}\nlive clusters {live:?}\n{}",
                serde_json::to_string(&rs.status).unwrap(),
                controllers.logs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut problems: Vec<String> = observer
        .violations()
        .into_iter()
        .map(|v| format!("invariant: {v}"))
        .collect();
    // At most one new RayCluster per upgrade: a restarted controller that forgot its pending cluster would
    // create a second.
    let seen = observer.seen.lock().unwrap().clusters.clone();
    let created: Vec<&String> = seen.difference(&before).collect();
    if created.len() > 1 {
        problems.push(format!(
            "{} RayClusters created for one upgrade: {created:?}",
            created.len()
        ));
    }
    let mut ever = seen.clone();
    ever.extend(before);
    let live = BTreeSet::from([end.clone()]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = orphans(env, &live, &ever).await;
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            problems.push(format!("left behind: {left:?}"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    match problems.is_empty() {
        true if expected.is_empty() => Ok("completed"),
        true => Ok("rolled back"),
        false => Err(format!("{}\n{}", problems.join("\n"), controllers.logs())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_instants_of_upgrades() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut env = Env::new("chaos").await;
    env.deploy(25, 25, 1).await;
    // Each run starts its own controllers.
    env.controller = None;
    let (seed, mut dice) = Dice::from_env();
    let total = runs();
    let mut serving = "ray:1".to_string();
    let mut outcomes = Vec::new();
    let mut failures = Vec::new();
    for n in 0..total {
        let run = Run::roll(&mut dice, n % 2 == 1);
        let started = Instant::now();
        let outcome = kill_run(&mut env, n + 2, run, &mut serving).await;
        let took = started.elapsed().as_secs_f64();
        println!("run {} of {total} ({took:.1} s): {run:?} → {outcome:?}", n + 1);
        match outcome {
            Ok(end) => outcomes.push(end),
            Err(why) => failures.push(format!("run {} {run:?}: {why}", n + 1)),
        }
    }
    let completed = outcomes.iter().filter(|o| **o == "completed").count();
    println!(
        "kill -9: {} of {total} upgrades ended as their spec asked ({completed} completed, {} rolled back); seed {seed}",
        outcomes.len(),
        outcomes.len() - completed
    );
    assert!(
        failures.is_empty(),
        "seed {seed} (RAYSHIFT_CHAOS_SEED replays it):\n{}",
        failures.join("\n\n")
    );
}

/// The test's monotonic instants on the controller's clock (`status.lastTrafficStepTime` is wall time; both
/// run on this machine), to tell a step decided late from one the apiserver or the watch delivered late.
struct WallClock(Instant, jiff::Timestamp);

impl WallClock {
    fn now() -> Self {
        WallClock(Instant::now(), jiff::Timestamp::now())
    }

    fn wall(&self, t: Instant) -> jiff::Timestamp {
        let after = jiff::SignedDuration::try_from(t.saturating_duration_since(self.0)).unwrap();
        let before = jiff::SignedDuration::try_from(self.0.saturating_duration_since(t)).unwrap();
        self.1 + after - before
    }

    /// When the controller decided the step the test saw at `seen`, against its due instant (the previous
    /// step + 1 s, or the previous route's acceptance as the test saw it, whichever is later).
    fn decision(&self, decided: &[jiff::Timestamp], accepted: Instant, seen: Instant) -> String {
        let seen = self.wall(seen);
        let Some(i) = decided.iter().rposition(|t| *t <= seen).filter(|i| *i > 0) else {
            return "its decision is not in the observed status".into();
        };
        let due = (decided[i - 1] + jiff::SignedDuration::from_secs(1)).max(self.wall(accepted));
        let ms = |d: jiff::SignedDuration| d.as_secs_f64() * 1000.0;
        format!(
            "on the controller's clock decided {:.1} ms after due, seen {:.1} ms after it was decided",
            ms(decided[i].duration_since(due)),
            ms(seen.duration_since(decided[i]))
        )
    }
}

/// Restarts kube-apiserver (blocking the test's own requests meanwhile) and returns when it is back.
async fn restart_apiserver(env: &Env, compact: bool) -> Instant {
    let cp = env.cp;
    tokio::task::spawn_blocking(move || cp.restart_apiserver(compact))
        .await
        .unwrap();
    let back = Instant::now();
    // The test's own client may still hold a connection to the killed apiserver: wait until it is through.
    while env.rayservices().get("llm").await.is_err() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    back
}

/// Whether Traefik's status on the route names its current generation; `Err` with that generation if not.
async fn route_current(env: &Env) -> Result<(), Option<i64>> {
    let routes: Api<HttpRoute> = Api::namespaced(env.client.clone(), &env.ns);
    let route = routes.get("llm-httproute").await.unwrap();
    let generation = route.metadata.generation;
    let current = route.status.iter().flat_map(|s| &s.parents).any(|p| {
        p.conditions
            .iter()
            .any(|c| c.type_ == "Accepted" && c.status == "True" && c.observed_generation == generation)
    });
    if current { Ok(()) } else { Err(generation) }
}

/// Waits until Traefik's status on the route names its current generation; returns when it did.
async fn route_accepted(env: &Env) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let generation = match route_current(env).await {
            Ok(()) => return Instant::now(),
            Err(generation) => generation,
        };
        assert!(
            Instant::now() < deadline,
            "Traefik never reported generation {generation:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long after the apiserver is back rayshift may take to write again: 15 s (issue 16's goal). When its next
/// change is a traffic step, it rightly waits for the Gateway controller to report the route's generation
/// (`WaitingForGateway`), and Traefik's own watches recover from a compacted etcd in 6–12 s, at times over 15 s
/// (the CI of 8aef7ae): then 5 s after Traefik reported it, at most 60 s in all.
fn resume_bound(progressing: Option<&str>, gateway_back: Option<Duration>) -> Duration {
    let goal = Duration::from_secs(15);
    match gateway_back {
        Some(back) => goal.max(back + Duration::from_secs(5)),
        None if progressing == Some("WaitingForGateway") => Duration::from_secs(60),
        None => goal,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restarts_mid_upgrade_and_the_upgrade_resumes() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let env = Env::new("apiserver").await;
    // Steps of 5%: steps remain after Traefik (the Gateway controller) has recovered from each restart.
    let old = env.deploy(20, 5, 1).await;
    let observer = env.observe(20);
    let before = live_clusters(&env).await;
    let new = env.upgrade_to("ray:2").await;
    let (mut recovered, mut restarts) = (Vec::new(), Vec::new());
    for (traffic, compact) in [(20, false), (60, true)] {
        env.pending_traffic_at_least(traffic, 60).await;
        restarts.push(Instant::now());
        let back = restart_apiserver(&env, compact).await;
        // The upgrade resumes: rayshift writes its next capacity or traffic change (the status trace says what
        // it waited for meanwhile).
        let levels = env.levels().await;
        let mut trace = Vec::new();
        let mut gateway_back = None;
        let written = loop {
            let rs = env.get().await;
            let reason = support::status::condition(&rs, "Progressing").map(|c| c.1);
            let now = (env.levels().await, reason);
            if trace.last().map(|(_, l)| l) != Some(&now) {
                trace.push((format!("{:.2} s", back.elapsed().as_secs_f64()), now.clone()));
            }
            if now.0 != levels {
                break back.elapsed();
            }
            if gateway_back.is_none() && route_current(&env).await.is_ok() {
                gateway_back = Some(back.elapsed());
            }
            assert!(
                back.elapsed() < resume_bound(now.1.as_deref(), gateway_back),
                "nothing written within 15 s of the apiserver being back (compact: {compact}), nor within 5 s of \
                 Traefik reporting the route again ({gateway_back:?} after): {trace:?}\n{}",
                support::wait::tail(&env.controller.as_ref().unwrap().logs(), 40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // The observer's next traffic step (it comes once Traefik, whose watches recover more slowly, has
        // reported the generation rayshift wrote before the restart).
        let resumed = loop {
            if let Some(t) = observer.raises(&new).iter().map(|r| r.0).find(|t| *t > back) {
                break t;
            }
            assert!(
                back.elapsed() < Duration::from_secs(60),
                "no traffic step 60 s after the restart"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        println!(
            "apiserver restart at {traffic}% (etcd compacted: {compact}): rayshift wrote again {:.2} s after it \
             was back, the next traffic step {:.2} s after (Traefik had reported the route again after {:?}); \
             status trace {trace:?}",
            written.as_secs_f64(),
            resumed.duration_since(back).as_secs_f64(),
            gateway_back
        );
        // Recovered: the Gateway controller (Traefik, after its own watches came back) reports the route's
        // current generation again; until then rayshift rightly waits (WaitingForGateway).
        let caught_up = route_accepted(&env).await;
        println!(
            "Traefik reported the current route generation {:.2} s after the apiserver was back",
            caught_up.duration_since(back).as_secs_f64()
        );
        // The test's own watches (the observer's, Traefik's route versions) have recovered by then too.
        recovered.push(caught_up.max(resumed));
    }
    env.promoted_to(&new, 120).await;
    let violations = observer.violations();
    assert!(violations.is_empty(), "invariants broken: {violations:#?}");
    let seen = observer.seen.lock().unwrap().clusters.clone();
    let created: Vec<&String> = seen.difference(&before).collect();
    assert_eq!(created, vec![&new], "RayClusters created by the upgrade");
    // Nothing duplicated: one route, one Gateway, the old cluster gone with what it owned.
    let live = BTreeSet::from([new.clone()]);
    let ever = BTreeSet::from([old.clone(), new.clone()]);
    let promoted = Instant::now();
    loop {
        let clusters = live_clusters(&env).await;
        let left = orphans(&env, &live, &ever).await;
        if clusters == live && left.is_empty() {
            break;
        }
        assert!(
            promoted.elapsed() < Duration::from_secs(90),
            "90 s after promotion: clusters {clusters:?}, left behind {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "old cluster and what it owned gone {:.1} s after promotion",
        promoted.elapsed().as_secs_f64()
    );
    // Pacing after each recovery, rayshift's part: from the first step after the apiserver was back, each
    // next route version is written when it is due (interval after the previous one) or when Traefik accepted
    // the previous one, whichever is later. Traefik's own recovery (its watches back off for seconds) is
    // Traefik's, and rayshift rightly waits for it (WaitingForGateway).
    let versions = env.gateway.routes();
    let clock = WallClock::now();
    let decided = observer.seen.lock().unwrap().step_times.clone();
    // After the recovery of the last restart before it: a step written while Traefik was still recovering from the
    // second restart is not after recovery because the first one had recovered (the test counted it so until
    // 2026-11-27, and that step, due when Traefik accepted the route again, was the one found late).
    let after_recovery = |t: Instant| {
        let last_restart = restarts.iter().zip(&recovered).rfind(|(r, _)| **r <= t);
        last_restart.is_some_and(|(_, back)| t >= *back)
    };
    let late: Vec<Duration> = versions
        .windows(2)
        .filter(|w| after_recovery(w[0].seen))
        .filter(|w| !restarts.iter().any(|r| w[0].seen < *r && w[1].seen >= *r))
        // Traffic steps only (after promotion the route is rewritten to the one cluster).
        .filter(|w| w[1].weights.len() == 2 && w[1].weights.get(&new) > w[0].weights.get(&new))
        .filter_map(|w| {
            let ready = (w[0].seen + Duration::from_secs(1)).max(w[0].accepted?);
            let late = w[1].seen.saturating_duration_since(ready);
            if late > Duration::from_millis(50) {
                println!(
                    "step to {:?}% of traffic {late:?} late; {}",
                    w[1].weights.get(&new),
                    clock.decision(&decided, w[0].accepted?, w[1].seen)
                );
            }
            Some(late)
        })
        .collect();
    let on_time = late.iter().filter(|l| **l <= Duration::from_millis(100)).count();
    println!(
        "steps after recovery, lateness after due and the gateway ready: {late:?}; {on_time} of {} ≤ 100 ms late",
        late.len()
    );
    assert!(late.len() >= 5, "too few steps after recovery: {late:?}");
    // The goal (≤ 100 ms, BENCHMARKS.md) is a count `scripts/bench.sh chaos` reports. A test's bound must hold
    // on a loaded 2-core machine, where this test's own watch delivers a route version late now and then: the
    // CI of c17db8ba saw one step of 13 at 127 ms, the other 12 within 6 ms.
    assert!(
        late.iter().all(|l| *l <= Duration::from_millis(300)),
        "a step after recovery was late: {late:?}\n{}",
        support::wait::tail(&env.controller.as_ref().unwrap().logs(), 300)
    );
    assert!(
        on_time * 4 >= late.len() * 3,
        "under 3 in 4 steps after recovery ≤ 100 ms late: {late:?}"
    );
}
