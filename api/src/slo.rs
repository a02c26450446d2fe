//! SLO checks that gate an incremental upgrade's traffic steps (issue 17): PromQL queries against a Prometheus,
//! each with a comparison, a threshold, an evaluation window and a failure limit, and what to do when it fails.
//!
//! They live in the annotation `rayshift.io/slo-checks` (KubeRay's CRD is installed unmodified, so the spec
//! has no place for them): YAML or JSON, either `default` (the built-in set for Ray Serve's own metrics) or a
//! list whose items are checks or the word `default`. Queries can use `{{cluster}}` (the pending cluster),
//! `{{activeCluster}}`, `{{namespace}}`, `{{rayservice}}` and `{{window}}` (the check's window, e.g. `60s`).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The annotation naming a RayService's checks.
pub const SLO_CHECKS_ANNOTATION: &str = "rayshift.io/slo-checks";

/// What the query's value is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Comparison {
    #[serde(rename = "<=")]
    AtMost,
    #[serde(rename = "<")]
    Below,
    #[serde(rename = ">=")]
    AtLeast,
    #[serde(rename = ">")]
    Above,
}

impl Comparison {
    pub fn holds(self, value: f64, threshold: f64) -> bool {
        match self {
            Comparison::AtMost => value <= threshold,
            Comparison::Below => value < threshold,
            Comparison::AtLeast => value >= threshold,
            Comparison::Above => value > threshold,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Comparison::AtMost => "<=",
            Comparison::Below => "<",
            Comparison::AtLeast => ">=",
            Comparison::Above => ">",
        }
    }
}

/// What a failed check does to the upgrade.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OnFailure {
    /// Roll back to the active cluster (as an abort).
    #[default]
    Rollback,
    /// Hold where it is until a person decides (`kubectl rayshift resume|abort`).
    Pause,
}

/// One check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SloCheck {
    pub name: String,
    pub query: String,
    pub comparison: Comparison,
    pub threshold: f64,
    /// The query's `{{window}}`, and how long after a traffic step its data counts.
    #[serde(default = "default_window")]
    pub window_seconds: u32,
    /// How often it is evaluated while the pending cluster carries traffic.
    #[serde(default = "default_interval")]
    pub interval_seconds: u32,
    /// Failed evaluations in a row that make the upgrade act (`onFailure`).
    #[serde(default = "default_failure_limit")]
    pub failure_limit: u32,
    #[serde(default)]
    pub on_failure: OnFailure,
}

fn default_window() -> u32 {
    60
}

fn default_interval() -> u32 {
    10
}

fn default_failure_limit() -> u32 {
    2
}

/// Bounds of the numbers a check takes.
pub const WINDOW_SECONDS: std::ops::RangeInclusive<u32> = 10..=3600;
pub const FAILURE_LIMIT: std::ops::RangeInclusive<u32> = 1..=100;
pub const INTERVAL_SECONDS: std::ops::RangeInclusive<u32> = 1..=3600;

/// The placeholders a query may use.
pub const PLACEHOLDERS: [&str; 5] = ["cluster", "activeCluster", "namespace", "rayservice", "window"];

/// Ray Serve's own metrics, as KubeRay's PodMonitor labels them (`ray_io_cluster` from the Pod's
/// `ray.io/cluster`): the pending cluster's HTTP error ratio at most 1 %, its p99 latency at most 1.2 times the
/// active cluster's, and its queued requests at most 10 per replica. Ray creates its error counter at the first
/// error, so a version without errors has no such series: `or vector(0)` makes that a 0, not "no data". Serve's own
/// routes (`/-/healthz`, `/-/routes`) are left out: a proxy answers its health checks 503 while it starts, and
/// those are no user's failed requests (seen with Ray 2.60 in the real-Ray test).
pub fn built_in() -> Vec<SloCheck> {
    let check = |name: &str, query: &str, comparison, threshold| SloCheck {
        name: name.to_string(),
        query: query.to_string(),
        comparison,
        threshold,
        window_seconds: default_window(),
        interval_seconds: default_interval(),
        failure_limit: default_failure_limit(),
        on_failure: OnFailure::Rollback,
    };
    vec![
        check(
            "serve-error-ratio",
            r#"(sum(rate(ray_serve_num_http_error_requests_total{ray_io_cluster="{{cluster}}",route!~"/-/.*"}[{{window}}])) or vector(0)) / sum(rate(ray_serve_num_http_requests_total{ray_io_cluster="{{cluster}}",route!~"/-/.*"}[{{window}}]))"#,
            Comparison::AtMost,
            0.01,
        ),
        check(
            "serve-p99-latency-vs-active",
            r#"histogram_quantile(0.99, sum by (le) (rate(ray_serve_http_request_latency_ms_bucket{ray_io_cluster="{{cluster}}",route!~"/-/.*"}[{{window}}]))) / histogram_quantile(0.99, sum by (le) (rate(ray_serve_http_request_latency_ms_bucket{ray_io_cluster="{{activeCluster}}",route!~"/-/.*"}[{{window}}])))"#,
            Comparison::AtMost,
            1.2,
        ),
        check(
            "serve-queued-per-replica",
            r#"sum(ray_serve_deployment_queued_queries{ray_io_cluster="{{cluster}}"}) / clamp_min(sum(ray_serve_deployment_replica_healthy{ray_io_cluster="{{cluster}}"}), 1)"#,
            Comparison::AtMost,
            10.0,
        ),
    ]
}

/// An item of the annotation's list: a check, or `default` for the built-in set.
#[derive(Deserialize)]
#[serde(untagged)]
enum Item {
    Word(String),
    Check(Box<SloCheck>),
}

/// Why the annotation cannot be used, with where.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    /// Path below the annotation, e.g. `[0].query` (empty: the whole value).
    pub at: String,
    pub message: String,
}

impl Problem {
    fn new(at: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            at: at.into(),
            message: message.into(),
        }
    }
}

/// The checks a RayService's annotations name: none when absent or malformed (admission reports that).
pub fn of(annotations: &std::collections::BTreeMap<String, String>) -> Vec<SloCheck> {
    annotations
        .get(SLO_CHECKS_ANNOTATION)
        .and_then(|raw| parse(raw).ok())
        .unwrap_or_default()
}

/// The checks the annotation names, or every problem it has.
pub fn parse(raw: &str) -> Result<Vec<SloCheck>, Vec<Problem>> {
    let items: Vec<Item> = match raw.trim() {
        "default" => return Ok(built_in()),
        text => yaml_serde::from_str(text).map_err(|e| {
            vec![Problem::new(
                "",
                format!("not `default` or a list of checks ({{name, query, comparison, threshold, windowSeconds, failureLimit, onFailure}} or `default`): {e}"),
            )]
        })?,
    };
    // Each check with the index of the item it came from (the built-ins are known good).
    let mut checks: Vec<(usize, SloCheck)> = Vec::new();
    let mut problems = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        match item {
            Item::Word(w) if w == "default" => checks.extend(built_in().into_iter().map(|c| (i, c))),
            Item::Word(w) => problems.push(Problem::new(
                format!("[{i}]"),
                format!("{w:?} is not a check; the only word is `default`"),
            )),
            Item::Check(c) => {
                problems.extend(check_problems(i, &c));
                checks.push((i, *c));
            }
        }
    }
    problems.extend(duplicate_names(&checks));
    if problems.is_empty() {
        Ok(checks.into_iter().map(|(_, c)| c).collect())
    } else {
        Err(problems)
    }
}

fn check_problems(i: usize, c: &SloCheck) -> Vec<Problem> {
    let mut out = Vec::new();
    if !crate::validation::is_dns1123_label(&c.name) {
        out.push(Problem::new(
            format!("[{i}].name"),
            "a lowercase DNS-1123 label (it names the check in conditions and events)",
        ));
    }
    if let Err(e) = promql(&c.query) {
        out.push(Problem::new(format!("[{i}].query"), e));
    }
    if !c.threshold.is_finite() {
        out.push(Problem::new(format!("[{i}].threshold"), "a finite number"));
    }
    if !WINDOW_SECONDS.contains(&c.window_seconds) {
        out.push(Problem::new(
            format!("[{i}].windowSeconds"),
            format!("{}..{} seconds", WINDOW_SECONDS.start(), WINDOW_SECONDS.end()),
        ));
    }
    if !INTERVAL_SECONDS.contains(&c.interval_seconds) {
        out.push(Problem::new(
            format!("[{i}].intervalSeconds"),
            format!("{}..{} seconds", INTERVAL_SECONDS.start(), INTERVAL_SECONDS.end()),
        ));
    }
    if !FAILURE_LIMIT.contains(&c.failure_limit) {
        out.push(Problem::new(
            format!("[{i}].failureLimit"),
            format!(
                "{}..{} failed evaluations in a row",
                FAILURE_LIMIT.start(),
                FAILURE_LIMIT.end()
            ),
        ));
    }
    out
}

fn duplicate_names(checks: &[(usize, SloCheck)]) -> Vec<Problem> {
    let mut seen = BTreeSet::new();
    checks
        .iter()
        .filter(|(_, c)| !seen.insert(c.name.as_str()))
        .map(|(i, c)| Problem::new(format!("[{i}].name"), format!("{:?} names two checks", c.name)))
        .collect()
}

/// What Prometheus answered for a check's query.
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    Value(f64),
    /// An empty result, or NaN (0/0: no requests in the window).
    NoData,
    /// Prometheus was not reachable, not configured, or refused the query (why, as it said).
    Unavailable(String),
}

/// A check's verdict on one reading. Only `Pass` lets traffic move; only `Fail` counts towards the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    Pass,
    Fail,
    NoData,
    Unavailable,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::NoData => "no_data",
            Outcome::Unavailable => "unavailable",
        }
    }
}

impl SloCheck {
    pub fn outcome(&self, reading: &Reading) -> Outcome {
        match reading {
            Reading::Value(v) if v.is_nan() => Outcome::NoData,
            Reading::Value(v) if self.comparison.holds(*v, self.threshold) => Outcome::Pass,
            Reading::Value(_) => Outcome::Fail,
            Reading::NoData => Outcome::NoData,
            Reading::Unavailable(_) => Outcome::Unavailable,
        }
    }

    /// What it wants, e.g. `<= 0.01`.
    pub fn wanted(&self) -> String {
        format!("{} {}", self.comparison.as_str(), self.threshold)
    }
}

impl Reading {
    /// The value as the status and events show it, or why there is none.
    pub fn shown(&self) -> String {
        match self {
            Reading::Value(v) if v.is_nan() => "NaN (no data)".to_string(),
            Reading::Value(v) => format!("{v}"),
            Reading::NoData => "no data".to_string(),
            Reading::Unavailable(why) => format!("unavailable: {why}"),
        }
    }
}

/// One check evaluated by the controller: the query it sent and what came back.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    pub check: String,
    pub query: String,
    pub reading: Reading,
}

/// The values a query's placeholders take.
#[derive(Clone, Debug)]
pub struct Bindings<'a> {
    pub cluster: &'a str,
    pub active_cluster: &'a str,
    pub namespace: &'a str,
    pub rayservice: &'a str,
    pub window_seconds: u32,
}

/// The query with its placeholders filled in.
pub fn render(query: &str, b: &Bindings<'_>) -> String {
    query
        .replace("{{cluster}}", b.cluster)
        .replace("{{activeCluster}}", b.active_cluster)
        .replace("{{namespace}}", b.namespace)
        .replace("{{rayservice}}", b.rayservice)
        .replace("{{window}}", &format!("{}s", b.window_seconds))
}

/// Whether the query is PromQL once its placeholders are filled in; else why not.
fn promql(query: &str) -> Result<(), String> {
    if query.trim().is_empty() {
        return Err("a PromQL query is required".into());
    }
    let mut rest = query;
    while let Some(start) = rest.find("{{") {
        let end = rest[start..].find("}}").ok_or("an unclosed {{")?;
        let name = &rest[start + 2..start + end];
        if !PLACEHOLDERS.contains(&name) {
            return Err(format!(
                "unknown placeholder {{{{{name}}}}}; known: {}",
                PLACEHOLDERS.map(|p| format!("{{{{{p}}}}}")).join(", ")
            ));
        }
        rest = &rest[start + end + 2..];
    }
    let sample = Bindings {
        cluster: "pending-cluster",
        active_cluster: "active-cluster",
        namespace: "default",
        rayservice: "rayservice",
        window_seconds: 60,
    };
    promql_parser::parser::parse(&render(query, &sample))
        .map(|_| ())
        .map_err(|e| format!("not PromQL: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_the_built_in_set_and_it_parses() {
        let checks = parse("default").unwrap();
        assert_eq!(checks, built_in());
        assert_eq!(checks.len(), 3);
        for c in &checks {
            promql(&c.query).unwrap();
        }
    }

    #[test]
    fn a_list_mixes_default_and_own_checks_with_their_defaults() {
        let raw = r#"
- default
- name: gpu-memory
  query: max(ray_node_gram_used{ray_io_cluster="{{cluster}}"}) / max(ray_node_gram_available{ray_io_cluster="{{cluster}}"})
  comparison: "<"
  threshold: 0.95
  onFailure: pause
"#;
        let checks = parse(raw).unwrap();
        assert_eq!(checks.len(), 4);
        let own = &checks[3];
        assert_eq!((own.window_seconds, own.failure_limit), (60, 2));
        assert_eq!(own.on_failure, OnFailure::Pause);
        assert!(own.comparison.holds(0.5, own.threshold));
        assert!(!own.comparison.holds(0.95, own.threshold));
    }

    #[test]
    fn every_problem_is_named_with_where_it_is() {
        let raw = r#"[
          {"name": "Bad Name", "query": "sum(rate(x[{{window}}]", "comparison": "<=", "threshold": 1},
          {"name": "ok", "query": "x{c=\"{{pod}}\"}", "comparison": "<=", "threshold": 1, "windowSeconds": 5, "failureLimit": 0},
          {"name": "ok", "query": "up", "comparison": ">=", "threshold": 1},
          "sometimes"
        ]"#;
        let problems = parse(raw).unwrap_err();
        let at: Vec<&str> = problems.iter().map(|p| p.at.as_str()).collect();
        assert_eq!(
            at,
            [
                "[0].name",
                "[0].query",
                "[1].query",
                "[1].windowSeconds",
                "[1].failureLimit",
                "[3]",
                "[2].name"
            ],
            "{problems:#?}"
        );
        assert!(problems[1].message.starts_with("not PromQL"), "{problems:#?}");
        assert!(
            problems[2].message.contains("unknown placeholder {{pod}}"),
            "{problems:#?}"
        );
    }

    #[test]
    fn unknown_fields_and_comparisons_are_refused() {
        let problems =
            parse(r#"[{"name": "a", "query": "up", "comparison": "==", "threshold": 1}]"#).unwrap_err();
        assert_eq!(problems[0].at, "");
        assert!(
            parse(r#"[{"name": "a", "query": "up", "comparison": "<=", "threshold": 1, "max": 2}]"#).is_err()
        );
    }

    #[test]
    fn placeholders_are_filled_in() {
        let b = Bindings {
            cluster: "llm-b",
            active_cluster: "llm-a",
            namespace: "ns",
            rayservice: "llm",
            window_seconds: 30,
        };
        assert_eq!(
            render(
                r#"a{c="{{cluster}}",o="{{activeCluster}}",n="{{namespace}}",r="{{rayservice}}"}[{{window}}]"#,
                &b
            ),
            r#"a{c="llm-b",o="llm-a",n="ns",r="llm"}[30s]"#
        );
    }
}
