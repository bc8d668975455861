//! A memory series in bounded space: the recent samples as they are, older ones in
//! time buckets that double in width as the history grows.
//!
//! The batch analysis and the incremental tracker both push every sample through
//! [`Tiered`], so they see exactly the same points and reach the same verdict on the same
//! data. Cost: O(1) amortised per sample; at most `tail_points + head_points` points.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// One reading of a process's (or a device's) memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// When it was read, milliseconds since the Unix epoch.
    pub t_unix_ms: i64,
    /// Memory held, as NVML reports it (for a process: CUDA context plus the allocator's
    /// reserved cache, in 2 MiB / 20 MiB granules).
    pub bytes: u64,
    /// Lowest value in the interval this sample stands for, when downsampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_bytes: Option<u64>,
    /// Highest value in the interval this sample stands for, when downsampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// The recorder did not observe between the previous sample and this one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gap_before: bool,
}

impl Sample {
    /// A plain reading.
    pub fn new(t_unix_ms: i64, bytes: u64) -> Self {
        Self {
            t_unix_ms,
            bytes,
            min_bytes: None,
            max_bytes: None,
            gap_before: false,
        }
    }

    fn low(&self) -> u64 {
        self.min_bytes.map_or(self.bytes, |m| m.min(self.bytes))
    }

    fn high(&self) -> u64 {
        self.max_bytes.map_or(self.bytes, |m| m.max(self.bytes))
    }
}

/// A span of samples reduced to what the analysis needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Point {
    pub t_first: i64,
    pub t_last: i64,
    pub min: u64,
    pub max: u64,
    pub last: u64,
    pub count: u32,
    /// Largest fall from a higher value to a later lower one inside the span (0 for a
    /// single sample: the order of a downsampled sample's min and max is unknown).
    pub drop: u64,
}

impl Point {
    fn from_sample(s: &Sample) -> Self {
        Self {
            t_first: s.t_unix_ms,
            t_last: s.t_unix_ms,
            min: s.low(),
            max: s.high(),
            last: s.bytes,
            count: 1,
            drop: 0,
        }
    }

    fn merge(&mut self, later: &Self) {
        self.drop = self
            .drop
            .max(later.drop)
            .max(self.max.saturating_sub(later.min));
        self.t_last = later.t_last;
        self.min = self.min.min(later.min);
        self.max = self.max.max(later.max);
        self.last = later.last;
        self.count = self.count.saturating_add(later.count);
    }

    /// The time the point stands for (middle of its span).
    pub fn t(&self) -> i64 {
        self.t_first + (self.t_last - self.t_first) / 2
    }
}

/// Timestamps beyond ±2^53 ms (±285,000 years) are not times; ignoring them keeps every
/// difference of times far from overflow.
pub(crate) const MAX_ABS_T_MS: i64 = 1 << 53;

/// Width of the first head buckets; doubled whenever the head is full.
const INITIAL_BUCKET_MS: i64 = 1000;

/// The bounded representation of one series.
#[derive(Debug, Clone)]
pub(crate) struct Tiered {
    tail_points: usize,
    head_points: usize,
    origin: Option<i64>,
    bucket_ms: i64,
    head: Vec<(i64, Point)>,
    tail: VecDeque<Point>,
    last_t: Option<i64>,
    last_bytes: Option<u64>,
    /// The latest sample whose memory differed from the one before it (or that stands for
    /// an interval in which it varied): the process allocated or freed, so it was active
    /// then, whatever its CPU time says.
    pub last_change_ms: Option<i64>,
    pub accepted: u64,
    pub ignored: u64,
    pub gaps: u32,
    pub peak: u64,
}

impl Tiered {
    pub fn new(tail_points: usize, head_points: usize) -> Self {
        Self {
            tail_points: tail_points.max(1),
            head_points: head_points.max(2),
            origin: None,
            bucket_ms: INITIAL_BUCKET_MS,
            head: Vec::new(),
            tail: VecDeque::new(),
            last_t: None,
            last_bytes: None,
            last_change_ms: None,
            accepted: 0,
            ignored: 0,
            gaps: 0,
            peak: 0,
        }
    }

    /// Adds a sample; one not later than the previous one, or with an impossible
    /// timestamp, is ignored (and counted).
    pub fn push(&mut self, sample: &Sample) -> bool {
        if self.last_t.is_some_and(|t| sample.t_unix_ms <= t)
            || sample.t_unix_ms.abs() > MAX_ABS_T_MS
        {
            self.ignored += 1;
            return false;
        }
        self.last_t = Some(sample.t_unix_ms);
        self.origin.get_or_insert(sample.t_unix_ms);
        if self.last_bytes.is_some_and(|b| b != sample.bytes) || sample.low() != sample.high() {
            self.last_change_ms = Some(sample.t_unix_ms);
        }
        self.last_bytes = Some(sample.bytes);
        self.accepted += 1;
        if sample.gap_before && self.accepted > 1 {
            self.gaps = self.gaps.saturating_add(1);
        }
        let point = Point::from_sample(sample);
        self.peak = self.peak.max(point.max);
        self.tail.push_back(point);
        if self.tail.len() > self.tail_points {
            if let Some(old) = self.tail.pop_front() {
                self.push_head(old);
            }
        }
        true
    }

    fn push_head(&mut self, point: Point) {
        let origin = self.origin.unwrap_or(point.t_first);
        let index = (point.t_first - origin).div_euclid(self.bucket_ms);
        match self.head.last_mut() {
            Some((last, bucket)) if *last == index => bucket.merge(&point),
            _ => self.head.push((index, point)),
        }
        if self.head.len() > self.head_points {
            self.halve_head();
        }
    }

    /// Doubles the bucket width and merges the buckets that now share one.
    fn halve_head(&mut self) {
        self.bucket_ms = self.bucket_ms.saturating_mul(2);
        let mut merged: Vec<(i64, Point)> = Vec::with_capacity(self.head.len() / 2 + 1);
        for (index, point) in self.head.drain(..) {
            let index = index.div_euclid(2);
            match merged.last_mut() {
                Some((last, bucket)) if *last == index => bucket.merge(&point),
                _ => merged.push((index, point)),
            }
        }
        self.head = merged;
    }

    /// The series in time order: head buckets, then the raw tail.
    pub fn points(&self) -> Vec<Point> {
        let mut out = Vec::with_capacity(self.head.len() + self.tail.len());
        out.extend(self.head.iter().map(|(_, p)| *p));
        out.extend(self.tail.iter().copied());
        out
    }

    pub fn last(&self) -> Option<&Point> {
        self.tail.back()
    }

    pub fn first_t(&self) -> Option<i64> {
        self.origin
    }
}

/// The device's free memory at earlier times, for the look-back of a leak verdict: whether
/// a series was a leak at an earlier end is asked with the free memory of then, since
/// `fills-device`'s urgency is a forecast from it (issue 35: a leak made by `fills-device`
/// turned `growing` for a second when other processes freed memory, then `leak` again by
/// `steady-growth`). One entry per [`FreeHistory::STEP_MS`] at most, over the last
/// [`FreeHistory::SPAN_MS`]: at most 1,800 entries. The batch scan and the live tracker
/// both keep one, so the two analyses agree.
#[derive(Debug, Clone, Default)]
pub struct FreeHistory {
    entries: VecDeque<(i64, u64)>,
    /// The entries as last handed out, until the next kept entry: every process on the
    /// device shares one copy.
    shared: Option<std::sync::Arc<[(i64, u64)]>>,
}

impl FreeHistory {
    /// The finest spacing kept: the look-back's ends are a second apart at the finest.
    pub const STEP_MS: i64 = 1000;
    /// How far back it reaches: past any look-back window but a slow staircase's
    /// (ends further back take the oldest entry).
    pub const SPAN_MS: i64 = 30 * 60 * 1000;

    /// Records the free memory read at `t_unix_ms` (`None`: not read then, nothing kept);
    /// whether it was kept (the last entry is less than a step old: not).
    pub fn push(&mut self, t_unix_ms: i64, free_bytes: Option<u64>) -> bool {
        let Some(free) = free_bytes else {
            return false;
        };
        match self.entries.back() {
            Some(&(last, _)) if t_unix_ms < last.saturating_add(Self::STEP_MS) => return false,
            _ => self.entries.push_back((t_unix_ms, free)),
        }
        self.shared = None;
        while self
            .entries
            .front()
            .is_some_and(|&(t, _)| t < t_unix_ms.saturating_sub(Self::SPAN_MS))
        {
            self.entries.pop_front();
        }
        true
    }

    /// The entries, oldest first, as the analysis takes them (copied once per kept entry,
    /// however many ask).
    pub fn snapshot(&mut self) -> std::sync::Arc<[(i64, u64)]> {
        let entries = &self.entries;
        std::sync::Arc::clone(
            self.shared
                .get_or_insert_with(|| entries.iter().copied().collect()),
        )
    }
}

/// The free memory at `t_unix_ms` by `history` (the last entry at or before it), else
/// `now` (no entry that old, or no history).
pub(crate) fn free_at(history: &[(i64, u64)], t_unix_ms: i64, now: Option<u64>) -> Option<u64> {
    match history.partition_point(|&(t, _)| t <= t_unix_ms) {
        0 => now,
        i => Some(history[i - 1].1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_recent_samples_raw_and_buckets_old_ones() {
        let mut t = Tiered::new(10, 8);
        for i in 0..1000 {
            assert!(t.push(&Sample::new(i * 100, 1000 + i as u64)));
        }
        let pts = t.points();
        assert!(pts.len() <= 18, "{}", pts.len());
        // The tail is the last 10 samples, as they were.
        let tail: Vec<u64> = pts[pts.len() - 10..].iter().map(|p| p.last).collect();
        assert_eq!(tail, (990..1000).map(|i| 1000 + i).collect::<Vec<u64>>());
        // Buckets cover everything before, in order, with their min and max.
        assert_eq!(pts[0].min, 1000);
        assert_eq!(pts[0].t_first, 0);
        for w in pts.windows(2) {
            assert!(w[0].t_last < w[1].t_first);
        }
        let counted: u32 = pts.iter().map(|p| p.count).sum();
        assert_eq!(counted, 1000);
    }

    #[test]
    fn ignores_samples_out_of_order_and_counts_gaps() {
        let mut t = Tiered::new(10, 8);
        assert!(t.push(&Sample::new(1000, 1)));
        assert!(!t.push(&Sample::new(1000, 2)));
        assert!(!t.push(&Sample::new(500, 2)));
        let mut gap = Sample::new(5000, 3);
        gap.gap_before = true;
        assert!(t.push(&gap));
        assert_eq!((t.accepted, t.ignored, t.gaps), (2, 2, 1));
        assert_eq!(t.last_change_ms, Some(5000));
    }

    #[test]
    fn downsampled_samples_keep_their_extremes() {
        let mut t = Tiered::new(1, 4);
        let mut s = Sample::new(0, 100);
        s.min_bytes = Some(50);
        s.max_bytes = Some(900);
        t.push(&s);
        t.push(&Sample::new(10_000, 100));
        let pts = t.points();
        assert_eq!((pts[0].min, pts[0].max), (50, 900));
        assert_eq!(t.peak, 900);
    }

    #[test]
    fn huge_values_do_not_overflow() {
        let mut t = Tiered::new(2, 2);
        for i in 0..100 {
            t.push(&Sample::new(
                i64::MAX - 1000 + i,
                u64::MAX - 5 + (i as u64 % 5),
            ));
        }
        assert!(t.points().iter().all(|p| p.min >= u64::MAX - 5));
    }
}
