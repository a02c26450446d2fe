//! The one error type of `rayshift-api`.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid --feature-gates: {0}")]
    FeatureGates(String),

    #[error("document {index}: {message}")]
    Document { index: usize, message: String },

    #[error("YAML: {0}")]
    Yaml(#[from] yaml_serde::Error),

    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),

    #[error("operator defaults: {0}")]
    Defaults(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
