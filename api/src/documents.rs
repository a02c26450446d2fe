//! Reading RayServices from multi-document YAML (or JSON) text.

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// Every non-empty document of a YAML stream, as JSON values.
pub fn parse_stream(text: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for (index, de) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(de).map_err(|source| Error::Document { index, source })?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// Why a document is not something rayshift can review.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotARayService {
    #[error("a {api_version} {kind}, not a ray.io/v1 RayService")]
    OtherKind { api_version: String, kind: String },
    #[error("not a Kubernetes object")]
    NotAnObject,
    #[error("missing apiVersion or kind; expected apiVersion ray.io/v1, kind RayService")]
    MissingType,
}

/// Why a document is not something rayshift can review, if it is not.
pub fn not_a_rayservice(doc: &Value) -> Option<NotARayService> {
    let api_version = doc.get("apiVersion").and_then(Value::as_str);
    let kind = doc.get("kind").and_then(Value::as_str);
    match (api_version, kind) {
        (Some("ray.io/v1"), Some("RayService")) => None,
        (Some(v), Some(k)) => Some(NotARayService::OtherKind {
            api_version: v.to_string(),
            kind: k.to_string(),
        }),
        _ if !doc.is_object() => Some(NotARayService::NotAnObject),
        _ => Some(NotARayService::MissingType),
    }
}

/// `namespace/name` of a document, for messages.
pub fn display_name(doc: &Value) -> (String, String) {
    let meta = |k: &str| {
        doc.pointer(&format!("/metadata/{k}"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    (meta("name"), meta("namespace"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_document() {
        let docs = parse_stream("---\na: 1\n---\n---\nb: 2\n").unwrap();
        assert_eq!(docs.len(), 2);
        assert!(parse_stream("a: [unclosed").is_err());
    }

    #[test]
    fn recognizes_rayservices() {
        let rs = serde_json::json!({"apiVersion": "ray.io/v1", "kind": "RayService"});
        assert!(not_a_rayservice(&rs).is_none());
        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap"});
        assert!(not_a_rayservice(&cm).unwrap().to_string().contains("ConfigMap"));
        assert_eq!(
            not_a_rayservice(&serde_json::json!([1])),
            Some(NotARayService::NotAnObject)
        );
        assert_eq!(
            not_a_rayservice(&serde_json::json!({"kind": "RayService"})),
            Some(NotARayService::MissingType)
        );
    }
}
