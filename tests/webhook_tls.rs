//! The real webhook server on a loopback port, certificates from `rayshift certs generate`, a real TLS
//! client: verdicts, warnings, patches, malformed input, size caps, TLS versions, hot reload, metrics.

mod support;

use std::{
    io::{Read, Write},
    net::TcpStream,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use base64::Engine;
use rayshift_api::documents;
use serde_json::{Value, json};
use support::{
    signal::{self, Sig},
    webhook::{WebhookProcess, admission_review, generate_certs, metric},
};

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/validate/{name}.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    documents::parse_stream(&std::fs::read_to_string(path).unwrap())
        .unwrap()
        .remove(0)
}

fn client(ca_pem: &[u8]) -> reqwest::Client {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

struct Setup {
    _dir: tempfile::TempDir,
    webhook: WebhookProcess,
    client: reqwest::Client,
}

fn setup(extra: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    generate_certs(dir.path(), false);
    let webhook = WebhookProcess::start(dir.path(), extra);
    let client = client(&webhook.ca_pem());
    Setup {
        _dir: dir,
        webhook,
        client,
    }
}

impl Setup {
    async fn post(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, String) {
        let resp = self
            .client
            .post(self.webhook.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request");
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    async fn review(&self, path: &str, review: &Value) -> Value {
        let (code, body) = self.post(path, serde_json::to_vec(review).unwrap()).await;
        assert_eq!(code, 200, "{body}");
        let out: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(out["kind"], "AdmissionReview");
        assert_eq!(out["response"]["uid"], review["request"]["uid"], "uid is echoed");
        out["response"].clone()
    }
}

const VALIDATE: &str = "/validate-ray-io-v1-rayservice";
const MUTATE: &str = "/mutate-ray-io-v1-rayservice";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_warnings_and_patches_over_tls() {
    let s = setup(&[]);

    let allowed = s
        .review(
            VALIDATE,
            &admission_review("CREATE", Some(&fixture("allowed-incremental")), None),
        )
        .await;
    assert_eq!(allowed["allowed"], true);
    assert!(allowed.get("warnings").is_none());

    // Every rule fixture denied by the CLI is denied by the webhook with the same fields.
    for name in [
        "step-size-range",
        "many-errors",
        "feature-gate-off",
        "rc-head-containers",
        "serve-config-yaml",
    ] {
        let obj = fixture(name);
        let resp = s
            .review(VALIDATE, &admission_review("CREATE", Some(&obj), None))
            .await;
        let status = &resp["status"];
        if name == "feature-gate-off" {
            // This server runs with the gate on: the same object is allowed.
            assert_eq!(resp["allowed"], true, "{name}: {resp}");
            continue;
        }
        assert_eq!(resp["allowed"], false, "{name}");
        assert_eq!(status["code"], 422);
        assert_eq!(status["reason"], "Invalid");
        let message = status["message"].as_str().unwrap();
        let prefix = format!(
            "RayService.ray.io {:?} is invalid: ",
            obj["metadata"]["name"].as_str().unwrap()
        );
        assert!(message.starts_with(&prefix), "{message}");
        let causes = status["details"]["causes"].as_array().unwrap();
        assert!(!causes.is_empty());
        for cause in causes {
            let field = cause["field"].as_str().unwrap();
            assert!(
                message.contains(&format!("{field}: ")),
                "{name}: {field} missing from {message}"
            );
        }
    }
    let many = s
        .review(
            VALIDATE,
            &admission_review("CREATE", Some(&fixture("many-errors")), None),
        )
        .await;
    assert!(
        many["status"]["details"]["causes"].as_array().unwrap().len() >= 4,
        "all rules, not the first"
    );

    let warned = s
        .review(
            VALIDATE,
            &admission_review("CREATE", Some(&fixture("warn-interval-short")), None),
        )
        .await;
    assert_eq!(warned["allowed"], true);
    let warnings = warned["warnings"].as_array().unwrap();
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .contains("intervalSeconds 10 is under 30"),
        "{warnings:?}"
    );

    // UPDATE that breaks a rule is denied; managedBy is immutable once set.
    let mut old = fixture("allowed-incremental");
    old["spec"]["managedBy"] = json!("rayshift.io/controller");
    let mut new = old.clone();
    new["spec"]["managedBy"] = json!("ray.io/kuberay-operator");
    let resp = s
        .review(VALIDATE, &admission_review("UPDATE", Some(&new), Some(&old)))
        .await;
    assert_eq!(resp["allowed"], false);
    assert!(
        resp["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.managedBy")
    );

    // Options changed while a pending cluster exists: allowed with a warning.
    let mut old = fixture("allowed-incremental");
    old["status"] = json!({"pendingServiceStatus": {"rayClusterName": "llm-xyz12"}});
    let mut new = old.clone();
    new["spec"]["upgradeStrategy"]["clusterUpgradeOptions"]["intervalSeconds"] = json!(120);
    let resp = s
        .review(VALIDATE, &admission_review("UPDATE", Some(&new), Some(&old)))
        .await;
    assert_eq!(resp["allowed"], true);
    assert!(
        resp["warnings"][0]
            .as_str()
            .unwrap()
            .contains("upgrade is in progress"),
        "{resp}"
    );

    // DELETE and CONNECT are allowed without looking at the object.
    let del = s
        .review(
            VALIDATE,
            &admission_review("DELETE", None, Some(&fixture("many-errors"))),
        )
        .await;
    assert_eq!(del["allowed"], true);
    let connect = s.review(VALIDATE, &admission_review("CONNECT", None, None)).await;
    assert_eq!(connect["allowed"], true);

    // Mutation: a base64 JSONPatch that, applied, gives maxSurgePercent 100; none when nothing changes.
    let obj = fixture("max-surge-defaulted");
    let resp = s
        .review(MUTATE, &admission_review("CREATE", Some(&obj), None))
        .await;
    assert_eq!(resp["allowed"], true);
    assert_eq!(resp["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch_ops::Patch = serde_json::from_slice(&bytes).unwrap();
    let mut patched = obj.clone();
    json_patch_ops::apply(&mut patched, &patch);
    assert_eq!(
        patched["spec"]["upgradeStrategy"]["clusterUpgradeOptions"]["maxSurgePercent"],
        100
    );
    let mut expected = obj.clone();
    expected["spec"]["upgradeStrategy"]["clusterUpgradeOptions"]["maxSurgePercent"] = json!(100);
    assert_eq!(patched, expected, "the patch changes nothing else");
    let again = s
        .review(MUTATE, &admission_review("CREATE", Some(&patched), None))
        .await;
    assert!(
        again.get("patch").is_none() && again.get("patchType").is_none(),
        "no patch when nothing changes"
    );
    // Dry-run requests are answered the same way.
    let mut dry = admission_review("CREATE", Some(&obj), None);
    dry["request"]["dryRun"] = json!(true);
    assert_eq!(s.review(MUTATE, &dry).await["patch"], resp["patch"]);

    let metrics = s.webhook.metrics();
    assert!(
        metric(
            &metrics,
            r#"rayshift_admission_requests_total{operation="CREATE",verdict="denied",webhook="validate"}"#
        ) >= 4.0,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            r#"rayshift_admission_requests_total{operation="DELETE",verdict="allowed",webhook="validate"}"#
        ) >= 1.0
    );
    assert!(
        metric(
            &metrics,
            r#"rayshift_admission_denials_total{rule="step-size-range"}"#
        ) >= 2.0,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            r#"rayshift_admission_denials_total{rule="managed-by-immutable"}"#
        ) >= 1.0
    );
    assert!(
        metric(
            &metrics,
            r#"rayshift_admission_warnings_total{rule="interval-short"}"#
        ) >= 1.0
    );
    assert!(metric(&metrics, "rayshift_admission_patches_total") >= 2.0);
    assert!(
        metric(
            &metrics,
            r#"rayshift_admission_request_duration_seconds_count{webhook="mutate"}"#
        ) >= 3.0
    );
    assert!(metric(&metrics, "rayshift_webhook_certificate_expiry_timestamp_seconds") > 1.7e9);
}

/// Minimal RFC 6902 apply for the ops the webhook emits, independent of the code under test.
mod json_patch_ops {
    use serde_json::Value;

    pub type Patch = Vec<Value>;

    pub fn apply(doc: &mut Value, patch: &Patch) {
        for op in patch {
            assert_eq!(op["op"], "add", "defaulting only adds");
            let path = op["path"].as_str().unwrap();
            let (parent, key) = path.rsplit_once('/').unwrap();
            doc.pointer_mut(parent)
                .unwrap()
                .as_object_mut()
                .unwrap()
                .insert(key.to_string(), op["value"].clone());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_4xx_with_a_message() {
    let s = setup(&["--max-body-bytes", "65536"]);
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{not json".to_vec(), 400, "not valid JSON"),
        (
            b"[]".to_vec(),
            400,
            "expected an admission.k8s.io/v1 AdmissionReview",
        ),
        (
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            400,
            "has no request",
        ),
        (
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}"#.to_vec(),
            400,
            "expected an admission.k8s.io/v1",
        ),
        (
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x"}}"#
                .to_vec(),
            400,
            "malformed",
        ),
        (vec![0xff, 0xfe, 0x00], 400, "not valid JSON"),
    ];
    for (body, code, text) in cases {
        let (got, msg) = s.post(VALIDATE, body.clone()).await;
        assert_eq!(got, code, "{msg}");
        assert!(msg.contains(text), "{text:?} not in {msg:?}");
    }
    // Wrong kind of object.
    let mut review = admission_review(
        "CREATE",
        Some(&json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})),
        None,
    );
    let (code, msg) = s.post(VALIDATE, serde_json::to_vec(&review).unwrap()).await;
    assert_eq!(code, 400);
    assert!(msg.contains("not a ray.io/v1 RayService"), "{msg}");
    let (code, msg) = s.post(MUTATE, serde_json::to_vec(&review).unwrap()).await;
    assert_eq!(code, 400);
    assert!(msg.contains("not a ray.io/v1 RayService"), "{msg}");
    // A body that decodes as a RayService but says it is another version is refused all the same.
    let mut other_version = fixture("allowed-incremental");
    other_version["apiVersion"] = json!("ray.io/v1alpha1");
    let wrong = admission_review("CREATE", Some(&other_version), None);
    let (code, msg) = s.post(VALIDATE, serde_json::to_vec(&wrong).unwrap()).await;
    assert_eq!(code, 400, "{msg}");
    assert!(
        msg.contains("a ray.io/v1alpha1 RayService, not a ray.io/v1 RayService"),
        "{msg}"
    );
    review["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
    let (code, msg) = s.post(MUTATE, serde_json::to_vec(&review).unwrap()).await;
    assert_eq!(code, 400);
    assert!(msg.contains("admits ray.io RayServices"), "{msg}");
    // A CREATE without an object.
    let (code, msg) = s
        .post(
            VALIDATE,
            serde_json::to_vec(&admission_review("CREATE", None, None)).unwrap(),
        )
        .await;
    assert_eq!((code, msg.contains("has no object")), (400, true), "{msg}");
    // Over the body cap: 413 with a message, and the server keeps serving.
    let mut big = admission_review("CREATE", Some(&fixture("allowed-incremental")), None);
    big["request"]["object"]["metadata"]["annotations"] = json!({"padding": "x".repeat(100_000)});
    let (code, msg) = s.post(VALIDATE, serde_json::to_vec(&big).unwrap()).await;
    assert_eq!(code, 413, "{msg}");
    assert!(msg.contains("length limit"), "{msg}");
    // Unknown path and wrong method.
    let resp = s.client.get(s.webhook.url(VALIDATE)).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 405);
    let resp = s
        .client
        .post(s.webhook.url("/nope"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    let ok = s
        .review(
            VALIDATE,
            &admission_review("CREATE", Some(&fixture("allowed-incremental")), None),
        )
        .await;
    assert_eq!(ok["allowed"], true, "still serving after bad input");
    let metrics = s.webhook.metrics();
    assert!(
        metric(&metrics, r#"rayshift_admission_bad_requests_total{code="400"}"#) >= 11.0,
        "{metrics}"
    );
    assert!(
        metric(&metrics, r#"rayshift_admission_bad_requests_total{code="413"}"#) >= 1.0,
        "{metrics}"
    );
}

/// A hand-built ClientHello offering only `version` (0x0301 = TLS 1.0, 0x0302 = TLS 1.1).
fn legacy_client_hello(version: [u8; 2]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&version);
    body.extend_from_slice(&[7u8; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&[0, 4, 0xc0, 0x13, 0x00, 0x2f]); // two CBC suites of that era
    body.extend_from_slice(&[1, 0]); // null compression
    let mut hs = vec![1, 0, 0, body.len() as u8];
    hs.extend_from_slice(&body);
    let mut record = vec![0x16, version[0], version[1], 0, hs.len() as u8];
    record.extend_from_slice(&hs);
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_0_and_1_1_are_refused() {
    let s = setup(&[]);
    for version in [[3, 1], [3, 2]] {
        let mut stream = TcpStream::connect(s.webhook.addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.write_all(&legacy_client_hello(version)).unwrap();
        let mut reply = Vec::new();
        let _ = stream.read_to_end(&mut reply);
        assert!(!reply.is_empty(), "server answers with an alert");
        assert_eq!(reply[0], 0x15, "an alert record, not a ServerHello: {reply:?}");
        // A fatal alert: protocol_version (70) or handshake_failure (40, no version in common).
        assert_eq!(reply.get(5), Some(&2), "fatal alert for {version:?}: {reply:?}");
        assert!(
            matches!(reply.get(6), Some(70 | 40)),
            "refusal alert for {version:?}: {reply:?}"
        );
    }
    // TLS 1.2 and 1.3 both work.
    for tls12 in [true, false] {
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&s.webhook.ca_pem()).unwrap());
        builder = if tls12 {
            builder.max_tls_version(reqwest::tls::Version::TLS_1_2)
        } else {
            builder.min_tls_version(reqwest::tls::Version::TLS_1_3)
        };
        let resp = builder
            .build()
            .unwrap()
            .get(s.webhook.url("/healthz"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
    }
    let metrics = s.webhook.metrics();
    assert!(
        metric(&metrics, "rayshift_webhook_tls_handshake_errors_total") >= 2.0,
        "{metrics}"
    );
}

/// The DER of the certificate the server presents on a fresh connection.
async fn served_cert(addr: std::net::SocketAddr, ca_pem: &[u8]) -> Vec<u8> {
    use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn pem_der(path: &std::path::Path) -> Vec<u8> {
    use rustls_pki_types::{CertificateDer, pem::PemObject};
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_hot_reload_keeps_requests_succeeding() {
    let s = setup(&[]);
    let ca = s.webhook.ca_pem();
    let before = served_cert(s.webhook.addr, &ca).await;
    assert_eq!(before, pem_der(&s.webhook.dir.join("tls.crt")));

    // Steady traffic on kept-alive and fresh connections during the rotation.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let review = serde_json::to_vec(&admission_review(
        "CREATE",
        Some(&fixture("allowed-incremental")),
        None,
    ))
    .unwrap();
    let mut workers = Vec::new();
    for fresh in [false, true] {
        let (stop, ok, failed, review, url, ca) = (
            stop.clone(),
            ok.clone(),
            failed.clone(),
            review.clone(),
            s.webhook.url(VALIDATE),
            ca.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut c = client(&ca);
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) && n < 5000 {
                n += 1;
                if fresh {
                    c = client(&ca);
                }
                match c.post(&url).body(review.clone()).send().await {
                    Ok(r) if r.status().is_success() => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    generate_certs(&s.webhook.dir, true); // same CA, new key and certificate
    let want = pem_der(&s.webhook.dir.join("tls.crt"));
    assert_ne!(want, before);
    let mut rotated = false;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if served_cert(s.webhook.addr, &ca).await == want {
            rotated = true;
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    assert!(rotated, "the new certificate is served without a restart");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "no request failed during the rotation"
    );
    assert!(
        ok.load(Ordering::Relaxed) > 20,
        "traffic kept flowing: {}",
        ok.load(Ordering::Relaxed)
    );

    // A broken pair on disk keeps the current one serving.
    std::fs::write(s.webhook.dir.join("tls.key"), "not a key").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(served_cert(s.webhook.addr, &ca).await, want);
    let metrics = s.webhook.metrics();
    assert!(
        metric(
            &metrics,
            r#"rayshift_webhook_certificate_reloads_total{result="success"}"#
        ) >= 2.0,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            r#"rayshift_webhook_certificate_reloads_total{result="error"}"#
        ) >= 1.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests() {
    let mut s = setup(&[]);
    let body = serde_json::to_vec(&admission_review(
        "CREATE",
        Some(&fixture("allowed-incremental")),
        None,
    ))
    .unwrap();
    // Send the headers and half the body, then SIGTERM, then the rest: the request still completes.
    let ca = s.webhook.ca_pem();
    let addr = s.webhook.addr;
    let (half, rest) = body.split_at(body.len() / 2);
    let (half, rest) = (half.to_vec(), rest.to_vec());
    let pid = s.webhook.child.id();
    let request = tokio::spawn(async move {
        use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&ca) {
            roots.add(cert.unwrap()).unwrap();
        }
        let config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
            .await
            .unwrap();
        let head = format!(
            "POST {VALIDATE} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            half.len() + rest.len()
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.write_all(&half).await.unwrap();
        tls.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(signal::process(pid, Sig::TERM));
        tokio::time::sleep(Duration::from_millis(300)).await;
        tls.write_all(&rest).await.unwrap();
        tls.flush().await.unwrap();
        let mut reply = vec![0u8; 4096];
        let n = tls.read(&mut reply).await.unwrap();
        String::from_utf8_lossy(&reply[..n]).to_string()
    });
    let reply = request.await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"allowed\":true"), "{reply}");
    let status = tokio::task::spawn_blocking(move || s.webhook.child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "graceful exit after draining: {status:?}");
    // No new connections are accepted after shutdown.
    assert!(TcpStream::connect(addr).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_time_out_with_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = setup(&["--request-timeout-seconds", "1"]);
    let ca = s.webhook.ca_pem();
    let connector = {
        use rustls_pki_types::{CertificateDer, pem::PemObject};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&ca) {
            roots.add(cert.unwrap()).unwrap();
        }
        let config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    };
    let tcp = tokio::net::TcpStream::connect(s.webhook.addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let head = format!(
        "POST {VALIDATE} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{{\"apiVersion\""
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    let started = std::time::Instant::now();
    let mut reply = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut reply))
        .await
        .expect("answered")
        .unwrap();
    let reply = String::from_utf8_lossy(&reply[..n]).to_string();
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(started.elapsed() < Duration::from_secs(3));
    let counted = metric(
        &s.webhook.metrics(),
        "rayshift_admission_bad_requests_total{code=\"408\"}",
    );
    assert_eq!(counted, 1.0, "the 408 is counted");
}

/// `# key: value` header of a rule fixture.
fn fixture_header(path: &std::path::Path, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let prefix = format!("# {key}: ");
    text.lines()
        .take_while(|l| l.starts_with('#'))
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
}

/// Every rule fixture, sent as the apiserver would (mutating first, then validating), gets over TLS the
/// verdict and fields the fixture states: one webhook per feature-gate set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_fixture_gets_its_verdict_over_tls() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/validate");
    let mut by_gates: std::collections::BTreeMap<String, Vec<std::path::PathBuf>> = Default::default();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let gates = fixture_header(&path, "gates").unwrap_or_default();
        by_gates.entry(gates).or_default().push(path);
    }
    let mut checked = 0;
    for (gates, files) in by_gates {
        let s = setup(&[&format!("--feature-gates={gates}")]);
        for path in files {
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let mut object = documents::parse_stream(&std::fs::read_to_string(&path).unwrap())
                .unwrap()
                .remove(0);
            let mutated = s
                .review(MUTATE, &admission_review("CREATE", Some(&object), None))
                .await;
            if let Some(patch) = mutated["patch"].as_str() {
                let bytes = base64::engine::general_purpose::STANDARD.decode(patch).unwrap();
                json_patch_ops::apply(&mut object, &serde_json::from_slice(&bytes).unwrap());
            }
            let resp = s
                .review(VALIDATE, &admission_review("CREATE", Some(&object), None))
                .await;
            let expect_allowed = fixture_header(&path, "expect").unwrap() == "allowed";
            assert_eq!(resp["allowed"], expect_allowed, "{name}: {resp}");
            if let Some(fields) = fixture_header(&path, "field") {
                let causes = resp["status"]["details"]["causes"].as_array().unwrap();
                for field in fields.split(',') {
                    assert!(
                        causes.iter().any(|c| c["field"] == field),
                        "{name}: no cause on {field}: {causes:?}"
                    );
                }
            }
            if let Some(warning) = fixture_header(&path, "warning") {
                let warnings = resp["warnings"].as_array().cloned().unwrap_or_default();
                assert!(
                    warnings.iter().any(|w| w.as_str().unwrap().contains(&warning)),
                    "{name}: {warnings:?}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 70, "{checked}");
}

/// `--log-format plain` to a pipe (as `kubectl logs` reads it) is text without terminal colour codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_logs_to_a_pipe_have_no_colour_codes() {
    let s = setup(&["--log-format", "plain"]);
    let logs = s.webhook.logs.lock().unwrap().join("\n");
    assert!(logs.contains("listening"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "escape codes in plain logs: {logs:?}");
}
