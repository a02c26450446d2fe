//! `rayshift webhook`: the admission webhook server.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use prometheus::Registry;
use rayshift_api::{
    rayservice::RAYSHIFT_MANAGER,
    validation::{ServeConfigMemo, ValidationConfig},
};
use rayshift_webhook::{
    Webhook, WebhookOptions,
    admission::{AdmissionConfig, SERVE_CONFIGS_KEPT},
    server::ServerSettings,
};

use super::{
    CliError, DeadlineArgs, DefaultsArgs, GateArgs, logging::LogArgs, runtime, serve_metrics, shutdown,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address of the HTTPS admission endpoint.
    #[arg(long, default_value = "0.0.0.0:9443", env = "RAYSHIFT_WEBHOOK_ADDR")]
    pub webhook_addr: SocketAddr,
    /// PEM certificate chain (a TLS Secret's tls.crt); re-read when it changes.
    #[arg(long, default_value = "/etc/rayshift/tls/tls.crt")]
    pub tls_cert_file: PathBuf,
    /// PEM private key (a TLS Secret's tls.key).
    #[arg(long, default_value = "/etc/rayshift/tls/tls.key")]
    pub tls_key_file: PathBuf,
    /// Seconds between checks of the certificate files for a rotated pair.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub cert_reload_interval_seconds: u64,
    /// Largest AdmissionReview body accepted; larger ones get 413.
    #[arg(long, default_value_t = 8 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Time allowed to read and answer one request; slower ones get 408.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_seconds: u64,
    #[command(flatten)]
    pub gates: GateArgs,
    /// The managedBy value rayshift answers to (accepted besides KubeRay's own).
    #[arg(long, default_value = RAYSHIFT_MANAGER)]
    pub managed_by: String,
    #[command(flatten)]
    pub defaults: DefaultsArgs,
    #[command(flatten)]
    pub deadline: DeadlineArgs,
}

impl Args {
    pub fn options(&self) -> Result<WebhookOptions, CliError> {
        let mut validation = ValidationConfig {
            feature_gates: self.gates.gates(),
            progress_deadline_seconds: self.deadline.progress_deadline_seconds,
            serve_configs: ServeConfigMemo::with_capacity(SERVE_CONFIGS_KEPT),
            ..ValidationConfig::default()
        };
        if !validation.managed_by_values.contains(&self.managed_by) {
            validation.managed_by_values.push(self.managed_by.clone());
        }
        Ok(WebhookOptions {
            webhook_addr: self.webhook_addr,
            tls_cert_file: self.tls_cert_file.clone(),
            tls_key_file: self.tls_key_file.clone(),
            cert_reload_interval: Duration::from_secs(self.cert_reload_interval_seconds),
            admission: AdmissionConfig {
                validation,
                defaults: self.defaults.load()?,
            },
            server: ServerSettings {
                max_body_bytes: self.max_body_bytes,
                request_timeout: Duration::from_secs(self.request_timeout_seconds),
                ..ServerSettings::default()
            },
        })
    }
}

#[derive(Debug, clap::Args)]
pub struct Command {
    #[command(flatten)]
    webhook: Args,
    /// Plain-HTTP address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080", env = "RAYSHIFT_METRICS_ADDR")]
    metrics_addr: SocketAddr,
    #[command(flatten)]
    log: LogArgs,
}

pub fn run(cmd: Command) -> Result<ExitCode, CliError> {
    cmd.log.init();
    let options = cmd.webhook.options()?;
    runtime()?.block_on(async move {
        let registry = Registry::new();
        let shutdown = shutdown::on_signal();
        let webhook = Webhook::bind(options, &registry).await?;
        tracing::info!(webhook = %webhook.local_addr()?, metrics = %cmd.metrics_addr, "listening");
        let admin_task = serve_metrics(cmd.metrics_addr, &registry, webhook.readiness(), &shutdown).await?;
        webhook.run(shutdown).await?;
        admin_task
            .await
            .map_err(|e| CliError::Runtime(std::io::Error::other(e)))??;
        Ok(ExitCode::SUCCESS)
    })
}
