//! `vramctl reap` end to end: real processes listed in fake-NVML scenarios with per-process
//! SM activity, idle evidence from a history `record` wrote on a simulated clock or from
//! `reap --every` watching live on one. Nothing waits on the wall clock: the sampler's time
//! is `--simulated-clock`, the fake's is its step clock, and a reaped process's memory is
//! freed by the fake as soon as its PID leaves /proc.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use vramctl_procs::audit_record::AuditOutcome;

use crate::harness::{redactions, vramctl_std};
use crate::real_processes::{Spawned, audit_rows, my_user, sleeper};

const GIB: u64 = 1 << 30;
/// 2026-11-29T20:31:31Z: recordings start here.
const T0: i64 = 1_795_984_291_000;
/// Samples `record` takes (one a simulated second).
const TICKS: i64 = 150;

/// A real process on GPU 0 with its memory and SM activity.
struct Held<'a> {
    process: &'a Spawned,
    memory: &'a str,
    sm_percent: u32,
}

/// A temp directory with a one-GPU scenario on the fake's step clock (1 s per sample) and
/// the history database path.
struct Setup {
    dir: tempfile::TempDir,
    scenario: PathBuf,
}

impl Setup {
    fn new(held: &[Held<'_>]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut text = String::from(
            "driver_version = \"580.159.04\"\n[clock]\nmode = \"step\"\nstep_s = 1.0\n\n\
             [[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\n\
             memory_total = 150754820096\nmemory_reserved = 644939776\n",
        );
        for h in held {
            text.push_str(&format!(
                "\n[[gpu.process]]\npid = {}\nreal = true\nmemory = \"{}\"\nsm_util = {}\n",
                h.process.pid(),
                h.memory,
                h.sm_percent
            ));
        }
        let scenario = dir.path().join("scenario.toml");
        std::fs::write(&scenario, text).expect("write scenario");
        Self { dir, scenario }
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("state/history.db")
    }

    /// `vramctl --db DB ARGS` on the scenario, the fake on its own (step) clock.
    fn vramctl(&self, args: &[&str]) -> Command {
        let mut cmd = vramctl_std(&self.scenario);
        cmd.env_remove("FAKE_NVML_TIME")
            .stdin(Stdio::null())
            .arg("--db")
            .arg(self.db())
            .args(args);
        cmd
    }

    /// `record` for [`TICKS`] simulated seconds from [`T0`].
    fn record(&self) {
        let out = run(&mut self.vramctl(&[
            "record",
            "--interval",
            "1s",
            "--ticks",
            &TICKS.to_string(),
            "--simulated-clock",
            &T0.to_string(),
        ]));
        assert!(out.status.success(), "{}", stderr(&out));
    }

    /// `reap ARGS` one simulated second after the recording's last sample.
    fn reap(&self, args: &[&str]) -> Output {
        let now = (T0 + TICKS * 1000).to_string();
        let mut all = vec!["reap", "--tz", "UTC", "--simulated-clock", &now];
        all.extend_from_slice(args);
        run(&mut self.vramctl(&all))
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run vramctl")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {} stderr {}",
            String::from_utf8_lossy(&out.stdout),
            stderr(out)
        )
    })
}

fn pids(list: &Value) -> Vec<u64> {
    list.as_array()
        .expect("array")
        .iter()
        .map(|c| c["pid"].as_u64().expect("pid"))
        .collect()
}

fn stage_of(report: &Value, pid: u32) -> (String, String) {
    let e = report["excluded"]
        .as_array()
        .expect("excluded")
        .iter()
        .find(|e| e["pid"] == pid)
        .unwrap_or_else(|| panic!("PID {pid} not left alone: {report}"));
    (
        e["stage"].as_str().expect("stage").to_owned(),
        e["reason"].as_str().expect("reason").to_owned(),
    )
}

#[test]
fn dry_run_plans_the_idle_holders_with_their_evidence_and_changes_nothing() {
    let (idle, idle_small, busy, tiny) = (sleeper(), sleeper(), sleeper(), sleeper());
    let setup = Setup::new(&[
        Held {
            process: &idle,
            memory: "8 GiB",
            sm_percent: 0,
        },
        Held {
            process: &idle_small,
            memory: "4 GiB",
            sm_percent: 0,
        },
        Held {
            process: &busy,
            memory: "6 GiB",
            sm_percent: 70,
        },
        Held {
            process: &tiny,
            memory: "512 MiB",
            sm_percent: 0,
        },
    ]);
    setup.record();
    let out = setup.reap(&["--idle-for", "1m", "--max-kills", "1", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["schema"], 1);
    assert_eq!(report["dry_run"], true);
    assert_eq!(report["history"]["exists"], true);
    assert_eq!(report["history"]["last_sample"], "2026-11-29T20:34:00.000Z");
    // The most memory first within --max-kills.
    assert_eq!(pids(&report["candidates"]), [u64::from(idle.pid())]);
    let c = &report["candidates"][0];
    assert_eq!(c["outcome"], "would_signal");
    assert_eq!(c["used_bytes"], 8 * GIB);
    assert_eq!(c["policy"], "command-line");
    assert_eq!(c["sources"], serde_json::json!(["history"]));
    // Idle since the recording's first sample, by the driver's per-process SM figures.
    assert_eq!(c["idle_since"], "2026-11-29T20:31:31.000Z");
    let evidence = &c["gpus"][0]["evidence"];
    assert!(
        evidence
            .as_array()
            .unwrap()
            .contains(&Value::from("process-sm")),
        "{evidence}"
    );
    assert_eq!(
        stage_of(&report, idle_small.pid()),
        (
            "limit".to_owned(),
            "over --max-kills 1 this run; next run".to_owned()
        )
    );
    let (stage, reason) = stage_of(&report, busy.pid());
    assert_eq!(stage, "busy");
    assert!(reason.starts_with("active on GPU 0 at "), "{reason}");
    assert_eq!(
        stage_of(&report, tiny.pid()),
        (
            "memory".to_owned(),
            "holds 512.0 MiB, under 1.0 GiB".to_owned()
        )
    );
    // Left alone, listed most telling first.
    let stages: Vec<&str> = report["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["limit", "busy", "memory"]);
    for p in [&idle, &idle_small, &busy, &tiny] {
        assert!(p.alive(), "a dry run signalled PID {}", p.pid());
    }
    assert!(audit_rows(&setup.db()).is_empty());
    assert!(report["audit_log"].is_null());

    // The same plan as text.
    let out = setup.reap(&["--idle-for", "1m", "--max-kills", "1"]);
    assert_eq!(out.status.code(), Some(1));
    let mut settings = redactions();
    for (p, name) in [
        (&idle, "[IDLE]"),
        (&idle_small, "[IDLE_SMALL]"),
        (&busy, "[BUSY]"),
        (&tiny, "[TINY]"),
    ] {
        settings.add_filter(&format!(r"\b{}\b", p.pid()), name);
    }
    settings.add_filter(&format!(r"\b{}\b", regex::escape(&my_user())), "[USER]");
    settings.add_filter(&regex::escape(&setup.db().display().to_string()), "[DB]");
    settings.bind(|| {
        insta::assert_snapshot!(
            "reap_dry_run",
            String::from_utf8(out.stdout).expect("utf-8")
        );
    });
}

#[test]
fn apply_ends_exactly_the_candidates_verifies_the_memory_and_writes_the_audit_log() {
    let (mut idle, busy) = (sleeper(), sleeper());
    let setup = Setup::new(&[
        Held {
            process: &idle,
            memory: "8 GiB",
            sm_percent: 0,
        },
        Held {
            process: &busy,
            memory: "4 GiB",
            sm_percent: 70,
        },
    ]);
    setup.record();
    let out = setup.reap(&["--idle-for", "1m", "--apply", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["dry_run"], false);
    assert_eq!(report["ok"], true);
    assert_eq!(pids(&report["candidates"]), [u64::from(idle.pid())]);
    let c = &report["candidates"][0];
    assert_eq!(c["outcome"], "exited");
    assert_eq!(c["signals"], serde_json::json!(["SIGTERM"]));
    assert_eq!(c["freed_bytes"], 8 * GIB);
    assert_eq!(idle.killed_by(), Some(15));
    assert!(busy.alive(), "the busy holder was signalled");
    let d = &report["devices"][0];
    assert_eq!(d["released"], true);
    assert_eq!(d["freed_bytes"], 8 * GIB);
    assert_eq!(d["used_before_bytes"], 12 * GIB);
    assert_eq!(d["used_after_bytes"], 4 * GIB);
    assert_eq!(report["freed_bytes"], 8 * GIB);
    assert_eq!(report["audit_log"], setup.db().display().to_string());

    // One audit row, written before the signal, its outcome the memory freed.
    let rows = audit_rows(&setup.db());
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0].record;
    assert_eq!(r.action, "reap");
    assert_eq!(r.target.pid, idle.pid());
    assert_eq!(
        r.target.start_time_ticks,
        c["start_time_ticks"].as_u64().unwrap()
    );
    assert_eq!(r.signal, "SIGTERM+SIGCONT");
    assert!(
        r.reason
            .starts_with("vramctl reap, policy 'command-line': idle 2 min on GPU 0 by"),
        "{}",
        r.reason
    );
    assert!(
        matches!(r.outcome, AuditOutcome::Exited { freed_bytes, .. } if freed_bytes == 8 * GIB),
        "{:?}",
        r.outcome
    );

    // Read back through the CLI.
    let out = run(&mut setup.vramctl(&["history", "--audit", "--format", "json"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let log = json(&out);
    assert_eq!(log["records"].as_array().unwrap().len(), 1);
    assert_eq!(log["records"][0]["id"], rows[0].id);
    assert_eq!(log["records"][0]["action"], "reap");
    assert_eq!(log["records"][0]["target"]["pid"], idle.pid());
    assert_eq!(log["records"][0]["outcome"]["outcome"], "exited");
    let out = run(&mut setup.vramctl(&["history", "--audit", "--pid", &busy.pid().to_string()]));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("no audit records in that range"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // The next run finds nothing: the busy one stays busy.
    let out = setup.reap(&["--idle-for", "1m", "--apply", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(json(&out)["candidates"].as_array().unwrap().is_empty());
    assert!(busy.alive());
    assert_eq!(audit_rows(&setup.db()).len(), 1);
}

#[test]
fn every_watches_live_and_reaps_once_idle_long_enough() {
    let (mut idle, busy) = (sleeper(), sleeper());
    let setup = Setup::new(&[
        Held {
            process: &idle,
            memory: "8 GiB",
            sm_percent: 0,
        },
        Held {
            process: &busy,
            memory: "4 GiB",
            sm_percent: 70,
        },
    ]);
    // No history: the evidence is what reap itself watches, a sample a simulated minute.
    let out = run(&mut setup.vramctl(&[
        "reap",
        "--idle-for",
        "5m",
        "--every",
        "10m",
        "--interval",
        "1m",
        "--rounds",
        "2",
        "--simulated-clock",
        &T0.to_string(),
        "--apply",
        "--json",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rounds: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("NDJSON"))
        .collect();
    assert_eq!(rounds.len(), 2);
    // Round 1, at the first sample: nothing is known yet.
    assert_eq!(rounds[0]["round"], 1);
    assert_eq!(rounds[0]["live"]["samples"], 1);
    assert!(rounds[0]["candidates"].as_array().unwrap().is_empty());
    assert_eq!(stage_of(&rounds[0], idle.pid()).0, "no_evidence");
    // Round 2, ten simulated minutes later: idle for 10 min by what reap watched.
    assert_eq!(rounds[1]["round"], 2);
    assert_eq!(rounds[1]["at"], "2026-11-29T20:41:31.000Z");
    assert_eq!(rounds[1]["live"]["samples"], 11);
    assert_eq!(pids(&rounds[1]["candidates"]), [u64::from(idle.pid())]);
    let c = &rounds[1]["candidates"][0];
    assert_eq!(c["sources"], serde_json::json!(["live"]));
    assert_eq!(c["outcome"], "exited");
    assert_eq!(stage_of(&rounds[1], busy.pid()).0, "busy");
    assert_eq!(idle.killed_by(), Some(15));
    assert!(busy.alive());
    let rows = audit_rows(&setup.db());
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].record.target.pid, idle.pid());
}

#[test]
fn a_policy_file_chooses_and_a_malformed_one_is_one_line_with_file_and_line() {
    let (idle, other) = (sleeper(), sleeper());
    let setup = Setup::new(&[
        Held {
            process: &idle,
            memory: "8 GiB",
            sm_percent: 0,
        },
        Held {
            process: &other,
            memory: "2 GiB",
            sm_percent: 0,
        },
    ]);
    setup.record();
    let policies = setup.dir.path().join("reap.toml");
    std::fs::write(
        &policies,
        "[[policy]]\nname = \"big\"\nidle_for = \"1m\"\nmin_mem = \"6GiB\"\n\n\
         [[policy]]\nname = \"never\"\nidle_for = \"1m\"\nmatch = \"^jupyter\"\n",
    )
    .unwrap();
    let config = policies.display().to_string();
    let report = json(&setup.reap(&["--config", &config, "--json"]));
    assert_eq!(pids(&report["candidates"]), [u64::from(idle.pid())]);
    assert_eq!(report["candidates"][0]["policy"], "big");
    // The reason is the policy it got furthest through.
    assert_eq!(
        stage_of(&report, other.pid()),
        (
            "memory".to_owned(),
            "holds 2.0 GiB, under 6.0 GiB".to_owned()
        )
    );
    // --policy runs only the named one.
    let report = json(&setup.reap(&["--config", &config, "--policy", "never", "--json"]));
    assert!(report["candidates"].as_array().unwrap().is_empty());
    let out = setup.reap(&["--config", &config, "--policy", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no policy 'nope' in '") && stderr(&out).contains("big, never"),
        "{}",
        stderr(&out)
    );

    std::fs::write(
        &policies,
        "[[policy]]\nname = \"big\"\nidle_for = \"1m\"\nmin_mem = \"lots\"\n",
    )
    .unwrap();
    let out = setup.reap(&["--config", &config, "--apply"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(
        err,
        format!(
            "vramctl: error: {config}:4: min_mem: 'lots' is not a size{}\n",
            err.split_once("is not a size")
                .map_or("", |(_, rest)| rest.trim_end())
        )
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(idle.alive() && other.alive());
    assert!(audit_rows(&setup.db()).is_empty());
}

#[test]
fn usage_errors_and_no_driver() {
    let setup = Setup::new(&[]);
    for (args, message) in [
        (
            &["--idle-for", "0s"][..],
            "invalid value '0s' for '--idle-for <DURATION>': '0s' must be longer than 0",
        ),
        (&["--min-mem", "lots"], "--min-mem: 'lots' is not a size"),
        (
            &["--match", "(x"],
            "--match '(x' is not a valid regular expression",
        ),
        (&["--max-kills", "0"], "--max-kills 0 would never reap"),
        (
            &["--every", "10ms"],
            "invalid value '10ms' for '--every <DURATION>': '10ms' is shorter than 1s",
        ),
    ] {
        let out = setup.reap(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).starts_with(&format!("vramctl: error: {message}")),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    let out = run(setup
        .vramctl(&["reap"])
        .env("VRAMCTL_NVML_LIB", "/nonexistent/libnvidia-ml.so.1"));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // With --apply, a database that cannot be written stops reap before any round.
    let blocker = setup.dir.path().join("not-a-dir");
    std::fs::write(&blocker, "").unwrap();
    let out = run(vramctl_std(&setup.scenario)
        .env("VRAMCTL_DB", blocker.join("history.db"))
        .stdin(Stdio::null())
        .args(["reap", "--apply"]));
    assert!(
        stderr(&out).starts_with("vramctl: error: cannot open the audit log"),
        "{}",
        stderr(&out)
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn json_keys_are_the_documented_ones() {
    let (idle, busy) = (sleeper(), sleeper());
    let setup = Setup::new(&[
        Held {
            process: &idle,
            memory: "8 GiB",
            sm_percent: 0,
        },
        Held {
            process: &busy,
            memory: "4 GiB",
            sm_percent: 70,
        },
    ]);
    setup.record();
    let report = json(&setup.reap(&["--idle-for", "1m", "--apply", "--json"]));
    let documented = crate::ps::documented_keys("`vramctl reap --json`");
    let mut keys: Vec<&String> = report.as_object().unwrap().keys().collect();
    keys.extend(report["candidates"][0].as_object().unwrap().keys());
    for key in keys {
        assert!(documented.contains(key), "'{key}' is not in docs/json.md");
    }
    let audit = json(&run(
        &mut setup.vramctl(&["history", "--audit", "--format", "json"])
    ));
    let section = crate::ps::documented_keys("`vramctl history --audit --format json`");
    for key in audit.as_object().unwrap().keys() {
        assert!(section.contains(key), "'{key}' is not in docs/json.md");
    }
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/json.md"),
    )
    .unwrap();
    for key in audit["records"][0].as_object().unwrap().keys() {
        assert!(
            docs.contains(&format!("`{key}`")),
            "'{key}' is not in docs/json.md"
        );
    }
}

/// A Python process with the agent and the stand-in torch holding `cached` bytes in its
/// cache, its socket under `runtime`.
fn agent_process(runtime: &std::path::Path, cached: u64) -> Spawned {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = repo.join("python");
    let mut command = Command::new("python3");
    command
        .args([
            "-c",
            &format!(
                "import time, torch, vramctl_agent\n\
             x = torch.empty({cached}, dtype=torch.uint8, device='cuda')\n\
             del x\n\
             vramctl_agent.start()\n\
             print('ready', flush=True)\n\
             time.sleep(600)"
            ),
        ])
        .env(
            "PYTHONPATH",
            format!(
                "{}:{}",
                python.display(),
                python.join("tests/fakes/torch_pkg").display()
            ),
        )
        .env("XDG_RUNTIME_DIR", runtime)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let mut spawned = crate::real_processes::spawn(&mut command);
    assert_eq!(spawned.line(), "ready");
    spawned
}

#[test]
fn action_reclaim_releases_an_idle_holders_cache_and_leaves_it_running() {
    let runtime = tempfile::tempdir().expect("tempdir");
    let idle = agent_process(runtime.path(), 6 * GIB);
    let busy = sleeper();
    let setup = Setup::new(&[
        Held {
            process: &idle,
            memory: "8 GiB",
            sm_percent: 0,
        },
        Held {
            process: &busy,
            memory: "4 GiB",
            sm_percent: 70,
        },
    ]);
    setup.record();
    let out = setup.reap(&["--idle-for", "1m", "--action", "reclaim"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--apply would ask the agents of 1 process"),
        "{text}"
    );

    let out = setup.reap(&[
        "--idle-for",
        "1m",
        "--apply",
        "--action",
        "reclaim",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["action"], "reclaim");
    assert_eq!(pids(&report["candidates"]), [u64::from(idle.pid())]);
    let c = &report["candidates"][0];
    assert_eq!(c["outcome"], "reclaimed", "{report}");
    assert!(
        c["detail"]
            .as_str()
            .is_some_and(|d| d.contains("released 6.0 GiB of 6.0 GiB cached")),
        "{c}"
    );
    assert!(idle.alive() && busy.alive(), "reclaim signals nobody");
    let rows = audit_rows(&setup.db());
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].record.action, "reclaim");
    assert_eq!(rows[0].record.signal, "none");
    assert!(
        rows[0].record.reason.contains("policy 'command-line'"),
        "{}",
        rows[0].record.reason
    );
    assert_eq!(
        rows[0].record.outcome,
        AuditOutcome::Reclaimed {
            released_bytes: 6 * GIB
        }
    );

    // Nothing is left to release: the same round now reclaims nothing, exit 1.
    let out = setup.reap(&[
        "--idle-for",
        "1m",
        "--apply",
        "--action",
        "reclaim",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(json(&out)["candidates"][0]["outcome"], "nothing_reclaimed");
}

/// `reap --job`: only the job's idle holders are candidates (a dry run lists them); two
/// other idle holders of the same size are left alone at the filter, with the selector as
/// the reason; `--apply` ends the job's and no other.
#[test]
fn reap_by_job_takes_only_that_jobs_idle_holders() {
    let job_sleeper = |job: &str| {
        let mut command = Command::new("sleep");
        command.arg("600").env("SLURM_JOB_ID", job);
        crate::real_processes::spawn(&mut command)
    };
    let (mut in_job, other_job, no_job) = (job_sleeper("4242"), job_sleeper("4343"), sleeper());
    let setup = Setup::new(&[
        Held {
            process: &in_job,
            memory: "8 GiB",
            sm_percent: 0,
        },
        Held {
            process: &other_job,
            memory: "8 GiB",
            sm_percent: 0,
        },
        Held {
            process: &no_job,
            memory: "8 GiB",
            sm_percent: 0,
        },
    ]);
    setup.record();
    let out = setup.reap(&["--idle-for", "1m", "--job", "4242", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(pids(&report["candidates"]), [u64::from(in_job.pid())]);
    for p in [&other_job, &no_job] {
        assert_eq!(
            stage_of(&report, p.pid()),
            ("filter".to_owned(), "not selected by --job 4242".to_owned())
        );
    }
    assert!(in_job.alive(), "a dry run sends nothing");
    let out = setup.reap(&["--idle-for", "1m", "--job", "4242", "--apply"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(in_job.killed_by(), Some(15));
    assert!(other_job.alive() && no_job.alive());
}
