//! The CUDA versions the frameworks in Python environments were built for, read from their
//! installed files: never imported, never started (`docs/doctor.md`, "Frameworks").
//!
//! What is read, per `site-packages` directory:
//! - every `*.dist-info/METADATA` (`Name:`, `Version:`) of the packages that carry CUDA:
//!   `torch`, `jax`, `jaxlib`, `jax-cudaNN-plugin`/`-pjrt`, `tensorflow`, `cupy-cudaNNx`,
//!   and NVIDIA's `nvidia-*-cuNN` runtime wheels (CUDA 13's drop the suffix);
//! - `torch/version.py` (`cuda = '12.8'`, `None` for a CPU build);
//! - `tensorflow/python/platform/build_info.py` (`'cuda_version': '12.5.1'`).
//!
//! Environments are found from `--python PATH` (repeatable), `VIRTUAL_ENV`, `CONDA_PREFIX`
//! and the `python3` on `PATH`; an interpreter is only asked where its site-packages are,
//! with a timeout ([`SITE_QUERY`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The one thing an interpreter is asked: where its site-packages are. `-s`/`-E` are not
/// passed: the user's environment variables and user site are what their programs see.
pub const SITE_QUERY: &str =
    "import site,sys; print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]))";

/// How long an interpreter may take to answer [`SITE_QUERY`] (a cold conda Python on a
/// network home directory takes about a second; one that hangs must not hang doctor).
pub const SITE_QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// One framework or runtime wheel found, with the CUDA it was built for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Wheel {
    /// The distribution's name as METADATA writes it (`torch`, `nvidia-cuda-runtime-cu12`).
    pub name: String,
    /// Its version (`2.8.0+cu128`).
    pub version: String,
    /// The CUDA version it was built for, `major` or `major.minor` (`None`: a CPU build, or
    /// not known from its files).
    pub cuda: Option<String>,
    /// Where that CUDA version was read.
    pub cuda_from: Option<String>,
    /// Whether this is a framework (`torch`, `jax…`, `tensorflow`, `cupy`) rather than a
    /// CUDA runtime library wheel.
    pub framework: bool,
}

/// One `site-packages` directory and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SitePackages {
    /// The directory.
    pub path: PathBuf,
    /// How it was found (`--python /usr/bin/python3`, `VIRTUAL_ENV`, `python3 on PATH`).
    pub found_by: String,
    /// The wheels that carry CUDA, sorted by name.
    pub wheels: Vec<Wheel>,
}

/// What the environments gave, and the interpreters that could not be asked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PythonFacts {
    /// The directories scanned, in the order found, each once.
    pub site_packages: Vec<SitePackages>,
    /// `(interpreter, why)` for one that did not answer.
    pub failed: Vec<(String, String)>,
}

/// Where to look.
#[derive(Debug, Clone, Default)]
pub struct PythonSources {
    /// `--python PATH`: interpreters, or environment or site-packages directories.
    pub named: Vec<PathBuf>,
    /// `VIRTUAL_ENV`.
    pub virtual_env: Option<PathBuf>,
    /// `CONDA_PREFIX`.
    pub conda_prefix: Option<PathBuf>,
    /// Ask the `python3` on `PATH` too.
    pub path_python: bool,
}

/// Finds the environments and reads their wheels.
pub fn collect(sources: &PythonSources) -> PythonFacts {
    let mut facts = PythonFacts::default();
    let mut seen = BTreeSet::new();
    let mut add = |facts: &mut PythonFacts, dir: PathBuf, found_by: String| {
        let key = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
        if !dir.is_dir() || !seen.insert(key) {
            return;
        }
        let wheels = scan(&dir);
        facts.site_packages.push(SitePackages {
            path: dir,
            found_by,
            wheels,
        });
    };
    for named in &sources.named {
        let label = format!("--python {}", named.display());
        if named.is_dir() {
            let dirs = prefix_site_packages(named);
            if dirs.is_empty() {
                // A site-packages directory itself.
                add(&mut facts, named.clone(), label);
            } else {
                for dir in dirs {
                    add(&mut facts, dir, label.clone());
                }
            }
            continue;
        }
        match ask_interpreter(named) {
            Ok(dirs) => dirs
                .into_iter()
                .for_each(|d| add(&mut facts, d, label.clone())),
            Err(why) => facts.failed.push((named.display().to_string(), why)),
        }
    }
    for (var, prefix) in [
        ("VIRTUAL_ENV", &sources.virtual_env),
        ("CONDA_PREFIX", &sources.conda_prefix),
    ] {
        if let Some(prefix) = prefix {
            for dir in prefix_site_packages(prefix) {
                add(&mut facts, dir, var.to_owned());
            }
        }
    }
    if sources.path_python {
        match ask_interpreter(Path::new("python3")) {
            Ok(dirs) => dirs
                .into_iter()
                .for_each(|d| add(&mut facts, d, "python3 on PATH".to_owned())),
            // No python3 at all is not a finding: many GPU hosts run no Python.
            Err(why) if why.starts_with("cannot run") => {}
            Err(why) => facts.failed.push(("python3".to_owned(), why)),
        }
    }
    facts
}

/// `PREFIX/lib/python3*/site-packages` (and `lib64`), without running anything.
pub fn prefix_site_packages(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path().join("site-packages"))
            .filter(|p| p.is_dir())
            .collect();
        dirs.sort();
        out.extend(dirs);
    }
    out
}

/// Runs `python -c SITE_QUERY` with a timeout; only path discovery, nothing imported.
fn ask_interpreter(python: &Path) -> Result<Vec<PathBuf>, String> {
    let mut child = std::process::Command::new(python)
        .args(["-c", SITE_QUERY])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run '{}': {e}", python.display()))?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(status)) => return Err(format!("'{}' exited with {status}", python.display())),
            Ok(None) if started.elapsed() > SITE_QUERY_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "'{}' did not answer within {} s",
                    python.display(),
                    SITE_QUERY_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("cannot wait for '{}': {e}", python.display())),
        }
    }
    let mut text = String::new();
    if let Some(mut out) = child.stdout.take() {
        use std::io::Read;
        out.read_to_string(&mut text)
            .map_err(|e| format!("cannot read what '{}' answered: {e}", python.display()))?;
    }
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(PathBuf::from)
        .collect())
}

/// The CUDA-carrying wheels in one `site-packages` directory, sorted by name.
pub fn scan(dir: &Path) -> Vec<Wheel> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut wheels: Vec<Wheel> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".dist-info"))
        .filter_map(|e| {
            let metadata = std::fs::read_to_string(e.path().join("METADATA")).ok()?;
            let (name, version) = name_and_version(&metadata)?;
            wheel(dir, &name, &version)
        })
        .collect();
    wheels.sort_by(|a, b| a.name.cmp(&b.name));
    wheels.dedup_by(|a, b| a.name == b.name);
    wheels
}

/// `Name:` and `Version:` of a METADATA file (the headers end at the first empty line).
pub fn name_and_version(metadata: &str) -> Option<(String, String)> {
    let (mut name, mut version) = (None, None);
    for line in metadata.lines() {
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix("Name:") {
            name = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("Version:") {
            version = Some(v.trim().to_owned());
        }
    }
    Some((name?, version?))
}

/// The wheel record for a distribution that carries CUDA; `None` for any other.
fn wheel(dir: &Path, name: &str, version: &str) -> Option<Wheel> {
    // PEP 503 normalisation: `jax_cuda12_plugin` and `jax-cuda12-plugin` are one name.
    let norm = name.to_ascii_lowercase().replace(['_', '.'], "-");
    let make = |cuda: Option<String>, from: Option<String>, framework: bool| Wheel {
        name: name.to_owned(),
        version: version.to_owned(),
        cuda,
        cuda_from: from,
        framework,
    };
    if norm == "torch" {
        let file = dir.join("torch/version.py");
        let cuda = std::fs::read_to_string(&file)
            .ok()
            .and_then(|text| torch_cuda(&text));
        return Some(match cuda {
            Some(cuda) => make(Some(cuda), Some("torch/version.py".into()), true),
            None => make(None, None, true),
        });
    }
    if norm == "tensorflow" || norm.starts_with("tensorflow-") && !norm.contains("estimator") {
        let file = dir.join("tensorflow/python/platform/build_info.py");
        let cuda = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| tensorflow_cuda(&t));
        let from = cuda
            .as_ref()
            .map(|_| "tensorflow/python/platform/build_info.py".to_owned());
        return Some(make(cuda, from, true));
    }
    if norm == "jax" || norm == "jaxlib" {
        // jax and jaxlib carry no CUDA of their own: the plugin below does.
        return Some(make(None, None, true));
    }
    if let Some(rest) = norm.strip_prefix("jax-cuda") {
        let major: String = rest.chars().take_while(char::is_ascii_digit).collect();
        return (!major.is_empty())
            .then(|| make(Some(major), Some("the package name".into()), true));
    }
    if let Some(rest) = norm.strip_prefix("cupy-cuda") {
        // `cupy-cuda12x`, `cupy-cuda11x`; older `cupy-cuda102` named the minor too.
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let cuda = match digits.len() {
            2 => Some(digits),
            3 => Some(format!("{}.{}", &digits[..2], &digits[2..])),
            _ => None,
        };
        return Some(make(cuda, Some("the package name".into()), true));
    }
    if norm.starts_with("nvidia-cuda-runtime") {
        // The CUDA runtime wheel's own version is the CUDA version: `12.8.90` is 12.8.
        let cuda = major_minor(version);
        return Some(make(cuda, Some("the wheel's version".into()), false));
    }
    None
}

/// `cuda = '12.8'` (or `cuda: Optional[str] = '12.8'`) in torch's `version.py`; `None` for a
/// CPU build (`cuda = None`).
pub fn torch_cuda(version_py: &str) -> Option<String> {
    version_py.lines().find_map(|line| {
        let line = line.trim();
        let rest = line.strip_prefix("cuda")?;
        let (_, value) = rest.split_once('=')?;
        let value = value.trim().trim_matches(|c| c == '\'' || c == '"');
        (!value.is_empty() && value != "None").then(|| value.to_owned())
    })
}

/// `'cuda_version': '12.5.1'` in TensorFlow's `build_info.py`, as `12.5`.
pub fn tensorflow_cuda(build_info: &str) -> Option<String> {
    let at = build_info.find("'cuda_version'")?;
    let rest = &build_info[at + "'cuda_version'".len()..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let quote = rest.chars().next()?;
    let value = rest[1..].split(quote).next()?;
    major_minor(value)
}

/// `12.8` of `12.8.90`; `13` stays `13`.
fn major_minor(version: &str) -> Option<String> {
    let mut parts = version.split('.');
    let major = parts.next()?.trim();
    if major.is_empty() || !major.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    match parts.next() {
        Some(minor) if !minor.is_empty() && minor.chars().all(|c| c.is_ascii_digit()) => {
            Some(format!("{major}.{minor}"))
        }
        _ => Some(major.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/doctor/python")
            .join(name)
    }

    #[test]
    fn torch_version_py_forms() {
        assert_eq!(torch_cuda("cuda = '12.8'\n"), Some("12.8".into()));
        assert_eq!(
            torch_cuda("__version__ = '2.8.0'\ncuda: Optional[str] = '13.0'\n"),
            Some("13.0".into())
        );
        assert_eq!(torch_cuda("cuda = None\n"), None);
        assert_eq!(torch_cuda("git_version = 'abc'\n"), None);
    }

    #[test]
    fn tensorflow_build_info() {
        let text =
            "build_info = {'cpu_compiler': 'gcc', 'cuda_version': '12.5.1', 'cudnn_version': '9'}";
        assert_eq!(tensorflow_cuda(text), Some("12.5".into()));
    }

    #[test]
    fn a_cu130_environment_lists_its_frameworks_and_runtime() {
        let wheels = scan(&testdata("cu130/lib/python3.12/site-packages"));
        let names: Vec<(&str, Option<&str>)> = wheels
            .iter()
            .map(|w| (w.name.as_str(), w.cuda.as_deref()))
            .collect();
        assert_eq!(
            names,
            [
                ("cupy-cuda12x", Some("12")),
                ("jax", None),
                ("jax-cuda13-plugin", Some("13")),
                ("nvidia-cuda-runtime", Some("13.0")),
                ("torch", Some("13.0")),
            ]
        );
    }

    #[test]
    fn prefixes_are_found_without_running_python() {
        let dirs = prefix_site_packages(&testdata("cu130"));
        assert_eq!(dirs, [testdata("cu130/lib/python3.12/site-packages")]);
    }

    #[test]
    fn a_cpu_torch_has_no_cuda() {
        let wheels = scan(&testdata("cpu/site-packages"));
        assert_eq!(wheels.len(), 1);
        assert_eq!(wheels[0].cuda, None);
    }
}
