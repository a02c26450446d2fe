//! The parts of a pod template that admission rules read, and a way to decode only those.
//!
//! Building a whole pod template as `serde_json::Value` (a map per object, a string per key) and dropping it
//! was a third of an admission review (BENCHMARKS.md, "webhook cost"). Inside [`rules_view`], a
//! [`PodTemplate`](crate::raycluster::PodTemplate) keeps only [`RULE_FIELDS`]; everything else is skipped
//! without being built. Lists keep every element, so indexes in reported paths are unchanged, and a value
//! of an unexpected JSON type is kept whole, as the full decode keeps it. The controller never decodes
//! inside the view: it needs every field the user wrote.

use std::{cell::Cell, fmt};

use serde::{
    Deserialize, Deserializer,
    de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor},
};
use serde_json::{Map, Value};

/// Which part of a JSON value is kept.
#[derive(Clone, Copy, Debug)]
pub enum Kept {
    /// The whole value.
    All,
    /// An object's listed keys, each kept as given; other keys are skipped.
    Keys(&'static [(&'static str, Kept)]),
    /// Every element of a list, each kept as given.
    Each(&'static Kept),
}

/// What admission rules read of a template. A rule that reads another field must add it here; the rule
/// tests (each decodes its spec both ways) and the webhook's test of its two decoding paths fail otherwise.
pub const RULE_FIELDS: Kept = Kept::Keys(&[("spec", POD_SPEC)]);

const POD_SPEC: Kept = Kept::Keys(&[
    ("containers", Kept::Each(&CONTAINER)),
    ("restartPolicy", Kept::All),
    ("volumes", Kept::Each(&NAMED)),
]);

const CONTAINER: Kept = Kept::Keys(&[
    ("name", Kept::All),
    ("env", Kept::All),
    ("ports", Kept::All),
    ("resources", Kept::All),
    ("volumeMounts", Kept::All),
]);

const NAMED: Kept = Kept::Keys(&[("name", Kept::All)]);

thread_local! {
    static IN_VIEW: Cell<bool> = const { Cell::new(false) };
}

/// Runs `decode` with pod templates decoded as [`RULE_FIELDS`] only. For admission, which reads the
/// templates and drops them.
pub fn rules_view<R>(decode: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_VIEW.with(|v| v.set(self.0));
        }
    }
    let _restore = Restore(IN_VIEW.with(|v| v.replace(true)));
    decode()
}

/// A pod template as JSON: the rule fields inside [`rules_view`], the whole value outside it.
pub(crate) fn decode_template<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    if IN_VIEW.with(Cell::get) {
        RULE_FIELDS.deserialize(d)
    } else {
        Value::deserialize(d)
    }
}

impl<'de> DeserializeSeed<'de> for Kept {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        match self {
            Kept::All => Value::deserialize(d),
            _ => d.deserialize_any(self),
        }
    }
}

/// Objects and lists are filtered as the shape says; any other value is kept as the full decode keeps it
/// (serde_json's own `Value` visitor does the same for each).
impl<'de> Visitor<'de> for Kept {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let element = match self {
            Kept::Each(element) => *element,
            _ => Kept::All,
        };
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(v) = seq.next_element_seed(element)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Kept::Keys(keys) = self else {
            // A map where a list was expected: kept whole, keys and all.
            let mut out = Map::new();
            while let Some((key, value)) = map.next_entry::<String, Value>()? {
                out.insert(key, value);
            }
            return Ok(Value::Object(out));
        };
        let mut out = Map::new();
        while let Some(listed) = map.next_key_seed(ListedKey(keys))? {
            match listed {
                Some((key, kept)) => {
                    out.insert(key.to_string(), map.next_value_seed(kept)?);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(out))
    }
}

/// An object key matched against the listed keys without building a string for the others.
#[derive(Clone, Copy)]
struct ListedKey(&'static [(&'static str, Kept)]);

impl<'de> DeserializeSeed<'de> for ListedKey {
    type Value = Option<(&'static str, Kept)>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for ListedKey {
    type Value = Option<(&'static str, Kept)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().find(|(k, _)| *k == key).copied())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::raycluster::PodTemplate;

    fn in_view(doc: &Value) -> Value {
        rules_view(|| serde_json::from_str::<PodTemplate>(&doc.to_string()).unwrap().0)
    }

    #[test]
    fn keeps_what_rules_read_and_skips_the_rest() {
        let template = json!({
            "metadata": {"labels": {"team": "inference"}},
            "spec": {
                "serviceAccountName": "ray", "restartPolicy": "Never",
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                "volumes": [{"name": "logs", "emptyDir": {}}, {"configMap": {"name": "c"}}],
                "containers": [{
                    "name": "ray-head", "image": "rayproject/ray:2.46.0", "command": ["ray"],
                    "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                    "volumeMounts": [{"name": "logs", "mountPath": "/tmp/ray"}],
                    "ports": [{"name": "serve", "containerPort": 8000}],
                    "livenessProbe": {"exec": {"command": ["true"]}}
                }],
                "initContainers": [{"name": "init", "image": "busybox"}]
            }
        });
        let expected = json!({
            "spec": {
                "restartPolicy": "Never",
                "volumes": [{"name": "logs"}, {}],
                "containers": [{
                    "name": "ray-head",
                    "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                    "volumeMounts": [{"name": "logs", "mountPath": "/tmp/ray"}],
                    "ports": [{"name": "serve", "containerPort": 8000}]
                }]
            }
        });
        assert_eq!(in_view(&template), expected);
        // Outside the view, nothing is dropped.
        let whole: PodTemplate = serde_json::from_value(template.clone()).unwrap();
        assert_eq!(whole.0, template);
    }

    #[test]
    fn a_value_of_another_type_is_kept_as_the_full_decode_keeps_it() {
        for odd in [
            json!("a string"),
            json!(7),
            json!(-1.5),
            json!(null),
            json!([1, {"a": 2}]),
            json!({"spec": "x"}),
            json!({"spec": {"containers": {"name": "x"}, "volumes": [true, null, "v"]}}),
            json!({"spec": {"containers": [3, [4], {"env": "e"}]}}),
        ] {
            assert_eq!(in_view(&odd), odd);
        }
    }

    #[test]
    fn the_view_ends_with_its_closure_even_on_panic() {
        let doc = json!({"metadata": {"name": "kept outside"}});
        let caught = std::panic::catch_unwind(|| rules_view(|| panic!("decoder failed")));
        assert!(caught.is_err());
        let whole: PodTemplate = serde_json::from_value(doc.clone()).unwrap();
        assert_eq!(whole.0, doc);
    }
}
