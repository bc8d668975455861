//! `vramctl leaks --watch`: the GPUs now, one line whenever a verdict changes.
//!
//! One NVML session (per-process SM activity read where the driver has it), the observer
//! (`vramctl_observe::observation::Observer`: each GPU process's identity and names once,
//! its CPU time — the idle evidence — at most once a second), and the live analysis
//! (`vramctl_observe::verdict::AnalysisJudge`, the `FleetTracker` of `top`) fed each
//! observation, doing the rest. A series
//! whose process has been gone for a minute prints an `ended` line. Stops after `--count`
//! samples, on SIGINT or SIGTERM (exit 0, as `record`), or — with `--fail-on-leak` — at the first leak (exit 1).
//!
//! Times are the live analysis' time line: the wall clock at the first sample, counted on
//! by the monotonic clock (`FleetTracker::now_ms`), so a wall-clock step neither freezes
//! the verdicts nor makes a process idle for the step's length; every time printed is on
//! that line (it equals the wall clock until the clock steps).
//!
//! Test only (hidden): `--simulated-clock UNIX_MS` makes time start there and move by
//! `--interval` per sample without waiting (`--simulated-clock-step AT_MS:BY_MS` steps its
//! wall clock); with the fake NVML's `step` clock a run is deterministic and instant.

use std::collections::HashMap;
use std::io::Write;
use std::time::Instant;

use anyhow::{Context, anyhow};
use serde::Serialize;
use vramctl_gpu::Backend;
use vramctl_leaks::analysis::live::{FleetConfig, SeriesKey};
use vramctl_leaks::analysis::{LeakConfig, Verdict};
use vramctl_observe::gpu_selection::GpuFilter;
use vramctl_observe::live_loop::{
    clock_of, open_backend, sampler_on, simulated_clock, stop_signals, wait_next_tick,
};
use vramctl_observe::observation::Observer;
use vramctl_observe::verdict::AnalysisJudge;
use vramctl_store::format::rfc3339;

use vramctl_core::wall_time::{DayLines, zone as time_zone};

use super::{SCHEMA, SeriesJson, Who, local_explanation, short_command};
use crate::cli::{GlobalArgs, LeaksArgs};
use crate::exit::Exit;

/// What is known about a series beyond the tracker: for the lines printed.
struct Known {
    label: String,
    user: Option<String>,
    command: Option<String>,
    last: Option<Verdict>,
}

/// One `--json` line.
#[derive(Debug, Serialize)]
struct Event {
    schema: u32,
    /// `verdict` (a change) or `ended` (the process has been gone for a minute).
    event: &'static str,
    at: String,
    /// The verdict before (`null` for a series' first).
    from: Option<Verdict>,
    /// For `ended`: who it was and its last verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    ended: Option<Ended>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    series: Option<SeriesJson>,
}

#[derive(Debug, Serialize)]
struct Ended {
    gpu_uuid: String,
    pid: u32,
    start_time_ticks: Option<u64>,
    command: Option<String>,
    last_verdict: Option<Verdict>,
}

/// Runs `leaks --watch`.
pub fn run(global: &GlobalArgs, args: &LeaksArgs, cfg: LeakConfig) -> anyhow::Result<Exit> {
    let interval_ms = crate::cmd::millis(args.interval);
    let tz = time_zone(args.source.tz.as_deref())?;
    let mut days = DayLines::new(tz.clone());
    let manual = simulated_clock(args.simulated_clock, &args.simulated_clock_step);
    let backend = open_backend(&global.backends())?;
    let mut sampler =
        sampler_on(backend, clock_of(manual.as_ref()), true).context("cannot list the GPUs")?;
    let filter = GpuFilter::new(&args.source.gpu, sampler.devices())?;
    let mut judge = AnalysisJudge::with_fleet_config(FleetConfig {
        leak: cfg,
        ..FleetConfig::default()
    })
    .map_err(|e| anyhow!("{e}"))?;
    // Neither agents (no column for them here) nor ancestors (no tree).
    let mut observer = Observer::builder().agents(None).ancestors(false).build();
    let mut known: HashMap<SeriesKey, Known> = HashMap::new();
    let stdout = std::io::stdout();
    // Installed before the first tick, so a SIGTERM at any moment ends the watch with 0.
    let signals = stop_signals()?;
    let started = Instant::now();
    let mut ticks: u64 = 0;
    loop {
        let mut snapshot = sampler.tick();
        snapshot.devices.retain(|d| filter.matches(&d.info));
        let backend = sampler.backend_mut();
        let observation = observer.observe(snapshot, |pid| backend.process_name(pid));
        let tick = judge.track(&observation);
        let fleet = judge.fleet();
        let snapshot = &observation.snapshot;
        // The time the tick speaks for, on the tracker's time line (not the wall clock,
        // which may have stepped).
        let now_ms = fleet.now_ms().unwrap_or(snapshot.taken_at_unix_ms);
        let mut out = stdout.lock();
        let mut leaked = false;
        for c in &tick.changes {
            let key = &c.key;
            if !args.source.pid.is_empty() && !args.source.pid.contains(&key.pid) {
                continue;
            }
            let place = fleet.place(key);
            let label = place.map_or_else(|| "GPU ?".to_owned(), |p| p.label.clone());
            let entry = known.entry(key.clone()).or_insert_with(|| {
                // User and command line; the driver's name for a process /proc cannot see.
                let host = observation.hosts.get(&key.pid);
                let user = host.and_then(|h| h.user.clone());
                let command = host
                    .map(|h| h.command.clone())
                    .filter(|c| !c.is_empty())
                    .or_else(|| observation.driver_names.get(&key.pid).cloned());
                Known {
                    label: label.clone(),
                    user,
                    command,
                    last: None,
                }
            });
            entry.last = Some(c.change.to);
            leaked |= c.change.to == Verdict::Leak;
            let report = &c.change.report;
            if args.json {
                let device = snapshot
                    .devices
                    .iter()
                    .find(|d| d.info.uuid == key.device_uuid);
                let event = Event {
                    schema: SCHEMA,
                    event: "verdict",
                    at: rfc3339(c.change.at_unix_ms),
                    from: c.change.from,
                    ended: None,
                    series: Some(SeriesJson::new(
                        &Who {
                            gpu_uuid: &key.device_uuid,
                            gpu_index: place.map(|p| p.device_index),
                            gpu_name: place.and_then(|p| p.device_name.as_deref()),
                            gpu_total_bytes: device
                                .and_then(|d| d.reading())
                                .and_then(|r| r.memory)
                                .map(|m| m.total_bytes),
                            pid: Some(key.pid),
                            start_time_ticks: key.start_time_ticks,
                            user: entry.user.as_deref(),
                            command: entry.command.as_deref(),
                        },
                        report,
                    )),
                };
                serde_json::to_writer(&mut out, &event).context("cannot write JSON")?;
                writeln!(out).context("cannot write to stdout")?;
            } else {
                let verdict = match c.change.from {
                    Some(from) => format!("{} → {}", from.as_str(), c.change.to.as_str()),
                    None => c.change.to.as_str().to_owned(),
                };
                if let Some(day) = days.day_line(c.change.at_unix_ms) {
                    writeln!(out, "{day}").context("cannot write to stdout")?;
                }
                writeln!(
                    out,
                    "{}  {label}  PID {} ({})  {verdict}  {}",
                    days.clock(c.change.at_unix_ms),
                    key.pid,
                    short_command(entry.command.as_deref().unwrap_or("?")),
                    local_explanation(report, &label, &tz, false),
                )
                .context("cannot write to stdout")?;
            }
        }
        for key in &tick.forgotten {
            let Some(gone) = known.remove(key) else {
                continue;
            };
            if args.json {
                let event = Event {
                    schema: SCHEMA,
                    event: "ended",
                    at: rfc3339(now_ms),
                    from: None,
                    ended: Some(Ended {
                        gpu_uuid: key.device_uuid.clone(),
                        pid: key.pid,
                        start_time_ticks: key.start_time_ticks,
                        command: gone.command,
                        last_verdict: gone.last,
                    }),
                    series: None,
                };
                serde_json::to_writer(&mut out, &event).context("cannot write JSON")?;
                writeln!(out).context("cannot write to stdout")?;
            } else {
                if let Some(day) = days.day_line(snapshot.taken_at_unix_ms) {
                    writeln!(out, "{day}").context("cannot write to stdout")?;
                }
                writeln!(
                    out,
                    "{}  {}  PID {} ({})  ended  gone for a minute; last verdict: {}",
                    days.clock(now_ms),
                    gone.label,
                    key.pid,
                    short_command(gone.command.as_deref().unwrap_or("?")),
                    gone.last.map_or("none", Verdict::as_str),
                )
                .context("cannot write to stdout")?;
            }
        }
        out.flush().context("cannot write to stdout")?;
        drop(out);
        if args.fail_on_leak && leaked {
            return Ok(Exit::ConditionHolds);
        }
        ticks += 1;
        if args.count.is_some_and(|n| ticks >= n) {
            return Ok(Exit::Ok);
        }
        if wait_next_tick(manual.as_ref(), &signals, started, ticks, interval_ms) {
            // A stop asked for is the normal end of a watch, as it is for `record`.
            return Ok(Exit::Ok);
        }
    }
}
