//! Safe termination: never `kill(pid)` on a PID read earlier.
//!
//! A PID names "whatever process has this number now". Between choosing a process (from
//! NVML, from /proc, from a history) and signalling it, the process can exit and the number
//! can be handed to another. NVML has also returned PIDs 0 and 4294967295, which become
//! `kill(0)` (our process group) and `kill(-1)` (everyone) when cast to `pid_t`. So every
//! signal here goes the same way (DESIGN §6, research-reliability §1):
//!
//! 1. **Check the number** ([`check_pid`]): not 0, not 1, below `pid_max`, not us, not an
//!    ancestor of ours. Pure; no syscall that could signal runs for a PID that fails.
//! 2. **Pin it**: `pidfd_open(pid)`. From here the fd names one process, whatever happens
//!    to the number.
//! 3. **Re-check who it is** ([`check_process`]), *after* the fd is open (systemd's
//!    `PidRef` discipline): the same start time (so the same process, not a reused PID),
//!    the same owner, not a thread, not a kernel thread, not a zombie, ours unless we are
//!    root, and in a non-initial PID namespace holding a `/dev/nvidia*` file. A process that
//!    has the recorded start time held this PID before the fd was opened, so the fd pins it.
//! 4. **Write the audit record** ([`AuditSink::before`]); if that fails, nothing is sent.
//! 5. **Signal through the fd** (`pidfd_send_signal`), then `SIGCONT` so that a stopped
//!    process can act on it (as systemd does).
//! 6. **Wait** by polling the pidfds, up to the grace period.
//! 7. **Escalate** to `SIGKILL` on the *same* fd (audited first), unless told not to; wait
//!    again, and report a process that survives `SIGKILL` (uninterruptible sleep in a
//!    driver) instead of retrying forever.
//!
//! Kernels without pidfds (before 5.3, or sandboxes that refuse the syscall): a manual kill
//! re-verifies the process immediately before each `kill(2)` (a window of microseconds
//! remains, documented in docs/kill.md); an automatic ([`Origin::Policy`]) kill refuses.
//!
//! Verifying that GPU memory was released needs NVML and is the caller's part (the binary's
//! `kill` and `reap`); this module reports who exited and when.

mod handle;
mod refusal;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use serde::{Deserialize, Serialize};

pub use handle::PidHandle;
use handle::{OpenError, Opener, open_pidfd, wait_all};
pub use refusal::{Actor, Expectation, ProcessFacts, Refusal, check_pid, check_process};

use crate::audit_record::{AuditOutcome, AuditRecord};
use crate::procinfo::{
    self, PidNamespace, ProcError, ProcReader, ProcessIdentity, gpu_device_files, read_stat,
    read_status,
};
use vramctl_core::clock::Clock;

/// The signals `kill` and `reap` send. Termination signals only: stopping or continuing a
/// process is not what a memory manager does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Signal {
    /// Hang-up (1).
    Hup,
    /// Interrupt (2): Python raises `KeyboardInterrupt`.
    Int,
    /// Quit (3).
    Quit,
    /// Kill (9): cannot be caught.
    Kill,
    /// User-defined 1 (10).
    Usr1,
    /// User-defined 2 (12).
    Usr2,
    /// Terminate (15): the polite default.
    Term,
}

impl Signal {
    const ALL: [Self; 7] = [
        Self::Hup,
        Self::Int,
        Self::Quit,
        Self::Kill,
        Self::Usr1,
        Self::Usr2,
        Self::Term,
    ];

    /// `SIGTERM`, ...
    pub fn name(self) -> &'static str {
        match self {
            Self::Hup => "SIGHUP",
            Self::Int => "SIGINT",
            Self::Quit => "SIGQUIT",
            Self::Kill => "SIGKILL",
            Self::Usr1 => "SIGUSR1",
            Self::Usr2 => "SIGUSR2",
            Self::Term => "SIGTERM",
        }
    }

    /// The signal number on Linux.
    pub fn number(self) -> i32 {
        self.raw().as_raw()
    }

    fn raw(self) -> rustix::process::Signal {
        use rustix::process::Signal as S;
        match self {
            Self::Hup => S::HUP,
            Self::Int => S::INT,
            Self::Quit => S::QUIT,
            Self::Kill => S::KILL,
            Self::Usr1 => S::USR1,
            Self::Usr2 => S::USR2,
            Self::Term => S::TERM,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A signal name or number that is not one of [`Signal`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown signal '{0}'; use one of HUP, INT, QUIT, KILL, USR1, USR2, TERM (or their numbers)"
)]
pub struct UnknownSignal(pub String);

impl FromStr for Signal {
    type Err = UnknownSignal;

    /// `TERM`, `SIGTERM`, `sigterm` or `15`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let upper = text.trim().to_ascii_uppercase();
        let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
        Self::ALL
            .into_iter()
            .find(|s| {
                s.name().strip_prefix("SIG") == Some(bare)
                    || bare.parse::<i32>().is_ok_and(|n| n == s.number())
            })
            .ok_or_else(|| UnknownSignal(text.to_owned()))
    }
}

impl Actor {
    /// Who we are: PID, ancestors, uids, `pid_max`, boot id and PID namespace.
    pub fn current() -> Self {
        let pid = std::process::id();
        let mut ancestors = Vec::new();
        let mut next = read_stat(pid).map(|s| s.ppid).ok();
        // Bounded: a cycle in /proc cannot happen, but a bound costs nothing.
        while let Some(ppid) = next.filter(|p| *p != 0 && ancestors.len() < 4096) {
            if ancestors.contains(&ppid) {
                break;
            }
            ancestors.push(ppid);
            next = read_stat(ppid).map(|s| s.ppid).ok();
        }
        if ancestors.is_empty() {
            // /proc unreadable: still never signal our parent.
            if let Some(ppid) = rustix::process::getppid() {
                ancestors.push(ppid.as_raw_pid().unsigned_abs());
            }
        }
        let uid = rustix::process::getuid().as_raw();
        Self {
            pid,
            ancestors,
            uid,
            euid: rustix::process::geteuid().as_raw(),
            user: ProcReader::new().user_name(uid),
            pid_max: vramctl_core::sanity::SanityLimits::from_system().pid_max,
            boot_id: procinfo::boot_id(),
            namespace_initial: PidNamespace::current().is_initial(),
        }
    }
}

/// What /proc says about `pid` now, for [`check_process`].
///
/// # Errors
/// [`Refusal::NotVisible`] when there is no such process; [`Refusal::Unreadable`] when its
/// stat or status cannot be read.
pub fn read_facts(pid: u32) -> Result<ProcessFacts, Refusal> {
    let unreadable = |e: ProcError| match e {
        ProcError::NotFound { pid } => Refusal::NotVisible { pid },
        other => Refusal::Unreadable {
            pid,
            reason: other.to_string(),
        },
    };
    let stat = read_stat(pid).map_err(unreadable)?;
    let status = read_status(pid).map_err(unreadable)?;
    Ok(ProcessFacts {
        stat,
        status,
        gpu_files: gpu_device_files(pid).ok(),
    })
}

/// A process chosen to be signalled, with who it was when chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// `(boot id, pid, start time)` when chosen.
    pub identity: ProcessIdentity,
    /// Its real uid when chosen.
    pub uid: u32,
    /// Its user name.
    pub user: Option<String>,
    /// Its command line (or `[comm]`).
    pub command: String,
    /// Its state letter when chosen.
    pub state: char,
    /// Its parent when chosen.
    pub ppid: u32,
    /// Whether it must prove GPU use at signal time ([`Expectation::gpu_proof`]).
    pub gpu_proof: bool,
    /// Its pidfd's inode number when chosen, where the kernel has pidfs (Linux 6.9): unique
    /// to one process for the whole boot, so it tells apart two processes that got the
    /// same PID within one clock tick, which the start time cannot ([`pidfd_id`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pidfd_id: Option<u64>,
}

/// `PIDFS_MAGIC`: the file system of pidfds since Linux 6.9, whose inode numbers are never
/// reused during a boot. Before it, every pidfd shares one anonymous inode.
const PIDFS_MAGIC: u64 = 0x5049_4446;

/// The unique id of the process `fd` pins (its pidfs inode number), where the kernel has
/// one; `None` on kernels before 6.9.
pub fn pidfd_id(fd: &std::os::fd::OwnedFd) -> Option<u64> {
    let fs = rustix::fs::fstatfs(fd).ok()?;
    // The field's type differs between architectures and libcs.
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    let magic = fs.f_type as u64;
    if magic != PIDFS_MAGIC {
        return None;
    }
    let st = rustix::fs::fstat(fd).ok()?;
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    let ino = st.st_ino as u64;
    Some(ino)
}

/// How a target came to be chosen; decides whether it must prove it is a GPU user in a
/// non-initial PID namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provenance {
    /// Named by the user or a policy (the PID may have come from NVML).
    Named,
    /// Found as a descendant of a checked target in our own /proc.
    Descendant,
}

/// Checks `pid` and records who it is now, for a plan: [`check_pid`], then /proc and
/// [`check_process`]. `expected_start` (e.g. from `PID@START` or a history) must match.
///
/// # Errors
/// Why it may not be signalled.
pub fn inspect(
    pid: u32,
    actor: &Actor,
    expected_start: Option<u64>,
    provenance: Provenance,
    procs: &mut ProcReader,
) -> Result<Candidate, Refusal> {
    check_pid(pid, actor)?;
    // Pinned before /proc is read: if the pinned process is still running after the read,
    // what was read is about it, and its pidfs id is the identity to insist on later.
    let pinned = open_pidfd(pid).ok();
    let facts = read_facts(pid)?;
    let pidfd_id = pinned
        .as_ref()
        .filter(|fd| !handle::fd_exited(fd))
        .and_then(pidfd_id);
    let gpu_proof = provenance == Provenance::Named;
    check_process(
        pid,
        &facts,
        actor,
        &Expectation {
            start_time_ticks: expected_start,
            uid: None,
            gpu_proof,
        },
    )?;
    let boot_id = actor.boot_id.clone().ok_or_else(|| Refusal::Unreadable {
        pid,
        reason: "this boot's id (/proc/sys/kernel/random/boot_id) cannot be read".into(),
    })?;
    let uid = facts.status.uid_real.unwrap_or(u32::MAX);
    let details = procs.details(pid);
    Ok(Candidate {
        identity: ProcessIdentity {
            boot_id,
            pid,
            start_time_ticks: facts.stat.start_time_ticks,
        },
        uid,
        user: procs.user_name(uid),
        command: details.map_or_else(|| format!("[{}]", facts.stat.comm), |d| d.command),
        state: facts.stat.state,
        ppid: facts.stat.ppid,
        gpu_proof,
        pidfd_id,
    })
}

/// Whether a kill was asked for by a person or decided by a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// `vramctl kill`, the TUI's kill key: without pidfds, re-check and `kill(2)`.
    Manual,
    /// `vramctl reap`: without pidfds, refuse.
    Policy,
}

/// One process to signal and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Who it was when chosen.
    pub candidate: Candidate,
    /// Why it is signalled, for the audit log: the user's command, or the policy and its
    /// evidence.
    pub reason: String,
}

/// A set of processes to signal and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillRequest {
    /// In the order to signal them (parents before their children).
    pub targets: Vec<Target>,
    /// The first signal (default `SIGTERM`).
    pub signal: Signal,
    /// How long to wait after it before escalating.
    pub grace: Duration,
    /// Send `SIGKILL` to survivors after the grace period.
    pub escalate: bool,
    /// How long to wait after `SIGKILL` before calling a process unkillable.
    pub kill_wait: Duration,
    /// Manual or policy (decides the no-pidfd fallback).
    pub origin: Origin,
    /// `kill` or `reap`, for the audit log.
    pub action: String,
}

impl KillRequest {
    /// `SIGTERM`, 10 s grace, escalation, 5 s after `SIGKILL`, manual.
    pub fn new(targets: Vec<Target>, action: &str) -> Self {
        Self {
            targets,
            signal: Signal::Term,
            grace: Duration::from_secs(10),
            escalate: true,
            kill_wait: Duration::from_secs(5),
            origin: Origin::Manual,
            action: action.to_owned(),
        }
    }
}

/// The id of an audit record, as the sink assigned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AuditId(pub i64);

/// An audit record could not be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AuditError(pub String);

/// Where audit records go: the history store (`synchronous=FULL`), or memory in tests.
///
/// [`before`](AuditSink::before) must return only once the record is durable; no signal is
/// sent until it has returned `Ok`.
pub trait AuditSink {
    /// Writes `record` (outcome [`AuditOutcome::Pending`], or `Refused`) and returns its id.
    ///
    /// # Errors
    /// When the record could not be written; the signal is then not sent.
    fn before(&mut self, record: &AuditRecord) -> Result<AuditId, AuditError>;

    /// Sets the outcome of record `id`.
    ///
    /// # Errors
    /// When the update could not be written (the signal was already sent).
    fn after(&mut self, id: AuditId, outcome: &AuditOutcome) -> Result<(), AuditError>;

    /// Where the records go, for the user (a file or database path); `None` when there is
    /// nothing to name (memory).
    fn location(&self) -> Option<String> {
        None
    }
}

/// An [`AuditSink`] that keeps records in memory (tests, dry runs of a policy).
#[derive(Debug, Clone, Default)]
pub struct MemoryAuditLog {
    /// The records, their index being their id; outcomes updated in place.
    pub records: Vec<AuditRecord>,
    /// Make the next `before` calls fail (to test that nothing is sent then).
    pub fail_writes: bool,
}

impl AuditSink for MemoryAuditLog {
    fn before(&mut self, record: &AuditRecord) -> Result<AuditId, AuditError> {
        if self.fail_writes {
            return Err(AuditError("the audit log refused the write".into()));
        }
        self.records.push(record.clone());
        Ok(AuditId(
            i64::try_from(self.records.len() - 1).unwrap_or(i64::MAX),
        ))
    }

    fn after(&mut self, id: AuditId, outcome: &AuditOutcome) -> Result<(), AuditError> {
        let record = usize::try_from(id.0)
            .ok()
            .and_then(|i| self.records.get_mut(i))
            .ok_or_else(|| AuditError(format!("no audit record {}", id.0)))?;
        record.outcome = outcome.clone();
        Ok(())
    }
}

/// What happened to one target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
#[non_exhaustive]
pub enum TargetOutcome {
    /// Not signalled, and why.
    Refused {
        /// The rule it broke at signal time.
        refusal: Refusal,
    },
    /// It had exited before anything was sent.
    AlreadyGone,
    /// Not signalled: its audit record could not be written.
    AuditFailed {
        /// What the audit log said.
        error: String,
    },
    /// The kernel refused the signal.
    SignalFailed {
        /// What it said.
        error: String,
    },
    /// It terminated.
    Exited {
        /// From the first signal to its exit (to within the wait's resolution).
        after: Duration,
        /// Whether it took `SIGKILL`.
        escalated: bool,
    },
    /// Still running at the end: the grace period passed without escalation, or it
    /// survived `SIGKILL` (uninterruptible sleep, usually inside a driver).
    StillRunning {
        /// Whether `SIGKILL` was sent.
        escalated: bool,
        /// Its state letter at the end, when readable (`D`: uninterruptible).
        state: Option<char>,
        /// Why escalation did not happen, if it was wanted but not done.
        note: Option<String>,
    },
}

/// One signal that was sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentSignal {
    /// The signal (`SIGCONT` after it is implied for all but `SIGKILL`).
    pub signal: Signal,
    /// Time since the first signal of the run.
    pub at: Duration,
    /// Its audit record.
    pub audit_id: AuditId,
}

/// The report for one target, in request order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetReport {
    /// The target as chosen.
    pub candidate: Candidate,
    /// What happened.
    pub outcome: TargetOutcome,
    /// The signals sent, in order.
    pub signals: Vec<SentSignal>,
    /// Whether a pidfd pinned it (false: the re-check-then-kill(2) fallback).
    pub pinned: bool,
}

impl TargetReport {
    /// The audit record to update with the memory outcome (the last signal's).
    pub fn last_audit_id(&self) -> Option<AuditId> {
        self.signals.last().map(|s| s.audit_id)
    }
}

/// Signals every target of `request` on the verified path (module docs) and reports what
/// happened to each. Blocks for up to `grace + kill_wait`.
pub fn execute(
    request: &KillRequest,
    actor: &Actor,
    sink: &mut dyn AuditSink,
    clock: &dyn Clock,
) -> Vec<TargetReport> {
    execute_with(request, actor, sink, clock, &open_pidfd)
}

/// A target between the steps of [`execute_with`].
struct Slot {
    report: TargetReport,
    handle: Option<PidHandle>,
    /// Signalled and not yet seen exited.
    waiting: bool,
}

fn execute_with(
    request: &KillRequest,
    actor: &Actor,
    sink: &mut dyn AuditSink,
    clock: &dyn Clock,
    opener: &Opener,
) -> Vec<TargetReport> {
    let mut slots: Vec<Slot> = request
        .targets
        .iter()
        .map(|target| pin(target, request, actor, sink, clock, opener))
        .collect();

    // Phase 2: the first signal, to each pinned target in order.
    let started = Instant::now();
    for (slot, target) in slots.iter_mut().zip(&request.targets) {
        if slot.handle.is_some() {
            deliver(
                slot,
                target,
                request.signal,
                request,
                actor,
                sink,
                clock,
                started,
            );
        }
    }

    // Phase 3: the grace period.
    wait_for(&mut slots, started, started + request.grace);

    // Phase 4: escalation on the same handles.
    if request.escalate && request.signal != Signal::Kill {
        let escalation = Instant::now();
        let mut sent_any = false;
        for (slot, target) in slots.iter_mut().zip(&request.targets) {
            if slot.waiting {
                sent_any |= deliver(
                    slot,
                    target,
                    Signal::Kill,
                    request,
                    actor,
                    sink,
                    clock,
                    started,
                );
            }
        }
        if sent_any {
            wait_for(&mut slots, started, escalation + request.kill_wait);
        }
    } else if request.signal == Signal::Kill {
        // SIGKILL was the first signal: give it the post-kill wait on top of the grace.
        wait_for(&mut slots, started, Instant::now() + request.kill_wait);
    }

    // Whatever is still waiting survived.
    for slot in &mut slots {
        if slot.waiting {
            let escalated = slot.report.signals.iter().any(|s| s.signal == Signal::Kill);
            let note = match &slot.report.outcome {
                TargetOutcome::StillRunning { note, .. } => note.clone(),
                _ => None,
            };
            slot.report.outcome = TargetOutcome::StillRunning {
                escalated,
                state: read_stat(slot.report.candidate.identity.pid)
                    .ok()
                    .map(|s| s.state),
                note,
            };
        }
    }
    slots.into_iter().map(|s| s.report).collect()
}

/// Phase 1: check the number, pin the process, re-check who it is.
fn pin(
    target: &Target,
    request: &KillRequest,
    actor: &Actor,
    sink: &mut dyn AuditSink,
    clock: &dyn Clock,
    opener: &Opener,
) -> Slot {
    let candidate = &target.candidate;
    let pid = candidate.identity.pid;
    let mut slot = Slot {
        report: TargetReport {
            candidate: candidate.clone(),
            outcome: TargetOutcome::AlreadyGone,
            signals: Vec::new(),
            pinned: false,
        },
        handle: None,
        waiting: false,
    };
    let refuse = |slot: &mut Slot, refusal: Refusal, sink: &mut dyn AuditSink| {
        audit_refusal(
            sink,
            actor,
            clock,
            &request.action,
            target,
            request.signal,
            &refusal,
        );
        slot.report.outcome = TargetOutcome::Refused { refusal };
    };
    if let Err(refusal) = check_pid(pid, actor) {
        refuse(&mut slot, refusal, sink);
        return slot;
    }
    if actor.boot_id.as_deref() != Some(candidate.identity.boot_id.as_str()) {
        refuse(&mut slot, Refusal::OtherBoot { pid }, sink);
        return slot;
    }
    let handle = match PidHandle::open(pid, candidate.identity.start_time_ticks, opener) {
        Ok(handle) => handle,
        Err(OpenError::Gone) => return slot,
        Err(OpenError::Unsupported(errno)) => match request.origin {
            Origin::Policy => {
                let refusal = Refusal::NoPidfd {
                    pid,
                    reason: errno_text(errno),
                };
                refuse(&mut slot, refusal, sink);
                return slot;
            }
            Origin::Manual => {
                tracing::warn!(pid, error = %errno_text(errno), "No pidfd; re-checking before kill(2).");
                PidHandle::unpinned(pid, candidate.identity.start_time_ticks)
            }
        },
        Err(OpenError::Other(errno)) => {
            slot.report.outcome = TargetOutcome::SignalFailed {
                error: format!("pidfd_open failed: {}", errno_text(errno)),
            };
            return slot;
        }
    };
    slot.report.pinned = handle.is_pinned();
    // Finer than the start time: the pidfd now open must pin the very process chosen.
    if let (Some(want), Some(got)) = (candidate.pidfd_id, handle.pidfd_id())
        && want != got
    {
        let refusal = Refusal::IdentityMismatch {
            pid,
            detail: format!("pidfd id {got}, chosen as {want}"),
        };
        refuse(&mut slot, refusal, sink);
        return slot;
    }
    // The re-check after pinning: if the process now under this PID still has the recorded
    // start time, it is the one the fd pins.
    match verify(candidate, actor) {
        Ok(()) => slot.handle = Some(handle),
        Err(refusal) => {
            // Gone or exited since it was chosen: not a refusal, nothing to do.
            let exited = match &refusal {
                Refusal::NotVisible { .. } | Refusal::Zombie { .. } => true,
                _ => handle.is_pinned() && handle.has_exited(),
            };
            if !exited {
                refuse(&mut slot, refusal, sink);
            }
        }
    }
    slot
}

/// [`check_process`] against the candidate as chosen.
fn verify(candidate: &Candidate, actor: &Actor) -> Result<(), Refusal> {
    let pid = candidate.identity.pid;
    let facts = read_facts(pid)?;
    check_process(
        pid,
        &facts,
        actor,
        &Expectation {
            start_time_ticks: Some(candidate.identity.start_time_ticks),
            uid: Some(candidate.uid),
            gpu_proof: candidate.gpu_proof,
        },
    )
}

/// Audits, then sends `signal` (and `SIGCONT` after anything but `SIGKILL`). Whether it was
/// sent.
#[allow(clippy::too_many_arguments)]
fn deliver(
    slot: &mut Slot,
    target: &Target,
    signal: Signal,
    request: &KillRequest,
    actor: &Actor,
    sink: &mut dyn AuditSink,
    clock: &dyn Clock,
    started: Instant,
) -> bool {
    let Some(handle) = slot.handle.as_ref() else {
        return false;
    };
    let escalating = signal == Signal::Kill && request.signal != Signal::Kill;
    // Without a pidfd, re-verify immediately before kill(2): the residual window is the
    // time between this read and the syscall.
    if !handle.is_pinned() {
        if let Err(refusal) = verify(&target.candidate, actor) {
            slot.waiting = false;
            slot.report.outcome = match refusal {
                Refusal::NotVisible { .. } | Refusal::Zombie { .. } if escalating => {
                    TargetOutcome::Exited {
                        after: started.elapsed(),
                        escalated: false,
                    }
                }
                Refusal::NotVisible { .. } | Refusal::Zombie { .. } => TargetOutcome::AlreadyGone,
                refusal => TargetOutcome::Refused { refusal },
            };
            return false;
        }
    }
    let label = if signal == Signal::Kill {
        signal.name().to_owned()
    } else {
        format!("{}+SIGCONT", signal.name())
    };
    let record = AuditRecord {
        at_unix_ms: clock.now_unix_ms(),
        actor_uid: actor.uid,
        actor_user: actor.user.clone(),
        action: request.action.clone(),
        target: target.candidate.identity.clone(),
        target_command: target.candidate.command.clone(),
        target_user: target.candidate.user.clone(),
        signal: label,
        reason: if escalating {
            format!(
                "{}; still running {:.1} s after {}",
                target.reason,
                request.grace.as_secs_f64(),
                request.signal.name()
            )
        } else {
            target.reason.clone()
        },
        outcome: AuditOutcome::Pending,
    };
    let audit_id = match sink.before(&record) {
        Ok(id) => id,
        Err(err) => {
            // Fail closed: no signal without its record.
            if escalating {
                slot.report.outcome = TargetOutcome::StillRunning {
                    escalated: false,
                    state: None,
                    note: Some(format!(
                        "SIGKILL not sent: cannot write the audit record: {err}"
                    )),
                };
            } else {
                slot.report.outcome = TargetOutcome::AuditFailed {
                    error: err.to_string(),
                };
                slot.handle = None;
            }
            return false;
        }
    };
    let at = started.elapsed();
    match handle.send(signal.raw()) {
        Ok(()) => {
            if signal != Signal::Kill {
                // A stopped process cannot act on SIGTERM until continued; failure here
                // (it already exited) changes nothing.
                let _ = handle.send(rustix::process::Signal::CONT);
            }
            let _ = sink.after(audit_id, &AuditOutcome::Sent);
            slot.report.signals.push(SentSignal {
                signal,
                at,
                audit_id,
            });
            slot.waiting = true;
            true
        }
        Err(Errno::SRCH) => {
            // It exited between the check and the signal.
            let _ = sink.after(
                audit_id,
                &AuditOutcome::Failed("the process had already exited".into()),
            );
            slot.waiting = false;
            slot.report.outcome = if escalating {
                TargetOutcome::Exited {
                    after: at,
                    escalated: false,
                }
            } else {
                TargetOutcome::AlreadyGone
            };
            false
        }
        Err(errno) => {
            let error = errno_text(errno);
            let _ = sink.after(audit_id, &AuditOutcome::Failed(error.clone()));
            if escalating {
                slot.report.outcome = TargetOutcome::StillRunning {
                    escalated: false,
                    state: None,
                    note: Some(format!("SIGKILL failed: {error}")),
                };
            } else {
                slot.waiting = false;
                slot.report.outcome = TargetOutcome::SignalFailed { error };
            }
            false
        }
    }
}

/// Waits for every waiting slot until `deadline`; marks those that exited.
fn wait_for(slots: &mut [Slot], started: Instant, deadline: Instant) {
    let waiting: Vec<usize> = (0..slots.len()).filter(|i| slots[*i].waiting).collect();
    if waiting.is_empty() {
        return;
    }
    let handles: Vec<&PidHandle> = waiting
        .iter()
        .filter_map(|i| slots[*i].handle.as_ref())
        .collect();
    let exited = wait_all(&handles, deadline);
    let done: HashMap<usize, Option<Instant>> = waiting.iter().copied().zip(exited).collect();
    for (i, exited) in done {
        if let Some(at) = exited {
            let slot = &mut slots[i];
            slot.waiting = false;
            slot.report.outcome = TargetOutcome::Exited {
                after: at.saturating_duration_since(started),
                escalated: slot.report.signals.iter().any(|s| s.signal == Signal::Kill)
                    && slot.report.signals.len() > 1,
            };
        }
    }
}

fn audit_refusal(
    sink: &mut dyn AuditSink,
    actor: &Actor,
    clock: &dyn Clock,
    action: &str,
    target: &Target,
    signal: Signal,
    refusal: &Refusal,
) {
    let record = AuditRecord {
        at_unix_ms: clock.now_unix_ms(),
        actor_uid: actor.uid,
        actor_user: actor.user.clone(),
        action: action.to_owned(),
        target: target.candidate.identity.clone(),
        target_command: target.candidate.command.clone(),
        target_user: target.candidate.user.clone(),
        signal: signal.name().to_owned(),
        reason: target.reason.clone(),
        outcome: AuditOutcome::Refused(refusal.to_string()),
    };
    if let Err(err) = sink.before(&record) {
        tracing::warn!(error = %err, pid = target.candidate.identity.pid, "Could not record a refusal.");
    }
}

fn errno_text(errno: Errno) -> String {
    std::io::Error::from(errno).to_string()
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command, Stdio};

    use super::*;
    use vramctl_core::clock::ManualClock;

    fn sleeper() -> Child {
        Command::new("sleep").arg("60").spawn().expect("sleep")
    }

    /// `sh -c SCRIPT` that prints `ready` once it is set up.
    fn shell(script: &str) -> Child {
        let mut child = Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("piped"))
            .read_line(&mut line)
            .expect("read");
        assert_eq!(line.trim(), "ready");
        child
    }

    fn target(pid: u32, actor: &Actor) -> Target {
        let candidate = inspect(pid, actor, None, Provenance::Named, &mut ProcReader::new())
            .expect("a process we may signal");
        Target {
            candidate,
            reason: "test".into(),
        }
    }

    fn request(targets: Vec<Target>, grace_ms: u64) -> KillRequest {
        KillRequest {
            grace: Duration::from_millis(grace_ms),
            kill_wait: Duration::from_secs(10),
            ..KillRequest::new(targets, "kill")
        }
    }

    fn run(request: &KillRequest, log: &mut MemoryAuditLog) -> Vec<TargetReport> {
        execute(request, &Actor::current(), log, &ManualClock::new(1_000))
    }

    fn killed_by(child: &mut Child) -> Option<i32> {
        child.wait().expect("wait").signal()
    }

    #[test]
    fn signal_names_parse() {
        assert_eq!("TERM".parse(), Ok(Signal::Term));
        assert_eq!("sigkill".parse(), Ok(Signal::Kill));
        assert_eq!("SIGINT".parse(), Ok(Signal::Int));
        assert_eq!("15".parse(), Ok(Signal::Term));
        assert_eq!(Signal::Kill.number(), 9);
        assert!("STOP".parse::<Signal>().is_err());
        assert!("0".parse::<Signal>().is_err());
        let err = "bogus".parse::<Signal>().unwrap_err().to_string();
        assert!(err.starts_with("unknown signal 'bogus'"), "{err}");
    }

    #[test]
    fn term_ends_a_process_and_is_audited_first() {
        let mut child = sleeper();
        let actor = Actor::current();
        let report = run(
            &request(vec![target(child.id(), &actor)], 10_000),
            &mut MemoryAuditLog::default(),
        );
        assert!(
            matches!(
                report[0].outcome,
                TargetOutcome::Exited {
                    escalated: false,
                    ..
                }
            ),
            "{report:?}"
        );
        assert!(report[0].pinned);
        assert_eq!(killed_by(&mut child), Some(15));

        let mut child = sleeper();
        let mut log = MemoryAuditLog::default();
        let report = run(&request(vec![target(child.id(), &actor)], 10_000), &mut log);
        assert_eq!(killed_by(&mut child), Some(15));
        assert_eq!(log.records.len(), 1);
        let record = &log.records[0];
        assert_eq!(record.signal, "SIGTERM+SIGCONT");
        assert_eq!(record.outcome, AuditOutcome::Sent);
        assert_eq!(record.target, report[0].candidate.identity);
        assert_eq!(record.action, "kill");
        assert_eq!(record.at_unix_ms, 1_000);
        assert_eq!(report[0].last_audit_id(), Some(AuditId(0)));
    }

    #[test]
    fn a_process_ignoring_term_gets_kill_on_the_same_fd() {
        let mut child = shell("trap '' TERM; echo ready; exec sleep 60");
        let actor = Actor::current();
        let mut log = MemoryAuditLog::default();
        let report = run(&request(vec![target(child.id(), &actor)], 200), &mut log);
        match &report[0].outcome {
            TargetOutcome::Exited {
                escalated: true,
                after,
            } => assert!(*after >= Duration::from_millis(200), "{after:?}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(killed_by(&mut child), Some(9));
        let signals: Vec<&str> = log.records.iter().map(|r| r.signal.as_str()).collect();
        assert_eq!(signals, ["SIGTERM+SIGCONT", "SIGKILL"]);
        assert!(log.records[1].reason.contains("still running"));
    }

    #[test]
    fn without_escalation_a_survivor_is_reported() {
        let mut child = shell("trap '' TERM; echo ready; exec sleep 60");
        let actor = Actor::current();
        let mut req = request(vec![target(child.id(), &actor)], 100);
        req.escalate = false;
        let report = run(&req, &mut MemoryAuditLog::default());
        assert!(
            matches!(
                report[0].outcome,
                TargetOutcome::StillRunning {
                    escalated: false,
                    state: Some('S'),
                    ..
                }
            ),
            "{report:?}"
        );
        child.kill().expect("kill");
        child.wait().expect("wait");
    }

    #[test]
    fn a_stopped_process_is_continued_so_term_takes_effect() {
        let mut child = sleeper();
        let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::STOP).expect("stop");
        let deadline = Instant::now() + Duration::from_secs(10);
        while read_stat(child.id()).unwrap().state != 'T' {
            assert!(Instant::now() < deadline, "never stopped");
            std::thread::yield_now();
        }
        let actor = Actor::current();
        let report = run(
            &request(vec![target(child.id(), &actor)], 10_000),
            &mut MemoryAuditLog::default(),
        );
        assert!(
            matches!(
                report[0].outcome,
                TargetOutcome::Exited {
                    escalated: false,
                    ..
                }
            ),
            "{report:?}"
        );
        assert_eq!(killed_by(&mut child), Some(15));
    }

    #[test]
    fn a_reused_pid_is_refused_and_the_process_lives() {
        let mut child = sleeper();
        let actor = Actor::current();
        let mut stale = target(child.id(), &actor);
        // The same PID with another start time: what a recycled PID looks like.
        stale.candidate.identity.start_time_ticks -= 1;
        let mut log = MemoryAuditLog::default();
        let report = run(&request(vec![stale], 100), &mut log);
        match &report[0].outcome {
            TargetOutcome::Refused {
                refusal: Refusal::IdentityMismatch { pid, .. },
            } => assert_eq!(*pid, child.id()),
            other => panic!("{other:?}"),
        }
        assert!(report[0].signals.is_empty());
        assert!(!PidHandle::pin(child.id()).unwrap().has_exited());
        assert_eq!(log.records.len(), 1);
        assert!(matches!(log.records[0].outcome, AuditOutcome::Refused(_)));

        // The same through inspect with a start time from elsewhere (`PID@START`).
        let start = read_stat(child.id()).unwrap().start_time_ticks;
        let refused = inspect(
            child.id(),
            &actor,
            Some(start + 5),
            Provenance::Named,
            &mut ProcReader::new(),
        );
        assert!(matches!(refused, Err(Refusal::IdentityMismatch { .. })));
        child.kill().expect("kill");
        child.wait().expect("wait");
    }

    #[test]
    fn another_boot_is_refused() {
        let mut child = sleeper();
        let actor = Actor::current();
        let mut old = target(child.id(), &actor);
        old.candidate.identity.boot_id = "00000000-0000-0000-0000-000000000000".into();
        let report = run(&request(vec![old], 100), &mut MemoryAuditLog::default());
        assert!(matches!(
            report[0].outcome,
            TargetOutcome::Refused {
                refusal: Refusal::OtherBoot { .. }
            }
        ));
        child.kill().expect("kill");
        child.wait().expect("wait");
    }

    #[test]
    fn no_signal_without_its_audit_record() {
        let mut child = sleeper();
        let actor = Actor::current();
        let mut log = MemoryAuditLog {
            fail_writes: true,
            ..MemoryAuditLog::default()
        };
        let report = run(&request(vec![target(child.id(), &actor)], 100), &mut log);
        assert!(
            matches!(report[0].outcome, TargetOutcome::AuditFailed { .. }),
            "{report:?}"
        );
        assert!(report[0].signals.is_empty());
        assert!(!PidHandle::pin(child.id()).unwrap().has_exited());
        child.kill().expect("kill");
        child.wait().expect("wait");
    }

    fn no_pidfd(_: u32) -> Result<std::os::fd::OwnedFd, Errno> {
        Err(Errno::NOSYS)
    }

    #[test]
    fn without_pidfd_a_manual_kill_rechecks_and_a_policy_kill_refuses() {
        let mut child = sleeper();
        let actor = Actor::current();
        let req = request(vec![target(child.id(), &actor)], 10_000);
        let report = execute_with(
            &req,
            &actor,
            &mut MemoryAuditLog::default(),
            &ManualClock::new(0),
            &no_pidfd,
        );
        assert!(!report[0].pinned);
        assert!(
            matches!(report[0].outcome, TargetOutcome::Exited { .. }),
            "{report:?}"
        );
        assert_eq!(killed_by(&mut child), Some(15));

        let mut child = sleeper();
        let mut req = request(vec![target(child.id(), &actor)], 100);
        req.origin = Origin::Policy;
        let report = execute_with(
            &req,
            &actor,
            &mut MemoryAuditLog::default(),
            &ManualClock::new(0),
            &no_pidfd,
        );
        assert!(
            matches!(
                report[0].outcome,
                TargetOutcome::Refused {
                    refusal: Refusal::NoPidfd { .. }
                }
            ),
            "{report:?}"
        );
        assert!(!PidHandle::pin(child.id()).unwrap().has_exited());
        child.kill().expect("kill");
        child.wait().expect("wait");
    }

    #[test]
    fn without_pidfd_a_reused_pid_is_still_refused() {
        let mut child = sleeper();
        let actor = Actor::current();
        let mut stale = target(child.id(), &actor);
        stale.candidate.identity.start_time_ticks += 1;
        let report = execute_with(
            &request(vec![stale], 100),
            &actor,
            &mut MemoryAuditLog::default(),
            &ManualClock::new(0),
            &no_pidfd,
        );
        assert!(matches!(
            report[0].outcome,
            TargetOutcome::Refused {
                refusal: Refusal::IdentityMismatch { .. }
            }
        ));
        assert!(!PidHandle::pin(child.id()).unwrap().has_exited());
        child.kill().expect("kill");
        child.wait().expect("wait");
    }

    #[test]
    fn a_process_gone_before_signalling_is_already_gone() {
        let mut child = sleeper();
        let actor = Actor::current();
        let t = target(child.id(), &actor);
        child.kill().expect("kill");
        child.wait().expect("reaped: the PID is free now");
        let mut log = MemoryAuditLog::default();
        let report = run(&request(vec![t], 100), &mut log);
        assert_eq!(report[0].outcome, TargetOutcome::AlreadyGone);
        assert!(log.records.is_empty(), "nothing sent, nothing refused");
    }

    #[test]
    fn inspect_refuses_zombies_kernel_threads_ourselves_and_our_parent() {
        let actor = Actor::current();
        let mut procs = ProcReader::new();
        let mut look = |pid| inspect(pid, &actor, None, Provenance::Named, &mut procs);

        // A child that exited and that we do not reap is a zombie whose parent is us.
        let mut child = Command::new("true").spawn().expect("true");
        assert!(
            PidHandle::pin(child.id())
                .unwrap()
                .wait_exit(Duration::from_secs(10))
        );
        assert_eq!(
            look(child.id()),
            Err(Refusal::Zombie {
                pid: child.id(),
                ppid: std::process::id()
            })
        );
        child.wait().expect("reap");

        assert_eq!(
            look(std::process::id()),
            Err(Refusal::Ourselves {
                pid: std::process::id()
            })
        );
        let parent = actor.ancestors[0];
        assert!(matches!(
            look(parent),
            Err(Refusal::OurAncestor { parent: true, .. }) | Err(Refusal::Init)
        ));
        assert_eq!(look(0), Err(Refusal::PidZero));
        assert_eq!(look(1), Err(Refusal::Init));
        assert!(matches!(look(u32::MAX), Err(Refusal::OutOfRange { .. })));
        match crate::procinfo::all_pids()
            .into_iter()
            .find(|pid| read_stat(*pid).is_ok_and(|s| s.is_kernel_thread()))
        {
            Some(kthread) => assert!(
                matches!(
                    look(kthread),
                    Err(Refusal::KernelThread { .. }) | Err(Refusal::OurAncestor { .. })
                ),
                "{kthread}"
            ),
            None => eprintln!("skipped: no kernel thread visible in this PID namespace"),
        }
    }

    #[test]
    fn another_users_process_is_refused_unless_root() {
        // `inspect` takes the actor as an argument, so the process can be ours and the actor
        // someone else: no root needed, and the test runs everywhere.
        let mut child = sleeper();
        let me = Actor::current();
        let owner = me.uid;
        let other = owner.wrapping_add(1);
        let someone_else = Actor {
            uid: other,
            euid: other,
            ..me.clone()
        };
        let mut procs = ProcReader::new();
        assert_eq!(
            inspect(
                child.id(),
                &someone_else,
                None,
                Provenance::Named,
                &mut procs
            ),
            Err(Refusal::OtherUser {
                pid: child.id(),
                owner_uid: owner,
                our_uid: other
            })
        );
        let root = Actor {
            uid: 0,
            euid: 0,
            ..me.clone()
        };
        let candidate =
            inspect(child.id(), &root, None, Provenance::Named, &mut procs).expect("root may");
        assert_eq!(candidate.uid, owner);
        child.kill().expect("kill");
        child.wait().expect("wait");
    }

    #[test]
    fn several_targets_are_waited_for_together() {
        let mut quick = sleeper();
        let mut stubborn = shell("trap '' TERM; echo ready; exec sleep 60");
        let actor = Actor::current();
        let report = run(
            &request(
                vec![target(quick.id(), &actor), target(stubborn.id(), &actor)],
                300,
            ),
            &mut MemoryAuditLog::default(),
        );
        let after = |r: &TargetReport| match r.outcome {
            TargetOutcome::Exited { after, .. } => after,
            ref other => panic!("{other:?}"),
        };
        // The quick one's exit time is its own, not the stubborn one's.
        assert!(after(&report[0]) < Duration::from_millis(300), "{report:?}");
        assert!(
            after(&report[1]) >= Duration::from_millis(300),
            "{report:?}"
        );
        assert_eq!(killed_by(&mut quick), Some(15));
        assert_eq!(killed_by(&mut stubborn), Some(9));
    }
}
