//! `record`, `history`, `export`, `import` end to end: round trips, faults as gaps, crash
//! safety, disk full, read-only and locked databases, malformed input.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use serde_json::Value;
use vramctl_store::{OpenMode, Store, TimeRange};

use crate::harness::{MovedPids, redactions, scenario, stdout_of, vramctl, vramctl_std};

/// 2026-11-29T20:31:31Z: simulated recordings start here.
const T0: i64 = 1_795_984_291_000;
const MIB: u64 = 1 << 20;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/import")
        .join(name)
}

/// A one-GPU scenario on the fake's step clock (t = 0, 1, 2 … per sample). Its PIDs are
/// moved to free ones (a real process on one mid-record was seen as a second series):
/// read every output that names them through the [`MovedPids`] returned.
fn write_scenario(dir: &Path, extra_gpu: &str) -> (PathBuf, MovedPids) {
    let text = format!(
        r#"driver_version = "580.159.04"
[clock]
mode = "step"
step_s = 1.0

[[gpu]]
name = "NVIDIA H200"
uuid = "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2"
pci_bus_id = "00000000:00:06.0"
memory_total = 150754820096
memory_reserved = 644939776
utilization_gpu = {{ steps = {{ values = [10, 20, 30, 40, 50, 60], every_s = 1.0 }} }}
temperature_c = 51
power_mw = 250000

[[gpu.process]]
pid = 32701
name = "python leak.py"
memory = {{ steps = {{ values = ["1 GiB", "2 GiB", "3 GiB", "4 GiB", "5 GiB", "6 GiB"], every_s = 1.0 }} }}

[[gpu.process]]
pid = 32702
name = "python hold.py"
memory = "6 GiB"
end_s = 3.0
{extra_gpu}"#
    );
    let moved = MovedPids::new(&[32701, 32702]);
    let path = dir.join("scenario.toml");
    std::fs::write(&path, moved.scenario(&text)).expect("write the scenario");
    (path, moved)
}

/// `record` for `ticks` samples on simulated time; the fake's own step clock moves too
/// (the harness's fixed `FAKE_NVML_TIME` is removed).
fn record(scenario: &Path, db: &Path, ticks: u64) -> std::process::Output {
    vramctl(scenario)
        .env_remove("FAKE_NVML_TIME")
        .args(["--db"])
        .arg(db)
        .args(["record", "--interval", "1s", "--ticks", &ticks.to_string()])
        .args(["--simulated-clock", &T0.to_string()])
        .output()
        .expect("run vramctl")
}

/// Neither the database nor any of its companion files exists.
fn assert_left_nothing(db: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal", ".lock"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        assert!(
            !Path::new(&name).exists(),
            "'{}' was left behind",
            Path::new(&name).display()
        );
    }
}

fn ok(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "vramctl failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("utf-8 stdout")
}

fn on_db(db: &Path) -> assert_cmd::Command {
    let mut cmd = vramctl(&scenario("h200-idle.toml"));
    cmd.arg("--db").arg(db);
    cmd
}

#[test]
fn record_then_export_gives_the_scenario_values() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let (sc, moved) = write_scenario(dir.path(), "");
    ok(&record(&sc, &db, 5));
    let leak = moved.to(32701).to_string();

    let apps = moved.back(&stdout_of(on_db(&db).args([
        "export",
        "--format",
        "smi-apps",
        "--tz",
        "UTC",
        "--query",
        "timestamp,pid,used_gpu_memory",
    ])));
    // The fake's step clock counts the enumeration's device-count call too, so sample k
    // sees t = k + 1: the leak at 2..6 GiB, the holder until t = 3.
    let expected = "\
timestamp, pid, used_gpu_memory [MiB]
2026/11/29 20:31:31.000, 32701, 2048 MiB
2026/11/29 20:31:31.000, 32702, 6144 MiB
2026/11/29 20:31:32.000, 32701, 3072 MiB
2026/11/29 20:31:32.000, 32702, 6144 MiB
2026/11/29 20:31:33.000, 32701, 4096 MiB
2026/11/29 20:31:34.000, 32701, 5120 MiB
2026/11/29 20:31:35.000, 32701, 6144 MiB
";
    assert_eq!(apps, expected);

    let gpu = stdout_of(on_db(&db).args([
        "export",
        "--format",
        "smi-gpu",
        "--tz",
        "UTC",
        "--csv-format",
        "csv,nounits",
        "--query",
        "timestamp,memory.used,memory.reserved,utilization.gpu,power.draw",
    ]));
    let used: Vec<&str> = gpu
        .lines()
        .skip(1)
        .map(|l| l.split(", ").nth(1).unwrap())
        .collect();
    assert_eq!(used, ["8192", "9216", "4096", "5120", "6144"]);
    assert!(
        gpu.lines().nth(1).unwrap().ends_with(", 615, 20, 250.00"),
        "{gpu}"
    );

    let table =
        moved.back(&stdout_of(on_db(&db).args([
            "history", "--since", "all", "--tz", "UTC", "--step", "raw",
        ])));
    redactions().bind(|| insta::assert_snapshot!("history_record_round_trip", table));

    let json: Value = serde_json::from_str(&stdout_of(on_db(&db).args([
        "history", "--since", "all", "--format", "json", "--pid", &leak,
    ])))
    .unwrap();
    assert_eq!(json["schema"], 1);
    assert_eq!(
        json["devices"],
        serde_json::json!([]),
        "--pid hides device rows"
    );
    let samples = json["processes"][0]["samples"].as_array().unwrap();
    let bytes: Vec<u64> = samples
        .iter()
        .map(|s| s["used_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(bytes, [2048, 3072, 4096, 5120, 6144].map(|m| m * MIB));

    // 2 s buckets keep last, min and max of each bucket.
    let csv = stdout_of(on_db(&db).args([
        "history", "--since", "all", "--format", "csv", "--pid", &leak, "--step", "2s",
    ]));
    let buckets: Vec<(String, String, String, String)> = csv
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                f[0].to_owned(),
                f[8].to_owned(),
                f[9].to_owned(),
                f[10].to_owned(),
            )
        })
        .collect();
    let mib = |m: u64| (m * MIB).to_string();
    assert_eq!(
        buckets,
        [
            (
                "2026-11-29T20:31:30.000Z".to_owned(),
                mib(2048),
                mib(2048),
                mib(2048)
            ),
            (
                "2026-11-29T20:31:32.000Z".to_owned(),
                mib(4096),
                mib(3072),
                mib(4096)
            ),
            (
                "2026-11-29T20:31:34.000Z".to_owned(),
                mib(6144),
                mib(5120),
                mib(6144)
            ),
        ]
    );
}

#[test]
fn a_lost_gpu_is_a_gap_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let lost = r#"
[[gpu]]
name = "NVIDIA H200"
uuid = "GPU-93a0e6c2-4f1b-6d8e-b0c7-1e2f3a4b5c6d"
memory_total = 150754820096
lost_at_s = 2.0
"#;
    ok(&record(&write_scenario(dir.path(), lost).0, &db, 5));
    let json: Value = serde_json::from_str(&stdout_of(on_db(&db).args([
        "history", "--since", "all", "--format", "json", "--gpu", "1",
    ])))
    .unwrap();
    let samples = json["devices"][0]["samples"].as_array().unwrap();
    // Sample 0 sees t = 1 (see the round-trip test); from t = 2 the GPU is lost.
    assert_eq!(samples.len(), 1, "before the loss only: {samples:?}");
    assert_eq!(
        samples[0]["used_bytes"], 0,
        "an idle GPU reads 0, a lost one nothing"
    );
    let gaps = json["gaps"].as_array().unwrap();
    let gap = gaps
        .iter()
        .find(|g| g["metric"].is_null())
        .expect("a device gap");
    assert!(
        gap["reason"].as_str().unwrap().starts_with("GPU lost"),
        "{gap}"
    );
    assert_eq!(gap["from"], "2026-11-29T20:31:32.000Z");
    assert_eq!(gap["to"], "2026-11-29T20:31:35.000Z");
    // Power is "not supported" on that GPU: a gap, not zeros.
    assert!(
        gaps.iter()
            .any(|g| g["metric"] == "power_mw" && g["reason"] == "not supported"),
        "{gaps:?}"
    );
}

#[test]
fn nvml_init_failure_is_retried_with_backoff_and_recorded_as_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let output = record(&scenario("fault-init-recovers.toml"), &db, 10);
    ok(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.matches("NVML did not start; retrying").count(),
        3,
        "{stderr}"
    );
    let json: Value = serde_json::from_str(&stdout_of(
        on_db(&db).args(["history", "--since", "all", "--format", "json"]),
    ))
    .unwrap();
    let gap = &json["gaps"][0];
    let reason = gap["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("NVML did not start") && reason.contains("not loaded"),
        "{gap}"
    );
    assert!(gap["gpu_uuid"].is_null());
    // Attempts at t = 0, 1 (after 1 s), 3 (after 2 s) fail; t = 7 (after 4 s) succeeds.
    assert_eq!(gap["from"], "2026-11-29T20:31:31.000Z");
    assert_eq!(gap["to"], "2026-11-29T20:31:38.000Z");
    let samples = json["devices"][0]["samples"].as_array().unwrap();
    assert_eq!(samples[0]["t"], "2026-11-29T20:31:38.000Z");
    assert_eq!(samples.len(), 3);
}

/// Reads stderr lines of a recorder started with debug logs until `n` commits, returning
/// the time of the last one.
fn wait_for_commits(child: &mut Child, n: usize) -> Option<i64> {
    let stderr = child.stderr.as_mut()?;
    let mut last = None;
    let mut seen = 0;
    for line in BufReader::new(stderr).lines() {
        let line = line.ok()?;
        if line.contains("Committed a tick.") {
            let t = line.rsplit("t_ms=").next()?.trim().parse::<i64>().ok()?;
            last = Some(t);
            seen += 1;
            if seen >= n {
                break;
            }
        }
    }
    last
}

fn spawn_recorder(scenario: &Path, db: &Path, start: i64, interval: &str) -> Child {
    vramctl_std(scenario)
        .env_remove("FAKE_NVML_TIME")
        .env("VRAMCTL_LOG", "vramctl=debug")
        .arg("--db")
        .arg(db)
        .args(["--color", "never", "record", "--interval", interval])
        .args(["--simulated-clock", &start.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the recorder")
}

#[test]
fn sigkill_50_times_loses_nothing_committed_and_never_corrupts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let heavy = scenario("eight-gpus-30-procs.toml");
    let mut committed: Vec<i64> = Vec::new();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for round in 0..50 {
        // Kill after 1..=12 commits, at a varying point inside the next write.
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let n = 1 + (seed >> 33) as usize % 12;
        // Rounds 100 s apart: all within the 24 h of raw retention.
        let start = T0 + round * 100_000;
        let mut child = spawn_recorder(&heavy, &db, start, "1s");
        let last = wait_for_commits(&mut child, n).expect("the recorder committed ticks");
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        committed.extend((0..n as i64).map(|i| last - (n as i64 - 1 - i) * 1000));
    }
    let mut store = Store::open(&db, OpenMode::Append).expect("reopens (quick_check passes)");
    assert_eq!(store.integrity_check().unwrap(), vec!["ok".to_owned()]);
    for t in &committed {
        let range = TimeRange {
            from_ms: *t,
            to_ms: *t,
        };
        assert_eq!(
            store.tick_count(range).unwrap(),
            1,
            "committed tick {t} is there"
        );
    }
    // Every stored tick has all 8 GPUs (no partial tick), and memory decodes.
    let mut frames = 0;
    store
        .scan(TimeRange::ALL, |frame| {
            let gpus: std::collections::HashSet<i64> =
                frame.iter().filter_map(|(s, _)| s.device_id).collect();
            assert_eq!(gpus.len(), 8, "tick at {}", frame.t_ms);
            frames += 1;
        })
        .unwrap();
    assert!(frames >= committed.len());
}

#[test]
fn a_second_recorder_on_the_same_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let (sc, _moved) = write_scenario(dir.path(), "");
    let mut first = spawn_recorder(&sc, &db, T0, "1s");
    wait_for_commits(&mut first, 1).expect("first recorder runs");
    let second = record(&sc, &db, 1);
    first.kill().unwrap();
    first.wait().unwrap();
    assert_eq!(second.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("another vramctl is already recording into"),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("PID {}", first.id())), "{stderr}");
}

#[test]
fn sigterm_flushes_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let mut child = spawn_recorder(&write_scenario(dir.path(), "").0, &db, T0, "1s");
    let last = wait_for_commits(&mut child, 3).unwrap();
    nix_kill(child.id(), "TERM");
    // Drain stderr so the recorder never blocks on a full pipe.
    let mut rest = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{rest}");
    assert!(rest.contains("Stopping on a signal."), "{rest}");
    let store = Store::open(&db, OpenMode::ReadOnly).unwrap();
    assert!(store.last_sample_ms().unwrap().unwrap() >= last);
    assert!(
        !dir.path().join("h.db-wal").exists()
            || std::fs::metadata(dir.path().join("h.db-wal"))
                .unwrap()
                .len()
                == 0,
        "checkpointed"
    );
}

fn nix_kill(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

#[test]
fn disk_full_keeps_recording_and_loses_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let output = vramctl(&scenario("eight-gpus-30-procs.toml"))
        .env_remove("FAKE_NVML_TIME")
        .arg("--db")
        .arg(&db)
        .args([
            "record",
            "--interval",
            "1s",
            "--ticks",
            "40",
            "--max-db-pages",
            "30",
        ])
        .args(["--simulated-clock", &T0.to_string()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(0),
        "keeps running, then stops normally: {stderr}"
    );
    assert!(
        stderr.contains("Cannot write samples; will keep retrying"),
        "{stderr}"
    );
    assert!(stderr.contains("is full"), "{stderr}");
    let store = Store::open(&db, OpenMode::Append).unwrap();
    assert_eq!(store.integrity_check().unwrap(), vec!["ok".to_owned()]);
    let kept = store.tick_count(TimeRange::ALL).unwrap();
    assert!(kept > 0 && kept < 40, "{kept}");
    // The ticks kept are the first ones, without holes.
    assert_eq!(
        store.last_sample_ms().unwrap(),
        Some(T0 + (kept as i64 - 1) * 1000)
    );
}

/// Makes `path` unwritable even for root (`chattr +i`); `false` where the filesystem or
/// the container does not allow it.
fn make_immutable(path: &Path) -> bool {
    let done = std::process::Command::new("chattr")
        .arg("+i")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    done && std::fs::OpenOptions::new().append(true).open(path).is_err()
}

#[test]
fn a_read_only_database_is_a_clear_error_and_stays_intact() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let (sc, _moved) = write_scenario(dir.path(), "");
    ok(&record(&sc, &db, 3));
    let before = std::fs::read(&db).unwrap();
    let mut cmd = vramctl(&sc);
    let immutable = make_immutable(&db);
    if !immutable {
        // No CAP_LINUX_IMMUTABLE here: permission bits stop everyone but root, so run the
        // recorder as nobody (setpriv) against a file only root may write.
        std::fs::set_permissions(&db, std::os::unix::fs::PermissionsExt::from_mode(0o444)).unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let probe = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
            ])
            .arg(format!("echo x >> '{}'", db.display()))
            .status()
            .expect("setpriv (util-linux) to run as nobody");
        assert!(!probe.success(), "the database did not become read-only");
        cmd = assert_cmd::Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(assert_cmd::cargo::cargo_bin("vramctl"))
            .env("VRAMCTL_NVML_LIB", crate::harness::fake_library())
            .env("FAKE_NVML_SCENARIO", &sc);
    }
    let output = cmd
        .arg("--db")
        .arg(&db)
        .args([
            "record",
            "--ticks",
            "2",
            "--simulated-clock",
            &(T0 + 60_000).to_string(),
        ])
        .output()
        .unwrap();
    if immutable {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&db)
            .status();
    }
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot write the history database"),
        "{stderr}"
    );
    assert!(stderr.contains("permissions"), "hint: {stderr}");
    assert_eq!(
        std::fs::read(&db).unwrap(),
        before,
        "nothing written, nothing lost"
    );
}

#[test]
fn nvidia_smi_logs_import_and_export_back_identically() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let gpu_log = fixture("smi-gpu-h200.csv");
    let apps_log = fixture("smi-apps-h200.csv");
    let output = on_db(&db)
        .args(["import", "--tz", "UTC"])
        .arg(&gpu_log)
        .arg(&apps_log)
        .output()
        .unwrap();
    ok(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("(smi-gpu)") && stderr.contains("(smi-apps)"),
        "{stderr}"
    );
    let gpu_text = std::fs::read_to_string(&gpu_log).unwrap();
    let header = gpu_text.lines().next().unwrap();
    let exported = stdout_of(on_db(&db).args([
        "export", "--format", "smi-gpu", "--tz", "UTC", "--query", header,
    ]));
    assert_eq!(exported, gpu_text);
    let apps_text = std::fs::read_to_string(&apps_log).unwrap();
    let header = apps_text.lines().next().unwrap();
    let exported = stdout_of(on_db(&db).args([
        "export", "--format", "smi-apps", "--tz", "UTC", "--query", header,
    ]));
    assert_eq!(exported, apps_text);
    // The [N/A] power sample is a gap with its reason, not a zero.
    let json: Value = serde_json::from_str(&stdout_of(
        on_db(&db).args(["history", "--since", "all", "--format", "json"]),
    ))
    .unwrap();
    assert!(
        json["gaps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["metric"] == "power_mw" && g["reason"] == "N/A")
    );
    // The leak's last value, 92074 MiB.
    let leak = json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == 457)
        .unwrap();
    assert_eq!(
        leak["samples"].as_array().unwrap().last().unwrap()["used_bytes"],
        92_074 * MIB
    );
}

#[test]
fn ndjson_export_is_lossless() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.db"), dir.path().join("b.db"));
    ok(&record(&write_scenario(dir.path(), "").0, &a, 5));
    ok(&on_db(&a)
        .args(["import", "--tz", "UTC"])
        .arg(fixture("smi-apps-h200.csv"))
        .output()
        .unwrap());
    let first = dir.path().join("a.ndjson");
    ok(&on_db(&a)
        .args(["export", "-o"])
        .arg(&first)
        .output()
        .unwrap());
    ok(&on_db(&b).arg("import").arg(&first).output().unwrap());
    let again = stdout_of(on_db(&b).arg("export"));
    let strip = |s: &str| s.lines().skip(1).map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(
        strip(&again),
        strip(&std::fs::read_to_string(&first).unwrap())
    );
    let csv =
        |db: &Path| stdout_of(on_db(db).args(["history", "--since", "all", "--format", "csv"]));
    assert_eq!(csv(&a), csv(&b));
}

#[test]
fn status_watch_output_imports() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let (sc, moved) = write_scenario(dir.path(), "");
    let watch = stdout_of(
        vramctl(&sc)
            .env_remove("FAKE_NVML_TIME")
            .args(["status", "--json", "--watch", "0.05", "--count", "3"]),
    );
    let file = dir.path().join("watch.ndjson");
    std::fs::write(&file, watch).unwrap();
    let output = on_db(&db).arg("import").arg(&file).output().unwrap();
    ok(&output);
    assert!(String::from_utf8_lossy(&output.stderr).contains("(status-json)"));
    let csv = stdout_of(on_db(&db).args([
        "history",
        "--since",
        "all",
        "--format",
        "csv",
        "--pid",
        &moved.to(32701).to_string(),
    ]));
    let bytes: Vec<&str> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(8).unwrap())
        .collect();
    assert_eq!(bytes.len(), 3, "{csv}");
}

#[test]
fn gpuz_sensor_log_imports_in_mib() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let output = on_db(&db)
        .args(["import", "--tz", "UTC"])
        .arg(fixture("gpuz-sensor-log.txt"))
        .output()
        .unwrap();
    ok(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("(gpuz)"), "{stderr}");
    assert!(stderr.contains("ignored: GPU Clock [MHz]"), "{stderr}");
    let csv = stdout_of(on_db(&db).args(["history", "--since", "all", "--format", "csv"]));
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(row[0], "2026-11-29T20:40:00.000Z");
    assert_eq!(row[11], (812 * MIB).to_string(), "{csv}");
    let peak: Vec<u64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(11).unwrap().parse().unwrap())
        .collect();
    assert_eq!(peak.iter().max(), Some(&(9004 * MIB)));
}

#[test]
fn bad_rows_are_reported_by_file_and_line_and_skipped_or_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let good = std::fs::read_to_string(fixture("smi-gpu-h200.csv")).unwrap();
    let mut lines: Vec<String> = good.lines().map(str::to_owned).collect();
    lines[3] = lines[3].replace("0 MiB, 143155", "lots MiB, 143155");
    lines[5] = "2026/11/29 20:31:32.715, 0, NVIDIA H200".into();
    // A truncated file: the last line cut mid-field.
    let last = lines.len() - 1;
    lines[last].truncate(40);
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, lines.join("\n")).unwrap();

    let output = on_db(&db)
        .args(["import", "--tz", "UTC"])
        .arg(&bad)
        .output()
        .unwrap();
    ok(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let file = bad.display().to_string();
    assert!(
        stderr.contains(&format!("{file}:4: memory_used_bytes"))
            || stderr.contains(&format!("{file}:4: used_bytes: 'lots MiB' is not a number")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{file}:6: 3 fields where the header has 13")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{file}:{}:", last + 1)),
        "{stderr}"
    );
    assert!(stderr.contains("3 bad rows skipped"), "{stderr}");

    let strict = vramctl(&scenario("h200-idle.toml"))
        .arg("--db")
        .arg(dir.path().join("strict.db"))
        .args(["import", "--strict", "--tz", "UTC"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(strict.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert!(
        stderr.starts_with(&format!("vramctl: error: {file}:4: ")),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // Strict wrote nothing: not even an empty database or its lock file.
    assert_left_nothing(&dir.path().join("strict.db"));
}

#[test]
fn wrong_format_flag_and_unknown_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let output = on_db(&db)
        .args(["import", "--input-format", "gpuz"])
        .arg(fixture("smi-gpu-h200.csv"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("smi-gpu-h200.csv:1: the first column is not 'Date'"),
        "{stderr}"
    );

    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "dear diary\n").unwrap();
    let output = on_db(&db).arg("import").arg(&notes).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot tell the format of"), "{stderr}");
    assert!(
        stderr.contains("name the format with --input-format"),
        "{stderr}"
    );

    let noheader = dir.path().join("noheader.csv");
    let text = std::fs::read_to_string(fixture("smi-gpu-h200.csv")).unwrap();
    std::fs::write(
        &noheader,
        text.lines().skip(1).collect::<Vec<_>>().join("\n"),
    )
    .unwrap();
    let output = on_db(&db).arg("import").arg(&noheader).output().unwrap();
    assert!(String::from_utf8_lossy(&output.stderr).contains("--columns"));
    let columns = text.lines().next().unwrap();
    ok(&on_db(&db)
        .args(["import", "--tz", "UTC", "--columns", columns])
        .arg(&noheader)
        .output()
        .unwrap());
}

#[test]
fn history_of_a_missing_database_says_how_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let output = on_db(&dir.path().join("none.db"))
        .arg("history")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no history database at"), "{stderr}");
    assert!(stderr.contains("vramctl record"), "{stderr}");
}

#[test]
fn default_database_follows_xdg_state_home() {
    let dir = tempfile::tempdir().unwrap();
    let (sc, _moved) = write_scenario(dir.path(), "");
    let output = vramctl(&sc)
        .env("XDG_STATE_HOME", dir.path())
        .args([
            "record",
            "--ticks",
            "1",
            "--simulated-clock",
            &T0.to_string(),
        ])
        .output()
        .unwrap();
    ok(&output);
    assert!(dir.path().join("vramctl/history.db").exists());
}

#[test]
fn a_real_process_is_recorded_with_its_identity_and_cpu_time() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let sc = dir.path().join("real.toml");
    std::fs::write(
        &sc,
        format!(
            "[clock]\nmode = \"step\"\n[[gpu]]\nuuid = \"GPU-real\"\nmemory_total = \"80 GiB\"\n\
             [[gpu.process]]\npid = {}\nreal = true\nmemory = \"5 GiB\"\n",
            child.id()
        ),
    )
    .unwrap();
    let output = record(&sc, &db, 3);
    child.kill().unwrap();
    child.wait().unwrap();
    ok(&output);
    let mut store = Store::open(&db, OpenMode::ReadOnly).unwrap();
    let procs = store.processes_in(TimeRange::ALL).unwrap();
    assert_eq!(procs.len(), 1);
    let (p, devices) = &procs[0];
    assert_eq!(p.meta.key.pid, child.id());
    assert!(p.meta.key.boot_id.is_some(), "{p:?}");
    assert!(p.meta.key.start_time_ticks.is_some(), "{p:?}");
    assert_eq!(p.meta.command.as_deref(), Some("sleep 30"));
    assert!(p.meta.user.is_some());
    let mem = store
        .process_memory(p.id, devices[0], TimeRange::ALL)
        .unwrap();
    assert_eq!(mem.iter().map(|m| m.last).collect::<Vec<_>>(), [5 << 30; 3]);
    let cpu = store.process_cpu(p.id, TimeRange::ALL).unwrap();
    assert_eq!(
        cpu.len(),
        3,
        "CPU time read at first sight, carried between reads"
    );
}

#[test]
fn the_recorder_downsamples_and_prunes_by_retention() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    // 5 simulated minutes at 1 s, raw kept 2 minutes, 1-minute buckets forever.
    let output = vramctl(&write_scenario(dir.path(), "").0)
        .env_remove("FAKE_NVML_TIME")
        .arg("--db")
        .arg(&db)
        .args([
            "record",
            "--interval",
            "1s",
            "--ticks",
            "300",
            "--retain",
            "raw=2m,1m=forever",
        ])
        .args(["--simulated-clock", &(T0 - T0 % 60_000).to_string()])
        .output()
        .unwrap();
    ok(&output);
    let mut store = Store::open(&db, OpenMode::ReadOnly).unwrap();
    assert!(
        store.tick_count(TimeRange::ALL).unwrap() < 300,
        "raw samples were pruned"
    );
    let d = store.devices().unwrap()[0].id;
    let points = store
        .device_metric(d, vramctl_store::Metric::UsedBytes, TimeRange::ALL)
        .unwrap();
    let first = points.first().unwrap();
    assert_eq!(
        first.unix_ms,
        T0 - T0 % 60_000,
        "history still starts at the beginning"
    );
    assert_eq!(first.span_ms, 60_000, "as a 1-minute bucket");
    assert!(
        points.iter().any(|p| p.span_ms == 0),
        "recent samples are raw"
    );
    assert!(points.windows(2).all(|w| w[0].unix_ms < w[1].unix_ms));
}

#[test]
fn a_truncated_export_is_rejected_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.db"), dir.path().join("b.db"));
    ok(&record(&write_scenario(dir.path(), "").0, &a, 5));
    let full = stdout_of(on_db(&a).arg("export"));
    // Cut in the middle of the last frame line.
    let cut = &full[..full.rfind("{\"type\":\"frame\"").unwrap() + 30];
    let file = dir.path().join("cut.ndjson");
    std::fs::write(&file, cut).unwrap();
    let output = on_db(&b).arg("import").arg(&file).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = cut.lines().count();
    assert!(
        stderr.contains(&format!("cut.ndjson:{line}: not JSON")),
        "{stderr}"
    );
    assert_left_nothing(&b);
}

/// Runs `args` of vramctl (from `portable`) as a user who cannot write `db`: as root, as
/// uid 65534 (root ignores file modes, so only another uid proves anything); otherwise as
/// ourselves, after the caller's chmod.
fn as_reader(
    portable: &crate::harness::Portable,
    db: &Path,
    args: &[&str],
) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = portable.command();
    cmd.arg("--db").arg(db).args(args);
    if crate::real_processes::is_root() {
        cmd.uid(65534).gid(65534);
    }
    cmd.output().expect("run vramctl")
}

/// Every reader, on `db`: they succeed, and nothing they print speaks of writing.
fn readers_succeed(portable: &crate::harness::Portable, db: &Path, case: &str) {
    let plot = std::env::temp_dir().join(format!(
        "vramctl-ro-{}-{}.svg",
        std::process::id(),
        case.replace(' ', "-")
    ));
    let plot_arg = plot.display().to_string();
    let readers: [&[&str]; 5] = [
        &["history", "--since", "all"],
        &["export"],
        &["export", "--format", "smi-apps"],
        &["leaks", "--since", "all"],
        &["plot", "--since", "all", "-o", &plot_arg],
    ];
    for args in readers {
        let out = as_reader(portable, db, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{case}: vramctl {args:?} failed ({}): {stderr}",
            out.status
        );
        assert!(!stderr.contains("write"), "{case}: {args:?}: {stderr}");
        assert!(!out.stdout.is_empty(), "{case}: {args:?} printed nothing");
    }
    let _ = std::fs::remove_file(&plot);
    // `top --replay` opens the recording before it asks for a terminal: without one, its
    // error is about the terminal, not about the database.
    let out = as_reader(
        portable,
        db,
        &["top", "--replay", &db.display().to_string()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("needs a terminal"),
        "{case}: top --replay: {stderr}"
    );
}

#[test]
fn readers_open_a_history_they_cannot_write() {
    use std::os::unix::fs::PermissionsExt;
    let root = crate::real_processes::is_root();
    let dir = tempfile::tempdir().unwrap();
    let portable = crate::harness::Portable::new(&write_scenario(dir.path(), "").0);
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    // A history recorded by its owner (root in CI), in a directory the reader may enter.
    let place = portable.dir.path().join("state");
    std::fs::create_dir(&place).unwrap();
    let db = place.join("history.db");
    ok(&record(portable.scenario(), &db, 6));
    assert!(db.exists());

    // The file read-only (0444) in a directory the reader cannot write either.
    mode(&db, 0o444);
    mode(&place, 0o555);
    readers_succeed(&portable, &db, "0444 file in a 0555 directory");
    // The file writable by its owner only (0644, as a recorder leaves it), the directory
    // too: the reader can create no -shm, so SQLite reads the file as immutable.
    mode(&place, 0o755);
    mode(&db, 0o644);
    if !root {
        // As ourselves, only modes can stop us.
        mode(&db, 0o444);
        mode(&place, 0o555);
    }
    readers_succeed(&portable, &db, "another user's history");

    // While the owner's recorder is running (its -wal and -shm are there, read-only to
    // the reader).
    let mut recorder = crate::harness::vramctl_std(portable.scenario())
        .env_remove("FAKE_NVML_TIME")
        .arg("--db")
        .arg(&db)
        .args(["record", "--interval", "100ms"])
        .stderr(Stdio::null())
        .spawn()
        .expect("start the recorder");
    if root {
        mode(&place, 0o755);
        mode(&db, 0o644);
        let shm = place.join("history.db-shm");
        // The recorder's first tick creates the -shm; wait for it, boundedly.
        for _ in 0..100 {
            if shm.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(
            shm.exists(),
            "the recorder never opened its write-ahead log"
        );
        readers_succeed(&portable, &db, "a running recorder's history");
    }
    let _ = recorder.kill();
    let _ = recorder.wait();
    mode(&place, 0o755);
    mode(&db, 0o644);
}

#[test]
fn a_history_that_cannot_be_read_says_read_not_write() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let portable = crate::harness::Portable::new(&write_scenario(dir.path(), "").0);
    let place = portable.dir.path().join("state");
    std::fs::create_dir(&place).unwrap();
    let db = place.join("history.db");
    ok(&record(portable.scenario(), &db, 2));
    if !crate::real_processes::is_root() {
        eprintln!("skipped: a file we own and cannot read needs another uid (id -u is not 0)");
        return;
    }
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = as_reader(&portable, &db, &["history", "--since", "all"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read the history database"),
        "{stderr}"
    );
    assert!(!stderr.contains("write"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // In a directory the reader may not enter: not "no history database" either.
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&place, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = as_reader(&portable, &db, &["export"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read the history database") && stderr.contains("ermission denied"),
        "{stderr}"
    );
    assert!(!stderr.contains("write"), "{stderr}");
    std::fs::set_permissions(&place, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_directory_given_as_db_is_a_clear_error_and_nothing_is_left_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (scenario, _moved) = write_scenario(dir.path(), "");
    for args in [
        &["history"][..],
        &["export"],
        &["leaks"],
        &["import", "--tz", "UTC"],
        &["record", "--ticks", "1"],
    ] {
        let mut cmd = vramctl(&scenario);
        cmd.arg("--db").arg(dir.path()).args(args);
        if args[0] == "import" {
            cmd.arg(fixture("smi-gpu-h200.csv"));
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.trim(),
            format!(
                "vramctl: error: '{}' is a directory, not a history database; point --db / \
                 VRAMCTL_DB at a file, e.g. a 'history.db' inside that directory",
                dir.path().display()
            ),
            "{args:?}"
        );
    }
    let mut lock = dir.path().as_os_str().to_owned();
    lock.push(".lock");
    assert!(
        !Path::new(&lock).exists(),
        "a lock file beside the directory"
    );
    // A reader given a path that does not exist creates nothing either.
    let missing = dir.path().join("none/history.db");
    for args in [&["history"][..], &["export"], &["leaks"]] {
        let out = vramctl(&scenario)
            .arg("--db")
            .arg(&missing)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
    assert!(!dir.path().join("none").exists());
}

/// A pipe whose reader is gone: every write to it fails with EPIPE.
fn closed_pipe() -> Stdio {
    let mut reader = std::process::Command::new("true")
        .stdin(Stdio::piped())
        .spawn()
        .expect("run true");
    let writer = reader.stdin.take().expect("the pipe's write end");
    reader.wait().expect("true exits");
    Stdio::from(writer)
}

#[test]
fn a_closed_stderr_does_not_stop_the_recorder() {
    // `record 2>&1 | head -1`: tracing reported the failed log write with eprintln!, which
    // panicked (exit 101) before the first frame.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let status = vramctl_std(&write_scenario(dir.path(), "").0)
        .env_remove("FAKE_NVML_TIME")
        .env("VRAMCTL_LOG", "debug")
        .arg("--db")
        .arg(&db)
        .args(["record", "--interval", "1s", "--ticks", "20"])
        .args(["--simulated-clock", &T0.to_string()])
        .stderr(closed_pipe())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let store = Store::open(&db, OpenMode::ReadOnly).unwrap();
    assert_eq!(store.last_sample_ms().unwrap(), Some(T0 + 19_000));
}

fn record_stderr(dir: &Path, extra: &[&str]) -> String {
    let db = dir.join(format!("h{}.db", extra.len()));
    let output = vramctl(&write_scenario(dir, "").0)
        .env_remove("FAKE_NVML_TIME")
        .env_remove("NO_COLOR")
        .arg("--db")
        .arg(&db)
        .args(["record", "--interval", "1s", "--ticks", "2"])
        .args(["--simulated-clock", &T0.to_string()])
        .args(extra)
        .output()
        .expect("run vramctl");
    ok(&output);
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_new_history_is_logged_as_created_not_upgraded() {
    // A brand-new file was announced as "Upgraded the history schema", as if an old
    // history had been converted.
    let dir = tempfile::tempdir().unwrap();
    let first = record_stderr(dir.path(), &[]);
    assert!(first.contains("Created the history."), "{first}");
    assert!(!first.contains("Upgraded"), "{first}");
    // The same file again (`record_stderr` names it by the number of extra arguments): it
    // is neither created nor upgraded.
    let again = record_stderr(dir.path(), &[]);
    assert!(!again.contains("Created the history."), "{again}");
    assert!(!again.contains("Upgraded"), "{again}");
}

#[test]
fn logs_are_coloured_only_when_asked_or_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    // stderr is a pipe here: no escapes by default, nor with --color never.
    let auto = record_stderr(dir.path(), &[]);
    assert!(auto.contains("Recording."), "{auto}");
    assert!(!auto.contains('\x1b'), "{auto:?}");
    let never = record_stderr(dir.path(), &["--color", "never"]);
    assert!(!never.contains('\x1b'), "{never:?}");
    let always = record_stderr(dir.path(), &["--color", "always", "-v"]);
    assert!(always.contains('\x1b'), "{always:?}");
    // A log file never gets escapes.
    let log = dir.path().join("record.log");
    let log_arg = log.to_str().unwrap().to_owned();
    record_stderr(
        dir.path(),
        &["--color", "always", "-v", "-v", "--log-file", &log_arg],
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("Recording."), "{text}");
    assert!(!text.contains('\x1b'), "{text:?}");
}

#[test]
fn format_is_always_the_output_format() {
    // `--format` named the output of history and export but the input of import, leaks
    // and plot. The readers' flag is --input-format; their old --format says so.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    for command in ["import", "leaks", "plot"] {
        let output = on_db(&db)
            .args([command, "--format", "gpuz"])
            .arg(fixture("smi-gpu-h200.csv"))
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{command}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("the format of input files is now --input-format"),
            "{command}: {stderr}"
        );
    }
    let output = on_db(&db)
        .args(["import", "--input-format", "smi-gpu"])
        .arg(fixture("smi-gpu-h200.csv"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    // And every command that prints data takes --json: history's is --format json.
    let json = stdout_of(on_db(&db).args(["history", "--since", "all", "--json"]));
    let format_json = stdout_of(on_db(&db).args(["history", "--since", "all", "--format", "json"]));
    assert_eq!(json, format_json);
    assert_eq!(serde_json::from_str::<Value>(&json).unwrap()["schema"], 1);
    let ndjson = stdout_of(on_db(&db).args(["export", "--json"]));
    assert!(
        ndjson
            .lines()
            .all(|l| serde_json::from_str::<Value>(l).is_ok())
    );
    assert!(ndjson.lines().count() > 10);
}

#[test]
fn every_export_and_history_into_a_closed_pipe_exits_0_silently() {
    // The README's `export --format smi-apps | head`: the csv crate's error hid the
    // EPIPE from the exit-code mapping (exit 2) and the message named its cause twice.
    let db = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/h200-recording.db");
    let runs: [&[&str]; 5] = [
        &["export", "--since", "all", "--format", "smi-apps"],
        &["export", "--since", "all", "--format", "smi-gpu"],
        &["export", "--since", "all", "--format", "ndjson"],
        &["history", "--since", "all", "--step", "1m"],
        &["history", "--since", "all", "--json"],
    ];
    for args in runs {
        let output = vramctl_std(&scenario("h200-idle.toml"))
            .arg("--db")
            .arg(&db)
            .args(args)
            .args(["--tz", "UTC"])
            .stdout(closed_pipe())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&output.stderr), "", "{args:?}");
    }
}

#[test]
fn history_without_since_shows_the_window_leaks_and_plot_read() {
    // Issue 29: `history` with no --since read the hour before now, so a recording of last
    // week said "no samples in this range" where `leaks` and `plot` (the 24 hours before
    // the recording's last sample) showed its data. One default for all three now.
    let dir = tempfile::tempdir().expect("tempdir");
    let (scenario, moved) = write_scenario(dir.path(), "");
    let db = dir.path().join("h.db");
    ok(&record(&scenario, &db, 6));
    let text = ok(&on_db(&db)
        .args(["history", "--tz", "UTC"])
        .output()
        .expect("runs"));
    assert!(!text.contains("no samples in this range"), "{text}");
    assert!(text.contains("python leak.py"), "{text}");
    let json = |since: Option<&str>| {
        let mut cmd = on_db(&db);
        cmd.args(["history", "--json"]);
        if let Some(s) = since {
            cmd.args(["--since", s]);
        }
        serde_json::from_str::<Value>(&ok(&cmd.output().expect("runs"))).expect("JSON")
    };
    let (default, all) = (json(None), json(Some("all")));
    // From 24 hours before the last sample (20:31:36), so the whole (short) recording.
    assert_eq!(default["from"], "2026-11-28T20:31:36.000Z");
    for key in ["devices", "processes"] {
        assert_eq!(default[key], all[key], "{key}");
    }
    assert_eq!(
        default["devices"][0]["samples"].as_array().map(Vec::len),
        Some(6)
    );
    // What it read before: the hour before now, which has none of this recording.
    let hour = json(Some("1h"));
    let samples = |doc: &Value, key: &str| -> usize {
        doc[key].as_array().map_or(0, |items| {
            items
                .iter()
                .map(|i| i["samples"].as_array().map_or(0, Vec::len))
                .sum()
        })
    };
    assert_eq!(
        (samples(&hour, "devices"), samples(&hour, "processes")),
        (0, 0),
        "{hour}"
    );
    // leaks reads the same window: it judges the processes of that recording.
    let leaks = moved.back(&ok(&on_db(&db)
        .args(["leaks", "--json"])
        .output()
        .expect("runs")));
    assert!(leaks.contains("32701"), "{leaks}");
}

/// `--since` after `--until` is the same usage error (exit 2) for every command that reads
/// the history; `export` used to write an empty export and exit 0.
#[test]
fn since_after_until_is_a_usage_error_for_every_history_reader() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    ok(&record(&write_scenario(dir.path(), "").0, &db, 2));
    for command in ["export", "history", "leaks", "plot"] {
        let out = on_db(&db)
            .args([command, "--since", "1h", "--until", "2h"])
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(2), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--since '1h' is after --until"),
            "{command}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{command} wrote output");
    }
}

/// A recorded MIG instance is found by its UUID or a UUID prefix, and selecting its GPU
/// brings it, as `status` selects live: one matcher for live and recorded devices.
#[test]
fn a_recorded_mig_instance_is_selected_as_live() {
    const MIG: &str = "MIG-5c1f3a9e-8b2d-5e47-a1c6-3d9f0b7e2a41";
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("mig.db");
    ok(&record(&scenario("mig.toml"), &db, 2));
    let devices_of = |gpu: &str| -> Vec<String> {
        let csv = ok(&on_db(&db)
            .args(["history", "--since", "all", "--format", "csv", "--gpu", gpu])
            .output()
            .expect("runs"));
        let mut uuids: Vec<String> = csv
            .lines()
            .skip(1)
            .filter_map(|line| line.split(',').nth(3).map(str::to_owned))
            .collect();
        uuids.dedup();
        uuids
    };
    assert_eq!(devices_of(MIG), [MIG]);
    assert_eq!(devices_of("MIG-5c1f3a9e-8b2d"), [MIG]);
    let of_gpu_0 = devices_of("0");
    assert!(of_gpu_0.iter().any(|d| d == MIG), "{of_gpu_0:?}");
    assert!(
        of_gpu_0
            .iter()
            .all(|d| d != "GPU-93a0e6c2-4f1b-6d8e-b0c7-1e2f3a4b5c6d"),
        "{of_gpu_0:?}"
    );
    // Live, the same short MIG UUID selects the GPU that holds the instance.
    let live = stdout_of(vramctl(&scenario("mig.toml")).args([
        "status",
        "--json",
        "--gpu",
        "MIG-5c1f3a9e-8b2d",
    ]));
    assert!(live.contains(MIG), "{live}");
}

/// `history --job` and `leaks --job`: a recording of real processes, two in Slurm job 4242
/// (their environment) and one in none, announced to the fake NVML; the job's processes
/// are the ones the recorder stored with its id, device rows are hidden, and a job never
/// recorded is said on stderr.
#[test]
fn history_and_leaks_of_one_job() {
    use crate::real_processes::{Scenario, sleeper, spawn};
    let job_sleeper = || {
        let mut command = std::process::Command::new("sleep");
        command.arg("600").env("SLURM_JOB_ID", "4242");
        spawn(&mut command)
    };
    let (a, b, plain) = (job_sleeper(), job_sleeper(), sleeper());
    let procs = tempfile::tempdir().expect("tempdir");
    for (p, mib) in [(&a, 300), (&b, 200), (&plain, 100)] {
        std::fs::write(
            procs.path().join(p.pid().to_string()),
            format!("0 {}\n", mib * MIB),
        )
        .expect("announce");
    }
    let scenario = Scenario::new(1, &[]);
    let db = scenario.dir.path().join("history.db");
    let run = |args: &[&str]| {
        vramctl_std(&scenario.path)
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .arg("--db")
            .arg(&db)
            .args(args)
            .output()
            .expect("run vramctl")
    };
    let out = run(&[
        "record",
        "--interval",
        "1s",
        "--ticks",
        "5",
        "--simulated-clock",
        &T0.to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = |args: &[&str]| -> Value {
        let out = run(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let pids = |list: &Value| -> Vec<u64> {
        let mut pids: Vec<u64> = list
            .as_array()
            .expect("array")
            .iter()
            .filter_map(|p| p["pid"].as_u64())
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    };
    let mut want = vec![u64::from(a.pid()), u64::from(b.pid())];
    want.sort_unstable();
    let history = json(&["history", "--job", "4242", "--json", "--since", "all"]);
    assert_eq!(pids(&history["processes"]), want, "{history:#}");
    assert_eq!(
        history["devices"],
        serde_json::json!([]),
        "device rows hidden"
    );
    let all = json(&["history", "--json", "--since", "all"]);
    assert_eq!(pids(&all["processes"]).len(), 3, "{all:#}");

    let leaks = json(&["leaks", "--job", "4242", "--json", "--since", "all"]);
    assert_eq!(pids(&leaks["series"]), want, "{leaks:#}");
    assert!(
        leaks["series"]
            .as_array()
            .expect("series")
            .iter()
            .all(|s| !s["pid"].is_null()),
        "no device-wide series: {leaks:#}"
    );

    let none = run(&["history", "--job", "999", "--json", "--since", "all"]);
    assert!(none.status.success());
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("no process of job 999 is recorded"),
        "{}",
        String::from_utf8_lossy(&none.stderr)
    );
}
