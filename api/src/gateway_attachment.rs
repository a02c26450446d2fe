//! Where an incremental RayService's traffic enters. By default rayshift creates a Gateway and an HTTPRoute
//! per RayService (KubeRay 1.5–1.7). Clusters whose Gateways are run centrally need two more ways (KubeRay
//! #4956 and PR #5018, open there): attach rayshift's route to a shared Gateway, or take over only the
//! backendRefs of one rule of a route the user wrote. They are annotations because KubeRay's released CRD
//! prunes fields it does not know from `clusterUpgradeOptions`.

use std::collections::BTreeMap;

use crate::validation::{FieldError, names, path::annotation as field};

/// `[namespace/]name` of an existing Gateway that rayshift's route attaches to; rayshift never edits it.
pub const GATEWAY_ANNOTATION: &str = "rayshift.io/gateway";
/// The listener (`sectionName`) of that Gateway; all its listeners when absent.
pub const GATEWAY_LISTENER_ANNOTATION: &str = "rayshift.io/gateway-listener";
/// The listener of that Gateway rayshift's GRPCRoute attaches to, when Serve serves gRPC; all its listeners
/// when absent.
pub const GATEWAY_GRPC_LISTENER_ANNOTATION: &str = "rayshift.io/gateway-grpc-listener";
/// Name of an existing HTTPRoute in the RayService's namespace whose backendRefs rayshift sets.
pub const HTTP_ROUTE_ANNOTATION: &str = "rayshift.io/http-route";
/// Name of that route's rule rayshift sets the backendRefs of; the first rule when absent.
pub const HTTP_ROUTE_RULE_ANNOTATION: &str = "rayshift.io/http-route-rule";

/// A Gateway someone else runs, and optionally one of its listeners.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayRef {
    pub namespace: String,
    pub name: String,
    pub listener: Option<String>,
    pub grpc_listener: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attachment {
    /// rayshift creates `<name>-gateway` and `<name>-httproute`, both owned by the RayService.
    Owned,
    /// rayshift creates and owns `<name>-httproute`, attached to a Gateway it never edits.
    SharedGateway(GatewayRef),
    /// rayshift sets the backendRefs of one rule of a route it neither creates, owns nor deletes; the route's
    /// parentRefs name the Gateways whose status says whether traffic can move.
    AdoptedRoute { name: String, rule: Option<String> },
}

/// `[namespace/]name` of a shared Gateway, with the listeners named for HTTP and gRPC.
fn shared_gateway(
    gateway: &str,
    namespace: &str,
    (listener, grpc_listener): (Option<String>, Option<String>),
) -> Result<GatewayRef, FieldError> {
    let (namespace, name) = gateway.split_once('/').unwrap_or((namespace, gateway));
    if !names::is_dns1123_label(namespace) || !names::is_dns1123_subdomain(name) {
        return Err(FieldError::invalid(
            field(GATEWAY_ANNOTATION),
            gateway,
            "gateway-reference",
            "must be a Gateway name, or namespace/name (a lowercase RFC 1123 label, then subdomain)",
        ));
    }
    Ok(GatewayRef {
        namespace: namespace.to_string(),
        name: name.to_string(),
        listener,
        grpc_listener,
    })
}

impl Attachment {
    /// The annotations' attachment for a RayService in `namespace`, or the first rule they break.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
        namespace: &str,
    ) -> Result<Self, FieldError> {
        let get = |key: &str| annotations.get(key).map(|v| v.trim().to_string());
        let (gateway, listener) = (get(GATEWAY_ANNOTATION), get(GATEWAY_LISTENER_ANNOTATION));
        let grpc_listener = get(GATEWAY_GRPC_LISTENER_ANNOTATION);
        let (route, rule) = (get(HTTP_ROUTE_ANNOTATION), get(HTTP_ROUTE_RULE_ANNOTATION));
        for (key, value) in [
            (GATEWAY_LISTENER_ANNOTATION, &listener),
            (GATEWAY_GRPC_LISTENER_ANNOTATION, &grpc_listener),
            (HTTP_ROUTE_RULE_ANNOTATION, &rule),
        ] {
            check_name(key, value.as_deref())?;
        }
        if gateway.is_none() {
            requires(
                GATEWAY_GRPC_LISTENER_ANNOTATION,
                &grpc_listener,
                GATEWAY_ANNOTATION,
            )?;
        }
        match (gateway, route) {
            (Some(_), Some(_)) => Err(FieldError::forbidden(
                field(HTTP_ROUTE_ANNOTATION),
                "gateway-attachment-exclusive",
                format!(
                    "{HTTP_ROUTE_ANNOTATION} and {GATEWAY_ANNOTATION} cannot both be set: an adopted route names its own Gateways"
                ),
            )),
            (Some(gateway), None) => {
                requires(HTTP_ROUTE_RULE_ANNOTATION, &rule, HTTP_ROUTE_ANNOTATION)?;
                let listeners = (listener, grpc_listener);
                shared_gateway(&gateway, namespace, listeners).map(Self::SharedGateway)
            }
            (None, Some(route)) => {
                requires(GATEWAY_LISTENER_ANNOTATION, &listener, GATEWAY_ANNOTATION)?;
                check_name(HTTP_ROUTE_ANNOTATION, Some(&route))?;
                Ok(Self::AdoptedRoute { name: route, rule })
            }
            (None, None) => {
                requires(GATEWAY_LISTENER_ANNOTATION, &listener, GATEWAY_ANNOTATION)?;
                requires(HTTP_ROUTE_RULE_ANNOTATION, &rule, HTTP_ROUTE_ANNOTATION)?;
                Ok(Self::Owned)
            }
        }
    }

    /// Where the traffic of RayService `rs` enters, in words (`rayshift plan`).
    pub fn describe(&self, rs: &str, class: &str) -> String {
        match self {
            Self::Owned => {
                format!("Gateway {rs}-gateway (class {class}) and HTTPRoute {rs}-httproute, created for {rs}")
            }
            Self::SharedGateway(gw) => format!(
                "HTTPRoute {rs}-httproute on the shared Gateway {}/{}{} (never edited by rayshift)",
                gw.namespace,
                gw.name,
                gw.listener
                    .as_ref()
                    .map(|l| format!(", listener {l}"))
                    .unwrap_or_default()
            ),
            Self::AdoptedRoute { name, rule } => format!(
                "the backendRefs of {} of the existing HTTPRoute {name} (nothing else of it is changed)",
                rule.as_ref()
                    .map_or("its first rule".to_string(), |r| format!("rule {r}"))
            ),
        }
    }

    /// Whether any of the annotations is set (they only matter to an incremental upgrade).
    pub fn annotated(annotations: &BTreeMap<String, String>) -> Option<&'static str> {
        [
            GATEWAY_ANNOTATION,
            GATEWAY_LISTENER_ANNOTATION,
            GATEWAY_GRPC_LISTENER_ANNOTATION,
            HTTP_ROUTE_ANNOTATION,
            HTTP_ROUTE_RULE_ANNOTATION,
        ]
        .into_iter()
        .find(|key| annotations.contains_key(*key))
    }
}

/// Object, listener and rule names share the RFC 1123 subdomain syntax.
fn check_name(key: &str, value: Option<&str>) -> Result<(), FieldError> {
    match value {
        Some(v) if !names::is_dns1123_subdomain(v) => Err(FieldError::invalid(
            field(key),
            v,
            "gateway-attachment-name",
            "must be a lowercase RFC 1123 subdomain",
        )),
        _ => Ok(()),
    }
}

fn requires(key: &str, value: &Option<String>, needed: &str) -> Result<(), FieldError> {
    match value {
        Some(_) => Err(FieldError::forbidden(
            field(key),
            "gateway-attachment-requires",
            format!("{key} needs {needed}"),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attach(pairs: &[(&str, &str)]) -> Result<Attachment, FieldError> {
        let annotations = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Attachment::from_annotations(&annotations, "team")
    }

    #[test]
    fn no_annotation_is_the_owned_gateway() {
        assert_eq!(attach(&[]), Ok(Attachment::Owned));
    }

    #[test]
    fn a_gateway_without_namespace_is_in_the_rayservices() {
        let shared = |ns: &str, listener: Option<&str>| {
            Attachment::SharedGateway(GatewayRef {
                namespace: ns.into(),
                name: "edge".into(),
                listener: listener.map(Into::into),
                grpc_listener: None,
            })
        };
        assert_eq!(attach(&[(GATEWAY_ANNOTATION, "edge")]), Ok(shared("team", None)));
        assert_eq!(
            attach(&[
                (GATEWAY_ANNOTATION, "infra/edge"),
                (GATEWAY_LISTENER_ANNOTATION, "web")
            ]),
            Ok(shared("infra", Some("web")))
        );
    }

    #[test]
    fn an_adopted_route_with_or_without_a_rule() {
        assert_eq!(
            attach(&[
                (HTTP_ROUTE_ANNOTATION, "public"),
                (HTTP_ROUTE_RULE_ANNOTATION, "serve")
            ]),
            Ok(Attachment::AdoptedRoute {
                name: "public".into(),
                rule: Some("serve".into())
            })
        );
    }

    #[test]
    fn descriptions_name_the_objects() {
        let shared = attach(&[
            (GATEWAY_ANNOTATION, "infra/edge"),
            (GATEWAY_LISTENER_ANNOTATION, "web"),
        ])
        .unwrap();
        assert_eq!(
            shared.describe("llm", "traefik"),
            "HTTPRoute llm-httproute on the shared Gateway infra/edge, listener web (never edited by rayshift)"
        );
        let adopted = attach(&[(HTTP_ROUTE_ANNOTATION, "public")]).unwrap();
        assert!(
            adopted
                .describe("llm", "traefik")
                .contains("its first rule of the existing HTTPRoute public")
        );
        assert!(
            Attachment::Owned
                .describe("llm", "traefik")
                .contains("llm-gateway (class traefik)")
        );
    }

    #[test]
    fn each_broken_rule_names_its_annotation() {
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: &[Case] = &[
            (
                &[(GATEWAY_ANNOTATION, "a/b/c")],
                GATEWAY_ANNOTATION,
                "gateway-reference",
            ),
            (
                &[(GATEWAY_ANNOTATION, "Infra/edge")],
                GATEWAY_ANNOTATION,
                "gateway-reference",
            ),
            (
                &[(GATEWAY_ANNOTATION, "edge"), (HTTP_ROUTE_ANNOTATION, "r")],
                HTTP_ROUTE_ANNOTATION,
                "gateway-attachment-exclusive",
            ),
            (
                &[(GATEWAY_LISTENER_ANNOTATION, "web")],
                GATEWAY_LISTENER_ANNOTATION,
                "gateway-attachment-requires",
            ),
            (
                &[(HTTP_ROUTE_ANNOTATION, "r"), (GATEWAY_LISTENER_ANNOTATION, "web")],
                GATEWAY_LISTENER_ANNOTATION,
                "gateway-attachment-requires",
            ),
            (
                &[(HTTP_ROUTE_RULE_ANNOTATION, "serve")],
                HTTP_ROUTE_RULE_ANNOTATION,
                "gateway-attachment-requires",
            ),
            (
                &[(HTTP_ROUTE_ANNOTATION, "Bad_Name")],
                HTTP_ROUTE_ANNOTATION,
                "gateway-attachment-name",
            ),
        ];
        for (pairs, key, rule) in cases {
            let e = attach(pairs).unwrap_err();
            assert_eq!(e.field, field(key), "{pairs:?}");
            assert_eq!(e.rule, *rule, "{pairs:?}");
        }
    }
}
