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
//! The processes' agents are asked for their allocated bytes (at the interval, 1 s to
//! 10 s): where one answers, the leak verdict is judged on live tensors. With `--where`, a
//! process judged `leak` whose agent answers is probed once for its leak's "where"
//! (`vramctl_observe::leak_where`): the allocation sites whose live bytes grew between two
//! allocator snapshots, printed as a `where` line (event) of its own; the probe's steps
//! are scheduled on the watch's time line, its work done on a thread of its own.
//!
//! Test only (hidden): `--simulated-clock UNIX_MS` makes time start there and move by
//! `--interval` per sample without waiting (`--simulated-clock-step AT_MS:BY_MS` steps its
//! wall clock); with the fake NVML's `step` clock a run is deterministic and instant.

use std::collections::HashMap;
use std::io::Write;
use std::time::Instant;

use anyhow::{Context, anyhow};
use serde::Serialize;
use vramctl_agent::agent_poll::{AgentPoll, PollLimits};
use vramctl_gpu::Backend;
use vramctl_leaks::analysis::live::{FleetConfig, SeriesKey};
use vramctl_leaks::analysis::{LeakConfig, Verdict};
use vramctl_observe::gpu_selection::GpuFilter;
use vramctl_observe::leak_where::{self, LeakWhere, Outcome, ProbeLimits, WhereProbes};
use vramctl_observe::live_loop::{
    clock_of, open_backend, sampler_on, simulated_clock, stop_signals, wait_next_tick,
};
use vramctl_observe::observation::Observer;
use vramctl_observe::units;
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
    /// For `where`: the leak's allocation sites, or why there are none.
    #[serde(rename = "where", skip_serializing_if = "Option::is_none")]
    where_: Option<WhereJson>,
}

/// A `where` event's findings (docs/json.md).
#[derive(Debug, Serialize)]
struct WhereJson {
    pid: u32,
    command: Option<String>,
    /// Snapshot A and B (absent on an error).
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    to: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    live_grew_bytes: Option<i64>,
    sites: Vec<leak_where::GrowingSite>,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_recording: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// How long the end of a watch waits for the `--where` probes under way.
const WHERE_FINISH: std::time::Duration = std::time::Duration::from_secs(60);

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
    // Agents for their allocated bytes (the leak judged on live tensors), asked every
    // interval within 1 s to 10 s (one exchange costs about a millisecond per agent,
    // docs/benchmarks.md); no ancestors (no tree).
    let agents = AgentPoll::new(PollLimits {
        cadence: args.interval.clamp(
            std::time::Duration::from_secs(1),
            vramctl_agent::agent_poll::DEFAULT_CADENCE,
        ),
        ..PollLimits::default()
    });
    let mut observer = Observer::builder()
        .agents(Some(agents))
        .ancestors(false)
        .build();
    let mut probes = if args.where_ {
        Some(WhereProbes::new(ProbeLimits {
            spacing: args.where_after,
            ..ProbeLimits::default()
        })?)
    } else {
        None
    };
    let mut commands: HashMap<u32, Option<String>> = HashMap::new();
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
            if let Some(probes) = probes.as_mut()
                && c.change.to == Verdict::Leak
                && observation.agents.get(key.pid, &key.device_uuid).is_some()
            {
                commands.insert(key.pid, entry.command.clone());
                probes.want(key.pid);
            }
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
                    where_: None,
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
                    where_: None,
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
        if let Some(probes) = probes.as_mut() {
            for outcome in probes.poll(now_ms) {
                print_where(&mut out, args.json, &outcome, now_ms, &commands, &days)?;
            }
        }
        out.flush().context("cannot write to stdout")?;
        drop(out);
        // `--fail-on-leak` ends at the first leak; a probe it started has nothing to
        // show yet (a `where` needs `--where-after` twice).
        if args.fail_on_leak && leaked {
            return Ok(Exit::ConditionHolds);
        }
        ticks += 1;
        let stop = args.count.is_some_and(|n| ticks >= n)
            || wait_next_tick(manual.as_ref(), &signals, started, ticks, interval_ms);
        if stop {
            // A stop asked for is the normal end of a watch, as it is for `record`; the
            // probes under way finish first (bounded), so a leak found just before the end
            // still gets its where.
            if let Some(probes) = probes.as_mut() {
                let mut out = stdout.lock();
                for outcome in probes.finish(now_ms, WHERE_FINISH) {
                    let at = match &outcome {
                        Outcome::Found(w) => w.to_unix_ms,
                        Outcome::Failed { .. } => now_ms,
                    };
                    print_where(&mut out, args.json, &outcome, at, &commands, &days)?;
                }
                out.flush().context("cannot write to stdout")?;
            }
            return Ok(Exit::Ok);
        }
    }
}

/// Prints a probe's end: a `where` line (or event) with the growing sites, or why none.
fn print_where(
    out: &mut impl Write,
    json: bool,
    outcome: &Outcome,
    now_ms: i64,
    commands: &HashMap<u32, Option<String>>,
    days: &DayLines,
) -> anyhow::Result<()> {
    let (pid, found, error) = match outcome {
        Outcome::Found(w) => (w.pid, Some(w), None),
        Outcome::Failed { pid, reason } => (*pid, None, Some(reason.clone())),
    };
    let command = commands.get(&pid).cloned().flatten();
    if json {
        let event = Event {
            schema: SCHEMA,
            event: "where",
            at: rfc3339(now_ms),
            from: None,
            ended: None,
            series: None,
            where_: Some(WhereJson {
                pid,
                command,
                from: found.map(|w| rfc3339(w.from_unix_ms)),
                to: found.map(|w| rfc3339(w.to_unix_ms)),
                live_grew_bytes: found.map(|w| w.live_grew_bytes),
                sites: found.map(|w| w.sites.clone()).unwrap_or_default(),
                started_recording: found.map(|w| w.started_recording),
                agent_ms: found.map(|w| w.agent_ms),
                error,
            }),
        };
        serde_json::to_writer(&mut *out, &event).context("cannot write JSON")?;
        writeln!(out).context("cannot write to stdout")?;
        return Ok(());
    }
    let what = match (found, error) {
        (Some(w), _) => where_text(w),
        (None, Some(reason)) => format!("no where: {reason}"),
        (None, None) => "no where".to_owned(),
    };
    writeln!(
        out,
        "{}  PID {pid} ({})  where  {what}",
        days.clock(now_ms),
        short_command(command.as_deref().unwrap_or("?")),
    )
    .context("cannot write to stdout")
}

/// `live tensors grew in 10 s: +48.0 MiB at step (train.py:12) (+3 blocks, 80.0 MiB live); …`.
fn where_text(w: &LeakWhere) -> String {
    let span_ms = u64::try_from(w.to_unix_ms - w.from_unix_ms).unwrap_or(0);
    let span = vramctl_leaks::analysis::human_duration(span_ms as f64 / 1000.0);
    let cost = format!(
        "the probe cost the process {} ms of its agent's time",
        w.agent_ms
    );
    if w.sites.is_empty() {
        return format!(
            "no allocation site's live tensors grew in {span} ({} in all; {cost})",
            units::signed_bytes(i128::from(w.live_grew_bytes))
        );
    }
    let sites: Vec<String> = w
        .sites
        .iter()
        .map(|s| {
            format!(
                "+{} at {} ({:+} blocks, {} live)",
                units::bytes(s.grew_bytes),
                vramctl_core::untrusted::escape(&s.site),
                s.grew_blocks,
                units::bytes(s.live_bytes)
            )
        })
        .collect();
    format!("live tensors grew in {span}: {}; {cost}", sites.join("; "))
}
