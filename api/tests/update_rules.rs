//! Rules that only apply on UPDATE (the stored object is known).

mod common;

use common::{allowed_incremental as base, incremental_gate_on as config};
use rayshift_api::validation::review;
use serde_json::json;

#[test]
fn managed_by_is_immutable_once_set() {
    let mut old = base();
    old["spec"]["managedBy"] = json!("rayshift.io/controller");
    let mut new = old.clone();
    new["spec"]["managedBy"] = json!("ray.io/kuberay-operator");
    let v = review(&new, Some(&old), &config());
    assert!(!v.allowed());
    assert_eq!(v.errors[0].field, "spec.managedBy");
    assert_eq!(v.errors[0].rule, "managed-by-immutable");
    assert!(v.errors[0].message.contains("immutable"));
    assert!(
        review(&new, Some(&new), &config()).allowed(),
        "unchanged managedBy is fine"
    );
}

#[test]
fn managed_by_set_or_removed_is_a_handover_with_a_warning() {
    // As KubeRay's CEL transition rule: it only compares two values that are both set.
    let unset = base();
    let mut set = base();
    set["spec"]["managedBy"] = json!("rayshift.io/controller");
    for (old, new, who) in [
        (&unset, &set, "rayshift.io/controller"),
        (&set, &unset, "KubeRay"),
    ] {
        let v = review(new, Some(old), &config());
        assert!(v.allowed(), "{:?}", v.errors);
        let w = v.warnings.iter().find(|w| w.rule == "managed-by-handover");
        assert!(
            w.is_some_and(|w| w.field == "spec.managedBy" && w.message.contains(who)),
            "{:?}",
            v.warnings
        );
    }
    assert!(
        review(&set, None, &config())
            .warnings
            .iter()
            .all(|w| w.rule != "managed-by-handover"),
        "a new RayService hands nothing over"
    );
}

#[test]
fn changing_options_mid_upgrade_warns() {
    let mut old = base();
    old["status"] = json!({"activeServiceStatus": {"rayClusterName": "llm-abcde"},
                           "pendingServiceStatus": {"rayClusterName": "llm-fghij"}});
    let mut new = old.clone();
    new["spec"]["upgradeStrategy"]["clusterUpgradeOptions"]["stepSizePercent"] = json!(10);
    let v = review(&new, Some(&old), &config());
    assert!(v.allowed());
    assert!(
        v.warnings.iter().any(|w| w.rule == "options-changed-mid-upgrade"),
        "{:?}",
        v.warnings
    );

    // No pending cluster: no upgrade in progress, no warning.
    old["status"]["pendingServiceStatus"] = json!({});
    let v = review(&new, Some(&old), &config());
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
}

#[test]
fn a_stored_object_that_no_longer_decodes_does_not_block_a_fix() {
    let mut old = base();
    old["spec"]["rayClusterDeletionDelaySeconds"] = json!("sixty");
    assert!(review(&base(), Some(&old), &config()).allowed());
}

#[test]
fn no_input_panics() {
    let weird = [
        json!(null),
        json!([]),
        json!({"spec": null}),
        json!({"spec": {"rayClusterConfig": {}}}),
        json!({"spec": {"rayClusterConfig": {"headGroupSpec": {"template": 5}}, "upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": {}}}}),
        json!({"metadata": {"name": ""}, "spec": {"rayClusterConfig": {"headGroupSpec": {}, "workerGroupSpecs": [{"groupName": "g", "template": {"spec": {"containers": [1, "x", {}]}}}]}}}),
    ];
    for w in weird {
        let v = review(&w, None, &config());
        assert!(!v.allowed(), "{w}");
        assert!(
            v.errors.iter().all(|e| !e.field.is_empty()),
            "{w}: {:?}",
            v.errors
        );
    }
}
