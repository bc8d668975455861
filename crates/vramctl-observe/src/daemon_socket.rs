//! The daemon's fast path: a running `vramctl record` or `vramctl serve` answers `status`,
//! `ps` and `top`'s first frame over a local socket (`vramctl_agent::local_socket`, the
//! convention every vramctl socket follows), so they need not start NVML themselves — the
//! 15 ms or more of `nvmlInit` and the first touch of each GPU that dominate a one-shot
//! command.
//!
//! The daemon reads the devices *when asked* ([`server`]: one extra tick of its own sampler,
//! never a cached one), and says what its /proc knows about the processes listed, from a
//! [`ProcessCatalog`](vramctl_procs::process_catalog::ProcessCatalog): what `status` and `ps`
//! would read themselves. The client ([`client`]) uses an answer only from a daemon on the
//! same boot and in the same PID namespace (so PIDs and /proc mean the same on both sides)
//! reading the same NVML library when one was named; otherwise, or when nobody answers in
//! [`CLIENT_TIMEOUT`], it reads NVML itself and nothing shows the difference.
//!
//! Messages (`docs/socket.md`): after the greeting (`"protocol": 1`, `"service":
//! "vramctl-daemon"`), one [`Request`] and one reply, `{"ok": SampleReply}` or `{"error":
//! …}`.

pub mod client;
pub mod server;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use vramctl_core::types::Snapshot;
use vramctl_procs::procinfo::ProcessDetails;

use crate::pid_view::NamespaceView;

/// The service name in the greeting.
pub const SERVICE: &str = "vramctl-daemon";
/// The version of the messages below.
pub const PROTOCOL: u32 = 1;
/// The socket's file name in its directory (`/run/vramctl/daemon.sock` for root's daemon).
pub const SOCKET_FILE: &str = "daemon.sock";
/// The second socket, beside [`SOCKET_FILE`], that a daemon started with
/// `--containers-socket` opens to every user: it answers only callers in another PID
/// namespace, each with its own processes (`crate::pid_view`), so that a container whose
/// user is neither root nor in the `vramctl` group can map its PIDs (docs/owners.md).
pub const CONTAINERS_SOCKET_FILE: &str = "containers.sock";
/// The shortest time between two NVML reads made for [`CONTAINERS_SOCKET_FILE`]: anyone may
/// connect there, and a loop of requests must not keep the sampler (which the recording
/// loop shares) busy. 16 waiting connections take 1.6 s, inside [`SERVER_TIMEOUT`].
pub const CONTAINERS_MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Longest request: requests are a few dozen bytes.
pub const MAX_REQUEST_BYTES: usize = 4096;
/// Longest reply. 8 GPUs with 30 processes each, with their /proc facts, take 39 KB
/// (`examples/scenarios/eight-gpus-30-procs.toml`); command lines are the unbounded part
/// (up to the kernel's 2 MB of arguments each), so the limit is far above any real
/// machine and still keeps a broken daemon from making a client allocate without bound.
pub const MAX_REPLY_BYTES: usize = 16 << 20;
/// How long a client waits for a daemon, from connecting to the last byte of the reply,
/// before reading NVML itself. See `docs/socket.md` for the figures it was chosen on.
pub const CLIENT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the daemon waits for a request and for its reply to be taken.
pub const SERVER_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections a daemon serves at once.
pub const MAX_CONNECTIONS: usize = 16;

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ask", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Request {
    /// Read every device now.
    Sample {
        /// Also read `/proc/PID/stat` of each listed process now (state, parent, CPU time,
        /// RSS, threads: what `ps` shows); `status` does not need it.
        #[serde(default)]
        process_stat: bool,
    },
}

/// The answer to [`Request::Sample`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleReply {
    /// Which daemon answered: `record` or `serve`.
    pub daemon: String,
    /// The NVML library the daemon loaded.
    pub nvml_library: PathBuf,
    /// The daemon's boot id: PIDs and start times only mean the same on the same boot.
    pub boot_id: Option<String>,
    /// The inode of the daemon's PID namespace: its /proc is the client's only when equal.
    pub pid_namespace: Option<u64>,
    /// The devices, read after the request came.
    pub snapshot: Snapshot,
    /// What the daemon's /proc says about each listed process it can see, or `None` when
    /// it does not read /proc (`serve --process-details nvml|none`): read your own.
    pub processes: Option<Vec<ProcessDetails>>,
    /// The driver's names of the listed processes the daemon's /proc cannot see.
    pub driver_names: BTreeMap<u32, String>,
    /// Set when the caller runs in another PID namespace than the daemon: the answer was
    /// made for that namespace ([`crate::pid_view::map_for_namespace`]): `snapshot` lists
    /// only its processes, under its PIDs, `processes` is `None` and `driver_names` empty
    /// (the caller reads its own /proc), and the rest is one figure per device. A client
    /// that does not know the field rejects the answer (`pid_namespace` is not its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapped: Option<NamespaceView>,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vramctl_core::types::{
        DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, Field, MemoryReading,
        ProcessKind, ProcessUsage, Unavailable,
    };

    use super::*;

    #[test]
    fn a_reply_round_trips_through_its_json() {
        let mut reading = DeviceReading {
            memory: Some(MemoryReading {
                total_bytes: 100,
                used_bytes: 40,
                reserved_bytes: 5,
                free_bytes: 55,
            }),
            processes: Some(vec![ProcessUsage {
                pid: 42,
                used_bytes: Some(40),
                kind: ProcessKind::Compute,
                gpu_instance_id: None,
                compute_instance_id: None,
            }]),
            ..DeviceReading::default()
        };
        reading
            .missing
            .insert(Field::Power, Unavailable::NotSupported);
        let reply = SampleReply {
            daemon: "record".into(),
            nvml_library: "libnvidia-ml.so.1".into(),
            boot_id: Some("b".into()),
            pid_namespace: Some(4_026_531_836),
            mapped: None,
            snapshot: Snapshot {
                taken_at_unix_ms: 1,
                monotonic_ms: 2,
                driver: Arc::new(DriverInfo::default()),
                devices: vec![DeviceSnapshot {
                    info: Arc::new(DeviceInfo {
                        index: 0,
                        uuid: "GPU-a".into(),
                        name: None,
                        pci_bus_id: None,
                        minor_number: None,
                        mig_enabled: Some(false),
                        mig_instances: Vec::new(),
                    }),
                    state: DeviceState::Ok(reading),
                }],
                unopened: Vec::new(),
            },
            processes: Some(Vec::new()),
            driver_names: BTreeMap::from([(42, "python".to_owned())]),
        };
        let json = serde_json::to_string(&reply).unwrap();
        let back: SampleReply = serde_json::from_str(&json).unwrap();
        assert_eq!(back, reply, "{json}");
        let request: Request = serde_json::from_str(r#"{"ask":"sample"}"#).unwrap();
        assert_eq!(
            request,
            Request::Sample {
                process_stat: false
            }
        );
    }
}
