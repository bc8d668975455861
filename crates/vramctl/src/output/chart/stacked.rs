//! Stacked-area charts over a numbered axis, for `vramctl snapshot timeline`: per panel,
//! layers stacked bottom up (the first layer at the bottom), an optional line drawn over
//! them (reserved memory), and marks at chosen x values (OOM events, `--at`). The same
//! font, palette, memory axis and PNG path as the time charts of `vramctl plot`.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::memory_axis::{MemoryAxis, format_bytes};
use super::palette;

const WIDTH: u32 = 1400;
const TITLE_H: u32 = 52;
const PANEL_H: u32 = 440;
const LEGEND_W: u32 = 420;
const LEGEND_ROW_H: i32 = 21;
const FONT_FAMILY: &str = "sans-serif";
/// Panels beyond this make an image no viewer shows at a glance (one per device).
pub const MAX_PANELS: usize = 64;

/// A whole chart: a title and panels stacked vertically.
#[derive(Debug, Clone)]
pub struct StackedChart {
    pub title: String,
    pub panels: Vec<StackedPanel>,
}

/// One panel: `x` values and, for each layer, a value per x.
#[derive(Debug, Clone)]
pub struct StackedPanel {
    pub title: String,
    /// What the x axis counts (`trace event`).
    pub x_desc: String,
    pub x: Vec<i64>,
    /// Bottom first. The last layer may be the rest ("other"): drawn grey.
    pub layers: Vec<Layer>,
    /// Whether the last layer is the rest, drawn grey.
    pub last_is_rest: bool,
    /// Drawn over the layers as a dark line.
    pub line: Option<Layer>,
    pub marks: Vec<StackedMark>,
}

#[derive(Debug, Clone)]
pub struct Layer {
    pub label: String,
    /// Bytes, one per x.
    pub values: Vec<u64>,
}

#[derive(Debug, Clone)]
pub struct StackedMark {
    pub x: i64,
    pub label: String,
    /// Red (an OOM) or dark (a chosen event).
    pub alarm: bool,
}

impl StackedChart {
    pub fn size_px(&self) -> (u32, u32) {
        let panels = u32::try_from(self.panels.len().max(1)).unwrap_or(u32::MAX);
        (
            WIDTH,
            panels.saturating_mul(PANEL_H).saturating_add(TITLE_H + 12),
        )
    }
}

/// Draws `chart` to `path`, as PNG or SVG by the file's extension.
pub fn render_stacked(chart: &StackedChart, path: &std::path::Path) -> anyhow::Result<()> {
    if chart.panels.len() > MAX_PANELS {
        anyhow::bail!(
            "cannot draw {} devices in one chart (at most {MAX_PANELS})",
            chart.panels.len()
        );
    }
    super::render_to(chart, path)
}

impl super::Drawing for StackedChart {
    fn size_px(&self) -> (u32, u32) {
        StackedChart::size_px(self)
    }
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        draw_all(root, self)
    }
}

fn draw_all<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: &StackedChart,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    draw(root, chart)
        .and_then(|()| root.present())
        .map_err(|e| anyhow::anyhow!("cannot draw chart: {e}"))
}

fn text_style(size: u32, color: RGBColor) -> TextStyle<'static> {
    TextStyle {
        font: (FONT_FAMILY, f64::from(size)).into_font(),
        color: color.to_backend_color(),
        pos: Pos::new(HPos::Left, VPos::Top),
    }
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &StackedChart) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let (header, body) = root.split_vertically(TITLE_H);
    header.draw(&Text::new(
        chart.title.clone(),
        (16, 16),
        text_style(24, palette::INK),
    ))?;
    if chart.panels.is_empty() {
        return Ok(());
    }
    for (panel, area) in chart
        .panels
        .iter()
        .zip(body.split_evenly((chart.panels.len(), 1)))
    {
        draw_panel(&area, panel)?;
    }
    Ok(())
}

fn layer_colors(panel: &StackedPanel) -> Vec<RGBColor> {
    let named = if panel.last_is_rest {
        panel.layers.len().saturating_sub(1)
    } else {
        panel.layers.len()
    };
    let mut colors = palette::assign(panel.layers[..named].iter().map(|l| l.label.as_str()));
    colors.resize(panel.layers.len(), palette::OTHER);
    colors
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &StackedPanel,
) -> DrawResult<DB> {
    let (plot_side, legend_side) = area.split_horizontally(WIDTH - LEGEND_W);
    let (title_strip, plot_side) = plot_side.split_vertically(30);
    title_strip.draw(&Text::new(
        panel.title.clone(),
        (90, 8),
        text_style(18, palette::INK),
    ))?;
    let n = panel.x.len();
    // Running sums, bottom up: tops[k][i] is the top of layer k at x i.
    let mut tops: Vec<Vec<u64>> = Vec::with_capacity(panel.layers.len());
    for layer in &panel.layers {
        let below = tops.last().cloned().unwrap_or_else(|| vec![0; n]);
        tops.push(
            (0..n)
                .map(|i| below[i].saturating_add(layer.values.get(i).copied().unwrap_or(0)))
                .collect(),
        );
    }
    let stack_max = tops
        .last()
        .and_then(|t| t.iter().max().copied())
        .unwrap_or(0);
    let line_max = panel
        .line
        .as_ref()
        .and_then(|l| l.values.iter().max().copied())
        .unwrap_or(0);
    #[allow(clippy::cast_precision_loss)]
    let memory = MemoryAxis::plan(stack_max.max(line_max) as f64, 8);
    let x0 = panel.x.first().copied().unwrap_or(0);
    let x1 = panel.x.last().copied().unwrap_or(0).max(x0 + 1);
    let mut cc = ChartBuilder::on(&plot_side)
        .margin_left(12)
        .margin_right(18)
        .margin_top(4)
        .x_label_area_size(52)
        .y_label_area_size(78)
        .build_cartesian_2d(x0..x1, memory.clone())?;
    cc.configure_mesh()
        .bold_line_style(BLACK.mix(0.08))
        .light_line_style(TRANSPARENT)
        .axis_style(palette::MUTED.mix(0.6))
        .label_style(text_style(14, palette::MUTED))
        .x_labels(10)
        .y_labels(100)
        .x_desc(panel.x_desc.clone())
        .axis_desc_style(text_style(14, palette::MUTED))
        .draw()?;
    let colors = layer_colors(panel);
    for (k, color) in colors.iter().enumerate() {
        let mut outline: Vec<(i64, f64)> = (0..n)
            .map(|i| (panel.x[i], memory.value(tops[k][i])))
            .collect();
        outline.extend((0..n).rev().map(|i| {
            let below = if k == 0 { 0 } else { tops[k - 1][i] };
            (panel.x[i], memory.value(below))
        }));
        if n > 1 {
            cc.draw_series(std::iter::once(Polygon::new(
                outline,
                color.mix(0.85).filled(),
            )))?;
        }
    }
    if let Some(line) = &panel.line {
        let points: Vec<(i64, f64)> = (0..n)
            .map(|i| {
                (
                    panel.x[i],
                    memory.value(line.values.get(i).copied().unwrap_or(0)),
                )
            })
            .collect();
        cc.draw_series(std::iter::once(PathElement::new(
            points,
            palette::CEILING.stroke_width(2),
        )))?;
    }
    for mark in &panel.marks {
        let color = if mark.alarm {
            palette::LEAK
        } else {
            palette::INK
        };
        cc.draw_series(std::iter::once(PathElement::new(
            vec![(mark.x, 0.0), (mark.x, memory.top())],
            color.stroke_width(2),
        )))?;
        cc.draw_series(std::iter::once(Text::new(
            mark.label.clone(),
            (mark.x, memory.top()),
            text_style(13, color).pos(Pos::new(HPos::Right, VPos::Top)),
        )))?;
    }

    // Legend: the line, then the layers top down (as they are stacked on screen).
    let mut rows: Vec<(RGBColor, bool, String, String)> = Vec::new();
    if let Some(line) = &panel.line {
        let peak = line.values.iter().max().copied().unwrap_or(0);
        rows.push((
            palette::CEILING,
            true,
            line.label.clone(),
            format!("peak {}", format_bytes(peak)),
        ));
    }
    for (layer, color) in panel.layers.iter().zip(&colors).rev() {
        let peak = layer.values.iter().max().copied().unwrap_or(0);
        rows.push((*color, false, layer.label.clone(), format_bytes(peak)));
    }
    let value_style = text_style(14, palette::MUTED).pos(Pos::new(HPos::Right, VPos::Top));
    let label_style = text_style(13, palette::INK);
    let (legend_w, _) = legend_side.dim_in_pixel();
    let right = i32::try_from(legend_w).unwrap_or(0) - 14;
    for (i, (color, is_line, label, value)) in rows.into_iter().enumerate() {
        let y = 36 + LEGEND_ROW_H * i32::try_from(i).unwrap_or(0);
        if is_line {
            legend_side.draw(&PathElement::new(
                vec![(6, y + 8), (26, y + 8)],
                color.stroke_width(2),
            ))?;
        } else {
            legend_side.draw(&Rectangle::new(
                [(6, y + 2), (26, y + 14)],
                color.mix(0.85).filled(),
            ))?;
        }
        legend_side.draw(&Text::new(value, (right, y), value_style.clone()))?;
        // Long stacks are cut from the end: their innermost user frame comes first.
        let room_chars = 44;
        let shown = if label.chars().count() > room_chars {
            label.chars().take(room_chars - 1).collect::<String>() + "…"
        } else {
            label
        };
        legend_side.draw(&Text::new(shown, (34, y), label_style.clone()))?;
    }
    Ok(())
}
