//! The NVML backend: the only module that names `nvml_wrapper`.
//!
//! The library is loaded at run time (`libnvidia-ml.so.1` by default), so the same binary
//! starts on a machine without the driver and says so. One `Nvml` per process: `nvmlInit`
//! costs about 93 ms on an H200, a sample about 100 µs.
//!
//! Errors are data here: a field NVML cannot give becomes `None` plus its reason in
//! `missing`, and only `GPU_IS_LOST` (or a handle that cannot be opened) fails a device.
//!
//! # What a tick costs, and what it reads
//!
//! Every NVML call is a driver ioctl. On the H200 we measured (a sandboxed kernel, where an
//! ioctl is dear; `testdata/h200/leakset/cost.txt`) beside 37 processes: the compute
//! process list 1.6 ms per driver call, the graphics list 2.1 ms, per-process utilization
//! 2.3 ms, device memory 0.22 ms, utilization, power, temperature and the device count
//! 5–24 µs each. Reading both lists each tick the nvml-wrapper way (a count query, then the
//! list) made `record --interval 100ms` cost 6 % of a core. So a tick reads only what can
//! have changed:
//!
//! - **Device readings** (memory, utilization, temperature, power): every tick; they are
//!   what a tick is for, and cheap.
//! - **Process lists**: one driver call per list ([`read_process_list`]: a buffer sized
//!   from the last count, the count query only when the driver says the buffer was too
//!   small), and only when the device's used memory differs from what it was when the
//!   lists were last read, or [`LISTS_STALE_AFTER_MS`] passed ([`ListsRead`]).
//! - **Per-process utilization**: at most once a second, only when it can be evidence the
//!   device's utilization is not, and less often while the driver keeps answering that it
//!   has no samples ([`ActivityPace`]).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use nvml_wrapper::enum_wrappers::device::{
    Clock, ComputeMode, EccCounter, MemoryError, RetirementCause, TemperatureSensor,
    TemperatureThreshold,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};

use super::{Backend, DeviceError, Enumeration, InitError};
use vramctl_core::clock::{ClockTime, wall_jump_ms};
use vramctl_core::topology::PairFacts;
use vramctl_core::types::{
    ComputeCapability, DeviceDiagnostics, DeviceHealth, DeviceInfo, DeviceReading, DriverInfo,
    Field, MemoryReading, MigInstanceInfo, MigReading, ProcessActivity, ProcessKind, ProcessUsage,
    Unavailable, UnopenedDevice,
};

mod links;

/// The library name the driver installs (the unversioned `.so` needs the -dev package).
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// How many calls one process-list read may take when processes keep appearing between a
/// call that said "too small" (with the count it needs) and the next: each retry's buffer is
/// sized from the newest count plus headroom, so a third call is already a rare race.
const PROCESS_LIST_ATTEMPTS: usize = 3;

/// The longest time an unchanged pair of process lists is reused before it is read again.
///
/// A process that starts (its CUDA context alone is about 0.5 GiB on an H200), exits (the
/// driver frees what it held) or allocates or frees changes the device's used memory, which
/// is read every tick; the lists are read again whenever it changed. What the used memory
/// cannot show is a change that leaves the total exactly equal: one process freeing what
/// another allocates within one tick, to the byte, or a process that exits while a forked
/// child keeps its memory (it leaves the list, the memory stays used). This bound is how
/// long such a list can be stale. 10 s: a forced read costs about 3.7 ms on the H200 (both
/// lists, one call each), 0.04 % of a core, which keeps the goal of 0.2 % at `--interval 1s`
/// (a bound of 1 s would cost 0.37 % alone); and 10 s is the finest time scale of what the
/// history and the analysis make of a process's list entry besides its memory (its CPU time
/// and identity are recorded every 10 s, idle evidence is judged over windows of at least
/// 10 s and verdicts over minutes). Chosen on the H200's call costs (cost.txt, commit
/// cf07507); checked by `scripts/bench-recorder-h200.sh` (`docs/benchmarks.md`).
pub const LISTS_STALE_AFTER_MS: i64 = 10_000;

/// Shortest time between two reads of per-process activity. On an H200
/// `nvmlDeviceGetProcessUtilization` took 1.5 ms, five times every other call of a tick
/// together: read every 100 ms it made the recorder cost 3 % of a core. The driver keeps
/// its samples with their timestamps and we ask for those newer than the last one seen, so
/// reading once a second loses none.
const ACTIVITY_EVERY_MS: i64 = 1000;

/// Longest time between two reads of per-process activity while the driver answers that it
/// has no samples (NOT_FOUND, as the H200 did for 30 busy processes nearly every time; or
/// another error such as NOT_SUPPORTED): the wait doubles from [`ACTIVITY_EVERY_MS`] up to
/// this, and a read that brings samples goes back to once a second. Also the longest time
/// between two reads on a device with processes whatever its utilization said (the floor,
/// [`ActivityPace::wants`]). 10 s keeps consecutive samples far inside the analysis's 60 s
/// `max_evidence_gap` (so a span of per-process evidence stays unbroken) and costs 2.3 ms
/// per 10 s on the H200 (0.02 % of a core). Chosen on the H200 trace (cost.txt); checked by
/// the H200 benchmark.
const ACTIVITY_BACKOFF_MAX_MS: i64 = 10_000;

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
    /// What the previous ticks read per GPU index: the process lists to reuse, the size of
    /// the next list buffer, the per-process activity pace. Cleared at enumeration.
    devices: BTreeMap<u32, DeviceMemo>,
    /// The device count the driver gave last: when it changes, no list is reused.
    device_count: Option<u32>,
    /// Whether per-process activity is read at all.
    read_process_activity: bool,
    /// Whether unchanged process lists are reused (on by default; see [`ListsRead`]).
    reuse_process_lists: bool,
    /// The current tick's time, from [`Backend::begin_tick`]: the previous one until the
    /// next begins (a wall-clock step between two ticks moves the driver's sample
    /// timestamps too). Without a tick time nothing is reused and no activity is read.
    last_tick: Option<ClockTime>,
}

/// What one GPU's previous ticks left for the next.
#[derive(Debug, Default)]
struct DeviceMemo {
    /// The GPU these facts are about: an index that names another GPU starts afresh.
    uuid: String,
    /// Entries the compute list had at its last read (sizes the next buffer).
    compute_len: u32,
    /// The same for the graphics list.
    graphics_len: u32,
    /// The lists as last read, while they may be reused.
    lists: Option<ListsRead>,
    activity: ActivityPace,
}

/// Both process lists of a device as read at one tick, and what they were read against.
///
/// Reused while the device's used memory (v2 `used`, read every tick; in MIG mode each MIG
/// device's too) is what it was at that read and less than [`LISTS_STALE_AFTER_MS`] have
/// passed (tick time, monotonic); the device count changing or a re-enumeration drops it.
/// Only answers that do not change from one call to the next are kept: a list, or
/// NOT_SUPPORTED / NO_PERMISSION; any other error is asked again the next tick.
#[derive(Debug, Clone)]
struct ListsRead {
    /// [`memory_key`] at the read.
    used: Vec<Option<u64>>,
    at_ms: i64,
    processes: Option<Vec<ProcessUsage>>,
    /// The lists' reasons in `missing` (a list the driver refused).
    missing: Vec<(Field, Unavailable)>,
}

impl ListsRead {
    fn reusable(&self, used: Option<&[Option<u64>]>, now_ms: i64) -> bool {
        used == Some(self.used.as_slice())
            && now_ms >= self.at_ms
            && now_ms - self.at_ms < LISTS_STALE_AFTER_MS
    }
}

/// What must be unchanged for the process lists to be reused: the device's used memory and,
/// in MIG mode, each MIG device's (a driver that does not add them into the parent's would
/// otherwise hide a process starting in one). `None` without the device's used memory:
/// then nothing says the lists are unchanged.
fn memory_key(reading: &DeviceReading) -> Option<Vec<Option<u64>>> {
    let device = reading.memory?.used_bytes;
    Some(
        std::iter::once(Some(device))
            .chain(reading.mig.iter().map(|m| m.memory.map(|m| m.used_bytes)))
            .collect(),
    )
}

/// When per-process activity (`nvmlDeviceGetProcessUtilization`) is read on one device.
///
/// The idle analysis (`analysis::idle`) takes three sources: per-process SM activity, the
/// device's utilization (0 %: every process on it was idle; above 0 % while the process is
/// alone: that process was active) and CPU time. Per-process activity adds something only
/// where the device's utilization cannot say whose activity it was: utilization above 0 %
/// with more than one process on the device, or a device that reports no utilization (MIG
/// mode). So it is read when, since its last read, a tick saw such a device (the driver's
/// samples since then hold that activity); otherwise the device's own utilization already
/// is the evidence. The floor: at least every [`ACTIVITY_BACKOFF_MAX_MS`] while the device
/// has processes, whatever the utilization said, because the utilization covers only the
/// driver's sample window before each tick and a short burst between two 1 s ticks shows
/// only in the per-process samples.
#[derive(Debug, Default)]
struct ActivityPace {
    /// The newest sample's timestamp seen (µs, the driver's wall clock): the driver answers
    /// samples newer than the one passed.
    last_sample_us: u64,
    /// Tick time of the last read.
    last_read_ms: Option<i64>,
    /// Current wait between reads: [`ACTIVITY_EVERY_MS`], doubling while the driver has no
    /// samples (0 before the first read).
    wait_ms: i64,
    /// A tick since the last read saw the device busy with more than one process on it, or
    /// with processes and no utilization to go by.
    busy_since_read: bool,
}

impl ActivityPace {
    /// Whether to read per-process activity at `now_ms`, the device showing `utilization`
    /// (`None`: not reported) with `processes` on it (`None`: no list).
    fn wants(&mut self, now_ms: i64, utilization: Option<u32>, processes: Option<usize>) -> bool {
        let any = processes.is_none_or(|n| n > 0);
        let shared = processes.is_none_or(|n| n > 1);
        let evidence = match utilization {
            None => any,
            Some(0) => false,
            Some(_) => shared,
        };
        self.busy_since_read |= evidence;
        let since = self
            .last_read_ms
            .map(|last| now_ms.checked_sub(last).filter(|d| *d >= 0));
        let (due, floor) = match since {
            // Never read, or the tick time went back: read now if anything is there.
            None | Some(None) => (true, true),
            Some(Some(d)) => (
                d >= self.wait_ms.max(ACTIVITY_EVERY_MS),
                d >= ACTIVITY_BACKOFF_MAX_MS,
            ),
        };
        due && any && (self.busy_since_read || floor)
    }

    /// After a read at `now_ms`: whether it brought samples.
    fn read(&mut self, now_ms: i64, had_samples: bool) {
        self.last_read_ms = Some(now_ms);
        self.busy_since_read = false;
        self.wait_ms = if had_samples {
            ACTIVITY_EVERY_MS
        } else {
            self.wait_ms
                .max(ACTIVITY_EVERY_MS)
                .saturating_mul(2)
                .min(ACTIVITY_BACKOFF_MAX_MS)
        };
    }
}

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
            devices: BTreeMap::new(),
            device_count: None,
            read_process_activity: false,
            reuse_process_lists: true,
            last_tick: None,
        })
    }

    /// Also read per-process SM activity, at most once a second of tick time and only when
    /// it can be evidence (the idle evidence of the recorder, `serve`, `top` and
    /// `leaks --watch`; see [`ActivityPace`]).
    pub fn set_read_process_activity(&mut self, on: bool) {
        self.read_process_activity = on;
    }

    /// Whether a tick may reuse the previous process lists while the device's used memory
    /// is unchanged (on by default, up to [`LISTS_STALE_AFTER_MS`]). Turn it off while
    /// waiting for a list to change that the used memory may not show: after a kill, a
    /// target whose forked child keeps its memory leaves the list and the memory stays.
    pub fn set_reuse_process_lists(&mut self, on: bool) {
        self.reuse_process_lists = on;
    }

    /// Whether unchanged process lists are reused ([`set_reuse_process_lists`](Self::set_reuse_process_lists)).
    pub fn reuses_process_lists(&self) -> bool {
        self.reuse_process_lists
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
        let count =
            timed("nvmlDeviceGetCount_v2", || self.nvml.device_count()).map_err(device_error)?;
        // A GPU bound or unbound: the sampler re-enumerates; until then nothing read before
        // is reused.
        if self.device_count.is_some_and(|c| c != count) {
            self.devices.clear();
        }
        self.device_count = Some(count);
        Ok(count)
    }

    fn enumerate(&mut self) -> Result<Enumeration, DeviceError> {
        let count = self.nvml.device_count().map_err(device_error)?;
        let mut enumeration = Enumeration::default();
        self.mig_slots.clear();
        self.devices.clear();
        self.device_count = Some(count);
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
            for memo in self.devices.values_mut() {
                let last = &mut memo.activity.last_sample_us;
                *last = last.saturating_add_signed(jump_us);
            }
        }
    }

    fn read(&mut self, info: &DeviceInfo) -> Result<DeviceReading, DeviceError> {
        // Borrow only `self.nvml`, so the per-device bookkeeping below stays writable.
        let device = timed("nvmlDeviceGetHandleByIndex_v2", || {
            self.nvml.device_by_index(info.index)
        })
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

        // Before the lists: their memory is part of what says whether the lists can have
        // changed.
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

        let now_ms = self.last_tick.map(|t| t.monotonic_ms);
        let memo = self.devices.entry(info.index).or_default();
        if memo.uuid != info.uuid {
            *memo = DeviceMemo {
                uuid: info.uuid.clone(),
                ..DeviceMemo::default()
            };
        }
        let used = memory_key(&reading);
        let reuse = self.reuse_process_lists
            && now_ms.is_some_and(|now| {
                memo.lists
                    .as_ref()
                    .is_some_and(|l| l.reusable(used.as_deref(), now))
            });
        if reuse {
            if let Some(lists) = &memo.lists {
                reading.processes.clone_from(&lists.processes);
                reading.missing.extend(lists.missing.iter().cloned());
            }
        } else {
            // Why, for `VRAMCTL_LOG=crate::backend::nvml=trace` (the benchmark's).
            let why = match &memo.lists {
                _ if !self.reuse_process_lists => "reuse off",
                None => "nothing to reuse",
                Some(l) if used.as_deref() != Some(l.used.as_slice()) => "used memory changed",
                Some(_) => "stale",
            };
            tracing::trace!(gpu = info.index, why, "Reading the process lists.");
            let compute = read_process_list(
                &self.nvml,
                &device,
                ProcessList::Compute,
                &mut memo.compute_len,
            );
            let graphics = read_process_list(
                &self.nvml,
                &device,
                ProcessList::Graphics,
                &mut memo.graphics_len,
            );
            let mut lists_missing = BTreeMap::new();
            let compute = field(&mut lists_missing, Field::ComputeProcesses, compute)?;
            let graphics = field(&mut lists_missing, Field::GraphicsProcesses, graphics)?;
            reading.processes = merge_process_lists(compute, graphics);
            // Keep only answers that stay the same from one call to the next.
            let stable = lists_missing
                .values()
                .all(|u| matches!(u, Unavailable::NotSupported | Unavailable::NoPermission));
            memo.lists = match (now_ms, used) {
                (Some(at_ms), Some(used)) if stable => Some(ListsRead {
                    used,
                    at_ms,
                    processes: reading.processes.clone(),
                    missing: lists_missing.iter().map(|(f, u)| (*f, u.clone())).collect(),
                }),
                _ => None,
            };
            reading.missing.extend(lists_missing);
        }

        let processes_on_device = reading.processes.as_ref().map(Vec::len);
        let activity_wanted = self.read_process_activity
            && now_ms.is_some_and(|now| {
                memo.activity
                    .wants(now, reading.utilization_gpu_percent, processes_on_device)
            });
        if let (true, Some(now)) = (activity_wanted, now_ms) {
            let last = memo.activity.last_sample_us;
            // nvml-wrapper's two calls (the count with no buffer, then the samples) when
            // there are samples, one when there are none (NOT_FOUND, the H200's usual
            // answer). Unlike the process lists, NVML's header does not promise
            // INSUFFICIENT_SIZE for a buffer that is too small here, so we do not guess a
            // size: the pacing above is what keeps this call rare.
            let answer = timed("nvmlDeviceGetProcessUtilization", || {
                device.process_utilization_stats(last)
            });
            let had_samples = matches!(&answer, Ok(samples) if !samples.is_empty());
            memo.activity.read(now, had_samples);
            match answer {
                Ok(samples) => {
                    if let Some(newest) = samples.iter().map(|s| s.timestamp).max() {
                        memo.activity.last_sample_us = newest;
                    }
                    // The samples since the last read (1 to 10 s of them, as paced): one
                    // entry per process, its busiest, so any activity since then counts.
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
        d.nvlinks = links::read_links(&self.nvml, &device, m)?;
        Ok(d)
    }

    fn health(&mut self, info: &DeviceInfo) -> Result<Option<DeviceHealth>, DeviceError> {
        let device = self
            .nvml
            .device_by_index(info.index)
            .map_err(device_error)?;
        let mut h = DeviceHealth::default();
        let m = &mut h.missing;
        // Only the counts matter here; nvml-wrapper's call also fetches the addresses.
        let count = |pages: Vec<_>| u32::try_from(pages.len()).unwrap_or(u32::MAX);
        h.retired_pages_single_bit = diag(
            m,
            "retired_pages_single_bit",
            device.retired_pages(RetirementCause::MultipleSingleBitEccErrors),
        )?
        .map(count);
        h.retired_pages_double_bit = diag(
            m,
            "retired_pages_double_bit",
            device.retired_pages(RetirementCause::DoubleBitEccError),
        )?
        .map(count);
        h.retired_pages_pending = diag(
            m,
            "retired_pages_pending",
            device.are_pages_pending_retired(),
        )?;
        if let Some(rows) = diag(
            m,
            "remapped_rows",
            timed("nvmlDeviceGetRemappedRows", || {
                raw::remapped_rows(&self.nvml, &device)
            }),
        )? {
            h.remapped_rows_correctable = Some(rows.correctable);
            h.remapped_rows_uncorrectable = Some(rows.uncorrectable);
            h.remapped_rows_pending = Some(rows.pending);
            h.remapped_rows_failure = Some(rows.failure);
        }
        h.clock_event_reasons = diag(
            m,
            "clock_event_reasons",
            raw::clock_event_reasons(&self.nvml, &device, false),
        )?;
        h.clock_event_reasons_supported = diag(
            m,
            "clock_event_reasons_supported",
            raw::clock_event_reasons(&self.nvml, &device, true),
        )?;
        h.recovery_action = diag(
            m,
            "recovery_action",
            timed("nvmlDeviceGetFieldValues", || recovery_action(&device)),
        )?;
        Ok(Some(h))
    }

    fn gpu_pair(
        &mut self,
        first: &DeviceInfo,
        second: &DeviceInfo,
    ) -> Result<Option<PairFacts>, DeviceError> {
        let device = self
            .nvml
            .device_by_index(first.index)
            .map_err(device_error)?;
        links::read_pair(&self.nvml, &device, second.index).map(Some)
    }

    fn process_name(&mut self, pid: u32) -> Option<String> {
        // 256 bytes is what nvidia-smi shows; longer names are truncated by NVML.
        self.nvml
            .sys_process_name(pid, 256)
            .ok()
            .filter(|name| !name.is_empty())
    }

    fn set_read_process_activity(&mut self, on: bool) {
        NvmlBackend::set_read_process_activity(self, on);
    }

    fn set_reuse_process_lists(&mut self, on: bool) {
        NvmlBackend::set_reuse_process_lists(self, on);
    }

    fn reuses_process_lists(&self) -> bool {
        NvmlBackend::reuses_process_lists(self)
    }

    fn reads_process_activity(&self) -> bool {
        NvmlBackend::reads_process_activity(self)
    }

    fn library(&self) -> Option<&Path> {
        Some(NvmlBackend::library(self))
    }
}

/// NVML's `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: what the driver says the GPU needs.
/// It replaced the deprecated fields 226/227 (reset status, drain-and-reset status).
const FIELD_GPU_RECOVERY_ACTION: u32 = 230;

/// The recovery action field; a driver without it answers NOT_SUPPORTED in the field's own
/// return code, which is passed on as the error.
fn recovery_action(device: &Device<'_>) -> Result<u32, NvmlError> {
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    let sample = device
        .field_values_for(&[FieldId(FIELD_GPU_RECOVERY_ACTION)])?
        .into_iter()
        .next()
        .ok_or(NvmlError::Unknown)??;
    match sample.value? {
        SampleValue::U32(v) => Ok(v),
        SampleValue::U64(v) => u32::try_from(v).map_err(|_| NvmlError::Unknown),
        SampleValue::I64(v) => u32::try_from(v).map_err(|_| NvmlError::Unknown),
        SampleValue::F64(_) => Err(NvmlError::Unknown),
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

/// Which process list a call reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProcessList {
    Compute,
    Graphics,
}

impl ProcessList {
    /// The C function, as the trace names it.
    fn symbol(self) -> &'static str {
        match self {
            Self::Compute => "nvmlDeviceGetComputeRunningProcesses_v3",
            Self::Graphics => "nvmlDeviceGetGraphicsRunningProcesses_v3",
        }
    }
}

/// The buffer (in entries) for a list that had `len` entries: half as much again, and at
/// least 16 spare, so processes starting since the last read rarely need a second call.
/// The headroom also keeps a driver with the R535 bug (32-byte entries written into our
/// 24-byte ones; `docs/scenarios.md`) inside the buffer: `len` entries of 32 bytes need
/// 4/3 of `len` slots of 24, and the buffer has 3/2 of `len` (plus the slack `raw` adds).
fn list_capacity(len: u32) -> u32 {
    len.saturating_add((len / 2).max(16))
}

/// Reads one process list with one driver call: a buffer sized from the last read
/// (`last_len`, updated), and a larger one only when the driver answers INSUFFICIENT_SIZE
/// with the count it needs (NVML's documented protocol for these calls). nvml-wrapper's
/// `running_compute_processes` always makes two calls (a count query with no buffer, then
/// the list), and on the H200 each call cost 1.6–2.1 ms.
fn read_process_list(
    nvml: &Nvml,
    device: &Device<'_>,
    list: ProcessList,
    last_len: &mut u32,
) -> Result<Vec<ProcessInfo>, NvmlError> {
    let mut capacity = list_capacity(*last_len);
    for _ in 0..PROCESS_LIST_ATTEMPTS {
        match timed(list.symbol(), || {
            raw::running_processes(nvml, device, list, capacity)
        })? {
            raw::ListAnswer::Listed(entries) => {
                *last_len = u32::try_from(entries.len()).unwrap_or(u32::MAX);
                return Ok(entries);
            }
            // Processes started since the last read (or this is the first): the driver
            // says how many entries it needs. A driver that says so without a larger count
            // still gets a larger buffer.
            raw::ListAnswer::TooSmall { needed } => {
                capacity = list_capacity(needed.max(capacity));
            }
        }
    }
    Err(NvmlError::InsufficientSize(usize::try_from(capacity).ok()))
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

/// NVML calls nvml-wrapper does not wrap, or does not wrap the way we must call them.
///
/// The one module with unsafe code outside the fake library (the workspace denies it): each
/// block calls one NVML function through the symbol nvml-wrapper already loaded
/// (`Nvml::lib`), on a handle of that same session, with pointers to locals that outlive the
/// call.
#[allow(unsafe_code)]
mod raw {
    use std::os::raw::c_uint;

    use nvml_wrapper::error::{NvmlError, nvml_try};
    use nvml_wrapper::struct_wrappers::device::ProcessInfo;
    use nvml_wrapper::{Device, Nvml};
    use nvml_wrapper_sys::bindings::{
        nvmlProcessInfo_t, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
        nvmlReturn_enum_NVML_SUCCESS,
    };

    use super::ProcessList;

    /// What one process-list call answered.
    pub(super) enum ListAnswer {
        /// The list (it fit).
        Listed(Vec<ProcessInfo>),
        /// INSUFFICIENT_SIZE: the buffer was too small; the driver needs `needed` entries.
        TooSmall { needed: u32 },
    }

    /// One `nvmlDevice{Compute,Graphics}RunningProcesses_v3` call with room for `capacity`
    /// entries (at least 1: a count of 0 would be NVML's count query). nvml-wrapper offers
    /// only the two-call form, hence this.
    pub(super) fn running_processes(
        nvml: &Nvml,
        device: &Device<'_>,
        list: ProcessList,
        capacity: u32,
    ) -> Result<ListAnswer, NvmlError> {
        let lib = nvml.lib();
        let symbol = match list {
            ProcessList::Compute => lib.nvmlDeviceGetComputeRunningProcesses_v3.as_ref(),
            ProcessList::Graphics => lib.nvmlDeviceGetGraphicsRunningProcesses_v3.as_ref(),
        };
        let call = symbol.map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
        let declared = capacity.max(1);
        let declared_len = usize::try_from(declared).unwrap_or(usize::MAX);
        // A third more than declared, unused by a correct driver: an R535 driver writes
        // 32-byte entries for the count it accepts, which needs 4/3 of the declared
        // 24-byte slots (docs/scenarios.md, "R535 process stride").
        let empty = nvmlProcessInfo_t {
            pid: 0,
            usedGpuMemory: 0,
            gpuInstanceId: 0,
            computeInstanceId: 0,
        };
        let mut entries = vec![empty; declared_len.saturating_add(declared_len / 3 + 1)];
        let mut count: c_uint = declared;
        // SAFETY: `call` is this session's symbol for the function, with the header's
        // signature (nvml-wrapper-sys's bindings); the handle comes from a live `Device` of
        // this `Nvml` session; `count` is a valid in/out pointer holding the buffer's
        // length in entries, and `entries` is valid for writing that many
        // `nvmlProcessInfo_t` (more: see above) for the duration of the call. The driver
        // writes at most `count` entries and never keeps the pointers.
        let status = unsafe { call(device.handle(), &mut count, entries.as_mut_ptr()) };
        if status == nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE {
            return Ok(ListAnswer::TooSmall { needed: count });
        }
        nvml_try(status)?;
        // On success `count` is how many entries were written; never read past what we
        // declared, whatever a driver says.
        entries.truncate(
            usize::try_from(count)
                .unwrap_or(usize::MAX)
                .min(declared_len),
        );
        Ok(ListAnswer::Listed(
            entries.into_iter().map(ProcessInfo::from).collect(),
        ))
    }

    /// What `nvmlDeviceGetRemappedRows` answers.
    pub(super) struct RemappedRows {
        pub(super) correctable: u32,
        pub(super) uncorrectable: u32,
        pub(super) pending: bool,
        pub(super) failure: bool,
    }

    /// `nvmlDeviceGetRemappedRows` (Ampere and later), which nvml-wrapper 0.13 does not wrap.
    pub(super) fn remapped_rows(
        nvml: &Nvml,
        device: &Device<'_>,
    ) -> Result<RemappedRows, NvmlError> {
        let call = nvml
            .lib()
            .nvmlDeviceGetRemappedRows
            .as_ref()
            .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
        let (mut corr, mut unc, mut pending, mut failure): (c_uint, c_uint, c_uint, c_uint) =
            (0, 0, 0, 0);
        // SAFETY: `call` is this session's symbol with the header's signature; the handle
        // comes from a live `Device` of this `Nvml` session; the four out-pointers are
        // locals valid for the duration of the call.
        let status = unsafe {
            call(
                device.handle(),
                &mut corr,
                &mut unc,
                &mut pending,
                &mut failure,
            )
        };
        nvml_try(status)?;
        Ok(RemappedRows {
            correctable: corr,
            uncorrectable: unc,
            pending: pending != 0,
            failure: failure != 0,
        })
    }

    /// The clock event reasons now (`supported`: the ones the GPU can report), through
    /// `nvmlDevice{Current,Supported}ClocksEventReasons` (driver 535 on) and the older
    /// `…ThrottleReasons` name where the library lacks the new one. nvml-wrapper 0.13 calls
    /// only the old name, which newer headers mark deprecated.
    pub(super) fn clock_event_reasons(
        nvml: &Nvml,
        device: &Device<'_>,
        supported: bool,
    ) -> Result<u64, NvmlError> {
        let lib = nvml.lib();
        let (new, old, name) = if supported {
            (
                lib.nvmlDeviceGetSupportedClocksEventReasons.as_ref(),
                lib.nvmlDeviceGetSupportedClocksThrottleReasons.as_ref(),
                "nvmlDeviceGetSupportedClocksEventReasons",
            )
        } else {
            (
                lib.nvmlDeviceGetCurrentClocksEventReasons.as_ref(),
                lib.nvmlDeviceGetCurrentClocksThrottleReasons.as_ref(),
                "nvmlDeviceGetCurrentClocksEventReasons",
            )
        };
        let call = new
            .or(old)
            .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
        let mut reasons: std::os::raw::c_ulonglong = 0;
        // SAFETY: both names share the header's signature (device, unsigned long long *);
        // the handle comes from a live `Device` of this session; `reasons` is a local.
        let status = super::timed(name, || unsafe { call(device.handle(), &mut reasons) });
        nvml_try(status)?;
        Ok(reasons)
    }

    /// `nvmlDeviceGetNvLinkRemoteDeviceType`: what is at the far end of `link`, the header's
    /// `nvmlIntNvLinkDeviceType_t`. nvml-wrapper 0.13's `NvLink::remote_device_type` hands
    /// the driver a pointer to a temporary and always answers "unknown", hence this.
    pub(super) fn nvlink_remote_device_type(
        nvml: &Nvml,
        device: &Device<'_>,
        link: u32,
    ) -> Result<u32, NvmlError> {
        let call = nvml
            .lib()
            .nvmlDeviceGetNvLinkRemoteDeviceType
            .as_ref()
            .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
        let mut kind: c_uint = nvml_wrapper_sys::bindings::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
        // SAFETY: `call` is this session's symbol with the header's signature; the handle
        // comes from a live `Device` of this `Nvml` session; `kind` is a local valid for
        // writing for the duration of the call.
        let status = unsafe { call(device.handle(), link, &mut kind) };
        nvml_try(status)?;
        Ok(kind)
    }

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

    #[test]
    fn a_list_buffer_has_room_for_growth_and_for_32_byte_entries() {
        assert_eq!(list_capacity(0), 16);
        assert_eq!(list_capacity(30), 46);
        assert_eq!(list_capacity(100), 150);
        assert_eq!(list_capacity(u32::MAX), u32::MAX);
        for len in [1, 15, 16, 17, 40, 1000] {
            // The R535 driver writes `len` 32-byte entries into 24-byte slots.
            assert!(
                u64::from(list_capacity(len)) * 24 >= u64::from(len) * 32,
                "{len}"
            );
        }
    }

    #[test]
    fn activity_pace_backs_off_without_samples_and_returns_with_them() {
        let mut pace = ActivityPace::default();
        let mut reads = Vec::new();
        for t in 0..=40 {
            let now = t * 1000;
            if pace.wants(now, Some(50), Some(3)) {
                reads.push(t);
                // Samples again from 30 s on.
                pace.read(now, t >= 30);
            }
        }
        assert_eq!(reads, [0, 2, 6, 14, 24, 34, 35, 36, 37, 38, 39, 40]);
    }

    #[test]
    fn activity_is_wanted_only_where_it_can_be_evidence() {
        let wanted = |utilization, processes| {
            let mut pace = ActivityPace::default();
            pace.read(0, true);
            pace.wants(1000, utilization, processes)
        };
        assert!(wanted(Some(50), Some(2)), "busy and shared");
        assert!(
            !wanted(Some(50), Some(1)),
            "alone: the device's utilization says it"
        );
        assert!(!wanted(Some(0), Some(5)), "0 %: every process idle");
        assert!(!wanted(Some(50), Some(0)), "nobody to attribute it to");
        assert!(
            wanted(None, Some(1)),
            "no utilization (MIG): the only GPU evidence"
        );
        assert!(wanted(Some(50), None), "no list: may be shared");
    }

    /// Driver calls per tick, counted by the fake library (`fakeNvmlGetCallCount`).
    #[allow(unsafe_code)]
    mod driver_calls {
        use std::collections::BTreeMap;
        use std::ffi::{CString, c_char, c_double, c_uint};

        use super::super::{LISTS_STALE_AFTER_MS, NvmlBackend};
        use crate::Sampler;
        use crate::backend::Backend;
        use crate::backend::contract::{FAKE_NVML, fake_library};
        use vramctl_core::clock::ManualClock;
        use vramctl_core::sanity::SanityLimits;
        use vramctl_core::types::{Field, Snapshot, Unavailable};

        /// The calls a tick may make, in the order a tick makes them.
        const PER_TICK: [&str; 9] = [
            "nvmlDeviceGetCount_v2",
            "nvmlDeviceGetHandleByIndex_v2",
            "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetTemperature",
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
            "nvmlDeviceGetProcessUtilization",
        ];

        /// What every tick reads: the device count and the device's own readings.
        const READINGS: [(&str, u64); 6] = [
            ("nvmlDeviceGetCount_v2", 1),
            ("nvmlDeviceGetHandleByIndex_v2", 1),
            ("nvmlDeviceGetMemoryInfo_v2", 1),
            ("nvmlDeviceGetUtilizationRates", 1),
            ("nvmlDeviceGetTemperature", 1),
            ("nvmlDeviceGetPowerUsage", 1),
        ];
        const COMPUTE: &str = "nvmlDeviceGetComputeRunningProcesses_v3";
        const GRAPHICS: &str = "nvmlDeviceGetGraphicsRunningProcesses_v3";
        const ACTIVITY: &str = "nvmlDeviceGetProcessUtilization";

        /// A sampler on the fake with `gpu` (the body of one `[[gpu]]` table, processes
        /// included), the fake's clock fixed at 0 and moved by [`Rig::tick`].
        struct Rig {
            sampler: Sampler<NvmlBackend>,
            clock: ManualClock,
            _dir: tempfile::TempDir,
        }

        impl Rig {
            fn new(gpu: &str) -> Self {
                let dir = tempfile::tempdir().expect("tempdir");
                let path = dir.path().join("calls.toml");
                let text = format!(
                    "[clock]\nmode = \"fixed\"\n[[gpu]]\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\n\
                     memory_total = \"141 GiB\"\ntemperature_c = 40\npower_mw = 300000\n{gpu}"
                );
                std::fs::write(&path, text).expect("scenario");
                // SAFETY (test-only): FAKE_NVML, held by every caller, serialises the
                // tests that touch this variable.
                unsafe { std::env::set_var("FAKE_NVML_SCENARIO", &path) };
                let mut backend = NvmlBackend::open(Some(&fake_library())).expect("open");
                backend.set_read_process_activity(true);
                let clock = ManualClock::new(1_795_984_291_000);
                let sampler = Sampler::with_clock(
                    backend,
                    Box::new(clock.clone()),
                    SanityLimits { pid_max: 4_194_304 },
                )
                .expect("sampler");
                Self {
                    sampler,
                    clock,
                    _dir: dir,
                }
            }

            fn count(&mut self, name: &str) -> u64 {
                let lib = &self.sampler.backend_mut().nvml.lib().__library;
                let name = CString::new(name).expect("name");
                let mut n: u64 = 0;
                // SAFETY: the fake's control symbol has this signature
                // (crates/fake-nvml/src/exports/control.rs); both pointers are valid for
                // the call. This is the library nvml-wrapper loaded, so its counts.
                let status = unsafe {
                    let f = lib
                        .get::<unsafe extern "C" fn(*const c_char, *mut u64) -> c_uint>(
                            b"fakeNvmlGetCallCount\0",
                        )
                        .expect("fakeNvmlGetCallCount");
                    f(name.as_ptr(), &mut n)
                };
                assert_eq!(status, 0, "fakeNvmlGetCallCount");
                n
            }

            /// Stands the fake's clock (its timelines) at `secs`.
            fn set_fake_time(&mut self, secs: f64) {
                let lib = &self.sampler.backend_mut().nvml.lib().__library;
                // SAFETY: as in `count`.
                let status = unsafe {
                    let f = lib
                        .get::<unsafe extern "C" fn(c_double) -> c_uint>(b"fakeNvmlSetTime\0")
                        .expect("fakeNvmlSetTime");
                    f(secs)
                };
                assert_eq!(status, 0, "fakeNvmlSetTime");
            }

            /// One tick at the sampler's current time; the driver calls it made (those
            /// made at least once) and its snapshot.
            fn tick(&mut self) -> (BTreeMap<&'static str, u64>, Snapshot) {
                let before: Vec<u64> = PER_TICK.iter().map(|n| self.count(n)).collect();
                let snapshot = self.sampler.tick();
                let calls = PER_TICK
                    .iter()
                    .zip(before)
                    .map(|(name, b)| (*name, self.count(name) - b))
                    .filter(|(_, n)| *n > 0)
                    .collect();
                (calls, snapshot)
            }

            /// Ticks every `every_ms` up to `until_ms` of tick time, the fake's clock moving
            /// with the sampler's when `fake_time_moves`; the tick times (ms since the
            /// first) at which `name` was called.
            fn ticks_calling(
                &mut self,
                name: &str,
                every_ms: i64,
                until_ms: i64,
                fake_time_moves: bool,
            ) -> Vec<i64> {
                let mut at = Vec::new();
                let mut t = 0;
                while t <= until_ms {
                    if fake_time_moves {
                        self.set_fake_time(t as f64 / 1000.0);
                    }
                    let (calls, _) = self.tick();
                    if calls.contains_key(name) {
                        at.push(t);
                    }
                    self.clock.advance_ms(every_ms);
                    t += every_ms;
                }
                at
            }
        }

        fn calls(extra: &[(&'static str, u64)]) -> BTreeMap<&'static str, u64> {
            READINGS.iter().chain(extra).copied().collect()
        }

        fn processes(pids: std::ops::Range<u32>, memory: &str) -> String {
            pids.map(|pid| format!("[[gpu.process]]\npid = {pid}\nmemory = {memory}\n"))
                .collect()
        }

        fn listed(snapshot: &Snapshot) -> Vec<(u32, Option<u64>)> {
            snapshot.devices[0]
                .reading()
                .and_then(|r| r.processes.as_ref())
                .map(|p| p.iter().map(|p| (p.pid, p.used_bytes)).collect())
                .unwrap_or_default()
        }

        const GIB: u64 = 1 << 30;

        #[test]
        fn a_steady_tick_reads_no_process_list() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            let mut rig = Rig::new(&format!(
                "utilization_gpu = 40\n{}",
                processes(31001..31004, "\"1 GiB\"")
            ));
            // The first tick reads each list with one call (the buffer fits 3), and
            // per-process activity once: nvml-wrapper's count query and the samples.
            let (first, snapshot) = rig.tick();
            assert_eq!(first, calls(&[(COMPUTE, 1), (GRAPHICS, 1), (ACTIVITY, 2)]));
            let fresh = listed(&snapshot);
            assert_eq!(fresh.len(), 3);
            // Then 100 ms ticks: the device's readings and nothing else, the same list.
            for _ in 0..9 {
                rig.clock.advance_ms(100);
                let (steady, snapshot) = rig.tick();
                assert_eq!(steady, calls(&[]));
                assert_eq!(listed(&snapshot), fresh);
            }
        }

        #[test]
        fn a_changed_used_memory_reads_the_process_lists_again() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            let grows = "{ steps = { values = [\"1 GiB\", \"2 GiB\"], every_s = 1.0 } }";
            let mut rig = Rig::new(&format!(
                "utilization_gpu = 0\n{}{}",
                processes(31001..31003, "\"1 GiB\""),
                processes(31003..31004, grows)
            ));
            let mut read_at = Vec::new();
            for i in 0..20 {
                rig.set_fake_time(f64::from(i) / 10.0);
                let (calls, snapshot) = rig.tick();
                if calls.contains_key(COMPUTE) {
                    assert_eq!(calls.get(COMPUTE), Some(&1), "one call per read");
                    assert_eq!(calls.get(GRAPHICS), Some(&1));
                    read_at.push(i);
                }
                let grown = listed(&snapshot).iter().find(|p| p.0 == 31003).map(|p| p.1);
                let expected = if i >= 10 { 2 * GIB } else { GIB };
                assert_eq!(grown, Some(Some(expected)), "tick {i}");
                rig.clock.advance_ms(100);
            }
            assert_eq!(read_at, [0, 10]);
        }

        #[test]
        fn unchanged_process_lists_are_read_again_after_ten_seconds() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            let mut rig = Rig::new(&format!(
                "utilization_gpu = 0\n{}",
                processes(31001..31004, "\"1 GiB\"")
            ));
            let reads = rig.ticks_calling(COMPUTE, 1000, 25_000, false);
            assert_eq!(
                reads,
                [0, LISTS_STALE_AFTER_MS, 2 * LISTS_STALE_AFTER_MS],
                "at 1 s ticks"
            );
        }

        #[test]
        fn processes_beyond_the_buffer_are_listed_after_insufficient_size() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            // 40 from the start (more than the first buffer's 16), 30 more at t = 1 s
            // (more than the 20 spare of the buffer sized for 40).
            let later: String = (32001..32031)
                .map(|pid| {
                    format!("[[gpu.process]]\npid = {pid}\nstart_s = 1.0\nmemory = \"1 GiB\"\n")
                })
                .collect();
            let mut rig = Rig::new(&format!(
                "utilization_gpu = 0\n{}{later}",
                processes(31001..31041, "\"1 GiB\"")
            ));
            let (first, snapshot) = rig.tick();
            assert_eq!(first.get(COMPUTE), Some(&2), "too small, then the list");
            assert_eq!(first.get(GRAPHICS), Some(&1), "none fit in any buffer");
            assert_eq!(listed(&snapshot).len(), 40);
            rig.clock.advance_ms(100);
            rig.set_fake_time(1.0);
            let (grown, snapshot) = rig.tick();
            assert_eq!(grown.get(COMPUTE), Some(&2));
            assert_eq!(listed(&snapshot).len(), 70);
            // The buffer now fits 70 and more: one call per read again.
            rig.clock.advance_ms(LISTS_STALE_AFTER_MS);
            let (again, snapshot) = rig.tick();
            assert_eq!(again.get(COMPUTE), Some(&1));
            assert_eq!(listed(&snapshot).len(), 70);
        }

        #[test]
        fn re_enumerated_devices_read_their_process_lists_again() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            let mut rig = Rig::new(&format!(
                "utilization_gpu = 0\n{}",
                processes(31001..31004, "\"1 GiB\"")
            ));
            rig.tick();
            rig.clock.advance_ms(100);
            assert!(!rig.tick().0.contains_key(COMPUTE));
            rig.sampler.backend_mut().enumerate().expect("enumerate");
            rig.clock.advance_ms(100);
            assert_eq!(rig.tick().0.get(COMPUTE), Some(&1));
        }

        #[test]
        fn with_reuse_off_every_tick_reads_the_process_lists() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            let mut rig = Rig::new(&format!(
                "utilization_gpu = 0\n{}",
                processes(31001..31004, "\"1 GiB\"")
            ));
            rig.tick();
            rig.sampler.backend_mut().set_reuse_process_lists(false);
            for _ in 0..3 {
                rig.clock.advance_ms(100);
                let (calls, _) = rig.tick();
                assert_eq!(
                    (calls.get(COMPUTE), calls.get(GRAPHICS)),
                    (Some(&1), Some(&1))
                );
            }
            rig.sampler.backend_mut().set_reuse_process_lists(true);
            rig.clock.advance_ms(100);
            assert!(!rig.tick().0.contains_key(COMPUTE));
        }

        /// `kill`'s release check turns reuse off through the frontends' boxed backend
        /// (`Sampler<Box<dyn Backend>>`): the switch must reach NVML through the trait.
        #[test]
        fn a_boxed_backend_turns_process_list_reuse_off_in_nvml() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            let _rig = Rig::new(&format!(
                "utilization_gpu = 0\n{}",
                processes(31001..31002, "\"1 GiB\"")
            ));
            let mut boxed: Box<dyn Backend> =
                Box::new(NvmlBackend::open(Some(&fake_library())).expect("open"));
            assert!(boxed.reuses_process_lists(), "on by default");
            boxed.set_reuse_process_lists(false);
            assert!(!boxed.reuses_process_lists());
            boxed.set_reuse_process_lists(true);
            assert!(boxed.reuses_process_lists());
        }

        #[test]
        fn a_refused_list_is_reused_with_its_reason_and_an_error_is_asked_again() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            let mut rig = Rig::new(&format!(
                "utilization_gpu = 0\nnot_supported = [\"{GRAPHICS}\"]\n{}",
                processes(31001..31003, "\"1 GiB\"")
            ));
            rig.tick();
            rig.clock.advance_ms(100);
            let (calls, snapshot) = rig.tick();
            assert!(!calls.contains_key(GRAPHICS), "NOT_SUPPORTED is kept");
            let reading = snapshot.devices[0].reading().expect("reading");
            assert_eq!(
                reading.missing.get(&Field::GraphicsProcesses),
                Some(&Unavailable::NotSupported)
            );
            assert_eq!(listed(&snapshot).len(), 2);
            // A scenario is loaded when the init count goes from 0 to 1.
            drop(rig);

            let mut rig = Rig::new(&format!(
                "utilization_gpu = 0\nerrors = {{ {GRAPHICS} = \"unknown\" }}\n{}",
                processes(31001..31003, "\"1 GiB\"")
            ));
            for _ in 0..3 {
                let (calls, snapshot) = rig.tick();
                assert_eq!(
                    (calls.get(COMPUTE), calls.get(GRAPHICS)),
                    (Some(&1), Some(&1))
                );
                assert_eq!(listed(&snapshot).len(), 2);
                rig.clock.advance_ms(100);
            }
        }

        #[test]
        fn process_activity_is_read_once_a_second_on_a_busy_shared_device() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            let mut rig = Rig::new(&format!(
                "utilization_gpu = 40\n{}",
                processes(31001..31004, "\"1 GiB\"")
            ));
            let reads = rig.ticks_calling(ACTIVITY, 100, 3_500, true);
            assert_eq!(reads, [0, 1000, 2000, 3000]);
        }

        #[test]
        fn process_activity_is_not_read_while_the_device_is_idle() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            let mut rig = Rig::new(&format!(
                "utilization_gpu = 0\n{}",
                processes(31001..31004, "\"1 GiB\"")
            ));
            // 0 %: every process idle. Only the first read and the 10 s floor.
            let reads = rig.ticks_calling(ACTIVITY, 100, 12_000, true);
            assert_eq!(reads, [0, 10_000]);
        }

        #[test]
        fn process_activity_is_not_read_for_a_process_alone_on_the_device() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            let mut rig = Rig::new(&format!(
                "utilization_gpu = 90\n{}",
                processes(31001..31002, "\"1 GiB\"")
            ));
            let reads = rig.ticks_calling(ACTIVITY, 100, 12_000, true);
            assert_eq!(reads, [0, 10_000]);
        }

        #[test]
        fn a_busy_tick_between_reads_makes_the_next_read_due() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            // Busy only from 0.5 s to 0.6 s: the read due at 1 s happens although the
            // device is idle again by then (the driver's samples hold that burst).
            let mut rig = Rig::new(&format!(
                "utilization_gpu = {{ steps = {{ values = [0, 0, 0, 0, 0, 60, 0], every_s = 0.1 }} }}\n{}",
                processes(31001..31004, "\"1 GiB\"")
            ));
            let reads = rig.ticks_calling(ACTIVITY, 100, 12_000, true);
            assert_eq!(reads, [0, 1000, 11_000]);
        }

        #[test]
        fn process_activity_backs_off_while_the_driver_answers_not_found() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            let mut rig = Rig::new(&format!(
                "utilization_gpu = 40\nprocess_utilization = \"not_found\"\n{}",
                processes(31001..31004, "\"1 GiB\"")
            ));
            let reads = rig.ticks_calling(ACTIVITY, 1000, 35_000, true);
            assert_eq!(reads, [0, 2000, 6000, 14_000, 24_000, 34_000]);
        }

        #[test]
        fn process_activity_returns_to_once_a_second_when_samples_come_back() {
            let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
            let mut rig = Rig::new(&format!(
                "utilization_gpu = 40\n{}",
                processes(31001..31004, "\"1 GiB\"")
            ));
            // The fake's clock stands still for 8 s: no sample is newer than the first
            // read's, so the driver answers NOT_FOUND; then it moves and samples come.
            let mut reads = Vec::new();
            for t in 0..=18 {
                if t >= 8 {
                    rig.set_fake_time(f64::from(t));
                }
                let (calls, snapshot) = rig.tick();
                if calls.contains_key(ACTIVITY) {
                    let reading = snapshot.devices[0].reading().expect("reading");
                    reads.push((t, reading.process_activity.is_some()));
                }
                rig.clock.advance_ms(1000);
            }
            assert_eq!(
                reads,
                [
                    (0, true),
                    (1, false),
                    (3, false),
                    (7, false),
                    (15, true),
                    (16, true),
                    (17, true),
                    (18, true)
                ]
            );
        }
    }
}
