//! The agent put into a Python job without installing anything: a private directory first
//! on the job's `PYTHONPATH` holding the agent's package and a `sitecustomize.py` that arms
//! it (`VRAMCTL_AGENT=1`: it starts once the job imports torch, jax or tensorflow), and a
//! directory where each of the job's processes writes its framework's final counters at
//! exit (`VRAMCTL_RUN_REPORT_DIR`, `python/vramctl_agent/_run_report.py`).

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use vramctl_agent::agent_client::Stats;
use vramctl_agent::agent_package;

/// The directories of one supervised job; removed when dropped.
#[derive(Debug)]
pub struct AgentInjection {
    dir: tempfile::TempDir,
    site: PathBuf,
    reports: PathBuf,
}

impl AgentInjection {
    /// Writes the package and the `sitecustomize.py` into a fresh private directory
    /// (0700) under the system's temporary directory.
    ///
    /// # Errors
    /// The directory or a file cannot be written.
    pub fn prepare() -> std::io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("vramctl-run-").tempdir()?;
        let site = dir.path().join("python");
        let reports = dir.path().join("reports");
        std::fs::create_dir(&site)?;
        std::fs::create_dir(&reports)?;
        agent_package::write_package(&site)?;
        std::fs::write(
            site.join("sitecustomize.py"),
            agent_package::run_sitecustomize(),
        )?;
        Ok(Self { dir, site, reports })
    }

    /// The environment the job gets on top of its own: our directory first on
    /// `PYTHONPATH` (before what it had), the agent armed, the report directory.
    pub fn environment(&self, pythonpath: Option<&OsStr>) -> Vec<(OsString, OsString)> {
        let mut path = self.site.clone().into_os_string();
        if let Some(existing) = pythonpath.filter(|p| !p.is_empty()) {
            path.push(":");
            path.push(existing);
        }
        vec![
            ("PYTHONPATH".into(), path),
            ("VRAMCTL_AGENT".into(), "1".into()),
            (
                "VRAMCTL_RUN_REPORT_DIR".into(),
                self.reports.clone().into_os_string(),
            ),
        ]
    }

    /// Each process's exit report: its PID and counters. A report that cannot be read is
    /// skipped (logged): the polled figures stand in for it.
    pub fn reports(&self) -> Vec<(u32, Stats)> {
        let Ok(entries) = std::fs::read_dir(&self.reports) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let Some(pid) = report_pid(&path) else {
                continue;
            };
            match read_report(&path) {
                Ok(stats) => out.push((pid, stats)),
                Err(err) => {
                    tracing::debug!(path = %path.display(), %err, "Skipped a run report.");
                }
            }
        }
        out.sort_by_key(|(pid, _)| *pid);
        out
    }

    /// The directory of the exit reports and the OOM observer's files.
    pub fn reports_dir(&self) -> &Path {
        &self.reports
    }

    /// Where the directories are (for the logs).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

fn report_pid(path: &Path) -> Option<u32> {
    path.file_name()?
        .to_str()?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// Reports are small; a larger file is not one of ours.
const MAX_REPORT_BYTES: u64 = 1 << 20;

fn read_report(path: &Path) -> Result<Stats, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut text = String::new();
    file.take(MAX_REPORT_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// Whether `program` (the command's first word) runs a Python interpreter: its name is
/// `python`, `python3`, `python3.12`, `pypy3`…, or it is a script on `PATH` whose `#!` line
/// names one (`torchrun`, `accelerate`, `pytest`, `deepspeed`).
pub fn is_python_command(program: &OsStr) -> bool {
    let path = Path::new(program);
    if path
        .file_name()
        .and_then(OsStr::to_str)
        .is_some_and(is_python_name)
    {
        return true;
    }
    resolve(path).is_some_and(|p| shebang_is_python(&p))
}

fn is_python_name(name: &str) -> bool {
    let rest = name
        .strip_prefix("python")
        .or_else(|| name.strip_prefix("pypy"));
    rest.is_some_and(|r| r.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

fn resolve(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return Some(program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

fn shebang_is_python(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let mut first = Vec::new();
    if BufReader::new(file.take(256))
        .read_until(b'\n', &mut first)
        .is_err()
    {
        return false;
    }
    let line = String::from_utf8_lossy(&first);
    let Some(rest) = line.strip_prefix("#!") else {
        return false;
    };
    // `#!/usr/bin/env python3`, `#!/opt/conda/bin/python3.11 -u`.
    rest.split_whitespace()
        .filter_map(|word| Path::new(word).file_name().and_then(OsStr::to_str))
        .any(is_python_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_interpreters_and_python_scripts_are_python_commands() {
        for name in [
            "python",
            "python3",
            "python3.12",
            "/usr/bin/python3",
            "pypy3",
        ] {
            assert!(is_python_command(OsStr::new(name)), "{name}");
        }
        for name in [
            "bash",
            "pythonic",
            "python-config",
            "./train.sh",
            "nvidia-smi",
        ] {
            assert!(!is_python_command(OsStr::new(name)), "{name}");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("torchrun");
        std::fs::write(&script, "#!/usr/bin/env python3\nprint(1)\n").expect("write");
        assert!(is_python_command(script.as_os_str()));
        let shell = dir.path().join("launch");
        std::fs::write(&shell, "#!/bin/sh\nexec python3 \"$@\"\n").expect("write");
        assert!(!is_python_command(shell.as_os_str()));
    }

    #[test]
    fn the_injection_puts_its_directory_first_and_keeps_the_job_s_own_path() {
        let injection = AgentInjection::prepare().expect("prepare");
        let env = injection.environment(Some(OsStr::new("/opt/lib")));
        let path = &env.iter().find(|(k, _)| k == "PYTHONPATH").expect("set").1;
        let path = path.to_string_lossy();
        assert!(path.ends_with(":/opt/lib"), "{path}");
        let site = Path::new(path.split(':').next().expect("first"));
        assert!(site.join("sitecustomize.py").is_file());
        assert!(site.join("vramctl_agent/_run_report.py").is_file());
        let kept = injection.path().to_path_buf();
        drop(injection);
        assert!(!kept.exists(), "removed when dropped");
    }

    #[test]
    fn a_report_is_read_and_a_torn_one_skipped() {
        let injection = AgentInjection::prepare().expect("prepare");
        let reports = injection.path().join("reports");
        std::fs::write(
            reports.join("4242.json"),
            r#"{"pid": 4242, "taken_at": 1.5, "frameworks": [], "devices": [{"framework": "torch", "index": 0, "uuid": "abc", "allocated_bytes": 1, "reserved_bytes": 2, "cached_bytes": 1, "releasable_bytes": 0, "inactive_split_bytes": 0, "allocated_peak_bytes": 10, "reserved_peak_bytes": 20, "alloc_retries": 0, "ooms": 1}]}"#,
        )
        .expect("write");
        std::fs::write(reports.join("77.json"), "{\"pid\": 77, ").expect("write");
        std::fs::write(reports.join(".9.json.partial"), "{}").expect("write");
        let read = injection.reports();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].0, 4242);
        assert_eq!(read[0].1.devices[0].reserved_peak_bytes, Some(20));
    }
}
