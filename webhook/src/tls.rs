//! Serving certificates: loaded from disk, swapped in place when the files change.
//!
//! A Kubernetes Secret volume updates by swapping a symlink, so the files are re-read on a timer and
//! compared by content. A new pair is used only if it parses and the key matches the certificate;
//! otherwise the old pair keeps serving. Handshakes read the current pair, so in-flight connections and
//! new ones never fail during a rotation.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use arc_swap::ArcSwapOption;
use rustls::{
    ServerConfig,
    crypto::CryptoProvider,
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::sync::watch;

use crate::{error::Error, metrics::Metrics};

/// The pair in use, shared by every handshake.
#[derive(Debug)]
pub struct CertStore {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: ArcSwapOption<CertifiedKey>,
    loaded_bytes: Mutex<Option<(Vec<u8>, Vec<u8>)>>,
    provider: Arc<CryptoProvider>,
}

impl CertStore {
    pub fn new(cert_path: impl Into<PathBuf>, key_path: impl Into<PathBuf>) -> Arc<Self> {
        Arc::new(Self {
            cert_path: cert_path.into(),
            key_path: key_path.into(),
            current: ArcSwapOption::empty(),
            loaded_bytes: Mutex::new(None),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        })
    }

    /// True once a valid pair has been loaded (readiness).
    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }

    /// Reads the files and swaps in the pair if it changed and is valid. Returns whether it swapped.
    pub fn reload(&self, metrics: &Metrics) -> Result<bool, Error> {
        let cert = std::fs::read(&self.cert_path).map_err(Error::read_file(&self.cert_path))?;
        let key = std::fs::read(&self.key_path).map_err(Error::read_file(&self.key_path))?;
        let mut loaded = self.loaded_bytes.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.as_ref().is_some_and(|(c, k)| *c == cert && *k == key) {
            return Ok(false);
        }
        match certified_key(&cert, &key, &self.provider) {
            Ok((certified, not_after)) => {
                self.current.store(Some(Arc::new(certified)));
                *loaded = Some((cert, key));
                metrics.cert_loaded(not_after);
                tracing::info!(cert = %self.cert_path.display(), not_after, "serving certificate loaded");
                Ok(true)
            }
            Err(e) => {
                metrics.cert_load_failed();
                Err(e)
            }
        }
    }

    /// Re-reads the files every `interval` until shutdown; failures keep the old pair.
    pub async fn watch(
        self: Arc<Self>,
        interval: Duration,
        metrics: Metrics,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {
                    if let Err(error) = self.reload(&metrics) {
                        tracing::warn!(%error, "serving certificate not reloaded; the previous one stays in use");
                    }
                }
            }
        }
    }

    /// A rustls config (TLS 1.2 and 1.3 only) that resolves the current pair at every handshake.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<ServerConfig>, Error> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(Error::TlsProtocolVersions)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(self.clone())));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Parses a PEM chain and key into a rustls pair, checking they belong together; returns notAfter too.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<(CertifiedKey, i64), Error> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(Error::CertificatePem)?;
    let leaf = chain.first().ok_or(Error::NoCertificate)?;
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf).map_err(Error::Certificate)?;
    let not_after = parsed.validity().not_after.timestamp();
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(Error::PrivateKeyPem)?;
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(Error::KeyMismatch)?;
    Ok((certified, not_after))
}

#[derive(Debug)]
struct Resolver(Arc<CertStore>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.current.load_full()
    }
}
