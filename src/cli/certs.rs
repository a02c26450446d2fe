//! `rayshift certs`: a CA and serving certificate for the webhook, and the webhook configurations.

use std::{net::IpAddr, path::PathBuf, process::ExitCode};

use clap::{Args, Subcommand};
use rayshift_webhook::certs::{self, Endpoint, ServingCertRequest, WebhookConfigRequest};

use super::{CliError, read};

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a CA and a serving certificate for the webhook Service: DIR/ca.crt, ca.key, tls.crt, tls.key.
    Generate(GenerateArgs),
    /// Print the Validating and Mutating webhook configurations with caBundle filled in.
    WebhookConfig(WebhookConfigArgs),
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Name of the webhook's Service.
    #[arg(long)]
    service: String,
    /// Namespace of the webhook's Service.
    #[arg(long)]
    namespace: String,
    /// Output directory (keys are written with mode 0600).
    #[arg(long)]
    out: PathBuf,
    /// Extra IP address SANs (e.g. 127.0.0.1 for a webhook reached by URL).
    #[arg(long = "ip")]
    ips: Vec<IpAddr>,
    /// Extra DNS SANs.
    #[arg(long = "dns")]
    dns: Vec<String>,
    /// Validity of the serving certificate.
    #[arg(long, default_value_t = 365)]
    valid_days: i64,
    /// Keep DIR/ca.crt and DIR/ca.key if present and sign a new serving certificate with them (rotation).
    #[arg(long)]
    reuse_ca: bool,
}

#[derive(Debug, Args)]
pub struct WebhookConfigArgs {
    /// The CA that signed the serving certificate.
    #[arg(long)]
    ca: PathBuf,
    /// Service of the webhook (with --namespace).
    #[arg(long, conflicts_with = "url", requires = "namespace")]
    service: Option<String>,
    /// Namespace of the webhook; excluded from admission so the webhook cannot lock itself out.
    #[arg(long)]
    namespace: Option<String>,
    /// Service port.
    #[arg(long, default_value_t = 443)]
    port: i32,
    /// Base URL of a webhook outside the cluster, e.g. https://127.0.0.1:9443.
    #[arg(long, required_unless_present = "service")]
    url: Option<String>,
    /// Prefix of the configuration names.
    #[arg(long, default_value = "rayshift")]
    name: String,
    /// Admit only namespaces carrying this label (KEY=VALUE, repeatable): an opt-in rollout.
    #[arg(long = "namespace-selector", value_name = "KEY=VALUE", value_parser = parse_label)]
    namespace_selector: Vec<(String, String)>,
}

pub fn run(cmd: Command) -> Result<ExitCode, CliError> {
    match cmd {
        Command::Generate(args) => generate(args)?,
        Command::WebhookConfig(args) => print!("{}", webhook_config(args)?),
    }
    Ok(ExitCode::SUCCESS)
}

fn generate(args: GenerateArgs) -> Result<(), CliError> {
    let req = ServingCertRequest {
        service: args.service,
        namespace: args.namespace,
        ips: args.ips,
        extra_dns: args.dns,
        valid_days: args.valid_days,
    };
    let files = certs::generate(&req, &args.out, args.reuse_ca)?;
    eprintln!(
        "wrote {}, {}, {}, {} (SANs: {})",
        files.ca_cert.display(),
        files.ca_key.display(),
        files.tls_cert.display(),
        files.tls_key.display(),
        req.dns_names().join(", ")
    );
    Ok(())
}

fn webhook_config(args: WebhookConfigArgs) -> Result<String, CliError> {
    let ca_pem = read(&args.ca)?.into_bytes();
    // clap requires --service or --url; a Service wins, as they conflict.
    let endpoint = match (args.service, args.url) {
        (Some(name), _) => Endpoint::Service {
            name,
            namespace: args.namespace.clone().unwrap_or_else(|| "default".into()),
            port: args.port,
        },
        (None, url) => Endpoint::Url(url.unwrap_or_default()),
    };
    let req = WebhookConfigRequest {
        ca_pem,
        endpoint,
        exclude_namespace: args.namespace,
        name: args.name,
        namespace_labels: args.namespace_selector.into_iter().collect(),
    };
    Ok(certs::webhook_configurations(&req)?)
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    Ok((k.trim().to_string(), v.trim().to_string()))
}
