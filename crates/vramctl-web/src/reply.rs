//! Answers of the JSON API ([`Reply`]) and its query strings ([`Query`]).

use bytes::Bytes;
use serde::Serialize;
use vramctl_exporter::routes::{RouteBody, RouteResponse};

use crate::CONTENT_SECURITY_POLICY;

/// Longest query string read; the rest is ignored.
const MAX_QUERY_BYTES: usize = 2048;
/// Most parameters read from one query.
const MAX_PARAMS: usize = 16;

/// A request's parameters, percent-decoded (`+` is a space), the first of each name.
#[derive(Debug, Clone, Default)]
pub struct Query {
    params: Vec<(String, String)>,
}

impl Query {
    /// Parses `query` (without `?`), bounded in size and count.
    pub fn parse(query: &str) -> Self {
        let query = match query.char_indices().nth(MAX_QUERY_BYTES) {
            Some((cut, _)) => &query[..cut],
            None => query,
        };
        let decode = |text: &str| {
            let spaced = text.replace('+', " ");
            percent_encoding::percent_decode_str(&spaced)
                .decode_utf8_lossy()
                .into_owned()
        };
        let params = query
            .split('&')
            .filter(|part| !part.is_empty())
            .take(MAX_PARAMS)
            .map(|part| match part.split_once('=') {
                Some((name, value)) => (decode(name), decode(value)),
                None => (decode(part), String::new()),
            })
            .collect();
        Self { params }
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// `name` as an integer: `Ok(None)` when absent, an error naming it when not a number.
    ///
    /// # Errors
    /// A value that is not a whole number.
    pub fn int(&self, name: &str) -> Result<Option<i64>, Reply> {
        match self.get(name) {
            None | Some("") => Ok(None),
            Some(text) => text
                .trim()
                .parse::<i64>()
                .map(Some)
                .map_err(|_| Reply::error(400, &format!("'{name}' must be a whole number"))),
        }
    }
}

/// What an API route answers.
#[derive(Debug)]
pub struct Reply {
    status: u16,
    content_type: &'static str,
    body: RouteBody,
    /// An event stream: reverse proxies must not buffer it.
    streaming: bool,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
}

impl Reply {
    /// `value` as JSON, status 200.
    pub fn json(value: &impl Serialize) -> Self {
        match serde_json::to_vec(value) {
            Ok(bytes) => Self::json_bytes(Bytes::from(bytes)),
            Err(err) => Self::error(500, &format!("cannot encode the answer: {err}")),
        }
    }

    /// Bytes that already are JSON, status 200.
    pub fn json_bytes(bytes: Bytes) -> Self {
        Self {
            status: 200,
            content_type: "application/json",
            body: RouteBody::Full(bytes),
            streaming: false,
        }
    }

    /// `{"error": message}` with `status`.
    pub fn error(status: u16, message: &str) -> Self {
        let body = serde_json::to_vec(&ErrorBody { error: message }).unwrap_or_default();
        Self {
            status,
            content_type: "application/json",
            body: RouteBody::Full(Bytes::from(body)),
            streaming: false,
        }
    }

    /// A Server-Sent Events stream fed through `receiver`.
    pub fn event_stream(receiver: tokio::sync::mpsc::Receiver<Bytes>) -> Self {
        Self {
            status: 200,
            content_type: "text/event-stream",
            body: RouteBody::Stream(receiver),
            streaming: true,
        }
    }

    /// The HTTP response: never cached, never sniffed, under the page's policy.
    pub fn into_response(self) -> RouteResponse {
        let mut headers = security_headers();
        headers.push(("cache-control", "no-store".to_owned()));
        if self.streaming {
            // nginx buffers responses unless told not to: a tick would arrive late.
            headers.push(("x-accel-buffering", "no".to_owned()));
        }
        RouteResponse {
            status: self.status,
            content_type: self.content_type,
            headers,
            body: self.body,
        }
    }
}

/// Headers on every answer of this crate.
pub fn security_headers() -> Vec<(&'static str, String)> {
    vec![
        (
            "content-security-policy",
            CONTENT_SECURITY_POLICY.to_owned(),
        ),
        ("x-content-type-options", "nosniff".to_owned()),
        ("referrer-policy", "no-referrer".to_owned()),
        ("x-frame-options", "DENY".to_owned()),
        ("cross-origin-resource-policy", "same-origin".to_owned()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decodes_and_bounds() {
        let q = Query::parse("gpu=GPU-1%2D2&from=5&x&to=abc&name=a+b");
        assert_eq!(q.get("gpu"), Some("GPU-1-2"));
        assert_eq!(q.int("from").ok().flatten(), Some(5));
        assert_eq!(q.get("x"), Some(""));
        assert!(q.int("to").is_err());
        assert_eq!(q.get("name"), Some("a b"));
        let many = "a=1&".repeat(100);
        assert_eq!(Query::parse(&many).params.len(), MAX_PARAMS);
    }
}
