//! The one error type of `rayshift-api`, with typed causes (the values at fault, never a message).

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid --feature-gates: {0}")]
    FeatureGates(#[from] FeatureGateError),

    #[error("document {index}: {source}")]
    Document { index: usize, source: yaml_serde::Error },

    #[error("YAML: {0}")]
    Yaml(#[from] yaml_serde::Error),

    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),

    #[error("operator defaults: {0}")]
    Defaults(#[from] DefaultsError),
}

/// What is wrong with `--feature-gates` or `--kuberay-version` (worded as Kubernetes components word it).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FeatureGateError {
    #[error("unsupported KubeRay version {0}: use 1.5, 1.6 or 1.7")]
    KubeRayVersion(String),
    #[error("unrecognized feature gate: {0}")]
    Unrecognized(String),
    #[error("missing bool value for {0}")]
    MissingValue(String),
    #[error("invalid value of {name}: {value}, err: not a bool")]
    NotABool { name: String, value: String },
}

/// Operator defaults that no RayService could be admitted with.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DefaultsError {
    #[error("{field} must be between 1 and 100, got {value}")]
    PercentOutOfRange { field: &'static str, value: i32 },
    #[error("intervalSeconds must be greater than 0, got {0}")]
    IntervalNotPositive(i32),
    #[error("stepSizePercent must be <= maxSurgePercent")]
    StepAboveSurge,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
