//! `vramctl kill` against real processes listed in fake-NVML scenarios: they end, the fake
//! frees their memory, vramctl says so; and everything it must refuse, it refuses.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use vramctl_procs::audit_record::AuditOutcome;

use crate::harness::{Portable, redactions, vramctl_std};
use crate::real_processes::{
    Holder, Scenario, audit_rows, ends, is_root, shell, sleeper, term_ignorer, tree,
};

const GIB: u64 = 1 << 30;

/// `vramctl kill ARGS` on `scenario`, stdin closed, history database (the audit log) in the
/// scenario's directory.
fn kill(scenario: &Scenario, args: &[&str]) -> Command {
    let mut cmd = vramctl_std(scenario.path());
    cmd.env("VRAMCTL_DB", scenario.db())
        .stdin(Stdio::null())
        .arg("kill")
        .args(args);
    cmd
}

fn output(cmd: &mut Command) -> Output {
    cmd.output().expect("run vramctl")
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {} stderr {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn text(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("utf-8")
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).expect("utf-8")
}

#[test]
fn kill_ends_the_process_and_the_memory_is_released() {
    let mut target = sleeper();
    let pid = target.pid();
    let scenario = Scenario::new(1, &[Holder::real(0, pid, "5 GiB")]);
    let pid_text = pid.to_string();
    let out = output(&mut kill(&scenario, &["--yes", "--json", &pid_text]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["schema"], 1);
    assert_eq!(report["ok"], true);
    let t = &report["targets"][0];
    assert_eq!(t["pid"], pid);
    assert_eq!(t["outcome"], "exited");
    assert_eq!(t["signals"], serde_json::json!(["SIGTERM"]));
    assert_eq!(t["escalated"], false);
    assert_eq!(t["pinned"], true);
    assert_eq!(t["used_bytes"], 5 * GIB);
    let d = &report["devices"][0];
    assert_eq!(d["released"], true);
    assert_eq!(d["held_bytes"], 5 * GIB);
    assert_eq!(d["freed_bytes"], 5 * GIB);
    assert_eq!(d["used_before_bytes"], 6 * GIB, "5 GiB + 1 GiB unaccounted");
    assert_eq!(d["used_after_bytes"], GIB);
    assert!(d["released_after_s"].as_f64().unwrap() >= 0.0);
    assert_eq!(target.killed_by(), Some(15));

    // One row, written before the signal; its outcome ends as exited with the bytes freed.
    assert_eq!(report["audit_log"], scenario.db().display().to_string());
    let rows = audit_rows(&scenario.db());
    assert_eq!(rows.len(), 1, "{rows:?}");
    let record = &rows[0].record;
    assert_eq!(record.target.pid, pid);
    assert_eq!(
        record.target.start_time_ticks,
        t["start_time_ticks"].as_u64().unwrap()
    );
    assert_eq!(record.signal, "SIGTERM+SIGCONT");
    assert_eq!(record.action, "kill");
    assert!(record.reason.contains("kill --yes"), "{}", record.reason);
    assert_eq!(
        record.outcome,
        AuditOutcome::Exited {
            freed_bytes: 5 * GIB,
            after_ms: record_after_ms(&record.outcome),
        }
    );
    assert!(rows[0].updated_ms.is_some());
}

#[test]
fn the_audit_log_also_goes_to_a_json_lines_copy_when_asked() {
    let mut target = sleeper();
    let pid = target.pid();
    let scenario = Scenario::new(1, &[Holder::real(0, pid, "2 GiB")]);
    let copy = scenario.dir.path().join("logs/audit.jsonl");
    let out = output(kill(&scenario, &["--yes", &pid.to_string()]).env("VRAMCTL_AUDIT_LOG", &copy));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(target.killed_by(), Some(15));
    let rows = audit_rows(&scenario.db());
    assert_eq!(rows.len(), 1);
    // Written before the signal, then its outcome: sent, then exited with the bytes freed;
    // every line names the store's row.
    let lines: Vec<Value> = std::fs::read_to_string(&copy)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines.iter().all(|l| l["id"] == rows[0].id));
    assert_eq!(lines[0]["record"]["outcome"]["outcome"], "pending");
    assert_eq!(lines[1]["outcome"]["outcome"], "sent");
    assert_eq!(lines[2]["outcome"]["outcome"], "exited");
    assert_eq!(lines[2]["outcome"]["detail"]["freed_bytes"], 2 * GIB);
}

/// The time an `exited` outcome says the release took (not predictable; checked to exist).
fn record_after_ms(outcome: &AuditOutcome) -> u64 {
    match outcome {
        AuditOutcome::Exited { after_ms, .. } => *after_ms,
        other => panic!("not exited: {other:?}"),
    }
}

#[test]
fn kill_text_output() {
    let target = sleeper();
    let pid = target.pid();
    let scenario = Scenario::new(1, &[Holder::real(0, pid, "5 GiB")]);
    let out = output(&mut kill(&scenario, &["--yes", &pid.to_string()]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut settings = redactions();
    settings.add_filter(&format!(r"\b{pid}\b"), "[PID]");
    settings.add_filter(
        &format!(r"\b{}\b", regex::escape(&crate::real_processes::my_user())),
        "[USER]",
    );
    settings.add_filter(r"\d+\.\d\d s\b", "[SECS]");
    settings.add_filter(r"audit log: .*", "audit log: [PATH]");
    settings.add_filter(r" +", " ");
    // The PID column is as wide as the PID: a short one indents the right-aligned header.
    settings.add_filter(r"(?m)^ ", "");
    settings.bind(|| insta::assert_snapshot!("kill_one", text(&out)));
}

#[test]
fn a_process_ignoring_term_is_escalated_after_the_grace_period() {
    let mut target = term_ignorer();
    let pid = target.pid();
    let scenario = Scenario::new(1, &[Holder::real(0, pid, "3 GiB")]);
    let out = output(&mut kill(
        &scenario,
        &["--yes", "--json", "--grace", "0.2", &pid.to_string()],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = json(&out);
    let t = &report["targets"][0];
    assert_eq!(t["outcome"], "exited");
    assert_eq!(t["escalated"], true);
    assert_eq!(t["signals"], serde_json::json!(["SIGTERM", "SIGKILL"]));
    assert!(t["exited_after_s"].as_f64().unwrap() >= 0.2);
    assert_eq!(report["devices"][0]["released"], true);
    assert_eq!(target.killed_by(), Some(9));
    let signals: Vec<String> = audit_rows(&scenario.db())
        .into_iter()
        .map(|r| r.record.signal)
        .collect();
    assert_eq!(signals, ["SIGTERM+SIGCONT", "SIGKILL"]);
}

#[test]
fn without_escalation_a_survivor_is_reported_and_exit_1() {
    let target = term_ignorer();
    let pid = target.pid();
    let scenario = Scenario::new(1, &[Holder::real(0, pid, "3 GiB")]);
    let out = output(&mut kill(
        &scenario,
        &["--yes", "--grace", "0.1", "--no-escalate", &pid.to_string()],
    ));
    assert_eq!(out.status.code(), Some(1));
    let out = text(&out);
    assert!(
        out.contains(&format!(
            "PID {pid}: still running: still running after the grace period (state S)"
        )),
        "{out}"
    );
    assert!(target.alive());
}

#[test]
fn tree_reaches_grandchildren() {
    let t = tree();
    let scenario = Scenario::new(
        2,
        &[
            Holder::real(0, t.root.pid(), "4 GiB"),
            Holder::real(1, t.grandchild, "2 GiB"),
        ],
    );
    let out = output(&mut kill(
        &scenario,
        &["--yes", "--json", "--tree", &t.root.pid().to_string()],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = json(&out);
    let pids: Vec<u64> = report["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(
        pids,
        [
            u64::from(t.root.pid()),
            u64::from(t.middle),
            u64::from(t.grandchild)
        ],
        "parents before children"
    );
    assert_eq!(report["targets"][1]["tree_parent"], t.root.pid());
    assert_eq!(report["targets"][2]["tree_parent"], t.middle);
    assert!(
        report["targets"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["outcome"] == "exited")
    );
    assert!(ends(t.grandchild) && ends(t.middle));
    let devices = report["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert!(devices.iter().all(|d| d["released"] == true));
    assert_eq!(devices[1]["freed_bytes"], 2 * GIB);
}

#[test]
fn without_tree_the_children_are_left_alone() {
    let t = tree();
    let scenario = Scenario::new(1, &[Holder::real(0, t.root.pid(), "4 GiB")]);
    let out = output(&mut kill(&scenario, &["--yes", &t.root.pid().to_string()]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(vramctl_procs::signal::PidHandle::pin(t.grandchild).is_ok_and(|h| !h.has_exited()));
    // Tidy: the orphans are not our children.
    let _ = Command::new("kill")
        .args([t.middle.to_string(), t.grandchild.to_string()])
        .status();
}

#[test]
fn refusals_come_first_and_each_has_a_reason() {
    // vramctl's parent is this test process. PID 2 is named only where it is a kernel
    // thread (kthreadd): elsewhere (a container) it may be a process that --yes would end.
    let parent = std::process::id().to_string();
    let kthreadd = vramctl_procs::procinfo::read_stat(2).is_ok_and(|s| s.is_kernel_thread());
    let mut args = vec!["--yes", "0", "1", "4294967295", &parent, "4194304"];
    if kthreadd {
        args.push("2");
    } else {
        eprintln!("PID 2 is not a kernel thread here; its case is left out");
    }
    let scenario = Scenario::new(1, &[]);
    let out = output(&mut kill(&scenario, &args));
    assert_eq!(out.status.code(), Some(1));
    let lines: Vec<String> = text(&out).lines().map(str::to_owned).collect();
    let mut expect = vec![
        "refused: PID 0 is not a process: kill(2) would signal our own process group".to_owned(),
        "refused: PID 1 is the init process of this PID namespace".to_owned(),
        "refused: PID 4294967295 is not a PID".to_owned(),
        format!("refused: PID {parent} is the parent of this vramctl"),
        "refused: PID 4194304 is not a PID".to_owned(),
    ];
    if kthreadd {
        expect.push("refused: PID 2 (kthreadd) is a kernel thread".to_owned());
    }
    assert_eq!(lines.len(), expect.len(), "{lines:?}");
    for (line, want) in lines.iter().zip(&expect) {
        assert!(
            line.starts_with(want.as_str()),
            "{line:?} should start with {want:?}"
        );
    }
    assert!(lines[2].contains("it is -1"), "{}", lines[2]);
    assert!(!scenario.db().exists(), "nothing sent, nothing written");
}

#[test]
fn vramctl_refuses_itself() {
    // `exec` keeps the shell's PID, so `$$` is vramctl's own PID.
    let scenario = Scenario::new(1, &[]);
    let mut cmd = vramctl_std(scenario.path());
    let program = cmd.get_program().to_owned();
    cmd.env("VRAMCTL_DB", scenario.db());
    let out = Command::new("sh")
        .args(["-c", "exec \"$0\" kill --yes $$"])
        .arg(program)
        .env_clear()
        .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(Stdio::null())
        .output()
        .expect("sh");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("is this vramctl process"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_reused_pid_is_refused() {
    let target = sleeper();
    let pid = target.pid();
    let start = vramctl_procs::procinfo::read_stat(pid)
        .unwrap()
        .start_time_ticks;
    let scenario = Scenario::new(1, &[Holder::real(0, pid, "1 GiB")]);
    // Right PID, wrong start time: what a PID handed to another process looks like.
    let stale = format!("{pid}@{}", start - 1);
    let out = output(&mut kill(&scenario, &["--yes", &stale]));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains(&format!("refused: PID {pid} now names another process")),
        "{}",
        text(&out)
    );
    assert!(target.alive());
    // The right start time is accepted.
    let exact = format!("{pid}@{start}");
    let out = output(&mut kill(&scenario, &["--yes", "--json", &exact]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ends(pid));
}

#[test]
fn a_zombie_is_reported_as_such() {
    // A child that exited and that this test does not reap yet.
    let mut zombie = Command::new("true").spawn().expect("true");
    assert!(ends(zombie.id()));
    let pid = zombie.id();
    let scenario = Scenario::new(1, &[]);
    let out = output(&mut kill(&scenario, &["--yes", &pid.to_string()]));
    assert_eq!(out.status.code(), Some(1));
    let want = format!(
        "refused: PID {pid} is a zombie: it has exited and holds nothing but its PID; its parent \
         (PID {}) must reap it",
        std::process::id()
    );
    assert!(text(&out).contains(&want), "{}", text(&out));
    zombie.wait().expect("reap");
}

#[test]
fn another_users_process_is_refused_unless_root() {
    if !is_root() {
        eprintln!("skipped: creating another user's process needs root (id -u is not 0)");
        return;
    }
    let mut command = Command::new("sleep");
    command.arg("600").uid(65534).gid(65534);
    let target = crate::real_processes::spawn(&mut command);
    let pid = target.pid().to_string();
    let scenario = Scenario::new(1, &[Holder::real(0, target.pid(), "1 GiB")]);
    // vramctl as uid 65533: neither root nor the owner. It runs from a copy another uid may
    // execute wherever the checkout is (a 0700 home directory gave EACCES), and keeps its
    // audit log in the copy's directory, which that uid may write.
    let portable = Portable::new(scenario.path());
    let audit_dir = portable.dir.path().join("state");
    std::fs::create_dir(&audit_dir).expect("mkdir");
    std::fs::set_permissions(&audit_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let out = output(
        portable
            .command()
            .env("VRAMCTL_DB", audit_dir.join("history.db"))
            .stdin(Stdio::null())
            .args(["kill", "--yes", &pid])
            .uid(65533)
            .gid(65533),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        text(&out).contains(&format!(
            "refused: PID {pid} belongs to uid 65534, not to you (uid 65533)"
        )),
        "{}",
        text(&out)
    );
    assert!(target.alive());
    // Root may.
    let out = output(&mut kill(&scenario, &["--dry-run", &pid]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn without_a_terminal_and_without_yes_nothing_is_sent() {
    let target = sleeper();
    let scenario = Scenario::new(1, &[Holder::real(0, target.pid(), "1 GiB")]);
    let out = output(&mut kill(&scenario, &[&target.pid().to_string()]));
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out).trim(),
        "vramctl: error: refusing to signal without confirmation: stdin is not a terminal; pass \
         --yes to confirm (or --dry-run to look first)"
    );
    assert!(target.alive());
    assert!(!scenario.db().exists());
}

#[test]
fn dry_run_changes_nothing() {
    let target = sleeper();
    let scenario = Scenario::new(1, &[Holder::real(0, target.pid(), "1 GiB")]);
    let out = output(&mut kill(
        &scenario,
        &["--dry-run", "--json", &target.pid().to_string()],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["dry_run"], true);
    assert_eq!(report["targets"][0]["outcome"], "would_signal");
    assert!(target.alive());
    assert!(!scenario.db().exists());
}

#[test]
fn no_signal_without_its_audit_record() {
    let target = sleeper();
    let scenario = Scenario::new(1, &[Holder::real(0, target.pid(), "1 GiB")]);
    // A regular file where the database's directory should be.
    let blocker = scenario.dir.path().join("not-a-dir");
    std::fs::write(&blocker, "").unwrap();
    let out = output(
        kill(&scenario, &["--yes", &target.pid().to_string()])
            .env("VRAMCTL_DB", blocker.join("history.db")),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.starts_with(
            "vramctl: error: cannot open the audit log (nothing is signalled without it): \
             cannot create the directory"
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(target.alive());

    // A file that is not a vramctl history: refused, untouched, nothing sent.
    let other = scenario.dir.path().join("notes.db");
    std::fs::write(&other, "some notes").unwrap();
    let out =
        output(kill(&scenario, &["--yes", &target.pid().to_string()]).env("VRAMCTL_DB", &other));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is not a vramctl history database"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "some notes");
    assert!(target.alive());

    // A copy that cannot be written: also nothing sent.
    let out = output(
        kill(&scenario, &["--yes", &target.pid().to_string()])
            .env("VRAMCTL_AUDIT_LOG", blocker.join("audit.jsonl")),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("cannot create the directory of the audit log copy"),
        "{}",
        stderr(&out)
    );
    assert!(target.alive());
}

#[test]
fn memory_kept_by_a_surviving_child_says_who_holds_it() {
    // A parent whose forked child inherited its GPU descriptors: the parent ends, the child
    // keeps the memory (used, no longer listed).
    let mut parent = shell("sleep 600 & echo $!; wait");
    let child: u32 = parent.line().parse().expect("pid");
    let scenario = Scenario::new(
        1,
        &[Holder {
            held_open_by: vec![child],
            ..Holder::real(0, parent.pid(), "8 GiB")
        }],
    );
    let out = output(&mut kill(
        &scenario,
        &[
            "--yes",
            "--json",
            "--timeout",
            "0.3",
            &parent.pid().to_string(),
        ],
    ));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["targets"][0]["outcome"], "exited");
    let d = &report["devices"][0];
    assert_eq!(d["released"], false);
    let held = &report["still_held"][0];
    assert_eq!(held["unlisted_bytes"], 8 * GIB);
    assert_eq!(held["holders"][0]["pid"], child);
    assert_eq!(
        held["holders"][0]["why"],
        format!(
            "a descendant of PID {}, still running with no /dev/nvidia* open",
            parent.pid()
        )
    );
    assert_eq!(parent.killed_by(), Some(15));
    let _ = Command::new("kill").arg(child.to_string()).status();
}

#[test]
fn bad_targets_and_flags_are_usage_errors() {
    let scenario = Scenario::new(1, &[]);
    for args in [
        &["abc"][..],
        &["12@x"],
        &["--grace", "-1", "5"],
        &["--signal", "STOP", "5"],
        &["--timeout", "nan", "5"],
    ] {
        let out = output(&mut kill(&scenario, args));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("vramctl: error: "), "{err}");
    }
}

#[test]
fn kill_and_its_exit_codes_are_in_help() {
    let scenario = Scenario::new(1, &[]);
    let out = output(vramctl_std(scenario.path()).args(["kill", "--help"]));
    let help = text(&out);
    assert!(help.contains("1  a target was refused"), "{help}");
    assert!(help.contains("PID@START"), "{help}");
}

#[test]
fn json_keys_are_the_documented_ones() {
    let target = sleeper();
    let scenario = Scenario::new(1, &[Holder::real(0, target.pid(), "1 GiB")]);
    let out = output(&mut kill(
        &scenario,
        &["--yes", "--json", &target.pid().to_string()],
    ));
    let report = json(&out);
    let documented = crate::ps::documented_keys("`vramctl kill --json`");
    let mut keys: Vec<&String> = report.as_object().unwrap().keys().collect();
    keys.extend(report["targets"][0].as_object().unwrap().keys());
    keys.extend(report["devices"][0].as_object().unwrap().keys());
    for key in keys {
        assert!(documented.contains(key), "'{key}' is not in docs/json.md");
    }
}

#[test]
fn kill_refuses_a_pid_that_holds_no_gpu_memory() {
    // What a PID typed from an old listing looks like once its GPU user has exited and the
    // number went to another process: NVML lists nothing for it.
    let mut target = sleeper();
    let pid = target.pid().to_string();
    let scenario = Scenario::new(1, &[]);
    let out = output(&mut kill(&scenario, &["--yes", &pid]));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let lines: Vec<String> = text(&out).lines().map(str::to_owned).collect();
    assert_eq!(
        lines,
        [format!(
            "refused: PID {pid} holds no GPU memory now (NVML lists it on no GPU): if it held \
             some, it has exited and the PID may name another process; --force signals it anyway"
        )]
    );
    assert!(target.alive());
    assert!(!scenario.db().exists(), "nothing sent, nothing written");

    // With --tree, a launcher whose descendant holds the memory is not refused.
    let t = tree();
    let held = Scenario::new(1, &[Holder::real(0, t.grandchild, "2 GiB")]);
    let out = output(&mut kill(
        &held,
        &["--dry-run", "--json", "--tree", &t.root.pid().to_string()],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = json(&out);
    assert!(
        report["targets"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["outcome"] == "would_signal"),
        "{report}"
    );

    // --force signals it anyway.
    let out = output(&mut kill(&scenario, &["--yes", "--force", &pid]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(target.killed_by(), Some(15));
}

/// `sleep 600` under PID `pid`: `ns_last_pid` set to `pid - 1` just before the fork (root
/// only; another fork on the machine may take the number first, so up to 500 tries).
fn sleeper_with_pid(pid: u32) -> Option<crate::real_processes::Spawned> {
    for _ in 0..500 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
        let s = sleeper();
        if s.pid() == pid {
            return Some(s);
        }
    }
    None
}

#[test]
fn kill_never_signals_a_reused_pid() {
    if !is_root() {
        eprintln!("skipped: handing a PID to a new process (ns_last_pid) needs root");
        return;
    }
    // The GPU user, as `ps --json` showed it: PID, start time and pidfd id; it exits, is
    // reaped, and a bystander gets its PID. Tried until the bystander starts within the
    // same 10 ms clock tick, where only the pidfd id tells the two apart (or 50 times).
    let mut case = None;
    for _ in 0..50 {
        let mut first = sleeper();
        let pid = first.pid();
        let start = vramctl_procs::procinfo::read_stat(pid)
            .unwrap()
            .start_time_ticks;
        let id = vramctl_procs::signal::PidHandle::pin(pid)
            .ok()
            .and_then(|h| h.pidfd_id());
        first.child.kill().expect("kill");
        first.child.wait().expect("reap");
        // Its drop would signal its process group, whose id the bystander may have now.
        std::mem::forget(first);
        if id.is_none() {
            // Without pidfs only the start time tells processes apart, and a bystander of
            // the same tick would pass for the first: not a case this kernel can refuse.
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
        let Some(bystander) = sleeper_with_pid(pid) else {
            continue;
        };
        let same_tick =
            vramctl_procs::procinfo::read_stat(pid).is_ok_and(|s| s.start_time_ticks == start);
        let done = same_tick || id.is_none();
        case = Some((pid, start, id, bystander, same_tick));
        if done {
            break;
        }
    }
    let Some((pid, start, id, bystander, same_tick)) = case else {
        eprintln!("skipped: no PID could be handed to a new process (ns_last_pid)");
        return;
    };
    if id.is_none() {
        eprintln!("this kernel has no pidfd ids (before 6.9): the start time alone is checked");
    }
    eprintln!("the bystander started in the same clock tick: {same_tick}");
    let identity = match id {
        Some(id) => format!("{pid}@{start}:{id}"),
        None => format!("{pid}@{start}"),
    };

    // The old identity, with a listing that still names the PID: refused.
    let listed = Scenario::new(1, &[Holder::real(0, pid, "1 GiB")]);
    let out = output(&mut kill(&listed, &["--yes", &identity]));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        text(&out).starts_with(&format!("refused: PID {pid} now names another process")),
        "{}",
        text(&out)
    );
    assert!(bystander.alive(), "the bystander was signalled");

    // The bare PID, where the driver lists nothing for it now: refused.
    let unlisted = Scenario::new(1, &[]);
    let out = output(&mut kill(&unlisted, &["--yes", &pid.to_string()]));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        text(&out).contains("holds no GPU memory now"),
        "{}",
        text(&out)
    );
    assert!(bystander.alive(), "the bystander was signalled");
    assert!(!listed.db().exists() && !unlisted.db().exists());
}

/// A `sleep` whose environment says it runs in Slurm job `job` (as slurmstepd sets it; the
/// cgroup path is tested on a real Slurm in `slurm::`).
fn job_sleeper(job: u32) -> crate::real_processes::Spawned {
    let mut command = Command::new("sleep");
    command
        .arg("600")
        .env("SLURM_JOB_ID", job.to_string())
        .env("SLURM_JOB_USER", "alice");
    crate::real_processes::spawn(&mut command)
}

/// `kill --job`: the job's GPU processes, each through the same plan and safe path as a
/// PID typed by hand (`--dry-run` lists them and sends nothing); another job's process and
/// a process of no job are left alone; a job with no GPU process says so and exits 1.
#[test]
fn kill_by_job_ends_that_jobs_gpu_processes_only() {
    let mut a = job_sleeper(4242);
    let mut b = job_sleeper(4242);
    let other = job_sleeper(4343);
    let plain = sleeper();
    let scenario = Scenario::new(
        2,
        &[
            Holder::real(0, a.pid(), "4 GiB"),
            Holder::real(1, b.pid(), "2 GiB"),
            Holder::real(0, other.pid(), "1 GiB"),
            Holder::real(1, plain.pid(), "1 GiB"),
        ],
    );
    let dry = output(&mut kill(
        &scenario,
        &["--job", "4242", "--dry-run", "--json"],
    ));
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    let report = json(&dry);
    let mut pids: Vec<u64> = report["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .map(|t| {
            assert_eq!(t["outcome"], "would_signal", "{t}");
            t["pid"].as_u64().expect("pid")
        })
        .collect();
    pids.sort_unstable();
    let mut want = vec![u64::from(a.pid()), u64::from(b.pid())];
    want.sort_unstable();
    assert_eq!(pids, want);
    assert!(a.alive() && b.alive(), "a dry run sends nothing");

    let out = output(&mut kill(&scenario, &["--job", "4242", "--yes", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json(&out)["ok"], true);
    assert_eq!(a.killed_by(), Some(15));
    assert_eq!(b.killed_by(), Some(15));
    assert!(other.alive() && plain.alive(), "only job 4242's processes");

    let none = output(&mut kill(&scenario, &["--job", "999", "--yes"]));
    assert_eq!(none.status.code(), Some(1), "{}", stderr(&none));
    assert!(
        stderr(&none).contains("no GPU process visible here is selected by --job 999"),
        "{}",
        stderr(&none)
    );
    // Bad selectors are usage errors.
    for bad in [["--job", "12x"], ["--pod", "no-slash"]] {
        let out = output(&mut kill(&scenario, &bad));
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
    }
}

/// `--job` and PIDs add up; neither a PID nor a selector is a usage error.
#[test]
fn kill_by_job_combines_with_pids_and_needs_some_target() {
    let a = job_sleeper(5151);
    let plain = sleeper();
    let scenario = Scenario::new(
        1,
        &[
            Holder::real(0, a.pid(), "4 GiB"),
            Holder::real(0, plain.pid(), "1 GiB"),
        ],
    );
    let plain_pid = plain.pid().to_string();
    let out = output(&mut kill(
        &scenario,
        &["--job", "5151", &plain_pid, "--dry-run", "--json"],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json(&out)["targets"].as_array().map(Vec::len), Some(2));
    let out = output(&mut kill(&scenario, &["--yes"]));
    assert_eq!(
        out.status.code(),
        Some(2),
        "no PID and no selector: {}",
        stderr(&out)
    );
}
