//! Who holds memory on which GPU in one snapshot, by PID: what `ps`, `kill`, `reap` and the
//! release check after a kill read from a snapshot.

use std::collections::BTreeMap;

use serde::Serialize;
use vramctl_core::types::{ProcessKind, Snapshot};

use crate::gpu_selection::GpuFilter;

/// One process's memory on one device, from one snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuHolding {
    /// NVML index of the device.
    pub index: u32,
    /// The device's UUID.
    pub uuid: String,
    /// Memory the driver attributes to the process there; `None`: not available.
    pub used_bytes: Option<u64>,
    /// Which process list named it.
    pub kind: ProcessKind,
    /// MIG GPU instance.
    pub gpu_instance_id: Option<u32>,
    /// MIG compute instance.
    pub compute_instance_id: Option<u32>,
    /// The MIG device's UUID, when the process runs in one.
    pub mig_uuid: Option<String>,
}

/// Who holds memory in `snapshot`, by PID, each PID's devices in index order; only devices
/// `filter` chose.
pub fn holdings(snapshot: &Snapshot, filter: &GpuFilter) -> BTreeMap<u32, Vec<GpuHolding>> {
    let mut by_pid: BTreeMap<u32, Vec<GpuHolding>> = BTreeMap::new();
    for device in snapshot.devices.iter().filter(|d| filter.matches(&d.info)) {
        let Some(processes) = device.reading().and_then(|r| r.processes.as_ref()) else {
            continue;
        };
        for p in processes {
            let mig_uuid = p.gpu_instance_id.and_then(|gi| {
                device
                    .info
                    .mig_instances
                    .iter()
                    .find(|m| {
                        m.gpu_instance_id == Some(gi)
                            && (p.compute_instance_id.is_none()
                                || m.compute_instance_id == p.compute_instance_id)
                    })
                    .map(|m| m.uuid.clone())
            });
            by_pid.entry(p.pid).or_default().push(GpuHolding {
                index: device.info.index,
                uuid: device.info.uuid.clone(),
                used_bytes: p.used_bytes,
                kind: p.kind,
                gpu_instance_id: p.gpu_instance_id,
                compute_instance_id: p.compute_instance_id,
                mig_uuid,
            });
        }
    }
    by_pid
}

/// The sum of `holdings`, `None` when any is unknown.
pub fn total_bytes(holdings: &[GpuHolding]) -> Option<u64> {
    holdings
        .iter()
        .try_fold(0_u64, |sum, h| Some(sum.saturating_add(h.used_bytes?)))
}
