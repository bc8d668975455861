//! The sampler thread: one collection per `--interval`, whatever NVML does.
//!
//! Each tick, in order:
//! 1. [`NvmlSource::sample`]: a snapshot, or none while NVML is down (init retried with
//!    backoff);
//! 2. [`Stats::observe`]: error counters and the used-memory peak window;
//! 3. the [`Observer`] (`vramctl_observe::observation`, the one every frontend reads
//!    through) joins the snapshot with /proc into an [`Observation`], and the labels are
//!    made from it ([`ProcessMetadata::from_observation`]): user, command, container and
//!    pod, /proc read once per process identity;
//! 4. the processes' agents, asked by the observer's agent poll at its own cadence on the
//!    snapshots' time, within a budget per agent and per tick (`vramctl_agent::agent_poll`;
//!    only with `--process-details proc`, which may read /proc): allocated and reserved
//!    bytes per (GPU, process);
//! 5. the [`TickConsumer`]s, in the order added: the leak and idle analysis
//!    (`crate::live_verdicts`), which fills the [`ProcessVerdicts`] it is handed before
//!    rendering, and the history recorder (`serve --record`, `crate::recording`);
//! 6. [`render`] in both formats, published to the [`Cache`] that scrapes read.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use vramctl_agent::agent_poll::{self, AgentFigures};
use vramctl_core::clock::{Clock, ClockTime, ManualClock, SystemClock};
use vramctl_core::types::Snapshot;
use vramctl_observe::observation::{Observation, Observer};

use super::cache::{Cache, Published};
use super::metadata::{DetailsSource, ProcessMetadata};
use super::owner_series::JobPeaks;
use super::render::{Format, ProcessVerdicts, RenderOptions, render};
use super::source::NvmlSource;
use super::stats::Stats;

/// Something that receives every snapshot on the sampler thread, after the process labels
/// are known and before the metrics are rendered. Must not block: hand slow work (a
/// database write) to a thread of its own.
pub trait TickConsumer: Send {
    /// Called once per tick in which NVML answered, with its observation (what /proc
    /// says, read once for every consumer), the observer that made it, and the labels.
    fn on_snapshot(
        &mut self,
        observation: &Observation,
        observer: &Observer,
        metadata: &ProcessMetadata,
        verdicts: &mut ProcessVerdicts,
    );

    /// Called once per tick in which NVML is down (not started yet, failing to start, or
    /// being reopened), at `at` (wall and monotonic), with the reason. The recorder records
    /// it as a gap.
    fn on_no_snapshot(&mut self, at: ClockTime, reason: &str) {
        let _ = (at, reason);
    }

    /// Called once when the sampler stops (the daemon is shutting down): flush.
    fn finish(&mut self) {}
}

/// How the sampler thread collects.
#[derive(Debug, Clone)]
pub struct CollectorConfig {
    /// `--backend`, `--nvml-lib`.
    pub backends: vramctl_observe::live_loop::BackendOptions,
    /// `--interval`.
    pub interval: Duration,
    /// `--peak-window`.
    pub peak_window: Duration,
    /// `--process-details`.
    pub details: DetailsSource,
    /// `--max-process-series`.
    pub render: RenderOptions,
    /// Test only (`--simulated-clock`): snapshots are timed by this clock, which moves by
    /// `interval` per sample, and samples follow each other without waiting.
    pub simulated_clock: Option<ManualClock>,
    /// Test only (`--ticks`): stop sampling after this many samples, keep serving the last;
    /// `ready` is sent after the last of them.
    pub ticks: Option<u64>,
}

/// The observer of the processes `details` lets the exporter read: /proc and the agents
/// with `proc`; only the driver's names otherwise (no agent is asked: asking one reaches
/// into the process). Only the listed processes: the labels name no ancestors.
fn observer_for(details: DetailsSource) -> Observer {
    let builder = Observer::builder()
        .facts(details.facts_source())
        .ancestors(false);
    if details == DetailsSource::Proc {
        builder.build()
    } else {
        builder.agents(None).build()
    }
}

/// What one exposition is rendered from.
struct Rendered<'a> {
    snapshot: Option<&'a Snapshot>,
    metadata: &'a ProcessMetadata,
    verdicts: &'a ProcessVerdicts,
    agents: &'a AgentFigures,
    stats: &'a Stats,
    options: &'a RenderOptions,
}

/// Renders both formats and publishes them to `cache`.
fn publish(cache: &Cache, what: Rendered<'_>, starting: bool) {
    let render_one = |format| {
        Bytes::from(render(
            what.snapshot,
            what.metadata,
            what.verdicts,
            what.agents,
            what.stats,
            what.options,
            format,
        ))
    };
    cache.publish(Published {
        prometheus: render_one(Format::Prometheus),
        openmetrics: render_one(Format::OpenMetrics),
        at: Instant::now(),
        starting,
    });
}

/// Everything the sampler thread owns.
pub struct Collector {
    config: CollectorConfig,
    clock: Arc<dyn Clock>,
    source: NvmlSource,
    /// The processes NVML lists, with what /proc says about them, and their agents' last
    /// answers (no agents without `--process-details proc`): the labels, the live analysis
    /// and `serve --record` all read its observations.
    observer: Observer,
    stats: Stats,
    /// Each Slurm job's peak per GPU since it was first seen (`vramctl_job_memory_used_max_bytes`).
    job_peaks: JobPeaks,
    verdicts: ProcessVerdicts,
    /// The agents' OOMs by cause (`vramctl_oom_total`).
    oom_causes: crate::oom_causes::OomCauses,
    consumers: Vec<Box<dyn TickConsumer>>,
    cache: Arc<Cache>,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("config", &self.config)
            .field("source", &self.source)
            .field("consumers", &self.consumers.len())
            .finish_non_exhaustive()
    }
}

impl Collector {
    /// A collector publishing into `cache`. NVML is opened on the first tick.
    pub fn new(config: CollectorConfig, cache: Arc<Cache>) -> Self {
        let clock: Arc<dyn Clock> = match &config.simulated_clock {
            Some(manual) => Arc::new(manual.clone()),
            None => Arc::new(SystemClock),
        };
        Self {
            source: NvmlSource::new(config.backends.clone(), config.interval, Arc::clone(&clock)),
            clock,
            observer: observer_for(config.details),
            stats: Stats::new(config.peak_window),
            job_peaks: JobPeaks::new(),
            verdicts: ProcessVerdicts::new(),
            oom_causes: crate::oom_causes::OomCauses::default(),
            consumers: Vec::new(),
            cache,
            config,
        }
    }

    /// The sampler, shared with the local socket that answers `status` and `ps`.
    pub fn shared_sampler(&self) -> vramctl_observe::daemon_socket::server::SharedSampler {
        self.source.shared_sampler()
    }

    /// Adds a consumer of every snapshot (the leak/idle analysis, the recorder).
    pub fn add_consumer(&mut self, consumer: Box<dyn TickConsumer>) {
        self.consumers.push(consumer);
    }

    /// One tick: sample, enrich, hand to the consumers, render, publish.
    pub fn collect_once(&mut self, now: Instant) {
        let started = Instant::now();
        let observation = self.source.sample(now, &mut self.stats).map(|snapshot| {
            self.stats.observe(&snapshot);
            let source = &mut self.source;
            // The observer's time is the snapshot's, monotonic: its refresh policy and the
            // agents' cadence count spans of it, so a simulated clock drives them whole.
            self.observer
                .observe(snapshot, |pid| source.process_name(pid))
        });
        let snapshot = observation.as_ref().map(|o| &o.snapshot);
        let mut metadata = match &observation {
            Some(observation) => {
                ProcessMetadata::from_observation(observation, self.config.details)
            }
            None => ProcessMetadata::default(),
        };
        if let Some(snapshot) = snapshot {
            // Monotonic, as every span the exporter measures.
            self.job_peaks
                .update(&mut metadata.jobs, snapshot.monotonic_ms);
        }
        metadata.agents = match (snapshot, self.observer.agent_poll()) {
            (Some(snapshot), Some(poll)) => agent_poll::figures(poll, snapshot),
            _ => AgentFigures::new(),
        };
        if let (Some(observation), Some(_)) = (&observation, self.observer.agent_poll()) {
            self.oom_causes.update(&observation.ooms);
            self.stats
                .ooms_by_cause
                .clone_from(self.oom_causes.totals());
        }
        match &observation {
            Some(observation) => {
                for consumer in &mut self.consumers {
                    consumer.on_snapshot(
                        observation,
                        &self.observer,
                        &metadata,
                        &mut self.verdicts,
                    );
                }
            }
            None if !self.consumers.is_empty() => {
                let at = self.clock.now();
                let reason = self.source.down_reason().unwrap_or("NVML did not start");
                for consumer in &mut self.consumers {
                    consumer.on_no_snapshot(at, reason);
                }
            }
            None => {}
        }
        self.stats.samples_total += 1;
        self.stats.sample_duration = started.elapsed();
        publish(
            &self.cache,
            Rendered {
                snapshot: snapshot.map(|s| &**s),
                metadata: &metadata,
                verdicts: &self.verdicts,
                agents: &metadata.agents,
                stats: &self.stats,
                options: &self.config.render,
            },
            false,
        );
    }

    /// Publishes what can be said before the first collection: the exporter's own metrics
    /// with `vramctl_nvml_up 0`, and a `/healthz` that says it is starting. `serve` calls
    /// it before it listens, so HTTP answers even while `nvmlInit` hangs.
    pub fn publish_starting(&self) {
        publish(
            &self.cache,
            Rendered {
                snapshot: None,
                metadata: &ProcessMetadata::default(),
                verdicts: &self.verdicts,
                agents: &AgentFigures::new(),
                stats: &self.stats,
                options: &self.config.render,
            },
            true,
        );
    }

    /// Collects every `interval` until `stop` receives a message or its sender is dropped,
    /// then lets the consumers finish (the recorder flushes); `ready` hears once the first
    /// collection is published (with `ticks`, the last).
    pub fn run(mut self, stop: &Receiver<()>, mut ready: Option<SyncSender<()>>) {
        let interval = self.config.interval;
        let mut next = Instant::now();
        let mut samples: u64 = 0;
        loop {
            self.collect_once(Instant::now());
            samples += 1;
            // With `--ticks` (tests), ready once every sample is in, so that the first
            // scrape already sees them all.
            if self.config.ticks.is_none_or(|n| samples >= n)
                && let Some(ready) = ready.take()
            {
                let _ = ready.send(());
            }
            if self.config.ticks.is_some_and(|n| samples >= n) {
                // Test only: the last sample stays served until the daemon stops.
                let _ = stop.recv();
                break;
            }
            if let Some(clock) = &self.config.simulated_clock {
                clock.advance_ms(i64::try_from(interval.as_millis()).unwrap_or(i64::MAX));
                match stop.try_recv() {
                    Err(std::sync::mpsc::TryRecvError::Empty) => continue,
                    Ok(()) | Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
                }
            }
            next += interval;
            let now = Instant::now();
            if next < now {
                // A tick slower than the interval (a slow driver): skip, do not catch up.
                next = now + interval;
            }
            match stop.recv_timeout(next - now) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        for consumer in &mut self.consumers {
            consumer.finish();
        }
    }

    /// Runs [`Collector::run`] on a thread of its own.
    ///
    /// # Errors
    /// When the thread cannot be started.
    pub fn spawn(
        self,
        stop: Receiver<()>,
        ready: Option<SyncSender<()>>,
    ) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("vramctl-sampler".into())
            .spawn(move || self.run(&stop, ready))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    struct Forward(mpsc::Sender<String>);

    impl TickConsumer for Forward {
        fn on_snapshot(
            &mut self,
            observation: &Observation,
            _: &Observer,
            _: &ProcessMetadata,
            _: &mut ProcessVerdicts,
        ) {
            let _ = self
                .0
                .send(format!("{} devices", observation.snapshot.devices.len()));
        }

        fn on_no_snapshot(&mut self, at: ClockTime, reason: &str) {
            assert!(
                at.unix_ms > 1_700_000_000_000,
                "wall-clock time: {}",
                at.unix_ms
            );
            let _ = self.0.send(format!("down: {reason}"));
        }

        fn finish(&mut self) {
            let _ = self.0.send("finish".into());
        }
    }

    fn config() -> CollectorConfig {
        CollectorConfig {
            backends: vramctl_observe::live_loop::BackendOptions::nvml(Some(
                "/nonexistent/libnvidia-ml.so.1".into(),
            )),
            interval: Duration::from_secs(1),
            peak_window: Duration::from_secs(60),
            details: DetailsSource::None,
            render: RenderOptions {
                max_process_series: 20,
                dcgm: None,
            },
            simulated_clock: None,
            ticks: None,
        }
    }

    #[test]
    fn nvml_down_still_publishes_and_tells_consumers_why() {
        let cache = Arc::new(Cache::new());
        let mut collector = Collector::new(config(), Arc::clone(&cache));
        let (tx, rx) = mpsc::channel();
        collector.add_consumer(Box::new(Forward(tx)));
        assert!(cache.latest().is_none());
        collector.collect_once(Instant::now());
        let published = cache.latest().expect("published");
        let text = String::from_utf8(published.prometheus.to_vec()).expect("utf-8");
        assert!(text.contains("vramctl_nvml_up 0\n"), "{text}");
        assert!(text.contains("vramctl_samples_total 1\n"));
        let told = rx.try_recv().expect("the consumer heard of the tick");
        assert!(
            told.starts_with("down: ") && told.contains("/nonexistent/libnvidia-ml.so.1"),
            "no snapshot, and the reason: {told}"
        );
        assert!(rx.try_recv().is_err(), "once per tick");
    }

    #[test]
    fn run_stops_when_told_and_lets_consumers_finish() {
        let cache = Arc::new(Cache::new());
        let (stop_tx, stop_rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let (tx, rx) = mpsc::channel();
        let mut collector = Collector::new(config(), Arc::clone(&cache));
        collector.add_consumer(Box::new(Forward(tx)));
        let handle = collector.spawn(stop_rx, Some(ready_tx)).expect("thread");
        ready_rx.recv().expect("the first tick is announced");
        stop_tx.send(()).expect("send");
        handle.join().expect("joined");
        assert!(cache.latest().is_some(), "the first tick happens at once");
        let heard: Vec<String> = rx.try_iter().collect();
        assert_eq!(
            heard.last().map(String::as_str),
            Some("finish"),
            "{heard:?}"
        );
    }

    /// Hears the times of ticks without a snapshot.
    struct Times(mpsc::Sender<i64>);

    impl TickConsumer for Times {
        fn on_snapshot(
            &mut self,
            _: &Observation,
            _: &Observer,
            _: &ProcessMetadata,
            _: &mut ProcessVerdicts,
        ) {
        }

        fn on_no_snapshot(&mut self, at: ClockTime, _: &str) {
            let _ = self.0.send(at.unix_ms);
        }
    }

    #[test]
    fn a_simulated_clock_moves_by_the_interval_and_ticks_stop_sampling() {
        let cache = Arc::new(Cache::new());
        let t0 = 1_795_984_291_000;
        let mut collector = Collector::new(
            CollectorConfig {
                simulated_clock: Some(ManualClock::new(t0)),
                ticks: Some(3),
                ..config()
            },
            Arc::clone(&cache),
        );
        let (tx, rx) = mpsc::channel();
        collector.add_consumer(Box::new(Times(tx)));
        let (stop_tx, stop_rx) = mpsc::channel();
        let handle = collector.spawn(stop_rx, None).expect("thread");
        // Three samples without waiting a second between them, then no more.
        let heard: Vec<i64> = rx.iter().take(3).collect();
        assert_eq!(heard, [t0, t0 + 1000, t0 + 2000]);
        stop_tx.send(()).expect("send");
        handle.join().expect("joined");
        assert!(rx.try_recv().is_err(), "sampling stopped after --ticks");
        let published = cache.latest().expect("published");
        let text = String::from_utf8(published.prometheus.to_vec()).expect("utf-8");
        assert!(text.contains("vramctl_samples_total 3\n"), "{text}");
    }
}
