//! Opening the kubelet's socket without trusting the path to it.
//!
//! vramctl runs as root; a path under `/var/lib/kubelet` is root's on a real node, but a
//! misconfigured node or a hostile user could put a symlink or their own socket there, and
//! vramctl would then take a user's answer for the kubelet's. So every directory on the way
//! is opened with `O_NOFOLLOW` (a symlink is refused), must be owned by root or the expected
//! owner and not writable by others (unless sticky), and the socket itself is opened as an
//! `O_PATH` descriptor and checked by `fstat` — a socket, owned by the expected user — and
//! then connected through `/proc/self/fd/N`, so what was checked is what is connected to
//! (no window between the check and the connect).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};

/// Why a socket path was refused.
#[derive(Debug, thiserror::Error)]
pub enum SocketRefused {
    #[error("{path}: not an absolute path")]
    NotAbsolute { path: PathBuf },
    #[error("{path}: cannot open ({source}); a symlink on the way is refused")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: a symlink, never followed here")]
    Symlink { path: PathBuf },
    #[error("{path}: not a socket")]
    NotASocket { path: PathBuf },
    #[error("{path}: owned by uid {owner_uid}, expected root or uid {expected_uid}")]
    WrongOwner {
        path: PathBuf,
        owner_uid: u32,
        expected_uid: u32,
    },
    #[error("{path}: directory writable by other users")]
    WritableDirectory { path: PathBuf },
}

/// A checked socket: an `O_PATH` descriptor of it and the `/proc/self/fd` path that reaches
/// exactly that inode while the descriptor is open.
#[derive(Debug)]
pub struct CheckedSocket {
    fd: OwnedFd,
}

impl CheckedSocket {
    /// The path to connect to; valid while `self` lives.
    pub fn connect_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

/// Opens `path` as described in the module docs. The socket must be root's or
/// `expected_owner_uid`'s (the caller's own effective uid: 0 for a root daemon).
pub fn open_checked(path: &Path, expected_owner_uid: u32) -> Result<CheckedSocket, SocketRefused> {
    if !path.is_absolute() {
        return Err(SocketRefused::NotAbsolute {
            path: path.to_path_buf(),
        });
    }
    let open_err = |at: &Path, e: rustix::io::Errno| SocketRefused::Open {
        path: at.to_path_buf(),
        source: e.into(),
    };
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut walked = PathBuf::from("/");
    let mut dir =
        rustix::fs::open("/", dir_flags, Mode::empty()).map_err(|e| open_err(&walked, e))?;
    let components: Vec<Component<'_>> = path.components().collect();
    let Some((last, parents)) = components.split_last() else {
        return Err(SocketRefused::NotASocket {
            path: path.to_path_buf(),
        });
    };
    check_directory(&dir, &walked, expected_owner_uid)?;
    for component in parents {
        let Component::Normal(name) = component else {
            // RootDir is the start; `.`/`..` would let the path leave what was checked.
            if matches!(component, Component::RootDir) {
                continue;
            }
            return Err(open_err(path, rustix::io::Errno::INVAL));
        };
        walked.push(name);
        dir = rustix::fs::openat(&dir, *name, dir_flags, Mode::empty())
            .map_err(|e| open_err(&walked, e))?;
        check_directory(&dir, &walked, expected_owner_uid)?;
    }
    let Component::Normal(name) = last else {
        return Err(SocketRefused::NotASocket {
            path: path.to_path_buf(),
        });
    };
    let fd = rustix::fs::openat(
        &dir,
        *name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| open_err(path, e))?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| open_err(path, e))?;
    // O_PATH|O_NOFOLLOW opens a symlink itself rather than failing: say so.
    let file_type = FileType::from_raw_mode(stat.st_mode);
    if file_type == FileType::Symlink {
        return Err(SocketRefused::Symlink {
            path: path.to_path_buf(),
        });
    }
    if file_type != FileType::Socket {
        return Err(SocketRefused::NotASocket {
            path: path.to_path_buf(),
        });
    }
    // Root's socket, or the expected user's own (a user running vramctl may be shown what
    // their own socket says: they can fool no one but themselves).
    if stat.st_uid != 0 && stat.st_uid != expected_owner_uid {
        return Err(SocketRefused::WrongOwner {
            path: path.to_path_buf(),
            owner_uid: stat.st_uid,
            expected_uid: expected_owner_uid,
        });
    }
    Ok(CheckedSocket { fd })
}

/// A directory on the way is trusted when root or the expected owner owns it and nobody
/// else can replace its entries (group/other write only with the sticky bit, as /tmp).
fn check_directory(
    dir: &OwnedFd,
    path: &Path,
    expected_owner_uid: u32,
) -> Result<(), SocketRefused> {
    let stat = rustix::fs::fstat(dir).map_err(|e| SocketRefused::Open {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    if stat.st_uid != 0 && stat.st_uid != expected_owner_uid {
        return Err(SocketRefused::WrongOwner {
            path: path.to_path_buf(),
            owner_uid: stat.st_uid,
            expected_uid: expected_owner_uid,
        });
    }
    let mode = Mode::from_raw_mode(stat.st_mode);
    let others_write = mode.intersects(Mode::WGRP | Mode::WOTH);
    if others_write && !mode.contains(Mode::SVTX) {
        return Err(SocketRefused::WritableDirectory {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}
