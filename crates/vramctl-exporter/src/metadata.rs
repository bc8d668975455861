//! Labels for the processes in a snapshot: who runs them, what they run, and where.
//!
//! Made by the sampler thread, never by a scrape, from the collector's observation
//! (`vramctl_observe::observation::Observer`, whose catalog reads /proc once per process
//! identity: a reused PID is a new process at the next tick), which the live analysis and
//! `serve --record` read too.

use std::collections::HashMap;

use vramctl_agent::agent_poll::AgentFigures;
use vramctl_core::command_line::abbreviate;
use vramctl_observe::observation::Observation;
use vramctl_procs::process_catalog::{FactsSource, listed_pids};

use crate::owner_series::{self, JobSeries, ProcessOwner};

/// Longest `command` label, in characters; longer command lines are shortened. Prometheus'
/// own default `label_value_length_limit` is unlimited, but long labels cost memory in
/// every series and clutter legends.
pub const COMMAND_MAX_CHARS: usize = 64;

/// Where process labels come from (`--process-details`; the binary parses the flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DetailsSource {
    /// /proc: user, command line, container and pod; the driver's process name when /proc
    /// cannot see the process
    #[default]
    Proc,
    /// Only the driver's process name (no /proc reads: a container without the host PID
    /// namespace)
    Nvml,
    /// No labels beyond the PID (no user names or command lines leave the host)
    None,
}

/// Labels of one process; `None` is exported as an empty (absent) label.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessLabels {
    /// Command line, truncated to [`COMMAND_MAX_CHARS`].
    pub command: Option<String>,
    /// User name (or numeric uid when the user database has no name).
    pub user: Option<String>,
    /// Container id from the cgroup path.
    pub container: Option<String>,
    /// Kubernetes pod UID from the cgroup path.
    pub pod: Option<String>,
    /// Who owns it, for `vramctl_process_info`: only when /proc was read
    /// (`--process-details proc`) and could see the process.
    pub owner: Option<ProcessOwner>,
}

/// Labels for the PIDs of one snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessMetadata {
    by_pid: HashMap<u32, ProcessLabels>,
    /// What their in-process agents say, by (GPU UUID, PID): filled by the collector from
    /// its `AgentPoll` after the labels, read by the rendering and `serve --record`.
    pub agents: AgentFigures,
    /// The Slurm jobs holding memory, with their memory per GPU (only with
    /// `--process-details proc`); the collector fills their peaks.
    pub jobs: Vec<JobSeries>,
}

impl ProcessMetadata {
    /// The labels of `pid`, if known.
    pub fn get(&self, pid: u32) -> Option<&ProcessLabels> {
        self.by_pid.get(&pid)
    }

    /// Sets the labels of `pid`.
    #[cfg(test)]
    pub fn insert(&mut self, pid: u32, labels: ProcessLabels) {
        self.by_pid.insert(pid, labels);
    }
}

impl ProcessMetadata {
    /// The labels of the processes `observation`'s snapshot lists: user, command,
    /// container and pod from /proc; the driver's name for a process /proc cannot see or
    /// with `nvml`; nothing with `none`.
    pub fn from_observation(observation: &Observation, source: DetailsSource) -> Self {
        let mut by_pid = HashMap::new();
        for pid in listed_pids(&observation.snapshot) {
            let host = observation.hosts.get(&pid);
            let labels = match (source, host) {
                (DetailsSource::None, _) => ProcessLabels::default(),
                (_, Some(host)) => ProcessLabels {
                    command: Some(truncate_command(&host.command)),
                    user: host.user.clone(),
                    container: host.container_id.clone(),
                    pod: host.pod_uid.clone(),
                    owner: (source == DetailsSource::Proc).then(|| ProcessOwner::of(host)),
                },
                (_, None) => ProcessLabels {
                    command: observation
                        .driver_names
                        .get(&pid)
                        .map(|name| truncate_command(name)),
                    ..ProcessLabels::default()
                },
            };
            by_pid.insert(pid, labels);
        }
        // Job series name users: never with `none`; `nvml` reads no /proc, so knows none.
        let jobs = if source == DetailsSource::Proc {
            owner_series::jobs(observation)
        } else {
            Vec::new()
        };
        Self {
            by_pid,
            agents: AgentFigures::new(),
            jobs,
        }
    }
}

impl DetailsSource {
    /// What the exporter's process catalog reads: /proc with `proc`; with `nvml` and
    /// `none` only the driver's names, since the daemon may run outside the host's PID
    /// namespace, where /proc numbers other processes. (`none` still asks the driver: the
    /// history that `serve --record` writes names its processes, as `record` does; the
    /// labels leave the names out.)
    pub fn facts_source(self) -> FactsSource {
        match self {
            Self::Proc => FactsSource::Proc,
            Self::Nvml | Self::None => FactsSource::Driver,
        }
    }
}

/// `command` in at most [`COMMAND_MAX_CHARS`] characters, shortened as every command
/// shortens them (`vramctl_core::command_line::abbreviate`: interpreter and script first,
/// `…` where something was elided).
pub fn truncate_command(command: &str) -> String {
    abbreviate(command, COMMAND_MAX_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_commands_are_kept() {
        assert_eq!(truncate_command("python train.py"), "python train.py");
        let exact = "x".repeat(COMMAND_MAX_CHARS);
        assert_eq!(truncate_command(&exact), exact);
    }

    #[test]
    fn long_commands_are_cut_on_a_character_boundary() {
        let long = "é".repeat(COMMAND_MAX_CHARS + 10);
        let cut = truncate_command(&long);
        assert_eq!(cut.chars().count(), COMMAND_MAX_CHARS);
        assert!(cut.contains('…'));
        assert!(cut.starts_with("éé") && cut.ends_with("éé"));
        // A label says which script runs, not only which interpreter.
        assert_eq!(
            truncate_command(
                "/opt/torch/.venv/bin/python3 /home/labuser/work/exp/serve_model.py \
                 --model /models/llama-3-70b-instruct --port 8000 --max-batch 64"
            ),
            "python3 serve_model.py --model …/llama-3-70b-instruct --port …"
        );
    }

    #[test]
    fn our_own_process_gets_proc_labels() {
        use std::sync::Arc;
        use vramctl_core::types::{
            DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, ProcessKind,
            ProcessUsage, Snapshot,
        };
        let me = std::process::id();
        let snapshot = Snapshot {
            taken_at_unix_ms: 0,
            monotonic_ms: 0,
            driver: Arc::new(DriverInfo::default()),
            devices: vec![DeviceSnapshot {
                info: Arc::new(DeviceInfo::new(0, "GPU-x")),
                state: DeviceState::Ok(DeviceReading {
                    processes: Some(vec![ProcessUsage {
                        pid: me,
                        used_bytes: Some(1),
                        kind: ProcessKind::Compute,
                        gpu_instance_id: None,
                        compute_instance_id: None,
                    }]),
                    ..DeviceReading::default()
                }),
            }],
            unopened: Vec::new(),
        };
        let mut asked = Vec::new();
        let labels_with = |details: DetailsSource, name: &mut dyn FnMut(u32) -> Option<String>| {
            let mut observer = vramctl_observe::observation::Observer::builder()
                .facts(details.facts_source())
                .agents(None)
                .ancestors(false)
                .build();
            let observation = observer.observe(snapshot.clone(), name);
            ProcessMetadata::from_observation(&observation, details)
                .get(me)
                .cloned()
                .expect("labels for our pid")
        };
        let labels = labels_with(DetailsSource::Proc, &mut |pid| {
            asked.push(pid);
            None
        });
        assert!(labels.command.is_some_and(|c| !c.is_empty()));
        assert!(labels.user.is_some());
        assert!(
            asked.is_empty(),
            "the driver is asked only when /proc cannot see the pid"
        );

        assert_eq!(
            labels_with(DetailsSource::None, &mut |_| Some("x".into())),
            ProcessLabels::default()
        );
        assert_eq!(
            labels_with(DetailsSource::Nvml, &mut |_| Some("from the driver".into())).command,
            Some("from the driver".into())
        );
    }
}
