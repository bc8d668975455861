//! Short units for narrow columns. Memory is binary (as nvidia-smi's MiB), one decimal
//! below 100 of a unit so a column stays at most 6 characters wide. Times are in the
//! zone `top` was given (`--tz`, `TZ`, the system's), through `vramctl_core::wall_time`.

use jiff::tz::TimeZone;
use vramctl_core::wall_time;

/// `1536` → `1.5K`, `150_754_820_096` → `140G`; `0` → `0`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["K", "M", "G", "T", "P"];
    if n < 1024 {
        return format!("{n}B");
    }
    // Precision loss above 2^53 bytes is far below the digits shown.
    #[allow(clippy::cast_precision_loss)]
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value < 99.95 {
        format!("{value:.1}{}", UNITS[unit])
    } else {
        format!("{value:.0}{}", UNITS[unit])
    }
}

/// Optional bytes; `-` when not reported.
pub fn opt_bytes(n: Option<u64>) -> String {
    n.map_or_else(|| "-".to_owned(), bytes)
}

/// A signed change in bytes: `+2.0M`, `-512K`, `0`.
pub fn signed_bytes(n: i64) -> String {
    match n.cmp(&0) {
        std::cmp::Ordering::Equal => "0".to_owned(),
        std::cmp::Ordering::Greater => format!("+{}", bytes(n.unsigned_abs())),
        std::cmp::Ordering::Less => format!("-{}", bytes(n.unsigned_abs())),
    }
}

/// A duration in the largest sensible unit: `45s`, `12m`, `3h05m`, `2d04h`.
pub fn duration_ms(ms: i64) -> String {
    let secs = ms.max(0) / 1000;
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        3600..86_400 => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{:02}h", secs / 86_400, secs % 86_400 / 3600),
    }
}

/// `HH:MM:SS` of a Unix time in milliseconds, in `tz`.
pub fn clock(tz: &TimeZone, unix_ms: i64) -> String {
    wall_time::clock(tz, unix_ms, false)
}

/// `YYYY-MM-DD HH:MM:SS ZONE` of a Unix time in milliseconds.
pub fn datetime(tz: &TimeZone, unix_ms: i64) -> String {
    wall_time::labelled(tz, unix_ms)
}

/// Milliwatts as whole watts, `320W`.
pub fn watts(mw: u32) -> String {
    format!("{}W", (mw + 500) / 1000)
}

/// `used / total` as a whole percentage; `None` when total is 0 (the one every view uses).
pub use vramctl_observe::units::percent;

/// `text` cut to at most `width` characters, with `…` when cut.
pub fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    if width == 0 {
        return String::new();
    }
    let mut out: String = text.chars().take(width - 1).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_stay_short() {
        assert_eq!(bytes(0), "0B");
        assert_eq!(bytes(1536), "1.5K");
        assert_eq!(bytes(644_939_776), "615M");
        assert_eq!(bytes(2 * 1024 * 1024 * 1024), "2.0G");
        assert_eq!(bytes(150_754_820_096), "140G");
        assert_eq!(bytes(99_990 * 1024 * 1024), "97.6G");
        assert_eq!(opt_bytes(None), "-");
        assert!(bytes(u64::MAX).len() <= 6, "{}", bytes(u64::MAX));
    }

    #[test]
    fn signed_changes() {
        assert_eq!(signed_bytes(0), "0");
        assert_eq!(signed_bytes(2 * 1024 * 1024), "+2.0M");
        assert_eq!(signed_bytes(-512 * 1024), "-512K");
        assert_eq!(signed_bytes(i64::MIN).chars().next(), Some('-'));
    }

    #[test]
    fn durations() {
        assert_eq!(duration_ms(-5), "0s");
        assert_eq!(duration_ms(45_000), "45s");
        assert_eq!(duration_ms(12 * 60_000 + 5), "12m");
        assert_eq!(duration_ms(3 * 3_600_000 + 5 * 60_000), "3h05m");
        assert_eq!(duration_ms(2 * 86_400_000 + 4 * 3_600_000), "2d04h");
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(clock(&TimeZone::UTC, 1_764_450_131_000), "21:02:11");
        assert_eq!(
            datetime(&TimeZone::UTC, 1_764_450_131_000),
            "2025-11-29 21:02:11 UTC"
        );
        let paris = TimeZone::get("Europe/Paris").unwrap();
        assert_eq!(
            datetime(&paris, 1_764_450_131_000),
            "2025-11-29 22:02:11 CET"
        );
    }

    #[test]
    fn fit_cuts_with_an_ellipsis() {
        assert_eq!(fit("python train.py", 8), "python …");
        assert_eq!(fit("short", 8), "short");
        assert_eq!(fit("x", 0), "");
    }

    #[test]
    fn watts_round() {
        assert_eq!(watts(103_500), "104W");
        assert_eq!(watts(0), "0W");
    }
}
