//! When a failed pass runs again. A failure that may clear by itself (the apiserver restarting, a dashboard
//! starting) is retried soon; one the apiserver or the spec will give again until someone changes something
//! (a request denied or invalid, a spec rayshift cannot act on) backs off per RayService, as controller-runtime's
//! per-item rate limiter does, so a broken RayService does not cost the apiserver a write every few seconds.
//! A spec change or a child's change still triggers a pass at once; a pass that succeeds resets the backoff.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use prometheus::IntGauge;

/// The retry of a transient failure, and the first of a persistent one.
pub const FIRST_RETRY: Duration = Duration::from_secs(5);

/// The longest a persistent failure waits (KubeRay's controller-runtime default is 1,000 s).
pub const MAX_RETRY: Duration = Duration::from_secs(300);

/// Failed passes in a row, per RayService uid; `failing` always shows how many RayServices that is.
pub struct Retries {
    failures: Mutex<HashMap<String, u32>>,
    failing: IntGauge,
}

impl Retries {
    pub fn new(failing: IntGauge) -> Self {
        Self {
            failures: Mutex::default(),
            failing,
        }
    }

    /// Counts a failed pass and says when to run the next one.
    pub fn failed(&self, uid: &str, persistent: bool) -> Duration {
        self.change(|failures| {
            let count = failures.entry(uid.to_string()).or_default();
            *count = count.saturating_add(1);
            if persistent { backoff(*count) } else { FIRST_RETRY }
        })
    }

    /// A pass succeeded (or the RayService is gone): the next failure starts from the first retry again.
    pub fn succeeded(&self, uid: &str) {
        self.change(|failures| failures.remove(uid));
    }

    /// Forgets the RayServices `keep` does not name (gone while the watch was down).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.change(|failures| failures.retain(|uid, _| keep(uid)));
    }

    fn change<R>(&self, f: impl FnOnce(&mut HashMap<String, u32>) -> R) -> R {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let result = f(&mut failures);
        self.failing.set(failures.len() as i64);
        result
    }
}

/// 5 s, 10 s, 20 s, ... up to `MAX_RETRY`, for the `failures`-th failure in a row.
fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1 << doublings).min(MAX_RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retries() -> Retries {
        Retries::new(IntGauge::new("rayshift_rayservices_failing", "test").unwrap())
    }

    fn secs(d: Duration) -> u64 {
        d.as_secs()
    }

    #[test]
    fn persistent_failures_back_off_to_the_cap_and_a_success_resets_them() {
        let retries = retries();
        let waits: Vec<u64> = (0..9).map(|_| secs(retries.failed("a", true))).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(retries.failing.get(), 1);
        retries.succeeded("a");
        assert_eq!(retries.failing.get(), 0);
        assert_eq!(secs(retries.failed("a", true)), 5);
    }

    #[test]
    fn transient_failures_retry_soon_and_each_rayservice_counts_its_own() {
        let retries = retries();
        let transient: Vec<u64> = (0..4).map(|_| secs(retries.failed("a", false))).collect();
        assert_eq!(transient, [5, 5, 5, 5]);
        // Transient failures still count: a persistent one after them waits as the fifth in a row.
        assert_eq!(secs(retries.failed("a", true)), 80);
        assert_eq!(
            secs(retries.failed("b", true)),
            5,
            "another RayService starts from the first retry"
        );
    }

    #[test]
    fn a_million_failures_stay_at_the_cap() {
        assert_eq!(backoff(u32::MAX), MAX_RETRY);
        assert_eq!(backoff(1), FIRST_RETRY);
    }
}
