//! The DRM backend through the binary (issue 20): `--backend nvml|drm|all` on the fake
//! NVML beside the `testdata/drm/` trees, every command that reads GPUs on AMD and Intel
//! devices, and what is reported instead of left out.

use serde_json::Value;

use crate::harness::{Portable, drm_fixture, json_of, scenario, stdout_of, vramctl_on};
use crate::real_processes::is_root;

fn pids(device: &Value) -> Vec<u64> {
    let mut pids: Vec<u64> = device["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .map(|p| p["pid"].as_u64().expect("pid"))
        .collect();
    pids.sort_unstable();
    pids
}

fn uuids(report: &Value) -> Vec<(u64, String)> {
    report["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| {
            (
                d["index"].as_u64().expect("index"),
                d["uuid"].as_str().expect("uuid").to_owned(),
            )
        })
        .collect()
}

#[test]
fn all_shows_an_nvidia_gpu_beside_an_integrated_intel_one() {
    let report = json_of(
        vramctl_on("h200-idle.toml")
            .env("VRAMCTL_DRM_ROOT", drm_fixture("i915"))
            .args(["status", "--json"]),
    );
    let ids = uuids(&report);
    assert_eq!(ids.len(), 2, "{ids:?}");
    // NVML's GPU keeps index 0; the DRM one follows.
    assert!(ids[0].1.starts_with("GPU-"), "{ids:?}");
    assert_eq!(ids[1], (1, "PCI-8086-0000:00:02.0".to_owned()));
    let intel = &report["devices"][1];
    assert_eq!(intel["name"], "TigerLake-LP GT2 [Iris Xe Graphics]");
    assert_eq!(intel["memory"], Value::Null);
    assert_eq!(intel["missing"]["memory"], "not supported");
    assert_eq!(pids(intel), [6100, 7296]);
}

#[test]
fn backend_nvml_and_drm_each_show_only_their_own() {
    let nvml = json_of(
        vramctl_on("h200-idle.toml")
            .env("VRAMCTL_DRM_ROOT", drm_fixture("i915"))
            .args(["--backend", "nvml", "status", "--json"]),
    );
    assert_eq!(uuids(&nvml).len(), 1);
    assert!(uuids(&nvml)[0].1.starts_with("GPU-"));
    let drm = json_of(
        vramctl_on("h200-idle.toml")
            .env("VRAMCTL_DRM_ROOT", drm_fixture("i915"))
            .args(["status", "--backend", "drm", "--json"]),
    );
    assert_eq!(uuids(&drm), [(0, "PCI-8086-0000:00:02.0".to_owned())]);
}

#[test]
fn all_without_an_nvidia_driver_still_reads_the_drm_gpus() {
    let report = json_of(
        vramctl_on("h200-idle.toml")
            .env("VRAMCTL_DRM_ROOT", drm_fixture("amdgpu-dgpu"))
            .args([
                "status",
                "--json",
                "--nvml-lib",
                "/nonexistent/libnvidia-ml.so.1",
            ]),
    );
    // The ASPEED BMC card of the tree is not a GPU to show.
    assert_eq!(uuids(&report), [(0, "PCI-1002-0000:04:00.0".to_owned())]);
    let amd = &report["devices"][0];
    assert_eq!(amd["memory"]["total_bytes"], 17_163_091_968_u64);
    assert_eq!(amd["utilization_gpu_percent"], 97);
    assert_eq!(amd["temperature_c"], 46);
    assert_eq!(
        pids(amd),
        [2217, 4100],
        "the fork's shared client counted once"
    );
    assert_eq!(report["driver"]["driver_version"], "6.8.0-51-generic");
}

#[test]
fn no_driver_and_no_drm_gpu_is_still_exit_3() {
    let out = vramctl_on("h200-idle.toml")
        .args(["status", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot load the NVML library"));
}

#[test]
fn backend_drm_without_a_drm_gpu_is_exit_3_with_a_hint() {
    let out = vramctl_on("h200-idle.toml")
        .args(["--backend", "drm", "status"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no AMD or Intel GPU found in '") && err.contains("--backend nvml"),
        "{err}"
    );
}

#[test]
fn status_text_names_what_it_could_not_read() {
    let text = stdout_of(
        vramctl_on("h200-idle.toml")
            .env("VRAMCTL_DRM_ROOT", drm_fixture("xe"))
            .args(["--backend", "drm", "status", "--no-daemon"]),
    );
    assert!(text.contains("DG2 [Arc A770 Graphics]"), "{text}");
    assert!(text.contains("ignored 3 fdinfo line(s)"), "{text}");
    assert!(text.contains("memory  not reported"), "{text}");
}

#[test]
fn processes_of_other_users_are_counted_not_hidden() {
    if !is_root() {
        eprintln!("skipped: only root can run vramctl as another uid");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let portable = Portable::new(&scenario("h200-idle.toml"));
    let root = portable.dir.path().join("drm");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(drm_fixture("xe"))
        .arg(&root)
        .status()
        .expect("cp");
    assert!(status.success());
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // Like /proc/PID/fd of a process of root seen by another user.
    std::fs::set_permissions(
        root.join("proc/8300/fd"),
        std::fs::Permissions::from_mode(0o700),
    )
    .expect("chmod");
    let out = portable
        .command()
        .env("VRAMCTL_DRM_ROOT", &root)
        .args(["--backend", "drm", "status", "--json"])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let device = &report["devices"][0];
    assert_eq!(pids(device), [8100, 8200]);
    let dropped = device["dropped"].to_string();
    assert!(
        dropped.contains("\"1 process\"") && dropped.contains("permission denied"),
        "{dropped}"
    );
}

#[test]
fn ps_and_info_read_drm_devices() {
    let ps = json_of(
        vramctl_on("h200-idle.toml")
            .env("VRAMCTL_DRM_ROOT", drm_fixture("amdgpu-dgpu"))
            .args(["--backend", "drm", "ps", "--json"]),
    );
    let text = ps.to_string();
    assert!(text.contains("4100") && text.contains("2217"), "{text}");
    let info = json_of(
        vramctl_on("h200-idle.toml")
            .env("VRAMCTL_DRM_ROOT", drm_fixture("amdgpu-dgpu"))
            .args(["--backend", "drm", "info", "--json"]),
    );
    let text = info.to_string();
    assert!(text.contains("113-D4120100-100"), "vbios: {text}");
    assert!(text.contains("PCI-1002-0000:04:00.0"), "{text}");
    assert_eq!(
        info["devices"][0]["amdgpu_memory_bytes"]["gtt_used"],
        1_051_754_496_u64
    );
    let text = stdout_of(
        vramctl_on("h200-idle.toml")
            .env("VRAMCTL_DRM_ROOT", drm_fixture("amdgpu-dgpu"))
            .args(["--backend", "drm", "info"]),
    );
    assert!(
        text.contains("GTT") && text.contains("1003.0 MiB used of"),
        "{text}"
    );
}

#[test]
fn record_history_and_leaks_keep_a_drm_gpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("h.db");
    let out = vramctl_on("h200-idle.toml")
        .env("VRAMCTL_DRM_ROOT", drm_fixture("amdgpu-dgpu"))
        .arg("--db")
        .arg(&db)
        .args([
            "--backend",
            "drm",
            "record",
            "--interval",
            "1s",
            "--ticks",
            "3",
        ])
        .args(["--simulated-clock", "1700000000000"])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let history = json_of(
        vramctl_on("h200-idle.toml")
            .arg("--db")
            .arg(&db)
            .args(["history", "--since", "all", "--format", "json"]),
    );
    let text = history.to_string();
    assert!(text.contains("PCI-1002-0000:04:00.0"), "{text}");
    assert!(text.contains("1386127360"), "used bytes recorded: {text}");
    // The leak scan reads the DRM GPU's processes from the history like NVML's.
    let leaks = json_of(
        vramctl_on("h200-idle.toml")
            .arg("--db")
            .arg(&db)
            .args(["leaks", "--since", "all", "--json", "--tz", "UTC"]),
    );
    let series = leaks["series"].as_array().expect("series");
    let mut pids: Vec<u64> = series
        .iter()
        .filter(|s| s["gpu_uuid"] == "PCI-1002-0000:04:00.0")
        .map(|s| s["pid"].as_u64().expect("pid"))
        .collect();
    pids.sort_unstable();
    assert_eq!(pids, [2217, 4100], "{leaks}");
}
