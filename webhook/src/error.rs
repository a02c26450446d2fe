//! The one error type of `rayshift-webhook`, with typed causes: what went wrong is in the variant, and the
//! message is built only when shown.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use rayshift_api::documents::NotARayService;

use crate::admission::ADMISSION_V1;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The body is not a RayService AdmissionReview: answered with HTTP 400.
    #[error(transparent)]
    BadRequest(#[from] BadRequest),
    #[error("cannot read {}: {source}", path.display())]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error("cannot create {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error("cannot write {}: {source}", path.display())]
    WriteFile { path: PathBuf, source: std::io::Error },
    #[error("TLS: protocol versions: {0}")]
    TlsProtocolVersions(#[source] rustls::Error),
    #[error("TLS: certificate PEM: {0}")]
    CertificatePem(#[source] rustls_pki_types::pem::Error),
    #[error("TLS: certificate file holds no certificate")]
    NoCertificate,
    #[error("TLS: certificate: {0}")]
    Certificate(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
    #[error("TLS: private key PEM: {0}")]
    PrivateKeyPem(#[source] rustls_pki_types::pem::Error),
    #[error("TLS: certificate and key do not match: {0}")]
    KeyMismatch(#[source] rustls::Error),
    #[error("certificates: {0}")]
    GenerateCertificate(#[from] rcgen::Error),
    #[error("certificates: cannot encode a manifest: {0}")]
    EncodeManifest(#[source] serde_json::Error),
    #[error("certificates: cannot write a manifest as YAML: {0}")]
    ManifestYaml(#[from] yaml_serde::Error),
    #[error("cannot listen on {addr} for {what}: {source}")]
    Listen {
        addr: SocketAddr,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("cannot read the listener's address: {0}")]
    LocalAddr(#[source] std::io::Error),
    #[error("admin server: {0}")]
    AdminServer(#[source] std::io::Error),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("internal: cannot encode patch: {0}")]
    EncodePatch(#[source] kube::core::admission::SerializePatchError),
    #[error("internal: cannot encode AdmissionReview: {0}")]
    EncodeReview(#[source] serde_json::Error),
}

/// Why a body is not a usable RayService AdmissionReview.
#[derive(Debug, thiserror::Error)]
pub enum BadRequest {
    #[error("request body is not valid JSON: not UTF-8 ({0})")]
    NotUtf8(#[source] std::str::Utf8Error),
    #[error("request body is not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("expected an {ADMISSION_V1} AdmissionReview object: {0}")]
    NotAReviewObject(#[source] serde_json::Error),
    #[error("expected an {ADMISSION_V1} AdmissionReview, got apiVersion {api_version:?} kind {kind:?}")]
    NotAV1Review {
        api_version: Option<String>,
        kind: Option<String>,
    },
    #[error("AdmissionReview has no request")]
    NoRequest,
    #[error("AdmissionReview request is malformed: {0}")]
    MalformedRequest(#[source] serde_json::Error),
    /// The request decodes alone but not inside its review (a duplicate field, say).
    #[error("AdmissionReview request is malformed")]
    MalformedReview,
    #[error("this webhook admits ray.io RayServices, got {group}/{version} {kind}")]
    NotRayServices {
        group: String,
        version: String,
        kind: String,
    },
    #[error("{operation} request has no object")]
    NoObject { operation: &'static str },
    #[error("request object is not a Kubernetes object: {0}")]
    ObjectNotKubernetes(#[source] serde_json::Error),
    #[error("request object is {0}")]
    ObjectNotARayService(#[source] NotARayService),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// For `map_err` on a read of `path`.
    pub(crate) fn read_file(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |source| Error::ReadFile {
            path: path.to_path_buf(),
            source,
        }
    }
}
