//! `vramctl fit`'s trial loop: ask the search for a value, run a trial at it, record what
//! it measured, until the search concludes or a trial stops it (issue 30).
//!
//! The loop ([`run_trials`]) does no I/O of its own: each trial goes through a
//! [`TrialRunner`] — [`SupervisedTrials`] runs the command as a supervised job, tests run
//! scripted trials — and what a display needs goes to a [`TrialWatcher`]. Its stop rules:
//! the search's conclusion; a trial that failed for another reason than GPU memory
//! ([`TrialFailed`]: a search over a broken command would only find its failures); an
//! interrupted trial; an error of the runner. Every stop keeps the trials so far.

mod supervised;

pub use supervised::{PLACEHOLDER, SupervisedTrials, VALUE_ENV};

use std::time::Duration;

use serde::Serialize;

use crate::fit_search::{
    Conclusion, DeviceMeasure, Next, Outcome, Reason, Search, SearchSettings, Strategy,
};
use crate::fit_trace::{self, AllocTrace, Limits, TracePrediction, TracedTrial};

/// What one trial that ran to its end measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub wall_s: f64,
    /// Per GPU the trial used: what the search decides on.
    pub devices: Vec<DeviceMeasure>,
    /// NVML's peak of the trial's processes on the GPU where it was highest.
    pub peak_nvml_bytes: u64,
    /// The framework's peaks (the agent), highest over the GPUs.
    pub peak_reserved_bytes: Option<u64>,
    pub peak_allocated_bytes: Option<u64>,
    /// The smallest capacity over the GPUs the trial used.
    pub capacity_bytes: Option<u64>,
    /// The allocator's trace per GPU (when the runner was asked to record it), or why
    /// there is none.
    pub traces: Result<Vec<DeviceTrace>, String>,
}

/// One GPU's allocator trace in a trial.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceTrace {
    /// The GPU's UUID as the agent gave it (lower case, without NVML's `GPU-`), if known.
    pub uuid: Option<String>,
    pub trace: AllocTrace,
}

/// How a trial ended, as the runner saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum TrialOutcome {
    Succeeded(Measured),
    OutOfMemory(Measured),
    /// It failed for another reason than GPU memory: `how` ("exited 1", "was killed by
    /// signal 9", ...) and the last lines of its stderr.
    Failed {
        how: String,
        stderr_tail: Vec<String>,
    },
    /// The user interrupted it (SIGINT, SIGTERM or SIGHUP passed on to the trial).
    Interrupted,
}

/// Runs one trial at a value.
pub trait TrialRunner {
    type Error;

    /// Runs the command at `value` to its end; `on_tick(running, peak_bytes)` while it runs
    /// (time since it started, its peak so far).
    ///
    /// # Errors
    /// When the trial could not be run at all (the command did not start, ...).
    fn run_trial(
        &mut self,
        value: u64,
        on_tick: &mut dyn FnMut(Duration, u64),
    ) -> Result<TrialOutcome, Self::Error>;

    /// Whether the next trials record the allocator's trace ([`Measured::traces`]): the
    /// loop asks for it until the trace predictor has its two trials, and not after (the
    /// recording costs host memory and the dump seconds at exit).
    fn set_tracing(&mut self, _on: bool) {}
}

/// What the loop tells a display (each method does nothing unless implemented).
pub trait TrialWatcher {
    /// Trial `n` (from 1) starts at `value`.
    fn begin(&mut self, _n: usize, _value: u64, _reason: Reason) {}
    /// The running trial's peak so far.
    fn tick(&mut self, _running: Duration, _peak_bytes: u64) {}
    /// The runner returned, whatever it returned: before anything else is printed.
    fn ended(&mut self) {}
    /// The trial that ran to its end, as reported.
    fn done(&mut self, _trial: &Trial) {}
}

/// One trial in the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trial {
    pub n: usize,
    pub value: u64,
    pub reason: Reason,
    /// `succeeded`, `out-of-memory`, `over-margin` (succeeded, peak above the margin).
    pub outcome: &'static str,
    pub wall_s: f64,
    /// NVML's peak of the trial's processes on the GPU where it was highest.
    pub peak_nvml_bytes: u64,
    pub peak_reserved_bytes: Option<u64>,
    pub peak_allocated_bytes: Option<u64>,
    pub capacity_bytes: Option<u64>,
}

/// The search concluded.
#[derive(Debug, Clone, PartialEq)]
pub struct Trials {
    pub conclusion: Conclusion,
    pub trials: Vec<Trial>,
    /// Which predictor chose the trials, and why the traces were not used if they were not.
    pub predictor: PredictorReport,
}

/// Which predictor the search used (docs/fit.md, "How the search works").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PredictorReport {
    /// `trace` (the allocator traces of two trials, replayed), `line` (the fit of NVML's
    /// peaks: the fallback) or `bisect` (`--strategy bisect`).
    pub used: &'static str,
    /// The trace predictor's answer (the binding GPU's), when it made one.
    pub trace: Option<TracePrediction>,
    /// Why the traces were not used (`line` only).
    pub fallback: Option<String>,
}

/// The calibration trials the trace predictor is fed: value, traces, measures.
type Traced = (u64, Vec<DeviceTrace>, Vec<DeviceMeasure>);

/// The trace predictor over the two traced trials (smaller value first): per GPU of the
/// later trial, the smallest prediction over them.
fn trace_predict(traced: &[Traced], settings: &SearchSettings) -> Result<TracePrediction, String> {
    let mut two: Vec<&Traced> = traced.iter().collect();
    two.sort_by_key(|t| t.0);
    let [a, b] = two[..] else {
        return Err("fewer than two traced trials".to_owned());
    };
    let latest = traced.last().map_or(&b.2, |t| &t.2);
    if latest.is_empty() {
        return Err("the trials measured no GPU".to_owned());
    }
    let find = |traces: &'_ [DeviceTrace], uuid: &str| -> Option<usize> {
        let wanted = crate::job::normalize_uuid(uuid);
        traces
            .iter()
            .position(|t| t.uuid.as_deref().map(crate::job::normalize_uuid) == Some(wanted.clone()))
            .or_else(|| (traces.len() == 1 && latest.len() == 1).then_some(0))
    };
    let mut best: Option<TracePrediction> = None;
    for device in latest {
        let measure_of = |t: &Traced| t.2.iter().find(|d| d.uuid == device.uuid).cloned();
        let (Some(ia), Some(ib)) = (find(&a.1, &device.uuid), find(&b.1, &device.uuid)) else {
            return Err(format!(
                "no allocator trace for {} in both trials",
                device.uuid
            ));
        };
        let (ma, mb) = (measure_of(a), measure_of(b));
        let usable_bytes = (settings.margin > 0.0).then(|| {
            #[allow(
                clippy::cast_precision_loss,
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss
            )]
            let usable = ((1.0 - settings.margin) * device.capacity_bytes as f64).floor() as u64;
            usable
        });
        let p = fit_trace::predict(
            TracedTrial {
                value: a.0,
                trace: &a.1[ia].trace,
                reserved_peak_bytes: ma.as_ref().and_then(|m| m.reserved_peak_bytes),
                nvml_peak_bytes: ma.as_ref().and_then(|m| m.nvml_peak_bytes),
            },
            TracedTrial {
                value: b.0,
                trace: &b.1[ib].trace,
                reserved_peak_bytes: mb.as_ref().and_then(|m| m.reserved_peak_bytes),
                nvml_peak_bytes: mb.as_ref().and_then(|m| m.nvml_peak_bytes),
            },
            Limits {
                capacity_bytes: device.capacity_bytes,
                usable_bytes,
                high: settings.high,
            },
        )
        .map_err(|e| e.to_string())?;
        if best.as_ref().is_none_or(|q| p.value < q.value) {
            best = Some(p);
        }
    }
    best.ok_or_else(|| "the trials measured no GPU".to_owned())
}

impl Trials {
    /// The largest value that succeeded (and stayed under the margin), if any.
    pub fn answer(&self) -> Option<u64> {
        self.conclusion.value()
    }
}

/// The loop stopped before the search concluded; `trials` are those that ran to their end.
#[derive(Debug)]
pub struct Stopped<E> {
    pub trials: Vec<Trial>,
    pub cause: StopCause<E>,
}

/// Why the loop stopped early.
#[derive(Debug)]
pub enum StopCause<E> {
    Interrupted,
    Failed(TrialFailed),
    Runner(E),
}

/// A trial failed for another reason than GPU memory, which stops the search.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the trial with value {value} {how}, not out of GPU memory, so the search stopped{}",
    stderr_ending(stderr_tail)
)]
pub struct TrialFailed {
    pub value: u64,
    pub how: String,
    pub stderr_tail: Vec<String>,
}

fn stderr_ending(tail: &[String]) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!("; its stderr ended: {}", tail.join(" | "))
    }
}

/// Runs trials as `search` proposes them until it concludes.
///
/// # Errors
/// [`Stopped`] when a trial failed for another reason than memory, was interrupted, or the
/// runner could not run it.
pub fn run_trials<R: TrialRunner>(
    search: &mut Search,
    runner: &mut R,
    watcher: &mut dyn TrialWatcher,
) -> Result<Trials, Stopped<R::Error>> {
    let mut trials: Vec<Trial> = Vec::new();
    let model = search.settings().strategy == Strategy::Model;
    let mut predictor = PredictorReport {
        used: if model { "line" } else { "bisect" },
        trace: None,
        fallback: None,
    };
    // Succeeded trials with traces, until the trace predictor has decided.
    let mut traced: Vec<Traced> = Vec::new();
    let mut tracing = model;
    let conclusion = loop {
        let (value, reason) = match search.next() {
            Next::Try { value, reason } => (value, reason),
            Next::Done(conclusion) => break conclusion,
        };
        let n = trials.len() + 1;
        watcher.begin(n, value, reason);
        runner.set_tracing(tracing);
        let result = runner.run_trial(value, &mut |running, peak| watcher.tick(running, peak));
        watcher.ended();
        let (measured, succeeded) = match result {
            Ok(TrialOutcome::Succeeded(m)) => (m, true),
            Ok(TrialOutcome::OutOfMemory(m)) => (m, false),
            Ok(TrialOutcome::Failed { how, stderr_tail }) => {
                let cause = StopCause::Failed(TrialFailed {
                    value,
                    how,
                    stderr_tail,
                });
                return Err(Stopped { trials, cause });
            }
            Ok(TrialOutcome::Interrupted) => {
                let cause = StopCause::Interrupted;
                return Err(Stopped { trials, cause });
            }
            Err(err) => {
                let cause = StopCause::Runner(err);
                return Err(Stopped { trials, cause });
            }
        };
        let Measured {
            wall_s,
            devices,
            peak_nvml_bytes,
            peak_reserved_bytes,
            peak_allocated_bytes,
            capacity_bytes,
            traces,
        } = measured;
        // Recorded first, so that the search matches the trial with what it proposed.
        let traced_devices = (tracing && succeeded).then(|| devices.clone());
        search.record(
            value,
            if succeeded {
                Outcome::Succeeded(devices)
            } else {
                Outcome::OutOfMemory(devices)
            },
        );
        if let Some(devices) = traced_devices {
            match traces {
                Ok(t) => {
                    traced.push((value, t, devices));
                    search.set_traced_calibration();
                }
                Err(why) => {
                    tracing = false;
                    predictor.fallback = Some(format!(
                        "trial {n} (value {value}) has no allocator trace: {why}"
                    ));
                }
            }
            if traced.len() == 2 {
                tracing = false;
                match trace_predict(&traced, search.settings()) {
                    Ok(p) => {
                        search.set_trace_prediction(p.value);
                        predictor.used = "trace";
                        predictor.trace = Some(p);
                    }
                    Err(why) => predictor.fallback = Some(why),
                }
                traced.clear();
            }
        }
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
            wall_s,
            peak_nvml_bytes,
            peak_reserved_bytes,
            peak_allocated_bytes,
            capacity_bytes,
        };
        watcher.done(&trial);
        trials.push(trial);
    };
    if tracing && model && predictor.fallback.is_none() {
        predictor.fallback = Some(format!(
            "the search ended before two trials succeeded with traces ({} did)",
            traced.len()
        ));
    }
    Ok(Trials {
        conclusion,
        trials,
        predictor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fit_search::{SearchSettings, Strategy};

    const MIB: u64 = 1 << 20;
    const CAPACITY: u64 = 100 * 1024 * MIB;
    /// What each step of the value adds: the whole range (to 4096) would need 64 GiB.
    const PER_VALUE: u64 = 16 * MIB;

    /// A job needing `fixed + per_value·value` bytes, out of memory above [`CAPACITY`]; its
    /// trial `fail_at` (from 1) fails for another reason instead, `interrupt_at` is
    /// interrupted, `error_at` cannot be run.
    struct Scripted {
        fixed_bytes: u64,
        per_value_bytes: u64,
        tried: Vec<u64>,
        fail_at: Option<usize>,
        interrupt_at: Option<usize>,
        error_at: Option<usize>,
    }

    impl Scripted {
        /// Fits up to `edge` ([`PER_VALUE`] per value, the rest of the capacity fixed).
        fn with_edge(edge: u64) -> Self {
            Self {
                fixed_bytes: CAPACITY - edge * PER_VALUE,
                per_value_bytes: PER_VALUE,
                tried: Vec::new(),
                fail_at: None,
                interrupt_at: None,
                error_at: None,
            }
        }
    }

    impl TrialRunner for Scripted {
        type Error = String;

        fn run_trial(
            &mut self,
            value: u64,
            on_tick: &mut dyn FnMut(Duration, u64),
        ) -> Result<TrialOutcome, String> {
            self.tried.push(value);
            let n = Some(self.tried.len());
            if n == self.error_at {
                return Err(format!("cannot start the trial at {value}"));
            }
            let need = self.fixed_bytes + self.per_value_bytes * value;
            let seen = need.min(CAPACITY);
            on_tick(Duration::from_millis(20), seen / 2);
            on_tick(Duration::from_millis(40), seen);
            if n == self.interrupt_at {
                return Ok(TrialOutcome::Interrupted);
            }
            if n == self.fail_at {
                return Ok(TrialOutcome::Failed {
                    how: "exited 1".to_owned(),
                    stderr_tail: vec!["Traceback".to_owned(), "KeyError: 'x'".to_owned()],
                });
            }
            let measured = Measured {
                wall_s: 1.5,
                devices: vec![DeviceMeasure {
                    uuid: "GPU-0".to_owned(),
                    capacity_bytes: CAPACITY,
                    nvml_peak_bytes: Some(seen),
                    reserved_peak_bytes: None,
                    allocated_peak_bytes: None,
                }],
                peak_nvml_bytes: seen,
                peak_reserved_bytes: None,
                peak_allocated_bytes: None,
                capacity_bytes: Some(CAPACITY),
                traces: Err("scripted without traces".to_owned()),
            };
            Ok(if need > CAPACITY {
                TrialOutcome::OutOfMemory(measured)
            } else {
                TrialOutcome::Succeeded(measured)
            })
        }
    }

    /// A job whose allocations are a synthetic trace (`fit_trace::synthetic`): it fits
    /// when its own trace, replayed under the capacity less a context, does; each trial
    /// hands over its trace (unless `traced` is off, or `chunk_above` changes the program
    /// above a value).
    struct TracedJob {
        job: crate::fit_trace::synthetic::Job,
        capacity_bytes: u64,
        traced: bool,
        chunk_above: Option<u64>,
        tried: Vec<u64>,
        tracing_asked: Vec<bool>,
    }

    const CONTEXT: u64 = 600 * MIB;

    impl TracedJob {
        fn new(job: crate::fit_trace::synthetic::Job, capacity_bytes: u64) -> Self {
            Self {
                job,
                capacity_bytes,
                traced: true,
                chunk_above: None,
                tried: Vec::new(),
                tracing_asked: Vec::new(),
            }
        }
    }

    impl TrialRunner for TracedJob {
        type Error = String;

        fn run_trial(
            &mut self,
            value: u64,
            _on_tick: &mut dyn FnMut(Duration, u64),
        ) -> Result<TrialOutcome, String> {
            use crate::fit_trace::synthetic::{run, trace};
            self.tried.push(value);
            let ran = run(self.job, value, self.capacity_bytes - CONTEXT);
            let nvml = ran.reserved_peak_bytes + CONTEXT;
            let traces = if !self.traced || !self.tracing_asked.last().copied().unwrap_or(false) {
                Err("scripted without traces".to_owned())
            } else {
                let mut file = trace(self.job, value);
                if self.chunk_above.is_some_and(|c| value > c) {
                    for f in &mut file.frames {
                        f.push_str(" chunked");
                    }
                }
                Ok(vec![DeviceTrace {
                    uuid: file.uuid.clone(),
                    trace: AllocTrace::from_file(&file).map_err(|e| e.clone())?,
                }])
            };
            let measured = Measured {
                wall_s: 10.0,
                devices: vec![DeviceMeasure {
                    uuid: "GPU-00000000-0000-0000-0000-000000000000".to_owned(),
                    capacity_bytes: self.capacity_bytes,
                    nvml_peak_bytes: Some(nvml),
                    reserved_peak_bytes: Some(ran.reserved_peak_bytes),
                    allocated_peak_bytes: None,
                }],
                peak_nvml_bytes: nvml,
                peak_reserved_bytes: Some(ran.reserved_peak_bytes),
                peak_allocated_bytes: None,
                capacity_bytes: Some(self.capacity_bytes),
                traces,
            };
            Ok(if ran.fits {
                TrialOutcome::Succeeded(measured)
            } else {
                TrialOutcome::OutOfMemory(measured)
            })
        }

        fn set_tracing(&mut self, on: bool) {
            self.tracing_asked.push(on);
        }
    }

    #[test]
    fn the_trace_predictor_finds_the_edge_in_at_most_four_trials_never_above_it() {
        use crate::fit_trace::synthetic::{Job, true_edge};
        const GIB: u64 = 1 << 30;
        let seq_len = Job {
            layers: 4,
            act_per_value: 64 * 1024,
            scores_per_value2: 32,
            weight_bytes: 8 * MIB,
            small_bytes: 1024,
        };
        for (job, capacity, low) in [
            (Job::gpt_like(), 20 * GIB, 1),
            (Job::gpt_like(), 80 * GIB, 1),
            (Job::gpt_like(), 140 * GIB, 1),
            (seq_len, 8 * GIB, 128),
            (seq_len, 40 * GIB, 128),
            // Attention scores dominate: the linear rule's second calibration (≈ 233)
            // would need ~212 GiB of scores alone.
            (
                Job {
                    layers: 12,
                    act_per_value: 6 * MIB,
                    scores_per_value2: 4 * MIB,
                    weight_bytes: 28 * MIB,
                    small_bytes: 3000,
                },
                140 * GIB,
                8,
            ),
        ] {
            let truth = true_edge(job, capacity - CONTEXT);
            let mut runner = TracedJob::new(job, capacity);
            let mut s = Search::new(SearchSettings {
                low,
                high: 1 << 20,
                margin: 0.0,
                tolerance: 0.02,
                strategy: Strategy::Model,
            })
            .expect("valid");
            let done = run_trials(&mut s, &mut runner, &mut Events::default()).expect("concludes");
            let answer = done.answer().expect("fits");
            assert_eq!(done.predictor.used, "trace", "{:?}", done.predictor);
            assert!(answer <= truth, "{answer} above the truth {truth}");
            assert!(
                (truth - answer) as f64 <= 0.02 * truth as f64,
                "{answer} more than 2 % under {truth}"
            );
            assert!(
                done.trials.len() <= 4,
                "{:?} for a truth of {truth}",
                runner.tried
            );
            // Both calibrations fit, quadratic jobs included.
            assert!(
                done.trials[..2].iter().all(|t| t.outcome == "succeeded"),
                "{:?} for a truth of {truth}",
                runner.tried
            );
            // Traces only until the predictor had its two trials.
            assert_eq!(runner.tracing_asked[..2], [true, true]);
            assert!(runner.tracing_asked[2..].iter().all(|&on| !on));
        }
    }

    #[test]
    fn without_traces_or_when_they_do_not_line_up_the_line_is_used_and_the_report_says_why() {
        use crate::fit_trace::synthetic::Job;
        const GIB: u64 = 1 << 30;
        let mut runner = TracedJob::new(Job::gpt_like(), 80 * GIB);
        runner.traced = false;
        let done = run_trials(
            &mut search(Strategy::Model, 0.02, 0.0),
            &mut runner,
            &mut Events::default(),
        )
        .expect("concludes");
        assert_eq!(done.predictor.used, "line");
        assert_eq!(
            done.predictor.fallback.as_deref(),
            Some("trial 1 (value 8) has no allocator trace: scripted without traces")
        );
        assert!(done.answer().is_some());
        // Tracing stops being asked for once a trial had none.
        assert!(runner.tracing_asked[1..].iter().all(|&on| !on));

        let mut runner = TracedJob::new(Job::gpt_like(), 80 * GIB);
        runner.chunk_above = Some(8);
        let done = run_trials(
            &mut search(Strategy::Model, 0.02, 0.0),
            &mut runner,
            &mut Events::default(),
        )
        .expect("concludes");
        assert_eq!(done.predictor.used, "line");
        let why = done.predictor.fallback.expect("a reason");
        assert!(why.starts_with("the traces do not line up: "), "{why}");

        // Bisection never traces and says so.
        let mut runner = TracedJob::new(Job::gpt_like(), 80 * GIB);
        let done = run_trials(
            &mut search(Strategy::Bisect, 0.02, 0.0),
            &mut runner,
            &mut Events::default(),
        )
        .expect("concludes");
        assert_eq!(done.predictor.used, "bisect");
        assert!(runner.tracing_asked.iter().all(|&on| !on));
    }

    /// What the watcher was told, in order.
    #[derive(Default)]
    struct Events(Vec<String>);

    impl TrialWatcher for Events {
        fn begin(&mut self, n: usize, value: u64, _reason: Reason) {
            self.0.push(format!("begin {n} {value}"));
        }
        fn tick(&mut self, running: Duration, peak_bytes: u64) {
            self.0.push(format!(
                "tick {}ms {}",
                running.as_millis(),
                peak_bytes / MIB
            ));
        }
        fn ended(&mut self) {
            self.0.push("ended".to_owned());
        }
        fn done(&mut self, trial: &Trial) {
            self.0.push(format!("done {} {}", trial.n, trial.outcome));
        }
    }

    fn search(strategy: Strategy, tolerance: f64, margin: f64) -> Search {
        Search::new(SearchSettings {
            low: 1,
            high: 4096,
            margin,
            tolerance,
            strategy,
        })
        .expect("valid settings")
    }

    #[test]
    fn the_loop_finds_the_edge_of_a_job_linear_in_the_value() {
        for strategy in [Strategy::Model, Strategy::Bisect] {
            for edge in [1, 2, 98, 1000, 4095] {
                let mut runner = Scripted::with_edge(edge);
                let done = run_trials(
                    &mut search(strategy, 0.0, 0.0),
                    &mut runner,
                    &mut Events::default(),
                )
                .expect("concludes");
                assert_eq!(
                    done.conclusion,
                    Conclusion::Found { value: edge },
                    "{strategy:?}, edge {edge}"
                );
                assert_eq!(done.answer(), Some(edge));
                // One reported trial per run, numbered in order, each outcome the job's.
                assert_eq!(
                    done.trials.iter().map(|t| t.value).collect::<Vec<_>>(),
                    runner.tried
                );
                for (i, t) in done.trials.iter().enumerate() {
                    assert_eq!(t.n, i + 1);
                    let expected = if t.value <= edge {
                        "succeeded"
                    } else {
                        "out-of-memory"
                    };
                    assert_eq!(t.outcome, expected, "{strategy:?}, edge {edge}, {t:?}");
                }
            }
        }
    }

    #[test]
    fn the_ends_of_the_range_conclude_top_of_range_and_nothing_fits() {
        let done = run_trials(
            &mut search(Strategy::Bisect, 0.0, 0.0),
            &mut Scripted::with_edge(5000),
            &mut Events::default(),
        )
        .expect("concludes");
        assert_eq!(done.conclusion, Conclusion::TopOfRange { value: 4096 });
        assert_eq!(done.answer(), Some(4096));

        // Nothing fits: the fixed part alone fills the GPU.
        let mut runner = Scripted::with_edge(1);
        runner.fixed_bytes = CAPACITY;
        let done = run_trials(
            &mut search(Strategy::Model, 0.02, 0.0),
            &mut runner,
            &mut Events::default(),
        )
        .expect("concludes");
        assert_eq!(done.conclusion, Conclusion::NothingFits);
        assert_eq!(done.answer(), None);
    }

    #[test]
    fn trial_counts_stay_within_bounds_and_no_value_is_tried_twice() {
        for edge in [1, 3, 98, 1000, 2047, 4095] {
            for (strategy, tolerance, most) in [
                // low, high, then log2(4096) = 12 midpoints.
                (Strategy::Bisect, 0.0, 14),
                // The model on a straight line: two calibrations, the prediction and its
                // confirmation, and a step either side at most.
                (Strategy::Model, 0.02, 6),
            ] {
                let mut runner = Scripted::with_edge(edge);
                let done = run_trials(
                    &mut search(strategy, tolerance, 0.0),
                    &mut runner,
                    &mut Events::default(),
                )
                .expect("concludes");
                assert!(
                    done.trials.len() <= most,
                    "{strategy:?}, edge {edge}: {} trials {:?}",
                    done.trials.len(),
                    runner.tried
                );
                let mut values = runner.tried.clone();
                values.sort_unstable();
                values.dedup();
                assert_eq!(values.len(), runner.tried.len(), "{:?}", runner.tried);
            }
        }
    }

    #[test]
    fn a_success_above_the_margin_is_reported_over_margin_and_is_not_the_answer() {
        // 10 % margin: 10 GiB = 640 values kept free; the job fits the GPU up to 1000, the
        // margin up to 360.
        let done = run_trials(
            &mut search(Strategy::Bisect, 0.0, 0.10),
            &mut Scripted::with_edge(1000),
            &mut Events::default(),
        )
        .expect("concludes");
        assert_eq!(done.conclusion, Conclusion::Found { value: 360 });
        for t in &done.trials {
            let expected = match t.value {
                ..=360 => "succeeded",
                361..=1000 => "over-margin",
                _ => "out-of-memory",
            };
            assert_eq!(t.outcome, expected, "{t:?}");
            assert_eq!(t.capacity_bytes, Some(CAPACITY));
            assert!((t.wall_s - 1.5).abs() < f64::EPSILON);
        }
        assert!(done.trials.iter().any(|t| t.outcome == "over-margin"));
    }

    #[test]
    fn a_trial_failing_for_another_reason_than_memory_stops_the_loop_with_its_error() {
        let mut runner = Scripted::with_edge(98);
        runner.fail_at = Some(3);
        let mut events = Events::default();
        let stopped = run_trials(
            &mut search(Strategy::Bisect, 0.0, 0.0),
            &mut runner,
            &mut events,
        )
        .expect_err("stops");
        assert_eq!(runner.tried.len(), 3, "no trial after the failure");
        assert_eq!(stopped.trials.len(), 2, "the trials before it are kept");
        let StopCause::Failed(failed) = stopped.cause else {
            panic!("stopped for {:?}", stopped.cause);
        };
        assert_eq!(failed.value, runner.tried[2]);
        assert_eq!(
            failed.to_string(),
            format!(
                "the trial with value {} exited 1, not out of GPU memory, so the search \
                 stopped; its stderr ended: Traceback | KeyError: 'x'",
                runner.tried[2]
            )
        );
        // The failed trial is begun and ended, never reported done.
        let value = runner.tried[2];
        let need_mib = (CAPACITY - 98 * PER_VALUE + value * PER_VALUE).min(CAPACITY) / MIB;
        assert_eq!(
            events.0[events.0.len() - 4..],
            [
                format!("begin 3 {value}"),
                format!("tick 20ms {}", need_mib / 2),
                format!("tick 40ms {need_mib}"),
                "ended".to_owned(),
            ]
        );
    }

    #[test]
    fn a_failure_without_stderr_says_how_only() {
        let failed = TrialFailed {
            value: 64,
            how: "did not finish within --trial-timeout".to_owned(),
            stderr_tail: Vec::new(),
        };
        assert_eq!(
            failed.to_string(),
            "the trial with value 64 did not finish within --trial-timeout, not out of GPU \
             memory, so the search stopped"
        );
    }

    #[test]
    fn an_interrupted_trial_or_a_runner_error_stops_the_loop_keeping_the_trials_before_it() {
        let mut runner = Scripted::with_edge(98);
        runner.interrupt_at = Some(2);
        let stopped = run_trials(
            &mut search(Strategy::Model, 0.02, 0.0),
            &mut runner,
            &mut Events::default(),
        )
        .expect_err("stops");
        assert!(matches!(stopped.cause, StopCause::Interrupted));
        assert_eq!(stopped.trials.len(), 1);
        assert_eq!(runner.tried.len(), 2);

        let mut runner = Scripted::with_edge(98);
        runner.error_at = Some(1);
        let stopped = run_trials(
            &mut search(Strategy::Model, 0.02, 0.0),
            &mut runner,
            &mut Events::default(),
        )
        .expect_err("stops");
        assert!(
            matches!(&stopped.cause, StopCause::Runner(e)
                if *e == format!("cannot start the trial at {}", runner.tried[0])),
            "{:?}",
            stopped.cause
        );
        assert!(stopped.trials.is_empty());
    }

    #[test]
    fn the_watcher_sees_each_trial_begin_tick_end_and_be_reported() {
        let mut events = Events::default();
        let done = run_trials(
            &mut search(Strategy::Bisect, 0.0, 0.0),
            &mut Scripted::with_edge(4095),
            &mut events,
        )
        .expect("concludes");
        assert_eq!(events.0.len(), 5 * done.trials.len());
        // Bisection tries `low` = 1 first: the fixed part and one value.
        let need_mib = (CAPACITY - 4094 * PER_VALUE) / MIB;
        assert_eq!(
            events.0[..5],
            [
                "begin 1 1".to_owned(),
                format!("tick 20ms {}", need_mib / 2),
                format!("tick 40ms {need_mib}"),
                "ended".to_owned(),
                "done 1 succeeded".to_owned(),
            ]
        );
    }
}
