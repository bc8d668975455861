//! How far the wall clock and the monotonic clock drift apart between two readings of
//! `SystemClock::now()` when nothing steps: the noise `clock::STEP_TOLERANCE_MS` must stay
//! above. `docs/clock.md` has the figures.
//!
//! ```sh
//! cargo run --release -p vramctl-core --example clock_jitter -- 3000 100   # 3000 readings, 100 ms apart
//! ```

use std::time::Duration;

use vramctl_core::clock::{Clock, SystemClock};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3000);
    let every_ms: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let mut last = SystemClock.now();
    let mut jumps: Vec<i64> = Vec::with_capacity(n);
    for _ in 0..n {
        std::thread::sleep(Duration::from_millis(every_ms));
        let now = SystemClock.now();
        let wall = now.unix_ms - last.unix_ms;
        let monotonic = now.monotonic_ms - last.monotonic_ms;
        jumps.push((wall - monotonic).abs());
        last = now;
    }
    jumps.sort_unstable();
    let at = |q: f64| {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((jumps.len() - 1) as f64 * q).round() as usize;
        jumps[i]
    };
    println!(
        "readings {n}, {every_ms} ms apart: |wall - monotonic| per interval, ms: \
         median {} p99 {} p99.9 {} max {}",
        at(0.5),
        at(0.99),
        at(0.999),
        jumps.last().copied().unwrap_or(0)
    );
}
