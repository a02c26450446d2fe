//! The controller's connection to kube-apiserver: kube's own client stack (base URI, auth, headers, retries of
//! 429/503/504, the same timeouts), over a TLS connector that also offers HTTP/2, as client-go does.
//!
//! Why: kube's default stack speaks HTTP/1.1 only, so every request in flight needs a connection of its own.
//! Traffic steps falling due together, or a burst of new RayServices, then open tens of TLS connections at
//! once on the controller's and the apiserver's CPU. Over HTTP/2 every request and watch shares one
//! connection. Pings find a dead connection (an apiserver gone without a FIN) within 45 s, as client-go's
//! `ReadIdleTimeout` + `PingTimeout` do.

use std::time::Duration;

use hyper_rustls::{FixedServerNameResolver, HttpsConnectorBuilder};
use hyper_timeout::TimeoutConnector;
use hyper_util::{
    client::legacy::{Client as HyperClient, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};
use kube::{
    Client, Config,
    client::{ClientBuilder, ConfigExt, retry::RetryPolicy},
};
use tower::{BoxError, ServiceBuilder, retry::RetryLayer};

/// How the controller talks to kube-apiserver (`--kube-api-http2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/2 when the server offers it (ALPN), else HTTP/1.1.
    Http2,
    /// kube's default stack: HTTP/1.1, a connection per request in flight.
    Http1,
}

/// Idle time before a ping, and how long its answer may take.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);
/// Flow-control windows as client-go's: a watch whose events wait to be read must not hold up the others.
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 1 << 30;

/// A client for `config`. A proxy in the config keeps kube's default stack, which handles proxies.
pub fn client(config: Config, protocol: Protocol) -> kube::Result<Client> {
    if protocol == Protocol::Http1 || config.proxy_url.is_some() {
        return Client::try_from(config);
    }
    let retry = config.default_retry.then(RetryPolicy::server_retry);
    http2_client(config, retry)
}

/// A client that retries 429/503/504 as `retry` says, where kube's default retries 15 times, for minutes.
/// With a proxy, kube's default stack knows only its own retry: it then retries nothing.
pub fn client_retrying(mut config: Config, retry: RetryPolicy) -> kube::Result<Client> {
    if config.proxy_url.is_some() {
        config.default_retry = false;
        return Client::try_from(config);
    }
    http2_client(config, Some(retry))
}

fn http2_client(config: Config, retry: Option<RetryPolicy>) -> kube::Result<Client> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let mut tls = HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name
            .clone()
            .try_into()
            .map_err(|e| kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e)))?;
        tls = tls.with_server_name_resolver(FixedServerNameResolver::new(name));
    }
    let mut connector = TimeoutConnector::new(tls.enable_http1().enable_http2().wrap_connector(http));
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let hyper = HyperClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_initial_stream_window_size(STREAM_WINDOW)
        .http2_initial_connection_window_size(CONNECTION_WINDOW)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry.map(RetryLayer::new))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(ClientBuilder::new(service, config.default_namespace).build())
}
