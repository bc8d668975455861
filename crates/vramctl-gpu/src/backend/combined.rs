//! Several backends as one: NVML's GPUs and the DRM backend's beside them in one run (an
//! NVIDIA card next to an integrated Intel GPU), so every command sees both.
//!
//! Indices stay stable: the first backend's devices keep their own indices (NVML's, as
//! before), each later backend's follow after everything the earlier ones count (opened
//! or not). A device is routed back to its backend by its UUID or stable id.

use std::collections::HashMap;
use std::path::Path;

use super::{Backend, DeviceError, Enumeration};
use vramctl_core::clock::ClockTime;
use vramctl_core::topology::PairFacts;
use vramctl_core::types::{
    DeviceDiagnostics, DeviceHealth, DeviceInfo, DeviceReading, DriverInfo, UnopenedDevice,
};

/// Backends read together, in order.
pub struct CombinedBackend {
    parts: Vec<Box<dyn Backend>>,
    /// Combined device → (backend, the device as that backend knows it).
    routes: HashMap<String, (usize, DeviceInfo)>,
}

impl std::fmt::Debug for CombinedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CombinedBackend")
            .field("parts", &self.parts.len())
            .field("devices", &self.routes.len())
            .finish()
    }
}

impl CombinedBackend {
    /// `parts` in index order (NVML first, so its indices do not move).
    pub fn new(parts: Vec<Box<dyn Backend>>) -> Self {
        Self {
            parts,
            routes: HashMap::new(),
        }
    }

    fn route(
        &mut self,
        device: &DeviceInfo,
    ) -> Result<(&mut dyn Backend, DeviceInfo), DeviceError> {
        let (part, inner) = self
            .routes
            .get(&device.uuid)
            .cloned()
            .ok_or_else(|| DeviceError::Failed(format!("unknown device '{}'", device.uuid)))?;
        let backend = self
            .parts
            .get_mut(part)
            .ok_or_else(|| DeviceError::Failed(format!("unknown device '{}'", device.uuid)))?;
        Ok((backend.as_mut(), inner))
    }
}

impl Backend for CombinedBackend {
    fn driver(&mut self) -> DriverInfo {
        // The first backend with a driver version speaks for the stack (NVML's when present).
        let mut out = DriverInfo::default();
        for part in &mut self.parts {
            let d = part.driver();
            if out.driver_version.is_none() {
                out.driver_version = d.driver_version;
            }
            if out.nvml_version.is_none() {
                out.nvml_version = d.nvml_version;
            }
        }
        out
    }

    fn cuda_driver_version(&mut self) -> Option<String> {
        self.parts.iter_mut().find_map(|p| p.cuda_driver_version())
    }

    fn enumerate(&mut self) -> Result<Enumeration, DeviceError> {
        self.routes.clear();
        let mut out = Enumeration::default();
        let mut base: u32 = 0;
        let mut first_error = None;
        let mut any_ok = false;
        for (part, backend) in self.parts.iter_mut().enumerate() {
            let Enumeration { devices, unopened } = match backend.enumerate() {
                Ok(e) => {
                    any_ok = true;
                    e
                }
                Err(err) => {
                    first_error.get_or_insert(err);
                    continue;
                }
            };
            let mut next = base;
            for inner in devices {
                let mut outer = inner.clone();
                outer.index = base.saturating_add(inner.index);
                next = next.max(outer.index.saturating_add(1));
                self.routes.insert(outer.uuid.clone(), (part, inner));
                out.devices.push(outer);
            }
            for u in unopened {
                let index = base.saturating_add(u.index);
                next = next.max(index.saturating_add(1));
                out.unopened.push(UnopenedDevice {
                    index,
                    reason: u.reason,
                });
            }
            base = next;
        }
        match first_error {
            Some(err) if !any_ok => Err(err),
            _ => Ok(out),
        }
    }

    fn device_count(&mut self) -> Result<u32, DeviceError> {
        let mut total: u32 = 0;
        let mut first_error = None;
        for part in &mut self.parts {
            match part.device_count() {
                Ok(n) => total = total.saturating_add(n),
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        // One backend that cannot count now would read as its GPUs gone (a re-enumeration
        // without them): the tick keeps the devices it knows instead.
        match first_error {
            Some(err) => Err(err),
            None => Ok(total),
        }
    }

    fn begin_tick(&mut self, now: ClockTime) {
        for part in &mut self.parts {
            part.begin_tick(now);
        }
    }

    fn read(&mut self, device: &DeviceInfo) -> Result<DeviceReading, DeviceError> {
        let (backend, inner) = self.route(device)?;
        backend.read(&inner)
    }

    fn diagnostics(&mut self, device: &DeviceInfo) -> Result<DeviceDiagnostics, DeviceError> {
        let (backend, inner) = self.route(device)?;
        backend.diagnostics(&inner)
    }

    fn health(&mut self, device: &DeviceInfo) -> Result<Option<DeviceHealth>, DeviceError> {
        let (backend, inner) = self.route(device)?;
        backend.health(&inner)
    }

    fn gpu_pair(
        &mut self,
        first: &DeviceInfo,
        second: &DeviceInfo,
    ) -> Result<Option<PairFacts>, DeviceError> {
        // Two devices of different backends (an NVIDIA card and an Intel iGPU) have no
        // facts in common.
        let (Some((a, first)), Some((b, second))) = (
            self.routes.get(&first.uuid).cloned(),
            self.routes.get(&second.uuid).cloned(),
        ) else {
            return Ok(None);
        };
        match self.parts.get_mut(a) {
            Some(part) if a == b => part.gpu_pair(&first, &second),
            _ => Ok(None),
        }
    }

    fn process_name(&mut self, pid: u32) -> Option<String> {
        self.parts.iter_mut().find_map(|p| p.process_name(pid))
    }

    fn set_read_process_activity(&mut self, on: bool) {
        for part in &mut self.parts {
            part.set_read_process_activity(on);
        }
    }

    fn set_reuse_process_lists(&mut self, on: bool) {
        for part in &mut self.parts {
            part.set_reuse_process_lists(on);
        }
    }

    fn reuses_process_lists(&self) -> bool {
        self.parts.iter().any(|p| p.reuses_process_lists())
    }

    fn reads_process_activity(&self) -> bool {
        self.parts.iter().any(|p| p.reads_process_activity())
    }

    fn library(&self) -> Option<&Path> {
        self.parts.iter().find_map(|p| p.library())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::drm::DrmBackend;
    use std::path::PathBuf;
    use vramctl_core::clock::ClockTime;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/drm")
            .join(name)
    }

    #[test]
    fn later_backends_follow_with_their_own_devices_routed_back() {
        let mut both = CombinedBackend::new(vec![
            Box::new(DrmBackend::with_root(fixture("i915"))),
            Box::new(DrmBackend::with_root(fixture("amdgpu-dgpu"))),
        ]);
        let e = both.enumerate().unwrap();
        let ids: Vec<(u32, &str)> = e
            .devices
            .iter()
            .map(|d| (d.index, d.uuid.as_str()))
            .collect();
        assert_eq!(
            ids,
            [(0, "PCI-8086-0000:00:02.0"), (1, "PCI-1002-0000:04:00.0")]
        );
        assert_eq!(both.device_count().unwrap(), 2);
        both.begin_tick(ClockTime {
            unix_ms: 0,
            monotonic_ms: 0,
        });
        // Index 1 here is index 0 of the second backend: read through it, not the first.
        let amd = both.read(&e.devices[1]).unwrap();
        assert_eq!(amd.utilization_gpu_percent, Some(97));
        let intel = both.read(&e.devices[0]).unwrap();
        assert_eq!(intel.memory, None);
    }

    #[test]
    fn one_backend_losing_its_device_leaves_the_other_reading() {
        let dir = crate::backend::drm::tests::scratch("amdgpu-dgpu");
        let mut both = CombinedBackend::new(vec![
            Box::new(DrmBackend::with_root(fixture("i915"))),
            Box::new(DrmBackend::with_root(dir.path())),
        ]);
        let e = both.enumerate().unwrap();
        std::fs::remove_file(dir.path().join("sys/class/drm/card0")).unwrap();
        assert!(matches!(
            both.read(&e.devices[1]),
            Err(DeviceError::Lost(_))
        ));
        assert!(both.read(&e.devices[0]).is_ok());
        assert_eq!(both.device_count().unwrap(), 1);
    }

    #[test]
    fn an_unknown_device_is_an_error_not_a_panic() {
        let mut both = CombinedBackend::new(vec![Box::new(DrmBackend::with_root(fixture("i915")))]);
        let mut stranger = both.enumerate().unwrap().devices.remove(0);
        stranger.uuid = "PCI-1002-0000:09:00.0".into();
        assert!(matches!(both.read(&stranger), Err(DeviceError::Failed(_))));
    }
}
