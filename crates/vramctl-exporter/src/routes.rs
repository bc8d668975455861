//! The seam through which a crate above this one (`vramctl-web`: the page, its assets and
//! its JSON API) answers requests on `serve`'s listener, behind the same TLS, basic auth,
//! connection limits and headers as `/metrics`. The server knows nothing of pages: it asks
//! [`Routes::serves`] for every path other than `/metrics` and `/healthz`, and runs
//! [`Routes::respond`] on its blocking pool (an answer may read the history database).
//!
//! A response is whole ([`RouteBody::Full`]) or a push stream ([`RouteBody::Stream`]:
//! Server-Sent Events), whose chunks the responder sends through a bounded channel from any
//! thread; the response ends when the sender is dropped. A stream holds a connection, so
//! the responder bounds how many it opens; the server's limits still apply (the connection
//! closes at its maximum age, and an idle one may be displaced under pressure).

use bytes::Bytes;

/// What a responder is told of a request (only `GET` and `HEAD` reach it, authenticated).
#[derive(Debug, Clone, Default)]
pub struct RouteRequest {
    /// The path, without the query.
    pub path: String,
    /// The query string, without `?` (empty when absent).
    pub query: String,
    /// `HEAD`: the body is not sent, so no stream should be opened.
    pub head: bool,
    /// `If-None-Match`, for cached assets.
    pub if_none_match: Option<String>,
    /// `Last-Event-ID`: where a reconnecting event stream left off.
    pub last_event_id: Option<String>,
}

/// A response body.
#[derive(Debug)]
pub enum RouteBody {
    /// All of it.
    Full(Bytes),
    /// Chunks as they come; the body ends when every sender is dropped.
    Stream(tokio::sync::mpsc::Receiver<Bytes>),
}

/// A response.
#[derive(Debug)]
pub struct RouteResponse {
    /// HTTP status code.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Further headers (security policy, caching).
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: RouteBody,
}

/// Answers the paths a crate above serves beside `/metrics`.
pub trait Routes: Send + Sync {
    /// Whether `path` is one of these routes (`/` included, when it is).
    fn serves(&self, path: &str) -> bool;

    /// The response to `request`; called on a blocking thread, so it may read files and
    /// databases, within a bounded time.
    fn respond(&self, request: &RouteRequest) -> RouteResponse;
}

impl std::fmt::Debug for dyn Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Routes")
    }
}
