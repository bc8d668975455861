//! The daemon's fast path: `status` and `ps` answered by a running `record` or `serve` over
//! its local socket, and what the socket lets in, refuses and survives. `top`'s first frame
//! is in `top.rs` (it needs a terminal).
//!
//! Every command here gets the same `VRAMCTL_RUNTIME_DIR` as the daemon it talks to (the
//! harness gives every other command one of its own). A daemon's readiness comes from its
//! log line, never from waiting.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{Portable, vramctl_std};
use crate::real_processes::{Holder, Scenario, is_root, sleeper, unused_pids};

const RUNTIME: &str = "VRAMCTL_RUNTIME_DIR";

/// A daemon (`record` or `serve`) started with `VRAMCTL_LOG=debug`, its stderr collected;
/// stopped with SIGTERM on drop.
pub struct Daemon {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    heard: Receiver<String>,
    socket: PathBuf,
}

impl Daemon {
    /// Starts `cmd` answering in `runtime` and waits for its "answering" line.
    pub fn start(mut cmd: Command, runtime: &Path) -> Self {
        cmd.env(RUNTIME, runtime)
            .env("VRAMCTL_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start the daemon");
        let stderr = child.stderr.take().expect("stderr piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, heard) = channel();
        let keep = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                keep.lock().expect("lock").push(line.clone());
                let _ = tx.send(line);
            }
        });
        let mut daemon = Self {
            child,
            lines,
            heard,
            socket: runtime.join("daemon.sock"),
        };
        daemon.wait_for("Answering on a local socket.");
        // The socket answers before NVML is up (nvml_down, and the client reads NVML
        // itself); the tests ask a daemon whose session is up.
        daemon.wait_for_any(&["NVML started.", "NVML is up."]);
        daemon
    }

    /// The first stderr line (from now on) containing `text`.
    fn wait_for(&mut self, text: &str) -> String {
        self.wait_for_any(&[text])
    }

    /// The first stderr line (from now on) containing one of `texts`.
    fn wait_for_any(&mut self, texts: &[&str]) -> String {
        loop {
            match self.heard.recv_timeout(Duration::from_secs(60)) {
                Ok(line) if texts.iter().any(|text| line.contains(text)) => return line,
                Ok(_) => {}
                Err(_) => panic!("the daemon never said {texts:?}; it said:\n{}", self.log()),
            }
        }
    }

    fn log(&self) -> String {
        self.lines.lock().expect("lock").join("\n")
    }

    /// SIGTERM, then its exit; the socket is gone after it.
    pub fn stop(mut self) -> String {
        self.terminate();
        let status = self.child.wait().expect("wait");
        assert!(
            status.success(),
            "the daemon exited {status}:\n{}",
            self.log()
        );
        assert!(
            !self.socket.exists(),
            "a daemon that stopped removes its socket"
        );
        self.log()
    }

    fn terminate(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.terminate();
            let _ = self.child.wait();
        }
    }
}

/// `vramctl record` on `scenario`, with a history in `dir`.
fn record(scenario: &Path, dir: &Path, interval: &str) -> Command {
    let mut cmd = vramctl_std(scenario);
    cmd.arg("--db")
        .arg(dir.join("history.db"))
        .args(["record", "--interval", interval]);
    cmd
}

fn run(mut cmd: Command) -> Output {
    let out = cmd.output().expect("run vramctl");
    assert!(
        out.status.success(),
        "vramctl failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Times and ages (which differ between two reads) replaced.
fn redact(text: &[u8]) -> String {
    let text = String::from_utf8(text.to_vec()).expect("utf-8");
    let time = regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z").expect("regex");
    let age_json = regex::Regex::new(r#""age_s":\d+"#).expect("regex");
    let age_cell = regex::Regex::new(r"\b\d+s\b").expect("regex");
    let text = time.replace_all(&text, "[TIME]");
    // status's header: the local time, labelled with its zone.
    let local = regex::Regex::new(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Za-z0-9+-]+").expect("regex");
    let text = local.replace_all(&text, "[TIME]");
    let text = age_json.replace_all(&text, r#""age_s":0"#);
    age_cell.replace_all(&text, "[AGE]").into_owned()
}

/// `vramctl ARGS` through the daemon in `runtime` and with `--no-daemon`: the daemon
/// answered the first, and both printed the same.
fn same_both_ways(scenario: &Path, runtime: &Path, args: &[&str]) -> String {
    let mut via = vramctl_std(scenario);
    via.env(RUNTIME, runtime)
        .env("VRAMCTL_LOG", "vramctl=debug")
        .args(args);
    let via = run(via);
    let log = String::from_utf8_lossy(&via.stderr);
    assert!(
        log.contains("Answered by the daemon."),
        "{args:?} did not ask the daemon:\n{log}"
    );
    let mut here = vramctl_std(scenario);
    here.env(RUNTIME, runtime)
        .env("VRAMCTL_LOG", "vramctl=debug")
        .args(args)
        .arg("--no-daemon");
    let here = run(here);
    let log = String::from_utf8_lossy(&here.stderr);
    assert!(
        !log.contains("Answered by the daemon."),
        "--no-daemon asked the daemon:\n{log}"
    );
    let (a, b) = (redact(&via.stdout), redact(&here.stdout));
    assert_eq!(a, b, "vramctl {args:?}: through the daemon, then here");
    a
}

/// A scenario with a real process (its /proc facts come from the daemon's catalog) and two
/// PIDs nobody has (named by the driver), on two GPUs.
fn mixed_scenario(real_pid: u32) -> Scenario {
    let free = unused_pids(2);
    Scenario::new(
        2,
        &[
            Holder::real(0, real_pid, "2 GiB"),
            Holder::fictional(0, free[0], "5 GiB"),
            Holder::fictional(1, free[1], "1 GiB"),
        ],
    )
}

#[test]
fn status_and_ps_through_a_record_daemon_match_nvml_here_byte_for_byte() {
    let holder = sleeper();
    let scenario = mixed_scenario(holder.pid());
    let runtime = scenario.dir.path().join("run");
    let daemon = Daemon::start(record(scenario.path(), scenario.dir.path(), "1s"), &runtime);
    let mode = std::fs::metadata(&daemon.socket)
        .expect("the socket")
        .permissions();
    use std::os::unix::fs::PermissionsExt;
    // Root's daemon shares its socket with the `vramctl` group where one exists (the .deb
    // makes it; CI installs that package on the same machine).
    let group_exists = std::fs::read_to_string("/etc/group").is_ok_and(|groups| {
        groups
            .lines()
            .any(|l| l.split(':').next() == Some(vramctl_agent::local_socket::SYSTEM_GROUP))
    });
    let expected = if is_root() && group_exists {
        0o660
    } else {
        0o600
    };
    assert_eq!(
        mode.mode() & 0o777,
        expected,
        "the socket is its owner's (and root's group's)"
    );

    let json = same_both_ways(scenario.path(), &runtime, &["status", "--json"]);
    let report: Value = serde_json::from_str(&json).expect("JSON");
    let processes = report["devices"][0]["processes"].as_array().expect("list");
    assert_eq!(processes.len(), 2, "{json}");
    let real = processes
        .iter()
        .find(|p| p["pid"] == holder.pid())
        .expect("the real process");
    assert_eq!(real["visible"], true);
    assert_eq!(real["command"], "sleep 600");
    assert!(
        report["driver"].get("cuda_driver_version").is_none(),
        "status does not read the CUDA version, whoever answers"
    );
    for args in [
        &["status"][..],
        &["status", "--compact"],
        &["status", "--gpu", "1"],
        &["status", "--watch", "0.1", "--count", "2", "--json"],
        &["ps"],
        &["ps", "--json"],
        &["ps", "--tree"],
    ] {
        same_both_ways(scenario.path(), &runtime, args);
    }
    let ps: Value = serde_json::from_str(&same_both_ways(
        scenario.path(),
        &runtime,
        &["ps", "--json", "--cpu-interval", "0"],
    ))
    .expect("JSON");
    let real = ps["processes"]
        .as_array()
        .expect("list")
        .iter()
        .find(|p| p["pid"] == holder.pid())
        .expect("the real process");
    // The facts from /proc/PID/stat came from the daemon, read when asked.
    assert_eq!(real["state"], "S");
    assert!(real["rss_bytes"].as_u64().is_some_and(|b| b > 0), "{real}");
    assert!(real["start_time_ticks"].as_u64().is_some(), "{real}");
    daemon.stop();
}

#[test]
fn status_with_an_agent_through_a_daemon_matches_nvml_here_byte_for_byte() {
    let py = crate::reclaim::Py::agent(3 << 30, 1 << 30);
    let scenario = crate::reclaim::scenario(py.dir.path(), &[(py.pid(), "5 GiB", "5 GiB")]);
    let runtime = py.dir.path().join("run");
    let daemon = Daemon::start(record(&scenario, py.dir.path(), "1s"), &runtime);
    let json = same_both_ways(&scenario, &runtime, &["status", "--json"]);
    assert!(
        json.contains("\"agent\":{\"allocated_bytes\":1073741824"),
        "{json}"
    );
    let text = same_both_ways(&scenario, &runtime, &["status"]);
    assert!(text.contains("ALLOCATED"), "{text}");
    daemon.stop();
}

#[test]
fn requests_to_a_recorder_add_nothing_to_its_history() {
    let scenario = mixed_scenario(std::process::id());
    let runtime = scenario.dir.path().join("run");
    // One tick at the start, the next an hour later: anything else would be the requests'.
    let mut daemon = Daemon::start(record(scenario.path(), scenario.dir.path(), "1h"), &runtime);
    daemon.wait_for("Committed a tick.");
    for _ in 0..5 {
        same_both_ways(scenario.path(), &runtime, &["status", "--json"]);
    }
    let log = daemon.stop();
    assert_eq!(
        log.matches("Answered a local request.").count(),
        5,
        "each request answered once:\n{log}"
    );
    assert_eq!(
        log.matches("Committed a tick.").count(),
        1,
        "the extra ticks went to the clients only:\n{log}"
    );
}

#[test]
fn status_and_ps_through_a_serve_daemon_match_nvml_here() {
    let holder = sleeper();
    let scenario = mixed_scenario(holder.pid());
    let runtime = scenario.dir.path().join("run");
    let mut cmd = vramctl_std(scenario.path());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--interval", "1s"]);
    let daemon = Daemon::start(cmd, &runtime);
    same_both_ways(scenario.path(), &runtime, &["status", "--json"]);
    same_both_ways(scenario.path(), &runtime, &["ps", "--json"]);
    same_both_ways(scenario.path(), &runtime, &["status"]);
    daemon.stop();
}

#[test]
fn a_daemon_reading_another_nvml_library_is_not_believed() {
    let scenario = mixed_scenario(std::process::id());
    let runtime = scenario.dir.path().join("run");
    let mut daemon = Daemon::start(record(scenario.path(), scenario.dir.path(), "1s"), &runtime);
    // A copy of the fake is another library: its devices are not the daemon's.
    let other = scenario.dir.path().join("libother_nvml.so");
    std::fs::copy(crate::harness::fake_library(), &other).expect("copy the fake");
    let mut cmd = vramctl_std(scenario.path());
    cmd.env(RUNTIME, &runtime)
        .env("VRAMCTL_LOG", "vramctl=debug")
        .arg("status")
        .arg("--nvml-lib")
        .arg(&other);
    let out = run(cmd);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("Not using the daemon's answer."), "{log}");
    assert!(!log.contains("Answered by the daemon."), "{log}");
    daemon.wait_for("Answered a local request.");
    daemon.stop();
}

#[test]
fn a_peer_of_another_uid_is_refused() {
    if !is_root() {
        eprintln!("skipped: only root can run a client as another uid");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let scenario = mixed_scenario(std::process::id());
    // The client must reach the socket for the daemon's own check to be what refuses it:
    // a directory every user may enter, and (as if misconfigured) a socket anyone may open.
    let portable = Portable::new(scenario.path());
    let runtime = portable.dir.path().join("run");
    let mut daemon = Daemon::start(record(scenario.path(), scenario.dir.path(), "1s"), &runtime);
    let dir_mode = std::fs::metadata(&runtime)
        .expect("dir")
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o755, "root's daemon directory");
    std::fs::set_permissions(&daemon.socket, std::fs::Permissions::from_mode(0o666))
        .expect("chmod");

    let mut cmd = portable.command();
    cmd.env(RUNTIME, &runtime)
        .env("VRAMCTL_LOG", "vramctl=debug")
        .args(["status", "--json"])
        .uid(65534)
        .gid(65534);
    let out = cmd.output().expect("run vramctl");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the client reads NVML itself: {log}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["devices"].as_array().map(Vec::len), Some(2));
    assert!(
        log.contains("refused") && log.contains("uid 65534"),
        "the client heard why: {log}"
    );
    assert!(!log.contains("Answered by the daemon."), "{log}");
    let refusal = daemon.wait_for("Refused a local connection.");
    assert!(refusal.contains("uid=65534"), "{refusal}");
    assert!(!daemon.log().contains("Answered a local request."));
    daemon.stop();
}

/// Reads the greeting, sends `request`, returns the reply line and whether the daemon
/// closed the connection after it.
fn raw_exchange(socket: &Path, request: &[u8]) -> (Value, bool) {
    let stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut greeting = String::new();
    reader.read_line(&mut greeting).expect("greeting");
    let greeting: Value = serde_json::from_str(&greeting).expect("JSON greeting");
    assert_eq!(greeting["protocol"], 1, "{greeting}");
    assert_eq!(greeting["service"], "vramctl-daemon", "{greeting}");
    // The daemon may close before it has read all of a long request.
    let _ = (&stream).write_all(request);
    let mut reply = String::new();
    reader.read_line(&mut reply).expect("reply");
    let mut rest = Vec::new();
    // Closed: the end of the stream, or a reset when it closed with our request unread.
    let closed = match reader.read_to_end(&mut rest) {
        Ok(n) => n == 0,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    (serde_json::from_str(&reply).expect("JSON reply"), closed)
}

#[test]
fn a_malformed_or_oversized_request_gets_an_error_and_the_connection_closes() {
    let scenario = mixed_scenario(std::process::id());
    let runtime = scenario.dir.path().join("run");
    let daemon = Daemon::start(record(scenario.path(), scenario.dir.path(), "1s"), &runtime);
    let (reply, closed) = raw_exchange(&daemon.socket, b"status please\n");
    assert_eq!(reply["error"]["code"], "bad_request", "{reply}");
    assert!(closed, "the connection closes after the error");
    let (reply, closed) = raw_exchange(&daemon.socket, b"{\"ask\":\"reclaim\"}\n");
    assert_eq!(reply["error"]["code"], "bad_request", "{reply}");
    assert!(closed);
    let mut long = b"{\"ask\":\"sample\",\"pad\":\"".to_vec();
    long.extend(std::iter::repeat_n(b'x', 100_000));
    long.extend_from_slice(b"\"}\n");
    let (reply, closed) = raw_exchange(&daemon.socket, &long);
    assert_eq!(reply["error"]["code"], "request_too_long", "{reply}");
    assert!(closed);
    // And it still answers the next one.
    let (reply, _) = raw_exchange(&daemon.socket, b"{\"ask\":\"sample\"}\n");
    assert!(reply["ok"]["snapshot"]["devices"].is_array(), "{reply}");
    daemon.stop();
}

#[test]
fn a_daemon_that_never_answers_costs_the_client_at_most_its_timeout() {
    let scenario = mixed_scenario(std::process::id());
    let runtime = scenario.dir.path().join("run");
    std::fs::create_dir(&runtime).expect("mkdir");
    let socket = runtime.join("daemon.sock");
    // Listening, never accepting: the client's connection waits in the backlog.
    let listener = UnixListener::bind(&socket).expect("bind");
    let status = |what: &str| {
        let mut cmd = vramctl_std(scenario.path());
        cmd.env(RUNTIME, &runtime)
            .env("VRAMCTL_LOG", "vramctl=debug")
            .args(["status", "--json"]);
        let started = Instant::now();
        let out = run(cmd);
        let spent = started.elapsed();
        let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(
            report["devices"].as_array().map(Vec::len),
            Some(2),
            "{what}"
        );
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        // The bound guards against a hang; the log says which timeout was waited for.
        assert!(spent < Duration::from_secs(10), "{what}: {spent:?}");
        log
    };
    let log = status("never accepted");
    assert!(
        log.contains("no greeting") && log.contains("timeout_ms=500"),
        "{log}"
    );
    // Accepting and greeting, then silent.
    let server = std::thread::spawn(move || {
        // The first client's connection is still in the backlog, closed: skip it.
        let mut stream = loop {
            let (mut stream, _) = listener.accept().expect("accept");
            let greeting =
                b"{\"protocol\":1,\"service\":\"vramctl-daemon\",\"version\":\"0\",\"pid\":1}\n";
            if stream.write_all(greeting).is_ok() {
                break stream;
            }
        };
        let mut buf = [0_u8; 256];
        let _ = stream.read(&mut buf);
        // Hold the connection until the client gives up and closes it.
        let _ = stream.read(&mut buf);
        listener
    });
    let log = status("greeted, then silent");
    assert!(
        log.contains("no reply") && log.contains("timeout_ms=500"),
        "{log}"
    );
    drop(server.join());
    assert!(socket.exists(), "a socket that answers is not removed");
}

#[test]
fn a_stale_socket_is_removed_by_the_next_client() {
    let scenario = mixed_scenario(std::process::id());
    let runtime = scenario.dir.path().join("run");
    std::fs::create_dir(&runtime).expect("mkdir");
    let socket = runtime.join("daemon.sock");
    // A daemon killed outright leaves its socket file, and nobody listens on it.
    drop(UnixListener::bind(&socket).expect("bind"));
    assert!(socket.exists());
    let mut cmd = vramctl_std(scenario.path());
    cmd.env(RUNTIME, &runtime).args(["status", "--json"]);
    let out = run(cmd);
    assert!(serde_json::from_slice::<Value>(&out.stdout).is_ok());
    assert!(!socket.exists(), "the stale socket was removed");
    // The next daemon binds there as if nothing had been.
    let daemon = Daemon::start(record(scenario.path(), scenario.dir.path(), "1s"), &runtime);
    same_both_ways(scenario.path(), &runtime, &["status", "--json"]);
    daemon.stop();
}

#[test]
fn a_second_daemon_leaves_the_first_ones_socket_alone() {
    let scenario = mixed_scenario(std::process::id());
    let runtime = scenario.dir.path().join("run");
    let first = Daemon::start(record(scenario.path(), scenario.dir.path(), "1s"), &runtime);
    let mut cmd = vramctl_std(scenario.path());
    cmd.env(RUNTIME, &runtime)
        .env("VRAMCTL_LOG", "info")
        .args(["serve", "--listen", "127.0.0.1:0", "--ticks", "1"])
        .args(["--simulated-clock", "1795984291000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut second = cmd.spawn().expect("serve");
    let mut stderr = BufReader::new(second.stderr.take().expect("stderr"));
    let mut said = String::new();
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).expect("read") == 0 {
            break;
        }
        said.push_str(&line);
        if line.contains("first collection is served") {
            break;
        }
    }
    assert!(said.contains("another process answers on"), "{said}");
    let _ = Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status();
    assert!(second.wait().expect("wait").success());
    assert!(
        first.socket.exists(),
        "the first daemon's socket is still there"
    );
    same_both_ways(scenario.path(), &runtime, &["status", "--json"]);
    first.stop();
}
