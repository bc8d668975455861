//! Memory per owner: the processes of each GPU grouped by who owns them — a user, a
//! container, a Kubernetes pod — for `ps --by` and `status --by`.
//!
//! An owner is read from the observation's [`HostProcess`]: a key that a process has no
//! value for is told apart from a process that cannot be mapped at all (not visible in this
//! PID namespace: [`Owner::CannotMap`], never a guess). Adding a key (a Slurm job) is one
//! variant and one arm of [`OwnerKey::owner_of`].

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
}

impl OwnerKey {
    /// Every key, in the order `--help` lists them.
    pub const ALL: [Self; 3] = [Self::User, Self::Container, Self::Pod];

    /// The key's name, as `--by` takes it and JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Container => "container",
            Self::Pod => "pod",
        }
    }

    /// What a process without a value for this key is shown as.
    pub fn none_label(self) -> &'static str {
        match self {
            Self::User => "(no user)",
            Self::Container => "(no container)",
            Self::Pod => "(no pod)",
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
    let mut groups: BTreeMap<(u32, String, Owner), (usize, Option<u64>)> = BTreeMap::new();
    for (pid, held) in holdings {
        let owner = key.owner_of(hosts.get(pid));
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
                Owner::Named { id, label } => (Some(id), Some(label), true),
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
    fn every_key_parses_back_from_its_name() {
        for key in OwnerKey::ALL {
            assert_eq!(key.as_str().parse::<OwnerKey>(), Ok(key));
        }
        assert!("job".parse::<OwnerKey>().is_err());
    }
}
