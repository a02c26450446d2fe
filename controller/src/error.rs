//! The one error type of `rayshift-controller`: typed variants, each naming what failed.

/// Why a Ray dashboard request failed.
#[derive(Debug, thiserror::Error)]
pub enum DashboardFailure {
    #[error("sending: {0}")]
    Send(#[source] Box<hyper_util::client::legacy::Error>),
    #[error("reading the answer: {0}")]
    Read(#[source] hyper::Error),
    #[error("not a URL: {0}")]
    Url(#[source] http::uri::InvalidUri),
    #[error("{status}: {body}")]
    Status {
        status: reqwest::StatusCode,
        body: String,
    },
    #[error("through the apiserver proxy: {0}")]
    Proxy(#[source] kube::Error),
    #[error("request: {0}")]
    Build(#[source] http::Error),
    #[error("no answer within {0:?}")]
    TimedOut(std::time::Duration),
    #[error("unexpected Serve status JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("reading the auth token Secret {namespace}/{secret} (authOptions.mode is token): {source}")]
    TokenSecret {
        namespace: String,
        secret: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "the auth token Secret {namespace}/{secret} (authOptions.mode is token) does not exist or has no key auth_token"
    )]
    TokenMissing { namespace: String, secret: String },
    /// A 401 or 403, with the token that was sent, so a person reading the Event knows which Secret to look at.
    #[error("{status}: {body} ({})", match secret {
        Some(secret) => format!("sent the token of Secret {namespace}/{secret}, authOptions.mode is token"),
        None => "sent no token: the RayCluster's authOptions.mode is not token".to_string(),
    })]
    Unauthorized {
        status: reqwest::StatusCode,
        body: String,
        namespace: String,
        secret: Option<String>,
    },
}

impl DashboardFailure {
    /// Ray refused the request's token (401: none, 403: another one), as token auth answers.
    pub fn is_unauthorized(&self) -> bool {
        match self {
            DashboardFailure::Status { status, .. } => matches!(status.as_u16(), 401 | 403),
            DashboardFailure::Unauthorized { .. } => true,
            _ => false,
        }
    }

    /// A 401 or 403 to a call with a token, and a 401 to one without, name the token (`Unauthorized`). A 403 to
    /// a call without one is not Ray's token auth (which answers 401 then) but, say, RBAC through the apiserver's
    /// proxy: left as it is, as is anything else.
    pub fn naming_token(self, namespace: &str, secret: Option<&str>) -> Self {
        match self {
            DashboardFailure::Status { status, body }
                if status.as_u16() == 401 || (status.as_u16() == 403 && secret.is_some()) =>
            {
                DashboardFailure::Unauthorized {
                    status,
                    body,
                    namespace: namespace.to_string(),
                    secret: secret.map(str::to_string),
                }
            }
            other => other,
        }
    }

    /// Asked the same way, it is refused the same way until someone changes something: Ray refused the config
    /// (400: Ray 2.60 answers that only to a config its schema or its Serve controller rejects) or the token
    /// (401, 403; through the apiserver's proxy also RBAC's 403), or RBAC refused the token Secret's read, or the
    /// Secret has no token. Not a dashboard starting, failing or slow, which clear by themselves.
    pub fn is_refusal(&self) -> bool {
        match self {
            DashboardFailure::Status { status, .. } => matches!(status.as_u16(), 400 | 401 | 403),
            DashboardFailure::TokenSecret {
                source: kube::Error::Api(s),
                ..
            } => matches!(s.code, 401 | 403),
            DashboardFailure::TokenMissing { .. } | DashboardFailure::Unauthorized { .. } => true,
            _ => false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cannot list RayServices (is the ray.io/v1 RayService CRD installed?): {0}")]
    RayServiceCrdMissing(#[source] kube::Error),
    #[error("Ray dashboard {url}: {failure}")]
    Dashboard {
        url: String,
        #[source]
        failure: Box<DashboardFailure>,
    },
    #[error("Ray dashboard HTTP client: {0}")]
    HttpClient(#[source] reqwest::Error),
    #[error("the system's root certificates, for dashboards over HTTPS: none of {unreadable} could be read")]
    TlsRootsUnreadable { unreadable: usize },
    #[error("TLS for dashboards over HTTPS: {0}")]
    Tls(#[source] rustls::Error),
    #[error("serveConfigV2: {0}")]
    ServeConfig(#[source] rayshift_api::Error),
    #[error("serveConfigV2 is not a mapping")]
    ServeConfigNotAMapping,
    #[error("clusterUpgradeOptions cannot make progress (admission denies such options)")]
    UnusableUpgradeOptions,
    #[error("the Serve config RayCluster {cluster} runs is unknown (no rayshift.io/serve-config annotation)")]
    UnknownServeConfig { cluster: String },
    #[error("gateway annotations: {0} (admission denies these)")]
    GatewayAttachment(rayshift_api::validation::FieldError),
    #[error("the HTTPRoute {route} named by rayshift.io/http-route does not exist")]
    AdoptedRouteMissing { route: String },
    #[error("the HTTPRoute {route} has no rule {}", rule.as_deref().unwrap_or("(it has no rules)"))]
    AdoptedRuleMissing { route: String, rule: Option<String> },
    #[error("the HTTPRoute {route} changed between the read and the patch of its backendRefs: read again")]
    RouteChanged { route: String },
    #[error(
        "no Serve port: name a port of the Ray head container 'serve' (or 'serve-*', e.g. 'serve-grpc'), or give \
         spec.serveService ports; without one the Kubernetes Service for Ray Serve cannot be created"
    )]
    NoServePort,
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error(
        "leader election: the retry period ({:?}) must be shorter than the renew deadline ({:?}), and that shorter than the lease duration ({:?})",
        .0.retry, .0.renew_deadline, .0.lease_duration
    )]
    LeaseTiming(crate::leader::LeaseTiming),
    #[error("not the leader: this replica no longer holds the leader Lease, so it writes nothing")]
    NotLeader,
    #[error("the {0} cache stopped: its watch is gone")]
    CacheClosed(&'static str),
    #[error("the RayCluster cache lags behind the apiserver: the pass is retried before anything is created")]
    CacheBehind,
    #[error("the pass panicked: retried")]
    PassPanicked,
    #[error("the pass did not finish within {after:?}, last waiting on {waiting}: abandoned and retried")]
    PassTimedOut {
        after: std::time::Duration,
        waiting: crate::waiting::Waiting,
    },
}

impl Error {
    /// Someone else wrote the object since this pass read it.
    pub fn is_conflict(&self) -> bool {
        match self {
            Error::Kube(kube::Error::Api(s)) => s.is_conflict(),
            Error::RouteChanged { .. } => true,
            _ => false,
        }
    }

    /// A JSON patch of `route` that failed to apply (its `test` of the resourceVersion or rule name failed):
    /// the apiserver answers 422 with no field causes, where a validation failure names its fields.
    pub fn from_route_patch(error: kube::Error, route: &str) -> Self {
        match &error {
            kube::Error::Api(s)
                if s.code == 422 && s.details.as_ref().is_none_or(|d| d.causes.is_empty()) =>
            {
                Error::RouteChanged {
                    route: route.to_string(),
                }
            }
            _ => Error::Kube(error),
        }
    }

    /// Whether the same pass would fail the same way until someone changes something: the apiserver refused
    /// the request on its merits (denied by admission or RBAC, invalid), or the spec is one rayshift cannot act
    /// on. Not a conflict, a timeout or throttling, nor a 404: an object deleted under a pass is gone from the
    /// next one's reads.
    pub fn is_persistent(&self) -> bool {
        match self {
            Error::Kube(kube::Error::Api(s)) => {
                (400..500).contains(&s.code) && !matches!(s.code, 404 | 408 | 409 | 429)
            }
            Error::Dashboard { failure, .. } => failure.is_refusal(),
            Error::ServeConfig(_)
            | Error::ServeConfigNotAMapping
            | Error::UnusableUpgradeOptions
            | Error::NoServePort
            | Error::GatewayAttachment(_) => true,
            _ => false,
        }
    }

    /// Whether a person should see it on the RayService (a Warning Event): failures that persist, and passes
    /// that hung or panicked. Transient failures clear by themselves; they are logged and counted.
    /// A refused Serve config has its own Event (`FailedToUpdateServeApplications`, as KubeRay's).
    pub fn is_worth_an_event(&self) -> bool {
        match self {
            Error::Dashboard { .. } => false,
            Error::PassTimedOut { .. } | Error::PassPanicked => true,
            _ => self.is_persistent(),
        }
    }

    /// A short label for metrics (never the message itself).
    pub fn category(&self) -> &'static str {
        match self {
            Error::RouteChanged { .. } => "conflict",
            e if e.is_conflict() => "conflict",
            Error::Kube(_) | Error::RayServiceCrdMissing(_) => "kubernetes",
            Error::Dashboard { .. }
            | Error::HttpClient(_)
            | Error::TlsRootsUnreadable { .. }
            | Error::Tls(_) => "dashboard",
            Error::ServeConfig(_) | Error::ServeConfigNotAMapping | Error::UnknownServeConfig { .. } => {
                "serve_config"
            }
            Error::UnusableUpgradeOptions
            | Error::NoServePort
            | Error::GatewayAttachment(_)
            | Error::LeaseTiming(_) => "invalid",
            Error::AdoptedRouteMissing { .. } | Error::AdoptedRuleMissing { .. } => "gateway",
            Error::Metrics(_) => "metrics",
            Error::NotLeader => "not_leader",
            Error::CacheClosed(_) | Error::CacheBehind => "cache",
            Error::PassTimedOut { .. } => "timeout",
            Error::PassPanicked => "panic",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> Error {
        let status = kube::core::Status {
            code,
            ..kube::core::Status::failure("denied", "Invalid")
        };
        Error::Kube(kube::Error::Api(status.boxed()))
    }

    #[test]
    fn refusals_persist_and_hiccups_do_not() {
        for code in [400, 401, 403, 422] {
            assert!(api(code).is_persistent(), "{code}");
            assert!(api(code).is_worth_an_event(), "{code}");
        }
        for code in [404, 408, 409, 429, 500, 503] {
            assert!(!api(code).is_persistent(), "{code}");
            assert!(!api(code).is_worth_an_event(), "{code}");
        }
        assert!(Error::ServeConfigNotAMapping.is_persistent());
        assert!(!Error::CacheBehind.is_persistent());
        assert!(!Error::CacheBehind.is_worth_an_event());
        // kube-apiserver 1.37's answer to a JSON patch whose `test` failed, as it came.
        let failed_test: kube::core::Status = serde_json::from_str(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server rejected our request due to an error in our request","reason":"Invalid","details":{},"code":422}"#,
        )
        .unwrap();
        let changed = Error::from_route_patch(kube::Error::Api(failed_test.boxed()), "llm");
        assert!(changed.is_conflict() && !changed.is_persistent(), "{changed}");
        let invalid: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "reason": "Invalid", "code": 422,
            "message": "HTTPRoute.gateway.networking.k8s.io \"llm\" is invalid: spec.rules[0]: Invalid value",
            "details": {"causes": [{"reason": "FieldValueInvalid", "field": "spec.rules[0]"}]}
        }))
        .unwrap();
        let invalid = Error::from_route_patch(kube::Error::Api(invalid.boxed()), "llm");
        assert!(invalid.is_persistent(), "{invalid}");
        let dashboard = |status: u16| Error::Dashboard {
            url: "http://llm-head-svc:8265/api/serve/applications/".into(),
            failure: Box::new(DashboardFailure::Status {
                status: reqwest::StatusCode::from_u16(status).unwrap(),
                body: "ValidationError".into(),
            }),
        };
        for refused in [400, 401, 403] {
            assert!(dashboard(refused).is_persistent() && !dashboard(refused).is_worth_an_event());
        }
        for passing in [404, 500, 503] {
            assert!(!dashboard(passing).is_persistent(), "{passing}");
        }
        let secret = |code: u16| DashboardFailure::TokenSecret {
            namespace: "ml".into(),
            secret: "llm-abcde".into(),
            source: kube::Error::Api(
                kube::core::Status {
                    code,
                    ..kube::core::Status::failure("secrets is forbidden", "Forbidden")
                }
                .boxed(),
            ),
        };
        assert!(secret(403).is_refusal() && !secret(503).is_refusal() && !secret(429).is_refusal());
        let missing = DashboardFailure::TokenMissing {
            namespace: "ml".into(),
            secret: "llm-abcde".into(),
        };
        assert!(missing.is_refusal());
        let refused = |code: u16, secret: Option<&str>| {
            DashboardFailure::Status {
                status: reqwest::StatusCode::from_u16(code).unwrap(),
                body: match code {
                    401 => "Unauthorized: Missing authentication token".into(),
                    _ => "Forbidden: Invalid authentication token".into(),
                },
            }
            .naming_token("ml", secret)
        };
        let named = refused(403, Some("llm-abcde"));
        assert!(named.is_refusal() && named.is_unauthorized());
        assert_eq!(
            named.to_string(),
            "403 Forbidden: Forbidden: Invalid authentication token (sent the token of Secret ml/llm-abcde, \
             authOptions.mode is token)"
        );
        assert!(
            refused(401, None)
                .to_string()
                .ends_with("(sent no token: the RayCluster's authOptions.mode is not token)")
        );
        // Not Ray's token auth: RBAC's 403 through the apiserver's proxy, to a call without a token.
        assert!(matches!(refused(403, None), DashboardFailure::Status { .. }));
        let unavailable = DashboardFailure::Status {
            status: reqwest::StatusCode::SERVICE_UNAVAILABLE,
            body: "dashboard down".into(),
        };
        assert!(matches!(
            unavailable.naming_token("ml", None),
            DashboardFailure::Status { .. }
        ));
        assert!(!DashboardFailure::TimedOut(std::time::Duration::from_secs(2)).is_refusal());
        // A hung pass is retried soon, but a person should know it hung.
        assert!(!Error::PassPanicked.is_persistent());
        assert!(Error::PassPanicked.is_worth_an_event());
    }
}
