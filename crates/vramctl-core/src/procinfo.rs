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
