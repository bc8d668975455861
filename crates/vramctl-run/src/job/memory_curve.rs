//! The job's GPU memory over time, from the sampler's snapshots: per GPU the memory its
//! process tree holds (NVML's per-process figures summed over the tree) and the device's
//! used memory, per process its peak, and where each peak was.

use std::collections::BTreeMap;

use serde::Serialize;
use vramctl_core::types::Snapshot;

use super::tree::ProcessTree;

/// One sample of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CurvePoint {
    /// Milliseconds since the job started.
    pub t_ms: u64,
    /// Memory the job's processes held (highest in the interval when merged).
    pub job_bytes: u64,
    /// The device's used memory, every process's (highest in the interval when merged).
    pub device_used_bytes: u64,
}

/// Points kept per GPU before pairs are merged (keeping the highest of each): a day at
/// 20 ms is 4.3 M samples, this is ~3 MB per GPU.
const MAX_POINTS: usize = 131_072;

/// One GPU's curve.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceCurve {
    /// NVML index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Product name.
    pub name: Option<String>,
    /// Installed memory.
    pub total_bytes: Option<u64>,
    /// Set aside by the driver.
    pub driver_reserved_bytes: Option<u64>,
    /// Used on the device before the job started (other processes).
    pub used_at_start_bytes: Option<u64>,
    /// The job's highest.
    pub peak_bytes: u64,
    /// When (ms since start).
    pub peak_at_ms: u64,
    /// The device's highest used memory while the job ran.
    pub device_peak_used_bytes: u64,
    /// Mean over samples of the job's memory.
    pub mean_bytes: u64,
    /// Samples taken.
    pub samples: u64,
    #[serde(skip)]
    sum_bytes: u128,
    /// The curve (merged in pairs past [`MAX_POINTS`]).
    #[serde(skip)]
    pub points: Vec<CurvePoint>,
}

impl DeviceCurve {
    /// An empty curve of the device `index` / `uuid` with what it reported before the job.
    pub fn new(
        index: u32,
        uuid: String,
        name: Option<String>,
        memory: Option<&vramctl_core::types::MemoryReading>,
    ) -> Self {
        Self {
            index,
            uuid,
            name,
            total_bytes: memory.map(|m| m.total_bytes),
            driver_reserved_bytes: memory.map(|m| m.reserved_bytes),
            used_at_start_bytes: memory.map(|m| m.used_bytes),
            peak_bytes: 0,
            peak_at_ms: 0,
            device_peak_used_bytes: 0,
            mean_bytes: 0,
            samples: 0,
            sum_bytes: 0,
            points: Vec::new(),
        }
    }

    /// The device's used memory at `t_ms`: the last sample at or before it (the first
    /// sample for a moment before any).
    pub fn used_at(&self, t_ms: u64) -> Option<u64> {
        let i = self.points.partition_point(|p| p.t_ms <= t_ms);
        self.points
            .get(i.saturating_sub(1))
            .map(|p| p.device_used_bytes)
    }

    /// The device's highest used memory in `from_ms..=to_ms`, counting the sample in force
    /// at `from_ms` ([`Self::used_at`] when none falls inside).
    pub fn highest_used_between(&self, from_ms: u64, to_ms: u64) -> Option<u64> {
        let inside = self
            .points
            .iter()
            .filter(|p| p.t_ms >= from_ms && p.t_ms <= to_ms)
            .map(|p| p.device_used_bytes);
        inside.chain(self.used_at(from_ms)).max()
    }

    /// What the job could use on this device: total − driver-reserved − what others used
    /// at its start.
    pub fn capacity_bytes(&self) -> Option<u64> {
        Some(
            self.total_bytes?
                .saturating_sub(self.driver_reserved_bytes.unwrap_or(0))
                .saturating_sub(self.used_at_start_bytes.unwrap_or(0)),
        )
    }

    fn push(&mut self, point: CurvePoint) {
        self.samples += 1;
        self.sum_bytes += u128::from(point.job_bytes);
        self.mean_bytes = u64::try_from(self.sum_bytes / u128::from(self.samples)).unwrap_or(0);
        if point.job_bytes > self.peak_bytes {
            self.peak_bytes = point.job_bytes;
            self.peak_at_ms = point.t_ms;
        }
        self.device_peak_used_bytes = self.device_peak_used_bytes.max(point.device_used_bytes);
        self.points.push(point);
        if self.points.len() >= MAX_POINTS {
            self.points = self
                .points
                .chunks(2)
                .map(|pair| CurvePoint {
                    t_ms: pair[0].t_ms,
                    job_bytes: pair.iter().map(|p| p.job_bytes).max().unwrap_or(0),
                    device_used_bytes: pair.iter().map(|p| p.device_used_bytes).max().unwrap_or(0),
                })
                .collect();
        }
    }

    /// A one-line chart of the job's memory: `width` columns, each the highest in its
    /// span, on eight levels from 0 to the peak.
    pub fn sparkline(&self, width: usize) -> String {
        const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
        let (Some(first), Some(last)) = (self.points.first(), self.points.last()) else {
            return String::new();
        };
        if self.peak_bytes == 0 || width == 0 {
            return LEVELS[0]
                .to_string()
                .repeat(width.min(self.points.len()).max(1));
        }
        let span = (last.t_ms - first.t_ms).max(1);
        let columns = width.min(self.points.len());
        let mut highest = vec![None::<u64>; columns];
        for p in &self.points {
            let c = usize::try_from((p.t_ms - first.t_ms) * (columns as u64 - 1) / span)
                .unwrap_or(0)
                .min(columns - 1);
            highest[c] = Some(highest[c].map_or(p.job_bytes, |h: u64| h.max(p.job_bytes)));
        }
        let mut last_level = 0;
        highest
            .into_iter()
            .map(|h| {
                if let Some(bytes) = h {
                    let level = (u128::from(bytes) * 7 / u128::from(self.peak_bytes)) as usize;
                    last_level = level.min(7);
                }
                LEVELS[last_level]
            })
            .collect()
    }
}

/// One process of the job on one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessPeak {
    /// PID.
    pub pid: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Its highest NVML figure.
    pub peak_bytes: u64,
    /// First seen holding memory (ms since start).
    pub first_seen_ms: u64,
    /// Its command line as /proc said when first seen.
    pub command: Option<String>,
}

/// Every GPU's curve and every process's peak.
#[derive(Debug, Default)]
pub struct MemoryCurve {
    /// In NVML index order.
    pub devices: Vec<DeviceCurve>,
    /// By (pid, uuid).
    pub processes: BTreeMap<(u32, String), ProcessPeak>,
}

impl MemoryCurve {
    /// Takes the devices and what they had in use from the snapshot taken just before the
    /// job started.
    pub fn starting_from(snapshot: &Snapshot) -> Self {
        let devices = snapshot
            .devices
            .iter()
            .map(|d| {
                let memory = d.reading().and_then(|r| r.memory.as_ref());
                DeviceCurve::new(
                    d.info.index,
                    d.info.uuid.clone(),
                    d.info.name.clone(),
                    memory,
                )
            })
            .collect();
        Self {
            devices,
            processes: BTreeMap::new(),
        }
    }

    /// Adds one tick, `t_ms` after the start; returns the job's PIDs NVML listed.
    pub fn observe(&mut self, snapshot: &Snapshot, t_ms: u64, tree: &mut ProcessTree) -> Vec<u32> {
        let mut pids = Vec::new();
        for device in &snapshot.devices {
            let Some(curve) = self.devices.iter_mut().find(|c| c.uuid == device.info.uuid) else {
                continue;
            };
            let Some(reading) = device.reading() else {
                continue;
            };
            let mut job_bytes = 0u64;
            for p in reading.processes.iter().flatten() {
                let Some(bytes) = p.used_bytes else { continue };
                if !tree.contains(p.pid) {
                    continue;
                }
                job_bytes = job_bytes.saturating_add(bytes);
                if !pids.contains(&p.pid) {
                    pids.push(p.pid);
                }
                let entry = self
                    .processes
                    .entry((p.pid, curve.uuid.clone()))
                    .or_insert_with(|| ProcessPeak {
                        pid: p.pid,
                        uuid: curve.uuid.clone(),
                        peak_bytes: 0,
                        first_seen_ms: t_ms,
                        command: command_of(p.pid),
                    });
                entry.peak_bytes = entry.peak_bytes.max(bytes);
            }
            let device_used_bytes = reading.memory.as_ref().map_or(0, |m| m.used_bytes);
            curve.push(CurvePoint {
                t_ms,
                job_bytes,
                device_used_bytes,
            });
        }
        pids
    }

    /// The job's highest memory on any one GPU.
    pub fn peak_bytes(&self) -> u64 {
        self.devices.iter().map(|d| d.peak_bytes).max().unwrap_or(0)
    }
}

fn command_of(pid: u32) -> Option<String> {
    let command = vramctl_procs::procinfo::read_cmdline(pid)?;
    (!command.is_empty()).then(|| vramctl_core::command_line::abbreviate(&command, 80))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(points: &[(u64, u64)]) -> DeviceCurve {
        let memory = vramctl_core::types::MemoryReading {
            total_bytes: 100,
            used_bytes: 20,
            reserved_bytes: 10,
            free_bytes: 70,
        };
        let mut c = DeviceCurve::new(0, "GPU-0".into(), None, Some(&memory));
        for &(t_ms, job_bytes) in points {
            c.push(CurvePoint {
                t_ms,
                job_bytes,
                device_used_bytes: job_bytes + 20,
            });
        }
        c
    }

    #[test]
    fn the_peak_its_time_the_mean_and_the_capacity() {
        let c = curve(&[(0, 0), (20, 40), (40, 70), (60, 10)]);
        assert_eq!((c.peak_bytes, c.peak_at_ms), (70, 40));
        assert_eq!(c.mean_bytes, 30);
        assert_eq!(c.device_peak_used_bytes, 90);
        assert_eq!(c.capacity_bytes(), Some(70));
        assert_eq!(c.used_at(45), Some(90));
        assert_eq!(c.used_at(61), Some(30));
        assert_eq!(c.highest_used_between(45, 70), Some(90));
        assert_eq!(c.highest_used_between(61, 70), Some(30));
    }

    #[test]
    fn the_sparkline_rises_to_full_at_the_peak() {
        let c = curve(&[(0, 0), (10, 25), (20, 50), (30, 75), (40, 100)]);
        assert_eq!(c.sparkline(5), "▁▂▄▆█");
        assert_eq!(curve(&[]).sparkline(10), "");
    }

    #[test]
    fn a_long_curve_is_merged_keeping_the_highest() {
        let mut c = curve(&[]);
        for i in 0..(MAX_POINTS as u64 + 10) {
            c.push(CurvePoint {
                t_ms: i,
                job_bytes: if i == 7 { 1_000 } else { i % 3 },
                device_used_bytes: 0,
            });
        }
        assert!(c.points.len() < MAX_POINTS);
        assert_eq!(c.points.iter().map(|p| p.job_bytes).max(), Some(1_000));
        assert_eq!(c.peak_bytes, 1_000);
    }
}
