//! Observe mode: what changed between two statuses of a RayService that someone else (KubeRay) runs. rayshift
//! records each change as an event on the RayService, read from its status alone, so that `kubectl describe`
//! shows the upgrade's progress as it does for the RayServices rayshift runs.

use crate::rayservice::{ClusterServiceStatus, RayServiceStatuses};

/// One side of the RayService (active or pending), as its status tells it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Side {
    pub cluster: Option<String>,
    pub capacity: Option<i32>,
    pub traffic: Option<i32>,
}

impl Side {
    fn of(status: Option<&ClusterServiceStatus>) -> Self {
        let cluster = status
            .and_then(|s| s.ray_cluster_name.clone())
            .filter(|n| !n.is_empty());
        Self {
            capacity: status.and_then(|s| s.target_capacity),
            traffic: status.and_then(|s| s.traffic_routed_percent),
            cluster,
        }
    }
}

/// The clusters, capacities and traffic weights a status shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Levels {
    pub active: Side,
    pub pending: Side,
}

impl Levels {
    pub fn of(status: &RayServiceStatuses) -> Self {
        Self {
            active: Side::of(status.active_service_status.as_ref()),
            pending: Side::of(status.pending_service_status.as_ref()),
        }
    }
}

/// A change seen between two statuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A pending cluster appeared: an upgrade (or the first deployment) started.
    PendingCluster { cluster: String },
    /// The pending cluster went without being promoted (rolled back or replaced).
    PendingClusterRemoved { cluster: String },
    /// Another cluster became active.
    Promoted { from: Option<String>, to: String },
    /// A cluster's Serve target capacity moved.
    Capacity {
        cluster: String,
        from: Option<i32>,
        to: Option<i32>,
    },
    /// The traffic weights moved.
    Traffic {
        active: (Option<i32>, Option<i32>),
        pending: (Option<i32>, Option<i32>),
    },
}

impl Change {
    /// The event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Change::PendingCluster { .. } => "ObservedPendingCluster",
            Change::PendingClusterRemoved { .. } => "ObservedPendingClusterRemoved",
            Change::Promoted { .. } => "ObservedPromotion",
            Change::Capacity { .. } => "ObservedCapacityChange",
            Change::Traffic { .. } => "ObservedTrafficStep",
        }
    }

    /// The event note, with what moved from → to.
    pub fn note(&self) -> String {
        match self {
            Change::PendingCluster { cluster } => {
                format!("Pending RayCluster {cluster} (from the status KubeRay writes)")
            }
            Change::PendingClusterRemoved { cluster } => {
                format!("Pending RayCluster {cluster} is no longer in the status, not promoted")
            }
            Change::Promoted { from, to } => match from {
                Some(from) => format!("Active RayCluster {from} → {to}"),
                None => format!("Active RayCluster {to}"),
            },
            Change::Capacity { cluster, from, to } => {
                format!(
                    "Target capacity of RayCluster {cluster}: {} → {}",
                    percent(*from),
                    percent(*to)
                )
            }
            Change::Traffic { active, pending } => format!(
                "Traffic: active {} → {}, pending {} → {}",
                percent(active.0),
                percent(active.1),
                percent(pending.0),
                percent(pending.1)
            ),
        }
    }
}

fn percent(v: Option<i32>) -> String {
    v.map_or_else(|| "unset".to_string(), |v| format!("{v}%"))
}

/// The changes from `before` to `after`, in the order they are told.
pub fn changes(before: &Levels, after: &Levels) -> Vec<Change> {
    let mut out = Vec::new();
    let promoted = after.active.cluster.is_some() && after.active.cluster != before.active.cluster;
    if let (true, Some(to)) = (promoted, after.active.cluster.clone()) {
        out.push(Change::Promoted {
            from: before.active.cluster.clone(),
            to,
        });
    } else if after.pending.cluster != before.pending.cluster
        && let Some(cluster) = before.pending.cluster.clone()
    {
        out.push(Change::PendingClusterRemoved { cluster });
    }
    if after.pending.cluster != before.pending.cluster
        && let Some(cluster) = after.pending.cluster.clone()
    {
        out.push(Change::PendingCluster { cluster });
    }
    for (b, a) in [(&before.active, &after.active), (&before.pending, &after.pending)] {
        if let Some(cluster) = a
            .cluster
            .clone()
            .filter(|_| a.cluster == b.cluster && a.capacity != b.capacity)
        {
            out.push(Change::Capacity {
                cluster,
                from: b.capacity,
                to: a.capacity,
            });
        }
    }
    let same_clusters =
        before.active.cluster == after.active.cluster && before.pending.cluster == after.pending.cluster;
    if same_clusters
        && (before.active.traffic, before.pending.traffic) != (after.active.traffic, after.pending.traffic)
    {
        out.push(Change::Traffic {
            active: (before.active.traffic, after.active.traffic),
            pending: (before.pending.traffic, after.pending.traffic),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(cluster: &str, capacity: i32, traffic: i32) -> Side {
        Side {
            cluster: Some(cluster.into()),
            capacity: Some(capacity),
            traffic: Some(traffic),
        }
    }

    fn levels(active: Side, pending: Side) -> Levels {
        Levels { active, pending }
    }

    #[test]
    fn an_incremental_upgrade_is_told_step_by_step() {
        let idle = levels(side("a", 100, 100), Side::default());
        let started = levels(side("a", 100, 100), side("b", 0, 0));
        assert_eq!(
            changes(&idle, &started),
            vec![Change::PendingCluster { cluster: "b".into() }]
        );

        let capacity = levels(side("a", 100, 100), side("b", 20, 0));
        let c = changes(&started, &capacity);
        assert_eq!(
            c,
            vec![Change::Capacity {
                cluster: "b".into(),
                from: Some(0),
                to: Some(20)
            }]
        );
        assert_eq!(c[0].note(), "Target capacity of RayCluster b: 0% → 20%");

        let step = levels(side("a", 100, 95), side("b", 20, 5));
        let c = changes(&capacity, &step);
        assert_eq!(c[0].reason(), "ObservedTrafficStep");
        assert_eq!(c[0].note(), "Traffic: active 100% → 95%, pending 0% → 5%");

        let promoted = levels(side("b", 100, 100), Side::default());
        let c = changes(&step, &promoted);
        assert_eq!(
            c,
            vec![Change::Promoted {
                from: Some("a".into()),
                to: "b".into()
            }]
        );
    }

    #[test]
    fn a_pending_cluster_that_goes_unpromoted_is_told() {
        let upgrading = levels(side("a", 100, 100), side("b", 0, 0));
        let back = levels(side("a", 100, 100), Side::default());
        assert_eq!(
            changes(&upgrading, &back),
            vec![Change::PendingClusterRemoved { cluster: "b".into() }]
        );
        let replaced = levels(side("a", 100, 100), side("c", 0, 0));
        assert_eq!(
            changes(&upgrading, &replaced),
            vec![
                Change::PendingClusterRemoved { cluster: "b".into() },
                Change::PendingCluster { cluster: "c".into() }
            ]
        );
    }

    #[test]
    fn no_change_no_event() {
        let l = levels(side("a", 100, 100), side("b", 20, 5));
        assert!(changes(&l, &l).is_empty());
        assert!(changes(&Levels::default(), &Levels::default()).is_empty());
    }

    #[test]
    fn the_first_deployment_is_a_pending_cluster_then_a_promotion() {
        let none = Levels::default();
        let pending = levels(
            Side::default(),
            Side {
                cluster: Some("a".into()),
                ..Side::default()
            },
        );
        assert_eq!(
            changes(&none, &pending),
            vec![Change::PendingCluster { cluster: "a".into() }]
        );
        let active = levels(
            Side {
                cluster: Some("a".into()),
                ..Side::default()
            },
            Side::default(),
        );
        let c = changes(&pending, &active);
        assert_eq!(
            c,
            vec![Change::Promoted {
                from: None,
                to: "a".into()
            }]
        );
        assert_eq!(c[0].note(), "Active RayCluster a");
    }
}
