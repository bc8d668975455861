//! `vramctl status` against fake scenarios and real processes.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use serde_json::Value;

use crate::harness::{
    MovedPids, json_of, redactions, scenario, stdout_of, vramctl, vramctl_on, vramctl_std,
};

fn devices(report: &Value) -> &Vec<Value> {
    report["devices"].as_array().expect("devices array")
}

#[test]
fn idle_h200_table() {
    let out = stdout_of(vramctl_on("h200-idle.toml").arg("status"));
    redactions().bind(|| insta::assert_snapshot!("status_idle_h200", out));
}

#[test]
fn idle_h200_json() {
    let report = json_of(vramctl_on("h200-idle.toml").args(["status", "--json"]));
    assert_eq!(report["schema"], 1);
    let gpu = &devices(&report)[0];
    let memory = &gpu["memory"];
    // The real H200's idle figures, v2 accounting.
    assert_eq!(memory["total_bytes"], 150_754_820_096_u64);
    assert_eq!(memory["reserved_bytes"], 644_939_776_u64);
    assert_eq!(memory["used_bytes"], 0);
    assert_eq!(gpu["processes"], serde_json::json!([]));
    redactions().bind(|| insta::assert_json_snapshot!("status_idle_h200_json", report));
}

#[test]
fn training_mix_lists_holders_biggest_first_and_unaccounted() {
    let report = json_of(vramctl_on("h200-training.toml").args(["status", "--json"]));
    let gpu = &devices(&report)[0];
    let processes = gpu["processes"].as_array().unwrap();
    assert!(processes.len() >= 4);
    let sizes: Vec<u64> = processes
        .iter()
        .map(|p| p["used_bytes"].as_u64().unwrap())
        .collect();
    assert!(
        sizes.windows(2).all(|w| w[0] >= w[1]),
        "sorted by memory: {sizes:?}"
    );
    let sum: u64 = sizes.iter().sum();
    let used = gpu["memory"]["used_bytes"].as_u64().unwrap();
    assert_eq!(gpu["unaccounted_bytes"].as_u64().unwrap(), used - sum);
    assert!(
        used > sum,
        "the scenario has memory no process accounts for"
    );
    // Fictional PIDs are not in this namespace: the driver's name is shown instead.
    assert_eq!(processes[0]["visible"], false);
    assert!(
        processes[0]["command"]
            .as_str()
            .unwrap()
            .starts_with("python")
    );
}

#[test]
fn eight_gpus_with_thirty_processes_each() {
    let report = json_of(vramctl_on("eight-gpus-30-procs.toml").args(["status", "--json"]));
    let gpus = devices(&report);
    assert_eq!(gpus.len(), 8);
    for gpu in gpus {
        assert_eq!(gpu["state"], "ok");
        assert_eq!(
            gpu["processes"].as_array().unwrap().len(),
            30,
            "GPU {}",
            gpu["index"]
        );
    }
    let out = stdout_of(vramctl_on("eight-gpus-30-procs.toml").arg("status"));
    assert_eq!(out.lines().filter(|l| l.starts_with("GPU ")).count(), 8);
}

#[test]
fn mig_instances_sit_under_their_gpu() {
    let report = json_of(vramctl_on("mig.toml").args(["status", "--json"]));
    let gpu = &devices(&report)[0];
    let instances = gpu["mig_instances"].as_array().unwrap();
    assert_eq!(instances.len(), 3);
    for instance in instances {
        assert!(instance["uuid"].as_str().unwrap().starts_with("MIG-"));
        assert!(instance["memory"]["total_bytes"].as_u64().unwrap() > 0);
        let gi = &instance["gpu_instance_id"];
        let inside = gpu["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| &p["gpu_instance_id"] == gi);
        assert!(inside.count() >= 1, "instance {gi} has its processes");
    }
    assert!(
        devices(&report)[1]["mig_instances"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let out = stdout_of(vramctl_on("mig.toml").arg("status"));
    redactions().bind(|| insta::assert_snapshot!("status_mig", out));
}

#[test]
fn a_gpu_lost_midway_is_reported_while_the_other_keeps_reporting() {
    // Before the loss (t = 5) both answer; after it (t = 20) GPU 1 is lost from the start.
    let before = json_of(
        vramctl_on("fault-gpu-lost.toml")
            .env("FAKE_NVML_TIME", "5")
            .args(["status", "--json"]),
    );
    assert!(devices(&before).iter().all(|d| d["state"] == "ok"));

    // A watch that crosses t = 10: the same session sees GPU 1 go.
    let dir = tempfile::tempdir().unwrap();
    let stepped = dir.path().join("lost.toml");
    let text = std::fs::read_to_string(scenario("fault-gpu-lost.toml")).unwrap();
    // A table header after the [[gpu]] arrays starts a new table; before them it would
    // capture the top-level keys.
    std::fs::write(&stepped, format!("{text}\n{}", step_clock(4.0))).unwrap();
    let out = stdout_of(
        vramctl(&stepped)
            .env_remove("FAKE_NVML_TIME")
            .args(["status", "--json", "--watch", "0.05", "--count", "5"]),
    );
    let reports: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(reports.len(), 5, "one NDJSON object per refresh");
    let first = &reports[0];
    let last = &reports[4];
    assert_eq!(devices(first)[1]["state"], "ok");
    assert_eq!(devices(last)[1]["state"], "lost");
    assert!(
        devices(last)[1]["error"]
            .as_str()
            .unwrap()
            .contains("fell off the bus")
    );
    assert_eq!(devices(last)[0]["state"], "ok");
    assert!(devices(last)[0]["memory"]["used_bytes"].as_u64().unwrap() > 0);
}

/// A `[clock]` table that moves the fake's time by `step_s` at each sample.
fn step_clock(step_s: f64) -> String {
    format!("[clock]\nmode = \"step\"\nstep_s = {step_s}\n")
}

#[test]
fn unsupported_fields_are_null_with_reasons() {
    let report = json_of(vramctl_on("fault-not-supported.toml").args(["status", "--json"]));
    let igpu = &devices(&report)[1];
    assert_eq!(igpu["memory"], Value::Null);
    assert_eq!(igpu["power_mw"], Value::Null);
    assert_eq!(igpu["missing"]["memory"], "not supported");
    assert_eq!(igpu["missing"]["power"], "not supported");
    // The healthy GPU beside it reports everything.
    assert!(devices(&report)[0]["power_mw"].as_u64().is_some());
}

#[test]
fn no_permission_for_processes_is_said() {
    let report = json_of(vramctl_on("fault-no-permission.toml").args(["status", "--json"]));
    let gpu = &devices(&report)[0];
    assert_eq!(gpu["processes"], Value::Null);
    assert_eq!(gpu["missing"]["compute_processes"], "no permission");
    assert_eq!(
        gpu["unaccounted_bytes"],
        Value::Null,
        "unknown, not all of it"
    );
    let out = stdout_of(vramctl_on("fault-no-permission.toml").arg("status"));
    assert!(out.contains("compute_processes (no permission)"), "{out}");
}

#[test]
fn absurd_answers_are_dropped_with_reasons() {
    let report = json_of(vramctl_on("fault-absurd.toml").args(["status", "--json"]));
    let gpus = devices(&report);
    let pids: Vec<u64> = gpus[0]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert!(!pids.contains(&0));
    assert!(!pids.contains(&4_294_967_295));
    let dropped = gpus[0]["dropped"].as_array().unwrap();
    assert!(dropped.iter().any(|d| d["what"] == "pid 0"));
    assert!(dropped.iter().any(|d| d["what"] == "pid 4294967295"));
    // NVML's "not available" memory is unknown, not dropped.
    assert!(
        gpus[0]["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["used_bytes"].is_null())
    );
    // used > total and u64::MAX: the memory reading is dropped, the device still listed.
    for gpu in &gpus[1..] {
        assert_eq!(gpu["memory"], Value::Null);
        assert!(
            gpu["missing"]["memory"]
                .as_str()
                .unwrap()
                .starts_with("dropped:")
        );
    }
    let out = stdout_of(vramctl_on("fault-absurd.toml").arg("status"));
    redactions().bind(|| insta::assert_snapshot!("status_absurd", out));
}

#[test]
fn r535_struct_drift_never_yields_pid_0_or_minus_1() {
    let report = json_of(vramctl_on("fault-r535-stride.toml").args(["status", "--json"]));
    for gpu in devices(&report) {
        for p in gpu["processes"].as_array().into_iter().flatten() {
            let pid = p["pid"].as_u64().unwrap();
            assert!(pid > 0 && pid <= 4_194_304, "pid {pid}");
        }
    }
}

#[test]
fn gpu_filter_by_index_and_uuid() {
    let by_index = json_of(vramctl_on("mig.toml").args(["status", "--json", "--gpu", "1"]));
    assert_eq!(devices(&by_index).len(), 1);
    let uuid = devices(&by_index)[0]["uuid"].as_str().unwrap().to_owned();
    let by_uuid = json_of(vramctl_on("mig.toml").args(["status", "--json", "--gpu", &uuid]));
    assert_eq!(devices(&by_uuid)[0]["index"], 1);
}

#[test]
fn a_real_process_shows_its_user_and_command_and_leaves_when_it_exits() {
    let mut child = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("real.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[[gpu]]
name = "NVIDIA H200"
uuid = "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2"
memory_total = "141 GiB"
[[gpu.process]]
pid = {}
real = true
name = "sleep"
memory = "3 GiB"
"#,
            child.id()
        ),
    )
    .unwrap();
    let report = json_of(vramctl(&path).args(["status", "--json"]));
    let p = &devices(&report)[0]["processes"][0];
    assert_eq!(p["pid"], child.id());
    assert_eq!(p["visible"], true);
    assert_eq!(p["command"], "sleep 300");
    let me = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    assert_eq!(p["user"], String::from_utf8_lossy(&me.stdout).trim());
    assert_eq!(devices(&report)[0]["memory"]["used_bytes"], 3_u64 << 30);

    child.kill().unwrap();
    child.wait().unwrap();
    let report = json_of(vramctl(&path).args(["status", "--json"]));
    assert_eq!(devices(&report)[0]["processes"], serde_json::json!([]));
    assert_eq!(
        devices(&report)[0]["memory"]["used_bytes"],
        0,
        "the driver freed its memory"
    );
}

#[test]
fn closing_the_pipe_is_not_an_error() {
    let mut child = vramctl_std(&scenario("eight-gpus-30-procs.toml"))
        .args(["status", "--json", "--watch", "0.05"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first).unwrap();
    assert!(first.starts_with("{\"schema\":1"));
    // The reader is gone (stdout dropped); the next write fails with EPIPE.
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Two H200s; on GPU 0 five holders with command lines as they read on a real host (the
/// driver's names, as for any PID this namespace cannot see), moved to PIDs that are free
/// here; GPU 1 is lost before the first sample. Returns the scenario and settings that
/// show the PIDs as 40001.. whatever they are here.
fn long_commands_scenario() -> (tempfile::TempDir, std::path::PathBuf, insta::Settings) {
    let names = [
        (
            "60 GiB",
            "/opt/torch/.venv/bin/python3 /home/labuser/work/vramctl/scripts/workloads/steady_train.py --epochs 90 --lr 3e-4",
        ),
        (
            "24 GiB",
            "/opt/conda/envs/llm/bin/python -m vllm.entrypoints.openai.api_server --model /models/llama-3-70b-instruct --port 8000",
        ),
        (
            "12 GiB",
            "/opt/torch/.venv/bin/python3 /home/labuser/work/vramctl/scripts/workloads/idle_holder.py --gib 12",
        ),
        (
            "8 GiB",
            "/home/alice/.local/share/jupyter/kernels/py311/bin/python -m ipykernel_launcher -f /run/user/1000/jupyter/kernel-1c2d.json",
        ),
        (
            "2 GiB",
            "/opt/torch/.venv/bin/python3 /home/labuser/work/vramctl/scripts/workloads/leak_graph.py",
        ),
    ];
    let pids = crate::real_processes::unused_pids(names.len());
    let mut text = String::from(
        "driver_version = \"580.159.04\"\n\
         [[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\n\
         pci_bus_id = \"00000000:00:06.0\"\nmemory_total = 150754820096\n\
         memory_reserved = 644939776\nutilization_gpu = 87\ntemperature_c = 61\n\
         power_mw = 512000\n",
    );
    let mut settings = redactions();
    for (i, ((memory, name), pid)) in names.iter().zip(&pids).enumerate() {
        text.push_str(&format!(
            "[[gpu.process]]\npid = {pid}\nname = \"{name}\"\nmemory = \"{memory}\"\n"
        ));
        settings.add_filter(&format!(r"\b{pid}\b"), (40001 + i).to_string());
    }
    text.push_str(
        "[[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"GPU-93a0e6c2-4f1b-6d8e-b0c7-1e2f3a4b5c6d\"\n\
         memory_total = 150754820096\nlost_at_s = 0.0\n",
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("long-commands.toml");
    std::fs::write(&path, text).expect("write");
    (dir, path, settings)
}

fn status_at(path: &std::path::Path, columns: usize, args: &[&str]) -> String {
    let out = stdout_of(
        vramctl(path)
            .env("COLUMNS", columns.to_string())
            .arg("status")
            .args(args),
    );
    for line in out.lines() {
        assert!(
            line.chars().count() <= columns,
            "{} > {columns}: {line}",
            line.chars().count()
        );
    }
    out
}

#[test]
fn status_fits_80_columns_without_wrapping() {
    let (_dir, path, settings) = long_commands_scenario();
    let out = status_at(&path, 80, &[]);
    // Interpreter and script first, as `leaks`, `ps` and `top` shorten them.
    assert!(out.contains("python3 steady_train.py"), "{out}");
    assert!(out.contains("python3 idle_holder.py"), "{out}");
    settings.bind(|| insta::assert_snapshot!("status_80_columns", out));
}

#[test]
fn status_uses_the_room_of_a_wider_terminal() {
    let (_dir, path, settings) = long_commands_scenario();
    let narrow = status_at(&path, 80, &[]);
    let wide = status_at(&path, 120, &[]);
    let longest = |out: &str| out.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(longest(&wide) > 100, "{wide}");
    assert!(longest(&wide) > longest(&narrow));
    assert!(wide.contains("--epochs 90"), "{wide}");
    settings.bind(|| insta::assert_snapshot!("status_120_columns", wide));
    // A pipe with no COLUMNS cuts nothing: scripts see whole command lines.
    let piped = stdout_of(vramctl(&path).arg("status"));
    assert!(piped.contains("/home/labuser/work/vramctl/scripts/workloads/steady_train.py"));
}

#[test]
fn compact_status_is_one_line_per_gpu() {
    let (_dir, path, settings) = long_commands_scenario();
    let narrow = status_at(&path, 80, &["--compact"]);
    let wide = status_at(&path, 120, &["--compact"]);
    for out in [&narrow, &wide] {
        // The header, then one line per GPU (the lost one included).
        assert_eq!(out.lines().count(), 3, "{out}");
        assert!(
            out.lines()
                .nth(1)
                .is_some_and(|l| l.starts_with("[0] NVIDIA H200 | 61°C,  87 % | "))
        );
        assert!(out.lines().nth(2).is_some_and(|l| l.starts_with("[1] ")));
    }
    assert!(narrow.contains("-:python3 steady_t"), "{narrow}");
    let holders = |out: &str| out.matches("):").count() + out.matches(" -:").count();
    assert!(holders(&wide) > holders(&narrow), "{narrow}{wide}");
    settings.bind(|| {
        insta::assert_snapshot!("status_compact_80_columns", narrow);
        insta::assert_snapshot!("status_compact_120_columns", wide);
    });
}

#[test]
fn nvidia_smi_short_flags_select_gpus_and_loop() {
    let (_dir, path, _settings) = long_commands_scenario();
    let by_gpu = json_of(vramctl(&path).args(["status", "--json", "--gpu", "0"]));
    for flags in [&["-i", "0"][..], &["--id", "0"]] {
        let report = json_of(vramctl(&path).args(["status", "--json"]).args(flags));
        assert_eq!(devices(&report).len(), 1, "{flags:?}");
        assert_eq!(devices(&report)[0]["uuid"], devices(&by_gpu)[0]["uuid"]);
    }
    for flags in [&["-l", "0.05"][..], &["--loop", "0.05"]] {
        let out = stdout_of(
            vramctl(&path)
                .args(["status", "--json", "--count", "2"])
                .args(flags),
        );
        assert_eq!(out.lines().count(), 2, "{flags:?}: {out}");
    }
}

/// 2026-11-29T20:31:31Z: the simulated recording starts here.
const REPLAY_T0: i64 = 1_795_984_291_000;

/// Three GPUs on the fake's step clock (sample k of a session sees t = k + 1): GPU 0 with
/// memory, utilization and temperature that change every sample, a real process (`sleeper`),
/// a fictional one and one that ends at t = 3; GPU 1 lost from t = 3.5; GPU 2 that reports
/// nothing but memory. The fictional PIDs are moved to free ones (a real process on one
/// while recording would be recorded as itself, and the replay and the live view differ);
/// no assertion names them.
fn replay_scenario(dir: &std::path::Path, sleeper: u32) -> std::path::PathBuf {
    let path = dir.join("replay.toml");
    let moved = MovedPids::new(&[32702, 25002]);
    std::fs::write(
        &path,
        moved.scenario(&format!(
            r#"driver_version = "580.159.04"
nvml_version = "13.580.159.04"
[clock]
mode = "step"
step_s = 1.0

[[gpu]]
name = "NVIDIA H200"
uuid = "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2"
pci_bus_id = "00000000:00:06.0"
memory_total = 150754820096
memory_reserved = 644939776
memory_extra_used = "1 GiB"
utilization_gpu = {{ steps = {{ values = [10, 20, 30, 40, 50, 60], every_s = 1.0 }} }}
utilization_memory = {{ steps = {{ values = [1, 2, 3, 4, 5, 6], every_s = 1.0 }} }}
temperature_c = {{ ramp = {{ from = 40, rate_per_s = 1.0, max = 80 }} }}
power_mw = 250000
process_utilization = "report"

[[gpu.process]]
pid = {sleeper}
real = true
name = "sleep"
memory = {{ steps = {{ values = ["1 GiB", "2 GiB", "3 GiB", "4 GiB", "5 GiB", "6 GiB"], every_s = 1.0 }} }}
sm_util = 0

[[gpu.process]]
pid = 32702
name = "python hold.py"
memory = "6 GiB"
sm_util = 5
end_s = 3.0

[[gpu]]
name = "NVIDIA H200"
uuid = "GPU-93a0e6c2-4f1b-6d8e-b0c7-1e2f3a4b5c6d"
pci_bus_id = "00000000:00:07.0"
memory_total = 150754820096
memory_reserved = 644939776
utilization_gpu = 45
temperature_c = 53
power_mw = 300000
lost_at_s = 3.5

[[gpu.process]]
pid = 25002
name = "python train.py --rank 1"
memory = "30 GiB"

[[gpu]]
name = "NVIDIA H200"
uuid = "GPU-0000000a-1111-2222-3333-444444444444"
memory_total = 150754820096
memory_reserved = 644939776
"#
        )),
    )
    .expect("write the scenario");
    path
}

/// What `status` reports that a history does not keep (`docs/json.md`, "status --replay"),
/// taken out of a report so that a replayed one and a live one compare: the time it was
/// taken (the replay's is the recorded time), the driver's versions, the process type,
/// MIG instance ids, sanity drops, unopened devices, the missing-value reasons of fields
/// without a series, and the replay's own `replay` object.
fn without_what_a_history_does_not_keep(mut report: Value) -> Value {
    const KEPT_MISSING: [&str; 6] = [
        "memory",
        "utilization",
        "temperature",
        "power",
        "compute_processes",
        "mig_memory",
    ];
    let top = report.as_object_mut().expect("a report is an object");
    for key in ["taken_at", "driver", "unopened", "replay"] {
        top.remove(key);
    }
    for device in top["devices"].as_array_mut().expect("devices") {
        let device = device.as_object_mut().expect("a device is an object");
        device.remove("dropped");
        if let Some(missing) = device.get_mut("missing").and_then(Value::as_object_mut) {
            missing.retain(|k, _| KEPT_MISSING.contains(&k.as_str()));
        }
        for p in device
            .get_mut("processes")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let p = p.as_object_mut().expect("a process is an object");
            for key in ["kind", "gpu_instance_id", "compute_instance_id", "cgroup"] {
                p.remove(key);
            }
        }
        for mig in device["mig_instances"]
            .as_array_mut()
            .expect("mig_instances")
        {
            let mig = mig.as_object_mut().expect("a MIG instance is an object");
            mig.remove("gpu_instance_id");
            mig.remove("compute_instance_id");
        }
    }
    report
}

fn rfc3339_ms(unix_ms: i64) -> String {
    vramctl_store::format::rfc3339(unix_ms)
}

#[test]
fn status_replay_at_a_recorded_moment_is_status_at_that_moment() {
    let sleeper = crate::real_processes::sleeper();
    let dir = tempfile::tempdir().unwrap();
    let path = replay_scenario(dir.path(), sleeper.pid());
    let db = dir.path().join("history.db");
    let ticks = 5;
    // The recorder's session and a live `status --watch` session both enumerate at t = 0
    // and sample at t = 1, 2, ...: their k-th samples see the same moment of the scenario.
    let recorded = vramctl(&path)
        .env_remove("FAKE_NVML_TIME")
        .arg("--db")
        .arg(&db)
        .args(["record", "--interval", "1s", "--ticks", &ticks.to_string()])
        .args(["--simulated-clock", &REPLAY_T0.to_string()])
        .output()
        .unwrap();
    assert!(
        recorded.status.success(),
        "{}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    let live_json = stdout_of(vramctl(&path).env_remove("FAKE_NVML_TIME").args([
        "status",
        "--json",
        "--watch",
        "0.05",
        "--count",
        &ticks.to_string(),
    ]));
    let live_json: Vec<Value> = live_json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let live_text = stdout_of(
        vramctl(&path)
            .env_remove("FAKE_NVML_TIME")
            .env("COLUMNS", "200")
            .args(["status", "--watch", "0.05", "--count", &ticks.to_string()]),
    );
    // Without a terminal each refresh is a block followed by an empty line.
    let live_text: Vec<&str> = live_text.split("\n\nvramctl ").collect();
    assert_eq!((live_json.len(), live_text.len()), (5, 5));

    for (k, live) in live_json.into_iter().enumerate() {
        let at = REPLAY_T0 + 1000 * i64::try_from(k).unwrap();
        let replayed = json_of(vramctl(&path).arg("status").arg("--replay").arg(&db).args([
            "--at",
            &rfc3339_ms(at),
            "--json",
        ]));
        // The recorded moment, and what the history does not keep is not reported.
        assert_eq!(replayed["taken_at"], rfc3339_ms(at), "tick {k}");
        assert_eq!(replayed["replay"]["at"], rfc3339_ms(at));
        assert_eq!(replayed["driver"]["driver_version"], Value::Null);
        assert_eq!(replayed["unopened"], Value::Null);
        for device in devices(&replayed) {
            assert_eq!(device["dropped"], Value::Null);
            for p in device["processes"].as_array().into_iter().flatten() {
                assert_eq!(p["kind"], Value::Null);
            }
        }
        assert_eq!(
            without_what_a_history_does_not_keep(replayed.clone()),
            without_what_a_history_does_not_keep(live.clone()),
            "tick {k}"
        );

        // The text: the same blocks, but for the header (the recorded time, no driver) and
        // the process type (`-`: not recorded).
        let text = stdout_of(
            vramctl(&path)
                .env("COLUMNS", "200")
                .arg("status")
                .arg("--replay")
                .arg(&db)
                .args(["--at", &rfc3339_ms(at), "--tz", "UTC"]),
        );
        let body = |block: &str| -> Vec<String> {
            block
                .trim_end()
                .lines()
                .skip(1)
                .map(|l| l.replacen("  C     ", "  -     ", 1))
                .collect()
        };
        assert_eq!(body(&text), body(live_text[k]), "tick {k}");
        // The header names the recorded moment, in the zone asked for, labelled.
        let labelled = jiff::Timestamp::from_millisecond(at)
            .unwrap()
            .strftime("%Y-%m-%d %H:%M:%S UTC")
            .to_string();
        assert!(text.lines().next().unwrap().contains(&labelled), "{text}");
    }

    // What changed between the moments is replayed as it was: the real process's memory
    // and who it is, the process that ended, the GPU lost at t = 3.5 (tick 3).
    let at = |k: i64| {
        json_of(vramctl(&path).arg("status").arg("--replay").arg(&db).args([
            "--at",
            &rfc3339_ms(REPLAY_T0 + 1000 * k),
            "--json",
        ]))
    };
    let (first, last) = (at(0), at(4));
    let real = |report: &Value| {
        devices(report)[0]["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == sleeper.pid())
            .cloned()
            .unwrap()
    };
    // Tick k saw t = k + 1: the step of 2 GiB first, of 6 GiB last.
    assert_eq!(real(&first)["used_bytes"], 2_u64 << 30);
    assert_eq!(real(&last)["used_bytes"], 6_u64 << 30);
    assert_eq!(real(&first)["visible"], true);
    assert_eq!(real(&first)["command"], "sleep 600");
    assert_eq!(devices(&first)[0]["processes"].as_array().unwrap().len(), 2);
    assert_eq!(devices(&last)[0]["processes"].as_array().unwrap().len(), 1);
    assert_eq!(devices(&first)[1]["state"], "ok");
    assert_eq!(devices(&last)[1]["state"], "lost");
    // Between two samples, the one before; with no --at, the last.
    let between = json_of(vramctl(&path).arg("status").arg("--replay").arg(&db).args([
        "--at",
        &rfc3339_ms(REPLAY_T0 + 1500),
        "--json",
    ]));
    assert_eq!(between["taken_at"], rfc3339_ms(REPLAY_T0 + 1000));
    let newest = json_of(
        vramctl(&path)
            .arg("status")
            .arg("--replay")
            .arg(&db)
            .arg("--json"),
    );
    assert_eq!(newest["taken_at"], rfc3339_ms(REPLAY_T0 + 4000));
}

#[test]
fn status_replay_shows_the_last_sample_at_or_before_when_and_how_old_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = replay_scenario(dir.path(), 1);
    let db = dir.path().join("history.db");
    let output = vramctl(&path)
        .env_remove("FAKE_NVML_TIME")
        .arg("--db")
        .arg(&db)
        .args(["record", "--interval", "1s", "--ticks", "2"])
        .args(["--simulated-clock", &REPLAY_T0.to_string()])
        .output()
        .unwrap();
    assert!(output.status.success());
    let before = vramctl(&path)
        .arg("status")
        .arg("--replay")
        .arg(&db)
        .args(["--at", "2020-01-01T00:00:00Z"])
        .output()
        .unwrap();
    assert_eq!(before.status.code(), Some(2));
    let err = String::from_utf8_lossy(&before.stderr);
    assert!(
        err.contains("no sample at or before --at '2020-01-01T00:00:00Z'")
            && err.contains("its first is at 2026-11-29T20:31:31.000Z"),
        "{err}"
    );
    // After the recording ended (it sampled each second until 20:31:32): its last sample,
    // as the README says ("the last sample at or before WHEN"), saying how old it is —
    // `--at 10m` included, the issue-29 case (this recording is days older than now).
    let after = vramctl(&path)
        .arg("status")
        .arg("--replay")
        .arg(&db)
        .args(["--at", "2026-11-29T20:31:35Z"])
        .output()
        .unwrap();
    assert_eq!(after.status.code(), Some(0), "{after:?}");
    let out = String::from_utf8_lossy(&after.stdout);
    assert!(
        out.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("the last sample at or before ")
                && l.ends_with(" is 3s older: the recording ended at 2026-11-29T20:31:32.000Z")),
        "{out}"
    );
    let after = json_of(vramctl(&path).arg("status").arg("--replay").arg(&db).args([
        "--at",
        "2026-11-29T20:31:35Z",
        "--json",
    ]));
    assert_eq!(after["taken_at"], "2026-11-29T20:31:32.000Z");
    assert_eq!(after["replay"]["sample_age_ms"], 3000);
    assert_eq!(
        after["replay"]["stale"],
        "the recording ended at 2026-11-29T20:31:32.000Z"
    );
    let ten_minutes_ago = json_of(
        vramctl(&path)
            .arg("status")
            .arg("--replay")
            .arg(&db)
            .args(["--at", "10m", "--json"]),
    );
    assert_eq!(ten_minutes_ago["taken_at"], "2026-11-29T20:31:32.000Z");
    assert!(ten_minutes_ago["replay"]["sample_age_ms"].as_i64().unwrap() > 600_000);
    let near_end = json_of(vramctl(&path).arg("status").arg("--replay").arg(&db).args([
        "--at",
        "2026-11-29T20:31:34Z",
        "--json",
    ]));
    assert_eq!(near_end["taken_at"], "2026-11-29T20:31:32.000Z");
    assert_eq!(near_end["replay"]["stale"], serde_json::Value::Null);
    // `all` is the end of time: the last sample.
    let all = json_of(
        vramctl(&path)
            .arg("status")
            .arg("--replay")
            .arg(&db)
            .args(["--at", "all", "--json"]),
    );
    assert_eq!(all["taken_at"], "2026-11-29T20:31:32.000Z");
    // A time that is not one, a database that is not there: one line, exit 2.
    let missing = dir.path().join("nope.db");
    for (args, says) in [
        (
            vec![
                "status".to_owned(),
                "--replay".to_owned(),
                db.display().to_string(),
                "--at".to_owned(),
                "yesterday-ish".to_owned(),
            ],
            "'yesterday-ish' is not a time".to_owned(),
        ),
        (
            vec![
                "status".to_owned(),
                "--replay".to_owned(),
                missing.display().to_string(),
            ],
            format!(
                "no history database at '{}'; point --replay at a vramctl history file",
                missing.display()
            ),
        ),
    ] {
        let out = vramctl(&path).args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&says), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(
            !missing.exists(),
            "a reader created '{}'",
            missing.display()
        );
    }
    // --at means nothing live, and a moment is not a stream.
    for args in [
        &["status", "--at", "now"][..],
        &["status", "--replay", "x.db", "--watch", "1s"][..],
    ] {
        let out = vramctl(&path).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn status_header_time_is_in_the_asked_zone_and_labelled() {
    let out = stdout_of(vramctl_on("h200-idle.toml").env("TZ", "UTC").args([
        "status",
        "--no-daemon",
        "--tz",
        "Asia/Tokyo",
    ]));
    let header = out.lines().next().expect("a header line");
    // Tokyo has no daylight saving time: always JST, never the UTC of the JSON.
    assert!(
        regex::Regex::new(r"· \d{4}-\d\d-\d\d \d\d:\d\d:\d\d JST$")
            .expect("regex")
            .is_match(header),
        "{header}"
    );
    let json =
        stdout_of(vramctl_on("h200-idle.toml").args(["status", "--json", "--tz", "Asia/Tokyo"]));
    assert!(json.contains("Z\""), "the JSON keeps RFC 3339 UTC: {json}");
}

#[test]
fn a_real_process_on_a_fictional_pid_does_not_change_what_the_tests_see() {
    // stdout_of moves a shipped scenario's PID that a real process holds, and gives the
    // output back with the original: the status table of mig.toml is the same whoever
    // holds 30101 here. Getting PID 30101 takes root (ns_last_pid); elsewhere, skipped.
    if !crate::real_processes::is_root() {
        eprintln!("skipped: only root can choose a PID");
        return;
    }
    let plain = stdout_of(vramctl_on("mig.toml").arg("status"));
    let mut holder = None;
    for _ in 0..20 {
        if std::fs::write("/proc/sys/kernel/ns_last_pid", "30100").is_err() {
            break;
        }
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        if child.id() == 30101 {
            holder = Some(child);
            break;
        }
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }
    let Some(mut holder) = holder else {
        eprintln!("skipped: PID 30101 could not be taken here");
        return;
    };
    let out = stdout_of(vramctl_on("mig.toml").arg("status"));
    let _ = holder.kill();
    let _ = holder.wait();
    // The header's clock aside.
    let body = |s: &str| s.lines().skip(1).collect::<Vec<_>>().join("\n");
    assert_eq!(body(&out), body(&plain));
    assert!(!out.contains("sleep"), "{out}");
}

#[test]
fn the_harness_knows_a_shipped_scenario_s_fictional_pids() {
    // stdout_of repeats a run while one of these is a real process here (a Chromium of the
    // web tests once held 30101 while `status` ran on mig.toml).
    let pids = crate::harness::fictional_pids(&crate::harness::scenario("mig.toml"));
    assert_eq!(pids, vec![30101, 30102, 30201, 30901, 31001]);
}
