//! The HTTP side: hyper 1 (HTTP/1.1 only) on a current-thread tokio runtime, TLS through
//! rustls. The only async code in vramctl lives here.
//!
//! Why this stack: one thread multiplexes every connection, so a client that connects and
//! sends nothing, or never reads its response, holds a socket and a few KiB, not a thread
//! that other scrapes wait behind. bcrypt (tens of ms) runs on tokio's small blocking pool.
//!
//! What keeps it answering when clients are hostile (docs/metrics.md, "Hostile clients"):
//! - Time: TLS handshakes within the I/O timeout (10 s), each request head within it
//!   (hyper's header read timeout: slowloris, and idle keep-alive), each response written
//!   within it ([`TimedIo`]: a peer that never reads), into a send buffer of
//!   [`SEND_BUFFER_BYTES`]; a connection lives at most [`CONNECTION_MAX_AGE`].
//! - Room: `--web.max-connections` open connections and `--web.max-connections-per-peer`
//!   per peer, where a connection over a limit displaces an idle one instead of being
//!   refused ([`Registry`]: a connection being served is never displaced, so a scrape
//!   that sent its request is answered however many idle ones crowd in).
//! - Work: `max_requests` requests in flight (more get 503, like node_exporter's
//!   `--web.max-requests`); at most [`MAX_PENDING_VERIFICATIONS`] bcrypt checks queued, one
//!   per peer (more get 503), and credentials that passed once are answered without bcrypt.
//! - Accept errors (out of file descriptors) back off up to [`MAX_ACCEPT_BACKOFF`] and
//!   free a descriptor by evicting an idle connection; they never spin.
//!
//! Request heads up to 16 KiB, request bodies ignored. Only `GET` and `HEAD`: no endpoint
//! changes anything.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;

use super::auth::Authenticator;
use super::cache::Cache;
use super::connections::{Limits, PeerKey, Registry, Slot};
use super::render::{Format, render_tail};
use super::routes::{RouteBody, RouteRequest, Routes};
use super::timed_io::TimedIo;
use super::webconfig::WebConfig;
use vramctl_history::recorder::{WriterHealth, WriterStatus};

/// Default time a client has for a TLS handshake, for sending a request head (also
/// bounds an idle keep-alive), and for reading a response.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest life of a connection; then it is closed gracefully (clients reconnect).
pub const CONNECTION_MAX_AGE: Duration = Duration::from_secs(60);
/// Send buffer of every accepted socket (the kernel doubles it): what a peer that never
/// reads can hold in kernel memory, not the 4 MiB TCP autotuning would give it. A larger
/// response is written as the peer reads, within the I/O timeout.
pub const SEND_BUFFER_BYTES: usize = 64 * 1024;
/// bcrypt checks queued or running at most (one per peer); more are answered 503.
pub const MAX_PENDING_VERIFICATIONS: usize = 4;
/// Longest pause of the accept loop after repeated accept errors.
pub const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);
/// Largest request head.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Threads for bcrypt checks and the answers of [`Routes`] (history reads).
const BLOCKING_THREADS: usize = 4;

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
    /// Open connections, in all and per peer.
    pub limits: Limits,
    /// TLS handshake, request head and response write timeout ([`IO_TIMEOUT`]).
    pub io_timeout: Duration,
    /// What answers the paths other than `/metrics` and `/healthz` (the web view); `None`:
    /// `/` is a short text naming the endpoints.
    pub routes: Option<Arc<dyn Routes>>,
}

struct State {
    cache: Arc<Cache>,
    auth: Option<Arc<Authenticator>>,
    headers: Vec<(HeaderName, HeaderValue)>,
    in_flight: Semaphore,
    /// bcrypt checks queued or running, in all and per peer.
    verifications: Mutex<HashMap<PeerKey, usize>>,
    stale_after: Duration,
    recording: Option<Arc<WriterHealth>>,
    io_timeout: Duration,
    routes: Option<Arc<dyn Routes>>,
}

/// A place in the bcrypt queue; dropping it frees it.
struct Verification<'a> {
    state: &'a State,
    peer: PeerKey,
}

impl Drop for Verification<'_> {
    fn drop(&mut self) {
        let mut pending = self
            .state
            .verifications
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = pending.get_mut(&self.peer) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                pending.remove(&self.peer);
            }
        }
    }
}

impl State {
    /// A place in the bcrypt queue for `peer`: none when the queue is full or the peer
    /// already has one there.
    fn verification(&self, peer: PeerKey) -> Option<Verification<'_>> {
        let mut pending = self
            .verifications
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let total: usize = pending.values().sum();
        if total >= MAX_PENDING_VERIFICATIONS || pending.contains_key(&peer) {
            return None;
        }
        pending.insert(peer, 1);
        Some(Verification { state: self, peer })
    }
}

/// A response body of shared chunks: `/metrics` sends the cached exposition itself (a
/// reference, not a copy per connection) and then its per-scrape tail; an event stream of
/// [`Routes`] sends its chunks as they come, until its senders are gone.
pub struct Chunks {
    queue: VecDeque<Bytes>,
    stream: Option<tokio::sync::mpsc::Receiver<Bytes>>,
}

impl Chunks {
    fn one(bytes: Bytes) -> Self {
        Self::all(VecDeque::from([bytes]))
    }

    fn all(queue: VecDeque<Bytes>) -> Self {
        Self {
            queue,
            stream: None,
        }
    }

    fn stream(receiver: tokio::sync::mpsc::Receiver<Bytes>) -> Self {
        Self {
            queue: VecDeque::new(),
            stream: Some(receiver),
        }
    }
}

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(bytes) = this.queue.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(bytes))));
        }
        match &mut this.stream {
            None => Poll::Ready(None),
            Some(receiver) => receiver
                .poll_recv(cx)
                .map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.queue.is_empty() && self.stream.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.stream.is_some() {
            return SizeHint::default();
        }
        let bytes: usize = self.queue.iter().map(Bytes::len).sum();
        SizeHint::with_exact(u64::try_from(bytes).unwrap_or(u64::MAX))
    }
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
        verifications: Mutex::new(HashMap::new()),
        stale_after: settings.stale_after,
        recording: settings.recording.clone(),
        io_timeout: settings.io_timeout,
        routes: settings.routes.clone(),
    });
    let tls = settings
        .web
        .tls
        .clone()
        .map(tokio_rustls::TlsAcceptor::from);
    let registry = Arc::new(Registry::new(settings.limits));
    let mut backoff: Option<Duration> = None;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => {
                let tally = registry.tally();
                tracing::info!(
                    evicted = tally.evicted,
                    refused = tally.refused,
                    "Idle connections closed to make room, and new ones refused."
                );
                return Ok(());
            }
        };
        let (stream, peer) = match accepted {
            Ok(pair) => {
                if backoff.take().is_some() {
                    tracing::info!("Accepting connections again.");
                }
                pair
            }
            Err(err) => {
                // EMFILE and friends: the pending connection stays in the backlog, so
                // accepting again at once would fail again at once. Back off (doubling up
                // to a second), and free a descriptor by closing an idle connection.
                let pause = backoff.map_or(Duration::from_millis(10), |b| {
                    (b * 2).min(MAX_ACCEPT_BACKOFF)
                });
                if backoff.is_none() {
                    tracing::warn!(
                        error = %err,
                        open = registry.open(),
                        "Cannot accept a connection; backing off."
                    );
                }
                backoff = Some(pause);
                if err.raw_os_error().is_some_and(is_out_of_descriptors) && registry.evict_one() {
                    tracing::debug!("Out of file descriptors: closed an idle connection.");
                }
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = &mut shutdown => return Ok(()),
                }
                continue;
            }
        };
        let Some(slot) = registry.admit(peer.ip()) else {
            tracing::debug!(%peer, "Every connection is busy; closing a new one.");
            continue;
        };
        let _ = stream.set_nodelay(true);
        if let Err(err) =
            rustix::net::sockopt::set_socket_send_buffer_size(&stream, SEND_BUFFER_BYTES)
        {
            tracing::debug!(%peer, error = %err, "Cannot bound the send buffer.");
        }
        let state = Arc::clone(&state);
        let tls = tls.clone();
        tokio::spawn(async move {
            let evicted = Arc::clone(&slot.state);
            tokio::select! {
                () = handle(stream, tls, state, peer, &slot) => {}
                () = evicted.evicted() => {
                    tracing::debug!(%peer, "Closed an idle connection to make room.");
                }
            }
            drop(slot);
        });
    }
}

/// EMFILE or ENFILE: the process or the system is out of file descriptors.
fn is_out_of_descriptors(errno: i32) -> bool {
    errno == rustix::io::Errno::MFILE.raw_os_error()
        || errno == rustix::io::Errno::NFILE.raw_os_error()
}

async fn handle(
    stream: tokio::net::TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    state: Arc<State>,
    peer: SocketAddr,
    slot: &Slot,
) {
    let stream = TimedIo::new(stream, Arc::clone(&slot.state), state.io_timeout);
    match tls {
        Some(acceptor) => {
            match tokio::time::timeout(state.io_timeout, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => connection(stream, state, peer, slot).await,
                Ok(Err(err)) => tracing::debug!(%peer, error = %err, "TLS handshake failed."),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out."),
            }
        }
        None => connection(stream, state, peer, slot).await,
    }
}

async fn connection<S>(stream: S, state: Arc<State>, peer: SocketAddr, slot: &Slot)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io_timeout = state.io_timeout;
    let peer_key = PeerKey::of(peer.ip());
    let service = service_fn(|request| {
        let state = Arc::clone(&state);
        // The connection is protected from eviction while its request is served.
        slot.request_started();
        async move {
            let response = respond(request, &state, peer_key).await;
            slot.request_answered();
            Ok::<_, Infallible>(response)
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(io_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    match tokio::time::timeout(CONNECTION_MAX_AGE, conn.as_mut()).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::debug!(%peer, error = %err, "Connection ended with an error."),
        Err(_) => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(io_timeout, conn).await;
        }
    }
}

async fn respond(request: Request<Incoming>, state: &State, peer: PeerKey) -> Response<Chunks> {
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
            Some(value) => match auth.cached(&value) {
                Some(ok) => ok,
                None => {
                    // bcrypt: on the blocking pool, a few at a time and one per peer, so
                    // a flood of guesses neither queues without end nor starves others.
                    let Some(_queued) = state.verification(peer) else {
                        let mut response = text(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "too many password checks in flight\n",
                            state,
                        );
                        response
                            .headers_mut()
                            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                        return response;
                    };
                    let auth = Arc::clone(auth);
                    tokio::task::spawn_blocking(move || auth.check(Some(&value)))
                        .await
                        .unwrap_or(false)
                }
            },
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
        path if state.routes.as_ref().is_some_and(|r| r.serves(path)) => {
            routed(route_request(&request), state).await
        }
        "/" => text(
            StatusCode::OK,
            "vramctl exporter\n/metrics  Prometheus metrics\n/healthz  sampler health\n",
            state,
        ),
        _ => text(StatusCode::NOT_FOUND, "not found; try /metrics\n", state),
    }
}

/// What [`Routes`] are told of `request`.
fn route_request(request: &Request<Incoming>) -> RouteRequest {
    let header_text = |name: header::HeaderName| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    RouteRequest {
        path: request.uri().path().to_owned(),
        query: request.uri().query().unwrap_or("").to_owned(),
        head: request.method() == Method::HEAD,
        if_none_match: header_text(header::IF_NONE_MATCH),
        last_event_id: header_text(HeaderName::from_static("last-event-id")),
    }
}

/// The answer of [`State::routes`], made on the blocking pool.
async fn routed(asked: RouteRequest, state: &State) -> Response<Chunks> {
    let Some(routes) = state.routes.clone() else {
        return text(StatusCode::NOT_FOUND, "not found\n", state);
    };
    let Ok(answer) = tokio::task::spawn_blocking(move || routes.respond(&asked)).await else {
        return text(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n", state);
    };
    let body = match answer.body {
        RouteBody::Full(bytes) => Chunks::one(bytes),
        RouteBody::Stream(receiver) => Chunks::stream(receiver),
    };
    let mut response = Response::new(body);
    *response.status_mut() =
        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(answer.content_type),
    );
    for (name, value) in answer.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    add_headers(&mut response, state);
    response
}

fn metrics(request: &Request<Incoming>, state: &State) -> Response<Chunks> {
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
    let body = Chunks::all(VecDeque::from([cached.clone(), Bytes::from(tail)]));
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    add_headers(&mut response, state);
    response
}

fn health(state: &State) -> Response<Chunks> {
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

fn text(status: StatusCode, body: &str, state: &State) -> Response<Chunks> {
    let mut response = Response::new(Chunks::one(Bytes::copy_from_slice(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    add_headers(&mut response, state);
    response
}

fn add_headers(response: &mut Response<Chunks>, state: &State) {
    for (name, value) in &state.headers {
        response.headers_mut().insert(name.clone(), value.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State {
            cache: Arc::new(Cache::new()),
            auth: None,
            headers: Vec::new(),
            in_flight: Semaphore::new(1),
            verifications: Mutex::new(HashMap::new()),
            stale_after: Duration::from_secs(10),
            recording: None,
            io_timeout: IO_TIMEOUT,
            routes: None,
        }
    }

    fn peer(text: &str) -> PeerKey {
        PeerKey::of(text.parse().expect("address"))
    }

    #[test]
    fn password_checks_queue_one_per_peer_and_a_few_in_all() {
        let state = state();
        let first = state.verification(peer("127.0.0.1")).expect("a place");
        assert!(
            state.verification(peer("127.0.0.2")).is_none(),
            "loopback already has its one place"
        );
        let others: Vec<_> = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
            .iter()
            .map(|ip| state.verification(peer(ip)).expect("a place"))
            .collect();
        assert_eq!(others.len() + 1, MAX_PENDING_VERIFICATIONS);
        assert!(
            state.verification(peer("10.0.0.4")).is_none(),
            "the queue is full"
        );
        drop(first);
        assert!(
            state.verification(peer("127.0.0.1")).is_some(),
            "freed on drop"
        );
    }
}
