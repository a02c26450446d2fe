//! Reconcile slots: at most `--concurrency` passes run at once, and the passes of RayServices whose traffic
//! steps fall due soon take the free slots first, earliest due first.
//!
//! rayshift holds this bound instead of kube-runtime, whose queue is first come, first served: with 50
//! upgrades at once, a due step's pass queued behind the other upgrades' passes (their own writes coming back,
//! their capacity changes) and was decided up to 2 s late (BENCHMARKS.md, "Scale"). A step's pass gives its
//! slot back while it sleeps through the step lead and takes one again at the due instant, ahead of every
//! pass whose step is due later, so due steps still write at most `--concurrency` at once.

use std::{
    cell::RefCell,
    collections::{HashMap, VecDeque},
    future::Future,
    sync::{Arc, Mutex, MutexGuard},
};

use jiff::{SignedDuration, Timestamp};
use kube::runtime::reflector::ObjectRef;
use rayshift_api::RayService;
use tokio::sync::oneshot;

/// A RayService's passes go first from this long before its step is due: the passes that change and confirm
/// the capacity a step needs are as urgent as the step's own (given only the step lead, the capacity passes
/// after a step queued and that step came late), until this long after (a step still waiting for its
/// capacity, read at the capacity poll). A due instant longer past is stale: the upgrade paused or went
/// another way.
const BEFORE_DUE: SignedDuration = SignedDuration::from_secs(5);
const AFTER_DUE: SignedDuration = SignedDuration::from_secs(5);

pub struct ReconcileSlots {
    /// 0: no bound.
    limit: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    busy: usize,
    closed: bool,
    /// In the order they came.
    waiting: VecDeque<Waiter>,
    /// When each upgrading RayService's next traffic step is due.
    steps_due: HashMap<ObjectRef<RayService>, Timestamp>,
}

struct Waiter {
    step_due: Option<Timestamp>,
    hand: oneshot::Sender<Slot>,
}

/// A slot held by a pass; dropped, it goes to the waiting pass whose step is due first, else to the one
/// that waited longest.
pub struct Slot(Option<Arc<ReconcileSlots>>);

tokio::task_local! {
    /// The slot of the pass this task runs.
    static HELD: RefCell<Option<Slot>>;
}

/// Runs a pass holding `slot`, which [`ReconcileSlots::away_until`] can give back for a while.
pub async fn holding<F: Future>(slot: Slot, pass: F) -> F::Output {
    HELD.scope(RefCell::new(Some(slot)), pass).await
}

impl ReconcileSlots {
    pub fn new(concurrency: u16) -> Arc<Self> {
        Arc::new(Self {
            limit: usize::from(concurrency),
            state: Mutex::default(),
        })
    }

    /// A slot for a pass of `rs`; `None` once the slots are closed (the controller is stopping): the pass
    /// must not run.
    pub async fn take(self: &Arc<Self>, rs: &ObjectRef<RayService>) -> Option<Slot> {
        if self.limit == 0 {
            return Some(Slot(None));
        }
        self.take_before(|state| state.steps_due.get(rs).copied()).await
    }

    /// Gives the running pass's slot back while `wait` runs (a step's lead), then takes one again ahead of
    /// the passes whose steps are due after `due`. Without a slot (no bound, or closed meanwhile) it only
    /// waits.
    pub async fn away_until(self: &Arc<Self>, due: Timestamp, wait: impl Future<Output = ()>) {
        let held = HELD.try_with(|held| held.borrow_mut().take()).ok().flatten();
        let Some(slot) = held.filter(|s| s.0.is_some()) else {
            return wait.await;
        };
        drop(slot);
        wait.await;
        let again = self.take_before(|_| Some(due)).await;
        let _ = HELD.try_with(|held| *held.borrow_mut() = again);
    }

    /// A free slot, or a place in the queue with the step due instant `step_due` reads (under the same lock).
    async fn take_before(
        self: &Arc<Self>,
        step_due: impl FnOnce(&State) -> Option<Timestamp>,
    ) -> Option<Slot> {
        let handed = {
            let mut state = self.lock();
            if state.closed {
                return None;
            }
            if state.busy < self.limit {
                state.busy += 1;
                return Some(Slot(Some(self.clone())));
            }
            let (hand, handed) = oneshot::channel();
            let step_due = step_due(&state);
            state.waiting.push_back(Waiter { step_due, hand });
            handed
        };
        handed.await.ok()
    }

    /// Records when the next traffic step of `rs` is due (`None`: no upgrade is stepping).
    pub fn next_step(&self, rs: ObjectRef<RayService>, due: Option<Timestamp>) {
        let mut state = self.lock();
        // Deleted RayServices' entries go once stale.
        let now = Timestamp::now();
        state
            .steps_due
            .retain(|_, at| now.duration_since(*at) < AFTER_DUE);
        match due {
            Some(at) => state.steps_due.insert(rs, at),
            None => state.steps_due.remove(&rs),
        };
    }

    /// Passes still waiting for a slot end without running.
    pub fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.waiting.clear();
    }

    fn give_back(self: &Arc<Self>) {
        let mut state = self.lock();
        while let Some(next) = state.next_waiter(Timestamp::now()) {
            // The slot stays busy: it passes straight on. A waiter gone meanwhile hands it back unused.
            match next.hand.send(Slot(Some(self.clone()))) {
                Ok(()) => return,
                Err(mut unused) => drop(unused.0.take()),
            }
        }
        state.busy -= 1;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    /// The waiter whose step is due soonest, if any is within its step's window; else the first to come.
    fn next_waiter(&mut self, now: Timestamp) -> Option<Waiter> {
        let in_window = |due: Timestamp| {
            let left = due.duration_since(now);
            left <= BEFORE_DUE && left >= -AFTER_DUE
        };
        let stepping = (self.waiting.iter().enumerate())
            .filter_map(|(i, w)| w.step_due.filter(|due| in_window(*due)).map(|due| (due, i)))
            .min();
        self.waiting.remove(stepping.map_or(0, |(_, i)| i))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(slots) = self.0.take() {
            slots.give_back();
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

    /// Starts a pass of `name` waiting for a slot; its receiver says when it got one.
    fn wait_for_slot(slots: &Arc<ReconcileSlots>, name: &str) -> oneshot::Receiver<Slot> {
        let (tx, rx) = oneshot::channel();
        let (slots, key) = (slots.clone(), rs(name));
        tokio::spawn(async move {
            if let Some(slot) = slots.take(&key).await {
                let _ = tx.send(slot);
            }
        });
        rx
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn a_due_step_goes_ahead_of_passes_that_queued_before_it() {
        let slots = ReconcileSlots::new(1);
        let held = slots.take(&rs("busy")).await.unwrap();
        let mut first = wait_for_slot(&slots, "first");
        settle().await;
        slots.next_step(
            rs("stepping"),
            Some(Timestamp::now() + SignedDuration::from_millis(120)),
        );
        let mut stepping = wait_for_slot(&slots, "stepping");
        settle().await;
        assert!(
            first.try_recv().is_err() && stepping.try_recv().is_err(),
            "the one slot is held"
        );
        drop(held);
        let step = tokio::time::timeout(Duration::from_secs(5), &mut stepping).await;
        let step = step.expect("the due step got the slot").unwrap();
        settle().await;
        assert!(
            first.try_recv().is_err(),
            "the earlier pass waits for the step's pass"
        );
        drop(step);
        let got = tokio::time::timeout(Duration::from_secs(5), first).await;
        assert!(got.expect("then the earlier pass runs").is_ok());
    }

    #[tokio::test]
    async fn of_two_upgrades_the_step_due_sooner_goes_first() {
        let slots = ReconcileSlots::new(1);
        let held = slots.take(&rs("busy")).await.unwrap();
        let now = Timestamp::now();
        slots.next_step(rs("in-3s"), Some(now + SignedDuration::from_secs(3)));
        slots.next_step(rs("in-1s"), Some(now + SignedDuration::from_secs(1)));
        let mut later = wait_for_slot(&slots, "in-3s");
        settle().await;
        let sooner = wait_for_slot(&slots, "in-1s");
        settle().await;
        drop(held);
        let got = tokio::time::timeout(Duration::from_secs(5), sooner).await;
        let slot = got.expect("the sooner step got the slot").unwrap();
        settle().await;
        assert!(later.try_recv().is_err(), "the later step waits");
        drop(slot);
        assert!(tokio::time::timeout(Duration::from_secs(5), later).await.is_ok());
    }

    #[tokio::test]
    async fn a_step_pass_gives_its_slot_back_through_its_lead_and_takes_one_first_after_it() {
        let slots = ReconcileSlots::new(1);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (end_lead, lead) = oneshot::channel::<()>();
        let slot = slots.take(&rs("stepping")).await.unwrap();
        let stepping = tokio::spawn(holding(slot, {
            let (slots, order) = (slots.clone(), order.clone());
            async move {
                let due = Timestamp::now();
                slots.away_until(due, async { drop(lead.await) }).await;
                order.lock().unwrap().push("stepping");
                HELD.with(|held| held.borrow().is_some())
            }
        }));
        // Through the lead another pass runs, and a third queues.
        let other = tokio::time::timeout(Duration::from_secs(5), slots.take(&rs("other"))).await;
        let other = other.expect("the slot was given back for the lead").unwrap();
        let queued = tokio::spawn({
            let (slots, order) = (slots.clone(), order.clone());
            async move {
                let _slot = slots.take(&rs("queued")).await;
                order.lock().unwrap().push("queued");
            }
        });
        settle().await;
        end_lead.send(()).unwrap();
        settle().await;
        drop(other);
        let held = tokio::time::timeout(Duration::from_secs(5), stepping)
            .await
            .unwrap();
        assert!(held.unwrap(), "the step pass holds a slot again after its lead");
        tokio::time::timeout(Duration::from_secs(5), queued)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(*order.lock().unwrap(), ["stepping", "queued"]);
    }

    #[tokio::test]
    async fn without_a_due_step_passes_run_in_the_order_they_came() {
        let slots = ReconcileSlots::new(1);
        let held = slots.take(&rs("busy")).await.unwrap();
        let now = Timestamp::now();
        // Not yet in its window, ended, long past: each waits its turn.
        slots.next_step(rs("later"), Some(now + SignedDuration::from_secs(60)));
        slots.next_step(rs("ended"), Some(now));
        slots.next_step(rs("ended"), None);
        slots.next_step(rs("stale"), Some(now - SignedDuration::from_secs(60)));
        let mut order = Vec::new();
        for name in ["plain", "later", "ended", "stale"] {
            order.push((name, wait_for_slot(&slots, name)));
            settle().await;
        }
        let mut slot = held;
        for (name, rx) in order {
            drop(slot);
            let got = tokio::time::timeout(Duration::from_secs(5), rx).await;
            slot = got
                .unwrap_or_else(|_| panic!("{name} waited past its turn"))
                .unwrap();
        }
    }

    #[tokio::test]
    async fn the_bound_holds_and_a_slot_whose_waiter_left_is_not_lost() {
        let slots = ReconcileSlots::new(2);
        let (a, b) = (
            slots.take(&rs("a")).await.unwrap(),
            slots.take(&rs("b")).await.unwrap(),
        );
        let mut third = wait_for_slot(&slots, "c");
        // A waiter that gives up (its reconcile dropped) before a slot frees.
        let gone = tokio::spawn({
            let slots = slots.clone();
            async move { slots.take(&rs("gone")).await.map(|_| ()) }
        });
        settle().await;
        assert!(third.try_recv().is_err(), "a third pass ran beside two");
        gone.abort();
        settle().await;
        drop(a);
        let c = tokio::time::timeout(Duration::from_secs(5), third)
            .await
            .unwrap()
            .unwrap();
        drop((b, c));
        assert_eq!(slots.lock().busy, 0, "every slot came back");
    }

    #[tokio::test]
    async fn closed_slots_run_nothing_and_no_bound_always_runs() {
        let slots = ReconcileSlots::new(1);
        let held = slots.take(&rs("a")).await.unwrap();
        let waiting = wait_for_slot(&slots, "b");
        settle().await;
        slots.close();
        assert!(waiting.await.is_err(), "a waiting pass ran after the close");
        assert!(slots.take(&rs("c")).await.is_none());
        drop(held);
        let unbounded = ReconcileSlots::new(0);
        let key = rs("d");
        let many: Vec<_> = futures::future::join_all((0..100).map(|_| unbounded.take(&key))).await;
        assert!(many.iter().all(Option::is_some));
    }
}
