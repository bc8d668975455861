//! `vramctl_oom_total{cause}`: the OOMs the processes' agents report, by cause (issue 33).
//!
//! The agents' `stats` answers (polled by the observer, every 10 s) carry each device's
//! `num_ooms`. When a process's count rises, the rise is counted: its first OOM by the cause
//! the snapshot classifier gives (`vramctl_snapshot::observed_oom`) on the snapshot its
//! agent kept at that OOM, read over the agent's socket (`oom` op) by one background thread
//! (a snapshot can be hundreds of MB: never on the sampler's thread); the agent keeps one
//! snapshot per process, so its later OOMs, and any that cannot be classified (no snapshot,
//! an agent that stopped answering), count as `unknown`. A classification waits in a
//! bounded queue; one that does not fit is `unknown` at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::Duration;

use vramctl_agent::agent_client::{AgentClient, Timeouts};
use vramctl_agent::agent_poll::AgentPoll;
use vramctl_core::types::Snapshot;
use vramctl_snapshot::observed_oom;

/// The label values, every one exported from 0 (so `increase()` sees the first).
pub const CAUSES: [&str; 7] = [
    "shortage",
    "fragmentation",
    "other-process",
    "process-limit",
    "cached-elsewhere",
    "leak",
    "unknown",
];

/// Classifications waiting for the worker.
const QUEUE: usize = 16;
/// The largest snapshot read from an agent (what the agent keeps at most).
const MAX_SNAPSHOT_BYTES: u64 = 256 << 20;
/// Reading it over the socket, in all.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(60);

/// How one process's first OOM is classified (the agent's, or a test's).
pub type ClassifyFn = dyn Fn(u32) -> &'static str + Send;

/// The counter and its worker.
pub struct OomCauses {
    /// Per PID: the OOMs counted so far.
    counted: HashMap<u32, u64>,
    totals: BTreeMap<&'static str, u64>,
    queue: SyncSender<u32>,
    results: Receiver<&'static str>,
}

impl std::fmt::Debug for OomCauses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OomCauses")
            .field("totals", &self.totals)
            .finish_non_exhaustive()
    }
}

impl Default for OomCauses {
    fn default() -> Self {
        Self::with_classifier(Box::new(classify_through_agent))
    }
}

impl OomCauses {
    /// A counter whose worker classifies with `classify`.
    pub fn with_classifier(classify: Box<ClassifyFn>) -> Self {
        let (queue, jobs) = std::sync::mpsc::sync_channel::<u32>(QUEUE);
        let (done, results) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("vramctl-oom-causes".into())
            .spawn(move || {
                for pid in jobs {
                    if done.send(classify(pid)).is_err() {
                        return;
                    }
                }
            });
        if let Err(err) = spawned {
            // Without the worker every send fails and counts as unknown.
            tracing::warn!(%err, "No thread to classify OOMs: they count as unknown.");
        }
        Self {
            counted: HashMap::new(),
            totals: CAUSES.iter().map(|c| (*c, 0)).collect(),
            queue,
            results,
        }
    }

    /// Counts the rises of the listed processes' OOM counters, and the causes the worker
    /// has found since the last call.
    pub fn update(&mut self, snapshot: &Snapshot, poll: &AgentPoll) {
        let listed: Vec<u32> = snapshot
            .devices
            .iter()
            .filter_map(|d| d.reading())
            .filter_map(|r| r.processes.as_ref())
            .flatten()
            .map(|p| p.pid)
            .collect();
        self.counted.retain(|pid, _| listed.contains(pid));
        for pid in listed {
            let Some(stats) = poll.stats(pid) else {
                continue;
            };
            let ooms = stats
                .devices
                .iter()
                .filter_map(|d| d.ooms)
                .fold(0u64, u64::saturating_add);
            let before = self.counted.get(&pid).copied().unwrap_or(0);
            if ooms <= before {
                // A fall is a new process at the PID (its agent's counters start at 0).
                self.counted.insert(pid, ooms.min(before));
                continue;
            }
            self.counted.insert(pid, ooms);
            let mut rise = ooms - before;
            if before == 0 {
                rise -= 1;
                if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
                    self.queue.try_send(pid)
                {
                    rise += 1;
                }
            }
            *self.totals.entry("unknown").or_insert(0) += rise;
        }
        while let Ok(cause) = self.results.try_recv() {
            *self.totals.entry(cause).or_insert(0) += 1;
        }
    }

    /// The counts by cause.
    pub fn totals(&self) -> &BTreeMap<&'static str, u64> {
        &self.totals
    }
}

/// Asks `pid`'s agent for its OOM record and snapshot, and classifies it.
fn classify_through_agent(pid: u32) -> &'static str {
    let timeouts = Timeouts {
        quick: Duration::from_secs(2),
        reclaim: Duration::from_secs(2),
    };
    let verdict = AgentClient::connect(pid, timeouts)
        .map_err(|e| e.to_string())
        .and_then(|mut client| {
            let record = client
                .oom()
                .map_err(|e| e.to_string())?
                .oom
                .ok_or("no OOM record")?;
            let bytes = client
                .oom_snapshot(MAX_SNAPSHOT_BYTES, SNAPSHOT_TIMEOUT)
                .map_err(|e| e.to_string())?;
            let observed = observed_oom::Observed {
                device: record.device.unwrap_or(0),
                segment_bytes: record.segment_bytes.ok_or("no segment size")?,
                device_free_bytes: record.device_free_bytes,
                device_total_bytes: record.device_total_bytes,
                unix_ms: record.unix_ms,
            };
            observed_oom::verdict(&bytes, observed)
        });
    match verdict {
        Ok(event) => event.verdict.cause.as_str(),
        Err(err) => {
            tracing::debug!(pid, %err, "An OOM could not be classified.");
            "unknown"
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use vramctl_agent::agent_client::Stats;
    use vramctl_agent::agent_poll::{PollLimits, Polled};
    use vramctl_core::types::{
        DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, ProcessKind,
        ProcessUsage,
    };

    use super::*;

    fn listing(pids: &[u32]) -> Snapshot {
        Snapshot {
            taken_at_unix_ms: 0,
            monotonic_ms: 0,
            driver: Arc::new(DriverInfo {
                driver_version: None,
                nvml_version: None,
                cuda_driver_version: None,
            }),
            devices: vec![DeviceSnapshot {
                info: Arc::new(DeviceInfo {
                    index: 0,
                    uuid: "GPU-a".into(),
                    name: None,
                    pci_bus_id: None,
                    minor_number: None,
                    mig_enabled: None,
                    mig_instances: Vec::new(),
                }),
                state: DeviceState::Ok(DeviceReading {
                    processes: Some(
                        pids.iter()
                            .map(|pid| ProcessUsage {
                                pid: *pid,
                                used_bytes: Some(1),
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

    fn stats(ooms: u64) -> Stats {
        serde_json::from_value(serde_json::json!({
            "taken_at": 0.0,
            "devices": [{"framework": "torch", "index": 0, "ooms": ooms}],
        }))
        .expect("stats")
    }

    /// Waits for the worker's answers to arrive (it runs on its own thread).
    fn settle(causes: &mut OomCauses, snapshot: &Snapshot, poll: &AgentPoll, want: u64) {
        let started = Instant::now();
        loop {
            causes.update(snapshot, poll);
            let classified: u64 = causes
                .totals()
                .iter()
                .filter(|(c, _)| **c != "unknown")
                .map(|(_, n)| n)
                .sum();
            if classified >= want || started.elapsed() > Duration::from_secs(10) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_process_s_first_oom_gets_its_cause_and_later_ones_count_as_unknown() {
        let ooms = Arc::new(Mutex::new(HashMap::from([(10u32, 0u64), (20, 0)])));
        let asked = Arc::new(AtomicU64::new(0));
        let table = Arc::clone(&ooms);
        let mut poll = AgentPoll::with_ask(
            PollLimits {
                cadence: Duration::ZERO,
                ..PollLimits::default()
            },
            Box::new(move |pid, _| table.lock().ok()?.get(&pid).map(|n| stats(*n))),
        );
        let counter = Arc::clone(&asked);
        let mut causes = OomCauses::with_classifier(Box::new(move |pid| {
            counter.fetch_add(1, Ordering::SeqCst);
            if pid == 10 {
                "fragmentation"
            } else {
                "other-process"
            }
        }));
        let snapshot = listing(&[10, 20]);
        let polled = [10, 20].map(|pid| Polled {
            pid,
            start_time_ticks: None,
        });
        let mut now = 0;
        let mut tick = |poll: &mut AgentPoll| {
            now += 1000;
            poll.refresh_at_ms(now, &polled);
        };
        tick(&mut poll);
        causes.update(&snapshot, &poll);
        assert!(
            causes.totals().values().all(|n| *n == 0),
            "{:?}",
            causes.totals()
        );
        assert_eq!(causes.totals().len(), CAUSES.len());
        // Process 10: three OOMs between two polls; process 20: one.
        ooms.lock().expect("lock").extend([(10, 3), (20, 1)]);
        tick(&mut poll);
        settle(&mut causes, &snapshot, &poll, 2);
        let totals = causes.totals();
        assert_eq!(totals["fragmentation"], 1);
        assert_eq!(totals["other-process"], 1);
        assert_eq!(totals["unknown"], 2);
        // Unchanged counters count nothing more, and nobody is asked again.
        tick(&mut poll);
        settle(&mut causes, &snapshot, &poll, 2);
        assert_eq!(causes.totals()["unknown"], 2);
        assert_eq!(asked.load(Ordering::SeqCst), 2);
        // A new process at PID 10 (its counter fell) has its own first OOM.
        ooms.lock().expect("lock").insert(10, 0);
        tick(&mut poll);
        causes.update(&snapshot, &poll);
        ooms.lock().expect("lock").insert(10, 1);
        tick(&mut poll);
        settle(&mut causes, &snapshot, &poll, 3);
        assert_eq!(causes.totals()["fragmentation"], 2);
        assert_eq!(causes.totals()["unknown"], 2);
    }
}
