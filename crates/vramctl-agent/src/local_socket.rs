//! Local sockets: the one convention every vramctl socket follows (the daemon's fast path
//! for `status`, `ps` and `top`; later the in-process agent), so that one client and one
//! server serve them all.
//!
//! - **Where**: Unix stream sockets in `$XDG_RUNTIME_DIR/vramctl/` for a user's own
//!   processes, `/run/vramctl/` for root's daemon; `VRAMCTL_RUNTIME_DIR` replaces both
//!   (several daemons on one machine, tests). A client looks in its own directory first,
//!   then in root's ([`search_dirs`]).
//! - **Who may connect**: the directory is `0700` (`0755` for root's), the socket `0600`, or
//!   `0660` with the `vramctl` group when root's daemon finds that group. The file modes are
//!   the first gate; the peer's credentials (`SO_PEERCRED`, taken by the kernel at
//!   `connect`) are checked again on every connection ([`Access`]): the socket's owner,
//!   root, and with the group its members. A client checks the server too: root or itself.
//! - **What is said**: one JSON object per line. The server speaks first, a greeting with
//!   `"protocol": N` ([`Greeting`]) or an error when it refuses the peer; the client sends
//!   one request; the server sends one reply (`{"ok": …}` or `{"error": {"code", "message"}}`,
//!   [`Reply`]) and closes. Requests and replies are bounded in size; every read and write,
//!   on both sides, has a deadline ([`Connection`]).
//! - **Stale sockets**: a socket file nobody listens on (a daemon killed with SIGKILL) is
//!   removed by the next client that finds it ([`client::connect`]) and by the next server
//!   that binds there; a socket somebody answers on is never taken over.

pub mod client;
pub mod server;

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Replaces every default directory of sockets, on both sides.
pub const RUNTIME_DIR_ENV: &str = "VRAMCTL_RUNTIME_DIR";
/// Root's daemons' sockets.
pub const SYSTEM_DIR: &str = "/run/vramctl";
/// The group that may read root's daemon where it exists (the socket is then `0660`).
pub const SYSTEM_GROUP: &str = "vramctl";

/// This process's effective uid.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn env_dir(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Where this process's own sockets go: `VRAMCTL_RUNTIME_DIR`, else `/run/vramctl` for
/// root, else `$XDG_RUNTIME_DIR/vramctl`. `None`: a user without `XDG_RUNTIME_DIR` has no
/// private directory for them (`/tmp` is shared; nothing is put there).
pub fn own_dir() -> Option<PathBuf> {
    if let Some(dir) = env_dir(RUNTIME_DIR_ENV) {
        return Some(dir);
    }
    if euid() == 0 {
        return Some(PathBuf::from(SYSTEM_DIR));
    }
    env_dir("XDG_RUNTIME_DIR").map(|d| d.join("vramctl"))
}

/// Where a client looks for a service's socket, in order: `VRAMCTL_RUNTIME_DIR` alone when
/// set; else its own directory ([`own_dir`]), then root's.
pub fn search_dirs() -> Vec<PathBuf> {
    if let Some(dir) = env_dir(RUNTIME_DIR_ENV) {
        return vec![dir];
    }
    let mut dirs: Vec<PathBuf> = own_dir().into_iter().collect();
    let system = PathBuf::from(SYSTEM_DIR);
    if !dirs.contains(&system) {
        dirs.push(system);
    }
    dirs
}

/// What the first line from a server says when it serves the peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Greeting {
    /// Version of the service's messages; a client that does not speak it goes elsewhere.
    pub protocol: u32,
    /// Which service answers (`vramctl-daemon`), so a socket is never mistaken for another.
    pub service: String,
    /// The server's vramctl version.
    pub version: String,
    /// The server's PID.
    pub pid: u32,
}

/// One reply: `{"ok": …}` or `{"error": {"code": …, "message": …}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply<T> {
    /// What was asked for.
    Ok(T),
    /// Why not.
    Error(ErrorReply),
}

/// Why a server did not do what it was asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// A short fixed name: `refused`, `busy`, `bad_request`, `request_too_long`,
    /// `timed_out`, `reply_too_long`, or the service's own.
    pub code: String,
    /// One line for people.
    pub message: String,
}

impl ErrorReply {
    /// An error with its code and message.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

/// The line of a successful reply.
///
/// # Errors
/// When `value` cannot be serialised.
pub fn ok_line<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&Reply::Ok(value))
}

/// The line of an error reply.
pub fn error_line(error: &ErrorReply) -> Vec<u8> {
    // A struct of two strings always serialises.
    serde_json::to_vec(&Reply::<()>::Error(error.clone())).unwrap_or_default()
}

/// The process at the other end of a connection, as the kernel recorded it at `connect`.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Its PID (in the server's PID namespace; 0 when it is in none the server can see).
    pub pid: u32,
    /// Effective uid.
    pub uid: u32,
    /// Effective gid.
    pub gid: u32,
    /// The connected process itself (`SO_PEERPIDFD`, Linux 6.5), taken by the kernel at
    /// `connect` like the credentials. What is read about the peer from `/proc/PID` is its
    /// own only while this process still runs: once it has exited, the PID may name another
    /// process. `None` on older kernels (and for a peer known only by its credentials).
    pub pidfd: Option<Arc<OwnedFd>>,
}

impl Peer {
    /// A peer known by its credentials alone (no process pinned).
    pub fn from_credentials(pid: u32, uid: u32, gid: u32) -> Self {
        Self {
            pid,
            uid,
            gid,
            pidfd: None,
        }
    }

    /// `SO_PEERCRED` of `stream`, and `SO_PEERPIDFD` where the kernel has it.
    ///
    /// # Errors
    /// When the kernel does not say, or says the peer has already gone.
    pub fn of(stream: &UnixStream) -> std::io::Result<Self> {
        // nix, not rustix: rustix's credentials hold a non-zero PID and fail on the 0 the
        // kernel gives for a peer in a PID namespace we cannot see (a client in a
        // container asking a host daemon sees the daemon so).
        let cred = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
            .map_err(std::io::Error::from)?;
        let pidfd = match nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerPidfd)
        {
            Ok(fd) => Some(Arc::new(fd)),
            // Kernels before 6.5 do not know the option; a peer in a namespace we cannot
            // see has no pidfd for us either (its PID is 0 and every /proc read is refused).
            Err(nix::errno::Errno::ENOPROTOOPT | nix::errno::Errno::EINVAL) => None,
            Err(nix::errno::Errno::ESRCH) if cred.pid() == 0 => None,
            Err(e) => return Err(std::io::Error::from(e)),
        };
        Ok(Self {
            pid: u32::try_from(cred.pid()).unwrap_or(0),
            uid: cred.uid(),
            gid: cred.gid(),
            pidfd,
        })
    }

    /// Whether the process that connected still runs: `Some(false)` once it has exited (a
    /// zombie counts: its PID is about to be free), `None` without a pidfd to tell. Call it
    /// *after* reading `/proc/PID`: `Some(true)` then means what was read was the peer's.
    pub fn still_running(&self) -> Option<bool> {
        let fd = self.pidfd.as_deref()?;
        let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
        let now = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // A pidfd polls readable once its process has terminated.
        match rustix::event::poll(&mut fds, Some(&now)) {
            Ok(0) => Some(true),
            Ok(_) => Some(false),
            // Cannot tell: the caller treats it as gone, the safe answer.
            Err(_) => Some(false),
        }
    }
}

/// Who may talk to a socket: its owner, root, and with `group` the members of that group
/// (as the file mode already says: `0600`, or `0660` with the group); or, for a service
/// whose every answer is one any local user may have (`everyone`, mode `0666`), anyone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// The uid the server runs as.
    pub owner_uid: u32,
    /// The group whose members may connect too.
    pub group_gid: Option<u32>,
    /// Every local user may connect; the handler decides what each may have.
    pub everyone: bool,
}

impl Access {
    /// Whether `peer` may talk to this socket.
    pub fn allows(&self, peer: &Peer) -> bool {
        self.everyone
            || peer.uid == 0
            || peer.uid == self.owner_uid
            || self.group_gid.is_some_and(|g| {
                // The supplementary groups are not in SO_PEERCRED; /proc has them. A peer
                // that exited before or during the read is refused, the safe answer: its
                // PID may name another process by then.
                peer.gid == g
                    || (supplementary_groups(peer.pid).contains(&g)
                        && peer.still_running() != Some(false))
            })
    }
}

/// The supplementary groups of `pid` (`Groups:` of `/proc/PID/status`).
fn supplementary_groups(pid: u32) -> Vec<u32> {
    if pid == 0 {
        return Vec::new();
    }
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("Groups:"))
                .map(|groups| {
                    groups
                        .split_whitespace()
                        .filter_map(|g| g.parse().ok())
                        .collect()
                })
        })
        .unwrap_or_default()
}

/// Why a message could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The line went on past the limit.
    #[error("a line longer than {max_bytes} bytes")]
    TooLong {
        /// The limit.
        max_bytes: usize,
    },
    /// The deadline passed first.
    #[error("no complete line within {} ms", timeout.as_millis())]
    TimedOut {
        /// The time that was given.
        timeout: Duration,
    },
    /// The other side closed the connection before a whole line.
    #[error("the connection closed")]
    Closed,
    /// The line is not the JSON expected.
    #[error("not a valid message: {0}")]
    Json(#[from] serde_json::Error),
    /// The socket failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// One connection: lines in with a size limit and a deadline each, lines out with a
/// deadline each.
#[derive(Debug)]
pub struct Connection {
    stream: UnixStream,
    /// Bytes read past the last line.
    pending: Vec<u8>,
}

impl Connection {
    /// Wraps a connected, blocking stream.
    pub fn new(stream: UnixStream) -> Self {
        Self {
            stream,
            pending: Vec::new(),
        }
    }

    /// The stream (for its peer's credentials).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// The next line (without its newline), at most `max_bytes` long, within `timeout`
    /// (the whole line, not each read: a peer sending a byte at a time cannot stretch it).
    ///
    /// # Errors
    /// [`FrameError::TooLong`], [`FrameError::TimedOut`], [`FrameError::Closed`] or the
    /// socket's error.
    pub fn read_line(
        &mut self,
        max_bytes: usize,
        timeout: Duration,
    ) -> Result<Vec<u8>, FrameError> {
        let deadline = Instant::now() + timeout;
        let mut scanned = 0;
        loop {
            if let Some(end) = self.pending[scanned..].iter().position(|&b| b == b'\n') {
                let end = scanned + end;
                if end > max_bytes {
                    return Err(FrameError::TooLong { max_bytes });
                }
                let mut line: Vec<u8> = self.pending.drain(..=end).collect();
                line.pop();
                return Ok(line);
            }
            scanned = self.pending.len();
            if scanned > max_bytes {
                return Err(FrameError::TooLong { max_bytes });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(FrameError::TimedOut { timeout });
            }
            self.stream.set_read_timeout(Some(left))?;
            let mut chunk = [0_u8; 16 * 1024];
            // Never read much past the limit.
            let room = (max_bytes + 1 - scanned).min(chunk.len());
            match self.stream.read(&mut chunk[..room]) {
                Ok(0) => return Err(FrameError::Closed),
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e) if is_timeout(&e) => return Err(FrameError::TimedOut { timeout }),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The next line as `T`.
    ///
    /// # Errors
    /// As [`read_line`](Self::read_line), or [`FrameError::Json`].
    pub fn read_message<T: DeserializeOwned>(
        &mut self,
        max_bytes: usize,
        timeout: Duration,
    ) -> Result<T, FrameError> {
        let line = self.read_line(max_bytes, timeout)?;
        Ok(serde_json::from_slice(&line)?)
    }

    /// Writes `line` and a newline within `timeout`.
    ///
    /// # Errors
    /// [`FrameError::TimedOut`], or the socket's error (the peer went away).
    pub fn write_line(&mut self, line: &[u8], timeout: Duration) -> Result<(), FrameError> {
        let deadline = Instant::now() + timeout;
        let mut whole = Vec::with_capacity(line.len() + 1);
        whole.extend_from_slice(line);
        whole.push(b'\n');
        let mut rest = whole.as_slice();
        while !rest.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(FrameError::TimedOut { timeout });
            }
            self.stream.set_write_timeout(Some(left))?;
            match self.stream.write(rest) {
                Ok(0) => return Err(FrameError::Closed),
                Ok(n) => rest = &rest[n..],
                Err(e) if is_timeout(&e) => return Err(FrameError::TimedOut { timeout }),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Writes `value` as one line within `timeout`.
    ///
    /// # Errors
    /// As [`write_line`](Self::write_line), or [`FrameError::Json`].
    pub fn write_message<T: Serialize>(
        &mut self,
        value: &T,
        timeout: Duration,
    ) -> Result<(), FrameError> {
        let line = serde_json::to_vec(value)?;
        self.write_line(&line, timeout)
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// The `(device, inode)` of a path itself (not what a link points at), when it is a socket.
pub(crate) fn socket_file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::symlink_metadata(path).ok()?;
    meta.file_type()
        .is_socket()
        .then(|| (meta.dev(), meta.ino()))
}

/// Removes the socket file at `path` if it is still the one identified by `id` (so a
/// socket a new server bound in between is left alone). Whether it was removed.
pub(crate) fn remove_socket_if(path: &Path, id: (u64, u64)) -> bool {
    socket_file_id(path) == Some(id) && std::fs::remove_file(path).is_ok()
}

/// Why [`connect_now`] did not connect.
#[derive(Debug)]
pub(crate) enum ConnectRefusal {
    /// No socket file at the path.
    NotFound,
    /// A socket file nobody listens on; `removed` when it was still the file that refused
    /// us and is gone now.
    Stale { removed: bool },
    /// The server's backlog is full.
    Busy,
    /// The file's mode (or the directory's) does not let us connect.
    NoPermission,
    /// Anything else.
    Io(std::io::Error),
}

/// Connects to the Unix socket at `path` without ever waiting (a full backlog is
/// [`ConnectRefusal::Busy`]), removes a stale socket that is still the one that refused us,
/// and returns the blocking stream with the server's credentials: the one connect of the
/// daemon's clients and the agent's.
pub(crate) fn connect_now(path: &Path) -> Result<(UnixStream, Peer), ConnectRefusal> {
    use rustix::io::Errno;
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let io = |e: Errno| ConnectRefusal::Io(e.into());
    let before = socket_file_id(path);
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(io)?;
    let addr = SocketAddrUnix::new(path).map_err(io)?;
    match rustix::net::connect(&fd, &addr) {
        Ok(()) => {}
        Err(Errno::NOENT) => return Err(ConnectRefusal::NotFound),
        Err(Errno::CONNREFUSED) => {
            let removed = before.is_some_and(|id| remove_socket_if(path, id));
            return Err(ConnectRefusal::Stale { removed });
        }
        Err(Errno::AGAIN) => return Err(ConnectRefusal::Busy),
        Err(Errno::ACCESS | Errno::PERM) => return Err(ConnectRefusal::NoPermission),
        Err(e) => return Err(io(e)),
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false).map_err(ConnectRefusal::Io)?;
    let server = Peer::of(&stream).map_err(ConnectRefusal::Io)?;
    Ok((stream, server))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Connection, Connection) {
        let (a, b) = UnixStream::pair().expect("a socket pair");
        (Connection::new(a), Connection::new(b))
    }

    #[test]
    fn lines_go_through_whole_and_one_at_a_time() {
        let (mut a, mut b) = pair();
        a.write_line(b"{\"x\":1}", Duration::from_secs(1)).unwrap();
        a.write_line(b"{\"x\":2}", Duration::from_secs(1)).unwrap();
        assert_eq!(
            b.read_line(100, Duration::from_secs(1)).unwrap(),
            b"{\"x\":1}"
        );
        assert_eq!(
            b.read_line(100, Duration::from_secs(1)).unwrap(),
            b"{\"x\":2}"
        );
    }

    #[test]
    fn a_line_past_the_limit_is_refused_without_reading_it_all() {
        let (mut a, mut b) = pair();
        let long = vec![b'a'; 10_000];
        a.write_line(&long, Duration::from_secs(1)).unwrap();
        assert!(matches!(
            b.read_line(4096, Duration::from_secs(1)),
            Err(FrameError::TooLong { max_bytes: 4096 })
        ));
        assert!(b.pending.len() <= 4097, "read {} bytes", b.pending.len());
    }

    #[test]
    fn a_silent_peer_costs_the_reader_its_timeout() {
        let (_a, mut b) = pair();
        let started = Instant::now();
        assert!(matches!(
            b.read_line(100, Duration::from_millis(50)),
            Err(FrameError::TimedOut { .. })
        ));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_closed_peer_is_closed_not_a_line() {
        let (mut a, mut b) = pair();
        a.write_line(b"part", Duration::from_secs(1)).unwrap();
        drop(a);
        assert_eq!(b.read_line(100, Duration::from_secs(1)).unwrap(), b"part");
        assert!(matches!(
            b.read_line(100, Duration::from_secs(1)),
            Err(FrameError::Closed)
        ));
    }

    #[test]
    fn replies_are_ok_or_error_objects() {
        let ok = ok_line(&serde_json::json!({"a": 1})).unwrap();
        assert_eq!(ok, br#"{"ok":{"a":1}}"#);
        let err = error_line(&ErrorReply::new("busy", "too many connections"));
        assert_eq!(
            err,
            br#"{"error":{"code":"busy","message":"too many connections"}}"#
        );
        let back: Reply<serde_json::Value> = serde_json::from_slice(&err).unwrap();
        assert!(matches!(back, Reply::Error(e) if e.code == "busy"));
    }

    #[test]
    fn the_peer_of_a_pair_is_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        let peer = Peer::of(&a).unwrap();
        assert_eq!(peer.pid, std::process::id());
        assert_eq!(peer.uid, euid());
    }

    #[test]
    fn access_lets_in_the_owner_root_and_the_group_only() {
        let access = Access {
            owner_uid: 1000,
            group_gid: None,
            everyone: false,
        };
        let peer = |uid, gid| Peer::from_credentials(0, uid, gid);
        assert!(access.allows(&peer(1000, 1000)));
        assert!(access.allows(&peer(0, 0)));
        assert!(!access.allows(&peer(1001, 1001)));
        let grouped = Access {
            group_gid: Some(998),
            ..access
        };
        assert!(grouped.allows(&peer(1001, 998)));
        assert!(!grouped.allows(&peer(1001, 1001)));
        let open = Access {
            everyone: true,
            ..access
        };
        assert!(open.allows(&peer(1001, 1001)));
        assert!(open.allows(&peer(65534, 65534)));
    }
}
