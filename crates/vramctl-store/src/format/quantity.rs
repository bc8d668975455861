//! A logged value with its unit: `1234 MiB`, `71.48 W`, `45 %`, `1194 GB`; the unit of
//! the column (`memory.used [MiB]`, GPU-Z's `[MB]`) when the value carries none.
//!
//! A value's own unit wins over the column's: `1194 GB` in a `[MiB]` column is 1194 × 10^9
//! bytes, not 1194 MiB. Units are read as written: `KiB`/`MiB`/`GiB`/`TiB` are powers of
//! 1024, `KB`/`MB`/`GB`/`TB` powers of 1000 — except in a GPU-Z column header, where GPU-Z
//! writes `[MB]` for MiB (it counts as Windows does; `gpuz.rs` passes MiB). A unit that is
//! not one of the metric's (`1194 bananas`, `12 W` for memory) is an error, never a guess.

use crate::model::Metric;

use super::shown;

/// What kind of quantity a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Bytes,
    Percent,
    Celsius,
    Power,
}

impl Kind {
    pub fn of(metric: Metric) -> Option<Self> {
        Some(match metric {
            Metric::UsedBytes
            | Metric::ReservedBytes
            | Metric::FreeBytes
            | Metric::TotalBytes
            | Metric::ProcessUsedBytes
            | Metric::ProcessAllocatedBytes
            | Metric::ProcessReservedBytes => Self::Bytes,
            Metric::UtilizationGpuPercent
            | Metric::UtilizationMemoryPercent
            | Metric::ProcessSmPercent => Self::Percent,
            Metric::TemperatureC => Self::Celsius,
            Metric::PowerMw => Self::Power,
            Metric::ProcessCpuTicks => return None,
        })
    }

    fn what(self) -> &'static str {
        match self {
            Self::Bytes => "memory (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
            Self::Percent => "a percentage (%)",
            Self::Celsius => "a temperature (C, °C)",
            Self::Power => "power (mW, W, kW)",
        }
    }

    /// The factor from `unit` to the stored unit (bytes, percent, °C, milliwatts).
    fn factor(self, unit: &str) -> Option<f64> {
        let u = unit.trim();
        Some(match self {
            Self::Bytes => match u {
                "B" | "bytes" => 1.0,
                "KiB" => 1024.0,
                "MiB" => 1_048_576.0,
                "GiB" => 1_073_741_824.0,
                "TiB" => 1_099_511_627_776.0,
                "KB" | "kB" => 1e3,
                "MB" => 1e6,
                "GB" => 1e9,
                "TB" => 1e12,
                _ => return None,
            },
            Self::Percent => match u {
                "%" => 1.0,
                _ => return None,
            },
            Self::Celsius => match u {
                "C" | "°C" | "degC" => 1.0,
                _ => return None,
            },
            Self::Power => match u {
                "mW" => 1.0,
                "W" => 1e3,
                "kW" => 1e6,
                _ => return None,
            },
        })
    }
}

/// A column's default unit, from its header (`[MiB]`, `[W]`) or the format's convention.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ColumnUnit {
    kind: Kind,
    factor: f64,
}

impl ColumnUnit {
    /// The unit named in a header (`None`: the format's default `fallback`).
    ///
    /// # Errors
    /// A header unit that is not one of the metric's.
    pub fn new(metric: Metric, header_unit: Option<&str>, fallback: &str) -> Result<Self, String> {
        let kind = Kind::of(metric).ok_or_else(|| format!("{} has no unit", metric.name()))?;
        let unit = header_unit.unwrap_or(fallback);
        let factor = kind.factor(unit).ok_or_else(|| {
            format!(
                "the column's unit '{}' is not one of {}",
                shown(unit, 20),
                kind.what()
            )
        })?;
        Ok(Self { kind, factor })
    }

    /// A column whose values are in `factor` stored units each (GPU-Z's MiB written `MB`).
    pub fn with_factor(metric: Metric, factor: f64) -> Option<Self> {
        Some(Self {
            kind: Kind::of(metric)?,
            factor,
        })
    }

    /// Reads `field` (a number, maybe followed by its own unit) in stored units.
    ///
    /// # Errors
    /// Not a number, a negative or non-finite number, a unit that is not the metric's, or
    /// a value too large to be stored.
    pub fn read(self, field: &str) -> Result<u64, String> {
        let field = field.trim();
        let split = field
            .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
            .unwrap_or(field.len());
        let (number, unit) = field.split_at(split);
        let x: f64 = number
            .trim()
            .parse()
            .map_err(|_| format!("'{}' is not a number", shown(field, 30)))?;
        if !x.is_finite() || x < 0.0 {
            return Err(format!("'{}' is not a usable value", shown(field, 30)));
        }
        let unit = unit.trim();
        let factor = if unit.is_empty() {
            self.factor
        } else {
            self.kind.factor(unit).ok_or_else(|| {
                format!(
                    "'{}': '{}' is not a unit of {}",
                    shown(field, 30),
                    shown(unit, 20),
                    self.kind.what()
                )
            })?
        };
        let scaled = (x * factor).round();
        // 2^64 as f64; anything at or above it cannot be a u64 (and is refused by the
        // sanity rules well before that).
        if scaled >= 18_446_744_073_709_551_616.0 {
            return Err(format!("'{}' is too large to be true", shown(field, 30)));
        }
        // Finite, non-negative and below 2^64, checked above.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(scaled as u64)
    }
}

/// `memory.used [MiB]` → (`memory.used`, `Some("MiB")`).
pub(crate) fn split_header(header: &str) -> (String, Option<String>) {
    let header = header.trim();
    match header.split_once(" [") {
        Some((name, rest)) => (
            name.trim().to_ascii_lowercase(),
            rest.strip_suffix(']')
                .map(|u| u.trim().to_owned())
                .filter(|u| !u.is_empty()),
        ),
        None => (header.to_ascii_lowercase(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn mib_column() -> ColumnUnit {
        ColumnUnit::new(Metric::UsedBytes, Some("MiB"), "MiB").unwrap()
    }

    #[test]
    fn a_values_own_unit_wins_over_the_columns() {
        let col = mib_column();
        assert_eq!(col.read("1194"), Ok(1194 * MIB));
        assert_eq!(col.read("1194 MiB"), Ok(1194 * MIB));
        assert_eq!(col.read("1194 GB"), Ok(1_194_000_000_000));
        assert_eq!(col.read("2 GiB"), Ok(2 << 30));
        let power = ColumnUnit::new(Metric::PowerMw, Some("W"), "W").unwrap();
        assert_eq!(power.read("71.48 W"), Ok(71_480));
        assert_eq!(power.read("71480 mW"), Ok(71_480));
    }

    #[test]
    fn a_unit_that_is_not_the_metrics_is_refused() {
        let err = mib_column().read("1194 bananas").unwrap_err();
        assert!(err.contains("'bananas' is not a unit of memory"), "{err}");
        assert!(mib_column().read("12 W").is_err());
        assert!(ColumnUnit::new(Metric::UsedBytes, Some("bananas"), "MiB").is_err());
        assert!(mib_column().read("-1").is_err());
        assert!(mib_column().read("lots").is_err());
        assert!(mib_column().read("1e30 TB").is_err());
    }

    #[test]
    fn headers_split_into_name_and_unit() {
        assert_eq!(
            split_header(" memory.used [MiB]"),
            ("memory.used".into(), Some("MiB".into()))
        );
        assert_eq!(split_header("timestamp"), ("timestamp".into(), None));
        assert_eq!(
            split_header("PerfCap Reason []"),
            ("perfcap reason".into(), None)
        );
    }
}
