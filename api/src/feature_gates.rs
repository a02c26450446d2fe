//! Feature gates in Kubernetes syntax: `--feature-gates=RayServiceIncrementalUpgrade=true,Other=false`.

use std::{collections::BTreeMap, fmt, str::FromStr};

use crate::error::Error;

/// Gates rayshift understands, with their defaults. The incremental-upgrade gate is off by default, as in
/// KubeRay v1.5.1 where the feature was alpha.
pub const KNOWN_GATES: &[(&str, bool)] = &[
    (RAY_SERVICE_INCREMENTAL_UPGRADE, false),
    ("RayClusterStatusConditions", true),
    ("RayJobDeletionPolicy", false),
    ("GCSFaultToleranceEmbeddedStorage", false),
    ("RayClusterHistoryServer", false),
    ("RayClusterNetworkPolicy", false),
    ("RayClusterMTLS", false),
];

pub const RAY_SERVICE_INCREMENTAL_UPGRADE: &str = "RayServiceIncrementalUpgrade";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    enabled: BTreeMap<&'static str, bool>,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            enabled: KNOWN_GATES.iter().copied().collect(),
        }
    }
}

impl FeatureGates {
    pub fn enabled(&self, gate: &str) -> bool {
        self.enabled.get(gate).copied().unwrap_or(false)
    }

    pub fn incremental_upgrade(&self) -> bool {
        self.enabled(RAY_SERVICE_INCREMENTAL_UPGRADE)
    }

    /// Sets one gate; unknown names are an error, as in Kubernetes components.
    pub fn set(&mut self, gate: &str, on: bool) -> Result<(), Error> {
        let (name, _) = KNOWN_GATES
            .iter()
            .find(|(n, _)| *n == gate)
            .ok_or_else(|| Error::FeatureGates(format!("unrecognized feature gate: {gate}")))?;
        self.enabled.insert(name, on);
        Ok(())
    }

    /// Returns a copy with one gate changed (handy in tests and callers that hold `&self`).
    pub fn with(mut self, gate: &str, on: bool) -> Result<Self, Error> {
        self.set(gate, on)?;
        Ok(self)
    }
}

impl FromStr for FeatureGates {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let mut gates = FeatureGates::default();
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| Error::FeatureGates(format!("missing bool value for {pair}")))?;
            let on = match value.trim().to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                other => {
                    return Err(Error::FeatureGates(format!(
                        "invalid value of {name}: {other}, err: not a bool"
                    )));
                }
            };
            gates.set(name.trim(), on)?;
        }
        Ok(gates)
    }
}

impl fmt::Display for FeatureGates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.enabled.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_syntax() {
        let g: FeatureGates = "RayServiceIncrementalUpgrade=true, RayClusterStatusConditions=false"
            .parse()
            .unwrap();
        assert!(g.incremental_upgrade());
        assert!(!g.enabled("RayClusterStatusConditions"));
        assert!(!FeatureGates::default().incremental_upgrade());
    }

    #[test]
    fn rejects_unknown_and_malformed() {
        assert!(
            "Nope=true"
                .parse::<FeatureGates>()
                .unwrap_err()
                .to_string()
                .contains("unrecognized")
        );
        assert!("RayServiceIncrementalUpgrade".parse::<FeatureGates>().is_err());
        assert!(
            "RayServiceIncrementalUpgrade=yes"
                .parse::<FeatureGates>()
                .is_err()
        );
    }
}
