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
        for crd in all() {
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
