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
//! Fields are split at commas: nvidia-smi does not quote, so a process name containing a
//! comma cannot be told apart (it is rejected as a row with too many fields).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use jiff::tz::TimeZone;

use super::{ImportError, ImportOptions, Rows, truncate};
use crate::db::Store;
use crate::error::StoreError;
use crate::model::{
    DeviceMeta, DeviceSample, DeviceSampleState, Metric, Observed, ProcessKey, ProcessList,
    ProcessMeta, ProcessOnDevice, ProcessSample, TickSample, TimeRange,
};

const MIB: u64 = 1 << 20;
const TIME_FORMAT: &str = "%Y/%m/%d %H:%M:%S%.3f";

/// A column of a `--query-gpu` log.
#[derive(Debug, Clone, PartialEq, Eq)]
enum GpuColumn {
    Timestamp,
    Index,
    Uuid,
    Name,
    PciBusId,
    Value(Metric),
    Ignored(String),
}

fn gpu_column(name: &str) -> GpuColumn {
    match name {
        "timestamp" => GpuColumn::Timestamp,
        "index" => GpuColumn::Index,
        "uuid" | "gpu_uuid" => GpuColumn::Uuid,
        "name" | "gpu_name" => GpuColumn::Name,
        "pci.bus_id" | "gpu_bus_id" => GpuColumn::PciBusId,
        "memory.total" => GpuColumn::Value(Metric::TotalBytes),
        "memory.used" => GpuColumn::Value(Metric::UsedBytes),
        "memory.free" => GpuColumn::Value(Metric::FreeBytes),
        "memory.reserved" => GpuColumn::Value(Metric::ReservedBytes),
        "utilization.gpu" => GpuColumn::Value(Metric::UtilizationGpuPercent),
        "utilization.memory" => GpuColumn::Value(Metric::UtilizationMemoryPercent),
        "temperature.gpu" => GpuColumn::Value(Metric::TemperatureC),
        "power.draw" | "power.draw.instant" | "power.draw.average" => {
            GpuColumn::Value(Metric::PowerMw)
        }
        other => GpuColumn::Ignored(other.to_owned()),
    }
}

/// A column of a `--query-compute-apps` log.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AppColumn {
    Timestamp,
    GpuName,
    GpuBusId,
    GpuUuid,
    Pid,
    ProcessName,
    UsedMemory,
    Ignored(String),
}

fn app_column(name: &str) -> AppColumn {
    match name {
        "timestamp" => AppColumn::Timestamp,
        "gpu_name" => AppColumn::GpuName,
        "gpu_bus_id" => AppColumn::GpuBusId,
        "gpu_uuid" => AppColumn::GpuUuid,
        "pid" => AppColumn::Pid,
        "process_name" | "name" => AppColumn::ProcessName,
        "used_gpu_memory" | "used_memory" => AppColumn::UsedMemory,
        other => AppColumn::Ignored(other.to_owned()),
    }
}

/// `memory.used [MiB]` → `memory.used`.
fn column_name(header: &str) -> String {
    header
        .split_once(" [")
        .map_or(header, |(name, _)| name)
        .trim()
        .to_ascii_lowercase()
}

/// Whether a line is a data row rather than a header (it starts with a timestamp or a
/// number).
pub(crate) fn looks_like_data(line: &str) -> bool {
    let first = line.split(',').next().unwrap_or("").trim();
    first.starts_with(|c: char| c.is_ascii_digit()) || first.starts_with("GPU-")
}

/// The header's column names, and the line where data starts (0-based).
fn header(
    lines: &[(usize, &str)],
    options: &ImportOptions,
    rows: &Rows<'_>,
) -> Result<(Vec<String>, usize), ImportError> {
    let Some(&(line_no, first)) = lines.first() else {
        return Ok((Vec::new(), 0));
    };
    if looks_like_data(first) {
        let Some(columns) = &options.columns else {
            return Err(rows.fatal(
                line_no,
                "no header line (written with 'noheader'); pass the column list with --columns",
            ));
        };
        return Ok((columns.iter().map(|c| column_name(c)).collect(), 0));
    }
    Ok((first.split(',').map(column_name).collect(), 1))
}

/// Non-empty lines with 1-based numbers; header lines repeated later (nvidia-smi restarted
/// into the same file) are skipped.
fn lines(text: &str) -> Vec<(usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            (
                i + 1,
                l.trim_start_matches('\u{feff}').trim_end_matches('\r'),
            )
        })
        .filter(|(_, l)| !l.trim().is_empty())
        .collect()
}

/// A value: `[N/A]`, `[Not Supported]`… are missing with a reason; else a number with an
/// optional unit.
fn value(field: &str, metric: Metric) -> Result<Observed, String> {
    let field = field.trim();
    if let Some(reason) = missing_reason(field) {
        return Ok(Observed::Missing(reason));
    }
    let number = field.split_whitespace().next().unwrap_or("");
    let x: f64 = number
        .parse()
        .map_err(|_| format!("'{}' is not a number", truncate(field, 30)))?;
    if !x.is_finite() || x < 0.0 {
        return Err(format!("'{field}' is not a usable value"));
    }
    let scaled = match metric {
        Metric::UsedBytes
        | Metric::ReservedBytes
        | Metric::FreeBytes
        | Metric::TotalBytes
        | Metric::ProcessUsedBytes => x * MIB as f64,
        Metric::PowerMw => x * 1000.0,
        _ => x,
    };
    // Finite and non-negative, checked above; nvidia-smi's values are far below 2^53.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(Observed::Value(scaled.round() as u64))
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
        other => other.to_ascii_lowercase(),
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
            truncate(field, 40)
        )
    })?;
    dt.to_zoned_datetime(tz.clone())
        .map(|z| z.timestamp().as_millisecond())
        .map_err(|e| format!("'{field}' is not a time in the given zone: {e}"))
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
        if !rows.ignored.contains(&name) {
            rows.ignored.push(name);
        }
    }
}

/// Parses a `--query-gpu` log into ticks (one per timestamp).
///
/// # Errors
/// A missing timestamp column or header; with `strict`, the first bad row.
pub(crate) fn parse_gpu(
    text: &str,
    options: &ImportOptions,
    rows: &mut Rows<'_>,
) -> Result<Vec<TickSample>, ImportError> {
    let lines = lines(text);
    let (names, start) = header(&lines, options, rows)?;
    let columns: Vec<GpuColumn> = names.iter().map(|n| gpu_column(n)).collect();
    note_ignored(
        rows,
        columns.iter().filter_map(|c| match c {
            GpuColumn::Ignored(n) => Some(n.clone()),
            _ => None,
        }),
    );
    let header_line = lines.first().map_or(1, |l| l.0);
    if !columns.contains(&GpuColumn::Timestamp) {
        return Err(rows.fatal(
            header_line,
            "no 'timestamp' column; add timestamp to --query-gpu",
        ));
    }
    let header_text = (start == 1).then(|| lines[0].1);
    let mut ticks: Vec<TickSample> = Vec::new();
    let mut last_stamp = String::new();
    for &(line_no, line) in &lines[start..] {
        if Some(line) == header_text {
            continue;
        }
        rows.read += 1;
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
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
        for (column, field) in columns.iter().zip(&fields) {
            match column {
                GpuColumn::Timestamp => match timestamp(field, &options.tz) {
                    Ok(t) => at = Some(t),
                    Err(e) => error = Some(e),
                },
                GpuColumn::Index => match field.parse::<u32>() {
                    Ok(i) => index = Some(i),
                    Err(_) => error = Some(format!("index '{field}' is not a number")),
                },
                GpuColumn::Uuid => uuid = Some((*field).to_owned()),
                GpuColumn::Name => name = Some((*field).to_owned()),
                GpuColumn::PciBusId => bus = Some((*field).to_owned()),
                GpuColumn::Value(metric) => match value(field, *metric) {
                    Ok(v) => metrics.push((*metric, v)),
                    Err(e) => error = Some(format!("{}: {e}", metric.name())),
                },
                GpuColumn::Ignored(_) => {}
            }
            if error.is_some() {
                break;
            }
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
        let stamp = fields[columns
            .iter()
            .position(|c| *c == GpuColumn::Timestamp)
            .unwrap_or(0)];
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
                        format!("time '{stamp}' is not after the previous row's"),
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

/// Parses a `--query-compute-apps` log into ticks (one per timestamp).
///
/// # Errors
/// As [`parse_gpu`]; also a log without `pid` or without a GPU identity column.
pub(crate) fn parse_apps(
    text: &str,
    options: &ImportOptions,
    rows: &mut Rows<'_>,
) -> Result<Vec<TickSample>, ImportError> {
    let lines = lines(text);
    let (names, start) = header(&lines, options, rows)?;
    let columns: Vec<AppColumn> = names.iter().map(|n| app_column(n)).collect();
    note_ignored(
        rows,
        columns.iter().filter_map(|c| match c {
            AppColumn::Ignored(n) => Some(n.clone()),
            _ => None,
        }),
    );
    let header_line = lines.first().map_or(1, |l| l.0);
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
    if !columns.contains(&AppColumn::GpuUuid) && !columns.contains(&AppColumn::GpuBusId) {
        return Err(rows.fatal(
            header_line,
            "no 'gpu_uuid' or 'gpu_bus_id' column, so rows cannot be put on a GPU; add gpu_uuid",
        ));
    }
    let header_text = (start == 1).then(|| lines[0].1);
    let mut ticks: Vec<TickSample> = Vec::new();
    let mut last_stamp = String::new();
    // Every GPU seen so far gets an (maybe empty) process list at each timestamp, so a
    // process that leaves is seen to leave.
    let mut gpus: BTreeMap<String, DeviceMeta> = BTreeMap::new();
    for &(line_no, line) in &lines[start..] {
        if Some(line) == header_text {
            continue;
        }
        rows.read += 1;
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
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
        for (column, field) in columns.iter().zip(&fields) {
            match column {
                AppColumn::Timestamp => match timestamp(field, &options.tz) {
                    Ok(t) => at = Some(t),
                    Err(e) => error = Some(e),
                },
                AppColumn::GpuName => gpu_name = Some((*field).to_owned()),
                AppColumn::GpuBusId => bus = Some((*field).to_owned()),
                AppColumn::GpuUuid => uuid = Some((*field).to_owned()),
                AppColumn::Pid => match field.parse::<u32>() {
                    Ok(p) => pid = Some(p),
                    Err(_) => error = Some(format!("pid '{field}' is not a number")),
                },
                AppColumn::ProcessName => pname = Some((*field).to_owned()),
                AppColumn::UsedMemory => match value(field, Metric::ProcessUsedBytes) {
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
        if let Some(e) = error {
            rows.bad(line_no, e)?;
            continue;
        }
        let (Some(at), Some(pid)) = (at, pid) else {
            continue;
        };
        let meta = DeviceMeta {
            uuid: device_uuid(uuid.as_deref(), bus.as_deref(), None),
            index: None,
            name: gpu_name,
            pci_bus_id: bus,
            parent_uuid: None,
        };
        gpus.entry(meta.uuid.clone())
            .or_insert_with(|| meta.clone());
        let stamp = fields[columns
            .iter()
            .position(|c| *c == AppColumn::Timestamp)
            .unwrap_or(0)];
        if stamp != last_stamp || ticks.is_empty() {
            if ticks.last().is_some_and(|t| at <= t.at_unix_ms) {
                rows.bad(
                    line_no,
                    format!("time '{stamp}' is not after the previous row's"),
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
    /// Writing the output failed.
    #[error("cannot write the export: {0}")]
    Write(#[from] std::io::Error),
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
    let cols: Vec<GpuColumn> = names.iter().map(|n| gpu_column(n)).collect();
    if let Some(GpuColumn::Ignored(n)) = cols.iter().find(|c| matches!(c, GpuColumn::Ignored(_))) {
        return Err(ExportError::Column(n.clone()));
    }
    if style.header {
        let header: Vec<String> = names.iter().map(|n| header_name(n)).collect();
        writeln!(out, "{}", header.join(", "))?;
    }
    let devices: Vec<_> = store
        .devices()?
        .into_iter()
        .filter(|d| d.meta.parent_uuid.is_none())
        .collect();
    let gaps = GapIndex::load(store, range)?;
    let mut written = 0;
    let mut failure: Option<std::io::Error> = None;
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
                    GpuColumn::Value(m) => {
                        match value_of(*m).and_then(crate::Entry::min_max_last) {
                            Some((_, _, last)) => format_value(*m, last, style.units),
                            None => missing_text(gaps.reason(&d.meta.uuid, *m, frame.t_ms)).into(),
                        }
                    }
                    GpuColumn::Ignored(_) => String::new(),
                })
                .collect();
            if let Err(e) = writeln!(out, "{}", fields.join(", ")) {
                failure = Some(e);
                return;
            }
            written += 1;
        }
    })?;
    if let Some(e) = failure {
        return Err(e.into());
    }
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
    let cols: Vec<AppColumn> = names.iter().map(|n| app_column(n)).collect();
    if let Some(AppColumn::Ignored(n)) = cols.iter().find(|c| matches!(c, AppColumn::Ignored(_))) {
        return Err(ExportError::Column(n.clone()));
    }
    if style.header {
        let header: Vec<String> = names.iter().map(|n| header_name(n)).collect();
        writeln!(out, "{}", header.join(", "))?;
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
    let mut failure: Option<std::io::Error> = None;
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
                    AppColumn::UsedMemory => used.map_or_else(
                        || "[N/A]".into(),
                        |v| format_value(Metric::ProcessUsedBytes, v, style.units),
                    ),
                    AppColumn::Ignored(_) => String::new(),
                })
                .collect();
            if let Err(e) = writeln!(out, "{}", fields.join(", ")) {
                failure = Some(e);
                return;
            }
            written += 1;
        }
    })?;
    if let Some(e) = failure {
        return Err(e.into());
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_units_and_missing() {
        assert_eq!(
            value("1234 MiB", Metric::UsedBytes),
            Ok(Observed::Value(1234 * MIB))
        );
        assert_eq!(
            value("1234", Metric::UsedBytes),
            Ok(Observed::Value(1234 * MIB))
        );
        assert_eq!(
            value("71.48 W", Metric::PowerMw),
            Ok(Observed::Value(71_480))
        );
        assert_eq!(
            value("45 %", Metric::UtilizationGpuPercent),
            Ok(Observed::Value(45))
        );
        assert_eq!(
            value("[N/A]", Metric::PowerMw),
            Ok(Observed::Missing("N/A".into()))
        );
        assert_eq!(
            value("[Not Supported]", Metric::PowerMw),
            Ok(Observed::Missing("not supported".into()))
        );
        assert!(
            value("lots", Metric::UsedBytes)
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
