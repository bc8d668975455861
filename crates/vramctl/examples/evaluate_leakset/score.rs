//! Scoring verdict timelines against the labels: per workload, per half, and the goals of
//! issue 13.
//!
//! Per workload and path (a timeline of verdicts):
//! - a leak is **found** at the first `leak` verdict at or after its labeled start; the
//!   delay is counted from the leak's start and from the process's start (`start` label,
//!   else the series' first sample). A `leak` verdict before the leak's start is a
//!   **false alarm**; never `leak` after it, a **miss**;
//! - a workload that does not leak (idle holders included) with any `leak` verdict is a
//!   **false alarm**, else **quiet**;
//! - an idle holder is found at its first `idle-holder` verdict at or after its idle start.
//!
//! Precision = found / (found + false alarms), recall = found / (found + missed): per half,
//! source and path. A **flip** (issue 35) is a change from `leak` to another verdict while
//! the process still runs: a leak's verdict must not go back without the floor stopping.

use std::collections::BTreeMap;

use serde::Serialize;
use vramctl_leaks::analysis::Verdict;

use super::labels::{Half, Truth, Workload};
use super::live::{Change, SeriesId, Timeline};

/// How one workload was judged by one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    /// A leak, flagged after it started.
    Found,
    /// A leak never flagged after it started.
    Missed,
    /// `leak` on a workload that does not leak, or before the leak started.
    FalseAlarm,
    /// Not a leak and never called one.
    Quiet,
    /// The workload is not in this recording (no series with its PID).
    Absent,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Found => "found",
            Self::Missed => "MISSED",
            Self::FalseAlarm => "FALSE ALARM",
            Self::Quiet => "quiet",
            Self::Absent => "absent",
        }
    }
}

/// One workload as one path judged it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub role: String,
    pub pid: u32,
    pub half: Half,
    pub truth: Truth,
    pub rate_mb_s: Option<f64>,
    pub first_step: bool,
    pub series: Option<SeriesId>,
    pub class: Class,
    /// First `leak` verdict at any time.
    pub first_leak_ms: Option<i64>,
    /// First `leak` verdict at or after the leak's start.
    pub found_ms: Option<i64>,
    pub delay_from_leak_start_sec: Option<f64>,
    pub delay_from_process_start_sec: Option<f64>,
    pub idle_found_ms: Option<i64>,
    pub idle_delay_sec: Option<f64>,
    /// The process's start the delays count from.
    pub start_ms: Option<i64>,
    pub leak_start_ms: Option<i64>,
    /// The series' last sample.
    pub last_ms: Option<i64>,
    /// Changes from `leak` to another verdict (issue 35's flicker), with when they came.
    pub flips: Vec<Flip>,
    pub timeline: Vec<Change>,
}

/// One change away from `leak`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Flip {
    pub t_ms: i64,
    /// The verdict it went to.
    pub to: Verdict,
}

/// The changes of `changes` from `leak` to another verdict.
pub fn flips(changes: &[Change]) -> Vec<Flip> {
    changes
        .windows(2)
        .filter(|pair| pair[0].verdict == Verdict::Leak && pair[1].verdict != Verdict::Leak)
        .map(|pair| Flip {
            t_ms: pair[1].t_ms,
            to: pair[1].verdict,
        })
        .collect()
}

impl Outcome {
    /// The last verdict said.
    pub fn final_change(&self) -> Option<&Change> {
        self.timeline.last()
    }
}

/// The series of `timelines` that is `w`'s process: its PID, and where a PID names
/// several series (a reused PID, several GPUs), the one whose samples overlap the
/// workload's labeled life the most.
pub fn series_of<'a>(
    w: &Workload,
    timelines: &'a BTreeMap<SeriesId, Timeline>,
) -> Option<(&'a SeriesId, &'a Timeline)> {
    let (from, to) = (w.start_ms.unwrap_or(i64::MIN), w.end_ms.unwrap_or(i64::MAX));
    timelines
        .iter()
        .filter(|(id, _)| id.pid == w.pid)
        .max_by_key(|(_, t)| t.last_ms.min(to).saturating_sub(t.first_ms.max(from)))
}

/// Scores `w` on one path's timelines.
pub fn outcome(w: &Workload, timelines: &BTreeMap<SeriesId, Timeline>) -> Outcome {
    let found = series_of(w, timelines);
    let changes: Vec<Change> = found.map(|(_, t)| t.changes.clone()).unwrap_or_default();
    let first = |v: Verdict, from: i64| {
        changes
            .iter()
            .find(|c| c.verdict == v && c.t_ms >= from)
            .map(|c| c.t_ms)
    };
    let first_leak_ms = first(Verdict::Leak, i64::MIN);
    let start_ms = w.start_ms.or(found.map(|(_, t)| t.first_ms));
    let seconds = |a: i64, b: i64| (b - a) as f64 / 1000.0;
    let mut out = Outcome {
        role: w.role.clone(),
        pid: w.pid,
        half: w.half,
        truth: w.truth,
        rate_mb_s: w.rate_mb_s,
        first_step: w.first_step,
        series: found.map(|(id, _)| id.clone()),
        class: Class::Absent,
        first_leak_ms,
        found_ms: None,
        delay_from_leak_start_sec: None,
        delay_from_process_start_sec: None,
        idle_found_ms: None,
        idle_delay_sec: None,
        start_ms,
        leak_start_ms: w.leak_start_ms,
        last_ms: found.map(|(_, t)| t.last_ms),
        flips: flips(&changes),
        timeline: changes.clone(),
    };
    if found.is_none() {
        return out;
    }
    if let Some(idle_start) = w.idle_start_ms.filter(|_| w.truth == Truth::Idle) {
        out.idle_found_ms = first(Verdict::IdleHolder, idle_start);
        out.idle_delay_sec = out.idle_found_ms.map(|t| seconds(idle_start, t));
    }
    out.class = match (w.truth, w.leak_start_ms) {
        (Truth::Leak, Some(leak_start)) => {
            out.found_ms = first(Verdict::Leak, leak_start);
            out.delay_from_leak_start_sec = out.found_ms.map(|t| seconds(leak_start, t));
            out.delay_from_process_start_sec =
                out.found_ms.zip(start_ms).map(|(t, s)| seconds(s, t));
            match (first_leak_ms, out.found_ms) {
                (Some(t), _) if t < leak_start => Class::FalseAlarm,
                (_, Some(_)) => Class::Found,
                _ => Class::Missed,
            }
        }
        _ if first_leak_ms.is_some() => Class::FalseAlarm,
        _ => Class::Quiet,
    };
    out
}

/// Precision, recall and delays of one half on one source and path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub half: Half,
    pub source: String,
    pub path: String,
    pub leaks: usize,
    pub found: usize,
    pub missed: usize,
    pub false_alarms: usize,
    pub quiet: usize,
    pub absent: usize,
    pub precision: f64,
    pub recall: f64,
    /// From the leak's start, over the found leaks.
    pub delay_min_sec: Option<f64>,
    pub delay_median_sec: Option<f64>,
    pub delay_max_sec: Option<f64>,
    pub idle_holders: usize,
    pub idle_found: usize,
    pub idle_delay_median_sec: Option<f64>,
    pub missed_roles: Vec<String>,
    pub false_alarm_roles: Vec<String>,
    /// Flips after the first `leak`, summed over the leaks (a false alarm's are part of
    /// its false alarm), and the leaks that flipped.
    pub flips: usize,
    pub flipped_roles: Vec<String>,
}

/// The median of `values` (the mean of the middle two for an even count).
pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

/// Sums up `outcomes` (all of one half, source and path).
pub fn summary(half: Half, source: &str, path: &str, outcomes: &[&Outcome]) -> Summary {
    let count = |c: Class| outcomes.iter().filter(|o| o.class == c).count();
    let (found, missed, false_alarms, quiet, absent) = (
        count(Class::Found),
        count(Class::Missed),
        count(Class::FalseAlarm),
        count(Class::Quiet),
        count(Class::Absent),
    );
    let ratio = |a: usize, b: usize| if b == 0 { 1.0 } else { a as f64 / b as f64 };
    let mut delays: Vec<f64> = outcomes
        .iter()
        .filter(|o| o.class == Class::Found)
        .filter_map(|o| o.delay_from_leak_start_sec)
        .collect();
    let mut idle_delays: Vec<f64> = outcomes.iter().filter_map(|o| o.idle_delay_sec).collect();
    let roles = |c: Class| {
        outcomes
            .iter()
            .filter(|o| o.class == c)
            .map(|o| o.role.clone())
            .collect()
    };
    let leak_flips = || {
        outcomes
            .iter()
            .filter(|o| o.truth == Truth::Leak && !o.flips.is_empty())
    };
    Summary {
        half,
        source: source.to_owned(),
        path: path.to_owned(),
        leaks: outcomes.iter().filter(|o| o.truth == Truth::Leak).count(),
        found,
        missed,
        false_alarms,
        quiet,
        absent,
        precision: ratio(found, found + false_alarms),
        recall: ratio(found, found + missed),
        delay_min_sec: delays.iter().copied().min_by(f64::total_cmp),
        delay_max_sec: delays.iter().copied().max_by(f64::total_cmp),
        delay_median_sec: median(&mut delays),
        idle_holders: outcomes.iter().filter(|o| o.truth == Truth::Idle).count(),
        idle_found: outcomes
            .iter()
            .filter(|o| o.idle_found_ms.is_some())
            .count(),
        idle_delay_median_sec: median(&mut idle_delays),
        missed_roles: roles(Class::Missed),
        false_alarm_roles: roles(Class::FalseAlarm),
        flips: leak_flips().map(|o| o.flips.len()).sum(),
        flipped_roles: leak_flips().map(|o| o.role.clone()).collect(),
    }
}

/// How often a source was sampled, for the goals that depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IntervalClass {
    /// ≤ 250 ms (vramctl's 100 ms recorder).
    Fast,
    /// ≤ 2 s (nvidia-smi `-l 1`, a 1 s recorder).
    Second,
    /// Slower (10 s: Prometheus scrapes, a cheap recorder).
    Slow,
}

impl IntervalClass {
    pub fn of(interval_ms: i64) -> Self {
        if interval_ms <= 250 {
            Self::Fast
        } else if interval_ms <= 2_000 {
            Self::Second
        } else {
            Self::Slow
        }
    }
}

/// One goal of issue 13 on one half, source and path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GoalCheck {
    pub goal: &'static str,
    /// The workloads the goal speaks of here.
    pub checked: Vec<String>,
    /// Those that fail it, with why.
    pub failing: Vec<String>,
    /// Those the recording cannot decide (it ended before the goal's deadline without a
    /// `leak` verdict).
    pub undecided: Vec<String>,
    /// `None`: nothing to check here.
    pub pass: Option<bool>,
}

impl GoalCheck {
    /// `goal`, nothing checked yet.
    fn new(goal: &'static str) -> Self {
        Self {
            goal,
            checked: Vec::new(),
            failing: Vec::new(),
            undecided: Vec::new(),
            pass: None,
        }
    }
}

/// A delay goal: each leak `pick` selects is flagged within `limit_sec` of `from`.
struct DelayGoal {
    goal: &'static str,
    applies: fn(IntervalClass) -> bool,
    pick: fn(&Outcome) -> bool,
    from_process_start: bool,
    limit_sec: f64,
}

const DELAY_GOALS: [DelayGoal; 4] = [
    DelayGoal {
        goal: "leaks >= 10 MB/s from the first step flagged within 60 s of the process start (100 ms)",
        applies: |c| c == IntervalClass::Fast,
        pick: |o| o.first_step && o.rate_mb_s.is_some_and(|r| r >= 10.0),
        from_process_start: true,
        limit_sec: 60.0,
    },
    DelayGoal {
        goal: "leaks >= 10 MB/s from the first step flagged within 90 s of the process start (1 s log)",
        applies: |c| c == IntervalClass::Second,
        pick: |o| o.first_step && o.rate_mb_s.is_some_and(|r| r >= 10.0),
        from_process_start: true,
        limit_sec: 90.0,
    },
    DelayGoal {
        goal: "leaks >= 2 MB/s flagged within 5 min of their start (every interval)",
        applies: |_| true,
        pick: |o| o.rate_mb_s.is_some_and(|r| r >= 2.0),
        from_process_start: false,
        limit_sec: 300.0,
    },
    DelayGoal {
        goal: "leaks that begin after a plateau flagged within 30 s of their start (100 ms, 1 s)",
        applies: |c| c != IntervalClass::Slow,
        pick: |o| !o.first_step,
        from_process_start: false,
        limit_sec: 30.0,
    },
];

/// The goal about false alarms.
pub const NO_FALSE_ALARM: &str = "no false alarm on any workload (every interval)";
/// Issue 35: a leak's verdict stays `leak` once said.
pub const NO_FLIP: &str = "no flip from `leak` after a leak's first `leak` (every interval)";
/// Issue 35: the median delay of the fast leaks at 100 ms.
pub const FAST_MEDIAN: &str = "median delay <= 30 s from their start for leaks >= 10 MB/s (100 ms)";
const FAST_MEDIAN_LIMIT_SEC: f64 = 30.0;

/// The goals of issue 13 that apply at `interval` on `outcomes` (one half, source and
/// path).
pub fn goals(interval: IntervalClass, outcomes: &[&Outcome]) -> Vec<GoalCheck> {
    let mut out = Vec::new();
    for g in &DELAY_GOALS {
        if !(g.applies)(interval) {
            continue;
        }
        let mut check = GoalCheck::new(g.goal);
        for o in outcomes
            .iter()
            .filter(|o| o.truth == Truth::Leak && o.class != Class::Absent && (g.pick)(o))
        {
            check.checked.push(o.role.clone());
            let delay = if g.from_process_start {
                o.delay_from_process_start_sec
            } else {
                o.delay_from_leak_start_sec
            };
            let origin = if g.from_process_start {
                o.start_ms
            } else {
                o.leak_start_ms
            };
            match (o.class, delay) {
                (Class::FalseAlarm, _) => check.failing.push(format!("{}: false alarm", o.role)),
                (Class::Found, Some(d)) if d <= g.limit_sec => {}
                (Class::Found, Some(d)) => check.failing.push(format!("{}: {d:.1} s", o.role)),
                _ => {
                    // Never flagged: a failure only if the recording went on past the
                    // deadline.
                    let seen_sec = o.last_ms.zip(origin).map(|(l, s)| (l - s) as f64 / 1000.0);
                    match seen_sec {
                        Some(s) if s < g.limit_sec => check
                            .undecided
                            .push(format!("{}: recording ends after {s:.0} s", o.role)),
                        _ => check.failing.push(format!("{}: not flagged", o.role)),
                    }
                }
            }
        }
        if !check.checked.is_empty() {
            check.pass = Some(check.failing.is_empty() && check.undecided.is_empty());
        }
        out.push(check);
    }
    out.push(no_flip(outcomes));
    if interval == IntervalClass::Fast {
        out.push(fast_median(outcomes));
    }
    let mut fa = GoalCheck::new(NO_FALSE_ALARM);
    for o in outcomes.iter().filter(|o| o.class != Class::Absent) {
        fa.checked.push(o.role.clone());
        if o.class == Class::FalseAlarm {
            let at = o
                .first_leak_ms
                .zip(o.start_ms)
                .map_or_else(String::new, |(t, s)| {
                    format!(" at {:+.1} s", (t - s) as f64 / 1000.0)
                });
            fa.failing.push(format!("{}{at}", o.role));
        }
    }
    if !fa.checked.is_empty() {
        fa.pass = Some(fa.failing.is_empty());
    }
    out.push(fa);
    out
}

/// Issue 35: no leak goes back from `leak` while it runs.
fn no_flip(outcomes: &[&Outcome]) -> GoalCheck {
    let mut check = GoalCheck::new(NO_FLIP);
    for o in outcomes
        .iter()
        .filter(|o| o.truth == Truth::Leak && o.first_leak_ms.is_some())
    {
        check.checked.push(o.role.clone());
        if !o.flips.is_empty() {
            let at: Vec<String> = o
                .flips
                .iter()
                .map(|f| match o.start_ms {
                    Some(s) => format!(
                        "{} at {:+.1} s",
                        f.to.as_str(),
                        (f.t_ms - s) as f64 / 1000.0
                    ),
                    None => f.to.as_str().to_owned(),
                })
                .collect();
            check.failing.push(format!(
                "{}: {} flips ({})",
                o.role,
                o.flips.len(),
                at.join(", ")
            ));
        }
    }
    if !check.checked.is_empty() {
        check.pass = Some(check.failing.is_empty());
    }
    check
}

/// Issue 35: the median delay from the leak's start of the leaks of >= 10 MB/s, a leak
/// never flagged counting as failing (its delay is unbounded).
fn fast_median(outcomes: &[&Outcome]) -> GoalCheck {
    let mut check = GoalCheck::new(FAST_MEDIAN);
    let fast: Vec<&&Outcome> = outcomes
        .iter()
        .filter(|o| {
            o.truth == Truth::Leak
                && o.class != Class::Absent
                && o.rate_mb_s.is_some_and(|r| r >= 10.0)
        })
        .collect();
    let mut delays = Vec::new();
    for o in &fast {
        check.checked.push(o.role.clone());
        match (o.class, o.delay_from_leak_start_sec) {
            (Class::Found, Some(d)) => delays.push(d),
            (Class::FalseAlarm, _) => check.failing.push(format!("{}: false alarm", o.role)),
            _ => check.failing.push(format!("{}: not flagged", o.role)),
        }
    }
    if let Some(m) = median(&mut delays).filter(|m| *m > FAST_MEDIAN_LIMIT_SEC) {
        check.failing.push(format!("median {m:.1} s"));
    }
    if !check.checked.is_empty() {
        check.pass = Some(check.failing.is_empty());
    }
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(role: &str, truth: Truth, leak_start_ms: Option<i64>, rate: Option<f64>) -> Workload {
        Workload {
            pid: 0,
            role: role.to_owned(),
            half: Half::Tune,
            mechanism: None,
            truth,
            rate_mb_s: rate,
            start_ms: Some(0),
            leak_start_ms,
            first_step: leak_start_ms == Some(1_000),
            idle_start_ms: (truth == Truth::Idle).then_some(2_000),
            end_ms: Some(600_000),
            end_reason: None,
            notes: Vec::new(),
        }
    }

    fn change(t_ms: i64, verdict: Verdict) -> Change {
        Change {
            t_ms,
            verdict,
            rule: None,
            checks: serde_json::Value::Null,
            explanation: String::new(),
        }
    }

    fn timelines(
        pid: u32,
        last_ms: i64,
        changes: &[(i64, Verdict)],
    ) -> BTreeMap<SeriesId, Timeline> {
        let mut m = BTreeMap::new();
        m.insert(
            SeriesId {
                gpu_uuid: "GPU-a".into(),
                pid,
                start_time_ticks: None,
            },
            Timeline {
                first_ms: 0,
                last_ms,
                changes: changes.iter().map(|&(t, v)| change(t, v)).collect(),
                last_report: None,
            },
        );
        m
    }

    #[test]
    fn classes_and_delays_from_hand_made_timelines() {
        use Verdict::*;
        // A first-step leak found 41 s after its start, 42 s after the process's.
        let leak = w("a", Truth::Leak, Some(1_000), Some(20.0));
        let o = outcome(
            &leak,
            &timelines(0, 600_000, &[(100, Growing), (42_000, Leak)]),
        );
        assert_eq!(o.class, Class::Found);
        assert_eq!(o.delay_from_leak_start_sec, Some(41.0));
        assert_eq!(o.delay_from_process_start_sec, Some(42.0));
        // A late leak called one before it began: a false alarm, whatever came after.
        let late = w("b", Truth::Leak, Some(90_000), Some(30.0));
        let o = outcome(
            &late,
            &timelines(
                0,
                600_000,
                &[(30_000, Leak), (60_000, Stable), (95_000, Leak)],
            ),
        );
        assert_eq!(o.class, Class::FalseAlarm);
        assert_eq!(o.found_ms, Some(95_000));
        // A not-leak called a leak once, and an idle holder found 60 s after idle start.
        let nl = w("c", Truth::NotLeak, None, None);
        assert_eq!(
            outcome(
                &nl,
                &timelines(0, 600_000, &[(10, Growing), (5_000, Leak), (9_000, Stable)])
            )
            .class,
            Class::FalseAlarm
        );
        let idle = w("d", Truth::Idle, None, None);
        let o = outcome(
            &idle,
            &timelines(0, 600_000, &[(10, Stable), (62_000, IdleHolder)]),
        );
        assert_eq!((o.class, o.idle_delay_sec), (Class::Quiet, Some(60.0)));
        // A workload whose PID has no series.
        assert_eq!(
            outcome(&nl, &timelines(9, 600_000, &[])).class,
            Class::Absent
        );
        // A leak never flagged.
        assert_eq!(
            outcome(&leak, &timelines(0, 600_000, &[(100, Growing)])).class,
            Class::Missed
        );
    }

    #[test]
    fn summary_counts_precision_recall_and_delays() {
        use Verdict::*;
        let leaks = [
            w("a", Truth::Leak, Some(1_000), Some(20.0)),
            w("b", Truth::Leak, Some(1_000), Some(20.0)),
            w("c", Truth::Leak, Some(1_000), Some(20.0)),
        ];
        let outcomes = [
            outcome(&leaks[0], &timelines(0, 600_000, &[(11_000, Leak)])),
            outcome(&leaks[1], &timelines(0, 600_000, &[(31_000, Leak)])),
            outcome(&leaks[2], &timelines(0, 600_000, &[(5_000, Growing)])),
            outcome(
                &w("d", Truth::NotLeak, None, None),
                &timelines(0, 600_000, &[(7_000, Leak)]),
            ),
        ];
        let refs: Vec<&Outcome> = outcomes.iter().collect();
        let s = summary(Half::Tune, "100ms", "batch", &refs);
        assert_eq!((s.found, s.missed, s.false_alarms, s.leaks), (2, 1, 1, 3));
        assert_eq!(s.precision, 2.0 / 3.0);
        assert_eq!(s.recall, 2.0 / 3.0);
        assert_eq!(
            (s.delay_min_sec, s.delay_median_sec, s.delay_max_sec),
            (Some(10.0), Some(20.0), Some(30.0))
        );
        let g = goals(IntervalClass::Fast, &refs);
        let first = &g[0];
        assert_eq!(first.checked, vec!["a", "b", "c"]);
        assert_eq!(first.failing, vec!["c: not flagged"]);
        assert_eq!(first.pass, Some(false));
        assert_eq!(g.last().unwrap().failing, vec!["d at +7.0 s"]);
    }

    #[test]
    fn flips_count_each_change_away_from_leak_and_fail_the_goal() {
        use Verdict::*;
        let leak = w("a", Truth::Leak, Some(1_000), Some(20.0));
        let steady = w("b", Truth::Leak, Some(1_000), Some(20.0));
        let o = outcome(
            &leak,
            &timelines(
                0,
                600_000,
                &[
                    (100, Growing),
                    (20_000, Leak),
                    (30_000, Growing),
                    (40_000, Leak),
                    (50_000, Stable),
                ],
            ),
        );
        assert_eq!(
            o.flips,
            vec![
                Flip {
                    t_ms: 30_000,
                    to: Growing
                },
                Flip {
                    t_ms: 50_000,
                    to: Stable
                }
            ]
        );
        let p = outcome(
            &steady,
            &timelines(0, 600_000, &[(100, Growing), (25_000, Leak)]),
        );
        assert!(p.flips.is_empty());
        // A not-leak's flips are part of its false alarm, not of the flip count.
        let nl = outcome(
            &w("c", Truth::NotLeak, None, None),
            &timelines(0, 600_000, &[(5_000, Leak), (9_000, Stable)]),
        );
        let refs = [&o, &p, &nl];
        let s = summary(Half::Tune, "100ms", "batch", &refs);
        assert_eq!(
            (s.flips, s.flipped_roles.clone()),
            (2, vec!["a".to_owned()])
        );
        let g = goals(IntervalClass::Slow, &refs);
        let flip = g.iter().find(|g| g.goal == NO_FLIP).unwrap();
        assert_eq!(flip.checked, vec!["a", "b"]);
        assert_eq!(
            flip.failing,
            vec!["a: 2 flips (growing at +30.0 s, stable at +50.0 s)"]
        );
        assert_eq!(flip.pass, Some(false));
        // The median goal is a 100 ms goal only.
        assert!(g.iter().all(|g| g.goal != FAST_MEDIAN));
    }

    #[test]
    fn the_fast_median_goal_takes_the_median_of_the_leaks_of_10_mb_s_and_more() {
        use Verdict::*;
        let leak = |role: &str, rate: f64| w(role, Truth::Leak, Some(1_000), Some(rate));
        let found = |role: &str, rate: f64, at_ms: i64| {
            outcome(&leak(role, rate), &timelines(0, 600_000, &[(at_ms, Leak)]))
        };
        // 11, 31 and 41 s: median 31 s, over the goal; the 2 MB/s leak is not counted.
        let slow = found("a", 20.0, 32_000);
        let list = [
            found("f", 20.0, 12_000),
            slow.clone(),
            found("g", 500.0, 42_000),
            found("s", 2.0, 300_000),
        ];
        let refs: Vec<&Outcome> = list.iter().collect();
        let g = goals(IntervalClass::Fast, &refs);
        let m = g.iter().find(|g| g.goal == FAST_MEDIAN).unwrap();
        assert_eq!(m.checked, vec!["f", "a", "g"]);
        assert_eq!(m.failing, vec!["median 31.0 s"]);
        // 11, 21 and 41 s: median 21 s, met.
        let list = [
            found("f", 20.0, 12_000),
            found("a", 20.0, 22_000),
            found("g", 500.0, 42_000),
        ];
        let refs: Vec<&Outcome> = list.iter().collect();
        let g = goals(IntervalClass::Fast, &refs);
        assert_eq!(
            g.iter().find(|g| g.goal == FAST_MEDIAN).unwrap().pass,
            Some(true)
        );
        // A leak never flagged fails it, whatever the median of the others.
        let missed = outcome(&leak("m", 50.0), &timelines(0, 600_000, &[(100, Growing)]));
        let g = goals(IntervalClass::Fast, &[&list[0], &missed]);
        let m = g.iter().find(|g| g.goal == FAST_MEDIAN).unwrap();
        assert_eq!(m.failing, vec!["m: not flagged"]);
    }

    #[test]
    fn a_recording_too_short_for_a_deadline_is_undecided() {
        use Verdict::*;
        let leak = w("a", Truth::Leak, Some(1_000), Some(20.0));
        let o = outcome(&leak, &timelines(0, 40_000, &[(100, Growing)]));
        let g = goals(IntervalClass::Fast, &[&o]);
        assert_eq!(g[0].undecided, vec!["a: recording ends after 40 s"]);
        assert_eq!(g[0].pass, Some(false));
    }
}
