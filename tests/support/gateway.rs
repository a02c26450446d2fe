//! Test code playing a Gateway controller: it accepts every Gateway and HTTPRoute of a namespace by
//! writing their status conditions for the current generation. Acceptance can be withheld.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use gateway_api::{gateways::Gateway, httproutes::HttpRoute};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;

pub struct GatewayStandIn {
    pub accept: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GatewayStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn cond(type_: &str, generation: Option<i64>, message: &str) -> serde_json::Value {
    json!({"type": type_, "status": "True", "reason": type_, "message": message,
           "observedGeneration": generation, "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// Reports every Gateway of the namespace Accepted and Programmed for its current generation.
pub async fn accept_gateways(gateways: &Api<Gateway>, message: &str) {
    for gw in gateways
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let g = gw.metadata.generation;
        let done = gw
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Programmed" && c.observed_generation == g)
            });
        if !done {
            let status = json!({"status": {"conditions": [cond("Accepted", g, message), cond("Programmed", g, message)]}});
            let _ = gateways
                .patch_status(&gw.name_any(), &PatchParams::default(), &Patch::Merge(&status))
                .await;
        }
    }
}

/// Reports this version of the route Accepted with its refs resolved (for the generation it has).
pub async fn accept_route(
    routes: &Api<HttpRoute>,
    ns: &str,
    route: &HttpRoute,
    controller: &str,
    message: &str,
) {
    let g = route.metadata.generation;
    let done = route.status.as_ref().is_some_and(|s| {
        s.parents.iter().any(|p| {
            p.conditions
                .iter()
                .any(|c| c.type_ == "Accepted" && c.observed_generation == g)
        })
    });
    if done {
        return;
    }
    let parent = route
        .spec
        .parent_refs
        .as_ref()
        .and_then(|p| p.first())
        .map(|p| p.name.clone())
        .unwrap_or_default();
    let status = json!({"status": {"parents": [{
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": parent, "namespace": ns},
        "controllerName": controller,
        "conditions": [cond("Accepted", g, message), cond("ResolvedRefs", g, message)]
    }]}});
    let _ = routes
        .patch_status(&route.name_any(), &PatchParams::default(), &Patch::Merge(&status))
        .await;
}

impl GatewayStandIn {
    pub fn start(client: Client, ns: &str) -> Self {
        let accept = Arc::new(AtomicBool::new(true));
        let on = accept.clone();
        let ns = ns.to_string();
        let task = tokio::spawn(async move {
            let gateways: Api<Gateway> = Api::namespaced(client.clone(), &ns);
            let routes: Api<HttpRoute> = Api::namespaced(client.clone(), &ns);
            let message = "accepted by the test gateway controller";
            loop {
                if on.load(Ordering::Relaxed) {
                    accept_gateways(&gateways, message).await;
                    for route in routes
                        .list(&ListParams::default())
                        .await
                        .map(|l| l.items)
                        .unwrap_or_default()
                    {
                        accept_route(
                            &routes,
                            &ns,
                            &route,
                            "example.com/test-gateway-controller",
                            message,
                        )
                        .await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        GatewayStandIn { accept, task }
    }
}
