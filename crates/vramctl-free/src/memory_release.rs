//! After a kill: did the GPU memory come back? Shared by `kill` and `reap`.
//!
//! [`verify_release`] samples NVML every 50 ms until, on every device where an ended target
//! held memory, the driver lists none of them and the memory did not just move to "no
//! process" (a forked child still holding the descriptors), or the timeout passes.
//! [`still_held`] says who keeps what was not released; [`record_memory_outcomes`] writes
//! the bytes freed into each target's audit row.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use serde::Serialize;
use vramctl_core::types::Snapshot;
use vramctl_core::untrusted::Untrusted;
use vramctl_gpu::{Backend, Sampler};
use vramctl_procs::audit_record::AuditOutcome;
use vramctl_procs::procinfo::{self, ProcError, ProcReader};
use vramctl_procs::signal::{AuditSink, TargetOutcome, TargetReport};

use vramctl_observe::gpu_holdings::GpuHolding;
use vramctl_observe::units;

/// How often NVML is sampled while waiting for memory to be released.
const VERIFY_EVERY: Duration = Duration::from_millis(50);

/// One device's memory before and after.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceRelease {
    pub index: u32,
    pub uuid: String,
    /// What NVML attributed to the ended targets before the signal.
    pub held_bytes: Option<u64>,
    pub used_before_bytes: Option<u64>,
    pub used_after_bytes: Option<u64>,
    /// `used_before - used_after` (0 if other processes grew meanwhile).
    pub freed_bytes: Option<u64>,
    pub released: bool,
    /// From the first signal to the sample that showed the memory gone.
    pub released_after_s: Option<f64>,
    /// The ended targets the driver listed on it before.
    pub pids: Vec<u32>,
    #[serde(skip)]
    pub unaccounted_before: Option<u64>,
    #[serde(skip)]
    pub still_listed: Vec<u32>,
    #[serde(skip)]
    pub unlisted_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct StillHeld {
    pub index: u32,
    pub uuid: String,
    /// Bytes still used that no listed process accounts for since the kill.
    pub unlisted_bytes: Option<u64>,
    pub holders: Vec<Holder>,
}

#[derive(Debug, Serialize)]
pub struct Holder {
    pub pid: u32,
    pub command: Option<String>,
    /// Why it still holds memory, in words.
    pub why: String,
}

/// The targets that ended (exited, or were gone before the signal): whose memory the
/// driver should now release.
pub fn ended_pids(outcomes: &[TargetReport]) -> HashSet<u32> {
    outcomes
        .iter()
        .filter(|r| {
            matches!(
                r.outcome,
                TargetOutcome::Exited { .. } | TargetOutcome::AlreadyGone
            )
        })
        .map(|r| r.candidate.identity.pid)
        .collect()
}

/// Samples NVML until no device lists an ended target and its memory did not move to "no
/// process" (a forked child still holding the descriptors), or `timeout` passes.
pub fn verify_release(
    sampler: &mut Sampler<impl Backend>,
    before: &Snapshot,
    ended: &HashSet<u32>,
    started: Instant,
    timeout: Duration,
) -> Vec<DeviceRelease> {
    let mut devices: Vec<DeviceRelease> = before
        .devices
        .iter()
        .filter_map(|d| {
            let reading = d.reading()?;
            let mine: Vec<_> = reading
                .processes
                .as_ref()?
                .iter()
                .filter(|p| ended.contains(&p.pid))
                .collect();
            if mine.is_empty() {
                return None;
            }
            let held = mine
                .iter()
                .try_fold(0_u64, |sum, p| Some(sum.saturating_add(p.used_bytes?)));
            Some(DeviceRelease {
                index: d.info.index,
                uuid: d.info.uuid.clone(),
                held_bytes: held,
                used_before_bytes: reading.memory.map(|m| m.used_bytes),
                used_after_bytes: None,
                freed_bytes: None,
                released: false,
                released_after_s: None,
                pids: mine.iter().map(|p| p.pid).collect(),
                unaccounted_before: reading.unaccounted_bytes(),
                still_listed: Vec::new(),
                unlisted_bytes: None,
            })
        })
        .collect();
    // A target whose forked child keeps its memory leaves the list while the used memory
    // stays: read the lists every sample here, not only when the used memory moved.
    let reused = sampler.backend_mut().reuses_process_lists();
    sampler.backend_mut().set_reuse_process_lists(false);
    let deadline = Instant::now() + timeout;
    while devices.iter().any(|d| !d.released) {
        let at = started.elapsed();
        let snapshot = sampler.tick();
        for device in devices.iter_mut().filter(|d| !d.released) {
            let Some(reading) = snapshot
                .devices
                .iter()
                .find(|d| d.info.uuid == device.uuid)
                .and_then(|d| d.reading())
            else {
                continue;
            };
            let Some(processes) = reading.processes.as_ref() else {
                continue;
            };
            device.still_listed = processes
                .iter()
                .filter(|p| ended.contains(&p.pid))
                .map(|p| p.pid)
                .collect();
            device.used_after_bytes = reading.memory.map(|m| m.used_bytes);
            device.freed_bytes = device
                .used_before_bytes
                .zip(device.used_after_bytes)
                .map(|(b, a)| b.saturating_sub(a));
            let grew = reading
                .unaccounted_bytes()
                .zip(device.unaccounted_before)
                .map(|(now, then)| now.saturating_sub(then));
            // Memory that left the list but stays used: half of what the targets held
            // moving to "no process" is not noise.
            let moved = grew
                .zip(device.held_bytes)
                .is_some_and(|(grew, held)| held > 0 && grew >= held / 2);
            device.unlisted_bytes = grew.filter(|_| moved);
            if device.still_listed.is_empty() && !moved {
                device.released = true;
                device.released_after_s = Some(at.as_secs_f64());
            }
        }
        if devices.iter().all(|d| d.released) || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(VERIFY_EVERY);
    }
    sampler.backend_mut().set_reuse_process_lists(reused);
    devices
}

/// Sets each exited target's audit outcome: the memory it held on devices that released it.
pub fn record_memory_outcomes(
    audit: &mut dyn AuditSink,
    outcomes: &[TargetReport],
    held_before: &BTreeMap<u32, Vec<GpuHolding>>,
    devices: &[DeviceRelease],
) {
    for r in outcomes {
        let (Some(id), TargetOutcome::Exited { after, .. }) = (r.last_audit_id(), &r.outcome)
        else {
            continue;
        };
        let pid = r.candidate.identity.pid;
        let mut freed: u64 = 0;
        let mut after_s = after.as_secs_f64();
        for h in held_before.get(&pid).into_iter().flatten() {
            if let Some(d) = devices.iter().find(|d| d.uuid == h.uuid && d.released) {
                freed = freed.saturating_add(h.used_bytes.unwrap_or(0));
                after_s = after_s.max(d.released_after_s.unwrap_or(0.0));
            }
        }
        // Millisecond resolution is what the record keeps.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let after_ms = (after_s * 1000.0).round() as u64;
        let outcome = AuditOutcome::Exited {
            freed_bytes: freed,
            after_ms,
        };
        if let Err(err) = audit.after(id, &outcome) {
            tracing::warn!(error = %err, pid, "Could not record the outcome of a kill.");
        }
    }
}

/// For each device that still holds memory: which ended targets the driver still lists and
/// why, and which survivors may hold the rest.
pub fn still_held(
    devices: &[DeviceRelease],
    watch: &[(u32, u32)],
    procs: &mut ProcReader,
) -> Vec<StillHeld> {
    let mut out = Vec::new();
    for d in devices.iter().filter(|d| !d.released) {
        let mut holders = Vec::new();
        for pid in &d.still_listed {
            holders.push(Holder {
                pid: *pid,
                command: procs.details(*pid).map(|p| p.command),
                why: why_listed(*pid),
            });
        }
        // Survivors are worth naming either way: a dead PID the driver still lists is
        // often kept by a child that inherited its descriptors.
        holders.extend(survivors(watch, procs));
        out.push(StillHeld {
            index: d.index,
            uuid: d.uuid.clone(),
            unlisted_bytes: d.unlisted_bytes,
            holders,
        });
    }
    out
}

fn why_listed(pid: u32) -> String {
    match procinfo::read_stat(pid) {
        Err(ProcError::NotFound { .. }) => "it has exited, but the driver still lists it: a \
             process that inherited its /dev/nvidia* descriptors keeps its context, or the \
             context leaked in the driver (a GPU reset or reboot frees that)"
            .into(),
        Err(e) => format!("cannot read its state: {e}"),
        Ok(s) if s.is_zombie() => format!(
            "a zombie the driver still lists; its parent (PID {}) must reap it",
            s.ppid
        ),
        Ok(s) if s.state == 'D' => "in uninterruptible sleep (state D), usually inside the GPU \
             driver"
            .into(),
        Ok(s) => format!("still running (state {})", s.state),
    }
}

/// Descendants of the targets that are still alive, marked by whether they hold
/// `/dev/nvidia*`; without any, every process here that holds `/dev/nvidia*`.
fn survivors(watch: &[(u32, u32)], procs: &mut ProcReader) -> Vec<Holder> {
    let mut out = Vec::new();
    for (pid, parent) in watch {
        let Ok(stat) = procinfo::read_stat(*pid) else {
            continue;
        };
        let files = procinfo::gpu_device_files(*pid);
        let holds = match &files {
            Ok(files) if !files.is_empty() => format!("with {} open", files.join(", ")),
            Ok(_) => "with no /dev/nvidia* open".to_owned(),
            Err(_) => "(its descriptors cannot be read)".to_owned(),
        };
        let what = if stat.is_zombie() {
            "a zombie"
        } else {
            "still running"
        };
        out.push(Holder {
            pid: *pid,
            command: procs.details(*pid).map(|p| p.command),
            why: format!("a descendant of PID {parent}, {what} {holds}"),
        });
    }
    if out.is_empty() {
        for (pid, files) in procinfo::holders_of(procinfo::GPU_DEVICE_PREFIX)
            .into_iter()
            .take(10)
        {
            out.push(Holder {
                pid,
                command: procs.details(pid).map(|p| p.command),
                why: format!("has {} open", files.join(", ")),
            });
        }
    }
    out
}

/// What happened to one target, in the words and fields of `kill --json` (`reap` uses the
/// same).
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// `refused`, `already_gone`, `audit_failed`, `signal_failed`, `exited`, `still_running`.
    pub outcome: &'static str,
    /// The refusal or error in words.
    pub detail: Option<String>,
    /// Signals sent, in order.
    pub signals: Vec<String>,
    /// Whether it took `SIGKILL` after the grace period.
    pub escalated: bool,
    /// From the first signal to its exit.
    pub exited_after_s: Option<f64>,
    /// Whether a pidfd pinned it.
    pub pinned: bool,
}

impl Outcome {
    /// The words for `r`.
    pub fn of(r: &TargetReport) -> Self {
        let mut o = Self {
            outcome: "signal_failed",
            detail: None,
            signals: r
                .signals
                .iter()
                .map(|s| s.signal.name().to_owned())
                .collect(),
            escalated: false,
            exited_after_s: None,
            pinned: r.pinned,
        };
        let (outcome, detail) = match &r.outcome {
            TargetOutcome::Refused { refusal } => ("refused", Some(refusal.to_string())),
            TargetOutcome::AlreadyGone => ("already_gone", None),
            TargetOutcome::AuditFailed { error } => (
                "audit_failed",
                Some(format!(
                    "not signalled: cannot write the audit record: {error}"
                )),
            ),
            TargetOutcome::SignalFailed { error } => ("signal_failed", Some(error.clone())),
            TargetOutcome::Exited { after, escalated } => {
                o.escalated = *escalated;
                o.exited_after_s = Some(after.as_secs_f64());
                ("exited", None)
            }
            TargetOutcome::StillRunning {
                escalated,
                state,
                note,
            } => {
                o.escalated = *escalated;
                let state = state.map_or_else(|| "unknown".into(), |s| s.to_string());
                let detail = match (escalated, note) {
                    (_, Some(note)) => note.clone(),
                    (true, None) if state == "D" => "survived SIGKILL in uninterruptible sleep \
                         (state D), usually inside the GPU driver; it ends when the driver call \
                         returns, or needs a GPU reset"
                        .to_owned(),
                    (true, None) => format!("survived SIGKILL (state {state})"),
                    (false, None) => {
                        format!("still running after the grace period (state {state})")
                    }
                };
                ("still_running", Some(detail))
            }
            _ => ("signal_failed", Some("unknown outcome".into())),
        };
        o.outcome = outcome;
        o.detail = detail;
        o
    }
}

/// The per-device lines of a report: released (after how long, how much) or not, and who
/// still holds what was not.
pub fn release_lines(devices: &[DeviceRelease], still_held: &[StillHeld]) -> Vec<String> {
    let mut lines = Vec::new();
    for d in devices {
        let held = units::opt_bytes(d.held_bytes);
        let used = match (d.used_before_bytes, d.used_after_bytes) {
            (Some(b), Some(a)) => format!("; used {} → {}", units::bytes(b), units::bytes(a)),
            _ => String::new(),
        };
        if d.released {
            lines.push(format!(
                "GPU {}: {held} released after {} (freed {}{used})",
                d.index,
                units::seconds(d.released_after_s.unwrap_or(0.0)),
                units::opt_bytes(d.freed_bytes),
            ));
        } else {
            lines.push(format!(
                "GPU {}: {held} NOT released within the timeout{used}",
                d.index
            ));
        }
    }
    for s in still_held {
        if let Some(bytes) = s.unlisted_bytes {
            lines.push(format!(
                "GPU {}: {} moved to no listed process: something still holds the targets' \
                 descriptors",
                s.index,
                units::bytes(bytes)
            ));
        }
        if s.holders.is_empty() {
            lines.push(format!(
                "GPU {}: no process visible here holds /dev/nvidia*; the memory may belong to \
                 another PID namespace or be leaked in the driver",
                s.index
            ));
        }
        for h in &s.holders {
            lines.push(format!(
                "GPU {}: still held: PID {} ({}): {}",
                s.index,
                h.pid,
                Untrusted(h.command.as_deref().unwrap_or("?")),
                h.why
            ));
        }
    }
    lines
}

/// Jupyter restarts a kernel that dies of a signal (`autorestart`), memory and all.
pub fn jupyter_note(command: Option<&str>) -> Option<String> {
    command.filter(|c| c.contains("ipykernel")).map(|_| {
        "a Jupyter kernel: its server restarts a kernel ended by a signal; shut it down from \
         Jupyter (Kernel > Shut Down Kernel) or stop the server instead"
            .to_owned()
    })
}
