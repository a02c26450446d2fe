//! Feature gates in Kubernetes syntax: `--feature-gates=RayServiceIncrementalUpgrade=true,Other=false`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    str::FromStr,
};

use crate::error::{Error, FeatureGateError};

/// Gates rayshift understands: every gate of KubeRay 1.5 to 1.7, so that an operator's flags can be copied.
/// The defaults are KubeRay v1.5.1's (the seeds' release); `for_kuberay` moves them to a later release's.
pub const KNOWN_GATES: &[(&str, bool)] = &[
    (RAY_SERVICE_INCREMENTAL_UPGRADE, false),
    ("RayClusterStatusConditions", true),
    (RAY_JOB_DELETION_POLICY, false),
    (RAY_MULTI_HOST_INDEXING, false),
    ("RayCronJob", false),
    ("AsyncJobInfoQuery", false),
    ("SidecarSubmitterRestart", false),
    ("KubernetesWAS", false),
    ("GCSFaultToleranceEmbeddedStorage", false),
    ("RayClusterHistoryServer", false),
    ("RayClusterNetworkPolicy", false),
    ("RayClusterMTLS", false),
];

const RAY_JOB_DELETION_POLICY: &str = "RayJobDeletionPolicy";
const RAY_MULTI_HOST_INDEXING: &str = "RayMultiHostIndexing";

/// Gates whose default changed after v1.5.1, with the first release that turns them on.
const TURNED_ON_IN: &[(&str, KubeRayVersion)] = &[
    (RAY_JOB_DELETION_POLICY, KubeRayVersion::V1_6),
    (RAY_MULTI_HOST_INDEXING, KubeRayVersion::V1_6),
    (RAY_SERVICE_INCREMENTAL_UPGRADE, KubeRayVersion::V1_7),
];

pub const RAY_SERVICE_INCREMENTAL_UPGRADE: &str = "RayServiceIncrementalUpgrade";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    enabled: BTreeMap<&'static str, bool>,
    /// Gates named on the command line: a KubeRay version's defaults never override them.
    explicit: BTreeSet<&'static str>,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            enabled: KNOWN_GATES.iter().copied().collect(),
            explicit: BTreeSet::new(),
        }
    }
}

/// The KubeRay release whose semantics the rules follow where releases differ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum KubeRayVersion {
    /// v1.5.x: the seeds' release; incremental upgrade is alpha (gate off by default).
    V1_5,
    /// v1.6.x: adds RayService `managedBy`; incremental upgrade still off by default.
    #[default]
    V1_6,
    /// v1.7.x: `RayServiceIncrementalUpgrade` is beta and on by default.
    V1_7,
}

impl FromStr for KubeRayVersion {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let t = s.trim().trim_start_matches('v');
        let minor = t.strip_prefix("1.").map(|r| r.split('.').next().unwrap_or(""));
        match minor {
            Some("5") => Ok(Self::V1_5),
            Some("6") => Ok(Self::V1_6),
            Some("7") => Ok(Self::V1_7),
            _ => Err(FeatureGateError::KubeRayVersion(s.to_string()).into()),
        }
    }
}

impl fmt::Display for KubeRayVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V1_5 => "1.5",
            Self::V1_6 => "1.6",
            Self::V1_7 => "1.7",
        })
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
            .ok_or_else(|| FeatureGateError::Unrecognized(gate.to_string()))?;
        self.enabled.insert(name, on);
        self.explicit.insert(name);
        Ok(())
    }

    /// These gates with `version`'s defaults for every gate not named explicitly.
    pub fn for_kuberay(mut self, version: KubeRayVersion) -> Self {
        for (gate, since) in TURNED_ON_IN {
            if !self.explicit.contains(gate) {
                self.enabled.insert(gate, version >= *since);
            }
        }
        self
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
                .ok_or_else(|| FeatureGateError::MissingValue(pair.to_string()))?;
            let on = match value.trim().to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                other => {
                    let (name, value) = (name.to_string(), other.to_string());
                    return Err(FeatureGateError::NotABool { name, value }.into());
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
mod version_tests {
    use super::*;

    #[test]
    fn kuberay_1_7_turns_the_incremental_gate_on_unless_told_otherwise() {
        let v17: KubeRayVersion = "v1.7.0".parse().unwrap();
        assert!(FeatureGates::default().for_kuberay(v17).incremental_upgrade());
        for older in ["1.5", "1.6.2"] {
            let v = older.parse().unwrap();
            assert!(!FeatureGates::default().for_kuberay(v).incremental_upgrade());
        }
        let off: FeatureGates = "RayServiceIncrementalUpgrade=false".parse().unwrap();
        assert!(!off.for_kuberay(v17).incremental_upgrade());
        let on: FeatureGates = "RayServiceIncrementalUpgrade=true".parse().unwrap();
        assert!(on.for_kuberay(KubeRayVersion::V1_5).incremental_upgrade());
        assert!("1.4".parse::<KubeRayVersion>().is_err());
        assert!("2.0".parse::<KubeRayVersion>().is_err());
    }

    /// KubeRay v1.6.0 made RayJobDeletionPolicy and RayMultiHostIndexing beta and on by default.
    #[test]
    fn kuberay_1_6_turns_the_job_deletion_and_multi_host_gates_on() {
        let gates = |v: &str, flags: &str| {
            let g: FeatureGates = flags.parse().unwrap();
            g.for_kuberay(v.parse().unwrap())
        };
        for gate in [RAY_JOB_DELETION_POLICY, RAY_MULTI_HOST_INDEXING] {
            assert!(!gates("1.5", "").enabled(gate), "{gate} in 1.5");
            assert!(gates("1.6", "").enabled(gate), "{gate} in 1.6");
            assert!(gates("1.7", "").enabled(gate), "{gate} in 1.7");
            assert!(!gates("1.6", &format!("{gate}=false")).enabled(gate));
            assert!(gates("1.5", &format!("{gate}=true")).enabled(gate));
        }
        assert!(!gates("1.6", "").enabled("RayCronJob"));
        assert!(gates("1.6", "KubernetesWAS=true,AsyncJobInfoQuery=true").enabled("KubernetesWAS"));
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
