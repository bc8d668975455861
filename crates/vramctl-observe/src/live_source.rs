//! Where `status` and `ps` get the devices now, and who they ask about a process: a running
//! daemon ([`crate::daemon_socket`]: no NVML start-up here) or, when none answers, NVML in
//! this process with this process's /proc. Both give the same [`Snapshot`] and the same
//! [`Observation`] (`LiveSource::observe`), so what is printed does not depend on which one did.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use vramctl_core::types::{DeviceInfo, DriverInfo, Snapshot};
use vramctl_gpu::{Backend, Sampler};
use vramctl_procs::process_catalog::listed_pids;
use vramctl_procs::procinfo::{ProcReader, ProcessDetails};

use crate::kubernetes::KubeletSource;
use crate::live_loop::LiveSampler;
use crate::observation::{HostProcess, Observation};

use crate::daemon_socket::SampleReply;
use crate::daemon_socket::client::{AskOptions, ask};
use crate::pid_view::{PidView, local_pid_view};

/// Opens NVML here (the command's own `open_sampler`), when no daemon answers.
pub type OpenNvml = Box<dyn FnMut() -> anyhow::Result<LiveSampler>>;

/// The daemon's facts of one answer, by PID.
#[derive(Debug, Default)]
pub struct DaemonFacts {
    processes: Option<HashMap<u32, ProcessDetails>>,
    driver_names: BTreeMap<u32, String>,
    /// What the answer's PIDs are: ours, or mapped for our namespace by a host daemon.
    pid_view: PidView,
}

/// A source of snapshots: a daemon while it answers, NVML here otherwise.
pub struct LiveSource {
    /// How to ask a daemon; `None` with `--no-daemon`, or once one stopped answering.
    ask: Option<AskOptions>,
    /// The first answer, read at [`open`](Self::open) and not yet handed out.
    first: Option<Snapshot>,
    /// The facts of the last answer, while the snapshots come from a daemon.
    facts: Option<DaemonFacts>,
    sampler: Option<LiveSampler>,
    open_nvml: OpenNvml,
    procs: ProcReader,
    /// Kubernetes facts, read here whoever answered (the kubelet's socket is this
    /// machine's); `None` off Kubernetes.
    kubelet: Option<KubeletSource>,
    /// What the last snapshot's PIDs are.
    pid_view: PidView,
}

impl std::fmt::Debug for LiveSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSource")
            .field("daemon", &self.facts.is_some())
            .field("nvml", &self.sampler.is_some())
            .finish_non_exhaustive()
    }
}

impl LiveSource {
    /// Asks a daemon (unless `ask` is `None`: `--no-daemon`); when none answers, opens NVML
    /// with `open_nvml`, whose error (no driver) is the command's.
    ///
    /// # Errors
    /// When no daemon answers and NVML cannot be opened.
    pub fn open(ask: Option<AskOptions>, mut open_nvml: OpenNvml) -> anyhow::Result<Self> {
        let answer = ask.as_ref().and_then(self::ask);
        let (first, facts) = match answer {
            Some(reply) => {
                let (snapshot, facts) = split(reply);
                (Some(snapshot), Some(facts))
            }
            None => (None, None),
        };
        let sampler = if first.is_none() {
            Some(open_nvml()?)
        } else {
            None
        };
        Ok(Self {
            ask: ask.filter(|_| first.is_some()),
            first,
            facts,
            sampler,
            open_nvml,
            procs: ProcReader::new(),
            kubelet: KubeletSource::from_env(),
            pid_view: PidView::Same,
        })
    }

    /// What the PIDs of the last snapshot [`sample`](Self::sample) gave are: NVML's and
    /// ours alike, mapped for our PID namespace by a host daemon, or host PIDs nothing
    /// here can map (`crate::pid_view`).
    pub fn pid_view(&self) -> &PidView {
        &self.pid_view
    }

    /// Whether the last snapshot came from a daemon.
    pub fn from_daemon(&self) -> bool {
        self.facts.is_some()
    }

    /// The devices the next snapshot will show (for `--gpu`).
    pub fn devices(&self) -> Vec<Arc<DeviceInfo>> {
        match (&self.first, &self.sampler) {
            (Some(snapshot), _) => snapshot
                .devices
                .iter()
                .map(|d| Arc::clone(&d.info))
                .collect(),
            (None, Some(sampler)) => sampler.devices().to_vec(),
            (None, None) => Vec::new(),
        }
    }

    /// The devices now: the daemon's answer (asked again after the first), else a tick here;
    /// a daemon that stops answering is replaced by NVML here for good.
    ///
    /// # Errors
    /// When NVML has to be opened here and cannot be.
    pub fn sample(&mut self) -> anyhow::Result<Snapshot> {
        if let Some(first) = self.first.take() {
            self.pid_view = self
                .facts
                .as_ref()
                .map(|f| f.pid_view.clone())
                .unwrap_or_default();
            return Ok(first);
        }
        if let Some(options) = &self.ask {
            if let Some(reply) = ask(options) {
                let (snapshot, facts) = split(reply);
                self.pid_view = facts.pid_view.clone();
                self.facts = Some(facts);
                return Ok(snapshot);
            }
            tracing::debug!("The daemon stopped answering; reading NVML here.");
            self.ask = None;
        }
        self.facts = None;
        if self.sampler.is_none() {
            self.sampler = Some((self.open_nvml)()?);
        }
        match self.sampler.as_mut() {
            Some(sampler) => {
                let snapshot = sampler.tick();
                self.pid_view = local_pid_view(&snapshot);
                Ok(snapshot)
            }
            None => anyhow::bail!("NVML is not open"),
        }
    }

    /// `snapshot` (the last one [`sample`](Self::sample) gave) joined with who its listed
    /// processes are, from the daemon's answer or from here alike: the same
    /// [`HostProcess`]es either way (no ancestors, no agents, no verdicts), and the
    /// driver's names of those /proc cannot see; on Kubernetes, their pods and each GPU's.
    pub fn observe(&mut self, snapshot: Snapshot) -> Observation {
        let mut observation = Observation::bare(snapshot);
        if !self.pid_view.pids_are_ours() {
            // Host PIDs: looking them up here would name whatever process of ours happens
            // to have the same number. Nor does NVML name them (it reads our /proc).
            return observation;
        }
        let tps = self.procs.ticks_per_second();
        let mut lookup = self.lookup();
        for pid in listed_pids(&observation.snapshot) {
            match lookup.details(pid) {
                Some(details) => {
                    let mut host = HostProcess::from_details(&details, tps);
                    // Read here, whoever answered: the daemon shares our PID namespace, and
                    // a pidfs id is the kernel's, not the namespace's.
                    host.pidfd_id = details
                        .start_time_ticks
                        .and_then(|start| HostProcess::pidfd_id_of(pid, start));
                    observation.hosts.insert(pid, host);
                }
                None => {
                    if let Some(name) = lookup.driver_name(pid) {
                        observation.driver_names.insert(pid, name);
                    }
                }
            }
        }
        if let Some(kubelet) = self.kubelet.as_mut() {
            observation.add_kubernetes(kubelet.view_at(observation.snapshot.monotonic_ms));
        }
        observation
    }

    /// Who to ask about the processes of the last snapshot.
    fn lookup(&mut self) -> Lookup<'_> {
        match (&self.facts, self.sampler.as_mut()) {
            (Some(facts), _) => Lookup::Daemon {
                facts,
                procs: &mut self.procs,
            },
            (None, sampler) => Lookup::Local {
                procs: &mut self.procs,
                backend: sampler.map(Sampler::backend_mut),
            },
        }
    }

    /// Ends a one-shot command without shutting NVML down: the process exits next, and
    /// the kernel releases the session with its file descriptors, as it does for a process
    /// killed outright; `nvmlShutdown` would only add its own time to the command's.
    pub fn end_for_exit(mut self) {
        if let Some(sampler) = self.sampler.take() {
            std::mem::forget(sampler);
        }
    }
}

/// The snapshot of `reply`, as `status` would read it here (the daemon's CUDA version is
/// dropped: neither `status` nor `ps` reads it, and `serve` does), and its facts.
fn split(reply: SampleReply) -> (Snapshot, DaemonFacts) {
    let mut snapshot = reply.snapshot;
    if snapshot.driver.cuda_driver_version.is_some() {
        snapshot.driver = Arc::new(DriverInfo {
            cuda_driver_version: None,
            ..(*snapshot.driver).clone()
        });
    }
    let facts = DaemonFacts {
        processes: reply
            .processes
            .map(|list| list.into_iter().map(|d| (d.pid, d)).collect()),
        driver_names: reply.driver_names,
        pid_view: reply.mapped.map_or(PidView::Same, PidView::Mapped),
    };
    (snapshot, facts)
}

/// Answers about processes from a daemon's facts or from here.
enum Lookup<'a> {
    /// From the daemon's answer (its /proc is ours: same PID namespace); from our /proc
    /// when the daemon does not read /proc.
    Daemon {
        /// The answer's facts.
        facts: &'a DaemonFacts,
        /// Our /proc, when the answer has no facts.
        procs: &'a mut ProcReader,
    },
    /// From this process's /proc and NVML session.
    Local {
        /// Our /proc.
        procs: &'a mut ProcReader,
        /// Our NVML session.
        backend: Option<&'a mut Box<dyn Backend>>,
    },
}

impl Lookup<'_> {
    /// What /proc in this PID namespace says about `pid`; `None` when it cannot see it.
    fn details(&mut self, pid: u32) -> Option<ProcessDetails> {
        match self {
            Self::Daemon { facts, procs } => match &facts.processes {
                Some(known) => known.get(&pid).cloned(),
                None => procs.details(pid),
            },
            Self::Local { procs, .. } => procs.details(pid),
        }
    }

    /// The driver's name for a process /proc cannot see.
    fn driver_name(&mut self, pid: u32) -> Option<String> {
        match self {
            Self::Daemon { facts, .. } => facts.driver_names.get(&pid).cloned(),
            Self::Local { backend, .. } => backend.as_mut()?.process_name(pid),
        }
    }
}
