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

/// The two ways `run` keeps a job (`vramctl_run::job::scope`): the default (a cgroup v2
/// scope where one can be made, as root here) and the subreaper's tree, forced.
const CONTAINMENTS: [(&str, Option<&str>); 2] = [
    ("default", None),
    ("subreaper", Some("VRAMCTL_RUN_NO_CGROUP")),
];

/// A process of a job, as it was when it wrote its PID: (pid, start time).
type JobPid = (u32, u64);

/// The PIDs the job's processes wrote to `file`, one a line, once there are `n` (20 s at
/// most), each with its start time read at once so that a later reuse is told apart.
fn job_pids(file: &std::path::Path, n: usize) -> Vec<JobPid> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.len() >= n {
            return pids
                .into_iter()
                .map(|pid| {
                    let start = vramctl_procs::procinfo::read_stat(pid)
                        .map(|s| s.start_time_ticks)
                        .unwrap_or(0);
                    (pid, start)
                })
                .collect();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the job wrote {} of {n} PIDs: {text:?}",
            pids.len()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether the process is still running: there, with its start time, and not a zombie (a
/// zombie has exited; only its PID is left for its parent, or init, to collect).
fn still_running(&(pid, start): &JobPid) -> bool {
    vramctl_procs::procinfo::read_stat(pid)
        .is_ok_and(|s| s.start_time_ticks == start && !s.is_zombie())
}

/// SIGKILL to what a failed test leaves (checked to be the same process first).
fn tidy(pids: &[JobPid]) {
    for p in pids.iter().filter(|p| still_running(p)) {
        let _ = Command::new("kill")
            .args(["-KILL", &p.0.to_string()])
            .status();
    }
}

/// `vramctl run --json --report FILE ARGS -- sh -c SCRIPT`, the script's `$PIDS` a file in
/// `dir`.
fn run_sh(dir: &std::path::Path, env: Option<&str>, args: &[&str], script: &str) -> Command {
    let mut cmd = vramctl_std(&scenario("h200-idle.toml"));
    cmd.env("PIDS", dir.join("pids"))
        .arg("run")
        .arg("--json")
        .arg("--report")
        .arg(dir.join("report.json"))
        .args(args)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null());
    if let Some(var) = env {
        cmd.env(var, "1");
    }
    cmd
}

fn report_in(dir: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("report.json")).expect("the report");
    serde_json::from_str(&text).expect("JSON")
}

#[test]
fn run_timeout_kills_a_child_that_ignores_sigterm() {
    // The shell dies of SIGTERM at the timeout; its child ignores it and is re-parented to
    // `run`. It used to be forgotten with its parent, and outlive `run`.
    let script = "sh -c 'trap \"\" TERM; echo $$ >> \"$PIDS\"; exec sleep 600 >/dev/null 2>&1' &
        echo $$ >> \"$PIDS\"; wait";
    for (mode, env) in CONTAINMENTS {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = run_sh(
            dir.path(),
            env,
            &["--timeout", "1s", "--grace", "300ms"],
            script,
        );
        let out = cmd.output().expect("run");
        let pids = job_pids(&dir.path().join("pids"), 2);
        let alive: Vec<&JobPid> = pids.iter().filter(|p| still_running(p)).collect();
        tidy(&pids);
        assert!(
            alive.is_empty(),
            "{mode}: {alive:?} outlived run: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report = report_in(dir.path());
        assert_eq!(report["ending"], "timed-out", "{mode}");
        assert_eq!(
            out.status.code(),
            Some(143),
            "{mode}: the shell died of SIGTERM"
        );
        assert!(
            report["leftover_processes"].as_u64() >= Some(1),
            "{mode}: {report}"
        );
        if env.is_some() {
            assert_eq!(report["containment"], "subreaper");
        } else if report["containment"] != "cgroup" {
            eprintln!(
                "no cgroup v2 scope could be made here: only the subreaper's tree was tested"
            );
        }
    }
}

#[test]
fn run_timeout_kills_a_double_forked_daemon() {
    // A daemon the classic way: a subshell forks it into a session of its own and exits, so
    // it is nobody's descendant but `run`'s (a subreaper), in no process group of the job's.
    let script = "( setsid sh -c 'trap \"\" TERM HUP; echo $$ >> \"$PIDS\"; exec sleep 600 >/dev/null 2>&1' & )
        echo $$ >> \"$PIDS\"; exec sleep 600";
    for (mode, env) in CONTAINMENTS {
        let dir = tempfile::tempdir().expect("tempdir");
        let started = std::time::Instant::now();
        let out = run_sh(
            dir.path(),
            env,
            &["--timeout", "1s", "--grace", "300ms"],
            script,
        )
        .output()
        .expect("run");
        let pids = job_pids(&dir.path().join("pids"), 2);
        let alive: Vec<&JobPid> = pids.iter().filter(|p| still_running(p)).collect();
        tidy(&pids);
        assert!(
            alive.is_empty(),
            "{mode}: {alive:?} outlived run: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(report_in(dir.path())["ending"], "timed-out", "{mode}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{mode}: run waited {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn run_killed_with_sigkill_takes_its_job_with_it() {
    // The command, a child of it that ignores SIGTERM, and a double-forked daemon; then
    // `run` is killed with SIGKILL, which it cannot catch.
    let script = "sh -c 'trap \"\" TERM; echo $$ >> \"$PIDS\"; exec sleep 600 >/dev/null 2>&1' &
        ( setsid sh -c 'trap \"\" TERM HUP; echo $$ >> \"$PIDS\"; exec sleep 600 >/dev/null 2>&1' & )
        echo $$ >> \"$PIDS\"; wait";
    for (mode, env) in CONTAINMENTS {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut run = run_sh(dir.path(), env, &[], script)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run");
        let pids = job_pids(&dir.path().join("pids"), 3);
        // The command is run's child whose script ends in `wait`. By parent alone it is
        // ambiguous: in subreaper mode the setsid'd sleeper becomes run's child too once
        // its `( … & )` subshell exits, and when its line came first the test took it for
        // the command, which has no death signal (it failed so once in CI under load).
        let command = pids
            .iter()
            .copied()
            .find(|(pid, _)| {
                vramctl_procs::procinfo::read_stat(*pid).is_ok_and(|s| s.ppid == run.id())
                    && std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("wait"))
            })
            .expect("the command is run's child");
        let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", command.0))
            .unwrap_or_default()
            .contains("vramctl-run.");
        run.kill().expect("SIGKILL");
        run.wait().expect("reap run");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let expected: Vec<JobPid> = if cgroup {
            pids.clone()
        } else {
            // Without a cgroup, only the command has a death signal (docs/run.md).
            eprintln!("{mode}: no cgroup scope; only the command itself is checked");
            vec![command]
        };
        while expected.iter().any(still_running) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let alive: Vec<&JobPid> = expected.iter().filter(|p| still_running(p)).collect();
        tidy(&pids);
        assert!(alive.is_empty(), "{mode}: {alive:?} outlived run's SIGKILL");
        if env.is_some() {
            assert!(
                !cgroup,
                "{mode}: VRAMCTL_RUN_NO_CGROUP keeps the job out of cgroups"
            );
        }
    }
}

#[test]
fn run_timeout_as_another_user_ends_the_job_by_the_subreaper_s_tree() {
    // Not root: no cgroup can be made (none is delegated here), so the job is kept by the
    // subreaper's tree, and a child that ignores SIGTERM still goes at the timeout.
    if !crate::real_processes::is_root() {
        eprintln!("skipped: running vramctl as another uid (65534) needs root");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let portable = crate::harness::Portable::new(&scenario("h200-idle.toml"));
    let dir = portable.dir.path().join("job");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let script = "sh -c 'trap \"\" TERM; echo $$ >> \"$PIDS\"; exec sleep 600 >/dev/null 2>&1' &
        echo $$ >> \"$PIDS\"; wait";
    let out = portable
        .command()
        .env("PIDS", dir.join("pids"))
        .args(["run", "--json", "--report"])
        .arg(dir.join("report.json"))
        .args([
            "--timeout",
            "1s",
            "--grace",
            "300ms",
            "--",
            "sh",
            "-c",
            script,
        ])
        .stdin(Stdio::null())
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run");
    let pids = job_pids(&dir.join("pids"), 2);
    let alive: Vec<&JobPid> = pids.iter().filter(|p| still_running(p)).collect();
    tidy(&pids);
    assert!(
        alive.is_empty(),
        "{alive:?} outlived run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = report_in(&dir);
    assert_eq!(report["ending"], "timed-out");
    assert_eq!(report["containment"], "subreaper", "{report}");
}
