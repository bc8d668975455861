//! The client of the in-process agent (`python/vramctl_agent`, protocol 1 of `docs/agent.md`):
//! find a process's socket, connect without ever waiting on an agent that does not accept,
//! check that the process at the other end is the one asked for, and send requests with a
//! deadline on each exchange and a bound on each line.
//!
//! A process without an agent, an agent that died (its socket stale: removed here), one that
//! never answers, answers garbage or is not allowed to be asked are normal cases: each is an
//! [`AgentError`] with one line for the user, never a hang. The framing (bounded lines with
//! deadlines, the peer's credentials, the stale-socket test) is [`crate::local_socket`]'s;
//! the agent speaks first only when answering, so the greeting of that convention is not used.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::local_socket::{ConnectRefusal, Connection, FrameError, connect_now, euid};

/// The protocol version this client speaks.
pub const PROTOCOL: u32 = 1;
/// The agent refuses longer request lines (`docs/agent.md`, "Limits and timeouts").
pub const MAX_REQUEST_BYTES: usize = 65_536;
/// The longest answer line read. The agent keeps its answers under 1 MiB; 4 MiB leaves room
/// for a newer agent's extra fields, as the Python client does, and still bounds memory.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

/// How long each step may take. The defaults are the Python client's (`docs/agent.md`): an
/// answer to `stats` can wait for the allocator's lock behind a running `empty_cache`, and a
/// reclaim lasts as long as the longest kernel in flight (`cudaFree` waits for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `hello`, `stats`, `reset-peak`.
    pub quick: Duration,
    /// `reclaim`.
    pub reclaim: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            quick: Duration::from_secs(5),
            reclaim: Duration::from_secs(60),
        }
    }
}

/// Why an agent could not be asked, or did not answer as asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// No socket for the process in any directory an agent uses.
    #[error("process {pid} has no vramctl agent (no agent-{pid}.sock in {}); start one in it with 'import vramctl_agent; vramctl_agent.start()' or VRAMCTL_AGENT=1", list(.searched))]
    NoAgent {
        /// The process.
        pid: u32,
        /// The directories looked in.
        searched: Vec<PathBuf>,
    },
    /// A socket nobody listens on: the agent's process died without removing it.
    #[error("process {pid} has no running agent: '{}' is a stale socket{}", path.display(), if *removed { " (removed)" } else { "" })]
    Stale {
        /// The process.
        pid: u32,
        /// The socket.
        path: PathBuf,
        /// Whether this client removed it.
        removed: bool,
    },
    /// The directory or socket is not ours to use.
    #[error("not allowed to ask the agent of process {pid} at '{}'; run as its user or root", path.display())]
    NotAllowed {
        /// The process.
        pid: u32,
        /// The socket.
        path: PathBuf,
    },
    /// The socket is not served by the process asked for (or by its user): not believed.
    #[error("'{}' is not the agent of process {pid}: {reason}", path.display())]
    WrongPeer {
        /// The process.
        pid: u32,
        /// The socket.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// The agent does not accept connections now (its backlog is full).
    #[error("the agent of process {pid} is busy; retry in a moment")]
    Busy {
        /// The process.
        pid: u32,
    },
    /// No whole answer within the deadline.
    #[error("the agent of process {pid} did not answer '{op}' within {:.1} s", timeout.as_secs_f64())]
    Timeout {
        /// The process.
        pid: u32,
        /// The request.
        op: String,
        /// The deadline it had.
        timeout: Duration,
    },
    /// The agent closed the connection without answering.
    #[error("the agent of process {pid} closed the connection without answering '{op}'")]
    Closed {
        /// The process.
        pid: u32,
        /// The request.
        op: String,
    },
    /// The answer is not protocol 1 as `docs/agent.md` specifies it.
    #[error("the agent of process {pid} gave a malformed answer to '{op}': {reason}")]
    Malformed {
        /// The process.
        pid: u32,
        /// The request.
        op: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The agent answered with an error.
    #[error("the agent of process {pid} refused '{op}': {message} ({code})")]
    Refused {
        /// The process.
        pid: u32,
        /// The request.
        op: String,
        /// The protocol's error code (`busy`, `capturing`, `framework_error`, …).
        code: String,
        /// Its message.
        message: String,
        /// When to ask again, for `busy` and `capturing`.
        retry_after_s: Option<f64>,
    },
    /// The request itself could not be made (too long, not serialisable).
    #[error("cannot send '{op}' to the agent of process {pid}: {reason}")]
    Request {
        /// The process.
        pid: u32,
        /// The request.
        op: String,
        /// Why.
        reason: String,
    },
    /// The socket failed.
    #[error("cannot talk to the agent of process {pid} at '{}': {source}", path.display())]
    Io {
        /// The process.
        pid: u32,
        /// The socket.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl AgentError {
    /// A short fixed name for the case (`no_agent`, `stale`, `timeout`, …, or the agent's
    /// own error code), for JSON and scripts.
    pub fn code(&self) -> &str {
        match self {
            Self::NoAgent { .. } => "no_agent",
            Self::Stale { .. } => "stale",
            Self::NotAllowed { .. } => "not_allowed",
            Self::WrongPeer { .. } => "wrong_peer",
            Self::Busy { .. } => "busy",
            Self::Timeout { .. } => "timeout",
            Self::Closed { .. } => "closed",
            Self::Malformed { .. } => "malformed",
            Self::Refused { code, .. } => code,
            Self::Request { .. } => "request",
            Self::Io { .. } => "io",
        }
    }

    /// Whether the process simply has no agent (none installed, or it died): the normal
    /// case of most processes, not a failure of one.
    pub fn is_no_agent(&self) -> bool {
        matches!(self, Self::NoAgent { .. } | Self::Stale { .. })
    }
}

fn list(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return "no directory".to_owned();
    }
    dirs.iter()
        .map(|d| format!("'{}'", d.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The socket's file name for `pid`.
pub fn socket_name(pid: u32) -> String {
    format!("agent-{pid}.sock")
}

/// Where an agent of `pid` may have its socket, in the order `docs/agent.md` gives: the
/// process's own `$XDG_RUNTIME_DIR/vramctl` (from `/proc/PID/environ`, readable by its user
/// and root), this client's `$XDG_RUNTIME_DIR/vramctl` when it is the process's user,
/// `/run/user/UID/vramctl`, `/tmp/vramctl-UID`, then the fresh private directories
/// `/tmp/vramctl-UID.*` ([`fallback_dirs`]) (`UID` the owner of `/proc/PID`, the process's
/// effective uid; this client's own when the process is gone).
pub fn candidate_dirs(pid: u32) -> Vec<PathBuf> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let owner = std::fs::metadata(&proc_dir).ok().map(|m| m.uid());
    let mut dirs = Vec::new();
    if let Some(runtime) = std::fs::read(proc_dir.join("environ"))
        .ok()
        .and_then(|env| xdg_runtime_dir(&env))
    {
        dirs.push(runtime.join("vramctl"));
    }
    let uid = owner.unwrap_or_else(euid);
    if uid == euid() {
        if let Some(own) = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|d| d.is_absolute())
        {
            dirs.push(own.join("vramctl"));
        }
    }
    dirs.push(PathBuf::from(format!("/run/user/{uid}/vramctl")));
    dirs.push(PathBuf::from(format!("/tmp/vramctl-{uid}")));
    dirs.extend(fallback_dirs(uid));
    let mut seen = Vec::new();
    dirs.retain(|d| {
        let fresh = !seen.contains(d);
        seen.push(d.clone());
        fresh
    });
    dirs
}

/// Where an agent makes a fresh private directory when none of its usual ones is usable
/// (`XDG_RUNTIME_DIR` unset and someone else made `/tmp/vramctl-UID`): the Python agent's
/// `_paths.FALLBACK_BASE`.
pub const FALLBACK_BASE: &str = "/tmp";

/// `uid`'s fresh private directories, `/tmp/vramctl-UID.XXXXXXXX` (the agent makes them with
/// `mkdtemp`, mode 0700), in name order. Only real directories (never followed) owned by
/// `uid` or root and writable by neither group nor others count: another user can make
/// look-alike names but never a directory owned by `uid`, so look-alikes are passed over and
/// can neither pose as the agent nor hide it.
///
/// Reading `/tmp`'s names costs in proportion to how many there are, and this runs for every
/// process looked up (`ps`, `serve`'s poll), most of which have no agent: the last listing
/// per uid is kept while `/tmp` is unchanged (same inode and modification time), and only the
/// directories it found are checked again. A listing is kept only once `/tmp` has been
/// unchanged for a second: file times move in clock ticks, and a directory made in the tick
/// of the listing would otherwise stay unseen.
pub fn fallback_dirs(uid: u32) -> Vec<PathBuf> {
    fallback_dirs_at(Path::new(FALLBACK_BASE), uid)
}

/// [`fallback_dirs`] in `base`, with its kept listing.
fn fallback_dirs_at(base: &Path, uid: u32) -> Vec<PathBuf> {
    let Some(stamp) = dir_stamp(base) else {
        return Vec::new();
    };
    let mut cache = match FALLBACK_LISTINGS.lock() {
        Ok(cache) => cache,
        // A panic elsewhere while holding it left a listing that is still a listing.
        Err(poisoned) => poisoned.into_inner(),
    };
    if let Some(listing) = cache
        .iter()
        .find(|l| l.uid == uid && l.stamp == stamp && l.base == base)
    {
        return listing
            .dirs
            .iter()
            .filter(|dir| is_trusted_dir(dir, uid))
            .cloned()
            .collect();
    }
    let dirs = fallback_dirs_in(base, uid);
    let settled = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .is_ok_and(|now| {
            i128::from(stamp.mtime_s) * 1_000_000_000 + i128::from(stamp.mtime_ns)
                < i128::try_from(now.as_nanos()).unwrap_or(i128::MAX) - 1_000_000_000
        });
    cache.retain(|l| l.uid != uid || l.base != base);
    if settled {
        // A few uids at a time are looked up; bound it anyway.
        if cache.len() >= 64 {
            cache.remove(0);
        }
        cache.push(FallbackListing {
            base: base.to_path_buf(),
            uid,
            stamp,
            dirs: dirs.clone(),
        });
    }
    dirs
}

/// A directory's identity and modification time: when equal, no entry was added, removed
/// or renamed in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirStamp {
    dev: u64,
    ino: u64,
    mtime_s: i64,
    mtime_ns: i64,
}

fn dir_stamp(dir: &Path) -> Option<DirStamp> {
    std::fs::metadata(dir).ok().map(|m| DirStamp {
        dev: m.dev(),
        ino: m.ino(),
        mtime_s: m.mtime(),
        mtime_ns: m.mtime_nsec(),
    })
}

/// The fresh private directories [`fallback_dirs`] found for a uid, and when.
struct FallbackListing {
    base: PathBuf,
    uid: u32,
    stamp: DirStamp,
    dirs: Vec<PathBuf>,
}

static FALLBACK_LISTINGS: std::sync::Mutex<Vec<FallbackListing>> =
    std::sync::Mutex::new(Vec::new());

/// [`fallback_dirs`] in `base`.
pub fn fallback_dirs_in(base: &Path, uid: u32) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // The dot keeps uid 10's apart from uid 100's and from the fixed `/tmp/vramctl-UID`.
    let prefix = format!("vramctl-{uid}.");
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().as_bytes().starts_with(prefix.as_bytes()))
        .map(|e| e.path())
        .filter(|dir| is_trusted_dir(dir, uid))
        .collect();
    dirs.sort();
    dirs
}

/// Whether `dir` is a real directory (not followed) owned by `uid` or root that neither its
/// group nor others may write: nobody else can have put a socket in it.
fn is_trusted_dir(dir: &Path, uid: u32) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|m| {
        m.file_type().is_dir() && (m.uid() == uid || m.uid() == 0) && m.mode() & 0o022 == 0
    })
}

/// `XDG_RUNTIME_DIR` of an environment block (`NUL`-separated `NAME=value`), when absolute.
fn xdg_runtime_dir(environ: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    environ
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(b"XDG_RUNTIME_DIR="))
        .map(|v| PathBuf::from(std::ffi::OsStr::from_bytes(v)))
        .filter(|p| p.is_absolute())
}

/// The first socket of `pid` in `dirs` (a socket file, not a link to one).
///
/// # Errors
/// [`AgentError::NoAgent`] when there is none; [`AgentError::NotAllowed`] when a directory
/// that may hold it cannot be searched and nothing was found elsewhere.
pub fn locate_in(pid: u32, dirs: &[PathBuf]) -> Result<PathBuf, AgentError> {
    let mut denied = None;
    for dir in dirs {
        let path = dir.join(socket_name(pid));
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_socket() => return Ok(path),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                denied.get_or_insert(path);
            }
            Err(_) => {}
        }
    }
    match denied {
        Some(path) => Err(AgentError::NotAllowed { pid, path }),
        None => Err(AgentError::NoAgent {
            pid,
            searched: dirs.to_vec(),
        }),
    }
}

/// A connection to one process's agent.
#[derive(Debug)]
pub struct AgentClient {
    pid: u32,
    path: PathBuf,
    conn: Connection,
    timeouts: Timeouts,
    next_id: u64,
}

impl AgentClient {
    /// Finds the agent of `pid` ([`candidate_dirs`]) and connects to it.
    ///
    /// # Errors
    /// See [`AgentError`]; a stale socket is removed and reported as
    /// [`AgentError::Stale`].
    pub fn connect(pid: u32, timeouts: Timeouts) -> Result<Self, AgentError> {
        Self::connect_in(pid, &candidate_dirs(pid), timeouts)
    }

    /// [`connect`](Self::connect), looking only in `dirs`.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub fn connect_in(pid: u32, dirs: &[PathBuf], timeouts: Timeouts) -> Result<Self, AgentError> {
        let path = locate_in(pid, dirs)?;
        Self::connect_at(pid, &path, timeouts)
    }

    /// Connects to the socket at `path`, which must be served by `pid` (when the kernel can
    /// say: the peer is in our PID namespace) and by the owner of `/proc/PID`.
    ///
    /// The connect never waits: an agent whose backlog is full is [`AgentError::Busy`]; a
    /// socket nobody listens on is removed (when it is still the file that refused us).
    ///
    /// # Errors
    /// See [`AgentError`].
    pub fn connect_at(pid: u32, path: &Path, timeouts: Timeouts) -> Result<Self, AgentError> {
        let io = |source: std::io::Error| AgentError::Io {
            pid,
            path: path.to_path_buf(),
            source,
        };
        let (stream, server) = connect_now(path).map_err(|refusal| match refusal {
            ConnectRefusal::NotFound => AgentError::NoAgent {
                pid,
                searched: path.parent().map(Path::to_path_buf).into_iter().collect(),
            },
            ConnectRefusal::Stale { removed } => AgentError::Stale {
                pid,
                path: path.to_path_buf(),
                removed,
            },
            ConnectRefusal::Busy => AgentError::Busy { pid },
            ConnectRefusal::NoPermission => AgentError::NotAllowed {
                pid,
                path: path.to_path_buf(),
            },
            ConnectRefusal::Io(source) => io(source),
        })?;
        let wrong = |reason: String| AgentError::WrongPeer {
            pid,
            path: path.to_path_buf(),
            reason,
        };
        // 0: the server is in a PID namespace we cannot see into; its uid still counts.
        if server.pid != 0 && server.pid != pid {
            return Err(wrong(format!("it is served by process {}", server.pid)));
        }
        let owner = std::fs::metadata(format!("/proc/{pid}"))
            .map(|m| m.uid())
            .unwrap_or_else(|_| euid());
        if server.uid != owner && server.uid != 0 {
            return Err(wrong(format!(
                "it is served by uid {}, the process's owner is uid {owner}",
                server.uid
            )));
        }
        Ok(Self {
            pid,
            path: path.to_path_buf(),
            conn: Connection::new(stream),
            timeouts,
            next_id: 1,
        })
    }

    /// The process asked.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends `{"op": op, "id": N, "protocol": 1, ...fields}` and reads its answer within
    /// `timeout` (the whole exchange). The answer is checked to be protocol 1 and for this
    /// request; an error answer is [`AgentError::Refused`].
    ///
    /// # Errors
    /// See [`AgentError`]. After an error the connection is not to be used again (an
    /// answer may still be on its way): connect anew.
    pub fn request(
        &mut self,
        op: &str,
        fields: Map<String, Value>,
        timeout: Duration,
    ) -> Result<Map<String, Value>, AgentError> {
        let deadline = Instant::now() + timeout;
        let id = self.next_id;
        self.next_id += 1;
        let mut request = fields;
        request.insert("op".into(), Value::from(op));
        request.insert("id".into(), Value::from(id));
        request.insert("protocol".into(), Value::from(PROTOCOL));
        let line = serde_json::to_vec(&request).map_err(|e| AgentError::Request {
            pid: self.pid,
            op: op.to_owned(),
            reason: e.to_string(),
        })?;
        if line.len() + 1 > MAX_REQUEST_BYTES {
            return Err(AgentError::Request {
                pid: self.pid,
                op: op.to_owned(),
                reason: format!(
                    "{} bytes, over the agent's {MAX_REQUEST_BYTES}",
                    line.len() + 1
                ),
            });
        }
        let frame = |e: FrameError, this: &Self| match e {
            FrameError::TimedOut { .. } => AgentError::Timeout {
                pid: this.pid,
                op: op.to_owned(),
                timeout,
            },
            FrameError::Closed => AgentError::Closed {
                pid: this.pid,
                op: op.to_owned(),
            },
            FrameError::Io(e) if e.kind() == std::io::ErrorKind::BrokenPipe => AgentError::Closed {
                pid: this.pid,
                op: op.to_owned(),
            },
            FrameError::Io(source) => AgentError::Io {
                pid: this.pid,
                path: this.path.clone(),
                source,
            },
            other => AgentError::Malformed {
                pid: this.pid,
                op: op.to_owned(),
                reason: other.to_string(),
            },
        };
        if let Err(e) = self.conn.write_line(&line, remaining(deadline)) {
            // The agent may have answered before closing (a refusal of our uid): read it.
            if matches!(&e, FrameError::Io(io) if io.kind() == std::io::ErrorKind::BrokenPipe) {
                if let Ok(answer) = self.read_answer(op, deadline, &frame) {
                    return self.check(op, id, answer);
                }
            }
            return Err(frame(e, self));
        }
        let answer = self.read_answer(op, deadline, &frame)?;
        self.check(op, id, answer)
    }

    fn read_answer(
        &mut self,
        op: &str,
        deadline: Instant,
        frame: &dyn Fn(FrameError, &Self) -> AgentError,
    ) -> Result<Map<String, Value>, AgentError> {
        let line = match self.conn.read_line(MAX_ANSWER_BYTES, remaining(deadline)) {
            Ok(line) => line,
            Err(e) => return Err(frame(e, self)),
        };
        match serde_json::from_slice::<Value>(&line) {
            Ok(Value::Object(answer)) => Ok(answer),
            Ok(other) => Err(self.malformed(op, format!("not a JSON object but {}", kind(&other)))),
            Err(e) => Err(self.malformed(op, format!("not JSON ({e})"))),
        }
    }

    fn check(
        &self,
        op: &str,
        id: u64,
        answer: Map<String, Value>,
    ) -> Result<Map<String, Value>, AgentError> {
        match answer.get("protocol").and_then(Value::as_u64) {
            Some(p) if p == u64::from(PROTOCOL) => {}
            Some(p) => {
                return Err(
                    self.malformed(op, format!("protocol {p}, this vramctl speaks {PROTOCOL}"))
                );
            }
            None => return Err(self.malformed(op, "no 'protocol'".into())),
        }
        let ok = answer
            .get("ok")
            .and_then(Value::as_bool)
            .ok_or_else(|| self.malformed(op, "no boolean 'ok'".into()))?;
        if !ok {
            let error = answer.get("error").and_then(Value::as_object);
            let text = |name: &str| {
                error
                    .and_then(|e| e.get(name))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            return Err(AgentError::Refused {
                pid: self.pid,
                op: op.to_owned(),
                code: text("code").unwrap_or_else(|| "unknown".into()),
                message: text("message").unwrap_or_else(|| "no message".into()),
                retry_after_s: error
                    .and_then(|e| e.get("retry_after_s"))
                    .and_then(Value::as_f64),
            });
        }
        // An answer for another request (a refusal sent before any request has no id).
        if answer.get("id").and_then(Value::as_u64) != Some(id) {
            return Err(self.malformed(
                op,
                format!("it answers request {:?}, not {id}", answer.get("id")),
            ));
        }
        Ok(answer)
    }

    fn malformed(&self, op: &str, reason: String) -> AgentError {
        AgentError::Malformed {
            pid: self.pid,
            op: op.to_owned(),
            reason,
        }
    }

    fn typed<T: serde::de::DeserializeOwned>(
        &mut self,
        op: &str,
        fields: Map<String, Value>,
        timeout: Duration,
    ) -> Result<T, AgentError> {
        let mut answer = self.request(op, fields, timeout)?;
        // The envelope, checked by `request`; not part of what was asked for.
        for key in ["protocol", "ok", "op", "id"] {
            answer.remove(key);
        }
        serde_json::from_value(Value::Object(answer)).map_err(|e| self.malformed(op, e.to_string()))
    }

    /// `hello`: who the process is and what it runs.
    ///
    /// # Errors
    /// See [`AgentError`].
    pub fn hello(&mut self) -> Result<Hello, AgentError> {
        self.typed("hello", Map::new(), self.timeouts.quick)
    }

    /// `stats`: the frameworks' own counters per device.
    ///
    /// # Errors
    /// See [`AgentError`].
    pub fn stats(&mut self) -> Result<Stats, AgentError> {
        self.typed("stats", Map::new(), self.timeouts.quick)
    }

    /// `oom`: the process's first CUDA OOM as its observer recorded it.
    ///
    /// # Errors
    /// See [`AgentError`].
    pub fn oom(&mut self) -> Result<OomAnswer, AgentError> {
        self.typed("oom", Map::new(), self.timeouts.quick)
    }

    /// The OOM's snapshot (a pickle), read over the socket in chunks rather than from the
    /// path the agent names (hostile); at most `cap_bytes`, within `timeout` in all.
    ///
    /// # Errors
    /// See [`AgentError`]; a snapshot over `cap_bytes`, a chunk that is not base64 or not
    /// where it was asked for, or a size that changes, is [`AgentError::Malformed`].
    pub fn oom_snapshot(
        &mut self,
        cap_bytes: u64,
        timeout: Duration,
    ) -> Result<Vec<u8>, AgentError> {
        use base64::Engine as _;
        let deadline = Instant::now() + timeout;
        let mut data: Vec<u8> = Vec::new();
        let mut size: Option<u64> = None;
        loop {
            let mut fields = Map::new();
            fields.insert("offset".into(), Value::from(data.len() as u64));
            let answer: OomChunkAnswer = self.typed("oom", fields, remaining(deadline))?;
            let chunk = answer.chunk;
            if chunk.size_bytes > cap_bytes {
                return Err(self.malformed(
                    "oom",
                    format!(
                        "the snapshot is {} bytes, over {cap_bytes}",
                        chunk.size_bytes
                    ),
                ));
            }
            if chunk.offset != data.len() as u64 || size.is_some_and(|s| s != chunk.size_bytes) {
                return Err(self.malformed("oom", "a chunk not where it was asked for".to_owned()));
            }
            size = Some(chunk.size_bytes);
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(chunk.data_base64.as_bytes())
                .map_err(|e| self.malformed("oom", e.to_string()))?;
            if bytes.is_empty() && !chunk.eof {
                return Err(self.malformed("oom", "an empty chunk before the end".to_owned()));
            }
            data.extend_from_slice(&bytes);
            if data.len() as u64 > chunk.size_bytes {
                return Err(self.malformed("oom", "more bytes than the snapshot's size".to_owned()));
            }
            if chunk.eof {
                return Ok(data);
            }
        }
    }

    /// `reclaim`: `gc.collect()` if asked, then `empty_cache`, with what came back and what
    /// stays pinned.
    ///
    /// # Errors
    /// See [`AgentError`]; `capturing` (a CUDA graph capture underway) is a
    /// [`AgentError::Refused`] with `retry_after_s`.
    pub fn reclaim(&mut self, options: ReclaimOptions) -> Result<ReclaimAnswer, AgentError> {
        let mut fields = Map::new();
        fields.insert("gc".into(), Value::from(options.gc));
        fields.insert("deep".into(), Value::from(options.deep));
        fields.insert("dry_run".into(), Value::from(options.dry_run));
        self.typed("reclaim", fields, self.timeouts.reclaim)
    }

    /// `snapshot`: write `torch.cuda.memory._snapshot()` to `options.path` (created by the
    /// agent with `O_EXCL`, as the process's user), and/or start or stop recording
    /// allocation history; within `timeout` (taking and pickling a long history takes
    /// seconds: `docs/agent.md`).
    ///
    /// # Errors
    /// See [`AgentError`]; the agent's `io_error` (the file exists, the directory is not
    /// writable) and `no_framework` are [`AgentError::Refused`] with that code and, for
    /// `io_error`, the errno's name in `errno`.
    pub fn snapshot(
        &mut self,
        options: &SnapshotOptions,
        timeout: Duration,
    ) -> Result<SnapshotAnswer, AgentError> {
        let mut fields = Map::new();
        if let Some(path) = &options.path {
            fields.insert(
                "path".into(),
                Value::from(path.to_string_lossy().into_owned()),
            );
        }
        match options.record {
            None => {}
            Some(HistoryRecord::Start {
                max_entries,
                all_stacks,
            }) => {
                fields.insert("record".into(), Value::from("start"));
                fields.insert("max_entries".into(), Value::from(max_entries));
                let stacks = if all_stacks { "all" } else { "python" };
                fields.insert("stacks".into(), Value::from(stacks));
            }
            Some(HistoryRecord::Stop) => {
                fields.insert("record".into(), Value::from("stop"));
            }
        }
        self.typed("snapshot", fields, timeout)
    }
}

/// What `snapshot` is asked to do: at least one of the two.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotOptions {
    /// Where the agent writes the snapshot (absolute; the process's view of the file system).
    pub path: Option<PathBuf>,
    /// Start or stop recording allocation history (after the file is written).
    pub record: Option<HistoryRecord>,
}

/// Starting or stopping `torch.cuda.memory._record_memory_history`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryRecord {
    /// Start, keeping at most `max_entries` (1 … 1,000,000) in the ring buffer.
    Start {
        /// The ring buffer's bound.
        max_entries: u32,
        /// C++ frames too (slow, can stall under `torch.compile`).
        all_stacks: bool,
    },
    /// Stop.
    Stop,
}

/// The answer to `snapshot`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotAnswer {
    /// The file written, when a path was asked for.
    pub written: Option<WrittenSnapshot>,
    /// What the agent has started recording (after this request).
    pub history: HistoryState,
}

/// A snapshot file the agent wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WrittenSnapshot {
    /// Its path (the process's view).
    pub path: String,
    /// Its size.
    pub size_bytes: u64,
    /// Segments in it.
    pub segments: u64,
    /// Allocation-history entries in it (0 unless history was recorded).
    pub trace_entries: u64,
    /// Taking it, under the allocator's lock.
    pub snapshot_s: f64,
    /// Pickling and writing it, under the GIL.
    pub write_s: f64,
}

/// Allocation-history recording as the agent started it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryState {
    /// Recording now.
    pub recording: bool,
    /// The ring buffer's bound, while recording.
    pub max_entries: Option<u64>,
    /// `python` or `all`, while recording.
    pub stacks: Option<String>,
    /// Whose recording it is: `request` (a `snapshot` request's) or `observer` (the OOM
    /// observer's own, which requests leave alone); absent from older agents.
    #[serde(default)]
    pub owner: Option<String>,
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What `reclaim` is asked to do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimOptions {
    /// `gc.collect()` first (tensors kept only by reference cycles).
    pub gc: bool,
    /// Also drop what an interactive shell keeps alive (the last exception's traceback and
    /// its frames' locals, IPython's output cache); implies `gc` in the agent.
    pub deep: bool,
    /// Say what would come back, change nothing (`gc` is then not allowed by the agent).
    pub dry_run: bool,
}

/// The answer to `hello` (the fields vramctl uses; the agent sends more).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The agent's version.
    pub agent_version: String,
    /// The PID in the agent's PID namespace.
    pub pid: u32,
    /// Its effective uid.
    pub uid: u32,
    /// Field 22 of its `/proc/self/stat`.
    pub start_time_ticks: Option<u64>,
    /// The interpreter.
    pub python: PythonInfo,
    /// The frameworks imported.
    pub frameworks: Vec<Framework>,
    /// torch's devices.
    pub devices: Vec<AgentDevice>,
    /// `start`, `ipython` or `env`.
    pub started_by: String,
}

/// The interpreter running the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonInfo {
    /// `3.11.7`.
    pub version: String,
    /// `cpython`.
    pub implementation: String,
}

/// A framework the process imported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Framework {
    /// `torch`, `jax`, `tensorflow`.
    pub name: String,
    /// Its version.
    pub version: Option<String>,
    /// Whether its GPU runtime has started.
    pub initialized: bool,
}

/// A device as the framework sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentDevice {
    /// `torch`.
    pub framework: String,
    /// The framework's index (renumbered by `CUDA_VISIBLE_DEVICES`).
    pub index: u32,
    /// Its name.
    pub name: Option<String>,
    /// NVML's UUID without its `GPU-`/`MIG-` prefix (match devices by it, not by index).
    pub uuid: Option<String>,
    /// Its memory.
    pub total_bytes: Option<u64>,
}

/// What a process's OOM observer recorded at its first CUDA OOM (`oom` op, and
/// `<pid>.oom.json` under `vramctl run`: `python/vramctl_agent/_oom.py`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OomRecord {
    /// The process (under `run`: the file's name, not what it says).
    pub pid: u32,
    /// When, Unix ms.
    pub unix_ms: Option<i64>,
    /// The CUDA device ordinal (as the process saw it).
    pub device: Option<i64>,
    /// What the allocator asked the driver for (a segment, or pages): not the request.
    pub segment_bytes: Option<u64>,
    /// The per-process limit where one was set, else the device's total.
    pub allowed_bytes: Option<u64>,
    /// cudaMemGetInfo's free bytes then.
    pub device_free_bytes: Option<u64>,
    /// torch's `total_memory` of the device (cudaMemGetInfo's total).
    pub device_total_bytes: Option<u64>,
    /// The per-process memory fraction, where known.
    pub memory_fraction: Option<f64>,
    /// `PYTORCH_CUDA_ALLOC_CONF`.
    pub alloc_conf: Option<String>,
    /// Limits set outside torch, as the process saw them: `CUDA_VISIBLE_DEVICES`,
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (those set).
    #[serde(default)]
    pub limits_env: std::collections::BTreeMap<String, String>,
    /// `torch.cuda.get_allocator_backend()`.
    pub allocator_backend: Option<String>,
    /// `VRAMCTL_OOM_HISTORY=1` recorded allocation history.
    #[serde(default)]
    pub history_recorded: bool,
    /// OOMs the observer saw in the process (only the first is kept).
    pub ooms: Option<u64>,
    /// The snapshot kept, where the agent kept one.
    pub snapshot: Option<KeptSnapshot>,
    /// Why no snapshot was kept.
    pub snapshot_error: Option<String>,
}

/// Where an OOM snapshot was kept: said, never opened by vramctl (an agent's path is
/// hostile; [`AgentClient::oom_snapshot`] reads the bytes over the socket).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KeptSnapshot {
    /// The agent's file.
    pub path: Option<String>,
    /// Its size.
    pub size_bytes: Option<u64>,
    /// Seconds taking, pickling and writing it took.
    pub taken_s: Option<f64>,
    /// Of those, `torch.cuda.memory._snapshot()`'s (absent from agents before the stages
    /// were timed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_s: Option<f64>,
    /// The pickling's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pickle_s: Option<f64>,
    /// The write's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_s: Option<f64>,
    /// Trace entries kept (the newest 100,000 per device at most).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_entries: Option<u64>,
    /// The oldest entries dropped over that bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_entries_dropped: Option<u64>,
}

/// The answer to `oom` (without `offset`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomAnswer {
    /// The observer is attached (false until the program initializes CUDA).
    pub observer_attached: bool,
    /// The first OOM's record; None before one.
    pub oom: Option<OomRecord>,
}

#[derive(Deserialize)]
struct OomChunk {
    offset: u64,
    size_bytes: u64,
    data_base64: String,
    eof: bool,
}

#[derive(Deserialize)]
struct OomChunkAnswer {
    chunk: OomChunk,
}

/// The answer to `stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Unix seconds.
    pub taken_at: f64,
    /// One entry per device per framework.
    pub devices: Vec<DeviceStats>,
}

impl Stats {
    /// The counters summed over devices (each sum `None` when no device says).
    pub fn memory(&self) -> AgentMemory {
        let sum = |f: fn(&DeviceStats) -> Option<u64>| {
            self.devices
                .iter()
                .filter_map(f)
                .fold(None, |acc: Option<u64>, v| {
                    Some(acc.unwrap_or(0).saturating_add(v))
                })
        };
        AgentMemory {
            allocated_bytes: sum(|d| d.allocated_bytes),
            cached_bytes: sum(|d| d.cached_bytes),
            releasable_bytes: sum(|d| d.releasable_bytes),
        }
    }
}

/// A process's framework memory as its agent says, Σ over its devices: what `ps` shows
/// beside NVML's figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentMemory {
    /// Bytes in live tensors.
    pub allocated_bytes: Option<u64>,
    /// Reserved − allocated: the framework's cache.
    pub cached_bytes: Option<u64>,
    /// What `empty_cache` (`vramctl reclaim`) would return now.
    pub releasable_bytes: Option<u64>,
}

/// How long `ps` waits for one agent's `stats`. An agent answers in microseconds unless
/// it waits for the allocator's lock behind a running `empty_cache` or `cudaMalloc`; round 2
/// measured `empty_cache` at 0.07–0.11 s on an idle H200 (research-round2 §5.3), so 1 s is
/// ~10× that, and a process stuck behind a long kernel costs `ps` at most 1 s.
pub const MEMORY_TIMEOUT: Duration = Duration::from_secs(1);

/// [`Stats::memory`] of `pid`'s agent, or `None` when it has none or it did not answer
/// within `timeout` (logged at debug: `ps` lists the process without these columns).
pub fn memory_of(pid: u32, timeout: Duration) -> Option<AgentMemory> {
    stats_of(pid, timeout).map(|stats| stats.memory())
}

/// `pid`'s agent's `stats` (per device), or `None` as for [`memory_of`].
pub fn stats_of(pid: u32, timeout: Duration) -> Option<Stats> {
    let timeouts = Timeouts {
        quick: timeout,
        reclaim: timeout,
    };
    let asked = AgentClient::connect(pid, timeouts).and_then(|mut c| c.stats());
    match asked {
        Ok(stats) => Some(stats),
        Err(err) => {
            if !err.is_no_agent() {
                tracing::debug!(pid, error = %err, "No answer from an agent.");
            }
            None
        }
    }
}

/// One device's counters (`null`: the framework cannot say).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStats {
    /// `torch`, `jax`, `tensorflow`.
    pub framework: String,
    /// The framework's index.
    pub index: u32,
    /// The UUID without its prefix, where the framework says.
    pub uuid: Option<String>,
    /// Bytes in live tensors.
    pub allocated_bytes: Option<u64>,
    /// Bytes the allocator holds from the driver.
    pub reserved_bytes: Option<u64>,
    /// Reserved − allocated.
    pub cached_bytes: Option<u64>,
    /// What `empty_cache` would return now.
    pub releasable_bytes: Option<u64>,
    /// Free blocks in segments that also hold live blocks (cached, not releasable).
    pub inactive_split_bytes: Option<u64>,
    /// Peak of allocated.
    pub allocated_peak_bytes: Option<u64>,
    /// Peak of reserved.
    pub reserved_peak_bytes: Option<u64>,
    /// Allocations retried after freeing the cache.
    pub alloc_retries: Option<u64>,
    /// Out-of-memory errors raised.
    pub ooms: Option<u64>,
    /// The framework call failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The answer to `reclaim`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReclaimAnswer {
    /// A dry run: nothing changed.
    pub dry_run: bool,
    /// `gc.collect()`'s result, when asked.
    pub gc: Option<GcResult>,
    /// What `deep` dropped, when asked.
    #[serde(default)]
    pub deep: Option<DeepResult>,
    /// Per torch device.
    pub devices: Vec<ReclaimDevice>,
    /// Σ reserved before − after (for a dry run: what would be).
    pub released_bytes: u64,
    /// Σ reserved − allocated before.
    pub cached_before_bytes: u64,
    /// Σ reserved − allocated after.
    pub cached_after_bytes: u64,
    /// Σ free bytes left in segments that could not be returned.
    pub pinned_bytes: u64,
    /// How long `empty_cache` took.
    pub empty_cache_s: Option<f64>,
    /// The whole request.
    pub elapsed_s: f64,
    /// `released_all`, `released_some`, `nothing_released`, `nothing_cached`,
    /// `no_gpu_allocator`.
    pub outcome: String,
    /// Imported frameworks that cannot release memory.
    #[serde(default)]
    pub unsupported: Vec<Unsupported>,
    /// The fields of the answer not named above (kept, so that a report can pass the
    /// agent's answer on whole).
    #[serde(flatten, default)]
    pub extra: Map<String, Value>,
}

/// `gc.collect()`'s result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GcResult {
    /// Unreachable objects found.
    pub collected: u64,
    /// How long it took.
    pub duration_s: f64,
}

/// What `deep` dropped from the interactive shell (`docs/agent.md`, `reclaim`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeepResult {
    /// The process runs an IPython shell (without one only the last exception is dropped).
    pub in_ipython: bool,
    /// One entry per thing dropped.
    #[serde(default)]
    pub dropped: Vec<Dropped>,
}

/// One thing `deep` dropped: `last_exception` or `output_cache`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dropped {
    /// `last_exception`, `output_cache`.
    pub what: String,
    /// The names it cleared (`sys.last_traceback`, `Out`, `_`, `_3`, …).
    #[serde(default)]
    pub names: Vec<String>,
    /// The exception, for `last_exception` (`ZeroDivisionError: division by zero`).
    #[serde(default)]
    pub detail: Option<String>,
    /// Frames whose locals were cleared, for `last_exception`.
    #[serde(default)]
    pub frames_cleared: Option<u64>,
    /// Tensors those frames' locals held, for `last_exception`.
    #[serde(default)]
    pub tensors: Option<u64>,
    /// Their bytes on a GPU (Σ over distinct storages), for `last_exception`.
    #[serde(default)]
    pub tensor_bytes: Option<u64>,
    /// Cached outputs dropped, for `output_cache`.
    #[serde(default)]
    pub entries: Option<u64>,
    /// Why this step failed.
    #[serde(default)]
    pub error: Option<String>,
}

/// A framework that cannot release memory, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unsupported {
    /// Its name.
    pub framework: String,
    /// Why.
    pub reason: String,
}

/// One device of a reclaim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReclaimDevice {
    /// `torch`.
    pub framework: String,
    /// torch's index.
    pub index: u32,
    /// The UUID without its prefix.
    pub uuid: Option<String>,
    /// Reserved before.
    pub reserved_before_bytes: u64,
    /// Reserved after.
    pub reserved_after_bytes: u64,
    /// Allocated before.
    pub allocated_before_bytes: u64,
    /// Allocated after.
    pub allocated_after_bytes: u64,
    /// Reserved before − after.
    pub released_bytes: u64,
    /// Free bytes left in segments that could not be returned.
    pub pinned_bytes: u64,
    /// The segments that stay, most free space first.
    #[serde(default)]
    pub pinned_segments: Vec<PinnedSegment>,
    /// Segments left out of the list.
    #[serde(default)]
    pub pinned_segments_omitted: u64,
    /// The fields of the answer not named above (kept, so that a report can pass the
    /// agent's answer on whole).
    #[serde(flatten, default)]
    pub extra: Map<String, Value>,
}

/// One `cudaMalloc`'d segment that stays because something in it is alive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PinnedSegment {
    /// Device address.
    pub address: u64,
    /// Its size.
    pub total_bytes: u64,
    /// Its live blocks' size.
    pub live_bytes: u64,
    /// The cached bytes it keeps from the driver.
    pub free_bytes: u64,
    /// How many live blocks.
    pub live_blocks: u64,
    /// `live_blocks` or `private_pool`.
    pub reason: String,
    /// Its largest live blocks.
    #[serde(default)]
    pub blocks: Vec<PinnedBlock>,
    /// Blocks left out.
    #[serde(default)]
    pub blocks_omitted: u64,
    /// Whether the blocks carry allocation stacks.
    #[serde(default)]
    pub stacks_recorded: bool,
    /// The fields of the answer not named above (kept, so that a report can pass the
    /// agent's answer on whole).
    #[serde(flatten, default)]
    pub extra: Map<String, Value>,
}

/// A live block in a pinned segment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PinnedBlock {
    /// Device address.
    pub address: u64,
    /// What it holds.
    pub size_bytes: u64,
    /// Its allocation stack, innermost first (empty unless history was recorded).
    #[serde(default)]
    pub frames: Vec<StackFrame>,
    /// The fields of the answer not named above (kept, so that a report can pass the
    /// agent's answer on whole).
    #[serde(flatten, default)]
    pub extra: Map<String, Value>,
}

/// One frame of an allocation stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackFrame {
    /// Source file.
    pub filename: String,
    /// Line.
    pub line: Option<u64>,
    /// Function.
    pub name: String,
}

impl StackFrame {
    /// A Python frame (the one rule the snapshot reader also uses: `.py`, `<stdin>`, …).
    pub fn is_python(&self) -> bool {
        vramctl_snapshot::top::is_python_file(&self.filename)
    }

    /// A Python frame of user code, not inside the torch package.
    pub fn is_user_python(&self) -> bool {
        vramctl_snapshot::top::is_user_python_file(&self.filename)
    }
}

/// The frame that says which line allocated a block: the first (innermost) Python frame of
/// user code, else the first Python frame, else the first frame. A stack recorded with
/// torch's default `_record_memory_history()` starts with C++ frames
/// (`torch::unwind::unwind()` at `??:0`), which name no line of the program (issue 33).
pub fn allocation_site(frames: &[StackFrame]) -> Option<&StackFrame> {
    frames
        .iter()
        .find(|f| f.is_user_python())
        .or_else(|| frames.iter().find(|f| f.is_python()))
        .or_else(|| frames.first())
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

    use super::*;

    /// A real Python process (`python/tests/target.py`) with the stand-in torch on its path
    /// and its own `XDG_RUNTIME_DIR`, steered line by line over stdin.
    struct PyProcess {
        child: Child,
        stdin: ChildStdin,
        stdout: BufReader<ChildStdout>,
        runtime: tempfile::TempDir,
    }

    fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    impl PyProcess {
        fn start() -> Self {
            let runtime = tempfile::tempdir().unwrap();
            let python = repo().join("python");
            let mut child = Command::new("python3")
                .arg(python.join("tests/target.py"))
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .env(
                    "PYTHONPATH",
                    format!(
                        "{}:{}",
                        python.display(),
                        python.join("tests/fakes/torch_pkg").display()
                    ),
                )
                .env("XDG_RUNTIME_DIR", runtime.path())
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("python3 runs");
            let stdin = child.stdin.take().unwrap();
            let stdout = BufReader::new(child.stdout.take().unwrap());
            let mut p = Self {
                child,
                stdin,
                stdout,
                runtime,
            };
            let ready = p.answer();
            assert_eq!(ready["ready"], true, "{ready}");
            p
        }

        fn answer(&mut self) -> Value {
            let mut line = String::new();
            self.stdout.read_line(&mut line).unwrap();
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
        }

        fn exec(&mut self, code: &str, eval: &str) -> Value {
            let line = serde_json::json!({"exec": code, "eval": eval}).to_string();
            writeln!(self.stdin, "{line}").unwrap();
            let answer = self.answer();
            assert_eq!(answer["ok"], true, "{answer}");
            answer["value"].clone()
        }

        /// Starts the agent with `cached` bytes in torch's cache (allocated, then freed).
        fn with_agent(cached: u64) -> Self {
            let mut p = Self::start();
            p.exec(
                &format!("import torch, vramctl_agent\nx = torch.empty({cached}, dtype=torch.uint8, device='cuda')\ndel x"),
                "vramctl_agent.start()",
            );
            p
        }

        fn pid(&self) -> u32 {
            self.child.id()
        }

        fn dir(&self) -> PathBuf {
            self.runtime.path().join("vramctl")
        }
    }

    impl Drop for PyProcess {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    const GIB: u64 = 1 << 30;

    fn quick(ms: u64) -> Timeouts {
        Timeouts {
            quick: Duration::from_millis(ms),
            reclaim: Duration::from_millis(ms),
        }
    }

    #[test]
    fn the_socket_is_found_through_the_process_environment() {
        let p = PyProcess::with_agent(GIB);
        let dirs = candidate_dirs(p.pid());
        assert_eq!(dirs[0], p.dir());
        assert_eq!(
            locate_in(p.pid(), &dirs).unwrap(),
            p.dir().join(socket_name(p.pid()))
        );
    }

    #[test]
    fn a_real_agent_says_hello_stats_and_reclaims_its_cache() {
        let p = PyProcess::with_agent(2 * GIB);
        let mut client = AgentClient::connect(p.pid(), Timeouts::default()).unwrap();
        let hello = client.hello().unwrap();
        assert_eq!(hello.pid, p.pid());
        assert!(
            hello
                .frameworks
                .iter()
                .any(|f| f.name == "torch" && f.initialized)
        );
        let stats = client.stats().unwrap();
        assert_eq!(
            memory_of(p.pid(), MEMORY_TIMEOUT),
            Some(AgentMemory {
                allocated_bytes: Some(0),
                cached_bytes: Some(2 * GIB),
                releasable_bytes: Some(2 * GIB)
            })
        );
        let torch = &stats.devices[0];
        assert_eq!(torch.allocated_bytes, Some(0));
        assert_eq!(torch.cached_bytes, Some(2 * GIB));
        let dry = client
            .reclaim(ReclaimOptions {
                dry_run: true,
                ..ReclaimOptions::default()
            })
            .unwrap();
        assert!(dry.dry_run);
        assert_eq!(dry.released_bytes, 2 * GIB);
        let done = client
            .reclaim(ReclaimOptions {
                gc: true,
                ..ReclaimOptions::default()
            })
            .unwrap();
        assert_eq!(done.released_bytes, 2 * GIB);
        assert_eq!(done.outcome, "released_all");
        assert!(done.gc.is_some());
        let again = client.reclaim(ReclaimOptions::default()).unwrap();
        assert_eq!(
            (again.released_bytes, again.outcome.as_str()),
            (0, "nothing_cached")
        );
    }

    #[test]
    fn a_pinned_segment_is_reported_with_its_live_block() {
        let mut p = PyProcess::with_agent(8 * GIB);
        p.exec(
            "small = torch.empty(4 << 20, dtype=torch.uint8, device='cuda')",
            "None",
        );
        let mut client = AgentClient::connect(p.pid(), Timeouts::default()).unwrap();
        let answer = client.reclaim(ReclaimOptions::default()).unwrap();
        assert_eq!(answer.outcome, "nothing_released");
        let seg = &answer.devices[0].pinned_segments[0];
        assert_eq!((seg.total_bytes, seg.live_bytes), (8 * GIB, 4 << 20));
        assert_eq!(seg.blocks[0].size_bytes, 4 << 20);
        // What the typed answer does not name is kept for the report.
        assert_eq!(seg.extra["segment_type"], "large");
        assert_eq!(seg.blocks[0].extra["state"], "active_allocated");
        assert_eq!(answer.deep, None, "not asked for");
        assert!(!answer.extra.contains_key("protocol"));
    }

    #[test]
    fn a_process_without_an_agent_is_no_agent_with_where_it_looked() {
        let p = PyProcess::start();
        match AgentClient::connect(p.pid(), Timeouts::default()) {
            Err(err @ AgentError::NoAgent { .. }) => {
                assert!(err.is_no_agent());
                assert!(
                    err.to_string().contains(&p.dir().display().to_string()),
                    "{err}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_stale_socket_of_a_dead_process_is_removed_by_the_client() {
        let mut p = PyProcess::with_agent(GIB);
        let (pid, dir) = (p.pid(), p.dir());
        let path = dir.join(socket_name(pid));
        p.child.kill().unwrap();
        p.child.wait().unwrap();
        assert!(path.exists(), "SIGKILL leaves the socket behind");
        match AgentClient::connect_in(pid, std::slice::from_ref(&dir), Timeouts::default()) {
            Err(err @ AgentError::Stale { removed: true, .. }) => assert!(err.is_no_agent()),
            other => panic!("{other:?}"),
        }
        assert!(!path.exists());
        assert!(matches!(
            AgentClient::connect_in(pid, &[dir], Timeouts::default()),
            Err(AgentError::NoAgent { .. })
        ));
    }

    /// A socket in a directory of its own served by this test process (so that its pid is
    /// the one `connect_at` is told), answering each request line with `answer(line)`; `None`
    /// never answers.
    fn fake_agent(answer: fn(&str) -> Option<String>) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(socket_name(std::process::id()));
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    let mut line = String::new();
                    while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                        match answer(&line) {
                            Some(reply) => {
                                let _ = writer.write_all(reply.as_bytes());
                            }
                            None => std::thread::sleep(Duration::from_secs(30)),
                        }
                        line.clear();
                    }
                });
            }
        });
        (dir, path)
    }

    fn id_of(line: &str) -> u64 {
        serde_json::from_str::<Value>(line).unwrap()["id"]
            .as_u64()
            .unwrap()
    }

    fn chunk_answer(line: &str, offset: u64, size: u64, data: &str, eof: bool) -> Option<String> {
        Some(format!(
            "{{\"protocol\": 1, \"ok\": true, \"id\": {}, \"chunk\": {{\"offset\": {offset}, \
             \"size_bytes\": {size}, \"data_base64\": \"{data}\", \"eof\": {eof}}}}}\n",
            id_of(line)
        ))
    }

    fn offset_of(line: &str) -> u64 {
        serde_json::from_str::<Value>(line).unwrap()["offset"]
            .as_u64()
            .unwrap()
    }

    #[test]
    fn an_oom_snapshot_is_read_in_chunks_and_a_lying_agent_is_malformed() {
        // "hello world" in two chunks: "hello " and "world".
        fn honest(l: &str) -> Option<String> {
            match offset_of(l) {
                0 => chunk_answer(l, 0, 11, "aGVsbG8g", false),
                _ => chunk_answer(l, 6, 11, "d29ybGQ=", true),
            }
        }
        // The same first chunk again and again: never where it was asked for.
        fn stuck(l: &str) -> Option<String> {
            chunk_answer(l, 0, 11, "aGVsbG8g", false)
        }
        fn huge(l: &str) -> Option<String> {
            chunk_answer(l, 0, 1 << 40, "aGVsbG8g", false)
        }
        fn too_long(l: &str) -> Option<String> {
            chunk_answer(l, 0, 3, "aGVsbG8g", true)
        }
        fn not_base64(l: &str) -> Option<String> {
            chunk_answer(l, 0, 3, "!!!", true)
        }
        let (_dir, path) = fake_agent(honest);
        let mut client = AgentClient::connect_at(std::process::id(), &path, quick(2000)).unwrap();
        let bytes = client
            .oom_snapshot(1 << 20, Duration::from_secs(5))
            .unwrap();
        assert_eq!(bytes, b"hello world");
        for (answer, needle) in [
            (
                stuck as fn(&str) -> Option<String>,
                "not where it was asked",
            ),
            (huge, "over 1048576"),
            (too_long, "more bytes than"),
            (not_base64, "Invalid"),
        ] {
            let (_dir, path) = fake_agent(answer);
            let mut client =
                AgentClient::connect_at(std::process::id(), &path, quick(2000)).unwrap();
            match client.oom_snapshot(1 << 20, Duration::from_secs(5)) {
                Err(err @ AgentError::Malformed { .. }) => {
                    assert!(err.to_string().contains(needle), "{err} lacks {needle}");
                }
                other => panic!("{needle}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_agent_that_never_answers_costs_the_client_its_deadline() {
        let (_dir, path) = fake_agent(|_| None);
        let mut client = AgentClient::connect_at(std::process::id(), &path, quick(200)).unwrap();
        let started = Instant::now();
        match client.stats() {
            Err(err @ AgentError::Timeout { .. }) => {
                assert!(
                    err.to_string()
                        .contains("did not answer 'stats' within 0.2 s"),
                    "{err}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn an_agent_that_never_ends_its_line_is_cut_at_the_limit() {
        fn endless(_: &str) -> Option<String> {
            Some("x".repeat(MAX_ANSWER_BYTES + 10))
        }
        let (_dir, path) = fake_agent(endless);
        let mut client = AgentClient::connect_at(std::process::id(), &path, quick(5000)).unwrap();
        assert!(matches!(client.hello(), Err(AgentError::Malformed { .. })));
    }

    #[test]
    fn malformed_answers_are_malformed_not_a_panic() {
        fn not_json(_: &str) -> Option<String> {
            Some("{oops\n".into())
        }
        fn not_object(_: &str) -> Option<String> {
            Some("[1]\n".into())
        }
        fn no_protocol(l: &str) -> Option<String> {
            Some(format!("{{\"ok\": true, \"id\": {}}}\n", id_of(l)))
        }
        fn other_protocol(l: &str) -> Option<String> {
            Some(format!(
                "{{\"protocol\": 2, \"ok\": true, \"id\": {}}}\n",
                id_of(l)
            ))
        }
        fn wrong_id(_: &str) -> Option<String> {
            Some("{\"protocol\": 1, \"ok\": true, \"id\": 999}\n".into())
        }
        fn wrong_shape(l: &str) -> Option<String> {
            Some(format!(
                "{{\"protocol\": 1, \"ok\": true, \"id\": {}, \"taken_at\": \"soon\", \"devices\": 3}}\n",
                id_of(l)
            ))
        }
        for (answer, needle) in [
            (not_json as fn(&str) -> Option<String>, "not JSON"),
            (not_object, "not a JSON object"),
            (no_protocol, "no 'protocol'"),
            (other_protocol, "protocol 2"),
            (wrong_id, "not 1"),
            (wrong_shape, "invalid type"),
        ] {
            let (_dir, path) = fake_agent(answer);
            let mut client =
                AgentClient::connect_at(std::process::id(), &path, quick(2000)).unwrap();
            match client.stats() {
                Err(err @ AgentError::Malformed { .. }) => {
                    assert!(err.to_string().contains(needle), "{err} lacks {needle}");
                }
                other => panic!("{needle}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_error_answer_is_refused_with_its_code_and_retry() {
        fn capturing(l: &str) -> Option<String> {
            Some(format!(
                "{{\"protocol\": 1, \"ok\": false, \"op\": \"reclaim\", \"id\": {}, \"error\": {{\"code\": \"capturing\", \"message\": \"a CUDA graph is being captured\", \"retry_after_s\": 1.0}}}}\n",
                id_of(l)
            ))
        }
        let (_dir, path) = fake_agent(capturing);
        let mut client = AgentClient::connect_at(std::process::id(), &path, quick(2000)).unwrap();
        match client.reclaim(ReclaimOptions::default()) {
            Err(err @ AgentError::Refused { .. }) => {
                assert_eq!(err.code(), "capturing");
                assert!(
                    matches!(err, AgentError::Refused { retry_after_s: Some(r), .. } if r == 1.0)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_socket_served_by_another_process_is_not_believed() {
        let (_dir, path) = fake_agent(|_| None);
        // Told it is the agent of our parent: the kernel says we serve it.
        let parent = rustix::process::getppid().map_or(1, |p| p.as_raw_pid().unsigned_abs());
        assert!(matches!(
            AgentClient::connect_at(parent, &path, quick(200)),
            Err(AgentError::WrongPeer { .. })
        ));
    }

    #[test]
    fn a_real_agent_in_a_fresh_private_directory_is_found_by_pid() {
        // Every usual directory unusable (as when XDG_RUNTIME_DIR is unset and someone else
        // made /tmp/vramctl-UID; not done for real here: that directory is shared with
        // whatever else runs as this uid): the agent makes /tmp/vramctl-UID.XXXXXXXX.
        let mut p = PyProcess::start();
        let path = p.exec(
            "import vramctl_agent, vramctl_agent._paths as paths\npaths.candidate_dirs = lambda uid, environ=None: []",
            "vramctl_agent.start()",
        );
        let path = PathBuf::from(path.as_str().expect("a socket path"));
        let dir = path.parent().expect("a directory").to_path_buf();
        assert!(
            dir.to_string_lossy()
                .starts_with(&format!("/tmp/vramctl-{}.", euid())),
            "{}",
            path.display()
        );
        assert!(candidate_dirs(p.pid()).contains(&dir));
        let mut client = AgentClient::connect(p.pid(), quick(5000)).expect("found by pid");
        assert_eq!(client.path(), path);
        assert_eq!(client.hello().expect("hello").pid, p.pid());
        drop(client);
        p.exec("vramctl_agent.stop()", "None");
        assert!(
            !dir.exists(),
            "the agent removes its fresh directory when it stops"
        );
    }

    #[test]
    fn fresh_directories_that_are_not_the_users_own_are_passed_over() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let uid = euid();
        let make = |name: &str, mode: u32| {
            let dir = base.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            dir
        };
        let good = make(&format!("vramctl-{uid}.good0000"), 0o700);
        make(&format!("vramctl-{uid}.open0000"), 0o777);
        make(&format!("vramctl-{uid}.group000"), 0o770);
        make(&format!("vramctl-{uid}0.other000"), 0o700); // uid 10 is not uid 1
        make(&format!("vramctl-{uid}"), 0o700); // the fixed name, listed on its own
        std::os::unix::fs::symlink(&good, base.path().join(format!("vramctl-{uid}.link0000")))
            .unwrap();
        std::fs::write(base.path().join(format!("vramctl-{uid}.file0000")), b"").unwrap();
        let theirs = make(&format!("vramctl-{uid}.aaaa0000"), 0o700);
        if uid == 0 {
            // Owned by another user: root can make one; a look-alike a squatter made.
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            assert_eq!(fallback_dirs_in(base.path(), uid), vec![good]);
        } else {
            eprintln!("not root: the directory of another user is not checked");
            assert_eq!(fallback_dirs_in(base.path(), uid), vec![theirs, good]);
        }
    }

    #[test]
    fn a_kept_listing_of_fresh_directories_is_checked_again_and_renewed_when_tmp_changes() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let uid = euid();
        let set_mode = |dir: &Path, mode: u32| {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let good = base.path().join(format!("vramctl-{uid}.good0000"));
        std::fs::create_dir(&good).unwrap();
        set_mode(&good, 0o700);
        // Unchanged for 10 s: the listing is kept.
        let settled = std::time::SystemTime::now() - Duration::from_secs(10);
        let set_base_time = |when: std::time::SystemTime| {
            std::fs::File::open(base.path())
                .unwrap()
                .set_modified(when)
                .unwrap();
        };
        set_base_time(settled);
        assert_eq!(fallback_dirs_at(base.path(), uid), vec![good.clone()]);
        // Kept, but each directory in it is checked again: opened to others, it is dropped.
        set_mode(&good, 0o777);
        assert_eq!(fallback_dirs_at(base.path(), uid), Vec::<PathBuf>::new());
        set_mode(&good, 0o700);
        assert_eq!(fallback_dirs_at(base.path(), uid), vec![good.clone()]);
        // A directory made since changes the base's time: read again, it is seen.
        let new = base.path().join(format!("vramctl-{uid}.new00000"));
        std::fs::create_dir(&new).unwrap();
        set_mode(&new, 0o700);
        assert_eq!(
            fallback_dirs_at(base.path(), uid),
            vec![good.clone(), new.clone()]
        );
        // (The kept listing is what saves the reading: with the base's time put back, the
        // listing of before is what comes back.)
        set_base_time(settled);
        assert_eq!(fallback_dirs_at(base.path(), uid), vec![good.clone(), new]);
        let third = base.path().join(format!("vramctl-{uid}.third000"));
        std::fs::create_dir(&third).unwrap();
        set_mode(&third, 0o700);
        set_base_time(settled);
        assert!(!fallback_dirs_at(base.path(), uid).contains(&third));
    }

    #[test]
    fn the_runtime_dir_is_read_from_an_environment_block() {
        assert_eq!(
            xdg_runtime_dir(b"A=1\0XDG_RUNTIME_DIR=/run/user/7\0B=2\0"),
            Some(PathBuf::from("/run/user/7"))
        );
        assert_eq!(xdg_runtime_dir(b"XDG_RUNTIME_DIR=relative\0"), None);
        assert_eq!(xdg_runtime_dir(b""), None);
    }

    #[test]
    fn the_allocation_site_skips_cpp_and_torch_frames() {
        let f = |filename: &str, name: &str| StackFrame {
            filename: filename.to_owned(),
            line: Some(1),
            name: name.to_owned(),
        };
        let frames = vec![
            f("??", "torch::unwind::unwind()"),
            f("??", "torch::CapturedTraceback::gather(bool, bool, bool)"),
            f(
                "/usr/lib/python3/site-packages/torch/nn/modules/linear.py",
                "forward",
            ),
            f("train.py", "step"),
        ];
        assert_eq!(
            allocation_site(&frames).map(|s| s.name.as_str()),
            Some("step")
        );
        assert_eq!(
            allocation_site(&frames[..3]).map(|s| s.name.as_str()),
            Some("forward"),
            "only torch's Python: its frame, not C++"
        );
        assert_eq!(
            allocation_site(&frames[..1]).map(|s| s.name.as_str()),
            Some("torch::unwind::unwind()")
        );
        assert!(allocation_site(&[]).is_none());
    }
}
