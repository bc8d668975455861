//! `vramctl reclaim`: ask processes' agents ([`crate::agent_client`]) to return their
//! framework's cache to the driver, and check through the backend what NVML shows
//! returned.
//!
//! The two numbers differ on purpose: `released_bytes` is what the framework says it gave
//! back (PyTorch's reserved before − after), `nvml_returned_bytes` what the driver's
//! per-process figure dropped by. The CUDA context, live tensors and memory the framework's
//! allocator does not manage stay in NVML's figure.
//!
//! Audited like `kill` ([`AuditSink`]): a record is written before each reclaim that changes
//! something (not for a dry run), its outcome after; a record that cannot be written stops
//! that reclaim (fail closed).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::agent_client::{AgentClient, AgentError, ReclaimAnswer, ReclaimOptions, Timeouts};
use crate::remote_exec;
use vramctl_core::types::Snapshot;
use vramctl_gpu::backend::Backend;
use vramctl_gpu::sampler::Sampler;
use vramctl_procs::audit_record::{AuditOutcome, AuditRecord};
use vramctl_procs::procinfo::{self, ProcReader};
use vramctl_procs::signal::{Actor, AuditSink};

/// How long to keep reading NVML after a reclaim when it does not yet show most of what
/// the framework released. `empty_cache` returns only after `cudaFree` has, so NVML
/// normally shows the drop at once; round 2 (research §5.3) measured 0.08–0.10 s from the
/// request to NVML's drop on the H200, the reclaim itself included. Checked against the
/// `nvml_drop_after_s` of `scripts/agent-h200.sh`.
pub const NVML_SETTLE: Duration = Duration::from_secs(1);
/// Between two NVML readings while settling.
pub const NVML_SETTLE_STEP: Duration = Duration::from_millis(100);
/// "Most of": NVML's drop counts as settled at this share of what was released (NVML
/// rounds per-process figures to MiB and the driver may keep a little).
pub const SETTLED_SHARE: f64 = 0.9;

/// Which processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// These PIDs (each is asked, agent or not).
    Pids(Vec<u32>),
    /// Every process NVML lists on any GPU; those without an agent are reported as such.
    All,
    /// These PIDs, without an agent: the same reclaim run in each through `sys.remote_exec`
    /// (Python 3.14+, [`crate::remote_exec`]), or why that is not available.
    Attach(Vec<u32>),
}

/// What the user asked for.
#[derive(Debug, Clone)]
pub struct ReclaimRequest {
    /// The processes.
    pub selection: Selection,
    /// `gc` and `dry_run` as sent to each agent.
    pub options: ReclaimOptions,
    /// The agent's deadlines.
    pub timeouts: Timeouts,
    /// Why, for the audit log (the user's command line).
    pub reason: String,
}

/// One process's result.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessReclaim {
    /// The process.
    pub pid: u32,
    /// Its command line, when /proc shows it.
    pub command: Option<String>,
    /// Its user.
    pub user: Option<String>,
    /// `reclaimed`, `nothing_reclaimed`, `would_reclaim`, `nothing_to_reclaim`, `no_agent`,
    /// `not_attachable` (`--attach`: why in `error`), `no_process`, `error`.
    pub status: &'static str,
    /// NVML's figure for the process before (Σ over GPUs); `None` when NVML does not list it
    /// or cannot say.
    pub nvml_before_bytes: Option<u64>,
    /// NVML's figure after.
    pub nvml_after_bytes: Option<u64>,
    /// Before − after (negative: it grew meanwhile).
    pub nvml_returned_bytes: Option<i64>,
    /// What the framework says it released (a dry run: would release).
    pub released_bytes: Option<u64>,
    /// The agent's whole answer.
    pub agent: Option<ReclaimAnswer>,
    /// Why not, when the agent could not be asked or refused.
    pub error: Option<ErrorSummary>,
}

/// An error for people and scripts.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorSummary {
    /// [`AgentError::code`], or `no_process`, `audit`.
    pub code: String,
    /// One line.
    pub message: String,
}

/// Every process's result.
#[derive(Debug, Clone, Serialize)]
pub struct ReclaimReport {
    /// Nothing was changed.
    pub dry_run: bool,
    /// `gc.collect()` was asked for.
    pub gc: bool,
    /// In PID order.
    pub processes: Vec<ProcessReclaim>,
    /// Σ released (or, for a dry run, releasable) by the frameworks.
    pub released_bytes: u64,
    /// Σ NVML's drop over the processes it lists before and after.
    pub nvml_returned_bytes: Option<i64>,
}

impl ReclaimReport {
    /// Whether anything was (or, in a dry run, would be) released anywhere: the command's
    /// success.
    pub fn reclaimed_anything(&self) -> bool {
        self.released_bytes > 0
    }
}

/// NVML's figure for `pid` in `snapshot`, Σ over GPUs; `None` when no GPU lists it with a
/// figure.
pub fn nvml_used_bytes(snapshot: &Snapshot, pid: u32) -> Option<u64> {
    let mut total = None;
    for device in &snapshot.devices {
        let Some(processes) = device.reading().and_then(|r| r.processes.as_ref()) else {
            continue;
        };
        for p in processes.iter().filter(|p| p.pid == pid) {
            if let Some(used) = p.used_bytes {
                total = Some(total.unwrap_or(0_u64).saturating_add(used));
            }
        }
    }
    total
}

fn nvml_pids(snapshot: &Snapshot) -> Vec<u32> {
    let pids: BTreeSet<u32> = snapshot
        .devices
        .iter()
        .filter_map(|d| d.reading().and_then(|r| r.processes.as_ref()))
        .flatten()
        .map(|p| p.pid)
        .collect();
    pids.into_iter().collect()
}

/// Runs `request`: NVML before, each agent's reclaim (audited through `sink` unless a dry
/// run), NVML after (settling up to [`NVML_SETTLE`]).
pub fn reclaim<B: Backend>(
    sampler: &mut Sampler<B>,
    request: &ReclaimRequest,
    sink: &mut dyn AuditSink,
) -> ReclaimReport {
    let before = sampler.tick();
    let pids = match &request.selection {
        Selection::Pids(pids) | Selection::Attach(pids) => {
            let unique: BTreeSet<u32> = pids.iter().copied().collect();
            unique.into_iter().collect()
        }
        Selection::All => nvml_pids(&before),
    };
    let attach = matches!(request.selection, Selection::Attach(_));
    let actor = Actor::current();
    let boot_id = procinfo::boot_id().unwrap_or_default();
    let mut reader = ProcReader::new();
    let mut processes = Vec::new();
    for pid in pids {
        let nvml_before_bytes = nvml_used_bytes(&before, pid);
        processes.push(reclaim_process(
            pid,
            request,
            attach,
            nvml_before_bytes,
            sink,
            &mut reader,
            &actor,
            &boot_id,
        ));
    }
    let after = settle(sampler, &processes);
    let mut nvml_total: Option<i64> = None;
    for p in &mut processes {
        p.nvml_after_bytes = nvml_used_bytes(&after, p.pid);
        if let (Some(b), Some(a)) = (p.nvml_before_bytes, p.nvml_after_bytes) {
            let returned =
                i64::try_from(b).unwrap_or(i64::MAX) - i64::try_from(a).unwrap_or(i64::MAX);
            p.nvml_returned_bytes = Some(returned);
            nvml_total = Some(nvml_total.unwrap_or(0).saturating_add(returned));
        }
    }
    ReclaimReport {
        dry_run: request.options.dry_run,
        gc: request.options.gc,
        released_bytes: processes.iter().filter_map(|p| p.released_bytes).sum(),
        nvml_returned_bytes: nvml_total,
        processes,
    }
}

/// One process's reclaim, without NVML (`reclaim` reads it around all of them; `top`
/// leaves the figure after to its sampler): its agent asked (or, with `attach`, the same
/// reclaim run in it through `sys.remote_exec`), the audit record written before (fail
/// closed) and its outcome after, unless `request` is a dry run. `nvml_before_bytes` is
/// passed through to the result.
#[allow(clippy::too_many_arguments)]
pub fn reclaim_process(
    pid: u32,
    request: &ReclaimRequest,
    attach: bool,
    nvml_before_bytes: Option<u64>,
    sink: &mut dyn AuditSink,
    reader: &mut ProcReader,
    actor: &Actor,
    boot_id: &str,
) -> ProcessReclaim {
    let details = reader.details(pid).filter(|d| !d.is_zombie());
    let mut result = ProcessReclaim {
        pid,
        command: details.as_ref().map(|d| d.command.clone()),
        user: details.as_ref().and_then(|d| d.user.clone()),
        status: "error",
        nvml_before_bytes,
        nvml_after_bytes: None,
        nvml_returned_bytes: None,
        released_bytes: None,
        agent: None,
        error: None,
    };
    let Some(details) = details else {
        result.status = "no_process";
        result.error = Some(ErrorSummary {
            code: "no_process".into(),
            message: format!("no process with PID '{pid}' is running here"),
        });
        return result;
    };
    let mut transport = if attach {
        match remote_exec::plan(pid) {
            Ok(plan) => Transport::Attach(plan),
            Err(why) => {
                result.status = "not_attachable";
                result.error = Some(ErrorSummary {
                    code: why.code().to_owned(),
                    message: why.to_string(),
                });
                return result;
            }
        }
    } else {
        match AgentClient::connect(pid, request.timeouts) {
            Ok(client) => Transport::Agent(Box::new(client)),
            Err(err) => {
                result.status = if err.is_no_agent() {
                    "no_agent"
                } else {
                    "error"
                };
                result.error = Some(summary(&err));
                return result;
            }
        }
    };
    let audit = if request.options.dry_run {
        None
    } else {
        let record = AuditRecord {
            at_unix_ms: jiff::Timestamp::now().as_millisecond(),
            actor_uid: actor.uid,
            actor_user: actor.user.clone(),
            action: "reclaim".into(),
            target: details
                .identity(boot_id)
                .unwrap_or_else(|| procinfo::ProcessIdentity {
                    boot_id: boot_id.to_owned(),
                    pid,
                    start_time_ticks: 0,
                }),
            target_command: details.command.clone(),
            target_user: details.user.clone(),
            // No signal: the process's own agent acts.
            signal: "none".into(),
            reason: request.reason.clone(),
            outcome: AuditOutcome::Pending,
        };
        match sink.before(&record) {
            Ok(id) => Some(id),
            Err(err) => {
                result.error = Some(ErrorSummary {
                    code: "audit".into(),
                    message: format!(
                        "not reclaimed: the audit record could not be written ({})",
                        err.0
                    ),
                });
                return result;
            }
        }
    };
    let answer = match &mut transport {
        Transport::Agent(client) => client.reclaim(request.options).map_err(|err| {
            let refused = matches!(&err, AgentError::Refused { code, .. } if code == "capturing" || code == "busy");
            (summary(&err), refused)
        }),
        Transport::Attach(plan) => {
            remote_exec::reclaim(plan, request.options, request.timeouts.reclaim).map_err(
                |err| {
                    let refused = matches!(&err, remote_exec::AttachError::Refused { code, .. } if code == "capturing");
                    (
                        ErrorSummary {
                            code: err.code().to_owned(),
                            message: err.to_string(),
                        },
                        refused,
                    )
                },
            )
        }
    };
    let outcome = match &answer {
        Ok(a) => AuditOutcome::Reclaimed {
            released_bytes: a.released_bytes,
        },
        Err((err, true)) => AuditOutcome::Refused(format!("{} ({})", err.message, err.code)),
        Err((err, false)) => AuditOutcome::Failed(err.message.clone()),
    };
    if let Some(id) = audit {
        if let Err(err) = sink.after(id, &outcome) {
            tracing::warn!(error = %err.0, pid, "Could not record a reclaim's outcome.");
        }
    }
    match answer {
        Ok(a) => {
            result.released_bytes = Some(a.released_bytes);
            result.status = match (request.options.dry_run, a.released_bytes > 0) {
                (false, true) => "reclaimed",
                (false, false) => "nothing_reclaimed",
                (true, true) => "would_reclaim",
                (true, false) => "nothing_to_reclaim",
            };
            result.agent = Some(a);
        }
        Err((err, _)) => result.error = Some(err),
    }
    result
}

/// How a process is asked: its agent, or a script run in it through `sys.remote_exec`.
enum Transport {
    Agent(Box<AgentClient>),
    Attach(remote_exec::Plan),
}

/// NVML after the reclaims: read again, up to [`NVML_SETTLE`], while a process that released
/// memory does not show most of it returned.
fn settle<B: Backend>(sampler: &mut Sampler<B>, processes: &[ProcessReclaim]) -> Snapshot {
    let deadline = Instant::now() + NVML_SETTLE;
    loop {
        let snapshot = sampler.tick();
        let unsettled = processes.iter().any(|p| {
            let (Some(released), Some(before)) = (p.released_bytes, p.nvml_before_bytes) else {
                return false;
            };
            if p.agent.as_ref().is_none_or(|a| a.dry_run) || released == 0 {
                return false;
            }
            let after = nvml_used_bytes(&snapshot, p.pid).unwrap_or(0);
            (before.saturating_sub(after) as f64) < SETTLED_SHARE * released as f64
        });
        if !unsettled || Instant::now() + NVML_SETTLE_STEP > deadline {
            return snapshot;
        }
        std::thread::sleep(NVML_SETTLE_STEP);
    }
}

fn summary(err: &AgentError) -> ErrorSummary {
    ErrorSummary {
        code: err.code().to_owned(),
        message: err.to_string(),
    }
}
