//! The seam for leak and idle-holder verdicts.
//!
//! The analysis (pure functions in `vramctl_leaks::analysis`) decides; the UI only shows what
//! it decided, with the numbers behind it. A [`Judge`] runs on the sampler's thread after
//! each observation (the analysis is not free, and drawing must stay cheap) and fills
//! [`Verdicts`]. Live, [`AnalysisJudge`] runs the live analysis (`FleetTracker`, the one
//! `leaks --watch` and `serve` run) over every observation; [`NoJudge`] leaves the verdicts
//! empty, and the UI then shows no leak or idle flag: it does not guess.

use jiff::tz::TimeZone;
use vramctl_core::wall_time;
use vramctl_leaks::analysis::live::{FleetConfig, FleetTracker, TickChanges};
use vramctl_leaks::analysis::{
    AnalysisError, Evidence, ExplainStyle, LeakConfig, LeakRule, Phase, SeriesReport, Verdict,
    explain, human_bytes, human_duration, human_rate,
};

use crate::observation::{HostProcess, Observation};
pub use crate::observation::{Judge, ProcessVerdict, VerdictKind, Verdicts};

/// Decides verdicts at a replay's time cursor, which jumps in both directions: the
/// analysis of the recording up to the moment on screen. Runs on the replay thread.
pub trait ReplayJudge: Send {
    /// The verdicts as of `observation`, the recorded moment at the cursor.
    fn judge_at(&mut self, observation: &Observation) -> Verdicts;
}

/// No analysis: no verdicts.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoJudge;

impl Judge for NoJudge {
    fn judge(&mut self, _observation: &Observation) -> Verdicts {
        Verdicts::default()
    }
}

/// The live leak and idle analysis: one `FleetTracker` fed every observation, with each
/// process's start and CPU time as the observation's /proc facts give them (nothing is
/// read twice). Its verdicts speak for what `top` has seen since it started.
#[derive(Debug, Clone)]
pub struct AnalysisJudge {
    fleet: FleetTracker,
    time_zone: TimeZone,
}

impl AnalysisJudge {
    /// A judge with `cfg`'s thresholds.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidConfig`] for bad thresholds.
    pub fn new(cfg: LeakConfig) -> Result<Self, AnalysisError> {
        Self::with_fleet_config(FleetConfig {
            leak: cfg,
            ..FleetConfig::default()
        })
    }

    /// A judge with the whole tracker configuration `cfg` (`leaks --watch` and `reap` set
    /// more than the thresholds): the one place a frontend's `FleetTracker` is made.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidConfig`] for bad thresholds.
    pub fn with_fleet_config(cfg: FleetConfig) -> Result<Self, AnalysisError> {
        Ok(Self {
            fleet: FleetTracker::new(cfg)?,
            time_zone: TimeZone::UTC,
        })
    }

    /// Times in the verdicts' explanations in `tz` (default UTC).
    #[must_use]
    pub fn with_time_zone(mut self, tz: TimeZone) -> Self {
        self.time_zone = tz;
        self
    }

    /// Feeds `observation` to the tracker (each process's start and CPU time as the
    /// observation's /proc facts give them, and the allocated bytes of each process whose
    /// agent answered: its leak verdict is then judged on live tensors, issue 35) and says
    /// what changed: `leaks --watch` prints the changes, [`Judge::judge`] turns the current
    /// reports into verdicts.
    pub fn track(&mut self, observation: &Observation) -> TickChanges {
        let hosts = &observation.hosts;
        let agents = &observation.agents;
        self.fleet.observe_with_allocated(
            &observation.snapshot,
            |pid| HostProcess::live_facts(hosts.get(&pid)),
            |uuid, pid| agents.get(pid, uuid).and_then(|m| m.allocated_bytes),
        )
    }

    /// The tracker: where each series is, and the time line's now.
    pub fn fleet(&self) -> &FleetTracker {
        &self.fleet
    }
}

impl Judge for AnalysisJudge {
    fn judge(&mut self, observation: &Observation) -> Verdicts {
        self.track(observation);
        let mut verdicts = Verdicts::default();
        for (key, place, report) in self.fleet.current() {
            if let Some(report) = report {
                verdicts.insert(
                    key.pid,
                    &key.device_uuid,
                    verdict_of(report, &place.label, &self.time_zone),
                );
            }
        }
        verdicts
    }
}

/// A report as the UI shows it: the verdict, the analysis' explanation (times in `tz`, as
/// everywhere in `top`), and the numbers behind it, the ones that decided the verdict first
/// (the detail pane shows as many as fit).
pub fn verdict_of(report: &SeriesReport, device: &str, tz: &TimeZone) -> ProcessVerdict {
    let time = |t: i64| wall_time::clock(tz, t, false);
    let kind = match report.verdict {
        Verdict::Leak => VerdictKind::Leak,
        Verdict::IdleHolder => VerdictKind::IdleHolder,
        Verdict::Growing => VerdictKind::Growing,
        Verdict::Stable => VerdictKind::Stable,
        Verdict::Sawtooth => VerdictKind::Sawtooth,
    };
    let mut numbers = match report.verdict {
        Verdict::Leak | Verdict::Growing => trend_numbers(report, &time),
        Verdict::Sawtooth => sawtooth_numbers(report),
        Verdict::Stable | Verdict::IdleHolder => vec![phase_number(report, &time)],
    };
    let idle = idle_numbers(report, &time);
    if report.verdict == Verdict::IdleHolder {
        numbers.splice(0..0, idle);
    } else {
        numbers.extend(idle);
    }
    ProcessVerdict {
        kind,
        // The report's own explanation says UTC; this one speaks the UI's zone.
        summary: explain(
            report,
            &ExplainStyle {
                device,
                time: &time,
            },
        ),
        numbers,
        idle: Some(report.idle.state()),
    }
}

fn number(name: &str, value: String) -> (String, String) {
    (name.to_owned(), value)
}

/// Slope, significance, onset, time to full, growth and the rule that fired.
fn trend_numbers(report: &SeriesReport, time: &dyn Fn(i64) -> String) -> Vec<(String, String)> {
    let p = report.p_value;
    let growth = report.net_growth_bytes;
    let mut out = vec![
        number("slope", human_rate(report.slope_bytes_per_sec)),
        number(
            "p-value",
            if p < 0.001 {
                "< 0.001 (Mann-Kendall)".to_owned()
            } else {
                format!("{p:.3} (Mann-Kendall)")
            },
        ),
        number(
            "onset",
            report.onset_unix_ms.map_or_else(|| "-".to_owned(), time),
        ),
        number(
            "time to full",
            report.time_to_full_sec.map_or_else(
                || "unknown (free memory not known)".to_owned(),
                human_duration,
            ),
        ),
        number(
            "growth",
            format!(
                "{}{} in {}",
                if growth < 0 { "-" } else { "+" },
                human_bytes(growth.unsigned_abs()),
                human_duration(report.trend.duration_sec)
            ),
        ),
    ];
    if let Some(rule) = report.rule {
        out.push(number(
            "rule",
            match rule {
                LeakRule::AfterPlateau => "growth resumed after a plateau",
                LeakRule::SteadyGrowth => "steady since its start, not slowing as warm-up",
                LeakRule::FillsDevice => "fills the GPU soon at this rate",
            }
            .to_owned(),
        ));
    }
    out
}

fn sawtooth_numbers(report: &SeriesReport) -> Vec<(String, String)> {
    let every = report.release_period_ms.map_or_else(String::new, |ms| {
        format!(" every {}", human_duration(ms as f64 / 1000.0))
    });
    vec![
        number("releases", format!("{}{every}", report.releases)),
        number("floor", human_bytes(report.floor_bytes)),
        number("peak", human_bytes(report.peak_bytes)),
    ]
}

fn phase_number(report: &SeriesReport, time: &dyn Fn(i64) -> String) -> (String, String) {
    number(
        "phase",
        match (report.phase, report.settled_unix_ms) {
            (Phase::Settled, Some(t)) => format!("settled at {}", time(t)),
            (Phase::Settled, None) => "settled".to_owned(),
            (Phase::WarmUp, _) => "warming up".to_owned(),
        },
    )
}

/// How long it has been idle and by which evidence, or when it was last active.
fn idle_numbers(report: &SeriesReport, time: &dyn Fn(i64) -> String) -> Vec<(String, String)> {
    let idle = &report.idle;
    let names = |list: &[Evidence]| {
        list.iter()
            .map(|e| e.describe())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (idle.idle_sec, idle.idle_since_unix_ms) {
        (Some(secs), Some(since)) => vec![
            number(
                "idle",
                format!("for {} (since {})", human_duration(secs), time(since)),
            ),
            number("idle evidence", names(&idle.evidence)),
        ],
        _ if idle.sources.is_empty() => vec![number("idle", "no evidence either way".to_owned())],
        _ => vec![
            number(
                "idle",
                idle.last_active_unix_ms.map_or_else(
                    || "not shown idle".to_owned(),
                    |t| format!("no: last active at {}", time(t)),
                ),
            ),
            number("idle evidence", names(&idle.sources)),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_per_process_and_device() {
        let mut v = Verdicts::default();
        assert!(v.is_empty());
        v.insert(
            7,
            "GPU-a",
            ProcessVerdict {
                kind: VerdictKind::Leak,
                summary: "leaks".into(),
                numbers: vec![],
                idle: None,
            },
        );
        assert_eq!(v.get(7, "GPU-a").map(|v| v.kind), Some(VerdictKind::Leak));
        assert_eq!(v.get(7, "GPU-b"), None);
        assert_eq!(v.get(8, "GPU-a"), None);
    }
}
