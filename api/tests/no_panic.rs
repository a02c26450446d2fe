//! Arbitrary input never panics the rules, the defaulting or the planner's spec reader.

use proptest::prelude::*;
use rayshift_api::{
    FeatureGates, defaulting, documents,
    upgrade::UpgradeOptions,
    validation::{ValidationConfig, decode, review},
};
use serde_json::{Value, json};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1e9f64..1e9).prop_map(|f| json!(f)),
        "[a-zA-Z0-9:/ .\\-]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn base() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/validate/allowed-incremental.yaml"
    );
    documents::parse_stream(&std::fs::read_to_string(path).unwrap())
        .unwrap()
        .remove(0)
}

/// Every JSON pointer into the document.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => m.iter().for_each(|(k, c)| pointers(c, format!("{at}/{k}"), out)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, c)| pointers(c, format!("{at}/{i}"), out)),
        _ => {}
    }
}

fn exercise(doc: &Value) {
    let cfg = ValidationConfig {
        feature_gates: FeatureGates::default()
            .with("RayServiceIncrementalUpgrade", true)
            .unwrap(),
        ..ValidationConfig::default()
    };
    let mut defaulted = doc.clone();
    let patch = defaulting::apply_defaults(&mut defaulted, &defaulting::UpgradeDefaults::default());
    assert!(
        defaulting::default_patch(&defaulted, &Default::default())
            .0
            .is_empty(),
        "idempotent: {patch:?}"
    );
    let verdict = review(&defaulted, Some(doc), &cfg);
    let _ = verdict.denial_message();
    if let Ok(rs) = decode(&defaulted)
        && let Some(o) = rs.spec.cluster_upgrade_options()
    {
        let _ = UpgradeOptions::from_spec(o);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_json_never_panics(doc in json_value()) {
        exercise(&doc);
    }

    #[test]
    fn any_field_replaced_by_anything_never_panics(pick in any::<prop::sample::Index>(), value in json_value()) {
        let mut doc = base();
        let mut ptrs = Vec::new();
        pointers(&doc, String::new(), &mut ptrs);
        let ptr = pick.get(&ptrs).clone();
        if ptr.is_empty() {
            doc = value;
        } else if let Some(slot) = doc.pointer_mut(&ptr) {
            *slot = value;
        }
        exercise(&doc);
    }
}
