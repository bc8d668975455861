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

use crate::fit_search::{Conclusion, DeviceMeasure, Next, Outcome, Reason, Search};

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
}

impl Trials {
    /// The largest value that succeeded (and stayed under the margin), if any.
    pub fn answer(&self) -> Option<u64> {
        match self.conclusion {
            Conclusion::Found { value } | Conclusion::TopOfRange { value } => Some(value),
            Conclusion::NothingFits => None,
        }
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
    let conclusion = loop {
        let (value, reason) = match search.next() {
            Next::Try { value, reason } => (value, reason),
            Next::Done(conclusion) => break conclusion,
        };
        let n = trials.len() + 1;
        watcher.begin(n, value, reason);
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
        } = measured;
        search.record(
            value,
            if succeeded {
                Outcome::Succeeded(devices)
            } else {
                Outcome::OutOfMemory(devices)
            },
        );
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
    Ok(Trials { conclusion, trials })
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
            };
            Ok(if need > CAPACITY {
                TrialOutcome::OutOfMemory(measured)
            } else {
                TrialOutcome::Succeeded(measured)
            })
        }
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
