//! Thresholds of the analysis, with the defaults `docs/leaks.md` explains.

use std::time::Duration;

use super::AnalysisError;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// Longest duration a threshold may have (keeps time arithmetic far from overflow).
const MAX_DURATION: Duration = Duration::from_secs(30 * 365 * 86_400);

/// Every threshold the verdicts use. `Default` gives the documented values.
#[derive(Debug, Clone, PartialEq)]
pub struct LeakConfig {
    /// Significance level of the Mann–Kendall test (one-sided).
    pub alpha: f64,
    /// Least growth since onset for a leak.
    pub min_growth_bytes: u64,
    /// Least robust slope for a leak.
    pub min_slope_bytes_per_sec: f64,
    /// Least time growth must have lasted (onset to the last rise) for a leak after a
    /// plateau (and for one that fills the device).
    pub min_leak_duration: Duration,
    /// Least time growth since the process started must have lasted for a leak that
    /// never plateaued (`steady-growth`): a start-up burst that grows steadily and then
    /// stops (a model loaded layer by layer) is not a leak while it is shorter.
    pub min_steady_duration: Duration,
    /// Equal windows the growth since the start is cut into for the steadiness test.
    pub steady_windows: usize,
    /// Independent sequences of new maxima (batch shapes, request sizes) a warm-up is
    /// allowed in the steadiness test's null hypothesis: the more, the more often a
    /// decaying warm-up still grows in a late window. 2: a step's memory has at least two
    /// shapes that set records on their own (batch and sequence length, forward and
    /// optimizer buffers). Chosen on the synthetic shape-ramp sweep (1 called a 60 s ramp
    /// a leak on 10/10 seeds, 2 on 0/10) and checked on the tune half of the leak set
    /// (`docs/leaks.md`): a leak grows in every window, p ≈ 5·10⁻⁵ with 10 windows.
    pub warmup_record_sources: u32,
    /// Rises further apart than this (median) form a coarse staircase, which needs regular
    /// steps or `min_irregular_duration`; closer rises are continuous growth.
    pub coarse_step_gap: Duration,
    /// Least time an irregular coarse staircase must have grown for a leak: warm-up with
    /// growing shapes steps up irregularly for a while, then stops.
    pub min_irregular_duration: Duration,
    /// A stretch this long in which the retained memory rose by no more than the noise
    /// tolerance is a plateau: the allocator's cache covered the peak.
    pub plateau: Duration,
    /// Growth counts as stopped when the retained memory has not risen for
    /// `max(plateau, stall_factor × median time between rises)`.
    pub stall_factor: f64,
    /// Growth that starts within this time of the process start is warm-up, whatever else
    /// (the user's `--warmup`).
    pub min_warmup: Duration,
    /// Warm-up ends at the first plateau, or this long after the process started.
    pub max_warmup: Duration,
    /// Growth that fills the device within this many times the span it has been growing
    /// is a leak before `min_steady_duration` (`fills-device`): a forecast may extrapolate
    /// the evidence this far, no further.
    pub max_forecast_factor: f64,
    /// Smallest drop that counts as the allocator releasing memory (sawtooth).
    pub min_release_bytes: u64,
    /// A drop must also be at least this fraction of the level it fell from.
    pub release_fraction: f64,
    /// Releases needed for the `sawtooth` verdict.
    pub min_cycles: u32,
    /// Upper bound of the window of the floor (rolling minimum) used on sawtooth series.
    pub max_floor_window: Duration,
    /// Least rise of the retained memory that is not noise (raised further on noisy series).
    pub step_tolerance_bytes: u64,
    /// Idle holder: least memory held.
    pub min_idle_bytes: u64,
    /// Idle holder: least time without GPU activity.
    pub idle_for: Duration,
    /// A process using at most this fraction of one CPU is idle by its CPU time.
    pub cpu_idle_fraction: f64,
    /// Activity samples further apart than this leave the time between them unknown.
    pub max_evidence_gap: Duration,
    /// Most points the Theil–Sen slope and the Mann–Kendall test look at (thinned in time).
    pub max_test_points: usize,
    /// Samples kept raw at the end of the series.
    pub tail_points: usize,
    /// Most time buckets for everything before the tail.
    pub head_points: usize,
}

impl Default for LeakConfig {
    fn default() -> Self {
        Self {
            alpha: 0.01,
            min_growth_bytes: 128 * MIB,
            // 1 MiB per minute: 1.4 GiB a day.
            min_slope_bytes_per_sec: MIB as f64 / 60.0,
            min_leak_duration: Duration::from_secs(10),
            min_steady_duration: Duration::from_secs(40),
            steady_windows: 10,
            warmup_record_sources: 2,
            coarse_step_gap: Duration::from_secs(2),
            min_irregular_duration: Duration::from_secs(60),
            plateau: Duration::from_secs(20),
            stall_factor: 3.0,
            min_warmup: Duration::ZERO,
            max_warmup: Duration::from_secs(600),
            max_forecast_factor: 10.0,
            min_release_bytes: 64 * MIB,
            release_fraction: 0.10,
            min_cycles: 2,
            max_floor_window: Duration::from_secs(600),
            step_tolerance_bytes: 4 * MIB,
            min_idle_bytes: GIB,
            idle_for: Duration::from_secs(30 * 60),
            cpu_idle_fraction: 0.01,
            max_evidence_gap: Duration::from_secs(60),
            max_test_points: 128,
            tail_points: 600,
            head_points: 512,
        }
    }
}

impl LeakConfig {
    /// Checks that the thresholds make sense together.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidConfig`] naming the first bad value.
    pub fn validate(&self) -> Result<(), AnalysisError> {
        let bad = |what: &str| Err(AnalysisError::InvalidConfig(what.to_owned()));
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return bad("alpha must be between 0 and 1");
        }
        if !(self.min_slope_bytes_per_sec >= 0.0 && self.min_slope_bytes_per_sec.is_finite()) {
            return bad("the minimum slope must be a finite number of bytes per second");
        }
        if !(self.stall_factor >= 1.0 && self.stall_factor.is_finite()) {
            return bad("the stall factor must be at least 1");
        }
        if !(self.release_fraction >= 0.0 && self.release_fraction < 1.0) {
            return bad("the release fraction must be in [0, 1)");
        }
        if !(self.max_forecast_factor >= 0.0 && self.max_forecast_factor.is_finite()) {
            return bad("the forecast factor must be a non-negative number");
        }
        if !(5..=64).contains(&self.steady_windows) {
            return bad("the steadiness test needs between 5 and 64 windows");
        }
        if self.warmup_record_sources == 0 {
            return bad("a warm-up has at least one source of new maxima");
        }
        if !(self.cpu_idle_fraction >= 0.0 && self.cpu_idle_fraction.is_finite()) {
            return bad("the CPU idle fraction must be a non-negative number");
        }
        let durations = [
            self.min_leak_duration,
            self.min_steady_duration,
            self.min_irregular_duration,
            self.coarse_step_gap,
            self.plateau,
            self.min_warmup,
            self.max_warmup,
            self.max_floor_window,
            self.idle_for,
            self.max_evidence_gap,
        ];
        if durations.iter().any(|d| *d > MAX_DURATION) {
            return bad("durations must be shorter than 30 years");
        }
        if self.plateau.is_zero() {
            return bad("the plateau must be longer than 0 s");
        }
        if self.min_warmup > self.max_warmup {
            return bad("the minimum warm-up must not exceed the maximum warm-up");
        }
        if self.max_test_points < 8 || self.max_test_points > 4096 {
            return bad("the number of test points must be between 8 and 4096");
        }
        if self.tail_points < 16 || self.head_points < 16 {
            return bad("the series must keep at least 16 raw samples and 16 buckets");
        }
        Ok(())
    }
}

/// A duration as whole milliseconds (saturating; the thresholds are far below the limit).
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(LeakConfig::default().validate(), Ok(()));
    }

    #[test]
    fn bad_values_are_named() {
        let cfg = LeakConfig {
            alpha: 0.0,
            ..LeakConfig::default()
        };
        assert!(
            matches!(cfg.validate(), Err(AnalysisError::InvalidConfig(m)) if m.contains("alpha"))
        );
        let cfg = LeakConfig {
            min_warmup: Duration::from_secs(700),
            ..LeakConfig::default()
        };
        assert!(cfg.validate().is_err());
        let cfg = LeakConfig {
            plateau: Duration::ZERO,
            ..LeakConfig::default()
        };
        assert!(cfg.validate().is_err());
        let cfg = LeakConfig {
            idle_for: Duration::MAX,
            ..LeakConfig::default()
        };
        assert!(cfg.validate().is_err());
    }
}
