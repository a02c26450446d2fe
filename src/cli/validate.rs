//! `rayshift validate`: the webhook's verdict, offline.

use std::{path::PathBuf, process::ExitCode};

use rayshift_api::{
    defaulting, documents,
    rayservice::RAYSHIFT_MANAGER,
    validation::{self, ValidationConfig, Verdict},
};
use serde_json::{Value, json};

use super::{CliError, DefaultsArgs, EXIT_DENIED, GateArgs, Output, rayservice_documents};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// RayService manifest (multi-document YAML); repeat for more files, `-` for stdin.
    #[arg(short = 'f', long = "filename", required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    #[command(flatten)]
    gates: GateArgs,
    /// The managedBy value this rayshift answers to (accepted besides KubeRay's own).
    #[arg(long, default_value = RAYSHIFT_MANAGER)]
    managed_by: String,
    #[command(flatten)]
    defaults: DefaultsArgs,
    #[arg(short, long, value_enum, default_value_t)]
    output: Output,
}

struct Review {
    name: String,
    namespace: String,
    verdict: Verdict,
    patch: json_patch::Patch,
}

pub fn run(args: Args) -> Result<ExitCode, CliError> {
    let defaults = args.defaults.load()?;
    let mut config = ValidationConfig {
        feature_gates: args.gates.gates(),
        ..ValidationConfig::default()
    };
    if !config.managed_by_values.contains(&args.managed_by) {
        config.managed_by_values.push(args.managed_by);
    }
    let reviews: Vec<Review> = rayservice_documents(&args.files)?
        .into_iter()
        .map(|mut doc| {
            let (name, namespace) = documents::display_name(&doc);
            // The apiserver runs mutating admission before validating admission; so do we.
            let patch = defaulting::apply_defaults(&mut doc, &defaults);
            Review {
                name,
                namespace,
                verdict: validation::review(&doc, None, &config),
                patch,
            }
        })
        .collect();
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&to_json(&reviews)?)?),
        Output::Text => print_text(&reviews),
    }
    Ok(if reviews.iter().all(|r| r.verdict.allowed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_DENIED)
    })
}

fn to_json(reviews: &[Review]) -> Result<Value, CliError> {
    let items = reviews
        .iter()
        .map(|r| {
            Ok(json!({
                "name": r.name,
                "namespace": r.namespace,
                "allowed": r.verdict.allowed(),
                "errors": r.verdict.errors.iter().map(|e| json!({"field": e.field, "message": e.detail()})).collect::<Vec<_>>(),
                "warnings": r.verdict.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "patch": serde_json::to_value(&r.patch)?,
            }))
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    Ok(Value::Array(items))
}

fn print_text(reviews: &[Review]) {
    for r in reviews {
        let who = if r.namespace.is_empty() {
            r.name.clone()
        } else {
            format!("{}/{}", r.namespace, r.name)
        };
        let verdict = if r.verdict.allowed() { "allowed" } else { "denied" };
        println!("RayService {who}: {verdict}");
        for e in &r.verdict.errors {
            println!("  error: {e}");
        }
        for w in &r.verdict.warnings {
            println!("  warning: {w}");
        }
        for op in &r.patch.0 {
            println!("  default: {op}");
        }
    }
}
