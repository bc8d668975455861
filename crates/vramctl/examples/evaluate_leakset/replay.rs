//! A stored recording, tick by tick: what the sampler saw at each stored time, rebuilt from
//! the store's frames (values are carried from frame to frame, so each frame is the full
//! state). From a tick come:
//! - the [`Snapshot`] (and the /proc facts) a live frontend would have fed its
//!   `FleetTracker` at that moment ([`Tick::snapshot`], [`Tick::facts`]);
//! - the [`TickSample`] a recorder would have written ([`Tick::tick_sample`]), to thin a
//!   recording into the one a slower recorder would have made ([`thin`]).
//!
//! One pass over the store ([`Store::scan`]), whatever the number of series.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use vramctl_core::types::{
    DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, MemoryReading,
    ProcessActivity, ProcessKind, ProcessUsage, Snapshot,
};
use vramctl_procs::procinfo::ProcessFacts;
use vramctl_store::{
    DeviceRecord, DeviceSample, DeviceSampleState, Metric, Observed, OpenMode, ProcessList,
    ProcessOnDevice, ProcessRecord, ProcessSample, SessionInfo, Store, TickSample, TimeRange,
};

/// CPU time is recorded every 10 s (`recorder::CPU_EVERY_MS`) and carried between reads;
/// like the batch scan (`cmd/leaks/scan.rs`, `CPU_HEARTBEAT_MS`), a repeated value is
/// taken as a new reading only this long after the last one.
pub const CPU_HEARTBEAT_MS: i64 = 10_000;

/// One process on one device at one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessTick {
    /// The store's process row.
    pub process_id: i64,
    /// Memory (the last value of a downsampled bucket); `None`: listed, not reported.
    pub used_bytes: Option<u64>,
    pub sm_percent: Option<u32>,
}

/// One device at one tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTick {
    /// Index into [`Recording::devices`].
    pub device: usize,
    /// Whether this tick read the device's metrics and its process list (a recorder reads
    /// both every tick; an imported nvidia-smi log has GPU rows and process rows at
    /// different times).
    pub observed_metrics: bool,
    pub observed_processes: bool,
    /// Every device metric known at this tick (carried when not observed now).
    pub metrics: BTreeMap<Metric, u64>,
    /// The processes listed on it, by PID.
    pub processes: Vec<ProcessTick>,
}

/// Everything known at one stored time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    pub t_ms: i64,
    pub devices: Vec<DeviceTick>,
    /// Cumulative CPU time (clock ticks) per process row, as last recorded.
    pub cpu_ticks: HashMap<i64, u64>,
}

/// What a store's catalogue says: its devices and processes.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub devices: Vec<DeviceRecord>,
    pub processes: HashMap<i64, ProcessRecord>,
}

/// A store and its catalogue.
pub struct Recording {
    pub store: Store,
    pub catalog: Catalog,
}

impl Recording {
    /// Reads the catalogue of `store`.
    ///
    /// # Errors
    /// When the store cannot be read.
    pub fn new(mut store: Store) -> anyhow::Result<Self> {
        let devices = store.devices()?;
        let processes = store.all_processes()?;
        Ok(Self {
            store,
            catalog: Catalog { devices, processes },
        })
    }

    /// Opens a history database read-only.
    ///
    /// # Errors
    /// When it cannot be opened.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let store = Store::open(path, OpenMode::ReadOnly)
            .with_context(|| format!("cannot open '{}'", path.display()))?;
        Self::new(store)
    }

    /// Visits every stored tick, oldest first, with the catalogue.
    ///
    /// # Errors
    /// When the store fails.
    pub fn ticks(&mut self, mut visit: impl FnMut(&Catalog, &Tick)) -> anyhow::Result<()> {
        let catalog = &self.catalog;
        let index: HashMap<i64, usize> = catalog
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.id, i))
            .collect();
        let n = catalog.devices.len();
        let mut tick = Tick {
            t_ms: 0,
            devices: Vec::with_capacity(n),
            cpu_ticks: HashMap::new(),
        };
        let mut by_device: Vec<DeviceTick> = Vec::with_capacity(n);
        let mut present: Vec<bool> = vec![false; n];
        self.store.scan(TimeRange::ALL, |frame| {
            tick.t_ms = frame.t_ms;
            tick.cpu_ticks.clear();
            by_device.clear();
            present.iter_mut().for_each(|p| *p = false);
            for d in 0..n {
                let (observed_metrics, observed_processes) = frame.observed(catalog.devices[d].id);
                by_device.push(DeviceTick {
                    device: d,
                    observed_metrics,
                    observed_processes,
                    metrics: BTreeMap::new(),
                    processes: Vec::new(),
                });
            }
            let mut sm: HashMap<(usize, i64), u32> = HashMap::new();
            for (series, entry) in frame.iter() {
                let last = entry.min_max_last().map(|v| v.2);
                let device = series.device_id.and_then(|d| index.get(&d).copied());
                match (series.metric, device, series.process_id) {
                    (Metric::ProcessCpuTicks, _, Some(p)) => {
                        if let Some(v) = last {
                            tick.cpu_ticks.insert(p, v);
                        }
                    }
                    (Metric::ProcessUsedBytes, Some(d), Some(p)) => {
                        present[d] = true;
                        by_device[d].processes.push(ProcessTick {
                            process_id: p,
                            used_bytes: last,
                            sm_percent: None,
                        });
                    }
                    (Metric::ProcessSmPercent, Some(d), Some(p)) => {
                        if let Some(v) = last.and_then(|v| u32::try_from(v).ok()) {
                            sm.insert((d, p), v);
                        }
                    }
                    (metric, Some(d), None) => {
                        if let Some(v) = last {
                            present[d] = true;
                            by_device[d].metrics.insert(metric, v);
                        }
                    }
                    _ => {}
                }
            }
            tick.devices.clear();
            for (d, mut dev) in by_device.drain(..).enumerate() {
                if !present[d] {
                    continue;
                }
                for p in &mut dev.processes {
                    p.sm_percent = sm.get(&(d, p.process_id)).copied();
                }
                let pid_of = |p: &ProcessTick| {
                    catalog
                        .processes
                        .get(&p.process_id)
                        .map_or(u32::MAX, |r| r.meta.key.pid)
                };
                dev.processes.sort_by_key(pid_of);
                tick.devices.push(dev);
            }
            visit(catalog, &tick);
        })?;
        Ok(())
    }
}

impl Catalog {
    /// The device as a sampler's [`DeviceInfo`] (index: the recorded one, else its
    /// position).
    pub fn device_info(&self, d: usize) -> DeviceInfo {
        let r = &self.devices[d];
        DeviceInfo {
            index: r
                .meta
                .index
                .unwrap_or_else(|| u32::try_from(d).unwrap_or(u32::MAX)),
            uuid: r.meta.uuid.clone(),
            name: r.meta.name.clone(),
            pci_bus_id: r.meta.pci_bus_id.clone(),
            minor_number: None,
            mig_enabled: None,
            mig_instances: Vec::new(),
        }
    }

    /// Every device as a sampler's [`DeviceInfo`], in catalogue order.
    pub fn device_infos(&self) -> Vec<Arc<DeviceInfo>> {
        (0..self.devices.len())
            .map(|d| Arc::new(self.device_info(d)))
            .collect()
    }
}

/// Memory figures from stored values: NVML reports all four, an imported log may lack the
/// reservation or free memory (`total = reserved + used + free` gives the other), as
/// `top --replay` rebuilds them (`tui/store.rs`).
fn memory_of(metrics: &BTreeMap<Metric, u64>) -> Option<MemoryReading> {
    let used = *metrics.get(&Metric::UsedBytes)?;
    let total = *metrics.get(&Metric::TotalBytes)?;
    let (reserved, free) = match (
        metrics.get(&Metric::ReservedBytes),
        metrics.get(&Metric::FreeBytes),
    ) {
        (Some(&r), Some(&f)) => (r, f),
        (Some(&r), None) => (r, total.saturating_sub(used + r)),
        (None, Some(&f)) => (total.saturating_sub(used + f), f),
        (None, None) => (0, total.saturating_sub(used)),
    };
    Some(MemoryReading {
        total_bytes: total,
        used_bytes: used,
        reserved_bytes: reserved,
        free_bytes: free,
    })
}

/// What a live frontend's /proc reads would have told it, replayed from the recording.
pub struct FactsReplay {
    /// /proc's clock ticks per second (the unit of recorded CPU time).
    ticks_per_second: u64,
    /// Per process row: when its CPU time was last handed over, and the value.
    cpu_pushed: HashMap<i64, (i64, u64)>,
}

impl Default for FactsReplay {
    fn default() -> Self {
        Self {
            ticks_per_second: procfs::ticks_per_second().max(1),
            cpu_pushed: HashMap::new(),
        }
    }
}

impl Catalog {
    /// The snapshot a sampler would have handed a live frontend at `tick`, with the
    /// devices whose process list the tick observed; `None` when it observed none (a GPU
    /// row of an imported log: a sampler reads both at once, so the process rows' ticks
    /// carry the last GPU values).
    pub fn snapshot(&self, tick: &Tick, infos: &[Arc<DeviceInfo>]) -> Option<Snapshot> {
        let mut devices = Vec::new();
        for dev in tick.devices.iter().filter(|d| d.observed_processes) {
            let pid = |p: &ProcessTick| self.processes.get(&p.process_id).map(|r| r.meta.key.pid);
            let processes: Vec<ProcessUsage> = dev
                .processes
                .iter()
                .filter_map(|p| {
                    Some(ProcessUsage {
                        pid: pid(p)?,
                        used_bytes: p.used_bytes,
                        kind: ProcessKind::Compute,
                        gpu_instance_id: None,
                        compute_instance_id: None,
                    })
                })
                .collect();
            let activity: Vec<ProcessActivity> = dev
                .processes
                .iter()
                .filter_map(|p| {
                    Some(ProcessActivity {
                        pid: pid(p)?,
                        sm_percent: p.sm_percent?,
                        memory_percent: 0,
                    })
                })
                .collect();
            let small = |m: Metric| dev.metrics.get(&m).and_then(|&v| u32::try_from(v).ok());
            let reading = DeviceReading {
                memory: memory_of(&dev.metrics),
                utilization_gpu_percent: small(Metric::UtilizationGpuPercent),
                utilization_memory_percent: small(Metric::UtilizationMemoryPercent),
                temperature_c: small(Metric::TemperatureC),
                power_mw: small(Metric::PowerMw),
                processes: Some(processes),
                process_activity: (!activity.is_empty()).then_some(activity),
                ..DeviceReading::default()
            };
            devices.push(DeviceSnapshot {
                info: Arc::clone(&infos[dev.device]),
                state: DeviceState::Ok(reading),
            });
        }
        if devices.is_empty() {
            return None;
        }
        Some(Snapshot {
            taken_at_unix_ms: tick.t_ms,
            // The stored times increase with the real spacing of the ticks (the store's
            // HistoryClock keeps them so through clock steps): the replay's monotonic time.
            monotonic_ms: tick.t_ms,
            driver: Arc::new(DriverInfo::default()),
            devices,
            unopened: Vec::new(),
        })
    }

    /// The facts of every PID listed at `tick`: its identity's start time (from the
    /// store), no wall-clock start (so warm-up counts from the process's first sample,
    /// as the batch scan counts it from the first time the store saw it), and its CPU
    /// time when a new reading is due (see [`CPU_HEARTBEAT_MS`]).
    pub fn facts(&self, tick: &Tick, replay: &mut FactsReplay) -> HashMap<u32, ProcessFacts> {
        let mut out = HashMap::new();
        for dev in tick.devices.iter().filter(|d| d.observed_processes) {
            for p in &dev.processes {
                let Some(record) = self.processes.get(&p.process_id) else {
                    continue;
                };
                let cpu_time_ms = tick.cpu_ticks.get(&p.process_id).and_then(|&ticks| {
                    let due = replay
                        .cpu_pushed
                        .get(&p.process_id)
                        .is_none_or(|&(at, value)| {
                            value != ticks || tick.t_ms.saturating_sub(at) >= CPU_HEARTBEAT_MS
                        });
                    due.then(|| {
                        replay.cpu_pushed.insert(p.process_id, (tick.t_ms, ticks));
                        u64::try_from(
                            u128::from(ticks) * 1000 / u128::from(replay.ticks_per_second),
                        )
                        .unwrap_or(u64::MAX)
                    })
                });
                out.insert(
                    record.meta.key.pid,
                    ProcessFacts {
                        start_time_ticks: record.meta.key.start_time_ticks,
                        started_at_unix_ms: None,
                        cpu_time_ms,
                    },
                );
            }
        }
        out
    }

    /// What a recorder would have written at `tick`: every device read, with every metric
    /// it has now and its full process list, and every listed process with its identity
    /// and current CPU time.
    pub fn tick_sample(&self, tick: &Tick) -> TickSample {
        let mut processes: BTreeMap<u32, ProcessSample> = BTreeMap::new();
        let mut devices = Vec::new();
        for dev in &tick.devices {
            let mut list = Vec::new();
            for p in &dev.processes {
                let Some(record) = self.processes.get(&p.process_id) else {
                    continue;
                };
                let pid = record.meta.key.pid;
                list.push(ProcessOnDevice {
                    pid,
                    used_bytes: p.used_bytes,
                    sm_percent: p.sm_percent,
                    agent: None,
                });
                processes.entry(pid).or_insert_with(|| ProcessSample {
                    meta: record.meta.clone(),
                    cpu_ticks: tick.cpu_ticks.get(&p.process_id).copied(),
                });
            }
            devices.push(DeviceSample {
                device: self.devices[dev.device].meta.clone(),
                state: DeviceSampleState::Read {
                    metrics: dev
                        .metrics
                        .iter()
                        .map(|(&m, &v)| (m, Observed::Value(v)))
                        .collect(),
                    processes: ProcessList::Observed(list),
                },
            });
        }
        TickSample {
            at_unix_ms: tick.t_ms,
            unavailable: None,
            devices,
            processes: processes.into_values().collect(),
        }
    }
}

/// What [`thin`] kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thinned {
    pub source_ticks: u64,
    pub kept_ticks: u64,
}

/// Writes into a new database at `dst` the recording a recorder sampling every
/// `interval_ms` would have made beside the one in `src`: the first stored tick at or
/// after each multiple of `interval_ms` from the first tick (every Nth tick of a
/// recording at `interval_ms / N` without dropped ticks; after a hole in the source, its
/// first tick), with the state the source had at that tick. Nothing between kept ticks
/// survives: a process that came and went between two of them is never seen, as a
/// slower recorder would not have seen it.
///
/// # Errors
/// When either store fails, or `interval_ms` is not positive.
pub fn thin(src: &mut Recording, dst: &Path, interval_ms: i64) -> anyhow::Result<Thinned> {
    anyhow::ensure!(interval_ms > 0, "the thinning interval must be positive");
    let mut out = Store::open(dst, OpenMode::Append)
        .with_context(|| format!("cannot create '{}'", dst.display()))?;
    out.begin_session(&SessionInfo {
        source: format!("thinned to {interval_ms} ms"),
        interval_ms: Some(interval_ms),
        ..SessionInfo::default()
    })?;
    let mut origin: Option<i64> = None;
    let mut next_ms = i64::MIN;
    let mut counts = Thinned {
        source_ticks: 0,
        kept_ticks: 0,
    };
    let mut failure: Option<anyhow::Error> = None;
    src.ticks(|catalog, tick| {
        counts.source_ticks += 1;
        let o = *origin.get_or_insert(tick.t_ms);
        if tick.t_ms < next_ms {
            return;
        }
        counts.kept_ticks += 1;
        // The next multiple of the interval after this tick.
        let k = (tick.t_ms - o) / interval_ms + 1;
        next_ms = o + k * interval_ms;
        if failure.is_none() {
            if let Err(e) = out.append(&catalog.tick_sample(tick)) {
                failure = Some(e.into());
            }
        }
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    out.close()?;
    Ok(counts)
}
