//! AdmissionReview in, AdmissionReview out. No I/O: the server hands over the body bytes.
//!
//! A well-formed review always gets an AdmissionReview back (denials live inside it); a body that is not
//! a RayService AdmissionReview at all is a client error with a message (HTTP 400).

use base64::Engine;
use kube::core::{
    GroupVersionKind, Status,
    admission::{AdmissionResponse, Operation},
    response::{StatusCause, StatusDetails, StatusSummary},
};
use rayshift_api::{
    defaulting::{self, UpgradeDefaults},
    template_view::rules_view,
    validation::{self, Admitted, StoredObject, ValidationConfig, Verdict},
};
use serde::{
    Deserialize,
    de::{DeserializeOwned, IgnoredAny},
};
use serde_json::{Value, value::RawValue};

use crate::{
    error::{BadRequest, Error},
    last_applied,
};

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

/// serveConfigV2 texts the webhook keeps parsed (`ValidationConfig::serve_configs`): a text per RayService
/// revision under review, so a few hundred RayServices' worth is at most a few MiB (texts over 64 KiB are not
/// kept).
pub const SERVE_CONFIGS_KEPT: usize = 256;

/// Settings the rules depend on.
#[derive(Clone, Debug, Default)]
pub struct AdmissionConfig {
    pub validation: ValidationConfig,
    pub defaults: UpgradeDefaults,
}

impl AdmissionConfig {
    /// The defaults with the incremental upgrade's feature gate on.
    pub fn incremental() -> Self {
        let mut config = Self::default();
        let gates = &mut config.validation.feature_gates;
        // A gate this crate names itself is always known.
        let _ = gates.set(rayshift_api::feature_gates::RAY_SERVICE_INCREMENTAL_UPGRADE, true);
        config
    }
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

pub(crate) const ADMISSION_V1: &str = "admission.k8s.io/v1";

/// An AdmissionReview; its request is a [`RequestIn`] with the objects decoded as the path needs them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn<R> {
    api_version: Option<String>,
    kind: Option<String>,
    request: Option<R>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn<O, S> {
    uid: String,
    kind: GroupVersionKind,
    operation: Operation,
    #[serde(default)]
    dry_run: bool,
    object: Option<O>,
    old_object: Option<S>,
}

/// The objects left as JSON text, for the step-by-step path.
type RawRequest = RequestIn<Box<RawValue>, Box<RawValue>>;

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
///
/// A validation review is decoded in one pass, objects included. Whatever that pass cannot decode (a
/// field of the wrong type, a stored object that no longer decodes, a body that is not a review) takes
/// the step-by-step path, which names what is wrong.
pub fn review(hook: Hook, body: &[u8], config: &AdmissionConfig) -> Result<(Value, Record), Error> {
    last_applied::with_copies_emptied(body, |emptied| review_emptied(hook, body, emptied, config))
}

/// [`review`] of `body`, decoded from `emptied` (`body` with kubectl's last-applied copies emptied). The
/// step-by-step paths read `body` itself.
fn review_emptied(
    hook: Hook,
    body: &[u8],
    emptied: &[u8],
    config: &AdmissionConfig,
) -> Result<(Value, Record), Error> {
    // Emptying only touches ASCII, so the emptied body is UTF-8 exactly when the body is.
    let text = utf8(emptied)?;
    match hook {
        Hook::Validate => match rules_view(|| serde_json::from_str(text).ok()).and_then(v1_request) {
            Some(req) => admit(
                req,
                |response, object: Admitted, old: Option<StoredObject>, record| {
                    validate(response, object, old.as_ref(), config, record)
                },
            ),
            None => admit(
                request::<RawRequest>(utf8(body)?)?,
                |response, object, old, record| {
                    validate_raw(response, &object, old.as_deref(), config, record)
                },
            ),
        },
        Hook::Mutate => match serde_json::from_str(text).ok().and_then(v1_request) {
            Some(req) => admit(
                req,
                |response, object: DefaultingView, _: Option<IgnoredAny>, record| {
                    mutate(response, object.into_value(), config, record)
                },
            ),
            None => admit(
                request::<RequestIn<Value, IgnoredAny>>(utf8(body)?)?,
                |response, object, _, record| mutate(response, object, config, record),
            ),
        },
    }
}

/// What defaulting reads of an object: its type and `spec.upgradeStrategy`, each kept as sent (an
/// explicit null included). Anything it cannot hold (a `spec` that is not an object) takes the path that
/// decodes the whole object.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DefaultingView {
    #[serde(default, deserialize_with = "present")]
    api_version: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    kind: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    spec: Option<Option<DefaultingSpec>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DefaultingSpec {
    #[serde(default, deserialize_with = "present")]
    upgrade_strategy: Option<Value>,
}

/// A field that is there, even as null (serde reads a null `Option` as absent).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl DefaultingView {
    /// The object as defaulting sees it, without the fields it does not read.
    fn into_value(self) -> Value {
        let mut object = serde_json::Map::new();
        let fields = [("apiVersion", self.api_version), ("kind", self.kind)];
        object.extend(fields.into_iter().filter_map(|(k, v)| Some((k.to_string(), v?))));
        if let Some(spec) = self.spec {
            let spec = spec.map(|s| {
                let strategy = s.upgrade_strategy.map(|u| ("upgradeStrategy".to_string(), u));
                Value::Object(strategy.into_iter().collect())
            });
            object.insert("spec".into(), spec.unwrap_or(Value::Null));
        }
        Value::Object(object)
    }
}

fn utf8(body: &[u8]) -> Result<&str, Error> {
    Ok(std::str::from_utf8(body).map_err(BadRequest::NotUtf8)?)
}

fn v1_request<R>(review: ReviewIn<R>) -> Option<R> {
    let v1 = is_v1_review(review.api_version.as_deref(), review.kind.as_deref());
    review.request.filter(|_| v1)
}

fn is_v1_review(api_version: Option<&str>, kind: Option<&str>) -> bool {
    (api_version, kind) == (Some(ADMISSION_V1), Some("AdmissionReview"))
}

/// The request of a v1 AdmissionReview body.
fn request<R: DeserializeOwned>(text: &str) -> Result<R, Error> {
    serde_json::from_str(text)
        .ok()
        .and_then(v1_request)
        .ok_or_else(|| rejection(text))
}

/// Answers a decoded request: `decide` sees the object of a CREATE or UPDATE.
fn admit<O, S>(
    req: RequestIn<O, S>,
    decide: impl FnOnce(AdmissionResponse, O, Option<S>, &mut Record) -> Result<AdmissionResponse, Error>,
) -> Result<(Value, Record), Error> {
    if (req.kind.group.as_str(), req.kind.kind.as_str()) != ("ray.io", "RayService") {
        let kind = req.kind;
        return Err(BadRequest::NotRayServices {
            group: kind.group,
            version: kind.version,
            kind: kind.kind,
        }
        .into());
    }
    let mut record = Record {
        operation: operation_name(&req.operation),
        dry_run: req.dry_run,
        ..Record::default()
    };
    let response = response_for(&req.uid);
    let response = match (req.operation, req.object) {
        (Operation::Create | Operation::Update, Some(object)) => {
            decide(response, object, req.old_object, &mut record)?
        }
        (Operation::Create | Operation::Update, None) => {
            let operation = record.operation;
            return Err(BadRequest::NoObject { operation }.into());
        }
        // Deleting or connecting never breaks an upgrade rule.
        _ => response,
    };
    record.allowed = response.allowed;
    Ok((encode(response)?, record))
}

/// Why a body is not a usable AdmissionReview: the rare path, read again step by step to name the part
/// that is wrong.
fn rejection(text: &str) -> Error {
    let envelope: ReviewIn<Box<RawValue>> = match serde_json::from_str(text) {
        Ok(e) => e,
        Err(e) if e.is_syntax() || e.is_eof() => {
            return BadRequest::NotJson(e).into();
        }
        Err(e) => {
            return BadRequest::NotAReviewObject(e).into();
        }
    };
    let (api_version, kind) = (envelope.api_version.as_deref(), envelope.kind.as_deref());
    if !is_v1_review(api_version, kind) {
        return BadRequest::NotAV1Review {
            api_version: api_version.map(str::to_string),
            kind: kind.map(str::to_string),
        }
        .into();
    }
    let Some(raw) = envelope.request.filter(|r| r.get().trim_start().starts_with('{')) else {
        return BadRequest::NoRequest.into();
    };
    match serde_json::from_str::<RawRequest>(raw.get()) {
        Err(e) => BadRequest::MalformedRequest(e).into(),
        Ok(_) => BadRequest::MalformedReview.into(),
    }
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

/// The rare path: an object that did not decode as a RayService is first checked for its type.
fn check_object_kind(object: &RawValue) -> Result<(), Error> {
    let t: TypeOnly = serde_json::from_str(object.get()).map_err(BadRequest::ObjectNotKubernetes)?;
    check_type(t.api_version.as_deref(), t.kind.as_deref())
}

fn check_type(api_version: Option<&str>, kind: Option<&str>) -> Result<(), Error> {
    let typed = serde_json::json!({"apiVersion": api_version, "kind": kind});
    match rayshift_api::documents::not_a_rayservice(&typed) {
        None => Ok(()),
        Some(why) => Err(BadRequest::ObjectNotARayService(why).into()),
    }
}

fn validate(
    response: AdmissionResponse,
    object: Admitted,
    old: Option<&StoredObject>,
    config: &AdmissionConfig,
    record: &mut Record,
) -> Result<AdmissionResponse, Error> {
    check_type(object.api_version(), object.kind())?;
    let name = object.name().to_string();
    let verdict = object.review(old, &config.validation);
    Ok(respond(response, &name, &verdict, record))
}

/// The step-by-step path: a decoding failure is a denial that names the field, unless the object is not
/// a RayService at all; a stored object that no longer decodes must not block fixing it.
fn validate_raw(
    response: AdmissionResponse,
    raw: &RawValue,
    old: Option<&RawValue>,
    config: &AdmissionConfig,
    record: &mut Record,
) -> Result<AdmissionResponse, Error> {
    let old = old.and_then(|o| serde_json::from_str::<StoredObject>(o.get()).ok());
    match validation::decode_str(raw.get()) {
        Ok(object) => validate(response, object, old.as_ref(), config, record),
        Err(decoding) => {
            check_object_kind(raw)?;
            let verdict = Verdict {
                errors: vec![decoding],
                warnings: Vec::new(),
            };
            Ok(respond(response, &object_name(raw.get()), &verdict, record))
        }
    }
}

fn respond(
    mut response: AdmissionResponse,
    name: &str,
    verdict: &Verdict,
    record: &mut Record,
) -> AdmissionResponse {
    record.warned_rules = verdict.warnings.iter().map(|w| w.rule).collect();
    if !verdict.warnings.is_empty() {
        response.warnings = Some(verdict.warnings.iter().map(ToString::to_string).collect());
    }
    if verdict.allowed() {
        return response;
    }
    record.denied_rules = verdict.errors.iter().map(|e| e.rule).collect();
    response.allowed = false;
    response.result = denial_status(name, verdict);
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
    object: Value,
    config: &AdmissionConfig,
    record: &mut Record,
) -> Result<AdmissionResponse, Error> {
    // Defaulting works on the raw tree so the patch touches only what it adds.
    if let Some(why) = rayshift_api::documents::not_a_rayservice(&object) {
        return Err(BadRequest::ObjectNotARayService(why).into());
    }
    let patch = defaulting::default_patch(&object, &config.defaults);
    if patch.0.is_empty() {
        return Ok(response);
    }
    record.patched = true;
    response.with_patch(patch).map_err(Error::EncodePatch)
}

/// Serializes the review; the patch goes out base64-encoded, as Go's `[]byte` is on the wire.
fn encode(response: AdmissionResponse) -> Result<Value, Error> {
    let patch = response.patch.clone();
    let mut review = serde_json::to_value(response.into_review()).map_err(Error::EncodeReview)?;
    review["apiVersion"] = Value::from(ADMISSION_V1);
    review["kind"] = Value::from("AdmissionReview");
    if let Some(bytes) = patch {
        review["response"]["patch"] = Value::from(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    Ok(review)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fixtures() -> Vec<(String, Value)> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/validate");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            for doc in rayshift_api::documents::parse_stream(&text).unwrap() {
                out.push((path.display().to_string(), doc));
            }
        }
        assert!(out.len() > 50, "fixtures not found in {dir}");
        out
    }

    fn body(operation: &str, object: &Value, old: Option<&Value>) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": ADMISSION_V1, "kind": "AdmissionReview",
            "request": {"uid": "u1", "kind": {"group": "ray.io", "version": "v1", "kind": "RayService"},
                "operation": operation, "object": object, "oldObject": old}
        }))
        .unwrap()
    }

    fn config() -> AdmissionConfig {
        let config = AdmissionConfig::incremental();
        assert!(config.validation.feature_gates.incremental_upgrade());
        config
    }

    /// What the one-pass path must always agree with.
    fn step_by_step(body: &[u8], config: &AdmissionConfig) -> Result<(Value, Record), Error> {
        let text = std::str::from_utf8(body).unwrap();
        admit(request::<RawRequest>(text)?, |response, object, old, record| {
            validate_raw(response, &object, old.as_deref(), config, record)
        })
    }

    fn same(a: &Result<(Value, Record), Error>, b: &Result<(Value, Record), Error>) -> bool {
        format!("{a:?}") == format!("{b:?}")
    }

    #[test]
    fn the_one_pass_path_answers_every_fixture_as_the_step_by_step_path() {
        let config = config();
        let (mut allowed, mut denied) = (0, 0);
        for (file, plain) in fixtures() {
            for doc in [with_last_applied(&plain), plain] {
                for b in [body("CREATE", &doc, None), body("UPDATE", &doc, Some(&doc))] {
                    let fast = review(Hook::Validate, &b, &config);
                    assert!(same(&fast, &step_by_step(&b, &config)), "{file}: {fast:?}");
                    match fast {
                        Ok((_, record)) if record.allowed => allowed += 1,
                        _ => denied += 1,
                    }
                }
            }
        }
        assert!(allowed > 20 && denied > 100, "allowed {allowed}, denied {denied}");
    }

    #[test]
    fn defaulting_reads_the_same_from_its_view_as_from_the_whole_object() {
        let config = config();
        let odd = [
            json!({"apiVersion": "ray.io/v1", "kind": "RayService", "spec": null}),
            json!({"apiVersion": "ray.io/v1", "kind": "RayService", "spec": 5}),
            json!({"apiVersion": "ray.io/v1", "kind": "RayService", "spec": {"upgradeStrategy": null}}),
            json!({"apiVersion": "ray.io/v1", "kind": "RayService", "spec": {"upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade"}}}),
            json!({"apiVersion": "ray.io/v1", "spec": {}}),
            json!({"apiVersion": "v1", "kind": "Pod"}),
            json!("not an object"),
        ];
        let docs = fixtures().into_iter().map(|(_, d)| d).chain(odd);
        let mut patched = 0;
        for doc in docs.flat_map(|d| [with_last_applied(&d), d]) {
            let b = body("CREATE", &doc, None);
            let text = std::str::from_utf8(&b).unwrap();
            let whole = admit(
                request::<RequestIn<Value, IgnoredAny>>(text).unwrap(),
                |response, object, _, record| mutate(response, object, &config, record),
            );
            let viewed = review(Hook::Mutate, &b, &config);
            assert!(same(&viewed, &whole), "{doc}: {viewed:?}");
            patched += usize::from(viewed.is_ok_and(|(_, r)| r.patched));
        }
        assert!(patched >= 2, "{patched} patched");
    }

    /// The object with kubectl's copy of itself, as `kubectl apply` leaves it; the copy gets emptied.
    fn with_last_applied(doc: &Value) -> Value {
        let mut doc = doc.clone();
        if let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
            let copy = json!({"apiVersion": "ray.io/v1", "metadata": {"name": "x"}, "spec": {"a": "b\\\"c"}});
            let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
            if let Some(annotations) = annotations.as_object_mut() {
                annotations.insert(
                    rayshift_api::rayservice::LAST_APPLIED_ANNOTATION.into(),
                    copy.to_string().into(),
                );
                let b = body("CREATE", &Value::Object(meta.clone()), None);
                assert!(last_applied::with_copies_emptied(&b, |e| e.len() < b.len()));
            }
        }
        doc
    }

    #[test]
    fn a_stored_object_that_no_longer_decodes_does_not_block_an_update() {
        let config = config();
        let (file, doc) = fixtures()
            .into_iter()
            .find(|(f, _)| f.ends_with("allowed-incremental.yaml"))
            .unwrap();
        let broken_old = json!({"spec": {"upgradeStrategy": 5}});
        let b = body("UPDATE", &doc, Some(&broken_old));
        let (_, record) = review(Hook::Validate, &b, &config).unwrap();
        assert!(record.allowed, "{file}");
        assert!(same(
            &review(Hook::Validate, &b, &config),
            &step_by_step(&b, &config)
        ));
    }
}
