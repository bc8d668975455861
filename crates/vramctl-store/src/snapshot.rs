//! From the sampler's [`Snapshot`] to the store's observations.

use vramctl_agent::agent_poll::AgentFigures;
use vramctl_core::types::{DeviceState, Field, Snapshot, Unavailable};

use crate::model::{
    AgentBytes, DeviceMeta, DeviceSample, DeviceSampleState, Metric, Observed, ProcessList,
    ProcessOnDevice,
};

/// Puts the agents' figures (`vramctl_agent::agent_poll::figures`, by GPU UUID and PID) on
/// the processes of `devices`; a process without an entry keeps `agent: None` (its
/// allocated and reserved series stop).
pub fn add_agent_figures(devices: &mut [DeviceSample], figures: &AgentFigures) {
    if figures.is_empty() {
        return;
    }
    for device in devices {
        let DeviceSampleState::Read {
            processes: ProcessList::Observed(list),
            ..
        } = &mut device.state
        else {
            continue;
        };
        for p in list {
            p.agent = figures
                .get(&(device.device.uuid.clone(), p.pid))
                .map(|m| AgentBytes {
                    allocated_bytes: m.allocated_bytes,
                    reserved_bytes: m.reserved_bytes,
                });
        }
    }
}

/// What a snapshot observed of each device (and each MIG instance, as a device whose
/// `parent_uuid` is its GPU). Everything a device did not report becomes a
/// [`Observed::Missing`] with the driver's reason.
pub fn device_samples(snapshot: &Snapshot) -> Vec<DeviceSample> {
    let mut out = Vec::with_capacity(snapshot.devices.len());
    for device in &snapshot.devices {
        let info = &device.info;
        let meta = DeviceMeta {
            uuid: info.uuid.clone(),
            index: Some(info.index),
            name: info.name.clone(),
            pci_bus_id: info.pci_bus_id.clone(),
            parent_uuid: None,
        };
        let reading = match &device.state {
            DeviceState::Ok(reading) => reading,
            DeviceState::Lost { reason } => {
                out.push(DeviceSample {
                    device: meta,
                    state: DeviceSampleState::Unreadable(format!("GPU lost: {reason}")),
                });
                continue;
            }
            DeviceState::Error { reason } => {
                out.push(DeviceSample {
                    device: meta,
                    state: DeviceSampleState::Unreadable(reason.clone()),
                });
                continue;
            }
        };
        let why = |field: Field| {
            reading
                .missing
                .get(&field)
                .map_or_else(|| "not reported".to_owned(), Unavailable::to_string)
        };
        let value = |v: Option<u64>, field: Field| {
            v.map_or_else(|| Observed::Missing(why(field)), Observed::Value)
        };
        let memory = reading.memory;
        let mut metrics = vec![
            (
                Metric::UsedBytes,
                value(memory.map(|m| m.used_bytes), Field::Memory),
            ),
            (
                Metric::ReservedBytes,
                value(memory.map(|m| m.reserved_bytes), Field::Memory),
            ),
            (
                Metric::FreeBytes,
                value(memory.map(|m| m.free_bytes), Field::Memory),
            ),
            (
                Metric::TotalBytes,
                value(memory.map(|m| m.total_bytes), Field::Memory),
            ),
        ];
        metrics.extend([
            (
                Metric::UtilizationGpuPercent,
                value(
                    reading.utilization_gpu_percent.map(u64::from),
                    Field::Utilization,
                ),
            ),
            (
                Metric::UtilizationMemoryPercent,
                value(
                    reading.utilization_memory_percent.map(u64::from),
                    Field::Utilization,
                ),
            ),
            (
                Metric::TemperatureC,
                value(reading.temperature_c.map(u64::from), Field::Temperature),
            ),
            (
                Metric::PowerMw,
                value(reading.power_mw.map(u64::from), Field::Power),
            ),
        ]);
        let processes = match &reading.processes {
            Some(list) => ProcessList::Observed(
                list.iter()
                    .map(|p| ProcessOnDevice {
                        pid: p.pid,
                        used_bytes: p.used_bytes,
                        sm_percent: reading
                            .process_activity
                            .as_ref()
                            .and_then(|a| a.iter().find(|a| a.pid == p.pid))
                            .map(|a| a.sm_percent),
                        agent: None,
                    })
                    .collect(),
            ),
            None => ProcessList::Missing(
                reading
                    .missing
                    .get(&Field::ComputeProcesses)
                    .or_else(|| reading.missing.get(&Field::GraphicsProcesses))
                    .map_or_else(|| "not reported".to_owned(), Unavailable::to_string),
            ),
        };
        out.push(DeviceSample {
            device: meta,
            state: DeviceSampleState::Read { metrics, processes },
        });
        for mig in &info.mig_instances {
            let memory = reading.mig_memory(&mig.uuid);
            let why = || why(Field::MigMemory);
            let value =
                |v: Option<u64>| v.map_or_else(|| Observed::Missing(why()), Observed::Value);
            out.push(DeviceSample {
                device: DeviceMeta {
                    uuid: mig.uuid.clone(),
                    index: None,
                    name: mig.name.clone(),
                    pci_bus_id: None,
                    parent_uuid: Some(info.uuid.clone()),
                },
                state: DeviceSampleState::Read {
                    metrics: vec![
                        (Metric::UsedBytes, value(memory.map(|m| m.used_bytes))),
                        (
                            Metric::ReservedBytes,
                            value(memory.map(|m| m.reserved_bytes)),
                        ),
                        (Metric::FreeBytes, value(memory.map(|m| m.free_bytes))),
                        (Metric::TotalBytes, value(memory.map(|m| m.total_bytes))),
                    ],
                    processes: ProcessList::NotObserved,
                },
            });
        }
    }
    out
}
