//! A pending cluster that cannot get capacity (issue 18): its Pods stay Pending because the scheduler finds no
//! node with enough of a resource (`PodScheduled=False, reason Unschedulable`, "0/3 nodes are available: 3
//! Insufficient nvidia.com/gpu."). What is short, and by how much, read from the Pods alone: the resources the
//! scheduler names, times what the unschedulable Pods request of each.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::quantity;

/// One resource the scheduler could not find enough of.
#[derive(Clone, Debug, PartialEq)]
pub struct Shortfall {
    /// e.g. `nvidia.com/gpu`, `cpu`.
    pub resource: String,
    /// Pods that cannot be scheduled for lack of it.
    pub pods: u32,
    /// What those Pods request of it together (cores for `cpu`, bytes for `memory`, units otherwise).
    pub requested: f64,
}

/// The pending cluster's Pods that cannot be scheduled for lack of a resource; `None` when none are.
#[derive(Clone, Debug, PartialEq)]
pub struct Stall {
    pub shortfalls: Vec<Shortfall>,
    /// The scheduler's own words for one of the Pods.
    pub message: String,
}

impl Stall {
    /// One line for a condition or an event.
    pub fn describe(&self) -> String {
        let short: Vec<String> = self
            .shortfalls
            .iter()
            .map(|s| {
                format!(
                    "{} {} for {} Pod(s)",
                    quantity::shown(s.requested),
                    s.resource,
                    s.pods
                )
            })
            .collect();
        format!(
            "pending-cluster Pods cannot be scheduled, short of {} (scheduler: {})",
            short.join(", "),
            self.message.trim()
        )
    }
}

/// The stall of these Pods (a cluster's, any kind), if the scheduler said some lack a resource.
pub fn of(pods: &[Pod]) -> Option<Stall> {
    let mut short: BTreeMap<String, Shortfall> = BTreeMap::new();
    let mut message = None;
    for pod in pods {
        let Some(said) = unschedulable(pod) else {
            continue;
        };
        let requests = requests(pod);
        for resource in insufficient(said) {
            let entry = short.entry(resource.clone()).or_insert(Shortfall {
                resource: resource.clone(),
                pods: 0,
                requested: 0.0,
            });
            entry.pods += 1;
            entry.requested += requests.get(&resource).copied().unwrap_or(0.0);
        }
        message.get_or_insert_with(|| said.to_string());
    }
    let shortfalls: Vec<Shortfall> = short.into_values().collect();
    (!shortfalls.is_empty()).then(|| Stall {
        shortfalls,
        message: message.unwrap_or_default(),
    })
}

/// The scheduler's message of a Pod it could not place, if it could not.
fn unschedulable(pod: &Pod) -> Option<&str> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref().is_some_and(|p| p != "Pending") {
        return None;
    }
    let scheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled")?;
    let unschedulable = scheduled.status == "False" && scheduled.reason.as_deref() == Some("Unschedulable");
    unschedulable.then(|| scheduled.message.as_deref().unwrap_or_default())
}

/// The resources a scheduler message names as insufficient ("3 Insufficient nvidia.com/gpu", "Insufficient cpu").
fn insufficient(message: &str) -> Vec<String> {
    let mut out: Vec<String> = message
        .split("Insufficient ")
        .skip(1)
        .filter_map(|rest| {
            // The name ends at a comma or a space; a final "." ends the sentence ("nvidia.com/gpu." keeps the
            // dot inside).
            let end = rest.find([',', ' ']).unwrap_or(rest.len());
            let name = rest[..end].trim_end_matches('.');
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What the Pod requests, summed over its containers (a limit stands in for a request it lacks, as the
/// apiserver defaults it, e.g. for `nvidia.com/gpu`).
fn requests(pod: &Pod) -> BTreeMap<String, f64> {
    let mut sum = BTreeMap::new();
    let containers = pod.spec.iter().flat_map(|s| s.containers.iter());
    for r in containers.filter_map(|c| c.resources.as_ref()) {
        let mut asked: BTreeMap<&String, f64> = BTreeMap::new();
        for (name, q) in r.limits.iter().flatten().chain(r.requests.iter().flatten()) {
            asked.insert(name, quantity::parse(&q.0).unwrap_or(0.0));
        }
        for (name, v) in asked {
            *sum.entry(name.clone()).or_insert(0.0) += v;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str, scheduled: Option<(&str, &str, &str)>, gpus: &str) -> Pod {
        let conditions = scheduled.map(|(status, reason, message)| {
            serde_json::json!([{"type": "PodScheduled", "status": status, "reason": reason, "message": message}])
        });
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w"},
            "spec": {"containers": [{"name": "ray-worker", "image": "ray", "resources": {
                "limits": {"nvidia.com/gpu": gpus}, "requests": {"cpu": "500m"}}}]},
            "status": {"phase": phase, "conditions": conditions}
        }))
        .unwrap()
    }

    #[test]
    fn unschedulable_pods_name_what_is_short_and_by_how_much() {
        let said = "0/3 nodes are available: 1 node(s) had untolerated taint {node-role: control-plane}, 2 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.";
        let pods = [
            pod("Pending", Some(("False", "Unschedulable", said)), "2"),
            pod("Pending", Some(("False", "Unschedulable", said)), "2"),
            pod("Running", Some(("True", "", "")), "2"),
            pod("Pending", None, "2"),
        ];
        let stall = of(&pods).unwrap();
        assert_eq!(
            stall.shortfalls,
            vec![Shortfall {
                resource: "nvidia.com/gpu".into(),
                pods: 2,
                requested: 4.0
            }]
        );
        assert!(
            stall
                .describe()
                .starts_with("pending-cluster Pods cannot be scheduled, short of 4 nvidia.com/gpu for 2 Pod(s) (scheduler: 0/3"),
            "{}",
            stall.describe()
        );
    }

    #[test]
    fn several_resources_and_none() {
        let said = "0/2 nodes are available: 2 Insufficient cpu, 2 Insufficient nvidia.com/gpu.";
        let stall = of(&[pod("Pending", Some(("False", "Unschedulable", said)), "1")]).unwrap();
        let names: Vec<&str> = stall.shortfalls.iter().map(|s| s.resource.as_str()).collect();
        assert_eq!(names, ["cpu", "nvidia.com/gpu"]);
        assert_eq!(stall.shortfalls[0].requested, 0.5);
        let other = "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.";
        assert_eq!(
            of(&[pod("Pending", Some(("False", "Unschedulable", other)), "1")]),
            None
        );
        assert_eq!(of(&[]), None);
    }
}
