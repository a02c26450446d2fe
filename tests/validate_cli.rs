//! Runs the built `rayshift` binary on the fixture files: one file per rule, allowed and denied cases,
//! warnings and defaulting. Each fixture states its expectation in its header comments.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::Value;

fn rayshift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rayshift"))
        .args(args)
        .output()
        .expect("run rayshift")
}

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/validate");
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .expect("fixture dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// `# key: value` header lines of a fixture.
fn header(path: &Path, key: &str) -> Option<String> {
    let text = fs::read_to_string(path).expect("read fixture");
    let prefix = format!("# {key}: ");
    text.lines()
        .take_while(|l| l.starts_with('#'))
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
}

fn run_json(path: &Path) -> (i32, Value) {
    let file = path.to_str().unwrap();
    let gates = header(path, "gates").unwrap_or_default();
    let out = rayshift(&[
        "validate",
        "-f",
        file,
        "--feature-gates",
        &gates,
        "--output",
        "json",
    ]);
    let code = out.status.code().expect("exit code");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{file}: stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, json)
}

#[test]
fn every_rule_fixture_gets_its_verdict_field_and_message() {
    let files = fixtures();
    assert!(
        files.len() >= 40,
        "expected the full fixture set, found {}",
        files.len()
    );
    let mut failures = Vec::new();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let (code, json) = run_json(path);
        let review = &json[0];
        let expect = header(path, "expect").expect("fixture has # expect");
        let errors: Vec<(String, String)> = review["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["field"].as_str().unwrap().to_string(),
                    e["message"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let warnings: Vec<String> = review["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_str().unwrap().to_string())
            .collect();
        let mut check = |ok: bool, what: String| {
            if !ok {
                failures.push(format!(
                    "{name}: {what}\n  errors: {errors:?}\n  warnings: {warnings:?}"
                ));
            }
        };
        match expect.as_str() {
            "allowed" => {
                check(
                    code == 0 && review["allowed"] == true,
                    format!("expected allowed, exit {code}"),
                );
                if header(path, "warning").is_none() {
                    check(warnings.is_empty(), "expected no warnings".into());
                }
            }
            "denied" => check(
                code == 1 && review["allowed"] == false,
                format!("expected denied, exit {code}"),
            ),
            other => panic!("{name}: unknown expectation {other}"),
        }
        if let Some(fields) = header(path, "field") {
            for field in fields.split(',') {
                let hit = errors.iter().find(|(f, _)| f == field);
                check(hit.is_some(), format!("no error on field {field}"));
                if let (Some((_, msg)), Some(want)) = (hit, header(path, "message")) {
                    check(msg.contains(&want), format!("message on {field} lacks {want:?}"));
                }
            }
        }
        if let Some(want) = header(path, "warning") {
            check(
                warnings.iter().any(|w| w.contains(&want)),
                format!("no warning containing {want:?}"),
            );
        }
        if let Some(want) = header(path, "patch") {
            let paths: Vec<&str> = review["patch"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|op| op["path"].as_str())
                .collect();
            check(
                paths.contains(&want.as_str()),
                format!("no patch op at {want}: {paths:?}"),
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{} fixture(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn many_errors_are_all_reported_in_one_run() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/validate/many-errors.yaml");
    let (_, json) = run_json(&path);
    assert!(json[0]["errors"].as_array().unwrap().len() >= 4, "{json}");
}

#[test]
fn text_output_uses_kubectl_wording() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/validate/step-size-range.yaml");
    let out = rayshift(&[
        "validate",
        "-f",
        path.to_str().unwrap(),
        "--feature-gates=RayServiceIncrementalUpgrade=true",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("RayService serving/llm: denied"), "{text}");
    assert!(
        text.contains(
            "spec.upgradeStrategy.clusterUpgradeOptions.stepSizePercent: Invalid value: 150: stepSizePercent must be between 0 and 100"
        ),
        "{text}"
    );
}

#[test]
fn several_files_and_documents_are_reviewed_in_order() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/validate");
    let a = dir.join("allowed-incremental.yaml");
    let b = dir.join("deletion-delay.yaml");
    let out = rayshift(&[
        "validate",
        "-f",
        a.to_str().unwrap(),
        "-f",
        b.to_str().unwrap(),
        "--feature-gates",
        "RayServiceIncrementalUpgrade=true",
        "-o",
        "json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "one denied document makes the run denied"
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 2);
    assert_eq!(json[0]["allowed"], true);
    assert_eq!(json[1]["allowed"], false);
    assert_eq!(json[1]["name"], "llm");
    assert_eq!(json[1]["namespace"], "serving");
}

#[test]
fn unreadable_input_and_other_kinds_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let cm = dir.path().join("cm.yaml");
    fs::write(&cm, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n").unwrap();
    let out = rayshift(&["validate", "-f", cm.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a ray.io/v1 RayService"));

    let bad = dir.path().join("bad.yaml");
    fs::write(&bad, "spec: [unclosed\n").unwrap();
    assert_eq!(
        rayshift(&["validate", "-f", bad.to_str().unwrap()]).status.code(),
        Some(2)
    );

    let missing = dir.path().join("missing.yaml");
    let out = rayshift(&["validate", "-f", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.yaml"));

    let out = rayshift(&[
        "validate",
        "-f",
        cm.to_str().unwrap(),
        "--feature-gates",
        "NoSuchGate=true",
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "unknown feature gates are a usage error"
    );
}

#[test]
fn operator_defaults_fill_missing_options() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    fs::write(
        &config,
        "clusterUpgradeOptions:\n  stepSizePercent: 10\n  intervalSeconds: 60\n",
    )
    .unwrap();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/validate/step-size-missing.yaml");
    let out = rayshift(&[
        "validate",
        "-f",
        fixture.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--feature-gates",
        "RayServiceIncrementalUpgrade=true",
        "-o",
        "json",
    ]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{json}");
    let patch = &json[0]["patch"];
    assert_eq!(
        patch[0]["path"],
        "/spec/upgradeStrategy/clusterUpgradeOptions/stepSizePercent"
    );
    assert_eq!(patch[0]["value"], 10);
}

#[test]
fn default_flags_override_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    fs::write(
        &config,
        "clusterUpgradeOptions:\n  stepSizePercent: 10\n  maxSurgePercent: 40\n",
    )
    .unwrap();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/validate/step-size-missing.yaml");
    let out = rayshift(&[
        "validate",
        "-f",
        fixture.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--default-step-size-percent",
        "4",
        "--feature-gates",
        "RayServiceIncrementalUpgrade=true",
        "-o",
        "json",
    ]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json[0]["patch"][0]["value"], 4, "{json}");
    // Defaults that could never finish an upgrade are refused up front.
    let out = rayshift(&[
        "validate",
        "-f",
        fixture.to_str().unwrap(),
        "--default-step-size-percent",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stepSizePercent"));
}

/// `--kuberay-version` picks the release whose defaults the rules follow: KubeRay 1.7 turns the incremental
/// gate on, 1.5 and 1.6 leave it off, and an explicit `--feature-gates` wins over either.
#[test]
fn the_kuberay_version_sets_the_gates_defaults() {
    let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/validate/feature-gate-off.yaml");
    let f = f.to_str().unwrap();
    let code = |extra: &[&str]| {
        let mut args = vec!["validate", "-f", f];
        args.extend_from_slice(extra);
        rayshift(&args).status.code()
    };
    assert_eq!(code(&[]), Some(1), "1.6 by default: the gate is off");
    assert_eq!(code(&["--kuberay-version", "1.5"]), Some(1));
    assert_eq!(code(&["--kuberay-version", "v1.7.0"]), Some(0));
    assert_eq!(
        code(&[
            "--kuberay-version",
            "1.7",
            "--feature-gates",
            "RayServiceIncrementalUpgrade=false"
        ]),
        Some(1)
    );
    // KubeRay 1.6 turned RayJobDeletionPolicy on: a suspended worker group without the autoscaler is allowed.
    let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/validate/rc-worker-suspend-gate.yaml");
    let suspend = |extra: &[&str]| {
        let mut args = vec!["validate", "-f", f.to_str().unwrap()];
        args.extend_from_slice(extra);
        rayshift(&args).status.code()
    };
    assert_eq!(suspend(&[]), Some(0), "1.6 by default: the gate is on");
    assert_eq!(suspend(&["--kuberay-version", "1.7"]), Some(0));
    assert_eq!(suspend(&["--kuberay-version", "1.5"]), Some(1));
    let f = f.to_str().unwrap();
    let bad = rayshift(&["validate", "-f", f, "--kuberay-version", "1.4"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unsupported KubeRay version 1.4"));
}
