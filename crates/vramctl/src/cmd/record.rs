//! `vramctl record`: the sampler loop feeding the history store.
//!
//! Two threads: this one samples on the interval and never waits on the disk; a writer
//! thread owns the store and commits one transaction per tick (`vramctl_history::recorder`, shared
//! with `serve --record`). Between them a bounded channel: if the disk stalls long enough
//! to fill it, ticks are dropped and recorded as a gap ("writer fell behind") instead of
//! delaying the samples.
//!
//! The recorder never dies of a GPU fault: NVML failing to start is retried with backoff
//! (1 s doubling to 5 min) and recorded as a gap over every device; a session that stops
//! working (a driver reloaded, a GPU reset: `SessionHealth`) is shut down and started
//! again the same way; a lost GPU and values a device cannot report are gaps with their
//! reasons. Write failures (disk full, file made read-only) are logged once, each failed
//! tick is rolled back at once (no transaction, so no write lock, survives a failure: `kill`
//! can write its audit row beside it), the ticks not written become one `write-failed` gap
//! stored with the next tick written, and writing resumes when it can. A wall-clock step never stops it either: the history keeps increasing times with
//! the spacing the monotonic clock measured and records the step as a `clock-step` gap
//! (`vramctl_store::HistoryClock`), also when the history's last sample is in the future
//! at start (it used to exit 2 there: a crash loop under systemd). Intervals, backoffs and
//! `--duration` are on the monotonic clock. It stops on SIGINT/SIGTERM, `--duration`, or
//! the test-only `--ticks`, flushes, and exits 0. Exit 2: bad flags, or a database it
//! cannot open (not ours, newer, corrupt, unwritable, another recorder holds it) or that
//! fails in a way retrying cannot fix.
//!
//! Test-only flags (hidden from `--help`): `--ticks N` stops after N samples;
//! `--simulated-clock UNIX_MS` makes time start there and move by `--interval` per sample
//! without waiting (with the fake NVML's `step` clock, runs are deterministic and instant),
//! and `--simulated-clock-step AT_MS:BY_MS` steps its wall clock as NTP would;
//! `--max-db-pages N` caps the database size to reach "disk full" without a small
//! filesystem. At debug level (`VRAMCTL_LOG=vramctl=debug`) every committed tick is logged
//! as `Committed a tick. t_ms=…`, which the crash test relies on.

use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;
use vramctl_agent::agent_poll;
use vramctl_core::clock::{Clock, ClockTime, ManualClock, SystemClock};
use vramctl_gpu::Backend;
use vramctl_gpu::sampler::SessionHealth;
use vramctl_observe::daemon_socket::server::{
    self as socket, DaemonSettings, DaemonSocket, SharedSampler,
};
use vramctl_procs::process_catalog::{FactsSource, RefreshPolicy};
use vramctl_store::{OpenMode, Retention, Store, TickSample, add_agent_figures, device_samples};

use vramctl_observe::live_loop::{
    LiveSampler, clock_of, open_backend, sampler_on, simulated_clock, stop_signals, wait_next_tick,
};

use super::db_path;
use crate::cli::{GlobalArgs, RecordArgs};
use crate::exit::Exit;
use vramctl_history::recorder::{CPU_EVERY_MS, Procs, StoreFeed, channel_capacity, session};
use vramctl_observe::observation::{Observer, ObserverBuilder};

/// NVML init retry backoff.
const BACKOFF_FIRST_MS: i64 = 1_000;
const BACKOFF_MAX_MS: i64 = 300_000;

/// Runs `record`.
pub fn run(global: &GlobalArgs, args: &RecordArgs) -> anyhow::Result<Exit> {
    let interval_ms = crate::cmd::millis(args.interval);
    let duration_ms = args.duration.map(crate::cmd::millis);
    let retention: Retention = args.retain.parse()?;
    let path = db_path(global)?;
    let mut store = Store::open(&path, OpenMode::Append)?;
    if let Some(pages) = args.max_db_pages {
        store.set_max_page_count(pages)?;
    }
    store.begin_session(&session("record", interval_ms))?;
    tracing::info!(db = %path.display(), interval_ms, retain = %args.retain, "Recording.");

    let signals = stop_signals()?;
    // Simulated time does not wait between ticks: the sampler waits for the writer
    // instead, so a test run is complete and deterministic.
    let mut feed = StoreFeed::start(
        store,
        retention,
        interval_ms,
        channel_capacity(interval_ms),
        args.simulated_clock.is_some(),
    )?;

    let manual = simulated_clock(args.simulated_clock, &args.simulated_clock_step);
    let clock: Box<dyn Clock> = match &manual {
        Some(m) => Box::new(m.clone()),
        None => Box::new(SystemClock),
    };
    let mut recorder = Recorder {
        global,
        manual: manual.clone(),
        sampler: SharedSampler::default(),
        init_error: None,
        next_init_ms: i64::MIN,
        backoff_ms: BACKOFF_FIRST_MS,
        health: SessionHealth::new(interval_ms, BACKOFF_MAX_MS),
        procs: Procs::new(),
        observer: recording_observer().build(),
    };
    // `status`, `ps` and `top` ask this recorder's sampler instead of starting NVML.
    let socket = DaemonSocket::start(
        Arc::clone(&recorder.sampler),
        DaemonSettings {
            daemon: "record",
            facts: FactsSource::Proc,
            containers_socket: args.containers_socket,
        },
    );
    let started = Instant::now();
    // On the monotonic clock: a wall-clock step does not shorten or lengthen --duration.
    let first_ms = clock.monotonic_ms();
    let mut ticks: u64 = 0;
    let mut writer_gone = false;
    loop {
        let (tick, at) = recorder.tick(clock.as_ref());
        if !feed.send(tick, at.monotonic_ms) {
            writer_gone = true;
            break;
        }
        ticks += 1;
        if args.ticks.is_some_and(|n| ticks >= n)
            || duration_ms
                .is_some_and(|d| at.monotonic_ms.saturating_sub(first_ms) + interval_ms > d)
        {
            break;
        }
        let stop = wait_next_tick(manual.as_ref(), &signals, started, ticks, interval_ms);
        if stop {
            tracing::info!("Stopping on a signal.");
            break;
        }
    }
    drop(socket);
    feed.finish()?;
    if writer_gone {
        bail!("the writer stopped unexpectedly");
    }
    tracing::info!(ticks, "Stopped.");
    Ok(Exit::Ok)
}

/// The sampling side: NVML (retried), /proc enrichment, timestamps.
struct Recorder<'a> {
    global: &'a GlobalArgs,
    manual: Option<ManualClock>,
    /// Shared with the local socket, which makes an extra tick for each request.
    sampler: SharedSampler,
    init_error: Option<String>,
    /// When the next init attempt is due, on the monotonic clock (a wall-clock step back
    /// must not put it off by the length of the step).
    next_init_ms: i64,
    backoff_ms: i64,
    /// Whether the NVML session still works.
    health: SessionHealth,
    procs: Procs,
    /// What /proc says about the GPU processes (its observations mapped by `procs`), and
    /// their agents, asked every 10 s of the snapshots' time (`vramctl_agent::agent_poll`),
    /// not every tick.
    observer: Observer,
}

/// How a recorder (`record`, `run --record`) reads processes: only the GPU processes (the
/// history keeps no ancestors), their CPU time read as often as the history stores it
/// (`CPU_EVERY_MS`), not every second.
pub fn recording_observer() -> ObserverBuilder {
    Observer::builder().ancestors(false).refresh(RefreshPolicy {
        stat_every_ms: CPU_EVERY_MS,
        ..RefreshPolicy::default()
    })
}

impl Recorder<'_> {
    /// One tick and when it was read.
    fn tick(&mut self, clock: &dyn Clock) -> (TickSample, ClockTime) {
        let now = clock.now();
        let shared = Arc::clone(&self.sampler);
        let mut slot = socket::lock(&shared);
        if slot.is_none() && now.monotonic_ms >= self.next_init_ms {
            *slot = self.start_nvml(now.monotonic_ms);
        }
        let (mut sample, at, snapshot) = match slot.as_mut() {
            Some(sampler) => {
                let snapshot = sampler.tick();
                let backend = sampler.backend_mut();
                // The observer and `Procs` pace their /proc reads by differences of this
                // time: monotonic. The agents are asked below, outside the lock.
                let observation = self
                    .observer
                    .observe_processes(snapshot, |pid| backend.process_name(pid));
                let processes = self.procs.update_observed(
                    &observation,
                    self.observer.boot_id(),
                    self.observer.ticks_per_second(),
                );
                let snapshot = observation.snapshot;
                let at = ClockTime {
                    unix_ms: snapshot.taken_at_unix_ms,
                    monotonic_ms: snapshot.monotonic_ms,
                };
                let lost = sampler.session_lost().map(str::to_owned);
                if let Some(reason) = self.health.check(&snapshot, lost.is_some()) {
                    let why = lost.unwrap_or_else(|| "every GPU failed".to_owned());
                    tracing::warn!(reason = reason.as_str(), error = %why, "NVML stopped answering; starting a new session.");
                    // Dropping the sampler shuts its session down; the next tick opens one.
                    *slot = None;
                    self.next_init_ms = at.monotonic_ms;
                    self.init_error = Some(format!("NVML is being reopened: {why}"));
                }
                (
                    TickSample {
                        at_unix_ms: snapshot.taken_at_unix_ms,
                        unavailable: None,
                        devices: device_samples(&snapshot),
                        processes,
                    },
                    at,
                    Some(snapshot),
                )
            }
            None => (
                TickSample {
                    at_unix_ms: now.unix_ms,
                    unavailable: Some(
                        self.init_error
                            .clone()
                            .unwrap_or_else(|| "NVML did not start".into()),
                    ),
                    ..TickSample::default()
                },
                now,
                None,
            ),
        };
        // Outside the sampler's lock: a slow agent must not hold up the local socket.
        drop(slot);
        if let Some(snapshot) = &snapshot {
            self.observer.refresh_agents(snapshot);
            if let Some(poll) = self.observer.agent_poll() {
                add_agent_figures(&mut sample.devices, &agent_poll::figures(poll, snapshot));
            }
        }
        (sample, at)
    }

    /// Starts NVML, or schedules the next attempt.
    fn start_nvml(&mut self, now: i64) -> Option<LiveSampler> {
        let opened = open_backend(&self.global.backends())
            .map_err(|e| format!("{e}; {}", e.hint()))
            .and_then(|backend| {
                sampler_on(backend, clock_of(self.manual.as_ref()), true)
                    .map_err(|e| format!("cannot list the GPUs: {e}"))
            });
        match opened {
            Ok(sampler) => {
                tracing::info!(
                    gpus = sampler.devices().len(),
                    driver = sampler.driver().driver_version.as_deref().unwrap_or("?"),
                    "NVML started."
                );
                self.init_error = None;
                self.backoff_ms = BACKOFF_FIRST_MS;
                Some(sampler)
            }
            Err(err) => {
                tracing::warn!(error = %err, retry_in_ms = self.backoff_ms, "NVML did not start; retrying.");
                self.init_error = Some(err);
                self.next_init_ms = now.saturating_add(self.backoff_ms);
                self.backoff_ms = (self.backoff_ms * 2).min(BACKOFF_MAX_MS);
                None
            }
        }
    }
}
