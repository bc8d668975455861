//! One labeled set on every source and path: timelines, scores, goals, and whether the
//! live path says what the batch path says on the same samples.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use serde::Serialize;
use vramctl_leaks::analysis::{LeakConfig, Verdict};

use super::batch::Vramctl;
use super::labels::{Half, HalfArg, Workload};
use super::live::{self, Change, LiveCadence, SeriesId, Timeline};
use super::score::{self, GoalCheck, IntervalClass, Outcome, Summary};
use super::sources::{Source, Workspace};

/// The path names, in report order.
pub const BATCH: &str = "batch";

/// How the evaluation runs.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// The half scored (`--half`).
    pub half: HalfArg,
    /// Labeled workloads of the other half(s), whose series were dropped unseen.
    pub hidden_workloads: usize,
    /// `--idle-for` of every path (the recordings are minutes long).
    pub idle_for: String,
    /// Batch verdicts are taken at the first tick at or after every multiple of this
    /// (and at the last tick): what `vramctl leaks` run that often would have said.
    pub batch_every_ms: i64,
    /// Check the live verdicts against batch runs on the same samples.
    pub equality: bool,
    /// The live cadences run.
    pub live: Vec<LiveCadence>,
}

/// A series no label names, as one path judged it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unlabeled {
    pub series: SeriesId,
    pub first_leak_ms: Option<i64>,
    pub final_change: Option<Change>,
}

/// A live verdict that a batch run over the same samples does not give.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mismatch {
    pub path: String,
    pub series: SeriesId,
    pub role: Option<String>,
    /// The samples both judged end here.
    pub t_ms: i64,
    pub live: Change,
    /// `None`: the batch run has no such series.
    pub batch: Option<Change>,
}

/// A series whose last live verdict is not the batch verdict over the whole recording.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FinalDiff {
    pub path: String,
    pub series: SeriesId,
    pub role: Option<String>,
    pub live: Option<Change>,
    /// When the live path last analysed the series.
    pub live_analysed_ms: Option<i64>,
    pub batch: Option<Change>,
    /// The batch verdict over the samples up to `live_analysed_ms`, when checked: equal to
    /// the live one means the difference is the live path's schedule (a verdict that
    /// changed after its last analysis, e.g. as the process ended), not the analysis.
    pub batch_at_live_time: Option<Verdict>,
}

/// The goals of one half on one path.
#[derive(Debug, Clone, Serialize)]
pub struct Goals {
    pub half: Half,
    pub path: String,
    pub checks: Vec<GoalCheck>,
}

/// Everything about one source.
#[derive(Debug, Clone, Serialize)]
pub struct SourceReport {
    pub name: String,
    pub what: String,
    /// Ticks that listed processes.
    pub ticks: usize,
    /// Median time between them.
    pub interval_ms: i64,
    pub interval_class: IntervalClass,
    pub batch_runs: usize,
    /// Per path: every labeled workload.
    pub outcomes: BTreeMap<String, Vec<Outcome>>,
    /// Per path: the series no label names.
    pub unlabeled: BTreeMap<String, Vec<Unlabeled>>,
    pub summaries: Vec<Summary>,
    /// Per half and path.
    pub goals: Vec<Goals>,
    /// Live verdicts checked against batch runs on the same samples, and those that
    /// differed.
    pub same_samples_checked: usize,
    pub same_samples_mismatches: Vec<Mismatch>,
    pub final_differences: Vec<FinalDiff>,
}

/// The report on one labeled set.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: u32,
    pub settings: Settings,
    pub notes: Vec<String>,
    pub workloads: Vec<Workload>,
    pub sources: Vec<SourceReport>,
}

/// Whether `id` is the series of a workload left out of this evaluation (same PID,
/// overlapping its labeled life).
fn hidden_series(hidden: &[Workload], id: &SeriesId) -> bool {
    hidden.iter().any(|w| w.pid == id.pid)
}

/// Removes the series of the workloads left out (`--half`) from `timelines`.
fn drop_hidden(hidden: &[Workload], timelines: &mut BTreeMap<SeriesId, Timeline>) {
    timelines.retain(|id, _| !hidden_series(hidden, id));
}

/// The halves present in `workloads`, in order.
fn halves(workloads: &[Workload]) -> Vec<Half> {
    let set: BTreeSet<Half> = workloads.iter().map(|w| w.half).collect();
    set.into_iter().collect()
}

/// The first tick at or after each multiple of `every_ms` from the first, and the last.
pub fn cutoffs(times: &[i64], every_ms: i64) -> Vec<i64> {
    let mut out = Vec::new();
    let Some(&origin) = times.first() else {
        return out;
    };
    let mut next = i64::MIN;
    for &t in times {
        if t >= next {
            out.push(t);
            next = origin + ((t - origin) / every_ms.max(1) + 1) * every_ms.max(1);
        }
    }
    if let Some(&last) = times.last() {
        if out.last() != Some(&last) {
            out.push(last);
        }
    }
    out
}

/// Scores `workloads` on every source.
///
/// # Errors
/// When a source cannot be read or `vramctl leaks` fails.
// The scorer's one entry point: each argument is a separate input of the run (the
// scored and the hidden half among them), and a struct would only rename them.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    workloads: &[Workload],
    hidden: &[Workload],
    sources: &[Source],
    ws: &Workspace,
    vramctl: &Vramctl,
    settings: &Settings,
    cfg: &LeakConfig,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<Vec<SourceReport>> {
    let mut out = Vec::new();
    for source in sources {
        progress(&format!("{}: {}", source.name, source.what));
        out.push(
            evaluate_source(
                workloads,
                hidden,
                source,
                ws,
                vramctl,
                settings,
                cfg,
                &mut progress,
            )
            .with_context(|| format!("source '{}'", source.name))?,
        );
    }
    Ok(out)
}

#[allow(clippy::too_many_lines)]
#[allow(clippy::too_many_arguments)]
fn evaluate_source(
    workloads: &[Workload],
    hidden: &[Workload],
    source: &Source,
    ws: &Workspace,
    vramctl: &Vramctl,
    settings: &Settings,
    cfg: &LeakConfig,
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<SourceReport> {
    let mut rec = ws.recording(&source.input)?;
    let mut times = Vec::new();
    rec.ticks(|_, tick| {
        if tick.devices.iter().any(|d| d.observed_processes) {
            times.push(tick.t_ms);
        }
    })?;
    let mut gaps: Vec<f64> = times.windows(2).map(|w| (w[1] - w[0]) as f64).collect();
    #[allow(clippy::cast_possible_truncation)]
    let interval_ms = score::median(&mut gaps).map_or(0, |m| m.round() as i64);

    let mut paths: BTreeMap<String, BTreeMap<SeriesId, Timeline>> = BTreeMap::new();
    for &cadence in &settings.live {
        progress(&format!("  live ({})", cadence.name()));
        paths.insert(
            cadence.name().to_owned(),
            live::run(&mut rec, cfg, cadence)?,
        );
    }
    let cuts = cutoffs(&times, settings.batch_every_ms);
    progress(&format!("  batch: {} runs of vramctl leaks", cuts.len()));
    let mut batch = vramctl.timelines(&source.input, &cuts)?;
    let mut batch_runs = cuts.len();
    // The other half's series: dropped before anything looks at them.
    for timelines in paths.values_mut().chain(std::iter::once(&mut batch)) {
        drop_hidden(hidden, timelines);
    }

    // Who each series is.
    let mut role_of: BTreeMap<SeriesId, String> = BTreeMap::new();
    for timelines in paths.values().chain(std::iter::once(&batch)) {
        for w in workloads {
            if let Some((id, _)) = score::series_of(w, timelines) {
                role_of.insert(id.clone(), w.role.clone());
            }
        }
    }

    // Live = batch on the same samples: every live verdict (each change and the last
    // report) against `vramctl leaks --until` the time of its last sample.
    let mut same_samples_checked = 0;
    let mut mismatches = Vec::new();
    let mut batch_at: BTreeMap<(SeriesId, i64), Option<Change>> = BTreeMap::new();
    if settings.equality {
        let mut wanted: BTreeMap<i64, Vec<(String, SeriesId, Change)>> = BTreeMap::new();
        for (path, timelines) in &paths {
            for (id, t) in timelines {
                let mut said: Vec<Change> = t.changes.clone();
                if let Some(r) = &t.last_report {
                    said.push(Change::of(r));
                }
                for c in said {
                    wanted
                        .entry(c.t_ms)
                        .or_default()
                        .push((path.clone(), id.clone(), c));
                }
            }
        }
        progress(&format!(
            "  live = batch: {} runs of vramctl leaks",
            wanted.len()
        ));
        for (t, list) in wanted {
            let mut findings = vramctl.findings(&source.input, Some(t))?;
            findings.retain(|f| !hidden_series(hidden, &f.id));
            batch_runs += 1;
            for (path, id, live) in list {
                let batch = findings
                    .iter()
                    .find(|f| f.id == id)
                    .map(|f| f.change.clone());
                same_samples_checked += 1;
                let same = batch
                    .as_ref()
                    .is_some_and(|b| b.verdict == live.verdict && b.rule == live.rule);
                batch_at.insert((id.clone(), t), batch.clone());
                if !same {
                    mismatches.push(Mismatch {
                        path,
                        role: role_of.get(&id).cloned(),
                        series: id,
                        t_ms: t,
                        live,
                        batch,
                    });
                }
            }
        }
    }

    // Final verdicts: the last live verdict against the batch verdict over everything.
    let mut final_differences = Vec::new();
    for (path, timelines) in &paths {
        let ids: BTreeSet<&SeriesId> = timelines.keys().chain(batch.keys()).collect();
        for id in ids {
            let live_t = timelines.get(id);
            let live = live_t.and_then(|t| {
                t.last_report
                    .as_ref()
                    .map(Change::of)
                    .or_else(|| t.final_change().cloned())
            });
            let b = batch.get(id).and_then(|t| t.final_change().cloned());
            if live.as_ref().map(|c| c.verdict) == b.as_ref().map(|c| c.verdict) {
                continue;
            }
            let live_analysed_ms = live.as_ref().map(|c| c.t_ms);
            final_differences.push(FinalDiff {
                path: path.clone(),
                series: id.clone(),
                role: role_of.get(id).cloned(),
                batch_at_live_time: live_analysed_ms
                    .and_then(|t| batch_at.get(&(id.clone(), t)).cloned().flatten())
                    .map(|c| c.verdict),
                live_analysed_ms,
                live,
                batch: b,
            });
        }
    }
    paths.insert(BATCH.to_owned(), batch);

    let interval_class = IntervalClass::of(interval_ms);
    let mut outcomes: BTreeMap<String, Vec<Outcome>> = BTreeMap::new();
    let mut unlabeled: BTreeMap<String, Vec<Unlabeled>> = BTreeMap::new();
    for (path, timelines) in &paths {
        let list: Vec<Outcome> = workloads
            .iter()
            .map(|w| score::outcome(w, timelines))
            .collect();
        let named: BTreeSet<&SeriesId> = list.iter().filter_map(|o| o.series.as_ref()).collect();
        unlabeled.insert(
            path.clone(),
            timelines
                .iter()
                .filter(|(id, _)| !named.contains(id))
                .map(|(id, t)| Unlabeled {
                    series: id.clone(),
                    first_leak_ms: t
                        .changes
                        .iter()
                        .find(|c| c.verdict == Verdict::Leak)
                        .map(|c| c.t_ms),
                    final_change: t.final_change().cloned(),
                })
                .collect(),
        );
        outcomes.insert(path.clone(), list);
    }
    let mut summaries = Vec::new();
    let mut goals = Vec::new();
    for half in halves(workloads) {
        for (path, list) in &outcomes {
            let of_half: Vec<&Outcome> = list.iter().filter(|o| o.half == half).collect();
            summaries.push(score::summary(half, &source.name, path, &of_half));
            goals.push(Goals {
                half,
                path: path.clone(),
                checks: score::goals(interval_class, &of_half),
            });
        }
    }
    Ok(SourceReport {
        name: source.name.clone(),
        what: source.what.clone(),
        ticks: times.len(),
        interval_ms,
        interval_class,
        batch_runs,
        outcomes,
        unlabeled,
        summaries,
        goals,
        same_samples_checked,
        same_samples_mismatches: mismatches,
        final_differences,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutoffs_are_the_first_tick_of_each_step_and_the_last() {
        let times: Vec<i64> = (0..25).map(|i| 1_000 + i * 100).collect();
        assert_eq!(cutoffs(&times, 1_000), vec![1_000, 2_000, 3_000, 3_400]);
        // A hole: the first tick after it.
        assert_eq!(
            cutoffs(&[0, 100, 2_500, 2_600], 1_000),
            vec![0, 2_500, 2_600]
        );
        assert!(cutoffs(&[], 1_000).is_empty());
    }
}
