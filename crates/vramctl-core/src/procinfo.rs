//! What /proc says about a PID the driver reported: who owns it and what it runs.
//!
//! NVML gives a PID and a byte count; people need "alice, python train.py". A PID NVML
//! reports may not exist in this PID namespace (a container without `--pid=host`): then
//! [`ProcReader::details`] answers `None` and frontends say "not visible here".

use std::collections::HashMap;

use procfs::process::Process;
use serde::{Deserialize, Serialize};

/// Who a process is, across PID reuse and reboots: `(boot id, pid, start time)`.
///
/// A PID alone names "whatever has this number now"; the start time (clock ticks after
/// boot, field 22 of /proc/PID/stat) tells a reused PID apart, and the boot id makes the
/// pair unique across reboots when it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProcessIdentity {
    /// `/proc/sys/kernel/random/boot_id` of the boot the process ran in.
    pub boot_id: String,
    /// PID in this namespace.
    pub pid: u32,
    /// Start time in clock ticks after boot.
    pub start_time_ticks: u64,
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), or `None` where /proc lacks it.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
}

/// A process as /proc describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessDetails {
    /// PID in our namespace.
    pub pid: u32,
    /// Real user id.
    pub uid: Option<u32>,
    /// User name for `uid`, when the user database knows it.
    pub user: Option<String>,
    /// Command line joined with spaces, or `[comm]` when it has none (kernel threads,
    /// zombies).
    pub command: String,
    /// Parent PID.
    pub ppid: Option<u32>,
    /// State letter from /proc/PID/stat (`R`, `S`, `D`, `Z`, ...).
    pub state: Option<char>,
    /// Start time in clock ticks after boot (field 22 of /proc/PID/stat): with the boot id,
    /// the identity of the process.
    pub start_time_ticks: Option<u64>,
}

/// Reads /proc, caching user names (a lookup can go through NSS and the network).
#[derive(Debug, Default)]
pub struct ProcReader {
    users: HashMap<u32, Option<String>>,
}

impl ProcReader {
    /// A reader with an empty user cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// What /proc says about `pid`, or `None` when no such process is visible here.
    pub fn details(&mut self, pid: u32) -> Option<ProcessDetails> {
        let process = Process::new(i32::try_from(pid).ok()?).ok()?;
        let stat = process.stat().ok();
        let uid = process.uid().ok();
        let user = uid.and_then(|uid| self.user_name(uid));
        let command = match process.cmdline() {
            Ok(args) if !args.is_empty() => args.join(" "),
            _ => format!("[{}]", stat.as_ref().map_or("?", |s| s.comm.as_str())),
        };
        Some(ProcessDetails {
            pid,
            uid,
            user,
            command,
            ppid: stat.as_ref().and_then(|s| u32::try_from(s.ppid).ok()),
            state: stat.as_ref().map(|s| s.state),
            start_time_ticks: stat.as_ref().map(|s| s.starttime),
        })
    }

    /// The name of user `uid`, cached.
    pub fn user_name(&mut self, uid: u32) -> Option<String> {
        self.users
            .entry(uid)
            .or_insert_with(|| {
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                    .ok()
                    .flatten()
                    .map(|u| u.name)
            })
            .clone()
    }
}

/// The container id and Kubernetes pod UID of `pid`, from `/proc/PID/cgroup`.
///
/// `(None, None)` for a process outside any container, or one not visible here. The
/// container id is the 64-hex-digit id runtimes put in the cgroup path (Docker,
/// containerd, CRI-O); the pod UID is the one in a kubepods cgroup, with systemd's `_`
/// turned back into `-` (join it with kube-state-metrics' `kube_pod_info{uid}` for a name).
// (serve, issue 7; `procs` and `store` add cgroup parsing too: the lead dedupes at merge.)
pub fn cgroup_container_and_pod(pid: u32) -> (Option<String>, Option<String>) {
    match std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
        Ok(text) => parse_cgroup_container_and_pod(&text),
        Err(_) => (None, None),
    }
}

/// [`cgroup_container_and_pod`] on the text of a `/proc/PID/cgroup` file.
pub fn parse_cgroup_container_and_pod(text: &str) -> (Option<String>, Option<String>) {
    let mut container = None;
    let mut pod = None;
    for line in text.lines() {
        // `hierarchy-id:controllers:path`; the path may itself contain ':'.
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        for part in path.split('/') {
            if pod.is_none() {
                pod = pod_uid(part);
            }
            if container.is_none() {
                container = container_id(part);
            }
        }
        if container.is_some() && pod.is_some() {
            break;
        }
    }
    (container, pod)
}

/// `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid with _>.slice` (systemd).
fn pod_uid(part: &str) -> Option<String> {
    let start = part.rfind("pod")? + 3;
    let rest = part[start..].trim_end_matches(".slice");
    let uid: String = rest
        .chars()
        .map(|c| if c == '_' { '-' } else { c })
        .collect();
    let is_uuid = uid.len() == 36
        && uid.chars().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    is_uuid.then_some(uid)
}

/// The last run of exactly 64 hex digits in a path component
/// (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, `<id>`).
fn container_id(part: &str) -> Option<String> {
    let part = part.trim_end_matches(".scope");
    let id = part.rsplit(['-', ':']).next()?;
    (id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_process_is_visible() {
        let mut reader = ProcReader::new();
        let me = reader.details(std::process::id()).expect("we exist");
        assert_eq!(me.pid, std::process::id());
        assert!(me.start_time_ticks.is_some());
        assert!(me.uid.is_some());
        assert!(!me.command.is_empty());
    }

    #[test]
    fn boot_id_is_a_uuid() {
        let id = boot_id().expect("linux has a boot id");
        assert_eq!(id.len(), 36, "{id}");
    }

    #[test]
    fn a_pid_that_cannot_exist_is_none() {
        let mut reader = ProcReader::new();
        assert_eq!(reader.details(u32::MAX), None);
        assert_eq!(reader.details(0), None);
    }
}

#[cfg(test)]
mod cgroup_tests {
    use super::*;

    const ID: &str = "3f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

    #[test]
    fn kubernetes_systemd_driver() {
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod1f2e3d4c_5b6a_7980_a1b2_c3d4e5f60718.slice/\
             cri-containerd-{ID}.scope\n"
        );
        assert_eq!(
            parse_cgroup_container_and_pod(&text),
            (
                Some(ID.to_owned()),
                Some("1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718".to_owned())
            )
        );
    }

    #[test]
    fn kubernetes_cgroupfs_driver_v1() {
        let text = format!(
            "12:memory:/kubepods/besteffort/pod1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718/{ID}\n\
             1:name=systemd:/kubepods/besteffort/pod1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718/{ID}\n"
        );
        let (container, pod) = parse_cgroup_container_and_pod(&text);
        assert_eq!(container.as_deref(), Some(ID));
        assert_eq!(pod.as_deref(), Some("1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718"));
    }

    #[test]
    fn docker_without_kubernetes() {
        let text = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(
            parse_cgroup_container_and_pod(&text),
            (Some(ID.to_owned()), None)
        );
    }

    #[test]
    fn host_process_has_neither() {
        let text = "0::/user.slice/user-1000.slice/session-3.scope\n";
        assert_eq!(parse_cgroup_container_and_pod(text), (None, None));
        assert_eq!(parse_cgroup_container_and_pod(""), (None, None));
        assert_eq!(cgroup_container_and_pod(u32::MAX), (None, None));
    }
}
