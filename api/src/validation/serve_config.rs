//! `spec.serveConfigV2`: Ray Serve's multi-application config, written as YAML text.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{FieldError, Verdict};

const FIELD: &str = "spec.serveConfigV2";

/// Parses serveConfigV2 into JSON (what the Ray dashboard's PUT takes).
pub fn parse_serve_config(text: &str) -> Result<Value, yaml_serde::Error> {
    yaml_serde::from_str(text)
}

/// Checks the config parses and names its applications well enough for Serve to accept it; returns it
/// parsed, for the rules that read it further.
pub(crate) fn check(text: Option<&str>, incremental: bool, v: &mut Verdict) -> Option<Value> {
    let Some(text) = text.filter(|t| !t.trim().is_empty()) else {
        v.error(FieldError::required(
            FIELD,
            "serve-config-required",
            "a RayService needs at least one Serve application: the service is Ready only when its \
             applications are RUNNING",
        ));
        return None;
    };
    let config = match parse_serve_config(text) {
        Ok(c) => c,
        Err(e) => {
            v.error(FieldError::invalid(
                FIELD,
                "<yaml>",
                "serve-config-yaml",
                format!("must be valid YAML: {e}"),
            ));
            return None;
        }
    };
    check_parsed(&config, incremental, v);
    Some(config)
}

fn check_parsed(config: &Value, incremental: bool, v: &mut Verdict) {
    let Some(apps) = config.get("applications").and_then(Value::as_array) else {
        v.error(FieldError::required(
            format!("{FIELD}.applications"),
            "serve-config-applications",
            "serveConfigV2 must be a YAML mapping with an `applications` list",
        ));
        return;
    };
    if apps.is_empty() {
        v.error(FieldError::required(
            format!("{FIELD}.applications"),
            "serve-config-applications",
            "must list at least one application",
        ));
    }
    check_applications(apps, v);
    if incremental && config.get("target_capacity").is_some_and(|t| !t.is_null()) {
        v.warn(
            format!("{FIELD}.target_capacity"),
            "serve-config-target-capacity",
            "target_capacity is managed by the incremental upgrade and will be overwritten",
        );
    }
}

/// Serve rejects a config whose apps lack `import_path` or repeat a name or route prefix.
fn check_applications(apps: &[Value], v: &mut Verdict) {
    let mut names = BTreeSet::new();
    let mut prefixes = BTreeSet::new();
    for (i, app) in apps.iter().enumerate() {
        let at = format!("{FIELD}.applications[{i}]");
        if !app.is_object() {
            v.error(FieldError::invalid(
                at,
                app.clone(),
                "serve-config-application",
                "must be a mapping",
            ));
            continue;
        }
        if app
            .get("import_path")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            v.error(FieldError::required(
                format!("{at}.import_path"),
                "serve-config-import-path",
                "every Serve application needs an import_path",
            ));
        }
        let name = app.get("name").and_then(Value::as_str).unwrap_or("default");
        if !names.insert(name.to_string()) {
            v.error(FieldError::invalid(
                format!("{at}.name"),
                name,
                "serve-config-duplicate-name",
                "application names must be unique",
            ));
        }
        if let Some(prefix) = app.get("route_prefix").and_then(Value::as_str)
            && !prefixes.insert(prefix.to_string())
        {
            v.error(FieldError::invalid(
                format!("{at}.route_prefix"),
                prefix,
                "serve-config-duplicate-route",
                "route prefixes must be unique across applications",
            ));
        }
    }
}
