//! The directory of one attach: the package, the bootstrap, the request, and `out/` where
//! the process writes its result.
//!
//! Made so that the target's user can never make vramctl write, follow or remove anything
//! but its own files: the directory is created fresh (a random name, `mkdir`, which never
//! follows a symbolic link and fails on anything already there) with mode 0700 and owned by
//! the caller; every file is created with `O_CREAT|O_EXCL|O_NOFOLLOW` relative to the
//! directory's descriptor; only when all are written does the target's group get read
//! access (`fchown`/`fchmod` of the descriptors: 0750 directories, 0640 files, never
//! writable by it). The one thing the target's user owns is `out/` (0700), created empty
//! by vramctl; the result is read from it without following a link, only as a regular file
//! of that user with one link, bounded. Removal goes through the descriptors too
//! (`unlinkat`, which never follows a link), a bounded number of entries in `out/`.
//!
//! Nothing is fsynced: the files live for seconds and are read by a running process
//! through the page cache; a crash loses nothing that matters.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};

/// The most entries of `out/` removed (the target's user may leave anything there).
const MAX_OUT_ENTRIES: usize = 64;
/// Names tried before giving up on a fresh directory (another user may squat names).
const NAME_TRIES: u32 = 16;

/// Who the files are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// The target's uid: `out/` becomes its, and the result must be its.
    pub uid: u32,
    /// The target's gid: the other files become readable by it.
    pub gid: u32,
}

/// One attach's directory, held by descriptors.
#[derive(Debug)]
pub struct Workspace {
    /// Its path (for the script's text; vramctl itself works through the descriptors).
    pub root: PathBuf,
    /// The private package's name (`_vramctl_attach_<nonce>`).
    pub package: String,
    base: OwnedFd,
    name: String,
    dir: OwnedFd,
    pkg: OwnedFd,
    out: OwnedFd,
    owner: Owner,
    /// The caller is root and the target another user: ownership is handed over.
    hand_over: bool,
    files: Vec<String>,
}

/// A random hex string, from the kernel's generator.
fn nonce() -> std::io::Result<String> {
    let mut bytes = [0u8; 12];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn uid(raw: u32) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(raw)
}

fn gid(raw: u32) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(raw)
}

/// A fresh directory `name` under `dir`, opened: created by us (so `EEXIST` for anything
/// planted), never through a link, checked to be ours and private.
fn make_dir(dir: impl AsFd, name: &str) -> std::io::Result<OwnedFd> {
    rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o700))?;
    let fd = rustix::fs::openat(
        &dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let stat = rustix::fs::fstat(&fd)?;
    if stat.st_uid != crate::local_socket::euid() || stat.st_mode & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "'{name}' is not the private directory just made"
        )));
    }
    Ok(fd)
}

impl Workspace {
    /// Makes the directory under `base` for process `pid` with the package's `modules`.
    ///
    /// # Errors
    /// Any failure to create or write (nothing is left behind then).
    pub fn create<'a>(
        base: &Path,
        pid: u32,
        owner: Owner,
        modules: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> std::io::Result<Self> {
        let me = crate::local_socket::euid();
        let base_fd = rustix::fs::open(
            base,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut made = None;
        for _ in 0..NAME_TRIES {
            let name = format!("vramctl-attach-{pid}-{}", nonce()?);
            match make_dir(&base_fd, &name) {
                Ok(fd) => {
                    made = Some((name, fd));
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let Some((name, dir)) = made else {
            return Err(std::io::Error::other(format!(
                "{NAME_TRIES} fresh names under '{}' were all taken",
                base.display()
            )));
        };
        let package = format!("_vramctl_attach_{}", nonce()?);
        // Until the descriptors below exist, removal is by name (nothing else is in it).
        let remove_empty = |e: std::io::Error| {
            let _ = rustix::fs::unlinkat(&base_fd, name.as_str(), AtFlags::REMOVEDIR);
            e
        };
        let pkg = make_dir(&dir, &package).map_err(remove_empty)?;
        let out = match make_dir(&dir, "out") {
            Ok(fd) => fd,
            Err(e) => {
                let _ = rustix::fs::unlinkat(&dir, package.as_str(), AtFlags::REMOVEDIR);
                return Err(remove_empty(e));
            }
        };
        let mut workspace = Self {
            root: base.join(&name),
            package,
            base: base_fd,
            name,
            dir,
            pkg,
            out,
            owner,
            hand_over: me == 0 && owner.uid != 0,
            files: Vec::new(),
        };
        let written = (|| {
            workspace.write_in_package("__init__.py", "")?;
            for (name, text) in modules {
                workspace.write_in_package(name, text)?;
            }
            Ok::<_, std::io::Error>(())
        })();
        if let Err(e) = written {
            workspace.remove();
            return Err(e);
        }
        Ok(workspace)
    }

    /// Creates `name` in `dir` (never through a link, never over anything), writes `text`,
    /// and makes it readable by the target's group.
    fn write_at(
        dir: &OwnedFd,
        name: &str,
        text: &str,
        owner: Owner,
        hand_over: bool,
    ) -> std::io::Result<()> {
        let fd = rustix::fs::openat(
            dir,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        if hand_over {
            rustix::fs::fchown(&fd, None, Some(gid(owner.gid)))?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o640))?;
        }
        std::fs::File::from(fd).write_all(text.as_bytes())
    }

    fn write_in_package(&mut self, name: &str, text: &str) -> std::io::Result<()> {
        Self::write_at(&self.pkg, name, text, self.owner, self.hand_over)?;
        self.files.push(name.to_owned());
        Ok(())
    }

    /// Writes the request and the bootstrap (`attach.py`, whose path it returns), then hands
    /// the directories over: read access for the target's group, `out/` to its user.
    ///
    /// # Errors
    /// Any failure to write or hand over.
    pub fn write_request(&self, request: &str, bootstrap: &str) -> std::io::Result<PathBuf> {
        Self::write_at(
            &self.dir,
            "request.json",
            request,
            self.owner,
            self.hand_over,
        )?;
        Self::write_at(
            &self.dir,
            "attach.py",
            bootstrap,
            self.owner,
            self.hand_over,
        )?;
        if self.hand_over {
            rustix::fs::fchown(
                &self.out,
                Some(uid(self.owner.uid)),
                Some(gid(self.owner.gid)),
            )?;
            for dir in [&self.pkg, &self.dir] {
                rustix::fs::fchown(dir, None, Some(gid(self.owner.gid)))?;
                rustix::fs::fchmod(dir, Mode::from_raw_mode(0o750))?;
            }
        }
        Ok(self.root.join("attach.py"))
    }

    /// Where the process writes its result.
    pub fn result(&self) -> PathBuf {
        self.root.join("out").join("result.json")
    }

    /// The result file, if it is there: opened in `out/` without following a link or
    /// blocking on a FIFO, and only a regular file of the target's user with one link (a
    /// hard link to a file it does not own is not read). `Ok(None)`: not there yet.
    ///
    /// # Errors
    /// What is there is not such a file (`InvalidData`), or reading failed.
    pub fn read_result(&self, max_bytes: u64) -> std::io::Result<Option<Vec<u8>>> {
        let fd = match rustix::fs::openat(
            &self.out,
            "result.json",
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(rustix::io::Errno::LOOP) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "it is a symbolic link",
                ));
            }
            Err(e) => return Err(e.into()),
        };
        let stat = rustix::fs::fstat(&fd)?;
        let regular =
            rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::RegularFile;
        if !regular || stat.st_uid != self.owner.uid || stat.st_nlink != 1 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "it is not a regular file of uid {} with one link (uid {}, {} links)",
                    self.owner.uid, stat.st_uid, stat.st_nlink
                ),
            ));
        }
        let mut text = Vec::new();
        std::fs::File::from(fd)
            .take(max_bytes)
            .read_to_end(&mut text)?;
        Ok(Some(text))
    }

    /// Removes everything, through the descriptors; what the target's user left in `out/`
    /// beyond [`MAX_OUT_ENTRIES`], or a non-empty directory there, stays (and is logged).
    pub fn remove(&self) {
        for name in &self.files {
            let _ = rustix::fs::unlinkat(&self.pkg, name.as_str(), AtFlags::empty());
        }
        let _ = rustix::fs::unlinkat(&self.dir, self.package.as_str(), AtFlags::REMOVEDIR);
        for name in ["request.json", "attach.py"] {
            let _ = rustix::fs::unlinkat(&self.dir, name, AtFlags::empty());
        }
        if let Ok(entries) = rustix::fs::Dir::read_from(&self.out) {
            let names: Vec<std::ffi::CString> = entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_owned())
                .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
                .take(MAX_OUT_ENTRIES)
                .collect();
            for name in names {
                if rustix::fs::unlinkat(&self.out, name.as_c_str(), AtFlags::empty()).is_err() {
                    let _ = rustix::fs::unlinkat(&self.out, name.as_c_str(), AtFlags::REMOVEDIR);
                }
            }
        }
        let _ = rustix::fs::unlinkat(&self.dir, "out", AtFlags::REMOVEDIR);
        if let Err(e) = rustix::fs::unlinkat(&self.base, self.name.as_str(), AtFlags::REMOVEDIR) {
            tracing::warn!(path = %self.root.display(), error = %e, "Could not remove an attach's directory.");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn modules() -> impl Iterator<Item = (&'static str, &'static str)> {
        [("a.py", "A = 1\n"), ("b.py", "from . import a\n")].into_iter()
    }

    #[test]
    fn the_workspace_is_made_written_and_removed_through_its_descriptors() {
        let base = tempfile::tempdir().expect("tempdir");
        let me = crate::local_socket::euid();
        let owner = Owner { uid: me, gid: 0 };
        let ws = Workspace::create(base.path(), 7, owner, modules()).expect("created");
        let script = ws.write_request("{}", "pass\n").expect("written");
        assert_eq!(script, ws.root.join("attach.py"));
        let meta = std::fs::metadata(&ws.root).expect("root");
        assert_eq!(meta.mode() & 0o777, 0o700, "the caller's own: private");
        assert_eq!(
            std::fs::read_to_string(ws.root.join(&ws.package).join("b.py")).expect("module"),
            "from . import a\n"
        );
        assert_eq!(ws.read_result(100).expect("absent"), None);
        std::fs::write(ws.result(), "{\"ok\": true}").expect("result");
        assert_eq!(
            ws.read_result(100).expect("read").as_deref(),
            Some(&b"{\"ok\": true}"[..])
        );
        assert_eq!(
            ws.read_result(4).expect("read").as_deref(),
            Some(&b"{\"ok"[..]),
            "bounded"
        );
        // A link in out/ is never followed.
        std::fs::remove_file(ws.result()).expect("rm");
        std::os::unix::fs::symlink("/etc/passwd", ws.result()).expect("symlink");
        assert_eq!(
            ws.read_result(100).expect_err("a link").kind(),
            std::io::ErrorKind::InvalidData
        );
        std::fs::remove_file(ws.result()).expect("rm");
        // Nor a second link to another file.
        std::fs::write(base.path().join("elsewhere"), "{}").expect("write");
        std::fs::hard_link(base.path().join("elsewhere"), ws.result()).expect("link");
        assert!(
            ws.read_result(100)
                .expect_err("two links")
                .to_string()
                .contains("2 links")
        );
        std::fs::write(ws.root.join("out").join("junk"), "").expect("junk");
        ws.remove();
        assert!(!ws.root.exists(), "all removed");
        assert_eq!(
            std::fs::read_to_string(base.path().join("elsewhere")).expect("kept"),
            "{}",
            "what a link in out/ pointed at is kept"
        );
    }

    #[test]
    fn a_root_callers_workspace_is_only_readable_by_the_targets_group() {
        if crate::local_socket::euid() != 0 {
            eprintln!("SKIPPED: needs root (hands files over to another uid)");
            return;
        }
        let base = tempfile::tempdir_in("/tmp").expect("tempdir");
        let owner = Owner {
            uid: 65534,
            gid: 65533,
        };
        let ws = Workspace::create(base.path(), 7, owner, modules()).expect("created");
        // Before the hand-over: root's alone.
        let meta = std::fs::metadata(&ws.root).expect("root");
        assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o700));
        ws.write_request("{}", "pass\n").expect("written");
        let mode = |p: &Path| {
            let m = std::fs::symlink_metadata(p).expect("exists");
            (m.uid(), m.gid(), m.mode() & 0o7777)
        };
        assert_eq!(mode(&ws.root), (0, 65533, 0o750));
        assert_eq!(mode(&ws.root.join(&ws.package)), (0, 65533, 0o750));
        assert_eq!(
            mode(&ws.root.join(&ws.package).join("a.py")),
            (0, 65533, 0o640)
        );
        assert_eq!(mode(&ws.root.join("request.json")), (0, 65533, 0o640));
        assert_eq!(mode(&ws.root.join("attach.py")), (0, 65533, 0o640));
        assert_eq!(mode(&ws.root.join("out")), (65534, 65533, 0o700));
        // A result root wrote is not the target's.
        std::fs::write(ws.result(), "{}").expect("result");
        assert!(
            ws.read_result(100)
                .expect_err("root's")
                .to_string()
                .contains("uid 65534")
        );
        ws.remove();
        assert!(!ws.root.exists(), "all removed");
    }
}
