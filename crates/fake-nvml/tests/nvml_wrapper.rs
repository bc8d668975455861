//! The fake as its real consumer sees it: the built `libfake_nvml.so` loaded through
//! nvml-wrapper (`Nvml::builder().lib_path(..)`), with the scenarios in
//! `examples/scenarios/`.
//!
//! The library keeps process-wide state (init count, loaded scenario, clock), so every test
//! takes `SERIAL` and sets `FAKE_NVML_SCENARIO` itself. Time moves through the control
//! symbols or `FAKE_NVML_TIME`, never by sleeping.

// The test calls C symbols of the fake directly (raw NVML calls, control symbols) and sets
// environment variables the library reads, both of which are unsafe in Rust 2024.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char, c_double, c_uint};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    Brand, Clock, EccCounter, MemoryError, PerformanceState, TemperatureSensor,
    TemperatureThreshold,
};
use nvml_wrapper::enums::device::{DeviceArchitecture, PcieLinkMaxSpeed, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

static SERIAL: Mutex<()> = Mutex::new(());

/// Serializes the tests, and resets what an earlier (failed) test may have left behind:
/// the environment the fake reads, and an init count above zero.
fn serial() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lib = raw_lib();
    // SAFETY: nvmlShutdown takes no arguments; it answers UNINITIALIZED (1) at count 0.
    unsafe {
        let shutdown = lib.get::<InitFn>(b"nvmlShutdown\0").expect("nvmlShutdown");
        for _ in 0..1000 {
            if shutdown() != 0 {
                break;
            }
        }
    }
    // SAFETY: every test holds SERIAL, so no other thread reads or writes the environment.
    unsafe {
        std::env::remove_var(fake_nvml::ENV_SCENARIO);
        std::env::remove_var(fake_nvml::ENV_TIME);
        std::env::remove_var(fake_nvml::ENV_CLOCK_FILE);
        std::env::remove_var(fake_nvml::ENV_CALL_COUNTS);
        std::env::remove_var(fake_nvml::ENV_PROCESS_DIR);
    }
    guard
}

fn lib_path() -> PathBuf {
    fake_nvml::cdylib_path().expect("libfake_nvml.so beside the test binary (cargo builds it)")
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/scenarios")
        .join(name)
}

fn set_env(key: &str, value: impl AsRef<std::ffi::OsStr>) {
    // SAFETY: callers hold SERIAL (see `serial`).
    unsafe { std::env::set_var(key, value) };
}

/// Points the fake at `scenario` and initialises NVML through nvml-wrapper.
fn init(scenario: &Path) -> Result<Nvml, NvmlError> {
    set_env(fake_nvml::ENV_SCENARIO, scenario);
    Nvml::builder().lib_path(lib_path().as_os_str()).init()
}

fn init_ok(scenario: &Path) -> Nvml {
    init(scenario).unwrap_or_else(|e| panic!("init {}: {e:?}", scenario.display()))
}

/// The fake's own library handle, for the control symbols and raw NVML calls. dlopen of the
/// same path returns the same loaded library, so this shares state with nvml-wrapper's.
fn raw_lib() -> libloading::Library {
    // SAFETY: loading the fake runs no initialisers with preconditions.
    unsafe { libloading::Library::new(lib_path()) }.expect("dlopen the fake")
}

fn control(symbol: &[u8], secs: f64) -> u32 {
    let lib = raw_lib();
    // SAFETY: the control symbols have this signature (src/exports/control.rs).
    unsafe {
        let f = lib
            .get::<unsafe extern "C" fn(c_double) -> c_uint>(symbol)
            .expect("control symbol");
        f(secs)
    }
}

fn set_time(secs: f64) {
    assert_eq!(control(b"fakeNvmlSetTime\0", secs), 0, "fakeNvmlSetTime");
}

fn advance_time(secs: f64) {
    assert_eq!(
        control(b"fakeNvmlAdvanceTime\0", secs),
        0,
        "fakeNvmlAdvanceTime"
    );
}

/// `fakeNvmlGetCallCount` for the C function `name`: `None` when the library refuses it.
fn call_count(name: &str) -> Option<u64> {
    let lib = raw_lib();
    let name = CString::new(name).expect("name");
    let mut n: u64 = 0;
    // SAFETY: the control symbol has this signature (src/exports/control.rs); both pointers
    // are valid for the call.
    let status = unsafe {
        let f = lib
            .get::<unsafe extern "C" fn(*const c_char, *mut u64) -> c_uint>(
                b"fakeNvmlGetCallCount\0",
            )
            .expect("fakeNvmlGetCallCount");
        f(name.as_ptr(), &mut n)
    };
    (status == 0).then_some(n)
}

fn reset_call_counts() {
    let lib = raw_lib();
    // SAFETY: the control symbol takes no arguments (src/exports/control.rs).
    let status = unsafe {
        let f = lib
            .get::<unsafe extern "C" fn() -> c_uint>(b"fakeNvmlResetCallCounts\0")
            .expect("fakeNvmlResetCallCounts");
        f()
    };
    assert_eq!(status, 0);
}

fn pids(processes: &[nvml_wrapper::struct_wrappers::device::ProcessInfo]) -> Vec<u32> {
    processes.iter().map(|p| p.pid).collect()
}

fn used(p: &nvml_wrapper::struct_wrappers::device::ProcessInfo) -> u64 {
    match p.used_gpu_memory {
        UsedGpuMemory::Used(bytes) => bytes,
        UsedGpuMemory::Unavailable => u64::MAX,
    }
}

#[test]
fn every_example_scenario_loads() {
    let _serial = serial();
    let dir = example("");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("examples/scenarios") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        seen += 1;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        fake_nvml::check_scenario(&path.to_string_lossy())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.starts_with('#'), "{name} starts with a header comment");
        match name.as_str() {
            "fault-driver-not-loaded.toml" => {
                assert!(
                    matches!(init(&path), Err(NvmlError::DriverNotLoaded)),
                    "{name}"
                );
            }
            "fault-version-mismatch.toml" => {
                assert!(
                    matches!(init(&path), Err(NvmlError::LibRmVersionMismatch)),
                    "{name}"
                );
            }
            // Its fail_count is tested on a private copy (init_recovers_after_fail_count):
            // attempts are counted per scenario path for the life of the process.
            "fault-init-recovers.toml" => {}
            _ => {
                let nvml = init_ok(&path);
                let count = nvml.device_count().expect("count");
                assert!(count >= 1, "{name}");
                for i in 0..count {
                    let device = nvml.device_by_index(i).expect("handle");
                    device.name().expect("name");
                    device.uuid().expect("uuid");
                    match device.memory_info() {
                        Ok(m) if name != "fault-absurd.toml" => {
                            assert_eq!(m.total, m.reserved + m.used + m.free, "{name} gpu {i}");
                        }
                        Ok(_) | Err(NvmlError::NotSupported) => {}
                        Err(e) => panic!("{name} gpu {i}: {e:?}"),
                    }
                }
            }
        }
    }
    assert!(seen >= 12, "all example scenarios were tried, found {seen}");
}

#[test]
fn h200_idle_reads_like_the_real_gpu() {
    let _serial = serial();
    let nvml = init_ok(&example("h200-idle.toml"));
    // nvml-wrapper reads the driver version during init to pick the field-id numbering.
    assert_eq!(
        nvml.field_id_scheme(),
        nvml_wrapper::FieldIdScheme::V13Update1
    );
    assert_eq!(nvml.sys_driver_version().expect("driver"), "580.159.04");
    assert_eq!(nvml.sys_nvml_version().expect("nvml"), "13.580.159.04");
    assert_eq!(nvml.sys_cuda_driver_version().expect("cuda"), 13000);
    assert_eq!(nvml.device_count().expect("count"), 1);
    let d = nvml.device_by_index(0).expect("gpu 0");
    assert_eq!(d.name().expect("name"), "NVIDIA H200");
    assert_eq!(
        d.uuid().expect("uuid"),
        "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2"
    );
    assert_eq!(d.serial().expect("serial"), "1652826063879");
    assert_eq!(d.vbios_version().expect("vbios"), "96.00.A5.00.1A");
    assert_eq!(d.board_part_number().expect("part"), "692-2G520-0282-001");
    let pci = d.pci_info().expect("pci");
    assert_eq!(pci.bus_id, "00000000:00:06.0");
    assert_eq!((pci.domain, pci.bus, pci.device), (0, 0, 6));
    assert_eq!(pci.pci_device_id, 0x2335_10DE);
    assert_eq!(pci.pci_sub_system_id, Some(0x18BF_10DE));
    assert_eq!(d.brand().expect("brand"), Brand::Nvidia);
    assert_eq!(d.architecture().expect("arch"), DeviceArchitecture::Hopper);
    let cc = d.cuda_compute_capability().expect("cc");
    assert_eq!((cc.major, cc.minor), (9, 0));
    assert_eq!(d.index().expect("index"), 0);
    assert_eq!(d.minor_number().expect("minor"), 0);
    let m = d.memory_info().expect("memory");
    assert_eq!(
        (m.total, m.reserved, m.used, m.free),
        (150_754_820_096, 644_939_776, 0, 150_109_880_320)
    );
    assert_eq!(m.version, 0x0200_0028);
    assert_eq!(d.memory_bus_width().expect("bus width"), 6016);
    assert_eq!(
        d.max_clock_info(Clock::Memory).expect("max mem clock"),
        3201
    );
    assert_eq!(
        d.max_clock_info(Clock::Graphics).expect("max gfx clock"),
        1980
    );
    assert_eq!(d.clock_info(Clock::Graphics).expect("gfx clock"), 420);
    assert_eq!(d.max_pcie_link_gen().expect("gen"), 5);
    assert_eq!(d.current_pcie_link_gen().expect("gen"), 5);
    assert_eq!(d.max_pcie_link_width().expect("width"), 16);
    assert_eq!(d.current_pcie_link_width().expect("width"), 16);
    assert_eq!(
        d.max_pcie_link_speed().expect("speed"),
        PcieLinkMaxSpeed::MegaTransfersPerSecond32000
    );
    let bar1 = d.bar1_memory_info().expect("bar1");
    assert_eq!(
        (bar1.total, bar1.used, bar1.free),
        (256 * GIB, MIB, 256 * GIB - MIB)
    );
    let ecc = d.is_ecc_enabled().expect("ecc");
    assert!(ecc.currently_enabled && ecc.pending_enabled);
    assert_eq!(
        d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            .expect("ecc"),
        0
    );
    assert!(d.is_in_persistent_mode().expect("persistence"));
    assert_eq!(
        d.compute_mode().expect("compute mode"),
        nvml_wrapper::enum_wrappers::device::ComputeMode::Default
    );
    assert_eq!(
        d.performance_state().expect("pstate"),
        PerformanceState::Zero
    );
    assert_eq!(d.power_management_limit().expect("limit"), 700_000);
    assert_eq!(d.enforced_power_limit().expect("enforced"), 700_000);
    assert_eq!(
        d.power_management_limit_default().expect("default"),
        700_000
    );
    assert_eq!(
        d.temperature_threshold(TemperatureThreshold::Shutdown)
            .expect("t"),
        95
    );
    assert_eq!(
        d.temperature_threshold(TemperatureThreshold::GpuMax)
            .expect("t"),
        87
    );
    assert!(matches!(
        d.temperature_threshold(TemperatureThreshold::MemoryMax),
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(d.temperature(TemperatureSensor::Gpu).expect("temp"), 33);
    assert_eq!(d.power_usage().expect("power"), 80_450);
    let util = d.utilization_rates().expect("util");
    assert_eq!((util.gpu, util.memory), (0, 0));
    let mig = d.mig_mode().expect("mig");
    assert_eq!((mig.current, mig.pending), (0, 0));
    assert_eq!(d.mig_device_count().expect("max mig"), 0);
    assert!(!d.mig_is_mig_device_handle().expect("is mig"));
    assert!(d.running_compute_processes().expect("procs").is_empty());
    assert!(d.running_graphics_processes().expect("procs").is_empty());
    assert!(d.mps_running_compute_processes().expect("procs").is_empty());
    assert!(matches!(
        d.process_utilization_stats(None),
        Err(NvmlError::NotFound)
    ));
    let by_uuid = nvml
        .device_by_uuid("GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2")
        .expect("by uuid");
    assert_eq!(by_uuid.index().expect("index"), 0);
    assert!(matches!(
        nvml.device_by_uuid("GPU-nope"),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_index(1),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn count_protocol_returns_the_processes() {
    let _serial = serial();
    let nvml = init_ok(&example("h200-training.toml"));
    set_time(0.0);
    let d = nvml.device_by_index(0).expect("gpu 0");
    // nvml-wrapper asks with count 0 first and treats SUCCESS as "no processes": the fake
    // must answer INSUFFICIENT_SIZE, or this list would come back empty.
    assert_eq!(d.running_compute_processes_count().expect("count"), 4);
    let procs = d.running_compute_processes().expect("procs");
    assert_eq!(pids(&procs), [24101, 24150, 24177, 24210]);
    assert_eq!(
        procs.iter().map(used).collect::<Vec<_>>(),
        [2 * GIB, 12 * GIB, GIB, 20 * GIB]
    );
    assert!(
        procs
            .iter()
            .all(|p| p.gpu_instance_id.is_none() && p.compute_instance_id.is_none())
    );
    assert!(d.running_graphics_processes().expect("graphics").is_empty());
    let m = d.memory_info().expect("memory");
    let extra = 3 * GIB / 2;
    assert_eq!(m.used, 35 * GIB + extra);
    assert_eq!(m.total, m.reserved + m.used + m.free);
    assert_eq!(
        nvml.sys_process_name(24150, 64).expect("name"),
        "python -m ipykernel_launcher -f kernel-3f2a.json"
    );
    assert_eq!(nvml.sys_process_name(24150, 7).expect("cropped"), "python");
    assert!(matches!(
        nvml.sys_process_name(999_999, 64),
        Err(NvmlError::NotFound)
    ));
}

#[test]
fn set_time_moves_a_ramp() {
    let _serial = serial();
    let nvml = init_ok(&example("h200-training.toml"));
    let d = nvml.device_by_index(0).expect("gpu 0");
    let trainer = |d: &nvml_wrapper::Device<'_>| {
        let procs = d.running_compute_processes().expect("procs");
        used(procs.iter().find(|p| p.pid == 24101).expect("trainer"))
    };
    set_time(0.0);
    assert_eq!(trainer(&d), 2 * GIB);
    set_time(10.0);
    assert_eq!(trainer(&d), 12 * GIB);
    advance_time(5.5);
    assert_eq!(trainer(&d), 17 * GIB + GIB / 2);
    set_time(3600.0);
    assert_eq!(trainer(&d), 48 * GIB, "capped at max");
    set_time(0.0);
    let before = d.memory_info().expect("memory").used;
    set_time(10.0);
    let after = d.memory_info().expect("memory").used;
    // trainer +10 GiB, leaker +320 MiB, inference sawtooth +10/30 of 14 GiB (rounded).
    let expected = 10 * GIB + 320 * MIB + 14 * GIB / 3;
    assert!(
        (after - before).abs_diff(expected) <= 1,
        "{} vs {expected}",
        after - before
    );
}

#[test]
fn fake_nvml_time_env_fixes_the_clock() {
    let _serial = serial();
    set_env(fake_nvml::ENV_TIME, "20");
    let nvml = init_ok(&example("h200-training.toml"));
    let d = nvml.device_by_index(0).expect("gpu 0");
    let procs = d.running_compute_processes().expect("procs");
    assert_eq!(used(&procs[0]), 22 * GIB);
}

#[test]
fn clock_file_drives_time() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = dir.path().join("clock");
    set_env(fake_nvml::ENV_CLOCK_FILE, &clock);
    let nvml = init_ok(&example("h200-training.toml"));
    let d = nvml.device_by_index(0).expect("gpu 0");
    let trainer = || used(&d.running_compute_processes().expect("procs")[0]);
    assert_eq!(trainer(), 2 * GIB, "no file yet: t = 0");
    std::fs::write(&clock, "30\n").expect("write clock");
    assert_eq!(trainer(), 32 * GIB);
}

#[test]
fn step_clock_advances_once_per_device_count() {
    let _serial = serial();
    let nvml = init_ok(&example("eight-gpus-30-procs.toml"));
    let sample = || {
        assert_eq!(nvml.device_count().expect("count"), 8);
        let d = nvml.device_by_index(0).expect("gpu 0");
        // Process 1 ramps from 309 MiB at 2 MiB/s (see the file's pattern).
        let procs = d.running_compute_processes().expect("procs");
        used(procs.iter().find(|p| p.pid == 20001).expect("pid 20001"))
    };
    let first = sample();
    let second = sample();
    let third = sample();
    assert_eq!(second - first, 2 * MIB);
    assert_eq!(third - second, 2 * MIB);
    for i in 0..8 {
        let d = nvml.device_by_index(i).expect("gpu");
        let compute = d.running_compute_processes().expect("compute");
        let graphics = d.running_graphics_processes().expect("graphics");
        assert_eq!((compute.len(), graphics.len()), (29, 1));
        let m = d.memory_info().expect("memory");
        assert!(m.used < m.total - m.reserved, "gpu {i} fits");
    }
}

#[test]
fn not_supported_and_no_permission_map_to_wrapper_errors() {
    let _serial = serial();
    let nvml = init_ok(&example("fault-not-supported.toml"));
    let fine = nvml.device_by_index(0).expect("gpu 0");
    assert_eq!(fine.memory_info().expect("memory").used, 8 * GIB);
    let weak = nvml.device_by_index(1).expect("gpu 1");
    assert_eq!(weak.name().expect("name"), "NVIDIA Jetson-like iGPU");
    assert!(matches!(weak.memory_info(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        weak.running_compute_processes(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        weak.running_compute_processes_count(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(weak.power_usage(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        weak.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
    assert!(
        matches!(weak.serial(), Err(NvmlError::NotSupported)),
        "fact left out"
    );
    assert!(matches!(
        weak.is_ecc_enabled(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(weak.mig_mode(), Err(NvmlError::NotSupported)));
    drop(nvml);

    let nvml = init_ok(&example("fault-no-permission.toml"));
    let d = nvml.device_by_index(0).expect("gpu 0");
    assert!(matches!(
        d.running_compute_processes(),
        Err(NvmlError::NoPermission)
    ));
    assert!(matches!(
        d.running_graphics_processes(),
        Err(NvmlError::NoPermission)
    ));
    assert!(matches!(
        nvml.sys_process_name(27001, 64),
        Err(NvmlError::NoPermission)
    ));
    assert_eq!(d.memory_info().expect("memory").used, 20 * GIB);
}

#[test]
fn lost_gpu_answers_gpu_is_lost_and_the_other_keeps_working() {
    let _serial = serial();
    set_env(fake_nvml::ENV_TIME, "0");
    let nvml = init_ok(&example("fault-gpu-lost.toml"));
    let gpu1 = nvml.device_by_index(1).expect("gpu 1 before the loss");
    assert_eq!(gpu1.memory_info().expect("memory").used, 30 * GIB);
    set_time(10.0);
    assert!(matches!(gpu1.memory_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(gpu1.name(), Err(NvmlError::GpuLost)));
    assert!(matches!(
        gpu1.running_compute_processes(),
        Err(NvmlError::GpuLost)
    ));
    assert!(matches!(nvml.device_by_index(1), Err(NvmlError::GpuLost)));
    assert!(matches!(
        nvml.device_by_uuid("GPU-93a0e6c2-4f1b-6d8e-b0c7-1e2f3a4b5c6d"),
        Err(NvmlError::GpuLost)
    ));
    assert_eq!(
        nvml.device_count().expect("count"),
        2,
        "a lost GPU is still counted"
    );
    let gpu0 = nvml.device_by_index(0).expect("gpu 0");
    assert_eq!(
        pids(&gpu0.running_compute_processes().expect("procs")),
        [25001]
    );
}

#[test]
fn init_errors_map_to_wrapper_errors() {
    let _serial = serial();
    assert!(matches!(
        init(&example("fault-driver-not-loaded.toml")),
        Err(NvmlError::DriverNotLoaded)
    ));
    assert!(matches!(
        init(&example("fault-version-mismatch.toml")),
        Err(NvmlError::LibRmVersionMismatch)
    ));
    assert!(matches!(
        init(Path::new("/nonexistent/scenario.toml")),
        Err(NvmlError::Unknown)
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[gpu]]\nname = \"x\"\nwattage = 3\n").expect("write");
    assert!(matches!(init(&bad), Err(NvmlError::Unknown)));
    // A failed init leaves the library usable: the next good scenario loads.
    let nvml = init_ok(&example("h200-idle.toml"));
    assert_eq!(nvml.device_count().expect("count"), 1);
}

#[test]
fn init_recovers_after_fail_count() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    // A private copy: attempts are counted per scenario path for the life of the process.
    let path = dir.path().join("recovers.toml");
    std::fs::copy(example("fault-init-recovers.toml"), &path).expect("copy");
    for attempt in 1..=3 {
        assert!(
            matches!(init(&path), Err(NvmlError::DriverNotLoaded)),
            "attempt {attempt}"
        );
    }
    let nvml = init_ok(&path);
    assert_eq!(nvml.device_count().expect("count"), 1);
    drop(nvml);
    let again = init_ok(&path);
    assert_eq!(again.device_count().expect("count"), 1, "stays recovered");
}

#[test]
fn a_reloaded_driver_fails_every_call_until_a_new_init() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("reload.toml");
    std::fs::write(
        &path,
        "[clock]\nmode = \"fixed\"\n[driver_reload]\nat_s = 5.0\ninit_failures = 1\n\
         [[gpu]]\nuuid = \"GPU-r\"\nmemory_total = \"8 GiB\"\n",
    )
    .expect("scenario");
    let nvml = init_ok(&path);
    let gpu = nvml.device_by_index(0).expect("gpu 0");
    assert!(gpu.memory_info().is_ok());
    set_time(5.0);
    // The session is gone: every call, handles obtained before included.
    assert!(matches!(nvml.device_count(), Err(NvmlError::Uninitialized)));
    assert!(matches!(gpu.memory_info(), Err(NvmlError::Uninitialized)));
    // Going back in time does not bring the old session back.
    set_time(0.0);
    assert!(matches!(gpu.memory_info(), Err(NvmlError::Uninitialized)));
    drop(nvml);
    // The driver is not back for the first init, then it is; the reloaded scenario's clock
    // starts again, and the driver does not go away a second time.
    assert!(matches!(init(&path), Err(NvmlError::DriverNotLoaded)));
    let again = init_ok(&path);
    set_time(50.0);
    assert_eq!(again.device_count().expect("count"), 1);
    assert!(again.device_by_index(0).expect("gpu").memory_info().is_ok());
}

#[test]
fn an_init_with_a_hold_path_waits_until_it_is_removed() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let hold = dir.path().join("hold");
    std::fs::write(&hold, "").expect("hold file");
    let path = dir.path().join("hang.toml");
    std::fs::write(
        &path,
        format!(
            "[init]\nhold_path = {:?}\ndelay_ms = 50\n[[gpu]]\nuuid = \"GPU-h\"\n",
            hold.display().to_string()
        ),
    )
    .expect("scenario");
    let (tx, rx) = std::sync::mpsc::channel();
    let scenario = path.clone();
    let waiter = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        let nvml = init_ok(&scenario);
        let _ = tx.send(started.elapsed());
        drop(nvml);
    });
    // Still waiting while the file exists (the delay alone is 50 ms).
    assert!(
        rx.recv_timeout(std::time::Duration::from_millis(300))
            .is_err(),
        "init answered while held"
    );
    std::fs::remove_file(&hold).expect("release");
    let took = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("init answers once released");
    assert!(took >= std::time::Duration::from_millis(300), "{took:?}");
    waiter.join().expect("joined");
}

#[test]
fn real_pid_disappears_and_frees_its_memory() {
    let _serial = serial();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let pid = child.id();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("real.toml");
    let scenario = format!(
        "[[gpu]]\nmemory_total = \"80 GiB\"\n\
         [[gpu.process]]\npid = {pid}\nreal = true\nmemory = \"5 GiB\"\n\
         [[gpu.process]]\npid = 31999\nname = \"fictional\"\nmemory = \"1 GiB\"\n"
    );
    std::fs::write(&path, scenario).expect("write scenario");
    let nvml = init_ok(&path);
    let d = nvml.device_by_index(0).expect("gpu 0");
    assert_eq!(
        pids(&d.running_compute_processes().expect("procs")),
        [pid, 31999]
    );
    assert_eq!(d.memory_info().expect("memory").used, 6 * GIB);
    // No `name` in the scenario: the real process's /proc comm.
    assert_eq!(nvml.sys_process_name(pid, 64).expect("name"), "sleep");
    child.kill().expect("kill");
    child.wait().expect("wait");
    assert_eq!(
        pids(&d.running_compute_processes().expect("procs")),
        [31999]
    );
    assert_eq!(d.memory_info().expect("memory").used, GIB);
    assert!(matches!(
        nvml.sys_process_name(pid, 64),
        Err(NvmlError::NotFound)
    ));
}

/// Waits (at most 10 s) until the killed child `pid` is a zombie: SIGKILL is not instant.
fn wait_until_zombie(pid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if state == Some("Z") || std::time::Instant::now() > deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// `used` of the v1 memory call (nvml-wrapper asks v2 only), GPU `index`, raw.
fn memory_v1_used(index: c_uint) -> u64 {
    let lib = raw_lib();
    // SAFETY: the NVML signatures from the header; both out-pointers are valid.
    unsafe {
        let by_index = lib
            .get::<unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> c_uint>(
                b"nvmlDeviceGetHandleByIndex_v2\0",
            )
            .expect("by index");
        let mem1 = lib
            .get::<unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> c_uint>(
                b"nvmlDeviceGetMemoryInfo\0",
            )
            .expect("memory v1");
        let mut dev: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(by_index(index, &mut dev), 0);
        let mut m1 = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        assert_eq!(mem1(dev, &mut m1), 0);
        m1.used
    }
}

#[test]
fn a_pid_announced_in_the_process_dir_holds_memory_until_it_exits() {
    let _serial = serial();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let pid = child.id();
    let dir = tempfile::tempdir().expect("tempdir");
    let procs = dir.path().join("procs");
    let path = dir.path().join("dir.toml");
    let scenario = "[[gpu]]\nmemory_total = \"80 GiB\"\n\
                    [[gpu.process]]\npid = 31999\nname = \"fictional\"\nmemory = \"1 GiB\"\n";
    std::fs::write(&path, scenario).expect("write scenario");
    // Read at init, like the other variables; the directory itself may come later.
    set_env(fake_nvml::ENV_PROCESS_DIR, &procs);
    let nvml = init_ok(&path);
    let d = nvml.device_by_index(0).expect("gpu 0");
    assert_eq!(
        pids(&d.running_compute_processes().expect("procs")),
        [31999]
    );
    let before = d.memory_info().expect("memory").used;

    std::fs::create_dir(&procs).expect("mkdir");
    std::fs::write(procs.join(format!("{pid}.tmp")), "0 1073741824\n").expect("write");
    assert_eq!(
        pids(&d.running_compute_processes().expect("procs")),
        [31999],
        "a .tmp file is a writer's, not yet an announcement"
    );
    std::fs::rename(
        procs.join(format!("{pid}.tmp")),
        procs.join(pid.to_string()),
    )
    .expect("rename");
    let listed = d.running_compute_processes().expect("procs");
    assert_eq!(pids(&listed), [31999, pid]);
    assert_eq!(listed[1].used_gpu_memory, UsedGpuMemory::Used(GIB));
    assert_eq!(d.memory_info().expect("memory").used, before + GIB);
    assert_eq!(memory_v1_used(0), before + GIB, "v1 counts it too");
    assert_eq!(nvml.sys_process_name(pid, 64).expect("name"), "sleep");

    // No caching: a changed file is what the next call answers; a malformed one is absent.
    std::fs::write(procs.join(pid.to_string()), "0 3221225472\n").expect("rewrite");
    assert_eq!(d.memory_info().expect("memory").used, before + 3 * GIB);
    std::fs::write(procs.join(pid.to_string()), "0 3 GiB\n").expect("rewrite");
    assert_eq!(
        pids(&d.running_compute_processes().expect("procs")),
        [31999]
    );
    std::fs::write(procs.join(pid.to_string()), "0 2147483648\n").expect("rewrite");
    assert_eq!(d.memory_info().expect("memory").used, before + 2 * GIB);

    // Killed, not yet reaped: a zombie holds no GPU memory.
    child.kill().expect("kill");
    wait_until_zombie(pid);
    assert_eq!(
        pids(&d.running_compute_processes().expect("procs")),
        [31999]
    );
    assert_eq!(d.memory_info().expect("memory").used, before);
    child.wait().expect("wait");
    assert_eq!(
        pids(&d.running_compute_processes().expect("procs")),
        [31999]
    );
    assert!(matches!(
        nvml.sys_process_name(pid, 64),
        Err(NvmlError::NotFound)
    ));
}

#[test]
fn mig_devices_answer_for_their_instance() {
    let _serial = serial();
    let nvml = init_ok(&example("mig.toml"));
    let parent = nvml.device_by_index(0).expect("gpu 0");
    let mode = parent.mig_mode().expect("mig mode");
    assert_eq!((mode.current, mode.pending), (1, 1));
    assert_eq!(parent.mig_device_count().expect("max"), 7);
    let migs: Vec<_> = (0..3)
        .map(|i| parent.mig_device_by_index(i).expect("mig device"))
        .collect();
    assert!(matches!(
        parent.mig_device_by_index(3),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        parent.mig_device_by_index(7),
        Err(NvmlError::InvalidArg)
    ));
    let big = &migs[0];
    assert!(big.mig_is_mig_device_handle().expect("is mig"));
    assert_eq!(big.name().expect("name"), "NVIDIA H200 MIG 3g.71gb");
    assert_eq!(
        big.uuid().expect("uuid"),
        "MIG-5c1f3a9e-8b2d-5e47-a1c6-3d9f0b7e2a41"
    );
    let m = big.memory_info().expect("mig memory");
    assert_eq!((m.total, m.used), (71 * GIB, 46 * GIB));
    assert_eq!(m.total, m.reserved + m.used + m.free);
    let procs = big.running_compute_processes().expect("mig procs");
    assert_eq!(pids(&procs), [30101, 30102]);
    assert!(
        procs
            .iter()
            .all(|p| p.gpu_instance_id == Some(2) && p.compute_instance_id == Some(0))
    );
    assert!(
        matches!(big.serial(), Err(NvmlError::NotSupported)),
        "whole-GPU facts"
    );
    assert!(matches!(
        big.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
    let back = big.mig_parent_device().expect("parent");
    assert_eq!(
        back.uuid().expect("uuid"),
        "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2"
    );
    assert!(matches!(
        parent.mig_parent_device(),
        Err(NvmlError::InvalidArg)
    ));

    // nvml-wrapper has no method for the instance ids; call the symbols it loaded.
    let lib = nvml.lib();
    let gi_id = lib.nvmlDeviceGetGpuInstanceId.as_ref().expect("symbol");
    let ci_id = lib.nvmlDeviceGetComputeInstanceId.as_ref().expect("symbol");
    let (mut gi, mut ci) = (0, 0);
    // SAFETY: valid handles from nvml-wrapper and valid out-pointers.
    unsafe {
        assert_eq!(gi_id(migs[2].handle(), &mut gi), 0);
        assert_eq!(ci_id(migs[2].handle(), &mut ci), 0);
        assert_eq!(
            gi_id(parent.handle(), &mut gi),
            3,
            "NOT_SUPPORTED on a whole GPU"
        );
    }
    assert_eq!((gi, ci), (9, 0));

    let all = parent.running_compute_processes().expect("parent procs");
    assert_eq!(pids(&all), [30101, 30102, 30201, 30901]);
    let pm = parent.memory_info().expect("parent memory");
    assert_eq!(
        pm.used,
        60 * GIB + 256 * MIB,
        "MIG processes and extra count in the parent"
    );
    let by_uuid = nvml
        .device_by_uuid("MIG-7e315cb0-ad4f-5069-c3e8-5fb12d904c63")
        .expect("MIG device by UUID");
    assert_eq!(
        pids(&by_uuid.running_compute_processes().expect("procs")),
        [30901]
    );

    let plain = nvml.device_by_index(1).expect("gpu 1");
    assert_eq!(plain.mig_mode().expect("mig").current, 0);
    let procs = plain.running_compute_processes().expect("procs");
    assert_eq!(procs[0].gpu_instance_id, None);
    assert!(matches!(
        plain.mig_device_by_index(0),
        Err(NvmlError::NotSupported)
    ));
}

#[test]
fn r535_stride_garbles_entries_after_the_first() {
    let _serial = serial();
    let nvml = init_ok(&example("fault-r535-stride.toml"));
    let d = nvml.device_by_index(0).expect("gpu 0");
    let procs = d.running_compute_processes().expect("procs");
    assert_eq!(procs.len(), 3);
    assert_eq!((procs[0].pid, used(&procs[0])), (28501, 5 * GIB));
    assert_eq!(procs[0].gpu_instance_id, None);
    assert_eq!((procs[1].pid, used(&procs[1])), (0, 28502));
    assert_eq!(
        (procs[1].gpu_instance_id, procs[1].compute_instance_id),
        (Some(0xC000_0000), Some(1))
    );
    assert_eq!((procs[2].pid, used(&procs[2])), (u32::MAX, 0));
    assert_eq!(procs[2].gpu_instance_id, Some(28503));
}

#[test]
fn absurd_answers_come_through() {
    let _serial = serial();
    let nvml = init_ok(&example("fault-absurd.toml"));
    let d = nvml.device_by_index(0).expect("gpu 0");
    let procs = d.running_compute_processes().expect("procs");
    assert_eq!(pids(&procs), [28001, 0, u32::MAX, 4_194_305, 28002]);
    assert!(matches!(
        procs[0].used_gpu_memory,
        UsedGpuMemory::Unavailable
    ));
    // The unavailable entry is not added into the device's used memory.
    assert_eq!(d.memory_info().expect("memory").used, 6 * GIB);
    let over = nvml
        .device_by_index(1)
        .expect("gpu 1")
        .memory_info()
        .expect("memory");
    assert!(over.used > over.total);
    let max = nvml
        .device_by_index(2)
        .expect("gpu 2")
        .memory_info()
        .expect("memory");
    assert_eq!(max.used, u64::MAX);
}

#[test]
fn process_utilization_reports_newer_samples() {
    let _serial = serial();
    let nvml = init_ok(&example("h200-training.toml"));
    set_time(25.0);
    let d = nvml.device_by_index(0).expect("gpu 0");
    let samples = d.process_utilization_stats(None).expect("samples");
    assert_eq!(samples.len(), 4);
    let trainer = samples.iter().find(|s| s.pid == 24101).expect("trainer");
    assert_eq!((trainer.sm_util, trainer.mem_util), (60, 30));
    let newest = samples[0].timestamp;
    assert!(matches!(
        d.process_utilization_stats(newest),
        Err(NvmlError::NotFound)
    ));
    advance_time(1.0);
    assert_eq!(d.process_utilization_stats(newest).expect("newer").len(), 4);
}

#[test]
fn scenario_reloads_when_init_count_returns_to_zero() {
    let _serial = serial();
    let first = init_ok(&example("h200-idle.toml"));
    let second = init_ok(&example("mig.toml"));
    assert_eq!(
        second.device_count().expect("count"),
        1,
        "still the first scenario"
    );
    drop(first);
    assert_eq!(
        second.device_count().expect("count"),
        1,
        "reference counted"
    );
    drop(second);
    let third = init_ok(&example("mig.toml"));
    assert_eq!(
        third.device_count().expect("count"),
        2,
        "reloaded at 0 -> 1"
    );
}

type InitFn = unsafe extern "C" fn() -> c_uint;

#[test]
fn raw_calls_check_arguments() {
    let _serial = serial();
    set_env(fake_nvml::ENV_SCENARIO, example("h200-training.toml"));
    set_env(fake_nvml::ENV_TIME, "0");
    let lib = raw_lib();
    // SAFETY: each symbol is fetched with its NVML prototype and called with valid or
    // deliberately NULL/short arguments, which is what this test is about.
    unsafe {
        let init = lib.get::<InitFn>(b"nvmlInit_v2\0").expect("init");
        let shutdown = lib.get::<InitFn>(b"nvmlShutdown\0").expect("shutdown");
        let count = lib
            .get::<unsafe extern "C" fn(*mut c_uint) -> c_uint>(b"nvmlDeviceGetCount_v2\0")
            .expect("count");
        let by_index = lib
            .get::<unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> c_uint>(
                b"nvmlDeviceGetHandleByIndex_v2\0",
            )
            .expect("by index");
        let name = lib
            .get::<unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> c_uint>(
                b"nvmlDeviceGetName\0",
            )
            .expect("name");
        let mem2 = lib
            .get::<unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_v2_t) -> c_uint>(
                b"nvmlDeviceGetMemoryInfo_v2\0",
            )
            .expect("memory v2");
        let mem1 = lib
            .get::<unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> c_uint>(
                b"nvmlDeviceGetMemoryInfo\0",
            )
            .expect("memory v1");
        let procs = lib
            .get::<unsafe extern "C" fn(
                nvmlDevice_t,
                *mut c_uint,
                *mut nvml_wrapper_sys::bindings::nvmlProcessInfo_t,
            ) -> c_uint>(b"nvmlDeviceGetComputeRunningProcesses_v3\0")
            .expect("procs");
        let error_string = lib
            .get::<unsafe extern "C" fn(c_uint) -> *const c_char>(b"nvmlErrorString\0")
            .expect("error string");

        let mut n: c_uint = 0;
        assert_eq!(count(&mut n), 1, "UNINITIALIZED before init");
        assert_eq!(shutdown(), 1, "UNINITIALIZED shutdown");
        assert_eq!(init(), 0);
        assert_eq!(init(), 0, "reference counted");
        assert_eq!(count(std::ptr::null_mut()), 2, "NULL -> INVALID_ARGUMENT");
        assert_eq!(count(&mut n), 0);
        assert_eq!(n, 1);
        let mut dev: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(by_index(0, &mut dev), 0);
        assert!(!dev.is_null());
        assert_eq!(by_index(5, &mut dev), 2, "index out of range");
        assert_eq!(by_index(0, std::ptr::null_mut()), 2);
        let stray = std::ptr::without_provenance_mut(0x1234);
        let mut buf = [0 as c_char; 96];
        assert_eq!(name(stray, buf.as_mut_ptr(), 96), 2, "unknown handle");
        assert_eq!(
            name(dev, buf.as_mut_ptr(), 5),
            7,
            "too short -> INSUFFICIENT_SIZE"
        );
        assert_eq!(name(dev, buf.as_mut_ptr(), 0), 2);
        assert_eq!(name(dev, std::ptr::null_mut(), 96), 2);
        assert_eq!(name(dev, buf.as_mut_ptr(), 96), 0);
        assert_eq!(
            std::ffi::CStr::from_ptr(buf.as_ptr())
                .to_str()
                .expect("utf-8"),
            "NVIDIA H200"
        );

        let mut m2 = nvmlMemory_v2_t {
            version: 0,
            total: 0,
            reserved: 0,
            free: 0,
            used: 0,
        };
        assert_eq!(
            mem2(dev, &mut m2),
            25,
            "ARGUMENT_VERSION_MISMATCH without version"
        );
        m2.version = 40 | 2 << 24;
        assert_eq!(mem2(dev, &mut m2), 0);
        assert_eq!(m2.total, m2.reserved + m2.used + m2.free);
        let mut m1 = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        assert_eq!(mem1(dev, &mut m1), 0);
        assert_eq!(m1.total, m1.used + m1.free, "v1: used includes reserved");
        assert_eq!(m1.used, m2.used + m2.reserved);

        let mut infos = [nvml_wrapper_sys::bindings::nvmlProcessInfo_t {
            pid: 0,
            usedGpuMemory: 0,
            gpuInstanceId: 0,
            computeInstanceId: 0,
        }; 4];
        let mut c: c_uint = 0;
        assert_eq!(procs(dev, &mut c, std::ptr::null_mut()), 7, "count query");
        assert_eq!(c, 4);
        c = 2;
        assert_eq!(
            procs(dev, &mut c, infos.as_mut_ptr()),
            7,
            "buffer too small"
        );
        assert_eq!(c, 4);
        c = 4;
        assert_eq!(procs(dev, std::ptr::null_mut(), infos.as_mut_ptr()), 2);
        assert_eq!(
            procs(dev, &mut c, std::ptr::null_mut()),
            2,
            "count > 0 needs a buffer"
        );
        assert_eq!(procs(dev, &mut c, infos.as_mut_ptr()), 0);
        assert_eq!(infos[3].pid, 24210);
        assert_eq!(infos[3].gpuInstanceId, 0xFFFF_FFFF);

        let message = std::ffi::CStr::from_ptr(error_string(18));
        assert_eq!(
            message.to_str().expect("utf-8"),
            "Driver/library version mismatch"
        );
        let unknown = std::ffi::CStr::from_ptr(error_string(4242));
        assert_eq!(unknown.to_str().expect("utf-8"), "Unknown Error");

        assert_eq!(shutdown(), 0);
        assert_eq!(count(&mut n), 0, "still initialised once");
        assert_eq!(shutdown(), 0);
        assert_eq!(count(&mut n), 1, "UNINITIALIZED after the last shutdown");
        assert_eq!(name(dev, buf.as_mut_ptr(), 96), 1);
        assert_eq!(control(b"fakeNvmlSetTime\0", 1.0), 1, "control needs init");
    }
}

#[test]
fn processes_appearing_between_calls_make_the_fill_call_fail() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("race.toml");
    let mut text = String::from("[[gpu]]\nprocesses_appear_between_calls = 6\n");
    for pid in 29000..29010 {
        text.push_str(&format!(
            "[[gpu.process]]\npid = {pid}\nmemory = \"1 GiB\"\n"
        ));
    }
    std::fs::write(&path, text).expect("write");
    let nvml = init_ok(&path);
    let d = nvml.device_by_index(0).expect("gpu 0");
    // The count query says 4; nvml-wrapper allocates 4 + 5 = 9 entries; 10 are live.
    assert_eq!(d.running_compute_processes_count().expect("count"), 4);
    assert!(matches!(
        d.running_compute_processes(),
        Err(NvmlError::InsufficientSize(_))
    ));
}

#[test]
fn malformed_scenario_writes_one_stderr_line() {
    if std::env::var_os("FAKE_NVML_CHILD").is_some() {
        // The child half: run by the parent half below with stderr captured.
        let result = Nvml::builder().lib_path(lib_path().as_os_str()).init();
        assert!(matches!(result, Err(NvmlError::Unknown)));
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "driver_version = \"1\"\n[[gpu]]\nmemory_total = \"12 gigs\"\n",
    )
    .expect("write");
    let exe = std::env::current_exe().expect("test binary");
    let output = std::process::Command::new(exe)
        .args([
            "--exact",
            "malformed_scenario_writes_one_stderr_line",
            "--test-threads=1",
        ])
        .env("FAKE_NVML_CHILD", "1")
        .env(fake_nvml::ENV_SCENARIO, &bad)
        .output()
        .expect("run child");
    assert!(output.status.success(), "child: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("fake-nvml: "))
        .collect();
    assert_eq!(lines.len(), 1, "stderr: {stderr}");
    let expected = format!("fake-nvml: {}:3:16: ", bad.display());
    assert!(lines[0].starts_with(&expected), "{}", lines[0]);
    assert!(lines[0].contains("unknown size unit"), "{}", lines[0]);
}

#[test]
fn exports_exactly_the_intended_symbols() {
    let expected: &[&str] = &[
        "fakeNvmlAdvanceTime",
        "fakeNvmlGetCallCount",
        "fakeNvmlResetCallCounts",
        "fakeNvmlSetTime",
        "nvmlDeviceGetArchitecture",
        "nvmlDeviceGetBAR1MemoryInfo",
        "nvmlDeviceGetBoardPartNumber",
        "nvmlDeviceGetBrand",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceGetComputeMode",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetMemoryBusWidth",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetName",
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        "nvmlDeviceGetNvLinkRemotePciInfo_v2",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkVersion",
        "nvmlDeviceGetP2PStatus",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetPcieLinkMaxSpeed",
        "nvmlDeviceGetPerformanceState",
        "nvmlDeviceGetPersistenceMode",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRetiredPages_v2",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetSupportedClocksEventReasons",
        "nvmlDeviceGetSupportedClocksThrottleReasons",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTemperatureThreshold",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetVbiosVersion",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlErrorString",
        "nvmlInitWithFlags",
        "nvmlInit_v2",
        "nvmlShutdown",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetProcessName",
    ];
    let mut listed: Vec<&str> = fake_nvml::exported_symbols().collect();
    listed.sort_unstable();
    assert_eq!(listed, expected, "fake_nvml::exported_symbols()");

    let output = match std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib_path())
        .output()
    {
        Ok(output) if output.status.success() => output,
        other => {
            println!("note: skipping the nm check, nm is not usable here: {other:?}");
            return;
        }
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let mut symbols: Vec<&str> = text
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2))
        .collect();
    symbols.sort_unstable();
    symbols.dedup();
    assert_eq!(
        symbols,
        expected,
        "nm -D --defined-only {}",
        lib_path().display()
    );
}

/// The counts are what a consumer's cost on a real driver is made of: nvml-wrapper's
/// `running_compute_processes` is two driver calls (the count query, then the list), a
/// query with no processes one.
#[test]
fn every_call_is_counted_including_the_count_query() {
    let _serial = serial();
    reset_call_counts();
    let nvml = init_ok(&example("h200-training.toml"));
    let d = nvml.device_by_index(0).expect("gpu 0");
    assert_eq!(d.running_compute_processes().expect("procs").len(), 4);
    assert!(d.running_graphics_processes().expect("procs").is_empty());
    d.memory_info().expect("memory");
    assert_eq!(
        call_count("nvmlDeviceGetComputeRunningProcesses_v3"),
        Some(2)
    );
    assert_eq!(
        call_count("nvmlDeviceGetGraphicsRunningProcesses_v3"),
        Some(1)
    );
    assert_eq!(call_count("nvmlDeviceGetMemoryInfo_v2"), Some(1));
    assert_eq!(call_count("nvmlDeviceGetHandleByIndex_v2"), Some(1));
    assert_eq!(call_count("nvmlInit_v2"), Some(1));
    assert_eq!(call_count("nvmlDeviceGetSerial"), Some(0));
    assert_eq!(call_count("nvmlDeviceGetFanSpeed"), None, "not exported");
    reset_call_counts();
    assert_eq!(call_count("nvmlDeviceGetMemoryInfo_v2"), Some(0));
    drop(nvml);
    // Without init too: counting is the library's, not the session's.
    assert_eq!(call_count("nvmlShutdown"), Some(1));
}

#[test]
fn call_counts_are_written_at_the_last_shutdown_when_asked() {
    let _serial = serial();
    reset_call_counts();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("calls.txt");
    set_env(fake_nvml::ENV_CALL_COUNTS, &path);
    let nvml = init_ok(&example("h200-idle.toml"));
    let d = nvml.device_by_index(0).expect("gpu 0");
    d.memory_info().expect("memory");
    d.memory_info().expect("memory");
    assert!(!path.exists(), "written at shutdown, not before");
    drop(nvml);
    let text = std::fs::read_to_string(&path).expect("the counts file");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.contains(&"nvmlDeviceGetMemoryInfo_v2 2"), "{text}");
    assert!(lines.contains(&"nvmlShutdown 1"), "{text}");
    assert!(!text.contains("nvmlDeviceGetSerial"), "{text}");
}

#[test]
fn init_with_flags_works_too() {
    let _serial = serial();
    set_env(fake_nvml::ENV_SCENARIO, example("h200-idle.toml"));
    let nvml = Nvml::builder()
        .lib_path(lib_path().as_os_str())
        .flags(nvml_wrapper::bitmasks::InitFlags::NO_GPUS)
        .init()
        .expect("init with flags");
    assert_eq!(nvml.device_count().expect("count"), 1);
    let uuid = CString::new("GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2").expect("cstring");
    assert!(nvml.device_by_uuid(uuid.to_str().expect("utf-8")).is_ok());
}

/// doctor's health facts through nvml-wrapper (page retirement with its count query and
/// address fill) and the raw symbols it does not wrap (remapped rows, the new clock event
/// reason names).
#[test]
fn health_facts_answer_from_the_scenario_and_absent_tables_are_not_supported() {
    use nvml_wrapper::enum_wrappers::device::RetirementCause;
    let _serial = serial();
    let nvml = init_ok(&example("doctor-warn.toml"));
    let volta = nvml.device_by_index(1).expect("gpu 1");
    assert_eq!(
        volta
            .retired_pages(RetirementCause::MultipleSingleBitEccErrors)
            .expect("sbe")
            .len(),
        2
    );
    let dbe = volta
        .retired_pages(RetirementCause::DoubleBitEccError)
        .expect("dbe");
    assert_eq!(dbe.len(), 1);
    assert_ne!(dbe[0].address, 0);
    assert!(volta.are_pages_pending_retired().expect("pending"));
    assert!(matches!(
        volta.current_throttle_reasons(),
        Ok(r) if r.bits() == 0x1
    ));

    let hopper = nvml.device_by_index(0).expect("gpu 0");
    assert!(matches!(
        hopper.retired_pages(RetirementCause::DoubleBitEccError),
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(
        hopper.supported_throttle_reasons().map(|r| r.bits()).ok(),
        Some(0x1ff)
    );
    // The recovery action field answers in its slot; an unknown field fails only its own.
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    let fields = hopper
        .field_values_for(&[FieldId(230), FieldId(1)])
        .expect("field values");
    assert!(matches!(
        fields[0].as_ref().map(|f| f.value.as_ref().ok()),
        Ok(Some(SampleValue::U32(1)))
    ));
    assert!(matches!(
        fields[1].as_ref().map(|f| f.value.is_err()),
        Ok(true) | Err(NvmlError::NotSupported)
    ));

    let lib = raw_lib();
    // SAFETY: the header's signatures; the handle is a live device of this session.
    unsafe {
        type Rows = unsafe extern "C" fn(
            nvml_wrapper_sys::bindings::nvmlDevice_t,
            *mut u32,
            *mut u32,
            *mut u32,
            *mut u32,
        ) -> u32;
        type Reasons =
            unsafe extern "C" fn(nvml_wrapper_sys::bindings::nvmlDevice_t, *mut u64) -> u32;
        let rows: libloading::Symbol<'_, Rows> =
            lib.get(b"nvmlDeviceGetRemappedRows\0").expect("symbol");
        let (mut c, mut u, mut p, mut f) = (9, 9, 9, 9);
        assert_eq!(rows(hopper.handle(), &mut c, &mut u, &mut p, &mut f), 0);
        assert_eq!((c, u, p, f), (0, 1, 1, 0));
        assert_eq!(
            rows(volta.handle(), &mut c, &mut u, &mut p, &mut f),
            nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        );
        let reasons: libloading::Symbol<'_, Reasons> = lib
            .get(b"nvmlDeviceGetCurrentClocksEventReasons\0")
            .expect("symbol");
        let mut bits = 0_u64;
        assert_eq!(reasons(hopper.handle(), &mut bits), 0);
        assert_eq!(bits, 0x24);
    }
}

#[test]
fn nvlinks_topology_and_p2p_answer_from_the_scenario() {
    use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("links.toml");
    std::fs::write(
        &path,
        r#"# three GPUs: 0 and 1 bridged by two links (one down), 2 on PCIe only
[topology]
level = "system"
p2p = "chipset_not_supported"
[[topology.pair]]
gpus = [1, 0]
level = "single"
p2p_read = "ok"
p2p_nvlink = "ok"
[[gpu]]
pci_bus_id = "00000000:18:00.0"
nvlink = { peers = [1, 1], version = 4, inactive = [1] }
[[gpu]]
pci_bus_id = "00000000:19:00.0"
nvlink = { links = 2, to = 0 }
[[gpu]]
pci_bus_id = "00000000:1A:00.0"
"#,
    )
    .expect("write");
    let nvml = init_ok(&path);
    let gpus: Vec<_> = (0..3)
        .map(|i| nvml.device_by_index(i).expect("handle"))
        .collect();
    let link0 = gpus[0].link_wrapper_for(0);
    assert!(link0.is_active().expect("state"));
    assert_eq!(link0.version().expect("version"), 4);
    assert_eq!(
        link0.remote_pci_info().expect("remote").bus_id,
        "00000000:19:00.0"
    );
    let link1 = gpus[0].link_wrapper_for(1);
    assert!(!link1.is_active().expect("state"));
    assert!(matches!(
        link1.remote_pci_info(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        gpus[0].link_wrapper_for(2).is_active(),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        gpus[1].link_wrapper_for(0).version(),
        Err(NvmlError::NotSupported)
    ));
    // A GPU without `nvlink`: a PCIe-only card.
    assert!(matches!(
        gpus[2].link_wrapper_for(0).is_active(),
        Err(NvmlError::NotSupported)
    ));

    // The pair's own answers, in either order, fall back to every pair's.
    let second = nvml.device_by_index(1).expect("handle");
    assert_eq!(
        gpus[0].topology_common_ancestor(second).expect("level"),
        TopologyLevel::Single
    );
    let first = nvml.device_by_index(0).expect("handle");
    assert_eq!(
        gpus[1].topology_common_ancestor(first).expect("level"),
        TopologyLevel::Single
    );
    let status = |a: usize, b: usize, index| gpus[a].p2p_status(&gpus[b], index);
    assert_eq!(
        status(0, 1, P2pCapabilitiesIndex::Read).ok(),
        Some(P2pStatus::Ok)
    );
    assert_eq!(
        status(0, 1, P2pCapabilitiesIndex::Write).ok(),
        Some(P2pStatus::ChipsetNotSupported)
    );
    assert_eq!(
        status(1, 0, P2pCapabilitiesIndex::NvLink).ok(),
        Some(P2pStatus::Ok)
    );
    assert!(matches!(
        status(0, 2, P2pCapabilitiesIndex::NvLink),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        status(0, 0, P2pCapabilitiesIndex::Read),
        Err(NvmlError::InvalidArg)
    ));
    let third = nvml.device_by_index(2).expect("handle");
    assert_eq!(
        gpus[0].topology_common_ancestor(third).expect("level"),
        TopologyLevel::System
    );
    drop(gpus);
    drop(nvml);

    // A scenario without these keys answers NOT_SUPPORTED everywhere.
    let nvml = init_ok(&example("fault-not-supported.toml"));
    let (a, b) = (
        nvml.device_by_index(0).expect("handle"),
        nvml.device_by_index(1).expect("handle"),
    );
    assert!(matches!(
        a.link_wrapper_for(0).is_active(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        a.p2p_status(&b, P2pCapabilitiesIndex::Read),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        a.topology_common_ancestor(b),
        Err(NvmlError::NotSupported)
    ));
}
