//! KubeRay's RayCluster rules (`ValidateRayClusterSpec`) applied to `spec.rayClusterConfig`.
//!
//! Messages are KubeRay's, word for word. Unlike KubeRay, which stops at the first failure, every failing
//! rule is reported, each at the path of the field the user has to change.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{
    FieldError, ValidationConfig, Verdict, label_value_errors,
    path::{self, CLUSTER, HEAD, worker},
    qualified_name_errors,
};
use crate::raycluster::{PodTemplate, RayClusterSpec, WorkerGroupSpec};

const FT_ANNOTATION: &str = "ray.io/ft-enabled";
const EXTERNAL_NS_ANNOTATION: &str = "ray.io/external-storage-namespace";
const AUTOSCALER_V2_ENV: &str = "RAY_enable_autoscaler_v2";
const COLLECTOR_CONTAINER: &str = "ray-history-collector";
/// Injected by KubeRay into the history collector; a user value would shadow it.
const COLLECTOR_RESERVED_ENV: [&str; 8] = [
    "POD_IP",
    "FQ_RAY_IP",
    "RAY_CLUSTER_NAME",
    "RAY_CLUSTER_NAMESPACE",
    "RAY_ROLE",
    "OWNER_KIND",
    "OWNER_NAME",
    "EVENTS_PORT",
];
const TLS_ENV: [&str; 4] = [
    "RAY_USE_TLS",
    "RAY_TLS_SERVER_CERT",
    "RAY_TLS_SERVER_KEY",
    "RAY_TLS_CA_CERT",
];
const TLS_MANAGED: &str = "when tlsOptions is set - the operator manages TLS configuration automatically";

/// Checks `spec.rayClusterConfig` against every RayCluster rule; appends to `v`.
pub(crate) fn validate_cluster_spec(
    spec: &RayClusterSpec,
    annotations: &BTreeMap<String, String>,
    cfg: &ValidationConfig,
    v: &mut Verdict,
) {
    let head = &spec.head_group_spec;
    if head.template.containers().is_empty() {
        let msg = "headGroupSpec should have at least one container";
        required(v, containers_path(HEAD), "head-containers", msg);
    }
    let (params, resources, labels) = (&head.ray_start_params, &head.resources, &head.labels);
    check_group_params(HEAD, "Head", params, resources, labels, v);
    for (i, wg) in spec.worker_groups().iter().enumerate() {
        validate_worker(spec, i, wg, v);
    }
    check_unique_group_names(spec, v);
    validate_gcs_ft(spec, annotations, cfg, v);
    validate_autoscaler(spec, cfg, v);
    validate_history_server(spec, cfg, v);
    validate_auth(spec, v);
    validate_network_policy(spec, cfg, v);
    validate_tls(spec, cfg, v);
}

// ---- Reporting ----

fn forbidden(v: &mut Verdict, field: impl Into<String>, rule: &'static str, msg: impl Into<String>) {
    v.error(FieldError::forbidden(field, rule, msg));
}

fn required(v: &mut Verdict, field: impl Into<String>, rule: &'static str, msg: impl Into<String>) {
    v.error(FieldError::required(field, rule, msg));
}

fn invalid(
    v: &mut Verdict,
    field: impl Into<String>,
    value: impl Into<Value>,
    rule: &'static str,
    msg: impl Into<String>,
) {
    v.error(FieldError::invalid(field, value, rule, msg));
}

// ---- Raw JSON access ----

/// A block rayshift keeps unmodelled (`gcsFaultToleranceOptions`, `authOptions`, ...); null means unset.
fn extra<'a>(spec: &'a RayClusterSpec, key: &str) -> Option<&'a Value> {
    spec.extra.get(key).filter(|b| !b.is_null())
}

/// A JSON list, or nothing when the value is absent or not a list.
fn list(value: Option<&Value>) -> &[Value] {
    value.and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn str_at<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

fn set(value: &Value, key: &str) -> bool {
    value.get(key).is_some_and(|x| !x.is_null())
}

/// Go's `len(x) > 0` for an optional list (any other non-null value also counts as set).
fn non_empty(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    }
}

/// Index and entry of the first element whose `name` is `name` (env vars, volumes).
fn find_named<'a>(items: &'a [Value], name: &str) -> Option<(usize, &'a Value)> {
    items
        .iter()
        .enumerate()
        .find(|(_, e)| str_at(e, "name") == Some(name))
}

fn containers_path(group: &str) -> String {
    format!("{group}.template.spec.containers")
}

/// The Ray container (index 0) of a group's Pod template, with the path its fields are reported under.
struct RayContainer<'a> {
    raw: &'a Value,
    group: &'a str,
}

impl<'a> RayContainer<'a> {
    fn of(group: &'a str, template: &'a PodTemplate) -> Option<Self> {
        let raw = template.ray_container()?.0;
        Some(Self { raw, group })
    }

    /// Written only when reported: admission builds these for every group of every review.
    fn path(&self) -> String {
        format!("{}[0]", containers_path(self.group))
    }

    /// Path and entry of env var `name`.
    fn env(&self, name: &str) -> Option<(String, &'a Value)> {
        let (i, e) = find_named(list(self.raw.get("env")), name)?;
        Some((format!("{}.env[{i}]", self.path()), e))
    }

    fn mounts(&self) -> (&'a [Value], String) {
        (
            list(self.raw.get("volumeMounts")),
            format!("{}.volumeMounts", self.path()),
        )
    }
}

fn head_container(spec: &RayClusterSpec) -> Option<RayContainer<'_>> {
    RayContainer::of(HEAD, &spec.head_group_spec.template)
}

fn head_env<'a>(spec: &'a RayClusterSpec, name: &str) -> Option<(String, &'a Value)> {
    head_container(spec)?.env(name)
}

/// The head (no worker spec) then every worker group, each with its path.
fn pod_groups(
    spec: &RayClusterSpec,
) -> impl Iterator<Item = (String, Option<&WorkerGroupSpec>, &PodTemplate)> {
    let head = std::iter::once((HEAD.to_string(), None, &spec.head_group_spec.template));
    let workers = spec.worker_groups().iter().enumerate();
    head.chain(workers.map(|(i, wg)| (worker(i), Some(wg), &wg.template)))
}

// ---- Head and worker groups (rules 1-9) ----

type StringMap = Option<BTreeMap<String, String>>;

/// Rules 2-4, shared by the head ("Head") and every worker group (named by its group name).
fn check_group_params(
    path: &str,
    name: &str,
    params: &StringMap,
    res: &StringMap,
    labels: &StringMap,
    v: &mut Verdict,
) {
    let param = |k: &str| params.as_ref().and_then(|p| p.get(k));
    // Ray would get two resource declarations for the same node.
    let start_resources = ["num-cpus", "num-gpus", "memory", "resources"];
    let in_params = start_resources
        .iter()
        .any(|k| param(k).is_some_and(|x| !x.is_empty()));
    if in_params && res.as_ref().is_some_and(|r| !r.is_empty()) {
        let msg = format!(
            "resource fields should not be set in both rayStartParams and Resources for {name} group; please \
             use only one"
        );
        forbidden(v, format!("{path}.resources"), "group-resources-conflict", msg);
    }
    if param("labels").is_some() {
        let msg = format!(
            "rayStartParams['labels'] is not supported for {name} group; please use the top-level Labels \
             field instead"
        );
        let field = format!("{path}.rayStartParams[labels]");
        forbidden(v, field, "group-start-params-labels", msg);
    }
    for (key, value) in labels.iter().flatten() {
        let field = format!("{path}.labels[{key}]");
        for e in qualified_name_errors(key) {
            let msg = format!("invalid label key for {name} group: '{key}', error: {e}");
            invalid(v, &field, key.as_str(), "group-labels", msg);
        }
        for e in label_value_errors(value) {
            let msg = format!("invalid label value for key '{key}' in {name} group: '{value}', error: {e}");
            invalid(v, &field, value.as_str(), "group-labels", msg);
        }
    }
}

fn autoscaler_version(spec: &RayClusterSpec) -> Option<&str> {
    spec.autoscaler_options.as_ref()?.version.as_deref()
}

/// Autoscaler v2 as the worker rules (8, 9) see it: the option, or the legacy head env var.
fn autoscaler_v2_for_workers(spec: &RayClusterSpec) -> bool {
    let legacy = head_env(spec, AUTOSCALER_V2_ENV).and_then(|(_, e)| str_at(e, "value"));
    autoscaler_version(spec) == Some("v2") || matches!(legacy, Some("1" | "true"))
}

/// KubeRay's RayCluster webhook: a group name picks the Pods of a group, so two groups cannot share one.
fn check_unique_group_names(spec: &RayClusterSpec, v: &mut Verdict) {
    let groups = spec.worker_groups();
    for (i, wg) in groups.iter().enumerate() {
        if groups[..i]
            .iter()
            .any(|earlier| earlier.group_name == wg.group_name)
        {
            let (field, msg) = (
                format!("{}.groupName", worker(i)),
                "worker group names must be unique",
            );
            invalid(v, field, wg.group_name.as_str(), "worker-group-name-unique", msg);
        }
    }
}

fn validate_worker(spec: &RayClusterSpec, i: usize, wg: &WorkerGroupSpec, v: &mut Verdict) {
    let (path, g) = (worker(i), wg.group_name.as_str());
    if wg.template.containers().is_empty() {
        let msg = "workerGroupSpec should have at least one container";
        required(v, containers_path(&path), "worker-containers", msg);
    }
    check_replicas(spec, &path, wg, v);
    check_group_params(&path, g, &wg.ray_start_params, &wg.resources, &wg.labels, v);
    let v2 = autoscaler_v2_for_workers(spec);
    if let Some(t) = wg.idle_timeout_seconds {
        let field = format!("{path}.idleTimeoutSeconds");
        if t < 0 {
            let msg = format!("worker group {g}: idleTimeoutSeconds must be non-negative, got {t}");
            invalid(v, &field, t, "worker-idle-timeout-negative", msg);
        }
        if !v2 {
            let msg = format!(
                "worker group {g}: idleTimeoutSeconds is set, but autoscaler v2 is not enabled. Please set \
                 .spec.autoscalerOptions.version to 'v2' (or set {AUTOSCALER_V2_ENV} environment variable to \
                 'true' in the head pod if using KubeRay < 1.4.0)"
            );
            forbidden(v, field, "worker-idle-timeout-requires-v2", msg);
        }
    }
    if let Some(p) = wg.priority.filter(|p| *p != 0) {
        let prefix = format!("worker group {g}: priority is set, but");
        check_min_ray_version(spec, [2, 56, 0], &prefix, "worker-priority-ray-version", v);
        if !v2 {
            let msg = format!(
                "worker group {g}: priority is set to {p}, but autoscaler v2 is not enabled. Priority is \
                 only supported with autoscaler v2 enabled"
            );
            let field = format!("{path}.priority");
            forbidden(v, field, "worker-priority-requires-v2", msg);
        }
    }
}

fn check_replicas(spec: &RayClusterSpec, path: &str, wg: &WorkerGroupSpec, v: &mut Verdict) {
    let g = &wg.group_name;
    // KubeRay's CRD defaults both bounds, so KubeRay never sees them unset; rayshift's CRD does not, and
    // denying would reject manifests KubeRay accepts. Warn, and check the bounds with the CRD defaults.
    if !spec.autoscaling_enabled() && (wg.min_replicas.is_none() || wg.max_replicas.is_none()) {
        let missing = if wg.min_replicas.is_none() {
            "minReplicas"
        } else {
            "maxReplicas"
        };
        let msg = format!(
            "worker group {g} must set both minReplicas and maxReplicas when autoscaling is disabled \
             (KubeRay's CRD defaults: minReplicas 0, maxReplicas 2147483647)"
        );
        v.warn(format!("{path}.{missing}"), "worker-replicas-unset", msg);
    }
    let (min, max) = (wg.min_replicas.unwrap_or(0), wg.max_replicas.unwrap_or(i32::MAX));
    let rule = "worker-replica-bounds";
    if min < 0 {
        let msg = format!("worker group {g} has negative minReplicas {min}");
        invalid(v, format!("{path}.minReplicas"), min, rule, msg);
    }
    if max < 0 {
        let msg = format!("worker group {g} has negative maxReplicas {max}");
        invalid(v, format!("{path}.maxReplicas"), max, rule, msg);
    }
    if min > max {
        let msg = format!("worker group {g} has minReplicas {min} greater than maxReplicas {max}");
        invalid(v, format!("{path}.minReplicas"), min, rule, msg);
    }
}

// ---- Ray version ----

/// Components of a Ray version, read as Kubernetes' `version.ParseGeneric` reads it: an optional `v`, at
/// least `major.minor`, and anything after the numbers ignored (`2.52.0rc1`).
fn parse_ray_version(s: &str) -> Result<Vec<u64>, String> {
    let t = s.trim_start();
    let mut rest = t.strip_prefix('v').unwrap_or(t);
    let mut parts = Vec::new();
    loop {
        let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (digits, tail) = rest.split_at(end);
        if digits.is_empty() {
            break;
        }
        parts.push(digits);
        match tail.strip_prefix('.') {
            Some(next) if next.starts_with(|c: char| c.is_ascii_digit()) => rest = next,
            _ => break,
        }
    }
    match parts.as_slice() {
        [] => return Err(format!("could not parse {s:?} as version")),
        [_] => return Err(format!("illegal version string {s:?}")),
        [major, ..] if major.len() > 1 && major.starts_with('0') => {
            return Err(format!(
                "illegal zero-prefixed version component {major:?} in {s:?}"
            ));
        }
        _ => {}
    }
    let number = |p: &&str| {
        p.parse::<u64>()
            .map_err(|e| format!("illegal version component {p:?} in {s:?}: {e}"))
    };
    parts.iter().map(number).collect()
}

/// Missing components count as zero, as in Kubernetes' version comparison.
fn at_least(version: &[u64], min: &[u64]) -> bool {
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    let mut order = (0..version.len().max(min.len())).map(|i| at(version, i).cmp(&at(min, i)));
    order.find(|o| o.is_ne()).is_none_or(|o| o.is_gt())
}

/// Rules 9 and 27: a feature needs a minimum Ray version. `prefix` ends in "but" (KubeRay's two rules
/// punctuate it differently). Returns the version when it parses.
fn check_min_ray_version(
    spec: &RayClusterSpec,
    min: [u64; 3],
    prefix: &str,
    rule: &'static str,
    v: &mut Verdict,
) -> Option<Vec<u64>> {
    let field = format!("{CLUSTER}.rayVersion");
    let min_text = format!("{}.{}.{}", min[0], min[1], min[2]);
    let raw = spec.ray_version.as_deref().unwrap_or_default();
    if raw.is_empty() {
        let msg =
            format!("{prefix} RayVersion was not specified. Ray version {min_text} or later is required");
        required(v, field, rule, msg);
        return None;
    }
    match parse_ray_version(raw) {
        Err(e) => {
            let msg = format!("{prefix} RayVersion format is invalid: {raw}, {e}");
            invalid(v, field, raw, rule, msg);
            None
        }
        Ok(parsed) => {
            if !at_least(&parsed, &min) {
                let msg = format!("{prefix} minimum Ray version is {min_text}, got {raw}");
                invalid(v, field, raw, rule, msg);
            }
            Some(parsed)
        }
    }
}

// ---- GCS fault tolerance (rules 10-15) ----

fn validate_gcs_ft(
    spec: &RayClusterSpec,
    ann: &BTreeMap<String, String>,
    cfg: &ValidationConfig,
    v: &mut Verdict,
) {
    let opts = extra(spec, "gcsFaultToleranceOptions");
    check_legacy_gcs_ft(spec, ann, opts.is_some(), v);
    if let Some(opts) = opts {
        check_gcs_ft_owned_settings(spec, ann, v);
        check_gcs_backend(spec, opts, cfg, v);
    }
    let username_env = head_env(spec, "REDIS_USERNAME").map(|(f, _)| f);
    if head_param(spec, "redis-username") || username_env.is_some() {
        let msg = "cannot set redis username in rayStartParams or environment variables - use \
                   GcsFaultToleranceOptions.RedisUsername instead";
        let field = username_env.unwrap_or_else(|| format!("{HEAD}.rayStartParams[redis-username]"));
        forbidden(v, field, "gcs-ft-redis-username", msg);
    }
}

fn annotated(ann: &BTreeMap<String, String>, key: &str) -> bool {
    ann.get(key).is_some_and(|a| !a.is_empty())
}

fn head_param(spec: &RayClusterSpec, key: &str) -> bool {
    let params = spec.head_group_spec.ray_start_params.as_ref();
    params.and_then(|p| p.get(key)).is_some_and(|x| !x.is_empty())
}

/// The legacy annotation beside the options, and Redis named without either.
fn check_legacy_gcs_ft(
    spec: &RayClusterSpec,
    ann: &BTreeMap<String, String>,
    has_options: bool,
    v: &mut Verdict,
) {
    if has_options && annotated(ann, FT_ANNOTATION) {
        let msg = format!(
            "{FT_ANNOTATION} annotation and GcsFaultToleranceOptions are both set. Please use only \
             GcsFaultToleranceOptions to configure GCS fault tolerance"
        );
        forbidden(
            v,
            path::annotation(FT_ANNOTATION),
            "gcs-ft-annotation-conflict",
            msg,
        );
    }
    // The legacy annotation still turns fault tolerance on, so it makes RAY_REDIS_ADDRESS legitimate.
    let legacy_ft = ann
        .get(FT_ANNOTATION)
        .is_some_and(|a| a.eq_ignore_ascii_case("true"));
    if let (false, false, Some((field, _))) = (legacy_ft, has_options, head_env(spec, "RAY_REDIS_ADDRESS")) {
        let msg = "RAY_REDIS_ADDRESS is set which implicitly enables GCS fault tolerance, but \
                   GcsFaultToleranceOptions is not set. Please set GcsFaultToleranceOptions to enable GCS \
                   fault tolerance";
        forbidden(v, field, "gcs-ft-implicit-redis", msg);
    }
}

/// The operator derives these from GcsFaultToleranceOptions; a user copy would conflict.
fn check_gcs_ft_owned_settings(spec: &RayClusterSpec, ann: &BTreeMap<String, String>, v: &mut Verdict) {
    if head_param(spec, "redis-password") {
        let msg = "cannot set `redis-password` in rayStartParams when GcsFaultToleranceOptions is \
                   enabled - use GcsFaultToleranceOptions.RedisPassword instead";
        let field = format!("{HEAD}.rayStartParams[redis-password]");
        forbidden(v, field, "gcs-ft-redis-password", msg);
    }
    if let Some((field, _)) = head_env(spec, "REDIS_PASSWORD") {
        let msg = "cannot set `REDIS_PASSWORD` env var in head Pod when GcsFaultToleranceOptions is \
                   enabled - use GcsFaultToleranceOptions.RedisPassword instead";
        forbidden(v, field, "gcs-ft-redis-password", msg);
    }
    if let Some((field, _)) = head_env(spec, "RAY_REDIS_ADDRESS") {
        let msg = "cannot set `RAY_REDIS_ADDRESS` env var in head Pod when GcsFaultToleranceOptions is \
                   enabled - use GcsFaultToleranceOptions.RedisAddress instead";
        forbidden(v, field, "gcs-ft-redis-address", msg);
    }
    if annotated(ann, EXTERNAL_NS_ANNOTATION) {
        let msg = "cannot set `ray.io/external-storage-namespace` annotation when \
                   GcsFaultToleranceOptions is enabled - use \
                   GcsFaultToleranceOptions.ExternalStorageNamespace instead";
        forbidden(
            v,
            path::annotation(EXTERNAL_NS_ANNOTATION),
            "gcs-ft-external-storage-namespace",
            msg,
        );
    }
}

/// Backend rules: `rocksdb` owns its storage and takes no Redis settings; `redis` (the default) has no
/// storage.
fn check_gcs_backend(spec: &RayClusterSpec, opts: &Value, cfg: &ValidationConfig, v: &mut Verdict) {
    let base = format!("{CLUSTER}.gcsFaultToleranceOptions");
    if str_at(opts, "backend") != Some("rocksdb") {
        if set(opts, "storage") {
            let msg = "cannot set GcsFaultToleranceOptions.Storage when backend is 'redis' - it only applies \
                       to the 'rocksdb' backend";
            forbidden(v, format!("{base}.storage"), "gcs-ft-redis-storage", msg);
        }
        return;
    }
    if !cfg.feature_gates.enabled("GCSFaultToleranceEmbeddedStorage") {
        let msg = "the embedded RocksDB GCS fault tolerance backend (GcsFaultToleranceOptions.Backend: \
                   'rocksdb') requires the GCSFaultToleranceEmbeddedStorage feature gate to be enabled";
        forbidden(v, format!("{base}.backend"), "gcs-ft-rocksdb-gate", msg);
    }
    let text = |k: &str| str_at(opts, k).is_some_and(|x| !x.is_empty());
    let redis_fields = [
        ("redisAddress", "RedisAddress", text("redisAddress")),
        ("redisUsername", "RedisUsername", set(opts, "redisUsername")),
        ("redisPassword", "RedisPassword", set(opts, "redisPassword")),
        (
            "externalStorageNamespace",
            "ExternalStorageNamespace",
            text("externalStorageNamespace"),
        ),
    ];
    for (json, go, _) in redis_fields.iter().filter(|f| f.2) {
        let msg = format!("cannot set GcsFaultToleranceOptions.{go} when backend is 'rocksdb'");
        forbidden(v, format!("{base}.{json}"), "gcs-ft-rocksdb-redis-fields", msg);
    }
    if let Some(storage) = opts.get("storage").filter(|s| !s.is_null()) {
        let claim = str_at(storage, "claimName").is_some_and(|c| !c.is_empty());
        let new_volume =
            set(storage, "size") || set(storage, "storageClassName") || non_empty(storage.get("accessModes"));
        if claim && new_volume {
            let msg = "GcsFaultToleranceOptions.Storage.ClaimName is mutually exclusive with size, \
                       storageClassName, and accessModes";
            let field = format!("{base}.storage.claimName");
            forbidden(v, field, "gcs-ft-storage-claim-exclusive", msg);
        }
    }
    check_gcs_managed_head(spec, v);
}

/// With the embedded backend KubeRay mounts the store itself: the head may not claim its names and paths.
fn check_gcs_managed_head(spec: &RayClusterSpec, v: &mut Verdict) {
    let Some(head) = head_container(spec) else { return };
    for name in ["RAY_gcs_storage", "RAY_gcs_storage_path"] {
        if let Some((field, _)) = head.env(name) {
            let msg = "cannot set `RAY_gcs_storage` or `RAY_gcs_storage_path` env var in head Pod when the \
                       embedded GCS FT backend is used - these are managed by KubeRay";
            forbidden(v, field, "gcs-ft-managed-env", msg);
        }
    }
    let (mounts, mounts_path) = head.mounts();
    for (i, m) in mounts.iter().enumerate() {
        if str_at(m, "name") == Some("gcs-storage") || str_at(m, "mountPath") == Some("/data/gcs") {
            let msg = "cannot set a volume mount named \"gcs-storage\" or mounted at /data/gcs in the head \
                       container when the embedded GCS FT backend is used - it is managed by KubeRay";
            forbidden(v, format!("{mounts_path}[{i}]"), "gcs-ft-managed-mount", msg);
        }
    }
    let volumes = list(spec.head_group_spec.template.spec_field("volumes"));
    if let Some((i, _)) = find_named(volumes, "gcs-storage") {
        let msg = "cannot set a volume named \"gcs-storage\" in the head Pod when the embedded GCS FT \
                   backend is used - it is managed by KubeRay";
        let field = format!("{HEAD}.template.spec.volumes[{i}]");
        forbidden(v, field, "gcs-ft-managed-volume", msg);
    }
}

// ---- Worker suspend and autoscaler (rules 16-20) ----

fn validate_autoscaler(spec: &RayClusterSpec, cfg: &ValidationConfig, v: &mut Verdict) {
    let autoscaling = spec.autoscaling_enabled();
    let suspended = spec
        .worker_groups()
        .iter()
        .enumerate()
        .filter(|(_, wg)| wg.suspend == Some(true));
    for (i, wg) in suspended {
        let (field, g) = (format!("{}.suspend", worker(i)), &wg.group_name);
        if !cfg.feature_gates.enabled("RayJobDeletionPolicy") {
            let msg = format!(
                "worker group {g} can be suspended only when the RayJobDeletionPolicy feature gate is enabled"
            );
            forbidden(v, &field, "worker-suspend-gate", msg);
        }
        if autoscaling {
            let msg = format!("worker group {g} cannot be suspended with Autoscaler enabled");
            forbidden(v, &field, "worker-suspend-autoscaler", msg);
        }
    }
    if let Some((field, env)) = head_env(spec, AUTOSCALER_V2_ENV) {
        let value = str_at(env, "value").filter(|x| matches!(*x, "1" | "true"));
        if let (false, Some(x)) = (autoscaling, value) {
            let msg = format!(
                "environment variable {AUTOSCALER_V2_ENV} cannot be set to '{x}' when \
                 enableInTreeAutoscaling is false. Please set enableInTreeAutoscaling: true to use \
                 autoscaler v2"
            );
            invalid(v, field, x, "autoscaler-v2-env-without-autoscaling", msg);
        } else if autoscaling && autoscaler_version(spec).is_some() {
            let msg = format!(
                "both .spec.autoscalerOptions.version and head Pod env var {AUTOSCALER_V2_ENV} are set, \
                 please only use the former"
            );
            forbidden(v, field, "autoscaler-version-conflict", msg);
        }
    }
    // KubeRay reads only `autoscalerOptions.version` here, not the legacy env var.
    if autoscaling && autoscaler_version(spec) == Some("v2") {
        check_restart_policy(spec, v);
    }
    let Some(opts) = spec.autoscaler_options.as_ref() else {
        return;
    };
    if let Some(t) = opts.idle_timeout_seconds.filter(|t| *t < 0) {
        let msg = format!("autoscalerOptions.idleTimeoutSeconds must be non-negative, got {t}");
        let field = format!("{CLUSTER}.autoscalerOptions.idleTimeoutSeconds");
        invalid(v, field, t, "autoscaler-idle-timeout", msg);
    }
    let env = opts.env.as_deref().unwrap_or_default();
    if let Some((i, _)) = find_named(env, "KUBERAY_GEN_AUTOSCALER_START_CMD") {
        let msg = "autoscalerOptions.env must not contain KUBERAY_GEN_AUTOSCALER_START_CMD: it is managed by \
                   KubeRay and injected automatically into the autoscaler container";
        let field = format!("{CLUSTER}.autoscalerOptions.env[{i}]");
        forbidden(v, field, "autoscaler-reserved-env", msg);
    }
}

/// Autoscaler v2 removes idle Pods itself; a Pod that restarts would come back behind its back.
fn check_restart_policy(spec: &RayClusterSpec, v: &mut Verdict) {
    for (path, group, template) in pod_groups(spec) {
        let Some(policy) = template
            .restart_policy()
            .filter(|p| !p.is_empty() && *p != "Never")
        else {
            continue;
        };
        let msg = match group {
            None => {
                "restartPolicy for head Pod should be Never or unset when using autoscaler V2".to_string()
            }
            Some(wg) => format!(
                "restartPolicy for worker group {} should be Never or unset when using autoscaler V2",
                wg.group_name
            ),
        };
        let field = format!("{path}.template.spec.restartPolicy");
        invalid(v, field, policy, "autoscaler-v2-restart-policy", msg);
    }
}

// ---- History server (rules 21-26) ----

fn validate_history_server(spec: &RayClusterSpec, cfg: &ValidationConfig, v: &mut Verdict) {
    let Some(hs) = extra(spec, "historyServerOptions") else {
        return;
    };
    let base = format!("{CLUSTER}.historyServerOptions");
    if !cfg.feature_gates.enabled("RayClusterHistoryServer") {
        let msg = "RayClusterHistoryServer feature gate is not enabled";
        forbidden(v, &base, "history-server-gate", msg);
    }
    let collector_path = format!("{base}.collectorOptions");
    match hs.get("collectorOptions").filter(|c| !c.is_null()) {
        Some(collector) => check_collector(collector, &collector_path, v),
        None => {
            let msg = "historyServerOptions.collectorOptions must be set";
            required(v, collector_path, "history-server-collector", msg);
        }
    }
    // KubeRay adds the collector sidecar under this name.
    for (path, group, template) in pod_groups(spec) {
        let clashes = template
            .containers()
            .into_iter()
            .enumerate()
            .filter(|(_, c)| c.name() == Some(COLLECTOR_CONTAINER));
        for (j, _) in clashes {
            let owner = group.map_or("head".to_string(), |wg| format!("worker group {}", wg.group_name));
            let msg = format!(
                "{owner} pod template must not define a container with name '{COLLECTOR_CONTAINER}' when \
                 history server collector options are enabled"
            );
            let (field, rule) = (
                format!("{}[{j}].name", containers_path(&path)),
                "history-server-collector-container",
            );
            invalid(v, field, COLLECTOR_CONTAINER, rule, msg);
        }
    }
}

fn check_collector(collector: &Value, path: &str, v: &mut Verdict) {
    if str_at(collector, "image").is_none_or(str::is_empty) {
        let msg = "historyServerOptions.collectorOptions.image must be set";
        required(v, format!("{path}.image"), "history-server-collector-image", msg);
    }
    let env_path = format!("{path}.env");
    let env = CollectorEnv::new(list(collector.get("env")));
    for name in COLLECTOR_RESERVED_ENV {
        if let Some((i, _)) = env.0.get(name) {
            let msg = format!(
                "historyServerOptions.collectorOptions.env must not contain {name}: it is managed by KubeRay \
                 and injected automatically into the collector container"
            );
            forbidden(v, format!("{env_path}[{i}]"), "history-server-reserved-env", msg);
        }
    }
    let Some(backend) = env.literal("STORAGE_BACKEND") else {
        let msg = "STORAGE_BACKEND environment variable must be set with a literal string value in \
                   historyServerOptions.collectorOptions.env";
        required(v, &env_path, "history-server-storage-backend", msg);
        return;
    };
    let backend = backend.to_ascii_uppercase();
    let needed: &[&str] = match backend.as_str() {
        "GCS" => &["GCS_BUCKET"],
        "S3" => &["S3_REGION"],
        "ALIYUNOSS" => &["OSS_BUCKET", "OSS_ENDPOINT", "OSS_REGION"],
        "AZUREBLOB" => return check_azure(&env, &env_path, v),
        _ => &[],
    };
    for name in needed.iter().filter(|n| !env.has_value(n)) {
        let msg = format!("{name} environment variable must be set when STORAGE_BACKEND is {backend}");
        required(v, &env_path, "history-server-storage-env", msg);
    }
}

/// The collector's env by name. KubeRay builds a map from the list, so the last entry of a name wins.
struct CollectorEnv<'a>(BTreeMap<&'a str, (usize, &'a Value)>);

impl<'a> CollectorEnv<'a> {
    fn new(entries: &'a [Value]) -> Self {
        Self(
            entries
                .iter()
                .enumerate()
                .filter_map(|(i, e)| Some((str_at(e, "name")?, (i, e))))
                .collect(),
        )
    }

    fn literal(&self, name: &str) -> Option<&'a str> {
        self.0
            .get(name)
            .and_then(|(_, e)| str_at(e, "value"))
            .filter(|x| !x.is_empty())
    }

    fn has_value(&self, name: &str) -> bool {
        self.literal(name).is_some() || self.0.get(name).is_some_and(|(_, e)| set(e, "valueFrom"))
    }
}

fn check_azure(env: &CollectorEnv<'_>, env_path: &str, v: &mut Verdict) {
    let (conn, url) = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_URL");
    let mode = env
        .literal("AZURE_STORAGE_AUTH_MODE")
        .map(|m| m.trim().to_ascii_lowercase());
    let mode = mode.unwrap_or_default();
    // The auth mode names the one variable it needs; without a known mode either will do.
    let needed = match mode.as_str() {
        "connection_string" => Some(conn),
        "workload_identity" | "default" => Some(url),
        _ => None,
    };
    let when = "when STORAGE_BACKEND is AZUREBLOB";
    let msg = match needed {
        Some(var) if !env.has_value(var) => {
            format!("{var} environment variable must be set {when} and AZURE_STORAGE_AUTH_MODE is {mode}")
        }
        None if !env.has_value(conn) && !env.has_value(url) => {
            format!("either {conn} or {url} environment variable must be set {when}")
        }
        _ => return,
    };
    required(v, env_path, "history-server-azure-env", msg);
}

// ---- Auth (rules 27-28) ----

fn validate_auth(spec: &RayClusterSpec, v: &mut Verdict) {
    let Some(auth) = extra(spec, "authOptions") else {
        return;
    };
    let base = format!("{CLUSTER}.authOptions");
    let mode = auth.get("mode").cloned().unwrap_or(Value::Null);
    let k8s = auth.get("enableK8sTokenAuth").and_then(Value::as_bool) == Some(true);
    if mode.as_str() != Some("token") {
        if k8s {
            let msg = "authOptions.enableK8sTokenAuth is enabled but authOptions.mode not set to 'token'";
            invalid(v, format!("{base}.mode"), mode, "auth-k8s-token-mode", msg);
        }
        return;
    }
    let prefix = "authOptions.mode is 'token' but";
    let version = check_min_ray_version(spec, [2, 52, 0], prefix, "auth-token-ray-version", v);
    if !k8s {
        return;
    }
    // Below 2.52 the token rule has already complained about the version.
    if version.is_some_and(|p| at_least(&p, &[2, 52]) && !at_least(&p, &[2, 55])) {
        let raw = spec.ray_version.as_deref().unwrap_or_default();
        let msg =
            format!("authOptions.enableK8sTokenAuth is enabled but minimum Ray version is 2.55.0, got {raw}");
        let field = format!("{CLUSTER}.rayVersion");
        invalid(v, field, raw, "auth-k8s-token-ray-version", msg);
    }
    if str_at(auth, "secretName").is_some_and(|s| !s.is_empty()) {
        let msg = "authOptions.enableK8sTokenAuth is enabled and authOptions.secretName is also set";
        forbidden(v, format!("{base}.secretName"), "auth-k8s-token-secret", msg);
    }
}

// ---- Network policy (rules 29-32) ----

fn validate_network_policy(spec: &RayClusterSpec, cfg: &ValidationConfig, v: &mut Verdict) {
    let Some(np) = extra(spec, "networkPolicy") else {
        return;
    };
    let base = format!("{CLUSTER}.networkPolicy");
    if !cfg.feature_gates.enabled("RayClusterNetworkPolicy") {
        let msg = "spec.networkPolicy requires the RayClusterNetworkPolicy feature gate to be enabled";
        forbidden(v, &base, "network-policy-gate", msg);
    }
    let mode = str_at(np, "mode").unwrap_or("DenyAll");
    for role in ["head", "worker"] {
        if let Some(rules) = np.get(role) {
            let (label, path) = (format!("networkPolicy.{role}"), format!("{base}.{role}"));
            check_mode_rules(rules, &label, &path, mode, "network-policy-mode-rules", v);
        }
    }
    // Group names end up in NetworkPolicy object names.
    for (i, wg) in spec.worker_groups().iter().enumerate() {
        let errs = dns1123_label_errors(&wg.group_name);
        if !errs.is_empty() {
            let msg = format!(
                "worker group name {:?} must be a valid DNS1123 label when networkPolicy is enabled (it is \
                 embedded in the NetworkPolicy name): [{}]",
                wg.group_name,
                errs.join(" ")
            );
            let field = format!("{}.groupName", worker(i));
            invalid(v, field, wg.group_name.as_str(), "network-policy-group-name", msg);
        }
    }
    for (path, name_path, name, rules) in network_policy_groups(np, &base) {
        let label = format!("networkPolicy.workerGroups[{name:?}]");
        check_mode_rules(rules, &label, &path, mode, "network-policy-group-rules", v);
        if !spec.worker_groups().iter().any(|wg| wg.group_name == name) {
            let msg = format!("{label} does not match any group name in workerGroupSpecs");
            invalid(v, name_path, name, "network-policy-group-unknown", msg);
        }
    }
}

/// `(path, path of the name, group name, rules)` of each per-group entry. KubeRay's type is a list keyed by
/// `groupName`; a map keyed by group name is accepted too.
fn network_policy_groups<'a>(np: &'a Value, base: &str) -> Vec<(String, String, &'a str, &'a Value)> {
    match np.get("workerGroups") {
        Some(Value::Array(entries)) => (entries.iter().enumerate())
            .map(|(j, e)| {
                let path = format!("{base}.workerGroups[{j}]");
                let name = str_at(e, "groupName")
                    .or_else(|| str_at(e, "name"))
                    .unwrap_or_default();
                (path.clone(), format!("{path}.groupName"), name, e)
            })
            .collect(),
        Some(Value::Object(entries)) => (entries.iter())
            .map(|(name, e)| {
                let path = format!("{base}.workerGroups[{name}]");
                (path.clone(), path, name.as_str(), e)
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Rules only mean something for a direction the mode denies.
fn check_mode_rules(rules: &Value, label: &str, path: &str, mode: &str, rule: &'static str, v: &mut Verdict) {
    let directions = [
        ("ingressRules", "DenyAllEgress", "ingress"),
        ("egressRules", "DenyAllIngress", "egress"),
    ];
    for (key, open_mode, direction) in directions {
        if mode == open_mode && non_empty(rules.get(key)) {
            let msg =
                format!("{label}.{key} cannot be set when mode is {mode:?} ({direction} is not restricted)");
            forbidden(v, format!("{path}.{key}"), rule, msg);
        }
    }
}

/// apimachinery's `IsDNS1123Label` messages.
fn dns1123_label_errors(s: &str) -> Vec<&'static str> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters");
    }
    let label_chars = |p: &str| {
        let b = p.as_bytes();
        b.first().is_some_and(u8::is_ascii_alphanumeric)
            && b.last().is_some_and(u8::is_ascii_alphanumeric)
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    };
    if !label_chars(s) && s.split('.').all(label_chars) {
        errs.push("must not contain dots");
    } else if !label_chars(s) {
        errs.push(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must \
             start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for \
             validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        );
    }
    errs
}

// ---- TLS (rules 33-34) ----

fn validate_tls(spec: &RayClusterSpec, cfg: &ValidationConfig, v: &mut Verdict) {
    let Some(tls) = extra(spec, "tlsOptions") else {
        return;
    };
    if !cfg.feature_gates.enabled("RayClusterMTLS") {
        let msg = "spec.tlsOptions requires the RayClusterMTLS feature gate to be enabled";
        forbidden(v, format!("{CLUSTER}.tlsOptions"), "tls-gate", msg);
        return;
    }
    if tls.get("enabled").and_then(Value::as_bool) != Some(true) {
        return;
    }
    // The operator injects these env vars and mounts; user copies would override them.
    for (path, group, template) in pod_groups(spec) {
        let Some(c) = RayContainer::of(&path, template) else {
            continue;
        };
        let location = group.map_or("head Pod".to_string(), |wg| {
            format!("worker group {:?}", wg.group_name)
        });
        for name in TLS_ENV {
            if let Some((field, _)) = c.env(name) {
                let msg = format!("cannot set {name} environment variable in {location} {TLS_MANAGED}");
                forbidden(v, field, "tls-managed-env", msg);
            }
        }
        let (mounts, mounts_path) = c.mounts();
        check_tls_mounts(mounts, &mounts_path, &location, v);
    }
    let Some(opts) = spec.autoscaler_options.as_ref() else {
        return;
    };
    let env = opts.env.as_deref().unwrap_or_default();
    for (name, (i, _)) in TLS_ENV.iter().filter_map(|n| Some((n, find_named(env, n)?))) {
        let msg = format!(
            "cannot set {name} environment variable in autoscalerOptions.env when tlsOptions is set - the \
             operator manages TLS configuration for the autoscaler automatically"
        );
        let field = format!("{CLUSTER}.autoscalerOptions.env[{i}]");
        forbidden(v, field, "tls-managed-env", msg);
    }
    let mounts = opts.volume_mounts.as_deref().unwrap_or_default();
    let mounts_path = format!("{CLUSTER}.autoscalerOptions.volumeMounts");
    check_tls_mounts(mounts, &mounts_path, "autoscalerOptions.volumeMounts", v);
}

fn check_tls_mounts(mounts: &[Value], path: &str, location: &str, v: &mut Verdict) {
    for (i, m) in mounts.iter().enumerate() {
        let field = format!("{path}[{i}]");
        if str_at(m, "name") == Some("ray-tls") {
            let msg = format!("cannot use volume mount named \"ray-tls\" in {location} {TLS_MANAGED}");
            forbidden(v, &field, "tls-managed-mount", msg);
        }
        if str_at(m, "mountPath") == Some("/etc/ray/tls") {
            let msg = format!("cannot use volume mount at path \"/etc/ray/tls\" in {location} {TLS_MANAGED}");
            forbidden(v, &field, "tls-managed-mount", msg);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::template_view::rules_view;

    const C: &str = "spec.rayClusterConfig";
    const H: &str = "spec.rayClusterConfig.headGroupSpec";
    const W0: &str = "spec.rayClusterConfig.workerGroupSpecs[0]";
    const NO_GATES: &[&str] = &[];
    const NO_ANN: &[(&str, &str)] = &[];

    /// A valid cluster; cases apply RFC 7386 merge patches to it (arrays are replaced whole, null deletes).
    fn base() -> Value {
        json!({
            "rayVersion": "2.56.0",
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.56.0"}]}}
            },
            "workerGroupSpecs": [{
                "groupName": "small", "replicas": 1, "minReplicas": 1, "maxReplicas": 3, "rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.56.0"}]}}
            }]
        })
    }

    /// The verdict on `spec`, decoded whole and, as admission decodes it, with the templates' rule fields
    /// only: both must agree, or `template_view::RULE_FIELDS` misses a field a rule reads.
    fn check(spec: Value, annotations: &[(&str, &str)], gates: &[&str]) -> Verdict {
        let annotations = annotations
            .iter()
            .map(|(k, x)| (k.to_string(), x.to_string()))
            .collect();
        let mut cfg = ValidationConfig::default();
        for g in gates {
            cfg.feature_gates.set(g, true).expect("known gate");
        }
        let text = spec.to_string();
        let verdicts = [false, true].map(|in_view| {
            let decode = || serde_json::from_str::<RayClusterSpec>(&text).expect("test spec deserializes");
            let spec = if in_view { rules_view(decode) } else { decode() };
            let mut v = Verdict::default();
            validate_cluster_spec(&spec, &annotations, &cfg, &mut v);
            v
        });
        let [whole, viewed] = verdicts;
        assert_eq!(
            whole, viewed,
            "the rule fields of the templates miss a field a rule reads"
        );
        whole
    }

    fn run(patches: &[Value], annotations: &[(&str, &str)], gates: &[&str]) -> Verdict {
        let mut spec = base();
        for p in patches {
            json_patch::merge(&mut spec, p);
        }
        check(spec, annotations, gates)
    }

    /// Replaces the worker groups with the base group patched by `extra`.
    fn wg(extra: Value) -> Value {
        let mut group = base()["workerGroupSpecs"][0].clone();
        json_patch::merge(&mut group, &extra);
        json!({"workerGroupSpecs": [group]})
    }

    fn head_pod(pod_spec: Value) -> Value {
        json!({"headGroupSpec": {"template": {"spec": pod_spec}}})
    }

    fn head_env(env: Value) -> Value {
        head_pod(json!({"containers": [{"name": "ray-head", "env": env}]}))
    }

    #[track_caller]
    fn denied(patches: &[Value], ann: &[(&str, &str)], gates: &[&str], field: &str, rule: &str, msg: &str) {
        let v = run(patches, ann, gates);
        let found = v
            .errors
            .iter()
            .any(|e| e.field == field && e.rule == rule && e.message.contains(msg));
        assert!(found, "expected {field} / {rule} / {msg:?}, got {:#?}", v.errors);
    }

    #[track_caller]
    fn allowed(patches: &[Value], ann: &[(&str, &str)], gates: &[&str]) {
        let v = run(patches, ann, gates);
        assert!(v.allowed(), "unexpected errors: {:#?}", v.errors);
    }

    /// One denial per entry: `[patches], annotations, gates => field, rule id, part of the message;`.
    macro_rules! deny {
        ($($patches:expr, $ann:expr, $gates:expr => $field:expr, $rule:expr, $msg:expr;)+) => {
            $(denied(&$patches, $ann, $gates, &$field, $rule, $msg);)+
        };
    }

    #[test]
    fn head_group_rules() {
        allowed(&[], NO_ANN, NO_GATES);
        allowed(
            &[json!({"headGroupSpec": {"resources": {"CPU": "1"}, "labels": {"ray.io/zone": "a"}}})],
            NO_ANN,
            NO_GATES,
        );
        let labels = || json!({"headGroupSpec": {"labels": {"bad key!": "ok", "zone": "bad value"}}});
        deny! {
            [head_pod(json!({"containers": []}))], NO_ANN, NO_GATES
                => format!("{H}.template.spec.containers"), "head-containers", "headGroupSpec should have at least one container";
            [json!({"headGroupSpec": {"rayStartParams": {"num-cpus": "1"}, "resources": {"CPU": "1"}}})], NO_ANN, NO_GATES
                => format!("{H}.resources"), "group-resources-conflict",
                   "resource fields should not be set in both rayStartParams and Resources for Head group; please use only one";
            [json!({"headGroupSpec": {"rayStartParams": {"labels": "a=b"}}})], NO_ANN, NO_GATES
                => format!("{H}.rayStartParams[labels]"), "group-start-params-labels",
                   "rayStartParams['labels'] is not supported for Head group; please use the top-level Labels field instead";
            [labels()], NO_ANN, NO_GATES
                => format!("{H}.labels[bad key!]"), "group-labels", "invalid label key for Head group: 'bad key!', error: ";
            [labels()], NO_ANN, NO_GATES
                => format!("{H}.labels[zone]"), "group-labels", "invalid label value for key 'zone' in Head group: 'bad value', error: ";
        }
    }

    #[test]
    fn worker_group_rules() {
        let bounds = "worker-replica-bounds";
        deny! {
            [wg(json!({"template": {"spec": {"containers": []}}}))], NO_ANN, NO_GATES
                => format!("{W0}.template.spec.containers"), "worker-containers", "workerGroupSpec should have at least one container";
            [wg(json!({"rayStartParams": {"num-gpus": "1"}, "resources": {"GPU": "1"}}))], NO_ANN, NO_GATES
                => format!("{W0}.resources"), "group-resources-conflict", "Resources for small group; please use only one";
            [wg(json!({"minReplicas": -1, "maxReplicas": -2}))], NO_ANN, NO_GATES
                => format!("{W0}.minReplicas"), bounds, "worker group small has negative minReplicas -1";
            [wg(json!({"minReplicas": -1, "maxReplicas": -2}))], NO_ANN, NO_GATES
                => format!("{W0}.maxReplicas"), bounds, "worker group small has negative maxReplicas -2";
            [wg(json!({"minReplicas": 5, "maxReplicas": 3}))], NO_ANN, NO_GATES
                => format!("{W0}.minReplicas"), bounds, "worker group small has minReplicas 5 greater than maxReplicas 3";
            [wg(json!({"idleTimeoutSeconds": -5}))], NO_ANN, NO_GATES
                => format!("{W0}.idleTimeoutSeconds"), "worker-idle-timeout-negative",
                   "worker group small: idleTimeoutSeconds must be non-negative, got -5";
            [wg(json!({"idleTimeoutSeconds": 60}))], NO_ANN, NO_GATES
                => format!("{W0}.idleTimeoutSeconds"), "worker-idle-timeout-requires-v2",
                   "worker group small: idleTimeoutSeconds is set, but autoscaler v2 is not enabled. Please set \
                    .spec.autoscalerOptions.version to 'v2'";
        }
        // Two groups with one name (KubeRay's RayCluster webhook); distinct names are fine.
        let group = base()["workerGroupSpecs"][0].clone();
        let mut other = group.clone();
        other["groupName"] = json!("large");
        denied(
            &[json!({"workerGroupSpecs": [group.clone(), group.clone()]})],
            NO_ANN,
            NO_GATES,
            &format!("{}.groupName", worker(1)),
            "worker-group-name-unique",
            "worker group names must be unique",
        );
        allowed(&[json!({"workerGroupSpecs": [group, other]})], NO_ANN, NO_GATES);
        // The legacy head env var counts as autoscaler v2 for the worker rules.
        let legacy = head_env(json!([{"name": "RAY_enable_autoscaler_v2", "value": "true"}]));
        let idle = wg(json!({"idleTimeoutSeconds": 60}));
        allowed(
            &[legacy, idle, json!({"enableInTreeAutoscaling": true})],
            NO_ANN,
            NO_GATES,
        );
    }

    #[test]
    fn unset_replica_bounds_warn_and_use_crd_defaults() {
        let v = run(
            &[wg(json!({"minReplicas": null, "maxReplicas": null}))],
            NO_ANN,
            NO_GATES,
        );
        assert!(v.allowed(), "{:#?}", v.errors);
        assert_eq!(v.warnings.len(), 1);
        assert_eq!(v.warnings[0].field, format!("{W0}.minReplicas"));
        assert!(
            v.warnings[0]
                .message
                .contains("worker group small must set both minReplicas and maxReplicas")
        );
        let v = run(
            &[wg(json!({"minReplicas": 5, "maxReplicas": null}))],
            NO_ANN,
            NO_GATES,
        );
        assert!(v.allowed(), "{:#?}", v.errors);
        let autoscaled = [
            json!({"enableInTreeAutoscaling": true}),
            wg(json!({"minReplicas": null})),
        ];
        assert!(run(&autoscaled, NO_ANN, NO_GATES).warnings.is_empty());
    }

    #[test]
    fn worker_priority_rules() {
        let version = format!("{C}.rayVersion");
        let rule = "worker-priority-ray-version";
        let prio = || wg(json!({"priority": 1}));
        let v2 = || json!({"autoscalerOptions": {"version": "v2"}});
        deny! {
            [prio(), v2(), json!({"rayVersion": null})], NO_ANN, NO_GATES
                => version, rule, "worker group small: priority is set, but RayVersion was not specified. Ray version 2.56.0 or later is required";
            [prio(), v2(), json!({"rayVersion": "latest"})], NO_ANN, NO_GATES
                => version, rule, "priority is set, but RayVersion format is invalid: latest, could not parse \"latest\" as version";
            [prio(), v2(), json!({"rayVersion": "2.55.1"})], NO_ANN, NO_GATES
                => version, rule, "worker group small: priority is set, but minimum Ray version is 2.56.0, got 2.55.1";
            [prio()], NO_ANN, NO_GATES
                => format!("{W0}.priority"), "worker-priority-requires-v2",
                   "worker group small: priority is set to 1, but autoscaler v2 is not enabled. Priority is only supported";
        }
        allowed(
            &[prio(), v2(), json!({"rayVersion": "v2.56.0"})],
            NO_ANN,
            NO_GATES,
        );
        allowed(
            &[wg(json!({"priority": 0})), json!({"rayVersion": null})],
            NO_ANN,
            NO_GATES,
        );
    }

    #[test]
    fn gcs_fault_tolerance_rules() {
        let ft = || json!({"gcsFaultToleranceOptions": {"redisAddress": "redis:6379"}});
        let env0 = format!("{H}.template.spec.containers[0].env[0]");
        let redis_env = || head_env(json!([{"name": "RAY_REDIS_ADDRESS", "value": "redis:6379"}]));
        let legacy = [("ray.io/ft-enabled", "true")];
        let storage_ns = [("ray.io/external-storage-namespace", "ns")];
        deny! {
            [ft()], &legacy, NO_GATES
                => "metadata.annotations[ray.io/ft-enabled]", "gcs-ft-annotation-conflict",
                   "ray.io/ft-enabled annotation and GcsFaultToleranceOptions are both set. Please use only GcsFaultToleranceOptions";
            [redis_env()], NO_ANN, NO_GATES
                => env0, "gcs-ft-implicit-redis", "RAY_REDIS_ADDRESS is set which implicitly enables GCS fault tolerance, but";
            [redis_env(), ft()], NO_ANN, NO_GATES
                => env0, "gcs-ft-redis-address", "cannot set `RAY_REDIS_ADDRESS` env var in head Pod when GcsFaultToleranceOptions is enabled";
            [head_env(json!([{"name": "REDIS_PASSWORD", "value": "x"}])), ft()], NO_ANN, NO_GATES
                => env0, "gcs-ft-redis-password", "cannot set `REDIS_PASSWORD` env var in head Pod";
            [ft(), json!({"headGroupSpec": {"rayStartParams": {"redis-password": "x"}}})], NO_ANN, NO_GATES
                => format!("{H}.rayStartParams[redis-password]"), "gcs-ft-redis-password",
                   "cannot set `redis-password` in rayStartParams when GcsFaultToleranceOptions is enabled";
            [ft()], &storage_ns, NO_GATES
                => "metadata.annotations[ray.io/external-storage-namespace]", "gcs-ft-external-storage-namespace",
                   "use GcsFaultToleranceOptions.ExternalStorageNamespace instead";
            [json!({"headGroupSpec": {"rayStartParams": {"redis-username": "u"}}})], NO_ANN, NO_GATES
                => format!("{H}.rayStartParams[redis-username]"), "gcs-ft-redis-username",
                   "cannot set redis username in rayStartParams or environment variables - use";
            [head_env(json!([{"name": "REDIS_USERNAME", "value": "u"}]))], NO_ANN, NO_GATES
                => env0, "gcs-ft-redis-username", "use GcsFaultToleranceOptions.RedisUsername instead";
            [ft(), json!({"gcsFaultToleranceOptions": {"storage": {"size": "1Gi"}}})], NO_ANN, NO_GATES
                => format!("{C}.gcsFaultToleranceOptions.storage"), "gcs-ft-redis-storage",
                   "cannot set GcsFaultToleranceOptions.Storage when backend is 'redis'";
        }
        allowed(&[redis_env()], &[("ray.io/ft-enabled", "TRUE")], NO_GATES);
        allowed(&[ft()], &[("ray.io/external-storage-namespace", "")], NO_GATES);
    }

    #[test]
    fn gcs_rocksdb_backend_rules() {
        let gate = &["GCSFaultToleranceEmbeddedStorage"];
        let opts = format!("{C}.gcsFaultToleranceOptions");
        let c0 = format!("{H}.template.spec.containers[0]");
        let rocks =
            |extra: Value| json!({"gcsFaultToleranceOptions": {"backend": "rocksdb", "storage": extra}});
        let redis =
            json!({"gcsFaultToleranceOptions": {"redisUsername": {"value": "u"}, "redisAddress": "r:6379"}});
        let managed = head_pod(json!({
            "containers": [{"name": "ray-head", "env": [{"name": "RAY_gcs_storage_path", "value": "/x"}],
                            "volumeMounts": [{"name": "data", "mountPath": "/data/gcs"}]}],
            "volumes": [{"name": "other"}, {"name": "gcs-storage"}]
        }));
        deny! {
            [rocks(Value::Null)], NO_ANN, NO_GATES
                => format!("{opts}.backend"), "gcs-ft-rocksdb-gate",
                   "requires the GCSFaultToleranceEmbeddedStorage feature gate to be enabled";
            [rocks(Value::Null), redis.clone()], NO_ANN, gate
                => format!("{opts}.redisUsername"), "gcs-ft-rocksdb-redis-fields",
                   "cannot set GcsFaultToleranceOptions.RedisUsername when backend is 'rocksdb'";
            [rocks(Value::Null), redis], NO_ANN, gate
                => format!("{opts}.redisAddress"), "gcs-ft-rocksdb-redis-fields",
                   "cannot set GcsFaultToleranceOptions.RedisAddress when backend is 'rocksdb'";
            [rocks(json!({"claimName": "pvc", "storageClassName": "fast"}))], NO_ANN, gate
                => format!("{opts}.storage.claimName"), "gcs-ft-storage-claim-exclusive",
                   "GcsFaultToleranceOptions.Storage.ClaimName is mutually exclusive with size, storageClassName, and accessModes";
            [rocks(Value::Null), managed.clone()], NO_ANN, gate
                => format!("{c0}.env[0]"), "gcs-ft-managed-env", "cannot set `RAY_gcs_storage` or `RAY_gcs_storage_path` env var";
            [rocks(Value::Null), managed.clone()], NO_ANN, gate
                => format!("{c0}.volumeMounts[0]"), "gcs-ft-managed-mount",
                   "cannot set a volume mount named \"gcs-storage\" or mounted at /data/gcs in the head container";
            [rocks(Value::Null), managed], NO_ANN, gate
                => format!("{H}.template.spec.volumes[1]"), "gcs-ft-managed-volume",
                   "cannot set a volume named \"gcs-storage\" in the head Pod";
        }
        allowed(
            &[rocks(json!({"size": "10Gi", "accessModes": ["ReadWriteOnce"]}))],
            NO_ANN,
            gate,
        );
        allowed(&[rocks(json!({"claimName": "pvc"}))], NO_ANN, gate);
    }

    #[test]
    fn suspend_and_autoscaler_rules() {
        let deletion_gate = &["RayJobDeletionPolicy"];
        let env0 = format!("{H}.template.spec.containers[0].env[0]");
        let suspend = || wg(json!({"suspend": true}));
        let on = |version: &str| json!({"enableInTreeAutoscaling": true, "autoscalerOptions": {"version": version}});
        let v2_env = || head_env(json!([{"name": "RAY_enable_autoscaler_v2", "value": "1"}]));
        let restart = [
            on("v2"),
            head_pod(json!({"restartPolicy": "Always"})),
            wg(json!({"template": {"spec": {"restartPolicy": "OnFailure"}}})),
        ];
        let opts = || {
            json!({"autoscalerOptions": {"idleTimeoutSeconds": -1,
            "env": [{"name": "A"}, {"name": "KUBERAY_GEN_AUTOSCALER_START_CMD", "value": "x"}]}})
        };
        deny! {
            [suspend()], NO_ANN, NO_GATES
                => format!("{W0}.suspend"), "worker-suspend-gate",
                   "worker group small can be suspended only when the RayJobDeletionPolicy feature gate is enabled";
            [suspend(), json!({"enableInTreeAutoscaling": true})], NO_ANN, deletion_gate
                => format!("{W0}.suspend"), "worker-suspend-autoscaler", "worker group small cannot be suspended with Autoscaler enabled";
            [v2_env()], NO_ANN, NO_GATES
                => env0, "autoscaler-v2-env-without-autoscaling",
                   "environment variable RAY_enable_autoscaler_v2 cannot be set to '1' when enableInTreeAutoscaling is false";
            [v2_env(), on("v1")], NO_ANN, NO_GATES
                => env0, "autoscaler-version-conflict",
                   "both .spec.autoscalerOptions.version and head Pod env var RAY_enable_autoscaler_v2 are set, please only use the former";
            restart.clone(), NO_ANN, NO_GATES
                => format!("{H}.template.spec.restartPolicy"), "autoscaler-v2-restart-policy",
                   "restartPolicy for head Pod should be Never or unset when using autoscaler V2";
            restart, NO_ANN, NO_GATES
                => format!("{W0}.template.spec.restartPolicy"), "autoscaler-v2-restart-policy",
                   "restartPolicy for worker group small should be Never or unset when using autoscaler V2";
            [opts()], NO_ANN, NO_GATES
                => format!("{C}.autoscalerOptions.idleTimeoutSeconds"), "autoscaler-idle-timeout",
                   "autoscalerOptions.idleTimeoutSeconds must be non-negative, got -1";
            [opts()], NO_ANN, NO_GATES
                => format!("{C}.autoscalerOptions.env[1]"), "autoscaler-reserved-env",
                   "autoscalerOptions.env must not contain KUBERAY_GEN_AUTOSCALER_START_CMD: it is managed by KubeRay";
        }
        allowed(&[suspend()], NO_ANN, deletion_gate);
        allowed(
            &[on("v2"), head_pod(json!({"restartPolicy": "Never"}))],
            NO_ANN,
            NO_GATES,
        );
        // Restart policy is checked against the option only, as KubeRay does.
        allowed(
            &[on("v1"), head_pod(json!({"restartPolicy": "Always"}))],
            NO_ANN,
            NO_GATES,
        );
    }

    #[test]
    fn history_server_rules() {
        let gate = &["RayClusterHistoryServer"];
        let hs_path = format!("{C}.historyServerOptions");
        let coll = format!("{hs_path}.collectorOptions");
        let env = format!("{coll}.env");
        let hs = |env: Value| json!({"historyServerOptions": {"collectorOptions": {"image": "collector:1", "env": env}}});
        let backend = |b: &str, more: Value| {
            let mut env = vec![json!({"name": "STORAGE_BACKEND", "value": b})];
            env.extend(more.as_array().cloned().unwrap_or_default());
            hs(Value::Array(env))
        };
        let secret = json!({"secretKeyRef": {"name": "s", "key": "k"}});
        let s3 = || backend("s3", json!([{"name": "S3_REGION", "valueFrom": secret}]));
        let azure = |mode: &str| {
            backend(
                "AzureBlob",
                json!([{"name": "AZURE_STORAGE_AUTH_MODE", "value": mode}]),
            )
        };
        let sidecar = wg(
            json!({"template": {"spec": {"containers": [{"name": "w"}, {"name": "ray-history-collector"}]}}}),
        );
        let from_configmap =
            json!([{"name": "STORAGE_BACKEND", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]);
        deny! {
            [s3()], NO_ANN, NO_GATES
                => hs_path, "history-server-gate", "RayClusterHistoryServer feature gate is not enabled";
            [json!({"historyServerOptions": {}})], NO_ANN, gate
                => coll, "history-server-collector", "historyServerOptions.collectorOptions must be set";
            [json!({"historyServerOptions": {"collectorOptions": {"image": ""}}})], NO_ANN, gate
                => format!("{coll}.image"), "history-server-collector-image", "historyServerOptions.collectorOptions.image must be set";
            [backend("GCS", json!([{"name": "POD_IP", "value": "x"}]))], NO_ANN, gate
                => format!("{env}[1]"), "history-server-reserved-env",
                   "historyServerOptions.collectorOptions.env must not contain POD_IP: it is managed by KubeRay";
            [hs(from_configmap)], NO_ANN, gate
                => env, "history-server-storage-backend",
                   "STORAGE_BACKEND environment variable must be set with a literal string value in historyServerOptions.collectorOptions.env";
            [backend("GCS", json!([]))], NO_ANN, gate
                => env, "history-server-storage-env", "GCS_BUCKET environment variable must be set when STORAGE_BACKEND is GCS";
            [backend("aliyunoss", json!([{"name": "OSS_BUCKET", "value": "b"}]))], NO_ANN, gate
                => env, "history-server-storage-env", "OSS_REGION environment variable must be set when STORAGE_BACKEND is ALIYUNOSS";
            [azure("connection_string")], NO_ANN, gate
                => env, "history-server-azure-env",
                   "AZURE_STORAGE_CONNECTION_STRING environment variable must be set when STORAGE_BACKEND is AZUREBLOB and AZURE_STORAGE_AUTH_MODE is connection_string";
            [azure(" Workload_Identity ")], NO_ANN, gate
                => env, "history-server-azure-env",
                   "AZURE_STORAGE_ACCOUNT_URL environment variable must be set when STORAGE_BACKEND is AZUREBLOB and AZURE_STORAGE_AUTH_MODE is workload_identity";
            [azure("")], NO_ANN, gate
                => env, "history-server-azure-env",
                   "either AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_URL environment variable must be set when STORAGE_BACKEND is AZUREBLOB";
            [s3(), head_pod(json!({"containers": [{"name": "ray-head"}, {"name": "ray-history-collector"}]}))], NO_ANN, gate
                => format!("{H}.template.spec.containers[1].name"), "history-server-collector-container",
                   "head pod template must not define a container with name 'ray-history-collector' when history server collector options are enabled";
            [s3(), sidecar], NO_ANN, gate
                => format!("{W0}.template.spec.containers[1].name"), "history-server-collector-container",
                   "worker group small pod template must not define a container with name 'ray-history-collector' when history server";
        }
        allowed(&[s3()], NO_ANN, gate);
        allowed(&[backend("unknown", json!([]))], NO_ANN, gate);
    }

    #[test]
    fn auth_rules() {
        let version = format!("{C}.rayVersion");
        let token = |v: Value, k8s: bool| json!({"rayVersion": v, "authOptions": {"mode": "token", "enableK8sTokenAuth": k8s}});
        let rule = "auth-token-ray-version";
        let with_secret =
            json!({"authOptions": {"mode": "token", "enableK8sTokenAuth": true, "secretName": "s"}});
        deny! {
            [token(Value::Null, false)], NO_ANN, NO_GATES
                => version, rule, "authOptions.mode is 'token' but RayVersion was not specified. Ray version 2.52.0 or later is required";
            [token(json!("v2.x"), false)], NO_ANN, NO_GATES
                => version, rule, "authOptions.mode is 'token' but RayVersion format is invalid: v2.x, illegal version string \"v2.x\"";
            [token(json!("2.51.0"), false)], NO_ANN, NO_GATES
                => version, rule, "authOptions.mode is 'token' but minimum Ray version is 2.52.0, got 2.51.0";
            [token(json!("2.53.0"), true)], NO_ANN, NO_GATES
                => version, "auth-k8s-token-ray-version",
                   "authOptions.enableK8sTokenAuth is enabled but minimum Ray version is 2.55.0, got 2.53.0";
            [with_secret], NO_ANN, NO_GATES
                => format!("{C}.authOptions.secretName"), "auth-k8s-token-secret",
                   "authOptions.enableK8sTokenAuth is enabled and authOptions.secretName is also set";
            [json!({"authOptions": {"enableK8sTokenAuth": true}})], NO_ANN, NO_GATES
                => format!("{C}.authOptions.mode"), "auth-k8s-token-mode",
                   "authOptions.enableK8sTokenAuth is enabled but authOptions.mode not set to 'token'";
        }
        allowed(&[token(json!("2.52"), false)], NO_ANN, NO_GATES);
        allowed(&[token(json!("2.55.0"), true)], NO_ANN, NO_GATES);
        // Below 2.52 only the token rule speaks, not the 2.55 one as well.
        assert_eq!(
            run(&[token(json!("2.40.0"), true)], NO_ANN, NO_GATES)
                .errors
                .len(),
            1
        );
    }

    #[test]
    fn network_policy_rules() {
        let gate = &["RayClusterNetworkPolicy"];
        let np = format!("{C}.networkPolicy");
        let policy = |p: Value| json!({"networkPolicy": p});
        let groups = || {
            policy(json!({"mode": "DenyAllIngress",
            "workerGroups": [{"groupName": "small", "egressRules": [{}]}, {"groupName": "big"}]}))
        };
        deny! {
            [policy(json!({}))], NO_ANN, NO_GATES
                => np, "network-policy-gate", "spec.networkPolicy requires the RayClusterNetworkPolicy feature gate to be enabled";
            [policy(json!({"mode": "DenyAllEgress", "head": {"ingressRules": [{}]}}))], NO_ANN, gate
                => format!("{np}.head.ingressRules"), "network-policy-mode-rules",
                   "networkPolicy.head.ingressRules cannot be set when mode is \"DenyAllEgress\" (ingress is not restricted)";
            [policy(json!({"mode": "DenyAllIngress", "head": {"egressRules": [{}]}}))], NO_ANN, gate
                => format!("{np}.head.egressRules"), "network-policy-mode-rules",
                   "networkPolicy.head.egressRules cannot be set when mode is \"DenyAllIngress\" (egress is not restricted)";
            [policy(json!({"mode": "DenyAllIngress", "worker": {"egressRules": [{}]}}))], NO_ANN, gate
                => format!("{np}.worker.egressRules"), "network-policy-mode-rules",
                   "networkPolicy.worker.egressRules cannot be set when mode is \"DenyAllIngress\" (egress is not restricted)";
            [policy(json!({})), wg(json!({"groupName": "Small"}))], NO_ANN, gate
                => format!("{W0}.groupName"), "network-policy-group-name",
                   "worker group name \"Small\" must be a valid DNS1123 label when networkPolicy is enabled (it is embedded in the NetworkPolicy name): [a lowercase RFC 1123 label";
            [groups()], NO_ANN, gate
                => format!("{np}.workerGroups[0].egressRules"), "network-policy-group-rules",
                   "networkPolicy.workerGroups[\"small\"].egressRules cannot be set when mode is \"DenyAllIngress\" (egress is not restricted)";
            [groups()], NO_ANN, gate
                => format!("{np}.workerGroups[1].groupName"), "network-policy-group-unknown",
                   "networkPolicy.workerGroups[\"big\"] does not match any group name in workerGroupSpecs";
            [policy(json!({"workerGroups": {"big": {}}}))], NO_ANN, gate
                => format!("{np}.workerGroups[big]"), "network-policy-group-unknown", "networkPolicy.workerGroups[\"big\"] does not match";
        }
        let rules = json!({"ingressRules": [{}], "egressRules": [{}]});
        let full = policy(
            json!({"head": rules, "worker": rules, "workerGroups": [{"groupName": "small", "ingressRules": [{}]}]}),
        );
        allowed(&[full], NO_ANN, gate);
        allowed(&[policy(json!({"workerGroups": {"small": rules}}))], NO_ANN, gate);
    }

    #[test]
    fn tls_rules() {
        let gate = &["RayClusterMTLS"];
        let on = || json!({"tlsOptions": {"enabled": true}});
        let c0 = format!("{W0}.template.spec.containers[0]");
        let worker_tls = wg(json!({"template": {"spec": {"containers": [{"name": "w",
            "env": [{"name": "RAY_TLS_CA_CERT"}],
            "volumeMounts": [{"name": "ray-tls", "mountPath": "/x"}, {"name": "y", "mountPath": "/etc/ray/tls"}]}]}}}));
        let autoscaler = json!({"autoscalerOptions": {"env": [{"name": "RAY_TLS_SERVER_KEY", "value": "k"}],
            "volumeMounts": [{"name": "certs", "mountPath": "/etc/ray/tls"}]}});
        let use_tls = || head_env(json!([{"name": "RAY_USE_TLS", "value": "1"}]));
        deny! {
            [on()], NO_ANN, NO_GATES
                => format!("{C}.tlsOptions"), "tls-gate", "spec.tlsOptions requires the RayClusterMTLS feature gate to be enabled";
            [on(), use_tls()], NO_ANN, gate
                => format!("{H}.template.spec.containers[0].env[0]"), "tls-managed-env",
                   "cannot set RAY_USE_TLS environment variable in head Pod when tlsOptions is set - the operator manages TLS configuration automatically";
            [on(), worker_tls.clone()], NO_ANN, gate
                => format!("{c0}.env[0]"), "tls-managed-env",
                   "cannot set RAY_TLS_CA_CERT environment variable in worker group \"small\" when tlsOptions is set";
            [on(), worker_tls.clone()], NO_ANN, gate
                => format!("{c0}.volumeMounts[0]"), "tls-managed-mount",
                   "cannot use volume mount named \"ray-tls\" in worker group \"small\" when tlsOptions is set";
            [on(), worker_tls], NO_ANN, gate
                => format!("{c0}.volumeMounts[1]"), "tls-managed-mount",
                   "cannot use volume mount at path \"/etc/ray/tls\" in worker group \"small\" when tlsOptions is set";
            [on(), autoscaler.clone()], NO_ANN, gate
                => format!("{C}.autoscalerOptions.env[0]"), "tls-managed-env",
                   "cannot set RAY_TLS_SERVER_KEY environment variable in autoscalerOptions.env when tlsOptions is set - the operator manages TLS configuration for the autoscaler automatically";
            [on(), autoscaler], NO_ANN, gate
                => format!("{C}.autoscalerOptions.volumeMounts[0]"), "tls-managed-mount",
                   "cannot use volume mount at path \"/etc/ray/tls\" in autoscalerOptions.volumeMounts when tlsOptions is set";
        }
        allowed(&[on()], NO_ANN, gate);
        allowed(
            &[json!({"tlsOptions": {"enabled": false}}), use_tls()],
            NO_ANN,
            gate,
        );
    }

    #[test]
    fn every_failing_rule_is_reported() {
        let patches = [
            head_pod(json!({"containers": []})),
            json!({"rayVersion": null, "authOptions": {"mode": "token"}, "tlsOptions": {"enabled": true}, "networkPolicy": {},
                "headGroupSpec": {"rayStartParams": {"labels": "x", "redis-username": "u"}}}),
            wg(json!({"minReplicas": 4, "maxReplicas": 2, "suspend": true})),
        ];
        let v = run(&patches, NO_ANN, NO_GATES);
        let rules: Vec<_> = v.errors.iter().map(|e| e.rule).collect();
        let expected = [
            "head-containers",
            "group-start-params-labels",
            "worker-replica-bounds",
            "gcs-ft-redis-username",
            "worker-suspend-gate",
            "auth-token-ray-version",
            "network-policy-gate",
            "tls-gate",
        ];
        assert_eq!(rules, expected, "{:#?}", v.errors);
        assert!(
            v.denial_message()
                .contains("spec.rayClusterConfig.workerGroupSpecs[0].minReplicas: Invalid value: 4")
        );
    }

    #[test]
    fn weird_specs_do_not_panic() {
        let weird = [
            json!({"headGroupSpec": {}}),
            json!({"headGroupSpec": {"template": null}, "workerGroupSpecs": []}),
            json!({"headGroupSpec": {"template": {"spec": {"containers": [1, "x", null, {"env": "nope"}]}}}}),
            json!({"headGroupSpec": {"template": {"spec": {"restartPolicy": 5, "volumes": "x",
                    "containers": [{"env": [{}, {"name": 3}, {"value": "v"}], "volumeMounts": [1, {"name": 2}]}]}}},
                "enableInTreeAutoscaling": true,
                "autoscalerOptions": {"version": "v2", "env": [1, null], "volumeMounts": [{}]}}),
            json!({"headGroupSpec": {"template": []}, "rayVersion": "v",
                "gcsFaultToleranceOptions": {"backend": 7, "storage": 3, "redisAddress": 1},
                "authOptions": {"mode": 1, "enableK8sTokenAuth": "yes", "secretName": []},
                "historyServerOptions": {"collectorOptions": {"image": 5, "env": {"a": 1}}},
                "networkPolicy": {"mode": 3, "head": "x", "workerGroups": [1, {"groupName": 2}]},
                "tlsOptions": {"enabled": "true"}}),
            json!({"headGroupSpec": {"template": {}}, "rayVersion": "99999999999999999999999.1",
                "authOptions": {"mode": "token", "enableK8sTokenAuth": true}, "historyServerOptions": 4, "networkPolicy": [],
                "gcsFaultToleranceOptions": {"backend": "rocksdb", "storage": {"claimName": 1, "accessModes": "x"}},
                "workerGroupSpecs": [{"groupName": "", "priority": 3, "idleTimeoutSeconds": -1,
                    "minReplicas": -2147483648, "template": {"spec": {"containers": {}}}}]}),
            json!({"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-history-collector"}]}}},
                "rayVersion": "\u{e9}2.1", "historyServerOptions": {"collectorOptions": null},
                "tlsOptions": {"enabled": true}, "authOptions": null,
                "networkPolicy": {"workerGroups": {"\u{e9}": {"ingressRules": 1}}}}),
        ];
        let gates = [
            "GCSFaultToleranceEmbeddedStorage",
            "RayClusterHistoryServer",
            "RayClusterNetworkPolicy",
            "RayClusterMTLS",
        ];
        for spec in weird {
            check(spec.clone(), &[("ray.io/ft-enabled", "true")], NO_GATES);
            check(spec, &[], &gates);
        }
    }

    #[test]
    fn ray_versions_parse_like_kubernetes_generic_versions() {
        assert_eq!(parse_ray_version("2.52.0"), Ok(vec![2, 52, 0]));
        assert_eq!(parse_ray_version(" v2.52.1rc1"), Ok(vec![2, 52, 1]));
        assert_eq!(parse_ray_version("2.52"), Ok(vec![2, 52]));
        assert!(
            parse_ray_version("2")
                .unwrap_err()
                .contains("illegal version string")
        );
        assert!(parse_ray_version("02.1").unwrap_err().contains("zero-prefixed"));
        assert!(
            parse_ray_version("nightly")
                .unwrap_err()
                .contains("could not parse")
        );
        assert!(at_least(&[2, 52], &[2, 52, 0]));
        assert!(at_least(&[3, 0, 0], &[2, 56, 0]));
        assert!(!at_least(&[2, 51, 9], &[2, 52, 0]));
    }
}
