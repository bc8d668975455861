//! `vramctl fit -- CMD {}`: the largest value for which the command fits in GPU memory.
//!
//! Each trial is the command under `run`'s supervision (`vramctl::supervised_run`) in a
//! fresh process of its own group, its output kept; `vramctl::fit_search` chooses the
//! values from the trials' outcomes and peaks. The answer goes to stdout (`--json`: the
//! whole report); progress and the table of trials to stderr.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use vramctl::fit_search::{
    Conclusion, DeviceMeasure, ModelSummary, Next, Outcome, Reason, Search, SearchSettings,
    Strategy,
};
use vramctl::supervised_run::child::{Output, SignalForwarder, libc_signal};
use vramctl::supervised_run::tree::ProcessTree;
use vramctl::supervised_run::{JobReport, JobSpec, RunError, run_job};
use vramctl_observe::live_loop::LiveSampler;
use vramctl_observe::units::bytes;

use super::open_sampler;
use super::run::{STOP_GRACE, wants_agent};
use crate::cli::{FitArgs, FitStrategy, GlobalArgs};
use crate::exit::Exit;

/// Where the value goes in the command's arguments.
const PLACEHOLDER: &str = "{}";
/// The variable that carries it too.
const VALUE_ENV: &str = "VRAMCTL_FIT_VALUE";
/// How long to wait, before a trial, for the last one's memory to come back to the driver.
const SETTLE_LIMIT: Duration = Duration::from_secs(15);

/// One trial in the report.
#[derive(Debug, Serialize)]
struct Trial {
    n: usize,
    value: u64,
    reason: Reason,
    /// `succeeded`, `out-of-memory`, `over-margin` (succeeded, peak above the margin).
    outcome: &'static str,
    wall_s: f64,
    /// NVML's peak of the trial's processes on the GPU where it was highest.
    peak_nvml_bytes: u64,
    peak_reserved_bytes: Option<u64>,
    peak_allocated_bytes: Option<u64>,
    capacity_bytes: Option<u64>,
}

/// The whole report (`--json`).
#[derive(Debug, Serialize)]
struct FitReport {
    /// The largest value that succeeded (and stayed under the margin); `null` if none.
    answer: Option<u64>,
    conclusion: Conclusion,
    strategy: Strategy,
    range: (u64, u64),
    margin: f64,
    tolerance: f64,
    /// The bracket at the end: largest ok, smallest bad.
    bracket: (Option<u64>, Option<u64>),
    trials: Vec<Trial>,
    wall_s: f64,
    model: Option<ModelSummary>,
    agent: bool,
}

/// Runs `fit`.
pub fn run(global: &GlobalArgs, args: &FitArgs) -> anyhow::Result<Exit> {
    let settings = SearchSettings {
        low: args.range.0,
        high: args.range.1,
        margin: args.margin,
        tolerance: args.tolerance,
        strategy: match args.strategy {
            FitStrategy::Model => Strategy::Model,
            FitStrategy::Bisect => Strategy::Bisect,
        },
    };
    let mut search = Search::new(settings.clone())?;
    let until_line = args
        .until_line
        .as_deref()
        .map(|t| vramctl_observe::pattern::compile_regex("--until-line", t))
        .transpose()?;
    if !args
        .command
        .iter()
        .any(|a| a.to_string_lossy().contains(PLACEHOLDER))
    {
        tracing::info!("No {{}} in the command: the value is passed in {VALUE_ENV} only.");
    }
    let mut sampler = open_sampler(global)?;
    let agent = wants_agent(args.watch.agent, args.watch.no_agent, &args.command);
    if let Err(err) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        tracing::warn!(%err, "Could not become a child subreaper.");
    }
    let signals = SignalForwarder::install().context("cannot install signal handlers")?;
    let mut progress = Progress::new(settings.strategy);
    let started = Instant::now();
    let mut trials: Vec<Trial> = Vec::new();
    let conclusion = loop {
        let (value, reason) = match search.next() {
            Next::Try { value, reason } => (value, reason),
            Next::Done(conclusion) => break conclusion,
        };
        settle(&mut sampler);
        let spec = JobSpec {
            argv: with_value(&args.command, value),
            env: vec![(VALUE_ENV.into(), value.to_string().into())],
            agent,
            output: Output::Captured,
            until_line: until_line.clone(),
            timeout: args.trial_timeout,
            interval: args.watch.interval,
            stop_grace: STOP_GRACE,
            reap_orphans: true,
        };
        let n = trials.len() + 1;
        progress.begin(n, value, reason);
        let trial_started = Instant::now();
        let mut on_tick =
            |_: &vramctl_core::types::Snapshot,
             curve: &vramctl::supervised_run::memory_curve::MemoryCurve| {
                progress.tick(trial_started.elapsed(), curve.peak_bytes());
            };
        let report = match run_job(&mut sampler, &spec, &signals, &mut on_tick) {
            Ok(report) => report,
            Err(RunError::Spawn(err)) => {
                progress.clear();
                return Err(anyhow::anyhow!(err));
            }
            Err(err) => return Err(err.into()),
        };
        progress.clear();
        let interrupted = report.signals.iter().any(|s| {
            [
                libc_signal::SIGINT,
                libc_signal::SIGTERM,
                libc_signal::SIGHUP,
            ]
            .contains(s)
        });
        if interrupted {
            print_trials(&trials);
            crate::print_error("interrupted; the trials so far are above");
            return Ok(Exit::Passed(130));
        }
        let measures = measures(&report);
        let outcome = if report.succeeded() {
            Outcome::Succeeded(measures)
        } else if report.oom.is_some() {
            Outcome::OutOfMemory(measures)
        } else {
            print_trials(&trials);
            return Err(other_failure(&report, value));
        };
        let succeeded = matches!(outcome, Outcome::Succeeded(_));
        search.record(value, outcome);
        let ok = search.was_ok(value).unwrap_or(succeeded);
        let trial = Trial {
            n,
            value,
            reason,
            outcome: match (succeeded, ok) {
                (true, true) => "succeeded",
                (true, false) => "over-margin",
                (false, _) => "out-of-memory",
            },
            wall_s: report.wall_s,
            peak_nvml_bytes: report.peak_bytes(),
            peak_reserved_bytes: highest(&report, |f| f.reserved_peak_bytes),
            peak_allocated_bytes: highest(&report, |f| f.allocated_peak_bytes),
            capacity_bytes: report.used_devices().filter_map(|d| d.capacity_bytes).min(),
        };
        progress.done(&trial);
        trials.push(trial);
    };
    let answer = match conclusion {
        Conclusion::Found { value } | Conclusion::TopOfRange { value } => Some(value),
        Conclusion::NothingFits => None,
    };
    let report = FitReport {
        answer,
        conclusion,
        strategy: settings.strategy,
        range: args.range,
        margin: args.margin,
        tolerance: args.tolerance,
        bracket: search.bracket(),
        trials,
        wall_s: started.elapsed().as_secs_f64(),
        model: search.model(),
        agent,
    };
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut stdout, &report)?;
        writeln!(stdout)?;
    } else {
        print_trials(&report.trials);
        summary(&report);
        if let Some(a) = answer {
            writeln!(stdout, "{a}")?;
        }
    }
    Ok(if answer.is_some() {
        Exit::Ok
    } else {
        Exit::ConditionHolds
    })
}

/// The command with every `{}` replaced by `value`.
fn with_value(command: &[OsString], value: u64) -> Vec<OsString> {
    let v = value.to_string();
    command
        .iter()
        .map(|a| match a.to_str() {
            Some(s) if s.contains(PLACEHOLDER) => s.replace(PLACEHOLDER, &v).into(),
            _ => a.clone(),
        })
        .collect()
}

/// Waits until no process of ours is on a GPU any more (the last trial's memory is back
/// with the driver), at most [`SETTLE_LIMIT`]: the next trial's capacity is measured at its
/// start.
fn settle(sampler: &mut LiveSampler) {
    let deadline = Instant::now() + SETTLE_LIMIT;
    let mut tree = ProcessTree::new(std::process::id());
    loop {
        let snapshot = sampler.tick();
        let ours = snapshot
            .devices
            .iter()
            .filter_map(|d| d.reading())
            .flat_map(|r| r.processes.iter().flatten())
            .any(|p| tree.contains(p.pid));
        if !ours || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the search needs from a trial, per GPU it used.
fn measures(report: &JobReport) -> Vec<DeviceMeasure> {
    report
        .used_devices()
        .filter_map(|d| {
            Some(DeviceMeasure {
                uuid: d.curve.uuid.clone(),
                capacity_bytes: d.capacity_bytes?,
                nvml_peak_bytes: (d.curve.peak_bytes > 0).then_some(d.curve.peak_bytes),
                reserved_peak_bytes: d.framework.as_ref().and_then(|f| f.reserved_peak_bytes),
                allocated_peak_bytes: d.framework.as_ref().and_then(|f| f.allocated_peak_bytes),
            })
        })
        .collect()
}

fn highest(
    report: &JobReport,
    figure: fn(&vramctl::supervised_run::FrameworkPeaks) -> Option<u64>,
) -> Option<u64> {
    report
        .devices
        .iter()
        .filter_map(|d| d.framework.as_ref().and_then(figure))
        .max()
}

/// A trial that failed for another reason than memory stops the search: its last lines.
fn other_failure(report: &JobReport, value: u64) -> anyhow::Error {
    let how = match (report.ending, report.exit_code, report.signal) {
        (vramctl::supervised_run::Ending::TimedOut, _, _) => {
            "did not finish within --trial-timeout".to_owned()
        }
        (_, Some(code), _) => format!("exited {code}"),
        (_, None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "failed".to_owned(),
    };
    let tail = report
        .stderr_tail
        .iter()
        .rev()
        .take(5)
        .rev()
        .cloned()
        .collect::<Vec<_>>();
    let last = if tail.is_empty() {
        String::new()
    } else {
        format!("; its stderr ended: {}", tail.join(" | "))
    };
    anyhow::anyhow!(
        "the trial with value {value} {how}, not out of GPU memory, so the search stopped{last}"
    )
}

fn print_trials(trials: &[Trial]) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "{:>3} {:>7} {:<10} {:<14} {:>10} {:>10} {:>10} {:>8}",
        "#", "VALUE", "WHY", "OUTCOME", "PEAK", "RESERVED", "ALLOCATED", "TIME"
    );
    for t in trials {
        let _ = writeln!(
            err,
            "{:>3} {:>7} {:<10} {:<14} {:>10} {:>10} {:>10} {:>8}",
            t.n,
            t.value,
            reason_name(t.reason),
            t.outcome,
            bytes(t.peak_nvml_bytes),
            vramctl_observe::units::opt_bytes(t.peak_reserved_bytes),
            vramctl_observe::units::opt_bytes(t.peak_allocated_bytes),
            vramctl_observe::units::seconds(t.wall_s),
        );
    }
}

fn summary(report: &FitReport) {
    let mut err = std::io::stderr().lock();
    let line = match report.conclusion {
        Conclusion::Found { value } => format!(
            "largest value that fits: {value} (the smallest that did not: {}) · {} trials in {}",
            report
                .bracket
                .1
                .map_or_else(|| "-".to_owned(), |b| b.to_string()),
            report.trials.len(),
            vramctl_observe::units::seconds(report.wall_s)
        ),
        Conclusion::TopOfRange { value } => format!(
            "the top of the range fits: {value}; raise --range to search further · {} trials in {}",
            report.trials.len(),
            vramctl_observe::units::seconds(report.wall_s)
        ),
        Conclusion::NothingFits => format!(
            "nothing fits: {} ran out of memory already · {} trials in {}",
            report.range.0,
            report.trials.len(),
            vramctl_observe::units::seconds(report.wall_s)
        ),
    };
    let _ = writeln!(err, "{line}");
}

fn reason_name(r: Reason) -> &'static str {
    match r {
        Reason::Calibrate => "calibrate",
        Reason::Predicted => "predicted",
        Reason::Confirm => "confirm",
        Reason::Gallop => "gallop",
        Reason::Bisect => "bisect",
    }
}

/// The progress display on stderr: one line rewritten in place on a terminal, one line
/// per trial otherwise.
struct Progress {
    terminal: bool,
    strategy: Strategy,
    line: String,
    last_draw: Option<Instant>,
    trial_times_s: Vec<f64>,
    n: usize,
    value: u64,
    reason: Option<Reason>,
}

impl Progress {
    fn new(strategy: Strategy) -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            strategy,
            line: String::new(),
            last_draw: None,
            trial_times_s: Vec::new(),
            n: 0,
            value: 0,
            reason: None,
        }
    }

    fn begin(&mut self, n: usize, value: u64, reason: Reason) {
        self.n = n;
        self.value = value;
        self.reason = Some(reason);
        self.last_draw = None;
    }

    /// Trials the search will probably still need after this one: the model aims to be done
    /// in 4, bisection in about log2 of the range.
    fn eta(&self) -> Option<f64> {
        let mean = self.trial_times_s.iter().sum::<f64>() / self.trial_times_s.len().max(1) as f64;
        if self.trial_times_s.is_empty() {
            return None;
        }
        let left = match self.strategy {
            Strategy::Model => 4usize.saturating_sub(self.n),
            Strategy::Bisect => 12usize.saturating_sub(self.n),
        };
        Some(mean * left as f64)
    }

    fn tick(&mut self, running: Duration, peak_bytes: u64) {
        if !self.terminal
            || self
                .last_draw
                .is_some_and(|t| t.elapsed() < Duration::from_millis(250))
        {
            return;
        }
        self.last_draw = Some(Instant::now());
        let eta = self
            .eta()
            .map(|s| {
                format!(
                    " · about {} more after this",
                    vramctl_observe::units::seconds(s)
                )
            })
            .unwrap_or_default();
        self.line = format!(
            "trial {} · value {} ({}) · {} · peak {}{eta}",
            self.n,
            self.value,
            self.reason.map_or("", reason_name),
            vramctl_observe::units::seconds(running.as_secs_f64()),
            bytes(peak_bytes),
        );
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{}", self.line);
        let _ = err.flush();
    }

    fn clear(&mut self) {
        if self.terminal && !self.line.is_empty() {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.line.clear();
        }
    }

    fn done(&mut self, trial: &Trial) {
        self.trial_times_s.push(trial.wall_s);
        let mut err = std::io::stderr().lock();
        let _ = writeln!(
            err,
            "trial {} · value {} ({}) · {} · peak {} · {}",
            trial.n,
            trial.value,
            reason_name(trial.reason),
            trial.outcome,
            bytes(trial.peak_nvml_bytes),
            vramctl_observe::units::seconds(trial.wall_s),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_gets_the_value() {
        let cmd: Vec<OsString> = ["python", "t.py", "--batch", "{}", "--name=run-{}"]
            .iter()
            .map(OsString::from)
            .collect();
        let got = with_value(&cmd, 48);
        assert_eq!(got[3], "48");
        assert_eq!(got[4], "--name=run-48");
        assert_eq!(got[0], "python");
    }
}
