//! What the UI shows for one moment: a GPU [`Snapshot`] joined with what /proc says about
//! its processes (and their parents, for the tree view), plus the verdicts of the
//! analysis. Built off the UI thread by [`HostReader`] (live, through the process catalog
//! every frontend reads) or read from a recording (replay), so drawing never touches /proc
//! or NVML.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use vramctl_core::agent_client::AgentMemory;
use vramctl_core::agent_poll::{self, AgentPoll, PollLimits};
use vramctl_core::analysis::IdleState;
use vramctl_core::analysis::live::ProcessFacts;
use vramctl_core::process_catalog::{FactsSource, ProcessCatalog, listed_pids};
use vramctl_core::types::Snapshot;

/// One moment as the UI shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// What the GPUs said.
    pub snapshot: Arc<Snapshot>,
    /// Every GPU process visible in this PID namespace, and their ancestors (up to, not
    /// including, PID 1), by PID.
    pub hosts: BTreeMap<u32, HostProcess>,
    /// The driver's process names for GPU processes /proc cannot see (another PID
    /// namespace).
    pub driver_names: BTreeMap<u32, String>,
    /// Leak and idle verdicts, per process and device (empty until the analysis is wired).
    pub verdicts: Verdicts,
    /// What the processes' agents say of their framework's memory, per process and GPU
    /// (empty when no process has an agent, and in a replay).
    #[serde(default)]
    pub agents: AgentFigures,
}

impl Observation {
    /// An observation with nothing known about the processes beyond the snapshot.
    pub fn bare(snapshot: Snapshot) -> Self {
        Self {
            snapshot: Arc::new(snapshot),
            hosts: BTreeMap::new(),
            driver_names: BTreeMap::new(),
            verdicts: Verdicts::default(),
            agents: AgentFigures::default(),
        }
    }

    /// When the snapshot was taken.
    pub fn taken_at_unix_ms(&self) -> i64 {
        self.snapshot.taken_at_unix_ms
    }

    /// The start time of every visible process, by PID: who each PID is.
    pub fn starts(&self) -> Starts {
        self.hosts
            .iter()
            .filter_map(|(pid, h)| Some((*pid, h.start_time_ticks?)))
            .collect()
    }
}

/// Who a process is beyond its PID: its start time in clock ticks after boot, by PID, as
/// /proc showed it (live) or as recorded (replay). A PID without one is not visible.
pub type Starts = BTreeMap<u32, u64>;

/// What the analysis concluded about one process's memory on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum VerdictKind {
    /// Retained memory keeps growing after warm-up.
    Leak,
    /// Holds memory and has not used the GPU for a while.
    IdleHolder,
    /// Growing, not (yet) a leak.
    Growing,
    /// Not growing.
    Stable,
    /// Allocates and frees in cycles on a stable floor.
    Sawtooth,
}

impl VerdictKind {
    /// The word shown in the detail pane.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Leak => "leak",
            Self::IdleHolder => "idle holder",
            Self::Growing => "growing",
            Self::Stable => "stable",
            Self::Sawtooth => "sawtooth",
        }
    }
}

/// A verdict with its explanation and the numbers that produced it, ready to show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessVerdict {
    /// The conclusion.
    pub kind: VerdictKind,
    /// One line, e.g. `leaks 38 MB/s since 14:02:10 UTC; GPU 0 full in 6 min`.
    pub summary: String,
    /// `(name, value)` pairs: slope, significance, onset, time to full, ...
    pub numbers: Vec<(String, String)>,
    /// What the idle evidence says at the verdict's time (`IdleReport::state`): the IDLE
    /// column's one source. `None`: not judged.
    #[serde(default)]
    pub idle: Option<IdleState>,
}

/// Verdicts by `(pid, device UUID)` (a series is one process on one device, or MIG
/// instance).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdicts {
    by_process: BTreeMap<(u32, String), ProcessVerdict>,
}

impl Verdicts {
    /// Records the verdict on `pid` on the device `uuid`.
    pub fn insert(&mut self, pid: u32, uuid: &str, verdict: ProcessVerdict) {
        self.by_process.insert((pid, uuid.to_owned()), verdict);
    }

    /// The verdict on `pid` on the device `uuid`, if any.
    pub fn get(&self, pid: u32, uuid: &str) -> Option<&ProcessVerdict> {
        self.by_process.get(&(pid, uuid.to_owned()))
    }

    /// Whether there is no verdict at all.
    pub fn is_empty(&self) -> bool {
        self.by_process.is_empty()
    }
}

/// The agents' figures by `(pid, device UUID)`: allocated and cached (reclaimable) bytes as
/// `ps` shows them; a process without an agent has no entry (absent, never 0).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentFigures {
    by_process: BTreeMap<(u32, String), AgentMemory>,
}

impl AgentFigures {
    /// Records what `pid`'s agent says of the device `uuid`.
    pub fn insert(&mut self, pid: u32, uuid: &str, memory: AgentMemory) {
        self.by_process.insert((pid, uuid.to_owned()), memory);
    }

    /// What `pid`'s agent says of the device `uuid`, if it has an agent that names it.
    pub fn get(&self, pid: u32, uuid: &str) -> Option<&AgentMemory> {
        self.by_process.get(&(pid, uuid.to_owned()))
    }

    /// Whether no process has figures.
    pub fn is_empty(&self) -> bool {
        self.by_process.is_empty()
    }
}

/// A process as /proc described it at the moment of the observation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostProcess {
    /// PID in our namespace.
    pub pid: u32,
    /// Parent PID.
    pub ppid: Option<u32>,
    /// User name (or uid as text when the user database does not know it).
    pub user: Option<String>,
    /// Command line, or `[comm]`.
    pub command: String,
    /// State letter (`R`, `S`, `D`, `Z`, ...).
    pub state: Option<char>,
    /// Start time in clock ticks after boot: with the PID, who the process is.
    pub start_time_ticks: Option<u64>,
    /// Start as wall-clock time.
    pub started_at_unix_ms: Option<i64>,
    /// CPU use since the previous observation, in percent of one core.
    pub cpu_percent: Option<f32>,
    /// Cumulative user + system CPU time (what the idle analysis takes as evidence).
    pub cpu_time_ms: Option<u64>,
}

impl HostProcess {
    /// Exited and waiting for its parent to reap it.
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, Some('Z' | 'X' | 'x'))
    }

    /// What the live analysis takes from /proc about `host` (`None`: not visible): the
    /// facts the observation already read, so the analysis reads nothing twice.
    pub fn live_facts(host: Option<&Self>) -> ProcessFacts {
        host.map_or_else(ProcessFacts::default, |h| ProcessFacts {
            start_time_ticks: h.start_time_ticks,
            started_at_unix_ms: h.started_at_unix_ms,
            cpu_time_ms: h.cpu_time_ms,
        })
    }
}

/// Joins snapshots with /proc through the process catalog
/// (`vramctl_core::process_catalog::ProcessCatalog`, the one every frontend reads): the
/// GPU processes and their ancestors, user and command line once per process identity
/// (boot, PID, start time), `/proc/PID/stat` (state, parent, CPU time) at most once a
/// second per process, so hundreds of processes cost a few reads a tick.
///
/// It also asks the processes' agents for their memory (`vramctl_core::agent_poll`, the
/// poll `serve` and `record` use: each agent at most every 10 s, 250 ms per agent and per
/// tick), here on the sampler's thread, so a slow agent never stalls a frame.
#[derive(Debug)]
pub struct HostReader {
    catalog: ProcessCatalog,
    agents: AgentPoll,
}

impl Default for HostReader {
    fn default() -> Self {
        Self::new()
    }
}

impl HostReader {
    /// A reader of this system's /proc, knowing no process yet.
    pub fn new() -> Self {
        Self::with_agents(AgentPoll::new(PollLimits::default()))
    }

    /// A reader asking the processes' agents through `agents` (tests give a stand-in).
    pub fn with_agents(agents: AgentPoll) -> Self {
        Self {
            catalog: ProcessCatalog::new(FactsSource::Proc),
            agents,
        }
    }

    /// The snapshot joined with /proc. `driver_name` is asked for GPU processes /proc
    /// cannot see (it calls the backend, on the sampler's thread), once per process.
    pub fn observe(
        &mut self,
        snapshot: Snapshot,
        mut driver_name: impl FnMut(u32) -> Option<String>,
    ) -> Observation {
        // CPU % is a rate: measured on the monotonic clock, so a wall-clock step neither
        // hides it (a step back made every interval look negative) nor dilutes it.
        let at_ms = snapshot.monotonic_ms;
        let gpu_pids = listed_pids(&snapshot);
        self.catalog
            .observe_with_ancestors(&gpu_pids, at_ms, &mut driver_name);
        let tps = self.catalog.ticks_per_second();
        let mut hosts = BTreeMap::new();
        let mut driver_names = BTreeMap::new();
        let pids: Vec<u32> = self.catalog.entries().map(|e| e.pid).collect();
        for pid in pids {
            // PID 1 is no one's GPU process nor an ancestor worth a row.
            if pid <= 1 {
                continue;
            }
            let visible = self.catalog.get(pid).is_some_and(|e| e.visible);
            // Exited between the two reads, or another process under the PID: not shown
            // until the next tick reads it again.
            let stat = visible.then(|| self.catalog.stat(pid, at_ms)).flatten();
            let Some(entry) = self.catalog.get(pid) else {
                continue;
            };
            match stat {
                Some(stat) => {
                    let facts = &entry.facts;
                    #[allow(clippy::cast_possible_truncation)]
                    let cpu_percent = entry.cpu_percent(tps).map(|p| p as f32);
                    hosts.insert(
                        pid,
                        HostProcess {
                            pid,
                            ppid: Some(stat.ppid),
                            user: facts.user_or_uid(),
                            command: facts.command.clone().unwrap_or_default(),
                            state: Some(stat.state),
                            start_time_ticks: entry.start_time_ticks,
                            started_at_unix_ms: facts.started_at_unix_ms,
                            cpu_percent,
                            cpu_time_ms: Some(stat.cpu_time_ms),
                        },
                    );
                }
                None if gpu_pids.binary_search(&pid).is_ok() => {
                    if let Some(name) = entry.facts.command.clone().filter(|_| !visible) {
                        driver_names.insert(pid, name);
                    }
                }
                None => {}
            }
        }
        let agents = self.agent_figures(&snapshot);
        Observation {
            snapshot: Arc::new(snapshot),
            hosts,
            driver_names,
            verdicts: Verdicts::default(),
            agents,
        }
    }

    /// Asks the agents that are due, and gives every (process, GPU) figure the poll has.
    fn agent_figures(&mut self, snapshot: &Snapshot) -> AgentFigures {
        let polled = agent_poll::polled_processes(snapshot, &self.catalog);
        self.agents.refresh(std::time::Instant::now(), &polled);
        let mut gpus_of: BTreeMap<u32, usize> = BTreeMap::new();
        for pid in snapshot
            .devices
            .iter()
            .filter_map(|d| d.reading()?.processes.as_ref())
            .flatten()
            .map(|p| p.pid)
        {
            *gpus_of.entry(pid).or_default() += 1;
        }
        let mut out = AgentFigures::default();
        for device in &snapshot.devices {
            let Some(list) = device.reading().and_then(|r| r.processes.as_ref()) else {
                continue;
            };
            for p in list {
                let only_gpu = gpus_of.get(&p.pid) == Some(&1);
                if let Some(memory) = self
                    .agents
                    .stats(p.pid)
                    .and_then(|s| agent_poll::agent_memory_on(s, &device.info.uuid, only_gpu))
                {
                    out.insert(p.pid, &device.info.uuid, memory);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vramctl_core::types::{
        DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, ProcessKind,
        ProcessUsage,
    };

    use super::*;

    fn snapshot_with(pids: &[u32], at_ms: i64) -> Snapshot {
        let processes = pids
            .iter()
            .map(|&pid| ProcessUsage {
                pid,
                used_bytes: Some(1 << 20),
                kind: ProcessKind::Compute,
                gpu_instance_id: None,
                compute_instance_id: None,
            })
            .collect();
        Snapshot {
            taken_at_unix_ms: at_ms,
            monotonic_ms: at_ms,
            driver: Arc::new(DriverInfo::default()),
            devices: vec![DeviceSnapshot {
                info: Arc::new(DeviceInfo {
                    index: 0,
                    uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                    name: None,
                    pci_bus_id: None,
                    minor_number: None,
                    mig_enabled: None,
                    mig_instances: Vec::new(),
                }),
                state: DeviceState::Ok(DeviceReading {
                    processes: Some(processes),
                    ..DeviceReading::default()
                }),
            }],
            unopened: Vec::new(),
        }
    }

    #[test]
    fn our_process_and_its_parents_are_seen() {
        let me = std::process::id();
        let mut reader = HostReader::new();
        let obs = reader.observe(snapshot_with(&[me], 1_000), |_| None);
        let host = obs.hosts.get(&me).expect("we are visible");
        assert!(!host.command.is_empty());
        assert!(host.start_time_ticks.is_some());
        assert_eq!(host.cpu_percent, None, "no CPU figure from one reading");
        assert!(host.cpu_time_ms.is_some());
        // The parent chain is there for the tree view.
        let parent = host.ppid.expect("we have a parent");
        if parent > 1 {
            assert!(obs.hosts.contains_key(&parent));
        }
        let obs = reader.observe(snapshot_with(&[me], 2_000), |_| None);
        assert!(obs.hosts[&me].cpu_percent.is_some());
    }

    #[test]
    fn invisible_processes_get_the_driver_name() {
        // Above pid_max: never a process here.
        let pid = 4_194_305;
        let mut reader = HostReader::new();
        let obs = reader.observe(snapshot_with(&[pid], 0), |p| Some(format!("name of {p}")));
        assert!(!obs.hosts.contains_key(&pid));
        assert_eq!(obs.driver_names[&pid], "name of 4194305");
    }

    #[test]
    fn agent_figures_go_only_to_processes_with_an_agent() {
        use vramctl_core::agent_client::{DeviceStats, Stats};
        let me = std::process::id();
        let stranger = 4_194_305;
        let poll = AgentPoll::with_ask(
            PollLimits::default(),
            Box::new(move |pid, _| {
                (pid == me).then(|| Stats {
                    taken_at: 0.0,
                    devices: vec![DeviceStats {
                        framework: "torch".into(),
                        index: 0,
                        uuid: Some("00000000-0000-0000-0000-000000000000".into()),
                        allocated_bytes: Some(3),
                        reserved_bytes: Some(10),
                        cached_bytes: Some(7),
                        releasable_bytes: Some(7),
                        inactive_split_bytes: None,
                        allocated_peak_bytes: None,
                        reserved_peak_bytes: None,
                        alloc_retries: None,
                        ooms: None,
                        error: None,
                    }],
                })
            }),
        );
        let mut reader = HostReader::with_agents(poll);
        let obs = reader.observe(snapshot_with(&[me, stranger], 1_000), |_| None);
        let uuid = "GPU-00000000-0000-0000-0000-000000000000";
        let mine = obs
            .agents
            .get(me, uuid)
            .expect("our stand-in agent answered");
        assert_eq!(
            (mine.allocated_bytes, mine.cached_bytes),
            (Some(3), Some(7))
        );
        assert!(
            obs.agents.get(stranger, uuid).is_none(),
            "no agent: absent, not 0"
        );
    }
}
