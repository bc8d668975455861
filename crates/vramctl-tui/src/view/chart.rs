//! Memory charts (braille lines): the focused GPU's, and the selected process's.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::symbols::Marker;
use ratatui::text::Span;
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType, Widget};

use super::put;
use crate::app::App;
use crate::format;
use crate::memory_series::{Point, SeriesKey, decimate};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The GPU the chart follows: the selected process's, else the first one shown.
fn focused_device(app: &App) -> Option<&vramctl_core::types::DeviceSnapshot> {
    let obs = app.latest.as_ref()?;
    let wanted = app.table.selected.as_ref().and_then(|k| k.uuid.clone());
    obs.snapshot
        .devices
        .iter()
        .filter(|d| app.shows_device(&d.info.uuid))
        .find(|d| wanted.as_ref().is_none_or(|u| *u == d.info.uuid))
        .or_else(|| {
            obs.snapshot
                .devices
                .iter()
                .find(|d| app.shows_device(&d.info.uuid))
        })
}

pub fn draw_device_chart(app: &App, area: Rect, buf: &mut Buffer) {
    let Some(device) = focused_device(app) else {
        Block::bordered()
            .border_style(app.theme.dim())
            .title(" memory ")
            .render(area, buf);
        return;
    };
    let memory = device.reading().and_then(|r| r.memory);
    let mut title = format!(
        " GPU {} memory used · last {} ",
        device.info.index,
        app.charts.zoom.label()
    );
    if let Some(m) = memory {
        title.push_str(&format!(
            "· {} of {} · reserved {} · free {} ",
            format::bytes(m.used_bytes),
            format::bytes(m.total_bytes),
            format::bytes(m.reserved_bytes),
            format::bytes(m.free_bytes)
        ));
    }
    let points = app.chart_points(&SeriesKey::Device(device.info.uuid.clone()));
    let ceiling = memory.map(|m| m.total_bytes);
    draw_series(app, &title, &points, ceiling, area, buf);
}

/// Stretches of `data` (time, value) without a gap, where a gap is a step more than five
/// times the typical (median) step between points: nothing was sampled there (`top` was
/// not running, the recorder was stopped), and a line across it would draw values no one
/// saw.
fn runs(data: &[(f64, f64)]) -> Vec<&[(f64, f64)]> {
    if data.len() < 3 {
        return vec![data];
    }
    let mut steps: Vec<f64> = data.windows(2).map(|w| w[1].0 - w[0].0).collect();
    steps.sort_by(f64::total_cmp);
    let limit = steps[steps.len() / 2] * 5.0;
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..data.len() {
        if data[i].0 - data[i - 1].0 > limit {
            out.push(&data[start..i]);
            start = i;
        }
    }
    out.push(&data[start..]);
    out
}

/// A bordered chart of `points` over the zoom window; the y axis goes to `ceiling` (a
/// device's total) or a little above the highest point.
pub fn draw_series(
    app: &App,
    title: &str,
    points: &[Point],
    ceiling: Option<u64>,
    area: Rect,
    buf: &mut Buffer,
) {
    let t = app.theme;
    let block = Block::bordered()
        .border_style(t.dim())
        .title(Span::styled(title.to_owned(), t.heading()));
    let Some(now) = app.now_ms() else {
        block.render(area, buf);
        return;
    };
    let span_ms = app.charts.zoom.span_ms();
    let from = now - span_ms;
    let inner_w = usize::from(area.width.saturating_sub(10)).max(1);
    let points = decimate(points, from, now, inner_w * 2);
    if points.is_empty() {
        let inner = block.inner(area);
        block.render(area, buf);
        put(
            buf,
            inner.x + 1,
            inner.y,
            inner.right(),
            &[("no samples in this window yet", t.dim())],
        );
        return;
    }
    #[allow(clippy::cast_precision_loss)]
    let data: Vec<(f64, f64)> = points
        .iter()
        .map(|p| ((p.t_ms - now) as f64 / 1000.0, p.bytes as f64 / GIB))
        .collect();
    let highest = points.iter().map(|p| p.bytes).max().unwrap_or(0);
    let top = ceiling.unwrap_or_else(|| highest.saturating_add(highest / 10).max(1 << 20));
    #[allow(clippy::cast_precision_loss)]
    let top_gib = top as f64 / GIB;
    #[allow(clippy::cast_precision_loss)]
    let span_s = span_ms as f64 / 1000.0;
    let x_labels = if app.is_replay() {
        vec![
            Span::styled(format::clock(&app.time_zone, from), t.dim()),
            Span::styled(format::clock(&app.time_zone, now), t.dim()),
        ]
    } else {
        vec![
            Span::styled(format!("-{}", app.charts.zoom.label()), t.dim()),
            Span::styled("now", t.dim()),
        ]
    };
    let datasets: Vec<Dataset<'_>> = runs(&data)
        .into_iter()
        .map(|run| {
            Dataset::default()
                .marker(Marker::Braille)
                // A lone point has no line to draw: a dot.
                .graph_type(if run.len() == 1 {
                    GraphType::Scatter
                } else {
                    GraphType::Line
                })
                .style(t.chart())
                .data(run)
        })
        .collect();
    Chart::new(datasets)
        .block(block)
        .x_axis(
            Axis::default()
                .bounds([-span_s, 0.0])
                .labels(x_labels)
                .style(t.dim()),
        )
        .y_axis(
            Axis::default()
                .bounds([0.0, top_gib])
                .labels(vec![
                    Span::styled("0", t.dim()),
                    Span::styled(format::bytes(top), t.dim()),
                ])
                .style(t.dim()),
        )
        .render(area, buf);
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn a_gap_splits_the_line() {
        let mut data: Vec<(f64, f64)> = (0..10).map(|i| (f64::from(i), 1.0)).collect();
        data.extend((100..105).map(|i| (f64::from(i), 2.0)));
        let r = runs(&data);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].len(), r[1].len()), (10, 5));
        // Regular spacing, even if coarse: one line.
        let even: Vec<(f64, f64)> = (0..10).map(|i| (f64::from(i) * 60.0, 1.0)).collect();
        assert_eq!(runs(&even).len(), 1);
        assert_eq!(runs(&[]).len(), 1);
    }
}
