//! `vramctl doctor`: facts in, findings out (`docs/doctor.md`).
//!
//! Collection and judgement are apart so that every judgement is a pure function tested on
//! hand-built facts, and the command only wires them:
//!
//! ```text
//! collect::nvml ─────────┐ (driver, per GPU: diagnostics, health, one reading; pairs)
//! collect::holders ──────┤ (/proc: who has /dev/nvidia* open)
//! collect::kernel_log ───┼─▶ Facts ─▶ judge ─▶ Vec<Finding> ─▶ cmd/doctor.rs (table, --json)
//! python_env::collect ───┤ (site-packages: the frameworks' CUDA, never imported)
//! collect::parents ──────┤ (/proc: the parent of each listed process, for `p2p`)
//! collect::env / host ───┤ (CUDA_VISIBLE_DEVICES, container, root)
//! container_view::collect┘ (PID and cgroup namespaces, the host daemon, /dev/nvidia-caps)
//! ```
//!
//! The checks that need no driver (`frameworks`, `visible_devices`, `container`,
//! `pid_namespace`, `cgroup_namespace`, `process_visibility`, `kernel_log`) are judged even when NVML cannot start: that is when
//! a user needs them most.
//!
//! Its main types are [`Facts`] (what [`collect`] and [`python_env`] gathered) and
//! [`Finding`] (one check's outcome, from [`judge`]). It stands on `vramctl-core` and
//! `vramctl-observe` and must not depend on the `vramctl` package: printing and the exit
//! code are the binary's `cmd/doctor.rs`.

pub mod collect;
pub mod container_view;
pub mod cuda_compat;
mod gpu_checks;
mod host_checks;
mod link_checks;
pub mod python_env;
pub mod xid;

use std::collections::BTreeMap;

use serde::Serialize;
use vramctl_core::topology::GpuPair;
use vramctl_core::types::{DeviceDiagnostics, DeviceHealth, DeviceReading};

/// Version of the `--json` document (`docs/json.md`).
pub const SCHEMA: u32 = 1;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Nothing wrong.
    Ok,
    /// Not judged; the summary says why.
    Skipped,
    /// Worth a look; nothing is broken yet.
    Warn,
    /// Broken, or will break work: exit 1.
    Fail,
}

impl Status {
    /// `ok`, `skipped`, `warn`, `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Skipped => "skipped",
            Self::Warn => "warn",
            Self::Fail => "fail",
        }
    }
}

/// One check's outcome for one subject (the host, a GPU, a Python environment).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// The check, a fixed name (`docs/doctor.md` lists them).
    pub id: &'static str,
    /// What was checked: `host`, `GPU 0`, a site-packages path.
    pub subject: String,
    /// The GPU's index, for a per-GPU check.
    pub gpu: Option<u32>,
    /// The outcome.
    pub status: Status,
    /// One line with the numbers; for `skipped`, why.
    pub summary: String,
    /// The facts behind it, by name (bytes as integers).
    pub facts: BTreeMap<&'static str, serde_json::Value>,
    /// What to do, one line; `None` when nothing needs doing.
    pub fix: Option<String>,
}

impl Finding {
    fn new(id: &'static str, subject: impl Into<String>, status: Status, summary: String) -> Self {
        Self {
            id,
            subject: subject.into(),
            gpu: None,
            status,
            summary,
            facts: BTreeMap::new(),
            fix: None,
        }
    }

    fn gpu(mut self, index: u32) -> Self {
        self.gpu = Some(index);
        self
    }

    fn fact(mut self, name: &'static str, value: impl Serialize) -> Self {
        self.facts.insert(
            name,
            serde_json::to_value(value).unwrap_or(serde_json::Value::Null),
        );
        self
    }

    fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

/// Everything the checks judge.
#[derive(Debug, Clone)]
pub struct Facts {
    /// NVML and the kernel module.
    pub driver: DriverFacts,
    /// The GPUs chosen with `--gpu` (all by default).
    pub gpus: Vec<GpuFacts>,
    /// Every GPU NVML lists, for `CUDA_VISIBLE_DEVICES` (which names devices `--gpu` may
    /// have left out).
    pub all_gpus: Vec<GpuIdentity>,
    /// Who has `/dev/nvidia*` open.
    pub holders: HolderFacts,
    /// The kernel log's Xid events, or why it could not be read.
    pub kernel_log: Result<KernelLog, String>,
    /// The Python environments found.
    pub python: python_env::PythonFacts,
    /// The environment variables that decide what CUDA sees.
    pub env: EnvFacts,
    /// The host: container, device files, root.
    pub host: HostFacts,
    /// What can be seen from here: PID and cgroup namespaces, the host daemon, MIG devices.
    pub view: container_view::ViewFacts,
    /// How every two chosen GPUs connect (PCIe path, P2P, NVLinks between them).
    pub pairs: Vec<GpuPair>,
    /// The parent PID of each process NVML lists, where /proc shows it (the host's PID
    /// namespace only): ranks of one launcher are one job to the `p2p` check.
    pub parents: BTreeMap<u32, u32>,
}

/// The driver stack as far as it answered.
#[derive(Debug, Clone)]
pub enum DriverFacts {
    /// NVML started.
    Ready(DriverReady),
    /// NVML did not start (exit 3).
    Unusable(NoDriver),
}

/// NVML started: the versions.
#[derive(Debug, Clone, Default)]
pub struct DriverReady {
    /// `580.159.04`.
    pub driver_version: Option<String>,
    /// `13.580.159.04`.
    pub nvml_version: Option<String>,
    /// The CUDA version the driver supports, `13.0`.
    pub cuda_driver_version: Option<String>,
    /// The kernel module's version from `/proc/driver/nvidia/version`.
    pub kernel_module_version: Option<String>,
    /// Devices counted but not opened, `(index, why)`.
    pub unopened: Vec<(u32, String)>,
}

/// Why NVML did not start, diagnosed as far as the host lets us.
#[derive(Debug, Clone)]
pub struct NoDriver {
    /// `InitError::code`: `library_not_loaded`, `driver_not_loaded`, `version_mismatch`, …
    pub code: &'static str,
    /// NVML's or the loader's message.
    pub reason: String,
    /// What to do (`InitError::hint`).
    pub hint: &'static str,
    /// The kernel module's version (`/proc/driver/nvidia/version`); `None`: not loaded.
    pub kernel_module_version: Option<String>,
}

/// A GPU's name and number, as NVML enumerates it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuIdentity {
    /// NVML index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// The model.
    pub name: Option<String>,
    /// `N` of `/dev/nvidiaN`.
    pub minor_number: Option<u32>,
    /// `00000000:00:06.0`.
    pub pci_bus_id: Option<String>,
}

/// What NVML said about one GPU.
#[derive(Debug, Clone)]
pub struct GpuFacts {
    /// Which GPU.
    pub id: GpuIdentity,
    /// `vramctl info`'s facts, or why they could not be read.
    pub diagnostics: Result<DeviceDiagnostics, String>,
    /// Memory repair state and clock event reasons (`None`: the backend has none).
    pub health: Result<Option<DeviceHealth>, String>,
    /// One reading: memory, utilization, the processes.
    pub reading: Option<DeviceReading>,
}

/// A process with `/dev/nvidia*` open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// PID in our namespace.
    pub pid: u32,
    /// Its command (short).
    pub command: String,
    /// Its owner.
    pub uid: Option<u32>,
    /// `/proc/PID/stat`'s state (`R`, `S`, `D`, `Z`, …).
    pub state: Option<char>,
    /// The device files it has open.
    pub files: Vec<String>,
}

/// Who has the device files open, as far as we may look.
#[derive(Debug, Clone, Default)]
pub struct HolderFacts {
    /// Holders found (vramctl itself left out).
    pub holders: Vec<Holder>,
    /// Processes whose descriptors we could not read (other users', unless root).
    pub unreadable: usize,
    /// Whether NVML's PIDs are ours (the initial PID namespace).
    pub initial_pid_namespace: bool,
}

/// Xid events from one log source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelLog {
    /// `/dev/kmsg` or `journalctl -k -b`.
    pub source: String,
    /// The events, in order.
    pub events: Vec<xid::XidEvent>,
}

/// The variables that decide which GPUs CUDA sees.
#[derive(Debug, Clone, Default)]
pub struct EnvFacts {
    /// `CUDA_VISIBLE_DEVICES`.
    pub cuda_visible_devices: Option<String>,
    /// `NVIDIA_VISIBLE_DEVICES` (read by the container toolkit when a container starts).
    pub nvidia_visible_devices: Option<String>,
    /// `CUDA_DEVICE_ORDER`.
    pub cuda_device_order: Option<String>,
}

/// The host around the GPUs.
#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    /// What says we run in a container (`/.dockerenv`, `/run/.containerenv`, the cgroup),
    /// `None` when nothing does.
    pub container: Option<String>,
    /// The `/dev/nvidia*` files present.
    pub device_files: Vec<String>,
    /// Our effective uid.
    pub euid: u32,
    /// `/proc` is mounted with `hidepid=` (other users' processes are hidden).
    pub proc_hidepid: bool,
}

/// Runs every check, in the order of `docs/doctor.md`.
pub fn judge(facts: &Facts) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(host_checks::driver(&facts.driver));
    out.extend(host_checks::frameworks(&facts.driver, &facts.python));
    out.push(host_checks::visible_devices(
        &facts.driver,
        &facts.env,
        &facts.all_gpus,
        &facts.gpus,
    ));
    out.push(host_checks::container(&facts.host, &facts.env));
    out.push(container_view::pid_namespace(&facts.view));
    out.push(container_view::cgroup_namespace(&facts.view));
    out.push(container_view::mig_devices(&facts.view, &facts.gpus));
    out.push(host_checks::process_visibility(&facts.host, &facts.holders));
    out.push(host_checks::kernel_log(&facts.kernel_log, &facts.all_gpus));
    for gpu in &facts.gpus {
        out.extend(gpu_checks::all(gpu, &facts.holders));
        if let Ok(diag) = &gpu.diagnostics {
            let subject = format!("GPU {}", gpu.id.index);
            out.extend(link_checks::nvlink(diag, &subject, gpu.id.index));
        }
    }
    for pair in &facts.pairs {
        out.extend(link_checks::p2p(pair, &facts.gpus, &facts.parents));
    }
    out
}

/// Whether any finding failed (exit 1).
pub fn any_failed(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.status == Status::Fail)
}
