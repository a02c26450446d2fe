//! Ray Serve's gRPC proxy. A RayService serves gRPC when its serveConfigV2 names servicer functions
//! (`grpc_options.grpc_servicer_functions`): Serve then listens for gRPC on `grpc_options.port`, 9000 unless
//! set. An incremental upgrade moves that traffic with a GRPCRoute, with the same weights as the HTTPRoute.

use serde_json::Value;

use crate::validation::parse_serve_config;

/// Ray Serve's default gRPC port.
pub const DEFAULT_GRPC_PORT: i64 = 9000;

/// The gRPC port Serve listens on for this serveConfigV2, if it serves gRPC at all.
pub fn grpc_port(serve_config_v2: Option<&str>) -> Option<i64> {
    grpc_port_in(&parse_serve_config(serve_config_v2?).ok()?)
}

/// The same for a config already parsed.
pub fn grpc_port_in(config: &Value) -> Option<i64> {
    let options = config.get("grpc_options")?;
    let functions = options.get("grpc_servicer_functions").and_then(Value::as_array)?;
    if functions.is_empty() {
        return None;
    }
    Some(
        options
            .get("port")
            .and_then(Value::as_i64)
            .unwrap_or(DEFAULT_GRPC_PORT),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_is_served_only_with_servicer_functions() {
        let with = |options: &str| grpc_port(Some(&format!("grpc_options:\n{options}applications: []\n")));
        assert_eq!(grpc_port(None), None);
        assert_eq!(grpc_port(Some("applications: []\n")), None);
        assert_eq!(with("  port: 9001\n"), None, "a port alone starts no gRPC proxy");
        assert_eq!(with("  grpc_servicer_functions: []\n"), None);
        assert_eq!(
            with("  grpc_servicer_functions: [a.add_X_to_server]\n"),
            Some(DEFAULT_GRPC_PORT)
        );
        assert_eq!(
            with("  port: 9100\n  grpc_servicer_functions: [a.add_X_to_server]\n"),
            Some(9100)
        );
    }
}
