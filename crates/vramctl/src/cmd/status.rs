//! `vramctl status`: devices and the processes holding their memory, now.
//!
//! One snapshot, joined with /proc (user, command line), printed as a per-device block or
//! as JSON (`docs/json.md`, schema 1). The snapshot comes from a running daemon when one
//! answers (`vramctl_observe::live_source`: no NVML start-up), else from NVML here; `--no-daemon`
//! always reads NVML here. The output is the same either way. `--watch` refreshes in place
//! (NDJSON with `--json`), asking the daemon each time, or keeping one NVML session.
//!
//! `--replay DB --at TIME` shows a recorded moment the same way: the sampler runs on the
//! store's replay backend (`vramctl_store::replay`), timed at the recorded time, and the
//! processes are who the recorder saw. What a history does not keep is shown as not
//! reported (`null` in JSON, `-` in the text): the driver's versions, the process type
//! (compute or graphics), MIG instance ids, sanity drops (`dropped`), unopened devices
//! (`unopened`), and reasons for missing values that have no series.

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, anyhow, bail};
use jiff::tz::TimeZone;
use serde::Serialize;
use vramctl_agent::agent_client::{self, AgentMemory, Stats};
use vramctl_agent::agent_poll;
use vramctl_core::clock::ManualClock;
use vramctl_core::command_line::abbreviate;
use vramctl_core::types::{
    DeviceSnapshot, DeviceState, DriverInfo, MemoryReading, ProcessKind, ProcessUsage, Snapshot,
};
use vramctl_core::untrusted::escape;
use vramctl_core::wall_time::{self, When};
use vramctl_kube::{PodContainer, ProcessPod};
use vramctl_observe::agent_ooms::{self, ProcessOoms};
use vramctl_observe::gpu_holdings::holdings;
use vramctl_observe::live_loop::sampler_on;
use vramctl_observe::observation::Observation;
use vramctl_observe::owners::{self, OwnerKey, OwnerTotal};
use vramctl_observe::pid_view::PidView;
use vramctl_procs::container::ContainerFacts;
use vramctl_procs::slurm::SlurmJob;
use vramctl_store::format::rfc3339;
use vramctl_store::replay::{MomentLookup, RecordedProcesses, ReplayBackend};

use vramctl_observe::gpu_selection::GpuFilter;

use super::open_live;
use crate::cli::{GlobalArgs, StatusArgs};
use crate::exit::Exit;
use crate::output::emit::{Format, Lines, emit};
use crate::output::owners::owner_table;
use crate::output::style::{Styles, paint};
use crate::output::table::{Align, Table};
use crate::output::terminal::{self, fit_line, wrap};
use vramctl_observe::units;

/// Version of the JSON below; bumped on any incompatible change.
pub const SCHEMA: u32 = 1;

/// The whole `status --json` document.
#[derive(Debug, Serialize)]
pub struct StatusReport {
    schema: u32,
    /// RFC 3339 UTC.
    taken_at: String,
    /// The same moment, for the text's header (in the zone of `--tz`).
    #[serde(skip)]
    taken_at_unix_ms: i64,
    driver: DriverInfo,
    devices: Vec<DeviceStatus>,
    /// `None`: replayed (a history does not keep them).
    unopened: Option<Vec<UnopenedStatus>>,
    /// Where a replayed moment comes from; absent live.
    #[serde(skip_serializing_if = "Option::is_none")]
    replay: Option<ReplayStatus>,
    /// With `--by`: the key each device's `owners` are grouped by.
    #[serde(skip_serializing_if = "Option::is_none")]
    by: Option<OwnerKey>,
    /// What the listed PIDs are (`ps --json` has the same): `same`, `mapped` (a host
    /// daemon answered for this PID namespace), `driver_numbered` (the driver numbered them in
    /// this namespace, checked), `cannot_map` (NVML's PIDs, unmatched).
    pid_mapping: &'static str,
}

#[derive(Debug, Serialize)]
struct ReplayStatus {
    /// The history database.
    database: String,
    /// The moment asked for (RFC 3339 UTC); `taken_at` is the recorded one shown.
    at: String,
    /// How much older than `at` the sample shown is (0 without `--at`).
    sample_age_ms: i64,
    /// Why the sample is older than the recording's spacing (the recording had ended or
    /// paused by `at`), said in the text output too; `None` when it is not.
    stale: Option<String>,
}

#[derive(Debug, Serialize)]
struct UnopenedStatus {
    index: u32,
    reason: String,
}

#[derive(Debug, Serialize)]
struct DeviceStatus {
    index: u32,
    uuid: String,
    name: Option<String>,
    pci_bus_id: Option<String>,
    /// `ok`, `lost` or `error`.
    state: &'static str,
    error: Option<String>,
    memory: Option<MemoryReading>,
    utilization_gpu_percent: Option<u32>,
    utilization_memory_percent: Option<u32>,
    temperature_c: Option<u32>,
    power_mw: Option<u32>,
    unaccounted_bytes: Option<u64>,
    processes: Option<Vec<ProcessStatus>>,
    mig_instances: Vec<MigStatus>,
    /// The Kubernetes pod containers the kubelet gave this GPU or its MIG instances
    /// (docs/owners.md); absent off Kubernetes, when none, and replayed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    allocated_to: Vec<PodContainer>,
    missing: BTreeMap<&'static str, String>,
    /// `None`: replayed (a history does not keep them).
    dropped: Option<Vec<DroppedStatus>>,
    /// With `pid_mapping: mapped`: memory of processes outside this PID namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    other_holders: Option<OtherHoldersStatus>,
    /// With `--by`: the key, for the text (the report says it once).
    #[serde(skip)]
    by: Option<OwnerKey>,
    /// With `--by`: memory per owner on this GPU (docs/owners.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    owners: Option<Vec<OwnerTotal>>,
}

/// Memory on one GPU of processes of other containers or of the host.
#[derive(Debug, Serialize)]
struct OtherHoldersStatus {
    processes: u32,
    used_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
struct ProcessStatus {
    pid: u32,
    /// NVML's (the host's) PID where it is not `pid` or cannot be mapped here.
    #[serde(skip_serializing_if = "Option::is_none")]
    host_pid: Option<u32>,
    /// Whether /proc in this PID namespace shows the process.
    visible: bool,
    user: Option<String>,
    command: Option<String>,
    /// Its cgroup v2 path; absent when not known (not visible, no cgroup v2, replayed).
    #[serde(skip_serializing_if = "Option::is_none")]
    cgroup: Option<String>,
    /// Its Slurm job; absent when it is in none (or not visible, or replayed: a history
    /// keeps only the job id).
    #[serde(skip_serializing_if = "Option::is_none")]
    slurm: Option<SlurmJob>,
    /// Its container's id, runtime, name and rootless owner; absent outside a container
    /// (a replay knows the id only).
    #[serde(skip_serializing_if = "Option::is_none")]
    container: Option<ContainerFacts>,
    /// Its Kubernetes pod and container (docs/owners.md); absent when not in a pod the
    /// kubelet names, and replayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    kubernetes: Option<ProcessPod>,
    used_bytes: Option<u64>,
    /// What the process's in-process agent says about this GPU (allocated, cached,
    /// releasable), as `ps` shows it; absent for a process without one (docs/agent.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    agent: Option<AgentMemory>,
    /// The CUDA out-of-memory errors its agent reported (all its GPUs), with the first
    /// one's cause and fix, as `ps --json` has them; absent without an agent or an OOM.
    #[serde(skip_serializing_if = "Option::is_none")]
    oom: Option<ProcessOoms>,
    /// `None`: replayed (a history does not keep it).
    kind: Option<ProcessKind>,
    gpu_instance_id: Option<u32>,
    compute_instance_id: Option<u32>,
}

#[derive(Debug, Serialize)]
struct MigStatus {
    uuid: String,
    name: Option<String>,
    gpu_instance_id: Option<u32>,
    compute_instance_id: Option<u32>,
    memory: Option<MemoryReading>,
}

#[derive(Debug, Serialize)]
struct DroppedStatus {
    what: String,
    reason: String,
}

/// Runs `status`.
pub fn run(global: &GlobalArgs, args: &StatusArgs) -> anyhow::Result<Exit> {
    if let Some(db) = &args.replay {
        return replay(global, db, args);
    }
    let interval = args.watch;
    let tz = wall_time::zone(args.tz.as_deref())?;
    let mut source = open_live(global, args.no_daemon, false)?;
    let filter = GpuFilter::new(&args.gpu.selectors, &source.devices())?;
    let styles = Styles::for_stdout(global.color);
    let stdout = std::io::stdout();
    let refresh_in_place = !args.json && stdout.is_terminal();
    // Read once: a terminal resized under `--watch` is fitted from the next run on.
    let width = terminal::width();

    let mut printed: u64 = 0;
    loop {
        let started = Instant::now();
        let snapshot = source.sample()?;
        let sampled = started.elapsed();
        let observation = source.observe(snapshot);
        let snapshot = &observation.snapshot;
        let mut report = build(snapshot, &filter, &mut Holders::Live(&observation));
        apply_pid_view(&mut report, source.pid_view());
        ask_agents(&mut report, snapshot);
        if let Some(key) = args.by {
            group_by_owner(&mut report, key, &observation, &filter);
        }
        tracing::debug!(
            daemon = source.from_daemon(),
            tick_ms = sampled.as_secs_f64() * 1e3,
            proc_ms = (started.elapsed() - sampled).as_secs_f64() * 1e3,
            "Sampled."
        );
        let mut out = stdout.lock();
        if interval.is_some() && refresh_in_place {
            // Home and clear, so the block redraws in place.
            write!(out, "\x1b[H\x1b[2J").context("cannot write to stdout")?;
        }
        print(&mut out, &report, args, &styles, &tz, width)?;
        drop(out);
        printed += 1;
        let Some(interval) = interval else {
            source.end_for_exit();
            break;
        };
        if args.count.is_some_and(|count| printed >= count) {
            break;
        }
        if !args.json && !refresh_in_place {
            writeln!(stdout.lock()).context("cannot write to stdout")?;
        }
        std::thread::sleep(interval.saturating_sub(started.elapsed()));
    }
    Ok(Exit::Ok)
}

/// What the PIDs are: each process's host PID where it differs or cannot be mapped, and
/// with a daemon's mapping the others' memory per GPU (no longer "unaccounted").
fn apply_pid_view(report: &mut StatusReport, view: &PidView) {
    report.pid_mapping = view.mode();
    for device in &mut report.devices {
        for p in device.processes.iter_mut().flatten() {
            p.host_pid = view.host_pid(p.pid);
        }
        if let Some(others) = view.others_on(device.index) {
            if let (Some(unaccounted), Some(bytes)) = (device.unaccounted_bytes, others.used_bytes)
            {
                device.unaccounted_bytes = Some(unaccounted.saturating_sub(bytes));
            }
            device.other_holders = Some(OtherHoldersStatus {
                processes: others.processes,
                used_bytes: others.used_bytes,
            });
        }
    }
}

/// `--by KEY`: each device's processes grouped by owner, in place of its process rows.
fn group_by_owner(
    report: &mut StatusReport,
    key: OwnerKey,
    observation: &Observation,
    filter: &GpuFilter,
) {
    let totals = owners::totals(
        key,
        &holdings(&observation.snapshot, filter),
        &observation.hosts,
    );
    report.by = Some(key);
    for device in &mut report.devices {
        device.by = Some(key);
        device.owners = Some(
            totals
                .iter()
                .filter(|t| t.gpu == device.index)
                .cloned()
                .collect(),
        );
    }
}

/// `--replay DB --at TIME`: the recorded moment at or before TIME, through the same sampler
/// and report as now, on the store's replay backend.
fn replay(global: &GlobalArgs, db: &Path, args: &StatusArgs) -> anyhow::Result<Exit> {
    let tz = wall_time::zone(args.tz.as_deref())?;
    let mut store = super::open_history(db).map_err(|err| {
        use vramctl_store::StoreError;
        // The store's hints name --db, which --replay does not read.
        match err.downcast_ref::<StoreError>() {
            Some(
                found @ (StoreError::NotFound { .. }
                | StoreError::NotOurs { .. }
                | StoreError::IsDirectory { .. }),
            ) => anyhow!("{found}; point --replay at a vramctl history file"),
            _ => err,
        }
    })?;
    let now = jiff::Timestamp::now().as_millisecond();
    // `all` is the end of time: the last sample, as with no --at.
    let at = args.at.as_ref().filter(|at| !matches!(at, When::All));
    let asked = at
        .map(|at| at.resolve(now, &tz))
        .transpose()
        .context("--at")?;
    let shown_at = || at.map(ToString::to_string).unwrap_or_default();
    let (moment, stale) = match store.moment_near(asked)? {
        MomentLookup::Found(moment) => (*moment, None),
        MomentLookup::Empty => bail!(
            "'{}' holds no samples; record some with 'vramctl record'",
            db.display()
        ),
        MomentLookup::BeforeFirst { first_ms } => bail!(
            "'{}' has no sample at or before --at '{}'; its first is at {}",
            db.display(),
            shown_at(),
            rfc3339(first_ms)
        ),
        // The README's promise: the last sample at or before WHEN, however old, saying how
        // old (a time before the first sample has none, and stays an error).
        MomentLookup::AfterLast { last_ms } => (
            last_sample_before(&mut store, db, asked)?,
            Some(format!("the recording ended at {}", rfc3339(last_ms))),
        ),
        MomentLookup::InGap {
            stops_ms,
            resumes_ms,
        } => (
            last_sample_before(&mut store, db, asked)?,
            Some(format!(
                "the recording paused at {} and resumed at {}",
                rfc3339(stops_ms),
                rfc3339(resumes_ms)
            )),
        ),
    };
    let holders = RecordedProcesses::of(&moment);
    let recorded_at = moment.at_unix_ms;
    // Timed at the recorded moment: the snapshot's time is the recording's.
    let mut sampler = sampler_on(
        Box::new(ReplayBackend::new(moment)),
        Box::new(ManualClock::new(recorded_at)),
        false,
    )
    .context("cannot list the recorded GPUs")?;
    let filter = GpuFilter::new(&args.gpu.selectors, sampler.devices())?;
    let snapshot = sampler.tick();
    let mut report = build(&snapshot, &filter, &mut Holders::Recorded(&holders));
    report.replay = Some(ReplayStatus {
        database: db.display().to_string(),
        at: rfc3339(asked.unwrap_or(recorded_at)),
        sample_age_ms: asked.map_or(0, |a| a.saturating_sub(recorded_at)),
        stale,
    });
    let styles = Styles::for_stdout(global.color);
    print(
        &mut std::io::stdout().lock(),
        &report,
        args,
        &styles,
        &tz,
        terminal::width(),
    )?;
    Ok(Exit::Ok)
}

/// The last sample at or before `asked` (which the lookup found to exist).
fn last_sample_before(
    store: &mut vramctl_store::Store,
    db: &Path,
    asked: Option<i64>,
) -> anyhow::Result<vramctl_store::replay::RecordedMoment> {
    store
        .moment_at_or_before(asked.unwrap_or(i64::MAX))?
        .ok_or_else(|| anyhow!("'{}' lost its samples while it was read", db.display()))
}

/// One report, as JSON or as text.
fn print(
    out: &mut impl Write,
    report: &StatusReport,
    args: &StatusArgs,
    styles: &Styles,
    tz: &TimeZone,
    width: Option<usize>,
) -> anyhow::Result<()> {
    // Styled: the renderers escape what processes chose where they format it.
    emit(
        &mut *out,
        Format::from_json_flag(args.json, Format::JsonLine),
        || report,
        || {
            Lines::Styled(if args.compact {
                render_compact(report, styles, tz, width)
            } else {
                render(report, styles, tz, width)
            })
        },
    )?;
    out.flush().context("cannot write to stdout")
}

/// Whether a process is visible, its user, command line, cgroup, container and Slurm job.
type Who = (
    bool,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<ContainerFacts>,
    Option<SlurmJob>,
);

/// Who the processes of a snapshot are.
enum Holders<'a> {
    /// Now: the observation of a daemon's facts or this process's /proc (the driver names
    /// what /proc cannot see), `vramctl_observe::live_source`.
    Live(&'a Observation),
    /// A recorded moment: who the recorder saw.
    Recorded(&'a RecordedProcesses),
}

impl Holders<'_> {
    /// Whether /proc (the recorder's, in a replay) showed `pid`, with its user, command
    /// line and cgroup; for a process it could not see, the driver's name.
    fn who(&mut self, pid: u32) -> Who {
        match self {
            Self::Live(observation) => match observation.hosts.get(&pid) {
                Some(host) => (
                    true,
                    host.user.clone(),
                    Some(host.command.clone()),
                    host.cgroup.clone(),
                    host.container.clone(),
                    host.slurm.clone(),
                ),
                // Not in this PID namespace: the driver still knows the name.
                None => (
                    false,
                    None,
                    observation.driver_names.get(&pid).cloned(),
                    None,
                    None,
                    None,
                ),
            },
            Self::Recorded(recorded) => match recorded.get(pid) {
                Some(process) => {
                    let facts = process.facts();
                    (
                        process.visible(),
                        facts.user_or_uid(),
                        facts.command,
                        facts.container.cgroup.clone(),
                        // The history keeps the container's id only.
                        facts.container.facts(),
                        facts.slurm,
                    )
                }
                None => (false, None, None, None, None, None),
            },
        }
    }

    fn replayed(&self) -> bool {
        matches!(self, Self::Recorded(_))
    }

    /// The pod of `pid`, live only (a history does not keep it).
    fn kubernetes(&self, pid: u32) -> Option<ProcessPod> {
        match self {
            Self::Live(observation) => observation.hosts.get(&pid)?.kubernetes.clone(),
            Self::Recorded(_) => None,
        }
    }

    /// Who the kubelet gave the GPU `uuid`, live only.
    fn allocated_to(&self, uuid: &str) -> Vec<PodContainer> {
        match self {
            Self::Live(observation) => observation
                .kubernetes_gpus
                .get(uuid)
                .cloned()
                .unwrap_or_default(),
            Self::Recorded(_) => Vec::new(),
        }
    }
}

/// The allocated and cached memory, per GPU, of each visible process that has an agent:
/// asked once per process as `ps` asks (`agent_client::stats_of`, `MEMORY_TIMEOUT` each),
/// here in the client, so a daemon's answer and NVML read here show the same.
fn ask_agents(report: &mut StatusReport, snapshot: &Snapshot) {
    let mut gpus_of: HashMap<u32, usize> = HashMap::new();
    for pid in snapshot
        .devices
        .iter()
        .filter_map(|d| d.reading()?.processes.as_ref())
        .flatten()
        .map(|p| p.pid)
    {
        *gpus_of.entry(pid).or_default() += 1;
    }
    let mut stats: HashMap<u32, Option<Stats>> = HashMap::new();
    let mut ooms: HashMap<u32, Option<ProcessOoms>> = HashMap::new();
    for device in &mut report.devices {
        for p in device.processes.iter_mut().flatten().filter(|p| p.visible) {
            let answer = stats
                .entry(p.pid)
                .or_insert_with(|| agent_client::stats_of(p.pid, agent_client::MEMORY_TIMEOUT));
            let only_gpu = gpus_of.get(&p.pid) == Some(&1);
            p.agent = answer
                .as_ref()
                .and_then(|s| agent_poll::agent_memory_on(s, &device.uuid, only_gpu));
            p.oom = ooms
                .entry(p.pid)
                .or_insert_with(|| {
                    answer
                        .as_ref()
                        .and_then(|s| agent_ooms::ask_if_counted(p.pid, s, snapshot))
                })
                .clone();
        }
    }
}

/// The report of a snapshot and who its processes are.
fn build(snapshot: &Snapshot, filter: &GpuFilter, holders: &mut Holders<'_>) -> StatusReport {
    let devices = snapshot
        .devices
        .iter()
        .filter(|d| filter.matches(&d.info))
        .map(|d| device_status(d, holders))
        .collect();
    StatusReport {
        schema: SCHEMA,
        taken_at: rfc3339(snapshot.taken_at_unix_ms),
        taken_at_unix_ms: snapshot.taken_at_unix_ms,
        driver: (*snapshot.driver).clone(),
        devices,
        unopened: (!holders.replayed()).then(|| {
            snapshot
                .unopened
                .iter()
                .map(|u| UnopenedStatus {
                    index: u.index,
                    reason: u.reason.to_string(),
                })
                .collect()
        }),
        replay: None,
        by: None,
        pid_mapping: "same",
    }
}

fn device_status(device: &DeviceSnapshot, holders: &mut Holders<'_>) -> DeviceStatus {
    let info = &device.info;
    let mut status = DeviceStatus {
        index: info.index,
        uuid: info.uuid.clone(),
        name: info.name.clone(),
        pci_bus_id: info.pci_bus_id.clone(),
        state: "ok",
        error: None,
        memory: None,
        utilization_gpu_percent: None,
        utilization_memory_percent: None,
        temperature_c: None,
        power_mw: None,
        unaccounted_bytes: None,
        processes: None,
        mig_instances: Vec::new(),
        // Said for a lost GPU too: the kubelet's allocation does not depend on its state.
        allocated_to: holders.allocated_to(&info.uuid),
        missing: BTreeMap::new(),
        dropped: (!holders.replayed()).then(Vec::new),
        other_holders: None,
        by: None,
        owners: None,
    };
    let reading = match &device.state {
        DeviceState::Ok(reading) => reading,
        DeviceState::Lost { reason } => {
            status.state = "lost";
            status.error = Some(reason.clone());
            return status;
        }
        DeviceState::Error { reason } => {
            status.state = "error";
            status.error = Some(reason.clone());
            return status;
        }
    };
    status.memory = reading.memory;
    status.utilization_gpu_percent = reading.utilization_gpu_percent;
    status.utilization_memory_percent = reading.utilization_memory_percent;
    status.temperature_c = reading.temperature_c;
    status.power_mw = reading.power_mw;
    status.unaccounted_bytes = reading.unaccounted_bytes();
    status.processes = reading.processes.as_ref().map(|list| {
        let mut list: Vec<ProcessStatus> =
            list.iter().map(|p| process_status(p, holders)).collect();
        // Biggest holders first: the question is "who has my memory".
        list.sort_by(|a, b| b.used_bytes.cmp(&a.used_bytes).then(a.pid.cmp(&b.pid)));
        list
    });
    status.mig_instances = info
        .mig_instances
        .iter()
        .map(|mig| MigStatus {
            uuid: mig.uuid.clone(),
            name: mig.name.clone(),
            gpu_instance_id: mig.gpu_instance_id,
            compute_instance_id: mig.compute_instance_id,
            memory: reading.mig_memory(&mig.uuid),
        })
        .collect();
    status.missing = reading
        .missing
        .iter()
        .map(|(field, why)| (field.as_str(), why.to_string()))
        .collect();
    if let Some(dropped) = &mut status.dropped {
        dropped.extend(reading.dropped.iter().map(|d| DroppedStatus {
            what: d.what.clone(),
            reason: d.reason.clone(),
        }));
    }
    status
}

fn process_status(process: &ProcessUsage, holders: &mut Holders<'_>) -> ProcessStatus {
    let (visible, user, command, cgroup, container, slurm) = holders.who(process.pid);
    ProcessStatus {
        pid: process.pid,
        host_pid: None,
        visible,
        user,
        command,
        cgroup,
        container,
        slurm,
        kubernetes: holders.kubernetes(process.pid),
        used_bytes: process.used_bytes,
        agent: None,
        oom: None,
        // A history does not keep which list named a process.
        kind: (!holders.replayed()).then_some(process.kind),
        gpu_instance_id: process.gpu_instance_id,
        compute_instance_id: process.compute_instance_id,
    }
}

/// The memory bar's width when nothing limits it (output to a pipe or a file).
const BAR_WIDTH: usize = 30;
/// Narrowest and widest bar when fitting a terminal.
const BAR_MIN: usize = 10;
const BAR_MAX: usize = 50;
/// Said after the command of a process /proc cannot see; the short form when the room is
/// tight.
const NOT_VISIBLE: &str = " (not visible in this PID namespace)";
const NOT_VISIBLE_SHORT: &str = " (not visible)";

/// The human view, one block per device, fitted to `width` columns when known (a terminal,
/// or `COLUMNS`): no line longer than that. `None`: nothing is cut.
fn render(
    report: &StatusReport,
    styles: &Styles,
    tz: &TimeZone,
    width: Option<usize>,
) -> Vec<String> {
    let mut lines = Vec::new();
    lines.push(paint(styles.dim, &fit_line(&header(report, tz), width)));
    lines.extend(stale_line(report, tz));
    if report.devices.is_empty() && report.unopened.as_ref().is_none_or(Vec::is_empty) {
        lines.push("no NVIDIA GPU found".into());
    }
    for device in &report.devices {
        lines.push(String::new());
        render_device(device, styles, width, &mut lines);
    }
    for unopened in report.unopened.iter().flatten() {
        lines.push(String::new());
        let heading = format!("GPU {}", unopened.index);
        let text = fit_line(
            &format!("could not be opened: {}", unopened.reason),
            width.map(|w| w.saturating_sub(heading.chars().count() + 2)),
        );
        lines.push(format!(
            "{}  {}",
            paint(styles.heading, &heading),
            paint(styles.bad, &text)
        ));
    }
    // A running process that hit an OOM: one note each (a process on several GPUs once),
    // worded as `ps` words it.
    let mut noted = std::collections::BTreeSet::new();
    let mut oom_lines = Vec::new();
    for p in report
        .devices
        .iter()
        .filter_map(|d| d.processes.as_ref())
        .flatten()
    {
        if let Some(oom) = p.oom.as_ref().filter(|_| noted.insert(p.pid)) {
            oom_lines.extend(wrap(&super::ps::oom_note(p.pid, oom), "", width));
        }
    }
    if !oom_lines.is_empty() {
        lines.push(String::new());
        lines.extend(oom_lines);
    }
    let note = match report.pid_mapping {
        "cannot_map" => Some(super::ps::CANNOT_MAP_NOTE),
        "driver_numbered" => Some(super::ps::DRIVER_NUMBERED_NOTE),
        _ => None,
    };
    if let Some(note) = note {
        lines.push(String::new());
        lines.extend(wrap(note, "", width));
    }
    lines
}

/// The version, the driver and the time (local, or `--tz`, labelled with its zone: people
/// read this line; the JSON keeps RFC 3339 UTC).
fn header(report: &StatusReport, tz: &TimeZone) -> String {
    let mut header = vec![format!("vramctl {}", env!("CARGO_PKG_VERSION"))];
    if let Some(v) = &report.driver.driver_version {
        header.push(format!("driver {v}"));
    }
    header.push(wall_time::labelled(tz, report.taken_at_unix_ms));
    if let Some(replay) = &report.replay {
        header.push(format!("recorded in {}", replay.database));
    }
    header.join(" · ")
}

/// In a replay whose sample is older than the recording's spacing: how old, and why.
fn stale_line(report: &StatusReport, tz: &TimeZone) -> Option<String> {
    let replay = report.replay.as_ref()?;
    let why = replay.stale.as_ref()?;
    Some(format!(
        "the last sample at or before {} is {} older: {why}",
        wall_time::labelled(
            tz,
            report.taken_at_unix_ms.saturating_add(replay.sample_age_ms)
        ),
        units::age(u64::try_from(replay.sample_age_ms / 1000).unwrap_or(0)),
    ))
}

fn render_device(d: &DeviceStatus, styles: &Styles, width: Option<usize>, lines: &mut Vec<String>) {
    let name = d.name.as_deref().unwrap_or("(name not reported)");
    let heading = format!("GPU {}  {name}", d.index);
    // The UUID is the identity; the bus id goes first when the line is too long.
    let mut ids = format!("{}  {}", d.uuid, d.pci_bus_id.as_deref().unwrap_or(""))
        .trim_end()
        .to_owned();
    let room = width.map(|w| w.saturating_sub(heading.chars().count() + 2));
    if room.is_some_and(|r| ids.chars().count() > r) {
        ids.clone_from(&d.uuid);
    }
    let ids = fit_line(&ids, room);
    lines.push(
        format!(
            "{}  {}",
            paint(styles.heading, &heading),
            paint(styles.dim, &ids)
        )
        .trim_end()
        .to_owned(),
    );
    if let Some(error) = &d.error {
        let label = if d.state == "lost" { "LOST" } else { "ERROR" };
        let text = fit_line(
            &format!("{label}: {error}"),
            width.map(|w| w.saturating_sub(2)),
        );
        lines.push(format!("  {}", paint(styles.bad, &text)));
        return;
    }
    match d.memory {
        Some(m) => {
            let pct = units::percent(m.used_bytes + m.reserved_bytes, m.total_bytes).unwrap_or(0);
            let style = if pct >= 90 {
                styles.warn
            } else {
                styles.heading
            };
            let long = format!(
                "{} used + {} reserved of {} ({pct}%), {} free",
                units::bytes(m.used_bytes),
                units::bytes(m.reserved_bytes),
                units::bytes(m.total_bytes),
                units::bytes(m.free_bytes),
            );
            let short = format!(
                "{} + {} of {} ({pct}%)",
                units::bytes(m.used_bytes),
                units::bytes(m.reserved_bytes),
                units::bytes(m.total_bytes),
            );
            // "  memory  " + bar + "  " + text.
            let (bar, text) = match width {
                None => (BAR_WIDTH, long),
                Some(w) => {
                    let room = w.saturating_sub(12);
                    let long_len = long.chars().count();
                    if room >= long_len + BAR_MIN {
                        ((room - long_len).min(BAR_MAX), long)
                    } else {
                        let bar = room.saturating_sub(short.chars().count()).clamp(1, BAR_MAX);
                        (bar, short)
                    }
                }
            };
            let line = format!(
                "  memory  {}  {text}",
                paint(
                    style,
                    &units::memory_bar(m.used_bytes, m.reserved_bytes, m.total_bytes, bar)
                ),
            );
            lines.push(line);
        }
        None => lines.push("  memory  not reported".into()),
    }
    let mut gauges = Vec::new();
    if let Some(u) = d.utilization_gpu_percent {
        gauges.push(format!("util {u}%"));
    }
    if let Some(u) = d.utilization_memory_percent {
        gauges.push(format!("mem-util {u}%"));
    }
    if let Some(t) = d.temperature_c {
        gauges.push(format!("temp {t}°C"));
    }
    if let Some(p) = d.power_mw {
        gauges.push(format!("power {}", units::watts(p)));
    }
    if !gauges.is_empty() {
        lines.extend(wrap(&gauges.join("   "), "  ", width));
    }

    match (&d.processes, d.by.zip(d.owners.as_ref())) {
        (None, _) => lines.push("  processes  not reported".into()),
        // A GPU without processes says so as usual.
        (Some(_), Some((key, totals))) if !totals.is_empty() => {
            lines.extend(owner_table(key, totals, "  ", width));
            if let Some(unaccounted) = d.unaccounted_bytes.filter(|&u| u > 0) {
                lines.push(format!(
                    "  unaccounted  {} used that no listed process holds",
                    units::bytes(unaccounted)
                ));
            }
        }
        (Some(processes), _) => {
            // Processes outside any MIG instance first, then each instance with its own.
            let plain: Vec<&ProcessStatus> = processes
                .iter()
                .filter(|p| p.gpu_instance_id.is_none())
                .collect();
            if !plain.is_empty() || d.mig_instances.is_empty() {
                render_processes(&plain, width, lines);
            }
            for mig in &d.mig_instances {
                render_mig(mig, processes, styles, width, lines);
            }
            if let Some(unaccounted) = d.unaccounted_bytes.filter(|&u| u > 0) {
                lines.extend(wrap(
                    &format!(
                        "unaccounted  {} used that no listed process holds",
                        units::bytes(unaccounted)
                    ),
                    "  ",
                    width,
                ));
            }
        }
    }
    if let Some(others) = &d.other_holders {
        lines.extend(wrap(
            &format!(
                "others  {} held by {} process{} of other containers or the host",
                units::opt_bytes(others.used_bytes),
                others.processes,
                if others.processes == 1 { "" } else { "es" }
            ),
            "  ",
            width,
        ));
    }
    for dropped in d.dropped.iter().flatten() {
        for line in wrap(
            &format!("ignored {}: {}", dropped.what, dropped.reason),
            "  ",
            width,
        ) {
            lines.push(paint(styles.warn, &line));
        }
    }
    if !d.missing.is_empty() {
        let parts: Vec<String> = d
            .missing
            .iter()
            .map(|(f, why)| format!("{f} ({why})"))
            .collect();
        for line in wrap(&format!("not reported: {}", parts.join(", ")), "  ", width) {
            lines.push(paint(styles.dim, &line));
        }
    }
}

fn render_mig(
    mig: &MigStatus,
    processes: &[ProcessStatus],
    styles: &Styles,
    width: Option<usize>,
    lines: &mut Vec<String>,
) {
    let ids = match (mig.gpu_instance_id, mig.compute_instance_id) {
        (Some(gi), Some(ci)) => format!("GI {gi} CI {ci}"),
        (Some(gi), None) => format!("GI {gi}"),
        _ => String::new(),
    };
    let memory = mig.memory.map_or_else(
        || "memory not reported".to_owned(),
        |m| {
            format!(
                "{} used of {}",
                units::bytes(m.used_bytes),
                units::bytes(m.total_bytes)
            )
        },
    );
    let name = mig.name.as_deref().unwrap_or("MIG instance");
    let head = format!("  {name}  {ids}  {memory}");
    // The MIG UUID is dropped when it does not fit; the rest is cut.
    let with_uuid = head.chars().count() + 2 + mig.uuid.chars().count();
    if width.is_none_or(|w| with_uuid <= w) {
        lines.push(format!(
            "  {}  {ids}  {memory}  {}",
            paint(styles.heading, name),
            paint(styles.dim, &mig.uuid)
        ));
    } else {
        let text = fit_line(
            &format!("{ids}  {memory}"),
            width.map(|w| w.saturating_sub(name.chars().count() + 4)),
        );
        lines.push(format!("  {}  {text}", paint(styles.heading, name)));
    }
    let mine: Vec<&ProcessStatus> = processes
        .iter()
        .filter(|p| {
            p.gpu_instance_id.is_some()
                && p.gpu_instance_id == mig.gpu_instance_id
                && (mig.compute_instance_id.is_none()
                    || p.compute_instance_id == mig.compute_instance_id)
        })
        .collect();
    if !mine.is_empty() {
        lines.extend(process_table(&mine, "    ", width));
    }
}

/// The process rows, the command column fitted into what the other columns leave.
fn process_table(processes: &[&ProcessStatus], indent: &str, width: Option<usize>) -> Vec<String> {
    // Only when some process has an agent: the framework's view beside NVML's, as in `ps`.
    let with_agent = processes.iter().any(|p| p.agent.is_some());
    // Only when some process is in a pod the kubelet names, or in a Slurm job: outputs
    // without them stay as they were.
    let owners = OwnerColumns {
        pod: processes.iter().any(|p| p.kubernetes.is_some()),
        job: processes.iter().any(|p| p.slurm.is_some()),
    };
    let mut columns = vec![
        ("PID", Align::Right),
        ("USER", Align::Left),
        ("MEMORY", Align::Right),
    ];
    if with_agent {
        columns.push(("ALLOCATED", Align::Right));
        columns.push(("CACHED", Align::Right));
    }
    columns.push(("TYPE", Align::Left));
    if owners.pod {
        columns.push(("POD", Align::Left));
    }
    if owners.job {
        columns.push(("JOB", Align::Left));
    }
    columns.push(("COMMAND", Align::Left));
    let mut table = Table::new(&columns);
    for p in processes {
        table.push(process_row(p, with_agent, owners));
    }
    let room = width.map(|w| {
        w.saturating_sub(indent.chars().count() + table.width_before_last())
            .max("COMMAND".len())
    });
    table.fit_last(|row, command| {
        let Some(room) = room else {
            return command_cell(processes[row], None);
        };
        if command.chars().count() <= room {
            return command.to_owned();
        }
        command_cell(processes[row], Some(room))
    });
    table.render(indent)
}

/// The command as shown: shortened to `room` characters when given, with a note when
/// /proc cannot see the process.
fn command_cell(p: &ProcessStatus, room: Option<usize>) -> String {
    let command = p.command.as_deref();
    match (command, p.visible, room) {
        (Some(c), true, None) => c.to_owned(),
        (Some(c), true, Some(room)) => abbreviate(c, room),
        (Some(c), false, None) => format!("{c}{NOT_VISIBLE}"),
        (Some(c), false, Some(room)) => {
            // The long note while the command keeps its interpreter and script.
            let note = if room >= NOT_VISIBLE.chars().count() + 24 {
                NOT_VISIBLE
            } else {
                NOT_VISIBLE_SHORT
            };
            let left = room.saturating_sub(note.chars().count());
            format!("{}{note}", abbreviate(c, left))
        }
        (None, _, room) => fit_line(NOT_VISIBLE.trim_start(), room),
    }
}

/// Which owner columns a process table has.
#[derive(Debug, Clone, Copy)]
struct OwnerColumns {
    pod: bool,
    job: bool,
}

fn process_row(p: &ProcessStatus, with_agent: bool, owners: OwnerColumns) -> Vec<String> {
    let kind = match p.kind {
        Some(ProcessKind::Compute) => "C",
        Some(ProcessKind::Graphics) => "G",
        Some(ProcessKind::ComputeAndGraphics) => "C+G",
        None => "-",
    };
    let mut row = vec![
        // A host PID this namespace cannot map is marked, never shown as one of ours.
        match p.host_pid {
            Some(host) if host == p.pid => format!("host:{host}"),
            _ => p.pid.to_string(),
        },
        p.user.clone().unwrap_or_else(|| "-".into()),
        units::opt_bytes(p.used_bytes),
    ];
    if with_agent {
        let agent = p.agent.unwrap_or(AgentMemory {
            allocated_bytes: None,
            cached_bytes: None,
            releasable_bytes: None,
        });
        row.push(units::opt_bytes(agent.allocated_bytes));
        row.push(units::opt_bytes(agent.cached_bytes));
    }
    row.push(kind.into());
    if owners.pod {
        row.push(
            p.kubernetes
                .as_ref()
                .map_or_else(|| "-".into(), vramctl_observe::owners::pod_cell),
        );
    }
    if owners.job {
        row.push(
            p.slurm
                .as_ref()
                .map_or_else(|| "-".into(), vramctl_observe::owners::job_cell),
        );
    }
    row.push(command_cell(p, None));
    row
}

fn render_processes(processes: &[&ProcessStatus], width: Option<usize>, lines: &mut Vec<String>) {
    if processes.is_empty() {
        lines.push("  no processes".into());
    } else {
        lines.extend(process_table(processes, "  ", width));
    }
}

/// `--compact`: one line per GPU, as gpustat prints them: index, name, temperature,
/// utilization, used/total memory, and the holders as `user:command(memory)`, biggest
/// first, as many as fit (`+N` for the rest).
fn render_compact(
    report: &StatusReport,
    styles: &Styles,
    tz: &TimeZone,
    width: Option<usize>,
) -> Vec<String> {
    let mut lines = vec![paint(styles.dim, &fit_line(&header(report, tz), width))];
    lines.extend(stale_line(report, tz));
    for d in &report.devices {
        let name = d.name.as_deref().unwrap_or("(name not reported)");
        let head = format!("[{}] {name}", d.index);
        if let Some(error) = &d.error {
            let label = if d.state == "lost" { "LOST" } else { "ERROR" };
            let rest = fit_line(
                &format!("{label}: {error}"),
                width.map(|w| w.saturating_sub(head.chars().count() + 3)),
            );
            lines.push(format!(
                "{} | {}",
                paint(styles.heading, &head),
                paint(styles.bad, &rest)
            ));
            continue;
        }
        let temp = d
            .temperature_c
            .map_or_else(|| "-°C".to_owned(), |t| format!("{t}°C"));
        let util = d
            .utilization_gpu_percent
            .map_or_else(|| "- %".to_owned(), |u| format!("{u:>3} %"));
        let memory = d.memory.map_or_else(
            || "memory -".to_owned(),
            |m| {
                format!(
                    "{} / {}",
                    short_bytes(m.used_bytes),
                    short_bytes(m.total_bytes)
                )
            },
        );
        let mut line = format!(
            "{} | {temp}, {util} | {memory} |",
            paint(styles.heading, &head)
        );
        let mut used = format!("{head} | {temp}, {util} | {memory} |")
            .chars()
            .count();
        let listed: Vec<&ProcessStatus> = d.processes.iter().flatten().collect();
        for (i, p) in listed.iter().enumerate() {
            // A user name is escaped as the command is (`abbreviate` escapes it).
            let user = escape(p.user.as_deref().unwrap_or("-"));
            let memory = p.used_bytes.map_or_else(|| "-".to_owned(), short_bytes);
            let command = p.command.as_deref().unwrap_or("?");
            // ` user:` + `(memory)`, and room kept for ` +N` when others follow.
            let overhead = user.chars().count() + memory.chars().count() + 4;
            let left = listed.len() - i - 1;
            let more = if left > 0 {
                format!(" +{left}").len()
            } else {
                0
            };
            let chars = match width {
                None => COMPACT_COMMAND_MAX,
                Some(w) => {
                    let room = w.saturating_sub(used);
                    // A fair share of the room for each holder still to show, at least
                    // what shows an interpreter and a script, at most what fits.
                    let fair = (room / (left + 1)).saturating_sub(overhead);
                    let fits = room.saturating_sub(overhead + more);
                    fair.clamp(COMPACT_COMMAND_CHARS, COMPACT_COMMAND_MAX)
                        .min(fits)
                }
            };
            if chars < COMPACT_COMMAND_MIN {
                let rest = format!(" +{}", listed.len() - i);
                if width.is_none_or(|w| used + rest.chars().count() <= w) {
                    line.push_str(&rest);
                }
                break;
            }
            let holder = format!("{user}:{}({memory})", abbreviate(command, chars));
            line.push(' ');
            line.push_str(&holder);
            used += 1 + holder.chars().count();
        }
        if d.processes.is_none() {
            line.push_str(" processes not reported");
        }
        lines.push(line);
    }
    for u in report.unopened.iter().flatten() {
        lines.push(format!(
            "{} | {}",
            paint(styles.heading, &format!("[{}]", u.index)),
            paint(
                styles.bad,
                &fit_line(
                    &format!("could not be opened: {}", u.reason),
                    width.map(|w| w.saturating_sub(6))
                )
            )
        ));
    }
    if report.devices.is_empty() && report.unopened.as_ref().is_none_or(Vec::is_empty) {
        lines.push("no NVIDIA GPU found".into());
    }
    lines
}

/// A holder's command in `--compact`: about an interpreter and a script (what gpustat's
/// `-c` shows) when the room is shared between holders...
const COMPACT_COMMAND_CHARS: usize = 20;
/// ...at most this however wide the terminal (and in a pipe)...
const COMPACT_COMMAND_MAX: usize = 40;
/// ...and below this the holder is counted in `+N` instead.
const COMPACT_COMMAND_MIN: usize = 12;

/// Memory in `--compact`, as `top` writes it: `20.0G`, `615M`.
fn short_bytes(n: u64) -> String {
    vramctl_tui::format::bytes(n)
}
