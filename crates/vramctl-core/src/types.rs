//! The project's own vocabulary for GPUs, their memory and the processes that hold it.
//!
//! Every value a device may be unable to report is an `Option`: `None` means "not
//! reported", never "zero". Why a value is missing is kept beside it in
//! [`DeviceReading::missing`], so a frontend can say "power: not supported" instead of
//! printing a number that was never read.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Why a value that a device could have reported is absent.
///
/// Serialised as its human text (`"not supported"`, `"dropped: …"`), which parses back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", from = "String")]
#[non_exhaustive]
pub enum Unavailable {
    /// The device or driver does not implement the query (a capability, not a failure).
    NotSupported,
    /// The caller lacks the privilege (e.g. per-process data on a MIG parent as non-root).
    NoPermission,
    /// The device has fallen off the bus or is otherwise inaccessible.
    GpuLost,
    /// The driver answered with a value that cannot be true; it was dropped.
    Insane(String),
    /// Any other error, with the driver's wording.
    Error(String),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotSupported => f.write_str("not supported"),
            Self::NoPermission => f.write_str("no permission"),
            Self::GpuLost => f.write_str("GPU lost"),
            Self::Insane(why) => write!(f, "dropped: {why}"),
            Self::Error(why) => f.write_str(why),
        }
    }
}

impl From<Unavailable> for String {
    fn from(why: Unavailable) -> Self {
        why.to_string()
    }
}

impl From<String> for Unavailable {
    fn from(text: String) -> Self {
        match text.as_str() {
            "not supported" => Self::NotSupported,
            "no permission" => Self::NoPermission,
            "GPU lost" => Self::GpuLost,
            _ => match text.strip_prefix("dropped: ") {
                Some(why) => Self::Insane(why.to_owned()),
                None => Self::Error(text),
            },
        }
    }
}

/// Versions of the driver stack; each one the library may not report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverInfo {
    /// Kernel driver version, e.g. `580.159.04`.
    pub driver_version: Option<String>,
    /// NVML library version, e.g. `13.580.159.04`.
    pub nvml_version: Option<String>,
    /// CUDA driver API version as `major.minor`, e.g. `13.0`. Only read on request
    /// ([`Sampler::read_cuda_driver_version`](crate::Sampler::read_cuda_driver_version)):
    /// NVML answers it by loading the CUDA driver library, which is slow. Left out of JSON
    /// when it was not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_driver_version: Option<String>,
}

/// Static facts about a device, read once per session.
///
/// Identity is the UUID, never the index: NVML's order ignores `CUDA_VISIBLE_DEVICES` and
/// can change across reboots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// NVML's index of the device in this session.
    pub index: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H200`.
    pub name: Option<String>,
    /// `domain:bus:device.function`, e.g. `00000000:00:06.0`.
    pub pci_bus_id: Option<String>,
    /// The N of `/dev/nvidiaN`.
    pub minor_number: Option<u32>,
    /// Whether MIG mode is currently enabled.
    pub mig_enabled: Option<bool>,
    /// MIG instances on this GPU (empty when MIG is off).
    pub mig_instances: Vec<MigInstanceInfo>,
}

impl DeviceInfo {
    /// A device known only by its index and UUID: what a reader of a recording or a
    /// driver that answers nothing else has; every other fact not reported.
    pub fn new(index: u32, uuid: impl Into<String>) -> Self {
        Self {
            index,
            uuid: uuid.into(),
            name: None,
            pci_bus_id: None,
            minor_number: None,
            mig_enabled: None,
            mig_instances: Vec::new(),
        }
    }
}

/// Static facts about one MIG instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstanceInfo {
    /// `MIG-xxxxxxxx-...`.
    pub uuid: String,
    /// e.g. `NVIDIA H200 MIG 1g.18gb`.
    pub name: Option<String>,
    /// GPU instance id within the parent.
    pub gpu_instance_id: Option<u32>,
    /// Compute instance id within the GPU instance.
    pub compute_instance_id: Option<u32>,
}

/// NVML's v2 memory figures for a device or MIG instance, in bytes.
///
/// On an H200 `total == reserved + used + free` held exactly; `used` is what nvidia-smi
/// calls "Used" and does not include the driver's reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReading {
    /// Installed memory.
    pub total_bytes: u64,
    /// Allocated by processes and contexts.
    pub used_bytes: u64,
    /// Set aside by the driver and firmware.
    pub reserved_bytes: u64,
    /// Neither used nor reserved.
    pub free_bytes: u64,
}

/// Which NVML process list a process came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessKind {
    /// A CUDA (compute) context.
    Compute,
    /// A graphics context.
    Graphics,
    /// Both lists named it.
    ComputeAndGraphics,
}

/// One process's memory on one device, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessUsage {
    /// PID as the driver sees it (normally the host PID namespace).
    pub pid: u32,
    /// Memory the driver attributes to the process; `None` when NVML says not available.
    pub used_bytes: Option<u64>,
    /// Which list named it.
    pub kind: ProcessKind,
    /// MIG GPU instance the context lives in.
    pub gpu_instance_id: Option<u32>,
    /// MIG compute instance the context lives in.
    pub compute_instance_id: Option<u32>,
}

/// One MIG instance's reading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigReading {
    /// The instance's UUID (matches [`MigInstanceInfo::uuid`]).
    pub uuid: String,
    /// Its memory, if the driver reported it.
    pub memory: Option<MemoryReading>,
}

/// A field of a reading, named for "what is missing and why".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Field {
    /// Memory figures.
    Memory,
    /// GPU and memory-controller utilisation.
    Utilization,
    /// Core temperature.
    Temperature,
    /// Power draw.
    Power,
    /// The compute process list.
    ComputeProcesses,
    /// The graphics process list.
    GraphicsProcesses,
    /// Per-process SM utilisation samples.
    ProcessUtilization,
    /// One process entry (see [`Dropped`]).
    Process,
    /// A MIG instance's memory.
    MigMemory,
}

impl Field {
    /// The name used in human output and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Utilization => "utilization",
            Self::Temperature => "temperature",
            Self::Power => "power",
            Self::ComputeProcesses => "compute_processes",
            Self::GraphicsProcesses => "graphics_processes",
            Self::ProcessUtilization => "process_utilization",
            Self::Process => "process",
            Self::MigMemory => "mig_memory",
        }
    }
}

/// An entry the sampler refused to believe, or entries a backend could not read (the DRM
/// backend's processes without permission, its malformed fdinfo lines), and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dropped {
    /// What kind of entry.
    pub field: Field,
    /// Human description of the entry, e.g. `pid 0 (1.0 GiB)`.
    pub what: String,
    /// Why it was dropped.
    pub reason: String,
}

/// Per-process SM activity from `nvmlDeviceGetProcessUtilization`, when the driver has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessActivity {
    /// The process.
    pub pid: u32,
    /// SM utilisation in percent over the driver's last sample window.
    pub sm_percent: u32,
    /// Memory-controller utilisation in percent.
    pub memory_percent: u32,
}

/// Everything read from one device in one tick.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceReading {
    /// v2 memory figures.
    pub memory: Option<MemoryReading>,
    /// Percent of time a kernel ran over the driver's sample window.
    pub utilization_gpu_percent: Option<u32>,
    /// Percent of time memory was read or written.
    pub utilization_memory_percent: Option<u32>,
    /// GPU core temperature.
    pub temperature_c: Option<u32>,
    /// Power draw in milliwatts.
    pub power_mw: Option<u32>,
    /// Processes holding memory; `None` when no list could be read at all.
    pub processes: Option<Vec<ProcessUsage>>,
    /// Per-process activity where the driver reports it.
    pub process_activity: Option<Vec<ProcessActivity>>,
    /// MIG instances' own memory.
    pub mig: Vec<MigReading>,
    /// Why each absent field is absent.
    pub missing: BTreeMap<Field, Unavailable>,
    /// Entries that failed the sanity checks, or that could not be read.
    pub dropped: Vec<Dropped>,
}

impl DeviceReading {
    /// The memory figures of the MIG instance `uuid` read this tick; `None` when the
    /// instance was not read or could not report them.
    pub fn mig_memory(&self, uuid: &str) -> Option<MemoryReading> {
        self.mig
            .iter()
            .find(|m| m.uuid == uuid)
            .and_then(|m| m.memory)
    }

    /// Memory used on the device that no listed process accounts for.
    ///
    /// `None` when the memory or the process list is unknown, or when a listed process's
    /// memory is unknown (the sum would be a guess).
    pub fn unaccounted_bytes(&self) -> Option<u64> {
        let memory = self.memory?;
        let processes = self.processes.as_ref()?;
        let mut accounted: u64 = 0;
        for process in processes {
            accounted = accounted.saturating_add(process.used_bytes?);
        }
        Some(memory.used_bytes.saturating_sub(accounted))
    }
}

/// The state of one device in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum DeviceState {
    /// The device answered (some fields may still be missing).
    Ok(DeviceReading),
    /// The device fell off the bus.
    Lost {
        /// The driver's wording.
        reason: String,
    },
    /// The device could not be read for another reason.
    Error {
        /// The driver's wording.
        reason: String,
    },
}

/// One device in one snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    /// Static facts (shared between snapshots).
    pub info: Arc<DeviceInfo>,
    /// What the device said this tick.
    pub state: DeviceState,
}

impl DeviceSnapshot {
    /// The reading, if the device answered.
    pub fn reading(&self) -> Option<&DeviceReading> {
        match &self.state {
            DeviceState::Ok(reading) => Some(reading),
            DeviceState::Lost { .. } | DeviceState::Error { .. } => None,
        }
    }
}

/// A device NVML counts but that could not even be opened (e.g. lost before enumeration).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnopenedDevice {
    /// NVML index.
    pub index: u32,
    /// Why it could not be opened.
    pub reason: Unavailable,
}

/// Everything the sampler read in one tick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Wall-clock time the tick started, in milliseconds since the Unix epoch. What times
    /// are shown and stored as; it steps when the wall clock does (NTP, a VM resumed).
    pub taken_at_unix_ms: i64,
    /// The monotonic clock when the tick started (milliseconds; only differences mean
    /// anything). Spans between snapshots (idle spans, rates, intervals) are measured on
    /// it, so a wall-clock step neither freezes nor stretches them
    /// ([`clock`](crate::clock)).
    #[serde(default)]
    pub monotonic_ms: i64,
    /// Driver stack versions.
    pub driver: Arc<DriverInfo>,
    /// Devices in NVML index order.
    pub devices: Vec<DeviceSnapshot>,
    /// Devices counted by NVML that could not be opened.
    pub unopened: Vec<UnopenedDevice>,
}

/// CUDA compute capability, e.g. 9.0 for Hopper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeCapability {
    /// Major version.
    pub major: i32,
    /// Minor version.
    pub minor: i32,
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Health facts of one device that [`DeviceDiagnostics`] does not hold (`vramctl doctor`):
/// how the memory has been repaired and why the clocks are held down now. Read on demand.
///
/// Page retirement answers on GPUs up to Volta, row remapping from Ampere on; the other
/// one is `None` (not supported), never 0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceHealth {
    /// Pages retired for repeated single-bit ECC errors.
    pub retired_pages_single_bit: Option<u32>,
    /// Pages retired for a double-bit ECC error.
    pub retired_pages_double_bit: Option<u32>,
    /// Retirements that take effect at the next driver reload (reboot or GPU reset).
    pub retired_pages_pending: Option<bool>,
    /// Rows remapped for correctable errors.
    pub remapped_rows_correctable: Option<u32>,
    /// Rows remapped for uncorrectable errors.
    pub remapped_rows_uncorrectable: Option<u32>,
    /// A remap waits for a GPU reset.
    pub remapped_rows_pending: Option<bool>,
    /// A remap failed: a bank had no spare row left.
    pub remapped_rows_failure: Option<bool>,
    /// Clock event (throttle) reasons now, NVML's `nvmlClocksEventReason*` bit mask.
    pub clock_event_reasons: Option<u64>,
    /// The reasons this GPU can report at all.
    pub clock_event_reasons_supported: Option<u64>,
    /// What the driver says the GPU needs (NVML field 230,
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`): 0 nothing, 1 a GPU reset, 2 a node reboot,
    /// 3 draining peer-to-peer traffic, 4 a drain and reset.
    pub recovery_action: Option<u32>,
    /// Why each absent field is absent, keyed by field name.
    pub missing: BTreeMap<String, Unavailable>,
}

/// One NVLink of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLink {
    /// Link index, 0..[`NVLINK_MAX_LINKS`](crate::topology::NVLINK_MAX_LINKS).
    pub link: u32,
    /// `nvmlDeviceGetNvLinkState`: the link is up.
    pub active: bool,
    /// `nvmlDeviceGetNvLinkVersion` as NVML answers it (active links only).
    pub version: Option<u32>,
    /// The PCI bus id of the device at the other end (active links only): another GPU's,
    /// or an NVSwitch's.
    pub remote_pci_bus_id: Option<String>,
    /// What is at the other end (active links only).
    pub remote_device: Option<NvLinkRemote>,
}

/// `nvmlIntNvLinkDeviceType_t`: what an NVLink connects to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NvLinkRemote {
    /// Another GPU, directly (a bridge or a board's own wiring).
    Gpu,
    /// An IBM POWER NPU.
    IbmNpu,
    /// An NVSwitch (HGX boards): every GPU on the switches is reachable.
    Switch,
    /// NVML does not know.
    Unknown,
}

/// The key of [`DeviceDiagnostics::nvlinks`] in its `missing`.
pub const NVLINKS_KEY: &str = "nvlinks";

/// Hardware diagnostics of one device (`vramctl info`), read on demand.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceDiagnostics {
    /// Brand, e.g. `NVIDIA`, `Tesla`.
    pub brand: Option<String>,
    /// Architecture, e.g. `Hopper`.
    pub architecture: Option<String>,
    /// CUDA compute capability.
    pub compute_capability: Option<ComputeCapability>,
    /// Board serial number.
    pub serial: Option<String>,
    /// VBIOS version.
    pub vbios_version: Option<String>,
    /// Board part number.
    pub board_part_number: Option<String>,
    /// PCI device id (`0x233510DE`).
    pub pci_device_id: Option<u32>,
    /// PCI subsystem id.
    pub pci_subsystem_id: Option<u32>,
    /// Memory figures at the time of the query.
    pub memory: Option<MemoryReading>,
    /// Memory bus width.
    pub memory_bus_width_bits: Option<u32>,
    /// Highest memory clock.
    pub max_memory_clock_mhz: Option<u32>,
    /// Current memory clock.
    pub memory_clock_mhz: Option<u32>,
    /// Highest SM clock.
    pub max_sm_clock_mhz: Option<u32>,
    /// Current PCIe generation.
    pub pcie_gen_current: Option<u32>,
    /// Highest PCIe generation of the device and its link.
    pub pcie_gen_max: Option<u32>,
    /// Current link width (lanes).
    pub pcie_width_current: Option<u32>,
    /// Highest link width.
    pub pcie_width_max: Option<u32>,
    /// BAR1 aperture size.
    pub bar1_total_bytes: Option<u64>,
    /// BAR1 in use.
    pub bar1_used_bytes: Option<u64>,
    /// ECC mode now.
    pub ecc_enabled: Option<bool>,
    /// ECC mode after the next reset.
    pub ecc_pending: Option<bool>,
    /// Corrected ECC errors since the driver loaded.
    pub ecc_corrected_volatile: Option<u64>,
    /// Uncorrected ECC errors since the driver loaded.
    pub ecc_uncorrected_volatile: Option<u64>,
    /// Corrected ECC errors over the board's life.
    pub ecc_corrected_aggregate: Option<u64>,
    /// Uncorrected ECC errors over the board's life.
    pub ecc_uncorrected_aggregate: Option<u64>,
    /// Persistence mode.
    pub persistence_mode: Option<bool>,
    /// Compute mode, e.g. `Default`, `ExclusiveProcess`.
    pub compute_mode: Option<String>,
    /// MIG mode now.
    pub mig_current: Option<bool>,
    /// MIG mode after the next reset.
    pub mig_pending: Option<bool>,
    /// Power limit in force.
    pub power_limit_mw: Option<u32>,
    /// Enforced power limit (the lowest of all limits).
    pub enforced_power_limit_mw: Option<u32>,
    /// Default power limit.
    pub default_power_limit_mw: Option<u32>,
    /// Current core temperature.
    pub temperature_c: Option<u32>,
    /// Temperature at which the GPU shuts down.
    pub temperature_shutdown_c: Option<u32>,
    /// Temperature at which the GPU slows down.
    pub temperature_slowdown_c: Option<u32>,
    /// Highest operating temperature of the GPU core.
    pub temperature_gpu_max_c: Option<u32>,
    /// Highest operating temperature of the memory.
    pub temperature_memory_max_c: Option<u32>,
    /// Performance state `P0`..`P15`.
    pub performance_state: Option<String>,
    /// The GPU's NVLinks, each link index NVML knows. `None` with no reason in `missing`: the
    /// GPU has no NVLink (NVML answers NOT_SUPPORTED, as on a PCIe-only card); left out of
    /// JSON then, so a GPU without NVLink reads as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlinks: Option<Vec<NvLink>>,
    /// Why each absent field is absent, keyed by field name.
    pub missing: BTreeMap<String, Unavailable>,
}

impl DeviceDiagnostics {
    /// The GPU's NVLinks as far as known: its links, none for a GPU without NVLink (NVML
    /// said NOT_SUPPORTED), `None` when NVML failed to say (its reason in `missing`).
    pub fn nvlinks_known(&self) -> Option<&[NvLink]> {
        match &self.nvlinks {
            Some(links) => Some(links),
            None if self.missing.contains_key(NVLINKS_KEY) => None,
            None => Some(&[]),
        }
    }

    /// Theoretical peak memory bandwidth: double data rate × clock × bus width.
    ///
    /// An H200 reads 6016 bits × 3201 MHz → 2 × 3201e6 × 6016 / 8 = 4.814 TB/s. The factor 2
    /// is the double data rate NVML's "max memory clock" does not include; it matches the
    /// vendor's figures for HBM parts.
    pub fn memory_bandwidth_bytes_per_sec(&self) -> Option<u64> {
        let bits = u64::from(self.memory_bus_width_bits?);
        let mhz = u64::from(self.max_memory_clock_mhz?);
        Some(2 * mhz * 1_000_000 * bits / 8)
    }

    /// PCIe bandwidth per direction of the current link, after line encoding.
    pub fn pcie_current_bytes_per_sec(&self) -> Option<u64> {
        pcie_bytes_per_sec(self.pcie_gen_current?, self.pcie_width_current?)
    }

    /// PCIe bandwidth per direction of the best link the device supports.
    pub fn pcie_max_bytes_per_sec(&self) -> Option<u64> {
        pcie_bytes_per_sec(self.pcie_gen_max?, self.pcie_width_max?)
    }
}

/// Bytes per second per direction of a PCIe link of `generation` with `lanes` lanes.
///
/// Gen 1–2 use 8b/10b encoding, gen 3–5 128b/130b, gen 6 FLIT (242/256 of the raw rate
/// carries data). Gen 5 ×16 is 63.0 GB/s.
pub fn pcie_bytes_per_sec(generation: u32, lanes: u32) -> Option<u64> {
    // (transfer rate in MT/s, payload numerator, payload denominator)
    let (rate_mts, num, den): (u64, u64, u64) = match generation {
        1 => (2_500, 8, 10),
        2 => (5_000, 8, 10),
        3 => (8_000, 128, 130),
        4 => (16_000, 128, 130),
        5 => (32_000, 128, 130),
        6 => (64_000, 242, 256),
        _ => return None,
    };
    // Multiply before dividing so the one truncation happens last.
    Some(rate_mts * 1_000_000 * u64::from(lanes) * num / (den * 8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h200_bandwidth_is_4_8_tb_per_s() {
        let diag = DeviceDiagnostics {
            memory_bus_width_bits: Some(6016),
            max_memory_clock_mhz: Some(3201),
            ..DeviceDiagnostics::default()
        };
        assert_eq!(
            diag.memory_bandwidth_bytes_per_sec(),
            Some(4_814_304_000_000)
        );
    }

    #[test]
    fn unavailable_round_trips_through_its_text() {
        for why in [
            Unavailable::NotSupported,
            Unavailable::NoPermission,
            Unavailable::GpuLost,
            Unavailable::Insane("used > total".into()),
            Unavailable::Error("timeout".into()),
        ] {
            let json = serde_json::to_string(&why).unwrap();
            assert_eq!(
                serde_json::from_str::<Unavailable>(&json).unwrap(),
                why,
                "{json}"
            );
        }
    }

    #[test]
    fn bandwidth_unknown_without_bus_width() {
        let diag = DeviceDiagnostics {
            max_memory_clock_mhz: Some(3201),
            ..Default::default()
        };
        assert_eq!(diag.memory_bandwidth_bytes_per_sec(), None);
    }

    #[test]
    fn pcie_gen5_x16_is_63_gb_per_s() {
        assert_eq!(pcie_bytes_per_sec(5, 16), Some(63_015_384_615));
        assert_eq!(pcie_bytes_per_sec(3, 16), Some(15_753_846_153));
        assert_eq!(pcie_bytes_per_sec(9, 16), None);
    }

    fn process(pid: u32, used: Option<u64>) -> ProcessUsage {
        ProcessUsage {
            pid,
            used_bytes: used,
            kind: ProcessKind::Compute,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    fn reading(used: u64, processes: Option<Vec<ProcessUsage>>) -> DeviceReading {
        DeviceReading {
            memory: Some(MemoryReading {
                total_bytes: 100,
                used_bytes: used,
                reserved_bytes: 5,
                free_bytes: 95 - used,
            }),
            processes,
            ..DeviceReading::default()
        }
    }

    #[test]
    fn unaccounted_is_used_minus_processes() {
        let r = reading(50, Some(vec![process(10, Some(20)), process(11, Some(25))]));
        assert_eq!(r.unaccounted_bytes(), Some(5));
    }

    #[test]
    fn unaccounted_unknown_when_a_process_memory_is_unknown() {
        let r = reading(50, Some(vec![process(10, Some(20)), process(11, None)]));
        assert_eq!(r.unaccounted_bytes(), None);
        assert_eq!(reading(50, None).unaccounted_bytes(), None);
    }

    #[test]
    fn unaccounted_never_negative() {
        let r = reading(10, Some(vec![process(10, Some(20))]));
        assert_eq!(r.unaccounted_bytes(), Some(0));
    }
}
