//! What `vramctl record` and `vramctl serve --record` share: the writer thread that owns
//! the history store, the bounded channel that keeps the sampler from ever waiting on the
//! disk, and the per-process enrichment (identity, metadata, CPU time) of each tick.
//!
//! The sampler side builds a [`TickSample`] per tick ([`Procs::update`] adds the
//! processes) and hands it to a [`StoreFeed`] with the tick's monotonic time. The feed
//! gives it its time in the history ([`HistoryClock`]: the wall clock, except that a step
//! back keeps the monotonic spacing and every step is recorded as a `clock-step` gap),
//! then sends it over a bounded channel without waiting; when the writer is behind (a
//! stalled disk) the tick is dropped and the dropped stretch is recorded as a gap ("the
//! writer fell behind") once there is room again. The writer commits one transaction per
//! tick and runs retention once a minute. A tick that cannot be written (disk full,
//! read-only file) leaves no transaction open (the store rolls it back, so the write lock
//! is never held across a failure) and the ticks lost are recorded as one `write-failed`
//! gap together with the first tick written again; the writer's state is shared with
//! `serve`'s `/healthz` ([`WriterHealth`]).

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{Context, anyhow};
use vramctl_core::clock::ClockTime;
use vramctl_observe::observation::Observation;
use vramctl_procs::process_catalog::listed_pids;
use vramctl_procs::procinfo;
use vramctl_store::{
    Gap, HistoryClock, ProcessKey, ProcessMeta, ProcessSample, Retention, SessionInfo, Store,
    StoreError, TickSample,
};

/// How often CPU time of GPU processes is re-read (cumulative, so nothing is lost between).
pub const CPU_EVERY_MS: i64 = 10_000;
/// How often retention runs.
const MAINTAIN_EVERY_MS: i64 = 60_000;

/// The session row of a recording made here.
pub fn session(source: &str, interval_ms: i64) -> SessionInfo {
    SessionInfo {
        source: source.into(),
        host: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned()),
        boot_id: procinfo::boot_id(),
        interval_ms: Some(interval_ms),
        driver_version: None,
        cuda_version: None,
    }
}

/// Ticks that fit in the channel: about 10 s of them, so a disk that stalls for less
/// loses nothing.
pub fn channel_capacity(interval_ms: i64) -> usize {
    usize::try_from((10_000 / interval_ms.max(1)).clamp(8, 128)).unwrap_or(8)
}

/// Gaps kept while they cannot be written (writes failing), at most.
const UNRECORDED_GAPS_MAX: usize = 1024;

/// What the history writer is doing now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum WriterStatus {
    /// Every tick so far was written (or the last write worked again).
    #[default]
    Writing,
    /// Writes fail: since the first failed tick (monotonic), how many ticks were not
    /// written so far, and the last error.
    Failing {
        /// When the first of them failed.
        since: Instant,
        /// Ticks not written so far.
        ticks: u64,
        /// The last write's error.
        reason: String,
    },
    /// The writer stopped on an error that retrying cannot fix; nothing is recorded any
    /// more.
    Stopped {
        /// The error.
        reason: String,
    },
}

/// The writer thread's [`WriterStatus`], shared with whoever reports health (`serve`'s
/// `/healthz`). Updated once per tick; reading it never waits on the disk.
#[derive(Debug, Default)]
pub struct WriterHealth {
    status: Mutex<WriterStatus>,
}

impl WriterHealth {
    /// The writer's state now.
    pub fn status(&self) -> WriterStatus {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, status: WriterStatus) {
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) = status;
    }
}

/// What the sampler side sends the writer.
enum Msg {
    Tick(TickSample),
    /// A gap that is already over: ticks dropped, a clock step.
    Gap(Gap),
}

/// The sampler's end of the writer thread.
pub struct StoreFeed {
    tx: Option<SyncSender<Msg>>,
    writer: Option<JoinHandle<Result<(), StoreError>>>,
    /// What the writer is doing (`serve`'s `/healthz`).
    health: Arc<WriterHealth>,
    /// Wait for room instead of dropping (simulated time: a test run must be complete).
    wait: bool,
    /// The ticks' times in the history.
    clock: HistoryClock,
    /// First and last time of ticks dropped because the writer was behind, and how many.
    dropped: Option<(i64, i64, u64)>,
    /// Gaps not sent yet (the channel was full).
    pending: VecDeque<Gap>,
}

impl std::fmt::Debug for StoreFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreFeed")
            .field("wait", &self.wait)
            .field("clock", &self.clock)
            .field("dropped", &self.dropped)
            .finish_non_exhaustive()
    }
}

impl StoreFeed {
    /// Starts the writer thread, which owns `store` (opened with `OpenMode::Append`), for
    /// ticks every `interval_ms`. `wait`: block when the channel is full instead of
    /// dropping ticks.
    ///
    /// # Errors
    /// When the last stored time cannot be read or the thread cannot be started.
    pub fn start(
        store: Store,
        retention: Retention,
        interval_ms: i64,
        capacity: usize,
        wait: bool,
    ) -> anyhow::Result<Self> {
        let clock = HistoryClock::new(store.last_sample_ms()?, interval_ms);
        let (tx, rx) = mpsc::sync_channel::<Msg>(capacity.max(1));
        let health = Arc::new(WriterHealth::default());
        let writer_health = Arc::clone(&health);
        let writer = std::thread::Builder::new()
            .name("vramctl-writer".into())
            .spawn(move || write_loop(store, &rx, &retention, &writer_health))
            .context("cannot start the writer thread")?;
        Ok(Self {
            tx: Some(tx),
            writer: Some(writer),
            health,
            wait,
            clock,
            dropped: None,
            pending: VecDeque::new(),
        })
    }

    /// A feed into `tx` with no writer thread (tests drain the channel themselves).
    #[cfg(test)]
    fn with_sender(tx: SyncSender<Msg>, wait: bool, stored_before_ms: Option<i64>) -> Self {
        Self {
            tx: Some(tx),
            writer: None,
            health: Arc::default(),
            wait,
            clock: HistoryClock::new(stored_before_ms, 1),
            dropped: None,
            pending: VecDeque::new(),
        }
    }

    /// What the writer is doing, shared: `serve`'s `/healthz` reads it.
    pub fn health(&self) -> Arc<WriterHealth> {
        Arc::clone(&self.health)
    }

    /// Hands a tick, read when the monotonic clock said `monotonic_ms`, to the writer
    /// without waiting (unless made to wait); `false` when the writer is gone (it stopped
    /// on an error that retrying cannot fix).
    pub fn send(&mut self, mut tick: TickSample, monotonic_ms: i64) -> bool {
        let Some(tx) = &self.tx else {
            return false;
        };
        // The store needs increasing times; a wall clock that steps must neither cram
        // samples together nor stop the recorder (`HistoryClock`).
        let placed = self.clock.place(ClockTime {
            unix_ms: tick.at_unix_ms,
            monotonic_ms,
        });
        if let Some(step) = placed.step {
            tracing::warn!(
                wall_ms = tick.at_unix_ms,
                history_ms = placed.t_ms,
                ahead_ms = self.clock.ahead_ms(),
                reason = %step.reason,
                "The wall clock stepped."
            );
            self.pending.push_back(step);
        }
        tick.at_unix_ms = placed.t_ms;
        let t = tick.at_unix_ms;
        while let Some(gap) = self.pending.pop_front() {
            let sent = if self.wait {
                tx.send(Msg::Gap(gap))
                    .map_err(|e| TrySendError::Disconnected(e.0))
            } else {
                tx.try_send(Msg::Gap(gap))
            };
            match sent {
                Ok(()) => {}
                Err(TrySendError::Full(Msg::Gap(gap))) => {
                    self.pending.push_front(gap);
                    break;
                }
                Err(TrySendError::Full(Msg::Tick(_))) => break,
                Err(TrySendError::Disconnected(_)) => return false,
            }
        }
        if let Some((from, to, n)) = self.dropped {
            let gap = Gap {
                device_uuid: None,
                metric: None,
                from_ms: from,
                to_ms: to,
                open: false,
                reason: format!("the writer fell behind: {n} samples dropped"),
            };
            match tx.try_send(Msg::Gap(gap)) {
                Ok(()) => self.dropped = None,
                Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Disconnected(_)) => return false,
            }
        }
        if self.wait {
            return tx.send(Msg::Tick(tick)).is_ok();
        }
        match tx.try_send(Msg::Tick(tick)) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                if self.dropped.is_none() {
                    tracing::warn!("The disk is too slow for the interval; dropping samples.");
                }
                let (from, _, n) = self.dropped.unwrap_or((t, t, 0));
                self.dropped = Some((from, t, n + 1));
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        }
    }

    /// Closes the channel, waits until the writer has committed everything sent and
    /// checkpointed the database, and returns how it ended.
    ///
    /// # Errors
    /// The writer's error when it stopped on one, or a panic of its thread.
    pub fn finish(&mut self) -> anyhow::Result<()> {
        drop(self.tx.take());
        let Some(writer) = self.writer.take() else {
            return Ok(());
        };
        writer
            .join()
            .map_err(|_| anyhow!("the writer thread panicked"))??;
        Ok(())
    }
}

impl Drop for StoreFeed {
    fn drop(&mut self) {
        if let Err(err) = self.finish() {
            tracing::error!(error = %format!("{err:#}"), "The history writer failed.");
        }
    }
}

/// Identity, metadata and CPU time of GPU processes for the history: what the caller's
/// observations (`vramctl_observe::observation::Observer`) say, sent to the store when a
/// process is new (metadata, once per identity) and its CPU time every [`CPU_EVERY_MS`].
/// The observer's catalog proves each tick that a PID still names the same process (a
/// pidfd poll); `record` and `run --record` have it read `/proc/PID/stat` only as often as
/// the history stores CPU time, and `serve --record` reads the observation the exporter's
/// labels and live analysis read, so /proc is read once for all of them.
#[derive(Debug, Default)]
pub struct Procs {
    /// What was last sent per PID: its identity, and when its CPU time was.
    sent: HashMap<u32, Sent>,
}

#[derive(Debug, Clone, Copy)]
struct Sent {
    start_time_ticks: Option<u64>,
    cpu_at_ms: i64,
}

impl Procs {
    /// Nothing sent yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Samples for processes that are new, reused PIDs, or due a CPU-time reading, as
    /// `observation` (an `Observer`'s, without reading anything more) describes the
    /// processes its snapshot lists. `boot_id` and `ticks_per_second` are the observer's;
    /// the CPU time goes back to the ticks the history stores (exact for the kernel's 100 a
    /// second). `now` (the snapshot's monotonic time) paces the CPU readings.
    pub fn update_observed(
        &mut self,
        observation: &Observation,
        boot_id: Option<&str>,
        ticks_per_second: u64,
    ) -> Vec<ProcessSample> {
        let now = observation.snapshot.monotonic_ms;
        let on_gpu = listed_pids(&observation.snapshot);
        self.sent.retain(|pid, _| on_gpu.binary_search(pid).is_ok());
        let mut out = Vec::new();
        for pid in on_gpu {
            let host = observation.hosts.get(&pid);
            let sent = self.sent.get(&pid).copied();
            // A process /proc no longer shows (it exited; NVML lists it while the driver
            // tears its context down) is still the one last sent: no second identity.
            let start = match host {
                Some(h) => h.start_time_ticks,
                None => sent.and_then(|s| s.start_time_ticks),
            };
            let is_new = sent.is_none_or(|s| s.start_time_ticks != start);
            // Only /proc's processes have a CPU time (hosts). A clock that went backwards
            // makes the reading due at once.
            let cpu_due = host.is_some()
                && (is_new
                    || sent.is_none_or(|s| {
                        now < s.cpu_at_ms || now.saturating_sub(s.cpu_at_ms) >= CPU_EVERY_MS
                    }));
            if !is_new && !cpu_due {
                continue;
            }
            let mut meta = ProcessMeta {
                key: ProcessKey {
                    boot_id: boot_id.map(str::to_owned),
                    pid,
                    start_time_ticks: start,
                },
                ..ProcessMeta::default()
            };
            if is_new {
                match host {
                    Some(h) => {
                        meta.uid = h.uid;
                        meta.user = h.user_name().map(str::to_owned);
                        meta.command = Some(h.command.clone());
                        meta.container_id.clone_from(&h.container_id);
                        meta.pod_uid.clone_from(&h.pod_uid);
                        meta.slurm_job_id = h.slurm.as_ref().map(|job| job.job_id);
                    }
                    None => meta.command = observation.driver_names.get(&pid).cloned(),
                }
            }
            let cpu_ticks = if cpu_due {
                host.and_then(|h| h.cpu_time_ms).and_then(|ms| {
                    u64::try_from(u128::from(ms) * u128::from(ticks_per_second) / 1000).ok()
                })
            } else {
                None
            };
            let cpu_at_ms = match (cpu_due, sent) {
                (true, _) | (false, None) => now,
                (false, Some(s)) => s.cpu_at_ms,
            };
            self.sent.insert(
                pid,
                Sent {
                    start_time_ticks: start,
                    cpu_at_ms,
                },
            );
            out.push(ProcessSample { meta, cpu_ticks });
        }
        out
    }
}

/// The writer thread: one transaction per tick, retention once a minute, ticks that cannot
/// be written kept as a gap (written with the next tick that can be), gaps that cannot be
/// written kept until they can, and its state in `health`.
fn write_loop(
    mut store: Store,
    rx: &Receiver<Msg>,
    retention: &Retention,
    health: &WriterHealth,
) -> Result<(), StoreError> {
    let mut last_maintained: Option<i64> = None;
    // Gaps sent while writes failed (a clock step, dropped ticks), oldest first.
    let mut unrecorded = UnrecordedGaps::default();
    let mut failing_since: Option<Instant> = None;
    for msg in rx {
        match msg {
            Msg::Gap(gap) => {
                if failing_since.is_some() {
                    unrecorded.push(gap);
                } else if let Err(err) = store.record_gap(&gap) {
                    tracing::warn!(error = %err, "Could not record a gap; will retry.");
                    unrecorded.push(gap);
                }
            }
            Msg::Tick(tick) => {
                let t = tick.at_unix_ms;
                let lost = store.unwritten().cloned();
                match store.append(&tick) {
                    Ok(()) => {
                        tracing::debug!(t_ms = t, "Committed a tick.");
                        if failing_since.take().is_some() {
                            tracing::info!(
                                t_ms = t,
                                from_ms = lost.as_ref().map(|u| u.from_ms),
                                to_ms = lost.as_ref().map(|u| u.to_ms),
                                samples = lost.as_ref().map(|u| u.ticks),
                                "Writing works again; the samples not written are recorded as a gap."
                            );
                            health.set(WriterStatus::Writing);
                        }
                        unrecorded.record(&mut store);
                        if last_maintained.is_none_or(|m| t - m >= MAINTAIN_EVERY_MS) {
                            last_maintained = Some(t);
                            match store.maintain(retention, t) {
                                Ok(report) => tracing::debug!(?report, "Retention ran."),
                                Err(err) => tracing::warn!(error = %err, "Retention failed."),
                            }
                        }
                    }
                    Err(err) if err.is_transient_write_failure() => {
                        tracing::debug!(t_ms = t, error = %err, "Could not write a tick.");
                        let since = *failing_since.get_or_insert_with(|| {
                            tracing::error!(error = %err, hint = err.hint().unwrap_or(""), "Cannot write samples; will keep retrying.");
                            Instant::now()
                        });
                        health.set(WriterStatus::Failing {
                            since,
                            ticks: store.unwritten().map_or(1, |u| u.ticks),
                            reason: err.to_string(),
                        });
                    }
                    Err(err) => {
                        tracing::error!(error = %err, "Cannot write samples; stopping.");
                        health.set(WriterStatus::Stopped {
                            reason: err.to_string(),
                        });
                        return Err(err);
                    }
                }
            }
        }
    }
    // Stopping while writes fail: the ticks not written are a gap if it can be written now.
    if let Some(lost) = store.unwritten().cloned() {
        match store.record_unwritten_gap() {
            Ok(_) => tracing::warn!(
                from_ms = lost.from_ms,
                to_ms = lost.to_ms,
                samples = lost.ticks,
                "Stopped while writes were failing; the samples not written are recorded as a gap."
            ),
            Err(err) => tracing::warn!(
                from_ms = lost.from_ms,
                to_ms = lost.to_ms,
                samples = lost.ticks,
                error = %err,
                "Stopped while writes were failing; those samples are lost and not even their gap could be written."
            ),
        }
    }
    unrecorded.record(&mut store);
    if !unrecorded.gaps.is_empty() {
        tracing::warn!(
            gaps = unrecorded.gaps.len(),
            "Stopped with gaps that could not be written."
        );
    }
    match store.close() {
        // What was committed is in the WAL, which the next open replays.
        Err(err) if err.is_transient_write_failure() => {
            tracing::warn!(error = %err, "Could not checkpoint the database on the way out.");
            Ok(())
        }
        other => other,
    }
}

/// Gaps the writer could not write yet, written in order once writes work again; at most
/// [`UNRECORDED_GAPS_MAX`] (beyond, the oldest is given up, and said).
#[derive(Debug, Default)]
struct UnrecordedGaps {
    gaps: VecDeque<Gap>,
}

impl UnrecordedGaps {
    fn push(&mut self, gap: Gap) {
        if self.gaps.len() >= UNRECORDED_GAPS_MAX {
            if let Some(old) = self.gaps.pop_front() {
                tracing::warn!(from_ms = old.from_ms, to_ms = old.to_ms, reason = %old.reason, "Gave up a gap that could not be written.");
            }
        }
        self.gaps.push_back(gap);
    }

    /// Writes the kept gaps until one fails.
    fn record(&mut self, store: &mut Store) {
        while let Some(gap) = self.gaps.front() {
            if let Err(err) = store.record_gap(gap) {
                tracing::debug!(error = %err, "Could not record a kept gap yet.");
                return;
            }
            self.gaps.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vramctl_core::types::{
        DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, ProcessKind,
        ProcessUsage, Snapshot,
    };
    use vramctl_observe::observation::Observer;
    use vramctl_procs::process_catalog::{
        FactsSource, LiveProc, ProcSource, RefreshPolicy, ScriptedProc,
    };
    use vramctl_store::{OpenMode, TimeRange, device_samples};

    use super::*;

    fn snapshot(at_ms: i64, pids: &[u32]) -> Snapshot {
        Snapshot {
            taken_at_unix_ms: at_ms,
            monotonic_ms: at_ms,
            driver: Arc::new(DriverInfo::default()),
            devices: vec![DeviceSnapshot {
                info: Arc::new(DeviceInfo::new(0, "GPU-a")),
                state: DeviceState::Ok(DeviceReading {
                    processes: Some(
                        pids.iter()
                            .map(|&pid| ProcessUsage {
                                pid,
                                used_bytes: Some(1 << 30),
                                kind: ProcessKind::Compute,
                                gpu_instance_id: None,
                                compute_instance_id: None,
                            })
                            .collect(),
                    ),
                    ..DeviceReading::default()
                }),
            }],
            unopened: Vec::new(),
        }
    }

    /// An observer as a recorder has one (`record`'s: CPU time read every 10 s, no
    /// ancestors), without agents, reading `source` on the boot `boot`.
    fn observer_on(
        facts: FactsSource,
        boot: Option<&str>,
        source: Box<dyn ProcSource>,
    ) -> Observer {
        Observer::builder()
            .facts(facts)
            .proc_source(boot.map(str::to_owned), source)
            .refresh(RefreshPolicy {
                stat_every_ms: CPU_EVERY_MS,
                ..RefreshPolicy::default()
            })
            .agents(None)
            .ancestors(false)
            .build()
    }

    /// What `procs` sends for `snapshot`, observed by `observer`.
    fn update(
        procs: &mut Procs,
        observer: &mut Observer,
        snapshot: Snapshot,
        name: &mut dyn FnMut(u32) -> Option<String>,
    ) -> Vec<ProcessSample> {
        let observation = observer.observe_processes(snapshot, name);
        procs.update_observed(
            &observation,
            observer.boot_id(),
            observer.ticks_per_second(),
        )
    }

    #[test]
    fn our_own_process_gets_its_identity_once_and_cpu_every_ten_seconds() {
        let me = std::process::id();
        let mut observer = observer_on(FactsSource::Proc, Some("boot"), Box::new(LiveProc::new()));
        let mut procs = Procs::new();
        let asked = std::cell::RefCell::new(Vec::new());
        let mut name = |pid| {
            asked.borrow_mut().push(pid);
            None
        };
        let first = update(&mut procs, &mut observer, snapshot(0, &[me]), &mut name);
        assert_eq!(first.len(), 1);
        let meta = &first[0].meta;
        assert_eq!(meta.key.boot_id.as_deref(), Some("boot"));
        assert!(meta.key.start_time_ticks.is_some());
        assert!(meta.command.is_some() && meta.user.is_some());
        assert!(first[0].cpu_ticks.is_some());
        assert!(update(&mut procs, &mut observer, snapshot(5_000, &[me]), &mut name).is_empty());
        let again = update(
            &mut procs,
            &mut observer,
            snapshot(10_000, &[me]),
            &mut name,
        );
        assert_eq!(again.len(), 1);
        assert!(again[0].cpu_ticks.is_some());
        assert_eq!(again[0].meta.command, None, "metadata only once");
        assert!(
            asked.borrow().is_empty(),
            "the driver is asked only for invisible PIDs"
        );
    }

    #[test]
    fn without_proc_only_the_driver_name_is_kept() {
        let me = std::process::id();
        // The driver's process names only: a container without the host's PID namespace,
        // where /proc would describe other processes under the same numbers.
        let boot = procinfo::boot_id();
        let mut observer = observer_on(
            FactsSource::Driver,
            boot.as_deref(),
            Box::new(LiveProc::new()),
        );
        let mut procs = Procs::new();
        let mut name = |pid: u32| Some(format!("name {pid}"));
        let first = update(&mut procs, &mut observer, snapshot(0, &[me]), &mut name);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].meta.command, Some(format!("name {me}")));
        assert_eq!(first[0].meta.key.start_time_ticks, None);
        assert_eq!(first[0].meta.user, None);
        assert!(
            update(
                &mut procs,
                &mut observer,
                snapshot(60_000, &[me]),
                &mut name
            )
            .is_empty()
        );
    }

    fn scripted_observer(source: &ScriptedProc) -> Observer {
        observer_on(FactsSource::Proc, Some("boot"), Box::new(source.clone()))
    }

    #[test]
    fn a_reused_pid_is_recorded_as_a_new_process_at_the_next_tick() {
        let source = ScriptedProc::new();
        source.set(42, 500, 10, 'S');
        let mut observer = scripted_observer(&source);
        let mut procs = Procs::new();
        let mut name = |_| None;
        let first = update(&mut procs, &mut observer, snapshot(0, &[42]), &mut name);
        assert_eq!(first[0].meta.key.start_time_ticks, Some(500));
        // 100 ms later another process runs under PID 42: the history must not add its
        // memory to the first one's series until the next CPU reading (10 s later).
        source.set(42, 900, 0, 'R');
        let next = update(&mut procs, &mut observer, snapshot(100, &[42]), &mut name);
        assert_eq!(next.len(), 1);
        let meta = &next[0].meta;
        assert_eq!(meta.key.start_time_ticks, Some(900));
        assert_eq!(meta.command.as_deref(), Some("python job42-900.py"));
        assert_eq!(next[0].cpu_ticks, Some(0));
    }

    #[test]
    fn an_exiting_process_keeps_its_identity_while_nvml_still_lists_it() {
        let source = ScriptedProc::new();
        source.set(530, 500, 10, 'S');
        let mut observer = scripted_observer(&source);
        let mut procs = Procs::new();
        let mut name = |_| Some("python".to_owned());
        let first = update(&mut procs, &mut observer, snapshot(0, &[530]), &mut name);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].meta.key.start_time_ticks, Some(500));
        // The process exits and is reaped; NVML lists it for a few more ticks while the
        // driver tears its context down. No second identity (`PID 530 (?)`) may be stored.
        source.remove(530);
        for tick in 1..=20 {
            let sent = update(
                &mut procs,
                &mut observer,
                snapshot(tick * 100, &[530]),
                &mut name,
            );
            assert!(sent.is_empty(), "tick {tick}: {sent:?}");
        }
    }

    #[test]
    fn thirty_processes_cost_the_recorder_one_poll_a_tick_and_a_stat_read_every_ten_seconds() {
        let source = ScriptedProc::new();
        let pids: Vec<u32> = (2000..2030).collect();
        for &pid in &pids {
            source.set(pid, u64::from(pid), 0, 'S');
        }
        let mut observer = scripted_observer(&source);
        let mut procs = Procs::new();
        let mut name = |_| None;
        // A minute at 100 ms.
        let mut sent = 0;
        for tick in 0..600 {
            sent += update(
                &mut procs,
                &mut observer,
                snapshot(tick * 100, &pids),
                &mut name,
            )
            .len();
        }
        let c = observer.counters();
        assert_eq!(c.detail_reads, 30, "static facts once per process");
        // At first sight, then CPU time at 10, 20, ..., 50 s.
        assert_eq!(c.stat_reads, 30 * 6);
        assert_eq!(source.stat_reads(), 30 * 6);
        assert_eq!(c.polls, 599);
        assert_eq!(sent, 30 * 6);
    }

    fn tick_at(t: i64) -> TickSample {
        TickSample {
            at_unix_ms: t,
            ..TickSample::default()
        }
    }

    fn received(rx: &Receiver<Msg>) -> Vec<String> {
        rx.try_iter()
            .map(|m| match m {
                Msg::Tick(t) => format!("tick {}", t.at_unix_ms),
                Msg::Gap(g) => format!("gap {}..{}: {}", g.from_ms, g.to_ms, g.reason),
            })
            .collect()
    }

    #[test]
    fn a_full_channel_drops_ticks_and_then_sends_their_gap() {
        let (tx, rx) = mpsc::sync_channel(2);
        let mut feed = StoreFeed::with_sender(tx, false, None);
        for t in [1, 2, 3, 4] {
            assert!(feed.send(tick_at(t), t));
        }
        // Two fit; 3 and 4 were dropped without waiting.
        assert_eq!(received(&rx), ["tick 1", "tick 2"]);
        assert!(feed.send(tick_at(5), 5));
        assert_eq!(
            received(&rx),
            [
                "gap 3..4: the writer fell behind: 2 samples dropped",
                "tick 5"
            ]
        );
        // A wall clock a few ms behind (within the step tolerance) does not lose the
        // tick: it goes in just after the last.
        assert!(feed.send(tick_at(2), 6));
        assert_eq!(received(&rx), ["tick 6"]);
        drop(rx);
        assert!(!feed.send(tick_at(10), 10), "the writer is gone");
    }

    /// The recorder used to put every tick after a step back 1 ms after the last one: an
    /// hour of samples crammed into 3.6 s of history.
    #[test]
    fn a_wall_clock_step_back_keeps_the_samples_spacing() {
        let (tx, rx) = mpsc::sync_channel(64);
        let mut feed = StoreFeed::with_sender(tx, true, None);
        let t0 = 1_764_000_000_000;
        for i in 0..6 {
            let step = if i >= 3 { -3_600_000 } else { 0 };
            assert!(feed.send(tick_at(t0 + i * 1000 + step), i * 1000));
        }
        let got = received(&rx);
        let ticks: Vec<i64> = got
            .iter()
            .filter_map(|m| m.strip_prefix("tick "))
            .map(|t| t.parse::<i64>().unwrap() - t0)
            .collect();
        assert_eq!(ticks, [0, 1000, 2000, 3000, 4000, 5000]);
        let gaps: Vec<&String> = got.iter().filter(|m| m.starts_with("gap")).collect();
        assert_eq!(gaps.len(), 1, "{got:?}");
        let expected = format!(
            "gap {}..{}: clock-step: the wall clock went back 1 h 0 min",
            t0 + 2000,
            t0 + 3000
        );
        assert!(gaps[0].starts_with(&expected), "{got:?}");
    }

    /// `serve --record`'s `/healthz` reads this: a writer whose ticks fail says so, with
    /// the reason and how many were not written, and keeps running.
    #[test]
    fn the_writer_reports_failing_writes_to_its_health() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        let t0 = 1_764_000_000_000;
        let tick = |t: i64, pids: &[u32]| {
            let s = snapshot(t, pids);
            TickSample {
                at_unix_ms: t,
                unavailable: None,
                devices: device_samples(&s),
                processes: Vec::new(),
            }
        };
        store.append(&tick(t0, &[7])).unwrap();
        store
            .set_max_page_count(store.size_bytes().unwrap() / 4096)
            .unwrap();
        let mut feed = StoreFeed::start(store, Retention::default(), 1000, 8, true).unwrap();
        let health = feed.health();
        assert_eq!(health.status(), WriterStatus::Writing);
        // Hundreds of new processes a tick need new pages, which the cap refuses.
        for i in 1..=3u32 {
            let pids: Vec<u32> = (0..300).map(|p| 1000 + i * 300 + p).collect();
            assert!(feed.send(tick(t0 + i64::from(i) * 1000, &pids), i64::from(i) * 1000));
        }
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        let status = loop {
            let status = health.status();
            if matches!(status, WriterStatus::Failing { ticks: 3, .. }) || Instant::now() > deadline
            {
                break status;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let WriterStatus::Failing { reason, .. } = &status else {
            panic!("{status:?}");
        };
        assert!(reason.contains("is full"), "{reason}");
        feed.finish()
            .expect("the writer keeps running through failed writes");
    }

    #[test]
    fn the_writer_commits_what_it_was_sent_and_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let store = Store::open(&path, OpenMode::Append).unwrap();
        let mut feed = StoreFeed::start(store, Retention::default(), 1000, 4, true).unwrap();
        let t0 = 1_764_000_000_000;
        for i in 0..50 {
            let s = snapshot(t0 + i * 1000, &[]);
            assert!(feed.send(
                TickSample {
                    at_unix_ms: s.taken_at_unix_ms,
                    unavailable: None,
                    devices: device_samples(&s),
                    processes: Vec::new(),
                },
                s.monotonic_ms
            ));
        }
        feed.finish().unwrap();
        // The lock is released and the WAL folded into the file.
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        assert!(std::fs::metadata(&wal).map_or(true, |m| m.len() == 0));
        let store = Store::open(&path, OpenMode::Append).unwrap();
        assert_eq!(store.tick_count(TimeRange::ALL).unwrap(), 50);
    }
}
