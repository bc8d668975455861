//! `vramctl kill PID...`: end processes on the verified path, then check through NVML that
//! their GPU memory was released, and say who still holds it when it was not.
//!
//! The signalling itself (refusals, pidfd, identity re-check, audit, escalation) is
//! `vramctl_core::signal`; `docs/kill.md` is the safety model. This command plans (who, with
//! which descendants, what is refused), asks, signals, then samples NVML until every device
//! shows the memory gone or `--timeout` passes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use vramctl_core::audit::AuditOutcome;
use vramctl_core::clock::{Clock, SystemClock};
use vramctl_core::procinfo::{self, ProcError, ProcReader};
use vramctl_core::signal::{
    self, Actor, AuditSink, Candidate, KillRequest, Provenance, Refusal, Target, TargetOutcome,
    TargetReport,
};
use vramctl_core::types::Snapshot;
use vramctl_core::{NvmlBackend, Sampler};

use super::ps::{GpuHolding, holdings, total_bytes};
use super::{GpuFilter, open_sampler};
use crate::cli::{GlobalArgs, KillArgs};
use crate::exit::Exit;
use crate::output::table::{Align, Table};
use crate::output::units;

/// Version of the JSON below; bumped on any incompatible change.
pub const SCHEMA: u32 = 1;

/// How often NVML is sampled while waiting for memory to be released.
const VERIFY_EVERY: Duration = Duration::from_millis(50);

/// A PID as typed: `1234` or `1234@START`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Named {
    pid: u32,
    start_time_ticks: Option<u64>,
}

fn parse_target(text: &str) -> anyhow::Result<Named> {
    let (pid, start) = match text.split_once('@') {
        Some((pid, start)) => (pid, Some(start)),
        None => (text, None),
    };
    let pid = pid.trim().parse::<u32>().ok();
    let start = start.map(|s| s.trim().parse::<u64>().ok());
    match (pid, start) {
        (Some(pid), None) => Ok(Named {
            pid,
            start_time_ticks: None,
        }),
        (Some(pid), Some(Some(start))) => Ok(Named {
            pid,
            start_time_ticks: Some(start),
        }),
        _ => bail!(
            "'{text}' is not a PID; use a number, or PID@START with the start time in clock \
             ticks as `vramctl ps --json` prints it"
        ),
    }
}

fn seconds(flag: &str, secs: f64) -> anyhow::Result<Duration> {
    if secs.is_finite() && (0.0..=86_400.0).contains(&secs) {
        Ok(Duration::from_secs_f64(secs))
    } else {
        bail!("{flag} '{secs}' is not a number of seconds between 0 and 86400")
    }
}

/// One line of the plan.
#[derive(Debug, Clone)]
struct PlanEntry {
    pid: u32,
    /// With --tree: the planned process it descends from.
    tree_parent: Option<u32>,
    verdict: Result<Candidate, Refusal>,
}

/// Who will be signalled: each named PID, then (with --tree) its descendants, each checked on
/// its own; duplicates dropped.
fn plan(named: &[Named], tree: bool, actor: &Actor, procs: &mut ProcReader) -> Vec<PlanEntry> {
    let mut entries: Vec<PlanEntry> = Vec::new();
    let mut seen = HashSet::new();
    for n in named {
        if !seen.insert(n.pid) {
            continue;
        }
        let verdict = signal::inspect(n.pid, actor, n.start_time_ticks, Provenance::Named, procs);
        let go = verdict.is_ok();
        entries.push(PlanEntry {
            pid: n.pid,
            tree_parent: None,
            verdict,
        });
        if tree && go {
            for (pid, parent) in procinfo::descendants(n.pid) {
                if !seen.insert(pid) {
                    continue;
                }
                let verdict = signal::inspect(pid, actor, None, Provenance::Descendant, procs);
                // A descendant that exited while we walked is not worth a line.
                if matches!(verdict, Err(Refusal::NotVisible { .. })) {
                    continue;
                }
                entries.push(PlanEntry {
                    pid,
                    tree_parent: Some(parent),
                    verdict,
                });
            }
        }
    }
    entries
}

/// The whole `kill --json` document.
#[derive(Debug, Serialize)]
struct KillReport {
    schema: u32,
    dry_run: bool,
    signal: &'static str,
    grace_s: f64,
    escalate: bool,
    targets: Vec<TargetJson>,
    devices: Vec<DeviceRelease>,
    still_held: Vec<StillHeld>,
    /// Wall-clock time of the first signal (RFC 3339 UTC, ms): where the `_after_s`
    /// durations start, to line them up with other tools' timelines.
    signalled_at: Option<String>,
    /// Where the audit records went (absent for a dry run or when nothing was sent).
    audit_log: Option<String>,
    /// Every target ended and its memory was released (exit code 0).
    ok: bool,
}

#[derive(Debug, Serialize)]
struct TargetJson {
    pid: u32,
    start_time_ticks: Option<u64>,
    user: Option<String>,
    command: Option<String>,
    tree_parent: Option<u32>,
    /// GPU memory NVML attributed to it before anything was sent.
    used_bytes: Option<u64>,
    gpus: Vec<GpuHolding>,
    /// `would_signal` (dry run), `not_confirmed`, `refused`, `exited`, `already_gone`,
    /// `still_running`, `audit_failed`, `signal_failed`.
    outcome: &'static str,
    /// The refusal or error, in words.
    detail: Option<String>,
    signals: Vec<String>,
    escalated: bool,
    exited_after_s: Option<f64>,
    /// Whether a pidfd pinned it (false: the re-check-then-kill fallback).
    pinned: Option<bool>,
    /// Something to know before ending it (a Jupyter kernel comes back).
    note: Option<String>,
}

/// One device's memory before and after.
#[derive(Debug, Clone, Serialize)]
struct DeviceRelease {
    index: u32,
    uuid: String,
    /// What NVML attributed to the ended targets before the signal.
    held_bytes: Option<u64>,
    used_before_bytes: Option<u64>,
    used_after_bytes: Option<u64>,
    /// `used_before - used_after` (0 if other processes grew meanwhile).
    freed_bytes: Option<u64>,
    released: bool,
    /// From the first signal to the sample that showed the memory gone.
    released_after_s: Option<f64>,
    /// The ended targets the driver listed on it before.
    pids: Vec<u32>,
    #[serde(skip)]
    unaccounted_before: Option<u64>,
    #[serde(skip)]
    still_listed: Vec<u32>,
    #[serde(skip)]
    unlisted_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
struct StillHeld {
    index: u32,
    uuid: String,
    /// Bytes still used that no listed process accounts for since the kill.
    unlisted_bytes: Option<u64>,
    holders: Vec<Holder>,
}

#[derive(Debug, Serialize)]
struct Holder {
    pid: u32,
    command: Option<String>,
    /// Why it still holds memory, in words.
    why: String,
}

/// Runs `kill`.
pub fn run(global: &GlobalArgs, args: &KillArgs) -> anyhow::Result<Exit> {
    let grace = seconds("--grace", args.grace)?;
    let timeout = seconds("--timeout", args.timeout)?;
    let named = args
        .targets
        .iter()
        .map(|t| parse_target(t))
        .collect::<anyhow::Result<Vec<Named>>>()?;
    let actor = Actor::current();
    let mut sampler = open_sampler(global)?;
    let before = sampler.tick();
    let held_before = holdings(&before, &GpuFilter::default());
    let mut procs = ProcReader::new();
    let entries = plan(&named, args.tree, &actor, &mut procs);
    // Descendants of the named targets, kept (even without --tree) to say who still holds
    // memory if some is left.
    let watch: Vec<(u32, u32)> = entries
        .iter()
        .filter(|e| e.tree_parent.is_none() && e.verdict.is_ok())
        .flat_map(|e| procinfo::descendants(e.pid))
        .collect();

    let mut out = std::io::stdout().lock();
    let mut report = KillReport {
        schema: SCHEMA,
        dry_run: args.dry_run,
        signal: args.signal.name(),
        grace_s: grace.as_secs_f64(),
        escalate: !args.no_escalate,
        targets: entries
            .iter()
            .map(|e| target_json(e, held_before.get(&e.pid), &mut procs))
            .collect(),
        devices: Vec::new(),
        still_held: Vec::new(),
        signalled_at: None,
        audit_log: None,
        ok: false,
    };
    let go: Vec<&PlanEntry> = entries.iter().filter(|e| e.verdict.is_ok()).collect();
    let refused = entries.len() - go.len();
    if !args.json {
        for line in render_plan(&report) {
            writeln!(out, "{line}").context("cannot write to stdout")?;
        }
        out.flush().context("cannot write to stdout")?;
    }
    if args.dry_run || go.is_empty() {
        if args.dry_run && !args.json {
            writeln!(out, "dry run: nothing was signalled").context("cannot write to stdout")?;
        }
        report.ok = refused == 0 && !go.is_empty();
        return finish(&mut out, args.json, &report);
    }
    if !args.yes && !confirm(go.len(), args, grace)? {
        for t in &mut report.targets {
            if t.outcome == "would_signal" {
                t.outcome = "not_confirmed";
            }
        }
        if !args.json {
            writeln!(out, "nothing was signalled").context("cannot write to stdout")?;
        }
        return finish(&mut out, args.json, &report);
    }

    let mut audit = crate::audit::open_sink(global)?;
    report.audit_log = Some(audit.path().display().to_string());
    let command_line = format!(
        "vramctl {}",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    let targets: Vec<Target> = go
        .iter()
        .filter_map(|e| {
            let candidate = e.verdict.as_ref().ok()?.clone();
            let reason = match e.tree_parent {
                None => command_line.clone(),
                Some(parent) => format!("descendant of PID {parent}: {command_line}"),
            };
            Some(Target { candidate, reason })
        })
        .collect();
    let request = KillRequest {
        signal: args.signal,
        grace,
        escalate: !args.no_escalate,
        ..KillRequest::new(targets, "kill")
    };
    let started = Instant::now();
    report.signalled_at = jiff::Timestamp::from_millisecond(SystemClock.now_unix_ms())
        .ok()
        .map(|t| format!("{t:.3}"));
    let outcomes = signal::execute(&request, &actor, &mut audit, &SystemClock);
    let by_pid: HashMap<u32, &TargetReport> = outcomes
        .iter()
        .map(|r| (r.candidate.identity.pid, r))
        .collect();
    for t in &mut report.targets {
        if let Some(r) = by_pid.get(&t.pid) {
            apply_outcome(t, r);
        }
    }

    let ended: HashSet<u32> = outcomes
        .iter()
        .filter(|r| {
            matches!(
                r.outcome,
                TargetOutcome::Exited { .. } | TargetOutcome::AlreadyGone
            )
        })
        .map(|r| r.candidate.identity.pid)
        .collect();
    report.devices = verify_release(&mut sampler, &before, &ended, started, timeout);
    record_memory_outcomes(&mut audit, &outcomes, &held_before, &report.devices);
    report.still_held = still_held(&report.devices, &watch, &mut procs);

    let all_ended = report
        .targets
        .iter()
        .all(|t| matches!(t.outcome, "exited" | "already_gone"));
    report.ok = all_ended && report.devices.iter().all(|d| d.released);
    if !args.json {
        for line in render_results(&report) {
            writeln!(out, "{line}").context("cannot write to stdout")?;
        }
    }
    finish(&mut out, args.json, &report)
}

fn finish(out: &mut impl Write, json: bool, report: &KillReport) -> anyhow::Result<Exit> {
    if json {
        serde_json::to_writer(&mut *out, report).context("cannot write JSON")?;
        writeln!(out).context("cannot write to stdout")?;
    }
    out.flush().context("cannot write to stdout")?;
    Ok(if report.ok {
        Exit::Ok
    } else {
        Exit::ConditionHolds
    })
}

/// Asks on the terminal; refuses to guess when stdin is not one.
fn confirm(count: usize, args: &KillArgs, grace: Duration) -> anyhow::Result<bool> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!(
            "refusing to signal without confirmation: stdin is not a terminal; pass --yes to \
             confirm (or --dry-run to look first)"
        );
    }
    let escalation = if args.no_escalate || args.signal == signal::Signal::Kill {
        String::new()
    } else {
        format!(
            ", SIGKILL after {} to those still running",
            units::seconds(grace.as_secs_f64())
        )
    };
    let mut err = std::io::stderr().lock();
    write!(
        err,
        "send {} to {count} {}{escalation}? [y/N] ",
        args.signal.name(),
        if count == 1 { "process" } else { "processes" }
    )
    .context("cannot write to stderr")?;
    err.flush().context("cannot write to stderr")?;
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .context("cannot read the answer")?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

fn target_json(
    entry: &PlanEntry,
    held: Option<&Vec<GpuHolding>>,
    procs: &mut ProcReader,
) -> TargetJson {
    let gpus = held.cloned().unwrap_or_default();
    let (start, user, command, outcome, detail) = match &entry.verdict {
        Ok(c) => (
            Some(c.identity.start_time_ticks),
            c.user.clone().or_else(|| Some(c.uid.to_string())),
            Some(c.command.clone()),
            "would_signal",
            None,
        ),
        Err(refusal) => {
            let details = procs.details(entry.pid).filter(|_| refusal.pid() > 1);
            (
                details.as_ref().and_then(|d| d.start_time_ticks),
                details.as_ref().and_then(|d| d.user.clone()),
                details.map(|d| d.command),
                "refused",
                Some(refusal.to_string()),
            )
        }
    };
    TargetJson {
        pid: entry.pid,
        start_time_ticks: start,
        user,
        tree_parent: entry.tree_parent,
        used_bytes: if gpus.is_empty() {
            Some(0)
        } else {
            total_bytes(&gpus)
        },
        gpus,
        outcome,
        detail,
        signals: Vec::new(),
        escalated: false,
        exited_after_s: None,
        pinned: None,
        note: jupyter_note(command.as_deref()),
        command,
    }
}

/// Jupyter restarts a kernel that dies of a signal (`autorestart`), memory and all.
fn jupyter_note(command: Option<&str>) -> Option<String> {
    command.filter(|c| c.contains("ipykernel")).map(|_| {
        "a Jupyter kernel: its server restarts a kernel ended by a signal; shut it down from \
         Jupyter (Kernel > Shut Down Kernel) or stop the server instead"
            .to_owned()
    })
}

fn apply_outcome(t: &mut TargetJson, r: &TargetReport) {
    t.signals = r
        .signals
        .iter()
        .map(|s| s.signal.name().to_owned())
        .collect();
    t.pinned = Some(r.pinned);
    let (outcome, detail) = match &r.outcome {
        TargetOutcome::Refused { refusal } => ("refused", Some(refusal.to_string())),
        TargetOutcome::AlreadyGone => ("already_gone", None),
        TargetOutcome::AuditFailed { error } => (
            "audit_failed",
            Some(format!(
                "not signalled: cannot write the audit record: {error}"
            )),
        ),
        TargetOutcome::SignalFailed { error } => ("signal_failed", Some(error.clone())),
        TargetOutcome::Exited { after, escalated } => {
            t.escalated = *escalated;
            t.exited_after_s = Some(after.as_secs_f64());
            ("exited", None)
        }
        TargetOutcome::StillRunning {
            escalated,
            state,
            note,
        } => {
            t.escalated = *escalated;
            let state = state.map_or_else(|| "unknown".into(), |s| s.to_string());
            let detail = match (escalated, note) {
                (_, Some(note)) => note.clone(),
                (true, None) if state == "D" => "survived SIGKILL in uninterruptible sleep \
                     (state D), usually inside the GPU driver; it ends when the driver call \
                     returns, or needs a GPU reset"
                    .to_owned(),
                (true, None) => format!("survived SIGKILL (state {state})"),
                (false, None) => format!("still running after the grace period (state {state})"),
            };
            ("still_running", Some(detail))
        }
        _ => ("signal_failed", Some("unknown outcome".into())),
    };
    t.outcome = outcome;
    t.detail = detail;
}

/// Samples NVML until no device lists an ended target and its memory did not move to "no
/// process" (a forked child still holding the descriptors), or `timeout` passes.
fn verify_release(
    sampler: &mut Sampler<NvmlBackend>,
    before: &Snapshot,
    ended: &HashSet<u32>,
    started: Instant,
    timeout: Duration,
) -> Vec<DeviceRelease> {
    let mut devices: Vec<DeviceRelease> = before
        .devices
        .iter()
        .filter_map(|d| {
            let reading = d.reading()?;
            let mine: Vec<_> = reading
                .processes
                .as_ref()?
                .iter()
                .filter(|p| ended.contains(&p.pid))
                .collect();
            if mine.is_empty() {
                return None;
            }
            let held = mine
                .iter()
                .try_fold(0_u64, |sum, p| Some(sum.saturating_add(p.used_bytes?)));
            Some(DeviceRelease {
                index: d.info.index,
                uuid: d.info.uuid.clone(),
                held_bytes: held,
                used_before_bytes: reading.memory.map(|m| m.used_bytes),
                used_after_bytes: None,
                freed_bytes: None,
                released: false,
                released_after_s: None,
                pids: mine.iter().map(|p| p.pid).collect(),
                unaccounted_before: reading.unaccounted_bytes(),
                still_listed: Vec::new(),
                unlisted_bytes: None,
            })
        })
        .collect();
    let deadline = Instant::now() + timeout;
    while devices.iter().any(|d| !d.released) {
        let at = started.elapsed();
        let snapshot = sampler.tick();
        for device in devices.iter_mut().filter(|d| !d.released) {
            let Some(reading) = snapshot
                .devices
                .iter()
                .find(|d| d.info.uuid == device.uuid)
                .and_then(|d| d.reading())
            else {
                continue;
            };
            let Some(processes) = reading.processes.as_ref() else {
                continue;
            };
            device.still_listed = processes
                .iter()
                .filter(|p| ended.contains(&p.pid))
                .map(|p| p.pid)
                .collect();
            device.used_after_bytes = reading.memory.map(|m| m.used_bytes);
            device.freed_bytes = device
                .used_before_bytes
                .zip(device.used_after_bytes)
                .map(|(b, a)| b.saturating_sub(a));
            let grew = reading
                .unaccounted_bytes()
                .zip(device.unaccounted_before)
                .map(|(now, then)| now.saturating_sub(then));
            // Memory that left the list but stays used: half of what the targets held
            // moving to "no process" is not noise.
            let moved = grew
                .zip(device.held_bytes)
                .is_some_and(|(grew, held)| held > 0 && grew >= held / 2);
            device.unlisted_bytes = grew.filter(|_| moved);
            if device.still_listed.is_empty() && !moved {
                device.released = true;
                device.released_after_s = Some(at.as_secs_f64());
            }
        }
        if devices.iter().all(|d| d.released) || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(VERIFY_EVERY);
    }
    devices
}

/// Sets each exited target's audit outcome: the memory it held on devices that released it.
fn record_memory_outcomes(
    audit: &mut dyn AuditSink,
    outcomes: &[TargetReport],
    held_before: &BTreeMap<u32, Vec<GpuHolding>>,
    devices: &[DeviceRelease],
) {
    for r in outcomes {
        let (Some(id), TargetOutcome::Exited { after, .. }) = (r.last_audit_id(), &r.outcome)
        else {
            continue;
        };
        let pid = r.candidate.identity.pid;
        let mut freed: u64 = 0;
        let mut after_s = after.as_secs_f64();
        for h in held_before.get(&pid).into_iter().flatten() {
            if let Some(d) = devices.iter().find(|d| d.uuid == h.uuid && d.released) {
                freed = freed.saturating_add(h.used_bytes.unwrap_or(0));
                after_s = after_s.max(d.released_after_s.unwrap_or(0.0));
            }
        }
        // Millisecond resolution is what the record keeps.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let after_ms = (after_s * 1000.0).round() as u64;
        let outcome = AuditOutcome::Exited {
            freed_bytes: freed,
            after_ms,
        };
        if let Err(err) = audit.after(id, &outcome) {
            tracing::warn!(error = %err, pid, "Could not record the outcome of a kill.");
        }
    }
}

/// For each device that still holds memory: which ended targets the driver still lists and
/// why, and which survivors may hold the rest.
fn still_held(
    devices: &[DeviceRelease],
    watch: &[(u32, u32)],
    procs: &mut ProcReader,
) -> Vec<StillHeld> {
    let mut out = Vec::new();
    for d in devices.iter().filter(|d| !d.released) {
        let mut holders = Vec::new();
        for pid in &d.still_listed {
            holders.push(Holder {
                pid: *pid,
                command: procs.details(*pid).map(|p| p.command),
                why: why_listed(*pid),
            });
        }
        // Survivors are worth naming either way: a dead PID the driver still lists is
        // often kept by a child that inherited its descriptors.
        holders.extend(survivors(watch, procs));
        out.push(StillHeld {
            index: d.index,
            uuid: d.uuid.clone(),
            unlisted_bytes: d.unlisted_bytes,
            holders,
        });
    }
    out
}

fn why_listed(pid: u32) -> String {
    match procinfo::read_stat(pid) {
        Err(ProcError::NotFound { .. }) => "it has exited, but the driver still lists it: a \
             process that inherited its /dev/nvidia* descriptors keeps its context, or the \
             context leaked in the driver (a GPU reset or reboot frees that)"
            .into(),
        Err(e) => format!("cannot read its state: {e}"),
        Ok(s) if s.is_zombie() => format!(
            "a zombie the driver still lists; its parent (PID {}) must reap it",
            s.ppid
        ),
        Ok(s) if s.state == 'D' => "in uninterruptible sleep (state D), usually inside the GPU \
             driver"
            .into(),
        Ok(s) => format!("still running (state {})", s.state),
    }
}

/// Descendants of the targets that are still alive, marked by whether they hold
/// `/dev/nvidia*`; without any, every process here that holds `/dev/nvidia*`.
fn survivors(watch: &[(u32, u32)], procs: &mut ProcReader) -> Vec<Holder> {
    let mut out = Vec::new();
    for (pid, parent) in watch {
        let Ok(stat) = procinfo::read_stat(*pid) else {
            continue;
        };
        let files = procinfo::gpu_device_files(*pid);
        let holds = match &files {
            Ok(files) if !files.is_empty() => format!("with {} open", files.join(", ")),
            Ok(_) => "with no /dev/nvidia* open".to_owned(),
            Err(_) => "(its descriptors cannot be read)".to_owned(),
        };
        let what = if stat.is_zombie() {
            "a zombie"
        } else {
            "still running"
        };
        out.push(Holder {
            pid: *pid,
            command: procs.details(*pid).map(|p| p.command),
            why: format!("a descendant of PID {parent}, {what} {holds}"),
        });
    }
    if out.is_empty() {
        for (pid, files) in procinfo::holders_of(procinfo::GPU_DEVICE_PREFIX)
            .into_iter()
            .take(10)
        {
            out.push(Holder {
                pid,
                command: procs.details(pid).map(|p| p.command),
                why: format!("has {} open", files.join(", ")),
            });
        }
    }
    out
}

fn render_plan(report: &KillReport) -> Vec<String> {
    let mut table = Table::new(&[
        ("PID", Align::Right),
        ("USER", Align::Left),
        ("GPU", Align::Left),
        ("MEMORY", Align::Right),
        ("COMMAND", Align::Left),
    ]);
    let mut refusals = Vec::new();
    for t in &report.targets {
        if t.outcome == "refused" {
            refusals.push(format!(
                "refused: {}",
                t.detail.as_deref().unwrap_or("no reason given")
            ));
            continue;
        }
        let gpus: Vec<String> = t.gpus.iter().map(|g| g.index.to_string()).collect();
        let prefix = match depth(report, t) {
            0 => String::new(),
            d => format!("{}└─ ", "   ".repeat(d - 1)),
        };
        table.push(vec![
            t.pid.to_string(),
            t.user.clone().unwrap_or_else(|| "?".into()),
            if gpus.is_empty() {
                "-".into()
            } else {
                gpus.join(",")
            },
            if t.gpus.is_empty() {
                "-".into()
            } else {
                units::opt_bytes(t.used_bytes)
            },
            format!("{prefix}{}", t.command.as_deref().unwrap_or("?")),
        ]);
    }
    let mut lines = Vec::new();
    if report.targets.iter().any(|t| t.outcome != "refused") {
        lines.extend(table.render(""));
    }
    lines.extend(refusals);
    for t in &report.targets {
        if let Some(note) = &t.note {
            lines.push(format!("note: PID {} is {note}", t.pid));
        }
    }
    lines
}

/// How many planned ancestors `t` has (its indentation under --tree).
fn depth(report: &KillReport, t: &TargetJson) -> usize {
    let mut depth = 0;
    let mut parent = t.tree_parent;
    while let Some(pid) = parent.filter(|_| depth < report.targets.len()) {
        depth += 1;
        parent = report
            .targets
            .iter()
            .find(|x| x.pid == pid)
            .and_then(|x| x.tree_parent);
    }
    depth
}

fn render_results(report: &KillReport) -> Vec<String> {
    let mut lines = Vec::new();
    for t in &report.targets {
        let line = match t.outcome {
            "exited" => {
                let by = t.signals.last().map_or("?", String::as_str);
                let mut line = format!(
                    "PID {}: ended by {by} after {}",
                    t.pid,
                    units::seconds(t.exited_after_s.unwrap_or(0.0))
                );
                if t.escalated {
                    line.push_str(&format!(
                        " (still running {} after {})",
                        units::seconds(report.grace_s),
                        t.signals.first().map_or("?", String::as_str)
                    ));
                }
                line
            }
            "already_gone" => format!("PID {}: had already exited", t.pid),
            "refused" if t.signals.is_empty() && t.pinned.is_some() => format!(
                "PID {}: refused at signal time: {}",
                t.pid,
                t.detail.as_deref().unwrap_or("?")
            ),
            "refused" => continue,
            _ => format!(
                "PID {}: {}: {}",
                t.pid,
                t.outcome.replace('_', " "),
                t.detail.as_deref().unwrap_or("?")
            ),
        };
        lines.push(line);
    }
    for d in &report.devices {
        let held = units::opt_bytes(d.held_bytes);
        let used = match (d.used_before_bytes, d.used_after_bytes) {
            (Some(b), Some(a)) => format!("; used {} → {}", units::bytes(b), units::bytes(a)),
            _ => String::new(),
        };
        if d.released {
            lines.push(format!(
                "GPU {}: {held} released after {} (freed {}{used})",
                d.index,
                units::seconds(d.released_after_s.unwrap_or(0.0)),
                units::opt_bytes(d.freed_bytes),
            ));
        } else {
            lines.push(format!(
                "GPU {}: {held} NOT released within the timeout{used}",
                d.index
            ));
        }
    }
    for s in &report.still_held {
        if let Some(bytes) = s.unlisted_bytes {
            lines.push(format!(
                "GPU {}: {} moved to no listed process: something still holds the targets' \
                 descriptors",
                s.index,
                units::bytes(bytes)
            ));
        }
        if s.holders.is_empty() {
            lines.push(format!(
                "GPU {}: no process visible here holds /dev/nvidia*; the memory may belong to \
                 another PID namespace or be leaked in the driver",
                s.index
            ));
        }
        for h in &s.holders {
            lines.push(format!(
                "GPU {}: still held: PID {} ({}): {}",
                s.index,
                h.pid,
                h.command.as_deref().unwrap_or("?"),
                h.why
            ));
        }
    }
    if let Some(path) = &report.audit_log {
        lines.push(format!("audit log: {path}"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_as_pid_or_pid_at_start() {
        assert_eq!(
            parse_target("1234").unwrap(),
            Named {
                pid: 1234,
                start_time_ticks: None
            }
        );
        assert_eq!(
            parse_target("1234@98765").unwrap(),
            Named {
                pid: 1234,
                start_time_ticks: Some(98765)
            }
        );
        assert_eq!(parse_target("4294967295").unwrap().pid, u32::MAX);
        for bad in ["", "abc", "-1", "4294967296", "12@", "12@x", "@5", "1.5"] {
            let err = parse_target(bad).unwrap_err().to_string();
            assert!(err.starts_with(&format!("'{bad}' is not a PID")), "{err}");
        }
    }

    #[test]
    fn durations_are_checked() {
        assert_eq!(seconds("--grace", 0.5).unwrap(), Duration::from_millis(500));
        assert!(seconds("--grace", -1.0).is_err());
        assert!(seconds("--grace", f64::NAN).is_err());
        let err = seconds("--timeout", 1e9).unwrap_err().to_string();
        assert!(err.starts_with("--timeout '1000000000'"), "{err}");
    }
}
