//! What the exporter counts about its own collection: errors by kind, NVML init failures,
//! ticks, and the peak of used memory over a window (gauges miss spikes between scrapes).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use vramctl_core::types::{DeviceState, Field, Snapshot, Unavailable};
use vramctl_gpu::sampler::ReopenReason;

/// The kinds of `vramctl_collection_errors_total`. "Not supported" is a capability, not an
/// error, and is not counted.
pub const ERROR_KINDS: [&str; 5] = [
    "gpu_lost",
    "device_error",
    "no_permission",
    "nvml_error",
    "insane_value",
];

/// A device as the error counters know it: NVML index and UUID (empty for a device that
/// could not be opened).
pub type DeviceKey = (u32, String);

/// The exporter's own counters and windows, updated once per tick by the sampler thread.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Ticks taken (NVML up or down).
    pub samples_total: u64,
    /// How long the last tick's collection took (NVML, /proc and rendering).
    pub sample_duration: Duration,
    /// When the last snapshot was taken (Unix ms); `None` while NVML is down.
    pub last_snapshot_unix_ms: Option<i64>,
    /// Whether NVML is initialised.
    pub nvml_up: bool,
    /// Failed NVML init attempts by [`InitError::code`](vramctl_gpu::InitError::code).
    pub nvml_init_failures: BTreeMap<&'static str, u64>,
    /// NVML sessions reopened, by [`ReopenReason::as_str`] (every reason from 0, so
    /// `increase()` sees the first).
    pub nvml_reopens: BTreeMap<&'static str, u64>,
    /// Collection errors per device, indexed like [`ERROR_KINDS`].
    pub errors: BTreeMap<DeviceKey, [u64; ERROR_KINDS.len()]>,
    /// OOMs the agents reported, by cause (`oom_causes`), every cause from 0.
    pub ooms_by_cause: BTreeMap<&'static str, u64>,
    peaks: BTreeMap<String, VecDeque<(i64, u64)>>,
    peak_window: Duration,
}

impl Stats {
    /// Counters at zero; the used-memory peak is kept over `peak_window`.
    pub fn new(peak_window: Duration) -> Self {
        Self {
            samples_total: 0,
            sample_duration: Duration::ZERO,
            last_snapshot_unix_ms: None,
            nvml_up: false,
            nvml_init_failures: BTreeMap::new(),
            nvml_reopens: ReopenReason::ALL.iter().map(|r| (r.as_str(), 0)).collect(),
            errors: BTreeMap::new(),
            ooms_by_cause: crate::oom_causes::CAUSES.iter().map(|c| (*c, 0)).collect(),
            peaks: BTreeMap::new(),
            peak_window,
        }
    }

    /// Counts a reopened NVML session.
    pub fn reopened(&mut self, reason: ReopenReason) {
        *self.nvml_reopens.entry(reason.as_str()).or_default() += 1;
    }

    /// Counts an NVML init failure.
    pub fn init_failed(&mut self, code: &'static str) {
        *self.nvml_init_failures.entry(code).or_default() += 1;
    }

    /// Counts the errors in `snapshot` and feeds the peak windows.
    pub fn observe(&mut self, snapshot: &Snapshot) {
        self.last_snapshot_unix_ms = Some(snapshot.taken_at_unix_ms);
        for unopened in &snapshot.unopened {
            let kind = match unopened.reason {
                Unavailable::GpuLost => 0,
                _ => 1,
            };
            self.count((unopened.index, String::new()), kind, 1);
        }
        for device in &snapshot.devices {
            let key = (device.info.index, device.info.uuid.clone());
            // Every device has its counters from its first tick, so `increase()` sees the
            // first error too.
            self.errors.entry(key.clone()).or_default();
            match &device.state {
                DeviceState::Lost { .. } => self.count(key, 0, 1),
                DeviceState::Error { .. } => self.count(key, 1, 1),
                DeviceState::Ok(reading) => {
                    for (field, why) in &reading.missing {
                        // Per-process SM activity is read only as idle evidence for the
                        // analysis, and the driver answers NOT_FOUND whenever it has no new
                        // samples (an H200 does so even for busy processes): its absence is
                        // "no evidence", not a collection error.
                        if *field == Field::ProcessUtilization {
                            continue;
                        }
                        let kind = match why {
                            Unavailable::NotSupported => continue,
                            Unavailable::GpuLost => 0,
                            Unavailable::NoPermission => 2,
                            Unavailable::Error(_) => 3,
                            Unavailable::Insane(_) => 4,
                            // A reason added to core later counts as a driver error.
                            _ => 3,
                        };
                        self.count(key.clone(), kind, 1);
                    }
                    self.count(key.clone(), 4, reading.dropped.len() as u64);
                    if let Some(memory) = reading.memory {
                        // The window is a span: on the monotonic clock, so a wall-clock
                        // step neither empties it nor keeps a peak for the step's length.
                        self.push_peak(&key.1, snapshot.monotonic_ms, memory.used_bytes);
                    }
                }
            }
        }
        // Devices that vanished from the snapshot take their peak windows with them.
        self.peaks
            .retain(|uuid, _| snapshot.devices.iter().any(|d| &d.info.uuid == uuid));
    }

    /// The highest used memory of `uuid` over the peak window, including this tick.
    pub fn peak_used_bytes(&self, uuid: &str) -> Option<u64> {
        self.peaks.get(uuid)?.iter().map(|&(_, used)| used).max()
    }

    fn count(&mut self, key: DeviceKey, kind: usize, n: u64) {
        let counters = self.errors.entry(key).or_default();
        counters[kind] += n;
    }

    fn push_peak(&mut self, uuid: &str, at_ms: i64, used: u64) {
        let window_ms = i64::try_from(self.peak_window.as_millis()).unwrap_or(i64::MAX);
        let samples = self.peaks.entry(uuid.to_owned()).or_default();
        // Monotonic times do not go back; should one, start over rather than keep old
        // samples forever.
        if samples.back().is_some_and(|&(t, _)| t > at_ms) {
            samples.clear();
        }
        samples.push_back((at_ms, used));
        while samples
            .front()
            .is_some_and(|&(t, _)| at_ms.saturating_sub(t) > window_ms)
        {
            samples.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vramctl_core::types::{
        DeviceInfo, DeviceReading, DeviceSnapshot, DriverInfo, MemoryReading, UnopenedDevice,
    };

    use super::*;

    fn info(index: u32, uuid: &str) -> Arc<DeviceInfo> {
        Arc::new(DeviceInfo::new(index, uuid))
    }

    fn snapshot(at_ms: i64, used: u64, missing: &[(Field, Unavailable)]) -> Snapshot {
        Snapshot {
            taken_at_unix_ms: at_ms,
            monotonic_ms: at_ms,
            driver: Arc::new(DriverInfo::default()),
            devices: vec![
                DeviceSnapshot {
                    info: info(0, "GPU-a"),
                    state: DeviceState::Ok(DeviceReading {
                        memory: Some(MemoryReading {
                            total_bytes: 100,
                            used_bytes: used,
                            reserved_bytes: 0,
                            free_bytes: 100 - used,
                        }),
                        missing: missing.iter().cloned().collect(),
                        ..DeviceReading::default()
                    }),
                },
                DeviceSnapshot {
                    info: info(1, "GPU-b"),
                    state: DeviceState::Lost {
                        reason: "gone".into(),
                    },
                },
            ],
            unopened: vec![UnopenedDevice {
                index: 2,
                reason: Unavailable::Error("insufficient power".into()),
            }],
        }
    }

    #[test]
    fn errors_are_counted_by_kind_and_capabilities_and_activity_are_not() {
        let mut stats = Stats::new(Duration::from_secs(60));
        let missing = [
            (Field::Power, Unavailable::NotSupported),
            (Field::ComputeProcesses, Unavailable::NoPermission),
            (Field::Temperature, Unavailable::Error("timeout".into())),
            (
                Field::ProcessUtilization,
                Unavailable::Error("the driver returned no samples".into()),
            ),
        ];
        stats.observe(&snapshot(0, 10, &missing));
        stats.observe(&snapshot(1000, 10, &missing));
        assert_eq!(stats.errors[&(0, "GPU-a".into())], [0, 0, 2, 2, 0]);
        assert_eq!(stats.errors[&(1, "GPU-b".into())], [2, 0, 0, 0, 0]);
        assert_eq!(stats.errors[&(2, String::new())], [0, 2, 0, 0, 0]);
    }

    #[test]
    fn the_peak_covers_the_window_only() {
        let mut stats = Stats::new(Duration::from_secs(10));
        stats.observe(&snapshot(0, 90, &[]));
        stats.observe(&snapshot(5_000, 20, &[]));
        assert_eq!(stats.peak_used_bytes("GPU-a"), Some(90));
        stats.observe(&snapshot(10_000, 30, &[]));
        assert_eq!(
            stats.peak_used_bytes("GPU-a"),
            Some(90),
            "10 s old is still in"
        );
        stats.observe(&snapshot(10_001, 25, &[]));
        assert_eq!(stats.peak_used_bytes("GPU-a"), Some(30));
        assert_eq!(
            stats.peak_used_bytes("GPU-b"),
            None,
            "a lost GPU has no peak"
        );
    }

    #[test]
    fn a_clock_stepping_back_restarts_the_window() {
        let mut stats = Stats::new(Duration::from_secs(10));
        stats.observe(&snapshot(50_000, 90, &[]));
        stats.observe(&snapshot(1_000, 20, &[]));
        assert_eq!(stats.peak_used_bytes("GPU-a"), Some(20));
    }
}
