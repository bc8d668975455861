//! Memory per owner: the processes of each GPU grouped by who owns them — a user, a
//! container, a Kubernetes pod, a Slurm job — for `ps --by` and `status --by`.
//!
//! An owner is read from the observation's [`HostProcess`]: a key that a process has no
//! value for is told apart from a process that cannot be mapped at all (not visible in this
//! PID namespace: [`Owner::CannotMap`], never a guess). A key is one variant and one arm of
//! [`OwnerKey::owner_of`] (the Slurm job was added so).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::gpu_holdings::GpuHolding;
use crate::observation::HostProcess;

/// What processes are grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnerKey {
    /// The process's user (name, or uid as text).
    User,
    /// The container (by id; labelled with its runtime and name).
    Container,
    /// The Kubernetes pod (by UID).
    Pod,
    /// The Slurm job (by id; labelled with the job's user and partition when known).
    Job,
}

impl OwnerKey {
    /// Every key, in the order `--help` lists them.
    pub const ALL: [Self; 4] = [Self::User, Self::Container, Self::Pod, Self::Job];

    /// The key's name, as `--by` takes it and JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Container => "container",
            Self::Pod => "pod",
            Self::Job => "job",
        }
    }

    /// What a process without a value for this key is shown as.
    pub fn none_label(self) -> &'static str {
        match self {
            Self::User => "(no user)",
            Self::Container => "(no container)",
            Self::Pod => "(no pod)",
            Self::Job => "(no job)",
        }
    }

    /// Who owns `host` (`None`: not visible here) under this key.
    pub fn owner_of(self, host: Option<&HostProcess>) -> Owner {
        let Some(host) = host else {
            return Owner::CannotMap;
        };
        let named = |id: Option<&String>, label: Option<String>| {
            id.map_or(Owner::None, |id| Owner::Named {
                id: id.clone(),
                label: label.unwrap_or_else(|| id.clone()),
            })
        };
        match self {
            Self::User => named(host.user.as_ref(), None),
            Self::Container => {
                let facts = host.container.as_ref();
                named(facts.map(|c| &c.id), facts.map(container_label))
            }
            Self::Pod => named(host.pod_uid.as_ref(), None),
            Self::Job => match &host.slurm {
                Some(job) => Owner::Named {
                    id: job.job_id.to_string(),
                    label: job_label(job),
                },
                None => Owner::None,
            },
        }
    }
}

impl std::str::FromStr for OwnerKey {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|key| key.as_str() == text)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|k| k.as_str()).collect();
                format!("'{text}' is not one of {}", names.join(", "))
            })
    }
}

/// `runtime/name`, or the runtime and the id's first 12 digits when the name is unknown
/// (untrusted: escape it to print).
fn container_label(facts: &vramctl_procs::container::ContainerFacts) -> String {
    let runtime = facts.runtime.map_or("container", |r| r.as_str());
    let name = facts
        .name
        .clone()
        .unwrap_or_else(|| facts.id.chars().take(12).collect());
    format!("{runtime}/{name}")
}

/// `ID (user, partition)`, either left out when no process told it (untrusted: escape it
/// to print). The job's user is `SLURM_JOB_USER`, else the cgroup path's uid.
fn job_label(job: &vramctl_procs::slurm::SlurmJob) -> String {
    let user = job
        .user
        .clone()
        .or_else(|| job.uid.map(|uid| format!("uid {uid}")));
    let known: Vec<String> = user.into_iter().chain(job.partition.clone()).collect();
    if known.is_empty() {
        job.job_id.to_string()
    } else {
        format!("{} ({})", job.job_id, known.join(", "))
    }
}

/// A selector of processes by owner, as `kill` and `reap` take them: `--job ID`,
/// `--pod NAMESPACE/NAME`, `--container ID-OR-NAME`. Matched against the observation's
/// facts only (a process with no such fact is never selected: "cannot map" is not a
/// match).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "by", content = "value", rename_all = "lowercase")]
pub enum OwnerSelector {
    /// The Slurm job of this id (from the cgroup, or the process's own environment).
    Job(u32),
    /// The Kubernetes pod `namespace/name` the kubelet names.
    Pod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A container by its full id, a prefix of at least 12 hex digits, or its exact name.
    Container(String),
}

/// The shortest container id prefix taken: Docker's short id.
pub const CONTAINER_ID_PREFIX_MIN: usize = 12;

impl OwnerSelector {
    /// `--job ID`: a decimal job id.
    ///
    /// # Errors
    /// Not a job id, in words.
    pub fn job(text: &str) -> Result<Self, String> {
        text.trim()
            .parse::<u32>()
            .ok()
            .filter(|id| *id > 0)
            .map(Self::Job)
            .ok_or_else(|| format!("'{text}' is not a Slurm job id (a number, as squeue shows)"))
    }

    /// `--pod NAMESPACE/NAME`.
    ///
    /// # Errors
    /// Not `namespace/name`, in words.
    pub fn pod(text: &str) -> Result<Self, String> {
        match text.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                Ok(Self::Pod {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!(
                "'{text}' is not NAMESPACE/NAME (e.g. ml/train-0, as kubectl get pods -A shows)"
            )),
        }
    }

    /// `--container ID-OR-NAME`.
    ///
    /// # Errors
    /// Empty.
    pub fn container(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("an empty container id or name".to_owned());
        }
        Ok(Self::Container(text.to_owned()))
    }

    /// The flag as typed, for messages (untrusted only as far as the caller typed it).
    pub fn describe(&self) -> String {
        match self {
            Self::Job(id) => format!("--job {id}"),
            Self::Pod { namespace, name } => format!("--pod {namespace}/{name}"),
            Self::Container(c) => format!("--container {c}"),
        }
    }

    /// Whether `host` is owned so.
    pub fn matches(&self, host: &HostProcess) -> bool {
        match self {
            Self::Job(id) => host.slurm.as_ref().is_some_and(|j| j.job_id == *id),
            Self::Pod { namespace, name } => host
                .kubernetes
                .as_ref()
                .is_some_and(|p| &p.namespace == namespace && &p.pod == name),
            Self::Container(wanted) => host.container.as_ref().is_some_and(|c| {
                let hex = wanted.len() >= CONTAINER_ID_PREFIX_MIN
                    && wanted.bytes().all(|b| b.is_ascii_hexdigit());
                (hex && c.id.starts_with(wanted.as_str()))
                    || c.name.as_deref() == Some(wanted.as_str())
            }),
        }
    }
}

/// The processes of `hosts` that every one of `selectors` selects, by PID.
pub fn select<'a>(
    selectors: &[OwnerSelector],
    hosts: &'a BTreeMap<u32, HostProcess>,
) -> Vec<&'a HostProcess> {
    hosts
        .values()
        .filter(|h| selectors.iter().all(|s| s.matches(h)))
        .collect()
}

/// Widest owner cell of a human table, in characters (a pod's `namespace/name` can be
/// 317): longer ones are cut and end in `…`, so one long name cannot push the command off
/// the screen.
pub const OWNER_CELL_MAX_CHARS: usize = 40;

/// A Slurm job as Slurm writes a step: `1234.0`, `1234.batch`; the id alone when the step
/// is unknown.
pub fn job_cell(job: &vramctl_procs::slurm::SlurmJob) -> String {
    match job.step {
        Some(step) => format!("{}.{step}", job.job_id),
        None => job.job_id.to_string(),
    }
}

/// A pod as `namespace/name` (untrusted: the table escapes it), cut to
/// [`OWNER_CELL_MAX_CHARS`].
pub fn pod_cell(pod: &vramctl_kube::ProcessPod) -> String {
    let text = format!("{}/{}", pod.namespace, pod.pod);
    if text.chars().count() <= OWNER_CELL_MAX_CHARS {
        return text;
    }
    let mut cut: String = text.chars().take(OWNER_CELL_MAX_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// Who owns a process under one key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Owner {
    /// Owned: `id` is the key's value (user name, container id, pod UID), `label` what a
    /// person reads (a container's runtime and name).
    Named {
        /// The key's value.
        id: String,
        /// For people.
        label: String,
    },
    /// Visible, but with no value for the key (a process in no container).
    None,
    /// Not visible in this PID namespace: who owns it cannot be known here.
    CannotMap,
}

/// One owner's processes and memory on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerTotal {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// The GPU's UUID.
    pub uuid: String,
    /// The key's value (user name, container id, pod UID); `null` for processes with none
    /// or that cannot be mapped (`mapped` tells which).
    pub owner: Option<String>,
    /// What a person reads for the owner (a container's `runtime/name`); `null` as `owner`.
    pub label: Option<String>,
    /// `false`: these processes are not visible here, so their owner is unknown.
    pub mapped: bool,
    /// How many processes.
    pub processes: usize,
    /// Their memory on this GPU; `null` when the driver reports any of it unavailable.
    pub used_bytes: Option<u64>,
}

impl OwnerTotal {
    /// The owner's label for a table: the label, the key's "(no …)", or "cannot map".
    pub fn display_label(&self, key: OwnerKey) -> &str {
        match (&self.label, self.mapped) {
            (Some(label), _) => label,
            (None, true) => key.none_label(),
            (None, false) => "(cannot map: not visible here)",
        }
    }
}

/// Each GPU's memory per owner under `key`: GPUs in index order, owners by memory (largest
/// first; unknown memory last), then label.
pub fn totals(
    key: OwnerKey,
    holdings: &BTreeMap<u32, Vec<GpuHolding>>,
    hosts: &BTreeMap<u32, HostProcess>,
) -> Vec<OwnerTotal> {
    // Grouped by the owner's id, not its label: processes of one Slurm job may know its
    // user and partition or not (one's environment unreadable); the fullest label is kept.
    let mut groups: BTreeMap<(u32, String, Owner), (usize, Option<u64>)> = BTreeMap::new();
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    for (pid, held) in holdings {
        let owner = match key.owner_of(hosts.get(pid)) {
            Owner::Named { id, label } => {
                let kept = labels.entry(id.clone()).or_insert_with(|| label.clone());
                if (label.len(), &*kept) > (kept.len(), &label) {
                    *kept = label;
                }
                Owner::Named {
                    id,
                    label: String::new(),
                }
            }
            other => other,
        };
        // A PID listed twice on one GPU (compute and graphics lists) is one process there.
        let mut seen: Vec<u32> = Vec::new();
        for holding in held {
            let group = groups
                .entry((holding.index, holding.uuid.clone(), owner.clone()))
                .or_insert((0, Some(0)));
            if !seen.contains(&holding.index) {
                seen.push(holding.index);
                group.0 += 1;
            }
            group.1 = group
                .1
                .and_then(|sum| holding.used_bytes.map(|b| sum.saturating_add(b)));
        }
    }
    let mut totals: Vec<OwnerTotal> = groups
        .into_iter()
        .map(|((gpu, uuid, owner), (processes, used_bytes))| {
            let (owner, label, mapped) = match owner {
                Owner::Named { id, .. } => {
                    let label = labels.get(&id).cloned().unwrap_or_else(|| id.clone());
                    (Some(id), Some(label), true)
                }
                Owner::None => (None, None, true),
                Owner::CannotMap => (None, None, false),
            };
            OwnerTotal {
                gpu,
                uuid,
                owner,
                label,
                mapped,
                processes,
                used_bytes,
            }
        })
        .collect();
    totals.sort_by(|a, b| {
        a.gpu
            .cmp(&b.gpu)
            .then_with(|| b.used_bytes.is_some().cmp(&a.used_bytes.is_some()))
            .then_with(|| b.used_bytes.cmp(&a.used_bytes))
            .then_with(|| a.label.cmp(&b.label))
            .then_with(|| a.mapped.cmp(&b.mapped).reverse())
    });
    totals
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramctl_core::types::ProcessKind;
    use vramctl_procs::container::{ContainerFacts, ContainerRuntime};

    const GIB: u64 = 1 << 30;

    fn held(index: u32, bytes: Option<u64>) -> GpuHolding {
        GpuHolding {
            index,
            uuid: format!("GPU-{index}"),
            used_bytes: bytes,
            kind: ProcessKind::Compute,
            gpu_instance_id: None,
            compute_instance_id: None,
            mig_uuid: None,
        }
    }

    fn host(pid: u32, user: &str, container: Option<(&str, Option<&str>)>) -> HostProcess {
        HostProcess {
            pid,
            user: Some(user.into()),
            container: container.map(|(id, name)| ContainerFacts {
                id: id.into(),
                runtime: Some(ContainerRuntime::Docker),
                name: name.map(Into::into),
                rootless_uid: None,
            }),
            pod_uid: container.map(|_| "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into()),
            ..HostProcess::default()
        }
    }

    #[test]
    fn memory_is_summed_per_gpu_and_owner_and_unmappable_processes_say_so() {
        let id = "3f0c2b7a9d8e4f61a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70819";
        let holdings = BTreeMap::from([
            (10, vec![held(0, Some(4 * GIB)), held(1, Some(GIB))]),
            (11, vec![held(0, Some(2 * GIB))]),
            (12, vec![held(0, Some(GIB))]),
            // Not visible here.
            (13, vec![held(0, Some(8 * GIB))]),
            (14, vec![held(1, None)]),
        ]);
        let hosts = BTreeMap::from([
            (10, host(10, "alice", Some((id, Some("trainer"))))),
            (11, host(11, "alice", Some((id, Some("trainer"))))),
            (12, host(12, "bob", None)),
            (14, host(14, "bob", None)),
        ]);
        let row = |t: &OwnerTotal| {
            (
                t.gpu,
                t.display_label(OwnerKey::Container).to_owned(),
                t.processes,
                t.used_bytes,
            )
        };
        let by_container: Vec<_> = totals(OwnerKey::Container, &holdings, &hosts)
            .iter()
            .map(row)
            .collect();
        assert_eq!(
            by_container,
            [
                (
                    0,
                    "(cannot map: not visible here)".to_owned(),
                    1,
                    Some(8 * GIB)
                ),
                (0, "docker/trainer".to_owned(), 2, Some(6 * GIB)),
                (0, "(no container)".to_owned(), 1, Some(GIB)),
                (1, "docker/trainer".to_owned(), 1, Some(GIB)),
                (1, "(no container)".to_owned(), 1, None),
            ]
        );
        let by_user = totals(OwnerKey::User, &holdings, &hosts);
        let alice = by_user
            .iter()
            .find(|t| t.gpu == 0 && t.owner.as_deref() == Some("alice"))
            .expect("alice");
        assert_eq!(
            (alice.processes, alice.used_bytes, alice.mapped),
            (2, Some(6 * GIB), true)
        );
        let unmapped = by_user
            .iter()
            .find(|t| t.gpu == 0 && !t.mapped)
            .expect("unmapped");
        assert_eq!(
            (unmapped.owner.as_deref(), unmapped.used_bytes),
            (None, Some(8 * GIB))
        );
        let by_pod = totals(OwnerKey::Pod, &holdings, &hosts);
        assert_eq!(
            by_pod.iter().filter(|t| t.owner.is_some()).count(),
            2,
            "{by_pod:?}"
        );
        // The container id is the key; its label has the runtime and name (or short id).
        let named = totals(OwnerKey::Container, &holdings, &hosts)
            .into_iter()
            .find(|t| t.owner.is_some())
            .expect("a container");
        assert_eq!(named.owner.as_deref(), Some(id));
        let mut unnamed_hosts = hosts.clone();
        unnamed_hosts.insert(10, host(10, "alice", Some((id, None))));
        unnamed_hosts.insert(11, host(11, "alice", Some((id, None))));
        let unnamed = totals(OwnerKey::Container, &holdings, &unnamed_hosts);
        assert!(
            unnamed
                .iter()
                .any(|t| t.label.as_deref() == Some("docker/3f0c2b7a9d8e")),
            "{unnamed:?}"
        );
    }

    #[test]
    fn a_pid_listed_twice_on_one_gpu_is_one_process() {
        let holdings = BTreeMap::from([(10, vec![held(0, Some(GIB)), held(0, Some(GIB))])]);
        let hosts = BTreeMap::from([(10, host(10, "alice", None))]);
        let t = totals(OwnerKey::User, &holdings, &hosts);
        assert_eq!(
            (t.len(), t[0].processes, t[0].used_bytes),
            (1, 1, Some(2 * GIB))
        );
    }

    #[test]
    fn a_job_is_one_owner_per_gpu_labelled_with_what_any_of_its_processes_knows() {
        use vramctl_procs::slurm::{SlurmJob, SlurmSource};
        let job = |user: Option<&str>, partition: Option<&str>| SlurmJob {
            job_id: 1234,
            step: None,
            user: user.map(Into::into),
            uid: Some(1000),
            partition: partition.map(Into::into),
            source: SlurmSource::Cgroup,
            environ_conflict: None,
        };
        let in_job = |pid: u32, slurm: SlurmJob| HostProcess {
            pid,
            slurm: Some(slurm),
            ..HostProcess::default()
        };
        let holdings = BTreeMap::from([
            (10, vec![held(0, Some(4 * GIB))]),
            // Its environment was not readable: the cgroup's uid only.
            (11, vec![held(0, Some(2 * GIB)), held(1, Some(GIB))]),
            (12, vec![held(0, Some(GIB))]),
        ]);
        let hosts = BTreeMap::from([
            (10, in_job(10, job(Some("alice"), Some("gpu")))),
            (11, in_job(11, job(None, None))),
            (12, host(12, "bob", None)),
        ]);
        let rows: Vec<_> = totals(OwnerKey::Job, &holdings, &hosts)
            .iter()
            .map(|t| {
                (
                    t.gpu,
                    t.owner.clone(),
                    t.display_label(OwnerKey::Job).to_owned(),
                    t.processes,
                    t.used_bytes,
                )
            })
            .collect();
        let id = Some("1234".to_owned());
        assert_eq!(
            rows,
            [
                (0, id.clone(), "1234 (alice, gpu)".into(), 2, Some(6 * GIB)),
                (0, None, "(no job)".into(), 1, Some(GIB)),
                (1, id, "1234 (alice, gpu)".into(), 1, Some(GIB)),
            ]
        );
        // Alone, the process without an environment is labelled with the cgroup's uid.
        let alone = BTreeMap::from([(11, holdings[&11].clone())]);
        let t = totals(OwnerKey::Job, &alone, &hosts);
        assert_eq!(t[0].label.as_deref(), Some("1234 (uid 1000)"));
    }

    #[test]
    fn every_key_parses_back_from_its_name() {
        for key in OwnerKey::ALL {
            assert_eq!(key.as_str().parse::<OwnerKey>(), Ok(key));
        }
        assert!("jobs".parse::<OwnerKey>().is_err());
    }

    #[test]
    fn selectors_parse_and_select_only_what_the_facts_say() {
        use vramctl_kube::attribution::ProcessPod;
        use vramctl_procs::slurm::{SlurmJob, SlurmSource};
        assert_eq!(OwnerSelector::job("1234"), Ok(OwnerSelector::Job(1234)));
        assert!(OwnerSelector::job("12x").is_err());
        assert!(OwnerSelector::job("0").is_err());
        assert!(OwnerSelector::pod("ml").is_err());
        assert!(OwnerSelector::pod("ml/a/b").is_err());
        assert!(OwnerSelector::pod("/a").is_err());
        assert!(OwnerSelector::container("").is_err());
        let id = "3f0c2b7a9d8e4f61a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70819";
        let mut in_job = host(10, "alice", Some((id, Some("trainer"))));
        in_job.slurm = Some(SlurmJob {
            job_id: 1234,
            step: None,
            user: None,
            uid: None,
            partition: None,
            source: SlurmSource::Cgroup,
            environ_conflict: None,
        });
        in_job.kubernetes = Some(ProcessPod {
            namespace: "ml".into(),
            pod: "train-0".into(),
            container: None,
            pod_uid: "u".into(),
        });
        let hosts = BTreeMap::from([(10, in_job), (11, host(11, "bob", None))]);
        let pids = |selectors: &[OwnerSelector]| -> Vec<u32> {
            select(selectors, &hosts).iter().map(|h| h.pid).collect()
        };
        assert_eq!(pids(&[OwnerSelector::Job(1234)]), [10]);
        assert!(pids(&[OwnerSelector::Job(123)]).is_empty());
        assert_eq!(pids(&[OwnerSelector::pod("ml/train-0").unwrap()]), [10]);
        assert!(pids(&[OwnerSelector::pod("ml/train-1").unwrap()]).is_empty());
        assert!(pids(&[OwnerSelector::pod("other/train-0").unwrap()]).is_empty());
        assert_eq!(pids(&[OwnerSelector::Container("trainer".into())]), [10]);
        assert_eq!(pids(&[OwnerSelector::Container(id[..12].into())]), [10]);
        // A short prefix is too ambiguous to kill by.
        assert!(pids(&[OwnerSelector::Container(id[..6].into())]).is_empty());
        // Every selector must hold.
        assert!(
            pids(&[
                OwnerSelector::Job(1234),
                OwnerSelector::Container("web".into())
            ])
            .is_empty()
        );
    }

    #[test]
    fn table_cells_of_jobs_and_pods() {
        use vramctl_kube::attribution::ProcessPod;
        use vramctl_procs::slurm::{SlurmJob, SlurmSource, SlurmStep};
        let mut job = SlurmJob {
            job_id: 1234,
            step: None,
            user: None,
            uid: None,
            partition: None,
            source: SlurmSource::Cgroup,
            environ_conflict: None,
        };
        assert_eq!(job_cell(&job), "1234");
        job.step = Some(SlurmStep::Batch);
        assert_eq!(job_cell(&job), "1234.batch");
        job.step = Some(SlurmStep::Number(3));
        assert_eq!(job_cell(&job), "1234.3");
        let pod = |name: &str| ProcessPod {
            namespace: "ml".into(),
            pod: name.into(),
            container: None,
            pod_uid: "u".into(),
        };
        assert_eq!(pod_cell(&pod("train-0")), "ml/train-0");
        let long = pod_cell(&pod(&"x".repeat(300)));
        assert_eq!(long.chars().count(), OWNER_CELL_MAX_CHARS);
        assert!(long.starts_with("ml/x") && long.ends_with('…'));
    }
}
