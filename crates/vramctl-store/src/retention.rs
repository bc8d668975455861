//! Retention with downsampling: raw samples for a while, then min/max/last buckets.
//!
//! `raw=24h,1m=30d` keeps raw samples for 24 hours and one-minute buckets for 30 days. Each
//! tier is computed from the next finer one once its buckets are complete, in the same
//! writer, before anything finer is deleted — so a crash never loses both.

use std::str::FromStr;

use rusqlite::{OptionalExtension, params};

use crate::codec::{self, State};
use crate::db::Store;
use crate::error::StoreError;
use crate::model::TimeRange;

/// Receives each frame's time and its (series id, entry) pairs.
type FrameVisitor<'a> = dyn FnMut(i64, &mut dyn Iterator<Item = (u32, codec::Entry)>) + 'a;

/// Key frame every this many buckets in a rollup tier.
const ROLLUP_KEY_EVERY: i64 = 60;

/// How long each tier is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// Raw samples are kept this long (`None`: forever).
    pub raw_keep_ms: Option<i64>,
    /// `(bucket length, kept for)` per downsampled tier, finest first.
    pub tiers: Vec<(i64, Option<i64>)>,
}

impl Default for Retention {
    /// `raw=24h,1m=30d`.
    fn default() -> Self {
        Self {
            raw_keep_ms: Some(24 * HOUR),
            tiers: vec![(MINUTE, Some(30 * DAY))],
        }
    }
}

const SECOND: i64 = 1000;
const MINUTE: i64 = 60 * SECOND;
const HOUR: i64 = 60 * MINUTE;
const DAY: i64 = 24 * HOUR;

/// A duration of the spec (`24h`, `1m`, `30d`), by the one duration parser of vramctl.
fn parse_duration_ms(text: &str) -> Result<i64, String> {
    vramctl_core::duration::parse_ms(text).map_err(|e| e.to_string())
}

impl FromStr for Retention {
    type Err = StoreError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let bad = |why: String| StoreError::Retention {
            spec: spec.to_owned(),
            why,
        };
        let keep = |v: &str| -> Result<Option<i64>, StoreError> {
            if v == "forever" {
                Ok(None)
            } else {
                parse_duration_ms(v).map(Some).map_err(bad)
            }
        };
        let mut raw = None;
        let mut tiers = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("'{part}' is not NAME=DURATION, e.g. raw=24h")))?;
            if name.trim() == "raw" {
                raw = Some(keep(value.trim())?);
            } else {
                let res = parse_duration_ms(name).map_err(bad)?;
                if res < SECOND {
                    return Err(bad(format!("buckets of '{name}' are shorter than 1s")));
                }
                tiers.push((res, keep(value.trim())?));
            }
        }
        let raw_keep_ms = raw
            .ok_or_else(|| bad("it does not say how long to keep raw samples (raw=...)".into()))?;
        tiers.sort_by_key(|&(res, _)| res);
        let mut finer_keep = raw_keep_ms;
        let mut finer_res = 1;
        for &(res, keep) in &tiers {
            if res % finer_res != 0 {
                return Err(bad(format!(
                    "{res} ms buckets are not a multiple of the finer {finer_res} ms ones"
                )));
            }
            if finer_keep.is_some_and(|k| k < res) {
                return Err(bad(format!(
                    "the tier before the {} buckets must be kept at least that long",
                    human(res)
                )));
            }
            finer_keep = keep;
            finer_res = res;
        }
        Ok(Self { raw_keep_ms, tiers })
    }
}

fn human(ms: i64) -> String {
    for (unit, len) in [("d", DAY), ("h", HOUR), ("m", MINUTE), ("s", SECOND)] {
        if ms % len == 0 {
            return format!("{}{unit}", ms / len);
        }
    }
    format!("{ms}ms")
}

/// What one [`Store::maintain`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Maintenance {
    /// Downsampled buckets written.
    pub buckets_written: u64,
    /// Raw frames deleted.
    pub frames_deleted: u64,
    /// Downsampled buckets deleted.
    pub buckets_deleted: u64,
}

impl Store {
    /// Rolls complete buckets up into each tier, then deletes what `retention` no longer
    /// keeps, relative to `now_ms`. The recorder calls it about once a minute.
    ///
    /// # Errors
    /// When SQLite fails or a frame is damaged.
    pub fn maintain(
        &mut self,
        retention: &Retention,
        now_ms: i64,
    ) -> Result<Maintenance, StoreError> {
        let result = self.maintain_inner(retention, now_ms);
        if result.is_err() {
            // A failed rollup (a full disk) must not leave its transaction, and with it
            // the write lock, behind.
            self.end_failed_transaction();
        }
        result
    }

    fn maintain_inner(
        &mut self,
        retention: &Retention,
        now_ms: i64,
    ) -> Result<Maintenance, StoreError> {
        let mut report = Maintenance::default();
        let mut finer: Option<i64> = None;
        for &(res, _) in &retention.tiers {
            report.buckets_written += self.roll_up(finer, res, now_ms)?;
            finer = Some(res);
        }
        // Delete oldest first only what the next tier already covers.
        let mut tiers: Vec<(Option<i64>, Option<i64>)> = vec![(None, retention.raw_keep_ms)];
        tiers.extend(retention.tiers.iter().map(|&(r, k)| (Some(r), k)));
        for (i, &(res, keep)) in tiers.iter().enumerate() {
            let Some(keep) = keep else { continue };
            let mut cutoff = now_ms.saturating_sub(keep);
            if let Some(&(Some(coarser), _)) = tiers.get(i + 1) {
                cutoff = cutoff.min(self.done_until(coarser)?.unwrap_or(i64::MIN));
            }
            let deleted = self.delete_before(res, cutoff)?;
            match res {
                None => report.frames_deleted += deleted,
                Some(_) => report.buckets_deleted += deleted,
            }
        }
        if let Some((oldest, _)) = self.time_bounds()? {
            self.conn
                .execute("DELETE FROM gap WHERE open = 0 AND to_ms < ?1", [oldest])
                .map_err(self.err("cannot delete old gaps"))?;
        }
        if report.frames_deleted + report.buckets_deleted > 0 {
            self.conn
                .execute_batch("PRAGMA incremental_vacuum(2000)")
                .map_err(self.err("cannot return free pages"))?;
        }
        Ok(report)
    }

    fn done_until(&self, res: i64) -> Result<Option<i64>, StoreError> {
        self.conn
            .query_row(
                "SELECT done_until_ms FROM rollup_state WHERE res_ms = ?1",
                [res],
                |r| r.get(0),
            )
            .optional()
            .map_err(self.err("cannot read the rollup state"))
    }

    /// Computes the buckets of `res` that are complete by `now_ms` from tier `finer`
    /// (`None`: raw).
    fn roll_up(&mut self, finer: Option<i64>, res: i64, now_ms: i64) -> Result<u64, StoreError> {
        let source_start: Option<i64> = match finer {
            None => self
                .conn
                .query_row("SELECT min(t_ms) FROM frame", [], |r| r.get(0)),
            Some(f) => {
                self.conn
                    .query_row("SELECT min(t_ms) FROM rollup WHERE res_ms = ?1", [f], |r| {
                        r.get(0)
                    })
            }
        }
        .map_err(self.err("cannot read the rollup source"))?;
        let Some(source_start) = source_start else {
            return Ok(0);
        };
        let from = self
            .done_until(res)?
            .unwrap_or(source_start.div_euclid(res) * res);
        let until = now_ms.div_euclid(res) * res;
        if until <= from {
            return Ok(0);
        }
        // Merge every source frame into its bucket.
        let mut buckets: Vec<(i64, State)> = Vec::new();
        let mut collect = |t: i64, entries: &mut dyn Iterator<Item = (u32, codec::Entry)>| {
            let b = t.div_euclid(res) * res;
            if buckets.last().is_none_or(|(last, _)| *last != b) {
                buckets.push((b, State::default()));
            }
            if let Some((_, state)) = buckets.last_mut() {
                for (s, e) in entries {
                    let merged = state.get(s).map_or(e, |old| old.merge(e));
                    state.set(s, Some(merged));
                }
            }
        };
        let range = TimeRange {
            from_ms: from,
            to_ms: until - 1,
        };
        self.load_catalog()?;
        self.scan_raw_ids(finer, range, &mut collect)?;

        // Continue the tier's chain: its state after the last stored bucket.
        let (mut prev, mut last_key) = self.tier_tail(res)?;
        let mut buf = Vec::new();
        let tx = self
            .conn
            .unchecked_transaction()
            .map_err(self.err("cannot write rollups"))?;
        let mut written = 0;
        for (t, state) in &buckets {
            let key = last_key.is_none_or(|k| t - k >= ROLLUP_KEY_EVERY * res);
            codec::encode(&prev, state, key, &mut buf);
            tx.prepare_cached(
                "INSERT OR REPLACE INTO rollup (res_ms, t_ms, key, data) VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut s| s.execute(params![res, t, key, buf]))
            .map_err(self.err("cannot write rollups"))?;
            if key {
                last_key = Some(*t);
            }
            prev = state.clone();
            written += 1;
        }
        tx.execute(
            "INSERT INTO rollup_state (res_ms, done_until_ms) VALUES (?1, ?2) \
             ON CONFLICT (res_ms) DO UPDATE SET done_until_ms = excluded.done_until_ms",
            params![res, until],
        )
        .map_err(self.err("cannot write rollups"))?;
        tx.commit().map_err(self.err("cannot write rollups"))?;
        Ok(written)
    }

    /// Decodes tier `res` from its last key frame: the state after its newest bucket and
    /// that key frame's time.
    fn tier_tail(&self, res: i64) -> Result<(State, Option<i64>), StoreError> {
        let err = self.err("cannot read rollups");
        let key: Option<i64> = self
            .conn
            .query_row(
                "SELECT max(t_ms) FROM rollup WHERE res_ms = ?1 AND key = 1",
                [res],
                |r| r.get(0),
            )
            .map_err(&err)?;
        let mut state = State::default();
        let Some(key) = key else {
            return Ok((state, None));
        };
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT key, data FROM rollup WHERE res_ms = ?1 AND t_ms >= ?2 ORDER BY t_ms",
            )
            .map_err(&err)?;
        let mut rows = stmt.query(params![res, key]).map_err(&err)?;
        while let Some(row) = rows.next().map_err(&err)? {
            let is_key: bool = row.get(0).map_err(&err)?;
            let data: Vec<u8> = row.get(1).map_err(&err)?;
            codec::apply(&mut state, &data, is_key)?;
        }
        Ok((state, Some(key)))
    }

    /// Like [`Store::scan`] over one tier, handing out raw series ids.
    fn scan_raw_ids(
        &self,
        tier: Option<i64>,
        range: TimeRange,
        visit: &mut FrameVisitor<'_>,
    ) -> Result<(), StoreError> {
        let err = self.err("cannot read samples");
        let start: Option<i64> = match tier {
            None => self.conn.query_row(
                "SELECT max(t_ms) FROM frame WHERE key = 1 AND t_ms <= ?1",
                [range.from_ms],
                |r| r.get(0),
            ),
            Some(res) => self.conn.query_row(
                "SELECT max(t_ms) FROM rollup WHERE res_ms = ?2 AND key = 1 AND t_ms <= ?1",
                [range.from_ms, res],
                |r| r.get(0),
            ),
        }
        .map_err(&err)?;
        let start = start.unwrap_or(range.from_ms);
        let mut stmt = match tier {
            None => self.conn.prepare_cached(
                "SELECT t_ms, key, data FROM frame WHERE t_ms >= ?1 AND t_ms <= ?2 AND ?3 = 0 \
                 ORDER BY t_ms",
            ),
            Some(_) => self.conn.prepare_cached(
                "SELECT t_ms, key, data FROM rollup WHERE res_ms = ?3 AND t_ms >= ?1 AND t_ms <= ?2 \
                 ORDER BY t_ms",
            ),
        }
        .map_err(&err)?;
        let mut rows = stmt
            .query(params![start, range.to_ms, tier.unwrap_or(0)])
            .map_err(&err)?;
        let mut state = State::default();
        let mut keyed = false;
        while let Some(row) = rows.next().map_err(&err)? {
            let t: i64 = row.get(0).map_err(&err)?;
            let key: bool = row.get(1).map_err(&err)?;
            let data = row
                .get_ref(2)
                .map_err(&err)?
                .as_blob()
                .map_err(|e| StoreError::sqlite(&self.path, "cannot read samples", e.into()))?;
            if !key && !keyed {
                continue;
            }
            keyed = true;
            codec::apply(&mut state, data, key)?;
            if t >= range.from_ms {
                visit(t, &mut state.iter());
            }
        }
        Ok(())
    }

    /// Deletes frames of a tier older than `cutoff`, keeping the key frame the first kept
    /// frame decodes from.
    fn delete_before(&mut self, tier: Option<i64>, cutoff: i64) -> Result<u64, StoreError> {
        let err = self.err("cannot delete old samples");
        let key: Option<i64> = match tier {
            None => self.conn.query_row(
                "SELECT max(t_ms) FROM frame WHERE key = 1 AND t_ms <= ?1",
                [cutoff],
                |r| r.get(0),
            ),
            Some(res) => self.conn.query_row(
                "SELECT max(t_ms) FROM rollup WHERE res_ms = ?2 AND key = 1 AND t_ms <= ?1",
                [cutoff, res],
                |r| r.get(0),
            ),
        }
        .map_err(&err)?;
        let Some(key) = key else { return Ok(0) };
        let n = match tier {
            None => self
                .conn
                .execute("DELETE FROM frame WHERE t_ms < ?1", [key]),
            Some(res) => self.conn.execute(
                "DELETE FROM rollup WHERE res_ms = ?1 AND t_ms < ?2",
                [res, key],
            ),
        }
        .map_err(&err)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_takes_the_durations_every_flag_takes() {
        // The spec once had its own parser: no `1h30m`, no bare seconds.
        let r: Retention = "raw=1h30m,1m=30d".parse().unwrap();
        assert_eq!(r.raw_keep_ms, Some(90 * MINUTE));
        let r: Retention = "raw=86400,60=30d".parse().unwrap();
        assert_eq!(r, Retention::default());
        let err = "raw=ten m".parse::<Retention>().unwrap_err().to_string();
        assert!(err.contains("'ten m' is not a duration"), "{err}");
    }

    #[test]
    fn retention_specs() {
        let r: Retention = "raw=24h,1m=30d".parse().unwrap();
        assert_eq!(r, Retention::default());
        let r: Retention = "1h=forever, raw=2d, 1m=30d".parse().unwrap();
        assert_eq!(r.tiers, vec![(MINUTE, Some(30 * DAY)), (HOUR, None)]);
        let msg = |s: &str| s.parse::<Retention>().unwrap_err().to_string();
        assert!(msg("1m=30d").contains("raw="), "{}", msg("1m=30d"));
        assert!(
            msg("raw=30s,1m=1d").contains("at least"),
            "{}",
            msg("raw=30s,1m=1d")
        );
        assert!(msg("raw=1d,1m=30d,90s=40d").contains("multiple"));
        assert!(msg("raw").contains("NAME=DURATION"));
    }
}

#[cfg(test)]
mod maintenance_tests {
    use super::*;
    use crate::model::{Metric, Point};
    use crate::writer::tests::{GIB, T0, tick};

    #[test]
    fn downsampled_buckets_keep_the_spike_and_raw_is_pruned() {
        let mut store = Store::open_in_memory().unwrap();
        store.set_key_interval_ms(10_000);
        // 5 minutes at 1 s: 1 GiB, with one 9 GiB spike at 2:30.
        let start = T0 - T0.rem_euclid(MINUTE);
        for i in 0..300 {
            let used = if i == 150 { 9 * GIB } else { GIB };
            store
                .append(&tick(start + i * 1000, used, &[(5, used)]))
                .unwrap();
        }
        let retention: Retention = "raw=2m,1m=forever".parse().unwrap();
        let now = start + 300 * 1000;
        let report = store.maintain(&retention, now).unwrap();
        assert_eq!(report.buckets_written, 5);
        assert!(report.frames_deleted >= 170, "{report:?}");
        let d = store.devices().unwrap()[0].id;
        let pts = store
            .device_metric(d, Metric::UsedBytes, TimeRange::ALL)
            .unwrap();
        let buckets: Vec<&Point> = pts.iter().filter(|p| p.span_ms > 0).collect();
        assert!(!buckets.is_empty());
        let spike = buckets
            .iter()
            .find(|p| p.unix_ms == start + 2 * MINUTE)
            .expect("bucket 2");
        assert_eq!((spike.min, spike.max, spike.last), (GIB, 9 * GIB, GIB));
        // The recent part is still raw, and times never go backwards.
        assert!(pts.iter().any(|p| p.span_ms == 0));
        assert!(
            pts.windows(2).all(|w| w[0].unix_ms < w[1].unix_ms),
            "{pts:?}"
        );
        // Running again is idempotent.
        let again = store.maintain(&retention, now).unwrap();
        assert_eq!(again.buckets_written, 0);
        let procs = store.processes_in(TimeRange::ALL).unwrap();
        assert_eq!(procs.len(), 1);
    }
}
