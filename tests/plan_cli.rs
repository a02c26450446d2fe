//! `rayshift plan`, `rayshift crds` and the kubectl plugin's client, run as a user would.

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
    // The 20 traffic steps are paced by intervalSeconds 10, the first one right away: 19 x 10 s; then the old
    // cluster drains for the default 5 s before it goes to capacity 0 and the new one is promoted.
    assert_eq!(plan["min_duration_seconds"], 195.0);
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
    assert_eq!(traffic_times.last().copied(), Some(190.0));
    let emptied = steps
        .iter()
        .find(|s| s["active_capacity"] == 0)
        .expect("the old cluster goes to 0");
    assert_eq!(emptied["t_seconds"], 195.0, "{emptied}");
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
    assert!(text.contains("minimum duration: 195s"), "{text}");
    assert!(
        text.contains("drain 5s before a cluster without traffic goes to capacity 0"),
        "{text}"
    );
    assert!(text.contains("scale pending to 20%"));
    assert!(text.contains("scale active to 80%"));
    assert!(
        text.lines()
            .any(|l| l.contains("195s") && l.contains("promote pending to active")),
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
    // KubeRay's ENABLE_ZERO_DOWNTIME=false: the sample names no type, so it is updated in place.
    let file = sample("rayservice-bluegreen.yaml");
    let out = rayshift(&["plan", "-f", &file, "--enable-zero-downtime=false"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("uses None: clusters are updated in place"),
        "{text}"
    );
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

/// The seed sample with `annotations` (YAML lines, indented for `metadata:`).
fn seed_with_annotations(dir: &Path, annotations: &str) -> String {
    let f = dir.join("rs.yaml");
    let text = fs::read_to_string(sample("rayservice-seed-example.yaml"))
        .unwrap()
        .replacen(
            "metadata:\n",
            &format!("metadata:\n  annotations:\n{annotations}"),
            1,
        );
    fs::write(&f, text).unwrap();
    f.to_string_lossy().into_owned()
}

/// `--drain-seconds` plans with the controller's flag; the RayService's own annotation still wins.
#[test]
fn plan_takes_the_controllers_drain_seconds() {
    let duration = |file: &str, extra: &[&str]| {
        let mut args = vec!["plan", "-f", file, "-o", "json"];
        args.extend_from_slice(extra);
        let out = rayshift(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
        plan["min_duration_seconds"].as_f64().unwrap()
    };
    let seed = sample("rayservice-seed-example.yaml");
    // 19 intervals of 10 s, then the drain.
    assert_eq!(duration(&seed, &[]), 195.0);
    assert_eq!(duration(&seed, &["--drain-seconds", "30"]), 220.0);
    assert_eq!(duration(&seed, &["--drain-seconds", "0"]), 190.0);
    let dir = tempfile::tempdir().unwrap();
    let annotated = seed_with_annotations(dir.path(), "    rayshift.io/drain-seconds: \"12\"\n");
    assert_eq!(duration(&annotated, &["--drain-seconds", "30"]), 202.0);
    let out = rayshift(&["plan", "-f", &seed, "--drain-seconds", "-1"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a flag it cannot honour is a usage error"
    );
}

#[test]
fn plan_says_where_traffic_enters() {
    let dir = tempfile::tempdir().unwrap();
    let out = rayshift(&["plan", "-f", &sample("rayservice-seed-example.yaml")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("traffic enters through: Gateway "), "{text}");
    let shared = seed_with_annotations(
        dir.path(),
        "    rayshift.io/gateway: infra/edge\n    rayshift.io/gateway-listener: web\n",
    );
    let out = rayshift(&["plan", "-f", &shared, "-o", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let entry = plan["traffic_entry"].as_str().unwrap();
    assert!(
        entry.contains("shared Gateway infra/edge, listener web"),
        "{entry}"
    );
    let both = seed_with_annotations(
        dir.path(),
        "    rayshift.io/gateway: edge\n    rayshift.io/http-route: public\n",
    );
    let out = rayshift(&["plan", "-f", &both]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("metadata.annotations[rayshift.io/http-route]"),
        "{err}"
    );
}

/// Every schema node with its path and type.
fn schema_types(node: &Value, path: String, out: &mut std::collections::BTreeMap<String, String>) {
    let ty = node.get("type").and_then(Value::as_str).unwrap_or("").to_string();
    out.insert(path.clone(), ty);
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            schema_types(v, format!("{path}.{k}"), out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = node.get(key).filter(|c| c.is_object()) {
            schema_types(child, format!("{path}[]"), out);
        }
    }
}

/// The v1 schema of each CRD in a YAML stream, by kind.
fn v1_schemas(yaml: &str) -> std::collections::BTreeMap<String, Value> {
    yaml.split("\n---")
        .filter_map(|doc| yaml_serde::from_str::<Value>(doc).ok())
        .filter(|crd| crd["kind"] == "CustomResourceDefinition")
        .filter_map(|crd| {
            let kind = crd["spec"]["names"]["kind"].as_str()?.to_string();
            let v1 = crd["spec"]["versions"]
                .as_array()?
                .iter()
                .find(|v| v["name"] == "v1")?;
            Some((kind, v1["schema"]["openAPIV3Schema"].clone()))
        })
        .collect()
}

/// Fields rayshift models from KubeRay 1.7.0 (`spec.suspend` of a RayService, a worker group's `priority`).
const NEWER_THAN_PINNED: [&str; 2] = ["RayService.spec.suspend", "workerGroupSpecs[].priority"];

/// `rayshift crds` is rayshift's own view of KubeRay's schema, no longer installed anywhere: the tests and users
/// install KubeRay's released CRDs. It stays as the check of wire compatibility: every field rayshift models
/// exists in KubeRay's released CRDs (read from the Go module) with the same type.
#[test]
fn modelled_fields_exist_in_kuberays_released_crds() {
    let out = rayshift(&["crds"]);
    assert!(out.status.success());
    let ours = v1_schemas(&String::from_utf8_lossy(&out.stdout));
    let files = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/env/upstream.sh"))
        .args(["crds", "kuberay"])
        .output()
        .expect("run tests/env/upstream.sh");
    assert!(
        files.status.success(),
        "{}",
        String::from_utf8_lossy(&files.stderr)
    );
    let upstream: std::collections::BTreeMap<String, Value> = String::from_utf8_lossy(&files.stdout)
        .lines()
        .flat_map(|f| v1_schemas(&fs::read_to_string(f).unwrap()))
        .collect();
    let mut problems = Vec::new();
    for kind in ["RayService", "RayCluster"] {
        let (mut mine, mut theirs) = (Default::default(), Default::default());
        schema_types(&ours[kind], kind.to_string(), &mut mine);
        schema_types(&upstream[kind], kind.to_string(), &mut theirs);
        assert!(
            mine.len() > 50 && theirs.len() > mine.len(),
            "{kind}: {} vs {}",
            mine.len(),
            theirs.len()
        );
        for (path, ty) in &mine {
            match theirs.get(path) {
                // Newer than the pinned KubeRay (v1.6.2): its CRD prunes them, later ones keep them.
                None if NEWER_THAN_PINNED.iter().any(|f| path.ends_with(f)) => {}
                None => problems.push(format!("{path} is not in KubeRay's CRD")),
                Some(t) if !ty.is_empty() && !t.is_empty() && t != ty => {
                    problems.push(format!("{path}: rayshift {ty}, KubeRay {t}"))
                }
                _ => {}
            }
        }
    }
    assert!(
        problems.is_empty(),
        "not wire-compatible:\n{}",
        problems.join("\n")
    );
}

/// Bad flags exit 2 (clap's usage errors and rayshift's own checks alike); a failure while running exits 1.
#[test]
fn exit_codes_tell_bad_flags_from_runtime_failures() {
    let code = |args: &[&str]| rayshift(args).status.code();
    assert_eq!(
        code(&["controller", "--progress-deadline-seconds", "0"]),
        Some(2),
        "out of range"
    );
    assert_eq!(code(&["controller", "--no-such-flag"]), Some(2));
    assert_eq!(code(&["webhook", "--feature-gates", "NoSuchGate=true"]), Some(2));
    // A kubeconfig that points nowhere: the flags are fine, running fails.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();
    let out = rayshift(&[
        "controller",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--metrics-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Durations take seconds or units, and a value below a flag's minimum is refused, never raised in silence.
#[test]
fn duration_flags_refuse_what_they_cannot_honour() {
    let out = rayshift(&["controller", "--serve-poll-interval-seconds", "0.001"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be at least 0.05 s"));
    let out = rayshift(&["controller", "--resync-interval-seconds", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a duration"));
    let out = rayshift(&["webhook", "--request-timeout-seconds", "0"]);
    assert_eq!(out.status.code(), Some(2));
    // Units are accepted: this fails only later, at the kubeconfig (exit 1, not a usage error).
    let out = rayshift(&[
        "controller",
        "--serve-poll-interval-seconds",
        "300ms",
        "--resync-interval-seconds",
        "1m30s",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The SLO checks a RayService names are listed with the plan (text and JSON), built-ins expanded.
#[test]
fn plan_lists_the_slo_checks() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/validate/allowed-slo-checks.yaml");
    let file = file.to_string_lossy();
    let text = rayshift(&["plan", "-f", &file, "--capacity-wait-seconds", "30"]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    for want in [
        "SLO checks before each traffic step",
        "serve-error-ratio",
        "gpu-memory",
        "< 0.95",
        "Pause",
        "expected duration:",
    ] {
        assert!(text.contains(want), "{want:?} not in:\n{text}");
    }
    let json = rayshift(&["plan", "-f", &file, "-o", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let names: Vec<&str> = json["slo_checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "serve-error-ratio",
            "serve-p99-latency-vs-active",
            "serve-queued-per-replica",
            "gpu-memory"
        ]
    );
    assert!(
        json["expected_duration_seconds"].as_f64().unwrap()
            > json["min_duration_seconds"].as_f64().unwrap() - 1.0
    );
}

/// `plan --resource-aware`: the active cluster gives way first, the dip is maxUnavailablePercent (the
/// annotation's, else stepSizePercent), no surge beyond the spare room; `always` in the annotation plans it so.
#[test]
fn resource_aware_plan_shows_the_dip() {
    let seed = sample("rayservice-seed-example.yaml");
    let json = |args: &[&str]| -> Value {
        let out = rayshift(&[&["plan", "-o", "json"], args].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let surge = json(&["-f", &seed]);
    assert_eq!(
        (
            surge["min_serving_capacity"].as_i64(),
            surge["peak_total_capacity"].as_i64()
        ),
        (Some(100), Some(120))
    );
    let ra = json(&["-f", &seed, "--resource-aware", "--spare-capacity-percent", "5"]);
    assert_eq!(
        ra["min_serving_capacity"], 95,
        "stepSizePercent 5 is the default dip"
    );
    assert_eq!(
        ra["peak_total_capacity"], 105,
        "the freed 5 % and the spare 5 %, never more"
    );
    assert_eq!(
        json(&["-f", &seed, "--resource-aware"]),
        ra,
        "unless told, the spare room is one step, as the controller assumes"
    );
    assert_eq!(
        ra["steps"].as_array().unwrap().last().unwrap()["action"],
        "promote pending to active"
    );
    let dir = tempfile::tempdir().unwrap();
    let annotated = seed_with_annotations(
        dir.path(),
        "    rayshift.io/resource-aware: always\n    rayshift.io/max-unavailable-percent: \"20\"\n",
    );
    let ra = json(&["-f", &annotated, "--spare-capacity-percent", "5"]);
    assert_eq!(ra["min_serving_capacity"], 80);
    let out = rayshift(&["plan", "-f", &annotated, "--spare-capacity-percent", "5"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "ResourceAware: serving capacity dips to 80% (maxUnavailablePercent 20, spare capacity 5%)"
        ),
        "{text}"
    );
}

/// A stand-in apiserver that answers every request 429 with `Retry-After: 1`, as a throttling kube-apiserver
/// does. A stand-in because the real one cannot be made to throttle one client quickly: API Priority and
/// Fairness dispatches a lone request even at a priority level of zero seats (tried: 1 dispatched, 0 rejected).
struct Throttling {
    url: String,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Throttling {
    fn start() -> Self {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().map_while(Result::ok) {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Too many requests, please try again later.","reason":"TooManyRequests","details":{"retryAfterSeconds":1},"code":429}"#;
                let _ = write!(
                    stream,
                    "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Throttling { url, requests }
    }
}

/// `kubectl rayshift status` against a throttling apiserver gives up with its 429 after a few retries, each at
/// least Retry-After apart (about kubectl's patience), not after kube's default 15 retries over minutes.
#[test]
fn the_plugin_gives_up_on_a_throttling_apiserver() {
    let apiserver = Throttling::start();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: {}}}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u, namespace: ns}}\ncurrent-context: c\n",
            apiserver.url
        ),
    )
    .unwrap();
    let plugin = dir.path().join("kubectl-rayshift");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rayshift"), &plugin).unwrap();
    let started = std::time::Instant::now();
    let out = Command::new(&plugin)
        .args(["status", "llm", "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    let took = started.elapsed();
    let requests = apiserver.requests.load(std::sync::atomic::Ordering::SeqCst);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{requests} requests, gave up after {took:.1?}: {stderr}");
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("429") && stderr.contains("Too many requests"),
        "{stderr}"
    );
    // The first request and its 5 retries; kube's default would make 16.
    assert_eq!(requests, 6, "{stderr}");
    assert!(
        took >= std::time::Duration::from_secs(4),
        "Retry-After kept: {took:?}"
    );
    assert!(
        took < std::time::Duration::from_secs(45),
        "gave up after {took:?}"
    );
}
