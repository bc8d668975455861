//! The NVML backend: the only module that names `nvml_wrapper`.
//!
//! The library is loaded at run time (`libnvidia-ml.so.1` by default), so the same binary
//! starts on a machine without the driver and says so. One `Nvml` per process: `nvmlInit`
//! costs about 93 ms on an H200, a sample about 100 µs.
//!
//! Errors are data here: a field NVML cannot give becomes `None` plus its reason in
//! `missing`, and only `GPU_IS_LOST` (or a handle that cannot be opened) fails a device.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    Clock, ComputeMode, EccCounter, MemoryError, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;

use super::{Backend, DeviceError, Enumeration, InitError};
use crate::clock::{ClockTime, wall_jump_ms};
use crate::types::{
    ComputeCapability, DeviceDiagnostics, DeviceInfo, DeviceReading, DriverInfo, Field,
    MemoryReading, MigInstanceInfo, MigReading, ProcessActivity, ProcessKind, ProcessUsage,
    Unavailable, UnopenedDevice,
};

/// The library name the driver installs (the unversioned `.so` needs the -dev package).
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// How often `running_*_processes` is retried when processes appear between NVML's count
/// query and the list query (nvml-wrapper leaves 5 spare slots, then gives up).
const PROCESS_LIST_ATTEMPTS: usize = 3;

/// A GPU's MIG slot as found at enumeration.
#[derive(Debug, Clone)]
struct MigSlot {
    slot: u32,
    uuid: String,
}

/// Reads NVIDIA GPUs through NVML.
pub struct NvmlBackend {
    nvml: Nvml,
    library: PathBuf,
    /// MIG slots per GPU index, found at enumeration.
    mig_slots: BTreeMap<u32, Vec<MigSlot>>,
    /// Last per-process utilisation timestamp seen per GPU index (NVML returns samples
    /// newer than the one we pass).
    last_activity_us: BTreeMap<u32, u64>,
    /// Whether per-process activity is read at all.
    read_process_activity: bool,
    /// When per-process activity was last read (monotonic tick time), and whether this
    /// tick reads it.
    last_activity_read_ms: Option<i64>,
    activity_due: bool,
    /// The previous tick's time: a wall-clock step between two ticks moves the driver's
    /// sample timestamps too.
    last_tick: Option<ClockTime>,
}

/// Shortest time between two reads of per-process activity. On an H200
/// `nvmlDeviceGetProcessUtilization` took 1.5 ms, five times every other call of a tick
/// together: read every 100 ms it made the recorder cost 3 % of a core. The driver keeps
/// its samples with their timestamps and we ask for those newer than the last one seen, so
/// reading once a second loses none.
const ACTIVITY_EVERY_MS: i64 = 1000;

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

impl NvmlBackend {
    /// Loads the NVML library (`library`, else [`DEFAULT_LIBRARY`]) and starts NVML.
    ///
    /// # Errors
    /// [`InitError::LibraryNotLoaded`] when the library cannot be opened,
    /// [`InitError::InitFailed`] when `nvmlInit` fails, each with a hint for the user.
    pub fn open(library: Option<&Path>) -> Result<Self, InitError> {
        let path = library.map_or_else(|| PathBuf::from(DEFAULT_LIBRARY), Path::to_path_buf);
        let nvml = timed("dlopen+nvmlInit_v2", || {
            Nvml::builder()
                .lib_path(OsStr::new(path.as_os_str()))
                .init()
        })
        .map_err(|err| match err {
            NvmlError::LibloadingError(load) => InitError::LibraryNotLoaded {
                path: path.clone(),
                reason: strip_path(&load.to_string(), &path),
            },
            NvmlError::FailedToLoadSymbol(symbol) => InitError::InitFailed {
                path: path.clone(),
                reason: strip_path(&symbol, &path),
                hint: "this is not an NVML library; point --nvml-lib at libnvidia-ml.so.1",
                code: "not_nvml",
            },
            other => InitError::InitFailed {
                path: path.clone(),
                reason: describe(&other),
                hint: init_hint(&other),
                code: init_code(&other),
            },
        })?;
        Ok(Self {
            nvml,
            library: path,
            mig_slots: BTreeMap::new(),
            last_activity_us: BTreeMap::new(),
            read_process_activity: false,
            last_activity_read_ms: None,
            activity_due: false,
            last_tick: None,
        })
    }

    /// Also read per-process SM activity, at most once a second of tick time (the idle
    /// evidence of the recorder, `serve`, `top` and `leaks --watch`).
    pub fn set_read_process_activity(&mut self, on: bool) {
        self.read_process_activity = on;
    }

    /// Whether per-process SM activity is read (see
    /// [`set_read_process_activity`](Self::set_read_process_activity)).
    pub fn reads_process_activity(&self) -> bool {
        self.read_process_activity
    }

    /// The library this backend loaded.
    pub fn library(&self) -> &Path {
        &self.library
    }

    fn open_device(&mut self, index: u32) -> Result<DeviceInfo, Unavailable> {
        let device = timed("nvmlDeviceGetHandleByIndex_v2", || {
            self.nvml.device_by_index(index)
        })
        .map_err(|e| unavailable(&e))?;
        let uuid = timed("nvmlDeviceGetUUID", || device.uuid()).map_err(|e| unavailable(&e))?;
        let name = timed("nvmlDeviceGetName", || device.name()).ok();
        let pci_bus_id = timed("nvmlDeviceGetPciInfo_v3", || device.pci_info())
            .ok()
            .map(|pci| pci.bus_id);
        let minor_number = timed("nvmlDeviceGetMinorNumber", || device.minor_number()).ok();
        let mig_enabled = timed("nvmlDeviceGetMigMode", || device.mig_mode())
            .ok()
            .map(|mode| mode.current == 1);
        let mut slots = Vec::new();
        let mut mig_instances = Vec::new();
        if mig_enabled == Some(true) {
            let max = device.mig_device_count().unwrap_or(0);
            for slot in 0..max {
                // Empty slots answer NOT_FOUND.
                let Ok(mig) = device.mig_device_by_index(slot) else {
                    continue;
                };
                let Ok(mig_uuid) = mig.uuid() else { continue };
                mig_instances.push(MigInstanceInfo {
                    uuid: mig_uuid.clone(),
                    name: mig.name().ok(),
                    gpu_instance_id: raw::gpu_instance_id(&self.nvml, &mig),
                    compute_instance_id: raw::compute_instance_id(&self.nvml, &mig),
                });
                slots.push(MigSlot {
                    slot,
                    uuid: mig_uuid,
                });
            }
        }
        self.mig_slots.insert(index, slots);
        Ok(DeviceInfo {
            index,
            uuid,
            name,
            pci_bus_id,
            minor_number,
            mig_enabled,
            mig_instances,
        })
    }
}

impl Backend for NvmlBackend {
    fn driver(&mut self) -> DriverInfo {
        DriverInfo {
            driver_version: timed("nvmlSystemGetDriverVersion", || {
                self.nvml.sys_driver_version()
            })
            .ok(),
            nvml_version: timed("nvmlSystemGetNVMLVersion", || self.nvml.sys_nvml_version()).ok(),
            // Slow to read (NVML loads libcuda); see `cuda_driver_version`.
            cuda_driver_version: None,
        }
    }

    fn cuda_driver_version(&mut self) -> Option<String> {
        timed("nvmlSystemGetCudaDriverVersion_v2", || {
            self.nvml.sys_cuda_driver_version()
        })
        .ok()
        // NVML encodes 13.0 as 13000.
        .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
    }

    fn device_count(&mut self) -> Result<u32, DeviceError> {
        timed("nvmlDeviceGetCount_v2", || self.nvml.device_count()).map_err(device_error)
    }

    fn enumerate(&mut self) -> Result<Enumeration, DeviceError> {
        let count = self.nvml.device_count().map_err(device_error)?;
        let mut enumeration = Enumeration::default();
        self.mig_slots.clear();
        for index in 0..count {
            match self.open_device(index) {
                Ok(info) => enumeration.devices.push(info),
                Err(reason) => enumeration.unopened.push(UnopenedDevice { index, reason }),
            }
        }
        Ok(enumeration)
    }

    fn begin_tick(&mut self, now: ClockTime) {
        // The driver stamps its utilisation samples with the wall clock (µs since the
        // epoch). After a step back, every new sample is older than the newest one seen
        // and the driver would answer "no samples" until the wall clock caught up; after a
        // step forward nothing is lost, but moving the mark keeps the two in step.
        let jump_ms = self.last_tick.map_or(0, |last| wall_jump_ms(last, now));
        self.last_tick = Some(now);
        if jump_ms != 0 {
            let jump_us = jump_ms.saturating_mul(1000);
            for last in self.last_activity_us.values_mut() {
                *last = last.saturating_add_signed(jump_us);
            }
        }
        // The cadence is on the monotonic clock, which does not step.
        let t = now.monotonic_ms;
        self.activity_due = self.read_process_activity
            && self
                .last_activity_read_ms
                .is_none_or(|last| t < last || t - last >= ACTIVITY_EVERY_MS);
        if self.activity_due {
            self.last_activity_read_ms = Some(t);
        }
    }

    fn read(&mut self, info: &DeviceInfo) -> Result<DeviceReading, DeviceError> {
        // Borrow only `self.nvml`, so the per-device bookkeeping below stays writable.
        let device = self
            .nvml
            .device_by_index(info.index)
            .map_err(device_error)?;
        let mut reading = DeviceReading::default();
        let missing = &mut reading.missing;

        reading.memory = field(
            missing,
            Field::Memory,
            timed("nvmlDeviceGetMemoryInfo_v2", || device.memory_info()),
        )?
        .map(|m| MemoryReading {
            total_bytes: m.total,
            used_bytes: m.used,
            reserved_bytes: m.reserved,
            free_bytes: m.free,
        });
        if let Some(util) = field(
            missing,
            Field::Utilization,
            timed("nvmlDeviceGetUtilizationRates", || {
                device.utilization_rates()
            }),
        )? {
            reading.utilization_gpu_percent = Some(util.gpu);
            reading.utilization_memory_percent = Some(util.memory);
        }
        reading.temperature_c = field(
            missing,
            Field::Temperature,
            timed("nvmlDeviceGetTemperature", || {
                device.temperature(TemperatureSensor::Gpu)
            }),
        )?;
        reading.power_mw = field(
            missing,
            Field::Power,
            timed("nvmlDeviceGetPowerUsage", || device.power_usage()),
        )?;

        let compute = field(
            missing,
            Field::ComputeProcesses,
            timed("nvmlDeviceGetComputeRunningProcesses", || {
                with_retries(|| device.running_compute_processes())
            }),
        )?;
        let graphics = field(
            missing,
            Field::GraphicsProcesses,
            timed("nvmlDeviceGetGraphicsRunningProcesses", || {
                with_retries(|| device.running_graphics_processes())
            }),
        )?;
        reading.processes = merge_process_lists(compute, graphics);

        if self.activity_due {
            let last = self.last_activity_us.get(&info.index).copied().unwrap_or(0);
            match timed("nvmlDeviceGetProcessUtilization", || {
                device.process_utilization_stats(last)
            }) {
                Ok(samples) => {
                    if let Some(newest) = samples.iter().map(|s| s.timestamp).max() {
                        self.last_activity_us.insert(info.index, newest);
                    }
                    // Up to a second of samples: one entry per process, its busiest, so
                    // any activity since the last read counts.
                    let mut busiest: BTreeMap<u32, ProcessActivity> = BTreeMap::new();
                    for s in samples {
                        let a = busiest.entry(s.pid).or_insert(ProcessActivity {
                            pid: s.pid,
                            sm_percent: 0,
                            memory_percent: 0,
                        });
                        a.sm_percent = a.sm_percent.max(s.sm_util);
                        a.memory_percent = a.memory_percent.max(s.mem_util);
                    }
                    reading.process_activity = Some(busiest.into_values().collect());
                }
                // NOT_FOUND: no samples newer than `last`; the H200 answers this even for
                // busy processes, so it is "no evidence", not "idle".
                Err(NvmlError::NotFound) => {
                    reading.missing.insert(
                        Field::ProcessUtilization,
                        Unavailable::Error("the driver returned no samples".into()),
                    );
                }
                Err(NvmlError::GpuLost) => {
                    return Err(DeviceError::Lost(describe(&NvmlError::GpuLost)));
                }
                Err(other) => {
                    reading
                        .missing
                        .insert(Field::ProcessUtilization, unavailable(&other));
                }
            }
        }

        let slots = self.mig_slots.get(&info.index).cloned().unwrap_or_default();
        for MigSlot { slot, uuid } in slots {
            let memory = device
                .mig_device_by_index(slot)
                .and_then(|mig| mig.memory_info());
            let memory = field(&mut reading.missing, Field::MigMemory, memory)?;
            reading.mig.push(MigReading {
                uuid,
                memory: memory.map(|m| MemoryReading {
                    total_bytes: m.total,
                    used_bytes: m.used,
                    reserved_bytes: m.reserved,
                    free_bytes: m.free,
                }),
            });
        }
        Ok(reading)
    }

    fn diagnostics(&mut self, info: &DeviceInfo) -> Result<DeviceDiagnostics, DeviceError> {
        let device = self
            .nvml
            .device_by_index(info.index)
            .map_err(device_error)?;
        let mut d = DeviceDiagnostics::default();
        let m = &mut d.missing;
        d.brand = diag(m, "brand", device.brand())?.map(|b| brand_name(&b));
        d.architecture = diag(m, "architecture", device.architecture())?.map(|a| a.to_string());
        d.compute_capability = diag(m, "compute_capability", device.cuda_compute_capability())?
            .map(|cc| ComputeCapability {
                major: cc.major,
                minor: cc.minor,
            });
        d.serial = diag(m, "serial", device.serial())?;
        d.vbios_version = diag(m, "vbios_version", device.vbios_version())?;
        d.board_part_number = diag(m, "board_part_number", device.board_part_number())?;
        if let Some(pci) = diag(m, "pci", device.pci_info())? {
            d.pci_device_id = Some(pci.pci_device_id);
            d.pci_subsystem_id = pci.pci_sub_system_id;
        }
        d.memory = diag(m, "memory", device.memory_info())?.map(|mem| MemoryReading {
            total_bytes: mem.total,
            used_bytes: mem.used,
            reserved_bytes: mem.reserved,
            free_bytes: mem.free,
        });
        d.memory_bus_width_bits = diag(m, "memory_bus_width", device.memory_bus_width())?;
        d.max_memory_clock_mhz = diag(m, "max_memory_clock", device.max_clock_info(Clock::Memory))?;
        d.memory_clock_mhz = diag(m, "memory_clock", device.clock_info(Clock::Memory))?;
        d.max_sm_clock_mhz = diag(m, "max_sm_clock", device.max_clock_info(Clock::SM))?;
        d.pcie_gen_current = diag(m, "pcie_gen_current", device.current_pcie_link_gen())?;
        d.pcie_gen_max = diag(m, "pcie_gen_max", device.max_pcie_link_gen())?;
        d.pcie_width_current = diag(m, "pcie_width_current", device.current_pcie_link_width())?;
        d.pcie_width_max = diag(m, "pcie_width_max", device.max_pcie_link_width())?;
        if let Some(bar1) = diag(m, "bar1", device.bar1_memory_info())? {
            d.bar1_total_bytes = Some(bar1.total);
            d.bar1_used_bytes = Some(bar1.used);
        }
        if let Some(ecc) = diag(m, "ecc_mode", device.is_ecc_enabled())? {
            d.ecc_enabled = Some(ecc.currently_enabled);
            d.ecc_pending = Some(ecc.pending_enabled);
        }
        // Error counters only mean something with ECC on; NVML answers NOT_SUPPORTED otherwise.
        d.ecc_corrected_volatile = diag(
            m,
            "ecc_corrected_volatile",
            device.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile),
        )?;
        d.ecc_uncorrected_volatile = diag(
            m,
            "ecc_uncorrected_volatile",
            device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
        )?;
        d.ecc_corrected_aggregate = diag(
            m,
            "ecc_corrected_aggregate",
            device.total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate),
        )?;
        d.ecc_uncorrected_aggregate = diag(
            m,
            "ecc_uncorrected_aggregate",
            device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate),
        )?;
        d.persistence_mode = diag(m, "persistence_mode", device.is_in_persistent_mode())?;
        d.compute_mode = diag(m, "compute_mode", device.compute_mode())?.map(compute_mode_name);
        if let Some(mig) = diag(m, "mig_mode", device.mig_mode())? {
            d.mig_current = Some(mig.current == 1);
            d.mig_pending = Some(mig.pending == 1);
        }
        d.power_limit_mw = diag(m, "power_limit", device.power_management_limit())?;
        d.enforced_power_limit_mw = diag(m, "enforced_power_limit", device.enforced_power_limit())?;
        d.default_power_limit_mw = diag(
            m,
            "default_power_limit",
            device.power_management_limit_default(),
        )?;
        d.temperature_c = diag(m, "temperature", device.temperature(TemperatureSensor::Gpu))?;
        d.temperature_shutdown_c = diag(
            m,
            "temperature_shutdown",
            device.temperature_threshold(TemperatureThreshold::Shutdown),
        )?;
        d.temperature_slowdown_c = diag(
            m,
            "temperature_slowdown",
            device.temperature_threshold(TemperatureThreshold::Slowdown),
        )?;
        d.temperature_gpu_max_c = diag(
            m,
            "temperature_gpu_max",
            device.temperature_threshold(TemperatureThreshold::GpuMax),
        )?;
        d.temperature_memory_max_c = diag(
            m,
            "temperature_memory_max",
            device.temperature_threshold(TemperatureThreshold::MemoryMax),
        )?;
        d.performance_state = diag(m, "performance_state", device.performance_state())?
            .map(|p| format!("P{}", p.as_c()));
        Ok(d)
    }

    fn process_name(&mut self, pid: u32) -> Option<String> {
        // 256 bytes is what nvidia-smi shows; longer names are truncated by NVML.
        self.nvml
            .sys_process_name(pid, 256)
            .ok()
            .filter(|name| !name.is_empty())
    }
}

/// Runs one NVML call and logs its duration at trace level (`VRAMCTL_LOG=trace`): start-up
/// cost is dominated by a few first calls, and this is how we find which.
fn timed<T>(call: &'static str, f: impl FnOnce() -> T) -> T {
    let started = std::time::Instant::now();
    let result = f();
    tracing::trace!(call, us = started.elapsed().as_micros(), "NVML call.");
    result
}

/// Calls that ask NVML for its process list retry when processes appeared between the
/// count query and the list query.
fn with_retries(
    mut call: impl FnMut() -> Result<Vec<ProcessInfo>, NvmlError>,
) -> Result<Vec<ProcessInfo>, NvmlError> {
    let mut result = call();
    for _ in 1..PROCESS_LIST_ATTEMPTS {
        match result {
            Err(NvmlError::InsufficientSize(_)) => result = call(),
            _ => break,
        }
    }
    result
}

fn merge_process_lists(
    compute: Option<Vec<ProcessInfo>>,
    graphics: Option<Vec<ProcessInfo>>,
) -> Option<Vec<ProcessUsage>> {
    if compute.is_none() && graphics.is_none() {
        return None;
    }
    let mut merged: Vec<ProcessUsage> = Vec::new();
    let lists = [
        (ProcessKind::Compute, compute),
        (ProcessKind::Graphics, graphics),
    ];
    for (kind, list) in lists {
        for p in list.into_iter().flatten() {
            let used_bytes = match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes),
                UsedGpuMemory::Unavailable => None,
            };
            // A process with both contexts is listed twice with its one total.
            if let Some(existing) = merged.iter_mut().find(|e| {
                e.pid == p.pid
                    && e.gpu_instance_id == p.gpu_instance_id
                    && e.compute_instance_id == p.compute_instance_id
            }) {
                if existing.kind != kind {
                    existing.kind = ProcessKind::ComputeAndGraphics;
                }
                existing.used_bytes = existing.used_bytes.max(used_bytes);
                continue;
            }
            merged.push(ProcessUsage {
                pid: p.pid,
                used_bytes,
                kind,
                gpu_instance_id: p.gpu_instance_id,
                compute_instance_id: p.compute_instance_id,
            });
        }
    }
    Some(merged)
}

/// Turns one field's NVML answer into `Some(value)` or `None` with its reason, and a lost
/// GPU into a device-level error (nothing else on that device will answer either).
fn field<T>(
    missing: &mut BTreeMap<Field, Unavailable>,
    name: Field,
    result: Result<T, NvmlError>,
) -> Result<Option<T>, DeviceError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(NvmlError::GpuLost) => Err(DeviceError::Lost(describe(&NvmlError::GpuLost))),
        Err(err @ (NvmlError::Uninitialized | NvmlError::DriverNotLoaded)) => {
            Err(DeviceError::SessionLost(describe(&err)))
        }
        Err(err) => {
            missing.insert(name, unavailable(&err));
            Ok(None)
        }
    }
}

fn diag<T>(
    missing: &mut BTreeMap<String, Unavailable>,
    name: &str,
    result: Result<T, NvmlError>,
) -> Result<Option<T>, DeviceError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(NvmlError::GpuLost) => Err(DeviceError::Lost(describe(&NvmlError::GpuLost))),
        Err(err) => {
            missing.insert(name.to_owned(), unavailable(&err));
            Ok(None)
        }
    }
}

fn unavailable(err: &NvmlError) -> Unavailable {
    match err {
        // A symbol missing from an older driver is a capability this driver lacks.
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) => Unavailable::NotSupported,
        NvmlError::NoPermission => Unavailable::NoPermission,
        NvmlError::GpuLost => Unavailable::GpuLost,
        other => Unavailable::Error(describe(other)),
    }
}

fn device_error(err: NvmlError) -> DeviceError {
    match err {
        NvmlError::GpuLost => DeviceError::Lost(describe(&err)),
        // The session is gone (a driver reloaded under us): only a new one helps.
        NvmlError::Uninitialized | NvmlError::DriverNotLoaded => {
            DeviceError::SessionLost(describe(&err))
        }
        other => DeviceError::Failed(describe(&other)),
    }
}

/// nvml-wrapper's messages may end in a period; ours do not. They are already lower case
/// except where they start with a name (`NVIDIA driver is not loaded`, `RM detects ...`,
/// `NVML was ...`), which keeps its capitals: only a capitalised ordinary word (`The`) is
/// lowered.
fn describe(err: &NvmlError) -> String {
    let text = err.to_string();
    let text = text.trim_end_matches('.');
    let mut chars = text.chars();
    match (chars.next(), chars.clone().next()) {
        (None, _) => "unknown NVML error".into(),
        (Some(first), Some(second)) if first.is_uppercase() && second.is_lowercase() => {
            first.to_lowercase().chain(chars).collect()
        }
        (Some(_), _) => text.to_owned(),
    }
}

/// dlerror() repeats the path we already print: `/x/lib.so: undefined symbol: nvmlInit_v2`.
fn strip_path(message: &str, path: &Path) -> String {
    let prefix = format!("{}: ", path.display());
    message.strip_prefix(&prefix).unwrap_or(message).to_owned()
}

fn init_code(err: &NvmlError) -> &'static str {
    match err {
        NvmlError::DriverNotLoaded => "driver_not_loaded",
        NvmlError::LibRmVersionMismatch => "version_mismatch",
        NvmlError::NoPermission => "no_permission",
        NvmlError::LibraryNotFound => "library_not_found",
        _ => "other",
    }
}

fn init_hint(err: &NvmlError) -> &'static str {
    match err {
        NvmlError::DriverNotLoaded => {
            "the NVIDIA kernel module is not loaded: load it (modprobe nvidia) or reboot"
        }
        NvmlError::LibRmVersionMismatch => {
            "the NVML library and the loaded kernel module are different versions, usually after \
             a driver upgrade: reboot, or reload the nvidia kernel modules"
        }
        NvmlError::NoPermission => {
            "this user may not open /dev/nvidia*: run as a user in the group that owns them"
        }
        NvmlError::LibraryNotFound => "install the NVIDIA driver's user-space libraries",
        _ => "check the driver with nvidia-smi; 'dmesg | grep -i nvrm' shows kernel-side errors",
    }
}

fn brand_name(brand: &nvml_wrapper::enum_wrappers::device::Brand) -> String {
    use nvml_wrapper::enum_wrappers::device::Brand;
    match brand {
        Brand::Nvidia => "NVIDIA".into(),
        Brand::NvidiaRTX => "NVIDIA RTX".into(),
        Brand::GeForceRTX => "GeForce RTX".into(),
        Brand::QuadroRTX => "Quadro RTX".into(),
        Brand::TitanRTX => "Titan RTX".into(),
        other => format!("{other:?}"),
    }
}

fn compute_mode_name(mode: ComputeMode) -> String {
    match mode {
        ComputeMode::Default => "Default".into(),
        ComputeMode::ExclusiveThread => "Exclusive_Thread".into(),
        ComputeMode::Prohibited => "Prohibited".into(),
        ComputeMode::ExclusiveProcess => "Exclusive_Process".into(),
    }
}

/// NVML calls nvml-wrapper does not wrap.
#[allow(unsafe_code)]
mod raw {
    use std::os::raw::c_uint;

    use nvml_wrapper::{Device, Nvml};
    use nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS;

    /// `nvmlDeviceGetGpuInstanceId` on a MIG device handle.
    pub(super) fn gpu_instance_id(nvml: &Nvml, device: &Device<'_>) -> Option<u32> {
        let call = nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref().ok()?;
        let mut id: c_uint = 0;
        // SAFETY: the handle comes from a live `Device` of this `Nvml` session and `id` is
        // a valid out-pointer for the duration of the call.
        let status = unsafe { call(device.handle(), &mut id) };
        (status == nvmlReturn_enum_NVML_SUCCESS).then_some(id)
    }

    /// `nvmlDeviceGetComputeInstanceId` on a MIG device handle.
    pub(super) fn compute_instance_id(nvml: &Nvml, device: &Device<'_>) -> Option<u32> {
        let call = nvml.lib().nvmlDeviceGetComputeInstanceId.as_ref().ok()?;
        let mut id: c_uint = 0;
        // SAFETY: as above.
        let status = unsafe { call(device.handle(), &mut id) };
        (status == nvmlReturn_enum_NVML_SUCCESS).then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pid: u32, used: UsedGpuMemory) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: used,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn a_process_in_both_lists_is_listed_once() {
        let merged = merge_process_lists(
            Some(vec![
                info(10, UsedGpuMemory::Used(100)),
                info(11, UsedGpuMemory::Used(5)),
            ]),
            Some(vec![
                info(10, UsedGpuMemory::Used(100)),
                info(12, UsedGpuMemory::Unavailable),
            ]),
        )
        .unwrap();
        assert_eq!(merged.len(), 3);
        assert_eq!(merged[0].kind, ProcessKind::ComputeAndGraphics);
        assert_eq!(merged[0].used_bytes, Some(100));
        assert_eq!(merged[2].used_bytes, None);
        assert_eq!(merged[2].kind, ProcessKind::Graphics);
    }

    #[test]
    fn no_list_at_all_is_none_not_empty() {
        assert_eq!(merge_process_lists(None, None), None);
        assert_eq!(merge_process_lists(Some(vec![]), None), Some(vec![]));
    }

    #[test]
    fn messages_follow_house_style() {
        assert_eq!(
            describe(&NvmlError::GpuLost)
                .chars()
                .next()
                .map(char::is_lowercase),
            Some(true)
        );
        assert!(!describe(&NvmlError::NotSupported).ends_with('.'));
    }

    #[test]
    fn driver_messages_keep_the_names_they_start_with() {
        assert_eq!(
            describe(&NvmlError::DriverNotLoaded),
            "NVIDIA driver is not loaded"
        );
        assert_eq!(
            describe(&NvmlError::LibRmVersionMismatch),
            "RM detects a driver/library version mismatch"
        );
        assert_eq!(
            describe(&NvmlError::Uninitialized),
            "NVML was not first initialized with `Nvml::init()`"
        );
    }

    #[test]
    fn missing_library_is_library_not_loaded() {
        let err = NvmlBackend::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).unwrap_err();
        assert!(matches!(err, InitError::LibraryNotLoaded { .. }), "{err:?}");
        assert!(err.to_string().contains("/nonexistent/libnvidia-ml.so.1"));
    }
}
