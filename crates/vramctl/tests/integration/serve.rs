//! `vramctl serve`: the real binary on the fake NVML, scraped over loopback, checked by
//! Prometheus' own tools (`promtool`, and a real Prometheus server end to end).
//!
//! promtool and prometheus come from Debian's `prometheus` package, which `.ci/run`
//! installs. A test that needs them fails when they are missing, unless
//! `VRAMCTL_SKIP_PROMETHEUS=1` is set (for developers without the package; CI never sets it).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{scenario, vramctl_std};

/// A running `vramctl serve`, killed on drop.
pub(crate) struct Served {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `vramctl serve` on a free loopback port and waits until its first collection is
/// served (with `--ticks`, its last): the "serving" line comes as soon as HTTP listens, the
/// "first collection" line once the sampler has published.
pub(crate) fn serve(cmd: Command, args: &[&str]) -> Served {
    serve_until(cmd, args, "vramctl: the first collection is served")
}

/// Starts `vramctl serve` and returns once it listens, before NVML has answered.
fn serve_listening(cmd: Command, args: &[&str]) -> Served {
    serve_until(cmd, args, "vramctl: serving ")
}

fn serve_until(mut cmd: Command, args: &[&str], until: &str) -> Served {
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start vramctl serve");
    let stderr = child.stderr.take().expect("stderr");
    // Read on a thread, so a daemon that never prints the line fails the test instead of
    // hanging it; the thread then keeps draining so the daemon never blocks on the pipe.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let mut addr = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let _ = child.kill();
            let status = child.wait().expect("wait");
            panic!("vramctl serve ({status}) never printed {until:?}: {seen:?}");
        };
        seen.push(line.clone());
        if let Some(rest) = line.strip_prefix("vramctl: serving ") {
            let hostport = rest
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .trim_end_matches("/metrics");
            addr = Some(hostport.parse().expect("address"));
        }
        if let (true, Some(addr)) = (line.starts_with(until), addr) {
            return Served { child, addr };
        }
    }
}

fn serve_scenario(name: &str, args: &[&str]) -> Served {
    serve(vramctl_std(&scenario(name)), args)
}

/// A parsed HTTP response.
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) headers: String,
    pub(crate) body: String,
}

fn request_text(path: &str, extra_headers: &[(&str, &str)]) -> String {
    let mut text = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (name, value) in extra_headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    text
}

fn parse_response(raw: &[u8]) -> Response {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    Response {
        status,
        headers: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

/// Plain HTTP GET with `Connection: close`.
pub(crate) fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
        .write_all(request_text(path, headers).as_bytes())
        .expect("send");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read");
    parse_response(&raw)
}

/// `promtool` or `prometheus`, or `None` when the developer opted out.
pub(crate) fn prometheus_tool(name: &str) -> Option<PathBuf> {
    if std::env::var_os("VRAMCTL_SKIP_PROMETHEUS").is_some_and(|v| v == "1") {
        eprintln!("skipped: VRAMCTL_SKIP_PROMETHEUS=1");
        return None;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    match found {
        Some(tool) => Some(tool),
        None => panic!(
            "'{name}' is not installed: apt-get install prometheus (Debian), or set \
             VRAMCTL_SKIP_PROMETHEUS=1 to skip the tests that need it"
        ),
    }
}

/// `promtool check metrics` on `text`: it must find nothing, except one style lint that
/// `--metrics-compat dcgm` brings on purpose: dcgm-exporter's own label names (`modelName`)
/// are camelCase, and dashboards made for it select by them, so they cannot be renamed.
/// That lint is tolerated on `DCGM_FI_*` families only; any other finding fails, and a
/// format error (promtool's "error while linting") too.
fn promtool_check_metrics(promtool: &Path, text: &str) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed promtool");
    let output = child.wait_with_output().expect("promtool");
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let dcgm_label_style = |line: &str| {
        line.split_once(' ').is_some_and(|(family, lint)| {
            family.starts_with("DCGM_FI_")
                && lint == "label names should be written in 'snake_case' not 'camelCase'"
        })
    };
    let untolerated: Vec<&str> = findings
        .lines()
        .filter(|l| !l.trim().is_empty() && !dcgm_label_style(l))
        .collect();
    let only_tolerated = untolerated.is_empty() && findings.lines().any(dcgm_label_style);
    assert!(
        (output.status.success() && findings.is_empty()) || only_tolerated,
        "promtool check metrics failed:\n{findings}\n--- input ---\n{text}"
    );
}

/// insta settings hiding what changes between runs: durations, times, the version.
fn exposition_redactions() -> insta::Settings {
    let mut settings = crate::harness::redactions();
    settings.add_filter(
        r"(?m)^(vramctl_(?:sample_duration_seconds|last_sample_timestamp_seconds|last_sample_age_seconds)) \S+$",
        "$1 [VALUE]",
    );
    settings.add_filter(
        r#"vramctl_build_info\{version="[^"]*"\}"#,
        r#"vramctl_build_info{version="[VERSION]"}"#,
    );
    settings
}

/// Scrapes a scenario once (a long interval: exactly one sample), checks both formats
/// (with promtool unless `VRAMCTL_SKIP_PROMETHEUS` leaves it out: the other checks run
/// regardless) and returns the Prometheus text.
fn scrape_scenario(name: &str, env: &[(&str, &str)], args: &[&str]) -> String {
    let mut cmd = vramctl_std(&scenario(name));
    for (key, value) in env {
        cmd.env(key, value);
    }
    let mut all_args = vec![
        "--interval",
        "3600",
        "--peak-window",
        "3600",
        "--process-details",
        "nvml",
    ];
    all_args.extend_from_slice(args);
    let served = serve(cmd, &all_args);
    let text = get(served.addr, "/metrics", &[]);
    assert_eq!(text.status, 200, "{}", text.body);
    assert!(
        text.headers
            .contains("content-type: text/plain; version=0.0.4")
    );
    if let Some(promtool) = prometheus_tool("promtool") {
        promtool_check_metrics(&promtool, &text.body);
    }
    let om = get(
        served.addr,
        "/metrics",
        &[(
            "Accept",
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        )],
    );
    assert!(
        om.headers
            .contains("content-type: application/openmetrics-text; version=1.0.0")
    );
    assert!(om.body.ends_with("\n# EOF\n"), "{}", om.body);
    assert_eq!(om.body.matches("# EOF").count(), 1);
    text.body
}

#[test]
fn idle_h200() {
    let text = scrape_scenario("h200-idle.toml", &[], &[]);
    exposition_redactions().bind(|| insta::assert_snapshot!("serve_idle_h200", text));
}

#[test]
fn training_h200_with_unaccounted_memory() {
    let text = scrape_scenario("h200-training.toml", &[], &[]);
    exposition_redactions().bind(|| insta::assert_snapshot!("serve_training_h200", text));
}

#[test]
fn mig() {
    let text = scrape_scenario("mig.toml", &[], &[]);
    exposition_redactions().bind(|| insta::assert_snapshot!("serve_mig", text));
}

/// `--metrics-compat dcgm`: dcgm-exporter's names beside vramctl's, on a MIG GPU (whose
/// instances get their own `FB` rows) and a whole one; promtool checks the whole text (in
/// `scrape_scenario`), the snapshot pins the DCGM series.
#[test]
fn dcgm_compat_on_mig_and_a_whole_h200() {
    let text = scrape_scenario(
        "mig.toml",
        &[("NODE_NAME", "gpu-node-7")],
        &["--metrics-compat", "dcgm"],
    );
    let plain = scrape_scenario("mig.toml", &[("NODE_NAME", "gpu-node-7")], &[]);
    // Beside, not instead: every vramctl line but the timing ones is still there.
    let timing = ["vramctl_sample_duration", "vramctl_last_sample"];
    for line in plain.lines() {
        if !timing.iter().any(|t| line.starts_with(t)) {
            assert!(
                text.contains(line),
                "{line} is missing with --metrics-compat dcgm"
            );
        }
    }
    let dcgm: String = text
        .lines()
        .filter(|l| l.contains("DCGM_"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!dcgm.is_empty() && !plain.contains("DCGM_"));
    // A whole H200 with temperature, power, utilization and a minor number (`device`).
    let training = scrape_scenario(
        "h200-training.toml",
        &[("NODE_NAME", "gpu-node-8")],
        &["--metrics-compat", "dcgm"],
    );
    let training: String = training
        .lines()
        .filter(|l| l.contains("DCGM_"))
        .map(|l| format!("{l}\n"))
        .collect();
    insta::assert_snapshot!(
        "serve_dcgm_compat",
        format!("# mig.toml\n{dcgm}# h200-training.toml\n{training}")
    );
}

/// At t = 20 the GPU was lost before the exporter enumerated it: it is known by its index
/// only (`device_up 0`, errors counted); the end-to-end test covers a GPU lost midway.
#[test]
fn gpu_lost() {
    let text = scrape_scenario("fault-gpu-lost.toml", &[("FAKE_NVML_TIME", "20")], &[]);
    exposition_redactions().bind(|| insta::assert_snapshot!("serve_gpu_lost", text));
}

#[test]
fn not_supported() {
    let text = scrape_scenario("fault-not-supported.toml", &[], &[]);
    exposition_redactions().bind(|| insta::assert_snapshot!("serve_not_supported", text));
}

#[test]
fn absurd_values_are_dropped_and_counted() {
    let text = scrape_scenario("fault-absurd.toml", &[], &[]);
    assert!(text.contains("kind=\"insane_value\"} "), "{text}");
    assert!(
        !text.contains("18446744073709551615"),
        "u64::MAX never reaches Prometheus"
    );
    assert!(!text.contains("pid=\"0\""), "{text}");
}

#[test]
fn nvml_down_keeps_serving() {
    let text = scrape_scenario("fault-driver-not-loaded.toml", &[], &[]);
    exposition_redactions().bind(|| insta::assert_snapshot!("serve_driver_not_loaded", text));
}

#[test]
fn eight_gpus_by_thirty_processes_are_capped_per_gpu() {
    let text = scrape_scenario(
        "eight-gpus-30-procs.toml",
        &[],
        &["--max-process-series", "20"],
    );
    let series = text
        .lines()
        .filter(|l| l.starts_with("vramctl_process_memory_used_bytes{"))
        .count();
    assert_eq!(series, 8 * 20);
    for gpu in 0..8 {
        assert!(
            text.contains(&format!("vramctl_device_processes{{gpu=\"{gpu}\",")),
            "{text}"
        );
    }
    let dropped: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("vramctl_device_process_series_dropped{"))
        .collect();
    assert_eq!(dropped.len(), 8);
    assert!(dropped.iter().all(|l| l.ends_with(" 10")), "{dropped:?}");
}

#[test]
fn nvml_init_is_retried_until_it_works() {
    // fault-init-recovers fails its first 3 inits; with a 50 ms interval the backoff
    // (50, 100, 200 ms) reaches the 4th attempt in well under a second.
    let served = serve(
        vramctl_std(&scenario("fault-init-recovers.toml")),
        &["--interval", "0.05", "--process-details", "none"],
    );
    let first = get(served.addr, "/metrics", &[]);
    assert!(first.body.contains("vramctl_nvml_up 0\n"), "{}", first.body);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = get(served.addr, "/metrics", &[]);
        if now.body.contains("vramctl_nvml_up 1\n") {
            assert!(
                now.body
                    .contains("vramctl_nvml_init_failures_total{reason=\"driver_not_loaded\"} 3\n"),
                "{}",
                now.body
            );
            assert!(now.body.contains("vramctl_device_up{"), "{}", now.body);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "NVML never came up:\n{}",
            now.body
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn read_only_endpoints() {
    let served = serve_scenario("h200-idle.toml", &["--process-details", "none"]);
    assert_eq!(get(served.addr, "/healthz", &[]).status, 200);
    assert_eq!(get(served.addr, "/nope", &[]).status, 404);
    let mut stream = TcpStream::connect(served.addr).expect("connect");
    stream
        .write_all(
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .expect("send");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read");
    let response = parse_response(&raw);
    assert_eq!(response.status, 405);
    assert!(response.headers.contains("allow: get, head"));
}

#[test]
fn a_silent_client_does_not_block_others() {
    let served = serve_scenario("h200-idle.toml", &["--process-details", "none"]);
    // One connection that never sends, one that sends half a request and stops.
    let _silent = TcpStream::connect(served.addr).expect("connect");
    let mut half = TcpStream::connect(served.addr).expect("connect");
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .expect("send");
    let response = get(served.addr, "/metrics", &[]);
    assert_eq!(response.status, 200);
    assert!(response.body.contains("vramctl_device_up{"));
}

#[test]
fn bad_flags_and_configs_are_one_line_errors() {
    let out = vramctl_std(&scenario("h200-idle.toml"))
        .args(["serve", "--interval", "0"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(
            "vramctl: error: invalid value '0' for '--interval <DURATION>': '0' is shorter than 50ms"
        ),
        "{stderr}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("web.yml");
    std::fs::write(&config, "basic_auth_users:\n  alice: hunter2\n").expect("write");
    let out = vramctl_std(&scenario("h200-idle.toml"))
        .args(["serve", "--listen", "127.0.0.1:0", "--web.config.file"])
        .arg(&config)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not a bcrypt hash"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let out = vramctl_std(&scenario("h200-idle.toml"))
        .args(["serve", "--listen", &addr])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen on"));

    // --record: a file that is not a history, a bad retention, --retain alone.
    let not_ours = dir.path().join("notes.db");
    std::fs::write(&not_ours, "not a database\n".repeat(300)).expect("write");
    for (args, message) in [
        (
            vec!["--record", not_ours.to_str().expect("utf-8")],
            "is not a vramctl history database",
        ),
        (
            vec!["--record", "--retain", "raw=soon"],
            "invalid retention 'raw=soon'",
        ),
        (
            vec!["--retain", "raw=1h"],
            "--retain 'raw=1h' applies to recorded history; add --record",
        ),
        (
            vec!["--web.max-connections", "0"],
            "--web.max-connections '0' would refuse every connection",
        ),
        (
            vec!["--web.max-connections-per-peer", "0"],
            "--web.max-connections-per-peer '0' would refuse every connection",
        ),
    ] {
        let out = vramctl_std(&scenario("h200-idle.toml"))
            .env("XDG_STATE_HOME", dir.path())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(&args)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
}

// --- TLS and basic auth ----------------------------------------------------------------

struct TlsSetup {
    _dir: tempfile::TempDir,
    config: PathBuf,
    client: Arc<rustls::ClientConfig>,
}

/// A self-signed certificate for localhost/127.0.0.1, made now (no key is committed), and
/// a web config with TLS and one user `prometheus` / `s3cret` (bcrypt cost 6).
fn tls_setup(with_auth: bool) -> TlsSetup {
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("certificate");
    std::fs::write(dir.path().join("cert.pem"), cert.cert.pem()).expect("write");
    std::fs::write(dir.path().join("key.pem"), cert.key_pair.serialize_pem()).expect("write");
    let mut text = "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n".to_owned();
    if with_auth {
        let hash = bcrypt::hash("s3cret", 6).expect("hash");
        text.push_str(&format!("basic_auth_users:\n  prometheus: {hash}\n"));
    }
    let config = dir.path().join("web.yml");
    std::fs::write(&config, text).expect("write");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).expect("root");
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    TlsSetup {
        _dir: dir,
        config,
        client: Arc::new(client),
    }
}

fn get_tls(
    addr: SocketAddr,
    client: &Arc<rustls::ClientConfig>,
    path: &str,
    headers: &[(&str, &str)],
) -> Response {
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let conn = rustls::ClientConnection::new(Arc::clone(client), name).expect("tls client");
    let tcp = TcpStream::connect(addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(request_text(path, headers).as_bytes())
        .expect("send");
    let mut raw = Vec::new();
    // The server may close without close_notify after `Connection: close`; what was read
    // before that is the whole response.
    let _ = tls.read_to_end(&mut raw);
    parse_response(&raw)
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

fn serve_tls(setup: &TlsSetup) -> Served {
    serve(
        vramctl_std(&scenario("h200-idle.toml")),
        &[
            "--process-details",
            "none",
            "--web.config.file",
            setup.config.to_str().expect("utf-8 path"),
        ],
    )
}

#[test]
fn tls_serves_metrics_and_plain_http_gets_nothing() {
    let setup = tls_setup(false);
    let served = serve_tls(&setup);
    let response = get_tls(served.addr, &setup.client, "/metrics", &[]);
    assert_eq!(response.status, 200);
    assert!(response.body.contains("vramctl_nvml_up 1\n"));
    // A plain-text request to the TLS port is not answered with metrics.
    let mut stream = TcpStream::connect(served.addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
        .write_all(request_text("/metrics", &[]).as_bytes())
        .expect("send");
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    assert!(!String::from_utf8_lossy(&raw).contains("vramctl_nvml_up"));
}

#[test]
fn basic_auth_over_tls() {
    let setup = tls_setup(true);
    let served = serve_tls(&setup);
    let right = basic("prometheus", "s3cret");
    let ok = get_tls(
        served.addr,
        &setup.client,
        "/metrics",
        &[("Authorization", &right)],
    );
    assert_eq!(ok.status, 200);
    assert!(ok.body.contains("vramctl_device_up{"));
    // Cached now: the same credentials pass again.
    let again = get_tls(
        served.addr,
        &setup.client,
        "/metrics",
        &[("Authorization", &right)],
    );
    assert_eq!(again.status, 200);
    for (label, header) in [
        ("no credentials", None),
        ("wrong password", Some(basic("prometheus", "guess"))),
        ("unknown user", Some(basic("mallory", "s3cret"))),
        ("not basic", Some("Bearer s3cret".to_owned())),
    ] {
        let headers: Vec<(&str, &str)> = header
            .as_deref()
            .map(|h| vec![("Authorization", h)])
            .unwrap_or_default();
        let response = get_tls(served.addr, &setup.client, "/metrics", &headers);
        assert_eq!(response.status, 401, "{label}");
        assert!(
            response.headers.contains("www-authenticate: basic"),
            "{label}"
        );
        assert!(!response.body.contains("vramctl_"), "{label}");
    }
    // Health is behind the same gate, as with exporter-toolkit.
    assert_eq!(
        get_tls(served.addr, &setup.client, "/healthz", &[]).status,
        401
    );
}

#[test]
fn a_client_that_never_handshakes_does_not_block_tls_scrapes() {
    let setup = tls_setup(false);
    let served = serve_tls(&setup);
    let _silent = TcpStream::connect(served.addr).expect("connect");
    let mut garbage = TcpStream::connect(served.addr).expect("connect");
    garbage.write_all(&[0x16, 0x03, 0x01]).expect("send");
    let response = get_tls(served.addr, &setup.client, "/metrics", &[]);
    assert_eq!(response.status, 200);
}

// --- hostile clients (issue 29 item 7) --------------------------------------------------
//
// Correctness under attack, never timing: every real scrape must get its whole answer
// while hundreds of connections that never finish a request, or never read, are held open.
// The timed version (p50/p99 under the full attack) is scripts/bench-serve-attack.sh.

/// Raises the soft open-file limit to the hard one: the attacks hold hundreds of sockets.
fn raise_open_file_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    );
}

/// A slowloris: a request head begun and never finished.
fn slow_client(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    // An attacker does not care whether the server already closed it.
    let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Slow: ");
    stream
}

/// A client that sends `requests` pipelined requests (as many as its send buffer takes)
/// and never reads: the server's responses fill its small receive buffer and then the
/// server's send buffer.
fn never_reading_client(addr: SocketAddr, requests: usize) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    rustix::net::sockopt::set_socket_recv_buffer_size(&stream, 4096).expect("SO_RCVBUF");
    stream.set_nonblocking(true).expect("nonblocking");
    let batch = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(requests);
    let mut sent = 0;
    while sent < batch.len() {
        match (&stream).write(&batch[sent..]) {
            Ok(n) => sent += n,
            // Full, or already closed by the server: either way, done sending.
            Err(_) => break,
        }
    }
    stream
}

fn assert_full_scrape(response: &Response, what: &str) {
    assert_eq!(response.status, 200, "{what}");
    assert!(
        response.body.contains("vramctl_last_sample_age_seconds "),
        "{what}: the whole exposition, its last line included"
    );
}

#[test]
fn a_real_scrape_answers_while_slow_clients_hold_connections() {
    raise_open_file_limit();
    let served = serve_scenario("h200-idle.toml", &["--process-details", "none"]);
    // The issue's attack: 300 slowloris and 260 clients that never read, all from loopback
    // (one peer, so the per-peer limit of 256 is reached as well as filled).
    let mut attackers: Vec<TcpStream> = (0..300).map(|_| slow_client(served.addr)).collect();
    attackers.extend((0..260).map(|_| never_reading_client(served.addr, 100)));
    for i in 0..50 {
        // More keep coming between the scrapes.
        attackers.push(slow_client(served.addr));
        attackers.push(never_reading_client(served.addr, 100));
        let response = get(served.addr, "/metrics", &[]);
        assert_full_scrape(&response, &format!("scrape {i} under attack"));
    }
    drop(attackers);
}

#[test]
fn a_low_open_file_limit_does_not_stop_scrapes() {
    raise_open_file_limit();
    // serve under `ulimit -n 100` (soft and hard): it lowers --web.max-connections to
    // 100 - 64 = 36 and says so, so a flood meets the cap, not EMFILE.
    let vramctl = vramctl_std(&scenario("h200-idle.toml"));
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "ulimit -n 100 && exec \"$0\" \"$@\""])
        .arg(vramctl.get_program())
        .env_clear();
    for (name, value) in vramctl.get_envs() {
        if let Some(value) = value {
            cmd.env(name, value);
        }
    }
    let served = serve(cmd, &["--process-details", "none"]);
    let attackers: Vec<TcpStream> = (0..300).map(|_| slow_client(served.addr)).collect();
    for i in 0..20 {
        assert_full_scrape(
            &get(served.addr, "/metrics", &[]),
            &format!("scrape {i} with 300 slow clients and 100 descriptors"),
        );
    }
    drop(attackers);
}

#[test]
fn a_client_that_never_reads_is_dropped() {
    let served = serve_scenario(
        "h200-idle.toml",
        &["--process-details", "none", "--web.io-timeout", "1s"],
    );
    let client = never_reading_client(served.addr, 2000);
    // The server's write to it blocks; after the 1 s write timeout it closes the socket
    // (with requests of ours still unread there: a reset), and our writes start failing.
    // Without the timeout the connection would live its full 60 s and more.
    let deadline = Instant::now() + Duration::from_secs(30);
    let closed = loop {
        match (&client).write(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n") {
            Err(err) if err.kind() != std::io::ErrorKind::WouldBlock => break Some(err),
            _ if Instant::now() > deadline => break None,
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let err = closed.expect("the server still holds a connection that never reads, after 30 s");
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "{err}"
    );
    assert_full_scrape(&get(served.addr, "/metrics", &[]), "after the drop");
}

#[test]
fn a_flood_of_password_guesses_does_not_lock_out_a_scraper() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hash = bcrypt::hash("s3cret", 8).expect("hash");
    let config = dir.path().join("web.yml");
    std::fs::write(
        &config,
        format!("basic_auth_users:\n  prometheus: {hash}\n"),
    )
    .expect("write");
    let served = serve(
        vramctl_std(&scenario("h200-idle.toml")),
        &[
            "--process-details",
            "none",
            "--web.config.file",
            config.to_str().expect("utf-8 path"),
        ],
    );
    let right = basic("prometheus", "s3cret");
    assert_full_scrape(
        &get(served.addr, "/metrics", &[("Authorization", &right)]),
        "first scrape (pays bcrypt once)",
    );
    // 8 guessers, 40 distinct wrong passwords each (more than the cache of failures
    // holds): each costs a bcrypt, or a 503 while the bcrypt queue is full.
    let guessers: Vec<_> = (0..8)
        .map(|g| {
            let addr = served.addr;
            std::thread::spawn(move || {
                (0..40)
                    .map(|i| {
                        let guess = basic("prometheus", &format!("guess-{g}-{i}"));
                        get(addr, "/metrics", &[("Authorization", &guess)]).status
                    })
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    for i in 0..20 {
        let response = get(served.addr, "/metrics", &[("Authorization", &right)]);
        assert_full_scrape(&response, &format!("scrape {i} during the flood"));
        std::thread::sleep(Duration::from_millis(20));
    }
    for guesser in guessers {
        let statuses = guesser.join().expect("guesser");
        assert!(
            statuses.iter().all(|s| *s == 401 || *s == 503),
            "a wrong password got through: {statuses:?}"
        );
    }
}

// --- alert rules -----------------------------------------------------------------------

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path)
}

#[test]
fn alert_rules_pass_promtool() {
    let Some(promtool) = prometheus_tool("promtool") else {
        return;
    };
    let check = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(deploy("prometheus/vramctl-alerts.yml"))
        .output()
        .expect("promtool");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let test = Command::new(&promtool)
        .args(["test", "rules"])
        .arg(deploy("prometheus/vramctl-alerts.test.yml"))
        .output()
        .expect("promtool");
    assert!(
        test.status.success(),
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
}

/// Every `vramctl_…` name the deploy files use is a documented metric, and every
/// dashboard query is valid PromQL (checked by promtool as recording rules).
#[test]
fn dashboard_and_rules_use_documented_metrics() {
    let docs = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/metrics.md"),
    )
    .expect("docs");
    let dashboard_text =
        std::fs::read_to_string(deploy("grafana/vramctl-dashboard.json")).expect("dashboard");
    let rules_text =
        std::fs::read_to_string(deploy("prometheus/vramctl-alerts.yml")).expect("rules");
    for text in [&dashboard_text, &rules_text] {
        for (start, _) in text.match_indices("vramctl_") {
            let name: String = text[start..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                docs.contains(&format!("`{name}`")),
                "{name} is used in deploy/ but not documented in docs/metrics.md"
            );
        }
    }
    let Some(promtool) = prometheus_tool("promtool") else {
        return;
    };
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard_text).expect("json");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let mut count = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .expect("expr")
                .replace("$instance", ".*")
                .replace("$gpu", ".*")
                .replace("$topk", "10");
            rules.push_str(&format!(
                "      - record: dashboard:query{count}\n        expr: {}\n",
                serde_json::Value::String(expr)
            ));
            count += 1;
        }
    }
    assert!(count > 15, "{count} queries");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dashboard-rules.yml");
    std::fs::write(&path, rules).expect("write");
    let check = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .expect("promtool");
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
}

// --- end to end: a real Prometheus ------------------------------------------------------

/// The shipped rules with every range and `for:` shortened, so they fire within seconds
/// on a 200 ms scrape. Every duration is replaced (checked), so the expressions tested are
/// exactly the shipped ones.
fn fast_rules() -> String {
    let text = std::fs::read_to_string(deploy("prometheus/vramctl-alerts.yml")).expect("rules");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    // `[30m]` → `[3s]`
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        let close = after.find(']').expect("closed range");
        let inner = &after[1..close];
        let is_duration = inner.len() > 1
            && inner[..inner.len() - 1].chars().all(|c| c.is_ascii_digit())
            && inner.ends_with(['s', 'm', 'h', 'd']);
        out.push_str(if is_duration {
            "[3s]"
        } else {
            &after[..=close]
        });
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    let out: Vec<String> = out
        .lines()
        .map(|line| match line.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 1s", &line[..line.len() - line.trim_start().len()]),
            None => line.to_owned(),
        })
        .collect();
    let out = out.join("\n");
    assert!(!out.contains("for: 5m") && !out.contains("[30m]"), "{out}");
    out
}

pub(crate) struct Prometheus {
    pub(crate) child: Child,
    pub(crate) base: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

fn start_prometheus(binary: &Path, dir: &Path, target: SocketAddr) -> Prometheus {
    std::fs::write(dir.join("rules.yml"), fast_rules()).expect("rules");
    let config = format!(
        "global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\n  evaluation_interval: 200ms\n\
         rule_files: [rules.yml]\n\
         scrape_configs:\n  - job_name: vramctl\n    static_configs:\n      - targets: ['{target}']\n"
    );
    std::fs::write(dir.join("prometheus.yml"), config).expect("config");
    let port = free_port();
    let child = Command::new(binary)
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).expect("log file"))
        .spawn()
        .expect("start prometheus");
    let prometheus = Prometheus {
        child,
        base: format!("127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = TcpStream::connect(&prometheus.base)
            .ok()
            .map(|_| get(prometheus.base.parse().expect("addr"), "/-/ready", &[]).status);
        if ready == Some(200) {
            return prometheus;
        }
        assert!(Instant::now() < deadline, "prometheus did not get ready");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(crate) fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Result vector of an instant query.
fn query(prometheus: &Prometheus, promql: &str) -> Vec<serde_json::Value> {
    let path = format!("/api/v1/query?query={}", percent_encode(promql));
    let response = get(prometheus.base.parse().expect("addr"), &path, &[]);
    assert_eq!(response.status, 200, "{}", response.body);
    let json: serde_json::Value = serde_json::from_str(&response.body).expect("json");
    json["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits until `check` holds for the query's result (bounded).
fn eventually(
    prometheus: &Prometheus,
    promql: &str,
    what: &str,
    check: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let result = query(prometheus, promql);
        if check(&result) {
            return result;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: never held; last: {result:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn label<'a>(series: &'a serde_json::Value, name: &str) -> &'a str {
    series["metric"][name].as_str().unwrap_or("")
}

#[test]
fn end_to_end_with_a_real_prometheus() {
    let Some(prometheus_binary) = prometheus_tool("prometheus") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // Step clock: each sample (every 100 ms) moves the fake's time 1 s, so ten fake
    // seconds pass per real second. The leaker grows 100 MiB per fake second; the
    // short-lived process ends at fake 20 s (2 s in); GPU 1 is lost at fake 40 s.
    let scenario_text = r#"
driver_version = "580.159.04"
[clock]
mode = "step"
step_s = 1.0

[[gpu]]
name = "NVIDIA H200"
uuid = "GPU-e2e00000-0000-0000-0000-000000000000"
memory_total = 150754820096
memory_reserved = 644939776
utilization_gpu = 50

[[gpu.process]]
pid = 31001
name = "python leaky.py"
memory = { ramp = { from = "1 GiB", rate_per_s = "100 MiB", max = "120 GiB" } }

[[gpu.process]]
pid = 31002
name = "python steady.py"
memory = "4 GiB"

[[gpu.process]]
pid = 31003
name = "python short.py"
memory = "2 GiB"
end_s = 20.0

[[gpu]]
name = "NVIDIA H200"
uuid = "GPU-e2e11111-1111-1111-1111-111111111111"
memory_total = 150754820096
memory_reserved = 644939776
utilization_gpu = 50
lost_at_s = 40.0

[[gpu.process]]
pid = 31004
name = "python other.py"
memory = "8 GiB"
"#;
    let scenario_path = dir.path().join("e2e.toml");
    std::fs::write(&scenario_path, scenario_text).expect("scenario");
    let mut cmd = vramctl_std(&scenario_path);
    // The harness stops the fake's clock; this test needs the scenario's step clock.
    cmd.env_remove("FAKE_NVML_TIME");
    let served = serve(
        cmd,
        &[
            "--interval",
            "0.1",
            "--process-details",
            "nvml",
            "--peak-window",
            "1",
        ],
    );
    let prometheus = start_prometheus(&prometheus_binary, dir.path(), served.addr);

    eventually(
        &prometheus,
        "up{job=\"vramctl\"}",
        "the target is up",
        |r| r.len() == 1 && r[0]["value"][1] == "1",
    );
    // The leak alert fires for the leaker, and only for it.
    let firing = eventually(
        &prometheus,
        "ALERTS{alertname=\"VramctlProcessMemoryLeak\",alertstate=\"firing\"}",
        "the leak alert fires",
        |r| !r.is_empty(),
    );
    assert!(
        firing.iter().all(|a| label(a, "pid") == "31001"),
        "only the leaker: {firing:?}"
    );
    assert_eq!(label(&firing[0], "command"), "python leaky.py");
    // So does the rule on vramctl's own verdict (`vramctl_process_leak`, from the live
    // analysis in the daemon): for the leaker only.
    let detected = eventually(
        &prometheus,
        "ALERTS{alertname=\"VramctlProcessLeakDetected\",alertstate=\"firing\"}",
        "the leak-detected alert fires",
        |r| !r.is_empty(),
    );
    assert!(
        detected.iter().all(|a| label(a, "pid") == "31001"),
        "only the leaker: {detected:?}"
    );
    let verdicts = query(&prometheus, "vramctl_process_leak == 0");
    assert!(
        verdicts.iter().any(|s| label(s, "pid") == "31002"),
        "the steady process has a verdict, and it is not a leak: {verdicts:?}"
    );
    // GPU 1 is lost: device_up 0 and the alert fires; GPU 0 still reports.
    eventually(
        &prometheus,
        "ALERTS{alertname=\"VramctlGpuDown\",alertstate=\"firing\"}",
        "the GPU-down alert fires",
        |r| r.len() == 1 && label(&r[0], "uuid") == "GPU-e2e11111-1111-1111-1111-111111111111",
    );
    let up = query(&prometheus, "vramctl_device_up");
    assert_eq!(up.len(), 2, "{up:?}");
    // The lost GPU's and the ended process's series are gone (stale), the others remain.
    let processes = eventually(
        &prometheus,
        "vramctl_process_memory_used_bytes",
        "ended processes disappear",
        |r| {
            r.iter()
                .all(|s| !["31003", "31004"].contains(&label(s, "pid")))
        },
    );
    let mut pids: Vec<&str> = processes.iter().map(|s| label(s, "pid")).collect();
    pids.sort_unstable();
    assert_eq!(pids, ["31001", "31002"]);
    let memory = query(&prometheus, "vramctl_device_memory_used_bytes");
    assert_eq!(memory.len(), 1, "only GPU 0 reports memory: {memory:?}");
    let errors = query(
        &prometheus,
        "vramctl_collection_errors_total{kind=\"gpu_lost\"} > 0",
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    // Nothing that should stay quiet fired.
    let others = query(
        &prometheus,
        "ALERTS{alertstate=\"firing\",alertname!~\"VramctlProcessMemoryLeak|VramctlProcessLeakDetected|VramctlGpuDown\"}",
    );
    assert!(others.is_empty(), "{others:?}");
}

/// Leak and idle verdicts from the live analysis, on a controlled clock: the fake's `step`
/// clock moves 1 s per sample and `--simulated-clock` times the samples 1 s apart without
/// waiting, so after `--ticks 180` the analysis has seen three minutes. The leaker (flat
/// after warm-up, then 64 MiB/s: a leak after a plateau) is flagged with its slope; the flat, busy process is not; the notebook kernel holding
/// 12 GiB at 0 % SM is an idle holder (`--idle-for 60s`).
#[test]
fn leak_and_idle_verdicts_from_the_live_analysis() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario_text = r#"
driver_version = "580.159.04"
[clock]
mode = "step"
step_s = 1.0

[[gpu]]
name = "NVIDIA H200"
uuid = "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2"
memory_total = 150754820096
memory_reserved = 644939776
utilization_gpu = 50

[[gpu.process]]
pid = 32001
name = "python leaky.py"
memory = { points = [LEAK] }
sm_util = 40

[[gpu.process]]
pid = 32002
name = "python steady.py"
memory = "4 GiB"
sm_util = 60

[[gpu.process]]
pid = 32003
name = "python -m ipykernel_launcher"
memory = "12 GiB"
sm_util = 0
"#;
    // The leaker settles at 4 GiB after its warm-up, then from 60 s grows 64 MiB a second.
    let leak: Vec<String> = (0..=180)
        .map(|t: u32| {
            let mib = 4096 + 64 * t.saturating_sub(60);
            format!("[{t}.0, \"{mib} MiB\"]")
        })
        .collect();
    let scenario_text = scenario_text.replace("LEAK", &leak.join(", "));
    let scenario_path = dir.path().join("leak.toml");
    std::fs::write(&scenario_path, scenario_text).expect("scenario");
    let mut cmd = vramctl_std(&scenario_path);
    // The scenario's step clock, not the harness's stopped one.
    cmd.env_remove("FAKE_NVML_TIME");
    let served = serve(
        cmd,
        &[
            "--interval",
            "1",
            "--peak-window",
            "1",
            "--process-details",
            "nvml",
            "--idle-for",
            "60s",
            "--simulated-clock",
            "1795984291000",
            "--ticks",
            "180",
        ],
    );
    // "first collection" comes after the last of the 180 samples: one scrape sees them all.
    let text = get(served.addr, "/metrics", &[]).body;
    if let Some(promtool) = prometheus_tool("promtool") {
        promtool_check_metrics(&promtool, &text);
    }
    assert_eq!(sample_value(&text, "vramctl_samples_total"), Some(180.0));
    let series = |name: &str, pid: u32| {
        let prefix = format!(
            "{name}{{gpu=\"0\",uuid=\"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\",pid=\"{pid}\""
        );
        text.lines()
            .find(|l| l.starts_with(&prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(series("vramctl_process_leak", 32001), Some(1.0), "{text}");
    assert_eq!(series("vramctl_process_leak", 32002), Some(0.0), "{text}");
    assert_eq!(series("vramctl_process_leak", 32003), Some(0.0), "{text}");
    let slope = series("vramctl_process_leak_slope_bytes_per_second", 32001).expect("a slope");
    assert!(
        (slope / f64::from(64 << 20) - 1.0).abs() < 0.05,
        "64 MiB/s measured as {slope}"
    );
    assert_eq!(
        series("vramctl_process_idle_holder", 32003),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series("vramctl_process_idle_holder", 32002),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        series("vramctl_process_idle_seconds", 32002),
        Some(0.0),
        "busy"
    );
    let verdicts: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("vramctl_process_") && !l.starts_with("vramctl_process_memory_used_bytes")
        })
        .collect();
    insta::assert_snapshot!("serve_leak_and_idle_verdicts", verdicts.join("\n"));
}

/// The value of the first sample in `text` whose line starts with `prefix`.
fn sample_value(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A child process killed on drop.
struct Sleeper(Child);

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_records_history_flushes_on_sigterm_and_holds_the_writer_lock() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("state/history.db");
    let db_arg = db.to_str().expect("utf-8 path");
    // A real process (the recorder reads its identity from /proc) and a fictional one
    // (named by the driver).
    let sleeper = Sleeper(
        Command::new("sleep")
            .arg("300")
            .spawn()
            .expect("spawn sleep"),
    );
    let real = sleeper.0.id();
    let fictional = crate::harness::free_pids(1)[0];
    let scenario_path = dir.path().join("scenario.toml");
    std::fs::write(
        &scenario_path,
        format!(
            "[[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\n\
             memory_total = 150754820096\nmemory_reserved = 644939776\n\
             utilization_gpu = 40\ntemperature_c = 50\npower_mw = 300000\n\n\
             [[gpu.process]]\npid = {fictional}\nname = \"python holder.py\"\nmemory = \"3 GiB\"\n\n\
             [[gpu.process]]\npid = {real}\nreal = true\nmemory = \"2 GiB\"\n"
        ),
    )
    .expect("write scenario");
    let mut served = serve(
        vramctl_std(&scenario_path),
        &["--interval", "0.05", "--record", db_arg],
    );

    // Scrapes go on as usual while it records.
    let deadline = Instant::now() + Duration::from_secs(30);
    let sampled = loop {
        let text = get(served.addr, "/metrics", &[]).body;
        let samples = sample_value(&text, "vramctl_samples_total").unwrap_or(0.0);
        if samples >= 10.0 {
            assert!(
                text.contains(&format!("pid=\"{real}\"")),
                "the real process is exported: {text}"
            );
            break samples;
        }
        assert!(Instant::now() < deadline, "too few samples:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    };

    // The daemon is the one writer: a recorder on the same database is refused, naming it.
    let second = vramctl_std(&scenario_path)
        .args(["--db", db_arg, "record", "--ticks", "1"])
        .output()
        .expect("run vramctl record");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("already recording"), "{stderr}");
    assert!(
        stderr.contains(&format!("PID {}", served.child.id())),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    // SIGTERM: it flushes the history and exits 0.
    let status = Command::new("kill")
        .args(["-TERM", &served.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = served.child.wait().expect("wait for serve");
    assert!(exit.success(), "{exit}");

    let output = vramctl_std(&scenario_path)
        .args([
            "--db", db_arg, "history", "--since", "all", "--format", "json",
        ])
        .output()
        .expect("run vramctl history");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let samples = json["devices"][0]["samples"].as_array().expect("samples");
    #[allow(clippy::cast_precision_loss)]
    let recorded = samples.len() as f64;
    assert!(
        recorded >= sampled,
        "every sample up to the last scrape is in the history: {recorded} < {sampled}"
    );
    assert!(
        samples
            .iter()
            .all(|s| s["used_bytes"] == 5u64 << 30 && s["power_mw"] == 300_000),
        "{samples:?}"
    );
    let processes = json["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 2, "{processes:?}");
    let by_pid = |pid: u32| {
        processes
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} in {processes:?}"))
    };
    let sleeping = by_pid(real);
    assert_eq!(sleeping["command"], "sleep 300");
    assert!(sleeping["start_time_ticks"].is_u64(), "{sleeping}");
    assert!(sleeping["user"].is_string(), "{sleeping}");
    let holder = by_pid(fictional);
    assert_eq!(holder["command"], "python holder.py");
    assert!(holder["start_time_ticks"].is_null(), "{holder}");
    for (p, bytes) in [(sleeping, 2u64 << 30), (holder, 3 << 30)] {
        let s = p["samples"].as_array().expect("samples");
        assert_eq!(s.len(), samples.len());
        assert!(s.iter().all(|s| s["used_bytes"] == bytes), "{p}");
    }
    let gaps = json["gaps"].as_array().expect("gaps");
    assert!(gaps.is_empty(), "nothing was dropped or missing: {gaps:?}");

    // The lock went with the daemon.
    let after = vramctl_std(&scenario_path)
        .args(["--db", db_arg, "record", "--ticks", "1"])
        .output()
        .expect("run vramctl record");
    assert!(
        after.status.success(),
        "{}",
        String::from_utf8_lossy(&after.stderr)
    );
    drop(sleeper);
}

/// Polls `/metrics` until `done` holds (the daemon samples on its own), for at most 30 s.
fn metrics_until(served: &Served, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = get(served.addr, "/metrics", &[]).body;
        if done(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "never {what}:\n{body}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A hung `nvmlInit` kept `serve` from answering anything: HTTP started only after the
/// first collection. Now `/metrics` and `/healthz` answer while NVML hangs, and GPU data
/// follows once it answers.
#[test]
fn metrics_and_healthz_answer_while_nvml_init_hangs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hold = dir.path().join("hold");
    std::fs::write(&hold, "").expect("hold file");
    let scenario_path = dir.path().join("hang.toml");
    std::fs::write(
        &scenario_path,
        format!(
            "driver_version = \"580.159.04\"\n[init]\nhold_path = {:?}\n\
             [[gpu]]\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\nmemory_total = \"8 GiB\"\n",
            hold.display().to_string()
        ),
    )
    .expect("scenario");
    let served = serve_listening(
        vramctl_std(&scenario_path),
        &["--interval", "0.05", "--process-details", "none"],
    );
    let metrics = get(served.addr, "/metrics", &[]);
    assert_eq!(metrics.status, 200, "{}", metrics.body);
    assert!(
        metrics.body.contains("vramctl_nvml_up 0\n"),
        "{}",
        metrics.body
    );
    assert!(
        metrics.body.contains("vramctl_samples_total 0\n"),
        "{}",
        metrics.body
    );
    assert!(
        metrics.body.contains("vramctl_last_sample_age_seconds "),
        "{}",
        metrics.body
    );
    let health = get(served.addr, "/healthz", &[]);
    assert_eq!(health.status, 503, "{}", health.body);
    assert!(health.body.starts_with("starting: "), "{}", health.body);
    // Still held: still answering, still starting.
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        get(served.addr, "/healthz", &[])
            .body
            .starts_with("starting: ")
    );
    std::fs::remove_file(&hold).expect("release the init");
    metrics_until(&served, "NVML up with the GPU", |m| {
        m.contains("vramctl_nvml_up 1\n") && m.contains("vramctl_device_up{")
    });
    assert_eq!(get(served.addr, "/healthz", &[]).status, 200);
}

/// A driver reloaded under the daemon (`[driver_reload]`: every call fails until a new
/// init, the first two inits after it fail) used to leave it serving errors for good.
/// Now the session is shut down and reopened, the GPUs are read again, and the reopen is
/// counted by reason.
#[test]
fn nvml_is_reopened_when_the_driver_goes_away_and_comes_back() {
    for (error, reason) in [
        ("uninitialized", "session_lost"),
        ("gpu_is_lost", "devices_failing"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let scenario_path = dir.path().join("reload.toml");
        std::fs::write(
            &scenario_path,
            format!(
                "driver_version = \"580.159.04\"\n\
                 [driver_reload]\nat_s = 0.5\nerror = \"{error}\"\ninit_failures = 2\n\
                 [[gpu]]\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\nmemory_total = \"8 GiB\"\n\
                 [[gpu.process]]\npid = 31011\nname = \"python train.py\"\nmemory = \"2 GiB\"\n"
            ),
        )
        .expect("scenario");
        let mut cmd = vramctl_std(&scenario_path);
        // The fake's wall clock: the driver goes away half a second after init.
        cmd.env_remove("FAKE_NVML_TIME");
        let served = serve(cmd, &["--interval", "0.05", "--process-details", "nvml"]);
        let reopened = format!("vramctl_nvml_reopens_total{{reason=\"{reason}\"}} 1\n");
        let body = metrics_until(&served, "reopened and serving again", |m| {
            m.contains(&reopened)
                && m.contains("vramctl_nvml_up 1\n")
                && m.contains("vramctl_device_up{gpu=\"0\",uuid=\"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"} 1\n")
                && m.contains("vramctl_process_memory_used_bytes{")
        });
        assert!(
            body.contains("vramctl_nvml_init_failures_total{reason=\"driver_not_loaded\"} 2\n"),
            "{error}: {body}"
        );
        // The driver does not go away twice: the count stays at one.
        std::thread::sleep(Duration::from_millis(300));
        let later = get(served.addr, "/metrics", &[]).body;
        assert!(later.contains(&reopened), "{error}: {later}");
        assert_eq!(get(served.addr, "/healthz", &[]).status, 200);
    }
}

/// serve's `idle_seconds` froze for the length of a wall-clock step back (every snapshot
/// looked older than the last) and grew by the step's length after a step forward.
#[test]
fn idle_seconds_go_on_across_a_wall_clock_step() {
    for step_s in [-3600_i64, 3600] {
        let dir = tempfile::tempdir().expect("tempdir");
        let scenario_path = dir.path().join("idle.toml");
        std::fs::write(
            &scenario_path,
            format!(
                "driver_version = \"580.159.04\"\n[clock]\nmode = \"step\"\nstep_s = 1.0\n\
                 wall_steps = [[61.0, {step_s}.0]]\n\
                 [[gpu]]\nuuid = \"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\"\nmemory_total = \"140 GiB\"\n\
                 utilization_gpu = 50\n\
                 [[gpu.process]]\npid = 31021\nname = \"python -m ipykernel_launcher\"\nmemory = \"12 GiB\"\nsm_util = 0\n\
                 [[gpu.process]]\npid = 31022\nname = \"python train.py\"\nmemory = \"4 GiB\"\nsm_util = 60\n"
            ),
        )
        .expect("scenario");
        let mut cmd = vramctl_std(&scenario_path);
        cmd.env_remove("FAKE_NVML_TIME");
        let step = format!("60000:{}", step_s * 1000);
        let served = serve(
            cmd,
            &[
                "--interval",
                "1",
                "--peak-window",
                "1",
                "--process-details",
                "nvml",
                "--idle-for",
                "60s",
                "--simulated-clock",
                "1795984291000",
                "--simulated-clock-step",
                &step,
                "--ticks",
                "180",
            ],
        );
        let text = get(served.addr, "/metrics", &[]).body;
        assert_eq!(sample_value(&text, "vramctl_samples_total"), Some(180.0));
        let idle = sample_value(
            &text,
            "vramctl_process_idle_seconds{gpu=\"0\",uuid=\"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\",pid=\"31021\"",
        )
        .expect("idle seconds");
        // 180 samples 1 s apart; the analysis re-runs every 10-20 s of sample time.
        assert!(
            (155.0..=180.0).contains(&idle),
            "step {step_s}: idle {idle} s"
        );
        assert_eq!(
            sample_value(
                &text,
                "vramctl_process_idle_holder{gpu=\"0\",uuid=\"GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2\",pid=\"31021\""
            ),
            Some(1.0),
            "step {step_s}"
        );
    }
}

/// A `sleep` started as a process of Slurm job `job` would be by slurmstepd's environment
/// (`SLURM_JOB_ID` and friends; the cgroup path is tested for real in `slurm::`).
fn job_process(job: u32, user: &str, partition: &str) -> crate::real_processes::Spawned {
    let mut command = Command::new("sleep");
    command
        .arg("600")
        .env("SLURM_JOB_ID", job.to_string())
        .env("SLURM_STEP_ID", "0")
        .env("SLURM_JOB_USER", user)
        .env("SLURM_JOB_PARTITION", partition);
    crate::real_processes::spawn(&mut command)
}

/// Owners as info series: one `vramctl_process_info` per process that has series, one
/// `vramctl_job_info` per job and its memory and peak per GPU; no owner label on the byte
/// series; a hostile partition escaped; promtool accepts it. Real processes, announced to the
/// fake NVML through `FAKE_NVML_PROCESS_DIR` (the fake stands in for the driver only).
#[test]
fn owner_series_are_info_series_joined_by_pid_and_job() {
    use crate::real_processes::Scenario;
    const MIB: u64 = 1 << 20;
    let hostile = "gpu\"\\\n\u{1b}[2K";
    let a = [
        job_process(4242, "alice", "gpu"),
        job_process(4242, "alice", "gpu"),
    ];
    let b = job_process(4343, "bob", hostile);
    let plain = crate::real_processes::sleeper();
    let procs = tempfile::tempdir().expect("tempdir");
    let announce = |pid: u32, lines: &str| {
        std::fs::write(procs.path().join(pid.to_string()), lines).expect("announce");
    };
    announce(a[0].pid(), &format!("0 {}\n1 {}\n", 100 * MIB, 10 * MIB));
    announce(a[1].pid(), &format!("0 {}\n", 200 * MIB));
    announce(b.pid(), &format!("1 {}\n", 50 * MIB));
    announce(plain.pid(), &format!("1 {}\n", 5 * MIB));
    let scenario = Scenario::new(2, &[]);
    let scrape = |details: &str| {
        let mut cmd = vramctl_std(&scenario.path);
        cmd.env("FAKE_NVML_PROCESS_DIR", procs.path());
        let served = serve(
            cmd,
            &[
                "--interval",
                "3600",
                "--peak-window",
                "3600",
                "--process-details",
                details,
            ],
        );
        let response = get(served.addr, "/metrics", &[]);
        assert_eq!(response.status, 200, "{}", response.body);
        response.body
    };
    let text = scrape("proc");
    if let Some(promtool) = prometheus_tool("promtool") {
        promtool_check_metrics(&promtool, &text);
    }
    let lines = |prefix: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_owned)
            .collect()
    };
    let info = lines("vramctl_process_info{");
    assert_eq!(info.len(), 4, "one per process, not per GPU: {info:#?}");
    let of = |pid: u32| {
        info.iter()
            .find(|l| l.contains(&format!("pid=\"{pid}\",")))
            .unwrap_or_else(|| panic!("{pid}: {info:#?}"))
            .clone()
    };
    for p in &a {
        assert!(
            of(p.pid()).contains("slurm_job=\"4242\",slurm_step=\"0\"} 1"),
            "{}",
            of(p.pid())
        );
    }
    assert!(
        !of(plain.pid()).contains("slurm_job"),
        "{}",
        of(plain.pid())
    );
    assert_eq!(
        lines("vramctl_job_info{"),
        [
            "vramctl_job_info{slurm_job=\"4242\",user=\"alice\",partition=\"gpu\"} 1".to_owned(),
            // `\` as it was, the line feed and ESC as human output shows them, then the
            // exposition's escapes.
            r#"vramctl_job_info{slurm_job="4343",user="bob",partition="gpu\"\\\\n\\u{1b}[2K"} 1"#
                .to_owned(),
        ]
    );
    // Two series per job at most: its info and its peak, the highest on any one GPU (4242
    // holds 300 MiB on GPU 0 and 10 MiB on GPU 1); no per-GPU job series.
    assert!(lines("vramctl_job_memory_used_bytes{").is_empty(), "{text}");
    let peaks = lines("vramctl_job_memory_used_max_bytes{");
    assert_eq!(
        peaks,
        [
            format!(
                "vramctl_job_memory_used_max_bytes{{slurm_job=\"4242\"}} {}",
                300 * MIB
            ),
            format!(
                "vramctl_job_memory_used_max_bytes{{slurm_job=\"4343\"}} {}",
                50 * MIB
            ),
        ],
        "{text}"
    );
    // The byte series carry no job: owners are joined, not multiplied.
    assert!(
        lines("vramctl_process_memory_used_bytes{")
            .iter()
            .all(|l| !l.contains("slurm_job")),
        "{text}"
    );
    // What the owner series cost (`nvml` has none, and the same series otherwise): one per
    // process (4) and two per job (2 × 2), whatever GPUs the job holds memory on (issue
    // 31's bound: at most 1 per process and 2 per job).
    let count = |text: &str| text.lines().filter(|l| !l.starts_with('#')).count();
    let without = scrape("nvml");
    assert_eq!(
        count(&text) - count(&without),
        4 + 2 * 2,
        "{text}\n---\n{without}"
    );
}
