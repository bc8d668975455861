//! Memory over time, for the charts and the per-minute change.
//!
//! `top` keeps what it sampled itself in [`SeriesSet`]: every sample of the last
//! [`FINE_SPAN_MS`], and per-minute min/max/last buckets for [`COARSE_SPAN_MS`]. A longer
//! past (a recorder running before `top` started) comes from a [`HistorySource`] — the
//! history store (`tui::store`) — loaded off the UI thread into a [`HistoryChunk`]; the
//! charts join the two at the first point `top` has.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use vramctl_observe::observation::Observation;
pub use vramctl_observe::observation::Starts;

/// Every sample is kept for this long.
pub const FINE_SPAN_MS: i64 = 15 * 60_000;
/// Per-minute buckets are kept for this long (the widest zoom).
pub const COARSE_SPAN_MS: i64 = 24 * 3_600_000;
const BUCKET_MS: i64 = 60_000;

/// One value of a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    /// Unix time in milliseconds.
    pub t_ms: i64,
    /// Memory in bytes (the highest value when the point stands for several samples).
    pub bytes: u64,
}

/// Which memory a series follows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SeriesKey {
    /// Memory used on a GPU or a MIG instance, by UUID.
    Device(String),
    /// One process's memory on one GPU (by the GPU's UUID).
    Process {
        /// The GPU.
        uuid: String,
        /// The process.
        pid: u32,
    },
}

/// How much time the charts show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Zoom {
    /// 1 minute.
    Minute,
    /// 5 minutes.
    FiveMinutes,
    /// 15 minutes.
    FifteenMinutes,
    /// 1 hour.
    Hour,
    /// 6 hours.
    SixHours,
    /// 24 hours.
    Day,
}

impl Zoom {
    const ALL: [Self; 6] = [
        Self::Minute,
        Self::FiveMinutes,
        Self::FifteenMinutes,
        Self::Hour,
        Self::SixHours,
        Self::Day,
    ];

    /// The time the chart spans.
    pub fn span_ms(self) -> i64 {
        match self {
            Self::Minute => 60_000,
            Self::FiveMinutes => 5 * 60_000,
            Self::FifteenMinutes => 15 * 60_000,
            Self::Hour => 3_600_000,
            Self::SixHours => 6 * 3_600_000,
            Self::Day => 24 * 3_600_000,
        }
    }

    /// `1m`, `5m`, ...
    pub fn label(self) -> &'static str {
        match self {
            Self::Minute => "1m",
            Self::FiveMinutes => "5m",
            Self::FifteenMinutes => "15m",
            Self::Hour => "1h",
            Self::SixHours => "6h",
            Self::Day => "24h",
        }
    }

    /// A shorter span (stays at the shortest).
    #[must_use]
    pub fn zoom_in(self) -> Self {
        let i = Self::ALL.iter().position(|&z| z == self).unwrap_or(0);
        Self::ALL[i.saturating_sub(1)]
    }

    /// A longer span (stays at the longest).
    #[must_use]
    pub fn zoom_out(self) -> Self {
        let i = Self::ALL.iter().position(|&z| z == self).unwrap_or(0);
        Self::ALL[(i + 1).min(Self::ALL.len() - 1)]
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    start_ms: i64,
    max: u64,
}

/// One series as `top` sampled it.
#[derive(Debug, Clone, Default)]
pub struct Series {
    fine: VecDeque<Point>,
    coarse: VecDeque<Bucket>,
    first_ms: Option<i64>,
}

impl Series {
    /// Appends a sample; one not later than the last is ignored.
    pub fn push(&mut self, point: Point) {
        if self.fine.back().is_some_and(|last| last.t_ms >= point.t_ms) {
            return;
        }
        self.fine.push_back(point);
        self.first_ms.get_or_insert(point.t_ms);
        while self
            .fine
            .front()
            .is_some_and(|p| p.t_ms < point.t_ms - FINE_SPAN_MS)
        {
            self.fine.pop_front();
        }
        let start_ms = point.t_ms.div_euclid(BUCKET_MS) * BUCKET_MS;
        match self.coarse.back_mut() {
            Some(b) if b.start_ms == start_ms => b.max = b.max.max(point.bytes),
            _ => self.coarse.push_back(Bucket {
                start_ms,
                max: point.bytes,
            }),
        }
        while self
            .coarse
            .front()
            .is_some_and(|b| b.start_ms < point.t_ms - COARSE_SPAN_MS)
        {
            self.coarse.pop_front();
        }
        if let (Some(first), Some(b)) = (self.first_ms, self.coarse.front()) {
            self.first_ms = Some(first.max(b.start_ms));
        }
    }

    /// The latest sample.
    pub fn last(&self) -> Option<Point> {
        self.fine.back().copied()
    }

    /// The first time this series has anything for.
    pub fn first_ms(&self) -> Option<i64> {
        self.first_ms
    }

    /// Points with `from_ms <= t <= to_ms`, oldest first: every sample where they are
    /// kept, per-minute maxima of the whole minutes before that.
    pub fn points(&self, from_ms: i64, to_ms: i64) -> Vec<Point> {
        let fine_from = self.fine.front().map_or(i64::MAX, |p| p.t_ms);
        let mut out: Vec<Point> = self
            .coarse
            .iter()
            .filter(|b| {
                b.start_ms >= from_ms && b.start_ms + BUCKET_MS <= fine_from && b.start_ms <= to_ms
            })
            .map(|b| Point {
                t_ms: b.start_ms,
                bytes: b.max,
            })
            .collect();
        out.extend(
            self.fine
                .iter()
                .filter(|p| p.t_ms >= from_ms && p.t_ms <= to_ms)
                .copied(),
        );
        out
    }
}

/// Memory now minus memory a minute ago, from `points` (oldest first): the change over the
/// last minute of samples, or since the first sample when they span less than a minute. Not
/// extrapolated: ten seconds of samples are not multiplied into a minute's worth. `None`
/// with fewer than two samples in that minute.
pub fn change_per_minute(points: &[Point]) -> Option<i64> {
    let last = *points.last()?;
    let first = points
        .iter()
        .find(|p| p.t_ms >= last.t_ms - 60_000)
        .copied()?;
    if first.t_ms == last.t_ms {
        return None;
    }
    i64::try_from(i128::from(last.bytes) - i128::from(first.bytes)).ok()
}

/// At most `buckets` points over `[from_ms, to_ms]`, each the highest value of its slice of
/// time (memory peaks are what people look for), at the slice's start. Empty slices give
/// no point, so a gap stays a gap.
pub fn decimate(points: &[Point], from_ms: i64, to_ms: i64, buckets: usize) -> Vec<Point> {
    if buckets == 0 || to_ms <= from_ms || points.len() <= buckets {
        return points
            .iter()
            .filter(|p| p.t_ms >= from_ms && p.t_ms <= to_ms)
            .copied()
            .collect();
    }
    let span = i128::from(to_ms - from_ms);
    let n = i128::try_from(buckets).unwrap_or(i128::MAX);
    let mut out: Vec<Point> = Vec::with_capacity(buckets);
    for p in points
        .iter()
        .filter(|p| p.t_ms >= from_ms && p.t_ms <= to_ms)
    {
        let slot = (i128::from(p.t_ms - from_ms) * n / span).min(n - 1);
        let start = from_ms + i64::try_from(slot * span / n).unwrap_or(0);
        match out.last_mut() {
            Some(last) if last.t_ms == start => last.bytes = last.bytes.max(p.bytes),
            _ => out.push(Point {
                t_ms: start,
                bytes: p.bytes,
            }),
        }
    }
    out
}

/// A source of memory series older than what `top` sampled: the history store
/// (`tui::store::StoreSource`), or a recording being replayed.
///
/// Called off the UI thread (it may do I/O); results reach the UI as a [`HistoryChunk`].
pub trait HistorySource: Send {
    /// Points of `key` with `from_ms <= t <= to_ms`, oldest first, at most about
    /// `max_points` (a source may downsample, keeping maxima).
    ///
    /// # Errors
    /// A one-line reason when the source cannot be read.
    fn points(
        &self,
        key: &SeriesKey,
        from_ms: i64,
        to_ms: i64,
        max_points: usize,
    ) -> Result<Vec<Point>, String>;

    /// Every series of `keys` over one window. A process series is that of the process
    /// whose start time `starts` gives, not of an earlier one under the same PID (a source
    /// that keeps identities, like the store, honours it). A series that fails to load is
    /// left out (the chart then shows what `top` sampled). The default asks [`points`]
    /// once per key; the store reads the window once for all of them.
    ///
    /// [`points`]: HistorySource::points
    fn load(
        &self,
        keys: &[SeriesKey],
        starts: &Starts,
        from_ms: i64,
        to_ms: i64,
        max_points: usize,
    ) -> HistoryChunk {
        let mut series = HashMap::new();
        for key in keys {
            match self.points(key, from_ms, to_ms, max_points) {
                Ok(points) => {
                    series.insert(key.clone(), points);
                }
                Err(reason) => {
                    tracing::warn!(?key, %reason, "Could not load a history series.");
                }
            }
        }
        HistoryChunk {
            from_ms,
            to_ms,
            series,
            starts: starts.clone(),
        }
    }
}

/// Series loaded from a [`HistorySource`] for one window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryChunk {
    /// Start of the window.
    pub from_ms: i64,
    /// End of the window.
    pub to_ms: i64,
    /// The points of each series asked for.
    pub series: HashMap<SeriesKey, Vec<Point>>,
    /// The process identities the series were loaded for.
    pub starts: Starts,
}

impl HistoryChunk {
    /// The points of `key`, unless `key` is a process that is no longer the one the chunk
    /// was loaded for (its PID now has another start time).
    pub fn series_for(&self, key: &SeriesKey, starts: &Starts) -> Option<&Vec<Point>> {
        if let SeriesKey::Process { pid, .. } = key {
            if let (Some(then), Some(now)) = (self.starts.get(pid), starts.get(pid)) {
                if then != now {
                    return None;
                }
            }
        }
        self.series.get(key)
    }
}

/// Every series `top` has sampled itself.
#[derive(Debug, Clone, Default)]
pub struct SeriesSet {
    series: HashMap<SeriesKey, Series>,
    /// Start time of each PID seen, to start a fresh series when a PID is reused.
    starts: HashMap<u32, u64>,
}

impl SeriesSet {
    /// Adds the memory figures of one observation.
    pub fn record(&mut self, obs: &Observation) {
        let t_ms = obs.taken_at_unix_ms();
        for (pid, host) in &obs.hosts {
            let Some(start) = host.start_time_ticks else {
                continue;
            };
            if self.starts.insert(*pid, start).is_some_and(|s| s != start) {
                self.series
                    .retain(|k, _| !matches!(k, SeriesKey::Process { pid: p, .. } if p == pid));
            }
        }
        for device in &obs.snapshot.devices {
            let Some(reading) = device.reading() else {
                continue;
            };
            let uuid = &device.info.uuid;
            if let Some(m) = reading.memory {
                self.push(SeriesKey::Device(uuid.clone()), t_ms, m.used_bytes);
            }
            for mig in &reading.mig {
                if let Some(m) = mig.memory {
                    self.push(SeriesKey::Device(mig.uuid.clone()), t_ms, m.used_bytes);
                }
            }
            for p in reading.processes.iter().flatten() {
                if let Some(bytes) = p.used_bytes {
                    let key = SeriesKey::Process {
                        uuid: uuid.clone(),
                        pid: p.pid,
                    };
                    self.push(key, t_ms, bytes);
                }
            }
        }
        // Forget processes not seen for the fine span: they left the table long ago.
        self.series.retain(|k, s| {
            matches!(k, SeriesKey::Device(_))
                || s.last().is_some_and(|p| p.t_ms >= t_ms - FINE_SPAN_MS)
        });
        self.starts.retain(|pid, _| {
            self.series
                .keys()
                .any(|k| matches!(k, SeriesKey::Process { pid: p, .. } if p == pid))
        });
    }

    fn push(&mut self, key: SeriesKey, t_ms: i64, bytes: u64) {
        self.series
            .entry(key)
            .or_default()
            .push(Point { t_ms, bytes });
    }

    /// One series, if sampled.
    pub fn get(&self, key: &SeriesKey) -> Option<&Series> {
        self.series.get(key)
    }

    /// Forgets everything (a replay jumped elsewhere).
    pub fn clear(&mut self) {
        self.series.clear();
        self.starts.clear();
    }
}

impl HistorySource for SeriesSet {
    fn points(
        &self,
        key: &SeriesKey,
        from_ms: i64,
        to_ms: i64,
        max_points: usize,
    ) -> Result<Vec<Point>, String> {
        let points = self
            .series
            .get(key)
            .map(|s| s.points(from_ms, to_ms))
            .unwrap_or_default();
        Ok(decimate(&points, from_ms, to_ms, max_points))
    }
}

/// The points of `key` over `[from_ms, to_ms]`: `loaded` (the store's or a recording's)
/// before the first point `top` sampled itself, `own` from there on. `starts`: who each
/// PID is now, so that history loaded for an earlier process under a reused PID is not
/// joined to the new one.
pub fn joined(
    own: Option<&Series>,
    loaded: Option<&HistoryChunk>,
    starts: &Starts,
    key: &SeriesKey,
    from_ms: i64,
    to_ms: i64,
) -> Vec<Point> {
    let own_points = own.map(|s| s.points(from_ms, to_ms)).unwrap_or_default();
    let own_from = own_points.first().map_or(i64::MAX, |p| p.t_ms);
    let mut out: Vec<Point> = loaded
        .and_then(|c| c.series_for(key, starts))
        .map(|pts| {
            pts.iter()
                .filter(|p| p.t_ms >= from_ms && p.t_ms <= to_ms && p.t_ms < own_from)
                .copied()
                .collect()
        })
        .unwrap_or_default();
    out.extend(own_points);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(t_s: i64, bytes: u64) -> Point {
        Point {
            t_ms: t_s * 1000,
            bytes,
        }
    }

    #[test]
    fn zoom_steps_and_stops() {
        assert_eq!(Zoom::Minute.zoom_in(), Zoom::Minute);
        assert_eq!(Zoom::Minute.zoom_out(), Zoom::FiveMinutes);
        assert_eq!(Zoom::Day.zoom_out(), Zoom::Day);
        assert_eq!(Zoom::Day.zoom_in(), Zoom::SixHours);
        assert_eq!(Zoom::Hour.span_ms(), 3_600_000);
    }

    #[test]
    fn fine_points_then_minute_maxima() {
        let mut s = Series::default();
        // 30 minutes at one sample per second; the value is the second.
        for t in 0..1800 {
            s.push(p(t, u64::try_from(t).unwrap()));
        }
        let all = s.points(0, 1800 * 1000);
        // Before the last 15 minutes: one point per minute, each the minute's maximum.
        assert_eq!(all[0], p(0, 59));
        assert_eq!(all[1], p(60, 119));
        let first_fine = all.iter().position(|q| q.t_ms % 60_000 != 0).unwrap();
        assert!(all[first_fine].t_ms >= (1799 - 900) * 1000);
        assert_eq!(all.last(), Some(&p(1799, 1799)));
        assert!(
            all.windows(2).all(|w| w[0].t_ms < w[1].t_ms),
            "in time order"
        );
    }

    #[test]
    fn old_samples_ignored() {
        let mut s = Series::default();
        s.push(p(10, 1));
        s.push(p(5, 2));
        s.push(p(10, 3));
        assert_eq!(s.points(0, 100_000), vec![p(10, 1)]);
    }

    #[test]
    fn change_per_minute_over_the_last_minute() {
        // +1 MiB every 10 s for 2 minutes: 6 MiB per minute.
        let pts: Vec<Point> = (0..=12).map(|i| p(i * 10, (i as u64) << 20)).collect();
        assert_eq!(change_per_minute(&pts), Some(6 << 20));
        // Less than a minute of samples: the change so far, not scaled up to a minute.
        let pts = vec![p(0, 10 << 20), p(30, 7 << 20)];
        assert_eq!(change_per_minute(&pts), Some(-(3 << 20)));
        // Too little to say.
        assert_eq!(change_per_minute(&[p(0, 5)]), None);
        assert_eq!(change_per_minute(&[]), None);
    }

    #[test]
    fn decimation_keeps_peaks_and_gaps() {
        let mut pts: Vec<Point> = (0..100).map(|t| p(t, 1)).collect();
        pts[42].bytes = 99;
        // A gap from 60 s to 80 s.
        pts.retain(|q| !(60_000..80_000).contains(&q.t_ms));
        let d = decimate(&pts, 0, 100_000, 10);
        assert!(d.len() <= 10);
        assert_eq!(d.iter().map(|q| q.bytes).max(), Some(99));
        assert!(
            !d.iter().any(|q| q.t_ms == 60_000 || q.t_ms == 70_000),
            "{d:?}"
        );
    }

    #[test]
    fn loaded_history_fills_in_before_own_samples() {
        let key = SeriesKey::Device("GPU-a".into());
        let mut own = Series::default();
        for t in 100..110 {
            own.push(p(t, 5));
        }
        let mut chunk = HistoryChunk {
            from_ms: 0,
            to_ms: 200_000,
            ..Default::default()
        };
        // The store overlaps our samples from 100 s; ours win there.
        chunk
            .series
            .insert(key.clone(), (0..110).step_by(10).map(|t| p(t, 1)).collect());
        let none = Starts::new();
        let j = joined(Some(&own), Some(&chunk), &none, &key, 0, 200_000);
        assert_eq!(j.first(), Some(&p(0, 1)));
        assert!(j.iter().filter(|q| q.t_ms >= 100_000).all(|q| q.bytes == 5));
        assert_eq!(j.len(), 10 + 10);
        // Without a store: only ours.
        assert_eq!(joined(Some(&own), None, &none, &key, 0, 200_000).len(), 10);
    }

    #[test]
    fn history_of_an_earlier_process_under_a_reused_pid_is_not_joined() {
        let key = SeriesKey::Process {
            uuid: "GPU-a".into(),
            pid: 7,
        };
        let mut chunk = HistoryChunk {
            from_ms: 0,
            to_ms: 100_000,
            ..Default::default()
        };
        chunk.series.insert(key.clone(), vec![p(10, 1), p(20, 2)]);
        chunk.starts.insert(7, 500);
        let same: Starts = [(7, 500)].into();
        let reused: Starts = [(7, 900)].into();
        assert_eq!(joined(None, Some(&chunk), &same, &key, 0, 100_000).len(), 2);
        assert!(joined(None, Some(&chunk), &reused, &key, 0, 100_000).is_empty());
        // Not visible now: nothing to compare, the PID is taken at its word.
        assert_eq!(
            joined(None, Some(&chunk), &Starts::new(), &key, 0, 100_000).len(),
            2
        );
    }
}
