//! Arbitrary bytes and arbitrary JSON into the admission handlers: never a panic, never a 5xx.

use std::sync::Arc;

use axum::body::Body;
use http_body_util::BodyExt;
use proptest::{prelude::*, strategy::ValueTree};
use rayshift_webhook::{
    admission::{self, AdmissionConfig, Hook},
    metrics::Metrics,
    server::{self, ServerSettings},
    tls::CertStore,
};
use serde_json::{Value, json};
use tower::ServiceExt;

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "[a-zA-Z0-9:/ .\\-]{0,10}".prop_map(Value::String),
        Just(json!("RayService")),
        Just(json!("ray.io/v1")),
        Just(json!("CREATE")),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("spec".to_string()),
                    Just("metadata".to_string()),
                    Just("rayClusterConfig".to_string()),
                    Just("upgradeStrategy".to_string()),
                    "[a-zA-Z]{1,8}"
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn review_around(object: Value, operation: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u", "operation": operation, "userInfo": {},
            "kind": {"group": "ray.io", "version": "v1", "kind": "RayService"},
            "resource": {"group": "ray.io", "version": "v1", "resource": "rayservices"},
            "object": object, "oldObject": null
        }
    })
}

fn config() -> AdmissionConfig {
    AdmissionConfig::default()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..512)) {
        for hook in [Hook::Validate, Hook::Mutate] {
            let _ = admission::review(hook, &body, &config());
        }
    }

    #[test]
    fn arbitrary_json(doc in json_value()) {
        let bytes = serde_json::to_vec(&doc).unwrap();
        for hook in [Hook::Validate, Hook::Mutate] {
            let _ = admission::review(hook, &bytes, &config());
        }
    }

    #[test]
    fn arbitrary_objects_in_well_formed_reviews(object in json_value(), op in prop_oneof![Just("CREATE"), Just("UPDATE"), Just("DELETE")]) {
        let mut object = object;
        if let Value::Object(m) = &mut object {
            m.insert("apiVersion".into(), json!("ray.io/v1"));
            m.insert("kind".into(), json!("RayService"));
        }
        let bytes = serde_json::to_vec(&review_around(object, op)).unwrap();
        for hook in [Hook::Validate, Hook::Mutate] {
            match admission::review(hook, &bytes, &config()) {
                Ok((resp, _)) => prop_assert_eq!(&resp["response"]["uid"], "u"),
                Err(rayshift_webhook::Error::BadRequest(why)) => prop_assert!(!why.to_string().is_empty()),
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
    }
}

/// The same through the HTTP router: every answer is 200 or 4xx.
#[tokio::test]
async fn router_never_answers_5xx() {
    let registry = prometheus::Registry::new();
    let metrics = Metrics::register(&registry).unwrap();
    let certs = CertStore::new("/nonexistent/tls.crt", "/nonexistent/tls.key");
    let settings = ServerSettings {
        max_body_bytes: 4096,
        ..ServerSettings::default()
    };
    let router = server::router(Arc::new(config()), metrics, certs, &settings);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    });
    let strategy = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..6000),
        json_value().prop_map(|v| serde_json::to_vec(&review_around(v, "CREATE")).unwrap()),
    ];
    for _ in 0..256 {
        let body = strategy.new_tree(&mut runner).unwrap().current();
        for path in [server::VALIDATE_PATH, server::MUTATE_PATH] {
            let req = http::Request::post(path).body(Body::from(body.clone())).unwrap();
            let resp = router.clone().oneshot(req).await.unwrap();
            let code = resp.status().as_u16();
            let text = resp.into_body().collect().await.unwrap().to_bytes();
            assert!(
                code == 200 || (400..500).contains(&code),
                "{code}: {}",
                String::from_utf8_lossy(&text)
            );
            assert!(!text.is_empty());
        }
    }
    // Not ready without a certificate.
    let req = http::Request::get("/readyz").body(Body::empty()).unwrap();
    assert_eq!(router.oneshot(req).await.unwrap().status().as_u16(), 503);
}
