//! The memory side of the verdict: floor, plateaus, warm-up, growth regions and the leak
//! rules. `docs/leaks.md` gives the method with its formulas; the names here follow it.
//!
//! Outline, on the points of a [`Tiered`](super::series::Tiered) series:
//! 1. **releases**: drops of at least `max(min_release_bytes, release_fraction × peak)`
//!    from the running peak: the allocator giving memory back (`empty_cache`, a freed
//!    per-request cache). They set the floor window W = 1.5 × the cycle length.
//! 2. **floor** F(t) = min of the memory over (t − W, t] (W = 0 without releases): the
//!    memory held through a whole cycle, so a sawtooth is flat and a rising floor shows.
//! 3. **retained** R(t) = min F over [t, now]: what the process never gave back from t on.
//!    R is non-decreasing; noise and releases do not move it.
//! 4. **scale**: the sampling interval (median gap of the recent samples) sets the least
//!    length of every window, so that a window is never one or two samples.
//! 5. **plateau** at t: R(t) − R(t − plateau) ≤ tol, with tol = max(step tolerance,
//!    4 σ̂) and σ̂ from the falls of the floor (`noise_tolerance`); warm-up ends at the
//!    first plateau (the phase shown, and where episodes can begin).
//! 6. **regions**: the growth since the process started (`since-start`) and, once it has
//!    plateaued, the current episode (since the last plateau). On each: onset, Theil–Sen
//!    slope of F, Mann–Kendall on the distinct successive levels of F, net growth, and
//!    whether R still rose within the stall window. On the since-start region also the
//!    **steadiness test**: the region cut into equal windows, the windows after the first
//!    in which R grew, against a warm-up whose growth comes from new maxima (records of
//!    exchangeable values: batch shapes, request sizes), which grows in window k with
//!    probability 1 − ((k − 1)/k)^m and so ever more rarely.
//! 7. **rules**: `after-plateau` (growth resumed after a plateau, ≥ `min_leak_duration`),
//!    `steady-growth` (growth since the start that does not slow down, ≥
//!    `min_steady_duration`), `fills-device` (in warm-up, growth that fills the device
//!    within `max_forecast_factor` times the time it has been growing, unless the
//!    steadiness test sees it thin out as a warm-up's does).

use serde::Serialize;

use super::config::{LeakConfig, ms};
use super::series::{Point, free_at};
use super::stats::{self, MannKendall};

/// Which rule made a leak verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeakRule {
    /// Growth resumed after the retained memory had plateaued, and keeps going.
    AfterPlateau,
    /// Growth since the process started that has not slowed down as a warm-up does
    /// (the steadiness test), for at least `min_steady_duration`.
    SteadyGrowth,
    /// In warm-up (no plateau since the start), growth that fills the device within
    /// `max_forecast_factor` times the time it has been growing: too fast to wait for
    /// `min_steady_duration`. Not where the steadiness test sees the growth thin out as a
    /// warm-up's does ([`Steadiness::p_value_at_end`]).
    FillsDevice,
}

/// Which part of the series a [`TrendTest`] judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RegionKind {
    /// Everything since the process started (after `min_warmup`).
    SinceStart,
    /// The current growth episode: since the last plateau after warm-up.
    Episode,
}

/// The steadiness test of the since-start region: does the growth go on at a steady
/// pace, or does it slow down as a warm-up does?
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Steadiness {
    /// Equal windows from the onset to the last sample (at most `steady_windows`, at
    /// least one sample interval each).
    pub windows: u32,
    /// Length of one window, seconds.
    pub window_sec: f64,
    /// Windows after the first in which the retained memory grew by at least a quarter
    /// of its mean growth per window there.
    pub growing_windows: u32,
    /// How many of them a warm-up of new maxima would grow in, on average.
    pub expected_growing_windows: f64,
    /// One-sided p-value of "a warm-up that slows down": the chance of at least
    /// `growing_windows` under it.
    pub p_value: f64,
    /// The windows at the end, back from the last, in which the retained memory grew
    /// without a break (the first window not counted).
    pub growing_at_end: u32,
    /// The chance that a warm-up that slows down grows in each of the last
    /// `growing_at_end` windows: where its growth went, which the count above ignores
    /// (a warm-up's growth thins out towards the end; a leak's goes on to the last window).
    pub p_value_at_end: f64,
    /// End of the first window: the start-up allocations are behind.
    pub later_from_unix_ms: i64,
    /// Growth of the retained memory since then.
    pub later_growth_bytes: i64,
}

/// The numbers of one judged region of the series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrendTest {
    /// The part of the series judged.
    pub region: RegionKind,
    /// Onset: the last point at the region's base level, ms since the Unix epoch.
    pub from_unix_ms: i64,
    /// From onset to the last sample.
    pub duration_sec: f64,
    /// Theil–Sen slope of the floor: since onset for an episode; for the since-start
    /// region since the end of the steadiness test's first window (the rate once the
    /// start-up allocations are behind).
    pub slope_bytes_per_sec: f64,
    /// Retained memory now minus at onset.
    pub net_growth_bytes: i64,
    /// Distinct successive levels of the floor since onset (a rate needs
    /// [`MIN_FORECAST_LEVELS`](super::MIN_FORECAST_LEVELS)).
    pub levels: u32,
    /// Times the retained memory rose since onset (the allocator's steps).
    pub rises: u32,
    /// Median time between steps (rises not far below the median rise; 0 with fewer than
    /// two).
    pub median_rise_gap_sec: f64,
    /// How long the growth itself has gone on: from onset (for the since-start region,
    /// from the first rise) to the last step.
    pub growth_span_sec: f64,
    /// The rises, merged when less than a second apart, are equal in size (±10 %) and
    /// come at a steady rhythm (±25 %): the same allocation kept again and again. For the
    /// since-start region: the last four steps are, more than the coarse step gap apart
    /// (the start-up allocations before them do not count).
    pub regular_steps: bool,
    /// The retained memory rose within the stall window before the last sample.
    pub still_growing: bool,
    /// Stall window used for `still_growing`, seconds.
    pub stall_window_sec: f64,
    /// Releases (drops) since onset.
    pub releases: u32,
    /// The trend test; `None` when the region is flat within the noise tolerance.
    pub mann_kendall: Option<MannKendall>,
    /// The steadiness test (the since-start region, when it was run).
    pub steadiness: Option<Steadiness>,
}

impl TrendTest {
    /// One-sided p-value of "no upward trend" (1 when not tested).
    pub fn p_value(&self) -> f64 {
        self.mann_kendall.map_or(1.0, |m| m.p_value)
    }
}

/// The gates of the leak rules, as evaluated on the region that was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LeakChecks {
    /// Warm-up is over (the retained memory plateaued once since the start).
    pub settled: bool,
    /// Mann–Kendall p < alpha.
    pub significant: bool,
    /// Enough growth: for an episode, net growth ≥ `min_growth_bytes` and slope ≥
    /// `min_slope_bytes_per_sec`; since the start, the slope times the time since the
    /// steadiness test's first window ≥ `min_growth_bytes`.
    pub material: bool,
    /// Growth (onset to last rise) has lasted long enough: `min_leak_duration` for an
    /// episode (and, for a coarse staircase, regular steps or
    /// `min_irregular_duration`), `min_steady_duration` since the start; each at least a
    /// few sample intervals.
    pub persistent: bool,
    /// Still rising at the end.
    pub still_growing: bool,
    /// The steadiness test rejects a warm-up that slows down (p < alpha); `None` for an
    /// episode (not tested).
    pub steady: Option<bool>,
    /// Growth long enough, but in coarse irregular steps for less than
    /// `min_irregular_duration`: what holds back `persistent` for an episode.
    pub irregular_staircase: bool,
    /// At this rate the device is full within `max_forecast_factor` times the time the
    /// growth has lasted (the since-start region; without releases, from enough levels),
    /// and the steadiness test does not refute the straight line (`forecast_stands`).
    pub urgent: bool,
}

/// Memory verdict before idle evidence is considered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemoryVerdict {
    Leak(LeakRule),
    Growing,
    Sawtooth,
    Stable,
}

/// Everything the memory analysis found.
#[derive(Debug, Clone)]
pub(crate) struct Trend {
    pub verdict: MemoryVerdict,
    /// Where a `leak` is kept from an analysis at an earlier end: that end's last sample.
    pub judged_unix_ms: Option<i64>,
    pub settled_unix_ms: Option<i64>,
    pub region: TrendTest,
    pub onset_unix_ms: Option<i64>,
    pub checks: LeakChecks,
    pub releases: u32,
    pub release_period_ms: Option<i64>,
    pub floor_window_ms: i64,
    pub noise_tolerance_bytes: u64,
    pub floor_bytes: u64,
    pub time_to_full_sec: Option<f64>,
    /// The windows as scaled to this series.
    pub scale: Scale,
    /// The growth since the start could fire a rule (material, long enough, still
    /// growing): what keeps an earlier `leak` verdict on.
    pub since_start_could_fire: bool,
    /// The growth since the start is material (`min_growth`).
    pub since_start_material: bool,
    /// The retained memory rose by more than the noise tolerance within [`MEMORY_MS`].
    pub floor_rose_within_memory: bool,
    /// The since-start region's stall window, seconds.
    pub since_start_stall_sec: f64,
}

/// What the memory analysis needs besides the points.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TrendInputs<'a> {
    pub process_start_unix_ms: Option<i64>,
    pub free_bytes: Option<u64>,
    /// The device's free memory at earlier times ([`super::series::FreeHistory`]).
    pub free_history: &'a [(i64, u64)],
    /// The series is a device's total: growth after a plateau may be a new process
    /// starting, so only the since-start rules judge it.
    pub device_total: bool,
}

/// The windows of the analysis scaled to the series' sampling interval: each is the
/// configured time, or this many sample intervals when that is longer, so that at a 10 s
/// interval a plateau is not two samples and a growth span not one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Scale {
    /// Median gap between the recent samples, ms.
    pub interval_ms: i64,
    /// `plateau`, at least [`PLATEAU_SAMPLES`] intervals.
    pub plateau_ms: i64,
    /// `min_leak_duration`, at least [`SPAN_SAMPLES`] intervals.
    pub min_leak_ms: i64,
    /// `min_steady_duration`, at least [`STEADY_MIN_WINDOWS`] intervals.
    pub min_steady_ms: i64,
    /// `coarse_step_gap`, at least [`SPAN_SAMPLES`] intervals.
    pub coarse_gap_ms: i64,
    /// `min_irregular_duration`, at least [`IRREGULAR_SAMPLES`] intervals.
    pub min_irregular_ms: i64,
}

/// Sample intervals in the shortest plateau: a stretch of three flat samples.
pub const PLATEAU_SAMPLES: i64 = 3;
/// Sample intervals in the shortest growth span, and in the widest step gap that is still
/// continuous growth.
pub const SPAN_SAMPLES: i64 = 2;
/// Fewest windows of the steadiness test: with five, growth in the four after the first
/// is p = 1/5! ≈ 0.0083 under one source of new maxima, the first count below `alpha`.
pub const STEADY_MIN_WINDOWS: usize = 5;
/// Sample intervals in the shortest irregular-staircase span.
pub const IRREGULAR_SAMPLES: i64 = 6;
/// A window of the steadiness test counts as growing when R grew in it by at least this
/// fraction of the mean growth per window after the first: a sprinkle of 2 MiB segments
/// is not growth beside a 400 MiB record.
const GROWING_WINDOW_FRACTION: f64 = 0.25;
/// Gaps from the last this many points give the sampling interval.
const INTERVAL_POINTS: usize = 64;

impl Scale {
    fn of(times: &[i64], cfg: &LeakConfig) -> Self {
        let from = times.len().saturating_sub(INTERVAL_POINTS + 1);
        let mut gaps: Vec<f64> = times[from..]
            .windows(2)
            .map(|w| (w[1] - w[0]) as f64)
            .collect();
        let interval_ms = (stats::median_in_place(&mut gaps).unwrap_or(1.0) as i64).max(1);
        let at_least =
            |d: std::time::Duration, samples: i64| ms(d).max(interval_ms.saturating_mul(samples));
        Self {
            interval_ms,
            plateau_ms: at_least(cfg.plateau, PLATEAU_SAMPLES),
            min_leak_ms: at_least(cfg.min_leak_duration, SPAN_SAMPLES),
            min_steady_ms: at_least(cfg.min_steady_duration, STEADY_MIN_WINDOWS as i64),
            coarse_gap_ms: at_least(cfg.coarse_step_gap, SPAN_SAMPLES),
            min_irregular_ms: at_least(cfg.min_irregular_duration, IRREGULAR_SAMPLES),
        }
    }
}

struct Releases {
    times: Vec<i64>,
    /// Cycle length for the floor window.
    cycle_ms: Option<i64>,
    period_ms: Option<i64>,
}

fn release_threshold(cfg: &LeakConfig, peak: u64) -> u64 {
    let frac = (peak as f64 * cfg.release_fraction) as u64;
    cfg.min_release_bytes.max(frac)
}

/// A release is a drop that happens within this time: the allocator handing segments
/// back at once, not a slow decline.
const RELEASE_WINDOW_MS: i64 = 5000;

/// Drops of at least the release threshold from the highest point of the last
/// `RELEASE_WINDOW_MS` (a sliding maximum that restarts after each release, so one drop
/// counts once).
fn find_releases(points: &[Point], cfg: &LeakConfig, interval_ms: i64) -> Releases {
    // At a 10 s interval the 5 s window held no sample before the current one, so no
    // fall was ever seen and a 45 s sawtooth was judged on its live peaks (a `leak` from
    // an nvidia-smi log, issue 35): the window reaches back at least to the previous
    // sample (1.5 intervals, so that jitter does not drop it).
    let release_window_ms = RELEASE_WINDOW_MS.max(interval_ms.saturating_mul(3) / 2);
    let mut times = Vec::new();
    let mut cycles = Vec::new();
    let mut window: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    // Lowest point since the last release: where the current cycle began.
    let mut low = u64::MAX;
    let mut low_t = points.first().map_or(0, Point::t);
    for (i, p) in points.iter().enumerate() {
        let t = p.t();
        while window
            .front()
            .is_some_and(|&j| points[j].t() <= t - release_window_ms)
        {
            window.pop_front();
        }
        // A bucket that spans a release holds its largest fall itself.
        let peak = window.front().map_or(0, |&j| points[j].max);
        let fall = peak.saturating_sub(p.min);
        let released = (fall > 0 && fall >= release_threshold(cfg, peak))
            || (p.drop > 0 && p.drop >= release_threshold(cfg, p.max));
        if released {
            times.push(t);
            cycles.push(t - low_t);
            window.clear();
            low = p.last;
            low_t = t;
            continue;
        }
        if p.min < low {
            low = p.min;
            low_t = t;
        }
        while window.back().is_some_and(|&j| points[j].max <= p.max) {
            window.pop_back();
        }
        window.push_back(i);
    }
    let period_ms = if times.len() >= 2 {
        let mut gaps: Vec<f64> = times.windows(2).map(|w| (w[1] - w[0]) as f64).collect();
        stats::median_in_place(&mut gaps).map(|m| m as i64)
    } else {
        None
    };
    let cycle_ms = period_ms.or_else(|| cycles.first().copied());
    Releases {
        times,
        cycle_ms,
        period_ms,
    }
}

/// Rolling minimum of `min` over (t − window, t], with a monotone deque.
fn floor(points: &[Point], window_ms: i64) -> Vec<u64> {
    let mut out = Vec::with_capacity(points.len());
    let mut deque: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    for (i, p) in points.iter().enumerate() {
        while deque.back().is_some_and(|&j| points[j].min >= p.min) {
            deque.pop_back();
        }
        deque.push_back(i);
        let t = p.t();
        while deque
            .front()
            .is_some_and(|&j| j != i && points[j].t() <= t - window_ms)
        {
            deque.pop_front();
        }
        let j = deque.front().copied().unwrap_or(i);
        out.push(points[j].min);
    }
    out
}

/// Suffix minimum: R[i] = min F[i..].
fn retained(f: &[u64]) -> Vec<u64> {
    let mut r = f.to_vec();
    for i in (0..r.len().saturating_sub(1)).rev() {
        r[i] = r[i].min(r[i + 1]);
    }
    r
}

/// Noise tolerance of the floor: `max(step_tolerance_bytes, 4 σ̂)`.
///
/// Growth moves the floor up, so only its falls measure noise: for symmetric noise of
/// standard deviation σ, the differences ΔF are ~N(0, 2σ²) and the upper quartile of
/// max(−ΔF, 0) is 0.6745·σ√2. A staircase or a ramp has no falls and gets the plain step
/// tolerance; a leak with the odd release keeps it too (three quarters of its falls are 0).
fn noise_tolerance(f: &[u64], cfg: &LeakConfig) -> u64 {
    let mut falls: Vec<f64> = f
        .windows(2)
        .map(|w| w[0].saturating_sub(w[1]) as f64)
        .collect();
    let sigma = if falls.is_empty() {
        0.0
    } else {
        let k = (falls.len() * 3 / 4).min(falls.len() - 1);
        let (_, q, _) = falls.select_nth_unstable_by(k, f64::total_cmp);
        *q / (0.6745 * std::f64::consts::SQRT_2)
    };
    cfg.step_tolerance_bytes.max((4.0 * sigma) as u64)
}

/// Index of the last point with t ≤ `t`, if any.
fn index_at(times: &[i64], t: i64) -> Option<usize> {
    let k = times.partition_point(|&x| x <= t);
    k.checked_sub(1)
}

fn diff_i64(a: u64, b: u64) -> i64 {
    let d = i128::from(a) - i128::from(b);
    i64::try_from(d).unwrap_or(if d > 0 { i64::MAX } else { i64::MIN })
}

struct Series<'a> {
    times: Vec<i64>,
    f: Vec<u64>,
    r: Vec<u64>,
    tol: u64,
    eps: u64,
    cfg: &'a LeakConfig,
    scale: Scale,
    release_times: Vec<i64>,
}

impl Series<'_> {
    fn now(&self) -> i64 {
        self.times.last().copied().unwrap_or(0)
    }

    /// Plateau ending at point i: R rose by at most tol over the preceding plateau window.
    fn quiet(&self, i: usize) -> Option<bool> {
        let plateau_ms = self.scale.plateau_ms;
        let start = self.times[i] - plateau_ms;
        if start < self.times[0] {
            return None;
        }
        let j = index_at(&self.times, start)?;
        // Old points are time buckets wider than the plateau: there the tolerance is a
        // rate (tol per plateau), or a slow leak would look like endless growth.
        let span = (self.times[i] - self.times[j]) as f64;
        let allowed = self.tol as f64 * (span / plateau_ms as f64).max(1.0);
        Some(self.r[i].saturating_sub(self.r[j]) as f64 <= allowed)
    }

    /// Where the plateau ending at point `i` is only a beat of a staircase: the index of
    /// the step that reached its level, when the flat stretch from that step to the next
    /// rise (or to now) is at most [`EPISODE_RHYTHM_FACTOR`] times the gap between that step and the
    /// one before it; `None` when it is a real pause (or there is no step before it to
    /// set a rhythm).
    fn rhythm_step_into(&self, i: usize) -> Option<usize> {
        let level = self.r[i];
        // R is non-decreasing: the points at a level are a run, found by bisection.
        let into = self
            .r
            .partition_point(|&v| v.saturating_add(self.tol) < level);
        let next = i + self.r[i..].partition_point(|&v| v <= level.saturating_add(self.eps));
        if into == 0 {
            return None;
        }
        let below = self.r[into - 1];
        let before = self
            .r
            .partition_point(|&v| v.saturating_add(self.tol) < below);
        if before == 0 {
            return None;
        }
        // A staircase keeps the same allocation: the two steps are of a size. With
        // σ = 256 MiB on every sample the retained memory creeps up in rises of any
        // size, and chaining those into one episode made a steady training run a `leak`
        // (noise sweep).
        let step_into = level.saturating_sub(below) as f64;
        let step_before = below.saturating_sub(self.r[before - 1]) as f64;
        if (step_into - step_before).abs() > RHYTHM_STEP_SIZE_TOLERANCE * step_into.max(step_before)
        {
            return None;
        }
        let gap_ms = (self.times[into] - self.times[before]) as f64;
        // Still flat at the end: the pause so far (a beat until it outlasts the rhythm).
        let resumed = self.times.get(next).copied().unwrap_or_else(|| self.now());
        let pause_ms = (resumed - self.times[into]) as f64;
        (pause_ms <= EPISODE_RHYTHM_FACTOR * gap_ms).then_some(into)
    }

    /// The numbers of the region that starts at point `from`, without the tests
    /// (`add_tests`), and the index of its onset.
    fn region(&self, from: usize, kind: RegionKind) -> (TrendTest, usize) {
        let n = self.times.len();
        let base = self.r[from];
        // R is non-decreasing: the points at the base level are a prefix of the region.
        let onset =
            from + self.r[from..].partition_point(|&v| v <= base.saturating_add(self.eps)) - 1;
        let now = self.now();
        let growth = diff_i64(self.r[n - 1], self.r[onset]);
        let rises: Vec<(i64, u64)> = (onset + 1..n)
            .filter(|&k| self.r[k] > self.r[k - 1].saturating_add(self.eps))
            .map(|k| (self.times[k], self.r[k] - self.r[k - 1]))
            .collect();
        // A blip far smaller than the typical step is not a step of the staircase (a late
        // 16 MiB segment after 400 MiB steps must not stretch the growth).
        let mut sizes: Vec<f64> = rises.iter().map(|r| r.1 as f64).collect();
        let median_size = stats::median_in_place(&mut sizes).unwrap_or(0.0);
        let steps: Vec<(i64, u64)> = rises
            .iter()
            .copied()
            .filter(|r| r.1 as f64 >= SMALL_RISE_FRACTION * median_size)
            .collect();
        let last_step = steps.last().map(|r| r.0);
        // Since the start, growth is counted from the first rise seen, not from the last
        // sample at the base: at a 10 s interval that sample may be 10 s before the
        // growth began, and a rule that waits for a span must not count time unseen.
        let span_from = match kind {
            RegionKind::Episode => self.times[onset],
            RegionKind::SinceStart => rises.first().map_or(self.times[onset], |r| r.0),
        };
        let growth_span_ms = last_step.map_or(0, |t| (t - span_from).max(0));
        let mut gaps: Vec<f64> = steps.windows(2).map(|w| (w[1].0 - w[0].0) as f64).collect();
        let median_gap = stats::median_in_place(&mut gaps).unwrap_or(0.0);
        // The stall window waits for the next step only when there is a rhythm to wait
        // for: two gaps at least. One gap is the time between a start-up allocation and
        // a single later step (an optimizer created lazily at 90 s): waiting three times
        // that kept one step then flat `growing` for 4½ minutes (issue 35).
        let rhythm_gap = if gaps.len() >= RHYTHM_GAPS {
            median_gap
        } else {
            0.0
        };
        let stall_ms =
            (self.scale.plateau_ms as f64).max(self.cfg.stall_factor * rhythm_gap) as i64;
        let recent = index_at(&self.times, now - stall_ms).map_or(onset, |k| k.max(onset));
        let still_growing = self.r[n - 1].saturating_sub(self.r[recent]) > self.tol
            && last_step.is_some_and(|t| now - t <= stall_ms);
        let onset_t = self.times[onset];
        let releases = self.release_times.iter().filter(|&&t| t > onset_t).count();
        let levels = 1 + self.f[onset..].windows(2).filter(|w| w[0] != w[1]).count();
        let region = TrendTest {
            region: kind,
            from_unix_ms: onset_t,
            duration_sec: (now - onset_t) as f64 / 1000.0,
            slope_bytes_per_sec: 0.0,
            net_growth_bytes: growth,
            levels: u32::try_from(levels).unwrap_or(u32::MAX),
            rises: u32::try_from(rises.len()).unwrap_or(u32::MAX),
            growth_span_sec: growth_span_ms as f64 / 1000.0,
            median_rise_gap_sec: median_gap / 1000.0,
            regular_steps: match kind {
                RegionKind::Episode => regular(&steps),
                RegionKind::SinceStart => regular_tail(&steps, self.scale.coarse_gap_ms),
            },
            still_growing,
            stall_window_sec: stall_ms as f64 / 1000.0,
            releases: u32::try_from(releases).unwrap_or(u32::MAX),
            mann_kendall: None,
            steadiness: None,
        };
        (region, onset)
    }

    /// Runs the Theil–Sen slope and the Mann–Kendall test on a region (O(m²), m ≤
    /// `max_test_points`), and on the since-start region the steadiness test; a region
    /// flat within the noise tolerance is not tested.
    fn add_tests(&self, region: &mut TrendTest, onset: usize) {
        let flat = region.net_growth_bytes <= i64::try_from(self.tol).unwrap_or(i64::MAX);
        if region.mann_kendall.is_some() || flat {
            return;
        }
        region.mann_kendall = Some(self.mann_kendall(onset));
        match region.region {
            RegionKind::Episode => region.slope_bytes_per_sec = self.slope(onset),
            RegionKind::SinceStart => {
                let (steadiness, later) = self.steadiness(onset);
                region.slope_bytes_per_sec = self.slope(later);
                region.steadiness = steadiness;
            }
        }
    }

    /// The steadiness test on the region from `onset` to now, and the index where its
    /// latest half starts. `None` when the region is too short for
    /// [`STEADY_MIN_WINDOWS`] windows of at least one sample interval.
    fn steadiness(&self, onset: usize) -> (Option<Steadiness>, usize) {
        let n = self.times.len();
        let t_on = self.times[onset];
        let span = self.now() - t_on;
        let at = |t: i64| index_at(&self.times, t).map_or(onset, |i| i.max(onset));
        let by_interval = usize::try_from(span / self.scale.interval_ms.max(1)).unwrap_or(0);
        let k = self.cfg.steady_windows.min(by_interval);
        if k < STEADY_MIN_WINDOWS {
            return (None, onset);
        }
        let width = span as f64 / k as f64;
        // After the first window: the start-up allocations (context, weights, optimizer
        // state) are behind, and the growth since then only grows with time under a
        // steady leak (a moving half would make a coarse staircase flap around a gate).
        let later = at(t_on + width as i64);
        // R at the end of each window (window 0 ends at the onset).
        let ends: Vec<u64> = (0..=k)
            .map(|j| {
                if j == k {
                    self.r[n - 1]
                } else {
                    self.r[at(t_on + (width * j as f64) as i64)]
                }
            })
            .collect();
        let after_first = self.r[n - 1].saturating_sub(ends[1]) as f64;
        let mean = after_first / (k - 1) as f64;
        let grew = |j: usize| {
            let g = ends[j].saturating_sub(ends[j - 1]);
            g > self.eps && g as f64 >= GROWING_WINDOW_FRACTION * mean
        };
        let growing = if after_first <= self.tol as f64 {
            0
        } else {
            (2..=k).filter(|&j| grew(j)).count()
        };
        let probs: Vec<f64> =
            stats::later_window_probabilities(k, self.cfg.warmup_record_sources).collect();
        let at_end = if growing == 0 {
            0
        } else {
            (2..=k).rev().take_while(|&j| grew(j)).count()
        };
        let steadiness = Steadiness {
            windows: u32::try_from(k).unwrap_or(u32::MAX),
            window_sec: width / 1000.0,
            growing_windows: u32::try_from(growing).unwrap_or(u32::MAX),
            expected_growing_windows: probs.iter().sum(),
            p_value: stats::poisson_binomial_upper_tail(&probs, growing),
            growing_at_end: u32::try_from(at_end).unwrap_or(u32::MAX),
            // Independent windows: the chance of growth in each of the last `at_end`.
            p_value_at_end: probs[probs.len() - at_end..].iter().product(),
            later_from_unix_ms: self.times[later],
            later_growth_bytes: diff_i64(self.r[n - 1], self.r[later]),
        };
        (Some(steadiness), later)
    }

    /// Indices from `from` thinned to at most `max` points evenly spread in time.
    fn thin(&self, from: usize, max: usize) -> Vec<usize> {
        let n = self.times.len();
        if n - from <= max {
            return (from..n).collect();
        }
        let t0 = self.times[from] as f64;
        let span = (self.times[n - 1] - self.times[from]) as f64;
        let mut out = Vec::with_capacity(max);
        let mut k = from;
        for step in 0..max {
            let target = t0 + span * step as f64 / (max - 1) as f64;
            while k + 1 < n && (self.times[k + 1] as f64) <= target {
                k += 1;
            }
            if out.last() != Some(&k) {
                out.push(k);
            }
        }
        out
    }

    fn slope(&self, from: usize) -> f64 {
        let pts: Vec<(f64, f64)> = self
            .thin(from, self.cfg.max_test_points)
            .into_iter()
            .map(|k| {
                (
                    (self.times[k] - self.times[from]) as f64 / 1000.0,
                    self.f[k] as f64,
                )
            })
            .collect();
        stats::theil_sen(&pts).unwrap_or(0.0)
    }

    /// Mann–Kendall on the successive distinct levels of the floor: NVML memory is a step
    /// function, and the steps, not the repeated samples between them, are the evidence.
    fn mann_kendall(&self, from: usize) -> MannKendall {
        let mut levels: Vec<f64> = Vec::new();
        let mut last = None;
        for &v in &self.f[from..] {
            if last != Some(v) {
                levels.push(v as f64);
                last = Some(v);
            }
        }
        let max = self.cfg.max_test_points;
        if levels.len() > max {
            let n = levels.len();
            levels = (0..max).map(|i| levels[i * (n - 1) / (max - 1)]).collect();
        }
        stats::mann_kendall(&levels)
    }
}

/// Most earlier ends at which [`analyze`] asks whether the series was a leak already,
/// spread evenly over the stall window before now (besides the previous point).
const CONTINUATION_PROBES: i64 = 20;
/// Least spacing of those ends: a second, the finest cadence at which anything analyses a
/// series (`leaks --watch`, `top`, `vramctl leaks --until` run every second).
const CONTINUATION_GRID_MS: i64 = 1000;
/// How far back a `leak` is remembered past the stall window while the memory has grown
/// materially since the start and has not settled: the horizon for a leak in rare
/// steps (flagged within 5 minutes), so a leak whose rules fire once in that time stays one.
const MEMORY_MS: i64 = 5 * 60 * 1000;
/// Most earlier ends asked over [`MEMORY_MS`]: a 7.5 s grid, finer than a 10 s log, so at
/// 10 s every sample is an end; the cost bound is 40 analyses more per series.
const MEMORY_PROBES: i64 = 40;

/// Runs the memory analysis on the points of one series.
///
/// A series that is not a leak by the rules now, but was by the rules at an earlier end
/// within the stall window and whose retained memory still rises (the growth since the
/// start could still fire: material, long enough, still growing), stays a `leak`: a
/// leak verdict ends only on evidence that the floor stopped rising, not because a gate
/// wavered between two steps (issue 35: 19 flips from `leak` back to `growing` on a 1 s
/// log). The earlier ends are every second (or sample interval, or a twentieth of the
/// stall window, whichever is longest) back over the stall window: the steadiness test's
/// windows slide with the series, and an irregular staircase loses significance for a
/// second or two whenever two steps fall into one window, which three ends a quarter of
/// the window apart did not bridge (`staircase-eval`, second H200 recording, tune half).
///
/// Past the stall window, a series that is `growing` or `sawtooth` with material growth
/// since the start and a rise of its retained memory within the last five minutes also
/// stays a `leak` when the rules made one at an end of those five minutes on a grid fixed
/// in absolute time: a leak hidden in a sawtooth and seen every 10 s, or one under noise,
/// fires only now and then, and between the firings the floor does not show for longer
/// than the stall window (`shapes-choose`: 16 flips at 10 s). `stable`, or five minutes
/// without a rise, ends the memory. The verdict's numbers are then those of the end
/// that judged it, and `judged_unix_ms` says when that was.
/// Pure: the earlier ends are prefixes of the same points, so batch and live agree.
pub(crate) fn analyze(points: &[Point], inputs: TrendInputs<'_>, cfg: &LeakConfig) -> Trend {
    let mut trend = analyze_now(points, inputs, cfg);
    let fine = trend.since_start_could_fire;
    let remember = trend.since_start_material
        && trend.floor_rose_within_memory
        && matches!(
            trend.verdict,
            MemoryVerdict::Growing | MemoryVerdict::Sawtooth
        );
    let continues =
        !matches!(trend.verdict, MemoryVerdict::Leak(_)) && (fine || remember) && points.len() > 2;
    if !continues {
        return trend;
    }
    let now = points.last().map_or(0, Point::t);
    let stall_ms = (trend.since_start_stall_sec * 1000.0) as i64;
    let grid_ms = CONTINUATION_GRID_MS
        .max(trend.scale.interval_ms)
        .max(stall_ms / CONTINUATION_PROBES)
        .max(1);
    // The previous point first (the rules fired one analysis ago), then ends back over
    // the stall window, newest first: a dip is usually a second or two old.
    let fine_probes = if fine { stall_ms / grid_ms } else { 0 };
    let ends = std::iter::once(points.len() - 1)
        .chain((1..=fine_probes).map(|j| points.partition_point(|p| p.t() <= now - j * grid_ms)));
    // Then the memory: ends back over five minutes on a grid fixed in absolute time (its
    // spacing depends on nothing measured, so a jittery interval does not move it), so
    // that an end which was a leak stays one of the ends asked at every later analysis
    // until it is five minutes old. Ends placed relative to now (as above) move with
    // every analysis and hit a rare raw `leak` at one analysis and miss it at the next,
    // which makes a noisy leak flicker (tried, docs/leaks.md). Samples further apart
    // than the grid are each an end.
    let memory_grid_ms = MEMORY_MS / MEMORY_PROBES;
    let memory_newest = now.div_euclid(memory_grid_ms) * memory_grid_ms;
    let memory_probes = if remember {
        MEMORY_MS / memory_grid_ms
    } else {
        0
    };
    let memory = (0..memory_probes)
        .map(|j| points.partition_point(|p| p.t() <= memory_newest - j * memory_grid_ms));
    // An end asked once is not asked again: its answer was not a leak (a leak stops the
    // search). The memory's grid and the stall window's ends meet on the same samples
    // where samples are far apart (at 10 s, each is an end of both).
    let mut probed = Vec::new();
    for k in ends.chain(memory) {
        if k < 2 || k >= points.len() || probed.contains(&k) {
            continue;
        }
        probed.push(k);
        // With the free memory of then: `fills-device`'s urgency is a forecast from it.
        let then = TrendInputs {
            free_bytes: free_at(inputs.free_history, points[k - 1].t(), inputs.free_bytes),
            ..inputs
        };
        let earlier = analyze_now(&points[..k], then, cfg);
        if matches!(earlier.verdict, MemoryVerdict::Leak(_)) {
            // The evidence shown is the analysis that made the leak (at most five minutes
            // old, and said so), so the explanation's numbers and gates agree with its
            // verdict.
            trend.verdict = earlier.verdict;
            trend.judged_unix_ms = Some(points[k - 1].t());
            trend.onset_unix_ms = earlier.onset_unix_ms;
            trend.checks = earlier.checks;
            trend.time_to_full_sec =
                time_to_full(inputs.free_bytes, earlier.region.slope_bytes_per_sec);
            trend.region = earlier.region;
            break;
        }
    }
    trend
}

/// The rules on the points as they are now (no look back at earlier ends).
#[allow(clippy::too_many_lines)]
fn analyze_now(points: &[Point], inputs: TrendInputs<'_>, cfg: &LeakConfig) -> Trend {
    let times: Vec<i64> = points.iter().map(Point::t).collect();
    let n = points.len();
    let now = times.last().copied().unwrap_or(0);
    let t0 = times.first().copied().unwrap_or(0);
    let scale = Scale::of(&times, cfg);

    // 1–3: releases, the floor, the retained memory.
    let releases = find_releases(points, cfg, scale.interval_ms);
    let ongoing = releases.cycle_ms.filter(|&cycle| {
        let last = releases.times.last().copied().unwrap_or(t0);
        now - last <= 3 * cycle.max(1) + scale.plateau_ms
    });
    let window_ms = ongoing.map_or(0, |c| {
        (c.saturating_mul(3) / 2).min(ms(cfg.max_floor_window))
    });
    let f = floor(points, window_ms);
    let r = retained(&f);
    let tol = noise_tolerance(&f, cfg);
    let s = Series {
        times,
        f,
        r,
        tol,
        eps: (tol / 4).max(1),
        cfg,
        scale,
        release_times: releases.times.clone(),
    };

    // 5: warm-up, which ends at the first plateau.
    let start = inputs.process_start_unix_ms.map_or(t0, |ps| ps.min(t0));
    let warm_lo = start.saturating_add(ms(cfg.min_warmup));
    let deadline = start.saturating_add(ms(cfg.max_warmup));
    let plateau_ms = scale.plateau_ms;
    let quiet: Vec<Option<bool>> = (0..n).map(|i| s.quiet(i)).collect();
    let settled_unix_ms = if t0 >= deadline {
        Some(t0.max(warm_lo))
    } else {
        (0..n)
            .find(|&i| quiet[i] == Some(true) && s.times[i] - plateau_ms >= warm_lo)
            .map(|i| s.times[i] - plateau_ms)
            .or_else(|| (now >= deadline).then_some(deadline))
    };

    // 6: regions. The tests are the costly part: run them only on a region that could be
    // a leak or is reported as growing.
    let index_from = |t: i64| s.times.partition_point(|&x| x < t).min(n - 1);
    let (mut whole, whole_onset) = s.region(index_from(warm_lo), RegionKind::SinceStart);
    if could_fire(&whole, cfg) || growing(&whole, s.tol) {
        s.add_tests(&mut whole, whole_onset);
    }
    let whole_checks = since_start_checks(&whole, &s, settled_unix_ms.is_some(), inputs.free_bytes);
    let since_start_could_fire = could_fire(&whole, cfg);
    let since_start_material = at_least(whole.net_growth_bytes, cfg.min_growth_bytes);
    // The retained memory rose within the memory's five minutes: no rise in that time is
    // the evidence that the floor stopped rising (a server's sawtooth after its load).
    let floor_rose_within_memory = {
        let from = index_at(&s.times, s.now() - MEMORY_MS).unwrap_or(0);
        s.r[n - 1].saturating_sub(s.r[from]) > s.tol
    };
    let since_start_stall_sec = whole.stall_window_sec;
    // The current episode: from the last plateau after warm-up on. On a device's total,
    // growth after a plateau may be a process starting: only the since-start rules.
    let episode = settled_unix_ms
        .filter(|_| !inputs.device_total)
        .and_then(|settled| {
            let since = index_from(settled);
            // The last plateau that is a pause, not a beat of the staircase's rhythm: the
            // quiet between two steps of a leak that steps every 20–60 s started a new
            // episode of one step each time, and the verdict fell from `leak` back to
            // `growing` between steps (issue 35).
            let mut i = n;
            while let Some(k) = (since..i)
                .rev()
                .find(|&k| quiet[k] == Some(true) && s.times[k] - plateau_ms >= settled)
            {
                match s.rhythm_step_into(k) {
                    Some(step) => i = step,
                    None => return Some(k),
                }
            }
            None
        })
        .filter(|&i| i < n - 1)
        .map(|i| {
            let (mut ep, k) = s.region(i, RegionKind::Episode);
            if could_fire(&ep, cfg) || growing(&ep, s.tol) {
                s.add_tests(&mut ep, k);
            }
            let c = episode_checks(&ep, &s);
            (ep, c)
        });

    // 7: the rules, in order, then what is not a leak.
    let (decision_region, checks, verdict) = match episode {
        Some((ep, c)) if fires(&c) => (ep, c, MemoryVerdict::Leak(LeakRule::AfterPlateau)),
        _ if fires(&whole_checks) && whole_checks.steady == Some(true) => (
            whole,
            whole_checks,
            MemoryVerdict::Leak(LeakRule::SteadyGrowth),
        ),
        _ if fills(&whole_checks) => (
            whole,
            whole_checks,
            MemoryVerdict::Leak(LeakRule::FillsDevice),
        ),
        Some((ep, c)) if growing(&ep, s.tol) => (ep, c, MemoryVerdict::Growing),
        _ if growing(&whole, s.tol) => (whole, whole_checks, MemoryVerdict::Growing),
        _ => (whole, whole_checks, quiet_verdict(&releases, ongoing, cfg)),
    };

    let onset_unix_ms = matches!(verdict, MemoryVerdict::Leak(_) | MemoryVerdict::Growing)
        .then_some(decision_region.from_unix_ms);
    let time_to_full_sec = if onset_unix_ms.is_some() {
        time_to_full(inputs.free_bytes, decision_region.slope_bytes_per_sec)
    } else {
        None
    };
    Trend {
        verdict,
        judged_unix_ms: None,
        settled_unix_ms,
        onset_unix_ms,
        checks,
        releases: u32::try_from(releases.times.len()).unwrap_or(u32::MAX),
        release_period_ms: releases.period_ms,
        floor_window_ms: window_ms,
        noise_tolerance_bytes: s.tol,
        floor_bytes: s.f.last().copied().unwrap_or(0),
        time_to_full_sec,
        region: decision_region,
        scale,
        since_start_could_fire,
        since_start_material,
        floor_rose_within_memory,
        since_start_stall_sec,
    }
}

/// A flat stretch up to this many times the gap between the two steps before it keeps
/// the staircase's rhythm (a leak stepping every 20 ± 2 s); a longer one is a pause that
/// may start a new episode.
const EPISODE_RHYTHM_FACTOR: f64 = 1.5;

/// Steps at the end of the growth since the start that make a leak's staircase: the base
/// and four steps are five levels, the fewest at which the exact Mann–Kendall test of the
/// leak rules can reach `alpha` 0.01 (p = 1/5! ≈ 0.0083), as for `MIN_FORECAST_LEVELS`.
const REGULAR_TAIL_STEPS: usize = 4;

/// Two steps of a staircase's rhythm differ by at most this fraction of the larger.
const RHYTHM_STEP_SIZE_TOLERANCE: f64 = 0.5;

/// Gaps between steps that make a rhythm the stall window may wait for (one gap is a
/// coincidence of two steps, not a pace).
const RHYTHM_GAPS: usize = 2;

/// Rises smaller than this fraction of the median rise are blips, not steps.
const SMALL_RISE_FRACTION: f64 = 0.25;
/// Rises closer than this are one step (a step can straddle two samples).
const STEP_MERGE_MS: i64 = 1000;
/// Step sizes within this fraction of their median are equal.
const STEP_SIZE_TOLERANCE: f64 = 0.10;
/// Gaps between steps within this fraction of their median are a steady rhythm.
const STEP_RHYTHM_TOLERANCE: f64 = 0.25;

/// The rises with those less than a second apart merged (a step can straddle two
/// samples): (time of the first, total size).
fn merged_steps(rises: &[(i64, u64)]) -> Vec<(i64, f64)> {
    let mut steps: Vec<(i64, f64)> = Vec::new();
    let mut last_t = i64::MIN;
    for &(t, size) in rises {
        match steps.last_mut() {
            Some(step) if t - last_t < STEP_MERGE_MS => step.1 += size as f64,
            _ => steps.push((t, size as f64)),
        }
        last_t = t;
    }
    steps
}

/// Whether the rises form a regular staircase: at least three steps (after merging rises
/// less than a second apart), equal in size, at a steady rhythm.
fn regular(rises: &[(i64, u64)]) -> bool {
    regular_merged(&merged_steps(rises))
}

/// Whether the last [`REGULAR_TAIL_STEPS`] steps since the start are a regular staircase
/// coarser than `coarse_gap_ms`: a leak that keeps the same big allocation at a steady
/// rhythm (+1 GiB every 60 s), whatever the start-up allocations before it were. Such
/// steps do not shrink as a warm-up's new maxima do, and they are too sparse for the
/// steadiness windows, which are narrower than their period (issue 35).
fn regular_tail(rises: &[(i64, u64)], coarse_gap_ms: i64) -> bool {
    let steps = merged_steps(rises);
    let Some(tail) = steps
        .len()
        .checked_sub(REGULAR_TAIL_STEPS)
        .map(|k| &steps[k..])
    else {
        return false;
    };
    let mut gaps: Vec<f64> = tail.windows(2).map(|w| (w[1].0 - w[0].0) as f64).collect();
    stats::median_in_place(&mut gaps).is_some_and(|g| g > coarse_gap_ms as f64)
        && regular_merged(tail)
}

fn regular_merged(steps: &[(i64, f64)]) -> bool {
    if steps.len() < 3 {
        return false;
    }
    let within = |values: &mut Vec<f64>, tolerance: f64| {
        let Some(median) = stats::median_in_place(values) else {
            return false;
        };
        median > 0.0
            && values
                .iter()
                .all(|v| (v - median).abs() <= tolerance * median)
    };
    let mut sizes: Vec<f64> = steps.iter().map(|s| s.1).collect();
    let mut gaps: Vec<f64> = steps.windows(2).map(|w| (w[1].0 - w[0].0) as f64).collect();
    within(&mut sizes, STEP_SIZE_TOLERANCE) && within(&mut gaps, STEP_RHYTHM_TOLERANCE)
}

fn quiet_verdict(releases: &Releases, ongoing: Option<i64>, cfg: &LeakConfig) -> MemoryVerdict {
    let count = u32::try_from(releases.times.len()).unwrap_or(u32::MAX);
    if ongoing.is_some() && count >= cfg.min_cycles {
        MemoryVerdict::Sawtooth
    } else {
        MemoryVerdict::Stable
    }
}

fn growing(region: &TrendTest, tol: u64) -> bool {
    region.still_growing && region.net_growth_bytes > i64::try_from(tol).unwrap_or(i64::MAX)
}

fn time_to_full(free: Option<u64>, slope: f64) -> Option<f64> {
    let free = free?;
    (slope > 0.0).then(|| free as f64 / slope)
}

fn at_least(bytes: i64, min: u64) -> bool {
    bytes >= i64::try_from(min).unwrap_or(i64::MAX)
}

/// The gates of `after-plateau` on an episode.
fn episode_checks(region: &TrendTest, s: &Series<'_>) -> LeakChecks {
    let cfg = s.cfg;
    let material = at_least(region.net_growth_bytes, cfg.min_growth_bytes)
        && region.slope_bytes_per_sec >= cfg.min_slope_bytes_per_sec;
    let long_enough = region.growth_span_sec * 1000.0 >= s.scale.min_leak_ms as f64;
    let irregular_staircase = long_enough
        && region.median_rise_gap_sec * 1000.0 > s.scale.coarse_gap_ms as f64
        && !region.regular_steps
        && region.growth_span_sec * 1000.0 < s.scale.min_irregular_ms as f64;
    LeakChecks {
        settled: true,
        significant: region.p_value() < cfg.alpha,
        material,
        persistent: long_enough && !irregular_staircase,
        still_growing: region.still_growing,
        steady: None,
        irregular_staircase,
        urgent: false,
    }
}

/// The gates of `steady-growth` and `fills-device` on the since-start region.
fn since_start_checks(
    region: &TrendTest,
    s: &Series<'_>,
    settled: bool,
    free: Option<u64>,
) -> LeakChecks {
    let cfg = s.cfg;
    // Growth at the steady rate over the later part: the robust slope times the time
    // since the first window, which only grows while the rate holds (the growth itself
    // would jump as the first window's end passes the tail of a start-up burst).
    let later = region.steadiness.as_ref().map_or(
        (region.net_growth_bytes as f64, region.duration_sec),
        |st| {
            (
                region.slope_bytes_per_sec * (s.now() - st.later_from_unix_ms) as f64 / 1000.0,
                (s.now() - st.later_from_unix_ms) as f64 / 1000.0,
            )
        },
    );
    let material = later.0 >= cfg.min_growth_bytes as f64
        && later.1 > 0.0
        && region.slope_bytes_per_sec >= cfg.min_slope_bytes_per_sec;
    let span_ms = region.growth_span_sec * 1000.0;
    // A forecast may reach `max_forecast_factor` times as far as the growth it rests on,
    // and needs a rate: enough levels, no release (a release is a cycle, not a trend),
    // growth for the least episode span.
    let urgent = time_to_full(free, region.slope_bytes_per_sec)
        .is_some_and(|eta| eta * 1000.0 <= cfg.max_forecast_factor * span_ms)
        && span_ms >= s.scale.min_leak_ms as f64
        && region.releases == 0
        && region.levels as usize >= super::MIN_FORECAST_LEVELS
        && region
            .steadiness
            .as_ref()
            .is_none_or(|st| forecast_stands(st, cfg));
    LeakChecks {
        settled,
        significant: region.p_value() < cfg.alpha,
        material,
        persistent: span_ms >= s.scale.min_steady_ms as f64,
        still_growing: region.still_growing,
        // Steady: the windows reject a warm-up that slows down, or the growth ends in a
        // regular coarse staircase (equal steps at a steady rhythm do not slow down).
        steady: Some(
            region
                .steadiness
                .as_ref()
                .is_some_and(|st| st.p_value < cfg.alpha)
                || region.regular_steps,
        ),
        irregular_staircase: false,
        urgent,
    }
}

/// Whether a straight-line forecast of the growth since the start stands against the
/// steadiness test: a warm-up that slows down is rejected at `alpha` by the count of
/// growing windows or by the growth going on to the last window, or the windows are too
/// few for either to reject it (growth in every window after the first is the least p
/// they can give), so that a fast leak seen in a few coarse samples is not held back by
/// a test that cannot speak. On a crowded card a warm-up of new maxima forecast the card
/// full within ten times its span and was a `leak` by `fills-device` (issue 35: the
/// H100 leak sets' `dyn-pareto`, growth in 5 of 9 windows, none in the last).
fn forecast_stands(st: &Steadiness, cfg: &LeakConfig) -> bool {
    let windows = usize::try_from(st.windows).unwrap_or(usize::MAX);
    let least_p: f64 =
        stats::later_window_probabilities(windows, cfg.warmup_record_sources).product();
    st.p_value < cfg.alpha || st.p_value_at_end < cfg.alpha || least_p >= cfg.alpha
}

/// The gates that need no test: enough growth, long enough for the shortest rule, still
/// going.
fn could_fire(region: &TrendTest, cfg: &LeakConfig) -> bool {
    at_least(region.net_growth_bytes, cfg.min_growth_bytes)
        && region.growth_span_sec >= cfg.min_leak_duration.as_secs_f64()
        && region.still_growing
}

/// The gates every leak rule shares.
fn fires(c: &LeakChecks) -> bool {
    c.significant && c.material && c.persistent && c.still_growing
}

/// `fills-device`: in warm-up (no plateau since the start), significant, material, still
/// growing and urgent, whatever its span. Once the memory has plateaued, growth is judged
/// as an episode (`after-plateau`): a model loaded in a 5 s burst after 30 s holding only
/// the context is not a leak because the span since the start's first rise is long.
fn fills(c: &LeakChecks) -> bool {
    !c.settled && c.significant && c.material && c.still_growing && c.urgent
}
