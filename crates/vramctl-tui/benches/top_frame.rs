//! What one frame of `vramctl top` costs with 8 GPUs × 30 processes: drawing it into a
//! ratatui `TestBackend`, and taking in one new sample (rows rebuilt, sorted, charts fed).
//! Goal (issue 6): a frame renders in under 2 ms.
//!
//! The state comes from the fake NVML library through the real sampler, as `top` builds it:
//!
//! ```sh
//! cargo build --release -p fake-nvml
//! FAKE_NVML_SCENARIO=$PWD/examples/scenarios/eight-gpus-30-procs.toml \
//! VRAMCTL_NVML_LIB=$PWD/target/release/libfake_nvml.so \
//!   cargo bench -p vramctl-tui --bench top_frame
//! ```

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use vramctl_core::clock::ManualClock;
use vramctl_core::sanity::SanityLimits;
use vramctl_gpu::{Backend, NvmlBackend, Sampler};
use vramctl_observe::observation::{Observation, Observer};
use vramctl_tui::app::{App, AppConfig};
use vramctl_tui::event::Event;
use vramctl_tui::view;

/// `n` observations one second apart, as the sampler thread makes them.
fn observations(n: usize) -> Vec<Arc<Observation>> {
    let library = std::env::var_os("VRAMCTL_NVML_LIB").map(PathBuf::from);
    let backend = NvmlBackend::open(library.as_deref())
        .expect("set VRAMCTL_NVML_LIB and FAKE_NVML_SCENARIO (see the file's doc)");
    let clock = ManualClock::new(1_764_450_000_000);
    let mut sampler = Sampler::with_clock(
        backend,
        Box::new(clock.clone()),
        SanityLimits::from_system(),
    )
    .expect("devices");
    sampler.backend_mut().set_read_process_activity(true);
    let mut hosts = Observer::new();
    (0..n)
        .map(|_| {
            clock.advance_ms(1000);
            let snapshot = sampler.tick();
            Arc::new(hosts.observe(snapshot, |pid| sampler.backend_mut().process_name(pid)))
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let history = observations(301);
    let (last, warm) = history.split_last().expect("samples");
    let processes: usize = last
        .snapshot
        .devices
        .iter()
        .filter_map(|d| d.reading())
        .map(|r| r.processes.as_ref().map_or(0, Vec::len))
        .sum();
    eprintln!(
        "{} GPUs, {processes} processes, 5 minutes of samples",
        last.snapshot.devices.len()
    );

    for (width, height) in [(120u16, 40u16), (200, 60)] {
        let mut app = App::new(AppConfig::default());
        app.update(Event::Resize(width, height));
        for o in warm {
            app.update(Event::Sample(Arc::clone(o)));
        }
        app.update(Event::Sample(Arc::clone(last)));
        let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("terminal");
        c.bench_function(&format!("draw_frame_8x30_{width}x{height}"), |b| {
            b.iter(|| {
                terminal
                    .draw(|f| view::render(black_box(&app), f))
                    .expect("draw");
            });
        });
    }

    let mut app = App::new(AppConfig::default());
    app.update(Event::Resize(120, 40));
    for o in warm {
        app.update(Event::Sample(Arc::clone(o)));
    }
    c.bench_function("take_in_sample_8x30", |b| {
        b.iter_batched(
            || app.clone(),
            |mut app| app.update(Event::Sample(Arc::clone(last))),
            criterion::BatchSize::LargeInput,
        );
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
