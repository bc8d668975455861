//! Who owns the memory, as series of their own: one `vramctl_process_info` per exported
//! process (its user, container, pod, Slurm job) and, per Slurm job, one `vramctl_job_info`
//! and one peak (the most it held on any one GPU; the peak is kept per GPU here).
//!
//! Why series of their own and not labels on every byte series: a label multiplies into
//! every family a process has (memory, agent figures, four verdicts), and a label whose
//! value changes (a pod named late, once the kubelet answers) starts every one of those
//! series afresh. An info series costs one series per process and is joined in PromQL
//! (`* on(instance, pid) group_left(slurm_job) vramctl_process_info`), as
//! `kube_pod_info` is.
//!
//! Every value here is text another user chose (a container's or pod's name, a job's
//! partition from its environment): it is escaped as human output escapes it
//! (`vramctl_core::untrusted`) and cut to [`OWNER_LABEL_MAX_CHARS`], so one hostile name
//! can neither forge a line of the exposition nor make every series long. The renderer
//! escapes what the exposition format itself needs (`\\`, `"`, line feed).

use std::collections::{BTreeMap, HashMap};

use vramctl_core::untrusted;
use vramctl_observe::gpu_holdings::holdings;
use vramctl_observe::gpu_selection::GpuFilter;
use vramctl_observe::observation::{HostProcess, Observation};
use vramctl_observe::owners::{OwnerKey, totals};

/// Longest owner label (a container's, pod's or partition's name, a user name), in
/// characters; longer values are cut and end in `…`. Kubernetes names are at most 253
/// characters (a namespace 63); 128 keeps a legend readable and a hostile name short.
pub const OWNER_LABEL_MAX_CHARS: usize = 128;

/// How long a job's peak is kept after its last GPU process was seen: a job between two
/// `srun` steps holds no GPU memory for a while, and its peak must survive the gap. An
/// hour covers the steps of a job script; an ended job's entry is dropped after it.
pub const JOB_PEAK_FORGET_AFTER_MS: i64 = 3_600_000;

/// At most this many (job, GPU) peaks are kept; past it the least recently seen go first.
/// Bounds the memory a user can make the daemon hold by claiming job ids
/// (`SLURM_JOB_ID` in an environment is the user's word).
pub const JOB_PEAK_MAX_ENTRIES: usize = 65_536;

/// Owner facts of one process, for `vramctl_process_info`; every value already escaped and
/// bounded, `None` when unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessOwner {
    /// The container's name in its runtime.
    pub container_name: Option<String>,
    /// `docker`, `podman`, `containerd`, `cri-o`.
    pub runtime: Option<String>,
    /// The Kubernetes namespace, pod and container the kubelet names.
    pub kube_namespace: Option<String>,
    /// See `kube_namespace`.
    pub kube_pod: Option<String>,
    /// See `kube_namespace`.
    pub kube_container: Option<String>,
    /// The Slurm job id.
    pub slurm_job: Option<String>,
    /// The Slurm step (`0`, `batch`, `extern`, `interactive`).
    pub slurm_step: Option<String>,
}

impl ProcessOwner {
    /// What `host` says about its owners.
    pub fn of(host: &HostProcess) -> Self {
        let container = host.container.as_ref();
        let pod = host.kubernetes.as_ref();
        let job = host.slurm.as_ref();
        Self {
            container_name: container.and_then(|c| c.name.as_deref()).map(bounded),
            runtime: container
                .and_then(|c| c.runtime)
                .map(|r| r.as_str().to_owned()),
            kube_namespace: pod.map(|p| bounded(&p.namespace)),
            kube_pod: pod.map(|p| bounded(&p.pod)),
            kube_container: pod.and_then(|p| p.container.as_deref()).map(bounded),
            slurm_job: job.map(|j| j.job_id.to_string()),
            slurm_step: job.and_then(|j| j.step).map(|s| s.to_string()),
        }
    }
}

/// `text` escaped for people (control and bidi characters) and cut to
/// [`OWNER_LABEL_MAX_CHARS`] characters, the last of them `…` when cut.
pub fn bounded(text: &str) -> String {
    let escaped = untrusted::escape(text);
    if escaped.chars().count() <= OWNER_LABEL_MAX_CHARS {
        return escaped.into_owned();
    }
    let mut cut: String = escaped.chars().take(OWNER_LABEL_MAX_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// One Slurm job's series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSeries {
    /// The job id.
    pub job_id: String,
    /// The job's user (`SLURM_JOB_USER`, else `uid N` of the cgroup v1 path); escaped,
    /// bounded.
    pub user: Option<String>,
    /// `SLURM_JOB_PARTITION`; escaped, bounded.
    pub partition: Option<String>,
    /// Its memory on each GPU it holds memory on, in GPU index order.
    pub gpus: Vec<JobGpu>,
}

/// A job's memory on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobGpu {
    /// NVML index.
    pub gpu: u32,
    /// The GPU's UUID (the peak is kept by it: indexes can change across reboots).
    pub uuid: String,
    /// The memory its processes hold there now; `None` when the driver reports any of it
    /// unavailable.
    pub used_bytes: Option<u64>,
    /// The most they held there together at one sample since the exporter first saw the
    /// job; filled by [`JobPeaks::update`].
    pub max_bytes: Option<u64>,
}

/// The Slurm jobs of `observation`, each with its memory per GPU: the `job` grouping of
/// `ps --by job` (`vramctl_observe::owners::totals`), every listed process counted, not
/// only those with series of their own.
pub fn jobs(observation: &Observation) -> Vec<JobSeries> {
    let held = holdings(&observation.snapshot, &GpuFilter::default());
    let mut by_job: BTreeMap<u32, JobSeries> = BTreeMap::new();
    for total in totals(OwnerKey::Job, &held, &observation.hosts) {
        let Some(id) = total.owner.as_deref() else {
            continue;
        };
        let Ok(job_id) = id.parse::<u32>() else {
            continue;
        };
        by_job
            .entry(job_id)
            .or_insert_with(|| JobSeries {
                job_id: id.to_owned(),
                user: None,
                partition: None,
                gpus: Vec::new(),
            })
            .gpus
            .push(JobGpu {
                gpu: total.gpu,
                uuid: total.uuid,
                used_bytes: total.used_bytes,
                max_bytes: None,
            });
    }
    // The job's user and partition: what any of its processes was told (one process's
    // environment may be unreadable), as `ps --by job` labels it; a user's name wins over
    // the cgroup's uid.
    let mut uids: BTreeMap<u32, u32> = BTreeMap::new();
    for host in observation.hosts.values() {
        let Some(job) = &host.slurm else { continue };
        let Some(series) = by_job.get_mut(&job.job_id) else {
            continue;
        };
        if series.user.is_none() {
            series.user = job.user.as_deref().map(bounded);
        }
        if series.partition.is_none() {
            series.partition = job.partition.as_deref().map(bounded);
        }
        if let Some(uid) = job.uid {
            uids.entry(job.job_id).or_insert(uid);
        }
    }
    for (job_id, uid) in uids {
        if let Some(series) = by_job.get_mut(&job_id) {
            series.user.get_or_insert_with(|| format!("uid {uid}"));
        }
    }
    for gpus in by_job.values_mut().map(|j| &mut j.gpus) {
        gpus.sort_by_key(|g| g.gpu);
    }
    by_job.into_values().collect()
}

#[derive(Debug, Clone, Copy)]
struct Peak {
    max_bytes: u64,
    last_seen_ms: i64,
}

/// Each job's peak per GPU since the exporter first saw it, kept across samples on the
/// sampler thread.
#[derive(Debug, Default)]
pub struct JobPeaks {
    by_job_gpu: HashMap<(String, String), Peak>,
}

impl JobPeaks {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes this sample's job memory (at `now_ms`, monotonic) into the peaks, fills each
    /// [`JobGpu::max_bytes`], and forgets jobs unseen for [`JOB_PEAK_FORGET_AFTER_MS`].
    pub fn update(&mut self, jobs: &mut [JobSeries], now_ms: i64) {
        for job in jobs.iter_mut() {
            for gpu in &mut job.gpus {
                let key = (job.job_id.clone(), gpu.uuid.clone());
                let peak = match (self.by_job_gpu.get_mut(&key), gpu.used_bytes) {
                    (Some(peak), used) => {
                        peak.max_bytes = peak.max_bytes.max(used.unwrap_or(0));
                        peak.last_seen_ms = now_ms;
                        *peak
                    }
                    (None, used) => {
                        let peak = Peak {
                            max_bytes: used.unwrap_or(0),
                            last_seen_ms: now_ms,
                        };
                        self.by_job_gpu.insert(key, peak);
                        peak
                    }
                };
                // A job whose memory was never reported has no peak to show.
                gpu.max_bytes =
                    (peak.max_bytes > 0 || gpu.used_bytes.is_some()).then_some(peak.max_bytes);
            }
        }
        self.by_job_gpu
            .retain(|_, peak| now_ms.saturating_sub(peak.last_seen_ms) <= JOB_PEAK_FORGET_AFTER_MS);
        if self.by_job_gpu.len() > JOB_PEAK_MAX_ENTRIES {
            let mut seen: Vec<i64> = self.by_job_gpu.values().map(|p| p.last_seen_ms).collect();
            seen.sort_unstable();
            let cut = seen[seen.len() - JOB_PEAK_MAX_ENTRIES];
            self.by_job_gpu.retain(|_, peak| peak.last_seen_ms >= cut);
        }
    }

    /// How many (job, GPU) peaks are kept.
    pub fn len(&self) -> usize {
        self.by_job_gpu.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.by_job_gpu.is_empty()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use vramctl_core::types::{
        DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, ProcessKind,
        ProcessUsage, Snapshot,
    };
    use vramctl_kube::attribution::ProcessPod;
    use vramctl_procs::container::{ContainerFacts, ContainerRuntime};
    use vramctl_procs::slurm::{SlurmJob, SlurmSource, SlurmStep};

    use super::*;

    const GIB: u64 = 1 << 30;

    /// Two GPUs; `(gpu, pid, bytes)` listed.
    pub(crate) fn snapshot(listed: &[(u32, u32, Option<u64>)]) -> Snapshot {
        let device = |index: u32| DeviceSnapshot {
            info: Arc::new(DeviceInfo {
                index,
                uuid: format!("GPU-{index}"),
                name: Some("NVIDIA H200".into()),
                pci_bus_id: None,
                minor_number: Some(index),
                mig_enabled: Some(false),
                mig_instances: Vec::new(),
            }),
            state: DeviceState::Ok(DeviceReading {
                processes: Some(
                    listed
                        .iter()
                        .filter(|(gpu, _, _)| *gpu == index)
                        .map(|&(_, pid, used_bytes)| ProcessUsage {
                            pid,
                            used_bytes,
                            kind: ProcessKind::Compute,
                            gpu_instance_id: None,
                            compute_instance_id: None,
                        })
                        .collect(),
                ),
                ..DeviceReading::default()
            }),
        };
        Snapshot {
            taken_at_unix_ms: 1_700_000_000_000,
            monotonic_ms: 5_000,
            driver: Arc::new(DriverInfo::default()),
            devices: vec![device(0), device(1)],
            unopened: Vec::new(),
        }
    }

    pub(crate) fn job(id: u32, user: Option<&str>, partition: Option<&str>) -> SlurmJob {
        SlurmJob {
            job_id: id,
            step: Some(SlurmStep::Number(0)),
            user: user.map(Into::into),
            uid: Some(1000),
            partition: partition.map(Into::into),
            source: SlurmSource::Cgroup,
            environ_conflict: None,
        }
    }

    pub(crate) fn host(pid: u32, user: &str, slurm: Option<SlurmJob>) -> HostProcess {
        HostProcess {
            pid,
            user: Some(user.into()),
            command: format!("python train.py --rank {pid}"),
            slurm,
            ..HostProcess::default()
        }
    }

    /// A process of a hostile user: every name it could choose is an attack on the
    /// exposition or on whoever reads it.
    pub(crate) fn hostile(pid: u32) -> HostProcess {
        let evil = "a\"b\\c\nd\u{1b}[2K\u{202e}e";
        HostProcess {
            container_id: Some(
                "3f0c2b7a9d8e4f61a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70819".into(),
            ),
            pod_uid: Some("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into()),
            container: Some(ContainerFacts {
                id: "3f0c2b7a9d8e4f61a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70819".into(),
                runtime: Some(ContainerRuntime::Containerd),
                name: Some("x".repeat(1000)),
                rootless_uid: None,
            }),
            kubernetes: Some(ProcessPod {
                namespace: "ml".into(),
                pod: evil.into(),
                container: Some("trainer".into()),
                pod_uid: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into(),
            }),
            ..host(pid, "mallory", Some(job(77, Some("mallory"), Some(evil))))
        }
    }

    #[test]
    fn owner_labels_are_escaped_and_bounded() {
        assert_eq!(bounded("trainer"), "trainer");
        assert_eq!(bounded("a\nb\u{1b}[2K"), "a\\nb\\u{1b}[2K");
        let long = bounded(&"é".repeat(500));
        assert_eq!(long.chars().count(), OWNER_LABEL_MAX_CHARS);
        assert!(long.ends_with('…'));
        let owner = ProcessOwner::of(&hostile(10));
        assert_eq!(
            owner.container_name.as_deref().map(|n| n.chars().count()),
            Some(OWNER_LABEL_MAX_CHARS)
        );
        assert_eq!(owner.runtime.as_deref(), Some("containerd"));
        assert_eq!(
            owner.kube_pod.as_deref(),
            Some("a\"b\\c\\nd\\u{1b}[2K\\u{202e}e")
        );
        assert_eq!(owner.slurm_job.as_deref(), Some("77"));
        assert_eq!(owner.slurm_step.as_deref(), Some("0"));
    }

    #[test]
    fn a_jobs_memory_is_summed_per_gpu_over_all_its_processes() {
        let mut observation = Observation::bare(snapshot(&[
            (0, 10, Some(4 * GIB)),
            (0, 11, Some(2 * GIB)),
            (1, 11, Some(GIB)),
            (0, 12, Some(GIB)),
            (1, 13, None),
            // Not visible here: no job.
            (1, 14, Some(8 * GIB)),
        ]));
        observation.hosts = BTreeMap::from([
            // The environment of 10 was unreadable: the cgroup's uid only.
            (10, host(10, "alice", Some(job(1234, None, None)))),
            (
                11,
                host(11, "alice", Some(job(1234, Some("alice"), Some("gpu")))),
            ),
            (12, host(12, "bob", None)),
            (13, host(13, "carol", Some(job(99, None, None)))),
        ]);
        let jobs = jobs(&observation);
        assert_eq!(
            jobs,
            [
                JobSeries {
                    job_id: "99".into(),
                    user: Some("uid 1000".into()),
                    partition: None,
                    gpus: vec![JobGpu {
                        gpu: 1,
                        uuid: "GPU-1".into(),
                        used_bytes: None,
                        max_bytes: None,
                    }],
                },
                JobSeries {
                    job_id: "1234".into(),
                    user: Some("alice".into()),
                    partition: Some("gpu".into()),
                    gpus: vec![
                        JobGpu {
                            gpu: 0,
                            uuid: "GPU-0".into(),
                            used_bytes: Some(6 * GIB),
                            max_bytes: None,
                        },
                        JobGpu {
                            gpu: 1,
                            uuid: "GPU-1".into(),
                            used_bytes: Some(GIB),
                            max_bytes: None,
                        },
                    ],
                },
            ]
        );
    }

    fn one_job(used: Option<u64>) -> Vec<JobSeries> {
        vec![JobSeries {
            job_id: "7".into(),
            user: None,
            partition: None,
            gpus: vec![JobGpu {
                gpu: 0,
                uuid: "GPU-0".into(),
                used_bytes: used,
                max_bytes: None,
            }],
        }]
    }

    #[test]
    fn a_jobs_peak_outlives_its_drops_and_is_forgotten_an_hour_after_it_ends() {
        let mut peaks = JobPeaks::new();
        let seen = |used: Option<u64>, at_ms: i64, peaks: &mut JobPeaks| {
            let mut jobs = one_job(used);
            peaks.update(&mut jobs, at_ms);
            jobs[0].gpus[0].max_bytes
        };
        assert_eq!(seen(None, 0, &mut peaks), None, "never reported: no peak");
        assert_eq!(seen(Some(3 * GIB), 1_000, &mut peaks), Some(3 * GIB));
        assert_eq!(seen(Some(GIB), 2_000, &mut peaks), Some(3 * GIB));
        assert_eq!(
            seen(None, 3_000, &mut peaks),
            Some(3 * GIB),
            "unknown keeps it"
        );
        assert_eq!(seen(Some(5 * GIB), 4_000, &mut peaks), Some(5 * GIB));
        // The job holds nothing for a while (between two steps): its peak stays.
        peaks.update(&mut [], 4_000 + JOB_PEAK_FORGET_AFTER_MS);
        assert_eq!(peaks.len(), 1);
        assert_eq!(
            seen(Some(GIB), 4_000 + JOB_PEAK_FORGET_AFTER_MS, &mut peaks),
            Some(5 * GIB)
        );
        // Unseen for longer than an hour: a job of that id is a new job.
        peaks.update(&mut [], 4_001 + 2 * JOB_PEAK_FORGET_AFTER_MS);
        assert!(peaks.is_empty());
        assert_eq!(
            seen(Some(GIB), 5_000 + 2 * JOB_PEAK_FORGET_AFTER_MS, &mut peaks),
            Some(GIB)
        );
    }

    #[test]
    fn claimed_job_ids_cannot_grow_the_peaks_without_bound() {
        let mut peaks = JobPeaks::new();
        let mut jobs: Vec<JobSeries> = (0..JOB_PEAK_MAX_ENTRIES + 10)
            .map(|i| JobSeries {
                job_id: i.to_string(),
                ..one_job(Some(1)).remove(0)
            })
            .collect();
        peaks.update(&mut jobs[..10], 0);
        peaks.update(&mut jobs[10..], 1);
        assert_eq!(
            peaks.len(),
            JOB_PEAK_MAX_ENTRIES,
            "the least recently seen go first"
        );
    }
}
