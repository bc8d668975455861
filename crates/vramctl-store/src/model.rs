//! What goes into the store (one [`TickSample`] per tick) and what comes out of it.
//!
//! Input is a list of *observations*: whatever a tick did not observe keeps its previous
//! value (an import of a file with only some columns, CPU time read every few seconds),
//! and whatever it observed as missing becomes a gap with its reason — never a zero.

use serde::{Deserialize, Serialize};

/// A quantity the store records. The numbers are stored in the database: never reuse one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Metric {
    /// Device memory used by processes and contexts (NVML v2 `used`), bytes.
    UsedBytes,
    /// Device memory set aside by the driver, bytes.
    ReservedBytes,
    /// Device memory free, bytes.
    FreeBytes,
    /// Device memory installed, bytes.
    TotalBytes,
    /// GPU utilisation, percent.
    UtilizationGpuPercent,
    /// Memory-controller utilisation, percent.
    UtilizationMemoryPercent,
    /// Core temperature, degrees C.
    TemperatureC,
    /// Power draw, milliwatts.
    PowerMw,
    /// A process's memory on a device, bytes.
    ProcessUsedBytes,
    /// A process's SM activity on a device, percent (where the driver reports it).
    ProcessSmPercent,
    /// A process's CPU time (user + system), clock ticks.
    ProcessCpuTicks,
    /// Bytes in a process's live tensors on a device, as its framework says through the
    /// in-process agent (only processes with one).
    ProcessAllocatedBytes,
    /// Bytes a process's framework allocator holds from the driver on a device (live
    /// tensors plus cache), through the agent.
    ProcessReservedBytes,
}

impl Metric {
    /// Every metric, in code order.
    pub const ALL: [Self; 13] = [
        Self::UsedBytes,
        Self::ReservedBytes,
        Self::FreeBytes,
        Self::TotalBytes,
        Self::UtilizationGpuPercent,
        Self::UtilizationMemoryPercent,
        Self::TemperatureC,
        Self::PowerMw,
        Self::ProcessUsedBytes,
        Self::ProcessSmPercent,
        Self::ProcessCpuTicks,
        Self::ProcessAllocatedBytes,
        Self::ProcessReservedBytes,
    ];

    /// The device-level metrics.
    pub const DEVICE: [Self; 8] = [
        Self::UsedBytes,
        Self::ReservedBytes,
        Self::FreeBytes,
        Self::TotalBytes,
        Self::UtilizationGpuPercent,
        Self::UtilizationMemoryPercent,
        Self::TemperatureC,
        Self::PowerMw,
    ];

    /// The number stored in the database.
    pub fn code(self) -> i64 {
        match self {
            Self::UsedBytes => 1,
            Self::ReservedBytes => 2,
            Self::FreeBytes => 3,
            Self::TotalBytes => 4,
            Self::UtilizationGpuPercent => 5,
            Self::UtilizationMemoryPercent => 6,
            Self::TemperatureC => 7,
            Self::PowerMw => 8,
            Self::ProcessUsedBytes => 16,
            Self::ProcessSmPercent => 17,
            Self::ProcessCpuTicks => 32,
            Self::ProcessAllocatedBytes => 18,
            Self::ProcessReservedBytes => 19,
        }
    }

    /// The metric stored as `code`.
    pub fn from_code(code: i64) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.code() == code)
    }

    /// The name used in JSON and CSV.
    pub fn name(self) -> &'static str {
        match self {
            Self::UsedBytes => "used_bytes",
            Self::ReservedBytes => "reserved_bytes",
            Self::FreeBytes => "free_bytes",
            Self::TotalBytes => "total_bytes",
            Self::UtilizationGpuPercent => "utilization_gpu_percent",
            Self::UtilizationMemoryPercent => "utilization_memory_percent",
            Self::TemperatureC => "temperature_c",
            Self::PowerMw => "power_mw",
            Self::ProcessUsedBytes => "process_used_bytes",
            Self::ProcessSmPercent => "process_sm_percent",
            Self::ProcessCpuTicks => "process_cpu_ticks",
            Self::ProcessAllocatedBytes => "process_allocated_bytes",
            Self::ProcessReservedBytes => "process_reserved_bytes",
        }
    }

    /// The metric called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// Static facts about a device, as a tick names it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMeta {
    /// `GPU-…` or `MIG-…`: the identity.
    pub uuid: String,
    /// NVML index when recorded.
    pub index: Option<u32>,
    /// Product name.
    pub name: Option<String>,
    /// PCI bus id.
    pub pci_bus_id: Option<String>,
    /// For a MIG instance: its GPU's UUID.
    pub parent_uuid: Option<String>,
}

/// One observed value: a number, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// The value.
    Value(u64),
    /// Not reported, and why (`not supported`, `no permission`, `[N/A]` …).
    Missing(String),
}

/// What a tick saw of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSample {
    /// The device.
    pub device: DeviceMeta,
    /// What was read.
    pub state: DeviceSampleState,
}

/// A device's reading, or why it could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSampleState {
    /// The device answered.
    Read {
        /// Device metrics observed this tick (others keep their value).
        metrics: Vec<(Metric, Observed)>,
        /// The process list, if observed this tick.
        processes: ProcessList,
    },
    /// The whole device could not be read (lost, error): every series of it stops, and a
    /// gap with this reason starts.
    Unreadable(String),
}

/// A device's process list as observed by a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessList {
    /// Not looked at this tick: keep what was there.
    NotObserved,
    /// Could not be read, and why.
    Missing(String),
    /// The processes holding memory; any other process is gone from this device.
    Observed(Vec<ProcessOnDevice>),
}

/// One process's use of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessOnDevice {
    /// PID as the driver reports it; the tick's [`ProcessSample`] with this PID (if any)
    /// gives its identity.
    pub pid: u32,
    /// Memory; `None` when the driver says "not available".
    pub used_bytes: Option<u64>,
    /// SM activity, where reported.
    pub sm_percent: Option<u32>,
    /// What the process's in-process agent says about this device; `None` without an
    /// agent (its series stop: absent, never 0).
    pub agent: Option<AgentBytes>,
}

/// A process's memory on a device as its framework counts it (the agent's `stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentBytes {
    /// Bytes in live tensors ([`Metric::ProcessAllocatedBytes`]).
    pub allocated_bytes: Option<u64>,
    /// Bytes the allocator holds from the driver ([`Metric::ProcessReservedBytes`]).
    pub reserved_bytes: Option<u64>,
}

/// Who a process is, as far as it is known.
///
/// The full identity is `(boot id, pid, start time)`; an imported log has only the PID, and
/// a process outside our PID namespace has no start time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProcessKey {
    /// Boot id, when known.
    pub boot_id: Option<String>,
    /// PID.
    pub pid: u32,
    /// Start time in clock ticks after boot, when known.
    pub start_time_ticks: Option<u64>,
}

/// What a tick knows about a process beyond its memory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMeta {
    /// Identity.
    pub key: ProcessKey,
    /// Real uid.
    pub uid: Option<u32>,
    /// User name.
    pub user: Option<String>,
    /// Command line.
    pub command: Option<String>,
    /// Container id (64 hex digits) from its cgroup.
    pub container_id: Option<String>,
    /// Kubernetes pod UID from its cgroup.
    pub pod_uid: Option<String>,
    /// Slurm job id (from its cgroup path, else its environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_id: Option<u32>,
}

/// A process as a tick saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSample {
    /// Identity and metadata (written once, at first sight).
    pub meta: ProcessMeta,
    /// CPU time, when read this tick (else the previous value holds).
    pub cpu_ticks: Option<u64>,
}

/// Everything one tick observed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TickSample {
    /// When, in ms since the Unix epoch. Must be after the previous tick's.
    pub at_unix_ms: i64,
    /// `Some(reason)` when nothing could be read at all (NVML did not start): every series
    /// stops and one gap covers all devices.
    pub unavailable: Option<String>,
    /// Devices observed.
    pub devices: Vec<DeviceSample>,
    /// Processes observed (identity, metadata, CPU time), by PID.
    pub processes: Vec<ProcessSample>,
}

/// Where a recording came from, stored once per session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// `record`, `import:<format>` …
    pub source: String,
    /// Host name.
    pub host: Option<String>,
    /// Boot id of the recording machine.
    pub boot_id: Option<String>,
    /// Sampling interval, when regular.
    pub interval_ms: Option<i64>,
    /// Driver version.
    pub driver_version: Option<String>,
    /// CUDA driver version.
    pub cuda_version: Option<String>,
}

/// A stored device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    /// Row id in this database.
    pub id: i64,
    /// Static facts.
    #[serde(flatten)]
    pub meta: DeviceMeta,
    /// First time it was seen.
    pub first_seen_ms: i64,
}

/// A stored process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// Row id in this database.
    pub id: i64,
    /// Identity and metadata.
    #[serde(flatten)]
    pub meta: ProcessMeta,
    /// First time it was seen.
    pub first_seen_ms: i64,
    /// Last time it was seen (updated at key frames and when it leaves, so it can lag by
    /// up to one key-frame interval after a crash).
    pub last_seen_ms: i64,
}

/// One point of a series: a sample (`span_ms == 0`) or a bucket of samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    /// Sample time, or bucket start.
    pub unix_ms: i64,
    /// 0 for a raw sample; the bucket length for a downsampled point.
    pub span_ms: i64,
    /// Smallest value in the bucket (the value for a raw sample).
    pub min: u64,
    /// Largest value in the bucket.
    pub max: u64,
    /// Latest value in the bucket.
    pub last: u64,
}

/// A stretch of time in which a value was not recorded, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    /// The device, or `None` when no device could be read (NVML down, writer behind).
    pub device_uuid: Option<String>,
    /// The metric, or `None` when the whole device was unreadable.
    pub metric: Option<Metric>,
    /// First tick of the gap.
    pub from_ms: i64,
    /// Last tick known to be in the gap (the first good tick, once it ended).
    pub to_ms: i64,
    /// Whether it was still open when last written.
    pub open: bool,
    /// Why: `GPU lost`, `not supported`, `NVML did not start: …`, `disk full` …
    pub reason: String,
}

/// A closed time range in ms since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeRange {
    /// Start, inclusive.
    pub from_ms: i64,
    /// End, inclusive.
    pub to_ms: i64,
}

impl TimeRange {
    /// Everything.
    pub const ALL: Self = Self {
        from_ms: i64::MIN,
        to_ms: i64::MAX,
    };

    /// Whether `t` is inside.
    pub fn contains(self, t: i64) -> bool {
        self.from_ms <= t && t <= self.to_ms
    }
}
