//! The live path: a recording fed tick by tick to `FleetTracker`, the component
//! `leaks --watch`, `top` (cadence `interactive`) and `serve` (cadence `scraped`) run on
//! every sampler tick.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use vramctl_leaks::analysis::live::{FleetConfig, SeriesKey};
use vramctl_leaks::analysis::{Cadence, LeakConfig, SeriesReport, Verdict};

use vramctl_observe::observation::{HostProcess, Observation};
use vramctl_observe::verdict::AnalysisJudge;

use super::replay::{FactsReplay, Recording};

/// One series as every path names it: the GPU, the PID and the process's start time in
/// clock ticks (`None` where the source has no /proc facts, e.g. an nvidia-smi log).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SeriesId {
    pub gpu_uuid: String,
    pub pid: u32,
    pub start_time_ticks: Option<u64>,
}

/// A verdict at a time, with what made it. The rule and the gates are kept as the
/// report's JSON says them (`rule`, `checks`), so the scorer outlives a redesign of them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// The time the verdict speaks for (its last sample).
    pub t_ms: i64,
    pub verdict: Verdict,
    pub rule: Option<String>,
    pub checks: serde_json::Value,
    pub explanation: String,
}

impl Change {
    pub fn of(report: &SeriesReport) -> Self {
        Self {
            t_ms: report.last_unix_ms,
            verdict: report.verdict,
            rule: serde_json::to_value(report.rule)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned)),
            checks: serde_json::to_value(report.checks).unwrap_or_default(),
            explanation: report.explanation.clone(),
        }
    }
}

/// The verdict called `name` in JSON.
pub fn verdict_named(name: &str) -> Option<Verdict> {
    [
        Verdict::Leak,
        Verdict::Growing,
        Verdict::Stable,
        Verdict::Sawtooth,
        Verdict::IdleHolder,
    ]
    .into_iter()
    .find(|v| v.as_str() == name)
}

/// What one path said about one series over the recording.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    /// First and last sample of the series.
    pub first_ms: i64,
    pub last_ms: i64,
    /// Every verdict change, the first verdict included.
    pub changes: Vec<Change>,
    /// The last report made (live: up to the cadence's most old; batch: the whole
    /// recording).
    #[serde(skip)]
    pub last_report: Option<SeriesReport>,
}

impl Timeline {
    /// The last verdict said.
    pub fn final_change(&self) -> Option<&Change> {
        self.changes.last()
    }
}

/// Which live frontend's cadence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LiveCadence {
    /// `leaks --watch`, `top`: re-analysed at most every 1 s, at least every 5 s.
    Interactive,
    /// `serve`: at most every 10 s, at least every 20 s.
    Scraped,
}

impl LiveCadence {
    pub fn cadence(self) -> Cadence {
        match self {
            Self::Interactive => Cadence::INTERACTIVE,
            Self::Scraped => Cadence::SCRAPED,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Interactive => "watch",
            Self::Scraped => "serve",
        }
    }
}

/// Replays `recording` through one `FleetTracker` (the frontends' `AnalysisJudge`) with
/// `cfg` at `cadence`: one
/// [`Timeline`] per series.
///
/// # Errors
/// When the store fails or `cfg` is invalid.
pub fn run(
    recording: &mut Recording,
    cfg: &LeakConfig,
    cadence: LiveCadence,
) -> anyhow::Result<BTreeMap<SeriesId, Timeline>> {
    let mut judge = AnalysisJudge::with_fleet_config(FleetConfig {
        leak: cfg.clone(),
        // As the frontends keep it: a process gone for a minute is forgotten.
        forget_after: Duration::from_secs(60),
        cadence: cadence.cadence(),
    })?;
    let infos = recording.catalog.device_infos();
    let mut facts = FactsReplay::default();
    let mut out: BTreeMap<SeriesId, Timeline> = BTreeMap::new();
    let id_of = |key: &SeriesKey| SeriesId {
        gpu_uuid: key.device_uuid.clone(),
        pid: key.pid,
        start_time_ticks: key.start_time_ticks,
    };
    recording.ticks(|catalog, tick| {
        let Some(snapshot) = catalog.snapshot(tick, &infos) else {
            return;
        };
        let now = catalog.facts(tick, &mut facts);
        // The recorded facts as the observation the frontends judge.
        let mut observation = Observation::bare(snapshot);
        for (&pid, facts) in &now {
            observation.hosts.insert(
                pid,
                HostProcess {
                    pid,
                    start_time_ticks: facts.start_time_ticks,
                    started_at_unix_ms: facts.started_at_unix_ms,
                    cpu_time_ms: facts.cpu_time_ms,
                    ..HostProcess::default()
                },
            );
        }
        let changed = judge.track(&observation);
        for c in changed.changes {
            let timeline = out.entry(id_of(&c.key)).or_insert_with(|| Timeline {
                first_ms: c.change.report.first_unix_ms,
                last_ms: c.change.report.last_unix_ms,
                changes: Vec::new(),
                last_report: None,
            });
            timeline.changes.push(Change::of(&c.change.report));
        }
        // The latest report of every listed series (it may be newer than its last
        // change), and the last time each was seen.
        for (key, _, report) in judge.fleet().current() {
            let Some(report) = report else { continue };
            let timeline = out.entry(id_of(key)).or_insert_with(|| Timeline {
                first_ms: report.first_unix_ms,
                last_ms: report.last_unix_ms,
                changes: Vec::new(),
                last_report: None,
            });
            timeline.last_ms = tick.t_ms;
            if timeline
                .last_report
                .as_ref()
                .is_none_or(|r| r.last_unix_ms != report.last_unix_ms)
            {
                timeline.last_report = Some(report.clone());
            }
        }
    })?;
    Ok(out)
}
