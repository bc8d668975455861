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
//! Options: `--idle-for S` (default 60: the recordings are minutes long), `--json` (one
//! JSON outcome per line), `--write-synthetic DIR` (write the suite as labeled JSON).
#![allow(missing_docs, clippy::print_stdout, clippy::print_stderr)]

#[path = "../tests/leaks/labeled.rs"]
mod labeled;
#[path = "../tests/leaks/readers.rs"]
mod readers;
#[path = "../tests/leaks/synth.rs"]
mod synth;

use std::process::ExitCode;
use std::time::Duration;

use vramctl_core::analysis::LeakConfig;

use labeled::{LabeledTrace, evaluate, render, score};

struct Options {
    inputs: Vec<String>,
    seeds: u64,
    duration_s: i64,
    interval_ms: i64,
    idle_for_s: u64,
    json: bool,
    write_synthetic: Option<String>,
}

fn parse(args: Vec<String>) -> Result<Options, String> {
    let mut o = Options {
        inputs: Vec::new(),
        seeds: 1,
        duration_s: 300,
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
                o.seeds = value("--seeds")?
                    .parse()
                    .map_err(|e| format!("--seeds: {e}"))?
            }
            "--duration" => {
                o.duration_s = value("--duration")?
                    .parse()
                    .map_err(|e| format!("--duration: {e}"))?;
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
    if input == "synthetic" {
        let mut traces = Vec::new();
        for seed in 0..o.seeds {
            for mut t in synth::workloads_at(o.duration_s, 1 + seed * 10, o.interval_ms) {
                t.name = format!("{} s{seed}", t.name);
                traces.push(t);
            }
        }
        return Ok(traces);
    }
    if input == "extras" {
        let mut traces = Vec::new();
        for seed in 0..o.seeds {
            for mut t in synth::extras(o.duration_s, 100 + seed * 10, o.interval_ms) {
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
