//! `vramctl fit -- CMD {}`: the largest value for which the command fits in GPU memory.
//!
//! `vramctl_run::fit_trials` runs the trials (each one the command under `run`'s
//! supervision, `vramctl_run::job`) as `vramctl_run::fit_search` chooses their values; this
//! command configures it and prints. The answer goes to stdout (`--json`: the
//! whole report); progress and the table of trials to stderr.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use vramctl_observe::units::bytes;
use vramctl_run::fit_search::{Conclusion, ModelSummary, Reason, Search, SearchSettings, Strategy};
use vramctl_run::fit_trials::{
    PLACEHOLDER, PredictorReport, StopCause, Stopped, SupervisedTrials, Trial, TrialWatcher,
    VALUE_ENV, run_trials,
};
use vramctl_run::job::RunError;
use vramctl_run::job::child::SignalForwarder;

use super::open_sampler;
use super::run::{STOP_GRACE, wants_agent};
use crate::cli::{FitArgs, FitStrategy, GlobalArgs};
use crate::exit::Exit;
use crate::output::emit::{Format, Lines, emit};

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
    /// Which predictor chose the trials, and why the traces were not used.
    predictor: PredictorReport,
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
    let mut runner = SupervisedTrials {
        sampler: &mut sampler,
        signals: &signals,
        command: args.command.clone(),
        agent,
        until_line,
        timeout: args.trial_timeout,
        interval: args.watch.interval,
        stop_grace: STOP_GRACE,
        daemon: Some(vramctl_observe::daemon_socket::client::AskOptions {
            nvml_library: global.nvml_lib.clone(),
            process_stat: false,
            accept_mapped: true,
        }),
        tracing: false,
    };
    let done = match run_trials(&mut search, &mut runner, &mut progress) {
        Ok(done) => done,
        Err(Stopped { trials, cause }) => {
            return match cause {
                StopCause::Interrupted => {
                    print_trials(&trials);
                    crate::print_error("interrupted; the trials so far are above");
                    Ok(Exit::Passed(130))
                }
                StopCause::Failed(failed) => {
                    print_trials(&trials);
                    Err(failed.into())
                }
                StopCause::Runner(RunError::Spawn(err)) => Err(anyhow::anyhow!(err)),
                StopCause::Runner(err) => Err(err.into()),
            };
        }
    };
    let answer = done.answer();
    let report = FitReport {
        answer,
        conclusion: done.conclusion,
        strategy: settings.strategy,
        range: args.range,
        margin: args.margin,
        tolerance: args.tolerance,
        bracket: search.bracket(),
        trials: done.trials,
        wall_s: started.elapsed().as_secs_f64(),
        model: search.model(),
        predictor: done.predictor,
        agent,
    };
    let mut stdout = std::io::stdout().lock();
    let format = Format::from_json_flag(args.json, Format::JsonPretty);
    if format == Format::Text {
        // The trials and the summary go to stderr; stdout holds only the answer, so that
        // `BATCH=$(vramctl fit ...)` reads a number.
        print_trials(&report.trials);
        summary(&report);
    }
    emit(
        &mut stdout,
        format,
        || &report,
        || Lines::Styled(answer.into_iter().collect()),
    )?;
    Ok(if answer.is_some() {
        Exit::Ok
    } else {
        Exit::ConditionHolds
    })
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
        Conclusion::Bounded { value, bound } => format!(
            "largest value that fits: {value} (none above {bound} can: the allocated peaks \
             alone would not fit) · {} trials in {}",
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
    if let Some(p) = predictor_line(&report.predictor) {
        let _ = writeln!(err, "{p}");
    }
}

/// Which predictor chose the trials, in one line (none for `--strategy bisect`).
fn predictor_line(p: &PredictorReport) -> Option<String> {
    match (p.used, &p.trace, &p.fallback) {
        ("trace", Some(t), _) => Some(format!(
            "predictor: allocator traces (edge predicted at {}; allocations {} fixed, {} ∝ value, \
             {} ∝ value², {} affine, {} unmatched; {} outside the pool)",
            t.value,
            t.fixed,
            t.linear,
            t.quadratic,
            t.affine,
            t.unmatched,
            bytes(t.other_bytes)
        )),
        ("line", _, Some(why)) => Some(format!(
            "predictor: line through the NVML peaks, because {}",
            vramctl_core::untrusted::escape(why)
        )),
        ("line", _, None) => Some("predictor: line through the NVML peaks".to_owned()),
        _ => None,
    }
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
}

impl TrialWatcher for Progress {
    fn begin(&mut self, n: usize, value: u64, reason: Reason) {
        self.n = n;
        self.value = value;
        self.reason = Some(reason);
        self.last_draw = None;
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

    fn ended(&mut self) {
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
