//! A process pinned by a pidfd, and waiting for processes to exit by polling their pidfds.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};

use crate::procinfo::{ProcError, read_stat};

/// How often a process without a pidfd is looked up in /proc while waiting.
const FALLBACK_POLL: Duration = Duration::from_millis(20);

/// Opens a pidfd; a seam so tests can make the kernel look old.
pub(crate) type Opener = dyn Fn(u32) -> Result<OwnedFd, Errno>;

/// `pidfd_open(pid, 0)` for a PID already checked to be a positive `pid_t`.
pub(crate) fn open_pidfd(pid: u32) -> Result<OwnedFd, Errno> {
    let raw = i32::try_from(pid).map_err(|_| Errno::INVAL)?;
    let pid = Pid::from_raw(raw).ok_or(Errno::INVAL)?;
    pidfd_open(pid, PidfdFlags::empty())
}

/// Why a process could not be pinned.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// It exited (ESRCH; or EINVAL for a valid PID whose task is gone, as systemd treats it).
    Gone,
    /// The kernel or a sandbox refuses pidfds (ENOSYS before Linux 5.3; EPERM from seccomp).
    Unsupported(Errno),
    /// Anything else (EMFILE, ...).
    Other(Errno),
}

/// A process to signal: pinned by a pidfd when the kernel has them, else a PID that is
/// re-verified before every signal.
#[derive(Debug)]
pub struct PidHandle {
    pid: u32,
    start_time_ticks: u64,
    fd: Option<OwnedFd>,
}

impl PidHandle {
    pub(crate) fn open(
        pid: u32,
        start_time_ticks: u64,
        opener: &Opener,
    ) -> Result<Self, OpenError> {
        match opener(pid) {
            Ok(fd) => Ok(Self {
                pid,
                start_time_ticks,
                fd: Some(fd),
            }),
            // The PID was validated as positive before: EINVAL means its task is gone.
            Err(Errno::SRCH | Errno::INVAL) => Err(OpenError::Gone),
            Err(e @ (Errno::NOSYS | Errno::PERM)) => Err(OpenError::Unsupported(e)),
            Err(e) => Err(OpenError::Other(e)),
        }
    }

    /// A handle without a pidfd: every signal through it must be preceded by a re-check.
    pub(crate) fn unpinned(pid: u32, start_time_ticks: u64) -> Self {
        Self {
            pid,
            start_time_ticks,
            fd: None,
        }
    }

    /// Pins `pid` with a pidfd, for waiting on it (signalling goes through
    /// [`execute`](super::execute), which checks first).
    ///
    /// # Errors
    /// What `pidfd_open` answered (ESRCH: no such process).
    pub fn pin(pid: u32) -> std::io::Result<Self> {
        let start_time_ticks = read_stat(pid)
            .map_err(|e| std::io::Error::other(e.to_string()))?
            .start_time_ticks;
        let fd = open_pidfd(pid).map_err(std::io::Error::from)?;
        Ok(Self {
            pid,
            start_time_ticks,
            fd: Some(fd),
        })
    }

    /// The PID it was opened for.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether a pidfd pins the process (else it is a PID, re-checked before each signal).
    pub fn is_pinned(&self) -> bool {
        self.fd.is_some()
    }

    /// The pinned process's pidfs id (Linux 6.9), unique for the boot ([`super::pidfd_id`]).
    pub fn pidfd_id(&self) -> Option<u64> {
        self.fd.as_ref().and_then(super::pidfd_id)
    }

    /// Sends `signal`: through the pidfd, or with kill(2) when there is none (the caller has
    /// just re-verified the process).
    pub(crate) fn send(&self, signal: Signal) -> Result<(), Errno> {
        match &self.fd {
            Some(fd) => pidfd_send_signal(fd, signal),
            None => {
                let raw = i32::try_from(self.pid).map_err(|_| Errno::INVAL)?;
                let pid = Pid::from_raw(raw).ok_or(Errno::INVAL)?;
                rustix::process::kill_process(pid, signal)
            }
        }
    }

    /// Whether the process has terminated (it may still be a zombie).
    pub fn has_exited(&self) -> bool {
        wait_all(&[self], Instant::now())[0].is_some()
    }

    /// Waits up to `timeout` for the process to terminate; whether it did.
    pub fn wait_exit(&self, timeout: Duration) -> bool {
        wait_all(&[self], Instant::now() + timeout)[0].is_some()
    }

    /// Without a pidfd: gone from /proc, a zombie, or the PID names another process now.
    fn exited_by_proc(&self) -> bool {
        match read_stat(self.pid) {
            Err(ProcError::NotFound { .. }) => true,
            Err(_) => false,
            Ok(stat) => stat.is_zombie() || stat.start_time_ticks != self.start_time_ticks,
        }
    }
}

/// Whether the process `fd` pins has terminated (a zombie counts), without waiting.
pub(crate) fn fd_exited(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
}

/// Waits until every handle's process has terminated or `deadline` passes; when each was
/// seen exited (`None`: still running).
///
/// Pinned processes are waited for by `poll(2)` on their pidfds (readable once the process
/// terminates); unpinned ones are looked up in /proc every 20 ms.
pub(crate) fn wait_all(handles: &[&PidHandle], deadline: Instant) -> Vec<Option<Instant>> {
    let mut exited: Vec<Option<Instant>> = handles.iter().map(|_| None).collect();
    loop {
        for (i, handle) in handles.iter().enumerate() {
            if exited[i].is_none() && handle.fd.is_none() && handle.exited_by_proc() {
                exited[i] = Some(Instant::now());
            }
        }
        let pending: Vec<usize> = (0..handles.len())
            .filter(|i| exited[*i].is_none() && handles[*i].fd.is_some())
            .collect();
        let now = Instant::now();
        let any_unpinned_pending =
            (0..handles.len()).any(|i| exited[i].is_none() && handles[i].fd.is_none());
        let mut timeout = deadline.saturating_duration_since(now);
        if any_unpinned_pending {
            timeout = timeout.min(FALLBACK_POLL);
        }
        if !pending.is_empty() {
            let mut fds: Vec<PollFd<'_>> = pending
                .iter()
                .filter_map(|i| handles[*i].fd.as_ref())
                .map(|fd| PollFd::new(fd, PollFlags::IN))
                .collect();
            let spec = Timespec::try_from(timeout).unwrap_or(Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            });
            match poll(&mut fds, Some(&spec)) {
                Ok(_) | Err(Errno::INTR) => {}
                // A pidfd that cannot be polled: stop waiting on it rather than spin.
                Err(_) => return exited,
            }
            let seen = Instant::now();
            for (slot, fd) in pending.iter().zip(&fds) {
                if !fd.revents().is_empty() {
                    exited[*slot] = Some(seen);
                }
            }
        } else if any_unpinned_pending && !timeout.is_zero() {
            // Nothing to poll on: the only way to notice a change in /proc is to look again.
            std::thread::sleep(timeout);
        }
        if exited.iter().all(Option::is_some) || Instant::now() >= deadline {
            return exited;
        }
    }
}
