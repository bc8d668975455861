//! Which pod container a GPU process is, from the facts that hold without guessing.
//!
//! - The process's pod UID comes from its `/proc/PID/cgroup` (vramctl-procs parses it).
//! - The UID names a pod only through the kubelet's `/var/log/pods/<ns>_<name>_<uid>`
//!   directories ([`crate::pod_logs`]); the pod-resources API has no UID.
//! - The container is named when, of that pod's containers, exactly one was given one of
//!   the GPUs the process uses (pod-resources). Several, or none (a pod that sees GPUs it was
//!   not allocated, as with `NVIDIA_VISIBLE_DEVICES=all`): the pod is named, the container
//!   is not.
//!
//! A GPU process with no pod UID is not in a pod; a pod UID with no log directory is "a pod
//! vramctl cannot name". A GPU's allocation alone never names a process: a privileged pod
//! (a monitoring agent, the device plugin) may use a GPU it was not given, and a host
//! process may use a GPU a pod holds. Without host PIDs the per-GPU allocation is still
//! said (`GPU 0 is allocated to pod ns/name`), as a fact about the GPU.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::allocation::GpuAllocations;
use crate::client::PodResourcesQuery;
use crate::pod_logs::{self, PodName};

/// The pod (and, where it can be told, the container) a process runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessPod {
    pub namespace: String,
    pub pod: String,
    /// `None`: the pod has several or no containers given this process's GPUs.
    pub container: Option<String>,
    pub pod_uid: String,
}

/// The kubelet's view at one moment: what it allocated, and pod names by UID.
#[derive(Debug, Clone, Default)]
pub struct KubeletView {
    /// `None`: the pod-resources API could not be asked (the error says why).
    pub allocations: Option<GpuAllocations>,
    pub allocations_error: Option<String>,
    pub names_by_uid: BTreeMap<String, PodName>,
}

impl KubeletView {
    /// Asks the kubelet (bounded by `query`) when its socket exists, and lists
    /// `pod_log_dir`. Neither failure is the caller's error: each leaves its part empty, and
    /// the kubelet's is said in `allocations_error`.
    pub fn read(query: &PodResourcesQuery, pod_log_dir: &Path) -> KubeletView {
        // Only a path that exists is asked (a node without Kubernetes has none), and
        // `open_checked` then refuses anything but the kubelet's socket.
        let present = std::fs::symlink_metadata(&query.socket_path).is_ok();
        let (allocations, allocations_error) = if !present {
            (
                None,
                Some(format!("{}: no such socket", query.socket_path.display())),
            )
        } else {
            match query.gpu_allocations() {
                Ok(a) => (Some(a), None),
                Err(e) => {
                    tracing::debug!("kubelet pod-resources: {e}");
                    (None, Some(e.to_string()))
                }
            }
        };
        let names_by_uid = pod_logs::pod_names_by_uid(pod_log_dir).unwrap_or_else(|e| {
            tracing::debug!("{}: {e}", pod_log_dir.display());
            BTreeMap::new()
        });
        KubeletView {
            allocations,
            allocations_error,
            names_by_uid,
        }
    }

    /// The pod of a process in pod `pod_uid` (from its cgroup) using the GPUs `gpu_uuids`.
    pub fn pod_of_process(&self, pod_uid: Option<&str>, gpu_uuids: &[&str]) -> Option<ProcessPod> {
        let pod_uid = pod_uid?.to_ascii_lowercase();
        let name = self.names_by_uid.get(&pod_uid)?;
        let mut containers: Vec<&str> = Vec::new();
        if let Some(allocations) = &self.allocations {
            for uuid in gpu_uuids {
                let (holders, _shared) = allocations.holders_of(uuid);
                for holder in holders {
                    if holder.namespace == name.namespace
                        && holder.pod == name.pod
                        && !containers.contains(&holder.container.as_str())
                    {
                        containers.push(&holder.container);
                    }
                }
            }
        }
        Some(ProcessPod {
            namespace: name.namespace.clone(),
            pod: name.pod.clone(),
            container: match containers.as_slice() {
                [one] => Some((*one).to_string()),
                _ => None,
            },
            pod_uid,
        })
    }

    /// `namespace/pod/container` of every container given `gpu_uuid` (empty: none, or the
    /// kubelet was not asked).
    pub fn allocated_to(&self, gpu_uuid: &str) -> Vec<String> {
        self.allocations
            .as_ref()
            .map(|a| {
                a.holders_of(gpu_uuid)
                    .0
                    .iter()
                    .map(|h| h.to_string())
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::{Allocation, DeviceId, PodContainer};

    const UID: &str = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b";
    const GPU0: &str = "GPU-8ad3f8a4-1a2b-3c4d-5e6f-0123456789ab";
    const GPU1: &str = "GPU-19c0e4d2-7b3a-4f51-9e8d-abcdefabcdef";

    fn allocation(pod: &str, container: &str, gpu: &str) -> Allocation {
        Allocation {
            owner: PodContainer {
                namespace: "ml".into(),
                pod: pod.into(),
                container: container.into(),
            },
            resource_name: "nvidia.com/gpu".into(),
            device: DeviceId::Gpu { uuid: gpu.into() },
            replica: None,
        }
    }

    fn view(allocations: Vec<Allocation>) -> KubeletView {
        KubeletView {
            allocations: Some(GpuAllocations { allocations }),
            allocations_error: None,
            names_by_uid: [(
                UID.to_string(),
                PodName {
                    namespace: "ml".into(),
                    pod: "train".into(),
                },
            )]
            .into(),
        }
    }

    #[test]
    fn the_container_is_named_only_when_one_container_of_the_pod_holds_the_gpu() {
        let one = view(vec![
            allocation("train", "trainer", GPU0),
            allocation("other", "x", GPU1),
        ]);
        let pod = one.pod_of_process(Some(UID), &[GPU0]);
        assert_eq!(pod.and_then(|p| p.container).as_deref(), Some("trainer"));

        // The process uses a GPU its pod was not given: the pod, not a container.
        let pod = one.pod_of_process(Some(UID), &[GPU1]);
        assert_eq!(pod.as_ref().map(|p| p.pod.as_str()), Some("train"));
        assert_eq!(pod.and_then(|p| p.container), None);

        let two = view(vec![
            allocation("train", "a", GPU0),
            allocation("train", "b", GPU0),
        ]);
        assert_eq!(
            two.pod_of_process(Some(UID), &[GPU0])
                .and_then(|p| p.container),
            None
        );
    }

    #[test]
    fn a_process_outside_a_named_pod_is_never_given_the_gpus_pod() {
        let v = view(vec![allocation("train", "trainer", GPU0)]);
        // A host process on the pod's GPU.
        assert_eq!(v.pod_of_process(None, &[GPU0]), None);
        // A process of a pod whose UID no log directory names.
        assert_eq!(
            v.pod_of_process(Some("11111111-2222-3333-4444-555555555555"), &[GPU0]),
            None
        );
        assert_eq!(v.allocated_to(GPU0), ["ml/train/trainer"]);
        assert!(v.allocated_to(GPU1).is_empty());
    }
}
