//! The fleet view (`serve --prometheus URL`) with real parts: three `vramctl serve` on the
//! fake NVML (testdata/fleet/host-{a,b,c}.toml: different GPUs, a leak, an idle holder),
//! a real Prometheus (Debian's) scraping them every 200 ms, a fourth `serve` reading that
//! Prometheus for its fleet page; its JSON API is checked against the scenarios' numbers,
//! and the page itself is rendered by a real headless Chromium (Debian's), whose DOM must
//! list the three hosts with the same numbers. A screenshot is saved beside the test's
//! scratch files (the path is printed).
//!
//! Also with a real Prometheus: the panels of dcgm-exporter's dashboard that docs/metrics.md
//! says `serve --metrics-compat dcgm` fills, and those it says cannot.
//!
//! Everything runs on free loopback ports with a temporary directory for Prometheus'
//! storage; every wait has a deadline; every process is killed when its guard drops, the
//! test failing or not. Without prometheus the test fails unless
//! `VRAMCTL_SKIP_PROMETHEUS=1`; without chromium only the browser part is skipped under
//! `VRAMCTL_SKIP_CHROMIUM=1` (scripts/test.sh installs both).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{scenario, vramctl, vramctl_std};
use crate::serve::{Prometheus, Served, free_port, get, prometheus_tool, serve};

const GIB: u64 = 1 << 30;
const H200_TOTAL: u64 = 150_754_820_096;
const A100_TOTAL: u64 = 85_899_345_920;

fn fleet_scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/fleet")
        .join(name)
}

/// One of the three hosts: its scenario's step clock runs (10 fake seconds per real one at
/// `--interval 0.1`), so the leak grows and the idle holder's idleness accrues.
fn start_host(name: &str) -> Served {
    let mut cmd = vramctl_std(&fleet_scenario(name));
    cmd.env_remove("FAKE_NVML_TIME");
    serve(
        cmd,
        &[
            "--interval",
            "0.1",
            "--process-details",
            "nvml",
            "--idle-for",
            "3s",
        ],
    )
}

fn start_prometheus(binary: &Path, dir: &Path, targets: &[SocketAddr]) -> Prometheus {
    start_prometheus_with(binary, dir, targets, None)
}

/// With `web_config`, Prometheus serves https (exporter-toolkit's file, as `serve` reads):
/// then readiness is only its port accepting.
fn start_prometheus_with(
    binary: &Path,
    dir: &Path,
    targets: &[SocketAddr],
    web_config: Option<&Path>,
) -> Prometheus {
    let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    let config = format!(
        "global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\n\
         scrape_configs:\n  - job_name: vramctl\n    static_configs:\n      - targets: [{}]\n",
        targets.join(", ")
    );
    start_prometheus_config(binary, dir, &config, web_config)
}

/// Prometheus with the configuration `config`.
fn start_prometheus_config(
    binary: &Path,
    dir: &Path,
    config: &str,
    web_config: Option<&Path>,
) -> Prometheus {
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
        .args(web_config.map(|c| format!("--web.config.file={}", c.display())))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).expect("log file"))
        .spawn()
        .expect("start prometheus");
    let prometheus = Prometheus {
        child,
        base: format!("127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&prometheus.base).is_err()
        || (web_config.is_none()
            && get(prometheus.base.parse().expect("addr"), "/-/ready", &[]).status != 200)
    {
        assert!(Instant::now() < deadline, "prometheus did not get ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    prometheus
}

fn json(addr: SocketAddr, path: &str) -> (u16, Value) {
    let response = get(addr, path, &[]);
    let value = serde_json::from_str(&response.body)
        .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {}", response.body));
    (response.status, value)
}

fn host<'a>(fleet: &'a Value, instance: &str) -> Option<&'a Value> {
    fleet["hosts"]
        .as_array()?
        .iter()
        .find(|h| h["instance"] == instance)
}

fn verdict<'a>(fleet: &'a Value, kind: &str, instance: &str, pid: &str) -> Option<&'a Value> {
    fleet["verdicts"]
        .as_array()?
        .iter()
        .find(|v| v["kind"] == kind && v["instance"] == instance && v["pid"] == pid)
}

fn used(value: &Value) -> u64 {
    value["used_bytes"].as_u64().unwrap_or(0)
}

#[test]
fn the_fleet_view_lists_three_hosts_from_a_real_prometheus() {
    let Some(prometheus_binary) = prometheus_tool("prometheus") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let a = start_host("host-a.toml");
    let b = start_host("host-b.toml");
    let c = start_host("host-c.toml");
    let (ia, ib, ic) = (a.addr.to_string(), b.addr.to_string(), c.addr.to_string());
    let prometheus = start_prometheus(&prometheus_binary, dir.path(), &[a.addr, b.addr, c.addr]);
    let viewer = serve(
        vramctl_std(&scenario("h200-idle.toml")),
        &[
            "--interval",
            "3600",
            "--peak-window",
            "3600",
            "--prometheus",
            &format!("http://{}", prometheus.base),
        ],
    );

    // Bounded wait: every host scraped with its GPUs, the leak and the idle holder judged.
    let deadline = Instant::now() + Duration::from_secs(90);
    let fleet = loop {
        let (status, fleet) = json(viewer.addr, "/api/fleet");
        let ready = status == 200
            && [(&ia, 2), (&ib, 1), (&ic, 1)].iter().all(|(i, gpus)| {
                host(&fleet, i).is_some_and(|h| {
                    h["up"] == true
                        && h["gpus"].as_array().is_some_and(|g| g.len() == *gpus)
                        && h["gpus"].as_array().is_some_and(|g| {
                            g.iter()
                                .all(|g| g["used_bytes"].is_u64() && g["name"].is_string())
                        })
                })
            })
            && verdict(&fleet, "leak", &ia, "11001").is_some()
            && verdict(&fleet, "idle_holder", &ib, "12001").is_some();
        if ready {
            break fleet;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet never showed all three hosts and both verdicts; last answer ({status}): {fleet:#}\n\
             prometheus log: {}",
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(300));
    };

    // The numbers are the scenarios'.
    assert_eq!(
        fleet["hosts"].as_array().map(Vec::len),
        Some(3),
        "{fleet:#}"
    );
    assert_eq!(fleet["prometheus"], format!("http://{}", prometheus.base));
    let host_a = host(&fleet, &ia).expect("A");
    let host_b = host(&fleet, &ib).expect("B");
    let host_c = host(&fleet, &ic).expect("C");
    assert_eq!(host_a["total_bytes"].as_u64(), Some(2 * H200_TOTAL));
    assert_eq!(
        host_a["gpus"][1]["used_bytes"].as_u64(),
        Some(60 * GIB),
        "serve_model.py"
    );
    assert!(
        used(&host_a["gpus"][0]) > 5 * GIB,
        "leaky.py (from 1 GiB) + steady.py (4 GiB)"
    );
    assert_eq!(host_a["address"], ia.as_str(), "a link to its own page");
    assert_eq!(used(host_b), 30 * GIB);
    assert_eq!(host_b["gpus"][0]["name"], "NVIDIA H200");
    assert_eq!(used(host_c), 62 * GIB, "train.py 50 GiB + eval.py 12 GiB");
    assert_eq!(host_c["total_bytes"].as_u64(), Some(A100_TOTAL));
    assert_eq!(host_c["gpus"][0]["name"], "NVIDIA A100-SXM4-80GB");
    // The biggest holders across hosts: all six processes, biggest first.
    let holders = fleet["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 6, "{holders:#?}");
    assert!(holders.windows(2).all(|w| used(&w[0]) >= used(&w[1])));
    let train = holders
        .iter()
        .find(|h| h["pid"] == "13001")
        .expect("train.py");
    assert_eq!(
        (train["instance"].as_str(), used(train)),
        (Some(ic.as_str()), 50 * GIB)
    );
    assert_eq!(train["command"], "python train.py --big");
    let leak = verdict(&fleet, "leak", &ia, "11001").expect("leak");
    assert!(
        leak["leak_slope_bytes_per_second"]
            .as_f64()
            .is_some_and(|s| s > 0.0)
    );
    assert_eq!(fleet["verdicts"][0]["kind"], "leak", "leaks first");
    let idle = verdict(&fleet, "idle_holder", &ib, "12001").expect("idle");
    assert_eq!(used(idle), 30 * GIB);
    assert!(idle["idle_seconds"].as_f64().is_some_and(|s| s >= 3.0));

    // One host's drill-down: its GPUs' curves from a range query, its processes.
    let (status, detail) = json(
        viewer.addr,
        &format!("/api/fleet/host?job=vramctl&instance={ia}&window=120"),
    );
    assert_eq!(status, 200, "{detail:#}");
    let curves = detail["curves"].as_array().expect("curves");
    assert_eq!(curves.len(), 2);
    let leaky: Vec<u64> = curves[0]["used_bytes"]
        .as_array()
        .expect("points")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert!(leaky.len() >= 2, "{leaky:?}");
    assert!(
        leaky.windows(2).all(|w| w[0] <= w[1]),
        "GPU 0 only grows: {leaky:?}"
    );
    let mut pids: Vec<&str> = detail["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(|p| p["pid"].as_str())
        .collect();
    pids.sort_unstable();
    assert_eq!(pids, ["11001", "11002", "11003"]);
    // A hostile instance is a literal, not PromQL: it matches nothing.
    let (status, nothing) = json(
        viewer.addr,
        "/api/fleet/host?job=vramctl&instance=%22%7Cinstance%3D~%22.*",
    );
    assert_eq!(status, 200, "{nothing:#}");
    assert!(nothing["host"].is_null() && nothing["processes"] == serde_json::json!([]));

    // The page, in a real headless Chromium.
    render_in_chromium(viewer.addr, &[&ia, &ib, &ic]);

    // Prometheus gone: the fleet answers 502 with the reason, the server stays up.
    drop(prometheus);
    std::thread::sleep(FLEET_CACHE_S);
    let (status, error) = json(viewer.addr, "/api/fleet");
    assert_eq!(status, 502, "{error:#}");
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot connect")),
        "{error:#}"
    );
    assert_eq!(get(viewer.addr, "/healthz", &[]).status, 200);
}

/// Longer than the fleet answer's cache (`vramctl_web::fleet_mode::FLEET_CACHE`, 2 s).
const FLEET_CACHE_S: Duration = Duration::from_millis(2500);

/// A child killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs chromium headless with `args` on `url`, bounded; its stdout.
fn chromium(binary: &Path, profile: &Path, args: &[String], url: &str) -> String {
    let out = profile.join("stdout");
    let child = Command::new(binary)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--window-size=1280,800",
            "--virtual-time-budget=15000",
        ])
        .arg(format!(
            "--user-data-dir={}",
            profile.join("profile").display()
        ))
        .args(args)
        .arg(url)
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    let mut child = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.0.try_wait().expect("wait") {
            assert!(status.success(), "chromium failed: {status}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "chromium did not finish within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::read_to_string(out).expect("chromium's output")
}

fn render_in_chromium(viewer: SocketAddr, instances: &[&str]) {
    if std::env::var_os("VRAMCTL_SKIP_CHROMIUM").is_some_and(|v| v == "1") {
        eprintln!("skipped the browser part: VRAMCTL_SKIP_CHROMIUM=1");
        return;
    }
    let binary = ["chromium", "chromium-browser"]
        .iter()
        .flat_map(|name| {
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(move |dir| dir.join(name))
                .collect::<Vec<_>>()
        })
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("chromium is not installed: apt-get install chromium, or set VRAMCTL_SKIP_CHROMIUM=1")
        });
    let profile = tempfile::tempdir().expect("profile dir");
    let url = format!("http://{viewer}/#fleet");
    let dom = chromium(&binary, profile.path(), &["--dump-dom".into()], &url);
    let hosts_table = dom
        .split("id=\"fleet-hosts\"")
        .nth(1)
        .and_then(|rest| rest.split("</table>").next())
        .unwrap_or_else(|| panic!("the page has no fleet hosts table:\n{dom}"));
    for instance in instances {
        assert!(
            hosts_table.contains(instance),
            "{instance} is not on the page:\n{hosts_table}"
        );
    }
    for figure in [
        "30.0 GiB / 140 GiB",
        "62.0 GiB / 80.0 GiB",
        "60.0 GiB / 140 GiB",
        "NVIDIA A100-SXM4-80GB",
    ] {
        assert!(
            hosts_table.contains(figure),
            "{figure} is not on the page:\n{hosts_table}"
        );
    }
    assert!(dom.contains("id=\"fleet-verdicts\""), "{dom}");
    assert!(
        dom.contains("python leaky.py") && dom.contains("verdict-leak"),
        "{dom}"
    );
    // A host's drill-down, linked: its processes, and its chart drawn by uPlot.
    let first = instances[0];
    let drill_url = format!("http://{viewer}/?job=vramctl&instance={first}#fleet");
    let dom = chromium(&binary, profile.path(), &["--dump-dom".into()], &drill_url);
    let processes = dom
        .split("id=\"fleet-host-processes\"")
        .nth(1)
        .and_then(|rest| rest.split("</table>").next())
        .unwrap_or_else(|| panic!("no drill-down on the page:\n{dom}"));
    for pid in ["11001", "11002", "11003"] {
        assert!(
            processes.contains(pid),
            "{pid} is not in the drill-down:\n{processes}"
        );
    }
    assert!(
        dom.contains("class=\"uplot"),
        "no chart in the drill-down:\n{dom}"
    );
    assert!(
        dom.contains(&format!("href=\"http://{first}/\"")),
        "no link to its own page:\n{dom}"
    );
    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join("artifacts");
    std::fs::create_dir_all(&artifacts).expect("artifacts dir");
    for (name, url) in [
        ("fleet-1280x800.png", &url),
        ("fleet-host-1280x800.png", &drill_url),
    ] {
        let shot = artifacts.join(name);
        chromium(
            &binary,
            profile.path(),
            &[format!("--screenshot={}", shot.display())],
            url,
        );
        assert!(
            std::fs::metadata(&shot).is_ok_and(|m| m.len() > 1000),
            "no screenshot"
        );
        eprintln!("fleet page screenshot: {}", shot.display());
    }
}

#[test]
fn bad_prometheus_urls_are_one_line_errors() {
    for (url, why) in [
        ("prometheus:9090", "give an http:// or https:// URL"),
        (
            "http://user:secret@prometheus:9090",
            "credentials in the URL are not supported",
        ),
    ] {
        let output = vramctl(&scenario("h200-idle.toml"))
            .args(["serve", "--listen", "127.0.0.1:0", "--prometheus", url])
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{url}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(why), "{url}: {stderr}");
    }
}

/// Instant query through a real Prometheus; its result list.
fn prometheus_query(prometheus: &Prometheus, promql: &str) -> Vec<Value> {
    let path = format!(
        "/api/v1/query?query={}",
        crate::serve::percent_encode(promql)
    );
    let (status, answer) = json(prometheus.base.parse().expect("addr"), &path);
    assert_eq!(status, 200, "{promql}: {answer:#}");
    answer["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// docs/metrics.md's table of dcgm-exporter's dashboard, checked with real parts: a real
/// Prometheus scrapes `serve --metrics-compat dcgm` (an H200 with temperature, power and
/// utilization), and each panel's query (as in dcgm-exporter's
/// `grafana/dcgm-exporter-dashboard.json`, its `$Hostname` and `$gpu` variables set to all)
/// returns series exactly for the panels the table says fill.
#[test]
fn dcgm_exporters_dashboard_fills_where_the_docs_say() {
    let Some(prometheus_binary) = prometheus_tool("prometheus") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = vramctl_std(&scenario("h200-training.toml"));
    cmd.env("NODE_NAME", "gpu-node-1");
    let served = serve(
        cmd,
        &[
            "--interval",
            "0.2",
            "--process-details",
            "nvml",
            "--metrics-compat",
            "dcgm",
        ],
    );
    let prometheus = start_prometheus(&prometheus_binary, dir.path(), &[served.addr]);
    let all = r#"{Hostname=~".*", gpu=~".*"}"#;
    let fills = [
        (
            "GPU Temperature",
            format!("max(DCGM_FI_DEV_GPU_TEMP{all}) by (Hostname, gpu, uuid)"),
        ),
        ("GPU Avg. Temp", format!("avg(DCGM_FI_DEV_GPU_TEMP{all})")),
        (
            "GPU Power Usage",
            format!("max(DCGM_FI_DEV_POWER_USAGE{all}) by (Hostname, gpu, uuid)"),
        ),
        (
            "GPU Power Total",
            format!("sum(max(DCGM_FI_DEV_POWER_USAGE{all}) by (gpu))"),
        ),
        (
            "GPU Framebuffer Mem Used",
            format!("max(DCGM_FI_DEV_FB_USED{all}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)"),
        ),
    ];
    let empty = [
        (
            "GPU SM Clocks",
            format!("max(DCGM_FI_DEV_SM_CLOCK{all} * 1000000) by (Hostname, UUID, gpu)"),
        ),
        (
            "GPU Utilization",
            format!(
                "max(DCGM_FI_PROF_GR_ENGINE_ACTIVE{all}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)"
            ),
        ),
        (
            "Tensor Core Utilization",
            format!(
                "max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{all}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)"
            ),
        ),
    ];
    let deadline = Instant::now() + Duration::from_secs(40);
    while prometheus_query(&prometheus, "DCGM_FI_DEV_FB_FREE").is_empty() {
        assert!(
            Instant::now() < deadline,
            "the compat series never reached Prometheus"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for (panel, query) in &fills {
        let result = prometheus_query(&prometheus, query);
        assert_eq!(
            result.len(),
            1,
            "{panel} should fill: {query} -> {result:?}"
        );
    }
    let used = prometheus_query(&prometheus, "DCGM_FI_DEV_FB_USED");
    assert_eq!(used[0]["metric"]["Hostname"], "gpu-node-1");
    assert_eq!(
        used[0]["value"][1], "37376",
        "the scenario's used memory in MiB"
    );
    for (panel, query) in &empty {
        let result = prometheus_query(&prometheus, query);
        assert!(
            result.is_empty(),
            "{panel} cannot fill, the docs say: {query} -> {result:?}"
        );
    }
    // The dashboard's variables: label_values(DCGM_FI_DEV_FB_FREE, Hostname) and gpu.
    for (label, want) in [("Hostname", "gpu-node-1"), ("gpu", "0")] {
        let path = format!(
            "/api/v1/label/{label}/values?match[]={}",
            crate::serve::percent_encode("DCGM_FI_DEV_FB_FREE")
        );
        let (status, values) = json(prometheus.base.parse().expect("addr"), &path);
        assert_eq!(status, 200, "{values:#}");
        assert_eq!(
            values["data"],
            serde_json::json!([want]),
            "variable {label}"
        );
    }
}

/// `--prometheus https://…`: a real Prometheus serving TLS with a certificate made now; the
/// fleet reads it when `--prometheus-ca` names that certificate, and a viewer trusting
/// another CA gets a 502 saying the TLS handshake failed, not a page of unverified data.
#[test]
fn the_fleet_reads_an_https_prometheus_with_its_ca() {
    let Some(prometheus_binary) = prometheus_tool("prometheus") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("certificate");
    let ca = dir.path().join("cert.pem");
    std::fs::write(&ca, cert.cert.pem()).expect("write");
    std::fs::write(dir.path().join("key.pem"), cert.key_pair.serialize_pem()).expect("write");
    let web_config = dir.path().join("web.yml");
    std::fs::write(
        &web_config,
        "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n",
    )
    .expect("write");
    let host = start_host("host-b.toml");
    let prometheus = start_prometheus_with(
        &prometheus_binary,
        dir.path(),
        &[host.addr],
        Some(&web_config),
    );
    let url = format!("https://{}", prometheus.base);
    let viewer = serve(
        vramctl_std(&scenario("h200-idle.toml")),
        &[
            "--interval",
            "3600",
            "--peak-window",
            "3600",
            "--prometheus",
            &url,
            "--prometheus-ca",
            &ca.display().to_string(),
        ],
    );
    let instance = host.addr.to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, fleet) = json(viewer.addr, "/api/fleet");
        if status == 200 && host_used(&fleet, &instance) == Some(30 * GIB) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet never showed host B over https; last ({status}): {fleet:#}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // Trusting another CA (not the system's bundle, which a CI machine may lack): the
    // handshake fails.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
    let other_ca = dir.path().join("other.pem");
    std::fs::write(&other_ca, other.cert.pem()).expect("write");
    let untrusting = serve(
        vramctl_std(&scenario("h200-idle.toml")),
        &[
            "--interval",
            "3600",
            "--peak-window",
            "3600",
            "--prometheus",
            &url,
            "--prometheus-ca",
            &other_ca.display().to_string(),
        ],
    );
    let (status, error) = json(untrusting.addr, "/api/fleet");
    assert_eq!(status, 502, "{error:#}");
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|e| e.contains("TLS handshake failed")),
        "{error:#}"
    );
}

fn host_used(fleet: &Value, instance: &str) -> Option<u64> {
    host(fleet, instance).and_then(|h| h["used_bytes"].as_u64())
}

/// A scrape target whose `instance` label is hostile (relabelled to markup, a quote and a
/// bidi override): the page shows it as text with the override escaped, never as markup,
/// and the drill-down finds the host by that exact label (quoted into PromQL, not spliced).
#[test]
fn a_hostile_instance_label_is_text_on_the_page_and_a_literal_in_promql() {
    let Some(prometheus_binary) = prometheus_tool("prometheus") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let target = start_host("host-c.toml");
    let hostile = "<img src=x id=pwned>\"\u{202e}evil:80";
    let config = format!(
        "global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\n\
         scrape_configs:\n  - job_name: vramctl\n    static_configs:\n      - targets: ['{}']\n\
         \x20   relabel_configs:\n      - target_label: instance\n        replacement: \"<img src=x id=pwned>\\\"\\u202eevil:80\"\n",
        target.addr
    );
    let prometheus = start_prometheus_config(&prometheus_binary, dir.path(), &config, None);
    let viewer = serve(
        vramctl_std(&scenario("h200-idle.toml")),
        &[
            "--interval",
            "3600",
            "--peak-window",
            "3600",
            "--prometheus",
            &format!("http://{}", prometheus.base),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, fleet) = json(viewer.addr, "/api/fleet");
        if status == 200 && host_used(&fleet, hostile) == Some(62 * GIB) {
            assert!(
                host(&fleet, hostile).is_some_and(|h| h["address"].is_null()),
                "no link"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hostile host never showed; last ({status}): {fleet:#}\n{}",
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let (status, detail) = json(
        viewer.addr,
        &format!(
            "/api/fleet/host?job=vramctl&instance={}&window=60",
            crate::serve::percent_encode(hostile)
        ),
    );
    assert_eq!(status, 200, "{detail:#}");
    assert_eq!(
        detail["host"]["instance"], hostile,
        "found by its exact label"
    );
    assert_eq!(detail["processes"].as_array().map(Vec::len), Some(2));

    if std::env::var_os("VRAMCTL_SKIP_CHROMIUM").is_some_and(|v| v == "1") {
        return;
    }
    let profile = tempfile::tempdir().expect("profile dir");
    let dom = chromium(
        Path::new("chromium"),
        profile.path(),
        &["--dump-dom".into()],
        &format!("http://{}/#fleet", viewer.addr),
    );
    let hosts_table = dom
        .split("id=\"fleet-hosts\"")
        .nth(1)
        .and_then(|rest| rest.split("</table>").next())
        .unwrap_or_else(|| panic!("no fleet hosts table:\n{dom}"));
    assert!(
        !dom.contains("id=\"pwned\""),
        "the label became markup:\n{hosts_table}"
    );
    assert!(
        hosts_table.contains("&lt;img src=x id=pwned&gt;\"\\u{202e}evil:80"),
        "the label is not shown as escaped text:\n{hosts_table}"
    );
}
