//! `FAKE_NVML_PROCESS_DIR`: real processes whose PIDs nobody knows when the scenario is
//! written (the commands `vramctl run` and `fit` start), announced at run time by a file
//! per PID.
//!
//! A file `DIR/<pid>` holds lines `GPU_INDEX BYTES`; the PID is then a `real` process on
//! each GPU it names, holding that memory. The directory is read afresh at every call that
//! answers process lists or memory, so a job that rewrites its file is seen at the next
//! sample; nothing about its contents is kept between calls. A PID whose /proc entry is
//! gone (or a zombie) is dropped, exactly as a scenario's `real = true` process is.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// Names the directory of process files.
pub const ENV_PROCESS_DIR: &str = "FAKE_NVML_PROCESS_DIR";

/// One process file: a PID and the bytes it holds on each GPU it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirProcess {
    pub pid: u32,
    /// `(GPU index, bytes)`, one per GPU (lines naming the same GPU add up), by GPU index.
    pub gpus: Vec<(usize, u64)>,
}

impl DirProcess {
    /// The bytes this process holds on GPU `gpu`, if its file names that GPU.
    pub fn on_gpu(&self, gpu: usize) -> Option<u64> {
        self.gpus.iter().find(|(g, _)| *g == gpu).map(|(_, b)| *b)
    }
}

/// The directory, and which of its files belonged to processes already seen exited.
#[derive(Debug)]
pub struct ProcessDir {
    path: PathBuf,
    /// `(pid, device, inode)` of files whose process was seen gone from /proc. Without it a
    /// file left behind by a job killed with SIGKILL (no exit trap ran) would make an
    /// unrelated process that is later given the same PID show up holding the job's memory,
    /// which the driver never does. A rewritten file (write-then-rename: a new inode) is a
    /// new announcement and counts again. Pruned to the files that still exist.
    exited: HashSet<(u32, u64, u64)>,
}

impl ProcessDir {
    pub fn new(path: PathBuf) -> ProcessDir {
        ProcessDir {
            path,
            exited: HashSet::new(),
        }
    }

    /// From `FAKE_NVML_PROCESS_DIR`, read at the init that loads the scenario; unset or
    /// empty: no directory.
    pub fn from_env() -> Option<ProcessDir> {
        std::env::var_os(ENV_PROCESS_DIR)
            .filter(|p| !p.is_empty())
            .map(|p| ProcessDir::new(PathBuf::from(p)))
    }

    /// The live processes the directory announces now, by PID. A directory that is missing
    /// or unreadable announces none (a test may create it after init); a file that cannot be
    /// read or parsed is skipped as if absent. Nothing is printed: the fake's only output is
    /// one line on stderr for a bad scenario.
    pub fn live(&mut self) -> Vec<DirProcess> {
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            self.exited.clear();
            return Vec::new();
        };
        let mut seen = HashSet::new();
        let mut live = Vec::new();
        for entry in entries.flatten() {
            let Some(pid) = pid_of(&entry.file_name()) else {
                continue;
            };
            // Follows a symlink: a regular file is what counts, however it is reached.
            let Ok(meta) = std::fs::metadata(entry.path()) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            let key = (pid, meta.dev(), meta.ino());
            seen.insert(key);
            if self.exited.contains(&key) {
                continue;
            }
            if real_process_gone(pid) {
                self.exited.insert(key);
                continue;
            }
            let Ok(text) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            if let Some(gpus) = parse(&text) {
                live.push(DirProcess { pid, gpus });
            }
        }
        self.exited.retain(|key| seen.contains(key));
        live.sort_by_key(|p| p.pid);
        live
    }
}

/// A file name that is a decimal PID: ASCII digits only (no sign, no spaces, no `.tmp`
/// suffix: a writer's temporary file is never read), within `u32`.
fn pid_of(name: &OsStr) -> Option<u32> {
    let name = name.to_str()?;
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

/// A file's lines `GPU_INDEX BYTES`: blank lines and `#` comments (whole-line or after the
/// numbers) ignored; lines naming the same GPU add up. Any other line makes the whole file
/// malformed (`None`): half a file is not a number to trust.
fn parse(text: &str) -> Option<Vec<(usize, u64)>> {
    let mut gpus: Vec<(usize, u64)> = Vec::new();
    for line in text.lines() {
        let line = line.split_once('#').map_or(line, |(before, _)| before);
        let mut words = line.split_whitespace();
        let (gpu, bytes) = match (words.next(), words.next(), words.next()) {
            (None, _, _) => continue,
            (Some(gpu), Some(bytes), None) => (gpu, bytes),
            _ => return None,
        };
        let gpu: usize = gpu.parse().ok()?;
        let bytes: u64 = bytes.parse().ok()?;
        match gpus.iter_mut().find(|(g, _)| *g == gpu) {
            Some((_, total)) => *total = total.saturating_add(bytes),
            None => gpus.push((gpu, bytes)),
        }
    }
    gpus.sort_by_key(|(g, _)| *g);
    Some(gpus)
}

/// A process's state on a real host (here, not in `state`, which names this file's
/// processes, so that the two files do not name each other). Only `real = true` processes and those of
/// `FAKE_NVML_PROCESS_DIR` are looked up.
pub(crate) fn real_process_gone(pid: u32) -> bool {
    match std::fs::read(format!("/proc/{pid}/stat")) {
        // Not there (or dying: reading a vanishing task's stat fails with ESRCH).
        Err(e) => e.kind() != std::io::ErrorKind::PermissionDenied,
        Ok(stat) => {
            // "pid (comm) S ...": the state follows the last ')', comm may contain ')'.
            let state = stat
                .iter()
                .rposition(|b| *b == b')')
                .and_then(|i| stat.get(i + 2));
            // Zombies and dead tasks hold no GPU memory: the driver frees it at exit.
            matches!(state, Some(b'Z' | b'X' | b'x'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_with_comments_and_blanks() {
        let text = "# written by gpu-job.sh\n\n0 1073741824\n  1\t5 # trailing note\n0 1\n";
        assert_eq!(parse(text), Some(vec![(0, 1_073_741_825), (1, 5)]));
        assert_eq!(parse(""), Some(vec![]));
    }

    #[test]
    fn a_malformed_line_spoils_the_file() {
        for bad in [
            "0\n",
            "0 1 2\n",
            "0 1.5\n",
            "0 -1\n",
            "-1 10\n",
            "zero 10\n",
            "0 1 GiB\n",
            "0 18446744073709551616\n",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(parse("0 10\n0 x\n"), None, "one bad line of two");
    }

    #[test]
    fn only_decimal_names_are_pids() {
        assert_eq!(pid_of(OsStr::new("1234")), Some(1234));
        for name in [
            "1234.tmp",
            "+12",
            "-1",
            "",
            "12 ",
            "x1",
            "99999999999",
            ".1",
        ] {
            assert_eq!(pid_of(OsStr::new(name)), None, "{name:?}");
        }
    }

    #[test]
    fn the_directory_lists_live_pids_and_drops_exited_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let own = std::process::id();
        std::fs::write(dir.path().join(own.to_string()), "0 100\n2 7\n").expect("write");
        // PID 0 never has a /proc entry: an exited process.
        std::fs::write(dir.path().join("0"), "0 50\n").expect("write");
        std::fs::write(dir.path().join(format!("{own}.tmp")), "0 999\n").expect("write");
        std::fs::write(dir.path().join("notes"), "0 999\n").expect("write");
        let mut pd = ProcessDir::new(dir.path().to_path_buf());
        let live = pd.live();
        assert_eq!(
            live,
            [DirProcess {
                pid: own,
                gpus: vec![(0, 100), (2, 7)]
            }]
        );
        assert_eq!(live[0].on_gpu(2), Some(7));
        assert_eq!(live[0].on_gpu(1), None);
        assert_eq!(
            pd.exited.len(),
            1,
            "the file of PID 0 is remembered as exited"
        );
        // Read afresh: a changed file is seen at the next call.
        std::fs::write(dir.path().join(own.to_string()), "0 300\n").expect("rewrite");
        assert_eq!(pd.live()[0].gpus, [(0, 300)]);
        std::fs::remove_file(dir.path().join("0")).expect("remove");
        assert!(pd.live().len() == 1 && pd.exited.is_empty(), "pruned");
        std::fs::remove_file(dir.path().join(own.to_string())).expect("remove");
        assert!(pd.live().is_empty());
    }

    #[test]
    fn a_missing_directory_announces_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut pd = ProcessDir::new(dir.path().join("not-yet"));
        assert!(pd.live().is_empty());
    }
}
