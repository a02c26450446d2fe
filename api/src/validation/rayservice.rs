//! RayService rules: metadata, spec, clusterUpgradeOptions, serveConfigV2, and update-only checks.
//!
//! KubeRay's own rules (behaviour reference 7.2, 7.3) keep their messages; rayshift adds the feature gate,
//! the CRD's CEL rules (also here, so that `rayshift validate` answers as the apiserver would), and checks
//! that catch upgrades that could never finish.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::{FieldError, ValidationConfig, Verdict, names, path, raycluster, serve_config, surge};
use crate::{
    RayService,
    feature_gates::RAY_SERVICE_INCREMENTAL_UPGRADE,
    gateway_attachment::{Attachment, HTTP_ROUTE_ANNOTATION},
    lifecycle::initializing::INITIALIZING_TIMEOUT_ANNOTATION as INITIALIZING_TIMEOUT,
    raycluster::is_serving_port,
    rayservice::{
        ClusterUpgradeOptions, DEFAULT_MAX_SURGE_PERCENT, KUBERAY_MANAGER, MULTIKUEUE_MANAGER,
        UpgradeStrategy, UpgradeType,
    },
    serve_grpc::grpc_port_in,
    slo::{self, SLO_CHECKS_ANNOTATION},
    upgrade_control::{self, DRAIN_ANNOTATION, PROGRESS_DEADLINE_ANNOTATION},
};

/// KubeRay keeps `<name>-<5 chars>` and `-serve-svc` inside 63 characters.
const MAX_NAME_LEN: usize = 47;
/// Below this the Ray autoscaler rarely provisions pods between traffic steps (the seed advises 60).
const MIN_ADVISED_INTERVAL_SECONDS: i32 = 30;

/// What the UPDATE rules need of the stored object; decoding only this keeps UPDATE reviews cheap.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct StoredObject {
    #[serde(default)]
    spec: StoredSpec,
    #[serde(default)]
    status: Option<StoredStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredSpec {
    #[serde(default)]
    managed_by: Option<String>,
    #[serde(default)]
    upgrade_strategy: Option<UpgradeStrategy>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredStatus {
    #[serde(default)]
    pending_service_status: Option<StoredCluster>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredCluster {
    #[serde(default)]
    ray_cluster_name: Option<String>,
}

impl StoredObject {
    fn cluster_upgrade_options(&self) -> Option<&ClusterUpgradeOptions> {
        self.spec
            .upgrade_strategy
            .as_ref()?
            .cluster_upgrade_options
            .as_ref()
    }

    /// A pending cluster is named: an upgrade is under way.
    fn upgrading(&self) -> bool {
        let pending = self
            .status
            .as_ref()
            .and_then(|s| s.pending_service_status.as_ref());
        pending
            .and_then(|p| p.ray_cluster_name.as_deref())
            .is_some_and(|n| !n.is_empty())
    }
}

impl From<&RayService> for StoredObject {
    fn from(rs: &RayService) -> Self {
        let pending = rs.status.as_ref().and_then(|s| s.pending_service_status.as_ref());
        Self {
            spec: StoredSpec {
                managed_by: rs.spec.managed_by.clone(),
                upgrade_strategy: rs.spec.upgrade_strategy.clone(),
            },
            status: Some(StoredStatus {
                pending_service_status: pending.map(|p| StoredCluster {
                    ray_cluster_name: p.ray_cluster_name.clone(),
                }),
            }),
        }
    }
}

/// Validates a decoded RayService. `old` is the stored object on UPDATE.
pub fn validate(new: &RayService, old: Option<&StoredObject>, cfg: &ValidationConfig) -> Verdict {
    let mut v = Verdict::default();
    let empty = BTreeMap::new();
    let annotations = new.metadata.annotations.as_ref().unwrap_or(&empty);
    metadata(new, annotations, &mut v);
    managed_by(new, old, cfg, &mut v);
    suspend(new, &mut v);
    spec(new, &mut v);
    raycluster::validate_cluster_spec(&new.spec.ray_cluster_config, annotations, cfg, &mut v);
    upgrade_strategy(new, cfg, &mut v);
    let incremental = new.spec.upgrade_type() == Some(UpgradeType::NewClusterWithIncrementalUpgrade);
    let text = new.spec.serve_config_v2.as_deref();
    let serve_config = serve_config::check(text, incremental, &cfg.serve_configs, &mut v);
    let grpc = serve_config.as_deref().and_then(grpc_port_in);
    gateway_attachment(new, annotations, incremental, grpc, &mut v);
    slo_checks(annotations, incremental, &mut v);
    resource_aware(new, annotations, incremental, &mut v);
    if let Some(old) = old {
        options_changed_mid_upgrade(new, old, &mut v);
    }
    v
}

/// Decodes and validates raw JSON; a field of the wrong type is reported with its path.
pub fn review(new: &Value, old: Option<&Value>, cfg: &ValidationConfig) -> Verdict {
    let new = match decode(new) {
        Ok(rs) => rs,
        Err(e) => {
            return Verdict {
                errors: vec![e],
                warnings: Vec::new(),
            };
        }
    };
    // A stored object that no longer decodes must not block fixing it.
    let old = old.and_then(|o| serde_json::from_value::<StoredObject>(o.clone()).ok());
    validate(&new, old.as_ref(), cfg)
}

/// Decodes a RayService, turning serde's first error into a field error with a path.
pub fn decode(value: &Value) -> Result<RayService, FieldError> {
    serde_path_to_error::deserialize(value).map_err(|e| decode_error(value, e))
}

pub(super) fn decode_error(value: &Value, e: serde_path_to_error::Error<serde_json::Error>) -> FieldError {
    let at = e.path().to_string();
    let shown = value_at(value, &at).cloned().unwrap_or(Value::Null);
    let field = if at == "." { "<root>".to_string() } else { at };
    FieldError::invalid(field, shown, "decode", e.into_inner().to_string())
}

/// The value at a serde path such as `spec.workerGroupSpecs[0].replicas`.
fn value_at<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = root;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, indexes) = part.split_once('[').map_or((part, ""), |(k, rest)| (k, rest));
        if !key.is_empty() {
            cur = cur.get(key)?;
        }
        for idx in indexes.split('[').filter(|s| !s.is_empty()) {
            cur = cur.get(idx.trim_end_matches(']').parse::<usize>().ok()?)?;
        }
    }
    Some(cur)
}

fn metadata(rs: &RayService, annotations: &BTreeMap<String, String>, v: &mut Verdict) {
    let name = rs.metadata.name.as_deref().unwrap_or("");
    if name.is_empty() {
        v.error(FieldError::required(
            "metadata.name",
            "metadata-name",
            "name is required",
        ));
    } else {
        if name.len() > MAX_NAME_LEN {
            v.error(FieldError::invalid(
                "metadata.name",
                name,
                "metadata-name-length",
                format!("RayService name should be no more than {MAX_NAME_LEN} characters"),
            ));
        }
        if !names::is_dns1035_label(name) {
            v.error(FieldError::invalid(
                "metadata.name",
                name,
                "metadata-name-dns1035",
                "RayService name should be a valid DNS1035 label: a lowercase RFC 1035 label must consist of \
                 lower case alphanumeric characters or '-', start with an alphabetic character, and end \
                 with an alphanumeric character",
            ));
        }
    }
    if let Some(raw) = upgrade_control::invalid_progress_deadline(annotations) {
        v.error(FieldError::invalid(
            path::annotation(PROGRESS_DEADLINE_ANNOTATION),
            raw,
            "progress-deadline",
            "must be a positive whole number of seconds",
        ));
    }
    if let Some(raw) = upgrade_control::invalid_drain(annotations) {
        v.error(FieldError::invalid(
            path::annotation(DRAIN_ANNOTATION),
            raw,
            "drain-seconds",
            "must be a whole number of seconds, 0 or more",
        ));
    }
    if let Some(raw) = annotations.get(INITIALIZING_TIMEOUT)
        && let Err(msg) = initializing_timeout(raw)
    {
        v.error(FieldError::invalid(
            path::annotation(INITIALIZING_TIMEOUT),
            raw.as_str(),
            "initializing-timeout",
            msg,
        ));
    }
}

/// `ray.io/initializing-timeout`: a positive Go duration or a positive integer of seconds.
fn initializing_timeout(raw: &str) -> Result<(), String> {
    if let Some(secs) = go_duration_seconds(raw) {
        return if secs > 0.0 {
            Ok(())
        } else {
            Err(format!(
                "annotation {INITIALIZING_TIMEOUT} must be a positive duration, got: {raw}"
            ))
        };
    }
    match raw.parse::<i64>() {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err(format!(
            "annotation {INITIALIZING_TIMEOUT} must be a positive integer (seconds), got: {raw}"
        )),
        Err(_) => Err(format!(
            "annotation {INITIALIZING_TIMEOUT} has invalid format: {raw}. Expected Go duration format (e.g., \
             '5m', '1h') or positive integer seconds"
        )),
    }
}

/// Go's `time.ParseDuration`: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+`, or a bare `0`.
pub fn go_duration_seconds(s: &str) -> Option<f64> {
    let (sign, mut rest) = match s.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(0.0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_end);
        if num.is_empty() || num == "." {
            return None;
        }
        let n: f64 = num.parse().ok()?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_end);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * scale;
        rest = next;
    }
    Some(sign * total)
}

/// The CRD's CEL rules on `spec.managedBy` (allowed values; `self == oldSelf`), also checked here so that
/// `rayshift validate` and clusters whose CRD predates them (KubeRay 1.5) answer the same. Like the CEL
/// transition rule, only a change between two values is denied: setting it on a RayService that had none is
/// the handover from KubeRay to another controller, and removing it hands the RayService back.
fn managed_by(new: &RayService, old: Option<&StoredObject>, cfg: &ValidationConfig, v: &mut Verdict) {
    const FIELD: &str = "spec.managedBy";
    if let Some(value) = new.spec.managed_by.as_deref()
        && !cfg.managed_by_values.iter().any(|m| m == value)
    {
        let message = format!(
            "the managedBy field value must be one of {}",
            cfg.managed_by_values
                .iter()
                .map(|m| format!("'{m}'"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        v.error(FieldError::invalid(FIELD, value, "managed-by-value", message));
    }
    let Some(old) = old else { return };
    match (old.spec.managed_by.as_deref(), new.spec.managed_by.as_deref()) {
        (Some(before), Some(after)) if before != after => v.error(FieldError::invalid(
            FIELD,
            after,
            "managed-by-immutable",
            "the managedBy field is immutable",
        )),
        (None, Some(after)) => v.warn(
            FIELD,
            "managed-by-handover",
            format!(
                "handing this RayService over to '{after}': KubeRay's RayService controller stops reconciling it; \
                 its running clusters are kept, and a cluster whose spec matches the current one is not rebuilt"
            ),
        ),
        (Some(before), None) => v.warn(
            FIELD,
            "managed-by-handover",
            format!("'{before}' no longer manages this RayService: KubeRay's RayService controller takes it back"),
        ),
        _ => {}
    }
}

/// KubeRay 1.7's `spec.suspend` deletes a RayService's clusters; rayshift does not act on it, so a RayService
/// rayshift runs would keep its GPUs while its owner thinks it gave them back.
fn suspend(rs: &RayService, v: &mut Verdict) {
    let kuberay = [KUBERAY_MANAGER, MULTIKUEUE_MANAGER];
    let managed_by = rs.spec.managed_by.as_deref();
    if rs.spec.suspend == Some(true) && managed_by.is_some_and(|m| !kuberay.contains(&m)) {
        v.warn(
            "spec.suspend",
            "suspend-not-acted-on",
            "rayshift does not suspend the RayServices it runs: its clusters keep running; delete the RayService, \
             or hand it back to KubeRay (remove spec.managedBy), to free them",
        );
    }
}

fn spec(rs: &RayService, v: &mut Verdict) {
    let spec = &rs.spec;
    let cluster = &spec.ray_cluster_config;
    if cluster
        .extra
        .get("authOptions")
        .and_then(|a| a.get("enableK8sTokenAuth"))
        == Some(&Value::Bool(true))
    {
        v.error(FieldError::forbidden(
            format!("{}.authOptions.enableK8sTokenAuth", path::CLUSTER),
            "k8s-token-auth",
            "K8s token auth mode is currently not supported for RayService",
        ));
    }
    let head_svc_name = cluster
        .head_group_spec
        .head_service
        .as_ref()
        .and_then(|s| s.pointer("/metadata/name"));
    if head_svc_name.is_some_and(|n| !n.is_null() && n != "") {
        v.error(FieldError::forbidden(
            format!("{}.headService.metadata.name", path::HEAD),
            "head-service-name",
            "spec.rayClusterConfig.headGroupSpec.headService.metadata.name should not be set",
        ));
    }
    serve_ports(rs, v);
    if let Some(delay) = spec.ray_cluster_deletion_delay_seconds.filter(|d| *d < 0) {
        v.error(FieldError::invalid(
            "spec.rayClusterDeletionDelaySeconds",
            delay,
            "deletion-delay",
            format!("Spec.RayClusterDeletionDelaySeconds should be a non-negative integer, got {delay}"),
        ));
    }
    if cluster.upgrade_strategy.as_ref().is_some_and(|u| !u.is_null()) {
        v.error(FieldError::forbidden(
            format!("{}.upgradeStrategy", path::CLUSTER),
            "cluster-upgrade-strategy",
            "RayCluster upgradeStrategy is not allowed inside a RayService: use spec.upgradeStrategy",
        ));
    }
    for (field, set) in [
        (
            "spec.serviceUnhealthySecondThreshold",
            spec.service_unhealthy_second_threshold.is_some(),
        ),
        (
            "spec.deploymentUnhealthySecondThreshold",
            spec.deployment_unhealthy_second_threshold.is_some(),
        ),
    ] {
        if set {
            v.warn(field, "deprecated-field", "deprecated and ignored");
        }
    }
}

/// A head container that declares ports but no Serve port leaves nothing for the serve Service to expose:
/// KubeRay then never creates it and rayshift cannot either (with no ports at all, both use `serve: 8000`).
fn serve_ports(rs: &RayService, v: &mut Verdict) {
    let Some(ray) = rs
        .spec
        .ray_cluster_config
        .head_group_spec
        .template
        .ray_container()
    else {
        return;
    };
    let ports = ray.ports();
    let user_ports = (rs.spec.serve_service.as_ref())
        .and_then(|s| s.pointer("/spec/ports"))
        .and_then(Value::as_array)
        .is_some_and(|p| !p.is_empty());
    let serving = ports.iter().any(|(n, _)| n.is_some_and(is_serving_port));
    if !ports.is_empty() && !serving && !user_ports {
        v.warn(
            format!("{}.template.spec.containers[0].ports", path::HEAD),
            "no-serve-port",
            "Please specify a port named 'serve' (or with the prefix 'serve-', e.g. 'serve-grpc') in the Ray head \
             container; otherwise, the Kubernetes service for Ray Serve will not be created.",
        );
    }
}

fn upgrade_strategy(rs: &RayService, cfg: &ValidationConfig, v: &mut Verdict) {
    let spec = &rs.spec;
    let Some(kind) = spec.upgrade_type() else {
        let raw = spec
            .upgrade_strategy
            .as_ref()
            .and_then(|s| s.type_.clone())
            .unwrap_or_default();
        v.error(FieldError::not_supported(
            format!("{}.type", path::STRATEGY),
            raw,
            UpgradeType::ALL.iter().map(|t| t.as_str()).collect(),
            "upgrade-type",
        ));
        return;
    };
    let options = spec.cluster_upgrade_options();
    if kind != UpgradeType::NewClusterWithIncrementalUpgrade {
        if options.is_some() {
            v.warn(
                path::OPTIONS,
                "options-ignored",
                format!("ignored: clusterUpgradeOptions apply only to NewClusterWithIncrementalUpgrade, not {kind}"),
            );
        }
        return;
    }
    incremental_requirements(rs, cfg, v);
    match options {
        None => v.error(FieldError::required(
            path::OPTIONS,
            "options-required",
            "ClusterUpgradeOptions are required for NewClusterWithIncrementalUpgrade",
        )),
        Some(o) => {
            incremental_options(rs, o, v);
            interval_against_deadline(rs, o, cfg, v);
        }
    }
}

/// What NewClusterWithIncrementalUpgrade needs beyond its options: the feature gate and the Ray autoscaler;
/// serveService is not used by it.
fn incremental_requirements(rs: &RayService, cfg: &ValidationConfig, v: &mut Verdict) {
    let spec = &rs.spec;
    if !cfg.feature_gates.incremental_upgrade() {
        v.error(FieldError::forbidden(
            format!("{}.type", path::STRATEGY),
            "feature-gate",
            format!(
                "NewClusterWithIncrementalUpgrade requires the {RAY_SERVICE_INCREMENTAL_UPGRADE} feature gate \
                 (--feature-gates={RAY_SERVICE_INCREMENTAL_UPGRADE}=true)"
            ),
        ));
    }
    if !spec.ray_cluster_config.autoscaling_enabled() {
        v.error(FieldError::required(
            format!("{}.enableInTreeAutoscaling", path::CLUSTER),
            "autoscaler-required",
            "Ray Autoscaler is required for NewClusterWithIncrementalUpgrade: set enableInTreeAutoscaling: true",
        ));
    }
    if spec.serve_service.is_some() {
        v.warn(
            "spec.serveService",
            "serve-service-ignored",
            "its name is ignored by NewClusterWithIncrementalUpgrade: traffic goes through each cluster's own \
             <cluster>-serve-svc, which takes this Service's ports, labels, annotations and type (KubeRay ignores \
             the whole of it there)",
        );
    }
}

fn percent_rule(field: &str, value: i32, rule: &'static str, v: &mut Verdict) -> bool {
    let name = field.rsplit('.').next().unwrap_or(field);
    if !(0..=100).contains(&value) {
        v.error(FieldError::invalid(
            field,
            value,
            rule,
            format!("{name} must be between 0 and 100"),
        ));
        return false;
    }
    if value == 0 {
        v.error(FieldError::invalid(
            field,
            value,
            "upgrade-never-finishes",
            format!(
                "{name} must be greater than 0: with 0 the upgrade never makes progress and never finishes"
            ),
        ));
        return false;
    }
    true
}

fn incremental_options(rs: &RayService, o: &ClusterUpgradeOptions, v: &mut Verdict) {
    step_and_surge(rs, o, v);
    interval(o.interval_seconds, v);
    gateway_class(o.gateway_class_name.as_deref(), v);
}

/// maxSurgePercent and stepSizePercent: each a percentage, the step no larger than the surge (and warned when
/// it does not divide it), the surge within what the cluster's groups can add.
fn step_and_surge(rs: &RayService, o: &ClusterUpgradeOptions, v: &mut Verdict) {
    let surge_field = format!("{}.maxSurgePercent", path::OPTIONS);
    let step_field = format!("{}.stepSizePercent", path::OPTIONS);
    // Absent maxSurgePercent is the default, never a failure (KubeRay dereferences it unchecked).
    let surge = o.max_surge_percent.unwrap_or(DEFAULT_MAX_SURGE_PERCENT);
    let surge_ok = percent_rule(&surge_field, surge, "max-surge-range", v);
    let step_ok = match o.step_size_percent {
        None => {
            v.error(FieldError::required(
                &step_field,
                "step-size-range",
                "stepSizePercent must be between 0 and 100",
            ));
            false
        }
        Some(step) => percent_rule(&step_field, step, "step-size-range", v),
    };
    match o.step_size_percent.filter(|_| surge_ok && step_ok) {
        Some(step) if step > surge => v.error(FieldError::invalid(
            &step_field,
            step,
            "step-size-above-surge",
            "stepSizePercent must be less than or equal to maxSurgePercent",
        )),
        Some(step) if surge % step != 0 => v.warn(
            &step_field,
            "step-not-dividing-surge",
            format!(
                "stepSizePercent {step} does not divide maxSurgePercent {surge}: the last traffic step of each \
                 capacity step is only {}%",
                surge % step
            ),
        ),
        _ => {}
    }
    if surge_ok {
        surge::check(&rs.spec.ray_cluster_config, surge, &surge_field, v);
    }
}

fn interval(seconds: Option<i32>, v: &mut Verdict) {
    let field = format!("{}.intervalSeconds", path::OPTIONS);
    match seconds {
        None => v.error(FieldError::required(&field, "interval", "intervalSeconds must be greater than 0")),
        Some(i) if i <= 0 => {
            v.error(FieldError::invalid(&field, i, "interval", "intervalSeconds must be greater than 0"))
        }
        Some(i) if i < MIN_ADVISED_INTERVAL_SECONDS => v.warn(
            &field,
            "interval-short",
            format!(
                "intervalSeconds {i} is under {MIN_ADVISED_INTERVAL_SECONDS}: the Ray autoscaler may not provision \
                 pods between traffic steps; 60 is advised"
            ),
        ),
        Some(_) => {}
    }
}

fn gateway_class(class: Option<&str>, v: &mut Verdict) {
    let field = format!("{}.gatewayClassName", path::OPTIONS);
    match class {
        None | Some("") => v.error(FieldError::required(
            field,
            "gateway-class",
            "gatewayClassName is required for NewClusterWithIncrementalUpgrade",
        )),
        Some(class) if !class.split('.').all(names::is_dns1123_label) || class.len() > 253 => {
            v.error(FieldError::invalid(
                field,
                class,
                "gateway-class",
                "must be a valid GatewayClass name (a lowercase RFC 1123 subdomain)",
            ))
        }
        Some(_) => {}
    }
}

/// A deadline no longer than the interval used to roll every upgrade back after its first step; now the
/// deadline counts from each step's due instant, and the user is told so.
fn interval_against_deadline(
    rs: &RayService,
    o: &ClusterUpgradeOptions,
    cfg: &ValidationConfig,
    v: &mut Verdict,
) {
    let empty = BTreeMap::new();
    let annotations = rs.metadata.annotations.as_ref().unwrap_or(&empty);
    let deadline = upgrade_control::progress_deadline(annotations, cfg.progress_deadline_seconds);
    if let Some(i) = o.interval_seconds.filter(|i| i64::from(*i) >= deadline) {
        v.warn(
            format!("{}.intervalSeconds", path::OPTIONS),
            "interval-reaches-progress-deadline",
            format!(
                "intervalSeconds {i} is not shorter than the progress deadline ({deadline} s): the deadline \
                 counts from the instant each step is due, so a step that cannot be made within {deadline} s \
                 of that instant rolls the upgrade back"
            ),
        );
    }
}

/// The ResourceAware annotations: a known mode, a maxUnavailablePercent in 1..99, and how it plays with the
/// step size and the surge.
fn resource_aware(
    rs: &RayService,
    annotations: &BTreeMap<String, String>,
    incremental: bool,
    v: &mut Verdict,
) {
    use upgrade_control::{MAX_UNAVAILABLE_ANNOTATION as UNAVAILABLE, RESOURCE_AWARE_ANNOTATION as MODE};
    let field = path::annotation;
    if let Some(raw) = upgrade_control::invalid_resource_aware_mode(annotations) {
        let why = "one of always, on-stall (when the pending cluster's Pods cannot be scheduled for lack of a resource) or never";
        v.error(FieldError::invalid(field(MODE), raw, "resource-aware-mode", why));
    }
    if let Some(raw) = upgrade_control::invalid_max_unavailable(annotations) {
        let why = "a whole percent in 1..99: how far below 100 % the serving capacity may dip while the active cluster gives way";
        v.error(FieldError::invalid(
            field(UNAVAILABLE),
            raw,
            "max-unavailable-percent",
            why,
        ));
        return;
    }
    let options = rs.spec.cluster_upgrade_options();
    let step = options.and_then(|o| o.step_size_percent).unwrap_or(1);
    let unavailable = upgrade_control::max_unavailable_percent(annotations, step);
    let mode = upgrade_control::resource_aware_mode(annotations, Default::default());
    let annotated = annotations.contains_key(MODE) || annotations.contains_key(UNAVAILABLE);
    if annotated && !incremental {
        let why = "ignored: ResourceAware paces NewClusterWithIncrementalUpgrade only";
        v.warn(field(MODE), "resource-aware-unused", why);
        return;
    }
    if !annotations.contains_key(UNAVAILABLE) {
        return;
    }
    if unavailable < step {
        v.warn(
            field(UNAVAILABLE),
            "max-unavailable-below-step",
            format!(
                "maxUnavailablePercent {unavailable} is below stepSizePercent {step}: each ResourceAware cycle frees and moves only {unavailable}%"
            ),
        );
    }
    let surge = options
        .and_then(|o| o.max_surge_percent)
        .unwrap_or(crate::rayservice::DEFAULT_MAX_SURGE_PERCENT);
    if mode == upgrade_control::ResourceAwareMode::OnStall && unavailable < surge {
        v.warn(
            field(UNAVAILABLE),
            "max-unavailable-below-surge",
            format!(
                "maxUnavailablePercent {unavailable} is below maxSurgePercent {surge}: a surge that stalls is cut to the {unavailable}% the active cluster frees"
            ),
        );
    }
}

/// The SLO checks' annotation: its queries parse as PromQL, its numbers are sane, and it has an upgrade to gate.
fn slo_checks(annotations: &BTreeMap<String, String>, incremental: bool, v: &mut Verdict) {
    let Some(raw) = annotations.get(SLO_CHECKS_ANNOTATION) else {
        return;
    };
    let field = path::annotation(SLO_CHECKS_ANNOTATION);
    match slo::parse(raw) {
        Err(problems) => {
            for p in problems {
                let at = format!("{field}{}", p.at);
                v.error(FieldError::invalid(at, raw.as_str(), "slo-checks", p.message));
            }
        }
        Ok(_) if !incremental => v.warn(
            field,
            "slo-checks-unused",
            "SLO checks gate the traffic steps of NewClusterWithIncrementalUpgrade; this RayService's upgrades have none",
        ),
        Ok(_) => {}
    }
}

/// The shared-Gateway and adopted-route annotations: well formed, and only where they do something.
fn gateway_attachment(
    rs: &RayService,
    annotations: &BTreeMap<String, String>,
    incremental: bool,
    grpc_port: Option<i64>,
    v: &mut Verdict,
) {
    if !incremental {
        if let Some(key) = Attachment::annotated(annotations) {
            v.warn(
                path::annotation(key),
                "gateway-attachment-unused",
                "creates no routing: only NewClusterWithIncrementalUpgrade routes through a Gateway; after a \
                 switch from it, a route rayshift routed keeps all the traffic on the active cluster",
            );
        }
        return;
    }
    let ns = rs.metadata.namespace.as_deref().unwrap_or("default");
    match Attachment::from_annotations(annotations, ns) {
        Err(e) => v.error(e),
        Ok(Attachment::AdoptedRoute { .. }) if grpc_port.is_some() => v.error(FieldError::forbidden(
            path::annotation(HTTP_ROUTE_ANNOTATION),
            "grpc-adopted-route",
            "serveConfigV2 serves gRPC (grpc_options), which moves with rayshift's own GRPCRoute: use \
                 rayshift.io/gateway (a shared Gateway) or no annotation instead of an adopted HTTPRoute",
        )),
        Ok(_) => {}
    }
    if let Some(port) = grpc_port.filter(|p| !(1..=65535).contains(p)) {
        v.error(FieldError::invalid(
            "spec.serveConfigV2",
            port,
            "grpc-port",
            "grpc_options.port must be between 1 and 65535",
        ));
    }
}

/// Changing the pacing mid-upgrade is allowed but takes effect on the running upgrade at once.
fn options_changed_mid_upgrade(new: &RayService, old: &StoredObject, v: &mut Verdict) {
    if old.upgrading() && new.spec.cluster_upgrade_options() != old.cluster_upgrade_options() {
        v.warn(
            path::OPTIONS,
            "options-changed-mid-upgrade",
            "clusterUpgradeOptions changed while an upgrade is in progress: the running upgrade continues with \
             the new values from its current step",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::go_duration_seconds;

    #[test]
    fn go_durations() {
        assert_eq!(go_duration_seconds("5m"), Some(300.0));
        assert_eq!(go_duration_seconds("1h30m"), Some(5400.0));
        assert_eq!(go_duration_seconds("1.5s"), Some(1.5));
        assert_eq!(go_duration_seconds("-1s"), Some(-1.0));
        assert_eq!(go_duration_seconds("0"), Some(0.0));
        assert_eq!(go_duration_seconds("300"), None);
        assert_eq!(go_duration_seconds("5x"), None);
        assert_eq!(go_duration_seconds(""), None);
    }
}
