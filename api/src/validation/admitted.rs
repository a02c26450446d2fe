//! What admission reads of a RayService, in one pass over the object's JSON: its type fields (kube's
//! derive drops them), the metadata the rules read, and the spec. managedFields, labels and kubectl's
//! last-applied copy of the object are skipped, not decoded. This is the webhook's hot path (BENCHMARKS.md,
//! "webhook cost").

use std::{collections::BTreeMap, fmt};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{
    Deserialize, Deserializer,
    de::{IgnoredAny, MapAccess, Visitor},
};
use serde_json::Value;

use super::{FieldError, StoredObject, ValidationConfig, Verdict, rayservice};
use crate::{RayService, RayServiceSpec, rayservice::LAST_APPLIED_ANNOTATION};

/// A RayService as admission decodes it. Decoding fails on a field of the wrong type; [`decode_str`]
/// then names the field.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Admitted {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: AdmittedMeta,
    spec: RayServiceSpec,
}

#[derive(Default, Deserialize)]
struct AdmittedMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default, deserialize_with = "rule_annotations")]
    annotations: Option<BTreeMap<String, String>>,
}

impl Admitted {
    pub fn api_version(&self) -> Option<&str> {
        self.api_version.as_deref()
    }

    pub fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }

    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    /// Every rule; `old` is the stored object on UPDATE.
    pub fn review(self, old: Option<&StoredObject>, cfg: &ValidationConfig) -> Verdict {
        let rs = RayService {
            metadata: ObjectMeta {
                name: self.metadata.name,
                namespace: self.metadata.namespace,
                annotations: self.metadata.annotations,
                ..ObjectMeta::default()
            },
            spec: self.spec,
            status: None,
        };
        rayservice::validate(&rs, old, cfg)
    }
}

/// Decodes a RayService from JSON text, naming the field when one has the wrong type. Tracking the path
/// costs a third of the decode, so only a failed decode pays for it.
pub fn decode_str(text: &str) -> Result<Admitted, FieldError> {
    serde_json::from_str(text).or_else(|_| {
        let mut de = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let value: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            rayservice::decode_error(&value, e)
        })
    })
}

fn rule_annotations<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    d.deserialize_option(RuleAnnotations)
}

struct RuleAnnotations;

impl<'de> Visitor<'de> for RuleAnnotations {
    type Value = Option<BTreeMap<String, String>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of strings")
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == LAST_APPLIED_ANNOTATION {
                map.next_value::<IgnoredAny>()?;
            } else {
                let value = map.next_value()?;
                out.insert(key, value);
            }
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sample() -> Value {
        json!({
            "apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "llm", "namespace": "serving", "labels": {"a": "b"},
                "annotations": {LAST_APPLIED_ANNOTATION: "{\"big\": true}", "rayshift.io/drain-seconds": "x"},
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {"serveConfigV2": "applications:\n- name: a\n  import_path: m:app\n",
                "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {},
                    "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.9.0"}]}}}}}
        })
    }

    #[test]
    fn reads_the_type_and_what_the_rules_read_and_skips_the_rest() {
        let admitted = decode_str(&sample().to_string()).unwrap();
        assert_eq!(admitted.api_version(), Some("ray.io/v1"));
        assert_eq!(admitted.kind(), Some("RayService"));
        assert_eq!(admitted.name(), "llm");
        assert_eq!(admitted.metadata.namespace.as_deref(), Some("serving"));
        let annotations = admitted.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["rayshift.io/drain-seconds"]
        );
        // The annotation rule still sees rayshift's annotation.
        let verdict = admitted.review(None, &ValidationConfig::default());
        let fields: Vec<&str> = verdict.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["metadata.annotations[rayshift.io/drain-seconds]"]);
    }

    #[test]
    fn the_same_verdict_as_the_full_decode() {
        let mut doc = sample();
        doc["metadata"]["annotations"]["rayshift.io/drain-seconds"] = json!("5");
        doc["spec"]["upgradeStrategy"] = json!({"type": "NewClusterWithIncrementalUpgrade"});
        let cfg = ValidationConfig::default();
        let fast = decode_str(&doc.to_string()).unwrap().review(None, &cfg);
        assert_eq!(fast, super::super::review(&doc, None, &cfg));
        assert!(!fast.errors.is_empty(), "the incremental gate is off by default");
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named_with_its_path() {
        let mut doc = sample();
        doc["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"] = json!({"num-cpus": 1});
        let e = decode_str(&doc.to_string()).err().unwrap();
        assert_eq!(
            e.field,
            "spec.rayClusterConfig.headGroupSpec.rayStartParams.num-cpus"
        );
        let mut doc = sample();
        doc["metadata"]["annotations"] = json!({"a": 1});
        assert_eq!(
            decode_str(&doc.to_string()).err().unwrap().field,
            "metadata.annotations.a"
        );
        doc["metadata"]["annotations"] = Value::Null;
        assert!(decode_str(&doc.to_string()).is_ok());
    }
}
