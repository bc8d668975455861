//! The one-line human explanation of a verdict, built from the report's numbers.
//!
//! The analysis has no clock and no time zone: times default to UTC (`14:02:10 UTC`), and
//! a frontend that wants local time passes its own formatter in [`ExplainStyle`].

use super::{Basis, RegionKind, SeriesReport, Verdict};
use crate::analysis::trend::LeakRule;

/// How to name the device and print times.
pub struct ExplainStyle<'a> {
    /// The device as the user knows it, e.g. `GPU 0`.
    pub device: &'a str,
    /// Formats milliseconds since the Unix epoch as a clock time.
    pub time: &'a dyn Fn(i64) -> String,
}

/// `HH:MM:SS UTC` of a Unix time in milliseconds.
pub fn utc_clock(t_unix_ms: i64) -> String {
    let secs = t_unix_ms.div_euclid(1000).rem_euclid(86_400);
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Bytes in binary units with one decimal: `6.2 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Signed bytes: `+1.5 GiB`, `-200.0 MiB`.
fn signed_bytes(n: i64) -> String {
    let sign = if n < 0 { "-" } else { "+" };
    format!("{sign}{}", bytes(n.unsigned_abs()))
}

/// A rate in decimal units with two or three significant digits: `38 MB/s`, `2.5 GB/s`.
pub fn rate(bytes_per_sec: f64) -> String {
    const UNITS: [&str; 5] = ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"];
    let mut value = bytes_per_sec.abs();
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    let sign = if bytes_per_sec < 0.0 { "-" } else { "" };
    if value >= 10.0 {
        format!("{sign}{value:.0} {}", UNITS[unit])
    } else {
        format!("{sign}{value:.1} {}", UNITS[unit])
    }
}

/// A duration in the two largest units: `45 s`, `6 min`, `3 h 2 min`, `2 d 5 h`.
pub fn duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "an unknown time".to_owned();
    }
    let s = secs.round() as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", (secs / 60.0).round() as u64),
        3600..86_400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

fn p_value(p: f64) -> String {
    if p < 0.001 {
        "p < 0.001".to_owned()
    } else {
        format!("p = {p:.3}")
    }
}

/// `+1.2 GiB in 45 s, p < 0.001`.
fn evidence(r: &super::TrendTest) -> String {
    format!(
        "{} in {}, {}",
        signed_bytes(r.net_growth_bytes),
        duration(r.duration_sec),
        p_value(r.p_value())
    )
}

/// The evidence of a leak judged from its start, with the leak's own growth apart from
/// the start-up: `+180.0 MiB in 45 s after +718.0 MiB of start-up, p < 0.001`. The growth
/// since the start counts the CUDA context and the model's load (issue 35: "+898 MiB in
/// 45 s" where the leak itself added about 180 MB). The start-up is what the steadiness
/// test's first window grew beyond the leak's own rate over that window; a leak from its
/// first step has none, and its evidence reads as before.
fn evidence_apart_from_start_up(r: &super::TrendTest, st: &super::Steadiness) -> String {
    let first_window = r.net_growth_bytes.saturating_sub(st.later_growth_bytes) as f64;
    let at_rate = r.slope_bytes_per_sec.max(0.0) * st.window_sec;
    let start_up = (first_window - at_rate).max(0.0) as i64;
    if (start_up as f64) < START_UP_SHOWN_FRACTION * r.net_growth_bytes as f64 {
        return evidence(r);
    }
    format!(
        "{} in {} after {} of start-up, {}",
        signed_bytes(r.net_growth_bytes.saturating_sub(start_up)),
        duration(r.duration_sec),
        signed_bytes(start_up),
        p_value(r.p_value())
    )
}

/// A start-up smaller than this fraction of the growth is within the rate's own error
/// (Theil–Sen over a window of steps) and is not shown apart.
const START_UP_SHOWN_FRACTION: f64 = 0.05;

/// `growth in 9 of 9 windows of 5 s, where a warm-up grows in 1.9 (p < 0.001)`.
fn windows(st: &super::Steadiness) -> String {
    format!(
        "growth in {} of {} windows of {}, where a warm-up that slows down grows in {:.1} ({})",
        st.growing_windows,
        st.windows.saturating_sub(1),
        duration(st.window_sec),
        st.expected_growing_windows,
        p_value(st.p_value)
    )
}

/// Why a growing series is not (yet) a leak, from its checks, in the terms of the rule
/// that judged its region.
fn not_yet(report: &SeriesReport) -> String {
    let r = &report.trend;
    let c = &report.checks;
    let span = |ms: i64| duration(ms as f64 / 1000.0);
    match r.region {
        RegionKind::Episode => {
            if c.irregular_staircase {
                format!(
                    "{} of irregular steps, as warm-up with growing shapes makes; not yet a leak",
                    duration(r.growth_span_sec)
                )
            } else if !c.persistent {
                format!("only {} of growth so far", duration(r.growth_span_sec))
            } else if !c.material {
                "too little growth yet for a leak".to_owned()
            } else {
                format!("not yet significant ({})", p_value(r.p_value()))
            }
        }
        RegionKind::SinceStart => match &r.steadiness {
            None => format!(
                "{} of growth since its start, too short to tell a warm-up from a leak",
                duration(r.duration_sec)
            ),
            // Steps further apart than a window leave windows without growth whether or
            // not the growth slows down: a warm-up is claimed only where the steps are
            // dense enough for the windows to show it (+1 GiB every 60 s was called
            // "slowing down as a warm-up does", issue 35).
            Some(st) if c.steady != Some(true) && r.median_rise_gap_sec > st.window_sec => {
                format!(
                    "steps every {} are sparser than the windows of {}: too few yet to tell a warm-up from a leak ({})",
                    duration(r.median_rise_gap_sec),
                    duration(st.window_sec),
                    windows(st)
                )
            }
            Some(st) if c.steady != Some(true) => {
                format!("slowing down as a warm-up does ({})", windows(st))
            }
            Some(_) if !c.persistent => format!(
                "steady for {}; a leak from the start needs {}",
                duration(r.growth_span_sec),
                span(report.scale.min_steady_ms)
            ),
            Some(st) if !c.material => format!(
                "too little growth yet for a leak ({} at this rate in {} after the first window)",
                signed_bytes(
                    (r.slope_bytes_per_sec * (report.last_unix_ms - st.later_from_unix_ms) as f64
                        / 1000.0) as i64
                ),
                duration((report.last_unix_ms - st.later_from_unix_ms) as f64 / 1000.0)
            ),
            Some(_) => format!("not yet significant ({})", p_value(r.p_value())),
        },
    }
}

/// The explanation line of a report.
pub fn explain(report: &SeriesReport, style: &ExplainStyle<'_>) -> String {
    let line = explain_series(report, style);
    let line = match (report.basis, report.agent_silent_since_unix_ms) {
        // Issue 35: the reason names its source, live tensors or NVML's memory.
        (Basis::Allocated, None) => match report.reserved_verdict {
            Some(Verdict::Leak | Verdict::Growing) => format!(
                "{line} (judged on live tensors from the agent; NVML's per-process memory grew \
                 as the allocator's cache did: cache, not a leak)"
            ),
            _ => format!("{line} (judged on live tensors from the agent)"),
        },
        (Basis::Allocated, Some(t)) => format!(
            "{line} (judged on live tensors from the agent until it stopped answering at {}; \
             NVML's per-process memory has shown nothing else since)",
            (style.time)(t)
        ),
        (Basis::Reserved, Some(t)) => format!(
            "{line} (judged on NVML's per-process memory: the agent stopped answering at {})",
            (style.time)(t)
        ),
        (Basis::Reserved, None) => line,
    };
    // A leak kept from an earlier analysis (its memory has not settled since) shows the
    // numbers of then, and says so.
    let line = match report.judged_unix_ms {
        Some(t) if report.verdict == Verdict::Leak && t < report.last_unix_ms => format!(
            "{line} (as judged at {}; its memory has not settled since)",
            (style.time)(t)
        ),
        _ => line,
    };
    if report.device_total {
        format!("all processes together: {line}")
    } else {
        line
    }
}

fn explain_series(report: &SeriesReport, style: &ExplainStyle<'_>) -> String {
    if report.samples < 2 {
        return format!(
            "holds {} in a single sample; nothing to judge yet",
            bytes(report.current_bytes)
        );
    }
    let r = &report.trend;
    let since = report
        .onset_unix_ms
        .map_or_else(String::new, |t| format!(" since {}", (style.time)(t)));
    let full = report.time_to_full_sec.map_or_else(String::new, |eta| {
        format!(
            "; at this rate {} is full in {}",
            style.device,
            duration(eta)
        )
    });
    match report.verdict {
        Verdict::Leak => match (report.rule, &r.steadiness) {
            // Equal steps at a steady rhythm are the evidence the windows may not show
            // (steps sparser than a window): name them rather than a windows count.
            (Some(LeakRule::SteadyGrowth), Some(st)) if r.regular_steps => {
                format!(
                    "leaks {}{since} ({}), from its start in equal steps every {}{full}",
                    rate(r.slope_bytes_per_sec),
                    evidence_apart_from_start_up(r, st),
                    duration(r.median_rise_gap_sec),
                )
            }
            (Some(LeakRule::SteadyGrowth), Some(st)) => format!(
                "leaks {}{since} ({}), steadily from its start: {}{full}",
                rate(r.slope_bytes_per_sec),
                evidence_apart_from_start_up(r, st),
                windows(st),
            ),
            (Some(LeakRule::FillsDevice), _) => format!(
                "leaks {}{since}, from its start ({}){full}",
                rate(r.slope_bytes_per_sec),
                evidence(r),
            ),
            _ => format!(
                "leaks {}{since} ({}){full}",
                rate(r.slope_bytes_per_sec),
                evidence(r),
            ),
        },
        Verdict::Growing => {
            // One or two steps are a size, not a rate: a start-up allocation of 12 GiB
            // read "growing 21 GB/s". And a jump then a plateau has a median slope of
            // zero: "growing 0.0 B/s" would contradict itself.
            if !super::rate_known(r) {
                let steps = match r.levels.saturating_sub(1) {
                    1 => "one step".to_owned(),
                    n => format!("{n} steps"),
                };
                format!(
                    "grew {}{since} in {steps}: a size, not yet a rate",
                    signed_bytes(r.net_growth_bytes)
                )
            } else if r.slope_bytes_per_sec.abs() < 0.05 {
                format!(
                    "grew {}{since}; {}{full}",
                    signed_bytes(r.net_growth_bytes),
                    not_yet(report)
                )
            } else {
                format!(
                    "growing {}{since} ({}); {}{full}",
                    rate(r.slope_bytes_per_sec),
                    signed_bytes(r.net_growth_bytes),
                    not_yet(report)
                )
            }
        }
        Verdict::Stable => {
            let settled = report.settled_unix_ms.map_or_else(String::new, |t| {
                format!(" after warm-up ended at {}", (style.time)(t))
            });
            format!("stable at {}{settled}", bytes(report.current_bytes))
        }
        Verdict::Sawtooth => {
            let every = report.release_period_ms.map_or_else(String::new, |p| {
                format!(" every {}", duration(p as f64 / 1000.0))
            });
            format!(
                "allocates and frees: {} releases{every}, peak {}, floor steady at {}",
                report.releases,
                bytes(report.peak_bytes),
                bytes(report.floor_bytes),
            )
        }
        Verdict::IdleHolder => {
            let idle = &report.idle;
            let evidence: Vec<&str> = idle.evidence.iter().map(|e| e.describe()).collect();
            format!(
                "holds {} and has been idle for {} (evidence: {})",
                bytes(report.current_bytes),
                duration(idle.idle_sec.unwrap_or(0.0)),
                evidence.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(6 * 1024 * 1024 * 1024 + 200 * 1024 * 1024), "6.2 GiB");
        assert_eq!(bytes(u64::MAX), "16384.0 PiB");
        assert_eq!(rate(38e6), "38 MB/s");
        assert_eq!(rate(2.5e9), "2.5 GB/s");
        assert_eq!(rate(-840.0), "-840 B/s");
        assert_eq!(duration(45.2), "45 s");
        assert_eq!(duration(359.0), "6 min");
        assert_eq!(duration(3.0 * 3600.0 + 125.0), "3 h 2 min");
        assert_eq!(duration(2.0 * 86_400.0 + 5.0 * 3600.0), "2 d 5 h");
        assert_eq!(duration(f64::NAN), "an unknown time");
        assert_eq!(utc_clock(1_700_000_000_000), "22:13:20 UTC");
        assert_eq!(utc_clock(-1000), "23:59:59 UTC");
        assert_eq!(signed_bytes(-1024), "-1.0 KiB");
    }
}
