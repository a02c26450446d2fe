//! `kubectl rayshift status`: what an on-call engineer asks of a RayService during an upgrade, from its
//! status, its annotations and its Events.

use std::fmt::Write;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Event;
use kube::{Api, Client, ResourceExt, api::ListParams};
use rayshift_api::{
    RayService,
    rayservice::ClusterServiceStatus,
    upgrade::{self, Direction, UpgradeOptions, decide::observed_in_status},
    upgrade_control::{self, DEFAULT_DRAIN_SECONDS},
};
use rayshift_controller::metrics::ServiceView;
use serde::Serialize;

use super::Format;
use crate::cli::CliError;

/// Events shown, newest last.
const EVENTS_SHOWN: usize = 5;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    namespace: String,
    name: String,
    strategy: String,
    phase: &'static str,
    clusters: Vec<ClusterRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traffic_step: Option<Step>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expected_completion: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seconds_left: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting: Option<Waiting>,
    #[serde(skip_serializing_if = "Option::is_none")]
    control: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upgrade_start_time: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_traffic_step_time: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_aware_since: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_aware_why: Option<&'static str>,
    /// The SLO checks' last evaluations in the running upgrade.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    slo_checks: Vec<rayshift_api::progress::SloCheckStatus>,
    events: Vec<EventRow>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterRow {
    role: &'static str,
    name: String,
    target_capacity: i32,
    traffic_percent: i32,
    serve_apps: String,
}

/// Traffic steps taken of those the plan has.
#[derive(Debug, Serialize)]
struct Step {
    done: usize,
    total: usize,
}

#[derive(Debug, Serialize)]
struct Waiting {
    reason: String,
    message: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct EventRow {
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<Timestamp>,
    #[serde(rename = "type")]
    type_: String,
    reason: String,
    message: String,
}

/// Reads the RayService and its Events.
pub async fn of(client: &Client, api: &Api<RayService>, name: &str) -> Result<StatusView, CliError> {
    let rs = api.get(name).await?;
    let events = events_of(client, &rs).await?;
    Ok(view(&rs, events, Timestamp::now()))
}

async fn events_of(client: &Client, rs: &RayService) -> Result<Vec<EventRow>, CliError> {
    let ns = rs.namespace().unwrap_or_default();
    let fields = format!(
        "involvedObject.kind=RayService,involvedObject.name={},involvedObject.uid={}",
        rs.name_any(),
        rs.uid().unwrap_or_default()
    );
    let listed = Api::<Event>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().fields(&fields))
        .await?;
    let mut rows: Vec<EventRow> = listed.items.into_iter().map(event_row).collect();
    rows.sort_by_key(|e| e.time);
    let skip = rows.len().saturating_sub(EVENTS_SHOWN);
    Ok(rows.split_off(skip))
}

fn event_row(e: Event) -> EventRow {
    let time = e
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
        .or(e.event_time.as_ref().map(|t| t.0))
        .or(e.last_timestamp.as_ref().map(|t| t.0))
        .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0));
    EventRow {
        time,
        type_: e.type_.unwrap_or_default(),
        reason: e.reason.unwrap_or_default(),
        message: e.message.unwrap_or_default(),
    }
}

/// The view of `rs` at `now`.
fn view(rs: &RayService, events: Vec<EventRow>, now: Timestamp) -> StatusView {
    let status = rs.status.clone().unwrap_or_default();
    let control = upgrade_control::control(rs.annotations());
    let clusters = [
        ("active", &status.active_service_status),
        ("pending", &status.pending_service_status),
    ]
    .into_iter()
    .filter_map(|(role, side)| cluster_row(role, side.as_ref()?))
    .collect();
    let expected = status.progress.upgrade_expected_completion_time;
    StatusView {
        namespace: rs.namespace().unwrap_or_default(),
        name: rs.name_any(),
        strategy: rs
            .spec
            .upgrade_type()
            .map_or_else(|| "NewCluster".to_string(), |t| format!("{t:?}")),
        phase: ServiceView::of(rs, &status, now).phase,
        clusters,
        traffic_step: traffic_step(rs, &status, control, now),
        expected_completion: expected,
        seconds_left: expected.map(|t| t.duration_since(now).as_secs_f64().round()),
        waiting: waiting(&status),
        control: rs
            .annotations()
            .get(upgrade_control::UPGRADE_CONTROL_ANNOTATION)
            .cloned(),
        upgrade_start_time: status.progress.upgrade_start_time,
        last_traffic_step_time: upgrade::decide::last_step_time(&status),
        slo_checks: status.progress.slo_checks.clone(),
        resource_aware_since: status.progress.resource_aware_since,
        resource_aware_why: status
            .progress
            .resource_aware_since
            .map(|_| resource_aware_why(rs)),
        events,
    }
}

/// Why a running upgrade paces ResourceAware, from what its RayService asks.
fn resource_aware_why(rs: &RayService) -> &'static str {
    let asked = rs.annotations().get(upgrade_control::RESOURCE_AWARE_ANNOTATION);
    match asked.map(String::as_str) {
        Some("always") => "rayshift.io/resource-aware: always asks for it",
        Some("on-stall") => {
            "the pending cluster stalled for lack of a resource (rayshift.io/resource-aware: on-stall)"
        }
        _ => "of the operator's --resource-aware default",
    }
}

fn cluster_row(role: &'static str, side: &ClusterServiceStatus) -> Option<ClusterRow> {
    let default = if role == "active" { 100 } else { 0 };
    let apps = side.application_statuses.clone().unwrap_or_default();
    let running = apps
        .values()
        .filter(|a| a.status.as_deref() == Some("RUNNING"))
        .count();
    Some(ClusterRow {
        role,
        name: side.ray_cluster_name.clone()?,
        target_capacity: side.target_capacity.unwrap_or(default),
        traffic_percent: side.traffic_routed_percent.unwrap_or(default),
        serve_apps: format!("{running}/{} RUNNING", apps.len()),
    })
}

/// Traffic steps done of the plan's, going forward (a rollback's steps are not the plan's).
fn traffic_step(
    rs: &RayService,
    status: &rayshift_api::rayservice::RayServiceStatuses,
    control: upgrade_control::Control,
    now: Timestamp,
) -> Option<Step> {
    let obs = observed_in_status(status, control, now)?;
    let opts = UpgradeOptions::of(rs, DEFAULT_DRAIN_SECONDS)?;
    if obs.direction == Direction::Rollback {
        return None;
    }
    let plan = upgrade::plan(&opts);
    // A traffic step is a row whose weights differ from the row before (not a match on the row's wording).
    let done = plan
        .steps
        .windows(2)
        .filter(|w| w[1].pending_traffic != w[0].pending_traffic)
        .filter(|w| w[1].pending_traffic <= obs.pending.traffic)
        .count();
    Some(Step {
        done,
        total: plan.traffic_steps,
    })
}

/// Why the upgrade does not move, from its Progressing condition.
fn waiting(status: &rayshift_api::rayservice::RayServiceStatuses) -> Option<Waiting> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == upgrade::decide::PROGRESSING && c.status == "False")
        .map(|c| Waiting {
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
}

pub fn render(view: &StatusView, format: Format) -> Result<String, CliError> {
    match format {
        Format::Json => Ok(serde_json::to_string_pretty(view)? + "\n"),
        Format::Yaml => Ok(yaml_serde::to_string(view)?),
        Format::Text => Ok(text(view, false, Timestamp::now())),
        Format::Wide => Ok(text(view, true, Timestamp::now())),
    }
}

fn text(v: &StatusView, wide: bool, now: Timestamp) -> String {
    let mut out = headline(v);
    let _ = writeln!(
        out,
        "{:<8} {:<32} {:>8} {:>8}  SERVE APPS",
        "ROLE", "CLUSTER", "CAPACITY", "TRAFFIC"
    );
    for c in &v.clusters {
        let _ = writeln!(
            out,
            "{:<8} {:<32} {:>7}% {:>7}%  {}",
            c.role, c.name, c.target_capacity, c.traffic_percent, c.serve_apps
        );
    }
    if let Some(w) = &v.waiting {
        let _ = writeln!(out, "Waiting: {}: {}", w.reason, w.message);
    }
    if let Some(c) = &v.control {
        let _ = writeln!(out, "Control: {c} (rayshift.io/upgrade-control)");
    }
    if let (Some(t), Some(why)) = (v.resource_aware_since, v.resource_aware_why) {
        let _ = writeln!(
            out,
            "ResourceAware since {t}: the active cluster gives way first, because {why}"
        );
    }
    slo_lines(&mut out, v, wide, now);
    if wide {
        let at = |t: Option<Timestamp>| t.map_or_else(|| "-".to_string(), |t| t.to_string());
        let _ = writeln!(out, "Upgrade started: {}", at(v.upgrade_start_time));
        let _ = writeln!(out, "Last traffic step: {}", at(v.last_traffic_step_time));
    }
    event_lines(&mut out, v, now);
    out
}

/// The first line: phase, strategy, step and expected end.
fn headline(v: &StatusView) -> String {
    let mut out = format!(
        "RayService {}/{}: {} ({})",
        v.namespace, v.name, v.phase, v.strategy
    );
    if let Some(s) = &v.traffic_step {
        let _ = write!(out, ", traffic step {}/{}", s.done, s.total);
    }
    match (v.expected_completion, v.seconds_left) {
        (Some(t), Some(left)) if left >= 0.0 => {
            let _ = write!(out, ", expected to end in {} (at {t})", duration(left));
        }
        (Some(t), Some(left)) => {
            let _ = write!(out, ", {} past its expected end (at {t})", duration(-left));
        }
        _ => {}
    }
    out.push('\n');
    out
}

fn slo_lines(out: &mut String, v: &StatusView, wide: bool, now: Timestamp) {
    for c in &v.slo_checks {
        let age = duration(now.duration_since(c.time).as_secs_f64().max(0.0));
        let _ = write!(
            out,
            "SLO check {}: {} = {} ({age} ago, {} failed in a row)",
            c.name,
            c.outcome.as_str(),
            c.value,
            c.failures
        );
        if wide {
            let _ = write!(out, ": {}", c.query);
        }
        let _ = writeln!(out);
    }
}

fn event_lines(out: &mut String, v: &StatusView, now: Timestamp) {
    if !v.events.is_empty() {
        let _ = writeln!(out, "Events:");
    }
    for e in &v.events {
        let age = e.time.map_or_else(
            || "?".to_string(),
            |t| duration(now.duration_since(t).as_secs_f64().max(0.0)),
        );
        let _ = writeln!(out, "  {age:>6}  {:<7}  {:<28}  {}", e.type_, e.reason, e.message);
    }
}

/// `1h2m`, `3m4s`, `5s`.
fn duration(seconds: f64) -> String {
    let s = seconds.round() as i64;
    match s {
        s if s >= 3600 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{}m{}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_kubectl_ages() {
        assert_eq!(duration(4.4), "4s");
        assert_eq!(duration(75.0), "1m15s");
        assert_eq!(duration(7325.0), "2h2m");
    }
}
