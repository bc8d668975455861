//! The memory side of the verdict: floor, plateaus, warm-up, growth episodes and the leak
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
//! 4. **plateau** at t: R(t) − R(t − plateau) ≤ tol, with tol = max(step tolerance,
//!    4 σ̂) and σ̂ from the falls of the floor (`noise_tolerance`).
//! 5. **warm-up** lasts from the process start to the first plateau (at most `max_warmup`,
//!    at least `min_warmup`).
//! 6. **regions**: the current growth episode (since the last plateau), and everything
//!    since warm-up ended; in warm-up, everything since the start. On each: onset = the last
//!    point still at the region's base level, Theil–Sen slope of F, Mann–Kendall on the
//!    distinct successive levels of F (the allocator's steps, not the repeated samples),
//!    net growth R(now) − R(onset), and whether R still rose within the stall window.

use serde::Serialize;

use super::config::{LeakConfig, ms};
use super::series::Point;
use super::stats::{self, MannKendall};

/// Which rule made a leak verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeakRule {
    /// Growth resumed after the allocator's cache had plateaued, and keeps going.
    AfterPlateau,
    /// The retained memory has kept rising since warm-up ended (slow leaks, staircases with
    /// long steps).
    SinceWarmUp,
    /// Still in warm-up, but at this slope the device is full within
    /// `urgent_time_to_full`.
    UrgentInWarmUp,
}

/// The numbers of one judged region of the series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrendTest {
    /// Onset: the last point at the region's base level, ms since the Unix epoch.
    pub from_unix_ms: i64,
    /// From onset to the last sample.
    pub duration_sec: f64,
    /// Theil–Sen slope of the floor since onset.
    pub slope_bytes_per_sec: f64,
    /// Retained memory now minus at onset.
    pub net_growth_bytes: i64,
    /// Times the retained memory rose since onset (the allocator's steps).
    pub rises: u32,
    /// Median time between steps (rises not far below the median rise; 0 with fewer than
    /// two).
    pub median_rise_gap_sec: f64,
    /// From onset to the last step: how long the growth itself has gone on.
    pub growth_span_sec: f64,
    /// The rises, merged when less than a second apart, are equal in size (±10 %) and
    /// come at a steady rhythm (±25 %): the same allocation kept again and again.
    pub regular_steps: bool,
    /// The retained memory rose within the stall window before the last sample.
    pub still_growing: bool,
    /// Stall window used for `still_growing`, seconds.
    pub stall_window_sec: f64,
    /// Releases (drops) since onset.
    pub releases: u32,
    /// The trend test; `None` when the region is flat within the noise tolerance.
    pub mann_kendall: Option<MannKendall>,
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
    /// Warm-up is over.
    pub settled: bool,
    /// Mann–Kendall p < alpha.
    pub significant: bool,
    /// Net growth ≥ `min_growth_bytes` and slope ≥ `min_slope_bytes_per_sec`.
    pub material: bool,
    /// Growth (onset to last rise) has lasted ≥ `min_leak_duration`; and, for a coarse
    /// staircase (rises more than `coarse_step_gap` apart), the steps are regular or the
    /// growth has lasted ≥ `min_irregular_duration`.
    pub persistent: bool,
    /// Still rising at the end.
    pub still_growing: bool,
    /// Growth long enough, but in coarse irregular steps for less than
    /// `min_irregular_duration`: what holds back `persistent` (dynamic shapes warm up so).
    pub irregular_staircase: bool,
    /// The device is full within `urgent_time_to_full` at this slope.
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
}

/// What the memory analysis needs besides the points.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TrendInputs {
    pub process_start_unix_ms: Option<i64>,
    pub free_bytes: Option<u64>,
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
fn find_releases(points: &[Point], cfg: &LeakConfig) -> Releases {
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
            .is_some_and(|&j| points[j].t() <= t - RELEASE_WINDOW_MS)
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
    release_times: Vec<i64>,
}

impl Series<'_> {
    fn now(&self) -> i64 {
        self.times.last().copied().unwrap_or(0)
    }

    /// Plateau ending at point i: R rose by at most tol over the preceding `plateau`.
    fn quiet(&self, i: usize) -> Option<bool> {
        let start = self.times[i] - ms(self.cfg.plateau);
        if start < self.times[0] {
            return None;
        }
        let j = index_at(&self.times, start)?;
        // Old points are time buckets wider than the plateau: there the tolerance is a
        // rate (tol per plateau), or a slow leak would look like endless growth.
        let span = (self.times[i] - self.times[j]) as f64;
        let allowed = self.tol as f64 * (span / ms(self.cfg.plateau) as f64).max(1.0);
        Some(self.r[i].saturating_sub(self.r[j]) as f64 <= allowed)
    }

    /// The numbers of the region that starts at point `from`, without the trend test
    /// (`add_tests`), and the index of its onset.
    fn region(&self, from: usize) -> (TrendTest, usize) {
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
        let growth_span_ms = last_step.map_or(0, |t| t - self.times[onset]);
        let mut gaps: Vec<f64> = steps.windows(2).map(|w| (w[1].0 - w[0].0) as f64).collect();
        let median_gap = stats::median_in_place(&mut gaps).unwrap_or(0.0);
        let stall_ms = (ms(self.cfg.plateau) as f64).max(self.cfg.stall_factor * median_gap) as i64;
        let recent = index_at(&self.times, now - stall_ms).map_or(onset, |k| k.max(onset));
        let still_growing = self.r[n - 1].saturating_sub(self.r[recent]) > self.tol
            && last_step.is_some_and(|t| now - t <= stall_ms);
        let onset_t = self.times[onset];
        let releases = self.release_times.iter().filter(|&&t| t > onset_t).count();
        let region = TrendTest {
            from_unix_ms: onset_t,
            duration_sec: (now - onset_t) as f64 / 1000.0,
            slope_bytes_per_sec: 0.0,
            net_growth_bytes: growth,
            rises: u32::try_from(rises.len()).unwrap_or(u32::MAX),
            growth_span_sec: growth_span_ms as f64 / 1000.0,
            median_rise_gap_sec: median_gap / 1000.0,
            regular_steps: regular(&steps),
            still_growing,
            stall_window_sec: stall_ms as f64 / 1000.0,
            releases: u32::try_from(releases).unwrap_or(u32::MAX),
            mann_kendall: None,
        };
        (region, onset)
    }

    /// Runs the Theil–Sen slope and the Mann–Kendall test on a region (O(m²), m ≤
    /// `max_test_points`); a region flat within the noise tolerance is not tested.
    fn add_tests(&self, region: &mut TrendTest, onset: usize) {
        let flat = region.net_growth_bytes <= i64::try_from(self.tol).unwrap_or(i64::MAX);
        if region.mann_kendall.is_some() || flat {
            return;
        }
        region.slope_bytes_per_sec = self.slope(onset);
        region.mann_kendall = Some(self.mann_kendall(onset));
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

/// Runs the memory analysis on the points of one series.
pub(crate) fn analyze(points: &[Point], inputs: TrendInputs, cfg: &LeakConfig) -> Trend {
    let times: Vec<i64> = points.iter().map(Point::t).collect();
    let n = points.len();
    let now = times.last().copied().unwrap_or(0);
    let t0 = times.first().copied().unwrap_or(0);

    // 1–2: releases and the floor.
    let releases = find_releases(points, cfg);
    let ongoing = releases.cycle_ms.filter(|&cycle| {
        let last = releases.times.last().copied().unwrap_or(t0);
        now - last <= 3 * cycle.max(1) + ms(cfg.plateau)
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
        release_times: releases.times.clone(),
    };

    // 5: warm-up.
    let start = inputs.process_start_unix_ms.map_or(t0, |ps| ps.min(t0));
    let warm_lo = start.saturating_add(ms(cfg.min_warmup));
    let deadline = start.saturating_add(ms(cfg.max_warmup));
    let plateau_ms = ms(cfg.plateau);
    let quiet: Vec<Option<bool>> = (0..n).map(|i| s.quiet(i)).collect();
    let settled_unix_ms = if t0 >= deadline {
        Some(t0.max(warm_lo))
    } else {
        (0..n)
            .find(|&i| quiet[i] == Some(true) && s.times[i] - plateau_ms >= warm_lo)
            .map(|i| s.times[i] - plateau_ms)
            .or_else(|| (now >= deadline).then_some(deadline))
    };

    // 6: regions. The trend tests are the costly part: run them only on a region that
    // could be a leak or is reported as growing.
    let index_from = |t: i64| s.times.partition_point(|&x| x < t).min(n - 1);
    let judge =
        |region: &TrendTest, settled: bool| checks_for(region, cfg, settled, inputs.free_bytes);
    let (decision_region, checks, verdict) = match settled_unix_ms {
        Some(settled) => {
            let since = index_from(settled);
            // The last plateau after warm-up: the current episode starts there.
            let last_quiet = (since..n)
                .rev()
                .find(|&i| quiet[i] == Some(true) && s.times[i] - plateau_ms >= settled);
            let mut episode = match last_quiet {
                Some(i) if i < n - 1 => Some(s.region(i)),
                _ => None,
            };
            if let Some((ep, k)) = &mut episode {
                if could_fire(ep, cfg) || growing(ep, s.tol) {
                    s.add_tests(ep, *k);
                }
            }
            let episode = episode.map(|(ep, _)| {
                let c = judge(&ep, true);
                (ep, c)
            });
            match episode {
                Some((ep, c)) if fires(&c) => (ep, c, MemoryVerdict::Leak(LeakRule::AfterPlateau)),
                episode => {
                    let (mut whole, k) = s.region(since);
                    let growing_whole = last_quiet.is_none() && growing(&whole, s.tol);
                    if could_fire(&whole, cfg) || growing_whole {
                        s.add_tests(&mut whole, k);
                    }
                    let wc = judge(&whole, true);
                    match episode {
                        _ if fires(&wc) => (whole, wc, MemoryVerdict::Leak(LeakRule::SinceWarmUp)),
                        Some((ep, c)) if growing(&ep, s.tol) => (ep, c, MemoryVerdict::Growing),
                        _ if growing_whole => (whole, wc, MemoryVerdict::Growing),
                        _ => (whole, wc, quiet_verdict(&releases, ongoing, cfg)),
                    }
                }
            }
        }
        None => {
            let (mut whole, k) = s.region(0);
            if could_fire(&whole, cfg) || growing(&whole, s.tol) {
                s.add_tests(&mut whole, k);
            }
            let c = judge(&whole, false);
            let verdict = if fires(&c) && c.urgent && whole.releases == 0 {
                MemoryVerdict::Leak(LeakRule::UrgentInWarmUp)
            } else if growing(&whole, s.tol) {
                MemoryVerdict::Growing
            } else {
                quiet_verdict(&releases, ongoing, cfg)
            };
            (whole, c, verdict)
        }
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
    }
}

/// Rises smaller than this fraction of the median rise are blips, not steps.
const SMALL_RISE_FRACTION: f64 = 0.25;
/// Rises closer than this are one step (a step can straddle two samples).
const STEP_MERGE_MS: i64 = 1000;
/// Step sizes within this fraction of their median are equal.
const STEP_SIZE_TOLERANCE: f64 = 0.10;
/// Gaps between steps within this fraction of their median are a steady rhythm.
const STEP_RHYTHM_TOLERANCE: f64 = 0.25;

/// Whether the rises form a regular staircase: at least three steps (after merging rises
/// less than a second apart), equal in size, at a steady rhythm.
fn regular(rises: &[(i64, u64)]) -> bool {
    let mut steps: Vec<(i64, f64)> = Vec::new();
    let mut last_t = i64::MIN;
    for &(t, size) in rises {
        match steps.last_mut() {
            Some(step) if t - last_t < STEP_MERGE_MS => step.1 += size as f64,
            _ => steps.push((t, size as f64)),
        }
        last_t = t;
    }
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

fn checks_for(
    region: &TrendTest,
    cfg: &LeakConfig,
    settled: bool,
    free: Option<u64>,
) -> LeakChecks {
    let material = region.net_growth_bytes
        >= i64::try_from(cfg.min_growth_bytes).unwrap_or(i64::MAX)
        && region.slope_bytes_per_sec >= cfg.min_slope_bytes_per_sec;
    let urgent = time_to_full(free, region.slope_bytes_per_sec)
        .is_some_and(|eta| eta < cfg.urgent_time_to_full.as_secs_f64());
    let long_enough = region.growth_span_sec >= cfg.min_leak_duration.as_secs_f64();
    let irregular_staircase = long_enough
        && region.median_rise_gap_sec > cfg.coarse_step_gap.as_secs_f64()
        && !region.regular_steps
        && region.growth_span_sec < cfg.min_irregular_duration.as_secs_f64();
    LeakChecks {
        settled,
        significant: region.p_value() < cfg.alpha,
        material,
        persistent: long_enough && !irregular_staircase,
        irregular_staircase,
        still_growing: region.still_growing,
        urgent,
    }
}

/// The gates that need no trend test: enough growth, long enough, still going.
fn could_fire(region: &TrendTest, cfg: &LeakConfig) -> bool {
    region.net_growth_bytes >= i64::try_from(cfg.min_growth_bytes).unwrap_or(i64::MAX)
        && region.growth_span_sec >= cfg.min_leak_duration.as_secs_f64()
        && region.still_growing
}

/// The gates every leak rule shares.
fn fires(c: &LeakChecks) -> bool {
    c.significant && c.material && c.persistent && c.still_growing
}
