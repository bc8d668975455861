//! `vramctl record`: the sampler loop feeding the history store.
//!
//! Two threads: this one samples on the interval and never waits on the disk; a writer
//! thread owns the store and commits one transaction per tick. Between them a bounded
//! channel: if the disk stalls long enough to fill it, ticks are dropped and recorded as a
//! gap ("writer fell behind") instead of delaying the samples.
//!
//! The recorder never dies of a GPU fault: NVML failing to start is retried with backoff
//! (1 s doubling to 5 min) and recorded as a gap over every device; a lost GPU and values a
//! device cannot report are gaps with their reasons. Write failures (disk full, file made
//! read-only) are logged, the ticks in between become a gap, and writing resumes when it
//! can. It stops on SIGINT/SIGTERM, `--duration`, or the test-only `--ticks`, flushes, and
//! exits 0. Exit 2: bad flags, or a database it cannot open (not ours, newer, corrupt,
//! unwritable, another recorder holds it) or that fails in a way retrying cannot fix.
//!
//! Test-only flags (hidden from `--help`): `--ticks N` stops after N samples;
//! `--simulated-clock UNIX_MS` makes time start there and move by `--interval` per sample
//! without waiting (with the fake NVML's `step` clock, runs are deterministic and instant);
//! `--max-db-pages N` caps the database size to reach "disk full" without a small
//! filesystem. At debug level (`VRAMCTL_LOG=vramctl=debug`) every committed tick is logged
//! as `Committed a tick. t_ms=…`, which the crash test relies on.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use vramctl_core::clock::{Clock, ManualClock, SystemClock};
use vramctl_core::procinfo::{self, ProcReader};
use vramctl_core::sanity::SanityLimits;
use vramctl_core::types::Snapshot;
use vramctl_core::{Backend, NvmlBackend, Sampler};
use vramctl_store::{
    Gap, OpenMode, ProcessKey, ProcessMeta, ProcessSample, Retention, SessionInfo, Store,
    StoreError, TickSample, device_samples, parse_duration_ms,
};

use super::db_path;
use crate::cli::{GlobalArgs, RecordArgs};
use crate::exit::Exit;

/// Shortest interval accepted: below it NVML calls and /proc reads dominate the machine.
const MIN_INTERVAL_MS: i64 = 50;
/// How often CPU time of GPU processes is re-read (cumulative, so nothing is lost between).
const CPU_EVERY_MS: i64 = 10_000;
/// How often retention runs.
const MAINTAIN_EVERY_MS: i64 = 60_000;
/// NVML init retry backoff.
const BACKOFF_FIRST_MS: i64 = 1_000;
const BACKOFF_MAX_MS: i64 = 300_000;

/// What the sampler sends the writer.
enum Msg {
    Tick(TickSample),
    Dropped(Gap),
}

/// Runs `record`.
pub fn run(global: &GlobalArgs, args: &RecordArgs) -> anyhow::Result<Exit> {
    let interval_ms = parse_duration_ms(&args.interval).map_err(|e| anyhow!("--interval: {e}"))?;
    if interval_ms < MIN_INTERVAL_MS {
        bail!(
            "--interval '{}' is shorter than {MIN_INTERVAL_MS}ms; use 50ms or more",
            args.interval
        );
    }
    let duration_ms = args
        .duration
        .as_deref()
        .map(parse_duration_ms)
        .transpose()
        .map_err(|e| anyhow!("--duration: {e}"))?;
    let retention: Retention = args.retain.parse()?;
    let path = db_path(global)?;
    let mut store = Store::open(&path, OpenMode::Append)?;
    if let Some(pages) = args.max_db_pages {
        store.set_max_page_count(pages)?;
    }
    let boot_id = procinfo::boot_id();
    store.begin_session(&SessionInfo {
        source: "record".into(),
        host: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned()),
        boot_id: boot_id.clone(),
        interval_ms: Some(interval_ms),
        driver_version: None,
        cuda_version: None,
    })?;
    tracing::info!(db = %path.display(), interval_ms, retain = %args.retain, "Recording.");

    let signals = stop_signals()?;
    // About 10 s of ticks fit in the channel before samples are dropped.
    let capacity = usize::try_from((10_000 / interval_ms).clamp(8, 128)).unwrap_or(8);
    let (tx, rx) = mpsc::sync_channel::<Msg>(capacity);
    let writer = std::thread::Builder::new()
        .name("vramctl-writer".into())
        .spawn(move || write_loop(store, &rx, &retention))
        .context("cannot start the writer thread")?;

    let manual = args.simulated_clock.map(ManualClock::new);
    let clock: Box<dyn Clock> = match &manual {
        Some(m) => Box::new(m.clone()),
        None => Box::new(SystemClock),
    };
    let mut recorder = Recorder {
        global,
        manual: manual.clone(),
        sampler: None,
        init_error: None,
        next_init_ms: i64::MIN,
        backoff_ms: BACKOFF_FIRST_MS,
        procs: Procs::new(boot_id),
        last_t_ms: None,
        dropped: None,
    };
    let started = Instant::now();
    let first_ms = clock.now_unix_ms();
    let mut ticks: u64 = 0;
    let mut writer_gone = false;
    loop {
        let tick = recorder.tick(clock.as_ref());
        let t = tick.at_unix_ms;
        if !recorder.send(&tx, tick) {
            writer_gone = true;
            break;
        }
        ticks += 1;
        if args.ticks.is_some_and(|n| ticks >= n)
            || duration_ms.is_some_and(|d| t.saturating_sub(first_ms) + interval_ms > d)
        {
            break;
        }
        let stop = match &manual {
            Some(m) => {
                m.advance_ms(interval_ms);
                signals.try_recv().is_ok()
            }
            None => {
                // Deadlines from the start, so the interval does not drift.
                let next = started
                    + Duration::from_millis(
                        u64::try_from(interval_ms)
                            .unwrap_or(1000)
                            .saturating_mul(ticks),
                    );
                let wait = next.saturating_duration_since(Instant::now());
                match signals.recv_timeout(wait) {
                    Ok(()) => true,
                    Err(RecvTimeoutError::Timeout) => false,
                    Err(RecvTimeoutError::Disconnected) => false,
                }
            }
        };
        if stop {
            tracing::info!("Stopping on a signal.");
            break;
        }
    }
    drop(tx);
    let result = writer
        .join()
        .map_err(|_| anyhow!("the writer thread panicked"))?;
    result?;
    if writer_gone {
        bail!("the writer stopped unexpectedly");
    }
    tracing::info!(ticks, "Stopped.");
    Ok(Exit::Ok)
}

/// A channel that receives `()` on SIGINT or SIGTERM.
fn stop_signals() -> anyhow::Result<Receiver<()>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("cannot install signal handlers")?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("vramctl-signals".into())
        .spawn(move || {
            for _ in signals.forever() {
                if tx.send(()).is_err() {
                    break;
                }
            }
        })
        .context("cannot start the signal thread")?;
    Ok(rx)
}

/// The sampling side: NVML (retried), /proc enrichment, timestamps.
struct Recorder<'a> {
    global: &'a GlobalArgs,
    manual: Option<ManualClock>,
    sampler: Option<Sampler<NvmlBackend>>,
    init_error: Option<String>,
    next_init_ms: i64,
    backoff_ms: i64,
    procs: Procs,
    last_t_ms: Option<i64>,
    /// First and last time of ticks dropped because the writer was behind, and how many.
    dropped: Option<(i64, i64, u64)>,
}

impl Recorder<'_> {
    fn tick(&mut self, clock: &dyn Clock) -> TickSample {
        let now = clock.now_unix_ms();
        if self.sampler.is_none() && now >= self.next_init_ms {
            self.start_nvml(now);
        }
        let mut tick = match self.sampler.as_mut() {
            Some(sampler) => {
                let snapshot = sampler.tick();
                let processes = self.procs.update(&snapshot, now, sampler.backend_mut());
                TickSample {
                    at_unix_ms: snapshot.taken_at_unix_ms,
                    unavailable: None,
                    devices: device_samples(&snapshot),
                    processes,
                }
            }
            None => TickSample {
                at_unix_ms: now,
                unavailable: Some(
                    self.init_error
                        .clone()
                        .unwrap_or_else(|| "NVML did not start".into()),
                ),
                ..TickSample::default()
            },
        };
        // The store needs strictly increasing times; a wall clock stepped back (NTP) must
        // not lose the samples.
        if let Some(last) = self.last_t_ms.filter(|&l| tick.at_unix_ms <= l) {
            tracing::warn!(
                now = tick.at_unix_ms,
                last,
                "The clock went backwards; keeping times increasing."
            );
            tick.at_unix_ms = last + 1;
        }
        self.last_t_ms = Some(tick.at_unix_ms);
        tick
    }

    fn start_nvml(&mut self, now: i64) {
        let opened = NvmlBackend::open(self.global.nvml_lib.as_deref())
            .map_err(|e| format!("{e}; {}", e.hint()))
            .and_then(|mut backend| {
                backend.set_read_process_activity(true);
                let clock: Box<dyn Clock> = match &self.manual {
                    Some(m) => Box::new(m.clone()),
                    None => Box::new(SystemClock),
                };
                Sampler::with_clock(backend, clock, SanityLimits::from_system())
                    .map_err(|e| format!("cannot list the GPUs: {e}"))
            });
        match opened {
            Ok(sampler) => {
                tracing::info!(
                    gpus = sampler.devices().len(),
                    driver = sampler.driver().driver_version.as_deref().unwrap_or("?"),
                    "NVML started."
                );
                self.sampler = Some(sampler);
                self.init_error = None;
                self.backoff_ms = BACKOFF_FIRST_MS;
            }
            Err(err) => {
                tracing::warn!(error = %err, retry_in_ms = self.backoff_ms, "NVML did not start; retrying.");
                self.init_error = Some(err);
                self.next_init_ms = now.saturating_add(self.backoff_ms);
                self.backoff_ms = (self.backoff_ms * 2).min(BACKOFF_MAX_MS);
            }
        }
    }

    /// Hands a tick to the writer without waiting; `false` when the writer is gone.
    fn send(&mut self, tx: &SyncSender<Msg>, tick: TickSample) -> bool {
        let t = tick.at_unix_ms;
        if let Some((from, to, n)) = self.dropped {
            let gap = Gap {
                device_uuid: None,
                metric: None,
                from_ms: from,
                to_ms: to,
                open: false,
                reason: format!("the writer fell behind: {n} samples dropped"),
            };
            match tx.try_send(Msg::Dropped(gap)) {
                Ok(()) => self.dropped = None,
                Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Disconnected(_)) => return false,
            }
        }
        if self.manual.is_some() {
            // Simulated time does not wait between ticks: wait for the writer instead, so a
            // test run is complete and deterministic.
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
}

/// Identity, metadata and CPU time of GPU processes, read from /proc once per process and
/// re-read every [`CPU_EVERY_MS`].
struct Procs {
    boot_id: Option<String>,
    reader: ProcReader,
    known: HashMap<u32, Known>,
}

struct Known {
    start_time_ticks: Option<u64>,
    cpu_read_ms: i64,
}

impl Procs {
    fn new(boot_id: Option<String>) -> Self {
        Self {
            boot_id,
            reader: ProcReader::new(),
            known: HashMap::new(),
        }
    }

    /// Samples for processes that are new, reused PIDs, or due a CPU-time read.
    fn update(
        &mut self,
        snapshot: &Snapshot,
        now: i64,
        backend: &mut dyn Backend,
    ) -> Vec<ProcessSample> {
        let mut on_gpu: Vec<u32> = snapshot
            .devices
            .iter()
            .filter_map(|d| d.reading())
            .filter_map(|r| r.processes.as_ref())
            .flatten()
            .map(|p| p.pid)
            .collect();
        on_gpu.sort_unstable();
        on_gpu.dedup();
        self.known
            .retain(|pid, _| on_gpu.binary_search(pid).is_ok());
        let mut out = Vec::new();
        for pid in on_gpu {
            let due = self
                .known
                .get(&pid)
                .is_none_or(|k| now.saturating_sub(k.cpu_read_ms) >= CPU_EVERY_MS);
            if !due {
                continue;
            }
            let cpu = procinfo::cpu_time_ticks(pid);
            let start = cpu.map(|c| c.start_time_ticks);
            let is_new = self
                .known
                .get(&pid)
                .is_none_or(|k| k.start_time_ticks != start);
            self.known.insert(
                pid,
                Known {
                    start_time_ticks: start,
                    cpu_read_ms: now,
                },
            );
            let mut meta = ProcessMeta {
                key: ProcessKey {
                    boot_id: self.boot_id.clone(),
                    pid,
                    start_time_ticks: start,
                },
                ..ProcessMeta::default()
            };
            if is_new {
                match self.reader.details(pid) {
                    Some(details) => {
                        meta.uid = details.uid;
                        meta.user = details.user;
                        meta.command = Some(details.command);
                        (meta.container_id, meta.pod_uid) = procinfo::cgroup_ids(pid);
                    }
                    // Outside our PID namespace: the driver still knows its name.
                    None => meta.command = backend.process_name(pid),
                }
            }
            out.push(ProcessSample {
                meta,
                cpu_ticks: cpu.map(|c| c.cpu_ticks),
            });
        }
        out
    }
}

/// The writer thread: one transaction per tick, retention once a minute, and write
/// failures turned into a gap once writing works again.
fn write_loop(
    mut store: Store,
    rx: &Receiver<Msg>,
    retention: &Retention,
) -> Result<(), StoreError> {
    let mut failing: Option<(i64, i64, String)> = None;
    let mut last_maintained: Option<i64> = None;
    for msg in rx {
        match msg {
            Msg::Dropped(gap) => {
                if let Err(err) = store.record_gap(&gap) {
                    tracing::warn!(error = %err, "Could not record a gap.");
                }
            }
            Msg::Tick(tick) => {
                let t = tick.at_unix_ms;
                match store.append(&tick) {
                    Ok(()) => {
                        tracing::debug!(t_ms = t, "Committed a tick.");
                        if let Some((from, to, reason)) = failing.take() {
                            tracing::info!(from_ms = from, to_ms = to, "Writing works again.");
                            let gap = Gap {
                                device_uuid: None,
                                metric: None,
                                from_ms: from,
                                to_ms: to,
                                open: false,
                                reason: format!("could not write: {reason}"),
                            };
                            if let Err(err) = store.record_gap(&gap) {
                                tracing::warn!(error = %err, "Could not record a gap.");
                            }
                        }
                        if last_maintained.is_none_or(|m| t - m >= MAINTAIN_EVERY_MS) {
                            last_maintained = Some(t);
                            match store.maintain(retention, t) {
                                Ok(report) => tracing::debug!(?report, "Retention ran."),
                                Err(err) => tracing::warn!(error = %err, "Retention failed."),
                            }
                        }
                    }
                    Err(err) if err.is_transient_write_failure() => match &mut failing {
                        None => {
                            tracing::error!(error = %err, hint = err.hint().unwrap_or(""), "Cannot write samples; will keep retrying.");
                            failing = Some((t, t, err.to_string()));
                        }
                        Some((_, to, _)) => *to = t,
                    },
                    Err(err) => {
                        tracing::error!(error = %err, "Cannot write samples; stopping.");
                        return Err(err);
                    }
                }
            }
        }
    }
    if let Some((from, to, _)) = failing {
        tracing::warn!(
            from_ms = from,
            to_ms = to,
            "Stopped while writes were failing; those samples are lost."
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
