//! The server side of the convention: the directory and the socket with their modes, a
//! thread that accepts, checks each peer and hands its one request to a [`Handler`] on a
//! thread of its own, and the clean-up when it stops.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags, eventfd, poll};

use super::{
    Access, Connection, ErrorReply, FrameError, Greeting, Peer, SYSTEM_GROUP, error_line, euid,
    remove_socket_if, socket_file_id,
};

/// Why a server could not start listening.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListenError {
    /// The directory cannot be used safely or at all.
    #[error("cannot use '{}' for sockets: {reason}", dir.display())]
    Directory {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Another process answers on the socket already (another daemon).
    #[error("another process answers on '{}'", path.display())]
    InUse {
        /// The socket.
        path: PathBuf,
    },
    /// Something that is not a socket is in the way.
    #[error("'{}' exists and is not a socket; remove it", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Binding, setting the mode or starting the thread failed.
    #[error("cannot listen on '{}': {source}", path.display())]
    Io {
        /// The socket.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Handles the one request of a connection.
pub trait Handler: Send + Sync + 'static {
    /// The reply line (use [`super::ok_line`] / [`super::error_line`]) to `request` (one
    /// line, without its newline, at most the configured size) from `peer`, who passed
    /// the socket's [`Access`].
    fn handle(&self, peer: &Peer, request: &[u8]) -> Vec<u8>;
}

/// How a service listens.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The socket's file name in its directory (`daemon.sock`).
    pub file_name: String,
    /// The first line each accepted peer reads.
    pub greeting: Greeting,
    /// Longest request line.
    pub max_request_bytes: usize,
    /// Longest reply line; a longer one is replaced by a `reply_too_long` error.
    pub max_reply_bytes: usize,
    /// Deadline of each read and each write.
    pub timeout: Duration,
    /// Connections served at once; more are told `busy`.
    pub max_connections: usize,
    /// Every local user may connect (mode `0666`, [`Access::everyone`]): only for a service
    /// whose handler gives each peer nothing it could not read itself.
    pub open_to_everyone: bool,
}

/// A listening service: one thread accepts, one thread per connection serves. Stopping it
/// (or dropping it) stops accepting, removes the socket file and the directory it created.
#[derive(Debug)]
pub struct Server {
    path: PathBuf,
    socket_id: Option<(u64, u64)>,
    created_dir: Option<PathBuf>,
    wake: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Prepares `dir`, binds `config.file_name` in it with the convention's modes and
    /// starts accepting.
    ///
    /// # Errors
    /// See [`ListenError`]: an unsafe directory, another process answering on the socket,
    /// a non-socket in the way, or the bind failing.
    pub fn start(
        dir: &Path,
        config: ServiceConfig,
        handler: Arc<dyn Handler>,
    ) -> Result<Self, ListenError> {
        let me = euid();
        let system = me == 0;
        let created_dir = prepare_dir(dir, me, if system { 0o755 } else { 0o700 })?;
        let path = dir.join(&config.file_name);
        let io = |source| ListenError::Io {
            path: path.clone(),
            source,
        };
        take_over_stale(&path)?;
        let listener = UnixListener::bind(&path).map_err(io)?;
        // The group of root's daemon, where it exists: its members may read too.
        let group_gid = if system {
            nix::unistd::Group::from_name(SYSTEM_GROUP)
                .ok()
                .flatten()
                .map(|g| g.gid.as_raw())
        } else {
            None
        };
        let everyone = config.open_to_everyone;
        let group_gid = group_gid.filter(|_| !everyone);
        let mode = if everyone {
            0o666
        } else if group_gid.is_some() {
            0o660
        } else {
            0o600
        };
        if let Some(gid) = group_gid {
            std::os::unix::fs::chown(&path, None, Some(gid)).map_err(io)?;
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(io)?;
        let socket_id = socket_file_id(&path);
        listener.set_nonblocking(true).map_err(io)?;
        let wake = Arc::new(eventfd(0, EventfdFlags::CLOEXEC).map_err(|e| io(e.into()))?);
        let access = Access {
            owner_uid: me,
            group_gid,
            everyone,
        };
        let thread_wake = Arc::clone(&wake);
        let thread = std::thread::Builder::new()
            .name("vramctl-socket".into())
            .spawn(move || {
                accept_loop(&listener, &thread_wake, access, &Arc::new(config), &handler)
            })
            .map_err(io)?;
        tracing::info!(socket = %path.display(), mode = format!("{mode:o}"), "Answering on a local socket.");
        Ok(Self {
            path,
            socket_id,
            created_dir,
            wake,
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting (connections being served finish on their own), removes the socket
    /// file and, when it created it and it is empty, the directory.
    pub fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        let _ = rustix::io::write(self.wake.as_fd(), &1_u64.to_ne_bytes());
        let _ = thread.join();
        if let Some(id) = self.socket_id {
            remove_socket_if(&self.path, id);
        }
        if let Some(dir) = &self.created_dir {
            // Only when empty: another service's socket may be there.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Makes `dir` (mode `mode`) or checks the one there: a directory, not a link, owned by
/// `uid`, nobody else may write in it; its mode set to `mode` when it is ours and differs.
/// Returns the directory when it was created here.
fn prepare_dir(dir: &Path, uid: u32, mode: u32) -> Result<Option<PathBuf>, ListenError> {
    let bad = |reason: String| ListenError::Directory {
        dir: dir.to_path_buf(),
        reason,
    };
    let created = match std::fs::symlink_metadata(dir) {
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(dir)
                .map_err(|e| bad(e.to_string()))?;
            true
        }
        Err(e) => return Err(bad(e.to_string())),
    };
    let meta = std::fs::symlink_metadata(dir).map_err(|e| bad(e.to_string()))?;
    if !meta.file_type().is_dir() {
        return Err(bad("it is not a directory".into()));
    }
    if meta.uid() != uid {
        return Err(bad(format!(
            "it belongs to uid {}, not to this process (uid {uid}); remove it",
            meta.uid()
        )));
    }
    if meta.mode() & 0o7777 != mode {
        // Ours: the umask or an older run may have left other bits.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .map_err(|e| bad(e.to_string()))?;
    }
    Ok(created.then(|| dir.to_path_buf()))
}

/// Clears the way for binding `path`: nothing there, or a socket nobody answers on (removed).
fn take_over_stale(path: &Path) -> Result<(), ListenError> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    let Some(id) = socket_file_id(path) else {
        return Err(ListenError::NotASocket {
            path: path.to_path_buf(),
        });
    };
    match UnixStream::connect(path) {
        Ok(_) => Err(ListenError::InUse {
            path: path.to_path_buf(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            tracing::info!(socket = %path.display(), "Removing a stale socket (nobody answers on it).");
            remove_socket_if(path, id);
            Ok(())
        }
        Err(source) => Err(ListenError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn accept_loop(
    listener: &UnixListener,
    wake: &OwnedFd,
    access: Access,
    config: &Arc<ServiceConfig>,
    handler: &Arc<dyn Handler>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        let mut fds = [
            PollFd::new(listener, PollFlags::IN),
            PollFd::new(wake, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "The local socket stopped answering.");
                return;
            }
        }
        if !fds[1].revents().is_empty() {
            return;
        }
        loop {
            match listener.accept() {
                Ok((stream, _)) => serve(stream, access, config, handler, &active),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of descriptors, or the peer gave up before we took it: the next
                    // connection may work.
                    tracing::debug!(error = %e, "Could not accept a connection.");
                    break;
                }
            }
        }
    }
}

/// Checks the peer and serves it on a thread of its own.
fn serve(
    stream: UnixStream,
    access: Access,
    config: &Arc<ServiceConfig>,
    handler: &Arc<dyn Handler>,
    active: &Arc<AtomicUsize>,
) {
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let mut conn = Connection::new(stream);
    let peer = match Peer::of(conn.stream()) {
        Ok(peer) => peer,
        Err(e) => {
            tracing::debug!(error = %e, "No peer credentials; closing.");
            return;
        }
    };
    if !access.allows(&peer) {
        tracing::info!(
            uid = peer.uid,
            pid = peer.pid,
            "Refused a local connection."
        );
        let refusal = ErrorReply::new(
            "refused",
            format!(
                "uid {} may not read this socket (its owner, root{} may)",
                peer.uid,
                if access.group_gid.is_some() {
                    " and the vramctl group"
                } else {
                    ""
                }
            ),
        );
        let _ = conn.write_line(&error_line(&refusal), config.timeout);
        return;
    }
    if active.fetch_add(1, Ordering::SeqCst) >= config.max_connections {
        active.fetch_sub(1, Ordering::SeqCst);
        let busy = ErrorReply::new("busy", "too many connections at once; try again");
        let _ = conn.write_line(&error_line(&busy), config.timeout);
        return;
    }
    let (config, handler, running) = (Arc::clone(config), Arc::clone(handler), Arc::clone(active));
    let spawned = std::thread::Builder::new()
        .name("vramctl-socket-conn".into())
        .spawn(move || {
            converse(&mut conn, &peer, &config, handler.as_ref());
            running.fetch_sub(1, Ordering::SeqCst);
        });
    if spawned.is_err() {
        active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Greeting, one request, one reply.
fn converse(conn: &mut Connection, peer: &Peer, config: &ServiceConfig, handler: &dyn Handler) {
    if conn
        .write_message(&config.greeting, config.timeout)
        .is_err()
    {
        return;
    }
    let request = match conn.read_line(config.max_request_bytes, config.timeout) {
        Ok(line) => line,
        Err(FrameError::TooLong { max_bytes }) => {
            let e = ErrorReply::new(
                "request_too_long",
                format!("a request is at most {max_bytes} bytes"),
            );
            let _ = conn.write_line(&error_line(&e), config.timeout);
            return;
        }
        Err(FrameError::TimedOut { timeout }) => {
            let e = ErrorReply::new(
                "timed_out",
                format!("no request within {} ms", timeout.as_millis()),
            );
            let _ = conn.write_line(&error_line(&e), config.timeout);
            return;
        }
        Err(_) => return,
    };
    let mut reply = handler.handle(peer, &request);
    if reply.len() > config.max_reply_bytes {
        tracing::warn!(
            bytes = reply.len(),
            max = config.max_reply_bytes,
            "A reply was too long to send."
        );
        reply = error_line(&ErrorReply::new(
            "reply_too_long",
            format!(
                "the reply would be longer than {} bytes",
                config.max_reply_bytes
            ),
        ));
    }
    if let Err(e) = conn.write_line(&reply, config.timeout) {
        tracing::debug!(error = %e, "Could not send a reply.");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local_socket::{Reply, client, ok_line};

    struct Echo;

    impl Handler for Echo {
        fn handle(&self, peer: &Peer, request: &[u8]) -> Vec<u8> {
            match serde_json::from_slice::<serde_json::Value>(request) {
                Ok(v) => {
                    ok_line(&serde_json::json!({"echo": v, "uid": peer.uid})).unwrap_or_default()
                }
                Err(e) => error_line(&ErrorReply::new("bad_request", e.to_string())),
            }
        }
    }

    fn config() -> ServiceConfig {
        ServiceConfig {
            file_name: "test.sock".into(),
            greeting: Greeting {
                protocol: 1,
                service: "test".into(),
                version: "0".into(),
                pid: std::process::id(),
            },
            max_request_bytes: 64,
            max_reply_bytes: 1024,
            timeout: Duration::from_secs(2),
            max_connections: 4,
            open_to_everyone: false,
        }
    }

    fn ask(
        path: &Path,
        request: &serde_json::Value,
    ) -> Result<Reply<serde_json::Value>, client::AskError> {
        let client = client::Client::connect(path, "test", 1..=1, Duration::from_secs(2))?;
        client.ask(request, 1024)
    }

    #[test]
    fn a_request_is_answered_and_the_socket_removed_at_stop() {
        let dir = tempfile::tempdir().unwrap();
        let sockets = dir.path().join("run/vramctl");
        let mut server = Server::start(&sockets, config(), Arc::new(Echo)).unwrap();
        let path = server.path().to_path_buf();
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600, "the socket's mode");
        let dir_mode = std::fs::metadata(&sockets).unwrap().mode() & 0o777;
        assert_eq!(dir_mode, if euid() == 0 { 0o755 } else { 0o700 });
        let reply = ask(&path, &serde_json::json!({"a": 1})).unwrap();
        assert_eq!(
            reply,
            Reply::Ok(serde_json::json!({"echo": {"a": 1}, "uid": euid()}))
        );
        server.stop();
        assert!(!path.exists(), "the socket is removed");
        assert!(!sockets.exists(), "the directory it made is removed");
    }

    #[test]
    fn a_socket_open_to_everyone_is_0666_and_never_takes_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let config = ServiceConfig {
            open_to_everyone: true,
            ..config()
        };
        let server = Server::start(dir.path(), config, Arc::new(Echo)).unwrap();
        let meta = std::fs::metadata(server.path()).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o666, "the socket's mode");
        assert_eq!(meta.gid(), rustix::process::getegid().as_raw());
        let reply = ask(server.path(), &serde_json::json!({"a": 1})).unwrap();
        assert!(matches!(reply, Reply::Ok(_)), "{reply:?}");
    }

    #[test]
    fn an_oversized_request_gets_an_error_and_the_connection_closes() {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(dir.path(), config(), Arc::new(Echo)).unwrap();
        let long = serde_json::json!({"a": "x".repeat(200)});
        match ask(server.path(), &long) {
            Ok(Reply::Error(e)) => assert_eq!(e.code, "request_too_long"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_second_server_does_not_take_a_live_socket_but_takes_a_stale_one() {
        let dir = tempfile::tempdir().unwrap();
        let first = Server::start(dir.path(), config(), Arc::new(Echo)).unwrap();
        assert!(matches!(
            Server::start(dir.path(), config(), Arc::new(Echo)),
            Err(ListenError::InUse { .. })
        ));
        drop(first);
        // A server killed without clean-up leaves its socket file: nobody answers on it.
        drop(UnixListener::bind(dir.path().join("test.sock")).unwrap());
        assert!(dir.path().join("test.sock").exists());
        let server = Server::start(dir.path(), config(), Arc::new(Echo)).unwrap();
        assert!(ask(server.path(), &serde_json::json!(1)).is_ok());
    }

    #[test]
    fn a_directory_of_another_owner_or_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real");
        std::fs::create_dir(&target).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(
            Server::start(&link, config(), Arc::new(Echo)),
            Err(ListenError::Directory { .. })
        ));
        if euid() == 0 {
            let other = dir.path().join("other");
            std::fs::create_dir(&other).unwrap();
            std::os::unix::fs::chown(&other, Some(65534), None).unwrap();
            assert!(matches!(
                Server::start(&other, config(), Arc::new(Echo)),
                Err(ListenError::Directory { .. })
            ));
        }
    }
}
