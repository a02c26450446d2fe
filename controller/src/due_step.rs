//! Passes that hand their reconcile slot back while they wait for a due traffic step.
//!
//! A pass that has decided a step and waits only for its due instant (up to the step lead) finishes in its
//! own task, and its reconcile ends. Otherwise the steps of many upgrades falling due together queue for the
//! `--concurrency` slots, each held through its lead (BENCHMARKS.md: 50 upgrades at once). The next pass of
//! that RayService waits for the handed-over one first: one pass per RayService at a time, as kube-runtime
//! keeps it for the reconciles it runs.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use kube::ResourceExt;
use rayshift_api::RayService;
use tokio::sync::watch;

/// A RayService's namespace and name.
pub type Key = (String, String);

pub fn key(rs: &RayService) -> Key {
    (rs.namespace().unwrap_or_default(), rs.name_any())
}

/// The handed-over passes still running, by RayService.
#[derive(Default)]
pub struct DueSteps(Arc<Mutex<HashMap<Key, watch::Receiver<()>>>>);

impl DueSteps {
    /// Records a handed-over pass of `key`; it counts as running until the returned guard is dropped.
    pub fn hand_over(&self, key: Key) -> Running {
        let (ended, running) = watch::channel(());
        self.lock().insert(key.clone(), running);
        Running {
            steps: self.0.clone(),
            key,
            _ended: ended,
        }
    }

    /// Ends once the handed-over pass of `key`, if any, has ended.
    pub async fn finished(&self, key: &Key) {
        let running = self.lock().get(key).cloned();
        if let Some(mut running) = running {
            // Nothing is ever sent: it ends with an error once the guard is dropped.
            while running.changed().await.is_ok() {}
        }
    }

    /// How many handed-over passes are running.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, watch::Receiver<()>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A handed-over pass, running until dropped.
pub struct Running {
    steps: Arc<Mutex<HashMap<Key, watch::Receiver<()>>>>,
    key: Key,
    /// Dropped after `drop` has removed the entry, so a waiting pass goes on only once it is gone.
    _ended: watch::Sender<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        // Nothing else adds an entry for this key meanwhile: the next pass waits for `_ended` to drop.
        self.steps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn k(name: &str) -> Key {
        ("ns".into(), name.into())
    }

    #[tokio::test]
    async fn the_next_pass_waits_for_the_handed_over_one() {
        let steps = DueSteps::default();
        let running = steps.hand_over(k("llm"));
        // Another RayService does not wait.
        tokio::time::timeout(Duration::from_millis(50), steps.finished(&k("other")))
            .await
            .expect("nothing handed over for it");
        let waited = tokio::time::timeout(Duration::from_millis(50), steps.finished(&k("llm"))).await;
        assert!(waited.is_err(), "went on while the handed-over pass ran");
        // A wait given up on leaves the hand-over in place for the next one.
        let llm = k("llm");
        let finished = steps.finished(&llm);
        let release = async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            drop(running);
        };
        let (_, ()) = tokio::join!(release, finished);
        assert!(steps.is_empty());
    }

    #[tokio::test]
    async fn a_pass_nobody_waited_for_leaves_nothing_behind() {
        let steps = DueSteps::default();
        drop(steps.hand_over(k("llm")));
        assert_eq!(steps.len(), 0);
        tokio::time::timeout(Duration::from_millis(50), steps.finished(&k("llm")))
            .await
            .expect("no wait once it ended");
    }
}
