//! The agents' allocated and reserved bytes beside NVML's figure in `serve`, `status` and
//! `record`/`history`, against real agent processes (`reclaim::Py`: python3 with the agent
//! and the stand-in torch).

use crate::harness::vramctl_std;
use crate::reclaim::{GIB, Py, one_with_an_agent_one_without, scenario};

/// The value of the sample of `family` whose labels include `pid="PID"`, if any.
fn sample(text: &str, family: &str, pid: u32) -> Option<u64> {
    let needle = format!("pid=\"{pid}\"");
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(&needle))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn serve_exports_allocated_and_reserved_only_for_processes_with_an_agent() {
    let (py, without, scenario) = one_with_an_agent_one_without();
    let served = crate::serve::serve(
        vramctl_std(&scenario),
        &["--interval", "3600", "--peak-window", "3600"],
    );
    let text = crate::serve::get(served.addr, "/metrics", &[]).body;
    assert_eq!(
        sample(&text, "vramctl_process_allocated_bytes", py.pid()),
        Some(GIB),
        "{text}"
    );
    assert_eq!(
        sample(&text, "vramctl_process_reserved_bytes", py.pid()),
        Some(21 * GIB),
        "{text}"
    );
    assert_eq!(
        sample(&text, "vramctl_process_memory_used_bytes", without.pid()),
        Some(GIB),
        "{text}"
    );
    for family in [
        "vramctl_process_allocated_bytes",
        "vramctl_process_reserved_bytes",
    ] {
        assert_eq!(sample(&text, family, without.pid()), None, "{text}");
    }
}

#[test]
fn status_shows_allocated_and_cached_beside_nvml_for_a_process_with_an_agent() {
    let (py, without, scenario) = one_with_an_agent_one_without();
    let output = vramctl_std(&scenario)
        .args(["status", "--json", "--no-daemon"])
        .output()
        .expect("status runs");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let row = |pid: u32| {
        json["devices"][0]["processes"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["pid"] == pid).cloned())
            .unwrap_or_default()
    };
    let with = row(py.pid());
    assert_eq!(with["used_bytes"], 22 * GIB, "{json}");
    assert_eq!(with["agent"]["allocated_bytes"], GIB, "{json}");
    assert_eq!(with["agent"]["cached_bytes"], 20 * GIB, "{json}");
    assert_eq!(with["agent"]["releasable_bytes"], 20 * GIB, "{json}");
    assert!(row(without.pid()).get("agent").is_none(), "{json}");

    let text = vramctl_std(&scenario)
        .args(["status", "--no-daemon"])
        .output()
        .expect("status runs");
    let text = String::from_utf8_lossy(&text.stdout);
    let header = text.lines().find(|l| l.contains("PID")).unwrap_or_default();
    assert!(
        header.contains("MEMORY") && header.contains("ALLOCATED") && header.contains("CACHED"),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&py.pid().to_string()))
        .unwrap_or_default();
    assert!(
        line.contains("1.0 GiB") && line.contains("20.0 GiB"),
        "{text}"
    );
}

#[test]
fn status_without_any_agent_keeps_its_columns() {
    let without = Py::start();
    let scenario = scenario(without.dir.path(), &[(without.pid(), "1 GiB", "1 GiB")]);
    let text = vramctl_std(&scenario)
        .args(["status", "--no-daemon"])
        .output()
        .expect("status runs");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("PID") && !text.contains("ALLOCATED"),
        "{text}"
    );
}

#[test]
fn record_stores_allocated_and_reserved_and_history_and_export_show_them() {
    let (py, without, scenario) = one_with_an_agent_one_without();
    let db = py.dir.path().join("history.db");
    let recorded = vramctl_std(&scenario)
        .arg("--db")
        .arg(&db)
        .args(["record", "--interval", "1s", "--ticks", "3"])
        .args(["--simulated-clock", "1764441091000"])
        .output()
        .expect("record runs");
    assert!(
        recorded.status.success(),
        "{}",
        String::from_utf8_lossy(&recorded.stderr)
    );

    let mut store = vramctl_store::Store::open(&db, vramctl_store::OpenMode::ReadOnly)
        .expect("the history opens");
    let device = store.devices().expect("devices")[0].id;
    let processes = store
        .processes_in(vramctl_store::TimeRange::ALL)
        .expect("processes");
    let id = |pid: u32| {
        processes
            .iter()
            .find(|(p, _)| p.meta.key.pid == pid)
            .map(|(p, _)| p.id)
            .expect("recorded")
    };
    let mut series = |pid: u32, metric| {
        store
            .process_device_metric(id(pid), device, metric, vramctl_store::TimeRange::ALL)
            .expect("series")
            .iter()
            .map(|p| p.last)
            .collect::<Vec<u64>>()
    };
    use vramctl_store::Metric;
    assert_eq!(
        series(py.pid(), Metric::ProcessAllocatedBytes),
        vec![GIB; 3],
        "every tick carries the last answer; the agent was asked once"
    );
    assert_eq!(
        series(py.pid(), Metric::ProcessReservedBytes),
        vec![21 * GIB; 3]
    );
    assert!(series(without.pid(), Metric::ProcessAllocatedBytes).is_empty());
    assert!(series(without.pid(), Metric::ProcessReservedBytes).is_empty());
    drop(store);

    let history = vramctl_std(&scenario)
        .arg("--db")
        .arg(&db)
        .args(["history", "--json", "--since", "2025-11-29T00:00:00Z"])
        .output()
        .expect("history runs");
    let json: serde_json::Value = serde_json::from_slice(&history.stdout).expect("JSON");
    let samples = |pid: u32| {
        json["processes"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["pid"] == pid))
            .map(|p| p["samples"].clone())
            .unwrap_or_default()
    };
    let with = samples(py.pid());
    assert_eq!(with[0]["used_bytes"], 22 * GIB, "{json}");
    assert_eq!(with[0]["allocated_bytes"], GIB, "{json}");
    assert_eq!(with[0]["reserved_bytes"], 21 * GIB, "{json}");
    assert!(
        samples(without.pid())[0].get("allocated_bytes").is_none(),
        "{json}"
    );

    let export = vramctl_std(&scenario)
        .arg("--db")
        .arg(&db)
        .arg("export")
        .output()
        .expect("export runs");
    let text = String::from_utf8_lossy(&export.stdout);
    assert!(
        text.contains("\"metric\":\"process_allocated_bytes\"")
            && text.contains("\"metric\":\"process_reserved_bytes\""),
        "{text}"
    );
}
