//! Sizes as the snapshot's messages and summary print them. Its own module so that the
//! model's errors and the summary both name it without naming each other's file.

/// Binary units with two decimals, as PyTorch's `format_size` prints them.
#[allow(clippy::cast_precision_loss)]
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}
