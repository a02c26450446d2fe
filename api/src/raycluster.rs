//! `ray.io/v1` RayCluster: the parts rayshift reads, every other field kept verbatim.
//!
//! JSON names follow KubeRay exactly. Pod templates stay raw JSON ([`PodTemplate`]) so that no field a
//! user wrote is lost on the way from `rayClusterConfig` to the RayCluster object.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{schema, template_view};

/// Fields rayshift does not model, kept as written.
pub type Extra = BTreeMap<String, Value>;

/// `spec` of a RayCluster and `spec.rayClusterConfig` of a RayService.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ray.io",
    version = "v1",
    kind = "RayCluster",
    namespaced,
    status = "RayClusterStatus",
    category = "all",
    printcolumn = r#"{"name":"desired workers","type":"integer","jsonPath":".status.desiredWorkerReplicas"}"#,
    printcolumn = r#"{"name":"available workers","type":"integer","jsonPath":".status.availableWorkerReplicas"}"#,
    printcolumn = r#"{"name":"status","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct RayClusterSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_in_tree_autoscaling: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaler_options: Option<AutoscalerOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_version: Option<String>,
    pub head_group_spec: HeadGroupSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_group_specs: Option<Vec<WorkerGroupSpec>>,
    /// KubeRay's RayCluster controller rejects this inside a RayService; kept to report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_preserved_object")]
    pub upgrade_strategy: Option<Value>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct AutoscalerOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upscaling_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_preserved_list")]
    pub env: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_preserved_list")]
    pub volume_mounts: Option<Vec<Value>>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct HeadGroupSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_preserved_object")]
    pub head_service: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_string_map")]
    pub ray_start_params: Option<BTreeMap<String, String>>,
    /// Ray resources (`CPU`, `GPU`, custom) declared at the group level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_string_map")]
    pub resources: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_string_map")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub template: PodTemplate,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct WorkerGroupSpec {
    pub group_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_of_hosts: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_string_map")]
    pub ray_start_params: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_string_map")]
    pub resources: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_string_map")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_preserved_object")]
    pub scale_strategy: Option<Value>,
    #[serde(default)]
    pub template: PodTemplate,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// A core/v1 PodTemplateSpec kept as raw JSON; typed reads go through the accessors. Admission decodes
/// only the fields the accessors read ([`template_view`]).
#[derive(Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(transparent)]
pub struct PodTemplate(#[schemars(schema_with = "schema::preserved_object")] pub Value);

impl<'de> Deserialize<'de> for PodTemplate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        template_view::decode_template(d).map(Self)
    }
}

/// A container of a [`PodTemplate`], read-only view.
#[derive(Clone, Copy, Debug)]
pub struct ContainerView<'a>(pub &'a Value);

impl PodTemplate {
    /// `spec.<key>`. Not `Value::pointer`: it allocates for every segment, and admission reads these fields
    /// many times per review.
    pub fn spec_field(&self, key: &str) -> Option<&Value> {
        self.0.get("spec")?.get(key)
    }

    pub fn containers(&self) -> Vec<ContainerView<'_>> {
        self.spec_field("containers")
            .and_then(Value::as_array)
            .map(|cs| cs.iter().map(ContainerView).collect())
            .unwrap_or_default()
    }

    pub fn init_containers(&self) -> Vec<ContainerView<'_>> {
        self.spec_field("initContainers")
            .and_then(Value::as_array)
            .map(|cs| cs.iter().map(ContainerView).collect())
            .unwrap_or_default()
    }

    /// The Ray container: KubeRay treats the first container as the Ray container.
    pub fn ray_container(&self) -> Option<ContainerView<'_>> {
        self.containers().into_iter().next()
    }

    pub fn restart_policy(&self) -> Option<&str> {
        self.spec_field("restartPolicy").and_then(Value::as_str)
    }

    pub fn volume_names(&self) -> Vec<&str> {
        self.spec_field("volumes")
            .and_then(Value::as_array)
            .map(|vs| {
                vs.iter()
                    .filter_map(|v| v.get("name").and_then(Value::as_str))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl<'a> ContainerView<'a> {
    pub fn name(&self) -> Option<&'a str> {
        self.0.get("name").and_then(Value::as_str)
    }

    /// `(name, literal value)` of each env var; `valueFrom` vars have no literal value.
    pub fn env(&self) -> Vec<(&'a str, Option<&'a str>)> {
        self.0
            .get("env")
            .and_then(Value::as_array)
            .map(|es| {
                es.iter()
                    .filter_map(|e| {
                        let name = e.get("name")?.as_str()?;
                        Some((name, e.get("value").and_then(Value::as_str)))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn env_value(&self, name: &str) -> Option<Option<&'a str>> {
        self.env().into_iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// A resource quantity, requests first then limits (the scheduler reserves requests).
    pub fn resource(&self, resource: &str) -> Option<&'a str> {
        let from = |kind: &str| {
            self.0
                .get("resources")?
                .get(kind)?
                .get(resource)
                .and_then(|q| match q {
                    Value::String(s) => Some(s.as_str()),
                    _ => None,
                })
        };
        from("requests").or_else(|| from("limits"))
    }

    /// Numeric quantities written as bare YAML numbers (`nvidia.com/gpu: 1`).
    pub fn resource_number(&self, resource: &str) -> Option<f64> {
        ["requests", "limits"]
            .iter()
            .find_map(|kind| self.0.get("resources")?.get(kind)?.get(resource)?.as_f64())
    }

    pub fn volume_mounts(&self) -> Vec<(Option<&'a str>, Option<&'a str>)> {
        self.0
            .get("volumeMounts")
            .and_then(Value::as_array)
            .map(|ms| {
                ms.iter()
                    .map(|m| {
                        (
                            m.get("name").and_then(Value::as_str),
                            m.get("mountPath").and_then(Value::as_str),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `(name, containerPort)` of each declared port.
    pub fn ports(&self) -> Vec<(Option<&'a str>, i64)> {
        self.0
            .get("ports")
            .and_then(Value::as_array)
            .map(|ps| {
                ps.iter()
                    .filter_map(|p| {
                        Some((
                            p.get("name").and_then(Value::as_str),
                            p.get("containerPort")?.as_i64()?,
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// `status` of a RayCluster, as KubeRay's RayCluster controller writes it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct RayClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_worker_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_worker_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_worker_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<HeadInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct HeadInfo {
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    #[serde(default, rename = "serviceIP", skip_serializing_if = "Option::is_none")]
    pub service_ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl RayClusterSpec {
    pub fn worker_groups(&self) -> &[WorkerGroupSpec] {
        self.worker_group_specs.as_deref().unwrap_or_default()
    }

    pub fn autoscaling_enabled(&self) -> bool {
        self.enable_in_tree_autoscaling == Some(true)
    }

    /// The port of the head container named `dashboard`, which KubeRay's dashboard client reads off the head
    /// Service; Ray's default 8265 when the head names none.
    pub fn dashboard_port(&self) -> i64 {
        self.head_port("dashboard").unwrap_or(DEFAULT_DASHBOARD_PORT)
    }

    /// The Ray head container's port of this name.
    pub fn head_port(&self, name: &str) -> Option<i64> {
        let ray = self.head_group_spec.template.ray_container()?;
        let mut ports = ray.ports().into_iter();
        ports.find(|(n, _)| *n == Some(name)).map(|(_, port)| port)
    }

    /// The Secret whose `auth_token` a token-auth cluster's dashboard wants (`authOptions.mode: token`):
    /// `authOptions.secretName`, else the one KubeRay's operator creates for the cluster. `None`: no token.
    /// KubeRay 1.6's dashboard client reads the same Secret (token auth came in KubeRay 1.5.1).
    pub fn auth_token_secret(&self, cluster: &str) -> Option<String> {
        let auth = self.extra.get("authOptions")?;
        if auth.get("mode").and_then(Value::as_str) != Some("token") {
            return None;
        }
        match auth.get("secretName").and_then(Value::as_str) {
            Some(name) if !name.is_empty() => Some(name.to_string()),
            _ => Some(kuberay_object_name(cluster)),
        }
    }
}

/// How KubeRay names objects after a cluster (its `CheckName`): the last 50 characters, and a leading digit
/// or punctuation replaced by `r`. Names are ASCII (DNS labels).
fn kuberay_object_name(name: &str) -> String {
    const MAX: usize = 50;
    let tail = &name[name.len().saturating_sub(MAX)..];
    match tail.chars().next() {
        Some(c) if c.is_ascii_digit() || c.is_ascii_punctuation() => format!("r{}", &tail[1..]),
        _ => tail.to_string(),
    }
}

pub const DEFAULT_DASHBOARD_PORT: i64 = 8265;

/// Whether a head container port carries Ray Serve traffic: `serve`, or `serve-*` such as `serve-grpc`
/// (KubeRay's naming rule for the serve Service's ports).
pub fn is_serving_port(name: &str) -> bool {
    name == "serve" || name.starts_with("serve-")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(auth: Value) -> RayClusterSpec {
        serde_json::from_value(serde_json::json!({"headGroupSpec": {"template": {}}, "authOptions": auth}))
            .unwrap()
    }

    #[test]
    fn token_auth_names_the_secret_kuberay_reads() {
        let named = spec(serde_json::json!({"mode": "token", "secretName": "mine"}));
        assert_eq!(named.auth_token_secret("llm-abcde").as_deref(), Some("mine"));
        let own = spec(serde_json::json!({"mode": "token", "secretName": ""}));
        assert_eq!(own.auth_token_secret("llm-abcde").as_deref(), Some("llm-abcde"));
        for off in [
            serde_json::json!({"mode": "disabled"}),
            Value::Null,
            serde_json::json!({}),
        ] {
            assert_eq!(spec(off.clone()).auth_token_secret("llm-abcde"), None, "{off}");
        }
        // Cut to its last 50 characters: 60 with a dash at the cut, which becomes `r`.
        let long = format!("{}-{}", "a".repeat(10), "b".repeat(49));
        assert_eq!(own.auth_token_secret(&long), Some(format!("r{}", "b".repeat(49))));
        assert_eq!(kuberay_object_name("9lives"), "rlives");
        assert_eq!(kuberay_object_name("llm-abcde"), "llm-abcde");
    }
}
