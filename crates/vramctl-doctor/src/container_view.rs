//! What vramctl can see from where it runs (issue 31): whether NVML's PIDs are this
//! /proc's (the PID namespace) and, where not, whether a host daemon maps them; whether the
//! host's cgroup paths are visible (owners: container, pod, Slurm job); whether MIG devices
//! can be opened (`/dev/nvidia-caps`). Facts from [`collect`], pure checks here.

use std::path::Path;

use serde::Serialize;
use vramctl_agent::local_socket::search_dirs;
use vramctl_observe::daemon_socket::client::{AskOptions, ask};
use vramctl_observe::daemon_socket::{CONTAINERS_SOCKET_FILE, SOCKET_FILE};
use vramctl_procs::procinfo::PidNamespace;

use super::{Finding, GpuFacts, Status};

const HOST: &str = "host";

/// The inode of the initial cgroup namespace (the kernel's `CGROUP_NS_INIT_INO`).
pub const INITIAL_CGROUP_NAMESPACE_INODE: u64 = 0xEFFF_FFFB;

/// Where vramctl runs, as far as it can tell.
#[derive(Debug, Clone, Default)]
pub struct ViewFacts {
    /// NVML's PIDs are this /proc's (the host's PID namespace, or /proc is the host's).
    pub pids_are_hosts: bool,
    /// Our PID namespace's inode.
    pub pid_namespace: Option<u64>,
    /// Our cgroup namespace's inode (`/proc/self/ns/cgroup`); `None` when unreadable.
    pub cgroup_namespace: Option<u64>,
    /// `/dev/nvidia-caps` exists (MIG instances are opened through it).
    pub nvidia_caps: bool,
    /// What the host daemon said, when asked (only where the PIDs are not the host's).
    pub daemon: DaemonSeen,
}

/// The host daemon as seen from here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum DaemonSeen {
    /// Not asked: the PIDs are the host's already.
    #[default]
    NotAsked,
    /// No socket in the directories a client looks in.
    NoSocket {
        /// Those directories.
        looked_in: Vec<String>,
    },
    /// A socket is there, but no answer this namespace can use came (refused, another
    /// boot or library, a daemon inside another container, `cannot_map`).
    NoAnswer {
        /// The sockets found.
        sockets: Vec<String>,
    },
    /// A daemon answered for this namespace.
    Mapped,
    /// A daemon in this same namespace answered (its PIDs are ours).
    SameNamespace,
}

/// Reads the facts; asks a daemon (up to its 500 ms) only where NVML's PIDs are not ours.
pub fn collect() -> ViewFacts {
    let namespace = PidNamespace::current();
    let pids_are_hosts = namespace.proc_shows_host_pids();
    let inode = |path: &str| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).ok().map(|m| m.ino())
    };
    let daemon = if pids_are_hosts {
        DaemonSeen::NotAsked
    } else {
        daemon_seen()
    };
    ViewFacts {
        pids_are_hosts,
        pid_namespace: namespace.inode,
        cgroup_namespace: inode("/proc/self/ns/cgroup"),
        nvidia_caps: Path::new("/dev/nvidia-caps").is_dir(),
        daemon,
    }
}

fn daemon_seen() -> DaemonSeen {
    let dirs = search_dirs();
    let options = AskOptions {
        accept_mapped: true,
        ..AskOptions::default()
    };
    if let Some(reply) = ask(&options) {
        return if reply.mapped.is_some() {
            DaemonSeen::Mapped
        } else {
            DaemonSeen::SameNamespace
        };
    }
    let sockets: Vec<String> = dirs
        .iter()
        .flat_map(|d| [d.join(SOCKET_FILE), d.join(CONTAINERS_SOCKET_FILE)])
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .map(|p| p.display().to_string())
        .collect();
    if sockets.is_empty() {
        DaemonSeen::NoSocket {
            looked_in: dirs.iter().map(|d| d.display().to_string()).collect(),
        }
    } else {
        DaemonSeen::NoAnswer { sockets }
    }
}

/// `pid_namespace`: whether NVML's PIDs mean processes here, and if not, who maps them.
pub fn pid_namespace(view: &ViewFacts) -> Finding {
    let base = |status, summary: &str| {
        Finding::new("pid_namespace", HOST, status, summary.to_owned())
            .fact("pid_namespace", view.pid_namespace)
            .fact("nvml_pids_are_ours", view.pids_are_hosts)
            .fact("daemon", &view.daemon)
    };
    const FIX: &str = "run a host `vramctl record` or `serve` and mount its socket into the \
                       container (-v /run/vramctl/daemon.sock:/run/vramctl/daemon.sock), or \
                       give the container the host's PID namespace (--pid=host, hostPID: true)";
    if view.pids_are_hosts {
        return base(
            Status::Ok,
            "the host's PID namespace: NVML's PIDs are this /proc's",
        );
    }
    match &view.daemon {
        DaemonSeen::Mapped => base(
            Status::Ok,
            "a PID namespace of its own; the host daemon maps this namespace's GPU processes to its PIDs (others are one figure per GPU)",
        ),
        DaemonSeen::SameNamespace | DaemonSeen::NotAsked => base(
            Status::Warn,
            "a PID namespace of its own; a daemon in this namespace answers, but it cannot map NVML's PIDs for it: ps and status use them only where the driver numbers them in this namespace and every row checks out (driver 580 does), else show them as host PIDs that cannot be mapped",
        )
        .fix(FIX),
        DaemonSeen::NoSocket { .. } => base(
            Status::Warn,
            "a PID namespace of its own and no host daemon socket: ps and status use NVML's PIDs only where the driver numbers them in this namespace and every row checks out as a process here holding that GPU open (driver 580 does; other containers' processes are then not listed at all), else show them as host:PID with no user or command",
        )
        .fix(FIX),
        DaemonSeen::NoAnswer { sockets } => base(
            Status::Warn,
            &format!(
                "a PID namespace of its own; the daemon socket {} gave no answer for this namespace, so NVML's host PIDs cannot be mapped",
                sockets.join(", ")
            ),
        )
        .fix(
            "check that the daemon on the host runs (not one inside another container) and that this uid may connect to daemon.sock (root, its uid, or the vramctl group: docs/socket.md), or start the daemon with --containers-socket and mount /run/vramctl/containers.sock, which every uid may ask; VRAMCTL_LOG=debug vramctl ps says why",
        ),
    }
}

/// `cgroup_namespace`: whether the host's cgroup paths (container, pod and Slurm job of a
/// process) can be read here.
pub fn cgroup_namespace(view: &ViewFacts) -> Finding {
    let base = |status, summary: &str| {
        Finding::new("cgroup_namespace", HOST, status, summary.to_owned())
            .fact("cgroup_namespace", view.cgroup_namespace)
    };
    match view.cgroup_namespace {
        None => base(
            Status::Skipped,
            "/proc/self/ns/cgroup cannot be read (a kernel without cgroup namespaces?)",
        ),
        Some(INITIAL_CGROUP_NAMESPACE_INODE) => base(
            Status::Ok,
            "the host's cgroup namespace: container, pod and Slurm job are read from cgroup paths",
        ),
        Some(_) => base(
            Status::Warn,
            "a cgroup namespace of its own: cgroup paths start at this container's root, so no process here carries a container, pod or Slurm job (ps --by container|pod|job groups nothing)",
        )
        .fix("ask from the host for owners (vramctl ps --by pod on the host, or the exporter's vramctl_process_info series)"),
    }
}

/// `mig_devices`: a GPU with MIG on needs `/dev/nvidia-caps` to open its instances.
pub fn mig_devices(view: &ViewFacts, gpus: &[GpuFacts]) -> Finding {
    let on: Vec<u32> = gpus
        .iter()
        .filter(|g| {
            g.diagnostics
                .as_ref()
                .is_ok_and(|d| d.mig_current == Some(true))
        })
        .map(|g| g.id.index)
        .collect();
    let base = |status, summary: String| {
        Finding::new("mig_devices", HOST, status, summary)
            .fact("mig_gpus", &on)
            .fact("nvidia_caps", view.nvidia_caps)
    };
    if on.is_empty() {
        return base(Status::Skipped, "no GPU has MIG on".to_owned());
    }
    let list: Vec<String> = on.iter().map(u32::to_string).collect();
    if view.nvidia_caps {
        return base(
            Status::Ok,
            format!(
                "MIG is on (GPU {}) and /dev/nvidia-caps is here",
                list.join(", ")
            ),
        );
    }
    base(
        Status::Fail,
        format!(
            "MIG is on (GPU {}) but /dev/nvidia-caps is missing: CUDA cannot open any MIG instance here",
            list.join(", ")
        ),
    )
    .fix("give the container the MIG devices (docker run --gpus with the instance's MIG UUID, NVIDIA_MIG_CONFIG_DEVICES=all, or the device plugin's mig strategy); on the host: nvidia-modprobe -f /proc/driver/nvidia-caps/mig-minors")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GpuIdentity;
    use vramctl_core::types::DeviceDiagnostics;

    fn facts(pids_are_hosts: bool, daemon: DaemonSeen) -> ViewFacts {
        ViewFacts {
            pids_are_hosts,
            pid_namespace: Some(4_026_532_999),
            cgroup_namespace: Some(INITIAL_CGROUP_NAMESPACE_INODE),
            nvidia_caps: false,
            daemon,
        }
    }

    #[test]
    fn the_pid_namespace_is_ok_on_the_host_or_mapped_and_warns_with_the_socket_fix_otherwise() {
        assert_eq!(
            pid_namespace(&facts(true, DaemonSeen::NotAsked)).status,
            Status::Ok
        );
        assert_eq!(
            pid_namespace(&facts(false, DaemonSeen::Mapped)).status,
            Status::Ok
        );
        let f = pid_namespace(&facts(
            false,
            DaemonSeen::NoSocket {
                looked_in: vec!["/run/vramctl".into()],
            },
        ));
        assert_eq!(f.status, Status::Warn);
        assert!(f.fix.as_deref().is_some_and(|x| x.contains("daemon.sock")));
        let f = pid_namespace(&facts(
            false,
            DaemonSeen::NoAnswer {
                sockets: vec!["/run/vramctl/daemon.sock".into()],
            },
        ));
        assert_eq!(f.status, Status::Warn);
        assert!(f.summary.contains("/run/vramctl/daemon.sock"));
        assert!(
            f.fix
                .as_deref()
                .is_some_and(|x| x.contains("vramctl group"))
        );
    }

    #[test]
    fn a_cgroup_namespace_of_its_own_warns_that_owners_cannot_be_read() {
        let mut view = facts(true, DaemonSeen::NotAsked);
        assert_eq!(cgroup_namespace(&view).status, Status::Ok);
        view.cgroup_namespace = Some(4_026_533_000);
        let f = cgroup_namespace(&view);
        assert_eq!(f.status, Status::Warn);
        assert!(f.summary.contains("no process here carries a container"));
        view.cgroup_namespace = None;
        assert_eq!(cgroup_namespace(&view).status, Status::Skipped);
    }

    #[test]
    fn mig_without_nvidia_caps_fails() {
        let gpu = |mig| GpuFacts {
            id: GpuIdentity {
                index: 3,
                uuid: "GPU-3".into(),
                name: None,
                minor_number: Some(3),
                pci_bus_id: None,
            },
            diagnostics: Ok(DeviceDiagnostics {
                mig_current: Some(mig),
                ..DeviceDiagnostics::default()
            }),
            health: Ok(None),
            reading: None,
        };
        let mut view = facts(true, DaemonSeen::NotAsked);
        assert_eq!(mig_devices(&view, &[gpu(false)]).status, Status::Skipped);
        let f = mig_devices(&view, &[gpu(true)]);
        assert_eq!(f.status, Status::Fail);
        assert!(f.summary.contains("GPU 3"));
        view.nvidia_caps = true;
        assert_eq!(mig_devices(&view, &[gpu(true)]).status, Status::Ok);
    }
}
