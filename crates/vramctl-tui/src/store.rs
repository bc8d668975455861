//! The history store behind `top`: the charts' past before `top` started (live, when a
//! recorder's database is there), and a recording to browse (`top --replay DB`).
//!
//! One [`StoreSource`] serves both seams: [`HistorySource`] (series over a window, read in
//! one pass over the stored frames for every series asked) and [`ReplaySource`] (the
//! moment at or around a time, rebuilt as an [`Observation`] from the stored frame: device
//! readings, processes with the user and command line the recorder saw, CPU use, gaps as
//! lost or unreadable devices and as missing values with their reasons).
//!
//! Processes are matched by identity, not by PID alone: a process series is that of the
//! stored process with the same PID and start time (and, live, the same boot); a PID
//! without a known start time (another PID namespace) is the latest stored process under
//! that PID that lived in the window. So an earlier process under a reused PID never lends
//! its history to a new one.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use vramctl_core::types::{DeviceInfo, DriverInfo, Snapshot};
use vramctl_store::{
    DEFAULT_KEY_INTERVAL_MS, DeviceRecord, Entry, Metric, OpenMode, ProcessRecord, SeriesRef,
    Store, StoreError, TimeRange,
};

use super::memory_series::{HistoryChunk, HistorySource, Point, SeriesKey, Starts};
use super::replay::ReplaySource;
use vramctl_observe::observation::{HostProcess, Observation};

/// CPU use at a cursor is the average over this long before it (the recorder reads CPU
/// time every 10 s, so a shorter span would mostly see no change).
const CPU_WINDOW_MS: i64 = 60_000;
/// Below this span of CPU readings no CPU use is shown.
const CPU_MIN_SPAN_MS: i64 = 20_000;

/// A history database, read-only, for the charts and for replay.
pub struct StoreSource {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for StoreSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSource").finish_non_exhaustive()
    }
}

struct Inner {
    store: Store,
    /// Live: only processes of this boot can be the ones on screen.
    boot_id: Option<String>,
    devices: Vec<DeviceRecord>,
    ticks_per_second: u64,
}

impl StoreSource {
    /// Opens the database at `path` read-only (a running recorder is not disturbed).
    /// `boot_id`: live, the current boot's (processes of other boots are not the ones on
    /// screen); replay, `None`.
    ///
    /// # Errors
    /// When it cannot be opened: missing, not a vramctl history, newer, unreadable.
    pub fn open(path: &Path, boot_id: Option<String>) -> Result<Self, StoreError> {
        Ok(Self::new(Store::open(path, OpenMode::ReadOnly)?, boot_id))
    }

    /// A source over an open store.
    pub fn new(store: Store, boot_id: Option<String>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                store,
                boot_id,
                devices: Vec::new(),
                ticks_per_second: procfs::ticks_per_second().max(1),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while reading leaves nothing half-changed that matters: caches only.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The recorded GPUs (not MIG instances), as `--gpu` matches them.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub fn gpus(&self) -> Result<Vec<Arc<DeviceInfo>>, String> {
        let mut inner = self.lock();
        inner.refresh_devices()?;
        Ok(inner
            .devices
            .iter()
            .enumerate()
            .filter(|(_, d)| d.meta.parent_uuid.is_none())
            .map(|(i, d)| Arc::new(inner.device_info(d, i)))
            .collect())
    }
}

fn text(err: &StoreError) -> String {
    err.to_string()
}

/// The value of an entry for a chart (a bucket's highest) and for a reading (its last).
fn highest(entry: Entry) -> Option<u64> {
    entry.min_max_last().map(|(_, max, _)| max)
}

fn last(entry: Entry) -> Option<u64> {
    entry.min_max_last().map(|(_, _, last)| last)
}

impl Inner {
    fn refresh_devices(&mut self) -> Result<(), String> {
        self.devices = self.store.devices().map_err(|e| text(&e))?;
        Ok(())
    }

    fn device_id(&mut self, uuid: &str) -> Result<Option<i64>, String> {
        let find = |devices: &[DeviceRecord]| {
            devices
                .iter()
                .find(|d| d.meta.uuid.eq_ignore_ascii_case(uuid))
                .map(|d| d.id)
        };
        if let Some(id) = find(&self.devices) {
            return Ok(Some(id));
        }
        // A recorder may have added it since.
        self.refresh_devices()?;
        Ok(find(&self.devices))
    }

    /// The stored process that `pid` (started at `start`, when known) is in `[from, to]`.
    fn resolve(
        &self,
        pid: u32,
        start: Option<u64>,
        from: i64,
        to: i64,
    ) -> Result<Option<i64>, String> {
        let candidates = self.store.processes_with_pid(pid).map_err(|e| text(&e))?;
        let same_boot = |p: &&ProcessRecord| match (&self.boot_id, &p.meta.key.boot_id) {
            (Some(ours), Some(theirs)) => ours == theirs,
            _ => true,
        };
        // `last_seen` is written at key frames, so it can lag by one key interval.
        let lived_in_window = |p: &&ProcessRecord| {
            p.first_seen_ms <= to && p.last_seen_ms.saturating_add(DEFAULT_KEY_INTERVAL_MS) >= from
        };
        if let Some(start) = start {
            if let Some(p) = candidates
                .iter()
                .filter(same_boot)
                .find(|p| p.meta.key.start_time_ticks == Some(start))
            {
                return Ok(Some(p.id));
            }
        }
        // No start time on one side (another PID namespace, an imported log): the latest
        // process under this PID that lived in the window. Never one whose known start
        // time says it is another process.
        Ok(candidates
            .iter()
            .filter(same_boot)
            .filter(lived_in_window)
            .filter(|p| start.is_none() || p.meta.key.start_time_ticks.is_none())
            .max_by_key(|p| (p.first_seen_ms, p.id))
            .map(|p| p.id))
    }

    /// The stored series each key stands for in `[from, to]`.
    fn wanted(
        &mut self,
        keys: &[SeriesKey],
        starts: &Starts,
        from: i64,
        to: i64,
    ) -> Result<Vec<(SeriesKey, SeriesRef)>, String> {
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let series = match key {
                SeriesKey::Device(uuid) => self.device_id(uuid)?.map(|d| SeriesRef {
                    metric: Metric::UsedBytes,
                    device_id: Some(d),
                    process_id: None,
                }),
                SeriesKey::Process { uuid, pid } => match self.device_id(uuid)? {
                    Some(d) => self
                        .resolve(*pid, starts.get(pid).copied(), from, to)?
                        .map(|p| SeriesRef {
                            metric: Metric::ProcessUsedBytes,
                            device_id: Some(d),
                            process_id: Some(p),
                        }),
                    None => None,
                },
            };
            if let Some(series) = series {
                out.push((key.clone(), series));
            }
        }
        Ok(out)
    }

    /// Points of every wanted series in one pass over `[from, to]`: at most `max_points`
    /// per series, each the highest value of its slice of the window (memory peaks are what
    /// people look for) at the time of the slice's first stored sample. A slice without
    /// samples gives no point, so a gap stays a gap.
    fn series(
        &mut self,
        keys: &[SeriesKey],
        starts: &Starts,
        from: i64,
        to: i64,
        max_points: usize,
    ) -> Result<HashMap<SeriesKey, Vec<Point>>, String> {
        let wanted = self.wanted(keys, starts, from, to)?;
        let mut out: Vec<Vec<Point>> = vec![Vec::new(); wanted.len()];
        if wanted.is_empty() || to < from {
            return Ok(HashMap::new());
        }
        let slices = i128::try_from(max_points.max(1)).unwrap_or(i128::MAX);
        let span = i128::from(to - from).max(1);
        let slice_of = |t: i64| (i128::from(t - from) * slices / span).min(slices - 1);
        // Series ids (small and dense) to indices into `wanted`, learnt as they appear: a
        // vector, as this is looked up for every changed value of every frame.
        let mut index: Vec<Option<Option<usize>>> = Vec::new();
        let mut value: Vec<Option<u64>> = vec![None; wanted.len()];
        let mut last_slice: Vec<Option<i128>> = vec![None; wanted.len()];
        let mut slice_now: Option<i128> = None;
        let mut touched: Vec<usize> = Vec::new();
        self.store
            .scan(
                TimeRange {
                    from_ms: from,
                    to_ms: to,
                },
                |frame| {
                    let mut resolve = |id: u32| {
                        let slot = usize::try_from(id).unwrap_or(usize::MAX);
                        if let Some(Some(known)) = index.get(slot) {
                            return *known;
                        }
                        let found = frame
                            .series(id)
                            .and_then(|s| wanted.iter().position(|(_, w)| *w == s));
                        if slot < 1 << 24 {
                            if index.len() <= slot {
                                index.resize(slot + 1, None);
                            }
                            index[slot] = Some(found);
                        }
                        found
                    };
                    touched.clear();
                    match frame.changed() {
                        Some(changed) => {
                            for &id in changed {
                                if let Some(i) = resolve(id) {
                                    value[i] = frame.entry(id).and_then(highest);
                                    touched.push(i);
                                }
                            }
                        }
                        None => {
                            for (i, (_, series)) in wanted.iter().enumerate() {
                                value[i] = frame.get(*series).and_then(highest);
                                touched.push(i);
                            }
                        }
                    }
                    // A new slice gives every present series a point; within a slice only
                    // the series that changed can raise its highest value.
                    let slice = slice_of(frame.t_ms);
                    if slice_now != Some(slice) {
                        slice_now = Some(slice);
                        touched.clear();
                        touched.extend(0..wanted.len());
                    }
                    for &i in &touched {
                        let Some(bytes) = value[i] else {
                            continue;
                        };
                        if last_slice[i] == Some(slice) {
                            if let Some(p) = out[i].last_mut() {
                                p.bytes = p.bytes.max(bytes);
                            }
                        } else {
                            last_slice[i] = Some(slice);
                            out[i].push(Point {
                                t_ms: frame.t_ms,
                                bytes,
                            });
                        }
                    }
                },
            )
            .map_err(|e| text(&e))?;
        Ok(wanted
            .into_iter()
            .zip(out)
            .map(|((key, _), points)| (key, points))
            .collect())
    }

    fn device_info(&self, d: &DeviceRecord, position: usize) -> DeviceInfo {
        vramctl_store::replay::recorded_device_info(&self.devices, d, position)
    }

    /// The recorded moment at stored time `t` (a sample, or a bucket's start).
    fn observation_at(&mut self, t: i64) -> Result<Option<Observation>, String> {
        // The first CPU-time reading of each process in the minute before `t` (for its CPU
        // use); the moment itself is the store's (`vramctl_store::replay`), the one way a
        // recorded moment is rebuilt (`status --replay` reads the same).
        let mut cpu_first: HashMap<i64, (i64, u64)> = HashMap::new();
        let mut cpu_ids: HashMap<u32, Option<i64>> = HashMap::new();
        self.store
            .scan(
                TimeRange {
                    from_ms: t.saturating_sub(CPU_WINDOW_MS),
                    to_ms: t,
                },
                |frame| {
                    for (id, entry) in frame.entries() {
                        let process = *cpu_ids.entry(id).or_insert_with(|| {
                            frame
                                .series(id)
                                .filter(|s| s.metric == Metric::ProcessCpuTicks)
                                .and_then(|s| s.process_id)
                        });
                        if let (Some(p), Some(v)) = (process, last(entry)) {
                            cpu_first.entry(p).or_insert((frame.t_ms, v));
                        }
                    }
                },
            )
            .map_err(|e| text(&e))?;
        let Some(moment) = self.store.moment_at(t).map_err(|e| text(&e))? else {
            return Ok(None);
        };

        // Who the processes are.
        let mut hosts = BTreeMap::new();
        let mut driver_names = BTreeMap::new();
        let tps = self.ticks_per_second;
        for (&pid, process) in &moment.processes {
            let record = &process.record;
            let command = record.meta.command.clone();
            if !process.visible() {
                // The recorder could not see it in /proc (another PID namespace, or an
                // imported log): only the driver's name, if any.
                if let Some(name) = command {
                    driver_names.insert(pid, name);
                }
                continue;
            }
            let cpu_ticks = process.cpu_ticks;
            let cpu_percent = match (cpu_first.get(&record.id), cpu_ticks) {
                (Some(&(t0, v0)), Some(v1)) if t - t0 >= CPU_MIN_SPAN_MS && v1 >= v0 => {
                    #[allow(clippy::cast_precision_loss)]
                    let pct = (v1 - v0) as f64 / tps as f64 * 1000.0 / (t - t0) as f64 * 100.0;
                    #[allow(clippy::cast_possible_truncation)]
                    Some(pct as f32)
                }
                _ => None,
            };
            hosts.insert(
                pid,
                HostProcess {
                    pid,
                    ppid: None,
                    user: record
                        .meta
                        .user
                        .clone()
                        .or_else(|| record.meta.uid.map(|u| u.to_string())),
                    command: command.unwrap_or_else(|| "-".to_owned()),
                    state: None,
                    start_time_ticks: record.meta.key.start_time_ticks,
                    started_at_unix_ms: None,
                    cpu_percent,
                    cpu_time_ms: cpu_ticks
                        .and_then(|c| u64::try_from(u128::from(c) * 1000 / u128::from(tps)).ok()),
                    ..HostProcess::default()
                },
            );
        }
        Ok(Some(Observation {
            snapshot: Arc::new(Snapshot {
                taken_at_unix_ms: t,
                // The history's times keep the spacing the monotonic clock measured
                // (`vramctl_store::HistoryClock`): a replay's spans are its own.
                monotonic_ms: t,
                driver: Arc::new(DriverInfo::default()),
                devices: moment.devices,
                unopened: Vec::new(),
            }),
            hosts,
            driver_names,
            verdicts: vramctl_observe::verdict::Verdicts::default(),
            // The history keeps the agents' series, not yet read back here: a replay
            // shows no agent figures (absent, not 0).
            agents: vramctl_observe::observation::AgentFigures::default(),
            // The history keeps no pod allocations: a replay says none.
            kubernetes_gpus: std::collections::BTreeMap::new(),
            ooms: vramctl_observe::agent_ooms::AgentOoms::default(),
            pid_view: vramctl_observe::pid_view::PidView::Same,
        }))
    }
}

impl HistorySource for StoreSource {
    fn points(
        &self,
        key: &SeriesKey,
        from_ms: i64,
        to_ms: i64,
        max_points: usize,
    ) -> Result<Vec<Point>, String> {
        let mut series = self.lock().series(
            std::slice::from_ref(key),
            &Starts::new(),
            from_ms,
            to_ms,
            max_points,
        )?;
        Ok(series.remove(key).unwrap_or_default())
    }

    fn load(
        &self,
        keys: &[SeriesKey],
        starts: &Starts,
        from_ms: i64,
        to_ms: i64,
        max_points: usize,
    ) -> HistoryChunk {
        let series = match self.lock().series(keys, starts, from_ms, to_ms, max_points) {
            Ok(series) => series,
            Err(reason) => {
                tracing::warn!(%reason, "Could not load history from the store.");
                HashMap::new()
            }
        };
        HistoryChunk {
            from_ms,
            to_ms,
            series,
            starts: starts.clone(),
        }
    }
}

impl ReplaySource for StoreSource {
    fn range(&self) -> Result<Option<(i64, i64)>, String> {
        let inner = self.lock();
        let first = inner.store.time_after(i64::MIN).map_err(|e| text(&e))?;
        let last = inner
            .store
            .time_at_or_before(i64::MAX)
            .map_err(|e| text(&e))?;
        Ok(first.zip(last))
    }

    fn at_or_before(&self, t_ms: i64) -> Result<Option<Observation>, String> {
        let mut inner = self.lock();
        let mut t = t_ms;
        // A stored time that cannot be decoded (before the first key frame that retention
        // left) is skipped for the one before it.
        while let Some(found) = inner.store.time_at_or_before(t).map_err(|e| text(&e))? {
            if let Some(obs) = inner.observation_at(found)? {
                return Ok(Some(obs));
            }
            t = found - 1;
        }
        Ok(None)
    }

    fn after(&self, t_ms: i64) -> Result<Option<Observation>, String> {
        let mut inner = self.lock();
        let mut t = t_ms;
        while let Some(found) = inner.store.time_after(t).map_err(|e| text(&e))? {
            if let Some(obs) = inner.observation_at(found)? {
                return Ok(Some(obs));
            }
            t = found;
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use vramctl_store::{
        DeviceMeta, DeviceSample, DeviceSampleState, Observed, ProcessKey, ProcessList,
        ProcessMeta, ProcessOnDevice, ProcessSample, TickSample,
    };

    use super::*;
    use crate::fixtures::{T0_MS, from_scenario, recorded};
    use crate::replay::{Seek, seek_frame};
    use vramctl_core::types::{DeviceState, Field, ProcessKind, Unavailable};

    /// What a recording cannot give back, removed from an observation: the driver's
    /// versions, which list a process came from, MIG instance ids, /proc facts other than
    /// identity, user, command and CPU time, processes that hold no GPU memory (tree
    /// parents), reasons the recorder does not keep, CPU use (computed over a minute in
    /// replay) and the monotonic clock. Activity lists that are empty cannot be told from
    /// none.
    fn recordable(obs: &Observation) -> Observation {
        let mut snapshot = (*obs.snapshot).clone();
        // The history keeps one time per tick, with the spacing the monotonic clock
        // measured: a replayed snapshot's monotonic time is that time.
        snapshot.monotonic_ms = snapshot.taken_at_unix_ms;
        snapshot.driver = Arc::new(DriverInfo::default());
        snapshot.unopened.clear();
        let mut on_gpu = Vec::new();
        for device in &mut snapshot.devices {
            let mut info = (*device.info).clone();
            info.minor_number = None;
            info.mig_enabled = (!info.mig_instances.is_empty()).then_some(true);
            for mig in &mut info.mig_instances {
                mig.gpu_instance_id = None;
                mig.compute_instance_id = None;
            }
            device.info = Arc::new(info);
            if let DeviceState::Ok(reading) = &mut device.state {
                for p in reading.processes.iter_mut().flatten() {
                    p.kind = ProcessKind::Compute;
                    p.gpu_instance_id = None;
                    p.compute_instance_id = None;
                    on_gpu.push(p.pid);
                }
                if let Some(list) = &mut reading.processes {
                    list.sort_by_key(|p| p.pid);
                }
                if let Some(list) = &mut reading.process_activity {
                    for a in list.iter_mut() {
                        a.memory_percent = 0;
                    }
                    // Activity of a process that holds no memory here is not recorded.
                    let pids: Vec<u32> =
                        reading.processes.iter().flatten().map(|p| p.pid).collect();
                    list.retain(|a| pids.contains(&a.pid));
                    list.sort_by_key(|a| a.pid);
                }
                if reading.process_activity.as_ref().is_some_and(Vec::is_empty) {
                    reading.process_activity = None;
                }
                reading.dropped.clear();
                reading.missing.retain(|field, _| {
                    matches!(
                        field,
                        Field::Memory
                            | Field::Utilization
                            | Field::Temperature
                            | Field::Power
                            | Field::ComputeProcesses
                    )
                });
            }
        }
        let hosts = obs
            .hosts
            .iter()
            .filter(|(pid, _)| on_gpu.contains(pid))
            .map(|(pid, h)| {
                let mut h = h.clone();
                h.ppid = None;
                h.state = None;
                h.started_at_unix_ms = None;
                h.cpu_percent = None;
                (*pid, h)
            })
            .collect();
        Observation {
            snapshot: Arc::new(snapshot),
            hosts,
            driver_names: obs.driver_names.clone(),
            verdicts: vramctl_observe::verdict::Verdicts::default(),
            agents: vramctl_observe::observation::AgentFigures::default(),
            kubernetes_gpus: std::collections::BTreeMap::new(),
            ooms: vramctl_observe::agent_ooms::AgentOoms::default(),
            pid_view: vramctl_observe::pid_view::PidView::Same,
        }
    }

    fn without_cpu_use(mut obs: Observation) -> Observation {
        for h in obs.hosts.values_mut() {
            h.cpu_percent = None;
        }
        obs
    }

    #[test]
    fn every_recorded_moment_comes_back_as_it_was_seen() {
        for (scenario, times) in [
            ("h200-training.toml", vec![0.0, 10.0, 20.0, 130.0]),
            ("mig.toml", vec![0.0, 1.0]),
            ("fault-gpu-lost.toml", vec![0.0, 5.0, 12.0, 13.0]),
            ("fault-not-supported.toml", vec![0.0, 1.0]),
            ("eight-gpus-30-procs.toml", vec![0.0, 1.0, 2.0]),
        ] {
            let observations = from_scenario(scenario, &times);
            let source = StoreSource::new(recorded(&observations), None);
            let first = observations[0].taken_at_unix_ms();
            let last = observations[observations.len() - 1].taken_at_unix_ms();
            assert_eq!(source.range().unwrap(), Some((first, last)), "{scenario}");
            for obs in &observations {
                let t = obs.taken_at_unix_ms();
                let back = source.at_or_before(t).unwrap().expect("a moment");
                assert_eq!(
                    without_cpu_use(back),
                    recordable(obs),
                    "{scenario} at {} s",
                    (t - T0_MS) / 1000
                );
            }
            assert!(source.at_or_before(first - 1).unwrap().is_none());
            assert!(source.after(last).unwrap().is_none());
        }
    }

    #[test]
    fn seeks_land_on_recorded_moments() {
        let observations = from_scenario("h200-training.toml", &[0.0, 10.0, 20.0]);
        let source = StoreSource::new(recorded(&observations), None);
        let at = |o: Option<Observation>| o.map(|o| (o.taken_at_unix_ms() - T0_MS) / 1000);
        assert_eq!(at(source.at_or_before(T0_MS + 15_000).unwrap()), Some(10));
        assert_eq!(at(source.after(T0_MS + 10_000).unwrap()), Some(20));
        assert_eq!(at(source.after(i64::MIN).unwrap()), Some(0));
        assert_eq!(at(source.at_or_before(i64::MAX).unwrap()), Some(20));
        let frame = seek_frame(&source, Seek::Before(T0_MS + 10_000), 60_000, 100).unwrap();
        assert_eq!(frame.observation.map(|o| o.taken_at_unix_ms()), Some(T0_MS));
        assert_eq!(frame.range, Some((T0_MS, T0_MS + 20_000)));
    }

    #[test]
    fn chart_series_are_the_recorded_values_and_keep_peaks_when_thinned() {
        let times: Vec<f64> = (0..=120).map(f64::from).collect();
        let observations = from_scenario("h200-training.toml", &times);
        let source = StoreSource::new(recorded(&observations), None);
        let last = &observations[observations.len() - 1];
        let keys = crate::replay::keys_of(last);
        let starts = last.starts();
        let (from, to) = (T0_MS, T0_MS + 120_000);
        let chunk = source.load(&keys, &starts, from, to, 1000);
        for key in &keys {
            let expected: Vec<Point> = observations
                .iter()
                .filter_map(|o| {
                    let bytes = o.snapshot.devices.iter().find_map(|d| {
                        let r = d.reading()?;
                        match key {
                            SeriesKey::Device(u) if *u == d.info.uuid => {
                                r.memory.map(|m| m.used_bytes)
                            }
                            SeriesKey::Process { uuid, pid } if *uuid == d.info.uuid => r
                                .processes
                                .iter()
                                .flatten()
                                .find(|p| p.pid == *pid)
                                .and_then(|p| p.used_bytes),
                            _ => None,
                        }
                    })?;
                    Some(Point {
                        t_ms: o.taken_at_unix_ms(),
                        bytes,
                    })
                })
                .collect();
            assert_eq!(chunk.series.get(key), Some(&expected), "{key:?}");
        }
        // Thinned to 10 points: each the highest of its slice.
        let thin = source.load(&keys, &starts, from, to, 10);
        let device = &keys[0];
        let full = &chunk.series[device];
        let points = &thin.series[device];
        assert_eq!(points.len(), 10);
        assert_eq!(
            points.iter().map(|p| p.bytes).max(),
            full.iter().map(|p| p.bytes).max()
        );
        assert_eq!(
            source.points(device, from, to, 1000).unwrap(),
            *full,
            "one series alone is the same"
        );
    }

    const GIB: u64 = 1 << 30;

    fn gpu_tick(t: i64, procs: &[(u32, u64, u64, Option<u64>)]) -> TickSample {
        TickSample {
            at_unix_ms: t,
            unavailable: None,
            devices: vec![DeviceSample {
                device: DeviceMeta {
                    uuid: "GPU-a".into(),
                    index: Some(0),
                    name: Some("NVIDIA H200".into()),
                    pci_bus_id: None,
                    parent_uuid: None,
                },
                state: DeviceSampleState::Read {
                    metrics: vec![
                        (
                            Metric::UsedBytes,
                            Observed::Value(procs.iter().map(|p| p.1).sum()),
                        ),
                        (Metric::TotalBytes, Observed::Value(100 * GIB)),
                        (Metric::PowerMw, Observed::Missing("not supported".into())),
                    ],
                    processes: ProcessList::Observed(
                        procs
                            .iter()
                            .map(|&(pid, bytes, _, _)| ProcessOnDevice {
                                pid,
                                used_bytes: Some(bytes),
                                sm_percent: None,
                                agent: None,
                            })
                            .collect(),
                    ),
                },
            }],
            processes: procs
                .iter()
                .map(|&(pid, _, start, cpu)| ProcessSample {
                    meta: ProcessMeta {
                        key: ProcessKey {
                            boot_id: Some("boot-1".into()),
                            pid,
                            start_time_ticks: Some(start),
                        },
                        user: Some("alice".into()),
                        command: Some(format!("python job{start}.py")),
                        ..ProcessMeta::default()
                    },
                    cpu_ticks: cpu,
                })
                .collect(),
        }
    }

    /// PID 7 is one process (start 100) for 10 s, nothing for 10 s, then another (start
    /// 200) for 10 s.
    fn reused_pid() -> Store {
        let mut store = Store::open_in_memory().unwrap();
        for s in 0..30 {
            let t = T0_MS + s * 1000;
            let procs: &[(u32, u64, u64, Option<u64>)] = match s {
                0..10 => &[(7, GIB, 100, None)],
                10..20 => &[],
                _ => &[(7, 5 * GIB, 200, None)],
            };
            store.append(&gpu_tick(t, procs)).unwrap();
        }
        store
    }

    #[test]
    fn a_process_series_is_that_of_the_same_process_not_of_its_pid() {
        let key = SeriesKey::Process {
            uuid: "GPU-a".into(),
            pid: 7,
        };
        let load = |source: &StoreSource, starts: &[(u32, u64)], from_s: i64, to_s: i64| {
            let starts: Starts = starts.iter().copied().collect();
            source
                .load(
                    std::slice::from_ref(&key),
                    &starts,
                    T0_MS + from_s * 1000,
                    T0_MS + to_s * 1000,
                    100,
                )
                .series
                .get(&key)
                .map(|p| p.iter().map(|p| p.bytes / GIB).collect::<Vec<_>>())
        };
        let live = StoreSource::new(reused_pid(), Some("boot-1".into()));
        assert_eq!(load(&live, &[(7, 200)], 0, 29), Some(vec![5; 10]));
        assert_eq!(load(&live, &[(7, 100)], 0, 29), Some(vec![1; 10]));
        // A process the store never saw has no past, even under a known PID.
        assert_eq!(load(&live, &[(7, 300)], 0, 29), None);
        // Without a start time (another namespace): the latest that lived in the window.
        assert_eq!(load(&live, &[], 0, 29), Some(vec![5; 10]));
        assert_eq!(load(&live, &[], 0, 12), Some(vec![1; 10]));
        // Another boot's process with the same PID and start time is not this one.
        let other_boot = StoreSource::new(reused_pid(), Some("boot-2".into()));
        assert_eq!(load(&other_boot, &[(7, 200)], 0, 29), None);
    }

    #[test]
    fn replay_shows_cpu_use_over_the_minute_before_the_cursor() {
        let tps = procfs::ticks_per_second().max(1);
        let mut store = Store::open_in_memory().unwrap();
        // CPU time read every 10 s: half a core.
        for s in 0..=90 {
            let cpu = (s % 10 == 0).then(|| u64::try_from(s).unwrap() * tps / 2);
            store
                .append(&gpu_tick(T0_MS + s * 1000, &[(7, GIB, 100, cpu)]))
                .unwrap();
        }
        let source = StoreSource::new(store, None);
        let at = |s: i64| source.at_or_before(T0_MS + s * 1000).unwrap().unwrap();
        let host = |o: &Observation| o.hosts[&7].clone();
        assert_eq!(host(&at(5)).cpu_percent, None, "too little to say");
        let pct = host(&at(90)).cpu_percent.unwrap();
        assert!((pct - 50.0).abs() < 0.5, "{pct}");
        assert_eq!(host(&at(90)).cpu_time_ms, Some(45_000));
        assert_eq!(host(&at(90)).command, "python job100.py");
        assert_eq!(host(&at(90)).user.as_deref(), Some("alice"));
        // Power was recorded as not supported: missing with its reason, not zero.
        let obs = at(90);
        let reading = obs.snapshot.devices[0].reading().unwrap();
        assert_eq!(reading.power_mw, None);
        assert_eq!(
            reading.missing.get(&Field::Power),
            Some(&Unavailable::NotSupported)
        );
    }

    #[test]
    fn nvml_down_shows_every_known_gpu_as_unreadable_with_the_reason() {
        let mut store = Store::open_in_memory().unwrap();
        store
            .append(&gpu_tick(T0_MS, &[(7, GIB, 100, None)]))
            .unwrap();
        store
            .append(&TickSample {
                at_unix_ms: T0_MS + 1000,
                unavailable: Some("NVML did not start: driver not loaded".into()),
                ..TickSample::default()
            })
            .unwrap();
        let source = StoreSource::new(store, None);
        let obs = source.at_or_before(T0_MS + 1000).unwrap().unwrap();
        assert_eq!(
            obs.snapshot.devices[0].state,
            DeviceState::Error {
                reason: "NVML did not start: driver not loaded".into()
            }
        );
        assert!(obs.hosts.is_empty());
    }
}
