//! Test fixtures: observations built by hand, and observations read from the example
//! scenarios through the real sampler and NVML backend on the fake library.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use vramctl_core::clock::ManualClock;
use vramctl_core::sanity::{PID_MAX_LIMIT, SanityLimits};
use vramctl_core::types::{
    DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, MemoryReading, ProcessKind,
    ProcessUsage, Snapshot,
};
use vramctl_gpu::{Backend, NvmlBackend, Sampler};

use vramctl_observe::observation::{HostProcess, Observation};

/// 2025-11-29 21:00:00 UTC: the time of the first fixture sample.
pub const T0_MS: i64 = 1_764_450_000_000;
pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

/// A GPU with `used` of `total` bytes and these processes `(pid, bytes)`.
pub fn gpu(index: u32, total: u64, used: u64, processes: &[(u32, u64)]) -> DeviceSnapshot {
    DeviceSnapshot {
        info: Arc::new(DeviceInfo {
            index,
            uuid: format!("GPU-{index:08x}-0000-4000-8000-000000000000"),
            name: Some("NVIDIA H200".into()),
            pci_bus_id: None,
            minor_number: Some(index),
            mig_enabled: Some(false),
            mig_instances: Vec::new(),
        }),
        state: DeviceState::Ok(DeviceReading {
            memory: Some(MemoryReading {
                total_bytes: total,
                used_bytes: used,
                reserved_bytes: (615 * MIB).min(total),
                free_bytes: total.saturating_sub(used + 615 * MIB),
            }),
            utilization_gpu_percent: Some(40),
            utilization_memory_percent: Some(20),
            temperature_c: Some(41),
            power_mw: Some(210_000),
            processes: Some(
                processes
                    .iter()
                    .map(|&(pid, bytes)| ProcessUsage {
                        pid,
                        used_bytes: Some(bytes),
                        kind: ProcessKind::Compute,
                        gpu_instance_id: None,
                        compute_instance_id: None,
                    })
                    .collect(),
            ),
            ..DeviceReading::default()
        }),
    }
}

/// A host process owned by `user`, child of `ppid`.
pub fn host(pid: u32, ppid: u32, user: &str, command: &str) -> HostProcess {
    HostProcess {
        pid,
        ppid: Some(ppid),
        user: Some(user.into()),
        command: command.into(),
        state: Some('S'),
        start_time_ticks: Some(u64::from(pid) * 10),
        started_at_unix_ms: Some(T0_MS - 3_600_000),
        cpu_percent: Some(12.0),
        cpu_time_ms: Some(90_000),
        ..HostProcess::default()
    }
}

/// An observation at `T0 + t_s` of `devices`, with `hosts`.
pub fn obs(t_s: i64, devices: Vec<DeviceSnapshot>, hosts: Vec<HostProcess>) -> Arc<Observation> {
    let mut o = Observation::bare(Snapshot {
        taken_at_unix_ms: T0_MS + t_s * 1000,
        monotonic_ms: T0_MS + t_s * 1000,
        driver: Arc::new(DriverInfo {
            driver_version: Some("580.159.04".into()),
            nvml_version: None,
            cuda_driver_version: None,
        }),
        devices,
        unopened: Vec::new(),
    });
    o.hosts = hosts.into_iter().map(|h| (h.pid, h)).collect();
    Arc::new(o)
}

/// The fake library loads from one path per process and keeps global state; tests that
/// use it take turns.
static FAKE_NVML: Mutex<()> = Mutex::new(());

fn fake_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    for candidate in [
        deps.join("libfake_nvml.so"),
        deps.join("../libfake_nvml.so"),
    ] {
        if candidate.exists() {
            return candidate;
        }
    }
    panic!("libfake_nvml.so not found beside {}", deps.display());
}

fn scenario(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/scenarios")
        .join(name)
}

/// Made-up /proc facts for a scenario's (fictional) PIDs, so frames do not depend on the
/// processes of the machine running the tests: users cycle, every tenth PID is "not
/// visible in this namespace", the rest hang under one launcher per GPU.
fn made_up_hosts(
    snapshot: &Snapshot,
    backend: &mut NvmlBackend,
) -> (BTreeMap<u32, HostProcess>, BTreeMap<u32, String>) {
    const USERS: [&str; 3] = ["alice", "bob", "carol"];
    let mut hosts = BTreeMap::new();
    let mut names = BTreeMap::new();
    for device in &snapshot.devices {
        let Some(reading) = device.reading() else {
            continue;
        };
        let launcher = 1000 + device.info.index;
        for p in reading.processes.iter().flatten() {
            let name = backend
                .process_name(p.pid)
                .unwrap_or_else(|| format!("process {}", p.pid));
            if p.pid % 10 == 9 {
                names.insert(p.pid, name);
                continue;
            }
            let user = USERS[usize::try_from(p.pid).unwrap_or(0) % USERS.len()];
            let mut h = host(p.pid, launcher, user, &name);
            h.cpu_percent = Some(f32::from(u16::try_from(p.pid % 7).unwrap_or(0)) * 14.5);
            hosts.insert(p.pid, h);
            hosts
                .entry(launcher)
                .or_insert_with(|| host(launcher, 1, user, "torchrun --nproc-per-node 8"));
        }
    }
    (hosts, names)
}

/// Observations of a shipped scenario at the fake's times `times_s`, through the real
/// sampler and NVML backend; wall time is `T0 + t`.
pub fn from_scenario(name: &str, times_s: &[f64]) -> Vec<Arc<Observation>> {
    let _guard = FAKE_NVML.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let clock_file = dir.path().join("clock");
    std::fs::write(&clock_file, "0").expect("clock file");
    // SAFETY (test-only): the lock above serialises every test that sets these; nothing
    // else in this binary reads them.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("FAKE_NVML_SCENARIO", scenario(name));
        std::env::set_var("FAKE_NVML_CLOCK_FILE", &clock_file);
        std::env::remove_var("FAKE_NVML_TIME");
    }
    let backend = NvmlBackend::open(Some(&fake_library())).expect("fake NVML opens");
    let clock = ManualClock::new(T0_MS);
    let mut sampler = Sampler::with_clock(
        backend,
        Box::new(clock.clone()),
        SanityLimits {
            pid_max: PID_MAX_LIMIT,
        },
    )
    .expect("devices enumerate");
    sampler.backend_mut().set_read_process_activity(true);
    let mut out = Vec::new();
    let mut now_s = 0.0;
    for &t in times_s {
        std::fs::write(&clock_file, format!("{t}")).expect("clock file");
        #[allow(clippy::cast_possible_truncation)]
        clock.advance_ms(((t - now_s) * 1000.0).round() as i64);
        now_s = t;
        let snapshot = sampler.tick();
        let (hosts, driver_names) = made_up_hosts(&snapshot, sampler.backend_mut());
        let mut o = Observation::bare(snapshot);
        o.hosts = hosts;
        o.driver_names = driver_names;
        out.push(Arc::new(o));
    }
    #[allow(unsafe_code)]
    unsafe {
        std::env::remove_var("FAKE_NVML_CLOCK_FILE");
    }
    out
}

/// `observations` with the verdicts of the live analysis (`AnalysisJudge` with `cfg`), each
/// judged in turn as the sampler thread does.
pub fn judged(
    cfg: vramctl_leaks::analysis::LeakConfig,
    observations: &[Arc<Observation>],
) -> Vec<Arc<Observation>> {
    judged_in(cfg, observations, jiff::tz::TimeZone::UTC)
}

/// [`judged`], the verdicts' times in `tz`.
pub fn judged_in(
    cfg: vramctl_leaks::analysis::LeakConfig,
    observations: &[Arc<Observation>],
    tz: jiff::tz::TimeZone,
) -> Vec<Arc<Observation>> {
    use vramctl_observe::verdict::{AnalysisJudge, Judge};
    let mut judge = AnalysisJudge::new(cfg)
        .expect("valid thresholds")
        .with_time_zone(tz);
    observations
        .iter()
        .map(|o| {
            let mut o = (**o).clone();
            o.verdicts = judge.judge(&o);
            Arc::new(o)
        })
        .collect()
}

/// What the recorder would write for `obs`: the snapshot's devices, and for each GPU
/// process its identity, user, command and CPU time as /proc gave them (the driver's name
/// for those /proc cannot see).
pub fn tick_of(obs: &Observation) -> vramctl_store::TickSample {
    use vramctl_store::{ProcessKey, ProcessMeta, ProcessSample, TickSample, device_samples};
    let tps = procfs::ticks_per_second().max(1);
    let mut pids: Vec<u32> = obs
        .snapshot
        .devices
        .iter()
        .filter_map(|d| d.reading())
        .flat_map(|r| r.processes.iter().flatten().map(|p| p.pid))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    let processes = pids
        .into_iter()
        .map(|pid| {
            let host = obs.hosts.get(&pid);
            ProcessSample {
                meta: ProcessMeta {
                    key: ProcessKey {
                        boot_id: Some("boot-fixture".into()),
                        pid,
                        start_time_ticks: host.and_then(|h| h.start_time_ticks),
                    },
                    uid: None,
                    user: host.and_then(|h| h.user.clone()),
                    command: host
                        .map(|h| h.command.clone())
                        .or_else(|| obs.driver_names.get(&pid).cloned()),
                    container_id: None,
                    pod_uid: None,
                },
                cpu_ticks: host.and_then(|h| h.cpu_time_ms).map(|ms| ms * tps / 1000),
            }
        })
        .collect();
    TickSample {
        at_unix_ms: obs.taken_at_unix_ms(),
        unavailable: None,
        devices: device_samples(&obs.snapshot),
        processes,
    }
}

/// An in-memory history store holding `observations`, as the recorder would have.
pub fn recorded(observations: &[Arc<Observation>]) -> vramctl_store::Store {
    let mut store = vramctl_store::Store::open_in_memory().expect("in-memory store");
    for obs in observations {
        store.append(&tick_of(obs)).expect("append");
    }
    store
}
