//! Requests straight to a dashboard or a head's Serve proxy (the template route), over hyper's pooled client.
//! reqwest parsed each URL three times per request (its builder, its redirect layer, its response): 11 % of
//! a settled controller's CPU at 1,000 RayServices (issue 16's idle goal). Here a URI is parsed once and
//! nothing follows redirects (a dashboard answers where it is asked; a redirect is an answer, not a hop).

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};
use rustls::pki_types::CertificateDer;

use crate::error::{DashboardFailure, Error};

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

#[derive(Clone)]
pub struct DirectHttp {
    client: Client<Connector, Full<Bytes>>,
    timeout: Duration,
}

impl DirectHttp {
    /// A client whose every request, connection included, ends within `timeout`, keeping up to
    /// `idle_per_host` connections per host for 30 s.
    pub fn new(timeout: Duration, idle_per_host: usize) -> Result<Self, Error> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(timeout));
        let roots = roots(rustls_native_certs::load_native_certs().certs)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(Error::Tls)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(idle_per_host)
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_timer(TokioTimer::new())
            .build(https);
        Ok(Self { client, timeout })
    }

    /// Sends `req` and reads its whole answer. Every failure is retryable: the connection, not the request.
    pub async fn send(
        &self,
        req: http::Request<Vec<u8>>,
    ) -> Result<(http::StatusCode, Bytes), DashboardFailure> {
        let req = req.map(|b| Full::new(Bytes::from(b)));
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| DashboardFailure::Send(Box::new(e)))?;
            let status = resp.status();
            let body = resp.into_body().collect().await.map_err(DashboardFailure::Read)?;
            Ok((status, body.to_bytes()))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or(Err(DashboardFailure::TimedOut(self.timeout)))
    }
}

/// The system's root certificates, as many as parse. As reqwest's native roots did: a machine without a CA
/// bundle still reaches dashboards over plain HTTP (hyper-rustls's own loader refuses to start without one);
/// only a bundle of which nothing parses is an error.
fn roots(found: Vec<CertificateDer<'static>>) -> Result<rustls::RootCertStore, Error> {
    let mut roots = rustls::RootCertStore::empty();
    let (added, unreadable) = roots.add_parsable_certificates(found);
    if added == 0 && unreadable > 0 {
        return Err(Error::TlsRootsUnreadable { unreadable });
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(url: &str) -> http::Request<Vec<u8>> {
        http::Request::get(url).body(Vec::new()).unwrap()
    }

    #[tokio::test]
    async fn a_server_that_never_answers_ends_at_the_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/api/serve/applications/",
            listener.local_addr().unwrap()
        );
        let client = DirectHttp::new(Duration::from_millis(200), 1).unwrap();
        // Accepted by the kernel's backlog, never read: the request waits for an answer that never comes.
        let failure = client.send(get(&url)).await.unwrap_err();
        assert!(matches!(failure, DashboardFailure::TimedOut(t) if t == Duration::from_millis(200)));
        drop(listener);
    }

    #[tokio::test]
    async fn an_answer_is_read_whole_and_its_connection_kept() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/x", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            for _ in 0..2 {
                let mut seen = Vec::new();
                while !seen.ends_with(b"\r\n\r\n") {
                    let mut byte = [0u8; 1];
                    conn.read_exact(&mut byte).await.unwrap();
                    seen.push(byte[0]);
                }
                let answer = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy";
                conn.write_all(answer).await.unwrap();
            }
        });
        let client = DirectHttp::new(Duration::from_secs(5), 1).unwrap();
        for _ in 0..2 {
            let (status, body) = client.send(get(&url)).await.unwrap();
            assert_eq!((status.as_u16(), &body[..]), (503, &b"busy"[..]));
        }
        // One accept served both: the second request reused the pooled connection.
        server.await.unwrap();
    }

    #[test]
    fn no_root_certificate_is_no_error_but_only_unreadable_ones_are() {
        assert!(roots(Vec::new()).unwrap().is_empty());
        let garbage = CertificateDer::from(b"not a certificate".to_vec());
        assert!(matches!(
            roots(vec![garbage]),
            Err(Error::TlsRootsUnreadable { unreadable: 1 })
        ));
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_send_failure() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/x", listener.local_addr().unwrap());
        drop(listener);
        let client = DirectHttp::new(Duration::from_secs(5), 1).unwrap();
        let failure = client.send(get(&url)).await.unwrap_err();
        assert!(matches!(failure, DashboardFailure::Send(_)), "{failure}");
    }
}
