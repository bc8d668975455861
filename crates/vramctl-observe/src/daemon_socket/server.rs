//! The daemon's side: `record` and `serve` answer on the socket from a thread of their own.
//!
//! **Why the answer is never stale.** On each request the connection's thread takes the
//! daemon's sampler (a mutex it shares with the sampling loop) and makes one extra tick:
//! every reading in the reply (memory, utilisation, temperature, power, the process lists,
//! MIG memory) is an NVML call made after the request arrived. A regular tick that is
//! running when the request comes is waited for, not used: it started before the request.
//! The other choice, a copy of the loop's last tick, is up to one `--interval` old (10 s
//! for a slow recorder) and would show a process that has just exited. What the extra
//! tick does not read again is what the sampler holds as static facts (name, UUID, bus id,
//! MIG layout: read at its enumeration, read again when the number of GPUs changes or the
//! session is reopened), as a fresh `status` would read them the same.
//!
//! **What it leaves alone.** The extra tick does not read per-process SM activity: the
//! driver hands each sample out once, and the recorder's next tick must still get it. The
//! snapshot goes only to the client — not into the history, the exposition or the live
//! analysis — so the recording keeps its cadence. The loop waits at most one extra tick
//! for the mutex (0.3 ms on an H200 without processes); the /proc facts are gathered after
//! the mutex is released.
//!
//! **/proc facts** come from the catalog of an [`Observer`] of the socket's own (the
//! daemon's sampling loop keeps its own for the history): static facts once per process identity,
//! the identity proved on every request by the pidfds' one `epoll_wait`, and with
//! `process_stat` a fresh `/proc/PID/stat` per process (its refresh interval is 0 here).
//! A daemon that does not read /proc (`serve --process-details nvml|none`) says so and the
//! client reads its own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::live_loop::LiveSampler;
use crate::observation::Observer;
use vramctl_agent::local_socket::server::{Handler, Server, ServiceConfig};
use vramctl_agent::local_socket::{ErrorReply, Greeting, Peer, error_line, ok_line, own_dir};
use vramctl_core::types::Snapshot;
use vramctl_gpu::Backend;
use vramctl_procs::process_catalog::{FactsSource, RefreshPolicy, listed_pids};
use vramctl_procs::procinfo::{self, PidNamespace, ProcessDetails};
use vramctl_procs::signal::PidHandle;

use crate::pid_view::{map_for_namespace, members_of};

use super::{
    CONTAINERS_MIN_INTERVAL, CONTAINERS_SOCKET_FILE, MAX_CONNECTIONS, MAX_REPLY_BYTES,
    MAX_REQUEST_BYTES, PROTOCOL, Request, SERVER_TIMEOUT, SERVICE, SOCKET_FILE, SampleReply,
};

/// A daemon's sampler, shared by its sampling loop and the socket: `None` while NVML is
/// down (not started yet, failing to start, being reopened).
pub type SharedSampler = Arc<Mutex<Option<LiveSampler>>>;

/// Locks `shared`. A thread that panicked while holding it left a sampler that still
/// works (a tick has no invariant a panic could break halfway).
pub fn lock(shared: &SharedSampler) -> MutexGuard<'_, Option<LiveSampler>> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Which daemon answers and what it may read.
#[derive(Debug, Clone)]
pub struct DaemonSettings {
    /// `record` or `serve`.
    pub daemon: &'static str,
    /// Where process facts come from: `Proc` reads /proc; otherwise the reply carries none.
    pub facts: FactsSource,
    /// Also answer on [`CONTAINERS_SOCKET_FILE`], open to every user, for callers in other
    /// PID namespaces only (`--containers-socket`).
    pub containers_socket: bool,
}

/// The listening sockets of a daemon; they stop (and remove their files) when dropped.
#[derive(Debug)]
pub struct DaemonSocket {
    server: Server,
    containers: Option<Server>,
}

impl DaemonSocket {
    /// Starts answering on `own_dir()/daemon.sock` (`/run/vramctl/` for root). `None`, with
    /// the reason logged, when there is no directory for it (a user without
    /// `XDG_RUNTIME_DIR`), another daemon answers there already, or it cannot listen: the
    /// daemon does its work either way, and clients read NVML themselves.
    pub fn start(sampler: SharedSampler, settings: DaemonSettings) -> Option<Self> {
        let Some(dir) = own_dir() else {
            tracing::info!(
                "No XDG_RUNTIME_DIR: not answering status and ps on a local socket (set it, \
                 or VRAMCTL_RUNTIME_DIR, to make them faster)."
            );
            return None;
        };
        let config = ServiceConfig {
            file_name: SOCKET_FILE.into(),
            greeting: Greeting {
                protocol: PROTOCOL,
                service: SERVICE.into(),
                version: env!("CARGO_PKG_VERSION").into(),
                pid: std::process::id(),
            },
            max_request_bytes: MAX_REQUEST_BYTES,
            max_reply_bytes: MAX_REPLY_BYTES,
            timeout: SERVER_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
            open_to_everyone: false,
        };
        let containers_socket = settings.containers_socket;
        let handler = Arc::new(SampleHandler::new(sampler, settings));
        let own = Arc::new(SocketHandler {
            samples: Arc::clone(&handler),
            containers_only: None,
        });
        let server = match Server::start(&dir, config.clone(), own) {
            Ok(server) => server,
            Err(err) => {
                tracing::warn!(error = %err, "Not answering status and ps on a local socket.");
                return None;
            }
        };
        let containers = containers_socket.then(|| {
            let config = ServiceConfig {
                file_name: CONTAINERS_SOCKET_FILE.into(),
                open_to_everyone: true,
                ..config
            };
            let open = Arc::new(SocketHandler {
                samples: handler,
                containers_only: Some(Mutex::new(None)),
            });
            Server::start(&dir, config, open)
                .inspect_err(|err| {
                    tracing::warn!(error = %err, "Not answering containers on a local socket.");
                })
                .ok()
        });
        Some(Self {
            server,
            containers: containers.flatten(),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        self.server.path()
    }

    /// The containers' socket's path, when it listens.
    pub fn containers_path(&self) -> Option<&Path> {
        self.containers.as_ref().map(Server::path)
    }
}

/// One socket's door to the shared [`SampleHandler`].
struct SocketHandler {
    samples: Arc<SampleHandler>,
    /// `Some` on [`CONTAINERS_SOCKET_FILE`]: callers in our PID namespace are refused, and
    /// NVML is read at most once per [`CONTAINERS_MIN_INTERVAL`] for it (the time of the
    /// last read, held while reading so that requests queue).
    containers_only: Option<Mutex<Option<std::time::Instant>>>,
}

/// Answers [`Request::Sample`].
struct SampleHandler {
    sampler: SharedSampler,
    settings: DaemonSettings,
    observer: Mutex<Observer>,
    boot_id: Option<String>,
    pid_namespace: Option<u64>,
    page_size: u64,
}

impl SampleHandler {
    fn new(sampler: SharedSampler, settings: DaemonSettings) -> Self {
        // Every request re-reads /proc/PID/stat when it wants it: a reply is never older
        // than the request, whatever the loop's cadence.
        let policy = RefreshPolicy {
            stat_every_ms: 0,
            ..RefreshPolicy::default()
        };
        // Only the listed processes (no tree), and no agents: the reply carries neither.
        let observer = Observer::builder()
            .facts(settings.facts)
            .refresh(policy)
            .agents(None)
            .ancestors(false)
            .build();
        let boot_id = observer.boot_id().map(str::to_owned);
        Self {
            sampler,
            settings,
            observer: Mutex::new(observer),
            boot_id,
            pid_namespace: PidNamespace::current().inode,
            page_size: procfs::page_size(),
        }
    }

    /// The devices now, with NVML's library path and the driver's names of the listed
    /// PIDs this /proc cannot see.
    fn read(&self) -> Result<(Snapshot, BTreeMap<u32, String>, PathBuf), ErrorReply> {
        let mut slot = lock(&self.sampler);
        let Some(sampler) = slot.as_mut() else {
            return Err(ErrorReply::new(
                "nvml_down",
                "the daemon's NVML session is not up; read NVML yourself",
            ));
        };
        let (snapshot, names) = read_now(sampler);
        Ok((
            snapshot,
            names,
            // Always NVML's here (the daemon's sampler is NVML's); empty would only make a
            // client that named a library read its own.
            sampler
                .backend_mut()
                .library()
                .map(std::path::Path::to_path_buf)
                .unwrap_or_default(),
        ))
    }

    fn sample(&self, process_stat: bool) -> Result<SampleReply, ErrorReply> {
        let (snapshot, driver_names, nvml_library) = self.read()?;
        let processes = (self.settings.facts == FactsSource::Proc)
            .then(|| self.facts(&snapshot, &driver_names, process_stat));
        Ok(SampleReply {
            daemon: self.settings.daemon.into(),
            nvml_library,
            boot_id: self.boot_id.clone(),
            pid_namespace: self.pid_namespace,
            snapshot,
            processes,
            driver_names,
            mapped: None,
        })
    }

    /// The answer for a caller in the PID namespace `caller` (not ours): only that
    /// namespace's processes, under its PIDs, and the rest as one figure per device
    /// (`crate::pid_view`). No /proc facts and no driver's names: the caller reads its own
    /// /proc, and nothing here may name another namespace's process to it.
    fn sample_for(&self, caller: u64) -> Result<SampleReply, ErrorReply> {
        let (mut snapshot, _, nvml_library) = self.read()?;
        let listed = listed_pids(&snapshot);
        let members = members_of(
            &listed,
            caller,
            &mut |pid| procinfo::pid_namespace_of(pid).ok(),
            &mut |pid| procinfo::read_status(pid).ok().map(|s| s.nspid),
        );
        let view = map_for_namespace(&mut snapshot, caller, &members);
        Ok(SampleReply {
            daemon: self.settings.daemon.into(),
            nvml_library,
            boot_id: self.boot_id.clone(),
            pid_namespace: self.pid_namespace,
            snapshot,
            processes: None,
            driver_names: BTreeMap::new(),
            mapped: Some(view),
        })
    }

    /// What the catalog knows about every listed process this /proc can see.
    fn facts(
        &self,
        snapshot: &Snapshot,
        driver_names: &BTreeMap<u32, String>,
        process_stat: bool,
    ) -> Vec<ProcessDetails> {
        let mut observer = self.observer.lock().unwrap_or_else(PoisonError::into_inner);
        let catalog = observer.catalog_mut();
        let listed = listed_pids(snapshot);
        let now = snapshot.monotonic_ms;
        catalog.observe(&listed, now, &mut |pid| driver_names.get(&pid).cloned());
        let mut out = Vec::with_capacity(listed.len());
        for pid in listed {
            let stat = if process_stat {
                catalog.stat(pid, now)
            } else {
                None
            };
            let Some(entry) = catalog.get(pid).filter(|e| e.visible) else {
                continue;
            };
            let Some(command) = entry.facts.command.clone() else {
                continue;
            };
            let facts = &entry.facts;
            out.push(ProcessDetails {
                pid,
                uid: facts.uid,
                user: facts.user.clone(),
                command,
                comm: facts.comm.clone(),
                ppid: stat.map(|s| s.ppid),
                state: stat.map(|s| s.state),
                start_time_ticks: entry.start_time_ticks,
                started_at_unix_ms: facts.started_at_unix_ms,
                cpu_ticks: stat.map(|s| s.cpu_ticks),
                rss_bytes: stat.map(|s| s.rss_pages.saturating_mul(self.page_size)),
                threads: stat.map(|s| s.threads),
                kernel_thread: facts.kernel_thread,
                container: facts.container.clone(),
                slurm: facts.slurm.clone(),
            });
        }
        out
    }
}

impl Handler for SocketHandler {
    fn handle(&self, peer: &Peer, request: &[u8]) -> Vec<u8> {
        let Some(gate) = &self.containers_only else {
            return self.samples.handle(peer, request, false);
        };
        let mut last = gate.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = *last {
            std::thread::sleep(CONTAINERS_MIN_INTERVAL.saturating_sub(at.elapsed()));
        }
        let line = self.samples.handle(peer, request, true);
        *last = Some(std::time::Instant::now());
        line
    }
}

impl SampleHandler {
    /// The reply line to `request`; with `containers_only`, a caller in our own PID
    /// namespace is refused (the full answer is `daemon.sock`'s, behind its modes).
    fn handle(&self, peer: &Peer, request: &[u8], containers_only: bool) -> Vec<u8> {
        let request: Request = match serde_json::from_slice(request) {
            Ok(request) => request,
            Err(e) => {
                return error_line(&ErrorReply::new(
                    "bad_request",
                    format!("not a request this daemon knows: {e}"),
                ));
            }
        };
        let started = std::time::Instant::now();
        let outcome = match request {
            Request::Sample { process_stat } => match caller_of(peer, self.pid_namespace) {
                Ok(Caller::Ours) if containers_only => Err(ErrorReply::new(
                    "refused",
                    format!(
                        "{CONTAINERS_SOCKET_FILE} answers processes in other PID namespaces \
                         (containers) only; ask {SOCKET_FILE} (root or the vramctl group)"
                    ),
                )),
                Ok(Caller::Ours) => self.sample(process_stat),
                Ok(Caller::Other(namespace)) => self.sample_for(namespace),
                Err(error) => Err(error),
            },
        };
        let line = match outcome {
            Ok(reply) => ok_line(&reply).unwrap_or_else(|e| {
                error_line(&ErrorReply::new("internal", format!("cannot encode: {e}")))
            }),
            Err(error) => error_line(&error),
        };
        tracing::debug!(
            uid = peer.uid,
            pid = peer.pid,
            bytes = line.len(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "Answered a local request."
        );
        line
    }
}

/// One extra tick, without per-process activity (which the loop's next tick must still
/// get), and the driver's names of the listed PIDs this /proc cannot see.
fn read_now(sampler: &mut LiveSampler) -> (Snapshot, BTreeMap<u32, String>) {
    let backend = sampler.backend_mut();
    let activity = backend.reads_process_activity();
    backend.set_read_process_activity(false);
    let snapshot = sampler.tick();
    let backend = sampler.backend_mut();
    backend.set_read_process_activity(activity);
    let mut names = BTreeMap::new();
    for pid in listed_pids(&snapshot) {
        if !PathBuf::from(format!("/proc/{pid}")).exists() {
            if let Some(name) = backend.process_name(pid) {
                names.insert(pid, name);
            }
        }
    }
    (snapshot, names)
}

/// Where the caller runs, as the daemon sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// In our PID namespace: the full answer, as it was always given.
    Ours,
    /// In another one, whose inode this is: the answer made for it.
    Other(u64),
}

/// The caller's PID namespace, from its PID as `SO_PEERCRED` gave it (the host's) and the
/// host's `/proc/PID/ns/pid`. What is read must be the caller's own: the process the kernel
/// pinned at `connect` (`SO_PEERPIDFD`, Linux 6.5) must still run after the read, so its PID
/// named it throughout. On older kernels the PID is pinned here, after `connect`, and the
/// uid checked, which leaves a window in which the caller's PID may already name another
/// process of the same user. A caller whose namespace cannot be told gets an error, never
/// the full answer: it could be another container.
fn caller_of(peer: &Peer, own: Option<u64>) -> Result<Caller, ErrorReply> {
    let cannot = |why: String| {
        ErrorReply::new(
            "cannot_map",
            format!("{why}: the daemon cannot tell which processes are yours; read NVML yourself"),
        )
    };
    if peer.pid == 0 {
        return Err(cannot(
            "you run in a PID namespace this daemon cannot see".into(),
        ));
    }
    let pinned_here = if peer.pidfd.is_some() {
        None
    } else {
        Some(
            PidHandle::pin(peer.pid)
                .map_err(|e| cannot(format!("cannot pin your process {}: {e}", peer.pid)))?,
        )
    };
    let namespace = procinfo::pid_namespace_of(peer.pid)
        .map_err(|e| cannot(format!("cannot read your PID namespace: {e}")))?;
    let uid = procinfo::read_status(peer.pid)
        .ok()
        .and_then(|s| s.uid_effective);
    let exited = match (peer.still_running(), &pinned_here) {
        (Some(running), _) => !running,
        (None, Some(handle)) => handle.has_exited(),
        (None, None) => true,
    };
    if exited || uid != Some(peer.uid) {
        return Err(cannot(format!(
            "process {} is no longer the one that connected",
            peer.pid
        )));
    }
    Ok(if own == Some(namespace) {
        Caller::Ours
    } else {
        Caller::Other(namespace)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn we_are_in_our_own_namespace_and_a_peer_we_cannot_see_is_refused() {
        let me = Peer::from_credentials(
            std::process::id(),
            procinfo::read_status(std::process::id())
                .ok()
                .and_then(|s| s.uid_effective)
                .expect("our uid"),
            0,
        );
        let own = PidNamespace::current().inode;
        assert_eq!(caller_of(&me, own), Ok(Caller::Ours));
        assert_eq!(
            caller_of(&me, Some(1)),
            Ok(Caller::Other(own.expect("our namespace is readable")))
        );
        let hidden = Peer {
            pid: 0,
            ..me.clone()
        };
        let error = caller_of(&hidden, own).expect_err("refused");
        assert_eq!(error.code, "cannot_map");
        let impostor = Peer {
            uid: me.uid.wrapping_add(1),
            ..me
        };
        assert_eq!(
            caller_of(&impostor, own).expect_err("refused").code,
            "cannot_map"
        );
    }

    /// A caller that connected and exited is refused, even once its PID names another
    /// process of the same user: the kernel's pidfd of the connected process says it is
    /// gone. (Pinning the PID after `connect` would have pinned the newcomer.)
    #[test]
    fn a_caller_that_exited_is_refused_even_when_its_pid_is_taken_again() {
        use std::io::Write as _;
        use std::os::unix::net::UnixListener;
        use std::process::{Command, Stdio};
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        // A client that connects and waits for its stdin to close.
        let mut client = Command::new("python3")
            .args([
                "-c",
                "import socket, sys\n\
                 s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n\
                 print('connected', flush=True); sys.stdin.read()",
            ])
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let (stream, _) = listener.accept().expect("accept");
        let peer = Peer::of(&stream).expect("peer");
        assert_eq!(peer.pid, client.id());
        if peer.pidfd.is_none() {
            eprintln!("SO_PEERPIDFD unsupported here (kernel before 6.5): nothing to check");
            let _ = client.kill();
            let _ = client.wait();
            return;
        }
        let own = PidNamespace::current().inode;
        assert_eq!(caller_of(&peer, own), Ok(Caller::Ours));
        assert_eq!(peer.still_running(), Some(true));
        let pid = client.id();
        drop(client.stdin.take());
        client.wait().expect("wait");
        assert_eq!(peer.still_running(), Some(false));
        assert_eq!(
            caller_of(&peer, own).expect_err("refused").code,
            "cannot_map"
        );
        // As root, hand the PID to a new process of ours (same uid), as a racing user would.
        let mut newcomer = None;
        for _ in 0..20 {
            if std::fs::OpenOptions::new()
                .write(true)
                .open("/proc/sys/kernel/ns_last_pid")
                .and_then(|mut f| write!(f, "{}", pid - 1))
                .is_err()
            {
                break;
            }
            let child = Command::new("sleep").arg("30").spawn().expect("sleep");
            if child.id() == pid {
                newcomer = Some(child);
                break;
            }
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(mut newcomer) = newcomer {
            assert_eq!(
                caller_of(&peer, own).expect_err("refused").code,
                "cannot_map",
                "the PID now names a newcomer of the same uid"
            );
            let _ = newcomer.kill();
            let _ = newcomer.wait();
        }
        drop(stream);
    }
}
