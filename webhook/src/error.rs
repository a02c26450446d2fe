//! The one error type of `rayshift-webhook`.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The body is not a RayService AdmissionReview: answered with HTTP 400.
    #[error("{0}")]
    BadRequest(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("certificates: {0}")]
    Certs(String),
    #[error("{0}")]
    Io(String),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("internal: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
