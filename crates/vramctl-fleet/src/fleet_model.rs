//! The fleet as the page shows it, built from Prometheus answers: hosts × GPUs with used and
//! total memory, the biggest holders across hosts, the current leak and idle verdicts, and
//! one host's drill-down (its GPUs' curves and its processes).
//!
//! A host is one scrape target: the pair (`job`, `instance`) Prometheus puts on every
//! series it scrapes. [`Fleet::build`] and [`HostDetail::build`] are pure functions of the
//! answers (unit-tested on real ones, `testdata/fleet/`); [`fetch_fleet`] and
//! [`fetch_host`] send the queries of [`crate::promql`] concurrently and call them.
//! Strings stay as Prometheus gave them (bounded by [`crate::prom_response::Limits`]):
//! the page escapes what it shows.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::prom_client::PrometheusClient;
use crate::prom_response::{Labels, Sample, Series};
use crate::promql;

/// Biggest holders listed across the fleet.
pub const HOLDERS_LISTED: usize = 20;
/// Verdicts of each kind listed across the fleet.
pub const VERDICTS_LISTED: usize = 100;

/// A scrape target: Prometheus' `job` and `instance` labels.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct HostKey {
    /// The scrape job.
    pub job: String,
    /// The target, usually `host:port` of its `vramctl serve`.
    pub instance: String,
}

impl HostKey {
    fn of(labels: &Labels) -> Option<Self> {
        Some(Self {
            job: labels.get("job")?.clone(),
            instance: labels.get("instance")?.clone(),
        })
    }
}

/// The fleet now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fleet {
    /// Every host whose exporter was scraped within the last hour, by job and instance.
    pub hosts: Vec<FleetHost>,
    /// The biggest per-process holders across hosts, biggest first.
    pub holders: Vec<Holder>,
    /// Processes judged leaking or idle holders now, leaks first.
    pub verdicts: Vec<Verdict>,
}

/// One host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetHost {
    /// Its job and instance.
    #[serde(flatten)]
    pub key: HostKey,
    /// Whether its last scrape worked (`up`); `None` when Prometheus has no `up` for it.
    pub up: Option<bool>,
    /// How old its exporter's sample was at the last scrape.
    pub sample_age_seconds: Option<f64>,
    /// `host:port` of its own `vramctl serve` page when the instance label is one (the
    /// page links to it), else `None`.
    pub address: Option<String>,
    /// Its GPUs, by index.
    pub gpus: Vec<FleetGpu>,
    /// Memory in use over its GPUs that report it.
    pub used_bytes: u64,
    /// Installed memory over its GPUs that report it.
    pub total_bytes: u64,
}

/// One GPU of a host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetGpu {
    /// NVML index, as the `gpu` label.
    pub gpu: String,
    /// UUID.
    pub uuid: String,
    /// Product name.
    pub name: Option<String>,
    /// Whether it answered its exporter's last collection.
    pub up: Option<bool>,
    /// Memory in use.
    pub used_bytes: Option<u64>,
    /// Installed memory.
    pub total_bytes: Option<u64>,
}

/// A process holding memory on one GPU of one host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Holder {
    /// Its host.
    #[serde(flatten)]
    pub key: HostKey,
    /// GPU index.
    pub gpu: String,
    /// GPU UUID.
    pub uuid: String,
    /// PID on its host.
    pub pid: String,
    /// Command line as the exporter cut it; `None` when the exporter does not export it.
    pub command: Option<String>,
    /// User.
    pub user: Option<String>,
    /// Container id.
    pub container: Option<String>,
    /// Pod UID.
    pub pod: Option<String>,
    /// Memory it holds on that GPU.
    pub used_bytes: Option<u64>,
}

impl Holder {
    fn of(labels: &Labels, used_bytes: Option<u64>) -> Option<Self> {
        let get = |name: &str| labels.get(name).filter(|v| !v.is_empty()).cloned();
        Some(Self {
            key: HostKey::of(labels)?,
            gpu: get("gpu").unwrap_or_default(),
            uuid: get("uuid").unwrap_or_default(),
            pid: get("pid")?,
            command: get("command"),
            user: get("user"),
            container: get("container"),
            pod: get("pod"),
            used_bytes,
        })
    }

    fn id(&self) -> (HostKey, String, String) {
        (self.key.clone(), self.uuid.clone(), self.pid.clone())
    }
}

/// What vramctl's analysis on the host says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// `vramctl_process_leak == 1`.
    Leak,
    /// `vramctl_process_idle_holder == 1`.
    IdleHolder,
}

/// One process's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Leak or idle holder.
    pub kind: VerdictKind,
    /// The process (its memory from `vramctl_process_memory_used_bytes`).
    #[serde(flatten)]
    pub holder: Holder,
    /// For a leak: the growth measured, bytes per second.
    pub leak_slope_bytes_per_second: Option<f64>,
    /// For an idle holder: how long it has been idle.
    pub idle_seconds: Option<f64>,
}

/// The answers [`Fleet::build`] reads, one per query of [`crate::promql`].
#[derive(Debug, Clone, Default)]
pub struct FleetAnswers {
    /// [`promql::HOSTS_SEEN`].
    pub hosts_seen: Vec<Sample>,
    /// [`promql::TARGETS_UP`].
    pub targets_up: Vec<Sample>,
    /// [`promql::SAMPLE_AGE`].
    pub sample_age: Vec<Sample>,
    /// [`promql::GPU_USED`].
    pub gpu_used: Vec<Sample>,
    /// [`promql::GPU_TOTAL`].
    pub gpu_total: Vec<Sample>,
    /// [`promql::GPU_INFO`].
    pub gpu_info: Vec<Sample>,
    /// [`promql::GPU_UP`].
    pub gpu_up: Vec<Sample>,
    /// [`promql::biggest_holders`].
    pub holders: Vec<Sample>,
    /// [`promql::leaking`].
    pub leaking: Vec<Sample>,
    /// [`promql::idle_holders`].
    pub idle: Vec<Sample>,
    /// [`promql::VERDICT_MEMORY`].
    pub verdict_memory: Vec<Sample>,
}

/// A byte count from a sample: finite and not negative, else unknown.
fn bytes(value: f64) -> Option<u64> {
    (value.is_finite() && value >= 0.0).then(|| value.round() as u64)
}

fn finite(value: f64) -> Option<f64> {
    value.is_finite().then_some(value)
}

type GpuId = (HostKey, String);

fn gpu_id(labels: &Labels) -> Option<GpuId> {
    Some((HostKey::of(labels)?, labels.get("uuid")?.clone()))
}

fn gpu_entry<'a>(
    gpus: &'a mut BTreeMap<GpuId, FleetGpu>,
    labels: &Labels,
) -> Option<&'a mut FleetGpu> {
    let id = gpu_id(labels)?;
    if id.1.is_empty() {
        // A GPU that could not even be opened has no UUID: nothing to join on.
        return None;
    }
    Some(gpus.entry(id.clone()).or_insert_with(|| FleetGpu {
        gpu: labels.get("gpu").cloned().unwrap_or_default(),
        uuid: id.1,
        name: None,
        up: None,
        used_bytes: None,
        total_bytes: None,
    }))
}

fn host_entry(hosts: &mut BTreeMap<HostKey, FleetHost>, key: HostKey) -> &mut FleetHost {
    hosts.entry(key.clone()).or_insert_with(|| FleetHost {
        address: address_of(&key.instance),
        key,
        up: None,
        sample_age_seconds: None,
        gpus: Vec::new(),
        used_bytes: 0,
        total_bytes: 0,
    })
}

fn gpus_of(
    answers_used: &[Sample],
    total: &[Sample],
    info: &[Sample],
    up: &[Sample],
) -> BTreeMap<GpuId, FleetGpu> {
    let mut gpus: BTreeMap<GpuId, FleetGpu> = BTreeMap::new();
    for s in answers_used {
        if let Some(g) = gpu_entry(&mut gpus, &s.labels) {
            g.used_bytes = bytes(s.value);
        }
    }
    for s in total {
        if let Some(g) = gpu_entry(&mut gpus, &s.labels) {
            g.total_bytes = bytes(s.value);
        }
    }
    for s in info {
        if let Some(g) = gpu_entry(&mut gpus, &s.labels) {
            g.name = s.labels.get("name").filter(|n| !n.is_empty()).cloned();
        }
    }
    for s in up {
        if let Some(g) = gpu_entry(&mut gpus, &s.labels) {
            g.up = Some(s.value == 1.0);
        }
    }
    gpus
}

impl Fleet {
    /// The fleet from the answers.
    pub fn build(answers: &FleetAnswers) -> Self {
        let mut hosts: BTreeMap<HostKey, FleetHost> = BTreeMap::new();
        for s in &answers.hosts_seen {
            if let Some(key) = HostKey::of(&s.labels) {
                host_entry(&mut hosts, key);
            }
        }
        // Other targets of the same Prometheus (node exporters, …) are not vramctl hosts:
        // `up` and the GPUs only fill hosts already seen or whose series name vramctl.
        let gpus = gpus_of(
            &answers.gpu_used,
            &answers.gpu_total,
            &answers.gpu_info,
            &answers.gpu_up,
        );
        for ((key, _), gpu) in gpus {
            host_entry(&mut hosts, key).gpus.push(gpu);
        }
        for s in &answers.sample_age {
            if let Some(key) = HostKey::of(&s.labels) {
                host_entry(&mut hosts, key).sample_age_seconds = finite(s.value);
            }
        }
        for s in &answers.targets_up {
            if let Some(key) = HostKey::of(&s.labels) {
                if let Some(h) = hosts.get_mut(&key) {
                    h.up = Some(s.value == 1.0);
                }
            }
        }
        let mut hosts: Vec<FleetHost> = hosts.into_values().collect();
        for h in &mut hosts {
            h.gpus
                .sort_by(|a, b| gpu_order(&a.gpu, &b.gpu).then(a.uuid.cmp(&b.uuid)));
            h.used_bytes = h.gpus.iter().filter_map(|g| g.used_bytes).sum();
            h.total_bytes = h.gpus.iter().filter_map(|g| g.total_bytes).sum();
        }
        let mut holders: Vec<Holder> = answers
            .holders
            .iter()
            .filter_map(|s| Holder::of(&s.labels, bytes(s.value)))
            .collect();
        holders.sort_by(|a, b| {
            b.used_bytes
                .cmp(&a.used_bytes)
                .then_with(|| a.id().cmp(&b.id()))
        });
        holders.truncate(HOLDERS_LISTED);
        let verdicts = verdicts_of(&answers.leaking, &answers.idle, &answers.verdict_memory);
        Self {
            hosts,
            holders,
            verdicts,
        }
    }
}

fn verdicts_of(leaking: &[Sample], idle: &[Sample], memory: &[Sample]) -> Vec<Verdict> {
    let memory: BTreeMap<(HostKey, String, String), Option<u64>> = memory
        .iter()
        .filter_map(|s| Some((Holder::of(&s.labels, None)?.id(), bytes(s.value))))
        .collect();
    let with_memory = |mut holder: Holder| {
        holder.used_bytes = memory.get(&holder.id()).copied().flatten();
        holder
    };
    let mut verdicts: Vec<Verdict> = leaking
        .iter()
        .filter_map(|s| {
            Some(Verdict {
                kind: VerdictKind::Leak,
                holder: with_memory(Holder::of(&s.labels, None)?),
                leak_slope_bytes_per_second: finite(s.value),
                idle_seconds: None,
            })
        })
        .chain(idle.iter().filter_map(|s| {
            Some(Verdict {
                kind: VerdictKind::IdleHolder,
                holder: with_memory(Holder::of(&s.labels, None)?),
                leak_slope_bytes_per_second: None,
                idle_seconds: finite(s.value),
            })
        }))
        .collect();
    // Leaks first, then by memory held, biggest first; ties in a fixed order.
    verdicts.sort_by(|a, b| {
        (a.kind != VerdictKind::Leak)
            .cmp(&(b.kind != VerdictKind::Leak))
            .then(b.holder.used_bytes.cmp(&a.holder.used_bytes))
            .then_with(|| a.holder.id().cmp(&b.holder.id()))
    });
    verdicts
}

/// GPU indexes sort as numbers where they are numbers.
fn gpu_order(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.parse::<u32>(), b.parse::<u32>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        _ => a.cmp(b),
    }
}

/// `host:port` when `instance` is one a link can safely name: a DNS name, an IPv4 address
/// or a bracketed IPv6 address, then a port. Anything else (a relabelled name with a
/// path, spaces, a scheme, userinfo) gives no link.
pub fn address_of(instance: &str) -> Option<String> {
    if instance.len() > 255 {
        return None;
    }
    let (host, port) = instance.rsplit_once(':')?;
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse::<u16>().ok().filter(|p| *p != 0)?;
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && !host.starts_with(['-', '.'])
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    };
    host_ok.then(|| instance.to_owned())
}

/// One host in detail: its GPUs now and over a window, and every process the exporter
/// exports there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostDetail {
    /// The host, as in the fleet.
    pub host: Option<FleetHost>,
    /// Used memory per GPU over the window.
    pub curves: Vec<GpuCurve>,
    /// Its processes now, biggest first.
    pub processes: Vec<Holder>,
    /// Its verdicts now.
    pub verdicts: Vec<Verdict>,
    /// The window's length and step.
    pub window_seconds: f64,
    /// Seconds between the curves' points.
    pub step_seconds: f64,
}

/// One GPU's used memory over time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuCurve {
    /// GPU index.
    pub gpu: String,
    /// GPU UUID.
    pub uuid: String,
    /// Unix seconds of the points.
    pub times_unix_s: Vec<f64>,
    /// Used bytes at those times (`None` where not finite).
    pub used_bytes: Vec<Option<u64>>,
}

impl HostDetail {
    /// One host from the answers: `fleet` built from the host's own series, `range` the
    /// range query of its used memory, `processes` its process series.
    pub fn build(
        key: &HostKey,
        fleet: &Fleet,
        range: &[Series],
        processes: &[Sample],
        window: Duration,
        step: Duration,
    ) -> Self {
        let mut curves: Vec<GpuCurve> = range
            .iter()
            .filter(|s| HostKey::of(&s.labels).as_ref() == Some(key))
            .map(|s| GpuCurve {
                gpu: s.labels.get("gpu").cloned().unwrap_or_default(),
                uuid: s.labels.get("uuid").cloned().unwrap_or_default(),
                times_unix_s: s.points.iter().map(|p| p.0).collect(),
                used_bytes: s.points.iter().map(|p| bytes(p.1)).collect(),
            })
            .collect();
        curves.sort_by(|a, b| gpu_order(&a.gpu, &b.gpu).then(a.uuid.cmp(&b.uuid)));
        let mut processes: Vec<Holder> = processes
            .iter()
            .filter_map(|s| Holder::of(&s.labels, bytes(s.value)))
            .filter(|h| &h.key == key)
            .collect();
        processes.sort_by(|a, b| {
            b.used_bytes
                .cmp(&a.used_bytes)
                .then_with(|| a.id().cmp(&b.id()))
        });
        Self {
            host: fleet.hosts.iter().find(|h| &h.key == key).cloned(),
            curves,
            processes,
            verdicts: fleet
                .verdicts
                .iter()
                .filter(|v| &v.holder.key == key)
                .cloned()
                .collect(),
            window_seconds: window.as_secs_f64(),
            step_seconds: step.as_secs_f64(),
        }
    }
}

/// The fleet now, from `client`'s Prometheus: the queries run concurrently; any failing
/// fails the whole (a partial fleet would show hosts without their GPUs as empty).
pub async fn fetch_fleet(client: &PrometheusClient) -> anyhow::Result<Fleet> {
    Ok(Fleet::build(&fetch_answers(client, None).await?))
}

async fn fetch_answers(
    client: &PrometheusClient,
    host: Option<&HostKey>,
) -> anyhow::Result<FleetAnswers> {
    let scoped = |metric: &str| match host {
        Some(k) => promql::of_host(metric, &k.job, &k.instance),
        None => metric.to_owned(),
    };
    let hosts_seen = match host {
        Some(k) => format!(
            "max by (job, instance) (last_over_time(vramctl_build_info{}[1h]))",
            promql::host_selector(&k.job, &k.instance)
        ),
        None => promql::HOSTS_SEEN.to_owned(),
    };
    let (targets_up, sample_age, gpu_used, gpu_total, gpu_info, gpu_up) = (
        scoped(promql::TARGETS_UP),
        scoped(promql::SAMPLE_AGE),
        scoped(promql::GPU_USED),
        scoped(promql::GPU_TOTAL),
        scoped(promql::GPU_INFO),
        scoped(promql::GPU_UP),
    );
    let (leaking, idle, holders) = (
        promql::leaking(VERDICTS_LISTED),
        promql::idle_holders(VERDICTS_LISTED),
        promql::biggest_holders(HOLDERS_LISTED),
    );
    let (a, b, c, d, e, f, g, h, i, j, k) = tokio::join!(
        client.query(&hosts_seen),
        client.query(&targets_up),
        client.query(&sample_age),
        client.query(&gpu_used),
        client.query(&gpu_total),
        client.query(&gpu_info),
        client.query(&gpu_up),
        client.query(&holders),
        client.query(&leaking),
        client.query(&idle),
        client.query(promql::VERDICT_MEMORY),
    );
    Ok(FleetAnswers {
        hosts_seen: a?,
        targets_up: b?,
        sample_age: c?,
        gpu_used: d?,
        gpu_total: e?,
        gpu_info: f?,
        gpu_up: g?,
        holders: h?,
        leaking: i?,
        idle: j?,
        verdict_memory: k?,
    })
}

/// Points a curve has at most: the step grows with the window.
pub const CURVE_POINTS: u32 = 300;

/// One host's drill-down over the last `window` (clamped to 1 minute … 31 days).
pub async fn fetch_host(
    client: &PrometheusClient,
    key: &HostKey,
    window: Duration,
) -> anyhow::Result<HostDetail> {
    let window = window.clamp(Duration::from_secs(60), Duration::from_secs(31 * 86_400));
    let step = (window / CURVE_POINTS).max(Duration::from_secs(1));
    let end_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    let range_query = promql::of_host(promql::GPU_USED, &key.job, &key.instance);
    let processes_query =
        promql::of_host("vramctl_process_memory_used_bytes", &key.job, &key.instance);
    let (answers, range, processes) = tokio::join!(
        fetch_answers(client, Some(key)),
        client.query_range(
            &range_query,
            end_unix_s - window.as_secs_f64(),
            end_unix_s,
            step
        ),
        client.query(&processes_query),
    );
    let fleet = Fleet::build(&answers?);
    Ok(HostDetail::build(
        key,
        &fleet,
        &range?,
        &processes?,
        window,
        step,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prom_response::{Limits, parse_matrix, parse_vector};

    fn fixture(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/fleet")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn vector(name: &str) -> Vec<Sample> {
        parse_vector(&fixture(name), &Limits::default()).expect(name)
    }

    /// The answers a real Prometheus gave while scraping three `vramctl serve` on the
    /// fake NVML (testdata/fleet/host-{a,b,c}.toml; README there).
    fn real_answers() -> FleetAnswers {
        FleetAnswers {
            hosts_seen: vector("hosts_seen.json"),
            targets_up: vector("up.json"),
            sample_age: vector("sample_age.json"),
            gpu_used: vector("gpu_used.json"),
            gpu_total: vector("gpu_total.json"),
            gpu_info: vector("gpu_info.json"),
            gpu_up: vector("gpu_up.json"),
            holders: vector("holders.json"),
            leaking: vector("leaking.json"),
            idle: vector("idle.json"),
            verdict_memory: vector("verdict_memory.json"),
        }
    }

    const HOST_A: &str = "127.0.0.1:43067";
    const HOST_B: &str = "127.0.0.1:40479";
    const HOST_C: &str = "127.0.0.1:36835";
    const GIB: u64 = 1 << 30;

    fn key(instance: &str) -> HostKey {
        HostKey {
            job: "vramctl".into(),
            instance: instance.into(),
        }
    }

    #[test]
    fn three_hosts_with_their_gpus_and_numbers() {
        let fleet = Fleet::build(&real_answers());
        let instances: Vec<&str> = fleet
            .hosts
            .iter()
            .map(|h| h.key.instance.as_str())
            .collect();
        assert_eq!(
            instances,
            [HOST_C, HOST_B, HOST_A],
            "sorted by job, instance"
        );
        let a = &fleet.hosts[2];
        assert_eq!(a.up, Some(true));
        assert_eq!(a.address.as_deref(), Some(HOST_A));
        assert_eq!(a.gpus.len(), 2);
        assert_eq!(a.gpus[1].gpu, "1");
        assert_eq!(a.gpus[1].name.as_deref(), Some("NVIDIA H200"));
        assert_eq!(
            a.gpus[1].used_bytes,
            Some(60 * GIB),
            "serve_model.py's 60 GiB"
        );
        assert_eq!(a.gpus[0].total_bytes, Some(150_754_820_096));
        assert_eq!(a.total_bytes, 2 * 150_754_820_096);
        let b = &fleet.hosts[1];
        assert_eq!(b.gpus.len(), 1);
        assert_eq!(b.used_bytes, 30 * GIB);
        let c = &fleet.hosts[0];
        assert_eq!(c.gpus[0].name.as_deref(), Some("NVIDIA A100-SXM4-80GB"));
        assert_eq!(c.used_bytes, 62 * GIB, "train.py 50 GiB + eval.py 12 GiB");
        assert!(
            fleet
                .hosts
                .iter()
                .all(|h| h.sample_age_seconds.is_some_and(|s| s < 5.0))
        );
    }

    #[test]
    fn holders_across_hosts_biggest_first() {
        let fleet = Fleet::build(&real_answers());
        let order: Vec<(&str, &str)> = fleet
            .holders
            .iter()
            .map(|h| (h.key.instance.as_str(), h.pid.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                (HOST_A, "11001"),
                (HOST_A, "11003"),
                (HOST_C, "13001"),
                (HOST_B, "12001"),
                (HOST_C, "13002"),
                (HOST_A, "11002"),
            ]
        );
        assert_eq!(
            fleet.holders[2].command.as_deref(),
            Some("python train.py --big")
        );
        assert_eq!(fleet.holders[2].used_bytes, Some(50 * GIB));
    }

    #[test]
    fn verdicts_leaks_first_with_their_memory() {
        let fleet = Fleet::build(&real_answers());
        let leak = &fleet.verdicts[0];
        assert_eq!(leak.kind, VerdictKind::Leak);
        assert_eq!(
            (leak.holder.key.instance.as_str(), leak.holder.pid.as_str()),
            (HOST_A, "11001")
        );
        assert!(leak.leak_slope_bytes_per_second.is_some_and(|s| s > 0.0));
        assert!(leak.holder.used_bytes.is_some_and(|b| b > GIB));
        let idle: Vec<(&str, &str)> = fleet.verdicts[1..]
            .iter()
            .map(|v| {
                assert_eq!(v.kind, VerdictKind::IdleHolder);
                assert!(v.idle_seconds.is_some_and(|s| s >= 3.0), "{v:?}");
                (v.holder.key.instance.as_str(), v.holder.pid.as_str())
            })
            .collect();
        assert!(
            idle.contains(&(HOST_B, "12001")),
            "the notebook kernel: {idle:?}"
        );
        let kernel = fleet
            .verdicts
            .iter()
            .find(|v| v.holder.pid == "12001")
            .expect("idle");
        assert_eq!(kernel.holder.used_bytes, Some(30 * GIB));
    }

    #[test]
    fn one_host_in_detail() {
        let fleet = Fleet::build(&real_answers());
        let range = parse_matrix(&fixture("host_range.json"), &Limits::default()).expect("range");
        let detail = HostDetail::build(
            &key(HOST_A),
            &fleet,
            &range,
            &vector("host_processes.json"),
            Duration::from_secs(30),
            Duration::from_secs(5),
        );
        assert_eq!(detail.host.as_ref().map(|h| h.gpus.len()), Some(2));
        assert_eq!(detail.curves.len(), 2);
        assert_eq!(detail.curves[0].gpu, "0");
        let leaky = &detail.curves[0].used_bytes;
        assert!(
            leaky.windows(2).all(|w| w[0] < w[1]),
            "GPU 0 grows: {leaky:?}"
        );
        let pids: Vec<&str> = detail.processes.iter().map(|p| p.pid.as_str()).collect();
        assert_eq!(pids, ["11001", "11003", "11002"]);
        assert!(
            detail
                .verdicts
                .iter()
                .all(|v| v.holder.key.instance == HOST_A)
        );
        assert!(detail.verdicts.iter().any(|v| v.kind == VerdictKind::Leak));
        let other = HostDetail::build(
            &key("nowhere:1"),
            &fleet,
            &range,
            &[],
            Duration::ZERO,
            Duration::ZERO,
        );
        assert!(other.host.is_none() && other.curves.is_empty() && other.verdicts.is_empty());
    }

    #[test]
    fn links_only_for_plain_host_port_instances() {
        for ok in ["gpu-1.example.org:9835", "10.0.0.7:9835", "[fe80::1]:9835"] {
            assert_eq!(address_of(ok).as_deref(), Some(ok));
        }
        for bad in [
            "gpu-1",
            "gpu-1:",
            "gpu-1:0",
            "gpu-1:99999",
            "http://gpu-1:9835",
            "evil.org/x:9835",
            "user@gpu-1:9835",
            "a b:9835",
            "-x:80",
            "[::zz]:80",
            "gpu\u{202e}1:80",
        ] {
            assert_eq!(address_of(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn hostile_and_odd_values_are_bounded_not_fatal() {
        let mut answers = real_answers();
        // A negative or infinite memory value is unknown, never a wrapped u64.
        answers.gpu_used[0].value = -1.0;
        answers.gpu_total[0].value = f64::INFINITY;
        // A series without a job/instance or pid is skipped, not a panic.
        answers.holders[0].labels.remove("pid");
        answers.holders[1].labels.remove("instance");
        let fleet = Fleet::build(&answers);
        assert_eq!(fleet.hosts.len(), 3);
        assert_eq!(fleet.holders.len(), 4);
        let gpu = fleet
            .hosts
            .iter()
            .flat_map(|h| &h.gpus)
            .find(|g| g.used_bytes.is_none())
            .expect("the GPU whose value was negative");
        assert_eq!(gpu.total_bytes, None);
    }
}
