//! The HTTPS server: our own accept loop over rustls, axum routes, graceful drain on shutdown.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Router,
    body::Bytes,
    extract::{DefaultBodyLimit, State, rejection::BytesRejection},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use prometheus::Registry;
use tokio::{net::TcpListener, sync::watch};
use tokio_rustls::TlsAcceptor;
use tower_http::timeout::TimeoutLayer;

use crate::{
    admission::{self, AdmissionConfig, Hook},
    error::Error,
    metrics::{self, Metrics},
    tls::CertStore,
};

pub const VALIDATE_PATH: &str = "/validate-ray-io-v1-rayservice";
pub const MUTATE_PATH: &str = "/mutate-ray-io-v1-rayservice";

/// Settings of the HTTPS server.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
    pub handshake_timeout: Duration,
    /// How long in-flight requests may take to finish after shutdown starts.
    pub drain_timeout: Duration,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            max_body_bytes: 8 * 1024 * 1024,
            request_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(20),
        }
    }
}

#[derive(Clone)]
struct AppState {
    config: Arc<AdmissionConfig>,
    metrics: Metrics,
    certs: Arc<CertStore>,
}

/// The webhook's routes: admission, health and readiness.
pub fn router(
    config: Arc<AdmissionConfig>,
    metrics: Metrics,
    certs: Arc<CertStore>,
    settings: &ServerSettings,
) -> Router {
    let timeouts = metrics.clone();
    let state = AppState {
        config,
        metrics,
        certs,
    };
    Router::new()
        .route(VALIDATE_PATH, post(validate))
        .route(MUTATE_PATH, post(mutate))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(settings.max_body_bytes))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            settings.request_timeout,
        ))
        // The timeout answers without reaching a handler: it is counted on its way out.
        .layer(axum::middleware::map_response(move |response: Response| {
            let metrics = timeouts.clone();
            async move {
                if response.status() == StatusCode::REQUEST_TIMEOUT {
                    metrics.bad_request(408);
                }
                response
            }
        }))
        .with_state(state)
}

async fn validate(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(&s, Hook::Validate, body)
}

async fn mutate(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(&s, Hook::Mutate, body)
}

async fn readyz(State(s): State<AppState>) -> Response {
    if s.certs.is_loaded() {
        "ok".into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "serving certificate not loaded\n",
        )
            .into_response()
    }
}

fn plain(code: StatusCode, message: String) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message + "\n",
    )
        .into_response()
}

fn answer(s: &AppState, hook: Hook, body: Result<Bytes, BytesRejection>) -> Response {
    let timer = s.metrics.latency(hook).start_timer();
    let body = match body {
        Ok(b) => b,
        Err(rejection) => {
            let code = rejection.status();
            s.metrics.bad_request(code.as_u16());
            return plain(
                code,
                format!("cannot read request body: {}", rejection.body_text()),
            );
        }
    };
    let response = match admission::review(hook, &body, &s.config) {
        Ok((review, record)) => {
            s.metrics.observe(hook, &record);
            tracing::info!(
                webhook = hook.as_str(),
                operation = record.operation,
                allowed = record.allowed,
                denied = ?record.denied_rules,
                warnings = record.warned_rules.len(),
                patched = record.patched,
                dry_run = record.dry_run,
                "admission review"
            );
            axum::Json(review).into_response()
        }
        Err(Error::BadRequest(why)) => {
            let message = why.to_string();
            s.metrics.bad_request(400);
            tracing::info!(webhook = hook.as_str(), %message, "bad admission request");
            plain(StatusCode::BAD_REQUEST, message)
        }
        Err(e) => {
            s.metrics.bad_request(500);
            tracing::error!(webhook = hook.as_str(), error = %e, "admission review failed");
            plain(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
    };
    timer.observe_duration();
    response
}

/// Serves `router` over TLS on `listener` until `shutdown` flips, then drains in-flight requests.
pub async fn serve_tls(
    listener: TcpListener,
    certs: Arc<CertStore>,
    router: Router,
    metrics: Metrics,
    settings: ServerSettings,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), Error> {
    let acceptor = TlsAcceptor::from(certs.server_config()?);
    let graceful = GracefulShutdown::new();
    let builder = Arc::new(http_builder(&settings));
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            acceptor: acceptor.clone(),
            builder: builder.clone(),
            metrics: metrics.clone(),
            handshake_timeout: settings.handshake_timeout,
        };
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(connection.serve(stream, peer, service, graceful.watcher()));
    }
    tracing::info!("webhook shutting down: draining in-flight requests");
    if tokio::time::timeout(settings.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain timed out; closing remaining connections");
    }
    Ok(())
}

/// HTTP/1.1 with keep-alive (and a deadline for a request's headers), or HTTP/2.
fn http_builder(settings: &ServerSettings) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.handshake_timeout)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    builder
}

/// What one accepted connection needs: its TLS handshake, bounded in time, then HTTP until it ends or the
/// server drains.
struct Connection {
    acceptor: TlsAcceptor,
    builder: Arc<auto::Builder<TokioExecutor>>,
    metrics: Metrics,
    handshake_timeout: Duration,
}

impl Connection {
    async fn serve(
        self,
        stream: tokio::net::TcpStream,
        peer: std::net::SocketAddr,
        service: TowerToHyperService<Router>,
        watcher: hyper_util::server::graceful::Watcher,
    ) {
        let tls = match tokio::time::timeout(self.handshake_timeout, self.acceptor.accept(stream)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                self.metrics.tls_handshake_error();
                tracing::debug!(%peer, %error, "TLS handshake failed");
                return;
            }
            Err(_) => {
                self.metrics.tls_handshake_error();
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        };
        let conn = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(tls), service)
            .into_owned();
        if let Err(error) = watcher.watch(conn).await {
            tracing::debug!(%peer, %error, "connection ended with an error");
        }
    }
}

/// Plain-HTTP admin routes: `/metrics`, `/healthz`, `/readyz` (ready when `ready` says so).
pub fn admin_router(registry: Registry, ready: Arc<dyn Fn() -> bool + Send + Sync>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        metrics::render(&registry),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    if ready() {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        )
}

/// Serves the admin routes over plain HTTP until shutdown.
pub async fn serve_admin(
    listener: TcpListener,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), Error> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = shutdown.changed().await;
        })
        .await
        .map_err(Error::AdminServer)
}

/// Binds a TCP listener with a clear error.
pub async fn bind(addr: SocketAddr, what: &'static str) -> Result<TcpListener, Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen { addr, what, source })
}
