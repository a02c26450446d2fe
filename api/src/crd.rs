//! The CustomResourceDefinitions rayshift generates from its types.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::Value;

use crate::{RayCluster, RayService};

/// Every CRD rayshift ships, in install order.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![portable(RayService::crd()), portable(RayCluster::crd())]
}

/// The Gateway API CRDs the incremental strategy needs (GatewayClass, Gateway, HTTPRoute), generated from
/// the gateway-api crate's types: for clusters and tests without the official install.
pub fn gateway_api() -> Vec<CustomResourceDefinition> {
    use gateway_api::{gatewayclasses::GatewayClass, gateways::Gateway, httproutes::HttpRoute};
    [GatewayClass::crd(), Gateway::crd(), HttpRoute::crd()]
        .into_iter()
        .map(|mut crd| {
            // `*.k8s.io` groups are protected: the apiserver requires this annotation (as the official CRDs carry).
            crd.metadata.annotations = Some(BTreeMap::from([
                (
                    "api-approved.kubernetes.io".to_string(),
                    GATEWAY_API_APPROVAL.to_string(),
                ),
                (
                    "rayshift.io/generated-from".to_string(),
                    "gateway-api crate 0.22".to_string(),
                ),
            ]));
            portable(crd)
        })
        .collect()
}

const GATEWAY_API_APPROVAL: &str = "https://github.com/kubernetes-sigs/gateway-api/pull/2466";

/// Rewrites a CRD so that Kubernetes 1.20 accepts it as well as current clusters: `null` is dropped
/// from enums (nullable already says it), CEL rules and null defaults are removed, and strings are
/// nullable (a 1.20 apiserver rejects `""` in a non-nullable string field, e.g. a condition's empty
/// `message`, as "null").
fn portable(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn walk(node: &mut Value) {
        match node {
            Value::Object(map) => {
                if let Some(Value::Array(values)) = map.get_mut("enum") {
                    values.retain(|v| !v.is_null());
                }
                map.remove("x-kubernetes-validations");
                if map.get("default").is_some_and(Value::is_null) {
                    map.remove("default");
                }
                if map.get("type").and_then(Value::as_str) == Some("string") {
                    map.insert("nullable".into(), Value::Bool(true));
                }
                map.values_mut().for_each(walk);
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(&crd).expect("CRDs serialize");
    walk(&mut value);
    serde_json::from_value(value).expect("a rewritten CRD is still a CRD")
}

/// The CRDs as one multi-document YAML stream (what `rayshift crds` prints).
pub fn to_yaml() -> String {
    yaml_stream(&all())
}

/// A multi-document YAML stream of CRDs.
pub fn yaml_stream(crds: &[CustomResourceDefinition]) -> String {
    let mut out = String::new();
    for crd in crds {
        out.push_str("---\n");
        out.push_str(&yaml_serde::to_string(crd).expect("CRDs serialize to YAML"));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// Walks every schema node with its path.
    fn walk<'a>(node: &'a Value, path: String, out: &mut Vec<(String, &'a Value)>) {
        out.push((path.clone(), node));
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                walk(v, format!("{path}.{k}"), out);
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(child) = node.get(key).filter(|c| c.is_object()) {
                walk(child, format!("{path}[{key}]"), out);
            }
        }
    }

    /// What a Kubernetes 1.20 apiserver refuses or mishandles (see local-control-plane.md), and what any
    /// apiserver requires of a structural schema.
    #[test]
    fn crds_are_structural_and_install_on_kubernetes_1_20() {
        for crd in all().into_iter().chain(gateway_api()) {
            let json = serde_json::to_value(&crd).unwrap();
            let text = json.to_string();
            assert!(!text.contains("x-kubernetes-validations"), "no CEL rules on 1.20");
            let schema = &json["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
            let mut nodes = Vec::new();
            walk(schema, crd.spec.names.kind.clone(), &mut nodes);
            assert!(nodes.len() > 20);
            for (path, node) in nodes {
                let typed = node.get("type").is_some()
                    || node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
                    || node.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
                assert!(typed, "{path}: every schema node needs a type");
                if let Some(d) = node.get("default") {
                    assert!(!d.is_null() && d != "", "{path}: 1.20 refuses null-like defaults");
                }
                assert!(
                    node.get("x-kubernetes-list-map-keys").is_none(),
                    "{path}: list-map keys need care on 1.20"
                );
                if let Some(Value::Array(values)) = node.get("enum") {
                    assert!(
                        values.iter().all(|v| !v.is_null()),
                        "{path}: 1.20 refuses null in enums"
                    );
                }
                for banned in ["$ref", "anyOf", "oneOf", "allOf", "definitions", "$defs"] {
                    assert!(node.get(banned).is_none(), "{path}: {banned} is not structural");
                }
            }
        }
    }

    #[test]
    fn crds_keep_kuberay_names_and_status_subresource() {
        let crds = all();
        let names: Vec<_> = crds.iter().map(|c| c.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, ["rayservices.ray.io", "rayclusters.ray.io"]);
        for crd in &crds {
            let v = &crd.spec.versions[0];
            assert_eq!(v.name, "v1");
            assert!(v.served && v.storage);
            assert!(v.subresources.as_ref().unwrap().status.is_some());
            assert_eq!(
                crd.spec.names.categories.as_deref(),
                Some(&["all".to_string()][..])
            );
        }
    }
}
