//! Live analysis: samples arrive one at a time, a verdict comes out when it changes.
//!
//! Pushing a sample is O(1) amortised (it goes into the bounded [`Tiered`] series). The
//! full analysis — the same one [`analyze`](super::analyze) runs — is re-run only when it
//! can matter: when the memory level changed or the activity evidence changed the picture
//! (an idle span began or ended, not merely went on), at most once per
//! [`Cadence::min`] of sample time ([`Cadence::max`] once the verdict is `leak`,
//! `sawtooth` or `idle-holder`, which only a plateau or new activity can end), and
//! otherwise every [`Cadence::max`] so that verdicts that change with time alone (a
//! plateau reached, an idle span long enough) are seen.
//! `docs/benchmarks.md` (issue 4) has the measured cost per sample.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::config::ms;
use super::idle::IdleFold;
use super::series::{Sample, Tiered};
use super::{
    AnalysisError, CpuSample, DeviceActivitySample, LeakConfig, SeriesContext, SeriesReport,
    SmSample, Verdict, report,
};

/// How often a tracker re-runs its analysis, in sample time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    /// Least time between two analyses triggered by a change.
    pub min: Duration,
    /// Most time between two analyses.
    pub max: Duration,
}

impl Cadence {
    /// For a person watching (`leaks --watch`, `top`): a change shows within a second.
    pub const INTERACTIVE: Self = Self {
        min: Duration::from_secs(1),
        max: Duration::from_secs(5),
    };
    /// For an exporter scraped every 15–60 s: verdicts up to 10 s late, a fifth to a tenth
    /// of the analyses (the daemon's CPU goal is 0.5 % of a core with 240 processes).
    pub const SCRAPED: Self = Self {
        min: Duration::from_secs(10),
        max: Duration::from_secs(20),
    };
}

impl Default for Cadence {
    fn default() -> Self {
        Self::INTERACTIVE
    }
}

/// A verdict that differs from the previous one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerdictChange {
    /// Time of the sample that produced it.
    pub at_unix_ms: i64,
    /// The verdict before (`None` for the first one).
    pub from: Option<Verdict>,
    /// The new verdict.
    pub to: Verdict,
    /// The full report behind it.
    pub report: SeriesReport,
}

/// Incremental analysis of one process (or device) series.
#[derive(Debug, Clone)]
pub struct ProcessTracker {
    cfg: LeakConfig,
    min_ms: i64,
    max_ms: i64,
    ctx: SeriesContext,
    series: Tiered,
    allocated: Option<Tiered>,
    idle: IdleFold,
    last_report: Option<SeriesReport>,
    last_analysis_ms: Option<i64>,
    last_level: Option<u64>,
    dirty: bool,
    analyses: u64,
}

impl ProcessTracker {
    /// A tracker with no samples yet.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidConfig`] for bad thresholds.
    pub fn new(ctx: SeriesContext, cfg: LeakConfig) -> Result<Self, AnalysisError> {
        cfg.validate()?;
        Ok(Self {
            series: Tiered::new(cfg.tail_points, cfg.head_points),
            allocated: None,
            idle: IdleFold::new(
                ms(cfg.max_evidence_gap),
                ms(cfg.idle_for),
                cfg.cpu_idle_fraction,
            ),
            min_ms: ms(Cadence::INTERACTIVE.min),
            max_ms: ms(Cadence::INTERACTIVE.max),
            cfg,
            ctx,
            last_report: None,
            last_analysis_ms: None,
            last_level: None,
            dirty: false,
            analyses: 0,
        })
    }

    /// The same tracker re-analysing at `cadence` instead of [`Cadence::INTERACTIVE`].
    #[must_use]
    pub fn with_cadence(mut self, cadence: Cadence) -> Self {
        self.min_ms = ms(cadence.min);
        self.max_ms = ms(cadence.max).max(self.min_ms);
        self
    }

    /// Adds a memory sample; returns the new verdict when it differs from the last one.
    ///
    /// Push the tick's activity samples before its memory sample.
    pub fn push(&mut self, sample: Sample) -> Option<VerdictChange> {
        if !self.series.push(&sample) {
            return None;
        }
        if self.last_level != Some(sample.bytes) {
            self.dirty = true;
            self.last_level = Some(sample.bytes);
        }
        // While a verdict is settled (a confirmed leak keeps changing the level), only
        // time can change it: the plateau that ends a leak takes 20 s to show.
        let settled = matches!(
            self.verdict(),
            Some(Verdict::Leak | Verdict::Sawtooth | Verdict::IdleHolder)
        );
        let min_ms = if settled { self.max_ms } else { self.min_ms };
        let due = match self.last_analysis_ms {
            None => true,
            Some(last) => {
                let since = sample.t_unix_ms - last;
                (self.dirty && since >= min_ms) || since >= self.max_ms
            }
        };
        if !due {
            return None;
        }
        let before = self.last_report.as_ref().map(|r| r.verdict);
        let now = self.analyze_now()?;
        (before != Some(now.verdict)).then(|| VerdictChange {
            at_unix_ms: now.last_unix_ms,
            from: before,
            to: now.verdict,
            report: now.clone(),
        })
    }

    /// Adds a sample of the allocator's allocated bytes (where the process reports them,
    /// [`SeriesInputs`](super::SeriesInputs)); push it before the tick's memory sample.
    /// A change marks the analysis due, as a memory change does.
    pub fn push_allocated(&mut self, sample: Sample) {
        let cfg = &self.cfg;
        let series = self
            .allocated
            .get_or_insert_with(|| Tiered::new(cfg.tail_points, cfg.head_points));
        let before = series.last().map(|p| p.last);
        if series.push(&sample) && before != Some(sample.bytes) {
            self.dirty = true;
        }
    }

    /// Adds a per-process SM activity sample.
    pub fn push_sm(&mut self, sample: SmSample) {
        let before = self.idle.state_key();
        self.idle.push_sm(sample);
        self.dirty |= self.idle.state_key() != before;
    }

    /// Adds a device utilization sample.
    pub fn push_device(&mut self, sample: DeviceActivitySample) {
        let before = self.idle.state_key();
        self.idle.push_device(sample);
        self.dirty |= self.idle.state_key() != before;
    }

    /// Adds a CPU time sample.
    pub fn push_cpu(&mut self, sample: CpuSample) {
        let before = self.idle.state_key();
        self.idle.push_cpu(sample);
        self.dirty |= self.idle.state_key() != before;
    }

    /// Updates the device's free memory now (for the time to full) and at earlier times
    /// (for the look-back at earlier ends: [`super::FreeHistory::snapshot`] of the device's
    /// history, which whoever reads the device keeps once for all its processes).
    pub fn set_free_bytes(&mut self, free_bytes: Option<u64>, history: Arc<[(i64, u64)]>) {
        self.ctx.free_bytes = free_bytes;
        self.ctx.free_history = history;
    }

    /// Runs the analysis now, whatever the schedule, and keeps the result.
    pub fn analyze_now(&mut self) -> Option<&SeriesReport> {
        let r = report(
            &self.series,
            self.allocated.as_ref(),
            &self.idle,
            &self.ctx,
            &self.cfg,
        )?;
        self.last_analysis_ms = Some(r.last_unix_ms);
        self.dirty = false;
        self.analyses += 1;
        self.last_report = Some(r);
        self.last_report.as_ref()
    }

    /// The last report made (it may be up to a few seconds of sample time old).
    pub fn report(&self) -> Option<&SeriesReport> {
        self.last_report.as_ref()
    }

    /// The current verdict.
    pub fn verdict(&self) -> Option<Verdict> {
        self.last_report.as_ref().map(|r| r.verdict)
    }

    /// How many times the full analysis ran (for cost measurements).
    pub fn analyses(&self) -> u64 {
        self.analyses
    }
}
