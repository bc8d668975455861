//! `vramctl plot`: memory over time per GPU and per process, as a PNG or SVG chart.
//!
//! The samples come from the history (`--db`) or from log files read in memory (the same
//! sources as `leaks`: `leaks::open_source`). One panel per GPU (`history::plot_panels`):
//! the device's used memory, each process's memory, the installed memory as the ceiling,
//! gaps in the recording as hatched spans. Unless `--no-analysis`, the leak analysis runs
//! over the same range and the chart marks where each leak began and shades the periods a
//! process held memory while idle.

use std::io::Write;

use anyhow::{Context, bail};
use vramctl_core::wall_time::{clock, same_day, zone_label};
use vramctl_leaks::analysis::Verdict;
use vramctl_observe::units;

use vramctl_history::history_chart::plot_panels;
use vramctl_history::leak_scan::{Finding, analyse, short_command};
use vramctl_history::sample_source::SourceKind;

use super::{leak_config, open_source};
use crate::cli::{GlobalArgs, PlotArgs};
use crate::exit::Exit;
use crate::output::chart::{
    Chart, ChartMark, ChartSeries, ChartSpan, MarkKind, Panel, SeriesKind, SpanKind, render,
};

/// Points per series the history is bucketed to (the chart is 1,400 px wide; it keeps the
/// extremes of each pixel column itself).
const MAX_POINTS: i64 = 1_000;

/// Runs `plot`.
pub fn run(global: &GlobalArgs, args: &PlotArgs) -> anyhow::Result<Exit> {
    let cfg = leak_config(&args.analysis)?;
    let mut source = open_source(global, &args.source)?;
    let panels = plot_panels(
        &mut source.store,
        source.range,
        &source.devices,
        &args.source.pid,
        MAX_POINTS,
    )?;
    if panels.is_empty() {
        match &source.kind {
            SourceKind::Store(path) => bail!(
                "nothing to draw: no GPU memory recorded in this range of '{}'; widen it with --since (e.g. --since all)",
                path.display()
            ),
            SourceKind::Files(_) => bail!("nothing to draw: the files hold no GPU memory samples"),
        }
    }
    let findings: Vec<Finding> = if args.no_analysis {
        Vec::new()
    } else {
        analyse(
            &mut source.store,
            source.range,
            &source.devices,
            &args.source.pid,
            &cfg,
        )?
    };
    let tz = source.tz.clone();
    // The title names the time the data covers (the range asked may be wider).
    let times = panels.iter().flat_map(|p| {
        p.device
            .iter()
            .chain(p.processes.iter().flat_map(|(_, _, points)| points.iter()))
            .filter(|(_, bytes)| bytes.is_some())
            .map(|(t, _)| *t)
    });
    let (from, to) = times.fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
    let mut chart_panels = Vec::with_capacity(panels.len());
    let (mut marks, mut idle_spans) = (0, 0);
    for p in panels {
        let mut series = vec![ChartSeries {
            label: "used (device)".to_owned(),
            kind: SeriesKind::Device,
            points: p.device,
        }];
        series.extend(
            p.processes
                .into_iter()
                .map(|(_, label, points)| ChartSeries {
                    label,
                    kind: SeriesKind::Process,
                    points,
                }),
        );
        let mut panel = Panel {
            title: p.title,
            ceiling_bytes: p.ceiling_bytes,
            series,
            marks: Vec::new(),
            spans: p
                .gaps
                .into_iter()
                .map(|(from, to, reason)| ChartSpan {
                    from_unix_ms: from,
                    to_unix_ms: to,
                    label: format!("not recorded: {reason}"),
                    kind: SpanKind::Gap,
                })
                .collect(),
        };
        for f in findings
            .iter()
            .filter(|f| f.device.meta.uuid == p.device_uuid)
        {
            let who = match &f.process {
                Some(proc) => format!(
                    "{} [{}]",
                    short_command(proc.meta.command.as_deref().unwrap_or("?")),
                    proc.meta.key.pid
                ),
                None => "device".to_owned(),
            };
            let r = &f.report;
            if let (Verdict::Leak, Some(onset)) = (r.verdict, r.onset_unix_ms) {
                panel.marks.push(ChartMark {
                    at_unix_ms: onset,
                    label: format!(
                        "leak {}: {who}",
                        units::sentence_rate(r.slope_bytes_per_sec)
                    ),
                    kind: MarkKind::LeakOnset,
                });
                marks += 1;
            }
            for period in &r.idle.periods {
                panel.spans.push(ChartSpan {
                    from_unix_ms: period.from_unix_ms,
                    to_unix_ms: period.to_unix_ms,
                    label: format!("idle: {who} holds {}", units::bytes(r.current_bytes)),
                    kind: SpanKind::Idle,
                });
                idle_spans += 1;
            }
        }
        chart_panels.push(panel);
    }
    let title = format!(
        "GPU memory, {} → {} {}",
        clock(&tz, from, true),
        clock(&tz, to, !same_day(&tz, from, to)),
        zone_label(&tz, from)
    );
    let chart = Chart {
        title,
        time_zone: tz,
        panels: chart_panels,
    };
    render(&chart, &args.output)?;
    let analysis = if args.no_analysis {
        String::new()
    } else {
        format!(
            ", {marks} leak onset{}, {idle_spans} idle period{}",
            if marks == 1 { "" } else { "s" },
            if idle_spans == 1 { "" } else { "s" }
        )
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "wrote '{}': {} GPU{}{analysis}",
        args.output.display(),
        chart.panels.len(),
        if chart.panels.len() == 1 { "" } else { "s" },
    )
    .context("cannot write to stdout")?;
    Ok(Exit::Ok)
}
