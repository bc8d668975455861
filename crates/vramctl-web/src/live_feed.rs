//! The live side of the page: a [`TickConsumer`] on the sampler thread that turns each
//! tick into one JSON document ([`Tick`]), keeps the latest (`/api/now`), a short replay
//! buffer, the leak onsets it saw, and pushes each tick to the open event streams
//! (`/api/events`, Server-Sent Events).
//!
//! Streams are bounded: at most [`MAX_STREAMS`] open (more are answered 503), each with a
//! channel of [`STREAM_BUFFER_TICKS`] ticks; a browser that falls that far behind is cut
//! off (it reconnects). Each stream ends itself after [`STREAM_MAX_AGE`], shorter than the
//! server's connection age limit, so the server never cuts one mid-event; the browser's
//! `EventSource` reconnects with `Last-Event-ID` and is sent the ticks it missed from the
//! replay buffer ([`REPLAY_TICKS`]), so the curve has no hole.
//!
//! Pushing never blocks the sampler: `try_send` into each stream's channel, under a lock
//! held for the copies of one tick.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::mpsc;
use vramctl_core::clock::ClockTime;
use vramctl_core::types::DeviceState;
use vramctl_exporter::collector::TickConsumer;
use vramctl_exporter::metadata::ProcessMetadata;
use vramctl_exporter::render::{ProcessVerdict, ProcessVerdicts};
use vramctl_observe::agent_ooms::ProcessOoms;
use vramctl_observe::observation::{Observation, Observer};

/// Event streams open at most.
pub const MAX_STREAMS: usize = 16;
/// Ticks a stream's channel holds for a browser that reads slowly.
pub const STREAM_BUFFER_TICKS: usize = 32;
/// A stream ends itself after this long (the server closes a connection at 60 s).
pub const STREAM_MAX_AGE: Duration = Duration::from_secs(45);
/// Ticks kept for streams that reconnect (two minutes at a 1 s tick).
pub const REPLAY_TICKS: usize = 120;
/// Leak onsets kept for the charts' marks.
pub const MAX_ONSETS: usize = 1000;

/// One process on one GPU in a tick.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TickProcess {
    /// PID.
    pub pid: u32,
    /// User name (or uid), untrusted text.
    pub user: Option<String>,
    /// Command line, untrusted text.
    pub command: Option<String>,
    /// Container id (or name, where the runtime names it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Kubernetes pod (namespace/name where the kubelet told, else its UID).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Slurm job id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Memory the driver attributes to it.
    pub used_bytes: Option<u64>,
    /// Bytes in its live tensors, from its agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    /// Bytes its allocator caches beyond them (reserved − allocated), from its agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_bytes: Option<u64>,
    /// `leak`, `idle`, `ok`, or `None` while the analysis has no verdict yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<&'static str>,
    /// Why, in words (the measured growth, the idle time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The CUDA out-of-memory errors its agent reported: how many, the first one's cause
    /// and fix (`vramctl_observe::agent_ooms`, the fields `ps --json` has too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom: Option<ProcessOoms>,
}

/// One GPU in a tick.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TickGpu {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Product name.
    pub name: Option<String>,
    /// Installed memory.
    pub total_bytes: Option<u64>,
    /// Memory used.
    pub used_bytes: Option<u64>,
    /// Why the GPU could not be read this tick.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its processes, biggest first.
    pub processes: Vec<TickProcess>,
}

/// A leak onset: when a process was first judged leaking.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Onset {
    /// Wall time, ms since the Unix epoch.
    pub t_ms: i64,
    /// GPU UUID.
    pub gpu: String,
    /// PID.
    pub pid: u32,
    /// Why.
    pub reason: Option<String>,
}

/// One tick, as `/api/now` answers and each stream event carries.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Tick {
    /// Sequence number since the server started (the event id).
    pub seq: u64,
    /// Wall time of the sample, ms since the Unix epoch.
    pub t_ms: i64,
    /// The sampler's interval.
    pub interval_ms: u64,
    /// Why there is no sample (NVML down), else `None`.
    pub down: Option<String>,
    /// The GPUs.
    pub gpus: Vec<TickGpu>,
}

struct Stream {
    sender: mpsc::Sender<Bytes>,
    opened: Instant,
}

#[derive(Default)]
struct Inner {
    seq: u64,
    latest: Option<Bytes>,
    /// (seq, the tick's time, the event as sent).
    replay: VecDeque<(u64, i64, Bytes)>,
    streams: Vec<Stream>,
    onsets: VecDeque<Onset>,
    /// (GPU, PID) judged leaking at the previous tick.
    leaking: std::collections::HashSet<(String, u32)>,
}

/// The live state every request and stream reads.
pub struct LiveFeed {
    interval_ms: u64,
    stream_max_age: Duration,
    inner: Mutex<Inner>,
}

/// Why a stream was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyStreams;

impl LiveFeed {
    /// An empty feed for a sampler ticking every `interval_ms`.
    pub fn new(interval_ms: u64) -> Arc<Self> {
        Self::with_stream_age(interval_ms, STREAM_MAX_AGE)
    }

    fn with_stream_age(interval_ms: u64, stream_max_age: Duration) -> Arc<Self> {
        Arc::new(Self {
            interval_ms,
            stream_max_age,
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere cannot leave the buffers half written in a harmful way.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The consumer to add to the collector.
    pub fn consumer(self: &Arc<Self>) -> Box<dyn TickConsumer> {
        Box::new(FeedConsumer(Arc::clone(self)))
    }

    /// The latest tick's JSON.
    pub fn latest(&self) -> Option<Bytes> {
        self.lock().latest.clone()
    }

    /// The latest tick's time.
    pub fn latest_t_ms(&self) -> Option<i64> {
        self.lock().replay.back().map(|(_, t_ms, _)| *t_ms)
    }

    /// The sampler's interval.
    pub fn interval_ms(&self) -> u64 {
        self.interval_ms
    }

    /// Leak onsets seen since the server started, oldest first, within `[from_ms, to_ms]`.
    pub fn onsets(&self, from_ms: i64, to_ms: i64) -> Vec<Onset> {
        self.lock()
            .onsets
            .iter()
            .filter(|o| (from_ms..=to_ms).contains(&o.t_ms))
            .cloned()
            .collect()
    }

    /// The ticks in the replay buffer taken after `after_ms` (all without it) as JSON,
    /// oldest first: the page's curve since the server started where there is no recorded
    /// history, else the few ticks the recorder has not written yet.
    pub fn recent(&self, after_ms: Option<i64>) -> Vec<Bytes> {
        let inner = self.lock();
        inner
            .replay
            .iter()
            .filter(|(_, t_ms, _)| after_ms.is_none_or(|after| *t_ms > after))
            .filter_map(|(_, _, event)| event_data(event))
            .collect()
    }

    /// Opens a stream: first the ticks after `last_event_id` still in the replay buffer
    /// (or the latest tick for a new stream), then each new tick.
    ///
    /// # Errors
    /// [`TooManyStreams`] when [`MAX_STREAMS`] are open.
    pub fn subscribe(
        &self,
        last_event_id: Option<u64>,
    ) -> Result<mpsc::Receiver<Bytes>, TooManyStreams> {
        let mut inner = self.lock();
        inner.streams.retain(|s| !s.sender.is_closed());
        if inner.streams.len() >= MAX_STREAMS {
            return Err(TooManyStreams);
        }
        let (sender, receiver) = mpsc::channel(STREAM_BUFFER_TICKS + REPLAY_TICKS + 1);
        // How long the browser waits before reconnecting, in ms.
        let _ = sender.try_send(Bytes::from_static(b"retry: 1000\n\n"));
        match last_event_id {
            Some(last) => {
                for (_, _, event) in inner.replay.iter().filter(|(seq, _, _)| *seq > last) {
                    let _ = sender.try_send(event.clone());
                }
            }
            None => {
                if let Some((_, _, event)) = inner.replay.back() {
                    let _ = sender.try_send(event.clone());
                }
            }
        }
        inner.streams.push(Stream {
            sender,
            opened: Instant::now(),
        });
        Ok(receiver)
    }

    /// Number of open streams.
    pub fn open_streams(&self) -> usize {
        let mut inner = self.lock();
        inner.streams.retain(|s| !s.sender.is_closed());
        inner.streams.len()
    }

    /// Publishes one tick: the latest, the replay buffer, every stream.
    fn publish(&self, tick: Tick, leaking_now: Vec<(String, u32, Option<String>)>) {
        let mut inner = self.lock();
        inner.seq += 1;
        let seq = inner.seq;
        let tick = Tick { seq, ..tick };
        let Ok(json) = serde_json::to_vec(&tick) else {
            return;
        };
        let now_set: std::collections::HashSet<(String, u32)> = leaking_now
            .iter()
            .map(|(gpu, pid, _)| (gpu.clone(), *pid))
            .collect();
        for (gpu, pid, reason) in leaking_now {
            if !inner.leaking.contains(&(gpu.clone(), pid)) {
                if inner.onsets.len() >= MAX_ONSETS {
                    inner.onsets.pop_front();
                }
                inner.onsets.push_back(Onset {
                    t_ms: tick.t_ms,
                    gpu,
                    pid,
                    reason,
                });
            }
        }
        inner.leaking = now_set;
        let mut event = Vec::with_capacity(json.len() + 32);
        event.extend_from_slice(format!("id: {seq}\nevent: tick\ndata: ").as_bytes());
        event.extend_from_slice(&json);
        event.extend_from_slice(b"\n\n");
        let event = Bytes::from(event);
        inner.latest = Some(Bytes::from(json));
        if inner.replay.len() >= REPLAY_TICKS {
            inner.replay.pop_front();
        }
        inner.replay.push_back((seq, tick.t_ms, event.clone()));
        let now = Instant::now();
        inner.streams.retain(|stream| {
            // Dropping the sender ends the response: the browser reconnects.
            now.saturating_duration_since(stream.opened) < self.stream_max_age
                && stream.sender.try_send(event.clone()).is_ok()
        });
    }
}

/// The JSON of an event as [`LiveFeed::publish`] frames it.
fn event_data(event: &Bytes) -> Option<Bytes> {
    let text = event.as_ref();
    let start = text.windows(6).position(|w| w == b"data: ")? + 6;
    let end = text.len().checked_sub(2)?;
    (start <= end).then(|| event.slice(start..end))
}

/// The verdict of one process, in the table's words.
fn verdict_words(verdict: &ProcessVerdict) -> (Option<&'static str>, Option<String>) {
    if verdict.leaking == Some(true) {
        let reason = verdict
            .leak_slope_bytes_per_second
            .map(|slope| format!("grows {}", vramctl_observe::units::sentence_rate(slope)));
        return (Some("leak"), reason);
    }
    if verdict.idle_holder == Some(true) {
        let reason = verdict.idle_seconds.map(|s| {
            format!(
                "no GPU activity for {}",
                vramctl_observe::units::sentence_duration(s)
            )
        });
        return (Some("idle"), reason);
    }
    match (verdict.leaking, verdict.idle_holder) {
        (None, None) => (None, None),
        _ => (Some("ok"), None),
    }
}

/// The tick `observation` makes, with its labels and verdicts; and who leaks now.
pub fn tick_of(
    observation: &Observation,
    metadata: &ProcessMetadata,
    verdicts: &ProcessVerdicts,
    interval_ms: u64,
) -> (Tick, Vec<(String, u32, Option<String>)>) {
    let snapshot = &observation.snapshot;
    let mut leaking = Vec::new();
    let gpus = snapshot
        .devices
        .iter()
        .map(|device| {
            let uuid = device.info.uuid.clone();
            let reading = device.reading();
            let memory = reading.and_then(|r| r.memory.as_ref());
            let mut processes: Vec<TickProcess> = reading
                .and_then(|r| r.processes.as_ref())
                .map(|list| {
                    list.iter()
                        .map(|usage| {
                            let host = observation.hosts.get(&usage.pid);
                            let labels = metadata.get(usage.pid);
                            let agent = metadata.agents.get(&(uuid.clone(), usage.pid));
                            let (verdict, reason) = verdicts
                                .get(&(uuid.clone(), usage.pid))
                                .map_or((None, None), verdict_words);
                            if verdict == Some("leak") {
                                leaking.push((uuid.clone(), usage.pid, reason.clone()));
                            }
                            let allocated = agent.and_then(|a| a.allocated_bytes);
                            TickProcess {
                                pid: usage.pid,
                                user: host
                                    .and_then(|h| h.user.clone())
                                    .or_else(|| labels.and_then(|l| l.user.clone())),
                                // The whole command line (the labels' is shortened for
                                // Prometheus).
                                command: host
                                    .map(|h| h.command.clone())
                                    .or_else(|| observation.driver_names.get(&usage.pid).cloned())
                                    .or_else(|| labels.and_then(|l| l.command.clone())),
                                container: host
                                    .and_then(|h| {
                                        h.container
                                            .as_ref()
                                            .map(|c| c.name.clone().unwrap_or_else(|| c.id.clone()))
                                            .or_else(|| h.container_id.clone())
                                    })
                                    .or_else(|| labels.and_then(|l| l.container.clone())),
                                pod: host
                                    .and_then(|h| {
                                        h.kubernetes
                                            .as_ref()
                                            .map(|k| format!("{}/{}", k.namespace, k.pod))
                                            .or_else(|| h.pod_uid.clone())
                                    })
                                    .or_else(|| labels.and_then(|l| l.pod.clone())),
                                job: host
                                    .and_then(|h| h.slurm.as_ref())
                                    .map(|j| j.job_id.to_string()),
                                used_bytes: usage.used_bytes,
                                allocated_bytes: allocated,
                                cached_bytes: agent
                                    .and_then(|a| a.reserved_bytes)
                                    .zip(allocated)
                                    .map(|(r, a)| r.saturating_sub(a)),
                                verdict,
                                reason,
                                oom: observation.ooms.get(usage.pid).cloned(),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            processes.sort_by(|a, b| b.used_bytes.cmp(&a.used_bytes).then(a.pid.cmp(&b.pid)));
            TickGpu {
                index: device.info.index,
                uuid,
                name: device.info.name.clone(),
                total_bytes: memory.map(|m| m.total_bytes),
                used_bytes: memory.map(|m| m.used_bytes),
                error: match &device.state {
                    DeviceState::Ok(_) => None,
                    DeviceState::Lost { reason } => Some(format!("lost: {reason}")),
                    DeviceState::Error { reason } => Some(reason.clone()),
                },
                processes,
            }
        })
        .collect();
    (
        Tick {
            seq: 0,
            t_ms: snapshot.taken_at_unix_ms,
            interval_ms,
            down: None,
            gpus,
        },
        leaking,
    )
}

struct FeedConsumer(Arc<LiveFeed>);

impl TickConsumer for FeedConsumer {
    fn on_snapshot(
        &mut self,
        observation: &Observation,
        _observer: &Observer,
        metadata: &ProcessMetadata,
        verdicts: &mut ProcessVerdicts,
    ) {
        let (tick, leaking) = tick_of(observation, metadata, verdicts, self.0.interval_ms);
        self.0.publish(tick, leaking);
    }

    fn on_no_snapshot(&mut self, at: ClockTime, reason: &str) {
        self.0.publish(
            Tick {
                seq: 0,
                t_ms: at.unix_ms,
                interval_ms: self.0.interval_ms,
                down: Some(reason.to_owned()),
                gpus: Vec::new(),
            },
            Vec::new(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(t_ms: i64) -> Tick {
        Tick {
            seq: 0,
            t_ms,
            interval_ms: 1000,
            down: None,
            gpus: Vec::new(),
        }
    }

    fn drain(receiver: &mut mpsc::Receiver<Bytes>) -> (Vec<u64>, bool) {
        let mut ids = Vec::new();
        loop {
            match receiver.try_recv() {
                Ok(chunk) => {
                    let text = String::from_utf8_lossy(&chunk).into_owned();
                    if let Some(id) = text.strip_prefix("id: ").and_then(|t| t.split('\n').next()) {
                        ids.push(id.parse().expect("id"));
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => return (ids, false),
                Err(mpsc::error::TryRecvError::Disconnected) => return (ids, true),
            }
        }
    }

    #[test]
    fn a_stream_gets_the_latest_then_each_tick_and_a_reconnect_what_it_missed() {
        let feed = LiveFeed::new(1000);
        for t in 0..5 {
            feed.publish(tick(t), Vec::new());
        }
        let mut fresh = feed.subscribe(None).expect("a stream");
        assert_eq!(drain(&mut fresh).0, [5]);
        feed.publish(tick(5), Vec::new());
        assert_eq!(drain(&mut fresh).0, [6]);
        let mut back = feed.subscribe(Some(3)).expect("a stream");
        assert_eq!(drain(&mut back).0, [4, 5, 6]);
        // The replay buffer is bounded: a stream gone longer than it gets what is left.
        for t in 0..(REPLAY_TICKS as i64 + 10) {
            feed.publish(tick(t), Vec::new());
        }
        let mut late = feed.subscribe(Some(1)).expect("a stream");
        assert_eq!(drain(&mut late).0.len(), REPLAY_TICKS);
        assert_eq!(feed.recent(None).len(), REPLAY_TICKS);
        // Only what came after a time: the ticks a recorder has not written yet.
        let last_t = REPLAY_TICKS as i64 + 9;
        assert_eq!(feed.recent(Some(last_t - 3)).len(), 3);
    }

    #[test]
    fn streams_are_bounded_and_end_at_their_age() {
        let feed = LiveFeed::with_stream_age(1000, Duration::from_millis(50));
        let mut open: Vec<_> = (0..MAX_STREAMS)
            .map(|_| feed.subscribe(None).expect("room"))
            .collect();
        assert_eq!(feed.subscribe(None).err(), Some(TooManyStreams));
        drop(open.pop());
        assert!(
            feed.subscribe(None).is_ok(),
            "a closed stream frees its place"
        );
        std::thread::sleep(Duration::from_millis(60));
        feed.publish(tick(1), Vec::new());
        let (_, ended) = drain(&mut open[0]);
        assert!(ended, "past its age a stream ends (the browser reconnects)");
        assert_eq!(feed.open_streams(), 0);
    }

    #[test]
    fn a_slow_reader_is_cut_off_instead_of_growing_memory() {
        let feed = LiveFeed::new(1000);
        let mut slow = feed.subscribe(None).expect("a stream");
        for t in 0..(STREAM_BUFFER_TICKS + REPLAY_TICKS + 5) {
            feed.publish(tick(t as i64), Vec::new());
        }
        let (ids, ended) = drain(&mut slow);
        assert!(ended);
        assert!(ids.len() <= STREAM_BUFFER_TICKS + REPLAY_TICKS + 1);
    }

    #[test]
    fn a_leak_onset_is_noted_once_when_it_starts() {
        let feed = LiveFeed::new(1000);
        let leaking = || vec![("GPU-1".to_owned(), 7, Some("grows".to_owned()))];
        feed.publish(tick(1_000), Vec::new());
        feed.publish(tick(2_000), leaking());
        feed.publish(tick(3_000), leaking());
        let onsets = feed.onsets(0, 10_000);
        assert_eq!(onsets.len(), 1);
        assert_eq!((onsets[0].t_ms, onsets[0].pid), (2_000, 7));
        assert!(feed.onsets(2_500, 10_000).is_empty());
    }

    #[test]
    fn a_process_s_oom_is_in_its_tick_entry_with_its_cause_and_fix() {
        use vramctl_core::types::{
            DeviceInfo, DeviceReading, DeviceSnapshot, DriverInfo, ProcessKind, ProcessUsage,
            Snapshot,
        };
        use vramctl_observe::agent_ooms::OomState;
        let usage = |pid| ProcessUsage {
            pid,
            used_bytes: Some(1 << 30),
            kind: ProcessKind::Compute,
            gpu_instance_id: None,
            compute_instance_id: None,
        };
        let snapshot = Snapshot {
            taken_at_unix_ms: 5_000,
            monotonic_ms: 5_000,
            driver: Arc::new(DriverInfo::default()),
            devices: vec![DeviceSnapshot {
                info: Arc::new(DeviceInfo::new(0, "GPU-a")),
                state: DeviceState::Ok(DeviceReading {
                    processes: Some(vec![usage(10), usage(20)]),
                    ..DeviceReading::default()
                }),
            }],
            unopened: Vec::new(),
        };
        let mut observation = Observation::bare(snapshot);
        observation.ooms.insert(
            10,
            ProcessOoms {
                count: 2,
                seen_at_unix_ms: 4_000,
                state: OomState::Classified,
                cause: Some("fragmentation".into()),
                fix: Some("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into()),
                why: Some("no free block holds 2.00 GiB".into()),
                oom_at_unix_ms: Some(3_900),
                device: Some(0),
                others_when_seen: Vec::new(),
            },
        );
        let (tick, _) = tick_of(
            &observation,
            &ProcessMetadata::default(),
            &ProcessVerdicts::default(),
            1000,
        );
        let json = serde_json::to_value(&tick).expect("json");
        let processes = json["gpus"][0]["processes"].as_array().expect("processes");
        let by_pid = |pid: u64| {
            processes
                .iter()
                .find(|p| p["pid"] == pid)
                .expect("listed")
                .clone()
        };
        let oom = &by_pid(10)["oom"];
        assert_eq!(oom["count"], 2);
        assert_eq!(oom["state"], "classified");
        assert_eq!(oom["cause"], "fragmentation");
        assert_eq!(
            oom["fix"],
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        );
        assert_eq!(oom["seen_at_unix_ms"], 4_000);
        assert!(
            by_pid(20).get("oom").is_none(),
            "no OOM reported: no field, {processes:?}"
        );
    }
}
