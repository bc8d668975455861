//! `vramctl run` against the stand-in job (`jobs/gpu-job.sh`) on the fake NVML, whose
//! processes the job announces in `FAKE_NVML_PROCESS_DIR`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use crate::gpu_job::script;
use crate::harness::{scenario, vramctl_std};

pub const MIB: u64 = 1 << 20;
/// What a job can use on the idle H200 scenario: total − the driver's reservation, in MiB
/// (150754820096 − 644939776 bytes).
pub const H200_USABLE_MIB: u64 = 143_156;

/// `vramctl ARGS -- gpu-job.sh JOB_ARGS` on the idle H200, with the job's variables.
pub fn under_vramctl(
    procs: &std::path::Path,
    args: &[&str],
    job_args: &[&str],
    env: &[(&str, &str)],
) -> Command {
    let mut cmd = vramctl_std(&scenario("h200-idle.toml"));
    cmd.env("FAKE_NVML_PROCESS_DIR", procs)
        .env("JOB_STEP_S", "0.1")
        .envs(env.iter().copied())
        .args(args)
        .arg("--")
        .arg(script())
        .args(job_args);
    cmd
}

/// The JSON report `--report /dev/stdout` printed after the job's own stdout.
fn report_after_job_output(stdout: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stdout);
    let start = text.find('{').expect("a report");
    serde_json::from_str(&text[start..]).expect("JSON")
}

/// `vramctl run --json --report /dev/stdout -- gpu-job.sh JOB_ARGS` with the job's variables.
fn run_with_report(job_args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let procs = tempfile::tempdir().expect("tempdir");
    under_vramctl(
        procs.path(),
        &["run", "--json", "--report", "/dev/stdout"],
        job_args,
        env,
    )
    .output()
    .expect("run")
}

#[test]
fn run_reports_the_peak_of_its_job_and_passes_the_exit_code_on() {
    let out = run_with_report(&["40"], &[("JOB_EXIT", "7")]);
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The job's own stdout comes first, then the report (--report /dev/stdout).
    let text = String::from_utf8_lossy(&out.stdout);
    let json_start = text.find('{').expect("a report");
    assert!(text[..json_start].contains("step 2 done"), "{text}");
    let r: serde_json::Value = serde_json::from_str(&text[json_start..]).expect("JSON");
    let want = (512 + 100 * 40) * MIB;
    assert_eq!(r["devices"][0]["peak_bytes"], want);
    assert_eq!(r["exit_code"], 7);
    assert_eq!(r["agent_injected"], false, "a shell script gets no agent");
    let processes = r["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 1);
    assert_eq!(processes[0]["peak_bytes"], want);
    assert!(r["oom"].is_null());
}

#[test]
fn run_passes_stdin_and_stdout_through_untouched() {
    let procs = tempfile::tempdir().expect("tempdir");
    let mut child = under_vramctl(procs.path(), &["run"], &["1"], &[("JOB_ECHO_STDIN", "1")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"line one\nline two\n")
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("line one\nline two\n"), "{stdout}");
    assert!(!stdout.contains("vramctl run"), "the report goes to stderr");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("vramctl run:"), "{stderr}");
    assert!(stderr.contains("peak 612.0 MiB"), "{stderr}");
}

#[test]
fn an_oom_in_the_second_step_is_reported_with_the_memory_in_use_then() {
    let procs = tempfile::tempdir().expect("tempdir");
    // 50 → 5512 MiB; step 1 holds 60 % (3307 MiB), step 2 would need all of it: over 4000.
    let out = under_vramctl(
        procs.path(),
        &["run", "--json", "--report", "/dev/stdout"],
        &["50"],
        &[
            ("JOB_FIRST_STEP_PCT", "60"),
            ("JOB_LIMIT_MIB", "4000"),
            ("JOB_STEP_S", "0.3"),
        ],
    )
    .stdout(Stdio::piped())
    .output()
    .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let r = report_after_job_output(&out.stdout);
    let oom = &r["oom"];
    assert_eq!(oom["source"], "pytorch");
    assert_eq!(oom["fatal"], true);
    assert!(
        oom["line"]
            .as_str()
            .expect("line")
            .contains("CUDA out of memory")
    );
    let step1 = 5512 * MIB * 60 / 100;
    let in_use = oom["device_used_bytes"]
        .as_object()
        .expect("per device")
        .values()
        .next()
        .and_then(serde_json::Value::as_u64)
        .expect("used");
    assert!(
        in_use.abs_diff(step1) <= MIB,
        "the device held step 1's memory when step 2 failed: {in_use} vs {step1}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("torch.OutOfMemoryError"),
        "stderr passed through"
    );
}

#[test]
fn a_child_process_s_memory_is_the_job_s() {
    let out = run_with_report(&["20"], &[("JOB_MODE", "child")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report_after_job_output(&out.stdout);
    assert_eq!(r["devices"][0]["peak_bytes"], (512 + 2000) * MIB);
    assert_eq!(r["processes"].as_array().expect("processes").len(), 1);
}

#[test]
fn max_vram_fails_the_guard_only_when_the_peak_goes_over() {
    let procs = tempfile::tempdir().expect("tempdir");
    let over = under_vramctl(procs.path(), &["run", "--max-vram", "1GiB"], &["10"], &[])
        .output()
        .expect("run");
    assert_eq!(over.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&over.stderr);
    assert!(
        stderr.contains("NVML peak 1.5 GiB is over --max-vram 1.0 GiB"),
        "{stderr}"
    );
    let within = under_vramctl(procs.path(), &["run", "--max-vram", "90%"], &["10"], &[])
        .output()
        .expect("run");
    assert_eq!(
        within.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&within.stderr)
    );
    let no_agent = under_vramctl(
        procs.path(),
        &["run", "--max-vram", "90%", "--budget-of", "reserved"],
        &["10"],
        &[],
    )
    .output()
    .expect("run");
    assert_eq!(no_agent.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_agent.stderr).contains("no agent reported it"));
}

#[test]
fn sigterm_to_run_reaches_the_command_and_its_status_comes_back() {
    let procs = tempfile::tempdir().expect("tempdir");
    let mut child = under_vramctl(
        procs.path(),
        &["run"],
        &["1"],
        &[
            ("JOB_MODE", "signals"),
            ("JOB_STEPS", "100"),
            ("JOB_STEP_S", "1"),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().expect("a line").expect("utf-8"), "step 1 done");
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|l| l == "job got SIGTERM"), "{rest:?}");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(143), "128 + SIGTERM, passed on");
}

#[test]
fn a_command_that_never_exits_is_stopped_at_the_timeout() {
    let procs = tempfile::tempdir().expect("tempdir");
    let out = under_vramctl(
        procs.path(),
        &[
            "run",
            "--timeout",
            "1s",
            "--json",
            "--report",
            "/dev/stderr",
        ],
        &["1"],
        &[("JOB_MODE", "forever")],
    )
    .output()
    .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("\"ending\": \"timed-out\""), "{stderr}");
    assert_eq!(out.status.code(), Some(143), "SIGTERM ended it");
}

#[test]
fn a_missing_command_exits_127_and_no_driver_means_no_start() {
    let procs = tempfile::tempdir().expect("tempdir");
    let mut cmd = vramctl_std(&scenario("h200-idle.toml"));
    let out = cmd
        .args(["run", "--", "no-such-command-here"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot run 'no-such-command-here'"));

    let marker = procs.path().join("ran");
    let out = vramctl_std(&scenario("fault-driver-not-loaded.toml"))
        .args(["run", "--", "touch"])
        .arg(&marker)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(3));
    assert!(
        !marker.exists(),
        "a job that cannot be watched is not started"
    );
}

#[test]
fn a_python_job_gets_the_agent_and_its_framework_peaks_come_from_its_exit_report() {
    // The stand-in torch (python/tests/fakes) allocates as the caching allocator does; the
    // job announces its NVML memory itself, as the driver would list it.
    let dir = tempfile::tempdir().expect("tempdir");
    let procs = dir.path().join("procs");
    std::fs::create_dir(&procs).expect("procs");
    let scenario = crate::reclaim::scenario(dir.path(), &[]);
    let python = crate::reclaim::repo().join("python");
    let code = "import os, torch\n\
        d = os.environ['FAKE_NVML_PROCESS_DIR']\n\
        open(os.path.join(d, str(os.getpid())), 'w').write('0 4294967296\\n')\n\
        a = torch.empty(3 << 30, dtype=torch.uint8, device='cuda'); del a\n\
        b = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n\
        import time; time.sleep(0.3)\n";
    let job = |flags: &[&str]| {
        let mut cmd = vramctl_std(&scenario);
        cmd.env("FAKE_NVML_PROCESS_DIR", &procs)
            .env("PYTHONPATH", python.join("tests/fakes/torch_pkg"))
            .arg("run")
            .args(flags)
            .args([
                "--json",
                "--report",
                "/dev/stdout",
                "--",
                "python3",
                "-c",
                code,
            ]);
        cmd.output().expect("run")
    };
    let out = job(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report_after_job_output(&out.stdout);
    assert_eq!(
        r["agent_injected"], true,
        "python3 gets the agent by default"
    );
    let device = &r["devices"][0];
    assert_eq!(device["peak_bytes"], 4u64 << 30);
    // 3 GiB, freed, then 1 GiB carved from the cached 3 GiB segment: the allocator's own
    // peaks (3 GiB each), not NVML's 4 GiB.
    assert_eq!(device["framework"]["allocated_peak_bytes"], 3u64 << 30);
    assert_eq!(device["framework"]["reserved_peak_bytes"], 3u64 << 30);
    let p = &r["processes"][0];
    assert_eq!(p["allocated_peak_bytes"], 3u64 << 30);
    // --no-agent leaves it out.
    let out = job(&["--no-agent"]);
    let r = report_after_job_output(&out.stdout);
    assert_eq!(r["agent_injected"], false);
    assert!(r["devices"][0]["framework"].is_null());
}

#[test]
fn record_keeps_the_curve_in_the_history_and_plot_draws_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let procs = dir.path().join("procs");
    std::fs::create_dir(&procs).expect("procs");
    let db = dir.path().join("h.db");
    let png = dir.path().join("curve.png");
    let out = under_vramctl(
        &procs,
        &[
            "run",
            "--record",
            "--db",
            db.to_str().expect("utf-8"),
            "-o",
            png.to_str().expect("utf-8"),
        ],
        &["30"],
        &[],
    )
    .output()
    .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&png).expect("the chart");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let history = vramctl_std(&scenario("h200-idle.toml"))
        .args([
            "history",
            "--db",
            db.to_str().expect("utf-8"),
            "--since",
            "all",
            "--json",
        ])
        .output()
        .expect("history");
    assert!(
        history.status.success(),
        "{}",
        String::from_utf8_lossy(&history.stderr)
    );
    let text = String::from_utf8_lossy(&history.stdout);
    assert!(
        text.contains(&((512 + 3000) * MIB).to_string()),
        "the job's memory was recorded: {text}"
    );
}
