//! GPU-Z's sensor log ("Log to file" on the Sensors tab).
//!
//! A comma-separated text file in the Windows code page (`°C` is one byte), lines ending in
//! CRLF, fields padded with spaces and a trailing comma:
//!
//! ```text
//!         Date        , GPU Clock [MHz] , Memory Used (Dedicated) [MB] , GPU Load [%] , ...
//! 2026-11-29 20:31:31 ,           1980.0   ,                  30720   ,          97   , ...
//! ```
//!
//! One GPU per file (the card chosen in GPU-Z), with no UUID: the device is named
//! `GPUZ-<file name>`. GPU-Z's `MB` are MiB (2^20 bytes, as Windows counts). Times are local
//! (see [`super::ImportOptions::tz`]), whole seconds (some versions add milliseconds).
//!
//! # Columns across GPU-Z versions and vendors
//!
//! GPU-Z has renamed its sensors over the years and names them per vendor. The table
//! below was drawn from three real logs (`testdata/gpuz/README.md`: an NVIDIA card logged
//! 2016–17 by an older GPU-Z, a Radeon RX 580 in 2017, a Radeon RX 5700 XT in 2020); four
//! more logs (2021–2024) were held out to check it (the README says what they do and do
//! not check).
//!
//! | recorded as | GPU-Z columns |
//! | --- | --- |
//! | memory used | `Memory Used`, `Memory Used (Dedicated)`, `Memory Usage`, `Memory Usage (Dedicated)` |
//! | GPU load | `GPU Load` |
//! | memory-controller load | `Memory Controller Load` |
//! | temperature | `GPU Temperature` |
//! | power | `Board Power Draw`, else `GPU Power`, else `GPU Chip Power Draw` (AMD reports only the chip's) |
//!
//! `Memory Used (Dynamic)` / `Memory Usage (Dynamic)` is system memory the GPU borrows
//! (AMD, and NVIDIA under older GPU-Z), not VRAM: listed as ignored, like the clocks,
//! voltages, fans and the CPU's sensors.
//!
//! # Logging sessions
//!
//! GPU-Z appends to the same file each time logging starts, writing the header line again.
//! A repeated header is a new session: the time between the last row before it and the
//! first after is a gap (`GPU-Z logging stopped`), not a bad row. GPU-Z logs whole seconds
//! at sub-second refresh rates, so two rows can share a second: the first is kept, the
//! others are counted in a note. A header padded with NUL bytes (GPU-Z stopped while
//! writing, the first row after them on the same line) is read as the lines it holds.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;

use jiff::tz::TimeZone;

use super::input::{Input, MAX_COLUMNS};
use super::quantity::ColumnUnit;
use super::{ImportError, ImportOptions, Rows, shown};
use crate::model::{
    DeviceMeta, DeviceSample, DeviceSampleState, Metric, Observed, ProcessList, TickSample,
};

/// GPU-Z's `[MB]`: MiB.
const MIB: f64 = 1_048_576.0;

/// Reason of the gap between two logging sessions in one file.
pub const SESSION_GAP_REASON: &str = "not logged (GPU-Z logging stopped and started again)";

/// What a column holds: a metric, with a rank where several columns may give it (the
/// lowest present wins), or a sensor known and deliberately not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Column {
    Metric(Metric, u8),
    Ignored,
}

fn column(name: &str) -> Column {
    super::header_work(1);
    let lower = name.to_ascii_lowercase();
    let base = lower
        .split_once(" [")
        .map_or(lower.as_str(), |(n, _)| n)
        .trim();
    let (metric, rank) = match base {
        "memory used" | "memory used (dedicated)" | "memory usage" | "memory usage (dedicated)" => {
            (Metric::UsedBytes, 0)
        }
        "gpu load" => (Metric::UtilizationGpuPercent, 0),
        "memory controller load" => (Metric::UtilizationMemoryPercent, 0),
        "gpu temperature" => (Metric::TemperatureC, 0),
        "board power draw" => (Metric::PowerMw, 0),
        "gpu power" => (Metric::PowerMw, 1),
        "gpu chip power draw" => (Metric::PowerMw, 2),
        _ => return Column::Ignored,
    };
    Column::Metric(metric, rank)
}

/// A GPU-Z sensor log read as ticks, a line at a time.
pub(crate) struct GpuzReader {
    input: Input,
    path: PathBuf,
    tz: TimeZone,
    /// The pieces of the current line between NUL runs, with its number.
    pieces: VecDeque<(usize, String)>,
    header_key: Vec<String>,
    columns: Vec<Option<Metric>>,
    units: Vec<Option<ColumnUnit>>,
    device: DeviceMeta,
    /// Ticks ready to hand out (a session's gap before the row that follows it).
    ready: VecDeque<TickSample>,
    last_ms: Option<i64>,
    sessions: usize,
    same_second: usize,
    new_session: bool,
    finished: bool,
}

impl GpuzReader {
    /// Reads the header.
    ///
    /// # Errors
    /// A file without a `Date` column.
    pub fn open(
        input: Input,
        options: &ImportOptions,
        rows: &mut Rows<'_>,
    ) -> Result<Self, ImportError> {
        let path = input.path().to_path_buf();
        let mut reader = Self {
            input,
            path,
            tz: options.tz.clone(),
            pieces: VecDeque::new(),
            header_key: Vec::new(),
            columns: Vec::new(),
            units: Vec::new(),
            device: DeviceMeta::default(),
            ready: VecDeque::new(),
            last_ms: None,
            sessions: 1,
            same_second: 0,
            new_session: false,
            finished: false,
        };
        let Some((header_line, header)) = reader.next_piece()? else {
            reader.finished = true;
            return Ok(reader);
        };
        let names: Vec<String> = fields(&header).into_iter().map(str::to_owned).collect();
        if names.first().map(|n| n.eq_ignore_ascii_case("date")) != Some(true) {
            return Err(rows.fatal(
                header_line,
                "the first column is not 'Date'; is this a GPU-Z sensor log?",
            ));
        }
        if names.len() > MAX_COLUMNS {
            return Err(rows.limit(
                header_line,
                format!("the header has more than {MAX_COLUMNS} columns, the most vramctl reads"),
            ));
        }
        // The best-ranked column of each metric (power: board, else GPU, else chip), found
        // in one pass so a wide header costs its width, not its square.
        let kinds: Vec<Column> = names.iter().skip(1).map(|n| column(n)).collect();
        let mut best: HashMap<Metric, u8> = HashMap::new();
        for kind in &kinds {
            if let Column::Metric(m, rank) = *kind {
                let b = best.entry(m).or_insert(rank);
                *b = (*b).min(rank);
            }
        }
        reader.columns = kinds
            .iter()
            .map(|kind| match *kind {
                Column::Metric(m, rank) if best.get(&m) == Some(&rank) => Some(m),
                _ => None,
            })
            .collect();
        for (name, col) in names.iter().skip(1).zip(&reader.columns) {
            if col.is_none() {
                rows.ignore(name.clone());
            }
        }
        reader.units = reader
            .columns
            .iter()
            .map(|c| {
                c.and_then(|m| match m {
                    Metric::UsedBytes => ColumnUnit::with_factor(m, MIB),
                    Metric::PowerMw => ColumnUnit::with_factor(m, 1000.0),
                    _ => ColumnUnit::with_factor(m, 1.0),
                })
            })
            .collect();
        reader.device = DeviceMeta {
            uuid: format!(
                "GPUZ-{}",
                reader
                    .path
                    .file_name()
                    .map_or_else(|| "log".into(), |f| f.to_string_lossy())
            ),
            ..DeviceMeta::default()
        };
        reader.header_key = names;
        Ok(reader)
    }

    /// The next piece of text that is not blank: a line, or a part of one between NUL runs
    /// (GPU-Z stopped while writing).
    fn next_piece(&mut self) -> Result<Option<(usize, String)>, ImportError> {
        loop {
            if let Some(piece) = self.pieces.pop_front() {
                return Ok(Some(piece));
            }
            let Some((line_no, line)) = self.input.next_line()? else {
                return Ok(None);
            };
            self.pieces.extend(
                line.split('\0')
                    .map(|piece| piece.trim_end_matches('\r'))
                    .filter(|piece| !piece.trim_matches([' ', '\t']).is_empty())
                    .map(|piece| (line_no, piece.to_owned())),
            );
        }
    }

    /// The next tick; `None` at the end (then the file's notes are added to `rows`).
    ///
    /// # Errors
    /// With `strict`, the first bad row; a line too long.
    pub fn next_tick(&mut self, rows: &mut Rows<'_>) -> Result<Option<TickSample>, ImportError> {
        loop {
            if let Some(tick) = self.ready.pop_front() {
                return Ok(Some(tick));
            }
            if self.finished {
                return Ok(None);
            }
            let Some((line_no, line)) = self.next_piece()? else {
                self.finished = true;
                self.notes(rows);
                return Ok(None);
            };
            self.line(line_no, &line, rows)?;
        }
    }

    fn notes(&self, rows: &mut Rows<'_>) {
        let path = &self.path;
        if self.sessions > 1 {
            rows.notes.push(format!(
                "'{}' holds {} GPU-Z logging sessions; the time between them is a gap",
                path.display(),
                self.sessions
            ));
        }
        if self.same_second > 0 {
            rows.notes.push(format!(
                "'{}': {} rows logged within the same second as the row before them \
                 were not kept (GPU-Z logs whole seconds)",
                path.display(),
                self.same_second
            ));
        }
    }

    fn line(&mut self, line_no: usize, line: &str, rows: &mut Rows<'_>) -> Result<(), ImportError> {
        let values = fields(line);
        if values.len() == self.header_key.len()
            && values
                .iter()
                .zip(&self.header_key)
                .all(|(v, h)| *v == h.as_str())
        {
            self.sessions += 1;
            self.new_session = true;
            return Ok(());
        }
        rows.read += 1;
        if values.len() != self.header_key.len() {
            rows.bad(
                line_no,
                format!(
                    "{} fields where the header has {} (truncated line?)",
                    values.len(),
                    self.header_key.len()
                ),
            )?;
            return Ok(());
        }
        let at = match jiff::civil::DateTime::strptime("%Y-%m-%d %H:%M:%S%.f", values[0])
            .ok()
            .and_then(|dt| dt.to_zoned_datetime(self.tz.clone()).ok())
        {
            Some(z) => z.timestamp().as_millisecond(),
            None => {
                rows.bad(
                    line_no,
                    format!(
                        "'{}' is not a time like 2026-11-29 20:31:31",
                        shown(values[0], 30)
                    ),
                )?;
                return Ok(());
            }
        };
        if let Some(last) = self.last_ms {
            if at <= last {
                if at / 1000 == last / 1000 && !self.new_session {
                    self.same_second += 1;
                    return Ok(());
                }
                rows.bad(
                    line_no,
                    format!(
                        "time '{}' is not after the previous row's",
                        shown(values[0], 30)
                    ),
                )?;
                return Ok(());
            }
        }
        let mut metrics = Vec::new();
        let mut error = None;
        for ((metric, unit), raw) in self.columns.iter().zip(&self.units).zip(&values[1..]) {
            let (Some(metric), Some(unit)) = (metric, unit) else {
                continue;
            };
            if raw.is_empty() || *raw == "-" {
                metrics.push((*metric, Observed::Missing("not reported".into())));
                continue;
            }
            match unit.read(raw) {
                Ok(v) => metrics.push((*metric, Observed::Value(v))),
                Err(e) => {
                    error = Some(format!("{}: {e}", metric.name()));
                    break;
                }
            }
        }
        let used = metrics.iter().find_map(|(m, v)| match (m, v) {
            (Metric::UsedBytes, Observed::Value(v)) => Some(*v),
            _ => None,
        });
        if let Some(why) = vramctl_core::sanity::memory_problem(None, used, &[]) {
            error = error.or(Some(format!("impossible memory: {why}")));
        }
        if let Some(e) = error {
            rows.bad(line_no, e)?;
            return Ok(());
        }
        if self.new_session {
            if let Some(last) = self.last_ms {
                if last + 1 < at {
                    self.ready.push_back(TickSample {
                        at_unix_ms: last + 1,
                        devices: vec![DeviceSample {
                            device: self.device.clone(),
                            state: DeviceSampleState::Unreadable(SESSION_GAP_REASON.into()),
                        }],
                        ..TickSample::default()
                    });
                }
            }
            self.new_session = false;
        }
        self.last_ms = Some(at);
        self.ready.push_back(TickSample {
            at_unix_ms: at,
            devices: vec![DeviceSample {
                device: self.device.clone(),
                state: DeviceSampleState::Read {
                    metrics,
                    processes: ProcessList::NotObserved,
                },
            }],
            ..TickSample::default()
        });
        Ok(())
    }
}

/// Fields of a line, trimmed, without the empty one after the trailing comma.
fn fields(line: &str) -> Vec<&str> {
    let mut out: Vec<&str> = line
        .split(',')
        .map(|f| f.trim_matches([' ', '\t']))
        .collect();
    if out.last() == Some(&"") {
        out.pop();
    }
    out
}
