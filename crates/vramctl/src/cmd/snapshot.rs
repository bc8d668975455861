//! `vramctl snapshot`: with FILE, a thin shell over `vramctl_snapshot` (read, summarize,
//! print); with --pid, over `vramctl_agent::allocator_snapshot` (checks of the path, the
//! agent's `snapshot`): flags in, where the file is and its size out, the exit code.

use std::io::Write;

use anyhow::Context;
use serde::Serialize;
use vramctl_agent::agent_client::HistoryRecord;
use vramctl_agent::allocator_snapshot::{self, SnapshotReport, SnapshotRequest};
use vramctl_core::untrusted::Untrusted;

use crate::cli::{RecordAction, SnapshotAction, SnapshotArgs, SnapshotDiffArgs, TopBy};
use crate::exit::Exit;
use crate::output::emit::{Format, Lines, emit};

use super::snapshot_top::{SCHEMA, TopDocument, top_lines};
use vramctl_observe::units;

#[derive(Serialize)]
struct Document<'a> {
    schema: u32,
    #[serde(flatten)]
    report: &'a SnapshotReport,
}

/// Runs `vramctl snapshot`.
///
/// # Errors
/// The path refused, the agent failed or did not answer (exit 2), stdout closed. No agent,
/// or nothing to snapshot, is exit 1 with its line on stderr.
pub fn run(args: &SnapshotArgs) -> anyhow::Result<Exit> {
    match &args.action {
        Some(SnapshotAction::Diff(diff_args)) => return diff_files(diff_args),
        Some(SnapshotAction::Timeline(timeline_args)) => {
            return super::snapshot_timeline::run(timeline_args);
        }
        Some(SnapshotAction::View(view_args)) => return super::snapshot_view::run(view_args),
        None => {}
    }
    if let Some(file) = &args.file {
        return summarize_file(file, args);
    }
    // clap requires FILE or --pid.
    let Some(pid) = args.pid else {
        anyhow::bail!("give a snapshot FILE to read, or --pid PID to take one");
    };
    let request = SnapshotRequest {
        pid,
        output: args.output.clone(),
        record: args.record.map(|r| match r {
            RecordAction::Start => HistoryRecord::Start {
                max_entries: args.max_entries,
                all_stacks: args.all_stacks,
            },
            RecordAction::Stop => HistoryRecord::Stop,
        }),
        timeout: args.timeout,
    };
    let report = match allocator_snapshot::take(&request) {
        Ok(report) => report,
        Err(err) if err.is_not_available() => {
            // The process's agent wrote part of it.
            eprintln!("vramctl: {}", Untrusted(&err.to_string()));
            return Ok(Exit::ConditionHolds);
        }
        Err(err) => return Err(err.into()),
    };
    let mut out = std::io::stdout().lock();
    let io = "cannot write to stdout";
    emit(
        &mut out,
        args.print.format(Format::JsonLine),
        || Document {
            schema: SCHEMA,
            report: &report,
        },
        || Lines::Untrusted(render(&report)),
    )?;
    out.flush().context(io)?;
    Ok(Exit::Ok)
}

/// The summary's JSON (docs/json.md, "snapshot FILE").
#[derive(Serialize)]
struct SummaryDocument<'a> {
    schema: u32,
    file: String,
    format: vramctl_snapshot::model::Format,
    #[serde(flatten)]
    summary: &'a vramctl_snapshot::Summary,
    /// With --top: the groups, largest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    top: Option<&'a TopDocument>,
    /// With -o: where the flame graph was written.
    #[serde(skip_serializing_if = "Option::is_none")]
    flame_graph: Option<&'a str>,
}

/// `vramctl snapshot FILE`.
fn summarize_file(file: &std::path::Path, args: &SnapshotArgs) -> anyhow::Result<Exit> {
    use vramctl_snapshot::top::{self, By};
    // Every output here is made from segments and blocks: the trace is read for its OOM
    // events, its entries' stacks are not (none of these outputs uses them).
    let snap = vramctl_snapshot::open_with(
        file,
        vramctl_snapshot::Limits::default(),
        vramctl_snapshot::TraceStacks::Skip,
    )
    .with_context(|| format!("cannot read the snapshot '{}'", file.display()))?;
    // The summary (text and JSON) says when the file's numbers cannot be true; the flame
    // graph and the collapsed stacks have no place for it: stderr does.
    if args.collapsed || args.output.is_some() {
        for why in vramctl_snapshot::summary::damage(&snap) {
            crate::print_warning(&format!("'{}' is damaged: {why}", file.display()));
        }
    }
    let flame_graph = match &args.output {
        Some(svg) => {
            write_flame_graph(&snap, file, svg)?;
            Some(svg.display().to_string())
        }
        None => None,
    };
    if args.collapsed {
        let mut out = std::io::stdout().lock();
        let io = "cannot write to stdout";
        for line in vramctl_snapshot::top::collapsed(&snap) {
            writeln!(out, "{}", Untrusted(&line)).context(io)?;
        }
        out.flush().context(io)?;
        return Ok(Exit::Ok);
    }
    let summary = vramctl_snapshot::summary::summarize_with(
        &snap,
        vramctl_snapshot::oom_cause::OomContext {
            device_total_bytes: args.device_memory,
        },
    );
    let top = args.top.map(|n| {
        let (by, name) = match args.by {
            TopBy::Stack => (By::Stack, "stack"),
            TopBy::Frame => (By::Frame, "frame"),
            TopBy::File => (By::File, "file"),
        };
        let (rows, live_bytes) = top::top(&snap, by, n);
        TopDocument {
            by: name,
            live_bytes,
            rows,
        }
    });
    let mut out = std::io::stdout().lock();
    let io = "cannot write to stdout";
    emit(
        &mut out,
        args.print.format(Format::JsonLine),
        || SummaryDocument {
            schema: SCHEMA,
            file: file.display().to_string(),
            format: snap.format,
            summary: &summary,
            top: top.as_ref(),
            flame_graph: flame_graph.as_deref(),
        },
        || {
            let mut lines = vramctl_snapshot::summary::table(&summary);
            if let Some(t) = &top {
                lines.extend(top_lines(t, ""));
            }
            if let Some(svg) = &flame_graph {
                lines.push(format!(
                    "flame graph of the live bytes by stack written to '{svg}'"
                ));
            }
            Lines::Untrusted(lines)
        },
    )?;
    out.flush().context(io)?;
    Ok(Exit::Ok)
}

/// Draws the live bytes of `snap` by folded stack (the `--collapsed` lines) as an SVG flame
/// graph at `svg`, titled with the snapshot's file name and the live total. Drawn whole in
/// memory first, so an error leaves no half-written file.
fn write_flame_graph(
    snap: &vramctl_snapshot::Snapshot,
    file: &std::path::Path,
    svg: &std::path::Path,
) -> anyhow::Result<()> {
    let is_svg = svg
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    if !is_svg {
        anyhow::bail!(
            "cannot draw a flame graph as '{}': with FILE, -o names the SVG to write; use a \
             name ending in .svg",
            svg.display()
        );
    }
    let lines = vramctl_snapshot::top::collapsed(snap);
    if lines.is_empty() {
        anyhow::bail!(
            "'{}' has no live blocks: there is no flame graph to draw",
            file.display()
        );
    }
    let live_bytes = vramctl_snapshot::top::live_by_stack(snap)
        .values()
        .fold(0u64, |total, &(bytes, _)| total.saturating_add(bytes));
    let name = file.file_name().map_or_else(
        || file.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let mut options = inferno::flamegraph::Options::default();
    options.title = format!("{name}: {} live", units::bytes(live_bytes));
    options.subtitle = Some(
        "live bytes by allocation stack (torch-internal frames folded into [torch])".to_owned(),
    );
    options.count_name = "bytes".to_owned();
    options.name_type = "Frame:".to_owned();
    // Colours from the frame names, so the same file draws the same SVG.
    options.deterministic = true;
    let mut bytes = Vec::new();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut bytes)
        .context("cannot draw the flame graph")?;
    std::fs::write(svg, bytes)
        .with_context(|| format!("cannot write the flame graph to '{}'", svg.display()))
}

/// The diff's JSON (docs/json.md, "snapshot diff").
#[derive(Serialize)]
struct DiffDocument<'a> {
    schema: u32,
    a: String,
    b: String,
    /// Stacks that changed, all of them; `rows` holds the first --top.
    changed_stacks: usize,
    #[serde(flatten)]
    diff: &'a vramctl_snapshot::diff::Diff,
}

/// `vramctl snapshot diff A B`.
fn diff_files(args: &SnapshotDiffArgs) -> anyhow::Result<Exit> {
    use vramctl_snapshot::diff::Change;
    let read = |p: &std::path::Path| {
        // `diff` compares blocks: the trace entries' stacks are not read.
        vramctl_snapshot::open_with(
            p,
            vramctl_snapshot::Limits::default(),
            vramctl_snapshot::TraceStacks::Skip,
        )
        .with_context(|| format!("cannot read the snapshot '{}'", p.display()))
    };
    let a = read(&args.a)?;
    let b = read(&args.b)?;
    let mut diff = vramctl_snapshot::diff::diff(&a, &b);
    let changed_stacks = diff.rows.len();
    diff.rows.truncate(args.top);
    let mut out = std::io::stdout().lock();
    let io = "cannot write to stdout";
    if args.print.json {
        serde_json::to_writer(
            &mut out,
            &DiffDocument {
                schema: SCHEMA,
                a: args.a.display().to_string(),
                b: args.b.display().to_string(),
                changed_stacks,
                diff: &diff,
            },
        )
        .context("cannot write JSON")?;
        writeln!(out).context(io)?;
        out.flush().context(io)?;
        return Ok(Exit::Ok);
    }
    writeln!(
        out,
        "live {} in {} blocks → {} in {} blocks ({}); {} stack{} changed",
        units::bytes(diff.a_live_bytes),
        diff.a_live_blocks,
        units::bytes(diff.b_live_bytes),
        diff.b_live_blocks,
        units::signed_bytes(diff.delta_bytes),
        changed_stacks,
        if changed_stacks == 1 { "" } else { "s" },
    )
    .context(io)?;
    if !diff.rows.is_empty() {
        writeln!(
            out,
            "  {:<9}  {:>11}  {:>10}  {:>10}  {:>13}  STACK",
            "CHANGE", "ΔBYTES", "A", "B", "BLOCKS A → B"
        )
        .context(io)?;
    }
    for r in &diff.rows {
        let change = match r.change {
            Change::Appeared => "appeared",
            Change::Grew => "grew",
            Change::Shrank => "shrank",
            Change::Gone => "gone",
            Change::Reblocked => "reblocked",
        };
        writeln!(
            out,
            "  {:<9}  {:>11}  {:>10}  {:>10}  {:>13}  {}",
            change,
            units::signed_bytes(r.delta_bytes),
            units::bytes(r.a_bytes),
            units::bytes(r.b_bytes),
            format!("{} → {}", r.a_blocks, r.b_blocks),
            r.stack
        )
        .context(io)?;
    }
    if changed_stacks > diff.rows.len() {
        writeln!(
            out,
            "  … {} more changed stack{} (--top N to show them)",
            changed_stacks - diff.rows.len(),
            if changed_stacks - diff.rows.len() == 1 {
                ""
            } else {
                "s"
            }
        )
        .context(io)?;
    }
    out.flush().context(io)?;
    Ok(Exit::Ok)
}

fn render(report: &SnapshotReport) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(w) = &report.written {
        let shown = report
            .local_path
            .as_ref()
            .map_or_else(|| w.path.clone(), |p| p.display().to_string());
        lines.push(format!(
            "allocator snapshot of PID {} written to '{shown}': {}, {} segment{}, {} history \
             entr{} (taken in {}, written in {})",
            report.pid,
            units::bytes(w.size_bytes),
            w.segments,
            if w.segments == 1 { "" } else { "s" },
            w.trace_entries,
            if w.trace_entries == 1 { "y" } else { "ies" },
            units::seconds(w.snapshot_s),
            units::seconds(w.write_s),
        ));
    }
    let h = &report.history;
    lines.push(if h.recording {
        format!(
            "allocation history: recording (at most {} entries, {} stacks); stop with \
             vramctl snapshot --pid {} --record stop",
            h.max_entries.unwrap_or(0),
            h.stacks.as_deref().unwrap_or("python"),
            report.pid
        )
    } else {
        "allocation history: not recorded by the agent (stacks appear in a snapshot only \
         while it is: --record start)"
            .to_owned()
    });
    lines
}
