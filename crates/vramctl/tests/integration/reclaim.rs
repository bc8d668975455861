//! `vramctl reclaim` against real agent processes: python3 running `python/tests/target.py`
//! with the agent and the stand-in torch (`python/tests/fakes`), listed by the fake NVML as
//! `real` processes. The stand-in's `empty_cache` is wrapped to move the fake NVML's clock
//! (a clock file) past the point where the scenario drops the process's memory, as the
//! driver's figure drops when `cudaFree` returns; so NVML's before and after are read by
//! vramctl through the backend, not told to it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use crate::harness::vramctl_std;

pub(crate) const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A Python process steered over stdin (`python/tests/target.py`), with its own
/// `XDG_RUNTIME_DIR` (where its agent puts its socket) and the fake NVML's clock file.
pub(crate) struct Py {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub(crate) dir: tempfile::TempDir,
}

impl Py {
    pub(crate) fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`start`](Self::start) with `env` added to its environment.
    pub(crate) fn start_with(env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("clock"), "0").expect("clock file");
        let python = repo().join("python");
        let mut child = Command::new("python3")
            .arg(python.join("tests/target.py"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env(
                "PYTHONPATH",
                format!(
                    "{}:{}",
                    python.display(),
                    python.join("tests/fakes/torch_pkg").display()
                ),
            )
            .env("XDG_RUNTIME_DIR", dir.path())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut py = Self {
            child,
            stdin,
            stdout,
            dir,
        };
        let mut line = String::new();
        py.stdout.read_line(&mut line).expect("ready line");
        assert!(line.contains("\"ready\": true"), "{line}");
        py
    }

    pub(crate) fn exec(&mut self, code: &str) {
        let line = serde_json::json!({"exec": code, "eval": "None"}).to_string();
        writeln!(self.stdin, "{line}").expect("send");
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).expect("answer");
        assert!(answer.contains("\"ok\": true"), "{answer}");
    }

    /// torch with `cached` bytes in its cache and `kept` bytes in a live tensor, the agent
    /// started, and `empty_cache` moving the fake NVML's clock to 10 s.
    pub(crate) fn agent(cached: u64, kept: u64) -> Self {
        let mut py = Self::start();
        let clock = py.clock().display().to_string();
        py.exec(&format!(
            "import torch, vramctl_agent\n\
             kept = torch.empty({kept}, dtype=torch.uint8, device='cuda') if {kept} else None\n\
             x = torch.empty({cached}, dtype=torch.uint8, device='cuda') if {cached} else None\n\
             del x\n\
             _empty_cache = torch.cuda.empty_cache\n\
             def _moving_the_clock():\n\
             \x20   _empty_cache()\n\
             \x20   open({clock:?}, 'w').write('10')\n\
             torch.cuda.empty_cache = _moving_the_clock\n\
             vramctl_agent.start()"
        ));
        py
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn clock(&self) -> PathBuf {
        self.dir.path().join("clock")
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One GPU; each `(pid, before, after)` a real process whose NVML figure is `before` until
/// t = 10 s, `after` from then on.
/// Two stand-in torch processes, one with the agent (1 GiB kept, 20 GiB cached: NVML shows
/// 22 GiB) and one without (1 GiB), and a scenario listing both on one GPU.
pub(crate) fn one_with_an_agent_one_without() -> (Py, Py, PathBuf) {
    let py = Py::agent(20 * GIB, GIB);
    let without = Py::start();
    let scenario = scenario(
        py.dir.path(),
        &[
            (py.pid(), "22 GiB", "22 GiB"),
            (without.pid(), "1 GiB", "1 GiB"),
        ],
    );
    (py, without, scenario)
}

pub(crate) fn scenario(dir: &Path, processes: &[(u32, &str, &str)]) -> PathBuf {
    let mut text = String::from(
        "[[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"GPU-8cca1523-521a-59dd-48fa-95c44bc1b100\"\n\
         memory_total = \"140 GiB\"\nmemory_reserved = \"615 MiB\"\n",
    );
    for (pid, before, after) in processes {
        text.push_str(&format!(
            "[[gpu.process]]\npid = {pid}\nreal = true\n\
             memory = {{ points = [[0.0, \"{before}\"], [10.0, \"{after}\"]] }}\n"
        ));
    }
    let path = dir.join("scenario.toml");
    std::fs::write(&path, text).expect("scenario");
    path
}

/// `vramctl reclaim ARGS --json` on `scenario` with the fake's clock in `clock`, the audit
/// log in `db`: (exit code, JSON, stderr).
fn reclaim(
    scenario: &Path,
    clock: &Path,
    db: &Path,
    args: &[&str],
) -> (i32, serde_json::Value, String) {
    let output = vramctl_std(scenario)
        .env_remove("FAKE_NVML_TIME")
        .env("FAKE_NVML_CLOCK_FILE", clock)
        .arg("reclaim")
        .args(args)
        .arg("--json")
        .arg("--db")
        .arg(db)
        .output()
        .expect("vramctl runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let json = serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null);
    (
        output.status.code().unwrap_or(-1),
        json,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn reclaim_reports_what_the_framework_released_and_what_nvml_shows_returned() {
    let py = Py::agent(20 * GIB, 0);
    let pid = py.pid();
    let scenario = scenario(py.dir.path(), &[(pid, "21 GiB", "1 GiB")]);
    let db = py.dir.path().join("history.db");
    let (code, json, stderr) = reclaim(&scenario, &py.clock(), &db, &[&pid.to_string()]);
    assert_eq!(code, 0, "{stderr} {json}");
    let p = &json["processes"][0];
    assert_eq!(p["status"], "reclaimed", "{json}");
    assert_eq!(p["released_bytes"], 20 * GIB);
    assert_eq!(p["nvml_before_bytes"], 21 * GIB);
    assert_eq!(p["nvml_after_bytes"], GIB);
    assert_eq!(p["nvml_returned_bytes"], 20 * GIB);
    assert_eq!(p["agent"]["outcome"], "released_all");
    assert_eq!(json["ok"], true);

    // Audited like kill: the row is in the history's audit table.
    let audit = vramctl_std(&scenario)
        .args(["history", "--audit", "--json", "--db"])
        .arg(&db)
        .output()
        .expect("history runs");
    let audit: serde_json::Value = serde_json::from_slice(&audit.stdout).expect("JSON");
    let record = &audit["records"][0];
    assert_eq!(record["action"], "reclaim", "{audit}");
    assert_eq!(record["target"]["pid"], pid, "{audit}");
    assert_eq!(record["outcome"]["outcome"], "reclaimed", "{audit}");
    assert_eq!(
        record["outcome"]["detail"]["released_bytes"],
        20 * GIB,
        "{audit}"
    );
}

#[test]
fn a_dry_run_says_what_would_come_back_and_changes_nothing() {
    let py = Py::agent(3 * GIB, 0);
    let pid = py.pid();
    let scenario = scenario(py.dir.path(), &[(pid, "4 GiB", "1 GiB")]);
    let db = py.dir.path().join("history.db");
    let (code, json, stderr) = reclaim(
        &scenario,
        &py.clock(),
        &db,
        &[&pid.to_string(), "--dry-run"],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["processes"][0]["status"], "would_reclaim");
    assert_eq!(json["released_bytes"], 3 * GIB);
    assert_eq!(json["processes"][0]["nvml_returned_bytes"], 0);
    assert!(!db.exists(), "a dry run writes no audit record");
    // Still cached: a real reclaim gets all of it.
    let (code, json, _) = reclaim(&scenario, &py.clock(), &db, &[&pid.to_string()]);
    assert_eq!(
        (code, &json["released_bytes"]),
        (0, &serde_json::json!(3 * GIB))
    );
}

#[test]
fn a_dry_run_says_what_would_happen_not_that_it_released_some() {
    // Issue 29: `reclaim --dry-run` said "(released some)" of a run that released nothing.
    let py = Py::agent(3 * GIB, GIB);
    let pid = py.pid();
    let scenario = scenario(py.dir.path(), &[(pid, "5 GiB", "5 GiB")]);
    let db = py.dir.path().join("history.db");
    let output = vramctl_std(&scenario)
        .env_remove("FAKE_NVML_TIME")
        .env("FAKE_NVML_CLOCK_FILE", py.clock())
        .args(["reclaim", &pid.to_string(), "--dry-run", "--db"])
        .arg(&db)
        .output()
        .expect("vramctl runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(!text.contains("released some"), "{text}");
    // 3 GiB cached, 1 GiB live: all of the cache would come back (the agent's outcome for a
    // dry run, `released_some`, counts nothing as released).
    assert!(
        text.lines().any(|l| l
            == "  the framework would release 3.0 GiB of 3.0 GiB cached (all of it would be released)"),
        "{text}"
    );
    assert!(text.contains("dry run: nothing was released"), "{text}");
}

#[test]
fn nothing_to_reclaim_exits_1_and_says_so() {
    let py = Py::agent(0, 4 * GIB);
    let pid = py.pid();
    let scenario = scenario(py.dir.path(), &[(pid, "5 GiB", "5 GiB")]);
    let db = py.dir.path().join("history.db");
    let (code, json, _) = reclaim(&scenario, &py.clock(), &db, &[&pid.to_string()]);
    assert_eq!(code, 1, "{json}");
    let p = &json["processes"][0];
    assert_eq!(p["status"], "nothing_reclaimed");
    assert_eq!(p["agent"]["outcome"], "nothing_cached");
    assert_eq!(p["nvml_returned_bytes"], 0);
}

#[test]
fn a_pinned_segment_is_reported_with_the_block_that_pins_it() {
    let mut py = Py::agent(8 * GIB, 0);
    // A 4 MiB tensor placed by best fit inside the cached 8 GiB segment.
    py.exec("small = torch.empty(4 << 20, dtype=torch.uint8, device='cuda')");
    let pid = py.pid();
    let scenario = scenario(py.dir.path(), &[(pid, "9 GiB", "9 GiB")]);
    let db = py.dir.path().join("history.db");
    let (code, json, _) = reclaim(&scenario, &py.clock(), &db, &[&pid.to_string()]);
    assert_eq!(code, 1, "{json}");
    let agent = &json["processes"][0]["agent"];
    assert_eq!(agent["outcome"], "nothing_released");
    let segment = &agent["devices"][0]["pinned_segments"][0];
    assert_eq!(segment["total_bytes"], 8 * GIB);
    assert_eq!(segment["live_bytes"], 4 * MIB);
    assert_eq!(segment["blocks"][0]["size_bytes"], 4 * MIB);

    // And in the text, with what to do about it.
    let output = vramctl_std(&scenario)
        .env_remove("FAKE_NVML_TIME")
        .env("FAKE_NVML_CLOCK_FILE", py.clock())
        .args(["reclaim", &pid.to_string(), "--db"])
        .arg(&db)
        .output()
        .expect("vramctl runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("segment 8.0 GiB"), "{text}");
    assert!(text.contains("4.0 MiB live in 1 block"), "{text}");
    assert!(text.contains("expandable_segments:True"), "{text}");
}

#[test]
fn a_process_without_an_agent_is_a_clear_no_and_exit_1() {
    // A Python process that never started the agent.
    let py = Py::start();
    let pid = py.pid();
    let scenario = scenario(py.dir.path(), &[(pid, "2 GiB", "2 GiB")]);
    let db = py.dir.path().join("history.db");
    let started = std::time::Instant::now();
    let (code, json, _) = reclaim(&scenario, &py.clock(), &db, &[&pid.to_string()]);
    assert_eq!(code, 1);
    let p = &json["processes"][0];
    assert_eq!(p["status"], "no_agent");
    assert!(
        p["error"]["message"].as_str().is_some_and(
            |m| m.contains("has no vramctl agent") && m.contains("vramctl_agent.start()")
        ),
        "{p}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn all_asks_every_gpu_process_and_counts_those_without_an_agent() {
    let with = Py::agent(2 * GIB, 0);
    let without = Py::start();
    let scenario = scenario(
        with.dir.path(),
        &[
            (with.pid(), "3 GiB", "1 GiB"),
            (without.pid(), "1 GiB", "1 GiB"),
        ],
    );
    let db = with.dir.path().join("history.db");
    let (code, json, stderr) = reclaim(&scenario, &with.clock(), &db, &["--all"]);
    assert_eq!(code, 0, "{stderr} {json}");
    let statuses: Vec<(u64, String)> = json["processes"]
        .as_array()
        .expect("list")
        .iter()
        .map(|p| {
            (
                p["pid"].as_u64().unwrap_or(0),
                p["status"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert!(
        statuses.contains(&(u64::from(with.pid()), "reclaimed".into())),
        "{statuses:?}"
    );
    assert!(
        statuses.contains(&(u64::from(without.pid()), "no_agent".into())),
        "{statuses:?}"
    );
    assert_eq!(json["released_bytes"], 2 * GIB);

    // The text counts the process without an agent instead of listing it.
    let output = vramctl_std(&scenario)
        .env_remove("FAKE_NVML_TIME")
        .env("FAKE_NVML_CLOCK_FILE", with.clock())
        .args(["reclaim", "--all", "--dry-run"])
        .output()
        .expect("vramctl runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("1 GPU process without an agent"), "{text}");
    assert!(!text.contains(&format!("PID {}", without.pid())), "{text}");
}

#[test]
fn a_pid_that_does_not_exist_is_said_and_exit_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = dir.path().join("clock");
    std::fs::write(&clock, "0").expect("clock");
    let pid = crate::harness::free_pids(1)[0];
    let scenario = scenario(dir.path(), &[]);
    let (code, json, _) = reclaim(
        &scenario,
        &clock,
        &dir.path().join("h.db"),
        &[&pid.to_string()],
    );
    assert_eq!(code, 1);
    assert_eq!(json["processes"][0]["status"], "no_process");
}

#[test]
fn pids_and_all_together_are_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = vramctl_std(&scenario(dir.path(), &[]))
        .args(["reclaim", "1", "--all"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    let output = vramctl_std(&scenario(dir.path(), &[]))
        .args(["reclaim", "--gc", "--dry-run", "1"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn an_audit_log_that_cannot_be_written_reclaims_nothing() {
    let py = Py::agent(2 * GIB, 0);
    let pid = py.pid();
    let scenario = scenario(py.dir.path(), &[(pid, "3 GiB", "1 GiB")]);
    // A file where the database's directory should be.
    let blocker = py.dir.path().join("not-a-dir");
    std::fs::write(&blocker, "").expect("file");
    let (code, _, stderr) = reclaim(
        &scenario,
        &py.clock(),
        &blocker.join("history.db"),
        &[&pid.to_string()],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("audit log"), "{stderr}");
    // The cache is still there: nothing was asked.
    let db = py.dir.path().join("history.db");
    let (code, json, _) = reclaim(
        &scenario,
        &py.clock(),
        &db,
        &[&pid.to_string(), "--dry-run"],
    );
    assert_eq!(
        (code, &json["released_bytes"]),
        (0, &serde_json::json!(2 * GIB))
    );
}

#[test]
fn ps_shows_allocated_and_cached_beside_nvml_for_a_process_with_an_agent() {
    let (py, without, scenario) = one_with_an_agent_one_without();
    let output = vramctl_std(&scenario)
        .args(["ps", "--json", "--cpu-interval", "0"])
        .output()
        .expect("ps runs");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let row = |pid: u32| {
        json["processes"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["pid"] == pid).cloned())
            .unwrap_or_default()
    };
    let with = row(py.pid());
    assert_eq!(with["used_bytes"], 22 * GIB, "{json}");
    assert_eq!(with["agent"]["allocated_bytes"], GIB, "{json}");
    assert_eq!(with["agent"]["cached_bytes"], 20 * GIB, "{json}");
    assert_eq!(with["agent"]["releasable_bytes"], 20 * GIB, "{json}");
    assert!(row(without.pid()).get("agent").is_none(), "{json}");

    let text = vramctl_std(&scenario)
        .args(["ps", "--cpu-interval", "0"])
        .output()
        .expect("ps runs");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("ALLOCATED") && text.contains("CACHED"),
        "{text}"
    );
    assert!(text.contains("20.0 GiB"), "{text}");
}

#[test]
fn json_keys_are_the_documented_ones() {
    let py = Py::agent(GIB, 0);
    let pid = py.pid();
    let scenario = scenario(py.dir.path(), &[(pid, "2 GiB", "1 GiB")]);
    let db = py.dir.path().join("history.db");
    let (_, json, _) = reclaim(&scenario, &py.clock(), &db, &[&pid.to_string()]);
    let documented = crate::ps::documented_keys("`vramctl reclaim --json`");
    let mut keys: Vec<&String> = json.as_object().expect("object").keys().collect();
    keys.extend(json["processes"][0].as_object().expect("object").keys());
    for key in keys {
        assert!(documented.contains(key), "'{key}' is not in docs/json.md");
    }
}

#[test]
fn reclaim_deep_drops_the_last_exception_and_the_tensors_its_frames_held() {
    let mut py = Py::agent(0, 0);
    py.exec(
        "import sys\n\
         def step():\n\
         \x20   activations = torch.empty(3 << 30, dtype=torch.uint8, device='cuda')\n\
         \x20   raise MemoryError('CUDA out of memory (simulated)')\n\
         try:\n\
         \x20   step()\n\
         except MemoryError:\n\
         \x20   sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()",
    );
    let pid = py.pid();
    let scenario = scenario(py.dir.path(), &[(pid, "4 GiB", "1 GiB")]);
    let db = py.dir.path().join("history.db");
    let (code, json, stderr) = reclaim(&scenario, &py.clock(), &db, &[&pid.to_string(), "--deep"]);
    assert_eq!(code, 0, "{stderr} {json}");
    let p = &json["processes"][0];
    assert_eq!(p["released_bytes"], 3 * GIB, "{json}");
    assert_eq!(p["nvml_returned_bytes"], 3 * GIB, "{json}");
    let deep = &p["agent"]["deep"];
    assert_eq!(deep["in_ipython"], false, "{deep}");
    let dropped = &deep["dropped"][0];
    assert_eq!(dropped["what"], "last_exception", "{deep}");
    assert_eq!(
        dropped["detail"],
        "MemoryError: CUDA out of memory (simulated)"
    );
    assert_eq!(
        (&dropped["tensors"], &dropped["tensor_bytes"]),
        (&serde_json::json!(1), &serde_json::json!(3 * GIB))
    );
    assert!(
        p["agent"]["gc"]["collected"].is_u64(),
        "deep implies gc: {json}"
    );
}

#[test]
fn reclaim_deep_in_a_shell_says_what_it_dropped_by_name() {
    let mut py = Py::agent(0, 0);
    let ipython = repo().join("python/tests/fakes/ipython_pkg");
    py.exec(&format!(
        "import sys\n\
         sys.path.insert(0, {:?})\n\
         import IPython\n\
         shell = IPython.make_shell()\n\
         shell.displayhook(torch.empty(1 << 30, dtype=torch.uint8, device='cuda'))\n\
         def cell():\n\
         \x20   hidden = torch.empty(2 << 30, dtype=torch.uint8, device='cuda')\n\
         \x20   1 / 0\n\
         try:\n\
         \x20   cell()\n\
         except ZeroDivisionError:\n\
         \x20   shell.show_error()",
        ipython.display().to_string()
    ));
    let pid = py.pid();
    let scenario = scenario(py.dir.path(), &[(pid, "4 GiB", "1 GiB")]);
    let db = py.dir.path().join("history.db");
    let output = vramctl_std(&scenario)
        .env_remove("FAKE_NVML_TIME")
        .env("FAKE_NVML_CLOCK_FILE", py.clock())
        .args(["reclaim", &pid.to_string(), "--deep", "--db"])
        .arg(&db)
        .output()
        .expect("vramctl runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("released 3.0 GiB"), "{text}");
    assert!(
        text.contains("deep: dropped the last exception (ZeroDivisionError: division by zero): "),
        "{text}"
    );
    assert!(text.contains("1 tensor (2.0 GiB on the GPU)"), "{text}");
    assert!(text.contains("InteractiveTB.tb"), "{text}");
    assert!(
        text.contains("deep: dropped the output cache: 1 entry [Out, _, _1]"),
        "{text}"
    );
}

#[test]
fn deep_and_dry_run_together_are_a_usage_error() {
    let output = vramctl_std(Path::new("/nonexistent"))
        .args(["reclaim", "1", "--deep", "--dry-run"])
        .output()
        .expect("vramctl runs");
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn reclaim_attach_says_why_it_is_not_available_and_exits_1() {
    // This machine's python3 is before 3.14 (the suite's target), one with an agent, and a
    // process that is not Python at all.
    let plain = Py::start();
    let with_agent = Py::agent(GIB, 0);
    let mut sleep = Command::new("sleep").arg("30").spawn().expect("sleep runs");
    let scenario = scenario(plain.dir.path(), &[]);
    let db = plain.dir.path().join("history.db");
    let pids = [plain.pid(), with_agent.pid(), sleep.id()].map(|p| p.to_string());
    let mut args: Vec<&str> = vec!["--attach"];
    args.extend(pids.iter().map(String::as_str));
    let (code, json, stderr) = reclaim(&scenario, &plain.clock(), &db, &args);
    let _ = sleep.kill();
    let _ = sleep.wait();
    assert_eq!(code, 1, "{stderr} {json}");
    let by_pid = |pid: u32| {
        json["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"] == pid)
            .cloned()
            .expect("listed")
    };
    let p = by_pid(plain.pid());
    assert_eq!(p["status"], "not_attachable", "{json}");
    let too_old = &p["error"];
    if too_old["code"] == "too_old" {
        assert!(
            too_old["message"]
                .as_str()
                .is_some_and(|m| m.contains("needs 3.14 or later")),
            "{too_old}"
        );
    } else {
        // A python3 of 3.14 or later here: it may be attachable, or not for another reason.
        assert!(
            too_old["code"].is_string() || p["status"] != "not_attachable",
            "{p}"
        );
    }
    assert_eq!(
        by_pid(with_agent.pid())["error"]["code"],
        "has_agent",
        "{json}"
    );
    assert_eq!(by_pid(sleep.id())["error"]["code"], "not_python", "{json}");
    // Nothing was asked, so nothing was audited.
    assert!(
        !db.exists() || {
            let audit = vramctl_std(&scenario)
                .args(["history", "--audit", "--json", "--db"])
                .arg(&db)
                .output()
                .expect("history runs");
            let audit: serde_json::Value = serde_json::from_slice(&audit.stdout).expect("JSON");
            audit["records"].as_array().is_none_or(Vec::is_empty)
        }
    );
}

#[test]
fn attach_and_all_together_are_a_usage_error() {
    let output = vramctl_std(Path::new("/nonexistent"))
        .args(["reclaim", "--all", "--attach"])
        .output()
        .expect("vramctl runs");
    assert_eq!(output.status.code(), Some(2));
}
