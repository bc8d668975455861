//! `vramctl serve`'s web view: its HTTP contract (read-only, CSP, the event stream and its
//! replay, bounded streams), and the page itself in a real headless Chromium driven over
//! the DevTools protocol by `scripts/web-test/cdp_check.py` (standard-library Python; the
//! browser is Debian's `chromium`, which `scripts/test.sh` installs). The GPUs are the fake
//! NVML's (the one test double: no GPU here); the history is the real H200 recording of
//! `examples/`.
//!
//! The browser test fails when Chromium is missing under `VRAMCTL_TEST_STRICT=1` (CI), and
//! says it skipped otherwise. Its screenshots go to `target/web-screenshots/`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::harness::{scenario, vramctl_std};
use crate::serve::{Served, get, serve};

/// The H200 recording's bounds (examples/README.md: 23:38:06 to 23:47:05 UTC, 2026-11-29).
const H200_FROM_MS: i64 = 1_795_995_480_000;
const H200_TO_MS: i64 = 1_795_996_026_000;
const H200_UUID: &str = "GPU-8cca1523-521a-59dd-48fa-95c44bc1b127";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A command line that is markup: shown as text, it is harmless; parsed as HTML, its
/// handlers would set `window.pwned` (and the CSP would refuse them anyway).
const HOSTILE: &str =
    r#"python w.py <img src=x onerror="window.pwned=1"><b>bold</b><script>window.pwned=2</script>"#;

/// `serve` on the fake H200 scenario (one process's name made [`HOSTILE`]; the fake's
/// PIDs are not alive here, so the driver's name is the command), recording into a copy of
/// the example history (raw samples kept, so the recording is not downsampled on open).
fn serve_with_history(dir: &Path) -> Served {
    let db = dir.join("history.db");
    std::fs::copy(repo_root().join("examples/h200-recording.db"), &db).expect("copy the example");
    let text = std::fs::read_to_string(scenario("h200-training.toml")).expect("the scenario");
    let hostile = text.replacen(
        r#"name = "python leaky_worker.py""#,
        &format!("name = '{HOSTILE}'"),
        1,
    );
    assert_ne!(hostile, text, "the scenario names leaky_worker.py");
    let path = dir.join("scenario.toml");
    std::fs::write(&path, hostile).expect("write the scenario");
    serve(
        vramctl_std(&path),
        &[
            "--interval",
            "1s",
            "--record",
            db.to_str().expect("utf-8 path"),
            "--retain",
            "raw=3650d",
        ],
    )
}

fn json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let response = get(addr, path, &[]);
    assert_eq!(response.status, 200, "{path}: {}", response.body);
    serde_json::from_str(&response.body).expect("JSON")
}

#[test]
fn the_page_and_its_assets_are_read_only_and_under_a_strict_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let served = serve_with_history(dir.path());
    let page = get(served.addr, "/", &[]);
    assert_eq!(page.status, 200);
    assert!(
        page.headers
            .contains("content-type: text/html; charset=utf-8")
    );
    assert!(
        page.headers
            .contains("content-security-policy: default-src 'self'; script-src 'self';"),
        "{}",
        page.headers
    );
    assert!(page.headers.contains("x-content-type-options: nosniff"));
    assert!(!page.body.contains("<script>"), "no inline script");
    for asset in [
        "/assets/uPlot.iife.min.js",
        "/assets/app.js",
        "/assets/live.js",
    ] {
        let response = get(served.addr, asset, &[]);
        assert_eq!(response.status, 200, "{asset}");
        assert!(response.headers.contains("content-type: text/javascript"));
        assert!(response.headers.contains("etag: \""));
    }
    let css = get(served.addr, "/assets/app.css", &[]);
    assert!(css.headers.contains("content-type: text/css"));
    assert_eq!(get(served.addr, "/assets/../Cargo.toml", &[]).status, 404);
    assert_eq!(get(served.addr, "/api/nothing", &[]).status, 404);
    // Hostile parameters: a clear 400, never a panic or a raw dump.
    let bad = get(served.addr, "/api/history?from=yesterday", &[]);
    assert_eq!(bad.status, 400);
    assert!(
        bad.body.contains("'from' must be a whole number"),
        "{}",
        bad.body
    );
    assert_eq!(
        get(served.addr, "/api/history?from=5&to=1", &[]).status,
        400
    );
    assert_eq!(get(served.addr, "/api/process", &[]).status, 400);
    // No write actions: anything but GET and HEAD is refused before any route.
    let mut stream = TcpStream::connect(served.addr).expect("connect");
    stream
        .write_all(
            b"POST /api/now HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read");
    assert!(raw.starts_with("HTTP/1.1 405"), "{raw}");

    // The history, downsampled on the server: the H200 recording in 100 buckets, each
    // with the lowest and highest used memory, never the 1 000+ raw samples.
    let history = json(
        served.addr,
        &format!("/api/history?gpu={H200_UUID}&from={H200_FROM_MS}&to={H200_TO_MS}&points=100"),
    );
    assert_eq!(history["t"].as_array().map(Vec::len), Some(100));
    let gpu = &history["gpus"][0];
    assert_eq!(gpu["uuid"], H200_UUID);
    let max = gpu["used_max"].as_array().expect("used_max");
    let min = gpu["used_min"].as_array().expect("used_min");
    assert_eq!(max.len(), 100);
    let pairs: Vec<(u64, u64)> = min
        .iter()
        .zip(max)
        .filter_map(|(lo, hi)| Some((lo.as_u64()?, hi.as_u64()?)))
        .collect();
    assert!(pairs.len() > 50, "{pairs:?}");
    assert!(pairs.iter().all(|(lo, hi)| lo <= hi));
    assert!(
        pairs.iter().any(|(lo, hi)| lo < hi),
        "a bucket of varying memory keeps both ends"
    );
    let pids: Vec<u64> = gpu["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(|p| p["pid"].as_u64())
        .collect();
    for pid in [679, 680, 681, 684] {
        assert!(pids.contains(&pid), "{pids:?}");
    }
    // Leak onsets of the recording (the history's leak scan), as `leaks` finds them.
    let marks = json(
        served.addr,
        &format!("/api/marks?from={H200_FROM_MS}&to={H200_TO_MS}"),
    );
    let mut onset_pids: Vec<u64> = marks["onsets"]
        .as_array()
        .expect("onsets")
        .iter()
        .filter(|o| o["gpu"] == H200_UUID)
        .filter_map(|o| o["pid"].as_u64())
        .collect();
    onset_pids.sort_unstable();
    assert_eq!(onset_pids, [679, 680, 681]);
}

/// Reads SSE events from `reader` until `n` ids have come; returns them.
fn event_ids(reader: &mut impl BufRead, n: usize) -> Vec<u64> {
    let mut ids = Vec::new();
    let mut line = String::new();
    while ids.len() < n {
        line.clear();
        if reader.read_line(&mut line).expect("read the stream") == 0 {
            break;
        }
        if let Some(id) = line.trim_end().strip_prefix("id: ") {
            ids.push(id.parse().expect("a numeric id"));
        }
    }
    ids
}

fn open_stream(addr: SocketAddr, last_event_id: Option<u64>) -> BufReader<TcpStream> {
    let stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut request =
        "GET /api/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n".to_owned();
    if let Some(id) = last_event_id {
        request.push_str(&format!("Last-Event-ID: {id}\r\n"));
    }
    request.push_str("\r\n");
    (&stream).write_all(request.as_bytes()).expect("send");
    BufReader::new(stream)
}

fn status_line(reader: &mut impl BufRead) -> String {
    let mut line = String::new();
    reader.read_line(&mut line).expect("status line");
    line
}

#[test]
fn the_event_stream_pushes_each_tick_replays_what_a_reconnect_missed_and_is_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let served = serve_with_history(dir.path());
    let mut stream = open_stream(served.addr, None);
    assert!(status_line(&mut stream).starts_with("HTTP/1.1 200"));
    // The latest tick at once, then one per tick, in order.
    let ids = event_ids(&mut stream, 3);
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
    // A browser reconnecting with Last-Event-ID gets the ticks after it first.
    let last = ids[2];
    let mut again = open_stream(served.addr, Some(last - 2));
    assert!(status_line(&mut again).starts_with("HTTP/1.1 200"));
    let replayed = event_ids(&mut again, 3);
    assert_eq!(replayed, [last - 1, last, last + 1]);
    // At most 16 streams: the 17th is told to come back later, not queued.
    let mut open = vec![stream, again];
    while open.len() < 16 {
        let mut s = open_stream(served.addr, None);
        assert!(status_line(&mut s).starts_with("HTTP/1.1 200"));
        open.push(s);
    }
    let mut refused = open_stream(served.addr, None);
    assert!(status_line(&mut refused).starts_with("HTTP/1.1 503"));
    drop(open);
}

pub(crate) fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

#[test]
fn in_chromium_the_page_shows_the_gpus_processes_history_and_live_ticks() {
    if chromium().is_none() {
        assert!(
            std::env::var("VRAMCTL_TEST_STRICT").as_deref() != Ok("1"),
            "chromium is missing and VRAMCTL_TEST_STRICT=1 (apt-get install chromium; scripts/test.sh does)"
        );
        eprintln!("skipped: the browser test needs Debian's chromium");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let served = serve_with_history(dir.path());
    let report_path = dir.path().join("report.json");
    let shots = repo_root().join("target/web-screenshots");
    let output = Command::new("python3")
        .arg(repo_root().join("scripts/web-test/cdp_check.py"))
        .args(["--url", &format!("http://{}/", served.addr)])
        .arg("--out")
        .arg(&shots)
        .arg("--report")
        .arg(&report_path)
        .args(["--history-range", &format!("{H200_FROM_MS},{H200_TO_MS}")])
        .args(["--zoom-gpu", H200_UUID])
        .output()
        .expect("run python3");
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&report_path)
            .unwrap_or_else(|_| panic!("no report: {}", String::from_utf8_lossy(&output.stderr))),
    )
    .expect("a JSON report");
    assert_eq!(report["ok"], true, "{report:#}");

    // Nothing left loopback: every request the page made went to this server.
    let origin = format!("http://{}/", served.addr);
    for url in report["requests"].as_array().expect("requests") {
        let url = url.as_str().expect("a URL");
        assert!(
            url.starts_with(&origin) || url == "about:blank",
            "a request left the server: {url}"
        );
    }
    // No script error, no CSP violation, no failed load.
    assert_eq!(report["console"], serde_json::json!([]), "{report:#}");

    // The page's table is the server's latest tick: same GPU, same processes, same
    // commands (as text).
    let now = &report["now"];
    let tables = report["tables"].as_array().expect("tables");
    let live_uuid = now["gpus"][0]["uuid"].as_str().expect("a GPU");
    let table = tables
        .iter()
        .find(|t| t["uuid"] == live_uuid)
        .expect("the live GPU's table");
    let rows = table["rows"].as_array().expect("rows");
    let expected = now["gpus"][0]["processes"].as_array().expect("processes");
    assert_eq!(rows.len(), expected.len());
    for process in expected {
        let pid = process["pid"].to_string();
        let row = rows
            .iter()
            .find(|r| r[0] == pid.as_str())
            .unwrap_or_else(|| panic!("PID {pid} is not in the table: {rows:?}"));
        assert_eq!(row[2], process["command"], "{row:?}");
    }
    assert_eq!(table["html_in_cells"], 0, "cells hold text only");
    assert!(
        rows.iter().any(|r| r[2] == HOSTILE),
        "the hostile command is shown as the text it is: {rows:?}"
    );
    assert_eq!(report["pwned"], "undefined", "markup in a command line ran");
    assert!(
        report["requests"]
            .as_array()
            .expect("requests")
            .iter()
            .all(|u| !u.as_str().unwrap_or("").ends_with("/x")),
        "markup in a command line loaded an image"
    );

    // A live tick arrived over the stream.
    let live = &report["live"];
    assert!(
        live["seq_after"].as_u64() > live["seq_before"].as_u64(),
        "{live}"
    );

    // The whole history holds the H200 recording's processes.
    let all = report["all"].as_array().expect("charts");
    let h200 = all
        .iter()
        .find(|c| c["uuid"] == H200_UUID)
        .expect("the recorded H200's chart");
    for pid in [678, 679, 680, 681, 682, 683, 684] {
        assert!(
            h200["pids"].as_array().expect("pids").contains(&pid.into()),
            "{h200}"
        );
    }

    // Zoom: 5 minutes spans 5 minutes; a drag zooms into less and asks the server again.
    let five = &report["five_min"][0]["scale"];
    let span = five[1].as_f64().expect("to") - five[0].as_f64().expect("from");
    assert!((290.0..=310.0).contains(&span), "{five}");
    let zoomed = &report["zoomed"][0]["scale"];
    let zoomed_span = zoomed[1].as_f64().expect("to") - zoomed[0].as_f64().expect("from");
    assert!(zoomed_span < span * 0.5, "{zoomed} after {five}");
    let asked = report["zoom_requests"].as_array().expect("requests");
    assert_eq!(asked.len(), 1, "one drag, one request: {asked:?}");

    // A link to the recording's range draws its curves and marks its three leak onsets.
    let recorded = &report["recorded"];
    let chart = recorded["charts"]
        .as_array()
        .expect("charts")
        .iter()
        .find(|c| c["uuid"] == H200_UUID)
        .expect("the H200's chart");
    assert!(chart["points"].as_u64() > Some(100), "{chart}");
    let history = json(
        served.addr,
        &format!("/api/history?gpu={H200_UUID}&from={H200_FROM_MS}&to={H200_TO_MS}&points=2000"),
    );
    let peak = history["gpus"][0]["used_max"]
        .as_array()
        .expect("used_max")
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .max();
    assert_eq!(
        chart["peak"].as_u64(),
        peak,
        "the chart's peak is the recording's"
    );
    assert!(recorded["marks"].as_u64() >= Some(3), "{recorded}");
    // Dragging across the recording's chart zooms into the recorded detail: a third of the
    // span, asked of the server once, with the processes of that stretch.
    let zoomed = report["recorded_zoomed"]
        .as_array()
        .expect("charts")
        .iter()
        .find(|c| c["uuid"] == H200_UUID)
        .expect("the H200's chart");
    let scale = |c: &serde_json::Value| {
        c["scale"][1].as_f64().expect("to") - c["scale"][0].as_f64().expect("from")
    };
    assert!(scale(zoomed) < scale(chart) * 0.5, "{zoomed} in {chart}");
    assert!(zoomed["points"].as_u64() > Some(100), "{zoomed}");
    assert!(
        zoomed["pids"].as_array().expect("pids").len() >= 7,
        "{zoomed}"
    );
    assert_eq!(
        report["recorded_zoom_requests"].as_array().map(Vec::len),
        Some(1),
        "{report:#}"
    );

    // A process's detail draws its own curve and takes the focus.
    assert!(report["detail"]["points"].as_u64() > Some(0));
    assert_eq!(report["detail"]["focused"], "detail-title");

    // Keyboard: the mode tab and the zoom buttons are reached with Tab.
    let focus: Vec<&str> = report["focus_order"]
        .as_array()
        .expect("focus")
        .iter()
        .filter_map(serde_json::Value::as_str)
        .collect();
    for control in ["button[tab]:Live", "button:5 min", "button:All"] {
        assert!(focus.contains(&control), "{focus:?}");
    }
    // axe-core finds nothing on the main view.
    assert_eq!(
        report["axe"]["violations"],
        serde_json::json!([]),
        "{:#}",
        report["axe"]
    );
    // Phone width: no sideways scrolling.
    let phone = &report["phone"];
    assert!(
        phone["scroll_width"].as_u64() <= phone["client_width"].as_u64(),
        "{phone}"
    );
    for shot in [
        "live-1280x800.png",
        "live-phone-390.png",
        "live-recorded-range-1280x800.png",
    ] {
        assert!(shots.join(shot).exists(), "{shot}");
    }
}
