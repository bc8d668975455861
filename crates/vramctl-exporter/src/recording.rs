//! `serve --record`: the history recorder as a [`TickConsumer`] of the exporter's sampler.
//!
//! The same writer as `vramctl record` (`vramctl_history::recorder`): each snapshot, with its
//! processes' identity, metadata and CPU time, goes over a bounded channel to a writer
//! thread that owns the store, so a slow disk never delays the sampler or a scrape; ticks
//! dropped while the writer is behind become a gap. Ticks in which NVML is down are
//! recorded as a gap with the reason, as `record` does. The store is opened (and its
//! single-writer lock taken) before the daemon serves anything; it is flushed and
//! checkpointed when the sampler stops. While writes fail (a full disk), `/healthz` says so
//! from the writer's [`WriterHealth`].

use std::sync::Arc;

use vramctl_core::clock::ClockTime;
use vramctl_observe::observation::{Observation, Observer};
use vramctl_store::{TickSample, add_agent_figures, device_samples};

use super::collector::TickConsumer;
use super::metadata::ProcessMetadata;
use super::render::ProcessVerdicts;
use vramctl_history::recorder::{Procs, StoreFeed, WriterHealth};

/// Records every tick into the history store.
#[derive(Debug)]
pub struct HistoryRecorder {
    feed: StoreFeed,
    procs: Procs,
    /// The writer stopped on an error; said once, then ticks are no longer sent.
    stopped: bool,
}

impl HistoryRecorder {
    /// A recorder writing through `feed`, enriching processes with `procs`.
    pub fn new(feed: StoreFeed, procs: Procs) -> Self {
        Self {
            feed,
            procs,
            stopped: false,
        }
    }

    /// What the history writer is doing, for `/healthz`.
    pub fn writer_health(&self) -> Arc<WriterHealth> {
        self.feed.health()
    }

    fn send(&mut self, tick: TickSample, monotonic_ms: i64) {
        if self.stopped {
            return;
        }
        if !self.feed.send(tick, monotonic_ms) {
            self.stopped = true;
            // The writer logged its error; say what it means for the daemon.
            tracing::error!(
                "The history writer stopped; metrics are still served, history is not recorded."
            );
        }
    }
}

impl TickConsumer for HistoryRecorder {
    fn on_snapshot(
        &mut self,
        observation: &Observation,
        observer: &Observer,
        metadata: &ProcessMetadata,
        _verdicts: &mut ProcessVerdicts,
    ) {
        // The collector's observer read /proc for this snapshot already (and asked the driver
        // to name what /proc cannot see): `Procs` reads nothing more. It paces the CPU
        // readings by the snapshot's time, monotonic.
        let snapshot = &observation.snapshot;
        let processes = self.procs.update_observed(
            observation,
            observer.boot_id(),
            observer.ticks_per_second(),
        );
        let mut devices = device_samples(snapshot);
        // The agents' figures the collector polled for this tick's rendering.
        add_agent_figures(&mut devices, &metadata.agents);
        self.send(
            TickSample {
                at_unix_ms: snapshot.taken_at_unix_ms,
                unavailable: None,
                devices,
                processes,
            },
            snapshot.monotonic_ms,
        );
    }

    fn on_no_snapshot(&mut self, at: ClockTime, reason: &str) {
        self.send(
            TickSample {
                at_unix_ms: at.unix_ms,
                unavailable: Some(reason.to_owned()),
                ..TickSample::default()
            },
            at.monotonic_ms,
        );
    }

    fn finish(&mut self) {
        match self.feed.finish() {
            Ok(()) => tracing::info!("History flushed."),
            Err(err) => tracing::error!(error = %format!("{err:#}"), "The history writer failed."),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use std::sync::Arc;

    use vramctl_core::types::{
        DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, MemoryReading,
        ProcessKind, ProcessUsage, Snapshot,
    };
    use vramctl_store::{Metric, OpenMode, Retention, Store, TimeRange};

    use super::*;
    use vramctl_procs::process_catalog::LiveProc;

    fn snapshot(at_ms: i64, used: u64, pid: u32) -> Arc<Snapshot> {
        Arc::new(Snapshot {
            taken_at_unix_ms: at_ms,
            monotonic_ms: at_ms,
            driver: Arc::new(DriverInfo::default()),
            devices: vec![DeviceSnapshot {
                info: Arc::new(DeviceInfo {
                    index: 0,
                    uuid: "GPU-a".into(),
                    name: Some("NVIDIA H200".into()),
                    pci_bus_id: None,
                    minor_number: None,
                    mig_enabled: None,
                    mig_instances: Vec::new(),
                }),
                state: DeviceState::Ok(DeviceReading {
                    memory: Some(MemoryReading {
                        total_bytes: 100 << 30,
                        used_bytes: used,
                        reserved_bytes: 0,
                        free_bytes: (100 << 30) - used,
                    }),
                    processes: Some(vec![ProcessUsage {
                        pid,
                        used_bytes: Some(used),
                        kind: ProcessKind::Compute,
                        gpu_instance_id: None,
                        compute_instance_id: None,
                    }]),
                    missing: BTreeMap::new(),
                    ..DeviceReading::default()
                }),
            }],
            unopened: Vec::new(),
        })
    }

    /// A history recorder writing to a new history at `path`, and an observer of this /proc
    /// (no boot id, no agents).
    fn recorder_on(path: &std::path::Path) -> (HistoryRecorder, Observer) {
        let store = Store::open(path, OpenMode::Append).unwrap();
        let feed = StoreFeed::start(store, Retention::default(), 1000, 8, true).unwrap();
        let observer = Observer::builder()
            .proc_source(None, Box::new(LiveProc::new()))
            .agents(None)
            .ancestors(false)
            .build();
        (HistoryRecorder::new(feed, Procs::new()), observer)
    }

    #[test]
    fn snapshots_and_nvml_outages_are_recorded_and_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let (mut recorder, mut observer) = recorder_on(&path);
        let me = std::process::id();
        let t0 = 1_764_000_000_000;
        let mut verdicts = ProcessVerdicts::new();
        let metadata = ProcessMetadata::default();
        recorder.on_no_snapshot(
            ClockTime {
                unix_ms: t0,
                monotonic_ms: t0,
            },
            "NVML did not start: no driver",
        );
        for i in 1..=3 {
            let observation = observer.observe(
                (*snapshot(t0 + i * 1000, (i as u64) << 30, me)).clone(),
                |_| None,
            );
            recorder.on_snapshot(&observation, &observer, &metadata, &mut verdicts);
        }
        recorder.finish();

        let mut store = Store::open(&path, OpenMode::ReadOnly).unwrap();
        let gaps: Vec<_> = store
            .gaps(TimeRange::ALL)
            .unwrap()
            .into_iter()
            .filter(|g| g.device_uuid.is_none())
            .collect();
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        assert_eq!(gaps[0].reason, "NVML did not start: no driver");
        assert_eq!((gaps[0].from_ms, gaps[0].to_ms), (t0, t0 + 1000));
        let device = store.devices().unwrap()[0].id;
        let used: Vec<u64> = store
            .device_metric(device, Metric::UsedBytes, TimeRange::ALL)
            .unwrap()
            .iter()
            .map(|p| p.last)
            .collect();
        assert_eq!(used, [1 << 30, 2 << 30, 3 << 30]);
        // Our own process, with the identity and metadata /proc gives.
        let processes = store.processes_in(TimeRange::ALL).unwrap();
        assert_eq!(processes.len(), 1);
        let meta = &processes[0].0.meta;
        assert_eq!(meta.key.pid, me);
        assert!(meta.key.start_time_ticks.is_some());
        assert!(meta.command.is_some());
        let cpu = store
            .process_cpu(processes[0].0.id, TimeRange::ALL)
            .unwrap();
        assert!(!cpu.is_empty(), "CPU time is recorded");
    }

    #[test]
    fn serve_record_stores_the_agent_figures_the_collector_polled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let (mut recorder, mut observer) = recorder_on(&path);
        let me = std::process::id();
        let t0 = 1_764_000_000_000;
        let mut metadata = ProcessMetadata::default();
        metadata.agents.insert(
            ("GPU-a".into(), me),
            vramctl_agent::agent_poll::DeviceMemory {
                allocated_bytes: Some(1 << 20),
                reserved_bytes: Some(3 << 20),
            },
        );
        let observation = observer.observe((*snapshot(t0, 1 << 30, me)).clone(), |_| None);
        recorder.on_snapshot(
            &observation,
            &observer,
            &metadata,
            &mut ProcessVerdicts::new(),
        );
        recorder.finish();
        let mut store = Store::open(&path, OpenMode::ReadOnly).unwrap();
        let device = store.devices().unwrap()[0].id;
        let process = store.processes_in(TimeRange::ALL).unwrap()[0].0.id;
        let last = |store: &mut Store, metric| {
            store
                .process_device_metric(process, device, metric, TimeRange::ALL)
                .unwrap()
                .iter()
                .map(|p| p.last)
                .collect::<Vec<u64>>()
        };
        assert_eq!(last(&mut store, Metric::ProcessAllocatedBytes), [1 << 20]);
        assert_eq!(last(&mut store, Metric::ProcessReservedBytes), [3 << 20]);
    }
}
