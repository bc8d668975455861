//! The seam between vramctl and a source of GPU readings.
//!
//! [`NvmlBackend`](nvml::NvmlBackend) reads the driver through NVML;
//! [`DrmBackend`](drm::DrmBackend) reads AMD and Intel GPUs from sysfs and DRM fdinfo, and
//! [`CombinedBackend`](combined::CombinedBackend) shows both in one run; tests drive the same
//! code through the fake `libnvidia-ml` (`crates/fake-nvml`), so there is one real
//! implementation and no in-process mock that could drift from it. The replay backend over a
//! recorded history (`vramctl_store::replay::ReplayBackend`, in the store crate, which may
//! name this one) implements the same trait.
//!
//! Contract (checked by [`contract`]'s tests against every implementation):
//! - a value a device cannot report is `None` with its reason in `missing`, never 0;
//! - one device failing never fails the others;
//! - UUIDs are well formed and unique;
//! - where v2 memory is reported, `used + reserved + free == total`.

use std::path::{Path, PathBuf};

use vramctl_core::clock::ClockTime;
use vramctl_core::topology::PairFacts;
use vramctl_core::types::{
    DeviceDiagnostics, DeviceHealth, DeviceInfo, DeviceReading, DriverInfo, UnopenedDevice,
};

pub mod combined;
pub mod drm;
pub mod nvml;

/// The library could not be loaded or NVML could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// `dlopen` failed: no driver installed, or a wrong `--nvml-lib` path.
    #[error("cannot load the NVML library '{}': {reason}", path.display())]
    LibraryNotLoaded {
        /// The path or name that was tried.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The library loaded but `nvmlInit` failed.
    #[error("NVML did not start ({}): {reason}", path.display())]
    InitFailed {
        /// The library that was loaded.
        path: PathBuf,
        /// NVML's answer.
        reason: String,
        /// What the user can do about it.
        hint: &'static str,
        /// A short, fixed name of the failure (see [`InitError::code`]).
        code: &'static str,
    },
    /// `--backend drm` found no AMD or Intel GPU (no `cardN` driven by amdgpu, i915 or xe).
    #[error("no AMD or Intel GPU found in '{}'", dir.display())]
    NoDrmDevices {
        /// The sysfs directory looked in (`/sys/class/drm`).
        dir: PathBuf,
    },
}

impl InitError {
    /// One line saying what to do about it.
    pub fn hint(&self) -> &'static str {
        match self {
            Self::LibraryNotLoaded { .. } => {
                "install the NVIDIA driver (it ships libnvidia-ml.so.1), or point --nvml-lib / \
                 VRAMCTL_NVML_LIB at the library"
            }
            Self::InitFailed { hint, .. } => hint,
            Self::NoDrmDevices { .. } => {
                "load the amdgpu, i915 or xe driver, or use --backend nvml (or all) for NVIDIA GPUs"
            }
        }
    }

    /// A short, fixed name for the failure, from a small set, fit for a metric label:
    /// `library_not_loaded`, `not_nvml`, `driver_not_loaded`, `version_mismatch`,
    /// `no_permission`, `library_not_found`, `no_drm_devices`, `other`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::LibraryNotLoaded { .. } => "library_not_loaded",
            Self::InitFailed { code, .. } => code,
            Self::NoDrmDevices { .. } => "no_drm_devices",
        }
    }
}

/// A device-level failure: the whole device could not be read this time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The GPU has fallen off the bus.
    #[error("GPU lost: {0}")]
    Lost(String),
    /// Any other failure to reach the device.
    #[error("{0}")]
    Failed(String),
    /// The library's session no longer works (NVML answers `UNINITIALIZED` or
    /// `DRIVER_NOT_LOADED`: the driver was reloaded or went away). Nothing read through it
    /// will work again; shut it down and start a new one.
    #[error("{0}")]
    SessionLost(String),
}

/// The devices a backend sees.
#[derive(Debug, Clone, Default)]
pub struct Enumeration {
    /// Devices that could be opened, in index order.
    pub devices: Vec<DeviceInfo>,
    /// Devices that were counted but could not be opened.
    pub unopened: Vec<UnopenedDevice>,
}

/// A source of GPU readings.
///
/// The required surface is small on purpose: enumerate once, read each device every tick.
/// Frontends hold a `Sampler<Box<dyn Backend>>` and ask only through this trait, so the
/// same command runs on NVML or on a recorded history (`vramctl_store::replay`).
pub trait Backend: Send {
    /// Versions of the driver stack (cheap: read once at start-up).
    fn driver(&mut self) -> DriverInfo;

    /// The CUDA driver API version as `major.minor`, e.g. `13.0`.
    ///
    /// Separate from [`driver`](Backend::driver) because NVML answers it by loading the CUDA
    /// driver library, which is slow; only commands that show it ask.
    fn cuda_driver_version(&mut self) -> Option<String> {
        None
    }

    /// Devices visible now with their static facts. Called rarely; the sampler caches it.
    ///
    /// # Errors
    /// Only when the device list itself cannot be read; one bad device lands in
    /// [`Enumeration::unopened`] instead.
    fn enumerate(&mut self) -> Result<Enumeration, DeviceError>;

    /// How many devices the driver counts now (cheap; the sampler asks every tick to notice
    /// a device appearing or vanishing).
    ///
    /// # Errors
    /// When the driver cannot be asked.
    fn device_count(&mut self) -> Result<u32, DeviceError>;

    /// Called by the sampler before it reads the devices of one tick, with the tick's time
    /// (the sampler's clock, so simulated time in tests): lets a backend spread a costly
    /// read over ticks (on the monotonic clock) and follow a wall-clock step in what the
    /// driver timestamps.
    fn begin_tick(&mut self, now: ClockTime) {
        let _ = now;
    }

    /// One reading of one device. Fields the device cannot report are `None`.
    ///
    /// # Errors
    /// When the device as a whole cannot be reached (lost, not found).
    fn read(&mut self, device: &DeviceInfo) -> Result<DeviceReading, DeviceError>;

    /// Full hardware diagnostics of one device (`vramctl info`).
    ///
    /// # Errors
    /// When the device as a whole cannot be reached.
    fn diagnostics(&mut self, device: &DeviceInfo) -> Result<DeviceDiagnostics, DeviceError>;

    /// Memory repair state and clock event reasons of one device (`vramctl doctor`);
    /// `None` from a backend that has no such facts (the default).
    ///
    /// # Errors
    /// When the device as a whole cannot be reached.
    fn health(&mut self, device: &DeviceInfo) -> Result<Option<DeviceHealth>, DeviceError> {
        let _ = device;
        Ok(None)
    }

    /// How two devices connect: their PCIe path and P2P support (`vramctl info`, `doctor`);
    /// `None` from a backend that has no such facts (the default) or for two devices it
    /// cannot relate. Each device's own NVLinks are in its [`diagnostics`](Backend::diagnostics).
    ///
    /// # Errors
    /// When either device as a whole cannot be reached.
    fn gpu_pair(
        &mut self,
        first: &DeviceInfo,
        second: &DeviceInfo,
    ) -> Result<Option<PairFacts>, DeviceError> {
        let _ = (first, second);
        Ok(None)
    }

    /// The process name the driver knows for `pid`, used when /proc cannot see the process.
    fn process_name(&mut self, _pid: u32) -> Option<String> {
        None
    }

    /// Also read per-process SM activity (the idle evidence of the recorder, `serve`, `top`,
    /// `leaks --watch` and `reap`), where reading it costs something; a backend that has it
    /// anyway, or never has it, ignores this.
    fn set_read_process_activity(&mut self, on: bool) {
        let _ = on;
    }

    /// Whether a tick may reuse the previous process lists while a device's used memory is
    /// unchanged (NVML's, on by default). Turned off while waiting for a list to change
    /// that the used memory may not show (after a kill: a forked child keeps the memory);
    /// a backend that reads every list every tick, or replays them, ignores this.
    fn set_reuse_process_lists(&mut self, on: bool) {
        let _ = on;
    }

    /// Whether unchanged process lists are reused
    /// ([`set_reuse_process_lists`](Backend::set_reuse_process_lists)); `false` for a
    /// backend that never reuses them.
    fn reuses_process_lists(&self) -> bool {
        false
    }

    /// Whether per-process SM activity is read
    /// ([`set_read_process_activity`](Backend::set_read_process_activity)); `false` for a
    /// backend that ignores the switch.
    fn reads_process_activity(&self) -> bool {
        false
    }

    /// The driver library this backend loaded, for one that loads one (NVML); a daemon
    /// names it so that a client started with another library reads its own.
    fn library(&self) -> Option<&Path> {
        None
    }
}

/// A boxed backend is a backend: frontends choose NVML or a replay at run time.
impl<B: Backend + ?Sized> Backend for Box<B> {
    fn driver(&mut self) -> DriverInfo {
        (**self).driver()
    }

    fn cuda_driver_version(&mut self) -> Option<String> {
        (**self).cuda_driver_version()
    }

    fn enumerate(&mut self) -> Result<Enumeration, DeviceError> {
        (**self).enumerate()
    }

    fn device_count(&mut self) -> Result<u32, DeviceError> {
        (**self).device_count()
    }

    fn begin_tick(&mut self, now: ClockTime) {
        (**self).begin_tick(now);
    }

    fn read(&mut self, device: &DeviceInfo) -> Result<DeviceReading, DeviceError> {
        (**self).read(device)
    }

    fn diagnostics(&mut self, device: &DeviceInfo) -> Result<DeviceDiagnostics, DeviceError> {
        (**self).diagnostics(device)
    }

    fn health(&mut self, device: &DeviceInfo) -> Result<Option<DeviceHealth>, DeviceError> {
        (**self).health(device)
    }

    fn gpu_pair(
        &mut self,
        first: &DeviceInfo,
        second: &DeviceInfo,
    ) -> Result<Option<PairFacts>, DeviceError> {
        (**self).gpu_pair(first, second)
    }

    fn process_name(&mut self, pid: u32) -> Option<String> {
        (**self).process_name(pid)
    }

    fn set_read_process_activity(&mut self, on: bool) {
        (**self).set_read_process_activity(on);
    }

    fn set_reuse_process_lists(&mut self, on: bool) {
        (**self).set_reuse_process_lists(on);
    }

    fn reuses_process_lists(&self) -> bool {
        (**self).reuses_process_lists()
    }

    fn reads_process_activity(&self) -> bool {
        (**self).reads_process_activity()
    }

    fn library(&self) -> Option<&Path> {
        (**self).library()
    }
}

// The contract tests point the fake library at scenarios through the environment
// (`std::env::set_var` is unsafe since edition 2024); a lock serialises them.
#[cfg(test)]
#[allow(unsafe_code)]
pub(crate) mod contract;
