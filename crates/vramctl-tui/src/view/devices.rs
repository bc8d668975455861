//! One line per GPU and per MIG instance: memory bar (used █, reserved ▒, free ░), used of
//! total, utilisation, temperature, power, and a sparkline of memory over the zoom window.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use vramctl_core::types::{DeviceState, Field, MemoryReading};

use super::put;
use crate::app::App;
use crate::format;
use crate::layout::{DeviceLine as Line, device_lines};
use crate::memory_series::{Point, SeriesKey, decimate};

/// `NVIDIA H200` → `H200`.
fn short_name(name: Option<&str>) -> String {
    let name = name.unwrap_or("?");
    let name = name.strip_prefix("NVIDIA ").unwrap_or(name);
    format::fit(name, 10)
}

/// Widths of the bar and the sparkline in a line `width` wide.
fn widths(width: u16) -> (usize, usize) {
    // label 6 + name 11 + "[" "]" 2 + numbers 17 + gauges 22 + a space 1.
    let rest = usize::from(width).saturating_sub(59);
    let bar = (rest / 2).clamp(10, 40);
    let spark = rest.saturating_sub(bar);
    (bar, if spark >= 5 { spark } else { 0 })
}

pub fn draw(app: &App, area: Rect, buf: &mut Buffer) {
    let all = device_lines(app.latest.as_deref(), app.devices.as_ref());
    let rows = usize::from(area.height);
    let (bar_w, spark_w) = widths(area.width);
    let shown = if all.len() > rows {
        rows.saturating_sub(1)
    } else {
        all.len()
    };
    for (i, line) in all.iter().take(shown).enumerate() {
        let y = area.y + u16::try_from(i).unwrap_or(0);
        draw_line(app, line, area.x, y, area.right(), bar_w, spark_w, buf);
    }
    if all.len() > shown {
        let y = area.y + u16::try_from(shown).unwrap_or(0);
        let more = format!(
            "… {} more lines (choose GPUs with --gpu, or enlarge the terminal)",
            all.len() - shown
        );
        put(buf, area.x, y, area.right(), &[(&more, app.theme.dim())]);
    }
}

#[allow(clippy::too_many_arguments)]
fn draw_line(
    app: &App,
    line: &Line<'_>,
    x: u16,
    y: u16,
    right: u16,
    bar_w: usize,
    spark_w: usize,
    buf: &mut Buffer,
) {
    let t = app.theme;
    match line {
        Line::Waiting => {
            let text = match &app.latest {
                None if app.is_replay() => "reading the recording…",
                None => "waiting for the first sample…",
                Some(_) => "no GPU to show",
            };
            put(buf, x, y, right, &[(text, t.dim())]);
        }
        Line::Unopened(u) => {
            let label = format!("GPU{:>2} ", u.index);
            let why = format!("could not be opened: {}", u.reason);
            put(buf, x, y, right, &[(&label, t.heading()), (&why, t.bad())]);
        }
        Line::Gpu(device) => {
            let label = format!("GPU{:>2} ", device.info.index);
            let name = format!("{:<10} ", short_name(device.info.name.as_deref()));
            let x = put(
                buf,
                x,
                y,
                right,
                &[(&label, t.heading()), (&name, t.text())],
            );
            match &device.state {
                DeviceState::Lost { reason } => {
                    put(buf, x, y, right, &[(&format!("LOST: {reason}"), t.bad())]);
                }
                DeviceState::Error { reason } => {
                    put(buf, x, y, right, &[(&format!("ERROR: {reason}"), t.bad())]);
                }
                DeviceState::Ok(reading) => {
                    let memory = reading.memory.ok_or_else(|| {
                        reading
                            .missing
                            .get(&Field::Memory)
                            .map_or_else(|| "not reported".to_owned(), ToString::to_string)
                    });
                    let mut gauges = String::new();
                    match reading.utilization_gpu_percent {
                        Some(u) => gauges.push_str(&format!(" util{u:>4}%")),
                        None => gauges.push_str(" util    -"),
                    }
                    match reading.temperature_c {
                        Some(c) => gauges.push_str(&format!(" {c:>3}°C")),
                        None => gauges.push_str("    -"),
                    }
                    match reading.power_mw {
                        Some(mw) => gauges.push_str(&format!(" {:>5}", format::watts(mw))),
                        None => gauges.push_str("     -"),
                    }
                    let key = SeriesKey::Device(device.info.uuid.clone());
                    draw_memory(app, memory, &gauges, &key, x, y, right, bar_w, spark_w, buf);
                }
            }
        }
        Line::Others(others) => {
            let text = format!(
                "{} held by {} process{} of other containers or the host",
                format::opt_bytes(others.used_bytes),
                others.processes,
                if others.processes == 1 { "" } else { "es" }
            );
            put(
                buf,
                x,
                y,
                right,
                &[(" └ others      ", t.dim()), (&text, t.text())],
            );
        }
        Line::Mig(device, mig) => {
            // `g2 3g.71gb`: the instance as the GPU column names it, and its profile.
            let gi = mig
                .gpu_instance_id
                .map_or_else(|| "g?".to_owned(), |gi| format!("g{gi}"));
            let profile = mig
                .name
                .as_deref()
                .and_then(|n| n.rsplit(' ').next())
                .unwrap_or("MIG");
            let label = format!(" └ {:<14}", format::fit(&format!("{gi} {profile}"), 13));
            let x = put(buf, x, y, right, &[(&label, t.dim())]);
            let memory = device
                .reading()
                .and_then(|r| r.mig_memory(&mig.uuid))
                .ok_or_else(|| "not reported".to_owned());
            let key = SeriesKey::Device(mig.uuid.clone());
            // No gauges of their own: blank, so the sparklines line up with the GPUs'.
            let blank = " ".repeat(22);
            draw_memory(app, memory, &blank, &key, x, y, right, bar_w, spark_w, buf);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn draw_memory(
    app: &App,
    memory: Result<MemoryReading, String>,
    gauges: &str,
    key: &SeriesKey,
    x: u16,
    y: u16,
    right: u16,
    bar_w: usize,
    spark_w: usize,
    buf: &mut Buffer,
) {
    let t = app.theme;
    let m = match memory {
        Ok(m) => m,
        Err(why) => {
            let text = format!("memory: {why}");
            let x = put(buf, x, y, right, &[(&text, t.dim())]);
            put(buf, x, y, right, &[(gauges, t.text())]);
            return;
        }
    };
    let (used, reserved, free) = bar_cells(m, bar_w);
    let pct = format::percent(m.used_bytes + m.reserved_bytes, m.total_bytes).unwrap_or(0);
    let level = if pct >= 90 { t.bad() } else { t.used() };
    let numbers = format!(
        " {:>6}/{:<5}{:>3}%",
        format::bytes(m.used_bytes),
        format::bytes(m.total_bytes),
        pct
    );
    let x = put(
        buf,
        x,
        y,
        right,
        &[
            ("[", t.dim()),
            (&"█".repeat(used), level),
            (&"▒".repeat(reserved), t.reserved()),
            (&"░".repeat(free), t.free()),
            ("]", t.dim()),
            (&numbers, t.text()),
            (gauges, t.text()),
        ],
    );
    if spark_w > 0 {
        let spark = sparkline(&app.chart_points(key), app, m.total_bytes, spark_w);
        put(buf, x, y, right, &[(" ", t.text()), (&spark, t.chart())]);
    }
}

/// Cells of used, reserved and free memory in a bar `width` wide; a non-zero reservation
/// gets at least one cell so the reader sees it exists.
fn bar_cells(m: MemoryReading, width: usize) -> (usize, usize, usize) {
    if m.total_bytes == 0 || width == 0 {
        return (0, 0, width);
    }
    let cells = |part: u64| -> usize {
        let n = u128::from(part) * width as u128 / u128::from(m.total_bytes);
        usize::try_from(n).unwrap_or(width).min(width)
    };
    let used = cells(m.used_bytes);
    let reserved = cells(m.reserved_bytes)
        .max(usize::from(m.reserved_bytes > 0))
        .min(width - used);
    (used, reserved, width - used - reserved)
}

/// Block characters for memory over the zoom window, scaled to `total` (so the height is
/// the fill level); blank where there is no sample.
fn sparkline(points: &[Point], app: &App, total: u64, width: usize) -> String {
    const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let Some(now) = app.now_ms() else {
        return " ".repeat(width);
    };
    let from = now - app.charts.zoom.span_ms();
    let mut cells = vec![' '; width];
    let buckets = decimate(points, from, now, width);
    let span = i128::from((now - from).max(1));
    let w = i128::try_from(width).unwrap_or(1);
    for p in buckets {
        let i = (i128::from(p.t_ms - from) * w / span).clamp(0, w - 1);
        let level = if total == 0 {
            0
        } else {
            let l = u128::from(p.bytes) * 8 / u128::from(total);
            usize::try_from(l).unwrap_or(7).min(7)
        };
        if let Some(cell) = usize::try_from(i).ok().and_then(|i| cells.get_mut(i)) {
            *cell = LEVELS[level];
        }
    }
    cells.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_shows_a_small_reservation() {
        let m = MemoryReading {
            total_bytes: 1000,
            used_bytes: 500,
            reserved_bytes: 1,
            free_bytes: 499,
        };
        assert_eq!(bar_cells(m, 20), (10, 1, 9));
        let zero = MemoryReading {
            total_bytes: 0,
            used_bytes: 0,
            reserved_bytes: 0,
            free_bytes: 0,
        };
        assert_eq!(bar_cells(zero, 5), (0, 0, 5));
    }

    #[test]
    fn widths_at_80_and_200_columns() {
        assert_eq!(widths(80), (10, 11));
        let (bar, spark) = widths(200);
        assert_eq!(bar, 40);
        assert!(spark > 40);
    }

    #[test]
    fn short_names() {
        assert_eq!(short_name(Some("NVIDIA H200")), "H200");
        assert_eq!(short_name(None), "?");
        assert_eq!(short_name(Some("NVIDIA GeForce RTX 4090")), "GeForce R…");
    }
}
