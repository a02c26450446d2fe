//! Reconcile slots: at most `--concurrency` passes work at once, and as many more for traffic steps.
//!
//! rayshift holds this bound itself instead of kube-runtime so that the pass of a due traffic step does not
//! queue behind the passes of other RayServices. With 50 upgrades started at once, the second step of most
//! late upgrades fell due while the others were still creating their pending clusters, and its pass waited up
//! to 2 s for a slot (BENCHMARKS.md, scale). A step's pass holds its own slot through the step lead, as any
//! pass does: given back during the lead, all due steps wrote in the same instant (an experiment, reverted).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use jiff::{SignedDuration, Timestamp};
use kube::runtime::reflector::ObjectRef;
use rayshift_api::RayService;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A pass from this long before its RayService's next step due instant (the step lead and some) until this
/// long after is that step's pass; a due instant long past is stale (the upgrade ended another way).
const STEP_WINDOW: SignedDuration = SignedDuration::from_millis(500);
const STEP_STALE: SignedDuration = SignedDuration::from_secs(5);

pub struct Slots {
    /// `None`: no bound (`--concurrency 0`).
    lanes: Option<Lanes>,
    /// When each RayService's next traffic step is due, as its last pass decided.
    steps_due: Mutex<HashMap<ObjectRef<RayService>, Timestamp>>,
}

struct Lanes {
    passes: Arc<Semaphore>,
    steps: Arc<Semaphore>,
}

impl Slots {
    /// `concurrency` slots for passes and as many for due steps; 0: no bound.
    pub fn new(concurrency: u16) -> Self {
        let lane = || Arc::new(Semaphore::new(usize::from(concurrency)));
        Self {
            lanes: (concurrency > 0).then(|| Lanes {
                passes: lane(),
                steps: lane(),
            }),
            steps_due: Mutex::default(),
        }
    }

    /// A slot for a pass of `rs`, from the steps' lane if its step is due. `Some(None)`: no bound. `None`:
    /// the slots are closed (the controller is stopping), and the pass must not run.
    pub async fn take(&self, rs: &ObjectRef<RayService>) -> Option<Option<OwnedSemaphorePermit>> {
        let Some(lanes) = &self.lanes else {
            return Some(None);
        };
        let lane = if self.step_due(rs) {
            &lanes.steps
        } else {
            &lanes.passes
        };
        lane.clone().acquire_owned().await.ok().map(Some)
    }

    fn step_due(&self, rs: &ObjectRef<RayService>) -> bool {
        let due = self.steps_due.lock().unwrap_or_else(|e| e.into_inner());
        due.get(rs).is_some_and(|at| {
            let left = at.duration_since(Timestamp::now());
            left <= STEP_WINDOW && left >= -STEP_STALE
        })
    }

    /// Records when the next traffic step of `rs` is due (`None`: none is).
    pub fn next_step(&self, rs: ObjectRef<RayService>, due: Option<Timestamp>) {
        let mut steps = self.steps_due.lock().unwrap_or_else(|e| e.into_inner());
        match due {
            Some(at) => steps.insert(rs, at),
            None => steps.remove(&rs),
        };
    }

    /// Passes still waiting for a slot end without running.
    pub fn close(&self) {
        if let Some(lanes) = &self.lanes {
            lanes.passes.close();
            lanes.steps.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn rs(name: &str) -> ObjectRef<RayService> {
        ObjectRef::new(name).within("ns")
    }

    #[tokio::test]
    async fn a_due_step_gets_a_slot_while_every_pass_slot_is_held() {
        let slots = Slots::new(1);
        let (busy, other, stepping) = (rs("busy"), rs("other"), rs("stepping"));
        let _held = slots.take(&busy).await.unwrap();
        let waiting = tokio::time::timeout(Duration::from_millis(50), slots.take(&other));
        assert!(waiting.await.is_err(), "a second ordinary pass got a slot");
        let due = Timestamp::now() + SignedDuration::from_millis(250);
        slots.next_step(stepping.clone(), Some(due));
        let step = tokio::time::timeout(Duration::from_secs(5), slots.take(&stepping));
        assert!(step.await.expect("the due step waited").is_some());
    }

    #[tokio::test]
    async fn a_step_not_yet_due_done_or_long_past_waits_like_any_pass() {
        let slots = Slots::new(1);
        let busy = rs("busy");
        let _held = slots.take(&busy).await.unwrap();
        let now = Timestamp::now();
        slots.next_step(rs("later"), Some(now + SignedDuration::from_secs(5)));
        slots.next_step(rs("done"), Some(now));
        slots.next_step(rs("done"), None);
        slots.next_step(rs("stale"), Some(now - SignedDuration::from_secs(60)));
        for name in ["later", "done", "stale"] {
            let key = rs(name);
            let waiting = tokio::time::timeout(Duration::from_millis(50), slots.take(&key));
            assert!(waiting.await.is_err(), "{name} took the steps' lane");
        }
    }

    #[tokio::test]
    async fn closed_slots_run_nothing_and_no_bound_always_runs() {
        let key = rs("a");
        let slots = Slots::new(2);
        slots.close();
        assert!(slots.take(&key).await.is_none());
        assert!(matches!(Slots::new(0).take(&key).await, Some(None)));
    }
}
