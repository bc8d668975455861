//! The `--since`/`--until` window of every command that reads the history (`history`,
//! `leaks`, `plot`, `export`), settled once ([`TimeWindow::resolve`]): the same forms, the
//! same default start for the commands that show a history, and `--since` after `--until`
//! the same usage error everywhere.

use anyhow::{Context, bail};
use jiff::tz::TimeZone;
use vramctl_core::wall_time::When;
use vramctl_store::TimeRange;

/// Without `--since`, a shown history starts this long before its last sample: `leaks`,
/// `plot` and `history` alike, so that one recording shows the same samples in each.
pub const DEFAULT_SPAN_MS: i64 = 24 * 3_600_000;

/// Where a window without `--since` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinceDefault {
    /// [`DEFAULT_SPAN_MS`] before the history's last sample (or before `--until`, when that
    /// is earlier); not the last hour before now, which an older recording has nothing in.
    /// What every command that shows a history reads.
    LastSpan,
    /// The beginning: for what copies or lists a whole history (`export`, `history
    /// --audit`) and for log files, which hold only what was asked to be read.
    Everything,
}

/// `--since` and `--until` as typed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimeWindow {
    /// `--since`: the start.
    pub since: Option<When>,
    /// `--until`: the end; none is the end of time.
    pub until: Option<When>,
}

impl TimeWindow {
    /// The range on the time line: `--since`/`--until` resolved at `now_ms` in `tz`, the
    /// start defaulting to `default` over a history spanning `bounds` (first, last sample).
    ///
    /// # Errors
    /// A time that cannot be resolved in `tz`, or a start after the end.
    pub fn resolve(
        &self,
        now_ms: i64,
        tz: &TimeZone,
        bounds: Option<(i64, i64)>,
        default: SinceDefault,
    ) -> anyhow::Result<TimeRange> {
        let to_ms = match &self.until {
            Some(until) => until.resolve(now_ms, tz).context("--until")?,
            None => i64::MAX,
        };
        let from_ms = match (&self.since, default) {
            (Some(since), _) => since.resolve(now_ms, tz).context("--since")?,
            (None, SinceDefault::LastSpan) => default_since_ms(bounds, to_ms),
            (None, SinceDefault::Everything) => i64::MIN,
        };
        if from_ms > to_ms {
            bail!(
                "--since '{}' is after --until",
                self.since
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            );
        }
        Ok(TimeRange { from_ms, to_ms })
    }
}

/// Where a window without `--since` starts: [`DEFAULT_SPAN_MS`] before the history's last
/// sample (or before `until_ms`, when that is earlier); `i64::MIN` (everything) for a
/// history without samples.
fn default_since_ms(bounds: Option<(i64, i64)>, until_ms: i64) -> i64 {
    bounds.map_or(i64::MIN, |(_, last)| {
        last.min(until_ms).saturating_sub(DEFAULT_SPAN_MS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_MS: i64 = 1_700_000_000_000;
    const HOUR_MS: i64 = 3_600_000;

    fn when(text: &str) -> Option<When> {
        Some(text.parse().expect("a valid WHEN"))
    }

    fn resolve(window: &TimeWindow, default: SinceDefault) -> anyhow::Result<TimeRange> {
        let bounds = Some((NOW_MS - 100 * HOUR_MS, NOW_MS - 10 * HOUR_MS));
        window.resolve(NOW_MS, &TimeZone::UTC, bounds, default)
    }

    #[test]
    fn since_after_until_is_an_error_whatever_the_default() {
        let window = TimeWindow {
            since: when("1h"),
            until: when("2h"),
        };
        for default in [SinceDefault::LastSpan, SinceDefault::Everything] {
            let err = resolve(&window, default).expect_err("since after until");
            assert_eq!(err.to_string(), "--since '1h' is after --until");
        }
    }

    #[test]
    fn without_since_a_shown_history_starts_a_day_before_its_last_sample() {
        let range = resolve(&TimeWindow::default(), SinceDefault::LastSpan).expect("resolves");
        assert_eq!(range.from_ms, NOW_MS - 10 * HOUR_MS - DEFAULT_SPAN_MS);
        assert_eq!(range.to_ms, i64::MAX);
        let until_earlier = TimeWindow {
            since: None,
            until: when("50h"),
        };
        let range = resolve(&until_earlier, SinceDefault::LastSpan).expect("resolves");
        assert_eq!(range.from_ms, NOW_MS - 50 * HOUR_MS - DEFAULT_SPAN_MS);
        let range = resolve(&TimeWindow::default(), SinceDefault::Everything).expect("resolves");
        assert_eq!(range.from_ms, i64::MIN);
    }

    #[test]
    fn an_empty_history_is_read_whole() {
        let range = TimeWindow::default()
            .resolve(NOW_MS, &TimeZone::UTC, None, SinceDefault::LastSpan)
            .expect("resolves");
        assert_eq!((range.from_ms, range.to_ms), (i64::MIN, i64::MAX));
    }
}
