//! Schema pieces for the generated CRDs.
//!
//! rayshift models only the fields it reads; everything else is kept verbatim in `extra` maps
//! (lossless JSON). The CRD must then tell the apiserver not to prune those unknown fields, and it
//! must stay structural and free of CEL so it installs on Kubernetes 1.20 as well as current clusters.

use schemars::{Schema, SchemaGenerator, json_schema};

/// An object whose fields rayshift does not model (pod templates, Service templates, ...).
pub fn preserved_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Like [`preserved_object`] but may be absent/null.
pub fn optional_preserved_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// A list of objects rayshift does not model (env vars, volume mounts, ...).
pub fn optional_preserved_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "nullable": true,
        "items": { "type": "object", "x-kubernetes-preserve-unknown-fields": true }
    })
}

/// A `map[string]string` whose values may have been written as numbers or booleans in YAML.
pub fn optional_string_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "nullable": true,
        "additionalProperties": { "type": "string" }
    })
}
