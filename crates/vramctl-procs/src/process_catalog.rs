//! The process catalog: what /proc says about the processes NVML lists, kept per process
//! identity `(boot id, pid, start time)` under one refresh policy.
//!
//! Every frontend that joins NVML's PIDs with /proc wants the same facts at different
//! rates: the recorder writes identity and metadata once and CPU time every 10 s, the live
//! analysis wants CPU time as idle evidence, `top` and the exporter want user, command and
//! container labels. Reading them per tick costs kernel time that grows with the number of
//! processes (a `/proc/PID/stat` read walks every thread of the process to sum its CPU
//! time; a PyTorch process has dozens), so [`ProcessCatalog`] reads:
//!
//! - **static facts** (user, command line, cgroup's container and pod, start time) once
//!   per identity;
//! - **`/proc/PID/stat`** (CPU time, state, parent, threads, RSS) at most once per
//!   [`RefreshPolicy::stat_every_ms`] per process, and only when a consumer asks for it
//!   ([`ProcessCatalog::stat`]) or the identity cannot be proved otherwise (below);
//! - **nothing else per tick**, except one `epoll_wait(2)` over the pidfds of every process
//!   watched.
//!
//! ## Why a PID still names the same process, cheaply
//!
//! A PID is reused only after its process has exited and been reaped. A pidfd
//! (`pidfd_open(2)`, Linux 5.3) refers to one process, not to a number, and becomes
//! readable once that process has exited. So each watched process is pinned with a pidfd
//! when it is first seen (right before its start time is read, so the facts read belong to
//! the pinned process unless it exited in between, which the first check catches). The
//! pidfds are registered with one epoll instance, and each tick one `epoll_wait` with a
//! zero timeout tells which processes exited: one syscall whose cost does not grow with the
//! number of processes (a `poll(2)` over the pidfds cost about 2 µs per process;
//! re-reading start times costs three syscalls per process, `openat`, `read`, `close`,
//! plus the walk over the process's threads that `/proc/PID/stat` does). While a pidfd is
//! not readable its PID cannot have been reused, so the identity is proved without reading
//! /proc. When a pidfd turns
//! readable, `/proc/PID/stat` is read at once: a different start time is a new process
//! under the old PID (its facts are read afresh); the same start time (a zombie) or no
//! entry at all (reaped, while the driver still lists it for a moment) is the exited
//! process itself, which keeps its identity, no longer pinned. A PID gone from /proc is
//! held by no process of our namespace, so nothing says it names another process; a
//! reuse shows in /proc with another start time at the next check.
//!
//! Without a pidfd (a kernel before 5.3, a seccomp filter refusing `pidfd_open`, more than
//! [`RefreshPolicy::max_pinned`] processes, an exited process), the identity is re-checked
//! by reading the start time in `/proc/PID/stat` at most once per `stat_every_ms`: a PID
//! reused within that second is then attributed to the old process until the next check.
//! Re-reading the start time only when NVML's process list changes would be cheaper
//! still, but misses exactly that case with no bound: a PID listed in two consecutive
//! ticks may belong to two processes.
//!
//! A process /proc cannot see (another PID namespace) is named by the driver and keyed by
//! its PID alone; it is looked for in /proc again every
//! [`RefreshPolicy::invisible_every_ms`] (10 s, the recorder's old cadence).
//!
//! Reading /proc goes through the [`ProcSource`] seam ([`LiveProc`] in production), so the
//! policy is tested on a scripted table: reuse, exits, zombies, invisible PIDs.

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use rustix::event::{PollFd, PollFlags, Timespec, epoll, poll};

use crate::procinfo::ProcessFacts;
use crate::procinfo::{
    ContainerInfo, ProcError, ProcReader, ProcessDetails, ProcessIdentity, Stat, read_stat,
};
use vramctl_core::types::Snapshot;

/// Where a catalog's facts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FactsSource {
    /// /proc (user, command line, container, start and CPU time); the driver's process
    /// name for a PID /proc cannot see.
    #[default]
    Proc,
    /// Only the driver's process name, read once per PID: a daemon outside the host's PID
    /// namespace, where /proc would describe other processes under the same numbers.
    Driver,
    /// Nothing beyond the PID.
    Nothing,
}

/// How often what changes is re-read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefreshPolicy {
    /// `/proc/PID/stat` of one process is read at most this often (tick time, ms).
    pub stat_every_ms: i64,
    /// Most processes pinned with a pidfd at once (each holds a file descriptor); the others
    /// have their identity re-checked by reading their start time every `stat_every_ms`.
    pub max_pinned: usize,
    /// A PID /proc cannot see is looked for again this often: it only becomes visible if
    /// its number is reused by a process of our namespace.
    pub invisible_every_ms: i64,
}

/// CPU time from /proc moves in clock ticks (10 ms) and the analysis judges it over 10 s
/// windows (`analysis::idle`), so a reading per second is all any consumer can use; 256
/// pidfds stay far below the usual 1,024 open files a process may have.
impl Default for RefreshPolicy {
    fn default() -> Self {
        Self {
            stat_every_ms: 1000,
            max_pinned: 256,
            invisible_every_ms: 10_000,
        }
    }
}

/// An opaque handle on a pinned process, issued by a [`ProcSource`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PinId(u64);

/// How the catalog reads processes. [`LiveProc`] reads /proc; tests script one.
pub trait ProcSource: Send + std::fmt::Debug {
    /// Pins the process now numbered `pid` (a pidfd), `None` when that is not possible.
    fn pin(&mut self, pid: u32) -> Option<PinId>;
    /// Releases a pin.
    fn unpin(&mut self, pin: PinId);
    /// Which of `pins` belong to processes that have exited (one syscall for all).
    fn exited(&mut self, pins: &[PinId]) -> Vec<PinId>;
    /// `/proc/PID/stat`.
    ///
    /// # Errors
    /// [`ProcError::NotFound`] when no such process is visible.
    fn stat(&mut self, pid: u32) -> Result<Stat, ProcError>;
    /// The static facts: user, command line, container (and the rest of `details`).
    fn details(&mut self, pid: u32) -> Option<ProcessDetails>;
    /// The wall-clock start of a process that started `start_time_ticks` after boot.
    fn started_at_unix_ms(&self, start_time_ticks: u64) -> Option<i64>;
    /// Clock ticks per second.
    fn ticks_per_second(&self) -> u64;
    /// Bytes per page (resident memory is counted in pages).
    fn page_size(&self) -> u64;
}

/// [`ProcSource`] over this system's /proc, with pidfds watched by one epoll instance.
///
/// The pidfds are registered with an epoll instance when they are opened, so finding the
/// processes that exited is one `epoll_wait` with a zero timeout, whose cost does not grow
/// with the number of processes watched (`poll(2)` over 30 pidfds cost about 2 µs each,
/// 60 µs a tick, on the development machine). Where epoll cannot be used, `poll` is.
#[derive(Debug)]
pub struct LiveProc {
    reader: ProcReader,
    pins: HashMap<PinId, OwnedFd>,
    next_pin: u64,
    /// `pidfd_open` failed with ENOSYS or EPERM once: the kernel or a sandbox refuses
    /// them, so they are not asked for again.
    pidfds_refused: bool,
    /// The epoll instance every pidfd is registered with; `None` before the first pin,
    /// `Some(None)` when epoll failed (then `poll` is used).
    epoll: Option<Option<OwnedFd>>,
}

impl Default for LiveProc {
    fn default() -> Self {
        Self::new()
    }
}

impl LiveProc {
    /// A source with an empty user-name cache.
    pub fn new() -> Self {
        Self {
            reader: ProcReader::new(),
            pins: HashMap::new(),
            next_pin: 0,
            pidfds_refused: false,
            epoll: None,
        }
    }

    fn epoll(&mut self) -> Option<&OwnedFd> {
        self.epoll
            .get_or_insert_with(|| epoll::create(epoll::CreateFlags::CLOEXEC).ok())
            .as_ref()
    }

    /// One `poll(2)` over `pins`' pidfds (the fallback without epoll).
    fn poll_exited(&self, pins: &[PinId]) -> Vec<PinId> {
        let order: Vec<(PinId, &OwnedFd)> = pins
            .iter()
            .filter_map(|id| self.pins.get(id).map(|fd| (*id, fd)))
            .collect();
        if order.is_empty() {
            return Vec::new();
        }
        let mut fds: Vec<PollFd<'_>> = order
            .iter()
            .map(|(_, fd)| PollFd::new(*fd, PollFlags::IN))
            .collect();
        match poll(&mut fds, Some(&ZERO)) {
            Ok(0) => Vec::new(),
            Ok(_) => order
                .iter()
                .zip(&fds)
                .filter(|(_, fd)| !fd.revents().is_empty())
                .map(|((id, _), _)| *id)
                .collect(),
            // Interrupted: nothing is known to have exited; the next tick asks again.
            Err(rustix::io::Errno::INTR) => Vec::new(),
            // Refused: say all may have exited, so each is checked in /proc and unpinned
            // rather than trusted without proof.
            Err(_) => pins.to_vec(),
        }
    }
}

const ZERO: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 0,
};

impl ProcSource for LiveProc {
    fn pin(&mut self, pid: u32) -> Option<PinId> {
        if self.pidfds_refused {
            return None;
        }
        let raw = i32::try_from(pid).ok()?;
        let pid = rustix::process::Pid::from_raw(raw)?;
        match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
            Ok(fd) => {
                self.next_pin += 1;
                let id = PinId(self.next_pin);
                if let Some(ep) = self.epoll() {
                    let data = epoll::EventData::new_u64(id.0);
                    if epoll::add(ep, &fd, data, epoll::EventFlags::IN).is_err() {
                        // One pidfd epoll refuses: use poll for all of them.
                        self.epoll = Some(None);
                    }
                }
                self.pins.insert(id, fd);
                Some(id)
            }
            Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => {
                tracing::debug!("pidfds are not available; process identity is re-read from /proc");
                self.pidfds_refused = true;
                None
            }
            Err(_) => None,
        }
    }

    fn unpin(&mut self, pin: PinId) {
        if let Some(fd) = self.pins.remove(&pin) {
            if let Some(Some(ep)) = &self.epoll {
                // Closing the pidfd would remove it too, unless another descriptor of it
                // remained; say so explicitly.
                let _ = epoll::delete(ep, &fd);
            }
        }
    }

    fn exited(&mut self, pins: &[PinId]) -> Vec<PinId> {
        if pins.is_empty() {
            return Vec::new();
        }
        let Some(Some(ep)) = &self.epoll else {
            return self.poll_exited(pins);
        };
        // Level-triggered: an exited process's pidfd stays ready until it is unpinned.
        let mut events: Vec<epoll::Event> = Vec::with_capacity(pins.len());
        match epoll::wait(ep, rustix::buffer::spare_capacity(&mut events), Some(&ZERO)) {
            Ok(_) => {
                let ready: std::collections::HashSet<u64> =
                    events.iter().map(|e| e.data.u64()).collect();
                pins.iter()
                    .filter(|p| ready.contains(&p.0))
                    .copied()
                    .collect()
            }
            Err(rustix::io::Errno::INTR) => Vec::new(),
            Err(_) => self.poll_exited(pins),
        }
    }

    fn stat(&mut self, pid: u32) -> Result<Stat, ProcError> {
        read_stat(pid)
    }

    fn details(&mut self, pid: u32) -> Option<ProcessDetails> {
        self.reader.details(pid)
    }

    fn started_at_unix_ms(&self, start_time_ticks: u64) -> Option<i64> {
        self.reader.started_at_unix_ms(start_time_ticks)
    }

    fn ticks_per_second(&self) -> u64 {
        self.reader.ticks_per_second()
    }

    fn page_size(&self) -> u64 {
        self.reader.page_size()
    }
}

/// What never changes for a process (read once per identity).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaticFacts {
    /// Real user id.
    pub uid: Option<u32>,
    /// User name, when the user database knows `uid`.
    pub user: Option<String>,
    /// Command line joined with spaces (`[comm]` when it has none); for a PID /proc cannot
    /// see, the driver's process name.
    pub command: Option<String>,
    /// The name in /proc/PID/stat.
    pub comm: Option<String>,
    /// Container id and pod UID from the cgroup path.
    pub container: ContainerInfo,
    /// Start as wall-clock time.
    pub started_at_unix_ms: Option<i64>,
    /// A kernel thread.
    pub kernel_thread: bool,
}

impl StaticFacts {
    /// The user name, or the uid as text when the user database has no name for it.
    pub fn user_or_uid(&self) -> Option<String> {
        self.user
            .clone()
            .or_else(|| self.uid.map(|u| u.to_string()))
    }
}

/// One reading of `/proc/PID/stat`: what changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatReading {
    /// When it was read (tick time, ms since the Unix epoch).
    pub read_at_ms: i64,
    /// User plus kernel CPU time so far, clock ticks.
    pub cpu_ticks: u64,
    /// The same in ms.
    pub cpu_time_ms: u64,
    /// State letter (`R`, `S`, `D`, `Z`, ...).
    pub state: char,
    /// Parent PID.
    pub ppid: u32,
    /// Threads.
    pub threads: u32,
    /// Resident set size in pages.
    pub rss_pages: u64,
    /// The same in bytes.
    pub rss_bytes: u64,
}

impl StatReading {
    /// Exited but not reaped (`Z`), or dead.
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// One process of the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    /// PID in our namespace.
    pub pid: u32,
    /// Start time in clock ticks after boot; with the boot id and the PID, the identity.
    /// `None`: /proc cannot see the process (or facts come from the driver only), and the
    /// PID alone names it.
    pub start_time_ticks: Option<u64>,
    /// Whether /proc in this PID namespace shows the process.
    pub visible: bool,
    /// What never changes.
    pub facts: StaticFacts,
    /// The latest `/proc/PID/stat` reading.
    pub stat: Option<StatReading>,
    /// The reading before it (for a CPU % between two readings).
    pub previous_stat: Option<StatReading>,
    /// When this identity was first seen (tick time).
    pub first_seen_ms: i64,
    /// Its pidfd said it exited, or its /proc entry vanished (it may still be listed, as a
    /// zombie or while the driver tears its context down). It keeps its identity and the
    /// facts read while it ran; `visible` stays as it was read.
    pub exited: bool,
    pin: Option<PinId>,
    /// When the identity was last checked against /proc (unpinned processes).
    checked_ms: i64,
}

impl CatalogEntry {
    /// CPU use in percent of one core between the last two stat readings.
    pub fn cpu_percent(&self, ticks_per_second: u64) -> Option<f64> {
        let (before, after) = (self.previous_stat?, self.stat?);
        let elapsed_ms = after.read_at_ms.checked_sub(before.read_at_ms)?;
        crate::procinfo::cpu_percent(
            before.cpu_ticks,
            after.cpu_ticks,
            std::time::Duration::from_millis(u64::try_from(elapsed_ms).ok()?),
            ticks_per_second,
        )
    }
}

/// What reading /proc cost so far, by kind (for tests and benchmarks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CatalogCounters {
    /// `/proc/PID/stat` reads.
    pub stat_reads: u64,
    /// Static-fact reads (status, cmdline, cgroup: once per identity).
    pub detail_reads: u64,
    /// Exit checks over the pidfds (one `epoll_wait`, or `poll`, each).
    pub polls: u64,
    /// pidfds opened.
    pub pins: u64,
    /// Driver name lookups.
    pub driver_names: u64,
}

/// What changed in one [`ProcessCatalog::observe`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// PIDs whose identity is new this tick: first seen, or a new process under a known
    /// PID. Ascending.
    pub new: Vec<u32>,
    /// Identities no longer listed (their entries were dropped), as `(pid, start time)`.
    pub left: Vec<(u32, Option<u64>)>,
}

/// The processes NVML lists, with what /proc says about them, by process identity.
///
/// ```
/// use vramctl_procs::process_catalog::{FactsSource, ProcessCatalog};
/// let mut catalog = ProcessCatalog::new(FactsSource::Proc);
/// let me = std::process::id();
/// // Each tick: the PIDs the driver listed, the tick's time, the driver's names.
/// catalog.observe(&[me], 0, &mut |_pid| None);
/// let entry = catalog.get(me).expect("listed");
/// assert!(entry.start_time_ticks.is_some() && entry.facts.command.is_some());
/// // CPU time when wanted: read at most once a second.
/// assert!(catalog.stat(me, 500).is_some());
/// ```
#[derive(Debug)]
pub struct ProcessCatalog {
    source: FactsSource,
    policy: RefreshPolicy,
    boot_id: Option<String>,
    proc_source: Box<dyn ProcSource>,
    entries: HashMap<u32, CatalogEntry>,
    counters: CatalogCounters,
}

impl ProcessCatalog {
    /// A catalog of this system's processes with the default policy.
    pub fn new(source: FactsSource) -> Self {
        Self::with_source(
            source,
            RefreshPolicy::default(),
            crate::procinfo::boot_id(),
            Box::new(LiveProc::new()),
        )
    }

    /// A catalog reading through `proc_source` (tests script one).
    pub fn with_source(
        source: FactsSource,
        policy: RefreshPolicy,
        boot_id: Option<String>,
        proc_source: Box<dyn ProcSource>,
    ) -> Self {
        Self {
            source,
            policy,
            boot_id,
            proc_source,
            entries: HashMap::new(),
            counters: CatalogCounters::default(),
        }
    }

    /// Where facts come from.
    pub fn source(&self) -> FactsSource {
        self.source
    }

    /// The boot id identities are given under.
    pub fn boot_id(&self) -> Option<&str> {
        self.boot_id.as_deref()
    }

    /// Clock ticks per second (the unit of start and CPU times).
    pub fn ticks_per_second(&self) -> u64 {
        self.proc_source.ticks_per_second()
    }

    /// What reading cost so far.
    pub fn counters(&self) -> CatalogCounters {
        self.counters
    }

    /// The process listed as `pid`, if it was in the last [`observe`](Self::observe).
    pub fn get(&self, pid: u32) -> Option<&CatalogEntry> {
        self.entries.get(&pid)
    }

    /// Every process of the last observation, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = &CatalogEntry> {
        self.entries.values()
    }

    /// The full identity of `pid`, when its start time and the boot id are known.
    pub fn identity(&self, pid: u32) -> Option<ProcessIdentity> {
        let entry = self.entries.get(&pid)?;
        Some(ProcessIdentity {
            boot_id: self.boot_id.clone()?,
            pid,
            start_time_ticks: entry.start_time_ticks?,
        })
    }

    /// Brings the catalog up to the PIDs of every readable device in `snapshot`.
    pub fn observe_snapshot(
        &mut self,
        snapshot: &Snapshot,
        now_ms: i64,
        driver_name: &mut dyn FnMut(u32) -> Option<String>,
    ) -> Observed {
        self.observe(&listed_pids(snapshot), now_ms, driver_name)
    }

    /// Brings the catalog up to the PIDs the driver lists now (`pids`, any order):
    /// processes no longer listed are forgotten, new ones read, the identity of the others
    /// proved (see the module docs). `driver_name` is asked once per PID /proc cannot see.
    pub fn observe(
        &mut self,
        pids: &[u32],
        now_ms: i64,
        driver_name: &mut dyn FnMut(u32) -> Option<String>,
    ) -> Observed {
        let mut listed = pids.to_vec();
        listed.sort_unstable();
        listed.dedup();
        self.observe_listed(&listed, &listed, now_ms, driver_name)
    }

    /// [`observe`](Self::observe) of `wanted` (sorted), asking the driver only about the
    /// PIDs it listed (`by_driver`, sorted).
    fn observe_listed(
        &mut self,
        wanted: &[u32],
        by_driver: &[u32],
        now_ms: i64,
        driver_name: &mut dyn FnMut(u32) -> Option<String>,
    ) -> Observed {
        let listed = wanted;
        let mut no_driver = |_: u32| None;
        let mut out = Observed::default();
        let gone: Vec<u32> = self
            .entries
            .keys()
            .filter(|pid| listed.binary_search(pid).is_err())
            .copied()
            .collect();
        for pid in gone {
            if let Some(entry) = self.entries.remove(&pid) {
                if let Some(pin) = entry.pin {
                    self.proc_source.unpin(pin);
                }
                out.left.push((pid, entry.start_time_ticks));
            }
        }
        out.left.sort_unstable();

        // The pinned: one exit check for all of them.
        if self.source == FactsSource::Proc {
            let pins: Vec<PinId> = self.entries.values().filter_map(|e| e.pin).collect();
            if !pins.is_empty() {
                self.counters.polls += 1;
                let exited = self.proc_source.exited(&pins);
                for pin in exited {
                    let Some(pid) = self
                        .entries
                        .values()
                        .find(|e| e.pin == Some(pin))
                        .map(|e| e.pid)
                    else {
                        continue;
                    };
                    self.proc_source.unpin(pin);
                    if let Some(entry) = self.entries.get_mut(&pid) {
                        entry.pin = None;
                        entry.exited = true;
                    }
                    // Reused: read it again as a new process below. Gone from /proc
                    // or a zombie: the exited process itself, still listed.
                    if !self.same_process_now(pid, now_ms) {
                        self.forget(pid, &mut out);
                    }
                }
            }
        }

        for &pid in listed {
            let driver_name: &mut dyn FnMut(u32) -> Option<String> =
                if by_driver.binary_search(&pid).is_ok() {
                    &mut *driver_name
                } else {
                    &mut no_driver
                };
            match self.entries.get(&pid) {
                None => {
                    self.learn(pid, now_ms, driver_name);
                    out.new.push(pid);
                }
                Some(entry) => {
                    // Not pinned: the start time is the proof, read once per
                    // `stat_every_ms` (at once after a clock stepped back).
                    let since = now_ms.saturating_sub(entry.checked_ms);
                    let every = if entry.visible {
                        self.policy.stat_every_ms
                    } else {
                        self.policy.invisible_every_ms
                    };
                    let due = self.source == FactsSource::Proc
                        && entry.pin.is_none()
                        && !(0..every).contains(&since);
                    if due && !self.same_process_now(pid, now_ms) {
                        self.forget(pid, &mut out);
                        self.learn(pid, now_ms, driver_name);
                        out.new.push(pid);
                    }
                }
            }
        }
        // A PID that was forgotten above for a reuse and is listed was learnt again in the
        // loop (it was not in `entries` any more); keep `new` in PID order.
        out.new.sort_unstable();
        out.new.dedup();
        out
    }

    /// The latest `/proc/PID/stat` reading of `pid`, read again when older than
    /// `stat_every_ms`. `None`: not listed, not visible, or facts come from the driver.
    pub fn stat(&mut self, pid: u32, now_ms: i64) -> Option<StatReading> {
        if self.source != FactsSource::Proc {
            return None;
        }
        let entry = self.entries.get(&pid)?;
        if let Some(stat) = entry.stat {
            let age = now_ms.saturating_sub(stat.read_at_ms);
            if (0..self.policy.stat_every_ms).contains(&age) {
                return Some(stat);
            }
        }
        if !entry.visible {
            return None;
        }
        let expected = entry.start_time_ticks;
        match self.read_stat(pid, now_ms) {
            Some((stat, start)) if Some(start) == expected => {
                self.record_stat(pid, stat, now_ms);
                Some(stat)
            }
            // Exited, or another process under the PID: the next `observe` sorts it out;
            // until then nothing is said about it.
            _ => None,
        }
    }

    /// What the live analysis needs about `pid` (`analysis::live::FleetTracker`): start
    /// time and CPU time, the latter read at most once per `stat_every_ms`.
    pub fn live_facts(&mut self, pid: u32, now_ms: i64) -> ProcessFacts {
        let Some(entry) = self.entries.get(&pid) else {
            return ProcessFacts::default();
        };
        let (start, started_at) = (entry.start_time_ticks, entry.facts.started_at_unix_ms);
        if start.is_none() {
            return ProcessFacts::default();
        }
        ProcessFacts {
            start_time_ticks: start,
            started_at_unix_ms: started_at,
            cpu_time_ms: self.stat(pid, now_ms).map(|s| s.cpu_time_ms),
        }
    }

    /// [`observe`](Self::observe), keeping also the ancestors of the listed processes (up
    /// to, not including, PID 1, at most 64 levels): `top`'s tree view shows who started a
    /// GPU process. An ancestor is followed through the parent PID of its latest stat
    /// reading, so a process reparented when its parent exited moves once its stat is read
    /// again ([`stat`](Self::stat), at most once per `stat_every_ms`). The driver is never
    /// asked about an ancestor: only listed PIDs are its processes.
    pub fn observe_with_ancestors(
        &mut self,
        pids: &[u32],
        now_ms: i64,
        driver_name: &mut dyn FnMut(u32) -> Option<String>,
    ) -> Observed {
        let mut listed = pids.to_vec();
        listed.sort_unstable();
        listed.dedup();
        let mut out = Observed::default();
        // Each round learns the ancestors one more level up that the last one found; a
        // tree already known is one round.
        for _ in 0..=MAX_ANCESTRY {
            let mut wanted = std::collections::BTreeSet::new();
            for &pid in &listed {
                let mut next = Some(pid);
                for _ in 0..=MAX_ANCESTRY {
                    let Some(p) = next.filter(|&p| p > 1 && wanted.insert(p)) else {
                        break;
                    };
                    next = self
                        .entries
                        .get(&p)
                        .and_then(|e| e.visible.then_some(e.stat?.ppid));
                }
            }
            let learnt_before = out.new.len();
            let wanted: Vec<u32> = wanted.into_iter().collect();
            let seen = self.observe_listed(&wanted, &listed, now_ms, driver_name);
            out.new.extend(seen.new);
            out.left.extend(seen.left);
            let unknown_parent = wanted.iter().any(|p| {
                self.entries.get(p).is_some_and(|e| {
                    e.visible
                        && e.stat
                            .is_some_and(|s| s.ppid > 1 && !self.entries.contains_key(&s.ppid))
                })
            });
            if out.new.len() == learnt_before || !unknown_parent {
                break;
            }
        }
        out.new.sort_unstable();
        out.new.dedup();
        out.left.sort_unstable();
        out.left.dedup();
        out
    }

    /// `pid` as /proc describes it, from what the catalog read (static facts, the latest
    /// stat reading, at most `stat_every_ms` old when [`stat`](Self::stat) was asked first):
    /// `None` when /proc cannot see it.
    pub fn details(&self, pid: u32) -> Option<ProcessDetails> {
        let entry = self.entries.get(&pid).filter(|e| e.visible)?;
        let facts = &entry.facts;
        let stat = entry.stat;
        Some(ProcessDetails {
            pid,
            uid: facts.uid,
            user: facts.user.clone(),
            command: facts.command.clone().unwrap_or_default(),
            comm: facts.comm.clone(),
            ppid: stat.map(|s| s.ppid),
            state: stat.map(|s| s.state),
            start_time_ticks: entry.start_time_ticks,
            started_at_unix_ms: facts.started_at_unix_ms,
            cpu_ticks: stat.map(|s| s.cpu_ticks),
            rss_bytes: stat.map(|s| s.rss_bytes),
            threads: stat.map(|s| s.threads),
            kernel_thread: facts.kernel_thread,
            container: facts.container.clone(),
        })
    }

    fn read_stat(&mut self, pid: u32, now_ms: i64) -> Option<(StatReading, u64)> {
        self.counters.stat_reads += 1;
        let stat = self.proc_source.stat(pid).ok()?;
        let tps = self.proc_source.ticks_per_second().max(1);
        let cpu_ticks = stat.cpu_ticks();
        let reading = StatReading {
            read_at_ms: now_ms,
            cpu_ticks,
            cpu_time_ms: u64::try_from(u128::from(cpu_ticks) * 1000 / u128::from(tps))
                .unwrap_or(u64::MAX),
            state: stat.state,
            ppid: stat.ppid,
            threads: stat.threads,
            rss_pages: stat.rss_pages,
            rss_bytes: stat.rss_pages.saturating_mul(self.proc_source.page_size()),
        };
        Some((reading, stat.start_time_ticks))
    }

    fn record_stat(&mut self, pid: u32, stat: StatReading, now_ms: i64) {
        if let Some(entry) = self.entries.get_mut(&pid) {
            entry.previous_stat = entry.stat.replace(stat);
            entry.checked_ms = now_ms;
        }
    }

    /// Reads the start time of `pid` now: whether it is still the process of the entry
    /// (then the reading is kept, as fresh CPU time).
    fn same_process_now(&mut self, pid: u32, now_ms: i64) -> bool {
        let Some(entry) = self.entries.get(&pid) else {
            return false;
        };
        let (expected, visible) = (entry.start_time_ticks, entry.visible);
        match self.read_stat(pid, now_ms) {
            Some((stat, start)) => {
                if visible && Some(start) == expected {
                    self.record_stat(pid, stat, now_ms);
                    true
                } else {
                    // Another process, or one that became visible: read it afresh.
                    false
                }
            }
            // Gone from /proc: an invisible PID stays as it was (the driver still lists
            // it). A visible one that vanished has exited and been reaped, and no process
            // of our namespace holds its PID now, so what the driver still lists under it
            // (for a moment while it tears the context down) is that process: it keeps its
            // identity, marked exited, rather than becoming a second identity with an
            // unknown start time. A reuse of the PID shows in /proc with another start
            // time at the next check (the `Some` arm above).
            None => {
                if let Some(entry) = self.entries.get_mut(&pid) {
                    entry.checked_ms = now_ms;
                    entry.exited = true;
                }
                true
            }
        }
    }

    fn forget(&mut self, pid: u32, out: &mut Observed) {
        if let Some(entry) = self.entries.remove(&pid) {
            if let Some(pin) = entry.pin {
                self.proc_source.unpin(pin);
            }
            out.left.push((pid, entry.start_time_ticks));
        }
    }

    fn learn(&mut self, pid: u32, now_ms: i64, driver_name: &mut dyn FnMut(u32) -> Option<String>) {
        let mut entry = CatalogEntry {
            pid,
            start_time_ticks: None,
            visible: false,
            facts: StaticFacts::default(),
            stat: None,
            previous_stat: None,
            first_seen_ms: now_ms,
            exited: false,
            pin: None,
            checked_ms: now_ms,
        };
        match self.source {
            FactsSource::Nothing => {}
            FactsSource::Driver => {
                self.counters.driver_names += 1;
                entry.facts.command = driver_name(pid);
            }
            FactsSource::Proc => {
                // Pin first, then read: what is read belongs to the pinned process unless
                // it exited in between, which the next exit check reports.
                let pinned = self.entries.values().filter(|e| e.pin.is_some()).count();
                if pinned < self.policy.max_pinned {
                    entry.pin = self.proc_source.pin(pid);
                    if entry.pin.is_some() {
                        self.counters.pins += 1;
                    }
                }
                let stat = self.read_stat(pid, now_ms);
                self.counters.detail_reads += 1;
                match (stat, self.proc_source.details(pid)) {
                    (Some((reading, start)), Some(details))
                        if details.start_time_ticks.is_none_or(|s| s == start) =>
                    {
                        entry.visible = true;
                        entry.start_time_ticks = Some(start);
                        entry.stat = Some(reading);
                        entry.facts = StaticFacts {
                            uid: details.uid,
                            user: details.user,
                            command: Some(details.command),
                            comm: details.comm,
                            container: details.container,
                            started_at_unix_ms: self.proc_source.started_at_unix_ms(start),
                            kernel_thread: details.kernel_thread,
                        };
                    }
                    _ => {
                        // Not in our PID namespace (or it exited while being read): the
                        // driver still knows its name.
                        if let Some(pin) = entry.pin.take() {
                            self.proc_source.unpin(pin);
                        }
                        self.counters.driver_names += 1;
                        entry.facts.command = driver_name(pid);
                    }
                }
            }
        }
        self.entries.insert(pid, entry);
    }
}

/// How far up the tree [`ProcessCatalog::observe_with_ancestors`] follows parents (as `top`
/// always did: deeper trees are not shown in a terminal anyway).
const MAX_ANCESTRY: usize = 64;

/// The PIDs listed on the devices of `snapshot` that answered, ascending, each once.
pub fn listed_pids(snapshot: &Snapshot) -> Vec<u32> {
    let mut pids: Vec<u32> = snapshot
        .devices
        .iter()
        .filter_map(|d| d.reading())
        .filter_map(|r| r.processes.as_ref())
        .flatten()
        .map(|p| p.pid)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// A [`ProcSource`] over a table instead of /proc, for tests of the catalog and of what
/// is built on it: processes can start, exit (become zombies), be reaped and have their
/// PID reused between two ticks, which real processes cannot be made to do on demand.
#[derive(Debug, Clone, Default)]
pub struct ScriptedProc(std::sync::Arc<std::sync::Mutex<ScriptedTable>>);

#[derive(Debug, Default)]
struct ScriptedTable {
    /// pid -> (start ticks, cpu ticks, state).
    procs: HashMap<u32, (u64, u64, char)>,
    /// pid -> parent pid (1 when not set).
    parents: HashMap<u32, u32>,
    /// Pins and the process (pid, start) each pins.
    pins: HashMap<PinId, (u32, u64)>,
    next: u64,
    no_pidfds: bool,
    stat_reads: u64,
}

impl ScriptedProc {
    /// An empty table, with pidfds.
    pub fn new() -> Self {
        Self::default()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, ScriptedTable> {
        // A test that panicked while holding the lock has failed already.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets process `pid`: started at `start_time_ticks`, `cpu_ticks` used, in `state`.
    /// A different start time under a known PID is a new process (the PID was reused).
    pub fn set(&self, pid: u32, start_time_ticks: u64, cpu_ticks: u64, state: char) {
        self.table()
            .procs
            .insert(pid, (start_time_ticks, cpu_ticks, state));
    }

    /// Makes `ppid` the parent of `pid`.
    pub fn set_parent(&self, pid: u32, ppid: u32) {
        self.table().parents.insert(pid, ppid);
    }

    /// Removes `pid` (it exited and was reaped).
    pub fn remove(&self, pid: u32) {
        self.table().procs.remove(&pid);
    }

    /// Makes `pidfd_open` fail, as on a kernel before 5.3.
    pub fn without_pidfds(self) -> Self {
        self.table().no_pidfds = true;
        self
    }

    /// `/proc/PID/stat` reads so far.
    pub fn stat_reads(&self) -> u64 {
        self.table().stat_reads
    }

    /// Pins held now.
    pub fn pins(&self) -> usize {
        self.table().pins.len()
    }
}

impl ProcSource for ScriptedProc {
    fn pin(&mut self, pid: u32) -> Option<PinId> {
        let mut t = self.table();
        if t.no_pidfds {
            return None;
        }
        let start = t.procs.get(&pid)?.0;
        t.next += 1;
        let id = PinId(t.next);
        t.pins.insert(id, (pid, start));
        Some(id)
    }

    fn unpin(&mut self, pin: PinId) {
        self.table().pins.remove(&pin);
    }

    fn exited(&mut self, pins: &[PinId]) -> Vec<PinId> {
        let t = self.table();
        pins.iter()
            .filter(|id| {
                t.pins.get(id).is_some_and(|(pid, start)| {
                    t.procs
                        .get(pid)
                        .is_none_or(|p| p.0 != *start || matches!(p.2, 'Z' | 'X'))
                })
            })
            .copied()
            .collect()
    }

    fn stat(&mut self, pid: u32) -> Result<Stat, ProcError> {
        let mut t = self.table();
        t.stat_reads += 1;
        let &(start, cpu, state) = t.procs.get(&pid).ok_or(ProcError::NotFound { pid })?;
        Ok(Stat {
            pid,
            comm: format!("p{pid}"),
            state,
            ppid: t.parents.get(&pid).copied().unwrap_or(1),
            pgrp: 0,
            flags: 0,
            utime_ticks: cpu,
            stime_ticks: 0,
            threads: 4,
            start_time_ticks: start,
            rss_pages: 1,
        })
    }

    /// User `alice` (uid 1000), command `python job<PID>-<START>.py`.
    fn details(&mut self, pid: u32) -> Option<ProcessDetails> {
        let t = self.table();
        let &(start, cpu, state) = t.procs.get(&pid)?;
        Some(ProcessDetails {
            pid,
            uid: Some(1000),
            user: Some("alice".into()),
            command: format!("python job{pid}-{start}.py"),
            comm: Some("python".into()),
            ppid: Some(t.parents.get(&pid).copied().unwrap_or(1)),
            state: Some(state),
            start_time_ticks: Some(start),
            started_at_unix_ms: None,
            cpu_ticks: Some(cpu),
            rss_bytes: None,
            threads: None,
            kernel_thread: false,
            container: ContainerInfo::default(),
        })
    }

    /// Boot at the epoch, 100 ticks a second.
    fn started_at_unix_ms(&self, start_time_ticks: u64) -> Option<i64> {
        i64::try_from(start_time_ticks.checked_mul(10)?).ok()
    }

    fn ticks_per_second(&self) -> u64 {
        100
    }

    fn page_size(&self) -> u64 {
        4096
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    type Scripted = ScriptedProc;

    /// A table filled by `f`.
    fn scripted(f: impl FnOnce(&Scripted)) -> Scripted {
        let s = Scripted::new();
        f(&s);
        s
    }

    fn catalog(source: &Scripted) -> ProcessCatalog {
        ProcessCatalog::with_source(
            FactsSource::Proc,
            RefreshPolicy::default(),
            Some("boot".into()),
            Box::new(source.clone()),
        )
    }

    fn no_name(_: u32) -> Option<String> {
        None
    }

    #[test]
    fn thirty_processes_cost_one_poll_a_tick_and_their_facts_once() {
        let pids: Vec<u32> = (1000..1030).collect();
        let source = scripted(|t| {
            for &pid in &pids {
                t.set(pid, u64::from(pid), 0, 'S');
            }
        });
        let mut catalog = catalog(&source);
        // A minute at 100 ms.
        for tick in 0..600 {
            let seen = catalog.observe(&pids, tick * 100, &mut no_name);
            if tick == 0 {
                assert_eq!(seen.new, pids);
            } else {
                assert_eq!(seen, Observed::default(), "tick {tick}");
            }
        }
        let c = catalog.counters();
        assert_eq!(c.detail_reads, 30, "static facts once per process");
        assert_eq!(c.stat_reads, 30, "start time once, when first seen");
        assert_eq!(c.polls, 599, "one poll per tick after the first");
        assert_eq!(c.pins, 30);
        // CPU time when asked, at most once a second however often it is asked.
        let before = catalog.counters().stat_reads;
        for tick in 600..1200 {
            for &pid in &pids {
                assert!(catalog.stat(pid, tick * 100).is_some());
            }
            catalog.observe(&pids, tick * 100, &mut no_name);
        }
        assert_eq!(catalog.counters().stat_reads - before, 30 * 60);
    }

    #[test]
    fn ancestors_of_listed_processes_are_kept_and_the_driver_is_asked_only_about_its_own() {
        // 100 (on a GPU) <- 50 (a shell) <- 10 (a session) <- 1; 7777 is on a GPU but not
        // in our namespace.
        let source = scripted(|t| {
            for (pid, parent) in [(100, 50), (50, 10), (10, 1)] {
                t.set(pid, u64::from(pid) * 10, 0, 'S');
                t.set_parent(pid, parent);
            }
        });
        let mut catalog = catalog(&source);
        let mut asked = Vec::new();
        let mut driver = |pid: u32| {
            asked.push(pid);
            Some(format!("driver name of {pid}"))
        };
        let seen = catalog.observe_with_ancestors(&[100, 7777], 0, &mut driver);
        assert_eq!(seen.new, [10, 50, 100, 7777]);
        assert_eq!(
            asked,
            [7777],
            "the driver is asked only about the PIDs it listed"
        );
        assert_eq!(catalog.get(50).map(|e| e.visible), Some(true));
        assert!(
            catalog.get(1).is_none(),
            "PID 1 is not shown as an ancestor"
        );
        assert_eq!(
            catalog.get(7777).and_then(|e| e.facts.command.as_deref()),
            Some("driver name of 7777")
        );
        // A known tree costs no reads of static facts, and nothing is forgotten.
        let reads = catalog.counters().detail_reads;
        let seen = catalog.observe_with_ancestors(&[100, 7777], 100, &mut |_| None);
        assert_eq!(seen, Observed::default());
        assert_eq!(catalog.counters().detail_reads, reads);
        // The GPU process gone: its ancestors go with it.
        let seen = catalog.observe_with_ancestors(&[7777], 200, &mut |_| None);
        assert_eq!(
            seen.left,
            [(10, Some(100)), (50, Some(500)), (100, Some(1000))]
        );
        assert_eq!(catalog.entries().count(), 1);
    }

    #[test]
    fn details_are_what_the_catalog_read_with_resident_memory_in_bytes() {
        let source = scripted(|t| t.set(42, 500, 7, 'R'));
        let mut catalog = catalog(&source);
        catalog.observe(&[42, 4_194_305], 0, &mut no_name);
        let d = catalog.details(42).expect("visible");
        assert_eq!(
            (d.pid, d.uid, d.user.as_deref(), d.command.as_str()),
            (42, Some(1000), Some("alice"), "python job42-500.py")
        );
        assert_eq!((d.state, d.ppid, d.threads), (Some('R'), Some(1), Some(4)));
        assert_eq!((d.start_time_ticks, d.cpu_ticks), (Some(500), Some(7)));
        assert_eq!(d.started_at_unix_ms, Some(5000));
        assert_eq!(d.rss_bytes, Some(4096), "one page");
        assert_eq!(catalog.details(4_194_305), None, "not visible: no details");
    }

    #[test]
    fn a_reused_pid_is_a_new_process_at_the_next_tick() {
        let source = scripted(|t| {
            t.set(42, 500, 7, 'S');
        });
        let mut catalog = catalog(&source);
        assert_eq!(catalog.observe(&[42], 0, &mut no_name).new, [42]);
        let first = catalog.get(42).unwrap().clone();
        assert_eq!(first.start_time_ticks, Some(500));
        assert_eq!(first.facts.command.as_deref(), Some("python job42-500.py"));
        // Between two ticks 100 ms apart the process exits, is reaped, and a new one gets
        // its PID; NVML lists 42 in both ticks.
        source.set(42, 900, 0, 'R');
        let seen = catalog.observe(&[42], 100, &mut no_name);
        assert_eq!(seen.new, [42]);
        assert_eq!(seen.left, [(42, Some(500))]);
        let now = catalog.get(42).unwrap();
        assert_eq!(now.start_time_ticks, Some(900));
        assert_eq!(now.facts.command.as_deref(), Some("python job42-900.py"));
        assert_eq!(
            catalog.identity(42),
            Some(ProcessIdentity {
                boot_id: "boot".into(),
                pid: 42,
                start_time_ticks: 900
            })
        );
    }

    #[test]
    fn a_zombie_still_listed_keeps_its_identity_and_is_checked_once_a_second() {
        let source = scripted(|t| {
            t.set(42, 500, 7, 'S');
        });
        let mut catalog = catalog(&source);
        catalog.observe(&[42], 0, &mut no_name);
        source.set(42, 500, 7, 'Z');
        let seen = catalog.observe(&[42], 100, &mut no_name);
        assert_eq!(seen, Observed::default(), "the same process, exited");
        let entry = catalog.get(42).unwrap();
        assert!(entry.exited);
        assert!(entry.stat.is_some_and(|s| s.is_zombie()));
        // No longer pinned: its start time is read once a second, not every tick.
        let reads = source.stat_reads();
        for tick in 2..=29 {
            catalog.observe(&[42], tick * 100, &mut no_name);
        }
        // Checked at 100 ms (its pidfd said it exited), then at 1.1 s and 2.1 s.
        assert_eq!(source.stat_reads() - reads, 2);
        // Reaped and reused: told apart at the next check.
        source.set(42, 2000, 0, 'R');
        let seen = catalog.observe(&[42], 3100, &mut no_name);
        assert_eq!(seen.new, [42]);
    }

    #[test]
    fn without_pidfds_identity_is_rechecked_once_a_second() {
        let source = scripted(|t| t.set(42, 500, 7, 'S')).without_pidfds();
        let mut catalog = catalog(&source);
        catalog.observe(&[42], 0, &mut no_name);
        for tick in 1..=30 {
            catalog.observe(&[42], tick * 100, &mut no_name);
        }
        // At 0 (first sight), 1 s, 2 s, 3 s.
        assert_eq!(catalog.counters().stat_reads, 4);
        assert_eq!(catalog.counters().polls, 0);
        source.set(42, 900, 0, 'R');
        assert!(catalog.observe(&[42], 3100, &mut no_name).new.is_empty());
        assert_eq!(catalog.observe(&[42], 4000, &mut no_name).new, [42]);
    }

    #[test]
    fn an_invisible_pid_is_named_by_the_driver_once() {
        let source = Scripted::new();
        let mut catalog = catalog(&source);
        let mut asked = HashSet::new();
        let mut name = |pid: u32| {
            asked.insert(pid);
            Some(format!("driver name {pid}"))
        };
        catalog.observe(&[77], 0, &mut name);
        for tick in 1..50 {
            catalog.observe(&[77], tick * 100, &mut name);
        }
        let entry = catalog.get(77).unwrap();
        assert!(!entry.visible);
        assert_eq!(entry.start_time_ticks, None);
        assert_eq!(entry.facts.command.as_deref(), Some("driver name 77"));
        assert_eq!(catalog.counters().driver_names, 1);
        // Looked for in /proc at first sight only within 10 s.
        assert_eq!(catalog.counters().stat_reads, 1);
        assert_eq!(catalog.stat(77, 5000), None);
        assert_eq!(catalog.live_facts(77, 5000), ProcessFacts::default());
        assert_eq!(catalog.identity(77), None);
    }

    #[test]
    fn processes_no_longer_listed_are_forgotten_and_their_pins_released() {
        let source = scripted(|t| {
            t.set(1, 10, 0, 'S');
            t.set(2, 20, 0, 'S');
        });
        let mut catalog = catalog(&source);
        catalog.observe(&[2, 1, 2], 0, &mut no_name);
        assert_eq!(source.pins(), 2);
        let seen = catalog.observe(&[2], 100, &mut no_name);
        assert_eq!(seen.left, [(1, Some(10))]);
        assert!(catalog.get(1).is_none());
        assert_eq!(source.pins(), 1);
    }

    #[test]
    fn live_facts_and_cpu_percent_come_from_the_stat_readings() {
        let source = scripted(|t| {
            t.set(5, 300, 100, 'R');
        });
        let mut catalog = catalog(&source);
        catalog.observe(&[5], 0, &mut no_name);
        source.set(5, 300, 150, 'R');
        let facts = catalog.live_facts(5, 1000);
        assert_eq!(
            facts,
            ProcessFacts {
                start_time_ticks: Some(300),
                started_at_unix_ms: Some(3000),
                cpu_time_ms: Some(1500),
            }
        );
        let entry = catalog.get(5).unwrap();
        assert_eq!(entry.cpu_percent(100), Some(50.0));
    }

    #[test]
    fn driver_only_and_nothing_read_no_proc() {
        let source = scripted(|t| {
            t.set(5, 300, 100, 'R');
        });
        for (facts, name) in [
            (FactsSource::Driver, Some("from the driver".to_owned())),
            (FactsSource::Nothing, None),
        ] {
            let mut catalog = ProcessCatalog::with_source(
                facts,
                RefreshPolicy::default(),
                None,
                Box::new(source.clone()),
            );
            for tick in 0..20 {
                catalog.observe(&[5], tick * 100, &mut |_| Some("from the driver".into()));
            }
            assert_eq!(catalog.get(5).unwrap().facts.command, name);
            assert_eq!(catalog.stat(5, 5000), None);
            assert_eq!(catalog.counters().stat_reads, 0);
            assert_eq!(catalog.counters().polls, 0);
        }
        assert_eq!(source.stat_reads(), 0);
    }

    #[test]
    fn our_own_process_through_real_proc_and_a_real_pidfd() {
        let mut catalog = ProcessCatalog::new(FactsSource::Proc);
        let me = std::process::id();
        catalog.observe(&[me], 0, &mut no_name);
        let entry = catalog.get(me).expect("we are listed").clone();
        assert!(entry.visible);
        assert!(entry.facts.command.is_some() && entry.facts.uid.is_some());
        assert_eq!(
            entry.start_time_ticks,
            crate::procinfo::cpu_time_ticks(me).map(|c| c.start_time_ticks)
        );
        for tick in 1..10 {
            assert!(
                catalog
                    .observe(&[me], tick * 100, &mut no_name)
                    .new
                    .is_empty()
            );
        }
        assert_eq!(catalog.counters().pins, 1, "pidfds work on this kernel");
        assert_eq!(catalog.counters().stat_reads, 1);
    }

    #[test]
    fn a_real_child_that_exits_is_noticed_through_its_pidfd() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let mut catalog = ProcessCatalog::new(FactsSource::Proc);
        catalog.observe(&[pid], 0, &mut no_name);
        assert!(catalog.get(pid).unwrap().visible);
        let waiter = crate::signal::PidHandle::pin(pid).expect("pin");
        child.kill().expect("kill");
        assert!(waiter.wait_exit(std::time::Duration::from_secs(10)));
        // A zombie until reaped: the same process, exited, noticed by the tick's check.
        let reads = catalog.counters().stat_reads;
        assert!(catalog.observe(&[pid], 100, &mut no_name).new.is_empty());
        let entry = catalog.get(pid).expect("still listed").clone();
        assert!(entry.exited);
        assert!(entry.stat.is_some_and(|s| s.is_zombie()));
        assert_eq!(catalog.counters().stat_reads, reads + 1);
        child.wait().expect("reap");
        // Reaped: gone from /proc at its next check, while the driver still lists it: the
        // same exited process, with the identity it had.
        let seen = catalog.observe(&[pid], 1100, &mut no_name);
        assert_eq!(seen, Observed::default());
        let now = catalog.get(pid).expect("still listed");
        assert_eq!(now.start_time_ticks, entry.start_time_ticks);
        assert!(now.exited);
        assert_eq!(catalog.counters().stat_reads, reads + 2);
    }

    #[test]
    fn an_exiting_process_keeps_its_identity_while_nvml_still_lists_it() {
        let source = scripted(|t| t.set(42, 500, 7, 'S'));
        let mut catalog = catalog(&source);
        catalog.observe(&[42], 0, &mut no_name);
        let before = catalog.identity(42).expect("known");
        // Between two ticks the process exits and is reaped: its /proc entry is gone, its
        // pidfd readable, and NVML still lists it while the driver tears its context down.
        source.remove(42);
        let mut named = Vec::new();
        let mut driver = |pid: u32| {
            named.push(pid);
            Some("python".to_owned())
        };
        for tick in 1..=25 {
            let seen = catalog.observe(&[42], tick * 100, &mut driver);
            assert_eq!(seen, Observed::default(), "tick {tick}: no second identity");
        }
        assert!(named.is_empty(), "not read again as an invisible process");
        assert_eq!(catalog.identity(42).as_ref(), Some(&before));
        let entry = catalog.get(42).expect("still listed");
        assert!(entry.exited);
        assert_eq!(entry.facts.command.as_deref(), Some("python job42-500.py"));
        // Once NVML stops listing it, the identity it had is the one that leaves.
        let seen = catalog.observe(&[], 2600, &mut no_name);
        assert_eq!(seen.left, [(42, Some(500))]);
    }

    #[test]
    fn a_pid_reused_after_its_process_vanished_is_a_new_process_at_the_next_check() {
        let source = scripted(|t| t.set(42, 500, 7, 'S'));
        let mut catalog = catalog(&source);
        catalog.observe(&[42], 0, &mut no_name);
        source.remove(42);
        assert_eq!(
            catalog.observe(&[42], 100, &mut no_name),
            Observed::default()
        );
        // Another process of our namespace gets the PID: /proc shows its start time.
        source.set(42, 900, 0, 'R');
        let seen = catalog.observe(&[42], 1100, &mut no_name);
        assert_eq!((seen.new, seen.left), (vec![42], vec![(42, Some(500))]));
        assert_eq!(catalog.get(42).and_then(|e| e.start_time_ticks), Some(900));
    }

    #[test]
    fn without_pidfds_a_vanished_process_keeps_its_identity_at_its_check() {
        let source = scripted(|t| t.set(42, 500, 7, 'S')).without_pidfds();
        let mut catalog = catalog(&source);
        catalog.observe(&[42], 0, &mut no_name);
        source.remove(42);
        for tick in 1..=20 {
            let seen = catalog.observe(&[42], tick * 100, &mut no_name);
            assert_eq!(seen, Observed::default(), "tick {tick}");
        }
        assert_eq!(catalog.get(42).and_then(|e| e.start_time_ticks), Some(500));
        assert!(catalog.get(42).is_some_and(|e| e.exited));
    }
}
