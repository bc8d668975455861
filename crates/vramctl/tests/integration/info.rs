//! `vramctl info` against fake scenarios.

use serde_json::Value;

use crate::harness::{json_of, stdout_of, vramctl_on};

#[test]
fn h200_facts_and_derived_bandwidth() {
    let report = json_of(vramctl_on("h200-idle.toml").args(["info", "--json"]));
    assert_eq!(report["schema"], 1);
    let gpu = &report["devices"][0];
    assert_eq!(gpu["memory_bus_width_bits"], 6016);
    assert_eq!(gpu["max_memory_clock_mhz"], 3201);
    // 2 × 3201 MHz × 6016 bit / 8 = 4.814 TB/s
    assert_eq!(gpu["memory_bandwidth_bytes_per_sec"], 4_814_304_000_000_u64);
    assert_eq!(gpu["pcie_gen_current"], 5);
    assert_eq!(gpu["pcie_width_current"], 16);
    assert_eq!(gpu["pcie_current_bytes_per_sec"], 63_015_384_615_u64);
    assert_eq!(
        gpu["compute_capability"],
        serde_json::json!({"major": 9, "minor": 0})
    );
    assert_eq!(gpu["ecc_enabled"], true);
    assert_eq!(gpu["mig_current"], false);
    assert_eq!(report["driver"]["cuda_driver_version"], "13.0");
    insta::with_settings!({prepend_module_to_snapshot => false}, {
        insta::assert_json_snapshot!("info_h200_json", report);
    });
}

#[test]
fn h200_table() {
    let out = stdout_of(vramctl_on("h200-idle.toml").arg("info"));
    insta::with_settings!({prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("info_h200", out);
    });
}

#[test]
fn unsupported_facts_are_not_reported_never_guessed() {
    let report = json_of(vramctl_on("fault-not-supported.toml").args(["info", "--json"]));
    let igpu = &report["devices"][1];
    assert_eq!(igpu["memory_bus_width_bits"], Value::Null);
    assert_eq!(
        igpu["memory_bandwidth_bytes_per_sec"],
        Value::Null,
        "no inputs, no derived figure"
    );
    assert_eq!(igpu["missing"]["memory_bus_width"], "not supported");
    let out = stdout_of(vramctl_on("fault-not-supported.toml").args(["info", "--gpu", "1"]));
    assert!(
        out.contains("Bus width             not reported (memory_bus_width: not supported)"),
        "{out}"
    );
}

#[test]
fn a_lost_gpu_is_reported_and_the_other_described() {
    let report = json_of(
        vramctl_on("fault-gpu-lost.toml")
            .env("FAKE_NVML_TIME", "20")
            .args(["info", "--json"]),
    );
    let listed =
        report["devices"].as_array().unwrap().len() + report["unopened"].as_array().unwrap().len();
    assert_eq!(listed, 2);
    assert_eq!(report["devices"][0]["state"], "ok");
    assert!(
        report["devices"][0]["memory"]["total_bytes"]
            .as_u64()
            .is_some()
    );
}

#[test]
fn mig_instances_in_info() {
    let report = json_of(vramctl_on("mig.toml").args(["info", "--json"]));
    assert_eq!(report["devices"][0]["mig_current"], true);
    assert_eq!(
        report["devices"][0]["mig_instances"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}
