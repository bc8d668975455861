//! `vramctl import FILE...`: nvidia-smi CSV logs, GPU-Z sensor logs and vramctl NDJSON into
//! the history. Bad rows are listed on stderr by file and line and skipped (`--strict`:
//! the import stops at the first one and writes nothing). Exit 0 when everything was read;
//! 2 on an error, including a bad row with `--strict`.

use std::io::Write;

use vramctl_history::import_notes::print_report_notes;
use vramctl_store::format::{ImportOptions, import_files};
use vramctl_store::{OpenMode, Store};

use super::{db_path, import_format};
use crate::cli::{GlobalArgs, ImportArgs};
use crate::exit::Exit;
use vramctl_core::untrusted::Untrusted;
use vramctl_core::wall_time::zone as time_zone;

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
            Untrusted(&report.ignored_columns.join(", "))
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
        Untrusted(&formats.join(", ")),
        Untrusted(&path.display().to_string()),
        if report.skipped_total == 0 {
            String::new()
        } else {
            format!("; {} bad rows skipped", report.skipped_total)
        }
    );
    Ok(Exit::Ok)
}
