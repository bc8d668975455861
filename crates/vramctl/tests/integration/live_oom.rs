//! A running process's out-of-memory errors, live (issue 33): `ps`, `status`, `serve`'s
//! `/api/now`, counter and web page, and `top` show how many OOMs its agent reported and
//! the first one's cause and fix. The process is python3 with the agent and the stand-in
//! torch (`python/tests/fakes`, a test double at the PyTorch boundary: its caching
//! allocator calls the OOM observer as torch's does), which hits OOMs, catches them and
//! keeps running; the fake NVML lists it as a `real` process. The cause is checked against
//! what `vramctl snapshot` says of the snapshot the agent kept (history recorded, so the
//! file holds the allocator's own `oom` event).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{vramctl_on, vramctl_std};
use crate::reclaim::Py;

/// A process that keeps 8 GiB live and asks for 200 GiB twice (more than the H200 has:
/// a shortage), catching both OOMs; and a scenario listing it with 9 GiB.
fn oom_twice() -> (Py, PathBuf) {
    let mut py = Py::start_with(&[("VRAMCTL_OOM_HISTORY", "1")]);
    py.exec(
        "import torch, vramctl_agent\n\
         vramctl_agent.start()\n\
         keep = torch.empty(8 << 30, dtype=torch.uint8, device='cuda')\n\
         for _ in range(2):\n\
         \x20   try:\n\
         \x20       torch.empty(200 << 30, dtype=torch.uint8, device='cuda')\n\
         \x20   except torch.cuda.OutOfMemoryError:\n\
         \x20       pass",
    );
    let scenario = crate::reclaim::scenario(py.dir.path(), &[(py.pid(), "9 GiB", "9 GiB")]);
    (py, scenario)
}

/// The snapshot the agent kept at the first OOM (in its own socket directory).
fn kept_snapshot(dir: &Path, pid: u32) -> PathBuf {
    let name = format!("oom-{pid}.pickle");
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir").flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(path);
            } else if entry.file_name().to_str() == Some(name.as_str()) {
                return path;
            }
        }
    }
    panic!("the agent kept no {name} under {}", dir.display());
}

/// What `vramctl snapshot FILE --json` says of the kept snapshot's (only) OOM.
fn cause_from_the_file(scenario: &Path, file: &Path) -> (String, serde_json::Value) {
    let out = vramctl_std(scenario)
        .arg("snapshot")
        .arg(file)
        .arg("--json")
        .output()
        .expect("vramctl snapshot");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let oom = v["oom"].as_array().expect("an oom list");
    assert_eq!(oom.len(), 1, "{v:#}");
    (
        oom[0]["cause"].as_str().expect("a cause").to_owned(),
        oom[0]["fix"].clone(),
    )
}

fn json_of(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().expect("run vramctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn ps_and_status_show_a_running_process_s_ooms_with_the_kept_snapshot_s_cause() {
    let (py, scenario) = oom_twice();
    let (cause, fix) = cause_from_the_file(&scenario, &kept_snapshot(py.dir.path(), py.pid()));
    assert_eq!(cause, "shortage", "8 GiB live and 200 GiB asked of 141 GiB");

    let ps = json_of(vramctl_std(&scenario).args(["ps", "--json", "--no-daemon"]));
    let process = ps["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == py.pid())
        .unwrap_or_else(|| panic!("listed: {ps:#}"))
        .clone();
    let oom = &process["oom"];
    assert_eq!(oom["count"], 2, "{oom:#}");
    assert_eq!(oom["state"], "classified", "{oom:#}");
    assert_eq!(oom["cause"], cause.as_str());
    assert_eq!(oom["fix"], fix);
    assert!(
        oom["why"].as_str().is_some_and(|w| !w.is_empty()),
        "{oom:#}"
    );
    assert!(oom["seen_at_unix_ms"].is_i64() && oom["oom_at_unix_ms"].is_i64());

    let out = vramctl_std(&scenario)
        .args(["ps", "--no-daemon"])
        .output()
        .expect("vramctl ps");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "PID {} had 2 out-of-memory errors; the first: shortage; fix: none",
            py.pid()
        )),
        "{text}"
    );

    let status = json_of(vramctl_std(&scenario).args(["status", "--json", "--no-daemon"]));
    let listed = &status["devices"][0]["processes"][0];
    assert_eq!(listed["pid"], py.pid());
    assert_eq!(listed["oom"]["cause"], cause.as_str(), "{status:#}");
    assert_eq!(listed["oom"]["count"], 2);
    assert!(
        listed["oom"].get("others_when_seen").is_none(),
        "alone on its GPU"
    );

    // Another process on its GPU: named beside the OOM, with NVML's bytes.
    let other = crate::real_processes::sleeper();
    let dir = tempfile::tempdir().expect("tempdir");
    let shared = crate::reclaim::scenario(
        dir.path(),
        &[
            (py.pid(), "9 GiB", "9 GiB"),
            (other.pid(), "3 GiB", "3 GiB"),
        ],
    );
    let ps = json_of(vramctl_std(&shared).args(["ps", "--json", "--no-daemon"]));
    let oom = ps["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == py.pid())
        .map(|p| p["oom"].clone())
        .expect("listed");
    assert_eq!(
        oom["others_when_seen"],
        serde_json::json!([{"pid": other.pid(), "used_bytes": 3u64 << 30}]),
        "{oom:#}"
    );
    let out = vramctl_std(&shared)
        .args(["status", "--no-daemon"])
        .env("COLUMNS", "200")
        .output()
        .expect("vramctl status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "on its GPU when it was seen: PID {} 3.0 GiB",
            other.pid()
        )),
        "{text}"
    );
}

/// `status`'s table says it too: one note for the process, as `ps` words it, wrapped
/// within the 80 columns `COLUMNS` gives.
#[test]
fn status_text_notes_a_running_process_s_ooms_within_80_columns() {
    let (py, scenario) = oom_twice();
    let out = vramctl_std(&scenario)
        .env("COLUMNS", "80")
        .args(["status", "--no-daemon"])
        .output()
        .expect("vramctl status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        assert!(
            line.chars().count() <= 80,
            "wider than 80: {line:?}\n{text}"
        );
    }
    // The note, joined back from its wrapped lines.
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let note = format!(
        "PID {} had 2 out-of-memory errors; the first: shortage; fix: none",
        py.pid()
    );
    assert_eq!(joined.matches(&note).count(), 1, "{text}");

    // A process without OOMs gets no note.
    let quiet = vramctl_on("h200-training.toml")
        .env("COLUMNS", "80")
        .arg("status")
        .output()
        .expect("vramctl status");
    assert!(
        !String::from_utf8_lossy(&quiet.stdout).contains("out-of-memory"),
        "{}",
        String::from_utf8_lossy(&quiet.stdout)
    );
}

/// `/api/now` until the process's entry has a classified OOM, at most `limit`.
fn api_now_with_cause(addr: std::net::SocketAddr, pid: u32, limit: Duration) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let now: serde_json::Value =
            serde_json::from_str(&crate::serve::get(addr, "/api/now", &[]).body).expect("JSON");
        let entry = now["gpus"][0]["processes"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["pid"] == pid).cloned());
        if let Some(entry) = entry.filter(|e| e["oom"]["state"] == "classified") {
            return entry;
        }
        assert!(started.elapsed() < limit, "no classified OOM in {now:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn serve_s_live_tick_counter_and_page_show_the_cause() {
    let (py, scenario) = oom_twice();
    let (cause, _) = cause_from_the_file(&scenario, &kept_snapshot(py.dir.path(), py.pid()));
    let served = crate::serve::serve(
        vramctl_std(&scenario),
        &["--interval", "0.2", "--process-details", "proc"],
    );
    // The agent is asked at the first tick; its snapshot is read off the sampler's thread.
    let entry = api_now_with_cause(served.addr, py.pid(), Duration::from_secs(20));
    assert_eq!(entry["oom"]["cause"], cause.as_str(), "{entry:#}");
    assert_eq!(entry["oom"]["count"], 2);
    // The counter maps the same observation: the first by its cause, the second unknown.
    let metrics = crate::serve::get(served.addr, "/metrics", &[]).body;
    assert!(
        metrics.contains(&format!("vramctl_oom_total{{cause=\"{cause}\"}} 1")),
        "{metrics}"
    );
    assert!(
        metrics.contains("vramctl_oom_total{cause=\"unknown\"} 1"),
        "{metrics}"
    );

    if crate::web::chromium().is_none() {
        assert!(
            std::env::var("VRAMCTL_TEST_STRICT").as_deref() != Ok("1"),
            "chromium is missing and VRAMCTL_TEST_STRICT=1"
        );
        eprintln!("skipped the page: the browser test needs Debian's chromium");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let report_path = dir.path().join("report.json");
    let root = crate::reclaim::repo();
    let output = Command::new("python3")
        .arg(root.join("scripts/web-test/oom_check.py"))
        .args(["--url", &format!("http://{}/", served.addr)])
        .args(["--pid", &py.pid().to_string()])
        .arg("--out")
        .arg(root.join("target/web-screenshots"))
        .arg("--report")
        .arg(&report_path)
        .output()
        .expect("run python3");
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&report_path)
            .unwrap_or_else(|_| panic!("no report: {}", String::from_utf8_lossy(&output.stderr))),
    )
    .expect("a JSON report");
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(report["console"], serde_json::json!([]), "{report:#}");
    let row = report["row"].as_array().expect("the row's cells");
    assert!(
        row.iter().any(|c| c
            .as_str()
            .is_some_and(|t| t.ends_with(&format!("2 OOMs: {cause}")))),
        "{row:?}"
    );
    assert_eq!(
        report["row_html_in_cells"], 0,
        "cells after the PID hold text only"
    );
    let detail = report["detail"]
        .as_str()
        .expect("the detail's OOM sentence");
    assert!(
        detail.starts_with(&format!("Out of memory: 2 OOMs: {cause} (first at ")),
        "{detail}"
    );
    assert!(
        detail.contains("Fix: none — nothing the process can set avoids it."),
        "{detail}"
    );
}

#[test]
fn top_flags_the_process_and_its_detail_says_the_cause() {
    if crate::top::skip_without_tmux() {
        return;
    }
    let (py, scenario) = oom_twice();
    let dir = tempfile::tempdir().expect("tempdir");
    let text = std::fs::read_to_string(&scenario).expect("scenario");
    let runtime = crate::harness::private_runtime_dir();
    let tmux = crate::top::launch_env(
        dir.path(),
        &text,
        &format!("VRAMCTL_RUNTIME_DIR='{}'", runtime.display()),
        "top --interval 0.2",
    );
    let pid = py.pid().to_string();
    // The row: PID first, the O flag before the command.
    let flagged = |screen: &str| {
        screen.lines().any(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.first() == Some(&pid.as_str()) && words.contains(&"O")
        })
    };
    tmux.wait_for("the O flag", flagged);
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("the cause in the detail pane", |s| {
        s.contains("2 OOMs, first at") && s.contains("shortage")
    });
    assert!(screen.contains("fix      none"), "{screen}");
    tmux.keys(&["q"]);
    drop(py);
}
