//! `kubectl rayshift ...`, the kubectl plugin. Krew installs the rayshift binary as `kubectl-rayshift`
//! (one binary, krew's layout); `main` picks this command line by the name it was started as.

mod status;

use std::{io::Write, path::PathBuf, process::ExitCode, time::Duration};

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use jiff::Timestamp;
use kube::{
    Api, Client, Config, ResourceExt,
    api::{Patch, PatchParams},
    client::retry::RetryPolicy,
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{WatchStreamExt, watcher},
};
use rayshift_api::{
    RayService, UpgradeType,
    upgrade::{self, UpgradeOptions, decide::observed_in_status},
    upgrade_control::{self, UPGRADE_CONTROL_ANNOTATION},
};
use serde_json::json;

use rayshift_controller::apiserver;

use super::{CliError, validate};

/// Whether this process was started as the kubectl plugin (`kubectl-rayshift`, or a copy named so).
pub fn invoked_as_plugin() -> bool {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .is_some_and(|name| name == "kubectl-rayshift")
}

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-rayshift",
    bin_name = "kubectl rayshift",
    version,
    about = "Follow and steer rayshift's RayService upgrades"
)]
pub struct Plugin {
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    command: PluginCommand,
}

/// Where the RayService is (kubectl passes its own flags to no plugin, so they are taken again here).
#[derive(Debug, clap::Args)]
struct Target {
    /// Kubeconfig file (default: KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current one).
    #[arg(long, global = true)]
    context: Option<String>,
    /// Namespace (default: the context's).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Clusters, capacity, traffic, traffic step n/m, expected completion, why it waits, last events.
    Status {
        name: String,
        /// Print it again at every change of the RayService, until interrupted.
        #[arg(short = 'w', long)]
        watch: bool,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// The rest of the running upgrade from the live status, or the plan its next spec change would run.
    Plan {
        name: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
        #[command(flatten)]
        drain: super::Drain,
    },
    /// Hold the running upgrade where it is (rayshift.io/upgrade-control=pause).
    Pause { name: String },
    /// Let the upgrade go on (removes rayshift.io/upgrade-control).
    Resume { name: String },
    /// Skip the remaining intervals: finish as fast as verified capacity allows (rayshift.io/upgrade-control=promote).
    Promote { name: String },
    /// Roll the running upgrade back to the active cluster (rayshift.io/upgrade-control=abort).
    Abort { name: String },
    /// Check RayService manifests against the admission rules, as the webhook would.
    Validate(validate::Args),
    /// Print a shell completion script.
    Completion { shell: clap_complete::Shell },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    #[default]
    Text,
    Wide,
    Json,
    Yaml,
}

pub fn run(plugin: Plugin) -> Result<ExitCode, CliError> {
    match plugin.command {
        PluginCommand::Validate(args) => return validate::run(args),
        PluginCommand::Completion { shell } => {
            let mut command = Plugin::command().bin_name("kubectl-rayshift");
            clap_complete::generate(shell, &mut command, "kubectl-rayshift", &mut std::io::stdout());
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    runtime.block_on(run_against_cluster(plugin))
}

async fn run_against_cluster(plugin: Plugin) -> Result<ExitCode, CliError> {
    let (client, ns) = plugin.target.connect().await?;
    let api: Api<RayService> = Api::namespaced(client.clone(), &ns);
    let control = |value: Option<&'static str>, name: String| set_control(api.clone(), name, value);
    match plugin.command {
        PluginCommand::Status {
            name,
            watch: false,
            output,
        } => {
            print!(
                "{}",
                status::render(&status::of(&client, &api, &name).await?, output)?
            );
        }
        PluginCommand::Status {
            name,
            watch: true,
            output,
        } => follow(&client, &api, &name, output).await?,
        PluginCommand::Plan { name, output, drain } => {
            print!("{}", plan(&api.get(&name).await?, drain.seconds, output)?)
        }
        PluginCommand::Pause { name } => control(Some("pause"), name).await?,
        PluginCommand::Resume { name } => control(None, name).await?,
        PluginCommand::Promote { name } => control(Some("promote"), name).await?,
        PluginCommand::Abort { name } => control(Some("abort"), name).await?,
        PluginCommand::Validate(_) | PluginCommand::Completion { .. } => {
            unreachable!("handled without a cluster")
        }
    }
    Ok(ExitCode::SUCCESS)
}

impl Target {
    /// A client for the kubeconfig and context asked for, and the namespace to use.
    async fn connect(&self) -> Result<(Client, String), CliError> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match &self.kubeconfig {
            Some(path) => {
                let kc = Kubeconfig::read_from(path)?;
                Config::from_custom_kubeconfig(kc, &options).await
            }
            None => Config::from_kubeconfig(&options).await,
        }?;
        let ns = self
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = apiserver::client_retrying(config, throttled_retry()).map_err(CliError::Client)?;
        Ok((client, ns))
    }
}

/// A person waits for the answer: a throttling apiserver (429) or a passing 503/504 gets 5 more tries, each
/// at least its Retry-After (APF says 1 s) apart, about kubectl's patience; kube's default waits minutes.
fn throttled_retry() -> RetryPolicy {
    RetryPolicy::new(Duration::from_millis(500), Duration::from_secs(1), 5, true)
        .expect("a valid backoff: 500 ms to 1 s")
}

/// Prints the status, then again at every change of the RayService (deleted: ends).
async fn follow(client: &Client, api: &Api<RayService>, name: &str, output: Format) -> Result<(), CliError> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut changes = std::pin::pin!(watcher(api.clone(), config).default_backoff().applied_objects());
    let mut last = String::new();
    while let Some(change) = changes.next().await {
        change?;
        let shown = status::render(&status::of(client, api, name).await?, output)?;
        // The controller's own status writes arrive as changes too: print only what differs.
        if shown != last {
            print!("{shown}");
            if matches!(output, Format::Text | Format::Wide) {
                println!("---");
            }
            std::io::stdout().flush().map_err(CliError::Runtime)?;
            last = shown;
        }
    }
    Ok(())
}

/// Sets (or, with `None`, removes) the upgrade-control annotation and says what it does.
async fn set_control(
    api: Api<RayService>,
    name: String,
    value: Option<&'static str>,
) -> Result<(), CliError> {
    let patch = json!({"metadata": {"annotations": {UPGRADE_CONTROL_ANNOTATION: value}}});
    let rs = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let upgrading = rs.status.as_ref().is_some_and(|s| {
        s.pending_service_status
            .as_ref()
            .is_some_and(|p| p.ray_cluster_name.is_some())
    });
    let what = match value {
        Some("pause") => "paused",
        Some("promote") => "promoted: the remaining intervals are skipped",
        Some("abort") => "aborted: rolling back to the active cluster",
        _ => "resumed",
    };
    let note = if upgrading {
        ""
    } else {
        " (no upgrade runs now; this applies to the next one)"
    };
    println!(
        "rayservice {}/{name}: upgrade {what}{note}",
        rs.namespace().unwrap_or_default()
    );
    Ok(())
}

/// The rest of the running upgrade from its status, else the plan of the next one.
fn plan(rs: &RayService, drain_seconds: i64, output: Format) -> Result<String, CliError> {
    let name = rs.name_any();
    if rs.spec.upgrade_type() != Some(UpgradeType::NewClusterWithIncrementalUpgrade) {
        return Ok(format!(
            "RayService {name} has no incremental upgrade strategy: nothing to plan\n"
        ));
    }
    let Some(opts) = UpgradeOptions::of(rs, drain_seconds) else {
        return Ok(format!(
            "RayService {name}: clusterUpgradeOptions cannot make progress; run `kubectl rayshift validate`\n"
        ));
    };
    let control = upgrade_control::control(rs.annotations());
    let status = rs.status.clone().unwrap_or_default();
    let (title, plan) = match observed_in_status(&status, control, Timestamp::now()) {
        Some(now) => (
            format!("Rest of the running upgrade of {name} (times from now)"),
            upgrade::plan_from(&opts, &now, "now"),
        ),
        None => (
            format!("Next incremental upgrade of {name}"),
            upgrade::plan(&opts),
        ),
    };
    match output {
        Format::Json => Ok(serde_json::to_string_pretty(&plan)? + "\n"),
        Format::Yaml => Ok(yaml_serde::to_string(&plan)?),
        Format::Text | Format::Wide => {
            let checks = rayshift_api::slo::of(rs.annotations());
            Ok(super::plan::table(&title, &opts, &plan) + &super::plan::slo_table(&checks))
        }
    }
}
