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
//! `GPUZ-<file name>`. GPU-Z's `MB` are MiB (2^20 bytes, as Windows counts). Read: memory
//! used (`Memory Used [MB]` or `Memory Used (Dedicated) [MB]`), `GPU Load`, `Memory
//! Controller Load`, `GPU Temperature`, and `Board Power Draw` (or `GPU Power`); other
//! sensors are listed as ignored. Times are local (see [`super::ImportOptions::tz`]).

use std::path::Path;

use super::{ImportError, ImportOptions, Rows, truncate};
use crate::model::{
    DeviceMeta, DeviceSample, DeviceSampleState, Metric, Observed, ProcessList, TickSample,
};

const MIB: f64 = 1_048_576.0;

fn column(name: &str) -> Option<Metric> {
    let lower = name.to_ascii_lowercase();
    let base = lower
        .split_once(" [")
        .map_or(lower.as_str(), |(n, _)| n)
        .trim();
    Some(match base {
        "memory used" | "memory used (dedicated)" => Metric::UsedBytes,
        "gpu load" => Metric::UtilizationGpuPercent,
        "memory controller load" => Metric::UtilizationMemoryPercent,
        "gpu temperature" => Metric::TemperatureC,
        "board power draw" | "gpu power" => Metric::PowerMw,
        _ => return None,
    })
}

/// Parses a GPU-Z sensor log into ticks.
///
/// # Errors
/// A file without a `Date` column; with `strict`, the first bad row.
pub(crate) fn parse(
    text: &str,
    path: &Path,
    options: &ImportOptions,
    rows: &mut Rows<'_>,
) -> Result<Vec<TickSample>, ImportError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((header_line, header)) = lines.next() else {
        return Ok(Vec::new());
    };
    let names: Vec<&str> = fields(header);
    if names.first().map(|n| n.eq_ignore_ascii_case("date")) != Some(true) {
        return Err(rows.fatal(
            header_line,
            "the first column is not 'Date'; is this a GPU-Z sensor log?",
        ));
    }
    let columns: Vec<Option<Metric>> = names.iter().skip(1).map(|n| column(n)).collect();
    for (name, col) in names.iter().skip(1).zip(&columns) {
        if col.is_none() && !rows.ignored.iter().any(|i| i == name) {
            rows.ignored.push((*name).to_owned());
        }
    }
    let device = DeviceMeta {
        uuid: format!(
            "GPUZ-{}",
            path.file_name()
                .map_or_else(|| "log".into(), |f| f.to_string_lossy())
        ),
        ..DeviceMeta::default()
    };
    let mut ticks: Vec<TickSample> = Vec::new();
    for (line_no, line) in lines {
        rows.read += 1;
        let values = fields(line);
        if values.len() != names.len() {
            rows.bad(
                line_no,
                format!(
                    "{} fields where the header has {} (truncated line?)",
                    values.len(),
                    names.len()
                ),
            )?;
            continue;
        }
        let at = match jiff::civil::DateTime::strptime("%Y-%m-%d %H:%M:%S", values[0])
            .ok()
            .and_then(|dt| dt.to_zoned_datetime(options.tz.clone()).ok())
        {
            Some(z) => z.timestamp().as_millisecond(),
            None => {
                rows.bad(
                    line_no,
                    format!(
                        "'{}' is not a time like 2026-11-29 20:31:31",
                        truncate(values[0], 30)
                    ),
                )?;
                continue;
            }
        };
        if ticks.last().is_some_and(|t| at <= t.at_unix_ms) {
            rows.bad(
                line_no,
                format!("time '{}' is not after the previous row's", values[0]),
            )?;
            continue;
        }
        let mut metrics = Vec::new();
        let mut error = None;
        for (metric, raw) in columns.iter().zip(&values[1..]) {
            let Some(metric) = metric else { continue };
            if raw.is_empty() || *raw == "-" {
                metrics.push((*metric, Observed::Missing("not reported".into())));
                continue;
            }
            let Ok(x) = raw.parse::<f64>() else {
                error = Some(format!(
                    "{}: '{}' is not a number",
                    metric.name(),
                    truncate(raw, 30)
                ));
                break;
            };
            if !x.is_finite() || x < 0.0 {
                error = Some(format!("{}: '{raw}' is not a usable value", metric.name()));
                break;
            }
            let scaled = match metric {
                Metric::UsedBytes => x * MIB,
                Metric::PowerMw => x * 1000.0,
                _ => x,
            };
            // Finite and non-negative; far below 2^53.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            metrics.push((*metric, Observed::Value(scaled.round() as u64)));
        }
        if let Some(e) = error {
            rows.bad(line_no, e)?;
            continue;
        }
        ticks.push(TickSample {
            at_unix_ms: at,
            devices: vec![DeviceSample {
                device: device.clone(),
                state: DeviceSampleState::Read {
                    metrics,
                    processes: ProcessList::NotObserved,
                },
            }],
            ..TickSample::default()
        });
    }
    Ok(ticks)
}

/// Fields of a line, trimmed, without the empty one after the trailing comma.
fn fields(line: &str) -> Vec<&str> {
    let mut out: Vec<&str> = line.split(',').map(str::trim).collect();
    if out.last() == Some(&"") {
        out.pop();
    }
    out
}
