//! `vramctl snapshot timeline FILE`: a thin shell over `vramctl_snapshot::timeline` and
//! `::replay` — the curve drawn through `output::chart::render_stacked`, the state at
//! `--at EVENT` printed with the summary's own lines.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use vramctl_core::untrusted::Untrusted;
use vramctl_snapshot::replay::Replay;
use vramctl_snapshot::summary::{DeviceSummary, OomEvent};
use vramctl_snapshot::timeline::{self, DeviceTimeline};
use vramctl_snapshot::top::{self, By};

use super::snapshot_top::{SCHEMA, TopDocument, top_lines};
use crate::cli::SnapshotTimelineArgs;
use crate::exit::Exit;
use crate::output::chart::{Layer, StackedChart, StackedMark, StackedPanel, render_stacked};
use vramctl_observe::units;

/// Points per device the chart and the JSON carry: about one per pixel of the plot.
const MAX_POINTS: usize = 2000;

/// The JSON (docs/json.md, "snapshot timeline").
#[derive(Serialize)]
struct TimelineDocument<'a> {
    schema: u32,
    file: String,
    devices: &'a [DeviceTimeline],
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<AtDocument>,
    /// With -o: where the chart was written.
    #[serde(skip_serializing_if = "Option::is_none")]
    chart: Option<String>,
}

/// The state right after one event.
#[derive(Serialize)]
struct AtDocument {
    device: i64,
    event: usize,
    action: vramctl_snapshot::model::Action,
    time_us: Option<i64>,
    /// False when the trace did not replay cleanly to this event.
    replayed: bool,
    /// The summary's numbers at that moment (docs/json.md, "snapshot FILE", per device).
    summary: Option<DeviceSummary>,
    /// The OOM event itself, when the event is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    oom: Option<OomEvent>,
    top: TopDocument,
}

/// Runs `vramctl snapshot timeline`.
///
/// # Errors
/// FILE unreadable or without a trace, an event outside it, the chart not writable.
pub fn run(args: &SnapshotTimelineArgs) -> anyhow::Result<Exit> {
    let file = &args.file;
    let snap = vramctl_snapshot::open(file, vramctl_snapshot::Limits::default())
        .with_context(|| format!("cannot read the snapshot '{}'", file.display()))?;
    let traced = timeline::traced_devices(&snap);
    if traced.is_empty() {
        anyhow::bail!(
            "'{}' has no trace to draw: record the history before taking the snapshot \
             (torch.cuda.memory._record_memory_history(), or vramctl snapshot --pid PID \
             --record start)",
            file.display()
        );
    }
    let at = match args.at {
        Some(event) => {
            let device = match args.device {
                Some(d) if traced.contains(&d) => d,
                Some(d) => anyhow::bail!(
                    "device '{d}' has no trace in '{}'; devices with one: {}",
                    file.display(),
                    traced
                        .iter()
                        .map(i64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => traced[0],
            };
            let index = timeline::resolve(&snap, device, event)
                .with_context(|| format!("cannot go to --at in '{}'", file.display()))?;
            Some(state_at(&snap, device, index, usize::from(args.top)))
        }
        None => None,
    };
    let line = timeline::timeline(&snap, usize::from(args.top), MAX_POINTS);
    let chart = match &args.output {
        Some(path) => {
            render_stacked(&chart_of(file, &line.devices, at.as_ref()), path)?;
            Some(path.display().to_string())
        }
        None => None,
    };
    let mut out = std::io::stdout().lock();
    let io = "cannot write to stdout";
    if args.print.json {
        serde_json::to_writer(
            &mut out,
            &TimelineDocument {
                schema: SCHEMA,
                file: file.display().to_string(),
                devices: &line.devices,
                at,
                chart,
            },
        )
        .context("cannot write JSON")?;
        writeln!(out).context(io)?;
    } else {
        for d in &line.devices {
            writeln!(
                out,
                "device {}: {} events; live peak {} after event {}; at the end {} live, {} \
                 reserved{}",
                d.device,
                d.events,
                units::bytes(d.peak_live_bytes),
                d.peak_event,
                units::bytes(d.points.last().map_or(0, |p| p.live_bytes)),
                units::bytes(d.points.last().map_or(0, |p| p.reserved_bytes)),
                if d.live_bytes_before_trace == 0 && d.reserved_bytes_before_trace == 0 {
                    String::new()
                } else {
                    format!(
                        "; {} live before the first event (older events not in the trace)",
                        units::bytes(d.live_bytes_before_trace)
                    )
                },
            )
            .context(io)?;
        }
        if let Some(a) = &at {
            for l in at_lines(a) {
                writeln!(out, "{}", Untrusted(&l)).context(io)?;
            }
        }
        if let Some(path) = &chart {
            writeln!(out, "timeline written to '{path}'").context(io)?;
        }
    }
    out.flush().context(io)?;
    Ok(Exit::Ok)
}

fn state_at(snap: &vramctl_snapshot::Snapshot, device: i64, event: usize, n: usize) -> AtDocument {
    let entry = &snap.device_traces[usize::try_from(device).unwrap_or(0)][event];
    let replay = Replay::after_event(snap, device, Some(event));
    let state = replay.to_snapshot();
    let summary = vramctl_snapshot::summarize(&state)
        .devices
        .into_iter()
        .next();
    let oom = vramctl_snapshot::summarize(snap)
        .oom
        .into_iter()
        .find(|o| o.device == device && o.event == event);
    let (rows, live_bytes) = top::top(&state, By::Stack, n);
    AtDocument {
        device,
        event,
        action: entry.action.clone(),
        time_us: entry.time_us,
        replayed: replay.consistent,
        summary,
        oom,
        top: TopDocument {
            by: "stack",
            live_bytes,
            rows,
        },
    }
}

fn action_name(a: &vramctl_snapshot::model::Action) -> String {
    serde_json::to_value(a)
        .ok()
        .and_then(|v| match v {
            serde_json::Value::String(s) => Some(s),
            serde_json::Value::Object(o) => {
                o.get("other").and_then(|x| x.as_str()).map(str::to_owned)
            }
            _ => None,
        })
        .unwrap_or_else(|| "?".to_owned())
}

fn at_lines(a: &AtDocument) -> Vec<String> {
    let mut out = vec![format!(
        "at event {} of device {} ({}){}:",
        a.event,
        a.device,
        action_name(&a.action),
        if a.replayed {
            ""
        } else {
            " (approximate: the trace did not replay cleanly)"
        }
    )];
    match &a.summary {
        Some(d) => out.extend(vramctl_snapshot::summary::device_lines(d)),
        None => out.push(format!("device {}: no segments at that moment", a.device)),
    }
    if let Some(o) = &a.oom {
        out.push(vramctl_snapshot::summary::oom_line(o));
    }
    out.extend(top_lines(&a.top, &format!(" at event {}", a.event)));
    out
}

fn chart_of(file: &Path, devices: &[DeviceTimeline], at: Option<&AtDocument>) -> StackedChart {
    let name = file.file_name().map_or_else(
        || file.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    StackedChart {
        title: format!("{name}: live memory by allocation stack over the trace"),
        panels: devices
            .iter()
            .map(|d| {
                let x: Vec<i64> = d
                    .points
                    .iter()
                    .map(|p| i64::try_from(p.event).unwrap_or(i64::MAX))
                    .collect();
                let layers = d
                    .stacks
                    .iter()
                    .enumerate()
                    .map(|(k, label)| Layer {
                        label: label.clone(),
                        values: d.points.iter().map(|p| p.stack_bytes[k]).collect(),
                    })
                    .collect();
                let mut marks: Vec<StackedMark> = d
                    .oom_events
                    .iter()
                    .map(|&e| StackedMark {
                        x: i64::try_from(e).unwrap_or(i64::MAX),
                        label: "oom".to_owned(),
                        alarm: true,
                    })
                    .collect();
                if let Some(a) = at.filter(|a| a.device == d.device) {
                    marks.push(StackedMark {
                        x: i64::try_from(a.event).unwrap_or(i64::MAX),
                        label: format!("--at {}", a.event),
                        alarm: false,
                    });
                }
                StackedPanel {
                    title: format!(
                        "device {} · {} events · live peak {} after event {}",
                        d.device,
                        d.events,
                        units::bytes(d.peak_live_bytes),
                        d.peak_event
                    ),
                    x_desc: "trace event (the allocator's state right after it)".to_owned(),
                    x,
                    layers,
                    last_is_rest: true,
                    line: Some(Layer {
                        label: "reserved".to_owned(),
                        values: d.points.iter().map(|p| p.reserved_bytes).collect(),
                    }),
                    marks,
                }
            })
            .collect(),
    }
}
