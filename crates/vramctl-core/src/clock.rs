//! Time, injected so the sampler and everything above it run in tests without sleeping.
//!
//! Two clocks, read together: the **wall clock** (milliseconds since the Unix epoch, what
//! times are shown and stored as) and a **monotonic clock** (`CLOCK_MONOTONIC`: never
//! steps, only its differences mean anything). NTP stepping the wall clock, or a VM resumed
//! with a stale one, moves the first and not the second, so every span vramctl measures
//! (idle spans, rates, intervals, backoffs) is a difference of monotonic times, and
//! [`wall_jump_ms`] tells a step from the ordinary jitter of reading two clocks.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

/// How far the wall clock may move apart from the monotonic clock between two readings
/// before it counts as a step.
///
/// `CLOCK_MONOTONIC` is slewed by NTP exactly like the wall clock (only `_RAW` is not), so
/// between readings the two differ only by steps, by a suspend (the monotonic clock stops)
/// and by the time between reading one and the other, which [`SystemClock`] keeps under
/// 1 ms by re-reading. 100 ms is far above that jitter (`docs/clock.md` has the
/// measurements) and below the smallest step a time daemon makes (ntpd steps at 128 ms;
/// chrony's `makestep` and a leap second are 1 s), so every deliberate step is seen.
pub const STEP_TOLERANCE_MS: i64 = 100;

/// Both clocks, read at (nearly) the same instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClockTime {
    /// Wall clock: milliseconds since the Unix epoch.
    pub unix_ms: i64,
    /// Monotonic clock, milliseconds; only differences mean anything.
    pub monotonic_ms: i64,
}

/// A source of wall-clock and monotonic time.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_unix_ms(&self) -> i64;

    /// Milliseconds of a clock that never steps (its origin is arbitrary).
    fn monotonic_ms(&self) -> i64;

    /// Both, read together.
    fn now(&self) -> ClockTime {
        ClockTime {
            unix_ms: self.now_unix_ms(),
            monotonic_ms: self.monotonic_ms(),
        }
    }
}

/// How much further the wall clock moved than the monotonic clock from `before` to `after`:
/// 0 within [`STEP_TOLERANCE_MS`], negative for a step back, positive for a step forward (or
/// a suspend, which the monotonic clock does not count).
pub fn wall_jump_ms(before: ClockTime, after: ClockTime) -> i64 {
    let wall = after.unix_ms.saturating_sub(before.unix_ms);
    let monotonic = after.monotonic_ms.saturating_sub(before.monotonic_ms);
    let jump = wall.saturating_sub(monotonic);
    if jump.abs() > STEP_TOLERANCE_MS {
        jump
    } else {
        0
    }
}

/// The system's real-time and monotonic clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

fn system_unix_ms() -> i64 {
    // Before 1970 only on a broken clock; 0 keeps the arithmetic total.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn system_monotonic_ms() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec
        .saturating_mul(1000)
        .saturating_add((t.tv_nsec / 1_000_000).max(0))
}

impl Clock for SystemClock {
    fn now_unix_ms(&self) -> i64 {
        system_unix_ms()
    }

    fn monotonic_ms(&self) -> i64 {
        system_monotonic_ms()
    }

    /// Reads the monotonic clock on both sides of the wall clock and retries when they are
    /// more than 1 ms apart (the thread was preempted in between), so a late reading is not
    /// taken for a clock step.
    fn now(&self) -> ClockTime {
        let mut best = None;
        for _ in 0..4 {
            let before = system_monotonic_ms();
            let unix_ms = system_unix_ms();
            let after = system_monotonic_ms();
            let reading = ClockTime {
                unix_ms,
                monotonic_ms: before + (after - before) / 2,
            };
            if after - before <= 1 {
                return reading;
            }
            best = Some(reading);
        }
        best.unwrap_or_default()
    }
}

/// A wall-clock step a [`ManualClock`] makes once its monotonic time has advanced `at_ms`
/// from where it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WallStep {
    /// Monotonic milliseconds after the clock's start.
    pub at_ms: i64,
    /// How far the wall clock jumps (negative: back).
    pub by_ms: i64,
}

impl std::str::FromStr for WallStep {
    type Err = String;

    /// `AT_MS:BY_MS`, e.g. `30000:-3600000` (after 30 s, the wall clock goes back 1 h).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || format!("'{text}' is not AT_MS:BY_MS (e.g. 30000:-3600000)");
        let (at, by) = text.split_once(':').ok_or_else(bad)?;
        let at_ms: i64 = at.trim().parse().map_err(|_| bad())?;
        let by_ms: i64 = by.trim().parse().map_err(|_| bad())?;
        if at_ms < 0 {
            return Err(bad());
        }
        Ok(Self { at_ms, by_ms })
    }
}

#[derive(Debug, Default)]
struct Manual {
    unix_ms: AtomicI64,
    monotonic_ms: AtomicI64,
    /// Steps still to come, soonest first.
    steps: Mutex<Vec<WallStep>>,
}

/// A clock that moves only when told to. Its monotonic time starts at 0.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<Manual>);

impl ManualClock {
    /// A clock stopped at `unix_ms`.
    pub fn new(unix_ms: i64) -> Self {
        Self::with_steps(unix_ms, Vec::new())
    }

    /// A clock stopped at `unix_ms` whose wall clock steps as `steps` say while
    /// [`advance_ms`](Self::advance_ms) moves it on (the simulated NTP steps of tests).
    pub fn with_steps(unix_ms: i64, mut steps: Vec<WallStep>) -> Self {
        steps.sort_by_key(|s| s.at_ms);
        Self(Arc::new(Manual {
            unix_ms: AtomicI64::new(unix_ms),
            monotonic_ms: AtomicI64::new(0),
            steps: Mutex::new(steps),
        }))
    }

    /// Moves both clocks forward by `ms`, then makes the wall-clock steps now due.
    pub fn advance_ms(&self, ms: i64) {
        self.0.unix_ms.fetch_add(ms, Ordering::SeqCst);
        let monotonic = self.0.monotonic_ms.fetch_add(ms, Ordering::SeqCst) + ms;
        let mut steps = self.0.steps.lock().unwrap_or_else(PoisonError::into_inner);
        while steps.first().is_some_and(|s| s.at_ms <= monotonic) {
            let step = steps.remove(0);
            self.step_wall_ms(step.by_ms);
        }
    }

    /// Steps the wall clock alone by `ms` (negative: back), as NTP does.
    pub fn step_wall_ms(&self, ms: i64) {
        self.0.unix_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_unix_ms(&self) -> i64 {
        self.0.unix_ms.load(Ordering::SeqCst)
    }

    fn monotonic_ms(&self) -> i64 {
        self.0.monotonic_ms.load(Ordering::SeqCst)
    }
}

/// A time line that never steps: the wall clock at the first reading, counted on by the
/// monotonic clock. What the live analysis and `top` place their samples on, so a clock
/// step neither freezes nor stretches what they measure; it equals the wall clock until the
/// wall clock steps, and then differs from it by the steps since the first reading.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeline {
    anchor: Option<ClockTime>,
}

impl Timeline {
    /// A time line that starts at its first [`place`](Self::place).
    pub fn new() -> Self {
        Self::default()
    }

    /// Where `at` lies on the time line (the first reading anchors it).
    pub fn place(&mut self, at: ClockTime) -> i64 {
        let anchor = *self.anchor.get_or_insert(at);
        anchor
            .unix_ms
            .saturating_add(at.monotonic_ms.saturating_sub(anchor.monotonic_ms))
    }

    /// Where `at` lies, without anchoring: `None` before the first [`place`](Self::place).
    pub fn get(&self, at: ClockTime) -> Option<i64> {
        let anchor = self.anchor?;
        Some(
            anchor
                .unix_ms
                .saturating_add(at.monotonic_ms.saturating_sub(anchor.monotonic_ms)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_step_moves_the_wall_clock_alone() {
        let clock = ManualClock::with_steps(
            1_000_000,
            vec![
                WallStep {
                    at_ms: 3_000,
                    by_ms: -3_600_000,
                },
                WallStep {
                    at_ms: 1_000,
                    by_ms: 500,
                },
            ],
        );
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push((clock.now_unix_ms() - 1_000_000, clock.monotonic_ms()));
            clock.advance_ms(1_000);
        }
        assert_eq!(
            seen,
            [
                (0, 0),
                (1_500, 1_000),
                (2_500, 2_000),
                (3_500 - 3_600_000, 3_000)
            ]
        );
    }

    #[test]
    fn jitter_is_no_step_and_steps_have_their_sign() {
        let at = |unix_ms, monotonic_ms| ClockTime {
            unix_ms,
            monotonic_ms,
        };
        assert_eq!(wall_jump_ms(at(0, 0), at(1_000, 1_000)), 0);
        assert_eq!(
            wall_jump_ms(at(0, 0), at(1_090, 1_000)),
            0,
            "within tolerance"
        );
        assert_eq!(wall_jump_ms(at(0, 0), at(-3_599_000, 1_000)), -3_600_000);
        assert_eq!(wall_jump_ms(at(0, 0), at(3_601_000, 1_000)), 3_600_000);
    }

    #[test]
    fn the_timeline_follows_the_monotonic_clock_from_its_anchor() {
        let mut line = Timeline::new();
        let at = |unix_ms, monotonic_ms| ClockTime {
            unix_ms,
            monotonic_ms,
        };
        assert_eq!(line.get(at(5, 5)), None);
        assert_eq!(line.place(at(10_000, 7)), 10_000);
        // The wall clock went back an hour; the time line goes on.
        assert_eq!(line.place(at(10_000 - 3_600_000 + 1_000, 1_007)), 11_000);
        assert_eq!(line.get(at(0, 2_007)), Some(12_000));
    }

    #[test]
    fn system_clocks_are_read_together() {
        let a = SystemClock.now();
        let b = SystemClock.now();
        assert!(b.monotonic_ms >= a.monotonic_ms);
        assert_eq!(wall_jump_ms(a, b), 0, "{a:?} {b:?}");
    }

    #[test]
    fn wall_steps_parse() {
        assert_eq!(
            "30000:-3600000".parse::<WallStep>(),
            Ok(WallStep {
                at_ms: 30_000,
                by_ms: -3_600_000
            })
        );
        assert!("30s:-1h".parse::<WallStep>().is_err());
        assert!("-1:5".parse::<WallStep>().is_err());
    }
}
