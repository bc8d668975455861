//! Running a command under supervision: `vramctl run` and each trial of `vramctl fit`.
//!
//! ```text
//! spawn (stdio through, agent injected) ─▶ every interval: Sampler::tick ─▶ MemoryCurve (the tree's PIDs)
//!      │                                   agent thread: each Python PID's `stats` (peaks)
//!      ├─ stderr/stdout readers: OOM lines, --until-line ─────────┐
//!      ├─ SignalForwarder: signals passed on                       ├─▶ JobReport
//!      └─ waitpid: the exit status; the agents' exit reports ──────┘
//! ```
//!
//! The job's processes are kept in a [`scope::JobScope`] (a cgroup v2 scope, else the
//! subreaper's tree): `--timeout` and `--until-line` stop all of them, and whatever is
//! still running when the command exits is stopped too (SIGTERM, SIGKILL after the grace),
//! so nothing of the job outlives `run`.
//!
//! What NVML can and cannot see: a tick reads each GPU's used memory and its per-process
//! figures, which for PyTorch are the CUDA context plus the caching allocator's reserved
//! pool. The pool only grows between `empty_cache` calls, so a 20 ms tick sees its peak
//! (research-round2 §3.2: polled peak = `max_memory_reserved` + context in 10 of 10 runs).
//! An allocation freed to the driver within one interval (no caching allocator, JAX with
//! preallocation off, `PYTORCH_NO_CUDA_MEMORY_CACHING=1`) can be missed; the agent's peak
//! counters, read at exit, cannot (`docs/run.md`).

pub mod agent_inject;
pub mod child;
pub mod memory_curve;
pub mod oom;
pub mod oom_verdict;
pub mod scope;
pub mod ticks;
pub mod tree;

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use regex::Regex;
use serde::Serialize;
use vramctl_agent::agent_client::{self, Stats};
use vramctl_core::types::Snapshot;
use vramctl_leaks::analysis::{
    self, ActivityInputs, LeakConfig, Sample, SeriesContext, SeriesReport,
};

use agent_inject::AgentInjection;
use child::{ChildEvent, ChildSpec, ExitStatus, Output, SignalForwarder, SpawnError};
use memory_curve::MemoryCurve;
use oom::OomSource;
use scope::JobScope;
use ticks::{JobTicks, PidMapping};
use tree::ProcessTree;
use vramctl_observe::daemon_socket::client::AskOptions;
use vramctl_observe::live_loop::LiveSampler;

/// What to run and how.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Program and arguments.
    pub argv: Vec<OsString>,
    /// Added to the environment (`fit`: `VRAMCTL_FIT_VALUE`).
    pub env: Vec<(OsString, OsString)>,
    /// Inject the agent.
    pub agent: bool,
    /// Where its output goes.
    pub output: Output,
    /// Stop it once a line of stdout matches (it then counts as a success).
    pub until_line: Option<Regex>,
    /// Stop it after this long.
    pub timeout: Option<Duration>,
    /// Sampling interval.
    pub interval: Duration,
    /// Between SIGTERM and SIGKILL when stopping it (or what is left of it once its
    /// command exited).
    pub stop_grace: Duration,
    /// `run` made itself a child subreaper, so it reaps every child (see [`tree`]).
    pub reap_orphans: bool,
    /// Inside a PID namespace that is not the host's, a host daemon asked this way maps
    /// NVML's PIDs to this namespace's at each tick ([`ticks`]); `None`: never asked.
    pub daemon: Option<AskOptions>,
}

/// How the job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ending {
    /// It exited by itself.
    Exited,
    /// We stopped it after `--until-line` matched.
    StoppedAfterLine,
    /// We stopped it after `--timeout`.
    TimedOut,
}

/// An out-of-memory error the job hit.
#[derive(Debug, Clone, Serialize)]
pub struct OomFinding {
    /// Which allocator (from its message), or `None` when only the agent's counter said.
    pub source: Option<OomSource>,
    /// The message line.
    pub line: Option<String>,
    /// Seconds after the start.
    pub at_s: f64,
    /// Each GPU's used memory at that moment (the last sample before it), by UUID.
    pub device_used_bytes: BTreeMap<String, u64>,
    /// Whether the command failed afterwards (else it caught the error and went on).
    pub fatal: bool,
    /// Its cause, fix and evidence (`cause`, `fix`, `why`, `from`, `evidence`, ...).
    #[serde(flatten)]
    pub verdict: oom_verdict::OomVerdict,
}

/// The framework's own figures for one device, from the agents of the job's processes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FrameworkPeaks {
    /// Σ over the job's processes on this device of their peak allocated bytes.
    pub allocated_peak_bytes: Option<u64>,
    /// Σ of their peak reserved bytes.
    pub reserved_peak_bytes: Option<u64>,
    /// Out-of-memory errors the framework raised.
    pub ooms: Option<u64>,
    /// Processes that reported.
    pub processes: u32,
}

/// One GPU in the report.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceReport {
    /// The curve's figures.
    #[serde(flatten)]
    pub curve: memory_curve::DeviceCurve,
    /// What the job could use here: total − driver-reserved − others at the start.
    pub capacity_bytes: Option<u64>,
    /// The framework's figures (agent).
    pub framework: Option<FrameworkPeaks>,
    /// The leak verdict of the job's memory here.
    pub leak: Option<LeakSummary>,
}

/// The verdict in short.
#[derive(Debug, Clone, Serialize)]
pub struct LeakSummary {
    /// `stable`, `growing`, `leak`, `sawtooth`.
    pub verdict: &'static str,
    /// Why.
    pub explanation: String,
}

/// One process of the job.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessReport {
    /// NVML's figures.
    #[serde(flatten)]
    pub nvml: memory_curve::ProcessPeak,
    /// Its framework's peaks on this GPU (agent).
    pub allocated_peak_bytes: Option<u64>,
    /// Same, reserved.
    pub reserved_peak_bytes: Option<u64>,
}

/// Everything `run` (and a `fit` trial) found.
#[derive(Debug, Clone, Serialize)]
pub struct JobReport {
    /// The command as given.
    pub command: Vec<String>,
    /// Wall-clock start, Unix ms.
    pub started_unix_ms: i64,
    /// How long it ran.
    pub wall_s: f64,
    /// How it ended.
    pub ending: Ending,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
    /// The code `run` passes on (`128 + signal` for a signal).
    pub shell_code: i32,
    /// The sampling interval.
    pub interval_ms: u64,
    /// The agent was injected.
    pub agent_injected: bool,
    /// Per GPU (every GPU NVML lists, used or not).
    pub devices: Vec<DeviceReport>,
    /// The job's processes that held GPU memory.
    pub processes: Vec<ProcessReport>,
    /// The out-of-memory error it hit, if any.
    pub oom: Option<OomFinding>,
    /// How the job's processes were kept: `cgroup` or `subreaper` (`docs/run.md`).
    pub containment: &'static str,
    /// What NVML's PIDs were to the job ([`ticks`]): `same`, `mapped` by a host daemon, or
    /// `cannot_map` (inside a PID namespace, `unmapped_ticks` ticks had host PIDs only, and
    /// their processes were not attributed).
    pub pid_mapping: PidMapping,
    /// Ticks whose processes could not be attributed (see `pid_mapping`).
    pub unmapped_ticks: u64,
    /// The job's processes still running when its command exited (or was stopped), which
    /// `run` then stopped.
    pub leftover_processes: usize,
    /// Of those, how many were still there after SIGKILL (uninterruptible sleep): the
    /// only ones that outlive `run`.
    pub unkillable_processes: usize,
    /// Its last lines of stderr (kept for `fit`'s report of a failed trial).
    #[serde(skip)]
    pub stderr_tail: Vec<String>,
    /// Its last lines of stdout (captured output only).
    #[serde(skip)]
    pub stdout_tail: Vec<String>,
    /// Signals that came (`SIGINT` to `fit` stops the search).
    #[serde(skip)]
    pub signals: Vec<i32>,
    /// The allocator traces its processes wrote (`fit` asks for them with
    /// `VRAMCTL_FIT_TRACE=1`), by PID, or why one could not be read.
    #[serde(skip)]
    pub alloc_traces: Vec<(u32, Result<crate::fit_trace::TraceFile, String>)>,
}

impl JobReport {
    /// The job's highest memory on any one GPU (NVML).
    pub fn peak_bytes(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| d.curve.peak_bytes)
            .max()
            .unwrap_or(0)
    }

    /// Whether it succeeded: exit 0, or stopped by us after its line.
    pub fn succeeded(&self) -> bool {
        match self.ending {
            Ending::Exited => self.exit_code == Some(0),
            Ending::StoppedAfterLine => self.oom.is_none(),
            Ending::TimedOut => false,
        }
    }

    /// The devices the job used (held memory on).
    pub fn used_devices(&self) -> impl Iterator<Item = &DeviceReport> {
        self.devices
            .iter()
            .filter(|d| d.curve.peak_bytes > 0 || d.framework.is_some())
    }
}

/// Why a job could not be run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The command did not start.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The agent's files could not be written.
    #[error("cannot prepare the agent for the command: {0}; use --no-agent")]
    Agent(std::io::Error),
}

/// An out-of-memory error as first seen: when, from which allocator and line, and each
/// GPU's used memory then.
type SeenOom = (
    Instant,
    Option<OomSource>,
    Option<String>,
    BTreeMap<String, u64>,
);

/// How often the agents are asked while the job runs, and how long one may take. Their
/// peak counters are exact whenever read, so the cadence only bounds how stale the figures
/// of a process killed by SIGKILL (no exit report) can be.
const AGENT_POLL: Duration = Duration::from_millis(500);
const AGENT_TIMEOUT: Duration = Duration::from_millis(500);

/// Runs `spec` to its end, sampling on `sampler`; `on_tick` sees each snapshot (`--record`,
/// progress displays).
///
/// # Errors
/// The command (or the agent's files) could not be set up; everything after its start is in
/// the report.
pub fn run_job(
    sampler: &mut LiveSampler,
    spec: &JobSpec,
    signals: &SignalForwarder,
    on_tick: &mut dyn FnMut(&Snapshot, &MemoryCurve),
) -> Result<JobReport, RunError> {
    let injection = if spec.agent {
        Some(AgentInjection::prepare().map_err(RunError::Agent)?)
    } else {
        None
    };
    let mut env = spec.env.clone();
    if let Some(inj) = &injection {
        let existing = std::env::var_os("PYTHONPATH");
        env.extend(inj.environment(existing.as_deref()));
    }
    let mut ticks = JobTicks::new(sampler, spec.daemon.clone());
    let first = ticks.tick().snapshot;
    let mut curve = MemoryCurve::starting_from(&first);
    let started = Instant::now();
    let started_unix_ms = first.taken_at_unix_ms;
    let mut scope = JobScope::new();
    let mut child = match child::spawn(&child_spec(spec, &env, &scope), signals) {
        Ok(child) => child,
        Err(err) if scope.kind() == scope::Kind::Cgroup => {
            // The kernel may refuse the move into the scope (a cgroup we could create but
            // not enter): nothing was executed, so start it again without one. A command
            // that cannot start fails the same way again and is reported then.
            tracing::debug!(%err, "The command did not start in its cgroup; trying without.");
            scope = JobScope::without_cgroup();
            child::spawn(&child_spec(spec, &env, &scope), signals)?
        }
        Err(err) => return Err(err.into()),
    };
    let mut tree = ProcessTree::new(std::process::id());
    let poller = AgentPoller::start(spec.agent);
    let mut oom: Option<SeenOom> = None;
    // NVML's recent samples, for its view of every process at the moment of an OOM the
    // agent reports after the fact (the newest RECENT_SAMPLES), and the one of the tick
    // that saw the OOM line.
    let mut recent: VecDeque<Snapshot> = VecDeque::with_capacity(RECENT_SAMPLES);
    let mut at_oom_line: Option<Snapshot> = None;
    let mut ending = Ending::Exited;
    let mut stop_sent: Option<Instant> = None;
    let mut killed = false;
    let mut seen_signals = Vec::new();
    let mut n: u32 = 0;
    let status = loop {
        let tick = ticks.tick();
        let t_ms = elapsed_ms(started);
        let pids = curve.observe(&tick.attributable(), t_ms, &mut tree);
        let snapshot = tick.snapshot;
        poller.watch(&pids);
        on_tick(&snapshot, &curve);
        for event in child.drain().into_iter().chain(signals.drain()) {
            match event {
                ChildEvent::OutOfMemory { at, source, line } => {
                    if oom.is_none() {
                        let used = used_at(&curve, started, at);
                        oom = Some((at, Some(source), Some(line), used));
                        at_oom_line = Some(snapshot.clone());
                    }
                }
                ChildEvent::UntilLine { .. } => {
                    if stop_sent.is_none() {
                        ending = Ending::StoppedAfterLine;
                        stop(&scope, &mut stop_sent);
                    }
                }
                ChildEvent::Signal { signal, .. } => seen_signals.push(signal),
            }
        }
        if let Some(limit) = spec.timeout
            && stop_sent.is_none()
            && started.elapsed() >= limit
        {
            ending = Ending::TimedOut;
            stop(&scope, &mut stop_sent);
        }
        if let Some(sent) = stop_sent
            && !killed
            && sent.elapsed() >= spec.stop_grace
        {
            scope.kill_all();
            killed = true;
        }
        if recent.len() == RECENT_SAMPLES {
            recent.pop_front();
        }
        recent.push_back(snapshot);
        if let Some(status) = child.poll_exit() {
            signals.release();
            break status;
        }
        n = n.wrapping_add(1);
        let due = started + spec.interval * n;
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
    };
    let wall = started.elapsed();
    // Whatever of the job still runs goes now: after its command exited by itself (a
    // daemon it left, a worker), or when it was stopped and the rest is in its grace.
    let (leftover_processes, unkillable_processes) =
        scope.stop_rest(stop_sent, spec.stop_grace, KILL_WAIT, &mut || {
            child.reap_orphans();
        });
    if unkillable_processes > 0 {
        tracing::warn!(
            unkillable_processes,
            "Processes of the job survived SIGKILL (uninterruptible sleep, usually in a driver)."
        );
    }
    let containment = scope.kind().as_str();
    let (pid_mapping, unmapped_ticks) = ticks.mapping();
    scope.close();
    // The streams end when the last holder exits; a descendant still running keeps them.
    child.finish_streams(Duration::from_millis(500));
    for event in child.drain() {
        if let ChildEvent::OutOfMemory { at, source, line } = event
            && oom.is_none()
        {
            let used = used_at(&curve, started, at);
            oom = Some((at, Some(source), Some(line), used));
        }
    }
    let polled = poller.finish();
    let reported = injection
        .as_ref()
        .map(AgentInjection::reports)
        .unwrap_or_default();
    let figures = FrameworkFigures::merge(&polled, &reported);
    let failed = !matches!(status, ExitStatus::Code(0)) && ending == Ending::Exited;
    let verdict_started = Instant::now();
    let agent_ooms = injection
        .as_ref()
        .map(|i| oom_verdict::agent_records(i.reports_dir()))
        .unwrap_or_default();
    if oom.is_none() && (figures.ooms().is_some_and(|c| c > 0) || !agent_ooms.is_empty()) {
        let last = curve
            .devices
            .iter()
            .filter_map(|d| {
                d.points
                    .last()
                    .map(|p| (d.uuid.clone(), p.device_used_bytes))
            })
            .collect();
        oom = Some((started + wall, None, None, last));
    }
    let oom = oom.map(|(at, source, line, device_used_bytes)| {
        let mut verdict = verdict_of(
            agent_ooms.first(),
            line.as_deref(),
            &recent,
            at_oom_line.as_ref(),
            &curve,
        );
        verdict.verdict_ms = Some(verdict_started.elapsed().as_secs_f64() * 1000.0);
        OomFinding {
            source,
            line,
            at_s: at.saturating_duration_since(started).as_secs_f64(),
            device_used_bytes,
            fatal: failed,
            verdict,
        }
    });
    let devices = curve
        .devices
        .iter()
        .map(|c| DeviceReport {
            capacity_bytes: c.capacity_bytes(),
            framework: figures.on_device(&c.uuid),
            leak: leak_of(c, started_unix_ms),
            curve: c.clone(),
        })
        .collect();
    let processes = curve
        .processes
        .values()
        .map(|p| {
            let own = figures.of_process(p.pid, &p.uuid);
            ProcessReport {
                nvml: p.clone(),
                allocated_peak_bytes: own.and_then(|f| f.allocated_peak_bytes),
                reserved_peak_bytes: own.and_then(|f| f.reserved_peak_bytes),
            }
        })
        .collect();
    let (exit_code, signal) = match status {
        ExitStatus::Code(c) => (Some(c), None),
        ExitStatus::Signal(s) => (None, Some(s)),
    };
    Ok(JobReport {
        command: spec
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        started_unix_ms,
        wall_s: wall.as_secs_f64(),
        ending,
        exit_code,
        signal,
        shell_code: status.shell_code(),
        interval_ms: u64::try_from(spec.interval.as_millis()).unwrap_or(u64::MAX),
        agent_injected: injection.is_some(),
        devices,
        processes,
        oom,
        containment,
        pid_mapping,
        unmapped_ticks,
        leftover_processes,
        unkillable_processes,
        stderr_tail: child.stderr_lines(20),
        stdout_tail: child.stdout_lines(20),
        signals: seen_signals,
        alloc_traces: injection
            .as_ref()
            .map(|i| alloc_traces(i.reports_dir()))
            .unwrap_or_default(),
    })
}

/// NVML samples kept for the moment of an OOM the agent reports: at the default 100 ms
/// interval the last 6 s (the observer's record is written before the error is raised, so
/// the moment is at most one process exit before the end).
const RECENT_SAMPLES: usize = 64;

/// The verdict on the job's first OOM: from the agent's snapshot where it kept one, else
/// from the OOM line and NVML (`oom_verdict`).
fn verdict_of(
    agent: Option<&(oom_verdict::AgentOomRecord, Option<Vec<u8>>)>,
    line: Option<&str>,
    recent: &VecDeque<Snapshot>,
    at_oom_line: Option<&Snapshot>,
    curve: &MemoryCurve,
) -> oom_verdict::OomVerdict {
    let record = agent.map(|(r, _)| r);
    let oom_unix_ms = record.and_then(|r| r.unix_ms);
    // The sample at or before the observer's moment; else the OOM line's tick; else the last.
    let sample = oom_unix_ms
        .and_then(|t| {
            recent
                .iter()
                .rev()
                .find(|s| s.taken_at_unix_ms <= t)
                .or_else(|| recent.front())
        })
        .or(at_oom_line)
        .or_else(|| recent.back());
    let job_pid = record.map(|r| r.pid);
    let in_job = |pid: u32| Some(pid) == job_pid || curve.processes.keys().any(|(p, _)| *p == pid);
    let command_of = |pid: u32| {
        vramctl_procs::procinfo::read_cmdline(pid)
            .filter(|c| !c.is_empty())
            .map(|c| vramctl_core::command_line::abbreviate(&c, 80))
    };
    let nvml = sample.map_or_else(oom_verdict::NvmlAtOom::default, |s| {
        oom_verdict::NvmlAtOom::from_sample(
            s,
            job_pid,
            record.and_then(|r| r.device),
            &in_job,
            &command_of,
            oom_unix_ms.or_else(|| at_oom_line.map(|s| s.taken_at_unix_ms)),
        )
    });
    if let Some((record, Some(bytes))) = agent
        && let Some(v) = oom_verdict::from_agent(record, bytes, &nvml)
    {
        return v;
    }
    if let Some(v) = line.and_then(|l| oom_verdict::from_message(l, &nvml, record)) {
        return v;
    }
    oom_verdict::OomVerdict::unknown(record, &nvml)
}

fn child_spec<'a>(
    spec: &'a JobSpec,
    env: &'a [(OsString, OsString)],
    scope: &'a JobScope,
) -> ChildSpec<'a> {
    ChildSpec {
        argv: &spec.argv,
        env,
        output: spec.output,
        until_line: spec.until_line.as_ref(),
        reap_orphans: spec.reap_orphans,
        scope,
    }
}

/// SIGTERM (and SIGCONT, so that a stopped process can act on it) to every process of the
/// job.
fn stop(scope: &JobScope, sent: &mut Option<Instant>) {
    scope.signal_all(rustix::process::Signal::TERM);
    scope.signal_all(rustix::process::Signal::CONT);
    *sent = Some(Instant::now());
}

/// How long the job's processes get to go after SIGKILL before the rest is reported as
/// unkillable (uninterruptible sleep).
const KILL_WAIT: Duration = Duration::from_secs(5);

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// How far before the message an out-of-memory error's "memory in use" looks. The line is
/// read when the reader thread gets to it, which on a loaded machine can be after the
/// process has exited and its memory gone back; the failing allocation itself came before
/// the message, with the memory still held.
const OOM_LOOKBACK_MS: u64 = 500;

/// Each GPU's highest used memory in the [`OOM_LOOKBACK_MS`] before `at`.
fn used_at(curve: &MemoryCurve, started: Instant, at: Instant) -> BTreeMap<String, u64> {
    let t_ms = u64::try_from(at.saturating_duration_since(started).as_millis()).unwrap_or(u64::MAX);
    curve
        .devices
        .iter()
        .filter_map(|d| {
            d.highest_used_between(t_ms.saturating_sub(OOM_LOOKBACK_MS), t_ms)
                .map(|u| (d.uuid.clone(), u))
        })
        .collect()
}

/// The leak verdict of the job's memory on one GPU, where it held any.
fn leak_of(curve: &memory_curve::DeviceCurve, started_unix_ms: i64) -> Option<LeakSummary> {
    if curve.peak_bytes == 0 {
        return None;
    }
    // While the job held memory here: the samples before its first allocation and after
    // it let go would read as a job "stable at 0 B".
    let first = curve.points.iter().position(|p| p.job_bytes > 0)?;
    let last = curve.points.iter().rposition(|p| p.job_bytes > 0)?;
    let samples: Vec<Sample> = curve.points[first..=last]
        .iter()
        .map(|p| {
            Sample::new(
                started_unix_ms.saturating_add(i64::try_from(p.t_ms).unwrap_or(i64::MAX)),
                p.job_bytes,
            )
        })
        .collect();
    let ctx = SeriesContext {
        capacity_bytes: curve.total_bytes,
        free_bytes: None,
        free_history: Default::default(),
        process_start_unix_ms: Some(started_unix_ms),
        device_label: Some(format!("GPU {}", curve.index)),
        ended: true,
        device_total: false,
    };
    let report: SeriesReport = analysis::analyze(
        &samples,
        &ActivityInputs::default(),
        &ctx,
        &LeakConfig::default(),
    )
    .ok()?;
    Some(LeakSummary {
        verdict: report.verdict.as_str(),
        explanation: report.explanation,
    })
}

/// The agents' figures per (pid, device), the highest of what was polled and what each
/// process reported at exit.
#[derive(Debug, Default)]
struct FrameworkFigures {
    by_process: BTreeMap<(u32, String), FrameworkPeaks>,
}

impl FrameworkFigures {
    fn merge(polled: &[(u32, Stats)], reported: &[(u32, Stats)]) -> Self {
        let mut out = Self::default();
        for (pid, stats) in polled.iter().chain(reported) {
            for d in &stats.devices {
                let Some(uuid) = d.uuid.as_deref() else {
                    continue;
                };
                let key = (*pid, normalize_uuid(uuid));
                let entry = out.by_process.entry(key).or_default();
                entry.processes = 1;
                entry.allocated_peak_bytes =
                    max_opt(entry.allocated_peak_bytes, d.allocated_peak_bytes);
                entry.reserved_peak_bytes =
                    max_opt(entry.reserved_peak_bytes, d.reserved_peak_bytes);
                entry.ooms = max_opt(entry.ooms, d.ooms);
            }
        }
        out
    }

    fn of_process(&self, pid: u32, nvml_uuid: &str) -> Option<&FrameworkPeaks> {
        self.by_process.get(&(pid, normalize_uuid(nvml_uuid)))
    }

    fn on_device(&self, nvml_uuid: &str) -> Option<FrameworkPeaks> {
        let uuid = normalize_uuid(nvml_uuid);
        let mut sum: Option<FrameworkPeaks> = None;
        for ((_, u), f) in &self.by_process {
            if *u != uuid {
                continue;
            }
            let s = sum.get_or_insert_with(FrameworkPeaks::default);
            s.processes += 1;
            s.allocated_peak_bytes = add_opt(s.allocated_peak_bytes, f.allocated_peak_bytes);
            s.reserved_peak_bytes = add_opt(s.reserved_peak_bytes, f.reserved_peak_bytes);
            s.ooms = add_opt(s.ooms, f.ooms);
        }
        sum
    }

    fn ooms(&self) -> Option<u64> {
        self.by_process
            .values()
            .filter_map(|f| f.ooms)
            .reduce(u64::saturating_add)
    }
}

/// The allocator traces in the report directory (`<pid>.trace.json`), each read bounded,
/// never through a symlink, only when ours (`oom_verdict::read_job_file`).
fn alloc_traces(dir: &std::path::Path) -> Vec<(u32, Result<crate::fit_trace::TraceFile, String>)> {
    let mut out = Vec::new();
    for pid in oom_verdict::job_file_pids(dir, ".trace.json") {
        let file = oom_verdict::read_job_file(
            dir,
            &format!("{pid}.trace.json"),
            crate::fit_trace::MAX_TRACE_BYTES,
        )
        .and_then(|b| crate::fit_trace::TraceFile::parse(&b));
        out.push((pid, file));
    }
    out.sort_by_key(|(pid, _)| *pid);
    out
}

/// The agent gives UUIDs without NVML's `GPU-` / `MIG-` prefix.
pub(crate) fn normalize_uuid(uuid: &str) -> String {
    uuid.strip_prefix("GPU-")
        .or_else(|| uuid.strip_prefix("MIG-"))
        .unwrap_or(uuid)
        .to_ascii_lowercase()
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

fn add_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.saturating_add(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Asks the agents of the job's processes for `stats` off the sampling thread (an agent
/// may take up to its timeout to answer), keeping each process's last answer.
struct AgentPoller {
    shared: Arc<Mutex<PollState>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct PollState {
    pids: Vec<u32>,
    last: BTreeMap<u32, Stats>,
}

impl AgentPoller {
    fn start(enabled: bool) -> Self {
        let shared = Arc::new(Mutex::new(PollState::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = enabled
            .then(|| {
                let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
                std::thread::Builder::new()
                    .name("vramctl-run-agents".into())
                    .spawn(move || poll_agents(&shared, &stop))
                    .ok()
            })
            .flatten();
        Self {
            shared,
            stop,
            thread,
        }
    }

    fn watch(&self, pids: &[u32]) {
        if let Ok(mut state) = self.shared.lock() {
            for pid in pids {
                if !state.pids.contains(pid) {
                    state.pids.push(*pid);
                }
            }
        }
    }

    fn finish(mut self) -> Vec<(u32, Stats)> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.shared
            .lock()
            .map(|s| s.last.iter().map(|(p, st)| (*p, st.clone())).collect())
            .unwrap_or_default()
    }
}

fn poll_agents(shared: &Mutex<PollState>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let pids = shared.lock().map(|s| s.pids.clone()).unwrap_or_default();
        for pid in pids {
            if let Some(stats) = agent_client::stats_of(pid, AGENT_TIMEOUT)
                && let Ok(mut state) = shared.lock()
            {
                state.last.insert(pid, stats);
            }
        }
        let until = Instant::now() + AGENT_POLL;
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramctl_agent::agent_client::DeviceStats;

    fn stats(uuid: &str, alloc: u64, reserved: u64, ooms: u64) -> Stats {
        Stats {
            taken_at: 0.0,
            devices: vec![DeviceStats {
                framework: "torch".into(),
                index: 0,
                uuid: Some(uuid.into()),
                allocated_bytes: None,
                reserved_bytes: None,
                cached_bytes: None,
                releasable_bytes: None,
                inactive_split_bytes: None,
                allocated_peak_bytes: Some(alloc),
                reserved_peak_bytes: Some(reserved),
                alloc_retries: None,
                ooms: Some(ooms),
                error: None,
            }],
        }
    }

    #[test]
    fn the_exit_report_s_later_peak_wins_and_ranks_on_one_gpu_add_up() {
        let polled = vec![(10, stats("abc", 5, 8, 0)), (11, stats("abc", 1, 2, 0))];
        let reported = vec![(10, stats("abc", 7, 9, 1))];
        let f = FrameworkFigures::merge(&polled, &reported);
        let own = f
            .of_process(10, "GPU-ABC")
            .expect("matched by uuid without its prefix");
        assert_eq!(
            (own.allocated_peak_bytes, own.reserved_peak_bytes),
            (Some(7), Some(9))
        );
        let device = f.on_device("GPU-abc").expect("device");
        assert_eq!(device.processes, 2);
        assert_eq!(device.reserved_peak_bytes, Some(11));
        assert_eq!(f.ooms(), Some(1));
        assert!(f.on_device("GPU-other").is_none());
    }
}
