//! `vramctl doctor` against fake scenarios, recorded kernel logs and fake Python
//! environments (`testdata/doctor/`): every check's ok, warn and fail.
//!
//! Some checks judge the machine the tests run on and are left out of the snapshots and
//! the exit-code expectations: `container`, `pid_namespace`, `cgroup_namespace` (a CI
//! runner may be a container), `mig_devices` (whether it has `/dev/nvidia-caps`) and
//! `process_visibility` (root or not); their outcomes are unit-tested on hand-built facts,
//! and `pid_namespace`/`cgroup_namespace` in real namespaces (`namespaces.rs`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::harness::{self, vramctl_on};

/// The checks whose outcome depends on the machine running the tests.
const HOST_DEPENDENT: &[&str] = &[
    "container",
    "pid_namespace",
    "cgroup_namespace",
    "mig_devices",
    "process_visibility",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `doctor` on a scenario, run from the workspace root so that the fixture paths it prints
/// are the same everywhere, with a recorded kernel log and named Python environments.
fn doctor(scenario: &str, kernel_log: &str, python: &[&str]) -> assert_cmd::Command {
    let mut cmd = vramctl_on(scenario);
    cmd.current_dir(root()).arg("doctor").args([
        "--kernel-log",
        &format!("testdata/doctor/kernel-log/{kernel_log}"),
    ]);
    for p in python {
        cmd.args(["--python", &format!("testdata/doctor/python/{p}")]);
    }
    cmd
}

struct Run {
    code: i32,
    report: Value,
}

fn json_run(mut cmd: assert_cmd::Command) -> Run {
    let output = cmd.arg("--json").output().expect("run vramctl");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    Run {
        code: output.status.code().expect("exit code"),
        report,
    }
}

/// The status of check `id` on `subject` (`host`, `GPU 0`, a path).
fn status(report: &Value, id: &str, subject: &str) -> String {
    finding(report, id, subject)["status"]
        .as_str()
        .expect("status")
        .to_owned()
}

fn finding<'a>(report: &'a Value, id: &str, subject: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| {
            c["id"] == id
                && c["subject"]
                    .as_str()
                    .is_some_and(|s| s.starts_with(subject))
        })
        .unwrap_or_else(|| panic!("no {id} on {subject} in {report:#}"))
}

/// 1 when a check fails, else 0, not counting the host-dependent ones (whose failing
/// makes it 1 either way).
fn expected_code(report: &Value, judged_fail: bool) -> i32 {
    let host_fail = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .any(|c| HOST_DEPENDENT.contains(&c["id"].as_str().unwrap_or("")) && c["status"] == "fail");
    i32::from(judged_fail || host_fail)
}

/// The report without what varies between machines and runs.
fn stable(report: &Value) -> Value {
    let mut report = report.clone();
    report["elapsed_ms"] = Value::from("[ELAPSED]");
    report["counts"] = Value::from("[COUNTS]");
    let checks = report["checks"].as_array_mut().expect("checks");
    checks.retain(|c| !HOST_DEPENDENT.contains(&c["id"].as_str().unwrap_or("")));
    // /proc/driver/nvidia/version of the machine running the tests, if it has a driver.
    for check in checks.iter_mut() {
        if let Some(v) = check["facts"].get_mut("kernel_module_version") {
            if !v.is_null() {
                *v = Value::from("[HOST]");
            }
        }
    }
    report
}

fn table_settings() -> insta::Settings {
    let mut settings = harness::redactions();
    settings.add_filter(
        r"(?m)^\S+ +(container|pid_namespace|cgroup_namespace|mig_devices|process_visibility) .*\n( {9}fix: .*\n)?",
        "",
    );
    settings.add_filter(r"(?m)^\d+ fail, \d+ warn, \d+ ok, \d+ skipped", "[COUNTS]");
    settings
}

#[test]
fn doctor_on_an_idle_h200_passes_every_check_it_can_judge() {
    let run = json_run(doctor("h200-idle.toml", "no-xid.txt", &["cu130"]));
    let r = &run.report;
    assert_eq!(r["schema"], 1);
    assert_eq!(r["driver_usable"], true);
    for (id, subject) in [
        ("driver", "host"),
        ("frameworks", "testdata/doctor/python/cu130"),
        ("visible_devices", "host"),
        ("kernel_log", "host"),
        ("unaccounted_memory", "GPU 0"),
        ("ecc", "GPU 0"),
        ("remapped_rows", "GPU 0"),
        ("recovery_action", "GPU 0"),
        ("pcie_link", "GPU 0"),
        ("clock_events", "GPU 0"),
        ("temperature", "GPU 0"),
        ("persistence", "GPU 0"),
        ("compute_mode", "GPU 0"),
        ("mig", "GPU 0"),
    ] {
        assert_eq!(status(r, id, subject), "ok", "{id} on {subject}");
    }
    // Hopper has no page retirement: not supported is skipped, never 0 pages.
    let retired = finding(r, "retired_pages", "GPU 0");
    assert_eq!(retired["status"], "skipped");
    assert!(retired["facts"].get("double_bit").is_none(), "{retired:#}");
    assert_eq!(run.code, expected_code(r, false));
    // The versions are NVML's, as nvidia-smi prints them.
    let driver = finding(r, "driver", "host");
    assert_eq!(driver["facts"]["driver_version"], "580.159.04");
    assert_eq!(driver["facts"]["cuda_driver_version"], "13.0");
    insta::with_settings!({prepend_module_to_snapshot => false}, {
        insta::assert_json_snapshot!("doctor_h200_idle_json", stable(r));
    });
}

#[test]
fn every_check_json_has_id_status_summary_facts_and_fix() {
    let run = json_run(doctor("doctor-warn.toml", "dmesg.txt", &["cu128"]));
    for check in run.report["checks"].as_array().expect("checks") {
        for key in ["id", "subject", "gpu", "status", "summary", "facts", "fix"] {
            assert!(check.get(key).is_some(), "{key} missing in {check:#}");
        }
        let status = check["status"].as_str().expect("status");
        assert!(
            ["ok", "warn", "fail", "skipped"].contains(&status),
            "{check:#}"
        );
        // A finding that is not ok says what to do.
        if status == "warn" || status == "fail" {
            assert!(check["fix"].is_string(), "{check:#}");
        }
    }
}

#[test]
fn doctor_warn_scenario_warns_on_every_check_it_degrades() {
    let run = json_run(doctor("doctor-warn.toml", "dmesg.txt", &["cu128"]));
    let r = &run.report;
    for (id, subject) in [
        ("frameworks", "testdata/doctor/python/cu128"),
        ("kernel_log", "host"),
        ("unaccounted_memory", "GPU 0"),
        ("ecc", "GPU 0"),
        ("remapped_rows", "GPU 0"),
        ("recovery_action", "GPU 0"),
        ("pcie_link", "GPU 0"),
        ("clock_events", "GPU 0"),
        ("temperature", "GPU 0"),
        ("persistence", "GPU 0"),
        ("compute_mode", "GPU 0"),
        ("mig", "GPU 0"),
        ("retired_pages", "GPU 1"),
    ] {
        assert_eq!(status(r, id, subject), "warn", "{id} on {subject}");
    }
    assert_eq!(run.code, expected_code(r, false));
    // The Volta of the scenario has no recovery action field: skipped, not "none needed".
    assert_eq!(status(r, "recovery_action", "GPU 1"), "skipped");
    let remap = finding(r, "remapped_rows", "GPU 0");
    assert!(
        remap["fix"]
            .as_str()
            .is_some_and(|f| f.contains("a GPU reset is needed")),
        "{remap:#}"
    );
    let unaccounted = finding(r, "unaccounted_memory", "GPU 0");
    assert_eq!(unaccounted["facts"]["unaccounted_bytes"], 4_u64 << 30);
    let xids = &finding(r, "kernel_log", "host")["facts"]["events"];
    let codes: Vec<u64> = xids
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["code"].as_u64().expect("code"))
        .collect();
    assert_eq!(codes, [119, 94, 63, 154]);
    assert_eq!(xids[3]["recovery_action"], "GPU Reset Required");
}

#[test]
fn doctor_fail_scenario_fails_each_check_and_exits_1() {
    let mut cmd = doctor("doctor-fail.toml", "journal.txt", &["cu130"]);
    let run = json_run(doctor("doctor-fail.toml", "journal.txt", &["cu130"]));
    let r = &run.report;
    for (id, subject) in [
        ("frameworks", "testdata/doctor/python/cu130"),
        ("kernel_log", "host"),
        ("ecc", "GPU 0"),
        ("remapped_rows", "GPU 0"),
        ("recovery_action", "GPU 0"),
        ("clock_events", "GPU 0"),
        ("temperature", "GPU 0"),
        ("compute_mode", "GPU 0"),
    ] {
        assert_eq!(status(r, id, subject), "fail", "{id} on {subject}");
    }
    assert_eq!(run.code, 1);
    let frameworks = finding(r, "frameworks", "testdata/doctor/python/cu130");
    let summary = frameworks["summary"].as_str().expect("summary");
    assert!(
        summary.contains("torch 2.9.0+cu130 (CUDA 13.0)"),
        "{summary}"
    );
    assert!(summary.contains("supports CUDA 12.8"), "{summary}");
    assert!(
        frameworks["fix"]
            .as_str()
            .is_some_and(|f| f.contains("580 or newer")),
        "{frameworks:#}"
    );
    let output = cmd.output().expect("run");
    assert_eq!(output.status.code(), Some(1));
    let table = String::from_utf8(output.stdout).expect("utf-8");
    table_settings().bind(|| {
        insta::assert_snapshot!("doctor_fail_table", table);
    });
}

#[test]
fn a_framework_built_for_the_drivers_cuda_runs_and_a_newer_minor_warns() {
    // CUDA 13.0 driver: cu128 and cu130 both run.
    let run = json_run(doctor("h200-idle.toml", "no-xid.txt", &["cu128", "cu130"]));
    assert_eq!(
        status(&run.report, "frameworks", "testdata/doctor/python/cu128"),
        "ok"
    );
    // CUDA 12.8 driver: cu128 runs, cu130 does not.
    let run = json_run(doctor(
        "doctor-fail.toml",
        "no-xid.txt",
        &["cu128", "cu130"],
    ));
    assert_eq!(
        status(&run.report, "frameworks", "testdata/doctor/python/cu128"),
        "ok"
    );
    assert_eq!(
        status(&run.report, "frameworks", "testdata/doctor/python/cu130"),
        "fail"
    );
    // A CPU build of torch has no CUDA to judge.
    let run = json_run(doctor(
        "h200-idle.toml",
        "no-xid.txt",
        &["cpu/site-packages"],
    ));
    let cpu = finding(&run.report, "frameworks", "testdata/doctor/python/cpu");
    assert_eq!(cpu["status"], "ok");
    assert!(
        cpu["summary"]
            .as_str()
            .is_some_and(|s| s.contains("CPU build"))
    );
}

#[test]
fn without_a_driver_doctor_exits_3_with_the_reason_and_still_checks_the_rest() {
    for (scenario, words) in [
        (
            "fault-driver-not-loaded.toml",
            "kernel module is not loaded",
        ),
        ("fault-version-mismatch.toml", "different versions"),
    ] {
        let run = json_run(doctor(scenario, "journal.txt", &["cu130"]));
        let r = &run.report;
        assert_eq!(run.code, 3, "{scenario}");
        assert_eq!(r["driver_usable"], false);
        let driver = finding(r, "driver", "host");
        assert_eq!(driver["status"], "fail");
        assert!(
            driver["summary"]
                .as_str()
                .is_some_and(|s| s.contains(words)),
            "{scenario}: {driver:#}"
        );
        assert!(driver["fix"].is_string());
        // What needs no driver is still judged, or listed: the wheels, the Xids.
        assert_eq!(status(r, "kernel_log", "host"), "fail");
        let frameworks = finding(r, "frameworks", "testdata/doctor/python/cu130");
        assert_eq!(frameworks["status"], "skipped");
        assert!(
            frameworks["summary"]
                .as_str()
                .is_some_and(|s| s.contains("torch 2.9.0+cu130 (CUDA 13.0)"))
        );
        assert!(
            r["checks"]
                .as_array()
                .expect("checks")
                .iter()
                .all(|c| c["gpu"].is_null())
        );
    }
    // No library at all.
    let mut cmd = doctor("h200-idle.toml", "no-xid.txt", &[]);
    cmd.env("VRAMCTL_NVML_LIB", "/nonexistent/libnvidia-ml.so.1");
    let run = json_run(cmd);
    assert_eq!(run.code, 3);
    let driver = finding(&run.report, "driver", "host");
    assert_eq!(driver["facts"]["code"], "library_not_loaded");
    assert!(
        driver["summary"]
            .as_str()
            .is_some_and(|s| s.contains("NVML library cannot be loaded")),
        "{driver:#}"
    );
}

#[test]
fn no_driver_table_prints_the_checks_that_need_none() {
    let output = doctor("fault-driver-not-loaded.toml", "dmesg.txt", &["cu128"])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(3));
    let table = String::from_utf8(output.stdout).expect("utf-8");
    table_settings().bind(|| {
        insta::assert_snapshot!("doctor_no_driver_table", table);
    });
}

#[test]
fn cuda_visible_devices_naming_no_gpu_fails_and_hiding_the_asked_gpu_warns() {
    let visible = |value: &str, extra: &[&str]| {
        let mut cmd = doctor("doctor-warn.toml", "no-xid.txt", &[]);
        cmd.env("CUDA_VISIBLE_DEVICES", value).args(extra);
        let run = json_run(cmd);
        finding(&run.report, "visible_devices", "host").clone()
    };
    let none = visible("7", &[]);
    assert_eq!(none["status"], "fail");
    assert!(
        none["summary"]
            .as_str()
            .is_some_and(|s| s.contains("'7' names no GPU"))
    );
    assert_eq!(visible("", &[])["status"], "fail");
    let partial = visible("1,7,0", &[]);
    assert_eq!(partial["status"], "warn");
    assert_eq!(partial["facts"]["cuda_sees"], serde_json::json!([1]));
    // Indices on two different models: CUDA's order is fastest first.
    assert_eq!(visible("0,1", &[])["status"], "warn");
    let by_uuid = visible("GPU-7778da7f", &[]);
    assert_eq!(by_uuid["status"], "ok");
    let hidden = visible("GPU-7778da7f", &["--gpu", "1"]);
    assert_eq!(hidden["status"], "warn");
    assert!(
        hidden["summary"]
            .as_str()
            .is_some_and(|s| s.contains("GPU 1 that you asked about")),
        "{hidden:#}"
    );
}

#[test]
fn gpu_selection_limits_the_per_gpu_checks_and_a_bad_one_is_a_usage_error() {
    let mut cmd = doctor("doctor-warn.toml", "no-xid.txt", &[]);
    cmd.args(["--gpu", "1"]);
    let run = json_run(cmd);
    let gpus: Vec<u64> = run.report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter_map(|c| c["gpu"].as_u64())
        .collect();
    assert!(!gpus.is_empty() && gpus.iter().all(|&g| g == 1), "{gpus:?}");
    let output = doctor("doctor-warn.toml", "no-xid.txt", &[])
        .args(["--gpu", "9"])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no GPU matches '9'"), "{stderr}");
}

#[test]
fn a_named_python_that_cannot_be_asked_is_a_warning_not_silence() {
    let mut cmd = doctor("h200-idle.toml", "no-xid.txt", &[]);
    cmd.args(["--python", "/nonexistent/bin/python3"]);
    let run = json_run(cmd);
    let f = finding(&run.report, "frameworks", "/nonexistent/bin/python3");
    assert_eq!(f["status"], "warn");
    assert!(
        f["summary"]
            .as_str()
            .is_some_and(|s| s.contains("cannot run '/nonexistent/bin/python3'")),
        "{f:#}"
    );
}

#[test]
fn skip_reasons_of_page_retirement_and_row_remapping_agree_on_the_gpus_generation() {
    // Issue 29: on one Hopper GPU with neither answer, page retirement was skipped because
    // "GPUs from Ampere on remap rows instead" and row remapping because "GPUs before
    // Ampere retire pages instead": each blamed the other generation.
    let run = json_run(doctor("h200-training.toml", "no-xid.txt", &[]));
    let summary = |id: &str| {
        finding(&run.report, id, "GPU 0")["summary"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let (retired, remapped) = (summary("retired_pages"), summary("remapped_rows"));
    assert_eq!(status(&run.report, "retired_pages", "GPU 0"), "skipped");
    assert_eq!(status(&run.report, "remapped_rows", "GPU 0"), "skipped");
    assert!(
        retired
            .ends_with("(compute capability 9.0: this GPU remaps rows instead, see remapped_rows)"),
        "{retired}"
    );
    assert!(
        !remapped.contains("retire pages") && remapped.starts_with("row remapping: "),
        "{remapped}"
    );
    // A GPU whose generation the driver does not say (no compute capability): neither
    // check claims one.
    let run = json_run(doctor("fault-not-supported.toml", "no-xid.txt", &[]));
    for id in ["retired_pages", "remapped_rows"] {
        let s = finding(&run.report, id, "GPU 0")["summary"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            s.ends_with("(GPUs before Ampere retire pages, later ones remap rows)"),
            "{id}: {s}"
        );
    }
}
