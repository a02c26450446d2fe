//! `ray.io/v1` RayService, wire-compatible with KubeRay's JSON names.
//!
//! Fields rayshift does not model are kept in `extra` maps and written back unchanged. Enumerations
//! (`upgradeStrategy.type`) stay strings on the wire so a bad value is a validation error with a field
//! path rather than a decoding failure.

use std::{collections::BTreeMap, fmt};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    progress::UpgradeProgress,
    raycluster::{Extra, RayClusterSpec},
    schema,
};

/// The `managedBy` value rayshift answers to by default.
pub const RAYSHIFT_MANAGER: &str = "rayshift.io/controller";
pub const KUBERAY_MANAGER: &str = "ray.io/kuberay-operator";
pub const MULTIKUEUE_MANAGER: &str = "kueue.x-k8s.io/multikueue";
/// The finalizer KubeRay (v1.6.2+) puts on the RayServices it runs.
pub const KUBERAY_FINALIZER: &str = "ray.io/rayservice-finalizer";
/// kubectl's copy of the whole last applied object: often the largest string in it, and read by no rule or pass.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// Default `rayClusterDeletionDelaySeconds`.
pub const DEFAULT_DELETION_DELAY_SECONDS: i32 = 60;
/// Built-in default of `clusterUpgradeOptions.maxSurgePercent` (KubeRay's CRD default).
pub const DEFAULT_MAX_SURGE_PERCENT: i32 = 100;

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ray.io",
    version = "v1",
    kind = "RayService",
    namespaced,
    status = "RayServiceStatuses",
    category = "all",
    printcolumn = r#"{"name":"service status","type":"string","jsonPath":".status.serviceStatus"}"#,
    printcolumn = r#"{"name":"num serve endpoints","type":"string","jsonPath":".status.numServeEndpoints"}"#,
    printcolumn = r#"{"name":"active","type":"string","jsonPath":".status.activeServiceStatus.rayClusterName"}"#,
    printcolumn = r#"{"name":"pending","type":"string","jsonPath":".status.pendingServiceStatus.rayClusterName"}"#,
    printcolumn = r#"{"name":"age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct RayServiceSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_cluster_deletion_delay_seconds: Option<i32>,
    /// Deprecated in KubeRay and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_unhealthy_second_threshold: Option<i32>,
    /// Deprecated in KubeRay and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_unhealthy_second_threshold: Option<i32>,
    /// A core/v1 Service template for the serve Service (non-incremental strategies only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_preserved_object")]
    pub serve_service: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_strategy: Option<UpgradeStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_by: Option<String>,
    /// Ray Serve multi-application config, as YAML text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_config_v2: Option<String>,
    pub ray_cluster_config: RayClusterSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude_head_pod_from_serve_svc: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct UpgradeStrategy {
    /// `NewCluster` (default), `NewClusterWithIncrementalUpgrade` or `None`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_upgrade_options: Option<ClusterUpgradeOptions>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct ClusterUpgradeOptions {
    /// Percent of capacity the pending cluster gains per scaling step. Defaulted to 100 at admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge_percent: Option<i32>,
    /// Percent of traffic moved per interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_size_percent: Option<i32>,
    /// Seconds between traffic steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_class_name: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// The three upgrade strategies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UpgradeType {
    /// Blue/green: a full new cluster, then one switch. The default.
    NewCluster,
    /// Gradual capacity and traffic migration over Gateway API.
    NewClusterWithIncrementalUpgrade,
    /// Update the cluster in place.
    None,
}

impl UpgradeType {
    pub const ALL: [UpgradeType; 3] = [
        UpgradeType::NewClusterWithIncrementalUpgrade,
        UpgradeType::NewCluster,
        UpgradeType::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            UpgradeType::NewCluster => "NewCluster",
            UpgradeType::NewClusterWithIncrementalUpgrade => "NewClusterWithIncrementalUpgrade",
            UpgradeType::None => "None",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

impl fmt::Display for UpgradeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `status` of a RayService (KubeRay calls this type `RayServiceStatuses`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct RayServiceStatuses {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// Deprecated: `Running` iff Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_serve_endpoints: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_service_status: Option<ClusterServiceStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_service_status: Option<ClusterServiceStatus>,
    /// rayshift's own upgrade state (top-level status fields; before `extra`, which takes the rest). Not in
    /// the generated CRD, which is KubeRay's view: the reconcile component adds these fields.
    #[serde(flatten)]
    #[schemars(skip)]
    pub progress: UpgradeProgress,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// Per-cluster part of the status (KubeRay's `RayServiceStatus`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct ClusterServiceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_statuses: Option<BTreeMap<String, AppStatus>>,
    /// Ray Serve `target_capacity` this cluster was last set to (incremental mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_capacity: Option<i32>,
    /// Route weight of this cluster (incremental mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_routed_percent: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_traffic_migrated_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_cluster_name: Option<String>,
    /// Copy of the cluster's `.status`, for display only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_preserved_object")]
    pub ray_cluster_status: Option<Value>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct AppStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_deployment_statuses: Option<BTreeMap<String, ServeDeploymentStatus>>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct ServeDeploymentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl RayServiceSpec {
    /// The strategy in force: `NewCluster` when unset. `None` for an unknown value (validation denies it).
    pub fn upgrade_type(&self) -> Option<UpgradeType> {
        self.upgrade_type_with(true)
    }

    /// The strategy in force under KubeRay's operator setting `ENABLE_ZERO_DOWNTIME`: when it is off, an unset
    /// type means no new cluster (`None`); a type the RayService names is kept.
    pub fn upgrade_type_with(&self, zero_downtime: bool) -> Option<UpgradeType> {
        match self.upgrade_strategy.as_ref().and_then(|s| s.type_.as_deref()) {
            None if zero_downtime => Some(UpgradeType::NewCluster),
            None => Some(UpgradeType::None),
            Some(t) => UpgradeType::parse(t),
        }
    }

    pub fn cluster_upgrade_options(&self) -> Option<&ClusterUpgradeOptions> {
        self.upgrade_strategy.as_ref()?.cluster_upgrade_options.as_ref()
    }

    pub fn deletion_delay_seconds(&self) -> i32 {
        self.ray_cluster_deletion_delay_seconds
            .unwrap_or(DEFAULT_DELETION_DELAY_SECONDS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_zero_downtime_an_unset_type_is_none() {
        let spec = |strategy: serde_json::Value| -> RayServiceSpec {
            serde_json::from_value(
                serde_json::json!({"upgradeStrategy": strategy, "rayClusterConfig": {"headGroupSpec": {}}}),
            )
            .unwrap()
        };
        let unset = spec(serde_json::json!({}));
        assert_eq!(unset.upgrade_type(), Some(UpgradeType::NewCluster));
        assert_eq!(unset.upgrade_type_with(false), Some(UpgradeType::None));
        let named = spec(serde_json::json!({"type": "NewCluster"}));
        assert_eq!(
            named.upgrade_type_with(false),
            Some(UpgradeType::NewCluster),
            "a named type is kept"
        );
    }
}
