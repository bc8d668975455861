//! Durations as people type them: the one parser behind every flag that takes a time
//! (`--interval`, `--grace`, `--idle-for`, …), reap's policy file and the store's
//! retention spec.
//!
//! Accepted: a number with units, combined (`500ms`, `2s`, `1.5s`, `1h30m`, `2 hours 30
//! minutes`, `30d`, `2w`), or a bare number meaning seconds (`10`, `0.5`), as in
//! `nvidia-smi -l 5` and `watch -n 0.5`. Units: `ms`, `s`, `m` (minutes), `h`, `d` (24 h),
//! `w` (7 d), `y` (365 d); months are refused, having no fixed length. jiff's "friendly"
//! duration grammar does the reading; this module gives it the bare-number rule, fixed
//! lengths for days, weeks and years, and errors in the project's style.

use std::time::Duration;

use jiff::fmt::friendly::SpanParser;
use jiff::{SignedDuration, SpanRelativeTo};

/// What [`parse`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// Not a duration in any accepted form.
    #[error("'{text}' is not a duration; use e.g. 500ms, 2s, 1.5s, 1h30m or a number of seconds")]
    Malformed {
        /// What was given.
        text: String,
    },
    /// A negative duration where only a length makes sense.
    #[error("'{text}' is negative; give a length of time, e.g. 2s")]
    Negative {
        /// What was given.
        text: String,
    },
    /// Months (or longer calendar units than years) have no fixed length.
    #[error("'{text}' has months, which differ in length; use days, e.g. 30d")]
    Months {
        /// What was given.
        text: String,
    },
    /// Longer than can be represented (about 292 years in milliseconds is far beyond it).
    #[error("'{text}' is too long")]
    OutOfRange {
        /// What was given.
        text: String,
    },
}

/// Days in the `y` unit (the store's retention has always meant 365 days by it).
const DAYS_PER_YEAR: i64 = 365;

static PARSER: SpanParser = SpanParser::new();

/// A length of time: `500ms`, `2s`, `1h30m`, `1.5s`, or a bare number of seconds.
///
/// # Errors
/// Not such a duration, negative, in months, or too long.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let signed = parse_signed(text)?;
    Duration::try_from(signed).map_err(|_| DurationError::Negative {
        text: text.trim().to_owned(),
    })
}

/// [`parse`] in whole milliseconds (rounded to the nearest).
///
/// # Errors
/// As for [`parse`].
pub fn parse_ms(text: &str) -> Result<i64, DurationError> {
    let duration = parse(text)?;
    let ms = duration.as_micros().saturating_add(500) / 1000;
    i64::try_from(ms).map_err(|_| DurationError::OutOfRange {
        text: text.trim().to_owned(),
    })
}

/// A duration that may be negative (`-1h`, `1h ago`), for offsets from a time.
///
/// # Errors
/// Not a duration, in months, or too long.
pub fn parse_signed(text: &str) -> Result<SignedDuration, DurationError> {
    let text = text.trim();
    let malformed = || DurationError::Malformed {
        text: text.to_owned(),
    };
    let too_long = || DurationError::OutOfRange {
        text: text.to_owned(),
    };
    if text.is_empty() {
        return Err(malformed());
    }
    // A bare number is seconds. Only plain decimal forms: f64's parser also takes `inf`,
    // `NaN` and `1e3`, which nobody means as a duration.
    if text
        .trim_start_matches(['-', '+'])
        .chars()
        .all(|c| c.is_ascii_digit() || c == '.')
    {
        let secs: f64 = text.parse().map_err(|_| malformed())?;
        return SignedDuration::try_from_secs_f64(secs).map_err(|_| too_long());
    }
    let span = PARSER.parse_span(text).map_err(|_| malformed())?;
    if span.get_months() != 0 {
        return Err(DurationError::Months {
            text: text.to_owned(),
        });
    }
    // Years as 365 days, then every day as 24 hours: lengths, not calendar arithmetic.
    let years_as_days = i64::from(span.get_years())
        .checked_mul(DAYS_PER_YEAR)
        .and_then(|d| d.checked_add(i64::from(span.get_days())))
        .ok_or_else(too_long)?;
    let span = span
        .years(0)
        .try_days(years_as_days)
        .map_err(|_| too_long())?;
    span.to_duration(SpanRelativeTo::days_are_24_hours())
        .map_err(|_| too_long())
}

/// `d` as a flag would take it, compact and exact to the millisecond: `500ms`, `2s`,
/// `1h30m`, `1s500ms`, `2d`; [`parse`] reads it back.
pub fn format(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut text = String::new();
    for (unit, len) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
        ("ms", 1),
    ] {
        if ms >= len {
            text.push_str(&format!("{}{unit}", ms / len));
            ms %= len;
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> Result<i64, DurationError> {
        parse_ms(text)
    }

    #[test]
    fn every_documented_form_parses() {
        assert_eq!(ms("500ms"), Ok(500));
        assert_eq!(ms("2s"), Ok(2_000));
        assert_eq!(ms("1.5s"), Ok(1_500));
        assert_eq!(ms("1h30m"), Ok(5_400_000));
        assert_eq!(ms("1h 30m"), Ok(5_400_000));
        assert_eq!(ms("10m"), Ok(600_000));
        assert_eq!(ms("24h"), Ok(86_400_000));
        assert_eq!(ms("30d"), Ok(30 * 86_400_000));
        assert_eq!(ms("2w"), Ok(14 * 86_400_000));
        assert_eq!(ms("1y"), Ok(365 * 86_400_000));
        assert_eq!(ms("90 sec"), Ok(90_000));
        assert_eq!(ms("0s"), Ok(0));
    }

    #[test]
    fn a_bare_number_is_seconds() {
        // `nvidia-smi -l 5`, `watch -n 0.5`: people type seconds without a unit.
        assert_eq!(ms("10"), Ok(10_000));
        assert_eq!(ms("0.5"), Ok(500));
        assert_eq!(ms(" 2 "), Ok(2_000));
        assert_eq!(ms("0"), Ok(0));
    }

    #[test]
    fn nonsense_is_refused_with_the_value() {
        for text in ["", "ten m", "5 bananas", "inf", "NaN", "1e3", "1.2.3", "m"] {
            let err = ms(text).unwrap_err();
            assert!(
                matches!(err, DurationError::Malformed { .. }),
                "{text}: {err:?}"
            );
        }
        assert_eq!(
            ms("ten m").unwrap_err().to_string(),
            "'ten m' is not a duration; use e.g. 500ms, 2s, 1.5s, 1h30m or a number of seconds"
        );
    }

    #[test]
    fn lengths_are_never_negative_but_offsets_may_be() {
        assert!(matches!(parse("-1h"), Err(DurationError::Negative { .. })));
        assert!(matches!(parse("-5"), Err(DurationError::Negative { .. })));
        assert_eq!(parse_signed("-1h"), Ok(SignedDuration::from_hours(-1)));
        assert_eq!(parse_signed("1h ago"), Ok(SignedDuration::from_hours(-1)));
        assert_eq!(parse_signed("-90"), Ok(SignedDuration::from_secs(-90)));
    }

    #[test]
    fn formatted_durations_read_back() {
        for (ms, text) in [
            (500, "500ms"),
            (2_000, "2s"),
            (5_400_000, "1h30m"),
            (1_500, "1s500ms"),
            (0, "0s"),
            (172_800_000, "2d"),
        ] {
            let d = Duration::from_millis(ms);
            assert_eq!(format(d), text);
            assert_eq!(parse(text), Ok(d));
        }
    }

    #[test]
    fn months_have_no_length() {
        assert!(matches!(ms("1mo"), Err(DurationError::Months { .. })));
    }

    #[test]
    fn too_long_is_refused_not_wrapped() {
        assert!(matches!(
            ms("99999999999999999999"),
            Err(DurationError::OutOfRange { .. })
        ));
        assert_eq!(ms("10000y"), Ok(10_000 * 365 * 86_400_000));
    }
}
