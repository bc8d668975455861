//! Contract tests written once over [`Backend`] and run against every implementation: the
//! NVML backend on the fake library here, and on the real driver where one is installed
//! (`cargo test -- --ignored` on a GPU machine).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Mutex;

use super::Backend;
use crate::NvmlBackend;
use vramctl_core::clock::ClockTime;
use vramctl_core::types::{Field, Unavailable};

/// The fake library keeps process-global state; tests that load it take turns.
pub(crate) static FAKE_NVML: Mutex<()> = Mutex::new(());

/// `target/<profile>/deps/libfake_nvml.so`, beside this test binary.
pub(crate) fn fake_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    for candidate in [
        deps.join("libfake_nvml.so"),
        deps.join("../libfake_nvml.so"),
    ] {
        if candidate.exists() {
            return candidate;
        }
    }
    panic!(
        "libfake_nvml.so not found beside {}; run cargo test --workspace",
        deps.display()
    );
}

pub(crate) fn scenario(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/scenarios")
        .join(name)
}

fn is_uuid(s: &str) -> bool {
    // A device without a UUID (the DRM backend's): `PCI-<vendor>-<slot>`.
    if let Some(rest) = s.strip_prefix("PCI-") {
        let (vendor, slot) = rest.split_at_checked(4).unwrap_or(("", ""));
        return vendor.chars().all(|c| c.is_ascii_hexdigit())
            && slot.len() == 13
            && slot.starts_with('-')
            && slot[1..]
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.');
    }
    let Some(hex) = s.strip_prefix("GPU-").or_else(|| s.strip_prefix("MIG-")) else {
        return false;
    };
    let groups: Vec<&str> = hex.split('-').collect();
    groups.iter().map(|g| g.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && groups
            .iter()
            .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// What every backend must satisfy, on whatever devices it has.
pub(crate) fn check_contract(backend: &mut dyn Backend) {
    let enumeration = backend.enumerate().expect("enumerate");
    let mut uuids = BTreeSet::new();
    for info in &enumeration.devices {
        assert!(is_uuid(&info.uuid), "malformed UUID '{}'", info.uuid);
        assert!(
            uuids.insert(info.uuid.clone()),
            "duplicate UUID '{}'",
            info.uuid
        );
        for mig in &info.mig_instances {
            assert!(is_uuid(&mig.uuid), "malformed MIG UUID '{}'", mig.uuid);
        }
        let Ok(reading) = backend.read(info) else {
            continue;
        };
        if let Some(m) = reading.memory {
            assert_eq!(
                m.used_bytes + m.reserved_bytes + m.free_bytes,
                m.total_bytes,
                "v2 memory must add up on {}",
                info.uuid
            );
        } else {
            assert!(
                reading.missing.contains_key(&Field::Memory),
                "memory absent without a reason"
            );
        }
        if reading.utilization_gpu_percent.is_none() {
            assert!(reading.missing.contains_key(&Field::Utilization));
        }
        if reading.power_mw.is_none() {
            assert!(reading.missing.contains_key(&Field::Power));
        }
        for p in reading.processes.iter().flatten() {
            assert_ne!(p.pid, 0);
        }
        if let Ok(diag) = backend.diagnostics(info) {
            if diag.memory_bus_width_bits.is_none() {
                assert!(diag.missing.contains_key("memory_bus_width"));
            }
        }
        // Health facts: a count the device cannot give is None with its reason, never 0.
        if let Ok(Some(health)) = backend.health(info) {
            for (absent, key) in [
                (
                    health.retired_pages_double_bit.is_none(),
                    "retired_pages_double_bit",
                ),
                (
                    health.retired_pages_pending.is_none(),
                    "retired_pages_pending",
                ),
                (
                    health.remapped_rows_uncorrectable.is_none(),
                    "remapped_rows",
                ),
                (health.clock_event_reasons.is_none(), "clock_event_reasons"),
                (health.recovery_action.is_none(), "recovery_action"),
            ] {
                if absent {
                    assert!(
                        health.missing.contains_key(key),
                        "{key} absent without a reason on {}",
                        info.uuid
                    );
                }
            }
            // Rows are remapped or pages retired, never both on one GPU generation.
            assert!(
                health.remapped_rows_uncorrectable.is_none()
                    || health.retired_pages_double_bit.is_none(),
                "both memory repair schemes answered on {}",
                info.uuid
            );
        }
    }
}

#[test]
fn nvml_backend_on_fake_scenarios_keeps_the_contract() {
    let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
    let library = fake_library();
    for name in [
        "h200-idle.toml",
        "h200-training.toml",
        "eight-gpus-30-procs.toml",
        "mig.toml",
        "fault-gpu-lost.toml",
        "fault-not-supported.toml",
        "fault-no-permission.toml",
        "doctor-warn.toml",
        "doctor-fail.toml",
    ] {
        // SAFETY (test-only): the lock above serialises every test that touches this
        // variable; nothing else in this binary reads it.
        unsafe { std::env::set_var("FAKE_NVML_SCENARIO", scenario(name)) };
        let mut backend =
            NvmlBackend::open(Some(&library)).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_contract(&mut backend);
    }
}

#[test]
fn not_supported_is_none_with_its_reason() {
    let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
    unsafe { std::env::set_var("FAKE_NVML_SCENARIO", scenario("fault-not-supported.toml")) };
    let mut backend = NvmlBackend::open(Some(&fake_library())).unwrap();
    let enumeration = backend.enumerate().unwrap();
    let mut saw_unsupported = false;
    for info in &enumeration.devices {
        let reading = backend.read(info).unwrap();
        if reading.power_mw.is_none() {
            assert_eq!(
                reading.missing.get(&Field::Power),
                Some(&Unavailable::NotSupported)
            );
            saw_unsupported = true;
        }
    }
    assert!(
        saw_unsupported,
        "the scenario must make power unsupported on some GPU"
    );
}

#[test]
fn health_reads_the_scenario_and_unsupported_repair_schemes_are_none() {
    let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
    unsafe { std::env::set_var("FAKE_NVML_SCENARIO", scenario("doctor-warn.toml")) };
    let mut backend = NvmlBackend::open(Some(&fake_library())).unwrap();
    let enumeration = backend.enumerate().unwrap();
    let hopper = backend.health(&enumeration.devices[0]).unwrap().unwrap();
    assert_eq!(hopper.remapped_rows_uncorrectable, Some(1));
    assert_eq!(hopper.remapped_rows_pending, Some(true));
    assert_eq!(hopper.clock_event_reasons, Some(0x24));
    assert_eq!(hopper.clock_event_reasons_supported, Some(0x1ff));
    assert_eq!(hopper.recovery_action, Some(1));
    assert_eq!(hopper.retired_pages_double_bit, None);
    assert_eq!(
        hopper.missing.get("retired_pages_double_bit"),
        Some(&Unavailable::NotSupported)
    );
    let volta = backend.health(&enumeration.devices[1]).unwrap().unwrap();
    assert_eq!(
        (
            volta.retired_pages_single_bit,
            volta.retired_pages_double_bit
        ),
        (Some(2), Some(1))
    );
    assert_eq!(volta.retired_pages_pending, Some(true));
    assert_eq!(volta.remapped_rows_uncorrectable, None);
    assert_eq!(volta.recovery_action, None);
    assert_eq!(
        volta.missing.get("recovery_action"),
        Some(&Unavailable::NotSupported)
    );
}

#[test]
fn process_activity_is_read_at_most_once_a_second_of_tick_time() {
    let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
    unsafe { std::env::set_var("FAKE_NVML_SCENARIO", scenario("h200-training.toml")) };
    let mut backend = NvmlBackend::open(Some(&fake_library())).unwrap();
    backend.set_read_process_activity(true);
    let info = backend.enumerate().unwrap().devices.remove(0);
    let t0 = 1_795_984_291_000;
    let mut asked_at = Vec::new();
    // Ticks every 100 ms for 2.5 s; at 2.3 s the wall clock steps back a minute, which
    // changes nothing: the cadence is on the monotonic clock.
    for i in 0..=25 {
        let monotonic_ms = i * 100;
        let step = if i >= 23 { -60_000 } else { 0 };
        backend.begin_tick(ClockTime {
            unix_ms: t0 + monotonic_ms + step,
            monotonic_ms,
        });
        let r = backend.read(&info).unwrap();
        let asked =
            r.process_activity.is_some() || r.missing.contains_key(&Field::ProcessUtilization);
        if asked {
            asked_at.push(monotonic_ms);
        }
        if let Some(a) = &r.process_activity {
            let pids: BTreeSet<u32> = a.iter().map(|p| p.pid).collect();
            assert_eq!(pids.len(), a.len(), "one entry per process");
        }
    }
    assert_eq!(asked_at, vec![0, 1000, 2000]);
    // Off, it is never read.
    backend.set_read_process_activity(false);
    backend.begin_tick(ClockTime {
        unix_ms: t0 + 100_000,
        monotonic_ms: 100_000,
    });
    let r = backend.read(&info).unwrap();
    assert!(r.process_activity.is_none() && !r.missing.contains_key(&Field::ProcessUtilization));
}

/// The driver stamps its samples with the wall clock: after a step back, asking for samples
/// newer than the last one seen found none until the clock caught up (an hour of no
/// activity evidence); the backend moves its mark with the step.
#[test]
fn process_activity_goes_on_across_a_wall_clock_step() {
    let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("step.toml");
    std::fs::write(
        &path,
        "[clock]\nmode = \"step\"\nstep_s = 1.0\nwall_steps = [[5.0, -3600.0], [10.0, 7200.0]]\n\
         [[gpu]]\nuuid = \"GPU-s\"\nmemory_total = \"8 GiB\"\n\
         [[gpu.process]]\npid = 4242\nmemory = \"1 GiB\"\nsm_util = 30\n",
    )
    .unwrap();
    unsafe { std::env::set_var("FAKE_NVML_SCENARIO", &path) };
    let mut backend = NvmlBackend::open(Some(&fake_library())).unwrap();
    backend.set_read_process_activity(true);
    let info = backend.enumerate().unwrap().devices.remove(0);
    let t0 = 1_795_984_291_000;
    let mut answered = Vec::new();
    for i in 0..15 {
        // The fake's step clock: t = i + 1 at this tick, as in a sampler's tick.
        backend.device_count().unwrap();
        let t = i + 1;
        let wall_s = t + if t >= 10 {
            3600
        } else if t >= 5 {
            -3600
        } else {
            0
        };
        backend.begin_tick(ClockTime {
            unix_ms: t0 + wall_s * 1000,
            monotonic_ms: t * 1000,
        });
        let r = backend.read(&info).unwrap();
        answered.push(
            r.process_activity
                .is_some_and(|a| a.iter().any(|p| p.pid == 4242)),
        );
    }
    assert_eq!(answered, vec![true; 15]);
}

#[test]
#[ignore = "requires an NVIDIA GPU"]
fn nvml_backend_on_the_real_driver_keeps_the_contract() {
    let mut backend = NvmlBackend::open(None).expect("NVML on this machine");
    check_contract(&mut backend);
}

#[test]
fn a_combined_backend_passes_health_through_to_nvml() {
    let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
    unsafe { std::env::set_var("FAKE_NVML_SCENARIO", scenario("doctor-warn.toml")) };
    let nvml = NvmlBackend::open(Some(&fake_library())).unwrap();
    let drm = super::drm::DrmBackend::with_root(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/drm/i915"),
    );
    let mut both = super::combined::CombinedBackend::new(vec![Box::new(nvml), Box::new(drm)]);
    let enumeration = both.enumerate().unwrap();
    let hopper = both.health(&enumeration.devices[0]).unwrap().unwrap();
    // doctor opens `--backend all`: the NVML GPU's health must not fall to the default None.
    assert_eq!(hopper.remapped_rows_uncorrectable, Some(1));
    let intel = enumeration.devices.last().unwrap();
    assert!(intel.uuid.starts_with("PCI-8086"), "{}", intel.uuid);
    assert!(both.health(intel).unwrap().is_none());
}
