//! `vramctl top` end to end: the real binary in a real terminal (tmux), on the fake NVML
//! library, driven by keys. Screens are read with `capture-pane`, polled until the
//! expected text appears (never a blind sleep), with a generous overall timeout.
//!
//! tmux is required: `.ci/run` installs it. Without it this test fails, unless
//! `VRAMCTL_SKIP_TMUX=1` says to skip it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use predicates::str::contains;

use crate::harness::{fake_library, free_pids, vramctl_on};

/// How long a screen may take to show what is expected.
const PATIENCE: Duration = Duration::from_secs(30);
const SESSION: &str = "top";

/// A private tmux server (its own socket, no user configuration), killed on drop.
pub(crate) struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut cmd = Command::new("tmux");
        cmd.arg("-S").arg(&self.socket).arg("-f").arg("/dev/null");
        cmd
    }

    fn run(&self, args: &[&str]) -> String {
        let output = self.cmd().args(args).output().expect("run tmux");
        assert!(
            output.status.success(),
            "tmux {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Starts `command` in a new `width`×`height` session.
    pub(crate) fn start(dir: &Path, command: &str, width: u16, height: u16) -> Self {
        let tmux = Self {
            socket: dir.join("tmux.sock"),
        };
        let (w, h) = (width.to_string(), height.to_string());
        tmux.run(&[
            "new-session",
            "-d",
            "-s",
            SESSION,
            "-x",
            &w,
            "-y",
            &h,
            command,
        ]);
        tmux
    }

    pub(crate) fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", SESSION])
    }

    pub(crate) fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", SESSION];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    fn type_text(&self, text: &str) {
        self.run(&["send-keys", "-t", SESSION, "-l", text]);
    }

    fn format(&self, format: &str) -> String {
        self.run(&["display-message", "-p", "-t", SESSION, format])
            .trim()
            .to_owned()
    }

    /// Resizes the window to `x`×`y` and waits for `ready`, resizing again every 5 s: on
    /// a loaded machine a resize once came through as a new width without the new height
    /// (the 120×40 layout never drew in 30 s; the same test passed alone).
    pub(crate) fn resize_until(
        &self,
        x: u16,
        y: u16,
        what: &str,
        ready: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            self.run(&[
                "resize-window",
                "-t",
                SESSION,
                "-x",
                &x.to_string(),
                "-y",
                &y.to_string(),
            ]);
            let round = (Instant::now() + Duration::from_secs(5)).min(deadline);
            match self.poll(&ready, round) {
                Ok(screen) => return screen,
                Err(screen) => assert!(
                    Instant::now() < deadline,
                    "timed out waiting for {what}; the screen was:\n{screen}"
                ),
            }
        }
    }

    /// The screen once `ready` holds for it; fails with the last screen after
    /// [`PATIENCE`].
    pub(crate) fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        self.poll(&ready, Instant::now() + PATIENCE)
            .unwrap_or_else(|screen| {
                panic!("timed out waiting for {what}; the screen was:\n{screen}")
            })
    }

    /// The screen once `ready` holds for it, looked at every 50 ms until `until`; past it,
    /// the last screen as the error.
    fn poll(&self, ready: &impl Fn(&str) -> bool, until: Instant) -> Result<String, String> {
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return Ok(screen);
            }
            if Instant::now() >= until {
                return Err(screen);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").stderr(Stdio::null()).status();
    }
}

/// A child process killed on drop.
struct Spawned(Child);

impl Spawned {
    /// Waits for it to end; the signal that ended it, if one did.
    fn wait_signal(&mut self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.0.wait().expect("wait").signal()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tmux_available() -> bool {
    Command::new("tmux")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The rows of the process table on `screen`: `(pid, rest of the line)`.
pub(crate) fn table_rows(screen: &str) -> Vec<(u32, String)> {
    let mut lines = screen.lines().skip_while(|l| !l.contains("COMMAND"));
    lines.next();
    lines
        .map_while(|l| {
            let mut parts = l.split_whitespace();
            let pid = parts.next()?.parse().ok()?;
            Some((pid, l.to_owned()))
        })
        .collect()
}

fn pid_order(screen: &str) -> Vec<u32> {
    table_rows(screen).into_iter().map(|(p, _)| p).collect()
}

#[test]
fn bad_flags_are_one_line_errors() {
    for (args, message) in [
        (
            &["top", "--interval", "0"][..],
            "invalid value '0' for '--interval <DURATION>': '0' is shorter than 100ms",
        ),
        (
            &["top", "--interval", "nan"][..],
            "invalid value 'nan' for '--interval <DURATION>': 'nan' is not a duration",
        ),
        (&["top", "--replay", "x.db"][..], "cannot replay 'x.db'"),
        (&["top", "--gpu", "9"][..], "no GPU matches '9'"),
        // Not a terminal (the test's pipe): says what to use instead.
        (
            &["top"][..],
            "vramctl top needs a terminal; for plain output use",
        ),
    ] {
        vramctl_on("h200-idle.toml")
            .args(args)
            .assert()
            .code(2)
            .stdout("")
            .stderr(contains(message))
            .stderr(predicates::function::function(|e: &str| {
                e.lines().count() == 1
            }));
    }
}

/// Runs `top` on `scenario` (TOML text) in a 120×40 tmux pane. The pane runs a script: top
/// with a clean environment, then prints its exit status and the tty modes, then waits (so
/// the pane stays to be read).
fn launch(dir: &Path, scenario: &str) -> Tmux {
    launch_with(dir, scenario, "top --interval 0.2")
}

/// [`launch`] with other arguments for vramctl.
fn launch_with(dir: &Path, scenario: &str, args: &str) -> Tmux {
    let runtime = crate::harness::private_runtime_dir();
    launch_env(
        dir,
        scenario,
        &format!("VRAMCTL_RUNTIME_DIR='{}'", runtime.display()),
        args,
    )
}

/// [`launch_with`] with `env` (`NAME='value' ...`) in vramctl's environment.
pub(crate) fn launch_env(dir: &Path, scenario: &str, env: &str, args: &str) -> Tmux {
    let scenario_path = dir.join("scenario.toml");
    std::fs::write(&scenario_path, scenario).expect("write scenario");
    let binary = assert_cmd::cargo::cargo_bin("vramctl");
    let script = format!(
        "env -i PATH=\"$PATH\" TERM=\"$TERM\" VRAMCTL_NVML_LIB='{}' FAKE_NVML_SCENARIO='{}' \
         FAKE_NVML_TIME=0 NO_COLOR=1 XDG_STATE_HOME='{}' VRAMCTL_AUDIT_LOG='{}' {env} '{}' {args}\n\
         echo \"vramctl exited $?\"\n\
         echo \"stty: $(stty -a | tr '\\n' ' ')\"\n\
         read _\n",
        fake_library().display(),
        scenario_path.display(),
        dir.join("state").display(),
        dir.join("audit.jsonl").display(),
        binary.display(),
    );
    let script_path = dir.join("run.sh");
    std::fs::write(&script_path, script).expect("write script");
    Tmux::start(dir, &format!("sh '{}'", script_path.display()), 120, 40)
}

/// After top exited: the tty is back in cooked mode with echo; the alternate screen, mouse
/// capture and the hidden cursor are undone. Returns the screen.
fn assert_terminal_restored(tmux: &Tmux) -> String {
    let screen = tmux.wait_for("the stty line", |s| s.contains("stty: "));
    let stty = screen
        .lines()
        .skip_while(|l| !l.starts_with("stty: "))
        .collect::<Vec<_>>()
        .join(" ");
    for setting in [" icanon", " echo ", " isig", " icrnl"] {
        assert!(stty.contains(setting), "'{setting}' not restored: {stty}");
    }
    assert_eq!(
        tmux.format("#{alternate_on}"),
        "0",
        "left the alternate screen"
    );
    assert_eq!(tmux.format("#{mouse_any_flag}"), "0", "mouse capture off");
    assert_eq!(tmux.format("#{cursor_flag}"), "1", "cursor visible");
    screen
}

/// Whether to skip a tmux test: only when tmux is missing and `VRAMCTL_SKIP_TMUX=1`;
/// missing without it fails.
pub(crate) fn skip_without_tmux() -> bool {
    if tmux_available() {
        return false;
    }
    if std::env::var("VRAMCTL_SKIP_TMUX").is_ok_and(|v| v == "1") {
        eprintln!("skipped: tmux is not installed and VRAMCTL_SKIP_TMUX=1");
        return true;
    }
    panic!(
        "tmux is not installed: install it (apt-get install tmux; .ci/run does) or set \
         VRAMCTL_SKIP_TMUX=1 to skip this test"
    );
}

#[test]
fn tops_first_frame_comes_from_a_running_daemon() {
    if skip_without_tmux() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let pid = free_pids(1)[0];
    let gpu = "[[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\n\
               memory_total = 150754820096\n";
    let served = format!(
        "{gpu}\n[[gpu.process]]\npid = {pid}\nname = \"told-by-the-daemon\"\nmemory = \"1 GiB\"\n"
    );
    let daemon_scenario = dir.path().join("daemon.toml");
    std::fs::write(&daemon_scenario, served).expect("write scenario");
    let runtime = dir.path().join("run");
    let mut record = crate::harness::vramctl_std(&daemon_scenario);
    record
        .arg("--db")
        .arg(dir.path().join("history.db"))
        .args(["record", "--interval", "1s"]);
    let daemon = crate::daemon::Daemon::start(record, &runtime);
    // top's own NVML never starts: what it shows came from the daemon, at once.
    let broken = format!("[init]\nerror = \"driver_not_loaded\"\n\n{gpu}");
    let env = format!("VRAMCTL_RUNTIME_DIR='{}'", runtime.display());
    let tmux = launch_env(dir.path(), &broken, &env, "top --interval 0.2");
    let screen = tmux.wait_for("the daemon's frame, then the sampler's error", |s| {
        table_rows(s).len() == 1 && s.contains("sampling stopped")
    });
    assert!(screen.contains("told-by-the-daemon"), "{screen}");
    assert!(screen.contains(&pid.to_string()), "{screen}");
    tmux.keys(&["q"]);
    let screen = tmux.wait_for("top to exit", |s| s.contains("vramctl exited"));
    assert!(screen.contains("vramctl exited 0"), "{screen}");
    daemon.stop();
}

#[test]
fn sigterm_ends_top_with_the_terminal_given_back() {
    if skip_without_tmux() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let pid = free_pids(1)[0];
    let scenario = format!(
        "[[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\n\
         memory_total = 150754820096\n\n[[gpu.process]]\npid = {pid}\nname = \"x\"\n\
         memory = \"1 GiB\"\n"
    );
    let tmux = launch(dir.path(), &scenario);
    tmux.wait_for("the table", |s| table_rows(s).len() == 1);
    // The pane's shell runs the script; top is its only child.
    let shell = tmux.format("#{pane_pid}");
    let output = Command::new("ps")
        .args(["-o", "pid=", "--ppid", &shell])
        .output()
        .expect("ps");
    let top_pid = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert!(top_pid.parse::<u32>().is_ok(), "top's PID: '{top_pid}'");
    let status = Command::new("kill")
        .args(["-TERM", &top_pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let screen = tmux.wait_for("top to exit", |s| s.contains("vramctl exited"));
    assert!(screen.contains("vramctl exited 0"), "{screen}");
    assert_terminal_restored(&tmux);
}

#[test]
fn top_sorts_filters_selects_helps_and_gives_the_terminal_back() {
    if skip_without_tmux() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    // A real process holding "GPU memory" in the fake, and four fictional ones.
    let mut sleeper = Spawned(
        Command::new("sleep")
            .arg("300")
            .spawn()
            .expect("spawn sleep"),
    );
    let real_pid = sleeper.0.id();
    let audit_log = dir.path().join("audit.jsonl");
    let fake = free_pids(4);
    let names = [
        "python train.py --model llama-8b",
        "python -m vllm.entrypoints.openai.api_server",
        "python -m ipykernel_launcher",
        "python leaky_worker.py",
    ];
    let memory = ["48 GiB", "20 GiB", "12 GiB", "8 GiB"];
    let mut scenario = String::from(
        "driver_version = \"580.159.04\"\n\n[[gpu]]\nname = \"NVIDIA H200\"\n\
         uuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\n\
         memory_total = 150754820096\nmemory_reserved = 644939776\n\
         utilization_gpu = 60\ntemperature_c = 50\npower_mw = 300000\n",
    );
    for ((pid, name), mem) in fake.iter().zip(names).zip(memory) {
        scenario.push_str(&format!(
            "\n[[gpu.process]]\npid = {pid}\nname = \"{name}\"\nmemory = \"{mem}\"\n"
        ));
    }
    scenario.push_str(&format!(
        "\n[[gpu.process]]\npid = {real_pid}\nreal = true\nmemory = \"2 GiB\"\n"
    ));
    let tmux = launch(dir.path(), &scenario);

    // Everything shows, biggest holder first.
    let screen = tmux.wait_for("the five processes", |s| table_rows(s).len() == 5);
    assert!(screen.contains("vramctl top"), "{screen}");
    assert_eq!(
        tmux.format("#{alternate_on}"),
        "1",
        "top uses the alternate screen"
    );
    let mut expected = fake.clone();
    expected.push(real_pid);
    assert_eq!(pid_order(&screen), expected, "{screen}");
    let rows = table_rows(&screen);
    let real_row = &rows[4].1;
    assert!(real_row.contains("sleep 300"), "{real_row}");
    assert!(
        rows[0].1.contains(" H "),
        "fictional PIDs are flagged: {}",
        rows[0].1
    );

    // Sort by PID: S steps back from MEM through GPU and USER.
    tmux.keys(&["S", "S", "S"]);
    let mut by_pid = expected.clone();
    by_pid.sort_unstable();
    let screen = tmux.wait_for("the PID sort", |s| s.contains("PID▲"));
    assert_eq!(pid_order(&screen), by_pid, "{screen}");
    // And reversed.
    tmux.keys(&["r"]);
    let screen = tmux.wait_for("the reversed sort", |s| s.contains("PID▼"));
    by_pid.reverse();
    assert_eq!(pid_order(&screen), by_pid, "{screen}");

    // Filter.
    tmux.keys(&["/"]);
    tmux.type_text("vllm");
    let screen = tmux.wait_for("the filter", |s| table_rows(s).len() == 1);
    assert!(screen.contains("filter: vllm"), "{screen}");
    assert_eq!(pid_order(&screen), [fake[1]], "{screen}");
    tmux.keys(&["Enter"]);
    tmux.keys(&["Escape"]);
    tmux.wait_for("the filter cleared", |s| table_rows(s).len() == 5);

    // Select the third row and open its details.
    tmux.keys(&["g", "Down", "Down", "Enter"]);
    let third = by_pid[2];
    let screen = tmux.wait_for("the detail pane", |s| {
        s.contains(&format!("PID {third} on GPU 0"))
    });
    assert!(screen.contains("verdict"), "{screen}");
    tmux.keys(&["Escape"]);

    // Help, and any key closes it.
    tmux.keys(&["?"]);
    tmux.wait_for("the help", |s| s.contains("keys (any key closes)"));
    tmux.keys(&["?"]);
    tmux.wait_for("the help closed", |s| !s.contains("keys (any key closes)"));

    // Resize below the minimum and back.
    tmux.run(&["resize-window", "-t", SESSION, "-x", "70", "-y", "20"]);
    tmux.wait_for("the too-small message", |s| {
        s.contains("terminal too small: 70×20")
    });
    let screen = tmux.resize_until(80, 24, "the 80x24 layout", |s| table_rows(s).len() == 5);
    assert!(screen.lines().all(|l| l.chars().count() <= 80), "{screen}");
    tmux.resize_until(120, 40, "the 120x40 layout", |s| {
        s.contains("memory used · last")
    });

    // A fictional PID (no such process here): the dialog checks it against /proc, as
    // `vramctl kill` does, and refuses.
    let fictional = by_pid
        .iter()
        .position(|p| fake.contains(p))
        .expect("a fake PID");
    tmux.keys(&["g"]);
    for _ in 0..fictional {
        tmux.keys(&["Down"]);
    }
    tmux.keys(&["K"]);
    let screen = tmux.wait_for("the kill refusal", |s| s.contains("kill: not done"));
    assert!(
        screen.contains(&format!(
            "refused: no process {} in this PID namespace",
            by_pid[fictional]
        )),
        "{screen}"
    );
    tmux.keys(&["x"]);
    assert!(!audit_log.exists(), "a refused plan writes no audit record");

    // The real process: the dialog shows who it is (checked against /proc) and its memory;
    // confirming signals it on `vramctl kill`'s path (audit record first, then SIGTERM
    // through a pidfd), and the samples that follow show its 2 GiB gone.
    let real_index = by_pid
        .iter()
        .position(|&p| p == real_pid)
        .expect("the real PID");
    tmux.keys(&["g"]);
    for _ in 0..real_index {
        tmux.keys(&["Down"]);
    }
    tmux.keys(&["K"]);
    let screen = tmux.wait_for("the confirmation", |s| s.contains("kill this process?"));
    for expected in [
        format!("PID      {real_pid}"),
        "command  sleep 300".to_owned(),
        "memory   GPU 0 2.0G".to_owned(),
        "start time".to_owned(),
        "SIGTERM".to_owned(),
    ] {
        assert!(
            screen.contains(&expected),
            "'{expected}' missing:\n{screen}"
        );
    }
    tmux.keys(&["y"]);
    let screen = tmux.wait_for("the kill result", |s| s.contains("kill: done"));
    assert!(
        screen.contains("exited; freed 2.0G (GPU 0 2.0G)"),
        "{screen}"
    );
    assert_eq!(
        sleeper.wait_signal(),
        Some(15),
        "ended by the SIGTERM top sent"
    );
    tmux.keys(&["x"]);
    let screen = tmux.wait_for("the killed process gone", |s| table_rows(s).len() == 4);
    assert!(!pid_order(&screen).contains(&real_pid), "{screen}");
    // The audit log has the record (written before the signal) and the memory outcome
    // (written by the action thread once the dialog said done: waited for, not assumed).
    let started = Instant::now();
    let audit = loop {
        let audit = std::fs::read_to_string(&audit_log).expect("the audit log");
        if audit.contains("\"exited\"") || started.elapsed() > PATIENCE {
            break audit;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let lines: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let record = lines
        .iter()
        .find_map(|l| l.get("record"))
        .expect("a record line");
    assert_eq!(record["target"]["pid"], real_pid, "{audit}");
    assert_eq!(record["action"], "kill", "{audit}");
    assert!(
        lines.iter().any(|l| l["outcome"]["outcome"] == "exited"
            && l["outcome"]["detail"]["freed_bytes"] == 2u64 << 30),
        "the memory outcome: {audit}"
    );

    // Quit: the terminal is given back as it was.
    tmux.keys(&["q"]);
    let screen = tmux.wait_for("top to exit", |s| s.contains("vramctl exited"));
    assert!(screen.contains("vramctl exited 0"), "{screen}");
    let screen = assert_terminal_restored(&tmux);
    assert!(
        !screen.contains("COMMAND"),
        "no UI left on the screen: {screen}"
    );
    drop(sleeper);
}

/// 2026-11-29T20:31:31Z: the recording below starts here.
const T0_MS: i64 = 1_795_984_291_000;

#[test]
fn replay_of_a_recording_moves_the_cursor_and_gives_the_terminal_back() {
    if skip_without_tmux() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    // Record 30 s (simulated, instant) of a real process and a fictional one whose memory
    // steps up a GiB per second, on the fake's step clock.
    let sleeper = Spawned(
        Command::new("sleep")
            .arg("300")
            .spawn()
            .expect("spawn sleep"),
    );
    let real = sleeper.0.id();
    let fictional = free_pids(1)[0];
    let scenario = format!(
        "[clock]\nmode = \"step\"\nstep_s = 1.0\n\n[[gpu]]\nname = \"NVIDIA H200\"\n\
         uuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\nmemory_total = 150754820096\n\
         memory_reserved = 644939776\nutilization_gpu = 50\ntemperature_c = 50\n\
         power_mw = 300000\n\n[[gpu.process]]\npid = {fictional}\nname = \"python leak.py\"\n\
         memory = {{ steps = {{ values = [\"10 GiB\", \"11 GiB\", \"12 GiB\", \"13 GiB\", \
         \"14 GiB\", \"15 GiB\"], every_s = 1.0 }} }}\n\n\
         [[gpu.process]]\npid = {real}\nreal = true\nmemory = \"2 GiB\"\n"
    );
    let scenario_path = dir.path().join("scenario.toml");
    std::fs::write(&scenario_path, &scenario).expect("write scenario");
    let db = dir.path().join("recording.db");
    let recorded = crate::harness::vramctl_std(&scenario_path)
        .env_remove("FAKE_NVML_TIME")
        .arg("--db")
        .arg(&db)
        .args(["record", "--interval", "1s", "--ticks", "30"])
        .args(["--simulated-clock", &T0_MS.to_string()])
        .output()
        .expect("run vramctl record");
    assert!(
        recorded.status.success(),
        "{}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    // The replay needs neither the process nor NVML any more.
    drop(sleeper);

    let tmux = launch_with(
        dir.path(),
        &scenario,
        &format!("top --replay '{}'", db.display()),
    );
    let row_of = |screen: &str, pid: u32| {
        table_rows(screen)
            .into_iter()
            .find(|(p, _)| *p == pid)
            .map(|(_, row)| row)
            .unwrap_or_default()
    };
    // The first sample (the fake's clock was at 1 s): 11 GiB, and who the real process was.
    let screen = tmux.wait_for("the first sample", |s| {
        s.contains("2026-11-29 20:31:31 UTC") && table_rows(s).len() == 2
    });
    assert!(screen.contains("REPLAY ⏸ 1×"), "{screen}");
    assert!(screen.contains("[20:31:31 – 20:32:00]"), "{screen}");
    let leak = row_of(&screen, fictional);
    assert!(leak.contains("11.0G"), "{leak}");
    assert!(
        leak.contains("python leak.py") && leak.contains(" H "),
        "{leak}"
    );
    let sleeping = row_of(&screen, real);
    assert!(
        sleeping.contains("2.0G") && sleeping.contains("sleep 300"),
        "{sleeping}"
    );
    assert!(
        !sleeping.contains(" H "),
        "the recorder saw it in /proc: {sleeping}"
    );

    // → one sample on; e the end; b the beginning again.
    tmux.keys(&["Right"]);
    let screen = tmux.wait_for("the next sample", |s| s.contains("2026-11-29 20:31:32 UTC"));
    assert!(row_of(&screen, fictional).contains("12.0G"), "{screen}");
    tmux.keys(&["e"]);
    let screen = tmux.wait_for("the last sample", |s| s.contains("2026-11-29 20:32:00 UTC"));
    let leak = row_of(&screen, fictional);
    assert!(leak.contains("15.0G"), "{leak}");
    // The last minute of the recording: 15 GiB now, 11 GiB at its start 29 s earlier.
    assert!(leak.contains("+4.0G"), "{leak}");
    tmux.keys(&["b"]);
    tmux.wait_for("the first sample again", |s| {
        s.contains("2026-11-29 20:31:31 UTC")
    });
    // Issue 29: keys sent in a burst (one send-keys, faster than a seek comes back) are
    // each carried out: four → are four samples on, not one.
    tmux.keys(&["Right", "Right", "Right", "Right"]);
    let screen = tmux.wait_for("four samples on", |s| s.contains("2026-11-29 20:31:35 UTC"));
    assert!(row_of(&screen, fictional).contains("15.0G"), "{screen}");
    tmux.keys(&["b"]);
    tmux.wait_for("the first sample once more", |s| {
        s.contains("2026-11-29 20:31:31 UTC")
    });
    // Space plays at 1× (a recorded second per second), space again pauses.
    tmux.keys(&["Space"]);
    tmux.wait_for("playing", |s| s.contains("REPLAY ▶"));
    tmux.wait_for("the cursor to move", |s| {
        s.contains("REPLAY ▶") && !s.contains("2026-11-29 20:31:31 UTC")
    });
    tmux.keys(&["Space"]);
    tmux.wait_for("paused", |s| s.contains("REPLAY ⏸"));
    // Kill is off in a replay.
    tmux.keys(&["K"]);
    tmux.wait_for("the refusal", |s| {
        s.contains("actions are disabled while replaying a recording")
    });

    tmux.keys(&["q"]);
    let screen = tmux.wait_for("top to exit", |s| s.contains("vramctl exited"));
    assert!(screen.contains("vramctl exited 0"), "{screen}");
    let screen = assert_terminal_restored(&tmux);
    assert!(!screen.contains("COMMAND"), "no UI left: {screen}");
}

/// The rows of the device chart's plot (between its title and its time axis).
fn chart_rows(screen: &str) -> Vec<String> {
    screen
        .lines()
        .skip_while(|l| !l.contains("memory used · last"))
        .skip(1)
        .take_while(|l| !l.contains('└'))
        .map(str::to_owned)
        .collect()
}

fn has_braille(line: &str) -> bool {
    line.chars().any(|c| ('\u{2801}'..='\u{28FF}').contains(&c))
}

#[test]
fn live_charts_reach_back_into_the_recorders_history() {
    if skip_without_tmux() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let pid = free_pids(1)[0];
    let gpu = "[[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\n\
               memory_total = 150754820096\nmemory_reserved = 644939776\n";
    // What a recorder saw from 2 h to 20 min ago: the GPU nearly full.
    let past = dir.path().join("past.toml");
    std::fs::write(
        &past,
        format!(
            "{gpu}\n[[gpu.process]]\npid = {pid}\nname = \"python big.py\"\nmemory = \"120 GiB\"\n"
        ),
    )
    .expect("write scenario");
    let db = dir.path().join("history.db");
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis(),
    )
    .expect("ms");
    let recorded = crate::harness::vramctl_std(&past)
        .arg("--db")
        .arg(&db)
        .args(["record", "--interval", "10s", "--ticks", "600"])
        .args(["--simulated-clock", &(now_ms - 7_200_000).to_string()])
        .output()
        .expect("run vramctl record");
    assert!(
        recorded.status.success(),
        "{}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    // Now: 10 GiB.
    let now = format!(
        "{gpu}\n[[gpu.process]]\npid = {pid}\nname = \"python big.py\"\nmemory = \"10 GiB\"\n"
    );
    let tmux = launch_with(
        dir.path(),
        &now,
        &format!("--db '{}' top --interval 0.2", db.display()),
    );
    let screen = tmux.wait_for("the table", |s| table_rows(s).len() == 1);
    assert!(!screen.contains("no history db"), "{screen}");
    // Over the last 5 minutes only today's 10 GiB: nothing in the chart's upper half.
    let rows = chart_rows(&screen);
    assert!(rows.len() >= 6, "{screen}");
    assert!(
        rows[..rows.len() / 2].iter().all(|r| !has_braille(r)),
        "{screen}"
    );
    // Zoomed out to an hour, the recorder's 120 GiB fills the upper half on the left.
    tmux.keys(&["Z", "Z"]);
    let screen = tmux.wait_for("the recorded past in the chart", |s| {
        s.contains("memory used · last 1h") && {
            let rows = chart_rows(s);
            rows[..rows.len() / 2].iter().any(|r| has_braille(r))
        }
    });
    // And no line is drawn across the 20 minutes nobody recorded: nothing in the middle
    // rows between the recorded 120 GiB and today's 10 GiB.
    let rows = chart_rows(&screen);
    let middle = &rows[rows.len() / 3..rows.len() * 2 / 3];
    assert!(middle.iter().all(|r| !has_braille(r)), "{screen}");
    // The help says where it came from.
    tmux.keys(&["?"]);
    let screen = tmux.wait_for("the help", |s| s.contains("history:"));
    assert!(
        screen.contains("before top started: the recorder's"),
        "{screen}"
    );
    tmux.keys(&["?"]);
    tmux.keys(&["q"]);
    let screen = tmux.wait_for("top to exit", |s| s.contains("vramctl exited"));
    assert!(screen.contains("vramctl exited 0"), "{screen}");
}

#[test]
fn top_shows_an_agents_figures_and_the_reclaim_key_releases_its_cache() {
    use crate::reclaim::{GIB, Py, scenario};
    if skip_without_tmux() {
        return;
    }
    // A real Python process with the agent and the stand-in torch: 1 GiB in a live
    // tensor, 20 GiB cached; NVML lists it with 22 GiB.
    let py = Py::agent(20 * GIB, GIB);
    let pid = py.pid();
    let path = scenario(py.dir.path(), &[(pid, "22 GiB", "22 GiB")]);
    let text = std::fs::read_to_string(path).expect("scenario");
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = crate::harness::private_runtime_dir();
    let tmux = launch_env(
        dir.path(),
        &text,
        &format!(
            "VRAMCTL_RUNTIME_DIR='{}' XDG_RUNTIME_DIR='{}'",
            runtime.display(),
            py.dir.path().display()
        ),
        "top --interval 0.2",
    );
    // The agent's figures beside NVML's, asked on the sampler's thread.
    let screen = tmux.wait_for("the agent's columns", |s| s.contains("CACHED"));
    let row = screen
        .lines()
        .find(|l| l.trim_start().starts_with(&pid.to_string()))
        .unwrap_or_else(|| panic!("a row for {pid}:\n{screen}"));
    assert!(
        row.contains("22.0G") && row.contains("1.0G") && row.contains("20.0G"),
        "{row}"
    );
    assert!(screen.contains("R reclaim"), "{screen}");

    // The reclaim key: the agent releases the cache; the footer says what came back.
    tmux.keys(&["R"]);
    let screen = tmux.wait_for("the reclaim's outcome", |s| s.contains("released"));
    assert!(
        screen.contains(&format!("PID {pid}: released 20.0G of cache (0B left)")),
        "{screen}"
    );
    // Audited as `vramctl reclaim` is: the record before, the outcome after.
    let audit_log = dir.path().join("audit.jsonl");
    let started = Instant::now();
    let audit = loop {
        let audit = std::fs::read_to_string(&audit_log).unwrap_or_default();
        if audit.contains("\"reclaimed\"") || started.elapsed() > PATIENCE {
            break audit;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let lines: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let record = lines
        .iter()
        .find_map(|l| l.get("record"))
        .unwrap_or_else(|| panic!("a record line: {audit}"));
    assert_eq!(record["action"], "reclaim", "{audit}");
    assert_eq!(record["target"]["pid"], pid, "{audit}");
    assert!(
        lines.iter().any(|l| l["outcome"]["outcome"] == "reclaimed"
            && l["outcome"]["detail"]["released_bytes"] == 20 * GIB),
        "{audit}"
    );
    tmux.keys(&["q"]);
    tmux.wait_for("top to exit", |s| s.contains("vramctl exited"));
}

#[test]
fn the_reclaim_key_is_refused_read_only() {
    if skip_without_tmux() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let pid = free_pids(1)[0];
    let tmux = launch_with(
        dir.path(),
        &format!(
            "[[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\n\
             memory_total = 150754820096\n\
             [[gpu.process]]\npid = {pid}\nname = \"x\"\nmemory = \"2 GiB\"\n"
        ),
        "top --interval 0.2 --readonly",
    );
    tmux.wait_for("the process", |s| s.contains(&pid.to_string()));
    tmux.keys(&["R"]);
    let screen = tmux.wait_for("the refusal", |s| s.contains("read-only session"));
    assert!(!screen.contains("R reclaim"), "{screen}");
    assert!(!dir.path().join("audit.jsonl").exists());
    tmux.keys(&["q"]);
    tmux.wait_for("top to exit", |s| s.contains("vramctl exited"));
}

#[test]
fn top_shows_a_forged_command_line_escaped_in_the_table_and_the_detail_pane() {
    if skip_without_tmux() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let target = crate::escapes::forged_process();
    let pid = target.pid();
    let scenario = format!(
        "[[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\n\
         memory_total = 150754820096\n\n[[gpu.process]]\npid = {pid}\nreal = true\n\
         memory = \"1 GiB\"\n"
    );
    let tmux = launch(dir.path(), &scenario);
    // Raw, the escape would have erased the row (or, dropped by ratatui, shown `[2K`);
    // escaped, it reads as in `ps`.
    let screen = tmux.wait_for("the forged row", |s| {
        table_rows(s)
            .iter()
            .any(|(p, row)| *p == pid && row.contains(r"\u{1b}[2K\rKill 0 processes?"))
    });
    assert!(screen.contains(" vramctl top "), "{screen}");
    tmux.keys(&["g", "Enter"]);
    let screen = tmux.wait_for("the detail pane", |s| {
        s.contains(&format!("PID {pid} on GPU 0"))
    });
    // The pane shows the command line from its start, escaped too (no forged line end).
    let pane = screen
        .lines()
        .find(|l| l.contains("command ") && l.contains(r"\u{1b}[2K\rKill"));
    assert!(pane.is_some(), "{screen}");
    tmux.keys(&["q"]);
    tmux.wait_for("top to exit", |s| s.contains("vramctl exited"));
}
