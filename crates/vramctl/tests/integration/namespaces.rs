//! Inside a PID namespace (issue 31): real namespaces made with `unshare --pid --fork
//! --mount-proc`, their processes announced as GPU processes of the fake NVML under their
//! host PIDs (what the driver reports), and `vramctl ps --json` run inside one of them with
//! `nsenter --pid --mount`.
//!
//! - With a host daemon (`vramctl record`) whose socket the namespace reaches: the
//!   namespace's processes under its own PIDs, NVML's bytes, none of the other namespace's,
//!   and the others' memory as one figure per GPU.
//! - Without one: NVML's PIDs marked as host PIDs that cannot be mapped, even where a
//!   process of the namespace has the same number; taken as the namespace's own only when
//!   each is a process there holding that GPU's device file open (driver 580 numbers them so).
//!
//! Needs root, `unshare` and `nsenter` (util-linux). Without them the tests say why and
//! pass, unless `VRAMCTL_TEST_STRICT=1` (CI), where a missing part fails them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::daemon::Daemon;
use crate::harness::vramctl_std;
use crate::real_processes::{Holder, Scenario, Spawned, is_root, spawn, unused_pids};
use vramctl_procs::procinfo;

const GIB: u64 = 1 << 30;

/// Whether to skip: root, `unshare` and `nsenter` are needed.
fn skip_without_namespaces() -> bool {
    let have = |program: &str| {
        Command::new(program)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let missing = if !is_root() {
        Some("root")
    } else if !have("unshare") {
        Some("unshare (util-linux)")
    } else if !have("nsenter") {
        Some("nsenter (util-linux)")
    } else {
        None
    };
    let Some(missing) = missing else {
        return false;
    };
    if std::env::var("VRAMCTL_TEST_STRICT").is_ok_and(|v| v == "1") {
        panic!("{missing} is missing and VRAMCTL_TEST_STRICT=1");
    }
    eprintln!("skipped: PID namespace tests need {missing}");
    true
}

/// A PID namespace of its own (`unshare --pid --fork --mount-proc`): a shell (PID 1 there)
/// and the `sleep`s it started, killed with the namespace when dropped.
struct Namespace {
    _unshare: Spawned,
    /// The shell's host PID: `nsenter --target` it.
    init: u32,
    /// Each sleep: (host PID, PID in the namespace).
    sleepers: Vec<(u32, u32)>,
}

impl Namespace {
    /// A namespace running `script` (which starts sleeps) and then printing `ready`.
    fn start(script: &str) -> Self {
        Self::start_with(&[], script)
    }

    /// The same, with more `unshare` options (`--cgroup`).
    fn start_with(options: &[&str], script: &str) -> Self {
        let mut unshare = spawn(
            Command::new("unshare")
                .args(["--pid", "--fork", "--mount-proc"])
                .args(options)
                .args(["sh", "-c", &format!("{script}\necho ready\nwait")]),
        );
        while unshare.line() != "ready" {}
        let tree = procinfo::descendants(unshare.pid());
        let init = tree
            .iter()
            .find(|(_, parent)| *parent == unshare.pid())
            .map(|(pid, _)| *pid)
            .expect("the namespace's shell");
        let sleepers = tree
            .iter()
            .filter(|(_, parent)| *parent == init)
            .map(|(pid, _)| {
                let nspid = procinfo::read_status(*pid).expect("status").nspid;
                assert_eq!(nspid.len(), 2, "host and namespace PIDs: {nspid:?}");
                (*pid, nspid[1])
            })
            .collect();
        Self {
            _unshare: unshare,
            init,
            sleepers,
        }
    }

    /// `n` sleeps.
    fn with_sleepers(n: usize) -> Self {
        let ns = Self::start(&"sleep 600 &\n".repeat(n));
        assert_eq!(ns.sleepers.len(), n);
        ns
    }

    /// A namespace with a /dev of its own holding an `nvidia0` file: one sleep holds it
    /// open, as a CUDA process holds its GPU, the other only `nvidiactl`, as nvidia-smi
    /// does. With the holder's PID there and the other sleep's.
    fn with_a_gpu_file_holder() -> (Self, u32, u32) {
        let ns = Self::start(
            "d=$(mktemp -d) && mount -t tmpfs none \"$d\" && \
             for f in null zero full random urandom; do touch \"$d/$f\" && mount --bind \"/dev/$f\" \"$d/$f\"; done && \
             touch \"$d/nvidia0\" \"$d/nvidiactl\" && mount --move \"$d\" /dev\n\
             sh -c 'exec 3</dev/nvidia0 4</dev/nvidiactl; exec sleep 600' &\n\
             h=$!; until [ \"$(cat /proc/$h/comm)\" = sleep ]; do sleep 0.01; done\n\
             sh -c 'exec 4</dev/nvidiactl; exec sleep 600' &\n\
             h=$!; until [ \"$(cat /proc/$h/comm)\" = sleep ]; do sleep 0.01; done",
        );
        assert_eq!(ns.sleepers.len(), 2, "{:?}", ns.sleepers);
        let holds = |host: u32| {
            procinfo::gpu_device_files(host)
                .unwrap_or_default()
                .iter()
                .any(|f| f == "/dev/nvidia0")
        };
        let holder = ns
            .sleepers
            .iter()
            .find(|s| holds(s.0))
            .expect("the holder")
            .1;
        let idle = ns
            .sleepers
            .iter()
            .find(|s| !holds(s.0))
            .expect("the other")
            .1;
        (ns, holder, idle)
    }

    /// `vramctl ARGS` run inside this namespace (its PIDs and its /proc), with the
    /// environment `vramctl_std` gives, the daemon's runtime directory in `runtime`.
    fn vramctl(&self, scenario: &Path, runtime: &Path, args: &[&str]) -> Output {
        let out = self.vramctl_any(scenario, runtime, args);
        assert!(
            out.status.success(),
            "vramctl {args:?} inside the namespace failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// The same, whatever its exit code.
    fn vramctl_any(&self, scenario: &Path, runtime: &Path, args: &[&str]) -> Output {
        let inner = vramctl_std(scenario);
        let mut cmd = Command::new("nsenter");
        cmd.args([
            "--target",
            &self.init.to_string(),
            "--pid",
            "--mount",
            "--cgroup",
            "--",
        ])
        .arg(inner.get_program())
        .args(args)
        .env_clear();
        for (key, value) in inner.get_envs() {
            if let Some(value) = value {
                cmd.env(key, value);
            }
        }
        cmd.env("VRAMCTL_RUNTIME_DIR", runtime)
            .env("VRAMCTL_LOG", "vramctl=debug");
        cmd.output().expect("nsenter")
    }
}

/// A scenario with `pid` as a real process holding 3 GiB on GPU 0, whose device file is
/// `/dev/nvidia0` (NVML's minor number 0). The fake lists it under the number it is given:
/// a namespace's PID, as driver 580 numbers it.
fn scenario_on_nvidia0(pid: u32) -> Scenario {
    let scenario = Scenario::new(1, &[Holder::real(0, pid, "3 GiB")]);
    let text = std::fs::read_to_string(scenario.path()).expect("scenario");
    let text = text.replacen("memory_reserved", "minor_number = 0\nmemory_reserved", 1);
    std::fs::write(scenario.path(), text).expect("scenario");
    scenario
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// (pid, host_pid, used_bytes, visible) of each process in a `ps --json` document.
fn rows(doc: &Value) -> BTreeSet<(u64, Option<u64>, u64, bool)> {
    doc["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .map(|p| {
            (
                p["pid"].as_u64().expect("pid"),
                p["host_pid"].as_u64(),
                p["used_bytes"].as_u64().expect("bytes"),
                p["visible"].as_bool().expect("visible"),
            )
        })
        .collect()
}

/// (gpu, processes, bytes) of `other_holders`.
fn others(doc: &Value) -> BTreeMap<u64, (u64, u64)> {
    doc["other_holders"]
        .as_array()
        .expect("other_holders")
        .iter()
        .map(|o| {
            (
                o["index"].as_u64().expect("index"),
                (
                    o["processes"].as_u64().expect("processes"),
                    o["used_bytes"].as_u64().expect("bytes"),
                ),
            )
        })
        .collect()
}

#[test]
fn ps_inside_a_namespace_lists_its_own_processes_under_its_pids_through_the_host_daemon() {
    if skip_without_namespaces() {
        return;
    }
    // Two namespaces whose sleeps have the same PIDs there (2 and 3), and a host process.
    let a = Namespace::with_sleepers(2);
    let b = Namespace::with_sleepers(2);
    let host = crate::real_processes::sleeper();
    let (a0, a1) = (a.sleepers[0], a.sleepers[1]);
    let (b0, b1) = (b.sleepers[0], b.sleepers[1]);
    assert_eq!(a0.1, b0.1, "the same PID in both namespaces");
    let scenario = Scenario::new(
        2,
        &[
            Holder::real(0, a0.0, "3 GiB"),
            Holder::real(1, a1.0, "5 GiB"),
            Holder::real(0, b0.0, "7 GiB"),
            Holder::real(1, b1.0, "11 GiB"),
            Holder::real(0, host.pid(), "13 GiB"),
        ],
    );
    let runtime = scenario.dir.path().join("run");
    let mut record = vramctl_std(scenario.path());
    record
        .arg("--db")
        .arg(scenario.dir.path().join("history.db"))
        .args(["record", "--interval", "1s"]);
    let _daemon = Daemon::start(record, &runtime);

    let out = a.vramctl(scenario.path(), &runtime, &["ps", "--json"]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("Answered by the daemon."), "{log}");
    let doc = json(&out);
    assert_eq!(doc["pid_mapping"], "mapped", "{doc}");
    assert_eq!(
        rows(&doc),
        BTreeSet::from([
            (u64::from(a0.1), Some(u64::from(a0.0)), 3 * GIB, true),
            (u64::from(a1.1), Some(u64::from(a1.0)), 5 * GIB, true),
        ]),
        "A's processes, A's PIDs, NVML's bytes: {doc}"
    );
    for p in doc["processes"].as_array().expect("processes") {
        assert!(
            p["command"].as_str().is_some_and(|c| c.contains("sleep")),
            "its command from its own /proc: {p}"
        );
    }
    // B's and the host's memory: one figure per GPU, nothing else of theirs.
    assert_eq!(
        others(&doc),
        BTreeMap::from([(0, (2, 20 * GIB)), (1, (1, 11 * GIB))]),
        "{doc}"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for pid in [b0.0, b1.0, host.pid()] {
        assert!(
            !text.contains(&format!("\"host_pid\":{pid}"))
                && !text.contains(&format!("\"pid\":{pid},")),
            "another namespace's PID {pid} leaked: {text}"
        );
    }
    // The 1 GiB no process holds stays unaccounted; the others' memory is not.
    let unaccounted: Vec<(u64, u64)> = doc["unaccounted"]
        .as_array()
        .expect("unaccounted")
        .iter()
        .map(|u| {
            (
                u["index"].as_u64().expect("i"),
                u["bytes"].as_u64().expect("b"),
            )
        })
        .collect();
    assert_eq!(unaccounted, [(0, GIB)], "{doc}");

    // The same from B: its own, and A's as the others'.
    let doc = json(&b.vramctl(scenario.path(), &runtime, &["ps", "--json"]));
    assert_eq!(
        rows(&doc),
        BTreeSet::from([
            (u64::from(b0.1), Some(u64::from(b0.0)), 7 * GIB, true),
            (u64::from(b1.1), Some(u64::from(b1.0)), 11 * GIB, true),
        ]),
        "{doc}"
    );
    assert_eq!(
        others(&doc),
        BTreeMap::from([(0, (2, 16 * GIB)), (1, (1, 5 * GIB))]),
        "{doc}"
    );

    // status inside A: the same mapping, the others' line.
    let out = a.vramctl(scenario.path(), &runtime, &["status", "--json"]);
    let doc = json(&out);
    assert_eq!(doc["pid_mapping"], "mapped", "{doc}");
    let text = String::from_utf8_lossy(&out.stdout);
    for pid in [b0.0, b1.0, host.pid()] {
        assert!(
            !text.contains(&format!("\"host_pid\":{pid}"))
                && !text.contains(&format!("\"pid\":{pid},")),
            "another namespace's PID {pid} leaked to status: {text}"
        );
    }
    let table = a.vramctl(scenario.path(), &runtime, &["ps"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("(other containers/processes: 2 outside this PID namespace)"),
        "{table}"
    );
}

#[test]
fn without_a_daemon_host_pids_are_never_taken_for_the_namespaces_own() {
    if skip_without_namespaces() {
        return;
    }
    // NVML lists a host PID that, inside the namespace, is the PID of one of its own
    // processes: the number means another process there, and must not be matched.
    let pid = unused_pids(1)[0];
    let ns = Namespace::start(&format!(
        "echo {} > /proc/sys/kernel/ns_last_pid\nsleep 600 &",
        pid - 1
    ));
    assert_eq!(ns.sleepers.len(), 1);
    assert_eq!(
        ns.sleepers[0].1, pid,
        "the namespace's sleep took PID {pid}"
    );
    let scenario = Scenario::new(1, &[Holder::fictional(0, pid, "3 GiB")]);
    let runtime = scenario.dir.path().join("run");
    let out = ns.vramctl(scenario.path(), &runtime, &["ps", "--json"]);
    let doc = json(&out);
    assert_eq!(doc["pid_mapping"], "cannot_map", "{doc}");
    assert_eq!(
        rows(&doc),
        BTreeSet::from([(u64::from(pid), Some(u64::from(pid)), 3 * GIB, false)]),
        "{doc}"
    );
    let p = &doc["processes"][0];
    assert!(p["user"].is_null() && p["command"].is_null(), "{p}");
    assert_eq!(doc["gpu_device_holders"], serde_json::json!([]), "{doc}");
    let table = ns.vramctl(scenario.path(), &runtime, &["ps"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains(&format!("host:{pid}")), "{table}");
    assert!(!table.contains("sleep 600"), "{table}");
}

#[test]
fn without_a_daemon_rows_the_driver_numbered_here_are_taken_only_when_each_holds_its_gpu_open() {
    if skip_without_namespaces() {
        return;
    }
    // Driver 580 numbers NVML's rows in the caller's namespace (the H200, 2026-12-05).
    let (ns, holder, idle) = Namespace::with_a_gpu_file_holder();
    let numbered = scenario_on_nvidia0(holder);
    let runtime = numbered.dir.path().join("run");
    let doc = json(&ns.vramctl(numbered.path(), &runtime, &["ps", "--json"]));
    assert_eq!(doc["pid_mapping"], "driver_numbered", "{doc}");
    assert_eq!(
        rows(&doc),
        BTreeSet::from([(u64::from(holder), None, 3 * GIB, true)]),
        "{doc}"
    );
    assert!(
        doc["processes"][0]["command"]
            .as_str()
            .is_some_and(|c| c.starts_with("sleep 600")),
        "its command from its own /proc: {doc}"
    );
    let table = ns.vramctl(numbered.path(), &runtime, &["ps"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(!table.contains("host:"), "{table}");
    assert!(table.contains("PIDs are this namespace's"), "{table}");
    // The same number on a process that holds no GPU's file: not taken, whatever the driver.
    let unheld = scenario_on_nvidia0(idle);
    let runtime = unheld.dir.path().join("run");
    let doc = json(&ns.vramctl(unheld.path(), &runtime, &["ps", "--json"]));
    assert_eq!(doc["pid_mapping"], "cannot_map", "{doc}");
    assert!(doc["processes"][0]["command"].is_null(), "{doc}");
    assert!(
        doc["pid_mapping_reason"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("PID {idle} on GPU 0"))),
        "{doc}"
    );
}

#[test]
fn record_inside_a_namespace_stores_no_command_under_an_unchecked_pid() {
    if skip_without_namespaces() {
        return;
    }
    // `record` observes through the one observer, which checks NVML's rows itself when this
    // /proc is not the host's: a host PID that is also the number of a sleep here is stored
    // with no user or command; the same PID on a process holding the GPU's file is the
    // namespace's own (the driver-580 numbering) and is stored with its command.
    let (ns, holder, idle) = Namespace::with_a_gpu_file_holder();
    for (pid, stored_command) in [(idle, false), (holder, true)] {
        let scenario = scenario_on_nvidia0(pid);
        let runtime = scenario.dir.path().join("run");
        let db = scenario.dir.path().join("inside.db");
        let db_arg = db.to_str().expect("utf-8");
        ns.vramctl(
            scenario.path(),
            &runtime,
            &[
                "--db",
                db_arg,
                "record",
                "--interval",
                "100ms",
                "--duration",
                "1s",
            ],
        );
        let store = vramctl_store::Store::open(&db, vramctl_store::OpenMode::ReadOnly)
            .expect("the recording");
        let stored = store.processes_with_pid(pid).expect("processes");
        assert!(!stored.is_empty(), "PID {pid} recorded");
        for record in &stored {
            assert_eq!(
                record
                    .meta
                    .command
                    .as_deref()
                    .is_some_and(|c| c.starts_with("sleep 600")),
                stored_command,
                "PID {pid}: {:?}",
                record.meta
            );
            if !stored_command {
                assert!(record.meta.user.is_none(), "{:?}", record.meta);
            }
        }
    }
}

#[test]
fn a_caller_neither_root_nor_in_the_group_maps_its_pids_through_the_containers_socket() {
    if skip_without_namespaces() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    // A container whose user is nobody (uid 65534): root's daemon.sock is closed to it
    // (0600 without a vramctl group, 0660 with one it is not in); the containers' socket,
    // open to everyone, answers it with its own namespace's processes only.
    let ns = Namespace::with_sleepers(1);
    let host = crate::real_processes::sleeper();
    let (own, others_pid) = (ns.sleepers[0], host.pid());
    let (portable, runtime, _daemon) = behind_the_containers_socket(own.0, others_pid);
    let mode = |file: &str| {
        std::fs::metadata(runtime.join(file))
            .expect("socket")
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("containers.sock"), 0o666);
    assert_ne!(
        mode("daemon.sock") & 0o006,
        0o006,
        "daemon.sock stays closed"
    );

    let as_nobody = |inside: bool, args: &[&str]| {
        use std::os::unix::process::CommandExt;
        let inner = portable.command();
        let mut cmd = if inside {
            let mut cmd = Command::new("nsenter");
            cmd.args(["--target", &ns.init.to_string(), "--pid", "--mount"])
                .args(["--setuid", "65534", "--setgid", "65534", "--"])
                .arg(inner.get_program());
            cmd
        } else {
            let mut cmd = Command::new(inner.get_program());
            cmd.uid(65534).gid(65534);
            cmd
        };
        cmd.args(args).env_clear();
        for (key, value) in inner.get_envs() {
            if let Some(value) = value {
                cmd.env(key, value);
            }
        }
        cmd.env("VRAMCTL_RUNTIME_DIR", &runtime)
            .env("VRAMCTL_LOG", "vramctl=debug")
            .current_dir("/");
        let out = cmd.output().expect("nsenter");
        assert!(
            out.status.success(),
            "vramctl {args:?} as nobody failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let out = as_nobody(true, &["ps", "--json"]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("containers.sock"), "{log}");
    assert!(log.contains("Answered by the daemon."), "{log}");
    let doc = json(&out);
    assert_eq!(doc["pid_mapping"], "mapped", "{doc}");
    assert_eq!(
        rows(&doc),
        BTreeSet::from([(u64::from(own.1), Some(u64::from(own.0)), 3 * GIB, true)]),
        "{doc}"
    );
    assert_eq!(others(&doc), BTreeMap::from([(0, (1, 7 * GIB))]), "{doc}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(&others_pid.to_string()),
        "the host's PID leaked"
    );

    // Nobody on the host (our PID namespace) gets nothing there: refused, NVML read here.
    let out = as_nobody(false, &["ps", "--json"]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("answers processes in other PID namespaces"),
        "{log}"
    );
    assert!(!log.contains("Answered by the daemon."), "{log}");
    assert_eq!(json(&out)["pid_mapping"], "same");
}

/// The host PID of the process whose PID in the namespace of `ns_init` is `nspid`.
fn host_pid_of(ns_init: u32, nspid: u32) -> Option<u32> {
    let namespace = procinfo::pid_namespace_of(ns_init).ok()?;
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            procinfo::pid_namespace_of(*pid).ok() == Some(namespace)
                && procinfo::read_status(*pid)
                    .is_ok_and(|s| s.nspid.last() == Some(&nspid) && s.nspid.len() == 2)
        })
}

/// `vramctl run --json` inside `ns` on a job that waits until the fake NVML lists it (in
/// its process directory `procs`), as PID `listed_as(host PID, namespace PID)`, holding
/// 3 GiB; the report and the job's (host, namespace) PIDs.
fn run_inside(
    ns: &Namespace,
    scenario: &Path,
    runtime: &Path,
    procs: &Path,
    listed_as: fn(u32, u32) -> u32,
) -> (Value, (u32, u32)) {
    let work = tempfile::tempdir().expect("tempdir");
    let report = work.path().join("report.json");
    let inner = vramctl_std(scenario);
    let mut cmd = Command::new("nsenter");
    cmd.args(["--target", &ns.init.to_string(), "--pid", "--mount", "--"])
        .arg(inner.get_program())
        .args(["run", "--interval", "50ms", "--json", "--report"])
        .arg(&report)
        .args(["--", "sh", "-c"])
        .arg(format!(
            "echo $$ > {dir}/nspid; while [ ! -e {dir}/go ]; do sleep 0.05; done; sleep 1",
            dir = work.path().display()
        ))
        .env_clear();
    for (key, value) in inner.get_envs() {
        if let Some(value) = value {
            cmd.env(key, value);
        }
    }
    cmd.env("VRAMCTL_RUNTIME_DIR", runtime)
        .env("FAKE_NVML_PROCESS_DIR", procs)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("nsenter vramctl run");
    let nspid_file = work.path().join("nspid");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let nspid = loop {
        if let Some(pid) = std::fs::read_to_string(&nspid_file)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
        {
            break pid;
        }
        if std::time::Instant::now() > deadline || child.try_wait().is_ok_and(|s| s.is_some()) {
            let _ = child.kill();
            let out = child.wait_with_output().expect("run");
            panic!(
                "the job never started: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let host = host_pid_of(ns.init, nspid).expect("the job's host PID");
    // The fake NVML's process directory: a file per PID, `GPU BYTES`.
    let listed = listed_as(host, nspid);
    std::fs::write(procs.join(listed.to_string()), format!("0 {}\n", 3 * GIB)).expect("announce");
    std::fs::write(work.path().join("go"), "").expect("go");
    let out = child.wait_with_output().expect("run");
    assert!(
        out.status.success(),
        "run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = std::fs::read(&report).expect("report");
    (
        serde_json::from_slice(&report).expect("JSON report"),
        (host, nspid),
    )
}

#[test]
fn run_inside_a_namespace_follows_its_job_through_the_host_daemon_and_never_guesses() {
    if skip_without_namespaces() {
        return;
    }
    // A sleep keeps the namespace's shell (its PID 1) waiting, so the namespace lives.
    let ns = Namespace::with_sleepers(1);
    let scenario = Scenario::new(1, &[]);
    // A host daemon: the job, listed by NVML under its host PID, is the job's under its
    // PID here.
    let procs = scenario.dir.path().join("procs");
    std::fs::create_dir(&procs).expect("procs dir");
    let runtime = scenario.dir.path().join("run");
    let mut record = vramctl_std(scenario.path());
    record
        .env("FAKE_NVML_PROCESS_DIR", &procs)
        .arg("--db")
        .arg(scenario.dir.path().join("history.db"))
        .args(["record", "--interval", "1s"]);
    let _daemon = Daemon::start(record, &runtime);
    let (report, (_, nspid)) = run_inside(&ns, scenario.path(), &runtime, &procs, |host, _| host);
    assert_eq!(report["pid_mapping"], "mapped", "{report}");
    assert_eq!(report["unmapped_ticks"], 0, "{report}");
    let processes = report["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 1, "{report}");
    assert_eq!(processes[0]["pid"], u64::from(nspid), "{report}");
    assert_eq!(processes[0]["peak_bytes"], 3 * GIB, "{report}");

    // No daemon, and NVML lists a "host PID" that is the job's own number here: another
    // process, as far as anyone here can tell. Nothing is attributed; the report says why.
    let alone = scenario.dir.path().join("no-daemon");
    let others = scenario.dir.path().join("procs-alone");
    std::fs::create_dir(&others).expect("procs dir");
    let (report, _) = run_inside(&ns, scenario.path(), &alone, &others, |_, nspid| nspid);
    assert_eq!(report["pid_mapping"], "cannot_map", "{report}");
    assert!(report["unmapped_ticks"].as_u64() > Some(0), "{report}");
    assert_eq!(report["processes"], serde_json::json!([]), "{report}");
    assert_eq!(report["devices"][0]["peak_bytes"], 0, "{report}");
}

/// The finding `id` of a `doctor --json` document.
fn finding(doc: &Value, id: &str) -> Value {
    doc["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no {id} in {doc}"))
}

#[test]
fn doctor_inside_a_namespace_says_what_it_cannot_see_and_how_to_fix_it() {
    if skip_without_namespaces() {
        return;
    }
    let ns = Namespace::start_with(&["--cgroup"], "sleep 600 &");
    let scenario = Scenario::new(1, &[Holder::real(0, ns.sleepers[0].0, "3 GiB")]);
    let runtime = scenario.dir.path().join("run");
    // No daemon: host PIDs nobody maps, the socket to mount named; a cgroup namespace of
    // its own, owners unreadable.
    let doc = json(&ns.vramctl_any(scenario.path(), &runtime, &["doctor", "--json"]));
    let pid = finding(&doc, "pid_namespace");
    assert_eq!(pid["status"], "warn", "{pid}");
    assert_eq!(pid["facts"]["daemon"]["state"], "no_socket", "{pid}");
    assert!(
        pid["fix"]
            .as_str()
            .is_some_and(|f| f.contains("daemon.sock")),
        "{pid}"
    );
    let cgroup = finding(&doc, "cgroup_namespace");
    assert_eq!(cgroup["status"], "warn", "{cgroup}");

    // With the host daemon answering for the namespace: ok.
    let mut record = vramctl_std(scenario.path());
    record
        .arg("--db")
        .arg(scenario.dir.path().join("history.db"))
        .args(["record", "--interval", "1s"]);
    let _daemon = Daemon::start(record, &runtime);
    let doc = json(&ns.vramctl_any(scenario.path(), &runtime, &["doctor", "--json"]));
    let pid = finding(&doc, "pid_namespace");
    assert_eq!(pid["status"], "ok", "{pid}");
    assert_eq!(pid["facts"]["daemon"]["state"], "mapped", "{pid}");

    // On the host (the tests' own namespace): the PIDs are the host's.
    let host = json(
        &vramctl_std(scenario.path())
            .args(["doctor", "--json"])
            .output()
            .expect("doctor"),
    );
    let pid = finding(&host, "pid_namespace");
    if vramctl_procs::procinfo::PidNamespace::current().proc_shows_host_pids() {
        assert_eq!(pid["status"], "ok", "{pid}");
    }
}

/// `top` inside namespace A, through the host daemon, frame after frame: A's processes
/// under A's PIDs (a process A starts later shows up under its PID too), B's and the
/// host's only as the others' line; when the daemon goes, NVML's PIDs as `host:PID`,
/// never matched against A's /proc, and the kill key refuses them.
#[test]
fn top_inside_a_namespace_shows_its_own_processes_on_every_frame() {
    use crate::top::{skip_without_tmux, table_rows};

    if skip_without_namespaces() || skip_without_tmux() {
        return;
    }
    let a = Namespace::with_sleepers(2);
    let b = Namespace::with_sleepers(2);
    let host = crate::real_processes::sleeper();
    let (a0, a1) = (a.sleepers[0], a.sleepers[1]);
    let (b0, b1) = (b.sleepers[0], b.sleepers[1]);
    let holders = [
        (0, a0.0, "3 GiB"),
        (0, b0.0, "7 GiB"),
        (1, b1.0, "11 GiB"),
        (0, host.pid(), "13 GiB"),
    ];
    let scenario = Scenario::new(
        2,
        &holders.map(|(gpu, pid, bytes)| Holder::real(gpu, pid, bytes)),
    );
    // top's own NVML inside A: the same GPUs and host PIDs (fictional: A's /proc has none
    // of them), read only once the daemon is gone.
    let inside = Scenario::new(
        2,
        &holders.map(|(gpu, pid, bytes)| Holder::fictional(gpu, pid, bytes)),
    );
    // A's second process becomes a GPU process after top started (the fake's process dir).
    let announced = scenario.dir.path().join("procs");
    std::fs::create_dir(&announced).expect("procs dir");
    let runtime = scenario.dir.path().join("run");
    let mut record = vramctl_std(scenario.path());
    record
        .env("FAKE_NVML_PROCESS_DIR", &announced)
        .arg("--db")
        .arg(scenario.dir.path().join("history.db"))
        .args(["record", "--interval", "1s"]);
    let daemon = Daemon::start(record, &runtime);

    let binary = assert_cmd::cargo::cargo_bin("vramctl");
    let script = format!(
        "nsenter --target {} --pid --mount -- env -i PATH=\"$PATH\" TERM=\"$TERM\" \
         VRAMCTL_NVML_LIB='{}' FAKE_NVML_SCENARIO='{}' FAKE_NVML_TIME=0 NO_COLOR=1 \
         XDG_STATE_HOME='{}' VRAMCTL_RUNTIME_DIR='{}' '{}' top --interval 0.2\n\
         echo \"vramctl exited $?\"\nread _\n",
        a.init,
        crate::harness::fake_library().display(),
        inside.path().display(),
        scenario.dir.path().join("state").display(),
        runtime.display(),
        binary.display(),
    );
    let tmux = top_in_tmux(scenario.dir.path(), &script);
    let not_theirs = |screen: &str| {
        for pid in [a0.0, a1.0, b0.0, b1.0, host.pid()] {
            assert!(
                !screen.contains(&pid.to_string()),
                "host PID {pid} on A's screen:\n{screen}"
            );
        }
        for bytes in ["7.0G", "11.0G", "13.0G"] {
            assert!(
                !table_rows(screen).iter().any(|(_, l)| l.contains(bytes)),
                "{screen}"
            );
        }
    };
    let screen = tmux.wait_for("A's first process and the others' line", |s| {
        pids(s) == BTreeSet::from([a0.1]) && s.contains("held by 2 processes of other")
    });
    not_theirs(&screen);
    assert!(
        screen.contains("sleep"),
        "A's command from A's /proc:\n{screen}"
    );
    assert!(
        screen.contains("held by 1 process of other containers"),
        "GPU 1's others:\n{screen}"
    );

    // A later frame: A's second process, under A's PID.
    std::fs::write(announced.join(a1.0.to_string()), format!("1 {}\n", 5 * GIB)).expect("announce");
    let screen = tmux.wait_for("A's second process on a later frame", |s| {
        pids(s) == BTreeSet::from([a0.1, a1.1])
    });
    not_theirs(&screen);

    // The daemon goes: top reads NVML in A, whose PIDs are the host's and unmapped.
    daemon.stop();
    let host_a0 = format!("host:{}", a0.0);
    let screen = tmux.wait_for("host PIDs once the daemon is gone", |s| {
        s.contains(&host_a0)
    });
    assert!(
        !screen.contains("sleep 600"),
        "a host PID matched A's /proc:\n{screen}"
    );
    assert!(
        !screen.contains("held by"),
        "no others' line without a mapping:\n{screen}"
    );
    tmux.keys(&["K"]);
    let screen = tmux.wait_for("the kill key refused", |s| {
        s.contains("cannot be mapped here")
    });
    assert!(
        !screen.contains(" kill: ") && !screen.contains("kill this process"),
        "{screen}"
    );
    tmux.keys(&["q"]);
    let screen = tmux.wait_for("top to exit", |s| s.contains("vramctl exited"));
    assert!(screen.contains("vramctl exited 0"), "{screen}");
}

#[test]
fn top_as_a_user_neither_root_nor_in_the_group_shows_its_namespace_through_the_containers_socket() {
    use crate::top::{skip_without_tmux, table_rows};
    use std::os::unix::fs::PermissionsExt;

    if skip_without_namespaces() || skip_without_tmux() {
        return;
    }
    // ps as uid 65534 is tested above; top asks the same socket through its own live loop,
    // every frame, so it gets its own check: the namespace's process under its PID there,
    // the host's only as the others' line, on a later frame as on the first.
    let ns = Namespace::with_sleepers(1);
    let host = crate::real_processes::sleeper();
    let own = ns.sleepers[0];
    let (portable, runtime, _daemon) = behind_the_containers_socket(own.0, host.pid());
    // top keeps its state (the zoom, the sort) where uid 65534 may write.
    let state = portable.dir.path().join("state");
    std::fs::create_dir(&state).expect("state dir");
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).expect("chmod");

    let inner = portable.command();
    let env: Vec<String> = inner
        .get_envs()
        .filter_map(|(k, v)| Some(format!("{}='{}'", k.to_str()?, v?.to_str()?)))
        .collect();
    let script = format!(
        "cd / && nsenter --target {} --pid --mount --setuid 65534 --setgid 65534 -- \
         env -i TERM=\"$TERM\" {} XDG_STATE_HOME='{}' VRAMCTL_RUNTIME_DIR='{}' '{}' top --interval 0.2\n\
         echo \"vramctl exited $?\"\nread _\n",
        ns.init,
        env.join(" "),
        state.display(),
        runtime.display(),
        inner.get_program().to_string_lossy(),
    );
    let tmux = top_in_tmux(portable.dir.path(), &script);
    let ours =
        |s: &str| pids(s) == BTreeSet::from([own.1]) && s.contains("held by 1 process of other");
    tmux.wait_for("its own process, the others as one line", ours);
    // Five frames later (0.2 s each), still so: every frame asks the socket again.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let screen = tmux.wait_for("the same on a later frame", ours);
    for pid in [own.0, host.pid()] {
        assert!(
            !screen.contains(&pid.to_string()),
            "host PID {pid} on the screen:\n{screen}"
        );
    }
    assert!(
        !table_rows(&screen).iter().any(|(_, l)| l.contains("7.0G")),
        "the host's process as a row:\n{screen}"
    );
    assert!(screen.contains("sleep"), "its command:\n{screen}");
}

/// `script` (a shell script that starts `top`) run in a 120×40 tmux session in `dir`.
fn top_in_tmux(dir: &Path, script: &str) -> crate::top::Tmux {
    let script_path = dir.join("top.sh");
    std::fs::write(&script_path, script).expect("write script");
    crate::top::Tmux::start(dir, &format!("sh '{}'", script_path.display()), 120, 40)
}

/// The PIDs of the table's rows on a `top` screen.
fn pids(screen: &str) -> BTreeSet<u32> {
    crate::top::table_rows(screen)
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

/// One GPU where `own` (a process of a namespace, by its host PID) holds 3 GiB and `other`
/// 7 GiB, copied where uid 65534 may run it ([`crate::harness::Portable`]), and a host
/// `record --containers-socket` answering in the returned runtime directory.
fn behind_the_containers_socket(
    own: u32,
    other: u32,
) -> (crate::harness::Portable, std::path::PathBuf, Daemon) {
    let scenario = Scenario::new(
        1,
        &[
            Holder::real(0, own, "3 GiB"),
            Holder::real(0, other, "7 GiB"),
        ],
    );
    let portable = crate::harness::Portable::new(scenario.path());
    let runtime = portable.dir.path().join("run");
    let mut record = portable.command();
    record
        .arg("--db")
        .arg(portable.dir.path().join("history.db"))
        .args(["record", "--interval", "1s", "--containers-socket"]);
    let daemon = Daemon::start(record, &runtime);
    (portable, runtime, daemon)
}
