//! Logs: JSON lines by default (Kubernetes style), plain text for people.

use std::io::IsTerminal;

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    #[default]
    Json,
    Plain,
}

#[derive(Debug, clap::Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, value_enum, default_value_t, env = "RAYSHIFT_LOG_FORMAT")]
    log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax); falls back to RUST_LOG, then `info`.
    #[arg(long, env = "RAYSHIFT_LOG_LEVEL")]
    log_level: Option<String>,
}

impl LogArgs {
    pub fn init(&self) {
        let filter = self
            .log_level
            .as_deref()
            .map(EnvFilter::new)
            .or_else(|| EnvFilter::try_from_default_env().ok())
            .unwrap_or_else(|| EnvFilter::new("info"));
        // Colour only for a person at a terminal: `kubectl logs` and files get plain text.
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr);
        let _ = match self.log_format {
            LogFormat::Json => builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .try_init(),
            LogFormat::Plain => builder.try_init(),
        };
    }
}
