//! The HTTP side: hyper 1 (HTTP/1.1 only) on a current-thread tokio runtime, TLS through
//! rustls. The only async code in vramctl lives here.
//!
//! Why this stack: one thread multiplexes every connection, so a client that connects and
//! sends nothing, or never reads its response, holds a socket and a few KiB, not a thread
//! that other scrapes wait behind. bcrypt (tens of ms) runs on tokio's small blocking pool.
//!
//! Limits: [`MAX_CONNECTIONS`] open connections (more are closed at once), `max_requests`
//! requests in flight (more get 503, like node_exporter's `--web.max-requests`), TLS
//! handshakes within [`HANDSHAKE_TIMEOUT`], request headers within
//! [`HEADER_READ_TIMEOUT`] (slowloris), a connection lives at most [`CONNECTION_MAX_AGE`]
//! (a client that stops reading), request heads up to 16 KiB, request bodies ignored.
//! Only `GET` and `HEAD`: no endpoint changes anything.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;

use super::auth::Authenticator;
use super::cache::Cache;
use super::render::{Format, render_tail};
use super::webconfig::WebConfig;
use vramctl::recorder::{WriterHealth, WriterStatus};

/// Open connections at most; beyond, new ones are closed at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Time a client has to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to send a request's headers (also bounds an idle keep-alive).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest life of a connection; then it is closed gracefully (clients reconnect).
pub const CONNECTION_MAX_AGE: Duration = Duration::from_secs(60);
/// Largest request head.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Threads for bcrypt checks.
const BLOCKING_THREADS: usize = 2;

/// Settings of the HTTP server.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// TLS, auth and headers.
    pub web: WebConfig,
    /// Requests in flight at most (`--web.max-requests`).
    pub max_requests: usize,
    /// `/healthz` answers 503 when the last publish is older than this.
    pub stale_after: Duration,
    /// `serve --record`: the history writer, whose failures `/healthz` reports.
    pub recording: Option<Arc<WriterHealth>>,
}

struct State {
    cache: Arc<Cache>,
    auth: Option<Arc<Authenticator>>,
    headers: Vec<(HeaderName, HeaderValue)>,
    in_flight: Semaphore,
    stale_after: Duration,
    recording: Option<Arc<WriterHealth>>,
}

/// Serves `listener` until `shutdown` completes. Blocks the calling thread.
///
/// # Errors
/// When the runtime cannot start or the listener cannot be registered with it.
pub fn serve(
    listener: std::net::TcpListener,
    cache: Arc<Cache>,
    settings: ServerSettings,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_name("vramctl-http")
        .build()?;
    runtime.block_on(accept_loop(listener, cache, settings, shutdown))
}

/// Resolves on SIGINT or SIGTERM.
///
/// # Errors
/// When the signal handlers cannot be installed (must run inside [`serve`]'s runtime).
pub async fn termination() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("Cannot listen for SIGTERM; stop the exporter with SIGKILL.");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

async fn accept_loop(
    listener: std::net::TcpListener,
    cache: Arc<Cache>,
    settings: ServerSettings,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let headers = settings
        .web
        .headers
        .iter()
        .filter_map(|(name, value)| {
            Some((
                HeaderName::from_bytes(name.as_bytes()).ok()?,
                HeaderValue::from_str(value).ok()?,
            ))
        })
        .collect();
    let state = Arc::new(State {
        cache,
        auth: settings.web.auth.clone(),
        headers,
        in_flight: Semaphore::new(settings.max_requests.max(1)),
        stale_after: settings.stale_after,
        recording: settings.recording.clone(),
    });
    let tls = settings
        .web
        .tls
        .clone()
        .map(tokio_rustls::TlsAcceptor::from);
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => return Ok(()),
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(err) => {
                // EMFILE and friends: do not spin; the condition passes as sockets close.
                tracing::warn!(error = %err, "Cannot accept a connection.");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            tracing::debug!(%peer, "Too many connections; closing a new one.");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => connection(stream, state, peer).await,
                        Ok(Err(err)) => {
                            tracing::debug!(%peer, error = %err, "TLS handshake failed.")
                        }
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out."),
                    }
                }
                None => connection(stream, state, peer).await,
            }
            drop(permit);
        });
    }
}

async fn connection<S>(stream: S, state: Arc<State>, peer: SocketAddr)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| {
        let state = Arc::clone(&state);
        async move { Ok::<_, Infallible>(respond(request, &state).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    match tokio::time::timeout(CONNECTION_MAX_AGE, conn.as_mut()).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::debug!(%peer, error = %err, "Connection ended with an error."),
        Err(_) => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(HEADER_READ_TIMEOUT, conn).await;
        }
    }
}

async fn respond(request: Request<Incoming>, state: &State) -> Response<Full<Bytes>> {
    let Ok(_slot) = state.in_flight.try_acquire() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many requests in flight\n",
            state,
        );
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n", state);
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    if let Some(auth) = &state.auth {
        let authorization = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let ok = match authorization {
            // Nothing to check: no bcrypt, nothing to learn from timing either.
            None => false,
            Some(value) => {
                let auth = Arc::clone(auth);
                tokio::task::spawn_blocking(move || auth.check(Some(&value)))
                    .await
                    .unwrap_or(false)
            }
        };
        if !ok {
            let mut response = text(StatusCode::UNAUTHORIZED, "unauthorized\n", state);
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"vramctl\""),
            );
            return response;
        }
    }
    match request.uri().path() {
        "/metrics" => metrics(&request, state),
        "/healthz" => health(state),
        "/" => text(
            StatusCode::OK,
            "vramctl exporter\n/metrics  Prometheus metrics\n/healthz  sampler health\n",
            state,
        ),
        _ => text(StatusCode::NOT_FOUND, "not found; try /metrics\n", state),
    }
}

fn metrics(request: &Request<Incoming>, state: &State) -> Response<Full<Bytes>> {
    let Some(published) = state.cache.latest() else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "no sample yet\n", state);
    };
    let format = Format::negotiate(
        request
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    );
    let cached = match format {
        Format::Prometheus => &published.prometheus,
        Format::OpenMetrics => &published.openmetrics,
    };
    let tail = render_tail(
        Instant::now().saturating_duration_since(published.at),
        format,
    );
    let mut body = BytesMut::with_capacity(cached.len() + tail.len());
    body.extend_from_slice(cached);
    body.extend_from_slice(tail.as_bytes());
    let mut response = Response::new(Full::new(body.freeze()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    add_headers(&mut response, state);
    response
}

fn health(state: &State) -> Response<Full<Bytes>> {
    match state.cache.latest() {
        None => text(StatusCode::SERVICE_UNAVAILABLE, "starting\n", state),
        Some(published) if published.starting => {
            let waited = Instant::now().saturating_duration_since(published.at);
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "starting: waiting for NVML's first answer (for {:.1} s)\n",
                    waited.as_secs_f64()
                ),
                state,
            )
        }
        Some(published) => {
            let age = Instant::now().saturating_duration_since(published.at);
            if age > state.stale_after {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("stale: the last sample is {:.1} s old\n", age.as_secs_f64()),
                    state,
                )
            } else if let Some(degraded) = state.recording.as_deref().and_then(recording_trouble) {
                text(StatusCode::SERVICE_UNAVAILABLE, &degraded, state)
            } else {
                text(StatusCode::OK, "ok\n", state)
            }
        }
    }
}

/// `/healthz`'s answer while `serve --record` cannot record (the sampler and `/metrics`
/// are fine): the writer's failure and its reason. `None` while it writes.
fn recording_trouble(recording: &WriterHealth) -> Option<String> {
    match recording.status() {
        WriterStatus::Writing => None,
        WriterStatus::Failing {
            since,
            ticks,
            reason,
        } => Some(format!(
            "degraded: history writes have failed for {:.1} s ({ticks} samples not written, \
             recorded as a gap once writing works again): {reason}; metrics are served\n",
            Instant::now()
                .saturating_duration_since(since)
                .as_secs_f64()
        )),
        WriterStatus::Stopped { reason } => Some(format!(
            "degraded: the history writer stopped: {reason}; metrics are served, history is \
             not recorded\n"
        )),
    }
}

fn text(status: StatusCode, body: &str, state: &State) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    add_headers(&mut response, state);
    response
}

fn add_headers(response: &mut Response<Full<Bytes>>, state: &State) {
    for (name, value) in &state.headers {
        response.headers_mut().insert(name.clone(), value.clone());
    }
}
