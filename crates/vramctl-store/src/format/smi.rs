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
//! Rows are read as CSV a record at a time (`input.rs`, bounded): nvidia-smi's own unquoted
//! rows, and quoted fields — the ones `vramctl export` writes for a command line holding a
//! comma, a quote or a newline, and `, "x"` as other tools write them after nvidia-smi's
//! `, ` (spaces before the opening quote are allowed). nvidia-smi itself does not quote, so
//! in its own logs a process name with a comma still cannot be told apart (rejected as a
//! row with too many fields).
//!
//! A value's own unit wins over the column's (`quantity.rs`), and every row passes the
//! same sanity rules as live readings (`vramctl_core::sanity`): used above total, a figure
//! no GPU can have, PID 0 — such a row is a bad row with its file:line.
//!
//! An apps log without `gpu_uuid` or `gpu_bus_id` (`--query-compute-apps=timestamp,pid,
//! used_gpu_memory`, a common line) is put on one GPU: `--gpu`, else the only GPU of the
//! other files or of the history, else a single unnamed GPU ([`super::UNNAMED_GPU`]); with
//! several GPUs known and no `--gpu` it is refused, naming them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;

use jiff::tz::TimeZone;

use super::input::{Input, MAX_COLUMNS, Record};
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

impl GpuColumn {
    fn ignored_name(&self) -> Option<&String> {
        match self {
            Self::Ignored(name) => Some(name),
            _ => None,
        }
    }
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
    super::header_work(1);
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

impl AppColumn {
    fn ignored_name(&self) -> Option<&String> {
        match self {
            Self::Ignored(name) => Some(name),
            _ => None,
        }
    }
}

fn app_column(header: &str) -> Result<AppColumn, String> {
    super::header_work(1);
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

/// The header's column names (with their units), and the first data record when the file
/// has no header line (`noheader`: the names come from `--columns`).
fn header(
    input: &mut Input,
    options: &ImportOptions,
    rows: &Rows<'_>,
) -> Result<(Vec<String>, usize, Option<Record>), ImportError> {
    let Some(first) = input.next_record()? else {
        return Ok((Vec::new(), 1, None));
    };
    if looks_like_data(first.fields.first().map_or("", String::as_str)) {
        let Some(columns) = &options.columns else {
            return Err(rows.fatal(
                first.line,
                "no header line (written with 'noheader'); pass the column list with --columns",
            ));
        };
        return Ok((columns.clone(), first.line, Some(first)));
    }
    if first.fields.len() > MAX_COLUMNS {
        return Err(rows.limit(
            first.line,
            format!("the header has more than {MAX_COLUMNS} columns, the most vramctl reads"),
        ));
    }
    Ok((first.fields, first.line, None))
}

/// The next data record: a pending first one, else the next of the file that is not the
/// header repeated; a record whose quoting is broken is a bad row.
fn next_data(
    input: &mut Input,
    held: &mut Option<Record>,
    header: Option<&[String]>,
    rows: &mut Rows<'_>,
) -> Result<Option<Record>, ImportError> {
    loop {
        let record = match held.take() {
            Some(r) => r,
            None => match input.next_record()? {
                Some(r) => r,
                None => return Ok(None),
            },
        };
        if header.is_some_and(|h| h == record.fields.as_slice()) {
            continue;
        }
        rows.read += 1;
        if let Some(problem) = &record.problem {
            rows.bad(record.line, problem.clone())?;
            continue;
        }
        return Ok(Some(record));
    }
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
        rows.ignore(shown(&name, 60));
    }
}

/// A log's header with its columns typed: what both nvidia-smi readers start from.
struct TypedHeader<C> {
    columns: Vec<C>,
    /// The header's names, to pass over the header where the file repeats it; `None` for
    /// a `noheader` file.
    header: Option<Vec<String>>,
    /// A `noheader` file's first data record.
    held: Option<Record>,
    /// Where the header is (or would be), for errors about it.
    line: usize,
    /// Whether the file has anything but an empty header.
    has_rows: bool,
    /// The timestamp column's position.
    stamp_at: usize,
}

/// Reads the header and types its columns with `column`: an unknown column is an error,
/// the ignored ones are noted, a log with rows and no `timestamp` column is an error
/// naming the query flag (`--query-gpu`, `--query-compute-apps`) that adds it.
fn typed_header<C: PartialEq>(
    input: &mut Input,
    options: &ImportOptions,
    rows: &mut Rows<'_>,
    column: fn(&str) -> Result<C, String>,
    ignored_name: fn(&C) -> Option<&String>,
    timestamp: &C,
    query_flag: &str,
) -> Result<TypedHeader<C>, ImportError> {
    let (names, line, held) = header(input, options, rows)?;
    let columns: Vec<C> = names
        .iter()
        .map(|n| column(n))
        .collect::<Result<_, _>>()
        .map_err(|e| rows.fatal(line, e))?;
    note_ignored(rows, columns.iter().filter_map(ignored_name).cloned());
    let has_rows = held.is_some() || !names.is_empty();
    let stamp_at = columns.iter().position(|c| c == timestamp);
    if has_rows && stamp_at.is_none() {
        return Err(rows.fatal(
            line,
            format!("no 'timestamp' column; add timestamp to {query_flag}"),
        ));
    }
    Ok(TypedHeader {
        header: held.is_none().then_some(names),
        columns,
        held,
        line,
        has_rows,
        stamp_at: stamp_at.unwrap_or(0),
    })
}

/// A `--query-gpu` log read as ticks (one per timestamp), a row at a time.
pub(crate) struct GpuReader {
    input: Input,
    columns: Vec<GpuColumn>,
    header: Option<Vec<String>>,
    held: Option<Record>,
    stamp_at: usize,
    tz: TimeZone,
    /// The tick being filled (rows of one loop share its timestamp).
    pending: Option<TickSample>,
    last_stamp: String,
}

impl GpuReader {
    /// Reads the header.
    ///
    /// # Errors
    /// A missing timestamp column or header, a header unit that is not the column's.
    pub fn open(
        mut input: Input,
        options: &ImportOptions,
        rows: &mut Rows<'_>,
    ) -> Result<Self, ImportError> {
        let typed = typed_header(
            &mut input,
            options,
            rows,
            gpu_column,
            GpuColumn::ignored_name,
            &GpuColumn::Timestamp,
            "--query-gpu",
        )?;
        Ok(Self {
            input,
            columns: typed.columns,
            header: typed.header,
            held: typed.held,
            stamp_at: typed.stamp_at,
            tz: options.tz.clone(),
            pending: None,
            last_stamp: String::new(),
        })
    }

    /// Reads the log only for its GPUs and their totals (what an apps log without a GPU
    /// column, and the check of its figures, need before it is read): no times, no ticks.
    /// A row whose memory figures cannot be true teaches nothing, as it is a bad row.
    ///
    /// # Errors
    /// A line too long, a read error.
    pub fn learn(
        mut self,
        rows: &mut Rows<'_>,
        companion: &mut Companion,
    ) -> Result<(), ImportError> {
        while let Some(record) = next_data(
            &mut self.input,
            &mut self.held,
            self.header.as_deref(),
            rows,
        )? {
            if record.fields.len() != self.columns.len() {
                continue;
            }
            let (mut uuid, mut bus, mut index, mut name) = (None, None, None, None);
            let mut total = None;
            for (column, field) in self.columns.iter().zip(&record.fields) {
                match column {
                    GpuColumn::Index => index = field.parse::<u32>().ok(),
                    GpuColumn::Uuid => uuid = Some(field.as_str()),
                    GpuColumn::Name => name = Some(field.as_str()),
                    GpuColumn::PciBusId => bus = Some(field.as_str()),
                    GpuColumn::Value(Metric::TotalBytes, unit) => {
                        total = match value(field, *unit) {
                            Ok(Observed::Value(v)) => Some(v),
                            _ => None,
                        };
                    }
                    _ => {}
                }
            }
            // A total no GPU can have teaches nothing (its row is a bad row).
            let total = total
                .filter(|&t| memory_problem(&[(Metric::TotalBytes, Observed::Value(t))]).is_none());
            let uuid = device_uuid(uuid, bus, index);
            if total.is_none() && companion.knows(&uuid) {
                continue;
            }
            let device = DeviceMeta {
                uuid,
                index,
                name: name.map(str::to_owned),
                pci_bus_id: bus.map(str::to_owned),
                parent_uuid: None,
            };
            companion.learn_device(&device, total);
        }
        Ok(())
    }

    /// The next tick; `None` at the end.
    ///
    /// # Errors
    /// With `strict`, the first bad row; a line too long.
    pub fn next_tick(&mut self, rows: &mut Rows<'_>) -> Result<Option<TickSample>, ImportError> {
        loop {
            let Some(record) = next_data(
                &mut self.input,
                &mut self.held,
                self.header.as_deref(),
                rows,
            )?
            else {
                return Ok(self.pending.take());
            };
            if let Some(done) = self.row(&record, rows)? {
                return Ok(Some(done));
            }
        }
    }

    /// Takes one row in; returns the tick it completed, if it started a new one.
    fn row(
        &mut self,
        record: &Record,
        rows: &mut Rows<'_>,
    ) -> Result<Option<TickSample>, ImportError> {
        let (line_no, fields) = (record.line, &record.fields);
        let columns = &self.columns;
        if fields.len() != columns.len() {
            rows.bad(
                line_no,
                format!(
                    "{} fields where the header has {} (truncated or mixed file?)",
                    fields.len(),
                    columns.len()
                ),
            )?;
            return Ok(None);
        }
        let mut at = None;
        let (mut uuid, mut bus, mut index, mut name) = (None, None, None, None);
        let mut metrics = Vec::new();
        let mut error = None;
        for (column, field) in columns.iter().zip(fields) {
            match column {
                GpuColumn::Timestamp => match timestamp(field, &self.tz) {
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
            return Ok(None);
        }
        let Some(at) = at else { return Ok(None) };
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
        let stamp = fields[self.stamp_at].as_str();
        let mut done = None;
        match self.pending.as_mut() {
            Some(tick)
                if stamp == self.last_stamp
                    && !tick
                        .devices
                        .iter()
                        .any(|d| d.device.uuid == device.device.uuid) =>
            {
                tick.devices.push(device);
            }
            pending => {
                if pending.as_ref().is_some_and(|t| at <= t.at_unix_ms) {
                    rows.bad(
                        line_no,
                        format!(
                            "time '{}' is not after the previous row's",
                            shown(stamp, 40)
                        ),
                    )?;
                    return Ok(None);
                }
                done = self.pending.replace(TickSample {
                    at_unix_ms: at,
                    devices: vec![device],
                    ..TickSample::default()
                });
            }
        }
        stamp.clone_into(&mut self.last_stamp);
        Ok(done)
    }
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

/// A `--query-compute-apps` log read as ticks (one per timestamp), a row at a time.
pub(crate) struct AppsReader {
    input: Input,
    columns: Vec<AppColumn>,
    header: Option<Vec<String>>,
    held: Option<Record>,
    stamp_at: usize,
    tz: TimeZone,
    unnamed_gpu: Option<DeviceMeta>,
    /// The totals of the GPUs, from the other files and the history.
    totals: HashMap<String, u64>,
    pending: Option<TickSample>,
    last_stamp: String,
    /// Every GPU seen so far, in the order seen: each gets an (maybe empty) process list
    /// at each later timestamp, so a process that leaves is seen to leave.
    known: Vec<DeviceMeta>,
    known_uuids: HashSet<String>,
    /// The last intervals between loops (at most [`INTERVALS_KEPT`]), for the log's period.
    intervals: VecDeque<i64>,
    /// Ticks ready to hand out before reading on.
    ready: VecDeque<TickSample>,
    /// The last tick handed out is the one [`AppsReader::next_tick`] adds after the log's
    /// last rows (see there): the caller keeps it only if other files go on past it.
    trailing: bool,
    trailing_tick: Option<TickSample>,
    finished: bool,
}

/// How many recent loop intervals an apps log's period is taken from (their median).
const INTERVALS_KEPT: usize = 15;

impl AppsReader {
    /// Reads the header. `companion`: the GPUs (and their totals) of the other files and of
    /// the history.
    ///
    /// # Errors
    /// As [`GpuReader::open`]; also a log without `pid`, and one without a GPU column
    /// whose rows cannot be put on one GPU ([`ImportError::Gpu`]).
    pub fn open(
        mut input: Input,
        options: &ImportOptions,
        rows: &mut Rows<'_>,
        companion: &Companion,
    ) -> Result<Self, ImportError> {
        let typed = typed_header(
            &mut input,
            options,
            rows,
            app_column,
            AppColumn::ignored_name,
            &AppColumn::Timestamp,
            "--query-compute-apps",
        )?;
        let (columns, has_rows, header_line) = (typed.columns, typed.has_rows, typed.line);
        if has_rows && !columns.contains(&AppColumn::Pid) {
            return Err(rows.fatal(
                header_line,
                "no 'pid' column; add pid to --query-compute-apps",
            ));
        }
        let unnamed_gpu = if !has_rows
            || columns.contains(&AppColumn::GpuUuid)
            || columns.contains(&AppColumn::GpuBusId)
        {
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
        Ok(Self {
            input,
            columns,
            header: typed.header,
            held: typed.held,
            stamp_at: typed.stamp_at,
            tz: options.tz.clone(),
            unnamed_gpu,
            totals: companion.totals.clone(),
            pending: None,
            last_stamp: String::new(),
            known: Vec::new(),
            known_uuids: HashSet::new(),
            intervals: VecDeque::new(),
            ready: VecDeque::new(),
            trailing: false,
            trailing_tick: None,
            finished: false,
        })
    }

    /// The next tick; `None` at the end.
    ///
    /// nvidia-smi writes nothing for a loop that finds no process, so where the rows stop
    /// for longer than one and a half of the log's period (the median of its last loop
    /// intervals), the loop after the last rows found none: a tick with every GPU's list
    /// empty is handed out at that time. This is what lets a process be seen to end when
    /// it was the last one (without it, it stayed on the GPU through every later sample of
    /// the other files — "full in 2 h" for a process long gone —, and an export of a
    /// history, which can only leave such loops out, did not import back the same). After
    /// the log's last rows the same tick is handed out marked as trailing
    /// ([`AppsReader::is_trailing`]): it holds only if the other files go on past it.
    ///
    /// # Errors
    /// With `strict`, the first bad row; a line too long.
    pub fn next_tick(&mut self, rows: &mut Rows<'_>) -> Result<Option<TickSample>, ImportError> {
        self.trailing = false;
        loop {
            if let Some(tick) = self.ready.pop_front() {
                return Ok(Some(tick));
            }
            if self.finished {
                let last = self.trailing_tick.take();
                self.trailing = last.is_some();
                return Ok(last);
            }
            let Some(record) = next_data(
                &mut self.input,
                &mut self.held,
                self.header.as_deref(),
                rows,
            )?
            else {
                self.finished = true;
                if let Some(last) = self.pending.take() {
                    let at = last.at_unix_ms;
                    let tick = self.complete(last);
                    self.ready.push_back(tick);
                    self.trailing_tick = self.period().map(|p| self.empty_tick(at + p));
                }
                continue;
            };
            if let Some(done) = self.row(&record, rows)? {
                let done_at = done.at_unix_ms;
                let tick = self.complete(done);
                self.ready.push_back(tick);
                let next_at = self.pending.as_ref().map(|t| t.at_unix_ms);
                if let (Some(next_at), Some(period)) = (next_at, self.period()) {
                    if (next_at - done_at) * 2 > period * 3 {
                        let empty = self.empty_tick(done_at + period);
                        self.ready.push_back(empty);
                    }
                }
                if let Some(next_at) = next_at {
                    if self.intervals.len() == INTERVALS_KEPT {
                        self.intervals.pop_front();
                    }
                    self.intervals.push_back(next_at - done_at);
                }
            }
        }
    }

    /// Whether the tick last handed out is the one added after the log's last rows.
    pub fn is_trailing(&self) -> bool {
        self.trailing
    }

    /// The log's period: the median of its last loop intervals (`None` before three).
    fn period(&self) -> Option<i64> {
        if self.intervals.len() < 3 {
            return None;
        }
        let mut sorted: Vec<i64> = self.intervals.iter().copied().collect();
        sorted.sort_unstable();
        sorted.get(sorted.len() / 2).copied().filter(|&p| p > 0)
    }

    /// A loop that found no process: every GPU seen so far with an empty list.
    fn empty_tick(&self, at: i64) -> TickSample {
        TickSample {
            at_unix_ms: at,
            devices: self
                .known
                .iter()
                .map(|meta| DeviceSample {
                    device: meta.clone(),
                    state: DeviceSampleState::Read {
                        metrics: Vec::new(),
                        processes: ProcessList::Observed(Vec::new()),
                    },
                })
                .collect(),
            ..TickSample::default()
        }
    }

    /// A finished tick: GPUs known by then but without rows at its time had no processes.
    fn complete(&mut self, mut tick: TickSample) -> TickSample {
        for d in &tick.devices {
            if self.known_uuids.insert(d.device.uuid.clone()) {
                self.known.push(d.device.clone());
            }
        }
        if tick.devices.len() < self.known.len() {
            let present: HashSet<&str> = tick
                .devices
                .iter()
                .map(|d| d.device.uuid.as_str())
                .collect();
            let missing: Vec<DeviceSample> = self
                .known
                .iter()
                .filter(|meta| !present.contains(meta.uuid.as_str()))
                .map(|meta| DeviceSample {
                    device: meta.clone(),
                    state: DeviceSampleState::Read {
                        metrics: Vec::new(),
                        processes: ProcessList::Observed(Vec::new()),
                    },
                })
                .collect();
            tick.devices.extend(missing);
        }
        tick
    }

    /// Takes one row in; returns the tick it completed, if it started a new one.
    fn row(
        &mut self,
        record: &Record,
        rows: &mut Rows<'_>,
    ) -> Result<Option<TickSample>, ImportError> {
        let (line_no, fields) = (record.line, &record.fields);
        let columns = &self.columns;
        if fields.len() != columns.len() {
            rows.bad(
                line_no,
                format!(
                    "{} fields where the header has {} (truncated, or a comma in a process name?)",
                    fields.len(),
                    columns.len()
                ),
            )?;
            return Ok(None);
        }
        let mut at = None;
        let (mut uuid, mut bus, mut gpu_name, mut pid, mut pname, mut used) =
            (None, None, None, None, None, None);
        let mut error = None;
        for (column, field) in columns.iter().zip(fields) {
            match column {
                AppColumn::Timestamp => match timestamp(field, &self.tz) {
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
        let meta = match &self.unnamed_gpu {
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
            let total = self.totals.get(&meta.uuid).copied();
            error =
                vramctl_core::sanity::process_problem(pid, used.flatten(), total, IMPORT_LIMITS)
                    .map(|why| format!("impossible process entry: {why}"));
        }
        if let Some(e) = error {
            rows.bad(line_no, e)?;
            return Ok(None);
        }
        let (Some(at), Some(pid)) = (at, pid) else {
            return Ok(None);
        };
        let stamp = fields[self.stamp_at].as_str();
        let mut done = None;
        if stamp != self.last_stamp || self.pending.is_none() {
            if self.pending.as_ref().is_some_and(|t| at <= t.at_unix_ms) {
                rows.bad(
                    line_no,
                    format!(
                        "time '{}' is not after the previous row's",
                        shown(stamp, 40)
                    ),
                )?;
                return Ok(None);
            }
            done = self.pending.replace(TickSample {
                at_unix_ms: at,
                ..TickSample::default()
            });
            stamp.clone_into(&mut self.last_stamp);
        }
        let Some(tick) = self.pending.as_mut() else {
            return Ok(done);
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
        Ok(done)
    }
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
