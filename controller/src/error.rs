//! The one error type of `rayshift-controller`: typed variants, each naming what failed.

/// Why a Ray dashboard request failed.
#[derive(Debug, thiserror::Error)]
pub enum DashboardFailure {
    #[error("{0}")]
    Request(#[source] reqwest::Error),
    #[error("{status}: {body}")]
    Status {
        status: reqwest::StatusCode,
        body: String,
    },
    #[error("through the apiserver proxy: {0}")]
    Proxy(#[source] kube::Error),
    #[error("request: {0}")]
    Build(#[source] http::Error),
    #[error("unexpected Serve status JSON: {0}")]
    Json(#[source] serde_json::Error),
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
        matches!(self, Error::Kube(kube::Error::Api(s)) if s.is_conflict())
    }

    /// A short label for metrics (never the message itself).
    pub fn category(&self) -> &'static str {
        match self {
            e if e.is_conflict() => "conflict",
            Error::Kube(_) | Error::RayServiceCrdMissing(_) => "kubernetes",
            Error::Dashboard { .. } | Error::HttpClient(_) => "dashboard",
            Error::ServeConfig(_) | Error::ServeConfigNotAMapping | Error::UnknownServeConfig { .. } => {
                "serve_config"
            }
            Error::UnusableUpgradeOptions | Error::GatewayAttachment(_) | Error::LeaseTiming(_) => "invalid",
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
