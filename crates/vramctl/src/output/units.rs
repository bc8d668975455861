//! Human units. Memory is binary (GiB, as nvidia-smi's MiB); rates are decimal (TB/s, as
//! vendors quote bandwidth).

/// `1536` → `1.5 KiB`; bytes below 1 KiB stay whole.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    // Precision loss above 2^53 bytes is far below the one decimal shown.
    #[allow(clippy::cast_precision_loss)]
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Optional bytes, `-` when not reported.
pub fn opt_bytes(n: Option<u64>) -> String {
    n.map_or_else(|| "-".to_owned(), bytes)
}

/// `4_815_206_400_000` → `4.82 TB/s`.
pub fn rate(bytes_per_sec: u64) -> String {
    const UNITS: [&str; 5] = ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"];
    #[allow(clippy::cast_precision_loss)]
    let mut value = bytes_per_sec as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// Milliwatts as watts, `103.5 W`.
pub fn watts(mw: u32) -> String {
    format!("{:.1} W", f64::from(mw) / 1000.0)
}

/// `used / total` as a whole percentage, `None` when total is 0.
pub fn percent(used: u64, total: u64) -> Option<u64> {
    (total > 0).then(|| {
        let pct = u128::from(used) * 100 / u128::from(total);
        u64::try_from(pct).unwrap_or(u64::MAX)
    })
}

/// A bar of `width` cells: `█` for used, `▒` for reserved, `░` for free.
pub fn memory_bar(used: u64, reserved: u64, total: u64, width: usize) -> String {
    if total == 0 {
        return "░".repeat(width);
    }
    let cells = |part: u64| -> usize {
        let n = u128::from(part) * width as u128 / u128::from(total);
        usize::try_from(n).unwrap_or(width).min(width)
    };
    let used_cells = cells(used);
    // Round up a non-zero reservation so the reader sees it exists.
    let reserved_cells = cells(reserved)
        .max(usize::from(reserved > 0))
        .min(width - used_cells);
    let free_cells = width - used_cells - reserved_cells;
    format!(
        "{}{}{}",
        "█".repeat(used_cells),
        "▒".repeat(reserved_cells),
        "░".repeat(free_cells)
    )
}

/// A size as people type it: `1GiB`, `512 MiB`, `1.5G`, `2GB`, `1073741824`. `K`, `M`, `G`,
/// `T` alone are binary, as nvidia-smi's MiB; `kB`, `MB`, `GB`, `TB` decimal.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit() && c != '.' && c != '_')
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let value: f64 = number.replace('_', "").parse().map_err(|_| {
        format!("'{text}' is not a size; use a number with a unit, like 1GiB or 512MiB")
    })?;
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "K" | "KiB" | "k" => 1024.0,
        "M" | "MiB" => 1024.0 * 1024.0,
        "G" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        "T" | "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        other => {
            return Err(format!(
                "'{text}' has an unknown unit '{other}'; use B, KiB, MiB, GiB, TiB (or kB, MB, GB, TB)"
            ));
        }
    };
    let bytes = (value * scale).round();
    if !bytes.is_finite() || !(0.0..1.8e19).contains(&bytes) {
        return Err(format!("'{text}' is out of range"));
    }
    // Checked above: finite, non-negative, below u64::MAX.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes(" 512 MiB "), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5G"), Ok(3 << 29));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("1_024"), Ok(1024));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert!(
            parse_bytes("lots")
                .unwrap_err()
                .contains("'lots' is not a size")
        );
        assert!(
            parse_bytes("1 parsec")
                .unwrap_err()
                .contains("unknown unit 'parsec'")
        );
        assert!(parse_bytes("1e30").is_err());
        assert!(
            parse_bytes("99999999999TiB")
                .unwrap_err()
                .contains("out of range")
        );
    }

    #[test]
    fn bytes_pick_a_readable_unit() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(644_939_776), "615.1 MiB");
        assert_eq!(bytes(150_754_820_096), "140.4 GiB");
        assert_eq!(bytes(u64::MAX), "16384.0 PiB");
    }

    #[test]
    fn rates_are_decimal() {
        assert_eq!(rate(4_815_206_400_000), "4.82 TB/s");
        assert_eq!(rate(63_015_384_615), "63.02 GB/s");
    }

    #[test]
    fn bar_has_fixed_width() {
        let bar = memory_bar(50, 1, 100, 20);
        assert_eq!(bar.chars().count(), 20);
        assert!(bar.starts_with("██████████▒"));
        assert_eq!(memory_bar(200, 0, 100, 10), "█".repeat(10));
        assert_eq!(memory_bar(0, 0, 0, 4), "░░░░");
    }

    #[test]
    fn percent_handles_zero_total() {
        assert_eq!(percent(1, 0), None);
        assert_eq!(percent(1, 3), Some(33));
    }
}
