//! Memory-over-time charts for `vramctl plot`, as PNG or SVG, and the stacked-area charts
//! of `vramctl snapshot timeline` ([`stacked`]).
//!
//! The caller (`cmd/plot.rs`) turns history into a [`Chart`]: one [`Panel`] per device with
//! the device's used memory, its processes, leak-onset marks and idle or gap spans. This
//! module only draws: panels stacked vertically on one time axis in local time, memory in
//! GiB under a dashed ceiling at the device total, a legend capped to the largest processes.
//!
//! Text is drawn with an embedded DejaVu Sans subset (`assets/fonts/`) through plotters'
//! `ab_glyph` feature, so rendering needs no system fonts and no fontconfig.

mod downsample;
mod draw;
mod memory_axis;
mod palette;
mod raster;
mod stacked;
mod time_axis;

pub use stacked::{Layer, StackedChart, StackedMark, StackedPanel, render_stacked};

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Context as _, bail};
use plotters::prelude::{BitMapBackend, DrawingBackend, IntoDrawingArea, SVGBackend};

/// A whole chart: a title and panels stacked vertically, sharing one time axis.
#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    /// The zone tick labels are shown in; the user's local zone in `plot`, UTC in tests.
    pub time_zone: jiff::tz::TimeZone,
    pub panels: Vec<Panel>,
}

/// One device (or any group of series sharing a ceiling).
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    /// Total memory, drawn as a dashed line; `None` when the device did not report it.
    pub ceiling_bytes: Option<u64>,
    pub series: Vec<ChartSeries>,
    pub marks: Vec<ChartMark>,
    pub spans: Vec<ChartSpan>,
}

/// A line over time.
#[derive(Debug, Clone)]
pub struct ChartSeries {
    pub label: String,
    pub kind: SeriesKind,
    /// `(unix ms, bytes)`; `None` is a gap and breaks the line.
    pub points: Vec<(i64, Option<u64>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesKind {
    /// The device's used memory: bold, filled below.
    Device,
    /// One process: a thin line in its own colour.
    Process,
}

/// An instant worth pointing at: a vertical line with a short label.
#[derive(Debug, Clone)]
pub struct ChartMark {
    pub at_unix_ms: i64,
    pub label: String,
    pub kind: MarkKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkKind {
    /// Where a leak began (red).
    LeakOnset,
}

/// A stretch of time: a shaded band with a label.
#[derive(Debug, Clone)]
pub struct ChartSpan {
    pub from_unix_ms: i64,
    pub to_unix_ms: i64,
    pub label: String,
    pub kind: SpanKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// A process held memory without using the GPU (grey band).
    Idle,
    /// No samples: the recorder was down or the device was lost (hatched band).
    Gap,
}

impl Chart {
    /// The size the chart is drawn at, in pixels: a fixed width, and a height that grows
    /// with the number of panels.
    pub fn size_px(&self) -> (u32, u32) {
        draw::size_px(self.panels.len())
    }
}

/// The embedded face, registered once as plotters' `sans-serif` family.
static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-subset.ttf");

fn register_font() -> anyhow::Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, FONT)
            .is_ok()
    });
    if ok {
        Ok(())
    } else {
        bail!("the embedded chart font cannot be read; this is a bug in this build of vramctl")
    }
}

/// More panels than this make an image tens of thousands of pixels tall that no viewer
/// shows at a glance (and a PNG buffer of hundreds of megabytes).
pub const MAX_PANELS: usize = 64;

fn check_size(chart: &Chart) -> anyhow::Result<()> {
    if chart.panels.len() > MAX_PANELS {
        bail!(
            "cannot draw {} devices in one chart (at most {MAX_PANELS}); pick devices with --gpu",
            chart.panels.len()
        );
    }
    Ok(())
}

/// What can be drawn on any plotters backend: `plot`'s `Chart` and `snapshot timeline`'s
/// `StackedChart`, so both go through one SVG, one PNG and one file path.
pub(crate) trait Drawing {
    fn size_px(&self) -> (u32, u32);
    fn draw_on<DB: DrawingBackend>(
        &self,
        root: &plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    ) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static;
}

impl Drawing for Chart {
    fn size_px(&self) -> (u32, u32) {
        Chart::size_px(self)
    }
    fn draw_on<DB: DrawingBackend>(
        &self,
        root: &plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    ) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        draw_on(root, self)
    }
}

/// Draws `chart` to `path`, as PNG or SVG by the file's extension.
pub fn render(chart: &Chart, path: &Path) -> anyhow::Result<()> {
    check_size(chart)?;
    render_to(chart, path)
}

/// Draws any drawing to `path`, as PNG or SVG by the file's extension.
pub(crate) fn render_to(chart: &impl Drawing, path: &Path) -> anyhow::Result<()> {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let bytes = match extension.as_deref() {
        Some("svg") => svg_of(chart)?.into_bytes(),
        Some("png") => png_of(chart)?,
        Some(other) => bail!(
            "cannot draw a chart as '.{other}' ('{}'); use a file name ending in .png or .svg",
            path.display()
        ),
        None => bail!(
            "cannot tell the chart format of '{}'; use a file name ending in .png or .svg",
            path.display()
        ),
    };
    std::fs::write(path, bytes)
        .with_context(|| format!("cannot write chart to '{}'", path.display()))
}

/// The chart as an SVG document, for the tests (`render` writes the files).
#[cfg(test)]
pub fn render_svg(chart: &Chart) -> anyhow::Result<String> {
    check_size(chart)?;
    svg_of(chart)
}

/// The chart as a PNG file's bytes, for the tests (`render` writes the files).
#[cfg(test)]
pub fn render_png(chart: &Chart) -> anyhow::Result<Vec<u8>> {
    check_size(chart)?;
    png_of(chart)
}

fn svg_of(chart: &impl Drawing) -> anyhow::Result<String> {
    register_font()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, chart.size_px()).into_drawing_area();
        chart.draw_on(&root)?;
    }
    Ok(svg)
}

fn png_of(chart: &impl Drawing) -> anyhow::Result<Vec<u8>> {
    register_font()?;
    let (width, height) = chart.size_px();
    let len = usize::try_from(u64::from(width) * u64::from(height) * 3)
        .context("chart too large to draw")?;
    let mut rgb = vec![0u8; len];
    {
        let bitmap = BitMapBackend::with_buffer(&mut rgb, (width, height));
        let root = raster::GlyphBitMap::new(bitmap, FONT)
            .context(
                "the embedded chart font cannot be read; this is a bug in this build of vramctl",
            )?
            .into_drawing_area();
        chart.draw_on(&root)?;
    }
    let mut png_bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut png_bytes, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder
        .write_header()
        .and_then(|mut writer| writer.write_image_data(&rgb))
        .context("cannot encode chart as PNG")?;
    Ok(png_bytes)
}

fn draw_on<DB: DrawingBackend>(
    root: &plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    chart: &Chart,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    draw::chart(root, chart)
        .and_then(|()| root.present())
        .map_err(|e| anyhow::anyhow!("cannot draw chart: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::tz::TimeZone;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    /// 2026-11-03T13:00:00Z.
    const T0: i64 = 1_793_710_800_000;
    /// An H200's total memory as NVML reports it.
    const H200_TOTAL: u64 = 150_754_820_096;

    fn series(label: &str, kind: SeriesKind, points: Vec<(i64, Option<u64>)>) -> ChartSeries {
        ChartSeries {
            label: label.to_owned(),
            kind,
            points,
        }
    }

    fn panel(title: &str, series: Vec<ChartSeries>) -> Panel {
        Panel {
            title: title.to_owned(),
            ceiling_bytes: Some(H200_TOTAL),
            series,
            marks: Vec::new(),
            spans: Vec::new(),
        }
    }

    fn chart(panels: Vec<Panel>) -> Chart {
        Chart {
            title: "GPU memory".to_owned(),
            time_zone: TimeZone::UTC,
            panels,
        }
    }

    /// Deterministic noise in `-1.0..1.0` (an LCG), so the sample looks measured.
    fn noise(seed: &mut u64) -> f64 {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        #[allow(clippy::cast_precision_loss)]
        let unit = (*seed >> 11) as f64 / (1u64 << 53) as f64;
        unit * 2.0 - 1.0
    }

    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn gib(value: f64) -> u64 {
        (value * GIB as f64) as u64
    }

    /// Two hours on an H200 every 5 s: a steady trainer, a job that starts leaking at
    /// 13:40, an idle notebook holding 12 GiB, an inference server's sawtooth, and the
    /// recorder down 14:20–14:26. A second H200 carries 30 small processes.
    fn sample_chart(time_zone: TimeZone) -> Chart {
        let step_ms = 5_000;
        let times: Vec<i64> = (0..1_440).map(|i| T0 + i * step_ms).collect();
        let gap = (T0 + 80 * 60_000)..(T0 + 86 * 60_000);
        let leak_at = T0 + 40 * 60_000;
        let mut seed = 7;
        let mut trainer = Vec::new();
        let mut leaker = Vec::new();
        let mut holder = Vec::new();
        let mut server = Vec::new();
        for &t in &times {
            let minutes = (t - T0) as f64 / 60_000.0;
            let trainer_gib = if minutes < 3.0 {
                62.0 * minutes / 3.0
            } else {
                62.0 + 0.4 * noise(&mut seed)
            };
            let leaker_gib = 8.0
                + if t >= leak_at {
                    (t - leak_at) as f64 / 1000.0 * 2.0 / 1024.0
                } else {
                    0.0
                };
            let holder_gib = if minutes < 5.0 { None } else { Some(12.0) };
            let server_gib = 3.0 + 6.0 * ((minutes % 7.0) / 7.0);
            let present = !gap.contains(&t);
            trainer.push((t, present.then(|| gib(trainer_gib))));
            leaker.push((t, present.then(|| gib(leaker_gib))));
            holder.push((t, if present { holder_gib.map(gib) } else { None }));
            server.push((t, present.then(|| gib(server_gib))));
        }
        let used: Vec<(i64, Option<u64>)> = times
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let parts = [&trainer, &leaker, &holder, &server];
                let sum = parts.iter().try_fold(0u64, |acc, s| match s[i].1 {
                    Some(b) => Some(acc + b),
                    None if s[i].0 < T0 + 5 * 60_000 => Some(acc),
                    None => None,
                });
                (t, sum.map(|s| s + 600 * MIB))
            })
            .collect();

        let gpu0 = Panel {
            title: "GPU 0 · NVIDIA H200 · GPU-5e4b1c2a".to_owned(),
            ceiling_bytes: Some(H200_TOTAL),
            series: vec![
                series("used (device)", SeriesKind::Device, used),
                series(
                    "python train.py --model llama-8b [4711]",
                    SeriesKind::Process,
                    trainer,
                ),
                series(
                    "python eval_loop.py --cache-all [5120]",
                    SeriesKind::Process,
                    leaker,
                ),
                series(
                    "ipykernel_launcher -f kernel-3f2a.json [912]",
                    SeriesKind::Process,
                    holder,
                ),
                series(
                    "tritonserver --model-repository=/models [2231]",
                    SeriesKind::Process,
                    server,
                ),
            ],
            marks: vec![ChartMark {
                at_unix_ms: leak_at,
                label: "leak: eval_loop.py +2.0 MiB/s".to_owned(),
                kind: MarkKind::LeakOnset,
            }],
            spans: vec![
                ChartSpan {
                    from_unix_ms: T0 + 10 * 60_000,
                    to_unix_ms: T0 + 120 * 60_000,
                    label: "idle: ipykernel [912] holds 12 GiB".to_owned(),
                    kind: SpanKind::Idle,
                },
                ChartSpan {
                    from_unix_ms: gap.start,
                    to_unix_ms: gap.end,
                    label: "recorder stopped".to_owned(),
                    kind: SpanKind::Gap,
                },
            ],
        };

        let mut crowd = Vec::new();
        for p in 0..30u32 {
            let base = 0.4 + f64::from(p) * 0.22;
            let points = times
                .iter()
                .map(|&t| (t, Some(gib(base + 0.15 * noise(&mut seed)))))
                .collect();
            crowd.push(series(
                &format!("worker --shard {p} [{}]", 7000 + p),
                SeriesKind::Process,
                points,
            ));
        }
        let crowd_used = times
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, crowd.iter().map(|s| s.points[i].1).sum::<Option<u64>>()))
            .collect();
        let mut gpu1_series = vec![series("used (device)", SeriesKind::Device, crowd_used)];
        gpu1_series.extend(crowd);
        let gpu1 = Panel {
            title: "GPU 1 · NVIDIA H200 · GPU-9d07e6f1".to_owned(),
            ceiling_bytes: Some(H200_TOTAL),
            series: gpu1_series,
            marks: Vec::new(),
            spans: Vec::new(),
        };

        Chart {
            title: "GPU memory on gpu-node-07".to_owned(),
            time_zone,
            panels: vec![gpu0, gpu1],
        }
    }

    fn decode_png(bytes: &[u8]) -> (png::OutputInfo, Vec<u8>) {
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        buf.truncate(info.buffer_size());
        (info, buf)
    }

    #[test]
    fn svg_has_title_legend_units_and_marks() {
        let svg = render_svg(&sample_chart(TimeZone::UTC)).unwrap();
        for needle in [
            "GPU memory on gpu-node-07",
            "GPU 0 · NVIDIA H200 · GPU-5e4b1c2a",
            "used (device)",
            "python train.py",
            "[4711]",
            "total memory",
            "total 140.4 GiB",
            "20 GiB",
            "leak: eval_loop.py +2.0 MiB/s",
            "idle: ipykernel [912] holds 12 GiB",
            "recorder stopped",
            "leak onset",
            "+21 more processes",
            "14:00",
            "time (UTC) · 2026-11-03",
        ] {
            assert!(svg.contains(needle), "SVG lacks {needle:?}");
        }
    }

    #[test]
    fn png_decodes_at_the_chart_size_and_is_not_blank() {
        let chart = sample_chart(TimeZone::UTC);
        let bytes = render_png(&chart).unwrap();
        let (info, pixels) = decode_png(&bytes);
        assert_eq!((info.width, info.height), chart.size_px());
        assert_eq!(info.color_type, png::ColorType::Rgb);
        let white = pixels.chunks(3).filter(|p| p == &[255, 255, 255]).count();
        let total = pixels.len() / 3;
        // White background with a good share of drawing on it, and red for the leak mark.
        assert!(
            white < total * 95 / 100 && white > total / 5,
            "{white} of {total}"
        );
        assert!(pixels.chunks(3).any(|p| p == [0xd6, 0x27, 0x28]));
        let colours: std::collections::HashSet<&[u8]> = pixels.chunks(3).collect();
        assert!(colours.len() > 100, "{}", colours.len());
    }

    #[test]
    fn render_picks_the_format_from_the_extension() {
        let dir = tempfile::tempdir().unwrap();
        let chart = chart(vec![panel(
            "GPU 0",
            vec![series(
                "used",
                SeriesKind::Device,
                vec![(T0, Some(GIB)), (T0 + 1000, Some(2 * GIB))],
            )],
        )]);
        let png_path = dir.path().join("chart.PNG");
        render(&chart, &png_path).unwrap();
        assert!(
            std::fs::read(&png_path)
                .unwrap()
                .starts_with(b"\x89PNG\r\n\x1a\n")
        );
        let svg_path = dir.path().join("chart.svg");
        render(&chart, &svg_path).unwrap();
        assert!(
            std::fs::read_to_string(&svg_path)
                .unwrap()
                .starts_with("<svg")
        );
    }

    #[test]
    fn unknown_extension_is_a_one_line_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let chart = chart(Vec::new());
        let err = render(&chart, &dir.path().join("chart.jpg")).unwrap_err();
        let message = format!("{err:#}");
        assert!(message.contains("'.jpg'"), "{message}");
        assert!(message.contains(".png or .svg"), "{message}");
        assert!(!message.contains('\n'));
        let err = render(&chart, &dir.path().join("chart")).unwrap_err();
        assert!(format!("{err:#}").contains(".png or .svg"));
        assert!(!dir.path().join("chart.jpg").exists());
    }

    #[test]
    fn too_many_panels_is_an_error_not_a_huge_allocation() {
        let many = chart(
            (0..=MAX_PANELS)
                .map(|i| panel(&format!("GPU {i}"), Vec::new()))
                .collect(),
        );
        let err = render_png(&many).unwrap_err();
        assert!(format!("{err:#}").contains("--gpu"), "{err:#}");
        assert!(render_svg(&many).is_err());
    }

    #[test]
    fn unwritable_path_is_an_error_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("chart.svg");
        let err = render(&chart(Vec::new()), &path).unwrap_err();
        assert!(
            format!("{err:#}").contains("cannot write chart to"),
            "{err:#}"
        );
    }

    /// Renders both formats; the edge cases below must draw without error or panic.
    fn renders(chart: &Chart) {
        let svg = render_svg(chart).unwrap();
        assert!(svg.contains(&chart.title));
        let (info, _) = decode_png(&render_png(chart).unwrap());
        assert_eq!((info.width, info.height), chart.size_px());
    }

    #[test]
    fn edge_cases_render() {
        // No panels at all.
        renders(&chart(Vec::new()));
        // A panel with no series, one with only gaps, one with no ceiling.
        renders(&chart(vec![
            panel("empty", Vec::new()),
            panel(
                "gaps",
                vec![series(
                    "used",
                    SeriesKind::Device,
                    vec![(T0, None), (T0 + 1, None)],
                )],
            ),
            Panel {
                ceiling_bytes: None,
                ..panel(
                    "no total",
                    vec![series("p", SeriesKind::Process, vec![(T0, Some(GIB))])],
                )
            },
        ]));
        // One point; all values equal; all zero; zero-length time span.
        renders(&chart(vec![panel(
            "one",
            vec![series(
                "used",
                SeriesKind::Device,
                vec![(T0, Some(5 * GIB))],
            )],
        )]));
        renders(&chart(vec![panel(
            "flat",
            vec![series(
                "used",
                SeriesKind::Device,
                (0..100).map(|i| (T0 + i * 1000, Some(7 * GIB))).collect(),
            )],
        )]));
        renders(&chart(vec![Panel {
            ceiling_bytes: Some(0),
            ..panel(
                "zero",
                vec![series(
                    "used",
                    SeriesKind::Device,
                    vec![(T0, Some(0)), (T0 + 1000, Some(0))],
                )],
            )
        }]));
        renders(&chart(vec![panel(
            "same instant",
            vec![series(
                "used",
                SeriesKind::Device,
                vec![(T0, Some(GIB)), (T0, Some(2 * GIB))],
            )],
        )]));
        // u64-scale values and a ceiling below the data.
        renders(&chart(vec![Panel {
            ceiling_bytes: Some(GIB),
            ..panel(
                "huge",
                vec![series(
                    "used",
                    SeriesKind::Device,
                    vec![(T0, Some(u64::MAX)), (T0 + 1000, Some(u64::MAX / 2))],
                )],
            )
        }]));
        // Marks and spans outside the data, reversed and zero-length spans, empty labels.
        renders(&chart(vec![Panel {
            marks: vec![ChartMark {
                at_unix_ms: T0 - 3_600_000,
                label: String::new(),
                kind: MarkKind::LeakOnset,
            }],
            spans: vec![
                ChartSpan {
                    from_unix_ms: T0 + 5000,
                    to_unix_ms: T0,
                    label: "reversed".to_owned(),
                    kind: SpanKind::Idle,
                },
                ChartSpan {
                    from_unix_ms: T0,
                    to_unix_ms: T0,
                    label: String::new(),
                    kind: SpanKind::Gap,
                },
            ],
            ..panel(
                "odd",
                vec![series(
                    "used",
                    SeriesKind::Device,
                    vec![(T0, Some(GIB)), (T0 + 10_000, Some(GIB))],
                )],
            )
        }]));
        // Extreme timestamps.
        renders(&chart(vec![panel(
            "ancient",
            vec![series(
                "used",
                SeriesKind::Device,
                vec![(i64::MIN, Some(GIB)), (i64::MAX, Some(GIB))],
            )],
        )]));
        // A label longer than the legend and one outside the embedded font's subset.
        renders(&chart(vec![panel(
            "labels",
            vec![
                series(
                    &"a very long command line ".repeat(20),
                    SeriesKind::Process,
                    vec![(T0, Some(GIB)), (T0 + 1, Some(GIB))],
                ),
                series(
                    "训练 [1]",
                    SeriesKind::Process,
                    vec![(T0, Some(GIB)), (T0 + 1, Some(GIB))],
                ),
            ],
        )]));
    }

    #[test]
    fn thousands_of_points_and_eight_panels_of_thirty_series_render() {
        let day_at_one_second: Vec<(i64, Option<u64>)> = (0..86_400)
            .map(|i| {
                (
                    T0 + i * 1000,
                    Some(GIB + u64::try_from(i % 977).unwrap() * MIB),
                )
            })
            .collect();
        let panel_with_thirty = |n: usize| {
            let mut series_list = vec![series(
                "used",
                SeriesKind::Device,
                day_at_one_second.clone(),
            )];
            series_list.extend((0..29).map(|p| {
                series(
                    &format!("proc {p} on {n}"),
                    SeriesKind::Process,
                    day_at_one_second[..20_000].to_vec(),
                )
            }));
            panel(&format!("GPU {n}"), series_list)
        };
        let chart = chart((0..8).map(panel_with_thirty).collect());
        let svg = render_svg(&chart).unwrap();
        assert!(svg.contains("GPU 7"));
        // Downsampling bounds the output: 240 series × a day at 1 s would be millions of
        // coordinates; at most 4 per pixel column per series remain.
        assert!(svg.len() < 40_000_000, "{}", svg.len());
        let (info, _) = decode_png(&render_png(&chart).unwrap());
        assert_eq!((info.width, info.height), chart.size_px());
    }

    #[test]
    fn legend_lists_the_largest_processes_and_counts_the_rest() {
        let processes = (0..30u64)
            .map(|p| {
                series(
                    &format!("proc-{p:02}"),
                    SeriesKind::Process,
                    vec![(T0, Some(p * GIB)), (T0 + 1000, Some(p * GIB))],
                )
            })
            .collect();
        let svg = render_svg(&chart(vec![panel("GPU 0", processes)])).unwrap();
        assert!(svg.contains("proc-29"));
        assert!(!svg.contains("proc-00"));
        let shown = (0..30)
            .filter(|p| svg.contains(&format!("proc-{p:02}")))
            .count();
        assert!(
            svg.contains(&format!("+{} more processes", 30 - shown)),
            "{shown} shown"
        );
    }

    #[test]
    fn small_svg_snapshot() {
        let chart = Chart {
            title: "snapshot".to_owned(),
            time_zone: TimeZone::UTC,
            panels: vec![Panel {
                title: "GPU 0 · H200".to_owned(),
                ceiling_bytes: Some(H200_TOTAL),
                series: vec![
                    series(
                        "used",
                        SeriesKind::Device,
                        vec![
                            (T0, Some(10 * GIB)),
                            (T0 + 60_000, Some(40 * GIB)),
                            (T0 + 120_000, None),
                            (T0 + 180_000, Some(41 * GIB)),
                        ],
                    ),
                    series(
                        "train.py [42]",
                        SeriesKind::Process,
                        vec![
                            (T0, Some(9 * GIB)),
                            (T0 + 60_000, Some(39 * GIB)),
                            (T0 + 180_000, Some(40 * GIB)),
                        ],
                    ),
                ],
                marks: vec![ChartMark {
                    at_unix_ms: T0 + 30_000,
                    label: "leak".to_owned(),
                    kind: MarkKind::LeakOnset,
                }],
                spans: vec![ChartSpan {
                    from_unix_ms: T0 + 100_000,
                    to_unix_ms: T0 + 160_000,
                    label: "gap".to_owned(),
                    kind: SpanKind::Gap,
                }],
            }],
        };
        insta::assert_snapshot!(render_svg(&chart).unwrap());
    }

    /// Writes `target/chart-sample.png` and `.svg` for a person to look at:
    /// `cargo test -p vramctl chart_sample -- --ignored`.
    #[test]
    #[ignore = "writes target/chart-sample.{png,svg} to look at"]
    fn chart_sample() {
        let tz = TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        let chart = sample_chart(tz);
        let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
        render(&chart, &target.join("chart-sample.png")).unwrap();
        render(&chart, &target.join("chart-sample.svg")).unwrap();
        let edges = Chart {
            title: "edge cases".to_owned(),
            time_zone: TimeZone::UTC,
            panels: vec![
                panel("no series", Vec::new()),
                panel(
                    "one point",
                    vec![series(
                        "used",
                        SeriesKind::Device,
                        vec![(T0, Some(5 * GIB))],
                    )],
                ),
                Panel {
                    ceiling_bytes: None,
                    ..panel(
                        "small, no total",
                        vec![series(
                            "tiny [1]",
                            SeriesKind::Process,
                            vec![(T0, Some(3 * MIB)), (T0 + 50_000, Some(300 * MIB))],
                        )],
                    )
                },
                Panel {
                    ceiling_bytes: Some(GIB),
                    ..panel(
                        "huge",
                        vec![series(
                            "used",
                            SeriesKind::Device,
                            vec![(T0, Some(u64::MAX)), (T0 + 60_000, Some(u64::MAX / 2))],
                        )],
                    )
                },
            ],
        };
        render(&edges, &target.join("chart-sample-edges.png")).unwrap();
    }
}
