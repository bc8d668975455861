//! Kubernetes facts for an observation: which pod (and container) each GPU process runs
//! in, and which pod containers the kubelet gave each GPU (`vramctl_kube`; docs/owners.md).
//! `Observation::add_kubernetes` puts them on it.
//!
//! Off unless the kubelet's socket or its pod log directory exists: a machine without
//! Kubernetes pays one `lstat` per refresh. `VRAMCTL_KUBELET_SOCKET` names another socket
//! (empty: never ask), `VRAMCTL_POD_LOG_DIR` another log directory.

use std::collections::BTreeMap;
use std::path::PathBuf;

use vramctl_core::types::Snapshot;
use vramctl_kube::client::{DEFAULT_SOCKET, PodResourcesQuery};
use vramctl_kube::pod_logs::DEFAULT_POD_LOG_DIR;
use vramctl_kube::{KubeletView, PodContainer};

/// Pods come and go in seconds; a live loop asks the kubelet at most this often.
pub const REFRESH_MS: i64 = 10_000;

/// Where the kubelet's facts are read, and the last view of them.
#[derive(Debug, Clone)]
pub struct KubeletSource {
    /// `None`: the kubelet is never asked (`VRAMCTL_KUBELET_SOCKET` empty).
    query: Option<PodResourcesQuery>,
    pod_log_dir: PathBuf,
    /// The last view and the snapshot time (monotonic) it was read at.
    last: Option<(i64, KubeletView)>,
}

impl KubeletSource {
    /// From the environment and the default paths; `None` when neither the socket nor the
    /// log directory exists (no Kubernetes here).
    pub fn from_env() -> Option<Self> {
        let socket = match std::env::var_os("VRAMCTL_KUBELET_SOCKET") {
            Some(path) if path.is_empty() => None,
            Some(path) => Some(PathBuf::from(path)),
            None => Some(PathBuf::from(DEFAULT_SOCKET)),
        };
        let pod_log_dir = std::env::var_os("VRAMCTL_POD_LOG_DIR")
            .filter(|p| !p.is_empty())
            .map_or_else(|| PathBuf::from(DEFAULT_POD_LOG_DIR), PathBuf::from);
        let socket_exists = socket
            .as_ref()
            .is_some_and(|s| std::fs::symlink_metadata(s).is_ok());
        if !socket_exists && std::fs::symlink_metadata(&pod_log_dir).is_err() {
            return None;
        }
        Some(Self::new(
            socket.map(PodResourcesQuery::for_this_user),
            pod_log_dir,
        ))
    }

    /// Reads through `query` (`None`: the kubelet is never asked) and `pod_log_dir`.
    pub fn new(query: Option<PodResourcesQuery>, pod_log_dir: PathBuf) -> Self {
        Self {
            query,
            pod_log_dir,
            last: None,
        }
    }

    /// The view at `monotonic_ms`: read again when none was read for [`REFRESH_MS`].
    pub fn view_at(&mut self, monotonic_ms: i64) -> &KubeletView {
        let due = self.last.as_ref().is_none_or(|(at, _)| {
            monotonic_ms.saturating_sub(*at) >= REFRESH_MS || monotonic_ms < *at
        });
        if due {
            let view = match &self.query {
                Some(query) => KubeletView::read(query, &self.pod_log_dir),
                None => KubeletView {
                    names_by_uid: vramctl_kube::pod_names_by_uid(&self.pod_log_dir)
                        .unwrap_or_default(),
                    ..KubeletView::default()
                },
            };
            self.last = Some((monotonic_ms, view));
        }
        let (_, view) = self
            .last
            .get_or_insert_with(|| (monotonic_ms, KubeletView::default()));
        view
    }
}

/// GPU UUID → the pod containers `view` says hold it or one of its MIG instances (GPUs no
/// container holds are left out).
pub fn gpu_holders(snapshot: &Snapshot, view: &KubeletView) -> BTreeMap<String, Vec<PodContainer>> {
    let mut gpus: BTreeMap<String, Vec<PodContainer>> = BTreeMap::new();
    let Some(allocations) = &view.allocations else {
        return gpus;
    };
    for device in &snapshot.devices {
        let mut holders: Vec<PodContainer> = Vec::new();
        let info = &device.info;
        let uuids = std::iter::once(info.uuid.as_str())
            .chain(info.mig_instances.iter().map(|m| m.uuid.as_str()));
        for uuid in uuids {
            for holder in allocations.holders_of(uuid).0 {
                if !holders.contains(holder) {
                    holders.push(holder.clone());
                }
            }
        }
        if !holders.is_empty() {
            holders.sort();
            gpus.insert(info.uuid.clone(), holders);
        }
    }
    gpus
}

/// The UUIDs each listed process uses: its GPUs', and the MIG instance's its context lives
/// in (matched by GPU and compute instance ids), which the device plugin names.
pub fn gpu_uuids_by_pid(snapshot: &Snapshot) -> BTreeMap<u32, Vec<String>> {
    let mut map: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for device in &snapshot.devices {
        let Some(reading) = device.reading() else {
            continue;
        };
        for process in reading.processes.iter().flatten() {
            let uuids = map.entry(process.pid).or_default();
            uuids.push(device.info.uuid.clone());
            let mig = device.info.mig_instances.iter().find(|m| {
                process.gpu_instance_id.is_some()
                    && m.gpu_instance_id == process.gpu_instance_id
                    && m.compute_instance_id == process.compute_instance_id
            });
            if let Some(mig) = mig {
                uuids.push(mig.uuid.clone());
            }
        }
    }
    map
}
