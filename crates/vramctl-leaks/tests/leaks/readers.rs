//! Readers that turn recordings into labeled traces (harness code, not core's API):
//! - the H200 fixture (`trace-hold-leak-steady.json`: `roles` and a 10 Hz `trace`);
//! - `vramctl status --json --watch 0.1` NDJSON (schema 1) plus the workloads'
//!   `labels.jsonl` (`{"t": unix_s, "pid": N, "role": "...", "event": "start" |
//!   "leak_start" | "idle_start" | "end"}`), and optionally `cpu.jsonl` (`{"t": unix_s,
//!   "pid": N, "cpu_time_ms": N}`, from `scripts/record-leak-traces.sh`).
#![allow(dead_code)]

use std::collections::BTreeMap;

use serde::Deserialize;
use vramctl_leaks::analysis::{CpuSample, DeviceActivitySample, Sample};

use super::labeled::{Label, LabeledSeries, LabeledTrace};

/// One line of `labels.jsonl`.
#[derive(Debug, Clone, Deserialize)]
pub struct LabelEvent {
    pub t: f64,
    pub pid: u32,
    pub role: String,
    pub event: String,
}

pub fn parse_labels(text: &str) -> Result<Vec<LabelEvent>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("labels line {}: {e}", i + 1)))
        .collect()
}

fn secs_to_ms(t: f64) -> i64 {
    (t * 1000.0).round() as i64
}

/// Label, role and start of one PID from its label events.
fn label_for(pid: u32, events: &[LabelEvent]) -> (String, Label, Option<i64>) {
    let mine: Vec<&LabelEvent> = events.iter().filter(|e| e.pid == pid).collect();
    let role = mine
        .first()
        .map_or_else(|| "unlabeled".to_owned(), |e| e.role.clone());
    let at = |name: &str| {
        mine.iter()
            .find(|e| e.event == name)
            .map(|e| secs_to_ms(e.t))
    };
    let label = if let Some(t) = at("leak_start") {
        Label::Leak {
            leak_start_unix_ms: t,
        }
    } else if let Some(t) = at("idle_start") {
        Label::Idle {
            idle_start_unix_ms: t,
        }
    } else {
        Label::NotLeak
    };
    (role, label, at("start"))
}

#[derive(Debug, Deserialize)]
struct CpuLine {
    t: f64,
    pid: u32,
    cpu_time_ms: u64,
}

/// `cpu.jsonl` → CPU samples per PID.
pub fn parse_cpu(text: &str) -> Result<BTreeMap<u32, Vec<CpuSample>>, String> {
    let mut per_pid: BTreeMap<u32, Vec<CpuSample>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let c: CpuLine =
            serde_json::from_str(line).map_err(|e| format!("cpu line {}: {e}", i + 1))?;
        per_pid.entry(c.pid).or_default().push(CpuSample {
            t_unix_ms: secs_to_ms(c.t),
            cpu_time_ms: c.cpu_time_ms,
        });
    }
    Ok(per_pid)
}

#[derive(Debug, Deserialize)]
struct Fixture {
    roles: BTreeMap<String, u32>,
    trace: Vec<FixtureSample>,
}

#[derive(Debug, Deserialize)]
struct FixtureSample {
    t: f64,
    free: u64,
    total: u64,
    util_gpu: u32,
    procs: Vec<(u32, u64)>,
}

/// The H200 fixture with its labels; `t` of both is seconds from `base_unix_ms`.
pub fn read_fixture(json: &str, labels: &str, base_unix_ms: i64) -> Result<LabeledTrace, String> {
    let fixture: Fixture = serde_json::from_str(json).map_err(|e| format!("fixture: {e}"))?;
    let mut events = parse_labels(labels)?;
    for e in &mut events {
        e.t += base_unix_ms as f64 / 1000.0;
    }
    let at = |t: f64| base_unix_ms + secs_to_ms(t);
    let mut per_pid: BTreeMap<u32, Vec<Sample>> = BTreeMap::new();
    let mut device = Vec::new();
    let mut free = Vec::new();
    for s in &fixture.trace {
        for &(pid, bytes) in &s.procs {
            per_pid
                .entry(pid)
                .or_default()
                .push(Sample::new(at(s.t), bytes));
        }
        device.push(DeviceActivitySample {
            t_unix_ms: at(s.t),
            utilization_gpu_percent: s.util_gpu,
            processes_on_device: u32::try_from(s.procs.len()).unwrap_or(u32::MAX),
        });
        free.push((at(s.t), s.free));
    }
    let capacity = fixture.trace.first().map(|s| s.total);
    let series = fixture
        .roles
        .values()
        .filter_map(|&pid| {
            let samples = per_pid.remove(&pid)?;
            let (role, label, start) = label_for(pid, &events);
            Some(LabeledSeries {
                pid,
                name: role.clone(),
                role,
                label,
                process_start_unix_ms: start.or(samples.first().map(|s| s.t_unix_ms)),
                samples,
                sm: Vec::new(),
                device: device.clone(),
                cpu: Vec::new(),
            })
        })
        .collect();
    Ok(LabeledTrace {
        name: "h200-hold-leak-steady".to_owned(),
        capacity_bytes: capacity,
        device_free_bytes: Some(free),
        series,
    })
}

#[derive(Debug, Deserialize)]
struct StatusLine {
    schema: u32,
    taken_at: String,
    devices: Vec<StatusDevice>,
}

#[derive(Debug, Deserialize)]
struct StatusDevice {
    uuid: String,
    #[serde(default)]
    memory: Option<StatusMemory>,
    #[serde(default)]
    utilization_gpu_percent: Option<u32>,
    #[serde(default)]
    processes: Option<Vec<StatusProcess>>,
}

#[derive(Debug, Deserialize)]
struct StatusMemory {
    total_bytes: u64,
    free_bytes: u64,
}

#[derive(Debug, Deserialize)]
struct StatusProcess {
    pid: u32,
    #[serde(default)]
    used_bytes: Option<u64>,
}

#[derive(Default)]
struct DeviceAcc {
    capacity: Option<u64>,
    free: Vec<(i64, u64)>,
    util: Vec<DeviceActivitySample>,
    per_pid: BTreeMap<u32, Vec<Sample>>,
}

/// `status --json --watch` NDJSON and `labels.jsonl` → one trace per device, holding the
/// labeled PIDs (and the unlabeled ones as `not-leak`).
pub fn read_status_ndjson(
    name: &str,
    ndjson: &str,
    labels: &str,
    cpu: Option<&str>,
) -> Result<Vec<LabeledTrace>, String> {
    let events = parse_labels(labels)?;
    let mut cpu = cpu.map(parse_cpu).transpose()?.unwrap_or_default();
    let mut devices: BTreeMap<String, DeviceAcc> = BTreeMap::new();
    for (i, line) in ndjson.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let status: StatusLine =
            serde_json::from_str(line).map_err(|e| format!("status line {}: {e}", i + 1))?;
        if status.schema != 1 {
            return Err(format!(
                "status line {}: schema '{}' is not supported (expected 1)",
                i + 1,
                status.schema
            ));
        }
        let t: jiff::Timestamp = status
            .taken_at
            .parse()
            .map_err(|e| format!("status line {}: taken_at '{}': {e}", i + 1, status.taken_at))?;
        let t = t.as_millisecond();
        for d in status.devices {
            let acc = devices.entry(d.uuid).or_default();
            if let Some(m) = &d.memory {
                acc.capacity = Some(m.total_bytes);
                acc.free.push((t, m.free_bytes));
            }
            let procs = d.processes.unwrap_or_default();
            if let Some(util) = d.utilization_gpu_percent {
                acc.util.push(DeviceActivitySample {
                    t_unix_ms: t,
                    utilization_gpu_percent: util,
                    processes_on_device: u32::try_from(procs.len()).unwrap_or(u32::MAX),
                });
            }
            for p in procs {
                if let Some(bytes) = p.used_bytes {
                    acc.per_pid
                        .entry(p.pid)
                        .or_default()
                        .push(Sample::new(t, bytes));
                }
            }
        }
    }
    Ok(devices
        .into_iter()
        .map(|(uuid, acc)| {
            let series = acc
                .per_pid
                .into_iter()
                .map(|(pid, samples)| {
                    let (role, label, start) = label_for(pid, &events);
                    LabeledSeries {
                        pid,
                        name: role.clone(),
                        role,
                        label,
                        process_start_unix_ms: start.or(samples.first().map(|s| s.t_unix_ms)),
                        samples,
                        sm: Vec::new(),
                        device: acc.util.clone(),
                        cpu: cpu.remove(&pid).unwrap_or_default(),
                    }
                })
                .collect();
            LabeledTrace {
                name: format!("{name} {uuid}"),
                capacity_bytes: acc.capacity,
                device_free_bytes: Some(acc.free),
                series,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_ndjson_and_labels() {
        let ndjson = r#"{"schema":1,"taken_at":"2026-11-29T20:00:00.000Z","driver":{},"devices":[{"index":0,"uuid":"GPU-a","memory":{"total_bytes":100,"used_bytes":30,"reserved_bytes":0,"free_bytes":70},"utilization_gpu_percent":5,"processes":[{"pid":7,"used_bytes":30}]}],"unopened":[]}
{"schema":1,"taken_at":"2026-11-29T20:00:00.100Z","driver":{},"devices":[{"index":0,"uuid":"GPU-a","memory":{"total_bytes":100,"used_bytes":40,"reserved_bytes":0,"free_bytes":60},"utilization_gpu_percent":0,"processes":[{"pid":7,"used_bytes":40},{"pid":8,"used_bytes":null}]}],"unopened":[]}
"#;
        let labels = r#"{"t": 1795982400.0, "pid": 7, "role": "leak-fast", "event": "start"}
{"t": 1795982400.05, "pid": 7, "role": "leak-fast", "event": "leak_start"}
"#;
        let cpu = r#"{"t": 1795982400.0, "pid": 7, "cpu_time_ms": 10}"#;
        let traces = read_status_ndjson("run", ndjson, labels, Some(cpu)).unwrap();
        assert_eq!(traces.len(), 1);
        let t = &traces[0];
        assert_eq!(t.capacity_bytes, Some(100));
        assert_eq!(
            t.series.len(),
            1,
            "a PID without a memory reading has no series"
        );
        let s = &t.series[0];
        assert_eq!(s.role, "leak-fast");
        assert_eq!(
            s.label,
            Label::Leak {
                leak_start_unix_ms: 1_795_982_400_050
            }
        );
        assert_eq!(s.samples.len(), 2);
        assert_eq!(s.samples[1].bytes, 40);
        assert_eq!(s.device[1].processes_on_device, 2);
        assert_eq!(s.cpu.len(), 1);
        assert_eq!(s.cpu[0].cpu_time_ms, 10);
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        assert!(read_status_ndjson("x", "{not json", "", None).is_err());
        assert!(
            read_status_ndjson(
                "x",
                r#"{"schema":2,"taken_at":"2026-01-01T00:00:00Z","devices":[]}"#,
                "",
                None
            )
            .is_err()
        );
        assert!(
            read_status_ndjson(
                "x",
                r#"{"schema":1,"taken_at":"yesterday","devices":[]}"#,
                "",
                None
            )
            .is_err()
        );
        assert!(parse_labels("{\"t\": 1}").is_err());
        assert!(parse_cpu("{\"t\": 1, \"pid\": 2}").is_err());
        assert!(read_fixture("[]", "", 0).is_err());
    }
}
