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
//! - [`SeriesFold`]: the same batch analysis fed one sample at a time (long histories).
//! - [`ProcessTracker`]: the same analysis fed one sample at a time, reporting a
//!   [`VerdictChange`] when the verdict changes.
//! - [`live::FleetTracker`]: every process on every GPU, fed one
//!   [`Snapshot`](vramctl_core::types::Snapshot) at a time (`leaks --watch`, `serve`, `top`).
//!
//! Every report carries the numbers behind its verdict (slope, significance, onset,
//! growth, time to full, the gates that passed) and a one-line explanation.

mod config;
mod explain;
mod idle;
pub mod live;
mod series;
pub(crate) mod stats;
mod tracker;
mod trend;

use serde::Serialize;

pub use config::LeakConfig;
pub use explain::{ExplainStyle, explain, utc_clock};
/// The units of the explanations, for frontends that print the same numbers: `6.2 GiB`,
/// `38 MB/s`, `3 h 2 min`.
pub use explain::{bytes as human_bytes, duration as human_duration, rate as human_rate};
pub use idle::{
    CpuSample, DeviceActivitySample, Evidence, IdlePeriod, IdleReport, IdleState, SmSample,
};
pub use series::{FreeHistory, Sample};
pub use stats::MannKendall;
pub use tracker::{Cadence, ProcessTracker, VerdictChange};
pub use trend::{LeakChecks, LeakRule, RegionKind, Scale, Steadiness, TrendTest};

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
    /// The device's free memory at earlier times, oldest first ([`FreeHistory::snapshot`]):
    /// the look-back of a leak verdict asks with the free memory of then. Empty: `free_bytes`
    /// stands for every time.
    pub free_history: std::sync::Arc<[(i64, u64)]>,
    /// When the process started (from /proc, or when the store first saw it). `None`:
    /// assume it started at the first sample, so growth at the start counts as warm-up.
    pub process_start_unix_ms: Option<i64>,
    /// The device as the user knows it (`GPU 0`), for the explanation.
    pub device_label: Option<String>,
    /// The process is no longer listed at the end of the data (it ended before the log
    /// did): its memory cannot fill the device any more, so there is no time to full.
    pub ended: bool,
    /// The series is a device's used memory (all its processes together), not one
    /// process's: the verdict is per device, and growth after a plateau may be a process
    /// starting, so only the since-start rules (`steady-growth`, `fills-device`) judge it.
    pub device_total: bool,
}

/// The memory series of one process (or device) as the analysis takes them: what NVML
/// reports, and where the process reports it, what its framework's allocator has
/// allocated (live tensors, without the cache the allocator keeps).
///
/// NVML's memory is the CUDA context plus the allocator's *reserved* cache, so a warm-up
/// (the cache growing to cover the peak) and a leak both raise it. The allocated bytes
/// tell them apart directly: a leak is retained *allocated* bytes growing; reserve growth
/// over flat allocated bytes is cache. When `allocated` has samples the leak verdict is
/// judged on it (`SeriesReport::basis`), the rest (idle, releases) on `memory`. The
/// in-process agent fills it (`torch.cuda.memory_allocated()` per device, issue 35): live
/// through `FleetTracker::observe_with_allocated`, from the history through the recorded
/// `process_allocated_bytes` series.
#[derive(Debug, Clone, Copy, Default)]
pub struct SeriesInputs<'a> {
    /// NVML's per-process (or the device's used) memory.
    pub memory: &'a [Sample],
    /// The allocator's allocated bytes (`torch.cuda.memory_allocated()`), in time order;
    /// empty when the process does not report them.
    pub allocated: &'a [Sample],
}

/// Which series the leak verdict was judged on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Basis {
    /// NVML's memory: the context plus the allocator's reserved cache.
    Reserved,
    /// The allocator's allocated bytes, reported by the process.
    Allocated,
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
    /// The windows of the analysis as scaled to this series' sampling interval.
    pub scale: Scale,
    /// The series the leak verdict was judged on.
    pub basis: Basis,
    /// The allocator's allocated bytes at the last sample, where the process reports them.
    pub allocated_bytes: Option<u64>,
    /// The verdict NVML's memory alone gives, where it differs from `verdict` because the
    /// allocated bytes said otherwise (`leak` there, `stable` here: the cache grew).
    pub reserved_verdict: Option<Verdict>,
    /// The last allocated-bytes sample, when the agent stopped answering: more than
    /// [`AGENT_SILENT_AFTER_MS`] before the last memory sample. `None` while it answers or
    /// when the process never had one.
    pub agent_silent_since_unix_ms: Option<i64>,
    /// The series is a device's total memory (all processes): the verdict is per device.
    pub device_total: bool,
    /// A `leak` kept from an analysis at an earlier end while the memory has not settled
    /// (the floor of a sawtooth or a noisy series shows only now and then): that end's
    /// last sample. The rule, onset, slope and growth are as judged then. `None` when
    /// the rules judged the leak on the series as it is now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judged_unix_ms: Option<i64>,
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
    analyze_series(
        &SeriesInputs {
            memory: samples,
            allocated: &[],
        },
        activity,
        ctx,
        cfg,
    )
}

/// [`analyze`] with every series a process can have: NVML's memory and, where the
/// process reports it, its allocator's allocated bytes ([`SeriesInputs`]).
///
/// # Errors
/// As [`analyze`].
pub fn analyze_series(
    inputs: &SeriesInputs<'_>,
    activity: &ActivityInputs<'_>,
    ctx: &SeriesContext,
    cfg: &LeakConfig,
) -> Result<SeriesReport, AnalysisError> {
    let mut fold = SeriesFold::new(cfg.clone())?;
    for s in inputs.memory {
        fold.push(s);
    }
    for s in inputs.allocated {
        fold.push_allocated(s);
    }
    fold_activity(&mut fold.idle, activity);
    fold.report(ctx)
}

/// The batch analysis fed one sample at a time, for histories too long to hold in memory
/// (`leaks --db` on a day of 240 series): samples and evidence are folded as they come
/// (O(1) each, at most `tail_points + head_points` points kept) and [`SeriesFold::report`]
/// runs the analysis once, on demand. Unlike [`ProcessTracker`] it never re-analyses on
/// its own. Pushing the same samples and evidence (each source in time order) gives the
/// report [`analyze`] gives.
#[derive(Debug, Clone)]
pub struct SeriesFold {
    cfg: LeakConfig,
    series: Tiered,
    allocated: Option<Tiered>,
    idle: IdleFold,
}

impl SeriesFold {
    /// An empty fold.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidConfig`] for bad thresholds.
    pub fn new(cfg: LeakConfig) -> Result<Self, AnalysisError> {
        cfg.validate()?;
        Ok(Self {
            series: Tiered::new(cfg.tail_points, cfg.head_points),
            allocated: None,
            idle: IdleFold::new(
                ms(cfg.max_evidence_gap),
                ms(cfg.idle_for),
                cfg.cpu_idle_fraction,
            ),
            cfg,
        })
    }

    /// Adds a memory sample; `false` when it was ignored (not later than the previous one).
    pub fn push(&mut self, sample: &Sample) -> bool {
        self.series.push(sample)
    }

    /// Adds a sample of the allocator's allocated bytes (`Sample::bytes`); `false` when
    /// it was ignored (not later than the previous one).
    pub fn push_allocated(&mut self, sample: &Sample) -> bool {
        let cfg = &self.cfg;
        self.allocated
            .get_or_insert_with(|| Tiered::new(cfg.tail_points, cfg.head_points))
            .push(sample)
    }

    /// Adds a per-process SM activity sample.
    pub fn push_sm(&mut self, sample: SmSample) {
        self.idle.push_sm(sample);
    }

    /// Adds a device utilization sample.
    pub fn push_device(&mut self, sample: DeviceActivitySample) {
        self.idle.push_device(sample);
    }

    /// Adds a CPU time sample.
    pub fn push_cpu(&mut self, sample: CpuSample) {
        self.idle.push_cpu(sample);
    }

    /// Time of the last accepted memory sample.
    pub fn last_unix_ms(&self) -> Option<i64> {
        self.series.last().map(|p| p.t_last)
    }

    /// The report on everything pushed so far.
    ///
    /// # Errors
    /// [`AnalysisError::NoSamples`] when no memory sample was accepted.
    pub fn report(&self, ctx: &SeriesContext) -> Result<SeriesReport, AnalysisError> {
        report(
            &self.series,
            self.allocated.as_ref(),
            &self.idle,
            ctx,
            &self.cfg,
        )
        .ok_or(AnalysisError::NoSamples)
    }
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

/// Fewest distinct memory levels in the judged region for a rate: the fewest at which the
/// exact one-sided Mann–Kendall test the leak rules use can tell a rise from chance at
/// their `alpha` of 0.01 (all rising: p = 1/n!, 0.042 for 4 levels, 0.0083 for 5). With
/// fewer, a slope is one or two steps extrapolated: a 3-sample burst was "full in 21 s",
/// an idle holder's start-up allocation "growing 21 GB/s". So no time to full and no rate
/// in the explanation from fewer (one allocation is a size, not a slope). Derived from
/// the test, not fitted to data; checked on the synthetic suite and the H200 fixtures
/// (`docs/leaks.md`, "Time to full").
pub const MIN_FORECAST_LEVELS: usize = 5;

/// Whether the judged region has enough levels for a rate.
pub fn rate_known(region: &TrendTest) -> bool {
    region.levels as usize >= MIN_FORECAST_LEVELS
}

/// An agent whose last allocated-bytes sample is this much older than the last memory
/// sample has stopped answering. Three times the agent poll's default cadence (10 s,
/// `vramctl_agent::agent_poll::DEFAULT_CADENCE`): a poll or two that missed its 250 ms
/// deadline is not silence. Not a leak threshold (it decides which series to read, not
/// what a series says).
pub const AGENT_SILENT_AFTER_MS: i64 = 30_000;

/// Which trend judges the leak: the allocated bytes' while the agent answers; once it is
/// silent, NVML's memory for what happened since, but a verdict the agent's figures made
/// stays until NVML's memory has evidence of its own (issue 35: no flip without evidence).
/// A `leak` by live tensors is kept unless NVML's memory says `leak` too (inside a
/// reserved cache NVML's memory is flat while tensors leak: flat is no evidence the leak
/// stopped); growth of NVML's memory that began before the agent's last answer is the
/// cache the agent saw, so the agent's verdict is kept; growth that began after it is
/// new, and NVML's memory judges it.
fn choose_basis(
    reserved: &trend::Trend,
    allocated: Option<(trend::Trend, Option<i64>)>,
) -> (trend::Trend, Basis) {
    let Some((alloc, silent_since)) = allocated else {
        return (reserved.clone(), Basis::Reserved);
    };
    let Some(since) = silent_since else {
        return (alloc, Basis::Allocated);
    };
    let reserved_leak = matches!(reserved.verdict, MemoryVerdict::Leak(_));
    let reserved_grows = reserved_leak || reserved.verdict == MemoryVerdict::Growing;
    let keep = (matches!(alloc.verdict, MemoryVerdict::Leak(_)) && !reserved_leak)
        || (reserved_grows && reserved.onset_unix_ms.is_none_or(|onset| onset <= since));
    if keep {
        (alloc, Basis::Allocated)
    } else {
        (reserved.clone(), Basis::Reserved)
    }
}

/// The report for the current state of a series; `None` when it has no sample.
pub(crate) fn report(
    series: &Tiered,
    allocated: Option<&Tiered>,
    idle: &IdleFold,
    ctx: &SeriesContext,
    cfg: &LeakConfig,
) -> Option<SeriesReport> {
    let points = series.points();
    let last = *series.last()?;
    let first = series.first_t()?;
    let inputs = TrendInputs {
        process_start_unix_ms: ctx.process_start_unix_ms,
        free_bytes: ctx.free_bytes,
        free_history: &ctx.free_history,
        device_total: ctx.device_total,
    };
    let reserved = trend::analyze(&points, inputs, cfg);
    // The allocator's own numbers, where the process reports them, judge the leak: the
    // same analysis on the allocated bytes (a warm-up's cache does not show there).
    let allocated = allocated.filter(|a| a.accepted >= 2);
    let silent_since = allocated
        .and_then(Tiered::last)
        .map(|p| p.t_last)
        .filter(|&t| last.t_last.saturating_sub(t) > AGENT_SILENT_AFTER_MS);
    let allocated_trend =
        allocated.map(|a| (trend::analyze(&a.points(), inputs, cfg), silent_since));
    let (trend, basis) = choose_basis(&reserved, allocated_trend);
    let idle_report = idle.report(last.t_last, series.last_change_ms);
    let idle_holder = idle_report
        .idle_sec
        .is_some_and(|s| s >= cfg.idle_for.as_secs_f64())
        && last.last >= cfg.min_idle_bytes;
    let memory_verdict = |t: &trend::Trend| match t.verdict {
        MemoryVerdict::Leak(rule) => (Verdict::Leak, Some(rule)),
        _ if idle_holder => (Verdict::IdleHolder, None),
        MemoryVerdict::Growing => (Verdict::Growing, None),
        MemoryVerdict::Sawtooth => (Verdict::Sawtooth, None),
        // Releases are seen in NVML's memory (the allocator handing segments back).
        MemoryVerdict::Stable if reserved.verdict == MemoryVerdict::Sawtooth => {
            (Verdict::Sawtooth, None)
        }
        MemoryVerdict::Stable => (Verdict::Stable, None),
    };
    let (verdict, rule) = memory_verdict(&trend);
    let reserved_verdict = (basis == Basis::Allocated)
        .then(|| memory_verdict(&reserved).0)
        .filter(|v| *v != verdict);
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
        time_to_full_sec: trend
            .time_to_full_sec
            .filter(|_| !ctx.ended && rate_known(&trend.region)),
        phase: if trend.settled_unix_ms.is_some() {
            Phase::Settled
        } else {
            Phase::WarmUp
        },
        settled_unix_ms: trend.settled_unix_ms,
        checks: trend.checks,
        releases: reserved.releases,
        release_period_ms: reserved.release_period_ms,
        floor_window_ms: trend.floor_window_ms,
        noise_tolerance_bytes: trend.noise_tolerance_bytes,
        idle: idle_report,
        scale: trend.scale,
        basis,
        allocated_bytes: allocated
            .filter(|_| silent_since.is_none())
            .and_then(Tiered::last)
            .map(|p| p.last),
        reserved_verdict,
        agent_silent_since_unix_ms: silent_since,
        device_total: ctx.device_total,
        judged_unix_ms: trend
            .judged_unix_ms
            .filter(|_| matches!(trend.verdict, MemoryVerdict::Leak(_))),
        trend: trend.region,
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * MIB;
    const T0: i64 = 1_700_000_000_000;

    /// `n` samples `dt_ms` apart, memory from `f(ms since start)`.
    fn series(n: i64, dt_ms: i64, f: impl Fn(i64) -> u64) -> Vec<Sample> {
        (0..n)
            .map(|i| Sample::new(T0 + i * dt_ms, f(i * dt_ms)))
            .collect()
    }

    fn ctx() -> SeriesContext {
        SeriesContext {
            capacity_bytes: Some(141 * GIB),
            free_bytes: Some(100 * GIB),
            free_history: Default::default(),
            process_start_unix_ms: Some(T0),
            device_label: Some("GPU 0".to_owned()),
            ended: false,
            device_total: false,
        }
    }

    fn run(samples: &[Sample]) -> SeriesReport {
        analyze(
            samples,
            &ActivityInputs::default(),
            &ctx(),
            &LeakConfig::default(),
        )
        .unwrap()
    }

    /// Granular like NVML: rounded down to 2 MiB.
    fn granule(bytes: f64) -> u64 {
        (bytes.max(0.0) as u64) / (2 * MIB) * (2 * MIB)
    }

    /// Deterministic noise in [-1, 1].
    fn noise(i: i64) -> f64 {
        let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        let x = (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }

    #[test]
    fn empty_series_is_an_error() {
        let e = analyze(
            &[],
            &ActivityInputs::default(),
            &ctx(),
            &LeakConfig::default(),
        );
        assert_eq!(e, Err(AnalysisError::NoSamples));
        let bad = LeakConfig {
            alpha: 2.0,
            ..LeakConfig::default()
        };
        let e = analyze(
            &series(3, 100, |_| 1),
            &ActivityInputs::default(),
            &ctx(),
            &bad,
        );
        assert!(matches!(e, Err(AnalysisError::InvalidConfig(_))));
    }

    #[test]
    fn single_sample_has_nothing_to_judge() {
        let r = run(&[Sample::new(T0, 3 * GIB)]);
        assert_eq!(r.verdict, Verdict::Stable);
        assert_eq!(r.samples, 1);
        assert_eq!(r.onset_unix_ms, None);
        assert!(r.explanation.contains("single sample"), "{}", r.explanation);
    }

    #[test]
    fn flat_is_stable() {
        let r = run(&series(300, 1000, |_| 6 * GIB));
        assert_eq!(r.verdict, Verdict::Stable);
        assert_eq!(r.p_value, 1.0);
        assert_eq!(r.slope_bytes_per_sec, 0.0);
        assert_eq!(r.onset_unix_ms, None);
        assert_eq!(r.time_to_full_sec, None);
        assert_eq!(r.phase, Phase::Settled);
        assert_eq!(
            r.explanation,
            "stable at 6.0 GiB after warm-up ended at 22:13:20 UTC"
        );
    }

    #[test]
    fn ramp_after_a_plateau_is_a_leak_with_its_numbers() {
        // 60 s flat, then 16 MB/s (in 2 MiB granules) for 60 s, at 100 ms.
        let rate = 16e6;
        let s = series(1200, 100, |t| {
            GIB + granule(((t - 60_000).max(0) as f64 / 1000.0) * rate)
        });
        let r = run(&s);
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
        assert_eq!(r.rule, Some(LeakRule::AfterPlateau));
        let onset = r.onset_unix_ms.unwrap() - T0;
        assert!((59_000..=61_000).contains(&onset), "onset {onset}");
        assert!(
            (r.slope_bytes_per_sec / rate - 1.0).abs() < 0.05,
            "{}",
            r.slope_bytes_per_sec
        );
        let expected = rate * 60.0;
        assert!((r.net_growth_bytes as f64 / expected - 1.0).abs() < 0.05);
        assert!(r.p_value < 1e-6);
        let eta = r.time_to_full_sec.unwrap();
        assert!((eta - 100.0 * GIB as f64 / rate).abs() / eta < 0.05);
        assert!(r.checks.significant && r.checks.material && r.checks.persistent);
        assert!(
            r.explanation.starts_with("leaks 16 MB/s since 22:14:"),
            "{}",
            r.explanation
        );
        assert!(
            r.explanation.contains("GPU 0 is full in 1 h 5"),
            "{}",
            r.explanation
        );
    }

    #[test]
    fn a_leak_is_flagged_within_30_s_of_its_start_at_10_hz() {
        // 10 MB/s, the goal's slowest leak: replay sample by sample.
        let rate = 10e6;
        let s = series(1500, 100, |t| {
            GIB + granule(((t - 60_000).max(0) as f64 / 1000.0) * rate)
        });
        let mut tracker = ProcessTracker::new(ctx(), LeakConfig::default()).unwrap();
        let mut flagged = None;
        for sample in &s {
            if let Some(change) = tracker.push(*sample) {
                if change.to == Verdict::Leak && flagged.is_none() {
                    flagged = Some(change.at_unix_ms - T0 - 60_000);
                }
            }
        }
        let delay = flagged.expect("flagged");
        assert!(delay <= 30_000, "delay {delay} ms");
    }

    #[test]
    fn no_time_to_full_from_too_few_levels_or_for_a_process_that_ended() {
        // Steady for a minute, then three samples each 8 GiB higher: growing, but three
        // levels say nothing about a rate.
        let mut s = series(600, 100, |_| 4 * GIB);
        for i in 1..=3 {
            s.push(Sample::new(
                T0 + 60_000 + i * 100,
                4 * GIB + i as u64 * 8 * GIB,
            ));
        }
        let r = run(&s);
        assert_eq!(r.verdict, Verdict::Growing, "{}", r.explanation);
        assert!((r.trend.levels as usize) < MIN_FORECAST_LEVELS);
        // One or two steps are a size: no rate in the explanation either.
        assert!(
            r.explanation.contains("a size, not yet a rate"),
            "{}",
            r.explanation
        );
        assert_eq!(r.time_to_full_sec, None);
        assert!(!r.explanation.contains("full in"), "{}", r.explanation);
        // A steady rise over many levels gets its forecast...
        let s = series(600, 100, |t| granule(t as f64 / 1000.0 * 20e6));
        assert!(run(&s).time_to_full_sec.is_some());
        // ...unless the process ended before the data did.
        let ended = SeriesContext {
            ended: true,
            ..ctx()
        };
        let r = analyze(
            &s,
            &ActivityInputs::default(),
            &ended,
            &LeakConfig::default(),
        )
        .unwrap();
        assert_eq!(r.time_to_full_sec, None);
        assert!(!r.explanation.contains("full in"), "{}", r.explanation);
    }

    /// The verdicts a tracker gives while the samples are pushed one by one, as
    /// `leaks --watch` gives them: (ms since T0, verdict) of every change.
    fn live_changes(samples: &[Sample], c: &SeriesContext) -> Vec<(i64, Verdict)> {
        let mut tracker = ProcessTracker::new(c.clone(), LeakConfig::default()).unwrap();
        samples
            .iter()
            .filter_map(|x| tracker.push(*x))
            .map(|c| (c.at_unix_ms - T0, c.to))
            .collect()
    }

    /// A fast leak from its first step is `fills-device` while the device is nearly full;
    /// when other processes free memory, its forecast lengthens and nothing fires until
    /// steady-growth's 40 s — the floor still rising. The look-back at earlier ends must
    /// ask with the free memory of then, else the verdict falls back to `growing`
    /// (`hook-activations`, second H200 recording: leak +44.5 s, growing +46.5 s, leak
    /// +47.5 s on `vramctl leaks` run every second; live did not flip).
    #[test]
    fn a_leak_stays_a_leak_when_other_processes_free_memory_before_steady_growth_can_fire() {
        let s = series(360, 100, |t| GIB + granule(t as f64 / 1000.0 * 120e6));
        let now = s.last().map(|x| x.t_unix_ms).unwrap_or(T0);
        // 5 GiB free until 30 s (full in about 45 s: urgent), then 100 GiB (15 minutes).
        let mut history = FreeHistory::default();
        for x in &s {
            let t = x.t_unix_ms;
            history.push(t, Some(if t < T0 + 30_000 { 5 * GIB } else { 100 * GIB }));
        }
        let free_now = SeriesContext {
            free_bytes: Some(100 * GIB),
            ..ctx()
        };
        let cfg = LeakConfig::default();
        let without = analyze(&s, &ActivityInputs::default(), &free_now, &cfg).unwrap();
        assert_eq!(without.verdict, Verdict::Growing, "{}", without.explanation);
        let with = SeriesContext {
            free_history: history.snapshot(),
            ..free_now
        };
        let kept = analyze(&s, &ActivityInputs::default(), &with, &cfg).unwrap();
        assert_eq!(kept.verdict, Verdict::Leak, "{}", kept.explanation);
        assert_eq!(kept.rule, Some(LeakRule::FillsDevice));
        assert!(now - T0 < 40_000, "before steady-growth could fire");
        // The history keeps one entry a second, and none older than its span.
        let mut h = FreeHistory::default();
        assert!(h.push(0, Some(1)) && !h.push(999, Some(2)) && h.push(1000, Some(3)));
        assert!(!h.push(2000, None));
        assert!(h.push(FreeHistory::SPAN_MS + 1000, Some(4)));
        assert_eq!(
            &*h.snapshot(),
            &[(1000, 3), (FreeHistory::SPAN_MS + 1000, 4)][..]
        );
        assert_eq!(series::free_at(&h.snapshot(), 500, Some(9)), Some(9));
        assert_eq!(series::free_at(&h.snapshot(), 1500, Some(9)), Some(3));
    }

    #[test]
    fn a_leak_from_the_start_reports_its_own_growth_apart_from_the_start_up() {
        // 14 MiB, then the context and the model (+886 MiB) at 2 s, then a 10 MB/s leak
        // from 5 s on: the leak's own growth, not the start-up's, is the evidence.
        let s = series(900, 100, |t| {
            if t < 2_000 {
                14 * MIB
            } else if t < 5_000 {
                900 * MIB
            } else {
                900 * MIB + granule((t - 5_000) as f64 / 1000.0 * 10e6)
            }
        });
        let r = run(&s);
        assert_eq!(r.rule, Some(LeakRule::SteadyGrowth), "{}", r.explanation);
        // The leak grew 10 MB/s for 85 s: about 810 MiB; the start-up was 886 MiB.
        let leak_bytes = 10e6 * (r.last_unix_ms - T0 - 5_000) as f64 / 1000.0;
        let shown = |b: f64| format!("+{} in", human_bytes(b as u64));
        let words: Vec<&str> = r.explanation.split(' ').collect();
        let own = words
            .iter()
            .position(|w| *w == "in")
            .and_then(|i| words.get(i.checked_sub(2)?..i))
            .map(|w| w.join(" "))
            .unwrap_or_default();
        let own_bytes = parse_binary(&own);
        assert!(
            (own_bytes - leak_bytes).abs() < 0.1 * leak_bytes,
            "{own} against {}: {}",
            shown(leak_bytes),
            r.explanation
        );
        assert!(
            r.explanation.contains("of start-up, p"),
            "{}",
            r.explanation
        );
        // A leak from its first step has no start-up to set apart.
        let plain = run(&series(900, 100, |t| {
            GIB + granule(t as f64 / 1000.0 * 20e6)
        }));
        assert!(
            !plain.explanation.contains("start-up"),
            "{}",
            plain.explanation
        );
    }

    /// `(+770.0, MiB)` as bytes.
    fn parse_binary(s: &str) -> f64 {
        let mut it = s.trim_start_matches('(').trim_start_matches('+').split(' ');
        let value: f64 = it.next().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
        let unit = match it.next() {
            Some("KiB") => 1024.0,
            Some("MiB") => MIB as f64,
            Some("GiB") => GIB as f64,
            _ => f64::NAN,
        };
        value * unit
    }

    #[test]
    fn steady_growth_from_the_first_step_is_a_leak_within_a_minute() {
        // 20 MB/s from the first sample (a `total_loss += loss` keeping every graph),
        // 100 GiB free: no warm-up to wait for, the growth does not slow down.
        let s = series(900, 100, |t| GIB + granule(t as f64 / 1000.0 * 20e6));
        let changes = live_changes(&s, &ctx());
        let first_leak = changes.iter().find(|c| c.1 == Verdict::Leak).map(|c| c.0);
        assert!(
            first_leak.is_some_and(|t| t <= 60_000),
            "first leak at {first_leak:?}: {changes:?}"
        );
        let r = run(&s);
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
        assert_eq!(r.rule, Some(LeakRule::SteadyGrowth));
        assert!(r.checks.steady == Some(true));
        assert!(
            r.explanation.contains("steadily from its start"),
            "{}",
            r.explanation
        );
        // Before `min_steady_duration` (40 s) it is only growing, with the reason.
        let r = run(&s[..200]);
        assert_eq!(r.verdict, Verdict::Growing, "{}", r.explanation);
        // The same with 1 GiB free: full long before 40 s, so a leak already.
        let c = SeriesContext {
            free_bytes: Some(GIB),
            free_history: Default::default(),
            ..ctx()
        };
        let r = analyze(
            &s[..200],
            &ActivityInputs::default(),
            &c,
            &LeakConfig::default(),
        )
        .unwrap();
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
        assert_eq!(r.rule, Some(LeakRule::FillsDevice));
    }

    /// Dynamic shapes: every 100 ms a batch of a random length (i.i.d., heavy tailed),
    /// the cache grows to the largest seen so far; `duration_ms` of it sampled every
    /// `dt_ms`. New maxima come ever more rarely: growth that slows down.
    fn warm_up_of_new_maxima(duration_ms: i64, dt_ms: i64) -> Vec<Sample> {
        let mut max = 0.0_f64;
        (0..duration_ms / dt_ms)
            .map(|i| {
                let t = i * dt_ms;
                for k in 0..(dt_ms / 100).max(1) {
                    let u = (noise(t / 100 + k) + 1.0) / 2.0;
                    // Pareto(α = 1.5) lengths, 64 MiB each unit, capped at 16 GiB.
                    let len = (1.0 - u).max(1e-9).powf(-1.0 / 1.5);
                    max = max.max((len * 64.0 * MIB as f64).min(16.0 * GIB as f64));
                }
                Sample::new(T0 + t, 2 * GIB + granule(max))
            })
            .collect()
    }

    #[test]
    fn a_warm_up_of_new_maxima_is_not_a_leak() {
        // Never a leak, at 100 ms and at 1 s.
        for dt in [100, 1000] {
            let s = warm_up_of_new_maxima(600_000, dt);
            let changes = live_changes(&s, &ctx());
            assert!(
                changes.iter().all(|c| c.1 != Verdict::Leak),
                "at {dt} ms: {changes:?}"
            );
        }
    }

    /// The same warm-up on a crowded card: a straight line through its first new maxima
    /// fills the few GiB left within ten times its span, but its growth thins out towards
    /// the end, as a warm-up's does, so the forecast is not trusted (issue 35: the H100
    /// leak sets' `dyn-pareto`, a `fills-device` false alarm at +30 s). A leak that
    /// starts after the same start-up and goes on to the last window still fills it.
    #[test]
    fn a_warm_up_of_new_maxima_on_a_crowded_card_does_not_fill_it() {
        let crowded = SeriesContext {
            free_bytes: Some(12 * GIB),
            ..ctx()
        };
        for dt in [100, 1000] {
            let s = warm_up_of_new_maxima(120_000, dt);
            let changes = live_changes(&s, &crowded);
            assert!(
                changes.iter().all(|c| c.1 != Verdict::Leak),
                "at {dt} ms: {changes:?}"
            );
        }
        // 10 s of context and model, then 400 MB/s: on the same card a leak within 10 s.
        let s = series(200, 100, |t| {
            let leak_ms = (t - 10_000).max(0) as f64;
            GIB + if t >= 2000 { 2 * GIB } else { 0 } + granule(leak_ms / 1000.0 * 400e6)
        });
        let changes = live_changes(&s, &crowded);
        let first_leak = changes.iter().find(|c| c.1 == Verdict::Leak).map(|c| c.0);
        assert!(
            first_leak.is_some_and(|t| t <= 20_000),
            "first leak at {first_leak:?}: {changes:?}"
        );
    }

    #[test]
    fn slow_steady_growth_from_the_start_is_a_leak() {
        // 1 MB/s from the start, at 1 s: a leak once 128 MiB have grown at the steady
        // rate (~2.5 min), without waiting for the 10 min warm-up cap.
        let s = series(400, 1000, |t| GIB + granule(t as f64 / 1000.0 * 1e6));
        let changes = live_changes(&s, &ctx());
        let first_leak = changes.iter().find(|c| c.1 == Verdict::Leak).map(|c| c.0);
        assert!(
            first_leak.is_some_and(|t| t <= 300_000),
            "first leak at {first_leak:?}: {changes:?}"
        );
        let r = run(&s);
        assert_eq!(r.rule, Some(LeakRule::SteadyGrowth), "{}", r.explanation);
        assert_eq!(r.phase, Phase::WarmUp);
    }

    #[test]
    fn one_allocation_is_a_size_not_a_rate() {
        // An idle holder's start-up: 12 GiB in one step, then flat. No rate, no forecast
        // ("growing 21 GB/s … full in 6 s" was shown on the H200).
        let mut s = vec![Sample::new(T0, 600 * MIB)];
        s.extend(
            series(20, 100, |_| 12 * GIB + 600 * MIB)
                .into_iter()
                .map(|x| Sample::new(x.t_unix_ms + 500, x.bytes)),
        );
        let r = run(&s);
        assert_eq!(r.time_to_full_sec, None);
        assert!(!r.explanation.contains("full in"), "{}", r.explanation);
        assert!(!r.explanation.contains("/s"), "{}", r.explanation);
        assert_ne!(r.verdict, Verdict::Leak);
    }

    #[test]
    fn allocated_bytes_tell_cache_growth_from_a_leak() {
        // NVML sees 20 MB/s from the start; the allocator says what it is.
        let reserved = series(900, 100, |t| GIB + granule(t as f64 / 1000.0 * 20e6));
        // Flat allocated bytes: the cache grew, not a leak.
        let flat = series(900, 100, |_| 512 * MIB);
        let judge = |allocated: &[Sample]| {
            analyze_series(
                &SeriesInputs {
                    memory: &reserved,
                    allocated,
                },
                &ActivityInputs::default(),
                &ctx(),
                &LeakConfig::default(),
            )
            .unwrap()
        };
        let r = judge(&flat);
        assert_eq!(r.basis, Basis::Allocated);
        assert_ne!(r.verdict, Verdict::Leak, "{}", r.explanation);
        assert_eq!(r.reserved_verdict, Some(Verdict::Leak));
        assert_eq!(r.allocated_bytes, Some(512 * MIB));
        assert!(
            r.explanation.contains("cache, not a leak"),
            "{}",
            r.explanation
        );
        // Allocated bytes retained at the same pace: a leak, judged on them.
        let leaking = series(900, 100, |t| 512 * MIB + granule(t as f64 / 1000.0 * 20e6));
        let r = judge(&leaking);
        assert_eq!(r.basis, Basis::Allocated);
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
        assert_eq!(r.reserved_verdict, None);
        // Without them, NVML's memory alone.
        let r = judge(&[]);
        assert_eq!(r.basis, Basis::Reserved);
        assert_eq!(r.verdict, Verdict::Leak);
    }

    #[test]
    fn a_device_total_is_judged_per_device_without_episodes() {
        // A device's used memory: flat, then a second process starts and loads 30 GiB
        // over 15 s. For a process that is a leak after a plateau; for a device it is a
        // process arriving, and the verdict says it is all processes together.
        let s = series(1200, 100, |t| {
            let loaded = ((t - 60_000).clamp(0, 15_000) as f64 / 15_000.0) * 30.0 * GIB as f64;
            4 * GIB + granule(loaded)
        });
        let device = SeriesContext {
            device_total: true,
            process_start_unix_ms: None,
            ..ctx()
        };
        let r = analyze(
            &s[..720],
            &ActivityInputs::default(),
            &device,
            &LeakConfig::default(),
        )
        .unwrap();
        assert_ne!(r.verdict, Verdict::Leak, "{}", r.explanation);
        assert!(r.device_total);
        assert!(
            r.explanation.starts_with("all processes together: "),
            "{}",
            r.explanation
        );
        let process = analyze(
            &s[..720],
            &ActivityInputs::default(),
            &ctx(),
            &LeakConfig::default(),
        )
        .unwrap();
        assert_eq!(
            process.rule,
            Some(LeakRule::AfterPlateau),
            "{}",
            process.explanation
        );
        // A device total that grows steadily from the start is still a leak (per device).
        let s = series(900, 100, |t| 4 * GIB + granule(t as f64 / 1000.0 * 20e6));
        let r = analyze(
            &s,
            &ActivityInputs::default(),
            &device,
            &LeakConfig::default(),
        )
        .unwrap();
        assert_eq!(r.rule, Some(LeakRule::SteadyGrowth), "{}", r.explanation);
    }

    #[test]
    fn windows_scale_with_the_sampling_interval() {
        // At 100 ms and 1 s the configured times rule; at 10 s a plateau is three flat
        // samples (30 s), not two, and the steadiness test needs five intervals (50 s).
        let flat = |dt: i64| run(&series(100, dt, |_| GIB)).scale;
        let s = flat(100);
        assert_eq!(
            (s.interval_ms, s.plateau_ms, s.min_steady_ms),
            (100, 20_000, 40_000)
        );
        assert_eq!(flat(1000).plateau_ms, 20_000);
        let s = flat(10_000);
        assert_eq!((s.interval_ms, s.plateau_ms), (10_000, 30_000));
        assert_eq!((s.min_leak_ms, s.min_steady_ms), (20_000, 50_000));
        assert_eq!(s.min_irregular_ms, 60_000);
        // A leak from the first step read every 10 s is still found, in two minutes.
        let s = series(60, 10_000, |t| GIB + granule(t as f64 / 1000.0 * 20e6));
        let changes = live_changes(&s, &ctx());
        let first_leak = changes.iter().find(|c| c.1 == Verdict::Leak).map(|c| c.0);
        assert!(
            first_leak.is_some_and(|t| t <= 120_000),
            "first leak at {first_leak:?}: {changes:?}"
        );
    }

    #[test]
    fn warm_up_steps_that_stop_are_stable() {
        // Context, weights, optimizer state, a few cache steps, then a plateau.
        let steps = [
            (0, 580 * MIB),
            (300, 2 * GIB),
            (2000, 3 * GIB),
            (5000, 3 * GIB + 40 * MIB),
        ];
        let s = series(600, 500, |t| {
            steps
                .iter()
                .rev()
                .find(|(at, _)| t >= *at)
                .map_or(0, |(_, v)| *v)
        });
        let r = run(&s);
        assert_eq!(r.verdict, Verdict::Stable, "{}", r.explanation);
        assert_eq!(r.settled_unix_ms, Some(T0 + 5000));
    }

    #[test]
    fn a_regular_staircase_after_a_plateau_is_a_leak() {
        // 256 MiB every 8 s from 30 s on (leak_staircase.py), seen at 10 Hz.
        let s = |until_ms: i64| {
            series(until_ms / 100, 100, |t| {
                let steps = if t < 30_000 {
                    0
                } else {
                    (t - 30_000) / 8000 + 1
                };
                GIB + 580 * MIB + steps as u64 * 256 * MIB
            })
        };
        let r = run(&s(55_000));
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
        assert!(r.trend.regular_steps);
        assert_eq!(r.trend.rises, 4);
        // Two steps are not enough evidence yet.
        let r = run(&s(40_000));
        assert_eq!(r.verdict, Verdict::Growing, "{}", r.explanation);
    }

    #[test]
    fn an_irregular_short_staircase_is_not_a_leak_yet() {
        // Growing shapes: steps of different sizes at uneven times after a plateau.
        let steps = [
            (30_000, 270),
            (35_000, 300),
            (41_600, 350),
            (51_000, 380),
            (58_000, 420),
        ];
        let s = series(700, 100, |t| {
            GIB + steps
                .iter()
                .filter(|(at, _)| t >= *at)
                .map(|(_, m)| m * MIB)
                .sum::<u64>()
        });
        let r = run(&s);
        assert_eq!(r.verdict, Verdict::Growing, "{}", r.explanation);
        assert!(!r.trend.regular_steps);
        assert!(!r.checks.persistent);
        assert!(r.checks.irregular_staircase);
        assert!(
            r.explanation.contains("28 s of irregular steps"),
            "{}",
            r.explanation
        );
        // Once it stops for long enough, it is stable.
        let s = series(1200, 100, |t| {
            GIB + steps
                .iter()
                .filter(|(at, _)| t >= *at)
                .map(|(_, m)| m * MIB)
                .sum::<u64>()
        });
        assert_eq!(run(&s).verdict, Verdict::Stable);
    }

    #[test]
    fn a_sawtooth_is_not_a_leak() {
        // 2 GiB weights; 4 GiB built over 2 s, held 2 s, released, 3 s low; period 7 s.
        let saw = |t: i64| {
            let phase = t % 7000;
            let kv = if phase < 2000 {
                phase / 250 + 1
            } else if phase < 4000 {
                8
            } else {
                0
            };
            580 * MIB + 2 * GIB + kv as u64 * 512 * MIB
        };
        let r = run(&series(3000, 100, saw));
        assert_eq!(r.verdict, Verdict::Sawtooth, "{}", r.explanation);
        assert!(r.releases >= 40);
        assert_eq!(
            r.release_period_ms.map(|p| (p + 50) / 100 * 100),
            Some(7000)
        );
        assert_eq!(r.floor_bytes, 580 * MIB + 2 * GIB);
        // The same with a floor that rises 64 MiB per cycle after a minute is a leak.
        let rising = |t: i64| saw(t) + ((t - 60_000).max(0) / 7000) as u64 * 64 * MIB;
        let r = run(&series(3000, 100, rising));
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
    }

    #[test]
    fn noise_is_not_a_leak_but_a_ramp_in_noise_is() {
        // ±64 MiB of jitter around 8 GiB (many small allocate/free cycles).
        let jitter = |i: i64| (noise(i) * 64.0 * MIB as f64) as i64;
        let s: Vec<Sample> = (0..3000)
            .map(|i| Sample::new(T0 + i * 100, (8 * GIB as i64 + jitter(i)) as u64))
            .collect();
        let r = run(&s);
        assert_ne!(r.verdict, Verdict::Leak, "{}", r.explanation);
        assert!(r.noise_tolerance_bytes > 4 * MIB);
        // 20 MB/s after 2 min, in the same noise.
        let s: Vec<Sample> = (0..3000)
            .map(|i| {
                let t = i * 100;
                let ramp = ((t - 120_000).max(0) as f64 / 1000.0 * 20e6) as i64;
                Sample::new(T0 + t, (8 * GIB as i64 + jitter(i) + ramp) as u64)
            })
            .collect();
        let r = run(&s);
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
        let onset = r.onset_unix_ms.unwrap() - T0;
        assert!((100_000..=140_000).contains(&onset), "onset {onset}");
    }

    #[test]
    fn gaps_do_not_break_a_leak() {
        let mut s = series(1200, 100, |t| {
            GIB + granule(((t - 30_000).max(0)) as f64 * 20e3)
        });
        // The recorder was down for 10 minutes; the leak went on meanwhile.
        let after: Vec<Sample> = (0..300)
            .map(|i| {
                let t = 720_000 + i * 100;
                let mut x = Sample::new(T0 + t, GIB + granule((t - 30_000) as f64 * 20e3));
                x.gap_before = i == 0;
                x
            })
            .collect();
        s.extend(after);
        let r = run(&s);
        assert_eq!(r.gaps, 1);
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
    }

    #[test]
    fn huge_values_do_not_overflow() {
        let top = u64::MAX - 10 * GIB;
        let r = run(&series(600, 100, |_| top));
        assert_eq!(r.verdict, Verdict::Stable);
        let r = run(&series(600, 100, |t| {
            top + granule((t - 20_000).max(0) as f64 * 1e4)
        }));
        assert!(r.net_growth_bytes > 0);
        let r = run(&[
            Sample::new(T0, u64::MAX),
            Sample::new(T0 + 1, 0),
            Sample::new(T0 + 2, u64::MAX),
        ]);
        assert!(r.samples == 3);
        // At both ends of the time range, with memory near u64::MAX, rising or falling.
        let edge = series::MAX_ABS_T_MS;
        let rising: Vec<Sample> = (0..300)
            .map(|i| Sample::new(-edge + i * 1000, u64::MAX / 2 + i as u64 * GIB))
            .collect();
        let r = run(&rising);
        assert!(r.net_growth_bytes > 0, "{}", r.explanation);
        let falling: Vec<Sample> = (0..300)
            .map(|i| Sample::new(edge - 300_000 + i * 1000, u64::MAX - i as u64 * GIB))
            .collect();
        assert_eq!(run(&falling).verdict, Verdict::Stable);
    }

    #[test]
    fn decreasing_is_stable() {
        let r = run(&series(600, 1000, |t| 20 * GIB - granule(t as f64 * 1e4)));
        assert_eq!(r.verdict, Verdict::Stable, "{}", r.explanation);
        assert!(r.net_growth_bytes <= 0);
    }

    #[test]
    fn samples_out_of_order_are_ignored_and_counted() {
        let mut s = series(100, 100, |_| GIB);
        s.insert(50, Sample::new(T0, 99 * GIB));
        s.push(Sample::new(T0 + 9_900, 99 * GIB));
        let r = run(&s);
        assert_eq!(r.ignored_samples, 2);
        assert_eq!(r.peak_bytes, GIB);
    }

    #[test]
    fn slow_leaks_show_over_hours() {
        // 2 MiB every 40 s (52 kB/s, 4.3 GiB a day), sampled every second for 6 h.
        let r = run(&series(6 * 3600, 1000, |t| {
            4 * GIB + (t / 40_000) as u64 * 2 * MIB
        }));
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
        // 256 MiB every 10 min for 6 h.
        let r = run(&series(6 * 3600, 1000, |t| {
            4 * GIB + (t / 600_000) as u64 * 256 * MIB
        }));
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
    }

    #[test]
    fn idle_holder_needs_memory_and_evidence() {
        let cfg = LeakConfig {
            idle_for: Duration::from_secs(600),
            ..LeakConfig::default()
        };
        let s = series(1800, 1000, |_| 12 * GIB);
        let cpu: Vec<CpuSample> = (0..1800)
            .map(|i| CpuSample {
                t_unix_ms: T0 + i * 1000,
                cpu_time_ms: 7_000 + if i < 300 { i as u64 * 900 } else { 270_000 },
            })
            .collect();
        let activity = ActivityInputs {
            cpu: &cpu,
            ..ActivityInputs::default()
        };
        let r = analyze(&s, &activity, &ctx(), &cfg).unwrap();
        assert_eq!(r.verdict, Verdict::IdleHolder, "{}", r.explanation);
        assert_eq!(r.idle.idle_since_unix_ms, Some(T0 + 300_000));
        assert_eq!(r.idle.evidence, vec![Evidence::CpuTime]);
        assert_eq!(r.idle.periods.len(), 1);
        assert_eq!(
            r.explanation,
            "holds 12.0 GiB and has been idle for 25 min (evidence: CPU time)"
        );
        // Below min_idle_bytes it is just stable.
        let small = series(1800, 1000, |_| 512 * MIB);
        let r = analyze(&small, &activity, &ctx(), &cfg).unwrap();
        assert_eq!(r.verdict, Verdict::Stable);
        // Without evidence nothing is claimed.
        let r = analyze(&s, &ActivityInputs::default(), &ctx(), &cfg).unwrap();
        assert_eq!(r.verdict, Verdict::Stable);
        assert_eq!(r.idle.sources, Vec::<Evidence>::new());
    }

    #[test]
    fn tracker_reports_an_idle_holder_once_idle_long_enough() {
        let cfg = LeakConfig {
            idle_for: Duration::from_secs(120),
            ..LeakConfig::default()
        };
        let mut tracker = ProcessTracker::new(ctx(), cfg).unwrap();
        let mut changes = Vec::new();
        for i in 0..400 {
            let t = T0 + i * 1000;
            // Busy alone on the device for a minute, then 0 %.
            let util = if i < 60 { 80 } else { 0 };
            tracker.push_device(DeviceActivitySample {
                t_unix_ms: t,
                utilization_gpu_percent: util,
                processes_on_device: 1,
            });
            if let Some(c) = tracker.push(Sample::new(t, 12 * GIB)) {
                changes.push((c.at_unix_ms - T0, c.to));
            }
        }
        let (at, verdict) = *changes.last().unwrap();
        assert_eq!(verdict, Verdict::IdleHolder);
        // Idle from 59 s; idle_for 120 s; the periodic re-check comes within 5 s.
        assert!((179_000..=185_000).contains(&at), "{at}");
        let r = tracker.report().unwrap();
        assert_eq!(r.idle.evidence, vec![Evidence::DeviceUtilization]);
        assert_eq!(r.idle.last_active_unix_ms, Some(T0 + 59_000));
        // Fewer analyses than samples: activity that goes on does not trigger one.
        assert!(tracker.analyses() < 120, "{}", tracker.analyses());
    }

    #[test]
    fn tracker_and_batch_agree() {
        let s = series(2000, 100, |t| {
            GIB + granule(((t - 60_000).max(0) as f64) * 30e3)
        });
        let mut tracker = ProcessTracker::new(ctx(), LeakConfig::default()).unwrap();
        let mut changes = Vec::new();
        for x in &s {
            if let Some(c) = tracker.push(*x) {
                changes.push(c.to);
            }
        }
        assert_eq!(changes.first(), Some(&Verdict::Stable));
        assert_eq!(changes.last(), Some(&Verdict::Leak));
        let live = tracker.analyze_now().unwrap().clone();
        let batch = run(&s);
        assert_eq!(live, batch);
        // Far fewer analyses than samples.
        assert!(tracker.analyses() < 300, "{}", tracker.analyses());
    }

    #[test]
    fn a_fold_fed_interleaved_equals_the_batch() {
        // A sawtooth holder that stops allocating after 1500 s, with all three kinds of
        // evidence, interleaved per tick as a store scan delivers them.
        let s = series(3000, 1000, |t| {
            4 * GIB
                + if t < 1_500_000 && (t / 1000) % 60 < 30 {
                    GIB
                } else {
                    0
                }
        });
        let sm: Vec<SmSample> = (0..3000)
            .step_by(7)
            .map(|i| SmSample {
                t_unix_ms: T0 + i * 1000,
                sm_percent: u32::from(i < 1000),
            })
            .collect();
        let device: Vec<DeviceActivitySample> = (0..3000)
            .map(|i| DeviceActivitySample {
                t_unix_ms: T0 + i * 1000,
                utilization_gpu_percent: if i < 1500 { 30 } else { 0 },
                processes_on_device: 2,
            })
            .collect();
        let cpu: Vec<CpuSample> = (0..3000)
            .step_by(10)
            .map(|i| CpuSample {
                t_unix_ms: T0 + i * 1000,
                cpu_time_ms: u64::try_from(i.min(2000)).unwrap() * 500,
            })
            .collect();
        let cfg = LeakConfig {
            idle_for: Duration::from_secs(600),
            ..LeakConfig::default()
        };
        let batch = analyze(
            &s,
            &ActivityInputs {
                process_sm: &sm,
                device: &device,
                cpu: &cpu,
            },
            &ctx(),
            &cfg,
        )
        .unwrap();
        let mut fold = SeriesFold::new(cfg).unwrap();
        for (i, sample) in s.iter().enumerate() {
            let t = sample.t_unix_ms;
            sm.iter()
                .filter(|x| x.t_unix_ms == t)
                .for_each(|x| fold.push_sm(*x));
            fold.push_device(device[i]);
            cpu.iter()
                .filter(|x| x.t_unix_ms == t)
                .for_each(|x| fold.push_cpu(*x));
            assert!(fold.push(sample));
        }
        assert_eq!(fold.last_unix_ms(), Some(T0 + 2_999_000));
        assert_eq!(fold.report(&ctx()).unwrap(), batch);
        assert_eq!(batch.verdict, Verdict::IdleHolder, "{}", batch.explanation);
        assert_eq!(
            SeriesFold::new(LeakConfig::default())
                .unwrap()
                .report(&ctx()),
            Err(AnalysisError::NoSamples)
        );
    }

    #[test]
    fn report_serializes_with_the_documented_names() {
        let r = run(&series(600, 100, |t| {
            GIB + granule(((t - 20_000).max(0) as f64) * 50e3)
        }));
        let json = serde_json::to_value(&r).unwrap();
        for key in [
            "verdict",
            "explanation",
            "slope_bytes_per_sec",
            "p_value",
            "onset_unix_ms",
            "net_growth_bytes",
            "time_to_full_sec",
            "idle",
            "checks",
            "trend",
        ] {
            assert!(json.get(key).is_some(), "missing {key}");
        }
        assert_eq!(json["verdict"], "leak");
        assert_eq!(
            serde_json::to_value(Verdict::IdleHolder).unwrap(),
            "idle-holder"
        );
    }
}
