//! Lossless JSON: every field a user (or KubeRay) wrote survives decode -> encode unchanged.

use std::{fs, path::Path};

use rayshift_api::{RayCluster, RayService, documents};
use serde_json::Value;

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn roundtrip_file(path: &Path) -> usize {
    let text = fs::read_to_string(path).unwrap();
    let docs = documents::parse_stream(&text).unwrap();
    for doc in &docs {
        let back = match doc["kind"].as_str() {
            Some("RayService") => {
                serde_json::to_value(serde_json::from_value::<RayService>(doc.clone()).unwrap())
            }
            Some("RayCluster") => {
                serde_json::to_value(serde_json::from_value::<RayCluster>(doc.clone()).unwrap())
            }
            _ => continue,
        }
        .unwrap();
        assert_json_eq(doc, &back, &path.display().to_string());
    }
    docs.len()
}

fn assert_json_eq(want: &Value, got: &Value, ctx: &str) {
    if want != got {
        panic!(
            "{ctx}: round trip changed the object\nwant: {}\ngot:  {}",
            serde_json::to_string_pretty(want).unwrap(),
            serde_json::to_string_pretty(got).unwrap()
        );
    }
}

#[test]
fn samples_roundtrip() {
    let mut n = 0;
    for entry in fs::read_dir(repo().join("manifests/samples")).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .is_some_and(|f| f.to_string_lossy().starts_with("rayservice-"))
        {
            n += roundtrip_file(&path);
        }
    }
    assert!(n >= 3, "expected the samples, found {n}");
}

#[test]
fn unknown_fields_at_every_level_roundtrip() {
    assert_eq!(
        roundtrip_file(&repo().join("tests/fixtures/roundtrip/kuberay-future-fields.yaml")),
        2
    );
}

#[test]
fn unknown_fields_are_really_kept_in_extra() {
    let text =
        fs::read_to_string(repo().join("tests/fixtures/roundtrip/kuberay-future-fields.yaml")).unwrap();
    let doc = documents::parse_stream(&text).unwrap().remove(0);
    let rs: RayService = serde_json::from_value(doc).unwrap();
    assert!(rs.spec.extra.contains_key("someFutureSpecField"));
    assert!(
        rs.spec
            .ray_cluster_config
            .extra
            .contains_key("gcsFaultToleranceOptions")
    );
    assert!(
        rs.spec.ray_cluster_config.worker_groups()[0]
            .extra
            .contains_key("futureWorkerField")
    );
    let status = rs.status.unwrap();
    assert!(status.extra.contains_key("futureStatusField"));
    assert_eq!(status.active_service_status.unwrap().target_capacity, Some(80));
}

#[test]
fn every_fixture_roundtrips() {
    for entry in fs::read_dir(repo().join("tests/fixtures/validate")).unwrap() {
        let path = entry.unwrap().path();
        let text = fs::read_to_string(&path).unwrap();
        for doc in documents::parse_stream(&text).unwrap() {
            // Fixtures with wrongly typed fields are meant not to decode.
            if let Ok(rs) = serde_json::from_value::<RayService>(doc.clone()) {
                assert_json_eq(
                    &doc,
                    &serde_json::to_value(rs).unwrap(),
                    &path.display().to_string(),
                );
            }
        }
    }
}

/// The reconcile component gives each field of rayshift's typed upgrade progress a place in KubeRay's status
/// schema (the apiserver prunes the rest): the two lists must not drift apart.
#[test]
fn the_reconcile_component_keeps_every_progress_field() {
    use rayshift_api::progress::{Abort, AbortReason, UpgradeProgress};
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../manifests/components/reconcile/rayservice-crd.yaml"
    );
    let ops = documents::parse_stream(&std::fs::read_to_string(path).unwrap())
        .unwrap()
        .remove(0);
    let prefix = "/spec/versions/0/schema/openAPIV3Schema/properties/status/properties/";
    let mut kept: Vec<String> = ops
        .as_array()
        .unwrap()
        .iter()
        .filter(|op| op["op"] == "add")
        .filter_map(|op| op["path"].as_str()?.strip_prefix(prefix).map(str::to_string))
        .collect();
    let t = "2026-11-24T10:00:00Z".parse().unwrap();
    let full = UpgradeProgress {
        upgrade_start_time: Some(t),
        last_progress_time: Some(t),
        last_traffic_step_time: Some(t),
        upgrade_expected_completion_time: Some(t),
        rejected_spec_digest: Some("d".into()),
        upgrade_abort: Some(Abort {
            reason: AbortReason::UpgradeAborted,
            message: "m".into(),
            time: t,
        }),
        slo_checks: vec![rayshift_api::progress::SloCheckStatus {
            name: "errors".into(),
            outcome: rayshift_api::slo::Outcome::Fail,
            value: "0.5".into(),
            query: "q".into(),
            time: t,
            failures: 1,
        }],
        pending_stall: Some("short of 1 nvidia.com/gpu".into()),
        resource_aware_since: Some(t),
    };
    let mut fields: Vec<String> = serde_json::to_value(&full)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    kept.sort();
    fields.sort();
    assert_eq!(kept, fields);
}

#[test]
fn progress_fields_and_unknown_status_fields_both_survive() {
    let status = serde_json::json!({
        "upgradeStartTime": "2026-11-24T10:00:00.5Z", "rejectedSpecDigest": "abc",
        "upgradeAbort": {"reason": "UpgradeAborted", "message": "m", "time": "2026-11-24T10:00:01Z"},
        "someFutureKubeRayField": {"x": 1}
    });
    let typed: rayshift_api::RayServiceStatuses = serde_json::from_value(status.clone()).unwrap();
    assert_eq!(typed.progress.rejected_spec_digest.as_deref(), Some("abc"));
    assert!(typed.progress.upgrade_abort.is_some());
    assert_eq!(typed.extra.keys().collect::<Vec<_>>(), ["someFutureKubeRayField"]);
    assert_eq!(serde_json::to_value(&typed).unwrap(), status);
}
