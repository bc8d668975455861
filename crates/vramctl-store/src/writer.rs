//! Appending ticks: one transaction per tick, only what changed, gaps with their reasons.

use std::collections::{HashMap, HashSet};

use rusqlite::{Connection, OptionalExtension, params};

use crate::codec::{self, Entry, State};
use crate::db::{Catalog, OpenMode, SeriesKey, Store};
use crate::error::StoreError;
use crate::model::{
    DeviceMeta, DeviceSampleState, Gap, Metric, Observed, ProcessKey, ProcessList, ProcessMeta,
    SessionInfo, TickSample,
};
use crate::write_state::{GapKey, Writer};
pub use crate::write_state::{Unwritten, WRITE_FAILED};

/// How often a key frame (every value, not only the changes) is written by default. A
/// reader decodes at most this much before its range starts.
pub const DEFAULT_KEY_INTERVAL_MS: i64 = 60_000;

impl Store {
    /// Starts a session (a recorder run, an import): the next frame is a key frame, and
    /// gaps left open by a previous writer that died are closed where they were last seen.
    ///
    /// # Errors
    /// When the store was not opened for appending, or SQLite fails.
    pub fn begin_session(&mut self, info: &SessionInfo) -> Result<i64, StoreError> {
        if self.mode != OpenMode::Append {
            return Err(StoreError::Unwritable {
                path: self.path.clone(),
                detail: "opened without the writer lock (this is a bug in vramctl)".into(),
            });
        }
        let now = jiff::Timestamp::now().as_millisecond();
        let conn = &self.conn;
        let err = |e| StoreError::sqlite(&self.path, "cannot start a session", e);
        conn.execute("UPDATE gap SET open = 0 WHERE open = 1", [])
            .map_err(err)?;
        conn.execute(
            "INSERT INTO session (started_ms, source, host, boot_id, interval_ms, vramctl_version, \
             driver_version, cuda_version) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                now,
                info.source,
                info.host,
                info.boot_id,
                info.interval_ms,
                env!("CARGO_PKG_VERSION"),
                info.driver_version,
                info.cuda_version
            ],
        )
        .map_err(err)?;
        let session_id = conn.last_insert_rowid();
        let last_t_ms = last_frame_ms(conn).map_err(err)?;
        let key_interval_ms = self
            .writer
            .as_ref()
            .map_or(DEFAULT_KEY_INTERVAL_MS, |w| w.key_interval_ms);
        self.writer = Some(Writer {
            session_id,
            state: State::default(),
            last_t_ms,
            last_key_ms: None,
            key_interval_ms,
            processes: HashMap::new(),
            pids: HashMap::new(),
            open_gaps: HashMap::new(),
            buf: Vec::new(),
            rollups: HashMap::new(),
            pending_base: None,
        });
        Ok(session_id)
    }

    /// The session [`Store::begin_session`] started, if any.
    pub fn session_id(&self) -> Option<i64> {
        self.writer.as_ref().map(|w| w.session_id)
    }

    /// Sets how often a key frame is written (default [`DEFAULT_KEY_INTERVAL_MS`]).
    pub fn set_key_interval_ms(&mut self, ms: i64) {
        if let Some(w) = self.writer.as_mut() {
            w.key_interval_ms = ms.max(1);
        }
    }

    /// Time of the newest stored tick.
    ///
    /// # Errors
    /// When SQLite fails.
    pub fn last_sample_ms(&self) -> Result<Option<i64>, StoreError> {
        last_frame_ms(&self.conn).map_err(self.err("cannot read the last sample"))
    }

    /// Appends one tick in one transaction (`synchronous=NORMAL`: an application crash
    /// loses nothing committed; a power cut may lose the last moments).
    ///
    /// A failed write leaves no transaction open (it would hold the write lock and swallow
    /// the next ticks), is remembered as [`Unwritten`] and becomes a gap with the next tick
    /// written, and makes that tick a key frame (whatever the failure left behind, the
    /// frames after it decode on their own).
    ///
    /// # Errors
    /// [`StoreError::OutOfOrder`] when `tick` is not after the last stored tick;
    /// [`StoreError::DiskFull`] / [`StoreError::Unwritable`] when the write fails (nothing
    /// of this tick is kept, nothing earlier is lost, and a later call may succeed).
    pub fn append(&mut self, tick: &TickSample) -> Result<(), StoreError> {
        if self.writer.is_none() {
            self.begin_session(&SessionInfo {
                source: "api".into(),
                ..SessionInfo::default()
            })?;
        }
        let result = self.append_inner(tick);
        if let Err(err) = &result {
            self.end_failed_transaction();
            // Out of order: refused before anything was written, not a lost tick. Inside
            // an import the whole import fails and is undone.
            if !matches!(err, StoreError::OutOfOrder { .. }) && !self.import_tx {
                let t = tick.at_unix_ms;
                match &mut self.unwritten {
                    Some(u) => {
                        u.to_ms = u.to_ms.max(t);
                        u.ticks += 1;
                    }
                    None => {
                        self.unwritten = Some(Unwritten {
                            from_ms: t,
                            to_ms: t,
                            ticks: 1,
                            cause: match err {
                                StoreError::DiskFull { .. } => "disk full".to_owned(),
                                other => other.to_string(),
                            },
                        });
                    }
                }
            }
            if let Some(w) = self.writer.as_mut() {
                w.last_key_ms = None;
            }
            // The transaction rolled back: forget the process ids handed out inside it, and
            // only those. Forgetting every id split each process the next tick lists without
            // naming it (the recorder names a process when it is new and every 10 s) into a
            // second, bare row. A row that cannot be checked is forgotten too.
            if let Some(w) = self.writer.as_mut() {
                let conn = &self.conn;
                let exists = |id: &i64| {
                    conn.prepare_cached("SELECT 1 FROM process WHERE id = ?1")
                        .and_then(|mut q| q.exists([id]))
                        .unwrap_or(false)
                };
                w.processes.retain(|_, id| exists(id));
                w.pids.retain(|_, id| exists(id));
            }
            let _ = self.load_catalog();
        }
        result
    }

    fn append_inner(&mut self, tick: &TickSample) -> Result<(), StoreError> {
        let path = self.path.clone();
        let err = move |e| StoreError::sqlite(&path, "cannot write a sample", e);
        let Self {
            conn,
            catalog,
            writer,
            unwritten,
            ..
        } = self;
        let Some(w) = writer.as_mut() else {
            return Ok(());
        };
        let t = tick.at_unix_ms;
        if let Some(last) = w.last_t_ms.filter(|&last| t <= last) {
            return Err(StoreError::OutOfOrder {
                at_ms: t,
                last_ms: last,
            });
        }
        // A savepoint: its own transaction on its own, nested inside an import's.
        let tx = TickSavepoint::begin(conn).map_err(err.clone())?;
        let mut new = w.state.clone();
        let mut opens: Vec<(GapKey, String)> = Vec::new();
        let mut closes: Vec<GapKey> = Vec::new();

        if let Some(reason) = &tick.unavailable {
            new.clear();
            opens.push(((None, None), reason.clone()));
        } else {
            closes.push((None, None));
        }
        let mut pids_now: HashMap<u32, i64> = HashMap::new();
        let metas: HashMap<u32, &ProcessMeta> = tick
            .processes
            .iter()
            .map(|p| (p.meta.key.pid, &p.meta))
            .collect();
        for dev in &tick.devices {
            let d = ensure_device(&tx, catalog, &dev.device, t).map_err(err.clone())?;
            match &dev.state {
                DeviceSampleState::Unreadable(reason) => {
                    remove_where(&mut new, catalog, |k| k.device == Some(d));
                    opens.push(((Some(d), None), reason.clone()));
                }
                DeviceSampleState::Read { metrics, processes } => {
                    closes.push((Some(d), None));
                    for (metric, observed) in metrics {
                        let s = ensure_series(&tx, catalog, *metric, Some(d), None)
                            .map_err(err.clone())?;
                        let gap = (Some(d), Some(metric.code()));
                        match observed {
                            Observed::Value(v) => {
                                new.set(s, Some(Entry::Value(*v)));
                                closes.push(gap);
                            }
                            Observed::Missing(reason) => {
                                new.set(s, None);
                                opens.push((gap, reason.clone()));
                            }
                        }
                    }
                    let per_process = |k: &SeriesKey| {
                        k.device == Some(d)
                            && matches!(
                                k.metric,
                                Metric::ProcessUsedBytes
                                    | Metric::ProcessSmPercent
                                    | Metric::ProcessAllocatedBytes
                                    | Metric::ProcessReservedBytes
                            )
                    };
                    let gap = (Some(d), Some(Metric::ProcessUsedBytes.code()));
                    match processes {
                        ProcessList::NotObserved => {}
                        ProcessList::Missing(reason) => {
                            remove_where(&mut new, catalog, per_process);
                            opens.push((gap, reason.clone()));
                        }
                        ProcessList::Observed(list) => {
                            closes.push(gap);
                            let mut keep = HashSet::new();
                            for p in list {
                                let pid = match (metas.get(&p.pid), w.pids.get(&p.pid)) {
                                    (Some(meta), _) => {
                                        ensure_process(&tx, &mut w.processes, meta, t)
                                            .map_err(err.clone())?
                                    }
                                    (None, Some(&id)) => id,
                                    (None, None) => {
                                        let bare = ProcessMeta {
                                            key: ProcessKey {
                                                pid: p.pid,
                                                ..ProcessKey::default()
                                            },
                                            ..ProcessMeta::default()
                                        };
                                        ensure_process(&tx, &mut w.processes, &bare, t)
                                            .map_err(err.clone())?
                                    }
                                };
                                pids_now.insert(p.pid, pid);
                                let s = ensure_series(
                                    &tx,
                                    catalog,
                                    Metric::ProcessUsedBytes,
                                    Some(d),
                                    Some(pid),
                                )
                                .map_err(err.clone())?;
                                new.set(s, Some(p.used_bytes.map_or(Entry::Unknown, Entry::Value)));
                                keep.insert(s);
                                if let Some(sm) = p.sm_percent {
                                    let s = ensure_series(
                                        &tx,
                                        catalog,
                                        Metric::ProcessSmPercent,
                                        Some(d),
                                        Some(pid),
                                    )
                                    .map_err(err.clone())?;
                                    new.set(s, Some(Entry::Value(u64::from(sm))));
                                    keep.insert(s);
                                }
                                // The agent's figures: a series while it answers, none
                                // without one (never a 0 for "no agent").
                                let agent = p.agent.unwrap_or_default();
                                for (metric, bytes) in [
                                    (Metric::ProcessAllocatedBytes, agent.allocated_bytes),
                                    (Metric::ProcessReservedBytes, agent.reserved_bytes),
                                ] {
                                    let Some(bytes) = bytes else { continue };
                                    let s = ensure_series(&tx, catalog, metric, Some(d), Some(pid))
                                        .map_err(err.clone())?;
                                    new.set(s, Some(Entry::Value(bytes)));
                                    keep.insert(s);
                                }
                            }
                            remove_where(&mut new, catalog, |k| per_process(k))
                                .into_iter()
                                .filter(|(s, _)| keep.contains(s))
                                .for_each(|(s, e)| new.set(s, Some(e)));
                        }
                    }
                }
            }
        }
        for sample in &tick.processes {
            let Some(cpu) = sample.cpu_ticks else {
                continue;
            };
            let pid =
                ensure_process(&tx, &mut w.processes, &sample.meta, t).map_err(err.clone())?;
            pids_now.entry(sample.meta.key.pid).or_insert(pid);
            let s = ensure_series(&tx, catalog, Metric::ProcessCpuTicks, None, Some(pid))
                .map_err(err.clone())?;
            new.set(s, Some(Entry::Value(cpu)));
        }
        // A process's CPU time is kept only while it holds GPU memory somewhere.
        let on_gpu = processes_with(&new, catalog, Metric::ProcessUsedBytes);
        remove_where(&mut new, catalog, |k| {
            k.metric == Metric::ProcessCpuTicks && k.process.is_some_and(|p| !on_gpu.contains(&p))
        });

        let key = w
            .last_key_ms
            .is_none_or(|last| t.saturating_sub(last) >= w.key_interval_ms);
        let base = w.pending_base.take();
        codec::encode(base.as_ref().unwrap_or(&w.state), &new, key, &mut w.buf);
        let observed = observed_devices(tick, &new, catalog);
        tx.prepare_cached("INSERT INTO frame (t_ms, key, data, observed) VALUES (?1, ?2, ?3, ?4)")
            .and_then(|mut s| s.execute(params![t, key, w.buf, observed]))
            .map_err(err.clone())?;

        // Processes that left, and at key frames every present one: remember when last seen.
        let before = processes_with(&w.state, catalog, Metric::ProcessUsedBytes);
        let mut seen: Vec<i64> = before.difference(&on_gpu).copied().collect();
        if key {
            seen.extend(on_gpu.iter().copied());
        }
        for id in seen {
            tx.prepare_cached("UPDATE process SET last_seen_ms = ?1 WHERE id = ?2")
                .and_then(|mut s| s.execute(params![t, id]))
                .map_err(err.clone())?;
        }

        let mut open_gaps = w.open_gaps.clone();
        for (scope, reason) in &opens {
            match open_gaps.get(scope) {
                Some((_, same)) if same == reason => {}
                existing => {
                    if let Some((id, _)) = existing {
                        close_gap(&tx, *id, t).map_err(err.clone())?;
                    }
                    tx.prepare_cached(
                        "INSERT INTO gap (device_id, metric, from_ms, to_ms, open, reason) \
                         VALUES (?1, ?2, ?3, ?3, 1, ?4)",
                    )
                    .and_then(|mut s| s.execute(params![scope.0, scope.1, t, reason]))
                    .map_err(err.clone())?;
                    open_gaps.insert(*scope, (tx.last_insert_rowid(), reason.clone()));
                }
            }
        }
        for scope in &closes {
            if opens.iter().any(|(s, _)| s == scope) {
                continue;
            }
            if let Some((id, _)) = open_gaps.remove(scope) {
                close_gap(&tx, id, t).map_err(err.clone())?;
            }
        }
        // By id: `open` has no index, and `WHERE open = 1` scanned the whole gap table on
        // every tick while a gap stayed open (a field a GPU never reports keeps one open).
        for (id, _) in open_gaps.values() {
            tx.prepare_cached("UPDATE gap SET to_ms = ?1 WHERE id = ?2")
                .and_then(|mut s| s.execute(params![t, id]))
                .map_err(err.clone())?;
        }
        // The ticks lost before this one, stored with it or not at all.
        if let Some(lost) = unwritten.as_ref().and_then(|u| u.gap_before(t)) {
            insert_closed_gap(&tx, None, &lost).map_err(err.clone())?;
        }
        tx.commit().map_err(err)?;
        *unwritten = None;

        w.state = new;
        w.last_t_ms = Some(t);
        if key {
            w.last_key_ms = Some(t);
        }
        w.open_gaps = open_gaps;
        // Keep the PIDs still on a GPU (a device not observed this tick keeps its own).
        for (pid, id) in pids_now {
            w.pids.insert(pid, id);
        }
        w.pids.retain(|_, id| on_gpu.contains(id));
        Ok(())
    }

    /// Records a gap that is already over (ticks the recorder dropped or failed to write).
    ///
    /// # Errors
    /// When SQLite fails.
    pub fn record_gap(&mut self, gap: &Gap) -> Result<(), StoreError> {
        let device = gap
            .device_uuid
            .as_ref()
            .and_then(|u| self.catalog.device_ids.get(u).copied());
        let written =
            insert_closed_gap(&self.conn, device, gap).map_err(self.err("cannot write a gap"));
        if written.is_err() {
            self.end_failed_transaction();
        }
        written
    }

    /// The ticks [`Store::append`] could not write since the last one it wrote, if any.
    pub fn unwritten(&self) -> Option<&Unwritten> {
        self.unwritten.as_ref()
    }

    /// Records the [`Unwritten`] ticks as their gap now, without a tick after them (a
    /// recorder stopping while writes fail). `Ok(None)` when there are none.
    ///
    /// # Errors
    /// When the gap cannot be written either; the ticks stay [`Store::unwritten`].
    pub fn record_unwritten_gap(&mut self) -> Result<Option<Gap>, StoreError> {
        let Some(gap) = self.unwritten.as_ref().map(Unwritten::gap) else {
            return Ok(None);
        };
        self.record_gap(&gap)?;
        self.unwritten = None;
        Ok(Some(gap))
    }
}

/// Inserts a gap that is over (`device`: its row id, when it has one).
fn insert_closed_gap(conn: &Connection, device: Option<i64>, gap: &Gap) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO gap (device_id, metric, from_ms, to_ms, open, reason) \
         VALUES (?1, ?2, ?3, ?4, 0, ?5)",
    )?
    .execute(params![
        device,
        gap.metric.map(Metric::code),
        gap.from_ms,
        gap.to_ms,
        gap.reason
    ])?;
    Ok(())
}

/// `None` when the tick looked at every device (the usual case, free to store); else which
/// devices it observed, so an export writes rows only where the source had them.
fn observed_devices(tick: &TickSample, new: &State, catalog: &Catalog) -> Option<Vec<u8>> {
    if tick.unavailable.is_some() {
        return None;
    }
    let mut flags: Vec<(i64, bool, bool)> = Vec::with_capacity(tick.devices.len());
    for d in &tick.devices {
        let id = catalog.device_ids.get(&d.device.uuid).copied()?;
        let (m, p) = match &d.state {
            DeviceSampleState::Unreadable(_) => (true, true),
            DeviceSampleState::Read { metrics, processes } => (
                !metrics.is_empty(),
                !matches!(processes, ProcessList::NotObserved),
            ),
        };
        flags.push((id, m, p));
    }
    let all_full = flags.iter().all(|&(_, m, p)| m && p);
    let present: HashSet<i64> = new
        .iter()
        .filter_map(|(s, _)| catalog.series(s)?.device)
        .collect();
    if all_full && present.iter().all(|d| flags.iter().any(|f| f.0 == *d)) {
        return None;
    }
    let mut out = Vec::new();
    for (id, m, p) in flags {
        let id = u64::try_from(id).unwrap_or(0);
        codec::put_varint(&mut out, id << 2 | u64::from(m) << 1 | u64::from(p));
    }
    Some(out)
}

/// The lossless NDJSON import writes frames as they were exported.
impl Store {
    pub(crate) fn import_device(&mut self, meta: &DeviceMeta, t: i64) -> Result<i64, StoreError> {
        self.begin_import_batch()?;
        ensure_device(&self.conn, &mut self.catalog, meta, t).map_err(self.err("cannot import"))
    }

    pub(crate) fn import_process(
        &mut self,
        meta: &ProcessMeta,
        first_seen_ms: i64,
        last_seen_ms: i64,
    ) -> Result<i64, StoreError> {
        self.begin_import_batch()?;
        let Some(w) = self.writer.as_mut() else {
            return Err(StoreError::Unwritable {
                path: self.path.clone(),
                detail: "no session".into(),
            });
        };
        let id = ensure_process(&self.conn, &mut w.processes, meta, first_seen_ms)
            .map_err(|e| StoreError::sqlite(&self.path, "cannot import", e))?;
        self.conn
            .execute(
                "UPDATE process SET last_seen_ms = max(last_seen_ms, ?1) WHERE id = ?2",
                params![last_seen_ms, id],
            )
            .map_err(self.err("cannot import"))?;
        Ok(id)
    }

    pub(crate) fn import_series(
        &mut self,
        metric: Metric,
        device: Option<i64>,
        process: Option<i64>,
    ) -> Result<u32, StoreError> {
        self.begin_import_batch()?;
        ensure_series(&self.conn, &mut self.catalog, metric, device, process)
            .map_err(self.err("cannot import"))
    }

    fn begin_import_batch(&mut self) -> Result<(), StoreError> {
        if self.conn.is_autocommit() {
            self.conn
                .execute_batch("BEGIN")
                .map_err(self.err("cannot import"))?;
        }
        Ok(())
    }

    /// Abandons the open import transaction: nothing of the import stays.
    pub(crate) fn rollback_import(&mut self) {
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        self.import_tx = false;
        // Ids and states handed out inside it are void.
        self.writer = None;
        let _ = self.load_catalog();
    }

    /// Starts the one transaction an import runs in: all of its files are written, or
    /// none (a failure, a `kill -9`, a power cut leave the history as it was, and the same
    /// import can simply be run again).
    pub(crate) fn begin_import_transaction(&mut self) -> Result<(), StoreError> {
        if self.conn.is_autocommit() {
            self.conn
                .execute_batch("BEGIN IMMEDIATE")
                .map_err(self.err("cannot import"))?;
            self.import_tx = true;
        }
        Ok(())
    }

    /// Commits the transaction [`Store::begin_import_transaction`] started.
    ///
    /// A `COMMIT` that fails (a full disk) may leave the transaction open: it is rolled
    /// back, and nothing of the import stays.
    pub(crate) fn commit_import_transaction(&mut self) -> Result<(), StoreError> {
        self.import_tx = false;
        self.commit_open_transaction()
    }

    /// Commits the open NDJSON import batch, unless it runs inside an import transaction.
    pub(crate) fn flush_import(&mut self) -> Result<(), StoreError> {
        if self.import_tx {
            return Ok(());
        }
        self.commit_open_transaction()
    }

    fn commit_open_transaction(&mut self) -> Result<(), StoreError> {
        if self.conn.is_autocommit() {
            return Ok(());
        }
        let committed = self
            .conn
            .execute_batch("COMMIT")
            .map_err(self.err("cannot import"));
        if committed.is_err() {
            self.end_failed_transaction();
        }
        committed
    }

    /// Writes a frame whose full state is known (raw when `span_ms == 0`, else a bucket).
    pub(crate) fn put_frame(
        &mut self,
        t: i64,
        span_ms: i64,
        state: &State,
        observed: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        self.begin_import_batch()?;
        let path = self.path.clone();
        let err = move |e| StoreError::sqlite(&path, "cannot import", e);
        let Some(w) = self.writer.as_mut() else {
            return Ok(());
        };
        if span_ms == 0 {
            if let Some(last) = w.last_t_ms.filter(|&l| t <= l) {
                return Err(StoreError::OutOfOrder {
                    at_ms: t,
                    last_ms: last,
                });
            }
            let key = w
                .last_key_ms
                .is_none_or(|last| t.saturating_sub(last) >= w.key_interval_ms);
            codec::encode(&w.state, state, key, &mut w.buf);
            self.conn
                .prepare_cached(
                    "INSERT INTO frame (t_ms, key, data, observed) VALUES (?1, ?2, ?3, ?4)",
                )
                .and_then(|mut s| s.execute(params![t, key, w.buf, observed]))
                .map_err(err)?;
            w.state.clone_from(state);
            w.last_t_ms = Some(t);
            if key {
                w.last_key_ms = Some(t);
            }
        } else {
            let (prev, last_key) = w.rollups.entry(span_ms).or_default();
            let key = last_key.is_none_or(|k| t - k >= 60 * span_ms);
            codec::encode(prev, state, key, &mut w.buf);
            self.conn
                .prepare_cached(
                    "INSERT OR REPLACE INTO rollup (res_ms, t_ms, key, data) VALUES (?1, ?2, ?3, ?4)",
                )
                .and_then(|mut s| s.execute(params![span_ms, t, key, w.buf]))
                .map_err(err.clone())?;
            self.conn
                .prepare_cached(
                    "INSERT INTO rollup_state (res_ms, done_until_ms) VALUES (?1, ?2) \
                     ON CONFLICT (res_ms) DO UPDATE SET \
                     done_until_ms = max(done_until_ms, excluded.done_until_ms)",
                )
                .and_then(|mut s| s.execute(params![span_ms, t + span_ms]))
                .map_err(err)?;
            prev.clone_from(state);
            if key {
                *last_key = Some(t);
            }
        }
        Ok(())
    }
}

/// Why imported ticks cannot be merged into the history's last samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TailConflict(pub String);

impl Store {
    /// Appends `ticks` (in time order) where the first is not after the history's last
    /// sample: the other half of one run's logs, imported by a second `import` (the GPU
    /// log, then the apps log). The stored frames from the first new time on are decoded,
    /// replayed together with the new ticks in time order, and written again; the result is
    /// what one import of both logs gives. Only data of another kind is merged: a device
    /// whose memory readings (or process list) the history already has in that span, from
    /// the same log imported twice or a recording, is a conflict and nothing is changed.
    /// Runs inside the import's transaction.
    ///
    /// # Errors
    /// `Ok(Err(conflict))` when the data overlaps; a store failure.
    pub(crate) fn import_over_tail(
        &mut self,
        ticks: &[TickSample],
        info: &SessionInfo,
    ) -> Result<Result<u64, TailConflict>, StoreError> {
        let Some(first) = ticks.first().map(|t| t.at_unix_ms) else {
            return Ok(Ok(0));
        };
        let downsampled: bool = self
            .conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM rollup WHERE t_ms + res_ms > ?1)",
                [first],
                |r| r.get(0),
            )
            .map_err(self.err("cannot import"))?;
        if downsampled {
            return Ok(Err(TailConflict(
                "the history is downsampled there (retention), so it cannot be merged".into(),
            )));
        }
        // What the stored frames from `first` on observed, per device: only the flags are
        // kept, so this pass needs no memory per frame.
        let mut have: HashMap<i64, (bool, bool)> = HashMap::new();
        self.scan(
            crate::model::TimeRange {
                from_ms: first,
                to_ms: i64::MAX,
            },
            |f| {
                if f.span_ms != 0 {
                    return;
                }
                match f.observed_raw() {
                    // A frame that observed everything (a recording): every device in it.
                    None => {
                        for (id, _) in f.entries() {
                            if let Some(d) = f.series(id).and_then(|s| s.device_id) {
                                have.insert(d, (true, true));
                            }
                        }
                    }
                    Some(raw) => {
                        for (d, m, p) in decode_observed(raw) {
                            let e = have.entry(d).or_default();
                            e.0 |= m;
                            e.1 |= p;
                        }
                    }
                }
            },
        )?;
        if let Some(conflict) = self.tail_conflict(&have, ticks) {
            return Ok(Err(conflict));
        }
        let before: Option<i64> = self
            .conn
            .query_row(
                "SELECT max(t_ms) FROM frame WHERE t_ms < ?1",
                [first],
                |r| r.get(0),
            )
            .map_err(self.err("cannot import"))?;
        let mut base = State::default();
        if let Some(t) = before {
            self.scan(
                crate::model::TimeRange {
                    from_ms: t,
                    to_ms: t,
                },
                |f| {
                    if f.span_ms == 0 {
                        base = f.state().clone();
                    }
                },
            )?;
        }
        // The stored frames move to a temporary table, are decoded from it in order (from
        // `base`, the state they were encoded against) and written again among the new
        // ticks: memory stays bounded whatever the length of the overlap.
        self.conn
            .execute_batch(
                "CREATE TEMP TABLE IF NOT EXISTS import_tail \
                 (t_ms INTEGER PRIMARY KEY, key INTEGER NOT NULL, data BLOB NOT NULL, observed BLOB);
                 DELETE FROM temp.import_tail;",
            )
            .map_err(self.err("cannot import"))?;
        self.conn
            .execute(
                "INSERT INTO temp.import_tail SELECT t_ms, key, data, observed FROM frame \
                 WHERE t_ms >= ?1",
                [first],
            )
            .map_err(self.err("cannot import"))?;
        self.conn
            .execute("DELETE FROM frame WHERE t_ms >= ?1", [first])
            .map_err(self.err("cannot import"))?;
        self.begin_session(info)?;
        if let Some(w) = self.writer.as_mut() {
            w.state = base.clone();
        }
        // Series that existed before this import: the stored frames govern those (as far as
        // they observed them); the new ticks' series are new ids.
        let old_series = self.catalog.series.len();
        let mut tail = TailReader {
            state: base,
            after_ms: i64::MIN,
            batch: std::collections::VecDeque::new(),
            done: false,
        };
        let mut written = 0u64;
        for tick in ticks {
            while let Some((t, state, observed)) = tail.next_if(self, |t| t < tick.at_unix_ms)? {
                let merged = self.replay_stored(&state, observed.as_deref(), old_series);
                let observed = self.observed_with_new_devices(&state, observed, &merged);
                self.put_frame(t, 0, &merged, observed.as_deref())?;
                written += 1;
            }
            if let Some((t, state, observed)) = tail.next_if(self, |t| t == tick.at_unix_ms)? {
                // Same instant in both (two nvidia-smi loops that logged the same
                // millisecond): the stored values first, then the tick's, in one frame that
                // observed what either did.
                let merged = self.replay_stored(&state, observed.as_deref(), old_series);
                if let Some(w) = self.writer.as_mut() {
                    w.pending_base = Some(std::mem::replace(&mut w.state, merged));
                }
                self.append(tick)?;
                self.union_observed(t, &state, observed.as_deref())?;
            } else {
                self.append(tick)?;
            }
            written += 1;
        }
        while let Some((t, state, observed)) = tail.next_if(self, |_| true)? {
            let merged = self.replay_stored(&state, observed.as_deref(), old_series);
            let observed = self.observed_with_new_devices(&state, observed, &merged);
            self.put_frame(t, 0, &merged, observed.as_deref())?;
            written += 1;
        }
        self.conn
            .execute_batch("DELETE FROM temp.import_tail;")
            .map_err(self.err("cannot import"))?;
        Ok(Ok(written))
    }

    /// A device (by id) whose memory readings or process list both the stored frames and
    /// the new ticks have.
    fn tail_conflict(
        &self,
        have: &HashMap<i64, (bool, bool)>,
        ticks: &[TickSample],
    ) -> Option<TailConflict> {
        for tick in ticks {
            for dev in &tick.devices {
                let Some(id) = self.catalog.device_ids.get(&dev.device.uuid) else {
                    continue;
                };
                let (m, p) = have.get(id).copied().unwrap_or_default();
                let (new_m, new_p) = match &dev.state {
                    DeviceSampleState::Unreadable(_) => (true, true),
                    DeviceSampleState::Read { metrics, processes } => (
                        !metrics.is_empty(),
                        !matches!(processes, ProcessList::NotObserved),
                    ),
                };
                let what = if m && new_m {
                    "memory readings"
                } else if p && new_p {
                    "process lists"
                } else {
                    continue;
                };
                return Some(TailConflict(format!(
                    "the history already has {what} of {} from then on",
                    dev.device.uuid
                )));
            }
        }
        None
    }

    /// The writer's state with a stored frame's observations applied: the series it
    /// observed take its values; the rest (the new ticks' series) carry on.
    fn replay_stored(&self, frame: &State, observed: Option<&[u8]>, old_series: usize) -> State {
        let flags: Option<HashMap<i64, (bool, bool)>> =
            observed.map(|raw| decode_observed(raw).map(|(d, m, p)| (d, (m, p))).collect());
        let mut merged = self
            .writer
            .as_ref()
            .map(|w| w.state.clone())
            .unwrap_or_default();
        for id in 1..old_series {
            let Ok(id) = u32::try_from(id) else { break };
            let Some(key) = self.catalog.series(id) else {
                continue;
            };
            let governed = match (key.device, &flags) {
                (None, _) | (Some(_), None) => true,
                (Some(d), Some(flags)) => {
                    let (m, p) = flags.get(&d).copied().unwrap_or_default();
                    if matches!(
                        key.metric,
                        Metric::ProcessUsedBytes | Metric::ProcessSmPercent
                    ) {
                        p
                    } else {
                        m
                    }
                }
            };
            if governed {
                merged.set(id, frame.get(id));
            }
        }
        merged
    }

    /// Widens the `observed` list of the frame just written at `t` by what the stored frame
    /// of the same instant (`stored`, observing `stored_observed`) observed.
    fn union_observed(
        &mut self,
        t: i64,
        stored: &State,
        stored_observed: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let written: Option<Vec<u8>> = self
            .conn
            .query_row("SELECT observed FROM frame WHERE t_ms = ?1", [t], |r| {
                r.get(0)
            })
            .map_err(self.err("cannot import"))?;
        let Some(state) = self.writer.as_ref().map(|w| w.state.clone()) else {
            return Ok(());
        };
        let devices_of = |state: &State| -> Vec<i64> {
            let mut ids: Vec<i64> = state
                .iter()
                .filter_map(|(s, _)| self.catalog.series(s)?.device)
                .collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        let flags_of = |raw: Option<&[u8]>, state: &State| -> HashMap<i64, (bool, bool)> {
            match raw {
                Some(raw) => decode_observed(raw).map(|(d, m, p)| (d, (m, p))).collect(),
                None => devices_of(state)
                    .into_iter()
                    .map(|d| (d, (true, true)))
                    .collect(),
            }
        };
        let mut union = flags_of(written.as_deref(), &state);
        for (d, (m, p)) in flags_of(stored_observed, stored) {
            let e = union.entry(d).or_default();
            e.0 |= m;
            e.1 |= p;
        }
        let present = devices_of(&state);
        let all = present
            .iter()
            .all(|d| union.get(d).is_some_and(|&(m, p)| m && p));
        let observed = if all {
            None
        } else {
            let mut ids: Vec<(&i64, &(bool, bool))> = union.iter().collect();
            ids.sort_unstable();
            let mut out = Vec::new();
            for (id, &(m, p)) in ids {
                let id = u64::try_from(*id).unwrap_or(0);
                codec::put_varint(&mut out, id << 2 | u64::from(m) << 1 | u64::from(p));
            }
            Some(out)
        };
        self.conn
            .execute(
                "UPDATE frame SET observed = ?1 WHERE t_ms = ?2",
                params![observed, t],
            )
            .map_err(self.err("cannot import"))?;
        Ok(())
    }

    /// A stored frame that observed every device observed only those it held once new
    /// devices' series are in the state too.
    fn observed_with_new_devices(
        &self,
        frame: &State,
        observed: Option<Vec<u8>>,
        merged: &State,
    ) -> Option<Vec<u8>> {
        if observed.is_some() {
            return observed;
        }
        let devices_of = |state: &State| -> HashSet<i64> {
            state
                .iter()
                .filter_map(|(s, _)| self.catalog.series(s)?.device)
                .collect()
        };
        let stored = devices_of(frame);
        if devices_of(merged).is_subset(&stored) {
            return None;
        }
        let mut out = Vec::new();
        let mut ids: Vec<i64> = stored.into_iter().collect();
        ids.sort_unstable();
        for id in ids {
            codec::put_varint(&mut out, u64::try_from(id).unwrap_or(0) << 2 | 0b11);
        }
        Some(out)
    }
}

/// The stored frames of [`Store::import_over_tail`], decoded in order from its temporary
/// table, a batch at a time.
struct TailReader {
    state: State,
    after_ms: i64,
    /// (time, key frame, data, observed) as stored.
    batch: std::collections::VecDeque<RawFrame>,
    done: bool,
}

/// A frame row as stored: time, key frame, data, observed list.
type RawFrame = (i64, bool, Vec<u8>, Option<Vec<u8>>);

/// A decoded stored frame: time, full state, observed list.
type StoredFrame = (i64, State, Option<Vec<u8>>);

/// Frames read from the temporary table at a time.
const TAIL_BATCH: i64 = 1024;

impl TailReader {
    /// The next stored frame (time, full state, observed list) if its time passes `take`.
    fn next_if(
        &mut self,
        store: &Store,
        take: impl Fn(i64) -> bool,
    ) -> Result<Option<StoredFrame>, StoreError> {
        if self.batch.is_empty() && !self.done {
            let mut stmt = store
                .conn
                .prepare_cached(
                    "SELECT t_ms, key, data, observed FROM temp.import_tail WHERE t_ms > ?1 \
                     ORDER BY t_ms LIMIT ?2",
                )
                .map_err(store.err("cannot import"))?;
            let rows = stmt
                .query_map(params![self.after_ms, TAIL_BATCH], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })
                .map_err(store.err("cannot import"))?;
            for row in rows {
                self.batch
                    .push_back(row.map_err(store.err("cannot import"))?);
            }
            self.done = self.batch.is_empty();
        }
        match self.batch.front() {
            Some(&(t, ..)) if take(t) => {}
            _ => return Ok(None),
        }
        let Some((t, key, data, observed)) = self.batch.pop_front() else {
            return Ok(None);
        };
        self.after_ms = t;
        codec::apply(&mut self.state, &data, key)?;
        Ok(Some((t, self.state.clone(), observed)))
    }
}

/// `(device id, metrics observed, processes observed)` of a frame's `observed` column.
fn decode_observed(raw: &[u8]) -> impl Iterator<Item = (i64, bool, bool)> + '_ {
    let mut pos = 0;
    std::iter::from_fn(move || {
        if pos >= raw.len() {
            return None;
        }
        let v = codec::get_varint(raw, &mut pos).ok()?;
        Some((i64::try_from(v >> 2).ok()?, v & 2 != 0, v & 1 != 0))
    })
}

/// One tick's writes: `SAVEPOINT` begins a transaction when none is open and nests inside
/// an import's; dropped without a successful [`TickSavepoint::commit`] (an error), it
/// undoes the tick.
struct TickSavepoint<'c> {
    conn: &'c Connection,
    done: bool,
    /// The savepoint began the transaction (no import's was open): its `RELEASE` is the
    /// `COMMIT`, and undoing it must end the transaction.
    outermost: bool,
}

impl<'c> TickSavepoint<'c> {
    fn begin(conn: &'c Connection) -> rusqlite::Result<Self> {
        let outermost = conn.is_autocommit();
        conn.execute_batch("SAVEPOINT tick")?;
        Ok(Self {
            conn,
            done: false,
            outermost,
        })
    }

    /// Commits (outermost) or folds the tick into the enclosing transaction. On failure
    /// the tick is undone when dropped: a `COMMIT` that fails (a full disk while the WAL
    /// is written) may leave the transaction open, and the next tick's savepoint would
    /// then nest inside it and never be committed.
    fn commit(mut self) -> rusqlite::Result<()> {
        self.conn.execute_batch("RELEASE tick")?;
        self.done = true;
        Ok(())
    }
}

impl std::ops::Deref for TickSavepoint<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for TickSavepoint<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.outermost {
            // SQLite may already have rolled the transaction back (some `SQLITE_FULL`
            // failures do); if not, end it, whatever state the failure left it in.
            if !self.conn.is_autocommit() {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
        } else {
            // Inside an import's transaction: undo this tick only (the import fails and
            // rolls back as a whole). The savepoint may be gone with a transaction SQLite
            // rolled back already: then there is nothing to undo.
            let _ = self.conn.execute_batch("ROLLBACK TO tick; RELEASE tick");
        }
    }
}

fn last_frame_ms(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    conn.query_row("SELECT max(t_ms) FROM frame", [], |r| r.get(0))
        .optional()
        .map(Option::flatten)
}

fn close_gap(conn: &Connection, id: i64, t: i64) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE gap SET open = 0, to_ms = ?1 WHERE id = ?2")?
        .execute(params![t, id])
        .map(|_| ())
}

/// Removes the series matching `pred` from `state`, returning what was removed.
fn remove_where(
    state: &mut State,
    catalog: &Catalog,
    pred: impl Fn(&SeriesKey) -> bool,
) -> Vec<(u32, Entry)> {
    let doomed: Vec<(u32, Entry)> = state
        .iter()
        .filter(|(s, _)| catalog.series(*s).is_some_and(|k| pred(&k)))
        .collect();
    for (s, _) in &doomed {
        state.set(*s, None);
    }
    doomed
}

fn processes_with(state: &State, catalog: &Catalog, metric: Metric) -> HashSet<i64> {
    state
        .iter()
        .filter_map(|(s, _)| catalog.series(s))
        .filter(|k| k.metric == metric)
        .filter_map(|k| k.process)
        .collect()
}

fn ensure_device(
    conn: &Connection,
    catalog: &mut Catalog,
    meta: &DeviceMeta,
    t: i64,
) -> rusqlite::Result<i64> {
    if let Some(&id) = catalog.device_ids.get(&meta.uuid) {
        if catalog.devices.get(&id) != Some(meta) {
            // An index or name learned later (or changed across a reboot): keep the newest,
            // but never forget a fact for one this tick does not know.
            let mut merged = catalog.devices.get(&id).cloned().unwrap_or_default();
            merged.index = meta.index.or(merged.index);
            merged.name = meta.name.clone().or(merged.name);
            merged.pci_bus_id = meta.pci_bus_id.clone().or(merged.pci_bus_id);
            merged.parent_uuid = meta.parent_uuid.clone().or(merged.parent_uuid);
            merged.uuid.clone_from(&meta.uuid);
            conn.prepare_cached(
                "UPDATE device SET idx = ?1, name = ?2, pci_bus_id = ?3, parent_uuid = ?4 \
                 WHERE id = ?5",
            )?
            .execute(params![
                merged.index,
                merged.name,
                merged.pci_bus_id,
                merged.parent_uuid,
                id
            ])?;
            catalog.devices.insert(id, merged);
        }
        return Ok(id);
    }
    conn.prepare_cached(
        "INSERT INTO device (uuid, idx, name, pci_bus_id, parent_uuid, first_seen_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        meta.uuid,
        meta.index,
        meta.name,
        meta.pci_bus_id,
        meta.parent_uuid,
        t
    ])?;
    let id = conn.last_insert_rowid();
    catalog.device_ids.insert(meta.uuid.clone(), id);
    catalog.devices.insert(id, meta.clone());
    Ok(id)
}

fn ensure_series(
    conn: &Connection,
    catalog: &mut Catalog,
    metric: Metric,
    device: Option<i64>,
    process: Option<i64>,
) -> rusqlite::Result<u32> {
    let key = SeriesKey {
        metric,
        device,
        process,
    };
    if let Some(&id) = catalog.series_ids.get(&key) {
        return Ok(id);
    }
    conn.prepare_cached("INSERT INTO series (metric, device_id, process_id) VALUES (?1, ?2, ?3)")?
        .execute(params![metric.code(), device, process])?;
    let id = u32::try_from(conn.last_insert_rowid())
        .map_err(|_| rusqlite::Error::IntegralValueOutOfRange(0, conn.last_insert_rowid()))?;
    let slot = usize::try_from(id).unwrap_or(usize::MAX);
    if catalog.series.len() <= slot {
        catalog.series.resize(slot + 1, None);
    }
    catalog.series[slot] = Some(key);
    catalog.series_ids.insert(key, id);
    Ok(id)
}

fn ensure_process(
    conn: &Connection,
    known: &mut HashMap<ProcessKey, i64>,
    meta: &ProcessMeta,
    t: i64,
) -> rusqlite::Result<i64> {
    if let Some(&id) = known.get(&meta.key) {
        return Ok(id);
    }
    let key = &meta.key;
    // Across sessions only a full identity names the same process; a bare PID (an import,
    // a process outside our PID namespace) starts a new row in each session.
    let existing = if key.boot_id.is_some() && key.start_time_ticks.is_some() {
        conn.prepare_cached(
            "SELECT id FROM process WHERE pid = ?1 AND boot_id = ?2 AND start_time_ticks = ?3",
        )?
        .query_row(
            params![key.pid, key.boot_id, key.start_time_ticks.map(to_i64)],
            |r| r.get(0),
        )
        .optional()?
    } else {
        None
    };
    let id = match existing {
        Some(id) => id,
        None => {
            conn.prepare_cached(
                "INSERT INTO process (boot_id, pid, start_time_ticks, uid, user, command, \
                 container_id, pod_uid, first_seen_ms, last_seen_ms, slurm_job_id) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10)",
            )?
            .execute(params![
                key.boot_id,
                key.pid,
                key.start_time_ticks.map(to_i64),
                meta.uid,
                meta.user,
                meta.command,
                meta.container_id,
                meta.pod_uid,
                t,
                meta.slurm_job_id
            ])?;
            conn.last_insert_rowid()
        }
    };
    known.insert(key.clone(), id);
    Ok(id)
}

pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{DeviceSample, ProcessOnDevice, ProcessSample, TimeRange};

    pub const T0: i64 = 1_764_441_091_000;
    pub const GIB: u64 = 1 << 30;

    pub fn gpu(uuid: &str, index: u32) -> DeviceMeta {
        DeviceMeta {
            uuid: uuid.into(),
            index: Some(index),
            name: Some("NVIDIA H200".into()),
            pci_bus_id: None,
            parent_uuid: None,
        }
    }

    pub fn process(pid: u32, start: u64) -> ProcessSample {
        ProcessSample {
            meta: ProcessMeta {
                key: ProcessKey {
                    boot_id: Some("b0".into()),
                    pid,
                    start_time_ticks: Some(start),
                },
                user: Some("alice".into()),
                command: Some(format!("python job{pid}.py")),
                ..ProcessMeta::default()
            },
            cpu_ticks: None,
        }
    }

    /// One GPU with `used` bytes and the processes `(pid, bytes)`.
    pub fn tick(t: i64, used: u64, procs: &[(u32, u64)]) -> TickSample {
        TickSample {
            at_unix_ms: t,
            unavailable: None,
            devices: vec![DeviceSample {
                device: gpu("GPU-a", 0),
                state: DeviceSampleState::Read {
                    metrics: vec![
                        (Metric::UsedBytes, Observed::Value(used)),
                        (Metric::TotalBytes, Observed::Value(141 * GIB)),
                        (Metric::PowerMw, Observed::Missing("not supported".into())),
                    ],
                    processes: ProcessList::Observed(
                        procs
                            .iter()
                            .map(|&(pid, b)| ProcessOnDevice {
                                pid,
                                used_bytes: Some(b),
                                sm_percent: None,
                                agent: None,
                            })
                            .collect(),
                    ),
                },
            }],
            processes: procs
                .iter()
                .map(|&(pid, _)| process(pid, 1000 + u64::from(pid)))
                .collect(),
        }
    }

    fn values(points: &[crate::model::Point]) -> Vec<(i64, u64)> {
        points.iter().map(|p| (p.unix_ms - T0, p.last)).collect()
    }

    #[test]
    fn round_trip_dense_points_from_change_only_frames() {
        let mut store = Store::open_in_memory().unwrap();
        store.begin_session(&SessionInfo::default()).unwrap();
        store.set_key_interval_ms(3000);
        let used = [1, 1, 2, 2, 2, 3, 3];
        for (i, u) in used.iter().enumerate() {
            let t = T0 + 1000 * i as i64;
            let procs: Vec<(u32, u64)> = if i < 5 { vec![(10, u * GIB)] } else { vec![] };
            store.append(&tick(t, u * GIB, &procs)).unwrap();
        }
        let devices = store.devices().unwrap();
        assert_eq!(devices.len(), 1);
        let d = devices[0].id;
        let all = TimeRange::ALL;
        let pts = store.device_metric(d, Metric::UsedBytes, all).unwrap();
        assert_eq!(
            values(&pts),
            used.iter()
                .enumerate()
                .map(|(i, u)| (1000 * i as i64, u * GIB))
                .collect::<Vec<_>>()
        );
        // A range starting between key frames decodes from the key frame before it.
        let mid = TimeRange {
            from_ms: T0 + 4000,
            to_ms: T0 + 5000,
        };
        assert_eq!(
            values(&store.device_metric(d, Metric::UsedBytes, mid).unwrap()),
            vec![(4000, 2 * GIB), (5000, 3 * GIB)]
        );
        let procs = store.processes_in(all).unwrap();
        assert_eq!(procs.len(), 1);
        assert_eq!(procs[0].0.meta.key.pid, 10);
        assert_eq!(procs[0].0.meta.user.as_deref(), Some("alice"));
        assert_eq!(
            procs[0].0.last_seen_ms,
            T0 + 5000,
            "left at the tick it vanished"
        );
        let mem = store.process_memory(procs[0].0.id, d, all).unwrap();
        assert_eq!(
            values(&mem),
            vec![
                (0, GIB),
                (1000, GIB),
                (2000, 2 * GIB),
                (3000, 2 * GIB),
                (4000, 2 * GIB)
            ]
        );
        assert!(
            store
                .processes_in(TimeRange {
                    from_ms: T0 + 5000,
                    to_ms: T0 + 9000
                })
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn missing_values_are_gaps_not_zeros() {
        let mut store = Store::open_in_memory().unwrap();
        for i in 0..3 {
            store.append(&tick(T0 + i * 1000, GIB, &[])).unwrap();
        }
        let d = store.devices().unwrap()[0].id;
        assert!(
            store
                .device_metric(d, Metric::PowerMw, TimeRange::ALL)
                .unwrap()
                .is_empty()
        );
        let gaps = store.gaps(TimeRange::ALL).unwrap();
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        assert_eq!(gaps[0].metric, Some(Metric::PowerMw));
        assert_eq!(gaps[0].reason, "not supported");
        assert_eq!(
            (gaps[0].from_ms, gaps[0].to_ms, gaps[0].open),
            (T0, T0 + 2000, true)
        );
    }

    #[test]
    fn a_lost_device_stops_its_series_and_opens_a_gap_until_it_returns() {
        let mut store = Store::open_in_memory().unwrap();
        store.append(&tick(T0, GIB, &[(10, GIB)])).unwrap();
        let mut lost = tick(T0 + 1000, 0, &[]);
        lost.devices[0].state = DeviceSampleState::Unreadable("GPU lost".into());
        store.append(&lost).unwrap();
        let mut lost2 = lost.clone();
        lost2.at_unix_ms = T0 + 2000;
        store.append(&lost2).unwrap();
        store.append(&tick(T0 + 3000, 2 * GIB, &[])).unwrap();
        let d = store.devices().unwrap()[0].id;
        let pts = store
            .device_metric(d, Metric::UsedBytes, TimeRange::ALL)
            .unwrap();
        assert_eq!(values(&pts), vec![(0, GIB), (3000, 2 * GIB)]);
        let gaps: Vec<_> = store
            .gaps(TimeRange::ALL)
            .unwrap()
            .into_iter()
            .filter(|g| g.metric.is_none())
            .collect();
        assert_eq!(gaps.len(), 1);
        assert_eq!(gaps[0].reason, "GPU lost");
        assert_eq!(
            (gaps[0].from_ms, gaps[0].to_ms, gaps[0].open),
            (T0 + 1000, T0 + 3000, false)
        );
        assert_eq!(gaps[0].device_uuid.as_deref(), Some("GPU-a"));
    }

    #[test]
    fn nvml_down_is_one_gap_for_everything() {
        let mut store = Store::open_in_memory().unwrap();
        store.append(&tick(T0, GIB, &[])).unwrap();
        store
            .append(&TickSample {
                at_unix_ms: T0 + 1000,
                unavailable: Some("NVML did not start: driver not loaded".into()),
                ..TickSample::default()
            })
            .unwrap();
        store.append(&tick(T0 + 2000, GIB, &[])).unwrap();
        let gaps = store.gaps(TimeRange::ALL).unwrap();
        let all: Vec<_> = gaps.iter().filter(|g| g.device_uuid.is_none()).collect();
        assert_eq!(all.len(), 1);
        assert!(all[0].reason.contains("driver not loaded"));
        let d = store.devices().unwrap()[0].id;
        assert_eq!(
            store
                .device_metric(d, Metric::UsedBytes, TimeRange::ALL)
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn pid_reuse_is_a_new_process() {
        let mut store = Store::open_in_memory().unwrap();
        store.append(&tick(T0, GIB, &[(10, GIB)])).unwrap();
        let mut reused = tick(T0 + 1000, GIB, &[(10, GIB)]);
        reused.processes[0].meta.key.start_time_ticks = Some(99_999);
        store.append(&reused).unwrap();
        assert_eq!(store.processes_in(TimeRange::ALL).unwrap().len(), 2);
    }

    #[test]
    fn out_of_order_ticks_are_refused() {
        let mut store = Store::open_in_memory().unwrap();
        store.append(&tick(T0, GIB, &[])).unwrap();
        let err = store.append(&tick(T0, GIB, &[])).unwrap_err();
        assert!(matches!(err, StoreError::OutOfOrder { .. }), "{err}");
    }

    #[test]
    fn cpu_time_carries_over_between_reads_and_ends_with_the_process() {
        let mut store = Store::open_in_memory().unwrap();
        let mut a = tick(T0, GIB, &[(10, GIB)]);
        a.processes[0].cpu_ticks = Some(100);
        store.append(&a).unwrap();
        store.append(&tick(T0 + 1000, GIB, &[(10, GIB)])).unwrap();
        let mut c = tick(T0 + 2000, GIB, &[(10, GIB)]);
        c.processes[0].cpu_ticks = Some(250);
        store.append(&c).unwrap();
        store.append(&tick(T0 + 3000, GIB, &[])).unwrap();
        let p = store.processes_in(TimeRange::ALL).unwrap()[0].0.id;
        let cpu = store.process_cpu(p, TimeRange::ALL).unwrap();
        assert_eq!(values(&cpu), vec![(0, 100), (1000, 100), (2000, 250)]);
    }

    #[test]
    fn agent_figures_are_series_only_while_an_agent_answers() {
        use crate::model::AgentBytes;
        let mut store = Store::open_in_memory().unwrap();
        let with_agent = |t: i64, agent: Option<AgentBytes>| {
            let mut tick = tick(t, 3 * GIB, &[(10, 3 * GIB), (11, GIB)]);
            if let DeviceSampleState::Read {
                processes: ProcessList::Observed(list),
                ..
            } = &mut tick.devices[0].state
            {
                list[0].agent = agent;
            }
            tick
        };
        let figures = |allocated: u64, reserved: Option<u64>| {
            Some(AgentBytes {
                allocated_bytes: Some(allocated),
                reserved_bytes: reserved,
            })
        };
        store
            .append(&with_agent(T0, figures(GIB, Some(2 * GIB))))
            .unwrap();
        store
            .append(&with_agent(T0 + 1000, figures(GIB, Some(2 * GIB))))
            .unwrap();
        store
            .append(&with_agent(T0 + 2000, figures(2 * GIB, None)))
            .unwrap();
        store.append(&with_agent(T0 + 3000, None)).unwrap();
        let d = store.devices().unwrap()[0].id;
        let procs = store.processes_in(TimeRange::ALL).unwrap();
        let id = |pid: u32| {
            procs
                .iter()
                .find(|(p, _)| p.meta.key.pid == pid)
                .map(|(p, _)| p.id)
                .unwrap()
        };
        let series = |store: &mut Store, pid: u32, metric: Metric| {
            values(
                &store
                    .process_device_metric(id(pid), d, metric, TimeRange::ALL)
                    .unwrap(),
            )
        };
        assert_eq!(
            series(&mut store, 10, Metric::ProcessAllocatedBytes),
            vec![(0, GIB), (1000, GIB), (2000, 2 * GIB)],
            "ends when the agent no longer answers"
        );
        assert_eq!(
            series(&mut store, 10, Metric::ProcessReservedBytes),
            vec![(0, 2 * GIB), (1000, 2 * GIB)],
            "a figure the framework cannot say is no sample, not 0"
        );
        assert!(series(&mut store, 11, Metric::ProcessAllocatedBytes).is_empty());
        assert_eq!(
            series(&mut store, 10, Metric::ProcessUsedBytes).len(),
            4,
            "NVML's figure goes on"
        );
    }
}
