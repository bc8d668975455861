//! Running `vramctl` from a clean environment against a fake NVML scenario.

use std::path::{Path, PathBuf};

use assert_cmd::Command;

/// `target/<profile>/deps/libfake_nvml.so` (cargo builds it because this crate
/// dev-depends on fake-nvml).
pub fn fake_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    for candidate in [
        deps.join("libfake_nvml.so"),
        deps.join("../libfake_nvml.so"),
    ] {
        if candidate.exists() {
            return candidate;
        }
    }
    panic!("libfake_nvml.so not found beside {}", deps.display());
}

/// An example scenario shipped in `examples/scenarios/`.
pub fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/scenarios")
        .join(name)
}

/// A directory for vramctl's sockets (`VRAMCTL_RUNTIME_DIR`) that no other command of the
/// test run shares, under cargo's scratch directory for tests: a `record` or `serve` of one
/// test never answers another test's `status` (as root, every daemon would otherwise answer
/// in `/run/vramctl`). Not created here; a daemon makes it and removes it when it stops.
/// A test that wants a daemon to answer gives both commands the same one.
pub fn private_runtime_dir() -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "rt-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// `vramctl` with nothing from the caller's environment, on the fake library, with the
/// fake's clock stopped at `t = 0` unless the test moves it.
pub fn vramctl(scenario_path: &Path) -> Command {
    Command::from_std(vramctl_std(scenario_path))
}

/// The same as [`vramctl`], as a plain `std::process::Command` (for piping and spawning).
pub fn vramctl_std(scenario_path: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("vramctl"));
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("VRAMCTL_NVML_LIB", fake_library())
        .env("FAKE_NVML_SCENARIO", scenario_path)
        .env("FAKE_NVML_TIME", "0")
        .env("NO_COLOR", "1")
        .env("VRAMCTL_RUNTIME_DIR", private_runtime_dir())
        .env("VRAMCTL_DRM_ROOT", no_drm_root());
    cmd
}

/// A DRM root with nothing in it: tests see only the fake NVML's GPUs, whatever cards the
/// machine running them has (`tests/integration/drm.rs` points it at `testdata/drm/`).
pub fn no_drm_root() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-drm-root")
}

/// A DRM fixture tree of `testdata/drm/`.
pub fn drm_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/drm")
        .join(name)
}

/// `vramctl` on a shipped example scenario.
pub fn vramctl_on(name: &str) -> Command {
    vramctl(&scenario(name))
}

/// Stdout of a successful run, as text.
///
/// A shipped scenario's fictional processes have PIDs that a real process of this machine
/// may hold (pid_max is 32768 on many kernels, and the test run itself starts thousands of
/// processes: a Chromium of the web tests once held 30101 and 30102 while `status` ran on
/// `mig.toml`, and the snapshot showed its command line; rustc processes of a build beside
/// the tests held them for minutes; the vramctl under test can itself be given one). So the
/// run is made on a copy of the scenario whose fictional PIDs are moved to free PIDs of the
/// same width that the kernel will hand out last ([`stand_ins`]), and the output is given
/// back with the original PIDs. (Scenarios a test writes choose their PIDs themselves, some
/// of them real on purpose: a zombie, a process of another user; they are run as they are.)
pub fn stdout_of(cmd: &mut Command) -> String {
    let shipped = cmd
        .get_envs()
        .find(|(key, _)| *key == "FAKE_NVML_SCENARIO")
        .and_then(|(_, value)| value.map(PathBuf::from))
        .filter(|path| path.starts_with(scenario("")));
    let output = match shipped {
        Some(path) => output_on_free_pids(cmd, &path),
        None => cmd.output().expect("run vramctl"),
    };
    assert!(
        output.status.success(),
        "vramctl failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 stdout")
}

/// `cmd`'s output on the shipped scenario `path` with its fictional PIDs moved to free ones,
/// the output's PIDs moved back ([`stdout_of`]).
fn output_on_free_pids(cmd: &mut Command, path: &Path) -> std::process::Output {
    let moves = MovedPids::new(&fictional_pids(path));
    let text = std::fs::read_to_string(path).expect("the scenario");
    let copy = tempfile::tempdir().expect("tempdir");
    let file = copy.path().join(path.file_name().expect("a file name"));
    std::fs::write(&file, moves.scenario(&text)).expect("write the moved scenario");
    cmd.env("FAKE_NVML_SCENARIO", &file);
    let mut output = cmd.output().expect("run vramctl");
    cmd.env("FAKE_NVML_SCENARIO", path);
    output.stdout = moves
        .back(&String::from_utf8_lossy(&output.stdout))
        .into_bytes();
    output
}

/// A scenario's fictional PIDs moved to free ones ([`stand_ins`]): a scenario a test writes
/// itself uses [`MovedPids::scenario`] on its text and reads every output through
/// [`MovedPids::back`], so its assertions keep the PIDs it chose while no real process
/// (another test's, a build's) can stand on them during the run — on a busy machine with
/// pid_max 32768 one did, and a recording saw the process change identity.
pub struct MovedPids(Vec<(u32, u32)>);

impl MovedPids {
    /// Free stand-ins for `fictional`, chosen now.
    pub fn new(fictional: &[u32]) -> Self {
        Self(stand_ins(fictional))
    }

    /// `text` (a scenario) with each `pid = N` line moved to its stand-in.
    pub fn scenario(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for (from, to) in &self.0 {
            text = text.replace(&format!("pid = {from}\n"), &format!("pid = {to}\n"));
        }
        text
    }

    /// The stand-in of `fictional` (itself if it was not moved: past pid_max, or not given
    /// to [`MovedPids::new`]), for a command-line argument that names the process (`--pid`)
    /// or an input the test writes.
    pub fn to(&self, fictional: u32) -> u32 {
        self.0
            .iter()
            .find(|(from, _)| *from == fictional)
            .map_or(fictional, |(_, to)| *to)
    }

    /// `text` (an output) with each stand-in given back its fictional PID.
    pub fn back(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for (from, to) in &self.0 {
            let back = regex::Regex::new(&format!(r"\b{to}\b")).expect("a regex");
            text = back
                .replace_all(&text, from.to_string().as_str())
                .into_owned();
        }
        text
    }
}

/// For each of `fictional`, a PID of the same number of digits that no process has now,
/// none of `fictional`, and as far ahead of the kernel's last PID (`ns_last_pid`) as there
/// is: PIDs are handed out upwards from it, wrapping at pid_max, so the free ones just
/// below it are the last to be handed out again — not during a test. The stand-ins keep
/// the fictional PIDs' order, so an output sorted by PID keeps its rows' order once given
/// back.
fn stand_ins(fictional: &[u32]) -> Vec<(u32, u32)> {
    let read =
        |path: &str| -> Option<u32> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    let pid_max = read("/proc/sys/kernel/pid_max").unwrap_or(32_768);
    let last = read("/proc/sys/kernel/ns_last_pid").unwrap_or(0);
    let ahead = |p: u32| (p + pid_max - last - 1) % pid_max;
    let mut taken: std::collections::HashSet<u32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    taken.extend(fictional);
    // A PID past pid_max (a scenario's absurd one, on purpose) can never be real; one on
    // two GPUs is listed twice and gets one stand-in.
    let mut fictional: Vec<u32> = fictional.iter().copied().filter(|&p| p < pid_max).collect();
    fictional.sort_unstable();
    fictional.dedup();
    let digits = |pid: u32| pid.to_string().len() as u32;
    let mut moves: Vec<(u32, u32)> = fictional
        .iter()
        .map(|&from| {
            let digits = digits(from);
            let low = 10u32.pow(digits - 1).max(300);
            let high = 10u32.saturating_pow(digits).min(pid_max);
            let mut candidates: Vec<u32> = (low..high).filter(|p| !taken.contains(p)).collect();
            candidates.sort_by_key(|p| std::cmp::Reverse(ahead(*p)));
            // /proc lists processes only; a thread's id opens as /proc/TID too.
            let to = candidates
                .into_iter()
                .find(|p| !Path::new(&format!("/proc/{p}")).exists())
                .expect("a free PID of the same width");
            taken.insert(to);
            (from, to)
        })
        .collect();
    // The free PIDs are picked from the kernel's last one downwards; handed out in the
    // fictional PIDs' (ascending) order, smallest first, within each width.
    let mut picked: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    for (from, to) in &moves {
        picked.entry(digits(*from)).or_default().push(*to);
    }
    for tos in picked.values_mut() {
        tos.sort_unstable_by(|a, b| b.cmp(a));
    }
    for (from, to) in &mut moves {
        *to = picked
            .get_mut(&digits(*from))
            .and_then(Vec::pop)
            .expect("one stand-in per fictional PID");
    }
    moves
}

/// The PIDs of a scenario's processes that are not marked `real = true`: processes the fake
/// NVML reports and no real process should answer for in /proc.
pub fn fictional_pids(scenario_path: &Path) -> Vec<u32> {
    let Ok(text) = std::fs::read_to_string(scenario_path) else {
        return Vec::new();
    };
    let Ok(table) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let processes = table
        .get("gpu")
        .and_then(|gpus| gpus.as_array())
        .into_iter()
        .flatten()
        .filter_map(|gpu| gpu.get("process")?.as_array())
        .flatten();
    processes
        .filter(|p| p.get("real").and_then(|r| r.as_bool()) != Some(true))
        .filter_map(|p| u32::try_from(p.get("pid")?.as_integer()?).ok())
        .filter(|pid| *pid > 0)
        .collect()
}

/// Parsed JSON stdout of a successful run.
pub fn json_of(cmd: &mut Command) -> serde_json::Value {
    serde_json::from_str(&stdout_of(cmd)).expect("valid JSON")
}

/// insta settings that hide what changes between runs (wall-clock times).
pub fn redactions() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "[TIME]");
    // status's header shows the wall clock now, in the local zone.
    settings.add_filter(
        r"(?m)^(vramctl \S+ · driver \S+ · )\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+",
        "$1[TIME]",
    );
    settings.set_prepend_module_to_snapshot(false);
    settings
}

/// `n` PIDs no process has now (so /proc does not name a fictional GPU process).
pub fn free_pids(n: usize) -> Vec<u32> {
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32_768);
    (300..pid_max)
        .rev()
        .filter(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        .take(n)
        .collect()
}

/// `vramctl`, `libfake_nvml.so` and a scenario copied into a fresh directory that every
/// user may enter and read, for tests that run vramctl as another uid: a checkout (and its
/// `target/`) may sit in a directory only its owner can enter (`/root/…`, any 0700
/// directory), where another uid cannot execute the binary or load the library (EACCES).
/// Files are hard-linked where the filesystem allows it (the binary is large), else copied.
pub struct Portable {
    /// The directory (0755, under `/tmp`); removed when dropped.
    pub dir: tempfile::TempDir,
    bin: PathBuf,
    lib: PathBuf,
    scenario: PathBuf,
}

impl Portable {
    /// Copies the binary, the fake library and `scenario_path`.
    pub fn new(scenario_path: &Path) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let base = Path::new("/tmp");
        let dir = if base.is_dir() {
            tempfile::tempdir_in(base)
        } else {
            tempfile::tempdir()
        }
        .expect("a temp dir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod the temp dir");
        let place = |from: &Path, name: &str, mode: u32| {
            let to = dir.path().join(name);
            if std::fs::hard_link(from, &to).is_err() {
                std::fs::copy(from, &to).expect("copy into the temp dir");
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))
                    .expect("chmod");
            }
            to
        };
        let bin = place(&assert_cmd::cargo::cargo_bin("vramctl"), "vramctl", 0o755);
        let lib = place(&fake_library(), "libfake_nvml.so", 0o755);
        let scenario = dir.path().join("scenario.toml");
        std::fs::copy(scenario_path, &scenario).expect("copy the scenario");
        std::fs::set_permissions(&scenario, std::fs::Permissions::from_mode(0o644))
            .expect("chmod the scenario");
        Self {
            dir,
            bin,
            lib,
            scenario,
        }
    }

    /// The same clean environment as [`vramctl_std`], on the copies.
    pub fn command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.bin);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("VRAMCTL_NVML_LIB", &self.lib)
            .env("FAKE_NVML_SCENARIO", &self.scenario)
            .env("FAKE_NVML_TIME", "0")
            .env("NO_COLOR", "1")
            .env("VRAMCTL_RUNTIME_DIR", private_runtime_dir())
            .env("VRAMCTL_DRM_ROOT", no_drm_root())
            .current_dir(self.dir.path());
        cmd
    }

    /// The copied scenario.
    pub fn scenario(&self) -> &Path {
        &self.scenario
    }
}
