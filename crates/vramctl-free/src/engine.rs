//! One pass of `reap`: policy-driven reclaim of GPU memory from idle holders.
//!
//! A round: on one sample of the GPUs, join each process holding memory with /proc, find the
//! idle evidence for each of its GPUs (the recorded history through `leaks`' scan, or
//! the live analysis (`vramctl_observe::verdict::AnalysisJudge`) when the binary feeds
//! every live sample to [`Engine::observe`];
//! `evidence.rs`), judge it against each policy ([`crate::decide`], pure), have the
//! executor prove that the safe path would signal it ([`ReapExecutor::inspect`]), cap the
//! number with `max_kills`, and report the plan with the evidence for each candidate and the
//! reason for each process left alone. When applied, the candidates go to
//! [`ReapExecutor::terminate`] as an automatic kill (`Origin::Policy`: refused without
//! pidfds; action `reap` in the audit log), which also checks that the memory came back
//! ([`crate::memory_release`]), or with [`Action::Reclaim`] to their agents
//! ([`ReapExecutor::reclaim`]).
//!
//! The engine signals nothing and writes no audit record itself: every effect goes through
//! the executor, and the wall clock it stamps the signal with is injected, so a pass is
//! tested with a recording executor.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail};
use jiff::tz::TimeZone;
use serde::Serialize;
use vramctl_agent::reclaim::{ProcessReclaim, ReclaimRequest};
use vramctl_core::clock::Clock;
use vramctl_core::types::{DeviceInfo, Snapshot};
use vramctl_core::wall_time::{clock, same_day};
use vramctl_leaks::analysis::live::{FleetConfig, SeriesKey};
use vramctl_leaks::analysis::{Evidence, LeakConfig, Verdict};
use vramctl_observe::gpu_holdings::{GpuHolding, holdings};
use vramctl_observe::gpu_selection::GpuFilter;
use vramctl_observe::observation::{Observation, Observer};
use vramctl_observe::units;
use vramctl_observe::verdict::AnalysisJudge;
use vramctl_procs::signal::{
    Candidate, KillRequest, Origin, Refusal, Signal, Target, TargetOutcome, TargetReport,
};
use vramctl_store::format::rfc3339;

use crate::decide::{
    self, Context as DecideContext, CpuSince, GpuEvidence, GpuNow, Observed, Source, Stage,
};
use crate::evidence::{FRESH, History, read_history};
use crate::memory_release::{DeviceRelease, Outcome, StillHeld};
use crate::policy::{self, Policy, PolicyJson};

/// Version of the JSON below; bumped on any incompatible change.
pub const SCHEMA: u32 = 1;

/// The history is analysed over at least this long before now (as `leaks` does), and over
/// twice the longest `idle_for` when that is longer.
const LOOKBACK: Duration = Duration::from_secs(24 * 3600);

/// What is done to a candidate (`--action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// End it (signal, escalate after the grace period).
    Kill,
    /// Ask its agent to release its framework's cache; nobody is signalled.
    Reclaim,
}

impl Action {
    /// `kill`, `reclaim`: the report's `action`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Reclaim => "reclaim",
        }
    }
}

/// A pass's settings, settled from the command line by the binary.
#[derive(Debug, Clone)]
pub struct ReapConfig {
    /// Tried in order; the first that picks a process is its policy.
    pub policies: Vec<Policy>,
    /// The analysis's settings ([`leak_config`]).
    pub leak: LeakConfig,
    /// Act (`--apply`); otherwise only the plan.
    pub apply: bool,
    pub action: Action,
    /// At most this many candidates per pass, over all policies (`--max-kills`).
    pub max_kills: Option<usize>,
    /// The first signal of a kill.
    pub signal: Signal,
    /// How long a target has after the first signal before it is escalated.
    pub grace: Duration,
    /// How long to wait for the memory to come back after the kill.
    pub timeout: Duration,
    /// The recorded history read for idle evidence.
    pub db: PathBuf,
    /// Watch the GPUs live between passes (`--every`): [`Engine::observe`] feeds a tracker.
    pub live: bool,
    /// The boot this runs in: the history's processes of other boots are other processes.
    pub boot_id: Option<String>,
    /// The zone times are shown in.
    pub tz: TimeZone,
    /// Clock ticks per second (`/proc`'s CPU times are in ticks).
    pub ticks_per_second: u64,
}

/// The analysis's settings for `policies`: the shortest `idle_for` and the smallest
/// `min_mem` of any of them, so that the history finds every process one of them may pick.
///
/// # Errors
/// Settings the analysis refuses.
pub fn leak_config(policies: &[Policy]) -> anyhow::Result<LeakConfig> {
    let cfg = LeakConfig {
        idle_for: policies
            .iter()
            .map(|p| p.idle_for)
            .min()
            .unwrap_or(policy::DEFAULT_IDLE_FOR),
        min_idle_bytes: policies.iter().map(|p| p.min_mem_bytes).min().unwrap_or(0),
        ..LeakConfig::default()
    };
    cfg.validate().map_err(|e| anyhow!("{e}"))?;
    Ok(cfg)
}

/// What a kill did: each target's outcome, each device's memory before and after, and who
/// still holds what was not released.
#[derive(Debug, Default)]
pub struct Terminated {
    pub outcomes: Vec<TargetReport>,
    pub devices: Vec<DeviceRelease>,
    pub still_held: Vec<StillHeld>,
}

/// What the engine reads from and does to the machine beyond the sample it is given: the
/// real one signals through `vramctl_procs::signal`, reclaims through
/// `vramctl_agent::reclaim` and audits to the binary's audit log; tests record the calls.
pub trait ReapExecutor {
    /// The driver's name for a PID /proc cannot see.
    fn process_name(&mut self, pid: u32) -> Option<String>;

    /// Proves who `pid` is right before it may be signalled (`signal::inspect`); a refusal
    /// (exited, another process under the PID now, not ours to signal) leaves it alone.
    ///
    /// # Errors
    /// Why the safe path would not signal it.
    fn inspect(&mut self, pid: u32, start_time_ticks: Option<u64>) -> Result<Candidate, Refusal>;

    /// Where the audit log is, for the report; `None` when none is open, and then nothing
    /// is done (no effect without its audit record).
    fn audit_log(&self) -> Option<String>;

    /// Ends the targets, each audited, then waits up to `timeout` for the memory they held
    /// on `before` (`held_before`, by PID) to come back, and records the bytes freed in
    /// their audit records.
    fn terminate(
        &mut self,
        request: &KillRequest,
        before: &Snapshot,
        held_before: &BTreeMap<u32, Vec<GpuHolding>>,
        timeout: Duration,
    ) -> Terminated;

    /// Asks the agent of the process `request` selects to release its cache (audited);
    /// what each process released.
    fn reclaim(&mut self, request: &ReclaimRequest) -> Vec<ProcessReclaim>;
}

/// What the engine watches live between passes.
pub struct Live {
    /// The live analysis of every sample (its tracker's reports are the evidence).
    judge: AnalysisJudge,
    /// The first sample's time.
    pub since_unix_ms: Option<i64>,
    /// Samples seen.
    pub samples: u64,
}

/// The state kept across passes.
pub struct Engine {
    config: ReapConfig,
    /// What /proc says about the GPU processes: their names, identity and CPU time.
    observer: Observer,
    lookback: Duration,
    live: Option<Live>,
    /// Stamps the moment of the signal in the report.
    clock: Arc<dyn Clock>,
}

/// One process chosen, with what the plan and the audit log say about it.
struct Chosen {
    observed: Observed,
    policy: String,
    candidate: Candidate,
    judged: decide::Chosen,
}

impl Engine {
    /// An engine for `config`, its wall clock `clock`.
    ///
    /// # Errors
    /// Live-tracking settings the tracker refuses.
    pub fn new(config: ReapConfig, clock: Arc<dyn Clock>) -> anyhow::Result<Self> {
        let longest = config
            .policies
            .iter()
            .map(|p| p.idle_for)
            .max()
            .unwrap_or(policy::DEFAULT_IDLE_FOR);
        let live = if config.live {
            Some(Live {
                judge: AnalysisJudge::with_fleet_config(FleetConfig {
                    leak: config.leak.clone(),
                    ..FleetConfig::default()
                })
                .map_err(|e| anyhow!("{e}"))?,
                since_unix_ms: None,
                samples: 0,
            })
        } else {
            None
        };
        Ok(Self {
            lookback: LOOKBACK.max(longest.saturating_mul(2)),
            config,
            // Only the GPU processes, and no agent: `reap` asks an agent only to reclaim.
            observer: Observer::builder().agents(None).ancestors(false).build(),
            live,
            clock,
        })
    }

    /// The policies, in the order they are tried.
    pub fn policies(&self) -> &[Policy] {
        &self.config.policies
    }

    /// What is watched live, when it is.
    pub fn live(&self) -> Option<&Live> {
        self.live.as_ref()
    }

    /// `snapshot` joined with /proc (monotonic time: the observer's refresh policy counts
    /// spans); the driver names what /proc cannot see.
    fn observe_processes(
        &mut self,
        exec: &mut dyn ReapExecutor,
        snapshot: &Snapshot,
    ) -> Observation {
        self.observer
            .observe(snapshot.clone(), |pid| exec.process_name(pid))
    }

    /// Feeds a live sample to the tracker (nothing when not watching live).
    pub fn observe(&mut self, exec: &mut dyn ReapExecutor, snapshot: &Snapshot) {
        if self.live.is_none() {
            return;
        }
        let observation = self.observe_processes(exec, snapshot);
        let Some(live) = &mut self.live else { return };
        live.judge.track(&observation);
        live.since_unix_ms.get_or_insert(snapshot.taken_at_unix_ms);
        live.samples += 1;
    }

    /// One pass on `snapshot`, the `round`th (module docs).
    ///
    /// # Errors
    /// The history cannot be read; applied without an audit log.
    #[allow(clippy::too_many_lines)]
    pub fn round(
        &mut self,
        exec: &mut dyn ReapExecutor,
        snapshot: &Snapshot,
        round: u64,
    ) -> anyhow::Result<RoundReport> {
        let now = snapshot.taken_at_unix_ms;
        let infos: HashMap<&str, &Arc<DeviceInfo>> = snapshot
            .devices
            .iter()
            .map(|d| (d.info.uuid.as_str(), &d.info))
            .collect();
        let sm_now: HashMap<(&str, u32), u32> = snapshot
            .devices
            .iter()
            .filter_map(|d| {
                Some((
                    d.info.uuid.as_str(),
                    d.reading()?.process_activity.as_ref()?,
                ))
            })
            .flat_map(|(uuid, list)| list.iter().map(move |a| ((uuid, a.pid), a.sm_percent)))
            .collect();
        let observation = self.observe_processes(exec, snapshot);
        let by_pid = holdings(snapshot, &GpuFilter::default());
        let pids: Vec<u32> = by_pid.keys().copied().collect();
        let history = read_history(
            &self.config.db,
            now,
            self.lookback,
            &pids,
            &self.config.leak,
        )?;
        // Owns its zone, so the loop below may borrow `self` mutably.
        let tz = self.config.tz.clone();
        let time = move |t: i64| clock(&tz, t, !same_day(&tz, t, now));
        let mut missing = history.missing(now, &time);
        match &self.live {
            Some(live) => missing.push_str(&format!(
                "; watched live since {} ({}), not yet long enough",
                live.since_unix_ms.map_or_else(|| "now".to_owned(), &time),
                plural(
                    usize::try_from(live.samples).unwrap_or(usize::MAX),
                    "sample",
                    "samples"
                )
            )),
            None => missing.push_str("; or run reap with --every to watch the GPUs live"),
        }
        let fresh_ms = i64::try_from(FRESH.as_millis()).unwrap_or(i64::MAX);
        let boot_id = self.config.boot_id.clone();

        let mut observed: Vec<Observed> = Vec::new();
        for (pid, gpus) in &by_pid {
            // The command line, or the driver's name for a process /proc cannot see.
            let host = observation.hosts.get(pid);
            let command = host.map_or_else(
                || observation.driver_names.get(pid).cloned(),
                |h| Some(h.command.clone()),
            );
            let start = host.and_then(|h| h.start_time_ticks);
            let cpu_now_ms = host.and_then(|h| h.cpu_time_ms);
            let mut cpu_since = None;
            let mut gpus_now = Vec::new();
            for h in gpus {
                let Some(info) = infos.get(h.uuid.as_str()) else {
                    continue;
                };
                let from_history = history.find(&h.uuid, *pid, start, boot_id.as_deref(), now);
                let evidence = match from_history {
                    Some(series) => {
                        if let (Some((t, then)), Some(cpu)) = (series.last_cpu, cpu_now_ms) {
                            cpu_since.get_or_insert(CpuSince {
                                used_ms: cpu.saturating_sub(then),
                                over_ms: now.saturating_sub(t),
                            });
                        }
                        Some(GpuEvidence {
                            source: Source::History,
                            report: series.report.clone(),
                        })
                    }
                    None => self.live.as_ref().and_then(|live| {
                        let report = live.judge.fleet().report(&SeriesKey {
                            device_uuid: h.uuid.clone(),
                            pid: *pid,
                            start_time_ticks: start,
                        })?;
                        // Fresh by the tracker's own time line, which a wall-clock step
                        // does not move.
                        let live_now = live.judge.fleet().now_ms().unwrap_or(now);
                        (report.last_unix_ms >= live_now.saturating_sub(fresh_ms)).then(|| {
                            GpuEvidence {
                                source: Source::Live,
                                report: report.clone(),
                            }
                        })
                    }),
                };
                gpus_now.push(GpuNow {
                    holding: h.clone(),
                    info: Arc::clone(info),
                    sm_percent_now: sm_now.get(&(h.uuid.as_str(), *pid)).copied(),
                    evidence,
                });
            }
            if gpus_now.is_empty() {
                continue;
            }
            observed.push(Observed {
                pid: *pid,
                start_time_ticks: start,
                uid: host.and_then(|h| h.uid),
                user: host.and_then(|h| h.user_name().map(str::to_owned)),
                command,
                gpus: gpus_now,
                cpu_since_history: cpu_since,
                host: host.cloned(),
            });
        }

        let ctx = DecideContext {
            cpu_idle_fraction: self.config.leak.cpu_idle_fraction,
            cpu_slack_ms: 1000 / self.config.ticks_per_second,
            missing: &missing,
            time: &time,
        };
        let mut chosen: Vec<Chosen> = Vec::new();
        let mut excluded: Vec<ExcludedJson> = Vec::new();
        for p in observed {
            let mut best: Option<(String, decide::Exclusion)> = None;
            let mut pick = None;
            for policy in &self.config.policies {
                match decide::decide(&p, policy, &ctx) {
                    Ok(c) => {
                        pick = Some((policy.name.clone(), c));
                        break;
                    }
                    Err(e) => {
                        if best.as_ref().is_none_or(|(_, b)| e.stage > b.stage) {
                            best = Some((policy.name.clone(), e));
                        }
                    }
                }
            }
            let Some((policy, judged)) = pick else {
                if let Some((policy, e)) = best {
                    excluded.push(ExcludedJson::new(
                        &p,
                        Some(policy),
                        e.stage,
                        e.reason,
                        &time,
                    ));
                }
                continue;
            };
            match exec.inspect(p.pid, p.start_time_ticks) {
                Ok(candidate) => chosen.push(Chosen {
                    observed: p,
                    policy,
                    candidate,
                    judged,
                }),
                Err(refusal) => excluded.push(ExcludedJson::new(
                    &p,
                    Some(policy),
                    Stage::Refused,
                    format!("refused: {refusal}"),
                    &time,
                )),
            }
        }
        // Most memory first (the most reclaimed within --max-kills), then the longest idle.
        chosen.sort_by(|a, b| {
            b.observed
                .used_bytes()
                .cmp(&a.observed.used_bytes())
                .then(b.judged.idle_s.total_cmp(&a.judged.idle_s))
                .then(a.observed.pid.cmp(&b.observed.pid))
        });
        let mut per_policy: HashMap<String, usize> = HashMap::new();
        let mut kept: Vec<Chosen> = Vec::new();
        for c in chosen {
            let policy_cap = self
                .config
                .policies
                .iter()
                .find(|p| p.name == c.policy)
                .and_then(|p| p.max_kills);
            let taken = per_policy.get(&c.policy).copied().unwrap_or(0);
            let over = match (policy_cap, self.config.max_kills) {
                (Some(cap), _) if taken >= cap => Some(format!(
                    "over policy '{}''s max_kills ({cap}) this run; next run",
                    c.policy
                )),
                (_, Some(cap)) if kept.len() >= cap => {
                    Some(format!("over --max-kills {cap} this run; next run"))
                }
                _ => None,
            };
            match over {
                Some(reason) => excluded.push(ExcludedJson::new(
                    &c.observed,
                    Some(c.policy.clone()),
                    Stage::Limit,
                    reason,
                    &time,
                )),
                None => {
                    *per_policy.entry(c.policy.clone()).or_default() += 1;
                    kept.push(c);
                }
            }
        }
        excluded.sort_by_key(|e| std::cmp::Reverse(e.stage));

        let mut report = RoundReport {
            schema: SCHEMA,
            at: rfc3339(now),
            round,
            dry_run: !self.config.apply,
            action: self.config.action.as_str(),
            policies: self.config.policies.iter().map(Policy::json).collect(),
            max_kills: self.config.max_kills,
            history: HistoryJson::new(&history),
            live: self.live.as_ref().map(|l| LiveJson {
                since: l.since_unix_ms.map(rfc3339),
                samples: l.samples,
            }),
            candidates: kept.iter().map(|c| CandidateJson::new(c, &time)).collect(),
            excluded,
            devices: Vec::new(),
            still_held: Vec::new(),
            freed_bytes: 0,
            signalled_at: None,
            audit_log: None,
            ok: kept.is_empty(),
            now_unix_ms: now,
        };
        if !self.config.apply || kept.is_empty() {
            return Ok(report);
        }
        let Some(audit_log) = exec.audit_log() else {
            bail!("internal: --apply without an audit log");
        };
        report.audit_log = Some(audit_log);
        if self.config.action == Action::Reclaim {
            self.reclaim_candidates(exec, &mut report);
            return Ok(report);
        }
        let held_before: BTreeMap<u32, Vec<GpuHolding>> = kept
            .iter()
            .map(|c| {
                let h: Vec<GpuHolding> =
                    c.observed.gpus.iter().map(|g| g.holding.clone()).collect();
                (c.observed.pid, h)
            })
            .collect();
        let targets: Vec<Target> = kept
            .iter()
            .map(|c| Target {
                candidate: c.candidate.clone(),
                reason: format!("vramctl reap, policy '{}': {}", c.policy, c.judged.why),
            })
            .collect();
        let request = KillRequest {
            signal: self.config.signal,
            grace: self.config.grace,
            escalate: true,
            origin: Origin::Policy,
            ..KillRequest::new(targets, "reap")
        };
        report.signalled_at = Some(rfc3339(self.clock.now_unix_ms()));
        let Terminated {
            outcomes,
            devices,
            still_held,
        } = exec.terminate(&request, snapshot, &held_before, self.config.timeout);
        report.devices = devices;
        report.still_held = still_held;
        report.freed_bytes = report
            .devices
            .iter()
            .filter(|d| d.released)
            .filter_map(|d| d.freed_bytes)
            .sum();
        let by_pid: HashMap<u32, &TargetReport> = outcomes
            .iter()
            .map(|r| (r.candidate.identity.pid, r))
            .collect();
        for c in &mut report.candidates {
            if let Some(r) = by_pid.get(&c.pid) {
                c.apply(r, &held_before, &report.devices);
            }
        }
        report.ok = report
            .candidates
            .iter()
            .all(|c| matches!(c.outcome, "exited" | "already_gone"))
            && report.devices.iter().all(|d| d.released);
        Ok(report)
    }

    /// `--action reclaim`: each candidate's agent is asked to release its cache
    /// (`vramctl_agent::reclaim`, audited as `reclaim`); nobody is signalled. `ok` when every
    /// candidate released something.
    fn reclaim_candidates(&self, exec: &mut dyn ReapExecutor, report: &mut RoundReport) {
        let pids: Vec<u32> = report.candidates.iter().map(|c| c.pid).collect();
        let reasons: Vec<String> = report
            .candidates
            .iter()
            .map(|c| {
                format!(
                    "vramctl reap --action reclaim, policy '{}': {}",
                    c.policy, c.why
                )
            })
            .collect();
        report.signalled_at = Some(rfc3339(self.clock.now_unix_ms()));
        let mut results = Vec::new();
        // One request per candidate, so that each audit record carries its own policy's reason.
        for (pid, reason) in pids.iter().zip(reasons) {
            let request = vramctl_agent::reclaim::ReclaimRequest {
                selection: vramctl_agent::reclaim::Selection::Pids(vec![*pid]),
                options: vramctl_agent::agent_client::ReclaimOptions::default(),
                timeouts: vramctl_agent::agent_client::Timeouts::default(),
                reason,
            };
            results.extend(exec.reclaim(&request));
        }
        for c in &mut report.candidates {
            let Some(r) = results.iter().find(|r| r.pid == c.pid) else {
                continue;
            };
            c.outcome = r.status;
            c.detail = r.error.as_ref().map(|e| e.message.clone()).or_else(|| {
                r.agent.as_ref().map(|a| {
                    format!(
                        "the framework released {} of {} cached ({})",
                        units::bytes(a.released_bytes),
                        units::bytes(a.cached_before_bytes),
                        a.outcome.replace('_', " ")
                    )
                })
            });
            c.freed_bytes = r.nvml_returned_bytes.map(|n| u64::try_from(n).unwrap_or(0));
        }
        report.freed_bytes = report.candidates.iter().filter_map(|c| c.freed_bytes).sum();
        report.ok = results
            .iter()
            .all(|r| r.released_bytes.is_some_and(|b| b > 0));
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// The note for a Jupyter kernel: its server may bring it back, and has a better tool.
fn jupyter_note(command: Option<&str>) -> Option<String> {
    command
        .filter(|c| c.contains("ipykernel_launcher"))
        .map(|_| {
            "a Jupyter kernel: its server may restart a kernel that a signal ended (autorestart), \
         memory and all; the server's own idle culling \
         (MappingKernelManager.cull_idle_timeout, cull_interval) shuts kernels down cleanly \
         and is the better tool for notebooks"
                .to_owned()
        })
}

/// One round's `--json` document (schema in docs/json.md).
#[derive(Debug, Serialize)]
pub struct RoundReport {
    pub schema: u32,
    pub at: String,
    pub round: u64,
    pub dry_run: bool,
    /// `kill` or `reclaim` (`--action`).
    pub action: &'static str,
    pub policies: Vec<PolicyJson>,
    pub max_kills: Option<usize>,
    pub history: HistoryJson,
    pub live: Option<LiveJson>,
    pub candidates: Vec<CandidateJson>,
    pub excluded: Vec<ExcludedJson>,
    pub devices: Vec<DeviceRelease>,
    pub still_held: Vec<StillHeld>,
    pub freed_bytes: u64,
    pub signalled_at: Option<String>,
    pub audit_log: Option<String>,
    pub ok: bool,
    /// When the round's sample was taken (the plan's times are shown relative to it).
    #[serde(skip)]
    pub now_unix_ms: i64,
}

#[derive(Debug, Serialize)]
pub struct HistoryJson {
    pub database: String,
    pub exists: bool,
    pub last_sample: Option<String>,
    #[serde(skip)]
    pub last_sample_ms: Option<i64>,
}

impl HistoryJson {
    fn new(h: &History) -> Self {
        Self {
            database: h.database.display().to_string(),
            exists: h.exists,
            last_sample: h.last_sample_unix_ms.map(rfc3339),
            last_sample_ms: h.last_sample_unix_ms,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct LiveJson {
    pub since: Option<String>,
    pub samples: u64,
}

/// A process on one GPU: its memory there and the evidence about it.
#[derive(Debug, Serialize)]
pub struct GpuJson {
    pub index: u32,
    pub uuid: String,
    pub used_bytes: Option<u64>,
    pub source: Option<Source>,
    pub verdict: Option<Verdict>,
    pub idle_since: Option<String>,
    pub idle_s: Option<f64>,
    pub evidence: Vec<Evidence>,
    pub last_active: Option<String>,
    pub last_sample: Option<String>,
    pub sm_percent_now: Option<u32>,
    #[serde(skip)]
    pub idle_since_ms: Option<i64>,
}

impl GpuJson {
    fn new(g: &GpuNow) -> Self {
        let report = g.evidence.as_ref().map(|e| &e.report);
        Self {
            index: g.info.index,
            uuid: g.info.uuid.clone(),
            used_bytes: g.holding.used_bytes,
            source: g.evidence.as_ref().map(|e| e.source),
            verdict: report.map(|r| r.verdict),
            idle_since: report.and_then(|r| r.idle.idle_since_unix_ms).map(rfc3339),
            idle_s: report.and_then(|r| r.idle.idle_sec),
            evidence: report.map(|r| r.idle.evidence.clone()).unwrap_or_default(),
            last_active: report.and_then(|r| r.idle.last_active_unix_ms).map(rfc3339),
            last_sample: report.map(|r| rfc3339(r.last_unix_ms)),
            sm_percent_now: g.sm_percent_now,
            idle_since_ms: report.and_then(|r| r.idle.idle_since_unix_ms),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct CandidateJson {
    pub pid: u32,
    pub start_time_ticks: u64,
    pub user: Option<String>,
    pub uid: u32,
    pub command: Option<String>,
    pub policy: String,
    pub used_bytes: Option<u64>,
    pub gpus: Vec<GpuJson>,
    pub idle_since: String,
    pub idle_s: f64,
    pub sources: Vec<Source>,
    pub why: String,
    pub note: Option<String>,
    /// `would_signal` (dry run), then as `kill`: `exited`, `already_gone`, `refused`,
    /// `still_running`, `audit_failed`, `signal_failed`; with `--action reclaim` as
    /// `vramctl reclaim`'s `status`: `reclaimed`, `nothing_reclaimed`, `no_agent`, `error`, …
    pub outcome: &'static str,
    pub detail: Option<String>,
    pub signals: Vec<String>,
    pub escalated: bool,
    pub exited_after_s: Option<f64>,
    pub pinned: Option<bool>,
    pub freed_bytes: Option<u64>,
}

impl CandidateJson {
    fn new(c: &Chosen, _time: &dyn Fn(i64) -> String) -> Self {
        let command = c.observed.command.clone();
        Self {
            pid: c.observed.pid,
            start_time_ticks: c.candidate.identity.start_time_ticks,
            user: c.candidate.user.clone(),
            uid: c.candidate.uid,
            note: jupyter_note(command.as_deref()),
            command,
            policy: c.policy.clone(),
            used_bytes: c.observed.used_bytes(),
            gpus: c.observed.gpus.iter().map(GpuJson::new).collect(),
            idle_since: rfc3339(c.judged.idle_since_unix_ms),
            idle_s: c.judged.idle_s,
            sources: c.judged.sources.clone(),
            why: c.judged.why.clone(),
            outcome: "would_signal",
            detail: None,
            signals: Vec::new(),
            escalated: false,
            exited_after_s: None,
            pinned: None,
            freed_bytes: None,
        }
    }

    /// What the kill did, and the memory it freed on devices that released it.
    fn apply(
        &mut self,
        r: &TargetReport,
        held_before: &BTreeMap<u32, Vec<GpuHolding>>,
        devices: &[DeviceRelease],
    ) {
        let o = Outcome::of(r);
        self.outcome = o.outcome;
        self.detail = o.detail;
        self.signals = o.signals;
        self.escalated = o.escalated;
        self.exited_after_s = o.exited_after_s;
        self.pinned = Some(o.pinned);
        if matches!(
            r.outcome,
            TargetOutcome::Exited { .. } | TargetOutcome::AlreadyGone
        ) {
            self.freed_bytes = Some(
                held_before
                    .get(&self.pid)
                    .into_iter()
                    .flatten()
                    .filter(|h| devices.iter().any(|d| d.uuid == h.uuid && d.released))
                    .filter_map(|h| h.used_bytes)
                    .sum(),
            );
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ExcludedJson {
    pub pid: u32,
    pub start_time_ticks: Option<u64>,
    pub user: Option<String>,
    pub command: Option<String>,
    pub used_bytes: Option<u64>,
    pub gpus: Vec<GpuJson>,
    /// The policy whose rules it got furthest through.
    pub policy: Option<String>,
    pub stage: Stage,
    pub reason: String,
}

impl ExcludedJson {
    fn new(
        p: &Observed,
        policy: Option<String>,
        stage: Stage,
        reason: String,
        _time: &dyn Fn(i64) -> String,
    ) -> Self {
        Self {
            pid: p.pid,
            start_time_ticks: p.start_time_ticks,
            user: p.user.clone(),
            command: p.command.clone(),
            used_bytes: p.used_bytes(),
            gpus: p.gpus.iter().map(GpuJson::new).collect(),
            policy,
            stage,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Child, Command};

    use vramctl_agent::reclaim::Selection;
    use vramctl_core::clock::ManualClock;
    use vramctl_core::types::{
        DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, ProcessActivity, ProcessKind,
        ProcessUsage,
    };
    use vramctl_procs::procinfo::ProcessIdentity;
    use vramctl_procs::signal::Refusal;

    use super::*;

    const GIB: u64 = 1 << 30;
    /// 2026-11-29T20:31:31Z.
    const T0: i64 = 1_795_984_291_000;
    const MIN: i64 = 60_000;
    const UUID: &str = "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2";

    /// A real, idle process (`sleep`), so that /proc knows it; killed when dropped.
    struct Sleeper(Child);

    impl Sleeper {
        fn new() -> Self {
            Self(
                Command::new("sleep")
                    .arg("600")
                    .spawn()
                    .expect("spawn sleep"),
            )
        }

        fn pid(&self) -> u32 {
            self.0.id()
        }
    }

    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// One GPU with `held`: `(pid, bytes, SM %)`, sampled at `t`.
    fn snapshot(t: i64, held: &[(u32, u64, u32)]) -> Snapshot {
        let used: u64 = held.iter().map(|h| h.1).sum();
        Snapshot {
            taken_at_unix_ms: t,
            monotonic_ms: t,
            driver: Arc::new(DriverInfo::default()),
            devices: vec![DeviceSnapshot {
                info: Arc::new(DeviceInfo::new(0, UUID)),
                state: DeviceState::Ok(DeviceReading {
                    memory: Some(vramctl_core::types::MemoryReading {
                        total_bytes: 141 * GIB,
                        used_bytes: used,
                        reserved_bytes: 0,
                        free_bytes: 141 * GIB - used,
                    }),
                    processes: Some(
                        held.iter()
                            .map(|&(pid, bytes, _)| ProcessUsage {
                                pid,
                                used_bytes: Some(bytes),
                                kind: ProcessKind::Compute,
                                gpu_instance_id: None,
                                compute_instance_id: None,
                            })
                            .collect(),
                    ),
                    process_activity: Some(
                        held.iter()
                            .map(|&(pid, _, sm_percent)| ProcessActivity {
                                pid,
                                sm_percent,
                                memory_percent: 0,
                            })
                            .collect(),
                    ),
                    ..DeviceReading::default()
                }),
            }],
            unopened: Vec::new(),
        }
    }

    /// What the engine asked for, and what the executor answers.
    #[derive(Default)]
    struct Recording {
        audit_log: Option<String>,
        /// PIDs `inspect` refuses, and why.
        refuse: HashMap<u32, Refusal>,
        /// What `terminate` reports for each target (default: exited).
        outcome: HashMap<u32, TargetOutcome>,
        inspected: Vec<u32>,
        terminated: Vec<KillRequest>,
        reclaimed: Vec<ReclaimRequest>,
        /// Bytes each PID's agent releases when asked.
        released: HashMap<u32, u64>,
    }

    impl ReapExecutor for Recording {
        fn process_name(&mut self, _pid: u32) -> Option<String> {
            None
        }

        fn inspect(
            &mut self,
            pid: u32,
            start_time_ticks: Option<u64>,
        ) -> Result<Candidate, Refusal> {
            self.inspected.push(pid);
            if let Some(refusal) = self.refuse.get(&pid) {
                return Err(refusal.clone());
            }
            Ok(Candidate {
                identity: ProcessIdentity {
                    boot_id: "boot".into(),
                    pid,
                    start_time_ticks: start_time_ticks.unwrap_or(0),
                },
                uid: 1000,
                user: Some("alice".into()),
                command: "sleep 600".into(),
                state: 'S',
                ppid: 1,
                gpu_proof: false,
                pidfd_id: None,
            })
        }

        fn audit_log(&self) -> Option<String> {
            self.audit_log.clone()
        }

        fn terminate(
            &mut self,
            request: &KillRequest,
            before: &Snapshot,
            held_before: &BTreeMap<u32, Vec<GpuHolding>>,
            _timeout: Duration,
        ) -> Terminated {
            self.terminated.push(request.clone());
            let outcomes: Vec<TargetReport> = request
                .targets
                .iter()
                .map(|t| TargetReport {
                    candidate: t.candidate.clone(),
                    outcome: self
                        .outcome
                        .get(&t.candidate.identity.pid)
                        .cloned()
                        .unwrap_or(TargetOutcome::Exited {
                            after: Duration::from_millis(200),
                            escalated: false,
                        }),
                    signals: Vec::new(),
                    pinned: true,
                })
                .collect();
            let ended = crate::memory_release::ended_pids(&outcomes);
            let freed: u64 = held_before
                .iter()
                .filter(|(pid, _)| ended.contains(pid))
                .flat_map(|(_, h)| h.iter().filter_map(|h| h.used_bytes))
                .sum();
            let used = before.devices[0]
                .reading()
                .and_then(|r| r.memory.as_ref())
                .map(|m| m.used_bytes);
            Terminated {
                outcomes,
                devices: vec![DeviceRelease {
                    index: 0,
                    uuid: UUID.into(),
                    held_bytes: Some(freed),
                    used_before_bytes: used,
                    used_after_bytes: used.map(|u| u - freed),
                    freed_bytes: Some(freed),
                    released: true,
                    released_after_s: Some(0.2),
                    pids: ended.iter().copied().collect(),
                    unaccounted_before: None,
                    still_listed: Vec::new(),
                    unlisted_bytes: None,
                }],
                still_held: Vec::new(),
            }
        }

        /// Every process has no agent, except those in `self.released` (bytes released).
        fn reclaim(&mut self, request: &ReclaimRequest) -> Vec<ProcessReclaim> {
            self.reclaimed.push(request.clone());
            let Selection::Pids(pids) = &request.selection else {
                return Vec::new();
            };
            pids.iter()
                .map(|&pid| {
                    let released = self.released.get(&pid).copied();
                    ProcessReclaim {
                        pid,
                        command: None,
                        user: None,
                        status: if released.is_some() {
                            "reclaimed"
                        } else {
                            "no_agent"
                        },
                        nvml_before_bytes: None,
                        nvml_after_bytes: None,
                        nvml_returned_bytes: released.map(|b| i64::try_from(b).unwrap_or(0)),
                        released_bytes: released,
                        agent: None,
                        error: None,
                    }
                })
                .collect()
        }
    }

    fn config(apply: bool, max_kills: Option<usize>) -> ReapConfig {
        let policies = vec![Policy {
            name: "idle".into(),
            idle_for: Duration::from_secs(5 * 60),
            min_mem_bytes: GIB,
            users: Vec::new(),
            pattern: None,
            exclude: Vec::new(),
            gpus: Vec::new(),
            max_kills: None,
            owners: Vec::new(),
        }];
        ReapConfig {
            leak: leak_config(&policies).expect("valid analysis settings"),
            policies,
            apply,
            action: Action::Kill,
            max_kills,
            signal: Signal::Term,
            grace: Duration::from_secs(10),
            timeout: Duration::from_secs(10),
            db: PathBuf::from("/nonexistent/vramctl-free-test/history.db"),
            live: true,
            boot_id: None,
            tz: TimeZone::UTC,
            ticks_per_second: 100,
        }
    }

    /// Ten minutes watched live at a sample a minute, then one pass on the last sample.
    fn pass(
        config: ReapConfig,
        exec: &mut Recording,
        held: &[(u32, u64, u32)],
    ) -> anyhow::Result<RoundReport> {
        let clock = Arc::new(ManualClock::new(T0 + 11 * MIN));
        let mut engine = Engine::new(config, clock).expect("engine");
        let mut last = snapshot(T0, held);
        for i in 0..=10 {
            last = snapshot(T0 + i * MIN, held);
            engine.observe(exec, &last);
        }
        engine.round(exec, &last, 2)
    }

    fn stage_of(report: &RoundReport, pid: u32) -> Option<Stage> {
        report
            .excluded
            .iter()
            .find(|e| e.pid == pid)
            .map(|e| e.stage)
    }

    #[test]
    fn a_dry_run_plans_the_idle_holder_and_acts_on_nothing() {
        let (idle, busy) = (Sleeper::new(), Sleeper::new());
        let mut exec = Recording::default();
        let held = [(idle.pid(), 8 * GIB, 0), (busy.pid(), 4 * GIB, 70)];
        let report = pass(config(false, None), &mut exec, &held).expect("pass");
        assert!(report.dry_run);
        let pids: Vec<u32> = report.candidates.iter().map(|c| c.pid).collect();
        assert_eq!(pids, [idle.pid()]);
        assert_eq!(report.candidates[0].outcome, "would_signal");
        assert_eq!(report.candidates[0].sources, [Source::Live]);
        assert_eq!(stage_of(&report, busy.pid()), Some(Stage::Busy));
        assert!(exec.terminated.is_empty() && exec.reclaimed.is_empty());
        assert_eq!(report.signalled_at, None);
        assert_eq!(report.audit_log, None);
        assert!(
            !report.ok,
            "a plan with candidates is a condition that holds"
        );
    }

    #[test]
    fn an_applied_pass_kills_through_the_executor_with_the_policy_as_reason() {
        let idle = Sleeper::new();
        let mut exec = Recording {
            audit_log: Some("/var/lib/vramctl/audit.db".into()),
            ..Recording::default()
        };
        let report =
            pass(config(true, None), &mut exec, &[(idle.pid(), 8 * GIB, 0)]).expect("pass");
        assert_eq!(exec.terminated.len(), 1);
        let request = &exec.terminated[0];
        assert_eq!(request.origin, Origin::Policy);
        assert_eq!(request.action, "reap");
        assert!(request.escalate);
        assert_eq!(request.targets.len(), 1);
        assert_eq!(request.targets[0].candidate.identity.pid, idle.pid());
        assert!(
            request.targets[0]
                .reason
                .starts_with("vramctl reap, policy 'idle': "),
            "{}",
            request.targets[0].reason
        );
        // Stamped by the injected clock, not the sample's time.
        assert_eq!(
            report.signalled_at.as_deref(),
            Some("2026-11-29T20:42:31.000Z")
        );
        assert_eq!(
            report.audit_log.as_deref(),
            Some("/var/lib/vramctl/audit.db")
        );
        assert_eq!(report.candidates[0].outcome, "exited");
        assert_eq!(report.candidates[0].freed_bytes, Some(8 * GIB));
        assert_eq!(report.freed_bytes, 8 * GIB);
        assert!(report.ok);
    }

    #[test]
    fn a_target_refused_at_signal_time_is_reported_refused_and_the_pass_fails() {
        let idle = Sleeper::new();
        let mut exec = Recording {
            audit_log: Some("audit.db".into()),
            outcome: HashMap::from([(
                idle.pid(),
                TargetOutcome::Refused {
                    refusal: Refusal::NotVisible { pid: idle.pid() },
                },
            )]),
            ..Recording::default()
        };
        let report =
            pass(config(true, None), &mut exec, &[(idle.pid(), 8 * GIB, 0)]).expect("pass");
        assert_eq!(
            exec.terminated.len(),
            1,
            "the refusal is the executor's to audit"
        );
        assert_eq!(report.candidates[0].outcome, "refused");
        assert_eq!(report.candidates[0].freed_bytes, None);
        assert!(!report.ok);
    }

    #[test]
    fn a_holder_that_exited_or_changed_identity_is_left_alone() {
        let (gone, changed) = (Sleeper::new(), Sleeper::new());
        let mut exec = Recording {
            audit_log: Some("audit.db".into()),
            refuse: HashMap::from([
                (gone.pid(), Refusal::NotVisible { pid: gone.pid() }),
                (
                    changed.pid(),
                    Refusal::IdentityMismatch {
                        pid: changed.pid(),
                        detail: "start time 1 != 2".into(),
                    },
                ),
            ]),
            ..Recording::default()
        };
        let held = [(gone.pid(), 8 * GIB, 0), (changed.pid(), 4 * GIB, 0)];
        let report = pass(config(true, None), &mut exec, &held).expect("pass");
        assert!(report.candidates.is_empty());
        for pid in [gone.pid(), changed.pid()] {
            assert!(exec.inspected.contains(&pid));
            let e = report
                .excluded
                .iter()
                .find(|e| e.pid == pid)
                .expect("excluded");
            assert_eq!(e.stage, Stage::Refused);
            assert!(e.reason.starts_with("refused: "), "{}", e.reason);
        }
        assert!(exec.terminated.is_empty(), "nobody is signalled");
        assert!(report.ok);
    }

    #[test]
    fn max_kills_takes_the_most_memory_first_and_leaves_the_rest_for_the_next_pass() {
        let (small, big) = (Sleeper::new(), Sleeper::new());
        let mut exec = Recording {
            audit_log: Some("audit.db".into()),
            ..Recording::default()
        };
        let held = [(small.pid(), 2 * GIB, 0), (big.pid(), 8 * GIB, 0)];
        let report = pass(config(true, Some(1)), &mut exec, &held).expect("pass");
        let pids: Vec<u32> = report.candidates.iter().map(|c| c.pid).collect();
        assert_eq!(pids, [big.pid()]);
        let e = report
            .excluded
            .iter()
            .find(|e| e.pid == small.pid())
            .expect("excluded");
        assert_eq!(e.stage, Stage::Limit);
        assert_eq!(e.reason, "over --max-kills 1 this run; next run");
        assert_eq!(exec.terminated.len(), 1);
        assert_eq!(exec.terminated[0].targets.len(), 1);
    }

    #[test]
    fn a_policys_own_max_kills_caps_its_picks() {
        let (a, b) = (Sleeper::new(), Sleeper::new());
        let mut cfg = config(false, None);
        cfg.policies[0].max_kills = Some(1);
        let mut exec = Recording::default();
        let held = [(a.pid(), 4 * GIB, 0), (b.pid(), 6 * GIB, 0)];
        let report = pass(cfg, &mut exec, &held).expect("pass");
        assert_eq!(report.candidates.len(), 1);
        assert_eq!(report.candidates[0].pid, b.pid());
        let e = report
            .excluded
            .iter()
            .find(|e| e.pid == a.pid())
            .expect("excluded");
        assert_eq!(
            e.reason,
            "over policy 'idle''s max_kills (1) this run; next run"
        );
    }

    #[test]
    fn applied_without_an_audit_log_fails_before_any_effect() {
        let idle = Sleeper::new();
        let mut exec = Recording::default();
        let err = pass(config(true, None), &mut exec, &[(idle.pid(), 8 * GIB, 0)])
            .expect_err("no audit log");
        assert!(err.to_string().contains("without an audit log"), "{err}");
        assert!(exec.terminated.is_empty() && exec.reclaimed.is_empty());
    }

    #[test]
    fn the_reclaim_action_asks_each_candidates_agent_and_signals_nobody() {
        let (a, b) = (Sleeper::new(), Sleeper::new());
        let mut cfg = config(true, None);
        cfg.action = Action::Reclaim;
        let mut exec = Recording {
            audit_log: Some("audit.db".into()),
            released: HashMap::from([(b.pid(), 2 * GIB)]),
            ..Recording::default()
        };
        let held = [(a.pid(), 4 * GIB, 0), (b.pid(), 6 * GIB, 0)];
        let report = pass(cfg, &mut exec, &held).expect("pass");
        assert_eq!(report.action, "reclaim");
        let outcome = |pid: u32| {
            let c = report
                .candidates
                .iter()
                .find(|c| c.pid == pid)
                .expect("candidate");
            (c.outcome, c.freed_bytes)
        };
        assert_eq!(outcome(a.pid()), ("no_agent", None));
        assert_eq!(outcome(b.pid()), ("reclaimed", Some(2 * GIB)));
        assert_eq!(report.freed_bytes, 2 * GIB);
        assert!(exec.terminated.is_empty());
        assert_eq!(exec.reclaimed.len(), 2, "one request per candidate");
        for r in &exec.reclaimed {
            assert!(
                r.reason
                    .starts_with("vramctl reap --action reclaim, policy 'idle': "),
                "{}",
                r.reason
            );
        }
        assert!(!report.ok, "no agent released anything");
    }

    #[test]
    fn without_live_watching_or_history_there_is_no_evidence() {
        let idle = Sleeper::new();
        let mut cfg = config(true, None);
        cfg.live = false;
        let mut exec = Recording {
            audit_log: Some("audit.db".into()),
            ..Recording::default()
        };
        let report = pass(cfg, &mut exec, &[(idle.pid(), 8 * GIB, 0)]).expect("pass");
        assert!(report.candidates.is_empty());
        assert_eq!(stage_of(&report, idle.pid()), Some(Stage::NoEvidence));
        assert!(!report.history.exists);
        assert!(report.live.is_none());
        assert!(exec.inspected.is_empty() && exec.terminated.is_empty());
    }

    #[test]
    fn only_jupyter_kernels_get_the_note() {
        let note = jupyter_note(Some(
            "/usr/bin/python3 -m ipykernel_launcher -f /run/user/1000/jupyter/kernel-1.json",
        ))
        .unwrap();
        assert!(note.contains("cull_idle_timeout"), "{note}");
        assert!(
            note.starts_with("a Jupyter kernel: its server may restart"),
            "{note}"
        );
        assert_eq!(jupyter_note(Some("python train.py")), None);
        assert_eq!(jupyter_note(None), None);
        assert_eq!(plural(1, "process", "processes"), "1 process");
        assert_eq!(plural(3, "process", "processes"), "3 processes");
    }
}
