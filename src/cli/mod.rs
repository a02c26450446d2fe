//! Subcommands. Exit codes: 0 allowed / ok; 1 denied (`validate`, `plan`) or a failure while running (`webhook`,
//! `controller`, `run`); 2 bad flags or unreadable input (as clap's own usage errors).

mod certs;
mod controller;
pub mod kubectl;
mod logging;
mod plan;
mod shutdown;
mod validate;
mod webhook;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand, ValueEnum};
use rayshift_api::{
    FeatureGates,
    defaulting::{OperatorConfig, UpgradeDefaults},
    documents,
};
use serde_json::Value;

/// `--drain-seconds`, the same for the controller and for the plans that preview it.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct Drain {
    /// Seconds a cluster whose traffic went to 0 keeps its last replicas before its target_capacity goes to 0:
    /// requests a gateway still sends it under the previous weights are served, not held by a Serve proxy with
    /// no replica. A plan takes the controller's value. A RayService's rayshift.io/drain-seconds annotation wins.
    #[arg(
        long = "drain-seconds",
        default_value_t = rayshift_api::upgrade_control::DEFAULT_DRAIN_SECONDS,
        value_parser = clap::value_parser!(i64).range(0..)
    )]
    pub seconds: i64,
}

/// `--enable-zero-downtime`, KubeRay's `ENABLE_ZERO_DOWNTIME`: the same for the controller and for the plans that
/// preview it.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct ZeroDowntime {
    /// KubeRay's operator setting of the same name: false makes a RayService with no upgradeStrategy.type
    /// update its cluster in place (None) instead of building a new one. As in KubeRay, only "false" (any
    /// case) turns it off.
    #[arg(
        long = "enable-zero-downtime",
        env = "ENABLE_ZERO_DOWNTIME",
        value_name = "BOOL",
        default_value = "true",
        value_parser = zero_downtime,
        action = clap::ArgAction::Set
    )]
    pub enabled: bool,
}

/// KubeRay's reading of `ENABLE_ZERO_DOWNTIME`: only "false", in any case, turns it off.
fn zero_downtime(s: &str) -> Result<bool, String> {
    Ok(!s.trim().eq_ignore_ascii_case("false"))
}

pub const EXIT_DENIED: u8 = 1;
pub const EXIT_RUNTIME: u8 = 1;
pub const EXIT_UNREADABLE: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "rayshift",
    version,
    about = "Admission webhook and controller for Ray Serve RayService upgrades"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check RayService manifests against the admission rules, as the webhook would.
    Validate(validate::Args),
    /// Show the incremental upgrade timeline of a RayService, assuming clusters become ready at once.
    Plan(plan::Args),
    /// Print the CustomResourceDefinitions (RayService, RayCluster) generated from rayshift's types.
    Crds {
        /// Print the Gateway API CRDs (GatewayClass, Gateway, HTTPRoute) instead, for clusters without them.
        #[arg(long)]
        gateway_api: bool,
    },
    /// Run the admission webhook (validating + mutating RayService over TLS).
    Webhook(webhook::Command),
    /// Certificates for the webhook and its webhook configurations.
    #[command(subcommand)]
    Certs(certs::Command),
    /// Run the RayService controller.
    Controller(controller::Command),
    /// Run the webhook and the controller in one process.
    Run(controller::RunCommand),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    #[default]
    Text,
    Json,
}

/// Errors of the CLI itself; rule violations are verdicts, not errors.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Unparsable {
        path: String,
        source: rayshift_api::Error,
    },
    #[error("{path}: document {index} is {why}")]
    NotARayService {
        path: String,
        index: usize,
        why: rayshift_api::documents::NotARayService,
    },
    #[error("{path}: no RayService in file")]
    NoRayService { path: String },
    /// The violated rule names its field path.
    #[error("{path}: {rule}")]
    Undecodable {
        path: String,
        rule: Box<rayshift_api::validation::FieldError>,
    },
    #[error(transparent)]
    Api(#[from] rayshift_api::Error),
    #[error("JSON output: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Webhook(#[from] rayshift_webhook::Error),
    #[error(transparent)]
    Controller(#[from] rayshift_controller::Error),
    #[error("Kubernetes client: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("Kubernetes client: {0}")]
    InferConfig(#[from] kube::config::InferConfigError),
    #[error("Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("Kubernetes API: {0}")]
    KubeApi(#[from] kube::Error),
    #[error("watching: {0}")]
    Watch(#[from] kube::runtime::watcher::Error),
    #[error("YAML output: {0}")]
    Yaml(#[from] yaml_serde::Error),
    #[error("runtime: {0}")]
    Runtime(std::io::Error),
}

impl CliError {
    /// 2 when the input, the flags or a file they name are bad; 1 when running failed.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Read { .. }
            | CliError::Unparsable { .. }
            | CliError::NotARayService { .. }
            | CliError::NoRayService { .. }
            | CliError::Undecodable { .. }
            | CliError::Api(_)
            | CliError::Json(_)
            | CliError::Yaml(_)
            | CliError::Controller(rayshift_controller::Error::LeaseTiming(_)) => EXIT_UNREADABLE,
            CliError::Webhook(_)
            | CliError::Controller(_)
            | CliError::Kubeconfig(_)
            | CliError::InferConfig(_)
            | CliError::Client(_)
            | CliError::KubeApi(_)
            | CliError::Watch(_)
            | CliError::Runtime(_) => EXIT_RUNTIME,
        }
    }
}

pub fn run(cli: Cli) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Validate(args) => validate::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Crds { gateway_api } => {
            let crds = if gateway_api {
                rayshift_api::crd::gateway_api()
            } else {
                rayshift_api::crd::all()
            };
            print!("{}", rayshift_api::crd::yaml_stream(&crds));
            Ok(ExitCode::SUCCESS)
        }
        Command::Webhook(cmd) => webhook::run(cmd),
        Command::Certs(cmd) => certs::run(cmd),
        Command::Controller(cmd) => controller::run(cmd),
        Command::Run(cmd) => controller::run_all(cmd),
    }
}

/// Operator-wide defaults for `clusterUpgradeOptions`: flags override the config file; what a user
/// writes in a RayService overrides both.
#[derive(Debug, clap::Args)]
pub struct DefaultsArgs {
    /// Operator config file (YAML) with `clusterUpgradeOptions` defaults.
    #[arg(long, value_name = "FILE", env = "RAYSHIFT_CONFIG")]
    config: Option<PathBuf>,
    /// Default maxSurgePercent (built-in default: 100).
    #[arg(long, value_name = "PERCENT")]
    default_max_surge_percent: Option<i32>,
    /// Default stepSizePercent.
    #[arg(long, value_name = "PERCENT")]
    default_step_size_percent: Option<i32>,
    /// Default intervalSeconds.
    #[arg(long, value_name = "SECONDS")]
    default_interval_seconds: Option<i32>,
    /// Default gatewayClassName.
    #[arg(long, value_name = "NAME")]
    default_gateway_class_name: Option<String>,
}

impl DefaultsArgs {
    fn load(&self) -> Result<UpgradeDefaults, CliError> {
        let mut defaults = match &self.config {
            Some(path) => OperatorConfig::from_yaml(&read(path)?)?.cluster_upgrade_options,
            None => UpgradeDefaults::default(),
        };
        if let Some(v) = self.default_max_surge_percent {
            defaults.max_surge_percent = Some(v);
        }
        if let Some(v) = self.default_step_size_percent {
            defaults.step_size_percent = Some(v);
        }
        if let Some(v) = self.default_interval_seconds {
            defaults.interval_seconds = Some(v);
        }
        if let Some(v) = &self.default_gateway_class_name {
            defaults.gateway_class_name = Some(v.clone());
        }
        defaults.check()?;
        Ok(defaults)
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)
}

/// Binds `--metrics-addr` and serves `/metrics`, `/healthz` and `/readyz` on it until shutdown.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    registry: &prometheus::Registry,
    ready: std::sync::Arc<dyn Fn() -> bool + Send + Sync>,
    shutdown: &tokio::sync::watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<Result<(), rayshift_webhook::Error>>, CliError> {
    use rayshift_webhook::server;
    let listener = server::bind(addr, "metrics").await?;
    let router = server::admin_router(registry.clone(), ready);
    Ok(tokio::spawn(server::serve_admin(
        listener,
        router,
        shutdown.clone(),
    )))
}

pub fn parse_gates(s: &str) -> Result<FeatureGates, String> {
    s.parse::<FeatureGates>().map_err(|e| e.to_string())
}

fn parse_kuberay_version(s: &str) -> Result<rayshift_api::KubeRayVersion, String> {
    s.parse().map_err(|e: rayshift_api::Error| e.to_string())
}

/// Feature gates and the KubeRay release whose defaults they start from.
#[derive(Clone, Debug, clap::Args)]
pub struct GateArgs {
    /// Feature gates, Kubernetes syntax: RayServiceIncrementalUpgrade=true|false.
    #[arg(long, value_parser = parse_gates, default_value = "", env = "RAYSHIFT_FEATURE_GATES")]
    feature_gates: FeatureGates,
    /// KubeRay release whose semantics the rules follow where releases differ (1.5, 1.6 or 1.7), and whose
    /// gate defaults apply unless --feature-gates names the gate: RayJobDeletionPolicy and RayMultiHostIndexing
    /// are on from 1.6, RayServiceIncrementalUpgrade from 1.7.
    #[arg(long, value_parser = parse_kuberay_version, default_value = "1.6", env = "RAYSHIFT_KUBERAY_VERSION")]
    kuberay_version: rayshift_api::KubeRayVersion,
}

impl GateArgs {
    pub fn gates(&self) -> FeatureGates {
        self.feature_gates.clone().for_kuberay(self.kuberay_version)
    }
}

/// The progress deadline: the controller rolls back after it, and the webhook warns about pacing that
/// reaches it, so both read the same flag.
#[derive(Clone, Debug, clap::Args)]
pub struct DeadlineArgs {
    /// Roll an incremental upgrade back when it makes no progress for this many seconds after a step is due
    /// (annotation rayshift.io/progress-deadline-seconds overrides it).
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(i64).range(1..))]
    pub progress_deadline_seconds: i64,
}

/// A duration flag: seconds (`0.3`, `60`) or Go-style units (`300ms`, `2s`, `1m30s`), at least `min` seconds.
/// A smaller value is refused with a usage error (exit 2), never silently raised.
pub fn duration_at_least(
    min: f64,
) -> impl Fn(&str) -> Result<std::time::Duration, String> + Clone + Send + Sync {
    move |s: &str| {
        let secs = s
            .trim()
            .parse::<f64>()
            .ok()
            .or_else(|| rayshift_api::validation::go_duration_seconds(s.trim()))
            .ok_or_else(|| {
                format!("{s:?} is not a duration: give seconds (0.5, 60) or units (500ms, 2s, 1m)")
            })?;
        if !secs.is_finite() || secs < min {
            return Err(format!("must be at least {min} s"));
        }
        Ok(std::time::Duration::from_secs_f64(secs))
    }
}

fn read(path: &std::path::Path) -> Result<String, CliError> {
    let shown = path.display().to_string();
    if shown == "-" {
        return std::io::read_to_string(std::io::stdin())
            .map_err(|source| CliError::Read { path: shown, source });
    }
    std::fs::read_to_string(path).map_err(|source| CliError::Read { path: shown, source })
}

/// The RayService documents of the given files, in order; anything else is an error.
fn rayservice_documents(files: &[PathBuf]) -> Result<Vec<Value>, CliError> {
    let mut out = Vec::new();
    for path in files {
        let text = read(path)?;
        let shown = path.display().to_string();
        let docs = documents::parse_stream(&text).map_err(|source| CliError::Unparsable {
            path: shown.clone(),
            source,
        })?;
        for (index, doc) in docs.into_iter().enumerate() {
            if let Some(why) = documents::not_a_rayservice(&doc) {
                return Err(CliError::NotARayService {
                    path: shown,
                    index,
                    why,
                });
            }
            out.push(doc);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every subcommand's arguments are consistent (no duplicate names between flattened groups).
    #[test]
    fn cli_definition_is_valid() {
        super::Cli::command().debug_assert();
    }
}
