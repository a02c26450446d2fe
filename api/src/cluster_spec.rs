//! Change detection for `rayClusterConfig`: which changes need a new cluster and which can be applied in
//! place.
//!
//! Like KubeRay, replica counts (and `workersToDelete`, tolerations, scheduling gates, `suspend`,
//! `upgradeStrategy`) never force a new cluster. Unlike KubeRay, a change to min/max replicas is still
//! applied in place (KubeRay drops it, reference 9.13), and so is a change of `replicas` when the Ray
//! autoscaler is off: then nothing else would ever apply it. With the autoscaler on, `replicas` is the
//! autoscaler's. The digest is
//! rayshift's own (SHA-256 of canonical JSON), not KubeRay's Go-JSON SHA-1, so adoption of KubeRay's
//! clusters goes through an explicit rule (see the controller).

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::raycluster::RayClusterSpec;

/// Annotation with the digest of the spec a cluster was built from.
pub const SPEC_HASH_ANNOTATION: &str = "rayshift.io/spec-hash";
/// Annotation with the digest including min/max replicas (in-place scaling changes).
pub const SCALE_HASH_ANNOTATION: &str = "rayshift.io/scale-hash";
/// KubeRay's count of worker groups, used to recognise groups appended at the end.
pub const NUM_WORKER_GROUPS_ANNOTATION: &str = "ray.io/num-worker-groups";

/// The digests of one cluster spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecDigests {
    /// Changes here need a new cluster (NewCluster) or an in-place rebuild (None).
    pub spec: String,
    /// Also covers min/max replicas, and `replicas` when the autoscaler is off: changes here alone are
    /// applied in place.
    pub scale: String,
    /// `prefixes[k]`: the spec digest of the spec cut to its first `k` worker groups.
    pub prefixes: Vec<String>,
}

impl SpecDigests {
    pub fn of(spec: &RayClusterSpec) -> Self {
        let value = serde_json::to_value(spec).expect("cluster specs serialize");
        let groups = value
            .get("workerGroupSpecs")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        let prefixes = (0..=groups)
            .map(|k| digest(&without_scaling(&truncated(&value, k), Keep::Nothing)))
            .collect();
        let scale = if spec.autoscaling_enabled() {
            Keep::Bounds
        } else {
            Keep::BoundsAndReplicas
        };
        Self {
            spec: digest(&without_scaling(&value, Keep::Nothing)),
            scale: digest(&without_scaling(&value, scale)),
            prefixes,
        }
    }

    /// The goal only appends worker groups to a cluster built from `(spec digest, group count)`.
    pub fn only_appends_to(&self, cluster_spec: &str, cluster_groups: usize) -> bool {
        cluster_groups + 1 < self.prefixes.len()
            && self
                .prefixes
                .get(cluster_groups)
                .is_some_and(|p| p == cluster_spec)
    }
}

/// Taking over a cluster that rayshift did not build (KubeRay's, at a handover): it carries KubeRay's hash,
/// not rayshift's digests, so its digests are read from its own spec, as if rayshift had built it. The
/// lifecycle then treats it like any other cluster: same spec, kept as it is; only worker groups appended,
/// updated in place; anything else, upgraded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adoption {
    pub digests: SpecDigests,
    pub worker_groups: usize,
    /// It already runs the goal's spec (replica counts aside): no new cluster is needed.
    pub matches_goal: bool,
}

impl Adoption {
    pub fn of(cluster: &RayClusterSpec, goal: &SpecDigests) -> Self {
        let digests = SpecDigests::of(cluster);
        Self {
            matches_goal: digests.spec == goal.spec,
            worker_groups: cluster.worker_group_specs.as_ref().map_or(0, Vec::len),
            digests,
        }
    }
}

fn truncated(spec: &Value, groups: usize) -> Value {
    let mut spec = spec.clone();
    if let Some(list) = spec.get_mut("workerGroupSpecs").and_then(Value::as_array_mut) {
        list.truncate(groups);
    }
    spec
}

/// Which replica counts a digest covers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keep {
    Nothing,
    /// min/max replicas.
    Bounds,
    /// min/max and replicas (no autoscaler).
    BoundsAndReplicas,
}

/// Drops what never forces a new cluster, and the replica counts `keep` does not cover.
fn without_scaling(spec: &Value, keep: Keep) -> Value {
    let mut spec = spec.clone();
    if let Some(obj) = spec.as_object_mut() {
        for key in ["suspend", "upgradeStrategy"] {
            obj.remove(key);
        }
    }
    if let Some(template) = spec
        .pointer_mut("/headGroupSpec/template/spec")
        .and_then(Value::as_object_mut)
    {
        template.remove("tolerations");
        template.remove("schedulingGates");
    }
    if let Some(groups) = spec.get_mut("workerGroupSpecs").and_then(Value::as_array_mut) {
        for group in groups.iter_mut().filter_map(Value::as_object_mut) {
            if keep != Keep::BoundsAndReplicas {
                group.remove("replicas");
            }
            if keep == Keep::Nothing {
                group.remove("minReplicas");
                group.remove("maxReplicas");
            }
            if let Some(Value::Object(strategy)) = group.get_mut("scaleStrategy") {
                strategy.remove("workersToDelete");
                if strategy.is_empty() {
                    group.remove("scaleStrategy");
                }
            }
            if let Some(t) = group
                .get_mut("template")
                .and_then(|t| t.get_mut("spec"))
                .and_then(Value::as_object_mut)
            {
                t.remove("tolerations");
                t.remove("schedulingGates");
            }
        }
    }
    spec
}

/// SHA-256 of canonical JSON (object keys sorted: serde_json's map is ordered), as 32 hex digits.
fn digest(v: &Value) -> String {
    let bytes = serde_json::to_vec(v).expect("JSON values serialize");
    let sum = Sha256::digest(&bytes);
    sum.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(v: Value) -> RayClusterSpec {
        serde_json::from_value(v).unwrap()
    }

    fn base() -> Value {
        json!({
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "ray:1"}]}}},
            "workerGroupSpecs": [{"groupName": "g", "replicas": 1, "minReplicas": 1, "maxReplicas": 4,
                                  "template": {"spec": {"containers": [{"name": "w", "image": "ray:1"}]}}}]
        })
    }

    #[test]
    fn replicas_never_force_a_new_cluster() {
        let a = SpecDigests::of(&spec(base()));
        let mut v = base();
        v["workerGroupSpecs"][0]["replicas"] = json!(3);
        v["workerGroupSpecs"][0]["scaleStrategy"] = json!({"workersToDelete": ["x"]});
        v["suspend"] = json!(true);
        let b = SpecDigests::of(&spec(v));
        assert_eq!((&a.spec, &a.prefixes), (&b.spec, &b.prefixes));
        // Without the autoscaler, nothing else applies `replicas`: the change is applied in place.
        assert_ne!(a.scale, b.scale);
    }

    #[test]
    fn with_the_autoscaler_replicas_are_its_own() {
        let mut on = base();
        on["enableInTreeAutoscaling"] = json!(true);
        let a = SpecDigests::of(&spec(on.clone()));
        on["workerGroupSpecs"][0]["replicas"] = json!(3);
        assert_eq!(a, SpecDigests::of(&spec(on)));
    }

    #[test]
    fn min_max_change_only_the_scale_digest() {
        let a = SpecDigests::of(&spec(base()));
        let mut v = base();
        v["workerGroupSpecs"][0]["maxReplicas"] = json!(8);
        let b = SpecDigests::of(&spec(v));
        assert_eq!(a.spec, b.spec);
        assert_ne!(a.scale, b.scale);
    }

    #[test]
    fn image_change_needs_a_new_cluster() {
        let a = SpecDigests::of(&spec(base()));
        let mut v = base();
        v["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] = json!("ray:2");
        assert_ne!(a.spec, SpecDigests::of(&spec(v)).spec);
    }

    #[test]
    fn a_cluster_kuberay_built_from_the_same_config_is_adopted_as_it_is() {
        let goal = SpecDigests::of(&spec(base()));
        // KubeRay copies rayClusterConfig, drops a pending cluster's replicas, and the autoscaler moves them.
        let mut built = base();
        built["workerGroupSpecs"][0]
            .as_object_mut()
            .unwrap()
            .remove("replicas");
        let adopted = Adoption::of(&spec(built.clone()), &goal);
        assert!(adopted.matches_goal);
        assert_eq!(
            (adopted.digests.spec, adopted.worker_groups),
            (goal.spec.clone(), 1)
        );

        built["workerGroupSpecs"][0]["maxReplicas"] = json!(2);
        let adopted = Adoption::of(&spec(built.clone()), &goal);
        assert!(
            adopted.matches_goal,
            "min/max differ: applied in place, no new cluster"
        );
        assert_ne!(adopted.digests.scale, goal.scale);

        built["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] = json!("ray:0");
        assert!(!Adoption::of(&spec(built), &goal).matches_goal);
    }

    #[test]
    fn appended_worker_groups_are_recognised() {
        let a = SpecDigests::of(&spec(base()));
        let mut v = base();
        let mut extra = v["workerGroupSpecs"][0].clone();
        extra["groupName"] = json!("g2");
        v["workerGroupSpecs"].as_array_mut().unwrap().push(extra);
        let b = SpecDigests::of(&spec(v));
        assert_ne!(a.spec, b.spec);
        assert!(b.only_appends_to(&a.spec, 1));
        assert!(!a.only_appends_to(&a.spec, 1), "equal is not an append");
        assert!(!b.only_appends_to("other", 1));
    }
}
