//! Labels for the processes in a snapshot: who runs them, what they run, and where.
//!
//! Read by the sampler thread, never by a scrape. /proc is read once for a PID that is new
//! in the snapshot and again every [`REFRESH_TICKS`] ticks (a reused PID, a process that
//! renamed itself), so 240 processes cost a few dozen file reads a tick, not a thousand.

use std::collections::HashMap;

use vramctl_core::command_line::abbreviate;
use vramctl_core::procinfo::{ContainerInfo, ProcReader};
use vramctl_core::types::Snapshot;

/// Longest `command` label, in characters; longer command lines are shortened. Prometheus'
/// own default `label_value_length_limit` is unlimited, but long labels cost memory in
/// every series and clutter legends.
pub const COMMAND_MAX_CHARS: usize = 64;

/// How many ticks a process's labels are trusted before /proc is read again.
pub const REFRESH_TICKS: u64 = 10;

/// Where process labels come from (`--process-details`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
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
}

/// Labels for the PIDs of one snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessMetadata {
    by_pid: HashMap<u32, ProcessLabels>,
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

#[derive(Debug)]
struct Entry {
    labels: ProcessLabels,
    read_at_tick: u64,
}

/// Keeps [`ProcessMetadata`] up to date across ticks.
#[derive(Debug)]
pub struct MetadataCache {
    source: DetailsSource,
    procs: ProcReader,
    entries: HashMap<u32, Entry>,
    tick: u64,
    current: ProcessMetadata,
}

impl MetadataCache {
    /// An empty cache reading from `source`.
    pub fn new(source: DetailsSource) -> Self {
        Self {
            source,
            procs: ProcReader::new(),
            entries: HashMap::new(),
            tick: 0,
            current: ProcessMetadata::default(),
        }
    }

    /// Labels for every process in `snapshot`; `driver_name` asks the driver for a process
    /// name (an NVML call, fine here on the sampler thread).
    pub fn update(
        &mut self,
        snapshot: &Snapshot,
        driver_name: &mut dyn FnMut(u32) -> Option<String>,
    ) -> &ProcessMetadata {
        self.tick += 1;
        let mut live: Vec<u32> = snapshot
            .devices
            .iter()
            .filter_map(|d| d.reading())
            .filter_map(|r| r.processes.as_ref())
            .flatten()
            .map(|p| p.pid)
            .collect();
        live.sort_unstable();
        live.dedup();
        // Ended processes are forgotten, so their series disappear with them.
        self.entries
            .retain(|pid, _| live.binary_search(pid).is_ok());
        for pid in live {
            let stale = self
                .entries
                .get(&pid)
                .is_none_or(|e| self.tick - e.read_at_tick >= REFRESH_TICKS);
            if stale {
                let labels = self.read(pid, driver_name);
                self.entries.insert(
                    pid,
                    Entry {
                        labels,
                        read_at_tick: self.tick,
                    },
                );
            }
        }
        self.current.by_pid.clear();
        for (pid, entry) in &self.entries {
            self.current.by_pid.insert(*pid, entry.labels.clone());
        }
        &self.current
    }

    fn read(
        &mut self,
        pid: u32,
        driver_name: &mut dyn FnMut(u32) -> Option<String>,
    ) -> ProcessLabels {
        match self.source {
            DetailsSource::None => ProcessLabels::default(),
            DetailsSource::Nvml => ProcessLabels {
                command: driver_name(pid).map(|c| truncate_command(&c)),
                ..ProcessLabels::default()
            },
            DetailsSource::Proc => match self.procs.details(pid) {
                Some(details) => {
                    let ContainerInfo {
                        container_id: container,
                        pod_uid: pod,
                    } = details.container;
                    ProcessLabels {
                        command: Some(truncate_command(&details.command)),
                        user: details.user.or_else(|| details.uid.map(|u| u.to_string())),
                        container,
                        pod,
                    }
                }
                // Not in our PID namespace: the driver still knows a name.
                None => ProcessLabels {
                    command: driver_name(pid).map(|c| truncate_command(&c)),
                    ..ProcessLabels::default()
                },
            },
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
            ProcessUsage,
        };
        let me = std::process::id();
        let snapshot = Snapshot {
            taken_at_unix_ms: 0,
            monotonic_ms: 0,
            driver: Arc::new(DriverInfo::default()),
            devices: vec![DeviceSnapshot {
                info: Arc::new(DeviceInfo {
                    index: 0,
                    uuid: "GPU-x".into(),
                    name: None,
                    pci_bus_id: None,
                    minor_number: None,
                    mig_enabled: None,
                    mig_instances: Vec::new(),
                }),
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
        let mut cache = MetadataCache::new(DetailsSource::Proc);
        let labels = cache
            .update(&snapshot, &mut |pid| {
                asked.push(pid);
                None
            })
            .get(me)
            .cloned()
            .expect("labels for our pid");
        assert!(labels.command.is_some_and(|c| !c.is_empty()));
        assert!(labels.user.is_some());
        assert!(
            asked.is_empty(),
            "the driver is asked only when /proc cannot see the pid"
        );

        let mut none = MetadataCache::new(DetailsSource::None);
        assert_eq!(
            none.update(&snapshot, &mut |_| Some("x".into())).get(me),
            Some(&ProcessLabels::default())
        );
        let mut nvml = MetadataCache::new(DetailsSource::Nvml);
        assert_eq!(
            nvml.update(&snapshot, &mut |_| Some("from the driver".into()))
                .get(me)
                .and_then(|l| l.command.clone()),
            Some("from the driver".into())
        );
    }
}
