//! A recorded history played back as a GPU backend.
//!
//! [`Store::moment_at_or_before`] rebuilds what the recorder saw at one stored time — every
//! device's reading (memory, utilization, temperature, power, its processes and their SM
//! activity, MIG instances' memory), the device states (a device lost or unreadable is a
//! gap with its reason), the missing values with their reasons (gaps again), and who the
//! processes were (the metadata the recorder stored once per identity). [`ReplayBackend`]
//! serves that moment through `vramctl_gpu::Backend`, so a frontend reads a recording
//! exactly as it reads NVML (`vramctl status --replay DB --at TIME`); [`RecordedProcesses`]
//! answers who a PID was, as the process catalog does live.
//!
//! What a history does not keep is not invented, and a frontend must show it as not
//! reported: the driver's versions (the backend reports none), the list a process came
//! from (compute or graphics: every [`ProcessUsage::kind`] here is `Compute`, a placeholder
//! the type requires), MIG GPU and compute instance ids (`None`), entries the sampler
//! dropped as insane (none), devices that could not be opened (none), the reasons of
//! missing values that have no series (per-process utilization, the graphics list), and
//! what /proc said beyond user, command line and container (state, parent, threads,
//! resident memory, the start as wall time).
//!
//! The store crate implements core's trait here: core may not depend on the store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use vramctl_core::types::{
    DeviceDiagnostics, DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, Field,
    MemoryReading, MigInstanceInfo, MigReading, ProcessActivity, ProcessKind, ProcessUsage,
    Unavailable,
};
use vramctl_gpu::backend::{Backend, DeviceError, Enumeration};
use vramctl_procs::process_catalog::StaticFacts;
use vramctl_procs::procinfo::ContainerInfo;

use crate::codec::Entry;
use crate::db::Store;
use crate::error::StoreError;
use crate::model::{DeviceRecord, Gap, Metric, ProcessRecord, TimeRange};
use crate::query::SeriesRef;

/// One recorded moment: what the recorder saw at one stored time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedMoment {
    /// The stored time (a sample's, or a bucket's start where only downsampled data is
    /// left).
    pub at_unix_ms: i64,
    /// 0 for a raw sample, else the length of the bucket the values stand for (each value
    /// is then the bucket's last).
    pub span_ms: i64,
    /// The GPUs recorded at that time (MIG instances under their GPU), in index order.
    pub devices: Vec<DeviceSnapshot>,
    /// The processes listed on a device at that time, by PID.
    pub processes: BTreeMap<u32, RecordedProcess>,
}

/// A process as the history knows it at a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedProcess {
    /// Its identity and metadata (stored once, at first sight).
    pub record: ProcessRecord,
    /// Its CPU time at the moment (clock ticks), when recorded.
    pub cpu_ticks: Option<u64>,
}

impl RecordedProcess {
    /// Whether the recorder saw it in /proc (then it knew its start time); a process it
    /// could not see is named by the driver only.
    pub fn visible(&self) -> bool {
        self.record.meta.key.start_time_ticks.is_some()
    }

    /// What the recorder knew about it, as the live process catalog says it: user, command
    /// line, container. What the history does not keep (`comm`, the start as wall time)
    /// is `None`.
    pub fn facts(&self) -> StaticFacts {
        let meta = &self.record.meta;
        StaticFacts {
            uid: meta.uid,
            user: meta.user.clone(),
            command: meta.command.clone(),
            comm: None,
            // What the history keeps of a process's container; a fact it does not keep
            // (the cgroup path, ...) stays unknown, so a new fact needs no change here.
            container: ContainerInfo {
                container_id: meta.container_id.clone(),
                pod_uid: meta.pod_uid.clone(),
                ..ContainerInfo::default()
            },
            started_at_unix_ms: None,
            kernel_thread: false,
        }
    }
}

/// The last value of an entry (a bucket's latest).
fn last(entry: Entry) -> Option<u64> {
    entry.min_max_last().map(|(_, _, last)| last)
}

impl Store {
    /// The latest recorded moment at or before `t_ms` (a stored time that cannot be decoded,
    /// before the first key frame retention left, is skipped for the one before it).
    ///
    /// # Errors
    /// When SQLite fails or a frame is damaged.
    pub fn moment_at_or_before(&mut self, t_ms: i64) -> Result<Option<RecordedMoment>, StoreError> {
        let mut t = t_ms;
        while let Some(found) = self.time_at_or_before(t)? {
            if let Some(moment) = self.moment_at(found)? {
                return Ok(Some(moment));
            }
            t = found - 1;
        }
        Ok(None)
    }

    /// The recorded moment at stored time `t` exactly; `None` when no frame at `t` can be
    /// decoded.
    ///
    /// # Errors
    /// When SQLite fails or a frame is damaged.
    pub fn moment_at(&mut self, t: i64) -> Result<Option<RecordedMoment>, StoreError> {
        let mut at: Option<(i64, Vec<(SeriesRef, Entry)>)> = None;
        self.scan(
            TimeRange {
                from_ms: t,
                to_ms: t,
            },
            |frame| {
                if frame.t_ms == t {
                    at = Some((frame.span_ms, frame.iter().collect()));
                }
            },
        )?;
        let Some((span_ms, entries)) = at else {
            return Ok(None);
        };
        let gaps: Vec<Gap> = self
            .gaps(TimeRange {
                from_ms: t,
                to_ms: t,
            })?
            .into_iter()
            .filter(|g| g.from_ms <= t && (g.open || t < g.to_ms))
            .collect();
        let records = self.devices()?;

        // Values by device, and by process on a device.
        let mut by_device: BTreeMap<i64, HashMap<Metric, Entry>> = BTreeMap::new();
        let mut by_process: BTreeMap<(i64, i64), HashMap<Metric, Entry>> = BTreeMap::new();
        let mut cpu_now: HashMap<i64, u64> = HashMap::new();
        for (series, entry) in &entries {
            match (series.device_id, series.process_id) {
                (Some(d), None) => {
                    by_device
                        .entry(d)
                        .or_default()
                        .insert(series.metric, *entry);
                }
                (Some(d), Some(p)) => {
                    by_process
                        .entry((d, p))
                        .or_default()
                        .insert(series.metric, *entry);
                }
                (None, Some(p)) if series.metric == Metric::ProcessCpuTicks => {
                    if let Some(v) = last(*entry) {
                        cpu_now.insert(p, v);
                    }
                }
                _ => {}
            }
        }

        // Who the processes are.
        let mut ids: Vec<i64> = by_process.keys().map(|&(_, p)| p).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut pids: HashMap<i64, u32> = HashMap::new();
        let mut processes = BTreeMap::new();
        for id in ids {
            let Some(record) = self.process(id)? else {
                continue;
            };
            let pid = record.meta.key.pid;
            pids.insert(id, pid);
            processes.insert(
                pid,
                RecordedProcess {
                    record,
                    cpu_ticks: cpu_now.get(&id).copied(),
                },
            );
        }

        let shape = Shape {
            records: &records,
            by_device: &by_device,
            by_process: &by_process,
            pids: &pids,
            gaps: &gaps,
        };
        // A gap over everything: NVML did not start, the writer fell behind.
        let global_gap = gaps
            .iter()
            .find(|g| g.device_uuid.is_none() && g.metric.is_none());
        let mut devices = Vec::new();
        let no_values = HashMap::new();
        for (position, record) in records.iter().enumerate() {
            if record.meta.parent_uuid.is_some() || record.first_seen_ms > t {
                continue;
            }
            let info = Arc::new(shape.device_info(record, position));
            let on_device = |g: &&Gap| {
                g.device_uuid
                    .as_deref()
                    .is_some_and(|u| u.eq_ignore_ascii_case(&record.meta.uuid))
            };
            let device_gap = gaps.iter().filter(on_device).find(|g| g.metric.is_none());
            // A device whose every value is missing has no series, only metric gaps
            // (which stay open while the whole device is unreadable, so they come last).
            let only_gaps = gaps.iter().filter(on_device).any(|g| g.metric.is_some());
            let metrics = match (by_device.get(&record.id), device_gap.or(global_gap)) {
                (Some(metrics), _) => metrics,
                (None, Some(gap)) => {
                    let state = match gap.reason.strip_prefix("GPU lost") {
                        Some(rest) => DeviceState::Lost {
                            reason: rest.trim_start_matches(": ").to_owned(),
                        },
                        None => DeviceState::Error {
                            reason: gap.reason.clone(),
                        },
                    };
                    devices.push(DeviceSnapshot { info, state });
                    continue;
                }
                (None, None) if only_gaps => &no_values,
                // Not recorded at this time (another session's device).
                (None, None) => continue,
            };
            let state = DeviceState::Ok(shape.reading(record, metrics));
            devices.push(DeviceSnapshot { info, state });
        }
        devices.sort_by_key(|d| d.info.index);
        Ok(Some(RecordedMoment {
            at_unix_ms: t,
            span_ms,
            devices,
            processes,
        }))
    }
}

/// Where a time asked for falls in a history ([`Store::moment_near`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MomentLookup {
    /// The moment to show.
    Found(Box<RecordedMoment>),
    /// The history holds no sample at all.
    Empty,
    /// Before the first sample, at `first_ms`.
    BeforeFirst {
        /// The first stored time.
        first_ms: i64,
    },
    /// After the last sample, at `last_ms`, by more than [`STALE_SPACINGS`] spacings.
    AfterLast {
        /// The last stored time.
        last_ms: i64,
    },
    /// Inside a stretch with no samples: the recording stopped at `stops_ms` and resumed at
    /// `resumes_ms`.
    InGap {
        /// The last stored time before the time asked for.
        stops_ms: i64,
        /// The first stored time after it.
        resumes_ms: i64,
    },
}

/// How many of the recording's own sample spacings (the time between the sample found and
/// the one before it, or a bucket's length) a moment may lie before the time asked for and
/// still stand for it. One spacing is when the next sample is due; the second lets a tick
/// that was taken or written late (a slow NVML read, a busy disk) still count, so that
/// `--at now` on a running recorder finds its last sample. Chosen on the recorder's
/// behaviour (a tick is due every interval and the timebase places a late one on the next
/// slot), checked in the integration test
/// `status_replay_shows_the_last_sample_at_or_before_when_and_how_old_it_is` on a fake-NVML
/// recording. `status --replay` still shows an older moment (the last at or before the time
/// asked for), saying that the recording had ended or paused.
pub const STALE_SPACINGS: i64 = 2;

impl Store {
    /// The moment that stands for `t_ms`: the latest at or before it, unless that one is
    /// more than [`STALE_SPACINGS`] sample spacings older (the recording had ended or
    /// paused); `None` asks for the last sample.
    ///
    /// # Errors
    /// When SQLite fails or a frame is damaged.
    pub fn moment_near(&mut self, t_ms: Option<i64>) -> Result<MomentLookup, StoreError> {
        let Some((first_ms, last_ms)) = self.time_bounds()? else {
            return Ok(MomentLookup::Empty);
        };
        let asked = t_ms.unwrap_or(i64::MAX);
        let Some(moment) = self.moment_at_or_before(asked)? else {
            return Ok(MomentLookup::BeforeFirst { first_ms });
        };
        let found = moment.at_unix_ms;
        if t_ms.is_some() && asked > found {
            let spacing = match self.time_at_or_before(found - 1)? {
                Some(before) => (found - before).max(moment.span_ms),
                None => moment.span_ms,
            };
            if asked - found > spacing.saturating_mul(STALE_SPACINGS) {
                return Ok(match self.time_after(found)? {
                    Some(resumes_ms) => MomentLookup::InGap {
                        stops_ms: found,
                        resumes_ms,
                    },
                    None => MomentLookup::AfterLast { last_ms },
                });
            }
        }
        Ok(MomentLookup::Found(Box::new(moment)))
    }
}

/// A recorded device as `DeviceInfo`, its MIG instances (`records` with it as parent) under
/// it; `position` among the records stands in for an index the history does not have.
/// What a history does not keep (minor number, MIG ids) is `None`.
pub fn recorded_device_info(
    records: &[DeviceRecord],
    d: &DeviceRecord,
    position: usize,
) -> DeviceInfo {
    let children: Vec<&DeviceRecord> = records
        .iter()
        .filter(|c| c.meta.parent_uuid.as_deref() == Some(d.meta.uuid.as_str()))
        .collect();
    DeviceInfo {
        index: d
            .meta
            .index
            .unwrap_or_else(|| u32::try_from(position).unwrap_or(u32::MAX)),
        uuid: d.meta.uuid.clone(),
        name: d.meta.name.clone(),
        pci_bus_id: d.meta.pci_bus_id.clone(),
        minor_number: None,
        mig_enabled: (!children.is_empty()).then_some(true),
        mig_instances: children
            .iter()
            .map(|c| MigInstanceInfo {
                uuid: c.meta.uuid.clone(),
                name: c.meta.name.clone(),
                gpu_instance_id: None,
                compute_instance_id: None,
            })
            .collect(),
    }
}

/// What one moment's devices and readings are made from.
struct Shape<'a> {
    records: &'a [DeviceRecord],
    by_device: &'a BTreeMap<i64, HashMap<Metric, Entry>>,
    by_process: &'a BTreeMap<(i64, i64), HashMap<Metric, Entry>>,
    pids: &'a HashMap<i64, u32>,
    gaps: &'a [Gap],
}

impl Shape<'_> {
    /// The static facts of a recorded GPU, its MIG instances (recorded as devices whose
    /// parent it is) under it. An index that was not recorded (an imported log names GPUs
    /// by UUID) is its position among the recorded devices.
    fn device_info(&self, d: &DeviceRecord, position: usize) -> DeviceInfo {
        recorded_device_info(self.records, d, position)
    }

    fn reading(&self, record: &DeviceRecord, metrics: &HashMap<Metric, Entry>) -> DeviceReading {
        let value = |m: Metric| metrics.get(&m).copied().and_then(last);
        let small = |m: Metric| value(m).and_then(|v| u32::try_from(v).ok());
        let mut missing = BTreeMap::new();
        for gap in self.gaps.iter().filter(|g| {
            g.device_uuid
                .as_deref()
                .is_some_and(|u| u.eq_ignore_ascii_case(&record.meta.uuid))
        }) {
            let field = match gap.metric {
                Some(
                    Metric::UsedBytes
                    | Metric::ReservedBytes
                    | Metric::FreeBytes
                    | Metric::TotalBytes,
                ) => Field::Memory,
                Some(Metric::UtilizationGpuPercent | Metric::UtilizationMemoryPercent) => {
                    Field::Utilization
                }
                Some(Metric::TemperatureC) => Field::Temperature,
                Some(Metric::PowerMw) => Field::Power,
                Some(Metric::ProcessUsedBytes) => Field::ComputeProcesses,
                _ => continue,
            };
            missing.insert(field, Unavailable::from(gap.reason.clone()));
        }
        for child in self
            .records
            .iter()
            .filter(|c| c.meta.parent_uuid.as_deref() == Some(record.meta.uuid.as_str()))
        {
            if let Some(gap) = self.gaps.iter().find(|g| {
                g.device_uuid
                    .as_deref()
                    .is_some_and(|u| u.eq_ignore_ascii_case(&child.meta.uuid))
                    && g.metric.is_some()
            }) {
                missing.insert(Field::MigMemory, Unavailable::from(gap.reason.clone()));
            }
        }
        let processes_missing = missing.contains_key(&Field::ComputeProcesses);
        let mut processes = Vec::new();
        let mut activity = Vec::new();
        for (&(_, p), values) in self
            .by_process
            .range((record.id, i64::MIN)..=(record.id, i64::MAX))
        {
            let (Some(&pid), Some(entry)) =
                (self.pids.get(&p), values.get(&Metric::ProcessUsedBytes))
            else {
                continue;
            };
            processes.push(ProcessUsage {
                pid,
                used_bytes: last(*entry),
                // Not recorded (module docs): a placeholder the type requires.
                kind: ProcessKind::Compute,
                gpu_instance_id: None,
                compute_instance_id: None,
            });
            if let Some(sm) = values
                .get(&Metric::ProcessSmPercent)
                .copied()
                .and_then(last)
                .and_then(|v| u32::try_from(v).ok())
            {
                activity.push(ProcessActivity {
                    pid,
                    sm_percent: sm,
                    memory_percent: 0,
                });
            }
        }
        processes.sort_by_key(|p| p.pid);
        let mig = self
            .records
            .iter()
            .filter(|c| c.meta.parent_uuid.as_deref() == Some(record.meta.uuid.as_str()))
            .map(|c| MigReading {
                uuid: c.meta.uuid.clone(),
                memory: self.by_device.get(&c.id).and_then(memory_of),
            })
            .collect();
        DeviceReading {
            memory: memory_of(metrics),
            utilization_gpu_percent: small(Metric::UtilizationGpuPercent),
            utilization_memory_percent: small(Metric::UtilizationMemoryPercent),
            temperature_c: small(Metric::TemperatureC),
            power_mw: small(Metric::PowerMw),
            processes: (!processes_missing).then_some(processes),
            // Which processes ran is known only where the recording has activity samples;
            // with none at this moment, idle cannot be told from not reported.
            process_activity: (!activity.is_empty()).then_some(activity),
            mig,
            missing,
            dropped: Vec::new(),
        }
    }
}

/// Memory figures from stored values. NVML reports all four; an imported log may lack the
/// reservation or free memory, which `total = reserved + used + free` then gives.
pub fn memory_of(metrics: &HashMap<Metric, Entry>) -> Option<MemoryReading> {
    let value = |m: Metric| metrics.get(&m).copied().and_then(last);
    let used = value(Metric::UsedBytes)?;
    let total = value(Metric::TotalBytes)?;
    let (reserved, free) = match (value(Metric::ReservedBytes), value(Metric::FreeBytes)) {
        (Some(r), Some(f)) => (r, f),
        (Some(r), None) => (r, total.saturating_sub(used + r)),
        (None, Some(f)) => (total.saturating_sub(used + f), f),
        (None, None) => (0, total.saturating_sub(used)),
    };
    Some(MemoryReading {
        total_bytes: total,
        used_bytes: used,
        reserved_bytes: reserved,
        free_bytes: free,
    })
}

/// Who the PIDs of a recorded moment were: the metadata the recorder stored, as the live
/// process catalog says it (`vramctl_procs::process_catalog::StaticFacts`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordedProcesses {
    by_pid: BTreeMap<u32, RecordedProcess>,
}

impl RecordedProcesses {
    /// The processes of `moment`.
    pub fn of(moment: &RecordedMoment) -> Self {
        Self {
            by_pid: moment.processes.clone(),
        }
    }

    /// The process recorded as `pid` at the moment.
    pub fn get(&self, pid: u32) -> Option<&RecordedProcess> {
        self.by_pid.get(&pid)
    }
}

/// A recorded moment served as a GPU backend: the devices and readings the recorder saw,
/// every tick (a replay stands still at its moment).
#[derive(Debug, Clone)]
pub struct ReplayBackend {
    moment: RecordedMoment,
}

impl ReplayBackend {
    /// A backend that plays `moment`.
    pub fn new(moment: RecordedMoment) -> Self {
        Self { moment }
    }

    /// The moment played.
    pub fn moment(&self) -> &RecordedMoment {
        &self.moment
    }
}

impl Backend for ReplayBackend {
    /// The history does not keep the driver's versions: none is reported.
    fn driver(&mut self) -> DriverInfo {
        DriverInfo::default()
    }

    fn enumerate(&mut self) -> Result<Enumeration, DeviceError> {
        Ok(Enumeration {
            devices: self
                .moment
                .devices
                .iter()
                .map(|d| (*d.info).clone())
                .collect(),
            unopened: Vec::new(),
        })
    }

    fn device_count(&mut self) -> Result<u32, DeviceError> {
        Ok(u32::try_from(self.moment.devices.len()).unwrap_or(u32::MAX))
    }

    fn read(&mut self, device: &DeviceInfo) -> Result<DeviceReading, DeviceError> {
        let recorded = self
            .moment
            .devices
            .iter()
            .find(|d| d.info.uuid == device.uuid)
            .ok_or_else(|| {
                DeviceError::Failed(format!("'{}' is not in the recording", device.uuid))
            })?;
        match &recorded.state {
            DeviceState::Ok(reading) => Ok(reading.clone()),
            DeviceState::Lost { reason } => Err(DeviceError::Lost(reason.clone())),
            DeviceState::Error { reason } => Err(DeviceError::Failed(reason.clone())),
        }
    }

    fn diagnostics(&mut self, _device: &DeviceInfo) -> Result<DeviceDiagnostics, DeviceError> {
        Err(DeviceError::Failed(
            "a recorded history keeps no hardware diagnostics".to_owned(),
        ))
    }

    /// The name recorded for a process the recorder could not see in /proc (the driver's).
    fn process_name(&mut self, pid: u32) -> Option<String> {
        self.moment
            .processes
            .get(&pid)
            .filter(|p| !p.visible())
            .and_then(|p| p.record.meta.command.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        DeviceMeta, DeviceSample, DeviceSampleState, Observed, ProcessKey, ProcessList,
        ProcessMeta, ProcessOnDevice, ProcessSample, TickSample,
    };

    const T0: i64 = 1_764_000_000_000;

    fn gpu() -> DeviceMeta {
        DeviceMeta {
            uuid: "GPU-00000000-0000-0000-0000-000000000001".into(),
            index: Some(0),
            name: Some("NVIDIA H200".into()),
            pci_bus_id: Some("00000000:01:00.0".into()),
            parent_uuid: None,
        }
    }

    fn tick(t: i64, used: u64, temperature: Observed) -> TickSample {
        TickSample {
            at_unix_ms: t,
            unavailable: None,
            devices: vec![DeviceSample {
                device: gpu(),
                state: DeviceSampleState::Read {
                    metrics: vec![
                        (Metric::UsedBytes, Observed::Value(used)),
                        (Metric::ReservedBytes, Observed::Value(10)),
                        (Metric::FreeBytes, Observed::Value(1000 - 10 - used)),
                        (Metric::TotalBytes, Observed::Value(1000)),
                        (Metric::TemperatureC, temperature),
                    ],
                    processes: ProcessList::Observed(vec![
                        ProcessOnDevice {
                            pid: 42,
                            used_bytes: Some(used),
                            sm_percent: Some(7),
                            agent: None,
                        },
                        ProcessOnDevice {
                            pid: 9000,
                            used_bytes: None,
                            sm_percent: None,
                            agent: None,
                        },
                    ]),
                },
            }],
            processes: vec![
                ProcessSample {
                    meta: ProcessMeta {
                        key: ProcessKey {
                            boot_id: Some("b".into()),
                            pid: 42,
                            start_time_ticks: Some(500),
                        },
                        uid: Some(1000),
                        user: Some("alice".into()),
                        command: Some("python train.py".into()),
                        container_id: None,
                        pod_uid: None,
                    },
                    cpu_ticks: Some(t.rem_euclid(1000) as u64),
                },
                ProcessSample {
                    meta: ProcessMeta {
                        key: ProcessKey {
                            boot_id: Some("b".into()),
                            pid: 9000,
                            start_time_ticks: None,
                        },
                        command: Some("python".into()),
                        ..ProcessMeta::default()
                    },
                    cpu_ticks: None,
                },
            ],
        }
    }

    fn recorded() -> Store {
        let mut store = Store::open_in_memory().unwrap();
        store.append(&tick(T0, 100, Observed::Value(40))).unwrap();
        store
            .append(&tick(
                T0 + 1000,
                200,
                Observed::Missing("not supported".into()),
            ))
            .unwrap();
        store
    }

    #[test]
    fn a_moment_is_rebuilt_as_it_was_recorded_and_nothing_else() {
        let mut store = recorded();
        let moment = store.moment_at_or_before(T0 + 1500).unwrap().unwrap();
        assert_eq!(moment.at_unix_ms, T0 + 1000);
        assert_eq!(moment.devices.len(), 1);
        let device = &moment.devices[0];
        assert_eq!(device.info.index, 0);
        assert_eq!(device.info.pci_bus_id.as_deref(), Some("00000000:01:00.0"));
        let reading = device.reading().unwrap();
        assert_eq!(
            reading.memory,
            Some(MemoryReading {
                total_bytes: 1000,
                used_bytes: 200,
                reserved_bytes: 10,
                free_bytes: 790,
            })
        );
        // Missing is missing, with the recorded reason; never the previous value.
        assert_eq!(reading.temperature_c, None);
        assert_eq!(
            reading.missing.get(&Field::Temperature),
            Some(&Unavailable::NotSupported)
        );
        // Utilization and power were never recorded: absent, with no made-up reason.
        assert_eq!(reading.utilization_gpu_percent, None);
        assert!(!reading.missing.contains_key(&Field::Utilization));
        let processes = reading.processes.as_ref().unwrap();
        assert_eq!(processes.len(), 2);
        assert_eq!((processes[0].pid, processes[0].used_bytes), (42, Some(200)));
        assert_eq!((processes[1].pid, processes[1].used_bytes), (9000, None));
        assert_eq!(reading.process_activity.as_ref().unwrap()[0].sm_percent, 7);
        // Who they were.
        let alice = &moment.processes[&42];
        assert!(alice.visible());
        assert_eq!(alice.facts().user_or_uid().as_deref(), Some("alice"));
        assert_eq!(alice.cpu_ticks, Some(0));
        assert!(!moment.processes[&9000].visible());
        // The earlier moment, and none before the recording.
        let first = store.moment_at_or_before(T0 + 999).unwrap().unwrap();
        assert_eq!(first.devices[0].reading().unwrap().temperature_c, Some(40));
        assert_eq!(store.moment_at_or_before(T0 - 1).unwrap(), None);
    }

    #[test]
    fn the_replay_backend_serves_the_moment_through_the_backend_trait() {
        let mut store = recorded();
        let moment = store.moment_at_or_before(T0 + 1000).unwrap().unwrap();
        let mut backend: Box<dyn Backend> = Box::new(ReplayBackend::new(moment.clone()));
        assert_eq!(backend.driver(), DriverInfo::default());
        let devices = backend.enumerate().unwrap().devices;
        assert_eq!(devices.len(), 1);
        assert_eq!(backend.device_count().unwrap(), 1);
        assert_eq!(
            &backend.read(&devices[0]).unwrap(),
            moment.devices[0].reading().unwrap()
        );
        // The driver's name only for what the recorder could not see in /proc.
        assert_eq!(backend.process_name(9000).as_deref(), Some("python"));
        assert_eq!(backend.process_name(42), None);
        assert!(backend.diagnostics(&devices[0]).is_err());
        let processes = RecordedProcesses::of(&moment);
        assert_eq!(
            processes.get(42).and_then(|p| p.facts().command),
            Some("python train.py".into())
        );
    }

    #[test]
    fn a_time_the_recording_does_not_cover_finds_no_moment() {
        let mut store = Store::open_in_memory().unwrap();
        assert_eq!(store.moment_near(Some(T0)).unwrap(), MomentLookup::Empty);
        // Samples each second at T0..T0+2 s, then a pause until T0+60 s.
        for t in [T0, T0 + 1000, T0 + 2000, T0 + 60_000] {
            store.append(&tick(t, 100, Observed::Value(40))).unwrap();
        }
        let found = |lookup: MomentLookup| match lookup {
            MomentLookup::Found(m) => m.at_unix_ms,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            store.moment_near(Some(T0 - 1)).unwrap(),
            MomentLookup::BeforeFirst { first_ms: T0 }
        );
        // Between samples, and up to two spacings after one: the one before.
        assert_eq!(
            found(store.moment_near(Some(T0 + 1500)).unwrap()),
            T0 + 1000
        );
        assert_eq!(
            found(store.moment_near(Some(T0 + 4000)).unwrap()),
            T0 + 2000
        );
        // Further into the pause: not the stale moment.
        assert_eq!(
            store.moment_near(Some(T0 + 4001)).unwrap(),
            MomentLookup::InGap {
                stops_ms: T0 + 2000,
                resumes_ms: T0 + 60_000
            }
        );
        // The spacing before the last sample is 58 s: within it, the last; past, none.
        assert_eq!(
            found(store.moment_near(Some(T0 + 60_000 + 116_000)).unwrap()),
            T0 + 60_000
        );
        assert_eq!(
            store.moment_near(Some(T0 + 60_000 + 116_001)).unwrap(),
            MomentLookup::AfterLast {
                last_ms: T0 + 60_000
            }
        );
        assert_eq!(found(store.moment_near(None).unwrap()), T0 + 60_000);
    }

    #[test]
    fn a_lost_gpu_and_nvml_down_are_replayed_as_unreadable_with_the_reason() {
        let mut store = Store::open_in_memory().unwrap();
        store.append(&tick(T0, 100, Observed::Value(40))).unwrap();
        store
            .append(&TickSample {
                at_unix_ms: T0 + 1000,
                devices: vec![DeviceSample {
                    device: gpu(),
                    state: DeviceSampleState::Unreadable("GPU lost: fell off the bus".into()),
                }],
                ..TickSample::default()
            })
            .unwrap();
        let lost = store.moment_at(T0 + 1000).unwrap().unwrap();
        assert_eq!(
            lost.devices[0].state,
            DeviceState::Lost {
                reason: "fell off the bus".into()
            }
        );
        let mut store = recorded();
        store
            .append(&TickSample {
                at_unix_ms: T0 + 2000,
                unavailable: Some("NVML did not start: no driver".into()),
                ..TickSample::default()
            })
            .unwrap();
        let down = store.moment_at(T0 + 2000).unwrap().unwrap();
        assert_eq!(
            down.devices[0].state,
            DeviceState::Error {
                reason: "NVML did not start: no driver".into()
            }
        );
    }
}
