//! Human units: the one place the commands format bytes, rates, durations and ages. Memory
//! is binary (GiB, as nvidia-smi's MiB); rates are decimal (TB/s, as vendors quote
//! bandwidth). Where two formats of one quantity exist they differ on purpose (a table
//! column vs a sentence, a device figure vs a change), each named for where it is used.
//! The sentence forms are implemented in `vramctl_leaks::analysis` (below this crate: its
//! verdicts are written with them) and named here for the commands.

/// `1536` → `1.5 KiB`; bytes below 1 KiB stay whole. The same text in tables and in the
/// leak analysis's sentences, so one implementation (the analysis's, in vramctl-core).
pub fn bytes(n: u64) -> String {
    vramctl_leaks::analysis::human_bytes(n)
}

/// A change in bytes, always signed: `+1.5 GiB`, `-200.0 MiB`, `0 B` (a diff's column,
/// where the direction is the news).
pub fn signed_bytes(delta: i128) -> String {
    let magnitude = u64::try_from(delta.unsigned_abs()).unwrap_or(u64::MAX);
    match delta.signum() {
        1 => format!("+{}", bytes(magnitude)),
        -1 => format!("-{}", bytes(magnitude)),
        _ => "0 B".to_owned(),
    }
}

/// Bytes given back, signed only when negative: `1.5 GiB`, `-200.0 MiB` (in "NVML shows
/// 1.5 GiB returned", a `+` would read as noise; a negative amount is the surprise).
pub fn returned_bytes(n: i64) -> String {
    if n < 0 {
        format!("-{}", bytes(n.unsigned_abs()))
    } else {
        bytes(n.unsigned_abs())
    }
}

/// A rate in a sentence, two or three significant digits, signed: `38 MB/s`, `-2.5 GB/s`
/// (a leak's slope); [`rate`] is a device's bandwidth with two decimals.
pub fn sentence_rate(bytes_per_sec: f64) -> String {
    vramctl_leaks::analysis::human_rate(bytes_per_sec)
}

/// A duration in a sentence: `45 s`, `6 min`, `3 h 2 min`, `2 d 5 h`; [`age`] is the
/// compact column form (`12m05s`).
pub fn sentence_duration(secs: f64) -> String {
    vramctl_leaks::analysis::human_duration(secs)
}

/// A length as a flag takes it, in the largest unit that divides it exactly: `10s`, `1m`,
/// `90s`, `250ms` (echoing `--step`, where `1.5 min` would not be typed back).
pub fn exact_length(ms: i64) -> String {
    for (unit, len) in [("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms % len == 0 {
            return format!("{}{unit}", ms / len);
        }
    }
    format!("{ms}ms")
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

/// Parses a size as people type it: `1073741824`, `512MiB`, `1.5 GiB`, `20G` (single
/// letters and `KiB`..`TiB` are binary), `500MB` (`kB`..`TB` are decimal). Case-insensitive.
///
/// # Errors
/// A message that names the text and the units accepted.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let bad = || {
        format!(
            "'{text}' is not a size; use bytes or a number with B, KiB, MiB, GiB, TiB (or K, M, \
             G, T), kB, MB, GB, TB"
        )
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    // Sizes up to a few TiB: f64 holds them exactly enough; anything past u64 is refused.
    #[allow(clippy::cast_precision_loss)]
    let bytes = (value * multiplier as f64).round();
    if !(0.0..18_446_744_073_709_551_615.0).contains(&bytes) {
        return Err(bad());
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as u64)
}

/// A duration in its two largest units: `45s`, `12m05s`, `3h12m`, `2d04h`.
pub fn age(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}d{h:02}h")
    } else if h > 0 {
        format!("{h}h{m:02}m")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

/// Seconds with the precision a person reads: `0.35 s`, `12.1 s`.
pub fn seconds(secs: f64) -> String {
    if secs < 10.0 {
        format!("{secs:.2} s")
    } else {
        format!("{secs:.1} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_signed_as_their_place_reads_them() {
        assert_eq!(signed_bytes(1536), "+1.5 KiB");
        assert_eq!(signed_bytes(-512), "-512 B");
        assert_eq!(signed_bytes(0), "0 B");
        assert_eq!(returned_bytes(1536), "1.5 KiB");
        assert_eq!(returned_bytes(-1536), "-1.5 KiB");
        assert_eq!(returned_bytes(0), "0 B");
    }

    #[test]
    fn bytes_keep_one_decimal_from_kib_on() {
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
        assert_eq!(bytes(u64::MAX), "16384.0 PiB");
    }

    #[test]
    fn exact_lengths_use_the_largest_dividing_unit() {
        assert_eq!(exact_length(7_200_000), "2h");
        assert_eq!(exact_length(90_000), "90s");
        assert_eq!(exact_length(60_000), "1m");
        assert_eq!(exact_length(250), "250ms");
    }

    #[test]
    fn sizes_parse_as_typed() {
        assert_eq!(parse_bytes("1073741824"), Ok(1 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("20G"), Ok(20 << 30));
        assert_eq!(parse_bytes("20g"), Ok(20 << 30));
        assert_eq!(parse_bytes("500MB"), Ok(500_000_000));
        assert_eq!(parse_bytes(" 7 "), Ok(7));
        for bad in ["", "G", "1.2.3G", "5 parsecs", "-1G", "99999999999T"] {
            let err = parse_bytes(bad).unwrap_err();
            assert!(err.contains(&format!("'{bad}'")), "{err}");
        }
    }

    #[test]
    fn ages_use_two_units() {
        assert_eq!(age(45), "45s");
        assert_eq!(age(725), "12m05s");
        assert_eq!(age(3 * 3600 + 12 * 60 + 9), "3h12m");
        assert_eq!(age(2 * 86_400 + 4 * 3600), "2d04h");
        assert_eq!(seconds(0.347), "0.35 s");
        assert_eq!(seconds(12.06), "12.1 s");
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
