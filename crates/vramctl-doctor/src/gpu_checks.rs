//! The checks of one GPU: memory nobody accounts for, memory health, link and clocks,
//! configuration. Pure functions of a [`GpuFacts`] (and the device-file holders).

use vramctl_core::types::{ComputeCapability, DeviceDiagnostics, DeviceHealth, Unavailable};

use super::{Finding, GpuFacts, Holder, HolderFacts, Status};
use vramctl_observe::units::bytes;

/// Used memory that no listed process holds, at or above which `unaccounted_memory` is not
/// ok. Chosen on the H200 status trace (`testdata/h200/labeled-trace.ndjson.gz`, 3172
/// readings beside 7–8 PyTorch processes: typically 44 MiB, at most 556 MiB while a process
/// was starting); checked on the recorded history of another run
/// (`testdata/h200/recorded-history.ndjson.gz`, 2545 ticks: at most 556 MiB, none at or
/// above 1 GiB). `docs/doctor.md`.
pub const UNACCOUNTED_BYTES: u64 = 1 << 30;

/// GPU utilization at or above which the PCIe link is judged: below it the link may have
/// slowed down to save power (`docs/doctor.md`, "pcie_link", says what this rests on).
pub const BUSY_UTILIZATION_PERCENT: u32 = 30;

/// Below the slowdown temperature by this much is a warning when NVML gives no maximum
/// operating temperature of its own.
pub const TEMPERATURE_MARGIN_C: u32 = 5;

/// Processes that keep `/dev/nvidia*` open without a CUDA context of their own, so are not
/// candidates for memory nobody accounts for.
const NO_CONTEXT_HOLDERS: &[&str] = &["nvidia-persistenced", "nvidia-smi", "nv-hostengine"];

/// `nvmlClocksEventReason*` bits (nvml.h).
mod reason {
    pub const GPU_IDLE: u64 = 0x1;
    pub const APPLICATIONS_CLOCKS_SETTING: u64 = 0x2;
    pub const SW_POWER_CAP: u64 = 0x4;
    pub const HW_SLOWDOWN: u64 = 0x8;
    pub const SYNC_BOOST: u64 = 0x10;
    pub const SW_THERMAL_SLOWDOWN: u64 = 0x20;
    pub const HW_THERMAL_SLOWDOWN: u64 = 0x40;
    pub const HW_POWER_BRAKE_SLOWDOWN: u64 = 0x80;
    pub const DISPLAY_CLOCK_SETTING: u64 = 0x100;
}

/// Every check of one GPU, in order.
pub fn all(gpu: &GpuFacts, holders: &HolderFacts) -> Vec<Finding> {
    let subject = format!("GPU {}", gpu.id.index);
    let index = gpu.id.index;
    let diag = match &gpu.diagnostics {
        Ok(d) => d,
        Err(why) => {
            return vec![
                Finding::new(
                    "gpu",
                    subject,
                    Status::Fail,
                    format!("cannot be read: {why}"),
                )
                .gpu(index)
                .fix("look at the kernel log (dmesg | grep NVRM); reset the GPU or reboot"),
            ];
        }
    };
    let health = gpu.health.as_ref().ok().and_then(Option::as_ref);
    let utilization = gpu.reading.as_ref().and_then(|r| r.utilization_gpu_percent);
    let mut out = vec![
        unaccounted_memory(gpu, holders, &subject),
        ecc(diag, &subject, index),
        retired_pages(health, &gpu.health, generation(diag), &subject, index),
        remapped_rows(health, &gpu.health, generation(diag), &subject, index),
        recovery_action(health, &gpu.health, &subject, index),
        pcie_link(diag, utilization, &subject),
        clock_events(diag, health, &gpu.health, utilization, &subject, index),
        temperature(diag, &subject),
        persistence(diag, &subject, index),
        compute_mode(diag, &subject, index),
        mig(diag, &subject, index),
    ];
    for f in &mut out {
        f.gpu = Some(index);
    }
    out
}

fn why(missing: &std::collections::BTreeMap<String, Unavailable>, key: &str) -> String {
    missing
        .get(key)
        .map_or_else(|| "not reported".to_owned(), ToString::to_string)
}

/// `unaccounted_memory`: used memory minus what NVML's listed processes hold, and the
/// processes that hold this GPU's device file without being listed.
fn unaccounted_memory(gpu: &GpuFacts, holders: &HolderFacts, subject: &str) -> Finding {
    let id = "unaccounted_memory";
    let Some(reading) = &gpu.reading else {
        return Finding::new(
            id,
            subject,
            Status::Skipped,
            "no reading of this GPU".into(),
        );
    };
    let Some(unaccounted) = reading.unaccounted_bytes() else {
        return Finding::new(
            id,
            subject,
            Status::Skipped,
            "used memory or a listed process's memory is not reported".into(),
        );
    };
    let listed: Vec<u32> = reading.processes.iter().flatten().map(|p| p.pid).collect();
    let device_file = gpu.id.minor_number.map(|m| format!("/dev/nvidia{m}"));
    let unlisted: Vec<&Holder> = holders
        .holders
        .iter()
        .filter(|h| !listed.contains(&h.pid))
        .filter(|h| !NO_CONTEXT_HOLDERS.contains(&h.command.as_str()))
        .filter(|h| device_file.as_ref().is_some_and(|f| h.files.contains(f)))
        .collect();
    let used = reading.memory.map(|m| m.used_bytes);
    let base = |status, summary| {
        Finding::new(id, subject, status, summary)
            .fact("used_bytes", used)
            .fact("unaccounted_bytes", unaccounted)
            .fact("listed_pids", &listed)
            .fact("unlisted_holders", &unlisted)
            .fact("threshold_bytes", UNACCOUNTED_BYTES)
    };
    let n = listed.len();
    if unaccounted < UNACCOUNTED_BYTES {
        return base(
            Status::Ok,
            format!(
                "{} of {} used is held by no listed process ({n} listed; below {} is driver and context overhead)",
                bytes(unaccounted),
                bytes(used.unwrap_or(0)),
                bytes(UNACCOUNTED_BYTES)
            ),
        );
    }
    if !unlisted.is_empty() {
        let names: Vec<String> = unlisted
            .iter()
            .map(|h| {
                let state = match h.state {
                    Some('D') => " (state D: stuck in the kernel)",
                    Some('Z') => " (zombie)",
                    Some('T') => " (stopped)",
                    _ => "",
                };
                format!("{} {}{state}", h.pid, h.command)
            })
            .collect();
        let holding = format!(
            "{} {} {} open without being listed: {}",
            unlisted.len(),
            if unlisted.len() == 1 {
                "process has"
            } else {
                "processes have"
            },
            device_file.as_deref().unwrap_or("the device"),
            names.join(", ")
        );
        // From another PID namespace NVML's list is not the GPU's whole: host PIDs that
        // match none of ours, or (driver 580) only this namespace's processes. Either way a
        // holder is not evidence of a dead context, only of who uses the GPU here.
        if !holders.initial_pid_namespace {
            return base(
                Status::Warn,
                format!(
                    "{} used is held by no listed process; from this PID namespace NVML does not list the whole GPU (host PIDs this namespace does not show, or — driver 580 — none of other namespaces' processes), and {holding}",
                    bytes(unaccounted)
                ),
            )
            .fix("run vramctl doctor on the host to tell which process holds it");
        }
        let stuck = unlisted.iter().any(|h| h.state == Some('D'));
        return base(
            Status::Fail,
            format!(
                "{} used is held by no listed process, and {holding}",
                bytes(unaccounted)
            ),
        )
        .fix(if stuck {
            "end them (vramctl kill PID; a forked DataLoader worker keeps its parent's context); a process in state D that never exits needs a GPU reset or a reboot"
        } else {
            "end them (vramctl kill PID): a forked child (a DataLoader worker) keeps its parent's CUDA context and memory"
        });
    }
    let fix = if !holders.initial_pid_namespace {
        "run vramctl doctor on the host: the memory may be held by processes of another PID namespace, which NVML does not name here"
    } else if holders.unreadable > 0 {
        "run as root to see other users' processes holding the GPU"
    } else {
        "a context may still be tearing down, or the memory is held from another VM or container; if it stays, reset the GPU (nvidia-smi -r)"
    };
    base(
        Status::Warn,
        format!(
            "{} used is held by no listed process ({n} listed), and no process we can see has {} open",
            bytes(unaccounted),
            device_file.as_deref().unwrap_or("the device")
        ),
    )
    .fix(fix)
}

/// `ecc`: mode, pending mode change, error counts.
fn ecc(d: &DeviceDiagnostics, subject: &str, index: u32) -> Finding {
    let id = "ecc";
    let Some(enabled) = d.ecc_enabled else {
        return Finding::new(
            id,
            subject,
            Status::Skipped,
            format!("ECC mode: {}", why(&d.missing, "ecc_mode")),
        );
    };
    let facts = |f: Finding| {
        f.fact("ecc_enabled", enabled)
            .fact("ecc_pending", d.ecc_pending)
            .fact("corrected_volatile", d.ecc_corrected_volatile)
            .fact("uncorrected_volatile", d.ecc_uncorrected_volatile)
            .fact("corrected_aggregate", d.ecc_corrected_aggregate)
            .fact("uncorrected_aggregate", d.ecc_uncorrected_aggregate)
    };
    let counts = format!(
        "uncorrected {} since the driver loaded, {} over the board's life; corrected {} / {}",
        opt(d.ecc_uncorrected_volatile),
        opt(d.ecc_uncorrected_aggregate),
        opt(d.ecc_corrected_volatile),
        opt(d.ecc_corrected_aggregate)
    );
    if let Some(n) = d.ecc_uncorrected_volatile.filter(|&n| n > 0) {
        return facts(Finding::new(
            id,
            subject,
            Status::Fail,
            format!("{n} uncorrected ECC errors since the driver loaded ({counts})"),
        ))
        .fix(format!(
            "restart the work on this GPU and reset it (nvidia-smi -r -i {index}); if they recur, contact the vendor"
        ));
    }
    if d.ecc_pending.is_some_and(|p| p != enabled) {
        let to = if enabled { "off" } else { "on" };
        return facts(Finding::new(
            id,
            subject,
            Status::Warn,
            format!("ECC turns {to} at the next GPU reset ({counts})"),
        ))
        .fix(format!(
            "reset the GPU (nvidia-smi -r -i {index}) or reboot to apply it"
        ));
    }
    if let Some(n) = d.ecc_uncorrected_aggregate.filter(|&n| n > 0) {
        return facts(Finding::new(
            id,
            subject,
            Status::Warn,
            format!("{n} uncorrected ECC errors over the board's life, none since the driver loaded"),
        ))
        .fix("watch the counters (vramctl doctor, nvidia-smi -q -d ECC); contact the vendor if they rise");
    }
    facts(Finding::new(
        id,
        subject,
        Status::Ok,
        format!("ECC {}; {counts}", if enabled { "on" } else { "off" }),
    ))
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "?".to_owned(), |v| v.to_string())
}

fn health_skipped(
    id: &'static str,
    subject: &str,
    health: &Result<Option<DeviceHealth>, String>,
) -> Finding {
    let why = match health {
        Err(e) => format!("cannot be read: {e}"),
        Ok(_) => "this driver source reports no health facts".to_owned(),
    };
    Finding::new(id, subject, Status::Skipped, why)
}

/// Which way a GPU's memory replaces bad cells: Ampere (compute capability 8.0) and later
/// remap rows, earlier GPUs retire pages; with the compute capability that says so. `None`:
/// the driver does not say which GPU it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Generation {
    RetiresPages(ComputeCapability),
    RemapsRows(ComputeCapability),
}

fn generation(diag: &DeviceDiagnostics) -> Option<Generation> {
    diag.compute_capability.map(|cc| {
        if cc.major >= 8 {
            Generation::RemapsRows(cc)
        } else {
            Generation::RetiresPages(cc)
        }
    })
}

/// `retired_pages`: dynamic page retirement (GPUs up to Volta).
fn retired_pages(
    h: Option<&DeviceHealth>,
    raw: &Result<Option<DeviceHealth>, String>,
    generation: Option<Generation>,
    subject: &str,
    index: u32,
) -> Finding {
    let id = "retired_pages";
    let Some(h) = h else {
        return health_skipped(id, subject, raw);
    };
    let (Some(sbe), Some(dbe)) = (h.retired_pages_single_bit, h.retired_pages_double_bit) else {
        return Finding::new(
            id,
            subject,
            Status::Skipped,
            // Said of this GPU, so that the two checks never contradict each other (issue 29:
            // each skip blamed the other generation when both were unreadable on one GPU).
            match generation {
                Some(Generation::RemapsRows(cc)) => format!(
                    "page retirement: {} (compute capability {cc}: this GPU remaps rows \
                     instead, see remapped_rows)",
                    why(&h.missing, "retired_pages_double_bit"),
                ),
                Some(Generation::RetiresPages(_)) => format!(
                    "page retirement: {}",
                    why(&h.missing, "retired_pages_double_bit")
                ),
                None => format!(
                    "page retirement: {} (GPUs before Ampere retire pages, later ones remap rows)",
                    why(&h.missing, "retired_pages_double_bit")
                ),
            },
        );
    };
    let f = |status, summary| {
        Finding::new(id, subject, status, summary)
            .fact("single_bit", sbe)
            .fact("double_bit", dbe)
            .fact("pending", h.retired_pages_pending)
    };
    if h.retired_pages_pending == Some(true) {
        return f(
            Status::Warn,
            format!("a page retirement waits for the next driver reload ({sbe} single-bit, {dbe} double-bit retired)"),
        )
        .fix(format!("reset the GPU (nvidia-smi -r -i {index}) or reboot when it is idle"));
    }
    f(
        Status::Ok,
        format!("{sbe} pages retired for single-bit, {dbe} for double-bit errors; none pending"),
    )
}

/// `remapped_rows`: row remapping (Ampere and later).
fn remapped_rows(
    h: Option<&DeviceHealth>,
    raw: &Result<Option<DeviceHealth>, String>,
    generation: Option<Generation>,
    subject: &str,
    index: u32,
) -> Finding {
    let id = "remapped_rows";
    let Some(h) = h else {
        return health_skipped(id, subject, raw);
    };
    let (Some(corr), Some(unc)) = (h.remapped_rows_correctable, h.remapped_rows_uncorrectable)
    else {
        return Finding::new(
            id,
            subject,
            Status::Skipped,
            match generation {
                Some(Generation::RetiresPages(cc)) => format!(
                    "row remapping: {} (compute capability {cc}: this GPU retires pages \
                     instead, see retired_pages)",
                    why(&h.missing, "remapped_rows"),
                ),
                Some(Generation::RemapsRows(_)) => {
                    format!("row remapping: {}", why(&h.missing, "remapped_rows"))
                }
                None => format!(
                    "row remapping: {} (GPUs before Ampere retire pages, later ones remap rows)",
                    why(&h.missing, "remapped_rows")
                ),
            },
        );
    };
    let f = |status, summary| {
        Finding::new(id, subject, status, summary)
            .fact("correctable", corr)
            .fact("uncorrectable", unc)
            .fact("pending", h.remapped_rows_pending)
            .fact("failure", h.remapped_rows_failure)
    };
    if h.remapped_rows_failure == Some(true) {
        return f(
            Status::Fail,
            format!("a row remap failed: a memory bank has no spare row left ({corr} correctable, {unc} uncorrectable remapped)"),
        )
        .fix("the board needs service: contact the vendor (RMA)");
    }
    if h.remapped_rows_pending == Some(true) {
        return f(
            Status::Warn,
            format!("a row remap waits for a GPU reset ({corr} correctable, {unc} uncorrectable remapped)"),
        )
        .fix(format!("a GPU reset is needed: nvidia-smi -r -i {index} when idle, or reboot"));
    }
    f(
        Status::Ok,
        format!(
            "{corr} rows remapped for correctable, {unc} for uncorrectable errors; none pending"
        ),
    )
}

/// `recovery_action`: what the driver says the GPU needs (NVML field 230).
fn recovery_action(
    h: Option<&DeviceHealth>,
    raw: &Result<Option<DeviceHealth>, String>,
    subject: &str,
    index: u32,
) -> Finding {
    let id = "recovery_action";
    let Some(h) = h else {
        return health_skipped(id, subject, raw);
    };
    let Some(action) = h.recovery_action else {
        return Finding::new(
            id,
            subject,
            Status::Skipped,
            format!(
                "the driver's recovery action: {}",
                why(&h.missing, "recovery_action")
            ),
        );
    };
    let f = |status, summary: &str| {
        Finding::new(id, subject, status, format!("the driver says: {summary}"))
            .fact("recovery_action", action)
    };
    match action {
        0 => f(Status::Ok, "no recovery needed"),
        1 => f(Status::Warn, "a GPU reset is needed").fix(format!(
            "reset the GPU when idle (nvidia-smi -r -i {index}), or reboot"
        )),
        2 => f(Status::Fail, "a node reboot is needed").fix("reboot the machine"),
        3 => f(Status::Warn, "drain peer-to-peer traffic").fix(
            "stop the jobs using peer-to-peer (NVLink) transfers on this GPU until the driver clears it",
        ),
        4 => f(Status::Fail, "drain the GPU and reset it").fix(format!(
            "move the work off this GPU, then reset it (nvidia-smi -r -i {index})"
        )),
        other => f(Status::Warn, &format!("recovery action {other}")).fix(
            "see NVIDIA's documentation of NVML_FI_DEV_GET_GPU_RECOVERY_ACTION for this value",
        ),
    }
}

/// `pcie_link`: generation and width now against the maximum, judged only under load.
fn pcie_link(d: &DeviceDiagnostics, utilization: Option<u32>, subject: &str) -> Finding {
    let id = "pcie_link";
    let (Some(gen_now), Some(gen_max), Some(w_now), Some(w_max)) = (
        d.pcie_gen_current,
        d.pcie_gen_max,
        d.pcie_width_current,
        d.pcie_width_max,
    ) else {
        return Finding::new(
            id,
            subject,
            Status::Skipped,
            format!("PCIe link: {}", why(&d.missing, "pcie_gen_current")),
        );
    };
    let f = |status, summary| {
        Finding::new(id, subject, status, summary)
            .fact("gen_current", gen_now)
            .fact("gen_max", gen_max)
            .fact("width_current", w_now)
            .fact("width_max", w_max)
            .fact("utilization_gpu_percent", utilization)
            .fact("busy_threshold_percent", BUSY_UTILIZATION_PERCENT)
    };
    let link = format!("Gen{gen_now} x{w_now} (max Gen{gen_max} x{w_max})");
    if gen_now >= gen_max && w_now >= w_max {
        return f(Status::Ok, format!("{link}: at its maximum"));
    }
    match utilization {
        Some(u) if u >= BUSY_UTILIZATION_PERCENT => f(
            Status::Warn,
            format!(
                "{link} while the GPU is {u}% busy: the link runs below its maximum under load"
            ),
        )
        .fix("reseat the card and check the slot (wired x8, a riser) and the BIOS PCIe settings"),
        Some(u) => f(
            Status::Skipped,
            format!(
                "{link} at {u}% utilization: idle links slow down to save power, not judged (run doctor under load)"
            ),
        ),
        None => f(
            Status::Skipped,
            format!("{link}: utilization not reported, so load is unknown; not judged"),
        ),
    }
}

/// The names of the set bits, in nvml.h order.
fn reason_names(bits: u64) -> Vec<&'static str> {
    use reason::*;
    [
        (GPU_IDLE, "idle"),
        (APPLICATIONS_CLOCKS_SETTING, "applications clocks setting"),
        (SW_POWER_CAP, "power cap"),
        (HW_SLOWDOWN, "HW slowdown"),
        (SYNC_BOOST, "sync boost"),
        (SW_THERMAL_SLOWDOWN, "SW thermal slowdown"),
        (HW_THERMAL_SLOWDOWN, "HW thermal slowdown"),
        (HW_POWER_BRAKE_SLOWDOWN, "HW power brake"),
        (DISPLAY_CLOCK_SETTING, "display clock setting"),
    ]
    .into_iter()
    .filter(|(bit, _)| bits & bit != 0)
    .map(|(_, name)| name)
    .collect()
}

/// `clock_events`: why the clocks are held down now.
fn clock_events(
    d: &DeviceDiagnostics,
    h: Option<&DeviceHealth>,
    raw: &Result<Option<DeviceHealth>, String>,
    utilization: Option<u32>,
    subject: &str,
    index: u32,
) -> Finding {
    use reason::*;
    let id = "clock_events";
    let Some(h) = h else {
        return health_skipped(id, subject, raw);
    };
    let Some(bits) = h.clock_event_reasons else {
        return Finding::new(
            id,
            subject,
            Status::Skipped,
            format!(
                "clock event reasons: {}",
                why(&h.missing, "clock_event_reasons")
            ),
        );
    };
    let names = reason_names(bits);
    let listed = if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    };
    let f = |status, summary| {
        Finding::new(id, subject, status, summary)
            .fact("reasons", format!("{bits:#x}"))
            .fact("reason_names", &names)
            .fact(
                "supported",
                h.clock_event_reasons_supported.map(|s| format!("{s:#x}")),
            )
            .fact("utilization_gpu_percent", utilization)
            .fact("power_limit_mw", d.enforced_power_limit_mw)
            .fact("default_power_limit_mw", d.default_power_limit_mw)
    };
    if bits & (HW_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN) != 0 {
        return f(
            Status::Fail,
            format!("clocks held down by hardware now: {listed}"),
        )
        .fix("check cooling (fans, airflow, inlet temperature) and power delivery (PSU, power cables, the power brake signal)");
    }
    if bits & SW_THERMAL_SLOWDOWN != 0 {
        return f(
            Status::Warn,
            format!("clocks lowered for temperature now: {listed}"),
        )
        .fix("improve cooling: airflow, fan curve, inlet temperature");
    }
    if bits & SW_POWER_CAP != 0 {
        if let (Some(limit), Some(default)) = (d.enforced_power_limit_mw, d.default_power_limit_mw)
        {
            if limit < default {
                return f(
                    Status::Warn,
                    format!(
                        "clocks held at a power limit of {} W, lowered from the default {} W",
                        limit / 1000,
                        default / 1000
                    ),
                )
                .fix(format!(
                    "raise it back if that was not meant: sudo nvidia-smi -i {index} -pl {}",
                    default / 1000
                ));
            }
        }
        return f(
            Status::Ok,
            format!("at its power limit ({listed}): normal under full load"),
        );
    }
    f(Status::Ok, format!("clock event reasons now: {listed}"))
}

/// `temperature`: against the slowdown threshold.
fn temperature(d: &DeviceDiagnostics, subject: &str) -> Finding {
    let id = "temperature";
    let (Some(t), Some(slowdown)) = (d.temperature_c, d.temperature_slowdown_c) else {
        return Finding::new(
            id,
            subject,
            Status::Skipped,
            format!(
                "temperature or its slowdown threshold: {}",
                if d.temperature_c.is_none() {
                    why(&d.missing, "temperature")
                } else {
                    why(&d.missing, "temperature_slowdown")
                }
            ),
        );
    };
    let warn_at = d
        .temperature_gpu_max_c
        .filter(|&m| m < slowdown)
        .unwrap_or_else(|| slowdown.saturating_sub(TEMPERATURE_MARGIN_C));
    let f = |status, summary| {
        Finding::new(id, subject, status, summary)
            .fact("temperature_c", t)
            .fact("slowdown_c", slowdown)
            .fact("shutdown_c", d.temperature_shutdown_c)
            .fact("max_operating_c", d.temperature_gpu_max_c)
            .fact("warn_at_c", warn_at)
    };
    if t >= slowdown {
        return f(
            Status::Fail,
            format!("{t} °C: at or above the slowdown threshold {slowdown} °C"),
        )
        .fix("cool it: airflow, fans, inlet temperature; lower the load until then");
    }
    if t >= warn_at {
        return f(
            Status::Warn,
            format!(
                "{t} °C: {} °C below the slowdown threshold {slowdown} °C",
                slowdown - t
            ),
        )
        .fix("check airflow and fans before it slows down");
    }
    f(
        Status::Ok,
        format!(
            "{t} °C ({} °C below the slowdown threshold {slowdown} °C)",
            slowdown - t
        ),
    )
}

/// `persistence`: persistence mode.
fn persistence(d: &DeviceDiagnostics, subject: &str, index: u32) -> Finding {
    let id = "persistence";
    match d.persistence_mode {
        None => Finding::new(
            id,
            subject,
            Status::Skipped,
            format!("persistence mode: {}", why(&d.missing, "persistence_mode")),
        ),
        Some(true) => Finding::new(id, subject, Status::Ok, "persistence mode on".into())
            .fact("persistence_mode", true),
        Some(false) => Finding::new(
            id,
            subject,
            Status::Warn,
            "persistence mode off: the driver tears the GPU down when its last client exits, so each start pays initialisation and settings may reset".into(),
        )
        .fact("persistence_mode", false)
        .fix(format!("run nvidia-persistenced, or sudo nvidia-smi -i {index} -pm 1")),
    }
}

/// `compute_mode`.
fn compute_mode(d: &DeviceDiagnostics, subject: &str, index: u32) -> Finding {
    let id = "compute_mode";
    let Some(mode) = d.compute_mode.as_deref() else {
        return Finding::new(
            id,
            subject,
            Status::Skipped,
            format!("compute mode: {}", why(&d.missing, "compute_mode")),
        );
    };
    let f = |status, summary: String| {
        Finding::new(id, subject, status, summary).fact("compute_mode", mode)
    };
    let reset = format!("sudo nvidia-smi -i {index} -c DEFAULT");
    match mode {
        "Default" => f(Status::Ok, "Default: any number of processes may use it".into()),
        "Exclusive_Process" => f(
            Status::Warn,
            "Exclusive_Process: one process at a time; on a shared machine the next one fails with 'CUDA-capable device(s) is/are busy or unavailable'".into(),
        )
        .fix(format!("if the GPU is shared: {reset}")),
        "Prohibited" => f(
            Status::Fail,
            "Prohibited: no process may create a CUDA context on it".into(),
        )
        .fix(reset),
        other => f(
            Status::Warn,
            format!("{other}: a restricted mode (Exclusive_Thread is deprecated)"),
        )
        .fix(reset),
    }
}

/// `mig`: MIG mode and a pending change.
fn mig(d: &DeviceDiagnostics, subject: &str, index: u32) -> Finding {
    let id = "mig";
    let Some(current) = d.mig_current else {
        return Finding::new(
            id,
            subject,
            Status::Skipped,
            format!("MIG: {}", why(&d.missing, "mig_mode")),
        );
    };
    let pending = d.mig_pending.unwrap_or(current);
    let f = |status, summary: String| {
        Finding::new(id, subject, status, summary)
            .fact("mig_current", current)
            .fact("mig_pending", pending)
    };
    let on = |b: bool| if b { "on" } else { "off" };
    if pending != current {
        return f(
            Status::Warn,
            format!(
                "MIG is {} and turns {} at the next GPU reset",
                on(current),
                on(pending)
            ),
        )
        .fix(format!(
            "reset the GPU when idle (nvidia-smi -r -i {index}) to apply it"
        ));
    }
    f(
        Status::Ok,
        if current {
            "MIG on: CUDA programs see MIG instances, not the whole GPU".into()
        } else {
            "MIG off".into()
        },
    )
}

#[cfg(test)]
mod tests {
    use vramctl_core::types::{DeviceReading, MemoryReading, ProcessKind, ProcessUsage};

    use super::super::GpuIdentity;
    use super::*;

    /// GPU 0 (`/dev/nvidia0`) with `used` bytes used and one listed process holding `held`.
    fn gpu(used: u64, held: u64) -> GpuFacts {
        GpuFacts {
            id: GpuIdentity {
                index: 0,
                uuid: "GPU-0".into(),
                name: None,
                minor_number: Some(0),
                pci_bus_id: None,
            },
            diagnostics: Ok(DeviceDiagnostics::default()),
            health: Ok(None),
            reading: Some(DeviceReading {
                memory: Some(MemoryReading {
                    total_bytes: 80 << 30,
                    used_bytes: used,
                    reserved_bytes: 0,
                    free_bytes: (80 << 30) - used,
                }),
                processes: Some(vec![ProcessUsage {
                    pid: 100,
                    used_bytes: Some(held),
                    kind: ProcessKind::Compute,
                    gpu_instance_id: None,
                    compute_instance_id: None,
                }]),
                ..DeviceReading::default()
            }),
        }
    }

    fn holder(pid: u32, command: &str, state: char, file: &str) -> Holder {
        Holder {
            pid,
            command: command.into(),
            uid: Some(0),
            state: Some(state),
            files: vec![file.into(), "/dev/nvidiactl".into()],
        }
    }

    #[test]
    fn memory_held_by_an_unlisted_holder_of_the_device_fails_and_names_it() {
        let holders = HolderFacts {
            holders: vec![
                holder(100, "python3", 'S', "/dev/nvidia0"),
                holder(200, "pt_data_worker", 'D', "/dev/nvidia0"),
                // Another GPU's file, and a daemon without a context: not candidates.
                holder(300, "python3", 'S', "/dev/nvidia1"),
                holder(400, "nvidia-persistenced", 'S', "/dev/nvidia0"),
            ],
            unreadable: 0,
            initial_pid_namespace: true,
        };
        let f = unaccounted_memory(&gpu(10 << 30, 4 << 30), &holders, "GPU 0");
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.summary
                .contains("200 pt_data_worker (state D: stuck in the kernel)"),
            "{}",
            f.summary
        );
        assert!(
            !f.summary.contains("300") && !f.summary.contains("400"),
            "{}",
            f.summary
        );
        assert!(f.fix.as_deref().is_some_and(|x| x.contains("GPU reset")));
        // From a container's PID namespace NVML's list is not the GPU's whole: the holders
        // are who uses the GPU here, not evidence of a dead context.
        let in_container = HolderFacts {
            initial_pid_namespace: false,
            ..holders
        };
        let f = unaccounted_memory(&gpu(10 << 30, 4 << 30), &in_container, "GPU 0");
        assert_eq!(f.status, Status::Warn);
        assert!(
            f.summary.contains("does not list the whole GPU"),
            "{}",
            f.summary
        );
    }

    #[test]
    fn memory_nobody_holds_warns_with_where_to_look_and_overhead_is_ok() {
        let nobody = HolderFacts {
            initial_pid_namespace: false,
            ..HolderFacts::default()
        };
        let f = unaccounted_memory(&gpu(10 << 30, 4 << 30), &nobody, "GPU 0");
        assert_eq!(f.status, Status::Warn);
        assert!(
            f.fix
                .as_deref()
                .is_some_and(|x| x.contains("PID namespace"))
        );
        // Just under the threshold: driver and context overhead.
        let f = unaccounted_memory(
            &gpu((4 << 30) + UNACCOUNTED_BYTES - 1, 4 << 30),
            &nobody,
            "GPU 0",
        );
        assert_eq!(f.status, Status::Ok);
    }

    #[test]
    fn reason_bits_are_named_in_header_order() {
        assert_eq!(reason_names(0x1), ["idle"]);
        assert_eq!(reason_names(0x44), ["power cap", "HW thermal slowdown"]);
        assert!(reason_names(0).is_empty());
    }

    #[test]
    fn idle_downshift_is_not_judged_and_busy_downshift_warns() {
        let d = DeviceDiagnostics {
            pcie_gen_current: Some(1),
            pcie_gen_max: Some(5),
            pcie_width_current: Some(16),
            pcie_width_max: Some(16),
            ..DeviceDiagnostics::default()
        };
        assert_eq!(pcie_link(&d, Some(0), "GPU 0").status, Status::Skipped);
        assert_eq!(pcie_link(&d, None, "GPU 0").status, Status::Skipped);
        assert_eq!(pcie_link(&d, Some(95), "GPU 0").status, Status::Warn);
        // At the threshold it is judged.
        assert_eq!(
            pcie_link(&d, Some(BUSY_UTILIZATION_PERCENT), "GPU 0").status,
            Status::Warn
        );
    }

    #[test]
    fn temperature_warns_from_the_max_operating_threshold() {
        let d = |t| DeviceDiagnostics {
            temperature_c: Some(t),
            temperature_slowdown_c: Some(89),
            temperature_gpu_max_c: Some(87),
            ..DeviceDiagnostics::default()
        };
        assert_eq!(temperature(&d(86), "GPU 0").status, Status::Ok);
        assert_eq!(temperature(&d(87), "GPU 0").status, Status::Warn);
        assert_eq!(temperature(&d(89), "GPU 0").status, Status::Fail);
    }
}
