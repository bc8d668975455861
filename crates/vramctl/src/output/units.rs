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

#[cfg(test)]
mod tests {
    use super::*;

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
