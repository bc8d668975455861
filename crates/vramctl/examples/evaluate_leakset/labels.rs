//! The ground truth of a labeled recording: `labels.jsonl`, as the workloads of
//! `scripts/workloads/` write it (`common.py`'s `label()`).
//!
//! One JSON object per line: `{"t": unix seconds, "pid", "role", "event", …}`. Events:
//! - `start`: the workload began (after `import torch`, before its first CUDA allocation).
//!   The leak set of issue 13 (`leakset.py`) adds `half` (`tune` or `holdout`),
//!   `mechanism`, `leaks` (bool), `rate_mb_s` (the rate it aims at, or null), `idle`
//!   (bool) and, for a leak that begins late, `leak_after_s`;
//! - `leak_start`: from here on it leaks (`at`: `first step` or `after N s`);
//! - `idle_start`: from here on it holds memory without using the GPU;
//! - `paced`: a paced leak measured what one step keeps (`aimed_mb_s`: the rate it aims
//!   at once its step period is clamped to what it can do);
//! - `end`: it finished (`reason`: `done`, or `oom-cap` when a leak reached the memory cap
//!   that stands in for the GPU running out).
//!
//! Other events are kept as notes. Labels without `half` (the first H200 set,
//! `testdata/h200/labels.jsonl`, which today's thresholds were developed on) are in the
//! half [`Half::Dev`].

use std::collections::BTreeMap;

use anyhow::{Context, anyhow, bail};
use serde::Serialize;
use serde_json::Value;

/// Which half of a labeled set a workload belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Half {
    /// May be used to choose thresholds.
    Tune,
    /// Only reports: never used to choose a threshold.
    Holdout,
    /// A set without halves: the recordings today's analysis was developed on.
    Dev,
}

impl Half {
    /// The name in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tune => "tune",
            Self::Holdout => "holdout",
            Self::Dev => "dev",
        }
    }
}

/// `--half`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HalfArg {
    /// The tune half and the workloads without a half.
    Tune,
    /// The holdout half only.
    Holdout,
    /// Every workload.
    All,
}

impl HalfArg {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tune => "tune",
            Self::Holdout => "holdout",
            Self::All => "all",
        }
    }

    /// Whether a workload of `half` is scored.
    pub fn keeps(self, half: Half) -> bool {
        match self {
            Self::Tune => matches!(half, Half::Tune | Half::Dev),
            Self::Holdout => half == Half::Holdout,
            Self::All => true,
        }
    }
}

/// What a workload really does, for the leak question.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Truth {
    /// It leaks from `leak_start_ms` on.
    Leak,
    /// It holds memory idle from `idle_start_ms` on (and does not leak).
    Idle,
    /// Whatever it does, it does not leak.
    NotLeak,
}

impl Truth {
    /// The name in tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Leak => "leak",
            Self::Idle => "idle",
            Self::NotLeak => "not-leak",
        }
    }
}

/// One labeled workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Workload {
    /// PID as the driver saw it.
    pub pid: u32,
    /// The workload's name (`total-loss`, `dyn-pareto`, …).
    pub role: String,
    pub half: Half,
    pub mechanism: Option<String>,
    pub truth: Truth,
    /// MB/s (10^6 bytes) the leak aims at: the `paced` event's `aimed_mb_s` where there is
    /// one (the step period may have been clamped), else `start`'s `rate_mb_s`.
    pub rate_mb_s: Option<f64>,
    /// `start` (ms since the epoch).
    pub start_ms: Option<i64>,
    pub leak_start_ms: Option<i64>,
    /// The leak begins at the first step (not after a plateau).
    pub first_step: bool,
    pub idle_start_ms: Option<i64>,
    pub end_ms: Option<i64>,
    pub end_reason: Option<String>,
    /// Why the truth differs from what `start` announced (e.g. a late leak whose
    /// recording ended before it began).
    pub notes: Vec<String>,
}

/// A leak labeled to begin this close to the workload's start begins at its first step
/// (for labels without `at`: the first H200 set's leaks begin 30–60 s in).
const FIRST_STEP_WITHIN_MS: i64 = 5_000;

/// One label line: its event, its time (ms) and the whole object.
type Event = (String, i64, Value);

/// A leak that ran for less than this before its workload ended did not happen in the
/// recording (a late leak in a run shorter than its plateau).
const LEAK_SEEN_FOR_MS: i64 = 1_000;

/// Reads `labels.jsonl`: one workload per (PID, role), by half, leaks first, then by role.
///
/// # Errors
/// A line that is not a JSON object with `t`, `pid`, `role` and `event`, naming its line.
pub fn parse(text: &str) -> anyhow::Result<Vec<Workload>> {
    let mut order: Vec<(u32, String)> = Vec::new();
    let mut events: BTreeMap<(u32, String), Vec<Event>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value =
            serde_json::from_str(line).with_context(|| format!("line {line_no}: not JSON"))?;
        let field = |name: &str| {
            v.get(name)
                .ok_or_else(|| anyhow!("line {line_no}: no '{name}'"))
        };
        let t_s = field("t")?
            .as_f64()
            .ok_or_else(|| anyhow!("line {line_no}: 't' is not a number"))?;
        let pid = field("pid")?
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| anyhow!("line {line_no}: 'pid' is not a PID"))?;
        let role = field("role")?
            .as_str()
            .ok_or_else(|| anyhow!("line {line_no}: 'role' is not a string"))?
            .to_owned();
        let event = field("event")?
            .as_str()
            .ok_or_else(|| anyhow!("line {line_no}: 'event' is not a string"))?
            .to_owned();
        #[allow(clippy::cast_possible_truncation)]
        let t_ms = (t_s * 1000.0).round() as i64;
        let key = (pid, role);
        if !events.contains_key(&key) {
            order.push(key.clone());
        }
        events.entry(key).or_default().push((event, t_ms, v));
    }
    let mut out = Vec::with_capacity(order.len());
    for key in order {
        let Some(list) = events.remove(&key) else {
            continue;
        };
        out.push(workload(key.0, key.1, &list)?);
    }
    if out.is_empty() {
        bail!("no labels");
    }
    // Halves together, leaks first, then by name.
    let rank = |t: Truth| match t {
        Truth::Leak => 0,
        Truth::NotLeak => 1,
        Truth::Idle => 2,
    };
    out.sort_by(|a, b| (a.half, rank(a.truth), &a.role).cmp(&(b.half, rank(b.truth), &b.role)));
    Ok(out)
}

fn workload(pid: u32, role: String, events: &[Event]) -> anyhow::Result<Workload> {
    let first = |name: &str| events.iter().find(|e| e.0 == name);
    let start = first("start");
    let start_field = |name: &str| start.and_then(|s| s.2.get(name));
    let half = match start_field("half").and_then(Value::as_str) {
        Some("tune") => Half::Tune,
        Some("holdout") => Half::Holdout,
        Some(other) => bail!("'{role}': unknown half '{other}'"),
        None => Half::Dev,
    };
    let leak_start = first("leak_start");
    let idle_start = first("idle_start");
    let end = first("end");
    let announced_leak = start_field("leaks")
        .and_then(Value::as_bool)
        .unwrap_or(leak_start.is_some());
    let announced_idle = start_field("idle")
        .and_then(Value::as_bool)
        .unwrap_or(idle_start.is_some());
    let mut notes = Vec::new();
    let end_ms = end.map(|e| e.1);
    let leak_start_ms = leak_start.map(|e| e.1);
    let truth = if announced_leak {
        match (leak_start_ms, end_ms) {
            (None, _) => {
                notes.push("announced a leak that never started".to_owned());
                Truth::NotLeak
            }
            // A late leak whose workload was stopped as it began (a short run).
            (Some(l), Some(e)) if e - l < LEAK_SEEN_FOR_MS => {
                notes.push("its leak would have begun as the run ended".to_owned());
                Truth::NotLeak
            }
            _ => Truth::Leak,
        }
    } else if announced_idle {
        Truth::Idle
    } else {
        Truth::NotLeak
    };
    let rate_mb_s = first("paced")
        .and_then(|p| p.2.get("aimed_mb_s"))
        .and_then(Value::as_f64)
        .or_else(|| start_field("rate_mb_s").and_then(Value::as_f64));
    let first_step = match (leak_start, start) {
        (Some(l), _) if l.2.get("at").and_then(Value::as_str).is_some() => {
            l.2.get("at").and_then(Value::as_str) == Some("first step")
        }
        (Some(l), Some(s)) => l.1 - s.1 <= FIRST_STEP_WITHIN_MS,
        _ => false,
    };
    Ok(Workload {
        pid,
        half,
        mechanism: start_field("mechanism")
            .and_then(Value::as_str)
            .map(str::to_owned),
        truth,
        rate_mb_s: (truth == Truth::Leak).then_some(rate_mb_s).flatten(),
        start_ms: start.map(|s| s.1),
        leak_start_ms: (truth == Truth::Leak).then_some(leak_start_ms).flatten(),
        first_step: truth == Truth::Leak && first_step,
        idle_start_ms: idle_start.map(|e| e.1),
        end_ms,
        end_reason: end
            .and_then(|e| e.2.get("reason"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        notes,
        role,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leakset_labels_give_halves_rates_and_first_steps() {
        let text = r#"{"t": 100.0, "pid": 7, "role": "total-loss", "event": "start", "half": "tune", "mechanism": "m", "leaks": true, "rate_mb_s": 20}
{"t": 101.5, "pid": 7, "role": "total-loss", "event": "leak_start", "at": "first step"}
{"t": 102.0, "pid": 7, "role": "total-loss", "event": "paced", "aimed_mb_s": 18.5}
{"t": 100.0, "pid": 8, "role": "late", "event": "start", "half": "holdout", "leaks": true, "rate_mb_s": 30, "leak_after_s": 90}
{"t": 140.0, "pid": 8, "role": "late", "event": "leak_start", "at": "after 90 s"}
{"t": 140.0, "pid": 8, "role": "late", "event": "end", "reason": "done"}
{"t": 100.0, "pid": 9, "role": "idle", "event": "start", "half": "holdout", "leaks": false, "idle": true}
{"t": 103.0, "pid": 9, "role": "idle", "event": "idle_start"}
{"t": 150.0, "pid": 7, "role": "total-loss", "event": "end", "reason": "oom-cap"}
"#;
        let w = parse(text).unwrap();
        assert_eq!(w.len(), 3);
        let w: Vec<&Workload> = ["total-loss", "late", "idle"]
            .iter()
            .map(|r| w.iter().find(|w| w.role == *r).unwrap())
            .collect();
        assert_eq!(w[0].role, "total-loss");
        assert_eq!(w[0].half, Half::Tune);
        assert_eq!(w[0].truth, Truth::Leak);
        assert_eq!(w[0].rate_mb_s, Some(18.5));
        assert_eq!(w[0].leak_start_ms, Some(101_500));
        assert!(w[0].first_step);
        assert_eq!(w[0].end_reason.as_deref(), Some("oom-cap"));
        // A late leak cut off by the end of the run is not a leak of this recording.
        assert_eq!(w[1].truth, Truth::NotLeak);
        assert_eq!(w[1].leak_start_ms, None);
        assert_eq!(w[1].notes.len(), 1);
        assert_eq!(w[2].truth, Truth::Idle);
        assert_eq!(w[2].idle_start_ms, Some(103_000));
    }

    #[test]
    fn labels_without_halves_are_the_development_set() {
        let text = r#"{"t": 10.0, "pid": 1, "role": "leak-graph", "event": "start"}
{"t": 55.0, "pid": 1, "role": "leak-graph", "event": "leak_start"}
{"t": 10.0, "pid": 2, "role": "steady", "event": "start"}
"#;
        let w = parse(text).unwrap();
        assert_eq!(
            (w[0].role.as_str(), w[1].role.as_str()),
            ("leak-graph", "steady")
        );
        assert_eq!(w[0].half, Half::Dev);
        assert_eq!(w[0].truth, Truth::Leak);
        assert!(!w[0].first_step, "45 s after the start is after a plateau");
        assert_eq!(w[1].truth, Truth::NotLeak);
    }

    #[test]
    fn a_bad_line_is_named() {
        let err = parse("{\"t\": 1, \"pid\": 1, \"role\": \"x\"}\n").unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
    }
}
