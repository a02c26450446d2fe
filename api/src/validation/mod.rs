//! Admission rules for RayService, as pure functions.
//!
//! Every rule that fails is reported (never only the first), each with the field path and a stable rule
//! id (used as a metric label by the webhook). Warnings allow the object but tell the user something.

use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::{feature_gates::FeatureGates, rayservice::RAYSHIFT_MANAGER};

mod admitted;
pub(crate) mod names;
mod raycluster;
mod rayservice;
mod serve_config;
mod surge;

pub use admitted::{Admitted, decode_str};
pub use names::{
    is_dns1035_label, is_dns1123_label, is_dns1123_subdomain, label_value_errors, qualified_name_errors,
};
pub use rayservice::{StoredObject, decode, go_duration_seconds, review, validate};
pub use serve_config::{ServeConfigMemo, parse_serve_config};

/// What a violated rule says about its field, in the words `kubectl` users know.
#[derive(Clone, Debug, PartialEq)]
pub enum ErrorKind {
    /// `Invalid value: <value>: <message>`
    Invalid(Value),
    /// `Required value: <message>`
    Required,
    /// `Forbidden: <message>`
    Forbidden,
    /// `Unsupported value: <value>: supported values: ...`
    NotSupported(Value, Vec<&'static str>),
}

/// One violated rule.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    /// Path of the offending field, e.g. `spec.upgradeStrategy.clusterUpgradeOptions.stepSizePercent`.
    pub field: String,
    pub kind: ErrorKind,
    /// Human text without the field path.
    pub message: String,
    /// Stable identifier of the rule (metric label, docs anchor).
    pub rule: &'static str,
}

/// A rule that allows the object but has something to say.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Warning {
    pub field: String,
    pub message: String,
    #[serde(skip)]
    pub rule: &'static str,
}

/// The outcome of validating one object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verdict {
    pub errors: Vec<FieldError>,
    pub warnings: Vec<Warning>,
}

/// Operator-wide settings the rules depend on.
#[derive(Clone, Debug)]
pub struct ValidationConfig {
    pub feature_gates: FeatureGates,
    /// `spec.managedBy` values that are accepted (KubeRay's two plus rayshift's own).
    pub managed_by_values: Vec<String>,
    /// The controller's progress deadline when a RayService sets none (its `--progress-deadline`).
    pub progress_deadline_seconds: i64,
    /// serveConfigV2 texts already parsed (off unless turned on).
    pub serve_configs: ServeConfigMemo,
}

impl Default for ValidationConfig {
    fn default() -> Self {
        Self {
            feature_gates: FeatureGates::default(),
            managed_by_values: vec![
                crate::rayservice::KUBERAY_MANAGER.to_string(),
                crate::rayservice::MULTIKUEUE_MANAGER.to_string(),
                RAYSHIFT_MANAGER.to_string(),
            ],
            progress_deadline_seconds: crate::upgrade_control::DEFAULT_PROGRESS_DEADLINE_SECONDS,
            serve_configs: ServeConfigMemo::default(),
        }
    }
}

impl FieldError {
    pub fn invalid(
        field: impl Into<String>,
        value: impl Into<Value>,
        rule: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            field: field.into(),
            kind: ErrorKind::Invalid(value.into()),
            message: message.into(),
            rule,
        }
    }

    pub fn required(field: impl Into<String>, rule: &'static str, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: ErrorKind::Required,
            message: message.into(),
            rule,
        }
    }

    pub fn forbidden(field: impl Into<String>, rule: &'static str, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: ErrorKind::Forbidden,
            message: message.into(),
            rule,
        }
    }

    pub fn not_supported(
        field: impl Into<String>,
        value: impl Into<Value>,
        supported: Vec<&'static str>,
        rule: &'static str,
    ) -> Self {
        let message = format!(
            "supported values: {}",
            supported
                .iter()
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Self {
            field: field.into(),
            kind: ErrorKind::NotSupported(value.into(), supported),
            message,
            rule,
        }
    }

    /// The message without the field path, in `kubectl` wording (`Invalid value: 150: must be ...`).
    pub fn detail(&self) -> String {
        match &self.kind {
            ErrorKind::Invalid(v) => format!("Invalid value: {}: {}", render_value(v), self.message),
            ErrorKind::Required => format!("Required value: {}", self.message),
            ErrorKind::Forbidden => format!("Forbidden: {}", self.message),
            ErrorKind::NotSupported(v, _) => {
                format!("Unsupported value: {}: {}", render_value(v), self.message)
            }
        }
    }
}

/// Values print as Kubernetes prints them: strings quoted, numbers bare, long objects elided.
fn render_value(v: &Value) -> String {
    match v {
        Value::Object(_) | Value::Array(_) => {
            let s = v.to_string();
            if s.len() > 80 { "<object>".to_string() } else { s }
        }
        other => other.to_string(),
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.detail())
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        self.errors.is_empty()
    }

    /// All errors in one message, one per line, as the apiserver shows aggregated field errors.
    pub fn denial_message(&self) -> String {
        self.errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub(crate) fn error(&mut self, e: FieldError) {
        self.errors.push(e);
    }

    pub(crate) fn warn(&mut self, field: impl Into<String>, rule: &'static str, message: impl Into<String>) {
        self.warnings.push(Warning {
            field: field.into(),
            message: message.into(),
            rule,
        });
    }
}

/// Field paths as they appear in messages.
pub(crate) mod path {
    pub const CLUSTER: &str = "spec.rayClusterConfig";
    pub const HEAD: &str = "spec.rayClusterConfig.headGroupSpec";
    pub const STRATEGY: &str = "spec.upgradeStrategy";
    pub const OPTIONS: &str = "spec.upgradeStrategy.clusterUpgradeOptions";

    pub fn worker(i: usize) -> String {
        format!("{CLUSTER}.workerGroupSpecs[{i}]")
    }

    pub fn annotation(key: &str) -> String {
        format!("metadata.annotations[{key}]")
    }
}
