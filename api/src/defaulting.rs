//! Defaulting for RayService, as an RFC 6902 JSON Patch over the raw object.
//!
//! Precedence follows KServe's rollout defaults: what the user wrote > operator-wide defaults > built-in
//! (maxSurgePercent 100, KubeRay's CRD default). Working on raw JSON keeps every field the user wrote.

use json_patch::Patch;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::{
    error::{DefaultsError, Result},
    rayservice::{DEFAULT_MAX_SURGE_PERCENT, UpgradeType},
};

const OPTIONS_PTR: &str = "/spec/upgradeStrategy/clusterUpgradeOptions";

/// Operator-wide defaults for `clusterUpgradeOptions`, from a config file or flags.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpgradeDefaults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge_percent: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_size_percent: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_class_name: Option<String>,
}

/// The operator config file: `clusterUpgradeOptions: {maxSurgePercent: 25, ...}` (YAML or JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperatorConfig {
    #[serde(default)]
    pub cluster_upgrade_options: UpgradeDefaults,
}

impl OperatorConfig {
    pub fn from_yaml(text: &str) -> Result<Self> {
        let config: OperatorConfig = yaml_serde::from_str(text)?;
        config.cluster_upgrade_options.check()?;
        Ok(config)
    }
}

impl UpgradeDefaults {
    /// Operator defaults must themselves be admissible, or every RayService relying on them is denied.
    pub fn check(&self) -> Result<()> {
        let pct = |field: &'static str, v: Option<i32>| match v {
            Some(value) if !(1..=100).contains(&value) => {
                Err(DefaultsError::PercentOutOfRange { field, value })
            }
            _ => Ok(()),
        };
        pct("maxSurgePercent", self.max_surge_percent)?;
        pct("stepSizePercent", self.step_size_percent)?;
        if let Some(i) = self.interval_seconds.filter(|i| *i <= 0) {
            return Err(DefaultsError::IntervalNotPositive(i).into());
        }
        if let (Some(step), Some(surge)) = (self.step_size_percent, self.max_surge_percent)
            && step > surge
        {
            return Err(DefaultsError::StepAboveSurge.into());
        }
        Ok(())
    }

    fn entries(&self) -> [(&'static str, Option<Value>); 4] {
        [
            (
                "maxSurgePercent",
                Some(json!(self.max_surge_percent.unwrap_or(DEFAULT_MAX_SURGE_PERCENT))),
            ),
            ("stepSizePercent", self.step_size_percent.map(Value::from)),
            ("intervalSeconds", self.interval_seconds.map(Value::from)),
            (
                "gatewayClassName",
                self.gateway_class_name.clone().map(Value::from),
            ),
        ]
    }

    fn any_operator_value(&self) -> bool {
        self.max_surge_percent.is_some()
            || self.step_size_percent.is_some()
            || self.interval_seconds.is_some()
            || self.gateway_class_name.is_some()
    }
}

/// The patch that fills in defaults; empty when nothing changes (so defaulting is idempotent).
pub fn default_patch(object: &Value, defaults: &UpgradeDefaults) -> Patch {
    let strategy = object.pointer("/spec/upgradeStrategy");
    let incremental = strategy.and_then(|s| s.get("type")).and_then(Value::as_str)
        == Some(UpgradeType::NewClusterWithIncrementalUpgrade.as_str());
    let ops = match strategy
        .and_then(|s| s.get("clusterUpgradeOptions"))
        .and_then(Value::as_object)
    {
        Some(options) => fill_missing(options, defaults),
        // Only an incremental RayService needs options; create them only when the operator supplies some.
        None if incremental && defaults.any_operator_value() && strategy.is_some_and(Value::is_object) => {
            let mut options = Map::new();
            for (key, value) in defaults.entries() {
                if let Some(value) = value {
                    options.insert(key.to_string(), value);
                }
            }
            vec![json!({"op": "add", "path": OPTIONS_PTR, "value": options})]
        }
        None => Vec::new(),
    };
    serde_json::from_value(Value::Array(ops)).expect("patch operations are well-formed")
}

fn fill_missing(options: &Map<String, Value>, defaults: &UpgradeDefaults) -> Vec<Value> {
    defaults
        .entries()
        .into_iter()
        .filter(|(key, _)| options.get(*key).is_none_or(Value::is_null))
        .filter_map(|(key, value)| {
            value.map(|value| json!({"op": "add", "path": format!("{OPTIONS_PTR}/{key}"), "value": value}))
        })
        .collect()
}

/// Applies defaults in place and returns the patch that did it.
pub fn apply_defaults(object: &mut Value, defaults: &UpgradeDefaults) -> Patch {
    let patch = default_patch(object, defaults);
    json_patch::patch(object, &patch).expect("a default patch applies to the object it was computed from");
    patch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incremental(options: Value) -> Value {
        json!({"spec": {"upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": options}}})
    }

    #[test]
    fn max_surge_defaults_to_100_once() {
        let mut obj =
            incremental(json!({"stepSizePercent": 5, "intervalSeconds": 10, "gatewayClassName": "istio"}));
        let patch = apply_defaults(&mut obj, &UpgradeDefaults::default());
        assert_eq!(
            serde_json::to_value(&patch).unwrap()[0]["path"],
            OPTIONS_PTR.to_string() + "/maxSurgePercent"
        );
        assert_eq!(
            obj.pointer("/spec/upgradeStrategy/clusterUpgradeOptions/maxSurgePercent"),
            Some(&json!(100))
        );
        assert!(
            default_patch(&obj, &UpgradeDefaults::default()).0.is_empty(),
            "idempotent"
        );
    }

    #[test]
    fn user_value_beats_operator_beats_builtin() {
        let op = UpgradeDefaults {
            max_surge_percent: Some(25),
            step_size_percent: Some(5),
            ..Default::default()
        };
        let mut obj = incremental(json!({"maxSurgePercent": 40}));
        apply_defaults(&mut obj, &op);
        let o = obj
            .pointer("/spec/upgradeStrategy/clusterUpgradeOptions")
            .unwrap();
        assert_eq!(o["maxSurgePercent"], 40);
        assert_eq!(o["stepSizePercent"], 5);
        assert!(o.get("intervalSeconds").is_none());
    }

    #[test]
    fn operator_defaults_create_missing_options_for_incremental_only() {
        let op = UpgradeDefaults {
            interval_seconds: Some(60),
            gateway_class_name: Some("istio".into()),
            ..Default::default()
        };
        let mut obj = json!({"spec": {"upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade"}}});
        apply_defaults(&mut obj, &op);
        assert_eq!(
            obj.pointer("/spec/upgradeStrategy/clusterUpgradeOptions")
                .unwrap(),
            &json!({"maxSurgePercent": 100, "intervalSeconds": 60, "gatewayClassName": "istio"})
        );
        let blue_green = json!({"spec": {"upgradeStrategy": {"type": "NewCluster"}}});
        assert!(default_patch(&blue_green, &op).0.is_empty());
        assert!(default_patch(&json!({"spec": {}}), &op).0.is_empty());
        assert!(default_patch(&json!("not an object"), &op).0.is_empty());
    }

    #[test]
    fn null_counts_as_absent() {
        let mut obj = incremental(json!({"maxSurgePercent": null}));
        apply_defaults(&mut obj, &UpgradeDefaults::default());
        assert_eq!(
            obj.pointer("/spec/upgradeStrategy/clusterUpgradeOptions/maxSurgePercent"),
            Some(&json!(100))
        );
    }

    #[test]
    fn operator_config_is_checked() {
        assert!(OperatorConfig::from_yaml("clusterUpgradeOptions: {maxSurgePercent: 0}").is_err());
        assert!(
            OperatorConfig::from_yaml("clusterUpgradeOptions: {stepSizePercent: 50, maxSurgePercent: 20}")
                .is_err()
        );
        assert!(OperatorConfig::from_yaml("bogus: 1").is_err());
        let c =
            OperatorConfig::from_yaml("clusterUpgradeOptions: {maxSurgePercent: 20, intervalSeconds: 60}")
                .unwrap();
        assert_eq!(c.cluster_upgrade_options.max_surge_percent, Some(20));
    }
}
