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

use std::path::Path;

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
    // A run of NULs is where GPU-Z stopped writing and began again (a file preallocated or
    // cut short): what follows it is a line of its own, on the same line number.
    let mut lines = text
        .lines()
        .enumerate()
        .flat_map(|(i, l)| {
            l.split('\0')
                .map(move |piece| (i + 1, piece.trim_end_matches('\r')))
        })
        .filter(|(_, l)| !l.trim_matches([' ', '\t']).is_empty());
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
    let header_key = names.clone();
    let mut columns: Vec<Option<Metric>> = Vec::with_capacity(names.len());
    for name in names.iter().skip(1) {
        let best = names.iter().skip(1).filter_map(|n| match column(n) {
            Column::Metric(m, rank) => Some((m, rank)),
            Column::Ignored => None,
        });
        columns.push(match column(name) {
            // A lower-ranked column of a metric another column gives better: ignored.
            Column::Metric(m, rank) if best.filter(|b| b.0 == m).all(|b| b.1 >= rank) => Some(m),
            _ => None,
        });
    }
    for (name, col) in names.iter().skip(1).zip(&columns) {
        if col.is_none() && !rows.ignored.iter().any(|i| i == name) {
            rows.ignored.push((*name).to_owned());
        }
    }
    let units: Vec<Option<ColumnUnit>> = columns
        .iter()
        .map(|c| {
            c.and_then(|m| match m {
                Metric::UsedBytes => ColumnUnit::with_factor(m, MIB),
                Metric::PowerMw => ColumnUnit::with_factor(m, 1000.0),
                _ => ColumnUnit::with_factor(m, 1.0),
            })
        })
        .collect();
    let device = DeviceMeta {
        uuid: format!(
            "GPUZ-{}",
            path.file_name()
                .map_or_else(|| "log".into(), |f| f.to_string_lossy())
        ),
        ..DeviceMeta::default()
    };
    let mut ticks: Vec<TickSample> = Vec::new();
    let (mut sessions, mut same_second) = (1usize, 0usize);
    let mut new_session = false;
    for (line_no, line) in lines {
        let values = fields(line);
        if values == header_key {
            // GPU-Z started logging again into this file.
            sessions += 1;
            new_session = true;
            continue;
        }
        rows.read += 1;
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
        let at = match jiff::civil::DateTime::strptime("%Y-%m-%d %H:%M:%S%.f", values[0])
            .ok()
            .and_then(|dt| dt.to_zoned_datetime(options.tz.clone()).ok())
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
                continue;
            }
        };
        if let Some(last) = ticks.last().map(|t| t.at_unix_ms) {
            if at <= last {
                if at / 1000 == last / 1000 && !new_session {
                    // Another reading within the same logged second.
                    same_second += 1;
                    continue;
                }
                rows.bad(
                    line_no,
                    format!(
                        "time '{}' is not after the previous row's",
                        shown(values[0], 30)
                    ),
                )?;
                continue;
            }
        }
        let mut metrics = Vec::new();
        let mut error = None;
        for ((metric, unit), raw) in columns.iter().zip(&units).zip(&values[1..]) {
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
            continue;
        }
        if new_session {
            if let Some(last) = ticks.last().map(|t| t.at_unix_ms) {
                // The gap starts just after the last row of the previous session.
                if last + 1 < at {
                    ticks.push(TickSample {
                        at_unix_ms: last + 1,
                        devices: vec![DeviceSample {
                            device: device.clone(),
                            state: DeviceSampleState::Unreadable(SESSION_GAP_REASON.into()),
                        }],
                        ..TickSample::default()
                    });
                }
            }
            new_session = false;
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
    if sessions > 1 {
        rows.notes.push(format!(
            "'{}' holds {sessions} GPU-Z logging sessions; the time between them is a gap",
            path.display()
        ));
    }
    if same_second > 0 {
        rows.notes.push(format!(
            "'{}': {same_second} rows logged within the same second as the row before them \
             were not kept (GPU-Z logs whole seconds)",
            path.display()
        ));
    }
    Ok(ticks)
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
