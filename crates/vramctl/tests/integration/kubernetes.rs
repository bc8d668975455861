//! Kubernetes pods on GPU processes: a real process in a real cgroup named as the kubelet
//! names a pod's (`/kubepods/besteffort/pod<uid>/<container id>`), the kubelet's pod log
//! directory (`VRAMCTL_POD_LOG_DIR`) naming that UID, and the pod-resources API answered by
//! a server generated from the official proto (`vramctl_kube::test_kubelet`: the only test
//! double, since no kubelet runs here) on a socket `VRAMCTL_KUBELET_SOCKET` names. `ps` and
//! `status` must name the pod and container of the pod's process, none for a host process
//! on the same GPU, and each GPU's holders, including a GPU whose pod's processes are not
//! visible at all.
//!
//! Needs root (a cgroup is made and a process moved into it); without it the test says so
//! and passes, unless `VRAMCTL_TEST_STRICT=1`.

use std::path::{Path, PathBuf};

use vramctl_kube::podresources_v1::{ContainerDevices, ContainerResources, PodResources};
use vramctl_kube::test_kubelet::{Behaviour, TestKubelet};

use crate::harness::{json_of, vramctl};
use crate::real_processes::{Holder, Scenario, is_root, sleeper};

const POD_UID: &str = "3a0d7f52-9c1e-4b6d-8e2f-5a7b9c0d1e2f";
const CONTAINER_ID: &str = "4f3c2b1a0f9e8d7c6b5a49382716f5e4d3c2b1a0f9e8d7c6b5a49382716f5e4d";

fn gpu_uuid(gpu: usize) -> String {
    format!("GPU-0000000{gpu}-1111-2222-3333-444444444444")
}

/// A cgroup made for the test, removed (after its process is gone) when dropped.
struct PodCgroup {
    created: Vec<PathBuf>,
}

impl PodCgroup {
    /// `/kubepods/besteffort/pod<uid>/<id>` in a hierarchy this machine lets root write:
    /// the v2 root, else cgroup v1's `pids`, else the hybrid layout's `unified`.
    fn make() -> Option<PodCgroup> {
        let root = [
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/pids",
            "/sys/fs/cgroup/unified",
        ]
        .into_iter()
        .map(Path::new)
        .find(|p| p.join("cgroup.procs").exists())?;
        let mut created = Vec::new();
        let mut dir = root.to_path_buf();
        for part in [
            "kubepods".to_string(),
            "besteffort".to_string(),
            format!("pod{POD_UID}"),
            CONTAINER_ID.to_string(),
        ] {
            dir.push(part);
            if !dir.exists() {
                std::fs::create_dir(&dir).ok()?;
                created.push(dir.clone());
            }
        }
        Some(PodCgroup { created })
    }

    fn enter(&self, pid: u32) {
        let leaf = self.created.last().expect("the leaf was created");
        std::fs::write(leaf.join("cgroup.procs"), pid.to_string()).expect("move into the cgroup");
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        for dir in self.created.iter().rev() {
            // A cgroup goes once its last process has exited; retry briefly.
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

fn container(name: &str, gpu_uuids: &[String]) -> ContainerResources {
    ContainerResources {
        name: name.into(),
        devices: vec![ContainerDevices {
            resource_name: "nvidia.com/gpu".into(),
            device_ids: gpu_uuids.to_vec(),
            topology: None,
        }],
        ..Default::default()
    }
}

fn skip(why: &str) -> bool {
    if std::env::var("VRAMCTL_TEST_STRICT").is_ok_and(|v| v == "1") {
        panic!("{why} (VRAMCTL_TEST_STRICT=1)");
    }
    eprintln!("skipped: {why}");
    true
}

#[test]
fn ps_and_status_name_the_pod_of_a_process_and_the_pods_of_each_gpu() {
    if !is_root() && skip("needs root to make a cgroup") {
        return;
    }
    let Some(cgroup) = PodCgroup::make() else {
        assert!(skip("no writable cgroup hierarchy"));
        return;
    };
    let in_pod = sleeper();
    cgroup.enter(in_pod.pid());
    let on_host = sleeper();
    let scenario = Scenario::new(
        2,
        &[
            Holder::real(0, in_pod.pid(), "2 GiB"),
            Holder::real(0, on_host.pid(), "1 GiB"),
        ],
    );
    let kube = tempfile::tempdir().expect("tempdir");
    let logs = kube.path().join("pods");
    std::fs::create_dir_all(logs.join(format!("ml_train-0_{POD_UID}"))).expect("pod log dir");
    let kubelet = TestKubelet::start(
        &kube.path().join("kubelet.sock"),
        vec![
            PodResources {
                name: "train-0".into(),
                namespace: "ml".into(),
                containers: vec![
                    container("trainer", &[gpu_uuid(0)]),
                    container("sidecar", &[]),
                ],
                ..Default::default()
            },
            PodResources {
                name: "infer".into(),
                namespace: "serving".into(),
                containers: vec![container("server", &[gpu_uuid(1)])],
                ..Default::default()
            },
        ],
        Behaviour::Answer,
    )
    .expect("test kubelet");
    let run = |args: &[&str]| {
        json_of(
            vramctl(&scenario.path)
                .env("VRAMCTL_KUBELET_SOCKET", kubelet.socket())
                .env("VRAMCTL_POD_LOG_DIR", &logs)
                .args(args),
        )
    };

    let ps = run(&["ps", "--json", "--no-daemon"]);
    let processes = ps["processes"].as_array().expect("processes");
    let of = |pid: u32| {
        processes
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} in {ps}"))
    };
    assert_eq!(
        of(in_pod.pid())["kubernetes"],
        serde_json::json!({
            "namespace": "ml", "pod": "train-0", "container": "trainer", "pod_uid": POD_UID
        }),
        "{ps}"
    );
    assert!(of(on_host.pid()).get("kubernetes").is_none(), "{ps}");

    let status = run(&["status", "--json", "--no-daemon"]);
    let devices = status["devices"].as_array().expect("devices");
    assert_eq!(
        devices[0]["allocated_to"],
        serde_json::json!([{"namespace": "ml", "pod": "train-0", "container": "trainer"}]),
        "{status}"
    );
    // GPU 1 holds no visible process; its pod is still said.
    assert_eq!(
        devices[1]["allocated_to"],
        serde_json::json!([{"namespace": "serving", "pod": "infer", "container": "server"}]),
        "{status}"
    );

    // The tables name the pod as namespace/name: ps in its POD column, status in one it
    // has only when a process is in a named pod; the host process shows "-".
    let text = |args: &[&str]| {
        crate::harness::stdout_of(
            vramctl(&scenario.path)
                .env("VRAMCTL_KUBELET_SOCKET", kubelet.socket())
                .env("VRAMCTL_POD_LOG_DIR", &logs)
                .env("COLUMNS", "250")
                .args(args),
        )
    };
    for args in [["ps", "--no-daemon"], ["status", "--no-daemon"]] {
        let out = text(&args);
        let row = |pid: u32| {
            out.lines()
                .find(|l| l.split_whitespace().next() == Some(pid.to_string().as_str()))
                .unwrap_or_else(|| panic!("{args:?}: no row for {pid}:\n{out}"))
                .to_owned()
        };
        assert!(out.lines().any(|l| l.contains(" POD ")), "{args:?}:\n{out}");
        assert!(
            row(in_pod.pid())
                .split_whitespace()
                .any(|w| w == "ml/train-0"),
            "{args:?}:\n{out}"
        );
        assert!(
            !row(on_host.pid()).contains("ml/train-0"),
            "{args:?}:\n{out}"
        );
    }

    // Without the kubelet's socket and log directory, nothing changes in the output.
    let plain = json_of(
        vramctl(&scenario.path)
            .env("VRAMCTL_KUBELET_SOCKET", kube.path().join("absent.sock"))
            .env("VRAMCTL_POD_LOG_DIR", kube.path().join("absent"))
            .args(["ps", "--json", "--no-daemon"]),
    );
    assert!(!plain.to_string().contains("kubernetes"), "{plain}");

    // kill --pod (with --container by the id's first 12 digits): the pod's process only,
    // through kill's safe path; the host process on the same GPU keeps running.
    let kill = |args: &[&str]| {
        let out = crate::harness::vramctl_std(&scenario.path)
            .env("VRAMCTL_KUBELET_SOCKET", kubelet.socket())
            .env("VRAMCTL_POD_LOG_DIR", &logs)
            .env("VRAMCTL_DB", scenario.db())
            .stdin(std::process::Stdio::null())
            .args(["kill", "--json"])
            .args(args)
            .output()
            .expect("run vramctl kill");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), report)
    };
    let (code, plan) = kill(&[
        "--pod",
        "ml/train-0",
        "--container",
        &CONTAINER_ID[..12],
        "--dry-run",
    ]);
    assert_eq!(code, Some(0), "{plan:#}");
    let planned: Vec<&serde_json::Value> = plan["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .map(|t| &t["pid"])
        .collect();
    assert_eq!(planned, [&serde_json::json!(in_pod.pid())], "{plan:#}");
    let (code, report) = kill(&["--pod", "ml/train-0", "--yes"]);
    assert_eq!(code, Some(0), "{report:#}");
    assert!(
        crate::real_processes::ends(in_pod.pid()),
        "the pod's process ended"
    );
    assert!(on_host.alive(), "the host process is left alone");
    let (code, _) = kill(&["--pod", "serving/infer", "--yes"]);
    assert_eq!(
        code,
        Some(1),
        "a pod with no visible process: nothing to kill"
    );

    // The processes end before their cgroup is removed.
    drop(in_pod);
    drop(on_host);
    drop(cgroup);
}
