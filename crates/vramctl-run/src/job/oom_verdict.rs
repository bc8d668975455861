//! The verdict on a job's out-of-memory error: its cause, a fix only where a replay says
//! it works, and the evidence (issue 33, docs/run.md "Out-of-memory errors").
//!
//! With the agent: at the process's first CUDA OOM, PyTorch's OOM observer kept an
//! allocator snapshot and a record (`python/vramctl_agent/_oom.py`: the device, the memory
//! the allocator asked the driver for, what it was allowed and what the driver had free)
//! in the job's report directory. The snapshot goes through the one classifier of
//! `vramctl_snapshot` (`summary::summarize_with`); when it holds no history (the default:
//! recording costs a stack per allocation), the observer's own figures are its `oom` event,
//! the event the allocator would have recorded. NVML's view of every other process at that
//! moment is the evidence for `other-process`.
//!
//! Without the agent (or when it kept nothing): the OOM line's figures and NVML's view,
//! through `oom_message::explain`, which says what they cannot tell.
//!
//! The files come from the job, so they are hostile: only the names this module derives
//! from a PID are opened, in the directory `run` made (0700), without following a symlink,
//! only a regular file owned by `run`'s own user, and no more than a cap of bytes.

use std::io::Read;
use std::path::Path;

use serde::Serialize;
use vramctl_core::types::Snapshot as NvmlSnapshot;
use vramctl_snapshot::observed_oom;
use vramctl_snapshot::oom_cause::{Cause, Evidence};
use vramctl_snapshot::oom_message::{self, HeldThen, Holder};

/// The largest snapshot read (the agent keeps none larger: `MAX_OOM_SNAPSHOT_BYTES`).
pub const MAX_SNAPSHOT_BYTES: u64 = 256 << 20;
/// The record is a few hundred bytes.
const MAX_RECORD_BYTES: u64 = 64 << 10;

/// What the agent's observer recorded at the OOM (`<pid>.oom.json`).
pub use vramctl_agent::agent_client::OomRecord as AgentOomRecord;

/// Another process on the OOM's GPU, from NVML at that moment.
#[derive(Debug, Clone, Serialize)]
pub struct OtherProcess {
    pub pid: u32,
    pub bytes: u64,
    pub command: Option<String>,
}

/// The verdict `run` prints.
#[derive(Debug, Clone, Serialize)]
pub struct OomVerdict {
    /// None when the evidence supports no cause.
    pub cause: Option<Cause>,
    /// What would have avoided it; None when nothing the job can set does (or, from a
    /// message, when nothing could be checked).
    pub fix: Option<String>,
    /// One sentence with the numbers.
    pub why: String,
    /// `agent-snapshot` (the observer's snapshot, classified) or `message` (the OOM line
    /// and NVML alone).
    pub from: &'static str,
    /// The snapshot classifier's evidence (`agent-snapshot` only).
    pub evidence: Option<Evidence>,
    /// What the evidence cannot tell (`message` only).
    pub cannot_tell: Vec<String>,
    /// The observer's record.
    pub agent: Option<AgentOomRecord>,
    /// NVML: the other processes on the GPU then, largest first.
    pub other_processes: Vec<OtherProcess>,
    /// NVML: the GPU's total memory.
    pub device_total_bytes: Option<u64>,
    /// Milliseconds from the NVML sample used to the OOM (negative: before it).
    pub nvml_sample_offset_ms: Option<i64>,
    /// Milliseconds `run` spent on the verdict once the job had ended: reading the
    /// observer's files and classifying (issue 33's "within 2 s", stage by stage).
    pub verdict_ms: Option<f64>,
}

impl OomVerdict {
    /// No cause can be given: no snapshot was kept and no OOM line could be read.
    pub fn unknown(record: Option<&AgentOomRecord>, nvml: &NvmlAtOom) -> Self {
        Self {
            cause: None,
            fix: None,
            why: record.and_then(|r| r.snapshot_error.clone()).map_or_else(
                || "no allocator snapshot was kept and the OOM's message was not one vramctl reads".to_owned(),
                |e| format!("the agent kept no snapshot ({e}) and the OOM's message was not one vramctl reads"),
            ),
            from: "none",
            evidence: None,
            cannot_tell: Vec::new(),
            agent: record.cloned(),
            other_processes: nvml.others.clone(),
            device_total_bytes: nvml.device_total_bytes,
            nvml_sample_offset_ms: nvml.sample_offset_ms,
            verdict_ms: None,
        }
    }
}

/// Opens `name` in `dir` as the job's file: no symlink followed, a regular file owned by
/// this process's user, at most `cap` bytes.
pub(crate) fn read_job_file(dir: &Path, name: &str, cap: u64) -> Result<Vec<u8>, String> {
    use rustix::fs::{Mode, OFlags};
    let path = dir.join(name);
    let fd = rustix::fs::open(
        &path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open '{}': {e}", path.display()))?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| e.to_string())?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(format!("'{}' is not a regular file", path.display()));
    }
    if stat.st_uid != rustix::process::geteuid().as_raw() {
        return Err(format!(
            "'{}' belongs to uid {}, not ours",
            path.display(),
            stat.st_uid
        ));
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > cap {
        return Err(format!("'{}' is over {cap} bytes", path.display()));
    }
    Ok(bytes)
}

/// The PIDs of the files `<pid><suffix>` in the report directory (the agent writes one per
/// process), at most 4096 entries read: only the job writes there, but it may write many.
pub fn job_file_pids(dir: &Path, suffix: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .take(4096)
        .filter_map(|entry| {
            entry
                .file_name()
                .to_str()?
                .strip_suffix(suffix)?
                .parse::<u32>()
                .ok()
        })
        .collect()
}

/// The observers' records in the report directory, oldest OOM first, each with its
/// snapshot's bytes when one was kept and can be read.
pub fn agent_records(dir: &Path) -> Vec<(AgentOomRecord, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    for pid in job_file_pids(dir, ".oom.json") {
        let record = read_job_file(dir, &format!("{pid}.oom.json"), MAX_RECORD_BYTES)
            .and_then(|b| serde_json::from_slice::<AgentOomRecord>(&b).map_err(|e| e.to_string()));
        let mut record = match record {
            Ok(r) => r,
            Err(err) => {
                tracing::debug!(%err, "Skipped an OOM record.");
                continue;
            }
        };
        // The PID is the file's name, not what the file says.
        record.pid = pid;
        let snapshot = read_job_file(dir, &format!("{pid}.oom.pickle"), MAX_SNAPSHOT_BYTES)
            .map_err(|err| tracing::debug!(%err, "No OOM snapshot."))
            .ok();
        out.push((record, snapshot));
    }
    out.sort_by_key(|(r, _)| (r.unix_ms, r.pid));
    out
}

/// What NVML saw on the OOM's GPU: its total and the processes other than the job's.
#[derive(Debug, Clone, Default)]
pub struct NvmlAtOom {
    pub device_total_bytes: Option<u64>,
    pub others: Vec<OtherProcess>,
    pub sample_offset_ms: Option<i64>,
}

impl NvmlAtOom {
    /// From a sample: the GPU that lists `pid` (else the one of index `ordinal`, else the
    /// only one), and its processes that are not in `job`.
    pub fn from_sample(
        sample: &NvmlSnapshot,
        pid: Option<u32>,
        ordinal: Option<i64>,
        job: &dyn Fn(u32) -> bool,
        command_of: &dyn Fn(u32) -> Option<String>,
        oom_unix_ms: Option<i64>,
    ) -> Self {
        let lists = |d: &vramctl_core::types::DeviceSnapshot, pid: u32| {
            d.reading()
                .and_then(|r| r.processes.as_ref())
                .is_some_and(|ps| ps.iter().any(|p| p.pid == pid))
        };
        let device = pid
            .and_then(|pid| sample.devices.iter().find(|d| lists(d, pid)))
            .or_else(|| {
                ordinal.and_then(|o| sample.devices.iter().find(|d| i64::from(d.info.index) == o))
            })
            .or_else(|| (sample.devices.len() == 1).then(|| &sample.devices[0]));
        let Some(device) = device else {
            return Self::default();
        };
        let reading = device.reading();
        let mut others: Vec<OtherProcess> = reading
            .and_then(|r| r.processes.as_ref())
            .into_iter()
            .flatten()
            .filter(|p| !job(p.pid))
            .filter_map(|p| {
                Some(OtherProcess {
                    pid: p.pid,
                    bytes: p.used_bytes?,
                    command: command_of(p.pid),
                })
            })
            .collect();
        others.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
        others.dedup_by_key(|p| p.pid);
        Self {
            device_total_bytes: reading
                .and_then(|r| r.memory.as_ref())
                .map(|m| m.total_bytes),
            others,
            sample_offset_ms: oom_unix_ms.map(|t| sample.taken_at_unix_ms - t),
        }
    }
}

/// The verdict from the observer's record and snapshot (`observed_oom`). None when the
/// snapshot cannot be read or holds no OOM of the record's device.
pub fn from_agent(
    record: &AgentOomRecord,
    snapshot: &[u8],
    nvml: &NvmlAtOom,
) -> Option<OomVerdict> {
    let observed = observed_oom::Observed {
        device: record.device.unwrap_or(0),
        segment_bytes: record.segment_bytes?,
        device_free_bytes: record.device_free_bytes,
        // The total of the API the free bytes came from (cudaMemGetInfo: torch's
        // total_memory), NVML's where torch's is unknown.
        device_total_bytes: record.device_total_bytes.or(nvml.device_total_bytes),
        unix_ms: record.unix_ms,
    };
    let event = match observed_oom::verdict(snapshot, observed) {
        Ok(e) => e,
        Err(err) => {
            tracing::debug!(%err, "The OOM snapshot gives no verdict.");
            return None;
        }
    };
    let v = event.verdict;
    Some(OomVerdict {
        cause: Some(v.cause),
        fix: v.fix,
        why: v.why,
        from: "agent-snapshot",
        evidence: Some(v.evidence),
        cannot_tell: Vec::new(),
        agent: Some(record.clone()),
        other_processes: nvml.others.clone(),
        device_total_bytes: nvml.device_total_bytes,
        nvml_sample_offset_ms: nvml.sample_offset_ms,
        verdict_ms: None,
    })
}

/// The verdict from the OOM line and NVML alone. None when the line is not a message
/// `oom_message` reads.
pub fn from_message(
    line: &str,
    nvml: &NvmlAtOom,
    record: Option<&AgentOomRecord>,
) -> Option<OomVerdict> {
    let message = oom_message::parse(line)?;
    let then = HeldThen {
        at_unix_ms: 0,
        device_total_bytes: nvml.device_total_bytes,
        holders: nvml
            .others
            .iter()
            .map(|p| Holder {
                pid: p.pid,
                bytes: p.bytes,
                user: None,
                command: p.command.clone(),
                container: None,
            })
            .collect(),
    };
    let v = oom_message::explain(&message, Some(&then));
    Some(OomVerdict {
        cause: v.cause,
        fix: v.fix,
        why: v.why,
        from: "message",
        evidence: None,
        cannot_tell: v.cannot_tell,
        agent: record.cloned(),
        other_processes: nvml.others.clone(),
        device_total_bytes: nvml.device_total_bytes,
        nvml_sample_offset_ms: nvml.sample_offset_ms,
        verdict_ms: None,
    })
}

/// The verdict in lines for people: the cause and the fix first, then why and who else
/// held the GPU. Text from the job (commands) is escaped.
pub fn lines(v: &OomVerdict) -> Vec<String> {
    let human = vramctl_observe::units::bytes;
    let mut out = Vec::new();
    let cause = v.cause.map_or("unknown", Cause::as_str);
    out.push(format!(
        "OOM cause: {cause} · fix: {}",
        v.fix.as_deref().map_or_else(
            || "none found".to_owned(),
            |f| vramctl_core::untrusted::escape(f).into_owned()
        )
    ));
    out.push(format!("  {}", vramctl_core::untrusted::escape(&v.why)));
    for p in v.other_processes.iter().take(5) {
        out.push(format!(
            "  other process {} held {}{}",
            p.pid,
            human(p.bytes),
            p.command
                .as_deref()
                .map(|c| format!(" ({})", vramctl_core::untrusted::escape(c)))
                .unwrap_or_default()
        ));
    }
    if v.other_processes.len() > 5 {
        out.push(format!(
            "  and {} more other processes",
            v.other_processes.len() - 5
        ));
    }
    match v.from {
        "agent-snapshot" => {
            let recorded = v.agent.as_ref().is_some_and(|a| a.history_recorded);
            out.push(format!(
                "  from the agent's snapshot at the OOM{}",
                if recorded {
                    " (with history)"
                } else {
                    " (no history: VRAMCTL_OOM_HISTORY=1 records it, so a fix can be replayed)"
                }
            ));
        }
        _ => {
            out.push("  from the OOM message and NVML alone; they cannot tell:".to_owned());
            for c in &v.cannot_tell {
                out.push(format!("    - {c}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_s_files_are_read_only_as_regular_files_of_ours_under_the_cap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let record = r#"{"pid": 1, "unix_ms": 5, "device": 0, "segment_bytes": 4096}"#;
        std::fs::write(dir.path().join("42.oom.json"), record).expect("record");
        std::fs::write(dir.path().join("42.oom.pickle"), b"not a pickle").expect("pickle");
        // A planted symlink to a file elsewhere is never followed.
        let outside = tempfile::NamedTempFile::new().expect("outside");
        std::fs::write(outside.path(), record).expect("outside");
        std::os::unix::fs::symlink(outside.path(), dir.path().join("43.oom.json")).expect("link");
        // Over the cap: skipped.
        let big = format!("{{\"pid\": 1, \"alloc_conf\": \"{}\"}}", "x".repeat(70_000));
        std::fs::write(dir.path().join("44.oom.json"), big).expect("big");
        // Names that are not a PID's: not opened.
        std::fs::write(dir.path().join("x.oom.json"), record).expect("x");
        let records = agent_records(dir.path());
        assert_eq!(records.len(), 1, "{records:?}");
        let (r, snapshot) = &records[0];
        // The PID is the file's name, not what the file says.
        assert_eq!(r.pid, 42);
        assert_eq!(r.segment_bytes, Some(4096));
        assert_eq!(snapshot.as_deref(), Some(&b"not a pickle"[..]));
        // A snapshot that is not one gives no verdict (the message is the fallback).
        assert!(from_agent(r, b"not a pickle", &NvmlAtOom::default()).is_none());
        assert!(read_job_file(dir.path(), "43.oom.json", 1 << 20).is_err());
        assert!(read_job_file(dir.path(), "44.oom.json", MAX_RECORD_BYTES).is_err());
    }

    #[test]
    fn without_a_snapshot_the_message_and_nvml_give_the_verdict_and_what_they_cannot_tell() {
        let nvml = NvmlAtOom {
            device_total_bytes: Some(80 << 30),
            others: vec![OtherProcess {
                pid: 7,
                bytes: 30 << 30,
                command: Some("python \x1b[31mevil".into()),
            }],
            sample_offset_ms: Some(-40),
        };
        let line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a \
                    total capacity of 79.10 GiB of which 9.50 GiB is free. Process 7 has 30.00 GiB memory \
                    in use. Including non-PyTorch memory, this process has 39.00 GiB memory in use. Of the \
                    allocated memory 38.00 GiB is allocated by PyTorch, and 0.50 GiB is reserved by \
                    PyTorch but unallocated.";
        let v = from_message(line, &nvml, None).expect("a verdict");
        assert_eq!(v.from, "message");
        assert_eq!(v.cause, Some(Cause::OtherProcess), "{v:?}");
        assert!(!v.cannot_tell.is_empty());
        let text = lines(&v).join("\n");
        assert!(text.starts_with("OOM cause: other-process"), "{text}");
        // The other process's command is the job's text: escaped.
        assert!(!text.contains('\x1b'), "{text}");
        assert!(from_message("Killed", &nvml, None).is_none());
    }
}
