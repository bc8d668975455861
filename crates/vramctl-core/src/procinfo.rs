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

/// Start time and CPU time of a process, from one read of `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTime {
    /// Start time in clock ticks after boot (field 22): with the boot id, the identity.
    pub start_time_ticks: u64,
    /// User plus system CPU time in clock ticks (fields 14 and 15).
    pub cpu_ticks: u64,
}

/// Start time and CPU time of `pid`, or `None` when it is not visible here.
///
/// Reads `/proc/PID/stat` directly (one `read`, no allocation beyond the buffer): the
/// recorder calls it for every GPU process, so it stays cheap.
pub fn cpu_time_ticks(pid: u32) -> Option<CpuTime> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_times(&stat)
}

/// Fields 14, 15 and 22 of a `/proc/PID/stat` line. The command (field 2) may hold spaces
/// and parentheses, so fields are counted after its last `)`.
fn parse_stat_times(stat: &str) -> Option<CpuTime> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (state); field N is at index N - 3.
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    let start_time_ticks: u64 = fields.get(22 - 3)?.parse().ok()?;
    Some(CpuTime {
        start_time_ticks,
        cpu_ticks: utime.saturating_add(stime),
    })
}

/// Container id and Kubernetes pod UID of `pid`, read from `/proc/PID/cgroup`.
///
/// `(None, None)` for a process outside any container, or one not visible here.
pub fn cgroup_ids(pid: u32) -> (Option<String>, Option<String>) {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_or((None, None), |text| parse_cgroup(&text))
}

/// Finds a container id (64 hex digits: Docker, containerd, CRI-O, Podman) and a pod UID
/// (`pod<uid>`, with `_` for `-` under the systemd cgroup driver) in cgroup paths such as
/// `0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c…_….slice/cri-containerd-<id>.scope`
/// or `12:memory:/docker/<id>`.
fn parse_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let mut container = None;
    let mut pod = None;
    for line in text.lines() {
        // hierarchy-id:controllers:path
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        for part in path.split('/') {
            let part = part.trim_end_matches(".scope").trim_end_matches(".slice");
            if pod.is_none() {
                if let Some(at) = part.rfind("pod") {
                    let uid = part[at + 3..].replace('_', "-");
                    if is_uuid(&uid) {
                        pod = Some(uid);
                    }
                }
            }
            if container.is_none() {
                let id = part.rsplit(['-', ':']).next().unwrap_or(part);
                if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
                    container = Some(id.to_owned());
                }
            }
        }
    }
    (container, pod)
}

fn is_uuid(text: &str) -> bool {
    text.len() == 36
        && text.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
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

    #[test]
    fn our_cpu_time_is_read() {
        let me = cpu_time_ticks(std::process::id()).expect("we exist");
        let details = ProcReader::new()
            .details(std::process::id())
            .expect("we exist");
        assert_eq!(Some(me.start_time_ticks), details.start_time_ticks);
        assert_eq!(cpu_time_ticks(u32::MAX), None);
    }

    #[test]
    fn stat_with_parentheses_in_the_command() {
        let stat = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 1 0 \
                    987654 1000 100 18446744073709551615";
        assert_eq!(
            parse_stat_times(stat),
            Some(CpuTime {
                start_time_ticks: 987_654,
                cpu_ticks: 280
            })
        );
        assert_eq!(parse_stat_times("12 (x) S 1"), None);
    }

    #[test]
    fn kubernetes_systemd_driver_cgroup() {
        let text = "0::/kubepods.slice/kubepods-burstable.slice/\
                    kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/\
                    cri-containerd-4c0ffee01234567890abcdef1234567890abcdef1234567890abcdef12345678.scope\n";
        assert_eq!(
            parse_cgroup(text),
            (
                Some("4c0ffee01234567890abcdef1234567890abcdef1234567890abcdef12345678".into()),
                Some("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b".into())
            )
        );
    }

    #[test]
    fn docker_cgroupfs_and_plain_host() {
        let docker =
            "12:memory:/docker/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n";
        assert_eq!(
            parse_cgroup(docker).0.as_deref(),
            Some("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
        );
        let pod = "0::/kubepods/besteffort/pod6f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/\
                   89abcdef0123456789abcdef0123456789abcdef0123456789abcdef01234567\n";
        assert_eq!(
            parse_cgroup(pod).1.as_deref(),
            Some("6f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b")
        );
        assert_eq!(
            parse_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n"),
            (None, None)
        );
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
            parse_cgroup(&text),
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
        let (container, pod) = parse_cgroup(&text);
        assert_eq!(container.as_deref(), Some(ID));
        assert_eq!(pod.as_deref(), Some("1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718"));
    }

    #[test]
    fn docker_without_kubernetes() {
        let text = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(parse_cgroup(&text), (Some(ID.to_owned()), None));
    }

    #[test]
    fn host_process_has_neither() {
        let text = "0::/user.slice/user-1000.slice/session-3.scope\n";
        assert_eq!(parse_cgroup(text), (None, None));
        assert_eq!(parse_cgroup(""), (None, None));
        assert_eq!(cgroup_ids(u32::MAX), (None, None));
    }
}
