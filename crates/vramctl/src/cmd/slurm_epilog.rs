//! `vramctl slurm-epilog`: a finished Slurm job's GPU memory peak per GPU, from the history
//! the recorder kept (the job's processes are gone by the time an epilog runs). The work is
//! `Store::job_peaks`; this settles the job id and prints.

use std::io::Write;

use anyhow::{Context, bail};
use serde::Serialize;
use vramctl_observe::units;

use crate::cli::{GlobalArgs, SlurmEpilogArgs};
use crate::exit::Exit;
use crate::output::emit::{Format, Lines, emit};

const SCHEMA: u32 = 1;

#[derive(Debug, Serialize)]
struct Report {
    schema: u32,
    job_id: u32,
    /// One per GPU the job's processes held memory on; empty when none is recorded.
    gpus: Vec<GpuPeak>,
}

#[derive(Debug, Serialize)]
struct GpuPeak {
    /// The GPU's index when it was recorded, and its UUID.
    index: Option<u32>,
    uuid: String,
    peak_bytes: u64,
    at_unix_ms: i64,
    /// 0: one sample; else the downsampled bucket the peak is from.
    span_ms: i64,
    allocated_bytes: Option<u64>,
    reserved_bytes: Option<u64>,
    processes: usize,
}

/// Runs `slurm-epilog`.
pub fn run(global: &GlobalArgs, args: &SlurmEpilogArgs) -> anyhow::Result<Exit> {
    let job_id = match args.job {
        Some(job) => job,
        None => job_from_environment()?,
    };
    let path = crate::cmd::db_path(global)?;
    let mut store = crate::cmd::open_history(&path)?;
    let peaks = store
        .job_peaks(job_id)
        .with_context(|| format!("cannot read job {job_id}'s memory from the history"))?;
    let devices = store.devices()?;
    let gpus = peaks
        .into_iter()
        .map(|peak| {
            let device = devices.iter().find(|d| d.id == peak.device_id);
            GpuPeak {
                index: device.and_then(|d| d.meta.index),
                uuid: device.map(|d| d.meta.uuid.clone()).unwrap_or_default(),
                peak_bytes: peak.peak_bytes,
                at_unix_ms: peak.at_unix_ms,
                span_ms: peak.span_ms,
                allocated_bytes: peak.allocated_bytes,
                reserved_bytes: peak.reserved_bytes,
                processes: peak.processes,
            }
        })
        .collect();
    let report = Report {
        schema: SCHEMA,
        job_id,
        gpus,
    };
    let mut out = std::io::stdout().lock();
    emit(
        &mut out,
        Format::from_json_flag(args.json, Format::JsonLine),
        || &report,
        || Lines::Untrusted(lines(&report)),
    )?;
    out.flush().context("cannot write to stdout")?;
    Ok(Exit::Ok)
}

/// `SLURM_JOB_ID` as slurmd sets it in an epilog's environment.
fn job_from_environment() -> anyhow::Result<u32> {
    let Some(text) = std::env::var_os("SLURM_JOB_ID") else {
        bail!("no job: give --job, or run this as a Slurm epilog (which sets SLURM_JOB_ID)");
    };
    let text = text.to_string_lossy();
    text.parse()
        .ok()
        .filter(|_| text.bytes().all(|b| b.is_ascii_digit()))
        .with_context(|| format!("SLURM_JOB_ID is not a job id: {text:?}"))
}

/// `job 1234 peaked at 61.2 GiB on GPU 0 (allocated 58.0 GiB, cache 3.2 GiB)` per GPU.
fn lines(report: &Report) -> Vec<String> {
    if report.gpus.is_empty() {
        return vec![format!(
            "job {}: no GPU memory recorded (the history knows no process of it)",
            report.job_id
        )];
    }
    report
        .gpus
        .iter()
        .map(|gpu| {
            let name = gpu
                .index
                .map_or_else(|| gpu.uuid.clone(), |i| format!("GPU {i}"));
            let mut line = format!(
                "job {} peaked at {} on {name}",
                report.job_id,
                units::bytes(gpu.peak_bytes)
            );
            if let (Some(allocated), Some(reserved)) = (gpu.allocated_bytes, gpu.reserved_bytes) {
                line.push_str(&format!(
                    " (allocated {}, cache {})",
                    units::bytes(allocated),
                    units::bytes(reserved.saturating_sub(allocated))
                ));
            }
            line
        })
        .collect()
}
