//! The stand-in job `jobs/gpu-job.sh` that `run` and `fit` tests start under the fake NVML:
//! its memory is a formula of a value, announced in `FAKE_NVML_PROCESS_DIR` (a file per PID,
//! docs/scenarios.md "Processes from a directory"). These tests check the script itself,
//! and that vramctl sees what it announces.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::harness::{json_of, vramctl};
use crate::real_processes::{Scenario, Spawned, ends, spawn};

const MIB: u64 = 1 << 20;

/// The script's path (executable in the repository).
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/jobs/gpu-job.sh")
}

/// The job for `value`, announcing into `procs`, with `env` on top of the defaults; nothing
/// of the test's own `JOB_*` environment leaks in.
fn job(procs: &Path, value: &str, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(script());
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("FAKE_NVML_PROCESS_DIR", procs)
        .arg(value)
        .envs(env.iter().copied());
    command
}

/// The files in `procs`: `(name, contents)`, by name.
fn announced(procs: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(procs)
        .expect("read procs")
        .map(|e| {
            let e = e.expect("entry");
            let text = std::fs::read_to_string(e.path()).expect("read file");
            (e.file_name().to_string_lossy().into_owned(), text)
        })
        .collect();
    files.sort();
    files
}

fn terminate(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill(1)");
    assert!(status.success());
}

/// A job that holds its first step for 10 minutes, once it has announced it.
fn holding(procs: &Path, value: &str, env: &[(&str, &str)]) -> Spawned {
    let mut command = job(procs, value, env);
    command.envs([("JOB_STEPS", "1"), ("JOB_STEP_S", "600")]);
    let mut spawned = spawn(&mut command);
    assert_eq!(spawned.line(), "step 1 done");
    spawned
}

/// What a holding job for `value` announces, in bytes on GPU 0 (the job is ended after).
fn bytes_for(value: &str, env: &[(&str, &str)]) -> u64 {
    let procs = tempfile::tempdir().expect("tempdir");
    let spawned = holding(procs.path(), value, env);
    let files = announced(procs.path());
    terminate(spawned.pid());
    assert!(ends(spawned.pid()));
    let [(_, text)] = files.as_slice() else {
        panic!("one file: {files:?}");
    };
    let (gpu, bytes) = text.trim().split_once(' ').expect("GPU BYTES");
    assert_eq!(gpu, "0");
    bytes.parse().expect("bytes")
}

#[test]
fn the_job_announces_its_formulas_bytes_and_vramctl_sees_them() {
    let procs = tempfile::tempdir().expect("tempdir");
    // 512 + 100 * 10 + (2000 * 10 * 10) / 1000 = 1712 MiB.
    let mut spawned = holding(procs.path(), "10", &[("JOB_QUAD_MILLI_MIB", "2000")]);
    let pid = spawned.pid();
    assert_eq!(
        announced(procs.path()),
        [(pid.to_string(), format!("0 {}\n", 1712 * MIB))]
    );

    let scenario = Scenario::new(1, &[]);
    let report = json_of(
        vramctl(scenario.path())
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .args(["ps", "--json", "--cpu-interval", "0"]),
    );
    let listed = report["processes"].as_array().expect("processes");
    assert_eq!(listed.len(), 1, "{report:#}");
    assert_eq!(listed[0]["pid"], pid);
    assert_eq!(listed[0]["used_bytes"], 1712 * MIB);

    // Killed: it dies of the signal (what `run` passes on) and its file goes with it.
    terminate(pid);
    assert_eq!(spawned.killed_by(), Some(15));
    assert_eq!(announced(procs.path()), []);
}

#[test]
fn a_job_over_its_limit_in_step_two_dies_of_a_pytorch_oom() {
    let procs = tempfile::tempdir().expect("tempdir");
    // 1512 MiB; step 1 holds 60 % (907 MiB), under the 1200 MiB limit; step 2 does not fit.
    let out: Output = job(
        procs.path(),
        "10",
        &[("JOB_FIRST_STEP_PCT", "60"), ("JOB_LIMIT_MIB", "1200")],
    )
    .output()
    .expect("run the job");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "step 1 done\n");
    assert!(
        stderr.contains(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 0.59 GiB. \
             GPU 0 has a total capacity of 1.17 GiB of which 293.00 MiB is free."
        ),
        "{stderr}"
    );
    assert_eq!(announced(procs.path()), [], "removed at exit");
}

#[test]
fn in_child_mode_the_memory_belongs_to_the_child_pid() {
    let procs = tempfile::tempdir().expect("tempdir");
    let parent = holding(procs.path(), "1", &[("JOB_MODE", "child")]);
    let files = announced(procs.path());
    let [(name, text)] = files.as_slice() else {
        panic!("one file: {files:?}");
    };
    let child: u32 = name.parse().expect("a pid");
    assert_ne!(child, parent.pid());
    let stat = vramctl_procs::procinfo::read_stat(child).expect("the child lives");
    assert_eq!(stat.ppid, parent.pid());
    assert_eq!(*text, format!("0 {}\n", 612 * MIB));
    // The parent forwards SIGTERM to its child and exits with the child's status.
    let mut parent = parent;
    terminate(parent.pid());
    assert_eq!(parent.child.wait().expect("wait").code(), Some(128 + 15));
    assert!(ends(child));
    assert_eq!(announced(procs.path()), []);
}

#[test]
fn noise_is_fixed_by_value_and_seed_and_within_its_percent() {
    let noisy = |value, seed| bytes_for(value, &[("JOB_NOISE_PCT", "10"), ("JOB_SEED", seed)]);
    let first = noisy("10", "7");
    assert_eq!(noisy("10", "7"), first, "same value and seed: same bytes");
    assert_ne!(noisy("10", "8"), first, "another seed: other noise");
    let exact = 1512 * MIB;
    assert!(first.abs_diff(exact) <= exact / 10, "{first} vs {exact}");
    assert_ne!(first, exact, "noise moved it");
}

#[test]
fn fail_mode_and_job_exit_end_with_their_codes() {
    let procs = tempfile::tempdir().expect("tempdir");
    let out = job(procs.path(), "1", &[("JOB_MODE", "fail")])
        .output()
        .expect("run the job");
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "step 1 done\n");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "ValueError: unknown optimizer 'adamw2'\n"
    );
    let out = job(procs.path(), "1", &[("JOB_EXIT", "7"), ("JOB_STEP_S", "0")])
        .output()
        .expect("run the job");
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "step 1 done\nstep 2 done\ndone\n"
    );
    assert_eq!(announced(procs.path()), []);
}
