//! Killing the selected process: the seam to the safe kill path, and the read-only rule.
//!
//! The UI builds a [`KillTarget`] from what it shows; a [`Killer`] checks it against /proc
//! now ([`Killer::plan`]: who the process is, whether we may signal it) and, once the user
//! confirms, signals it on the verified path ([`Killer::kill`]: pidfd, TERM → KILL,
//! audit). Both run on a worker thread ([`super::event::spawn_actions`]): a kill can wait
//! seconds for a process to exit. Whether its GPU memory was released is judged by the UI
//! from the samples that follow, not by the killer (the NVML session is the sampler's).
//!
//! [`Actions`] wraps the killer and refuses everything in a `--readonly` session, at the
//! point of action — not only in the key handling.

use std::sync::{Arc, Mutex};

use vramctl_core::procinfo::ProcReader;

/// Memory a process holds on one GPU, as the UI last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuMemory {
    /// `GPU 0`, `GPU 1 MIG 1g.18gb`.
    pub label: String,
    /// The GPU's UUID.
    pub uuid: String,
    /// Bytes held; `None` when the driver does not say.
    pub used_bytes: Option<u64>,
}

/// The process the user chose, as the UI knew it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillTarget {
    /// PID.
    pub pid: u32,
    /// Start time (clock ticks after boot) when last seen; `None` if /proc did not show it.
    pub start_time_ticks: Option<u64>,
    /// Start as wall-clock time, when known.
    pub started_at_unix_ms: Option<i64>,
    /// User, when known.
    pub user: Option<String>,
    /// Command line or driver name.
    pub command: String,
    /// Memory on each GPU.
    pub memory: Vec<GpuMemory>,
}

/// A target checked against /proc now, ready to confirm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillPlan {
    /// The target as the UI knew it.
    pub target: KillTarget,
    /// Start time now (equal to the target's when it had one).
    pub start_time_ticks: u64,
    /// Start as wall-clock time, when known.
    pub started_at_unix_ms: Option<i64>,
    /// User now.
    pub user: Option<String>,
    /// Command now.
    pub command: String,
    /// The first signal, e.g. `SIGTERM`.
    pub signal: String,
    /// What happens if it does not exit, e.g. `SIGKILL after 10 s`.
    pub escalation: Option<String>,
}

/// What the kill did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KillOutcome {
    /// The process exited.
    Exited {
        /// Whether it took `SIGKILL`.
        escalated: bool,
        /// Time from the first signal to its exit.
        after_ms: u64,
    },
    /// It was gone before anything was sent.
    AlreadyGone,
    /// Still running at the end (e.g. stuck in the driver).
    StillRunning {
        /// Whether `SIGKILL` was sent.
        escalated: bool,
        /// Its state letter at the end.
        state: Option<char>,
    },
    /// Not signalled, and why.
    Refused {
        /// The rule it broke, or why the action is unavailable.
        reason: String,
    },
    /// The signal could not be sent.
    Failed {
        /// What the kernel or the audit log said.
        reason: String,
    },
}

/// The safe kill path, as the UI sees it.
pub trait Killer: Send {
    /// Checks `target` now without signalling it.
    ///
    /// # Errors
    /// Why it may not be signalled (another process under this PID now, not ours, PID 1,
    /// gone, ...), in one line.
    fn plan(&mut self, target: &KillTarget) -> Result<KillPlan, String>;

    /// Signals the planned process, waits for it, and says what happened.
    fn kill(&mut self, plan: &KillPlan) -> KillOutcome;

    /// What became of the memory after the process exited, as the UI saw it in the samples
    /// that followed: `Some(bytes)` released, `None` still listed by the driver. For the
    /// audit record of the kill.
    fn memory_outcome(&mut self, _plan: &KillPlan, _freed_bytes: Option<u64>) {}
}

/// The reason every action gives in a read-only session.
pub const READONLY_REASON: &str = "read-only session (--readonly): actions are disabled";

/// The killer behind the read-only rule; what the action worker calls.
pub struct Actions {
    readonly: bool,
    killer: Box<dyn Killer>,
}

impl std::fmt::Debug for Actions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actions")
            .field("readonly", &self.readonly)
            .finish_non_exhaustive()
    }
}

impl Actions {
    /// Actions through `killer`; none at all when `readonly`.
    pub fn new(readonly: bool, killer: Box<dyn Killer>) -> Self {
        Self { readonly, killer }
    }

    /// [`Killer::plan`], unless read-only.
    ///
    /// # Errors
    /// The killer's refusal, or [`READONLY_REASON`].
    pub fn plan(&mut self, target: &KillTarget) -> Result<KillPlan, String> {
        if self.readonly {
            return Err(READONLY_REASON.to_owned());
        }
        self.killer.plan(target)
    }

    /// [`Killer::kill`], unless read-only.
    pub fn kill(&mut self, plan: &KillPlan) -> KillOutcome {
        if self.readonly {
            return KillOutcome::Refused {
                reason: READONLY_REASON.to_owned(),
            };
        }
        self.killer.kill(plan)
    }

    /// [`Killer::memory_outcome`] (a read-only session killed nothing to report on).
    pub fn memory_outcome(&mut self, plan: &KillPlan, freed_bytes: Option<u64>) {
        if !self.readonly {
            self.killer.memory_outcome(plan, freed_bytes);
        }
    }
}

/// The killer of this build until the safe signal path (`vramctl kill`) is merged: it
/// checks the target against /proc as a plan would, and refuses to signal.
#[derive(Debug, Default)]
pub struct UnwiredKiller {
    procs: ProcReader,
}

/// Why [`UnwiredKiller`] refuses.
pub const UNWIRED_REASON: &str =
    "killing from top is not available in this build yet (the safe signal path is not wired)";

impl Killer for UnwiredKiller {
    fn plan(&mut self, target: &KillTarget) -> Result<KillPlan, String> {
        plan_from_proc(&mut self.procs, target)
    }

    fn kill(&mut self, _plan: &KillPlan) -> KillOutcome {
        KillOutcome::Refused {
            reason: UNWIRED_REASON.to_owned(),
        }
    }
}

/// Checks `target` against /proc: it must still be the same process.
///
/// # Errors
/// When the PID is gone, cannot be read, or now names another process.
pub fn plan_from_proc(procs: &mut ProcReader, target: &KillTarget) -> Result<KillPlan, String> {
    let pid = target.pid;
    let details = procs
        .details(pid)
        .ok_or_else(|| format!("process {pid} is not visible in this PID namespace"))?;
    let start = details
        .start_time_ticks
        .ok_or_else(|| format!("the start time of process {pid} cannot be read"))?;
    if target.start_time_ticks.is_some_and(|s| s != start) {
        return Err(format!(
            "process {pid} is not the one shown: its PID now names another process"
        ));
    }
    let started_at_unix_ms = procfs::boot_time_secs().ok().and_then(|boot| {
        let ticks = procfs::ticks_per_second().max(1);
        let ms = u128::from(boot) * 1000 + u128::from(start) * 1000 / u128::from(ticks);
        i64::try_from(ms).ok()
    });
    Ok(KillPlan {
        target: target.clone(),
        start_time_ticks: start,
        started_at_unix_ms,
        user: details.user.or_else(|| details.uid.map(|u| u.to_string())),
        command: details.command,
        signal: "SIGTERM".to_owned(),
        escalation: Some("SIGKILL after 10 s".to_owned()),
    })
}

/// A call the [`RecordingKiller`] received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillerCall {
    /// `plan` for this PID.
    Plan(u32),
    /// `kill` for this PID.
    Kill(u32),
    /// `memory_outcome` for this PID.
    MemoryOutcome(u32, Option<u64>),
}

/// A test double: records its calls and answers what it was told to.
#[derive(Debug, Clone)]
pub struct RecordingKiller {
    /// The calls so far, shared with the test.
    pub calls: Arc<Mutex<Vec<KillerCall>>>,
    /// `Some(reason)`: `plan` refuses with it.
    pub refuse_plan: Option<String>,
    /// What `kill` answers.
    pub outcome: KillOutcome,
}

impl RecordingKiller {
    /// Plans everything as the target says (start time 1000 if it has none) and answers
    /// `outcome` to kills.
    pub fn new(outcome: KillOutcome) -> Self {
        Self {
            calls: Arc::default(),
            refuse_plan: None,
            outcome,
        }
    }
}

impl Killer for RecordingKiller {
    fn plan(&mut self, target: &KillTarget) -> Result<KillPlan, String> {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(KillerCall::Plan(target.pid));
        }
        if let Some(reason) = &self.refuse_plan {
            return Err(reason.clone());
        }
        Ok(KillPlan {
            target: target.clone(),
            start_time_ticks: target.start_time_ticks.unwrap_or(1000),
            started_at_unix_ms: target.started_at_unix_ms,
            user: target.user.clone(),
            command: target.command.clone(),
            signal: "SIGTERM".to_owned(),
            escalation: Some("SIGKILL after 10 s".to_owned()),
        })
    }

    fn kill(&mut self, plan: &KillPlan) -> KillOutcome {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(KillerCall::Kill(plan.target.pid));
        }
        self.outcome.clone()
    }

    fn memory_outcome(&mut self, plan: &KillPlan, freed_bytes: Option<u64>) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(KillerCall::MemoryOutcome(plan.target.pid, freed_bytes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(pid: u32) -> KillTarget {
        KillTarget {
            pid,
            start_time_ticks: None,
            started_at_unix_ms: None,
            user: Some("alice".into()),
            command: "python train.py".into(),
            memory: vec![],
        }
    }

    #[test]
    fn readonly_refuses_at_the_point_of_action() {
        let killer = RecordingKiller::new(KillOutcome::AlreadyGone);
        let calls = Arc::clone(&killer.calls);
        let mut actions = Actions::new(true, Box::new(killer.clone()));
        assert_eq!(actions.plan(&target(7)), Err(READONLY_REASON.to_owned()));
        // Even a plan made elsewhere is not carried out.
        let plan = RecordingKiller::new(KillOutcome::AlreadyGone)
            .plan(&target(7))
            .unwrap();
        assert_eq!(
            actions.kill(&plan),
            KillOutcome::Refused {
                reason: READONLY_REASON.to_owned()
            }
        );
        assert!(
            calls.lock().unwrap().is_empty(),
            "the killer was never called"
        );
    }

    #[test]
    fn actions_reach_the_killer_when_allowed() {
        let killer = RecordingKiller::new(KillOutcome::Exited {
            escalated: false,
            after_ms: 40,
        });
        let calls = Arc::clone(&killer.calls);
        let mut actions = Actions::new(false, Box::new(killer));
        let plan = actions.plan(&target(9)).unwrap();
        assert!(matches!(actions.kill(&plan), KillOutcome::Exited { .. }));
        assert_eq!(
            *calls.lock().unwrap(),
            vec![KillerCall::Plan(9), KillerCall::Kill(9)]
        );
    }

    #[test]
    fn plan_checks_identity_against_proc() {
        let mut procs = ProcReader::new();
        let me = std::process::id();
        let start = procs.details(me).unwrap().start_time_ticks;
        let mut t = target(me);
        t.start_time_ticks = start;
        let plan = plan_from_proc(&mut procs, &t).unwrap();
        assert_eq!(Some(plan.start_time_ticks), start);
        assert!(!plan.command.is_empty());
        t.start_time_ticks = start.map(|s| s + 1);
        let err = plan_from_proc(&mut procs, &t).unwrap_err();
        assert!(err.contains("another process"), "{err}");
        let err = plan_from_proc(&mut procs, &target(4_194_305)).unwrap_err();
        assert!(err.contains("not visible"), "{err}");
    }

    #[test]
    fn the_unwired_killer_never_signals() {
        let mut k = UnwiredKiller::default();
        let me = std::process::id();
        let plan = k.plan(&target(me)).unwrap();
        assert_eq!(
            k.kill(&plan),
            KillOutcome::Refused {
                reason: UNWIRED_REASON.to_owned()
            }
        );
    }
}
