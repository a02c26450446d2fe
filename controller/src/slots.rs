//! Reconcile slots: at most `--concurrency` passes work at once.
//!
//! rayshift holds this bound itself instead of kube-runtime, so that a pass can give its slot back while it
//! only waits for a traffic step's due instant (the step lead). Held through that wait, 50 steps falling
//! due at one instant went through 8 at a time, each holding its slot for the lead: the last were late by
//! several rounds of passes (BENCHMARKS.md, scale).

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The slots every pass takes one of; `None`: no bound.
pub struct Slots(Option<Arc<Semaphore>>);

tokio::task_local! {
    /// The slot of the pass being polled (kube-runtime polls every pass in one task, so it is scoped per pass).
    static HELD: Mutex<Option<OwnedSemaphorePermit>>;
}

impl Slots {
    /// `concurrency` slots; 0: no bound.
    pub fn new(concurrency: u16) -> Self {
        Self((concurrency > 0).then(|| Arc::new(Semaphore::new(usize::from(concurrency)))))
    }

    /// Runs `pass` once a slot is free, holding it until `pass` ends or calls [`give_back`]. `None`: the
    /// slots were closed (the controller is stopping) and `pass` did not run.
    pub async fn run<F: Future>(&self, pass: F) -> Option<F::Output> {
        let permit = match &self.0 {
            Some(semaphore) => Some(semaphore.clone().acquire_owned().await.ok()?),
            None => None,
        };
        Some(HELD.scope(Mutex::new(permit), pass).await)
    }

    /// Passes still waiting for a slot end without running.
    pub fn close(&self) {
        if let Some(semaphore) = &self.0 {
            semaphore.close();
        }
    }

    /// Slots free right now (for tests).
    pub fn available(&self) -> Option<usize> {
        self.0.as_ref().map(|s| s.available_permits())
    }
}

/// The running pass gives its slot back: what is left of it only waits, then writes what is due. A no-op
/// outside [`Slots::run`].
pub fn give_back() {
    let _ = HELD.try_with(|held| {
        if let Ok(mut permit) = held.lock() {
            permit.take();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pass_that_gives_back_its_slot_lets_the_next_one_run() {
        let slots = Arc::new(Slots::new(1));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let first = tokio::spawn({
            let slots = slots.clone();
            async move {
                slots
                    .run(async {
                        give_back();
                        rx.await.unwrap();
                    })
                    .await
            }
        });
        tokio::task::yield_now().await;
        // The first pass still runs (it waits on `rx`) but holds no slot: the second one runs to its end.
        let second = tokio::time::timeout(std::time::Duration::from_secs(5), slots.run(async { 2 }));
        assert_eq!(second.await.expect("second pass waited for the first"), Some(2));
        tx.send(()).unwrap();
        assert!(first.await.unwrap().is_some());
        assert_eq!(slots.available(), Some(1));
    }

    #[tokio::test]
    async fn a_pass_holds_its_slot_until_it_ends() {
        let slots = Slots::new(1);
        let held = slots.run(async {
            let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), slots.run(async {}));
            waiting.await.is_err()
        });
        assert_eq!(held.await, Some(true));
        assert_eq!(slots.available(), Some(1));
    }

    #[tokio::test]
    async fn closed_slots_run_nothing() {
        let slots = Slots::new(2);
        slots.close();
        assert_eq!(slots.run(async { 1 }).await, None);
        assert_eq!(Slots::new(0).run(async { 1 }).await, Some(1));
    }
}
