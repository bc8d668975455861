//! One [`Snapshot`] per tick from a [`Backend`], whatever the devices do.
//!
//! Static facts are read once at construction and shared (`Arc`) by every snapshot. A
//! device that fails this tick is recorded as lost or failed in the snapshot; it never
//! fails the tick, and the other devices still report.

use std::sync::Arc;

use crate::backend::{Backend, DeviceError, Enumeration};
use crate::clock::{Clock, SystemClock};
use crate::sanity::{SanityLimits, sanitize};
use crate::types::{
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
}

/// `info` reports memory too; hold it to the same rule as a tick.
fn check_diagnostics_memory(diag: &mut DeviceDiagnostics) {
    let mut reading = crate::types::DeviceReading {
        memory: diag.memory,
        ..Default::default()
    };
    sanitize(
        &mut reading,
        SanityLimits {
            pid_max: crate::sanity::PID_MAX_LIMIT,
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
