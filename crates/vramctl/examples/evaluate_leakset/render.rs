//! The report as Markdown tables.

use std::fmt::Write;

use super::eval::{Report, SourceReport};
use super::live::Change;
use super::score::{Class, Outcome};

fn secs(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |s| format!("{s:.1}"))
}

/// The gates of a verdict that did not pass (and the one that holds a staircase back),
/// from the report's `checks`.
pub fn gates(change: &Change) -> String {
    let Some(map) = change.checks.as_object() else {
        return String::new();
    };
    let mut out: Vec<String> = map
        .iter()
        .filter(|(k, v)| v.as_bool() == Some(false) && k.as_str() != "irregular_staircase")
        .map(|(k, _)| format!("not {}", k.replace('_', " ")))
        .collect();
    if map
        .get("irregular_staircase")
        .and_then(serde_json::Value::as_bool)
        == Some(true)
    {
        out.push("irregular staircase".to_owned());
    }
    out.join(", ")
}

/// Why the last verdict is what it is: the rule of a leak, the gates a growing series did
/// not pass (what kept it from being a leak).
fn why(change: &Change) -> String {
    match change.verdict {
        vramctl_leaks::analysis::Verdict::Leak => {
            format!("rule {}", change.rule.as_deref().unwrap_or("?"))
        }
        vramctl_leaks::analysis::Verdict::Growing => gates(change),
        _ => String::new(),
    }
}

/// `growing -1.0 → leak +45.2 → stable +200.0` (seconds from `origin_ms`).
pub fn timeline(changes: &[Change], origin_ms: Option<i64>) -> String {
    changes
        .iter()
        .map(|c| match origin_ms {
            Some(o) => format!(
                "{} +{:.1}",
                c.verdict.as_str(),
                (c.t_ms - o) as f64 / 1000.0
            ),
            None => c.verdict.as_str().to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" → ")
}

fn cell(o: &Outcome) -> String {
    let head = match o.class {
        Class::Found => format!(
            "found +{} s ({} s from start)",
            secs(o.delay_from_leak_start_sec),
            secs(o.delay_from_process_start_sec)
        ),
        Class::FalseAlarm => match o.first_leak_ms.zip(o.start_ms) {
            Some((t, s)) => format!("FALSE ALARM at {:+.1} s", (t - s) as f64 / 1000.0),
            None => "FALSE ALARM".to_owned(),
        },
        c => c.as_str().to_owned(),
    };
    let idle = o
        .idle_delay_sec
        .map_or_else(String::new, |d| format!(", idle-holder +{d:.1} s"));
    let last = o.final_change().map_or_else(String::new, |c| {
        let rule = c
            .rule
            .as_deref()
            .map_or_else(String::new, |r| format!(" ({r})"));
        format!("; ends {}{rule}", c.verdict.as_str())
    });
    format!("{head}{idle}{last}")
}

fn rate(o: &Outcome) -> String {
    o.rate_mb_s
        .map_or_else(|| "-".to_owned(), |r| format!("{r:.1}"))
}

/// The whole report.
pub fn markdown(report: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Leak evaluation\n");
    let set = &report.settings;
    let _ = writeln!(
        s,
        "`--half {}` ({} labeled workloads of the other half left out unseen); `--idle-for {}`; batch verdicts every {} ms of recording; live cadences: {}.\n",
        set.half.name(),
        set.hidden_workloads,
        set.idle_for,
        set.batch_every_ms,
        set.live
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for n in &report.notes {
        let _ = writeln!(s, "- note: {n}");
    }
    let _ = writeln!(s, "\n## Sources\n");
    let _ = writeln!(
        s,
        "| source | what | ticks | interval | `vramctl leaks` runs | live = batch on the same samples |"
    );
    let _ = writeln!(s, "| --- | --- | --- | --- | --- | --- |");
    for src in &report.sources {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} ms | {} | {} of {} differ |",
            src.name,
            src.what,
            src.ticks,
            src.interval_ms,
            src.batch_runs,
            src.same_samples_mismatches.len(),
            src.same_samples_checked
        );
    }
    let _ = writeln!(s, "\n## Precision, recall and delay\n");
    let _ = writeln!(
        s,
        "Delays from the leak's labeled start. Flips: changes from `leak` to another verdict on a leak while it runs (issue 35). Idle holders: found / labeled (median delay from idle start).\n"
    );
    let _ = writeln!(
        s,
        "| half | source | path | found / leaks | missed | false alarms | flips | precision | recall | delay min / median / max (s) | idle |"
    );
    let _ = writeln!(
        s,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for src in &report.sources {
        for m in &src.summaries {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} / {} | {} | {} | {} | {:.2} | {:.2} | {} / {} / {} | {} / {} ({}) |",
                m.half.as_str(),
                m.source,
                m.path,
                m.found,
                m.leaks,
                if m.missed_roles.is_empty() {
                    "0".to_owned()
                } else {
                    format!("{}: {}", m.missed, m.missed_roles.join(", "))
                },
                if m.false_alarm_roles.is_empty() {
                    "0".to_owned()
                } else {
                    format!("{}: {}", m.false_alarms, m.false_alarm_roles.join(", "))
                },
                if m.flipped_roles.is_empty() {
                    "0".to_owned()
                } else {
                    format!("{}: {}", m.flips, m.flipped_roles.join(", "))
                },
                m.precision,
                m.recall,
                secs(m.delay_min_sec),
                secs(m.delay_median_sec),
                secs(m.delay_max_sec),
                m.idle_found,
                m.idle_holders,
                secs(m.idle_delay_median_sec)
            );
        }
    }
    let _ = writeln!(s, "\n## Goals of issues 13 and 35\n");
    let _ = writeln!(
        s,
        "Each cell: met or NOT MET (workloads checked), then those failing, and those the recording cannot decide.\n"
    );
    for src in &report.sources {
        let paths: Vec<&String> = src.outcomes.keys().collect();
        let _ = write!(s, "| goal | half | source |");
        for p in &paths {
            let _ = write!(s, " {p} |");
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "|{}", " --- |".repeat(3 + paths.len()));
        // Rows: (goal, half) in the order the checks come.
        let mut rows: Vec<(&str, super::labels::Half)> = Vec::new();
        for set in &src.goals {
            for g in set.checks.iter().filter(|g| g.pass.is_some()) {
                if !rows.contains(&(g.goal, set.half)) {
                    rows.push((g.goal, set.half));
                }
            }
        }
        for (goal, half) in rows {
            let _ = write!(s, "| {goal} | {} | {} |", half.as_str(), src.name);
            for p in &paths {
                let check = src
                    .goals
                    .iter()
                    .filter(|set| set.half == half && &set.path == *p)
                    .flat_map(|set| &set.checks)
                    .find(|g| g.goal == goal);
                let text = check.map_or_else(String::new, |g| {
                    let mut why: Vec<String> = g.failing.clone();
                    why.extend(g.undecided.iter().map(|u| format!("undecided: {u}")));
                    let head = if g.pass == Some(true) {
                        "met"
                    } else {
                        "NOT MET"
                    };
                    if why.is_empty() {
                        format!("{head} ({})", g.checked.len())
                    } else {
                        format!("{head} ({}): {}", g.checked.len(), why.join("; "))
                    }
                });
                let _ = write!(s, " {text} |");
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(s);
    }
    for src in &report.sources {
        source_tables(&mut s, src);
    }
    s
}

fn source_tables(s: &mut String, src: &SourceReport) {
    let paths: Vec<&String> = src.outcomes.keys().collect();
    let _ = writeln!(s, "\n## Workloads on `{}` ({})\n", src.name, src.what);
    let _ = write!(s, "| workload | half | truth | MB/s |");
    for p in &paths {
        let _ = write!(s, " {p} |");
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "|{}", " --- |".repeat(4 + paths.len()));
    let Some(first) = paths.first().and_then(|p| src.outcomes.get(*p)) else {
        return;
    };
    for (i, o) in first.iter().enumerate() {
        let _ = write!(
            s,
            "| {} | {} | {}{} | {} |",
            o.role,
            o.half.as_str(),
            o.truth.as_str(),
            if o.first_step { " (first step)" } else { "" },
            rate(o)
        );
        for p in &paths {
            let c = src.outcomes.get(*p).and_then(|l| l.get(i)).map(cell);
            let _ = write!(s, " {} |", c.unwrap_or_default());
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "\nVerdict timelines (seconds from the process's start); for a last verdict `leak` its rule, for `growing` the gates it did not pass:\n"
    );
    let _ = writeln!(s, "| workload | path | timeline | why the last verdict |");
    let _ = writeln!(s, "| --- | --- | --- | --- |");
    for i in 0..first.len() {
        for p in &paths {
            let Some(o) = src.outcomes.get(*p).and_then(|l| l.get(i)) else {
                continue;
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                o.role,
                p,
                timeline(&o.timeline, o.start_ms),
                o.final_change().map(why).unwrap_or_default()
            );
        }
    }
    let unlabeled: Vec<String> = src
        .unlabeled
        .iter()
        .flat_map(|(p, list)| {
            list.iter().map(move |u| {
                format!(
                    "PID {} ({p}): {}{}",
                    u.series.pid,
                    u.final_change.as_ref().map_or("-", |c| c.verdict.as_str()),
                    if u.first_leak_ms.is_some() {
                        ", called a leak"
                    } else {
                        ""
                    }
                )
            })
        })
        .collect();
    if !unlabeled.is_empty() {
        let _ = writeln!(s, "\nProcesses no label names: {}.", unlabeled.join("; "));
    }
    if !src.same_samples_mismatches.is_empty() {
        let _ = writeln!(
            s,
            "\nLive verdicts that `vramctl leaks --until` the same sample does not give:\n"
        );
        let _ = writeln!(s, "| path | series | at | live | batch |");
        let _ = writeln!(s, "| --- | --- | --- | --- | --- |");
        for m in &src.same_samples_mismatches {
            let _ = writeln!(
                s,
                "| {} | {} (PID {}) | {} | {} {} | {} |",
                m.path,
                m.role.as_deref().unwrap_or("-"),
                m.series.pid,
                vramctl_store::format::rfc3339(m.t_ms),
                m.live.verdict.as_str(),
                m.live.rule.as_deref().unwrap_or(""),
                m.batch.as_ref().map_or_else(
                    || "no series".to_owned(),
                    |b| format!("{} {}", b.verdict.as_str(), b.rule.as_deref().unwrap_or(""))
                )
            );
        }
    }
    if !src.final_differences.is_empty() {
        let _ = writeln!(
            s,
            "\nLast live verdict ≠ batch verdict over the whole recording:\n"
        );
        let _ = writeln!(
            s,
            "| path | series | live (last analysed) | batch | batch up to the live analysis |"
        );
        let _ = writeln!(s, "| --- | --- | --- | --- | --- |");
        for d in &src.final_differences {
            let _ = writeln!(
                s,
                "| {} | {} (PID {}) | {} ({}) | {} | {} |",
                d.path,
                d.role.as_deref().unwrap_or("-"),
                d.series.pid,
                d.live.as_ref().map_or("-", |c| c.verdict.as_str()),
                d.live_analysed_ms
                    .map_or_else(|| "-".to_owned(), vramctl_store::format::rfc3339),
                d.batch.as_ref().map_or("-", |c| c.verdict.as_str()),
                d.batch_at_live_time.map_or("-", |v| v.as_str())
            );
        }
    }
}
