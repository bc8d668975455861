//! Reclaiming the selected process's cache: the seam to `vramctl_agent::reclaim`.
//!
//! The UI builds a [`ReclaimTarget`] from what it shows; a [`Reclaimer`] asks the process's
//! agent to release its framework's cache. It runs on the action worker
//! (`tui::event::spawn_actions`), as a kill does: an `empty_cache` takes the allocator's lock
//! (0.07–0.11 s on an idle H200) and an agent may be slow. [`AgentReclaimer`] is `top`'s:
//! [`reclaim::reclaim_process`], the path of `vramctl reclaim`, with the audit sink of
//! `vramctl kill` (a record before, fail closed; its outcome after). It reads no NVML (the
//! NVML session is the sampler's): the figures it reports are the framework's, from the
//! agent's answer; NVML's drop shows at the next samples.

use vramctl_agent::agent_client::Timeouts;
use vramctl_agent::reclaim::{self, ProcessReclaim, ReclaimRequest, Selection};
use vramctl_procs::procinfo::{self, ProcReader};
use vramctl_procs::signal::{Actor, AuditSink};

use crate::SinkOpener;
use crate::format;

/// The process the user chose, as the UI knew it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimTarget {
    /// PID.
    pub pid: u32,
    /// Start time (clock ticks after boot) when last seen: a reused PID is not reclaimed.
    pub start_time_ticks: Option<u64>,
    /// Command line or driver name.
    pub command: String,
}

/// What a reclaim did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReclaimOutcome {
    /// The framework gave memory back.
    Released {
        /// Reserved before − after, as the framework says.
        released_bytes: u64,
        /// Cache left (in segments a live block pins).
        cached_after_bytes: u64,
    },
    /// Nothing came back.
    Nothing {
        /// The agent's word: `nothing_cached`, `nothing_released`, `no_gpu_allocator`.
        outcome: String,
        /// Cache that stays because live blocks pin its segments.
        pinned_bytes: u64,
    },
    /// The process has no agent (or it does not answer), in one line.
    NoAgent(String),
    /// Not done, and why (read-only, another process under the PID, capturing, ...).
    Refused(String),
    /// It failed (the audit log, the agent's error).
    Failed(String),
}

impl ReclaimOutcome {
    /// One line for the footer.
    pub fn text(&self, pid: u32) -> String {
        match self {
            Self::Released {
                released_bytes,
                cached_after_bytes,
            } => format!(
                "PID {pid}: released {} of cache ({} left); NVML's figure follows at the next samples",
                format::bytes(*released_bytes),
                format::bytes(*cached_after_bytes)
            ),
            Self::Nothing {
                outcome,
                pinned_bytes,
            } => match outcome.as_str() {
                "nothing_cached" => format!("PID {pid}: nothing to reclaim, no cache held"),
                "no_gpu_allocator" => {
                    format!("PID {pid}: nothing to reclaim, no GPU allocator in the process")
                }
                _ if *pinned_bytes > 0 => format!(
                    "PID {pid}: released nothing: {} of cache is pinned by live blocks (vramctl reclaim {pid} lists them)",
                    format::bytes(*pinned_bytes)
                ),
                other => format!("PID {pid}: released nothing ({other})"),
            },
            Self::NoAgent(why) => format!("PID {pid}: cannot reclaim: {why}"),
            Self::Refused(why) => format!("PID {pid}: reclaim refused: {why}"),
            Self::Failed(why) => format!("PID {pid}: reclaim failed: {why}"),
        }
    }
}

/// The reclaim path, as the UI sees it.
pub trait Reclaimer: Send {
    /// Asks `target`'s agent to release its cache, and says what happened.
    fn reclaim(&mut self, target: &ReclaimTarget) -> ReclaimOutcome;
}

/// `vramctl reclaim`'s path for `top`: [`reclaim::reclaim_process`] (no `gc`, no `deep`:
/// what the key promises is the cache only), audited through the sink opened at the first
/// reclaim.
pub struct AgentReclaimer {
    actor: Actor,
    procs: ProcReader,
    open_sink: SinkOpener,
    sink: Option<Box<dyn AuditSink + Send>>,
    timeouts: Timeouts,
}

impl std::fmt::Debug for AgentReclaimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentReclaimer")
            .field("actor", &self.actor.pid)
            .finish_non_exhaustive()
    }
}

impl AgentReclaimer {
    /// A reclaimer acting as this process, writing to the sink `open_sink` opens at the
    /// first reclaim (a read-only session never opens it).
    pub fn new(open_sink: SinkOpener) -> Self {
        Self::with_timeouts(open_sink, Timeouts::default())
    }

    /// As [`AgentReclaimer::new`], with the agent's deadlines `timeouts`.
    pub fn with_timeouts(open_sink: SinkOpener, timeouts: Timeouts) -> Self {
        Self {
            actor: Actor::current(),
            procs: ProcReader::new(),
            open_sink,
            sink: None,
            timeouts,
        }
    }
}

impl Reclaimer for AgentReclaimer {
    fn reclaim(&mut self, target: &ReclaimTarget) -> ReclaimOutcome {
        let boot_id = procinfo::boot_id().unwrap_or_default();
        // The PID the UI showed may be another process by now.
        let now = self
            .procs
            .details(target.pid)
            .and_then(|d| d.identity(&boot_id))
            .map(|i| i.start_time_ticks);
        match (target.start_time_ticks, now) {
            (_, None) => {
                return ReclaimOutcome::Refused(format!(
                    "no process with PID '{}' is running here",
                    target.pid
                ));
            }
            (Some(then), Some(now)) if then != now => {
                return ReclaimOutcome::Refused(format!(
                    "PID '{}' is another process now; nothing was asked",
                    target.pid
                ));
            }
            _ => {}
        }
        if self.sink.is_none() {
            match (self.open_sink)() {
                Ok(sink) => self.sink = Some(sink),
                Err(why) => return ReclaimOutcome::Failed(format!("{why}; nothing was asked")),
            }
        }
        let Some(sink) = self.sink.as_mut() else {
            return ReclaimOutcome::Failed("no audit log is open".to_owned());
        };
        let request = ReclaimRequest {
            selection: Selection::Pids(vec![target.pid]),
            options: vramctl_agent::agent_client::ReclaimOptions::default(),
            timeouts: self.timeouts,
            reason: "vramctl top: reclaim key".to_owned(),
        };
        let result = reclaim::reclaim_process(
            target.pid,
            &request,
            false,
            None,
            sink.as_mut(),
            &mut self.procs,
            &self.actor,
            &boot_id,
        );
        outcome_of(&result)
    }
}

/// What `top` says of one process's reclaim result.
pub fn outcome_of(result: &ProcessReclaim) -> ReclaimOutcome {
    let why = || {
        result
            .error
            .as_ref()
            .map_or_else(|| result.status.to_owned(), |e| e.message.clone())
    };
    match (result.status, &result.agent) {
        ("reclaimed", Some(answer)) => ReclaimOutcome::Released {
            released_bytes: answer.released_bytes,
            cached_after_bytes: answer.cached_after_bytes,
        },
        ("nothing_reclaimed", Some(answer)) => ReclaimOutcome::Nothing {
            outcome: answer.outcome.clone(),
            pinned_bytes: answer.pinned_bytes,
        },
        ("no_agent", _) => ReclaimOutcome::NoAgent(why()),
        ("no_process", _) => ReclaimOutcome::Refused(why()),
        _ => match result.error.as_ref().map(|e| e.code.as_str()) {
            Some("capturing" | "busy") => ReclaimOutcome::Refused(why()),
            _ => ReclaimOutcome::Failed(why()),
        },
    }
}

/// A reclaimer for tests: answers `outcome`, and counts its calls.
#[derive(Debug, Clone)]
pub struct RecordingReclaimer {
    /// What every reclaim answers.
    pub outcome: ReclaimOutcome,
    /// The targets asked, in order.
    pub asked: std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
}

impl RecordingReclaimer {
    /// A reclaimer answering `outcome`.
    pub fn new(outcome: ReclaimOutcome) -> Self {
        Self {
            outcome,
            asked: std::sync::Arc::default(),
        }
    }
}

impl Reclaimer for RecordingReclaimer {
    fn reclaim(&mut self, target: &ReclaimTarget) -> ReclaimOutcome {
        if let Ok(mut asked) = self.asked.lock() {
            asked.push(target.pid);
        }
        self.outcome.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use vramctl_procs::audit_record::{AuditOutcome, AuditRecord};
    use vramctl_procs::signal::{AuditError, AuditId, MemoryAuditLog};

    use super::*;
    use crate::kill::{Actions, KillOutcome, READONLY_REASON, RecordingKiller};

    /// An audit log the test reads while the reclaimer owns its box; counts its openings.
    #[derive(Clone, Default)]
    struct SharedLog {
        log: Arc<Mutex<MemoryAuditLog>>,
        opened: Arc<Mutex<u32>>,
    }

    impl AuditSink for SharedLog {
        fn before(&mut self, record: &AuditRecord) -> Result<AuditId, AuditError> {
            self.log.lock().unwrap().before(record)
        }

        fn after(&mut self, id: AuditId, outcome: &AuditOutcome) -> Result<(), AuditError> {
            self.log.lock().unwrap().after(id, outcome)
        }
    }

    fn reclaimer(log: &SharedLog) -> AgentReclaimer {
        let log = log.clone();
        AgentReclaimer::with_timeouts(
            Box::new(move || {
                *log.opened.lock().unwrap() += 1;
                Ok(Box::new(log.clone()) as Box<dyn AuditSink + Send>)
            }),
            Timeouts {
                quick: Duration::from_secs(1),
                reclaim: Duration::from_secs(1),
            },
        )
    }

    fn start_of(pid: u32) -> Option<u64> {
        let boot_id = procinfo::boot_id().unwrap_or_default();
        ProcReader::new()
            .details(pid)
            .and_then(|d| d.identity(&boot_id))
            .map(|i| i.start_time_ticks)
    }

    #[test]
    fn a_process_without_an_agent_is_said_and_nothing_is_audited() {
        let log = SharedLog::default();
        let mut child = std::process::Command::new("sleep")
            .arg("300")
            .spawn()
            .unwrap();
        let pid = child.id();
        let outcome = reclaimer(&log).reclaim(&ReclaimTarget {
            pid,
            start_time_ticks: start_of(pid),
            command: "sleep 300".into(),
        });
        child.kill().unwrap();
        child.wait().unwrap();
        let ReclaimOutcome::NoAgent(why) = &outcome else {
            panic!("{outcome:?}");
        };
        assert!(
            outcome
                .text(pid)
                .starts_with(&format!("PID {pid}: cannot reclaim: ")),
            "{why}"
        );
        assert!(log.log.lock().unwrap().records.is_empty());
    }

    #[test]
    fn a_reused_pid_is_not_reclaimed_nor_the_audit_log_opened() {
        let log = SharedLog::default();
        let me = std::process::id();
        let then = start_of(me).unwrap().wrapping_add(1);
        let outcome = reclaimer(&log).reclaim(&ReclaimTarget {
            pid: me,
            start_time_ticks: Some(then),
            command: "someone else".into(),
        });
        assert!(
            matches!(&outcome, ReclaimOutcome::Refused(why) if why.contains("another process now")),
            "{outcome:?}"
        );
        assert_eq!(*log.opened.lock().unwrap(), 0);
    }

    #[test]
    fn a_readonly_session_never_reclaims() {
        let asked = RecordingReclaimer::new(ReclaimOutcome::Released {
            released_bytes: 1,
            cached_after_bytes: 0,
        });
        let calls = Arc::clone(&asked.asked);
        let mut actions = Actions::new(
            true,
            Box::new(RecordingKiller::new(KillOutcome::AlreadyGone)),
        )
        .with_reclaimer(Box::new(asked));
        let target = ReclaimTarget {
            pid: 7,
            start_time_ticks: None,
            command: String::new(),
        };
        assert_eq!(
            actions.reclaim(&target),
            ReclaimOutcome::Refused(READONLY_REASON.to_owned())
        );
        assert!(calls.lock().unwrap().is_empty());
    }

    #[test]
    fn nothing_released_names_the_pinned_cache() {
        let outcome = ReclaimOutcome::Nothing {
            outcome: "nothing_released".into(),
            pinned_bytes: 8 << 30,
        };
        assert_eq!(
            outcome.text(5),
            "PID 5: released nothing: 8.0G of cache is pinned by live blocks (vramctl reclaim 5 lists them)"
        );
    }
}
