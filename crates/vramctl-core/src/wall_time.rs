//! Wall-clock times as people read and type them, for every command: one time zone (`--tz`,
//! else `TZ`, else the system's), times printed in it with the zone said once per output
//! ([`zone_label`]) and the date where a range spans days ([`clock`], [`same_day`]), and
//! the `--since` / `--until` forms ([`When`]).
//!
//! Machine outputs (`--json`, CSV timestamps) keep RFC 3339 UTC; this module is for people.

use std::str::FromStr;

use jiff::Timestamp;
use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;

/// What this module refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WallTimeError {
    /// `--tz` names no zone.
    #[error("unknown time zone '{name}' ({why}); use a name like UTC or Europe/Paris")]
    UnknownZone {
        /// The name given.
        name: String,
        /// The zone database's reason.
        why: String,
    },
    /// Not a time in any accepted form.
    #[error(
        "'{text}' is not a time; use a duration back from now (10m, 24h, -1h), 'all', 'now', RFC 3339, or 'YYYY-MM-DD HH:MM[:SS]'"
    )]
    NotATime {
        /// What was given.
        text: String,
    },
    /// A local time that the zone skips (a daylight-saving gap).
    #[error(
        "'{text}' does not exist in that time zone ({why}); pick a time outside the clock change"
    )]
    NoSuchLocalTime {
        /// What was given.
        text: String,
        /// jiff's reason.
        why: String,
    },
}

/// `--tz NAME`, else the system's zone (which honours `TZ`).
///
/// # Errors
/// A name the zone database does not know.
pub fn zone(name: Option<&str>) -> Result<TimeZone, WallTimeError> {
    match name {
        None => Ok(system_zone()),
        Some(name) => TimeZone::get(name).map_err(|e| WallTimeError::UnknownZone {
            name: name.to_owned(),
            why: e.to_string(),
        }),
    }
}

/// The system's zone: `TZ` when set (jiff reads its every form), else `/etc/localtime`.
///
/// Why not `TimeZone::system()` alone: to name the zone it looks the symlink's target up in
/// the zone database, whose first use lists every directory of `/usr/share/zoneinfo` — 2.4 ms
/// of a one-shot `vramctl status` on the fake NVML here (docs/benchmarks.md). Here the
/// name comes from the link and the rules from the file it names, read once (TZif files are
/// a few KiB; more than [`MAX_TZIF_BYTES`] is not a zone file). Anything unexpected — no
/// link, a target outside a `zoneinfo/` directory, an unreadable file — falls back to jiff.
pub fn system_zone() -> TimeZone {
    if std::env::var_os("TZ").is_some() {
        return TimeZone::system();
    }
    localtime_zone(std::path::Path::new("/etc/localtime")).unwrap_or_else(TimeZone::system)
}

/// More than any TZif file holds (the largest in tzdata is under 4 KiB).
pub const MAX_TZIF_BYTES: u64 = 256 * 1024;

fn localtime_zone(link: &std::path::Path) -> Option<TimeZone> {
    use std::io::Read;
    let target = std::fs::read_link(link).ok()?;
    let target = target.to_str()?;
    let name = &target[target.rfind("zoneinfo/")? + "zoneinfo/".len()..];
    if name.is_empty() {
        return None;
    }
    let mut bytes = Vec::new();
    std::fs::File::open(link)
        .ok()?
        .take(MAX_TZIF_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > MAX_TZIF_BYTES {
        return None;
    }
    TimeZone::tzif(name, &bytes).ok()
}

/// The zone as a reader knows it at `at_unix_ms`: its abbreviation (`UTC`, `CET`, `CEST`),
/// or `UTC+05:30` where it has none.
pub fn zone_label(tz: &TimeZone, at_unix_ms: i64) -> String {
    let Ok(at) = Timestamp::from_millisecond(at_unix_ms) else {
        return "UTC".to_owned();
    };
    let zoned = at.to_zoned_datetime(tz.clone());
    let abbreviation = zoned.strftime("%Z").to_string();
    if abbreviation.is_empty() || abbreviation.starts_with(['+', '-']) {
        zoned.strftime("UTC%:z").to_string()
    } else {
        abbreviation
    }
}

/// `HH:MM:SS` in `tz`, with the date first when `with_date`.
pub fn clock(tz: &TimeZone, t_unix_ms: i64, with_date: bool) -> String {
    let format = if with_date {
        "%Y-%m-%d %H:%M:%S"
    } else {
        "%H:%M:%S"
    };
    Timestamp::from_millisecond(t_unix_ms).map_or_else(
        |_| t_unix_ms.to_string(),
        |ts| {
            ts.to_zoned_datetime(tz.clone())
                .strftime(format)
                .to_string()
        },
    )
}

/// `YYYY-MM-DD HH:MM:SS ZONE`: one time standing alone, fully labelled.
pub fn labelled(tz: &TimeZone, t_unix_ms: i64) -> String {
    format!(
        "{} {}",
        clock(tz, t_unix_ms, true),
        zone_label(tz, t_unix_ms)
    )
}

/// Whether two times fall on the same day in `tz`.
pub fn same_day(tz: &TimeZone, a_unix_ms: i64, b_unix_ms: i64) -> bool {
    let day = |t: i64| {
        Timestamp::from_millisecond(t)
            .ok()
            .map(|ts| ts.to_zoned_datetime(tz.clone()).date())
    };
    day(a_unix_ms) == day(b_unix_ms)
}

/// For an output that goes on (`leaks --watch`): times print as `HH:MM:SS`, and the date
/// and zone get a line of their own before the first time and whenever the day changes.
#[derive(Debug, Clone)]
pub struct DayLines {
    tz: TimeZone,
    day: Option<Date>,
}

impl DayLines {
    /// Nothing printed yet.
    pub fn new(tz: TimeZone) -> Self {
        Self { tz, day: None }
    }

    /// `2026-11-29 (times in UTC)` when `t_unix_ms` falls on another day than the last time
    /// asked about, else `None`.
    pub fn day_line(&mut self, t_unix_ms: i64) -> Option<String> {
        let zoned = Timestamp::from_millisecond(t_unix_ms)
            .ok()?
            .to_zoned_datetime(self.tz.clone());
        let day = zoned.date();
        if self.day == Some(day) {
            return None;
        }
        self.day = Some(day);
        Some(format!(
            "{day} (times in {})",
            zone_label(&self.tz, t_unix_ms)
        ))
    }

    /// `HH:MM:SS` in the zone.
    pub fn clock(&self, t_unix_ms: i64) -> String {
        clock(&self.tz, t_unix_ms, false)
    }
}

/// A `--since` / `--until` value, read when the command line is parsed and placed on the
/// time line once the command knows "now" and the zone ([`When::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum When {
    /// `all`: the beginning (for `--since`) or the end of time.
    All,
    /// `now`.
    Now,
    /// A duration back from now: `10m`, `-10m` and `10m ago` alike.
    Ago {
        /// How far back, in milliseconds.
        ms: i64,
    },
    /// An absolute time (RFC 3339 with an offset).
    At {
        /// Milliseconds since the Unix epoch.
        unix_ms: i64,
    },
    /// A local date and time (`YYYY-MM-DD HH:MM[:SS]`, `YYYY-MM-DD`), in the command's zone.
    Local {
        /// The time as typed.
        civil: DateTime,
        /// The text as typed, for errors.
        text: String,
    },
}

impl FromStr for When {
    type Err = WallTimeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        match text {
            "all" => return Ok(Self::All),
            "now" => return Ok(Self::Now),
            _ => {}
        }
        if let Ok(offset) = crate::duration::parse_signed(text) {
            // Back from now, whichever sign was typed: `-1h` is how "an hour ago" reads.
            let ms = i64::try_from(offset.as_millis().unsigned_abs()).unwrap_or(i64::MAX);
            return Ok(Self::Ago { ms });
        }
        if let Ok(t) = text.parse::<Timestamp>() {
            return Ok(Self::At {
                unix_ms: t.as_millisecond(),
            });
        }
        let civil = ["%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S"]
            .iter()
            .find_map(|format| DateTime::strptime(format, text).ok())
            .or_else(|| {
                Date::strptime("%Y-%m-%d", text)
                    .ok()
                    .map(|d| d.to_datetime(Time::midnight()))
            });
        match civil {
            Some(civil) => Ok(Self::Local {
                civil,
                text: text.to_owned(),
            }),
            None => Err(WallTimeError::NotATime {
                text: text.to_owned(),
            }),
        }
    }
}

impl std::fmt::Display for When {
    /// The value as a flag would take it back (`all`, `1h`, RFC 3339, the local time typed).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::All => f.write_str("all"),
            Self::Now => f.write_str("now"),
            Self::Ago { ms } => f.write_str(&crate::duration::format(
                std::time::Duration::from_millis(u64::try_from(*ms).unwrap_or(0)),
            )),
            Self::At { unix_ms } => match Timestamp::from_millisecond(*unix_ms) {
                Ok(t) => write!(f, "{t}"),
                Err(_) => write!(f, "{unix_ms}"),
            },
            Self::Local { text, .. } => f.write_str(text),
        }
    }
}

impl When {
    /// Milliseconds since the Unix epoch: `i64::MIN` for `all`.
    ///
    /// # Errors
    /// A local time the zone skips.
    pub fn resolve(&self, now_unix_ms: i64, tz: &TimeZone) -> Result<i64, WallTimeError> {
        match self {
            Self::All => Ok(i64::MIN),
            Self::Now => Ok(now_unix_ms),
            Self::Ago { ms } => Ok(now_unix_ms.saturating_sub(*ms)),
            Self::At { unix_ms } => Ok(*unix_ms),
            Self::Local { civil, text } => civil
                .to_zoned_datetime(tz.clone())
                .map(|z| z.timestamp().as_millisecond())
                .map_err(|e| WallTimeError::NoSuchLocalTime {
                    text: text.clone(),
                    why: e.to_string(),
                }),
        }
    }
}

/// [`When`] read and resolved at once.
///
/// # Errors
/// As for [`When::from_str`] and [`When::resolve`].
pub fn parse_when(text: &str, now_unix_ms: i64, tz: &TimeZone) -> Result<i64, WallTimeError> {
    text.parse::<When>()?.resolve(now_unix_ms, tz)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-29T20:31:31Z.
    const T: i64 = 1_795_984_291_000;

    #[test]
    fn since_forms() {
        let tz = TimeZone::UTC;
        assert_eq!(parse_when("10m", T, &tz), Ok(T - 600_000));
        assert_eq!(parse_when("all", T, &tz), Ok(i64::MIN));
        assert_eq!(parse_when("now", T, &tz), Ok(T));
        assert_eq!(parse_when("2026-11-29T20:31:31.715Z", T, &tz), Ok(T + 715));
        assert_eq!(parse_when("2026-11-29 20:31", T, &tz), Ok(T - 31_000));
        assert_eq!(parse_when("2026-11-29", T, &tz), Ok(T - 73_891_000));
        let err = parse_when("last tuesday", T, &tz).unwrap_err().to_string();
        assert!(err.starts_with("'last tuesday' is not a time"), "{err}");
    }

    #[test]
    fn a_negative_duration_is_that_long_ago() {
        // `--since -1h` read as a flag before; it means an hour ago, as `1h` does.
        let tz = TimeZone::UTC;
        for text in ["-1h", "1h", "1h ago", "-3600", "3600"] {
            assert_eq!(parse_when(text, T, &tz), Ok(T - 3_600_000), "{text}");
        }
    }

    #[test]
    fn local_times_are_in_the_zone_given() {
        let paris = TimeZone::get("Europe/Paris").unwrap();
        assert_eq!(parse_when("2026-11-29 21:31:31", T, &paris), Ok(T));
        assert_eq!(clock(&paris, T, false), "21:31:31");
        assert_eq!(clock(&TimeZone::UTC, T, true), "2026-11-29 20:31:31");
    }

    #[test]
    fn zones_are_labelled_by_abbreviation_or_offset() {
        assert_eq!(zone_label(&TimeZone::UTC, T), "UTC");
        let paris = TimeZone::get("Europe/Paris").unwrap();
        assert_eq!(zone_label(&paris, T), "CET");
        assert_eq!(zone_label(&paris, T - 120 * 86_400_000), "CEST");
        let fixed = TimeZone::fixed(jiff::tz::offset(5));
        assert_eq!(zone_label(&fixed, T), "UTC+05:00");
        assert_eq!(labelled(&paris, T), "2026-11-29 21:31:31 CET");
    }

    #[test]
    fn days_are_days_of_the_zone() {
        let paris = TimeZone::get("Europe/Paris").unwrap();
        // 23:30 UTC is the next day in Paris.
        let late = 1_795_995_000_000;
        assert!(same_day(&TimeZone::UTC, T, late));
        assert!(!same_day(&paris, T, late));
    }

    #[test]
    fn a_stream_says_the_date_and_zone_once_a_day() {
        let mut lines = DayLines::new(TimeZone::UTC);
        assert_eq!(
            lines.day_line(T).as_deref(),
            Some("2026-11-29 (times in UTC)")
        );
        assert_eq!(lines.day_line(T + 60_000), None);
        assert_eq!(
            lines.day_line(T + 86_400_000).as_deref(),
            Some("2026-11-30 (times in UTC)")
        );
    }

    #[test]
    fn an_unknown_zone_says_what_to_use() {
        let err = zone(Some("Mars/Olympus")).unwrap_err().to_string();
        assert!(err.starts_with("unknown time zone 'Mars/Olympus'"), "{err}");
    }

    #[test]
    fn the_local_zone_is_named_by_its_link_and_read_from_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let zoneinfo = dir.path().join("share/zoneinfo/Europe");
        std::fs::create_dir_all(&zoneinfo).unwrap();
        // A real zone's rules, under a name of our own: the rules must come from the file
        // and the name from the link.
        let berlin = jiff::tz::db().get("Europe/Berlin").unwrap();
        let Some(source) = ["/usr/share/zoneinfo/Europe/Berlin"]
            .iter()
            .find(|p| std::path::Path::new(p).exists())
        else {
            return; // no tzdata on this machine: nothing to read
        };
        std::fs::copy(source, zoneinfo.join("Testing")).unwrap();
        let link = dir.path().join("localtime");
        std::os::unix::fs::symlink(zoneinfo.join("Testing"), &link).unwrap();
        let tz = localtime_zone(&link).expect("read from the link");
        assert_eq!(tz.iana_name(), Some("Europe/Testing"));
        let summer = Timestamp::from_second(1_751_328_000).unwrap(); // 2025-07-01
        assert_eq!(
            tz.to_offset(summer),
            berlin.to_offset(summer),
            "the rules are the file's"
        );
        // Not a link, or a link outside a zoneinfo tree: not ours to name.
        assert!(localtime_zone(&zoneinfo.join("Testing")).is_none());
        let elsewhere = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(zoneinfo.join("Testing"), dir.path().join("x")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("x"), &elsewhere).unwrap();
        assert!(localtime_zone(&elsewhere).is_none());
    }
}
