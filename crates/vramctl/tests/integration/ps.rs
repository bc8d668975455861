//! `vramctl ps`: fictional PIDs from the example scenarios, and real processes listed in
//! scenarios written by the test.

use serde_json::Value;

use crate::harness::{json_of, redactions, scenario, stdout_of, vramctl, vramctl_on};
use crate::real_processes::{Holder, Scenario, my_user, sleeper, tree, unused_pids};

const GIB: u64 = 1 << 30;

fn processes(report: &Value) -> &Vec<Value> {
    report["processes"].as_array().expect("processes")
}

fn pids(report: &Value) -> Vec<u64> {
    processes(report)
        .iter()
        .map(|p| p["pid"].as_u64().expect("pid"))
        .collect()
}

/// `h200-training.toml` with its PIDs moved to PIDs that are free here (a real process
/// with one of them would be listed as itself), and filters that show the originals.
fn training_scenario() -> (tempfile::TempDir, std::path::PathBuf, insta::Settings) {
    let text = std::fs::read_to_string(scenario("h200-training.toml")).expect("example");
    let original: Vec<u32> = text
        .lines()
        .filter_map(|l| l.strip_prefix("pid = ")?.trim().parse().ok())
        .collect();
    assert_eq!(original.len(), 4);
    let free = unused_pids(original.len());
    let mut moved = text.clone();
    let mut settings = redactions();
    for (from, to) in original.iter().zip(&free) {
        moved = moved.replace(&format!("pid = {from}\n"), &format!("pid = {to}\n"));
        settings.add_filter(&format!(r"\b{to}\b"), from.to_string());
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("training.toml");
    std::fs::write(&path, moved).expect("write");
    (dir, path, settings)
}

#[test]
fn fictional_pids_table() {
    // The scenario's PIDs do not exist here: listed, marked, with the driver's names.
    let (_dir, path, settings) = training_scenario();
    let out = stdout_of(vramctl(&path).args(["ps", "--cpu-interval", "0"]));
    settings.bind(|| insta::assert_snapshot!("ps_h200_training", out));
}

#[test]
fn fictional_pids_json() {
    let (_dir, path, settings) = training_scenario();
    let report = json_of(vramctl(&path).args(["ps", "--json", "--cpu-interval", "0"]));
    assert_eq!(report["schema"], 1);
    assert_eq!(report["cpu_interval_s"], Value::Null);
    let list = processes(&report);
    assert_eq!(list.len(), 4);
    let sizes: Vec<u64> = list
        .iter()
        .map(|p| p["used_bytes"].as_u64().unwrap())
        .collect();
    assert!(
        sizes.windows(2).all(|w| w[0] >= w[1]),
        "biggest first: {sizes:?}"
    );
    for p in list {
        assert_eq!(p["visible"], false);
        assert_eq!(p["user"], Value::Null, "unknown, not guessed");
        assert!(p["command"].is_string());
        assert_eq!(p["gpus"][0]["index"], 0);
    }
    let unaccounted = report["unaccounted"].as_array().unwrap();
    assert_eq!(unaccounted.len(), 1);
    assert!(unaccounted[0]["bytes"].as_u64().unwrap() > 0);
    // Whether CI runs in the host PID namespace is not this snapshot's business.
    let mut report = report;
    let ns = report
        .as_object_mut()
        .and_then(|o| o.remove("pid_namespace_initial"));
    assert!(ns.is_some_and(|v| v.is_boolean()));
    settings.bind(|| insta::assert_json_snapshot!("ps_h200_training_json", report));
}

#[test]
fn mig_instances_are_named_per_process() {
    let report = json_of(vramctl_on("mig.toml").args(["ps", "--json", "--cpu-interval", "0"]));
    let on_mig: Vec<&Value> = processes(&report)
        .iter()
        .filter(|p| !p["gpus"][0]["gpu_instance_id"].is_null())
        .collect();
    assert!(!on_mig.is_empty());
    for p in on_mig {
        assert!(
            p["gpus"][0]["mig_uuid"]
                .as_str()
                .unwrap()
                .starts_with("MIG-"),
            "{p}"
        );
    }
    let out = stdout_of(vramctl_on("mig.toml").args(["ps", "--cpu-interval", "0"]));
    assert!(out.contains("0 (GI 2 CI 0)"), "{out}");
}

/// Redacts what changes between runs of the real-process table and drops alignment
/// (PID widths differ between machines).
fn real_table_settings(names: &[(u32, &str)]) -> insta::Settings {
    let mut settings = redactions();
    for (pid, name) in names {
        settings.add_filter(&format!(r"\b{pid}\b"), *name);
    }
    settings.add_filter(&format!(r"\b{}\b", regex::escape(&my_user())), "[USER]");
    settings.add_filter(r"\b\d+(\.\d)? (B|KiB|MiB)\b", "[RSS]");
    settings.add_filter(r"\b(\d+d)?(\d+h)?(\d+m)?\d\d?s\b", "[AGE]");
    settings.add_filter(r"(\d+\.\d|-)( +)\[RSS\]", "[CPU]$2[RSS]");
    settings.add_filter(r" +", " ");
    // Right-aligned PIDs: the header's indent depends on how many digits the real PIDs have
    // (after a PID wraparound, three).
    settings.add_filter(r"(?m)^ ", "");
    settings
}

#[test]
fn real_processes_tree() {
    let t = tree();
    let other = sleeper();
    let root = t.root.pid();
    let scenario = Scenario::new(
        2,
        &[
            Holder::real(0, root, "4 GiB"),
            Holder::real(1, t.grandchild, "2 GiB"),
            Holder::real(0, other.pid(), "10 GiB"),
            Holder::real(1, other.pid(), "1 GiB"),
        ],
    );
    let report =
        json_of(vramctl(scenario.path()).args(["ps", "--tree", "--json", "--cpu-interval", "0"]));
    assert_eq!(report["tree"], true);
    let me = u64::from(std::process::id());
    // Depth first: the 11 GiB sleeper, then the tree: root, middle (no GPU), grandchild.
    assert_eq!(
        pids(&report),
        [
            u64::from(other.pid()),
            u64::from(root),
            u64::from(t.middle),
            u64::from(t.grandchild)
        ]
    );
    let list = processes(&report);
    assert_eq!(list[0]["used_bytes"], 11 * GIB);
    assert_eq!(list[0]["gpus"].as_array().unwrap().len(), 2);
    assert_eq!(list[0]["ppid"], me);
    assert_eq!(list[0]["tree_parent"], Value::Null);
    assert_eq!(list[2]["tree_parent"], root);
    assert_eq!(list[2]["gpus"], serde_json::json!([]));
    assert_eq!(list[3]["tree_parent"], t.middle);
    assert_eq!(list[1]["children"], serde_json::json!([t.middle]));
    let my_uid = vramctl_procs::procinfo::read_status(std::process::id())
        .unwrap()
        .uid_real
        .unwrap();
    for p in list {
        assert_eq!(p["visible"], true);
        assert_eq!(p["uid"], my_uid);
        assert!(p["user"].is_string());
        assert!(p["start_time_ticks"].as_u64().is_some());
        assert!(p["rss_bytes"].as_u64().is_some());
        assert_eq!(p["zombie"], false);
        assert!(p["started_at"].as_str().unwrap().ends_with('Z'));
    }

    let out = stdout_of(vramctl(scenario.path()).args(["ps", "--tree", "--cpu-interval", "0"]));
    real_table_settings(&[
        (other.pid(), "[OTHER]"),
        (root, "[ROOT]"),
        (t.middle, "[MIDDLE]"),
        (t.grandchild, "[GRANDCHILD]"),
        (std::process::id(), "[TEST]"),
    ])
    .bind(|| insta::assert_snapshot!("ps_real_tree", out));
}

#[test]
fn filters_and_sorting() {
    let small = sleeper();
    let big = sleeper();
    let ghost = unused_pids(1)[0];
    let scenario = Scenario::new(
        2,
        &[
            Holder::real(0, small.pid(), "1 GiB"),
            Holder::real(1, big.pid(), "6 GiB"),
            Holder::fictional(0, ghost, "3 GiB"),
        ],
    );
    let ps = |args: &[&str]| {
        let mut all = vec!["ps", "--json", "--cpu-interval", "0"];
        all.extend_from_slice(args);
        json_of(vramctl(scenario.path()).args(all))
    };
    let (s, b, g) = (
        u64::from(small.pid()),
        u64::from(big.pid()),
        u64::from(ghost),
    );
    assert_eq!(pids(&ps(&[])), [b, g, s], "by memory");
    let mut by_pid = vec![s, b, g];
    by_pid.sort_unstable();
    assert_eq!(pids(&ps(&["--sort", "pid"])), by_pid);
    let mut min_mem = vec![b, g];
    min_mem.sort_by_key(|p| std::cmp::Reverse(if *p == b { 6 } else { 3 }));
    assert_eq!(pids(&ps(&["--min-mem", "2GiB"])), min_mem);
    assert_eq!(pids(&ps(&["--gpu", "1"])), [b]);
    assert_eq!(pids(&ps(&["--match", "^sleep"])), [b, s]);
    let me = vramctl_procs::procinfo::read_status(std::process::id())
        .unwrap()
        .uid_real
        .unwrap()
        .to_string();
    assert_eq!(pids(&ps(&["--user", &me])), [b, s]);
    // A uid no process here runs as (a name nobody has is an error, see below).
    let nobody = ps(&["--user", "3999999"]);
    assert!(pids(&nobody).is_empty());
    assert_eq!(
        nobody["unaccounted"],
        serde_json::json!([]),
        "hidden under --user"
    );
    assert_eq!(ps(&[])["unaccounted"][0]["bytes"], GIB);
    // The oldest first: the two sleepers started in order (or in the same tick).
    let by_age = pids(&ps(&["--sort", "age"]));
    assert_eq!(by_age.len(), 3);
}

#[test]
fn a_filter_that_hides_every_holder_says_so_and_how_many_it_hid() {
    // Issue 29: `ps --user alice` said "no process holds GPU memory" while four did: the
    // answer to the filter read as an idle GPU.
    let (a, b) = (sleeper(), sleeper());
    let ghost = unused_pids(1)[0];
    let scenario = Scenario::new(
        1,
        &[
            Holder::real(0, a.pid(), "1 GiB"),
            Holder::real(0, b.pid(), "2 GiB"),
            Holder::fictional(0, ghost, "3 GiB"),
        ],
    );
    let ps = |args: &[&str]| {
        let mut all = vec!["ps", "--cpu-interval", "0"];
        all.extend_from_slice(args);
        stdout_of(vramctl(scenario.path()).args(all))
    };
    assert_eq!(
        ps(&["--user", "3999999"]),
        "no process of uid 3999999 holds GPU memory (3 others do)\n"
    );
    assert_eq!(
        ps(&["--match", "^no such command$", "--min-mem", "1GiB"]),
        "no process matching '^no such command$' holding at least 1.0 GiB holds GPU memory \
         (3 others do)\n"
    );
    let json = json_of(vramctl(scenario.path()).args([
        "ps",
        "--json",
        "--cpu-interval",
        "0",
        "--user",
        "3999999",
    ]));
    assert_eq!(json["filtered_out"], 3);
    // Without a filter nothing is hidden; on an idle GPU the answer is as before.
    assert_eq!(
        json_of(vramctl(scenario.path()).args(["ps", "--json", "--cpu-interval", "0"]))["filtered_out"],
        0
    );
    let idle = stdout_of(vramctl_on("h200-idle.toml").args([
        "ps",
        "--user",
        "3999999",
        "--cpu-interval",
        "0",
    ]));
    assert_eq!(
        idle,
        "no process of uid 3999999 holds GPU memory (nor does any other)\n"
    );
}

/// A system user made for one test and removed when dropped.
struct TestUser(String);

impl TestUser {
    /// `None` (and a loud line) when this cannot make users (not root, no `useradd`).
    fn create(name: &str) -> Option<Self> {
        let made = std::process::Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .stderr(std::process::Stdio::null())
            .status();
        if made.is_ok_and(|s| s.success()) {
            Some(Self(name.to_owned()))
        } else {
            eprintln!("SKIPPED: cannot create the user '{name}' (useradd needs root)");
            None
        }
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = std::process::Command::new("userdel").arg(&self.0).status();
    }
}

#[test]
fn user_filter_lists_another_users_processes_and_counts_the_rest() {
    // Issue 29's `ps --user alice` with a real second user (created here, removed after):
    // her process is listed by name and by uid; hidden by a further filter, it is counted.
    use std::os::unix::process::CommandExt;
    let name = format!("vt29ps{}", std::process::id() % 100_000);
    let Some(user) = TestUser::create(&name) else {
        return;
    };
    let uid = vramctl_procs::procinfo::uid_of_user(&user.0).expect("the new user's uid");
    let hers =
        crate::real_processes::spawn(std::process::Command::new("sleep").arg("600").uid(uid));
    let mine = sleeper();
    let scenario = Scenario::new(
        1,
        &[
            Holder::real(0, hers.pid(), "4 GiB"),
            Holder::real(0, mine.pid(), "2 GiB"),
        ],
    );
    let ps = |args: &[&str]| {
        let mut all = vec!["ps", "--json", "--cpu-interval", "0"];
        all.extend_from_slice(args);
        json_of(vramctl(scenario.path()).args(all))
    };
    for who in [user.0.clone(), uid.to_string()] {
        let report = ps(&["--user", &who]);
        assert_eq!(pids(&report), [u64::from(hers.pid())], "--user {who}");
        assert_eq!(report["filtered_out"], 1, "--user {who}");
        assert_eq!(processes(&report)[0]["user"], user.0.as_str());
    }
    let text = stdout_of(vramctl(scenario.path()).args([
        "ps",
        "--cpu-interval",
        "0",
        "--user",
        &user.0,
        "--min-mem",
        "5GiB",
    ]));
    assert_eq!(
        text,
        format!(
            "no process of user {} holding at least 5.0 GiB holds GPU memory (2 others do)\n",
            user.0
        )
    );
}

#[test]
fn a_zombie_is_flagged() {
    let mut zombie = std::process::Command::new("true").spawn().expect("true");
    assert!(crate::real_processes::ends(zombie.id()));
    // Not `real`: the fake lists it whatever its state, as a driver that still lists it.
    let scenario = Scenario::new(1, &[Holder::fictional(0, zombie.id(), "2 GiB")]);
    let report = json_of(vramctl(scenario.path()).args(["ps", "--json", "--cpu-interval", "0"]));
    let p = &processes(&report)[0];
    assert_eq!(p["zombie"], true);
    assert_eq!(p["state"], "Z");
    let out = stdout_of(vramctl(scenario.path()).args(["ps", "--cpu-interval", "0"]));
    assert!(
        out.contains(&format!(
            "PID {} is a zombie: it has exited; its parent (PID {}) must reap it",
            zombie.id(),
            std::process::id()
        )),
        "{out}"
    );
    zombie.wait().expect("reap");
}

#[test]
fn ps_does_not_wait_for_a_cpu_window_by_default() {
    // Issue 30: a 200 ms CPU window by default made `ps` 8× slower than `status` whenever a
    // GPU process was visible. By default CPU % is the lifetime average, as ps(1)'s %CPU,
    // and the report says so (`cpu_interval_s: null`) rather than claiming a window.
    let s = sleeper();
    let scenario = Scenario::new(1, &[Holder::real(0, s.pid(), "1 GiB")]);
    let report = json_of(vramctl(scenario.path()).args(["ps", "--json"]));
    assert_eq!(report["cpu_interval_s"], Value::Null, "{report}");
    let p = &processes(&report)[0];
    assert_eq!(p["visible"], true, "{report}");
    // A sleeping process has used (next to) no CPU in its life.
    let Some(cpu) = p["cpu_percent"].as_f64() else {
        panic!("no lifetime CPU %: {report}");
    };
    assert!((0.0..5.0).contains(&cpu), "{report}");
}

#[test]
fn cpu_is_measured_over_an_interval_when_asked() {
    let s = sleeper();
    let scenario = Scenario::new(1, &[Holder::real(0, s.pid(), "1 GiB")]);
    let report = json_of(vramctl(scenario.path()).args(["ps", "--json", "--cpu-interval", "0.05"]));
    assert_eq!(report["cpu_interval_s"], 0.05);
    // A sleeping process uses no CPU.
    assert_eq!(processes(&report)[0]["cpu_percent"], 0.0);
}

#[test]
fn an_idle_gpu_has_no_rows() {
    let out = stdout_of(vramctl_on("h200-idle.toml").args(["ps", "--cpu-interval", "0"]));
    assert_eq!(out, "no process holds GPU memory\n");
}

#[test]
fn an_unknown_user_is_an_error_naming_it_not_an_empty_list() {
    let output = vramctl_on("h200-training.toml")
        .args(["ps", "--user", "nosuchuser", "--cpu-interval", "0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("'nosuchuser'") && err.contains("not a user"),
        "{err}"
    );
    // A known user with nothing on the GPUs is an empty answer, not an error; so is a uid.
    for user in ["root", "4242"] {
        let output = vramctl_on("h200-idle.toml")
            .args(["ps", "--user", user, "--cpu-interval", "0"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{user}");
    }
}

#[test]
fn a_gpu_that_could_not_be_opened_is_said_as_status_says_it() {
    // GPU 1 is lost before the first sample: the driver counts it, NVML cannot open it.
    let run = |cmd: &str| {
        let mut c = vramctl_on("fault-gpu-lost.toml");
        c.env("FAKE_NVML_TIME", "20").arg(cmd);
        if cmd == "ps" {
            c.args(["--cpu-interval", "0"]);
        }
        stdout_of(&mut c)
    };
    let line = "could not be opened: GPU lost";
    assert!(run("status").contains(&format!("GPU 1  {line}")));
    assert!(
        run("ps").contains(&format!("GPU 1 {line}")),
        "{}",
        run("ps")
    );
    let report = json_of(
        vramctl_on("fault-gpu-lost.toml")
            .env("FAKE_NVML_TIME", "20")
            .args(["ps", "--json", "--cpu-interval", "0"]),
    );
    assert_eq!(
        report["unopened"],
        serde_json::json!([{ "index": 1, "reason": "GPU lost" }])
    );
}

#[test]
fn an_unknown_user_is_shown_as_status_shows_it() {
    // The scenario's PIDs are free here: /proc cannot say who runs them.
    let pids = unused_pids(1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ghost.toml");
    std::fs::write(
        &path,
        format!(
            "[[gpu]]\nuuid = \"GPU-ghost\"\nmemory_total = \"80 GiB\"\n\
             [[gpu.process]]\npid = {}\nname = \"python serve.py\"\nmemory = \"1 GiB\"\n",
            pids[0]
        ),
    )
    .unwrap();
    let row = |out: String| {
        out.lines()
            .find(|l| l.contains(&pids[0].to_string()))
            .map(str::to_owned)
            .expect("the process's row")
    };
    let ps = row(stdout_of(vramctl(&path).args([
        "ps",
        "--cpu-interval",
        "0",
    ])));
    let status = row(stdout_of(vramctl(&path).arg("status")));
    for line in [&ps, &status] {
        let user = line.split_whitespace().nth(1);
        assert_eq!(user, Some("-"), "{line}");
    }
    let report = json_of(vramctl(&path).args(["ps", "--json", "--cpu-interval", "0"]));
    assert_eq!(report["processes"][0]["user"], Value::Null);
}

#[test]
fn bad_flags_are_one_line_errors() {
    for args in [
        &["ps", "--match", "("][..],
        &["ps", "--min-mem", "lots"],
        &["ps", "--cpu-interval", "-1"],
        &["ps", "--gpu", "7"],
        &["ps", "--sort", "size"],
    ] {
        let output = vramctl_on("h200-idle.toml").args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn our_own_cgroup_is_in_ps_and_status_json() {
    // The test process itself holds memory: its cgroup is the one /proc/self/cgroup names.
    let me = std::process::id();
    let scenario = Scenario::new(1, &[Holder::real(0, me, "1 GiB")]);
    let text = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
    let expected = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|path| Value::String(path.to_owned()));
    let report = json_of(vramctl(scenario.path()).args(["ps", "--json", "--cpu-interval", "0"]));
    let mine = processes(&report)
        .iter()
        .find(|p| p["pid"] == me)
        .expect("our process is listed");
    assert_eq!(mine.get("cgroup").cloned(), expected, "{mine}");
    let status = json_of(vramctl(scenario.path()).args(["status", "--json"]));
    let row = status["devices"][0]["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == me)
        .cloned()
        .expect("our process in status");
    assert_eq!(row.get("cgroup").cloned(), expected, "{row}");
}

/// The backticked names in the first column of the tables under `heading` in docs/json.md,
/// up to the next `## ` heading.
pub fn documented_keys(heading: &str) -> Vec<String> {
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/json.md"),
    )
    .expect("docs/json.md");
    let section = docs
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("no section {heading:?} in docs/json.md"));
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .flat_map(|l| {
            let cell = l.split(" |").next().unwrap_or_default();
            cell.split(", ")
                .map(|k| k.trim_matches('`').to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn json_keys_are_the_documented_ones() {
    let t = tree();
    let scenario = Scenario::new(1, &[Holder::real(0, t.root.pid(), "1 GiB")]);
    let report =
        json_of(vramctl(scenario.path()).args(["ps", "--json", "--tree", "--cpu-interval", "0"]));
    let documented = documented_keys("`vramctl ps --json`");
    let mut keys: Vec<&String> = report.as_object().unwrap().keys().collect();
    keys.extend(processes(&report)[0].as_object().unwrap().keys());
    for key in keys {
        assert!(documented.contains(key), "'{key}' is not in docs/json.md");
    }
    for key in [
        "schema",
        "processes",
        "pid",
        "gpus",
        "tree_parent",
        "container_id",
    ] {
        assert!(documented.iter().any(|d| d == key), "{key}");
    }
}

/// The tables name each process's Slurm job as Slurm writes a step (`4242.0`) in a JOB
/// column that appears only when some listed process is in a job, so outputs without jobs
/// are byte for byte as before (the other tests' snapshots).
#[test]
fn ps_and_status_tables_name_the_job_of_a_process() {
    use crate::real_processes::{Holder, Scenario, sleeper, spawn};
    let mut command = std::process::Command::new("sleep");
    command
        .arg("600")
        .env("SLURM_JOB_ID", "4242")
        .env("SLURM_STEP_ID", "0");
    let in_job = spawn(&mut command);
    let plain = sleeper();
    let scenario = Scenario::new(
        1,
        &[
            Holder::real(0, in_job.pid(), "2 GiB"),
            Holder::real(0, plain.pid(), "1 GiB"),
        ],
    );
    let text = |args: &[&str]| {
        crate::harness::stdout_of(
            crate::harness::vramctl(&scenario.path)
                .env("COLUMNS", "200")
                .args(args),
        )
    };
    for args in [["ps", "--no-daemon"], ["status", "--no-daemon"]] {
        let out = text(&args);
        let header = out
            .lines()
            .find(|l| l.trim_start().starts_with("PID "))
            .unwrap_or_else(|| panic!("{args:?}: no header:\n{out}"));
        assert!(header.contains(" JOB "), "{args:?}:\n{out}");
        let cells = |pid: u32| -> Vec<String> {
            out.lines()
                .find(|l| l.split_whitespace().next() == Some(pid.to_string().as_str()))
                .unwrap_or_else(|| panic!("{args:?}: no row for {pid}:\n{out}"))
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        assert!(cells(in_job.pid()).contains(&"4242.0".to_owned()), "{out}");
        assert!(cells(plain.pid()).contains(&"-".to_owned()), "{out}");
    }
    // Only the process of no job: no JOB column.
    drop(in_job);
    let alone = Scenario::new(1, &[Holder::real(0, plain.pid(), "1 GiB")]);
    let out =
        crate::harness::stdout_of(crate::harness::vramctl(&alone.path).args(["ps", "--no-daemon"]));
    assert!(!out.contains(" JOB "), "{out}");
}
