//! Scores `vramctl leaks` on a labeled recording, through the paths a user runs:
//!
//! - **batch**: the `vramctl` binary itself, `vramctl leaks --json --since all --until T`
//!   on the recording (`--db`) or the log files, at the first tick of every
//!   `--batch-every` of recording: what `leaks` run at that moment says;
//! - **live**: the recording replayed tick by tick into `FleetTracker`, as `leaks
//!   --watch` and `top` run it (`watch`: re-analysed every 1–5 s) and as `serve` runs it
//!   (`serve`: every 10–20 s).
//!
//! ```text
//! cargo build --release -p vramctl
//! cargo run --release -p vramctl --example evaluate_leakset -- --leakset testdata/h200/leakset
//! cargo run --release -p vramctl --example evaluate_leakset -- --labels L.jsonl \
//!     --source 100ms=db:history.db --source 1s=thin:1000:100ms --source smi=files:apps.csv,gpu.csv
//! ```
//!
//! Per workload: its verdict timeline on each path, when it was first called a leak and
//! how long after the leak's (and the process's) start, false alarms, idle-holder delays;
//! per half, source and path: precision, recall, delays, and the goals of issue 13 one by
//! one. Then whether every live verdict is what `vramctl leaks` gives on the same samples,
//! and where the last live verdict differs from the batch verdict. Markdown on stdout, or
//! `--json`. Method: `docs/leaks.md`, "Evaluation protocol (issue 13)".
#![allow(clippy::print_stdout, clippy::print_stderr, missing_docs)]

mod batch;
mod eval;
mod labels;
mod live;
mod render;
mod replay;
mod score;
mod sources;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::Parser;
use jiff::tz::TimeZone;
use vramctl_leaks::analysis::LeakConfig;

use crate::batch::Vramctl;
use crate::eval::{Report, Settings};
use crate::live::LiveCadence;
use crate::sources::{Workspace, leakset, parse_spec};

/// Scores `vramctl leaks` (batch and live) on a labeled recording.
#[derive(Debug, Parser)]
#[command(name = "evaluate_leakset")]
struct Args {
    /// A leak-set directory (`scripts/record-leakset-h200.sh`'s output): its labels and
    /// the sources 100ms, 1s-thin, 10s-thin, 10s and smi-1s.
    #[arg(long, conflicts_with_all = ["labels", "source"])]
    leakset: Option<PathBuf>,
    /// The labels (`labels.jsonl`) of the sources given with --source.
    #[arg(long, requires = "source")]
    labels: Option<PathBuf>,
    /// NAME=db:PATH, NAME=files:PATH[,PATH...] or NAME=thin:MS:OTHER (repeatable).
    #[arg(long)]
    source: Vec<String>,
    /// Only these sources (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// The vramctl binary (default: the one beside this program's target directory).
    #[arg(long)]
    vramctl: Option<PathBuf>,
    /// Idle for this long makes an idle holder (the recordings are minutes long).
    #[arg(long, default_value = "60s")]
    idle_for: String,
    /// Time zone of nvidia-smi's timestamps.
    #[arg(long, default_value = "UTC")]
    tz: String,
    /// Take a batch verdict every this many ms of recording.
    #[arg(long, default_value_t = 1000)]
    batch_every_ms: i64,
    /// Leave out the check that every live verdict equals the batch one on the same
    /// samples (it runs `vramctl leaks` once per distinct live verdict time).
    #[arg(long)]
    no_equality: bool,
    /// Live cadences: watch (`leaks --watch`, `top`), serve.
    #[arg(long, value_delimiter = ',', default_value = "watch,serve")]
    live: Vec<String>,
    /// The leak rate of a workload whose labels do not say it, ROLE=MB/s (repeatable;
    /// the first H200 set's labels have none).
    #[arg(long, value_name = "ROLE=MBPS")]
    rate: Vec<String>,
    /// Which workloads to score and print: `tune` (the half that may choose thresholds,
    /// and labels without a half: the development set), `holdout` (report only: run it
    /// once, on a final analysis) or `all`. The series of the workloads left out are
    /// dropped from every table, check and timeline, not only from the scores.
    #[arg(long, value_enum, default_value_t = labels::HalfArg::Tune)]
    half: labels::HalfArg,
    /// Print the report as JSON instead of Markdown.
    #[arg(long)]
    json: bool,
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut notes = Vec::new();
    let (labels_path, mut specs) = match (&args.leakset, &args.labels) {
        (Some(dir), _) => {
            let (labels, specs, n) = leakset(dir)?;
            notes.extend(n);
            (labels, specs)
        }
        (None, Some(labels)) => (
            labels.clone(),
            args.source
                .iter()
                .map(|s| parse_spec(s))
                .collect::<anyhow::Result<Vec<_>>>()?,
        ),
        (None, None) => bail!("give --leakset DIR, or --labels FILE with --source; see --help"),
    };
    if let Some(unknown) = args
        .only
        .iter()
        .find(|o| !specs.iter().any(|s| &s.name == *o))
    {
        bail!(
            "--only '{unknown}' names no source; the sources are {}",
            specs
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if !args.only.is_empty() {
        // Keep what the chosen sources are thinned from.
        let mut keep: Vec<String> = args.only.clone();
        for s in &specs {
            if let (true, sources::Spec::Thin { of, .. }) = (keep.contains(&s.name), &s.spec) {
                keep.push(of.clone());
            }
        }
        specs.retain(|s| keep.contains(&s.name));
    }
    let tz = TimeZone::get(&args.tz).map_err(|e| {
        anyhow!(
            "unknown time zone '{}' ({e}); use a name like UTC or Europe/Paris",
            args.tz
        )
    })?;
    let ws = Workspace::new(tz)?;
    let plain = ws.plain(&labels_path, "labels")?;
    let text = std::fs::read_to_string(&plain)
        .with_context(|| format!("cannot read '{}'", labels_path.display()))?;
    let all_workloads =
        labels::parse(&text).with_context(|| format!("labels '{}'", labels_path.display()))?;
    // The workloads of the other half are not scored, and their series are dropped from
    // every timeline (`eval::evaluate`'s `hidden`): nothing of them is printed.
    let (mut workloads, hidden): (Vec<_>, Vec<_>) = all_workloads
        .into_iter()
        .partition(|w| args.half.keeps(w.half));
    if workloads.is_empty() {
        bail!(
            "--half {}: no workload of that half in '{}'",
            args.half.name(),
            labels_path.display()
        );
    }
    for r in &args.rate {
        let bad = || anyhow!("--rate '{r}' is not ROLE=MB/s, e.g. leak-fast=125");
        let (role, mb_s) = r.split_once('=').ok_or_else(bad)?;
        let mb_s: f64 = mb_s.parse().map_err(|_| bad())?;
        let w = workloads
            .iter_mut()
            .find(|w| w.role == role && w.truth == labels::Truth::Leak)
            .ok_or_else(|| anyhow!("--rate '{r}': no leak is labeled '{role}'"))?;
        w.rate_mb_s = Some(mb_s);
        notes.push(format!("{role}: rate {mb_s} MB/s given with --rate"));
    }
    for w in &workloads {
        for n in &w.notes {
            notes.push(format!("{} (PID {}): {n}", w.role, w.pid));
        }
    }
    let idle_ms =
        vramctl_core::duration::parse_ms(&args.idle_for).map_err(|e| anyhow!("--idle-for: {e}"))?;
    let cfg = LeakConfig {
        idle_for: Duration::from_millis(u64::try_from(idle_ms).unwrap_or(0)),
        ..LeakConfig::default()
    };
    let live = args
        .live
        .iter()
        .filter(|l| !l.is_empty())
        .map(|l| match l.as_str() {
            "watch" => Ok(LiveCadence::Interactive),
            "serve" => Ok(LiveCadence::Scraped),
            other => Err(anyhow!("--live '{other}': use watch and/or serve")),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let settings = Settings {
        half: args.half,
        hidden_workloads: hidden.len(),
        idle_for: args.idle_for.clone(),
        batch_every_ms: args.batch_every_ms.max(1),
        equality: !args.no_equality,
        live,
    };
    let vramctl = Vramctl {
        bin: Vramctl::locate(args.vramctl.as_deref())?,
        idle_for: args.idle_for.clone(),
        tz: args.tz.clone(),
    };
    let sources: Vec<_> = ws
        .sources(&specs)?
        .into_iter()
        .filter(|s| args.only.is_empty() || args.only.contains(&s.name))
        .collect();
    let reports = eval::evaluate(
        &workloads,
        &hidden,
        &sources,
        &ws,
        &vramctl,
        &settings,
        &cfg,
        |line| eprintln!("evaluate_leakset: {line}"),
    )?;
    let report = Report {
        schema: 1,
        settings,
        notes,
        workloads,
        sources: reports,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("cannot write JSON")?
        );
    } else {
        print!("{}", render::markdown(&report));
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("evaluate_leakset: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
