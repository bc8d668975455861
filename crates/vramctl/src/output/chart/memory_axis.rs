//! The memory axis: bytes shown in one binary unit (GiB for anything GPU-sized) with ticks
//! on round numbers of that unit.

use std::ops::Range;

use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Headroom above the highest value or the ceiling, so the top line is not drawn on the frame.
const HEADROOM: f64 = 1.06;

/// A binary unit the axis is labelled in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MemoryUnit {
    pub(crate) name: &'static str,
    pub(crate) bytes: f64,
}

/// Chooses the unit for a top value in bytes. GiB from 1 GiB up to 16 TiB, which covers every
/// GPU; MiB below so a small process is not drawn against `0.001 GiB`; larger units only for
/// values no GPU has, so absurd readings still get short labels.
pub(crate) fn unit_for(top_bytes: f64) -> MemoryUnit {
    const UNITS: [(&str, f64); 5] = [
        ("MiB", GIB / 1024.0),
        ("GiB", GIB),
        ("TiB", GIB * 1024.0),
        ("PiB", GIB * 1024.0 * 1024.0),
        ("EiB", GIB * 1024.0 * 1024.0 * 1024.0),
    ];
    let index = if top_bytes < GIB {
        0
    } else {
        // Step up from GiB while the value would need more than 5 digits.
        let mut index = 1;
        while index + 1 < UNITS.len() && top_bytes / UNITS[index].1 >= 16_384.0 {
            index += 1;
        }
        index
    };
    let (name, bytes) = UNITS[index];
    MemoryUnit { name, bytes }
}

/// `140.4 GiB`, `512 MiB`: one decimal below 1000 units unless the value is whole.
pub(crate) fn format_bytes(bytes: u64) -> String {
    // Precision loss above 2^53 bytes is far below the digits shown.
    #[allow(clippy::cast_precision_loss)]
    let bytes = bytes as f64;
    let unit = unit_for(bytes);
    let value = bytes / unit.bytes;
    if value >= 1000.0 || (value * 10.0).round() == value.round() * 10.0 {
        format!("{value:.0} {}", unit.name)
    } else {
        format!("{value:.1} {}", unit.name)
    }
}

/// The y axis: `0..top` in `unit`, with ticks every `step`.
#[derive(Debug, Clone)]
pub(crate) struct MemoryAxis {
    pub(crate) unit: MemoryUnit,
    top: f64,
    step: f64,
    decimals: usize,
}

impl MemoryAxis {
    /// An axis from 0 to a little above `max_bytes` with at most `max_ticks` ticks.
    pub(crate) fn plan(max_bytes: f64, max_ticks: usize) -> Self {
        let max_bytes = if max_bytes.is_finite() && max_bytes > 0.0 {
            max_bytes
        } else {
            // Nothing to show (or all zero): one GiB keeps a sensible, labelled axis.
            GIB
        };
        let unit = unit_for(max_bytes);
        let top = max_bytes / unit.bytes * HEADROOM;
        let max_ticks = max_ticks.max(2);
        #[allow(clippy::cast_precision_loss)]
        let rough = top / max_ticks as f64;
        let magnitude = 10f64.powf(rough.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .iter()
            .map(|m| m * magnitude)
            .find(|step| top / step <= max_ticks as f64)
            .unwrap_or(10.0 * magnitude);
        // Enough decimals to show the step exactly: 0.25 needs 2, 2.5 needs 1, 20 none.
        let decimals = (0..=6)
            .find(|&d| {
                let scaled = step * 10f64.powi(d);
                (scaled - scaled.round()).abs() < 1e-6 * scaled.max(1.0)
            })
            .and_then(|d| usize::try_from(d).ok())
            .unwrap_or(6);
        Self {
            unit,
            top,
            step,
            decimals,
        }
    }

    /// Bytes as a value on this axis.
    pub(crate) fn value(&self, bytes: u64) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let bytes = bytes as f64;
        bytes / self.unit.bytes
    }

    pub(crate) fn top(&self) -> f64 {
        self.top
    }

    fn ticks(&self) -> impl Iterator<Item = f64> + '_ {
        (0..)
            .map(|i| f64::from(i) * self.step)
            .take_while(|v| *v <= self.top + self.step * 1e-9)
            .take(1000)
    }
}

impl Ranged for MemoryAxis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let fraction = if self.top > 0.0 {
            value / self.top
        } else {
            0.0
        };
        let pixels = f64::from(limit.1 - limit.0);
        // Saturating float-to-int cast; a value off the axis lands off the plot.
        #[allow(clippy::cast_possible_truncation)]
        let mapped = (f64::from(limit.0) + fraction * pixels).round() as i32;
        mapped
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            return Vec::new();
        }
        self.ticks().collect()
    }

    fn range(&self) -> Range<f64> {
        0.0..self.top
    }
}

impl ValueFormatter<f64> for MemoryAxis {
    fn format_ext(&self, value: &f64) -> String {
        if *value == 0.0 {
            return "0".to_owned();
        }
        format!("{value:.prec$} {}", self.unit.name, prec = self.decimals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(axis: &MemoryAxis) -> Vec<String> {
        axis.ticks().map(|v| axis.format_ext(&v)).collect()
    }

    #[test]
    fn h200_axis_is_in_gib_with_round_ticks() {
        let axis = MemoryAxis::plan(141.0 * GIB, 8);
        assert_eq!(axis.unit.name, "GiB");
        assert_eq!(
            labels(&axis),
            [
                "0", "20 GiB", "40 GiB", "60 GiB", "80 GiB", "100 GiB", "120 GiB", "140 GiB"
            ]
        );
        assert!(axis.top() > 141.0);
    }

    #[test]
    fn small_values_use_mib_and_fractions_get_decimals() {
        let axis = MemoryAxis::plan(300.0 * 1024.0 * 1024.0, 8);
        assert_eq!(axis.unit.name, "MiB");
        assert_eq!(labels(&axis)[1], "50 MiB");

        let axis = MemoryAxis::plan(1.1 * GIB, 6);
        assert_eq!(axis.unit.name, "GiB");
        assert_eq!(labels(&axis)[..3], ["0", "0.2 GiB", "0.4 GiB"]);

        let axis = MemoryAxis::plan(1.0 * GIB, 5);
        assert_eq!(labels(&axis)[1], "0.25 GiB");

        let axis = MemoryAxis::plan(10.0 * GIB, 5);
        assert_eq!(labels(&axis)[..3], ["0", "2.5 GiB", "5.0 GiB"]);
    }

    #[test]
    fn empty_and_absurd_ranges_still_make_an_axis() {
        for max in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let axis = MemoryAxis::plan(max, 5);
            assert_eq!(axis.unit.name, "GiB");
            assert!(axis.ticks().count() >= 2);
        }
        #[allow(clippy::cast_precision_loss)]
        let axis = MemoryAxis::plan(u64::MAX as f64, 5);
        assert_eq!(axis.unit.name, "EiB");
        assert_eq!(labels(&axis), ["0", "5 EiB", "10 EiB", "15 EiB"]);
        assert!(axis.value(u64::MAX) <= axis.top());
        assert!((2..=6).contains(&axis.ticks().count()));
    }

    #[test]
    fn format_bytes_is_short() {
        assert_eq!(format_bytes(141 * 1024 * 1024 * 1024), "141 GiB");
        assert_eq!(format_bytes(150_754_820_096), "140.4 GiB");
        assert_eq!(format_bytes(80 * 1024 * 1024 * 1024), "80 GiB");
        assert_eq!(
            format_bytes(12 * 1024 * 1024 * 1024 + 512 * 1024 * 1024),
            "12.5 GiB"
        );
        assert_eq!(format_bytes(512 * 1024 * 1024), "512 MiB");
        assert_eq!(format_bytes(0), "0 MiB");
    }
}
