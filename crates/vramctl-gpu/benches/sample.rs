//! Cost of one full sample (every device and its processes), against the raw NVML calls it
//! is made of.
//!
//! `raw_nvml_calls` makes the same NVML calls a tick makes, straight through nvml-wrapper
//! with nothing around them (this bench is outside the layering rule on purpose: it is the
//! yardstick). `sampler_tick` is vramctl's `Sampler::tick`: the calls plus error mapping,
//! merging of process lists and sanity checks. The goal is a tick within 2× the raw calls.
//!
//! Run on the fake with 8 GPUs × 30 processes (what CI machines can do):
//!   FAKE_NVML_SCENARIO=$PWD/examples/scenarios/eight-gpus-30-procs.toml FAKE_NVML_TIME=0 \
//!   VRAMCTL_NVML_LIB=$PWD/target/release/libfake_nvml.so cargo bench -p vramctl-core --bench sample
//! and on a GPU machine without VRAMCTL_NVML_LIB (the real libnvidia-ml.so.1).
#![allow(missing_docs, clippy::unwrap_used, clippy::print_stdout)]

use std::ffi::OsStr;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use vramctl_gpu::{NvmlBackend, Sampler};

fn library() -> Option<String> {
    std::env::var("VRAMCTL_NVML_LIB").ok()
}

fn bench(c: &mut Criterion) {
    let lib = library();
    let nvml = match &lib {
        Some(path) => Nvml::builder().lib_path(OsStr::new(path)).init(),
        None => Nvml::init(),
    }
    .expect("NVML");
    let count = nvml.device_count().unwrap();
    let mut processes = 0;
    for i in 0..count {
        processes += nvml
            .device_by_index(i)
            .unwrap()
            .running_compute_processes()
            .map_or(0, |p| p.len());
    }
    println!("devices: {count}, compute processes: {processes}");

    c.bench_function("raw_nvml_calls", |b| {
        b.iter(|| {
            for i in 0..count {
                let d = nvml.device_by_index(i).unwrap();
                black_box(d.memory_info().ok());
                black_box(d.utilization_rates().ok());
                black_box(d.temperature(TemperatureSensor::Gpu).ok());
                black_box(d.power_usage().ok());
                black_box(d.running_compute_processes().ok());
                black_box(d.running_graphics_processes().ok());
            }
        });
    });

    let backend = NvmlBackend::open(lib.as_deref().map(std::path::Path::new)).expect("backend");
    let mut sampler = Sampler::new(backend).expect("sampler");
    c.bench_function("sampler_tick", |b| b.iter(|| black_box(sampler.tick())));
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
