//! `vramctl reclaim --attach PID`: the agent's `reclaim` run once in a Python 3.14+ process
//! that has no agent, through `sys.remote_exec` (PEP 768), or a clear word on why that is
//! not possible there.
//!
//! How: the agent's own modules (embedded in the binary, so nothing needs installing) are
//! written under a private package name into a fresh directory the process can read, with a
//! bootstrap script and the request; a helper interpreter of the process's `major.minor`
//! (its own executable where it is one, else `python3.X` on `PATH`) runs
//! `sys.remote_exec(PID, script)`, which only writes the script's path into the process's
//! memory; its main thread runs the script at its next safe evaluation point, which writes
//! the answer to a result file (a temporary name, renamed). vramctl waits for that file up to
//! a deadline. There is no way to know when, or whether, the script will run (a main thread
//! inside a long C call runs it when the call returns), so a script that runs after the
//! deadline does nothing, removes its directory and says `too_late` to nobody.
//!
//! What makes it unavailable, each a [`Unavailable`] with one line: not Python, its version
//! unknown or below 3.14, remote debugging disabled in it (`PYTHON_DISABLE_REMOTE_DEBUG`,
//! `-X disable-remote-debug`), another user's process for a caller who is not root, Yama's
//! `ptrace_scope` (1: only root or an ancestor; 2: only root; 3: nobody), another mount
//! namespace (the script's path would not be its), no interpreter of its version here, one
//! without `sys.remote_exec` (built `--without-remote-debug`), or an agent already running
//! in it (then `vramctl reclaim PID` asks that).

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    /// Its executable (`/proc/PID/exe`), when readable.
    pub exe: Option<PathBuf>,
    /// Its Python `major.minor`, when told.
    pub version: Option<(u32, u32)>,
    /// It looks like Python (its executable's name, or libpython mapped).
    pub is_python: bool,
    /// `PYTHON_DISABLE_REMOTE_DEBUG` set (non-empty) in its environment, or `-X
    /// disable-remote-debug` on its command line.
    pub disabled_by: Option<String>,
    /// Its uids (real, effective, saved).
    pub target_uids: [u32; 3],
    /// The caller's effective uid.
    pub caller_uid: u32,
    /// The caller is one of its ancestors.
    pub caller_is_ancestor: bool,
    /// `kernel.yama.ptrace_scope` (`None`: no Yama, classic ptrace rules).
    pub ptrace_scope: Option<u32>,
    /// It shares the caller's mount namespace.
    pub same_mount_namespace: bool,
    /// It has an agent socket that answers.
    pub has_agent: bool,
}

impl Facts {
    /// Reads them from /proc.
    ///
    /// # Errors
    /// [`Unavailable::NoProcess`] when `/proc/PID` is not there.
    pub fn gather(pid: u32) -> Result<Self, Unavailable> {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let status = std::fs::read_to_string(proc_dir.join("status"))
            .map_err(|_| Unavailable::NoProcess { pid })?;
        let uids: Vec<u32> = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .map(|r| {
                r.split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let target_uids = [0, 1, 2].map(|i| uids.get(i).copied().unwrap_or(u32::MAX));
        let exe = std::fs::read_link(proc_dir.join("exe")).ok();
        let exe_name = exe
            .as_ref()
            .and_then(|e| e.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let maps = std::fs::read_to_string(proc_dir.join("maps")).unwrap_or_default();
        let lib_version = maps.lines().find_map(|l| {
            let name = l.rsplit('/').next()?;
            version_in(name.strip_prefix("libpython")?)
        });
        let is_python = exe_name.starts_with("python") || lib_version.is_some();
        let mut version = exe_name
            .strip_prefix("python")
            .and_then(version_in)
            .or(lib_version);
        if version.is_none() && exe_name.starts_with("python") {
            // `python3`, `python`: ask the same binary, which is its version by definition.
            version = exe
                .as_ref()
                .and_then(|e| interpreter_version(e).map(|(v, _)| v));
        }
        let environ = std::fs::read(proc_dir.join("environ")).unwrap_or_default();
        let cmdline = std::fs::read(proc_dir.join("cmdline")).unwrap_or_default();
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
            target_uids,
            caller_uid,
            caller_is_ancestor: is_ancestor(std::process::id(), pid),
            ptrace_scope,
            same_mount_namespace,
            has_agent,
        })
    }
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

/// Whether `ancestor` is a parent, grandparent, … of `pid` (Yama scope 1 lets an ancestor
/// attach).
fn is_ancestor(ancestor: u32, pid: u32) -> bool {
    let mut walk = pid;
    for _ in 0..64 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{walk}/stat")) else {
            return false;
        };
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            return false;
        };
        if ppid == ancestor {
            return true;
        }
        if ppid <= 1 {
            return false;
        }
        walk = ppid;
    }
    false
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
    let scope = |scope, why| Err(Unavailable::PtraceScope { pid, scope, why });
    match facts.ptrace_scope {
        Some(s @ 3..) => return scope(s, "forbids every attach until reboot"),
        Some(2) if !root => return scope(2, "lets only root attach"),
        Some(1) if !root && !facts.caller_is_ancestor => {
            return scope(
                1,
                "lets only root or the process's ancestors attach (run vramctl as root, or set it to 0)",
            );
        }
        _ => {}
    }
    if !facts.same_mount_namespace {
        return Err(Unavailable::OtherMountNamespace { pid });
    }
    Ok((major, minor))
}

/// `(major, minor)` of `interpreter` and whether it has `sys.remote_exec`, or `None` when it
/// does not run as Python within [`HELPER_TIMEOUT`].
fn interpreter_version(interpreter: &Path) -> Option<((u32, u32), bool)> {
    let out = run_bounded(
        Command::new(interpreter).args([
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

/// The helper interpreter: the process's own executable when it is a `python*` binary (the
/// very version it runs, pre-releases included), else `python{major}.{minor}` on `search`
/// (`PATH`'s directories).
///
/// # Errors
/// [`Unavailable::NoInterpreter`], [`Unavailable::NoRemoteExec`].
pub fn find_interpreter(
    facts: &Facts,
    version: (u32, u32),
    search: &[PathBuf],
) -> Result<PathBuf, Unavailable> {
    let name = format!("python{}.{}", version.0, version.1);
    let mut candidates = Vec::new();
    if let Some(exe) = &facts.exe {
        if exe
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("python"))
        {
            candidates.push(exe.clone());
        }
    }
    candidates.extend(search.iter().map(|d| d.join(&name)));
    let mut without = None;
    for candidate in &candidates {
        match interpreter_version(candidate) {
            Some((v, true)) if v == version => return Ok(candidate.clone()),
            Some((v, false)) if v == version => {
                without.get_or_insert_with(|| candidate.clone());
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
    Err(Unavailable::NoInterpreter {
        pid: facts.pid,
        major: version.0,
        minor: version.1,
        looked: if search.is_empty() {
            "its executable".to_owned()
        } else {
            format!("its executable and {name} on PATH")
        },
    })
}

/// `PATH`'s directories.
pub fn path_dirs() -> Vec<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .filter(|d| d.is_absolute())
                .collect()
        })
        .unwrap_or_default()
}

/// A process an attach may be tried on, and the interpreter that will do it.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The process.
    pub pid: u32,
    /// Its Python `major.minor`.
    pub version: (u32, u32),
    /// The helper interpreter.
    pub interpreter: PathBuf,
    /// Its uid and gid (the files are made its when the caller is root).
    owner: (u32, u32),
}

/// Whether `pid` can be attached to, and with what.
///
/// # Errors
/// Why not ([`Unavailable`]).
pub fn plan(pid: u32) -> Result<Plan, Unavailable> {
    let facts = Facts::gather(pid)?;
    let version = judge(&facts)?;
    let interpreter = find_interpreter(&facts, version, &path_dirs())?;
    let meta =
        std::fs::metadata(format!("/proc/{pid}")).map_err(|_| Unavailable::NoProcess { pid })?;
    Ok(Plan {
        pid,
        version,
        interpreter,
        owner: (meta.uid(), meta.gid()),
    })
}

/// The directory of one attach: the package, the bootstrap, the request, the result.
struct Workspace {
    root: PathBuf,
    package: String,
}

impl Workspace {
    fn create(plan: &Plan) -> std::io::Result<Self> {
        let nonce = format!(
            "{:x}{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        let me = crate::local_socket::euid();
        // The process must reach the files: a root caller's own TMPDIR may be private to it.
        let base = if me == plan.owner.0 {
            std::env::temp_dir()
        } else {
            PathBuf::from("/tmp")
        };
        let root = base.join(format!("vramctl-attach-{}-{nonce}", plan.pid));
        std::fs::create_dir(&root)?;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
        let package = format!("_vramctl_attach_{nonce}");
        let pkg_dir = root.join(&package);
        std::fs::create_dir(&pkg_dir)?;
        let write = |path: &Path, text: &str| -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(path)?;
            std::io::Write::write_all(&mut f, text.as_bytes())
        };
        write(&pkg_dir.join("__init__.py"), "")?;
        for (name, text) in modules() {
            write(&pkg_dir.join(name), text)?;
        }
        if me == 0 && plan.owner.0 != 0 {
            // The process writes its result here and, if it runs late, removes it all.
            for entry in [root.clone(), pkg_dir.clone()] {
                std::os::unix::fs::chown(&entry, Some(plan.owner.0), Some(plan.owner.1))?;
            }
        }
        Ok(Self { root, package })
    }

    fn write_request(
        &self,
        options: ReclaimOptions,
        deadline_unix_s: f64,
    ) -> std::io::Result<PathBuf> {
        let request = serde_json::json!({
            "gc": options.gc,
            "deep": options.deep,
            "dry_run": options.dry_run,
            "result": self.result().display().to_string(),
            "deadline": deadline_unix_s,
        });
        let path = self.root.join("request.json");
        std::fs::write(&path, request.to_string())?;
        let script = self.root.join("attach.py");
        std::fs::write(&script, bootstrap(&self.root, &self.package))?;
        Ok(script)
    }

    fn result(&self) -> PathBuf {
        self.root.join("result.json")
    }
}

/// The script the process runs: everything inside one function whose name is removed
/// afterwards, the package imported from the workspace and forgotten again (`sys.path`,
/// `sys.modules`), every failure reported in the result file rather than raised into the
/// process's main thread; a late run removes the workspace.
fn bootstrap(root: &Path, package: &str) -> String {
    let root = serde_json::to_string(&root.display().to_string()).unwrap_or_default();
    let package = serde_json::to_string(package).unwrap_or_default();
    format!(
        r#"def _vramctl_attach():
    import importlib, json, os, shutil, sys, time
    root, package = {root}, {package}
    request = os.path.join(root, "request.json")
    sys.path.insert(0, root)
    try:
        importlib.import_module(package + "._attach").run(request)
    except BaseException as err:
        try:
            with open(os.path.join(root, "result.json.tmp"), "w") as out:
                json.dump({{"ok": False, "pid": os.getpid(), "error": {{"code": "attach_error", "message": type(err).__name__ + ": " + str(err)[:300]}}}}, out)
            os.replace(os.path.join(root, "result.json.tmp"), os.path.join(root, "result.json"))
        except OSError:
            pass
    finally:
        try:
            sys.path.remove(root)
        except ValueError:
            pass
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]
        try:
            with open(request) as f:
                late = time.time() > json.load(f).get("deadline", float("inf"))
        except (OSError, ValueError):
            late = False
        if late:
            shutil.rmtree(root, ignore_errors=True)
try:
    _vramctl_attach()
finally:
    del _vramctl_attach
"#
    )
}

/// Runs `command` with its output captured, killed at `timeout`.
fn run_bounded(command: &mut Command, timeout: Duration) -> std::io::Result<std::process::Output> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait()?.is_some() {
            return child.wait_with_output();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("did not end within {:.0} s", timeout.as_secs_f64()),
            ));
        }
        std::thread::sleep(POLL_STEP);
    }
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
    let io = |path: &Path, source| AttachError::Io {
        pid,
        path: path.to_path_buf(),
        source,
    };
    let workspace = Workspace::create(plan).map_err(|e| io(&std::env::temp_dir(), e))?;
    let deadline = Instant::now() + timeout;
    let deadline_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
        + timeout.as_secs_f64();
    let script = workspace
        .write_request(options, deadline_unix_s)
        .map_err(|e| io(&workspace.root, e))?;
    let result =
        deliver(plan, &script).and_then(|()| wait_for(&workspace.result(), pid, deadline, timeout));
    // A script that has not run yet needs its files; it removes them itself when it runs late.
    if !matches!(result, Err(AttachError::Timeout { .. })) {
        let _ = std::fs::remove_dir_all(&workspace.root);
    }
    result
}

/// `python3.X -c 'import sys; sys.remote_exec(PID, script)'`.
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
    let out = run_bounded(
        Command::new(&plan.interpreter).args(["-I", "-S", "-c", &code]),
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

/// Waits for the result file and reads it (no symlink followed, bounded).
fn wait_for(
    path: &Path,
    pid: u32,
    deadline: Instant,
    timeout: Duration,
) -> Result<ReclaimAnswer, AttachError> {
    loop {
        // Not through a symlink, never blocking on a FIFO: the directory is the process's.
        let opened = rustix::fs::open(
            path,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::NONBLOCK
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map(std::fs::File::from)
        .map_err(std::io::Error::from);
        match opened {
            Ok(file) => {
                if !file.metadata().is_ok_and(|m| m.is_file()) {
                    return Err(AttachError::Malformed {
                        pid,
                        reason: format!("'{}' is not a regular file", path.display()),
                    });
                }
                let mut text = Vec::new();
                file.take(MAX_RESULT_BYTES)
                    .read_to_end(&mut text)
                    .map_err(|e| AttachError::Io {
                        pid,
                        path: path.to_path_buf(),
                        source: e,
                    })?;
                return parse_result(&text, pid);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(AttachError::Io {
                    pid,
                    path: path.to_path_buf(),
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

    fn facts() -> Facts {
        Facts {
            pid: 4242,
            exe: Some(PathBuf::from("/usr/bin/python3.14")),
            version: Some((3, 14)),
            is_python: true,
            disabled_by: None,
            target_uids: [1000; 3],
            caller_uid: 1000,
            caller_is_ancestor: false,
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
                "ptrace_scope is 1",
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
        // What root and an ancestor may do.
        assert!(
            judge(&root(Facts {
                target_uids: [1001; 3],
                ptrace_scope: Some(2),
                ..facts()
            }))
            .is_ok()
        );
        assert!(
            judge(&Facts {
                ptrace_scope: Some(1),
                caller_is_ancestor: true,
                ..facts()
            })
            .is_ok()
        );
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
        let version = interpreter_version(Path::new("python3"))
            .expect("python3 answers")
            .0;
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

    #[test]
    fn no_interpreter_of_the_version_is_said_with_where_it_looked() {
        let empty = tempfile::tempdir().expect("tempdir");
        let f = Facts {
            exe: Some("/nonexistent/python3.14".into()),
            ..facts()
        };
        let err = find_interpreter(&f, (3, 14), &[empty.path().to_path_buf()]).expect_err("none");
        assert_eq!(err.code(), "no_interpreter");
        assert!(err.to_string().contains("install python3.14"), "{err}");
        // One of the right version without sys.remote_exec (here: this machine's python3
        // asked for its own version, which before 3.14 has none).
        let python3 = path_dirs()
            .into_iter()
            .map(|d| d.join("python3"))
            .find(|p| p.exists());
        if let Some(python3) = python3 {
            let (version, has) = interpreter_version(&python3).expect("python3 answers");
            let f = Facts {
                exe: Some(python3.clone()),
                ..facts()
            };
            let found = find_interpreter(&f, version, &[]);
            if has {
                assert_eq!(found.expect("usable"), python3);
            } else {
                assert_eq!(found.expect_err("no remote_exec").code(), "no_remote_exec");
            }
        }
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
        let plan = Plan {
            pid: child.id(),
            version: (3, 14),
            interpreter: PathBuf::from("unused"),
            owner: (crate::local_socket::euid(), 0),
        };
        let workspace = Workspace::create(&plan).expect("workspace");
        let script = workspace
            .write_request(
                ReclaimOptions {
                    gc: true,
                    ..ReclaimOptions::default()
                },
                4.0e9,
            )
            .expect("request");
        let ran = exec(
            &format!(
                "exec(compile(open({:?}).read(), 'attach.py', 'exec'), globals())",
                script.display().to_string()
            ),
            "[n for n in globals() if 'vramctl' in n] + [m for m in __import__('sys').modules if 'vramctl' in m] + [p for p in __import__('sys').path if 'vramctl-attach' in p]",
        );
        assert_eq!(ran["ok"], true, "{ran}");
        assert_eq!(
            ran["value"],
            serde_json::json!([]),
            "names, modules or paths left behind"
        );
        let answer = wait_for(
            &workspace.result(),
            child.id(),
            Instant::now(),
            Duration::ZERO,
        )
        .expect("answered");
        assert_eq!(answer.released_bytes, 3 << 30);
        assert_eq!(answer.outcome, "released_all");
        assert!(answer.gc.is_some());
        let _ = std::fs::remove_dir_all(&workspace.root);

        // Past the deadline: nothing done, the workspace removed by the script itself.
        exec(
            "x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\ndel x",
            "None",
        );
        let workspace = Workspace::create(&plan).expect("workspace");
        let script = workspace
            .write_request(ReclaimOptions::default(), 1.0)
            .expect("request");
        exec(
            &format!(
                "exec(compile(open({:?}).read(), 'attach.py', 'exec'), globals())",
                script.display().to_string()
            ),
            "None",
        );
        assert!(
            !workspace.root.exists(),
            "a late script removes its workspace"
        );
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
