//! What the UI shows for one moment: a GPU [`Snapshot`] joined with what /proc says about
//! its processes (and their parents, for the tree view), plus the verdicts of the
//! analysis. Built off the UI thread by the [`Observer`] (live, through the process catalog
//! every frontend reads) or read from a recording (replay), so drawing never touches /proc
//! or NVML.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use vramctl_agent::agent_client::AgentMemory;
use vramctl_agent::agent_poll::{self, AgentPoll, PollLimits};
use vramctl_core::types::Snapshot;
use vramctl_kube::{KubeletView, PodContainer, ProcessPod};
use vramctl_leaks::analysis::IdleState;
use vramctl_procs::container::{ContainerFacts, PodQos};
use vramctl_procs::process_catalog::{
    FactsSource, LiveProc, ProcSource, ProcessCatalog, RefreshPolicy, listed_pids,
};
use vramctl_procs::procinfo::ProcessFacts;
use vramctl_procs::procinfo::{self, ProcessDetails};

use crate::agent_ooms::{AgentOoms, ClassifyFn, OomWatch};
use crate::kubernetes::{self, KubeletSource};
use crate::pid_view::{LocalPids, PidView};

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
    /// GPU UUID → the pod containers the kubelet gave it (or one of its MIG instances),
    /// whether or not their processes are visible here (`crate::kubernetes`); empty off
    /// Kubernetes, when the kubelet could not be asked, and in a replay.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kubernetes_gpus: BTreeMap<String, Vec<PodContainer>>,
    /// The OOMs the processes' agents reported, with the first one's cause and fix
    /// (`crate::agent_ooms`), by PID; empty without agents, and in a replay.
    #[serde(default, skip_serializing_if = "AgentOoms::is_empty")]
    pub ooms: AgentOoms,
    /// What the snapshot's PIDs are (`crate::pid_view`): this /proc's, mapped for this PID
    /// namespace by a host daemon (with the others' memory per GPU), or host PIDs that
    /// nothing here maps — then no process was looked up in this /proc.
    #[serde(default, skip_serializing_if = "PidView::is_same")]
    pub pid_view: PidView,
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
            kubernetes_gpus: BTreeMap::new(),
            ooms: AgentOoms::default(),
            pid_view: PidView::Same,
        }
    }

    /// Puts `view`'s Kubernetes facts on the observation: each GPU's pod containers, and
    /// each visible process's pod where its cgroup names one the kubelet knows
    /// (`vramctl_kube::attribution` says why nothing else names a process).
    pub fn add_kubernetes(&mut self, view: &KubeletView) {
        self.kubernetes_gpus = kubernetes::gpu_holders(&self.snapshot, view);
        let uuids_by_pid = kubernetes::gpu_uuids_by_pid(&self.snapshot);
        for (pid, host) in &mut self.hosts {
            let uuids: Vec<&str> = uuids_by_pid
                .get(pid)
                .map(|u| u.iter().map(String::as_str).collect())
                .unwrap_or_default();
            host.kubernetes = view.pod_of_process(host.pod_uid.as_deref(), &uuids);
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
///
/// The facts after `cpu_time_ms` came later: absent from older recordings (`None` when
/// read back) and left out of the JSON when unknown, so a recording without them reads as
/// before.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// Real user id (`user` may be its name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Resident memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Number of threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// The container's 64-hex-digit id (Docker, containerd, CRI-O, Podman).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The Kubernetes pod UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The pidfs id of the process (Linux 6.9+), finer than the start time
    /// (`kill PID@START:ID`). Read by the one-shot observation
    /// (`crate::live_source::LiveSource::observe`), which pins each process once; the
    /// [`Observer`] does not pin every process every tick for it, and leaves it `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pidfd_id: Option<u64>,
    /// Its cgroup v2 path (untrusted text: escape it for a terminal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The Slurm job it runs in (`vramctl_procs::slurm`: from its cgroup path, else its
    /// environment, with the source named); user and partition are untrusted text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<vramctl_procs::slurm::SlurmJob>,
    /// Its container: id, runtime, name (from the runtime's state; untrusted text) and, for
    /// a rootless one, the user whose cgroup subtree holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerFacts>,
    /// Its Kubernetes pod's QoS class, from the cgroup path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_qos: Option<PodQos>,
    /// The Kubernetes pod (and container) it runs in, where its `pod_uid` names a pod the
    /// kubelet knows (`crate::kubernetes`; docs/owners.md). Names are the pod creator's
    /// text: escape them for a terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<ProcessPod>,
}

impl HostProcess {
    /// The user's name, `None` when the user database knows only the uid (`user` then
    /// holds the uid as text): what the history and `reap` record as the user.
    pub fn user_name(&self) -> Option<&str> {
        let uid_text = self.uid.map(|u| u.to_string());
        self.user
            .as_deref()
            .filter(|name| uid_text.as_deref() != Some(*name))
    }

    /// Exited and waiting for its parent to reap it.
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, Some('Z' | 'X' | 'x'))
    }

    /// A process as `details` (this /proc read now, or a daemon's answer) describe it:
    /// what `status` maps, whichever of the two answered. `ticks_per_second` turns its CPU
    /// ticks into time; no CPU % from one reading.
    pub fn from_details(details: &ProcessDetails, ticks_per_second: u64) -> Self {
        Self {
            pid: details.pid,
            ppid: details.ppid,
            user: details
                .user
                .clone()
                .or_else(|| details.uid.map(|u| u.to_string())),
            command: details.command.clone(),
            state: details.state,
            start_time_ticks: details.start_time_ticks,
            started_at_unix_ms: details.started_at_unix_ms,
            cpu_percent: None,
            cpu_time_ms: details.cpu_ticks.and_then(|t| {
                u64::try_from(u128::from(t) * 1000 / u128::from(ticks_per_second.max(1))).ok()
            }),
            uid: details.uid,
            rss_bytes: details.rss_bytes,
            threads: details.threads,
            container_id: details.container.container_id.clone(),
            pod_uid: details.container.pod_uid.clone(),
            pidfd_id: None,
            cgroup: details.container.cgroup.clone(),
            slurm: details.slurm.clone(),
            container: details.container.facts(),
            pod_qos: details.container.pod_qos,
            kubernetes: None,
        }
    }

    /// The pidfs id of the process `pid` that started at `start_time_ticks`: pinned first,
    /// then its start time read again, so the id is not another process's that took the PID
    /// since. `None` where the kernel has no pidfs ids, or the process is gone.
    pub fn pidfd_id_of(pid: u32, start_time_ticks: u64) -> Option<u64> {
        let handle = vramctl_procs::signal::PidHandle::pin(pid).ok()?;
        let same = procinfo::read_stat(pid).is_ok_and(|s| s.start_time_ticks == start_time_ticks);
        (same && !handle.has_exited())
            .then(|| handle.pidfd_id())
            .flatten()
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

/// Decides verdicts from the observations it is fed, one at a time, in time order.
///
/// The analysis-backed implementation (`crate::verdict::AnalysisJudge`) keeps a tracker per
/// series (it sees every observation) and may read the store for a longer past. Declared
/// here, beside the [`Observer`] that may own one, so the observation does not import the
/// analysis' module (`crate::verdict` names it too).
pub trait Judge: Send {
    /// The verdicts as of `observation`.
    fn judge(&mut self, observation: &Observation) -> Verdicts;
}

/// The one observer of the machine: joins snapshots with /proc through the process
/// catalog (`vramctl_procs::process_catalog::ProcessCatalog`) — the GPU processes and, for
/// the tree view, their ancestors, user and command line once per process identity (boot,
/// PID, start time), `/proc/PID/stat` (state, parent, CPU time) at most once per
/// `stat_every_ms` per process, so hundreds of processes cost a few reads a tick.
///
/// It also asks the processes' agents for their memory (`vramctl_agent::agent_poll`: each
/// agent at most every 10 s, 250 ms per agent and per tick), on the caller's thread (the
/// sampler's, so a slow agent never stalls a frame), and, given a [`Judge`], fills the
/// verdicts. Every time it counts is the snapshot's (`monotonic_ms`): it never reads a
/// clock, so a simulated one drives it whole.
///
/// Built once per frontend by [`Observer::builder`]; what differs between frontends (where
/// facts come from, how fresh, agents or not) is the builder's, not a catalog of their own.
#[derive(Debug)]
pub struct Observer {
    catalog: ProcessCatalog,
    agents: Option<AgentPoll>,
    judge: Option<Box<dyn Judge>>,
    ancestors: bool,
    kubelet: Option<KubeletSource>,
    /// The agents' OOMs and their causes (only with agents).
    oom_watch: OomWatch,
    /// Set when this /proc is not the host's and the observer decides what NVML's PIDs
    /// are, per snapshot (`ObserverBuilder::pids_decided_by_caller`).
    local_pids: Option<LocalPids>,
}

impl std::fmt::Debug for dyn Judge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Judge")
    }
}

impl Default for Observer {
    fn default() -> Self {
        Self::new()
    }
}

/// How an [`Observer`] reads: see [`Observer::builder`].
#[derive(Debug)]
pub struct ObserverBuilder {
    facts: FactsSource,
    policy: RefreshPolicy,
    proc_source: Option<(Option<String>, Box<dyn ProcSource>)>,
    agents: Option<AgentPoll>,
    judge: Option<Box<dyn Judge>>,
    ancestors: bool,
    /// `None`: decided at `build` (`KubeletSource::from_env` on this system's /proc).
    kubelet: Option<Option<KubeletSource>>,
    /// `None`: classifies through the agents (`agent_ooms::classify_through_agent`).
    oom_watch: Option<OomWatch>,
    /// Whether the caller decides what the snapshots' PIDs are (see
    /// [`ObserverBuilder::pids_decided_by_caller`]).
    pids_decided_by_caller: bool,
}

impl ObserverBuilder {
    /// The caller decides whether a snapshot's PIDs are this /proc's and observes only
    /// those that are (`top`, whose frames come from a host daemon's mapped answer or from
    /// NVML here). By default the observer decides itself, at every snapshot, when this
    /// /proc is not the host's (a container): NVML's rows are looked up here only when
    /// they check out as this namespace's (`pid_view::rows_held_here`), else the
    /// observation is bare — `record` and `serve` inside a container never name a process
    /// of theirs after a host PID.
    #[must_use]
    pub fn pids_decided_by_caller(mut self) -> Self {
        self.pids_decided_by_caller = true;
        self
    }

    /// Where Kubernetes facts come from (`None`: none). Default: the kubelet's socket and
    /// pod log directory when either exists on this system, none with a scripted
    /// `proc_source` (its PIDs are not this system's).
    #[must_use]
    pub fn kubelet(mut self, kubelet: Option<KubeletSource>) -> Self {
        self.kubelet = Some(kubelet);
        self
    }

    /// Where process facts come from (default: /proc).
    #[must_use]
    pub fn facts(mut self, facts: FactsSource) -> Self {
        self.facts = facts;
        self
    }

    /// How often what changes is re-read (default: `RefreshPolicy::default()`).
    #[must_use]
    pub fn refresh(mut self, policy: RefreshPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Reads processes through `source` on the boot `boot_id` instead of this system's
    /// /proc (tests script one).
    #[must_use]
    pub fn proc_source(mut self, boot_id: Option<String>, source: Box<dyn ProcSource>) -> Self {
        self.proc_source = Some((boot_id, source));
        self
    }

    /// Asks the processes' agents through `agents` (tests give a stand-in); `None`: asks
    /// none, and the observations carry no agent figures.
    #[must_use]
    pub fn agents(mut self, agents: Option<AgentPoll>) -> Self {
        self.agents = agents;
        self
    }

    /// Fills the observations' verdicts with `judge` (default: none, verdicts empty).
    #[must_use]
    pub fn judge(mut self, judge: Box<dyn Judge>) -> Self {
        self.judge = Some(judge);
        self
    }

    /// Whether the observations hold the GPU processes' ancestors too (default: yes, for
    /// the tree view); without, only the listed processes are read.
    #[must_use]
    pub fn ancestors(mut self, ancestors: bool) -> Self {
        self.ancestors = ancestors;
        self
    }

    /// Classifies the agents' first OOMs with `classify` instead of asking the agents
    /// (tests give a stand-in).
    #[must_use]
    pub fn oom_classifier(mut self, classify: Box<ClassifyFn>) -> Self {
        self.oom_watch = Some(OomWatch::with_classifier(classify));
        self
    }

    /// The observer, knowing no process yet.
    pub fn build(self) -> Observer {
        let scripted = self.proc_source.is_some();
        let kubelet = self.kubelet.unwrap_or_else(|| {
            if scripted {
                None
            } else {
                KubeletSource::from_env()
            }
        });
        let (boot_id, proc_source) = self
            .proc_source
            .unwrap_or_else(|| (procinfo::boot_id(), Box::new(LiveProc::new())));
        // A scripted /proc has no namespace of ours to check against.
        let local_pids = (!scripted && !self.pids_decided_by_caller)
            .then(LocalPids::here)
            .filter(|local| !local.is_host());
        Observer {
            // The one place a frontend's process catalog is made.
            catalog: ProcessCatalog::with_source(self.facts, self.policy, boot_id, proc_source),
            local_pids,
            agents: self.agents,
            judge: self.judge,
            ancestors: self.ancestors,
            kubelet,
            oom_watch: self.oom_watch.unwrap_or_default(),
        }
    }
}

impl Observer {
    /// An observer of this system's /proc, asking agents, without a judge.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// An observer of this system's /proc asking agents through `agents` (tests give a
    /// stand-in).
    pub fn with_agents(agents: AgentPoll) -> Self {
        Self::builder().agents(Some(agents)).build()
    }

    /// The defaults: /proc, the default refresh policy, the real agents (the one place a
    /// frontend's agent poll is made), ancestors, no judge.
    pub fn builder() -> ObserverBuilder {
        ObserverBuilder {
            facts: FactsSource::Proc,
            policy: RefreshPolicy::default(),
            proc_source: None,
            agents: Some(AgentPoll::new(PollLimits::default())),
            judge: None,
            ancestors: true,
            kubelet: None,
            oom_watch: None,
            pids_decided_by_caller: false,
        }
    }

    /// The catalog the observations are joined through, for what an [`Observation`] does
    /// not carry yet (the recorder's CPU ticks and container ids, the daemon socket's
    /// `ProcessDetails`): they read the observer's catalog, never one of their own.
    pub fn catalog_mut(&mut self) -> &mut ProcessCatalog {
        &mut self.catalog
    }

    /// The boot the observed PIDs and start times belong to.
    pub fn boot_id(&self) -> Option<&str> {
        self.catalog.boot_id()
    }

    /// What the observer's catalog read so far (its cost, for tests and measurements).
    pub fn counters(&self) -> vramctl_procs::process_catalog::CatalogCounters {
        self.catalog.counters()
    }

    /// Clock ticks per second of the observed /proc (CPU times in ticks, as the history
    /// stores them, from the observations' milliseconds).
    pub fn ticks_per_second(&self) -> u64 {
        self.catalog.ticks_per_second()
    }

    /// The agents' poll, when the observer asks agents.
    pub fn agent_poll(&self) -> Option<&AgentPoll> {
        self.agents.as_ref()
    }

    /// Asks the agents of `snapshot`'s processes that are due, at the snapshot's time (the
    /// catalog must have observed it): what [`observe`](Self::observe) does, for a frontend
    /// that reads the catalog itself (`record`, outside its sampler's lock).
    pub fn refresh_agents(&mut self, snapshot: &Snapshot) {
        if let Some(agents) = self.agents.as_mut() {
            let polled = agent_poll::polled_processes(snapshot, &self.catalog);
            agents.refresh_at_ms(snapshot.monotonic_ms, &polled);
        }
    }

    /// The snapshot joined with /proc, its agents' figures and, given a judge, its
    /// verdicts. `driver_name` is asked for GPU processes /proc cannot see (it calls the
    /// backend, on the sampler's thread), once per process.
    pub fn observe(
        &mut self,
        snapshot: Snapshot,
        driver_name: impl FnMut(u32) -> Option<String>,
    ) -> Observation {
        let mut observation = self.observe_processes(snapshot, driver_name);
        if !observation.pid_view.pids_are_ours() {
            // NVML's numbers name no process here: no agent is asked by them either.
            return observation;
        }
        observation.agents = self.agent_figures(&observation.snapshot);
        if let Some(poll) = self.agents.as_ref() {
            // Never blocks: the snapshots are read by the watch's own thread.
            observation.ooms =
                self.oom_watch
                    .update(&observation.snapshot, poll, &observation.starts());
        }
        if let Some(judge) = self.judge.as_mut() {
            observation.verdicts = judge.judge(&observation);
        }
        observation
    }

    /// The snapshot joined with /proc only: no agent asked, no verdicts. For a frontend that
    /// asks the agents elsewhere ([`refresh_agents`](Self::refresh_agents): `record`, outside
    /// its sampler's lock).
    pub fn observe_processes(
        &mut self,
        snapshot: Snapshot,
        mut driver_name: impl FnMut(u32) -> Option<String>,
    ) -> Observation {
        let pid_view = self
            .local_pids
            .as_mut()
            .map_or(PidView::Same, |local| local.view(&snapshot));
        if !pid_view.pids_are_ours() {
            // Host PIDs: a lookup here would name whichever process of ours has the number.
            let mut observation = Observation::bare(snapshot);
            observation.pid_view = pid_view;
            return observation;
        }
        // CPU % is a rate: measured on the monotonic clock, so a wall-clock step neither
        // hides it (a step back made every interval look negative) nor dilutes it.
        let at_ms = snapshot.monotonic_ms;
        let gpu_pids = listed_pids(&snapshot);
        if self.ancestors {
            self.catalog
                .observe_with_ancestors(&gpu_pids, at_ms, &mut driver_name);
        } else {
            self.catalog.observe(&gpu_pids, at_ms, &mut driver_name);
        }
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
                            uid: facts.uid,
                            rss_bytes: Some(stat.rss_bytes),
                            threads: Some(stat.threads),
                            container_id: facts.container.container_id.clone(),
                            pod_uid: facts.container.pod_uid.clone(),
                            pidfd_id: None,
                            cgroup: facts.container.cgroup.clone(),
                            slurm: facts.slurm.clone(),
                            container: facts.container.facts(),
                            pod_qos: facts.container.pod_qos,
                            kubernetes: None,
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
        let mut observation = Observation {
            snapshot: Arc::new(snapshot),
            hosts,
            driver_names,
            verdicts: Verdicts::default(),
            agents: AgentFigures::default(),
            kubernetes_gpus: BTreeMap::new(),
            ooms: AgentOoms::default(),
            pid_view,
        };
        if let Some(kubelet) = self.kubelet.as_mut() {
            // Read at most every `kubernetes::REFRESH_MS` of the snapshots' time.
            observation.add_kubernetes(kubelet.view_at(observation.snapshot.monotonic_ms));
        }
        observation
    }

    /// Asks the agents that are due, and gives every (process, GPU) figure the poll has.
    fn agent_figures(&mut self, snapshot: &Snapshot) -> AgentFigures {
        self.refresh_agents(snapshot);
        let Some(poll) = self.agents.as_ref() else {
            return AgentFigures::default();
        };
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
                if let Some(memory) = poll
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
                info: Arc::new(DeviceInfo::new(
                    0,
                    "GPU-00000000-0000-0000-0000-000000000000",
                )),
                state: DeviceState::Ok(DeviceReading {
                    processes: Some(processes),
                    ..DeviceReading::default()
                }),
            }],
            unopened: Vec::new(),
        }
    }

    #[test]
    fn kubernetes_facts_name_a_mig_process_by_its_instance_and_each_gpu_by_its_holders() {
        use vramctl_core::types::MigInstanceInfo;
        use vramctl_kube::allocation::{Allocation, DeviceId, GpuAllocations};
        use vramctl_kube::pod_logs::PodName;

        const MIG: &str = "MIG-1f2e3d4c-5b6a-5980-a1b2-c3d4e5f60718";
        const UID: &str = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b";
        let mut snapshot = snapshot_with(&[4242, 4343], 1_000);
        let device = &mut snapshot.devices[0];
        let mut info = (*device.info).clone();
        info.mig_instances = vec![MigInstanceInfo {
            uuid: MIG.into(),
            name: None,
            gpu_instance_id: Some(7),
            compute_instance_id: Some(0),
        }];
        device.info = Arc::new(info);
        if let DeviceState::Ok(reading) = &mut device.state {
            for p in reading.processes.iter_mut().flatten() {
                p.gpu_instance_id = Some(7);
                p.compute_instance_id = Some(0);
            }
        }
        let mut observation = Observation::bare(snapshot);
        let in_pod = HostProcess {
            pid: 4242,
            pod_uid: Some(UID.into()),
            ..HostProcess::default()
        };
        let on_host = HostProcess {
            pid: 4343,
            ..HostProcess::default()
        };
        observation.hosts.insert(4242, in_pod);
        observation.hosts.insert(4343, on_host);
        let owner = PodContainer {
            namespace: "ml".into(),
            pod: "infer".into(),
            container: "server".into(),
        };
        let view = KubeletView {
            allocations: Some(GpuAllocations {
                allocations: vec![Allocation {
                    owner: owner.clone(),
                    resource_name: "nvidia.com/mig-1g.18gb".into(),
                    device: DeviceId::Mig {
                        uuid: MIG.into(),
                        parent_gpu_uuid: None,
                    },
                    replica: None,
                }],
            }),
            allocations_error: None,
            names_by_uid: [(
                UID.to_string(),
                PodName {
                    namespace: "ml".into(),
                    pod: "infer".into(),
                },
            )]
            .into(),
        };
        observation.add_kubernetes(&view);
        let pod = observation.hosts[&4242]
            .kubernetes
            .clone()
            .expect("in a pod");
        assert_eq!(
            pod.container.as_deref(),
            Some("server"),
            "named by its MIG instance"
        );
        assert_eq!(
            observation.hosts[&4343].kubernetes, None,
            "a host process is in no pod"
        );
        assert_eq!(
            observation.kubernetes_gpus["GPU-00000000-0000-0000-0000-000000000000"],
            [owner]
        );
        // Serialised only where known: an observation without them reads as before.
        let json = serde_json::to_string(&Observation::bare(snapshot_with(&[], 0))).expect("json");
        assert!(!json.contains("kubernetes"), "{json}");
    }

    #[test]
    fn our_process_and_its_parents_are_seen() {
        let me = std::process::id();
        let mut reader = Observer::new();
        let obs = reader.observe(snapshot_with(&[me], 1_000), |_| None);
        let host = obs.hosts.get(&me).expect("we are visible");
        assert!(!host.command.is_empty());
        assert!(host.start_time_ticks.is_some());
        assert_eq!(host.cpu_percent, None, "no CPU figure from one reading");
        assert!(host.cpu_time_ms.is_some());
        assert!(host.uid.is_some() && host.rss_bytes.is_some() && host.threads.is_some());
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").expect("our cgroup");
        assert_eq!(
            host.cgroup.as_deref(),
            cgroup.lines().find_map(|l| l.strip_prefix("0::")),
            "the cgroup v2 path, as /proc/self/cgroup names it"
        );
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
        let mut reader = Observer::new();
        let obs = reader.observe(snapshot_with(&[pid], 0), |p| Some(format!("name of {p}")));
        assert!(!obs.hosts.contains_key(&pid));
        assert_eq!(obs.driver_names[&pid], "name of 4194305");
    }

    #[test]
    fn agent_figures_go_only_to_processes_with_an_agent() {
        use vramctl_agent::agent_client::{DeviceStats, Stats};
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
        let mut reader = Observer::with_agents(poll);
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

    /// A judge that marks every listed process a leak on every device: shows the
    /// observer hands it the joined observation.
    struct EveryoneLeaks;

    impl Judge for EveryoneLeaks {
        fn judge(&mut self, observation: &Observation) -> Verdicts {
            let mut out = Verdicts::default();
            for device in &observation.snapshot.devices {
                for p in device
                    .reading()
                    .and_then(|r| r.processes.as_ref())
                    .into_iter()
                    .flatten()
                {
                    // Only what the observation joined: the process's command is known.
                    if observation.hosts.contains_key(&p.pid) {
                        out.insert(
                            p.pid,
                            &device.info.uuid,
                            ProcessVerdict {
                                kind: VerdictKind::Leak,
                                summary: String::new(),
                                numbers: Vec::new(),
                                idle: None,
                            },
                        );
                    }
                }
            }
            out
        }
    }

    #[test]
    fn the_observers_judge_fills_the_verdicts_of_the_joined_observation() {
        let me = std::process::id();
        let uuid = "GPU-00000000-0000-0000-0000-000000000000";
        let mut plain = Observer::builder().agents(None).build();
        assert!(
            plain
                .observe(snapshot_with(&[me], 0), |_| None)
                .verdicts
                .is_empty()
        );
        let mut judged = Observer::builder()
            .agents(None)
            .judge(Box::new(EveryoneLeaks))
            .build();
        let obs = judged.observe(snapshot_with(&[me], 0), |_| None);
        assert_eq!(
            obs.verdicts.get(me, uuid).map(|v| v.kind),
            Some(VerdictKind::Leak)
        );
    }

    #[test]
    fn without_ancestors_only_the_listed_processes_are_read() {
        let me = std::process::id();
        let mut observer = Observer::builder().agents(None).ancestors(false).build();
        let obs = observer.observe(snapshot_with(&[me], 0), |_| None);
        assert_eq!(obs.hosts.keys().copied().collect::<Vec<_>>(), vec![me]);
    }

    #[test]
    fn agents_are_asked_on_the_snapshots_time_and_not_at_all_without_a_poll() {
        use std::sync::Mutex;
        let me = std::process::id();
        let asked = Arc::new(Mutex::new(0_u32));
        let counter = Arc::clone(&asked);
        let poll = AgentPoll::with_ask(
            PollLimits::default(),
            Box::new(move |_, _| {
                *counter.lock().expect("lock") += 1;
                None
            }),
        );
        let mut observer = Observer::with_agents(poll);
        // Three observations within one real instant: 10 s apart on the snapshots' clock.
        for at_ms in [0, 5_000, 10_000] {
            observer.observe(snapshot_with(&[me], at_ms), |_| None);
        }
        assert_eq!(*asked.lock().expect("lock"), 2, "asked at 0 and at 10 s");
        let mut silent = Observer::builder().agents(None).build();
        let obs = silent.observe(snapshot_with(&[me], 0), |_| None);
        assert!(obs.agents.is_empty());
        assert!(silent.agent_poll().is_none());
    }

    #[test]
    fn details_from_a_daemon_or_here_map_to_the_same_host_process() {
        let details = ProcessDetails {
            pid: 42,
            uid: Some(1000),
            user: None,
            command: "python train.py".into(),
            comm: Some("python".into()),
            ppid: Some(7),
            state: Some('S'),
            start_time_ticks: Some(900),
            started_at_unix_ms: Some(5),
            cpu_ticks: Some(250),
            rss_bytes: Some(1 << 30),
            threads: Some(4),
            kernel_thread: false,
            container: vramctl_procs::procinfo::ContainerInfo::default(),
            slurm: None,
        };
        let host = HostProcess::from_details(&details, 100);
        assert_eq!(host.user.as_deref(), Some("1000"), "uid when no user name");
        assert_eq!(host.command, "python train.py");
        assert_eq!(host.cpu_time_ms, Some(2_500));
        assert_eq!(host.cpu_percent, None, "no rate from one reading");
        assert_eq!((host.ppid, host.state), (Some(7), Some('S')));
        assert_eq!(
            (host.uid, host.rss_bytes, host.threads),
            (Some(1000), Some(1 << 30), Some(4))
        );
        // Through the daemon's JSON, the same process.
        let json = serde_json::to_string(&details).expect("encode");
        let back: ProcessDetails = serde_json::from_str(&json).expect("decode");
        assert_eq!(HostProcess::from_details(&back, 100), host);
    }
}
