//! Cost of live analysis in the recorder, `serve` and `top` (issue 4: "live mode adds
//! under 1 % CPU to the recorder").
//!
//! `fleet_tick_8gpu_x_30proc_{100ms,1s}`: one `FleetTracker::observe` of a snapshot of
//! 8 GPUs × 30 processes (240 series, with device utilization and CPU time as evidence for
//! every one), in steady state after 10 minutes of ticks, at a 100 ms and a 1 s interval.
//! The mix is the batch bench's (`leaks.rs`): 20 steady after warm-up, 3 sawtooth, 3 slow
//! leaks, 2 staircase leaks, 2 noisy per GPU. Share of a core = time per tick / interval.
//!
//!   cargo bench -p vramctl-core --bench fleet
#![allow(missing_docs, clippy::unwrap_used, clippy::print_stdout)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use vramctl_core::types::{
    DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, MemoryReading, ProcessKind,
    ProcessUsage, Snapshot,
};
use vramctl_leaks::analysis::live::{FleetConfig, FleetTracker};
use vramctl_procs::procinfo::ProcessFacts;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;
const T0: i64 = 1_700_000_000_000;
const TOTAL: u64 = 150_754_820_096;

fn jitter(i: i64, seed: u64) -> f64 {
    let x = (i as u64 ^ seed.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let x = (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
}

/// Process slot `slot`'s memory `ms` after the start (the shapes of `leaks.rs`).
fn memory(slot: u64, ms: i64) -> u64 {
    let s = ms / 1000;
    let base = GIB + slot * 256 * MIB;
    let warm = (s.min(60) / 20) as u64 * 128 * MIB;
    match slot {
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
        23..26 => base + warm + ((ms.max(60_000) - 60_000) as u64 * 50) / (2 * MIB) * (2 * MIB),
        26..28 => base + warm + ((s.max(600) - 600) / 600) as u64 * 256 * MIB,
        _ => (base as f64 + warm as f64 + jitter(ms / 100, slot) * 32.0 * MIB as f64) as u64,
    }
}

/// 8 GPUs × 30 processes, memory filled in by `advance`.
fn template() -> Snapshot {
    let devices = (0..8u32)
        .map(|g| DeviceSnapshot {
            info: Arc::new(DeviceInfo {
                index: g,
                uuid: format!("GPU-{g:08x}-0000-0000-0000-000000000000"),
                name: Some("NVIDIA H200".into()),
                pci_bus_id: None,
                minor_number: Some(g),
                mig_enabled: Some(false),
                mig_instances: Vec::new(),
            }),
            state: DeviceState::Ok(DeviceReading {
                utilization_gpu_percent: Some(60),
                processes: Some(
                    (0..30u32)
                        .map(|j| ProcessUsage {
                            pid: 20_000 + 1000 * g + j,
                            used_bytes: Some(GIB),
                            kind: ProcessKind::Compute,
                            gpu_instance_id: None,
                            compute_instance_id: None,
                        })
                        .collect(),
                ),
                ..DeviceReading::default()
            }),
        })
        .collect();
    Snapshot {
        taken_at_unix_ms: T0,
        monotonic_ms: T0,
        driver: Arc::new(DriverInfo::default()),
        devices,
        unopened: Vec::new(),
    }
}

/// Moves the snapshot to `t` (what a sampler tick would read).
fn advance(snapshot: &mut Snapshot, t: i64) {
    snapshot.taken_at_unix_ms = t;
    for d in &mut snapshot.devices {
        if let DeviceState::Ok(r) = &mut d.state {
            let mut used = 0;
            for (j, p) in r.processes.iter_mut().flatten().enumerate() {
                let bytes = memory(j as u64, t - T0);
                p.used_bytes = Some(bytes);
                used += bytes;
            }
            r.memory = Some(MemoryReading {
                total_bytes: TOTAL,
                used_bytes: used,
                reserved_bytes: 644_939_776,
                free_bytes: TOTAL.saturating_sub(used + 644_939_776),
            });
        }
    }
}

/// What /proc would say: a start time per PID and 10 % of a core of CPU use.
fn facts(t: i64) -> impl FnMut(u32) -> ProcessFacts {
    move |pid| ProcessFacts {
        start_time_ticks: Some(u64::from(pid)),
        started_at_unix_ms: Some(T0),
        cpu_time_ms: Some(((t - T0) / 10) as u64),
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("fleet");
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(15));
    for (name, interval_ms) in [("100ms", 100i64), ("1s", 1000)] {
        let mut fleet = FleetTracker::new(FleetConfig::default()).unwrap();
        let mut snapshot = template();
        let mut t = T0;
        // Steady state: 10 minutes of ticks first (trackers' tails full, verdicts made).
        while t < T0 + 600_000 {
            advance(&mut snapshot, t);
            fleet.observe(&snapshot, facts(t));
            t += interval_ms;
        }
        let mut verdicts = std::collections::BTreeMap::new();
        for (_, _, r) in fleet.current() {
            *verdicts
                .entry(r.map_or("none", |r| r.verdict.as_str()))
                .or_insert(0) += 1;
        }
        println!(
            "{name}: {} series after 10 min, {} analyses, verdicts {verdicts:?}",
            fleet.len(),
            fleet.analyses()
        );
        group.bench_function(format!("fleet_tick_8gpu_x_30proc_{name}"), |b| {
            b.iter(|| {
                t += interval_ms;
                advance(&mut snapshot, t);
                black_box(fleet.observe(&snapshot, facts(t)));
            });
        });
        // The snapshot update alone, to subtract.
        group.bench_function(format!("snapshot_update_only_{name}"), |b| {
            b.iter(|| {
                t += interval_ms;
                advance(&mut snapshot, t);
                black_box(&snapshot);
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
