//! Reading the history back: devices, processes, series of points, gaps.
//!
//! Every query decodes frames from the last key frame before its range, so it costs the
//! range plus at most one key-frame interval. Old data lives in downsampled tiers; a query
//! spanning tiers gets buckets (`span_ms > 0`, with min/max/last) for the old part and raw
//! samples for the recent part.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{OptionalExtension, params};

use crate::codec::{self, Entry, State};
use crate::db::{Catalog, Store};
use crate::error::StoreError;
use crate::model::{
    DeviceMeta, DeviceRecord, Gap, Metric, Point, ProcessKey, ProcessMeta, ProcessRecord, TimeRange,
};

/// One series as a frame names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeriesRef {
    /// What it measures.
    pub metric: Metric,
    /// The device (row id), for device and per-process-per-device series.
    pub device_id: Option<i64>,
    /// The process (row id), for per-process series.
    pub process_id: Option<i64>,
}

/// The state of every series at one time, as [`Store::scan`] hands it out.
pub struct Frame<'a> {
    /// Sample time, or bucket start.
    pub t_ms: i64,
    /// 0 for a raw sample, else the bucket length.
    pub span_ms: i64,
    state: &'a State,
    catalog: &'a Catalog,
    observed: Option<&'a [u8]>,
    /// Series this frame changed, or `None` when anything may have (a key frame, the
    /// first frame of a scan or of a tier).
    changed: Option<&'a [u32]>,
}

impl Frame<'_> {
    /// Every present series by id, with its entry (cheaper than [`Frame::iter`] when the
    /// caller resolves ids itself with [`Frame::series`]).
    pub fn entries(&self) -> impl Iterator<Item = (u32, Entry)> + '_ {
        self.state.iter()
    }

    /// The series with this id.
    pub fn series(&self, id: u32) -> Option<SeriesRef> {
        let k = self.catalog.series(id)?;
        Some(SeriesRef {
            metric: k.metric,
            device_id: k.device,
            process_id: k.process,
        })
    }

    /// The entry of series `id`, if present.
    pub fn entry(&self, id: u32) -> Option<Entry> {
        self.state.get(id)
    }

    /// The series whose entry this frame changed (appeared, changed value, or gone) since
    /// the previous frame of the same scan; `None` when that is not known (key frames,
    /// the first frame): then treat every present series as changed. Lets a reader that
    /// aggregates over many frames touch only what moved.
    pub fn changed(&self) -> Option<&[u32]> {
        self.changed
    }

    /// Whether this frame observed `device_id`'s metrics and its process list. Recorded
    /// frames observe everything; an imported log may have had only some devices, or only
    /// processes, at this time (the other values are carried over from before).
    pub fn observed(&self, device_id: i64) -> (bool, bool) {
        let Some(data) = self.observed else {
            return (true, true);
        };
        let mut pos = 0;
        while pos < data.len() {
            let Ok(v) = codec::get_varint(data, &mut pos) else {
                break;
            };
            if i64::try_from(v >> 2).ok() == Some(device_id) {
                return (v & 2 != 0, v & 1 != 0);
            }
        }
        (false, false)
    }

    /// Whether this frame sampled series `id`, rather than carrying its value over from an
    /// earlier frame. A recorded frame samples everything; an imported log's frame only
    /// what its rows had: an nvidia-smi GPU log's row a device's metrics, an apps log's rows
    /// its process list (the two logs of one run alternate, milliseconds apart). The store
    /// keeps the other values present (a moment replayed shows the whole state), so a reader
    /// that lists samples — `history` — lists only the sampled ones, or every process of an
    /// apps log would be listed again at each GPU-log time (and after the apps log ended,
    /// through any later log of the same GPU).
    pub fn sampled(&self, id: u32) -> bool {
        if self.observed.is_none() {
            return true;
        }
        self.series(id).is_some_and(|s| self.sampled_series(s))
    }

    /// [`Frame::sampled`] of a series named by what it is.
    pub fn sampled_series(&self, series: SeriesRef) -> bool {
        match series.device_id {
            _ if self.observed.is_none() => true,
            None => true,
            Some(d) => {
                let (metrics, processes) = self.observed(d);
                if series.process_id.is_some() {
                    processes
                } else {
                    metrics
                }
            }
        }
    }

    /// Whether this frame observed every device (see [`Frame::observed`]).
    pub fn observed_all(&self) -> bool {
        self.observed.is_none()
    }

    /// Every series' entry, by series id.
    pub(crate) fn state(&self) -> &State {
        self.state
    }

    /// The raw `observed` list, for a lossless export.
    pub(crate) fn observed_raw(&self) -> Option<&[u8]> {
        self.observed
    }

    /// Every present series and its entry.
    pub fn iter(&self) -> impl Iterator<Item = (SeriesRef, Entry)> + '_ {
        self.state.iter().filter_map(|(id, entry)| {
            let k = self.catalog.series(id)?;
            Some((
                SeriesRef {
                    metric: k.metric,
                    device_id: k.device,
                    process_id: k.process,
                },
                entry,
            ))
        })
    }

    /// The entry of one series, if present.
    pub fn get(&self, series: SeriesRef) -> Option<Entry> {
        let id = self.catalog.series_ids.get(&crate::db::SeriesKey {
            metric: series.metric,
            device: series.device_id,
            process: series.process_id,
        })?;
        self.state.get(*id)
    }
}

/// Which stored tier a scan reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Raw,
    Rollup(i64),
}

impl Store {
    /// Every device ever recorded.
    ///
    /// # Errors
    /// When SQLite fails.
    pub fn devices(&mut self) -> Result<Vec<DeviceRecord>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, uuid, idx, name, pci_bus_id, parent_uuid, first_seen_ms FROM device \
                 ORDER BY coalesce(idx, 1000000), uuid",
            )
            .map_err(self.err("cannot list devices"))?;
        let rows = stmt
            .query_map([], |r| {
                Ok(DeviceRecord {
                    id: r.get(0)?,
                    meta: DeviceMeta {
                        uuid: r.get(1)?,
                        index: r.get(2)?,
                        name: r.get(3)?,
                        pci_bus_id: r.get(4)?,
                        parent_uuid: r.get(5)?,
                    },
                    first_seen_ms: r.get(6)?,
                })
            })
            .map_err(self.err("cannot list devices"))?;
        rows.collect::<Result<_, _>>()
            .map_err(self.err("cannot list devices"))
    }

    /// The device with this UUID.
    ///
    /// # Errors
    /// When SQLite fails.
    pub fn device_by_uuid(&mut self, uuid: &str) -> Result<Option<DeviceRecord>, StoreError> {
        Ok(self
            .devices()?
            .into_iter()
            .find(|d| d.meta.uuid.eq_ignore_ascii_case(uuid)))
    }

    /// Oldest and newest stored times (any tier), or `None` for an empty history.
    ///
    /// # Errors
    /// When SQLite fails.
    pub fn time_bounds(&self) -> Result<Option<(i64, i64)>, StoreError> {
        let (raw_min, raw_max): (Option<i64>, Option<i64>) = self
            .conn
            .query_row("SELECT min(t_ms), max(t_ms) FROM frame", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .map_err(self.err("cannot read the time range"))?;
        let (roll_min, roll_max): (Option<i64>, Option<i64>) = self
            .conn
            .query_row(
                "SELECT min(t_ms), max(t_ms + res_ms - 1) FROM rollup",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(self.err("cannot read the time range"))?;
        let min = [raw_min, roll_min].into_iter().flatten().min();
        let max = [raw_max, roll_max].into_iter().flatten().max();
        Ok(min.zip(max))
    }

    /// Visits the state of every series at each stored time in `range`, oldest first:
    /// downsampled buckets where only those remain, raw samples after.
    ///
    /// # Errors
    /// When SQLite fails or a frame is damaged.
    pub fn scan(
        &mut self,
        range: TimeRange,
        mut visit: impl FnMut(&Frame<'_>),
    ) -> Result<(), StoreError> {
        self.load_catalog()?;
        for (tier, part) in self.tiers(range)? {
            self.scan_tier(tier, part, &mut visit)?;
        }
        Ok(())
    }

    /// Which tier covers which part of `range`: coarse tiers for the old part, each up to
    /// where the next finer one starts.
    fn tiers(&self, range: TimeRange) -> Result<Vec<(Tier, TimeRange)>, StoreError> {
        let err = self.err("cannot read the tiers");
        let raw_start: Option<i64> = self
            .conn
            .query_row("SELECT min(t_ms) FROM frame", [], |r| r.get(0))
            .map_err(&err)?;
        let mut stmt = self
            .conn
            .prepare_cached("SELECT res_ms, min(t_ms) FROM rollup GROUP BY res_ms ORDER BY res_ms")
            .map_err(&err)?;
        let rollups: Vec<(i64, i64)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(&err)?
            .collect::<Result<_, _>>()
            .map_err(&err)?;
        // Finest first: raw, then each rollup resolution ascending. Each tier covers from
        // its oldest data up to where the finer one starts; a bucket is used only if it
        // ends by then, so no time is covered twice. The coarsest reaches back to the start.
        let mut tiers: Vec<(Tier, i64, i64)> = Vec::new();
        if let Some(start) = raw_start {
            tiers.push((Tier::Raw, start, 0));
        }
        tiers.extend(
            rollups
                .iter()
                .map(|&(res, start)| (Tier::Rollup(res), start, res)),
        );
        let mut parts = Vec::new();
        let mut upper = i64::MAX;
        let last = tiers.len().saturating_sub(1);
        for (i, &(tier, start, res)) in tiers.iter().enumerate() {
            let lower = if i == last { i64::MIN } else { start };
            // Bucket starts allowed: those whose bucket ends by `upper`.
            let top = if upper == i64::MAX {
                i64::MAX - 1
            } else {
                upper - res.max(1)
            };
            let part = TimeRange {
                from_ms: lower.max(range.from_ms),
                to_ms: top.min(range.to_ms),
            };
            if part.from_ms <= part.to_ms {
                parts.push((tier, part));
            }
            if lower < upper {
                upper = lower;
            }
        }
        parts.reverse();
        Ok(parts)
    }

    fn scan_tier(
        &self,
        tier: Tier,
        range: TimeRange,
        visit: &mut dyn FnMut(&Frame<'_>),
    ) -> Result<(), StoreError> {
        let err = self.err("cannot read samples");
        let (key_sql, rows_sql, res) = match tier {
            Tier::Raw => (
                "SELECT max(t_ms) FROM frame WHERE key = 1 AND t_ms <= ?1",
                "SELECT t_ms, key, data, observed FROM frame WHERE t_ms >= ?1 AND t_ms <= ?2 \
                 ORDER BY t_ms",
                0,
            ),
            Tier::Rollup(res) => (
                "SELECT max(t_ms) FROM rollup WHERE res_ms = ?2 AND key = 1 AND t_ms <= ?1",
                "SELECT t_ms, key, data, NULL FROM rollup WHERE res_ms = ?3 AND t_ms >= ?1 \
                 AND t_ms <= ?2 ORDER BY t_ms",
                res,
            ),
        };
        let start: Option<i64> = match tier {
            Tier::Raw => self.conn.query_row(key_sql, [range.from_ms], |r| r.get(0)),
            Tier::Rollup(res) => self
                .conn
                .query_row(key_sql, [range.from_ms, res], |r| r.get(0)),
        }
        .optional()
        .map_err(&err)?
        .flatten();
        let start = start.unwrap_or(range.from_ms);
        let mut stmt = self.conn.prepare_cached(rows_sql).map_err(&err)?;
        let mut rows = match tier {
            Tier::Raw => stmt.query(params![start, range.to_ms]),
            Tier::Rollup(res) => stmt.query(params![start, range.to_ms, res]),
        }
        .map_err(&err)?;
        let mut state = State::default();
        let mut keyed = false;
        let mut touched: Vec<u32> = Vec::new();
        let mut first_visit = true;
        while let Some(row) = rows.next().map_err(&err)? {
            let t: i64 = row.get(0).map_err(&err)?;
            let key: bool = row.get(1).map_err(&err)?;
            let data = row
                .get_ref(2)
                .map_err(&err)?
                .as_blob()
                .map_err(|e| StoreError::sqlite(&self.path, "cannot read samples", e.into()))?;
            if !key && !keyed {
                // Data before the first key frame (cut by retention) cannot be decoded.
                continue;
            }
            keyed = true;
            codec::apply_tracked(&mut state, data, key, Some(&mut touched)).map_err(
                |e| match e {
                    StoreError::Corrupt { detail, .. } => StoreError::Corrupt {
                        path: Some(self.path.clone()),
                        detail: format!("{detail} (at {t} ms)"),
                    },
                    other => other,
                },
            )?;
            if t >= range.from_ms {
                let observed = row
                    .get_ref(3)
                    .map_err(&err)?
                    .as_blob_or_null()
                    .map_err(|e| StoreError::sqlite(&self.path, "cannot read samples", e.into()))?;
                visit(&Frame {
                    t_ms: t,
                    span_ms: res,
                    state: &state,
                    catalog: &self.catalog,
                    observed,
                    changed: (!key && !first_visit).then_some(touched.as_slice()),
                });
                first_visit = false;
            }
        }
        Ok(())
    }

    /// Points of one series in `range` (unknown values are left out, and so are values an
    /// imported log's frame only carried over: [`Frame::sampled`]).
    ///
    /// # Errors
    /// When SQLite fails or a frame is damaged.
    pub fn series_points(
        &mut self,
        series: SeriesRef,
        range: TimeRange,
    ) -> Result<Vec<Point>, StoreError> {
        let mut points = Vec::new();
        self.scan(range, |frame| {
            if !frame.sampled_series(series) {
                return;
            }
            if let Some((min, max, last)) = frame.get(series).and_then(Entry::min_max_last) {
                points.push(Point {
                    unix_ms: frame.t_ms,
                    span_ms: frame.span_ms,
                    min,
                    max,
                    last,
                });
            }
        })?;
        Ok(points)
    }

    /// One device metric over `range`.
    ///
    /// # Errors
    /// When SQLite fails or a frame is damaged.
    pub fn device_metric(
        &mut self,
        device_id: i64,
        metric: Metric,
        range: TimeRange,
    ) -> Result<Vec<Point>, StoreError> {
        self.series_points(
            SeriesRef {
                metric,
                device_id: Some(device_id),
                process_id: None,
            },
            range,
        )
    }

    /// A process's memory on one device over `range`, as `(unix_ms, bytes)` points with
    /// min/max where downsampled.
    ///
    /// # Errors
    /// When SQLite fails or a frame is damaged.
    pub fn process_memory(
        &mut self,
        process_id: i64,
        device_id: i64,
        range: TimeRange,
    ) -> Result<Vec<Point>, StoreError> {
        self.series_points(
            SeriesRef {
                metric: Metric::ProcessUsedBytes,
                device_id: Some(device_id),
                process_id: Some(process_id),
            },
            range,
        )
    }

    /// One per-process, per-device series over `range`: [`Metric::ProcessUsedBytes`]
    /// (NVML's figure, as [`Store::process_memory`]), [`Metric::ProcessAllocatedBytes`] or
    /// [`Metric::ProcessReservedBytes`] (the agent's), [`Metric::ProcessSmPercent`]. Empty
    /// where the process had no such series (no agent): so the leak analysis can judge
    /// allocated bytes where an agent gave them and NVML's otherwise.
    ///
    /// # Errors
    /// When SQLite fails or a frame is damaged.
    pub fn process_device_metric(
        &mut self,
        process_id: i64,
        device_id: i64,
        metric: Metric,
        range: TimeRange,
    ) -> Result<Vec<Point>, StoreError> {
        self.series_points(
            SeriesRef {
                metric,
                device_id: Some(device_id),
                process_id: Some(process_id),
            },
            range,
        )
    }

    /// A process's CPU time (clock ticks, cumulative) over `range`.
    ///
    /// # Errors
    /// When SQLite fails or a frame is damaged.
    pub fn process_cpu(
        &mut self,
        process_id: i64,
        range: TimeRange,
    ) -> Result<Vec<Point>, StoreError> {
        self.series_points(
            SeriesRef {
                metric: Metric::ProcessCpuTicks,
                device_id: None,
                process_id: Some(process_id),
            },
            range,
        )
    }

    /// Processes that held memory on some device in `range`, with the devices they used.
    ///
    /// # Errors
    /// When SQLite fails or a frame is damaged.
    pub fn processes_in(
        &mut self,
        range: TimeRange,
    ) -> Result<Vec<(ProcessRecord, Vec<i64>)>, StoreError> {
        let mut seen: BTreeMap<i64, BTreeSet<i64>> = BTreeMap::new();
        self.scan(range, |frame| {
            for (s, _) in frame.iter() {
                if s.metric == Metric::ProcessUsedBytes {
                    if let (Some(p), Some(d)) = (s.process_id, s.device_id) {
                        seen.entry(p).or_default().insert(d);
                    }
                }
            }
        })?;
        let mut out = Vec::with_capacity(seen.len());
        for (id, devices) in seen {
            if let Some(record) = self.process(id)? {
                out.push((record, devices.into_iter().collect()));
            }
        }
        Ok(out)
    }

    /// One stored process.
    ///
    /// # Errors
    /// When SQLite fails.
    pub fn process(&self, id: i64) -> Result<Option<ProcessRecord>, StoreError> {
        // A file older than schema 3 has no job column (a reader does not upgrade it).
        let sql = if self.slurm_column {
            "SELECT id, boot_id, pid, start_time_ticks, uid, user, command, container_id, \
             pod_uid, first_seen_ms, last_seen_ms, slurm_job_id FROM process WHERE id = ?1"
        } else {
            "SELECT id, boot_id, pid, start_time_ticks, uid, user, command, container_id, \
             pod_uid, first_seen_ms, last_seen_ms, NULL FROM process WHERE id = ?1"
        };
        self.conn
            .prepare_cached(sql)
            .and_then(|mut s| {
                s.query_row([id], |r| {
                    Ok(ProcessRecord {
                        id: r.get(0)?,
                        meta: ProcessMeta {
                            key: ProcessKey {
                                boot_id: r.get(1)?,
                                pid: r.get(2)?,
                                start_time_ticks: r
                                    .get::<_, Option<i64>>(3)?
                                    .and_then(|v| u64::try_from(v).ok()),
                            },
                            uid: r.get(4)?,
                            user: r.get(5)?,
                            command: r.get(6)?,
                            container_id: r.get(7)?,
                            pod_uid: r.get(8)?,
                            slurm_job_id: r.get(11)?,
                        },
                        first_seen_ms: r.get(9)?,
                        last_seen_ms: r.get(10)?,
                    })
                })
                .optional()
            })
            .map_err(self.err("cannot read a process"))
    }

    /// Every stored process, by id (one query, no decoding; `processes_in` narrows to a
    /// range but decodes it).
    pub fn all_processes(
        &self,
    ) -> Result<std::collections::HashMap<i64, ProcessRecord>, StoreError> {
        let err = self.err("cannot read processes");
        let ids: Vec<i64> = self
            .conn
            .prepare("SELECT id FROM process")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(&err)?;
        let mut out = std::collections::HashMap::with_capacity(ids.len());
        for id in ids {
            if let Some(p) = self.process(id)? {
                out.insert(id, p);
            }
        }
        Ok(out)
    }

    /// Gaps overlapping `range`, oldest first.
    ///
    /// # Errors
    /// When SQLite fails.
    pub fn gaps(&self, range: TimeRange) -> Result<Vec<Gap>, StoreError> {
        let err = self.err("cannot read gaps");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT d.uuid, g.metric, g.from_ms, g.to_ms, g.open, g.reason FROM gap g \
                 LEFT JOIN device d ON d.id = g.device_id \
                 WHERE g.to_ms >= ?1 AND g.from_ms <= ?2 ORDER BY g.from_ms, g.id",
            )
            .map_err(&err)?;
        let rows = stmt
            .query_map([range.from_ms, range.to_ms], |r| {
                Ok(Gap {
                    device_uuid: r.get(0)?,
                    metric: r.get::<_, Option<i64>>(1)?.and_then(Metric::from_code),
                    from_ms: r.get(2)?,
                    to_ms: r.get(3)?,
                    open: r.get(4)?,
                    reason: r.get(5)?,
                })
            })
            .map_err(&err)?;
        rows.collect::<Result<_, _>>().map_err(&err)
    }

    /// The latest stored time at or before `t_ms`: a sample, or a bucket's start where
    /// only downsampled buckets remain (the times [`Store::scan`] visits). `None` before
    /// the first. For browsing a recording sample by sample.
    ///
    /// # Errors
    /// When SQLite fails.
    pub fn time_at_or_before(&self, t_ms: i64) -> Result<Option<i64>, StoreError> {
        let err = self.err("cannot read sample times");
        let mut best: Option<i64> = None;
        for (tier, part) in self.tiers(TimeRange::ALL)? {
            if part.from_ms > t_ms {
                continue;
            }
            let to = part.to_ms.min(t_ms);
            let found: Option<i64> = match tier {
                Tier::Raw => self.conn.query_row(
                    "SELECT max(t_ms) FROM frame WHERE t_ms >= ?1 AND t_ms <= ?2",
                    [part.from_ms, to],
                    |r| r.get(0),
                ),
                Tier::Rollup(res) => self.conn.query_row(
                    "SELECT max(t_ms) FROM rollup WHERE res_ms = ?3 AND t_ms >= ?1 AND t_ms <= ?2",
                    [part.from_ms, to, res],
                    |r| r.get(0),
                ),
            }
            .map_err(&err)?;
            best = best.max(found);
        }
        Ok(best)
    }

    /// The earliest stored time after `t_ms` (see [`Store::time_at_or_before`]).
    ///
    /// # Errors
    /// When SQLite fails.
    pub fn time_after(&self, t_ms: i64) -> Result<Option<i64>, StoreError> {
        let err = self.err("cannot read sample times");
        let mut best: Option<i64> = None;
        for (tier, part) in self.tiers(TimeRange::ALL)? {
            if part.to_ms <= t_ms {
                continue;
            }
            let from = part.from_ms.max(t_ms.saturating_add(1));
            let found: Option<i64> = match tier {
                Tier::Raw => self.conn.query_row(
                    "SELECT min(t_ms) FROM frame WHERE t_ms >= ?1 AND t_ms <= ?2",
                    [from, part.to_ms],
                    |r| r.get(0),
                ),
                Tier::Rollup(res) => self.conn.query_row(
                    "SELECT min(t_ms) FROM rollup WHERE res_ms = ?3 AND t_ms >= ?1 AND t_ms <= ?2",
                    [from, part.to_ms, res],
                    |r| r.get(0),
                ),
            }
            .map_err(&err)?;
            best = match (best, found) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(best)
    }

    /// Every stored process that had this PID (several when the PID was reused, or on
    /// other boots), oldest first, without decoding samples.
    ///
    /// # Errors
    /// When SQLite fails.
    pub fn processes_with_pid(&self, pid: u32) -> Result<Vec<ProcessRecord>, StoreError> {
        let err = self.err("cannot read processes");
        let ids: Vec<i64> = self
            .conn
            .prepare_cached("SELECT id FROM process WHERE pid = ?1 ORDER BY first_seen_ms, id")
            .and_then(|mut s| s.query_map([pid], |r| r.get(0))?.collect())
            .map_err(&err)?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(p) = self.process(id)? {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// Number of stored raw frames (ticks) in `range`.
    ///
    /// # Errors
    /// When SQLite fails.
    pub fn tick_count(&self, range: TimeRange) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn
            .query_row(
                "SELECT count(*) FROM frame WHERE t_ms >= ?1 AND t_ms <= ?2",
                [range.from_ms, range.to_ms],
                |r| r.get(0),
            )
            .map_err(self.err("cannot count samples"))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// Buckets `points` into `step_ms` windows aligned to the epoch, keeping min, max and last:
/// a spike inside a bucket stays visible.
pub fn downsample(points: &[Point], step_ms: i64) -> Vec<Point> {
    if step_ms <= 0 {
        return points.to_vec();
    }
    let mut out: Vec<Point> = Vec::new();
    for p in points {
        let bucket = p.unix_ms.div_euclid(step_ms) * step_ms;
        match out.last_mut() {
            Some(b) if b.unix_ms == bucket => {
                b.min = b.min.min(p.min);
                b.max = b.max.max(p.max);
                b.last = p.last;
            }
            _ => out.push(Point {
                unix_ms: bucket,
                span_ms: step_ms.max(p.span_ms),
                min: p.min,
                max: p.max,
                last: p.last,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retention::Retention;
    use crate::writer::tests::{GIB, T0, process, tick};

    #[test]
    fn sample_times_step_through_raw_frames_and_buckets() {
        let mut store = Store::open_in_memory().unwrap();
        store.set_key_interval_ms(10_000);
        let start = T0 - T0.rem_euclid(60_000);
        for i in 0..300 {
            store
                .append(&tick(start + i * 1000, GIB, &[(5, GIB)]))
                .unwrap();
        }
        assert_eq!(store.time_at_or_before(start - 1).unwrap(), None);
        assert_eq!(
            store.time_at_or_before(start + 1500).unwrap(),
            Some(start + 1000)
        );
        assert_eq!(
            store.time_at_or_before(start + 2000).unwrap(),
            Some(start + 2000)
        );
        assert_eq!(store.time_after(start + 2000).unwrap(), Some(start + 3000));
        assert_eq!(store.time_after(start + 299_000).unwrap(), None);
        assert_eq!(
            store.time_at_or_before(i64::MAX).unwrap(),
            Some(start + 299_000)
        );

        // Raw kept 2 minutes: the first three minutes become 1-minute buckets, and
        // stepping walks bucket starts, then the raw samples after them.
        let retention: Retention = "raw=2m,1m=forever".parse().unwrap();
        store.maintain(&retention, start + 300_000).unwrap();
        assert_eq!(store.time_after(i64::MIN).unwrap(), Some(start));
        assert_eq!(store.time_after(start).unwrap(), Some(start + 60_000));
        assert_eq!(
            store.time_at_or_before(start + 90_000).unwrap(),
            Some(start + 60_000)
        );
        let mut visited = Vec::new();
        store
            .scan(TimeRange::ALL, |f| visited.push(f.t_ms))
            .unwrap();
        // Every time the seeks give is a time the scan visits, and the other way round.
        let mut t = i64::MIN;
        let mut stepped = Vec::new();
        while let Some(next) = store.time_after(t).unwrap() {
            stepped.push(next);
            t = next;
        }
        assert_eq!(stepped, visited);
    }

    #[test]
    fn a_reused_pid_is_two_processes() {
        let mut store = Store::open_in_memory().unwrap();
        store.append(&tick(T0, GIB, &[(7, GIB)])).unwrap();
        store.append(&tick(T0 + 1000, 0, &[])).unwrap();
        let mut again = tick(T0 + 2000, GIB, &[(7, 2 * GIB)]);
        again.processes = vec![process(7, 5555)];
        store.append(&again).unwrap();
        let found = store.processes_with_pid(7).unwrap();
        let starts: Vec<Option<u64>> = found.iter().map(|p| p.meta.key.start_time_ticks).collect();
        assert_eq!(starts, [Some(1007), Some(5555)]);
        assert!(store.processes_with_pid(8).unwrap().is_empty());
    }
}
