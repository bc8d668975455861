//! The helper interpreter: which files may be run (only what root, or the caller itself,
//! controls), and how (with the target's credentials, a clean environment, bounded time
//! and output).

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Symbolic links followed while resolving one candidate (the kernel's own limit).
const MAX_LINKS: u32 = 40;
/// The most of each of the helper's stdout and stderr kept (the rest is read and dropped).
const MAX_CAPTURE_BYTES: usize = 64 << 10;
/// The helper's whole environment: nothing of the caller's (a root caller's variables are
/// not the target user's to read in `/proc/PID/environ`, and none changes what `-I -S`
/// does).
const HELPER_PATH: &str = "/usr/bin:/bin";

/// Whom the helper runs as: the target's uid and gid, with no supplementary groups.
///
/// Setting the target's exact supplementary groups needs code between `fork` and `exec`,
/// which the workspace's ban on `unsafe` rules out; with none, the helper has at most the
/// target's own rights, which is all `sys.remote_exec` needs (the kernel checks the uid and
/// gid of a process that writes another's memory, not its groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    /// The user.
    pub uid: u32,
    /// The group.
    pub gid: u32,
}

/// Whether a file or directory's owner may be trusted: root, or the caller itself (a caller
/// who is not root runs its own files anyway).
fn trusted_owner(uid: u32, caller_uid: u32) -> bool {
    uid == 0 || uid == caller_uid
}

/// `path` resolved component by component, every directory on the way (those its symbolic
/// links lead through included) and the file itself owned by root or `caller_uid` and not
/// writable by group or others, the file a regular executable one. `Err` says, in a few
/// words, why not.
///
/// Each symbolic link is read from a directory just checked, so nobody but root (or the
/// caller) can change where it leads between this check and the `exec`.
pub fn trusted_executable(path: &Path, caller_uid: u32) -> Result<PathBuf, String> {
    let shown = path.display();
    if !path.is_absolute() {
        return Err(format!("'{shown}' is not an absolute path"));
    }
    if path.to_string_lossy().contains(" (deleted)") {
        return Err(format!("'{shown}' names a deleted file"));
    }
    let check = |at: &Path, meta: &std::fs::Metadata| -> Result<(), String> {
        if !trusted_owner(meta.uid(), caller_uid) {
            return Err(format!("'{}' is owned by uid {}", at.display(), meta.uid()));
        }
        if meta.permissions().mode() & 0o022 != 0 {
            return Err(format!(
                "'{}' is writable by its group or others (mode {:o})",
                at.display(),
                meta.permissions().mode() & 0o7777
            ));
        }
        Ok(())
    };
    let root = Path::new("/");
    let meta = std::fs::symlink_metadata(root).map_err(|e| format!("'/': {e}"))?;
    check(root, &meta)?;
    let mut resolved = PathBuf::from("/");
    let mut pending: Vec<OsString> = components_reversed(path);
    let mut links = 0;
    while let Some(name) = pending.pop() {
        if name == ".." {
            resolved.pop();
            continue;
        }
        let next = resolved.join(&name);
        let meta =
            std::fs::symlink_metadata(&next).map_err(|e| format!("'{}': {e}", next.display()))?;
        let kind = meta.file_type();
        if kind.is_symlink() {
            links += 1;
            if links > MAX_LINKS {
                return Err(format!("'{shown}' has too many symbolic links"));
            }
            let target =
                std::fs::read_link(&next).map_err(|e| format!("'{}': {e}", next.display()))?;
            if target.is_absolute() {
                resolved = PathBuf::from("/");
            }
            pending.extend(components_reversed(&target));
            continue;
        }
        check(&next, &meta)?;
        if kind.is_dir() {
            resolved = next;
            continue;
        }
        if !pending.is_empty() {
            return Err(format!("'{}' is not a directory", next.display()));
        }
        if !kind.is_file() || meta.permissions().mode() & 0o111 == 0 {
            return Err(format!("'{}' is not an executable file", next.display()));
        }
        return Ok(next);
    }
    Err(format!("'{shown}' is a directory"))
}

/// The normal and `..` components of `path`, last first (a stack to pop from).
fn components_reversed(path: &Path) -> Vec<OsString> {
    let mut names: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    names.reverse();
    names
}

/// A command for `program` with nothing of the caller's: no environment but a fixed
/// `PATH`, `/` as its directory, and, with `run_as`, the target's uid and gid (std drops
/// the supplementary groups when it sets the uid).
pub fn command(program: &Path, run_as: Option<RunAs>) -> Command {
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("PATH", HELPER_PATH)
        .current_dir("/");
    if let Some(who) = run_as {
        command.gid(who.gid).uid(who.uid);
    }
    command
}

/// What a bounded run gave.
#[derive(Debug)]
pub struct Output {
    /// How it ended.
    pub status: ExitStatus,
    /// The first [`MAX_CAPTURE_BYTES`] of its stdout.
    pub stdout: Vec<u8>,
    /// The first [`MAX_CAPTURE_BYTES`] of its stderr.
    pub stderr: Vec<u8>,
}

/// One output pipe, read without blocking, kept up to [`MAX_CAPTURE_BYTES`].
struct Capture<R> {
    pipe: Option<R>,
    kept: Vec<u8>,
}

impl<R: Read + AsFd> Capture<R> {
    fn new(pipe: Option<R>) -> std::io::Result<Self> {
        if let Some(p) = &pipe {
            let flags = rustix::fs::fcntl_getfl(p)?;
            rustix::fs::fcntl_setfl(p, flags | rustix::fs::OFlags::NONBLOCK)?;
        }
        Ok(Self {
            pipe,
            kept: Vec::new(),
        })
    }

    /// Reads what is there now; closes the pipe at its end.
    fn drain(&mut self) -> std::io::Result<()> {
        let mut buf = [0u8; 8192];
        while let Some(pipe) = self.pipe.as_mut() {
            match pipe.read(&mut buf) {
                Ok(0) => self.pipe = None,
                Ok(n) => {
                    let room = MAX_CAPTURE_BYTES.saturating_sub(self.kept.len());
                    self.kept.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Runs `command` with its output captured (bounded), killed at `timeout`; a descendant
/// that keeps the pipes open past the helper's end is not waited for beyond the deadline.
pub fn run_bounded(command: &mut Command, timeout: Duration) -> std::io::Result<Output> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + timeout;
    let mut out = Capture::new(child.stdout.take())?;
    let mut err = Capture::new(child.stderr.take())?;
    let mut status = None;
    loop {
        out.drain()?;
        err.drain()?;
        if status.is_none() {
            status = child.try_wait()?;
        }
        if let Some(status) = status {
            if out.pipe.is_none() && err.pipe.is_none() {
                return Ok(Output {
                    status,
                    stdout: out.kept,
                    stderr: err.kept,
                });
            }
        }
        let now = Instant::now();
        if now >= deadline {
            if let Some(status) = status {
                // Ended; something it started holds the pipes: what came is enough.
                return Ok(Output {
                    status,
                    stdout: out.kept,
                    stderr: err.kept,
                });
            }
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("did not end within {:.0} s", timeout.as_secs_f64()),
            ));
        }
        // Wakes on output; at most every 20 ms to see whether it ended.
        let wait = (deadline - now).min(Duration::from_millis(20));
        let wait = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: i64::from(wait.subsec_nanos()),
        };
        let mut fds = Vec::new();
        if let Some(p) = &out.pipe {
            fds.push(rustix::event::PollFd::new(p, rustix::event::PollFlags::IN));
        }
        if let Some(p) = &err.pipe {
            fds.push(rustix::event::PollFd::new(p, rustix::event::PollFlags::IN));
        }
        match rustix::event::poll(&mut fds, Some(&wait)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_root_or_the_caller_controls_are_trusted() {
        let me = crate::local_socket::euid();
        // /bin/sh: root's, in root's directories (through /bin -> usr/bin where merged).
        let sh = trusted_executable(Path::new("/bin/sh"), me).expect("/bin/sh is trusted");
        assert!(sh.is_absolute() && sh.exists(), "{}", sh.display());
        // Anything under /tmp: writable by others.
        let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
        let exe = dir.path().join("python3.14");
        std::fs::write(&exe, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let why = trusted_executable(&exe, me).expect_err("under /tmp");
        assert!(
            why.contains("'/tmp' is writable by its group or others"),
            "{why}"
        );
        for (path, needle) in [
            ("relative/python3.14", "not an absolute path"),
            ("/usr/bin/python3.14 (deleted)", "deleted"),
            ("/usr/bin", "is a directory"),
            ("/etc/passwd", "not an executable file"),
            ("/etc/passwd/x", "not a directory"),
        ] {
            let why = trusted_executable(Path::new(path), me).expect_err(path);
            assert!(why.contains(needle), "{path}: {why}");
        }
    }

    #[test]
    fn a_symbolic_link_is_trusted_only_through_trusted_directories() {
        if crate::local_socket::euid() != 0 {
            eprintln!("SKIPPED: needs root (files of another owner)");
            return;
        }
        // Links in a root-owned directory of this checkout's target dir, to /bin/sh and to
        // a file of another user.
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
        let Ok(dir) = tempfile::tempdir_in(&base) else {
            eprintln!("SKIPPED: cannot write in {}", base.display());
            return;
        };
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        if trusted_executable(&dir.path().join("x"), 0)
            .is_err_and(|e| e.contains("writable") || e.contains("owned"))
        {
            eprintln!("SKIPPED: {} is not in root's directories", base.display());
            return;
        }
        let good = dir.path().join("good");
        std::os::unix::fs::symlink("/bin/sh", &good).expect("symlink");
        assert!(trusted_executable(&good, 0).is_ok());
        let theirs = dir.path().join("theirs");
        std::fs::write(&theirs, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
        let bad = dir.path().join("bad");
        std::os::unix::fs::symlink("theirs", &bad).expect("symlink");
        let why = trusted_executable(&bad, 0).expect_err("another user's file");
        assert!(why.contains("owned by uid 65534"), "{why}");
        let loop_ = dir.path().join("loop");
        std::os::unix::fs::symlink("loop", &loop_).expect("symlink");
        let why = trusted_executable(&loop_, 0).expect_err("a loop");
        assert!(why.contains("too many symbolic links"), "{why}");
    }

    #[test]
    fn a_bounded_run_keeps_a_bounded_output_and_ends_at_its_deadline() {
        let out = run_bounded(
            command(Path::new("/bin/sh"), None)
                .args(["-c", "head -c 1000000 /dev/zero; echo oops >&2; exit 3"]),
            Duration::from_secs(10),
        )
        .expect("runs");
        assert_eq!(out.stdout.len(), MAX_CAPTURE_BYTES);
        assert_eq!(out.stderr, b"oops\n");
        assert_eq!(out.status.code(), Some(3));
        let started = Instant::now();
        let err = run_bounded(
            command(Path::new("/bin/sh"), None).args(["-c", "sleep 30"]),
            Duration::from_millis(300),
        )
        .expect_err("too slow");
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(5));
        // Its environment is not the caller's.
        let out = run_bounded(
            command(Path::new("/bin/sh"), None).args(["-c", "env; pwd"]),
            Duration::from_secs(10),
        )
        .expect("runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("CARGO"), "{text}");
        assert!(text.lines().any(|l| l == "/"), "{text}");
    }
}
