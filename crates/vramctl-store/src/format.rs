//! Import and export formats.
//!
//! Import reads whole files into ticks and appends them in time order (several files are
//! merged by time: an nvidia-smi `--query-gpu` log and a `--query-compute-apps` log of the
//! same run make one history). A row that cannot be read is reported by file and line and
//! skipped, or with `strict` ends the import before anything is written — never dropped
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
pub mod ndjson;
mod quantity;
pub mod smi;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use jiff::tz::TimeZone;

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
            tz: TimeZone::system(),
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
    /// Rows skipped, with why.
    pub skipped: Vec<BadRow>,
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
            Self::Read { .. } => None,
        }
    }
}

/// Collects bad rows, or fails on the first when strict.
pub(crate) struct Rows<'a> {
    pub path: &'a Path,
    pub strict: bool,
    pub skipped: Vec<BadRow>,
    pub read: u64,
    pub ignored: Vec<String>,
    pub notes: Vec<String>,
}

impl<'a> Rows<'a> {
    fn new(path: &'a Path, strict: bool) -> Self {
        Self {
            path,
            strict,
            skipped: Vec::new(),
            read: 0,
            ignored: Vec::new(),
            notes: Vec::new(),
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
        self.skipped.push(row);
        Ok(())
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
        self.skipped.extend(rows.skipped);
        self.notes.extend(rows.notes);
        for column in rows.ignored {
            if !self.ignored_columns.contains(&column) {
                self.ignored_columns.push(column);
            }
        }
    }
}

/// Sanity limits for imported logs: the log may come from another machine, so the PID
/// ceiling is the kernel's largest, not this machine's `pid_max`.
pub(crate) const IMPORT_LIMITS: vramctl_core::sanity::SanityLimits =
    vramctl_core::sanity::SanityLimits {
        pid_max: vramctl_core::sanity::PID_MAX_LIMIT,
    };

/// Guesses a file's format from its first line.
///
/// # Errors
/// [`ImportError::Unknown`] when it looks like none of them.
pub fn sniff(path: &Path, text: &str, columns: Option<&[String]>) -> Result<Format, ImportError> {
    let first = text
        .lines()
        .map(|l| l.trim_start_matches('\u{feff}').trim())
        .find(|l| !l.is_empty())
        .unwrap_or("");
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
    text: &str,
    columns: Option<&[String]>,
) -> Result<Format, ImportError> {
    match asked {
        Some(Format::Ndjson | Format::StatusJson) => match sniff(path, text, None) {
            Ok(f @ (Format::Ndjson | Format::StatusJson)) => Ok(f),
            Ok(_) | Err(_) => Err(ImportError::Unknown {
                path: path.to_path_buf(),
                why: "it is not vramctl NDJSON ('vramctl export' or 'vramctl status --json')"
                    .into(),
            }),
        },
        Some(f) => Ok(f),
        None => sniff(path, text, columns),
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

/// A file's text: UTF-8, or else (GPU-Z writes Windows-1252: `°C` as one byte) each byte
/// as the character of that code (Latin-1, which agrees with Windows-1252 on `°`).
fn read_text(path: &Path) -> Result<String, ImportError> {
    let bytes = std::fs::read(path).map_err(|cause| ImportError::Read {
        path: path.to_path_buf(),
        cause,
    })?;
    Ok(match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => e.into_bytes().iter().map(|&b| char::from(b)).collect(),
    })
}

/// What the other files of an import (and the history) say about the GPUs: where an apps
/// log without a GPU column goes, and the totals its values are checked against.
#[derive(Debug, Default)]
pub(crate) struct Companion {
    /// In the order first seen: the files' GPUs, then the history's.
    pub devices: Vec<DeviceMeta>,
    /// Largest total memory known per UUID.
    pub totals: HashMap<String, u64>,
    /// Whether the GPUs came from the history rather than the files.
    from_history: bool,
}

impl Companion {
    fn learn(&mut self, ticks: &[TickSample]) {
        for tick in ticks {
            for dev in &tick.devices {
                if !self.devices.iter().any(|d| d.uuid == dev.device.uuid) {
                    self.devices.push(dev.device.clone());
                }
                if let DeviceSampleState::Read { metrics, .. } = &dev.state {
                    for (metric, value) in metrics {
                        if let (Metric::TotalBytes, Observed::Value(v)) = (metric, value) {
                            let total = self.totals.entry(dev.device.uuid.clone()).or_default();
                            *total = (*total).max(*v);
                        }
                    }
                }
            }
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
            if !self.devices.iter().any(|d| d.uuid == record.meta.uuid) {
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

/// Reads `paths` into `store`, merged by time, in one transaction: every file is written,
/// or (a bad row with `strict`, a store failure, the process killed) none.
///
/// Each file's format is decided by itself. Files are parsed completely first (so a strict
/// failure writes nothing); GPU logs before apps logs, so an apps log without a GPU column
/// can be put on its companion log's GPU (see [`ImportOptions::gpu`]) and its values
/// checked against that GPU's total. NDJSON exports are written as they are (lossless);
/// the rest is merged by time and appended as ticks — into the history's last samples when
/// they are of another kind (the apps log of a run whose GPU log an earlier import wrote).
///
/// # Errors
/// See [`ImportError`].
pub fn import_files(
    store: &mut Store,
    paths: &[PathBuf],
    options: &ImportOptions,
) -> Result<ImportReport, ImportError> {
    let mut report = ImportReport::default();
    let mut inputs = Vec::with_capacity(paths.len());
    for path in paths {
        let text = read_text(path)?;
        let format = decide(options.format, path, &text, options.columns.as_deref())?;
        report.files.push((path.clone(), format));
        inputs.push((path, text, format));
    }
    let mut pieces: Vec<(i64, usize, usize, TickSample)> = Vec::new();
    let mut companion = Companion::default();
    let mut ndjson_files = Vec::new();
    for (file_index, (path, text, format)) in inputs.iter().enumerate() {
        let mut rows = Rows::new(path, options.strict);
        let ticks = match format {
            Format::Ndjson => {
                ndjson_files.push(file_index);
                continue;
            }
            Format::SmiApps => continue,
            Format::SmiGpu => smi::parse_gpu(text, options, &mut rows)?,
            Format::Gpuz => gpuz::parse(text, path, options, &mut rows)?,
            Format::StatusJson => ndjson::parse_status(text, &mut rows)?,
        };
        companion.learn(&ticks);
        report.absorb(rows);
        pieces.extend(
            ticks
                .into_iter()
                .enumerate()
                .map(|(i, t)| (t.at_unix_ms, file_index, i, t)),
        );
    }
    if inputs.iter().any(|(_, _, f)| *f == Format::SmiApps) {
        companion.learn_history(store)?;
    }
    for (file_index, (path, text, format)) in inputs.iter().enumerate() {
        if *format != Format::SmiApps {
            continue;
        }
        let mut rows = Rows::new(path, options.strict);
        let ticks = smi::parse_apps(text, options, &mut rows, &companion)?;
        report.absorb(rows);
        pieces.extend(
            ticks
                .into_iter()
                .enumerate()
                .map(|(i, t)| (t.at_unix_ms, file_index, i, t)),
        );
    }
    store.begin_import_transaction()?;
    match write(store, &mut report, pieces, &ndjson_files, &inputs, options) {
        Ok(()) => {
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
    mut pieces: Vec<(i64, usize, usize, TickSample)>,
    ndjson_files: &[usize],
    inputs: &[(&PathBuf, String, Format)],
    options: &ImportOptions,
) -> Result<(), ImportError> {
    for &i in ndjson_files {
        let (path, text, _) = &inputs[i];
        let mut rows = Rows::new(path, options.strict);
        report.ticks += ndjson::import(store, text, &mut rows)?;
        report.absorb(rows);
    }
    if pieces.is_empty() {
        return Ok(());
    }
    pieces.sort_by_key(|p| (p.0, p.1, p.2));
    let first_file = inputs[pieces[0].1].0.clone();
    let mut ticks: Vec<TickSample> = Vec::new();
    for (_, _, _, tick) in pieces {
        match ticks.last_mut() {
            Some(m) if m.at_unix_ms == tick.at_unix_ms => merge(m, tick),
            _ => ticks.push(tick),
        }
    }
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
        Some(last) if ticks[0].at_unix_ms <= last => {
            match store.import_over_tail(&ticks, &session)? {
                Ok(frames) => report.ticks += frames,
                Err(conflict) => {
                    return Err(ImportError::Overlap {
                        path: first_file,
                        at: rfc3339(ticks[0].at_unix_ms),
                        last: rfc3339(last),
                        why: conflict.0,
                    });
                }
            }
        }
        _ => {
            store.begin_session(&session)?;
            for tick in &ticks {
                store.append(tick)?;
                report.ticks += 1;
            }
        }
    }
    Ok(())
}

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
