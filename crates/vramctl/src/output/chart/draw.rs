//! Layout and drawing, generic over the plotters backend (SVG or bitmap).
//!
//! Each panel is a title strip, a plot on the left and a legend column on the right, so the
//! legend never covers data. Everything drawn inside the plot is clamped to the axes:
//! plotters does not clip, and a stray value must not paint over a neighbouring panel.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::downsample::{self, Run};
use super::memory_axis::{MemoryAxis, format_bytes};
use super::palette;
use super::time_axis::TimeAxis;
use super::{Chart, ChartMark, ChartSeries, ChartSpan, MarkKind, Panel, SeriesKind, SpanKind};

const WIDTH: u32 = 1400;
const TITLE_H: u32 = 52;
const PANEL_H: u32 = 380;
const BOTTOM_PAD: u32 = 12;
const LEGEND_W: u32 = 330;
const PANEL_TITLE_H: u32 = 30;
const Y_LABEL_W: u32 = 78;
const X_LABEL_H: u32 = 30;
/// The last panel also carries the time axis description.
const X_LABEL_H_LAST: u32 = 52;
const LEGEND_ROW_H: i32 = 21;
const FONT: &str = "sans-serif";

type Result<T, DB> =
    std::result::Result<T, DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;
type Area<DB> = DrawingArea<DB, Shift>;

pub(super) fn size_px(panels: usize) -> (u32, u32) {
    let panels = u32::try_from(panels.max(1)).unwrap_or(u32::MAX);
    let height = panels
        .saturating_mul(PANEL_H)
        .saturating_add(TITLE_H + BOTTOM_PAD);
    (WIDTH, height)
}

fn text_style(size: u32, color: RGBColor) -> TextStyle<'static> {
    TextStyle {
        font: (FONT, f64::from(size)).into_font(),
        color: color.to_backend_color(),
        pos: Pos::new(HPos::Left, VPos::Top),
    }
}

pub(super) fn chart<DB: DrawingBackend>(root: &Area<DB>, chart: &Chart) -> Result<(), DB> {
    root.fill(&WHITE)?;
    let (header, body) = root.split_vertically(TITLE_H);
    header.draw(&Text::new(
        chart.title.clone(),
        (16, 16),
        text_style(24, palette::INK),
    ))?;

    let (start_ms, end_ms) = time_extent(chart);
    let plot_w = WIDTH - LEGEND_W - Y_LABEL_W - 24;
    let axis = TimeAxis::plan(
        start_ms,
        end_ms,
        &chart.time_zone,
        usize::try_from(plot_w / 105).unwrap_or(8),
    );

    if chart.panels.is_empty() {
        return empty_panel(&body, &axis);
    }
    let areas = body.split_evenly((chart.panels.len(), 1));
    let last = chart.panels.len() - 1;
    for (i, (panel, area)) in chart.panels.iter().zip(&areas).enumerate() {
        draw_panel(area, panel, &axis, i == last)?;
    }
    Ok(())
}

/// The time range shown: every sample, mark and span of every panel, so panels line up.
fn time_extent(chart: &Chart) -> (i64, i64) {
    let times = chart.panels.iter().flat_map(|panel| {
        let samples = panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0));
        let marks = panel.marks.iter().map(|m| m.at_unix_ms);
        let spans = panel
            .spans
            .iter()
            .flat_map(|s| [s.from_unix_ms, s.to_unix_ms]);
        samples.chain(marks).chain(spans)
    });
    times
        .fold(None, |acc: Option<(i64, i64)>, t| {
            Some(acc.map_or((t, t), |(lo, hi)| (lo.min(t), hi.max(t))))
        })
        // No data at all: an arbitrary minute; the panel says there is nothing to show.
        .unwrap_or((0, 60_000))
}

fn empty_panel<DB: DrawingBackend>(area: &Area<DB>, axis: &TimeAxis) -> Result<(), DB> {
    let empty = Panel {
        title: "no devices".to_owned(),
        ceiling_bytes: None,
        series: Vec::new(),
        marks: Vec::new(),
        spans: Vec::new(),
    };
    draw_panel(area, &empty, axis, true)
}

/// A process in the legend, or drawn grey because the legend is full.
struct Ranked<'a> {
    series: &'a ChartSeries,
    peak: Option<u64>,
    color: Option<RGBColor>,
}

fn peak(series: &ChartSeries) -> Option<u64> {
    series.points.iter().filter_map(|p| p.1).max()
}

fn draw_panel<DB: DrawingBackend>(
    area: &Area<DB>,
    panel: &Panel,
    axis: &TimeAxis,
    last: bool,
) -> Result<(), DB> {
    let (plot_side, legend_side) = area.split_horizontally(WIDTH - LEGEND_W);
    let (title_strip, plot_side) = plot_side.split_vertically(PANEL_TITLE_H);

    let devices: Vec<&ChartSeries> = panel
        .series
        .iter()
        .filter(|s| s.kind == SeriesKind::Device)
        .collect();
    let mut processes: Vec<Ranked<'_>> = panel
        .series
        .iter()
        .filter(|s| s.kind == SeriesKind::Process)
        .map(|series| Ranked {
            series,
            peak: peak(series),
            color: None,
        })
        .collect();
    // Largest first; ties by label so the order (and the colours) do not depend on input order.
    processes.sort_by(|a, b| {
        b.peak
            .cmp(&a.peak)
            .then_with(|| a.series.label.cmp(&b.series.label))
    });

    let legend = LegendPlan::new(panel, &devices, processes.len());
    let colors = palette::assign(
        processes
            .iter()
            .take(legend.processes_shown)
            .map(|p| p.series.label.as_str()),
    );
    for (process, color) in processes.iter_mut().zip(colors) {
        process.color = Some(color);
    }

    let data_max = panel.series.iter().filter_map(peak).max().unwrap_or(0);
    let top_bytes = data_max.max(panel.ceiling_bytes.unwrap_or(0));
    #[allow(clippy::cast_precision_loss)]
    let memory = MemoryAxis::plan(top_bytes as f64, 8);

    title_strip.draw(&Text::new(
        panel.title.clone(),
        (i32::try_from(Y_LABEL_W).unwrap_or(0) + 12, 8),
        text_style(18, palette::INK),
    ))?;
    if let Some(summary) = summary(&devices, panel.ceiling_bytes) {
        let right = i32::try_from(WIDTH - LEGEND_W).unwrap_or(0) - 18;
        title_strip.draw(&Text::new(
            summary,
            (right, 10),
            text_style(14, palette::MUTED).pos(Pos::new(HPos::Right, VPos::Top)),
        ))?;
    }

    let mut cc = ChartBuilder::on(&plot_side)
        .margin_left(12)
        .margin_right(18)
        .margin_top(4)
        .x_label_area_size(if last { X_LABEL_H_LAST } else { X_LABEL_H })
        .y_label_area_size(Y_LABEL_W)
        .build_cartesian_2d(axis.clone(), memory.clone())?;
    {
        let mut mesh = cc.configure_mesh();
        mesh.bold_line_style(BLACK.mix(0.08))
            .axis_style(palette::MUTED.mix(0.6))
            .label_style(text_style(14, palette::MUTED))
            .x_labels(100)
            .y_labels(100)
            .set_all_tick_mark_size(4);
        if last {
            mesh.x_desc(axis.desc.clone())
                .axis_desc_style(text_style(14, palette::MUTED));
        }
        mesh.draw()?;
    }

    let plot = cc.plotting_area().clone();
    let (plot_w, _) = plot.dim_in_pixel();
    let mut lanes = LabelLanes::default();

    for span in &panel.spans {
        draw_span(&plot, axis, &memory, span, &mut lanes)?;
    }

    let runs_of = |series: &ChartSeries| {
        downsample::runs(&series.points, axis.start_ms(), axis.end_ms(), plot_w)
    };

    for (i, device) in devices.iter().enumerate() {
        let color = if i == 0 {
            palette::DEVICE
        } else {
            palette::DEVICE_ALT
        };
        for run in runs_of(device) {
            let points = to_values(&run, &memory);
            if points.len() > 1 {
                plot.draw(&Polygon::new(area_polygon(&points), color.mix(0.07)))?;
            }
            draw_run(&plot, points, color.stroke_width(3))?;
        }
    }

    if let Some(ceiling) = panel.ceiling_bytes {
        draw_ceiling(&plot, axis, &memory, ceiling)?;
    }

    // Unlisted processes first and thin, so the listed ones stay on top; the largest last.
    for process in processes.iter().filter(|p| p.color.is_none()) {
        for run in runs_of(process.series) {
            draw_run(
                &plot,
                to_values(&run, &memory),
                palette::OTHER.stroke_width(1),
            )?;
        }
    }
    for process in processes.iter().rev() {
        if let Some(color) = process.color {
            for run in runs_of(process.series) {
                draw_run(&plot, to_values(&run, &memory), color.stroke_width(2))?;
            }
        }
    }

    for mark in &panel.marks {
        draw_mark(&plot, axis, &memory, mark, &mut lanes)?;
    }

    if panel
        .series
        .iter()
        .all(|s| s.points.iter().all(|p| p.1.is_none()))
    {
        let (w, h) = plot.dim_in_pixel();
        plot.strip_coord_spec().draw(&Text::new(
            "no samples in this range",
            (
                i32::try_from(w / 2).unwrap_or(0),
                i32::try_from(h / 2).unwrap_or(0),
            ),
            text_style(18, palette::MUTED).pos(Pos::new(HPos::Center, VPos::Center)),
        ))?;
    }

    draw_legend(&legend_side, &legend, &devices, &processes, panel)
}

/// `peak 98.2 GiB of 141 GiB` for the panel's first device series.
fn summary(devices: &[&ChartSeries], ceiling: Option<u64>) -> Option<String> {
    let peak = devices.first().and_then(|d| peak(d))?;
    Some(match ceiling {
        // A share only where it means something: a device cannot use more than it has.
        Some(total) if peak <= total && total > 0 => format!(
            "peak {} of {} ({}%)",
            format_bytes(peak),
            format_bytes(total),
            vramctl_observe::units::percent(peak, total).unwrap_or(0)
        ),
        Some(total) => format!("peak {} of {}", format_bytes(peak), format_bytes(total)),
        None => format!("peak {}", format_bytes(peak)),
    })
}

type Plot<DB> = DrawingArea<DB, Cartesian2d<TimeAxis, MemoryAxis>>;

fn to_values(run: &Run, memory: &MemoryAxis) -> Vec<(i64, f64)> {
    run.iter().map(|&(t, b)| (t, memory.value(b))).collect()
}

/// The outline of the filled area under a run: the run, then back along zero.
fn area_polygon(points: &[(i64, f64)]) -> Vec<(i64, f64)> {
    let mut outline = points.to_vec();
    if let (Some(first), Some(last)) = (points.first(), points.last()) {
        outline.push((last.0, 0.0));
        outline.push((first.0, 0.0));
    }
    outline
}

/// A run as a line; a lone sample as a dot, since a one-point line draws nothing.
fn draw_run<DB: DrawingBackend>(
    plot: &Plot<DB>,
    points: Vec<(i64, f64)>,
    style: ShapeStyle,
) -> Result<(), DB> {
    if let [only] = points.as_slice() {
        let radius = style.stroke_width + 2;
        return plot.draw(&Circle::new(*only, radius, style.filled()));
    }
    plot.draw(&PathElement::new(points, style))
}

fn draw_ceiling<DB: DrawingBackend>(
    plot: &Plot<DB>,
    axis: &TimeAxis,
    memory: &MemoryAxis,
    ceiling: u64,
) -> Result<(), DB> {
    let y = memory.value(ceiling);
    let (x0, y_px) = pixel(plot, (axis.start_ms(), y));
    let (x1, _) = pixel(plot, (axis.end_ms(), y));
    let px = plot.strip_coord_spec();
    let style = palette::CEILING.stroke_width(2);
    let mut x = x0;
    // Dashes in pixel space: an even pattern whatever the time span.
    while x < x1 {
        let end = (x + 10).min(x1);
        px.draw(&PathElement::new(vec![(x, y_px), (end, y_px)], style))?;
        x += 16;
    }
    let label = format!("total {}", format_bytes(ceiling));
    // Above the line, right-aligned; below it when the line is at the very top.
    let (anchor, y_text) = if y_px > 18 {
        (VPos::Bottom, y_px - 4)
    } else {
        (VPos::Top, y_px + 4)
    };
    px.draw(&Text::new(
        label,
        (x1 - 6, y_text),
        text_style(14, palette::CEILING).pos(Pos::new(HPos::Right, anchor)),
    ))
}

/// A point in the plot's own pixel space (origin at its top-left corner).
fn pixel<DB: DrawingBackend>(plot: &Plot<DB>, value: (i64, f64)) -> (i32, i32) {
    let (x, y) = plot.map_coordinate(&value);
    let (bx, by) = plot.get_base_pixel();
    (x - bx, y - by)
}

/// Rows for labels at the top of the plot, so mark and span labels that would overlap
/// move down a row instead.
#[derive(Default)]
struct LabelLanes {
    rows: Vec<Vec<(i32, i32)>>,
}

impl LabelLanes {
    const ROW_H: i32 = 18;
    const MAX_ROWS: usize = 4;

    /// The y of the first row where `x0..x1` is free (the last row when none is).
    fn place(&mut self, x0: i32, x1: i32) -> i32 {
        let free = |row: &Vec<(i32, i32)>| row.iter().all(|&(a, b)| x1 + 6 < a || b + 6 < x0);
        let index = self.rows.iter().position(free).unwrap_or_else(|| {
            if self.rows.len() < Self::MAX_ROWS {
                self.rows.push(Vec::new());
            }
            self.rows.len() - 1
        });
        self.rows[index].push((x0, x1));
        4 + Self::ROW_H * i32::try_from(index).unwrap_or(0)
    }
}

fn draw_span<DB: DrawingBackend>(
    plot: &Plot<DB>,
    axis: &TimeAxis,
    memory: &MemoryAxis,
    span: &ChartSpan,
    lanes: &mut LabelLanes,
) -> Result<(), DB> {
    let from = span.from_unix_ms.min(span.to_unix_ms).max(axis.start_ms());
    let to = span.from_unix_ms.max(span.to_unix_ms).min(axis.end_ms());
    if from > to {
        return Ok(());
    }
    let (x0, y_top) = pixel(plot, (from, memory.top()));
    let (x1, y_bottom) = pixel(plot, (to, 0.0));
    // A zero-length span is still shown, one pixel wide.
    let x1 = x1.max(x0 + 1);
    let px = plot.strip_coord_spec();
    let (fill, text_color) = match span.kind {
        SpanKind::Idle => (palette::IDLE.mix(0.16), palette::MUTED),
        SpanKind::Gap => (palette::GAP.mix(0.18), palette::MUTED),
    };
    px.draw(&Rectangle::new(
        [(x0, y_top), (x1, y_bottom)],
        fill.filled(),
    ))?;
    if span.kind == SpanKind::Gap {
        for segment in hatch(x0, x1, y_top, y_bottom, 9) {
            px.draw(&PathElement::new(
                segment.to_vec(),
                palette::GAP.mix(0.9).stroke_width(1),
            ))?;
        }
    }
    if !span.label.is_empty() {
        let style = text_style(13, text_color);
        let (w, _) = px.estimate_text_size(&span.label, &style)?;
        let w = i32::try_from(w).unwrap_or(0);
        let y = lanes.place(x0 + 4, x0 + 4 + w);
        px.draw(&Text::new(span.label.clone(), (x0 + 4, y), style))?;
    }
    Ok(())
}

/// 45° lines every `spacing` pixels, clipped to the rectangle.
fn hatch(x0: i32, x1: i32, y0: i32, y1: i32, spacing: i32) -> Vec<[(i32, i32); 2]> {
    let (width, height) = (x1 - x0, y1 - y0);
    if width <= 0 || height <= 0 {
        return Vec::new();
    }
    // Line k runs from (x0 + c, y1) up-right, where c = k * spacing - height.
    (0..)
        .map(|k| k * spacing - height)
        .take_while(|&c| c < width)
        .map(|c| {
            // Parametrize along the diagonal: x = x0 + c + t, y = y1 - t for t in 0..=height.
            let t_start = (-c).max(0);
            let t_end = height.min(width - c);
            [
                (x0 + c + t_start, y1 - t_start),
                (x0 + c + t_end, y1 - t_end),
            ]
        })
        .filter(|[a, b]| a != b)
        .collect()
}

fn draw_mark<DB: DrawingBackend>(
    plot: &Plot<DB>,
    axis: &TimeAxis,
    memory: &MemoryAxis,
    mark: &ChartMark,
    lanes: &mut LabelLanes,
) -> Result<(), DB> {
    if !axis.contains(mark.at_unix_ms) {
        return Ok(());
    }
    let color = match mark.kind {
        MarkKind::LeakOnset => palette::LEAK,
    };
    let (x, y_top) = pixel(plot, (mark.at_unix_ms, memory.top()));
    let (_, y_bottom) = pixel(plot, (mark.at_unix_ms, 0.0));
    let px = plot.strip_coord_spec();
    px.draw(&PathElement::new(
        vec![(x, y_top), (x, y_bottom)],
        color.stroke_width(2),
    ))?;
    if mark.label.is_empty() {
        return Ok(());
    }
    let style = text_style(13, color);
    let (w, h) = px.estimate_text_size(&mark.label, &style)?;
    let (w, h) = (i32::try_from(w).unwrap_or(0), i32::try_from(h).unwrap_or(0));
    let (plot_w, _) = px.dim_in_pixel();
    // Right of the line, or left of it when the label would run off the plot.
    let x_text = if x + 6 + w < i32::try_from(plot_w).unwrap_or(i32::MAX) {
        x + 6
    } else {
        x - 6 - w
    };
    let y = lanes.place(x_text, x_text + w);
    // A white backing keeps the label legible over lines.
    px.draw(&Rectangle::new(
        [(x_text - 3, y - 1), (x_text + w + 3, y + h + 3)],
        WHITE.mix(0.85).filled(),
    ))?;
    px.draw(&Text::new(mark.label.clone(), (x_text, y), style))
}

/// What the legend of one panel lists, decided before drawing so the colours follow it.
struct LegendPlan {
    processes_shown: usize,
    more: usize,
    leak: bool,
    idle: bool,
    gap: bool,
}

impl LegendPlan {
    fn new(panel: &Panel, devices: &[&ChartSeries], processes: usize) -> Self {
        let leak = panel.marks.iter().any(|m| m.kind == MarkKind::LeakOnset);
        let idle = panel.spans.iter().any(|s| s.kind == SpanKind::Idle);
        let gap = panel.spans.iter().any(|s| s.kind == SpanKind::Gap);
        let fixed = devices.len()
            + usize::from(panel.ceiling_bytes.is_some())
            + usize::from(leak)
            + usize::from(idle)
            + usize::from(gap);
        let rows = usize::try_from((PANEL_H as i32 - 40) / LEGEND_ROW_H).unwrap_or(0);
        // At most ten processes: the palette has ten colours, and more names stop being
        // readable at a glance anyway.
        let room = rows.saturating_sub(fixed).min(10);
        let (processes_shown, more) = if processes <= room {
            (processes, 0)
        } else {
            let shown = room.saturating_sub(1);
            (shown, processes - shown)
        };
        Self {
            processes_shown,
            more,
            leak,
            idle,
            gap,
        }
    }
}

enum Swatch {
    Line(RGBColor, u32),
    Filled(RGBColor),
    Dashed(RGBColor),
    Vertical(RGBColor),
    Band(RGBAColor),
    Hatched,
}

fn draw_legend<DB: DrawingBackend>(
    area: &Area<DB>,
    plan: &LegendPlan,
    devices: &[&ChartSeries],
    processes: &[Ranked<'_>],
    panel: &Panel,
) -> Result<(), DB> {
    let mut rows: Vec<(Swatch, String, String)> = Vec::new();
    for (i, device) in devices.iter().enumerate() {
        let color = if i == 0 {
            palette::DEVICE
        } else {
            palette::DEVICE_ALT
        };
        let value = peak(device).map_or_else(String::new, |p| format!("peak {}", format_bytes(p)));
        rows.push((Swatch::Filled(color), device.label.clone(), value));
    }
    if let Some(ceiling) = panel.ceiling_bytes {
        rows.push((
            Swatch::Dashed(palette::CEILING),
            "total memory".to_owned(),
            format_bytes(ceiling),
        ));
    }
    for process in processes.iter().take(plan.processes_shown) {
        let color = process.color.unwrap_or(palette::OTHER);
        let value = process.peak.map_or_else(String::new, format_bytes);
        rows.push((Swatch::Line(color, 3), process.series.label.clone(), value));
    }
    if plan.more > 0 {
        let noun = if plan.more == 1 {
            "process"
        } else {
            "processes"
        };
        rows.push((
            Swatch::Line(palette::OTHER, 1),
            format!("+{} more {noun}", plan.more),
            String::new(),
        ));
    }
    if plan.leak {
        rows.push((
            Swatch::Vertical(palette::LEAK),
            "leak onset".to_owned(),
            String::new(),
        ));
    }
    if plan.idle {
        rows.push((
            Swatch::Band(palette::IDLE.mix(0.35)),
            "idle".to_owned(),
            String::new(),
        ));
    }
    if plan.gap {
        rows.push((Swatch::Hatched, "no data".to_owned(), String::new()));
    }

    let (width, _) = area.dim_in_pixel();
    let width = i32::try_from(width).unwrap_or(0);
    let label_style = text_style(14, palette::INK);
    let value_style = text_style(14, palette::MUTED).pos(Pos::new(HPos::Right, VPos::Top));
    let value_right = width - 14;
    for (i, (swatch, label, value)) in rows.into_iter().enumerate() {
        let y = i32::try_from(PANEL_TITLE_H).unwrap_or(0)
            + 6
            + LEGEND_ROW_H * i32::try_from(i).unwrap_or(0);
        draw_swatch(area, &swatch, (6, y + 2), (26, y + 14))?;
        let value_w = if value.is_empty() {
            0
        } else {
            let (w, _) = area.estimate_text_size(&value, &value_style)?;
            area.draw(&Text::new(value, (value_right, y), value_style.clone()))?;
            i32::try_from(w).unwrap_or(0) + 10
        };
        let room = value_right - value_w - 36;
        let label = fit(area, &label, &label_style, room)?;
        area.draw(&Text::new(label, (36, y), label_style.clone()))?;
    }
    Ok(())
}

fn draw_swatch<DB: DrawingBackend>(
    area: &Area<DB>,
    swatch: &Swatch,
    (x0, y0): (i32, i32),
    (x1, y1): (i32, i32),
) -> Result<(), DB> {
    let mid = (y0 + y1) / 2;
    match *swatch {
        Swatch::Line(color, width) => area.draw(&PathElement::new(
            vec![(x0, mid), (x1, mid)],
            color.stroke_width(width),
        )),
        Swatch::Filled(color) => {
            area.draw(&Rectangle::new(
                [(x0, mid), (x1, y1)],
                color.mix(0.15).filled(),
            ))?;
            area.draw(&PathElement::new(
                vec![(x0, mid), (x1, mid)],
                color.stroke_width(3),
            ))
        }
        Swatch::Dashed(color) => {
            area.draw(&PathElement::new(
                vec![(x0, mid), (x0 + 8, mid)],
                color.stroke_width(2),
            ))?;
            area.draw(&PathElement::new(
                vec![(x0 + 13, mid), (x1, mid)],
                color.stroke_width(2),
            ))
        }
        Swatch::Vertical(color) => {
            let x = (x0 + x1) / 2;
            area.draw(&PathElement::new(
                vec![(x, y0 - 2), (x, y1 + 2)],
                color.stroke_width(2),
            ))
        }
        Swatch::Band(color) => area.draw(&Rectangle::new([(x0, y0), (x1, y1)], color.filled())),
        Swatch::Hatched => {
            area.draw(&Rectangle::new(
                [(x0, y0), (x1, y1)],
                palette::GAP.mix(0.18).filled(),
            ))?;
            for segment in hatch(x0, x1, y0, y1, 5) {
                area.draw(&PathElement::new(
                    segment.to_vec(),
                    palette::GAP.mix(0.9).stroke_width(1),
                ))?;
            }
            Ok(())
        }
    }
}

/// `label` shortened with `…` to fit `room` pixels. A trailing ` [pid]` is kept whole:
/// it tells two runs of one command apart, so the command is cut instead.
fn fit<DB: DrawingBackend>(
    area: &Area<DB>,
    label: &str,
    style: &TextStyle<'_>,
    room: i32,
) -> Result<String, DB> {
    let room = u32::try_from(room.max(0)).unwrap_or(0);
    if area.estimate_text_size(label, style)?.0 <= room {
        return Ok(label.to_owned());
    }
    let (head, tail) = match label.rfind(" [") {
        Some(at) if label.ends_with(']') && label.len() - at <= 12 => label.split_at(at),
        _ => (label, ""),
    };
    let mut chars: Vec<char> = head.chars().collect();
    while !chars.is_empty() {
        chars.pop();
        let candidate: String = chars.iter().collect::<String>().trim_end().to_owned() + "…" + tail;
        if area.estimate_text_size(&candidate, style)?.0 <= room {
            return Ok(candidate);
        }
    }
    Ok("…".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn height_grows_with_panels() {
        assert_eq!(size_px(0), size_px(1));
        let (w1, h1) = size_px(1);
        let (w8, h8) = size_px(8);
        assert_eq!(w1, w8);
        assert_eq!(h8 - h1, 7 * PANEL_H);
        assert_eq!(size_px(usize::MAX).1, u32::MAX);
    }

    #[test]
    fn hatch_stays_inside_the_rectangle() {
        let segments = hatch(10, 60, 20, 50, 7);
        assert!(!segments.is_empty());
        for [(ax, ay), (bx, by)] in segments {
            for (x, y) in [(ax, ay), (bx, by)] {
                assert!((10..=60).contains(&x) && (20..=50).contains(&y), "{x},{y}");
            }
            // 45°: as far across as up.
            assert_eq!(bx - ax, ay - by);
        }
        assert!(hatch(10, 10, 0, 5, 3).is_empty());
    }

    #[test]
    fn label_lanes_stack_overlapping_labels() {
        let mut lanes = LabelLanes::default();
        let first = lanes.place(100, 200);
        assert_eq!(lanes.place(150, 250), first + LabelLanes::ROW_H);
        assert_eq!(lanes.place(300, 400), first);
        for _ in 0..10 {
            lanes.place(100, 200);
        }
        assert!(lanes.rows.len() <= LabelLanes::MAX_ROWS);
    }

    #[test]
    fn legend_caps_thirty_processes() {
        let panel = Panel {
            title: String::new(),
            ceiling_bytes: Some(1),
            series: Vec::new(),
            marks: Vec::new(),
            spans: Vec::new(),
        };
        let plan = LegendPlan::new(&panel, &[], 30);
        assert!(plan.processes_shown >= 5 && plan.processes_shown <= 10);
        assert_eq!(plan.processes_shown + plan.more, 30);
        let plan = LegendPlan::new(&panel, &[], 3);
        assert_eq!((plan.processes_shown, plan.more), (3, 0));
    }
}
