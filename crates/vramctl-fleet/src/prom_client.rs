//! A client of Prometheus' HTTP API: `GET /api/v1/query` and `/api/v1/query_range`, over
//! http or https, one HTTP/1.1 connection per query, on the caller's tokio runtime.
//!
//! Bounded: each query (connect, TLS, request, the whole answer) must finish within
//! [`ClientSettings::timeout`]; an answer larger than [`ClientSettings::max_response_bytes`]
//! is abandoned as soon as it is (by its `Content-Length` or while it arrives); its
//! content is bounded again by [`crate::prom_response::Limits`]. Redirects are not followed.
//! https checks the server's certificate against the CA file given, else the system's
//! bundle (`SSL_CERT_FILE`, else the Debian and Red Hat paths).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName};

use crate::prom_response::{self, Limits, Sample, Series};

/// How the client talks to Prometheus.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// `http://host:port` or `https://host:port`, optionally with a path prefix
    /// (`https://example.org/prometheus`).
    pub url: String,
    /// Limit on one query, from connecting to the last byte of the answer.
    pub timeout: Duration,
    /// Limit on the size of one answer's body.
    pub max_response_bytes: usize,
    /// CA certificates (PEM) that https trusts; `None`: the system's bundle.
    pub ca_file: Option<PathBuf>,
    /// Bounds on an answer's content.
    pub limits: Limits,
}

impl ClientSettings {
    /// The defaults for `url`: 10 s per query, 16 MiB per answer, the system's CAs.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            timeout: Duration::from_secs(10),
            max_response_bytes: 16 << 20,
            ca_file: None,
            limits: Limits::default(),
        }
    }
}

/// A Prometheus server to query.
#[derive(Clone)]
pub struct PrometheusClient {
    scheme_https: bool,
    host: String,
    port: u16,
    path_prefix: String,
    tls: Option<tokio_rustls::TlsConnector>,
    settings: ClientSettings,
}

impl std::fmt::Debug for PrometheusClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrometheusClient")
            .field("url", &self.settings.url)
            .finish_non_exhaustive()
    }
}

impl PrometheusClient {
    /// Checks the URL and, for https, loads the trusted CAs. Errors are one line naming
    /// what is wrong (`serve` exits with them before it listens).
    pub fn new(settings: ClientSettings) -> anyhow::Result<Self> {
        let uri: hyper::Uri = settings
            .url
            .parse()
            .map_err(|e| anyhow!("--prometheus {:?} is not a URL: {e}", settings.url))?;
        let scheme_https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => bail!(
                "--prometheus {:?}: give an http:// or https:// URL",
                settings.url
            ),
        };
        let Some(authority) = uri.authority() else {
            bail!("--prometheus {:?} has no host", settings.url);
        };
        if authority.as_str().contains('@') {
            bail!(
                "--prometheus {:?}: credentials in the URL are not supported (they would show in process listings)",
                settings.url
            );
        }
        if uri.query().is_some() {
            bail!(
                "--prometheus {:?}: a query string is not supported",
                settings.url
            );
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority
            .port_u16()
            .unwrap_or(if scheme_https { 443 } else { 80 });
        let path_prefix = uri.path().trim_end_matches('/').to_owned();
        let tls = if scheme_https {
            Some(tls_connector(settings.ca_file.as_deref())?)
        } else {
            None
        };
        Ok(Self {
            scheme_https,
            host: host.to_owned(),
            port,
            path_prefix,
            tls,
            settings,
        })
    }

    /// The URL the client was made with.
    pub fn url(&self) -> &str {
        &self.settings.url
    }

    /// An instant query at the server's now.
    pub async fn query(&self, promql: &str) -> anyhow::Result<Vec<Sample>> {
        let path = format!("/api/v1/query?query={}", percent_encode(promql));
        let body = self.get(&path).await?;
        prom_response::parse_vector(&body, &self.settings.limits)
    }

    /// A range query over `[start, end]` (Unix seconds) at `step`.
    pub async fn query_range(
        &self,
        promql: &str,
        start_unix_s: f64,
        end_unix_s: f64,
        step: Duration,
    ) -> anyhow::Result<Vec<Series>> {
        let path = format!(
            "/api/v1/query_range?query={}&start={start_unix_s:.3}&end={end_unix_s:.3}&step={:.3}",
            percent_encode(promql),
            step.as_secs_f64()
        );
        let body = self.get(&path).await?;
        prom_response::parse_matrix(&body, &self.settings.limits)
    }

    async fn get(&self, path_and_query: &str) -> anyhow::Result<Bytes> {
        let what = || format!("Prometheus at {}", self.settings.url);
        tokio::time::timeout(self.settings.timeout, self.get_unbounded(path_and_query))
            .await
            .map_err(|_| {
                anyhow!(
                    "{} did not answer within {:?}",
                    what(),
                    self.settings.timeout
                )
            })?
            .with_context(what)
    }

    async fn get_unbounded(&self, path_and_query: &str) -> anyhow::Result<Bytes> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .context("cannot connect")?;
        let _ = tcp.set_nodelay(true);
        let host_header = if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let request = Request::get(format!("{}{path_and_query}", self.path_prefix))
            .header(hyper::header::HOST, host_header)
            .header(hyper::header::ACCEPT, "application/json")
            .header(
                hyper::header::USER_AGENT,
                concat!("vramctl/", env!("CARGO_PKG_VERSION")),
            )
            .body(Empty::<Bytes>::new())
            .context("cannot build the request")?;
        let response = match (&self.tls, self.scheme_https) {
            (Some(tls), true) => {
                let name = ServerName::try_from(self.host.clone())
                    .map_err(|e| anyhow!("{:?} is not a TLS server name: {e}", self.host))?;
                let stream = tls
                    .connect(name, tcp)
                    .await
                    .context("TLS handshake failed")?;
                send(TokioIo::new(stream), request).await?
            }
            _ => send(TokioIo::new(tcp), request).await?,
        };
        let status = response.status();
        if let Some(length) = response
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
        {
            if length > self.settings.max_response_bytes {
                bail!(
                    "its answer is {length} bytes, more than the {} this view reads",
                    self.settings.max_response_bytes
                );
            }
        }
        let body = read_bounded(response.into_body(), self.settings.max_response_bytes).await?;
        // The API answers errors as JSON with 400, 422 and 503; parse those for their
        // reason. Anything else that is not 200 (a proxy's 502, a login page) is reported
        // by its status.
        if !(status.is_success() || matches!(status.as_u16(), 400 | 422 | 503)) {
            bail!("it answered HTTP {status}");
        }
        Ok(body)
    }
}

async fn send<I>(io: I, request: Request<Empty<Bytes>>) -> anyhow::Result<hyper::Response<Incoming>>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .context("HTTP handshake failed")?;
    // The connection is driven on its own task; it ends when the answer is read or
    // dropped (a query that timed out drops both), and is bounded anyway.
    tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(300), connection).await;
    });
    sender
        .send_request(request)
        .await
        .context("the request failed")
}

async fn read_bounded(mut body: Incoming, max_bytes: usize) -> anyhow::Result<Bytes> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.context("reading the answer failed")?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > max_bytes {
                bail!("its answer is larger than the {max_bytes} bytes this view reads");
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(out))
}

fn tls_connector(ca_file: Option<&Path>) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let bundle = match ca_file {
        Some(path) => path.to_path_buf(),
        None => system_bundle().ok_or_else(|| {
            anyhow!(
                "no system CA bundle found (SSL_CERT_FILE, /etc/ssl/certs/ca-certificates.crt, \
                 /etc/pki/tls/certs/ca-bundle.crt); give --prometheus-ca FILE"
            )
        })?,
    };
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&bundle)
        .and_then(Iterator::collect)
        .map_err(|e| {
            anyhow!(
                "cannot read CA certificates from '{}': {e}",
                bundle.display()
            )
        })?;
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        bail!("no usable CA certificate in '{}'", bundle.display());
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS setup")?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

fn system_bundle() -> Option<PathBuf> {
    std::env::var_os("SSL_CERT_FILE")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            [
                "/etc/ssl/certs/ca-certificates.crt",
                "/etc/pki/tls/certs/ca-bundle.crt",
            ]
            .map(PathBuf::from),
        )
        .find(|p| p.is_file())
}

/// Everything but RFC 3986's unreserved characters is percent-encoded in a query value.
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// `text` as a URL query value.
fn percent_encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, QUERY_VALUE).to_string()
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::Full;
    use hyper::Response;
    use hyper::service::service_fn;
    use tokio::net::TcpListener;

    use super::*;

    /// A stand-in HTTP server (not Prometheus: the integration test `fleet` runs the real
    /// one) answering every request with `answer`, after `delay`; returns its URL and a
    /// receiver of the request targets it saw.
    async fn server(
        answer: &'static [u8],
        status: u16,
        delay: Duration,
    ) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let tx = tx.clone();
                        async move {
                            let _ = tx.send(request.uri().to_string());
                            tokio::time::sleep(delay).await;
                            let mut response = Response::new(Full::new(Bytes::from_static(answer)));
                            *response.status_mut() =
                                hyper::StatusCode::from_u16(status).expect("status");
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (format!("http://{addr}/prom/"), rx)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    const ANSWER: &[u8] = br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"instance":"h:1"},"value":[1.5,"42"]}]}}"#;

    #[test]
    fn a_query_is_sent_encoded_under_the_prefix_and_its_answer_parsed() {
        runtime().block_on(async {
            let (url, mut seen) = server(ANSWER, 200, Duration::ZERO).await;
            let client = PrometheusClient::new(ClientSettings::new(&url)).expect("client");
            let samples = client
                .query(r#"up{instance="a b&c"}"#)
                .await
                .expect("query");
            assert_eq!(samples.len(), 1);
            assert_eq!(samples[0].value, 42.0);
            assert_eq!(
                seen.recv().await.expect("request"),
                "/prom/api/v1/query?query=up%7Binstance%3D%22a%20b%26c%22%7D"
            );
        });
    }

    #[test]
    fn a_slow_server_times_out_and_a_big_answer_is_refused() {
        runtime().block_on(async {
            let (url, _seen) = server(ANSWER, 200, Duration::from_secs(5)).await;
            let mut settings = ClientSettings::new(&url);
            settings.timeout = Duration::from_millis(200);
            let err = PrometheusClient::new(settings)
                .expect("client")
                .query("up")
                .await
                .expect_err("timeout");
            assert!(
                format!("{err:#}").contains("did not answer within"),
                "{err:#}"
            );

            let (url, _seen) = server(ANSWER, 200, Duration::ZERO).await;
            let mut settings = ClientSettings::new(&url);
            settings.max_response_bytes = 16;
            let err = PrometheusClient::new(settings)
                .expect("client")
                .query("up")
                .await
                .expect_err("too big");
            assert!(format!("{err:#}").contains("more than the 16"), "{err:#}");
        });
    }

    #[test]
    fn a_proxy_error_page_is_reported_by_its_status() {
        runtime().block_on(async {
            let (url, _seen) = server(b"<html>bad gateway</html>", 502, Duration::ZERO).await;
            let err = PrometheusClient::new(ClientSettings::new(&url))
                .expect("client")
                .query("up")
                .await
                .expect_err("502");
            assert!(format!("{err:#}").contains("HTTP 502"), "{err:#}");
        });
    }

    #[test]
    fn bad_urls_are_refused_at_start() {
        for (url, why) in [
            ("prometheus:9090", "http:// or https://"),
            ("ftp://x", "http:// or https://"),
            ("http://user:pw@x:9090", "credentials"),
            ("http://x:9090/?a=b", "query string"),
            ("not a url", "not a URL"),
        ] {
            let err = PrometheusClient::new(ClientSettings::new(url)).expect_err(url);
            assert!(format!("{err:#}").contains(why), "{url}: {err:#}");
        }
        let mut settings = ClientSettings::new("https://x:9090");
        settings.ca_file = Some(PathBuf::from("/nonexistent/ca.pem"));
        let err = PrometheusClient::new(settings).expect_err("no CA file");
        assert!(
            format!("{err:#}").contains("/nonexistent/ca.pem"),
            "{err:#}"
        );
    }
}
