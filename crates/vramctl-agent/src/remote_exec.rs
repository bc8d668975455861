//! `vramctl reclaim --attach PID`: the agent's `reclaim` run once in a Python 3.14+ process
//! that has no agent, through `sys.remote_exec` (PEP 768), or a clear word on why that is
//! not possible there.
//!
//! How: the process's Python version is read from its files, never by running them
//! ([`elf`]: `Py_Version` in the executable or the mapped libpython; the names of the
//! mapped libpython and standard library, and of the executable, only where there is no
//! such symbol, as before 3.11). The agent's own modules (embedded in the binary, so nothing
//! needs installing) are written under a private package name into a fresh directory the
//! process can read but not change ([`workspace`]), with a bootstrap script and the request;
//! a helper interpreter of the process's `major.minor` — its own executable or `python3.X`
//! on `PATH`, only where root (or the caller) controls the file and every directory on its
//! way ([`helper`]) — runs `sys.remote_exec(PID, script)` with the process's uid and gid,
//! which only writes the script's path into the process's memory; its main thread runs the
//! script at its next safe evaluation point, which writes the answer to a result file in
//! `out/` (a temporary name, renamed). vramctl waits for that file up to a deadline, then
//! removes the directory. There is no way to know when, or whether, the script will run (a
//! main thread inside a long C call runs it when the call returns): a script that runs after
//! the deadline finds its files gone, or, if it started just before, does nothing and says
//! `too_late` to nobody.
//!
//! What root never does here: run a file the process's user can write (its executable, a
//! `"<path> (deleted)"`, a `python3.X` of theirs), run anything with root's credentials
//! for another user's process, or write, follow or remove anything through a name that user
//! can change.
//!
//! What makes it unavailable, each a [`Unavailable`] with one line: not Python, its version
//! unknown or below 3.14, remote debugging disabled in it (`PYTHON_DISABLE_REMOTE_DEBUG`,
//! `-X disable-remote-debug`), another user's process for a caller who is not root, Yama's
//! `ptrace_scope` (1: only root or an ancestor; 2: only root; 3: nobody), another mount
//! namespace (the script's path would not be its), differing real/effective/saved ids (a
//! setuid or setgid program: its own user cannot attach to it), no trusted interpreter of
//! its version here, one without `sys.remote_exec` (built `--without-remote-debug`), or an
//! agent already running in it (then `vramctl reclaim PID` asks that).

pub mod elf;
pub mod helper;
pub mod workspace;

use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use helper::RunAs;
use workspace::{Owner, Workspace};

use crate::agent_client::{self, ReclaimAnswer, ReclaimOptions};

/// The agent's modules `_attach` needs (`_ops` and what it imports), from the package every
/// binary embeds (`agent_package`), so that `--attach` works without the package installed
/// anywhere. `embedded_modules_are_all_that_attach_imports` checks that every relative
/// import of each is in the list.
const ATTACH_MODULES: &[&str] = &[
    "_attach.py",
    "_ops.py",
    "_protocol.py",
    "_frameworks.py",
    "_ipython.py",
    "_torch.py",
    // `_ops` answers the `oom` op from the observer's state (empty in an attached process).
    "_oom.py",
    // `_oom` starts fit's allocator trace where `VRAMCTL_FIT_TRACE` asks (never when attached).
    "_alloc_trace.py",
];

/// The files of [`ATTACH_MODULES`], as `(name, text)`.
fn modules() -> impl Iterator<Item = (&'static str, &'static str)> {
    crate::agent_package::FILES
        .iter()
        .filter(|f| ATTACH_MODULES.contains(&f.name))
        .map(|f| (f.name, f.text))
}

/// `sys.remote_exec` exists from this version on.
pub const MIN_VERSION: (u32, u32) = (3, 14);
/// How long the helper interpreter may take (`sys.remote_exec` returns once it has written
/// the script's path into the process; milliseconds).
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(10);
/// Between two looks for the result file.
const POLL_STEP: Duration = Duration::from_millis(20);
/// The longest result read (the agent keeps its answers under 1 MiB).
const MAX_RESULT_BYTES: u64 = agent_client::MAX_ANSWER_BYTES as u64;
/// The most read of one of the process's /proc files (`maps`, `environ`, `cmdline`).
const MAX_PROC_FILE_BYTES: u64 = 16 << 20;
/// Where a helper interpreter is also looked for, after `PATH`'s directories (a root
/// shell's `PATH` may lack them).
pub const STANDARD_DIRS: &[&str] = &["/usr/local/bin", "/usr/bin", "/bin"];

/// Why `--attach` cannot be used on a process.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unavailable {
    /// Not running here.
    #[error("no process with PID '{pid}' is running here")]
    NoProcess {
        /// The PID.
        pid: u32,
    },
    /// Its executable is not a Python interpreter, nor does it load libpython.
    #[error(
        "process {pid} ('{exe}') is not a Python interpreter; --attach needs Python 3.14 or later"
    )]
    NotPython {
        /// The process.
        pid: u32,
        /// Its executable.
        exe: String,
    },
    /// Python, of a version not told.
    #[error(
        "cannot tell which Python version process {pid} runs ('{exe}'); --attach needs 3.14 or later"
    )]
    VersionUnknown {
        /// The process.
        pid: u32,
        /// Its executable.
        exe: String,
    },
    /// Before 3.14: no `sys.remote_exec`.
    #[error(
        "process {pid} runs Python {major}.{minor}; sys.remote_exec (PEP 768) needs 3.14 or later: start the agent in it instead (vramctl_agent.start() or VRAMCTL_AGENT=1)"
    )]
    TooOld {
        /// The process.
        pid: u32,
        /// Its major version.
        major: u32,
        /// Its minor version.
        minor: u32,
    },
    /// Remote debugging is switched off in it.
    #[error(
        "process {pid} disabled remote execution ({how}); it can only be asked through an agent"
    )]
    Disabled {
        /// The process.
        pid: u32,
        /// `PYTHON_DISABLE_REMOTE_DEBUG` or `-X disable-remote-debug`.
        how: String,
    },
    /// Another user's process, and the caller is not root.
    #[error(
        "process {pid} belongs to uid {target_uid}; only its user or root may attach to it (you are uid {caller_uid})"
    )]
    NotSameUser {
        /// The process.
        pid: u32,
        /// Its uid.
        target_uid: u32,
        /// The caller's effective uid.
        caller_uid: u32,
    },
    /// Yama forbids the attach.
    #[error(
        "kernel.yama.ptrace_scope is {scope}, which {why}; attaching to process {pid} is not allowed"
    )]
    PtraceScope {
        /// The process.
        pid: u32,
        /// The setting.
        scope: u32,
        /// What it allows.
        why: &'static str,
    },
    /// It lives in another mount namespace: the script's path would not be its file.
    #[error(
        "process {pid} is in another mount namespace (a container); --attach works only for processes that share this one's files"
    )]
    OtherMountNamespace {
        /// The process.
        pid: u32,
    },
    /// Its real, effective and saved uids (or gids) differ: the helper runs with its ids,
    /// which the kernel does not let attach to it.
    #[error(
        "process {pid} runs with differing real, effective and saved ids (uids {uids}, gids {gids}), as a setuid or setgid program does; --attach runs as the process's user, which may not attach to it"
    )]
    MixedCredentials {
        /// The process.
        pid: u32,
        /// Its uids, `real/effective/saved`.
        uids: String,
        /// Its gids, `real/effective/saved`.
        gids: String,
    },
    /// No helper interpreter of the right version.
    #[error(
        "no Python {major}.{minor} here to call sys.remote_exec for process {pid} (looked for {looked}); install python{major}.{minor}"
    )]
    NoInterpreter {
        /// The process.
        pid: u32,
        /// Its major version.
        major: u32,
        /// Its minor version.
        minor: u32,
        /// Where it looked.
        looked: String,
    },
    /// The helper has no `sys.remote_exec`.
    #[error(
        "'{interpreter}' has no sys.remote_exec (built --without-remote-debug?); --attach to process {pid} needs one that has"
    )]
    NoRemoteExec {
        /// The process.
        pid: u32,
        /// The helper.
        interpreter: String,
    },
    /// It runs the agent already.
    #[error("process {pid} runs the vramctl agent; ask it without --attach: vramctl reclaim {pid}")]
    HasAgent {
        /// The process.
        pid: u32,
    },
}

impl Unavailable {
    /// A short fixed name for the case, for JSON and scripts.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NoProcess { .. } => "no_process",
            Self::NotPython { .. } => "not_python",
            Self::VersionUnknown { .. } => "version_unknown",
            Self::TooOld { .. } => "too_old",
            Self::Disabled { .. } => "remote_debug_disabled",
            Self::NotSameUser { .. } => "not_same_user",
            Self::PtraceScope { .. } => "ptrace_scope",
            Self::OtherMountNamespace { .. } => "other_mount_namespace",
            Self::MixedCredentials { .. } => "mixed_credentials",
            Self::NoInterpreter { .. } => "no_interpreter",
            Self::NoRemoteExec { .. } => "no_remote_exec",
            Self::HasAgent { .. } => "has_agent",
        }
    }
}

/// Why an attach that was possible did not give an answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttachError {
    /// Not possible on this process.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// The helper interpreter failed (`sys.remote_exec` raised: permissions, a process that
    /// is not what it seemed).
    #[error("'{interpreter} -c sys.remote_exec({pid}, ...)' failed: {message}")]
    Helper {
        /// The process.
        pid: u32,
        /// The helper.
        interpreter: String,
        /// Its last line of stderr, or how it ended.
        message: String,
    },
    /// The script did not answer in time.
    #[error("process {pid} did not run the script within {:.1} s (its main thread has not reached a safe point: a long C call, or it is stopped); it does nothing if it runs later", timeout.as_secs_f64())]
    Timeout {
        /// The process.
        pid: u32,
        /// The deadline it had.
        timeout: Duration,
    },
    /// The script answered with an error (`capturing`, `framework_error`, …).
    #[error("process {pid} refused the reclaim: {message} ({code})")]
    Refused {
        /// The process.
        pid: u32,
        /// The protocol's error code.
        code: String,
        /// Its message.
        message: String,
    },
    /// The result file is not what the script writes.
    #[error("process {pid} gave a malformed answer: {reason}")]
    Malformed {
        /// The process.
        pid: u32,
        /// What is wrong with it.
        reason: String,
    },
    /// The files could not be written.
    #[error("cannot prepare the attach to process {pid} in '{}': {source}", path.display())]
    Io {
        /// The process.
        pid: u32,
        /// Where.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl AttachError {
    /// A short fixed name for the case (the [`Unavailable`] codes, `helper`, `timeout`,
    /// `malformed`, `io`, or the script's own error code).
    pub fn code(&self) -> &str {
        match self {
            Self::Unavailable(u) => u.code(),
            Self::Helper { .. } => "helper",
            Self::Timeout { .. } => "timeout",
            Self::Refused { code, .. } => code,
            Self::Malformed { .. } => "malformed",
            Self::Io { .. } => "io",
        }
    }
}

/// What is known of the target, and of the caller, that decides whether an attach may be
/// tried (gathered by [`Facts::gather`]; judged by [`judge`], a pure function).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The process.
    pub pid: u32,
    /// Its executable (`/proc/PID/exe`), when readable: shown, never run.
    pub exe: Option<PathBuf>,
    /// Its Python `major.minor`, when told by its files (see [`python_version`]).
    pub version: Option<(u32, u32)>,
    /// It looks like Python (`Py_Version` in its executable, libpython mapped, or its
    /// executable's name).
    pub is_python: bool,
    /// `PYTHON_DISABLE_REMOTE_DEBUG` set (non-empty) in its environment, or `-X
    /// disable-remote-debug` on its command line.
    pub disabled_by: Option<String>,
    /// Its uids (real, effective, saved).
    pub target_uids: [u32; 3],
    /// Its gids (real, effective, saved).
    pub target_gids: [u32; 3],
    /// The caller's effective uid.
    pub caller_uid: u32,
    /// `kernel.yama.ptrace_scope` (`None`: no Yama, classic ptrace rules).
    pub ptrace_scope: Option<u32>,
    /// It shares the caller's mount namespace.
    pub same_mount_namespace: bool,
    /// It has an agent socket that answers.
    pub has_agent: bool,
}

/// At most `MAX_PROC_FILE_BYTES` of a /proc file (empty when unreadable).
fn read_proc(path: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(MAX_PROC_FILE_BYTES).read_to_end(&mut bytes);
    }
    bytes
}

/// The three ids after `field` (`Uid:`, `Gid:`) in /proc/PID/status (`u32::MAX` where
/// missing).
fn ids(status: &str, field: &str) -> [u32; 3] {
    let values: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|r| {
            r.split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    [0, 1, 2].map(|i| values.get(i).copied().unwrap_or(u32::MAX))
}

impl Facts {
    /// Reads them from /proc, running nothing.
    ///
    /// # Errors
    /// [`Unavailable::NoProcess`] when `/proc/PID` is not there.
    pub fn gather(pid: u32) -> Result<Self, Unavailable> {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let status = std::fs::read_to_string(proc_dir.join("status"))
            .map_err(|_| Unavailable::NoProcess { pid })?;
        let exe = std::fs::read_link(proc_dir.join("exe")).ok();
        let maps = String::from_utf8_lossy(&read_proc(&proc_dir.join("maps"))).into_owned();
        let (is_python, version) = python_version(&proc_dir, exe.as_deref(), &maps);
        let environ = read_proc(&proc_dir.join("environ"));
        let cmdline = read_proc(&proc_dir.join("cmdline"));
        let disabled_by = disabled_by(&environ, &cmdline);
        let caller_uid = crate::local_socket::euid();
        let ptrace_scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let same_mount_namespace = match (
            std::fs::read_link("/proc/self/ns/mnt"),
            std::fs::read_link(proc_dir.join("ns/mnt")),
        ) {
            (Ok(a), Ok(b)) => a == b,
            _ => true,
        };
        let has_agent = agent_client::AgentClient::connect(
            pid,
            agent_client::Timeouts {
                quick: Duration::from_secs(1),
                reclaim: Duration::from_secs(1),
            },
        )
        .is_ok();
        Ok(Self {
            pid,
            exe,
            version,
            is_python,
            disabled_by,
            target_uids: ids(&status, "Uid:"),
            target_gids: ids(&status, "Gid:"),
            caller_uid,
            ptrace_scope,
            same_mount_namespace,
            has_agent,
        })
    }
}

/// One file-backed line of /proc/PID/maps.
struct Mapping<'a> {
    /// `major:minor` of its device, hexadecimal.
    dev: &'a str,
    inode: u64,
    path: &'a str,
}

fn mappings(maps: &str) -> impl Iterator<Item = Mapping<'_>> {
    maps.lines().filter_map(|line| {
        // `start-end perms offset dev inode path`: the fields hold no '/'.
        let path = &line[line.find('/')?..];
        let mut fields = line.split_whitespace();
        let dev = fields.nth(3)?;
        let inode = fields.next()?.parse().ok()?;
        Some(Mapping { dev, inode, path })
    })
}

/// The file a mapping names, opened for reading only if it is still the very file mapped:
/// opened as a path only (`O_PATH`, which opens no device and follows no final link), its
/// device and inode compared with the mapping's, then reopened through that descriptor.
fn open_mapped(m: &Mapping<'_>) -> Option<std::fs::File> {
    use rustix::fs::{Mode, OFlags};
    if m.path.ends_with(" (deleted)") {
        return None;
    }
    let fd = rustix::fs::open(
        m.path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let stat = rustix::fs::fstat(&fd).ok()?;
    let dev = format!(
        "{:02x}:{:02x}",
        rustix::fs::major(stat.st_dev),
        rustix::fs::minor(stat.st_dev)
    );
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile
        || stat.st_ino != m.inode
        || !m.dev.eq_ignore_ascii_case(&dev)
    {
        return None;
    }
    open_regular(Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())))
}

/// `path` opened for reading, without blocking, only if it is a regular file.
fn open_regular(path: &Path) -> Option<std::fs::File> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let stat = rustix::fs::fstat(&fd).ok()?;
    (rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::RegularFile)
        .then(|| std::fs::File::from(fd))
}

/// Whether the process is Python, and its `major.minor`, read from its files without
/// running anything of it, first found wins:
/// 1. `Py_Version` in its executable (`/proc/PID/exe`: the inode it runs, even deleted);
/// 2. `Py_Version` in a mapped `libpython*` (the mapped inode only);
/// 3. names, for a Python before 3.11, which has no `Py_Version`: the mapped
///    `libpython3.X` soname, the executable's name `python3.X`, a mapped file under a
///    `python3.X/` directory (the standard library's compiled modules).
///
/// What the process's user wrote in these is not trusted for anything but choosing which
/// root-owned helper to try, which then runs with that user's credentials.
pub fn python_version(
    proc_dir: &Path,
    exe: Option<&Path>,
    maps: &str,
) -> (bool, Option<(u32, u32)>) {
    let exe_version = open_regular(&proc_dir.join("exe")).and_then(|f| elf::py_version(&f));
    let libpython: Vec<Mapping<'_>> = mappings(maps)
        .filter(|m| {
            m.path
                .rsplit('/')
                .next()
                .is_some_and(|n| n.starts_with("libpython"))
        })
        .collect();
    let lib_version = || {
        let mut seen = std::collections::HashSet::new();
        libpython
            .iter()
            .filter(|m| seen.insert((m.dev, m.inode)))
            .find_map(|m| open_mapped(m).and_then(|f| elf::py_version(&f)))
    };
    let elf_version = exe_version.or_else(lib_version).map(|v| v.major_minor());
    let exe_name = exe
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let soname_version = || {
        libpython
            .iter()
            .find_map(|m| version_in(m.path.rsplit('/').next()?.strip_prefix("libpython")?))
    };
    let stdlib_version = || {
        mappings(maps).find_map(|m| {
            m.path.split('/').find_map(|part| {
                version_in(part.strip_prefix("python")?).filter(|_| {
                    // `python3.11`, `python3.11t`: a directory, not `python3.11-config`.
                    part.trim_start_matches("python")
                        .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.')
                        .trim_end_matches('t')
                        .is_empty()
                })
            })
        })
    };
    let version = elf_version
        .or_else(soname_version)
        .or_else(|| exe_name.strip_prefix("python").and_then(version_in))
        .or_else(stdlib_version);
    let is_python =
        elf_version.is_some() || !libpython.is_empty() || exe_name.starts_with("python");
    (is_python, version)
}

/// `3.14` (and what follows: `3.14.so.1.0`, `3.14t`) at the start of `text`.
fn version_in(text: &str) -> Option<(u32, u32)> {
    let (major, rest) = text.split_once('.')?;
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// How remote debugging was switched off, if it was: the documented environment variable
/// (any non-empty value) or the `-X` option.
fn disabled_by(environ: &[u8], cmdline: &[u8]) -> Option<String> {
    let env = environ.split(|&b| b == 0).any(|e| {
        e.strip_prefix(b"PYTHON_DISABLE_REMOTE_DEBUG=")
            .is_some_and(|v| !v.is_empty())
    });
    if env {
        return Some("PYTHON_DISABLE_REMOTE_DEBUG is set in its environment".into());
    }
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let xopt = args
        .windows(2)
        .any(|w| w[0] == b"-X" && w[1] == b"disable-remote-debug")
        || args.iter().any(|a| *a == b"-Xdisable-remote-debug");
    xopt.then(|| "it was started with -X disable-remote-debug".into())
}

/// Whether an attach may be tried, from `facts` alone: the first reason that forbids it.
///
/// # Errors
/// The [`Unavailable`] case, in the order a user fixes them: what the process is, what it
/// allows, what the caller may do, what this machine lacks (the interpreter is looked for
/// afterwards, by [`find_interpreter`]).
pub fn judge(facts: &Facts) -> Result<(u32, u32), Unavailable> {
    let pid = facts.pid;
    let exe = facts
        .exe
        .as_ref()
        .map_or_else(|| "unknown".to_owned(), |e| e.display().to_string());
    if facts.has_agent {
        return Err(Unavailable::HasAgent { pid });
    }
    if !facts.is_python {
        return Err(Unavailable::NotPython { pid, exe });
    }
    let Some((major, minor)) = facts.version else {
        return Err(Unavailable::VersionUnknown { pid, exe });
    };
    if (major, minor) < MIN_VERSION {
        return Err(Unavailable::TooOld { pid, major, minor });
    }
    if let Some(how) = &facts.disabled_by {
        return Err(Unavailable::Disabled {
            pid,
            how: how.clone(),
        });
    }
    let root = facts.caller_uid == 0;
    if !root && facts.target_uids.iter().any(|&u| u != facts.caller_uid) {
        return Err(Unavailable::NotSameUser {
            pid,
            target_uid: facts.target_uids[1],
            caller_uid: facts.caller_uid,
        });
    }
    let consistent = |ids: &[u32; 3]| ids.iter().all(|&i| i == ids[0]);
    if !consistent(&facts.target_uids) || !consistent(&facts.target_gids) {
        let show = |ids: &[u32; 3]| format!("{}/{}/{}", ids[0], ids[1], ids[2]);
        return Err(Unavailable::MixedCredentials {
            pid,
            uids: show(&facts.target_uids),
            gids: show(&facts.target_gids),
        });
    }
    // The helper runs with the process's uid and gid, so it holds CAP_SYS_PTRACE only for
    // a process of root's; and it is never the process's ancestor (it is vramctl's child).
    let helper_is_root = root && facts.target_uids[0] == 0;
    let scope = |scope, why| Err(Unavailable::PtraceScope { pid, scope, why });
    match facts.ptrace_scope {
        Some(s @ 3..) => return scope(s, "forbids every attach until reboot"),
        Some(2) if !helper_is_root => {
            return scope(
                2,
                "lets only root attach, and --attach runs as the process's user",
            );
        }
        Some(1) if !helper_is_root => {
            return scope(
                1,
                "lets a process attach only to its descendants, and --attach runs as the process's user beside it (set it to 0, or start the agent in the process)",
            );
        }
        _ => {}
    }
    if !facts.same_mount_namespace {
        return Err(Unavailable::OtherMountNamespace { pid });
    }
    Ok((major, minor))
}

/// `(major, minor)` of `interpreter` and whether it has `sys.remote_exec`, asked with
/// `run_as`'s credentials, or `None` when it does not run as Python within
/// [`HELPER_TIMEOUT`].
fn interpreter_version(interpreter: &Path, run_as: Option<RunAs>) -> Option<((u32, u32), bool)> {
    let out = helper::run_bounded(
        helper::command(interpreter, run_as).args([
            "-I",
            "-S",
            "-c",
            "import sys; print(sys.version_info[0], sys.version_info[1], hasattr(sys, 'remote_exec'))",
        ]),
        HELPER_TIMEOUT,
    )
    .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    let major = words.next()?.parse().ok()?;
    let minor = words.next()?.parse().ok()?;
    Some(((major, minor), words.next() == Some("True")))
}

/// The helper interpreter: the first of the process's executable (where it is a `python*`
/// binary: the very build it runs, for an install not on `PATH`) and `python{major}.{minor}`
/// in `search` (`PATH`'s directories, then [`STANDARD_DIRS`]) that root (or the caller)
/// controls all the way ([`helper::trusted_executable`]: never a `"<path> (deleted)"`, never
/// a file its user can write) and that, run with `run_as`'s credentials, says it is that
/// version with `sys.remote_exec`.
///
/// # Errors
/// [`Unavailable::NoInterpreter`] (with the first candidate not trusted, and why),
/// [`Unavailable::NoRemoteExec`].
pub fn find_interpreter(
    facts: &Facts,
    version: (u32, u32),
    search: &[PathBuf],
    run_as: Option<RunAs>,
) -> Result<PathBuf, Unavailable> {
    let name = format!("python{}.{}", version.0, version.1);
    let mut without = None;
    let mut untrusted = Vec::new();
    let mut tried = std::collections::HashSet::new();
    let own = facts.exe.iter().filter(|e| {
        e.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("python"))
    });
    for candidate in own.cloned().chain(search.iter().map(|d| d.join(&name))) {
        if !tried.insert(candidate.clone()) || std::fs::symlink_metadata(&candidate).is_err() {
            continue;
        }
        let resolved = match helper::trusted_executable(&candidate, facts.caller_uid) {
            Ok(resolved) => resolved,
            Err(why) => {
                untrusted.push(format!("'{}' ({why})", candidate.display()));
                continue;
            }
        };
        match interpreter_version(&resolved, run_as) {
            Some((v, true)) if v == version => return Ok(resolved),
            Some((v, false)) if v == version => {
                without.get_or_insert(resolved);
            }
            _ => {}
        }
    }
    if let Some(interpreter) = without {
        return Err(Unavailable::NoRemoteExec {
            pid: facts.pid,
            interpreter: interpreter.display().to_string(),
        });
    }
    let mut looked = format!(
        "its executable, {name} on PATH and in {}",
        STANDARD_DIRS.join(", ")
    );
    if let Some(first) = untrusted.first() {
        looked.push_str(&format!(
            "; not run, as {} does not control it: {first}",
            if facts.caller_uid == 0 {
                "root"
            } else {
                "neither root nor you"
            }
        ));
        if untrusted.len() > 1 {
            looked.push_str(&format!(" and {} more", untrusted.len() - 1));
        }
    }
    Err(Unavailable::NoInterpreter {
        pid: facts.pid,
        major: version.0,
        minor: version.1,
        looked,
    })
}

/// `PATH`'s absolute directories, then [`STANDARD_DIRS`].
pub fn path_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .filter(|d| d.is_absolute())
                .collect()
        })
        .unwrap_or_default();
    dirs.extend(STANDARD_DIRS.iter().map(PathBuf::from));
    dirs
}

/// A process an attach may be tried on, and the interpreter that will do it.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The process.
    pub pid: u32,
    /// Its Python `major.minor`.
    pub version: (u32, u32),
    /// The helper interpreter (resolved: no symbolic link left).
    pub interpreter: PathBuf,
    /// Its uid and gid: the files are made readable by its group, `out/` its.
    owner: Owner,
    /// The helper's credentials when the caller is root: the process's.
    run_as: Option<RunAs>,
}

/// Whether `pid` can be attached to, and with what.
///
/// # Errors
/// Why not ([`Unavailable`]).
pub fn plan(pid: u32) -> Result<Plan, Unavailable> {
    let facts = Facts::gather(pid)?;
    let version = judge(&facts)?;
    let owner = Owner {
        uid: facts.target_uids[0],
        gid: facts.target_gids[0],
    };
    let run_as = (facts.caller_uid == 0).then_some(RunAs {
        uid: owner.uid,
        gid: owner.gid,
    });
    let interpreter = find_interpreter(&facts, version, &path_dirs(), run_as)?;
    Ok(Plan {
        pid,
        version,
        interpreter,
        owner,
        run_as,
    })
}

/// Where the workspace is made: the caller's temporary directory for its own process, else
/// `/tmp` (a root caller's `TMPDIR` may be private to it).
fn workspace_base(plan: &Plan) -> PathBuf {
    if crate::local_socket::euid() == plan.owner.uid {
        std::env::temp_dir()
    } else {
        PathBuf::from("/tmp")
    }
}

/// The request the script reads.
fn request_text(workspace: &Workspace, options: ReclaimOptions, deadline_unix_s: f64) -> String {
    serde_json::json!({
        "gc": options.gc,
        "deep": options.deep,
        "dry_run": options.dry_run,
        "result": workspace.result().display().to_string(),
        "deadline": deadline_unix_s,
    })
    .to_string()
}

/// The script the process runs: everything inside one function whose name is removed
/// afterwards, the package imported from the workspace and forgotten again (`sys.path`,
/// `sys.path_importer_cache`, `sys.modules`), every failure reported in the result file
/// (in `out/`, the only place the process may write) rather than raised into the process's
/// main thread. vramctl removes the workspace itself.
fn bootstrap(root: &Path, package: &str) -> String {
    let root = serde_json::to_string(&root.display().to_string()).unwrap_or_default();
    let package = serde_json::to_string(package).unwrap_or_default();
    format!(
        r#"def _vramctl_attach():
    import importlib, json, os, sys
    root, package = {root}, {package}
    request = os.path.join(root, "request.json")
    sys.path.insert(0, root)
    try:
        importlib.import_module(package + "._attach").run(request)
    except BaseException as err:
        try:
            out = os.path.join(root, "out")
            tmp = os.path.join(out, "result.json.%d.tmp" % os.getpid())
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({{"ok": False, "pid": os.getpid(), "error": {{"code": "attach_error", "message": type(err).__name__ + ": " + str(err)[:300]}}}}, f)
            os.replace(tmp, os.path.join(out, "result.json"))
        except OSError:
            pass
    finally:
        try:
            sys.path.remove(root)
        except ValueError:
            pass
        for path in (root, os.path.join(root, package)):
            sys.path_importer_cache.pop(path, None)
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]
try:
    _vramctl_attach()
finally:
    del _vramctl_attach
"#
    )
}

/// Runs the reclaim in the process of `plan` and waits for its answer up to `timeout`.
///
/// # Errors
/// See [`AttachError`].
pub fn reclaim(
    plan: &Plan,
    options: ReclaimOptions,
    timeout: Duration,
) -> Result<ReclaimAnswer, AttachError> {
    let pid = plan.pid;
    let base = workspace_base(plan);
    let workspace =
        Workspace::create(&base, pid, plan.owner, modules()).map_err(|source| AttachError::Io {
            pid,
            path: base.clone(),
            source,
        })?;
    let deadline = Instant::now() + timeout;
    let deadline_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
        + timeout.as_secs_f64();
    let result = workspace
        .write_request(
            &request_text(&workspace, options, deadline_unix_s),
            &bootstrap(&workspace.root, &workspace.package),
        )
        .map_err(|source| AttachError::Io {
            pid,
            path: workspace.root.clone(),
            source,
        })
        .and_then(|script| deliver(plan, &script))
        .and_then(|()| wait_for(&workspace, pid, deadline, timeout));
    // Also after a timeout: a script that runs later finds no file (the process's Python
    // says "Can't open debugger script" on its stderr) or, if it opened it just before,
    // sees its deadline passed and does nothing.
    workspace.remove();
    result
}

/// `python3.X -c 'import sys; sys.remote_exec(PID, script)'`, with the process's
/// credentials when the caller is root.
fn deliver(plan: &Plan, script: &Path) -> Result<(), AttachError> {
    let code = format!(
        "import sys; sys.remote_exec({}, {})",
        plan.pid,
        serde_json::to_string(&script.display().to_string()).unwrap_or_default()
    );
    let helper = |message: String| AttachError::Helper {
        pid: plan.pid,
        interpreter: plan.interpreter.display().to_string(),
        message,
    };
    let out = helper::run_bounded(
        helper::command(&plan.interpreter, plan.run_as).args(["-I", "-S", "-c", &code]),
        HELPER_TIMEOUT,
    )
    .map_err(|e| helper(e.to_string()))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(helper(
        stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map_or_else(|| out.status.to_string(), |l| l.trim().to_owned()),
    ))
}

/// Waits for the result file and reads it ([`Workspace::read_result`]: no link followed,
/// only the process's user's own file, bounded).
fn wait_for(
    workspace: &Workspace,
    pid: u32,
    deadline: Instant,
    timeout: Duration,
) -> Result<ReclaimAnswer, AttachError> {
    loop {
        match workspace.read_result(MAX_RESULT_BYTES) {
            Ok(Some(text)) => return parse_result(&text, pid),
            Ok(None) => {}
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(AttachError::Malformed {
                    pid,
                    reason: format!("'{}': {e}", workspace.result().display()),
                });
            }
            Err(source) => {
                return Err(AttachError::Io {
                    pid,
                    path: workspace.result(),
                    source,
                });
            }
        }
        if Instant::now() >= deadline {
            return Err(AttachError::Timeout { pid, timeout });
        }
        std::thread::sleep(POLL_STEP);
    }
}

fn parse_result(text: &[u8], pid: u32) -> Result<ReclaimAnswer, AttachError> {
    let malformed = |reason: String| AttachError::Malformed { pid, reason };
    let body: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| malformed(format!("not JSON ({e})")))?;
    if body.get("pid").and_then(serde_json::Value::as_u64) != Some(u64::from(pid)) {
        // The script reports the PID that ran it (in its namespace); ours is the same here.
        return Err(malformed(format!(
            "written by process {:?}",
            body.get("pid")
        )));
    }
    match body.get("ok").and_then(serde_json::Value::as_bool) {
        Some(true) => serde_json::from_value(body.get("answer").cloned().unwrap_or_default())
            .map_err(|e| malformed(e.to_string())),
        Some(false) => {
            let text = |name: &str| {
                body.get("error")
                    .and_then(|e| e.get(name))
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("unknown")
                    .to_owned()
            };
            Err(AttachError::Refused {
                pid,
                code: text("code"),
                message: text("message"),
            })
        }
        None => Err(malformed("no boolean 'ok'".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::process::{Command, Stdio};

    fn facts() -> Facts {
        Facts {
            pid: 4242,
            exe: Some(PathBuf::from("/usr/bin/python3.14")),
            version: Some((3, 14)),
            is_python: true,
            disabled_by: None,
            target_uids: [1000; 3],
            target_gids: [1000; 3],
            caller_uid: 1000,
            ptrace_scope: Some(0),
            same_mount_namespace: true,
            has_agent: false,
        }
    }

    #[test]
    fn a_python_3_14_process_of_the_same_user_may_be_attached() {
        assert_eq!(judge(&facts()), Ok((3, 14)));
        assert_eq!(
            judge(&Facts {
                ptrace_scope: None,
                ..facts()
            }),
            Ok((3, 14))
        );
        assert_eq!(
            judge(&Facts {
                version: Some((3, 15)),
                ..facts()
            }),
            Ok((3, 15))
        );
    }

    #[test]
    fn every_reason_an_attach_is_not_available_is_named() {
        let root = |f: Facts| Facts { caller_uid: 0, ..f };
        for (f, code, needle) in [
            (
                Facts {
                    has_agent: true,
                    ..facts()
                },
                "has_agent",
                "vramctl reclaim 4242",
            ),
            (
                Facts {
                    is_python: false,
                    version: None,
                    exe: Some("/usr/bin/sleep".into()),
                    ..facts()
                },
                "not_python",
                "('/usr/bin/sleep') is not a Python interpreter",
            ),
            (
                Facts {
                    version: None,
                    ..facts()
                },
                "version_unknown",
                "cannot tell",
            ),
            (
                Facts {
                    version: Some((3, 13)),
                    ..facts()
                },
                "too_old",
                "runs Python 3.13; sys.remote_exec (PEP 768) needs 3.14",
            ),
            (
                Facts {
                    disabled_by: Some(
                        "PYTHON_DISABLE_REMOTE_DEBUG is set in its environment".into(),
                    ),
                    ..facts()
                },
                "remote_debug_disabled",
                "PYTHON_DISABLE_REMOTE_DEBUG",
            ),
            (
                Facts {
                    target_uids: [1001; 3],
                    ..facts()
                },
                "not_same_user",
                "belongs to uid 1001",
            ),
            // A setuid process: its saved uid differs.
            (
                Facts {
                    target_uids: [1000, 1000, 0],
                    ..facts()
                },
                "not_same_user",
                "only its user or root",
            ),
            (
                Facts {
                    ptrace_scope: Some(1),
                    ..facts()
                },
                "ptrace_scope",
                "ptrace_scope is 1, which lets a process attach only to its descendants",
            ),
            (
                Facts {
                    ptrace_scope: Some(2),
                    ..facts()
                },
                "ptrace_scope",
                "lets only root",
            ),
            (
                root(Facts {
                    ptrace_scope: Some(3),
                    ..facts()
                }),
                "ptrace_scope",
                "forbids every attach",
            ),
            (
                Facts {
                    same_mount_namespace: false,
                    ..facts()
                },
                "other_mount_namespace",
                "another mount namespace",
            ),
        ] {
            let err = judge(&f).expect_err(code);
            assert_eq!(err.code(), code, "{err}");
            assert!(err.to_string().contains(needle), "{err} lacks {needle}");
        }
        // Root may attach to another user's process where Yama lets that user's helper
        // attach, and to its own processes under scopes 1 and 2; nobody else there (the
        // helper runs as the process's user, and is not its ancestor).
        assert!(
            judge(&root(Facts {
                target_uids: [1001; 3],
                ..facts()
            }))
            .is_ok()
        );
        for scope in [1, 2] {
            let err = judge(&root(Facts {
                target_uids: [1001; 3],
                ptrace_scope: Some(scope),
                ..facts()
            }))
            .expect_err("the helper runs as uid 1001");
            assert_eq!(err.code(), "ptrace_scope", "{err}");
            assert!(
                err.to_string().contains("runs as the process's user"),
                "{err}"
            );
            assert!(
                judge(&root(Facts {
                    target_uids: [0; 3],
                    target_gids: [0; 3],
                    ptrace_scope: Some(scope),
                    ..facts()
                }))
                .is_ok()
            );
        }
    }

    #[test]
    fn a_process_with_differing_ids_is_not_attached_even_by_root() {
        for (uids, gids) in [([1000, 0, 0], [1000; 3]), ([1000; 3], [1000, 1000, 50])] {
            let err = judge(&Facts {
                caller_uid: 0,
                target_uids: uids,
                target_gids: gids,
                ..facts()
            })
            .expect_err("mixed");
            assert_eq!(err.code(), "mixed_credentials", "{err}");
            assert!(err.to_string().contains("setuid or setgid"), "{err}");
        }
    }

    #[test]
    fn remote_debugging_is_disabled_by_the_variable_or_the_x_option() {
        assert!(disabled_by(b"A=1\0PYTHON_DISABLE_REMOTE_DEBUG=1\0", b"").is_some());
        assert!(
            disabled_by(b"PYTHON_DISABLE_REMOTE_DEBUG=\0", b"").is_none(),
            "empty is unset"
        );
        assert!(disabled_by(b"", b"python3.14\0-X\0disable-remote-debug\0train.py\0").is_some());
        assert!(disabled_by(b"", b"python3.14\0-Xdisable-remote-debug\0").is_some());
        assert!(disabled_by(b"", b"python3.14\0train.py\0-X\0").is_none());
    }

    #[test]
    fn versions_are_read_from_executable_and_library_names() {
        assert_eq!(version_in("3.14"), Some((3, 14)));
        assert_eq!(version_in("3.14t"), Some((3, 14)));
        assert_eq!(version_in("3.11.so.1.0"), Some((3, 11)));
        assert_eq!(version_in(""), None);
        assert_eq!(version_in("3"), None);
    }

    #[test]
    fn a_process_that_is_not_python_is_not_attachable() {
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep runs");
        let err = plan(child.id()).expect_err("sleep is not Python");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(err.code(), "not_python", "{err}");
    }

    #[test]
    fn a_python_before_3_14_is_too_old_with_its_version() {
        use std::io::BufRead;
        let mut child = Command::new("python3")
            .args([
                "-c",
                "import time; print('ready', flush=True); time.sleep(30)",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        // Past any launcher (a pyenv shim execs the interpreter through env).
        let mut ready = String::new();
        std::io::BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut ready)
            .expect("ready");
        let facts = Facts::gather(child.id()).expect("running");
        let version = python3_version();
        let err = plan(child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(facts.version, Some(version), "{facts:?}");
        if version < MIN_VERSION {
            let err = err.expect_err("too old");
            assert_eq!(err.code(), "too_old", "{err}");
            assert!(
                err.to_string()
                    .contains(&format!("Python {}.{}", version.0, version.1)),
                "{err}"
            );
        }
    }

    /// This machine's `python3`'s `major.minor` (asked in the test only).
    fn python3_version() -> (u32, u32) {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(*sys.version_info[:2])"])
            .output()
            .expect("python3 runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut words = text
            .split_whitespace()
            .map(|w| w.parse().expect("a number"));
        (words.next().expect("major"), words.next().expect("minor"))
    }

    #[test]
    fn no_interpreter_of_the_version_is_said_with_where_it_looked() {
        let empty = tempfile::tempdir().expect("tempdir");
        let err = find_interpreter(&facts(), (3, 14), &[empty.path().to_path_buf()], None)
            .expect_err("none");
        assert_eq!(err.code(), "no_interpreter");
        assert!(err.to_string().contains("install python3.14"), "{err}");
        // One of the right version without sys.remote_exec: this machine's python3.X, which
        // before 3.14 has none.
        let version = python3_version();
        let name = format!("python{}.{}", version.0, version.1);
        let me = crate::local_socket::euid();
        let trusted = path_dirs()
            .into_iter()
            .map(|d| d.join(&name))
            .any(|p| p.exists() && helper::trusted_executable(&p, me).is_ok());
        let found = find_interpreter(
            &Facts {
                caller_uid: me,
                ..facts()
            },
            version,
            &path_dirs(),
            None,
        );
        if !trusted {
            eprintln!("SKIPPED: no trusted {name} here");
        } else if version < MIN_VERSION {
            assert_eq!(found.expect_err("no remote_exec").code(), "no_remote_exec");
        } else {
            let found = found.expect("usable");
            assert!(
                found.ends_with(&name) || found.is_absolute(),
                "{}",
                found.display()
            );
        }
    }

    #[test]
    fn a_helper_in_a_directory_another_user_controls_is_never_run() {
        // A `python3.14` under /tmp (writable by everyone), and the process's executable
        // "deleted" with a script at its literal name, each leaving a mark if run.
        let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
        let mark = dir.path().join("ran");
        let trap = |name: &str| {
            let exe = dir.path().join(name);
            std::fs::write(
                &exe,
                format!("#!/bin/sh\ntouch '{}'\necho 3 14 True\n", mark.display()),
            )
            .expect("write");
            std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            exe
        };
        trap("python3.14");
        let deleted = trap("python3.14 (deleted)");
        let f = Facts {
            exe: Some(deleted),
            ..facts()
        };
        let err = find_interpreter(&f, (3, 14), &[dir.path().to_path_buf()], None)
            .expect_err("not trusted");
        assert_eq!(err.code(), "no_interpreter");
        let text = err.to_string();
        assert!(text.contains("not run, as"), "{text}");
        assert!(text.contains("names a deleted file"), "{text}");
        assert!(text.contains("and 1 more"), "{text}");
        assert!(!mark.exists(), "an untrusted helper ran");
    }

    #[test]
    fn embedded_modules_are_all_that_attach_imports() {
        let names: Vec<&str> = ATTACH_MODULES
            .iter()
            .map(|n| n.trim_end_matches(".py"))
            .collect();
        assert_eq!(
            modules().count(),
            ATTACH_MODULES.len(),
            "each is in agent_package"
        );
        for (name, text) in modules() {
            for line in text.lines().map(str::trim) {
                let imported: Vec<&str> = if let Some(rest) = line.strip_prefix("from . import ") {
                    rest.split(',')
                        .map(|p| p.split_whitespace().next().unwrap_or(""))
                        .collect()
                } else if let Some(rest) = line.strip_prefix("from .") {
                    vec![rest.split_whitespace().next().unwrap_or("")]
                } else {
                    continue;
                };
                for module in imported {
                    assert!(
                        names.contains(&module),
                        "{name} imports {module}, which is not embedded"
                    );
                }
            }
        }
    }

    /// The bootstrap and the embedded package, run as `sys.remote_exec` would run them (the
    /// file executed in `__main__` of a real process, on its main thread), in a process of
    /// this machine's Python: the result file, the answer, and nothing left behind.
    #[test]
    fn the_bootstrap_runs_the_agents_reclaim_and_leaves_nothing_behind() {
        use std::io::{BufRead, BufReader, Write};
        let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python");
        let mut child = Command::new("python3")
            .arg(python.join("tests/target.py"))
            .env("PYTHONPATH", python.join("tests/fakes/torch_pkg"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let mut stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("ready");
        let mut exec = |code: &str, eval: &str| {
            writeln!(stdin, "{}", serde_json::json!({"exec": code, "eval": eval})).expect("send");
            let mut answer = String::new();
            stdout.read_line(&mut answer).expect("answer");
            serde_json::from_str::<serde_json::Value>(&answer).expect("JSON")
        };
        exec(
            "import torch\nx = torch.empty(3 << 30, dtype=torch.uint8, device='cuda')\ndel x",
            "None",
        );
        let owner = Owner {
            uid: crate::local_socket::euid(),
            gid: 0,
        };
        let base = tempfile::tempdir().expect("tempdir");
        let create =
            || Workspace::create(base.path(), child.id(), owner, modules()).expect("workspace");
        let write = |w: &Workspace, options, deadline| {
            w.write_request(
                &request_text(w, options, deadline),
                &bootstrap(&w.root, &w.package),
            )
            .expect("request")
        };
        let workspace = create();
        let script = write(
            &workspace,
            ReclaimOptions {
                gc: true,
                ..ReclaimOptions::default()
            },
            4.0e9,
        );
        let ran = exec(
            &format!(
                "exec(compile(open({:?}).read(), 'attach.py', 'exec'), globals())",
                script.display().to_string()
            ),
            "[n for n in globals() if 'vramctl' in n] + [m for m in __import__('sys').modules if 'vramctl' in m] + [p for p in __import__('sys').path + list(__import__('sys').path_importer_cache) if 'vramctl-attach' in p]",
        );
        assert_eq!(ran["ok"], true, "{ran}");
        assert_eq!(
            ran["value"],
            serde_json::json!([]),
            "names, modules or paths left behind"
        );
        let answer =
            wait_for(&workspace, child.id(), Instant::now(), Duration::ZERO).expect("answered");
        assert_eq!(answer.released_bytes, 3 << 30);
        assert_eq!(answer.outcome, "released_all");
        assert!(answer.gc.is_some());
        workspace.remove();
        assert!(!workspace.root.exists(), "removed");

        // Past the deadline: nothing done, said in the result.
        exec(
            "x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\ndel x",
            "None",
        );
        let workspace = create();
        let script = write(&workspace, ReclaimOptions::default(), 1.0);
        exec(
            &format!(
                "exec(compile(open({:?}).read(), 'attach.py', 'exec'), globals())",
                script.display().to_string()
            ),
            "None",
        );
        let late = wait_for(&workspace, child.id(), Instant::now(), Duration::ZERO);
        assert_eq!(late.expect_err("too late").code(), "too_late");
        workspace.remove();
        // Its files gone, a script run later does nothing at all.
        let gone = exec(
            &format!(
                "exec(compile(open({:?}).read(), 'attach.py', 'exec'), globals())",
                script.display().to_string()
            ),
            "None",
        );
        assert_eq!(gone["ok"], false, "{gone}");
        let reserved = exec("", "torch.cuda.memory_reserved(0)");
        assert_eq!(reserved["value"], 1_u64 << 30, "still cached");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_result_of_another_process_or_garbage_is_malformed_and_an_error_is_refused() {
        assert_eq!(
            parse_result(b"{oops", 7).expect_err("garbage").code(),
            "malformed"
        );
        assert_eq!(
            parse_result(br#"{"ok": true, "pid": 8, "answer": {}}"#, 7)
                .expect_err("other pid")
                .code(),
            "malformed"
        );
        let err = parse_result(br#"{"ok": false, "pid": 7, "error": {"code": "capturing", "message": "a CUDA graph is being captured"}}"#, 7).expect_err("refused");
        assert_eq!(err.code(), "capturing");
        assert!(
            err.to_string().contains("a CUDA graph is being captured"),
            "{err}"
        );
    }
}
