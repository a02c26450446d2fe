//! AdmissionReview in, AdmissionReview out. No I/O: the server hands over the body bytes.
//!
//! A well-formed review always gets an AdmissionReview back (denials live inside it); a body that is not
//! a RayService AdmissionReview at all is a client error with a message (HTTP 400).

use std::borrow::Cow;

use base64::Engine;
use kube::core::{
    GroupVersionKind, Status,
    admission::{AdmissionResponse, Operation},
    response::{StatusCause, StatusDetails, StatusSummary},
};
use rayshift_api::{
    defaulting::{self, UpgradeDefaults},
    validation::{self, ValidationConfig, Verdict},
};
use serde::Deserialize;
use serde_json::{Value, value::RawValue};

use crate::error::Error;

/// Which webhook a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hook {
    Validate,
    Mutate,
}

impl Hook {
    pub fn as_str(self) -> &'static str {
        match self {
            Hook::Validate => "validate",
            Hook::Mutate => "mutate",
        }
    }
}

/// Settings the rules depend on.
#[derive(Clone, Debug, Default)]
pub struct AdmissionConfig {
    pub validation: ValidationConfig,
    pub defaults: UpgradeDefaults,
}

/// What happened, for metrics and logs.
#[derive(Clone, Debug, Default)]
pub struct Record {
    pub operation: &'static str,
    pub allowed: bool,
    pub denied_rules: Vec<&'static str>,
    pub warned_rules: Vec<&'static str>,
    pub patched: bool,
    pub dry_run: bool,
}

const ADMISSION_V1: &str = "admission.k8s.io/v1";

/// The envelope, read without building a JSON tree for the objects inside (they are decoded once,
/// straight into their types).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn<'a> {
    api_version: Option<Cow<'a, str>>,
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    request: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn<'a> {
    uid: Cow<'a, str>,
    kind: GroupVersionKind,
    operation: Operation,
    #[serde(default)]
    dry_run: bool,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    old_object: Option<&'a RawValue>,
}

/// Just the type of an object.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeOnly {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
}

/// Answers one AdmissionReview body; `Err` means the body was not a usable AdmissionReview.
pub fn review(hook: Hook, body: &[u8], config: &AdmissionConfig) -> Result<(Value, Record), Error> {
    let text = std::str::from_utf8(body)
        .map_err(|e| Error::BadRequest(format!("request body is not valid JSON: not UTF-8 ({e})")))?;
    let envelope: ReviewIn<'_> = serde_json::from_str(text).map_err(|e| {
        Error::BadRequest(if e.is_syntax() || e.is_eof() {
            format!("request body is not valid JSON: {e}")
        } else {
            format!("expected an {ADMISSION_V1} AdmissionReview object: {e}")
        })
    })?;
    let (api_version, kind) = (envelope.api_version.as_deref(), envelope.kind.as_deref());
    if (api_version, kind) != (Some(ADMISSION_V1), Some("AdmissionReview")) {
        return Err(Error::BadRequest(format!(
            "expected an {ADMISSION_V1} AdmissionReview, got apiVersion {api_version:?} kind {kind:?}"
        )));
    }
    let raw = envelope
        .request
        .filter(|r| r.get().trim_start().starts_with('{'))
        .ok_or_else(|| Error::BadRequest("AdmissionReview has no request".into()))?;
    let req: RequestIn<'_> = serde_json::from_str(raw.get())
        .map_err(|e| Error::BadRequest(format!("AdmissionReview request is malformed: {e}")))?;
    if (req.kind.group.as_str(), req.kind.kind.as_str()) != ("ray.io", "RayService") {
        return Err(Error::BadRequest(format!(
            "this webhook admits ray.io RayServices, got {}/{} {}",
            req.kind.group, req.kind.version, req.kind.kind
        )));
    }
    let object = req.object.filter(|o| o.get() != "null");
    let old_object = req.old_object.filter(|o| o.get() != "null");
    let mut record = Record {
        operation: operation_name(&req.operation),
        dry_run: req.dry_run,
        ..Record::default()
    };
    let response = response_for(&req.uid);
    let response = match (req.operation, object) {
        (Operation::Create | Operation::Update, Some(object)) => {
            check_object_kind(object)?;
            match hook {
                Hook::Validate => validate(
                    response,
                    object.get(),
                    old_object.map(RawValue::get),
                    config,
                    &mut record,
                ),
                Hook::Mutate => mutate(response, object.get(), config, &mut record)?,
            }
        }
        (Operation::Create | Operation::Update, None) => {
            return Err(Error::BadRequest(format!(
                "{} request has no object",
                record.operation
            )));
        }
        // Deleting or connecting never breaks an upgrade rule.
        _ => response,
    };
    record.allowed = response.allowed;
    Ok((encode(response)?, record))
}

/// An allowing response for request `uid` (kube's constructor wants the whole typed request).
fn response_for(uid: &str) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid("");
    response.uid = uid.to_string();
    response.allowed = true;
    response.result = Status::default();
    response
}

fn operation_name(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

fn check_object_kind(object: &RawValue) -> Result<(), Error> {
    let t: TypeOnly = serde_json::from_str(object.get())
        .map_err(|e| Error::BadRequest(format!("request object is not a Kubernetes object: {e}")))?;
    let typed = serde_json::json!({"apiVersion": t.api_version, "kind": t.kind});
    match rayshift_api::documents::not_a_rayservice(&typed) {
        None => Ok(()),
        Some(why) => Err(Error::BadRequest(format!("request object is {why}"))),
    }
}

fn validate(
    mut response: AdmissionResponse,
    object: &str,
    old: Option<&str>,
    config: &AdmissionConfig,
    record: &mut Record,
) -> AdmissionResponse {
    let verdict = validation::review_str(object, old, &config.validation);
    record.warned_rules = verdict.warnings.iter().map(|w| w.rule).collect();
    if !verdict.warnings.is_empty() {
        response.warnings = Some(verdict.warnings.iter().map(ToString::to_string).collect());
    }
    if verdict.allowed() {
        return response;
    }
    record.denied_rules = verdict.errors.iter().map(|e| e.rule).collect();
    response.allowed = false;
    response.result = denial_status(&object_name(object), &verdict);
    response
}

/// A Status shaped like the apiserver's own `Invalid` errors, so kubectl users read it as usual.
/// `metadata.name` of an object, read on the (rare) denial path.
fn object_name(object: &str) -> String {
    let value: Value = serde_json::from_str(object).unwrap_or(Value::Null);
    rayshift_api::documents::display_name(&value).0
}

fn denial_status(name: &str, verdict: &Verdict) -> Status {
    let name = name.to_string();
    let listed: Vec<String> = verdict.errors.iter().map(ToString::to_string).collect();
    let joined = if listed.len() == 1 {
        listed[0].clone()
    } else {
        format!("[{}]", listed.join(", "))
    };
    let causes = verdict
        .errors
        .iter()
        .map(|e| StatusCause {
            reason: match e.kind {
                validation::ErrorKind::Required => "FieldValueRequired",
                validation::ErrorKind::Forbidden => "FieldValueForbidden",
                validation::ErrorKind::NotSupported(..) => "FieldValueNotSupported",
                validation::ErrorKind::Invalid(_) => "FieldValueInvalid",
            }
            .to_string(),
            message: e.detail(),
            field: e.field.clone(),
        })
        .collect();
    Status {
        status: Some(StatusSummary::Failure),
        code: 422,
        message: format!("RayService.ray.io {name:?} is invalid: {joined}"),
        reason: "Invalid".to_string(),
        details: Some(StatusDetails {
            name,
            group: "ray.io".to_string(),
            kind: "RayService".to_string(),
            uid: String::new(),
            causes,
            retry_after_seconds: 0,
        }),
        metadata: None,
    }
}

fn mutate(
    response: AdmissionResponse,
    object: &str,
    config: &AdmissionConfig,
    record: &mut Record,
) -> Result<AdmissionResponse, Error> {
    // Defaulting works on the raw tree so the patch touches only what it adds.
    let object: Value = serde_json::from_str(object)
        .map_err(|e| Error::BadRequest(format!("request object is not valid JSON: {e}")))?;
    let patch = defaulting::default_patch(&object, &config.defaults);
    if patch.0.is_empty() {
        return Ok(response);
    }
    record.patched = true;
    response
        .with_patch(patch)
        .map_err(|e| Error::Internal(format!("cannot encode patch: {e}")))
}

/// Serializes the review; the patch goes out base64-encoded, as Go's `[]byte` is on the wire.
fn encode(response: AdmissionResponse) -> Result<Value, Error> {
    let patch = response.patch.clone();
    let mut review = serde_json::to_value(response.into_review())
        .map_err(|e| Error::Internal(format!("cannot encode AdmissionReview: {e}")))?;
    review["apiVersion"] = Value::from(ADMISSION_V1);
    review["kind"] = Value::from("AdmissionReview");
    if let Some(bytes) = patch {
        review["response"]["patch"] = Value::from(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    Ok(review)
}
