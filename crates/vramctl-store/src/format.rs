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
pub mod smi;

use std::fmt;
use std::path::{Path, PathBuf};

use jiff::tz::TimeZone;

use crate::db::Store;
use crate::error::StoreError;
use crate::model::{DeviceSample, DeviceSampleState, ProcessList, TickSample};

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
    /// The format, or `None` to sniff each file.
    pub format: Option<Format>,
    /// Stop at the first bad row (nothing is written) instead of skipping it.
    pub strict: bool,
    /// Zone of timestamps written without one.
    pub tz: TimeZone,
    /// Column names for CSV written with `noheader`.
    pub columns: Option<Vec<String>>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        Self {
            format: None,
            strict: false,
            tz: TimeZone::system(),
            columns: None,
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
    /// What is wrong.
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
}

/// Why an import failed (nothing of the failing file was written).
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
    /// The data is not newer than what the history holds.
    #[error(
        "'{}' starts at {at}, not after the last sample of the history ({last})",
        path.display()
    )]
    Overlap {
        /// The first file involved.
        path: PathBuf,
        /// Its first time (RFC 3339).
        at: String,
        /// The history's last time (RFC 3339).
        last: String,
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
}

impl Rows<'_> {
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
        truncate(first, 60)
    )))
}

pub(crate) fn truncate(text: &str, n: usize) -> String {
    if text.chars().count() <= n {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(n).collect::<String>())
    }
}

/// Reads `paths` into `store`, merged by time.
///
/// NDJSON exports are imported file by file as they are (lossless); the other formats are
/// parsed completely first (so a strict failure writes nothing), merged by time, and
/// appended as ticks.
///
/// # Errors
/// See [`ImportError`].
pub fn import_files(
    store: &mut Store,
    paths: &[PathBuf],
    options: &ImportOptions,
) -> Result<ImportReport, ImportError> {
    let mut report = ImportReport::default();
    let mut pieces: Vec<(i64, usize, usize, TickSample)> = Vec::new();
    let mut ndjson_files = Vec::new();
    for (file_index, path) in paths.iter().enumerate() {
        let bytes = std::fs::read(path).map_err(|cause| ImportError::Read {
            path: path.clone(),
            cause,
        })?;
        // GPU-Z writes Windows-1252 (°C as one byte); everything else is UTF-8.
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => e.into_bytes().iter().map(|&b| char::from(b)).collect(),
        };
        let format = match options.format {
            Some(f) => f,
            None => sniff(path, &text, options.columns.as_deref())?,
        };
        report.files.push((path.clone(), format));
        let mut rows = Rows {
            path,
            strict: options.strict,
            skipped: Vec::new(),
            read: 0,
            ignored: Vec::new(),
        };
        let ticks = match format {
            Format::Ndjson => {
                ndjson_files.push((path.clone(), text));
                continue;
            }
            Format::SmiGpu => smi::parse_gpu(&text, options, &mut rows)?,
            Format::SmiApps => smi::parse_apps(&text, options, &mut rows)?,
            Format::Gpuz => gpuz::parse(&text, path, options, &mut rows)?,
            Format::StatusJson => ndjson::parse_status(&text, &mut rows)?,
        };
        report.rows += rows.read;
        report.skipped.extend(rows.skipped);
        for column in rows.ignored {
            if !report.ignored_columns.contains(&column) {
                report.ignored_columns.push(column);
            }
        }
        pieces.extend(
            ticks
                .into_iter()
                .enumerate()
                .map(|(i, t)| (t.at_unix_ms, file_index, i, t)),
        );
    }
    for (path, text) in ndjson_files {
        let mut rows = Rows {
            path: &path,
            strict: options.strict,
            skipped: Vec::new(),
            read: 0,
            ignored: Vec::new(),
        };
        // One transaction per file: a file that fails half-way leaves nothing behind.
        match ndjson::import(store, &text, &mut rows) {
            Ok(frames) => report.ticks += frames,
            Err(err) => {
                store.rollback_import();
                return Err(err);
            }
        }
        report.rows += rows.read;
        report.skipped.extend(rows.skipped);
    }
    if pieces.is_empty() {
        return Ok(report);
    }
    pieces.sort_by_key(|p| (p.0, p.1, p.2));
    if let Some(last) = store.last_sample_ms()? {
        if pieces[0].0 <= last {
            return Err(ImportError::Overlap {
                path: paths[pieces[0].1].clone(),
                at: rfc3339(pieces[0].0),
                last: rfc3339(last),
            });
        }
    }
    let source = report
        .files
        .iter()
        .map(|(_, f)| f.name())
        .collect::<Vec<_>>()
        .join("+");
    store.begin_session(&crate::model::SessionInfo {
        source: format!("import:{source}"),
        ..Default::default()
    })?;
    let mut merged: Option<TickSample> = None;
    for (_, _, _, tick) in pieces {
        match merged.as_mut() {
            Some(m) if m.at_unix_ms == tick.at_unix_ms => merge(m, tick),
            _ => {
                if let Some(done) = merged.replace(tick) {
                    store.append(&done)?;
                    report.ticks += 1;
                }
            }
        }
    }
    if let Some(done) = merged {
        store.append(&done)?;
        report.ticks += 1;
    }
    Ok(report)
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
