//! Builders for the objects a RayService owns: its RayClusters, its head and serve Services, and in incremental
//! mode its Gateway, HTTPRoute and per-cluster serve Services.
//!
//! Pure functions from the RayService to bodies for server-side apply (Gateway API objects typed). Labels KubeRay's RayCluster
//! controller depends on are set exactly (`ray.io/originated-from-crd: RayService` changes how it labels and
//! probes Pods, reference 4).

use std::collections::BTreeMap;

use gateway_api::{gateways::Gateway, grpcroutes::GrpcRoute, httproutes::HttpRoute};
use kube::ResourceExt;
use rayshift_api::{
    RayCluster, RayService,
    cluster_spec::{NUM_WORKER_GROUPS_ANNOTATION, SCALE_HASH_ANNOTATION, SPEC_HASH_ANNOTATION, SpecDigests},
    gateway_attachment::Attachment,
    raycluster::is_serving_port,
};
use serde_json::{Map, Value, json};

pub const ORIGINATED_FROM_CR_NAME: &str = "ray.io/originated-from-cr-name";
pub const ORIGINATED_FROM_CRD: &str = "ray.io/originated-from-crd";
pub const CLUSTER_LABEL: &str = "ray.io/cluster";
pub const NODE_TYPE_LABEL: &str = "ray.io/node-type";
pub const SERVE_LABEL: &str = "ray.io/serve";
/// The Serve config (serveConfigV2 text) a cluster runs: kept on the cluster so that a restarted
/// controller changes its capacity with its own config, never with a newer spec's.
pub const SERVE_CONFIG_ANNOTATION: &str = "rayshift.io/serve-config";
/// Digest of what rayshift last applied to a child, to skip writes that would change nothing.
pub const APPLIED_ANNOTATION: &str = "rayshift.io/applied";

const DEFAULT_HEAD_PORTS: &[(&str, i64)] = &[
    ("client", 10001),
    ("dashboard", 8265),
    ("gcs-server", 6379),
    ("metrics", 8080),
    ("serve", 8000),
];
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `<rs>-<5 random chars>`, KubeRay's alphabet (no vowels, no look-alikes).
pub fn cluster_name(rs: &str) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    let suffix: String = (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{rs}-{suffix}")
}

pub fn head_service_name(rs: &str) -> String {
    format!("{rs}-head-svc")
}

/// The serve Service's name: the user's template name, or `<rs>-serve-svc`.
pub fn serve_service_name(rs: &RayService) -> String {
    rs.spec
        .serve_service
        .as_ref()
        .and_then(|s| s.pointer("/metadata/name"))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map_or_else(|| format!("{}-serve-svc", rs.name_any()), str::to_string)
}

/// Labels that tie an object to its RayService (also the list selector for its clusters).
pub fn association_labels(rs: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (ORIGINATED_FROM_CR_NAME.to_string(), rs.to_string()),
        (ORIGINATED_FROM_CRD.to_string(), "RayService".to_string()),
    ])
}

pub fn cluster_selector(rs: &str) -> String {
    association_labels(rs)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn owner_reference(rs: &RayService) -> Value {
    json!({
        "apiVersion": "ray.io/v1", "kind": "RayService", "name": rs.name_any(),
        "uid": rs.metadata.uid.clone().unwrap_or_default(), "controller": true, "blockOwnerDeletion": true
    })
}

/// The RayCluster `name` built from the RayService's current spec.
///
/// `replicas_from`: worker replica counts to keep (group name to replicas), so an in-place rebuild does not
/// fight the autoscaler; `unset_replicas`: leave worker replicas unset (a pending cluster of an incremental
/// upgrade starts from minReplicas, as in KubeRay); `serve_config`: the Serve config the cluster runs, recorded
/// on it (at creation the spec's, so that no second write records it after the first push; in place the one
/// it has, because a server-side apply without it would remove it).
pub fn ray_cluster(
    rs: &RayService,
    name: &str,
    replicas_from: Option<&BTreeMap<String, Value>>,
    unset_replicas: bool,
    serve_config: Option<&str>,
) -> Value {
    let digests = SpecDigests::of(&rs.spec.ray_cluster_config);
    let mut spec = serde_json::to_value(&rs.spec.ray_cluster_config).expect("cluster specs serialize");
    let groups = spec
        .get("workerGroupSpecs")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if let Some(list) = spec.get_mut("workerGroupSpecs").and_then(Value::as_array_mut) {
        for group in list.iter_mut().filter_map(Value::as_object_mut) {
            let gname = group
                .get("groupName")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if unset_replicas {
                group.remove("replicas");
            } else if let Some(r) = replicas_from.and_then(|m| m.get(&gname)) {
                group.insert("replicas".into(), r.clone());
            }
        }
    }
    let mut labels = rs.labels().clone();
    labels.extend(association_labels(&rs.name_any()));
    let mut annotations = rs.annotations().clone();
    annotations.insert(SPEC_HASH_ANNOTATION.into(), digests.spec);
    annotations.insert(SCALE_HASH_ANNOTATION.into(), digests.scale);
    annotations.insert(NUM_WORKER_GROUPS_ANNOTATION.into(), groups.to_string());
    if let Some(config) = serve_config {
        annotations.insert(SERVE_CONFIG_ANNOTATION.into(), config.to_string());
    }
    json!({
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": name,
            "namespace": rs.namespace(),
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(rs)],
        },
        "spec": spec,
    })
}

/// Ports of the Ray head container: `(name, port)`; KubeRay's defaults when it declares none.
fn head_ports(rs: &RayService) -> Vec<(String, i64)> {
    let template = &rs.spec.ray_cluster_config.head_group_spec.template;
    let declared: Vec<(String, i64)> = template
        .ray_container()
        .map(|c| {
            c.ports()
                .into_iter()
                .map(|(n, p)| (n.map_or_else(|| format!("{p}-port"), str::to_string), p))
                .collect()
        })
        .unwrap_or_default();
    if !declared.is_empty() {
        return declared;
    }
    DEFAULT_HEAD_PORTS
        .iter()
        .map(|(n, p)| (n.to_string(), *p))
        .collect()
}

/// Port named `serve` of the head container (KubeRay's default 8000).
pub fn serve_port(rs: &RayService) -> i64 {
    rs.spec.ray_cluster_config.head_port("serve").unwrap_or(8000)
}

/// The head container's Serve ports (`serve`, `serve-*`), which the serve Services expose.
pub fn serving_ports(rs: &RayService) -> Vec<(String, i64)> {
    head_ports(rs)
        .into_iter()
        .filter(|(n, _)| is_serving_port(n))
        .collect()
}

/// `headGroupSpec.serviceType`, which KubeRay gives both Services (empty: the API's default, ClusterIP).
fn service_type(rs: &RayService) -> &str {
    let head = &rs.spec.ray_cluster_config.head_group_spec;
    head.service_type.as_deref().unwrap_or_default()
}

/// `<rs>-head-svc`, selecting the head Pod of `cluster`. A `headService` is the base, as in KubeRay: its
/// annotations and spec stay, the selector is rayshift's, the head's ports are added (the user's win a clash),
/// and the type is filled in when empty. Without one the Service is headless unless a type is asked for or
/// `cluster_ip` (KubeRay's `ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE`).
pub fn head_service(rs: &RayService, cluster: &str, cluster_ip: bool) -> Value {
    let rs_name = rs.name_any();
    let mut ports = head_ports(rs);
    if !ports.iter().any(|(n, _)| n == "metrics") {
        ports.push(("metrics".into(), 8080));
    }
    ports.sort();
    let mut labels = association_labels(&rs_name);
    labels.insert(NODE_TYPE_LABEL.into(), "head".into());
    labels.insert("ray.io/identifier".into(), format!("{rs_name}-head"));
    let selector = json!({CLUSTER_LABEL: cluster, NODE_TYPE_LABEL: "head"});
    let ports: Vec<Value> = (ports.iter())
        .map(|(n, p)| json!({"name": n, "port": p, "targetPort": p, "protocol": "TCP", "appProtocol": "tcp"}))
        .collect();
    let head = &rs.spec.ray_cluster_config.head_group_spec;
    let Some(template) = head.head_service.as_ref().filter(|t| t.is_object()) else {
        let mut spec = json!({"selector": selector, "ports": ports});
        match service_type(rs) {
            "" | "ClusterIP" if !cluster_ip => {
                spec["clusterIP"] = json!("None");
                spec["publishNotReadyAddresses"] = json!(true);
            }
            "" => {}
            other => spec["type"] = json!(other),
        }
        return service(rs, &head_service_name(&rs_name), labels, spec);
    };
    let mut spec = template.get("spec").cloned().unwrap_or_else(|| json!({}));
    spec["selector"] = selector;
    spec["ports"] = Value::Array(merge_ports(template, ports));
    based_on(rs, template, &head_service_name(&rs_name), labels, spec)
}

/// The serve Service, selecting the serving Pods of `cluster`; the user's `serveService` is the base.
/// `None` when it would have no port: the head declares no Serve port and `serveService` none either.
pub fn serve_service(rs: &RayService, cluster: &str) -> Option<Value> {
    with_ports(serve_service_body(rs, cluster))
}

/// A Service only if it has a port, since the apiserver refuses one without (unless headless).
fn with_ports(svc: Value) -> Option<Value> {
    let ports = svc.pointer("/spec/ports").and_then(Value::as_array);
    ports.is_some_and(|p| !p.is_empty()).then_some(svc)
}

fn serve_service_body(rs: &RayService, cluster: &str) -> Value {
    let rs_name = rs.name_any();
    let template = rs.spec.serve_service.clone().unwrap_or_else(|| json!({}));
    let ports = (serving_ports(rs).into_iter())
        .map(|(n, p)| json!({"name": n, "port": p, "targetPort": p, "protocol": "TCP"}))
        .collect();
    let mut labels = association_labels(&rs_name);
    labels.insert(SERVE_LABEL.into(), format!("{rs_name}-serve"));
    let mut spec = template.get("spec").cloned().unwrap_or_else(|| json!({}));
    spec["selector"] = json!({CLUSTER_LABEL: cluster, SERVE_LABEL: "true"});
    spec["ports"] = Value::Array(merge_ports(&template, ports));
    based_on(rs, &template, &serve_service_name(rs), labels, spec)
}

/// The user's ports of a Service template, then `ours` that clash with none of them by name or port: on a clash
/// the user's port wins (it keeps its appProtocol). Server-side apply keys Service ports by (port, protocol),
/// so the protocol is made explicit.
fn merge_ports(template: &Value, ours: Vec<Value>) -> Vec<Value> {
    let user: Vec<Value> = (template.pointer("/spec/ports").and_then(Value::as_array))
        .cloned()
        .unwrap_or_default();
    let clashes =
        |p: &Value| (user.iter()).any(|u| u.get("name") == p.get("name") || u.get("port") == p.get("port"));
    let mut ports = user.clone();
    ports.extend(ours.into_iter().filter(|p| !clashes(p)));
    for p in ports.iter_mut().filter(|p| p.get("protocol").is_none()) {
        p["protocol"] = json!("TCP");
    }
    ports
}

/// A Service from a user's template: its labels under rayshift's, its annotations, and
/// `headGroupSpec.serviceType` when it names no type.
fn based_on(
    rs: &RayService,
    template: &Value,
    name: &str,
    ours: BTreeMap<String, String>,
    mut spec: Value,
) -> Value {
    let mut labels: BTreeMap<String, String> = (template.pointer("/metadata/labels"))
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default();
    labels.extend(ours);
    let typed = spec
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty());
    let default_type = service_type(rs);
    if !typed && !default_type.is_empty() {
        spec["type"] = json!(default_type);
    }
    let mut svc = service(rs, name, labels, spec);
    if let Some(annotations) = template
        .pointer("/metadata/annotations")
        .filter(|a| a.is_object())
    {
        svc["metadata"]["annotations"] = annotations.clone();
    }
    svc
}

fn service(rs: &RayService, name: &str, labels: BTreeMap<String, String>, spec: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": rs.namespace(),
            "labels": labels,
            "ownerReferences": [owner_reference(rs)],
        },
        "spec": spec,
    })
}

/// Adds the digest of the body as an annotation, so an unchanged child is never written again.
pub fn stamp(mut body: Value) -> (Value, String) {
    let digest = {
        let text = serde_json::to_vec(&body).expect("JSON values serialize");
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        format!("{h:016x}")
    };
    let meta = body["metadata"].as_object_mut().expect("bodies have metadata");
    let annotations = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    annotations[APPLIED_ANNOTATION] = Value::from(digest.clone());
    (body, digest)
}

/// The listeners of rayshift's own Gateway.
pub const HTTP_LISTENER: &str = "http";
pub const GRPC_LISTENER: &str = "grpc";

/// The Gateway of an incremental RayService (one per RayService, HTTP on port 80, gRPC on Serve's port).
pub fn gateway_name(rs: &str) -> String {
    format!("{rs}-gateway")
}

/// Its HTTPRoute, whose backend weights are the traffic split.
pub fn route_name(rs: &str) -> String {
    format!("{rs}-httproute")
}

/// The serve Service of one cluster (incremental mode routes to each cluster through its own).
pub fn cluster_serve_service_name(cluster: &str) -> String {
    format!("{cluster}-serve-svc")
}

/// One cluster's serve Service, owned by that cluster so it goes with it (`None` without a port, as above).
pub fn cluster_serve_service(rs: &RayService, cluster: &RayCluster) -> Option<Value> {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let mut body = serve_service_body(rs, &name);
    body["metadata"]["name"] = json!(cluster_serve_service_name(&name));
    body["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "name": name,
        "uid": cluster.metadata.uid.clone().unwrap_or_default(), "controller": true, "blockOwnerDeletion": true
    }]);
    body["metadata"]["labels"][ORIGINATED_FROM_CR_NAME] = json!(name);
    body["metadata"]["labels"][SERVE_LABEL] = json!(format!("{name}-serve"));
    if let Some(port) = grpc_port(rs) {
        add_grpc_port(&mut body, port);
    }
    with_ports(body)
}

/// Serve's gRPC port on a serve Service, as HTTP/2 cleartext (`kubernetes.io/h2c`) so that a Gateway speaks
/// HTTP/2 to it; a port of the user's with that number is kept as it is (its own appProtocol).
fn add_grpc_port(service: &mut Value, port: i64) {
    let Some(ports) = service["spec"]["ports"].as_array_mut() else {
        return;
    };
    if !ports.iter().any(|p| p["port"] == port) {
        ports.push(
            json!({"name": "grpc", "port": port, "targetPort": port, "protocol": "TCP",
                          "appProtocol": "kubernetes.io/h2c"}),
        );
    }
}

/// The RayService's Gateway, of its `gatewayClassName`.
pub fn gateway(rs: &RayService, ns: &str) -> Gateway {
    let class = rs
        .spec
        .cluster_upgrade_options()
        .and_then(|o| o.gateway_class_name.clone())
        .unwrap_or_default();
    let name = rs.metadata.name.clone().unwrap_or_default();
    let mut listeners = vec![json!({"name": HTTP_LISTENER, "protocol": "HTTP", "port": 80})];
    if let Some(port) = grpc_port(rs) {
        // gRPC is HTTP/2 on a listener of its own, so the HTTPRoute's catch-all never takes it.
        listeners.push(json!({"name": GRPC_LISTENER, "protocol": "HTTP", "port": port,
                              "allowedRoutes": {"kinds": [{"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"}]}}));
    }
    serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": gateway_name(&name), "namespace": ns, "ownerReferences": [owner_reference(rs)]},
        "spec": {"gatewayClassName": class, "listeners": listeners}
    }))
    .expect("a well-formed Gateway")
}

/// The weighted backends of a route, one per `(cluster, weight)`, each through the cluster's serve Service.
pub fn backend_refs(rs: &RayService, ns: &str, weights: &[(String, i32)]) -> Value {
    backends_on_port(ns, weights, serve_port(rs))
}

fn backends_on_port(ns: &str, weights: &[(String, i32)], port: i64) -> Value {
    weights
        .iter()
        .map(|(cluster, weight)| {
            json!({"group": "", "kind": "Service", "name": cluster_serve_service_name(cluster), "namespace": ns,
                   "port": port, "weight": weight})
        })
        .collect()
}

/// The Gateway (and listener) rayshift's own route attaches to: its own, or a shared one.
pub fn route_parent(rs: &RayService, ns: &str, attachment: &Attachment) -> Value {
    let name = rs.metadata.name.clone().unwrap_or_default();
    let mut parent = json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway_name(&name), "namespace": ns});
    if let Attachment::SharedGateway(gw) = attachment {
        parent["name"] = json!(gw.name);
        parent["namespace"] = json!(gw.namespace);
        if let Some(listener) = &gw.listener {
            parent["sectionName"] = json!(listener);
        }
    } else if grpc_port(rs).is_some() {
        parent["sectionName"] = json!(HTTP_LISTENER);
    }
    parent
}

/// The Gateway (and listener) rayshift's GRPCRoute attaches to.
pub fn grpc_route_parent(rs: &RayService, ns: &str, attachment: &Attachment) -> Value {
    let mut parent = route_parent(rs, ns, attachment);
    let listener = match attachment {
        Attachment::SharedGateway(gw) => gw.grpc_listener.as_deref(),
        _ => Some(GRPC_LISTENER),
    };
    match listener {
        Some(l) => parent["sectionName"] = json!(l),
        None => {
            parent.as_object_mut().map(|p| p.remove("sectionName"));
        }
    }
    parent
}

/// Serve's gRPC port, when its config serves gRPC.
pub fn grpc_port(rs: &RayService) -> Option<i64> {
    rayshift_api::serve_grpc::grpc_port(rs.spec.serve_config_v2.as_deref())
}

/// `<rs>-grpcroute`: the gRPC share of the traffic, with the HTTPRoute's weights.
pub fn grpc_route_name(rs: &str) -> String {
    format!("{rs}-grpcroute")
}

/// The RayService's GRPCRoute, one weighted backend per `(cluster, weight)` on the serve Services' gRPC port.
pub fn grpc_route(
    rs: &RayService,
    ns: &str,
    attachment: &Attachment,
    weights: &[(String, i32)],
) -> GrpcRoute {
    let name = rs.metadata.name.clone().unwrap_or_default();
    let port = grpc_port(rs).unwrap_or(rayshift_api::serve_grpc::DEFAULT_GRPC_PORT);
    let backends = backends_on_port(ns, weights, port);
    serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
        "metadata": {"name": grpc_route_name(&name), "namespace": ns, "ownerReferences": [owner_reference(rs)]},
        "spec": {"parentRefs": [grpc_route_parent(rs, ns, attachment)], "rules": [{"backendRefs": backends}]}
    }))
    .expect("a well-formed GRPCRoute")
}

/// The RayService's own HTTPRoute with one weighted backend per `(cluster, weight)`.
pub fn http_route(
    rs: &RayService,
    ns: &str,
    attachment: &Attachment,
    weights: &[(String, i32)],
) -> HttpRoute {
    let name = rs.metadata.name.clone().unwrap_or_default();
    serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": route_name(&name), "namespace": ns, "ownerReferences": [owner_reference(rs)]},
        "spec": {
            "parentRefs": [route_parent(rs, ns, attachment)],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": backend_refs(rs, ns, weights)}]
        }
    }))
    .expect("a well-formed HTTPRoute")
}

/// The index of the rule rayshift manages in an adopted route: the one named, else the first.
pub fn adopted_rule_index(route: &Value, rule: Option<&str>) -> Option<usize> {
    let rules = route["spec"]["rules"].as_array()?;
    match rule {
        Some(name) => rules.iter().position(|r| r["name"] == name),
        None => (!rules.is_empty()).then_some(0),
    }
}

/// Whether the managed rule of an adopted route sends its traffic to this RayService's clusters, through their
/// own serve Services (`<rs>-<suffix>-serve-svc`), as only rayshift's incremental routing sets it: the marker
/// that rayshift routed it, so that after a switch to another strategy it keeps following the active cluster.
/// A rule with no backends, or one the user pointed elsewhere (the RayService's `<rs>-serve-svc` included,
/// which follows the active cluster by itself), is not rayshift's to move.
pub fn routes_to_clusters_of(route: &Value, index: usize, rs: &str) -> bool {
    let prefix = format!("{rs}-");
    let ours = |b: &Value| {
        let name = b["name"].as_str().unwrap_or_default();
        let kind_service = b["kind"].as_str().is_none_or(|k| k == "Service");
        let cluster = name
            .strip_suffix("-serve-svc")
            .and_then(|c| c.strip_prefix(&prefix));
        kind_service && cluster.is_some_and(|suffix| !suffix.is_empty())
    };
    route["spec"]["rules"][index]["backendRefs"]
        .as_array()
        .is_some_and(|backends| !backends.is_empty() && backends.iter().all(ours))
}

/// Whether rule `index` of the route sends all of its traffic to the Service `service`.
pub fn all_traffic_to(route: &Value, index: usize, service: &str) -> bool {
    route["spec"]["rules"][index]["backendRefs"]
        .as_array()
        .is_some_and(|b| {
            b.len() == 1 && b[0]["name"] == service && b[0]["weight"].as_i64().is_none_or(|w| w > 0)
        })
}

/// A JSON patch that sets only the managed rule's backendRefs of an adopted route, or `None` when they are
/// already `backends`. The route's `rules` list is atomic in the upstream CRD, so server-side apply could
/// only own all of it; this patch instead touches one field and fails (409/422) if the route or the
/// rule's place changed since it was read.
pub fn adopted_route_patch(
    route: &Value,
    index: usize,
    rule: Option<&str>,
    backends: &Value,
) -> Option<json_patch::Patch> {
    let current = &route["spec"]["rules"][index]["backendRefs"];
    if current == backends {
        return None;
    }
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": route["metadata"]["resourceVersion"]}),
    ];
    if let Some(name) = rule {
        ops.push(json!({"op": "test", "path": format!("/spec/rules/{index}/name"), "value": name}));
    }
    let op = if current.is_null() { "add" } else { "replace" };
    ops.push(json!({"op": op, "path": format!("/spec/rules/{index}/backendRefs"), "value": backends}));
    Some(serde_json::from_value(Value::Array(ops)).expect("well-formed JSON patch operations"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rs() -> RayService {
        let mut rs: RayService = serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "llm", "namespace": "ns", "uid": "u1", "labels": {"team": "ml"}},
            "spec": {
                "serveService": {"metadata": {"name": "custom-serve"}, "spec": {"ports": [{"name": "serve", "port": 8000, "appProtocol": "http"}]}},
                "rayClusterConfig": {
                    "enableInTreeAutoscaling": true,
                    "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "ray",
                        "ports": [{"name": "dashboard", "containerPort": 8265}, {"name": "serve", "containerPort": 8000}, {"containerPort": 9999}]}]}}},
                    "workerGroupSpecs": [{"groupName": "g", "replicas": 2, "minReplicas": 1, "maxReplicas": 4,
                        "template": {"spec": {"containers": [{"name": "w"}]}}, "futureField": 1}]
                }
            }
        }))
        .unwrap();
        rs.metadata.uid = Some("u1".into());
        rs
    }

    #[test]
    fn cluster_keeps_every_field_and_sets_kuberay_labels() {
        let c = ray_cluster(&rs(), "llm-bcdfg", None, false, Some("applications: []"));
        assert_eq!(c["metadata"]["labels"][ORIGINATED_FROM_CRD], "RayService");
        assert_eq!(c["metadata"]["labels"][ORIGINATED_FROM_CR_NAME], "llm");
        assert_eq!(c["metadata"]["labels"]["team"], "ml");
        assert_eq!(c["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(c["spec"]["workerGroupSpecs"][0]["futureField"], 1, "lossless");
        assert_eq!(c["spec"]["workerGroupSpecs"][0]["replicas"], 2);
        assert_eq!(c["metadata"]["annotations"][NUM_WORKER_GROUPS_ANNOTATION], "1");
        assert_eq!(
            c["metadata"]["annotations"][SERVE_CONFIG_ANNOTATION],
            "applications: []"
        );
        let pending = ray_cluster(&rs(), "llm-bcdfg", None, true, None);
        assert!(
            pending["metadata"]["annotations"]
                .get(SERVE_CONFIG_ANNOTATION)
                .is_none()
        );
        assert!(pending["spec"]["workerGroupSpecs"][0].get("replicas").is_none());
        let kept = BTreeMap::from([("g".to_string(), json!(3))]);
        assert_eq!(
            ray_cluster(&rs(), "x", Some(&kept), false, None)["spec"]["workerGroupSpecs"][0]["replicas"],
            3
        );
    }

    #[test]
    fn services_select_the_target_cluster() {
        let head = head_service(&rs(), "llm-bcdfg", false);
        assert_eq!(head["metadata"]["name"], "llm-head-svc");
        assert_eq!(head["spec"]["selector"][CLUSTER_LABEL], "llm-bcdfg");
        assert_eq!(head["spec"]["clusterIP"], "None");
        let names: Vec<&str> = head["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["9999-port", "dashboard", "metrics", "serve"]);
        let serve = serve_service(&rs(), "llm-bcdfg").unwrap();
        assert_eq!(serve["metadata"]["name"], "custom-serve");
        assert_eq!(serve["spec"]["selector"][SERVE_LABEL], "true");
        assert_eq!(
            serve["spec"]["ports"][0]["appProtocol"], "http",
            "the user's port wins"
        );
    }

    /// KubeRay's `BuildServiceForHeadPod` and `BuildServeService`: `serviceType` types both Services, and a
    /// `headService` is the head Service's base.
    #[test]
    fn services_take_the_service_type_and_the_head_service_template() {
        let mut rs = rs();
        let head = &mut rs.spec.ray_cluster_config.head_group_spec;
        head.service_type = Some("NodePort".into());
        head.head_service = Some(json!({
            "metadata": {"annotations": {"lb.example/internal": "true"}, "labels": {"team": "ml"}},
            "spec": {"loadBalancerSourceRanges": ["10.0.0.0/8"], "externalTrafficPolicy": "Local",
                     "selector": {"app": "mine"}, "ports": [{"name": "dash", "port": 8265}]}}));
        let svc = head_service(&rs, "llm-bcdfg", false);
        assert_eq!(svc["spec"]["type"], "NodePort");
        assert!(svc["spec"].get("clusterIP").is_none(), "not headless");
        assert_eq!(svc["metadata"]["annotations"]["lb.example/internal"], "true");
        assert_eq!(svc["metadata"]["labels"]["team"], "ml");
        assert_eq!(svc["metadata"]["labels"][ORIGINATED_FROM_CR_NAME], "llm");
        assert_eq!(svc["spec"]["externalTrafficPolicy"], "Local");
        assert_eq!(svc["spec"]["loadBalancerSourceRanges"][0], "10.0.0.0/8");
        assert_eq!(
            svc["spec"]["selector"],
            json!({CLUSTER_LABEL: "llm-bcdfg", NODE_TYPE_LABEL: "head"})
        );
        let ports: Vec<(&str, i64)> = (svc["spec"]["ports"].as_array().unwrap().iter())
            .map(|p| (p["name"].as_str().unwrap(), p["port"].as_i64().unwrap()))
            .collect();
        let want = [
            ("dash", 8265),
            ("9999-port", 9999),
            ("metrics", 8080),
            ("serve", 8000),
        ];
        assert_eq!(ports, want, "the user's port wins the clash on 8265");
        assert_eq!(
            serve_service(&rs, "llm-bcdfg").unwrap()["spec"]["type"],
            "NodePort"
        );
        assert_eq!(
            cluster_serve_service(&rs, &cluster("llm-a")).unwrap()["spec"]["type"],
            "NodePort"
        );
        rs.spec.serve_service.as_mut().unwrap()["spec"]["type"] = json!("LoadBalancer");
        assert_eq!(
            serve_service(&rs, "llm-bcdfg").unwrap()["spec"]["type"],
            "LoadBalancer"
        );
        rs.spec.ray_cluster_config.head_group_spec.service_type = Some("ClusterIP".into());
        rs.spec.ray_cluster_config.head_group_spec.head_service = None;
        assert_eq!(head_service(&rs, "llm-bcdfg", false)["spec"]["clusterIP"], "None");
        let with_ip = head_service(&rs, "llm-bcdfg", true);
        assert!(
            with_ip["spec"].get("clusterIP").is_none(),
            "ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE"
        );
        assert_eq!(with_ip["spec"]["type"], "ClusterIP");
    }

    /// A head that declares no port gets KubeRay's defaults, `serve: 8000` among them; one that declares ports
    /// but no Serve port gets no serve Service, which the apiserver would refuse with no ports.
    #[test]
    fn serve_ports_default_to_8000_and_are_never_empty() {
        let mut rs = rs();
        rs.spec.serve_service = None;
        let ports = |rs: &mut RayService, ports: Value| {
            let head = &mut rs.spec.ray_cluster_config.head_group_spec.template;
            let mut t = serde_json::to_value(&*head).unwrap();
            t["spec"]["containers"][0]["ports"] = ports;
            *head = serde_json::from_value(t).unwrap();
        };
        ports(&mut rs, json!([]));
        let serve = serve_service(&rs, "llm-a").unwrap();
        assert_eq!(
            serve["spec"]["ports"],
            json!([{"name": "serve", "port": 8000, "targetPort": 8000, "protocol": "TCP"}])
        );
        ports(&mut rs, json!([{"name": "dashboard", "containerPort": 8265}]));
        assert_eq!(serve_service(&rs, "llm-a"), None);
        assert_eq!(cluster_serve_service(&rs, &cluster("llm-a")), None);
        rs.spec.serve_service = Some(json!({"spec": {"ports": [{"name": "http", "port": 8000}]}}));
        let serve = serve_service(&rs, "llm-a").unwrap();
        assert_eq!(
            serve["spec"]["ports"][0]["name"], "http",
            "the user's own ports suffice"
        );
    }

    #[test]
    fn names_use_kuberay_alphabet() {
        let n = cluster_name("llm");
        assert_eq!(n.len(), 9);
        assert!(n[4..].bytes().all(|b| ALPHABET.contains(&b)));
        let (a, da) = stamp(json!({"metadata": {}, "spec": 1}));
        let (_, db) = stamp(json!({"metadata": {}, "spec": 2}));
        assert_ne!(da, db);
        assert_eq!(a["metadata"]["annotations"][APPLIED_ANNOTATION], da);
    }

    fn user_route() -> Value {
        json!({"metadata": {"resourceVersion": "7"}, "spec": {"rules": [
            {"name": "docs", "backendRefs": [{"name": "docs", "port": 80}]},
            {"name": "serve", "filters": [{"type": "RequestHeaderModifier"}]}
        ]}})
    }

    #[test]
    fn an_adopted_rule_is_found_by_name_or_is_the_first() {
        let route = user_route();
        assert_eq!(adopted_rule_index(&route, Some("serve")), Some(1));
        assert_eq!(adopted_rule_index(&route, None), Some(0));
        assert_eq!(adopted_rule_index(&route, Some("nope")), None);
        assert_eq!(adopted_rule_index(&json!({"spec": {"rules": []}}), None), None);
    }

    #[test]
    fn only_a_rule_on_the_clusters_own_serve_services_marks_a_route_rayshift_routed() {
        let rule =
            |backends: Value| json!({"spec": {"rules": [{"name": "docs"}, {"backendRefs": backends}]}});
        let ours = json!([{"kind": "Service", "name": "llm-b2c4d-serve-svc", "weight": 75},
                          {"name": "llm-x9z8q-serve-svc", "weight": 25}]);
        assert!(routes_to_clusters_of(&rule(ours), 1, "llm"));
        assert!(!routes_to_clusters_of(&rule(json!([])), 1, "llm"), "no backends");
        assert!(
            !routes_to_clusters_of(&json!({"spec": {"rules": [{}]}}), 0, "llm"),
            "no backendRefs"
        );
        let services = ["llm-serve-svc", "other-b2c4d-serve-svc", "llm-b2c4d", "docs"];
        for name in services {
            let route = rule(json!([{"name": name, "weight": 100}]));
            assert!(!routes_to_clusters_of(&route, 1, "llm"), "{name}");
        }
        let mixed = json!([{"name": "llm-b2c4d-serve-svc", "weight": 50}, {"name": "docs", "weight": 50}]);
        assert!(
            !routes_to_clusters_of(&rule(mixed), 1, "llm"),
            "a backend of the user's"
        );
        let imported = json!([{"kind": "ServiceImport", "name": "llm-b2c4d-serve-svc"}]);
        assert!(!routes_to_clusters_of(&rule(imported), 1, "llm"), "another kind");
    }

    #[test]
    fn all_traffic_to_one_service_only() {
        let rule = |backends: Value| json!({"spec": {"rules": [{"backendRefs": backends}]}});
        let on = |backends: Value| all_traffic_to(&rule(backends), 0, "llm-a-serve-svc");
        assert!(on(json!([{"name": "llm-a-serve-svc", "weight": 100}])));
        assert!(on(json!([{"name": "llm-a-serve-svc"}])), "weight defaults to 1");
        assert!(!on(json!([{"name": "llm-b-serve-svc", "weight": 100}])));
        assert!(!on(json!([{"name": "llm-a-serve-svc", "weight": 0}])));
        assert!(!on(
            json!([{"name": "llm-a-serve-svc", "weight": 50}, {"name": "llm-b-serve-svc", "weight": 50}])
        ));
        assert!(!on(json!([])));
    }

    #[test]
    fn the_adopted_patch_touches_only_the_rules_backends_and_tests_first() {
        let mut route = user_route();
        let backends = json!([{"name": "llm-a-serve-svc", "weight": 100}]);
        let patch = adopted_route_patch(&route, 1, Some("serve"), &backends).unwrap();
        let ops = serde_json::to_value(&patch).unwrap();
        assert_eq!(
            ops,
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "test", "path": "/spec/rules/1/name", "value": "serve"},
                {"op": "add", "path": "/spec/rules/1/backendRefs", "value": backends}
            ])
        );
        let before = route.clone();
        json_patch::patch(&mut route, &patch).unwrap();
        assert_eq!(route["spec"]["rules"][0], before["spec"]["rules"][0]);
        assert_eq!(
            route["spec"]["rules"][1]["filters"],
            before["spec"]["rules"][1]["filters"]
        );
        assert_eq!(
            adopted_route_patch(&route, 1, Some("serve"), &backends),
            None,
            "nothing to do"
        );
        let moved =
            json!([{"name": "llm-a-serve-svc", "weight": 50}, {"name": "llm-b-serve-svc", "weight": 50}]);
        let ops = serde_json::to_value(adopted_route_patch(&route, 1, None, &moved).unwrap()).unwrap();
        assert_eq!(ops[1]["op"], "replace");
        assert_eq!(
            ops.as_array().unwrap().len(),
            2,
            "no rule-name test without a name"
        );
    }

    fn grpc_rs() -> RayService {
        let mut rs = rs();
        rs.spec.serve_config_v2 = Some(
            "grpc_options:\n  port: 9100\n  grpc_servicer_functions: [m.add_S_to_server]\napplications: []\n"
                .into(),
        );
        rs
    }

    fn cluster(name: &str) -> RayCluster {
        serde_json::from_value(json!({"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "uid": "c1"}, "spec": {"headGroupSpec": {"template": {}}}}))
        .unwrap()
    }

    #[test]
    fn grpc_gets_a_listener_a_route_and_an_h2c_port() {
        let rs = grpc_rs();
        let gw = serde_json::to_value(gateway(&rs, "ns")).unwrap();
        assert_eq!(gw["spec"]["listeners"][1]["name"], GRPC_LISTENER);
        assert_eq!(gw["spec"]["listeners"][1]["port"], 9100);
        let weights = [("llm-a".to_string(), 60), ("llm-b".to_string(), 40)];
        let route = serde_json::to_value(grpc_route(&rs, "ns", &Attachment::Owned, &weights)).unwrap();
        assert_eq!(route["spec"]["parentRefs"][0]["sectionName"], GRPC_LISTENER);
        assert_eq!(
            route["spec"]["rules"][0]["backendRefs"][1]["name"],
            "llm-b-serve-svc"
        );
        assert_eq!(route["spec"]["rules"][0]["backendRefs"][1]["port"], 9100);
        assert_eq!(route["spec"]["rules"][0]["backendRefs"][1]["weight"], 40);
        let http = serde_json::to_value(http_route(&rs, "ns", &Attachment::Owned, &weights)).unwrap();
        assert_eq!(
            http["spec"]["parentRefs"][0]["sectionName"], HTTP_LISTENER,
            "HTTP stays off the gRPC listener"
        );
        let svc = cluster_serve_service(&rs, &cluster("llm-a")).unwrap();
        let grpc = svc["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["port"] == 9100)
            .unwrap();
        assert_eq!(grpc["appProtocol"], "kubernetes.io/h2c");
        assert_eq!(
            svc["spec"]["ports"][0]["appProtocol"], "http",
            "the user's serve port keeps its appProtocol"
        );
    }

    #[test]
    fn without_grpc_nothing_changes() {
        let rs = rs();
        let gw = serde_json::to_value(gateway(&rs, "ns")).unwrap();
        assert_eq!(gw["spec"]["listeners"].as_array().unwrap().len(), 1);
        let http = serde_json::to_value(http_route(&rs, "ns", &Attachment::Owned, &[])).unwrap();
        assert!(http["spec"]["parentRefs"][0].get("sectionName").is_none());
        let svc = cluster_serve_service(&rs, &cluster("llm-a")).unwrap();
        assert!(
            !svc["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "grpc")
        );
    }
}
