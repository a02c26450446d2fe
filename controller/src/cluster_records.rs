//! What the controller remembers about each RayCluster between passes: the Serve config it last pushed there
//! (push only on change), its head's failed Serve proxy checks in a row, and its Serve reads in a row that
//! verified its capacity (a flapping app is not capacity), and the serve label it last wrote on its head Pod.
//!
//! Records are grouped by the owning RayService's uid, never by name prefix: `llm` and `llm-v2` have
//! clusters `llm-xxxxx` and `llm-v2-xxxxx`, and forgetting one RayService must not touch the other's.

use std::collections::HashMap;

use rayshift_api::stall::Stall;

#[derive(Clone, Debug, Default, PartialEq)]
struct ClusterRecord {
    pushed_config: Option<String>,
    proxy_failures: u32,
    /// The capacity the last reads verified, and how many reads in a row did.
    verified: Option<(i32, u32)>,
    /// When its Pods were last checked for a scheduling stall, and what was found.
    scheduling: Option<(std::time::Instant, Option<Stall>)>,
    serve_label: Option<LabelWrite>,
}

/// A serve label this controller wrote on a head Pod: that Pod (uid), the version the write replaced, the value.
#[derive(Clone, Debug, PartialEq)]
pub struct LabelWrite {
    pub pod_uid: String,
    pub replaced_version: String,
    pub value: &'static str,
}

/// Records of every cluster, by owner uid, then cluster name.
#[derive(Debug, Default)]
pub struct ClusterRecords {
    by_owner: HashMap<String, HashMap<String, ClusterRecord>>,
}

impl ClusterRecords {
    fn record(&mut self, owner: &str, cluster: &str) -> &mut ClusterRecord {
        self.by_owner
            .entry(owner.to_string())
            .or_default()
            .entry(cluster.to_string())
            .or_default()
    }

    /// What is known of a cluster's scheduling stall, or None when its Pods are due a list. A wait for capacity
    /// that has just begun counts as no stall for one `fresh` period without a list: most waits end within a
    /// serve poll, and 50 upgrades at once would otherwise list Pods at every capacity raise. After that, one
    /// list per `fresh` (a pass waiting for capacity comes every few tens of milliseconds).
    pub fn stall_known(
        &mut self,
        owner: &str,
        cluster: &str,
        fresh: std::time::Duration,
    ) -> Option<Option<Stall>> {
        let record = self.record(owner, cluster);
        match &record.scheduling {
            None => {
                record.scheduling = Some((std::time::Instant::now(), None));
                Some(None)
            }
            Some((at, stall)) => (at.elapsed() < fresh).then(|| stall.clone()),
        }
    }

    pub fn set_stall(&mut self, owner: &str, cluster: &str, stall: Option<Stall>) {
        self.record(owner, cluster).scheduling = Some((std::time::Instant::now(), stall));
    }

    /// The cluster's capacity arrived: the next wait for it starts afresh.
    pub fn capacity_arrived(&mut self, owner: &str, cluster: &str) {
        if let Some(r) = self.by_owner.get_mut(owner).and_then(|c| c.get_mut(cluster)) {
            r.scheduling = None;
        }
    }

    pub fn pushed_config(&self, owner: &str, cluster: &str) -> Option<&str> {
        self.by_owner.get(owner)?.get(cluster)?.pushed_config.as_deref()
    }

    pub fn set_pushed_config(&mut self, owner: &str, cluster: &str, config: &str) {
        self.record(owner, cluster).pushed_config = Some(config.to_string());
    }

    /// Counts one more failed proxy check; returns the failures in a row.
    pub fn proxy_failed(&mut self, owner: &str, cluster: &str) -> u32 {
        let r = self.record(owner, cluster);
        r.proxy_failures += 1;
        r.proxy_failures
    }

    pub fn proxy_healthy(&mut self, owner: &str, cluster: &str) {
        if let Some(r) = self.by_owner.get_mut(owner).and_then(|c| c.get_mut(cluster)) {
            r.proxy_failures = 0;
        }
    }

    /// Records one Serve read of a cluster at `capacity`; returns the reads in a row, this one included, that
    /// verified that capacity (0 when this one did not).
    pub fn capacity_read(&mut self, owner: &str, cluster: &str, capacity: i32, verified: bool) -> u32 {
        let r = self.record(owner, cluster);
        let before = match r.verified {
            Some((c, reads)) if c == capacity => reads,
            _ => 0,
        };
        r.verified = verified.then_some((capacity, before + 1));
        r.verified.map_or(0, |(_, reads)| reads)
    }

    pub fn set_serve_label(&mut self, owner: &str, cluster: &str, write: LabelWrite) {
        self.record(owner, cluster).serve_label = Some(write);
    }

    /// Whether this controller already wrote `value` over the version of the Pod a cache still shows: the cache
    /// is behind that write, and writing again would only repeat it (and its Event).
    pub fn serve_label_written_over(
        &self,
        owner: &str,
        cluster: &str,
        pod_uid: &str,
        version: &str,
        value: &str,
    ) -> bool {
        self.serve_label_over(owner, cluster, pod_uid, version) == Some(value)
    }

    /// The serve label this controller wrote over the version of the Pod a cache still shows, if it did.
    pub fn serve_label_over(
        &self,
        owner: &str,
        cluster: &str,
        pod_uid: &str,
        version: &str,
    ) -> Option<&'static str> {
        let write = self
            .by_owner
            .get(owner)
            .and_then(|c| c.get(cluster))
            .and_then(|r| r.serve_label.as_ref())?;
        (write.pod_uid == pod_uid && write.replaced_version == version).then_some(write.value)
    }

    /// Keeps only the records of `clusters` (the active and pending ones) of this owner.
    pub fn keep_only(&mut self, owner: &str, clusters: &[&str]) {
        if let Some(records) = self.by_owner.get_mut(owner) {
            records.retain(|name, _| clusters.contains(&name.as_str()));
        }
    }

    /// Forgets every cluster of a RayService that is gone (or no longer rayshift's).
    pub fn forget_owner(&mut self, owner: &str) {
        self.by_owner.remove(owner);
    }

    /// Keeps the records of the owners `keep` accepts (pruning after a re-list).
    pub fn retain_owners(&mut self, keep: impl Fn(&str) -> bool) {
        self.by_owner.retain(|owner, _| keep(owner));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rayshift_api::stall::Stall;

    use super::{ClusterRecords, LabelWrite};

    #[test]
    fn verified_reads_count_in_a_row_at_one_capacity() {
        let mut r = ClusterRecords::default();
        assert_eq!(r.capacity_read("uid", "llm-a", 50, true), 1);
        assert_eq!(r.capacity_read("uid", "llm-a", 50, true), 2);
        assert_eq!(r.capacity_read("uid", "llm-a", 50, false), 0);
        assert_eq!(r.capacity_read("uid", "llm-a", 50, true), 1);
        assert_eq!(
            r.capacity_read("uid", "llm-a", 75, true),
            1,
            "a new capacity starts again"
        );
        assert_eq!(r.capacity_read("uid", "llm-b", 75, true), 1, "per cluster");
        r.forget_owner("uid");
        assert_eq!(r.capacity_read("uid", "llm-a", 75, true), 1);
    }

    fn stall() -> Stall {
        Stall {
            shortfalls: Vec::new(),
            message: "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.".into(),
        }
    }

    #[test]
    fn a_wait_for_capacity_lists_pods_only_after_its_first_period() {
        let (hour, now) = (Duration::from_secs(3600), Duration::ZERO);
        let mut r = ClusterRecords::default();
        assert_eq!(
            r.stall_known("uid", "llm-a", now),
            Some(None),
            "just began: no list"
        );
        assert_eq!(
            r.stall_known("uid", "llm-a", now),
            None,
            "still waiting: due a list"
        );
        r.set_stall("uid", "llm-a", Some(stall()));
        assert_eq!(r.stall_known("uid", "llm-a", hour), Some(Some(stall())));
        assert_eq!(
            r.stall_known("uid", "llm-a", now),
            None,
            "older than fresh: list again"
        );
        r.capacity_arrived("uid", "llm-a");
        assert_eq!(r.stall_known("uid", "llm-a", now), Some(None), "a new wait");
        assert_eq!(r.stall_known("uid", "llm-b", hour), Some(None), "per cluster");
    }

    #[test]
    fn forgetting_llm_keeps_llm_v2() {
        let mut r = ClusterRecords::default();
        r.set_pushed_config("uid-llm", "llm-abcde", "a");
        r.set_pushed_config("uid-llm-v2", "llm-v2-fghij", "b");
        assert_eq!(r.proxy_failed("uid-llm-v2", "llm-v2-fghij"), 1);
        assert_eq!(r.proxy_failed("uid-llm-v2", "llm-v2-fghij"), 2);
        r.forget_owner("uid-llm");
        assert_eq!(r.pushed_config("uid-llm", "llm-abcde"), None);
        assert_eq!(r.pushed_config("uid-llm-v2", "llm-v2-fghij"), Some("b"));
        assert_eq!(
            r.proxy_failed("uid-llm-v2", "llm-v2-fghij"),
            3,
            "failures kept too"
        );
        r.proxy_healthy("uid-llm-v2", "llm-v2-fghij");
        assert_eq!(r.proxy_failed("uid-llm-v2", "llm-v2-fghij"), 1);
    }

    #[test]
    fn a_serve_label_write_covers_only_the_version_it_replaced() {
        let mut r = ClusterRecords::default();
        let write = |value| LabelWrite {
            pod_uid: "pod-1".into(),
            replaced_version: "10".into(),
            value,
        };
        assert!(!r.serve_label_written_over("uid", "llm-a", "pod-1", "10", "true"));
        r.set_serve_label("uid", "llm-a", write("true"));
        assert!(r.serve_label_written_over("uid", "llm-a", "pod-1", "10", "true"));
        // A newer version (ours, or someone else's edit after it), another value, Pod or cluster: write again.
        assert!(!r.serve_label_written_over("uid", "llm-a", "pod-1", "11", "true"));
        assert!(!r.serve_label_written_over("uid", "llm-a", "pod-1", "10", "false"));
        assert!(!r.serve_label_written_over("uid", "llm-a", "pod-2", "10", "true"));
        assert!(!r.serve_label_written_over("uid", "llm-b", "pod-1", "10", "true"));
        r.set_serve_label("uid", "llm-a", write("false"));
        assert!(r.serve_label_written_over("uid", "llm-a", "pod-1", "10", "false"));
    }

    #[test]
    fn keep_only_prunes_one_owner() {
        let mut r = ClusterRecords::default();
        r.set_pushed_config("a", "a-1", "x");
        r.set_pushed_config("a", "a-2", "y");
        r.set_pushed_config("b", "a-1", "z");
        r.keep_only("a", &["a-2"]);
        assert_eq!(r.pushed_config("a", "a-1"), None);
        assert_eq!(r.pushed_config("a", "a-2"), Some("y"));
        assert_eq!(r.pushed_config("b", "a-1"), Some("z"));
        r.retain_owners(|owner| owner == "b");
        assert_eq!(r.pushed_config("a", "a-2"), None);
        assert_eq!(r.pushed_config("b", "a-1"), Some("z"));
    }
}
