//! Real processes for `ps` and `kill` tests, and fake-NVML scenarios that name them.
//!
//! A test spawns what it needs (a `sleep`, a shell that ignores SIGTERM, a small tree), then
//! writes a scenario with `real = true` entries for their PIDs: the fake frees a process's
//! memory once its PID leaves /proc or becomes a zombie, as the driver does. Nothing here
//! sleeps: readiness comes from a line the child prints, exits from a pidfd.

use std::io::{BufRead, BufReader, Lines};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use vramctl_procs::signal::PidHandle;

/// A child process that is killed and reaped when dropped, whatever the test did, with
/// every process it started: each child leads a process group of its own, and dropping it
/// kills the group, so a `sleep 600` that a shell left behind (or that outlived a parent the
/// test killed) does not outlive the test and keep the test run's pipes open.
pub struct Spawned {
    pub child: Child,
    lines: Option<Lines<BufReader<ChildStdout>>>,
}

impl Spawned {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line the child printed.
    pub fn line(&mut self) -> String {
        self.lines
            .as_mut()
            .expect("stdout piped")
            .next()
            .expect("a line")
            .expect("utf-8")
    }

    /// The signal that ended it (reaps it).
    pub fn killed_by(&mut self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.child.wait().expect("wait").signal()
    }

    /// Whether it is still running (a zombie counts as ended).
    pub fn alive(&self) -> bool {
        PidHandle::pin(self.pid()).is_ok_and(|h| !h.has_exited())
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        // The group's id is the leader's PID, and stays taken while any member lives, so
        // this cannot reach another test's processes. kill(1) instead of a new dependency.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.pid())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sleep 600`.
pub fn sleeper() -> Spawned {
    spawn(Command::new("sleep").arg("600"))
}

/// `sh -c SCRIPT`, stdout piped; the script prints what the test waits for.
pub fn shell(script: &str) -> Spawned {
    let mut command = Command::new("sh");
    command.args(["-c", script]);
    spawn(&mut command)
}

/// A shell that ignores SIGTERM (and so does the sleep it becomes), ready when it returns.
pub fn term_ignorer() -> Spawned {
    let mut s = shell("trap '' TERM; echo ready; exec sleep 600");
    assert_eq!(s.line(), "ready");
    s
}

pub fn spawn(command: &mut Command) -> Spawned {
    use std::os::unix::process::CommandExt;
    let mut child = command
        .process_group(0)
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn");
    let lines = child.stdout.take().map(|out| BufReader::new(out).lines());
    Spawned { child, lines }
}

/// A three-generation tree: `sh` (root) -> `sh` (middle) -> `sleep` (grandchild).
pub struct Tree {
    pub root: Spawned,
    pub middle: u32,
    pub grandchild: u32,
}

pub fn tree() -> Tree {
    let mut root = shell("sh -c 'sleep 600 & echo g $!; wait' & echo r; wait");
    let mut grandchild = None;
    let mut ready = false;
    while grandchild.is_none() || !ready {
        let line = root.line();
        match line.split_once(' ') {
            Some(("g", pid)) => grandchild = Some(pid.parse::<u32>().expect("pid")),
            _ => ready |= line == "r",
        }
    }
    let grandchild = grandchild.expect("read above");
    let middle = vramctl_procs::procinfo::read_stat(grandchild)
        .expect("grandchild")
        .ppid;
    Tree {
        root,
        middle,
        grandchild,
    }
}

/// Waits (on a pidfd, up to 10 s) until `pid` has terminated; whether it did.
pub fn ends(pid: u32) -> bool {
    PidHandle::pin(pid).map_or(true, |h| h.wait_exit(Duration::from_secs(10)))
}

/// One `[[gpu.process]]` entry.
pub struct Holder {
    pub gpu: usize,
    pub pid: u32,
    pub memory: &'static str,
    /// `real = true` (else the fake lists it whatever /proc says).
    pub real: bool,
    pub held_open_by: Vec<u32>,
}

impl Holder {
    pub fn real(gpu: usize, pid: u32, memory: &'static str) -> Self {
        Self {
            gpu,
            pid,
            memory,
            real: true,
            held_open_by: Vec::new(),
        }
    }

    pub fn fictional(gpu: usize, pid: u32, memory: &'static str) -> Self {
        Self {
            real: false,
            ..Self::real(gpu, pid, memory)
        }
    }
}

/// A scenario with `gpus` H200-like devices (1 GiB unaccounted on GPU 0) and `holders`,
/// written into a fresh directory that any user may read.
pub struct Scenario {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl Scenario {
    pub fn new(gpus: usize, holders: &[Holder]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let mut text = String::new();
        for gpu in 0..gpus {
            text.push_str(&format!(
                "[[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"GPU-0000000{gpu}-1111-2222-3333-444444444444\"\n\
                 memory_total = \"140 GiB\"\nmemory_reserved = \"615 MiB\"\n"
            ));
            if gpu == 0 {
                text.push_str("memory_extra_used = \"1 GiB\"\n");
            }
            for h in holders.iter().filter(|h| h.gpu == gpu) {
                text.push_str(&format!(
                    "[[gpu.process]]\npid = {}\nreal = {}\nmemory = \"{}\"\n",
                    h.pid, h.real, h.memory
                ));
                if !h.held_open_by.is_empty() {
                    let list: Vec<String> = h.held_open_by.iter().map(u32::to_string).collect();
                    text.push_str(&format!("held_open_by = [{}]\n", list.join(", ")));
                }
            }
        }
        let path = dir.path().join("scenario.toml");
        std::fs::write(&path, text).expect("write scenario");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        Self { dir, path }
    }

    /// The history database of this test: where `kill` and `reap` write their audit rows.
    pub fn db(&self) -> PathBuf {
        self.dir.path().join("state/history.db")
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The audit rows of the history at `db`, oldest first, read through the store's API (none
/// when the database does not exist).
pub fn audit_rows(db: &Path) -> Vec<vramctl_store::AuditRow> {
    if !db.exists() {
        return Vec::new();
    }
    vramctl_store::Store::open(db, vramctl_store::OpenMode::ReadOnly)
        .expect("the history database")
        .audit_rows(vramctl_store::TimeRange::ALL)
        .expect("audit rows")
}

/// Whether this test runs as root (needed to create another user's process).
pub fn is_root() -> bool {
    vramctl_procs::procinfo::read_status(std::process::id())
        .ok()
        .and_then(|s| s.uid_effective)
        == Some(0)
}

/// `n` five-digit PIDs that no process has now and that the kernel will not hand out soon:
/// for "fictional" processes a scenario lists that must stay invisible here, with the
/// width of the example scenarios' PIDs. The kernel hands out PIDs upwards from
/// `ns_last_pid` and wraps at `pid_max`, so the free PIDs just below the last one handed out
/// are the last it will reach again.
pub fn unused_pids(n: usize) -> Vec<u32> {
    let read =
        |path: &str| -> Option<u32> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    let pid_max = read("/proc/sys/kernel/pid_max")
        .unwrap_or(32_768)
        .min(100_000);
    let last = read("/proc/sys/kernel/ns_last_pid").unwrap_or(0);
    let low = 10_000;
    assert!(
        pid_max > low + 1000,
        "pid_max {pid_max} leaves no five-digit PIDs"
    );
    let span = pid_max - low;
    // Walk down from the last PID handed out, wrapping inside [low, pid_max).
    let start = last.clamp(low, pid_max - 1) - low;
    let found: Vec<u32> = (1..span)
        .map(|back| low + (start + span - back) % span)
        .filter(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        .take(n)
        .collect();
    assert_eq!(found.len(), n, "not enough free PIDs");
    found
}

/// This test's user name (or uid), for snapshot filters.
pub fn my_user() -> String {
    let uid = vramctl_procs::procinfo::read_status(std::process::id())
        .ok()
        .and_then(|s| s.uid_real)
        .expect("our uid");
    vramctl_procs::procinfo::ProcReader::new()
        .user_name(uid)
        .unwrap_or_else(|| uid.to_string())
}
