//! The scenario file: what the fake GPUs are, what runs on them, and what goes wrong.
//! `docs/scenarios.md` is the reference for every key; this module parses and checks a file
//! once, at `nvmlInit`, so that the exported calls only read prepared data.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::ops::Range;

use nvml_wrapper_sys::bindings::*;
use serde::Deserialize;
use toml::Spanned;

use crate::codes::{self, Ret};
use crate::func::{Func, Scope};
use crate::size::Size;
use crate::timeline::{Number, Timeline};

/// Most GPUs a scenario may describe; handles encode the index in 8 bits.
pub const MAX_GPUS: usize = 64;
/// Most MIG devices under one GPU; handles encode the slot in 8 bits.
pub const MAX_MIG_DEVICES: u32 = 32;
/// NVML's "no instance" value for `gpuInstanceId` / `computeInstanceId`.
pub const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// A parsed, checked scenario.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub driver_version: Option<String>,
    pub nvml_version: Option<String>,
    pub cuda_driver_version: Option<i32>,
    #[serde(default = "default_stride")]
    pub process_info_stride: u32,
    #[serde(default)]
    pub clock: ClockSpec,
    #[serde(default)]
    pub init: InitSpec,
    /// `[driver_reload]`: the driver goes away under a running session.
    pub driver_reload: Option<DriverReloadSpec>,
    #[serde(default)]
    not_supported: Vec<Spanned<String>>,
    #[serde(default)]
    no_permission: Vec<Spanned<String>>,
    #[serde(default)]
    errors: BTreeMap<Spanned<String>, Spanned<String>>,
    #[serde(default, rename = "gpu")]
    gpu_tables: Vec<Spanned<Gpu>>,
    /// `[topology]`: what two GPUs' common ancestor and P2P calls answer (all of them
    /// NOT_SUPPORTED without it).
    #[serde(default)]
    pub topology: Option<Topology>,

    /// Per-call faults of the system-scope functions.
    #[serde(skip)]
    pub system_faults: FaultTable,
    /// The GPUs, in index order.
    #[serde(skip)]
    pub gpus: Vec<Gpu>,
}

fn default_stride() -> u32 {
    24
}

/// `[clock]`: how the fake's time `t` advances.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockSpec {
    #[serde(default)]
    pub mode: ClockMode,
    pub at_s: Option<f64>,
    pub path: Option<String>,
    pub step_s: Option<f64>,
    /// `[[at_s, by_s], ...]`: from `t >= at_s` the wall clock the driver stamps its samples
    /// with is `by_s` seconds off (negative: stepped back), as after an NTP step; `t` itself
    /// (the monotonic time every timeline runs on) goes on. Steps add up.
    #[serde(default)]
    pub wall_steps: Vec<[f64; 2]>,
}

impl ClockSpec {
    /// How far the driver's wall clock is off at `t`: the sum of the steps made by then.
    pub fn wall_offset_s(&self, t: f64) -> f64 {
        self.wall_steps
            .iter()
            .filter(|[at, _]| t >= *at)
            .map(|[_, by]| by)
            .sum()
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockMode {
    /// Seconds since the scenario was loaded.
    #[default]
    Wall,
    /// Always `at_s`.
    Fixed,
    /// Read from a file at each call that needs the time.
    File,
    /// Advances by `step_s` at every `nvmlDeviceGetCount_v2`.
    Step,
}

/// `[init]`: make `nvmlInit` fail.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitSpec {
    error: Option<Spanned<String>>,
    /// Fail only the first N attempts of this process, then succeed.
    pub fail_count: Option<u32>,
    /// Every init that loads the scenario takes this long to answer (a hung driver).
    pub delay_ms: Option<u64>,
    /// Every init that loads the scenario does not answer while this path exists (a
    /// hang a test ends by removing the file).
    pub hold_path: Option<String>,
    #[serde(skip)]
    pub error_code: Option<Ret>,
}

/// `[driver_reload]`: the driver goes away under a running session and comes back.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverReloadSpec {
    /// From `t >= at_s`, every call of the session then open answers `error`.
    pub at_s: f64,
    /// What those calls answer (default `uninitialized`).
    error: Option<Spanned<String>>,
    /// Init attempts after the session is shut down that still fail with
    /// `driver_not_loaded` (the driver is not back yet); the next one succeeds.
    #[serde(default)]
    pub init_failures: u32,
    #[serde(skip)]
    pub error_code: Ret,
}

/// Per-call fault answers, indexed by [`Func::index`].
#[derive(Debug, Clone)]
pub struct FaultTable([Option<Ret>; Func::COUNT]);

impl Default for FaultTable {
    fn default() -> Self {
        FaultTable([None; Func::COUNT])
    }
}

impl FaultTable {
    pub fn get(&self, func: Func) -> Option<Ret> {
        self.0[func.index()]
    }
}

/// One `[[gpu]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub serial: Option<String>,
    pub vbios: Option<String>,
    pub board_part_number: Option<String>,
    pci_bus_id: Option<Spanned<String>>,
    pub pci_device_id: Option<u32>,
    pub pci_subsystem_id: Option<u32>,
    pub brand: Option<Brand>,
    pub architecture: Option<Architecture>,
    pub compute_capability: Option<[i32; 2]>,
    pub minor_number: Option<u32>,

    pub memory_total: Option<Size>,
    #[serde(default)]
    pub memory_reserved: Size,
    #[serde(default)]
    pub memory_extra_used: Timeline<Size>,
    pub memory_info_fault: Option<MemoryInfoFault>,
    pub memory_bus_width_bits: Option<u32>,

    pub max_graphics_clock_mhz: Option<u32>,
    pub max_sm_clock_mhz: Option<u32>,
    pub max_memory_clock_mhz: Option<u32>,
    pub max_video_clock_mhz: Option<u32>,
    pub graphics_clock_mhz: Option<Timeline<Number>>,
    pub sm_clock_mhz: Option<Timeline<Number>>,
    pub memory_clock_mhz: Option<Timeline<Number>>,
    pub video_clock_mhz: Option<Timeline<Number>>,

    pub pcie: Option<Pcie>,
    pub bar1: Option<Bar1>,
    pub ecc: Option<Ecc>,
    pub retired_pages: Option<RetiredPages>,
    pub remapped_rows: Option<RemappedRows>,
    pub clock_event_reasons: Option<ClockEventReasons>,
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (field 230): 0 none, 1 GPU reset, 2 node
    /// reboot, 3 drain P2P, 4 drain and reset.
    pub recovery_action: Option<u32>,
    pub persistence_mode: Option<bool>,
    pub compute_mode: Option<ComputeMode>,
    pub power_limit_mw: Option<u32>,
    pub enforced_power_limit_mw: Option<u32>,
    pub default_power_limit_mw: Option<u32>,
    pub temperature_thresholds: Option<TemperatureThresholds>,
    performance_state: Option<Spanned<String>>,

    pub utilization_gpu: Option<Timeline<Number>>,
    pub utilization_memory: Option<Timeline<Number>>,
    pub temperature_c: Option<Timeline<Number>>,
    pub power_mw: Option<Timeline<Number>>,

    pub lost_at_s: Option<f64>,
    #[serde(default)]
    not_supported: Vec<Spanned<String>>,
    #[serde(default)]
    no_permission: Vec<Spanned<String>>,
    #[serde(default)]
    errors: BTreeMap<Spanned<String>, Spanned<String>>,
    #[serde(default)]
    pub process_utilization: ProcessUtilizationMode,
    /// The count query reports this many fewer processes than are live, as if they started
    /// between a consumer's count query and its fill call.
    #[serde(default)]
    pub processes_appear_between_calls: u32,

    pub mig: Option<Mig>,
    /// The GPU's NVLinks (`nvmlDeviceGetNvLink*`); without it the GPU has none
    /// (NOT_SUPPORTED, as a PCIe-only card answers).
    pub nvlink: Option<NvLinkSpec>,
    #[serde(default, rename = "mig_instance")]
    mig_instance_tables: Vec<Spanned<MigInstance>>,
    #[serde(default, rename = "process")]
    process_tables: Vec<Spanned<Process>>,

    /// Parsed `pci_bus_id`.
    #[serde(skip)]
    pub pci: Option<PciAddress>,
    /// Parsed `performance_state` (0..=15, 32 = unknown).
    #[serde(skip)]
    pub pstate: Option<u32>,
    #[serde(skip)]
    pub faults: FaultTable,
    #[serde(skip)]
    pub mig_instances: Vec<MigInstance>,
    #[serde(skip)]
    pub processes: Vec<Process>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pcie {
    pub gen_current: Option<u32>,
    pub gen_max: Option<u32>,
    pub width_current: Option<u32>,
    pub width_max: Option<u32>,
    pub max_speed_mbps: Option<u32>,
}

impl Pcie {
    /// `NVML_PCIE_LINK_MAX_SPEED_*` for `max_speed_mbps` (None for speeds PCIe lacks).
    pub fn max_speed_code(&self) -> Option<u32> {
        Some(match self.max_speed_mbps? {
            2500 => NVML_PCIE_LINK_MAX_SPEED_2500MBPS,
            5000 => NVML_PCIE_LINK_MAX_SPEED_5000MBPS,
            8000 => NVML_PCIE_LINK_MAX_SPEED_8000MBPS,
            16000 => NVML_PCIE_LINK_MAX_SPEED_16000MBPS,
            32000 => NVML_PCIE_LINK_MAX_SPEED_32000MBPS,
            64000 => NVML_PCIE_LINK_MAX_SPEED_64000MBPS,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bar1 {
    pub total: Size,
    #[serde(default)]
    pub used: Size,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ecc {
    pub current: bool,
    pub pending: Option<bool>,
    #[serde(default)]
    pub corrected_volatile: u64,
    #[serde(default)]
    pub uncorrected_volatile: u64,
    #[serde(default)]
    pub corrected_aggregate: u64,
    #[serde(default)]
    pub uncorrected_aggregate: u64,
}

/// Dynamic page retirement (Kepler to Volta; Ampere and later answer NOT_SUPPORTED and use
/// row remapping).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetiredPages {
    /// Pages retired for multiple single-bit errors.
    #[serde(default)]
    pub single_bit: u32,
    /// Pages retired for a double-bit error.
    #[serde(default)]
    pub double_bit: u32,
    /// Retirements waiting for the next driver reload.
    #[serde(default)]
    pub pending: bool,
}

/// Row remapping (Ampere and later): `nvmlDeviceGetRemappedRows`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemappedRows {
    #[serde(default)]
    pub correctable: u32,
    #[serde(default)]
    pub uncorrectable: u32,
    /// A remap waits for a GPU reset.
    #[serde(default)]
    pub pending: bool,
    /// A remap failed (no spare row left in a bank).
    #[serde(default)]
    pub failure: bool,
}

/// Clock event (throttle) reasons, the header's `nvmlClocksEventReason*` bits.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockEventReasons {
    /// The reasons now.
    pub current: u64,
    /// The reasons this GPU can report (default: every bit of `current`).
    pub supported: Option<u64>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemperatureThresholds {
    pub shutdown_c: Option<u32>,
    pub slowdown_c: Option<u32>,
    pub mem_max_c: Option<u32>,
    pub gpu_max_c: Option<u32>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mig {
    pub current: u32,
    pub pending: u32,
    /// What `nvmlDeviceGetMaxMigDeviceCount` answers while MIG is on (7 on an H100/H200).
    #[serde(default = "default_max_mig")]
    pub max_devices: u32,
}

fn default_max_mig() -> u32 {
    7
}

/// `nvlink = { ... }`: a GPU's NVLinks. Either `links` of them all going `to` one place
/// (`"switch"`, or a GPU's index), or `peers`: for each link in turn the GPU index at its
/// far end.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvLinkSpec {
    pub links: Option<u32>,
    pub to: Option<LinkEnd>,
    pub peers: Option<Vec<u32>>,
    /// What `nvmlDeviceGetNvLinkVersion` answers for every link (NOT_SUPPORTED without).
    pub version: Option<u32>,
    /// Link indices that are down.
    #[serde(default)]
    pub inactive: Vec<u32>,
    /// The PCI bus id NVML gives for the far end of a link to an NVSwitch (NOT_SUPPORTED
    /// without).
    switch_pci_bus_id: Option<String>,

    /// Per link, its far end (checked).
    #[serde(skip)]
    pub ends: Vec<LinkEnd>,
    #[serde(skip)]
    pub switch_pci: Option<PciAddress>,
}

/// The far end of an NVLink: `"switch"` or a GPU's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum LinkEnd {
    Gpu(u32),
    Named(Named),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Named {
    Switch,
}

/// `[topology]`: every pair's answers, and `[[topology.pair]]` for one pair. A value
/// neither gives answers NOT_SUPPORTED; `p2p` sets read and write both.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub level: Option<TopologyLevel>,
    pub p2p: Option<P2pStatus>,
    pub p2p_read: Option<P2pStatus>,
    pub p2p_write: Option<P2pStatus>,
    pub p2p_nvlink: Option<P2pStatus>,
    #[serde(default, rename = "pair")]
    pub pairs: Vec<PairSpec>,
}

/// `[[topology.pair]]`: two GPUs (either order) and their answers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairSpec {
    pub gpus: [u32; 2],
    pub level: Option<TopologyLevel>,
    pub p2p: Option<P2pStatus>,
    pub p2p_read: Option<P2pStatus>,
    pub p2p_write: Option<P2pStatus>,
    pub p2p_nvlink: Option<P2pStatus>,
}

/// What the pair functions answer for one pair (`None`: NOT_SUPPORTED).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PairAnswers {
    pub level: Option<TopologyLevel>,
    pub p2p_read: Option<P2pStatus>,
    pub p2p_write: Option<P2pStatus>,
    pub p2p_nvlink: Option<P2pStatus>,
}

impl Topology {
    /// The answers for GPUs `a` and `b` (either order): the pair's own, then every pair's.
    pub fn answers(&self, a: usize, b: usize) -> PairAnswers {
        let own = self.pairs.iter().find(|p| {
            let [x, y] = p.gpus.map(|g| g as usize);
            (x, y) == (a, b) || (x, y) == (b, a)
        });
        let pick = |own: Option<P2pStatus>, both: Option<P2pStatus>, all: Option<P2pStatus>| {
            own.or(both).or(all).or(self.p2p)
        };
        PairAnswers {
            level: own.and_then(|p| p.level).or(self.level),
            p2p_read: pick(
                own.and_then(|p| p.p2p_read),
                own.and_then(|p| p.p2p),
                self.p2p_read,
            ),
            p2p_write: pick(
                own.and_then(|p| p.p2p_write),
                own.and_then(|p| p.p2p),
                self.p2p_write,
            ),
            p2p_nvlink: own.and_then(|p| p.p2p_nvlink).or(self.p2p_nvlink),
        }
    }
}

/// What the memory-info calls answer instead of the truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryInfoFault {
    /// `used` = total + 1 GiB, `free` = 0.
    UsedExceedsTotal,
    /// `used` = 18446744073709551615, `free` = 0.
    U64Max,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessUtilizationMode {
    /// Answer samples from the processes' `sm_util` / `mem_util` timelines.
    #[default]
    Report,
    /// Always `NVML_ERROR_NOT_FOUND`, as an H200 mostly answered.
    NotFound,
}

macro_rules! c_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $value:expr,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($variant,)* }
        impl $name {
            /// The value NVML's C API uses.
            pub fn to_c(self) -> u32 {
                match self { $($name::$variant => $value,)* }
            }
        }
    };
}

c_enum! {
    /// `nvmlBrandType_t`.
    Brand {
        Unknown = nvmlBrandType_enum_NVML_BRAND_UNKNOWN,
        Quadro = nvmlBrandType_enum_NVML_BRAND_QUADRO,
        Tesla = nvmlBrandType_enum_NVML_BRAND_TESLA,
        Nvs = nvmlBrandType_enum_NVML_BRAND_NVS,
        Grid = nvmlBrandType_enum_NVML_BRAND_GRID,
        Geforce = nvmlBrandType_enum_NVML_BRAND_GEFORCE,
        Titan = nvmlBrandType_enum_NVML_BRAND_TITAN,
        NvidiaVapps = nvmlBrandType_enum_NVML_BRAND_NVIDIA_VAPPS,
        NvidiaVpc = nvmlBrandType_enum_NVML_BRAND_NVIDIA_VPC,
        NvidiaVcs = nvmlBrandType_enum_NVML_BRAND_NVIDIA_VCS,
        NvidiaVws = nvmlBrandType_enum_NVML_BRAND_NVIDIA_VWS,
        NvidiaCloudGaming = nvmlBrandType_enum_NVML_BRAND_NVIDIA_CLOUD_GAMING,
        QuadroRtx = nvmlBrandType_enum_NVML_BRAND_QUADRO_RTX,
        NvidiaRtx = nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX,
        Nvidia = nvmlBrandType_enum_NVML_BRAND_NVIDIA,
        GeforceRtx = nvmlBrandType_enum_NVML_BRAND_GEFORCE_RTX,
        TitanRtx = nvmlBrandType_enum_NVML_BRAND_TITAN_RTX,
    }
}

c_enum! {
    /// `nvmlDeviceArchitecture_t`.
    Architecture {
        Kepler = NVML_DEVICE_ARCH_KEPLER,
        Maxwell = NVML_DEVICE_ARCH_MAXWELL,
        Pascal = NVML_DEVICE_ARCH_PASCAL,
        Volta = NVML_DEVICE_ARCH_VOLTA,
        Turing = NVML_DEVICE_ARCH_TURING,
        Ampere = NVML_DEVICE_ARCH_AMPERE,
        Ada = NVML_DEVICE_ARCH_ADA,
        Hopper = NVML_DEVICE_ARCH_HOPPER,
        Blackwell = NVML_DEVICE_ARCH_BLACKWELL,
        Unknown = NVML_DEVICE_ARCH_UNKNOWN,
    }
}

c_enum! {
    /// `nvmlGpuTopologyLevel_t`.
    TopologyLevel {
        Internal = nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL,
        Single = nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE,
        Multiple = nvmlGpuLevel_enum_NVML_TOPOLOGY_MULTIPLE,
        HostBridge = nvmlGpuLevel_enum_NVML_TOPOLOGY_HOSTBRIDGE,
        Node = nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE,
        System = nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM,
    }
}

c_enum! {
    /// `nvmlGpuP2PStatus_t`.
    P2pStatus {
        Ok = nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK,
        ChipsetNotSupported = nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED,
        GpuNotSupported = nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_GPU_NOT_SUPPORTED,
        IohTopologyNotSupported = nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED,
        DisabledByRegkey = nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_DISABLED_BY_REGKEY,
        NotSupported = nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED,
        Unknown = nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_UNKNOWN,
    }
}

c_enum! {
    /// `nvmlComputeMode_t`.
    ComputeMode {
        Default = nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT,
        ExclusiveThread = nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_THREAD,
        Prohibited = nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED,
        ExclusiveProcess = nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
    }
}

/// One `[[gpu.mig_instance]]`: a MIG device (a GPU instance + compute instance pair).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigInstance {
    pub gpu_instance_id: u32,
    #[serde(default)]
    pub compute_instance_id: u32,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub memory_total: Option<Size>,
    #[serde(default)]
    pub memory_reserved: Size,
    #[serde(default)]
    pub memory_extra_used: Timeline<Size>,
}

/// Which process list a process appears in.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessKind {
    #[default]
    Compute,
    Graphics,
    /// Both the compute and the graphics list ("C+G" in nvidia-smi).
    ComputeGraphics,
    /// The MPS compute list only.
    Mps,
}

/// One `[[gpu.process]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    pub pid: u32,
    #[serde(default)]
    pub real: bool,
    /// Real PIDs that hold this process's GPU memory after it exits (forked children that
    /// inherited its /dev/nvidia* descriptors): the memory stays used, unlisted, until every
    /// one of them is gone too.
    #[serde(default)]
    pub held_open_by: Vec<u32>,
    pub name: Option<String>,
    #[serde(default)]
    pub kind: ProcessKind,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    #[serde(default)]
    pub start_s: f64,
    pub end_s: Option<f64>,
    #[serde(default)]
    pub memory: Timeline<Size>,
    #[serde(default)]
    pub sm_util: Timeline<Number>,
    #[serde(default)]
    pub mem_util: Timeline<Number>,

    /// Index of the MIG instance it runs in.
    #[serde(skip)]
    pub mig_slot: Option<usize>,
    /// A `real` process that was seen gone from /proc; never comes back.
    #[serde(skip)]
    pub dead: bool,
    /// A dead process whose `held_open_by` holders are all gone too: its memory is free.
    #[serde(skip)]
    pub released: bool,
}

/// A PCI address parsed from `pci_bus_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
}

impl PciAddress {
    fn parse(text: &str) -> Result<PciAddress, String> {
        let bad =
            || format!("pci_bus_id {text:?} is not of the form DDDDDDDD:BB:DD.F (hexadecimal)");
        let mut parts = text.split(':');
        let (Some(domain), Some(bus), Some(dev_fn), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let (device, function) = dev_fn.split_once('.').ok_or_else(bad)?;
        let hex = |s: &str, max: u32| -> Result<u32, String> {
            if s.is_empty() || s.len() > 8 {
                return Err(bad());
            }
            u32::from_str_radix(s, 16)
                .ok()
                .filter(|v| *v <= max)
                .ok_or_else(bad)
        };
        let address = PciAddress {
            domain: hex(domain, u32::MAX)?,
            bus: hex(bus, 0xFF)?,
            device: hex(device, 0x1F)?,
        };
        hex(function, 7)?;
        Ok(address)
    }

    /// `busId`, NVML's `"%08X:%02X:%02X.0"`.
    pub fn bus_id(&self) -> String {
        format!("{:08X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }

    /// `busIdLegacy`, NVML's `"%04X:%02X:%02X.0"`.
    pub fn bus_id_legacy(&self) -> String {
        format!("{:04X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }
}

/// Why a scenario could not be loaded; `Display` is the one stderr line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The file, as named in `FAKE_NVML_SCENARIO`.
    pub origin: String,
    /// 1-based line and column, where known.
    pub position: Option<(usize, usize)>,
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One line, always: messages from toml can span several.
        let message = self.message.trim().replace('\n', " ");
        match self.position {
            Some((line, column)) => {
                write!(f, "fake-nvml: {}:{line}:{column}: {message}", self.origin)
            }
            None => write!(f, "fake-nvml: {}: {message}", self.origin),
        }
    }
}

impl std::error::Error for LoadError {}

/// A check failure, with where in the file it is.
struct Invalid {
    span: Option<Range<usize>>,
    message: String,
}

fn invalid<T>(span: Option<Range<usize>>, message: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid {
        span,
        message: message.into(),
    })
}

fn position(text: &str, offset: usize) -> (usize, usize) {
    // toml's spans fall on character boundaries; `get` keeps a stray one from panicking.
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

impl Scenario {
    /// Reads and checks the scenario at `path`.
    pub fn load(path: &str) -> Result<Scenario, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|e| LoadError {
            origin: path.to_owned(),
            position: None,
            message: format!("cannot read the scenario: {e}"),
        })?;
        Scenario::parse(&text, path)
    }

    /// Parses and checks scenario text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Scenario, LoadError> {
        let error = |span: Option<Range<usize>>, message: String| LoadError {
            origin: origin.to_owned(),
            position: span.map(|s| position(text, s.start)),
            message,
        };
        let mut scenario: Scenario =
            toml::from_str(text).map_err(|e| error(e.span(), e.message().to_owned()))?;
        scenario
            .check()
            .map_err(|Invalid { span, message }| error(span, message))?;
        Ok(scenario)
    }

    fn check(&mut self) -> Result<(), Invalid> {
        if !matches!(self.process_info_stride, 24 | 32) {
            return invalid(
                None,
                format!(
                    "process_info_stride must be 24 or 32 (the R535 bug), not {}",
                    self.process_info_stride
                ),
            );
        }
        self.check_clock()?;
        if let Some(reload) = &mut self.driver_reload {
            if !(reload.at_s.is_finite() && reload.at_s >= 0.0) {
                return invalid(
                    None,
                    format!("driver_reload.at_s must be >= 0, not {}", reload.at_s),
                );
            }
            reload.error_code = match &reload.error {
                Some(error) => error_code(error)?,
                None => codes::UNINITIALIZED,
            };
        }
        if let Some(error) = &self.init.error {
            self.init.error_code = Some(error_code(error)?);
        } else if self.init.fail_count.is_some() {
            return invalid(None, "init.fail_count needs init.error");
        }
        self.system_faults = fault_table(
            Scope::System,
            &self.not_supported,
            &self.no_permission,
            &self.errors,
        )?;
        if self.gpu_tables.len() > MAX_GPUS {
            return invalid(None, format!("at most {MAX_GPUS} GPUs are supported"));
        }
        let mut uuids = HashSet::new();
        for (index, table) in std::mem::take(&mut self.gpu_tables).into_iter().enumerate() {
            let span = table.span();
            let mut gpu = table.into_inner();
            gpu.check(index, span, &mut uuids)
                .map_err(|Invalid { span, message }| Invalid {
                    span,
                    message: format!("gpu {index}: {message}"),
                })?;
            self.gpus.push(gpu);
        }
        self.check_links()
    }

    /// NVLink peers and topology pairs name GPUs that exist; needs every GPU loaded.
    fn check_links(&mut self) -> Result<(), Invalid> {
        let count = self.gpus.len();
        for (index, gpu) in self.gpus.iter_mut().enumerate() {
            if let Some(spec) = &mut gpu.nvlink {
                spec.check(index, count)
                    .map_err(|Invalid { span, message }| Invalid {
                        span,
                        message: format!("gpu {index}: nvlink: {message}"),
                    })?;
            }
        }
        for pair in self.topology.iter().flat_map(|t| &t.pairs) {
            let [a, b] = pair.gpus;
            if a == b || a as usize >= count || b as usize >= count {
                return invalid(
                    None,
                    format!("topology.pair gpus = [{a}, {b}]: two different GPUs of the {count}"),
                );
            }
        }
        Ok(())
    }

    fn check_clock(&self) -> Result<(), Invalid> {
        let c = &self.clock;
        let only = |key: &str, given: bool, mode: &str| {
            if given {
                invalid(
                    None,
                    format!("clock.{key} is only used with mode = \"{mode}\""),
                )
            } else {
                Ok(())
            }
        };
        only(
            "at_s",
            c.at_s.is_some() && c.mode != ClockMode::Fixed,
            "fixed",
        )?;
        only(
            "path",
            c.path.is_some() && c.mode != ClockMode::File,
            "file",
        )?;
        only(
            "step_s",
            c.step_s.is_some() && c.mode != ClockMode::Step,
            "step",
        )?;
        if let Some(at) = c.at_s.filter(|at| !(at.is_finite() && *at >= 0.0)) {
            return invalid(None, format!("clock.at_s must be >= 0, not {at}"));
        }
        if let Some(step) = c.step_s.filter(|s| !(s.is_finite() && *s > 0.0)) {
            return invalid(None, format!("clock.step_s must be > 0, not {step}"));
        }
        for [at, by] in &c.wall_steps {
            if !(at.is_finite() && *at >= 0.0 && by.is_finite()) {
                return invalid(
                    None,
                    format!("clock.wall_steps: [{at}, {by}] is not [at_s >= 0, by_s]"),
                );
            }
        }
        Ok(())
    }
}

fn error_code(name: &Spanned<String>) -> Result<Ret, Invalid> {
    match codes::code_by_name(name.get_ref()) {
        Some(code) if code != codes::SUCCESS => Ok(code),
        _ => invalid(
            Some(name.span()),
            format!(
                "unknown error {:?}; one of: {}",
                name.get_ref(),
                codes::error_names().collect::<Vec<_>>().join(", ")
            ),
        ),
    }
}

fn fault_table(
    scope: Scope,
    not_supported: &[Spanned<String>],
    no_permission: &[Spanned<String>],
    errors: &BTreeMap<Spanned<String>, Spanned<String>>,
) -> Result<FaultTable, Invalid> {
    let mut table = FaultTable::default();
    let entries = not_supported
        .iter()
        .map(|f| Ok((f, codes::NOT_SUPPORTED)))
        .chain(no_permission.iter().map(|f| Ok((f, codes::NO_PERMISSION))))
        .chain(errors.iter().map(|(f, e)| Ok((f, error_code(e)?))));
    for entry in entries {
        let (name, code) = entry?;
        let func = Func::by_name(name.get_ref())
            .filter(|f| f.scope() == scope)
            .ok_or_else(|| {
                let mut names: Vec<_> = Func::ALL
                    .iter()
                    .filter(|f| f.scope() == scope)
                    .map(|f| f.name())
                    .collect();
                names.sort_unstable();
                Invalid {
                    span: Some(name.span()),
                    message: format!(
                        "{:?} is not a function whose faults are set here; one of: {}",
                        name.get_ref(),
                        names.join(", ")
                    ),
                }
            })?;
        if table.0[func.index()].replace(code).is_some() {
            return invalid(
                Some(name.span()),
                format!("{} is given more than one fault", func.name()),
            );
        }
    }
    Ok(table)
}

impl NvLinkSpec {
    fn check(&mut self, own: usize, gpus: usize) -> Result<(), Invalid> {
        let max = NVML_NVLINK_MAX_LINKS;
        self.ends = match (self.links, self.to, &self.peers) {
            (Some(n), Some(to), None) => vec![to; n as usize],
            (None, None, Some(peers)) => peers.iter().map(|p| LinkEnd::Gpu(*p)).collect(),
            _ => return invalid(None, "give either links and to, or peers"),
        };
        if self.ends.is_empty() || self.ends.len() > max as usize {
            return invalid(None, format!("between 1 and {max} links"));
        }
        for end in &self.ends {
            if let LinkEnd::Gpu(peer) = end {
                if *peer as usize == own || *peer as usize >= gpus {
                    return invalid(
                        None,
                        format!("GPU {peer} is not another of the {gpus} GPUs"),
                    );
                }
            }
        }
        if let Some(link) = self
            .inactive
            .iter()
            .find(|l| **l as usize >= self.ends.len())
        {
            return invalid(None, format!("inactive link {link} does not exist"));
        }
        if let Some(bus_id) = &self.switch_pci_bus_id {
            self.switch_pci = Some(PciAddress::parse(bus_id).or_else(|m| invalid(None, m))?);
        }
        Ok(())
    }

    /// Link `link`'s far end; `None` for an index the GPU does not have.
    pub fn end(&self, link: u32) -> Option<LinkEnd> {
        self.ends.get(link as usize).copied()
    }

    pub fn active(&self, link: u32) -> bool {
        !self.inactive.contains(&link)
    }
}

impl Gpu {
    fn check(
        &mut self,
        index: usize,
        span: Range<usize>,
        uuids: &mut HashSet<String>,
    ) -> Result<(), Invalid> {
        let here = Some(span.clone());
        if let Some(uuid) = self.uuid.as_ref().filter(|u| !uuids.insert((*u).clone())) {
            return invalid(here, format!("uuid {uuid} is used twice"));
        }
        if let Some(bus_id) = &self.pci_bus_id {
            self.pci = Some(
                PciAddress::parse(bus_id.get_ref()).or_else(|m| invalid(Some(bus_id.span()), m))?,
            );
        }
        if let Some(state) = &self.performance_state {
            let text = state.get_ref();
            self.pstate = Some(match text.as_str() {
                "unknown" => nvmlPStates_enum_NVML_PSTATE_UNKNOWN,
                _ => text
                    .strip_prefix('P')
                    // Digits only, no leading zero: "P8", not "P08" or "P+8".
                    .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                    .filter(|n| *n == "0" || !n.starts_with('0'))
                    .and_then(|n| n.parse::<u32>().ok())
                    .filter(|n| *n <= 15)
                    .ok_or_else(|| Invalid {
                        span: Some(state.span()),
                        message: format!(
                            "performance_state {text:?} is not one of P0..P15 or \"unknown\""
                        ),
                    })?,
            });
        }
        if self
            .memory_total
            .is_some_and(|total| self.memory_reserved > total)
        {
            return invalid(here, "memory_reserved is larger than memory_total");
        }
        if let Some(speed) = self
            .pcie
            .and_then(|p| p.max_speed_mbps.filter(|_| p.max_speed_code().is_none()))
        {
            return invalid(
                here,
                format!(
                    "pcie.max_speed_mbps {speed} is not one of 2500, 5000, 8000, 16000, 32000, 64000"
                ),
            );
        }
        if self.bar1.is_some_and(|bar1| bar1.used > bar1.total) {
            return invalid(here, "bar1.used is larger than bar1.total");
        }
        if let Some(at) = self.lost_at_s.filter(|at| !(at.is_finite() && *at >= 0.0)) {
            return invalid(here, format!("lost_at_s must be >= 0, not {at}"));
        }
        self.faults = fault_table(
            Scope::Device,
            &self.not_supported,
            &self.no_permission,
            &self.errors,
        )?;
        self.check_mig(uuids, here.clone())?;
        self.check_processes(index)
    }

    /// MIG is on now (`mig.current = 1`).
    pub fn mig_enabled(&self) -> bool {
        self.mig.is_some_and(|m| m.current == 1)
    }

    fn check_mig(
        &mut self,
        uuids: &mut HashSet<String>,
        here: Option<Range<usize>>,
    ) -> Result<(), Invalid> {
        if let Some(mig) = self.mig {
            if mig.current > 1 || mig.pending > 1 {
                return invalid(here, "mig.current and mig.pending are 0 (off) or 1 (on)");
            }
            if mig.max_devices > MAX_MIG_DEVICES {
                return invalid(
                    here,
                    format!("mig.max_devices is at most {MAX_MIG_DEVICES}"),
                );
            }
        }
        let max = self.mig.map_or(0, |m| m.max_devices) as usize;
        let tables = std::mem::take(&mut self.mig_instance_tables);
        if !tables.is_empty() && !self.mig_enabled() {
            return invalid(
                Some(tables[0].span()),
                "mig_instance needs MIG on: mig = { current = 1, pending = 1 }",
            );
        }
        if tables.len() > max {
            return invalid(
                Some(tables[max].span()),
                format!("more mig_instance entries than mig.max_devices = {max}"),
            );
        }
        let mut ids = HashSet::new();
        for table in tables {
            let span = table.span();
            let instance = table.into_inner();
            if !ids.insert((instance.gpu_instance_id, instance.compute_instance_id)) {
                return invalid(
                    Some(span),
                    format!(
                        "MIG instance gi {} ci {} is listed twice",
                        instance.gpu_instance_id, instance.compute_instance_id
                    ),
                );
            }
            if let Some(uuid) = instance
                .uuid
                .as_ref()
                .filter(|u| !uuids.insert((*u).clone()))
            {
                return invalid(Some(span), format!("uuid {uuid} is used twice"));
            }
            if instance
                .memory_total
                .is_some_and(|total| instance.memory_reserved > total)
            {
                return invalid(Some(span), "memory_reserved is larger than memory_total");
            }
            self.mig_instances.push(instance);
        }
        Ok(())
    }

    fn check_processes(&mut self, index: usize) -> Result<(), Invalid> {
        let mig_enabled = self.mig_enabled();
        let mut seen = HashSet::new();
        for table in std::mem::take(&mut self.process_tables) {
            let span = Some(table.span());
            let mut p = table.into_inner();
            let pid = p.pid;
            let fail = |message: String| invalid(span.clone(), format!("process {pid}: {message}"));
            if !(p.start_s.is_finite() && p.start_s >= 0.0) {
                return fail(format!("start_s must be >= 0, not {}", p.start_s));
            }
            if let Some(end) = p.end_s.filter(|end| !(end.is_finite() && *end > p.start_s)) {
                return fail(format!("end_s {end} must be after start_s {}", p.start_s));
            }
            if mig_enabled {
                let Some(gi) = p.gpu_instance_id else {
                    return fail(format!(
                        "GPU {index} has MIG on, so the process needs gpu_instance_id"
                    ));
                };
                let ci = p.compute_instance_id.unwrap_or(0);
                p.compute_instance_id = Some(ci);
                let Some(slot) = self
                    .mig_instances
                    .iter()
                    .position(|m| m.gpu_instance_id == gi && m.compute_instance_id == ci)
                else {
                    return fail(format!("no mig_instance has gi {gi} ci {ci}"));
                };
                p.mig_slot = Some(slot);
            } else if p.gpu_instance_id.is_some() || p.compute_instance_id.is_some() {
                return fail(format!(
                    "GPU {index} has MIG off; gpu_instance_id and compute_instance_id need MIG on"
                ));
            }
            if !p.held_open_by.is_empty() && !p.real {
                return fail("held_open_by needs real = true (it models a real exit)".into());
            }
            if !seen.insert((pid, p.mig_slot)) {
                return fail(
                    "the PID is listed twice on this GPU (use another PID to model a restart)"
                        .into(),
                );
            }
            self.processes.push(p);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Scenario, LoadError> {
        Scenario::parse(text, "test.toml")
    }

    fn error(text: &str) -> LoadError {
        parse(text).expect_err("should be rejected")
    }

    #[test]
    fn nvlink_and_topology_keys_are_checked() {
        let two = |extra: &str| format!("[[gpu]]\n{extra}\n[[gpu]]\n");
        let s = parse(&two(
            "nvlink = { links = 18, to = \"switch\", inactive = [3] }",
        ))
        .expect("valid");
        let spec = s.gpus[0].nvlink.as_ref().expect("nvlink");
        assert_eq!(spec.ends.len(), 18);
        assert_eq!(spec.end(17), Some(LinkEnd::Named(Named::Switch)));
        assert_eq!(spec.end(18), None);
        assert!(!spec.active(3) && spec.active(4));
        for (bad, why) in [
            (
                "nvlink = { links = 2 }",
                "give either links and to, or peers",
            ),
            ("nvlink = { links = 19, to = 1 }", "between 1 and 18 links"),
            (
                "nvlink = { peers = [0] }",
                "GPU 0 is not another of the 2 GPUs",
            ),
            (
                "nvlink = { peers = [1], inactive = [1] }",
                "inactive link 1 does not exist",
            ),
        ] {
            let e = error(&two(bad));
            assert!(e.message.contains(why), "{bad}: {e}");
            assert!(e.message.starts_with("gpu 0: nvlink: "), "{e}");
        }
        let e = error("[topology]\n[[topology.pair]]\ngpus = [0, 0]\n[[gpu]]\n[[gpu]]\n");
        assert!(e.message.contains("two different GPUs of the 2"), "{e}");
        let s = parse(
            "[topology]\nlevel = \"node\"\np2p = \"ok\"\n[[topology.pair]]\ngpus = [1, 0]\np2p_write = \"disabled_by_regkey\"\n[[gpu]]\n[[gpu]]\n[[gpu]]\n",
        )
        .expect("valid");
        let t = s.topology.as_ref().expect("topology");
        let pair = t.answers(0, 1);
        assert_eq!(pair.level, Some(TopologyLevel::Node));
        assert_eq!(pair.p2p_read, Some(P2pStatus::Ok));
        assert_eq!(pair.p2p_write, Some(P2pStatus::DisabledByRegkey));
        assert_eq!(pair.p2p_nvlink, None);
        assert_eq!(t.answers(2, 0).p2p_write, Some(P2pStatus::Ok));
    }

    #[test]
    fn minimal_and_defaults() {
        let s = parse("").expect("empty scenario");
        assert!(s.gpus.is_empty());
        assert_eq!(s.process_info_stride, 24);
        assert_eq!(s.clock.mode, ClockMode::Wall);
        assert_eq!(s.init.error_code, None);
        let s = parse("[[gpu]]\nname = \"X\"\n[[gpu]]\n").expect("two gpus");
        assert_eq!(s.gpus.len(), 2);
        assert_eq!(s.gpus[0].name.as_deref(), Some("X"));
        assert_eq!(s.gpus[1].memory_reserved, Size(0));
    }

    #[test]
    fn full_gpu() {
        let s = parse(
            r#"
            driver_version = "580.159.04"
            process_info_stride = 32
            [clock]
            mode = "step"
            step_s = 2.0
            [init]
            error = "lib_rm_version_mismatch"
            fail_count = 2
            [[gpu]]
            pci_bus_id = "00000000:00:06.0"
            pci_device_id = 0x233510DE
            brand = "nvidia"
            architecture = "hopper"
            compute_mode = "exclusive_process"
            performance_state = "P8"
            memory_total = "143771 MiB"
            not_supported = ["nvmlDeviceGetPowerUsage"]
            errors = { nvmlDeviceGetTemperature = "timeout" }
            mig = { current = 1, pending = 1 }
            [[gpu.mig_instance]]
            gpu_instance_id = 3
            [[gpu.process]]
            pid = 7
            gpu_instance_id = 3
            memory = { ramp = { rate_per_s = "1 MiB" } }
            "#,
        )
        .expect("valid");
        assert_eq!(s.init.error_code, Some(18));
        assert_eq!(s.init.fail_count, Some(2));
        let g = &s.gpus[0];
        assert_eq!(
            g.pci,
            Some(PciAddress {
                domain: 0,
                bus: 0,
                device: 6
            })
        );
        assert_eq!(
            g.pci.map(|p| p.bus_id()).as_deref(),
            Some("00000000:00:06.0")
        );
        assert_eq!(
            g.pci.map(|p| p.bus_id_legacy()).as_deref(),
            Some("0000:00:06.0")
        );
        assert_eq!(g.brand.map(Brand::to_c), Some(14));
        assert_eq!(g.architecture.map(Architecture::to_c), Some(9));
        assert_eq!(g.compute_mode.map(ComputeMode::to_c), Some(3));
        assert_eq!(g.pstate, Some(8));
        assert_eq!(g.faults.get(Func::nvmlDeviceGetPowerUsage), Some(3));
        assert_eq!(g.faults.get(Func::nvmlDeviceGetTemperature), Some(10));
        assert_eq!(g.faults.get(Func::nvmlDeviceGetName), None);
        assert_eq!(g.processes[0].mig_slot, Some(0));
        assert_eq!(g.processes[0].compute_instance_id, Some(0));
    }

    #[test]
    fn unknown_keys_name_line_and_column() {
        let e = error("driver_version = \"1\"\n[[gpu]]\nname = \"a\"\nwattage = 3\n");
        assert_eq!(e.position, Some((4, 1)));
        assert!(e.message.contains("unknown field `wattage`"), "{e}");
        let line = e.to_string();
        assert!(line.starts_with("fake-nvml: test.toml:4:1: "), "{line}");
        assert!(!line.contains('\n'));
        let e = error("[[gpu]]\n[[gpu.process]]\npid = 1\ncolour = 2\n");
        assert!(e.message.contains("unknown field `colour`"), "{e}");
        assert_eq!(e.position.map(|p| p.0), Some(4));
    }

    #[test]
    fn syntax_and_type_errors() {
        let e = error("[[gpu]\n");
        assert_eq!(e.position.map(|p| p.0), Some(1));
        let e = error("[[gpu]]\nmemory_total = \"12 gigs\"\n");
        assert!(e.message.contains("unit"), "{e}");
        assert_eq!(e.position.map(|p| p.0), Some(2));
        let e = error("[[gpu]]\nbrand = \"radeon\"\n");
        assert!(e.message.contains("unknown variant"), "{e}");
        let e = error("[[gpu]]\n[[gpu.process]]\npid = -4\n");
        assert_eq!(e.position.map(|p| p.0), Some(3));
    }

    #[test]
    fn semantic_errors() {
        let cases: &[(&str, &str)] = &[
            ("process_info_stride = 16", "24 or 32"),
            (
                "[clock]\nmode = \"wall\"\nat_s = 3.0",
                "only used with mode = \"fixed\"",
            ),
            ("[clock]\nmode = \"step\"\nstep_s = 0.0", "> 0"),
            ("[clock]\nmode = \"sundial\"", "unknown variant"),
            ("[init]\nerror = \"exploded\"", "unknown error"),
            ("[init]\nfail_count = 2", "needs init.error"),
            ("not_supported = [\"nvmlDeviceGetName\"]", "not a function"),
            (
                "[[gpu]]\nnot_supported = [\"nvmlSystemGetDriverVersion\"]",
                "not a function",
            ),
            (
                "[[gpu]]\nnot_supported = [\"nvmlDeviceGetFanSpeed\"]",
                "not a function",
            ),
            (
                "[[gpu]]\nnot_supported = [\"nvmlDeviceGetName\"]\nno_permission = [\"nvmlDeviceGetName\"]",
                "more than one fault",
            ),
            (
                "[[gpu]]\nerrors = { nvmlDeviceGetName = \"success\" }",
                "unknown error",
            ),
            ("[[gpu]]\npci_bus_id = \"0:0:6\"", "DDDDDDDD:BB:DD.F"),
            (
                "[[gpu]]\npci_bus_id = \"0000:100:06.0\"",
                "DDDDDDDD:BB:DD.F",
            ),
            ("[[gpu]]\nperformance_state = \"P16\"", "P0..P15"),
            ("[[gpu]]\nperformance_state = \"P01\"", "P0..P15"),
            ("[[gpu]]\nmemory_total = 10\nmemory_reserved = 11", "larger"),
            (
                "[[gpu]]\nuuid = \"GPU-a\"\n[[gpu]]\nuuid = \"GPU-a\"",
                "used twice",
            ),
            ("[[gpu]]\nlost_at_s = -1.0", ">= 0"),
            (
                "[[gpu]]\npcie = { max_speed_mbps = 20000 }",
                "not one of 2500",
            ),
            ("[[gpu]]\nbar1 = { total = 1, used = 2 }", "larger"),
            (
                "[[gpu]]\nmig = { current = 2, pending = 0 }",
                "0 (off) or 1 (on)",
            ),
            (
                "[[gpu]]\n[[gpu.mig_instance]]\ngpu_instance_id = 1",
                "needs MIG on",
            ),
            (
                "[[gpu]]\nmig = { current = 1, pending = 1, max_devices = 1 }\n[[gpu.mig_instance]]\ngpu_instance_id = 1\n[[gpu.mig_instance]]\ngpu_instance_id = 2",
                "more mig_instance",
            ),
            (
                "[[gpu]]\nmig = { current = 1, pending = 1 }\n[[gpu.mig_instance]]\ngpu_instance_id = 1\n[[gpu.mig_instance]]\ngpu_instance_id = 1",
                "listed twice",
            ),
            (
                "[[gpu]]\nmig = { current = 1, pending = 1 }\n[[gpu.mig_instance]]\ngpu_instance_id = 1\n[[gpu.process]]\npid = 5",
                "needs gpu_instance_id",
            ),
            (
                "[[gpu]]\nmig = { current = 1, pending = 1 }\n[[gpu.mig_instance]]\ngpu_instance_id = 1\n[[gpu.process]]\npid = 5\ngpu_instance_id = 2",
                "no mig_instance has gi 2",
            ),
            (
                "[[gpu]]\n[[gpu.process]]\npid = 5\ngpu_instance_id = 2",
                "MIG off",
            ),
            (
                "[[gpu]]\n[[gpu.process]]\npid = 5\n[[gpu.process]]\npid = 5",
                "listed twice",
            ),
            (
                "[[gpu]]\n[[gpu.process]]\npid = 5\nstart_s = 3.0\nend_s = 2.0",
                "after start_s",
            ),
            (
                "[[gpu]]\n[[gpu.process]]\npid = 5\nheld_open_by = [6]",
                "needs real = true",
            ),
        ];
        for (text, expected) in cases {
            let e = error(text);
            assert!(
                e.message.contains(expected),
                "{text:?}: expected {expected:?} in {:?}",
                e.message
            );
        }
    }

    #[test]
    fn semantic_errors_point_into_the_file() {
        let e =
            error("[[gpu]]\nname = \"a\"\n[[gpu.process]]\npid = 5\n\n[[gpu.process]]\npid = 5\n");
        assert!(e.message.starts_with("gpu 0: process 5:"), "{e}");
        let (line, _) = e.position.expect("position");
        assert!((6..=7).contains(&line), "line {line}");
        let e = error("[init]\nerror = \"boom\"\n");
        assert_eq!(e.position.map(|p| p.0), Some(2));
    }

    #[test]
    fn missing_file() {
        let e = Scenario::load("/nonexistent/fake-nvml.toml").expect_err("missing");
        assert_eq!(e.position, None);
        assert!(
            e.to_string()
                .starts_with("fake-nvml: /nonexistent/fake-nvml.toml: cannot read")
        );
    }
}
