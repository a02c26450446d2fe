//! The CustomResourceDefinitions rayshift generates from its types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{RayCluster, RayService};

/// Every CRD rayshift ships, in install order.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![RayService::crd(), RayCluster::crd()]
}

/// The CRDs as one multi-document YAML stream (what `rayshift crds` prints).
pub fn to_yaml() -> String {
    let mut out = String::new();
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&yaml_serde::to_string(&crd).expect("CRDs serialize to YAML"));
    }
    out
}
