//! What /proc says about a PID the driver reported: who owns it, what it runs, how busy it
//! is, where it sits in the process tree and which container it belongs to.
//!
//! NVML gives a PID and a byte count; people need "alice, python train.py, 3 h old, in pod
//! …". A PID NVML reports may not exist in this PID namespace (a container without
//! `--pid=host`): then [`ProcReader::details`] answers `None` and frontends say "not visible
//! here".
//!
//! `/proc/PID/stat` is parsed here rather than through procfs because the kill path's
//! identity check rests on it: field 2 (`comm`) is chosen by the process itself and may hold
//! spaces, parentheses and newlines, so the fields are read after the **last** `)`
//! (proc_pid_stat(5)), and the parse is unit-tested with hostile names.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use procfs::process::Process;
use serde::{Deserialize, Serialize};

/// Who a process is, across PID reuse and reboots: `(boot id, pid, start time)`.
///
/// A PID alone names "whatever has this number now"; the start time (clock ticks after
/// boot, field 22 of /proc/PID/stat) tells a reused PID apart, and the boot id makes the
/// pair unique across reboots when it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProcessIdentity {
    /// `/proc/sys/kernel/random/boot_id` of the boot the process ran in.
    pub boot_id: String,
    /// PID in this namespace.
    pub pid: u32,
    /// Start time in clock ticks after boot.
    pub start_time_ticks: u64,
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), or `None` where /proc lacks it.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
}

/// `PF_KTHREAD` in the `flags` field of /proc/PID/stat (include/linux/sched.h): a kernel
/// thread. It has no user memory, and signalling one is never what a user meant.
pub const PF_KTHREAD: u32 = 0x0020_0000;

/// Inode of the initial PID namespace (`PROC_PID_INIT_INO` in include/linux/proc_ns.h).
pub const INITIAL_PID_NAMESPACE_INODE: u64 = 0xEFFF_FFFC;

/// What the character devices of the NVIDIA driver are called (`/dev/nvidia0`,
/// `/dev/nvidiactl`, `/dev/nvidia-uvm`, ...). A process with one of them open holds (or can
/// hold) a CUDA context, hence GPU memory.
pub const GPU_DEVICE_PREFIX: &str = "/dev/nvidia";

/// Reading /proc failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcError {
    /// No such process in this PID namespace (never was, or exited and was reaped).
    #[error("no process {pid} in this PID namespace")]
    NotFound {
        /// The PID asked about.
        pid: u32,
    },
    /// The file exists but could not be read (permission, I/O).
    #[error("cannot read /proc/{pid}/{file}: {source}")]
    Io {
        /// The PID asked about.
        pid: u32,
        /// The file under /proc/PID.
        file: &'static str,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// The file did not have the expected shape.
    #[error("cannot parse /proc/{pid}/{file}: {reason}")]
    Malformed {
        /// The PID asked about.
        pid: u32,
        /// The file under /proc/PID.
        file: &'static str,
        /// What was wrong.
        reason: String,
    },
}

/// The fields of `/proc/PID/stat` vramctl uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    /// Field 1: the PID (the thread id for a thread's stat).
    pub pid: u32,
    /// Field 2: the executable's name as the process set it (up to 15 bytes; may hold any
    /// byte, so it is read lossily).
    pub comm: String,
    /// Field 3: `R`, `S`, `D`, `Z`, `T`, `t`, `X`, `I`, ...
    pub state: char,
    /// Field 4: the parent's PID (0 for PID 1 and kthreadd, or a parent outside our
    /// namespace).
    pub ppid: u32,
    /// Field 5: process group.
    pub pgrp: i32,
    /// Field 9: `PF_*` flags.
    pub flags: u32,
    /// Field 14: user-mode CPU time in clock ticks.
    pub utime_ticks: u64,
    /// Field 15: kernel-mode CPU time in clock ticks.
    pub stime_ticks: u64,
    /// Field 20: number of threads.
    pub threads: u32,
    /// Field 22: start time in clock ticks after boot.
    pub start_time_ticks: u64,
    /// Field 24: resident set size in pages.
    pub rss_pages: u64,
}

impl Stat {
    /// A kernel thread (`PF_KTHREAD`).
    pub fn is_kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0
    }

    /// Exited but not reaped by its parent (`Z`), or dead (`X`).
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }

    /// User plus kernel CPU time in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        self.utime_ticks.saturating_add(self.stime_ticks)
    }
}

/// Parses `/proc/PID/stat`.
///
/// The fields are taken after the last `)`, because `comm` (field 2, in parentheses) is
/// chosen by the process and may itself contain `)`, spaces or a newline.
///
/// # Errors
/// A reason when the text is not a stat line.
pub fn parse_stat(bytes: &[u8]) -> Result<Stat, String> {
    let open = bytes
        .iter()
        .position(|b| *b == b'(')
        .ok_or("no '(' before the command name")?;
    let close = bytes
        .iter()
        .rposition(|b| *b == b')')
        .filter(|close| *close > open)
        .ok_or("no ')' after the command name")?;
    let pid_text = std::str::from_utf8(&bytes[..open]).map_err(|_| "the pid is not text")?;
    let pid: u32 = pid_text
        .trim()
        .parse()
        .map_err(|_| format!("the pid {:?} is not a number", pid_text.trim()))?;
    let comm = String::from_utf8_lossy(&bytes[open + 1..close]).into_owned();
    let rest = std::str::from_utf8(&bytes[close + 1..]).map_err(|_| "the fields are not text")?;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // fields[0] is field 3 (state); field n is fields[n - 3].
    let field = |n: usize| -> Result<&str, String> {
        fields
            .get(n - 3)
            .copied()
            .ok_or_else(|| format!("field {n} is missing"))
    };
    fn number<T: std::str::FromStr>(text: &str, n: usize) -> Result<T, String> {
        text.parse()
            .map_err(|_| format!("field {n} {text:?} is not a number"))
    }
    let state_text = field(3)?;
    let mut state_chars = state_text.chars();
    let state = match (state_chars.next(), state_chars.next()) {
        (Some(c), None) if c.is_ascii_alphabetic() => c,
        _ => return Err(format!("field 3 {state_text:?} is not a state letter")),
    };
    Ok(Stat {
        pid,
        comm,
        state,
        ppid: number(field(4)?, 4)?,
        pgrp: number(field(5)?, 5)?,
        flags: number(field(9)?, 9)?,
        utime_ticks: number(field(14)?, 14)?,
        stime_ticks: number(field(15)?, 15)?,
        threads: number(field(20)?, 20)?,
        start_time_ticks: number(field(22)?, 22)?,
        rss_pages: number(field(24)?, 24)?,
    })
}

/// Reads and parses `/proc/PID/stat`.
///
/// # Errors
/// [`ProcError::NotFound`] when no such process is visible (also for PID 0 and PIDs that
/// cannot be a `pid_t`), otherwise the read or parse failure.
pub fn read_stat(pid: u32) -> Result<Stat, ProcError> {
    let bytes = read_proc_file(pid, "stat")?;
    let stat = parse_stat(&bytes).map_err(|reason| ProcError::Malformed {
        pid,
        file: "stat",
        reason,
    })?;
    if stat.pid != pid {
        return Err(ProcError::Malformed {
            pid,
            file: "stat",
            reason: format!("it names pid {}", stat.pid),
        });
    }
    Ok(stat)
}

/// The fields of `/proc/PID/status` vramctl uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// Thread group id: the process a thread belongs to (equal to the PID for a process).
    pub tgid: Option<u32>,
    /// Real user id (who started it; what permission checks compare).
    pub uid_real: Option<u32>,
    /// Effective user id.
    pub uid_effective: Option<u32>,
    /// Saved set-user-id.
    pub uid_saved: Option<u32>,
    /// `NSpid:` the PID in each PID namespace from the one /proc was mounted in down to the
    /// process's own; one entry when there is no nesting.
    pub nspid: Vec<u32>,
}

/// Parses `/proc/PID/status` (unknown or malformed lines are skipped).
pub fn parse_status(text: &str) -> Status {
    let mut status = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let numbers = || value.split_ascii_whitespace().map(str::parse::<u32>);
        match key {
            "Tgid" => status.tgid = value.trim().parse().ok(),
            "Uid" => {
                let ids: Vec<Option<u32>> = numbers().map(Result::ok).collect();
                status.uid_real = ids.first().copied().flatten();
                status.uid_effective = ids.get(1).copied().flatten();
                status.uid_saved = ids.get(2).copied().flatten();
            }
            "NSpid" => status.nspid = numbers().filter_map(Result::ok).collect(),
            _ => {}
        }
    }
    status
}

/// Reads and parses `/proc/PID/status`.
///
/// # Errors
/// As [`read_stat`].
pub fn read_status(pid: u32) -> Result<Status, ProcError> {
    let bytes = read_proc_file(pid, "status")?;
    Ok(parse_status(&String::from_utf8_lossy(&bytes)))
}

/// `/proc/PID/cmdline` as one line: the arguments joined by spaces, each byte that is not
/// UTF-8 as `\xHH` ([`vramctl_core::untrusted::from_bytes`]; a command line is whatever bytes its
/// owner chose, and one of them must not hide the whole line), control characters kept
/// as they are (escaped when shown). `None` when it cannot be read.
pub fn read_cmdline(pid: u32) -> Option<String> {
    let bytes = read_proc_file(pid, "cmdline").ok()?;
    Some(cmdline_text(&bytes))
}

/// The arguments of a `cmdline` file (NUL-separated, empty ones dropped) joined by spaces.
pub fn cmdline_text(bytes: &[u8]) -> String {
    bytes
        .split(|&b| b == 0)
        .filter(|arg| !arg.is_empty())
        .map(vramctl_core::untrusted::from_bytes)
        .collect::<Vec<_>>()
        .join(" ")
}

fn read_proc_file(pid: u32, file: &'static str) -> Result<Vec<u8>, ProcError> {
    if pid == 0 || i32::try_from(pid).is_err() {
        return Err(ProcError::NotFound { pid });
    }
    std::fs::read(format!("/proc/{pid}/{file}")).map_err(|source| proc_io(pid, file, source))
}

fn proc_io(pid: u32, file: &'static str, source: std::io::Error) -> ProcError {
    // ESRCH: the task exited between the lookup and the read.
    if source.kind() == std::io::ErrorKind::NotFound || source.raw_os_error() == Some(3) {
        ProcError::NotFound { pid }
    } else {
        ProcError::Io { pid, file, source }
    }
}

use crate::container::ContainerNames;
pub use crate::container::{ContainerInfo, parse_cgroup};

/// CPU use in percent of one core between two readings of a process's
/// [`Stat::cpu_ticks`] taken `elapsed` apart (`ps`: a short interval; the recorder: two
/// ticks). `None` for a zero interval or a count that went backwards (another process).
pub fn cpu_percent(
    before_ticks: u64,
    after_ticks: u64,
    elapsed: Duration,
    ticks_per_second: u64,
) -> Option<f64> {
    let used = after_ticks.checked_sub(before_ticks)?;
    ticks_percent(used, elapsed, ticks_per_second)
}

/// How long a process that started `start_time_ticks` after boot has lived, from
/// `/proc/uptime` as ps(1) computes it: the boot time in whole seconds (`btime`) would put
/// up to a second of error into a young process's age.
pub fn age_from_uptime(start_time_ticks: u64, ticks_per_second: u64) -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/uptime").ok()?;
    let uptime_s: f64 = text.split_whitespace().next()?.parse().ok()?;
    let uptime = Duration::try_from_secs_f64(uptime_s).ok()?;
    let started =
        Duration::from_millis(start_time_ticks.checked_mul(1000)? / ticks_per_second.max(1));
    uptime.checked_sub(started)
}

/// CPU use in percent of one core averaged over the process's whole life (what ps(1)
/// shows as `%CPU`).
pub fn cpu_percent_lifetime(cpu_ticks: u64, age: Duration, ticks_per_second: u64) -> Option<f64> {
    ticks_percent(cpu_ticks, age, ticks_per_second)
}

fn ticks_percent(ticks: u64, over: Duration, ticks_per_second: u64) -> Option<f64> {
    if over.is_zero() || ticks_per_second == 0 {
        return None;
    }
    // Tick counts stay far below 2^53, so the float conversion is exact.
    #[allow(clippy::cast_precision_loss)]
    let seconds = ticks as f64 / ticks_per_second as f64;
    Some(100.0 * seconds / over.as_secs_f64())
}

/// Every PID visible in this namespace's /proc, ascending.
pub fn all_pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// The direct children of `pid`, ascending, from `/proc/PID/task/*/children` (every
/// thread's children: a child's parent is the thread that forked it). Falls back to a scan
/// of every process's parent where the kernel lacks `CONFIG_PROC_CHILDREN`.
pub fn children(pid: u32) -> Vec<u32> {
    let mut found: Vec<u32> = Vec::new();
    let mut any_file = false;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.filter_map(Result::ok) {
            if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                any_file = true;
                found.extend(
                    text.split_ascii_whitespace()
                        .filter_map(|s| s.parse::<u32>().ok()),
                );
            }
        }
    }
    if !any_file {
        found = all_pids()
            .into_iter()
            .filter(|child| read_stat(*child).is_ok_and(|s| s.ppid == pid))
            .collect();
    }
    found.sort_unstable();
    found.dedup();
    found
}

/// Every descendant of `pid` as `(pid, parent)`, parents before their children (depth
/// first), without `pid` itself. A process seen twice (it moved while we walked) is listed
/// once.
pub fn descendants(pid: u32) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut seen = HashSet::from([pid]);
    let mut stack: Vec<(u32, u32)> = children(pid).into_iter().rev().map(|c| (c, pid)).collect();
    while let Some((child, parent)) = stack.pop() {
        if !seen.insert(child) {
            continue;
        }
        out.push((child, parent));
        stack.extend(children(child).into_iter().rev().map(|c| (c, child)));
    }
    out
}

/// The files open in `pid` whose path starts with `prefix`, sorted and deduplicated.
///
/// # Errors
/// [`ProcError::NotFound`] for a process that is not there; [`ProcError::Io`] when its
/// descriptors cannot be read (another user's process, unless we are root).
pub fn open_files_with_prefix(pid: u32, prefix: &str) -> Result<Vec<String>, ProcError> {
    if pid == 0 || i32::try_from(pid).is_err() {
        return Err(ProcError::NotFound { pid });
    }
    let entries =
        std::fs::read_dir(format!("/proc/{pid}/fd")).map_err(|e| proc_io(pid, "fd", e))?;
    let mut files: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|target| target.to_str().map(str::to_owned))
        .filter(|target| target.starts_with(prefix))
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

/// The NVIDIA device files (`/dev/nvidia*`) `pid` has open: non-empty means it holds or can
/// hold a CUDA context.
///
/// # Errors
/// As [`open_files_with_prefix`].
pub fn gpu_device_files(pid: u32) -> Result<Vec<String>, ProcError> {
    open_files_with_prefix(pid, GPU_DEVICE_PREFIX)
}

/// Every process whose descriptors we may read that has a file under `prefix` open, with
/// those files: "who still holds the GPU" (`fuser -v /dev/nvidia*`).
pub fn holders_of(prefix: &str) -> Vec<(u32, Vec<String>)> {
    all_pids()
        .into_iter()
        .filter_map(|pid| {
            let files = open_files_with_prefix(pid, prefix).ok()?;
            (!files.is_empty()).then_some((pid, files))
        })
        .collect()
}

/// The PID namespace this process runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PidNamespace {
    /// Inode of `/proc/self/ns/pid`, when readable.
    pub inode: Option<u64>,
    /// Our `NSpid:` entries: more than one when /proc belongs to an outer namespace.
    pub nspid: Vec<u32>,
}

impl PidNamespace {
    /// Reads our own namespace.
    pub fn current() -> Self {
        let inode = std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino());
        let nspid = std::fs::read_to_string("/proc/self/status")
            .map(|t| parse_status(&t).nspid)
            .unwrap_or_default();
        Self { inode, nspid }
    }

    /// Whether we are in the initial (host) PID namespace, where NVML's PIDs are ours.
    /// Unknown counts as not: the safe answer for anything that signals.
    pub fn is_initial(&self) -> bool {
        self.inode == Some(INITIAL_PID_NAMESPACE_INODE) && self.nspid.len() <= 1
    }

    /// Whether this /proc lists the initial namespace's PIDs, which are what NVML reports:
    /// in the host namespace, and in a namespace of our own whose /proc is still the
    /// host's (`unshare --pid --fork` without `--mount-proc`: more than one `NSpid:` entry,
    /// and /proc's PID 1 is in the initial namespace). Unknown counts as not: NVML's PIDs
    /// are then not looked up here, which is never a wrong answer.
    pub fn proc_shows_host_pids(&self) -> bool {
        self.is_initial()
            || (self.nspid.len() > 1
                && pid_namespace_of(1).ok() == Some(INITIAL_PID_NAMESPACE_INODE))
    }

    /// Whether our /proc is our own namespace's (one `NSpid:` entry): PIDs of this
    /// namespace are found there under their own numbers.
    pub fn proc_is_own(&self) -> bool {
        self.nspid.len() == 1
    }
}

/// The inode of `pid`'s PID namespace (`/proc/PID/ns/pid`, as this /proc names `pid`).
///
/// # Errors
/// [`ProcError::NotFound`] for a process that is not there; [`ProcError::Io`] when the link
/// cannot be read (another user's process, unless we are root).
pub fn pid_namespace_of(pid: u32) -> Result<u64, ProcError> {
    if pid == 0 || i32::try_from(pid).is_err() {
        return Err(ProcError::NotFound { pid });
    }
    // The link is the kernel's (nsfs), not a file another user can place.
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .map(|m| m.ino())
        .map_err(|e| proc_io(pid, "ns/pid", e))
}

/// A process as /proc describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessDetails {
    /// PID in our namespace.
    pub pid: u32,
    /// Real user id.
    pub uid: Option<u32>,
    /// User name for `uid`, when the user database knows it.
    pub user: Option<String>,
    /// Command line joined with spaces, or `[comm]` when it has none (kernel threads,
    /// zombies).
    pub command: String,
    /// The name in /proc/PID/stat (`comm`).
    pub comm: Option<String>,
    /// Parent PID.
    pub ppid: Option<u32>,
    /// State letter from /proc/PID/stat (`R`, `S`, `D`, `Z`, ...).
    pub state: Option<char>,
    /// Start time in clock ticks after boot (field 22 of /proc/PID/stat): with the boot id,
    /// the identity of the process.
    pub start_time_ticks: Option<u64>,
    /// Start time as wall-clock ms since the Unix epoch (boot time + start ticks).
    pub started_at_unix_ms: Option<i64>,
    /// User plus kernel CPU time so far, in clock ticks; two readings give CPU %
    /// ([`cpu_percent`]).
    pub cpu_ticks: Option<u64>,
    /// Resident memory on the host.
    pub rss_bytes: Option<u64>,
    /// Number of threads.
    pub threads: Option<u32>,
    /// A kernel thread (`PF_KTHREAD`).
    pub kernel_thread: bool,
    /// Container id and pod UID from the cgroup path.
    pub container: ContainerInfo,
    /// The Slurm job it runs in ([`crate::slurm`]), when its cgroup path or environment
    /// names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<crate::slurm::SlurmJob>,
}

impl ProcessDetails {
    /// Exited and waiting for its parent to reap it.
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, Some('Z' | 'X' | 'x'))
    }

    /// The identity token of this process under `boot_id`, when its start time is known.
    pub fn identity(&self, boot_id: &str) -> Option<ProcessIdentity> {
        Some(ProcessIdentity {
            boot_id: boot_id.to_owned(),
            pid: self.pid,
            start_time_ticks: self.start_time_ticks?,
        })
    }
}

/// Reads /proc, caching user names (a lookup can go through NSS and the network), container
/// names (read from the runtimes' state files) and the machine's constants (clock tick
/// rate, page size, boot time).
#[derive(Debug)]
pub struct ProcReader {
    users: HashMap<u32, Option<String>>,
    container_names: ContainerNames,
    /// The origin of the container-name cache's clock (when an unnamed container is retried).
    created: std::time::Instant,
    ticks_per_second: u64,
    page_size: u64,
    boot_time_secs: Option<u64>,
}

impl Default for ProcReader {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcReader {
    /// A reader with empty caches; container state is read under
    /// [`crate::container::ROOT_ENV`] (`/` by default).
    pub fn new() -> Self {
        Self {
            users: HashMap::new(),
            container_names: ContainerNames::from_env(),
            created: std::time::Instant::now(),
            ticks_per_second: procfs::ticks_per_second(),
            page_size: procfs::page_size(),
            boot_time_secs: procfs::boot_time_secs().ok(),
        }
    }

    /// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of start and CPU times.
    pub fn ticks_per_second(&self) -> u64 {
        self.ticks_per_second
    }

    /// Bytes per page, the unit of resident memory in `/proc/PID/stat`.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// What /proc says about `pid`, or `None` when no such process is visible here.
    pub fn details(&mut self, pid: u32) -> Option<ProcessDetails> {
        let stat = match read_stat(pid) {
            Ok(stat) => Some(stat),
            Err(ProcError::NotFound { .. }) => return None,
            Err(_) => None,
        };
        let process = Process::new(i32::try_from(pid).ok()?).ok()?;
        let status = read_status(pid).ok();
        let uid = status
            .as_ref()
            .and_then(|s| s.uid_real)
            .or_else(|| process.uid().ok());
        let user = uid.and_then(|uid| self.user_name(uid));
        let command = match read_cmdline(pid) {
            Some(command) if !command.is_empty() => command,
            _ => format!("[{}]", stat.as_ref().map_or("?", |s| s.comm.as_str())),
        };
        let mut container = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .map(|t| parse_cgroup(&t))
            .unwrap_or_default();
        let now_ms = u64::try_from(self.created.elapsed().as_millis()).unwrap_or(u64::MAX);
        container.name = self.container_names.name(&container, now_ms);
        Some(ProcessDetails {
            pid,
            uid,
            user,
            command,
            comm: stat.as_ref().map(|s| s.comm.clone()),
            ppid: stat.as_ref().map(|s| s.ppid),
            state: stat.as_ref().map(|s| s.state),
            start_time_ticks: stat.as_ref().map(|s| s.start_time_ticks),
            started_at_unix_ms: stat
                .as_ref()
                .and_then(|s| self.started_at_unix_ms(s.start_time_ticks)),
            cpu_ticks: stat.as_ref().map(Stat::cpu_ticks),
            rss_bytes: stat
                .as_ref()
                .map(|s| s.rss_pages.saturating_mul(self.page_size)),
            threads: stat.as_ref().map(|s| s.threads),
            kernel_thread: stat.as_ref().is_some_and(Stat::is_kernel_thread),
            container,
            slurm: crate::slurm::job_of(pid),
        })
    }

    /// `(start time, cpu ticks)` of `pid` now: a second reading for [`cpu_percent`]; the
    /// start time tells whether it is still the same process.
    pub fn cpu_reading(&self, pid: u32) -> Option<(u64, u64)> {
        read_stat(pid)
            .ok()
            .map(|s| (s.start_time_ticks, s.cpu_ticks()))
    }

    /// Wall-clock start of a process that started `start_time_ticks` after boot.
    pub fn started_at_unix_ms(&self, start_time_ticks: u64) -> Option<i64> {
        let boot_ms = i64::try_from(self.boot_time_secs?.checked_mul(1000)?).ok()?;
        let after_ms = i64::try_from(
            u128::from(start_time_ticks) * 1000 / u128::from(self.ticks_per_second.max(1)),
        )
        .ok()?;
        boot_ms.checked_add(after_ms)
    }

    /// The name of user `uid`, cached.
    pub fn user_name(&mut self, uid: u32) -> Option<String> {
        self.users
            .entry(uid)
            .or_insert_with(|| {
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                    .ok()
                    .flatten()
                    .map(|u| u.name)
            })
            .clone()
    }
}

/// The uid of the user called `name` in the user database (NSS), `None` when no user has
/// that name.
pub fn uid_of_user(name: &str) -> Option<u32> {
    nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
}

/// Start time and CPU time of a process, from one read of `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTime {
    /// Start time in clock ticks after boot (field 22): with the boot id, the identity.
    pub start_time_ticks: u64,
    /// User plus system CPU time in clock ticks (fields 14 and 15).
    pub cpu_ticks: u64,
}

/// Start time and CPU time of `pid`, or `None` when it is not visible here: the fields of
/// [`read_stat`] the recorder and the live analysis need for every GPU process.
pub fn cpu_time_ticks(pid: u32) -> Option<CpuTime> {
    read_stat(pid).ok().map(|s| CpuTime {
        start_time_ticks: s.start_time_ticks,
        cpu_ticks: s.cpu_ticks(),
    })
}

/// What the caller read from /proc about a PID the snapshot lists. `Default` (everything
/// `None`) for a process /proc cannot see (another PID namespace).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessFacts {
    /// Start time in clock ticks after boot (field 22 of /proc/PID/stat). With the PID it
    /// names the process: a new value under a known PID starts a new series. `None`: the
    /// PID alone names it (a reused PID then cannot be told apart).
    pub start_time_ticks: Option<u64>,
    /// The same start as a wall-clock time: warm-up is counted from it. `None`: from the
    /// first sample of the series.
    pub started_at_unix_ms: Option<i64>,
    /// Cumulative user + system CPU time in ms (`(utime + stime) × 1000 / ticks per
    /// second`): the idle evidence that works on a shared, busy GPU.
    pub cpu_time_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_process_is_visible() {
        let mut reader = ProcReader::new();
        let me = reader.details(std::process::id()).expect("we exist");
        assert_eq!(me.pid, std::process::id());
        assert!(me.start_time_ticks.is_some());
        assert!(me.uid.is_some());
        assert!(!me.command.is_empty());
        assert!(!me.kernel_thread);
        assert!(me.rss_bytes.is_some_and(|rss| rss > 0));
        assert!(me.threads.is_some_and(|t| t >= 1));
        let age = age_from_uptime(
            me.start_time_ticks.expect("stat"),
            reader.ticks_per_second(),
        )
        .expect("uptime readable");
        assert!(age < Duration::from_secs(24 * 3600), "{age:?}");
        let started = me.started_at_unix_ms.expect("boot time known");
        let now = vramctl_core::clock::Clock::now_unix_ms(&vramctl_core::clock::SystemClock);
        assert!(started <= now + 1000, "{started} vs {now}");
    }

    #[test]
    fn a_command_line_that_is_not_utf8_is_read_with_its_bytes_named() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::process::CommandExt;
        // Before, one such byte made the whole line unreadable and `[comm]` stood for it.
        assert_eq!(
            cmdline_text(b"python3\0tr\xc3\xa4in.py\0--tag\0\xff\x9b2J\0\0"),
            "python3 träin.py --tag \\xff\\x9b2J"
        );
        assert_eq!(cmdline_text(b""), "");
        let mut child = std::process::Command::new("sleep")
            .arg0(std::ffi::OsStr::from_bytes(b"sle\xffep\x1b[2K"))
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        // The command line is there once exec is done; wait for it (bounded).
        let mut command = String::new();
        for _ in 0..200 {
            command = ProcReader::new()
                .details(pid)
                .map(|d| d.command)
                .unwrap_or_default();
            if command.ends_with(" 30") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        // Stored raw (the ESC stays, JSON escapes it); shown escaped.
        assert_eq!(command, "sle\\xffep\x1b[2K 30");
        assert_eq!(
            vramctl_core::untrusted::escape(&command),
            "sle\\xffep\\u{1b}[2K 30"
        );
    }

    #[test]
    fn user_names_resolve_to_uids() {
        assert_eq!(uid_of_user("root"), Some(0));
        assert_eq!(uid_of_user("no-such-user-vramctl"), None);
    }

    #[test]
    fn boot_id_is_a_uuid() {
        let id = boot_id().expect("linux has a boot id");
        assert_eq!(id.len(), 36, "{id}");
    }

    #[test]
    fn a_pid_that_cannot_exist_is_none() {
        let mut reader = ProcReader::new();
        assert_eq!(reader.details(u32::MAX), None);
        assert_eq!(reader.details(0), None);
        assert!(matches!(read_stat(0), Err(ProcError::NotFound { pid: 0 })));
        assert!(matches!(
            read_stat(u32::MAX),
            Err(ProcError::NotFound { .. })
        ));
    }

    /// A stat line as the kernel writes it, with `comm` chosen by the caller.
    fn stat_line(comm: &[u8]) -> Vec<u8> {
        let mut line = b"4242 (".to_vec();
        line.extend_from_slice(comm);
        // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
        // cutime cstime prio nice threads itreal starttime vsize rss ...
        line.extend_from_slice(
            b") S 17 4242 4242 0 -1 4194560 120 0 3 0 250 50 0 0 20 0 4 0 987654 123456789 2048 \
              18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n",
        );
        line
    }

    #[test]
    fn stat_fields_come_after_the_last_paren() {
        for comm in [
            &b"python"[..],
            b"a) (b",
            b"a) R 1 1 1",
            b"my prog",
            b"new\nline",
            b")",
            b"((",
            b"",
            b"\xff\xfe",
        ] {
            let stat = parse_stat(&stat_line(comm)).unwrap_or_else(|e| panic!("{comm:?}: {e}"));
            assert_eq!(stat.pid, 4242);
            assert_eq!(stat.comm, String::from_utf8_lossy(comm), "{comm:?}");
            assert_eq!(stat.state, 'S');
            assert_eq!(stat.ppid, 17);
            assert_eq!(stat.pgrp, 4242);
            assert_eq!(stat.flags, 4_194_560);
            assert_eq!(stat.cpu_ticks(), 300);
            assert_eq!(stat.threads, 4);
            assert_eq!(stat.start_time_ticks, 987_654);
            assert_eq!(stat.rss_pages, 2048);
            assert!(!stat.is_kernel_thread());
            assert!(!stat.is_zombie());
        }
    }

    #[test]
    fn stat_of_a_kernel_thread_and_a_zombie() {
        let kthreadd = b"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 3 0 0 20 0 1 0 30 0 0 \
                         18446744073709551615 0 0 0 0 0 0 0 2147483647 0 1 0 0 0 0 0 0 0 0 0\n";
        let stat = parse_stat(kthreadd).unwrap();
        assert!(stat.is_kernel_thread());
        assert_eq!(stat.ppid, 0);
        let zombie = String::from_utf8(stat_line(b"sleep"))
            .unwrap()
            .replace(") S ", ") Z ");
        assert!(parse_stat(zombie.as_bytes()).unwrap().is_zombie());
    }

    #[test]
    fn malformed_stat_lines_are_errors_not_panics() {
        for bad in [
            &b""[..],
            b"4242",
            b"4242 (x",
            b"x (y) S 1",
            b"4242 (x) S",
            b"4242 (x) SS 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
            b"4242 (x) S notanumber 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
            b")4242 (x",
        ] {
            assert!(
                parse_stat(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn status_ids_and_nspid() {
        let text = "Name:\tpython\nTgid:\t4242\nPid:\t4243\nPPid:\t1\n\
                    Uid:\t1000\t1001\t1002\t1003\nGid:\t5\t5\t5\t5\nNSpid:\t4243\t12\n";
        let status = parse_status(text);
        assert_eq!(status.tgid, Some(4242));
        assert_eq!(status.uid_real, Some(1000));
        assert_eq!(status.uid_effective, Some(1001));
        assert_eq!(status.uid_saved, Some(1002));
        assert_eq!(status.nspid, [4243, 12]);
        assert_eq!(parse_status("garbage\nUid: x\n"), Status::default());
    }

    #[test]
    fn cgroup_paths_name_containers_and_pods() {
        let id = "3f0c2b7a9d8e4f61a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70819";
        assert_eq!(id.len(), 64);
        let uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        let systemd_uid = uid.replace('-', "_");
        let cases = [
            (
                format!("0::/system.slice/docker-{id}.scope\n"),
                Some(id),
                None,
            ),
            (format!("12:memory:/docker/{id}\n"), Some(id), None),
            (
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd_uid}.slice/cri-containerd-{id}.scope\n"
                ),
                Some(id),
                Some(uid),
            ),
            (
                format!("11:devices:/kubepods/besteffort/pod{uid}/{id}\n"),
                Some(id),
                Some(uid),
            ),
            (
                format!("0::/machine.slice/libpod-{id}.scope/container\n"),
                Some(id),
                None,
            ),
            (format!("0::/crio-{id}.scope\n"), Some(id), None),
            (
                "0::/user.slice/user-1000.slice/session-3.scope\n".into(),
                None,
                None,
            ),
            // 63 and 65 hex digits are not container ids.
            (format!("0::/docker-{}.scope\n", &id[1..]), None, None),
            (format!("0::/docker-{id}a.scope\n"), None, None),
            ("".into(), None, None),
            ("no colons at all\n".into(), None, None),
        ];
        for (text, container, pod) in cases {
            let info = parse_cgroup(&text);
            assert_eq!(info.container_id.as_deref(), container, "{text}");
            assert_eq!(info.pod_uid.as_deref(), pod, "{text}");
        }
    }

    #[test]
    fn cpu_percent_from_two_readings_or_a_lifetime() {
        assert_eq!(
            cpu_percent(100, 150, Duration::from_millis(500), 100),
            Some(100.0)
        );
        assert_eq!(
            cpu_percent(100, 110, Duration::from_secs(1), 100),
            Some(10.0)
        );
        // A count that went down is another process; no interval, no answer.
        assert_eq!(cpu_percent(150, 100, Duration::from_secs(1), 100), None);
        assert_eq!(cpu_percent(1, 2, Duration::ZERO, 100), None);
        assert_eq!(
            cpu_percent_lifetime(600, Duration::from_secs(60), 100),
            Some(10.0)
        );
        // Several cores: above 100 %.
        assert_eq!(
            cpu_percent(0, 400, Duration::from_secs(1), 100),
            Some(400.0)
        );
    }

    #[test]
    fn children_and_descendants_of_a_real_tree() {
        // sh -> (sh -> sleep), sleep: a grandchild is reached. The inner shell prints the
        // PID of its sleep once it started it, so the tree is complete when we read it.
        // The root says "r" once it started both children; the whole tree exists when both
        // lines were read.
        let mut root = std::process::Command::new("sh")
            .args([
                "-c",
                "sh -c 'sleep 30 & echo g $!; wait' & sleep 30 & echo r; wait",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(root.stdout.take().expect("piped")));
        let mut grandchild = None;
        let mut root_ready = false;
        while grandchild.is_none() || !root_ready {
            let line = lines.next().expect("a line").expect("read");
            match line.split_once(' ') {
                Some(("g", pid)) => grandchild = Some(pid.parse::<u32>().expect("a pid")),
                _ => root_ready |= line == "r",
            }
        }
        let grandchild = grandchild.expect("read above");
        let root_pid = root.id();
        let tree = descendants(root_pid);
        let pids: Vec<u32> = tree.iter().map(|(p, _)| *p).collect();
        assert!(pids.contains(&grandchild), "{tree:?}");
        let (_, middle) = tree.iter().find(|(p, _)| *p == grandchild).expect("listed");
        assert!(children(root_pid).contains(middle), "{tree:?}");
        let position = |pid: u32| pids.iter().position(|p| *p == pid);
        assert!(position(*middle) < position(grandchild), "parents first");
        assert_eq!(children(root_pid).len(), 2, "{tree:?}");
        // Tidy up: kill the whole tree.
        for (pid, _) in tree.iter().rev() {
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .stderr(std::process::Stdio::null())
                .status();
        }
        root.kill().expect("kill");
        root.wait().expect("wait");
    }

    #[test]
    fn open_files_are_found_by_prefix() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dir = dir.path();
        let path = dir.join("nvidia-test-device");
        let file = std::fs::File::create(&path).expect("create");
        let prefix = dir.join("nvidia").to_string_lossy().into_owned();
        let found = open_files_with_prefix(std::process::id(), &prefix).expect("our fds");
        assert_eq!(found, [path.to_string_lossy().into_owned()]);
        assert!(
            holders_of(&prefix)
                .iter()
                .any(|(pid, _)| *pid == std::process::id())
        );
        drop(file);
        assert!(
            open_files_with_prefix(std::process::id(), &prefix)
                .expect("our fds")
                .is_empty()
        );
        assert!(matches!(
            open_files_with_prefix(0, "/"),
            Err(ProcError::NotFound { .. })
        ));
    }

    #[test]
    fn our_namespace_is_read() {
        let ns = PidNamespace::current();
        assert!(ns.inode.is_some());
        assert!(!ns.nspid.is_empty());
        let host = PidNamespace {
            inode: Some(INITIAL_PID_NAMESPACE_INODE),
            nspid: vec![7],
        };
        assert!(host.is_initial());
        let nested = PidNamespace {
            inode: Some(INITIAL_PID_NAMESPACE_INODE),
            nspid: vec![7, 1],
        };
        assert!(!nested.is_initial());
        let container = PidNamespace {
            inode: Some(4_026_532_000),
            nspid: vec![1],
        };
        assert!(!container.is_initial());
        let unknown = PidNamespace {
            inode: None,
            nspid: vec![],
        };
        assert!(!unknown.is_initial(), "unknown is not initial");
        assert!(!unknown.proc_shows_host_pids());
        assert!(container.proc_is_own() && !nested.proc_is_own());
        assert!(host.proc_shows_host_pids());
    }

    #[test]
    fn our_namespace_is_the_one_proc_names_for_us() {
        let ours = pid_namespace_of(std::process::id()).expect("we exist");
        assert_eq!(Some(ours), PidNamespace::current().inode);
        assert!(matches!(
            pid_namespace_of(0),
            Err(ProcError::NotFound { .. })
        ));
    }

    #[test]
    fn our_cpu_time_is_read() {
        let me = cpu_time_ticks(std::process::id()).expect("we exist");
        let details = ProcReader::new()
            .details(std::process::id())
            .expect("we exist");
        assert_eq!(Some(me.start_time_ticks), details.start_time_ticks);
        assert_eq!(cpu_time_ticks(u32::MAX), None);
    }

    /// The parser's answer as a `(container, pod)` pair.
    fn ids(text: &str) -> (Option<String>, Option<String>) {
        let info = parse_cgroup(text);
        (info.container_id, info.pod_uid)
    }

    #[test]
    fn kubernetes_systemd_driver_cgroup() {
        let text = "0::/kubepods.slice/kubepods-burstable.slice/\
                    kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/\
                    cri-containerd-4c0ffee01234567890abcdef1234567890abcdef1234567890abcdef12345678.scope\n";
        assert_eq!(
            ids(text),
            (
                Some("4c0ffee01234567890abcdef1234567890abcdef1234567890abcdef12345678".into()),
                Some("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b".into())
            )
        );
    }

    #[test]
    fn docker_cgroupfs_and_plain_host() {
        let docker =
            "12:memory:/docker/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n";
        assert_eq!(
            ids(docker).0.as_deref(),
            Some("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
        );
        let pod = "0::/kubepods/besteffort/pod6f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/\
                   89abcdef0123456789abcdef0123456789abcdef0123456789abcdef01234567\n";
        assert_eq!(
            ids(pod).1.as_deref(),
            Some("6f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b")
        );
        assert_eq!(
            ids("0::/user.slice/user-1000.slice/session-2.scope\n"),
            (None, None)
        );
    }
}

#[cfg(test)]
mod cgroup_tests {
    use super::*;

    fn ids(text: &str) -> (Option<String>, Option<String>) {
        let info = parse_cgroup(text);
        (info.container_id, info.pod_uid)
    }

    const ID: &str = "3f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

    #[test]
    fn the_cgroup_v2_path_is_kept_whole() {
        let text = "12:cpu,cpuacct:/v1/ignored\n0::/user.slice/user-1000.slice/session-3.scope\n";
        assert_eq!(
            parse_cgroup(text).cgroup.as_deref(),
            Some("/user.slice/user-1000.slice/session-3.scope")
        );
        // cgroup v1 only: no v2 path.
        assert_eq!(parse_cgroup("4:memory:/docker/x\n").cgroup, None);
    }

    #[test]
    fn kubernetes_systemd_driver() {
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod1f2e3d4c_5b6a_7980_a1b2_c3d4e5f60718.slice/\
             cri-containerd-{ID}.scope\n"
        );
        assert_eq!(
            ids(&text),
            (
                Some(ID.to_owned()),
                Some("1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718".to_owned())
            )
        );
    }

    #[test]
    fn kubernetes_cgroupfs_driver_v1() {
        let text = format!(
            "12:memory:/kubepods/besteffort/pod1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718/{ID}\n\
             1:name=systemd:/kubepods/besteffort/pod1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718/{ID}\n"
        );
        let (container, pod) = ids(&text);
        assert_eq!(container.as_deref(), Some(ID));
        assert_eq!(pod.as_deref(), Some("1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718"));
    }

    #[test]
    fn docker_without_kubernetes() {
        let text = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(ids(&text), (Some(ID.to_owned()), None));
    }

    #[test]
    fn host_process_has_neither() {
        let text = "0::/user.slice/user-1000.slice/session-3.scope\n";
        assert_eq!(ids(text), (None, None));
        assert_eq!(ids(""), (None, None));
    }
}
