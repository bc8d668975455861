//! The time axis: ticks on round local-time boundaries and labels whose precision follows
//! the span (seconds for minutes, `HH:MM` for hours, dates for days).

use std::ops::Range;

use jiff::tz::TimeZone;
use jiff::{RoundMode, Timestamp, Unit, ZonedDateTime, ZonedDateTimeRound};
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};

/// Half the width given to a chart whose samples all share one instant, so the point sits in
/// the middle of a minute-wide axis instead of on a zero-width one.
const ZERO_SPAN_PAD_MS: i64 = 30_000;

/// A tick spacing: `count` of `unit`, rounded in civil (local) time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Step {
    unit: Unit,
    count: i64,
}

impl Step {
    const fn new(unit: Unit, count: i64) -> Self {
        Self { unit, count }
    }

    fn approx_ms(self) -> i64 {
        let unit_ms = match self.unit {
            Unit::Second => 1_000,
            Unit::Minute => 60_000,
            Unit::Hour => 3_600_000,
            _ => 86_400_000,
        };
        unit_ms * self.count
    }
}

/// Candidate spacings, finest first. Sub-day counts divide the next unit evenly, which is
/// what civil-time rounding requires and what makes ticks land on :00, :15, :30 and so on.
const STEPS: [Step; 24] = [
    Step::new(Unit::Second, 1),
    Step::new(Unit::Second, 2),
    Step::new(Unit::Second, 5),
    Step::new(Unit::Second, 10),
    Step::new(Unit::Second, 15),
    Step::new(Unit::Second, 30),
    Step::new(Unit::Minute, 1),
    Step::new(Unit::Minute, 2),
    Step::new(Unit::Minute, 5),
    Step::new(Unit::Minute, 10),
    Step::new(Unit::Minute, 15),
    Step::new(Unit::Minute, 30),
    Step::new(Unit::Hour, 1),
    Step::new(Unit::Hour, 2),
    Step::new(Unit::Hour, 3),
    Step::new(Unit::Hour, 6),
    Step::new(Unit::Hour, 12),
    Step::new(Unit::Day, 1),
    Step::new(Unit::Day, 2),
    Step::new(Unit::Day, 7),
    Step::new(Unit::Day, 14),
    Step::new(Unit::Day, 30),
    Step::new(Unit::Day, 91),
    Step::new(Unit::Day, 365),
];

/// One labelled tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tick {
    pub(crate) at_ms: i64,
    pub(crate) label: String,
}

/// The x axis of every panel: a linear map from Unix milliseconds to pixels, with ticks
/// planned once for the whole chart so stacked panels line up.
#[derive(Debug, Clone)]
pub(crate) struct TimeAxis {
    start_ms: i64,
    end_ms: i64,
    ticks: Vec<Tick>,
    /// Says which clock the labels are in and which dates the chart covers.
    pub(crate) desc: String,
}

impl TimeAxis {
    /// Plans at most `max_ticks` ticks over `start_ms..=end_ms` in `tz`. Never fails: an
    /// empty or reversed range is widened, times beyond what a calendar can show are
    /// clamped, and a time zone that cannot convert an instant leaves it unlabelled.
    pub(crate) fn plan(start_ms: i64, end_ms: i64, tz: &TimeZone, max_ticks: usize) -> Self {
        let min_ms = Timestamp::MIN.as_millisecond() + ZERO_SPAN_PAD_MS;
        let max_ms = Timestamp::MAX.as_millisecond() - ZERO_SPAN_PAD_MS;
        let (mut start_ms, mut end_ms) = (
            start_ms.min(end_ms).clamp(min_ms, max_ms),
            start_ms.max(end_ms).clamp(min_ms, max_ms),
        );
        if start_ms == end_ms {
            start_ms -= ZERO_SPAN_PAD_MS;
            end_ms += ZERO_SPAN_PAD_MS;
        }
        let span_ms = end_ms - start_ms;
        let max_ticks = i64::try_from(max_ticks.max(2)).unwrap_or(i64::MAX);
        let step = STEPS
            .iter()
            .copied()
            .find(|step| span_ms / step.approx_ms() < max_ticks)
            .unwrap_or(STEPS[STEPS.len() - 1]);
        let ticks = tick_times(start_ms, end_ms, tz, step)
            .map(|zdt| zdt.timestamp().as_millisecond())
            .collect::<Vec<_>>();
        let ticks = label_ticks(&ticks, tz, step);
        let desc = describe(start_ms, end_ms, tz);
        Self {
            start_ms,
            end_ms,
            ticks,
            desc,
        }
    }

    #[cfg(test)]
    pub(crate) fn ticks(&self) -> &[Tick] {
        &self.ticks
    }

    pub(crate) fn start_ms(&self) -> i64 {
        self.start_ms
    }

    pub(crate) fn end_ms(&self) -> i64 {
        self.end_ms
    }

    /// Whether `at_ms` falls on the axis.
    pub(crate) fn contains(&self, at_ms: i64) -> bool {
        (self.start_ms..=self.end_ms).contains(&at_ms)
    }
}

/// Tick instants from the first round boundary at or after `start_ms` up to `end_ms`.
fn tick_times(
    start_ms: i64,
    end_ms: i64,
    tz: &TimeZone,
    step: Step,
) -> impl Iterator<Item = ZonedDateTime> {
    let first = Timestamp::from_millisecond(start_ms)
        .ok()
        .map(|ts| ts.to_zoned_datetime(tz.clone()))
        .and_then(|zdt| ceil_to(&zdt, step));
    let mut next = first;
    let mut last_ms = i64::MIN;
    std::iter::from_fn(move || {
        let current = next.take()?;
        let current_ms = current.timestamp().as_millisecond();
        if current_ms > end_ms || current_ms <= last_ms {
            return None;
        }
        last_ms = current_ms;
        next = advance(&current, step);
        Some(current)
    })
}

fn ceil_to(zdt: &ZonedDateTime, step: Step) -> Option<ZonedDateTime> {
    if step.unit == Unit::Day {
        // Day rounding only takes an increment of 1; multi-day steps start at the next
        // local midnight and count whole days from there.
        return zdt
            .round(
                ZonedDateTimeRound::new()
                    .smallest(Unit::Day)
                    .mode(RoundMode::Ceil),
            )
            .ok();
    }
    zdt.round(
        ZonedDateTimeRound::new()
            .smallest(step.unit)
            .increment(step.count)
            .mode(RoundMode::Ceil),
    )
    .ok()
}

fn advance(zdt: &ZonedDateTime, step: Step) -> Option<ZonedDateTime> {
    let span = match step.unit {
        Unit::Second => jiff::Span::new().seconds(step.count),
        Unit::Minute => jiff::Span::new().minutes(step.count),
        Unit::Hour => jiff::Span::new().hours(step.count),
        _ => return zdt.checked_add(jiff::Span::new().days(step.count)).ok(),
    };
    let next = zdt.checked_add(span).ok()?;
    // Across a DST change, adding hours leaves civil time off the grid (01:00 + 2h = 02:00
    // becomes 03:00); snapping back keeps labels round. The caller drops a tick that did not
    // move forward.
    next.round(
        ZonedDateTimeRound::new()
            .smallest(step.unit)
            .increment(step.count)
            .mode(RoundMode::Trunc),
    )
    .ok()
    .filter(|snapped| snapped > zdt)
    .or(Some(next))
}

/// Labels: `HH:MM:SS` below a minute, `HH:MM` below a day (with the date in place of
/// `00:00` at midnight, so a multi-day span shows where days begin), dates above.
fn label_ticks(ticks_ms: &[i64], tz: &TimeZone, step: Step) -> Vec<Tick> {
    let zoned = |ms: i64| {
        Timestamp::from_millisecond(ms)
            .ok()
            .map(|ts| ts.to_zoned_datetime(tz.clone()))
    };
    let years_differ = match (ticks_ms.first(), ticks_ms.last()) {
        (Some(&a), Some(&b)) => zoned(a).map(|z| z.year()) != zoned(b).map(|z| z.year()),
        _ => false,
    };
    let date_format = if years_differ { "%Y-%m-%d" } else { "%b %-d" };
    ticks_ms
        .iter()
        .filter_map(|&at_ms| {
            let zdt = zoned(at_ms)?;
            let at_midnight = zdt.hour() == 0 && zdt.minute() == 0 && zdt.second() == 0;
            let format = match step.unit {
                Unit::Day => date_format,
                _ if at_midnight => date_format,
                Unit::Second => "%H:%M:%S",
                _ => "%H:%M",
            };
            Some(Tick {
                at_ms,
                label: zdt.strftime(format).to_string(),
            })
        })
        .collect()
}

/// `time (UTC) · 2026-11-03` or `time (Europe/Berlin) · 2026-11-03 – 2026-11-05`.
fn describe(start_ms: i64, end_ms: i64, tz: &TimeZone) -> String {
    let day = |ms: i64| {
        Timestamp::from_millisecond(ms)
            .ok()
            .map(|ts| ts.to_zoned_datetime(tz.clone()))
    };
    let zone = match (tz.iana_name(), day(start_ms)) {
        (Some(name), _) => name.to_owned(),
        (None, Some(zdt)) => zdt.strftime("UTC%:z").to_string(),
        (None, None) => "local".to_owned(),
    };
    let dates = match (day(start_ms), day(end_ms)) {
        (Some(a), Some(b)) if a.date() == b.date() => a.date().to_string(),
        (Some(a), Some(b)) => format!("{} – {}", a.date(), b.date()),
        _ => String::new(),
    };
    if dates.is_empty() {
        format!("time ({zone})")
    } else {
        format!("time ({zone}) · {dates}")
    }
}

impl Ranged for TimeAxis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = i64;

    fn map(&self, value: &i64, limit: (i32, i32)) -> i32 {
        let span = i128::from(self.end_ms) - i128::from(self.start_ms);
        let offset = i128::from(*value) - i128::from(self.start_ms);
        let pixels = i128::from(limit.1) - i128::from(limit.0);
        // Integer maths on i128 so u64-scale timestamps cannot overflow; `span` is never 0
        // because `plan` widens an empty range.
        let mapped = i128::from(limit.0) + offset * pixels / span.max(1);
        i32::try_from(mapped.clamp(i128::from(i32::MIN), i128::from(i32::MAX))).unwrap_or_default()
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<i64> {
        // Only the planned ticks, and only as bold grid lines: light lines between them add
        // noise without information.
        if hint.weight().allow_light_points() {
            return Vec::new();
        }
        self.ticks.iter().map(|tick| tick.at_ms).collect()
    }

    fn range(&self) -> Range<i64> {
        self.start_ms..self.end_ms
    }
}

impl ValueFormatter<i64> for TimeAxis {
    fn format_ext(&self, value: &i64) -> String {
        self.ticks
            .iter()
            .find(|tick| tick.at_ms == *value)
            .map(|tick| tick.label.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_millisecond()
    }

    fn labels(axis: &TimeAxis) -> Vec<&str> {
        axis.ticks().iter().map(|t| t.label.as_str()).collect()
    }

    #[test]
    fn minutes_get_seconds() {
        let axis = TimeAxis::plan(
            ms("2026-11-03T14:00:07Z"),
            ms("2026-11-03T14:02:00Z"),
            &TimeZone::UTC,
            8,
        );
        assert_eq!(
            labels(&axis),
            [
                "14:00:15", "14:00:30", "14:00:45", "14:01:00", "14:01:15", "14:01:30", "14:01:45",
                "14:02:00"
            ]
        );
    }

    #[test]
    fn hours_get_hours_and_minutes_on_round_boundaries() {
        let axis = TimeAxis::plan(
            ms("2026-11-03T13:47:00Z"),
            ms("2026-11-03T18:10:00Z"),
            &TimeZone::UTC,
            10,
        );
        assert_eq!(
            labels(&axis),
            [
                "14:00", "14:30", "15:00", "15:30", "16:00", "16:30", "17:00", "17:30", "18:00"
            ]
        );
    }

    #[test]
    fn days_get_dates() {
        let axis = TimeAxis::plan(
            ms("2026-11-03T13:00:00Z"),
            ms("2026-11-09T02:00:00Z"),
            &TimeZone::UTC,
            8,
        );
        assert_eq!(
            labels(&axis),
            ["Nov 4", "Nov 5", "Nov 6", "Nov 7", "Nov 8", "Nov 9"]
        );
        assert_eq!(axis.desc, "time (UTC) · 2026-11-03 – 2026-11-09");
    }

    #[test]
    fn midnight_shows_the_date_when_hours_cross_days() {
        let axis = TimeAxis::plan(
            ms("2026-11-03T18:00:00Z"),
            ms("2026-11-04T06:00:00Z"),
            &TimeZone::UTC,
            8,
        );
        assert_eq!(
            labels(&axis),
            [
                "18:00", "20:00", "22:00", "Nov 4", "02:00", "04:00", "06:00"
            ]
        );
    }

    #[test]
    fn labels_are_in_the_given_zone() {
        // Fixed offsets and POSIX rules, not tzdb names: CI may have no /usr/share/zoneinfo.
        let tz = TimeZone::posix("IST-5:30").unwrap();
        let axis = TimeAxis::plan(
            ms("2026-11-03T08:00:00Z"),
            ms("2026-11-03T10:00:00Z"),
            &tz,
            5,
        );
        // 08:00Z is 13:30 in India (+05:30); ticks stay on the local half hour.
        assert_eq!(labels(&axis), ["13:30", "14:00", "14:30", "15:00", "15:30"]);
        assert!(axis.desc.starts_with("time (UTC+05:30)"), "{}", axis.desc);
    }

    #[test]
    fn dst_change_keeps_ticks_increasing_and_round() {
        let tz = TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        // Clocks go back from 03:00 to 02:00 local on 2026-10-25.
        let axis = TimeAxis::plan(
            ms("2026-10-24T22:00:00Z"),
            ms("2026-10-25T06:00:00Z"),
            &tz,
            6,
        );
        let at: Vec<i64> = axis.ticks().iter().map(|t| t.at_ms).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?}");
        // 02:00 happens twice that night, and both are labelled as the clock shows them.
        assert_eq!(
            labels(&axis),
            ["Oct 25", "02:00", "02:00", "04:00", "06:00"]
        );
    }

    #[test]
    fn zero_span_is_widened_around_the_instant() {
        let at = ms("2026-11-03T14:00:00Z");
        let axis = TimeAxis::plan(at, at, &TimeZone::UTC, 6);
        assert!(axis.start_ms() < at && at < axis.end_ms());
        assert!(labels(&axis).contains(&"14:00:00"));
    }

    #[test]
    fn extreme_times_do_not_panic() {
        let axis = TimeAxis::plan(i64::MIN, i64::MAX, &TimeZone::UTC, 10);
        assert!(axis.ticks().len() <= 10);
        assert_eq!(axis.map(&axis.end_ms(), (0, 1000)), 1000);
        assert_eq!(axis.map(&axis.start_ms(), (0, 1000)), 0);
        let axis = TimeAxis::plan(i64::MAX, i64::MAX, &TimeZone::UTC, 0);
        assert!(axis.start_ms() < axis.end_ms());
    }

    #[test]
    fn map_is_linear_over_the_pixel_range() {
        let axis = TimeAxis::plan(0, 1_000_000, &TimeZone::UTC, 5);
        assert_eq!(axis.map(&0, (100, 1100)), 100);
        assert_eq!(axis.map(&500_000, (100, 1100)), 600);
        assert_eq!(axis.map(&1_000_000, (100, 1100)), 1100);
    }
}
