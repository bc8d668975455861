//! `record` against a driver that goes away under it (`[driver_reload]` in the fake): the
//! session is shut down and opened again, the stretch in between is a gap with its reason,
//! and recording goes on. (Clock steps: `clock.rs`; the rest of `record`: `history.rs`.)

use std::time::{Duration, Instant};

use vramctl_store::{Metric, OpenMode, ProcessRecord, Store, TimeRange};

use crate::harness::{MovedPids, vramctl, vramctl_std};
use crate::real_processes::{Holder, Scenario, sleeper};

/// 2026-11-29T20:31:31Z: simulated recordings start here.
const T0: i64 = 1_795_984_291_000;

/// A recorder used to write the errors of a dead session for as long as it ran.
#[test]
fn record_reopens_nvml_after_the_driver_went_away() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = dir.path().join("reload.toml");
    // The fictional PID moved to a free one: a real process on it mid-record would be
    // recorded as that process.
    let moved = MovedPids::new(&[31031]);
    std::fs::write(
        &scenario,
        moved.scenario(
            "driver_version = \"580.159.04\"\n[clock]\nmode = \"step\"\nstep_s = 1.0\n\
         [driver_reload]\nat_s = 5.0\ninit_failures = 1\n\
         [[gpu]]\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\nmemory_total = \"8 GiB\"\n\
         [[gpu.process]]\npid = 31031\nname = \"python train.py\"\nmemory = \"2 GiB\"\n",
        ),
    )
    .expect("scenario");
    let db = dir.path().join("h.db");
    let out = vramctl(&scenario)
        .env_remove("FAKE_NVML_TIME")
        .arg("--db")
        .arg(&db)
        .args(["record", "--interval", "1s", "--ticks", "20"])
        .args(["--simulated-clock", &T0.to_string()])
        .output()
        .expect("run vramctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut store = Store::open(&db, OpenMode::ReadOnly).expect("open");
    let device = store.devices().expect("devices")[0].id;
    let used: Vec<i64> = store
        .device_metric(device, Metric::UsedBytes, TimeRange::ALL)
        .expect("points")
        .iter()
        .map(|p| (p.unix_ms - T0) / 1000)
        .collect();
    // Read until the driver went away (sample 4 sees t = 5), then again once reopened;
    // the init that found the driver not back yet is a gap over every GPU.
    assert_eq!(used[..4], [0, 1, 2, 3], "{used:?}");
    assert!(used.len() >= 12 && used.last() == Some(&19), "{used:?}");
    let gaps = store.gaps(TimeRange::ALL).expect("gaps");
    assert!(
        gaps.iter()
            .any(|g| g.device_uuid.is_none() && g.reason.starts_with("NVML did not start")),
        "{gaps:?}"
    );
}

/// The processes stored under `pid` in the history at `db` (none before it exists).
fn stored_with_pid(db: &std::path::Path, pid: u32) -> Vec<ProcessRecord> {
    Store::open(db, OpenMode::ReadOnly)
        .and_then(|store| store.processes_with_pid(pid))
        .unwrap_or_default()
}

/// Issue 30: the driver lists a process for a moment after it exited and its /proc entry
/// is gone. The recorder stored a second identity for it (no start time: `leaks` showed
/// `PID 530 (?) … holds 4.7 GiB in a single sample` and counted one process too many).
#[test]
fn a_process_the_driver_lists_after_its_exit_is_recorded_under_one_identity() {
    let mut holder = sleeper();
    let pid = holder.pid();
    // Not `real`: the fake keeps listing it after it exited, as the driver does while it
    // tears the process's context down.
    let scenario = Scenario::new(1, &[Holder::fictional(0, pid, "4.75 GiB")]);
    let db = scenario.dir.path().join("history.db");
    // 100 ticks of 100 ms: the exit below falls well inside them.
    let mut record = vramctl_std(scenario.path())
        .arg("--db")
        .arg(&db)
        .args(["record", "--interval", "100ms", "--ticks", "100"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start vramctl record");
    let deadline = Instant::now() + Duration::from_secs(60);
    while stored_with_pid(&db, pid).is_empty() {
        assert!(Instant::now() < deadline, "the recorder never stored {pid}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let first = stored_with_pid(&db, pid);
    assert!(first[0].meta.key.start_time_ticks.is_some(), "{first:?}");
    // Exits and is reaped: gone from /proc, still listed by the driver for the recorder's
    // remaining ticks.
    holder.child.kill().expect("kill");
    holder.child.wait().expect("reap");
    let recorded = record.wait().expect("wait for vramctl record");
    assert!(recorded.success(), "vramctl record exited {recorded}");
    let stored = stored_with_pid(&db, pid);
    assert_eq!(stored.len(), 1, "one identity for one process: {stored:?}");
    let out = vramctl(scenario.path())
        .arg("--db")
        .arg(&db)
        .args(["leaks", "--json"])
        .output()
        .expect("run vramctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let series: Vec<&serde_json::Value> = json["series"]
        .as_array()
        .expect("series")
        .iter()
        .filter(|s| s["pid"] == pid)
        .collect();
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(
        series[0]["start_time_ticks"],
        first[0].meta.key.start_time_ticks.unwrap_or_default()
    );
}
