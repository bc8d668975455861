//! The kubelet's device ids of NVIDIA GPUs, turned into GPU → pod containers.
//!
//! The NVIDIA device plugin (`k8s-device-plugin`) advertises `nvidia.com/gpu` (and, with the
//! "mixed" MIG strategy, `nvidia.com/mig-<profile>`; with time-slicing renamed,
//! `nvidia.com/gpu.shared`) and names each device by:
//! - `GPU-<uuid>`: a whole GPU (the default `deviceIDStrategy=uuid`);
//! - `MIG-<uuid>`: a MIG instance (driver R470 and later), or `MIG-GPU-<uuid>/<gi>/<ci>`
//!   (older drivers), which names its parent GPU;
//! - `<n>` or `<gpu>:<mig>` with `deviceIDStrategy=index`;
//! - any of these followed by `::<replica>` when the GPU is shared (time-slicing, MPS), so
//!   several containers hold the same GPU.
//!
//! An id in none of these forms is kept as [`DeviceId::Other`] and maps to no GPU: "cannot
//! map", never a guess.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::podresources_v1::PodResources;

/// One container of one pod, as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PodContainer {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

impl fmt::Display for PodContainer {
    /// `namespace/pod/container`, raw: escape it before a terminal sees it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.pod, self.container)
    }
}

/// A device id of the NVIDIA device plugin, parsed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DeviceId {
    /// A whole GPU by its UUID (`GPU-…`).
    Gpu { uuid: String },
    /// A MIG instance by its UUID (`MIG-…`); `parent_gpu_uuid` where the id names it (the
    /// older `MIG-GPU-<uuid>/<gi>/<ci>` form).
    Mig {
        uuid: String,
        parent_gpu_uuid: Option<String>,
    },
    /// `deviceIDStrategy=index`: the GPU's index (and MIG index) as the plugin saw them.
    Index { index: String },
    /// Not a form this module knows.
    Other { id: String },
}

impl DeviceId {
    /// Parses one id; the `::<replica>` suffix of a shared GPU is returned apart.
    pub fn parse(raw: &str) -> (DeviceId, Option<String>) {
        let (id, replica) = match raw.split_once("::") {
            Some((id, replica)) => (id, Some(replica.to_string())),
            None => (raw, None),
        };
        let parsed = if let Some(rest) = id.strip_prefix("MIG-GPU-") {
            // MIG-GPU-<uuid>/<gi>/<ci>: the parent is GPU-<uuid>.
            let parent = rest.split('/').next().unwrap_or(rest);
            if is_uuid_body(parent) {
                DeviceId::Mig {
                    uuid: id.to_string(),
                    parent_gpu_uuid: Some(format!("GPU-{parent}")),
                }
            } else {
                DeviceId::Other { id: id.to_string() }
            }
        } else if id.strip_prefix("MIG-").is_some_and(is_uuid_body) {
            DeviceId::Mig {
                uuid: id.to_string(),
                parent_gpu_uuid: None,
            }
        } else if id.strip_prefix("GPU-").is_some_and(is_uuid_body) {
            DeviceId::Gpu {
                uuid: id.to_string(),
            }
        } else if !id.is_empty()
            && id.len() <= 16
            && id
                .split(':')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            && id.split(':').count() <= 2
        {
            DeviceId::Index {
                index: id.to_string(),
            }
        } else {
            DeviceId::Other { id: id.to_string() }
        };
        (parsed, replica)
    }

    /// The UUID a GPU's processes can be matched by: the GPU's, or the MIG instance's.
    pub fn uuid(&self) -> Option<&str> {
        match self {
            DeviceId::Gpu { uuid } | DeviceId::Mig { uuid, .. } => Some(uuid),
            DeviceId::Index { .. } | DeviceId::Other { .. } => None,
        }
    }
}

/// NVML's UUID body: hex digits and dashes (`GPU-8ad3…-…`).
fn is_uuid_body(text: &str) -> bool {
    (8..=64).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// Whether a kubelet resource name is an NVIDIA GPU or MIG resource.
pub fn is_nvidia_gpu_resource(resource_name: &str) -> bool {
    resource_name == "nvidia.com/gpu"
        || resource_name.starts_with("nvidia.com/gpu.")
        || resource_name.starts_with("nvidia.com/mig-")
}

/// One device the kubelet gave one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Allocation {
    pub owner: PodContainer,
    pub resource_name: String,
    pub device: DeviceId,
    /// The `::<replica>` of a shared GPU: other containers may hold the same device.
    pub replica: Option<String>,
}

/// Every NVIDIA device the kubelet has given a container, by device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GpuAllocations {
    /// In the kubelet's order.
    pub allocations: Vec<Allocation>,
}

impl GpuAllocations {
    /// Collects the NVIDIA devices of a `List` answer; other resources (CPUs, memory, other
    /// vendors' devices, DRA claims) are left out.
    pub fn from_pod_resources(pods: &[PodResources]) -> GpuAllocations {
        let mut allocations = Vec::new();
        for pod in pods {
            for container in &pod.containers {
                for devices in &container.devices {
                    if !is_nvidia_gpu_resource(&devices.resource_name) {
                        continue;
                    }
                    for raw in &devices.device_ids {
                        let (device, replica) = DeviceId::parse(raw);
                        allocations.push(Allocation {
                            owner: PodContainer {
                                namespace: pod.namespace.clone(),
                                pod: pod.name.clone(),
                                container: container.name.clone(),
                            },
                            resource_name: devices.resource_name.clone(),
                            device,
                            replica,
                        });
                    }
                }
            }
        }
        GpuAllocations { allocations }
    }

    /// GPU or MIG UUID → the pod containers holding it (sorted, each once). A legacy MIG id
    /// is listed under its parent GPU's UUID too, since NVML names that GPU.
    pub fn by_uuid(&self) -> BTreeMap<String, Vec<PodContainer>> {
        let mut map: BTreeMap<String, Vec<PodContainer>> = BTreeMap::new();
        for allocation in &self.allocations {
            let mut keys: Vec<&str> = allocation.device.uuid().into_iter().collect();
            if let DeviceId::Mig {
                parent_gpu_uuid: Some(parent),
                ..
            } = &allocation.device
            {
                keys.push(parent);
            }
            for key in keys {
                let owners = map.entry(key.to_string()).or_default();
                if !owners.contains(&allocation.owner) {
                    owners.push(allocation.owner.clone());
                    owners.sort();
                }
            }
        }
        map
    }

    /// The containers holding a device named by `uuid`, and whether any holds it shared.
    pub fn holders_of(&self, uuid: &str) -> (Vec<&PodContainer>, bool) {
        let mut holders: Vec<&PodContainer> = Vec::new();
        let mut shared = false;
        for allocation in &self.allocations {
            let matches = allocation.device.uuid() == Some(uuid)
                || matches!(&allocation.device,
                    DeviceId::Mig { parent_gpu_uuid: Some(p), .. } if p == uuid);
            if matches {
                shared |= allocation.replica.is_some();
                if !holders.contains(&&allocation.owner) {
                    holders.push(&allocation.owner);
                }
            }
        }
        holders.sort();
        (holders, shared)
    }

    /// Ids in no known form (kept so that `doctor`-like callers can say what was not mapped).
    pub fn unmapped(&self) -> impl Iterator<Item = &Allocation> {
        self.allocations
            .iter()
            .filter(|a| a.device.uuid().is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podresources_v1::{ContainerDevices, ContainerResources};

    #[test]
    fn device_ids_of_the_nvidia_plugin_parse() {
        let gpu = "GPU-8ad3f8a4-1a2b-3c4d-5e6f-0123456789ab";
        assert_eq!(
            DeviceId::parse(gpu),
            (DeviceId::Gpu { uuid: gpu.into() }, None)
        );
        let mig = "MIG-1f2e3d4c-5b6a-5980-a1b2-c3d4e5f60718";
        assert_eq!(
            DeviceId::parse(mig).0,
            DeviceId::Mig {
                uuid: mig.into(),
                parent_gpu_uuid: None
            }
        );
        assert_eq!(
            DeviceId::parse("MIG-GPU-8ad3f8a4-1a2b-3c4d-5e6f-0123456789ab/7/0").0,
            DeviceId::Mig {
                uuid: "MIG-GPU-8ad3f8a4-1a2b-3c4d-5e6f-0123456789ab/7/0".into(),
                parent_gpu_uuid: Some(gpu.into())
            }
        );
        assert_eq!(
            DeviceId::parse(&format!("{gpu}::3")),
            (DeviceId::Gpu { uuid: gpu.into() }, Some("3".into()))
        );
        assert_eq!(
            DeviceId::parse("1:0").0,
            DeviceId::Index {
                index: "1:0".into()
            }
        );
        for other in ["", "GPU-", "GPU-zz", "gpu-0", "1:2:3", "../../x"] {
            assert!(
                matches!(DeviceId::parse(other).0, DeviceId::Other { .. }),
                "{other}"
            );
        }
    }

    #[test]
    fn only_nvidia_resources_are_collected_and_shared_gpus_list_every_holder() {
        let gpu = "GPU-8ad3f8a4-1a2b-3c4d-5e6f-0123456789ab";
        let container = |name: &str, resource: &str, ids: &[&str]| ContainerResources {
            name: name.into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
                topology: None,
            }],
            ..Default::default()
        };
        let pods = vec![
            PodResources {
                name: "a".into(),
                namespace: "ml".into(),
                containers: vec![
                    container("train", "nvidia.com/gpu", &[&format!("{gpu}::0")]),
                    container("nic", "example.com/nic", &["eth7"]),
                ],
                ..Default::default()
            },
            PodResources {
                name: "b".into(),
                namespace: "ml".into(),
                containers: vec![container(
                    "serve",
                    "nvidia.com/gpu.shared",
                    &[&format!("{gpu}::1")],
                )],
                ..Default::default()
            },
        ];
        let allocations = GpuAllocations::from_pod_resources(&pods);
        assert_eq!(allocations.allocations.len(), 2);
        let (holders, shared) = allocations.holders_of(gpu);
        assert!(shared);
        let names: Vec<String> = holders.iter().map(|h| h.to_string()).collect();
        assert_eq!(names, ["ml/a/train", "ml/b/serve"]);
        assert_eq!(allocations.by_uuid()[gpu].len(), 2);
    }
}
