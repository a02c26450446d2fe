//! What a reconcile pass waits on: each apiserver call, cache wait and dashboard call of a pass names itself
//! here first, so a pass abandoned at its timeout says what never answered (a stuck pass is otherwise silent).

use std::{
    borrow::Cow,
    fmt,
    future::Future,
    sync::{Arc, Mutex},
};

/// The last thing a pass started waiting on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Waiting {
    /// Nothing named yet: the pass's own work.
    #[default]
    Started,
    /// An apiserver call (`verb` as the write metrics name it, or get/list) on a kind.
    Apiserver {
        verb: &'static str,
        kind: Cow<'static, str>,
    },
    /// A watch cache's first list.
    Cache(&'static str),
    /// A free slot under the dashboard client's in-flight limit.
    DashboardSlot,
    /// A Ray dashboard's or Serve proxy's answer (`get`, `put`, `healthz`).
    Dashboard(&'static str),
    /// Prometheus, for an SLO check.
    Prometheus,
}

impl Waiting {
    pub fn api(verb: &'static str, kind: impl Into<Cow<'static, str>>) -> Self {
        Waiting::Apiserver {
            verb,
            kind: kind.into(),
        }
    }
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Waiting::Started => f.write_str("nothing named (its own work)"),
            Waiting::Apiserver { verb, kind } => write!(f, "the apiserver ({verb} {kind})"),
            Waiting::Cache(kind) => write!(f, "the {kind} cache's first list"),
            Waiting::DashboardSlot => f.write_str("a dashboard request slot (--dashboard-max-in-flight)"),
            Waiting::Dashboard(op) => write!(f, "a Ray dashboard ({op})"),
            Waiting::Prometheus => f.write_str("Prometheus"),
        }
    }
}

tokio::task_local! {
    static CURRENT: Arc<Mutex<Waiting>>;
}

/// Names what the running pass waits on next; nothing outside a pass (the health timer's reads).
pub fn on(waiting: Waiting) {
    let _ = CURRENT.try_with(|current| *lock(current) = waiting);
}

/// Runs one pass and keeps what it waits on readable from outside it (clones share it).
#[derive(Clone, Default)]
pub struct Tracker(Arc<Mutex<Waiting>>);

impl Tracker {
    pub async fn run<F: Future>(&self, pass: F) -> F::Output {
        CURRENT.scope(self.0.clone(), pass).await
    }

    pub fn last(&self) -> Waiting {
        lock(&self.0).clone()
    }
}

fn lock(current: &Mutex<Waiting>) -> std::sync::MutexGuard<'_, Waiting> {
    current.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn an_abandoned_pass_names_what_it_waited_on() {
        let tracker = Tracker::default();
        let pass = async {
            on(Waiting::api("get", "RayService"));
            tokio::task::yield_now().await;
            on(Waiting::DashboardSlot);
            std::future::pending::<()>().await
        };
        let ended = tokio::time::timeout(Duration::from_millis(20), tracker.run(pass)).await;
        assert!(ended.is_err());
        assert_eq!(tracker.last(), Waiting::DashboardSlot);
        assert_eq!(
            tracker.last().to_string(),
            "a dashboard request slot (--dashboard-max-in-flight)"
        );
    }

    #[test]
    fn outside_a_pass_nothing_is_recorded() {
        on(Waiting::Prometheus);
        let tracker = Tracker::default();
        assert_eq!(tracker.last(), Waiting::Started);
    }
}
