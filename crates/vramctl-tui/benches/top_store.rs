//! What `top` asks of the history store, on 24 h of 1 s samples of 8 GPUs × 30 processes
//! (a file database, all raw, as `record` keeps the last 24 h):
//!
//! - `history_*`: the charts' past for every GPU and process on screen (248 series) over a
//!   window, thinned to 512 points each — what live `top` loads, once, when it starts and
//!   when a zoom reaches further back;
//! - `replay_seek_*`: one step of `top --replay` (the moment at the cursor rebuilt, plus
//!   the chart window ending there for all 248 series) — what each key press or play tick
//!   costs.
//!
//! ```sh
//! cargo bench -p vramctl-tui --bench top_store
//! ```
#![allow(missing_docs, clippy::unwrap_used, clippy::print_stdout)]

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use vramctl_store::{
    DeviceMeta, DeviceSample, DeviceSampleState, Metric, Observed, OpenMode, ProcessKey,
    ProcessList, ProcessMeta, ProcessOnDevice, ProcessSample, Store, TickSample,
};
use vramctl_tui::memory_series::HistorySource;
use vramctl_tui::replay::{Seek, keys_of, seek_frame};
use vramctl_tui::store::StoreSource;

const T0: i64 = 1_795_984_291_000;
const DAY_S: i64 = 86_400;
const MIB: u64 = 1 << 20;

/// Tick `i` of the mix: per GPU, 30 processes that are constant, ramp (capped), step
/// twice, saw every 11 s, or step once; GPU utilisation, temperature and power move.
fn tick(i: i64) -> TickSample {
    let mut devices = Vec::new();
    let mut processes = Vec::new();
    for g in 0..8u32 {
        let mut list = Vec::new();
        let mut used = 0;
        for j in 0..30u32 {
            let pid = 20_000 + 1000 * g + j;
            let base = u64::from(256 + 53 * j) * MIB;
            let bytes = match j % 5 {
                0 => base,
                1 => base + (i.min(600) as u64) * 2 * MIB,
                2 => base + ((i / 7).min(2) as u64) * 512 * MIB,
                3 => base + ((i % 11) as u64) * 140 * MIB,
                _ => base + if i >= 15 { 768 * MIB } else { 0 },
            };
            used += bytes;
            list.push(ProcessOnDevice {
                pid,
                used_bytes: Some(bytes),
                sm_percent: Some(u32::from(i % 3 == 0) * 40),
                agent: None,
            });
            if i % 10 == 0 {
                processes.push(ProcessSample {
                    meta: ProcessMeta {
                        key: ProcessKey {
                            boot_id: Some("b".into()),
                            pid,
                            start_time_ticks: Some(u64::from(pid) * 10),
                        },
                        user: Some("alice".into()),
                        command: Some(format!("python train.py --rank {j}")),
                        ..ProcessMeta::default()
                    },
                    cpu_ticks: Some(i as u64 * 50),
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
                    (Metric::ReservedBytes, Observed::Value(644_939_776)),
                    (Metric::FreeBytes, Observed::Value(150_109_880_320 - used)),
                    (Metric::TotalBytes, Observed::Value(150_754_820_096)),
                    (
                        Metric::UtilizationGpuPercent,
                        Observed::Value(40 + (i % 60) as u64),
                    ),
                    (
                        Metric::UtilizationMemoryPercent,
                        Observed::Value(20 + (i % 30) as u64),
                    ),
                    (
                        Metric::TemperatureC,
                        Observed::Value(36 + (i / 10).min(24) as u64),
                    ),
                    (
                        Metric::PowerMw,
                        Observed::Value(250_000 + (i % 20) as u64 * 15_000),
                    ),
                ],
                processes: ProcessList::Observed(list),
            },
        });
    }
    TickSample {
        at_unix_ms: T0 + i * 1000,
        unavailable: None,
        devices,
        processes,
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.db");
    let started = Instant::now();
    {
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        for i in 0..DAY_S {
            store.append(&tick(i)).unwrap();
        }
        store.close().unwrap();
    }
    println!(
        "24 h at 1 s, 8 GPUs x 30 processes: {} MB, written in {:.0} s",
        std::fs::metadata(&path).unwrap().len() / 1_000_000,
        started.elapsed().as_secs_f64()
    );
    let source = StoreSource::open(&path, None).unwrap();
    let noon = T0 + DAY_S / 2 * 1000;
    let end = T0 + (DAY_S - 1) * 1000;
    let frame = seek_frame(&source, Seek::AtOrBefore(noon), 60_000, 512).unwrap();
    let obs = frame.observation.unwrap();
    let keys = keys_of(&obs);
    let starts = obs.starts();
    assert_eq!(keys.len(), 248);

    let mut group = c.benchmark_group("top_store");
    group.sample_size(10);
    for (name, span_ms) in [("history_24h", DAY_S * 1000), ("history_1h", 3_600_000)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let chunk = source.load(&keys, &starts, end - span_ms, end, 512);
                assert_eq!(chunk.series.len(), 248);
                black_box(chunk)
            });
        });
    }
    for (name, window_ms) in [("replay_seek_5m", 300_000), ("replay_seek_1h", 3_600_000)] {
        let mut cursor = noon;
        group.bench_function(name, |b| {
            b.iter(|| {
                cursor += 1000;
                let frame = seek_frame(&source, Seek::AtOrBefore(cursor), window_ms, 512).unwrap();
                black_box(frame)
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
