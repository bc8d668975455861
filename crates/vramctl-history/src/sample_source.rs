//! Where `leaks` and `plot` read their samples from: the history database, or log files
//! (nvidia-smi CSV, vramctl NDJSON) read by the store's importers into an in-memory
//! database, so nothing is written anywhere. [`resolve`] settles the time range (through
//! [`TimeWindow`]: by default the 24 hours before a history's last sample, everything in
//! files) and the GPUs.

use std::path::PathBuf;

use anyhow::anyhow;
use jiff::tz::TimeZone;
use vramctl_store::format::{Format, ImportError, ImportOptions, import_files};
use vramctl_store::{DeviceRecord, Store, TimeRange};

use vramctl_observe::gpu_selection::select_devices;

use crate::time_window::{SinceDefault, TimeWindow};

/// Opens the history for reading (`history`, `export`, `leaks`, `plot`, `history --audit`,
/// `reap`'s evidence, `slurm-epilog`): read-only, whoever owns it; what the user should know
/// about the open (the newest samples not readable) goes to stderr, escaped (the notice
/// quotes the file's own text).
///
/// # Errors
/// The store cannot be opened or is not a vramctl history.
pub fn open_history(path: &std::path::Path) -> anyhow::Result<Store> {
    let store = Store::open(path, vramctl_store::OpenMode::ReadOnly)?;
    if let Some(notice) = store.notice() {
        eprintln!(
            "vramctl: note: {}",
            vramctl_core::untrusted::Untrusted(notice)
        );
    }
    Ok(store)
}

/// Where the samples come from.
#[derive(Debug, Clone)]
pub enum SourceKind {
    /// The history database at this path.
    Store(PathBuf),
    /// Log files read into memory, with the format each was read as.
    Files(Vec<(PathBuf, Format)>),
}

/// An opened source: a store (a file, or in memory for logs), the range asked for and the
/// devices chosen.
pub struct Source {
    /// The samples.
    pub store: Store,
    /// The range to analyse or draw (clamped to the data).
    pub range: TimeRange,
    /// The devices chosen with `--gpu`.
    pub devices: Vec<DeviceRecord>,
    /// `--tz` or the system's.
    pub tz: TimeZone,
    /// What was opened.
    pub kind: SourceKind,
}

/// What part of the samples is wanted.
#[derive(Debug, Clone, Copy)]
pub struct Window<'a> {
    /// `--since` and `--until`.
    pub time: &'a TimeWindow,
    /// `--gpu` selectors.
    pub gpu: &'a [String],
}

/// Reads `files` into an in-memory store; a bad row stops it when `options.strict`.
///
/// # Errors
/// A file that cannot be read or parsed, with its file:line.
pub fn read_files(
    files: &[PathBuf],
    options: &ImportOptions,
) -> anyhow::Result<(Store, Vec<(PathBuf, Format)>)> {
    let mut store = Store::open_in_memory()?;
    let report = import_files(&mut store, files, options).map_err(|e| match e {
        // Import's own hint speaks of `import --strict`; here the switch is another.
        ImportError::Bad(row) => {
            anyhow!("{row}; fix or remove the line, or pass --skip-bad-rows to analyse the rest")
        }
        other => anyhow::Error::from(other),
    })?;
    crate::import_notes::print_report_notes(&mut std::io::stderr().lock(), &report);
    Ok((store, report.files))
}

/// The source over `store` (opened from `kind`), with the range and devices of `window`.
///
/// # Errors
/// A time that cannot be resolved, `--since` after `--until`, a `--gpu` that names no
/// recorded GPU, or a store that cannot be read.
pub fn resolve(
    mut store: Store,
    kind: SourceKind,
    tz: TimeZone,
    window: Window<'_>,
) -> anyhow::Result<Source> {
    let bounds = store.time_bounds()?;
    let default = match &kind {
        SourceKind::Store(_) => SinceDefault::LastSpan,
        SourceKind::Files(_) => SinceDefault::Everything,
    };
    let TimeRange {
        from_ms: since,
        to_ms: until,
    } = window.time.resolve(
        jiff::Timestamp::now().as_millisecond(),
        &tz,
        bounds,
        default,
    )?;
    let range = match bounds {
        Some((lo, hi)) => TimeRange {
            from_ms: since.max(lo),
            to_ms: until.min(hi),
        },
        None => TimeRange {
            from_ms: since,
            to_ms: until,
        },
    };
    let devices = select_devices(store.devices()?, window.gpu)?;
    Ok(Source {
        store,
        range,
        devices,
        tz,
        kind,
    })
}
