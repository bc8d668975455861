//! `vramctl reap`: policy-driven reclaim of GPU memory from idle holders.
//!
//! The command settles its arguments into `vramctl_free`'s `ReapConfig`, runs the engine
//! (`vramctl_free::engine`: one pass of observe → evidence → decide → act → audit) once or
//! as a loop, with the real executor below (signals through `vramctl_procs::signal`, agents
//! asked through `vramctl_agent::reclaim`, both audited to the audit log), and prints each
//! pass's report.
//!
//! Once, or as a loop (`--every`) that samples at `--interval` between rounds and stops
//! cleanly on SIGINT/SIGTERM (a round in progress, kills included, is finished first).
//! `docs/reap.md` is the user's guide.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use jiff::tz::TimeZone;
use vramctl_agent::reclaim::{ProcessReclaim, ReclaimRequest};
use vramctl_core::clock::{ManualClock, SystemClock};
use vramctl_core::types::Snapshot;
use vramctl_core::wall_time::zone as time_zone;
use vramctl_core::wall_time::{clock, same_day};
use vramctl_free::engine::{
    Action, Engine, GpuJson, ReapConfig, ReapExecutor, RoundReport, Terminated, leak_config,
};
use vramctl_free::memory_release::{
    ended_pids, record_memory_outcomes, release_lines, still_held, verify_release,
};
use vramctl_free::policy::{self, PolicyFlags};
use vramctl_gpu::Backend;
use vramctl_leaks::analysis::human_duration;
use vramctl_observe::gpu_holdings::GpuHolding;
use vramctl_observe::gpu_selection::GpuFilter;
use vramctl_observe::live_loop::{
    LiveSampler, clock_of, open_backend, sampler_on, stop_signals, wait_next_tick,
};
use vramctl_observe::units;
use vramctl_procs::procinfo::{self, ProcReader};
use vramctl_procs::signal::{self, Actor, Candidate, KillRequest, Provenance, Refusal};

use super::db_path;
use crate::audit_sink::{AuditLog, open_log};
use crate::cli::{GlobalArgs, ReapAction, ReapArgs};
use crate::exit::Exit;
use crate::output::emit::{Format, Lines, emit};

/// Runs `reap`.
pub fn run(global: &GlobalArgs, args: &ReapArgs) -> anyhow::Result<Exit> {
    let policies = policy::resolve(&PolicyFlags {
        config: args.config.clone(),
        policy: args.policy.clone(),
        idle_for: args.idle_for,
        min_mem: args.min_mem.clone(),
        user: args.user.clone(),
        pattern: args.pattern.clone(),
        exclude: args.exclude.clone(),
        gpu: args.gpu.selectors.clone(),
        owners: args.owners.selectors(),
    })?;
    if args.max_kills == Some(0) {
        bail!("--max-kills 0 would never reap; leave --apply out to only see the plan");
    }
    let every_ms = args.every.map(super::millis);
    let interval_ms = super::millis(args.interval);
    let interval_ms = every_ms.map_or(interval_ms, |e| interval_ms.min(e));
    let tz = time_zone(args.tz.as_deref())?;
    let leak = leak_config(&policies)?;

    let manual = args.simulated_clock.map(ManualClock::new);
    let backend = open_backend(&global.backends())?;
    let sampler =
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
    let actor = Actor::current();
    let config = ReapConfig {
        policies,
        leak,
        apply: args.apply,
        action: match args.action {
            ReapAction::Kill => Action::Kill,
            ReapAction::Reclaim => Action::Reclaim,
        },
        max_kills: args.max_kills,
        signal: args.signal,
        grace: args.grace,
        timeout: args.timeout,
        db: db_path(global)?,
        live: every_ms.is_some(),
        boot_id: actor.boot_id.clone(),
        tz: tz.clone(),
        ticks_per_second: procfs::ticks_per_second().max(1),
    };
    // The signal's time in the report is the wall clock's, as the audit log's.
    let mut engine = Engine::new(config, Arc::new(SystemClock))?;
    let mut exec = Executor {
        sampler,
        actor,
        procs: ProcReader::new(),
        audit,
    };
    let printer = Printer {
        json: args.json,
        tz,
    };
    let stdout = std::io::stdout();

    let Some(every_ms) = every_ms else {
        let snapshot = exec.sampler.tick();
        let report = engine.round(&mut exec, &snapshot, 1)?;
        printer.print(&mut stdout.lock(), &engine, exec.audit.as_ref(), &report)?;
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
        let snapshot = exec.sampler.tick();
        samples += 1;
        engine.observe(&mut exec, &snapshot);
        // Rounds are paced on the monotonic clock: a wall-clock step back must not put
        // the next one off by the length of the step.
        let now = snapshot.monotonic_ms;
        if next_round_ms.is_none_or(|next| now >= next) {
            rounds += 1;
            let report = engine.round(&mut exec, &snapshot, rounds)?;
            printer.print(&mut stdout.lock(), &engine, exec.audit.as_ref(), &report)?;
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

/// The real effects: the GPUs through the sampler, signals through `signal`'s safe path,
/// agents through `reclaim`, every action recorded in the audit log.
struct Executor {
    sampler: LiveSampler,
    actor: Actor,
    /// Fresh reads of /proc for the signal path (`signal::inspect` proves who a process is
    /// right before it is signalled) and the release check.
    procs: ProcReader,
    /// Open when `--apply` (opened before the first round).
    audit: Option<AuditLog>,
}

impl ReapExecutor for Executor {
    fn process_name(&mut self, pid: u32) -> Option<String> {
        self.sampler.backend_mut().process_name(pid)
    }

    fn inspect(&mut self, pid: u32, start_time_ticks: Option<u64>) -> Result<Candidate, Refusal> {
        signal::inspect(
            pid,
            &self.actor,
            start_time_ticks,
            Provenance::Named,
            &mut self.procs,
        )
    }

    fn audit_log(&self) -> Option<String> {
        self.audit
            .as_ref()
            .map(|a| a.database().display().to_string())
    }

    fn terminate(
        &mut self,
        request: &KillRequest,
        before: &Snapshot,
        held_before: &BTreeMap<u32, Vec<GpuHolding>>,
        timeout: Duration,
    ) -> Terminated {
        let Some(audit) = self.audit.as_mut() else {
            // The engine asks for the audit log first; without one nothing is signalled.
            return Terminated::default();
        };
        // Before the signal: a child that inherits the memory must still be findable.
        let watch: Vec<(u32, u32)> = request
            .targets
            .iter()
            .flat_map(|t| procinfo::descendants(t.candidate.identity.pid))
            .collect();
        let started = Instant::now();
        let outcomes = signal::execute(request, &self.actor, audit, &SystemClock);
        let ended = ended_pids(&outcomes);
        let devices = verify_release(&mut self.sampler, before, &ended, started, timeout);
        record_memory_outcomes(audit, &outcomes, held_before, &devices);
        let still_held = still_held(&devices, &watch, &mut self.procs);
        Terminated {
            outcomes,
            devices,
            still_held,
        }
    }

    fn reclaim(&mut self, request: &ReclaimRequest) -> Vec<ProcessReclaim> {
        match self.audit.as_mut() {
            Some(audit) => {
                vramctl_agent::reclaim::reclaim(&mut self.sampler, request, audit).processes
            }
            // As in `terminate`: the engine never gets here without the audit log.
            None => Vec::new(),
        }
    }
}

/// How a report is printed.
struct Printer {
    json: bool,
    tz: TimeZone,
}

impl Printer {
    fn time(&self, t: i64, now: i64) -> String {
        clock(&self.tz, t, !same_day(&self.tz, t, now))
    }

    fn print(
        &self,
        out: &mut impl Write,
        engine: &Engine,
        audit: Option<&AuditLog>,
        report: &RoundReport,
    ) -> anyhow::Result<()> {
        emit(
            &mut *out,
            Format::from_json_flag(self.json, Format::JsonLine),
            || report,
            || Lines::Untrusted(self.human(engine, audit, report)),
        )?;
        out.flush().context("cannot write to stdout")
    }

    /// The plan, and with `--apply` what happened.
    fn human(&self, engine: &Engine, audit: Option<&AuditLog>, r: &RoundReport) -> Vec<String> {
        let now = r.now_unix_ms;
        let time = |t: i64| self.time(t, now);
        let mut lines = Vec::new();
        let round = if engine.live().is_some() {
            format!(" round {}", r.round)
        } else {
            String::new()
        };
        lines.push(format!(
            "reap{round} at {}{}",
            vramctl_core::wall_time::labelled(&self.tz, now),
            if r.dry_run { " (dry run)" } else { "" }
        ));
        for p in engine.policies() {
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
        let live = engine.live().map_or_else(
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
                lines.push(format!("    {}", gpu_line(g, &time)));
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
        if let Some(a) = audit {
            if r.audit_log.is_some() {
                lines.push(format!("audit log: {}", a.describe()));
            }
        }
        lines
    }
}

/// `GPU 0: 8.0 GiB, idle since 20:31:32 (2 min) by per-process SM activity [history]`.
fn gpu_line(g: &GpuJson, time: &dyn Fn(i64) -> String) -> String {
    let mut line = format!("GPU {}: {}", g.index, units::opt_bytes(g.used_bytes));
    if let (Some(since), Some(idle_s)) = (g.idle_since_ms, g.idle_s) {
        let by: Vec<&str> = g.evidence.iter().map(|e| e.describe()).collect();
        line.push_str(&format!(
            ", idle since {} ({}) by {}",
            time(since),
            human_duration(idle_s),
            by.join(", ")
        ));
    }
    if let Some(source) = g.source {
        line.push_str(&format!(" [{}]", source.as_str()));
    }
    line
}

fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}
