//! A real container runtime: Podman (Debian's package) runs a container from an image built
//! here from local files only (a tarball of Debian's static busybox, `podman import`d; no
//! registry), the container's process is announced as a GPU process through the fake NVML's
//! process directory, and `vramctl ps` must name it: runtime `podman`, Podman's container id
//! and the container's name, read from Podman's own state (`containers.json`).
//!
//! Podman runs as root with its state in a temporary directory (`--root`), which
//! `VRAMCTL_CONTAINER_ROOT` points vramctl at, so no host state is read or changed. Options
//! that keep it working inside other containers (CI runners, this project's sandboxes):
//! `runc` when installed (crun refuses a cgroup v1 + v2 "hybrid" host), the cgroupfs cgroup
//! manager (no systemd needed), no default ulimits (raising `RLIMIT_NOFILE` past the
//! parent's hard limit is refused in nested containers), no network, the `vfs` storage
//! driver (no overlay mounts).
//!
//! The announcement is written by the test for the host PID Podman reports (`podman
//! inspect`): inside its own PID namespace the container cannot know that PID.
//!
//! Needs root, `podman` and `/bin/busybox` (package busybox-static); `scripts/test.sh`
//! installs them and sets `VRAMCTL_SKIP_PODMAN=1` when it cannot (not root, no apt-get).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::harness::{json_of, vramctl};
use crate::real_processes::{Scenario, is_root};

const GIB: u64 = 1 << 30;

/// Whether to skip: only when podman cannot run and `VRAMCTL_SKIP_PODMAN=1`; otherwise a
/// missing part fails the test.
fn skip_without_podman() -> bool {
    let missing = if !is_root() {
        Some("root")
    } else if !Path::new("/bin/busybox").exists() {
        Some("/bin/busybox (busybox-static)")
    } else if Command::new("podman")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        Some("podman")
    } else {
        None
    };
    let Some(missing) = missing else {
        return false;
    };
    if std::env::var("VRAMCTL_SKIP_PODMAN").is_ok_and(|v| v == "1") {
        eprintln!("skipped: {missing} is missing and VRAMCTL_SKIP_PODMAN=1");
        return true;
    }
    panic!(
        "{missing} is missing: install podman and busybox-static as root (scripts/test.sh \
         does) or set VRAMCTL_SKIP_PODMAN=1 to skip this test"
    );
}

/// Podman with all its state under one temporary directory; removes its container and
/// image when dropped.
struct Podman {
    dir: tempfile::TempDir,
    containers: Vec<String>,
}

impl Podman {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("containers.conf"),
            "[containers]\ndefault_ulimits = []\n",
        )
        .expect("write containers.conf");
        Self {
            dir,
            containers: Vec::new(),
        }
    }

    /// What `VRAMCTL_CONTAINER_ROOT` points at: Podman's store is `var/lib/containers/storage`
    /// below it, as on a host.
    fn state_root(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn command(&self) -> Command {
        let mut command = Command::new("podman");
        let root = self.state_root().join("var/lib/containers/storage");
        command
            .env("CONTAINERS_CONF", self.dir.path().join("containers.conf"))
            .arg("--root")
            .arg(root)
            .arg("--runroot")
            .arg(self.dir.path().join("run"))
            .arg("--tmpdir")
            .arg(self.dir.path().join("tmp"))
            .args([
                "--storage-driver",
                "vfs",
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
            ]);
        if Path::new("/usr/sbin/runc").exists() {
            command.args(["--runtime", "/usr/sbin/runc"]);
        }
        command
    }

    /// Runs podman with `args`; its trimmed stdout, or a panic with its stderr.
    fn run(&self, args: &[&str]) -> String {
        let output = self.command().args(args).output().expect("run podman");
        assert!(
            output.status.success(),
            "podman {args:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout)
            .expect("utf-8")
            .trim()
            .to_owned()
    }

    /// An image holding only `/bin/busybox`, imported from a tarball made here.
    fn import_busybox(&self, image: &str) {
        let rootfs = self.dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).expect("mkdir");
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("copy busybox");
        let tarball = self.dir.path().join("rootfs.tar");
        let status = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tarball)
            .arg(".")
            .status()
            .expect("tar");
        assert!(status.success(), "tar failed");
        self.run(&["import", "-q", &tarball.to_string_lossy(), image]);
    }

    /// Starts a container named `name` sleeping; its id and its process's host PID.
    fn start_sleeping(&mut self, image: &str, name: &str) -> (String, u32) {
        let id = self.run(&[
            "run",
            "-d",
            "--network",
            "none",
            "--name",
            name,
            image,
            "/bin/busybox",
            "sleep",
            "600",
        ]);
        self.containers.push(id.clone());
        let pid = self.run(&["inspect", "--format", "{{.State.Pid}}", name]);
        (id, pid.parse().expect("a PID"))
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        for id in &self.containers {
            let _ = self
                .command()
                .args(["rm", "-f", "-t", "0", id])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

#[test]
fn ps_names_a_podman_containers_gpu_process() {
    if skip_without_podman() {
        return;
    }
    let mut podman = Podman::new();
    let image = "localhost/vramctl-test-busybox:1";
    podman.import_busybox(image);
    let name = format!("vramctl-test-{}", std::process::id());
    let (id, host_pid) = podman.start_sleeping(image, &name);
    assert_eq!(id.len(), 64, "a full container id: {id}");
    let cgroup = std::fs::read_to_string(format!("/proc/{host_pid}/cgroup")).expect("cgroup");
    assert!(cgroup.contains(&format!("libpod-{id}")), "{cgroup}");

    let procs = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        procs.path().join(host_pid.to_string()),
        format!("0 {GIB}\n"),
    )
    .expect("announce");
    let scenario = Scenario::new(1, &[]);
    let ps = json_of(
        vramctl(&scenario.path)
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .env("VRAMCTL_CONTAINER_ROOT", podman.state_root())
            .args(["ps", "--json", "--no-daemon"]),
    );
    let processes = ps["processes"].as_array().expect("processes");
    let process = processes
        .iter()
        .find(|p| p["pid"] == host_pid)
        .unwrap_or_else(|| panic!("pid {host_pid} listed: {ps:#}"));
    assert_eq!(process["used_bytes"], GIB);
    assert_eq!(process["container_id"], id.as_str());
    assert_eq!(
        process["container"],
        serde_json::json!({"id": id, "runtime": "podman", "name": name, "rootless_uid": null}),
        "{process:#}"
    );

    // Grouped by container: the container's memory on GPU 0 under its runtime/name, text
    // and JSON alike, in ps and status.
    let by_container = json_of(
        vramctl(&scenario.path)
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .env("VRAMCTL_CONTAINER_ROOT", podman.state_root())
            .args(["ps", "--json", "--no-daemon", "--by", "container"]),
    );
    assert_eq!(by_container["by"], "container");
    let label = format!("podman/{name}");
    let owner = by_container["owners"]
        .as_array()
        .expect("owners")
        .iter()
        .find(|o| o["owner"] == id.as_str())
        .unwrap_or_else(|| panic!("the container is an owner: {by_container:#}"));
    assert_eq!(
        (
            &owner["gpu"],
            &owner["label"],
            &owner["processes"],
            &owner["used_bytes"]
        ),
        (&0.into(), &label.as_str().into(), &1.into(), &GIB.into())
    );
    let status = json_of(
        vramctl(&scenario.path)
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .env("VRAMCTL_CONTAINER_ROOT", podman.state_root())
            .args(["status", "--json", "--no-daemon", "--by", "container"]),
    );
    assert_eq!(
        status["devices"][0]["owners"][0]["owner"],
        id.as_str(),
        "{status:#}"
    );
    let text = crate::harness::stdout_of(
        vramctl(&scenario.path)
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .env("VRAMCTL_CONTAINER_ROOT", podman.state_root())
            .env("COLUMNS", "80")
            .args(["ps", "--no-daemon", "--by", "container"]),
    );
    assert!(
        text.lines().any(|l| l.trim_start().starts_with('0')
            && l.contains("1.0 GiB")
            && l.contains(&label)),
        "{text}"
    );
    assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");

    // Through a daemon: a `record` that reads Podman's state answers a client whose own
    // state root is empty, so the name can only come from the daemon's answer.
    let nowhere = tempfile::tempdir().expect("tempdir");
    let runtime = nowhere.path().join("run");
    let mut record = crate::harness::vramctl_std(&scenario.path);
    record
        .env("FAKE_NVML_PROCESS_DIR", procs.path())
        .env("VRAMCTL_CONTAINER_ROOT", podman.state_root())
        .arg("--db")
        .arg(nowhere.path().join("history.db"))
        .args(["record", "--interval", "1s"]);
    let daemon = crate::daemon::Daemon::start(record, &runtime);
    let through_daemon = json_of(
        vramctl(&scenario.path)
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .env("VRAMCTL_CONTAINER_ROOT", nowhere.path())
            .env("VRAMCTL_RUNTIME_DIR", &runtime)
            .args(["ps", "--json"]),
    );
    daemon.stop();
    let process = through_daemon["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == host_pid)
        .cloned()
        .unwrap_or_else(|| panic!("listed: {through_daemon:#}"));
    assert_eq!(process["container"]["name"], name.as_str(), "{process:#}");

    // The same container named from a state root without Podman's store: id and runtime
    // from the cgroup, no name (never a guess).
    let empty = tempfile::tempdir().expect("tempdir");
    let ps = json_of(
        vramctl(&scenario.path)
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .env("VRAMCTL_CONTAINER_ROOT", empty.path())
            .args(["ps", "--json", "--no-daemon"]),
    );
    let process = ps["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == host_pid)
        .cloned()
        .expect("listed");
    assert_eq!(process["container"]["runtime"], "podman");
    assert_eq!(process["container"]["name"], serde_json::Value::Null);
}

/// `--by user` needs no container: two real processes of this user on two GPUs, and one the
/// driver lists that this PID namespace cannot see, counted as "cannot map", never as ours.
#[test]
fn by_user_sums_each_gpu_and_says_what_cannot_be_mapped() {
    use crate::real_processes::{Holder, sleeper};
    let (a, b) = (sleeper(), sleeper());
    let ghost = crate::harness::free_pids(1)[0];
    let holders = [
        Holder::real(0, a.pid(), "2 GiB"),
        Holder::real(0, b.pid(), "1 GiB"),
        Holder::real(1, b.pid(), "4 GiB"),
        Holder {
            real: false,
            ..Holder::real(0, ghost, "8 GiB")
        },
    ];
    let scenario = Scenario::new(2, &holders);
    let uid = rustix::process::getuid().as_raw();
    let me = vramctl_procs::procinfo::ProcReader::new()
        .user_name(uid)
        .unwrap_or_else(|| uid.to_string());
    let ps = json_of(vramctl(&scenario.path).args(["ps", "--json", "--no-daemon", "--by", "user"]));
    let owners: Vec<(u64, Option<String>, bool, u64, u64)> = ps["owners"]
        .as_array()
        .expect("owners")
        .iter()
        .map(|o| {
            (
                o["gpu"].as_u64().expect("gpu"),
                o["owner"].as_str().map(str::to_owned),
                o["mapped"].as_bool().expect("mapped"),
                o["processes"].as_u64().expect("processes"),
                o["used_bytes"].as_u64().expect("bytes"),
            )
        })
        .collect();
    assert_eq!(
        owners,
        [
            (0, None, false, 1, 8 * GIB),
            (0, Some(me.clone()), true, 2, 3 * GIB),
            (1, Some(me.clone()), true, 1, 4 * GIB),
        ],
        "{ps:#}"
    );
    let text = crate::harness::stdout_of(vramctl(&scenario.path).env("COLUMNS", "80").args([
        "status",
        "--no-daemon",
        "--by",
        "user",
    ]));
    assert!(text.contains("(cannot map: not visible here)"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("3.0 GiB") && l.ends_with(me.as_str())),
        "{text}"
    );
    assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
}
