//! Labeled traces and how the leak analysis is scored on them.
//!
//! The format (JSON, `docs/leaks.md` "Evaluation") is one object per trace: the device's
//! capacity, optionally its free memory over time, and per process a memory series, a
//! label (`leak` with the time the leak started, `idle` with the time idleness started, or
//! `not-leak`) and optional activity evidence. Pairs are `[unix_ms, value]`.
//!
//! Scoring replays each series through a `ProcessTracker`, as `leaks --watch` would,
//! and records every verdict change:
//! - a `leak` series is found (true positive) at the first `leak` verdict at or after the
//!   labeled start; the delay is the time between. A `leak` verdict before the start is a
//!   false alarm, never found is a miss;
//! - a `not-leak` or `idle` series with any `leak` verdict at any time is a false alarm;
//! - an `idle` series is found at the first `idle-holder` verdict.
#![allow(dead_code)]

use serde::{Deserialize, Serialize};
use vramctl_leaks::analysis::{
    CpuSample, DeviceActivitySample, FreeHistory, LeakChecks, LeakConfig, LeakRule, ProcessTracker,
    Sample, SeriesContext, SmSample, Verdict,
};

/// What a process really did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "label", rename_all = "kebab-case")]
pub enum Label {
    /// It leaks from this time on.
    Leak { leak_start_unix_ms: i64 },
    /// It holds memory without using the GPU from this time on.
    Idle { idle_start_unix_ms: i64 },
    /// Whatever it does, it does not leak.
    NotLeak,
}

/// One process of a trace.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabeledSeries {
    pub pid: u32,
    pub role: String,
    #[serde(default)]
    pub name: String,
    #[serde(flatten)]
    pub label: Label,
    #[serde(default)]
    pub process_start_unix_ms: Option<i64>,
    #[serde(with = "pairs_samples")]
    pub samples: Vec<Sample>,
    #[serde(default, with = "pairs_sm")]
    pub sm: Vec<SmSample>,
    #[serde(default, with = "triples_device")]
    pub device: Vec<DeviceActivitySample>,
    #[serde(default, with = "pairs_cpu")]
    pub cpu: Vec<CpuSample>,
}

/// One recording: one device and the processes on it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabeledTrace {
    pub name: String,
    pub capacity_bytes: Option<u64>,
    /// `[unix_ms, free_bytes]` of the device over time.
    #[serde(default)]
    pub device_free_bytes: Option<Vec<(i64, u64)>>,
    pub series: Vec<LabeledSeries>,
}

macro_rules! pair_format {
    ($module:ident, $ty:ty, |$s:ident| $to:expr, |$a:ident, $b:ident| $from:expr) => {
        mod $module {
            use super::*;
            pub fn serialize<S: serde::Serializer>(v: &[$ty], ser: S) -> Result<S::Ok, S::Error> {
                let pairs: Vec<(i64, u64)> = v.iter().map(|$s| $to).collect();
                pairs.serialize(ser)
            }
            pub fn deserialize<'de, D: serde::Deserializer<'de>>(
                de: D,
            ) -> Result<Vec<$ty>, D::Error> {
                let pairs: Vec<(i64, u64)> = Vec::deserialize(de)?;
                Ok(pairs.into_iter().map(|($a, $b)| $from).collect())
            }
        }
    };
}

pair_format!(pairs_samples, Sample, |s| (s.t_unix_ms, s.bytes), |t, b| {
    Sample::new(t, b)
});
pair_format!(
    pairs_sm,
    SmSample,
    |s| (s.t_unix_ms, u64::from(s.sm_percent)),
    |t, p| SmSample {
        t_unix_ms: t,
        sm_percent: u32::try_from(p).unwrap_or(u32::MAX),
    }
);
pair_format!(
    pairs_cpu,
    CpuSample,
    |s| (s.t_unix_ms, s.cpu_time_ms),
    |t, c| CpuSample {
        t_unix_ms: t,
        cpu_time_ms: c,
    }
);

mod triples_device {
    use super::*;
    pub fn serialize<S: serde::Serializer>(
        v: &[DeviceActivitySample],
        ser: S,
    ) -> Result<S::Ok, S::Error> {
        let t: Vec<(i64, u32, u32)> = v
            .iter()
            .map(|s| {
                (
                    s.t_unix_ms,
                    s.utilization_gpu_percent,
                    s.processes_on_device,
                )
            })
            .collect();
        t.serialize(ser)
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        de: D,
    ) -> Result<Vec<DeviceActivitySample>, D::Error> {
        let t: Vec<(i64, u32, u32)> = Vec::deserialize(de)?;
        Ok(t.into_iter()
            .map(|(t, u, p)| DeviceActivitySample {
                t_unix_ms: t,
                utilization_gpu_percent: u,
                processes_on_device: p,
            })
            .collect())
    }
}

/// How one series was judged.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub trace: String,
    pub pid: u32,
    pub role: String,
    pub label: Label,
    /// Every verdict change: (unix ms, verdict).
    pub changes: Vec<(i64, Verdict)>,
    pub first_leak_unix_ms: Option<i64>,
    /// The rule of the first `leak` verdict.
    pub first_leak_rule: Option<LeakRule>,
    /// The gates of the last verdict (what kept a `growing` series from being a leak).
    pub final_checks: Option<LeakChecks>,
    pub first_idle_unix_ms: Option<i64>,
    pub final_verdict: Option<Verdict>,
    pub final_explanation: String,
    pub class: Class,
    /// Leak: seconds from the labeled start to the first `leak` verdict. Idle: seconds
    /// from the labeled idle start to the first `idle-holder` verdict.
    pub delay_sec: Option<f64>,
}

/// Confusion-matrix class for the leak question (idle series are also scored for
/// `idle-holder` in `Outcome::first_idle_unix_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    /// A leak, flagged after it started.
    Found,
    /// A leak never flagged.
    Missed,
    /// `leak` on a series that does not leak, or before the leak started.
    FalseAlarm,
    /// Not a leak and never called one.
    Quiet,
}

/// Sample time between forced analyses on top of the tracker's own schedule (0: none):
/// `vramctl leaks --until T` run every second is the analysis at every second, where the
/// tracker of `leaks --watch` analyses only when its cadence says so and so may step over
/// a verdict that lasts a second (issue 35's flips on the batch path). Set once by
/// `evaluate_leaks --batch-every-ms`.
pub static BATCH_EVERY_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Replays one trace through trackers and scores every series.
pub fn evaluate(trace: &LabeledTrace, cfg: &LeakConfig) -> Vec<Outcome> {
    evaluate_every(
        trace,
        cfg,
        BATCH_EVERY_MS.load(std::sync::atomic::Ordering::Relaxed),
    )
}

/// [`evaluate`], with an analysis forced every `batch_every_ms` of sample time besides the
/// tracker's own (0: none), as `vramctl leaks --until T` run that often would give.
pub fn evaluate_every(trace: &LabeledTrace, cfg: &LeakConfig, batch_every_ms: i64) -> Vec<Outcome> {
    trace
        .series
        .iter()
        .map(|s| evaluate_series(trace, s, cfg, batch_every_ms))
        .collect()
}

fn evaluate_series(
    trace: &LabeledTrace,
    s: &LabeledSeries,
    cfg: &LeakConfig,
    batch_every_ms: i64,
) -> Outcome {
    let ctx = SeriesContext {
        capacity_bytes: trace.capacity_bytes,
        free_bytes: None,
        free_history: Default::default(),
        process_start_unix_ms: s.process_start_unix_ms,
        device_label: Some("GPU 0".to_owned()),
        ended: false,
        device_total: false,
    };
    let mut tracker = ProcessTracker::new(ctx, cfg.clone()).expect("valid config");
    let free = trace.device_free_bytes.as_deref().unwrap_or(&[]);
    let (mut i_sm, mut i_dev, mut i_cpu, mut i_free) = (0, 0, 0, 0);
    // The device's free memory at earlier times, as the live tracker keeps it per device.
    let mut free_history = FreeHistory::default();
    let mut changes = Vec::new();
    let mut first_leak_rule = None;
    let mut next_batch_ms = s.samples.first().map_or(0, |x| x.t_unix_ms) + batch_every_ms;
    for sample in &s.samples {
        let t = sample.t_unix_ms;
        while i_sm < s.sm.len() && s.sm[i_sm].t_unix_ms <= t {
            tracker.push_sm(s.sm[i_sm]);
            i_sm += 1;
        }
        while i_dev < s.device.len() && s.device[i_dev].t_unix_ms <= t {
            tracker.push_device(s.device[i_dev]);
            i_dev += 1;
        }
        while i_cpu < s.cpu.len() && s.cpu[i_cpu].t_unix_ms <= t {
            tracker.push_cpu(s.cpu[i_cpu]);
            i_cpu += 1;
        }
        while i_free < free.len() && free[i_free].0 <= t {
            i_free += 1;
        }
        let free_now = match i_free.checked_sub(1) {
            Some(k) => Some(free[k].1),
            // Without a device record: capacity minus this process (an upper bound).
            None => trace.capacity_bytes.map(|c| c.saturating_sub(sample.bytes)),
        };
        free_history.push(t, free_now);
        tracker.set_free_bytes(free_now, free_history.snapshot());
        if let Some(change) = tracker.push(*sample) {
            if change.to == Verdict::Leak && first_leak_rule.is_none() {
                first_leak_rule = change.report.rule;
            }
            changes.push((change.at_unix_ms, change.to));
        }
        if batch_every_ms > 0 && t >= next_batch_ms {
            next_batch_ms = t + batch_every_ms;
            if let Some(r) = tracker.analyze_now() {
                if changes.last().map(|c| c.1) != Some(r.verdict) {
                    if r.verdict == Verdict::Leak && first_leak_rule.is_none() {
                        first_leak_rule = r.rule;
                    }
                    changes.push((r.last_unix_ms, r.verdict));
                }
            }
        }
    }
    let final_report = tracker.analyze_now().cloned();
    if let Some(r) = &final_report {
        if changes.last().map(|c| c.1) != Some(r.verdict) {
            if r.verdict == Verdict::Leak && first_leak_rule.is_none() {
                first_leak_rule = r.rule;
            }
            changes.push((r.last_unix_ms, r.verdict));
        }
    }
    let first = |v: Verdict| changes.iter().find(|c| c.1 == v).map(|c| c.0);
    let first_leak = first(Verdict::Leak);
    let first_idle = first(Verdict::IdleHolder);
    let (class, delay) = match s.label {
        Label::Leak { leak_start_unix_ms } => {
            let early = changes
                .iter()
                .any(|c| c.1 == Verdict::Leak && c.0 < leak_start_unix_ms);
            let found = changes
                .iter()
                .find(|c| c.1 == Verdict::Leak && c.0 >= leak_start_unix_ms)
                .map(|c| c.0);
            match (early, found) {
                (true, _) => (Class::FalseAlarm, None),
                (false, Some(t)) => (Class::Found, Some((t - leak_start_unix_ms) as f64 / 1000.0)),
                (false, None) => (Class::Missed, None),
            }
        }
        Label::Idle { idle_start_unix_ms } => {
            let class = if first_leak.is_some() {
                Class::FalseAlarm
            } else {
                Class::Quiet
            };
            (
                class,
                first_idle.map(|t| (t - idle_start_unix_ms) as f64 / 1000.0),
            )
        }
        Label::NotLeak => {
            if first_leak.is_some() {
                (Class::FalseAlarm, None)
            } else {
                (Class::Quiet, None)
            }
        }
    };
    Outcome {
        trace: trace.name.clone(),
        pid: s.pid,
        role: s.role.clone(),
        label: s.label,
        changes,
        first_leak_unix_ms: first_leak,
        first_leak_rule,
        final_checks: final_report.as_ref().map(|r| r.checks),
        first_idle_unix_ms: first_idle,
        final_verdict: final_report.as_ref().map(|r| r.verdict),
        final_explanation: final_report.map(|r| r.explanation).unwrap_or_default(),
        class,
        delay_sec: delay,
    }
}

/// Precision and recall of the leak verdict over a set of outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Score {
    pub found: usize,
    pub missed: usize,
    pub false_alarms: usize,
    pub quiet: usize,
    pub precision: f64,
    pub recall: f64,
    pub max_delay_sec: Option<f64>,
}

pub fn score(outcomes: &[Outcome]) -> Score {
    let count = |c: Class| outcomes.iter().filter(|o| o.class == c).count();
    let (found, missed, false_alarms, quiet) = (
        count(Class::Found),
        count(Class::Missed),
        count(Class::FalseAlarm),
        count(Class::Quiet),
    );
    let ratio = |a: usize, b: usize| if b == 0 { 1.0 } else { a as f64 / b as f64 };
    Score {
        found,
        missed,
        false_alarms,
        quiet,
        precision: ratio(found, found + false_alarms),
        recall: ratio(found, found + missed),
        max_delay_sec: outcomes
            .iter()
            .filter(|o| o.class == Class::Found)
            .filter_map(|o| o.delay_sec)
            .max_by(f64::total_cmp),
    }
}

/// A plain-text table of outcomes and the score line.
pub fn render(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<22} {:>7} {:<15} {:<9} {:<12} {:>9}  {}\n",
        "trace", "pid", "role", "label", "class", "delay_s", "final verdict"
    ));
    for o in outcomes {
        let label = match o.label {
            Label::Leak { .. } => "leak",
            Label::Idle { .. } => "idle",
            Label::NotLeak => "not-leak",
        };
        let class = match o.class {
            Class::Found => "found",
            Class::Missed => "MISSED",
            Class::FalseAlarm => "FALSE-ALARM",
            Class::Quiet => "quiet",
        };
        let delay = o
            .delay_sec
            .map_or_else(|| "-".to_owned(), |d| format!("{d:.1}"));
        out.push_str(&format!(
            "{:<22} {:>7} {:<15} {:<9} {:<12} {:>9}  {}: {}\n",
            o.trace,
            o.pid,
            o.role,
            label,
            class,
            delay,
            o.final_verdict.map_or("-", |v| v.as_str()),
            o.final_explanation
        ));
    }
    let s = score(outcomes);
    out.push_str(&format!(
        "leaks: found {}, missed {}, false alarms {}, quiet {}; precision {:.2}, recall {:.2}, max delay {}\n",
        s.found,
        s.missed,
        s.false_alarms,
        s.quiet,
        s.precision,
        s.recall,
        s.max_delay_sec.map_or_else(|| "-".to_owned(), |d| format!("{d:.1} s"))
    ));
    out
}
