use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

use super::*;
use crate::upgrade_control::DEFAULT_DRAIN_SECONDS;

fn opts(surge: i32, step: i32, interval: i64) -> UpgradeOptions {
    UpgradeOptions {
        max_surge_percent: surge,
        step_size_percent: step,
        interval: SignedDuration::from_secs(interval),
        drain: SignedDuration::ZERO,
        resource_aware: None,
    }
}

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).unwrap()
}

fn observed(active: (i32, i32), pending: (i32, i32)) -> Observed {
    Observed {
        active: Levels {
            capacity: active.0,
            traffic: active.1,
        },
        pending: Levels {
            capacity: pending.0,
            traffic: pending.1,
        },
        last_traffic_step: None,
        direction: Direction::Forward,
        route_ready: true,
        pending_capacity_ready: true,
        active_capacity_ready: true,
        pending_capacity_found: true,
        active_capacity_found: true,
        pending_reachable: true,
        pending_stalled: false,
        paused: false,
        hurry: false,
        now: t(1000),
    }
}

#[test]
fn seed_example_timeline() {
    let plan = plan(&opts(20, 5, 10));
    assert_eq!(plan.peak_total_capacity, 120);
    assert_eq!(plan.traffic_steps, 20);
    assert_eq!(plan.min_duration_seconds, 190.0);
    let capacity_moves = |role: Role| -> Vec<i32> {
        let mut seen = vec![if role == Role::Active { 100 } else { 0 }];
        for s in &plan.steps {
            let c = if role == Role::Active {
                s.active_capacity
            } else {
                s.pending_capacity
            };
            if *seen.last().unwrap() != c {
                seen.push(c);
            }
        }
        seen
    };
    assert_eq!(capacity_moves(Role::Pending), vec![0, 20, 40, 60, 80, 100]);
    assert_eq!(capacity_moves(Role::Active), vec![100, 80, 60, 40, 20, 0]);
    let first_traffic = plan.steps.iter().find(|s| s.pending_traffic == 5).unwrap();
    assert_eq!(
        first_traffic.t_seconds, 0.0,
        "ready at once: the first step needs no wait"
    );
    assert_eq!(plan.steps.last().unwrap().action, "promote pending to active");
}

#[test]
fn full_surge_is_blue_green_over_the_route() {
    let plan = plan(&opts(100, 100, 0));
    assert_eq!(plan.peak_total_capacity, 200);
    assert_eq!(plan.traffic_steps, 1);
    assert_eq!(plan.min_duration_seconds, 0.0);
}

#[test]
fn pending_capacity_is_raised_first() {
    let a = next_action(&opts(20, 5, 10), &observed((100, 100), (0, 0)));
    assert_eq!(
        a,
        Action::SetTargetCapacity {
            role: Role::Pending,
            percent: 20
        }
    );
}

#[test]
fn traffic_waits_exactly_for_the_interval() {
    let mut o = observed((100, 95), (20, 5));
    o.last_traffic_step = Some(t(995));
    assert_eq!(
        next_action(&opts(20, 5, 10), &o),
        Action::Wait {
            until: Some(t(1005)),
            reason: WaitReason::Interval
        }
    );
    o.now = t(1005);
    assert_eq!(
        next_action(&opts(20, 5, 10), &o),
        Action::SetTraffic {
            active: 90,
            pending: 10
        }
    );
}

#[test]
fn hurry_skips_the_interval_but_not_capacity_checks() {
    let mut o = observed((100, 95), (20, 5));
    o.last_traffic_step = Some(t(999));
    o.hurry = true;
    assert_eq!(
        next_action(&opts(20, 5, 10), &o),
        Action::SetTraffic {
            active: 90,
            pending: 10
        }
    );
    o.pending_capacity_ready = false;
    assert_eq!(
        next_action(&opts(20, 5, 10), &o),
        wait(WaitReason::PendingCapacityNotReady)
    );
}

#[test]
fn traffic_never_moves_without_verified_capacity_or_route() {
    let mut o = observed((100, 100), (20, 0));
    o.pending_capacity_ready = false;
    assert_eq!(
        next_action(&opts(20, 5, 10), &o),
        wait(WaitReason::PendingCapacityNotReady)
    );
    o.pending_capacity_ready = true;
    o.route_ready = false;
    assert_eq!(next_action(&opts(20, 5, 10), &o), wait(WaitReason::RouteNotReady));
}

#[test]
fn traffic_stops_at_pending_capacity_then_active_scales_down() {
    let o = observed((100, 80), (20, 20));
    assert_eq!(
        next_action(&opts(20, 5, 10), &o),
        Action::SetTargetCapacity {
            role: Role::Active,
            percent: 80
        }
    );
    let o = observed((80, 80), (20, 20));
    assert_eq!(
        next_action(&opts(20, 5, 10), &o),
        Action::SetTargetCapacity {
            role: Role::Pending,
            percent: 40
        }
    );
}

#[test]
fn promotes_when_pending_carries_everything() {
    let o = observed((0, 0), (100, 100));
    assert_eq!(next_action(&opts(20, 5, 10), &o), Action::Promote);
}

#[test]
fn the_cluster_that_lost_its_traffic_drains_before_capacity_zero() {
    let opts = opts(50, 25, 10).with_drain_seconds(5);
    // Forward: all traffic just moved to pending at t(1000); the active cluster keeps 50% until t(1005).
    let mut o = observed((50, 0), (100, 100));
    o.last_traffic_step = Some(t(1000));
    let draining = Action::Wait {
        until: Some(t(1005)),
        reason: WaitReason::Draining,
    };
    assert_eq!(next_action(&opts, &o), draining);
    o.now = t(1005);
    let cut = Action::SetTargetCapacity {
        role: Role::Active,
        percent: 0,
    };
    assert_eq!(next_action(&opts, &o), cut);
    // A partial cut (traffic still on the active cluster) does not wait.
    let mut o = observed((100, 50), (50, 50));
    o.last_traffic_step = Some(t(1000));
    assert_eq!(
        next_action(&opts, &o),
        Action::SetTargetCapacity {
            role: Role::Active,
            percent: 50
        }
    );
    // Rollback: the pending cluster keeps its replicas for the drain time too.
    let mut o = observed((100, 100), (50, 0));
    o.direction = Direction::Rollback;
    o.last_traffic_step = Some(t(1000));
    assert_eq!(next_action(&opts, &o), draining);
    // The plan counts it: the seed example ends 5 s after its last traffic step.
    let seed = self::opts(20, 5, 10);
    assert_eq!(
        plan(&seed.with_drain_seconds(5)).min_duration_seconds,
        plan(&seed).min_duration_seconds + 5.0
    );
}

#[test]
fn paused_holds_but_repairs_still_happen() {
    let mut o = observed((100, 95), (20, 5));
    o.paused = true;
    assert_eq!(next_action(&opts(20, 5, 10), &o), wait(WaitReason::Paused));
    let mut broken = observed((100, 60), (20, 40));
    broken.paused = true;
    assert_eq!(
        next_action(&opts(20, 5, 10), &broken),
        Action::SetTraffic {
            active: 80,
            pending: 20
        }
    );
}

#[test]
fn repairs_weights_that_do_not_sum_to_100() {
    let o = observed((100, 90), (20, 5));
    assert_eq!(
        next_action(&opts(20, 5, 10), &o),
        Action::SetTraffic {
            active: 95,
            pending: 5
        }
    );
}

#[test]
fn rollback_never_leaves_pending_under_capacity() {
    // KubeRay bug 9.7: maxSurge 30, pending at 60% capacity with 45% traffic.
    let mut o = observed((70, 55), (60, 45));
    o.direction = Direction::Rollback;
    o.last_traffic_step = Some(t(0));
    let opts = opts(30, 15, 10);
    assert_eq!(
        next_action(&opts, &o),
        Action::SetTraffic {
            active: 70,
            pending: 30
        }
    );
    o.active.traffic = 70;
    o.pending.traffic = 30;
    assert_eq!(
        next_action(&opts, &o),
        Action::SetTargetCapacity {
            role: Role::Pending,
            percent: 30
        }
    );
}

#[test]
fn rollback_finishes_even_if_pending_is_unreachable() {
    let mut o = observed((100, 100), (40, 0));
    o.direction = Direction::Rollback;
    o.pending_reachable = false;
    assert_eq!(next_action(&opts(20, 5, 10), &o), Action::FinishRollback);
    o.pending_reachable = true;
    assert_eq!(
        next_action(&opts(20, 5, 10), &o),
        Action::SetTargetCapacity {
            role: Role::Pending,
            percent: 20
        }
    );
}

#[test]
fn going_forward_over_the_surge_bound_lowers_capacity_first() {
    // A rollback raised the active side while the pending one was unreachable, then the spec was reverted.
    let o = observed((100, 99), (2, 1));
    assert_eq!(
        next_action(&opts(1, 1, 0), &o),
        Action::SetTargetCapacity {
            role: Role::Active,
            percent: 99
        }
    );
    // The active side already at its traffic: the pending side comes down instead.
    let o = observed((99, 99), (40, 1));
    assert_eq!(
        next_action(&opts(20, 5, 0), &o),
        Action::SetTargetCapacity {
            role: Role::Pending,
            percent: 21
        }
    );
}

#[test]
fn rollback_moves_traffic_only_to_verified_active_capacity() {
    let mut o = observed((80, 60), (40, 40));
    o.direction = Direction::Rollback;
    o.active_capacity_ready = false;
    assert_eq!(
        next_action(&opts(20, 5, 10), &o),
        wait(WaitReason::ActiveCapacityNotReady)
    );
}

#[test]
fn options_from_spec() {
    let spec = ClusterUpgradeOptions {
        step_size_percent: Some(5),
        interval_seconds: Some(10),
        ..Default::default()
    };
    let drained = opts(100, 5, 10).with_drain_seconds(DEFAULT_DRAIN_SECONDS);
    assert_eq!(UpgradeOptions::from_spec(&spec), Some(drained));
    let never = ClusterUpgradeOptions {
        max_surge_percent: Some(0),
        ..spec.clone()
    };
    assert_eq!(UpgradeOptions::from_spec(&never), None);
    assert_eq!(UpgradeOptions::from_spec(&ClusterUpgradeOptions::default()), None);
}

/// What the world does between two planner calls.
#[derive(Clone, Debug)]
enum Event {
    Advance(i64),
    PendingReady(bool),
    ActiveReady(bool),
    RouteReady(bool),
    Pause(bool),
    Rollback,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0i64..40).prop_map(Event::Advance),
        2 => any::<bool>().prop_map(Event::PendingReady),
        1 => any::<bool>().prop_map(Event::ActiveReady),
        1 => any::<bool>().prop_map(Event::RouteReady),
        1 => any::<bool>().prop_map(Event::Pause),
        1 => Just(Event::Rollback),
    ]
}

fn options() -> impl Strategy<Value = UpgradeOptions> {
    (1i32..=100).prop_flat_map(|surge| {
        (Just(surge), 1i32..=surge, 0i64..30, 0i64..20)
            .prop_map(|(surge, step, interval, drain)| opts(surge, step, interval).with_drain_seconds(drain))
    })
}

fn assert_invariants(opts: &UpgradeOptions, o: &Observed) -> Result<(), TestCaseError> {
    let (a, p) = (o.active, o.pending);
    prop_assert_eq!(a.traffic + p.traffic, 100, "weights sum to 100: {:?}", o);
    prop_assert!(
        p.traffic <= p.capacity,
        "pending weight <= pending capacity: {:?}",
        o
    );
    prop_assert!(
        a.traffic <= a.capacity,
        "active weight <= active capacity: {:?}",
        o
    );
    prop_assert!(
        a.capacity + p.capacity <= 100 + opts.max_surge_percent,
        "surge bound: {:?}",
        o
    );
    for v in [a.capacity, a.traffic, p.capacity, p.traffic] {
        prop_assert!((0..=100).contains(&v));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random options and random event orders: invariants hold after every action, forward progress is
    /// monotone, traffic only moves onto verified capacity, and every upgrade ends in bounded steps.
    #[test]
    fn upgrades_keep_invariants_and_terminate(opts in options(), events in prop::collection::vec(event(), 0..200)) {
        let mut o = observed((100, 100), (0, 0));
        o.now = t(0);
        let mut events = events.into_iter();
        let mut actions = 0usize;
        let mut finished = false;
        for _ in 0..10_000 {
            match events.next() {
                Some(Event::Advance(s)) => o.now = o.now.checked_add(SignedDuration::from_secs(s)).unwrap(),
                Some(Event::PendingReady(r)) => o.pending_capacity_ready = r,
                Some(Event::ActiveReady(r)) => o.active_capacity_ready = r,
                Some(Event::RouteReady(r)) => o.route_ready = r,
                Some(Event::Pause(p)) => o.paused = p,
                Some(Event::Rollback) => o.direction = Direction::Rollback,
                // Once the script runs out the world settles, so the upgrade must finish.
                None => {
                    o.pending_capacity_ready = true;
                    o.active_capacity_ready = true;
                    o.route_ready = true;
                    o.paused = false;
                }
            }
            let before = o;
            let action = next_action(&opts, &o);
            match action {
                Action::Wait { until, reason } => {
                    if let Some(due) = until {
                        prop_assert!(matches!(reason, WaitReason::Interval | WaitReason::Draining), "{:?}", reason);
                        prop_assert!(due > o.now);
                        o.now = due;
                    }
                    continue;
                }
                Action::Promote => {
                    prop_assert_eq!(o.direction, Direction::Forward);
                    prop_assert_eq!((o.active.capacity, o.pending.traffic), (0, 100));
                    finished = true;
                    break;
                }
                Action::FinishRollback => {
                    prop_assert_eq!(o.direction, Direction::Rollback);
                    prop_assert_eq!((o.active.capacity, o.active.traffic), (100, 100));
                    finished = true;
                    break;
                }
                Action::SetTraffic { pending, .. } if pending > before.pending.traffic => {
                    prop_assert!(before.pending_capacity_ready && before.route_ready, "traffic onto unverified capacity");
                }
                Action::SetTraffic { active, .. } if active > before.active.traffic => {
                    prop_assert!(before.active_capacity_ready && before.route_ready, "traffic back onto unverified capacity");
                }
                _ => {}
            }
            prop_assert!(!before.paused, "no change while paused");
            apply(&mut o, action);
            let lowered = o.active.capacity < before.active.capacity || o.pending.capacity < before.pending.capacity;
            prop_assert!(!lowered || before.route_ready, "capacity lowered before the route moved traffic off it");
            let emptied = (o.active.capacity == 0 && before.active.capacity > 0) || (o.pending.capacity == 0 && before.pending.capacity > 0);
            let drained = before.last_traffic_step.is_none_or(|t| before.now >= t + opts.drain);
            prop_assert!(!emptied || drained, "a cluster went to capacity 0 within the drain time of its last traffic: {:?}", before);
            actions += 1;
            assert_invariants(&opts, &o)?;
            if o.direction == Direction::Forward {
                prop_assert!(o.pending.capacity >= before.pending.capacity);
                prop_assert!(o.pending.traffic >= before.pending.traffic);
                prop_assert!(o.active.capacity <= before.active.capacity);
            } else {
                prop_assert!(o.active.traffic >= before.active.traffic);
                prop_assert!(o.pending.capacity <= before.pending.capacity || before.direction == Direction::Forward);
            }
            prop_assert!(action != Action::SetTraffic { active: before.active.traffic, pending: before.pending.traffic }, "no-op step");
            prop_assert!(actions <= MAX_ACTIONS, "bounded number of steps");
        }
        prop_assert!(finished, "upgrade did not terminate");
    }

    /// Any state at all is brought back within the invariants by repairs alone.
    #[test]
    fn repairs_restore_invariants(opts in options(), ac in 0i32..=100, at in 0i32..=100, pc in 0i32..=100, pt in 0i32..=100) {
        let mut o = observed((ac, at), (pc, pt));
        for _ in 0..3 {
            match repair(&opts, &o) {
                Some(a) => apply(&mut o, a),
                None => break,
            }
        }
        prop_assert!(repair(&opts, &o).is_none());
        prop_assert_eq!(o.active.traffic + o.pending.traffic, 100);
        prop_assert!(o.pending.traffic <= o.pending.capacity && o.active.traffic <= o.active.capacity);
    }

    /// The plan of any valid options ends promoted with the expected number of traffic steps.
    #[test]
    fn plans_end_promoted(opts in options()) {
        let plan = plan(&opts);
        prop_assert_eq!(plan.steps.last().unwrap().action.as_str(), "promote pending to active");
        prop_assert!(plan.peak_total_capacity <= 100 + opts.max_surge_percent);
        prop_assert!(plan.traffic_steps >= (100 + opts.step_size_percent - 1) as usize / opts.step_size_percent as usize);
    }
}

/// What the world and the user do between two passes, for the whole-decision property below.
#[derive(Clone, Debug)]
enum World {
    Advance(i64),
    /// The clock jumps, either way (NTP, a VM resumed).
    Jump(i64),
    PendingReady(bool),
    ActiveReady(bool),
    /// A dashboard answers or errors.
    PendingReachable(bool),
    ActiveReachable(bool),
    RouteReady(bool),
    Control(crate::upgrade_control::Control),
    /// The spec is edited away from the pending cluster's (or back to it).
    SpecMatchesPending(bool),
    /// The next pass's effect reaches Serve but its status write is lost (a conflict).
    StatusLost,
    /// What Prometheus answers for the SLO check from now on.
    Slo(SloAnswer),
}

#[derive(Clone, Copy, Debug)]
enum SloAnswer {
    Good,
    Bad,
    NoData,
    Unreachable,
}

fn slo_answer() -> impl Strategy<Value = SloAnswer> {
    prop_oneof![
        Just(SloAnswer::Good),
        Just(SloAnswer::Bad),
        Just(SloAnswer::NoData),
        Just(SloAnswer::Unreachable)
    ]
}

/// One error-ratio check, evaluated every 5 s on a 10 s window.
fn slo_check(on_failure: crate::slo::OnFailure) -> crate::slo::SloCheck {
    crate::slo::SloCheck {
        name: "errors".into(),
        query: "errors".into(),
        comparison: crate::slo::Comparison::AtMost,
        threshold: 0.01,
        window_seconds: 10,
        interval_seconds: 5,
        failure_limit: 2,
        on_failure,
    }
}

fn slo_reading(answer: SloAnswer) -> crate::slo::Reading {
    use crate::slo::Reading;
    match answer {
        SloAnswer::Good => Reading::Value(0.0),
        SloAnswer::Bad => Reading::Value(0.5),
        SloAnswer::NoData => Reading::Value(f64::NAN),
        SloAnswer::Unreachable => Reading::Unavailable("connection refused".into()),
    }
}

fn world() -> impl Strategy<Value = World> {
    use crate::upgrade_control::Control;
    prop_oneof![
        6 => (0i64..40).prop_map(World::Advance),
        1 => (-600i64..3600).prop_map(World::Jump),
        2 => any::<bool>().prop_map(World::PendingReady),
        1 => any::<bool>().prop_map(World::ActiveReady),
        1 => any::<bool>().prop_map(World::PendingReachable),
        1 => any::<bool>().prop_map(World::ActiveReachable),
        1 => any::<bool>().prop_map(World::RouteReady),
        1 => prop_oneof![Just(Control::Run), Just(Control::Pause), Just(Control::Promote), Just(Control::Abort)]
            .prop_map(World::Control),
        1 => any::<bool>().prop_map(World::SpecMatchesPending),
        1 => Just(World::StatusLost),
        2 => slo_answer().prop_map(World::Slo),
    ]
}

/// A running upgrade's status as the lifecycle leaves it: active `a` serving, pending `p` just created.
fn upgrade_status() -> crate::RayServiceStatuses {
    use crate::rayservice::ClusterServiceStatus;
    let side = |name: &str| ClusterServiceStatus {
        ray_cluster_name: Some(name.into()),
        ..Default::default()
    };
    crate::RayServiceStatuses {
        active_service_status: Some(side("a")),
        pending_service_status: Some(side("p")),
        ..Default::default()
    }
}

fn levels_of(status: &crate::RayServiceStatuses) -> Observed {
    let mut o = observed((0, 0), (0, 0));
    o.active = Levels::from_status(status.active_service_status.as_ref(), Role::Active);
    o.pending = Levels::from_status(status.pending_service_status.as_ref(), Role::Pending);
    o
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    /// The upgrade's whole pure decision ([`decide`]), steering included (abort, pause, promote, progress
    /// deadline, spec edits and reverts, clock jumps, dashboards failing, capacity and route readiness at
    /// any moment): the invariants hold after every pass, no traffic moves onto unverified capacity or
    /// before it is due (unless promoted), nothing moves while paused, every traffic step is its own event,
    /// an abort sticks until the rollback finishes, and every upgrade completes or rolls back once the
    /// world settles, also when a pass's status write was lost after its effect reached Serve (Serve's own
    /// `target_capacity` is modelled: once the world settles, capacity is verified only where Serve runs
    /// what the status records). With an SLO check, Prometheus answering well, badly, without data or not at
    /// all: no forward step after the first goes without a pass on data from a window after the last step,
    /// and a failing check rolls back or pauses (the pause written as the annotation).
    #[test]
    fn the_whole_decision_keeps_invariants_and_terminates(
        opts in options(),
        deadline in 1i64..900,
        script in prop::collection::vec(world(), 0..300),
        slo in prop_oneof![Just(None), Just(Some(crate::slo::OnFailure::Rollback)), Just(Some(crate::slo::OnFailure::Pause))],
    ) {
        use crate::upgrade_control::Control;
        use decide::{ClusterSeen, Effect, Observation, Settings, Tally};
        let mut status = upgrade_status();
        let mut now = t(1_000_000);
        let mut settings = Settings {
            options: opts,
            control: Control::Run,
            deadline: SignedDuration::from_secs(deadline),
            goal_digest: "goal".into(),
            namespace: "ns".into(),
            generation: 1,
            serve_poll: SignedDuration::from_secs(2),
            capacity_poll: SignedDuration::from_millis(50),
            slo_checks: slo.map(slo_check).into_iter().collect(),
            resource_aware: Default::default(),
            max_unavailable_percent: 10,
        };
        let mut answer = SloAnswer::Good;
        let cluster = |name: &str, digest: &str| ClusterSeen {
            name: name.into(),
            spec_digest: Some(digest.into()),
            reachable: false,
            capacity_verified: false,
            capacity_found: false,
            serve_capacity: None,
        };
        let mut seen = Observation {
            active: Some(ClusterSeen { reachable: true, ..cluster("a", "old") }),
            pending: Some(cluster("p", "goal")),
            route_ready: false,
            slo: Vec::new(),
            pending_stall: None,
        };
        let mut script = script.into_iter();
        let mut aborted = false;
        let mut outcome = None;
        let mut wake = now;
        // Serve's target_capacity on `a` and `p`; whether the next status write is lost.
        let mut serve = [100, 0];
        let mut lose_status = false;
        for _ in 0..20_000 {
            let (a, p) = (seen.active.as_mut().unwrap(), seen.pending.as_mut().unwrap());
            match script.next() {
                Some(World::Advance(s)) | Some(World::Jump(s)) => now = now.checked_add(SignedDuration::from_secs(s)).unwrap(),
                Some(World::PendingReady(r)) => p.capacity_verified = r,
                Some(World::ActiveReady(r)) => a.capacity_verified = r,
                Some(World::PendingReachable(r)) => p.reachable = r,
                Some(World::ActiveReachable(r)) => a.reachable = r,
                Some(World::RouteReady(r)) => seen.route_ready = r,
                Some(World::Control(c)) => settings.control = c,
                Some(World::SpecMatchesPending(g)) => settings.goal_digest = if g { "goal" } else { "newer" }.into(),
                Some(World::StatusLost) => lose_status = true,
                Some(World::Slo(a)) => answer = a,
                None => {
                    answer = SloAnswer::Good;
                    let recorded = levels_of(&status);
                    a.capacity_verified = serve[0] == recorded.active.capacity;
                    p.capacity_verified = serve[1] == recorded.pending.capacity;
                    a.capacity_found = a.capacity_verified;
                    p.capacity_found = p.capacity_verified;
                    for c in [a, p] {
                        c.reachable = true;
                    }
                    seen.route_ready = true;
                    settings.control = Control::Run;
                    // The controller comes back when the last pass said.
                    now = wake.max(now);
                }
            }
            for (c, level) in [(&mut seen.active, serve[0]), (&mut seen.pending, serve[1])] {
                let c = c.as_mut().unwrap();
                c.serve_capacity = c.reachable.then_some(level);
            }
            let before = levels_of(&status);
            let last_step = decide::last_step_time(&status);
            seen.slo = super::slo_gate::due(&status, &settings, seen.pending.as_ref(), now)
                .into_iter()
                .map(|c| crate::slo::Evaluation { check: c.name.clone(), query: c.query.clone(), reading: slo_reading(answer) })
                .collect();
            let passed_before: Vec<_> = status.progress.slo_checks.iter()
                .filter(|r| r.outcome == crate::slo::Outcome::Pass)
                .filter(|r| last_step.is_none_or(|l| r.time >= l + SignedDuration::from_secs(10)))
                .map(|r| r.name.clone())
                .collect();
            let passing_now = seen.slo.iter().all(|e| matches!(e.reading, crate::slo::Reading::Value(v) if v == 0.0));
            let d = decide(&seen, &status, &settings, now);
            if d.pause {
                prop_assert_eq!(slo, Some(crate::slo::OnFailure::Pause), "paused by a check that rolls back");
                settings.control = Control::Pause;
            }
            for effect in &d.effects {
                if let Effect::TargetCapacity { cluster, percent, .. } = effect {
                    serve[usize::from(cluster == "p")] = *percent;
                }
            }
            let kept = !std::mem::take(&mut lose_status);
            if kept {
                aborted |= d.status.progress.upgrade_abort.is_some();
            }
            prop_assert!(!aborted || d.status.progress.upgrade_abort.is_some() || d.status.pending_service_status.is_none(), "an abort sticks");
            prop_assert!(d.wake.is_some_and(|w| w > now), "every pass says when to look again");
            wake = d.wake.unwrap_or(now);
            if let Some(due) = d.step_due {
                prop_assert!(due > now && d.effects.is_empty());
            }
            let moved = d.notices.iter().filter(|n| n.reason == "UpdatedHTTPRoute").count();
            prop_assert_eq!(moved, usize::from(d.effects.contains(&Effect::Traffic)), "one event per traffic step");
            if let Some(Tally::Finished { result, .. }) = d.tallies.iter().find(|t| matches!(t, Tally::Finished { .. })) {
                if d.status.pending_service_status.is_none() && d.status.active_service_status.as_ref().unwrap().ray_cluster_name.as_deref() == Some("p") {
                    prop_assert!(!aborted && settings.goal_digest == "goal", "promoted an aborted or outdated upgrade");
                }
                outcome = Some(*result);
                break;
            }
            if kept {
                status = d.status;
            }
            let after = levels_of(&status);
            let (a, p) = (seen.active.as_ref().unwrap(), seen.pending.as_ref().unwrap());
            // Deliberate: in a rollback, a pending cluster whose Serve cannot be reached counts with the
            // traffic it still carries, not its last recorded capacity (getting traffic off it comes first).
            // Above the bound for that reason, the sum only falls until the pending capacity is lowered.
            let mut bounded = after;
            let sum = |o: &Observed| o.active.capacity + o.pending.capacity;
            let rollback = status.progress.direction(settings.goal_digest == "goal") == Direction::Rollback;
            if (rollback && !p.reachable) || sum(&after) <= sum(&before) {
                bounded.pending.capacity = after.pending.traffic;
            }
            assert_invariants(&opts, &bounded)?;
            prop_assert!(after.pending.traffic <= after.pending.capacity);
            if after.pending.traffic > before.pending.traffic {
                prop_assert!(p.reachable && p.capacity_verified && seen.route_ready, "traffic onto unverified capacity");
                let gated = !settings.slo_checks.is_empty() && before.pending.traffic > 0 && settings.control != Control::Promote && !rollback;
                if gated {
                    let now_passed = passing_now && !seen.slo.is_empty() && last_step.is_none_or(|l| now >= l + SignedDuration::from_secs(10));
                    prop_assert!(passed_before.len() == 1 || now_passed, "a step without a passed SLO check after the last one");
                }
            }
            if after.active.traffic > before.active.traffic {
                prop_assert!(a.reachable && a.capacity_verified && seen.route_ready, "traffic back onto unverified capacity");
            }
            let lowered = after.active.capacity < before.active.capacity || after.pending.capacity < before.pending.capacity;
            prop_assert!(!lowered || seen.route_ready, "capacity lowered before the route moved traffic off it");
            if d.effects.contains(&Effect::Traffic) {
                let due = last_step.map(|l| l + opts.interval);
                prop_assert!(settings.control == Control::Promote || due.is_none_or(|d| now >= d), "a step before it was due");
            }
            if settings.control == Control::Pause {
                prop_assert_eq!((after.active, after.pending), (before.active, before.pending), "no change while paused");
            }
        }
        prop_assert!(outcome.is_some(), "neither completed nor rolled back: {:?}", status);
    }
}

fn decide_settings(control: crate::upgrade_control::Control) -> decide::Settings {
    decide::Settings {
        options: opts(50, 50, 10),
        control,
        deadline: SignedDuration::from_secs(600),
        goal_digest: "goal".into(),
        namespace: "ns".into(),
        generation: 3,
        serve_poll: SignedDuration::from_secs(2),
        capacity_poll: SignedDuration::from_millis(50),
        slo_checks: Vec::new(),
        resource_aware: Default::default(),
        max_unavailable_percent: 10,
    }
}

fn both_ready() -> decide::Observation {
    let seen = |name: &str, digest: &str| decide::ClusterSeen {
        name: name.into(),
        spec_digest: Some(digest.into()),
        reachable: true,
        capacity_verified: true,
        capacity_found: true,
        serve_capacity: None,
    };
    decide::Observation {
        active: Some(seen("a", "old")),
        pending: Some(seen("p", "goal")),
        route_ready: true,
        slo: Vec::new(),
        pending_stall: None,
    }
}

fn progressing_condition(
    s: &crate::RayServiceStatuses,
) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let mut conditions = s.conditions.iter().flatten();
    conditions.find(|c| c.type_ == decide::PROGRESSING).unwrap()
}

#[test]
fn a_decided_pass_carries_its_events_conditions_and_wake() {
    use crate::upgrade_control::Control;
    use decide::{Effect, Tally};
    let progressing = |s: &crate::RayServiceStatuses| {
        let c = progressing_condition(s);
        (c.status.clone(), c.reason.clone())
    };
    // First pass: raise the pending capacity, with its event; come back at once.
    let d = decide(
        &both_ready(),
        &upgrade_status(),
        &decide_settings(Control::Run),
        t(100),
    );
    assert_eq!(
        d.effects,
        [Effect::TargetCapacity {
            role: Role::Pending,
            cluster: "p".into(),
            percent: 50
        }]
    );
    assert_eq!(
        d.notices[0].note,
        "Set target_capacity of pending RayCluster ns/p: 0% → 50%"
    );
    assert_eq!(d.tallies, vec![Tally::CapacityChange(Role::Pending)]);
    assert_eq!(d.wake, Some(t(100) + SignedDuration::from_millis(20)));
    assert_eq!(progressing(&d.status), ("True".into(), "StepsOnSchedule".into()));
    // Paused: no effect, one UpgradePaused event, Progressing False; resumed: one UpgradeResumed event.
    let paused = decide(&both_ready(), &d.status, &decide_settings(Control::Pause), t(101));
    assert_eq!(
        (paused.effects.clone(), paused.notices[0].reason),
        (vec![], "UpgradePaused")
    );
    assert_eq!(progressing(&paused.status), ("False".into(), "Paused".into()));
    let again = decide(
        &both_ready(),
        &paused.status,
        &decide_settings(Control::Pause),
        t(102),
    );
    assert!(again.notices.is_empty(), "paused is told once");
    let resumed = decide(
        &both_ready(),
        &again.status,
        &decide_settings(Control::Run),
        t(103),
    );
    assert_eq!(resumed.notices[0].reason, "UpgradeResumed");
    // The traffic step is stamped with the decision's instant; the next one is due an interval later.
    assert_eq!(resumed.effects, [Effect::Traffic]);
    assert_eq!(resumed.status.progress.last_traffic_step_time, Some(t(103)));
    // Capacity follows (active down, pending up), then the next step waits for its interval.
    let mut waiting = resumed.clone();
    for second in 104..107 {
        waiting = decide(
            &both_ready(),
            &waiting.status,
            &decide_settings(Control::Run),
            t(second),
        );
    }
    assert!(waiting.effects.is_empty());
    assert_eq!(waiting.step_due, Some(t(113)));
    assert_eq!(waiting.wake, Some(t(113)));
    // The pending cluster's dashboard fails: a capacity change waits and says so.
    let mut seen = both_ready();
    seen.active.as_mut().unwrap().reachable = false;
    let blocked = decide(&seen, &resumed.status, &decide_settings(Control::Run), t(104));
    assert!(blocked.effects.is_empty());
    assert_eq!(
        progressing(&blocked.status),
        ("False".into(), "WaitingForActiveCapacity".into())
    );
    assert_eq!(blocked.wake, Some(t(106)));
}

#[test]
fn a_capacity_found_once_is_confirmed_at_the_capacity_poll_before_its_step_is_due() {
    use crate::upgrade_control::Control;
    let settings = decide_settings(Control::Run);
    // A step at 103, then capacity follows (active down, pending up) as in the test above.
    let mut d = decide(&both_ready(), &upgrade_status(), &settings, t(100));
    for second in 101..106 {
        d = decide(&both_ready(), &d.status, &settings, t(second));
    }
    let raised = d.status.clone();
    assert_eq!(decide::last_step_time(&raised), Some(t(101)));
    let mut seen = both_ready();
    let pending = seen.pending.as_mut().unwrap();
    // Not found: the next read comes at the serve poll, at most at the due instant.
    pending.capacity_verified = false;
    pending.capacity_found = false;
    let waiting = decide(&seen, &raised, &settings, t(106));
    assert_eq!((waiting.effects.clone(), waiting.step_due), (vec![], None));
    assert_eq!(waiting.wake, Some(t(108)));
    let close = decide(&seen, &raised, &settings, t(110));
    assert_eq!(close.wake, Some(t(111)), "no later than the due instant");
    // Found once, one read short of verified: confirmed at the capacity poll, not at the due instant.
    seen.pending.as_mut().unwrap().capacity_found = true;
    let found = decide(&seen, &raised, &settings, t(110));
    assert!(found.effects.is_empty());
    assert_eq!(found.wake, Some(t(110) + SignedDuration::from_millis(50)));
}

/// The real-Ray test found it: a pass lowered the active cluster's capacity, its status write conflicted
/// with the user's spec revert, and the rollback then waited forever for the active cluster to run the
/// capacity the status still recorded (nobody set it back). Serve is set back to the record, and the
/// rollback finishes.
#[test]
fn a_lost_status_write_before_a_rollback_does_not_stall_it() {
    use crate::upgrade_control::Control;
    use decide::{Effect, Tally, UpgradeResult};
    let mut settings = decide_settings(Control::Run);
    let mut seen = both_ready();
    let mut status = upgrade_status();
    // Serve's target_capacity on `a` and `p`.
    let mut serve = [100, 0];
    let mut now = t(100);
    let observe = |seen: &mut decide::Observation, status: &crate::RayServiceStatuses, serve: [i32; 2]| {
        let recorded = levels_of(status);
        let (a, p) = (seen.active.as_mut().unwrap(), seen.pending.as_mut().unwrap());
        (a.serve_capacity, p.serve_capacity) = (Some(serve[0]), Some(serve[1]));
        a.capacity_verified = serve[0] == recorded.active.capacity;
        p.capacity_verified = serve[1] == recorded.pending.capacity;
    };
    // Run forward until a pass lowers the active cluster's capacity; that pass's status is lost.
    loop {
        observe(&mut seen, &status, serve);
        let d = decide(&seen, &status, &settings, now);
        now = d.wake.unwrap();
        let mut lowered = false;
        for effect in &d.effects {
            if let Effect::TargetCapacity {
                role,
                cluster,
                percent,
            } = effect
            {
                lowered |= *role == Role::Active && *percent < 100;
                serve[usize::from(cluster == "p")] = *percent;
            }
        }
        if lowered {
            break;
        }
        status = d.status;
        assert!(
            now < t(10_000),
            "the forward upgrade never lowered the active capacity"
        );
    }
    // The spec is reverted: roll back.
    settings.goal_digest = "reverted".into();
    let mut restored = false;
    for _ in 0..200 {
        observe(&mut seen, &status, serve);
        let d = decide(&seen, &status, &settings, now);
        restored |= d
            .notices
            .iter()
            .any(|n| n.reason == "RestoredServeTargetCapacity");
        for effect in &d.effects {
            if let Effect::TargetCapacity { cluster, percent, .. } = effect {
                serve[usize::from(cluster == "p")] = *percent;
            }
        }
        if d.tallies.iter().any(|t| {
            matches!(
                t,
                Tally::Finished {
                    result: UpgradeResult::RolledBack,
                    ..
                }
            )
        }) {
            assert!(restored, "finished without setting Serve back");
            assert_eq!(serve[0], 100, "the active cluster runs at full capacity");
            return;
        }
        now = d.wake.unwrap();
        status = d.status;
    }
    panic!(
        "the rollback stalled: Serve runs {serve:?}, the status records {:?}",
        levels_of(&status)
    );
}

#[test]
fn expected_completion_of_an_upgrade_on_schedule_is_its_plan() {
    let o = opts(20, 5, 10);
    let mut start = observed((100, 100), (0, 0));
    start.now = t(0);
    assert_eq!(expected_completion(&o, &start, t(0)), Some(t(190)));
    // Paused: no estimate.
    start.paused = true;
    assert_eq!(expected_completion(&o, &start, t(0)), None);
}

#[test]
fn capacity_changes_that_took_longer_make_the_rest_take_longer() {
    let o = opts(50, 50, 10);
    // The plan: pending to 50% at 0 s, traffic 50/50 at 0 s, active to 50%, pending to 100%, traffic 0/100 at
    // 10 s, active to 0 after the drain, promote. Here the first capacity change took 30 s to verify.
    let mut now = observed((100, 100), (50, 0));
    now.now = t(30);
    let whole = remaining(&o, &observed((100, 100), (0, 0))).unwrap();
    let left = remaining(&o, &now).unwrap();
    assert!(left.capacity_changes > 0 && left.capacity_changes < whole.capacity_changes);
    let per_change = 30 / i64::from(whole.capacity_changes - left.capacity_changes);
    let late = SignedDuration::from_secs(per_change * i64::from(left.capacity_changes));
    assert_eq!(
        expected_completion(&o, &now, t(0)),
        Some(t(30) + left.duration + late)
    );
}

proptest! {
    /// With every cluster ready at once, the estimate made after each action of the upgrade is exactly when
    /// it ends.
    #[test]
    fn an_upgrade_ready_at_once_ends_when_expected(opts in options()) {
        let mut o = observed((100, 100), (0, 0));
        o.now = t(0);
        let mut estimates = vec![expected_completion(&opts, &o, t(0)).unwrap()];
        for _ in 0..MAX_ACTIONS {
            match next_action(&opts, &o) {
                Action::Wait { until: Some(at), .. } => o.now = at,
                Action::Promote => break,
                Action::Wait { until: None, .. } | Action::FinishRollback => prop_assert!(false, "stuck at {o:?}"),
                action => {
                    apply(&mut o, action);
                    estimates.push(expected_completion(&opts, &o, t(0)).unwrap());
                }
            }
        }
        for e in estimates {
            prop_assert_eq!(e, o.now);
        }
    }
}

/// An SLO-gated upgrade, pass by pass: the first step goes on capacity alone; the next waits for a pass on
/// data from a window after it (no data and an unreachable Prometheus hold it, and say why); two failures
/// in a row roll it back, quoting the query and its value; with `onFailure: pause` they pause it instead.
#[test]
fn slo_checks_hold_steps_and_roll_back_or_pause() {
    use crate::{
        slo::{Evaluation, OnFailure, Reading},
        upgrade_control::Control,
    };
    use decide::Effect;
    let settings = std::cell::RefCell::new(decide_settings(Control::Run));
    settings.borrow_mut().slo_checks = vec![slo_check(OnFailure::Rollback)];
    let step = |status: &crate::RayServiceStatuses, reading: Option<Reading>, at: Timestamp| {
        let settings = settings.borrow();
        let mut seen = both_ready();
        let due = super::slo_gate::due(status, &settings, seen.pending.as_ref(), at);
        seen.slo = due
            .into_iter()
            .map(|c| Evaluation {
                check: c.name.clone(),
                query: "sum(errors)".into(),
                reading: reading.clone().unwrap(),
            })
            .collect();
        decide(&seen, status, &settings, at)
    };
    // A pass, then the ones right after it while it changes capacity (not gated: only traffic is).
    let step = |status: &crate::RayServiceStatuses, reading: Option<Reading>, at: Timestamp| {
        let mut d = step(status, reading.clone(), at);
        for i in 1..5 {
            if !matches!(d.effects.first(), Some(Effect::TargetCapacity { .. })) {
                break;
            }
            d = step(&d.status, reading.clone(), at + SignedDuration::from_millis(i));
        }
        d
    };
    let progressing = |s: &crate::RayServiceStatuses| {
        let c = progressing_condition(s);
        (c.reason.clone(), c.message.clone())
    };
    // Capacity to 50 %, then the first traffic step (0 → 50): nothing to judge yet, nothing evaluated.
    let d = step(&upgrade_status(), Some(Reading::Value(0.0)), t(100));
    assert_eq!(d.effects, [Effect::Traffic]);
    assert!(d.status.progress.slo_checks.is_empty());
    assert_eq!(levels_of(&d.status).pending.traffic, 50);
    // Due after 10 s; a pass 3 s after the step is too early (its window still holds older data).
    let early = step(&d.status, Some(Reading::Value(0.0)), t(104));
    assert_eq!(early.status.progress.slo_checks[0].failures, 0);
    let mut s = early.status;
    // No data and an unreachable Prometheus hold the step (not failures), and the condition says why.
    for (at, reading, shown) in [
        (111, Reading::NoData, "no data"),
        (
            116,
            Reading::Unavailable("connection refused".into()),
            "unavailable: connection refused",
        ),
    ] {
        let d = step(&s, Some(reading), t(at));
        assert!(d.effects.is_empty(), "{:?}", d.status.progress);
        let (reason, message) = progressing(&d.status);
        assert_eq!(reason, "WaitingForSloChecks");
        assert!(message.contains(&format!("sum(errors) = {shown}")), "{message}");
        assert_eq!(d.status.progress.slo_checks[0].failures, 0);
        s = d.status;
    }
    // A pass moves traffic; its record stays until the next evaluation.
    let d = step(&s, Some(Reading::Value(0.0)), t(121));
    assert_eq!(
        levels_of(&d.status).pending.traffic,
        100,
        "{:?}",
        d.status.progress
    );
    let bad = |status: &crate::RayServiceStatuses, at| step(status, Some(Reading::Value(0.25)), at);
    // Two failures in a row: the first is an event, the second rolls back with the query and value quoted.
    let first = bad(&d.status, t(127));
    assert_eq!(first.status.progress.slo_checks[0].failures, 1);
    assert!(first.status.progress.upgrade_abort.is_none());
    let second = bad(&first.status, t(132));
    let abort = second.status.progress.upgrade_abort.clone().unwrap();
    assert_eq!(abort.reason.as_str(), "SloCheckFailed");
    assert_eq!(
        abort.message,
        "SLO check errors failed 2 times in a row: sum(errors) = 0.25, wanted <= 0.01"
    );
    let rollback = second
        .status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == crate::conditions::ROLLBACK_IN_PROGRESS)
        .unwrap();
    assert_eq!(
        (rollback.reason.as_str(), rollback.message.as_str()),
        ("SloCheckFailed", abort.message.as_str())
    );
    // With `onFailure: pause`, the same failures pause it: the annotation is to be written, nothing moves.
    settings.borrow_mut().slo_checks = vec![slo_check(OnFailure::Pause)];
    let first = bad(&d.status, t(127));
    let second = bad(&first.status, t(132));
    assert!(second.pause && second.status.progress.upgrade_abort.is_none());
    assert!(second.effects.is_empty());
    let (reason, message) = progressing(&second.status);
    assert_eq!(reason, "Paused");
    assert!(
        message.contains("last failed SLO check errors: sum(errors) = 0.25"),
        "{message}"
    );
}

fn resource_aware_opts(opts: UpgradeOptions, unavailable: i32, spare: i32) -> UpgradeOptions {
    UpgradeOptions {
        resource_aware: Some(super::resource_aware::ResourceAware {
            max_unavailable_percent: unavailable,
            spare_percent: spare,
        }),
        ..opts
    }
}

/// What may change between two ResourceAware passes.
#[derive(Clone, Debug)]
enum Room {
    Advance(i64),
    PendingReady(bool),
    ActiveReady(bool),
    RouteReady(bool),
    /// The upgrade is rolled back from here on.
    RollBack,
}

fn room_event() -> impl Strategy<Value = Room> {
    prop_oneof![
        4 => (0i64..30).prop_map(Room::Advance),
        2 => any::<bool>().prop_map(Room::PendingReady),
        1 => any::<bool>().prop_map(Room::ActiveReady),
        1 => any::<bool>().prop_map(Room::RouteReady),
        1 => Just(Room::RollBack),
    ]
}

/// The ResourceAware invariants of the two clusters: weights sum to 100; each carries at most
/// maxUnavailablePercent more than its capacity (the pending one going forward none: only verified capacity,
/// checked by the caller), and keeps 1 % while it carries any; both together fit the cluster. A rollback's
/// going cluster may start in the dip the forward walk left it in.
fn assert_room(obs: &Observed, unavailable: i32, bound: i32) -> Result<(), TestCaseError> {
    let (a, p) = (obs.active, obs.pending);
    prop_assert_eq!(a.traffic + p.traffic, 100);
    if obs.direction == Direction::Forward {
        prop_assert!(
            p.traffic <= p.capacity,
            "traffic above verified capacity: {:?}",
            p
        );
    }
    for c in [a, p] {
        prop_assert!(
            c.traffic - c.capacity <= unavailable,
            "dip beyond maxUnavailablePercent: {:?}",
            c
        );
        prop_assert!(
            c.traffic == 0 || c.capacity >= 1,
            "traffic on a cluster at 0: {:?}",
            c
        );
    }
    prop_assert!(
        a.capacity + p.capacity <= bound,
        "over the cluster's room: {:?} {:?}",
        a,
        p
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, ..ProptestConfig::default() })]

    /// ResourceAware (issue 18), from a fresh pending cluster, with readiness, the route and a rollback at any
    /// moment: the invariants hold after every action, the serving capacity never falls below
    /// 100 − maxUnavailablePercent, traffic moves only onto verified capacity, and once the world settles the
    /// upgrade is promoted (or rolled back) whenever the cluster has any spare room.
    #[test]
    fn resource_aware_keeps_its_dip_and_finishes(
        base in options(),
        unavailable in 1i32..=100,
        spare in 0i32..=60,
        script in prop::collection::vec(room_event(), 0..200),
    ) {
        let opts = resource_aware_opts(base, unavailable, spare);
        let bound = 100 + spare;
        let mut obs = observed((100, 100), (0, 0));
        let mut script = script.into_iter();
        let mut outcome = None;
        for _ in 0..20_000 {
            match script.next() {
                Some(Room::Advance(s)) => obs.now = obs.now.checked_add(SignedDuration::from_secs(s)).unwrap(),
                Some(Room::PendingReady(r)) => obs.pending_capacity_ready = r,
                Some(Room::ActiveReady(r)) => obs.active_capacity_ready = r,
                Some(Room::RouteReady(r)) => obs.route_ready = r,
                Some(Room::RollBack) => obs.direction = Direction::Rollback,
                None => {
                    obs.pending_capacity_ready = true;
                    obs.active_capacity_ready = true;
                    obs.route_ready = true;
                }
            }
            let before = obs;
            let action = next_action(&opts, &obs);
            if let Action::Wait { until, reason } = action {
                if let Some(t) = until {
                    obs.now = obs.now.max(t);
                } else if script.len() == 0 && reason == WaitReason::NoRoom {
                    prop_assert_eq!(spare, 0, "no room with spare capacity {}", spare);
                    outcome = Some(action);
                    break;
                }
                continue;
            }
            apply(&mut obs, action);
            if matches!(action, Action::Promote | Action::FinishRollback) {
                outcome = Some(action);
                break;
            }
            let (going, going_before, ready) = match obs.direction {
                Direction::Forward => (obs.pending, before.pending, before.pending_capacity_ready),
                Direction::Rollback => (obs.active, before.active, before.active_capacity_ready),
            };
            if going.traffic > going_before.traffic {
                prop_assert!(ready && before.route_ready, "traffic onto unverified capacity");
                prop_assert!(going.traffic <= going.capacity, "traffic above capacity: {:?}", going);
            }
            let total = |o: &Observed| o.active.capacity + o.pending.capacity;
            if total(&before) <= bound {
                assert_room(&obs, unavailable, bound)?;
            } else {
                prop_assert!(total(&obs) <= total(&before), "grew while over the room");
            }
        }
        prop_assert!(outcome.is_some(), "neither finished nor waiting for room: {:?}", obs);
    }
}

/// `plan` with ResourceAware shows the dip and the cycle: lower the active cluster by maxUnavailablePercent,
/// raise the pending one by what was freed, move traffic onto it.
#[test]
fn resource_aware_plan_shows_the_dip_and_the_cycle() {
    let opts = resource_aware_opts(opts(25, 25, 10), 25, 25);
    let p = plan(&opts);
    let rows: Vec<(i32, i32, i32, i32)> = p
        .steps
        .iter()
        .map(|s| {
            (
                s.active_capacity,
                s.pending_capacity,
                s.active_traffic,
                s.pending_traffic,
            )
        })
        .collect();
    // (active capacity, pending capacity, active traffic, pending traffic)
    assert_eq!(
        rows[..7],
        [
            (100, 0, 100, 0),
            (75, 0, 100, 0),
            (75, 25, 100, 0),
            (75, 25, 75, 25),
            (50, 25, 75, 25),
            (50, 50, 75, 25),
            (50, 50, 50, 50),
        ],
        "{:#?}",
        p.steps
    );
    assert_eq!(p.min_serving_capacity, 75);
    assert_eq!(
        p.peak_total_capacity, 101,
        "the active cluster's last 1 % beside the full pending one"
    );
    assert_eq!(p.steps.last().unwrap().action, "promote pending to active");
    // Without ResourceAware the same options surge and never dip.
    let surge = plan(&super::UpgradeOptions {
        resource_aware: None,
        ..opts
    });
    assert_eq!(
        (surge.min_serving_capacity, surge.peak_total_capacity),
        (100, 125)
    );
}

/// `on-stall`: a pending cluster the scheduler cannot place is a condition and an event; the upgrade switches
/// to ResourceAware once (recorded in the status, so it stays so) and the active cluster gives way within
/// maxUnavailablePercent, before the pending capacity was verified.
#[test]
fn a_stall_switches_an_on_stall_upgrade_to_resource_aware() {
    use crate::upgrade_control::{Control, ResourceAwareMode};
    let mut settings = decide_settings(Control::Run);
    settings.resource_aware = ResourceAwareMode::OnStall;
    settings.max_unavailable_percent = 20;
    let stall = crate::stall::Stall {
        shortfalls: vec![crate::stall::Shortfall {
            resource: "nvidia.com/gpu".into(),
            pods: 2,
            requested: 2.0,
        }],
        message: "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.".into(),
    };
    let mut seen = both_ready();
    // The surge raise is made; its capacity does not come.
    let d = decide(&seen, &upgrade_status(), &settings, t(100));
    seen.pending.as_mut().unwrap().capacity_verified = false;
    seen.pending_stall = Some(stall);
    let d = decide(&seen, &d.status, &settings, t(101));
    let reasons: Vec<&str> = d.notices.iter().map(|n| n.reason).collect();
    assert_eq!(
        reasons,
        [
            "PendingClusterUnschedulable",
            "ResourceAwareMode",
            "UpdatedServeTargetCapacity"
        ]
    );
    assert_eq!(d.status.progress.resource_aware_since, Some(t(101)));
    assert_eq!(
        levels_of(&d.status).active,
        Levels {
            capacity: 80,
            traffic: 100
        },
        "the dip, within 20 %"
    );
    // Next pass: no second switch; Progressing says what is short.
    let d = decide(&seen, &d.status, &settings, t(102));
    assert!(d.notices.iter().all(|n| n.reason != "ResourceAwareMode"));
    let c = progressing_condition(&d.status);
    assert_eq!(c.reason, "InsufficientResources");
    assert!(
        c.message.contains("short of 2 nvidia.com/gpu for 2 Pod(s)"),
        "{}",
        c.message
    );
    // Without on-stall: the condition, no switch, no dip.
    settings.resource_aware = ResourceAwareMode::Never;
    let mut status = upgrade_status();
    seen.pending.as_mut().unwrap().capacity_verified = true;
    seen.pending_stall = None;
    status = decide(&seen, &status, &settings, t(100)).status;
    seen.pending.as_mut().unwrap().capacity_verified = false;
    seen.pending_stall = Some(crate::stall::Stall {
        shortfalls: vec![],
        message: String::new(),
    });
    let d = decide(&seen, &status, &settings, t(101));
    assert_eq!(d.status.progress.resource_aware_since, None);
    assert_eq!(levels_of(&d.status).active.capacity, 100);
}

/// The expected completion follows the pacing the upgrade runs: ResourceAware's cycles (more, shorter traffic
/// steps when what is freed is not a whole step), not the surge's.
#[test]
fn the_expected_completion_follows_resource_aware_pacing() {
    use crate::upgrade_control::{Control, ResourceAwareMode};
    let mut settings = decide_settings(Control::Run);
    settings.options = opts(50, 10, 10);
    settings.resource_aware = ResourceAwareMode::Always;
    settings.max_unavailable_percent = 15;
    let mut status = upgrade_status();
    status.progress.upgrade_start_time = Some(t(100));
    let d = decide(&both_ready(), &status, &settings, t(100));
    let ra = UpgradeOptions {
        resource_aware: Some(resource_aware::ResourceAware::live(15, &settings.options)),
        ..settings.options
    };
    let (walk, surge) = (plan(&ra), plan(&settings.options));
    assert!(
        walk.traffic_steps > surge.traffic_steps,
        "{} against {} steps",
        walk.traffic_steps,
        surge.traffic_steps
    );
    let planned = t(100) + SignedDuration::from_secs_f64(walk.min_duration_seconds);
    assert_eq!(d.status.progress.upgrade_expected_completion_time, Some(planned));
}

/// ResourceAware gives way only to a pending cluster that can take what is freed: while its head does not
/// answer, the active cluster keeps its capacity (no dip for nothing).
#[test]
fn resource_aware_waits_for_a_reachable_pending_cluster_before_the_dip() {
    let opts = resource_aware_opts(opts(50, 25, 10), 25, 25);
    let mut o = observed((100, 100), (0, 0));
    o.pending_reachable = false;
    assert_eq!(
        next_action(&opts, &o),
        Action::Wait {
            until: None,
            reason: WaitReason::PendingCapacityNotReady
        }
    );
    o.pending_reachable = true;
    assert_eq!(
        next_action(&opts, &o),
        Action::SetTargetCapacity {
            role: Role::Active,
            percent: 75
        }
    );
}

/// KubeRay's two rollback messages: the spec went back to the active cluster's, or on to a third.
#[test]
fn the_rollback_condition_says_whether_the_spec_went_back_or_on() {
    use crate::upgrade_control::Control;
    let message = |active_digest: &str| {
        let mut seen = both_ready();
        seen.active.as_mut().unwrap().spec_digest = Some(active_digest.into());
        seen.pending.as_mut().unwrap().spec_digest = Some("b".into());
        // Mid-upgrade, at 50/50.
        let mut status = upgrade_status();
        for side in [
            &mut status.active_service_status,
            &mut status.pending_service_status,
        ] {
            let side = side.as_mut().unwrap();
            (side.target_capacity, side.traffic_routed_percent) = (Some(50), Some(50));
        }
        let d = decide(&seen, &status, &decide_settings(Control::Run), t(100));
        let mut conditions = d.status.conditions.iter().flatten();
        let c = conditions
            .find(|c| c.type_ == crate::conditions::ROLLBACK_IN_PROGRESS)
            .unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "DesiredClusterSpecChanged")
        );
        c.message.clone()
    };
    assert_eq!(
        message("goal"),
        "Goal state reverted to original cluster, rolling back."
    );
    assert_eq!(
        message("a"),
        "Goal state changed mid-upgrade, rolling back to original cluster."
    );
}

/// Traffic caught up with the pending capacity: the active cluster is lowered and the pending one raised in the
/// same pass, lowering first, within the surge bound; an unreachable pending cluster gets only the lowering.
#[test]
fn a_lowering_and_the_raise_it_makes_room_for_come_in_one_pass() {
    let mut status = upgrade_status();
    for (side, traffic) in [
        (&mut status.active_service_status, 50),
        (&mut status.pending_service_status, 50),
    ] {
        let side = side.as_mut().unwrap();
        let active = side.ray_cluster_name.as_deref() == Some("a");
        side.target_capacity = Some(if active { 100 } else { 50 });
        side.traffic_routed_percent = Some(traffic);
    }
    status.progress.last_traffic_step_time = Some(t(100));
    let capacity = |role, cluster: &str, percent| decide::Effect::TargetCapacity {
        role,
        cluster: cluster.into(),
        percent,
    };
    let d = decide(
        &both_ready(),
        &status,
        &decide_settings(crate::upgrade_control::Control::Run),
        t(101),
    );
    assert_eq!(
        d.effects,
        [capacity(Role::Active, "a", 50), capacity(Role::Pending, "p", 100)]
    );
    let after = levels_of(&d.status);
    assert_eq!((after.active.capacity, after.pending.capacity), (50, 100));
    let changes = d
        .notices
        .iter()
        .filter(|n| n.reason == "UpdatedServeTargetCapacity")
        .count();
    assert_eq!(changes, 2);
    // The next pass waits for the raised capacity to be verified; nothing else moves.
    let mut unverified = both_ready();
    let pending = unverified.pending.as_mut().unwrap();
    (pending.capacity_verified, pending.capacity_found) = (false, false);
    let next = decide(
        &unverified,
        &d.status,
        &decide_settings(crate::upgrade_control::Control::Run),
        t(101),
    );
    assert!(next.effects.is_empty());
    // The pending cluster's Serve does not answer: the lowering alone.
    let mut seen = both_ready();
    seen.pending.as_mut().unwrap().reachable = false;
    let d = decide(
        &seen,
        &status,
        &decide_settings(crate::upgrade_control::Control::Run),
        t(101),
    );
    assert_eq!(d.effects, [capacity(Role::Active, "a", 50)]);
}

/// The next step's due instant: an interval after rayshift's own sub-second record, else after KubeRay's
/// whole-second fields; none before the first step or without a pending cluster.
#[test]
fn the_next_step_is_due_an_interval_after_the_last() {
    let interval = SignedDuration::from_secs(2);
    let mut status = upgrade_status();
    assert_eq!(decide::next_step_due(&status, interval), None, "no step yet");
    let migrated = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(100)));
    status
        .pending_service_status
        .as_mut()
        .unwrap()
        .last_traffic_migrated_time = migrated;
    assert_eq!(
        decide::next_step_due(&status, interval),
        Some(t(102)),
        "KubeRay's field"
    );
    let own: Timestamp = "2026-11-24T10:00:00.25Z".parse().unwrap();
    status.progress.last_traffic_step_time = Some(own);
    let due = "2026-11-24T10:00:02.25Z".parse().unwrap();
    assert_eq!(
        decide::next_step_due(&status, interval),
        Some(due),
        "rayshift's own record first"
    );
    status.pending_service_status = None;
    assert_eq!(decide::next_step_due(&status, interval), None, "no upgrade");
}
