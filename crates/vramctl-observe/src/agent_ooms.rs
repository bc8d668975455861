//! The out-of-memory errors the processes' agents report, with the first one's cause and
//! fix (issue 33's live path, for `top`, the web view, `ps` and `serve`'s counter).
//!
//! The agents' `stats` answers (polled by the [`Observer`](crate::observation::Observer),
//! each agent at most every 10 s) carry each device's `num_ooms`. When a listed process's
//! count first rises, its first OOM is classified by the snapshot classifier
//! (`vramctl_snapshot::observed_oom`) on the snapshot its agent kept at that OOM, read over
//! the agent's socket (`oom` op) by one background thread: a snapshot can be hundreds of
//! MB, so never on the sampler's thread. Until then the process's entry says
//! `classifying`; one that cannot be classified (no snapshot, an agent that stopped
//! answering, a full queue) says `unclassified` and why. The agent keeps one snapshot per
//! process, so its later OOMs are counted, not classified.
//!
//! Bounded: at most [`QUEUE`] classifications wait, one thread reads them (started at the
//! first OOM: nothing before), a snapshot of at most [`MAX_SNAPSHOT_BYTES`] read within
//! [`SNAPSHOT_TIMEOUT`]. Times are the snapshots' (never a clock read here).

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use vramctl_agent::agent_client::{AgentClient, OomRecord, Stats, Timeouts};
use vramctl_agent::agent_poll::AgentPoll;
use vramctl_core::types::Snapshot;
use vramctl_procs::process_catalog::listed_pids;
use vramctl_snapshot::observed_oom;

/// The causes a classified OOM can have (the classifier's words).
pub const CAUSES: [&str; 6] = [
    "shortage",
    "fragmentation",
    "other-process",
    "process-limit",
    "cached-elsewhere",
    "leak",
];

/// Classifications waiting for the worker.
pub const QUEUE: usize = 16;
/// The largest snapshot read from an agent (what the agent keeps at most).
pub const MAX_SNAPSHOT_BYTES: u64 = 256 << 20;
/// Reading it over the socket, in all.
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(60);
/// Connecting to an agent and asking for its OOM record.
const QUICK_TIMEOUT: Duration = Duration::from_secs(2);

/// Where a process's first OOM's classification stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OomState {
    /// The worker is reading the agent's snapshot (or will).
    Classifying,
    /// The classifier gave a cause.
    Classified,
    /// It could not be classified (`why` says why).
    Unclassified,
}

impl OomState {
    /// The word shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Classifying => "classifying",
            Self::Classified => "classified",
            Self::Unclassified => "unclassified",
        }
    }
}

/// The OOMs one process's agent reported, and its first one's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessOoms {
    /// OOMs the process's allocator counted (all its devices).
    pub count: u64,
    /// When the first was seen: the wall time of the snapshot that saw it.
    pub seen_at_unix_ms: i64,
    /// Where the first one's classification stands.
    pub state: OomState,
    /// The first OOM's cause (one of [`CAUSES`]), once classified.
    pub cause: Option<String>,
    /// What would have avoided it (a replay-checked setting); `None` when nothing the
    /// process can set does, or not classified.
    pub fix: Option<String>,
    /// One sentence: the classifier's, with its numbers, or why there is no cause.
    pub why: Option<String>,
    /// When it happened, by the agent's record.
    pub oom_at_unix_ms: Option<i64>,
    /// The CUDA device ordinal, as the process numbers its devices.
    pub device: Option<i64>,
    /// The other processes NVML listed on the process's GPUs in the sample that first saw
    /// the OOM (at most [`MAX_OTHERS`], most memory first): who else held the GPU, for an
    /// `other-process` cause above all. Empty when none did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub others_when_seen: Vec<HeldBeside>,
}

/// Another process on the GPU of a process that ran out of memory: its PID as NVML lists
/// it and its bytes on those GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldBeside {
    pub pid: u32,
    pub used_bytes: u64,
}

/// How many of the others a process's OOM names.
pub const MAX_OTHERS: usize = 5;

/// The processes other than `pid` on the GPUs `snapshot` lists `pid` on, with their bytes
/// there, most first (at most [`MAX_OTHERS`]).
pub fn others_beside(snapshot: &Snapshot, pid: u32) -> Vec<HeldBeside> {
    let mut bytes: BTreeMap<u32, u64> = BTreeMap::new();
    for reading in snapshot.devices.iter().filter_map(|d| d.reading()) {
        let Some(processes) = reading.processes.as_ref() else {
            continue;
        };
        if !processes.iter().any(|p| p.pid == pid) {
            continue;
        }
        for p in processes.iter().filter(|p| p.pid != pid) {
            if let Some(used) = p.used_bytes {
                let entry = bytes.entry(p.pid).or_default();
                *entry = entry.saturating_add(used);
            }
        }
    }
    let mut out: Vec<HeldBeside> = bytes
        .into_iter()
        .map(|(pid, used_bytes)| HeldBeside { pid, used_bytes })
        .collect();
    out.sort_by(|a, b| b.used_bytes.cmp(&a.used_bytes).then(a.pid.cmp(&b.pid)));
    out.truncate(MAX_OTHERS);
    out
}

impl ProcessOoms {
    fn classifying(count: u64, seen_at_unix_ms: i64) -> Self {
        Self {
            count,
            seen_at_unix_ms,
            state: OomState::Classifying,
            cause: None,
            fix: None,
            why: None,
            oom_at_unix_ms: None,
            device: None,
            others_when_seen: Vec::new(),
        }
    }

    fn settle(&mut self, result: Result<Classified, String>) {
        match result {
            Ok(c) => {
                self.state = OomState::Classified;
                self.cause = Some(c.cause.to_owned());
                self.fix = c.fix;
                self.why = Some(c.why);
                self.oom_at_unix_ms = c.oom_at_unix_ms;
                self.device = c.device;
            }
            Err(why) => {
                self.state = OomState::Unclassified;
                self.why = Some(why);
            }
        }
    }
}

/// OOMs by PID: only processes whose agent reported one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentOoms {
    by_pid: BTreeMap<u32, ProcessOoms>,
}

impl AgentOoms {
    /// Records `pid`'s OOMs.
    pub fn insert(&mut self, pid: u32, ooms: ProcessOoms) {
        self.by_pid.insert(pid, ooms);
    }

    /// `pid`'s OOMs, if its agent reported any.
    pub fn get(&self, pid: u32) -> Option<&ProcessOoms> {
        self.by_pid.get(&pid)
    }

    /// Every process with an OOM, by PID.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &ProcessOoms)> {
        self.by_pid.iter().map(|(pid, o)| (*pid, o))
    }

    /// Whether no process reported an OOM.
    pub fn is_empty(&self) -> bool {
        self.by_pid.is_empty()
    }
}

/// What the classifier said of a process's first OOM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified {
    /// One of [`CAUSES`].
    pub cause: &'static str,
    pub fix: Option<String>,
    pub why: String,
    pub oom_at_unix_ms: Option<i64>,
    pub device: Option<i64>,
}

/// How one process's first OOM is classified (through its agent, or a test's stand-in).
pub type ClassifyFn = dyn Fn(u32) -> Result<Classified, String> + Send;

/// One classification job: its id, the process.
type Job = (u64, u32);

struct Worker {
    queue: SyncSender<Job>,
    results: Receiver<(u64, Result<Classified, String>)>,
}

struct Tracked {
    start_time_ticks: Option<u64>,
    job: u64,
    ooms: ProcessOoms,
}

/// The per-process OOM tracker and its worker (the [`Observer`](crate::observation::Observer)
/// owns one when it asks agents).
pub struct OomWatch {
    tracked: HashMap<u32, Tracked>,
    next_job: u64,
    classify: Option<Box<ClassifyFn>>,
    worker: Option<Worker>,
}

impl std::fmt::Debug for OomWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OomWatch")
            .field("tracked", &self.tracked.len())
            .field("worker", &self.worker.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for OomWatch {
    fn default() -> Self {
        Self::with_classifier(Box::new(classify_through_agent))
    }
}

impl OomWatch {
    /// A tracker whose worker classifies with `classify`.
    pub fn with_classifier(classify: Box<ClassifyFn>) -> Self {
        Self {
            tracked: HashMap::new(),
            next_job: 0,
            classify: Some(classify),
            worker: None,
        }
    }

    /// The worker, started at the first OOM (nothing runs before one).
    fn worker(&mut self) -> Option<&Worker> {
        if self.worker.is_none() {
            let classify = self.classify.take()?;
            let (queue, jobs) = std::sync::mpsc::sync_channel::<Job>(QUEUE);
            let (done, results) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name("vramctl-oom-causes".into())
                .spawn(move || {
                    for (job, pid) in jobs {
                        if done.send((job, classify(pid))).is_err() {
                            return;
                        }
                    }
                });
            if let Err(err) = spawned {
                // Without the worker every OOM stays unclassified.
                tracing::warn!(%err, "No thread to classify OOMs.");
                return None;
            }
            self.worker = Some(Worker { queue, results });
        }
        self.worker.as_ref()
    }

    /// The OOMs of `snapshot`'s processes as their agents' last answers in `poll` count
    /// them, `starts` telling who each PID is; queues each process's first OOM for the
    /// worker and takes the classifications it finished. Never blocks.
    pub fn update(
        &mut self,
        snapshot: &Snapshot,
        poll: &AgentPoll,
        starts: &BTreeMap<u32, u64>,
    ) -> AgentOoms {
        let listed = listed_pids(snapshot);
        self.tracked
            .retain(|pid, _| listed.binary_search(pid).is_ok());
        self.take_results();
        for pid in listed {
            let Some(stats) = poll.stats(pid) else {
                continue;
            };
            let count = stats
                .devices
                .iter()
                .filter_map(|d| d.ooms)
                .fold(0u64, u64::saturating_add);
            let start = starts.get(&pid).copied();
            let another = self.tracked.get(&pid).is_some_and(|t| {
                // A fall is a new process at the PID (its agent's counters start at 0).
                count < t.ooms.count
                    || matches!((t.start_time_ticks, start), (Some(a), Some(b)) if a != b)
            });
            if another {
                self.tracked.remove(&pid);
            }
            if count == 0 {
                continue;
            }
            if let Some(t) = self.tracked.get_mut(&pid) {
                t.ooms.count = count;
                continue;
            }
            let job = self.next_job;
            self.next_job += 1;
            let mut ooms = ProcessOoms::classifying(count, snapshot.taken_at_unix_ms);
            ooms.others_when_seen = others_beside(snapshot, pid);
            match self.worker().map(|w| w.queue.try_send((job, pid))) {
                Some(Ok(())) => {}
                Some(Err(TrySendError::Full(_))) => {
                    ooms.settle(Err("too many OOMs to classify at once".to_owned()));
                }
                Some(Err(TrySendError::Disconnected(_))) | None => {
                    ooms.settle(Err("no thread to classify it".to_owned()));
                }
            }
            self.tracked.insert(
                pid,
                Tracked {
                    start_time_ticks: start,
                    job,
                    ooms,
                },
            );
        }
        let mut out = AgentOoms::default();
        for (pid, t) in &self.tracked {
            out.insert(*pid, t.ooms.clone());
        }
        out
    }

    /// The classifications the worker finished, onto their processes (a process gone
    /// since, or another at its PID, has another job id: dropped).
    fn take_results(&mut self) {
        let Some(worker) = self.worker.as_ref() else {
            return;
        };
        while let Ok((job, result)) = worker.results.try_recv() {
            if let Some(t) = self.tracked.values_mut().find(|t| t.job == job) {
                t.ooms.settle(result);
            }
        }
    }
}

/// `pid`'s agent's OOMs, for a one-shot command (`ps`, `status`) that already has the
/// agent's `stats`: asked and classified on the caller's thread (bounded as the worker is)
/// only when its counters show an OOM, as the observer asks, so an agent without one costs
/// no second connection. `None`: no OOM counted, or no record.
pub fn ask_if_counted(pid: u32, stats: &Stats, snapshot: &Snapshot) -> Option<ProcessOoms> {
    let counted = stats.devices.iter().any(|d| d.ooms.is_some_and(|n| n > 0));
    let mut ooms = counted
        .then(|| ask_now(pid, snapshot.taken_at_unix_ms))
        .flatten()?;
    ooms.others_when_seen = others_beside(snapshot, pid);
    Some(ooms)
}

/// `pid`'s agent's OOMs now, asked and classified on the caller's thread (bounded as the
/// worker is). `None`: no agent answered, or no OOM.
pub fn ask_now(pid: u32, seen_at_unix_ms: i64) -> Option<ProcessOoms> {
    let mut client = AgentClient::connect(pid, quick()).ok()?;
    let record = client.oom().ok()?.oom?;
    let mut ooms = ProcessOoms::classifying(record.ooms.unwrap_or(1).max(1), seen_at_unix_ms);
    ooms.settle(classify_record(&mut client, &record));
    Some(ooms)
}

fn quick() -> Timeouts {
    Timeouts {
        quick: QUICK_TIMEOUT,
        reclaim: QUICK_TIMEOUT,
    }
}

/// Asks `pid`'s agent for its OOM record and snapshot, and classifies it.
///
/// # Errors
/// Why it could not be: the agent does not answer, kept no record or snapshot, or the
/// snapshot cannot be read.
pub fn classify_through_agent(pid: u32) -> Result<Classified, String> {
    let mut client = AgentClient::connect(pid, quick()).map_err(|e| e.to_string())?;
    let record = client
        .oom()
        .map_err(|e| e.to_string())?
        .oom
        .ok_or("the agent kept no OOM record")?;
    classify_record(&mut client, &record)
}

fn classify_record(client: &mut AgentClient, record: &OomRecord) -> Result<Classified, String> {
    if let Some(err) = &record.snapshot_error {
        return Err(format!("the agent kept no snapshot: {err}"));
    }
    let bytes = client
        .oom_snapshot(MAX_SNAPSHOT_BYTES, SNAPSHOT_TIMEOUT)
        .map_err(|e| e.to_string())?;
    let observed = observed_oom::Observed {
        device: record.device.unwrap_or(0),
        segment_bytes: record
            .segment_bytes
            .ok_or("the record has no segment size")?,
        device_free_bytes: record.device_free_bytes,
        device_total_bytes: record.device_total_bytes,
        unix_ms: record.unix_ms,
    };
    let event = observed_oom::verdict(&bytes, observed)?;
    Ok(Classified {
        cause: event.verdict.cause.as_str(),
        fix: event.verdict.fix,
        why: event.verdict.why,
        oom_at_unix_ms: record.unix_ms,
        device: record.device,
    })
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

    fn listing(pids: &[u32], at_ms: i64) -> Snapshot {
        Snapshot {
            taken_at_unix_ms: at_ms,
            monotonic_ms: at_ms,
            driver: Arc::new(DriverInfo::default()),
            devices: vec![DeviceSnapshot {
                info: Arc::new(DeviceInfo::new(0, "GPU-a")),
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

    fn classified(cause: &'static str, fix: Option<&str>) -> Classified {
        Classified {
            cause,
            fix: fix.map(str::to_owned),
            why: format!("{cause}, measured"),
            oom_at_unix_ms: Some(5),
            device: Some(0),
        }
    }

    struct Rig {
        ooms: Arc<Mutex<HashMap<u32, u64>>>,
        poll: AgentPoll,
        now: i64,
    }

    impl Rig {
        fn new(pids: &[u32]) -> Self {
            let ooms = Arc::new(Mutex::new(pids.iter().map(|p| (*p, 0u64)).collect()));
            let table: Arc<Mutex<HashMap<u32, u64>>> = Arc::clone(&ooms);
            let poll = AgentPoll::with_ask(
                PollLimits {
                    cadence: Duration::ZERO,
                    ..PollLimits::default()
                },
                Box::new(move |pid, _| table.lock().ok()?.get(&pid).map(|n| stats(*n))),
            );
            Self { ooms, poll, now: 0 }
        }

        fn set(&self, pid: u32, n: u64) {
            self.ooms.lock().expect("lock").insert(pid, n);
        }

        /// A poll and an update; then, until `done` or 10 s, updates while the worker
        /// runs on its own thread.
        fn tick(
            &mut self,
            watch: &mut OomWatch,
            pids: &[u32],
            done: impl Fn(&AgentOoms) -> bool,
        ) -> AgentOoms {
            self.now += 1000;
            let polled: Vec<Polled> = pids
                .iter()
                .map(|pid| Polled {
                    pid: *pid,
                    start_time_ticks: None,
                })
                .collect();
            self.poll.refresh_at_ms(self.now, &polled);
            let snapshot = listing(pids, self.now);
            let started = Instant::now();
            loop {
                let out = watch.update(&snapshot, &self.poll, &BTreeMap::new());
                if done(&out) || started.elapsed() > Duration::from_secs(10) {
                    return out;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    fn settled(out: &AgentOoms) -> bool {
        out.iter().all(|(_, o)| o.state != OomState::Classifying)
    }

    #[test]
    fn a_process_s_first_oom_is_classified_off_the_thread_and_later_ones_only_counted() {
        let asked = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&asked);
        // The worker waits for the test's word, so "classifying" is seen.
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock().expect("lock");
        let worker_gate = Arc::clone(&gate);
        let mut watch = OomWatch::with_classifier(Box::new(move |pid| {
            let _open = worker_gate.lock();
            counter.fetch_add(1, Ordering::SeqCst);
            match pid {
                10 => Ok(classified(
                    "fragmentation",
                    Some("expandable_segments:True"),
                )),
                20 => Ok(classified("other-process", None)),
                _ => Err("the agent kept no OOM record".into()),
            }
        }));
        let pids = [10, 20, 30];
        let mut rig = Rig::new(&pids);
        let out = rig.tick(&mut watch, &pids, |_| true);
        assert!(out.is_empty(), "no OOM, no entry");
        assert!(watch.worker.is_none(), "no thread before an OOM");
        // 10: three OOMs between two polls; 20 and 30: one.
        rig.set(10, 3);
        rig.set(20, 1);
        rig.set(30, 1);
        let out = rig.tick(&mut watch, &pids, |_| true);
        let ten = out.get(10).expect("10's OOMs");
        assert_eq!(
            (
                ten.count,
                ten.state,
                ten.cause.as_deref(),
                ten.seen_at_unix_ms
            ),
            (3, OomState::Classifying, None, 2000)
        );
        // Who else the sample that saw it listed on its GPU.
        assert_eq!(
            ten.others_when_seen,
            [
                HeldBeside {
                    pid: 20,
                    used_bytes: 1
                },
                HeldBeside {
                    pid: 30,
                    used_bytes: 1
                }
            ]
        );
        drop(held);
        let out = rig.tick(&mut watch, &pids, settled);
        let ten = out.get(10).expect("10");
        assert_eq!(ten.state, OomState::Classified);
        assert_eq!(ten.cause.as_deref(), Some("fragmentation"));
        assert_eq!(ten.fix.as_deref(), Some("expandable_segments:True"));
        assert_eq!(ten.seen_at_unix_ms, 2000, "when it was first seen");
        let twenty = out.get(20).expect("20");
        assert_eq!(
            (twenty.cause.as_deref(), twenty.fix.as_deref()),
            (Some("other-process"), None)
        );
        let thirty = out.get(30).expect("30");
        assert_eq!(thirty.state, OomState::Unclassified);
        assert_eq!(thirty.why.as_deref(), Some("the agent kept no OOM record"));
        // More OOMs are counted; nobody is asked again.
        rig.set(10, 5);
        let out = rig.tick(&mut watch, &pids, |_| true);
        assert_eq!(out.get(10).map(|o| o.count), Some(5));
        assert_eq!(
            out.get(10).and_then(|o| o.cause.as_deref()),
            Some("fragmentation")
        );
        assert_eq!(asked.load(Ordering::SeqCst), 3);
        // A new process at PID 10 (its counter fell) has its own first OOM.
        rig.set(10, 0);
        let out = rig.tick(&mut watch, &pids, |_| true);
        assert!(out.get(10).is_none());
        rig.set(10, 1);
        let out = rig.tick(&mut watch, &pids, settled);
        assert_eq!(
            out.get(10).map(|o| (o.count, o.seen_at_unix_ms)),
            Some((1, 6000))
        );
        assert_eq!(asked.load(Ordering::SeqCst), 4);
        // A process no longer listed is forgotten.
        let out = rig.tick(&mut watch, &[20, 30], |_| true);
        assert!(out.get(10).is_none() && out.get(20).is_some());
    }

    #[test]
    fn the_others_are_those_on_the_process_s_gpus_most_memory_first() {
        let mut snapshot = listing(&[10, 20, 30, 40, 50, 60, 70], 0);
        let mut second = snapshot.devices[0].clone();
        second.info = Arc::new(DeviceInfo::new(1, "GPU-b"));
        if let DeviceState::Ok(reading) = &mut snapshot.devices[0].state {
            for p in reading.processes.iter_mut().flatten() {
                p.used_bytes = Some(u64::from(p.pid));
            }
        }
        if let DeviceState::Ok(reading) = &mut second.state {
            // 99 holds memory on GPU 1 only, where 10 is not: not 10's other.
            reading.processes = Some(vec![ProcessUsage {
                pid: 99,
                used_bytes: Some(1 << 40),
                kind: ProcessKind::Compute,
                gpu_instance_id: None,
                compute_instance_id: None,
            }]);
        }
        snapshot.devices.push(second);
        let others: Vec<u32> = others_beside(&snapshot, 10).iter().map(|o| o.pid).collect();
        assert_eq!(others, [70, 60, 50, 40, 30], "at most five, most first");
        assert!(
            others_beside(&snapshot, 12345).is_empty(),
            "not listed: none"
        );
    }

    #[test]
    fn a_full_queue_leaves_an_oom_unclassified_at_once() {
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock().expect("lock");
        let worker_gate = Arc::clone(&gate);
        let mut watch = OomWatch::with_classifier(Box::new(move |_| {
            let _open = worker_gate.lock();
            Ok(classified("shortage", None))
        }));
        // One job taken by the stalled worker, QUEUE waiting, and two more.
        let pids: Vec<u32> = (100..100 + QUEUE as u32 + 3).collect();
        let mut rig = Rig::new(&pids);
        for pid in &pids {
            rig.set(*pid, 1);
        }
        let out = rig.tick(&mut watch, &pids, |_| true);
        let unclassified = out
            .iter()
            .filter(|(_, o)| o.state == OomState::Unclassified)
            .count();
        // 2 when the worker took the first job before the queue filled, 3 when not yet.
        assert!((2..=3).contains(&unclassified), "{unclassified}");
        assert!(out.iter().all(|(_, o)| o.state != OomState::Unclassified
            || o.why.as_deref() == Some("too many OOMs to classify at once")));
        drop(held);
        let out = rig.tick(&mut watch, &pids, settled);
        assert_eq!(
            out.iter()
                .filter(|(_, o)| o.cause.as_deref() == Some("shortage"))
                .count(),
            pids.len() - unclassified
        );
    }
}
