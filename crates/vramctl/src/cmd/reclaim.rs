//! `vramctl reclaim`: a thin shell over `vramctl_agent::reclaim` (the agents' client, NVML
//! before and after, the audit): flags in, the report out as text or JSON, the exit code.

use std::io::Write;

use anyhow::Context;
use serde::Serialize;
use vramctl_agent::agent_client::{ReclaimOptions, Timeouts};
use vramctl_agent::reclaim::{self, ProcessReclaim, ReclaimReport, ReclaimRequest, Selection};
use vramctl_procs::signal::{AuditSink, MemoryAuditLog};

use super::open_sampler;
use crate::audit_sink::open_sink;
use crate::cli::{GlobalArgs, ReclaimArgs};
use crate::exit::Exit;
use crate::output::emit::{Format, Lines, emit};
use vramctl_observe::units;

/// Version of the JSON below (docs/json.md).
const SCHEMA: u32 = 1;

#[derive(Serialize)]
struct Document<'a> {
    schema: u32,
    #[serde(flatten)]
    report: &'a ReclaimReport,
    /// Where the audit records went (`None`: a dry run writes none).
    audit_log: Option<String>,
    ok: bool,
}

/// Runs `vramctl reclaim`.
///
/// # Errors
/// NVML not loadable, the audit log not writable (nothing is reclaimed without it), stdout
/// closed.
pub fn run(global: &GlobalArgs, args: &ReclaimArgs) -> anyhow::Result<Exit> {
    let mut sampler = open_sampler(global)?;
    // A dry run changes nothing and writes no audit record, as kill's.
    let mut sink: Box<dyn AuditSink> = if args.dry_run {
        Box::new(MemoryAuditLog::default())
    } else {
        open_sink(global)?
    };
    let audit_log = (!args.dry_run).then(|| sink.location()).flatten();
    let request = ReclaimRequest {
        selection: if args.all {
            Selection::All
        } else if args.attach {
            Selection::Attach(args.pids.clone())
        } else {
            Selection::Pids(args.pids.clone())
        },
        options: ReclaimOptions {
            gc: args.gc,
            deep: args.deep,
            dry_run: args.dry_run,
        },
        timeouts: Timeouts {
            reclaim: args.timeout,
            ..Timeouts::default()
        },
        reason: format!(
            "vramctl {}",
            std::env::args().skip(1).collect::<Vec<_>>().join(" ")
        ),
    };
    let report = reclaim::reclaim(&mut sampler, &request, sink.as_mut());
    let ok = report.reclaimed_anything();
    let mut out = std::io::stdout().lock();
    let io = "cannot write to stdout";
    emit(
        &mut out,
        args.print.format(Format::JsonLine),
        || Document {
            schema: SCHEMA,
            report: &report,
            audit_log,
            ok,
        },
        || Lines::Untrusted(render(&report, args.all)),
    )?;
    out.flush().context(io)?;
    Ok(if ok { Exit::Ok } else { Exit::ConditionHolds })
}

/// The report for people: a block per process, then the total.
fn render(report: &ReclaimReport, all: bool) -> Vec<String> {
    let mut lines = Vec::new();
    let shown: Vec<&ProcessReclaim> = report
        .processes
        .iter()
        // With --all, processes without an agent (or not visible in this PID namespace) are
        // counted, not listed one by one.
        .filter(|p| !(all && matches!(p.status, "no_agent" | "no_process")))
        .collect();
    for p in &shown {
        lines.extend(render_process(p, report.dry_run));
    }
    let without = report.processes.len() - shown.len();
    if without > 0 {
        lines.push(format!(
            "{without} GPU process{} without an agent (or not visible here) left alone",
            if without == 1 { "" } else { "es" }
        ));
    }
    if report.processes.is_empty() {
        lines.push("no GPU process found".to_owned());
    }
    let verb = if report.dry_run {
        "would release"
    } else {
        "released"
    };
    let nvml = match report.nvml_returned_bytes {
        _ if report.dry_run => String::new(),
        Some(n) => format!("; NVML shows {} returned", units::returned_bytes(n)),
        None => "; NVML lists none of these processes".to_owned(),
    };
    lines.push(format!(
        "total: the frameworks {verb} {}{nvml}",
        units::bytes(report.released_bytes)
    ));
    if report.dry_run {
        lines.push("dry run: nothing was released".to_owned());
    }
    lines
}

fn render_process(p: &ProcessReclaim, dry_run: bool) -> Vec<String> {
    let mut lines = Vec::new();
    let who = match (&p.command, &p.user) {
        (Some(c), Some(u)) => format!(" {} ({u})", vramctl_core::command_line::abbreviate(c, 60)),
        (Some(c), None) => format!(" {}", vramctl_core::command_line::abbreviate(c, 60)),
        _ => String::new(),
    };
    lines.push(format!("PID {}{who}", p.pid));
    if let Some(err) = &p.error {
        lines.push(format!("  {}: {}", p.status.replace('_', " "), err.message));
        return lines;
    }
    let Some(a) = &p.agent else {
        return lines;
    };
    let verb = if dry_run { "would release" } else { "released" };
    lines.push(format!(
        "  the framework {verb} {} of {} cached ({}{})",
        units::bytes(a.released_bytes),
        units::bytes(a.cached_before_bytes),
        outcome_words(a, dry_run),
        a.empty_cache_s
            .map(|s| format!(", empty_cache {}", units::seconds(s)))
            .unwrap_or_default()
    ));
    if !dry_run {
        lines.push(match (p.nvml_before_bytes, p.nvml_after_bytes) {
            (Some(b), Some(after)) => format!(
                "  NVML: {} -> {} ({} returned; the CUDA context and live tensors stay)",
                units::bytes(b),
                units::bytes(after),
                units::returned_bytes(p.nvml_returned_bytes.unwrap_or(0))
            ),
            _ => "  NVML: the process is not listed on any GPU (or its memory is not reported)"
                .to_owned(),
        });
    }
    lines.extend(render_deep(a));
    for u in &a.unsupported {
        lines.push(format!("  {}: {}", u.framework, u.reason));
    }
    let segments: Vec<_> = a
        .devices
        .iter()
        .flat_map(|d| d.pinned_segments.iter().map(move |s| (d.index, s)))
        .collect();
    if a.pinned_bytes > 0 {
        lines.push(format!(
            "  {} stays cached in {} segment{} pinned by live tensors:",
            units::bytes(a.pinned_bytes),
            segments.len(),
            if segments.len() == 1 { "" } else { "s" }
        ));
        for (device, s) in &segments {
            let why = if s.reason == "private_pool" {
                " (a CUDA graph's or MemPool's private pool)".to_owned()
            } else {
                String::new()
            };
            lines.push(format!(
                "    cuda:{device} segment {} at {:#x}: {} live in {} block{}{why}, {} free",
                units::bytes(s.total_bytes),
                s.address,
                units::bytes(s.live_bytes),
                s.live_blocks,
                if s.live_blocks == 1 { "" } else { "s" },
                units::bytes(s.free_bytes),
            ));
            for b in &s.blocks {
                let place = vramctl_agent::agent_client::allocation_site(&b.frames).map_or_else(
                    || "allocation stack not recorded".to_owned(),
                    |f| match f.line {
                        Some(line) => format!("allocated in {} at {}:{line}", f.name, f.filename),
                        None => format!("allocated in {} in {}", f.name, f.filename),
                    },
                );
                lines.push(format!(
                    "      block {} at {:#x}: {place}",
                    units::bytes(b.size_bytes),
                    b.address
                ));
            }
        }
        if segments.iter().any(|(_, s)| !s.stacks_recorded) {
            lines.push(format!(
                "  to see which line allocated them, record allocation history first: python3 -m \
                 vramctl_agent.client {} snapshot --record start",
                p.pid
            ));
        }
        lines.push(
            "  free those tensors, or run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so \
             a small tensor no longer pins a whole segment"
                .to_owned(),
        );
    }
    lines
}

/// The agent's outcome in words. A dry run releases nothing, whatever the agent's outcome
/// names (it sums what `empty_cache` would return as if released): what would happen.
fn outcome_words(a: &vramctl_agent::agent_client::ReclaimAnswer, dry_run: bool) -> String {
    if !dry_run {
        return a.outcome.replace('_', " ");
    }
    match a.outcome.as_str() {
        "nothing_cached" => "nothing cached".to_owned(),
        "no_gpu_allocator" => "no GPU allocator".to_owned(),
        _ if a.released_bytes == 0 => "nothing would be released".to_owned(),
        _ if a.released_bytes >= a.cached_before_bytes => "all of it would be released".to_owned(),
        _ => format!(
            "{} would stay cached",
            units::bytes(a.cached_before_bytes.saturating_sub(a.released_bytes))
        ),
    }
}

/// What `--deep` dropped from the shell, and what `gc.collect()` found after it.
fn render_deep(a: &vramctl_agent::agent_client::ReclaimAnswer) -> Vec<String> {
    let Some(deep) = &a.deep else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    if deep.dropped.is_empty() {
        lines.push(format!(
            "  deep: nothing to drop ({})",
            if deep.in_ipython {
                "no last exception, empty output cache"
            } else {
                "no IPython shell, no last exception"
            }
        ));
    }
    for d in &deep.dropped {
        let names = if d.names.is_empty() {
            String::new()
        } else {
            format!(" [{}]", d.names.join(", "))
        };
        if let Some(error) = &d.error {
            lines.push(format!(
                "  deep: could not drop the {}: {error}",
                d.what.replace('_', " ")
            ));
            continue;
        }
        lines.push(match d.what.as_str() {
            "last_exception" => format!(
                "  deep: dropped the last exception ({}): {} frame{} cleared, {} tensor{}{}{names}",
                d.detail.as_deref().unwrap_or("unknown"),
                d.frames_cleared.unwrap_or(0),
                if d.frames_cleared == Some(1) { "" } else { "s" },
                d.tensors.unwrap_or(0),
                if d.tensors == Some(1) { "" } else { "s" },
                d.tensor_bytes
                    .filter(|b| *b > 0)
                    .map(|b| format!(" ({} on the GPU)", units::bytes(b)))
                    .unwrap_or_default(),
            ),
            "output_cache" => format!(
                "  deep: dropped the output cache: {} entr{}{names}",
                d.entries.unwrap_or(0),
                if d.entries == Some(1) { "y" } else { "ies" },
            ),
            other => format!("  deep: dropped {other}{names}"),
        });
    }
    if let Some(gc) = &a.gc {
        lines.push(format!(
            "  gc.collect() found {} unreachable object{} ({})",
            gc.collected,
            if gc.collected == 1 { "" } else { "s" },
            units::seconds(gc.duration_s)
        ));
    }
    lines
}
