//! What the api test files share: the incremental fixture every rule test starts from, and the gates it needs.

use rayshift_api::{FeatureGates, documents, validation::ValidationConfig};
use serde_json::Value;

/// `tests/fixtures/validate/allowed-incremental.yaml`: an allowed NewClusterWithIncrementalUpgrade RayService.
pub fn allowed_incremental() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/validate/allowed-incremental.yaml"
    );
    documents::parse_stream(&std::fs::read_to_string(path).unwrap())
        .unwrap()
        .remove(0)
}

/// The default rules with RayServiceIncrementalUpgrade on.
pub fn incremental_gate_on() -> ValidationConfig {
    ValidationConfig {
        feature_gates: FeatureGates::default()
            .with("RayServiceIncrementalUpgrade", true)
            .unwrap(),
        ..ValidationConfig::default()
    }
}
