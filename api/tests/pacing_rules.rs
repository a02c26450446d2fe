//! The progress deadline against the pacing: an interval no shorter than the deadline is allowed with a
//! warning (the deadline counts from each step's due instant), a deadline that is not a number is denied.

mod common;

use common::incremental_gate_on as config;
use rayshift_api::{
    upgrade_control::PROGRESS_DEADLINE_ANNOTATION,
    validation::{ValidationConfig, review},
};
use serde_json::{Value, json};

fn incremental(interval: i64, deadline: Option<&str>) -> Value {
    let mut rs = common::allowed_incremental();
    rs["spec"]["upgradeStrategy"]["clusterUpgradeOptions"]["intervalSeconds"] = json!(interval);
    if let Some(d) = deadline {
        rs["metadata"]["annotations"] = json!({PROGRESS_DEADLINE_ANNOTATION: d});
    }
    rs
}

fn warned(v: &rayshift_api::validation::Verdict) -> Vec<&'static str> {
    v.warnings.iter().map(|w| w.rule).collect()
}

#[test]
fn an_interval_reaching_the_deadline_is_allowed_with_a_warning() {
    let v = review(&incremental(600, Some("300")), None, &config());
    assert!(v.allowed(), "{:?}", v.errors);
    let w = v
        .warnings
        .iter()
        .find(|w| w.rule == "interval-reaches-progress-deadline")
        .expect("a warning");
    assert_eq!(
        w.field,
        "spec.upgradeStrategy.clusterUpgradeOptions.intervalSeconds"
    );
    assert!(
        w.message.contains("600") && w.message.contains("300 s"),
        "{}",
        w.message
    );
    // The operator default (600 s) counts when the annotation is absent.
    assert!(
        warned(&review(&incremental(600, None), None, &config()))
            .contains(&"interval-reaches-progress-deadline")
    );
    let shorter = review(&incremental(60, None), None, &config());
    assert!(!warned(&shorter).contains(&"interval-reaches-progress-deadline"));
    let operator = ValidationConfig {
        progress_deadline_seconds: 30,
        ..config()
    };
    assert!(
        warned(&review(&incremental(60, None), None, &operator))
            .contains(&"interval-reaches-progress-deadline")
    );
}

#[test]
fn a_deadline_that_is_not_whole_seconds_is_denied() {
    for bad in ["10m", "0", "-5", "abc"] {
        let v = review(&incremental(60, Some(bad)), None, &config());
        assert!(!v.allowed(), "{bad} allowed");
        let e = &v.errors[0];
        assert_eq!(
            e.field,
            format!("metadata.annotations[{PROGRESS_DEADLINE_ANNOTATION}]")
        );
        assert_eq!(e.rule, "progress-deadline");
    }
    assert!(review(&incremental(60, Some("120")), None, &config()).allowed());
}
