//! A fake NVML (`libnvidia-ml`) for tests: a `cdylib` that exports the NVML C functions
//! vramctl calls, answering from a scenario file, so the real nvml-wrapper code path runs in
//! CI on machines without a GPU.
//!
//! ```text
//! FAKE_NVML_SCENARIO=examples/scenarios/h200-idle.toml
//! Nvml::builder().lib_path(fake_nvml::cdylib_path()?.as_os_str()).init()
//! ```
//!
//! The scenario format, the clock and the fault switches are documented in
//! `docs/scenarios.md`. Behaviour the consumer can rely on:
//! - init is reference counted; the scenario is (re)loaded when the count goes 0 -> 1;
//! - process lists keep NVML's count-query protocol (INSUFFICIENT_SIZE while processes
//!   exist), which nvml-wrapper depends on;
//! - `nvmlDeviceGetMemoryInfo_v2` keeps `total = reserved + used + free`;
//! - a `real = true` process disappears, memory freed, once its PID exits;
//! - `FAKE_NVML_PROCESS_DIR` announces real processes at run time, a file per PID
//!   (`process_dir.rs`), read afresh at every call that answers processes or memory;
//! - every call is counted (`calls.rs`): `fakeNvmlGetCallCount`, `FAKE_NVML_CALL_COUNTS`.

// Exporting a C ABI is unsafe by nature: `#[unsafe(no_mangle)]` symbols and raw pointers
// handed in by C callers. The unsafe code is confined to `ffi` (checked pointer and buffer
// writes) and `exports` (the symbols), each block with its SAFETY argument; the rest of the
// crate is safe Rust.
#![allow(unsafe_code)]

mod calls;
mod clock;
mod codes;
mod exports;
mod ffi;
mod func;
mod process_dir;
mod scenario;
mod size;
mod state;
mod timeline;

use std::path::PathBuf;

pub use calls::ENV_CALL_COUNTS;
pub use process_dir::ENV_PROCESS_DIR;
pub use scenario::{LoadError, Scenario};
pub use state::{ENV_CLOCK_FILE, ENV_SCENARIO, ENV_TIME};

/// The file name cargo gives the cdylib on this platform.
pub const CDYLIB_FILE_NAME: &str = "libfake_nvml.so";

/// The symbols the library exports: NVML's and the control ones (`fakeNvml*`).
pub fn exported_symbols() -> impl Iterator<Item = &'static str> {
    func::exported_symbols()
}

/// Finds the built `libfake_nvml.so` for a test binary: cargo puts test executables in
/// `target/<profile>/deps/` and the cdylib of a (dev-)dependency beside them, or one level
/// up in `target/<profile>/`. Returns `None` when neither exists.
pub fn cdylib_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [Some(deps), deps.parent()]
        .into_iter()
        .flatten()
        .map(|dir| dir.join(CDYLIB_FILE_NAME))
        .find(|path| path.is_file())
}

/// Checks a scenario file the way `nvmlInit` will, for tests and tools that want the error
/// as a value rather than a line on stderr.
pub fn check_scenario(path: &str) -> Result<(), LoadError> {
    Scenario::load(path).map(|_| ())
}

#[cfg(test)]
mod tests {
    use nvml_wrapper_sys::bindings::*;
    use std::mem::{offset_of, size_of};

    /// The structs come from nvml-wrapper-sys; these are the header's sizes and offsets
    /// (x86-64/aarch64 LP64), so a change of binding layout fails here, not in a consumer.
    #[test]
    fn struct_layouts_match_the_header() {
        assert_eq!(size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(offset_of!(nvmlMemory_v2_t, total), 8);
        assert_eq!(offset_of!(nvmlMemory_v2_t, reserved), 16);
        assert_eq!(offset_of!(nvmlMemory_v2_t, free), 24);
        assert_eq!(offset_of!(nvmlMemory_v2_t, used), 32);
        assert_eq!(size_of::<nvmlMemory_t>(), 24);
        assert_eq!(size_of::<nvmlProcessInfo_t>(), 24);
        assert_eq!(offset_of!(nvmlProcessInfo_t, usedGpuMemory), 8);
        assert_eq!(offset_of!(nvmlProcessInfo_t, gpuInstanceId), 16);
        assert_eq!(offset_of!(nvmlProcessInfo_t, computeInstanceId), 20);
        assert_eq!(size_of::<nvmlProcessDetail_v1_t>(), 32);
        assert_eq!(size_of::<nvmlPciInfo_t>(), 68);
        assert_eq!(offset_of!(nvmlPciInfo_t, domain), 16);
        assert_eq!(offset_of!(nvmlPciInfo_t, pciSubSystemId), 32);
        assert_eq!(offset_of!(nvmlPciInfo_t, busId), 36);
        assert_eq!(size_of::<nvmlUtilization_t>(), 8);
        assert_eq!(size_of::<nvmlProcessUtilizationSample_t>(), 32);
        assert_eq!(offset_of!(nvmlProcessUtilizationSample_t, timeStamp), 8);
        assert_eq!(offset_of!(nvmlProcessUtilizationSample_t, smUtil), 16);
        assert_eq!(size_of::<nvmlBAR1Memory_t>(), 24);
    }

    #[test]
    fn enum_constants_match_the_header() {
        assert_eq!(NVML_DEVICE_ARCH_HOPPER, 9);
        assert_eq!(nvmlBrandType_enum_NVML_BRAND_NVIDIA, 14);
        assert_eq!(nvmlClockType_enum_NVML_CLOCK_MEM, 2);
        assert_eq!(
            nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
            3
        );
        assert_eq!(nvmlPStates_enum_NVML_PSTATE_UNKNOWN, 32);
        assert_eq!(NVML_PCIE_LINK_MAX_SPEED_32000MBPS, 5);
        assert_eq!(nvmlEnableState_enum_NVML_FEATURE_ENABLED, 1);
    }
}
