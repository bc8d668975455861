//! Import and export formats.
//!
//! Import reads files as streams of ticks and appends them in time order (several files
//! are merged by time: an nvidia-smi `--query-gpu` log and a `--query-compute-apps` log of
//! the same run make one history), in one transaction. Inputs are bounded (`input.rs`:
//! regular files only, [`MAX_LINE_BYTES`] per line, [`MAX_COLUMNS`] per header), so memory
//! does not grow with the files. A row that cannot be read is reported by file and line
//! and skipped, or with `strict` ends the import and nothing is written — never dropped
//! silently.
//!
//! | format | read | written |
//! | --- | --- | --- |
//! | nvidia-smi `--query-gpu=… --format=csv[,noheader][,nounits]` | [`Format::SmiGpu`] | [`smi::export_gpu`] |
//! | nvidia-smi `--query-compute-apps=… --format=csv…` | [`Format::SmiApps`] | [`smi::export_apps`] |
//! | GPU-Z sensor log | [`Format::Gpuz`] | — |
//! | vramctl NDJSON (`vramctl export`) | [`Format::Ndjson`] | [`ndjson::export`] |
//! | `vramctl status --json --watch` | [`Format::StatusJson`] | — |
//!
//! Times without a zone (nvidia-smi's `2026/11/29 20:31:31.715`, GPU-Z's
//! `2026-11-29 20:31:31`) are local times of the machine that wrote them: the caller passes
//! that zone ([`ImportOptions::tz`], `--tz`), by default the importing machine's.

pub mod gpuz;
mod input;
pub mod ndjson;
mod quantity;
pub mod smi;

pub use input::{MAX_COLUMNS, MAX_LINE_BYTES};

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use jiff::tz::TimeZone;

use self::input::Input;
use crate::db::Store;
use crate::error::StoreError;
use crate::model::{
    DeviceMeta, DeviceSample, DeviceSampleState, Metric, Observed, ProcessList, TickSample,
};

/// A file format [`import_files`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `nvidia-smi --query-gpu=… --format=csv`.
    SmiGpu,
    /// `nvidia-smi --query-compute-apps=… --format=csv`.
    SmiApps,
    /// GPU-Z's "Log to file" sensor log.
    Gpuz,
    /// `vramctl export` NDJSON.
    Ndjson,
    /// `vramctl status --json --watch` NDJSON (schema 1).
    StatusJson,
}

impl Format {
    /// Name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::SmiGpu => "smi-gpu",
            Self::SmiApps => "smi-apps",
            Self::Gpuz => "gpuz",
            Self::Ndjson => "ndjson",
            Self::StatusJson => "status-json",
        }
    }
}

/// How to read files.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// The format, or `None` to sniff each file. [`Format::Ndjson`] and
    /// [`Format::StatusJson`] both mean "vramctl NDJSON": which of the two each file is, is
    /// told from the file itself.
    pub format: Option<Format>,
    /// Stop at the first bad row (nothing is written) instead of skipping it.
    pub strict: bool,
    /// Zone of timestamps written without one.
    pub tz: TimeZone,
    /// Column names for CSV written with `noheader`.
    pub columns: Option<Vec<String>>,
    /// The GPU of the rows of an nvidia-smi `--query-compute-apps` log without a GPU
    /// column (`gpu_uuid`, `gpu_bus_id`): an index or UUID of a GPU in the other files (or
    /// in the history), or a name for it when there is none. Without it such rows go on
    /// the one GPU known, or on a single unnamed GPU when none is.
    pub gpu: Option<String>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        Self {
            format: None,
            strict: false,
            tz: vramctl_core::wall_time::system_zone(),
            columns: None,
            gpu: None,
        }
    }
}

/// A row that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRow {
    /// The file.
    pub file: PathBuf,
    /// 1-based line number.
    pub line: usize,
    /// What is wrong (a file's own text in it is escaped: see [`shown`]).
    pub message: String,
}

impl fmt::Display for BadRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.message)
    }
}

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Each file and the format it was read as.
    pub files: Vec<(PathBuf, Format)>,
    /// Rows (lines) read.
    pub rows: u64,
    /// Ticks appended.
    pub ticks: u64,
    /// Rows skipped, with why: the first [`KEEP_SKIPPED`] of them (a file of nothing but
    /// bad rows must not fill memory with messages); [`ImportReport::skipped_total`] counts
    /// them all.
    pub skipped: Vec<BadRow>,
    /// Every row skipped.
    pub skipped_total: u64,
    /// Values no GPU can mean (250 % utilization, 900 °C, 99999999 W), stored as gaps
    /// with the reason instead.
    pub dropped_values: u64,
    /// The first of them, for the message.
    pub dropped_example: Option<String>,
    /// Columns present in the files that vramctl does not record.
    pub ignored_columns: Vec<String>,
    /// What the user should know about how the files were read (rows put on a GPU the
    /// file does not name, GPU-Z logging sessions, rows sharing a second).
    pub notes: Vec<String>,
}

/// Why an import failed (nothing of it was written).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The file could not be read.
    #[error("cannot read '{}': {cause}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The system's error.
        cause: std::io::Error,
    },
    /// Not a regular file (a FIFO, a device such as `/dev/zero`, a socket, a directory):
    /// refused before anything is read, since such an input need not ever end.
    #[error("'{}' is {kind}, not a regular file; import reads files", path.display())]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// A line longer than [`MAX_LINE_BYTES`] or a header wider than [`MAX_COLUMNS`]: the
    /// file is not read on (skipping cannot help: such a file is not a log).
    #[error("{0}")]
    Limit(BadRow),
    /// A row is bad and `strict` was asked, or the file is unusable from its first line.
    #[error("{0}")]
    Bad(BadRow),
    /// The format could not be told from the content.
    #[error("cannot tell the format of '{}': {why}", path.display())]
    Unknown {
        /// The file.
        path: PathBuf,
        /// What was seen.
        why: String,
    },
    /// The rows of a file without a GPU column cannot be put on one GPU.
    #[error("'{}' {why}", path.display())]
    Gpu {
        /// The file.
        path: PathBuf,
        /// What is ambiguous, with the choices.
        why: String,
    },
    /// The data overlaps what the history holds.
    #[error(
        "'{}' starts at {at}, not after the last sample of the history ({last}): {why}",
        path.display()
    )]
    Overlap {
        /// The first file involved.
        path: PathBuf,
        /// Its first time (RFC 3339).
        at: String,
        /// The history's last time (RFC 3339).
        last: String,
        /// Why it cannot be merged.
        why: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ImportError {
    /// What to do about it.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            Self::Bad(_) => {
                Some("fix or remove the line, or import without --strict to skip bad rows")
            }
            Self::Unknown { .. } => Some("name the format with --input-format"),
            Self::Gpu { .. } => Some("name the GPU of its rows with --gpu (an index or UUID)"),
            Self::Overlap { .. } => Some("import into a new database with --db"),
            Self::Store(e) => e.hint(),
            Self::NotAFile { .. } => Some("save what it gives to a file and import that"),
            Self::Read { .. } | Self::Limit(_) => None,
        }
    }
}

/// Collects bad rows, or fails on the first when strict.
pub(crate) struct Rows<'a> {
    pub path: &'a Path,
    pub strict: bool,
    pub skipped: Vec<BadRow>,
    pub skipped_total: u64,
    pub read: u64,
    pub ignored: Vec<String>,
    ignored_set: HashSet<String>,
    pub notes: Vec<String>,
}

/// How many skipped rows a report keeps with their messages (the rest are counted).
pub const KEEP_SKIPPED: usize = 100;

impl<'a> Rows<'a> {
    fn new(path: &'a Path, strict: bool) -> Self {
        Self {
            path,
            strict,
            skipped: Vec::new(),
            skipped_total: 0,
            read: 0,
            ignored: Vec::new(),
            ignored_set: HashSet::new(),
            notes: Vec::new(),
        }
    }

    /// A column the file has that vramctl does not record (each name once; a set, so a
    /// header of many columns costs its width, not its square).
    pub fn ignore(&mut self, name: String) {
        header_work(1);
        if self.ignored_set.insert(name.clone()) {
            self.ignored.push(name);
        }
    }

    pub fn bad(&mut self, line: usize, message: impl Into<String>) -> Result<(), ImportError> {
        let row = BadRow {
            file: self.path.to_path_buf(),
            line,
            message: message.into(),
        };
        if self.strict {
            return Err(ImportError::Bad(row));
        }
        self.skipped_total += 1;
        if self.skipped.len() < KEEP_SKIPPED {
            self.skipped.push(row);
        }
        Ok(())
    }

    /// A limit of what vramctl reads was passed (see [`ImportError::Limit`]).
    pub fn limit(&self, line: usize, message: impl Into<String>) -> ImportError {
        ImportError::Limit(BadRow {
            file: self.path.to_path_buf(),
            line,
            message: message.into(),
        })
    }

    pub fn fatal(&self, line: usize, message: impl Into<String>) -> ImportError {
        ImportError::Bad(BadRow {
            file: self.path.to_path_buf(),
            line,
            message: message.into(),
        })
    }
}

impl ImportReport {
    fn absorb(&mut self, rows: Rows<'_>) {
        self.rows += rows.read;
        self.skipped_total += rows.skipped_total;
        let room = KEEP_SKIPPED.saturating_sub(self.skipped.len());
        self.skipped.extend(rows.skipped.into_iter().take(room));
        self.notes.extend(rows.notes);
        let mut seen: HashSet<String> = self.ignored_columns.iter().cloned().collect();
        header_work(seen.len());
        for column in rows.ignored {
            header_work(1);
            if seen.insert(column.clone()) {
                self.ignored_columns.push(column);
            }
        }
    }

    /// Drops from `tick` the values no GPU can mean (the sanity rules of live readings:
    /// utilization above 100 %, a temperature or power no GPU reaches): each becomes a
    /// missing value with the reason, so the history has a gap that says why.
    fn drop_insane(&mut self, tick: &mut TickSample) {
        use vramctl_core::sanity::{percent_problem, power_problem, temperature_problem};
        for dev in &mut tick.devices {
            let DeviceSampleState::Read { metrics, processes } = &mut dev.state else {
                continue;
            };
            for (metric, observed) in metrics.iter_mut() {
                let Observed::Value(v) = observed else {
                    continue;
                };
                let why = match metric {
                    Metric::UtilizationGpuPercent | Metric::UtilizationMemoryPercent => {
                        percent_problem(*v)
                    }
                    Metric::TemperatureC => temperature_problem(*v),
                    Metric::PowerMw => power_problem(*v),
                    _ => None,
                };
                if let Some(why) = why {
                    self.note_dropped(&dev.device.uuid, *metric, &why);
                    *observed = Observed::Missing(format!("dropped: {why}"));
                }
            }
            if let ProcessList::Observed(list) = processes {
                for p in list.iter_mut() {
                    if let Some(why) = p.sm_percent.and_then(|sm| percent_problem(u64::from(sm))) {
                        self.note_dropped(&dev.device.uuid, Metric::ProcessSmPercent, &why);
                        p.sm_percent = None;
                    }
                }
            }
        }
    }

    fn note_dropped(&mut self, uuid: &str, metric: Metric, why: &str) {
        self.dropped_values += 1;
        if self.dropped_example.is_none() {
            self.dropped_example = Some(format!("{} of {}: {why}", metric.name(), shown(uuid, 60)));
        }
    }
}

/// Counts the steps spent on header columns in tests (classifying a column, looking a name
/// up): `import_is_linear_in_header_columns` checks they grow with the width, not its
/// square. Each step that looks at a column calls it; nothing in a release counts.
#[cfg(test)]
pub(crate) fn header_work(steps: usize) {
    HEADER_WORK.with(|w| w.set(w.get() + steps));
}

#[cfg(not(test))]
pub(crate) fn header_work(_steps: usize) {}

#[cfg(test)]
thread_local! {
    static HEADER_WORK: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Sanity limits for imported logs: the log may come from another machine, so the PID
/// ceiling is the kernel's largest, not this machine's `pid_max`.
pub(crate) const IMPORT_LIMITS: vramctl_core::sanity::SanityLimits =
    vramctl_core::sanity::SanityLimits {
        pid_max: vramctl_core::sanity::PID_MAX_LIMIT,
    };

/// Guesses a file's format from its first line that is not blank (`None`: there is none).
///
/// # Errors
/// [`ImportError::Unknown`] when it looks like none of them.
pub fn sniff(
    path: &Path,
    first: Option<&str>,
    columns: Option<&[String]>,
) -> Result<Format, ImportError> {
    let first = first.map_or("", |l| l.trim_start_matches('\u{feff}').trim());
    let unknown = |why: &str| ImportError::Unknown {
        path: path.to_path_buf(),
        why: why.to_owned(),
    };
    if first.is_empty() {
        return Err(unknown("it is empty"));
    }
    if first.starts_with('{') {
        let value: serde_json::Value = serde_json::from_str(first)
            .map_err(|_| unknown("its first line starts like JSON but is not JSON"))?;
        if value.get("type").and_then(|t| t.as_str()) == Some("header") {
            return Ok(Format::Ndjson);
        }
        if value.get("devices").is_some() && value.get("schema").is_some() {
            return Ok(Format::StatusJson);
        }
        return Err(unknown(
            "JSON that is neither 'vramctl export' nor 'vramctl status --json'",
        ));
    }
    let fields: Vec<String> = first
        .split(',')
        .map(|f| f.trim().to_ascii_lowercase())
        .collect();
    if fields.first().is_some_and(|f| f == "date") {
        return Ok(Format::Gpuz);
    }
    let names: Vec<String> = match columns {
        Some(cols) if smi::looks_like_data(first) => {
            cols.iter().map(|c| c.trim().to_ascii_lowercase()).collect()
        }
        _ => fields,
    };
    let has = |n: &str| {
        names
            .iter()
            .any(|f| f == n || f.starts_with(&format!("{n} [")))
    };
    if has("pid") || has("used_gpu_memory") || has("used_memory") || has("process_name") {
        return Ok(Format::SmiApps);
    }
    if names.iter().any(|f| {
        f.starts_with("memory.")
            || f.starts_with("utilization.")
            || f.starts_with("temperature.")
            || f.starts_with("power.")
            || f == "uuid"
            || f == "index"
    }) {
        return Ok(Format::SmiGpu);
    }
    if smi::looks_like_data(first) {
        return Err(unknown(
            "it has no header line (written with 'noheader'?); pass the column list with --columns",
        ));
    }
    Err(unknown(&format!(
        "its first line '{}' is not a known header",
        shown(first, 60)
    )))
}

/// The format of one file: the one asked (`--input-format`), else sniffed from its content.
/// "NDJSON" covers both vramctl kinds, told apart per file.
fn decide(
    asked: Option<Format>,
    path: &Path,
    first: Option<&str>,
    columns: Option<&[String]>,
) -> Result<Format, ImportError> {
    match asked {
        Some(Format::Ndjson | Format::StatusJson) => match sniff(path, first, None) {
            Ok(f @ (Format::Ndjson | Format::StatusJson)) => Ok(f),
            Ok(_) | Err(_) => Err(ImportError::Unknown {
                path: path.to_path_buf(),
                why: "it is not vramctl NDJSON ('vramctl export' or 'vramctl status --json')"
                    .into(),
            }),
        },
        Some(f) => Ok(f),
        None => sniff(path, first, columns),
    }
}

/// The one CSV writer of everything vramctl writes as CSV (exports, `history --format
/// csv`, `history --audit`): RFC 4180, `,` between fields, `\n` after records, a field
/// quoted when it holds a comma, a quote, a newline or a carriage return.
pub fn csv_writer<W: std::io::Write>(out: W) -> csv::Writer<W> {
    csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .quote_style(csv::QuoteStyle::Necessary)
        .flexible(false)
        .from_writer(out)
}

/// `text` as it may be quoted in a message: cut to `n` characters, then escaped as every
/// human output escapes another user's text (`vramctl_core::untrusted::escape`: a terminal
/// escape, a carriage return, a NUL from a damaged file, a bidi override as `\u{1b}`,
/// `\r`, …). Every message that quotes a file's content goes through this.
pub fn shown(text: &str, n: usize) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(n).collect();
    let mut out = vramctl_core::untrusted::escape(&head).into_owned();
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

/// What the other files of an import (and the history) say about the GPUs: where an apps
/// log without a GPU column goes, and the totals its values are checked against.
#[derive(Debug, Default)]
pub(crate) struct Companion {
    /// In the order first seen: the files' GPUs, then the history's.
    pub devices: Vec<DeviceMeta>,
    /// Largest total memory known per UUID.
    pub totals: HashMap<String, u64>,
    /// The UUIDs of `devices`.
    uuids: HashSet<String>,
    /// Whether the GPUs came from the history rather than the files.
    from_history: bool,
}

impl Companion {
    fn learn(&mut self, tick: &TickSample) {
        for dev in &tick.devices {
            let total = match &dev.state {
                DeviceSampleState::Read { metrics, .. } => {
                    metrics
                        .iter()
                        .find_map(|(metric, value)| match (metric, value) {
                            (Metric::TotalBytes, Observed::Value(v)) => Some(*v),
                            _ => None,
                        })
                }
                DeviceSampleState::Unreadable(_) => None,
            };
            self.learn_device(&dev.device, total);
        }
    }

    /// Whether a GPU of this UUID is known.
    pub(crate) fn knows(&self, uuid: &str) -> bool {
        self.uuids.contains(uuid)
    }

    /// One row's GPU and its total memory, if it gives one.
    pub(crate) fn learn_device(&mut self, device: &DeviceMeta, total: Option<u64>) {
        if self.uuids.insert(device.uuid.clone()) {
            self.devices.push(device.clone());
        }
        if let Some(v) = total {
            let total = self.totals.entry(device.uuid.clone()).or_default();
            *total = (*total).max(v);
        }
    }

    /// The history's GPUs, when the files name none (an apps log imported after its GPU
    /// log, by a second `import`).
    fn learn_history(&mut self, store: &mut Store) -> Result<(), StoreError> {
        for record in store.devices()? {
            if record.meta.parent_uuid.is_some() {
                continue;
            }
            let total = store
                .device_metric(record.id, Metric::TotalBytes, crate::model::TimeRange::ALL)?
                .iter()
                .map(|p| p.max)
                .max();
            if let Some(total) = total {
                self.totals.insert(record.meta.uuid.clone(), total);
            }
            if self.uuids.insert(record.meta.uuid.clone()) {
                if self.devices.is_empty() {
                    self.from_history = true;
                }
                self.devices.push(record.meta);
            }
        }
        Ok(())
    }

    fn describe(d: &DeviceMeta) -> String {
        match d.index {
            Some(i) => format!("{i} ({})", d.uuid),
            None => d.uuid.clone(),
        }
    }

    /// The GPU for rows that name none, and how it was chosen.
    ///
    /// # Errors
    /// Several GPUs and no `--gpu`, or a `--gpu` that names none of them (the message
    /// lists them).
    pub fn gpu_for_unnamed_rows(&self, gpu: Option<&str>) -> Result<(DeviceMeta, String), String> {
        let choices = || {
            self.devices
                .iter()
                .map(Self::describe)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let whose = if self.from_history {
            "the history"
        } else {
            "the other files"
        };
        match gpu.map(str::trim) {
            Some(selector) => {
                if self.devices.is_empty() {
                    let meta = match selector.parse::<u32>() {
                        Ok(i) => DeviceMeta {
                            uuid: format!("INDEX-{i}"),
                            index: Some(i),
                            ..DeviceMeta::default()
                        },
                        Err(_) => DeviceMeta {
                            uuid: selector.to_owned(),
                            ..DeviceMeta::default()
                        },
                    };
                    let how = format!("GPU '{}' (--gpu)", shown(selector, 60));
                    return Ok((meta, how));
                }
                let lower = selector.to_ascii_lowercase();
                let found = self.devices.iter().find(|d| {
                    selector
                        .parse::<u32>()
                        .ok()
                        .is_some_and(|i| d.index == Some(i))
                        || d.uuid.eq_ignore_ascii_case(selector)
                        || (selector.len() >= 12 && d.uuid.to_ascii_lowercase().starts_with(&lower))
                });
                match found {
                    Some(d) => Ok((d.clone(), format!("GPU {} (--gpu)", Self::describe(d)))),
                    None => Err(format!(
                        "has no GPU column, and --gpu '{}' names none of the GPUs of {whose}: {}",
                        shown(selector, 60),
                        choices()
                    )),
                }
            }
            None => match self.devices.as_slice() {
                [] => Ok((
                    DeviceMeta {
                        uuid: UNNAMED_GPU.to_owned(),
                        ..DeviceMeta::default()
                    },
                    format!("a single unnamed GPU '{UNNAMED_GPU}' (name it with --gpu)"),
                )),
                [only] => Ok((
                    only.clone(),
                    format!("GPU {}, the only GPU of {whose}", Self::describe(only)),
                )),
                several => Err(format!(
                    "has no gpu_uuid or gpu_bus_id column, and its rows could be on any of the {} \
                     GPUs of {whose}: {}",
                    several.len(),
                    choices()
                )),
            },
        }
    }
}

/// The device of an apps log's rows when neither its file nor any other names a GPU.
pub const UNNAMED_GPU: &str = "GPU-unnamed";

/// One file's ticks, read as they are asked for.
enum Source {
    Gpu(Box<smi::GpuReader>),
    Apps(Box<smi::AppsReader>),
    Gpuz(Box<gpuz::GpuzReader>),
    Status(Box<ndjson::StatusReader>),
}

impl Source {
    /// Opens `path` as `format` (not [`Format::Ndjson`], which is written as it is) and
    /// reads its header.
    fn open(
        path: &Path,
        format: Format,
        options: &ImportOptions,
        rows: &mut Rows<'_>,
        companion: &Companion,
    ) -> Result<Self, ImportError> {
        let input = Input::open(path)?;
        Ok(match format {
            Format::SmiGpu => Self::Gpu(Box::new(smi::GpuReader::open(input, options, rows)?)),
            Format::SmiApps => Self::Apps(Box::new(smi::AppsReader::open(
                input, options, rows, companion,
            )?)),
            Format::Gpuz => Self::Gpuz(Box::new(gpuz::GpuzReader::open(input, options, rows)?)),
            Format::StatusJson | Format::Ndjson => {
                Self::Status(Box::new(ndjson::StatusReader::new(input)))
            }
        })
    }

    /// Whether the tick last handed out holds only if other files go on past it (an apps
    /// log's loop after its last rows, [`smi::AppsReader::next_tick`]).
    fn is_trailing(&self) -> bool {
        matches!(self, Self::Apps(r) if r.is_trailing())
    }

    fn next_tick(&mut self, rows: &mut Rows<'_>) -> Result<Option<TickSample>, ImportError> {
        match self {
            Self::Gpu(r) => r.next_tick(rows),
            Self::Apps(r) => r.next_tick(rows),
            Self::Gpuz(r) => r.next_tick(rows),
            Self::Status(r) => r.next_tick(rows),
        }
    }
}

/// The files' ticks merged by time: each file's next tick is held, the earliest handed out,
/// ticks of the same millisecond folded into one (in the order of the files). Each file's
/// ticks are in time order (a row that is not after the one before is a bad row), so only
/// one tick per file is held at a time.
struct Merge {
    /// (file index, its source, its next tick).
    heads: Vec<(usize, Source, Option<TickSample>)>,
}

impl Merge {
    fn new(sources: Vec<(usize, Source)>, rows: &mut [Rows<'_>]) -> Result<Self, ImportError> {
        let mut heads = Vec::with_capacity(sources.len());
        for (i, mut source) in sources {
            let first = source.next_tick(&mut rows[i])?;
            heads.push((i, source, first));
        }
        Ok(Self { heads })
    }

    /// The next merged tick and the file its first part came from.
    fn next(&mut self, rows: &mut [Rows<'_>]) -> Result<Option<(usize, TickSample)>, ImportError> {
        // A trailing tick is kept only where another file goes on: when it is the earliest
        // and no other file has a tick left, it is dropped.
        for k in 0..self.heads.len() {
            if !self.heads[k].1.is_trailing() || self.heads[k].2.is_none() {
                continue;
            }
            let others = self
                .heads
                .iter()
                .enumerate()
                .any(|(j, h)| j != k && h.2.is_some());
            if !others {
                let (i, source, head) = &mut self.heads[k];
                *head = source.next_tick(&mut rows[*i])?;
            }
        }
        let Some(at) = self
            .heads
            .iter()
            .filter_map(|(_, _, t)| t.as_ref().map(|t| t.at_unix_ms))
            .min()
        else {
            return Ok(None);
        };
        let mut merged: Option<(usize, TickSample)> = None;
        for (i, source, head) in &mut self.heads {
            if head.as_ref().is_none_or(|t| t.at_unix_ms != at) {
                continue;
            }
            let next = source.next_tick(&mut rows[*i])?;
            let Some(tick) = std::mem::replace(head, next) else {
                continue;
            };
            match merged.as_mut() {
                None => merged = Some((*i, tick)),
                Some((_, into)) => merge(into, tick),
            }
        }
        Ok(merged)
    }
}

/// Reads `paths` into `store`, merged by time, in one transaction: every file is written,
/// or (a bad row with `strict`, a store failure, the process killed) none.
///
/// Each file's format is decided by itself. Files are read as streams, a line at a time
/// (`input.rs`: regular files only, lines and columns bounded), and their ticks merged by
/// time and written as they come, so memory does not grow with the files; a strict failure
/// rolls the transaction back, so it still writes nothing. An apps log without a GPU column
/// is put on its companion log's GPU (see [`ImportOptions::gpu`]) and its values checked
/// against that GPU's total: the other files are read once first to learn their GPUs.
/// NDJSON exports are written as they are (lossless); the rest is appended as ticks — or,
/// when it starts before the history's last sample, merged into those last samples (the
/// apps log of a run whose GPU log an earlier import wrote; those new ticks are held in
/// memory to be merged). Values no GPU can mean become gaps with the reason
/// ([`ImportReport::dropped_values`]).
///
/// # Errors
/// See [`ImportError`].
pub fn import_files(
    store: &mut Store,
    paths: &[PathBuf],
    options: &ImportOptions,
) -> Result<ImportReport, ImportError> {
    let mut report = ImportReport::default();
    let mut formats = Vec::with_capacity(paths.len());
    for path in paths {
        let first = Input::first_line(path)?;
        let format = decide(
            options.format,
            path,
            first.as_deref(),
            options.columns.as_deref(),
        )?;
        report.files.push((path.clone(), format));
        formats.push(format);
    }
    let mut companion = Companion::default();
    if formats.contains(&Format::SmiApps) {
        for (path, &format) in paths.iter().zip(&formats) {
            if matches!(format, Format::SmiApps | Format::Ndjson) {
                continue;
            }
            // A first reading that only learns the GPUs; its bad rows are reported by the
            // second.
            let mut scratch = Rows::new(path, false);
            match Source::open(path, format, options, &mut scratch, &companion)? {
                Source::Gpu(reader) => reader.learn(&mut scratch, &mut companion)?,
                mut source => {
                    while let Some(tick) = source.next_tick(&mut scratch)? {
                        companion.learn(&tick);
                    }
                }
            }
        }
        companion.learn_history(store)?;
    }
    let mut rows: Vec<Rows<'_>> = paths.iter().map(|p| Rows::new(p, options.strict)).collect();
    // Every header is read (and every apps log's GPU decided) before anything is written.
    let mut sources = Vec::new();
    for (i, (path, &format)) in paths.iter().zip(&formats).enumerate() {
        if format != Format::Ndjson {
            let source = Source::open(path, format, options, &mut rows[i], &companion)?;
            sources.push((i, source));
        }
    }
    store.begin_import_transaction()?;
    test_pause("begin");
    let result = write(store, &mut report, paths, &formats, &mut rows, sources);
    // The report lists the GPU logs' rows and notes before the apps logs' (as they were
    // read before streaming).
    let (apps, others): (Vec<_>, Vec<_>) = rows
        .into_iter()
        .zip(&formats)
        .partition(|(_, f)| **f == Format::SmiApps);
    for (r, _) in others.into_iter().chain(apps) {
        report.absorb(r);
    }
    match result {
        Ok(()) => {
            test_pause("commit");
            store.commit_import_transaction()?;
            Ok(report)
        }
        Err(err) => {
            store.rollback_import();
            Err(err)
        }
    }
}

/// The writing half of [`import_files`], inside its transaction.
fn write(
    store: &mut Store,
    report: &mut ImportReport,
    paths: &[PathBuf],
    formats: &[Format],
    rows: &mut [Rows<'_>],
    sources: Vec<(usize, Source)>,
) -> Result<(), ImportError> {
    for (i, format) in formats.iter().enumerate() {
        if *format == Format::Ndjson {
            let mut input = Input::open(&paths[i])?;
            report.ticks += ndjson::import(store, &mut input, &mut rows[i])?;
        }
    }
    let mut merged = Merge::new(sources, rows)?;
    let Some((first_file, mut first)) = merged.next(rows)? else {
        return Ok(());
    };
    report.drop_insane(&mut first);
    let source = report
        .files
        .iter()
        .map(|(_, f)| f.name())
        .collect::<Vec<_>>()
        .join("+");
    let session = crate::model::SessionInfo {
        source: format!("import:{source}"),
        ..Default::default()
    };
    match store.last_sample_ms()? {
        Some(last) if first.at_unix_ms <= last => {
            // Merged into the history's last samples: the stored frames are replayed among
            // the new ticks, which are checked against them first, so they are held.
            let at = first.at_unix_ms;
            let mut ticks = vec![first];
            while let Some((_, mut tick)) = merged.next(rows)? {
                report.drop_insane(&mut tick);
                ticks.push(tick);
            }
            match store.import_over_tail(&ticks, &session)? {
                Ok(frames) => report.ticks += frames,
                Err(conflict) => {
                    return Err(ImportError::Overlap {
                        path: paths[first_file].clone(),
                        at: rfc3339(at),
                        last: rfc3339(last),
                        why: conflict.0,
                    });
                }
            }
        }
        _ => {
            store.begin_session(&session)?;
            store.append(&first)?;
            report.ticks += 1;
            test_pause("written");
            while let Some((_, mut tick)) = merged.next(rows)? {
                report.drop_insane(&mut tick);
                store.append(&tick)?;
                report.ticks += 1;
            }
        }
    }
    Ok(())
}

/// The environment variable of [`test_pause`].
pub const TEST_PAUSE_ENV: &str = "VRAMCTL_TEST_IMPORT_PAUSE";

/// Debug builds only: with `VRAMCTL_TEST_IMPORT_PAUSE=POINT:FILE` an import that reaches
/// POINT (`begin`: its transaction open, nothing written; `written`: the first sample
/// written; `commit`: everything written, not committed) creates FILE and waits there, so a
/// test can `kill -9` it at that point for certain instead of guessing from CPU time (a
/// guess that landed after the commit under load). The wait is bounded (60 s) so a test
/// that forgets to kill does not hang. Release builds have no such hook.
#[cfg(debug_assertions)]
fn test_pause(point: &str) {
    let Ok(spec) = std::env::var(TEST_PAUSE_ENV) else {
        return;
    };
    let Some((at, file)) = spec.split_once(':') else {
        return;
    };
    if at != point || std::fs::write(file, point).is_err() {
        return;
    }
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[cfg(not(debug_assertions))]
fn test_pause(_point: &str) {}

/// Folds `other` (same time) into `into`.
fn merge(into: &mut TickSample, other: TickSample) {
    for dev in other.devices {
        match into
            .devices
            .iter_mut()
            .find(|d| d.device.uuid == dev.device.uuid)
        {
            None => into.devices.push(dev),
            Some(existing) => merge_device(existing, dev),
        }
    }
    into.processes.extend(other.processes);
}

fn merge_device(into: &mut DeviceSample, other: DeviceSample) {
    let DeviceSampleState::Read {
        metrics: m2,
        processes: p2,
    } = other.state
    else {
        into.state = other.state;
        return;
    };
    match &mut into.state {
        DeviceSampleState::Read { metrics, processes } => {
            metrics.extend(m2);
            match (processes, p2) {
                (_, ProcessList::NotObserved) => {}
                (ProcessList::Observed(a), ProcessList::Observed(b)) => a.extend(b),
                (slot, p) => *slot = p,
            }
        }
        DeviceSampleState::Unreadable(_) => {}
    }
    if into.device.name.is_none() {
        into.device.name = other.device.name;
    }
    if into.device.index.is_none() {
        into.device.index = other.device.index;
    }
    if into.device.pci_bus_id.is_none() {
        into.device.pci_bus_id = other.device.pci_bus_id;
    }
}

/// RFC 3339 UTC with milliseconds.
pub fn rfc3339(unix_ms: i64) -> String {
    jiff::Timestamp::from_millisecond(unix_ms)
        .map_or_else(|_| unix_ms.to_string(), |t| format!("{t:.3}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Imports a one-row log whose header has `width` columns vramctl does not record,
    /// and returns the steps spent on header columns.
    fn header_steps(dir: &Path, format: Format, width: usize) -> usize {
        let path = dir.join(format!("{}-{width}.csv", format.name()));
        let mut header = match format {
            Format::Gpuz => "Date, Memory Used [MB]".to_owned(),
            _ => "timestamp, uuid, memory.used [MiB]".to_owned(),
        };
        let mut row = match format {
            Format::Gpuz => "2026-11-29 20:31:31, 100".to_owned(),
            _ => "2026/11/29 20:31:31.000, GPU-1, 100 MiB".to_owned(),
        };
        for i in 0..width {
            header.push_str(&format!(", extra.sensor.{i}"));
            row.push_str(", 1");
        }
        std::fs::write(&path, format!("{header}\n{row}\n")).unwrap();
        let mut store = Store::open_in_memory().unwrap();
        HEADER_WORK.with(|w| w.set(0));
        let options = ImportOptions {
            tz: TimeZone::UTC,
            strict: true,
            ..ImportOptions::default()
        };
        let report = import_files(&mut store, &[path], &options).unwrap();
        assert_eq!(report.ignored_columns.len(), width);
        assert_eq!(report.ticks, 1);
        HEADER_WORK.with(std::cell::Cell::get)
    }

    #[test]
    fn import_is_linear_in_header_columns() {
        // Once each column was looked up in the list of those seen (and GPU-Z's compared
        // with every other): 100,000 columns took 15 s. Steps are counted, not timed.
        let dir = tempfile::tempdir().unwrap();
        for format in [Format::SmiGpu, Format::Gpuz] {
            let small = header_steps(dir.path(), format, 1000);
            let large = header_steps(dir.path(), format, 4000);
            assert!(
                large <= 4 * small + 100 && large <= 5 * 4000,
                "{}: {small} steps for 1000 columns, {large} for 4000",
                format.name()
            );
        }
    }

    #[test]
    fn a_header_wider_than_the_limit_is_one_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wide.csv");
        let header: Vec<String> = (0..=MAX_COLUMNS).map(|i| format!("c{i}")).collect();
        std::fs::write(&path, format!("timestamp, {}\n", header.join(", "))).unwrap();
        let mut store = Store::open_in_memory().unwrap();
        let options = ImportOptions {
            format: Some(Format::SmiGpu),
            tz: TimeZone::UTC,
            ..ImportOptions::default()
        };
        let err = import_files(&mut store, &[path], &options).unwrap_err();
        assert!(matches!(err, ImportError::Limit(_)), "{err}");
        assert!(err.to_string().contains("more than 4096 columns"), "{err}");
    }
}
