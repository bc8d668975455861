//! The in-process agent's Python package (`python/vramctl_agent`, `docs/agent.md`),
//! embedded in every binary that links this crate, so that vramctl can put the agent into a
//! Python process it starts (`vramctl run --agent`) without anything installed: the files
//! are written to a directory that goes first on the process's `PYTHONPATH`.
//!
//! The package is pure Python and standard library only, so its sources are the whole of
//! it; `python/build_wheel.py` builds the same files into a wheel for `pip install`.

use std::io::Write;
use std::path::{Path, PathBuf};

/// One file of the package: its name inside `vramctl_agent/` and its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentFile {
    /// File name inside the package directory.
    pub name: &'static str,
    /// Its source.
    pub text: &'static str,
}

macro_rules! embed {
    ($name:literal) => {
        AgentFile {
            name: $name,
            text: include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                // A symlink to python/vramctl_agent, so that the published crate holds
                // the files (cargo package copies them in; a path outside the crate
                // would not be packaged). Not named `vramctl_agent`: Python run in
                // this directory (the tests) would import it instead of the copy.
                "/agent-sources/",
                $name
            )),
        }
    };
}

/// Every file of `python/vramctl_agent` (a test checks that none is missing).
pub const FILES: &[AgentFile] = &[
    embed!("__init__.py"),
    embed!("__main__.py"),
    embed!("_alloc_trace.py"),
    embed!("_attach.py"),
    embed!("_frameworks.py"),
    embed!("_hook.py"),
    embed!("_ipython.py"),
    embed!("_oom.py"),
    embed!("_ops.py"),
    embed!("_paths.py"),
    embed!("_protocol.py"),
    embed!("_run_report.py"),
    embed!("_run_site.py"),
    embed!("_server.py"),
    embed!("_state.py"),
    embed!("_torch.py"),
    embed!("client.py"),
];

/// The `sitecustomize.py` that `vramctl run` puts beside the package (`_run_site.py`): it
/// arms the agent in every interpreter of the job.
pub fn run_sitecustomize() -> &'static str {
    FILES
        .iter()
        .find(|f| f.name == "_run_site.py")
        .map_or("", |f| f.text)
}

/// The package's directory name, as Python imports it.
pub const PACKAGE: &str = "vramctl_agent";

/// The agent's version (`AGENT_VERSION` in `_ops.py`), the one its `hello` answers with.
pub fn version() -> Option<&'static str> {
    let ops = FILES.iter().find(|f| f.name == "_ops.py")?;
    ops.text
        .lines()
        .find_map(|line| line.strip_prefix("AGENT_VERSION = \"")?.strip_suffix('"'))
}

/// Writes the package under `dir` (`dir/vramctl_agent/*.py`, files 0644, replaced when
/// present) and returns `dir`, the entry to put first on `PYTHONPATH`. Each file is written
/// to a temporary name and renamed, so a Python process importing at the same moment sees
/// whole files.
///
/// # Errors
/// The directory cannot be made or a file cannot be written.
pub fn write_package(dir: &Path) -> std::io::Result<PathBuf> {
    let package = dir.join(PACKAGE);
    std::fs::create_dir_all(&package)?;
    for file in FILES {
        let target = package.join(file.name);
        let partial = package.join(format!(".{}.partial", file.name));
        {
            let mut out = std::fs::File::create(&partial)?;
            out.write_all(file.text.as_bytes())?;
            out.sync_all()?;
        }
        std::fs::rename(&partial, &target)?;
    }
    Ok(dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/vramctl_agent")
    }

    #[test]
    fn every_file_of_the_python_package_is_embedded() {
        let mut on_disk: Vec<String> = std::fs::read_dir(source_dir())
            .expect("python/vramctl_agent")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".py"))
            .collect();
        on_disk.sort();
        let embedded: Vec<&str> = FILES.iter().map(|f| f.name).collect();
        assert_eq!(embedded, on_disk, "add the new file to FILES");
    }

    #[test]
    fn the_version_is_the_agents() {
        let ops = std::fs::read_to_string(source_dir().join("_ops.py")).expect("_ops.py");
        let version = version().expect("AGENT_VERSION in _ops.py");
        assert!(ops.contains(&format!("AGENT_VERSION = \"{version}\"")));
        assert!(
            version.split('.').all(|p| p.parse::<u32>().is_ok()),
            "{version}"
        );
    }

    #[test]
    fn the_written_package_is_what_python_imports() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = write_package(dir.path()).expect("write the package");
        // Twice: the second replaces the files in place.
        write_package(dir.path()).expect("write it again");
        for file in FILES {
            let text = std::fs::read_to_string(root.join(PACKAGE).join(file.name)).expect("read");
            assert_eq!(text, file.text, "{}", file.name);
        }
        let out = std::process::Command::new("python3")
            .env("PYTHONPATH", &root)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            // PYTHONPATH comes before site-packages: the written copy wins over an installed one.
            .args([
                "-s",
                "-c",
                "import vramctl_agent, vramctl_agent._ops as o; print(vramctl_agent.__file__); print(o.AGENT_VERSION)",
            ])
            .output();
        let Ok(out) = out else {
            // No interpreter here: the import is checked where there is one (CI has it).
            eprintln!("python3 not found; the import was not checked");
            return;
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut lines = stdout.lines();
        let file = lines.next().expect("the module's file");
        assert!(
            Path::new(file).starts_with(&root),
            "imported {file}, not the written copy"
        );
        assert_eq!(lines.next(), version());
    }
}
