//! `vramctl leaks`: leak and idle-holder verdicts per process, with the numbers behind them.
//!
//! Three sources, one analysis (`vramctl_leaks::analysis`, method in `docs/leaks.md`):
//! - the history database (`--db`): by default the 24 hours before its last sample;
//! - log files given as arguments (nvidia-smi `--query-gpu` / `--query-compute-apps` CSV,
//!   vramctl NDJSON): read by the store's importers into an in-memory database, so nothing
//!   is written anywhere; a malformed row stops the analysis with its file:line (exit 2)
//!   unless `--skip-bad-rows`;
//! - the GPUs now (`--watch`, `leaks/watch.rs`): `FleetTracker`, one line per verdict
//!   change.
//!
//! Output: one line per series explaining its verdict, grouped by GPU; `--json` (schema 1,
//! `docs/json.md`). `--fail-on-leak` exits 1 when any series is a `leak`.

mod watch;

use std::io::Write;

use anyhow::Context;
use jiff::tz::TimeZone;
use serde::Serialize;
use vramctl_core::wall_time::{self, clock, same_day};
use vramctl_history::leak_scan::{Finding, analyse, device_label, short_command};
use vramctl_history::sample_source::{Source, SourceKind};
use vramctl_leaks::analysis::{
    Basis, Evidence, ExplainStyle, LeakChecks, LeakConfig, LeakRule, MannKendall, Phase,
    RegionKind, SeriesReport, Steadiness, TrendTest, Verdict, explain,
};
use vramctl_store::format::rfc3339;

use super::{leak_config, open_source};
use crate::cli::{GlobalArgs, LeaksArgs};
use crate::exit::Exit;
use crate::output::emit::{Format, Lines, emit};

/// Version of the JSON below.
pub const SCHEMA: u32 = 1;

/// Runs `leaks`.
pub fn run(global: &GlobalArgs, args: &LeaksArgs) -> anyhow::Result<Exit> {
    let cfg = leak_config(&args.analysis)?;
    if args.watch {
        return watch::run(global, args, cfg);
    }
    let mut source = open_source(global, &args.source)?;
    let findings = analyse(
        &mut source.store,
        source.range,
        &source.devices,
        &args.source.pid,
        &cfg,
    )?;
    let findings = sorted(match args.job {
        // A job's processes as the history stored them; device-wide series have no job.
        Some(job) => findings
            .into_iter()
            .filter(|f| {
                f.process
                    .as_ref()
                    .is_some_and(|p| p.meta.slurm_job_id == Some(job))
            })
            .collect(),
        None => findings,
    });
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    emit(
        &mut out,
        Format::from_json_flag(args.json, Format::JsonPretty),
        || document(&source, &findings, &cfg),
        || Lines::Untrusted(human(&source, &findings)),
    )?;
    out.flush().context("cannot write to stdout")?;
    let leaking = findings.iter().any(|f| f.report.verdict == Verdict::Leak);
    Ok(if args.fail_on_leak && leaking {
        Exit::ConditionHolds
    } else {
        Exit::Ok
    })
}

/// Leaks first, then idle holders, growing, sawtooth, stable; within a verdict by GPU and
/// PID. Human output regroups by GPU but keeps this order inside each.
fn sorted(mut findings: Vec<Finding>) -> Vec<Finding> {
    findings.sort_by_key(|f| {
        (
            f.device.meta.index,
            f.device.meta.uuid.clone(),
            rank(f.report.verdict),
            f.process.as_ref().map(|p| p.meta.key.pid),
        )
    });
    findings
}

/// Order of verdicts in the output: what needs attention first.
pub fn rank(v: Verdict) -> u8 {
    match v {
        Verdict::Leak => 0,
        Verdict::IdleHolder => 1,
        Verdict::Growing => 2,
        Verdict::Sawtooth => 3,
        Verdict::Stable => 4,
    }
}

/// The explanation with times in `tz` (the report's own says UTC).
pub fn local_explanation(
    report: &SeriesReport,
    device: &str,
    tz: &TimeZone,
    dated: bool,
) -> String {
    let time = |t: i64| clock(tz, t, dated);
    explain(
        report,
        &ExplainStyle {
            device,
            time: &time,
        },
    )
}

/// The human output: per GPU a heading, then one line per series.
fn human(source: &Source, findings: &[Finding]) -> Vec<String> {
    let mut lines = Vec::new();
    let tz = &source.tz;
    let (Some(first), Some(last)) = (
        findings.iter().map(|f| f.report.first_unix_ms).min(),
        findings.iter().map(|f| f.report.last_unix_ms).max(),
    ) else {
        lines.push(match &source.kind {
            SourceKind::Store(path) => format!(
                "no process held GPU memory in this range of '{}'; widen it with --since (e.g. --since all)",
                path.display()
            ),
            SourceKind::Files(_) => "no GPU memory samples in these files".to_owned(),
        });
        return lines;
    };
    let dated = !same_day(tz, first, last);
    let mut current: Option<&str> = None;
    let mut table: Vec<[String; 4]> = Vec::new();
    let flush = |table: &mut Vec<[String; 4]>, lines: &mut Vec<String>| {
        let widths: Vec<usize> = (0..3)
            .map(|i| {
                table
                    .iter()
                    .map(|r| r[i].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in table.drain(..) {
            let mut line = String::from("  ");
            for (i, cell) in row.iter().enumerate() {
                line.push_str(cell);
                if i < 3 {
                    line.push_str(&" ".repeat(widths[i] - cell.chars().count() + 2));
                }
            }
            lines.push(line.trim_end().to_owned());
        }
    };
    for f in findings {
        if current != Some(f.device.meta.uuid.as_str()) {
            flush(&mut table, &mut lines);
            let name = f.device.meta.name.as_deref().unwrap_or("");
            let total = f.total_bytes.map_or_else(String::new, |t| {
                format!(", {}", vramctl_observe::units::bytes(t))
            });
            let heading = match f.device.meta.index {
                Some(i) => format!("GPU {i}  {name}{total}  {}", f.device.meta.uuid),
                None => format!("{}  {name}{total}", f.device.meta.uuid),
            };
            lines.push(heading.replace("    ", "  ").trim_end().to_owned());
            current = Some(f.device.meta.uuid.as_str());
        }
        let device = device_label(&f.device);
        let (who, command) = match &f.process {
            Some(p) => (
                format!("PID {}", p.meta.key.pid),
                format!(
                    "({})",
                    short_command(p.meta.command.as_deref().unwrap_or("?"))
                ),
            ),
            None => ("device".to_owned(), "(all processes)".to_owned()),
        };
        table.push([
            who,
            command,
            f.report.verdict.as_str().to_owned(),
            local_explanation(&f.report, &device, tz, dated),
        ]);
    }
    flush(&mut table, &mut lines);
    let count = |v: Verdict| findings.iter().filter(|f| f.report.verdict == v).count();
    let processes = findings.iter().filter(|f| f.process.is_some()).count();
    let gpus = {
        let mut u: Vec<&str> = findings
            .iter()
            .map(|f| f.device.meta.uuid.as_str())
            .collect();
        u.dedup();
        u.len()
    };
    let plural = |n: usize, one: &str, many: &str| {
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {many}")
        }
    };
    let leaks = count(Verdict::Leak);
    let idle = count(Verdict::IdleHolder);
    let verdicts = match (leaks, idle) {
        (0, 0) => "no leak, no idle holder".to_owned(),
        (l, 0) => plural(l, "leak", "leaks"),
        (0, i) => plural(i, "idle holder", "idle holders"),
        (l, i) => format!(
            "{}, {}",
            plural(l, "leak", "leaks"),
            plural(i, "idle holder", "idle holders")
        ),
    };
    let among = if processes == 0 {
        format!(
            "for the memory of {} (no per-process samples)",
            plural(gpus, "GPU", "GPUs")
        )
    } else {
        format!(
            "among {} on {}",
            plural(processes, "process", "processes"),
            plural(gpus, "GPU", "GPUs")
        )
    };
    lines.push(String::new());
    lines.push(format!(
        "{verdicts} {among}, {} → {} {} ({})",
        clock(tz, first, true),
        clock(tz, last, dated),
        wall_time::zone_label(tz, first),
        vramctl_observe::units::sentence_duration((last - first) as f64 / 1000.0),
    ));
    lines
}

/// The `--json` document (schema 1, `docs/json.md`).
#[derive(Debug, Serialize)]
struct Document {
    schema: u32,
    source: &'static str,
    database: Option<String>,
    files: Vec<FileJson>,
    from: Option<String>,
    to: Option<String>,
    settings: Settings,
    series: Vec<SeriesJson>,
    leaks: usize,
    idle_holders: usize,
}

#[derive(Debug, Serialize)]
struct FileJson {
    path: String,
    format: &'static str,
}

#[derive(Debug, Serialize)]
struct Settings {
    min_idle_bytes: u64,
    idle_for_sec: f64,
    warmup_sec: f64,
}

/// One series in JSON: who, the verdict, and the numbers behind it. Shared with the
/// NDJSON events of `--watch`.
#[derive(Debug, Serialize)]
pub struct SeriesJson {
    gpu_uuid: String,
    gpu_index: Option<u32>,
    gpu_name: Option<String>,
    gpu_total_bytes: Option<u64>,
    pid: Option<u32>,
    start_time_ticks: Option<u64>,
    user: Option<String>,
    command: Option<String>,
    verdict: Verdict,
    explanation: String,
    /// What the leak verdict was judged on: `reserved` (NVML's per-process memory) or
    /// `allocated` (live tensors, from the process's agent).
    basis: Basis,
    /// The agent's allocated bytes at the last sample, while it answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    allocated_bytes: Option<u64>,
    /// NVML's memory alone gives another verdict (the cache grew over flat tensors).
    #[serde(skip_serializing_if = "Option::is_none")]
    reserved_verdict: Option<Verdict>,
    /// The agent's last answer, when it stopped answering.
    #[serde(skip_serializing_if = "Option::is_none")]
    agent_silent_since: Option<String>,
    /// A `leak` kept from an earlier analysis while the memory has not settled: when that
    /// analysis ended (its numbers are as of then).
    #[serde(skip_serializing_if = "Option::is_none")]
    judged_at: Option<String>,
    slope_bytes_per_sec: f64,
    p_value: f64,
    onset: Option<String>,
    net_growth_bytes: i64,
    time_to_full_sec: Option<f64>,
    current_bytes: u64,
    peak_bytes: u64,
    floor_bytes: u64,
    first_sample: String,
    last_sample: String,
    samples: u64,
    gaps: u32,
    rule: Option<LeakRule>,
    phase: Phase,
    settled_at: Option<String>,
    releases: u32,
    release_period_sec: Option<f64>,
    idle: IdleJson,
    trend: TrendJson,
    checks: LeakChecks,
}

/// The numbers of the judged region (`TrendTest` without its Unix-ms onset, which is
/// `onset` above).
#[derive(Debug, Serialize)]
struct TrendJson {
    region: RegionKind,
    duration_sec: f64,
    slope_bytes_per_sec: f64,
    net_growth_bytes: i64,
    rises: u32,
    median_rise_gap_sec: f64,
    growth_span_sec: f64,
    regular_steps: bool,
    still_growing: bool,
    stall_window_sec: f64,
    releases: u32,
    levels: u32,
    mann_kendall: Option<MannKendall>,
    steadiness: Option<Steadiness>,
}

impl From<&TrendTest> for TrendJson {
    fn from(t: &TrendTest) -> Self {
        Self {
            region: t.region,
            duration_sec: t.duration_sec,
            slope_bytes_per_sec: t.slope_bytes_per_sec,
            net_growth_bytes: t.net_growth_bytes,
            rises: t.rises,
            median_rise_gap_sec: t.median_rise_gap_sec,
            growth_span_sec: t.growth_span_sec,
            regular_steps: t.regular_steps,
            still_growing: t.still_growing,
            stall_window_sec: t.stall_window_sec,
            releases: t.releases,
            levels: t.levels,
            mann_kendall: t.mann_kendall,
            steadiness: t.steadiness.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
struct IdleJson {
    idle_since: Option<String>,
    idle_sec: Option<f64>,
    evidence: Vec<Evidence>,
    sources: Vec<Evidence>,
    last_active: Option<String>,
    periods: Vec<IdlePeriodJson>,
}

#[derive(Debug, Serialize)]
struct IdlePeriodJson {
    from: String,
    to: String,
    evidence: Vec<Evidence>,
}

/// Who a series is, for JSON.
pub struct Who<'a> {
    pub gpu_uuid: &'a str,
    pub gpu_index: Option<u32>,
    pub gpu_name: Option<&'a str>,
    pub gpu_total_bytes: Option<u64>,
    pub pid: Option<u32>,
    pub start_time_ticks: Option<u64>,
    pub user: Option<&'a str>,
    pub command: Option<&'a str>,
}

impl SeriesJson {
    /// The JSON of `report` for the series `who`.
    pub fn new(who: &Who<'_>, r: &SeriesReport) -> Self {
        Self {
            gpu_uuid: who.gpu_uuid.to_owned(),
            gpu_index: who.gpu_index,
            gpu_name: who.gpu_name.map(str::to_owned),
            gpu_total_bytes: who.gpu_total_bytes,
            pid: who.pid,
            start_time_ticks: who.start_time_ticks,
            user: who.user.map(str::to_owned),
            command: who.command.map(str::to_owned),
            verdict: r.verdict,
            explanation: r.explanation.clone(),
            basis: r.basis,
            allocated_bytes: r.allocated_bytes,
            reserved_verdict: r.reserved_verdict,
            agent_silent_since: r.agent_silent_since_unix_ms.map(rfc3339),
            judged_at: r.judged_unix_ms.map(rfc3339),
            slope_bytes_per_sec: r.slope_bytes_per_sec,
            p_value: r.p_value,
            onset: r.onset_unix_ms.map(rfc3339),
            net_growth_bytes: r.net_growth_bytes,
            time_to_full_sec: r.time_to_full_sec,
            current_bytes: r.current_bytes,
            peak_bytes: r.peak_bytes,
            floor_bytes: r.floor_bytes,
            first_sample: rfc3339(r.first_unix_ms),
            last_sample: rfc3339(r.last_unix_ms),
            samples: r.samples,
            gaps: r.gaps,
            rule: r.rule,
            phase: r.phase,
            settled_at: r.settled_unix_ms.map(rfc3339),
            releases: r.releases,
            release_period_sec: r.release_period_ms.map(|p| p as f64 / 1000.0),
            idle: IdleJson {
                idle_since: r.idle.idle_since_unix_ms.map(rfc3339),
                idle_sec: r.idle.idle_sec,
                evidence: r.idle.evidence.clone(),
                sources: r.idle.sources.clone(),
                last_active: r.idle.last_active_unix_ms.map(rfc3339),
                periods: r
                    .idle
                    .periods
                    .iter()
                    .map(|p| IdlePeriodJson {
                        from: rfc3339(p.from_unix_ms),
                        to: rfc3339(p.to_unix_ms),
                        evidence: p.evidence.clone(),
                    })
                    .collect(),
            },
            trend: TrendJson::from(&r.trend),
            checks: r.checks,
        }
    }
}

fn document(source: &Source, findings: &[Finding], cfg: &LeakConfig) -> Document {
    let (kind, database, files) = match &source.kind {
        SourceKind::Store(path) => ("store", Some(path.display().to_string()), Vec::new()),
        SourceKind::Files(files) => (
            "files",
            None,
            files
                .iter()
                .map(|(p, f)| FileJson {
                    path: p.display().to_string(),
                    format: f.name(),
                })
                .collect(),
        ),
    };
    let series = findings
        .iter()
        .map(|f| {
            let p = f.process.as_ref();
            SeriesJson::new(
                &Who {
                    gpu_uuid: &f.device.meta.uuid,
                    gpu_index: f.device.meta.index,
                    gpu_name: f.device.meta.name.as_deref(),
                    gpu_total_bytes: f.total_bytes,
                    pid: p.map(|p| p.meta.key.pid),
                    start_time_ticks: p.and_then(|p| p.meta.key.start_time_ticks),
                    user: p.and_then(|p| p.meta.user.as_deref()),
                    command: p.and_then(|p| p.meta.command.as_deref()),
                },
                &f.report,
            )
        })
        .collect();
    let count = |v: Verdict| findings.iter().filter(|f| f.report.verdict == v).count();
    Document {
        schema: SCHEMA,
        source: kind,
        database,
        files,
        from: findings
            .iter()
            .map(|f| f.report.first_unix_ms)
            .min()
            .map(rfc3339),
        to: findings
            .iter()
            .map(|f| f.report.last_unix_ms)
            .max()
            .map(rfc3339),
        settings: Settings {
            min_idle_bytes: cfg.min_idle_bytes,
            idle_for_sec: cfg.idle_for.as_secs_f64(),
            warmup_sec: cfg.min_warmup.as_secs_f64(),
        },
        series,
        leaks: count(Verdict::Leak),
        idle_holders: count(Verdict::IdleHolder),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_cut_and_times_are_local() {
        assert_eq!(short_command("python train.py"), "python train.py");
        let long = "python -m torch.distributed.run --nproc-per-node 8 train.py";
        assert_eq!(
            short_command(long),
            "python -m torch.distributed.run --nproc…"
        );
        // Eleven workloads under one interpreter no longer all read the same.
        assert_eq!(
            short_command("/opt/torch/.venv/bin/python3 /home/labuser/work/leak_graph.py"),
            "python3 leak_graph.py"
        );
        let paris = TimeZone::get("Europe/Paris").unwrap();
        // 2026-11-29T20:31:31Z is 21:31:31 in Paris (CET).
        assert_eq!(clock(&paris, 1_795_984_291_000, false), "21:31:31");
        assert_eq!(
            clock(&TimeZone::UTC, 1_795_984_291_000, true),
            "2026-11-29 20:31:31"
        );
        assert!(same_day(
            &TimeZone::UTC,
            1_795_984_291_000,
            1_795_984_291_000 + 3_600_000
        ));
        assert!(!same_day(
            &paris,
            1_795_984_291_000,
            1_795_984_291_000 + 3 * 3_600_000
        ));
        assert!(rank(Verdict::Leak) < rank(Verdict::IdleHolder));
        assert!(rank(Verdict::Growing) < rank(Verdict::Stable));
    }
}
