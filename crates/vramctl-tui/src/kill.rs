//! Killing the selected process: the seam to the safe kill path, and the read-only rule.
//!
//! The UI builds a [`KillTarget`] from what it shows; a [`Killer`] checks it against /proc
//! now ([`Killer::plan`]: who the process is, whether we may signal it) and, once the user
//! confirms, signals it on the verified path ([`Killer::kill`]: pidfd, TERM → KILL,
//! audit). Both run on a worker thread (`tui::event::spawn_actions`): a kill can wait
//! seconds for a process to exit. Whether its GPU memory was released is judged by the UI
//! from the samples that follow, not by the killer (the NVML session is the sampler's); the
//! UI then tells the killer ([`Killer::memory_outcome`]) for the audit record.
//!
//! [`SignalKiller`] is the killer of `top`: `vramctl_procs::signal` (`inspect`, `execute`)
//! with the audit sink of `vramctl kill`. [`Actions`] wraps the killer and refuses
//! everything in a `--readonly` session, at the point of action — not only in the key
//! handling.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::SinkOpener;
use crate::reclaim::{ReclaimOutcome, ReclaimTarget, Reclaimer};
use vramctl_core::clock::SystemClock;
use vramctl_procs::audit_record::AuditOutcome;
use vramctl_procs::procinfo::ProcReader;
use vramctl_procs::signal::{
    self, Actor, AuditId, AuditSink, KillRequest, Provenance, Refusal, Target, TargetOutcome,
};

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
    reclaimer: Option<Box<dyn Reclaimer>>,
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
        Self {
            readonly,
            killer,
            reclaimer: None,
        }
    }

    /// These actions, reclaiming through `reclaimer` (without one, a reclaim is refused).
    #[must_use]
    pub fn with_reclaimer(mut self, reclaimer: Box<dyn Reclaimer>) -> Self {
        self.reclaimer = Some(reclaimer);
        self
    }

    /// [`Reclaimer::reclaim`], unless read-only.
    pub fn reclaim(&mut self, target: &ReclaimTarget) -> ReclaimOutcome {
        if self.readonly {
            return ReclaimOutcome::Refused(READONLY_REASON.to_owned());
        }
        match &mut self.reclaimer {
            Some(reclaimer) => reclaimer.reclaim(target),
            None => ReclaimOutcome::Refused("reclaiming is not available here".to_owned()),
        }
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

/// Seconds `top` waits after `SIGTERM` before `SIGKILL` (as `vramctl kill`'s default).
pub const GRACE: Duration = Duration::from_secs(10);

/// The safe signal path of `vramctl kill`, for `top`: [`signal::inspect`] to plan (the
/// same refusals), [`signal::execute`] to signal (pidfd, identity re-checked after pinning,
/// the audit record written before each signal, `SIGTERM` then `SIGKILL` after [`GRACE`] on
/// the same fd). It blocks while the process is given time to exit: it runs on the action
/// thread.
pub struct SignalKiller {
    actor: Actor,
    procs: ProcReader,
    open_sink: SinkOpener,
    sink: Option<Box<dyn AuditSink + Send>>,
    grace: Duration,
    /// For each kill that sent a signal, by (PID, start time): its last audit record and
    /// when the first signal went out, until the memory outcome is recorded.
    sent: HashMap<(u32, u64), (AuditId, Instant)>,
}

impl std::fmt::Debug for SignalKiller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalKiller")
            .field("actor", &self.actor.pid)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl SignalKiller {
    /// A killer acting as this process, writing to the sink `open_sink` opens at the first
    /// kill (a read-only session never opens it).
    pub fn new(open_sink: SinkOpener) -> Self {
        Self::with_actor(Actor::current(), open_sink, GRACE)
    }

    /// A killer acting as `actor`, waiting `grace` before `SIGKILL`.
    pub fn with_actor(actor: Actor, open_sink: SinkOpener, grace: Duration) -> Self {
        Self {
            actor,
            procs: ProcReader::new(),
            open_sink,
            sink: None,
            grace,
            sent: HashMap::new(),
        }
    }

    fn sink(&mut self) -> Result<&mut Box<dyn AuditSink + Send>, String> {
        if self.sink.is_none() {
            self.sink = Some((self.open_sink)()?);
        }
        self.sink
            .as_mut()
            .ok_or_else(|| "no audit log is open".to_owned())
    }
}

impl Killer for SignalKiller {
    fn plan(&mut self, target: &KillTarget) -> Result<KillPlan, String> {
        let candidate = signal::inspect(
            target.pid,
            &self.actor,
            target.start_time_ticks,
            Provenance::Named,
            &mut self.procs,
        )
        .map_err(|refusal| refusal.to_string())?;
        let start = candidate.identity.start_time_ticks;
        Ok(KillPlan {
            target: target.clone(),
            start_time_ticks: start,
            started_at_unix_ms: self.procs.started_at_unix_ms(start),
            user: candidate
                .user
                .clone()
                .or_else(|| Some(candidate.uid.to_string())),
            command: candidate.command,
            signal: signal::Signal::Term.name().to_owned(),
            escalation: Some(format!(
                "{} after {} s",
                signal::Signal::Kill.name(),
                self.grace.as_secs()
            )),
        })
    }

    fn kill(&mut self, plan: &KillPlan) -> KillOutcome {
        let pid = plan.target.pid;
        // Checked again now, against the start time the user confirmed: that process or
        // nothing (`execute` re-checks once more after pinning it).
        let candidate = match signal::inspect(
            pid,
            &self.actor,
            Some(plan.start_time_ticks),
            Provenance::Named,
            &mut self.procs,
        ) {
            Ok(candidate) => candidate,
            Err(Refusal::NotVisible { .. } | Refusal::Zombie { .. }) => {
                return KillOutcome::AlreadyGone;
            }
            Err(refusal) => {
                return KillOutcome::Refused {
                    reason: refusal.to_string(),
                };
            }
        };
        let grace = self.grace;
        let actor = self.actor.clone();
        let sink = match self.sink() {
            Ok(sink) => sink,
            Err(reason) => {
                return KillOutcome::Failed {
                    reason: format!("{reason}; nothing was signalled"),
                };
            }
        };
        let request = KillRequest {
            grace,
            ..KillRequest::new(
                vec![Target {
                    candidate,
                    reason: format!("vramctl top: kill key on PID {pid}"),
                }],
                "kill",
            )
        };
        let started = Instant::now();
        let report = signal::execute(&request, &actor, sink.as_mut(), &SystemClock)
            .into_iter()
            .next();
        let Some(report) = report else {
            return KillOutcome::Failed {
                reason: "nothing was signalled".to_owned(),
            };
        };
        if let Some(id) = report.last_audit_id() {
            self.sent
                .insert((pid, plan.start_time_ticks), (id, started));
        }
        match report.outcome {
            TargetOutcome::Exited { after, escalated } => KillOutcome::Exited {
                escalated,
                after_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
            },
            TargetOutcome::AlreadyGone => KillOutcome::AlreadyGone,
            TargetOutcome::StillRunning {
                escalated, state, ..
            } => KillOutcome::StillRunning { escalated, state },
            TargetOutcome::Refused { refusal } => KillOutcome::Refused {
                reason: refusal.to_string(),
            },
            TargetOutcome::AuditFailed { error } => KillOutcome::Failed {
                reason: format!(
                    "the audit log refused the record ({error}); nothing was signalled"
                ),
            },
            TargetOutcome::SignalFailed { error } => KillOutcome::Failed { reason: error },
            other => KillOutcome::Failed {
                reason: format!("{other:?}"),
            },
        }
    }

    fn memory_outcome(&mut self, plan: &KillPlan, freed_bytes: Option<u64>) {
        let Some((id, started)) = self.sent.remove(&(plan.target.pid, plan.start_time_ticks))
        else {
            return;
        };
        let Some(sink) = self.sink.as_mut() else {
            return;
        };
        // As `vramctl kill` records it: what the driver no longer lists (0 when it still
        // lists the process), and the time from the first signal until the UI saw that.
        let outcome = AuditOutcome::Exited {
            freed_bytes: freed_bytes.unwrap_or(0),
            after_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        if let Err(err) = sink.after(id, &outcome) {
            tracing::warn!(error = %err, pid = plan.target.pid, "Could not record the outcome of a kill.");
        }
    }
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

    /// An audit sink the test can read while the killer owns its box.
    #[derive(Clone, Default)]
    struct SharedLog(Arc<Mutex<signal::MemoryAuditLog>>);

    impl AuditSink for SharedLog {
        fn before(
            &mut self,
            record: &vramctl_procs::audit_record::AuditRecord,
        ) -> Result<AuditId, signal::AuditError> {
            self.0.lock().unwrap().before(record)
        }

        fn after(&mut self, id: AuditId, outcome: &AuditOutcome) -> Result<(), signal::AuditError> {
            self.0.lock().unwrap().after(id, outcome)
        }
    }

    /// Us, as the killer sees us; in the initial PID namespace whatever the test runs in
    /// (a `sleep` holds no /dev/nvidia* to prove itself a GPU user).
    fn actor() -> Actor {
        Actor {
            namespace_initial: true,
            ..Actor::current()
        }
    }

    fn killer(log: &SharedLog, opened: &Arc<Mutex<u32>>) -> SignalKiller {
        let (log, opened) = (log.clone(), Arc::clone(opened));
        SignalKiller::with_actor(
            actor(),
            Box::new(move || {
                *opened.lock().unwrap() += 1;
                Ok(Box::new(log.clone()) as Box<dyn AuditSink + Send>)
            }),
            Duration::from_secs(10),
        )
    }

    fn sleep() -> std::process::Child {
        let child = std::process::Command::new("sleep")
            .arg("300")
            .spawn()
            .unwrap();
        // Under load /proc/PID/cmdline was seen empty just after the spawn returned (the
        // plan then names the process `[sleep]`): wait until the kernel shows it.
        let cmdline = format!("/proc/{}/cmdline", child.id());
        for _ in 0..1000 {
            if std::fs::read(&cmdline).is_ok_and(|c| c.starts_with(b"sleep\0")) {
                break;
            }
            std::thread::yield_now();
            std::thread::sleep(Duration::from_millis(1));
        }
        child
    }

    #[test]
    fn plan_checks_who_the_process_is_now() {
        let log = SharedLog::default();
        let opened = Arc::new(Mutex::new(0));
        let mut k = killer(&log, &opened);
        let mut child = sleep();
        let pid = child.id();
        let plan = k.plan(&target(pid)).unwrap();
        assert_eq!(plan.command, "sleep 300");
        assert_eq!(plan.signal, "SIGTERM");
        assert_eq!(plan.escalation.as_deref(), Some("SIGKILL after 10 s"));
        assert!(plan.started_at_unix_ms.is_some());
        // Shown with another start time: another process now under that PID.
        let mut stale = target(pid);
        stale.start_time_ticks = Some(plan.start_time_ticks + 1);
        let err = k.plan(&stale).unwrap_err();
        assert!(err.contains("now names another process"), "{err}");
        // The refusals of `vramctl kill`.
        let err = k.plan(&target(std::process::id())).unwrap_err();
        assert!(err.contains("is this vramctl process"), "{err}");
        let err = k.plan(&target(4_194_305)).unwrap_err();
        assert!(err.contains("not a PID"), "{err}");
        assert_eq!(
            *opened.lock().unwrap(),
            0,
            "planning writes no audit record"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        let err = k.plan(&target(pid)).unwrap_err();
        assert!(err.contains("in this PID namespace"), "{err}");
    }

    #[test]
    fn kill_signals_through_the_audited_path_and_records_the_memory_freed() {
        let log = SharedLog::default();
        let opened = Arc::new(Mutex::new(0));
        let mut k = killer(&log, &opened);
        let mut child = sleep();
        let pid = child.id();
        let plan = k.plan(&target(pid)).unwrap();
        let outcome = k.kill(&plan);
        assert!(
            matches!(
                outcome,
                KillOutcome::Exited {
                    escalated: false,
                    ..
                }
            ),
            "{outcome:?}"
        );
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(15), "ended by SIGTERM");
        {
            let records = &log.0.lock().unwrap().records;
            assert_eq!(records.len(), 1, "one record, written before the signal");
            assert_eq!(records[0].target.pid, pid);
            assert_eq!(records[0].target.start_time_ticks, plan.start_time_ticks);
            assert_eq!(records[0].action, "kill");
            assert!(
                records[0].reason.contains("vramctl top"),
                "{}",
                records[0].reason
            );
        }
        k.memory_outcome(&plan, Some(5 << 30));
        let records = &log.0.lock().unwrap().records;
        assert!(
            matches!(
                records[0].outcome,
                AuditOutcome::Exited {
                    freed_bytes,
                    ..
                } if freed_bytes == 5 << 30
            ),
            "{:?}",
            records[0].outcome
        );
        assert_eq!(*opened.lock().unwrap(), 1);
    }

    #[test]
    fn no_audit_log_no_signal() {
        let mut k = SignalKiller::with_actor(
            actor(),
            Box::new(|| Err("cannot open the audit log '/nonexistent/audit.jsonl'".to_owned())),
            Duration::from_secs(10),
        );
        let mut child = sleep();
        let plan = k.plan(&target(child.id())).unwrap();
        let outcome = k.kill(&plan);
        let KillOutcome::Failed { reason } = outcome else {
            panic!("{outcome:?}");
        };
        assert!(reason.contains("nothing was signalled"), "{reason}");
        assert!(child.try_wait().unwrap().is_none(), "still running");
        child.kill().unwrap();
        child.wait().unwrap();
        // Gone between the plan and the confirmation: nothing to signal.
        assert_eq!(k.kill(&plan), KillOutcome::AlreadyGone);
    }

    #[test]
    fn readonly_never_opens_the_audit_log() {
        let log = SharedLog::default();
        let opened = Arc::new(Mutex::new(0));
        let mut actions = Actions::new(true, Box::new(killer(&log, &opened)));
        let mut child = sleep();
        let pid = child.id();
        let plan = killer(&log, &opened).plan(&target(pid)).unwrap();
        assert!(matches!(actions.kill(&plan), KillOutcome::Refused { .. }));
        actions.memory_outcome(&plan, Some(1));
        assert_eq!(*opened.lock().unwrap(), 0);
        assert!(child.try_wait().unwrap().is_none(), "still running");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
