//! `record` against a driver that goes away under it (`[driver_reload]` in the fake): the
//! session is shut down and opened again, the stretch in between is a gap with its reason,
//! and recording goes on. (Clock steps: `clock.rs`; the rest of `record`: `history.rs`.)

use vramctl_store::{Metric, OpenMode, Store, TimeRange};

use crate::harness::vramctl;

/// 2026-11-29T20:31:31Z: simulated recordings start here.
const T0: i64 = 1_795_984_291_000;

/// A recorder used to write the errors of a dead session for as long as it ran.
#[test]
fn record_reopens_nvml_after_the_driver_went_away() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = dir.path().join("reload.toml");
    std::fs::write(
        &scenario,
        "driver_version = \"580.159.04\"\n[clock]\nmode = \"step\"\nstep_s = 1.0\n\
         [driver_reload]\nat_s = 5.0\ninit_failures = 1\n\
         [[gpu]]\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\nmemory_total = \"8 GiB\"\n\
         [[gpu.process]]\npid = 31031\nname = \"python train.py\"\nmemory = \"2 GiB\"\n",
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
