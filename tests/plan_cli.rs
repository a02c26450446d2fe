//! `rayshift plan` and `rayshift crds`, run as a user would.

use std::{fs, path::Path, process::Command};

use serde_json::Value;

fn rayshift(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rayshift"))
        .args(args)
        .output()
        .expect("run rayshift")
}

fn sample(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("manifests/samples")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn seed_example_plan_json() {
    let out = rayshift(&[
        "plan",
        "-f",
        &sample("rayservice-seed-example.yaml"),
        "--output",
        "json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["peak_total_capacity"], 120);
    assert_eq!(plan["traffic_steps"], 20);
    let steps = plan["steps"].as_array().unwrap();
    let distinct = |key: &str| {
        let mut seen: Vec<i64> = Vec::new();
        for s in steps {
            let v = s[key].as_i64().unwrap();
            if seen.last() != Some(&v) {
                seen.push(v);
            }
        }
        seen
    };
    assert_eq!(distinct("pending_capacity"), vec![0, 20, 40, 60, 80, 100]);
    assert_eq!(distinct("active_capacity"), vec![100, 80, 60, 40, 20, 0]);
    assert_eq!(
        distinct("pending_traffic"),
        (0..=100).step_by(5).collect::<Vec<_>>()
    );
    // The 20 traffic steps are paced by intervalSeconds 10, the first one right away: 19 x 10 s.
    assert_eq!(plan["min_duration_seconds"], 190.0);
    let traffic_times: Vec<f64> = steps
        .iter()
        .filter(|s| s["action"].as_str().unwrap().starts_with("route traffic"))
        .map(|s| s["t_seconds"].as_f64().unwrap())
        .collect();
    assert_eq!(traffic_times.len(), 20);
    assert!(
        traffic_times.windows(2).all(|w| w[1] - w[0] == 10.0),
        "{traffic_times:?}"
    );
    assert_eq!(
        traffic_times.last().copied(),
        plan["min_duration_seconds"].as_f64()
    );
    assert_eq!(steps.last().unwrap()["action"], "promote pending to active");
    for s in steps {
        let total = s["active_capacity"].as_i64().unwrap() + s["pending_capacity"].as_i64().unwrap();
        assert!(total <= 120);
        assert_eq!(
            s["active_traffic"].as_i64().unwrap() + s["pending_traffic"].as_i64().unwrap(),
            100
        );
        assert!(s["pending_traffic"].as_i64().unwrap() <= s["pending_capacity"].as_i64().unwrap());
    }
}

#[test]
fn seed_example_plan_text_table() {
    let out = rayshift(&["plan", "-f", &sample("rayservice-seed-example.yaml")]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("peak total capacity: 120%"), "{text}");
    assert!(text.contains("traffic steps: 20"), "{text}");
    assert!(text.contains("minimum duration: 190s"), "{text}");
    assert!(text.contains("scale pending to 20%"));
    assert!(text.contains("scale active to 80%"));
    assert!(
        text.lines()
            .any(|l| l.contains("190s") && l.contains("promote pending to active")),
        "{text}"
    );
}

#[test]
fn non_incremental_plan_explains_itself() {
    let out = rayshift(&["plan", "-f", &sample("rayservice-bluegreen.yaml")]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("NewCluster (blue/green)"), "{text}");
}

#[test]
fn plan_without_step_size_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("rs.yaml");
    let text = fs::read_to_string(sample("rayservice-seed-example.yaml"))
        .unwrap()
        .replace("stepSizePercent: 5", "");
    fs::write(&f, text).unwrap();
    let out = rayshift(&["plan", "-f", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stepSizePercent"));
}

#[test]
fn committed_crds_match_generated() {
    let out = rayshift(&["crds"]);
    assert!(out.status.success());
    let committed =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/crds/crds.yaml"))
            .expect("manifests/crds/crds.yaml (regenerate with `rayshift crds > manifests/crds/crds.yaml`)");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        committed,
        "manifests/crds/crds.yaml is stale: run `cargo run -q -- crds > manifests/crds/crds.yaml`"
    );
}
