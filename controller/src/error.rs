//! The one error type of `rayshift-controller`.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("Ray dashboard {url}: {message}")]
    Dashboard { url: String, message: String },
    #[error("serveConfigV2: {0}")]
    ServeConfig(String),
    #[error("{0}")]
    Invalid(String),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("not the leader: this replica no longer holds the leader Lease, so it writes nothing")]
    NotLeader,
}

impl Error {
    /// A short label for metrics (never the message itself).
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.is_conflict() => "conflict",
            Error::Kube(_) => "kubernetes",
            Error::Dashboard { .. } => "dashboard",
            Error::ServeConfig(_) => "serve_config",
            Error::Invalid(_) => "invalid",
            Error::Metrics(_) => "metrics",
            Error::NotLeader => "not_leader",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
