//! Reading a RayService's status (and its RayClusters) in tests.

use kube::{Api, ResourceExt, api::ListParams};
use rayshift_api::{RayCluster, RayService};

/// Names of the RayClusters that match `labels` (all of them with `""`).
pub async fn cluster_names(api: &Api<RayCluster>, labels: &str) -> Vec<String> {
    api.list(&ListParams::default().labels(labels))
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect()
}

/// The active cluster's name.
pub fn active(rs: &RayService) -> Option<String> {
    rs.status
        .as_ref()?
        .active_service_status
        .as_ref()?
        .ray_cluster_name
        .clone()
}

/// The pending cluster's name.
pub fn pending(rs: &RayService) -> Option<String> {
    rs.status
        .as_ref()?
        .pending_service_status
        .as_ref()?
        .ray_cluster_name
        .clone()
}

/// (status, reason) of a condition.
pub fn condition(rs: &RayService, type_: &str) -> Option<(String, String)> {
    rs.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// A condition's status and message.
pub fn condition_message(rs: &RayService, type_: &str) -> Option<(String, String)> {
    let conditions = rs.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.message.clone()))
}

/// The `Progressing` condition's reason and message.
pub fn progressing(rs: &RayService) -> Option<(String, String)> {
    let conditions = rs.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == "Progressing")?;
    Some((c.reason.clone(), c.message.clone()))
}
