//! Every view with two busy GPUs (issue 36 item 3, the CPU half of
//! `scripts/check-two-gpu-h200x2.sh`): one trainer on both GPUs whose memory grows on
//! GPU 1 only, a steady holder on each. Selection by index, UUID and UUID prefix shows
//! that GPU's processes and that GPU's share of a process on both; the leak is judged on
//! GPU 1 alone, live (`serve`'s `/api/now` and metrics, `leaks --watch`) and recorded
//! (`record`, `history`, `leaks`); the agent's figures under a selection are that GPU's.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::harness::{MovedPids, vramctl, vramctl_std};
use crate::reclaim::{GIB, Py};
use crate::serve::{get, serve};

const UUID0: &str = "GPU-1c2e4a61-5b7d-4e0f-9a31-7d5e2c8b4f10";
const UUID1: &str = "GPU-9f03b6d2-2a4c-4d8e-b1f7-0c6a9e3d5b21";
/// Enough of GPU 0's UUID to name it (`GPU-` and 8 characters), as people paste them.
const PREFIX0: &str = "GPU-1c2e4a61";
const TRAINER: u64 = 31001;
const STEADY1: u64 = 31002;
const STEADY0: u64 = 31003;
/// The trainer's step on GPU 1.
const MIB32: u64 = 32 << 20;
/// 2026-11-29T20:31:31Z: the simulated clock's start.
const T0: i64 = 1_795_984_291_000;

/// The two GPUs on the fake's step clock (one second per sample): the trainer holds 2 GiB
/// on GPU 0 throughout and on GPU 1 4 GiB that, from 30 s, grows 32 MiB a second. Its
/// PIDs are moved to free ones; read every output through the [`MovedPids`] returned.
fn scenario(dir: &Path) -> (PathBuf, MovedPids) {
    let growth: Vec<String> = (0..=200)
        .map(|t: u32| format!("[{t}.0, \"{} MiB\"]", 4096 + 32 * t.saturating_sub(30)))
        .collect();
    let text = format!(
        r#"driver_version = "580.159.04"
[clock]
mode = "step"
step_s = 1.0

[[gpu]]
name = "NVIDIA H200"
uuid = "{UUID0}"
memory_total = 150754820096
memory_reserved = 644939776
utilization_gpu = 50

[[gpu.process]]
pid = {TRAINER}
name = "python train.py"
memory = "2 GiB"
sm_util = 40

[[gpu.process]]
pid = {STEADY0}
name = "python hold0.py"
memory = "3 GiB"
sm_util = 30

[[gpu]]
name = "NVIDIA H200"
uuid = "{UUID1}"
memory_total = 150754820096
memory_reserved = 644939776
utilization_gpu = 50

[[gpu.process]]
pid = {TRAINER}
name = "python train.py"
memory = {{ points = [{}] }}
sm_util = 40

[[gpu.process]]
pid = {STEADY1}
name = "python hold1.py"
memory = "7 GiB"
sm_util = 30
"#,
        growth.join(", ")
    );
    let moved = MovedPids::new(&[TRAINER, STEADY1, STEADY0].map(|p| p as u32));
    let path = dir.join("two-gpus.toml");
    std::fs::write(&path, moved.scenario(&text)).expect("scenario");
    (path, moved)
}

/// A successful run's JSON, its PIDs given back as the scenario chose them.
fn json_of(moved: &MovedPids, cmd: &mut assert_cmd::Command) -> Value {
    let out = cmd.output().expect("vramctl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&moved.back(&String::from_utf8_lossy(&out.stdout))).expect("JSON")
}

/// `(GPU UUID, PID, bytes)` of every process a `status --json` shows, in order.
fn status_rows(report: &Value) -> Vec<(String, u64, u64)> {
    let mut rows = Vec::new();
    for d in report["devices"].as_array().expect("devices") {
        for p in d["processes"].as_array().expect("processes") {
            rows.push((
                d["uuid"].as_str().expect("uuid").to_owned(),
                p["pid"].as_u64().expect("pid"),
                p["used_bytes"].as_u64().expect("bytes"),
            ));
        }
    }
    rows
}

/// `(PID, bytes, [GPU UUIDs])` of every row a `ps --json` shows, sorted by PID.
fn ps_rows(report: &Value) -> Vec<(u64, u64, Vec<String>)> {
    let mut rows: Vec<_> = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .map(|p| {
            let gpus = p["gpus"]
                .as_array()
                .expect("gpus")
                .iter()
                .map(|g| g["uuid"].as_str().expect("uuid").to_owned())
                .collect();
            (
                p["pid"].as_u64().expect("pid"),
                p["used_bytes"].as_u64().expect("bytes"),
                gpus,
            )
        })
        .collect();
    rows.sort();
    rows
}

#[test]
fn selection_by_index_uuid_and_prefix_shows_that_gpus_processes_and_share() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, moved) = scenario(dir.path());
    let on0 = vec![
        (UUID0.to_owned(), STEADY0, 3 * GIB),
        (UUID0.to_owned(), TRAINER, 2 * GIB),
    ];
    let on1 = vec![
        (UUID1.to_owned(), STEADY1, 7 * GIB),
        (UUID1.to_owned(), TRAINER, 4 * GIB),
    ];
    let status = |sel: &[&str]| {
        status_rows(&json_of(
            &moved,
            vramctl(&path).args(["status", "--json"]).args(sel),
        ))
    };
    let both: Vec<_> = on0.iter().chain(&on1).cloned().collect();
    assert_eq!(status(&[]), both);
    for sel in [&["-i", "0"][..], &["--gpu", UUID0], &["--gpu", PREFIX0]] {
        assert_eq!(status(sel), on0, "{sel:?}");
    }
    for sel in [&["-i", "1"][..], &["--id", UUID1], &["--gpu", &UUID1[..14]]] {
        assert_eq!(status(sel), on1, "{sel:?}");
    }

    // ps: a process on both GPUs counts, under a selection, that GPU's memory alone.
    let ps = |sel: &[&str]| {
        ps_rows(&json_of(
            &moved,
            vramctl(&path)
                .args(["ps", "--json", "--cpu-interval", "0"])
                .args(sel),
        ))
    };
    assert_eq!(
        ps(&[]),
        [
            (TRAINER, 6 * GIB, vec![UUID0.to_owned(), UUID1.to_owned()]),
            (STEADY1, 7 * GIB, vec![UUID1.to_owned()]),
            (STEADY0, 3 * GIB, vec![UUID0.to_owned()]),
        ]
    );
    for sel in [&["-i", "0"][..], &["--gpu", PREFIX0]] {
        assert_eq!(
            ps(sel),
            [
                (TRAINER, 2 * GIB, vec![UUID0.to_owned()]),
                (STEADY0, 3 * GIB, vec![UUID0.to_owned()]),
            ],
            "{sel:?}"
        );
    }
    assert_eq!(
        ps(&["--gpu", UUID1]),
        [
            (TRAINER, 4 * GIB, vec![UUID1.to_owned()]),
            (STEADY1, 7 * GIB, vec![UUID1.to_owned()]),
        ]
    );
}

/// `vramctl` on the scenario's running step clock, from [`T0`].
fn stepping(path: &Path) -> assert_cmd::Command {
    let mut cmd = vramctl(path);
    cmd.env_remove("FAKE_NVML_TIME");
    cmd
}

/// `(PID, GPU UUID, verdict)` of every series of a `leaks --json`, sorted.
fn verdicts(report: &Value) -> Vec<(u64, String, String)> {
    let mut v: Vec<_> = report["series"]
        .as_array()
        .expect("series")
        .iter()
        .map(|s| {
            (
                s["pid"].as_u64().expect("pid"),
                s["gpu_uuid"].as_str().expect("uuid").to_owned(),
                s["verdict"].as_str().expect("verdict").to_owned(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_leak_on_one_gpu_of_a_process_on_two_is_judged_on_that_gpu_only_when_recorded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, moved) = scenario(dir.path());
    let db = dir.path().join("history.db");
    let out = stepping(&path)
        .arg("--db")
        .arg(&db)
        .args(["record", "--interval", "1s", "--ticks", "150"])
        .args(["--simulated-clock", &T0.to_string()])
        .output()
        .expect("record runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let leaks = |sel: &[&str]| {
        verdicts(&json_of(
            &moved,
            vramctl(&path)
                .arg("--db")
                .arg(&db)
                .args(["leaks", "--since", "all", "--json"])
                .args(sel),
        ))
    };
    let (u0, u1) = (UUID0.to_owned(), UUID1.to_owned());
    let on0 = vec![
        (TRAINER, u0.clone(), "stable".to_owned()),
        (STEADY0, u0.clone(), "stable".to_owned()),
    ];
    let on1 = vec![
        (TRAINER, u1.clone(), "leak".to_owned()),
        (STEADY1, u1.clone(), "stable".to_owned()),
    ];
    let mut both: Vec<_> = on0.iter().chain(&on1).cloned().collect();
    both.sort();
    assert_eq!(leaks(&[]), both);
    assert_eq!(leaks(&["--gpu", "0"]), on0);
    assert_eq!(leaks(&["--gpu", PREFIX0]), on0);
    assert_eq!(leaks(&["--gpu", "1"]), on1);

    // The history keeps the trainer's two GPUs apart: flat on GPU 0, rising on GPU 1.
    let history = |gpu: &str| {
        json_of(
            &moved,
            vramctl(&path)
                .arg("--db")
                .arg(&db)
                .args(["history", "--since", "all", "--format", "json", "-i", gpu]),
        )
    };
    // GPU 1's last sample: 4 GiB and ~120 steps of 32 MiB (the step clock also counts the
    // recorder's enumeration, so a sample or two either way).
    for (gpu, uuid, first, last) in [
        ("0", UUID0, 2 * GIB, 2 * GIB..=2 * GIB),
        (
            UUID1,
            UUID1,
            4 * GIB,
            4 * GIB + 115 * MIB32..=4 * GIB + 125 * MIB32,
        ),
    ] {
        let h = history(gpu);
        let devices: Vec<&str> = h["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .map(|d| d["uuid"].as_str().expect("uuid"))
            .collect();
        assert_eq!(devices, [uuid], "{gpu}");
        let trainer: Vec<&Value> = h["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .filter(|p| p["pid"] == TRAINER)
            .collect();
        assert_eq!(trainer.len(), 1, "{gpu}: {trainer:?}");
        assert_eq!(trainer[0]["gpu_uuid"], uuid);
        let samples = trainer[0]["samples"].as_array().expect("samples");
        let used = |s: &Value| s["used_bytes"].as_u64().expect("bytes");
        assert_eq!(used(&samples[0]), first, "{gpu}");
        let end = used(samples.last().expect("a sample"));
        assert!(last.contains(&end), "{gpu}: {end} not in {last:?}");
    }
}

#[test]
fn a_leak_on_one_gpu_of_a_process_on_two_is_judged_on_that_gpu_only_live() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, moved) = scenario(dir.path());

    // leaks --watch: the leak event names GPU 1; nothing on GPU 0 becomes a leak.
    let out = stepping(&path)
        .args([
            "leaks",
            "--watch",
            "--json",
            "--interval",
            "1s",
            "--count",
            "150",
        ])
        .args(["--simulated-clock", &T0.to_string()])
        .output()
        .expect("leaks runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let leaks: Vec<(u64, String)> = moved
        .back(&String::from_utf8_lossy(&out.stdout))
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("NDJSON"))
        .filter(|e| e["event"] == "verdict" && e["verdict"] == "leak")
        .map(|e| {
            (
                e["pid"].as_u64().expect("pid"),
                e["gpu_uuid"].as_str().expect("uuid").to_owned(),
            )
        })
        .collect();
    assert_eq!(leaks, [(TRAINER, UUID1.to_owned())]);

    // serve: /api/now keeps the GPUs apart, each with its own figures and verdicts.
    let mut cmd = vramctl_std(&path);
    cmd.env_remove("FAKE_NVML_TIME");
    let served = serve(
        cmd,
        &[
            "--interval",
            "1",
            "--process-details",
            "nvml",
            "--simulated-clock",
            &T0.to_string(),
            "--ticks",
            "150",
        ],
    );
    let now: Value =
        serde_json::from_str(&moved.back(&get(served.addr, "/api/now", &[]).body)).expect("JSON");
    let gpus = now["gpus"].as_array().expect("gpus");
    let seen: Vec<NowGpu<'_>> = gpus
        .iter()
        .map(|g| {
            let procs = g["processes"]
                .as_array()
                .expect("processes")
                .iter()
                .map(|p| {
                    (
                        p["pid"].as_u64().expect("pid"),
                        p["used_bytes"].as_u64().expect("bytes"),
                        p["verdict"].as_str().unwrap_or("-"),
                    )
                })
                .collect();
            (
                g["index"].as_u64().expect("index"),
                g["uuid"].as_str().expect("uuid"),
                procs,
            )
        })
        .collect();
    // The trainer on GPU 1 after ~120 steps (the step clock counts enumerations too).
    let grown = seen[1].2[0].1;
    assert!(
        (4 * GIB + 115 * MIB32..=4 * GIB + 125 * MIB32).contains(&grown),
        "{grown}"
    );
    assert_eq!(
        seen,
        [
            (
                0,
                UUID0,
                vec![(STEADY0, 3 * GIB, "ok"), (TRAINER, 2 * GIB, "ok")]
            ),
            (
                1,
                UUID1,
                vec![(TRAINER, grown, "leak"), (STEADY1, 7 * GIB, "ok")]
            ),
        ]
    );
    for g in gpus {
        let listed: u64 = g["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .map(|p| p["used_bytes"].as_u64().expect("bytes"))
            .sum();
        assert_eq!(g["used_bytes"].as_u64(), Some(listed), "{g}");
    }
    let metrics = moved.back(&get(served.addr, "/metrics", &[]).body);
    for (gpu, uuid, leak) in [("0", UUID0, "0"), ("1", UUID1, "1")] {
        let series =
            format!("vramctl_process_leak{{gpu=\"{gpu}\",uuid=\"{uuid}\",pid=\"{TRAINER}\"");
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&series))
            .unwrap_or_else(|| panic!("{series} in {metrics}"));
        assert!(line.ends_with(&format!(" {leak}")), "{line}");
    }
}

/// A GPU of `/api/now`: its index, UUID and `(PID, bytes, verdict)` per process.
type NowGpu<'a> = (u64, &'a str, Vec<(u64, u64, &'a str)>);

/// The stand-in torch's two devices (python/tests/fakes): their UUIDs, as NVML names them.
const FAKE_TORCH_UUIDS: [&str; 2] = [
    "GPU-8cca1523-521a-59dd-48fa-95c44bc1b100",
    "GPU-8cca1523-521a-59dd-48fa-95c44bc1b101",
];

#[test]
fn the_agents_figures_under_a_selection_are_that_gpus() {
    let mut py = Py::start_with(&[("FAKE_TORCH_DEVICES", "2")]);
    py.exec(
        "import torch, vramctl_agent\n\
         a = torch.empty(1 << 30, dtype=torch.uint8, device='cuda:0')\n\
         b = torch.empty(3 << 30, dtype=torch.uint8, device='cuda:1')\n\
         vramctl_agent.start()",
    );
    let pid = py.pid();
    let mut text = String::new();
    for (uuid, nvml) in FAKE_TORCH_UUIDS.iter().zip(["1.5 GiB", "3.5 GiB"]) {
        text.push_str(&format!(
            "[[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"{uuid}\"\nmemory_total = \"140 GiB\"\n\
             [[gpu.process]]\npid = {pid}\nreal = true\nmemory = \"{nvml}\"\n"
        ));
    }
    let path = py.dir.path().join("scenario.toml");
    std::fs::write(&path, text).expect("scenario");
    let allocated = |report: &Value| -> Vec<u64> {
        report["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .map(|p| {
                p["agent"]["allocated_bytes"]
                    .as_u64()
                    .expect("agent figure")
            })
            .collect()
    };
    let ps = |sel: &[&str]| {
        let out = vramctl_std(&path)
            .args(["ps", "--json", "--cpu-interval", "0"])
            .args(sel)
            .output()
            .expect("ps runs");
        serde_json::from_slice::<Value>(&out.stdout).expect("JSON")
    };
    assert_eq!(allocated(&ps(&[])), [4 * GIB]);
    assert_eq!(allocated(&ps(&["-i", "0"])), [GIB]);
    assert_eq!(allocated(&ps(&["--gpu", FAKE_TORCH_UUIDS[1]])), [3 * GIB]);
    // status says the same per GPU, selected or not.
    let out = vramctl_std(&path)
        .args(["status", "--json", "-i", "1"])
        .output()
        .expect("status runs");
    let status: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        status["devices"][0]["processes"][0]["agent"]["allocated_bytes"],
        3 * GIB
    );
}

#[test]
fn top_under_a_selection_shows_that_gpu_and_its_rows_only() {
    if crate::top::skip_without_tmux() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, moved) = scenario(dir.path());
    let text = std::fs::read_to_string(path).expect("scenario");
    for (sel, gpu, rows) in [
        ("-i 1", "1", [(STEADY1, "7.0G"), (TRAINER, "4.0G")]),
        (
            &*format!("--gpu {PREFIX0}"),
            "0",
            [(STEADY0, "3.0G"), (TRAINER, "2.0G")],
        ),
    ] {
        let sub = tempfile::tempdir_in(dir.path()).expect("tempdir");
        let runtime = crate::harness::private_runtime_dir();
        let tmux = crate::top::launch_env(
            sub.path(),
            &text,
            &format!("VRAMCTL_RUNTIME_DIR='{}'", runtime.display()),
            &format!("top --interval 0.2 {sel}"),
        );
        let screen =
            moved.back(&tmux.wait_for("the table", |s| crate::top::table_rows(s).len() == 2));
        let shown: Vec<(u64, String, String)> = crate::top::table_rows(&screen)
            .into_iter()
            .map(|(pid, line)| {
                let cells: Vec<&str> = line.split_whitespace().collect();
                (u64::from(pid), cells[2].to_owned(), cells[3].to_owned())
            })
            .collect();
        let want: Vec<(u64, String, String)> = rows
            .iter()
            .map(|(pid, mem)| (*pid, gpu.to_owned(), (*mem).to_owned()))
            .collect();
        assert_eq!(shown, want, "{sel}: {screen}");
        let gpu_lines: Vec<&str> = screen.lines().filter(|l| l.starts_with("GPU ")).collect();
        assert_eq!(gpu_lines.len(), 1, "{sel}: {screen}");
        assert!(
            gpu_lines[0].starts_with(&format!("GPU {gpu} ")),
            "{sel}: {screen}"
        );
        tmux.keys(&["q"]);
        tmux.wait_for("top to exit", |s| s.contains("vramctl exited 0"));
    }
}
