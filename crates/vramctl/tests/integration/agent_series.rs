//! The agents' allocated and reserved bytes beside NVML's figure in `serve`, `status` and
//! `record`/`history`, against real agent processes (`reclaim::Py`: python3 with the agent
//! and the stand-in torch).

use crate::harness::vramctl_std;
use crate::reclaim::{Py, scenario};

const GIB: u64 = 1 << 30;

/// The value of the sample of `family` whose labels include `pid="PID"`, if any.
fn sample(text: &str, family: &str, pid: u32) -> Option<u64> {
    let needle = format!("pid=\"{pid}\"");
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(&needle))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn serve_exports_allocated_and_reserved_only_for_processes_with_an_agent() {
    let py = Py::agent(20 * GIB, GIB);
    let without = Py::start();
    let scenario = scenario(
        py.dir.path(),
        &[
            (py.pid(), "22 GiB", "22 GiB"),
            (without.pid(), "1 GiB", "1 GiB"),
        ],
    );
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
