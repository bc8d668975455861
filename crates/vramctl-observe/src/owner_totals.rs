//! GPU memory totalled per owner (`ps --by job`, `status --by job`): each owner's process
//! count and bytes per GPU, from the per-process holdings a frontend already has. Pure: the
//! owner of each process comes from the observation (`HostProcess::slurm`), the bytes from
//! the snapshot.

use std::collections::BTreeMap;

use serde::Serialize;
use vramctl_procs::slurm::SlurmJob;

/// What groups the processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerKind {
    /// The Slurm job (`vramctl_procs::slurm`); processes of no job form one group.
    Job,
}

/// An owner as the totals name it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Owner {
    /// A Slurm job: its id, and the job user and partition when a process of it told them.
    Job {
        /// The job id.
        job_id: u32,
        /// The job's user (`SLURM_JOB_USER`).
        user: Option<String>,
        /// The job's partition.
        partition: Option<String>,
    },
    /// Processes whose owner of this kind is not known (not a job's, or not visible here).
    None,
}

/// One owner's total.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerTotal {
    /// Whom the total is for.
    pub owner: Owner,
    /// GPU processes counted (a process on two GPUs counts once).
    pub processes: usize,
    /// Bytes per GPU index, in index order.
    pub gpus: Vec<GpuTotal>,
    /// Bytes on all GPUs; a process whose bytes the driver did not report adds nothing and
    /// sets `incomplete`.
    pub used_bytes: u64,
    /// Some process's bytes were not reported: `used_bytes` is a lower bound.
    pub incomplete: bool,
}

/// One owner's bytes on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuTotal {
    /// NVML index.
    pub index: u32,
    /// Bytes.
    pub used_bytes: u64,
}

/// One GPU process as the totals need it.
#[derive(Debug, Clone, Copy)]
pub struct Holder<'a> {
    /// Its job, when known.
    pub slurm: Option<&'a SlurmJob>,
    /// `(GPU index, bytes)` per device it holds memory on; `None`: not reported.
    pub gpus: &'a [(u32, Option<u64>)],
}

/// Totals per owner of `kind`, the largest first (ties by owner), the unknown owner last.
pub fn totals<'a>(
    kind: OwnerKind,
    holders: impl IntoIterator<Item = Holder<'a>>,
) -> Vec<OwnerTotal> {
    struct Acc {
        processes: usize,
        gpus: BTreeMap<u32, u64>,
        incomplete: bool,
        user: Option<String>,
        partition: Option<String>,
    }
    let mut by_key: BTreeMap<Option<u32>, Acc> = BTreeMap::new();
    for holder in holders {
        let key = match kind {
            OwnerKind::Job => holder.slurm.map(|job| job.job_id),
        };
        let acc = by_key.entry(key).or_insert_with(|| Acc {
            processes: 0,
            gpus: BTreeMap::new(),
            incomplete: false,
            user: None,
            partition: None,
        });
        acc.processes += 1;
        if let Some(job) = holder.slurm {
            // Any process of the job that knows them names them (the batch script and its
            // steps carry the same).
            if acc.user.is_none() {
                acc.user.clone_from(&job.user);
            }
            if acc.partition.is_none() {
                acc.partition.clone_from(&job.partition);
            }
        }
        for &(index, bytes) in holder.gpus {
            let slot = acc.gpus.entry(index).or_insert(0);
            match bytes {
                Some(b) => *slot = slot.saturating_add(b),
                None => acc.incomplete = true,
            }
        }
    }
    let mut out: Vec<OwnerTotal> = by_key
        .into_iter()
        .map(|(key, acc)| OwnerTotal {
            owner: match key {
                Some(job_id) => Owner::Job {
                    job_id,
                    user: acc.user,
                    partition: acc.partition,
                },
                None => Owner::None,
            },
            processes: acc.processes,
            used_bytes: acc
                .gpus
                .values()
                .fold(0u64, |sum, b| sum.saturating_add(*b)),
            gpus: acc
                .gpus
                .into_iter()
                .map(|(index, used_bytes)| GpuTotal { index, used_bytes })
                .collect(),
            incomplete: acc.incomplete,
        })
        .collect();
    out.sort_by(|a, b| {
        let unknown = |t: &OwnerTotal| t.owner == Owner::None;
        unknown(a)
            .cmp(&unknown(b))
            .then(b.used_bytes.cmp(&a.used_bytes))
            .then(a.owner.cmp(&b.owner))
    });
    out
}

#[cfg(test)]
mod tests {
    use vramctl_procs::slurm::{SlurmSource, SlurmStep};

    use super::*;

    const GIB: u64 = 1 << 30;

    fn job(job_id: u32, user: Option<&str>) -> SlurmJob {
        SlurmJob {
            job_id,
            step: Some(SlurmStep::Batch),
            user: user.map(str::to_owned),
            uid: None,
            partition: user.map(|_| "gpu".to_owned()),
            source: SlurmSource::Cgroup,
            environ_conflict: None,
        }
    }

    #[test]
    fn processes_are_totalled_per_job_and_gpu() {
        let (a, b) = (job(7, None), job(7, Some("alice")));
        let c = job(9, Some("bob"));
        let holders = [
            Holder {
                slurm: Some(&a),
                gpus: &[(0, Some(2 * GIB)), (1, Some(GIB))],
            },
            Holder {
                slurm: Some(&b),
                gpus: &[(0, Some(GIB))],
            },
            Holder {
                slurm: Some(&c),
                gpus: &[(1, Some(GIB)), (2, None)],
            },
            Holder {
                slurm: None,
                gpus: &[(0, Some(10 * GIB))],
            },
        ];
        let totals = totals(OwnerKind::Job, holders);
        assert_eq!(
            totals,
            [
                OwnerTotal {
                    owner: Owner::Job {
                        job_id: 7,
                        user: Some("alice".into()),
                        partition: Some("gpu".into()),
                    },
                    processes: 2,
                    gpus: vec![
                        GpuTotal {
                            index: 0,
                            used_bytes: 3 * GIB
                        },
                        GpuTotal {
                            index: 1,
                            used_bytes: GIB
                        },
                    ],
                    used_bytes: 4 * GIB,
                    incomplete: false,
                },
                OwnerTotal {
                    owner: Owner::Job {
                        job_id: 9,
                        user: Some("bob".into()),
                        partition: Some("gpu".into()),
                    },
                    processes: 1,
                    gpus: vec![
                        GpuTotal {
                            index: 1,
                            used_bytes: GIB
                        },
                        GpuTotal {
                            index: 2,
                            used_bytes: 0
                        },
                    ],
                    used_bytes: GIB,
                    incomplete: true,
                },
                // Not in a job: last, however large.
                OwnerTotal {
                    owner: Owner::None,
                    processes: 1,
                    gpus: vec![GpuTotal {
                        index: 0,
                        used_bytes: 10 * GIB
                    }],
                    used_bytes: 10 * GIB,
                    incomplete: false,
                },
            ]
        );
        assert_eq!(
            totals_json(&totals[0]),
            r#"{"owner":{"kind":"job","job_id":7,"user":"alice","partition":"gpu"},"processes":2,"gpus":[{"index":0,"used_bytes":3221225472},{"index":1,"used_bytes":1073741824}],"used_bytes":4294967296,"incomplete":false}"#
        );
    }

    fn totals_json(total: &OwnerTotal) -> String {
        serde_json::to_string(total).unwrap_or_default()
    }

    #[test]
    fn nothing_to_total() {
        assert_eq!(totals(OwnerKind::Job, []), []);
    }
}
