//! How GPUs connect (issue 36): `info`'s NVLink section and `nvidia-smi topo -m`-like
//! matrix, its `--json` fields, `doctor`'s `nvlink` and `p2p` findings, on the fake's
//! `nvlink` and `[topology]` keys; and that a scenario without them (a PCIe-only GPU, a
//! driver that does not answer) shows nothing new and no error.

use std::path::PathBuf;

use serde_json::Value;

use crate::harness::{json_of, scenario, stdout_of, vramctl, vramctl_on};

/// `doctor --json` with a clean kernel log. (Its exit code is not asserted here: other
/// checks judge the machine running the tests, `doctor.rs` says which.)
fn doctor(cmd: &mut assert_cmd::Command) -> Value {
    let log = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/doctor/kernel-log/no-xid.txt");
    let output = cmd
        .args(["doctor", "--json", "--kernel-log"])
        .arg(log)
        .output()
        .expect("run vramctl");
    serde_json::from_slice(&output.stdout).expect("doctor's JSON")
}

/// The `nvlink` and `p2p` findings, without the facts that depend on this machine's
/// processes (`shared_pids`: a fictional PID may be a real one here).
fn link_findings(report: &Value) -> Vec<Value> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["id"] == "nvlink" || c["id"] == "p2p")
        .map(|c| {
            serde_json::json!({
                "id": c["id"], "subject": c["subject"], "gpu": c["gpu"],
                "status": c["status"], "summary": c["summary"], "fix": c["fix"],
            })
        })
        .collect()
}

/// The NVLink scenario with GPU 1's link 7 down.
fn degraded() -> (tempfile::TempDir, PathBuf) {
    let text = std::fs::read_to_string(scenario("two-h200-nvlink.toml")).expect("scenario");
    let (first, second) = text.split_at(text.rfind("[[gpu]]").expect("two GPUs"));
    let second = second.replace(
        "nvlink = { links = 18, to = \"switch\", version = 4 }",
        "nvlink = { links = 18, to = \"switch\", version = 4, inactive = [7] }",
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("degraded.toml");
    std::fs::write(&path, format!("{first}{second}")).expect("write");
    (dir, path)
}

#[test]
fn info_shows_each_gpus_nvlinks_and_the_topo_matrix() {
    let out = stdout_of(vramctl_on("two-h200-nvlink.toml").arg("info"));
    // Each GPU's name and NVLink section, then everything from the matrix on.
    let mut kept = Vec::new();
    let mut keep = false;
    for line in out.lines() {
        if line.starts_with("GPU ") || line.starts_with("Topology") {
            keep = true;
        } else if line.starts_with("  ") && !line.starts_with("    ") && !line.starts_with("  GPU")
        {
            keep = line == "  NVLink"
                || line.starts_with("  NV#")
                || line.starts_with("  NODE")
                || line.starts_with("  P2P");
        }
        if keep || line.starts_with("GPU ") {
            kept.push(line);
        }
        if line.starts_with("GPU ") {
            keep = false;
        }
    }
    insta::with_settings!({prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("info_two_h200_nvlink", kept.join("\n"));
    });
}

#[test]
fn info_json_has_the_links_and_every_pair() {
    let report = json_of(vramctl_on("two-h200-nvlink.toml").args(["info", "--json"]));
    let links = report["devices"][1]["nvlinks"].as_array().expect("nvlinks");
    assert_eq!(links.len(), 18);
    assert_eq!(
        links[17],
        serde_json::json!({"link": 17, "active": true, "version": 4,
            "remote_pci_bus_id": null, "remote_device": "switch"})
    );
    insta::with_settings!({prepend_module_to_snapshot => false}, {
        insta::assert_json_snapshot!("info_two_h200_nvlink_topology", report["topology"]);
    });
    // One GPU chosen: no pair, so no key.
    let one = json_of(vramctl_on("two-h200-nvlink.toml").args(["info", "--json", "-i", "1"]));
    assert_eq!(one["topology"], Value::Null);
    assert_eq!(
        one["devices"][0]["nvlinks"].as_array().map(Vec::len),
        Some(18)
    );
}

#[test]
fn an_inactive_link_shows_in_info_and_doctor_warns() {
    let (_dir, path) = degraded();
    let out = stdout_of(vramctl(&path).args(["info", "-i", "1"]));
    assert!(
        out.contains("    Links                 17 of 18 active, inactive: 7\n"),
        "{out}"
    );
    let report = doctor(&mut vramctl(&path));
    insta::with_settings!({prepend_module_to_snapshot => false}, {
        insta::assert_json_snapshot!("doctor_nvlink_inactive", link_findings(&report));
    });
}

#[test]
fn doctor_on_healthy_nvlinks_finds_nothing_to_say() {
    let report = doctor(&mut vramctl_on("two-h200-nvlink.toml"));
    let found = link_findings(&report);
    assert_eq!(found.len(), 3, "{found:#?}");
    for f in &found {
        assert_eq!(f["status"], "ok", "{f}");
        assert_eq!(f["fix"], Value::Null);
    }
    assert_eq!(found[0]["summary"], "18 of 18 NVLinks active");
    assert_eq!(found[2]["summary"], "P2P read and write ok, path NV18");
}

#[test]
fn doctor_warns_of_p2p_off_between_gpus_one_process_uses() {
    let report = doctor(&mut vramctl_on("two-gpus-pcie-no-p2p.toml"));
    let found = link_findings(&report);
    insta::with_settings!({prepend_module_to_snapshot => false}, {
        insta::assert_json_snapshot!("doctor_p2p_not_supported", found);
    });
    let out = stdout_of(vramctl_on("two-gpus-pcie-no-p2p.toml").arg("info"));
    assert!(out.contains("  GPU0  X     NODE\n"), "{out}");
    assert!(!out.contains("NVLink\n"), "no NVLink section: {out}");
}

#[test]
fn gpus_without_nvlink_or_topology_answers_show_nothing_new() {
    for name in ["h200-idle.toml", "fault-not-supported.toml"] {
        let out = stdout_of(vramctl_on(name).arg("info"));
        assert!(!out.contains("NVLink"), "{name}: {out}");
        assert!(!out.contains("Topology"), "{name}: {out}");
        let report = json_of(vramctl_on(name).args(["info", "--json"]));
        for device in report["devices"].as_array().expect("devices") {
            assert_eq!(device.get("nvlinks"), None, "{name}");
            assert_eq!(device["missing"].get("nvlinks"), None, "{name}");
        }
        let doctor_report = doctor(&mut vramctl_on(name));
        assert_eq!(link_findings(&doctor_report), Vec::<Value>::new(), "{name}");
    }
    // Two GPUs whose driver answers nothing: the pair is listed, every value null with
    // NVML's reason, and no NVLink between them (neither has any).
    let report = json_of(vramctl_on("fault-not-supported.toml").args(["info", "--json"]));
    let pair = &report["topology"][0];
    assert_eq!(pair["gpus"], serde_json::json!([0, 1]));
    assert_eq!(pair["level"], Value::Null);
    assert_eq!(pair["missing"]["p2p_read"], "not supported");
    assert_eq!(pair["nvlinks"], 0);
    assert_eq!(pair["smi_label"], Value::Null);
}

/// `info`'s NVML calls for links and pairs, counted by the fake: 18 link states per GPU
/// with NVLink and 3 more per active link, one state call on a GPU without; 4 per pair.
#[test]
fn info_asks_nvml_a_bounded_number_of_link_and_pair_calls() {
    let counts = |name: &str| -> std::collections::BTreeMap<String, u64> {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("calls.txt");
        stdout_of(
            vramctl_on(name)
                .env("FAKE_NVML_CALL_COUNTS", &file)
                .arg("info"),
        );
        std::fs::read_to_string(&file)
            .expect("call counts")
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(f, n)| (f.to_owned(), n.parse().expect("a count")))
            .collect()
    };
    let c = counts("two-h200-nvlink.toml");
    let get = |c: &std::collections::BTreeMap<String, u64>, f: &str| c.get(f).copied().unwrap_or(0);
    assert_eq!(get(&c, "nvmlDeviceGetNvLinkState"), 2 * 18);
    for f in [
        "nvmlDeviceGetNvLinkVersion",
        "nvmlDeviceGetNvLinkRemotePciInfo_v2",
        "nvmlDeviceGetNvLinkRemoteDeviceType",
    ] {
        assert_eq!(get(&c, f), 2 * 18, "{f}");
    }
    assert_eq!(get(&c, "nvmlDeviceGetTopologyCommonAncestor"), 1);
    assert_eq!(get(&c, "nvmlDeviceGetP2PStatus"), 3);
    let c = counts("h200-idle.toml");
    assert_eq!(
        get(&c, "nvmlDeviceGetNvLinkState"),
        1,
        "NOT_SUPPORTED at link 0"
    );
    assert_eq!(get(&c, "nvmlDeviceGetP2PStatus"), 0, "one GPU, no pair");
}
