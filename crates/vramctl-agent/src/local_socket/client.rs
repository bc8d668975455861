//! The client side of the convention: connect without ever blocking on a server that does
//! not accept, remove a stale socket, check who answers, read its greeting, ask one thing.
//! One deadline covers the whole exchange, so a server that never answers costs the
//! client at most that long.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{
    ConnectRefusal, Connection, ErrorReply, FrameError, Greeting, Peer, Reply, connect_now, euid,
};

/// Longest greeting line a client reads.
const MAX_GREETING_BYTES: usize = 4096;

/// Why no conversation started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// No socket there.
    #[error("no socket at '{}'", path.display())]
    NotFound {
        /// The path tried.
        path: PathBuf,
    },
    /// A socket file nobody listens on; removed when we could.
    #[error("nobody answers on '{}' (a stale socket{})", path.display(), if *removed { ", removed" } else { "" })]
    Stale {
        /// The path.
        path: PathBuf,
        /// Whether the file was removed.
        removed: bool,
    },
    /// The server's backlog is full: it does not accept.
    #[error("'{}' does not accept connections now", path.display())]
    Busy {
        /// The path.
        path: PathBuf,
    },
    /// The file mode does not let us in.
    #[error("no permission to connect to '{}'", path.display())]
    NoPermission {
        /// The path.
        path: PathBuf,
    },
    /// The server runs as neither root nor us: not to be believed.
    #[error("'{}' is served by uid {uid}, neither root nor this user", path.display())]
    Untrusted {
        /// The path.
        path: PathBuf,
        /// The server's uid.
        uid: u32,
    },
    /// The server refused us (or is busy), with its reason.
    #[error("'{}' refused: {reply}", path.display())]
    Refused {
        /// The path.
        path: PathBuf,
        /// What it said.
        reply: ErrorReply,
    },
    /// The server is not the service asked for, or speaks another protocol.
    #[error("'{}' is not what was expected: {reason}", path.display())]
    Unexpected {
        /// The path.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// The greeting did not come in time, or the connection failed.
    #[error("no greeting from '{}': {source}", path.display())]
    Frame {
        /// The path.
        path: PathBuf,
        /// What happened.
        source: FrameError,
    },
    /// The socket could not be made or used.
    #[error("cannot connect to '{}': {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Why a request got no reply.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AskError {
    /// No conversation.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The request could not be sent or the reply read in time, or was too long.
    #[error("no reply: {0}")]
    Frame(#[from] FrameError),
}

/// A connection to a server that greeted us.
#[derive(Debug)]
pub struct Client {
    conn: Connection,
    greeting: Greeting,
    server: Peer,
    deadline: Instant,
    timeout: Duration,
}

impl Client {
    /// Connects to `path` and reads the greeting of `service` speaking one of `protocols`,
    /// all within `timeout` (which the request and its reply share).
    ///
    /// The connect itself never waits: a server whose backlog is full is [`ConnectError::Busy`].
    /// A socket nobody listens on is removed (when it is still the file that refused us).
    ///
    /// # Errors
    /// See [`ConnectError`].
    pub fn connect(
        path: &Path,
        service: &str,
        protocols: std::ops::RangeInclusive<u32>,
        timeout: Duration,
    ) -> Result<Self, ConnectError> {
        let deadline = Instant::now() + timeout;
        let owned = || path.to_path_buf();
        let io = |source: std::io::Error| ConnectError::Io {
            path: owned(),
            source,
        };
        let (stream, server) = connect_now(path).map_err(|refusal| match refusal {
            ConnectRefusal::NotFound => ConnectError::NotFound { path: owned() },
            ConnectRefusal::Stale { removed } => ConnectError::Stale {
                path: owned(),
                removed,
            },
            ConnectRefusal::Busy => ConnectError::Busy { path: owned() },
            ConnectRefusal::NoPermission => ConnectError::NoPermission { path: owned() },
            ConnectRefusal::Io(source) => io(source),
        })?;
        if server.uid != 0 && server.uid != euid() {
            return Err(ConnectError::Untrusted {
                path: owned(),
                uid: server.uid,
            });
        }
        let mut conn = Connection::new(stream);
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = |source| ConnectError::Frame {
            path: owned(),
            source,
        };
        let first: serde_json::Value =
            conn.read_message(MAX_GREETING_BYTES, left).map_err(frame)?;
        if let Ok(Reply::<serde_json::Value>::Error(reply)) = serde_json::from_value(first.clone())
        {
            return Err(ConnectError::Refused {
                path: owned(),
                reply,
            });
        }
        let greeting: Greeting =
            serde_json::from_value(first).map_err(|e| frame(FrameError::Json(e)))?;
        if greeting.service != service {
            return Err(ConnectError::Unexpected {
                path: owned(),
                reason: format!("it is '{}', not '{service}'", greeting.service),
            });
        }
        if !protocols.contains(&greeting.protocol) {
            return Err(ConnectError::Unexpected {
                path: owned(),
                reason: format!(
                    "it speaks protocol {}, this vramctl {}..={}",
                    greeting.protocol,
                    protocols.start(),
                    protocols.end()
                ),
            });
        }
        Ok(Self {
            conn,
            greeting,
            server,
            deadline,
            timeout,
        })
    }

    /// The server's greeting.
    pub fn greeting(&self) -> &Greeting {
        &self.greeting
    }

    /// Who the server is (uid, pid).
    pub fn server(&self) -> &Peer {
        &self.server
    }

    /// Sends `request` and reads the reply (at most `max_reply_bytes`) before the deadline
    /// set at [`connect`](Self::connect). One request per connection.
    ///
    /// # Errors
    /// [`AskError::Frame`]: not sent, no reply in time, a reply too long or not JSON of
    /// the expected shape.
    pub fn ask<Req: Serialize, Resp: DeserializeOwned>(
        mut self,
        request: &Req,
        max_reply_bytes: usize,
    ) -> Result<Reply<Resp>, AskError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AskError::Frame(FrameError::TimedOut {
                timeout: self.timeout,
            }));
        }
        self.conn.write_message(request, left)?;
        let left = self.deadline.saturating_duration_since(Instant::now());
        match self.conn.read_message(max_reply_bytes, left) {
            Err(FrameError::TimedOut { .. }) => Err(AskError::Frame(FrameError::TimedOut {
                timeout: self.timeout,
            })),
            other => Ok(other?),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    #[test]
    fn a_stale_socket_is_removed_by_the_client_that_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        match Client::connect(&path, "test", 1..=1, Duration::from_secs(1)) {
            Err(ConnectError::Stale { removed: true, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(!path.exists());
        assert!(matches!(
            Client::connect(&path, "test", 1..=1, Duration::from_secs(1)),
            Err(ConnectError::NotFound { .. })
        ));
    }

    #[test]
    fn a_server_that_never_greets_costs_the_client_its_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        // Listening but never accepting: the connection waits in the backlog.
        let _listener = UnixListener::bind(&path).unwrap();
        let started = Instant::now();
        match Client::connect(&path, "test", 1..=1, Duration::from_millis(100)) {
            Err(ConnectError::Frame {
                source: FrameError::TimedOut { .. },
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let spent = started.elapsed();
        assert!(
            spent >= Duration::from_millis(100) && spent < Duration::from_secs(5),
            "{spent:?}"
        );
        assert!(path.exists(), "a live socket is not removed");
    }

    #[test]
    fn another_service_or_protocol_is_not_spoken_to() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let greet = move |line: &'static str| {
            let (stream, _) = listener.accept().unwrap();
            let mut conn = Connection::new(stream);
            conn.write_line(line.as_bytes(), Duration::from_secs(1))
                .unwrap();
            listener
        };
        let handle = std::thread::spawn(move || {
            let l = greet(r#"{"protocol":1,"service":"other","version":"0","pid":1}"#);
            let (stream, _) = l.accept().unwrap();
            let mut conn = Connection::new(stream);
            conn.write_line(
                br#"{"protocol":9,"service":"test","version":"0","pid":1}"#,
                Duration::from_secs(1),
            )
            .unwrap();
            let (stream, _) = l.accept().unwrap();
            let mut conn2 = Connection::new(stream);
            conn2
                .write_line(
                    br#"{"error":{"code":"refused","message":"no"}}"#,
                    Duration::from_secs(1),
                )
                .unwrap();
            (conn, conn2)
        });
        let timeout = Duration::from_secs(2);
        assert!(matches!(
            Client::connect(&path, "test", 1..=1, timeout),
            Err(ConnectError::Unexpected { .. })
        ));
        assert!(matches!(
            Client::connect(&path, "test", 1..=1, timeout),
            Err(ConnectError::Unexpected { .. })
        ));
        match Client::connect(&path, "test", 1..=1, timeout) {
            Err(ConnectError::Refused { reply, .. }) => assert_eq!(reply.code, "refused"),
            other => panic!("{other:?}"),
        }
        drop(handle.join());
    }
}
