//! When a failed pass runs again. A failure that may clear by itself (the apiserver restarting, a dashboard
//! starting) is retried soon; one the apiserver or the spec will give again until someone changes something
//! (a request denied or invalid, a spec rayshift cannot act on) backs off per RayService, as controller-runtime's
//! per-item rate limiter does, so a broken RayService does not cost the apiserver a write every few seconds.
//! A spec change or a child's change still triggers a pass at once; a pass that succeeds resets the backoff.
//! Such a pass, run before the retry was due, does not count if it fails again: otherwise every wake-up in
//! between (a status write's own watch event, a health tick) doubled the backoff once more.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use prometheus::IntGauge;

/// The retry of a transient failure, and the first of a persistent one.
pub const FIRST_RETRY: Duration = Duration::from_secs(5);

/// The longest a persistent failure waits (KubeRay's controller-runtime default is 1,000 s).
pub const MAX_RETRY: Duration = Duration::from_secs(300);

/// Failed passes in a row, per RayService uid; `failing` always shows how many RayServices that is.
pub struct Retries {
    failures: Mutex<HashMap<String, Failing>>,
    failing: IntGauge,
}

/// One RayService's failures in a row, and when its retry is due.
#[derive(Clone, Copy)]
struct Failing {
    count: u32,
    retry_at: Instant,
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
        self.failed_at(uid, persistent, Instant::now())
    }

    /// `failed`, at `now`. A failure before the retry was due keeps that retry and is not counted.
    fn failed_at(&self, uid: &str, persistent: bool, now: Instant) -> Duration {
        self.change(|failures| {
            let previous = failures.get(uid).copied();
            if let Some(early) = previous.filter(|f| now < f.retry_at) {
                return early.retry_at - now;
            }
            let count = previous.map_or(0, |f| f.count).saturating_add(1);
            let wait = if persistent { backoff(count) } else { FIRST_RETRY };
            failures.insert(
                uid.to_string(),
                Failing {
                    count,
                    retry_at: now + wait,
                },
            );
            wait
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

    fn change<R>(&self, f: impl FnOnce(&mut HashMap<String, Failing>) -> R) -> R {
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

    /// Fails `uid` each time its retry falls due, from `start`; the waits, and when the last retry is due.
    fn fail_on_time(
        retries: &Retries,
        uid: &str,
        persistent: bool,
        n: usize,
        start: Instant,
    ) -> (Vec<u64>, Instant) {
        let mut at = start;
        let waits = (0..n)
            .map(|_| {
                let wait = retries.failed_at(uid, persistent, at);
                at += wait;
                secs(wait)
            })
            .collect();
        (waits, at)
    }

    #[test]
    fn persistent_failures_back_off_to_the_cap_and_a_success_resets_them() {
        let retries = retries();
        let (waits, at) = fail_on_time(&retries, "a", true, 9, Instant::now());
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(retries.failing.get(), 1);
        retries.succeeded("a");
        assert_eq!(retries.failing.get(), 0);
        assert_eq!(secs(retries.failed_at("a", true, at)), 5);
    }

    #[test]
    fn transient_failures_retry_soon_and_each_rayservice_counts_its_own() {
        let retries = retries();
        let (transient, at) = fail_on_time(&retries, "a", false, 4, Instant::now());
        assert_eq!(transient, [5, 5, 5, 5]);
        // Transient failures still count: a persistent one after them waits as the fifth in a row.
        assert_eq!(secs(retries.failed_at("a", true, at)), 80);
        assert_eq!(
            secs(retries.failed_at("b", true, at)),
            5,
            "another RayService starts from the first retry"
        );
    }

    #[test]
    fn a_failure_before_the_retry_is_due_keeps_that_retry() {
        let retries = retries();
        let start = Instant::now();
        assert_eq!(secs(retries.failed_at("a", true, start)), 5);
        // A pass woken 16 ms later fails too: it waits for the same retry, and the backoff does not double.
        let early = retries.failed_at("a", true, start + Duration::from_millis(16));
        assert_eq!(early, Duration::from_millis(4984));
        let (waits, _) = fail_on_time(&retries, "a", true, 2, start + Duration::from_secs(5));
        assert_eq!(waits, [10, 20], "the early failure was not counted");
    }

    #[test]
    fn a_million_failures_stay_at_the_cap() {
        assert_eq!(backoff(u32::MAX), MAX_RETRY);
        assert_eq!(backoff(1), FIRST_RETRY);
    }
}
