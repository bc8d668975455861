//! The history's clock: times that only go forward and keep the spacing the monotonic
//! clock measured, whatever the wall clock does.
//!
//! The store keys its frames by time and encodes each frame as the changes since the one
//! before, so its times must increase. The wall clock does not always: NTP steps it back
//! (a clock that ran fast, a leap second), a VM resumes with a stale one, a machine boots
//! with a wrong RTC. [`HistoryClock`] gives each tick its time in the history:
//!
//! - **Normally the wall clock** (plus the offset below, 0 unless the clock stepped back).
//! - **A step back** (the wall clock moved more than 100 ms less than the
//!   monotonic clock, `vramctl_core::clock::STEP_TOLERANCE_MS`): the history goes on from its last sample by the monotonic time that
//!   passed, so samples keep their real spacing, and it is from then on *ahead* of the
//!   wall clock by the step. It stays ahead until the wall clock catches up: a later step
//!   forward, or a restart of the recorder after a pause longer than the offset.
//! - **A step forward** (or a suspend, which the monotonic clock does not count): a history
//!   that is ahead absorbs it; otherwise it follows the wall clock, and the stretch in
//!   between holds no samples.
//! - **A recorder started while the last stored sample is in the future** goes on one
//!   interval after that sample, ahead of the wall clock by the difference.
//!
//! Every step is a gap whose reason starts with [`CLOCK_STEP`], from the last sample before
//! it to the first after it, saying which way and by how much, and how far the history is
//! then ahead of the wall clock. Nothing is dropped and nothing stops: `docs/clock.md`.

use vramctl_core::clock::{ClockTime, wall_jump_ms};
use vramctl_leaks::analysis::human_duration;

use crate::model::Gap;

/// The first word of the reason of every clock-step gap.
pub const CLOCK_STEP: &str = "clock-step";

/// Where one tick goes in the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The tick's time in the history: later than every stored one.
    pub t_ms: i64,
    /// The clock step just before this tick, as the gap to record.
    pub step: Option<Gap>,
}

/// Times for the ticks of one recording session; see the module docs.
#[derive(Debug, Clone)]
pub struct HistoryClock {
    interval_ms: i64,
    /// The newest time already stored when the session started.
    stored_before_ms: Option<i64>,
    /// The previous tick: its clock reading and where it went.
    last: Option<(ClockTime, i64)>,
    /// How far the history is ahead of the wall clock (0 unless it stepped back).
    ahead_ms: i64,
}

impl HistoryClock {
    /// A clock for a session appending after `stored_before_ms` (the store's last sample),
    /// sampling every `interval_ms`.
    pub fn new(stored_before_ms: Option<i64>, interval_ms: i64) -> Self {
        Self {
            interval_ms: interval_ms.max(1),
            stored_before_ms,
            last: None,
            ahead_ms: 0,
        }
    }

    /// How far the history's times are ahead of the wall clock now.
    pub fn ahead_ms(&self) -> i64 {
        self.ahead_ms
    }

    /// The time of the tick read at `now`.
    pub fn place(&mut self, now: ClockTime) -> Placement {
        let wall = now.unix_ms;
        let (t_ms, step) = match self.last {
            None => match self.stored_before_ms {
                Some(last) if wall <= last => {
                    let t = last.saturating_add(self.interval_ms);
                    self.ahead_ms = t - wall;
                    let reason = format!(
                        "{CLOCK_STEP}: the history's last sample is {} ahead of the wall \
                         clock; it goes on from there, {} ahead",
                        span(last - wall),
                        span(self.ahead_ms)
                    );
                    (t, Some(gap(last, t, reason)))
                }
                _ => (wall, None),
            },
            Some((prev, prev_t)) => {
                let elapsed = now.monotonic_ms.saturating_sub(prev.monotonic_ms).max(1);
                let continued = prev_t.saturating_add(elapsed);
                let jump = wall_jump_ms(prev, now);
                if jump < 0 {
                    self.ahead_ms = continued - wall;
                    let reason = format!(
                        "{CLOCK_STEP}: the wall clock went back {}; the history goes on by \
                         the monotonic clock, {} ahead of the wall clock",
                        span(-jump),
                        span(self.ahead_ms)
                    );
                    (continued, Some(gap(prev_t, continued, reason)))
                } else if jump > 0 && self.ahead_ms > 0 {
                    // The wall clock catches up with a history that is ahead of it.
                    let was = self.ahead_ms;
                    let t = continued.max(wall);
                    self.ahead_ms = t - wall;
                    let reason = format!(
                        "{CLOCK_STEP}: the wall clock jumped forward {}; the history, {} \
                         ahead of it, is now {}",
                        span(jump),
                        span(was),
                        if self.ahead_ms > 0 {
                            format!("{} ahead", span(self.ahead_ms))
                        } else {
                            "on it again".to_owned()
                        }
                    );
                    (t, Some(gap(prev_t, t, reason)))
                } else if jump > 0 {
                    let t = wall.max(continued);
                    let reason = format!(
                        "{CLOCK_STEP}: the wall clock jumped forward {} (a clock step or a \
                         suspend); nothing was sampled in between",
                        span(jump)
                    );
                    (t, Some(gap(prev_t, t, reason)))
                } else {
                    // Within the tolerance: follow the wall clock, never backwards.
                    (
                        wall.saturating_add(self.ahead_ms)
                            .max(prev_t.saturating_add(1)),
                        None,
                    )
                }
            }
        };
        self.last = Some((now, t_ms));
        Placement { t_ms, step }
    }
}

fn gap(from_ms: i64, to_ms: i64, reason: String) -> Gap {
    Gap {
        device_uuid: None,
        metric: None,
        from_ms,
        to_ms,
        open: false,
        reason,
    }
}

/// `150 ms`, `45 s`, `1 h 0 min`.
fn span(ms: i64) -> String {
    if ms.abs() < 1000 {
        format!("{ms} ms")
    } else {
        #[allow(clippy::cast_precision_loss)]
        human_duration(ms as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_764_000_000_000;
    const HOUR: i64 = 3_600_000;

    fn at(unix_ms: i64, monotonic_ms: i64) -> ClockTime {
        ClockTime {
            unix_ms,
            monotonic_ms,
        }
    }

    /// Ticks 1 s apart; the wall clock steps by `step` after the third.
    fn run(clock: &mut HistoryClock, step: i64, ticks: i64) -> Vec<(i64, Option<String>)> {
        (0..ticks)
            .map(|i| {
                let wall = T0 + i * 1000 + if i >= 3 { step } else { 0 };
                let p = clock.place(at(wall, i * 1000));
                (
                    p.t_ms - T0,
                    p.step
                        .map(|g| format!("{}..{} {}", g.from_ms - T0, g.to_ms - T0, g.reason)),
                )
            })
            .collect()
    }

    #[test]
    fn a_step_back_keeps_the_spacing_and_runs_ahead() {
        let mut clock = HistoryClock::new(None, 1000);
        let placed = run(&mut clock, -HOUR, 6);
        let times: Vec<i64> = placed.iter().map(|p| p.0).collect();
        assert_eq!(times, [0, 1000, 2000, 3000, 4000, 5000]);
        assert_eq!(
            placed[3].1.as_deref(),
            Some(
                "2000..3000 clock-step: the wall clock went back 1 h 0 min; the history goes \
                 on by the monotonic clock, 1 h 0 min ahead of the wall clock"
            )
        );
        assert!(placed.iter().filter(|p| p.1.is_some()).count() == 1);
        assert_eq!(clock.ahead_ms(), HOUR);
        // A step forward of the same size brings it back onto the wall clock, no hole.
        let p = clock.place(at(T0 + 6000, 6000));
        assert_eq!(p.t_ms - T0, 6000);
        assert!(p.step.unwrap().reason.ends_with("is now on it again"));
        assert_eq!(clock.ahead_ms(), 0);
    }

    #[test]
    fn a_step_forward_follows_the_wall_clock_with_a_gap() {
        let mut clock = HistoryClock::new(None, 1000);
        let placed = run(&mut clock, HOUR, 5);
        let times: Vec<i64> = placed.iter().map(|p| p.0).collect();
        assert_eq!(times, [0, 1000, 2000, HOUR + 3000, HOUR + 4000]);
        let gap = placed[3].1.as_deref().unwrap();
        assert!(
            gap.starts_with(&format!(
                "2000..{} clock-step: the wall clock jumped forward 1 h 0 min",
                HOUR + 3000
            )),
            "{gap}"
        );
        assert_eq!(clock.ahead_ms(), 0);
    }

    #[test]
    fn jitter_is_followed_without_a_gap_and_never_backwards() {
        let mut clock = HistoryClock::new(None, 100);
        let mut last = i64::MIN;
        // Wall readings wobble by ±40 ms around the monotonic clock, some out of order.
        for (i, wobble) in [0, 40, -40, 30, -30, 0, 40, -40].iter().enumerate() {
            let i = i64::try_from(i).unwrap();
            let p = clock.place(at(T0 + i * 10 + wobble, i * 10));
            assert!(p.step.is_none());
            assert!(p.t_ms > last);
            last = p.t_ms;
        }
        assert_eq!(clock.ahead_ms(), 0);
    }

    #[test]
    fn a_session_after_a_future_sample_goes_on_after_it() {
        let mut clock = HistoryClock::new(Some(T0 + HOUR), 1000);
        let p = clock.place(at(T0, 0));
        assert_eq!(p.t_ms, T0 + HOUR + 1000);
        let gap = p.step.unwrap();
        assert_eq!((gap.from_ms, gap.to_ms), (T0 + HOUR, T0 + HOUR + 1000));
        assert!(
            gap.reason
                .starts_with("clock-step: the history's last sample is 1 h 0 min ahead"),
            "{}",
            gap.reason
        );
        assert_eq!(clock.place(at(T0 + 1000, 1000)).t_ms, T0 + HOUR + 2000);
        // A past last sample: the wall clock, no gap.
        let mut clock = HistoryClock::new(Some(T0 - 5000), 1000);
        assert_eq!(
            clock.place(at(T0, 0)),
            Placement {
                t_ms: T0,
                step: None
            }
        );
    }
}
