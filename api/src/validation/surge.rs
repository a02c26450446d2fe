//! The seed's maxSurgePercent advice: one surge step should be able to schedule at least one whole worker
//! pod, i.e. maxSurgePercent >= resources per pod / group resources at maxReplicas x 100.

use super::Verdict;
use crate::{
    quantity,
    raycluster::{RayClusterSpec, WorkerGroupSpec},
};

/// KubeRay's CRD default for an unset maxReplicas: effectively "unbounded", no useful share.
const UNBOUNDED_REPLICAS: i32 = i32::MAX;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Resource {
    Gpu,
    Cpu,
}

impl Resource {
    fn name(self) -> &'static str {
        match self {
            Resource::Gpu => "GPU",
            Resource::Cpu => "CPU",
        }
    }
}

/// Amount of `resource` one pod of the group asks for.
fn per_pod(group: &WorkerGroupSpec, resource: Resource) -> f64 {
    let param = match resource {
        Resource::Gpu => "num-gpus",
        Resource::Cpu => "num-cpus",
    };
    if let Some(v) = group
        .ray_start_params
        .as_ref()
        .and_then(|p| p.get(param))
        .and_then(|v| quantity::parse(v))
    {
        return v;
    }
    if let Some(v) = group
        .resources
        .as_ref()
        .and_then(|r| r.get(resource.name()))
        .and_then(|v| quantity::parse(v))
    {
        return v;
    }
    let Some(ray) = group.template.ray_container() else {
        return 0.0;
    };
    match resource {
        Resource::Cpu => ray
            .resource("cpu")
            .and_then(quantity::parse)
            .or_else(|| ray.resource_number("cpu"))
            .unwrap_or(0.0),
        Resource::Gpu => ["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915"]
            .iter()
            .filter_map(|r| {
                ray.resource(r)
                    .and_then(quantity::parse)
                    .or_else(|| ray.resource_number(r))
            })
            .sum(),
    }
}

/// Pods the group can reach: maxReplicas (or replicas when unbounded) times hosts per replica.
fn max_pods(group: &WorkerGroupSpec) -> Option<i64> {
    let replicas = match group.max_replicas {
        Some(m) if m > 0 && m < UNBOUNDED_REPLICAS => m,
        _ => group.replicas.filter(|r| *r > 0)?,
    };
    Some(i64::from(replicas) * i64::from(group.num_of_hosts.unwrap_or(1).max(1)))
}

/// Warns for each group where one pod is a larger share than a surge step.
pub(crate) fn check(cluster: &RayClusterSpec, max_surge: i32, field: &str, v: &mut Verdict) {
    let groups = cluster.worker_groups();
    let resource = if groups.iter().any(|g| per_pod(g, Resource::Gpu) > 0.0) {
        Resource::Gpu
    } else {
        Resource::Cpu
    };
    for g in groups {
        let pod = per_pod(g, resource);
        let Some(pods) = max_pods(g) else { continue };
        if pod <= 0.0 {
            continue;
        }
        let total = pod * pods as f64;
        let share = pod / total * 100.0;
        if f64::from(max_surge) < share {
            let needed = share.ceil() as i64;
            v.warn(
                field,
                "max-surge-below-pod-share",
                format!(
                    "maxSurgePercent {max_surge} is smaller than one worker pod's share of group {:?} \
                     ({} {} of {} at {} pods = {:.1}%): a surge step cannot schedule a whole pod; use at least {needed}",
                    g.group_name,
                    quantity::shown(pod),
                    resource.name(),
                    quantity::shown(total),
                    pods,
                    share
                ),
            );
        }
    }
}
