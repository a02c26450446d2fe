//! rayshift's admission webhook: validating and mutating RayService over rustls.
//!
//! Thin by design: the rules and defaults live in `rayshift-api`; this crate is transport, TLS, certificate
//! rotation and metrics.

pub mod admission;
pub mod certs;
pub mod error;
mod last_applied;
pub mod metrics;
pub mod server;
pub mod tls;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

pub use error::{Error, Result};
use prometheus::Registry;
use tokio::sync::watch;

/// Everything `rayshift webhook` needs.
#[derive(Clone, Debug)]
pub struct WebhookOptions {
    pub webhook_addr: SocketAddr,
    pub tls_cert_file: PathBuf,
    pub tls_key_file: PathBuf,
    pub cert_reload_interval: Duration,
    pub admission: admission::AdmissionConfig,
    pub server: server::ServerSettings,
}

/// A webhook ready to serve: its listener is bound, so the port is known before serving.
pub struct Webhook {
    listener: tokio::net::TcpListener,
    certs: Arc<tls::CertStore>,
    metrics: metrics::Metrics,
    options: WebhookOptions,
}

impl Webhook {
    /// Registers metrics, loads the certificate if it is there already, and binds the port.
    pub async fn bind(options: WebhookOptions, registry: &Registry) -> Result<Self> {
        // Installing twice is harmless (a second process-wide default is simply refused).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let metrics = metrics::Metrics::register(registry)?;
        let certs = tls::CertStore::new(&options.tls_cert_file, &options.tls_key_file);
        if let Err(error) = certs.reload(&metrics) {
            // A Secret may be mounted later; readiness stays false until it is.
            tracing::warn!(%error, "serving certificate not loaded yet");
        }
        let listener = server::bind(options.webhook_addr, "the webhook").await?;
        Ok(Self {
            listener,
            certs,
            metrics,
            options,
        })
    }

    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr().map_err(Error::LocalAddr)
    }

    /// Readiness: a serving certificate is loaded.
    pub fn readiness(&self) -> Arc<dyn Fn() -> bool + Send + Sync> {
        let certs = self.certs.clone();
        Arc::new(move || certs.is_loaded())
    }

    /// Serves until `shutdown` flips to true, then drains.
    pub async fn run(self, shutdown: watch::Receiver<bool>) -> Result<()> {
        let Webhook {
            listener,
            certs,
            metrics,
            options,
        } = self;
        tracing::info!(addr = %options.webhook_addr, "webhook serving");
        let reload = tokio::spawn(certs.clone().watch(
            options.cert_reload_interval,
            metrics.clone(),
            shutdown.clone(),
        ));
        let router = server::router(
            Arc::new(options.admission),
            metrics.clone(),
            certs.clone(),
            &options.server,
        );
        let result = server::serve_tls(listener, certs, router, metrics, options.server, shutdown).await;
        reload.abort();
        result
    }
}
