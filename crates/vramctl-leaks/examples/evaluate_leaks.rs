//! Scores the leak analysis on labeled traces: precision, recall and detection delay.
//!
//! ```text
//! cargo run --release -p vramctl-core --example evaluate_leaks -- [OPTIONS] [INPUT...]
//! ```
//!
//! Inputs (any number; none = the synthetic suite):
//! - `synthetic`: the seven workloads of `scripts/workloads/` on a model of the caching
//!   allocator (`--seeds N`, `--duration S`, `--interval-ms MS` vary them);
//! - `extras`: harder cases on the same model (training with a first eval pass, variable
//!   inference requests, a model loaded after 30 s, a 2 MB/s leak);
//! - `fixture:TRACE.json:LABELS.jsonl`: the H200 fixture format;
//! - `status:STATUS.ndjson:LABELS.jsonl[:CPU.jsonl]`: `vramctl status --json --watch 0.1`
//!   output, the workloads' `labels.jsonl` and optionally the CPU times that
//!   `scripts/record-leak-traces.sh` records;
//! - `FILE.json`: a labeled trace in the documented format (`docs/leaks.md`).
//!
//! Options: `--idle-for S` (default 60: the recordings are minutes long),
//! `--batch-every-ms MS` (also analyse every MS of sample time, as `vramctl leaks --until
//! T` run every MS would: flips that the tracker's cadence steps over count), `--json` (one
//! JSON outcome per line), `--write-synthetic DIR` (write the suite as labeled JSON).
//!
//! Sweeps (issues 13 and 35, `tests/leaks/sweep.rs`, which names each): `--sweep NAME|all`
//! varies one parameter of the synthetic workloads at a time, `--seeds N` runs per point
//! (default 10 for a sweep), each point at `--intervals MS,MS,...` (default
//! 100,1000,10000), on `--jobs N` threads; prints a Markdown table per curve (or one JSON
//! object per point with `--json`). `--duration S` overrides each sweep's run length.
#![allow(missing_docs, clippy::print_stdout, clippy::print_stderr)]

#[path = "../tests/leaks/labeled.rs"]
mod labeled;
#[path = "../tests/leaks/readers.rs"]
mod readers;
#[path = "../tests/leaks/sweep.rs"]
mod sweep;
#[path = "../tests/leaks/synth.rs"]
mod synth;

use std::process::ExitCode;
use std::time::Duration;

use vramctl_leaks::analysis::LeakConfig;

use labeled::{LabeledTrace, evaluate, render, score};

struct Options {
    inputs: Vec<String>,
    seeds: Option<u64>,
    duration_s: Option<i64>,
    sweep: Option<String>,
    intervals: Vec<i64>,
    jobs: usize,
    interval_ms: i64,
    idle_for_s: u64,
    json: bool,
    write_synthetic: Option<String>,
}

fn parse(args: Vec<String>) -> Result<Options, String> {
    let mut o = Options {
        inputs: Vec::new(),
        seeds: None,
        duration_s: None,
        sweep: None,
        intervals: vec![100, 1000, 10_000],
        jobs: 1,
        interval_ms: 100,
        idle_for_s: 60,
        json: false,
        write_synthetic: None,
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--seeds" => {
                o.seeds = Some(
                    value("--seeds")?
                        .parse()
                        .map_err(|e| format!("--seeds: {e}"))?,
                );
            }
            "--duration" => {
                o.duration_s = Some(
                    value("--duration")?
                        .parse()
                        .map_err(|e| format!("--duration: {e}"))?,
                );
            }
            "--sweep" => o.sweep = Some(value("--sweep")?),
            "--intervals" => {
                o.intervals = value("--intervals")?
                    .split(',')
                    .map(|v| v.trim().parse().map_err(|e| format!("--intervals: {e}")))
                    .collect::<Result<_, _>>()?;
            }
            "--jobs" => {
                o.jobs = value("--jobs")?
                    .parse()
                    .map_err(|e| format!("--jobs: {e}"))?;
            }
            "--interval-ms" => {
                o.interval_ms = value("--interval-ms")?
                    .parse()
                    .map_err(|e| format!("--interval-ms: {e}"))?;
            }
            "--idle-for" => {
                o.idle_for_s = value("--idle-for")?
                    .parse()
                    .map_err(|e| format!("--idle-for: {e}"))?;
            }
            "--batch-every-ms" => {
                let every: i64 = value("--batch-every-ms")?
                    .parse()
                    .map_err(|e| format!("--batch-every-ms: {e}"))?;
                labeled::BATCH_EVERY_MS.store(every.max(0), std::sync::atomic::Ordering::Relaxed);
            }
            "--json" => o.json = true,
            "--write-synthetic" => o.write_synthetic = Some(value("--write-synthetic")?),
            _ if a.starts_with("--") => return Err(format!("unknown option '{a}'")),
            _ => o.inputs.push(a),
        }
    }
    if o.inputs.is_empty() {
        o.inputs.push("synthetic".to_owned());
    }
    Ok(o)
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read '{path}': {e}"))
}

fn load(input: &str, o: &Options) -> Result<Vec<LabeledTrace>, String> {
    let (seeds, duration_s) = (o.seeds.unwrap_or(1), o.duration_s.unwrap_or(300));
    if input == "synthetic" {
        let mut traces = Vec::new();
        for seed in 0..seeds {
            for mut t in synth::workloads_at(duration_s, 1 + seed * 10, o.interval_ms) {
                t.name = format!("{} s{seed}", t.name);
                traces.push(t);
            }
        }
        return Ok(traces);
    }
    if input == "extras" {
        let mut traces = Vec::new();
        for seed in 0..seeds {
            for mut t in synth::extras(duration_s, 100 + seed * 10, o.interval_ms) {
                t.name = format!("{} s{seed}", t.name);
                traces.push(t);
            }
        }
        return Ok(traces);
    }
    if let Some(rest) = input.strip_prefix("fixture:") {
        let (trace, labels) = rest.split_once(':').ok_or("fixture:TRACE:LABELS")?;
        return Ok(vec![readers::read_fixture(
            &read(trace)?,
            &read(labels)?,
            synth::T0,
        )?]);
    }
    if let Some(rest) = input.strip_prefix("status:") {
        let parts: Vec<&str> = rest.split(':').collect();
        let (ndjson, labels, cpu) = match parts.as_slice() {
            [n, l] => (*n, *l, None),
            [n, l, c] => (*n, *l, Some(read(c)?)),
            _ => return Err("status:NDJSON:LABELS[:CPU]".to_owned()),
        };
        return readers::read_status_ndjson(ndjson, &read(ndjson)?, &read(labels)?, cpu.as_deref());
    }
    let trace: LabeledTrace =
        serde_json::from_str(&read(input)?).map_err(|e| format!("'{input}': {e}"))?;
    Ok(vec![trace])
}

fn run() -> Result<(), String> {
    let o = parse(std::env::args().skip(1).collect())?;
    let cfg = LeakConfig {
        idle_for: Duration::from_secs(o.idle_for_s),
        ..LeakConfig::default()
    };
    if let Some(name) = &o.sweep {
        let points = sweep::run(
            name,
            o.seeds.unwrap_or(10),
            &o.intervals,
            o.duration_s,
            &cfg,
            o.jobs,
        )?;
        if o.json {
            for p in &points {
                println!("{}", serde_json::to_string(p).map_err(|e| e.to_string())?);
            }
        } else {
            print!("{}", sweep::render(&points));
        }
        return Ok(());
    }
    let mut outcomes = Vec::new();
    for input in &o.inputs {
        for trace in load(input, &o)? {
            if let Some(dir) = &o.write_synthetic {
                let path = format!("{dir}/{}.json", trace.name.replace(' ', "-"));
                let json = serde_json::to_string(&trace).map_err(|e| e.to_string())?;
                std::fs::write(&path, json).map_err(|e| format!("cannot write '{path}': {e}"))?;
            }
            outcomes.extend(evaluate(&trace, &cfg));
        }
    }
    if o.json {
        for out in &outcomes {
            println!("{}", serde_json::to_string(out).map_err(|e| e.to_string())?);
        }
        println!(
            "{}",
            serde_json::to_string(&score(&outcomes)).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", render(&outcomes));
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("evaluate_leaks: error: {e}");
            ExitCode::from(2)
        }
    }
}
