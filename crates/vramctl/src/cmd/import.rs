//! `vramctl import FILE...`: nvidia-smi CSV logs, GPU-Z sensor logs and vramctl NDJSON into
//! the history. Bad rows are listed on stderr by file and line and skipped (`--strict`:
//! the import stops at the first one and writes nothing). Exit 0 when everything was read;
//! 2 on an error, including a bad row with `--strict`.

use std::io::Write;

use vramctl_store::format::{Format, ImportOptions, ImportReport, import_files};
use vramctl_store::{OpenMode, Store};

use super::db_path;
use crate::cli::{GlobalArgs, ImportArgs, ImportFormat};
use crate::exit::Exit;
use vramctl_core::wall_time::zone as time_zone;

/// Bad rows listed one by one before the rest are only counted.
const LIST_AT_MOST: usize = 20;

/// Runs `import`.
pub fn run(global: &GlobalArgs, args: &ImportArgs) -> anyhow::Result<Exit> {
    let options = ImportOptions {
        format: import_format(args.format),
        strict: args.strict,
        tz: time_zone(args.tz.as_deref())?,
        columns: args
            .columns
            .as_ref()
            .map(|c| c.split(',').map(|s| s.trim().to_owned()).collect()),
        gpu: args.gpu.clone(),
    };
    let path = db_path(global)?;
    let mut store = Store::open(&path, OpenMode::Append)?;
    let report = match import_files(&mut store, &args.files, &options) {
        Ok(report) => report,
        Err(err) => {
            // Nothing was written; a database this import created goes again.
            store.discard_if_created();
            return Err(err.into());
        }
    };
    store.close()?;
    let mut err = std::io::stderr().lock();
    print_report_notes(&mut err, &report);
    if !report.ignored_columns.is_empty() {
        let _ = writeln!(
            err,
            "vramctl: columns not recorded by vramctl, ignored: {}",
            report.ignored_columns.join(", ")
        );
    }
    let formats: Vec<String> = report
        .files
        .iter()
        .map(|(p, f)| format!("{} ({})", p.display(), f.name()))
        .collect();
    let _ = writeln!(
        err,
        "vramctl: imported {} samples from {} rows of {} into '{}'{}",
        report.ticks,
        report.rows,
        formats.join(", "),
        path.display(),
        if report.skipped.is_empty() {
            String::new()
        } else {
            format!("; {} bad rows skipped", report.skipped.len())
        }
    );
    Ok(Exit::Ok)
}

/// `--format` of `import`, `leaks` and `plot`; `ndjson` covers both vramctl NDJSON kinds,
/// which the importer tells apart per file.
pub fn import_format(format: ImportFormat) -> Option<Format> {
    match format {
        ImportFormat::Auto => None,
        ImportFormat::SmiGpu => Some(Format::SmiGpu),
        ImportFormat::SmiApps => Some(Format::SmiApps),
        ImportFormat::Gpuz => Some(Format::Gpuz),
        ImportFormat::Ndjson => Some(Format::Ndjson),
    }
}

/// The skipped rows (the first few one by one) and the notes of a report, on stderr.
pub fn print_report_notes(err: &mut impl Write, report: &ImportReport) {
    for note in &report.notes {
        let _ = writeln!(err, "vramctl: note: {note}");
    }
    for bad in report.skipped.iter().take(LIST_AT_MOST) {
        let _ = writeln!(err, "vramctl: skipped {bad}");
    }
    if report.skipped.len() > LIST_AT_MOST {
        let _ = writeln!(
            err,
            "vramctl: skipped {} more bad rows",
            report.skipped.len() - LIST_AT_MOST
        );
    }
}
