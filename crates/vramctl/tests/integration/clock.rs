//! Wall-clock steps (NTP, a VM resumed) end to end: `record` keeps its samples' real spacing
//! and records each step as a `clock-step` gap, starts on a history whose last sample is
//! in the future, and `leaks --watch` neither freezes nor invents verdicts across a step.
//!
//! vramctl's clock is `--simulated-clock` with `--simulated-clock-step` (its wall clock
//! jumps while its monotonic clock goes on); the fake NVML's step clock moves 1 s per
//! sample and its `wall_steps` make the driver's sample timestamps step at the same
//! sample, as a real driver's would.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::harness::{MovedPids, stdout_of, vramctl};

/// 2026-11-29T20:31:31Z: simulated recordings start here.
const T0: i64 = 1_795_984_291_000;
const HOUR_MS: i64 = 3_600_000;

/// One GPU on the fake's step clock (sample k sees t = k + 1): PID 31001 holds 4 GiB until
/// t = 90 and then leaks 64 MiB/s; PID 31002 holds 12 GiB at 0 % SM from the start. The
/// driver's wall clock steps `step_s` at t = `at_s`. The PIDs are moved to free ones (a
/// real process on one mid-record was seen as a second series): read every output through
/// the [`MovedPids`] returned.
fn scenario(dir: &Path, at_s: u32, step_s: i64) -> (PathBuf, MovedPids) {
    let leak: Vec<String> = (0..=400)
        .map(|t: u32| format!("[{t}.0, \"{} MiB\"]", 4096 + 64 * t.saturating_sub(90)))
        .collect();
    let text = format!(
        r#"driver_version = "580.159.04"
[clock]
mode = "step"
step_s = 1.0
wall_steps = [[{at_s}.0, {step_s}.0]]

[[gpu]]
name = "NVIDIA H200"
uuid = "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2"
memory_total = 150754820096
memory_reserved = 644939776
utilization_gpu = 50

[[gpu.process]]
pid = 31001
name = "python leaky.py"
memory = {{ points = [{leak}] }}
sm_util = 40

[[gpu.process]]
pid = 31002
name = "python -m ipykernel_launcher"
memory = "12 GiB"
sm_util = 0
"#,
        leak = leak.join(", ")
    );
    let moved = MovedPids::new(&[31001, 31002]);
    let path = dir.join("step.toml");
    std::fs::write(&path, moved.scenario(&text)).expect("scenario");
    (path, moved)
}

/// `record` of `ticks` samples 1 s apart from `start`, its wall clock stepping `step_ms`
/// after `at_ms` (none when 0).
fn record(scenario: &Path, db: &Path, start: i64, ticks: u64, at_ms: i64, step_ms: i64) {
    let mut cmd = vramctl(scenario);
    cmd.env_remove("FAKE_NVML_TIME")
        .arg("--db")
        .arg(db)
        .args(["record", "--interval", "1s", "--ticks", &ticks.to_string()])
        .args(["--simulated-clock", &start.to_string()]);
    if step_ms != 0 {
        cmd.args(["--simulated-clock-step", &format!("{at_ms}:{step_ms}")]);
    }
    let out = cmd.output().expect("run vramctl");
    assert!(
        out.status.success(),
        "record exited {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn history_json(db: &Path, moved: &MovedPids) -> Value {
    let mut cmd = vramctl(&crate::harness::scenario("h200-idle.toml"));
    cmd.arg("--db")
        .arg(db)
        .args(["history", "--since", "all", "--format", "json"]);
    serde_json::from_str(&moved.back(&stdout_of(&mut cmd))).expect("history JSON")
}

/// The stored times of the device's samples.
fn sample_times(history: &Value) -> Vec<i64> {
    history["devices"][0]["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .map(|s| s["unix_ms"].as_i64().expect("unix_ms"))
        .collect()
}

fn clock_steps(history: &Value) -> Vec<(i64, i64, String)> {
    let ms = |v: &Value| {
        v.as_str()
            .expect("a time")
            .parse::<jiff::Timestamp>()
            .expect("RFC 3339")
            .as_millisecond()
    };
    history["gaps"]
        .as_array()
        .expect("gaps")
        .iter()
        .filter(|g| {
            g["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("clock-step"))
        })
        .map(|g| {
            (
                ms(&g["from"]),
                ms(&g["to"]),
                g["reason"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

fn leaks_json(db: &Path, moved: &MovedPids) -> Value {
    let mut cmd = vramctl(&crate::harness::scenario("h200-idle.toml"));
    cmd.arg("--db").arg(db).args([
        "leaks",
        "--since",
        "all",
        "--json",
        "--idle-for",
        "1m",
        "--tz",
        "UTC",
    ]);
    serde_json::from_str(&moved.back(&stdout_of(&mut cmd))).expect("leaks JSON")
}

fn series(json: &Value, pid: u64) -> &Value {
    json["series"]
        .as_array()
        .expect("series")
        .iter()
        .find(|s| s["pid"] == pid)
        .expect("the PID's series")
}

/// The recorder used to put every sample after a step back 1 ms after the last one (200
/// samples in 0.2 s of history, a leak of 64 GiB/s), and recorded no step at all.
#[test]
fn record_keeps_real_spacing_across_a_wall_clock_step_and_marks_it() {
    for step_ms in [-HOUR_MS, HOUR_MS] {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("h.db");
        // The step comes after 100 s: samples 0..=99 before it, 100..=299 after.
        let (scenario, moved) = scenario(dir.path(), 101, step_ms / 1000);
        record(&scenario, &db, T0, 300, 100_000, step_ms);
        let history = history_json(&db, &moved);
        let times = sample_times(&history);
        assert_eq!(times.len(), 300, "step {step_ms}: every sample is kept");
        let spacing: Vec<i64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        // A step back goes on by the monotonic clock; a step forward follows the wall
        // clock, the hour in between empty.
        let across = if step_ms < 0 { 1000 } else { 1000 + HOUR_MS };
        for (i, gap) in spacing.iter().enumerate() {
            let want = if i == 99 { across } else { 1000 };
            assert_eq!(*gap, want, "step {step_ms}: sample {} after {i}", i + 1);
        }
        let steps = clock_steps(&history);
        assert_eq!(steps.len(), 1, "step {step_ms}: {steps:?}");
        let (from, to, reason) = &steps[0];
        assert_eq!((*from, *to), (times[99], times[100]), "{reason}");
        let direction = if step_ms < 0 {
            "went back 1 h 0 min"
        } else {
            "jumped forward 1 h 0 min"
        };
        assert!(reason.contains(direction), "{reason}");

        // The leak is judged at its real rate; the idle holder stays one.
        let leaks = leaks_json(&db, &moved);
        let leaker = series(&leaks, 31001);
        assert_eq!(leaker["verdict"], "leak", "step {step_ms}: {leaker}");
        let rate = leaker["slope_bytes_per_sec"].as_f64().expect("slope") / f64::from(64 << 20);
        assert!(
            (0.9..1.1).contains(&rate),
            "step {step_ms}: {rate} × 64 MiB/s"
        );
        assert_eq!(
            series(&leaks, 31002)["verdict"],
            "idle-holder",
            "step {step_ms}"
        );
    }
}

/// `record` exited 2 when the history's last sample was later than the wall clock (a
/// crash loop under the shipped systemd unit, restarting every 10 s for as long).
#[test]
fn record_starts_on_a_history_whose_last_sample_is_in_the_future() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("h.db");
    let (scenario, moved) = scenario(dir.path(), 1000, 0);
    record(&scenario, &db, T0, 10, 0, 0);
    // The clock now says an hour earlier than the last sample.
    record(&scenario, &db, T0 - HOUR_MS, 10, 0, 0);
    let history = history_json(&db, &moved);
    let times = sample_times(&history);
    assert_eq!(times.len(), 20, "{times:?}");
    let second: Vec<i64> = times[10..].iter().map(|t| t - T0).collect();
    assert_eq!(
        second,
        (10..20).map(|i| i * 1000).collect::<Vec<_>>(),
        "the second session goes on one interval after the first, at its own spacing"
    );
    let steps = clock_steps(&history);
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!((steps[0].0, steps[0].1), (T0 + 9000, T0 + 10_000));
    assert!(
        steps[0]
            .2
            .contains("last sample is 1 h 0 min ahead of the wall clock"),
        "{}",
        steps[0].2
    );
}

/// `leaks --watch` events of `pid` as `(event time − T0 in s, verdict)`.
fn watch_events(lines: &str, pid: u64) -> Vec<(i64, String)> {
    lines
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("NDJSON"))
        .filter(|e| e["event"] == "verdict" && e["pid"] == pid)
        .map(|e| {
            let at: jiff::Timestamp = e["at"].as_str().expect("at").parse().expect("RFC 3339");
            (
                (at.as_millisecond() - T0) / 1000,
                e["verdict"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// A step back froze every live verdict for its length (each snapshot looked older than
/// the last); a step forward made a process idle for an hour it was not watched.
#[test]
fn leaks_watch_neither_freezes_nor_invents_verdicts_across_a_wall_clock_step() {
    for step_ms in [-HOUR_MS, HOUR_MS] {
        let dir = tempfile::tempdir().expect("tempdir");
        // The step comes after 60 s (sample 60, fake t = 61).
        let (scenario, moved) = scenario(dir.path(), 61, step_ms / 1000);
        let mut cmd = vramctl(&scenario);
        cmd.env_remove("FAKE_NVML_TIME").args([
            "leaks",
            "--watch",
            "--interval",
            "1s",
            "--count",
            "240",
            "--json",
            "--idle-for",
            "2m",
            "--simulated-clock",
            &T0.to_string(),
            "--simulated-clock-step",
            &format!("60000:{step_ms}"),
        ]);
        let out = moved.back(&stdout_of(&mut cmd));
        let idle = watch_events(&out, 31002);
        let became_idle: Vec<i64> = idle
            .iter()
            .filter(|(_, v)| v == "idle-holder")
            .map(|(t, _)| *t)
            .collect();
        // Idle from its first sample: an idle holder after the 2 minutes it was watched,
        // not at the step (an hour too many) and not never (frozen).
        assert_eq!(became_idle.len(), 1, "step {step_ms}: {idle:?}");
        assert!(
            (120..=127).contains(&became_idle[0]),
            "step {step_ms}: idle holder at {} s",
            became_idle[0]
        );
        let leak = watch_events(&out, 31001);
        let leaked: Vec<i64> = leak
            .iter()
            .filter(|(_, v)| v == "leak")
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(leaked.len(), 1, "step {step_ms}: {leak:?}");
        assert!(
            (91..=150).contains(&leaked[0]),
            "step {step_ms}: leak seen at {} s",
            leaked[0]
        );
        // Every event is on the watch's own time line: none an hour off.
        for (t, _) in idle.iter().chain(&leak) {
            assert!((0..240).contains(t), "step {step_ms}: an event at {t} s");
        }
    }
}
