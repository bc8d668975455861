//! Where the supervised job's processes are kept, so that stopping it reaches every one of
//! them, whatever they did (ignored SIGTERM, double-forked, outlived their parent), and so
//! that the job goes when `run` itself is killed.
//!
//! Two kinds, chosen once per job (`docs/run.md` says what each guarantees):
//!
//! - **A cgroup v2 scope**, where vramctl may create one (root, or a delegated subtree): a
//!   child cgroup `vramctl-run.<pid>.<n>` of vramctl's own cgroup (else of the hierarchy's
//!   root). The command is moved into it between `fork` and `exec`, so it and everything it
//!   starts are members before any of them runs; no process can leave a cgroup without
//!   write access to another, so nothing escapes. Stopping sends SIGTERM to every member and
//!   then writes `cgroup.kill`, which the kernel applies to the whole subtree atomically
//!   (no PID list, no race with `fork`). A guard process (`vramctl __run-guard`, outside
//!   the scope, in its own process group) holds a pipe from `run`: when `run` dies without
//!   saying it is done — SIGKILL, a crash — the pipe closes and the guard kills the scope
//!   and removes it.
//! - **The subreaper's tree** otherwise: `run` is a child subreaper, so every process the
//!   job starts stays its descendant even after its parent exits (orphans come back to
//!   `run`, not to init). Stopping signals every descendant of `run`, looked up again each
//!   time, until none is left. A process of the job that `run` does not outlive is not
//!   followed: when `run` is killed, only its direct child goes with it (the death signal
//!   below); the rest go to the nearest subreaper above `run`, or init.
//!
//! In both, the command's direct child gets `PR_SET_PDEATHSIG(SIGKILL)`: it dies with `run`.
//!
//! Every signal to a member goes through a pidfd opened *before* the membership is checked
//! again (in the scope's cgroup, or descending from `run`), so a PID that was freed and
//! handed to another process between the listing and the signal is never hit.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use rustix::process::{Pid, PidfdFlags, Signal};
use vramctl_procs::procinfo;

/// The hidden subcommand of the guard process (`main.rs` dispatches it before the command
/// line is parsed).
pub const GUARD_ARG: &str = "__run-guard";

/// Set to `1` (or any value but `0`): never use a cgroup, keep the job by the subreaper's
/// tree only — for hosts where vramctl must not touch the cgroup tree, and for the tests of
/// that path.
pub const NO_CGROUP_ENV: &str = "VRAMCTL_RUN_NO_CGROUP";

/// The prefix of every scope's name; the guard acts only on a directory named so.
const SCOPE_PREFIX: &str = "vramctl-run.";

/// `CGROUP2_SUPER_MAGIC`: the guard acts only on a cgroup v2 directory.
const CGROUP2_SUPER_MAGIC: u64 = 0x6367_7270;

/// How deep the scope's own sub-cgroups are followed when listing its members (a job
/// running as root may create some; `cgroup.kill` needs no bound).
const MAX_CGROUP_DEPTH: usize = 32;

/// How many times the subreaper's tree is listed and signalled in one stop: a process
/// forking as fast as it can adds children between a listing and the signals.
const MAX_KILL_ROUNDS: usize = 64;

/// Numbers scopes within one `run` (a `fit` runs one per trial).
static NEXT_SCOPE: AtomicU32 = AtomicU32::new(0);

/// How the job is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A cgroup v2 scope.
    Cgroup,
    /// The subreaper's tree.
    Subreaper,
}

impl Kind {
    /// For logs and the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cgroup => "cgroup",
            Self::Subreaper => "subreaper",
        }
    }
}

/// A cgroup v2 directory made for one job.
#[derive(Debug)]
struct CgroupScope {
    /// Its directory (under the cgroup2 mount).
    dir: PathBuf,
    /// Its path as `/proc/PID/cgroup` shows it (`0::/a/b/vramctl-run.1.0`).
    path_in_hierarchy: String,
    /// `cgroup.procs`, open for writing: the child writes `0` to it before `exec`.
    procs: Arc<OwnedFd>,
    /// The guard, and the pipe whose closing tells it `run` is gone.
    guard: Option<(Child, std::process::ChildStdin)>,
    removed: bool,
}

/// The job's processes, wherever they went.
#[derive(Debug)]
pub struct JobScope {
    cgroup: Option<CgroupScope>,
    /// `run` itself: the root of the subreaper's tree.
    root: u32,
}

impl JobScope {
    /// A cgroup scope where one can be made (and [`NO_CGROUP_ENV`] does not forbid it),
    /// else the subreaper's tree.
    pub fn new() -> Self {
        let root = std::process::id();
        let forbidden = std::env::var_os(NO_CGROUP_ENV).is_some_and(|v| v != "0" && !v.is_empty());
        let cgroup = if forbidden {
            None
        } else {
            match CgroupScope::create() {
                Ok(scope) => Some(scope),
                Err(err) => {
                    tracing::debug!(%err, "No cgroup scope for the job; keeping it by the subreaper's tree.");
                    None
                }
            }
        };
        Self { cgroup, root }
    }

    /// The subreaper's tree only (the fallback, or a cgroup move the kernel refused).
    pub fn without_cgroup() -> Self {
        Self {
            cgroup: None,
            root: std::process::id(),
        }
    }

    /// How the job is kept.
    pub fn kind(&self) -> Kind {
        if self.cgroup.is_some() {
            Kind::Cgroup
        } else {
            Kind::Subreaper
        }
    }

    /// Prepares `command` so that its process dies with `run` and, with a cgroup, joins the
    /// scope before `exec`.
    pub fn prepare(&self, command: &mut Command) {
        use std::os::unix::process::CommandExt;
        let parent = rustix::process::getpid();
        let procs = self.cgroup.as_ref().map(|c| Arc::clone(&c.procs));
        let hook = move || -> std::io::Result<()> {
            // Between fork and exec only raw system calls: no allocation, no lock.
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // `run` died before the line above: the signal will never come.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::from(rustix::io::Errno::SRCH));
            }
            if let Some(fd) = &procs {
                // `0` is the writer itself.
                rustix::io::write(fd.as_fd(), b"0")?;
            }
            Ok(())
        };
        // SAFETY: the hook only makes system calls (prctl, getppid, write) on values
        // captured before the fork; it allocates nothing and takes no lock, as code
        // between fork and exec of a multi-threaded process must.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(hook);
        }
    }

    /// The job's processes now: the scope's members, or every descendant of `run`.
    pub fn pids(&self) -> Vec<u32> {
        match &self.cgroup {
            Some(c) => c.members(),
            None => procinfo::descendants(self.root)
                .into_iter()
                .map(|(pid, _)| pid)
                .filter(|pid| procinfo::read_stat(*pid).is_ok_and(|s| !s.is_zombie()))
                .collect(),
        }
    }

    /// Whether no process of the job is left (zombies do not count: they have exited).
    pub fn is_empty(&self) -> bool {
        match &self.cgroup {
            Some(c) => !c.populated(),
            None => self.pids().is_empty(),
        }
    }

    /// Sends `signal` to every process of the job, each pinned by a pidfd and checked to
    /// be a member after pinning.
    pub fn signal_all(&self, signal: Signal) {
        for pid in self.pids() {
            signal_member(pid, signal, |pid| self.is_member(pid));
        }
    }

    /// SIGKILL to every process of the job: `cgroup.kill` (the whole subtree at once), or
    /// round after round over the subreaper's tree until none is left.
    pub fn kill_all(&self) {
        if let Some(c) = &self.cgroup
            && c.kill().is_ok()
        {
            return;
        }
        for _ in 0..MAX_KILL_ROUNDS {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                signal_member(pid, Signal::KILL, |pid| self.is_member(pid));
            }
        }
    }

    fn is_member(&self, pid: u32) -> bool {
        match &self.cgroup {
            Some(c) => c.has_member(pid),
            None => descends_from(pid, self.root),
        }
    }

    /// Stops whatever is left of the job: SIGTERM unless `term_sent` says it was sent,
    /// SIGKILL once `grace` has passed since, then waits (up to `kill_wait`) for the last
    /// to go, reaping our own children as they exit. Returns how many processes were left
    /// when it was called and how many survived SIGKILL (uninterruptible sleep).
    pub fn stop_rest(
        &self,
        term_sent: Option<Instant>,
        grace: Duration,
        kill_wait: Duration,
        reap: &mut dyn FnMut(),
    ) -> (usize, usize) {
        reap();
        let left = self.pids().len();
        if left == 0 {
            return (0, 0);
        }
        let term_at = match term_sent {
            Some(at) => at,
            None => {
                self.signal_all(Signal::TERM);
                self.signal_all(Signal::CONT);
                Instant::now()
            }
        };
        let poll = Duration::from_millis(10);
        while !self.is_empty() && term_at.elapsed() < grace {
            reap();
            std::thread::sleep(poll);
        }
        if self.is_empty() {
            reap();
            return (left, 0);
        }
        self.kill_all();
        let deadline = Instant::now() + kill_wait;
        while !self.is_empty() && Instant::now() < deadline {
            reap();
            self.kill_all();
            std::thread::sleep(poll);
        }
        reap();
        (left, self.pids().len())
    }

    /// Ends the scope: removes the cgroup (once empty) and lets the guard go.
    pub fn close(&mut self) {
        if let Some(c) = self.cgroup.as_mut() {
            c.close();
        }
    }
}

impl Default for JobScope {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for JobScope {
    fn drop(&mut self) {
        if let Some(c) = self.cgroup.as_mut()
            && !c.removed
        {
            // An early return (a panic, an error) must not leave the job running.
            let _ = c.kill();
            c.close();
        }
    }
}

/// Pins `pid`, checks `member(pid)` after pinning, then signals through the pidfd. Without
/// pidfds (before Linux 5.3) the check is made immediately before `kill(2)`.
fn signal_member(pid: u32, signal: Signal, member: impl Fn(u32) -> bool) {
    let Some(raw) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return;
    };
    match rustix::process::pidfd_open(raw, PidfdFlags::empty()) {
        Ok(fd) => {
            // The fd names one process from here on; if the process now under this PID is
            // a member, it is the one the fd names (a member cannot have been reused into).
            if member(pid) {
                let _ = rustix::process::pidfd_send_signal(&fd, signal);
            }
        }
        Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => {
            if member(pid) {
                let _ = rustix::process::kill_process(raw, signal);
            }
        }
        Err(_) => {}
    }
}

/// Whether `pid`'s chain of parents reaches `root`.
fn descends_from(pid: u32, root: u32) -> bool {
    let mut current = pid;
    for _ in 0..256 {
        if current == root {
            return pid != root;
        }
        if current <= 1 {
            return false;
        }
        match procinfo::read_stat(current) {
            Ok(stat) => current = stat.ppid,
            Err(_) => return false,
        }
    }
    false
}

/// Why a cgroup scope could not be made.
#[derive(Debug, thiserror::Error)]
enum ScopeError {
    #[error("no cgroup v2 hierarchy is mounted")]
    NoHierarchy,
    #[error("our own cgroup v2 path is unknown")]
    NoOwnPath,
    #[error("cannot create a cgroup under '{dir}': {source}")]
    Create { dir: String, source: std::io::Error },
    #[error("cannot start the guard: {0}")]
    Guard(std::io::Error),
}

impl CgroupScope {
    fn create() -> Result<Self, ScopeError> {
        let (mount, mount_root) = cgroup2_mount().ok_or(ScopeError::NoHierarchy)?;
        let own = own_cgroup_path().ok_or(ScopeError::NoOwnPath)?;
        let name = format!(
            "{SCOPE_PREFIX}{}.{}",
            std::process::id(),
            NEXT_SCOPE.fetch_add(1, Ordering::SeqCst)
        );
        // Our own cgroup first (it is ours to divide); its top otherwise.
        let mut parents = vec![own.clone()];
        if own != mount_root {
            parents.push(mount_root.clone());
        }
        let mut last_err = None;
        for parent in parents {
            let Some(relative) = parent.strip_prefix(mount_root.trim_end_matches('/')) else {
                continue;
            };
            let parent_dir = mount.join(relative.trim_start_matches('/'));
            let dir = parent_dir.join(&name);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(source) => {
                    last_err = Some(ScopeError::Create {
                        dir: parent_dir.display().to_string(),
                        source,
                    });
                    continue;
                }
            }
            let procs = match rustix::fs::open(
                dir.join("cgroup.procs"),
                OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(err) => {
                    let _ = std::fs::remove_dir(&dir);
                    last_err = Some(ScopeError::Create {
                        dir: parent_dir.display().to_string(),
                        source: err.into(),
                    });
                    continue;
                }
            };
            let path_in_hierarchy = format!("{}/{name}", parent.trim_end_matches('/'));
            let mut scope = Self {
                dir,
                path_in_hierarchy,
                procs: Arc::new(procs),
                guard: None,
                removed: false,
            };
            match spawn_guard(&scope.dir) {
                Ok(guard) => scope.guard = Some(guard),
                Err(err) => {
                    scope.close();
                    return Err(ScopeError::Guard(err));
                }
            }
            return Ok(scope);
        }
        Err(last_err.unwrap_or(ScopeError::NoOwnPath))
    }

    /// Every member, the scope's own sub-cgroups included.
    fn members(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut stack = vec![(self.dir.clone(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
            if depth >= MAX_CGROUP_DEPTH {
                continue;
            }
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push((entry.path(), depth + 1));
                    }
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Whether `pid` is in the scope or below it now.
    fn has_member(&self, pid: u32) -> bool {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            return false;
        };
        text.lines()
            .filter_map(|l| l.strip_prefix("0::"))
            .any(|path| {
                path == self.path_in_hierarchy
                    || path
                        .strip_prefix(self.path_in_hierarchy.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            })
    }

    /// Whether a live process is in the scope (`cgroup.events`: `populated 1`).
    fn populated(&self) -> bool {
        match std::fs::read_to_string(self.dir.join("cgroup.events")) {
            Ok(text) => text.lines().any(|l| l.trim() == "populated 1"),
            Err(_) => !self.members().is_empty(),
        }
    }

    fn kill(&self) -> std::io::Result<()> {
        kill_cgroup(&self.dir)
    }

    fn close(&mut self) {
        if self.removed {
            return;
        }
        match remove_cgroup(&self.dir) {
            Ok(()) => self.removed = true,
            Err(err) => {
                tracing::warn!(dir = %self.dir.display(), %err, "Could not remove the job's cgroup; the guard will.");
            }
        }
        if let Some((mut child, mut pipe)) = self.guard.take() {
            // "done": the guard leaves the scope alone (removed, or still to be removed by
            // it when it was not empty yet).
            let word: &[u8] = if self.removed { b"done\n" } else { b"kill\n" };
            let _ = pipe.write_all(word);
            drop(pipe);
            let _ = wait_bounded(&mut child, Duration::from_secs(15));
        }
    }
}

/// `cgroup.kill` (Linux 5.14); before it, SIGKILL to each member until none is left.
fn kill_cgroup(dir: &Path) -> std::io::Result<()> {
    match std::fs::write(dir.join("cgroup.kill"), b"1") {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            // The scope's name is unique (our PID and a counter), so a process whose cgroup
            // path ends with it is a member.
            let name = dir
                .file_name()
                .and_then(|n| n.to_str())
                .map(|n| format!("/{n}"))
                .unwrap_or_default();
            let member = |pid: u32| {
                std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|text| {
                    text.lines()
                        .filter_map(|l| l.strip_prefix("0::"))
                        .any(|path| path.ends_with(&name))
                })
            };
            for _ in 0..MAX_KILL_ROUNDS {
                let text = std::fs::read_to_string(dir.join("cgroup.procs"))?;
                let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
                if pids.is_empty() {
                    return Ok(());
                }
                for pid in pids {
                    signal_member(pid, Signal::KILL, member);
                }
            }
            Ok(())
        }
        Err(err) => Err(err),
    }
}

/// Removes the scope (and sub-cgroups the job made) once its members are gone: `rmdir`
/// fails with EBUSY while a live process is in it, so this waits up to 5 s.
fn remove_cgroup(dir: &Path) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let result = remove_tree(dir, 0);
        match result {
            Ok(()) => return Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(err) if Instant::now() >= deadline => return Err(err),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// `rmdir` of a cgroup's sub-cgroups, deepest first, then of itself (a cgroup's files are
/// not files: `rmdir` of the directory removes them).
fn remove_tree(dir: &Path, depth: usize) -> std::io::Result<()> {
    if depth < MAX_CGROUP_DEPTH
        && let Ok(entries) = std::fs::read_dir(dir)
    {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path(), depth + 1)?;
            }
        }
    }
    std::fs::remove_dir(dir)
}

/// Waits for `child` up to `limit`; its status when it exited. A subreaper's other
/// `wait(-1)` may have reaped it already: then ECHILD, taken as gone.
fn wait_bounded(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) | Err(_) => return None,
        }
    }
}

/// The cgroup v2 mount point and the hierarchy path it shows (its root in mountinfo).
fn cgroup2_mount() -> Option<(PathBuf, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mut fields = left.split_whitespace();
        let root = fields.nth(3)?;
        let point = fields.next()?;
        // Octal escapes (`\040` for a space) are not undone: such a mount point is not
        // used.
        if point.contains('\\') || root.contains('\\') {
            return None;
        }
        Some((PathBuf::from(point), root.to_owned()))
    })
}

/// Our own cgroup v2 path (`0::PATH` in `/proc/self/cgroup`).
fn own_cgroup_path() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_owned)
        .filter(|p| p.starts_with('/') && !p.contains("(deleted)"))
}

/// Starts `vramctl __run-guard DIR`, from our own executable, outside the scope and in a
/// process group of its own (the terminal's Ctrl-C is for the job, not for it).
fn spawn_guard(dir: &Path) -> std::io::Result<(Child, std::process::ChildStdin)> {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new("/proc/self/exe")
        .arg(GUARD_ARG)
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .env_clear()
        .spawn()?;
    let pipe = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("no pipe to the guard"))?;
    Ok((child, pipe))
}

/// The guard's whole life: wait until `run` closes the pipe (stdin); unless it said
/// `done`, kill the scope at `dir` and remove it. Acts only on a cgroup v2 directory
/// named like a scope.
pub fn guard_main(dir: &Path) -> std::process::ExitCode {
    let is_scope = dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(SCOPE_PREFIX))
        && rustix::fs::statfs(dir).is_ok_and(|s| {
            // The field's type differs between architectures.
            #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
            let magic = s.f_type as u64;
            magic == CGROUP2_SUPER_MAGIC
        });
    if !is_scope {
        return std::process::ExitCode::from(2);
    }
    let mut said = Vec::new();
    let _ = std::io::stdin().take(64).read_to_end(&mut said);
    if said.starts_with(b"done") {
        return std::process::ExitCode::SUCCESS;
    }
    let _ = kill_cgroup(dir);
    match remove_cgroup(dir) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(_) => std::process::ExitCode::from(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descendant_is_a_member_of_the_subreaper_tree_and_init_is_not() {
        let me = std::process::id();
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep");
        assert!(descends_from(child.id(), me));
        assert!(!descends_from(me, me), "run itself is not its own job");
        assert!(!descends_from(1, me));
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn the_guard_refuses_a_directory_that_is_not_a_scope() {
        let dir = tempfile::tempdir().expect("tempdir");
        let named = dir.path().join(format!("{SCOPE_PREFIX}1.0"));
        std::fs::create_dir(&named).expect("mkdir");
        // Named like one, but not a cgroup: untouched.
        assert_eq!(guard_main(&named), std::process::ExitCode::from(2));
        assert!(named.exists());
    }
}
