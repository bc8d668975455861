//! `vramctl run -- CMD`: the command under supervision (`vramctl_run::job`), then
//! its report — text on stderr by default, so the command's stdout stays its own — the
//! budget check, the history and the chart.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use vramctl_history::recorder::{Procs, StoreFeed, channel_capacity, session};
use vramctl_observe::observation::Observer;
use vramctl_observe::units::bytes;
use vramctl_run::job::agent_inject::is_python_command;
use vramctl_run::job::child::{Output, SignalForwarder};
use vramctl_run::job::{DeviceReport, Ending, JobReport, JobSpec, RunError, run_job};
use vramctl_store::{OpenMode, Retention, Store, TickSample, device_samples};

use super::{db_path, open_sampler};
use crate::cli::{Budget, BudgetOf, GlobalArgs, RunArgs};
use crate::exit::Exit;
use crate::output::chart::{Chart, ChartSeries, Panel, SeriesKind, render};
use crate::output::emit::{Format, Lines, emit};

/// How long a stopped job gets between SIGTERM and SIGKILL (`run --grace`'s default; each
/// `fit` trial's).
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// Runs `run`.
pub fn run(global: &GlobalArgs, args: &RunArgs) -> anyhow::Result<Exit> {
    // NVML first: a job that cannot be watched is not started (a CI guard must not pass
    // unchecked).
    let mut sampler = open_sampler(global)?;
    let agent = wants_agent(args.watch.agent, args.watch.no_agent, &args.command);
    if let Err(err) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        tracing::warn!(%err, "Could not become a child subreaper; orphaned workers leave the tree.");
    }
    let signals = SignalForwarder::install().context("cannot install signal handlers")?;
    let mut recording = if args.record {
        open_recording(global, args.watch.interval)?
    } else {
        None
    };
    let spec = JobSpec {
        argv: args.command.clone(),
        env: Vec::new(),
        agent,
        output: Output::PassThrough,
        until_line: None,
        timeout: args.timeout,
        interval: args.watch.interval,
        stop_grace: args.grace,
        reap_orphans: true,
        daemon: Some(vramctl_observe::daemon_socket::client::AskOptions {
            nvml_library: global.nvml_lib.clone(),
            process_stat: false,
            accept_mapped: true,
        }),
    };
    let mut on_tick = |snapshot: &vramctl_core::types::Snapshot, _: &_| {
        if let Some(r) = recording.as_mut() {
            r.send(snapshot);
        }
    };
    let report = match run_job(&mut sampler, &spec, &signals, &mut on_tick) {
        Ok(report) => report,
        Err(RunError::Spawn(err)) => {
            crate::print_error(&err.to_string());
            return Ok(Exit::Passed(u8::try_from(err.shell_code()).unwrap_or(126)));
        }
        Err(err) => return Err(err.into()),
    };
    if let Some(mut r) = recording.take() {
        r.feed.finish()?;
    }
    let verdict = args
        .max_vram
        .map(|b| check_budget(&report, b, args.budget_of));
    write_report(args, &report, verdict.as_ref())?;
    if let Some(path) = &args.plot {
        render(&chart(&report), path)?;
    }
    match verdict {
        Some(Err(err)) => Err(anyhow::anyhow!(err)),
        Some(Ok(check)) if check.over() => Ok(Exit::ConditionHolds),
        _ => Ok(Exit::Passed(
            u8::try_from(report.shell_code.clamp(0, 255)).unwrap_or(1),
        )),
    }
}

/// `--agent`/`--no-agent`, else whether the command runs Python.
pub fn wants_agent(agent: bool, no_agent: bool, command: &[std::ffi::OsString]) -> bool {
    if no_agent {
        return false;
    }
    agent || command.first().is_some_and(|p| is_python_command(p))
}

/// `--record`: the history's writer, as `record` has it.
struct Recording {
    feed: StoreFeed,
    procs: Procs,
    /// Its processes, observed for `procs` (no agents: `run` asks its job's own).
    observer: Observer,
}

impl Recording {
    fn send(&mut self, snapshot: &vramctl_core::types::Snapshot) {
        let observation = self.observer.observe(snapshot.clone(), |_| None);
        let processes = self.procs.update_observed(
            &observation,
            self.observer.boot_id(),
            self.observer.ticks_per_second(),
        );
        let tick = TickSample {
            at_unix_ms: snapshot.taken_at_unix_ms,
            unavailable: None,
            devices: device_samples(snapshot),
            processes,
        };
        self.feed.send(tick, snapshot.monotonic_ms);
    }
}

fn open_recording(global: &GlobalArgs, interval: Duration) -> anyhow::Result<Option<Recording>> {
    let path = db_path(global)?;
    let mut store = match Store::open(&path, OpenMode::Append) {
        Ok(store) => store,
        Err(vramctl_store::StoreError::Io { cause, .. })
            if cause.kind() == std::io::ErrorKind::WouldBlock =>
        {
            // A recorder already writes this history (it holds the writer's lock): it has
            // the job's memory too.
            crate::print_warning(&format!(
                "not recording: another vramctl is already recording into '{}' ({cause})",
                path.display()
            ));
            return Ok(None);
        }
        Err(err) => return Err(err.into()),
    };
    let interval_ms = crate::cmd::millis(interval);
    store.begin_session(&session("run", interval_ms))?;
    let feed = StoreFeed::start(
        store,
        Retention::default(),
        interval_ms,
        channel_capacity(interval_ms),
        false,
    )?;
    Ok(Some(Recording {
        feed,
        procs: Procs::new(),
        observer: super::record::recording_observer().agents(None).build(),
    }))
}

/// `--max-vram` against the peaks.
#[derive(Debug)]
pub struct BudgetCheck {
    /// Per device used: (label, peak, limit).
    pub devices: Vec<(String, u64, u64)>,
    /// The figure checked.
    pub of: BudgetOf,
}

impl BudgetCheck {
    /// Whether a device went over.
    pub fn over(&self) -> bool {
        self.devices.iter().any(|(_, peak, limit)| peak > limit)
    }
}

fn check_budget(report: &JobReport, budget: Budget, of: BudgetOf) -> Result<BudgetCheck, String> {
    let mut devices = Vec::new();
    for d in report.used_devices() {
        let peak = match of {
            BudgetOf::Nvml => Some(d.curve.peak_bytes),
            BudgetOf::Reserved => d.framework.as_ref().and_then(|f| f.reserved_peak_bytes),
            BudgetOf::Allocated => d.framework.as_ref().and_then(|f| f.allocated_peak_bytes),
        };
        let Some(peak) = peak else {
            return Err(format!(
                "cannot check --max-vram against the framework's {} peak on GPU {}: no agent reported it (a Python job with torch, and --agent); use --budget-of nvml",
                budget_of_name(of),
                d.curve.index
            ));
        };
        let limit = match budget {
            Budget::Bytes(b) => b,
            Budget::OfDevice(f) => {
                let Some(total) = d.curve.total_bytes else {
                    return Err(format!(
                        "GPU {} does not report its memory, so a % budget cannot be checked; give a size",
                        d.curve.index
                    ));
                };
                (total as f64 * f) as u64
            }
        };
        devices.push((format!("GPU {}", d.curve.index), peak, limit));
    }
    if devices.is_empty() && of != BudgetOf::Nvml {
        return Err(format!(
            "cannot check --max-vram against the framework's {} peak: no agent reported it; use --budget-of nvml",
            budget_of_name(of)
        ));
    }
    Ok(BudgetCheck { devices, of })
}

fn budget_of_name(of: BudgetOf) -> &'static str {
    match of {
        BudgetOf::Nvml => "NVML",
        BudgetOf::Reserved => "reserved",
        BudgetOf::Allocated => "allocated",
    }
}

fn write_report(
    args: &RunArgs,
    report: &JobReport,
    verdict: Option<&Result<BudgetCheck, String>>,
) -> anyhow::Result<()> {
    let mut value = serde_json::to_value(report)?;
    if let Some(Ok(check)) = verdict {
        value["budget"] = serde_json::json!({
            "of": budget_of_name(check.of).to_lowercase(),
            "over": check.over(),
            "devices": check.devices.iter().map(|(gpu, peak, limit)| serde_json::json!({
                "gpu": gpu, "peak_bytes": peak, "limit_bytes": limit,
            })).collect::<Vec<_>>(),
        });
    }
    let mut text = Vec::new();
    // The text report's lines are built by render_text, which escapes the command line
    // and the OOM lines it quotes.
    emit(
        &mut text,
        Format::from_json_flag(args.json, Format::JsonPretty),
        || &value,
        || {
            let rendered = render_text(report, verdict.and_then(|v| v.as_ref().ok()));
            Lines::Styled(rendered.lines().map(str::to_owned).collect())
        },
    )?;
    match &args.report {
        Some(path) => std::fs::write(path, &text)
            .with_context(|| format!("cannot write the report to '{}'", path.display())),
        None => {
            // The command's stderr came first; a closed stderr loses only the report.
            let _ = std::io::stderr().write_all(&text);
            Ok(())
        }
    }
}

/// The report for people.
pub fn render_text(report: &JobReport, budget: Option<&BudgetCheck>) -> String {
    let mut out = String::new();
    let ended = match (report.ending, report.exit_code, report.signal) {
        (Ending::StoppedAfterLine, _, _) => "stopped after the line it waited for".to_owned(),
        (Ending::TimedOut, _, _) => "stopped at --timeout".to_owned(),
        (Ending::Exited, Some(code), _) => format!("exited {code}"),
        (Ending::Exited, None, Some(sig)) => format!("killed by signal {sig}"),
        (Ending::Exited, None, None) => "ended".to_owned(),
    };
    let command = vramctl_core::command_line::abbreviate(&report.command.join(" "), 70);
    out.push_str(&format!("vramctl run: {command}\n"));
    let agent = if report.agent_injected {
        let reporting: u32 = report
            .devices
            .iter()
            .filter_map(|d| d.framework.as_ref())
            .map(|f| f.processes)
            .sum();
        if reporting > 0 {
            format!("agent: {reporting} process-device report(s)")
        } else {
            "agent: injected, nothing reported (no framework used the GPU)".to_owned()
        }
    } else {
        "no agent".to_owned()
    };
    out.push_str(&format!(
        "  {ended} after {} · sampled every {} ms · {agent}\n",
        vramctl_observe::units::seconds(report.wall_s),
        report.interval_ms
    ));
    // An OOM leads the report: its cause and fix, then what was seen.
    if let Some(oom) = &report.oom {
        for line in vramctl_run::job::oom_verdict::lines(&oom.verdict) {
            out.push_str(&format!("  {line}\n"));
        }
        let source = oom.source.map_or("the framework's counter", |s| s.label());
        let at: Vec<String> = oom
            .device_used_bytes
            .iter()
            .filter_map(|(uuid, used)| {
                let d = report.devices.iter().find(|d| &d.curve.uuid == uuid)?;
                (d.curve.peak_bytes > 0 || used > &0).then(|| {
                    let total = d
                        .curve
                        .total_bytes
                        .map(|t| format!(" of {}", bytes(t)))
                        .unwrap_or_default();
                    format!("GPU {} had {}{total} in use", d.curve.index, bytes(*used))
                })
            })
            .collect();
        let what = if oom.fatal {
            "died of an out-of-memory error"
        } else {
            "hit an out-of-memory error and went on"
        };
        out.push_str(&format!(
            "  {what} ({source}) at {}{}{}\n",
            vramctl_observe::units::seconds(oom.at_s),
            if at.is_empty() {
                String::new()
            } else {
                format!("; {}", at.join(", "))
            },
            oom.line
                .as_ref()
                .map(|l| format!("\n    {l}"))
                .unwrap_or_default(),
        ));
    }
    if report.pid_mapping == vramctl_run::job::ticks::PidMapping::CannotMap {
        // Said, because the per-process figures are missing for a reason the user can fix.
        out.push_str(&format!(
            "  inside a PID namespace: {} sample(s) had only NVML's host PIDs (no host daemon \
             mapped them), so no process was attributed to the job in them; the device's \
             figures stay (docs/owners.md: mount a host daemon's socket)\n",
            report.unmapped_ticks
        ));
    }
    if report.leftover_processes > 0 {
        // Said, because a job that leaves processes behind usually did not mean to.
        out.push_str(&format!(
            "  {} of the job still running when the command ended: stopped (containment: {})\n",
            plural(report.leftover_processes, "process", "processes"),
            report.containment
        ));
    }
    if report.unkillable_processes > 0 {
        out.push_str(&format!(
            "  {} survived SIGKILL (uninterruptible sleep, usually in a driver) and outlive run\n",
            plural(report.unkillable_processes, "process", "processes")
        ));
    }
    let used: Vec<&DeviceReport> = report.used_devices().collect();
    if used.is_empty() {
        out.push_str("  no GPU memory held by the command's processes\n");
    }
    for d in &used {
        let c = &d.curve;
        let name = c.name.as_deref().unwrap_or("GPU");
        let of = d
            .capacity_bytes
            .map(|cap| format!(" of {} usable", bytes(cap)))
            .unwrap_or_default();
        out.push_str(&format!(
            "  GPU {} {name}: peak {} at {}{of} · mean {} · device peak {}\n",
            c.index,
            bytes(c.peak_bytes),
            vramctl_observe::units::seconds(c.peak_at_ms as f64 / 1000.0),
            bytes(c.mean_bytes),
            bytes(c.device_peak_used_bytes),
        ));
        out.push_str(&format!("    {}\n", c.sparkline(60)));
        if let Some(f) = &d.framework {
            out.push_str(&format!(
                "    framework: allocated peak {} · reserved peak {}\n",
                vramctl_observe::units::opt_bytes(f.allocated_peak_bytes),
                vramctl_observe::units::opt_bytes(f.reserved_peak_bytes),
            ));
        }
        if let Some(leak) = &d.leak {
            out.push_str(&format!(
                "    memory over the run: {} — {}\n",
                leak.verdict, leak.explanation
            ));
        }
    }
    if !report.processes.is_empty() {
        out.push_str(&format!(
            "  {:<8} {:>4} {:>10} {:>11} {:>11}  COMMAND\n",
            "PID", "GPU", "PEAK", "ALLOC PEAK", "RESV PEAK"
        ));
        for p in &report.processes {
            let gpu = report
                .devices
                .iter()
                .find(|d| d.curve.uuid == p.nvml.uuid)
                .map_or_else(|| "?".to_owned(), |d| d.curve.index.to_string());
            out.push_str(&format!(
                "  {:<8} {:>4} {:>10} {:>11} {:>11}  {}\n",
                p.nvml.pid,
                gpu,
                bytes(p.nvml.peak_bytes),
                vramctl_observe::units::opt_bytes(p.allocated_peak_bytes),
                vramctl_observe::units::opt_bytes(p.reserved_peak_bytes),
                p.nvml.command.as_deref().unwrap_or("-"),
            ));
        }
    }
    if let Some(check) = budget {
        for (gpu, peak, limit) in &check.devices {
            let figure = budget_of_name(check.of);
            if peak > limit {
                out.push_str(&format!(
                    "  budget: {gpu} {figure} peak {} is over --max-vram {} by {}\n",
                    bytes(*peak),
                    bytes(*limit),
                    bytes(peak - limit)
                ));
            } else {
                out.push_str(&format!(
                    "  budget: {gpu} {figure} peak {} is within --max-vram {}\n",
                    bytes(*peak),
                    bytes(*limit)
                ));
            }
        }
    }
    out
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The job's memory per GPU it used: the device's used memory and the job's share.
fn chart(report: &JobReport) -> Chart {
    let panels = report
        .used_devices()
        .map(|d| {
            let at = |t_ms: u64| {
                report
                    .started_unix_ms
                    .saturating_add(i64::try_from(t_ms).unwrap_or(0))
            };
            Panel {
                title: format!(
                    "GPU {} {}",
                    d.curve.index,
                    d.curve.name.as_deref().unwrap_or("")
                ),
                ceiling_bytes: d.curve.total_bytes,
                series: vec![
                    ChartSeries {
                        label: "device used".into(),
                        kind: SeriesKind::Device,
                        points: d
                            .curve
                            .points
                            .iter()
                            .map(|p| (at(p.t_ms), Some(p.device_used_bytes)))
                            .collect(),
                    },
                    ChartSeries {
                        label: "the command's processes".into(),
                        kind: SeriesKind::Process,
                        points: d
                            .curve
                            .points
                            .iter()
                            .map(|p| (at(p.t_ms), Some(p.job_bytes)))
                            .collect(),
                    },
                ],
                marks: Vec::new(),
                spans: Vec::new(),
            }
        })
        .collect();
    Chart {
        title: format!(
            "vramctl run: {}",
            vramctl_core::command_line::abbreviate(&report.command.join(" "), 80)
        ),
        time_zone: vramctl_core::wall_time::zone(None).unwrap_or(jiff::tz::TimeZone::UTC),
        panels,
    }
}
