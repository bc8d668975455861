//! `explain-oom`: a pasted message explained alone, and with the real H200 history
//! (testdata/h200/recorded-history.ndjson.gz, imported) naming who held the GPU then; bad
//! input is one line and exit 2.

use std::io::Write;
use std::path::{Path, PathBuf};

use std::process::Stdio;

use crate::harness::{scenario, stdout_of, vramctl, vramctl_std};

/// The case, in PyTorch's format (`set_per_process_memory_fraction`'s "allowed").
const LIMITED: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 127.29 GiB is free. Including non-PyTorch memory, this process has 12.52 GiB memory in use. 16.00 GiB allowed; Of the allocated memory 12.00 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.";

/// A full GPU on which others hold memory: the message names no other process.
const FULL: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 140.40 GiB of which 1.00 GiB is free. Of the allocated memory 2.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated.";

/// The real recorded H200 history (seven workloads), decompressed into `dir`.
fn history(dir: &Path) -> PathBuf {
    crate::leaks::gunzip_testdata("recorded-history.ndjson.gz", dir, "history.ndjson")
}

#[test]
fn a_message_alone_gets_the_cause_it_supports_and_never_the_devices_free_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = vramctl(&scenario("h200-idle.toml"));
    cmd.env("XDG_STATE_HOME", dir.path())
        .args(["explain-oom", LIMITED]);
    let out = stdout_of(&mut cmd);
    insta::assert_snapshot!(out);
    assert!(out.starts_with("pytorch: process-limit"), "{out}");
    assert!(!out.contains("expandable_segments"), "{out}");
}

#[test]
fn with_the_history_the_holders_at_that_time_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("history.db");
    let mut import = vramctl(&scenario("h200-idle.toml"));
    import
        .arg("--db")
        .arg(&db)
        .args(["import"])
        .arg(history(dir.path()));
    stdout_of(&mut import);
    let mut cmd = vramctl(&scenario("h200-idle.toml"));
    cmd.args([
        "explain-oom",
        FULL,
        "--json",
        "--tz",
        "UTC",
        "--at",
        "2026-11-29T23:40:00Z",
        "--history",
    ])
    .arg(&db);
    let v: serde_json::Value = serde_json::from_str(&stdout_of(&mut cmd)).expect("json");
    let holders = v["held_then"]["holders"].as_array().expect("holders");
    let commands: Vec<&str> = holders
        .iter()
        .filter_map(|h| h["command"].as_str())
        .collect();
    assert!(
        commands.contains(&"python3 leak_staircase.py"),
        "{commands:?}"
    );
    assert_eq!(v["held_then"]["device_total_bytes"], 150_754_820_096_u64);
    assert!(v["held_then"]["at_unix_ms"].as_i64().expect("at") <= 1_795_995_600_000);
    assert_eq!(v["cause"], "other-process", "{v}");
    assert!(v["fix"].as_str().expect("fix").contains("PID "), "{v}");
}

#[test]
fn stdin_is_read_and_what_is_no_message_is_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |input: &[u8], args: &[&str]| {
        let mut child = vramctl_std(&scenario("h200-idle.toml"))
            .env("XDG_STATE_HOME", dir.path())
            .arg("explain-oom")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // A closed pipe is fine: an over-long input is refused before it is all read.
        let _ = child.stdin.take().expect("stdin").write_all(input);
        child.wait_with_output().expect("output")
    };
    let ok = run(LIMITED.as_bytes(), &[]);
    assert!(ok.status.success());
    let bad = run(b"\x1b[31mnot an oom\x07", &[]);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no out-of-memory message found"), "{err}");
    let huge = vec![b'a'; 300 * 1024];
    let long = run(&huge, &[]);
    assert_eq!(long.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&long.stderr).contains("longer than 256 KiB"));
    let missing = run(
        LIMITED.as_bytes(),
        &["--history", "/nonexistent/history.db"],
    );
    assert_eq!(missing.status.code(), Some(2));
}
