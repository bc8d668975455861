//! Why vramctl will not signal a PID: pure checks over the PID, what /proc says about it and
//! who we are, so every rule is tested as a table.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::procinfo::{Stat, Status};

/// Facts about the vramctl process that signals, read once ([`Actor::current`]).
///
/// [`Actor::current`]: super::Actor::current
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    /// Our PID.
    pub pid: u32,
    /// Our parent, grandparent, ... up to the top of our namespace.
    pub ancestors: Vec<u32>,
    /// Real user id.
    pub uid: u32,
    /// Effective user id (0: root, allowed to signal anyone's processes).
    pub euid: u32,
    /// Our user name, when known.
    pub user: Option<String>,
    /// `/proc/sys/kernel/pid_max`: every valid PID is below it.
    pub pid_max: u32,
    /// This boot's id.
    pub boot_id: Option<String>,
    /// Whether we run in the initial PID namespace, where NVML's PIDs are our PIDs.
    pub namespace_initial: bool,
}

impl Actor {
    /// Whether we may signal other users' processes.
    pub fn is_root(&self) -> bool {
        self.euid == 0
    }
}

/// What a target must still be at signal time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expectation {
    /// Start time (clock ticks after boot) recorded when the target was chosen.
    pub start_time_ticks: Option<u64>,
    /// Real uid recorded when the target was chosen.
    pub uid: Option<u32>,
    /// In a non-initial PID namespace, the target must prove it is a GPU user by holding
    /// a `/dev/nvidia*` file (a PID from NVML may be a host PID that names another local
    /// process). Descendants found through our own /proc are not held to it.
    pub gpu_proof: bool,
}

/// What /proc says about a candidate, as [`check_process`] needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessFacts {
    /// `/proc/PID/stat`.
    pub stat: Stat,
    /// `/proc/PID/status`.
    pub status: Status,
    /// Its open `/dev/nvidia*` files; `None` when they could not be read.
    pub gpu_files: Option<Vec<String>>,
}

/// Why vramctl refuses to signal a PID. `Display` is one line that says why and, where
/// something can be done, what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "refusal")]
#[non_exhaustive]
pub enum Refusal {
    /// PID 0: `kill(0, sig)` signals the caller's own process group.
    PidZero,
    /// PID 1, the init process of the namespace.
    Init,
    /// Not a PID this kernel hands out; `4294967295` would be `kill(-1)`: everyone.
    OutOfRange {
        /// The number given.
        pid: u32,
        /// This kernel's `pid_max`.
        pid_max: u32,
    },
    /// vramctl itself.
    Ourselves {
        /// Our PID.
        pid: u32,
    },
    /// Our parent (the shell or program that ran us) or a further ancestor.
    OurAncestor {
        /// The PID.
        pid: u32,
        /// Whether it is our direct parent.
        parent: bool,
    },
    /// No such process here: it exited, or the PID belongs to another PID namespace.
    NotVisible {
        /// The PID.
        pid: u32,
    },
    /// A thread of another process, not a process.
    Thread {
        /// The thread id given.
        pid: u32,
        /// The process it belongs to.
        tgid: u32,
    },
    /// A kernel thread (`PF_KTHREAD`).
    KernelThread {
        /// The PID.
        pid: u32,
        /// Its name.
        comm: String,
    },
    /// Exited, not yet reaped: nothing left to signal.
    Zombie {
        /// The PID.
        pid: u32,
        /// The parent that must reap it.
        ppid: u32,
    },
    /// Another user's process, and we are not root.
    OtherUser {
        /// The PID.
        pid: u32,
        /// Its owner's real uid.
        owner_uid: u32,
        /// Our real uid.
        our_uid: u32,
    },
    /// The PID now names a different process than the one chosen (PID reuse), or the
    /// process changed owner.
    IdentityMismatch {
        /// The PID.
        pid: u32,
        /// What differs.
        detail: String,
    },
    /// The identity was recorded in another boot.
    OtherBoot {
        /// The PID.
        pid: u32,
    },
    /// In a non-initial PID namespace: the process holds no `/dev/nvidia*` file, so it may
    /// not be the process NVML meant.
    NotProvenGpuUser {
        /// The PID.
        pid: u32,
        /// Why the proof failed.
        detail: String,
    },
    /// `pidfd_open` is unavailable and the kill was automatic (policy kills fail closed).
    NoPidfd {
        /// The PID.
        pid: u32,
        /// What the kernel said.
        reason: String,
    },
    /// Named on the command line, but NVML lists no GPU memory for it now: the process
    /// that held it may have exited and its PID gone to a bystander (`kill --force`
    /// signals it anyway).
    NoGpuMemory {
        /// The PID.
        pid: u32,
    },
    /// /proc could not tell who the process is.
    Unreadable {
        /// The PID.
        pid: u32,
        /// What failed.
        reason: String,
    },
}

impl Refusal {
    /// The PID this refusal is about (0 for [`Refusal::PidZero`], 1 for [`Refusal::Init`]).
    pub fn pid(&self) -> u32 {
        match self {
            Self::PidZero => 0,
            Self::Init => 1,
            Self::OutOfRange { pid, .. }
            | Self::Ourselves { pid }
            | Self::OurAncestor { pid, .. }
            | Self::NotVisible { pid }
            | Self::Thread { pid, .. }
            | Self::KernelThread { pid, .. }
            | Self::Zombie { pid, .. }
            | Self::OtherUser { pid, .. }
            | Self::IdentityMismatch { pid, .. }
            | Self::OtherBoot { pid }
            | Self::NotProvenGpuUser { pid, .. }
            | Self::NoPidfd { pid, .. }
            | Self::NoGpuMemory { pid }
            | Self::Unreadable { pid, .. } => *pid,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PidZero => f.write_str(
                "PID 0 is not a process: kill(2) would signal our own process group (a driver \
                 reporting garbage?)",
            ),
            Self::Init => f.write_str(
                "PID 1 is the init process of this PID namespace; vramctl never signals it",
            ),
            Self::OutOfRange { pid, pid_max } if *pid > i32::MAX as u32 => write!(
                f,
                "PID {pid} is not a PID (pid_max is {pid_max}); as a signed pid_t it is {} and \
                 kill(2) would signal every process we may signal",
                // Reinterpreting the bits is the point: it shows what kill(2) would get.
                i32::from_ne_bytes(pid.to_ne_bytes())
            ),
            Self::OutOfRange { pid, pid_max } => write!(
                f,
                "PID {pid} is not a PID: this kernel's PIDs are below pid_max {pid_max}"
            ),
            Self::Ourselves { pid } => write!(f, "PID {pid} is this vramctl process"),
            Self::OurAncestor { pid, parent: true } => write!(
                f,
                "PID {pid} is the parent of this vramctl (the shell or program that ran it)"
            ),
            Self::OurAncestor { pid, parent: false } => write!(
                f,
                "PID {pid} is an ancestor of this vramctl; signalling it could end vramctl \
                 itself"
            ),
            Self::NotVisible { pid } => write!(
                f,
                "no process {pid} in this PID namespace: it exited, or the PID is from another \
                 namespace (run vramctl in the host PID namespace, e.g. docker run --pid=host)"
            ),
            Self::Thread { pid, tgid } => write!(
                f,
                "{pid} is a thread of process {tgid}, not a process; name {tgid} instead"
            ),
            Self::KernelThread { pid, comm } => write!(
                f,
                "PID {pid} ({comm}) is a kernel thread: it holds no GPU memory and is not \
                 vramctl's to signal"
            ),
            Self::Zombie { pid, ppid } => write!(
                f,
                "PID {pid} is a zombie: it has exited and holds nothing but its PID; its parent \
                 (PID {ppid}) must reap it, or exit so that init does"
            ),
            Self::OtherUser {
                pid,
                owner_uid,
                our_uid,
            } => write!(
                f,
                "PID {pid} belongs to uid {owner_uid}, not to you (uid {our_uid}); run vramctl \
                 as root or as that user"
            ),
            Self::IdentityMismatch { pid, detail } => write!(
                f,
                "PID {pid} now names another process ({detail}): the PID was reused; nothing was \
                 signalled"
            ),
            Self::OtherBoot { pid } => write!(
                f,
                "PID {pid} was recorded in another boot; that process no longer exists"
            ),
            Self::NoGpuMemory { pid } => write!(
                f,
                "PID {pid} holds no GPU memory now (NVML lists it on no GPU): if it held some, it \
                 has exited and the PID may name another process; --force signals it anyway"
            ),
            Self::NotProvenGpuUser { pid, detail } => write!(
                f,
                "PID {pid} {detail}, and in this PID namespace a PID from NVML may name another \
                 process; run vramctl in the host PID namespace"
            ),
            Self::NoPidfd { pid, reason } => write!(
                f,
                "cannot pin PID {pid} with pidfd_open ({reason}); automatic kills need it \
                 (`vramctl kill` re-checks the process instead)"
            ),
            Self::Unreadable { pid, reason } => {
                write!(f, "cannot tell who PID {pid} is: {reason}")
            }
        }
    }
}

/// Checks on the number alone, before anything touches the process: no syscall that could
/// signal runs for a PID that fails here.
///
/// # Errors
/// The refusal: PID 0, 1, at or above `pid_max` (4294967295 included), ourselves, our
/// parent or another ancestor.
pub fn check_pid(pid: u32, actor: &Actor) -> Result<(), Refusal> {
    match pid {
        0 => return Err(Refusal::PidZero),
        1 => return Err(Refusal::Init),
        _ => {}
    }
    // pid_max is at most 2^22 on Linux; anything that does not fit a positive pid_t is out
    // whatever /proc said.
    if pid >= actor.pid_max || i32::try_from(pid).is_err() {
        return Err(Refusal::OutOfRange {
            pid,
            pid_max: actor.pid_max,
        });
    }
    if pid == actor.pid {
        return Err(Refusal::Ourselves { pid });
    }
    if let Some(position) = actor.ancestors.iter().position(|a| *a == pid) {
        return Err(Refusal::OurAncestor {
            pid,
            parent: position == 0,
        });
    }
    Ok(())
}

/// Checks on what /proc says about `pid` now, against what the target must still be.
///
/// # Errors
/// The first rule it breaks, in this order: a thread, a kernel thread, a different start
/// time or owner than expected, a zombie, another user's process (unless we are root), no
/// proof of GPU use where one is needed.
pub fn check_process(
    pid: u32,
    facts: &ProcessFacts,
    actor: &Actor,
    expect: &Expectation,
) -> Result<(), Refusal> {
    let ProcessFacts {
        stat,
        status,
        gpu_files,
    } = facts;
    if let Some(tgid) = status.tgid.filter(|tgid| *tgid != pid) {
        return Err(Refusal::Thread { pid, tgid });
    }
    if stat.is_kernel_thread() {
        return Err(Refusal::KernelThread {
            pid,
            comm: stat.comm.clone(),
        });
    }
    if let Some(expected) = expect
        .start_time_ticks
        .filter(|e| *e != stat.start_time_ticks)
    {
        return Err(Refusal::IdentityMismatch {
            pid,
            detail: format!(
                "started at tick {}, expected tick {expected}",
                stat.start_time_ticks
            ),
        });
    }
    let Some(owner_uid) = status.uid_real else {
        return Err(Refusal::Unreadable {
            pid,
            reason: "/proc/PID/status has no Uid line".into(),
        });
    };
    if let Some(expected) = expect.uid.filter(|e| *e != owner_uid) {
        return Err(Refusal::IdentityMismatch {
            pid,
            detail: format!("owned by uid {owner_uid}, expected uid {expected}"),
        });
    }
    if stat.is_zombie() {
        return Err(Refusal::Zombie {
            pid,
            ppid: stat.ppid,
        });
    }
    if !actor.is_root() && owner_uid != actor.uid {
        return Err(Refusal::OtherUser {
            pid,
            owner_uid,
            our_uid: actor.uid,
        });
    }
    if expect.gpu_proof && !actor.namespace_initial {
        match gpu_files {
            None => {
                return Err(Refusal::NotProvenGpuUser {
                    pid,
                    detail: "has file descriptors we cannot read".into(),
                });
            }
            Some(files) if files.is_empty() => {
                return Err(Refusal::NotProvenGpuUser {
                    pid,
                    detail: "has no /dev/nvidia* file open".into(),
                });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor() -> Actor {
        Actor {
            pid: 5000,
            ancestors: vec![4000, 3000, 1],
            uid: 1000,
            euid: 1000,
            user: Some("alice".into()),
            pid_max: 4_194_304,
            boot_id: Some("b".into()),
            namespace_initial: true,
        }
    }

    fn stat(pid: u32) -> Stat {
        Stat {
            pid,
            comm: "python".into(),
            state: 'S',
            ppid: 4321,
            pgrp: i32::try_from(pid).unwrap(),
            flags: 0x0040_0100,
            utime_ticks: 10,
            stime_ticks: 2,
            threads: 3,
            start_time_ticks: 777,
            rss_pages: 100,
        }
    }

    fn facts(pid: u32) -> ProcessFacts {
        ProcessFacts {
            stat: stat(pid),
            status: Status {
                tgid: Some(pid),
                uid_real: Some(1000),
                uid_effective: Some(1000),
                uid_saved: Some(1000),
                nspid: vec![pid],
            },
            gpu_files: Some(vec!["/dev/nvidia0".into(), "/dev/nvidiactl".into()]),
        }
    }

    #[test]
    fn refusal_table_for_numbers() {
        let a = actor();
        let cases: [(u32, Option<Refusal>); 10] = [
            (0, Some(Refusal::PidZero)),
            (1, Some(Refusal::Init)),
            (
                u32::MAX,
                Some(Refusal::OutOfRange {
                    pid: u32::MAX,
                    pid_max: 4_194_304,
                }),
            ),
            (
                4_194_304,
                Some(Refusal::OutOfRange {
                    pid: 4_194_304,
                    pid_max: 4_194_304,
                }),
            ),
            (
                0x8000_0000,
                Some(Refusal::OutOfRange {
                    pid: 0x8000_0000,
                    pid_max: 4_194_304,
                }),
            ),
            (5000, Some(Refusal::Ourselves { pid: 5000 })),
            (
                4000,
                Some(Refusal::OurAncestor {
                    pid: 4000,
                    parent: true,
                }),
            ),
            (
                3000,
                Some(Refusal::OurAncestor {
                    pid: 3000,
                    parent: false,
                }),
            ),
            (4_194_303, None),
            (2, None),
        ];
        for (pid, want) in cases {
            assert_eq!(check_pid(pid, &a).err(), want, "pid {pid}");
        }
        let text = check_pid(u32::MAX, &a).unwrap_err().to_string();
        assert!(text.contains("-1"), "{text}");
        assert!(text.contains("every process"), "{text}");
    }

    #[test]
    fn refusal_table_for_processes() {
        let a = actor();
        let root = Actor {
            uid: 0,
            euid: 0,
            ..actor()
        };
        let container = Actor {
            namespace_initial: false,
            ..actor()
        };
        let none = Expectation::default();
        let gpu = Expectation {
            gpu_proof: true,
            ..Expectation::default()
        };
        let with = |f: &dyn Fn(&mut ProcessFacts)| {
            let mut facts = facts(42);
            f(&mut facts);
            facts
        };
        let cases: Vec<(&str, ProcessFacts, &Actor, Expectation, Option<Refusal>)> = vec![
            ("plain", facts(42), &a, none.clone(), None),
            (
                "thread",
                with(&|f| f.status.tgid = Some(41)),
                &a,
                none.clone(),
                Some(Refusal::Thread { pid: 42, tgid: 41 }),
            ),
            (
                "kernel thread",
                with(&|f| f.stat.flags |= crate::procinfo::PF_KTHREAD),
                &root,
                none.clone(),
                Some(Refusal::KernelThread {
                    pid: 42,
                    comm: "python".into(),
                }),
            ),
            (
                "reused",
                facts(42),
                &a,
                Expectation {
                    start_time_ticks: Some(776),
                    ..Expectation::default()
                },
                Some(Refusal::IdentityMismatch {
                    pid: 42,
                    detail: "started at tick 777, expected tick 776".into(),
                }),
            ),
            (
                "same start",
                facts(42),
                &a,
                Expectation {
                    start_time_ticks: Some(777),
                    uid: Some(1000),
                    gpu_proof: false,
                },
                None,
            ),
            (
                "owner changed",
                facts(42),
                &a,
                Expectation {
                    uid: Some(1001),
                    ..Expectation::default()
                },
                Some(Refusal::IdentityMismatch {
                    pid: 42,
                    detail: "owned by uid 1000, expected uid 1001".into(),
                }),
            ),
            (
                "zombie",
                with(&|f| f.stat.state = 'Z'),
                &root,
                none.clone(),
                Some(Refusal::Zombie {
                    pid: 42,
                    ppid: 4321,
                }),
            ),
            (
                "other user",
                with(&|f| f.status.uid_real = Some(65534)),
                &a,
                none.clone(),
                Some(Refusal::OtherUser {
                    pid: 42,
                    owner_uid: 65534,
                    our_uid: 1000,
                }),
            ),
            (
                "other user, we are root",
                with(&|f| f.status.uid_real = Some(65534)),
                &root,
                none.clone(),
                None,
            ),
            (
                "uid unknown",
                with(&|f| f.status.uid_real = None),
                &root,
                none.clone(),
                Some(Refusal::Unreadable {
                    pid: 42,
                    reason: "/proc/PID/status has no Uid line".into(),
                }),
            ),
            (
                "container, holds /dev/nvidia0",
                facts(42),
                &container,
                gpu.clone(),
                None,
            ),
            (
                "container, no GPU files",
                with(&|f| f.gpu_files = Some(vec![])),
                &container,
                gpu.clone(),
                Some(Refusal::NotProvenGpuUser {
                    pid: 42,
                    detail: "has no /dev/nvidia* file open".into(),
                }),
            ),
            (
                "container, fds unreadable",
                with(&|f| f.gpu_files = None),
                &container,
                gpu.clone(),
                Some(Refusal::NotProvenGpuUser {
                    pid: 42,
                    detail: "has file descriptors we cannot read".into(),
                }),
            ),
            (
                "container, a descendant needs no proof",
                with(&|f| f.gpu_files = Some(vec![])),
                &container,
                none.clone(),
                None,
            ),
            (
                "host namespace needs no proof",
                with(&|f| f.gpu_files = Some(vec![])),
                &a,
                gpu.clone(),
                None,
            ),
        ];
        for (name, facts, actor, expect, want) in cases {
            assert_eq!(
                check_process(42, &facts, actor, &expect).err(),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn reuse_beats_zombie_and_messages_are_one_line() {
        // A zombie with another start time is another process: say "reused", not "zombie".
        let mut f = facts(42);
        f.stat.state = 'Z';
        let expect = Expectation {
            start_time_ticks: Some(1),
            ..Expectation::default()
        };
        let err = check_process(42, &f, &actor(), &expect).unwrap_err();
        assert!(matches!(err, Refusal::IdentityMismatch { .. }), "{err:?}");
        for refusal in [
            Refusal::PidZero,
            Refusal::Init,
            Refusal::NotVisible { pid: 9 },
            Refusal::Zombie { pid: 9, ppid: 8 },
            Refusal::NoPidfd {
                pid: 9,
                reason: "ENOSYS".into(),
            },
        ] {
            let text = refusal.to_string();
            assert!(!text.contains('\n') && !text.ends_with('.'), "{text}");
            assert!(text.contains(&refusal.pid().to_string()), "{text}");
        }
    }
}
