//! Live analysis of every process on every GPU: one [`Snapshot`] in, the verdicts that
//! changed out.
//!
//! [`FleetTracker`] is what `leaks --watch`, `serve` and `top` share. It keeps one
//! [`ProcessTracker`] per series — a process on a device, keyed by the device's UUID and
//! the process's identity (PID and start time: a reused PID is a new process) — and feeds
//! it everything a tick says about that process: its memory, its SM activity where the
//! driver reports it (`DeviceReading::process_activity`), the device's utilization with the
//! number of processes on it, the process's CPU time, and the free memory for the time to
//! full. Series whose process has not been seen for `forget_after` are dropped, so memory
//! stays bounded on a machine that runs jobs for months.
//!
//! Pure like the rest of `analysis`: no clock and no I/O. Time is the snapshots': each is
//! placed on a [`Timeline`] (the wall time of the first snapshot, counted on by the
//! snapshots' monotonic time), so a wall-clock step (NTP, a VM resumed) neither freezes the
//! verdicts (a step back used to make every snapshot look older than the last) nor makes a
//! process idle for an hour it was not watched (a step forward). Every time in a report is
//! on that time line ([`FleetTracker::now_ms`] is the latest snapshot's place on it); it is
//! the wall clock until the clock steps. What only /proc knows (start time, CPU time) the
//! caller passes in as [`ProcessFacts`], read on its own thread; the tracker never reads
//! /proc itself.

use std::collections::HashMap;
use std::time::Duration;

use super::config::ms;
use super::{
    AnalysisError, Cadence, CpuSample, DeviceActivitySample, FreeHistory, LeakConfig,
    ProcessTracker, Sample, SeriesContext, SeriesReport, SmSample, VerdictChange,
};
use vramctl_core::clock::{ClockTime, Timeline};
use vramctl_core::types::{DeviceInfo, DeviceReading, ProcessUsage, Snapshot};
use vramctl_procs::procinfo::{ProcessFacts, ProcessIdentity};

/// How long a series is kept after its process was last seen, by default: long enough to
/// ride out a device that is unreadable for a few ticks or a process list the driver
/// briefly lost, short enough that a node running thousands of jobs a day keeps little.
pub const DEFAULT_FORGET_AFTER: Duration = Duration::from_secs(60);

/// Settings of a [`FleetTracker`].
#[derive(Debug, Clone, PartialEq)]
pub struct FleetConfig {
    /// Thresholds of every series' analysis.
    pub leak: LeakConfig,
    /// A series whose process has not been listed for this long (snapshot time) is
    /// forgotten, with its report.
    pub forget_after: Duration,
    /// How often each series is re-analysed.
    pub cadence: Cadence,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            leak: LeakConfig::default(),
            forget_after: DEFAULT_FORGET_AFTER,
            cadence: Cadence::INTERACTIVE,
        }
    }
}

/// One series: a process on a device.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesKey {
    /// The GPU's UUID (the parent GPU's for a process on a MIG instance).
    pub device_uuid: String,
    /// The process's PID.
    pub pid: u32,
    /// Its start time in clock ticks after boot, when /proc could see it.
    pub start_time_ticks: Option<u64>,
}

/// Where a series lives, as the user knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesPlace {
    /// NVML index of the GPU when the series started.
    pub device_index: u32,
    /// The GPU's product name.
    pub device_name: Option<String>,
    /// The MIG instance the process runs on, if any.
    pub mig_uuid: Option<String>,
    /// `GPU 0` (or `GPU 0 MIG 3` on a MIG instance), as the explanation names it.
    pub label: String,
}

/// A verdict that changed in this tick.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetChange {
    /// The series.
    pub key: SeriesKey,
    /// The change, with the full report behind it.
    pub change: VerdictChange,
}

/// What one tick changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TickChanges {
    /// Verdicts that differ from their series' previous one (a new series' first verdict
    /// included), in device order then PID order.
    pub changes: Vec<FleetChange>,
    /// Series forgotten in this tick: their process has not been listed for
    /// `forget_after`. Drop whatever you keep for them.
    pub forgotten: Vec<SeriesKey>,
}

/// One series' state.
#[derive(Debug, Clone)]
struct Entry {
    tracker: ProcessTracker,
    place: SeriesPlace,
    /// Tick number at which the process was last listed with memory.
    last_tick: u64,
    last_seen_ms: i64,
    /// Tick number of the last allocated-bytes sample (the agent answered).
    last_allocated_tick: Option<u64>,
}

/// Live leak and idle-holder analysis of every process on every GPU.
///
/// ```
/// use vramctl_leaks::analysis::live::{FleetConfig, FleetTracker};
/// use vramctl_procs::procinfo::ProcessFacts;
/// # fn snapshots() -> Vec<vramctl_core::types::Snapshot> { Vec::new() }
/// let mut fleet = FleetTracker::new(FleetConfig::default()).unwrap();
/// for snapshot in snapshots() {
///     // Facts from /proc for each listed PID (here: none visible).
///     let changed = fleet.observe(&snapshot, |_pid| ProcessFacts::default());
///     for c in &changed.changes {
///         println!("PID {} on {}: {}", c.key.pid, c.key.device_uuid, c.change.report.explanation);
///     }
/// }
/// ```
#[derive(Debug, Clone)]
pub struct FleetTracker {
    cfg: FleetConfig,
    forget_after_ms: i64,
    entries: HashMap<SeriesKey, Entry>,
    /// The series listed at the last tick, by (device UUID, PID).
    current: HashMap<(String, u32), SeriesKey>,
    tick: u64,
    timeline: Timeline,
    last_t_ms: Option<i64>,
    /// Each place's (GPU, or MIG instance) free memory at earlier times, kept once for
    /// all the processes on it.
    free: HashMap<(String, Option<String>), FreeHistory>,
}

impl FleetTracker {
    /// A tracker with no series yet.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidConfig`] for bad thresholds.
    pub fn new(cfg: FleetConfig) -> Result<Self, AnalysisError> {
        cfg.leak.validate()?;
        Ok(Self {
            forget_after_ms: ms(cfg.forget_after),
            cfg,
            entries: HashMap::new(),
            current: HashMap::new(),
            tick: 0,
            timeline: Timeline::new(),
            last_t_ms: None,
            free: HashMap::new(),
        })
    }

    /// Where the latest snapshot lies on the tracker's time line, the time its reports
    /// speak for (`None` before the first).
    pub fn now_ms(&self) -> Option<i64> {
        self.last_t_ms
    }

    /// Feeds one snapshot. `facts` is asked once per PID listed with memory on a device
    /// that answered.
    ///
    /// A snapshot not later than the previous one on the monotonic clock is ignored (it
    /// returns no change); the wall clock may step either way. A device that could not be
    /// read this tick leaves its series untouched; their next sample is marked as following
    /// a gap, as is that of a process missing from a list for some ticks.
    pub fn observe(
        &mut self,
        snapshot: &Snapshot,
        facts: impl FnMut(u32) -> ProcessFacts,
    ) -> TickChanges {
        self.observe_with_allocated(snapshot, facts, |_, _| None)
    }

    /// [`observe`](Self::observe) with the allocator's allocated bytes of each process
    /// whose in-process agent answered: `allocated(device_uuid, pid)` is asked once per
    /// listed process and device (`None`: no agent, or it names no figure for that GPU).
    /// Where it answers, the leak verdict is judged on live tensors (`Basis::Allocated`),
    /// immune to the caching allocator's reserve; a process whose agent stops answering
    /// falls back to NVML's memory without a verdict flipping on that alone
    /// ([`AGENT_SILENT_AFTER_MS`](super::AGENT_SILENT_AFTER_MS)).
    pub fn observe_with_allocated(
        &mut self,
        snapshot: &Snapshot,
        mut facts: impl FnMut(u32) -> ProcessFacts,
        mut allocated: impl FnMut(&str, u32) -> Option<u64>,
    ) -> TickChanges {
        let t = self.timeline.place(ClockTime {
            unix_ms: snapshot.taken_at_unix_ms,
            monotonic_ms: snapshot.monotonic_ms,
        });
        if self.last_t_ms.is_some_and(|last| t <= last) {
            return TickChanges::default();
        }
        self.last_t_ms = Some(t);
        let previous_tick = self.tick;
        self.tick += 1;
        let mut out = TickChanges::default();
        // Series of devices that could not be read this tick stay current: the process is
        // probably still there.
        let mut current = HashMap::with_capacity(self.current.len());
        // One /proc read per process per tick, however many GPUs it holds memory on.
        let mut facts_of: HashMap<u32, ProcessFacts> = HashMap::new();
        for device in &snapshot.devices {
            let Some(reading) = device.reading() else {
                current.extend(
                    self.current
                        .iter()
                        .filter(|((uuid, _), _)| *uuid == device.info.uuid)
                        .map(|(k, v)| (k.clone(), v.clone())),
                );
                continue;
            };
            let Some(processes) = reading.processes.as_ref() else {
                continue;
            };
            let on_device = u32::try_from(processes.len()).unwrap_or(u32::MAX);
            for process in processes {
                let Some(bytes) = process.used_bytes else {
                    continue;
                };
                let f = *facts_of
                    .entry(process.pid)
                    .or_insert_with(|| facts(process.pid));
                let key = SeriesKey {
                    device_uuid: device.info.uuid.clone(),
                    pid: process.pid,
                    start_time_ticks: f.start_time_ticks,
                };
                let tick = self.tick;
                if !self.entries.contains_key(&key) {
                    // The configuration was validated in `new`: this cannot fail.
                    let Ok(entry) = self.new_entry(&device.info, reading, process, f) else {
                        continue;
                    };
                    self.entries.insert(key.clone(), entry);
                }
                let Some(entry) = self.entries.get_mut(&key) else {
                    continue;
                };
                let gap_before = entry.last_tick != 0 && entry.last_tick != previous_tick;
                entry.last_tick = tick;
                entry.last_seen_ms = t;
                let tracker = &mut entry.tracker;
                if let Some(sm) = reading
                    .process_activity
                    .as_ref()
                    .and_then(|a| a.iter().find(|a| a.pid == process.pid))
                {
                    tracker.push_sm(SmSample {
                        t_unix_ms: t,
                        sm_percent: sm.sm_percent,
                    });
                }
                if let Some(util) = reading.utilization_gpu_percent {
                    tracker.push_device(DeviceActivitySample {
                        t_unix_ms: t,
                        utilization_gpu_percent: util,
                        processes_on_device: on_device,
                    });
                }
                if let Some(cpu) = f.cpu_time_ms {
                    tracker.push_cpu(CpuSample {
                        t_unix_ms: t,
                        cpu_time_ms: cpu,
                    });
                }
                let free_now = free_bytes(reading, entry.place.mig_uuid.as_deref());
                let history = self
                    .free
                    .entry((device.info.uuid.clone(), entry.place.mig_uuid.clone()))
                    .or_default();
                history.push(t, free_now);
                tracker.set_free_bytes(free_now, history.snapshot());
                if let Some(live) = allocated(&device.info.uuid, process.pid) {
                    // A tick the agent missed (a poll past its deadline) is a gap in the
                    // allocated series, as a tick the process was missing is in NVML's.
                    let mut a = Sample::new(t, live);
                    a.gap_before = entry
                        .last_allocated_tick
                        .is_some_and(|at| at != previous_tick);
                    entry.last_allocated_tick = Some(tick);
                    tracker.push_allocated(a);
                }
                let mut sample = Sample::new(t, bytes);
                sample.gap_before = gap_before;
                if let Some(change) = tracker.push(sample) {
                    out.changes.push(FleetChange {
                        key: key.clone(),
                        change,
                    });
                }
                current.insert((key.device_uuid.clone(), key.pid), key);
            }
        }
        self.current = current;
        let horizon = t.saturating_sub(self.forget_after_ms);
        let mut forgotten: Vec<SeriesKey> = self
            .entries
            .iter()
            .filter(|(_, e)| e.last_seen_ms < horizon)
            .map(|(k, _)| k.clone())
            .collect();
        forgotten.sort();
        for key in &forgotten {
            self.entries.remove(key);
        }
        out.forgotten = forgotten;
        out.changes.sort_by(|a, b| {
            let place = |k: &SeriesKey| self.entries.get(k).map(|e| e.place.device_index);
            (place(&a.key), &a.key).cmp(&(place(&b.key), &b.key))
        });
        out
    }

    fn new_entry(
        &self,
        info: &DeviceInfo,
        reading: &DeviceReading,
        process: &ProcessUsage,
        facts: ProcessFacts,
    ) -> Result<Entry, AnalysisError> {
        let mig = process.gpu_instance_id.and_then(|gi| {
            info.mig_instances
                .iter()
                .find(|m| m.gpu_instance_id == Some(gi))
        });
        let mig_uuid = mig.map(|m| m.uuid.clone());
        let capacity = match &mig_uuid {
            Some(uuid) => reading.mig_memory(uuid).map(|m| m.total_bytes),
            None => reading.memory.map(|m| m.total_bytes),
        };
        let label = match process.gpu_instance_id.filter(|_| mig_uuid.is_some()) {
            Some(gi) => format!("GPU {} MIG {gi}", info.index),
            None => format!("GPU {}", info.index),
        };
        let ctx = SeriesContext {
            capacity_bytes: capacity,
            free_bytes: None,
            free_history: Default::default(),
            process_start_unix_ms: facts.started_at_unix_ms,
            device_label: Some(label.clone()),
            ended: false,
            device_total: false,
        };
        let tracker =
            ProcessTracker::new(ctx, self.cfg.leak.clone())?.with_cadence(self.cfg.cadence);
        Ok(Entry {
            tracker,
            place: SeriesPlace {
                device_index: info.index,
                device_name: info.name.clone(),
                mig_uuid,
                label,
            },
            last_tick: 0,
            last_seen_ms: i64::MIN,
            last_allocated_tick: None,
        })
    }

    /// The series listed at the last tick, with their latest reports (a series has no
    /// report until its first sample was analysed), ordered by device index then PID.
    pub fn current(&self) -> Vec<(&SeriesKey, &SeriesPlace, Option<&SeriesReport>)> {
        let mut out: Vec<_> = self
            .current
            .values()
            .filter_map(|k| {
                let e = self.entries.get(k)?;
                Some((k, &e.place, e.tracker.report()))
            })
            .collect();
        out.sort_by(|a, b| (a.1.device_index, a.0).cmp(&(b.1.device_index, b.0)));
        out
    }

    /// The report of the process listed as `pid` on the GPU `device_uuid` at the last
    /// tick (what a per-PID display such as a metrics label or a table row wants).
    pub fn report_for(&self, device_uuid: &str, pid: u32) -> Option<&SeriesReport> {
        let key = self.current.get(&(device_uuid.to_owned(), pid))?;
        self.entries.get(key)?.tracker.report()
    }

    /// The latest report of a series, while it is kept (also after its process left,
    /// until it is forgotten).
    pub fn report(&self, key: &SeriesKey) -> Option<&SeriesReport> {
        self.entries.get(key)?.tracker.report()
    }

    /// Where a series lives, while it is kept.
    pub fn place(&self, key: &SeriesKey) -> Option<&SeriesPlace> {
        self.entries.get(key).map(|e| &e.place)
    }

    /// The full identity of a series' process, given this boot's id; `None` when its
    /// start time is unknown.
    pub fn identity(key: &SeriesKey, boot_id: &str) -> Option<ProcessIdentity> {
        Some(ProcessIdentity {
            boot_id: boot_id.to_owned(),
            pid: key.pid,
            start_time_ticks: key.start_time_ticks?,
        })
    }

    /// Series kept (current and recently ended).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no series is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Full analyses run so far, over all series (for cost measurements).
    pub fn analyses(&self) -> u64 {
        self.entries.values().map(|e| e.tracker.analyses()).sum()
    }
}

/// The free memory of the process's MIG instance, or of the GPU.
fn free_bytes(reading: &DeviceReading, mig_uuid: Option<&str>) -> Option<u64> {
    match mig_uuid {
        Some(uuid) => reading.mig_memory(uuid).map(|m| m.free_bytes),
        None => reading.memory.map(|m| m.free_bytes),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::analysis::Verdict;
    use vramctl_core::types::{
        DeviceSnapshot, DeviceState, DriverInfo, MemoryReading, MigInstanceInfo, MigReading,
        ProcessActivity, ProcessKind,
    };

    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * MIB;
    const T0: i64 = 1_700_000_000_000;
    const TOTAL: u64 = 141 * GIB;

    fn info(index: u32, uuid: &str) -> Arc<DeviceInfo> {
        Arc::new(DeviceInfo {
            index,
            uuid: uuid.to_owned(),
            name: Some("NVIDIA H200".to_owned()),
            pci_bus_id: None,
            minor_number: None,
            mig_enabled: Some(false),
            mig_instances: Vec::new(),
        })
    }

    fn usage(pid: u32, bytes: u64) -> ProcessUsage {
        ProcessUsage {
            pid,
            used_bytes: Some(bytes),
            kind: ProcessKind::Compute,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    fn reading(processes: Vec<ProcessUsage>, util: Option<u32>) -> DeviceReading {
        let used: u64 = processes.iter().filter_map(|p| p.used_bytes).sum();
        DeviceReading {
            memory: Some(MemoryReading {
                total_bytes: TOTAL,
                used_bytes: used,
                reserved_bytes: 0,
                free_bytes: TOTAL - used,
            }),
            utilization_gpu_percent: util,
            processes: Some(processes),
            ..DeviceReading::default()
        }
    }

    fn snapshot(t: i64, devices: Vec<(Arc<DeviceInfo>, DeviceState)>) -> Snapshot {
        Snapshot {
            taken_at_unix_ms: t,
            monotonic_ms: t,
            driver: Arc::new(DriverInfo::default()),
            devices: devices
                .into_iter()
                .map(|(info, state)| DeviceSnapshot { info, state })
                .collect(),
            unopened: Vec::new(),
        }
    }

    fn ok(info: &Arc<DeviceInfo>, r: DeviceReading) -> (Arc<DeviceInfo>, DeviceState) {
        (Arc::clone(info), DeviceState::Ok(r))
    }

    /// `mb_per_s` MB/s in 2 MiB granules after `after_s`.
    fn leaking(t_ms: i64, after_s: i64, mb_per_s: u64) -> u64 {
        let grown =
            ((t_ms - after_s * 1000).max(0) as u64) * mb_per_s * 1000 / (2 * MIB) * (2 * MIB);
        GIB + grown
    }

    fn visible(start: u64) -> impl FnMut(u32) -> ProcessFacts {
        move |_| ProcessFacts {
            start_time_ticks: Some(start),
            started_at_unix_ms: Some(T0),
            cpu_time_ms: None,
        }
    }

    #[test]
    fn a_leak_among_steady_processes_is_reported_once_with_its_series() {
        let gpu0 = info(0, "GPU-a");
        let gpu1 = info(1, "GPU-b");
        let mut fleet = FleetTracker::new(FleetConfig::default()).unwrap();
        let mut changes = Vec::new();
        // 120 s at 10 Hz: PID 10 leaks on GPU 1 after 40 s; PIDs 11 and 12 hold steady.
        for i in 0..1200 {
            let t = T0 + i * 100;
            let s = snapshot(
                t,
                vec![
                    ok(&gpu0, reading(vec![usage(11, 4 * GIB)], Some(50))),
                    ok(
                        &gpu1,
                        reading(
                            vec![usage(10, leaking(t - T0, 40, 16)), usage(12, 2 * GIB)],
                            Some(90),
                        ),
                    ),
                ],
            );
            let tick = fleet.observe(&s, visible(77));
            assert!(tick.forgotten.is_empty());
            changes.extend(tick.changes);
        }
        let first: Vec<(u32, Option<Verdict>, Verdict)> = changes
            .iter()
            .filter(|c| c.change.from.is_none())
            .map(|c| (c.key.pid, c.change.from, c.change.to))
            .collect();
        // First verdicts come in device order: GPU 0's PID 11, then GPU 1's 10 and 12.
        assert_eq!(
            first,
            vec![
                (11, None, Verdict::Stable),
                (10, None, Verdict::Stable),
                (12, None, Verdict::Stable)
            ]
        );
        let leaks: Vec<&FleetChange> = changes
            .iter()
            .filter(|c| c.change.to == Verdict::Leak)
            .collect();
        assert_eq!(leaks.len(), 1, "{changes:#?}");
        let leak = leaks[0];
        assert_eq!(
            leak.key,
            SeriesKey {
                device_uuid: "GPU-b".into(),
                pid: 10,
                start_time_ticks: Some(77)
            }
        );
        let delay_ms = leak.change.at_unix_ms - (T0 + 40_000);
        assert!((5_000..30_000).contains(&delay_ms), "delay {delay_ms}");
        assert!(leak.change.report.explanation.contains("GPU 1 is full in"));
        // Nothing else ever leaked; the current view lists all three, device order.
        let current: Vec<(u32, Option<Verdict>)> = fleet
            .current()
            .iter()
            .map(|(k, _, r)| (k.pid, r.map(|r| r.verdict)))
            .collect();
        assert_eq!(
            current,
            vec![
                (11, Some(Verdict::Stable)),
                (10, Some(Verdict::Leak)),
                (12, Some(Verdict::Stable))
            ]
        );
        assert_eq!(
            fleet.report_for("GPU-b", 10).map(|r| r.verdict),
            Some(Verdict::Leak)
        );
        assert_eq!(fleet.report_for("GPU-a", 10), None);
        let place = fleet.place(&leak.key).unwrap();
        assert_eq!((place.device_index, place.label.as_str()), (1, "GPU 1"));
        assert_eq!(
            FleetTracker::identity(&leak.key, "boot").map(|i| i.start_time_ticks),
            Some(77)
        );
    }

    /// 200 s at 1 Hz with the wall clock stepping `step_ms` at 100 s while the monotonic
    /// clock goes on: PID 1 leaks 16 MB/s from 40 s, PID 2 holds 6 GiB at 0 % SM.
    fn across_a_wall_clock_step(step_ms: i64) -> FleetTracker {
        let gpu = info(0, "GPU-a");
        let mut fleet = FleetTracker::new(FleetConfig {
            leak: LeakConfig {
                idle_for: Duration::from_secs(60),
                ..LeakConfig::default()
            },
            ..FleetConfig::default()
        })
        .unwrap();
        for i in 0..200 {
            let mono = i * 1000;
            let wall = T0 + mono + if i >= 100 { step_ms } else { 0 };
            let mut r = reading(
                vec![usage(1, leaking(mono, 40, 16)), usage(2, 6 * GIB)],
                Some(50),
            );
            r.process_activity = Some(vec![
                ProcessActivity {
                    pid: 1,
                    sm_percent: 70,
                    memory_percent: 0,
                },
                ProcessActivity {
                    pid: 2,
                    sm_percent: 0,
                    memory_percent: 0,
                },
            ]);
            let mut s = snapshot(wall, vec![ok(&gpu, r)]);
            s.monotonic_ms = mono;
            fleet.observe(&s, visible(3));
        }
        fleet
    }

    #[test]
    fn a_wall_clock_step_neither_freezes_nor_stretches_live_verdicts() {
        for step_ms in [-3_600_000, 3_600_000] {
            let fleet = across_a_wall_clock_step(step_ms);
            // Every sample counted: a step back no longer makes the rest look stale.
            assert_eq!(fleet.now_ms(), Some(T0 + 199_000), "step {step_ms}");
            let leak = fleet.report_for("GPU-a", 1).unwrap();
            assert_eq!(
                leak.verdict,
                Verdict::Leak,
                "{step_ms}: {}",
                leak.explanation
            );
            assert!(leak.samples >= 190, "{step_ms}: {} samples", leak.samples);
            let rate = leak.slope_bytes_per_sec / 16e6;
            assert!(
                (0.9..1.1).contains(&rate),
                "{step_ms}: slope {rate} of 16 MB/s"
            );
            // Idle for the 200 s it was watched, not an hour more or frozen at 100 s.
            let idle = fleet.report_for("GPU-a", 2).unwrap();
            assert_eq!(idle.verdict, Verdict::IdleHolder, "{step_ms}");
            let idle_sec = idle.idle.idle_sec.unwrap();
            assert!(
                (190.0..=200.0).contains(&idle_sec),
                "{step_ms}: idle {idle_sec} s"
            );
        }
    }

    #[test]
    fn a_reused_pid_is_a_new_series_and_ended_ones_are_forgotten() {
        let gpu = info(0, "GPU-a");
        let mut fleet = FleetTracker::new(FleetConfig {
            forget_after: Duration::from_secs(10),
            ..FleetConfig::default()
        })
        .unwrap();
        // PID 5 (start 100) runs for 20 s at 1 Hz, then PID 5 (start 200) takes over.
        let mut all = Vec::new();
        for i in 0..60 {
            let t = T0 + i * 1000;
            let start = if i < 20 { 100 } else { 200 };
            let s = snapshot(t, vec![ok(&gpu, reading(vec![usage(5, 3 * GIB)], None))]);
            let tick = fleet.observe(&s, visible(start));
            all.push((i, tick));
        }
        let firsts: Vec<(i64, Option<u64>)> = all
            .iter()
            .flat_map(|(i, t)| {
                t.changes
                    .iter()
                    .filter(|c| c.change.from.is_none())
                    .map(move |c| (*i, c.key.start_time_ticks))
            })
            .collect();
        assert_eq!(firsts, vec![(0, Some(100)), (20, Some(200))]);
        // The old one was last seen at 19 s; forgotten once more than 10 s have passed.
        let forgotten: Vec<(i64, Option<u64>)> = all
            .iter()
            .flat_map(|(i, t)| t.forgotten.iter().map(move |k| (*i, k.start_time_ticks)))
            .collect();
        assert_eq!(forgotten, vec![(30, Some(100))]);
        assert_eq!(fleet.len(), 1);
        // A process that leaves is forgotten too, and the tracker ends empty.
        let mut gone_at = None;
        for i in 60..80 {
            let s = snapshot(T0 + i * 1000, vec![ok(&gpu, reading(vec![], None))]);
            if !fleet.observe(&s, visible(200)).forgotten.is_empty() {
                gone_at = Some(i);
            }
        }
        assert_eq!(gone_at, Some(70));
        assert!(fleet.is_empty());
        assert!(fleet.current().is_empty());
    }

    #[test]
    fn memory_stays_bounded_with_thousands_of_short_jobs() {
        let gpu = info(0, "GPU-a");
        let mut fleet = FleetTracker::new(FleetConfig::default()).unwrap();
        // A new 5-second job every 5 s for 3 hours at 1 Hz: 2,160 processes.
        let mut most = 0;
        for i in 0..(3 * 3600) {
            let pid = 1000 + u32::try_from(i / 5).unwrap();
            let s = snapshot(
                T0 + i * 1000,
                vec![ok(&gpu, reading(vec![usage(pid, GIB)], None))],
            );
            fleet.observe(&s, |_| ProcessFacts::default());
            most = most.max(fleet.len());
        }
        // At most `forget_after` (60 s) of 5 s jobs, plus the current one.
        assert!(most <= 13, "{most}");
    }

    #[test]
    fn activity_evidence_reaches_the_idle_verdict() {
        let gpu = info(0, "GPU-a");
        let cfg = FleetConfig {
            leak: LeakConfig {
                idle_for: Duration::from_secs(60),
                ..LeakConfig::default()
            },
            ..FleetConfig::default()
        };
        // Three holders on one busy device (util 80 %: proves nothing with three):
        // PID 1 reports 0 % SM, PID 2 uses no CPU, PID 3 has no evidence at all.
        let mut fleet = FleetTracker::new(cfg).unwrap();
        let mut idle_at = BTreeMap::new();
        for i in 0..200 {
            let t = T0 + i * 1000;
            let mut r = reading(
                vec![usage(1, 12 * GIB), usage(2, 8 * GIB), usage(3, 6 * GIB)],
                Some(80),
            );
            r.process_activity = Some(vec![ProcessActivity {
                pid: 1,
                sm_percent: 0,
                memory_percent: 0,
            }]);
            let s = snapshot(t, vec![ok(&gpu, r)]);
            let tick = fleet.observe(&s, |pid| ProcessFacts {
                start_time_ticks: Some(u64::from(pid)),
                started_at_unix_ms: Some(T0 - 3_600_000),
                cpu_time_ms: (pid == 2).then_some(5_000),
            });
            for c in tick.changes {
                if c.change.to == Verdict::IdleHolder {
                    idle_at.insert(c.key.pid, (i, c.change.report.idle.evidence.clone()));
                }
            }
        }
        use crate::analysis::Evidence;
        assert_eq!(idle_at.len(), 2, "{idle_at:?}");
        let (at1, ev1) = &idle_at[&1];
        let (at2, ev2) = &idle_at[&2];
        assert_eq!(ev1, &vec![Evidence::ProcessSm]);
        assert_eq!(ev2, &vec![Evidence::CpuTime]);
        // Idle from the second SM sample, or from the first CPU sample once a 10 s window
        // has shown it idle; re-analysed at most 5 s later.
        assert!((61..=67).contains(at1), "{at1}");
        assert!((60..=67).contains(at2), "{at2}");
        assert_ne!(
            fleet.report_for("GPU-a", 3).map(|r| r.verdict),
            Some(Verdict::IdleHolder)
        );
    }

    #[test]
    fn device_utilization_counts_the_processes_on_the_device() {
        let gpu = info(0, "GPU-a");
        let cfg = FleetConfig {
            leak: LeakConfig {
                idle_for: Duration::from_secs(30),
                ..LeakConfig::default()
            },
            ..FleetConfig::default()
        };
        let mut fleet = FleetTracker::new(cfg).unwrap();
        // Alone on the device at 0 %: idle by device utilization.
        for i in 0..60 {
            let s = snapshot(
                T0 + i * 1000,
                vec![ok(&gpu, reading(vec![usage(9, 2 * GIB)], Some(0)))],
            );
            fleet.observe(&s, |_| ProcessFacts::default());
        }
        let r = fleet.report_for("GPU-a", 9).unwrap();
        assert_eq!(r.verdict, Verdict::IdleHolder, "{}", r.explanation);
        assert!(r.explanation.contains("device utilization"));
        // Alone and busy: active again.
        for i in 60..70 {
            let s = snapshot(
                T0 + i * 1000,
                vec![ok(&gpu, reading(vec![usage(9, 2 * GIB)], Some(40)))],
            );
            fleet.observe(&s, |_| ProcessFacts::default());
        }
        assert_eq!(
            fleet.report_for("GPU-a", 9).map(|r| r.verdict),
            Some(Verdict::Stable)
        );
    }

    #[test]
    fn an_unreadable_device_keeps_its_series_and_marks_the_gap() {
        let gpu = info(0, "GPU-a");
        let mut fleet = FleetTracker::new(FleetConfig::default()).unwrap();
        for i in 0..40 {
            let t = T0 + i * 1000;
            let state = if (10..20).contains(&i) {
                DeviceState::Lost {
                    reason: "GPU lost".into(),
                }
            } else {
                DeviceState::Ok(reading(vec![usage(4, 3 * GIB)], None))
            };
            let tick = fleet.observe(&snapshot(t, vec![(Arc::clone(&gpu), state)]), visible(1));
            assert!(tick.forgotten.is_empty());
            if (10..20).contains(&i) {
                // Still listed as current while the device cannot be read.
                assert_eq!(fleet.current().len(), 1);
            }
        }
        let r = fleet.report_for("GPU-a", 4).unwrap();
        assert_eq!(r.gaps, 1);
        // Reports are at most 5 s of sample time old: 30 samples were pushed.
        assert!((25..=30).contains(&r.samples), "{}", r.samples);
    }

    #[test]
    fn stale_snapshots_and_unknown_memory_are_ignored() {
        let gpu = info(0, "GPU-a");
        let mut fleet = FleetTracker::new(FleetConfig::default()).unwrap();
        let s = snapshot(T0, vec![ok(&gpu, reading(vec![usage(1, GIB)], None))]);
        assert_eq!(fleet.observe(&s, visible(1)).changes.len(), 1);
        // The same time again: nothing.
        assert_eq!(fleet.observe(&s, visible(1)), TickChanges::default());
        // A process whose memory the driver does not report has no series.
        let mut unknown = usage(2, 0);
        unknown.used_bytes = None;
        let s = snapshot(T0 + 1000, vec![ok(&gpu, reading(vec![unknown], None))]);
        fleet.observe(&s, visible(1));
        assert_eq!(fleet.report_for("GPU-a", 2), None);
        assert!(
            FleetTracker::new(FleetConfig {
                leak: LeakConfig {
                    alpha: 0.0,
                    ..LeakConfig::default()
                },
                ..FleetConfig::default()
            })
            .is_err()
        );
    }

    #[test]
    fn a_mig_process_is_judged_against_its_instance() {
        let mut gpu = (*info(0, "GPU-a")).clone();
        gpu.mig_enabled = Some(true);
        gpu.mig_instances = vec![MigInstanceInfo {
            uuid: "MIG-x".into(),
            name: Some("NVIDIA H200 MIG 1g.18gb".into()),
            gpu_instance_id: Some(3),
            compute_instance_id: Some(0),
        }];
        let gpu = Arc::new(gpu);
        let mut fleet = FleetTracker::new(FleetConfig::default()).unwrap();
        let mig_total = 18 * GIB;
        for i in 0..400 {
            let t = T0 + i * 100;
            let used = leaking(t - T0, 0, 100);
            let mut p = usage(6, used);
            p.gpu_instance_id = Some(3);
            p.compute_instance_id = Some(0);
            let mut r = reading(vec![p], None);
            r.mig = vec![MigReading {
                uuid: "MIG-x".into(),
                memory: Some(MemoryReading {
                    total_bytes: mig_total,
                    used_bytes: used,
                    reserved_bytes: 0,
                    free_bytes: mig_total - used,
                }),
            }];
            fleet.observe(&snapshot(t, vec![ok(&gpu, r)]), visible(1));
        }
        let (key, place, report) = fleet.current()[0];
        assert_eq!(key.device_uuid, "GPU-a");
        assert_eq!(place.mig_uuid.as_deref(), Some("MIG-x"));
        assert_eq!(place.label, "GPU 0 MIG 3");
        // Growth from the start fills the 18 GiB instance within minutes: urgent.
        let r = report.unwrap();
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
        let eta = r.time_to_full_sec.unwrap();
        assert!(eta < 1200.0, "{eta}");
        assert!(r.explanation.contains("GPU 0 MIG 3 is full in"));
    }

    /// 240 s at 1 s of one process on one GPU: NVML's figure `nvml(t_ms)`, the agent's
    /// allocated bytes `allocated(t_ms)` (`None`: no answer). The fleet, its changes.
    fn run_with_agent(
        nvml: impl Fn(i64) -> u64,
        allocated: impl Fn(i64) -> Option<u64>,
        secs: i64,
    ) -> (FleetTracker, Vec<FleetChange>) {
        let gpu = info(0, "GPU-a");
        let mut fleet = FleetTracker::new(FleetConfig::default()).unwrap();
        let mut changes = Vec::new();
        for i in 0..=secs {
            let t = T0 + i * 1000;
            let snap = snapshot(
                t,
                vec![ok(&gpu, reading(vec![usage(7, nvml(t - T0))], Some(90)))],
            );
            let tick = fleet.observe_with_allocated(&snap, visible(1), |uuid, pid| {
                assert_eq!((uuid, pid), ("GPU-a", 7));
                allocated(t - T0)
            });
            changes.extend(tick.changes);
        }
        (fleet, changes)
    }

    #[test]
    fn live_tensors_growing_inside_a_reserved_cache_are_a_leak_named_as_such() {
        // NVML flat at 20 GiB (the cache reserved at start-up); live tensors from 2 GiB
        // growing 16 MB/s from 40 s: invisible to NVML, a leak by the agent's figures.
        let (fleet, changes) =
            run_with_agent(|_| 20 * GIB, |t| Some(leaking(t, 40, 16) + GIB), 240);
        let r = fleet.report_for("GPU-a", 7).unwrap();
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
        assert_eq!(r.basis, crate::analysis::Basis::Allocated);
        assert!(
            r.explanation
                .contains("judged on live tensors from the agent"),
            "{}",
            r.explanation
        );
        assert!(changes.iter().any(|c| c.change.to == Verdict::Leak));
        // Without the agent the same NVML figures are no leak at all.
        let (plain, _) = run_with_agent(|_| 20 * GIB, |_| None, 240);
        assert_ne!(plain.report_for("GPU-a", 7).unwrap().verdict, Verdict::Leak);
    }

    #[test]
    fn a_growing_cache_over_flat_live_tensors_is_not_a_leak() {
        // NVML grows 16 MB/s (the cache) while the agent's live tensors stay at 4 GiB.
        let (fleet, changes) =
            run_with_agent(|t| leaking(t, 40, 16) + 4 * GIB, |_| Some(4 * GIB), 240);
        let r = fleet.report_for("GPU-a", 7).unwrap();
        assert!(
            !changes.iter().any(|c| c.change.to == Verdict::Leak),
            "{:?}",
            changes
                .iter()
                .map(|c| &c.change.report.explanation)
                .collect::<Vec<_>>()
        );
        assert_eq!(r.reserved_verdict, Some(Verdict::Leak), "{}", r.explanation);
        assert!(
            r.explanation.contains("cache, not a leak"),
            "{}",
            r.explanation
        );
    }

    #[test]
    fn an_agent_that_stops_answering_flips_no_verdict_on_its_own() {
        // The leak by live tensors, then the agent is silent from 150 s: NVML stays flat
        // (the cache still covers it), which is no evidence that the leak stopped.
        let (fleet, changes) = run_with_agent(
            |_| 20 * GIB,
            |t| (t < 150_000).then(|| leaking(t, 40, 16) + GIB),
            300,
        );
        let r = fleet.report_for("GPU-a", 7).unwrap();
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
        assert_eq!(r.agent_silent_since_unix_ms, Some(T0 + 149_000));
        assert!(
            r.explanation.contains("stopped answering"),
            "{}",
            r.explanation
        );
        let first_leak = changes
            .iter()
            .position(|c| c.change.to == Verdict::Leak)
            .unwrap();
        assert!(
            changes[first_leak + 1..].is_empty(),
            "flipped after the first leak: {:?}",
            changes[first_leak..]
                .iter()
                .map(|c| c.change.to)
                .collect::<Vec<_>>()
        );
        // Cache growth the agent explained stays explained when it goes silent.
        let (fleet, changes) = run_with_agent(
            |t| leaking(t, 40, 16) + 4 * GIB,
            |t| (t < 150_000).then_some(4 * GIB),
            300,
        );
        assert!(!changes.iter().any(|c| c.change.to == Verdict::Leak));
        let r = fleet.report_for("GPU-a", 7).unwrap();
        assert!(
            r.explanation.contains("stopped answering"),
            "{}",
            r.explanation
        );
        // New growth after the silence is NVML's to judge.
        let (fleet, _) = run_with_agent(
            |t| leaking(t, 150, 16) + 4 * GIB,
            |t| (t < 100_000).then_some(4 * GIB),
            400,
        );
        let r = fleet.report_for("GPU-a", 7).unwrap();
        assert_eq!(
            r.basis,
            crate::analysis::Basis::Reserved,
            "{}",
            r.explanation
        );
        assert!(
            r.explanation
                .contains("judged on NVML's per-process memory"),
            "{}",
            r.explanation
        );
    }
}
