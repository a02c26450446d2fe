//! Polling for a condition in the end-to-end tests, with a diagnosis when it never comes.

use std::{
    future::Future,
    time::{Duration, Instant},
};

/// Polls `check` every `every` until it returns Some; after `secs`, panics with `diagnose()`.
pub async fn eventually<T, F, Fut, D, DFut>(
    what: &str,
    secs: u64,
    every: Duration,
    mut check: F,
    diagnose: D,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
    D: FnOnce() -> DFut,
    DFut: Future<Output = String>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out waiting for {what}\n{}", diagnose().await);
        }
        tokio::time::sleep(every).await;
    }
}

/// `Some` once the object is gone from the apiserver (an `eventually` check).
pub async fn gone<K>(api: &kube::Api<K>, name: &str) -> Option<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.unwrap().is_none().then_some(())
}

/// The last `n` lines of a log, oldest first.
pub fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
