//! Leak and idle-holder verdicts from a memory series: pure functions, no clock, no I/O.
//!
//! A process's NVML memory is its CUDA context plus its caching allocator's reserved
//! cache, in 2 MiB / 20 MiB granules. Such a series rises in steps while the cache warms
//! up and then plateaus once it covers the peak; it drops when the program releases the
//! cache (`empty_cache`). So a rise is not a leak: a **leak** is growth of the memory the
//! process *retains* that goes on after warm-up (or that fills the device within minutes).
//! `docs/leaks.md` gives the method, its formulas and thresholds, and its known limits.
//!
//! Entry points:
//! - [`analyze`]: one series (and its activity evidence) → [`SeriesReport`].
//! - [`ProcessTracker`]: the same analysis fed one sample at a time, reporting a
//!   [`VerdictChange`] when the verdict changes (`leaks --watch`).
//!
//! Every report carries the numbers behind its verdict (slope, significance, onset,
//! growth, time to full, the gates that passed) and a one-line explanation.

mod config;
mod explain;
mod idle;
mod series;
pub(crate) mod stats;
mod tracker;
mod trend;

use serde::Serialize;

pub use config::LeakConfig;
pub use explain::{ExplainStyle, explain, utc_clock};
pub use idle::{CpuSample, DeviceActivitySample, Evidence, IdlePeriod, IdleReport, SmSample};
pub use series::Sample;
pub use stats::MannKendall;
pub use tracker::{ProcessTracker, VerdictChange};
pub use trend::{LeakChecks, LeakRule, TrendTest};

use config::ms;
use idle::IdleFold;
use series::Tiered;
use trend::{MemoryVerdict, TrendInputs};

/// What the analysis concludes about one series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The retained memory keeps growing after warm-up (or fills the device within
    /// minutes).
    Leak,
    /// Growing, but still warming up or without enough evidence for a leak yet.
    Growing,
    /// No growth of the retained memory.
    Stable,
    /// Allocates and frees in cycles (e.g. inference with cache release); the floor is
    /// stable.
    Sawtooth,
    /// Holds at least `min_idle_bytes` and has not used the GPU for `idle_for`.
    IdleHolder,
}

impl Verdict {
    /// The name used in human output and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Leak => "leak",
            Self::Growing => "growing",
            Self::Stable => "stable",
            Self::Sawtooth => "sawtooth",
            Self::IdleHolder => "idle-holder",
        }
    }
}

/// Whether the process is still warming up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Before the first plateau (and within `max_warmup` of the start).
    WarmUp,
    /// After it.
    Settled,
}

/// What the analysis needs to know besides the samples.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeriesContext {
    /// The device's (or MIG instance's) total memory.
    pub capacity_bytes: Option<u64>,
    /// The device's free memory now: time to full = free / slope.
    pub free_bytes: Option<u64>,
    /// When the process started (from /proc, or when the store first saw it). `None`:
    /// assume it started at the first sample, so growth at the start counts as warm-up.
    pub process_start_unix_ms: Option<i64>,
    /// The device as the user knows it (`GPU 0`), for the explanation.
    pub device_label: Option<String>,
}

/// Activity evidence for the idle-holder verdict; every slice may be empty.
#[derive(Debug, Clone, Copy, Default)]
pub struct ActivityInputs<'a> {
    /// Per-process SM activity, where the driver reports it.
    pub process_sm: &'a [SmSample],
    /// The device's utilization, with the number of processes on it at each time.
    pub device: &'a [DeviceActivitySample],
    /// The process's cumulative CPU time.
    pub cpu: &'a [CpuSample],
}

/// Everything the analysis found about one series, with the numbers behind the verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesReport {
    /// The verdict.
    pub verdict: Verdict,
    /// One line for humans, e.g. `leaks 38 MB/s since 14:02:10 UTC (…); at this rate GPU 0
    /// is full in 6 min`.
    pub explanation: String,
    /// The leak rule that fired, for `leak`.
    pub rule: Option<LeakRule>,
    /// First and last sample used.
    pub first_unix_ms: i64,
    /// Last sample: the time the verdict speaks for.
    pub last_unix_ms: i64,
    /// Samples used.
    pub samples: u64,
    /// Samples ignored because they were not later than the one before.
    pub ignored_samples: u64,
    /// Gaps marked in the series.
    pub gaps: u32,
    /// Memory at the last sample.
    pub current_bytes: u64,
    /// Highest memory seen.
    pub peak_bytes: u64,
    /// The floor (memory held through a whole allocate/free cycle) at the last sample.
    pub floor_bytes: u64,
    /// Where the judged growth started (`leak`, `growing`); `None` otherwise. What
    /// `vramctl plot` marks as the leak onset.
    pub onset_unix_ms: Option<i64>,
    /// Growth of the retained memory over the judged region.
    pub net_growth_bytes: i64,
    /// Theil–Sen slope over the judged region.
    pub slope_bytes_per_sec: f64,
    /// One-sided Mann–Kendall p-value of "no upward trend" (1 when the region is flat).
    pub p_value: f64,
    /// Seconds until the device is full at this slope (`leak`, `growing`, with free memory
    /// known).
    pub time_to_full_sec: Option<f64>,
    /// Warm-up or settled.
    pub phase: Phase,
    /// When warm-up ended.
    pub settled_unix_ms: Option<i64>,
    /// The numbers of the judged region.
    pub trend: TrendTest,
    /// The gates of the leak rules on that region.
    pub checks: LeakChecks,
    /// Drops that count as releases.
    pub releases: u32,
    /// Median time between releases.
    pub release_period_ms: Option<i64>,
    /// Window of the floor (0 without an ongoing sawtooth).
    pub floor_window_ms: i64,
    /// Rises smaller than this are noise.
    pub noise_tolerance_bytes: u64,
    /// Idle evidence and idle periods.
    pub idle: IdleReport,
}

/// Why no report could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnalysisError {
    /// The series has no usable sample.
    #[error("the series has no samples; record some first")]
    NoSamples,
    /// A threshold is out of range.
    #[error("invalid leak analysis setting: {0}")]
    InvalidConfig(String),
}

/// Analyses one series with its activity evidence.
///
/// Samples must be in time order; one not later than its predecessor is ignored (and
/// counted in `ignored_samples`). Cost: O(n) to fold the samples into at most
/// `tail_points + head_points` points, then O(m²) with m ≤ `max_test_points` for the tests.
///
/// # Errors
/// [`AnalysisError::NoSamples`] for an empty series, [`AnalysisError::InvalidConfig`] for
/// bad thresholds.
pub fn analyze(
    samples: &[Sample],
    activity: &ActivityInputs<'_>,
    ctx: &SeriesContext,
    cfg: &LeakConfig,
) -> Result<SeriesReport, AnalysisError> {
    cfg.validate()?;
    let mut series = Tiered::new(cfg.tail_points, cfg.head_points);
    for s in samples {
        series.push(s);
    }
    let mut idle = IdleFold::new(
        ms(cfg.max_evidence_gap),
        ms(cfg.idle_for),
        cfg.cpu_idle_fraction,
    );
    fold_activity(&mut idle, activity);
    report(&series, &idle, ctx, cfg).ok_or(AnalysisError::NoSamples)
}

/// Feeds the three sources to the fold in time order.
fn fold_activity(idle: &mut IdleFold, activity: &ActivityInputs<'_>) {
    let (mut a, mut b, mut c) = (0, 0, 0);
    loop {
        let ta = activity.process_sm.get(a).map(|s| s.t_unix_ms);
        let tb = activity.device.get(b).map(|s| s.t_unix_ms);
        let tc = activity.cpu.get(c).map(|s| s.t_unix_ms);
        let next = [ta, tb, tc].into_iter().flatten().min();
        let Some(t) = next else { break };
        if ta == Some(t) {
            idle.push_sm(activity.process_sm[a]);
            a += 1;
        } else if tb == Some(t) {
            idle.push_device(activity.device[b]);
            b += 1;
        } else {
            idle.push_cpu(activity.cpu[c]);
            c += 1;
        }
    }
}

/// The report for the current state of a series; `None` when it has no sample.
pub(crate) fn report(
    series: &Tiered,
    idle: &IdleFold,
    ctx: &SeriesContext,
    cfg: &LeakConfig,
) -> Option<SeriesReport> {
    let points = series.points();
    let last = *series.last()?;
    let first = series.first_t()?;
    let trend = trend::analyze(
        &points,
        TrendInputs {
            process_start_unix_ms: ctx.process_start_unix_ms,
            free_bytes: ctx.free_bytes,
        },
        cfg,
    );
    let idle_report = idle.report(last.t_last);
    let idle_holder = idle_report
        .idle_sec
        .is_some_and(|s| s >= cfg.idle_for.as_secs_f64())
        && last.last >= cfg.min_idle_bytes;
    let (verdict, rule) = match trend.verdict {
        MemoryVerdict::Leak(rule) => (Verdict::Leak, Some(rule)),
        _ if idle_holder => (Verdict::IdleHolder, None),
        MemoryVerdict::Growing => (Verdict::Growing, None),
        MemoryVerdict::Sawtooth => (Verdict::Sawtooth, None),
        MemoryVerdict::Stable => (Verdict::Stable, None),
    };
    let mut report = SeriesReport {
        verdict,
        explanation: String::new(),
        rule,
        first_unix_ms: first,
        last_unix_ms: last.t_last,
        samples: series.accepted,
        ignored_samples: series.ignored,
        gaps: series.gaps,
        current_bytes: last.last,
        peak_bytes: series.peak,
        floor_bytes: trend.floor_bytes,
        onset_unix_ms: trend.onset_unix_ms,
        net_growth_bytes: trend.region.net_growth_bytes,
        slope_bytes_per_sec: trend.region.slope_bytes_per_sec,
        p_value: trend.region.p_value(),
        time_to_full_sec: trend.time_to_full_sec,
        phase: if trend.settled_unix_ms.is_some() {
            Phase::Settled
        } else {
            Phase::WarmUp
        },
        settled_unix_ms: trend.settled_unix_ms,
        trend: trend.region,
        checks: trend.checks,
        releases: trend.releases,
        release_period_ms: trend.release_period_ms,
        floor_window_ms: trend.floor_window_ms,
        noise_tolerance_bytes: trend.noise_tolerance_bytes,
        idle: idle_report,
    };
    let device = ctx.device_label.as_deref().unwrap_or("the device");
    report.explanation = explain(
        &report,
        &ExplainStyle {
            device,
            time: &utc_clock,
        },
    );
    Some(report)
}
