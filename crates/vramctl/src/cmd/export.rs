//! `vramctl export`: the history as vramctl NDJSON (lossless: `import` gives the same
//! history back) or as nvidia-smi-style CSV (`--format smi-gpu`, `smi-apps`).

use std::io::Write;

use anyhow::{Context, anyhow};
use vramctl_core::wall_time;
use vramctl_history::time_window::SinceDefault;
use vramctl_store::format::{ndjson, smi};

use super::db_path;
use crate::cli::{ExportArgs, ExportFormat, GlobalArgs};
use crate::exit::Exit;

/// Runs `export`.
pub fn run(global: &GlobalArgs, args: &ExportArgs) -> anyhow::Result<Exit> {
    let tz = wall_time::zone(args.tz.as_deref())?;
    // The whole history by default: an export is a copy (import gives it back).
    let range = args.window.settle().resolve(
        jiff::Timestamp::now().as_millisecond(),
        &tz,
        None,
        SinceDefault::Everything,
    )?;
    let style: smi::CsvStyle = args
        .csv_format
        .parse()
        .map_err(|e| anyhow!("--csv-format: {e}"))?;
    if args.query.is_some() && args.format == ExportFormat::Ndjson {
        anyhow::bail!("--query chooses CSV columns; use it with --format smi-gpu or smi-apps");
    }
    let mut store = super::open_history(&db_path(global)?)?;
    let sink: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create '{}'", path.display()))?,
        ),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = std::io::BufWriter::with_capacity(1 << 16, sink);
    match args.format {
        ExportFormat::Ndjson => {
            ndjson::export(&mut store, range, &mut out)?;
        }
        ExportFormat::SmiGpu => {
            let columns = args.query.as_deref().unwrap_or(smi::DEFAULT_GPU_COLUMNS);
            smi::export_gpu(&mut store, range, columns, style, &tz, &mut out)?;
        }
        ExportFormat::SmiApps => {
            let columns = args.query.as_deref().unwrap_or(smi::DEFAULT_APP_COLUMNS);
            smi::export_apps(&mut store, range, columns, style, &tz, &mut out)?;
        }
    }
    out.flush().context("cannot write the export")?;
    Ok(Exit::Ok)
}
