//! One health timer for every settled RayService (issue 16). A settled RayService has nothing due but its
//! health: a full pass each health period (reads, decision, status, metrics) for each of 1,000 RayServices
//! kept a core 7 % busy and held the reconcile slots that due traffic steps waited for. Instead, a settled
//! pass hands what it saw (each serving cluster's Serve status and head proxy) to this timer, which re-checks
//! only that, each period, and wakes a pass when it differs, fails, or a full resync is due. It never writes.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use kube::runtime::reflector::ObjectRef;
use rayshift_api::RayService;

use crate::{
    dashboard::{Dashboard, HeadProxy, ServeStatus, Target},
    metrics::Metrics,
};

/// What a settled pass saw of one serving cluster: the timer expects the same.
#[derive(Clone, Debug, PartialEq)]
pub struct ServingCluster {
    pub target: Target,
    pub serve: ServeStatus,
    /// The head's Serve proxy, healthy when seen; `None` when the head is not in the serve Service.
    pub proxy: Option<ProxyAddress>,
}

/// Where a head Pod's Serve proxy answers.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyAddress {
    pub pod: String,
    pub pod_ip: String,
    pub port: i64,
}

/// The serving clusters of one settled RayService, as its last pass saw them.
pub type Baseline = Vec<ServingCluster>;

struct Entry {
    baseline: Arc<Baseline>,
    next_check: Instant,
    resync_at: Instant,
    /// Tells a check's result from a check of an older baseline.
    epoch: u64,
    checking: bool,
}

/// What is due at one tick.
#[derive(Default)]
struct Due {
    checks: Vec<(ObjectRef<RayService>, u64, Arc<Baseline>)>,
    resyncs: Vec<ObjectRef<RayService>>,
}

pub struct HealthTimer {
    period: Duration,
    resync: Duration,
    watched: Mutex<HashMap<ObjectRef<RayService>, Entry>>,
    epochs: std::sync::atomic::AtomicU64,
    wake: UnboundedSender<ObjectRef<RayService>>,
}

impl HealthTimer {
    /// The timer, and the stream of RayServices it wakes (the controller's `reconcile_on`).
    pub fn new(period: Duration, resync: Duration) -> (Self, UnboundedReceiver<ObjectRef<RayService>>) {
        let (wake, woken) = futures::channel::mpsc::unbounded();
        let timer = Self {
            period,
            resync,
            watched: Mutex::new(HashMap::new()),
            epochs: std::sync::atomic::AtomicU64::new(0),
            wake,
        };
        (timer, woken)
    }

    /// A settled pass's baseline: checked from one period on, a full pass again after the resync interval.
    pub fn watch(&self, rs: ObjectRef<RayService>, baseline: Baseline, now: Instant) {
        let epoch = self.epochs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let entry = Entry {
            baseline: Arc::new(baseline),
            next_check: now + self.period,
            resync_at: now + self.resync,
            epoch,
            checking: false,
        };
        self.entries().insert(rs, entry);
    }

    /// A pass runs the RayService itself (or it is gone): the timer lets go of it.
    pub fn forget(&self, rs: &ObjectRef<RayService>) {
        self.entries().remove(rs);
    }

    /// After a re-list: lets go of every RayService no longer listed.
    pub fn forget_all_but(&self, present: impl Fn(&ObjectRef<RayService>) -> bool) {
        self.entries().retain(|rs, _| present(rs));
    }

    pub fn watching(&self, rs: &ObjectRef<RayService>) -> bool {
        self.entries().contains_key(rs)
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<RayService>, Entry>> {
        self.watched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes what is due at `now`: resyncs leave the timer (their pass hands them back), checks are marked
    /// in flight until they report.
    fn due(&self, now: Instant) -> Due {
        let mut due = Due::default();
        let mut entries = self.entries();
        entries.retain(|rs, e| {
            if e.resync_at <= now {
                due.resyncs.push(rs.clone());
                return false;
            }
            if e.next_check <= now && !e.checking {
                e.checking = true;
                e.next_check = now + self.period;
                due.checks.push((rs.clone(), e.epoch, e.baseline.clone()));
            }
            true
        });
        due
    }

    /// A check's result: a RayService that no longer matches its baseline leaves the timer and gets a pass.
    fn report(&self, rs: &ObjectRef<RayService>, epoch: u64, unchanged: bool) -> bool {
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(rs).filter(|e| e.epoch == epoch) else {
            return false;
        };
        entry.checking = false;
        if unchanged {
            return false;
        }
        entries.remove(rs);
        true
    }

    fn tick(&self) -> Duration {
        (self.period.min(self.resync) / 10).clamp(Duration::from_millis(20), Duration::from_millis(500))
    }

    /// Runs until dropped with its controller: checks what is due each tick, each check on its own task
    /// (the dashboard client bounds how many requests are in flight).
    pub async fn run(self: Arc<Self>, dashboard: Dashboard, health_url_template: String, metrics: Metrics) {
        let template = Arc::new(health_url_template);
        let mut ticks = tokio::time::interval(self.tick());
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let due = self.due(Instant::now());
            for rs in due.resyncs {
                metrics.health_check("resync");
                let _ = self.wake.unbounded_send(rs);
            }
            for (rs, epoch, baseline) in due.checks {
                let (timer, dashboard, template, metrics) =
                    (self.clone(), dashboard.clone(), template.clone(), metrics.clone());
                tokio::spawn(async move {
                    let unchanged = still_serving(&dashboard, &template, &baseline).await;
                    metrics.health_check(if unchanged { "unchanged" } else { "changed" });
                    if timer.report(&rs, epoch, unchanged) {
                        let _ = timer.wake.unbounded_send(rs);
                    }
                });
            }
        }
    }
}

/// Whether every serving cluster still reports the Serve status its last pass saw and its head's proxy is
/// still healthy. A failed read is a difference: the pass that follows surfaces it.
async fn still_serving(dashboard: &Dashboard, template: &str, baseline: &Baseline) -> bool {
    for seen in baseline {
        match dashboard.status(&seen.target).await {
            Ok(serve) if serve == seen.serve => {}
            _ => return false,
        }
        if let Some(p) = &seen.proxy {
            let head = HeadProxy {
                namespace: &seen.target.namespace,
                cluster: &seen.target.cluster,
                pod: &p.pod,
                pod_ip: &p.pod_ip,
                port: p.port,
            };
            if !dashboard.proxy_healthy(template, &head).await {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timer(period: u64, resync: u64) -> HealthTimer {
        HealthTimer::new(Duration::from_secs(period), Duration::from_secs(resync)).0
    }

    fn rs(name: &str) -> ObjectRef<RayService> {
        ObjectRef::new(name).within("ns")
    }

    fn baseline(cluster: &str) -> Baseline {
        vec![ServingCluster {
            target: Target {
                namespace: "ns".into(),
                cluster: cluster.into(),
                token_secret: None,
                dashboard_port: 8265,
            },
            serve: ServeStatus::default(),
            proxy: None,
        }]
    }

    #[test]
    fn checks_once_a_period_never_twice_at_once() {
        let t = timer(10, 300);
        let start = Instant::now();
        t.watch(rs("a"), baseline("a-1"), start);
        assert!(t.due(start + Duration::from_secs(9)).checks.is_empty());
        let due = t.due(start + Duration::from_secs(10));
        assert_eq!(due.checks.len(), 1);
        // Still in flight a period later: not checked again.
        assert!(t.due(start + Duration::from_secs(21)).checks.is_empty());
        let epoch = due.checks[0].1;
        assert!(!t.report(&rs("a"), epoch, true));
        assert!(t.due(start + Duration::from_secs(21)).checks.len() == 1);
    }

    #[test]
    fn a_change_leaves_the_timer_and_wakes_a_pass() {
        let t = timer(10, 300);
        let start = Instant::now();
        t.watch(rs("a"), baseline("a-1"), start);
        let due = t.due(start + Duration::from_secs(10));
        assert!(t.report(&rs("a"), due.checks[0].1, false));
        assert!(!t.watching(&rs("a")));
    }

    #[test]
    fn a_check_of_an_older_baseline_is_ignored() {
        let t = timer(10, 300);
        let start = Instant::now();
        t.watch(rs("a"), baseline("a-1"), start);
        let due = t.due(start + Duration::from_secs(10));
        // A pass ran meanwhile and handed over what it saw.
        t.watch(rs("a"), baseline("a-2"), start + Duration::from_secs(11));
        assert!(!t.report(&rs("a"), due.checks[0].1, false));
        assert!(t.watching(&rs("a")));
    }

    #[test]
    fn the_resync_replaces_a_check() {
        let t = timer(10, 25);
        let start = Instant::now();
        t.watch(rs("a"), baseline("a-1"), start);
        t.watch(rs("b"), baseline("b-1"), start + Duration::from_secs(5));
        let due = t.due(start + Duration::from_secs(26));
        assert_eq!(due.resyncs, vec![rs("a")]);
        assert_eq!(due.checks.len(), 1, "b is checked: {:?}", due.checks[0].0);
        assert!(!t.watching(&rs("a")));
    }

    #[test]
    fn the_tick_follows_the_shortest_interval() {
        assert_eq!(timer(10, 300).tick(), Duration::from_millis(500));
        assert_eq!(timer(1, 300).tick(), Duration::from_millis(100));
        assert_eq!(timer(10, 1).tick(), Duration::from_millis(100));
    }
}
