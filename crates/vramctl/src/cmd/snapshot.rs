//! `vramctl snapshot`: with FILE, a thin shell over `vramctl_snapshot` (read, summarize,
//! print); with --pid, over `vramctl_core::allocator_snapshot` (checks of the path, the
//! agent's `snapshot`): flags in, where the file is and its size out, the exit code.

use std::io::Write;

use anyhow::Context;
use serde::Serialize;
use vramctl_core::agent_client::HistoryRecord;
use vramctl_core::allocator_snapshot::{self, SnapshotReport, SnapshotRequest};

use crate::cli::{RecordAction, SnapshotArgs, TopBy};
use crate::exit::Exit;
use vramctl::units;

/// Version of the JSON below (docs/json.md).
const SCHEMA: u32 = 1;

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
            eprintln!("vramctl: {err}");
            return Ok(Exit::ConditionHolds);
        }
        Err(err) => return Err(err.into()),
    };
    let mut out = std::io::stdout().lock();
    let io = "cannot write to stdout";
    if args.json {
        serde_json::to_writer(
            &mut out,
            &Document {
                schema: SCHEMA,
                report: &report,
            },
        )
        .context("cannot write JSON")?;
        writeln!(out).context(io)?;
    } else {
        for line in render(&report) {
            writeln!(out, "{line}").context(io)?;
        }
    }
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
    top: Option<TopDocument>,
}

#[derive(Serialize)]
struct TopDocument {
    by: &'static str,
    /// Σ live (active) bytes over all groups, the share's denominator.
    live_bytes: u64,
    rows: Vec<vramctl_snapshot::top::TopRow>,
}

/// `vramctl snapshot FILE`.
fn summarize_file(file: &std::path::Path, args: &SnapshotArgs) -> anyhow::Result<Exit> {
    use vramctl_snapshot::top::{self, By};
    let snap = vramctl_snapshot::open(file, vramctl_snapshot::Limits::default())
        .with_context(|| format!("cannot read the snapshot '{}'", file.display()))?;
    let summary = vramctl_snapshot::summarize(&snap);
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
    let json = args.json;
    let mut out = std::io::stdout().lock();
    let io = "cannot write to stdout";
    if json {
        serde_json::to_writer(
            &mut out,
            &SummaryDocument {
                schema: SCHEMA,
                file: file.display().to_string(),
                format: snap.format,
                summary: &summary,
                top,
            },
        )
        .context("cannot write JSON")?;
        writeln!(out).context(io)?;
    } else {
        for line in vramctl_snapshot::summary::table(&summary) {
            writeln!(out, "{line}").context(io)?;
        }
        if let Some(t) = &top {
            writeln!(
                out,
                "top {} by {} (of {} live):",
                t.rows.len(),
                t.by,
                units::bytes(t.live_bytes)
            )
            .context(io)?;
            for r in &t.rows {
                #[allow(clippy::cast_precision_loss)]
                let share = if t.live_bytes == 0 {
                    0.0
                } else {
                    100.0 * r.bytes as f64 / t.live_bytes as f64
                };
                writeln!(
                    out,
                    "  {:>10}  {:>5.1}%  {:>5} block{}  {}",
                    units::bytes(r.bytes),
                    share,
                    r.blocks,
                    if r.blocks == 1 { " " } else { "s" },
                    r.key
                )
                .context(io)?;
            }
        }
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
