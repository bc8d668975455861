//! `vramctl snapshot`: a live allocator snapshot of a process, taken by its agent
//! ([`crate::agent_client`], `snapshot` of `docs/agent.md`), and the start or stop of its
//! allocation-history recording. What is in the snapshot is another command's business;
//! this takes it and says where it is and how large.
//!
//! The agent writes the file itself, with the process's rights (`O_EXCL`, mode 0600), in the
//! process's view of the file system. So before asking, the path is checked from here with
//! the process's credentials (`/proc/PID/status`): a file already there, a missing
//! directory or one the process's user cannot write is an error at once, with the reason,
//! rather than after the agent has taken (and thrown away) a snapshot that can take
//! seconds. The agent's own refusal stays the authority (ACLs, a read-only mount).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::agent_client::{
    AgentClient, AgentError, HistoryRecord, HistoryState, SnapshotOptions, Timeouts,
    WrittenSnapshot,
};

/// The longest `snapshot` may take by default: round 2 measured 7.8 s to dump 400,000
/// history entries on the H200; the agent's bound of 1,000,000 entries is ~20 s
/// (`docs/agent.md`, "Limits and timeouts"), 6× inside this.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// What the user asked for.
#[derive(Debug, Clone)]
pub struct SnapshotRequest {
    /// The process.
    pub pid: u32,
    /// Where to write the snapshot; relative paths are the caller's (made absolute here).
    pub output: Option<PathBuf>,
    /// Start or stop recording allocation history (after the file is written).
    pub record: Option<HistoryRecord>,
    /// The whole exchange with the agent.
    pub timeout: Duration,
}

/// What was done.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotReport {
    /// The process.
    pub pid: u32,
    /// The file written, when one was asked for.
    pub written: Option<WrittenSnapshot>,
    /// Where this caller finds the file (differs from `written.path` when the process is in
    /// another mount namespace: `/proc/PID/root/...`).
    pub local_path: Option<PathBuf>,
    /// The allocation-history recording the agent runs now.
    pub history: HistoryState,
}

/// Why no snapshot was taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Nothing asked for.
    #[error("nothing to do: give -o FILE (write a snapshot) or --record start|stop")]
    NothingAsked,
    /// No such process.
    #[error("no process with PID '{pid}' is running here")]
    NoProcess {
        /// The PID.
        pid: u32,
    },
    /// A file is at the path: never replaced.
    #[error("'{}' exists; choose another file (a snapshot never replaces one)", path.display())]
    Exists {
        /// The path.
        path: PathBuf,
    },
    /// The directory is missing.
    #[error("'{}' is not a directory; create it or choose another file", path.display())]
    NoDirectory {
        /// The directory.
        path: PathBuf,
    },
    /// The process's user cannot create the file (the agent writes it as that user).
    #[error("process {pid} (uid {uid}) cannot create '{}': {reason}; its agent writes the snapshot as the process's user, so choose a directory that user can write (its home, /tmp)", path.display())]
    NotWritable {
        /// The process.
        pid: u32,
        /// Its effective uid.
        uid: u32,
        /// The file.
        path: PathBuf,
        /// Which directory refuses it, and why.
        reason: String,
    },
    /// The process has no allocator to snapshot (torch not imported, CUDA not started).
    #[error("process {pid} has nothing to snapshot: {message}")]
    NoAllocator {
        /// The process.
        pid: u32,
        /// The agent's message.
        message: String,
    },
    /// The agent could not be asked, or failed.
    #[error(transparent)]
    Agent(#[from] AgentError),
}

impl SnapshotError {
    /// Whether the process simply has no agent (or nothing to snapshot): what the user asked
    /// about does not hold, rather than a failure (exit 1 rather than 2).
    pub fn is_not_available(&self) -> bool {
        match self {
            Self::NoAllocator { .. } => true,
            Self::Agent(err) => err.is_no_agent(),
            _ => false,
        }
    }
}

/// A process's credentials, as the kernel checks a file creation against them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// Effective uid (the file-system uid, which equals it unless `setfsuid` was called).
    pub uid: u32,
    /// Effective gid and supplementary groups.
    pub gids: Vec<u32>,
}

impl Credentials {
    /// From `/proc/PID/status` (`Uid:`'s fs uid, `Gid:`'s fs gid, `Groups:`).
    pub fn of(pid: u32) -> Option<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        Self::parse(&status)
    }

    fn parse(status: &str) -> Option<Self> {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|rest| {
                    rest.split_whitespace()
                        .filter_map(|v| v.parse::<u32>().ok())
                        .collect::<Vec<_>>()
                })
        };
        // real, effective, saved, file-system: the fourth is the one file access uses.
        let uid = *field("Uid:")?.get(3)?;
        let mut gids = vec![*field("Gid:")?.get(3)?];
        gids.extend(field("Groups:").unwrap_or_default());
        Some(Self { uid, gids })
    }

    /// Whether these credentials may search (`x`) and, with `write`, also create in
    /// (`w`) the directory of `meta`, by its mode bits; `Err` says which bits refuse.
    fn may(&self, meta: &std::fs::Metadata, write: bool) -> Result<(), String> {
        if self.uid == 0 {
            return Ok(());
        }
        let mode = meta.permissions().mode();
        let (bits, whose) = if meta.uid() == self.uid {
            ((mode >> 6) & 7, "its owner")
        } else if self.gids.contains(&meta.gid()) {
            ((mode >> 3) & 7, "its group")
        } else {
            (mode & 7, "others")
        };
        let needed = if write { 0o3 } else { 0o1 };
        if bits & needed == needed {
            Ok(())
        } else {
            Err(format!(
                "mode {:04o}, owner uid {}, gives {whose} no {} permission",
                mode & 0o7777,
                meta.uid(),
                if write && bits & 0o2 == 0 {
                    "write"
                } else {
                    "search"
                }
            ))
        }
    }
}

/// Whether a process with `creds` could create `file`: it is not there, its directory is,
/// the process may write in it and search every directory above it. By mode bits (ACLs and
/// read-only mounts are left to the agent's own refusal).
///
/// # Errors
/// [`SnapshotError::Exists`], [`SnapshotError::NoDirectory`], [`SnapshotError::NotWritable`].
pub fn check_creatable(file: &Path, pid: u32, creds: &Credentials) -> Result<(), SnapshotError> {
    if std::fs::symlink_metadata(file).is_ok() {
        return Err(SnapshotError::Exists {
            path: file.to_path_buf(),
        });
    }
    let dir = file.parent().unwrap_or(Path::new("/"));
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        _ => {
            return Err(SnapshotError::NoDirectory {
                path: dir.to_path_buf(),
            });
        }
    }
    let refused = |at: &Path, reason: String| SnapshotError::NotWritable {
        pid,
        uid: creds.uid,
        path: file.to_path_buf(),
        reason: format!("'{}' is {reason}", at.display()),
    };
    for (i, ancestor) in dir.ancestors().enumerate() {
        let Ok(meta) = std::fs::metadata(ancestor) else {
            continue;
        };
        creds
            .may(&meta, i == 0)
            .map_err(|reason| refused(ancestor, reason))?;
    }
    Ok(())
}

/// Whether `pid` shares this process's mount namespace (so that a path means the same file
/// to both); `None` when it cannot be told.
fn same_mount_namespace(pid: u32) -> Option<bool> {
    let ours = std::fs::read_link("/proc/self/ns/mnt").ok()?;
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()?;
    Some(ours == theirs)
}

/// Takes the snapshot `request` asks for through the process's agent.
///
/// # Errors
/// See [`SnapshotError`]: nothing asked, no such process, the path refused before asking
/// (exists, no directory, not writable by the process's user), no agent, the agent's
/// refusal (its `EEXIST`/`EACCES` are mapped onto the same cases).
pub fn take(request: &SnapshotRequest) -> Result<SnapshotReport, SnapshotError> {
    let pid = request.pid;
    if request.output.is_none() && request.record.is_none() {
        return Err(SnapshotError::NothingAsked);
    }
    if !Path::new(&format!("/proc/{pid}")).exists() {
        return Err(SnapshotError::NoProcess { pid });
    }
    let creds = Credentials::of(pid).ok_or(SnapshotError::NoProcess { pid })?;
    let same_ns = same_mount_namespace(pid).unwrap_or(true);
    let path = match &request.output {
        Some(p) => {
            let absolute = std::path::absolute(p)
                .map_err(|_| SnapshotError::NoDirectory { path: p.clone() })?;
            // Only where the path names the same file to the process as to us.
            if same_ns {
                check_creatable(&absolute, pid, &creds)?;
            }
            Some(absolute)
        }
        None => None,
    };
    let mut client = AgentClient::connect(
        pid,
        Timeouts {
            quick: request.timeout,
            reclaim: request.timeout,
        },
    )?;
    let options = SnapshotOptions {
        path: path.clone(),
        record: request.record,
    };
    let answer = client
        .snapshot(&options, request.timeout)
        .map_err(|err| refusal(err, pid, &creds, path.as_deref()))?;
    let local_path = answer.written.as_ref().map(|w| {
        if same_ns {
            PathBuf::from(&w.path)
        } else {
            PathBuf::from(format!("/proc/{pid}/root{}", w.path))
        }
    });
    Ok(SnapshotReport {
        pid,
        written: answer.written,
        local_path,
        history: answer.history,
    })
}

/// The agent's refusals that have a case of their own.
fn refusal(err: AgentError, pid: u32, creds: &Credentials, path: Option<&Path>) -> SnapshotError {
    let AgentError::Refused { code, message, .. } = &err else {
        return err.into();
    };
    match (code.as_str(), path) {
        ("no_framework", _) => SnapshotError::NoAllocator {
            pid,
            message: message.clone(),
        },
        ("io_error", Some(path)) if message.contains("exists") => SnapshotError::Exists {
            path: path.to_path_buf(),
        },
        ("io_error", Some(path))
            if message.contains("ermission denied") || message.contains("ead-only") =>
        {
            SnapshotError::NotWritable {
                pid,
                uid: creds.uid,
                path: path.to_path_buf(),
                reason: format!("the agent says: {message}"),
            }
        }
        _ => err.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_the_file_system_ids_of_proc_status() {
        let status = "Name:\tpython3\nUid:\t1000\t1000\t1000\t1001\nGid:\t100\t100\t100\t101\nGroups:\t4 24 27 \n";
        assert_eq!(
            Credentials::parse(status),
            Some(Credentials {
                uid: 1001,
                gids: vec![101, 4, 24, 27]
            })
        );
        assert_eq!(Credentials::parse("Name:\tx\n"), None);
        let ours = Credentials::of(std::process::id()).unwrap();
        assert_eq!(ours.uid, rustix::process::geteuid().as_raw());
    }

    #[test]
    fn an_existing_file_is_refused_before_the_agent_is_asked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("snap.pickle");
        std::fs::write(&file, "keep me").unwrap();
        let creds = Credentials::of(std::process::id()).unwrap();
        assert!(matches!(
            check_creatable(&file, 1, &creds),
            Err(SnapshotError::Exists { .. })
        ));
        // A dangling symlink is a file there too: the agent's O_EXCL would refuse it.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &link).unwrap();
        assert!(matches!(
            check_creatable(&link, 1, &creds),
            Err(SnapshotError::Exists { .. })
        ));
        assert!(matches!(
            check_creatable(&dir.path().join("no/such/dir/f"), 1, &creds),
            Err(SnapshotError::NoDirectory { .. })
        ));
        check_creatable(&dir.path().join("new.pickle"), 1, &creds).unwrap();
    }

    #[test]
    fn a_directory_the_process_user_cannot_write_is_refused_with_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
        let owner = std::fs::metadata(&private).unwrap().uid();
        // Another user, in none of the directory's groups.
        let stranger = Credentials {
            uid: owner.wrapping_add(4242),
            gids: vec![4242],
        };
        match check_creatable(&private.join("snap.pickle"), 77, &stranger) {
            Err(err @ SnapshotError::NotWritable { .. }) => {
                let text = err.to_string();
                assert!(text.contains("process 77"), "{text}");
                assert!(text.contains("mode 0755"), "{text}");
                assert!(text.contains("no write permission"), "{text}");
            }
            other => panic!("{other:?}"),
        }
        // Above it, a directory it cannot even search.
        let inner = private.join("inner");
        std::fs::create_dir(&inner).unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        match check_creatable(&inner.join("snap.pickle"), 77, &stranger) {
            Err(SnapshotError::NotWritable { reason, .. }) => {
                assert!(reason.contains("no search permission"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        // Its owner, and root, may.
        let owner_creds = Credentials {
            uid: owner,
            gids: vec![],
        };
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
        if owner != 0 {
            check_creatable(&private.join("snap.pickle"), 77, &owner_creds).unwrap();
        }
        let root = Credentials {
            uid: 0,
            gids: vec![0],
        };
        check_creatable(&private.join("snap.pickle"), 77, &root).unwrap();
    }

    #[test]
    fn nothing_asked_is_an_error_without_touching_the_process() {
        let request = SnapshotRequest {
            pid: std::process::id(),
            output: None,
            record: None,
            timeout: DEFAULT_TIMEOUT,
        };
        assert!(matches!(take(&request), Err(SnapshotError::NothingAsked)));
    }
}
