//! nvidia-smi's CSV query logs, read and written.
//!
//! `nvidia-smi --query-gpu=timestamp,index,uuid,memory.used,... --format=csv -lms 500` writes
//! a header (`timestamp, index, uuid, memory.used [MiB]`) and one row per GPU per loop, values
//! with units (`1234 MiB`, `45 %`, `71.48 W`) unless `nounits`, and `[N/A]` /
//! `[Not Supported]` for what a GPU cannot report. `--query-compute-apps=` writes one row
//! per process. Columns may come in any order and any subset; columns vramctl does not
//! record are ignored (and listed in the report). Rows of one loop share a timestamp and
//! become one tick.
//!
//! Rows are read as CSV (the `csv` crate): nvidia-smi's own unquoted rows, and the quoted
//! fields `vramctl export` writes for a command line holding a comma, a quote or a newline.
//! nvidia-smi itself does not quote, so in its own logs a process name with a comma still
//! cannot be told apart (rejected as a row with too many fields).
//!
//! A value's own unit wins over the column's (`quantity.rs`), and every row passes the
//! same sanity rules as live readings (`vramctl_core::sanity`): used above total, a figure
//! no GPU can have, PID 0 — such a row is a bad row with its file:line.
//!
//! An apps log without `gpu_uuid` or `gpu_bus_id` (`--query-compute-apps=timestamp,pid,
//! used_gpu_memory`, a common line) is put on one GPU: `--gpu`, else the only GPU of the
//! other files or of the history, else a single unnamed GPU ([`super::UNNAMED_GPU`]); with
//! several GPUs known and no `--gpu` it is refused, naming them.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use jiff::tz::TimeZone;

use super::quantity::{ColumnUnit, split_header};
use super::{Companion, IMPORT_LIMITS, ImportError, ImportOptions, Rows, shown};
use crate::db::Store;
use crate::error::StoreError;
use crate::model::{
    DeviceMeta, DeviceSample, DeviceSampleState, Metric, Observed, ProcessKey, ProcessList,
    ProcessMeta, ProcessOnDevice, ProcessSample, TickSample, TimeRange,
};

const MIB: u64 = 1 << 20;
const TIME_FORMAT: &str = "%Y/%m/%d %H:%M:%S%.3f";

/// A column of a `--query-gpu` log.
#[derive(Debug, Clone, PartialEq)]
enum GpuColumn {
    Timestamp,
    Index,
    Uuid,
    Name,
    PciBusId,
    Value(Metric, ColumnUnit),
    Ignored(String),
}

fn gpu_metric(name: &str) -> Option<Metric> {
    Some(match name {
        "memory.total" => Metric::TotalBytes,
        "memory.used" => Metric::UsedBytes,
        "memory.free" => Metric::FreeBytes,
        "memory.reserved" => Metric::ReservedBytes,
        "utilization.gpu" => Metric::UtilizationGpuPercent,
        "utilization.memory" => Metric::UtilizationMemoryPercent,
        "temperature.gpu" => Metric::TemperatureC,
        "power.draw" | "power.draw.instant" | "power.draw.average" => Metric::PowerMw,
        _ => return None,
    })
}

/// nvidia-smi's unit of a metric's column when the header names none (`nounits`, or a
/// header without `[…]` as for `temperature.gpu`).
fn default_unit(metric: Metric) -> &'static str {
    match metric {
        Metric::PowerMw => "W",
        Metric::TemperatureC => "C",
        Metric::UtilizationGpuPercent
        | Metric::UtilizationMemoryPercent
        | Metric::ProcessSmPercent => "%",
        _ => "MiB",
    }
}

fn gpu_column(header: &str) -> Result<GpuColumn, String> {
    let (name, unit) = split_header(header);
    Ok(match name.as_str() {
        "timestamp" => GpuColumn::Timestamp,
        "index" => GpuColumn::Index,
        "uuid" | "gpu_uuid" => GpuColumn::Uuid,
        "name" | "gpu_name" => GpuColumn::Name,
        "pci.bus_id" | "gpu_bus_id" => GpuColumn::PciBusId,
        other => match gpu_metric(other) {
            Some(m) => GpuColumn::Value(
                m,
                ColumnUnit::new(m, unit.as_deref(), default_unit(m))
                    .map_err(|e| format!("column '{}': {e}", shown(header.trim(), 40)))?,
            ),
            None => GpuColumn::Ignored(other.to_owned()),
        },
    })
}

/// A column of a `--query-compute-apps` log.
#[derive(Debug, Clone, PartialEq)]
enum AppColumn {
    Timestamp,
    GpuName,
    GpuBusId,
    GpuUuid,
    Pid,
    ProcessName,
    UsedMemory(ColumnUnit),
    Ignored(String),
}

fn app_column(header: &str) -> Result<AppColumn, String> {
    let (name, unit) = split_header(header);
    Ok(match name.as_str() {
        "timestamp" => AppColumn::Timestamp,
        "gpu_name" => AppColumn::GpuName,
        "gpu_bus_id" => AppColumn::GpuBusId,
        "gpu_uuid" => AppColumn::GpuUuid,
        "pid" => AppColumn::Pid,
        "process_name" | "name" => AppColumn::ProcessName,
        "used_gpu_memory" | "used_memory" => AppColumn::UsedMemory(
            ColumnUnit::new(Metric::ProcessUsedBytes, unit.as_deref(), "MiB")
                .map_err(|e| format!("column '{}': {e}", shown(header.trim(), 40)))?,
        ),
        other => AppColumn::Ignored(other.to_owned()),
    })
}

/// `memory.used [MiB]` → `memory.used`.
fn column_name(header: &str) -> String {
    split_header(header).0
}

/// Whether a line is a data row rather than a header (it starts with a timestamp or a
/// number).
pub(crate) fn looks_like_data(line: &str) -> bool {
    let first = line.split(',').next().unwrap_or("").trim();
    first.starts_with(|c: char| c.is_ascii_digit()) || first.starts_with("GPU-")
}

/// A CSV record with the line it starts on.
struct Record {
    line: usize,
    fields: Vec<String>,
}

/// The file's records (blank lines left out), read as CSV: quoted fields may hold commas,
/// quotes and newlines; nvidia-smi's `, ` separators are trimmed.
fn records(text: &str) -> Vec<Record> {
    let text = text.trim_start_matches('\u{feff}');
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let mut out = Vec::new();
    let mut record = csv::StringRecord::new();
    loop {
        let line = usize::try_from(reader.position().line()).unwrap_or(0);
        match reader.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {
                if record.iter().all(str::is_empty) {
                    continue;
                }
                let line = record
                    .position()
                    .map_or(line, |p| usize::try_from(p.line()).unwrap_or(line));
                out.push(Record {
                    line,
                    fields: record.iter().map(str::to_owned).collect(),
                });
            }
            // Input is already text; a reader error cannot repeat, so stop at it.
            Err(_) => break,
        }
    }
    out
}

/// The header's column names (with their units), and the index where data starts.
fn header(
    records: &[Record],
    options: &ImportOptions,
    rows: &Rows<'_>,
) -> Result<(Vec<String>, usize), ImportError> {
    let Some(first) = records.first() else {
        return Ok((Vec::new(), 0));
    };
    if looks_like_data(first.fields.first().map_or("", String::as_str)) {
        let Some(columns) = &options.columns else {
            return Err(rows.fatal(
                first.line,
                "no header line (written with 'noheader'); pass the column list with --columns",
            ));
        };
        return Ok((columns.clone(), 0));
    }
    Ok((first.fields.clone(), 1))
}

/// A value: `[N/A]`, `[Not Supported]`… are missing with a reason; else a number with an
/// optional unit, in the column's unit when it has none.
fn value(field: &str, unit: ColumnUnit) -> Result<Observed, String> {
    let field = field.trim();
    if let Some(reason) = missing_reason(field) {
        return Ok(Observed::Missing(reason));
    }
    unit.read(field).map(Observed::Value)
}

fn missing_reason(field: &str) -> Option<String> {
    let inner = field.strip_prefix('[').and_then(|f| f.strip_suffix(']'));
    let text = match inner {
        Some(t) => t,
        None if field == "N/A" => "N/A",
        None => return None,
    };
    Some(match text {
        "Not Supported" => "not supported".into(),
        "Insufficient Permissions" | "No Permission" => "no permission".into(),
        "N/A" => "N/A".into(),
        other => shown(&other.to_ascii_lowercase(), 40),
    })
}

fn missing_text(reason: Option<&str>) -> &'static str {
    match reason {
        Some("not supported") => "[Not Supported]",
        Some("no permission") => "[Insufficient Permissions]",
        _ => "[N/A]",
    }
}

/// nvidia-smi's local timestamp in `tz`.
fn timestamp(field: &str, tz: &TimeZone) -> Result<i64, String> {
    let field = field.trim();
    let dt = jiff::civil::DateTime::strptime("%Y/%m/%d %H:%M:%S%.f", field).map_err(|_| {
        format!(
            "'{}' is not a time like 2026/11/29 20:31:31.715",
            shown(field, 40)
        )
    })?;
    dt.to_zoned_datetime(tz.clone())
        .map(|z| z.timestamp().as_millisecond())
        .map_err(|e| {
            format!(
                "'{}' is not a time in the given zone: {e}",
                shown(field, 40)
            )
        })
}

fn device_uuid(uuid: Option<&str>, bus: Option<&str>, index: Option<u32>) -> String {
    match (uuid, bus, index) {
        (Some(u), _, _) => u.to_owned(),
        (None, Some(b), _) => format!("PCI-{b}"),
        (None, None, Some(i)) => format!("INDEX-{i}"),
        _ => "GPU-unknown".to_owned(),
    }
}

fn note_ignored(rows: &mut Rows<'_>, names: impl Iterator<Item = String>) {
    for name in names {
        let name = shown(&name, 60);
        if !rows.ignored.contains(&name) {
            rows.ignored.push(name);
        }
    }
}

/// Parses a `--query-gpu` log into ticks (one per timestamp).
///
/// # Errors
/// A missing timestamp column or header, a header unit that is not the column's; with
/// `strict`, the first bad row.
pub(crate) fn parse_gpu(
    text: &str,
    options: &ImportOptions,
    rows: &mut Rows<'_>,
) -> Result<Vec<TickSample>, ImportError> {
    let records = records(text);
    let (names, start) = header(&records, options, rows)?;
    let header_line = records.first().map_or(1, |r| r.line);
    let columns: Vec<GpuColumn> = names
        .iter()
        .map(|n| gpu_column(n))
        .collect::<Result<_, _>>()
        .map_err(|e| rows.fatal(header_line, e))?;
    note_ignored(
        rows,
        columns.iter().filter_map(|c| match c {
            GpuColumn::Ignored(n) => Some(n.clone()),
            _ => None,
        }),
    );
    if !columns.contains(&GpuColumn::Timestamp) {
        return Err(rows.fatal(
            header_line,
            "no 'timestamp' column; add timestamp to --query-gpu",
        ));
    }
    let stamp_at = columns
        .iter()
        .position(|c| *c == GpuColumn::Timestamp)
        .unwrap_or(0);
    let header_fields = (start == 1).then(|| records[0].fields.clone());
    let mut ticks: Vec<TickSample> = Vec::new();
    let mut last_stamp = String::new();
    for record in &records[start..] {
        let (line_no, fields) = (record.line, &record.fields);
        if Some(fields) == header_fields.as_ref() {
            continue;
        }
        rows.read += 1;
        if fields.len() != columns.len() {
            rows.bad(
                line_no,
                format!(
                    "{} fields where the header has {} (truncated or mixed file?)",
                    fields.len(),
                    columns.len()
                ),
            )?;
            continue;
        }
        let mut at = None;
        let (mut uuid, mut bus, mut index, mut name) = (None, None, None, None);
        let mut metrics = Vec::new();
        let mut error = None;
        for (column, field) in columns.iter().zip(fields) {
            match column {
                GpuColumn::Timestamp => match timestamp(field, &options.tz) {
                    Ok(t) => at = Some(t),
                    Err(e) => error = Some(e),
                },
                GpuColumn::Index => match field.parse::<u32>() {
                    Ok(i) => index = Some(i),
                    Err(_) => error = Some(format!("index '{}' is not a number", shown(field, 30))),
                },
                GpuColumn::Uuid => uuid = Some(field.clone()),
                GpuColumn::Name => name = Some(field.clone()),
                GpuColumn::PciBusId => bus = Some(field.clone()),
                GpuColumn::Value(metric, unit) => match value(field, *unit) {
                    Ok(v) => metrics.push((*metric, v)),
                    Err(e) => error = Some(format!("{}: {e}", metric.name())),
                },
                GpuColumn::Ignored(_) => {}
            }
            if error.is_some() {
                break;
            }
        }
        if error.is_none() {
            error = memory_problem(&metrics).map(|why| format!("impossible memory: {why}"));
        }
        if let Some(e) = error {
            rows.bad(line_no, e)?;
            continue;
        }
        let Some(at) = at else { continue };
        let device = DeviceSample {
            device: DeviceMeta {
                uuid: device_uuid(uuid.as_deref(), bus.as_deref(), index),
                index,
                name,
                pci_bus_id: bus,
                parent_uuid: None,
            },
            state: DeviceSampleState::Read {
                metrics,
                processes: ProcessList::NotObserved,
            },
        };
        let stamp = fields[stamp_at].as_str();
        match ticks.last_mut() {
            Some(tick)
                if stamp == last_stamp
                    && !tick
                        .devices
                        .iter()
                        .any(|d| d.device.uuid == device.device.uuid) =>
            {
                tick.devices.push(device);
            }
            _ => {
                if ticks.last().is_some_and(|t| at <= t.at_unix_ms) {
                    rows.bad(
                        line_no,
                        format!(
                            "time '{}' is not after the previous row's",
                            shown(stamp, 40)
                        ),
                    )?;
                    continue;
                }
                ticks.push(TickSample {
                    at_unix_ms: at,
                    devices: vec![device],
                    ..TickSample::default()
                });
            }
        }
        stamp.clone_into(&mut last_stamp);
    }
    Ok(ticks)
}

/// The sanity rule of live readings, on one row's memory figures.
fn memory_problem(metrics: &[(Metric, Observed)]) -> Option<String> {
    let get = |m: Metric| {
        metrics.iter().find_map(|(metric, v)| match v {
            Observed::Value(v) if *metric == m => Some(*v),
            _ => None,
        })
    };
    let others: Vec<u64> = [Metric::ReservedBytes, Metric::FreeBytes]
        .into_iter()
        .filter_map(get)
        .collect();
    vramctl_core::sanity::memory_problem(get(Metric::TotalBytes), get(Metric::UsedBytes), &others)
}

/// Parses a `--query-compute-apps` log into ticks (one per timestamp). `companion`: the
/// GPUs (and their totals) of the other files and of the history.
///
/// # Errors
/// As [`parse_gpu`]; also a log without `pid`, and one without a GPU column whose rows
/// cannot be put on one GPU ([`ImportError::Gpu`]).
pub(crate) fn parse_apps(
    text: &str,
    options: &ImportOptions,
    rows: &mut Rows<'_>,
    companion: &Companion,
) -> Result<Vec<TickSample>, ImportError> {
    let records = records(text);
    let (names, start) = header(&records, options, rows)?;
    let header_line = records.first().map_or(1, |r| r.line);
    let columns: Vec<AppColumn> = names
        .iter()
        .map(|n| app_column(n))
        .collect::<Result<_, _>>()
        .map_err(|e| rows.fatal(header_line, e))?;
    note_ignored(
        rows,
        columns.iter().filter_map(|c| match c {
            AppColumn::Ignored(n) => Some(n.clone()),
            _ => None,
        }),
    );
    if !columns.contains(&AppColumn::Timestamp) {
        return Err(rows.fatal(
            header_line,
            "no 'timestamp' column; add timestamp to --query-compute-apps",
        ));
    }
    if !columns.contains(&AppColumn::Pid) {
        return Err(rows.fatal(
            header_line,
            "no 'pid' column; add pid to --query-compute-apps",
        ));
    }
    let unnamed_gpu =
        if columns.contains(&AppColumn::GpuUuid) || columns.contains(&AppColumn::GpuBusId) {
            None
        } else {
            let (meta, how) = companion
                .gpu_for_unnamed_rows(options.gpu.as_deref())
                .map_err(|why| ImportError::Gpu {
                    path: rows.path.to_path_buf(),
                    why,
                })?;
            rows.notes.push(format!(
                "'{}' has no GPU column: its rows are put on {how}",
                rows.path.display()
            ));
            Some(meta)
        };
    let stamp_at = columns
        .iter()
        .position(|c| *c == AppColumn::Timestamp)
        .unwrap_or(0);
    let header_fields = (start == 1).then(|| records[0].fields.clone());
    let mut ticks: Vec<TickSample> = Vec::new();
    let mut last_stamp = String::new();
    // Every GPU seen so far gets an (maybe empty) process list at each timestamp, so a
    // process that leaves is seen to leave.
    let mut gpus: BTreeMap<String, DeviceMeta> = BTreeMap::new();
    for record in &records[start..] {
        let (line_no, fields) = (record.line, &record.fields);
        if Some(fields) == header_fields.as_ref() {
            continue;
        }
        rows.read += 1;
        if fields.len() != columns.len() {
            rows.bad(
                line_no,
                format!(
                    "{} fields where the header has {} (truncated, or a comma in a process name?)",
                    fields.len(),
                    columns.len()
                ),
            )?;
            continue;
        }
        let mut at = None;
        let (mut uuid, mut bus, mut gpu_name, mut pid, mut pname, mut used) =
            (None, None, None, None, None, None);
        let mut error = None;
        for (column, field) in columns.iter().zip(fields) {
            match column {
                AppColumn::Timestamp => match timestamp(field, &options.tz) {
                    Ok(t) => at = Some(t),
                    Err(e) => error = Some(e),
                },
                AppColumn::GpuName => gpu_name = Some(field.clone()),
                AppColumn::GpuBusId => bus = Some(field.clone()),
                AppColumn::GpuUuid => uuid = Some(field.clone()),
                AppColumn::Pid => match field.parse::<u32>() {
                    Ok(p) => pid = Some(p),
                    Err(_) => error = Some(format!("pid '{}' is not a number", shown(field, 30))),
                },
                AppColumn::ProcessName => pname = Some(field.clone()),
                AppColumn::UsedMemory(unit) => match value(field, *unit) {
                    Ok(Observed::Value(v)) => used = Some(Some(v)),
                    Ok(Observed::Missing(_)) => used = Some(None),
                    Err(e) => error = Some(format!("used memory: {e}")),
                },
                AppColumn::Ignored(_) => {}
            }
            if error.is_some() {
                break;
            }
        }
        let meta = match &unnamed_gpu {
            Some(meta) => meta.clone(),
            None => DeviceMeta {
                uuid: device_uuid(uuid.as_deref(), bus.as_deref(), None),
                index: None,
                name: gpu_name,
                pci_bus_id: bus,
                parent_uuid: None,
            },
        };
        if let (None, Some(pid)) = (&error, pid) {
            let total = companion.totals.get(&meta.uuid).copied();
            error =
                vramctl_core::sanity::process_problem(pid, used.flatten(), total, IMPORT_LIMITS)
                    .map(|why| format!("impossible process entry: {why}"));
        }
        if let Some(e) = error {
            rows.bad(line_no, e)?;
            continue;
        }
        let (Some(at), Some(pid)) = (at, pid) else {
            continue;
        };
        gpus.entry(meta.uuid.clone())
            .or_insert_with(|| meta.clone());
        let stamp = fields[stamp_at].as_str();
        if stamp != last_stamp || ticks.is_empty() {
            if ticks.last().is_some_and(|t| at <= t.at_unix_ms) {
                rows.bad(
                    line_no,
                    format!(
                        "time '{}' is not after the previous row's",
                        shown(stamp, 40)
                    ),
                )?;
                continue;
            }
            ticks.push(TickSample {
                at_unix_ms: at,
                ..TickSample::default()
            });
            stamp.clone_into(&mut last_stamp);
        }
        let Some(tick) = ticks.last_mut() else {
            continue;
        };
        let process = ProcessOnDevice {
            pid,
            used_bytes: used.flatten(),
            sm_percent: None,
            agent: None,
        };
        match tick.devices.iter_mut().find(|d| d.device.uuid == meta.uuid) {
            Some(DeviceSample {
                state:
                    DeviceSampleState::Read {
                        processes: ProcessList::Observed(list),
                        ..
                    },
                ..
            }) => list.push(process),
            _ => tick.devices.push(DeviceSample {
                device: meta,
                state: DeviceSampleState::Read {
                    metrics: Vec::new(),
                    processes: ProcessList::Observed(vec![process]),
                },
            }),
        }
        if !tick.processes.iter().any(|p| p.meta.key.pid == pid) {
            tick.processes.push(ProcessSample {
                meta: ProcessMeta {
                    key: ProcessKey {
                        boot_id: None,
                        pid,
                        start_time_ticks: None,
                    },
                    command: pname,
                    ..ProcessMeta::default()
                },
                cpu_ticks: None,
            });
        }
    }
    // Second pass: GPUs known by then but without rows at a timestamp had no processes.
    let mut known: Vec<&DeviceMeta> = Vec::new();
    for tick in &mut ticks {
        for d in &tick.devices {
            if !known.iter().any(|k| k.uuid == d.device.uuid) {
                if let Some(meta) = gpus.get(&d.device.uuid) {
                    known.push(meta);
                }
            }
        }
        for meta in &known {
            if !tick.devices.iter().any(|d| d.device.uuid == meta.uuid) {
                tick.devices.push(DeviceSample {
                    device: (*meta).clone(),
                    state: DeviceSampleState::Read {
                        metrics: Vec::new(),
                        processes: ProcessList::Observed(Vec::new()),
                    },
                });
            }
        }
    }
    Ok(ticks)
}

/// `csv`, `csv,noheader`, `csv,nounits`, `csv,noheader,nounits` (as nvidia-smi's
/// `--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsvStyle {
    /// Write the header line.
    pub header: bool,
    /// Write units after values.
    pub units: bool,
}

impl std::str::FromStr for CsvStyle {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut style = Self {
            header: true,
            units: true,
        };
        let mut parts = s.split(',').map(str::trim);
        if parts.next() != Some("csv") {
            return Err(format!("'{s}' is not csv[,noheader][,nounits]"));
        }
        for part in parts {
            match part {
                "noheader" => style.header = false,
                "nounits" => style.units = false,
                other => return Err(format!("'{other}' in '{s}' is not noheader or nounits")),
            }
        }
        Ok(style)
    }
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// A column vramctl does not record.
    #[error("cannot export column '{0}': vramctl does not record it")]
    Column(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Writing the output failed. (The cause is the error's source, printed once by the
    /// caller's chain; naming it here too printed it twice.)
    #[error("cannot write the export")]
    Write(#[from] std::io::Error),
    /// Writing a CSV record failed.
    #[error("cannot write the export")]
    Csv(#[from] csv::Error),
}

/// Default `--query-gpu` columns of [`export_gpu`].
pub const DEFAULT_GPU_COLUMNS: &str = "timestamp, index, name, uuid, pci.bus_id, memory.total [MiB], memory.reserved [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%], utilization.memory [%], temperature.gpu, power.draw [W]";

/// Default `--query-compute-apps` columns of [`export_apps`].
pub const DEFAULT_APP_COLUMNS: &str =
    "timestamp, gpu_name, gpu_bus_id, gpu_uuid, pid, process_name, used_gpu_memory [MiB]";

fn header_name(name: &str) -> String {
    let unit = match name {
        "memory.total" | "memory.used" | "memory.free" | "memory.reserved" | "used_gpu_memory"
        | "used_memory" => "MiB",
        "utilization.gpu" | "utilization.memory" => "%",
        "power.draw" | "power.draw.instant" | "power.draw.average" => "W",
        _ => return name.to_owned(),
    };
    format!("{name} [{unit}]")
}

fn format_value(metric: Metric, v: u64, units: bool) -> String {
    let (number, unit) = match metric {
        Metric::UsedBytes
        | Metric::ReservedBytes
        | Metric::FreeBytes
        | Metric::TotalBytes
        | Metric::ProcessUsedBytes => ((v / MIB).to_string(), " MiB"),
        Metric::UtilizationGpuPercent | Metric::UtilizationMemoryPercent => (v.to_string(), " %"),
        Metric::PowerMw => (format!("{}.{:02}", v / 1000, (v % 1000) / 10), " W"),
        _ => (v.to_string(), ""),
    };
    if units {
        format!("{number}{unit}")
    } else {
        number
    }
}

fn format_time(unix_ms: i64, tz: &TimeZone) -> String {
    jiff::Timestamp::from_millisecond(unix_ms).map_or_else(
        |_| unix_ms.to_string(),
        |t| {
            t.to_zoned_datetime(tz.clone())
                .strftime(TIME_FORMAT)
                .to_string()
        },
    )
}

/// nvidia-smi's `, ` between fields: a space starts every field after the first, so an
/// export reads as nvidia-smi's own output; a field that needs quoting is quoted with its
/// space inside (`, " python a,b"`), which the importer (and any CSV reader that trims)
/// reads back as it was.
fn smi_spacing(fields: impl IntoIterator<Item = String>) -> Vec<String> {
    fields
        .into_iter()
        .enumerate()
        .map(|(i, f)| if i == 0 { f } else { format!(" {f}") })
        .collect()
}

/// Gaps by (device UUID, metric code or -1 for the whole device).
/// (from, to, reason) per (device UUID, metric code).
type GapMap = HashMap<(String, i64), Vec<(i64, i64, String)>>;

struct GapIndex(GapMap);

impl GapIndex {
    fn load(store: &Store, range: TimeRange) -> Result<Self, StoreError> {
        let mut map: GapMap = HashMap::new();
        for gap in store.gaps(range)? {
            let Some(uuid) = gap.device_uuid else {
                continue;
            };
            map.entry((uuid, gap.metric.map_or(-1, Metric::code)))
                .or_default()
                .push((gap.from_ms, gap.to_ms, gap.reason));
        }
        Ok(Self(map))
    }

    fn reason(&self, uuid: &str, metric: Metric, t: i64) -> Option<&str> {
        for code in [metric.code(), -1] {
            if let Some(list) = self.0.get(&(uuid.to_owned(), code)) {
                if let Some((_, _, r)) = list.iter().find(|(f, to, _)| *f <= t && t <= *to) {
                    return Some(r);
                }
            }
        }
        None
    }
}

/// Writes `--query-gpu`-style CSV: one row per device each time it was observed.
///
/// # Errors
/// An unknown column, a store failure, or a write failure.
pub fn export_gpu(
    store: &mut Store,
    range: TimeRange,
    columns: &str,
    style: CsvStyle,
    tz: &TimeZone,
    out: &mut dyn Write,
) -> Result<u64, ExportError> {
    let names: Vec<String> = columns
        .split(',')
        .map(column_name)
        .filter(|n| !n.is_empty())
        .collect();
    let cols: Vec<GpuColumn> = names
        .iter()
        .map(|n| gpu_column(n).unwrap_or_else(|_| GpuColumn::Ignored(n.clone())))
        .collect();
    if let Some(GpuColumn::Ignored(n)) = cols.iter().find(|c| matches!(c, GpuColumn::Ignored(_))) {
        return Err(ExportError::Column(n.clone()));
    }
    let mut out = super::csv_writer(out);
    if style.header {
        out.write_record(smi_spacing(names.iter().map(|n| header_name(n))))?;
    }
    let devices: Vec<_> = store
        .devices()?
        .into_iter()
        .filter(|d| d.meta.parent_uuid.is_none())
        .collect();
    let gaps = GapIndex::load(store, range)?;
    let mut written = 0;
    let mut failure: Option<csv::Error> = None;
    store.scan(range, |frame| {
        if failure.is_some() || frame.span_ms > 0 {
            return;
        }
        for d in &devices {
            if !frame.observed(d.id).0 {
                continue;
            }
            let value_of = |m: Metric| {
                frame.get(crate::query::SeriesRef {
                    metric: m,
                    device_id: Some(d.id),
                    process_id: None,
                })
            };
            let any = Metric::DEVICE.iter().any(|m| value_of(*m).is_some());
            if !any
                && gaps
                    .reason(&d.meta.uuid, Metric::UsedBytes, frame.t_ms)
                    .is_none()
            {
                continue;
            }
            let fields: Vec<String> = cols
                .iter()
                .map(|c| match c {
                    GpuColumn::Timestamp => format_time(frame.t_ms, tz),
                    GpuColumn::Index => d
                        .meta
                        .index
                        .map_or_else(|| "[N/A]".into(), |i| i.to_string()),
                    GpuColumn::Uuid => d.meta.uuid.clone(),
                    GpuColumn::Name => d.meta.name.clone().unwrap_or_else(|| "[N/A]".into()),
                    GpuColumn::PciBusId => {
                        d.meta.pci_bus_id.clone().unwrap_or_else(|| "[N/A]".into())
                    }
                    GpuColumn::Value(m, _) => {
                        match value_of(*m).and_then(crate::Entry::min_max_last) {
                            Some((_, _, last)) => format_value(*m, last, style.units),
                            None => missing_text(gaps.reason(&d.meta.uuid, *m, frame.t_ms)).into(),
                        }
                    }
                    GpuColumn::Ignored(_) => String::new(),
                })
                .collect();
            if let Err(e) = out.write_record(smi_spacing(fields)) {
                failure = Some(e);
                return;
            }
            written += 1;
        }
    })?;
    if let Some(e) = failure {
        return Err(e.into());
    }
    out.flush()?;
    Ok(written)
}

/// Writes `--query-compute-apps`-style CSV: one row per process per device each time the
/// device's process list was observed.
///
/// # Errors
/// An unknown column, a store failure, or a write failure.
pub fn export_apps(
    store: &mut Store,
    range: TimeRange,
    columns: &str,
    style: CsvStyle,
    tz: &TimeZone,
    out: &mut dyn Write,
) -> Result<u64, ExportError> {
    let names: Vec<String> = columns
        .split(',')
        .map(column_name)
        .filter(|n| !n.is_empty())
        .collect();
    let cols: Vec<AppColumn> = names
        .iter()
        .map(|n| app_column(n).unwrap_or_else(|_| AppColumn::Ignored(n.clone())))
        .collect();
    if let Some(AppColumn::Ignored(n)) = cols.iter().find(|c| matches!(c, AppColumn::Ignored(_))) {
        return Err(ExportError::Column(n.clone()));
    }
    let mut out = super::csv_writer(out);
    if style.header {
        out.write_record(smi_spacing(names.iter().map(|n| header_name(n))))?;
    }
    let devices: HashMap<i64, DeviceMeta> = store
        .devices()?
        .into_iter()
        .map(|d| (d.id, d.meta))
        .collect();
    let mut order: Vec<(i64, Option<u32>)> = devices.iter().map(|(id, m)| (*id, m.index)).collect();
    order.sort_by_key(|&(id, index)| (index.unwrap_or(u32::MAX), id));
    let rank = |d: i64| {
        order
            .iter()
            .position(|(id, _)| *id == d)
            .unwrap_or(usize::MAX)
    };
    let processes: HashMap<i64, (u32, Option<String>)> = store
        .all_processes()?
        .into_iter()
        .map(|(id, r)| (id, (r.meta.key.pid, r.meta.command)))
        .collect();
    let mut written = 0;
    let mut failure: Option<csv::Error> = None;
    // (device, process, bytes) of one frame, in output order.
    let mut rows: Vec<(i64, i64, Option<u64>)> = Vec::new();
    store.scan(range, |frame| {
        if frame.span_ms > 0 || failure.is_some() {
            return;
        }
        rows.clear();
        for (s, entry) in frame.iter() {
            if s.metric != Metric::ProcessUsedBytes {
                continue;
            }
            let (Some(d), Some(p)) = (s.device_id, s.process_id) else {
                continue;
            };
            if frame.observed(d).1 {
                rows.push((d, p, entry.min_max_last().map(|v| v.2)));
            }
        }
        // By device; within a device, in the order processes were first seen (stable sort).
        rows.sort_by_key(|r| rank(r.0));
        let time = format_time(frame.t_ms, tz);
        for &(d, p, used) in &rows {
            let meta = devices.get(&d);
            let (pid, command) = processes
                .get(&p)
                .map_or((0, None), |(pid, c)| (*pid, c.as_deref()));
            let fields: Vec<String> = cols
                .iter()
                .map(|c| match c {
                    AppColumn::Timestamp => time.clone(),
                    AppColumn::GpuName => meta
                        .and_then(|m| m.name.clone())
                        .unwrap_or_else(|| "[N/A]".into()),
                    AppColumn::GpuBusId => meta
                        .and_then(|m| m.pci_bus_id.clone())
                        .unwrap_or_else(|| "[N/A]".into()),
                    AppColumn::GpuUuid => meta.map_or_else(|| "[N/A]".into(), |m| m.uuid.clone()),
                    AppColumn::Pid => pid.to_string(),
                    AppColumn::ProcessName => command.unwrap_or("[N/A]").to_owned(),
                    AppColumn::UsedMemory(_) => used.map_or_else(
                        || "[N/A]".into(),
                        |v| format_value(Metric::ProcessUsedBytes, v, style.units),
                    ),
                    AppColumn::Ignored(_) => String::new(),
                })
                .collect();
            if let Err(e) = out.write_record(smi_spacing(fields)) {
                failure = Some(e);
                return;
            }
            written += 1;
        }
    })?;
    if let Some(e) = failure {
        return Err(e.into());
    }
    out.flush()?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(metric: Metric) -> ColumnUnit {
        ColumnUnit::new(metric, None, default_unit(metric)).unwrap()
    }

    #[test]
    fn values_units_and_missing() {
        assert_eq!(
            value("1234 MiB", unit(Metric::UsedBytes)),
            Ok(Observed::Value(1234 * MIB))
        );
        assert_eq!(
            value("1234", unit(Metric::UsedBytes)),
            Ok(Observed::Value(1234 * MIB))
        );
        assert_eq!(
            value("71.48 W", unit(Metric::PowerMw)),
            Ok(Observed::Value(71_480))
        );
        assert_eq!(
            value("45 %", unit(Metric::UtilizationGpuPercent)),
            Ok(Observed::Value(45))
        );
        assert_eq!(
            value("[N/A]", unit(Metric::PowerMw)),
            Ok(Observed::Missing("N/A".into()))
        );
        assert_eq!(
            value("[Not Supported]", unit(Metric::PowerMw)),
            Ok(Observed::Missing("not supported".into()))
        );
        assert!(
            value("lots", unit(Metric::UsedBytes))
                .unwrap_err()
                .contains("'lots' is not a number")
        );
        assert_eq!(format_value(Metric::PowerMw, 71_480, true), "71.48 W");
        assert_eq!(format_value(Metric::PowerMw, 125_000, false), "125.00");
    }

    #[test]
    fn nvidia_smi_time_in_a_zone() {
        let utc = timestamp("2026/11/29 20:31:31.715", &TimeZone::UTC).unwrap();
        assert_eq!(utc, 1_795_984_291_715);
        let paris = TimeZone::get("Europe/Paris").unwrap();
        assert_eq!(timestamp("2026/11/29 21:31:31.715", &paris).unwrap(), utc);
        assert_eq!(format_time(utc, &paris), "2026/11/29 21:31:31.715");
        assert!(timestamp("yesterday", &TimeZone::UTC).is_err());
    }

    #[test]
    fn csv_styles() {
        assert_eq!(
            "csv".parse(),
            Ok(CsvStyle {
                header: true,
                units: true
            })
        );
        assert_eq!(
            "csv,noheader,nounits".parse(),
            Ok(CsvStyle {
                header: false,
                units: false
            })
        );
        assert!("tsv".parse::<CsvStyle>().is_err());
    }
}
