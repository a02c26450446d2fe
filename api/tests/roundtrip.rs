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
