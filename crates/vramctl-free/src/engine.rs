//! `vramctl reap`: policy-driven reclaim of GPU memory from idle holders.
//!
//! A round: sample the GPUs once, join each process holding memory with /proc, find the
//! idle evidence for each of its GPUs (the recorded history through `leaks`' scan, or
//! `FleetTracker` when `--every` watches live; `reap/evidence.rs`), judge it against each
//! policy (`reap/decide.rs`, pure), check that the safe path would signal it
//! (`signal::inspect`), cap the number with `max_kills`, and print the plan with the
//! evidence for each candidate and the reason for each process left alone. With `--apply`
//! the candidates go through `signal::execute` as an automatic kill (`Origin::Policy`:
//! refused without pidfds; action `reap` in the audit log), and `kill`'s release check
//! (`kill/release.rs`) verifies through NVML that the memory came back.
//!
//! Once, or as a loop (`--every`) that samples at `--interval` between rounds and stops
//! cleanly on SIGINT/SIGTERM (a round in progress, kills included, is finished first).
//! `docs/reap.md` is the user's guide.

mod decide;
mod evidence;
mod policy;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use jiff::tz::TimeZone;
use serde::Serialize;
use vramctl_core::Backend;
use vramctl_core::analysis::live::{FleetConfig, FleetTracker, SeriesKey};
use vramctl_core::analysis::{Evidence, LeakConfig, Verdict, human_duration};
use vramctl_core::clock::{Clock, ManualClock, SystemClock};
use vramctl_core::process_catalog::{FactsSource, ProcessCatalog};
use vramctl_core::procinfo::{self, ProcReader};
use vramctl_core::signal::{
    self, Actor, Candidate, KillRequest, Origin, Provenance, Target, TargetOutcome, TargetReport,
};
use vramctl_core::types::{DeviceInfo, Snapshot};
use vramctl_store::format::rfc3339;

use self::decide::{
    Context as DecideContext, CpuSince, GpuEvidence, GpuNow, Observed, Source, Stage,
};
use self::evidence::{FRESH, History, read_history};
use self::policy::{Policy, PolicyJson};
use super::db_path;
use crate::audit_sink::{AuditLog, open_log};
use crate::cli::{GlobalArgs, ReapAction, ReapArgs};
use crate::exit::Exit;
use vramctl::memory_release::{
    DeviceRelease, Outcome, StillHeld, ended_pids, record_memory_outcomes, release_lines,
    still_held, verify_release,
};
use vramctl_core::untrusted::Untrusted;
use vramctl_core::wall_time::zone as time_zone;
use vramctl_core::wall_time::{clock, same_day};
use vramctl_observe::gpu_holdings::{GpuHolding, holdings};
use vramctl_observe::gpu_selection::GpuFilter;
use vramctl_observe::live_loop::{
    LiveSampler, clock_of, open_backend, sampler_on, stop_signals, wait_next_tick,
};
use vramctl_observe::units;

/// Version of the JSON below; bumped on any incompatible change.
pub const SCHEMA: u32 = 1;

/// The history is analysed over at least this long before now (as `leaks` does), and over
/// twice the longest `idle_for` when that is longer.
const LOOKBACK: Duration = Duration::from_secs(24 * 3600);

/// Runs `reap`.
pub fn run(global: &GlobalArgs, args: &ReapArgs) -> anyhow::Result<Exit> {
    let policies = policy::resolve(args)?;
    let (grace, timeout) = (args.grace, args.timeout);
    if args.max_kills == Some(0) {
        bail!("--max-kills 0 would never reap; leave --apply out to only see the plan");
    }
    let every_ms = args.every.map(super::millis);
    let interval_ms = super::millis(args.interval);
    let interval_ms = every_ms.map_or(interval_ms, |e| interval_ms.min(e));
    let tz = time_zone(args.tz.as_deref())?;
    let longest = policies
        .iter()
        .map(|p| p.idle_for)
        .max()
        .unwrap_or(policy::DEFAULT_IDLE_FOR);
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

    let manual = args.simulated_clock.map(ManualClock::new);
    let backend = open_backend(&global.backends())?;
    let mut sampler =
        sampler_on(backend, clock_of(manual.as_ref()), true).context("cannot list the GPUs")?;
    for p in &policies {
        GpuFilter::new(&p.gpus, sampler.devices())
            .with_context(|| format!("policy '{}'", p.name))?;
    }
    // Fail closed up front: with --apply, no round starts without a writable audit log.
    let audit = if args.apply {
        Some(open_log(global)?)
    } else {
        None
    };
    let live = match every_ms {
        Some(_) => Some(Live {
            fleet: FleetTracker::new(FleetConfig {
                leak: cfg.clone(),
                ..FleetConfig::default()
            })
            .map_err(|e| anyhow!("{e}"))?,
            since_unix_ms: None,
            samples: 0,
        }),
        None => None,
    };
    let mut runner = Runner {
        args,
        policies,
        actor: Actor::current(),
        procs: ProcReader::new(),
        processes: ProcessCatalog::new(FactsSource::Proc),
        db: db_path(global)?,
        lookback: LOOKBACK.max(longest.saturating_mul(2)),
        cfg,
        audit,
        grace,
        timeout,
        tz,
        live,
        ticks_per_second: procfs::ticks_per_second().max(1),
    };
    let stdout = std::io::stdout();

    let Some(every_ms) = every_ms else {
        let snapshot = sampler.tick();
        let report = runner.round(&mut sampler, &snapshot, 1)?;
        runner.print(&mut stdout.lock(), &report)?;
        return Ok(if report.ok {
            Exit::Ok
        } else {
            Exit::ConditionHolds
        });
    };

    let signals = stop_signals()?;
    let started = Instant::now();
    let mut next_round_ms: Option<i64> = None;
    let mut rounds: u64 = 0;
    let mut samples: u64 = 0;
    loop {
        let snapshot = sampler.tick();
        samples += 1;
        runner.observe(&mut sampler, &snapshot);
        // Rounds are paced on the monotonic clock: a wall-clock step back must not put
        // the next one off by the length of the step.
        let now = snapshot.monotonic_ms;
        if next_round_ms.is_none_or(|next| now >= next) {
            rounds += 1;
            let report = runner.round(&mut sampler, &snapshot, rounds)?;
            runner.print(&mut stdout.lock(), &report)?;
            let mut next = next_round_ms.unwrap_or(now).saturating_add(every_ms);
            // A round that took longer than --every: the next one is the next due time.
            while next <= now {
                next = next.saturating_add(every_ms);
            }
            next_round_ms = Some(next);
            if args.rounds.is_some_and(|n| rounds >= n) {
                break;
            }
        }
        if wait_next_tick(manual.as_ref(), &signals, started, samples, interval_ms) {
            tracing::info!(rounds, "Stopping on a signal.");
            break;
        }
    }
    Ok(Exit::Ok)
}

/// What `--every` watches between rounds.
struct Live {
    fleet: FleetTracker,
    since_unix_ms: Option<i64>,
    samples: u64,
}

/// The state kept across rounds.
struct Runner<'a> {
    args: &'a ReapArgs,
    policies: Vec<Policy>,
    actor: Actor,
    /// Fresh reads of /proc for the signal path (`signal::inspect` proves who a process is
    /// right before it is signalled) and the release check.
    procs: ProcReader,
    /// What /proc says about the GPU processes: their names, identity and CPU time.
    processes: ProcessCatalog,
    db: std::path::PathBuf,
    lookback: Duration,
    cfg: LeakConfig,
    audit: Option<AuditLog>,
    grace: Duration,
    timeout: Duration,
    tz: TimeZone,
    live: Option<Live>,
    ticks_per_second: u64,
}

/// One process chosen, with what the plan and the audit log say about it.
struct Chosen {
    observed: Observed,
    policy: String,
    candidate: Candidate,
    judged: decide::Chosen,
}

impl Runner<'_> {
    /// Brings the process catalog up to `snapshot` (monotonic time: the catalog's refresh
    /// policy counts spans).
    fn observe_processes(&mut self, sampler: &mut LiveSampler, snapshot: &Snapshot) {
        let backend = sampler.backend_mut();
        self.processes
            .observe_snapshot(snapshot, snapshot.monotonic_ms, &mut |pid| {
                backend.process_name(pid)
            });
    }

    /// Feeds a live sample to the tracker.
    fn observe(&mut self, sampler: &mut LiveSampler, snapshot: &Snapshot) {
        if self.live.is_none() {
            return;
        }
        self.observe_processes(sampler, snapshot);
        let Some(live) = &mut self.live else { return };
        let (processes, mono) = (&mut self.processes, snapshot.monotonic_ms);
        live.fleet
            .observe(snapshot, |pid| processes.live_facts(pid, mono));
        live.since_unix_ms.get_or_insert(snapshot.taken_at_unix_ms);
        live.samples += 1;
    }

    fn time(&self, t: i64, now: i64) -> String {
        clock(&self.tz, t, !same_day(&self.tz, t, now))
    }

    /// One round on `snapshot` (module docs).
    #[allow(clippy::too_many_lines)]
    fn round(
        &mut self,
        sampler: &mut LiveSampler,
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
        self.observe_processes(sampler, snapshot);
        let by_pid = holdings(snapshot, &GpuFilter::default());
        let pids: Vec<u32> = by_pid.keys().copied().collect();
        let history = read_history(&self.db, now, self.lookback, &pids, &self.cfg)?;
        // Owns its zone, so the loop below may borrow `self` mutably.
        let tz = self.tz.clone();
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
        let boot_id = self.actor.boot_id.clone();

        let mut observed: Vec<Observed> = Vec::new();
        for (pid, gpus) in &by_pid {
            // The command line, or the driver's name for a process /proc cannot see.
            let entry = self.processes.get(*pid);
            let facts = entry.map(|e| e.facts.clone()).unwrap_or_default();
            let command = facts.command.clone();
            let start = entry.and_then(|e| e.start_time_ticks);
            let cpu_now_ms = self
                .processes
                .stat(*pid, snapshot.monotonic_ms)
                .map(|s| s.cpu_time_ms);
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
                        let report = live.fleet.report(&SeriesKey {
                            device_uuid: h.uuid.clone(),
                            pid: *pid,
                            start_time_ticks: start,
                        })?;
                        // Fresh by the tracker's own time line, which a wall-clock step
                        // does not move.
                        let live_now = live.fleet.now_ms().unwrap_or(now);
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
                uid: facts.uid,
                user: facts.user,
                command,
                gpus: gpus_now,
                cpu_since_history: cpu_since,
            });
        }

        let ctx = DecideContext {
            cpu_idle_fraction: self.cfg.cpu_idle_fraction,
            cpu_slack_ms: 1000 / self.ticks_per_second,
            missing: &missing,
            time: &time,
        };
        let mut chosen: Vec<Chosen> = Vec::new();
        let mut excluded: Vec<ExcludedJson> = Vec::new();
        for p in observed {
            let mut best: Option<(String, decide::Exclusion)> = None;
            let mut pick = None;
            for policy in &self.policies {
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
            match signal::inspect(
                p.pid,
                &self.actor,
                p.start_time_ticks,
                Provenance::Named,
                &mut self.procs,
            ) {
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
                .policies
                .iter()
                .find(|p| p.name == c.policy)
                .and_then(|p| p.max_kills);
            let taken = per_policy.get(&c.policy).copied().unwrap_or(0);
            let over = match (policy_cap, self.args.max_kills) {
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
            dry_run: !self.args.apply,
            action: match self.args.action {
                ReapAction::Kill => "kill",
                ReapAction::Reclaim => "reclaim",
            },
            policies: self.policies.iter().map(Policy::json).collect(),
            max_kills: self.args.max_kills,
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
            #[allow(clippy::used_underscore_binding)]
            _now: now,
        };
        if !self.args.apply || kept.is_empty() {
            return Ok(report);
        }
        let Some(audit) = self.audit.as_mut() else {
            bail!("internal: --apply without an audit log");
        };
        report.audit_log = Some(audit.database().display().to_string());
        if self.args.action == ReapAction::Reclaim {
            reclaim_candidates(sampler, audit, &mut report);
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
        let watch: Vec<(u32, u32)> = kept
            .iter()
            .flat_map(|c| procinfo::descendants(c.observed.pid))
            .collect();
        let targets: Vec<Target> = kept
            .iter()
            .map(|c| Target {
                candidate: c.candidate.clone(),
                reason: format!("vramctl reap, policy '{}': {}", c.policy, c.judged.why),
            })
            .collect();
        let request = KillRequest {
            signal: self.args.signal,
            grace: self.grace,
            escalate: true,
            origin: Origin::Policy,
            ..KillRequest::new(targets, "reap")
        };
        let started = Instant::now();
        report.signalled_at = Some(rfc3339(SystemClock.now_unix_ms()));
        let outcomes = signal::execute(&request, &self.actor, audit, &SystemClock);
        let ended = ended_pids(&outcomes);
        report.devices = verify_release(sampler, snapshot, &ended, started, self.timeout);
        record_memory_outcomes(audit, &outcomes, &held_before, &report.devices);
        report.still_held = still_held(&report.devices, &watch, &mut self.procs);
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

    fn print(&self, out: &mut impl Write, report: &RoundReport) -> anyhow::Result<()> {
        if self.args.json {
            serde_json::to_writer(&mut *out, report).context("cannot write JSON")?;
            writeln!(out).context("cannot write to stdout")?;
        } else {
            for line in self.human(report) {
                writeln!(out, "{}", Untrusted(&line)).context("cannot write to stdout")?;
            }
        }
        out.flush().context("cannot write to stdout")
    }

    /// The plan, and with `--apply` what happened.
    fn human(&self, r: &RoundReport) -> Vec<String> {
        let now = r._now;
        let time = |t: i64| self.time(t, now);
        let mut lines = Vec::new();
        let round = if self.live.is_some() {
            format!(" round {}", r.round)
        } else {
            String::new()
        };
        lines.push(format!(
            "reap{round} at {}{}",
            vramctl_core::wall_time::labelled(&self.tz, now),
            if r.dry_run { " (dry run)" } else { "" }
        ));
        for p in &self.policies {
            lines.push(format!("  policy {}: {}", p.name, p.describe()));
        }
        if let Some(cap) = r.max_kills {
            lines.push(format!("  at most {cap} per run (--max-kills)"));
        }
        let history = match (r.history.exists, r.history.last_sample_ms) {
            (false, _) => format!("none at '{}'", r.history.database),
            (true, None) => format!("'{}' (no samples)", r.history.database),
            (true, Some(t)) => format!("'{}' up to {}", r.history.database, time(t)),
        };
        let live = self.live.as_ref().map_or_else(
            || "not watched (--every watches live)".to_owned(),
            |l| {
                format!(
                    "watched since {} ({})",
                    l.since_unix_ms.map_or_else(|| "now".to_owned(), time),
                    plural(
                        usize::try_from(l.samples).unwrap_or(usize::MAX),
                        "sample",
                        "samples"
                    )
                )
            },
        );
        lines.push(format!("  evidence: history {history}; live {live}"));
        lines.push(String::new());

        let total: u64 = r.candidates.iter().filter_map(|c| c.used_bytes).sum();
        if r.candidates.is_empty() {
            lines.push("nothing to reap".to_owned());
        } else {
            lines.push(format!(
                "{} {} ({}):",
                if r.dry_run { "would reap" } else { "reaping" },
                plural(r.candidates.len(), "process", "processes"),
                units::bytes(total)
            ));
        }
        for c in &r.candidates {
            lines.push(format!(
                "  PID {} ({}) {}",
                c.pid,
                c.user.as_deref().unwrap_or("?"),
                c.command.as_deref().unwrap_or("?")
            ));
            for g in &c.gpus {
                lines.push(format!("    {}", g.human(&time)));
            }
            lines.push(format!("    why: {} [policy {}]", c.why, c.policy));
            if let Some(note) = &c.note {
                lines.push(format!("    note: {note}"));
            }
        }
        if !r.excluded.is_empty() {
            lines.push(String::new());
            lines.push("left alone:".to_owned());
            for e in &r.excluded {
                lines.push(format!(
                    "  PID {} ({}, {}): {}",
                    e.pid,
                    e.command.as_deref().unwrap_or("?"),
                    units::opt_bytes(e.used_bytes),
                    e.reason
                ));
            }
        }
        lines.push(String::new());
        if r.dry_run && r.action == "reclaim" {
            if !r.candidates.is_empty() {
                lines.push(format!(
                    "dry run: nothing was asked; --apply would ask the agents of {} to release \
                     their cache (those without one are left running)",
                    plural(r.candidates.len(), "process", "processes")
                ));
            }
            return lines;
        }
        if r.dry_run {
            if !r.candidates.is_empty() {
                lines.push(format!(
                    "dry run: nothing was signalled; --apply would end {} ({})",
                    plural(r.candidates.len(), "process", "processes"),
                    units::bytes(total)
                ));
            }
            return lines;
        }
        for c in &r.candidates {
            lines.push(match c.outcome {
                "exited" => format!(
                    "PID {}: ended by {} after {}{}",
                    c.pid,
                    c.signals.last().map_or("?", String::as_str),
                    units::seconds(c.exited_after_s.unwrap_or(0.0)),
                    if c.escalated { " (escalated)" } else { "" }
                ),
                "already_gone" => format!("PID {}: had already exited", c.pid),
                "reclaimed" | "nothing_reclaimed" => format!(
                    "PID {}: {}; NVML shows {} returned",
                    c.pid,
                    c.detail.as_deref().unwrap_or("?"),
                    units::opt_bytes(c.freed_bytes)
                ),
                other => format!(
                    "PID {}: {}: {}",
                    c.pid,
                    other.replace('_', " "),
                    c.detail.as_deref().unwrap_or("?")
                ),
            });
        }
        lines.extend(release_lines(&r.devices, &r.still_held));
        if !r.candidates.is_empty() {
            lines.push(format!("freed {} in total", units::bytes(r.freed_bytes)));
        }
        if let Some(a) = &self.audit {
            if r.audit_log.is_some() {
                lines.push(format!("audit log: {}", a.describe()));
            }
        }
        lines
    }
}

/// `--action reclaim`: each candidate's agent is asked to release its cache
/// (`vramctl_core::reclaim`, audited as `reclaim`); nobody is signalled. `ok` when every
/// candidate released something.
fn reclaim_candidates(sampler: &mut LiveSampler, audit: &mut AuditLog, report: &mut RoundReport) {
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
    report.signalled_at = Some(rfc3339(SystemClock.now_unix_ms()));
    let mut results = Vec::new();
    // One request per candidate, so that each audit record carries its own policy's reason.
    for (pid, reason) in pids.iter().zip(reasons) {
        let request = vramctl_core::reclaim::ReclaimRequest {
            selection: vramctl_core::reclaim::Selection::Pids(vec![*pid]),
            options: vramctl_core::agent_client::ReclaimOptions::default(),
            timeouts: vramctl_core::agent_client::Timeouts::default(),
            reason,
        };
        results.extend(vramctl_core::reclaim::reclaim(sampler, &request, audit).processes);
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
struct RoundReport {
    schema: u32,
    at: String,
    round: u64,
    dry_run: bool,
    /// `kill` or `reclaim` (`--action`).
    action: &'static str,
    policies: Vec<PolicyJson>,
    max_kills: Option<usize>,
    history: HistoryJson,
    live: Option<LiveJson>,
    candidates: Vec<CandidateJson>,
    excluded: Vec<ExcludedJson>,
    devices: Vec<DeviceRelease>,
    still_held: Vec<StillHeld>,
    freed_bytes: u64,
    signalled_at: Option<String>,
    audit_log: Option<String>,
    ok: bool,
    #[serde(skip)]
    _now: i64,
}

#[derive(Debug, Serialize)]
struct HistoryJson {
    database: String,
    exists: bool,
    last_sample: Option<String>,
    #[serde(skip)]
    last_sample_ms: Option<i64>,
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
struct LiveJson {
    since: Option<String>,
    samples: u64,
}

/// A process on one GPU: its memory there and the evidence about it.
#[derive(Debug, Serialize)]
struct GpuJson {
    index: u32,
    uuid: String,
    used_bytes: Option<u64>,
    source: Option<Source>,
    verdict: Option<Verdict>,
    idle_since: Option<String>,
    idle_s: Option<f64>,
    evidence: Vec<Evidence>,
    last_active: Option<String>,
    last_sample: Option<String>,
    sm_percent_now: Option<u32>,
    #[serde(skip)]
    idle_since_ms: Option<i64>,
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

    /// `GPU 0: 8.0 GiB, idle since 20:31:32 (2 min) by per-process SM activity [history]`.
    fn human(&self, time: &dyn Fn(i64) -> String) -> String {
        let mut line = format!("GPU {}: {}", self.index, units::opt_bytes(self.used_bytes));
        if let (Some(since), Some(idle_s)) = (self.idle_since_ms, self.idle_s) {
            let by: Vec<&str> = self.evidence.iter().map(|e| e.describe()).collect();
            line.push_str(&format!(
                ", idle since {} ({}) by {}",
                time(since),
                human_duration(idle_s),
                by.join(", ")
            ));
        }
        if let Some(source) = self.source {
            line.push_str(&format!(" [{}]", source.as_str()));
        }
        line
    }
}

#[derive(Debug, Serialize)]
struct CandidateJson {
    pid: u32,
    start_time_ticks: u64,
    user: Option<String>,
    uid: u32,
    command: Option<String>,
    policy: String,
    used_bytes: Option<u64>,
    gpus: Vec<GpuJson>,
    idle_since: String,
    idle_s: f64,
    sources: Vec<Source>,
    why: String,
    note: Option<String>,
    /// `would_signal` (dry run), then as `kill`: `exited`, `already_gone`, `refused`,
    /// `still_running`, `audit_failed`, `signal_failed`; with `--action reclaim` as
    /// `vramctl reclaim`'s `status`: `reclaimed`, `nothing_reclaimed`, `no_agent`, `error`, …
    outcome: &'static str,
    detail: Option<String>,
    signals: Vec<String>,
    escalated: bool,
    exited_after_s: Option<f64>,
    pinned: Option<bool>,
    freed_bytes: Option<u64>,
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
struct ExcludedJson {
    pid: u32,
    start_time_ticks: Option<u64>,
    user: Option<String>,
    command: Option<String>,
    used_bytes: Option<u64>,
    gpus: Vec<GpuJson>,
    /// The policy whose rules it got furthest through.
    policy: Option<String>,
    stage: Stage,
    reason: String,
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
    use super::*;

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
