//! The PromQL this crate sends: every query text in one place, and the quoting of label
//! values that came from elsewhere (a Prometheus answer, a browser's request).
//!
//! A label value is hostile: whoever controls a scrape target's relabelling, or the page's
//! URL, chooses it. It only ever enters a query as a double-quoted string literal made by
//! [`quote`], so it can neither end the literal nor add matchers.

use std::fmt::Write as _;

/// The one series whose presence says "a vramctl exporter was scraped here": a constant 1,
/// exported before NVML answers too.
pub const HOSTS_SEEN: &str = "max by (job, instance) (last_over_time(vramctl_build_info[1h]))";
/// Whether each target answered its last scrape (Prometheus' own series).
pub const TARGETS_UP: &str = "up";
/// Seconds since each exporter's sampler published, at its last scrape.
pub const SAMPLE_AGE: &str = "vramctl_last_sample_age_seconds";
/// Per GPU: memory in use.
pub const GPU_USED: &str = "vramctl_device_memory_used_bytes";
/// Per GPU: installed memory.
pub const GPU_TOTAL: &str = "vramctl_device_memory_total_bytes";
/// Per GPU: its product name (an info series, value 1).
pub const GPU_INFO: &str = "vramctl_device_info";
/// Per GPU: 1 when it answered, 0 when lost.
pub const GPU_UP: &str = "vramctl_device_up";

/// The `limit` biggest per-process holders across every host.
pub fn biggest_holders(limit: usize) -> String {
    format!("topk({limit}, vramctl_process_memory_used_bytes)")
}

/// Processes judged leaking (value: the measured growth, bytes per second), at most `limit`.
pub fn leaking(limit: usize) -> String {
    format!(
        "topk({limit}, vramctl_process_leak_slope_bytes_per_second \
         and on (job, instance, uuid, pid) (vramctl_process_leak == 1))"
    )
}

/// Processes judged idle holders (value: seconds idle), at most `limit`.
pub fn idle_holders(limit: usize) -> String {
    format!(
        "topk({limit}, vramctl_process_idle_seconds \
         and on (job, instance, uuid, pid) (vramctl_process_idle_holder == 1))"
    )
}

/// The memory of every process with a verdict, to show beside it.
pub const VERDICT_MEMORY: &str = "vramctl_process_memory_used_bytes \
     and on (job, instance, uuid, pid) (vramctl_process_leak == 1 or vramctl_process_idle_holder == 1)";

/// `{job="…",instance="…"}`: the matchers selecting one host's series.
pub fn host_selector(job: &str, instance: &str) -> String {
    format!("{{job={},instance={}}}", quote(job), quote(instance))
}

/// One host's series of `metric`.
pub fn of_host(metric: &str, job: &str, instance: &str) -> String {
    format!("{metric}{}", host_selector(job, instance))
}

/// `value` as a PromQL double-quoted string literal. PromQL strings take Go's escapes; a
/// backslash and a double quote are escaped, and so is every control character (as
/// `\u00XX` or `\UXXXXXXXX`), so the literal is one line and ends where it should.
pub fn quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c if c.is_control() => {
                let code = u32::from(c);
                if code <= 0xFFFF {
                    let _ = write!(out, "\\u{code:04x}");
                } else {
                    let _ = write!(out, "\\U{code:08x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_cannot_be_broken_out_of() {
        assert_eq!(quote("127.0.0.1:9835"), r#""127.0.0.1:9835""#);
        assert_eq!(
            quote(r#"a",job=~".*"#),
            r#""a\",job=~\".*""#,
            "a quote in the value stays inside the literal"
        );
        assert_eq!(quote("back\\slash\""), r#""back\\slash\"""#);
        assert_eq!(quote("line\nbreak\u{1b}"), r#""line\u000abreak\u001b""#);
        assert_eq!(quote("naïve ✓"), "\"naïve ✓\"");
    }

    #[test]
    fn a_host_is_selected_by_job_and_instance() {
        assert_eq!(
            of_host(GPU_USED, "vramctl", "gpu-1:9835"),
            r#"vramctl_device_memory_used_bytes{job="vramctl",instance="gpu-1:9835"}"#
        );
    }
}
