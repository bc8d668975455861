//! The client's side: ask the first daemon that answers, in the directories of
//! `local_socket::search_dirs` (`$XDG_RUNTIME_DIR/vramctl/`, then `/run/vramctl/`; in each
//! `daemon.sock`, then `containers.sock` for the commands that take a mapped answer), and
//! keep its answer only when it means the same here. Every way of not getting one (no
//! socket, a stale one — removed —, a refusal, a timeout, another boot or PID namespace,
//! another NVML library) is logged at debug level and is otherwise silent: the caller
//! reads NVML itself.

use std::path::{Path, PathBuf};
use std::time::Instant;

use vramctl_agent::local_socket::client::Client;
use vramctl_agent::local_socket::{Reply, search_dirs};
use vramctl_procs::procinfo::{self, PidNamespace};

use super::{
    CLIENT_TIMEOUT, CONTAINERS_SOCKET_FILE, MAX_REPLY_BYTES, PROTOCOL, Request, SERVICE,
    SOCKET_FILE, SampleReply,
};

/// What to ask and what the answer must match.
#[derive(Debug, Clone, Default)]
pub struct AskOptions {
    /// The NVML library the user named (`--nvml-lib`, `VRAMCTL_NVML_LIB`): a daemon that
    /// loaded another one reads other devices (a fake, a container's driver).
    pub nvml_library: Option<PathBuf>,
    /// Ask for `/proc/PID/stat` facts too (`ps`).
    pub process_stat: bool,
    /// Take an answer a host daemon made for this PID namespace (`crate::pid_view`):
    /// `status`, `ps` and `top` (which then asks again for every frame) do.
    pub accept_mapped: bool,
}

/// The first daemon's answer that holds here, or `None` (then read NVML).
pub fn ask(options: &AskOptions) -> Option<SampleReply> {
    let started = Instant::now();
    let deadline = started + CLIENT_TIMEOUT;
    let request = Request::Sample {
        process_stat: options.process_stat,
    };
    // A daemon's own socket first; then, for a command that takes an answer made for its
    // namespace, the one open to every user that only such answers come from.
    let files: &[&str] = if options.accept_mapped {
        &[SOCKET_FILE, CONTAINERS_SOCKET_FILE]
    } else {
        &[SOCKET_FILE]
    };
    let paths = search_dirs()
        .into_iter()
        .flat_map(|dir| files.iter().map(move |file| dir.join(file)));
    for path in paths {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            tracing::debug!(
                timeout_ms = CLIENT_TIMEOUT.as_millis(),
                "No daemon answered in time."
            );
            return None;
        }
        let client = match Client::connect(&path, SERVICE, PROTOCOL..=PROTOCOL, left) {
            Ok(client) => client,
            Err(err) => {
                tracing::debug!(
                    error = %err,
                    timeout_ms = CLIENT_TIMEOUT.as_millis(),
                    "No daemon there."
                );
                continue;
            }
        };
        let server_pid = client.greeting().pid;
        match client.ask::<_, SampleReply>(&request, MAX_REPLY_BYTES) {
            Ok(Reply::Ok(reply)) => match mismatch(&reply, options) {
                None => {
                    tracing::debug!(
                        socket = %path.display(),
                        daemon = reply.daemon,
                        pid = server_pid,
                        ms = started.elapsed().as_secs_f64() * 1e3,
                        "Answered by the daemon."
                    );
                    return Some(reply);
                }
                Some(why) => {
                    tracing::debug!(socket = %path.display(), why, "Not using the daemon's answer.");
                }
            },
            Ok(Reply::Error(error)) => {
                tracing::debug!(socket = %path.display(), error = %error, "The daemon did not answer.");
            }
            Err(err) => {
                tracing::debug!(
                    socket = %path.display(),
                    error = %err,
                    timeout_ms = CLIENT_TIMEOUT.as_millis(),
                    "The daemon did not answer."
                );
            }
        }
    }
    None
}

/// Why `reply` does not mean here what it meant there, if it does not.
fn mismatch(reply: &SampleReply, options: &AskOptions) -> Option<String> {
    if reply.boot_id != procinfo::boot_id() {
        return Some("it runs on another boot or machine".into());
    }
    let ours = PidNamespace::current();
    match &reply.mapped {
        Some(view) => {
            if !options.accept_mapped {
                return Some(
                    "it answered for another PID namespace; this command reads its own".into(),
                );
            }
            if Some(view.pid_namespace) != ours.inode {
                return Some("it answered for a PID namespace that is not ours".into());
            }
            if !ours.proc_is_own() {
                // Our /proc is an outer namespace's: our namespace's PIDs are not its PIDs.
                return Some("our /proc is not our PID namespace's".into());
            }
        }
        None => {
            if reply.pid_namespace != ours.inode {
                return Some("it runs in another PID namespace".into());
            }
        }
    }
    if let Some(wanted) = &options.nvml_library {
        if !same_file(wanted, &reply.nvml_library) {
            return Some(format!(
                "it reads '{}', not '{}'",
                reply.nvml_library.display(),
                wanted.display()
            ));
        }
    }
    None
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}
