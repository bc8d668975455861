//! `vramctl status`: devices and the processes holding their memory, now.
//!
//! One snapshot from the sampler, joined with /proc (user, command line), printed as a
//! per-device block or as JSON (`docs/json.md`, schema 1). `--watch` keeps one NVML
//! session and refreshes in place (NDJSON with `--json`).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;
use vramctl_core::procinfo::ProcReader;
use vramctl_core::types::{
    DeviceSnapshot, DeviceState, DriverInfo, MemoryReading, ProcessKind, ProcessUsage, Snapshot,
};
use vramctl_core::{Backend, NvmlBackend, Sampler};
use vramctl_store::format::rfc3339;

use super::{GpuFilter, open_sampler};
use crate::cli::{GlobalArgs, StatusArgs};
use crate::exit::Exit;
use crate::output::style::{Styles, paint};
use crate::output::table::{Align, Table};
use crate::output::units;

/// Version of the JSON below; bumped on any incompatible change.
pub const SCHEMA: u32 = 1;

/// The whole `status --json` document.
#[derive(Debug, Serialize)]
pub struct StatusReport {
    schema: u32,
    /// RFC 3339 UTC.
    taken_at: String,
    driver: DriverInfo,
    devices: Vec<DeviceStatus>,
    unopened: Vec<UnopenedStatus>,
}

#[derive(Debug, Serialize)]
struct UnopenedStatus {
    index: u32,
    reason: String,
}

#[derive(Debug, Serialize)]
struct DeviceStatus {
    index: u32,
    uuid: String,
    name: Option<String>,
    pci_bus_id: Option<String>,
    /// `ok`, `lost` or `error`.
    state: &'static str,
    error: Option<String>,
    memory: Option<MemoryReading>,
    utilization_gpu_percent: Option<u32>,
    utilization_memory_percent: Option<u32>,
    temperature_c: Option<u32>,
    power_mw: Option<u32>,
    unaccounted_bytes: Option<u64>,
    processes: Option<Vec<ProcessStatus>>,
    mig_instances: Vec<MigStatus>,
    missing: BTreeMap<&'static str, String>,
    dropped: Vec<DroppedStatus>,
}

#[derive(Debug, Serialize)]
struct ProcessStatus {
    pid: u32,
    /// Whether /proc in this PID namespace shows the process.
    visible: bool,
    user: Option<String>,
    command: Option<String>,
    used_bytes: Option<u64>,
    kind: ProcessKind,
    gpu_instance_id: Option<u32>,
    compute_instance_id: Option<u32>,
}

#[derive(Debug, Serialize)]
struct MigStatus {
    uuid: String,
    name: Option<String>,
    gpu_instance_id: Option<u32>,
    compute_instance_id: Option<u32>,
    memory: Option<MemoryReading>,
}

#[derive(Debug, Serialize)]
struct DroppedStatus {
    what: String,
    reason: String,
}

/// Runs `status`.
pub fn run(global: &GlobalArgs, args: &StatusArgs) -> anyhow::Result<Exit> {
    let interval = args.watch;
    let mut sampler = open_sampler(global)?;
    let filter = GpuFilter::new(&args.gpu, sampler.devices())?;
    let styles = Styles::for_stdout(global.color);
    let mut procs = ProcReader::new();
    let stdout = std::io::stdout();
    let refresh_in_place = !args.json && stdout.is_terminal();

    let mut printed: u64 = 0;
    loop {
        let started = Instant::now();
        let snapshot = sampler.tick();
        let sampled = started.elapsed();
        let report = build(&snapshot, &filter, &mut sampler, &mut procs);
        tracing::debug!(
            tick_ms = sampled.as_secs_f64() * 1e3,
            proc_ms = (started.elapsed() - sampled).as_secs_f64() * 1e3,
            "Sampled."
        );
        let mut out = stdout.lock();
        if args.json {
            serde_json::to_writer(&mut out, &report).context("cannot write JSON")?;
            writeln!(out).context("cannot write to stdout")?;
        } else {
            if interval.is_some() && refresh_in_place {
                // Home and clear, so the block redraws in place.
                write!(out, "\x1b[H\x1b[2J").context("cannot write to stdout")?;
            }
            for line in render(&report, &styles) {
                writeln!(out, "{line}").context("cannot write to stdout")?;
            }
        }
        out.flush().context("cannot write to stdout")?;
        drop(out);
        printed += 1;
        let Some(interval) = interval else { break };
        if args.count.is_some_and(|count| printed >= count) {
            break;
        }
        if !args.json && !refresh_in_place {
            writeln!(stdout.lock()).context("cannot write to stdout")?;
        }
        std::thread::sleep(interval.saturating_sub(started.elapsed()));
    }
    Ok(Exit::Ok)
}

/// Joins a snapshot with /proc into the report.
fn build(
    snapshot: &Snapshot,
    filter: &GpuFilter,
    sampler: &mut Sampler<NvmlBackend>,
    procs: &mut ProcReader,
) -> StatusReport {
    let devices = snapshot
        .devices
        .iter()
        .filter(|d| filter.matches(&d.info))
        .map(|d| device_status(d, sampler.backend_mut(), procs))
        .collect();
    StatusReport {
        schema: SCHEMA,
        taken_at: rfc3339(snapshot.taken_at_unix_ms),
        driver: (*snapshot.driver).clone(),
        devices,
        unopened: snapshot
            .unopened
            .iter()
            .map(|u| UnopenedStatus {
                index: u.index,
                reason: u.reason.to_string(),
            })
            .collect(),
    }
}

fn device_status(
    device: &DeviceSnapshot,
    backend: &mut dyn Backend,
    procs: &mut ProcReader,
) -> DeviceStatus {
    let info = &device.info;
    let mut status = DeviceStatus {
        index: info.index,
        uuid: info.uuid.clone(),
        name: info.name.clone(),
        pci_bus_id: info.pci_bus_id.clone(),
        state: "ok",
        error: None,
        memory: None,
        utilization_gpu_percent: None,
        utilization_memory_percent: None,
        temperature_c: None,
        power_mw: None,
        unaccounted_bytes: None,
        processes: None,
        mig_instances: Vec::new(),
        missing: BTreeMap::new(),
        dropped: Vec::new(),
    };
    let reading = match &device.state {
        DeviceState::Ok(reading) => reading,
        DeviceState::Lost { reason } => {
            status.state = "lost";
            status.error = Some(reason.clone());
            return status;
        }
        DeviceState::Error { reason } => {
            status.state = "error";
            status.error = Some(reason.clone());
            return status;
        }
    };
    status.memory = reading.memory;
    status.utilization_gpu_percent = reading.utilization_gpu_percent;
    status.utilization_memory_percent = reading.utilization_memory_percent;
    status.temperature_c = reading.temperature_c;
    status.power_mw = reading.power_mw;
    status.unaccounted_bytes = reading.unaccounted_bytes();
    status.processes = reading.processes.as_ref().map(|list| {
        let mut list: Vec<ProcessStatus> = list
            .iter()
            .map(|p| process_status(p, backend, procs))
            .collect();
        // Biggest holders first: the question is "who has my memory".
        list.sort_by(|a, b| b.used_bytes.cmp(&a.used_bytes).then(a.pid.cmp(&b.pid)));
        list
    });
    status.mig_instances = info
        .mig_instances
        .iter()
        .map(|mig| MigStatus {
            uuid: mig.uuid.clone(),
            name: mig.name.clone(),
            gpu_instance_id: mig.gpu_instance_id,
            compute_instance_id: mig.compute_instance_id,
            memory: reading
                .mig
                .iter()
                .find(|r| r.uuid == mig.uuid)
                .and_then(|r| r.memory),
        })
        .collect();
    status.missing = reading
        .missing
        .iter()
        .map(|(field, why)| (field.as_str(), why.to_string()))
        .collect();
    status.dropped = reading
        .dropped
        .iter()
        .map(|d| DroppedStatus {
            what: d.what.clone(),
            reason: d.reason.clone(),
        })
        .collect();
    status
}

fn process_status(
    process: &ProcessUsage,
    backend: &mut dyn Backend,
    procs: &mut ProcReader,
) -> ProcessStatus {
    let details = procs.details(process.pid);
    let (user, command) = match &details {
        Some(d) => (
            d.user.clone().or_else(|| d.uid.map(|u| u.to_string())),
            Some(d.command.clone()),
        ),
        // Not in this PID namespace: the driver still knows the name.
        None => (None, backend.process_name(process.pid)),
    };
    ProcessStatus {
        pid: process.pid,
        visible: details.is_some(),
        user,
        command,
        used_bytes: process.used_bytes,
        kind: process.kind,
        gpu_instance_id: process.gpu_instance_id,
        compute_instance_id: process.compute_instance_id,
    }
}

const BAR_WIDTH: usize = 30;

/// The human view, one block per device.
fn render(report: &StatusReport, styles: &Styles) -> Vec<String> {
    let mut lines = Vec::new();
    let mut header = vec![format!("vramctl {}", env!("CARGO_PKG_VERSION"))];
    if let Some(v) = &report.driver.driver_version {
        header.push(format!("driver {v}"));
    }
    header.push(report.taken_at.clone());
    lines.push(paint(styles.dim, &header.join(" · ")));
    if report.devices.is_empty() && report.unopened.is_empty() {
        lines.push("no NVIDIA GPU found".into());
    }
    for device in &report.devices {
        lines.push(String::new());
        render_device(device, styles, &mut lines);
    }
    for unopened in &report.unopened {
        lines.push(String::new());
        lines.push(format!(
            "{}  {}",
            paint(styles.heading, &format!("GPU {}", unopened.index)),
            paint(
                styles.bad,
                &format!("could not be opened: {}", unopened.reason)
            )
        ));
    }
    lines
}

fn render_device(d: &DeviceStatus, styles: &Styles, lines: &mut Vec<String>) {
    let name = d.name.as_deref().unwrap_or("(name not reported)");
    lines.push(format!(
        "{}  {}",
        paint(styles.heading, &format!("GPU {}  {name}", d.index)),
        paint(
            styles.dim,
            &format!("{}  {}", d.uuid, d.pci_bus_id.as_deref().unwrap_or(""))
        )
        .trim_end()
    ));
    if let Some(error) = &d.error {
        let label = if d.state == "lost" { "LOST" } else { "ERROR" };
        lines.push(format!(
            "  {}",
            paint(styles.bad, &format!("{label}: {error}"))
        ));
        return;
    }
    match d.memory {
        Some(m) => {
            let pct = units::percent(m.used_bytes + m.reserved_bytes, m.total_bytes).unwrap_or(0);
            let style = if pct >= 90 {
                styles.warn
            } else {
                styles.heading
            };
            lines.push(format!(
                "  memory  {}  {} used + {} reserved of {} ({pct}%), {} free",
                paint(
                    style,
                    &units::memory_bar(m.used_bytes, m.reserved_bytes, m.total_bytes, BAR_WIDTH)
                ),
                units::bytes(m.used_bytes),
                units::bytes(m.reserved_bytes),
                units::bytes(m.total_bytes),
                units::bytes(m.free_bytes),
            ));
        }
        None => lines.push("  memory  not reported".into()),
    }
    let mut gauges = Vec::new();
    if let Some(u) = d.utilization_gpu_percent {
        gauges.push(format!("util {u}%"));
    }
    if let Some(u) = d.utilization_memory_percent {
        gauges.push(format!("mem-util {u}%"));
    }
    if let Some(t) = d.temperature_c {
        gauges.push(format!("temp {t}°C"));
    }
    if let Some(p) = d.power_mw {
        gauges.push(format!("power {}", units::watts(p)));
    }
    if !gauges.is_empty() {
        lines.push(format!("  {}", gauges.join("   ")));
    }

    match &d.processes {
        None => lines.push("  processes  not reported".into()),
        Some(processes) => {
            // Processes outside any MIG instance first, then each instance with its own.
            let plain: Vec<&ProcessStatus> = processes
                .iter()
                .filter(|p| p.gpu_instance_id.is_none())
                .collect();
            if !plain.is_empty() || d.mig_instances.is_empty() {
                render_processes(&plain, lines);
            }
            for mig in &d.mig_instances {
                render_mig(mig, processes, styles, lines);
            }
            if let Some(unaccounted) = d.unaccounted_bytes.filter(|&u| u > 0) {
                lines.push(format!(
                    "  unaccounted  {} used that no listed process holds",
                    units::bytes(unaccounted)
                ));
            }
        }
    }
    for dropped in &d.dropped {
        lines.push(format!(
            "  {}",
            paint(
                styles.warn,
                &format!("ignored {}: {}", dropped.what, dropped.reason)
            )
        ));
    }
    if !d.missing.is_empty() {
        let parts: Vec<String> = d
            .missing
            .iter()
            .map(|(f, why)| format!("{f} ({why})"))
            .collect();
        lines.push(paint(
            styles.dim,
            &format!("  not reported: {}", parts.join(", ")),
        ));
    }
}

fn render_mig(
    mig: &MigStatus,
    processes: &[ProcessStatus],
    styles: &Styles,
    lines: &mut Vec<String>,
) {
    let ids = match (mig.gpu_instance_id, mig.compute_instance_id) {
        (Some(gi), Some(ci)) => format!("GI {gi} CI {ci}"),
        (Some(gi), None) => format!("GI {gi}"),
        _ => String::new(),
    };
    let memory = mig.memory.map_or_else(
        || "memory not reported".to_owned(),
        |m| {
            format!(
                "{} used of {}",
                units::bytes(m.used_bytes),
                units::bytes(m.total_bytes)
            )
        },
    );
    lines.push(format!(
        "  {}  {ids}  {memory}  {}",
        paint(
            styles.heading,
            mig.name.as_deref().unwrap_or("MIG instance")
        ),
        paint(styles.dim, &mig.uuid)
    ));
    let mine: Vec<&ProcessStatus> = processes
        .iter()
        .filter(|p| {
            p.gpu_instance_id.is_some()
                && p.gpu_instance_id == mig.gpu_instance_id
                && (mig.compute_instance_id.is_none()
                    || p.compute_instance_id == mig.compute_instance_id)
        })
        .collect();
    if !mine.is_empty() {
        let mut table = process_table();
        for p in mine {
            table.push(process_row(p));
        }
        lines.extend(table.render("    "));
    }
}

fn process_table() -> Table {
    Table::new(&[
        ("PID", Align::Right),
        ("USER", Align::Left),
        ("MEMORY", Align::Right),
        ("TYPE", Align::Left),
        ("COMMAND", Align::Left),
    ])
}

fn process_row(p: &ProcessStatus) -> Vec<String> {
    let command = match (&p.command, p.visible) {
        (Some(c), true) => c.clone(),
        (Some(c), false) => format!("{c} (not visible in this PID namespace)"),
        (None, _) => "(not visible in this PID namespace)".into(),
    };
    let kind = match p.kind {
        ProcessKind::Compute => "C",
        ProcessKind::Graphics => "G",
        ProcessKind::ComputeAndGraphics => "C+G",
    };
    vec![
        p.pid.to_string(),
        p.user.clone().unwrap_or_else(|| "-".into()),
        units::opt_bytes(p.used_bytes),
        kind.into(),
        command,
    ]
}

fn render_processes(processes: &[&ProcessStatus], lines: &mut Vec<String>) {
    if processes.is_empty() {
        lines.push("  no processes".into());
    } else {
        let mut table = process_table();
        for p in processes {
            table.push(process_row(p));
        }
        lines.extend(table.render("  "));
    }
}
