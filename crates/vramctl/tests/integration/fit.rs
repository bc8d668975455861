//! `vramctl fit` against the stand-in job (`jobs/gpu-job.sh`) on the fake NVML: memory a
//! formula of the value (affine, quadratic, noisy), an OOM limit at the fake H200's usable
//! memory, and the failure kinds a search must tell apart.

use crate::run::{H200_USABLE_MIB, under_vramctl};

/// The largest v with `base + per·v + quad·v²/1000 <= limit` (all MiB).
fn truth(base: u64, per: u64, quad_milli: u64, limit: u64) -> u64 {
    (1..100_000)
        .take_while(|v| base + per * v + quad_milli * v * v / 1000 <= limit)
        .last()
        .unwrap_or(0)
}

fn fit(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, serde_json::Value, String) {
    let procs = tempfile::tempdir().expect("tempdir");
    let limit = H200_USABLE_MIB.to_string();
    let mut all_env = vec![("JOB_STEP_S", "0.15"), ("JOB_LIMIT_MIB", limit.as_str())];
    all_env.extend_from_slice(env);
    let mut full = vec!["fit", "--json"];
    full.extend_from_slice(args);
    let out = under_vramctl(procs.path(), &full, &["{}"], &all_env)
        .output()
        .expect("fit");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code(), json, stderr)
}

fn answer(report: &serde_json::Value) -> u64 {
    report["answer"].as_u64().expect("an answer")
}

fn trials(report: &serde_json::Value) -> &Vec<serde_json::Value> {
    report["trials"].as_array().expect("trials")
}

/// The answer is a value that was tried and succeeded, and the bracket above it failed.
fn check_answer_was_tried(report: &serde_json::Value) {
    let a = answer(report);
    assert!(
        trials(report)
            .iter()
            .any(|t| t["value"] == a && t["outcome"] == "succeeded"),
        "{report:#}"
    );
}

#[test]
fn an_affine_job_is_answered_within_two_percent_in_four_trials() {
    let (code, r, stderr) = fit(&[], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let t = truth(512, 100, 0, H200_USABLE_MIB);
    let a = answer(&r);
    assert!(
        a <= t && (t - a) as f64 <= 0.02 * t as f64,
        "answer {a}, truth {t}"
    );
    assert!(trials(&r).len() <= 4, "{r:#}");
    check_answer_was_tried(&r);
}

#[test]
fn bisection_with_no_tolerance_finds_the_exact_edge() {
    let (code, r, stderr) = fit(&["--strategy", "bisect", "--tolerance", "0"], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(answer(&r), truth(512, 100, 0, H200_USABLE_MIB));
    assert!(trials(&r).len() >= 10, "a classic bisection over 1..4096");
}

#[test]
fn a_quadratic_job_is_answered_with_a_value_that_fit() {
    // Memory quadratic in the value (attention over a sequence length without flash).
    let env = [("JOB_PER_VALUE_MIB", "2"), ("JOB_QUAD_MILLI_MIB", "20")];
    let (code, r, stderr) = fit(&["--range", "1..8192"], &env);
    assert_eq!(code, Some(0), "{stderr}");
    let t = truth(512, 2, 20, H200_USABLE_MIB);
    let a = answer(&r);
    assert!(
        a <= t && (t - a) as f64 <= 0.02 * t as f64,
        "answer {a}, truth {t}"
    );
    check_answer_was_tried(&r);
}

#[test]
fn a_noisy_job_and_one_that_ooms_in_its_second_step_are_still_answered_right() {
    for env in [
        vec![("JOB_NOISE_PCT", "3"), ("JOB_SEED", "7")],
        vec![("JOB_FIRST_STEP_PCT", "50")],
    ] {
        let (code, r, stderr) = fit(&[], &env);
        assert_eq!(code, Some(0), "{env:?}: {stderr}");
        check_answer_was_tried(&r);
        let a = answer(&r);
        // With ±3 % noise the edge moves by up to 3 %; the answer still fit.
        assert!(
            a as f64 >= 0.95 * truth(512, 100, 0, H200_USABLE_MIB) as f64,
            "{env:?}: {a}"
        );
    }
}

#[test]
fn a_trial_that_fails_for_another_reason_stops_the_search_with_its_error() {
    let (code, _, stderr) = fit(&[], &[("JOB_MODE", "fail")]);
    assert_eq!(code, Some(2));
    let last = stderr.lines().last().expect("an error line");
    assert!(
        last.contains("the trial with value 8 exited 3, not out of GPU memory"),
        "{last}"
    );
    assert!(
        last.contains("unknown optimizer"),
        "the trial's own error is shown: {last}"
    );
}

#[test]
fn a_job_that_never_exits_succeeds_at_its_line_and_is_stopped() {
    let (code, r, stderr) = fit(
        &["--until-line", "^step 2 done$", "--range", "1..64"],
        &[("JOB_MODE", "forever")],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(r["conclusion"]["kind"], "top_of_range");
    assert_eq!(answer(&r), 64);
    // Without the line, the trial timeout ends it: another failure, not a fit.
    let (code, _, stderr) = fit(&["--trial-timeout", "1s"], &[("JOB_MODE", "forever")]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("did not finish within --trial-timeout"),
        "{stderr}"
    );
}

#[test]
fn nothing_fits_exits_1_and_the_memory_of_a_child_counts() {
    let (code, r, _) = fit(&[], &[("JOB_BASE_MIB", "200000")]);
    assert_eq!(code, Some(1));
    assert!(r["answer"].is_null());
    assert_eq!(r["conclusion"]["kind"], "nothing_fits");

    let (code, r, stderr) = fit(&[], &[("JOB_MODE", "child")]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        trials(&r)[0]["peak_nvml_bytes"].as_u64().expect("peak") > 0,
        "the child's memory"
    );
    assert!(trials(&r).len() <= 4, "{r:#}");
}

#[test]
fn the_value_also_arrives_in_the_environment() {
    // No {} in the command: gpu-job.sh takes VRAMCTL_FIT_VALUE.
    let procs = tempfile::tempdir().expect("tempdir");
    let limit = H200_USABLE_MIB.to_string();
    let mut cmd = under_vramctl(
        procs.path(),
        &["fit", "--json", "--range", "1..2048"],
        &[],
        &[("JOB_STEP_S", "0.15"), ("JOB_LIMIT_MIB", &limit)],
    );
    let out = cmd.output().expect("fit");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(answer(&r) > 1000, "{r:#}");
}

#[test]
fn a_bad_range_is_a_usage_error() {
    let procs = tempfile::tempdir().expect("tempdir");
    let out = under_vramctl(procs.path(), &["fit", "--range", "64..8"], &["{}"], &[])
        .output()
        .expect("fit");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("'64..8' is not a range"));
    let out = under_vramctl(procs.path(), &["fit", "--tolerance", "50%"], &["{}"], &[])
        .output()
        .expect("fit");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("'50%' must be below 50%"));
}

/// A Python training step on the stand-in torch (`python/tests/fakes`: its caching
/// allocator records the trace torch's `_record_memory_history` does and raises its OOM),
/// announcing its reserved peak + a 512 MiB context to the fake NVML: `fit` with the agent
/// takes the traces of its two calibration trials, predicts the edge from them, and
/// confirms it (issue 34).
const TRACED_STEP: &str = r#"import os, sys, time, torch
v = int(sys.argv[1])
MiB = 1 << 20
w = [torch.empty(1024 * MiB, dtype=torch.uint8, device='cuda') for _ in range(8)]
kept = []
for layer in range(4):
    small = torch.empty(3000, dtype=torch.uint8, device='cuda')
    kept.append(torch.empty(v * 32 * MiB, dtype=torch.uint8, device='cuda'))
    tmp = torch.empty(v * 16 * MiB + 1000, dtype=torch.uint8, device='cuda')
    del tmp, small
del kept
peak = torch.cuda.memory_stats()['reserved_bytes.all.peak']
d = os.environ['FAKE_NVML_PROCESS_DIR']
open(os.path.join(d, str(os.getpid())), 'w').write(f'0 {peak + 512 * MiB}\n')
time.sleep(0.5)
"#;

#[test]
fn with_the_agent_the_allocator_traces_predict_the_edge_in_four_trials() {
    let dir = tempfile::tempdir().expect("tempdir");
    let procs = dir.path().join("procs");
    std::fs::create_dir(&procs).expect("procs");
    let scenario = crate::reclaim::scenario(dir.path(), &[]);
    let python = crate::reclaim::repo().join("python");
    // What the job may reserve: 140 GiB − the driver's 615 MiB − the 512 MiB context.
    let pool_mib: u64 = 140 * 1024 - 615 - 512;
    let fit = |json: bool| {
        crate::harness::vramctl_std(&scenario)
            .env("FAKE_NVML_PROCESS_DIR", &procs)
            .env("PYTHONPATH", python.join("tests/fakes/torch_pkg"))
            .env("FAKE_TORCH_CAPACITY", (pool_mib << 20).to_string())
            .arg("fit")
            .args(json.then_some("--json"))
            .args(["--", "python3", "-c", TRACED_STEP, "{}"])
            .output()
            .expect("fit")
    };
    let out = fit(true);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(r["predictor"]["used"], "trace", "{r:#}");
    assert!(r["predictor"]["fallback"].is_null(), "{r:#}");
    // 8 GiB of weights, a 2 MiB small segment; per value 4 × 32 MiB kept and a
    // temporary of 16 MiB + 1000 B (a segment of 16·v + 2 MiB, freed and made again).
    let truth = (pool_mib - 8 * 1024 - 4) / (128 + 16);
    let a = answer(&r);
    assert!(
        a <= truth && (truth - a) as f64 <= 0.02 * truth as f64,
        "answer {a}, truth about {truth}: {r:#}"
    );
    assert!(trials(&r).len() <= 4, "{r:#}");
    check_answer_was_tried(&r);
    // The prediction itself: within the 2 % the search closes, the fixed part (weights)
    // and the scaling ones (kept, temporary) told apart.
    let predicted = r["predictor"]["trace"]["value"]
        .as_u64()
        .expect("a prediction");
    assert!(
        predicted.abs_diff(truth) as f64 <= 0.02 * truth as f64,
        "{r:#}"
    );
    assert!(
        r["predictor"]["trace"]["fixed"].as_u64() >= Some(8),
        "{r:#}"
    );
    assert!(
        r["predictor"]["trace"]["linear"].as_u64() >= Some(4),
        "{r:#}"
    );
    // The text summary says it too.
    let out = fit(false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "predictor: allocator traces (edge predicted at {predicted}; allocations "
        )),
        "{stderr}"
    );
}
