//! `vramctl kill PID...`: end processes on the verified path, then check through NVML that
//! their GPU memory was released, and say who still holds it when it was not.
//!
//! The signalling itself (refusals, pidfd, identity re-check, audit, escalation) is
//! `vramctl_procs::signal`; `docs/kill.md` is the safety model. This command plans (who, with
//! which descendants, what is refused), asks, signals, then samples NVML until every device
//! shows the memory gone or `--timeout` passes.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use vramctl_core::clock::{Clock, SystemClock};
use vramctl_core::untrusted::Untrusted;
use vramctl_procs::procinfo::{self, ProcReader};
use vramctl_procs::signal::{
    self, Actor, Candidate, KillRequest, Provenance, Refusal, Target, TargetReport,
};
use vramctl_store::format::rfc3339;

use super::open_sampler;
use crate::audit_sink::open_sink;
use crate::cli::{GlobalArgs, KillArgs};
use crate::exit::Exit;
use crate::output::table::{Align, Table};
use vramctl_free::memory_release::{
    DeviceRelease, Outcome, StillHeld, ended_pids, jupyter_note, record_memory_outcomes,
    release_lines, still_held, verify_release,
};
use vramctl_free::owner_targets::select_targets;
use vramctl_observe::gpu_holdings::{GpuHolding, holdings, total_bytes};
use vramctl_observe::gpu_selection::GpuFilter;
use vramctl_observe::owners::OwnerSelector;
use vramctl_observe::units;

/// Version of the JSON below; bumped on any incompatible change.
pub const SCHEMA: u32 = 1;

/// A PID as typed: `1234`, `1234@START` or `1234@START:ID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Named {
    pid: u32,
    start_time_ticks: Option<u64>,
    /// The pidfs id (`ps --json`'s `pidfd_id`): finer than the start time, which is in
    /// clock ticks (10 ms) and so the same for two processes started within one tick.
    pidfd_id: Option<u64>,
}

fn parse_target(text: &str) -> anyhow::Result<Named> {
    let (pid, start) = match text.split_once('@') {
        Some((pid, start)) => (pid, Some(start)),
        None => (text, None),
    };
    let (start, id) = match start.map(|s| s.split_once(':')) {
        Some(Some((start, id))) => (Some(start), Some(id)),
        Some(None) => (start, None),
        None => (None, None),
    };
    let pid = pid.trim().parse::<u32>().ok();
    let start = start.map(|s| s.trim().parse::<u64>().ok());
    let id = id.map(|s| s.trim().parse::<u64>().ok());
    match (pid, start, id) {
        (Some(pid), None, None) => Ok(Named {
            pid,
            start_time_ticks: None,
            pidfd_id: None,
        }),
        (Some(pid), Some(Some(start)), None) => Ok(Named {
            pid,
            start_time_ticks: Some(start),
            pidfd_id: None,
        }),
        (Some(pid), Some(Some(start)), Some(Some(id))) => Ok(Named {
            pid,
            start_time_ticks: Some(start),
            pidfd_id: Some(id),
        }),
        _ => bail!(
            "'{text}' is not a PID; use a number, or PID@START (or PID@START:ID) with the start \
             time in clock ticks and the pidfd id as `vramctl ps --json` prints them"
        ),
    }
}

/// `PID@START:ID`: the process must be the one with that pidfs id. A kernel without pidfs
/// (before 6.9) cannot tell, and an identity it cannot check is not taken as matching.
fn check_pidfd_id(
    verdict: Result<Candidate, Refusal>,
    want: Option<u64>,
) -> Result<Candidate, Refusal> {
    let candidate = verdict?;
    let Some(want) = want else {
        return Ok(candidate);
    };
    let pid = candidate.identity.pid;
    match candidate.pidfd_id {
        Some(got) if got == want => Ok(candidate),
        Some(got) => Err(Refusal::IdentityMismatch {
            pid,
            detail: format!("pidfd id {got}, not {want}"),
        }),
        None => Err(Refusal::IdentityMismatch {
            pid,
            detail: format!("pidfd id {want} given, and this kernel has no pidfd ids to check it"),
        }),
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
        let verdict = check_pidfd_id(
            signal::inspect(n.pid, actor, n.start_time_ticks, Provenance::Named, procs),
            n.pidfd_id,
        );
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

/// Refuses each named target for which NVML lists no GPU memory — with `--tree`, none for
/// it and none for any of its planned descendants (a launcher whose workers hold the
/// memory) — and drops the descendants planned under a target so refused.
fn refuse_without_gpu_memory(
    entries: &mut Vec<PlanEntry>,
    held: &std::collections::BTreeMap<u32, Vec<GpuHolding>>,
) {
    let holds = |pid: u32| held.get(&pid).is_some_and(|g| !g.is_empty());
    // `plan` lists each named target followed by its descendants.
    let mut refused_roots = HashSet::new();
    let mut i = 0;
    while i < entries.len() {
        let end = entries[i + 1..]
            .iter()
            .position(|e| e.tree_parent.is_none())
            .map_or(entries.len(), |n| i + 1 + n);
        let group_holds = entries[i..end].iter().any(|e| holds(e.pid));
        if entries[i].verdict.is_ok() && !group_holds {
            let pid = entries[i].pid;
            entries[i].verdict = Err(Refusal::NoGpuMemory { pid });
            refused_roots.insert(i);
        }
        i = end;
    }
    let mut index = 0;
    let mut in_refused = false;
    entries.retain(|e| {
        if e.tree_parent.is_none() {
            in_refused = refused_roots.contains(&index);
        }
        index += 1;
        e.tree_parent.is_none() || !in_refused
    });
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

/// Runs `kill`.
pub fn run(global: &GlobalArgs, args: &KillArgs) -> anyhow::Result<Exit> {
    let (grace, timeout) = (args.grace, args.timeout);
    let mut named = args
        .targets
        .iter()
        .map(|t| parse_target(t))
        .collect::<anyhow::Result<Vec<Named>>>()?;
    let actor = Actor::current();
    let mut sampler = open_sampler(global)?;
    let selectors = args.owners.selectors();
    if !selectors.is_empty() {
        // Each selected process as a named PID pinned to the start time it was observed
        // with: the plan below refuses it if the PID has passed to another process since.
        let selected = select_targets(sampler.tick(), &selectors);
        if selected.is_empty() {
            let flags: Vec<String> = selectors.iter().map(OwnerSelector::describe).collect();
            eprintln!(
                "vramctl: no GPU process visible here is selected by {}",
                Untrusted(&flags.join(" "))
            );
        }
        for target in selected {
            if !named.iter().any(|n| n.pid == target.pid) {
                named.push(Named {
                    pid: target.pid,
                    start_time_ticks: target.start_time_ticks,
                    pidfd_id: None,
                });
            }
        }
    }
    let mut procs = ProcReader::new();
    // Who each target is, first; NVML's sample after. A target whose identity is unchanged
    // when it is pinned (`signal::execute`) was that process all along, so what the sample
    // says about its PID is about it. Sampled first, the PID could have passed from the
    // GPU user to a bystander between the two, and the bystander would look like a holder.
    let mut entries = plan(&named, args.tree, &actor, &mut procs);
    let before = sampler.tick();
    let held_before = holdings(&before, &GpuFilter::default());
    if !args.force {
        refuse_without_gpu_memory(&mut entries, &held_before);
    }
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
    if !args.print.json {
        for line in render_plan(&report) {
            writeln!(out, "{}", Untrusted(&line)).context("cannot write to stdout")?;
        }
        out.flush().context("cannot write to stdout")?;
    }
    if args.dry_run || go.is_empty() {
        if args.dry_run && !args.print.json {
            writeln!(out, "dry run: nothing was signalled").context("cannot write to stdout")?;
        }
        report.ok = refused == 0 && !go.is_empty();
        return finish(&mut out, args.print.json, &report);
    }
    if !args.yes && !confirm(go.len(), args, grace)? {
        for t in &mut report.targets {
            if t.outcome == "would_signal" {
                t.outcome = "not_confirmed";
            }
        }
        if !args.print.json {
            writeln!(out, "nothing was signalled").context("cannot write to stdout")?;
        }
        return finish(&mut out, args.print.json, &report);
    }

    let mut audit = open_sink(global)?;
    report.audit_log = audit.location();
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
    report.signalled_at = Some(rfc3339(SystemClock.now_unix_ms()));
    let outcomes = signal::execute(&request, &actor, audit.as_mut(), &SystemClock);
    let by_pid: HashMap<u32, &TargetReport> = outcomes
        .iter()
        .map(|r| (r.candidate.identity.pid, r))
        .collect();
    for t in &mut report.targets {
        if let Some(r) = by_pid.get(&t.pid) {
            apply_outcome(t, r);
        }
    }

    let ended = ended_pids(&outcomes);
    report.devices = verify_release(&mut sampler, &before, &ended, started, timeout);
    record_memory_outcomes(audit.as_mut(), &outcomes, &held_before, &report.devices);
    report.still_held = still_held(&report.devices, &watch, &mut procs);

    let all_ended = report
        .targets
        .iter()
        .all(|t| matches!(t.outcome, "exited" | "already_gone"));
    report.ok = all_ended && report.devices.iter().all(|d| d.released);
    if !args.print.json {
        for line in render_results(&report) {
            writeln!(out, "{}", Untrusted(&line)).context("cannot write to stdout")?;
        }
    }
    finish(&mut out, args.print.json, &report)
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
    // One write: stderr is unbuffered, so a formatted write reaches the terminal piece by
    // piece, and a reader (a person or a script watching the screen) could see half a question.
    let question = format!(
        "send {} to {count} {}{escalation}? [y/N] ",
        args.signal.name(),
        if count == 1 { "process" } else { "processes" }
    );
    let mut err = std::io::stderr().lock();
    err.write_all(question.as_bytes())
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

fn apply_outcome(t: &mut TargetJson, r: &TargetReport) {
    let o = Outcome::of(r);
    t.signals = o.signals;
    t.pinned = Some(o.pinned);
    t.escalated = o.escalated;
    t.exited_after_s = o.exited_after_s;
    t.outcome = o.outcome;
    t.detail = o.detail;
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
                Untrusted(t.detail.as_deref().unwrap_or("no reason given"))
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
                Untrusted(t.detail.as_deref().unwrap_or("?"))
            ),
            "refused" => continue,
            _ => format!(
                "PID {}: {}: {}",
                t.pid,
                t.outcome.replace('_', " "),
                Untrusted(t.detail.as_deref().unwrap_or("?"))
            ),
        };
        lines.push(line);
    }
    lines.extend(release_lines(&report.devices, &report.still_held));
    if let Some(path) = &report.audit_log {
        lines.push(format!("audit log: {path} (table audit)"));
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
                start_time_ticks: None,
                pidfd_id: None,
            }
        );
        assert_eq!(
            parse_target("1234@98765").unwrap(),
            Named {
                pid: 1234,
                start_time_ticks: Some(98765),
                pidfd_id: None,
            }
        );
        assert_eq!(
            parse_target("1234@98765:4567").unwrap(),
            Named {
                pid: 1234,
                start_time_ticks: Some(98765),
                pidfd_id: Some(4567),
            }
        );
        assert_eq!(parse_target("4294967295").unwrap().pid, u32::MAX);
        for bad in [
            "",
            "abc",
            "-1",
            "4294967296",
            "12@",
            "12@x",
            "@5",
            "1.5",
            "12@5:",
            "12@5:x",
            "12@:5",
            "12:5",
        ] {
            let err = parse_target(bad).unwrap_err().to_string();
            assert!(err.starts_with(&format!("'{bad}' is not a PID")), "{err}");
        }
    }
}
