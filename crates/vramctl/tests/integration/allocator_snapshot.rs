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
    // The verdict leads (issue 33), then the device.
    assert!(
        stdout.starts_with("oom at event 435 of device 0: shortage — fix: none\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("\ndevice 0: reserved 146.00 MiB, allocated 113.05 MiB"),
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

#[test]
fn snapshot_file_collapsed_stacks_add_up_to_the_live_bytes() {
    let out = tempfile::tempdir().expect("tempdir");
    // snap.pickle: 113.05 MiB active (118_538_752 B, Python's reading in expected.json).
    let (code, stdout, stderr) = snapshot(out.path(), &[&fixture("snap.pickle"), "--collapsed"]);
    assert_eq!(code, 0, "{stderr}");
    let total: u64 = stdout
        .lines()
        .map(|l| {
            let (_, n) = l.rsplit_once(' ').expect("stack and count");
            n.parse::<u64>().expect("a count")
        })
        .sum();
    assert_eq!(total, 118_538_752, "{stdout}");
    assert!(
        !stdout.contains("device 0:"),
        "collapsed replaces the summary"
    );
    let (code, stdout, _) = snapshot(
        out.path(),
        &[&fixture("snapshot-train.pickle"), "--collapsed"],
    );
    assert_eq!(code, 0);
    assert!(
        stdout
            .lines()
            .any(|l| l == "<module> (/tmp/snap.py:10);[torch] 268566528"),
        "root first, [torch] the leaf: {stdout}"
    );
    let (code, _, _) = snapshot(out.path(), &["--pid", "1", "--collapsed"]);
    assert_eq!(code, 2, "--collapsed needs FILE");
}

#[test]
fn snapshot_file_o_svg_draws_a_flame_graph_naming_the_top_stack() {
    let out = tempfile::tempdir().expect("tempdir");
    let (code, stdout, stderr) = snapshot(
        out.path(),
        &[&fixture("snapshot-train.pickle"), "-o", "flame.svg"],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("flame graph of the live bytes by stack written to 'flame.svg'"),
        "{stdout}"
    );
    assert!(
        stdout.starts_with("device 0:"),
        "the summary is printed too"
    );
    let svg = std::fs::read_to_string(out.path().join("flame.svg")).expect("the SVG");
    assert!(
        svg.starts_with("<?xml") || svg.starts_with("<svg"),
        "{svg:.200}"
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    // The top stack (--top 1 --by stack), its frame as XML escapes it, and the title.
    assert!(svg.contains("&lt;module&gt; (/tmp/snap.py:10)"));
    assert!(svg.contains("snapshot-train.pickle: 453.2 MiB live"));
    assert!(svg.contains("268,566,528 bytes"));
}

#[test]
fn snapshot_file_o_must_name_an_svg() {
    let out = tempfile::tempdir().expect("tempdir");
    let (code, stdout, stderr) =
        snapshot(out.path(), &[&fixture("snap.pickle"), "-o", "flame.pickle"]);
    assert_eq!(code, 2, "{stdout}");
    assert!(stderr.contains("'flame.pickle'"), "{stderr}");
    assert!(stderr.contains("ending in .svg"), "{stderr}");
    assert!(!out.path().join("flame.pickle").exists());
}

#[test]
fn snapshot_diff_lists_the_stacks_that_changed_largest_first() {
    let out = tempfile::tempdir().expect("tempdir");
    let (a, b) = (fixture("snap.pickle"), fixture("snapshot-train.pickle"));
    let (code, stdout, stderr) = snapshot(out.path(), &["diff", &a, &b, "--top", "3"]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        "live 113.0 MiB in 28 blocks → 453.2 MiB in 53 blocks (+340.1 MiB); 7 stacks changed"
    );
    assert!(lines[2].contains("appeared") && lines[2].ends_with("<module> (/tmp/snap.py:10)"));
    assert!(lines[2].contains("+256.1 MiB") && lines[2].contains("0 → 32"));
    assert!(lines[4].contains("gone") && lines[4].contains("(/tmp/g.py:6)"));
    assert_eq!(lines[5], "  … 4 more changed stacks (--top N to show them)");

    let (code, stdout, stderr) = snapshot(out.path(), &["diff", &a, &b, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(v["schema"], 1);
    assert_eq!(v["a_live_bytes"], 118_538_752);
    assert_eq!(v["changed_stacks"], 7);
    let rows = v["rows"].as_array().expect("rows");
    let delta: i64 = rows
        .iter()
        .map(|r| r["delta_bytes"].as_i64().expect("delta"))
        .sum();
    assert_eq!(serde_json::json!(delta), v["delta_bytes"]);
    assert_eq!(rows[0]["change"], "appeared");
    for key in ["stack", "a_bytes", "b_bytes", "a_blocks", "b_blocks"] {
        assert!(rows[0].get(key).is_some(), "{key}");
    }
}

#[test]
fn snapshot_diff_of_a_file_against_itself_shows_no_change() {
    let out = tempfile::tempdir().expect("tempdir");
    let (code, stdout, stderr) = snapshot(
        out.path(),
        &["diff", &fixture("snap.pickle"), &fixture("snap.pickle.gz")],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "live 113.0 MiB in 28 blocks → 113.0 MiB in 28 blocks (0 B); 0 stacks changed\n"
    );
    let (code, _, stderr) = snapshot(
        out.path(),
        &["diff", &fixture("snap.pickle"), "missing.pickle"],
    );
    assert_eq!(code, 2);
    assert!(
        stderr.contains("cannot read the snapshot 'missing.pickle'"),
        "{stderr}"
    );
}

fn fixtures_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/h200/snapshots")
}

#[test]
fn snapshot_timeline_at_the_oom_prints_the_state_then() {
    let (code, stdout, stderr) = snapshot(
        &fixtures_dir(),
        &["timeline", "snap.pickle", "--at", "oom", "--top", "4"],
    );
    assert_eq!(code, 0, "{stderr}");
    insta::assert_snapshot!(stdout);
}

#[test]
fn snapshot_timeline_at_the_last_event_is_the_plain_summary() {
    let dir = fixtures_dir();
    for file in ["snapshot-train.pickle", "snapx.pickle"] {
        let (code, plain, _) = snapshot(&dir, &[file]);
        assert_eq!(code, 0);
        let (code, at, stderr) = snapshot(&dir, &["timeline", file, "--at", "-1"]);
        assert_eq!(code, 0, "{stderr}");
        // The summary's device lines (all but the oom and advice lines) appear as they are.
        let device_lines: Vec<&str> = plain
            .lines()
            .skip_while(|l| l.starts_with("oom at ") || l.starts_with("  why: "))
            .take_while(|l| !l.starts_with("oom:"))
            .collect();
        assert!(
            at.contains(&device_lines.join("\n")),
            "{file}:\n{at}\nvs\n{plain}"
        );
    }
}

#[test]
fn snapshot_timeline_json_points_end_at_the_summarys_active_bytes() {
    let dir = fixtures_dir();
    let (_, summary, _) = snapshot(&dir, &["snapshot-train.pickle", "--json"]);
    let summary: serde_json::Value = serde_json::from_str(&summary).expect("json");
    let (code, stdout, stderr) = snapshot(
        &dir,
        &[
            "timeline",
            "snapshot-train.pickle",
            "--json",
            "--top",
            "2",
            "--at",
            "300",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let mut v: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    let d = &v["devices"][0];
    let points = d["points"].as_array().expect("points");
    assert_eq!(points.len(), 1747);
    assert_eq!(
        points[points.len() - 1]["live_bytes"],
        summary["devices"][0]["active_bytes"]
    );
    // The insta snapshot keeps the first and the last three points of the curve.
    let kept: Vec<serde_json::Value> = points[..3]
        .iter()
        .chain(&points[points.len() - 3..])
        .cloned()
        .collect();
    v["devices"][0]["points"] = serde_json::Value::Array(kept);
    insta::assert_json_snapshot!(v);
}

#[test]
fn snapshot_timeline_draws_png_and_svg() {
    let out = tempfile::tempdir().expect("tempdir");
    for name in ["t.png", "t.svg"] {
        let target = out.path().join(name);
        let (code, stdout, stderr) = snapshot(
            out.path(),
            &[
                "timeline",
                &fixture("snapshot-train.pickle"),
                "-o",
                target.to_str().expect("utf-8"),
            ],
        );
        assert_eq!(code, 0, "{stderr}");
        assert!(stdout.contains("timeline written to"), "{stdout}");
        let bytes = std::fs::read(&target).expect("written");
        assert!(bytes.len() > 10_000, "{name}: {} bytes", bytes.len());
        if name.ends_with(".png") {
            assert!(bytes.starts_with(b"\x89PNG"));
        } else {
            assert!(String::from_utf8_lossy(&bytes).contains("<svg"));
        }
    }
    let (code, _, stderr) = snapshot(
        out.path(),
        &["timeline", &fixture("snap.pickle"), "-o", "t.pickle"],
    );
    assert_eq!(code, 2);
    assert!(stderr.contains(".png or .svg"), "{stderr}");
    assert!(!out.path().join("t.pickle").exists());
}

#[test]
fn snapshot_timeline_of_a_file_without_a_trace_is_one_line_exit_2() {
    let out = tempfile::tempdir().expect("tempdir");
    let (code, stdout, stderr) = snapshot(
        out.path(),
        &["timeline", &fixture("segments-only.pickle"), "-o", "t.png"],
    );
    assert_eq!(code, 2);
    assert!(stdout.is_empty());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("has no trace to draw"), "{stderr}");
    let (code, _, stderr) = snapshot(
        out.path(),
        &["timeline", &fixture("snapshot-train.pickle"), "--at", "oom"],
    );
    assert_eq!(code, 2);
    assert!(stderr.contains("has no oom event"), "{stderr}");
}
