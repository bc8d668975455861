//! `vramctl snapshot` against real agent processes (`python/tests/target.py` with the
//! stand-in torch, whose `torch.cuda.memory._snapshot()` and `_record_memory_history` model
//! PyTorch's): where the file goes, what is refused, the exit codes.

use std::path::Path;

use crate::harness::vramctl_std;
use crate::reclaim::{GIB, Py};

/// `vramctl snapshot ARGS` (no NVML needed): (exit code, stdout, stderr).
fn snapshot(cwd: &Path, args: &[&str]) -> (i32, String, String) {
    let output = vramctl_std(Path::new("/nonexistent"))
        .current_dir(cwd)
        .arg("snapshot")
        .args(args)
        .output()
        .expect("vramctl runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn snapshot_is_written_where_the_caller_names_and_never_over_an_existing_file() {
    let py = Py::agent(2 * GIB, GIB);
    let pid = py.pid().to_string();
    let out = tempfile::tempdir().expect("tempdir");
    // Relative to the caller's working directory, not the process's.
    let (code, stdout, stderr) = snapshot(out.path(), &["--pid", &pid, "-o", "snap.pickle"]);
    assert_eq!(code, 0, "{stderr}");
    let file = out.path().join("snap.pickle");
    let size = std::fs::metadata(&file).expect("written").len();
    assert!(size > 0);
    assert!(
        stdout.contains(&format!("written to '{}'", file.display())),
        "{stdout}"
    );
    assert!(stdout.contains("segment"), "{stdout}");
    let before = std::fs::read(&file).expect("read");

    let (code, _, stderr) = snapshot(out.path(), &["--pid", &pid, "-o", "snap.pickle"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("exists"), "{stderr}");
    assert_eq!(
        std::fs::read(&file).expect("read"),
        before,
        "never replaced"
    );
}

#[test]
fn snapshot_json_says_where_the_file_is_and_its_size() {
    let py = Py::agent(GIB, GIB);
    let out = tempfile::tempdir().expect("tempdir");
    let file = out.path().join("s.pickle");
    let (code, stdout, stderr) = snapshot(
        out.path(),
        &[
            "--pid",
            &py.pid().to_string(),
            "-o",
            &file.display().to_string(),
            "--json",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["schema"], 1);
    assert_eq!(json["pid"], py.pid());
    assert_eq!(json["written"]["path"], file.display().to_string());
    assert_eq!(json["local_path"], file.display().to_string());
    assert_eq!(
        json["written"]["size_bytes"],
        std::fs::metadata(&file).expect("written").len()
    );
    assert_eq!(json["history"]["recording"], false);
}

#[test]
fn record_start_bounds_the_history_and_a_snapshot_with_stop_keeps_it() {
    let mut py = Py::agent(0, GIB);
    let pid = py.pid().to_string();
    let out = tempfile::tempdir().expect("tempdir");
    let (code, stdout, stderr) = snapshot(
        out.path(),
        &[
            "--pid",
            &pid,
            "--record",
            "start",
            "--max-entries",
            "50",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["written"], serde_json::Value::Null);
    assert_eq!(json["history"]["recording"], true);
    assert_eq!(json["history"]["max_entries"], 50);
    py.exec("for _ in range(100):\n    y = torch.empty(1 << 20, dtype=torch.uint8, device='cuda'); del y");
    let (code, stdout, stderr) = snapshot(
        out.path(),
        &[
            "--pid", &pid, "-o", "h.pickle", "--record", "stop", "--json",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["written"]["trace_entries"], 50, "{json}");
    assert_eq!(json["history"]["recording"], false);
}

#[test]
fn a_process_without_an_agent_is_exit_1_with_how_to_start_one() {
    let py = Py::start();
    let out = tempfile::tempdir().expect("tempdir");
    let (code, _, stderr) = snapshot(
        out.path(),
        &["--pid", &py.pid().to_string(), "-o", "x.pickle"],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("has no vramctl agent"), "{stderr}");
    assert!(stderr.contains("vramctl_agent.start()"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!out.path().join("x.pickle").exists());
}

#[test]
fn a_process_whose_cuda_has_not_started_has_nothing_to_snapshot() {
    let mut py = Py::start();
    py.exec("import torch, vramctl_agent\nvramctl_agent.start()");
    let out = tempfile::tempdir().expect("tempdir");
    let (code, _, stderr) = snapshot(
        out.path(),
        &["--pid", &py.pid().to_string(), "-o", "x.pickle"],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("has nothing to snapshot"), "{stderr}");
}

#[test]
fn a_missing_directory_and_a_missing_process_are_exit_2() {
    let out = tempfile::tempdir().expect("tempdir");
    let py = Py::agent(GIB, 0);
    let (code, _, stderr) = snapshot(
        out.path(),
        &["--pid", &py.pid().to_string(), "-o", "no/such/dir/x.pickle"],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is not a directory"), "{stderr}");
    let (code, _, stderr) = snapshot(out.path(), &["--pid", "999999999", "-o", "x.pickle"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("no process with PID '999999999'"),
        "{stderr}"
    );
}

#[test]
fn snapshot_without_output_or_record_is_a_usage_error() {
    let out = tempfile::tempdir().expect("tempdir");
    let (code, _, _) = snapshot(out.path(), &["--pid", "1"]);
    assert_eq!(code, 2);
}

fn fixture(name: &str) -> String {
    format!(
        "{}/../../testdata/h200/snapshots/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn snapshot_file_prints_the_summary_of_an_h200_snapshot() {
    let out = tempfile::tempdir().expect("tempdir");
    let (code, stdout, stderr) = snapshot(out.path(), &[&fixture("snap.pickle")]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.starts_with("device 0: reserved 146.00 MiB, allocated 113.05 MiB"),
        "{stdout}"
    );
    assert!(stdout.contains("fragmentation 0.575"), "{stdout}");
    assert!(stdout.contains("oom: device 0 event 435"), "{stdout}");
}

#[test]
fn snapshot_file_json_has_the_documented_keys() {
    let out = tempfile::tempdir().expect("tempdir");
    let (code, stdout, stderr) = snapshot(out.path(), &[&fixture("snap.pickle.gz"), "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(v["schema"], 1);
    assert_eq!(v["format"], "snapshot");
    let d = &v["devices"][0];
    assert_eq!(d["device"], 0);
    assert_eq!(d["reserved_bytes"], 153_092_096);
    assert_eq!(d["allocated_bytes"], 118_538_752);
    for key in [
        "active_bytes",
        "requested_bytes",
        "inactive_split_bytes",
        "segments",
        "largest_free_block_bytes",
        "fragmentation",
    ] {
        assert!(d.get(key).is_some(), "{key}");
    }
    assert_eq!(v["oom"][0]["requested_bytes"], 1_u64 << 40);
}

#[test]
fn snapshot_file_that_needs_code_run_is_refused_with_exit_2() {
    let out = tempfile::tempdir().expect("tempdir");
    let evil = out.path().join("evil.pickle");
    std::fs::write(&evil, b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.").expect("write");
    let (code, stdout, stderr) = snapshot(out.path(), &["evil.pickle"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("'os.system'"), "{stderr}");
    assert!(stderr.contains("is not allowed"), "{stderr}");
    let (code, _, stderr) = snapshot(out.path(), &["missing.pickle"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot open 'missing.pickle'"), "{stderr}");
}

#[test]
fn snapshot_file_and_pid_together_are_a_usage_error() {
    let out = tempfile::tempdir().expect("tempdir");
    let (code, _, stderr) = snapshot(out.path(), &[&fixture("snap.pickle"), "--pid", "1"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

#[test]
fn snapshot_file_top_lists_live_bytes_by_user_frame() {
    let out = tempfile::tempdir().expect("tempdir");
    let (code, stdout, stderr) = snapshot(
        out.path(),
        &[
            &fixture("snapshot-train.pickle"),
            "--top",
            "2",
            "--by",
            "frame",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("top 2 by frame (of 453.2 MiB live):"),
        "{stdout}"
    );
    assert!(stdout.contains("<module> (/tmp/snap.py:10)"), "{stdout}");
    let (code, _, _) = snapshot(out.path(), &["--pid", "1", "--top", "3"]);
    assert_eq!(code, 2, "--top needs FILE");
}
