//! Store costs on a synthetic 8 GPU × 30 process mix (the shape of
//! `examples/scenarios/eight-gpus-30-procs.toml`): a fifth of the processes change every
//! tick (sawtooth), the rest are constant or step now and then.
//!
//!   cargo bench -p vramctl-store --bench store
//!
//! `append_tick`: one tick (one transaction) into a file database. `scan_1h`: decoding an
//! hour of 1 s ticks (every series at every tick). `bytes_per_process_sample` is printed
//! once: the file size after an hour, divided by 3600 × 240.
#![allow(missing_docs, clippy::unwrap_used, clippy::print_stdout)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use vramctl_store::{
    DeviceMeta, DeviceSample, DeviceSampleState, Metric, Observed, OpenMode, ProcessKey,
    ProcessList, ProcessMeta, ProcessOnDevice, ProcessSample, Store, TickSample, TimeRange,
};

const T0: i64 = 1_795_984_291_000;
const MIB: u64 = 1 << 20;

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
                sm_percent: None,
                agent: None,
            });
            if i == 0 {
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
                    cpu_ticks: None,
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
    let mut store = Store::open(&path, OpenMode::Append).unwrap();
    let ticks: Vec<TickSample> = (0..3600).map(tick).collect();
    for t in &ticks {
        store.append(t).unwrap();
    }
    let size = store.size_bytes().unwrap();
    println!(
        "1 h at 1 s, 8 GPUs x 30 processes: {size} bytes, {:.2} bytes per process-sample",
        size as f64 / (3600.0 * 240.0)
    );
    let mut next = 3600;
    c.bench_function("append_tick", |b| {
        b.iter(|| {
            let mut t = tick(next);
            t.processes.clear();
            store.append(black_box(&t)).unwrap();
            next += 1;
        });
    });
    let mut reader = Store::open(&path, OpenMode::ReadOnly).unwrap();
    let hour = TimeRange {
        from_ms: T0,
        to_ms: T0 + 3_599_000,
    };
    let mut group = c.benchmark_group("scan_1h");
    group.sample_size(10);
    group.bench_function("all_series", |b| {
        b.iter(|| {
            let mut n = 0u64;
            reader.scan(hour, |f| n += f.iter().count() as u64).unwrap();
            black_box(n)
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
