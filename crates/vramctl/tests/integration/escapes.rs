//! Text other users control reaches root's terminal escaped (issue 29 item 6): a real
//! process whose command line holds a terminal escape that erases the line and forges a
//! `[y/N]` prompt, a bidi override, a C1 CSI and bytes that are not UTF-8, shown by every
//! command that prints command lines; names from model files in `estimate`'s errors.
//! (`top` is checked in a real terminal in `top.rs`; import errors in `import.rs`.)

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use vramctl_core::untrusted::needs_escape;

use crate::harness::vramctl_std;
use crate::real_processes::{Holder, Scenario, Spawned, spawn};

/// The forged argv[0]: erase the line, return to its start, print a prompt that is not
/// vramctl's, start a new line, reverse what follows, and an 8-bit CSI with BEL.
pub const FORGED: &str = "\x1b[2K\rKill 0 processes? [y/N]\n\u{202e}gnp.exe\u{9b}31m\x07";
/// The same as every human output shows it.
pub const FORGED_SHOWN: &str = r"\u{1b}[2K\rKill 0 processes? [y/N]\n\u{202e}gnp.exe\u{9b}31m\u{7}";
/// An argument that is not UTF-8 (an 8-bit CSI among others) and how it is shown.
const NOT_UTF8: &[u8] = b"\xff\x9b2J";
const NOT_UTF8_SHOWN: &str = r"\xff\x9b2J";
const SCRIPT: &str = "echo ready; sleep 600; :";

/// A running `sh` whose command line is `FORGED -c SCRIPT NOT_UTF8`; it stays `sh` (the
/// script does not end in the sleep, so the shell does not become it).
pub fn forged_process() -> Spawned {
    let mut command = Command::new("sh");
    command
        .arg0(FORGED)
        .args(["-c", SCRIPT])
        .arg(OsStr::from_bytes(NOT_UTF8));
    let mut s = spawn(&mut command);
    assert_eq!(s.line(), "ready");
    s
}

/// Its command line as every human output shows it.
pub fn forged_shown() -> String {
    format!("{FORGED_SHOWN} -c {SCRIPT} {NOT_UTF8_SHOWN}")
}

/// Asserts that `bytes` (what a command printed for a person) hold no character that acts on
/// a terminal but line ends, and returns them as text.
pub fn assert_printable(what: &str, bytes: &[u8]) -> String {
    let text = String::from_utf8(bytes.to_vec()).unwrap_or_else(|e| {
        panic!(
            "{what}: not UTF-8 ({e}): {:?}",
            String::from_utf8_lossy(bytes)
        )
    });
    let bad: Vec<char> = text
        .chars()
        .filter(|&c| c != '\n' && needs_escape(c))
        .collect();
    assert!(bad.is_empty(), "{what} printed {bad:?} raw:\n{text:?}");
    text
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run vramctl")
}

/// The one line of `text` that holds `needle`, which must be there once.
fn line_with<'t>(text: &'t str, needle: &str) -> &'t str {
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(needle)).collect();
    assert_eq!(lines.len(), 1, "{needle:?} in one line of:\n{text}");
    lines[0]
}

#[test]
fn kill_plan_escapes_a_forged_command_line_before_the_prompt() {
    let target = forged_process();
    let scenario = Scenario::new(1, &[Holder::real(0, target.pid(), "1 GiB")]);
    // Without --yes the plan is printed, then the prompt would be asked (here stdin is not a
    // terminal, so it is refused instead): what the plan shows is what root answers.
    let mut cmd = vramctl_std(scenario.path());
    cmd.env("VRAMCTL_DB", scenario.db())
        .args(["kill", &target.pid().to_string()]);
    let out = run(&mut cmd);
    assert_eq!(out.status.code(), Some(2));
    let plan = assert_printable("kill's plan", &out.stdout);
    assert_printable("kill's error", &out.stderr);
    // The header and one row: the forged line end made no line of its own, the forged
    // prompt sits on the process's row, shown for what it is.
    assert_eq!(plan.lines().count(), 2, "{plan}");
    let row = line_with(&plan, "Kill 0 processes?");
    assert!(row.contains(&target.pid().to_string()), "{row}");
    assert!(row.ends_with(&forged_shown()), "{row}");
    assert!(target.alive());

    // The JSON keeps the command line as it is.
    let mut cmd = vramctl_std(scenario.path());
    cmd.env("VRAMCTL_DB", scenario.db()).args([
        "kill",
        "--dry-run",
        "--json",
        &target.pid().to_string(),
    ]);
    let out = run(&mut cmd);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        json["targets"][0]["command"],
        format!("{FORGED} -c {SCRIPT} {NOT_UTF8_SHOWN}")
    );
}

/// The same in a real terminal (tmux): what root reads just above the real question is the
/// plan, one row for the target, its forged prompt shown escaped on that row.
#[test]
fn kill_plan_escapes_a_forged_command_line_before_the_prompt_in_a_terminal() {
    if crate::top::skip_without_tmux() {
        return;
    }
    let target = forged_process();
    let pid = target.pid();
    let scenario = Scenario::new(1, &[Holder::real(0, pid, "1 GiB")]);
    let dir = tempfile::tempdir().expect("tempdir");
    let script = format!(
        "env -i PATH=\"$PATH\" TERM=\"$TERM\" VRAMCTL_NVML_LIB='{}' FAKE_NVML_SCENARIO='{}' \
         FAKE_NVML_TIME=0 NO_COLOR=1 VRAMCTL_RUNTIME_DIR='{}' VRAMCTL_DRM_ROOT='{}' \
         VRAMCTL_DB='{}' '{}' kill {pid}\n\
         echo \"vramctl exited $?\"\n\
         read _\n",
        crate::harness::fake_library().display(),
        scenario.path().display(),
        crate::harness::private_runtime_dir().display(),
        crate::harness::no_drm_root().display(),
        scenario.db().display(),
        assert_cmd::cargo::cargo_bin("vramctl").display(),
    );
    let script_path = dir.path().join("kill.sh");
    std::fs::write(&script_path, script).expect("write script");
    let tmux = crate::top::Tmux::start(
        dir.path(),
        &format!("sh '{}'", script_path.display()),
        200,
        20,
    );
    // The forged command line holds a fake question of its own: wait for the real one, a
    // whole line of its own.
    let screen = tmux.wait_for("the question", |s| {
        s.lines()
            .any(|l| l.starts_with("send ") && l.trim_end().ends_with("? [y/N]"))
    });
    let lines: Vec<&str> = screen.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        3,
        "the header, the target, the question:\n{screen}"
    );
    assert!(
        lines[0].contains("PID") && lines[0].contains("COMMAND"),
        "{screen}"
    );
    assert!(
        lines[1].trim_start().starts_with(&pid.to_string()),
        "{screen}"
    );
    assert!(lines[1].ends_with(&forged_shown()), "{screen}");
    assert!(
        lines[2].starts_with("send SIGTERM to 1 process, SIGKILL after"),
        "{screen}"
    );
    tmux.keys(&["n", "Enter"]);
    let screen = tmux.wait_for("kill to end", |s| s.contains("vramctl exited"));
    assert!(screen.contains("nothing was signalled"), "{screen}");
    assert!(target.alive());
}

#[test]
fn status_and_ps_escape_a_forged_command_line() {
    let target = forged_process();
    let scenario = Scenario::new(1, &[Holder::real(0, target.pid(), "1 GiB")]);
    for args in [
        &["status"][..],
        &["status", "--compact"],
        &["ps"],
        &["ps", "--tree"],
    ] {
        for columns in [None, Some("100"), Some("200")] {
            let mut cmd = vramctl_std(scenario.path());
            if let Some(c) = columns {
                cmd.env("COLUMNS", c);
            }
            let out = run(cmd.args(args));
            let what = format!("{args:?} COLUMNS={columns:?}");
            assert!(
                out.status.success(),
                "{what}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = assert_printable(&what, &out.stdout);
            // Shortened or whole, the command starts on the process's line.
            let line = line_with(&text, r"\u{1b}");
            assert!(
                args[1..].contains(&"--compact") || line.contains(&target.pid().to_string()),
                "{what}: {line}"
            );
            if columns.is_none() && args == ["ps"] {
                assert!(line.ends_with(&forged_shown()), "{what}: {line}");
            }
        }
    }
    // JSON as it was: the command line raw, in JSON's own escaping.
    let mut cmd = vramctl_std(scenario.path());
    let out = run(cmd.args(["ps", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let listed = serde_json::to_string(&json).expect("JSON");
    assert!(
        listed.contains(r#"\u001b[2K\rKill 0 processes? [y/N]\n"#),
        "{listed}"
    );
}

/// A one-GPU scenario on the fake's step clock holding `pid` idle (SM 0 %), in `dir`.
fn idle_scenario(dir: &Path, pid: u32) -> PathBuf {
    let text = format!(
        "driver_version = \"580.159.04\"\n[clock]\nmode = \"step\"\nstep_s = 1.0\n\n\
         [[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\n\
         memory_total = 150754820096\nmemory_reserved = 644939776\n\n\
         [[gpu.process]]\npid = {pid}\nreal = true\nmemory = \"8 GiB\"\nsm_util = 0\n"
    );
    let path = dir.join("scenario.toml");
    std::fs::write(&path, text).expect("write scenario");
    path
}

/// 2026-11-29T20:31:31Z: the recording starts here.
const T0: i64 = 1_795_984_291_000;
const TICKS: i64 = 150;

#[test]
fn history_leaks_and_reap_escape_a_recorded_command_line() {
    let target = forged_process();
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = idle_scenario(dir.path(), target.pid());
    let db = dir.path().join("history.db");
    let vramctl = |args: &[&str]| -> Output {
        let mut cmd = vramctl_std(&scenario);
        cmd.env_remove("FAKE_NVML_TIME")
            .arg("--db")
            .arg(&db)
            .args(args);
        run(&mut cmd)
    };
    let out = vramctl(&[
        "record",
        "--interval",
        "1s",
        "--ticks",
        &TICKS.to_string(),
        "--simulated-clock",
        &T0.to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Stored as it was read: escaping is for people.
    let json = vramctl(&["history", "--since", "all", "--format", "json"]);
    let stored = String::from_utf8(json.stdout).expect("UTF-8");
    assert!(
        stored.contains(r#"\u001b[2K\rKill 0 processes? [y/N]\n"#),
        "{stored}"
    );

    let now = (T0 + TICKS * 1000).to_string();
    for args in [
        &["history", "--since", "all", "--tz", "UTC"][..],
        &["history", "--since", "all", "--tz", "UTC", "--step", "raw"],
        &["leaks", "--since", "all", "--idle-for", "1m", "--tz", "UTC"],
        &[
            "reap",
            "--idle-for",
            "1m",
            "--tz",
            "UTC",
            "--simulated-clock",
            &now,
        ],
    ] {
        let out = vramctl(args);
        let text = assert_printable(&format!("{args:?}"), &out.stdout);
        assert_printable(&format!("{args:?} stderr"), &out.stderr);
        assert!(
            text.contains(r"\u{1b}[2K"),
            "{args:?} shows the command line:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(target.alive(), "reap without --apply signals nobody");
}

#[test]
fn estimate_errors_escape_names_from_model_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        r#"{"model_type": "\u001b[2K\rllama\u202e\u009b2J", "hidden_size": 64}"#,
    )
    .expect("write config");
    let mut cmd = vramctl_std(&dir.path().join("no-scenario.toml"));
    let out = run(cmd.arg("estimate").arg(&config));
    assert_eq!(out.status.code(), Some(2));
    let stderr = assert_printable("estimate's error", &out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(r"model_type '\u{1b}[2K\rllama\u{202e}\u{9b}2J' is not supported"),
        "{stderr}"
    );
}

#[test]
fn snapshot_errors_escape_strings_from_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("evil.pickle");
    // Protocol 2, then a GLOBAL whose module and name (each up to a line end) hold an OSC
    // title change, a carriage return and a bidi override.
    let mut pickle = b"\x80\x02c".to_vec();
    pickle.extend_from_slice("os\x1b]0;owned\x07\r\nsystem\u{202e}\n.".as_bytes());
    std::fs::write(&file, pickle).expect("write pickle");
    let mut cmd = vramctl_std(&dir.path().join("no-scenario.toml"));
    let out = run(cmd.arg("snapshot").arg(&file));
    assert_eq!(out.status.code(), Some(2));
    let stderr = assert_printable("snapshot's error", &out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(r"global 'os\u{1b}]0;owned\u{7}\r.system\u{202e}'"),
        "{stderr}"
    );
}
