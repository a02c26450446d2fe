//! `rayshift plan`: the incremental upgrade timeline of a RayService.

use std::{path::PathBuf, process::ExitCode};

use kube::ResourceExt;
use rayshift_api::{
    UpgradeType, defaulting, documents,
    gateway_attachment::Attachment,
    slo,
    upgrade::{self, Plan, UpgradeOptions},
    upgrade_control, validation,
};

use super::{CliError, DefaultsArgs, EXIT_DENIED, Output, rayservice_documents};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// RayService manifest; the first RayService in it is planned.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    file: PathBuf,
    /// Expected time for Serve to run the replicas of one target_capacity change (the upgrade waits for it
    /// before moving traffic): the expected duration adds it per change.
    #[arg(long, default_value_t = 0.0, value_parser = non_negative_seconds)]
    capacity_wait_seconds: f64,
    /// Plan it ResourceAware (the active cluster gives way first, by maxUnavailablePercent at most), whatever
    /// its rayshift.io/resource-aware says; `always` there plans it so too.
    #[arg(long)]
    resource_aware: bool,
    /// ResourceAware: the capacity the cluster holds beyond one full copy, in percent of it. Default:
    /// stepSizePercent, what the controller assumes while it runs the upgrade.
    #[arg(long, value_parser = clap::value_parser!(i32).range(0..=100))]
    spare_capacity_percent: Option<i32>,
    #[command(flatten)]
    drain: super::Drain,
    #[command(flatten)]
    zero_downtime: super::ZeroDowntime,
    #[command(flatten)]
    defaults: DefaultsArgs,
    #[arg(short, long, value_enum, default_value_t)]
    output: Output,
}

pub fn run(args: Args) -> Result<ExitCode, CliError> {
    let defaults = args.defaults.load()?;
    let (mut doc, name) = first_rayservice(&args.file)?;
    defaulting::apply_defaults(&mut doc, &defaults);
    let rs = validation::decode(&doc).map_err(|rule| CliError::Undecodable {
        path: args.file.display().to_string(),
        rule: Box::new(rule),
    })?;
    let kind = rs.spec.upgrade_type_with(args.zero_downtime.enabled);
    if kind != Some(UpgradeType::NewClusterWithIncrementalUpgrade) {
        println!(
            "RayService {name} uses {}; there is no incremental plan.",
            strategy(kind)
        );
        return Ok(ExitCode::SUCCESS);
    }
    let Some(opts) = UpgradeOptions::of(&rs, args.drain.seconds) else {
        eprintln!(
            "RayService {name}: clusterUpgradeOptions cannot make progress (need stepSizePercent and \
             maxSurgePercent in 1..100 and intervalSeconds >= 0); run `rayshift validate` for details"
        );
        return Ok(ExitCode::from(EXIT_DENIED));
    };
    let ns = rs.metadata.namespace.as_deref().unwrap_or("default");
    let entry = match Attachment::from_annotations(rs.annotations(), ns) {
        Ok(a) => a.describe(&rs.name_any(), opts_class(&rs)),
        Err(e) => {
            eprintln!("RayService {name}: {e}; run `rayshift validate` for details");
            return Ok(ExitCode::from(EXIT_DENIED));
        }
    };
    let opts = resource_aware(&rs, opts, &args);
    print_plan(&args, &name, &opts, &entry, &slo::of(rs.annotations()))?;
    Ok(ExitCode::SUCCESS)
}

/// The file's first RayService and its display name (a note when it holds more).
fn first_rayservice(file: &PathBuf) -> Result<(serde_json::Value, String), CliError> {
    let mut docs = rayservice_documents(std::slice::from_ref(file))?;
    if docs.len() > 1 {
        eprintln!(
            "note: {} holds {} RayServices; planning the first",
            file.display(),
            docs.len()
        );
    }
    let Some(doc) = docs.drain(..).next() else {
        let path = file.display().to_string();
        return Err(CliError::NoRayService { path });
    };
    let (name, _) = documents::display_name(&doc);
    Ok((doc, name))
}

/// What a strategy other than the incremental one does instead.
fn strategy(kind: Option<UpgradeType>) -> &'static str {
    match kind {
        Some(UpgradeType::None) => "None: clusters are updated in place, no new cluster and no traffic shift",
        Some(_) => {
            "NewCluster (blue/green): the new cluster is built at full capacity and traffic switches at once when it is ready"
        }
        None => "an unknown upgrade strategy; run `rayshift validate`",
    }
}

/// The plan of an incremental upgrade, as JSON or as tables.
fn print_plan(
    args: &Args,
    name: &str,
    opts: &UpgradeOptions,
    entry: &str,
    checks: &[slo::SloCheck],
) -> Result<(), CliError> {
    let plan = upgrade::plan(opts);
    let expected = plan.min_duration_seconds + plan.capacity_changes as f64 * args.capacity_wait_seconds;
    if args.output == Output::Json {
        let mut json = serde_json::to_value(&plan)?;
        json["traffic_entry"] = serde_json::Value::String(entry.to_string());
        json["expected_duration_seconds"] = serde_json::json!(expected);
        json["slo_checks"] = serde_json::to_value(checks)?;
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    print!(
        "{}",
        table(&format!("Incremental upgrade of {name}"), opts, &plan)
    );
    println!(
        "expected duration: {expected}s ({} capacity changes, {}s each to run their replicas)",
        plan.capacity_changes, args.capacity_wait_seconds
    );
    println!("traffic enters through: {entry}");
    if let Some(ra) = opts.resource_aware {
        println!(
            "ResourceAware: serving capacity dips to {}% (maxUnavailablePercent {}, spare capacity {}%)",
            plan.min_serving_capacity, ra.max_unavailable_percent, ra.spare_percent
        );
    }
    print!("{}", slo_table(checks));
    Ok(())
}

/// The SLO checks each traffic step waits for, one line each.
pub(super) fn slo_table(checks: &[slo::SloCheck]) -> String {
    if checks.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "SLO checks before each traffic step after the first and before the promotion ({}):\n",
        slo::SLO_CHECKS_ANNOTATION
    );
    for c in checks {
        out += &format!(
            "  {}: ({}) {} {} over {}s, every {}s, {} failures in a row → {:?}\n",
            c.name,
            c.query,
            c.comparison.as_str(),
            c.threshold,
            c.window_seconds,
            c.interval_seconds,
            c.failure_limit,
            c.on_failure
        );
    }
    // Each gated step waits at least the longest window after the step before it.
    if let Some(window) = checks.iter().map(|c| c.window_seconds).max() {
        out += &format!("  (so each gated step comes at least {window}s after the one before it)\n");
    }
    out
}

/// The options with ResourceAware pacing, when asked for or annotated `always`.
fn resource_aware(rs: &rayshift_api::RayService, opts: UpgradeOptions, args: &Args) -> UpgradeOptions {
    let annotations = rs.annotations();
    let mode = upgrade_control::resource_aware_mode(annotations, Default::default());
    if !args.resource_aware && mode != upgrade_control::ResourceAwareMode::Always {
        return opts;
    }
    let unavailable = upgrade_control::max_unavailable_percent(annotations, opts.step_size_percent);
    let live = upgrade::resource_aware::ResourceAware::live(unavailable, &opts);
    UpgradeOptions {
        resource_aware: Some(upgrade::resource_aware::ResourceAware {
            spare_percent: args.spare_capacity_percent.unwrap_or(live.spare_percent),
            ..live
        }),
        ..opts
    }
}

fn non_negative_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{text:?} is not a number of seconds >= 0")),
    }
}

fn opts_class(rs: &rayshift_api::RayService) -> &str {
    rs.spec
        .cluster_upgrade_options()
        .and_then(|o| o.gateway_class_name.as_deref())
        .unwrap_or("")
}

/// The plan as a table under `heading`, with the options it was made with.
pub(super) fn table(heading: &str, opts: &UpgradeOptions, plan: &Plan) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{heading}: maxSurgePercent {}, stepSizePercent {}, intervalSeconds {}, drain {}s \
         before a cluster without traffic goes to capacity 0",
        opts.max_surge_percent,
        opts.step_size_percent,
        opts.interval.as_secs(),
        opts.drain.as_secs()
    );
    let _ = writeln!(
        out,
        "{:>8}  {:>15}  {:>16}  {:>14}  {:>15}  action",
        "time", "active capacity", "pending capacity", "active traffic", "pending traffic"
    );
    for s in &plan.steps {
        let _ = writeln!(
            out,
            "{:>7}s  {:>14}%  {:>15}%  {:>13}%  {:>14}%  {}",
            s.t_seconds, s.active_capacity, s.pending_capacity, s.active_traffic, s.pending_traffic, s.action
        );
    }
    let _ = writeln!(out, "peak total capacity: {}%", plan.peak_total_capacity);
    let _ = writeln!(out, "traffic steps: {}", plan.traffic_steps);
    let _ = writeln!(
        out,
        "minimum duration: {}s (clusters ready at once)",
        plan.min_duration_seconds
    );
    out
}
