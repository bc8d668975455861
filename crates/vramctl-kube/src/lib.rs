//! Kubernetes facts for vramctl: which pod container the kubelet gave each GPU.
//!
//! - [`client`]: the kubelet's pod-resources gRPC API (`v1.PodResourcesLister` on
//!   `/var/lib/kubelet/pod-resources/kubelet.sock`), `List` and `Get`, over a socket checked
//!   by [`socket`] (root's, a socket, no symlink on the way), bounded in time and size.
//! - [`allocation`]: the NVIDIA device plugin's device ids (GPU and MIG UUIDs) of each pod
//!   container, turned into GPU UUID → pod containers.
//! - [`pod_logs`]: pod UID → namespace/name from the kubelet's `/var/log/pods` directory
//!   names, so a process whose cgroup names a pod UID can be named (the pod-resources API
//!   carries no UID).
//!
//! Names in these answers were chosen by whoever created the pod: they are untrusted text,
//! escaped by the caller before a terminal sees them.

pub mod allocation;
pub mod attribution;
pub mod client;
pub mod pod_logs;
pub mod socket;
#[cfg(feature = "test-kubelet")]
pub mod test_kubelet;

/// The Rust made from `proto/podresources/v1/api.proto` by `regen/` (checked in so that a
/// build needs no protoc; `cargo run --manifest-path crates/vramctl-kube/regen/Cargo.toml`
/// writes it again). The server half is there for the tests, which answer from it.
pub mod podresources_v1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic, rust_2018_idioms)]
    include!("generated/v1.rs");
}

pub use allocation::{DeviceId, GpuAllocations, PodContainer};
pub use attribution::{KubeletView, ProcessPod};
pub use client::{KubeletError, PodResourcesQuery};
pub use pod_logs::{PodName, pod_names_by_uid};
