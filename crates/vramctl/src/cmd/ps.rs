//! `vramctl ps`: every process holding GPU memory, across devices, joined with /proc.
//!
//! One snapshot says who holds how much on which device (a running daemon's, when one
//! answers: `vramctl_observe::live_source`; else a sampler tick here); /proc adds who they are (user,
//! command line, age, CPU, RSS, state, parent, container, pod). A PID the driver reports
//! that this PID namespace cannot see is listed as such; memory that no process accounts for
//! is a row of its own. `--tree` nests processes under their parents and shows their
//! descendants without GPU memory too (data-loader workers under their trainer), which is
//! what `kill --tree` would reach.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use regex::Regex;
use serde::Serialize;
use vramctl_agent::agent_client::{self, AgentMemory};
use vramctl_agent::agent_poll;
use vramctl_core::command_line::abbreviate;
use vramctl_core::types::{DeviceState, Snapshot};
use vramctl_observe::agent_ooms::{self, OomState, ProcessOoms};
use vramctl_observe::observation::{HostProcess, Observation};
use vramctl_observe::owners::{self, OwnerKey, OwnerTotal};
use vramctl_procs::container::{ContainerFacts, PodQos};
use vramctl_procs::procinfo::{self, PidNamespace, ProcReader};
use vramctl_procs::slurm::SlurmJob;
use vramctl_store::format::rfc3339;

use vramctl_observe::gpu_holdings::{GpuHolding, holdings, total_bytes};
use vramctl_observe::gpu_selection::GpuFilter;
use vramctl_observe::pattern::compile_regex;
use vramctl_observe::pid_view::{OtherHolders, PidView};

use super::open_live;
use crate::cli::{GlobalArgs, PsArgs, PsSort};
use crate::exit::Exit;
use crate::output::emit::{Format, Lines, emit};
use crate::output::owners::owner_table;
use crate::output::table::{Align, Table};
use crate::output::terminal::{self, wrap};
use vramctl_observe::units;

/// Version of the JSON below; bumped on any incompatible change.
pub const SCHEMA: u32 = 1;

/// The whole `ps --json` document.
#[derive(Debug, Serialize)]
pub struct PsReport {
    schema: u32,
    /// RFC 3339 UTC, when the sample was taken.
    taken_at: String,
    /// Whether this runs in the host PID namespace (else NVML's PIDs may not be ours).
    pid_namespace_initial: bool,
    /// What the listed PIDs are: `same` (NVML's and this namespace's alike), `mapped` (a
    /// host daemon answered for this PID namespace), `cannot_map` (NVML's host PIDs).
    pid_mapping: &'static str,
    /// Why the PIDs cannot be mapped; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pid_mapping_reason: Option<String>,
    /// With `mapped`: memory of other containers' or the host's processes, per GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    other_holders: Option<Vec<OtherHolders>>,
    /// With `cannot_map`: this namespace's processes holding `/dev/nvidia*` open.
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_device_holders: Option<Vec<LocalHolder>>,
    /// Seconds CPU % was measured over; `null`: averaged over each process's lifetime.
    cpu_interval_s: Option<f64>,
    /// Whether rows are nested (`tree_parent` set, descendants without GPU memory listed).
    tree: bool,
    processes: Vec<PsProcess>,
    /// GPU processes that `--user`, `--match` or `--min-mem` left out.
    filtered_out: usize,
    /// What those options ask for, in words (`of user alice`); empty without them.
    #[serde(skip)]
    filter_words: String,
    unaccounted: Vec<Unaccounted>,
    devices_not_read: Vec<DeviceProblem>,
    /// GPUs the driver counts that could not be opened at all (lost before the first
    /// sample, as `status` reports them).
    unopened: Vec<UnopenedDevice>,
    /// With `--by`: the key the processes are grouped by, and the groups.
    #[serde(skip_serializing_if = "Option::is_none")]
    by: Option<OwnerKey>,
    /// With `--by`: memory per owner on each GPU (docs/owners.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    owners: Option<Vec<OwnerTotal>>,
}

/// A process of this namespace with NVIDIA device files open (no bytes: NVML's figures
/// are under host PIDs that cannot be told apart here).
#[derive(Debug, Clone, Serialize)]
struct LocalHolder {
    pid: u32,
    command: Option<String>,
    files: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
struct UnopenedDevice {
    index: u32,
    reason: String,
}

#[derive(Debug, Clone, Serialize)]
struct PsProcess {
    pid: u32,
    /// NVML's (the host's) PID where it is not `pid` or `pid` cannot be mapped here.
    #[serde(skip_serializing_if = "Option::is_none")]
    host_pid: Option<u32>,
    /// Whether /proc in this PID namespace shows it.
    visible: bool,
    /// With the boot id, its identity: `vramctl kill PID@START` insists on it.
    start_time_ticks: Option<u64>,
    /// Its pidfd's id (Linux 6.9+), finer than the start time: `kill PID@START:ID`.
    pidfd_id: Option<u64>,
    user: Option<String>,
    uid: Option<u32>,
    /// Command line; for an invisible PID, the driver's process name.
    command: Option<String>,
    /// State letter (`R`, `S`, `D`, `Z`, ...).
    state: Option<String>,
    zombie: bool,
    ppid: Option<u32>,
    children: Vec<u32>,
    started_at: Option<String>,
    age_s: Option<u64>,
    cpu_percent: Option<f64>,
    rss_bytes: Option<u64>,
    threads: Option<u32>,
    container_id: Option<String>,
    pod_uid: Option<String>,
    /// Its cgroup v2 path; absent when not known (not visible, no cgroup v2).
    #[serde(skip_serializing_if = "Option::is_none")]
    cgroup: Option<String>,
    /// Its Slurm job; absent when it is in none (or not visible).
    #[serde(skip_serializing_if = "Option::is_none")]
    slurm: Option<SlurmJob>,
    /// Its container's id, runtime, name and rootless owner; absent outside a container.
    #[serde(skip_serializing_if = "Option::is_none")]
    container: Option<ContainerFacts>,
    /// Its pod's QoS class; absent outside a Kubernetes pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_qos: Option<PodQos>,
    /// Its Kubernetes pod and container (docs/owners.md); absent when not in a pod the
    /// kubelet names.
    #[serde(skip_serializing_if = "Option::is_none")]
    kubernetes: Option<vramctl_kube::ProcessPod>,
    /// GPU memory summed over devices; `null` when a device reports it unavailable.
    used_bytes: Option<u64>,
    gpus: Vec<GpuHolding>,
    /// With --tree: the nearest ancestor listed here.
    tree_parent: Option<u32>,
    /// What the process's in-process agent says (allocated, cached, releasable); absent
    /// for a process without one (docs/agent.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    agent: Option<AgentMemory>,
    /// The CUDA out-of-memory errors its agent reported, with the first one's cause and
    /// fix (docs/json.md); absent when it has no agent or had none.
    #[serde(skip_serializing_if = "Option::is_none")]
    oom: Option<ProcessOoms>,
    #[serde(skip)]
    cpu_ticks: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
struct Unaccounted {
    index: u32,
    uuid: String,
    bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
struct DeviceProblem {
    index: u32,
    uuid: String,
    /// `lost`, `error`, or `processes_not_reported`.
    state: &'static str,
    reason: String,
}

/// Runs `ps`.
pub fn run(global: &GlobalArgs, args: &PsArgs) -> anyhow::Result<Exit> {
    let cpu_interval = Some(args.cpu_interval).filter(|d| !d.is_zero());
    let pattern = args
        .pattern
        .as_deref()
        .map(|text| compile_regex("--match", text))
        .transpose()?;
    let users = args
        .user
        .iter()
        .map(|u| resolve_user(u))
        .collect::<anyhow::Result<Vec<UserSpec>>>()?;
    let mut source = open_live(global, args.no_daemon, true)?;
    let filter = GpuFilter::new(&args.gpu.selectors, &source.devices())?;
    let snapshot = source.sample()?;
    // Who the listed processes are: the daemon's answer or this /proc, the same either way.
    let observation = source.observe(snapshot);
    let pid_view = source.pid_view().clone();
    // The tree's other processes and CPU % are read here (same PID namespace as a daemon
    // that answered).
    let mut procs = ProcReader::new();
    let selection = Selection {
        users,
        pattern,
        min_bytes: args.min_mem,
    };
    let mut report = build(
        &observation,
        &pid_view,
        &filter,
        &mut procs,
        &selection,
        args.tree,
        args.sort,
    );
    measure_cpu(&mut report, cpu_interval, &procs);
    ask_agents(&mut report, &observation.snapshot);
    source.end_for_exit();
    if let Some(key) = args.by {
        // The listed processes (after the filters), grouped by who owns them.
        let listed: BTreeMap<u32, Vec<GpuHolding>> = report
            .processes
            .iter()
            .map(|p| (p.pid, p.gpus.clone()))
            .collect();
        report.by = Some(key);
        report.owners = Some(owners::totals(key, &listed, &observation.hosts));
    }

    let mut out = std::io::stdout().lock();
    emit(
        &mut out,
        Format::from_json_flag(args.json, Format::JsonLine),
        || &report,
        || match (report.by, report.owners.as_ref()) {
            // With nothing to group, the usual "no process holds GPU memory" lines.
            (Some(key), Some(totals)) if !totals.is_empty() => {
                Lines::Untrusted(owner_table(key, totals, "", terminal::width()))
            }
            _ => Lines::Untrusted(render(&report, terminal::width())),
        },
    )?;
    out.flush().context("cannot write to stdout")?;
    Ok(Exit::Ok)
}

/// One `--user` value: a name the user database knows (with its uid), or a uid.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UserSpec {
    name: Option<String>,
    uid: u32,
}

/// `text` as a user: a numeric uid, or a name the user database knows.
///
/// # Errors
/// A name no user has: "nothing is held" would be a wrong answer to a typo.
fn resolve_user(text: &str) -> anyhow::Result<UserSpec> {
    if let Ok(uid) = text.parse::<u32>() {
        return Ok(UserSpec { name: None, uid });
    }
    match procinfo::uid_of_user(text) {
        Some(uid) => Ok(UserSpec {
            name: Some(text.to_owned()),
            uid,
        }),
        None => bail!(
            "--user '{text}' is not a user on this system; give a user name the user \
             database knows, or a numeric uid"
        ),
    }
}

/// `--user`, `--match`, `--min-mem`.
struct Selection {
    users: Vec<UserSpec>,
    pattern: Option<Regex>,
    min_bytes: Option<u64>,
}

impl Selection {
    /// What the options ask for, as words after "process": `of user alice matching
    /// 'train'`, `of uid 1001`; empty without options.
    fn words(&self) -> String {
        let mut words = Vec::new();
        if !self.users.is_empty() {
            let names: Vec<String> = self
                .users
                .iter()
                .map(|u| match &u.name {
                    Some(name) => format!("user {name}"),
                    None => format!("uid {}", u.uid),
                })
                .collect();
            words.push(format!("of {}", names.join(" or ")));
        }
        if let Some(re) = &self.pattern {
            words.push(format!("matching '{}'", re.as_str()));
        }
        if let Some(min) = self.min_bytes {
            words.push(format!("holding at least {}", units::bytes(min)));
        }
        words.join(" ")
    }

    fn keeps(&self, p: &PsProcess) -> bool {
        let user_ok = self.users.is_empty()
            || self.users.iter().any(|u| {
                p.uid == Some(u.uid) || (u.name.is_some() && p.user.as_deref() == u.name.as_deref())
            });
        let pattern_ok = self
            .pattern
            .as_ref()
            .is_none_or(|re| p.command.as_deref().is_some_and(|c| re.is_match(c)));
        let size_ok = self
            .min_bytes
            .is_none_or(|min| p.used_bytes.is_some_and(|used| used >= min));
        user_ok && pattern_ok && size_ok
    }
}

/// The observation as the report (CPU % is measured afterwards); with `tree`, the
/// listed processes' descendants read from `procs`.
fn build(
    observation: &Observation,
    pid_view: &PidView,
    filter: &GpuFilter,
    procs: &mut ProcReader,
    selection: &Selection,
    tree: bool,
    sort: PsSort,
) -> PsReport {
    let snapshot = &*observation.snapshot;
    let now_ms = snapshot.taken_at_unix_ms;
    let tps = procs.ticks_per_second();
    let all: Vec<PsProcess> = holdings(snapshot, filter)
        .into_iter()
        .map(|(pid, gpus)| {
            let host = observation.hosts.get(&pid);
            let command = host
                .map(|h| h.command.clone())
                .or_else(|| observation.driver_names.get(&pid).cloned());
            let mut row = row(pid, host, command, gpus, now_ms, tps);
            row.host_pid = pid_view.host_pid(pid);
            row
        })
        .collect();
    let listed = all.len();
    let mut rows: Vec<PsProcess> = all.into_iter().filter(|p| selection.keeps(p)).collect();
    let filtered_out = listed - rows.len();

    if tree {
        add_tree(&mut rows, procs, now_ms);
        rows = tree_order(rows, sort);
    } else {
        rows.sort_by(|a, b| compare(a, b, sort));
    }

    let mut unaccounted = Vec::new();
    let mut devices_not_read = Vec::new();
    for device in snapshot.devices.iter().filter(|d| filter.matches(&d.info)) {
        let info = &device.info;
        let problem = |state, reason: String| DeviceProblem {
            index: info.index,
            uuid: info.uuid.clone(),
            state,
            reason,
        };
        match &device.state {
            DeviceState::Ok(reading) => {
                if reading.processes.is_none() {
                    let why = reading
                        .missing
                        .iter()
                        .filter(|(field, _)| field.as_str().ends_with("processes"))
                        .map(|(_, why)| why.to_string())
                        .next()
                        .unwrap_or_else(|| "not reported".into());
                    devices_not_read.push(problem("processes_not_reported", why));
                }
                // Memory of other namespaces' processes is theirs, not unaccounted.
                let others = pid_view
                    .others_on(info.index)
                    .and_then(|o| o.used_bytes)
                    .unwrap_or(0);
                let bytes = reading
                    .unaccounted_bytes()
                    .unwrap_or(0)
                    .saturating_sub(others);
                let hidden = !selection.users.is_empty() || selection.pattern.is_some();
                if bytes > 0 && !hidden && selection.min_bytes.is_none_or(|min| bytes >= min) {
                    unaccounted.push(Unaccounted {
                        index: info.index,
                        uuid: info.uuid.clone(),
                        bytes,
                    });
                }
            }
            DeviceState::Lost { reason } => devices_not_read.push(problem("lost", reason.clone())),
            DeviceState::Error { reason } => {
                devices_not_read.push(problem("error", reason.clone()));
            }
        }
    }

    PsReport {
        schema: SCHEMA,
        taken_at: rfc3339(now_ms),
        pid_namespace_initial: PidNamespace::current().is_initial(),
        pid_mapping: pid_view.mode(),
        pid_mapping_reason: match pid_view {
            PidView::CannotMap(u) => Some(u.reason.clone()),
            PidView::DriverNumbered(d) => Some(format!(
                "no host daemon answered for this PID namespace; the driver numbers NVML's \
                 processes in it: each of the {} row(s) is a process here holding that GPU's \
                 device file open",
                d.rows_checked
            )),
            _ => None,
        },
        other_holders: match pid_view {
            PidView::Mapped(view) => Some(
                view.others
                    .iter()
                    .filter(|o| {
                        snapshot
                            .devices
                            .iter()
                            .any(|d| d.info.index == o.index && filter.matches(&d.info))
                    })
                    .cloned()
                    .collect(),
            ),
            _ => None,
        },
        gpu_device_holders: match pid_view {
            PidView::CannotMap(u) => Some(
                u.gpu_device_holders
                    .iter()
                    .map(|h| LocalHolder {
                        pid: h.pid,
                        command: procinfo::read_cmdline(h.pid),
                        files: h.files.clone(),
                    })
                    .collect(),
            ),
            _ => None,
        },
        by: None,
        owners: None,
        cpu_interval_s: None,
        tree,
        processes: rows,
        filtered_out,
        filter_words: selection.words(),
        unaccounted,
        devices_not_read,
        unopened: snapshot
            .unopened
            .iter()
            .map(|u| UnopenedDevice {
                index: u.index,
                reason: u.reason.to_string(),
            })
            .collect(),
    }
}

/// `pid`'s row: `host` is what the observation says of it (`None`: not visible here);
/// `ticks_per_second` turns its CPU time back into the ticks the lifetime CPU % counts.
fn row(
    pid: u32,
    host: Option<&HostProcess>,
    command: Option<String>,
    gpus: Vec<GpuHolding>,
    now_ms: i64,
    ticks_per_second: u64,
) -> PsProcess {
    let started_at_ms = host.and_then(|h| h.started_at_unix_ms);
    PsProcess {
        pid,
        host_pid: None,
        visible: host.is_some(),
        start_time_ticks: host.and_then(|h| h.start_time_ticks),
        pidfd_id: host.and_then(|h| h.pidfd_id),
        user: host.and_then(|h| h.user.clone()),
        uid: host.and_then(|h| h.uid),
        command,
        state: host.and_then(|h| h.state).map(String::from),
        zombie: host.is_some_and(HostProcess::is_zombie),
        ppid: host.and_then(|h| h.ppid),
        // Only `ps` needs them: one read per thread, so not part of every observation.
        children: host.map(|_| procinfo::children(pid)).unwrap_or_default(),
        started_at: started_at_ms.map(rfc3339),
        age_s: started_at_ms
            .and_then(|started| u64::try_from(now_ms.saturating_sub(started) / 1000).ok()),
        cpu_percent: None,
        rss_bytes: host.and_then(|h| h.rss_bytes),
        threads: host.and_then(|h| h.threads),
        container_id: host.and_then(|h| h.container_id.clone()),
        pod_uid: host.and_then(|h| h.pod_uid.clone()),
        cgroup: host.and_then(|h| h.cgroup.clone()),
        slurm: host.and_then(|h| h.slurm.clone()),
        container: host.and_then(|h| h.container.clone()),
        pod_qos: host.and_then(|h| h.pod_qos),
        kubernetes: host.and_then(|h| h.kubernetes.clone()),
        used_bytes: total_bytes(&gpus),
        gpus,
        tree_parent: None,
        agent: None,
        oom: None,
        // Exact for the kernel's 100 ticks a second (and any rate dividing 1000).
        cpu_ticks: host.and_then(|h| h.cpu_time_ms).and_then(|ms| {
            u64::try_from(u128::from(ms) * u128::from(ticks_per_second) / 1000).ok()
        }),
    }
}

/// Sets each GPU process's nearest listed ancestor, and adds the descendants of the listed
/// processes that hold no GPU memory.
fn add_tree(rows: &mut Vec<PsProcess>, procs: &mut ProcReader, now_ms: i64) {
    let tps = procs.ticks_per_second();
    let mut listed: HashSet<u32> = rows.iter().map(|r| r.pid).collect();
    let holders: Vec<u32> = rows.iter().filter(|r| r.visible).map(|r| r.pid).collect();
    let mut extra = Vec::new();
    for root in holders {
        for (pid, parent) in procinfo::descendants(root) {
            if !listed.insert(pid) {
                continue;
            }
            if let Some(details) = procs.details(pid) {
                let mut host = HostProcess::from_details(&details, tps);
                host.pidfd_id = details
                    .start_time_ticks
                    .and_then(|start| HostProcess::pidfd_id_of(pid, start));
                let command = Some(host.command.clone());
                let mut r = row(pid, Some(&host), command, Vec::new(), now_ms, tps);
                r.tree_parent = Some(parent);
                extra.push(r);
            }
        }
    }
    // Now that the descendants are listed, a GPU process's nearest listed ancestor may be
    // one of them (the worker's parent shell rather than the trainer).
    for row in rows.iter_mut().filter(|r| r.visible) {
        row.tree_parent = nearest_listed_ancestor(row.pid, &listed);
    }
    rows.extend(extra);
}

fn nearest_listed_ancestor(pid: u32, listed: &HashSet<u32>) -> Option<u32> {
    let mut next = procinfo::read_stat(pid).ok()?.ppid;
    for _ in 0..4096 {
        if next == 0 {
            return None;
        }
        if listed.contains(&next) {
            return Some(next);
        }
        next = procinfo::read_stat(next).ok()?.ppid;
    }
    None
}

/// Depth-first: each root, then its children, siblings sorted by `sort`.
fn tree_order(rows: Vec<PsProcess>, sort: PsSort) -> Vec<PsProcess> {
    let pids: HashSet<u32> = rows.iter().map(|r| r.pid).collect();
    let mut children: HashMap<Option<u32>, Vec<PsProcess>> = HashMap::new();
    for row in rows {
        let parent = row.tree_parent.filter(|p| pids.contains(p));
        children.entry(parent).or_default().push(row);
    }
    for list in children.values_mut() {
        list.sort_by(|a, b| compare(a, b, sort));
    }
    let mut out = Vec::new();
    let mut stack: Vec<PsProcess> = children.remove(&None).unwrap_or_default();
    stack.reverse();
    while let Some(row) = stack.pop() {
        let pid = row.pid;
        out.push(row);
        if let Some(mut kids) = children.remove(&Some(pid)) {
            kids.reverse();
            stack.extend(kids);
        }
    }
    // Rows whose parent chain loops (cannot happen in /proc) would be lost; keep them.
    out.extend(children.into_values().flatten());
    out
}

fn compare(a: &PsProcess, b: &PsProcess, sort: PsSort) -> Ordering {
    let by_mem = || b.used_bytes.cmp(&a.used_bytes);
    let key = match sort {
        PsSort::Mem => by_mem(),
        PsSort::Pid => Ordering::Equal,
        PsSort::Age => b.age_s.cmp(&a.age_s),
        PsSort::Cpu => b
            .cpu_percent
            .partial_cmp(&a.cpu_percent)
            .unwrap_or(Ordering::Equal),
        PsSort::User => match (&a.user, &b.user) {
            (Some(x), Some(y)) => x.cmp(y).then_with(by_mem),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => by_mem(),
        },
    };
    key.then(a.pid.cmp(&b.pid))
}

/// CPU % over each process's lifetime (the default, as ps(1)'s %CPU: no wait, so `ps`
/// costs what `status` does), or from two readings `interval` apart (`--cpu-interval`,
/// which waits that long whenever a listed process is visible).
fn measure_cpu(report: &mut PsReport, interval: Option<Duration>, procs: &ProcReader) {
    let tps = procs.ticks_per_second();
    let Some(interval) = interval else {
        report.cpu_interval_s = None;
        for p in &mut report.processes {
            // Its age from the uptime, as ps(1): `age_s` is whole seconds from a boot time
            // in whole seconds, too coarse for a young process's average. Both clocks count
            // in ticks, so a process younger than one reads as 0 s old: it has lived at
            // least one tick.
            let one_tick = Duration::from_secs(1) / u32::try_from(tps.max(1)).unwrap_or(100);
            let age = p
                .start_time_ticks
                .and_then(|start| procinfo::age_from_uptime(start, tps))
                .or_else(|| p.age_s.map(Duration::from_secs))
                .map(|age| age.max(one_tick));
            if let (Some(ticks), Some(age)) = (p.cpu_ticks, age) {
                p.cpu_percent = procinfo::cpu_percent_lifetime(ticks, age, tps).map(round1);
            }
        }
        return;
    };
    report.cpu_interval_s = Some(interval.as_secs_f64());
    let before: Vec<Option<(u64, u64)>> = report
        .processes
        .iter()
        .map(|p| procs.cpu_reading(p.pid).filter(|_| p.visible))
        .collect();
    if before.iter().all(Option::is_none) {
        // Nothing to measure: no reason to wait (a `ps` of an idle GPU answers at once).
        return;
    }
    let started = Instant::now();
    std::thread::sleep(interval);
    let elapsed = started.elapsed();
    for (p, before) in report.processes.iter_mut().zip(before) {
        let Some((start, ticks_before)) = before else {
            continue;
        };
        if let Some((start_after, ticks_after)) = procs.cpu_reading(p.pid) {
            if start_after == start {
                p.cpu_percent =
                    procinfo::cpu_percent(ticks_before, ticks_after, elapsed, tps).map(round1);
            }
        }
    }
}

/// The allocated and cached memory of each visible process that has an agent, and its
/// OOMs (the first one classified here, on the snapshot its agent kept: bounded as
/// `agent_ooms` bounds it, with the others NVML lists beside it in `snapshot`).
/// A row that `--gpu` left some of the process's GPUs out of shows the agent's figures of
/// the GPUs it lists, as its memory is theirs alone.
fn ask_agents(report: &mut PsReport, snapshot: &Snapshot) {
    let on_gpus = holdings(snapshot, &GpuFilter::default());
    for p in report
        .processes
        .iter_mut()
        .filter(|p| p.visible && !p.zombie)
    {
        let Some(stats) = agent_client::stats_of(p.pid, agent_client::MEMORY_TIMEOUT) else {
            continue;
        };
        let held_on = on_gpus.get(&p.pid).map_or(0, Vec::len);
        p.agent = if p.gpus.len() < held_on {
            agent_poll::agent_memory_over(&stats, p.gpus.iter().map(|g| g.uuid.as_str()))
        } else {
            Some(stats.memory())
        };
        p.oom = agent_ooms::ask_if_counted(p.pid, &stats, snapshot);
    }
}

/// One line on a process's OOMs: how many, the first one's cause and fix (`status` says
/// the same).
pub(super) fn oom_note(pid: u32, oom: &ProcessOoms) -> String {
    let times = if oom.count == 1 {
        "an out-of-memory error".to_owned()
    } else {
        format!("{} out-of-memory errors", oom.count)
    };
    let verdict = match (oom.state, oom.cause.as_deref()) {
        (OomState::Classified, Some(cause)) => format!(
            "the first: {cause}; fix: {}",
            oom.fix
                .as_deref()
                .unwrap_or("none (nothing the process can set avoids it)")
        ),
        _ => format!(
            "the first could not be classified: {}",
            oom.why.as_deref().unwrap_or("no reason given")
        ),
    };
    let others: Vec<String> = oom
        .others_when_seen
        .iter()
        .map(|o| format!("PID {} {}", o.pid, units::bytes(o.used_bytes)))
        .collect();
    let beside = if others.is_empty() {
        String::new()
    } else {
        format!("; on its GPU when it was seen: {}", others.join(", "))
    };
    format!("PID {pid} had {times}; {verdict}{beside}")
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The table and the notes under it; the command column fitted into `width` when known (a
/// terminal, or `COLUMNS`), shortened as everywhere (`command_line::abbreviate`).
fn render(report: &PsReport, width: Option<usize>) -> Vec<String> {
    let with_container = report
        .processes
        .iter()
        .any(|p| p.container_id.is_some() || p.pod_uid.is_some());
    // Only when some process has an agent: the framework's view beside NVML's.
    let with_agent = report.processes.iter().any(|p| p.agent.is_some());
    // Only when some process is in a Slurm job: outputs without jobs stay as they were.
    let with_job = report.processes.iter().any(|p| p.slurm.is_some());
    let mut columns = vec![
        ("PID", Align::Right),
        ("USER", Align::Left),
        ("GPU", Align::Left),
        ("MEMORY", Align::Right),
    ];
    if with_agent {
        columns.push(("ALLOCATED", Align::Right));
        columns.push(("CACHED", Align::Right));
    }
    columns.extend([
        ("CPU%", Align::Right),
        ("RSS", Align::Right),
        ("AGE", Align::Right),
        ("S", Align::Left),
        ("PPID", Align::Right),
    ]);
    if with_container {
        columns.push(("CONTAINER", Align::Left));
        columns.push(("POD", Align::Left));
    }
    if with_job {
        columns.push(("JOB", Align::Left));
    }
    columns.push(("COMMAND", Align::Left));
    let mut table = Table::new(&columns);
    let prefixes = tree_prefixes(report);
    for (p, prefix) in report.processes.iter().zip(&prefixes) {
        let mut cells = vec![
            pid_cell(p, report.pid_mapping),
            p.user.clone().unwrap_or_else(|| "-".into()),
            p.gpus.first().map_or_else(|| "-".into(), gpu_cell),
            p.gpus
                .first()
                .map_or_else(|| "-".into(), |g| units::opt_bytes(g.used_bytes)),
        ];
        if with_agent {
            let agent = p.agent.unwrap_or(AgentMemory {
                allocated_bytes: None,
                cached_bytes: None,
                releasable_bytes: None,
            });
            cells.push(units::opt_bytes(agent.allocated_bytes));
            cells.push(units::opt_bytes(agent.cached_bytes));
        }
        cells.extend([
            p.cpu_percent
                .map_or_else(|| "-".into(), |c| format!("{c:.1}")),
            units::opt_bytes(p.rss_bytes),
            p.age_s.map_or_else(|| "-".into(), units::age),
            p.state.clone().unwrap_or_else(|| "-".into()),
            p.ppid.map_or_else(|| "-".into(), |pp| pp.to_string()),
        ]);
        if with_container {
            // The name when the runtime's state gives one, else the short id.
            let name = p.container.as_ref().and_then(|c| c.name.clone());
            cells.push(name.unwrap_or_else(|| {
                p.container_id
                    .as_deref()
                    .map_or_else(|| "-".into(), |c| c.chars().take(12).collect())
            }));
            // The pod's namespace/name where the kubelet names it, else its UID.
            cells.push(p.kubernetes.as_ref().map_or_else(
                || p.pod_uid.clone().unwrap_or_else(|| "-".into()),
                owners::pod_cell,
            ));
        }
        if with_job {
            cells.push(
                p.slurm
                    .as_ref()
                    .map_or_else(|| "-".into(), owners::job_cell),
            );
        }
        cells.push(format!("{prefix}{}", command_cell(p, None)));
        table.push(cells);
        // A process on several devices: one more line per device.
        for g in p.gpus.iter().skip(1) {
            let mut more = vec![String::new(); columns.len()];
            more[2] = gpu_cell(g);
            more[3] = units::opt_bytes(g.used_bytes);
            table.push(more);
        }
    }
    for u in &report.unaccounted {
        let mut cells = vec![String::new(); columns.len()];
        cells[0] = "-".into();
        cells[1] = "-".into();
        cells[2] = u.index.to_string();
        cells[3] = units::bytes(u.bytes);
        cells[columns.len() - 1] = "(unaccounted: used, but no listed process holds it)".into();
        table.push(cells);
    }
    for o in report.other_holders.iter().flatten() {
        let mut cells = vec![String::new(); columns.len()];
        cells[0] = "-".into();
        cells[1] = "-".into();
        cells[2] = o.index.to_string();
        cells[3] = units::opt_bytes(o.used_bytes);
        cells[columns.len() - 1] = format!(
            "(other containers/processes: {} outside this PID namespace)",
            o.processes
        );
        table.push(cells);
    }

    if let Some(width) = width {
        let room = width.saturating_sub(table.width_before_last());
        // Rows in table order: each process, then its extra devices, then unaccounted.
        let mut owners: Vec<Option<usize>> = Vec::new();
        for (i, p) in report.processes.iter().enumerate() {
            owners.push(Some(i));
            owners.extend(p.gpus.iter().skip(1).map(|_| None));
        }
        table.fit_last(|row, cell| match owners.get(row).copied().flatten() {
            Some(i) if cell.chars().count() > room => {
                let prefix = &prefixes[i];
                let left = room.saturating_sub(prefix.chars().count());
                format!("{prefix}{}", command_cell(&report.processes[i], Some(left)))
            }
            Some(_) => cell.to_owned(),
            None => vramctl_tui::format::fit(cell, room.max(8)),
        });
    }
    let mut lines = Vec::new();
    let others = report.other_holders.as_ref().is_some_and(|o| !o.is_empty());
    if report.processes.is_empty() && report.unaccounted.is_empty() && !others {
        // A filter that hides every holder must not read as "the GPUs are free".
        lines.push(match report.filtered_out {
            0 if report.filter_words.is_empty() => "no process holds GPU memory".to_owned(),
            0 => format!(
                "no process {} holds GPU memory (nor does any other)",
                report.filter_words
            ),
            n => format!(
                "no process {} holds GPU memory ({n} other{} {})",
                report.filter_words,
                if n == 1 { "" } else { "s" },
                if n == 1 { "does" } else { "do" }
            ),
        });
    } else {
        lines.extend(table.render(""));
    }
    let mut notes = Vec::new();
    if report.pid_mapping == "cannot_map" {
        notes.extend(cannot_map_notes(report));
    }
    if report.pid_mapping == "driver_numbered" {
        notes.push(DRIVER_NUMBERED_NOTE.to_owned());
    }
    let hidden = report.processes.iter().filter(|p| !p.visible).count();
    if hidden > 0 && report.pid_mapping != "cannot_map" {
        notes.push(format!(
            "{hidden} {} not visible in this PID namespace (NVML reports host PIDs); run \
             vramctl in the host PID namespace (e.g. docker run --pid=host) to see and act on {}",
            if hidden == 1 {
                "process is"
            } else {
                "processes are"
            },
            if hidden == 1 { "it" } else { "them" },
        ));
    }
    for p in &report.processes {
        if let Some(oom) = &p.oom {
            notes.push(oom_note(p.pid, oom));
        }
    }
    for p in report.processes.iter().filter(|p| p.zombie) {
        notes.push(format!(
            "PID {} is a zombie: it has exited; its parent (PID {}) must reap it",
            p.pid,
            p.ppid.map_or_else(|| "-".into(), |pp| pp.to_string())
        ));
    }
    for d in &report.devices_not_read {
        let what = match d.state {
            "lost" => "lost",
            "error" => "could not be read",
            _ => "did not report its processes",
        };
        notes.push(format!("GPU {} {what}: {}", d.index, d.reason));
    }
    for u in &report.unopened {
        notes.push(format!("GPU {} could not be opened: {}", u.index, u.reason));
    }
    for note in notes {
        lines.extend(wrap(&note, "", width));
    }
    lines
}

/// The PID as shown: a host PID this namespace cannot map is marked `host:`, so that it is
/// never read as one of ours.
fn pid_cell(p: &PsProcess, mapping: &str) -> String {
    if mapping == "cannot_map" {
        format!("host:{}", p.pid)
    } else {
        p.pid.to_string()
    }
}

/// Under `ps`'s and `status`'s tables when NVML's PIDs could not be mapped.
pub(crate) const CANNOT_MAP_NOTE: &str = "PIDs marked host: are NVML's as it gives them (the \
     host's, on drivers that number processes in the host's PID namespace), which nothing \
     here matched with this namespace's processes (no host vramctl daemon answered for it); \
     mount the host's /run/vramctl/daemon.sock into the container (docs/owners.md, \"Inside a \
     container\")";

/// Under `ps`'s and `status`'s tables when the driver numbered NVML's PIDs in this namespace.
pub(crate) const DRIVER_NUMBERED_NOTE: &str = "PIDs are this namespace's: the driver numbers \
     NVML's processes in the caller's PID namespace (each row checked: a process here holding \
     that GPU open); other containers' and the host's processes are not listed, their memory \
     is only in the GPU's used figure (a host vramctl daemon's socket adds them as one figure: \
     docs/owners.md)";

/// What a namespace without a mapping can and cannot say, under the table.
fn cannot_map_notes(report: &PsReport) -> Vec<String> {
    let mut notes = vec![CANNOT_MAP_NOTE.to_owned()];
    let holders = report.gpu_device_holders.as_deref().unwrap_or_default();
    if holders.is_empty() {
        notes.push(
            "no process here holds /dev/nvidia* open (or none whose files can be read)".into(),
        );
    } else {
        let list: Vec<String> = holders
            .iter()
            .map(|h| {
                let command = h
                    .command
                    .as_deref()
                    .map_or_else(String::new, |c| format!(" ({})", abbreviate(c, 40)));
                format!("{}{command}", h.pid)
            })
            .collect();
        notes.push(format!(
            "processes here holding /dev/nvidia* open (which of the rows above each is cannot \
             be told here): {}",
            list.join(", ")
        ));
    }
    notes
}

/// A process's command as shown, in `room` characters when given (interpreter and script
/// first), with a note when /proc cannot see it.
fn command_cell(p: &PsProcess, room: Option<usize>) -> String {
    const NOT_VISIBLE: &str = " (not visible in this PID namespace)";
    const NOT_VISIBLE_SHORT: &str = " (not visible)";
    match (&p.command, p.visible, room) {
        (Some(c), true, None) => c.clone(),
        (Some(c), true, Some(room)) => abbreviate(c, room),
        (Some(c), false, None) => format!("{c}{NOT_VISIBLE}"),
        (Some(c), false, Some(room)) => {
            // In a tight column the note gives way to the command; the line under the
            // table says which processes are not visible.
            let note = if room >= NOT_VISIBLE.len() + 24 {
                NOT_VISIBLE
            } else if room >= NOT_VISIBLE_SHORT.len() + 16 {
                NOT_VISIBLE_SHORT
            } else {
                ""
            };
            format!("{}{note}", abbreviate(c, room.saturating_sub(note.len())))
        }
        (None, _, room) => abbreviate(NOT_VISIBLE.trim_start(), room.unwrap_or(usize::MAX)),
    }
}

fn gpu_cell(g: &GpuHolding) -> String {
    match (g.gpu_instance_id, g.compute_instance_id) {
        (Some(gi), Some(ci)) => format!("{} (GI {gi} CI {ci})", g.index),
        (Some(gi), None) => format!("{} (GI {gi})", g.index),
        _ => g.index.to_string(),
    }
}

/// `├─ ` / `└─ ` and `│  ` before each command, from the rows' `tree_parent` links (rows
/// are in depth-first order). Empty without --tree.
fn tree_prefixes(report: &PsReport) -> Vec<String> {
    let rows = &report.processes;
    if !report.tree {
        return vec![String::new(); rows.len()];
    }
    let position: HashMap<u32, usize> = rows.iter().enumerate().map(|(i, r)| (r.pid, i)).collect();
    let parent_of = |i: usize| rows[i].tree_parent.and_then(|p| position.get(&p).copied());
    // The last child of each parent (None: the roots).
    let mut last_child: HashMap<Option<usize>, usize> = HashMap::new();
    for i in 0..rows.len() {
        last_child.insert(parent_of(i), i);
    }
    let is_last = |i: usize| last_child.get(&parent_of(i)) == Some(&i);
    (0..rows.len())
        .map(|i| {
            let Some(parent) = parent_of(i) else {
                return String::new();
            };
            let mut prefix = String::from(if is_last(i) { "└─ " } else { "├─ " });
            let mut up = parent;
            while let Some(grand) = parent_of(up) {
                prefix.insert_str(0, if is_last(up) { "   " } else { "│  " });
                up = grand;
            }
            prefix
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use vramctl_core::types::ProcessKind;

    use super::*;

    fn holding(index: u32, gib: u64) -> GpuHolding {
        GpuHolding {
            index,
            uuid: format!("GPU-{index}"),
            used_bytes: Some(gib << 30),
            kind: ProcessKind::Compute,
            gpu_instance_id: None,
            compute_instance_id: None,
            mig_uuid: None,
        }
    }

    fn process(pid: u32, command: &str, gpus: Vec<GpuHolding>) -> PsProcess {
        PsProcess {
            pid,
            host_pid: None,
            visible: true,
            start_time_ticks: Some(u64::from(pid) * 10),
            pidfd_id: None,
            user: Some("alice".into()),
            uid: Some(1000),
            command: Some(command.into()),
            state: Some("S".into()),
            zombie: false,
            ppid: Some(1),
            children: Vec::new(),
            started_at: None,
            age_s: Some(3 * 3600 + 720),
            cpu_percent: Some(98.5),
            rss_bytes: Some(2_254_857_830),
            threads: Some(12),
            container_id: None,
            pod_uid: None,
            cgroup: None,
            slurm: None,
            container: None,
            pod_qos: None,
            kubernetes: None,
            used_bytes: total_bytes(&gpus),
            gpus,
            tree_parent: None,
            agent: None,
            oom: None,
            cpu_ticks: None,
        }
    }

    /// A trainer on two GPUs with four data-loader workers (one of them holding a context
    /// of its own), a Jupyter kernel in a pod, a zombie, a MIG process, a PID from another
    /// namespace, unaccounted memory and a lost GPU.
    fn report() -> PsReport {
        let mut trainer = process(
            4100,
            "python train.py --bf16",
            vec![holding(0, 40), holding(1, 38)],
        );
        trainer.children = vec![4101, 4102];
        let mut rows = vec![trainer];
        for (pid, gpu) in [(4101, Some(holding(0, 1))), (4102, None)] {
            let mut worker = process(pid, "python train.py --bf16", gpu.into_iter().collect());
            worker.tree_parent = Some(4100);
            worker.ppid = Some(4100);
            worker.cpu_percent = Some(45.0);
            worker.age_s = Some(3 * 3600 + 700);
            rows.push(worker);
        }
        let mut grandchild = process(4103, "pt_data_worker", Vec::new());
        grandchild.tree_parent = Some(4102);
        grandchild.ppid = Some(4102);
        rows.push(grandchild);
        let mut kernel = process(
            5200,
            "python -m ipykernel_launcher -f k.json",
            vec![holding(2, 12)],
        );
        kernel.user = Some("bob".into());
        kernel.uid = Some(1001);
        kernel.cpu_percent = Some(0.0);
        kernel.age_s = Some(2 * 86_400 + 4 * 3600);
        kernel.container_id =
            Some("3f0c2b7a9d8e4f61a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70819".into());
        kernel.pod_uid = Some("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into());
        rows.push(kernel);
        let mut zombie = process(6100, "[python] <defunct>", vec![holding(2, 2)]);
        zombie.state = Some("Z".into());
        zombie.zombie = true;
        zombie.ppid = Some(6000);
        zombie.cpu_percent = None;
        rows.push(zombie);
        let mut mig = holding(3, 9);
        mig.gpu_instance_id = Some(2);
        mig.compute_instance_id = Some(0);
        rows.push(process(7100, "python eval.py --mig", vec![mig]));
        let mut ghost = process(31001, "python serve.py", vec![holding(2, 20)]);
        ghost.visible = false;
        ghost.user = None;
        ghost.uid = None;
        ghost.state = None;
        ghost.ppid = None;
        ghost.age_s = None;
        ghost.cpu_percent = None;
        ghost.rss_bytes = None;
        rows.push(ghost);
        PsReport {
            schema: SCHEMA,
            taken_at: "2026-01-01T00:00:00.000Z".into(),
            pid_namespace_initial: true,
            pid_mapping: "same",
            pid_mapping_reason: None,
            other_holders: None,
            gpu_device_holders: None,
            by: None,
            owners: None,
            cpu_interval_s: Some(0.2),
            tree: true,
            processes: rows,
            filtered_out: 0,
            filter_words: String::new(),
            unaccounted: vec![Unaccounted {
                index: 0,
                uuid: "GPU-0".into(),
                bytes: 1536 << 20,
            }],
            devices_not_read: vec![DeviceProblem {
                index: 4,
                uuid: "GPU-4".into(),
                state: "lost",
                reason: "GPU has fallen off the bus".into(),
            }],
            unopened: vec![UnopenedDevice {
                index: 5,
                reason: "GPU lost".into(),
            }],
        }
    }

    #[test]
    fn the_table_with_every_kind_of_row() {
        insta::assert_snapshot!("ps_every_row", render(&report(), None).join("\n"));
    }

    #[test]
    fn allocated_and_cached_columns_appear_when_a_process_has_an_agent() {
        let mut with = process(4242, "python3 train.py", vec![holding(0, 21)]);
        with.agent = Some(AgentMemory {
            allocated_bytes: Some(1 << 30),
            cached_bytes: Some(20 << 30),
            releasable_bytes: Some(20 << 30),
        });
        let without = process(4343, "python3 serve.py", vec![holding(0, 2)]);
        let mut report = report();
        report.processes = vec![with, without];
        report.unaccounted.clear();
        let text = render(&report, None).join("\n");
        let header = text
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(header.contains("MEMORY ALLOCATED CACHED CPU%"), "{text}");
        // Cells with single spaces between them.
        let row = |pid: &str| {
            let line = text.lines().find(|l| l.trim_start().starts_with(pid));
            line.unwrap_or_default()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert!(
            row("4242").contains("21.0 GiB 1.0 GiB 20.0 GiB 98.5"),
            "{text}"
        );
        assert!(row("4343").contains("2.0 GiB - - 98.5"), "{text}");
        // Without an agent anywhere, the table is as it always was.
        let mut plain = report;
        plain.processes[0].agent = None;
        assert!(!render(&plain, None).join("\n").contains("CACHED"));
    }

    #[test]
    fn the_table_fits_the_terminal_with_commands_shortened_alike() {
        // Without the container columns (64-hex ids and pod UIDs need a wide terminal).
        let mut r = report();
        for p in &mut r.processes {
            p.container_id = None;
            p.pod_uid = None;
        }
        r.processes[0].command = Some(
            "/opt/torch/.venv/bin/python3 /home/labuser/work/train.py --bf16 --lr 3e-4".into(),
        );
        let lines = render(&r, Some(100));
        for line in &lines {
            assert!(line.chars().count() <= 100, "{line}");
        }
        insta::assert_snapshot!("ps_every_row_100_columns", lines.join("\n"));
    }

    #[test]
    fn tree_prefixes_follow_the_parent_links() {
        let prefixes = tree_prefixes(&report());
        assert_eq!(prefixes[..4], ["", "├─ ", "└─ ", "   └─ "]);
        assert!(prefixes[4..].iter().all(String::is_empty));
        let flat = PsReport {
            tree: false,
            ..report()
        };
        assert!(tree_prefixes(&flat).iter().all(String::is_empty));
    }

    #[test]
    fn tree_order_is_depth_first_with_sorted_siblings() {
        let mut rows = report().processes;
        rows.reverse();
        let ordered: Vec<u32> = tree_order(rows, PsSort::Mem)
            .iter()
            .map(|r| r.pid)
            .collect();
        // Roots by memory (the trainer's 78 GiB first), each followed by its subtree.
        assert_eq!(ordered, [4100, 4101, 4102, 4103, 31001, 5200, 7100, 6100]);
        let rows = report().processes;
        let ordered: Vec<u32> = tree_order(rows, PsSort::Pid)
            .iter()
            .map(|r| r.pid)
            .collect();
        assert_eq!(ordered, [4100, 4101, 4102, 4103, 5200, 6100, 7100, 31001]);
    }

    #[test]
    fn sorting_keys() {
        let rows = report().processes;
        let order = |sort| {
            let mut rows: Vec<PsProcess> = rows
                .iter()
                .filter(|r| r.tree_parent.is_none())
                .cloned()
                .collect();
            rows.sort_by(|a, b| compare(a, b, sort));
            rows.iter().map(|r| r.pid).collect::<Vec<u32>>()
        };
        assert_eq!(order(PsSort::Mem), [4100, 31001, 5200, 7100, 6100]);
        assert_eq!(order(PsSort::Age), [5200, 4100, 6100, 7100, 31001]);
        assert_eq!(order(PsSort::Cpu), [4100, 7100, 5200, 6100, 31001]);
        assert_eq!(order(PsSort::User), [4100, 7100, 6100, 5200, 31001]);
    }

    #[test]
    fn selection_by_user_pattern_and_size() {
        let rows = report().processes;
        let keep = |selection: Selection| -> Vec<u32> {
            rows.iter()
                .filter(|r| selection.keeps(r))
                .map(|r| r.pid)
                .collect()
        };
        let none = || Selection {
            users: Vec::new(),
            pattern: None,
            min_bytes: None,
        };
        assert_eq!(
            keep(Selection {
                users: vec![UserSpec {
                    name: Some("bob".into()),
                    uid: 1001,
                }],
                ..none()
            }),
            [5200]
        );
        assert_eq!(
            keep(Selection {
                users: vec![UserSpec {
                    name: None,
                    uid: 1000,
                }],
                ..none()
            })
            .len(),
            6
        );
        assert_eq!(
            keep(Selection {
                pattern: Some(Regex::new("ipykernel|serve").unwrap()),
                ..none()
            }),
            [5200, 31001]
        );
        assert_eq!(
            keep(Selection {
                min_bytes: Some(12 << 30),
                ..none()
            }),
            [4100, 5200, 31001]
        );
    }
}
