//! Writes a synthetic history for benchmarks: 8 GPUs × 30 processes, sampled every
//! `--interval-ms` (default 1000) for `--hours` (default 24), as `vramctl record` would
//! store it (one transaction per tick, CPU time every 10 s), from 2026-11-29T00:00:00Z or,
//! with `--end-now`, ending now (the web view's benchmark: a day that a live page's
//! 24-hour zoom covers).
//!
//! Per GPU the 30 processes have the shapes of the leak benchmark's mix
//! (`vramctl-leaks/benches/leaks.rs`), at sizes that fit a GPU: 20 steady after a warm-up
//! of three steps, 3 sawtooth (64 MiB a second for 30 s, then
//! released), 3 slow leaks (50 kB/s after a minute), 2 staircase leaks (256 MiB every
//! 10 min), 2 noisy (±32 MiB). GPU utilization varies.
//!
//!   cargo run --release -p vramctl-store --example synth_history -- /tmp/synth.db
//!   vramctl --db /tmp/synth.db leaks --since all
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::time::Instant;

use vramctl_store::{
    DeviceMeta, DeviceSample, DeviceSampleState, Metric, Observed, OpenMode, ProcessKey,
    ProcessList, ProcessMeta, ProcessOnDevice, ProcessSample, Store, TickSample,
};

const MIB: u64 = 1 << 20;
/// 2026-11-29T00:00:00Z.
const T0: i64 = 1_795_910_400_000;

/// Where the history starts: [`T0`], or `--end-now`'s start.
static START_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(T0);
const TOTAL: u64 = 150_754_820_096;
const RESERVED: u64 = 644_939_776;

fn jitter(i: i64, seed: u64) -> f64 {
    let x = (i as u64 ^ seed.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let x = (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
}

/// Process slot `slot`'s memory `ms` after the start, in 2 MiB granules as NVML reports.
fn memory(slot: u64, ms: i64) -> u64 {
    let s = ms / 1000;
    // Smaller than the leak bench's slots, so 30 of them and a day of leaks fit in 140 GiB.
    let base = 256 * MIB + slot * 64 * MIB;
    let warm = (s.min(60) / 20) as u64 * 128 * MIB;
    let bytes = match slot {
        0..20 => base + warm,
        20..23 => {
            let phase = s % 60;
            base + warm
                + if phase < 30 {
                    (phase as u64 + 1) * 64 * MIB
                } else {
                    0
                }
        }
        23..26 => base + warm + (ms.max(60_000) - 60_000) as u64 * 50,
        26..28 => base + warm + ((s.max(600) - 600) / 600) as u64 * 256 * MIB,
        _ => (base as f64 + warm as f64 + jitter(ms / 100, slot) * 32.0 * MIB as f64) as u64,
    };
    bytes / (2 * MIB) * (2 * MIB)
}

fn tick(i: i64, interval_ms: i64) -> TickSample {
    let ms = i * interval_ms;
    let cpu_due = ms % 10_000 < interval_ms;
    let mut devices = Vec::with_capacity(8);
    let mut processes = Vec::new();
    for g in 0..8u32 {
        let mut list = Vec::with_capacity(30);
        let mut used = 0;
        for j in 0..30u32 {
            let pid = 20_000 + 1000 * g + j;
            let bytes = memory(u64::from(j), ms);
            used += bytes;
            list.push(ProcessOnDevice {
                pid,
                used_bytes: Some(bytes),
                sm_percent: None,
                agent: None,
            });
            if cpu_due {
                processes.push(ProcessSample {
                    meta: ProcessMeta {
                        key: ProcessKey {
                            boot_id: Some("synthetic".into()),
                            pid,
                            start_time_ticks: Some(u64::from(pid) * 10),
                        },
                        user: Some("alice".into()),
                        command: Some(format!("python train.py --rank {j}")),
                        ..ProcessMeta::default()
                    },
                    // A tenth of a core each.
                    cpu_ticks: Some((ms / 100) as u64),
                });
            }
        }
        devices.push(DeviceSample {
            device: DeviceMeta {
                uuid: format!("GPU-{g:08x}-0000-0000-0000-000000000000"),
                index: Some(g),
                name: Some("NVIDIA H200".into()),
                pci_bus_id: None,
                parent_uuid: None,
            },
            state: DeviceSampleState::Read {
                metrics: vec![
                    (Metric::UsedBytes, Observed::Value(used)),
                    (Metric::ReservedBytes, Observed::Value(RESERVED)),
                    (
                        Metric::FreeBytes,
                        Observed::Value(TOTAL.saturating_sub(used + RESERVED)),
                    ),
                    (Metric::TotalBytes, Observed::Value(TOTAL)),
                    (
                        Metric::UtilizationGpuPercent,
                        Observed::Value(40 + (i % 60) as u64),
                    ),
                ],
                processes: ProcessList::Observed(list),
            },
        });
    }
    TickSample {
        at_unix_ms: START_MS.load(std::sync::atomic::Ordering::Relaxed) + ms,
        unavailable: None,
        devices,
        processes,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut out: Option<PathBuf> = None;
    let (mut hours, mut interval_ms) = (24.0_f64, 1000_i64);
    let mut end_now = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--hours" => hours = args.next().ok_or("--hours needs a value")?.parse()?,
            "--interval-ms" => {
                interval_ms = args.next().ok_or("--interval-ms needs a value")?.parse()?;
            }
            "--end-now" => end_now = true,
            path => out = Some(PathBuf::from(path)),
        }
    }
    let out =
        out.ok_or("usage: synth_history OUT.db [--hours H] [--interval-ms MS] [--end-now]")?;
    if out.exists() {
        return Err(format!("'{}' exists; remove it first", out.display()).into());
    }
    let ticks = (hours * 3_600_000.0 / interval_ms as f64) as i64;
    if end_now {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as i64;
        START_MS.store(
            now_ms - ticks * interval_ms,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    let started = Instant::now();
    let mut store = Store::open(&out, OpenMode::Append)?;
    for i in 0..ticks {
        store.append(&tick(i, interval_ms))?;
    }
    let size = store.size_bytes()?;
    store.close()?;
    eprintln!(
        "wrote {ticks} ticks × 240 processes to '{}' ({:.1} MB) in {:.1} s",
        out.display(),
        size as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
