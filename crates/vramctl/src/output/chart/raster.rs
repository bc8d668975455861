//! The PNG backend: plotters' bitmap backend with text drawn here.
//!
//! plotters 0.3.7 rasterizes `ab_glyph` text without each glyph's side bearing and with its
//! own baseline, which spaces letters unevenly ("pyth on") and lifts periods to mid-height
//! ("140·4"). This wrapper lays glyphs out on a real baseline with ab_glyph directly and
//! anchors text as the SVG backend does (same em size, same baseline offsets), so a PNG and
//! an SVG of one chart look alike.
//!
//! It also strokes wide lines segment by segment: plotters joins the segments of a wide
//! path with unlimited miters, so a sawtooth's sharp turns grow spikes many pixels tall,
//! which on a memory chart read as allocations that never happened. SVG viewers limit
//! miters themselves. Everything else is passed to the bitmap backend.

use ab_glyph::{Font, FontRef, GlyphId, PxScale, ScaleFont, point};
use plotters::prelude::BitMapBackend;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
    FontTransform,
};

type BitMapError = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

/// plotters' SVG backend writes `font-size` as the style's size divided by this.
const SVG_SIZE_DIVISOR: f64 = 1.24;

pub(crate) struct GlyphBitMap<'a> {
    inner: BitMapBackend<'a>,
    font: FontRef<'static>,
}

impl<'a> GlyphBitMap<'a> {
    /// `None` when `font` is not a font ab_glyph can read.
    pub(crate) fn new(inner: BitMapBackend<'a>, font: &'static [u8]) -> Option<Self> {
        let font = FontRef::try_from_slice(font).ok()?;
        Some(Self { inner, font })
    }
}

/// Em size and ab_glyph scale for a plotters font size.
fn scale_for(font: &FontRef<'_>, size: f64) -> (f32, PxScale) {
    // f64 → f32: font sizes are tens of pixels.
    #[allow(clippy::cast_possible_truncation)]
    let em = (size / SVG_SIZE_DIVISOR) as f32;
    let units_per_em = font.units_per_em().unwrap_or(2048.0);
    // ab_glyph scales by ascent − descent, not by the em.
    (
        em,
        PxScale::from(em * font.height_unscaled() / units_per_em),
    )
}

/// Advance width of `text` with kerning, in pixels.
fn advance<F: Font, S: ScaleFont<F>>(font: &S, text: &str) -> f32 {
    let mut width = 0.0;
    let mut previous: Option<GlyphId> = None;
    for c in text.chars() {
        let id = font.glyph_id(c);
        if let Some(p) = previous {
            width += font.kern(p, id);
        }
        width += font.h_advance(id);
        previous = Some(id);
    }
    width
}

impl DrawingBackend for GlyphBitMap<'_> {
    type ErrorType = BitMapError;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        if style.stroke_width() <= 1 {
            return self.inner.draw_path(path, style);
        }
        let mut points: Vec<BackendCoord> = path.into_iter().collect();
        points.dedup();
        let radius = style.stroke_width() / 2;
        for (i, pair) in points.windows(2).enumerate() {
            self.inner.draw_path(pair.iter().copied(), style)?;
            // A round join in place of the miter; none at the ends.
            if i > 0 && radius > 0 {
                self.inner.draw_circle(pair[0], radius, style, true)?;
            }
        }
        Ok(())
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<Self::ErrorType>> {
        let (_, scale) = scale_for(&self.font, style.size());
        let font = self.font.as_scaled(scale);
        // Saturating casts of small positive pixel counts.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let size = (
            advance(&font, text).ceil() as u32,
            font.height().ceil() as u32,
        );
        Ok(size)
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        if !matches!(style.transform(), FontTransform::None) {
            // Rotated text (unused by the charts) keeps plotters' own path.
            return self.inner.draw_text(text, style, pos);
        }
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let Self { inner, font } = self;
        let (em, scale) = scale_for(font, style.size());
        let scaled = font.as_scaled(scale);
        let width = advance(&scaled, text);
        let x_height = scaled
            .outline_glyph(scaled.scaled_glyph('x'))
            .map_or(em * 0.55, |g| -g.px_bounds().min.y);
        // Pixel coordinates fit f32 exactly.
        #[allow(clippy::cast_precision_loss)]
        let (x, y) = (pos.0 as f32, pos.1 as f32);
        let left = match style.anchor().h_pos {
            HPos::Left => x,
            HPos::Center => x - width / 2.0,
            HPos::Right => x - width,
        };
        // As plotters' SVG backend: dy = 0.76em, 0.5ex and -0.5ex.
        let baseline = match style.anchor().v_pos {
            VPos::Top => y + 0.76 * em,
            VPos::Center => y + 0.5 * x_height,
            VPos::Bottom => y - 0.5 * x_height,
        };

        let mut caret = left;
        let mut previous: Option<GlyphId> = None;
        for c in text.chars() {
            let id = scaled.glyph_id(c);
            if let Some(p) = previous {
                caret += scaled.kern(p, id);
            }
            let glyph = id.with_scale_and_position(scale, point(caret, baseline));
            if let Some(outline) = font.outline_glyph(glyph) {
                let bounds = outline.px_bounds();
                let mut result = Ok(());
                outline.draw(|gx, gy, coverage| {
                    if result.is_err() || coverage <= 0.0 {
                        return;
                    }
                    // Glyph bounds are within the image's i32 pixel space.
                    #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
                    let at = (
                        bounds.min.x as i32 + gx as i32,
                        bounds.min.y as i32 + gy as i32,
                    );
                    let alpha = color.alpha * f64::from(coverage.min(1.0));
                    result = inner.draw_pixel(
                        at,
                        BackendColor {
                            alpha,
                            rgb: color.rgb,
                        },
                    );
                });
                result?;
            }
            caret += scaled.h_advance(id);
            previous = Some(id);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plotters::prelude::*;

    fn ink_rows_and_columns(text: &str) -> (Vec<bool>, Vec<bool>) {
        let (w, h) = (200u32, 40u32);
        let mut buf = vec![255u8; (w * h * 3) as usize];
        {
            let inner = BitMapBackend::with_buffer(&mut buf, (w, h));
            let mut backend = GlyphBitMap::new(inner, super::super::FONT).unwrap();
            let style = TextStyle::from(("sans-serif", 24.0).into_font());
            backend.draw_text(text, &style, (10, 5)).unwrap();
        }
        let dark = |x: u32, y: u32| buf[((y * w + x) * 3) as usize] < 128;
        let rows = (0..h).map(|y| (0..w).any(|x| dark(x, y))).collect();
        let columns = (0..w).map(|x| (0..h).any(|y| dark(x, y))).collect();
        (rows, columns)
    }

    #[test]
    fn a_period_sits_on_the_baseline() {
        let (x_rows, _) = ink_rows_and_columns("x");
        let (dot_rows, _) = ink_rows_and_columns(".");
        let last = |rows: &[bool]| rows.iter().rposition(|&r| r).unwrap();
        assert!(last(&dot_rows).abs_diff(last(&x_rows)) <= 1);
    }

    #[test]
    fn letters_are_evenly_spaced() {
        // "ll" and "on" are the pairs plotters' own rasterizer spaced apart.
        let (_, columns) = ink_rows_and_columns("llll");
        let mut gaps = Vec::new();
        let mut run = 0;
        for &ink in columns.iter().skip_while(|&&c| !c) {
            if ink {
                if run > 0 {
                    gaps.push(run);
                }
                run = 0;
            } else {
                run += 1;
            }
        }
        let inner: Vec<_> = gaps.iter().take(3).copied().collect();
        assert_eq!(inner.len(), 3, "{gaps:?}");
        assert!(
            inner.iter().max().unwrap() - inner.iter().min().unwrap() <= 1,
            "{inner:?}"
        );
    }

    #[test]
    fn wide_sharp_turns_do_not_spike() {
        // A sawtooth's drop: up, then straight down, then up again, 3 px wide. plotters'
        // miter join would reach far above y = 10.
        let (w, h) = (60u32, 120u32);
        let mut buf = vec![255u8; (w * h * 3) as usize];
        {
            let inner = BitMapBackend::with_buffer(&mut buf, (w, h));
            let mut backend = GlyphBitMap::new(inner, super::super::FONT).unwrap();
            let style = plotters::style::Color::stroke_width(&BLACK, 3);
            backend
                .draw_path(vec![(10, 60), (30, 10), (31, 100), (50, 60)], &style)
                .unwrap();
        }
        let top_ink = (0..h)
            .find(|&y| (0..w).any(|x| buf[((y * w + x) * 3) as usize] < 128))
            .unwrap();
        assert!(top_ink >= 7, "ink from row {top_ink}");
    }

    #[test]
    fn estimate_matches_what_is_drawn() {
        let mut buf = vec![255u8; 300 * 40 * 3];
        let inner = BitMapBackend::with_buffer(&mut buf, (300, 40));
        let backend = GlyphBitMap::new(inner, super::super::FONT).unwrap();
        let style = TextStyle::from(("sans-serif", 24.0).into_font());
        let (w, h) = backend
            .estimate_text_size("total 140.4 GiB", &style)
            .unwrap();
        assert!((120..200).contains(&w), "{w}");
        assert!((18..30).contains(&h), "{h}");
    }
}
