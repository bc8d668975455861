//! The exposition text: a pure function of one snapshot and what the sampler thread knows
//! about it. No clock, no I/O; rendered once per tick and served from the cache.
//!
//! Two formats from the same rows: Prometheus text 0.0.4 (the default) and OpenMetrics
//! 1.0.0 (when the scrape's `Accept` asks for it, as Prometheus does). They differ in the
//! `# TYPE` name of counters and info metrics and in the final `# EOF`, which the server
//! appends after the one dynamic line (see [`render_tail`]).
//!
//! Every family is listed in [`FAMILIES`] and documented in `docs/metrics.md` (a test
//! checks that). A family without samples is left out entirely.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use vramctl_agent::agent_poll::AgentFigures;
use vramctl_core::types::{DeviceInfo, DeviceState, ProcessUsage, Snapshot};

use super::metadata::{ProcessLabels, ProcessMetadata};
use super::stats::{ERROR_KINDS, Stats};

pub mod dcgm;

/// Exposition format of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`.
    Prometheus,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// OpenMetrics when the `Accept` header lists it with a non-zero quality, as
    /// Prometheus' scrapes do; the Prometheus text format otherwise.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Self::Prometheus;
        };
        let wants_openmetrics = accept.split(',').any(|range| {
            let mut params = range.split(';').map(str::trim);
            let media = params.next().unwrap_or_default();
            media.eq_ignore_ascii_case("application/openmetrics-text")
                && params.all(|p| {
                    p.strip_prefix("q=")
                        .is_none_or(|q| q.parse::<f32>().is_ok_and(|q| q > 0.0))
                })
        });
        if wants_openmetrics {
            Self::OpenMetrics
        } else {
            Self::Prometheus
        }
    }
}

/// Prometheus metric type of a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A value that goes up and down.
    Gauge,
    /// A count that only rises; samples are named `<name>_total`.
    Counter,
    /// A constant 1 carrying labels; samples are named `<name>_info`.
    Info,
}

/// One metric family.
#[derive(Debug)]
pub struct Family {
    /// Name without the `_total` / `_info` sample suffix.
    pub name: &'static str,
    /// Type.
    pub kind: Kind,
    /// The `# HELP` text.
    pub help: &'static str,
}

impl Family {
    /// The name samples carry.
    pub fn sample_name(&self) -> String {
        match self.kind {
            Kind::Gauge => self.name.to_owned(),
            Kind::Counter => format!("{}_total", self.name),
            Kind::Info => format!("{}_info", self.name),
        }
    }
}

macro_rules! families {
    ($($ident:ident = $name:literal, $kind:ident, $help:literal;)*) => {
        $(
            #[doc = $help]
            pub const $ident: Family = Family { name: $name, kind: Kind::$kind, help: $help };
        )*
        /// Every family the exporter can emit, in output order.
        #[cfg(test)]
        pub const FAMILIES: &[&Family] = &[$(&$ident),*];
    };
}

families! {
    BUILD = "vramctl_build", Info, "vramctl's version.";
    NVML_UP = "vramctl_nvml_up", Gauge, "1 when NVML is initialised, 0 while it is not (init is retried with backoff).";
    NVML_INIT_FAILURES = "vramctl_nvml_init_failures", Counter, "Failed NVML init attempts, by reason.";
    NVML_REOPENS = "vramctl_nvml_reopens", Counter, "NVML sessions shut down and started again because the driver stopped answering (reloaded, GPU reset), by reason (session_lost, devices_failing).";
    SAMPLES = "vramctl_samples", Counter, "Collections the sampler has made (one per --interval).";
    SAMPLE_DURATION = "vramctl_sample_duration_seconds", Gauge, "Time the last collection took (NVML and /proc); a scrape only copies its rendered result.";
    LAST_SAMPLE_TIMESTAMP = "vramctl_last_sample_timestamp_seconds", Gauge, "Unix time of the last GPU snapshot.";
    COLLECTION_ERRORS = "vramctl_collection_errors", Counter, "Errors while reading a device, by kind (gpu_lost, device_error, no_permission, nvml_error, insane_value).";
    OOMS = "vramctl_oom", Counter, "CUDA out-of-memory errors the processes' in-process agents reported, by cause (shortage, fragmentation, other-process, process-limit, cached-elsewhere, leak: the snapshot classifier on the agent's snapshot at a process's first OOM; unknown: its later OOMs and those that could not be classified). Only with --process-details proc.";
    DRIVER = "vramctl_driver", Info, "Driver, NVML and CUDA driver versions.";
    DEVICE = "vramctl_device", Info, "Static facts about a GPU.";
    DEVICE_UP = "vramctl_device_up", Gauge, "1 when the GPU answered this collection, 0 when it is lost or failed.";
    MEMORY_TOTAL = "vramctl_device_memory_total_bytes", Gauge, "Installed GPU memory.";
    MEMORY_USED = "vramctl_device_memory_used_bytes", Gauge, "GPU memory in use (NVML v2 used, nvidia-smi's Used).";
    MEMORY_RESERVED = "vramctl_device_memory_reserved_bytes", Gauge, "GPU memory reserved by the driver and firmware.";
    MEMORY_FREE = "vramctl_device_memory_free_bytes", Gauge, "GPU memory neither used nor reserved.";
    MEMORY_USED_MAX = "vramctl_device_memory_used_max_bytes", Gauge, "Highest used GPU memory seen by the sampler over the peak window (--peak-window), so spikes between scrapes show.";
    MEMORY_UNACCOUNTED = "vramctl_device_memory_unaccounted_bytes", Gauge, "Used GPU memory that no listed process accounts for.";
    UTILIZATION = "vramctl_device_utilization_ratio", Gauge, "Fraction of the driver's sample period in which a kernel ran (0 to 1).";
    MEMORY_UTILIZATION = "vramctl_device_memory_utilization_ratio", Gauge, "Fraction of the driver's sample period in which device memory was read or written (0 to 1).";
    TEMPERATURE = "vramctl_device_temperature_celsius", Gauge, "GPU core temperature.";
    POWER = "vramctl_device_power_watts", Gauge, "Power draw of the board.";
    PROCESSES = "vramctl_device_processes", Gauge, "Processes holding memory on the GPU.";
    PROCESS_SERIES_DROPPED = "vramctl_device_process_series_dropped", Gauge, "Processes with memory on the GPU left out of the per-process series by --max-process-series (the smallest holders).";
    MIG_MEMORY_TOTAL = "vramctl_mig_memory_total_bytes", Gauge, "Memory of a MIG device.";
    MIG_MEMORY_USED = "vramctl_mig_memory_used_bytes", Gauge, "Memory in use on a MIG device.";
    MIG_MEMORY_FREE = "vramctl_mig_memory_free_bytes", Gauge, "Free memory of a MIG device.";
    PROCESS_MEMORY = "vramctl_process_memory_used_bytes", Gauge, "GPU memory a process holds, as the driver attributes it (top --max-process-series per GPU).";
    PROCESS_ALLOCATED = "vramctl_process_allocated_bytes", Gauge, "Bytes in the process's live tensors, as its framework says through the in-process agent (only processes with an agent; refreshed every 10 s).";
    PROCESS_RESERVED = "vramctl_process_reserved_bytes", Gauge, "Bytes the process's framework allocator holds from the driver (live tensors plus cache), through the in-process agent (only processes with an agent; refreshed every 10 s).";
    PROCESS_LEAK = "vramctl_process_leak", Gauge, "1 when the leak analysis judges the process's memory to be leaking, else 0.";
    PROCESS_LEAK_SLOPE = "vramctl_process_leak_slope_bytes_per_second", Gauge, "Growth of the process's memory that the leak analysis measured.";
    PROCESS_IDLE_HOLDER = "vramctl_process_idle_holder", Gauge, "1 when the idle analysis judges the process an idle holder (at least --min-idle-mem held without GPU activity for --idle-for), else 0.";
    PROCESS_IDLE = "vramctl_process_idle_seconds", Gauge, "How long the process has held memory without using the GPU, per the idle analysis.";
    PROCESS_INFO = "vramctl_process", Info, "Who owns a process that has series: user, command, container (id, name, runtime), Kubernetes pod (UID, namespace, name, container), Slurm job and step; join on pid.";
    JOB_INFO = "vramctl_job", Info, "A Slurm job holding GPU memory: its user and partition; join on slurm_job.";
    JOB_MEMORY_MAX = "vramctl_job_memory_used_max_bytes", Gauge, "Most GPU memory a Slurm job's processes held together on any one GPU at one sample since the exporter first saw the job (per GPU: vramctl_process_memory_used_bytes joined with vramctl_process_info).";
    LAST_SAMPLE_AGE = "vramctl_last_sample_age_seconds", Gauge, "Seconds since the sampler last published, at the time of this scrape.";
}

/// What the leak and idle analysis says about one process. Filled each tick by the live
/// analysis (`crate::live_verdicts::LiveAnalysis`); a process without an entry gets none of
/// these series.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessVerdict {
    /// Whether the process is leaking; `None` when the analysis has no verdict yet.
    pub leaking: Option<bool>,
    /// The growth the analysis measured, bytes per second.
    pub leak_slope_bytes_per_second: Option<f64>,
    /// Whether the process is an idle holder; `None` when the analysis has no verdict yet.
    pub idle_holder: Option<bool>,
    /// How long the process has held memory while idle (0 while the evidence shows it
    /// active); `None` without any activity evidence.
    pub idle_seconds: Option<f64>,
}

/// Verdicts by (GPU UUID, PID).
pub type ProcessVerdicts = HashMap<(String, u32), ProcessVerdict>;

/// Settings of the rendering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderOptions {
    /// Per-process series per GPU, biggest holders first.
    pub max_process_series: usize,
    /// `--metrics-compat dcgm`: also dcgm-exporter's device series ([`dcgm`]).
    pub dcgm: Option<dcgm::DcgmLabels>,
}

/// The exposition text of one collection, without the dynamic tail.
///
/// `snapshot` is `None` while NVML is down: then only the exporter's own families appear.
pub fn render(
    snapshot: Option<&Snapshot>,
    metadata: &ProcessMetadata,
    verdicts: &ProcessVerdicts,
    agents: &AgentFigures,
    stats: &Stats,
    options: &RenderOptions,
    format: Format,
) -> String {
    let mut out = Out {
        text: String::with_capacity(4096),
        format,
    };
    out.family(&BUILD, |f| {
        f.row(&[("version", env!("CARGO_PKG_VERSION"))], 1u64)
    });
    out.family(&NVML_UP, |f| f.row(&[], u64::from(stats.nvml_up)));
    out.family(&NVML_INIT_FAILURES, |f| {
        for (reason, n) in &stats.nvml_init_failures {
            f.row(&[("reason", reason)], *n);
        }
    });
    out.family(&NVML_REOPENS, |f| {
        for (reason, n) in &stats.nvml_reopens {
            f.row(&[("reason", reason)], *n);
        }
    });
    out.family(&SAMPLES, |f| f.row(&[], stats.samples_total));
    out.family(&SAMPLE_DURATION, |f| {
        f.row(&[], stats.sample_duration.as_secs_f64());
    });
    out.family(&LAST_SAMPLE_TIMESTAMP, |f| {
        if let Some(ms) = stats.last_snapshot_unix_ms {
            f.row(&[], ms as f64 / 1000.0);
        }
    });
    out.family(&COLLECTION_ERRORS, |f| {
        for ((index, uuid), counts) in &stats.errors {
            let gpu = index.to_string();
            for (kind, n) in ERROR_KINDS.iter().zip(counts) {
                f.row(&[("gpu", &gpu), ("uuid", uuid), ("kind", kind)], *n);
            }
        }
    });
    out.family(&OOMS, |f| {
        for (cause, n) in &stats.ooms_by_cause {
            f.row(&[("cause", cause)], *n);
        }
    });
    if let Some(snapshot) = snapshot {
        render_devices(
            &mut out, snapshot, metadata, verdicts, agents, stats, options,
        );
    }
    out.text
}

/// The part of a response computed per scrape: the age of the cached sample, and
/// OpenMetrics' closing `# EOF`.
pub fn render_tail(age: Duration, format: Format) -> String {
    let mut out = Out {
        text: String::with_capacity(160),
        format,
    };
    out.family(&LAST_SAMPLE_AGE, |f| f.row(&[], age.as_secs_f64()));
    if format == Format::OpenMetrics {
        out.text.push_str("# EOF\n");
    }
    out.text
}

fn render_devices(
    out: &mut Out,
    snapshot: &Snapshot,
    metadata: &ProcessMetadata,
    verdicts: &ProcessVerdicts,
    agents: &AgentFigures,
    stats: &Stats,
    options: &RenderOptions,
) {
    let driver = &snapshot.driver;
    out.family(&DRIVER, |f| {
        f.row(
            &[
                (
                    "driver_version",
                    driver.driver_version.as_deref().unwrap_or(""),
                ),
                ("nvml_version", driver.nvml_version.as_deref().unwrap_or("")),
                (
                    "cuda_driver_version",
                    driver.cuda_driver_version.as_deref().unwrap_or(""),
                ),
            ],
            1u64,
        );
    });
    let devices: Vec<Device<'_>> = snapshot
        .devices
        .iter()
        .map(|d| Device {
            gpu: d.info.index.to_string(),
            info: &d.info,
            state: &d.state,
        })
        .collect();
    out.family(&DEVICE, |f| {
        for d in &devices {
            let mig = match d.info.mig_enabled {
                Some(true) => "enabled",
                Some(false) => "disabled",
                None => "",
            };
            f.row(
                &[
                    ("gpu", &d.gpu),
                    ("uuid", &d.info.uuid),
                    ("name", d.info.name.as_deref().unwrap_or("")),
                    ("pci_bus_id", d.info.pci_bus_id.as_deref().unwrap_or("")),
                    ("mig_mode", mig),
                ],
                1u64,
            );
        }
    });
    out.family(&DEVICE_UP, |f| {
        for d in &devices {
            let up = matches!(d.state, DeviceState::Ok(_));
            f.row(&d.labels(), u64::from(up));
        }
        for unopened in &snapshot.unopened {
            f.row(&[("gpu", &unopened.index.to_string()), ("uuid", "")], 0u64);
        }
    });
    let devices = devices.as_slice();
    let memory = |pick: fn(&vramctl_core::types::MemoryReading) -> u64| {
        move |f: &mut Rows<'_>| {
            for d in devices {
                if let Some(m) = d.reading().and_then(|r| r.memory) {
                    f.row(&d.labels(), pick(&m));
                }
            }
        }
    };
    out.family(&MEMORY_TOTAL, memory(|m| m.total_bytes));
    out.family(&MEMORY_USED, memory(|m| m.used_bytes));
    out.family(&MEMORY_RESERVED, memory(|m| m.reserved_bytes));
    out.family(&MEMORY_FREE, memory(|m| m.free_bytes));
    out.family(&MEMORY_USED_MAX, |f| {
        for d in devices {
            if d.reading().and_then(|r| r.memory).is_some() {
                if let Some(peak) = stats.peak_used_bytes(&d.info.uuid) {
                    f.row(&d.labels(), peak);
                }
            }
        }
    });
    out.family(&MEMORY_UNACCOUNTED, |f| {
        for d in devices {
            if let Some(bytes) = d.reading().and_then(|r| r.unaccounted_bytes()) {
                f.row(&d.labels(), bytes);
            }
        }
    });
    let ratio = |pick: fn(&vramctl_core::types::DeviceReading) -> Option<u32>| {
        move |f: &mut Rows<'_>| {
            for d in devices {
                if let Some(percent) = d.reading().and_then(pick) {
                    f.row(&d.labels(), f64::from(percent) / 100.0);
                }
            }
        }
    };
    out.family(&UTILIZATION, ratio(|r| r.utilization_gpu_percent));
    out.family(&MEMORY_UTILIZATION, ratio(|r| r.utilization_memory_percent));
    out.family(&TEMPERATURE, |f| {
        for d in devices {
            if let Some(c) = d.reading().and_then(|r| r.temperature_c) {
                f.row(&d.labels(), c);
            }
        }
    });
    out.family(&POWER, |f| {
        for d in devices {
            if let Some(mw) = d.reading().and_then(|r| r.power_mw) {
                f.row(&d.labels(), f64::from(mw) / 1000.0);
            }
        }
    });
    out.family(&PROCESSES, |f| {
        for d in devices {
            if let Some(list) = d.reading().and_then(|r| r.processes.as_ref()) {
                f.row(&d.labels(), list.len() as u64);
            }
        }
    });
    // The processes that get series: per GPU the biggest known holders, up to the cap.
    let exported: Vec<(&Device<'_>, Vec<&ProcessUsage>, usize)> = devices
        .iter()
        .filter_map(|d| {
            let list = d.reading()?.processes.as_ref()?;
            let (top, dropped) = top_processes(list, options.max_process_series);
            Some((d, top, dropped))
        })
        .collect();
    out.family(&PROCESS_SERIES_DROPPED, |f| {
        for (d, _, dropped) in &exported {
            f.row(&d.labels(), *dropped as u64);
        }
    });
    render_mig(out, devices);
    if let Some(host) = &options.dcgm {
        dcgm::render(out, devices, host);
    }
    let empty = ProcessLabels::default();
    let rows: Vec<ProcessRow<'_>> = exported
        .iter()
        .flat_map(|(d, top, _)| {
            top.iter().map(|p| ProcessRow {
                device: d,
                process: p,
                pid: p.pid.to_string(),
                mig_uuid: mig_uuid_of(d.info, p),
                labels: metadata.get(p.pid).unwrap_or(&empty),
            })
        })
        .collect();
    out.family(&PROCESS_MEMORY, |f| {
        for row in &rows {
            if let Some(used) = row.process.used_bytes {
                f.row(&row.labels(), used);
            }
        }
    });
    let agent = |row: &ProcessRow<'_>| agents.get(&(row.device.info.uuid.clone(), row.process.pid));
    out.family(&PROCESS_ALLOCATED, |f| {
        for row in &rows {
            if let Some(bytes) = agent(row).and_then(|a| a.allocated_bytes) {
                f.row(&row.labels(), bytes);
            }
        }
    });
    out.family(&PROCESS_RESERVED, |f| {
        for row in &rows {
            if let Some(bytes) = agent(row).and_then(|a| a.reserved_bytes) {
                f.row(&row.labels(), bytes);
            }
        }
    });
    let verdict =
        |row: &ProcessRow<'_>| verdicts.get(&(row.device.info.uuid.clone(), row.process.pid));
    out.family(&PROCESS_LEAK, |f| {
        for row in &rows {
            if let Some(leaking) = verdict(row).and_then(|v| v.leaking) {
                f.row(&row.labels(), u64::from(leaking));
            }
        }
    });
    out.family(&PROCESS_LEAK_SLOPE, |f| {
        for row in &rows {
            if let Some(slope) = verdict(row).and_then(|v| v.leak_slope_bytes_per_second) {
                f.row(&row.labels(), slope);
            }
        }
    });
    out.family(&PROCESS_IDLE_HOLDER, |f| {
        for row in &rows {
            if let Some(idle_holder) = verdict(row).and_then(|v| v.idle_holder) {
                f.row(&row.labels(), u64::from(idle_holder));
            }
        }
    });
    out.family(&PROCESS_IDLE, |f| {
        for row in &rows {
            if let Some(idle) = verdict(row).and_then(|v| v.idle_seconds) {
                f.row(&row.labels(), idle);
            }
        }
    });
    render_owners(out, &rows, metadata);
}

/// One info series per process that has series (a process on several GPUs once), and the
/// Slurm jobs' series (`crate::owner_series`).
fn render_owners(out: &mut Out, rows: &[ProcessRow<'_>], metadata: &ProcessMetadata) {
    out.family(&PROCESS_INFO, |f| {
        let mut seen = std::collections::BTreeSet::new();
        for row in rows {
            let Some(owner) = &row.labels.owner else {
                continue;
            };
            if !seen.insert(row.process.pid) {
                continue;
            }
            let text = |v: &Option<String>| v.clone().unwrap_or_default();
            let labels = row.labels;
            f.row(
                &[
                    ("pid", &row.pid),
                    ("user", &text(&labels.user)),
                    ("command", &text(&labels.command)),
                    ("container", &text(&labels.container)),
                    ("container_name", &text(&owner.container_name)),
                    ("runtime", &text(&owner.runtime)),
                    ("pod", &text(&labels.pod)),
                    ("kube_namespace", &text(&owner.kube_namespace)),
                    ("kube_pod", &text(&owner.kube_pod)),
                    ("kube_container", &text(&owner.kube_container)),
                    ("slurm_job", &text(&owner.slurm_job)),
                    ("slurm_step", &text(&owner.slurm_step)),
                ],
                1u64,
            );
        }
    });
    let jobs = &metadata.jobs;
    out.family(&JOB_INFO, |f| {
        for job in jobs {
            f.row(
                &[
                    ("slurm_job", &job.job_id),
                    ("user", job.user.as_deref().unwrap_or("")),
                    ("partition", job.partition.as_deref().unwrap_or("")),
                ],
                1u64,
            );
        }
    });
    // One series per job (the issue's bound: at most 2 per job with its info series): its
    // highest peak on any one GPU, since a job's limit is each GPU's memory. What it holds
    // now, and on which GPU, is the process series joined with `vramctl_process_info`.
    out.family(&JOB_MEMORY_MAX, |f| {
        for job in jobs {
            if let Some(bytes) = job.gpus.iter().filter_map(|g| g.max_bytes).max() {
                f.row(&[("slurm_job", &job.job_id)], bytes);
            }
        }
    });
}

fn render_mig(out: &mut Out, devices: &[Device<'_>]) {
    let mig = |pick: fn(&vramctl_core::types::MemoryReading) -> u64| {
        move |f: &mut Rows<'_>| {
            for d in devices {
                let Some(reading) = d.reading() else { continue };
                for instance in &d.info.mig_instances {
                    let Some(memory) = reading.mig_memory(&instance.uuid) else {
                        continue;
                    };
                    let gi = instance
                        .gpu_instance_id
                        .map(|i| i.to_string())
                        .unwrap_or_default();
                    let ci = instance
                        .compute_instance_id
                        .map(|i| i.to_string())
                        .unwrap_or_default();
                    f.row(
                        &[
                            ("gpu", &d.gpu),
                            ("uuid", &d.info.uuid),
                            ("mig_uuid", &instance.uuid),
                            ("gpu_instance", &gi),
                            ("compute_instance", &ci),
                        ],
                        pick(&memory),
                    );
                }
            }
        }
    };
    out.family(&MIG_MEMORY_TOTAL, mig(|m| m.total_bytes));
    out.family(&MIG_MEMORY_USED, mig(|m| m.used_bytes));
    out.family(&MIG_MEMORY_FREE, mig(|m| m.free_bytes));
}

/// The `limit` biggest holders with known memory (ties by PID), and how many with known
/// memory were left out. A process whose memory the driver does not report gets no series.
fn top_processes(list: &[ProcessUsage], limit: usize) -> (Vec<&ProcessUsage>, usize) {
    let mut known: Vec<&ProcessUsage> = list.iter().filter(|p| p.used_bytes.is_some()).collect();
    known.sort_by(|a, b| b.used_bytes.cmp(&a.used_bytes).then(a.pid.cmp(&b.pid)));
    let dropped = known.len().saturating_sub(limit);
    known.truncate(limit);
    (known, dropped)
}

fn mig_uuid_of<'a>(info: &'a DeviceInfo, process: &ProcessUsage) -> Option<&'a str> {
    let gi = process.gpu_instance_id?;
    info.mig_instances
        .iter()
        .find(|m| {
            m.gpu_instance_id == Some(gi)
                && (process.compute_instance_id.is_none()
                    || m.compute_instance_id == process.compute_instance_id)
        })
        .map(|m| m.uuid.as_str())
}

struct Device<'a> {
    gpu: String,
    info: &'a DeviceInfo,
    state: &'a DeviceState,
}

impl Device<'_> {
    fn labels(&self) -> [(&str, &str); 2] {
        [("gpu", &self.gpu), ("uuid", &self.info.uuid)]
    }

    fn reading(&self) -> Option<&vramctl_core::types::DeviceReading> {
        match self.state {
            DeviceState::Ok(reading) => Some(reading),
            DeviceState::Lost { .. } | DeviceState::Error { .. } => None,
        }
    }
}

struct ProcessRow<'a> {
    device: &'a Device<'a>,
    process: &'a ProcessUsage,
    pid: String,
    mig_uuid: Option<&'a str>,
    labels: &'a ProcessLabels,
}

impl ProcessRow<'_> {
    fn labels(&self) -> Vec<(&str, &str)> {
        let mut labels = vec![
            ("gpu", self.device.gpu.as_str()),
            ("uuid", &self.device.info.uuid),
        ];
        if let Some(mig) = self.mig_uuid {
            labels.push(("mig_uuid", mig));
        }
        labels.extend([
            ("pid", self.pid.as_str()),
            ("command", self.labels.command.as_deref().unwrap_or("")),
            ("user", self.labels.user.as_deref().unwrap_or("")),
            ("container", self.labels.container.as_deref().unwrap_or("")),
            ("pod", self.labels.pod.as_deref().unwrap_or("")),
        ]);
        labels
    }
}

/// A sample value: integers print exactly, the rest as decimals.
enum Value {
    Int(u64),
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Self::Int(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Self::Int(u64::from(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Self::Float(v)
    }
}

struct Out {
    text: String,
    format: Format,
}

impl Out {
    /// Writes `family`'s header before its first row; nothing when `rows` writes none.
    fn family(&mut self, family: &'static Family, rows: impl FnOnce(&mut Rows<'_>)) {
        let sample_name = family.sample_name();
        let mut writer = Rows {
            out: self,
            family,
            sample_name,
            started: false,
        };
        rows(&mut writer);
    }
}

struct Rows<'a> {
    out: &'a mut Out,
    family: &'static Family,
    sample_name: String,
    started: bool,
}

impl Rows<'_> {
    fn row(&mut self, labels: &[(&str, &str)], value: impl Into<Value>) {
        let text = &mut self.out.text;
        if !self.started {
            self.started = true;
            let (type_name, type_word) = match (self.out.format, self.family.kind) {
                (Format::Prometheus, Kind::Gauge | Kind::Info) => {
                    (self.sample_name.as_str(), "gauge")
                }
                (Format::Prometheus, Kind::Counter) => (self.sample_name.as_str(), "counter"),
                (Format::OpenMetrics, Kind::Gauge) => (self.family.name, "gauge"),
                (Format::OpenMetrics, Kind::Counter) => (self.family.name, "counter"),
                (Format::OpenMetrics, Kind::Info) => (self.family.name, "info"),
            };
            let _ = writeln!(text, "# HELP {type_name} {}", escape_help(self.family.help));
            let _ = writeln!(text, "# TYPE {type_name} {type_word}");
        }
        text.push_str(&self.sample_name);
        // An empty label is the same as an absent one to Prometheus; leaving it out keeps
        // the text short.
        let mut first = true;
        for (name, value) in labels.iter().filter(|(_, v)| !v.is_empty()) {
            text.push(if first { '{' } else { ',' });
            first = false;
            text.push_str(name);
            text.push_str("=\"");
            escape_label_into(text, value);
            text.push('"');
        }
        if !first {
            text.push('}');
        }
        text.push(' ');
        match value.into() {
            Value::Int(v) => {
                let _ = write!(text, "{v}");
            }
            Value::Float(v) if v.is_finite() => {
                let _ = write!(text, "{v}");
            }
            Value::Float(v) if v.is_nan() => text.push_str("NaN"),
            Value::Float(v) => text.push_str(if v > 0.0 { "+Inf" } else { "-Inf" }),
        }
        text.push('\n');
    }
}

fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label_into(text: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => text.push_str("\\\\"),
            '"' => text.push_str("\\\""),
            '\n' => text.push_str("\\n"),
            c => text.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vramctl_core::types::{
        DeviceReading, DeviceSnapshot, DriverInfo, MemoryReading, ProcessKind,
    };

    use super::*;

    fn process(pid: u32, used: Option<u64>) -> ProcessUsage {
        ProcessUsage {
            pid,
            used_bytes: used,
            kind: ProcessKind::Compute,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    fn snapshot(processes: Vec<ProcessUsage>) -> Snapshot {
        Snapshot {
            taken_at_unix_ms: 1_700_000_000_000,
            monotonic_ms: 1_700_000_000_000,
            driver: Arc::new(DriverInfo {
                driver_version: Some("580.159.04".into()),
                nvml_version: None,
                cuda_driver_version: Some("13.0".into()),
            }),
            devices: vec![DeviceSnapshot {
                info: Arc::new(DeviceInfo {
                    index: 0,
                    uuid: "GPU-a".into(),
                    name: Some("NVIDIA H200".into()),
                    pci_bus_id: None,
                    minor_number: Some(0),
                    mig_enabled: Some(false),
                    mig_instances: Vec::new(),
                }),
                state: DeviceState::Ok(DeviceReading {
                    memory: Some(MemoryReading {
                        total_bytes: 1000,
                        used_bytes: 600,
                        reserved_bytes: 10,
                        free_bytes: 390,
                    }),
                    utilization_gpu_percent: Some(45),
                    processes: Some(processes),
                    ..DeviceReading::default()
                }),
            }],
            unopened: Vec::new(),
        }
    }

    fn stats() -> Stats {
        let mut stats = Stats::new(Duration::from_secs(60));
        stats.nvml_up = true;
        stats.samples_total = 1;
        stats
    }

    fn options(max: usize) -> RenderOptions {
        RenderOptions {
            max_process_series: max,
            dcgm: None,
        }
    }

    #[test]
    fn dcgm_compat_adds_dcgm_exporters_series_in_mib_beside_vramctls() {
        let snap = snapshot(vec![process(10, Some(100))]);
        let mut with_dcgm = options(20);
        with_dcgm.dcgm = Some(dcgm::DcgmLabels {
            hostname: "node-1".into(),
        });
        let render_with = |opts: &RenderOptions| {
            render(
                Some(&snap),
                &ProcessMetadata::default(),
                &ProcessVerdicts::default(),
                &AgentFigures::default(),
                &stats(),
                opts,
                Format::Prometheus,
            )
        };
        let plain = render_with(&options(20));
        let compat = render_with(&with_dcgm);
        assert!(!plain.contains("DCGM_"), "{plain}");
        // The vramctl series are unchanged: compat only adds.
        for line in plain.lines() {
            assert!(compat.contains(line), "{line} is gone");
        }
        // 1000 bytes total is 0 whole MiB, as DCGM would report it.
        assert!(
            compat.contains(
                "DCGM_FI_DEV_FB_TOTAL{gpu=\"0\",UUID=\"GPU-a\",device=\"nvidia0\",\
                 modelName=\"NVIDIA H200\",Hostname=\"node-1\"} 0\n"
            ),
            "{compat}"
        );
        assert!(
            compat.contains("# TYPE DCGM_FI_DEV_FB_USED gauge\n"),
            "{compat}"
        );
        assert!(
            compat.contains(
                "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-a\",device=\"nvidia0\",\
                 modelName=\"NVIDIA H200\",Hostname=\"node-1\"} 45\n"
            ),
            "{compat}"
        );
        for family in dcgm::DCGM_FAMILIES {
            assert!(
                std::fs::read_to_string(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../../docs/metrics.md"
                ))
                .expect("docs")
                .contains(&format!("`{}`", family.name)),
                "{} is not in docs/metrics.md",
                family.name
            );
        }
    }

    #[test]
    fn every_family_is_documented() {
        let docs = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/metrics.md"
        ))
        .expect("docs/metrics.md");
        for family in FAMILIES {
            let name = family.sample_name();
            assert!(
                docs.contains(&format!("| `{name}` |")),
                "{name} is missing from the tables in docs/metrics.md"
            );
        }
    }

    #[test]
    fn names_follow_prometheus_conventions() {
        for family in FAMILIES {
            let name = family.sample_name();
            assert!(name.starts_with("vramctl_"), "{name}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{name}"
            );
            match family.kind {
                Kind::Counter => assert!(name.ends_with("_total"), "{name}"),
                Kind::Info => assert!(name.ends_with("_info"), "{name}"),
                Kind::Gauge => assert!(!name.ends_with("_total"), "{name}"),
            }
            // Units in names: base units only.
            for wrong in ["_mib", "_kb", "_milliwatts", "_percent", "_ms"] {
                assert!(!name.contains(wrong), "{name}");
            }
        }
    }

    #[test]
    fn accept_header_picks_the_format() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Prometheus);
        assert_eq!(Format::negotiate(None), Format::Prometheus);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text; q=0, text/plain")),
            Format::Prometheus
        );
    }

    #[test]
    fn processes_beyond_the_cap_are_counted_not_exported() {
        let list = vec![
            process(10, Some(100)),
            process(11, Some(300)),
            process(12, Some(200)),
            process(13, None),
        ];
        let text = render(
            Some(&snapshot(list)),
            &ProcessMetadata::default(),
            &ProcessVerdicts::new(),
            &AgentFigures::new(),
            &stats(),
            &options(2),
            Format::Prometheus,
        );
        assert!(text.contains(
            "vramctl_process_memory_used_bytes{gpu=\"0\",uuid=\"GPU-a\",pid=\"11\"} 300\n"
        ));
        assert!(text.contains("pid=\"12\"} 200\n"));
        assert!(!text.contains("pid=\"10\""), "{text}");
        assert!(
            !text.contains("pid=\"13\""),
            "unknown memory gets no series"
        );
        assert!(
            text.contains("vramctl_device_process_series_dropped{gpu=\"0\",uuid=\"GPU-a\"} 1\n")
        );
        assert!(text.contains("vramctl_device_processes{gpu=\"0\",uuid=\"GPU-a\"} 4\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut metadata = ProcessMetadata::default();
        metadata.insert(
            10,
            ProcessLabels {
                command: Some("python -c \"print('a\\b')\"\nx".into()),
                user: Some("alice".into()),
                container: None,
                pod: None,
                owner: None,
            },
        );
        let text = render(
            Some(&snapshot(vec![process(10, Some(1))])),
            &metadata,
            &ProcessVerdicts::new(),
            &AgentFigures::new(),
            &stats(),
            &options(20),
            Format::Prometheus,
        );
        assert!(
            text.contains(r#"command="python -c \"print('a\\b')\"\nx",user="alice"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn openmetrics_names_counters_by_family_and_ends_in_eof() {
        let text = render(
            None,
            &ProcessMetadata::default(),
            &ProcessVerdicts::new(),
            &AgentFigures::new(),
            &stats(),
            &options(20),
            Format::OpenMetrics,
        ) + &render_tail(Duration::from_millis(250), Format::OpenMetrics);
        assert!(
            text.contains("# TYPE vramctl_samples counter\nvramctl_samples_total 1\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE vramctl_build info\nvramctl_build_info{version="));
        assert!(
            text.ends_with("vramctl_last_sample_age_seconds 0.25\n# EOF\n"),
            "{text}"
        );
        let plain = render_tail(Duration::from_secs(2), Format::Prometheus);
        assert!(plain.contains("# TYPE vramctl_last_sample_age_seconds gauge\n"));
        assert!(!plain.contains("EOF"));
    }

    #[test]
    fn nvml_down_shows_only_the_exporter() {
        let mut stats = Stats::new(Duration::from_secs(60));
        stats.init_failed("driver_not_loaded");
        let text = render(
            None,
            &ProcessMetadata::default(),
            &ProcessVerdicts::new(),
            &AgentFigures::new(),
            &stats,
            &options(20),
            Format::Prometheus,
        );
        assert!(text.contains("vramctl_nvml_up 0\n"));
        assert!(
            text.contains("vramctl_nvml_init_failures_total{reason=\"driver_not_loaded\"} 1\n")
        );
        assert!(!text.contains("vramctl_device"));
    }

    #[test]
    fn verdicts_appear_only_for_exported_processes_that_have_one() {
        let list = vec![process(10, Some(100)), process(11, Some(50))];
        let mut verdicts = ProcessVerdicts::new();
        verdicts.insert(
            ("GPU-a".into(), 10),
            ProcessVerdict {
                leaking: Some(true),
                leak_slope_bytes_per_second: Some(1_048_576.0),
                idle_holder: Some(false),
                idle_seconds: None,
            },
        );
        verdicts.insert(
            ("GPU-a".into(), 11),
            ProcessVerdict {
                leaking: Some(false),
                leak_slope_bytes_per_second: None,
                idle_holder: Some(true),
                idle_seconds: Some(120.0),
            },
        );
        let text = render(
            Some(&snapshot(list.clone())),
            &ProcessMetadata::default(),
            &verdicts,
            &AgentFigures::new(),
            &stats(),
            &options(1),
            Format::Prometheus,
        );
        assert!(text.contains("vramctl_process_leak{gpu=\"0\",uuid=\"GPU-a\",pid=\"10\"} 1\n"));
        assert!(text.contains("vramctl_process_leak_slope_bytes_per_second{gpu=\"0\",uuid=\"GPU-a\",pid=\"10\"} 1048576\n"));
        assert!(
            text.contains("vramctl_process_idle_holder{gpu=\"0\",uuid=\"GPU-a\",pid=\"10\"} 0\n")
        );
        assert!(
            !text.contains("vramctl_process_idle_seconds"),
            "pid 10 has no idle evidence, pid 11 is beyond the cap"
        );
        let both = render(
            Some(&snapshot(list.clone())),
            &ProcessMetadata::default(),
            &verdicts,
            &AgentFigures::new(),
            &stats(),
            &options(2),
            Format::Prometheus,
        );
        assert!(
            both.contains("vramctl_process_idle_holder{gpu=\"0\",uuid=\"GPU-a\",pid=\"11\"} 1\n")
        );
        assert!(
            both.contains(
                "vramctl_process_idle_seconds{gpu=\"0\",uuid=\"GPU-a\",pid=\"11\"} 120\n"
            )
        );
        assert!(
            !both.contains(
                "vramctl_process_leak_slope_bytes_per_second{gpu=\"0\",uuid=\"GPU-a\",pid=\"11\"}"
            ),
            "no slope, no sample"
        );
        let without = render(
            Some(&snapshot(list)),
            &ProcessMetadata::default(),
            &ProcessVerdicts::new(),
            &AgentFigures::new(),
            &stats(),
            &options(20),
            Format::Prometheus,
        );
        assert!(
            !without.contains("vramctl_process_leak"),
            "no verdicts, no family"
        );
    }

    #[test]
    fn agent_series_appear_only_for_processes_with_an_agent_and_never_as_zero() {
        use vramctl_agent::agent_poll::DeviceMemory;
        let list = vec![
            process(10, Some(100)),
            process(11, Some(50)),
            process(12, Some(70)),
        ];
        let mut agents = AgentFigures::new();
        agents.insert(
            ("GPU-a".into(), 10),
            DeviceMemory {
                allocated_bytes: Some(30),
                reserved_bytes: Some(90),
            },
        );
        // A framework that cannot say its reserved bytes (TensorFlow): no reserved sample.
        agents.insert(
            ("GPU-a".into(), 12),
            DeviceMemory {
                allocated_bytes: Some(0),
                reserved_bytes: None,
            },
        );
        let text = render(
            Some(&snapshot(list)),
            &ProcessMetadata::default(),
            &ProcessVerdicts::new(),
            &agents,
            &stats(),
            &options(20),
            Format::Prometheus,
        );
        assert!(
            text.contains(
                "vramctl_process_allocated_bytes{gpu=\"0\",uuid=\"GPU-a\",pid=\"10\"} 30\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "vramctl_process_reserved_bytes{gpu=\"0\",uuid=\"GPU-a\",pid=\"10\"} 90\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("vramctl_process_allocated_bytes{gpu=\"0\",uuid=\"GPU-a\",pid=\"12\"")
        );
        assert!(
            !text.contains("vramctl_process_reserved_bytes{gpu=\"0\",uuid=\"GPU-a\",pid=\"12\"")
        );
        assert!(!text.contains("_bytes{gpu=\"0\",uuid=\"GPU-a\",pid=\"11\"} 0\n"));
        assert_eq!(text.matches("vramctl_process_allocated_bytes{").count(), 2);
    }

    /// The exposition checked by Prometheus' own parser, when it is installed (Debian's
    /// `prometheus`; `VRAMCTL_SKIP_PROMETHEUS=1` skips it, as in the integration tests).
    fn promtool_check_metrics(text: &str) {
        use std::io::Write as _;
        use std::process::{Command, Stdio};
        if std::env::var_os("VRAMCTL_SKIP_PROMETHEUS").is_some_and(|v| v == "1") {
            eprintln!("promtool skipped: VRAMCTL_SKIP_PROMETHEUS=1");
            return;
        }
        let mut child = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool is installed (apt-get install prometheus)");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("feed promtool");
        let output = child.wait_with_output().expect("promtool");
        assert!(
            output.status.success() && output.stdout.is_empty() && output.stderr.is_empty(),
            "promtool check metrics:\n{}{}\n--- input ---\n{text}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    #[test]
    fn owners_are_one_info_series_per_process_and_one_peak_per_job() {
        use crate::owner_series::JobPeaks;
        use crate::owner_series::tests::{host, hostile, job, snapshot};
        use vramctl_observe::observation::Observation;

        const GIB: u64 = 1 << 30;
        let mut peaks = JobPeaks::new();
        let observed = |listed: &[(u32, u32, Option<u64>)]| {
            let mut observation = Observation::bare(snapshot(listed));
            observation.hosts = std::collections::BTreeMap::from([
                (
                    10,
                    host(10, "alice", Some(job(1234, Some("alice"), Some("gpu")))),
                ),
                (11, host(11, "alice", Some(job(1234, None, None)))),
                (12, host(12, "bob", None)),
                (13, hostile(13)),
            ]);
            ProcessMetadata::from_observation(&observation, crate::metadata::DetailsSource::Proc)
        };
        // The job held 6 GiB on GPU 0 at the first sample and 5 GiB at the second.
        let mut first = observed(&[(0, 10, Some(4 * GIB)), (0, 11, Some(2 * GIB))]);
        peaks.update(&mut first.jobs, 1_000);
        let listed = [
            (0, 10, Some(3 * GIB)),
            (0, 11, Some(2 * GIB)),
            (1, 11, Some(GIB)),
            (0, 12, Some(GIB)),
            // Below the cap of 2 series per GPU: no info series, but its job's memory counts.
            (0, 13, Some(GIB / 2)),
            (1, 14, Some(GIB)),
        ];
        let mut metadata = observed(&listed);
        peaks.update(&mut metadata.jobs, 2_000);
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let text = render(
                Some(&snapshot(&listed)),
                &metadata,
                &ProcessVerdicts::new(),
                &AgentFigures::new(),
                &stats(),
                &options(2),
                format,
            ) + &render_tail(Duration::ZERO, format);
            if format == Format::Prometheus {
                promtool_check_metrics(&text);
            }
            let owners: String = text
                .lines()
                .filter(|l| {
                    let name = l
                        .strip_prefix("# HELP ")
                        .or_else(|| l.strip_prefix("# TYPE "))
                        .unwrap_or(l);
                    ["vramctl_process_info", "vramctl_process ", "vramctl_job"]
                        .iter()
                        .any(|p| name.starts_with(p))
                })
                .map(|l| format!("{l}\n"))
                .collect();
            let name = match format {
                Format::Prometheus => "owner_series_prometheus",
                Format::OpenMetrics => "owner_series_openmetrics",
            };
            insta::assert_snapshot!(name, owners);
        }
        // The hostile pod and partition are one line each: nothing forged.
        let mut hostile_metadata = observed(&[(0, 13, Some(GIB))]);
        peaks.update(&mut hostile_metadata.jobs, 3_000);
        let text = render(
            Some(&snapshot(&[(0, 13, Some(GIB))])),
            &hostile_metadata,
            &ProcessVerdicts::new(),
            &AgentFigures::new(),
            &stats(),
            &options(2),
            Format::Prometheus,
        );
        promtool_check_metrics(&text);
        let info: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.starts_with("vramctl_process_info{") || l.starts_with("vramctl_job_info{")
            })
            .collect();
        assert_eq!(info.len(), 2, "{text}");
        assert!(
            info.iter()
                .all(|l| l.ends_with("} 1") && !l.contains('\u{1b}')),
            "{info:?}"
        );
        insta::assert_snapshot!("owner_series_hostile", info.join("\n"));
    }

    #[test]
    fn without_proc_details_there_are_no_owner_series() {
        use crate::owner_series::tests::{host, job, snapshot};
        use vramctl_observe::observation::Observation;
        let listed = [(0, 10, Some(1))];
        let mut observation = Observation::bare(snapshot(&listed));
        observation.hosts =
            std::collections::BTreeMap::from([(10, host(10, "alice", Some(job(1, None, None))))]);
        for details in [
            crate::metadata::DetailsSource::Nvml,
            crate::metadata::DetailsSource::None,
        ] {
            let text = render(
                Some(&snapshot(&listed)),
                &ProcessMetadata::from_observation(&observation, details),
                &ProcessVerdicts::new(),
                &AgentFigures::new(),
                &stats(),
                &options(2),
                Format::Prometheus,
            );
            assert!(text.contains("vramctl_process_memory_used_bytes{"));
            assert!(
                !text.contains("vramctl_process_info"),
                "{details:?}: {text}"
            );
            assert!(!text.contains("vramctl_job"), "{details:?}: {text}");
        }
    }
}
