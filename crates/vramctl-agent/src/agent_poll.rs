//! Asking the agents of many processes for their memory, again and again, from a loop that
//! must keep its own pace: `serve`'s sampler thread and `record`'s tick.
//!
//! An [`AgentPoll`] remembers each process's last `stats` answer and asks again only once
//! it is older than the cadence, within two bounds: each agent gets at most `per_agent` for
//! its exchange (connect, request, answer), and one refresh stops asking once `per_tick` is
//! spent — those left are asked first at the next refresh (never asked, then the oldest
//! answer first). A process without an agent costs a few `stat`s and one read of
//! `/proc/PID/environ` per cadence (an agent can be started later, `%load_ext`); one whose
//! agent stopped answering loses its figures at once (absent, not stale). A process seen with
//! another identity (a reused PID) starts afresh.
//!
//! The figures per GPU are [`memory_on`]: the agent's devices matched to NVML's by UUID.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::agent_client::{self, AgentMemory, DeviceStats, Stats};
use vramctl_core::types::Snapshot;
use vramctl_procs::process_catalog::{ProcessCatalog, listed_pids};

/// The agents' figures of one snapshot, by (NVML's GPU UUID, PID); a process without an
/// agent, or whose agent names none of its GPUs, has no entry.
pub type AgentFigures = HashMap<(String, u32), DeviceMemory>;

/// How often a process's agent is asked again, by default. Chosen on `serve`'s CPU goal
/// (< 0.5 % of a core, docs/benchmarks.md) and the cost of one exchange measured on the
/// stand-in agent (docs/benchmarks.md, "agent figures"): at 10 s even 240 processes with
/// agents cost well under a tenth of the goal, and 10 s is the live analysis' cadence in
/// `serve` (`Cadence::SCRAPED`) and shorter than Prometheus' usual 15–60 s scrape interval,
/// so every scrape sees a figure at most one refresh old.
pub const DEFAULT_CADENCE: Duration = Duration::from_secs(10);

/// How long one agent may take to answer a poll. An idle agent answers in about a
/// millisecond (docs/benchmarks.md); one waiting for the allocator's lock behind an
/// `empty_cache` takes as long as that (0.07–0.11 s on an idle H200, research-round2 §5.3);
/// 250 ms is over twice that, and a quarter of `serve`'s default 1 s interval.
pub const DEFAULT_PER_AGENT: Duration = Duration::from_millis(250);

/// How long one refresh may spend asking agents in all before it leaves the rest to the
/// next: with [`DEFAULT_PER_AGENT`], a tick of a 1 s loop is delayed by at most ~0.5 s.
pub const DEFAULT_PER_TICK: Duration = Duration::from_millis(250);

/// The bounds of an [`AgentPoll`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollLimits {
    /// Ask a process again once its last answer is this old.
    pub cadence: Duration,
    /// Deadline of one exchange.
    pub per_agent: Duration,
    /// Time one refresh may spend asking.
    pub per_tick: Duration,
}

impl Default for PollLimits {
    fn default() -> Self {
        Self {
            cadence: DEFAULT_CADENCE,
            per_agent: DEFAULT_PER_AGENT,
            per_tick: DEFAULT_PER_TICK,
        }
    }
}

/// How a poll asks one process (the real client, or a test's table).
pub type AskFn = dyn FnMut(u32, Duration) -> Option<Stats> + Send;

/// One process's memory on one GPU, as its agent says; a field the framework cannot say
/// is `None` (never 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceMemory {
    /// Bytes in live tensors.
    pub allocated_bytes: Option<u64>,
    /// Bytes the framework's allocator holds from the driver (allocated + cached).
    pub reserved_bytes: Option<u64>,
}

/// A process to poll: its PID and its identity (`/proc/PID/stat`'s start time, when
/// known), so a reused PID is not credited with its predecessor's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Polled {
    /// PID.
    pub pid: u32,
    /// Start time in clock ticks since boot.
    pub start_time_ticks: Option<u64>,
}

struct Entry {
    start_time_ticks: Option<u64>,
    /// When it was last asked, in ms on the caller's monotonic time line.
    asked_at_ms: Option<i64>,
    stats: Option<Stats>,
}

/// What one [`AgentPoll::refresh`] did (for the caller's counters and for measuring).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RefreshReport {
    /// Processes asked.
    pub asked: usize,
    /// Of them, those whose agent answered.
    pub answered: usize,
    /// Due but left for the next refresh (the per-tick budget was spent).
    pub deferred: usize,
    /// Time spent asking.
    pub spent: Duration,
}

/// The last answer of each polled process's agent. See the module docs.
pub struct AgentPoll {
    limits: PollLimits,
    /// Where [`refresh`](AgentPoll::refresh)'s `Instant`s start their ms time line.
    epoch: Instant,
    entries: HashMap<u32, Entry>,
    ask: Box<AskFn>,
}

impl std::fmt::Debug for AgentPoll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentPoll")
            .field("limits", &self.limits)
            .field("processes", &self.entries.len())
            .finish_non_exhaustive()
    }
}

impl AgentPoll {
    /// A poll through the real client ([`agent_client::stats_of`]).
    pub fn new(limits: PollLimits) -> Self {
        Self::with_ask(limits, Box::new(agent_client::stats_of))
    }

    /// A poll asking through `ask` (tests).
    pub fn with_ask(limits: PollLimits, ask: Box<AskFn>) -> Self {
        Self {
            limits,
            epoch: Instant::now(),
            entries: HashMap::new(),
            ask,
        }
    }

    /// Brings the poll up to `processes` at `now`: forgets those no longer listed (or
    /// listed with another identity), then asks those due, within the limits.
    pub fn refresh(&mut self, now: Instant, processes: &[Polled]) -> RefreshReport {
        let now_ms = i64::try_from(now.saturating_duration_since(self.epoch).as_millis())
            .unwrap_or(i64::MAX);
        self.refresh_at_ms(now_ms, processes)
    }

    /// [`refresh`](Self::refresh) at `now_ms` on the caller's monotonic time line (a
    /// snapshot's `monotonic_ms`): the cadence counts in the caller's time, so an observer
    /// on an injected clock never reads the real one for it. One poll keeps to one time
    /// line: either this or `refresh`.
    pub fn refresh_at_ms(&mut self, now_ms: i64, processes: &[Polled]) -> RefreshReport {
        self.entries.retain(|pid, entry| {
            processes
                .iter()
                .any(|p| p.pid == *pid && p.start_time_ticks == entry.start_time_ticks)
        });
        for p in processes {
            self.entries.entry(p.pid).or_insert(Entry {
                start_time_ticks: p.start_time_ticks,
                asked_at_ms: None,
                stats: None,
            });
        }
        let cadence_ms = i64::try_from(self.limits.cadence.as_millis()).unwrap_or(i64::MAX);
        let mut due: Vec<(Option<i64>, u32)> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                // A time line that went back (another clock) makes the agent due at once.
                e.asked_at_ms
                    .is_none_or(|at| now_ms < at || now_ms.saturating_sub(at) >= cadence_ms)
            })
            .map(|(pid, e)| (e.asked_at_ms, *pid))
            .collect();
        // Never asked first (None < Some), then the oldest answer; ties by PID.
        due.sort_unstable();
        let started = Instant::now();
        let mut report = RefreshReport::default();
        for (i, (_, pid)) in due.iter().enumerate() {
            if started.elapsed() >= self.limits.per_tick {
                report.deferred = due.len() - i;
                break;
            }
            let stats = (self.ask)(*pid, self.limits.per_agent);
            report.asked += 1;
            report.answered += usize::from(stats.is_some());
            if let Some(entry) = self.entries.get_mut(pid) {
                entry.asked_at_ms = Some(now_ms);
                entry.stats = stats;
            }
        }
        report.spent = started.elapsed();
        report
    }

    /// The last answer of `pid`'s agent; `None` when it has none, or it did not answer.
    pub fn stats(&self, pid: u32) -> Option<&Stats> {
        self.entries.get(&pid).and_then(|e| e.stats.as_ref())
    }

    /// `pid`'s memory on the GPU NVML names `nvml_uuid` ([`memory_on`]).
    pub fn memory_on(&self, pid: u32, nvml_uuid: &str, only_gpu: bool) -> Option<DeviceMemory> {
        memory_on(self.stats(pid)?, nvml_uuid, only_gpu)
    }
}

/// The processes `snapshot` lists that `catalog` (which observed it) can see in /proc and
/// that have not exited: the ones whose agents a poll may ask.
pub fn polled_processes(snapshot: &Snapshot, catalog: &ProcessCatalog) -> Vec<Polled> {
    listed_pids(snapshot)
        .into_iter()
        .filter_map(|pid| {
            let entry = catalog.get(pid)?;
            (entry.visible && !entry.exited).then_some(Polled {
                pid,
                start_time_ticks: entry.start_time_ticks,
            })
        })
        .collect()
}

/// The poll's figures for every (GPU, process) of `snapshot`.
pub fn figures(poll: &AgentPoll, snapshot: &Snapshot) -> AgentFigures {
    let mut gpus_of: HashMap<u32, usize> = HashMap::new();
    let held = || {
        snapshot
            .devices
            .iter()
            .filter_map(|d| Some((d, d.reading()?.processes.as_ref()?)))
    };
    for (_, list) in held() {
        for p in list {
            *gpus_of.entry(p.pid).or_default() += 1;
        }
    }
    let mut out = AgentFigures::new();
    for (device, list) in held() {
        for p in list {
            let only_gpu = gpus_of.get(&p.pid) == Some(&1);
            if let Some(memory) = poll.memory_on(p.pid, &device.info.uuid, only_gpu) {
                out.insert((device.info.uuid.clone(), p.pid), memory);
            }
        }
    }
    out
}

/// The agent's figures for the GPU NVML names `nvml_uuid` (`GPU-…` or `MIG-…`), summed over
/// the frameworks that report it: its devices whose UUID is NVML's without the prefix
/// (torch). A framework that gives no UUID (JAX, TensorFlow) is counted only when
/// `only_gpu` says the process holds memory on this GPU alone, so no figure is ever put on
/// the wrong GPU. `None` when no device matches; a sum is `None` when no matching device
/// can say it.
pub fn memory_on(stats: &Stats, nvml_uuid: &str, only_gpu: bool) -> Option<DeviceMemory> {
    let matching = matching(stats, nvml_uuid, only_gpu)?;
    Some(DeviceMemory {
        allocated_bytes: sum(&matching, |d| d.allocated_bytes),
        reserved_bytes: sum(&matching, |d| d.reserved_bytes),
    })
}

/// [`memory_on`] as `ps` shows a process (allocated, cached, releasable), for one GPU:
/// what `status` shows per device.
pub fn agent_memory_on(stats: &Stats, nvml_uuid: &str, only_gpu: bool) -> Option<AgentMemory> {
    let matching = matching(stats, nvml_uuid, only_gpu)?;
    Some(AgentMemory {
        allocated_bytes: sum(&matching, |d| d.allocated_bytes),
        cached_bytes: sum(&matching, |d| d.cached_bytes),
        releasable_bytes: sum(&matching, |d| d.releasable_bytes),
    })
}

/// [`agent_memory_on`] summed over some of the GPUs a process holds memory on (more than
/// one, so a device without a UUID never counts): what `ps --gpu` shows beside the memory
/// of the GPUs it lists, not the agent's sum over every device. `None` when none of them
/// matches the agent's devices.
pub fn agent_memory_over<'a>(
    stats: &Stats,
    nvml_uuids: impl IntoIterator<Item = &'a str>,
) -> Option<AgentMemory> {
    let each: Vec<AgentMemory> = nvml_uuids
        .into_iter()
        .filter_map(|uuid| agent_memory_on(stats, uuid, false))
        .collect();
    let add = |pick: fn(&AgentMemory) -> Option<u64>| {
        each.iter()
            .filter_map(pick)
            .fold(None, |acc: Option<u64>, v| {
                Some(acc.unwrap_or(0).saturating_add(v))
            })
    };
    (!each.is_empty()).then(|| AgentMemory {
        allocated_bytes: add(|m| m.allocated_bytes),
        cached_bytes: add(|m| m.cached_bytes),
        releasable_bytes: add(|m| m.releasable_bytes),
    })
}

/// The agent's devices that are the GPU `nvml_uuid` (see [`memory_on`]); `None` if none.
fn matching<'a>(stats: &'a Stats, nvml_uuid: &str, only_gpu: bool) -> Option<Vec<&'a DeviceStats>> {
    let bare = nvml_uuid
        .strip_prefix("GPU-")
        .or_else(|| nvml_uuid.strip_prefix("MIG-"))
        .unwrap_or(nvml_uuid);
    let matching: Vec<&DeviceStats> = stats
        .devices
        .iter()
        .filter(|d| d.error.is_none())
        .filter(|d| match d.uuid.as_deref() {
            Some(uuid) => uuid.eq_ignore_ascii_case(bare),
            None => only_gpu,
        })
        .collect();
    (!matching.is_empty()).then_some(matching)
}

/// Σ of a counter over devices; `None` when none of them says it.
fn sum(devices: &[&DeviceStats], pick: fn(&DeviceStats) -> Option<u64>) -> Option<u64> {
    devices
        .iter()
        .filter_map(|d| pick(d))
        .fold(None, |acc: Option<u64>, v| {
            Some(acc.unwrap_or(0).saturating_add(v))
        })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn device(uuid: Option<&str>, allocated: u64, reserved: Option<u64>) -> DeviceStats {
        DeviceStats {
            framework: "torch".into(),
            index: 0,
            uuid: uuid.map(str::to_owned),
            allocated_bytes: Some(allocated),
            reserved_bytes: reserved,
            cached_bytes: reserved.map(|r| r - allocated),
            releasable_bytes: None,
            inactive_split_bytes: None,
            allocated_peak_bytes: None,
            reserved_peak_bytes: None,
            alloc_retries: None,
            ooms: None,
            error: None,
        }
    }

    fn stats(devices: Vec<DeviceStats>) -> Stats {
        Stats {
            taken_at: 0.0,
            devices,
        }
    }

    #[test]
    fn figures_go_to_the_gpu_whose_uuid_the_framework_names() {
        let s = stats(vec![
            device(Some("aaaa"), 10, Some(30)),
            device(Some("bbbb"), 1, Some(2)),
        ]);
        assert_eq!(
            memory_on(&s, "GPU-aaaa", false),
            Some(DeviceMemory {
                allocated_bytes: Some(10),
                reserved_bytes: Some(30)
            })
        );
        assert_eq!(
            memory_on(&s, "GPU-bbbb", false).and_then(|m| m.reserved_bytes),
            Some(2)
        );
        assert_eq!(memory_on(&s, "GPU-cccc", true), None);
    }

    #[test]
    fn a_device_without_uuid_counts_only_for_a_process_on_one_gpu() {
        let s = stats(vec![device(None, 5, None)]);
        assert_eq!(memory_on(&s, "GPU-aaaa", false), None);
        assert_eq!(
            memory_on(&s, "GPU-aaaa", true),
            Some(DeviceMemory {
                allocated_bytes: Some(5),
                reserved_bytes: None
            })
        );
    }

    #[test]
    fn a_sum_over_some_gpus_leaves_the_others_out() {
        let s = stats(vec![
            device(Some("aaaa"), 10, Some(30)),
            device(Some("bbbb"), 1, Some(2)),
            device(Some("cccc"), 100, Some(100)),
            device(None, 1000, Some(1000)),
        ]);
        let over = agent_memory_over(&s, ["GPU-aaaa", "GPU-bbbb"]).expect("two match");
        assert_eq!(over.allocated_bytes, Some(11));
        assert_eq!(over.cached_bytes, Some(21));
        assert_eq!(
            agent_memory_over(&s, ["GPU-cccc"]).and_then(|m| m.allocated_bytes),
            Some(100)
        );
        assert_eq!(agent_memory_over(&s, ["GPU-dddd"]), None);
        assert_eq!(agent_memory_over(&s, []), None);
    }

    fn counting_poll(limits: PollLimits, answer: bool) -> (AgentPoll, Arc<Mutex<Vec<u32>>>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&asked);
        let poll = AgentPoll::with_ask(
            limits,
            Box::new(move |pid, _| {
                log.lock().expect("lock").push(pid);
                answer.then(|| stats(vec![device(Some("aaaa"), u64::from(pid), Some(100))]))
            }),
        );
        (poll, asked)
    }

    fn listed(pids: &[u32]) -> Vec<Polled> {
        pids.iter()
            .map(|&pid| Polled {
                pid,
                start_time_ticks: Some(1),
            })
            .collect()
    }

    #[test]
    fn an_agent_is_asked_again_only_after_the_cadence() {
        let (mut poll, asked) = counting_poll(PollLimits::default(), true);
        let t0 = Instant::now();
        poll.refresh(t0, &listed(&[7, 8]));
        poll.refresh(t0 + Duration::from_secs(9), &listed(&[7, 8]));
        assert_eq!(*asked.lock().expect("lock"), vec![7, 8]);
        poll.refresh(t0 + Duration::from_secs(10), &listed(&[7, 8]));
        assert_eq!(asked.lock().expect("lock").len(), 4);
        assert_eq!(
            poll.memory_on(7, "GPU-aaaa", false)
                .and_then(|m| m.allocated_bytes),
            Some(7)
        );
    }

    #[test]
    fn the_cadence_counts_on_the_callers_time_line_not_the_real_clock() {
        let (mut poll, asked) = counting_poll(PollLimits::default(), true);
        // No real time passes between these calls: only the given times decide.
        poll.refresh_at_ms(1_000, &listed(&[7]));
        poll.refresh_at_ms(10_999, &listed(&[7]));
        assert_eq!(asked.lock().expect("lock").len(), 1);
        poll.refresh_at_ms(11_000, &listed(&[7]));
        assert_eq!(asked.lock().expect("lock").len(), 2);
        // A time line that went back (another clock) does not silence the agent.
        poll.refresh_at_ms(500, &listed(&[7]));
        assert_eq!(asked.lock().expect("lock").len(), 3);
    }

    #[test]
    fn a_reused_pid_is_not_credited_with_the_old_answer() {
        let (mut poll, asked) = counting_poll(PollLimits::default(), true);
        let t0 = Instant::now();
        poll.refresh(t0, &listed(&[7]));
        let reused = [Polled {
            pid: 7,
            start_time_ticks: Some(2),
        }];
        poll.refresh(t0 + Duration::from_secs(1), &reused);
        assert_eq!(asked.lock().expect("lock").len(), 2);
        poll.refresh(t0 + Duration::from_secs(2), &[]);
        assert!(poll.stats(7).is_none());
    }

    #[test]
    fn a_spent_tick_budget_leaves_the_rest_for_the_next_refresh() {
        let limits = PollLimits {
            per_tick: Duration::ZERO,
            ..PollLimits::default()
        };
        let (mut poll, asked) = counting_poll(limits, false);
        let report = poll.refresh(Instant::now(), &listed(&[1, 2, 3]));
        assert_eq!((report.asked, report.deferred), (0, 3));
        assert!(asked.lock().expect("lock").is_empty());
    }

    #[test]
    fn an_agent_that_stops_answering_loses_its_figures() {
        let answers = Arc::new(Mutex::new(true));
        let flag = Arc::clone(&answers);
        let mut poll = AgentPoll::with_ask(
            PollLimits::default(),
            Box::new(move |_, _| {
                (*flag.lock().expect("lock")).then(|| stats(vec![device(Some("a"), 1, Some(1))]))
            }),
        );
        let t0 = Instant::now();
        poll.refresh(t0, &listed(&[7]));
        assert!(poll.stats(7).is_some());
        *answers.lock().expect("lock") = false;
        poll.refresh(t0 + DEFAULT_CADENCE, &listed(&[7]));
        assert!(poll.stats(7).is_none());
    }
}
