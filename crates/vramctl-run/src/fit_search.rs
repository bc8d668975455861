//! `vramctl fit`'s search: which value to try next, from the outcomes and measured peaks of
//! the trials so far, until the largest value that fits is known (issue 15).
//!
//! A pure state machine with no I/O: the caller runs each trial (a fresh process under
//! `run`'s monitoring), calls [`Search::record`] with what it measured, and asks
//! [`Search::next`] again. The same history always gives the same answer.
//!
//! A value is **ok** when its trial succeeded and, with a margin, its peak on every device
//! stayed at or under `(1 − margin)·capacity` (the peak figure: NVML's, else the
//! framework's reserved peak; with neither, success alone decides). Anything else is
//! **bad**. Memory is assumed monotone in the value, so the search keeps a bracket
//! (largest ok, smallest bad) and never proposes a value outside it, outside the range, or
//! twice. The answer is always a value that was tried and was ok — never a prediction.
//!
//! Two strategies: [`Strategy::Bisect`], the classic baseline (low, high, then midpoints),
//! and [`Strategy::Model`], which fits how each device's memory grows with the value and
//! aims at the predicted edge, then confirms it with one trial (see [`Search`]).

mod bound;
mod model;
#[cfg(test)]
mod recorded;
#[cfg(test)]
mod simulation;

pub use model::{Curve, DeviceModel, Figure, MAX_RELATIVE_RESIDUAL, Verdict};

use serde::Serialize;

/// How the search chooses its trials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Fit memory against the value and aim at the predicted edge.
    Model,
    /// Classic bisection: `low`, `high`, then midpoints.
    Bisect,
}

/// What the user asked for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchSettings {
    /// `--range low..high`, inclusive, `1 <= low <= high`.
    pub low: u64,
    pub high: u64,
    /// Fraction of capacity to leave free, `0.0 ≤ margin < 0.5` (`--margin 5%` = 0.05).
    pub margin: f64,
    /// Stop when `bad − ok ≤ max(1, tolerance·ok)`; `0.0` is exact, `< 0.5`.
    pub tolerance: f64,
    pub strategy: Strategy,
}

/// What one trial's monitoring measured on one GPU it used (devices matched by uuid).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceMeasure {
    pub uuid: String,
    /// What this job could use on it: total − driver-reserved − other processes at trial start.
    pub capacity_bytes: u64,
    /// The trial's process tree's peak in NVML (context + framework pool).
    pub nvml_peak_bytes: Option<u64>,
    /// The framework's reserved peak (PyTorch `max_memory_reserved`) via the agent.
    pub reserved_peak_bytes: Option<u64>,
    /// The framework's allocated peak via the agent.
    pub allocated_peak_bytes: Option<u64>,
}

impl DeviceMeasure {
    /// The peak figure of the ok rule and the conservative demand: NVML's, else reserved.
    fn peak_bytes(&self) -> Option<u64> {
        self.nvml_peak_bytes.or(self.reserved_peak_bytes)
    }

    /// Allocated plus what lies outside the framework's pool (NVML − reserved, ≥ 0): the
    /// job's need when its allocator's cache is squeezed out. Needs all three figures.
    fn optimistic_bytes(&self) -> Option<u64> {
        let (nvml, reserved, allocated) = (
            self.nvml_peak_bytes?,
            self.reserved_peak_bytes?,
            self.allocated_peak_bytes?,
        );
        Some(allocated.saturating_add(nvml.saturating_sub(reserved)))
    }
}

/// How a trial ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "devices")]
pub enum Outcome {
    Succeeded(Vec<DeviceMeasure>),
    OutOfMemory(Vec<DeviceMeasure>),
}

/// Why a value is proposed (for the progress display and the report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// A small value whose peak feeds the model.
    Calibrate,
    /// Just under the model's predicted edge.
    Predicted,
    /// One step past the last ok (or below the last bad) that closes the bracket if the
    /// model was right.
    Confirm,
    /// A step doubled after a confirmation that did not close the bracket: up from the
    /// largest ok after successes, down from the smallest bad after failures.
    Gallop,
    /// The midpoint of the bracket.
    Bisect,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Next {
    Try { value: u64, reason: Reason },
    Done(Conclusion),
}

/// How the search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Conclusion {
    /// The largest value that was ok; the bracket closed above it.
    Found { value: u64 },
    /// The largest value that was ok; no value above `bound` can fit by the allocated
    /// peaks (`fit_search::bound`), and `bound` is within the tolerance of it.
    Bounded { value: u64, bound: u64 },
    /// `high` itself was ok.
    TopOfRange { value: u64 },
    /// `low` was out of memory (or over the margin).
    NothingFits,
}

impl Conclusion {
    /// The answer: the largest value that succeeded (and stayed under the margin), if any.
    #[must_use]
    pub fn value(self) -> Option<u64> {
        match self {
            Self::Found { value } | Self::Bounded { value, .. } | Self::TopOfRange { value } => {
                Some(value)
            }
            Self::NothingFits => None,
        }
    }
}

/// The smallest value in `[lo, hi]` where `pred` holds, for a `pred` false then true as the
/// value grows; `hi` when it holds nowhere below (the callers' `hi` always qualifies).
fn smallest_where(mut lo: u64, mut hi: u64, pred: impl Fn(u64) -> bool) -> u64 {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// The model as fitted now, for the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSummary {
    /// One fit per device and constraint: the out-of-memory edge (capacity) and, with a
    /// margin, the margin's edge (usable).
    pub devices: Vec<DeviceModel>,
    /// The smallest trusted prediction over them; `None` when none is trusted.
    pub prediction: Option<u64>,
    /// The value the search aims at for that prediction (a little below it).
    pub aim: Option<u64>,
    /// The largest value that can fit by the allocated peaks (`fit_search::bound`; with
    /// the agent), an upper bound rather than a prediction.
    pub allocated_bound: Option<u64>,
}

/// Settings the search cannot work with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SearchError {
    #[error(
        "range '{low}..{high}' starts below 1: the value must be at least 1, e.g. --range 1..{high}"
    )]
    RangeBelowOne { low: u64, high: u64 },
    #[error(
        "range '{low}..{high}' is empty: give the smaller bound first, e.g. --range {high}..{low}"
    )]
    RangeEmpty { low: u64, high: u64 },
    #[error(
        "margin '{percent}%' is out of bounds: give a margin from 0% to below 50%, e.g. --margin 5%"
    )]
    Margin { percent: f64 },
    #[error(
        "tolerance '{tolerance}' is out of bounds: give a fraction from 0 (exact) to below 0.5, e.g. 0.02 for 2 %"
    )]
    Tolerance { tolerance: f64 },
}

/// One recorded trial.
#[derive(Debug, Clone)]
struct Trial {
    value: u64,
    ok: bool,
    succeeded: bool,
    devices: Vec<DeviceMeasure>,
    /// What the search had proposed, when the value recorded is the one it proposed.
    proposal: Option<Proposal>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// From the largest ok upward.
    Up,
    /// From the smallest bad downward.
    Down,
    /// Neither (calibration, prediction, midpoint).
    Neither,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Proposal {
    value: u64,
    reason: Reason,
    direction: Direction,
    /// Distance from the bracket end it stepped from (for doubling a gallop).
    step: u64,
}

/// The search.
///
/// # `Strategy::Model`, as built
/// 1. **Calibrate** at [`FIRST_MODEL_VALUE`] (clamped to the range), then at
///    `v2 = floor(v1 · 0.5 · usable / demand₁)` (min over
///    devices), where `demand₁` is trial 1's conservative figure. The 0.5 is a safety
///    factor argued, not fitted: even if *all* of trial 1's memory scaled with the value
///    (no fixed part, `a = 0`), `v2` would use half the usable memory, so the second point
///    fits and lies far enough from the first for a usable slope. When `v2 ≤ low + 1` (or
///    trial 1 reported no figures) the value doubles instead.
/// 2. **Predict** per device with a least-squares fit over every *succeeded* trial (an ok
///    one or one over the margin: both measured a full peak; an out-of-memory trial's peak
///    is cut short), without the lowest value once there are three ([`local`]). The figure
///    is the *conservative* one (NVML's peak, else reserved), against the capacity — or,
///    with a margin, against `usable = (1 − margin)·capacity`. The *optimistic* fit
///    (allocated + non-pool memory, with the agent) is in the report only. The prediction
///    is the minimum over devices.
/// 3. **Check the fit** with three or more points (`model::fit_device`): a line with a
///    relative residual over [`MAX_RELATIVE_RESIDUAL`], a slope ≤ 0, or a quadratic term
///    worth more than that share of the limit at the edge is not extrapolated; a convex
///    quadratic within the bound is used instead, else the search brackets.
/// 4. **Aim** a little below the prediction `v`: the smallest `p ≥ floor(v·(1 − tol/2))`
///    whose confirmation step `p + max(1, ceil(tol·p))` passes `v`. A prediction right
///    to within about ±tol/2 is then settled by one more trial.
/// 5. **Confirm / gallop**: after an ok prediction the next trial is
///    `ok + max(1, ceil(tol·ok))` — a failure there closes the bracket; after a bad one,
///    the smallest value whose success closes it, about `bad / (1 + tol)`. An upward
///    confirmation that succeeds is followed by steps that double; one that would cross
///    the middle of a known bracket (or of `[ok, allocated bound]`), or a direction
///    reversed, bisects instead. A downward confirmation that fails too steps down from
///    that failure to the lowest value two trials settle below it, doubling the step
///    while that still saves a trial over bisection (`2w² ≤ N`), then bisects. At every step a refitted
///    prediction strictly inside the bracket (new information: a prediction that failed
///    and was not refitted is not inside) is used when it moves further than the step.
/// 6. **Traces** (issue 34): once the trial loop has the trace predictor's edge
///    (`crate::fit_trace`, from the calibration trials' allocator traces) it calls
///    [`Search::set_trace_prediction`], and steps 2–3's fit is no longer used to aim:
///    step 4 aims at the traces' edge (an edge at or below the largest ok: its step up),
///    step 5 follows with no refit taking over.
///    With the agent's figures the first predicted trial may go higher instead, to the
///    value from which two trials settle every truth up to the allocated bound
///    ([`Search::allocated_bound`], `fit_search::bound`), when that still covers the
///    prediction (`settling_aim`).
/// 7. **Stop** when the bracket closes (`bad − ok ≤ max(1, ceil(tol·ok))`), `high` is ok or `low`
///    is bad — or, with the agent's figures, when the allocated bound closes it: every
///    value above the bound runs out of memory by its live tensors alone, so
///    `bound + 1` counts as bad ([`Conclusion::Bounded`]; issue 34).
#[derive(Debug, Clone)]
pub struct Search {
    settings: SearchSettings,
    trials: Vec<Trial>,
    /// The trace predictor's edge ([`Search::set_trace_prediction`]), which replaces the
    /// line's predictions when set.
    trace_prediction: Option<u64>,
    /// The first trial came with an allocator trace: the second calibration is chosen
    /// safe for memory quadratic in the value ([`Search::set_traced_calibration`]).
    traced_calibration: bool,
}

impl Search {
    /// A search over `settings`.
    ///
    /// # Errors
    /// When the range is empty or starts at 0, or the margin or tolerance is out of bounds.
    pub fn new(settings: SearchSettings) -> Result<Search, SearchError> {
        let SearchSettings {
            low,
            high,
            margin,
            tolerance,
            ..
        } = settings;
        if low < 1 {
            return Err(SearchError::RangeBelowOne { low, high });
        }
        if low > high {
            return Err(SearchError::RangeEmpty { low, high });
        }
        if !(0.0..0.5).contains(&margin) {
            return Err(SearchError::Margin {
                percent: margin * 100.0,
            });
        }
        if !(0.0..0.5).contains(&tolerance) {
            return Err(SearchError::Tolerance { tolerance });
        }
        Ok(Search {
            settings,
            trials: Vec::new(),
            trace_prediction: None,
            traced_calibration: false,
        })
    }

    /// The calibration trials record allocator traces, so the trace predictor, which tells
    /// sizes ∝ value² from sizes ∝ value, will be used: the second calibration is then the
    /// value that would use half the usable memory if all of the first trial's memory grew
    /// with the *square* of the value (`v1·√(0.5·usable/demand₁)`), safe for a
    /// sequence-length search with eager attention, where the linear rule's value can run
    /// out of memory and cost a trial. (The line cannot extrapolate a square from two
    /// points, so without traces the linear rule stays.)
    pub fn set_traced_calibration(&mut self) {
        self.traced_calibration = true;
    }

    /// The edge the trace predictor found (`crate::fit_trace`, from the allocator traces
    /// of the calibration trials): from now on the search aims at it instead of the line
    /// through the NVML peaks (whose extrapolations were 20 % off on the H200), and after
    /// that one trial only confirms, gallops or bisects — no line refit takes over.
    pub fn set_trace_prediction(&mut self, value: u64) {
        self.trace_prediction = Some(value);
    }

    /// The trace predictor's edge, when one was set.
    #[must_use]
    pub fn trace_prediction(&self) -> Option<u64> {
        self.trace_prediction
    }

    /// The settings it runs under.
    #[must_use]
    pub fn settings(&self) -> &SearchSettings {
        &self.settings
    }

    /// The value to try next, or the conclusion. Pure: asking twice without a `record`
    /// between gives the same answer. (Named by the brief's interface; not an iterator:
    /// it does not advance.)
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Next {
        match self.decide() {
            Decision::Try(p) => Next::Try {
                value: p.value,
                reason: p.reason,
            },
            Decision::Done(c) => Next::Done(c),
        }
    }

    /// Records how the trial at `value` ended (normally the value `next` proposed).
    pub fn record(&mut self, value: u64, outcome: Outcome) {
        let proposal = match self.decide() {
            Decision::Try(p) if p.value == value => Some(p),
            _ => None,
        };
        let (succeeded, devices) = match outcome {
            Outcome::Succeeded(d) => (true, d),
            Outcome::OutOfMemory(d) => (false, d),
        };
        let ok = succeeded && self.within_margin(&devices);
        self.trials.push(Trial {
            value,
            ok,
            succeeded,
            devices,
            proposal,
        });
    }

    /// Whether the trial at `value` was ok (`None` when it was not tried).
    #[must_use]
    pub fn was_ok(&self, value: u64) -> Option<bool> {
        self.trials.iter().find(|t| t.value == value).map(|t| t.ok)
    }

    /// (largest ok, smallest bad) within the range. An ok value above the smallest bad
    /// (a non-monotone job, or noise at the edge) is not counted as the largest ok.
    #[must_use]
    pub fn bracket(&self) -> (Option<u64>, Option<u64>) {
        let in_range = |t: &&Trial| (self.settings.low..=self.settings.high).contains(&t.value);
        let bad = self
            .trials
            .iter()
            .filter(in_range)
            .filter(|t| !t.ok)
            .map(|t| t.value)
            .min();
        let ok = self
            .trials
            .iter()
            .filter(in_range)
            .filter(|t| t.ok && bad.is_none_or(|b| t.value < b))
            .map(|t| t.value)
            .max();
        (ok, bad)
    }

    /// The fitted model for the report; `None` before any trial succeeded with figures.
    #[must_use]
    pub fn model(&self) -> Option<ModelSummary> {
        let devices = self.fits();
        if devices.is_empty() {
            return None;
        }
        let prediction = devices
            .iter()
            .filter(|d| d.verdict == Verdict::Trusted && d.figure == Figure::Conservative)
            .filter_map(|d| d.prediction)
            .min();
        Some(ModelSummary {
            devices,
            prediction,
            aim: prediction.map(|v| self.aim(v)),
            allocated_bound: self.allocated_bound(),
        })
    }

    /// The largest value that can fit by the allocated peaks of the succeeded trials (the
    /// minimum over devices: the job fits only where it fits on each); `None` without the
    /// agent's figures on two values (`fit_search::bound`).
    #[must_use]
    pub fn allocated_bound(&self) -> Option<u64> {
        let mut uuids: Vec<&str> = Vec::new();
        for t in self.trials.iter().filter(|t| t.succeeded) {
            for d in &t.devices {
                if !uuids.contains(&d.uuid.as_str()) {
                    uuids.push(&d.uuid);
                }
            }
        }
        uuids
            .into_iter()
            .filter_map(|uuid| {
                let points: Vec<bound::Point> = self
                    .trials
                    .iter()
                    .filter(|t| t.succeeded)
                    .filter_map(|t| {
                        let d = t.devices.iter().find(|d| d.uuid == uuid)?;
                        bound::Point::of(t.value, d)
                    })
                    .collect();
                // The latest trial's capacity, as for the fits.
                let capacity = self
                    .trials
                    .iter()
                    .rev()
                    .find_map(|t| t.devices.iter().find(|d| d.uuid == uuid))?
                    .capacity_bytes;
                bound::device_bound(&points, self.usable_bytes(capacity))
            })
            .min()
    }

    fn within_margin(&self, devices: &[DeviceMeasure]) -> bool {
        let margin = self.settings.margin;
        if margin <= 0.0 {
            return true;
        }
        devices.iter().all(|d| {
            d.peak_bytes().is_none_or(|peak| {
                #[allow(clippy::cast_precision_loss)]
                let fits = peak as f64 <= (1.0 - margin) * d.capacity_bytes as f64;
                fits
            })
        })
    }

    fn usable_bytes(&self, capacity_bytes: u64) -> u64 {
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let usable = ((1.0 - self.settings.margin) * capacity_bytes as f64).floor() as u64;
        usable
    }

    /// One fit per device and constraint (see the type's docs, step 2).
    fn fits(&self) -> Vec<DeviceModel> {
        let succeeded: Vec<&Trial> = self.trials.iter().filter(|t| t.succeeded).collect();
        let mut uuids: Vec<&str> = Vec::new();
        for t in &succeeded {
            for d in &t.devices {
                if !uuids.contains(&d.uuid.as_str()) {
                    uuids.push(&d.uuid);
                }
            }
        }
        let high = self.settings.high;
        let mut out = Vec::new();
        for uuid in uuids {
            let on_device: Vec<(u64, &DeviceMeasure)> = succeeded
                .iter()
                .filter_map(|t| {
                    t.devices
                        .iter()
                        .find(|d| d.uuid == uuid)
                        .map(|d| (t.value, d))
                })
                .collect();
            // The latest trial's capacity: other processes come and go between trials.
            let Some(capacity) = self
                .trials
                .iter()
                .rev()
                .find_map(|t| t.devices.iter().find(|d| d.uuid == uuid))
                .map(|d| d.capacity_bytes)
            else {
                continue;
            };
            let conservative: Vec<(u64, u64)> = on_device
                .iter()
                .filter_map(|&(v, d)| d.peak_bytes().map(|y| (v, y)))
                .collect();
            if conservative.is_empty() {
                continue;
            }
            let optimistic: Option<Vec<(u64, u64)>> = on_device
                .iter()
                .map(|&(v, d)| d.optimistic_bytes().map(|y| (v, y)))
                .collect();
            // The edge is predicted from the conservative figure (NVML's peak: context +
            // the allocator's pool). Research round 2 §2.4 found PyTorch's reserved /
            // allocated spread 1.04–1.35 and argued for measuring reserved; the first H200
            // run (GPT-2, docs/fit.md) confirmed it: the pool's fragmentation grows with
            // the value, so a line of allocated bytes put the edge 7 % too high. The
            // optimistic fit is kept in the report as the bound the cache could give.
            let conservative_fit = local(&conservative);
            let oom_edge = model::fit_device(
                uuid,
                Figure::Conservative,
                capacity,
                &conservative_fit,
                high,
            );
            if let Some(points) = optimistic {
                out.push(model::fit_device(
                    uuid,
                    Figure::Optimistic,
                    capacity,
                    &local(&points),
                    high,
                ));
            }
            let margin_edge = (self.settings.margin > 0.0).then(|| {
                model::fit_device(
                    uuid,
                    Figure::Conservative,
                    self.usable_bytes(capacity),
                    &conservative_fit,
                    high,
                )
            });
            // At a margin the capacity fit of the same figure is never the binding one:
            // keep only the margin's.
            match margin_edge {
                Some(m) => out.push(m),
                None => out.push(oom_edge),
            }
        }
        out
    }

    /// The value aimed at for a prediction `v` (the type's docs, step 4).
    fn aim(&self, v: u64) -> u64 {
        let tol = self.settings.tolerance;
        // A prediction at `high` means high fits with room by the model: try it.
        if v >= self.settings.high {
            return self.settings.high;
        }
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let start = ((v as f64) * (1.0 - tol / 2.0)).floor() as u64;
        // Smallest p in [start, v] with p + up_step(p) > v; p = v always qualifies.
        smallest_where(start.min(v), v, |p| p.saturating_add(self.up_step(p)) > v)
    }

    /// `max(1, ceil(tol·ok))`: the widest bracket above `ok` that counts as closed. The
    /// answer is still within `tol` of the truth: `truth < bad ≤ ok + ceil(tol·ok)`, so
    /// `truth − ok ≤ ceil(tol·ok) − 1 < tol·ok`.
    fn up_step(&self, ok: u64) -> u64 {
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let step = (self.settings.tolerance * ok as f64).ceil() as u64;
        step.max(1)
    }

    fn closes(&self, ok: u64, bad: u64) -> bool {
        bad.saturating_sub(ok) <= self.up_step(ok)
    }

    /// The smallest value in (ok, bad) whose success would close the bracket below `bad`.
    fn down_target(&self, ok: u64, bad: u64) -> u64 {
        smallest_where(ok + 1, bad - 1, |v| self.closes(v, bad))
    }

    /// The lowest value above `ok` from which two trials settle every edge below `bad`:
    /// `v`, then `c = v + step(v)` — a failure at `c` closes `[v, c)`, a success closes
    /// `[c, bad)`. About `bad / (1 + tol)²`.
    fn two_trial_floor(&self, ok: u64, bad: u64) -> u64 {
        let settles = |v: u64| {
            let c = v.saturating_add(self.up_step(v));
            c >= bad || self.closes(c, bad)
        };
        smallest_where(ok + 1, bad - 1, settles)
    }

    /// The model's bisection of an open bracket `[ok, bad)`: the value one step above `ok`
    /// when both its outcomes close the bracket, else the midpoint.
    fn settle_or_bisect(&self, ok: u64, bad: u64) -> Proposal {
        let step = self.up_step(ok);
        let c = ok.saturating_add(step);
        if c < bad && self.closes(c, bad) {
            return Proposal {
                value: c,
                reason: Reason::Confirm,
                direction: Direction::Up,
                step,
            };
        }
        self.bisect(ok, bad)
    }

    /// Whether `v` may be proposed: in range, strictly inside the bracket.
    fn inside(&self, v: u64, ok: u64, bad: Option<u64>) -> bool {
        v > ok && v <= self.settings.high && bad.is_none_or(|b| v < b)
    }

    fn decide(&self) -> Decision {
        let s = &self.settings;
        let (ok, bad) = self.bracket();
        if bad.is_some_and(|b| b <= s.low) {
            return Decision::Done(Conclusion::NothingFits);
        }
        let Some(lo) = ok else {
            return Decision::Try(Proposal {
                value: self.first_value(bad),
                reason: Reason::Calibrate,
                direction: Direction::Neither,
                step: 0,
            });
        };
        if lo >= s.high {
            return Decision::Done(Conclusion::TopOfRange { value: lo });
        }
        if bad.is_some_and(|b| self.closes(lo, b)) {
            return Decision::Done(Conclusion::Found { value: lo });
        }
        // The allocated peaks rule out every value above the bound: when the first of them
        // closes the bracket above `lo`, no trial is needed to see it fail (step 7).
        if s.strategy == Strategy::Model {
            if let Some(bound) = self.allocated_bound().filter(|&u| u >= lo) {
                if self.closes(lo, bound.saturating_add(1)) {
                    return Decision::Done(Conclusion::Bounded { value: lo, bound });
                }
            }
        }
        let proposal = match s.strategy {
            Strategy::Bisect => match bad {
                None => Proposal {
                    value: s.high,
                    reason: Reason::Bisect,
                    direction: Direction::Neither,
                    step: 0,
                },
                Some(b) => self.bisect(lo, b),
            },
            Strategy::Model => self.model_step(lo, bad),
        };
        debug_assert!(
            self.inside(proposal.value, lo, bad),
            "{proposal:?} outside {ok:?}..{bad:?}"
        );
        Decision::Try(proposal)
    }

    fn bisect(&self, ok: u64, bad: u64) -> Proposal {
        Proposal {
            value: ok + (bad - ok) / 2,
            reason: Reason::Bisect,
            direction: Direction::Neither,
            step: 0,
        }
    }

    /// One step of `Strategy::Model` with the bracket open: `lo` ok, `bad` (if known) bad.
    fn model_step(&self, lo: u64, bad: Option<u64>) -> Proposal {
        let high = self.settings.high;
        let aim = match self.trace_prediction {
            Some(v) => Some(self.aim(v)),
            None => self.model().and_then(|m| m.aim),
        }
        .filter(|&p| self.inside(p, lo, bad));
        let predicted = |value| Proposal {
            value,
            reason: Reason::Predicted,
            direction: Direction::Neither,
            step: 0,
        };
        // The last trial is there: `lo` is known.
        let last = self.trials.last();
        let last_ok = last.is_some_and(|t| t.ok);
        let from = last.and_then(|t| t.proposal);

        // A move up from `lo` by `step` (capped at `high`; a midpoint when it would cross
        // the middle of a known bracket), unless a refitted prediction goes further.
        // Where a gallop up must stop: the smallest bad, else the first value the allocated
        // bound rules out (no value above it can fit, so it halves as a failure would).
        let ceiling = bad.or_else(|| {
            self.allocated_bound()
                .map(|u| u.saturating_add(1).min(high.saturating_add(1)))
                .filter(|&c| c > lo + 1)
        });
        let up = |step: u64, reason: Reason| -> Proposal {
            let target = lo.saturating_add(step).min(high);
            let mut p = match ceiling {
                Some(b) if target > lo + (b - lo) / 2 && reason == Reason::Gallop => {
                    self.bisect(lo, b)
                }
                Some(b) if target >= b => self.bisect(lo, b),
                _ => Proposal {
                    value: target,
                    reason,
                    direction: Direction::Up,
                    step: target - lo,
                },
            };
            if let Some(a) = aim.filter(|&a| a > p.value) {
                p = predicted(a);
            }
            p
        };
        // The one move down from a failed prediction `b` whose success closes the
        // bracket; a refitted prediction inside the bracket wins.
        let down = |b: u64| -> Proposal {
            let target = self.down_target(lo, b);
            // A prediction whose success would close the bracket anyway settles no more
            // than the lowest such value, which also settles every edge between the two
            // (after a settling aim above the prediction failed).
            if let Some(a) = aim.filter(|&a| !self.closes(a, b) || a < target) {
                return predicted(a);
            }
            Proposal {
                value: target,
                reason: Reason::Confirm,
                direction: Direction::Down,
                step: b - target,
            }
        };
        let bisect_or_aim = |b: u64| aim.map_or_else(|| self.bisect(lo, b), predicted);
        // A step down from the smallest bad `b` by `width`, or bisection of `[lo, b)` once
        // the step is too wide to pay: a truth found in a window `w` steps wide costs about
        // `2·log2(w)` trials (the doubling steps down to it, then halving it), bisecting
        // the whole bracket `N` steps wide about `log2(N)`, so a step down is taken only
        // while it still saves a trial where it finds the truth, `2·log2(w) + 1 ≤ log2(N)`,
        // i.e. `2w² ≤ N` (and never past the middle). The first step (two steps wide,
        // settled by two trials) is taken whenever it stays above the middle: at small
        // values, where a bracket is a handful of steps, the logarithms round against it.
        // Argued, not fitted; a large miss
        // (the line's, 4–33 % on the H200) then costs one or two trials more than
        // bisecting from the start would.
        let down_gallop = |b: u64, width: u64, first: bool| -> Proposal {
            let target = b.saturating_sub(width);
            #[allow(clippy::cast_precision_loss)]
            let pays = 2.0 * (width as f64).powi(2) <= (b - lo) as f64 * self.up_step(b) as f64;
            if target <= lo + (b - lo) / 2 || !(first || pays) {
                return self.bisect(lo, b);
            }
            Proposal {
                value: target,
                reason: Reason::Gallop,
                direction: Direction::Down,
                step: width,
            }
        };

        match (from.map(|p| (p.reason, p.direction)), bad) {
            // After a prediction: the one trial that settles it.
            (Some((Reason::Predicted, _)), _) if last_ok => up(self.up_step(lo), Reason::Confirm),
            (Some((Reason::Predicted, _)), Some(b)) => down(b),
            // A confirmation or gallop that kept going: double its step.
            (Some((Reason::Confirm | Reason::Gallop, Direction::Up)), _) if last_ok => {
                let step = from.map_or(1, |p| p.step).saturating_mul(2).max(1);
                up(step, Reason::Gallop)
            }
            // A confirmation below a failed prediction that failed too: the model is off by
            // more than the tolerance, but by little — the truth lies just under a value
            // that failed, far above the calibration values a bisection would start from.
            // Step down from the failure to the lowest value from which two trials settle
            // every edge below it (it, then one step up), so a miss of up to about twice the
            // tolerance costs two trials; a failure there doubles the step (below).
            (Some((Reason::Confirm, Direction::Down)), Some(b)) if !last_ok => {
                down_gallop(b, b - self.two_trial_floor(lo, b), true)
            }
            // A step down that failed too: double it, so a larger miss costs trials in
            // proportion to its logarithm, not to its size.
            (Some((Reason::Gallop, Direction::Down)), Some(b)) if !last_ok => {
                down_gallop(b, from.map_or(1, |p| p.step).saturating_mul(2), false)
            }
            // A step down that succeeded: halve the window it found, by the value that
            // settles it either way where one does (the first step leaves two steps).
            (Some((Reason::Gallop, Direction::Down)), Some(b)) => {
                aim.map_or_else(|| self.settle_or_bisect(lo, b), predicted)
            }
            // A reversed direction, or bisecting already: bisect on.
            (Some((Reason::Confirm | Reason::Gallop | Reason::Bisect, _)), Some(b)) => {
                bisect_or_aim(b)
            }
            // After calibration (or a trial the search did not propose).
            (_, _) => {
                if let Some(a) = aim {
                    return predicted(self.settling_aim(lo, bad, a).unwrap_or(a));
                }
                // The traces put the edge at (or below) the largest ok: the step above it
                // settles it.
                if self.trace_prediction.is_some_and(|v| v <= lo) {
                    return up(self.up_step(lo), Reason::Confirm);
                }
                match bad {
                    Some(b) => self.bisect(lo, b),
                    None if self.model().is_none_or(|m| {
                        m.devices.iter().all(|d| d.verdict == Verdict::TooFewPoints)
                    }) =>
                    {
                        self.second_calibration(lo)
                    }
                    // The model does not predict (flat, poor fit): bracket by doubling.
                    None => up(lo, Reason::Gallop),
                }
            }
        }
    }

    /// Where the first predicted trial goes when the allocated bound `U` is known (the
    /// type's docs, step 4): `a_U`, the smallest value above `lo` whose confirmation
    /// `c = a_U + step` closes the bracket against `U` if it succeeds (`c + step(c) > U`).
    /// The two trials from `a_U` then settle every truth in `[down_target(a_U), U]`: a
    /// failure at `a_U` is followed by the value whose success closes below it, a success
    /// by `c`, whose failure closes and whose success meets the bound. Used instead of
    /// `aim` (just under the prediction `P`) when it goes higher and that window still
    /// holds `P` — the truths it gives up lie further below `P` than the ones it gains lie
    /// above, and above `P` there is nothing past `U` to lose — or when `aim` lies above
    /// `U`, where the bound says it cannot fit.
    fn settling_aim(&self, lo: u64, bad: Option<u64>, aim: u64) -> Option<u64> {
        if bad.is_some() {
            return None;
        }
        let bound = self.allocated_bound()?;
        let prediction = self
            .trace_prediction
            .or_else(|| self.model().and_then(|m| m.prediction))?;
        let reaches = |a: u64| {
            let c = a.saturating_add(self.up_step(a));
            c.saturating_add(self.up_step(c)) > bound
        };
        let a_u = smallest_where(lo + 1, bound.max(lo + 1), reaches);
        if !self.inside(a_u, lo, bad) {
            return None;
        }
        let holds_prediction = self.down_target(lo, a_u.max(lo + 2)) <= prediction;
        ((a_u > aim && holds_prediction) || aim > bound).then_some(a_u)
    }

    /// Trial 1: `low` for bisection; for the model, [`FIRST_MODEL_VALUE`] when the range
    /// holds it (below a failed first value, bisection down from there).
    fn first_value(&self, bad: Option<u64>) -> u64 {
        let s = &self.settings;
        match (s.strategy, bad) {
            (Strategy::Model, None) => FIRST_MODEL_VALUE.clamp(s.low, s.high),
            (_, None) => s.low,
            (_, Some(b)) => s.low + (b.saturating_sub(s.low)) / 2,
        }
    }

    /// Trial 2 (the type's docs, step 1), from the largest ok `lo` with no bad known.
    fn second_calibration(&self, lo: u64) -> Proposal {
        let high = self.settings.high;
        let scaled = self.trials.iter().find(|t| t.value == lo).and_then(|t| {
            t.devices
                .iter()
                .filter_map(|d| {
                    let demand = d.peak_bytes().filter(|&y| y > 0)?;
                    #[allow(
                        clippy::cast_precision_loss,
                        clippy::cast_possible_truncation,
                        clippy::cast_sign_loss
                    )]
                    let ratio = 0.5 * self.usable_bytes(d.capacity_bytes) as f64 / demand as f64;
                    let growth = if self.traced_calibration {
                        ratio.sqrt()
                    } else {
                        ratio
                    };
                    let v = (lo as f64 * growth).floor().min(u64::MAX as f64) as u64;
                    Some(v)
                })
                .min()
        });
        match scaled {
            Some(v) if v > lo + 1 => Proposal {
                value: v.min(high),
                reason: Reason::Calibrate,
                direction: Direction::Neither,
                step: 0,
            },
            // Too close to tell a slope, or no figures: grow by doubling.
            Some(_) => Proposal {
                value: lo.saturating_mul(2).min(high),
                reason: Reason::Calibrate,
                direction: Direction::Neither,
                step: 0,
            },
            None => Proposal {
                value: lo.saturating_mul(2).min(high),
                reason: Reason::Gallop,
                direction: Direction::Up,
                step: lo,
            },
        }
    }
}

/// Where the model's search starts when the range allows. At the smallest values a job's
/// memory is its fixed part (weights, optimizer state, context) and the allocator's small
/// blocks, and the pool's share per value differs from the one near the edge: on the first
/// H200 run (GPT-2, docs/fit.md) the line through 1 and 17 put the edge 4 % too high, the
/// line through 17 and 58 within 0.5 %. 8 keeps the first trial cheap and out of that
/// regime for batch sizes; a first trial that fails searches below it.
pub const FIRST_MODEL_VALUE: u64 = 8;

/// The points a line is fitted to: all of them up to two; from three on, without the
/// lowest value (see [`FIRST_MODEL_VALUE`]: it extrapolates the worst to the edge).
fn local(points: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut sorted = points.to_vec();
    sorted.sort_unstable();
    let distinct = {
        let mut v: Vec<u64> = sorted.iter().map(|p| p.0).collect();
        v.dedup();
        v.len()
    };
    if distinct >= 3 {
        let lowest = sorted[0].0;
        sorted.retain(|p| p.0 != lowest);
    }
    sorted
}

enum Decision {
    Try(Proposal),
    Done(Conclusion),
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn settings(strategy: Strategy) -> SearchSettings {
        SearchSettings {
            low: 1,
            high: 4096,
            margin: 0.0,
            tolerance: 0.02,
            strategy,
        }
    }

    fn try_at(value: u64, reason: Reason) -> Next {
        Next::Try { value, reason }
    }

    fn measured(nvml: u64) -> Vec<DeviceMeasure> {
        vec![DeviceMeasure {
            uuid: "GPU-0".to_owned(),
            capacity_bytes: 100 * GIB,
            nvml_peak_bytes: Some(nvml),
            reserved_peak_bytes: None,
            allocated_peak_bytes: None,
        }]
    }

    #[test]
    fn settings_out_of_bounds_are_refused_with_the_value_and_a_fix() {
        let err = |s: SearchSettings| Search::new(s).expect_err("refused").to_string();
        let base = settings(Strategy::Model);
        assert_eq!(
            err(SearchSettings {
                low: 0,
                ..base.clone()
            }),
            "range '0..4096' starts below 1: the value must be at least 1, e.g. --range 1..4096"
        );
        assert_eq!(
            err(SearchSettings {
                low: 64,
                high: 8,
                ..base.clone()
            }),
            "range '64..8' is empty: give the smaller bound first, e.g. --range 8..64"
        );
        assert_eq!(
            err(SearchSettings {
                margin: 0.5,
                ..base.clone()
            }),
            "margin '50%' is out of bounds: give a margin from 0% to below 50%, e.g. --margin 5%"
        );
        assert!(
            err(SearchSettings {
                tolerance: f64::NAN,
                ..base
            })
            .starts_with("tolerance 'NaN'")
        );
    }

    #[test]
    fn bisect_tries_low_then_high_then_midpoints() {
        let mut s = Search::new(settings(Strategy::Bisect)).expect("valid");
        assert_eq!(s.next(), try_at(1, Reason::Calibrate));
        s.record(1, Outcome::Succeeded(measured(GIB)));
        assert_eq!(s.next(), try_at(4096, Reason::Bisect));
        s.record(4096, Outcome::OutOfMemory(measured(100 * GIB)));
        assert_eq!(s.next(), try_at(2048, Reason::Bisect));
    }

    #[test]
    fn a_success_over_the_margin_is_bad() {
        let mut s = Search::new(SearchSettings {
            margin: 0.05,
            ..settings(Strategy::Bisect)
        })
        .expect("valid");
        s.record(1, Outcome::Succeeded(measured(GIB)));
        // 96 GiB of 100 succeeded but leaves less than 5 % free.
        s.record(4096, Outcome::Succeeded(measured(96 * GIB)));
        assert_eq!(s.bracket(), (Some(1), Some(4096)));
    }

    #[test]
    fn a_success_with_no_figures_is_ok_by_success_alone() {
        let mut s = Search::new(SearchSettings {
            margin: 0.05,
            ..settings(Strategy::Model)
        })
        .expect("valid");
        s.record(1, Outcome::Succeeded(Vec::new()));
        assert_eq!(s.was_ok(1), Some(true));
        // No figures to scale from: the second value doubles.
        assert_eq!(s.next(), try_at(2, Reason::Gallop));
    }

    #[test]
    fn an_ok_above_a_bad_does_not_move_the_bracket() {
        let mut s = Search::new(settings(Strategy::Bisect)).expect("valid");
        s.record(1, Outcome::Succeeded(measured(GIB)));
        s.record(100, Outcome::OutOfMemory(measured(100 * GIB)));
        // A flaky success above the failure (noise at the edge) is not the answer.
        s.record(200, Outcome::Succeeded(measured(90 * GIB)));
        assert_eq!(s.bracket(), (Some(1), Some(100)));
    }

    #[test]
    fn a_value_the_search_did_not_propose_is_recorded_and_never_proposed_again() {
        let mut s = Search::new(settings(Strategy::Model)).expect("valid");
        s.record(1, Outcome::Succeeded(measured(11 * GIB)));
        s.record(3, Outcome::Succeeded(measured(13 * GIB)));
        // 10 GiB + 1 GiB·v under 100 GiB: the edge at 90; the aim is 89, whose step of
        // ceil(2 % · 89) = 2 passes the edge (89 ok, then 91 closes).
        assert_eq!(s.next(), try_at(89, Reason::Predicted));
        // The caller ran 50 instead: it counts as a point, and nothing at or below it is
        // proposed again.
        s.record(50, Outcome::Succeeded(measured(60 * GIB)));
        assert_eq!(s.bracket(), (Some(50), None));
        assert_eq!(s.next(), try_at(89, Reason::Predicted));
        s.record(89, Outcome::Succeeded(measured(99 * GIB)));
        assert_eq!(s.next(), try_at(91, Reason::Confirm));
    }

    #[test]
    fn a_trace_prediction_replaces_the_line_and_is_confirmed_by_one_step() {
        let mut s = Search::new(settings(Strategy::Model)).expect("valid");
        s.record(1, Outcome::Succeeded(measured(11 * GIB)));
        s.record(3, Outcome::Succeeded(measured(13 * GIB)));
        // The line says 90; the traces say 70: the aim is the traces' (69, whose step of
        // 2 passes 70).
        s.set_trace_prediction(70);
        assert_eq!(s.trace_prediction(), Some(70));
        assert_eq!(s.next(), try_at(69, Reason::Predicted));
        s.record(69, Outcome::Succeeded(measured(79 * GIB)));
        assert_eq!(s.next(), try_at(71, Reason::Confirm));
        // It succeeds too (the traces were low): a gallop, not the line's 90.
        s.record(71, Outcome::Succeeded(measured(81 * GIB)));
        assert_eq!(s.next(), try_at(75, Reason::Gallop));

        // A prediction at or below the largest ok: the step above it settles it.
        let mut s = Search::new(settings(Strategy::Model)).expect("valid");
        s.record(8, Outcome::Succeeded(measured(18 * GIB)));
        s.record(40, Outcome::Succeeded(measured(50 * GIB)));
        s.set_trace_prediction(40);
        assert_eq!(s.next(), try_at(41, Reason::Confirm));
    }

    #[test]
    fn a_prediction_and_its_step_down_that_both_fail_step_down_to_a_two_trial_window() {
        let start = || {
            let mut s = Search::new(settings(Strategy::Model)).expect("valid");
            s.record(8, Outcome::Succeeded(measured(18 * GIB)));
            s.record(40, Outcome::Succeeded(measured(50 * GIB)));
            s.set_trace_prediction(100);
            assert_eq!(s.next(), try_at(99, Reason::Predicted));
            s.record(99, Outcome::OutOfMemory(measured(100 * GIB)));
            // 97's success would close [97, 99).
            assert_eq!(s.next(), try_at(97, Reason::Confirm));
            s.record(97, Outcome::OutOfMemory(measured(100 * GIB)));
            // Not a bisection from 40: 93, from which 95 settles every edge below 97.
            assert_eq!(s.next(), try_at(93, Reason::Gallop));
            s
        };
        let mut s = start();
        s.record(93, Outcome::Succeeded(measured(99 * GIB)));
        assert_eq!(s.next(), try_at(95, Reason::Confirm));
        s.record(95, Outcome::OutOfMemory(measured(100 * GIB)));
        assert_eq!(s.next(), Next::Done(Conclusion::Found { value: 93 }));

        // 93 fails too: the next step (8 wide) would not save a trial over bisecting
        // [40, 93) (2·8² > 53·2), so it bisects.
        let mut s = start();
        s.record(93, Outcome::OutOfMemory(measured(100 * GIB)));
        assert_eq!(s.next(), try_at(66, Reason::Bisect));
    }

    #[test]
    fn the_second_calibration_uses_half_the_usable_memory_if_all_of_it_scaled() {
        let mut s = Search::new(settings(Strategy::Model)).expect("valid");
        s.record(2, Outcome::Succeeded(measured(10 * GIB)));
        // floor(2 · 0.5 · 100 / 10) = 10.
        assert_eq!(s.next(), try_at(10, Reason::Calibrate));
    }

    #[test]
    fn the_model_summary_names_the_figure_and_the_prediction() {
        let mut s = Search::new(settings(Strategy::Model)).expect("valid");
        s.record(1, Outcome::Succeeded(measured(11 * GIB)));
        s.record(3, Outcome::Succeeded(measured(13 * GIB)));
        let m = s.model().expect("fitted");
        assert_eq!(m.prediction, Some(90));
        assert_eq!(m.aim, Some(89));
        assert_eq!(m.devices.len(), 1);
        assert_eq!(m.devices[0].figure, Figure::Conservative);
        assert_eq!(m.devices[0].verdict, Verdict::Trusted);
    }
}
