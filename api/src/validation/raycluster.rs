//! KubeRay's RayCluster rules (`ValidateRayClusterSpec`) applied to `spec.rayClusterConfig`.

use std::collections::BTreeMap;

use super::{ValidationConfig, Verdict};
use crate::raycluster::RayClusterSpec;

/// Checks `spec.rayClusterConfig` against every RayCluster rule; appends to `v`.
pub(crate) fn validate_cluster_spec(
    _spec: &RayClusterSpec,
    _annotations: &BTreeMap<String, String>,
    _cfg: &ValidationConfig,
    _v: &mut Verdict,
) {
}
