//! Where each of the job's ticks comes from, and whether its PIDs may be matched with the
//! job's process tree.
//!
//! On the host (or wherever this /proc shows the host's PIDs) NVML is read here and its
//! PIDs are this /proc's. Inside a container or PID namespace of its own, drivers differ:
//! some report host PIDs, which mean nothing here (a host PID can even be the number of one
//! of the job's own processes in this namespace, and matching it would attribute another
//! container's memory to the job); driver 580 numbers them in this namespace. So there a
//! host daemon (`record`/`serve`, its socket mounted in: docs/owners.md) is asked at each
//! tick for the answer it makes for this namespace (its processes under their PIDs here);
//! a tick it does not answer is read from NVML here, and its processes are matched with the
//! tree only when each row checks out as a process here holding that GPU open
//! (`pid_view::rows_held_here`); otherwise they are not matched at all — the device's own
//! figures stay, nothing is guessed.

use std::time::{Duration, Instant};

use vramctl_core::types::{DeviceState, Snapshot};
use vramctl_observe::daemon_socket::client::{AskOptions, ask};
use vramctl_observe::live_loop::LiveSampler;
use vramctl_observe::pid_view::{LocalPids, PidView};
use vramctl_procs::process_catalog::listed_pids;

/// After a tick the daemon did not answer, how long to read NVML here before asking again:
/// a daemon that hangs costs its client up to 500 ms, which must not happen at every tick.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// What the job's PIDs were, over all its ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PidMapping {
    /// NVML's PIDs are this /proc's.
    Same,
    /// Inside a PID namespace, a host daemon mapped every tick (or some, and the driver's
    /// own numbering checked out on the rest).
    Mapped,
    /// Inside a PID namespace with no daemon, the driver numbered every tick's processes in
    /// this namespace (checked per tick: `pid_view::rows_held_here`).
    DriverNumbered,
    /// Inside a PID namespace, some ticks (`unmapped_ticks`) had NVML's host PIDs only:
    /// their processes were not attributed to the job.
    CannotMap,
}

/// One tick and whether its PIDs are this namespace's.
#[derive(Debug)]
pub struct Tick {
    /// The devices now (NVML's here, or the daemon's answer made for this namespace).
    pub snapshot: Snapshot,
    /// The snapshot's PIDs are this /proc's: they may be matched with the job's tree.
    pub pids_are_ours: bool,
}

impl Tick {
    /// The snapshot to attribute processes from: itself, or without its process lists when
    /// its PIDs are not ours.
    pub fn attributable(&self) -> std::borrow::Cow<'_, Snapshot> {
        if self.pids_are_ours {
            return std::borrow::Cow::Borrowed(&self.snapshot);
        }
        let mut bare = self.snapshot.clone();
        for device in &mut bare.devices {
            if let DeviceState::Ok(reading) = &mut device.state {
                reading.processes = None;
                reading.process_activity = None;
            }
        }
        std::borrow::Cow::Owned(bare)
    }
}

/// The job's ticks.
pub struct JobTicks<'a> {
    nvml: &'a mut LiveSampler,
    /// Whether this /proc is the host's PID namespace (else NVML's PIDs are checked per
    /// tick).
    local: LocalPids,
    /// How to ask a host daemon (only outside the host's PID namespace).
    daemon: Option<AskOptions>,
    /// When the daemon may be asked again after a tick it did not answer.
    retry_at: Option<Instant>,
    /// Ticks whose PIDs were not ours.
    unmapped_ticks: u64,
    /// Ticks whose PIDs the driver numbered here (checked).
    driver_numbered_ticks: u64,
    /// Ticks a daemon mapped.
    daemon_ticks: u64,
}

impl<'a> JobTicks<'a> {
    /// Ticks from `nvml`, and inside a PID namespace of its own from a host daemon asked
    /// with `daemon` (`None`: never asked).
    pub fn new(nvml: &'a mut LiveSampler, daemon: Option<AskOptions>) -> Self {
        let local = LocalPids::here();
        let daemon = daemon
            .filter(|_| !local.is_host())
            .map(|options| AskOptions {
                accept_mapped: true,
                process_stat: false,
                ..options
            });
        Self {
            nvml,
            local,
            daemon,
            retry_at: None,
            unmapped_ticks: 0,
            driver_numbered_ticks: 0,
            daemon_ticks: 0,
        }
    }

    /// The next tick.
    pub fn tick(&mut self) -> Tick {
        if self.local.is_host() {
            return Tick {
                snapshot: self.nvml.tick(),
                pids_are_ours: true,
            };
        }
        let may_ask = self.retry_at.is_none_or(|at| Instant::now() >= at);
        if let Some(options) = self.daemon.as_ref().filter(|_| may_ask) {
            match ask(options) {
                Some(reply) if reply.mapped.is_some() => {
                    self.retry_at = None;
                    self.daemon_ticks += 1;
                    return Tick {
                        snapshot: reply.snapshot,
                        pids_are_ours: true,
                    };
                }
                _ => {
                    tracing::debug!(
                        retry_s = RETRY_AFTER.as_secs(),
                        "No host daemon mapped this PID namespace's processes; NVML's host \
                         PIDs are not matched with the job."
                    );
                    self.retry_at = Some(Instant::now() + RETRY_AFTER);
                }
            }
        }
        let snapshot = self.nvml.tick();
        match self.local.view(&snapshot) {
            PidView::DriverNumbered(_) => {
                self.driver_numbered_ticks += 1;
                Tick {
                    snapshot,
                    pids_are_ours: true,
                }
            }
            // A tick with no process anywhere has nothing to attribute; it is no evidence
            // either way.
            _ if listed_pids(&snapshot).is_empty() => Tick {
                snapshot,
                pids_are_ours: true,
            },
            _ => {
                self.unmapped_ticks += 1;
                Tick {
                    snapshot,
                    pids_are_ours: false,
                }
            }
        }
    }

    /// What the job's PIDs were, over the ticks so far, and how many were not mapped.
    pub fn mapping(&self) -> (PidMapping, u64) {
        let mapping = if self.local.is_host() {
            PidMapping::Same
        } else if self.unmapped_ticks == 0 && self.daemon_ticks > 0 {
            PidMapping::Mapped
        } else if self.unmapped_ticks == 0 && self.driver_numbered_ticks > 0 {
            PidMapping::DriverNumbered
        } else {
            // Unmapped ticks, or none that showed a mapping either way (no process listed).
            PidMapping::CannotMap
        };
        (mapping, self.unmapped_ticks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use vramctl_core::types::{
        DeviceInfo, DeviceReading, DeviceSnapshot, DriverInfo, ProcessKind, ProcessUsage,
    };

    #[test]
    fn a_tick_whose_pids_are_not_ours_attributes_no_process() {
        let reading = DeviceReading {
            processes: Some(vec![ProcessUsage {
                pid: 4242,
                used_bytes: Some(1 << 30),
                kind: ProcessKind::Compute,
                gpu_instance_id: None,
                compute_instance_id: None,
            }]),
            ..DeviceReading::default()
        };
        let snapshot = Snapshot {
            taken_at_unix_ms: 0,
            monotonic_ms: 0,
            driver: Arc::new(DriverInfo::default()),
            devices: vec![DeviceSnapshot {
                info: Arc::new(DeviceInfo::new(0, "GPU-a")),
                state: DeviceState::Ok(reading),
            }],
            unopened: Vec::new(),
        };
        let theirs = Tick {
            snapshot: snapshot.clone(),
            pids_are_ours: false,
        };
        let bare = theirs.attributable();
        assert!(
            bare.devices[0]
                .reading()
                .is_some_and(|r| r.processes.is_none())
        );
        let ours = Tick {
            snapshot,
            pids_are_ours: true,
        };
        let same = ours.attributable();
        assert_eq!(
            same.devices[0]
                .reading()
                .and_then(|r| r.processes.as_ref())
                .map(Vec::len),
            Some(1)
        );
    }
}
