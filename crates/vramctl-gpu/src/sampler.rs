//! One [`Snapshot`] per tick from a [`Backend`], whatever the devices do.
//!
//! Static facts are read once at construction and shared (`Arc`) by every snapshot. A
//! device that fails this tick is recorded as lost or failed in the snapshot; it never
//! fails the tick, and the other devices still report.

use std::sync::Arc;

use crate::backend::{Backend, DeviceError, Enumeration};
use vramctl_core::clock::{Clock, SystemClock};
use vramctl_core::sanity::{SanityLimits, sanitize};
use vramctl_core::topology::{GpuPair, nvlinks_between};
use vramctl_core::types::{
    DeviceDiagnostics, DeviceInfo, DeviceSnapshot, DeviceState, DriverInfo, Field, Snapshot,
    Unavailable, UnopenedDevice,
};

/// Reads every device once per [`tick`](Sampler::tick).
pub struct Sampler<B> {
    backend: B,
    clock: Box<dyn Clock>,
    limits: SanityLimits,
    driver: Arc<DriverInfo>,
    devices: Vec<Arc<DeviceInfo>>,
    unopened: Vec<UnopenedDevice>,
    /// Why the backend's session stopped working, once a call said so.
    session_lost: Option<String>,
}

impl<B: Backend> Sampler<B> {
    /// Enumerates the backend's devices with the system clock and this kernel's limits.
    ///
    /// # Errors
    /// When the device list itself cannot be read.
    pub fn new(backend: B) -> Result<Self, DeviceError> {
        Self::with_clock(backend, Box::new(SystemClock), SanityLimits::from_system())
    }

    /// Enumerates the backend's devices with an explicit clock and limits.
    ///
    /// # Errors
    /// When the device list itself cannot be read.
    pub fn with_clock(
        mut backend: B,
        clock: Box<dyn Clock>,
        limits: SanityLimits,
    ) -> Result<Self, DeviceError> {
        let driver = Arc::new(backend.driver());
        let Enumeration { devices, unopened } = backend.enumerate()?;
        for device in &unopened {
            tracing::warn!(index = device.index, reason = %device.reason, "Could not open a GPU.");
        }
        Ok(Self {
            backend,
            clock,
            limits,
            driver,
            devices: devices.into_iter().map(Arc::new).collect(),
            unopened,
            session_lost: None,
        })
    }

    /// The devices found at construction.
    pub fn devices(&self) -> &[Arc<DeviceInfo>] {
        &self.devices
    }

    /// The devices the driver counts that could not be opened, with the reason.
    pub fn unopened(&self) -> &[UnopenedDevice] {
        &self.unopened
    }

    /// The driver stack's versions.
    pub fn driver(&self) -> &Arc<DriverInfo> {
        &self.driver
    }

    /// Asks the driver for the CUDA driver version and adds it to [`driver`](Self::driver)
    /// for the snapshots that follow (slow: NVML loads the CUDA library to answer).
    pub fn read_cuda_driver_version(&mut self) {
        let cuda_driver_version = self.backend.cuda_driver_version();
        self.driver = Arc::new(DriverInfo {
            cuda_driver_version,
            ..(*self.driver).clone()
        });
    }

    /// The backend, for calls the sampler does not make itself.
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Why the backend's session no longer works (the driver was reloaded or went away),
    /// once a call of a tick said so ([`DeviceError::SessionLost`]): nothing this sampler
    /// reads will work again, and its owner should start a new one.
    pub fn session_lost(&self) -> Option<&str> {
        self.session_lost.as_deref()
    }

    /// Reads every device once.
    pub fn tick(&mut self) -> Snapshot {
        let now = self.clock.now();
        self.rediscover_if_changed();
        self.backend.begin_tick(now);
        let mut devices = Vec::with_capacity(self.devices.len());
        for info in &self.devices {
            let state = match self.backend.read(info) {
                Ok(mut reading) => {
                    sanitize(&mut reading, self.limits);
                    DeviceState::Ok(reading)
                }
                Err(DeviceError::Lost(reason)) => DeviceState::Lost { reason },
                Err(DeviceError::SessionLost(reason)) => {
                    self.session_lost.get_or_insert_with(|| reason.clone());
                    DeviceState::Error { reason }
                }
                Err(DeviceError::Failed(reason)) => DeviceState::Error { reason },
            };
            devices.push(DeviceSnapshot {
                info: Arc::clone(info),
                state,
            });
        }
        Snapshot {
            taken_at_unix_ms: now.unix_ms,
            monotonic_ms: now.monotonic_ms,
            driver: Arc::clone(&self.driver),
            devices,
            unopened: self.unopened.clone(),
        }
    }

    /// Re-enumerates when the driver's device count changed (a GPU bound or unbound).
    fn rediscover_if_changed(&mut self) {
        let known = self.devices.len() + self.unopened.len();
        let count = match self.backend.device_count() {
            Ok(count) => count,
            Err(DeviceError::SessionLost(reason)) => {
                self.session_lost.get_or_insert(reason);
                return;
            }
            Err(_) => return,
        };
        if usize::try_from(count).is_ok_and(|c| c == known) {
            return;
        }
        match self.backend.enumerate() {
            Ok(Enumeration { devices, unopened }) => {
                tracing::warn!(
                    before = known,
                    now = count,
                    "The number of GPUs changed; re-reading them."
                );
                self.devices = devices.into_iter().map(Arc::new).collect();
                self.unopened = unopened;
            }
            Err(err) => tracing::warn!(error = %err, "Could not re-read the GPUs."),
        }
    }

    /// Full diagnostics of every device, each with its own outcome.
    pub fn diagnostics(
        &mut self,
    ) -> Vec<(Arc<DeviceInfo>, Result<DeviceDiagnostics, DeviceError>)> {
        let mut out = Vec::with_capacity(self.devices.len());
        for info in &self.devices {
            let mut result = self.backend.diagnostics(info);
            if let Ok(diag) = result.as_mut() {
                check_diagnostics_memory(diag);
            }
            out.push((Arc::clone(info), result));
        }
        out
    }

    /// How every two of the given devices connect (`vramctl info`'s matrix, `doctor`), lower
    /// index first, from their [`diagnostics`](Self::diagnostics): the backend's
    /// [`gpu_pair`](Backend::gpu_pair) facts and the NVLinks between them counted from the
    /// first one's links. A pair the backend has no facts for, or with a device it cannot
    /// reach (that device's own state says why), is left out; so is everything with fewer
    /// than two devices.
    pub fn gpu_pairs(
        &mut self,
        devices: &[(Arc<DeviceInfo>, Result<DeviceDiagnostics, DeviceError>)],
    ) -> Vec<GpuPair> {
        let mut sorted: Vec<&(Arc<DeviceInfo>, Result<DeviceDiagnostics, DeviceError>)> =
            devices.iter().collect();
        sorted.sort_by_key(|(info, _)| info.index);
        let mut pairs = Vec::new();
        for (i, (first, first_diag)) in sorted.iter().enumerate() {
            for (second, _) in sorted.iter().skip(i + 1) {
                let facts = match self.backend.gpu_pair(first, second) {
                    Ok(Some(facts)) => facts,
                    Ok(None) => continue,
                    Err(err) => {
                        tracing::debug!(
                            first = first.index,
                            second = second.index,
                            error = %err,
                            "No topology facts for a pair of GPUs."
                        );
                        continue;
                    }
                };
                let links = first_diag
                    .as_ref()
                    .ok()
                    .and_then(DeviceDiagnostics::nvlinks_known);
                let nvlinks =
                    nvlinks_between(links, second.pci_bus_id.as_deref(), facts.p2p_nvlink);
                pairs.push(GpuPair {
                    gpus: [first.index, second.index],
                    uuids: [first.uuid.clone(), second.uuid.clone()],
                    facts,
                    nvlinks,
                });
            }
        }
        pairs
    }
}

/// Consecutive ticks in which every device fails before the session is reopened.
///
/// A driver reloaded or a GPU reset under a running process leaves its NVML session
/// answering errors for good; only a new session (shut down, init, enumerate) reads the
/// devices again. One or two bad ticks in a row are ridden out (a driver busy recovering
/// one GPU, an Xid storm); three at the default 1 s interval reopen within 3 s. Reopening
/// costs one `nvmlInit` (93 ms on an H200) and loses nothing, and repeats back off (see
/// [`SessionHealth`]), so a permanently lost GPU is reopened at most every 5 minutes.
pub const REOPEN_AFTER_FAILING_TICKS: u32 = 3;

/// Why a session should be reopened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReopenReason {
    /// The library said its session is gone (`UNINITIALIZED`, `DRIVER_NOT_LOADED`).
    SessionLost,
    /// Every device failed for [`REOPEN_AFTER_FAILING_TICKS`] ticks.
    DevicesFailing,
}

impl ReopenReason {
    /// A short, fixed name, fit for a metric label: `session_lost`, `devices_failing`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SessionLost => "session_lost",
            Self::DevicesFailing => "devices_failing",
        }
    }

    /// Every reason, for counters that start at 0.
    pub const ALL: [Self; 2] = [Self::SessionLost, Self::DevicesFailing];
}

/// Decides, tick by tick, when a daemon should reopen its NVML session: at once when the
/// session says it is gone, after [`REOPEN_AFTER_FAILING_TICKS`] ticks in which every
/// device failed otherwise. Reopens that do not bring a device back wait longer each time
/// (`first_backoff` doubling up to `max_backoff`, on the snapshots' monotonic clock), so a
/// host whose only GPU is lost for good is not reopened every few seconds.
#[derive(Debug, Clone)]
pub struct SessionHealth {
    failing_ticks: u32,
    first_backoff_ms: i64,
    max_backoff_ms: i64,
    backoff_ms: i64,
    not_before_ms: Option<i64>,
}

impl SessionHealth {
    /// A watch whose reopens back off from `first_backoff_ms` to `max_backoff_ms`.
    pub fn new(first_backoff_ms: i64, max_backoff_ms: i64) -> Self {
        let first = first_backoff_ms.max(1);
        Self {
            failing_ticks: 0,
            first_backoff_ms: first,
            max_backoff_ms: max_backoff_ms.max(first),
            backoff_ms: first,
            not_before_ms: None,
        }
    }

    /// Looks at one tick: its snapshot, and whether the sampler's session said it is lost
    /// ([`Sampler::session_lost`]). Whether to reopen the session now, and why.
    pub fn check(&mut self, snapshot: &Snapshot, session_lost: bool) -> Option<ReopenReason> {
        let answered = snapshot.devices.iter().any(|d| d.reading().is_some());
        if answered {
            self.failing_ticks = 0;
            self.backoff_ms = self.first_backoff_ms;
            self.not_before_ms = None;
        } else if !snapshot.devices.is_empty() {
            self.failing_ticks = self.failing_ticks.saturating_add(1);
        }
        let reason = if session_lost {
            ReopenReason::SessionLost
        } else if self.failing_ticks >= REOPEN_AFTER_FAILING_TICKS {
            ReopenReason::DevicesFailing
        } else {
            return None;
        };
        let now = snapshot.monotonic_ms;
        if self.not_before_ms.is_some_and(|t| now < t) {
            return None;
        }
        self.not_before_ms = Some(now.saturating_add(self.backoff_ms));
        self.backoff_ms = self.backoff_ms.saturating_mul(2).min(self.max_backoff_ms);
        self.failing_ticks = 0;
        Some(reason)
    }
}

/// `info` reports memory too; hold it to the same rule as a tick.
fn check_diagnostics_memory(diag: &mut DeviceDiagnostics) {
    let mut reading = vramctl_core::types::DeviceReading {
        memory: diag.memory,
        ..Default::default()
    };
    sanitize(
        &mut reading,
        SanityLimits {
            pid_max: vramctl_core::sanity::PID_MAX_LIMIT,
        },
    );
    if reading.memory.is_none() && diag.memory.is_some() {
        diag.memory = None;
        if let Some(why) = reading.missing.remove(&Field::Memory) {
            diag.missing.insert("memory".into(), why);
        } else {
            diag.missing
                .insert("memory".into(), Unavailable::Insane("dropped".into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramctl_core::types::DeviceReading;

    fn tick(monotonic_ms: i64, ok: bool) -> Snapshot {
        let info = Arc::new(DeviceInfo::new(0, "GPU-a"));
        Snapshot {
            taken_at_unix_ms: monotonic_ms,
            monotonic_ms,
            driver: Arc::default(),
            devices: vec![DeviceSnapshot {
                info,
                state: if ok {
                    DeviceState::Ok(DeviceReading::default())
                } else {
                    DeviceState::Lost {
                        reason: "GPU lost".into(),
                    }
                },
            }],
            unopened: Vec::new(),
        }
    }

    #[test]
    fn a_session_is_reopened_when_lost_or_after_three_failing_ticks_backing_off() {
        let mut health = SessionHealth::new(1000, 4000);
        assert_eq!(
            health.check(&tick(0, true), true),
            Some(ReopenReason::SessionLost)
        );
        // Every device failing: the third tick in a row reopens.
        let decisions: Vec<Option<ReopenReason>> = (1..=3)
            .map(|i| health.check(&tick(i * 100, false), false))
            .collect();
        assert_eq!(decisions, [None, None, None], "within the first backoff");
        let later: Vec<Option<ReopenReason>> = (0..3)
            .map(|i| health.check(&tick(1_500 + i * 100, false), false))
            .collect();
        assert_eq!(later, [Some(ReopenReason::DevicesFailing), None, None]);
        // Still failing after that reopen: the next waits 2 s, then 4 s (the cap).
        assert_eq!(health.check(&tick(3_400, false), false), None);
        assert_eq!(
            health.check(&tick(3_500, false), false),
            Some(ReopenReason::DevicesFailing)
        );
        // A device answering resets it all.
        assert_eq!(health.check(&tick(3_600, true), false), None);
        let again: Vec<Option<ReopenReason>> = (0..3)
            .map(|i| health.check(&tick(3_700 + i, false), false))
            .collect();
        assert_eq!(again, [None, None, Some(ReopenReason::DevicesFailing)]);
    }
}
