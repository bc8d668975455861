//! Browsing a recording: the seam to the history store (`tui::store::StoreSource`), and
//! an in-memory recording.
//!
//! A [`ReplaySource`] answers "what was there at time T" and serves the series for the
//! charts ([`HistorySource`]). It runs on its own thread
//! (`tui::event::spawn_replay`); the UI asks with a [`Seek`] and gets a
//! [`ReplayFrame`]: the observation at the cursor and the chart window ending there.

use std::sync::Arc;

use super::memory_series::{HistoryChunk, HistorySource, Point, SeriesKey, decimate};
use vramctl_observe::observation::Observation;

/// A recording to browse.
pub trait ReplaySource: HistorySource {
    /// First and last sample times, or `None` for an empty recording.
    ///
    /// # Errors
    /// A one-line reason when the recording cannot be read.
    fn range(&self) -> Result<Option<(i64, i64)>, String>;

    /// The last observation taken at or before `t_ms`.
    ///
    /// # Errors
    /// A one-line reason when the recording cannot be read.
    fn at_or_before(&self, t_ms: i64) -> Result<Option<Observation>, String>;

    /// The first observation taken after `t_ms`.
    ///
    /// # Errors
    /// A one-line reason when the recording cannot be read.
    fn after(&self, t_ms: i64) -> Result<Option<Observation>, String>;
}

/// Where to move the time cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seek {
    /// The last sample at or before this time.
    AtOrBefore(i64),
    /// The first sample after this time.
    After(i64),
    /// The last sample before this time.
    Before(i64),
}

/// What the replay thread sends for a seek.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayFrame {
    /// The seek that asked for it.
    pub seek: Seek,
    /// The observation at the cursor; `None` when the seek went past either end.
    pub observation: Option<Arc<Observation>>,
    /// The chart window ending at the cursor.
    pub history: HistoryChunk,
    /// The recording's time range.
    pub range: Option<(i64, i64)>,
}

/// Every series an observation shows: its devices, MIG instances and processes.
pub fn keys_of(obs: &Observation) -> Vec<SeriesKey> {
    let mut keys = Vec::new();
    for device in &obs.snapshot.devices {
        keys.push(SeriesKey::Device(device.info.uuid.clone()));
        for mig in &device.info.mig_instances {
            keys.push(SeriesKey::Device(mig.uuid.clone()));
        }
        for p in device
            .reading()
            .and_then(|r| r.processes.as_ref())
            .into_iter()
            .flatten()
        {
            keys.push(SeriesKey::Process {
                uuid: device.info.uuid.clone(),
                pid: p.pid,
            });
        }
    }
    keys.sort();
    keys.dedup();
    keys
}

/// Carries out one seek against `source`.
///
/// # Errors
/// The source's reason when it cannot be read.
pub fn seek_frame(
    source: &dyn ReplaySource,
    seek: Seek,
    window_ms: i64,
    max_points: usize,
) -> Result<ReplayFrame, String> {
    let range = source.range()?;
    let observation = match seek {
        Seek::AtOrBefore(t) => source.at_or_before(t)?,
        Seek::After(t) => source.after(t)?,
        Seek::Before(t) => source.at_or_before(t.saturating_sub(1))?,
    };
    let history = match &observation {
        Some(obs) => {
            let to = obs.taken_at_unix_ms();
            source.load(&keys_of(obs), &obs.starts(), to - window_ms, to, max_points)
        }
        None => HistoryChunk::default(),
    };
    Ok(ReplayFrame {
        seek,
        observation: observation.map(Arc::new),
        history,
        range,
    })
}

/// A recording held in memory, in time order (tests, and recordings read whole).
#[derive(Debug, Clone, Default)]
pub struct MemoryReplay {
    observations: Vec<Observation>,
}

impl MemoryReplay {
    /// A recording of `observations` (sorted by time here).
    pub fn new(mut observations: Vec<Observation>) -> Self {
        observations.sort_by_key(Observation::taken_at_unix_ms);
        Self { observations }
    }
}

impl HistorySource for MemoryReplay {
    fn points(
        &self,
        key: &SeriesKey,
        from_ms: i64,
        to_ms: i64,
        max_points: usize,
    ) -> Result<Vec<Point>, String> {
        let mut points = Vec::new();
        for obs in &self.observations {
            let t_ms = obs.taken_at_unix_ms();
            if t_ms < from_ms || t_ms > to_ms {
                continue;
            }
            for device in &obs.snapshot.devices {
                let Some(reading) = device.reading() else {
                    continue;
                };
                let bytes = match key {
                    SeriesKey::Device(uuid) if *uuid == device.info.uuid => {
                        reading.memory.map(|m| m.used_bytes)
                    }
                    SeriesKey::Device(uuid) => reading.mig_memory(uuid).map(|m| m.used_bytes),
                    SeriesKey::Process { uuid, pid } if *uuid == device.info.uuid => reading
                        .processes
                        .iter()
                        .flatten()
                        .find(|p| p.pid == *pid)
                        .and_then(|p| p.used_bytes),
                    SeriesKey::Process { .. } => None,
                };
                if let Some(bytes) = bytes {
                    points.push(Point { t_ms, bytes });
                }
            }
        }
        Ok(decimate(&points, from_ms, to_ms, max_points))
    }
}

impl ReplaySource for MemoryReplay {
    fn range(&self) -> Result<Option<(i64, i64)>, String> {
        Ok(self
            .observations
            .first()
            .zip(self.observations.last())
            .map(|(a, b)| (a.taken_at_unix_ms(), b.taken_at_unix_ms())))
    }

    fn at_or_before(&self, t_ms: i64) -> Result<Option<Observation>, String> {
        let i = self
            .observations
            .partition_point(|o| o.taken_at_unix_ms() <= t_ms);
        Ok(i.checked_sub(1).map(|i| self.observations[i].clone()))
    }

    fn after(&self, t_ms: i64) -> Result<Option<Observation>, String> {
        let i = self
            .observations
            .partition_point(|o| o.taken_at_unix_ms() <= t_ms);
        Ok(self.observations.get(i).cloned())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vramctl_core::types::{
        DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, MemoryReading, Snapshot,
    };

    use super::*;

    fn obs(t_s: i64, used: u64) -> Observation {
        Observation::bare(Snapshot {
            taken_at_unix_ms: t_s * 1000,
            monotonic_ms: t_s * 1000,
            driver: Arc::new(DriverInfo::default()),
            devices: vec![DeviceSnapshot {
                info: Arc::new(DeviceInfo {
                    index: 0,
                    uuid: "GPU-a".into(),
                    name: None,
                    pci_bus_id: None,
                    minor_number: None,
                    mig_enabled: None,
                    mig_instances: vec![],
                }),
                state: DeviceState::Ok(DeviceReading {
                    memory: Some(MemoryReading {
                        total_bytes: 100,
                        used_bytes: used,
                        reserved_bytes: 0,
                        free_bytes: 100 - used,
                    }),
                    ..DeviceReading::default()
                }),
            }],
            unopened: vec![],
        })
    }

    #[test]
    fn seeks_find_neighbours() {
        let r = MemoryReplay::new(vec![obs(20, 2), obs(10, 1), obs(30, 3)]);
        assert_eq!(r.range().unwrap(), Some((10_000, 30_000)));
        let t = |o: Option<Observation>| o.map(|o| o.taken_at_unix_ms());
        assert_eq!(t(r.at_or_before(25_000).unwrap()), Some(20_000));
        assert_eq!(t(r.at_or_before(20_000).unwrap()), Some(20_000));
        assert_eq!(t(r.at_or_before(9_999).unwrap()), None);
        assert_eq!(t(r.after(20_000).unwrap()), Some(30_000));
        assert_eq!(t(r.after(30_000).unwrap()), None);
        let f = seek_frame(&r, Seek::Before(20_000), 60_000, 100).unwrap();
        assert_eq!(f.observation.unwrap().taken_at_unix_ms(), 10_000);
    }

    #[test]
    fn a_frame_carries_the_window_before_the_cursor() {
        let r = MemoryReplay::new(
            (0..100)
                .map(|t| obs(t, u64::try_from(t).unwrap()))
                .collect(),
        );
        let f = seek_frame(&r, Seek::AtOrBefore(50_000), 10_000, 100).unwrap();
        let pts = &f.history.series[&SeriesKey::Device("GPU-a".into())];
        assert_eq!(pts.first().map(|p| p.t_ms), Some(40_000));
        assert_eq!(pts.last().map(|p| (p.t_ms, p.bytes)), Some((50_000, 50)));
    }
}
