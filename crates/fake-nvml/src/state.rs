//! The library's process-wide state: the init reference count, the loaded scenario, its
//! clock, and what the exported calls compute from them.
//!
//! Everything sits behind one `Mutex` in a static. The exported calls are short (no I/O
//! except reading the clock file in `file` mode and /proc for `real` processes), so one lock
//! is simpler than finer ones and still cheap for 8 GPUs x 30 processes per sample.

use std::path::PathBuf;
use std::ptr;
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use nvml_wrapper_sys::bindings::{nvmlDevice_st, nvmlDevice_t};

use crate::clock::{Clock, ClockEnv};
use crate::codes::{self, Ret};
use crate::func::Func;
use crate::process_dir::{DirProcess, ProcessDir, real_process_gone};
use crate::scenario::{
    Gpu, MemoryInfoFault, MigInstance, NO_INSTANCE, Process, ProcessKind, Scenario,
};

/// `Result` with an NVML return code as the error.
pub type R<T = ()> = Result<T, Ret>;

/// Names the scenario file to load at init.
pub const ENV_SCENARIO: &str = "FAKE_NVML_SCENARIO";
/// Fixes the clock at this many seconds, whatever the scenario says.
pub const ENV_TIME: &str = "FAKE_NVML_TIME";
/// Reads the clock from this file, whatever the scenario says (unless `FAKE_NVML_TIME`).
pub const ENV_CLOCK_FILE: &str = "FAKE_NVML_CLOCK_FILE";

static STATE: Mutex<State> = Mutex::new(State {
    init_count: 0,
    loaded: None,
    init_attempts: None,
    scenario_path: None,
    reload: None,
});

/// Locks the state. A panic inside an export (caught at the ABI) may have poisoned the lock;
/// the state is still consistent enough to answer, so the poison is ignored.
pub fn lock() -> MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub struct State {
    init_count: u32,
    loaded: Option<Loaded>,
    /// `(scenario path, init attempts that met an [init] fault)`, for `fail_count`. Keyed by
    /// path so that pointing FAKE_NVML_SCENARIO elsewhere starts a new count.
    init_attempts: Option<(String, u32)>,
    /// The path the loaded scenario came from.
    scenario_path: Option<String>,
    /// `(scenario path, where its [driver_reload] stands)`: kept across inits, so the
    /// reloaded scenario (whose clock starts again) does not lose its driver twice.
    reload: Option<(String, Reload)>,
}

/// Where a `[driver_reload]` fault stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reload {
    /// The driver went away; this many init attempts have failed since.
    Gone { failed_inits: u32 },
    /// It came back: the fault is over for this process.
    Back,
}

/// A scenario in use, with its clock.
pub struct Loaded {
    pub scenario: Scenario,
    pub clock: Clock,
    /// Wall-clock microseconds at load: the base of process-utilization timestamps, so they
    /// look like NVML's (µs since the Unix epoch) yet move with the fake clock.
    pub epoch_us: u64,
    /// The driver went away under this session (`[driver_reload]`): every call fails.
    pub broken: Option<Ret>,
    /// `FAKE_NVML_PROCESS_DIR`: real processes announced at run time (`process_dir.rs`).
    pub process_dir: Option<ProcessDir>,
}

/// One line on stderr, the only output the library ever makes.
fn complain(message: &str) {
    eprintln!("{}", message.replace('\n', " "));
}

impl State {
    /// `nvmlInit_v2` / `nvmlInitWithFlags`.
    pub fn init(&mut self) -> R {
        if self.init_count > 0 {
            self.init_count += 1;
            return Ok(());
        }
        let Some(path) = std::env::var_os(ENV_SCENARIO) else {
            complain(&format!(
                "fake-nvml: {ENV_SCENARIO} is not set; point it at a scenario file (see docs/scenarios.md)"
            ));
            return Err(codes::UNKNOWN);
        };
        let path = path.to_string_lossy().into_owned();
        let scenario = Scenario::load(&path).map_err(|e| {
            complain(&e.to_string());
            codes::UNKNOWN
        })?;
        let clock_env = clock_env(&path)?;
        hold_init(&scenario.init);
        if let Some((p, Reload::Gone { failed_inits })) = &mut self.reload
            && *p == path
        {
            let allowed = scenario
                .driver_reload
                .as_ref()
                .map_or(0, |r| r.init_failures);
            if *failed_inits < allowed {
                *failed_inits += 1;
                return Err(codes::DRIVER_NOT_LOADED);
            }
            self.reload = Some((path.clone(), Reload::Back));
        }
        if let Some(code) = scenario.init.error_code {
            let attempts = match &mut self.init_attempts {
                Some((p, n)) if *p == path => n,
                other => &mut other.insert((path.clone(), 0)).1,
            };
            *attempts = attempts.saturating_add(1);
            if scenario.init.fail_count.is_none_or(|n| *attempts <= n) {
                return Err(code);
            }
        }
        let clock = Clock::new(&scenario.clock, &clock_env);
        let epoch_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        self.loaded = Some(Loaded {
            scenario,
            clock,
            epoch_us,
            broken: None,
            process_dir: ProcessDir::from_env(),
        });
        self.init_count = 1;
        self.scenario_path = Some(path);
        Ok(())
    }

    /// `nvmlShutdown`.
    pub fn shutdown(&mut self) -> R {
        if self.init_count == 0 {
            return Err(codes::UNINITIALIZED);
        }
        self.init_count -= 1;
        if self.init_count == 0 {
            self.loaded = None;
            crate::calls::dump_if_asked();
        }
        Ok(())
    }

    /// The loaded scenario, if NVML is initialised (for the control symbols, which work
    /// whatever the driver does).
    pub fn loaded(&mut self) -> R<&mut Loaded> {
        if self.init_count == 0 {
            return Err(codes::UNINITIALIZED);
        }
        self.loaded.as_mut().ok_or(codes::UNINITIALIZED)
    }

    /// The loaded scenario for an NVML call: fails as the scenario's `[driver_reload]` says
    /// once the driver has gone away under this session, until the session is shut down.
    pub fn session(&mut self) -> R<&mut Loaded> {
        if self.init_count == 0 {
            return Err(codes::UNINITIALIZED);
        }
        let State {
            loaded,
            reload,
            scenario_path,
            ..
        } = self;
        let loaded = loaded.as_mut().ok_or(codes::UNINITIALIZED)?;
        if loaded.broken.is_none()
            && let Some(spec) = &loaded.scenario.driver_reload
        {
            let back =
                matches!(reload, Some((p, Reload::Back)) if Some(&*p) == scenario_path.as_ref());
            if !back && loaded.clock.now() >= spec.at_s {
                loaded.broken = Some(spec.error_code);
                if let Some(path) = scenario_path {
                    *reload = Some((path.clone(), Reload::Gone { failed_inits: 0 }));
                }
            }
        }
        match loaded.broken {
            Some(code) => Err(code),
            None => Ok(loaded),
        }
    }
}

/// `[init] delay_ms` / `hold_path`: a driver that takes its time to answer `nvmlInit`.
fn hold_init(init: &crate::scenario::InitSpec) {
    if let Some(ms) = init.delay_ms {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    if let Some(path) = &init.hold_path {
        while std::path::Path::new(path).exists() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

fn clock_env(scenario_path: &str) -> R<ClockEnv> {
    let time = match std::env::var(ENV_TIME) {
        Err(_) => None,
        Ok(text) => match text.trim().parse::<f64>() {
            Ok(t) if t.is_finite() && t >= 0.0 => Some(t),
            _ => {
                complain(&format!(
                    "fake-nvml: {scenario_path}: {ENV_TIME}={text:?} is not a number of seconds >= 0"
                ));
                return Err(codes::UNKNOWN);
            }
        },
    };
    let file = std::env::var_os(ENV_CLOCK_FILE)
        .filter(|f| !f.is_empty())
        .map(PathBuf::from);
    Ok(ClockEnv { time, file })
}

/// Device handles are tokens, never pointers to memory: `0x4E56_0000 | gpu << 8 | slot`,
/// slot 0 being the whole GPU and slot k the k-th MIG device. The tag makes a stray or
/// stale pointer fail with INVALID_ARGUMENT instead of being read as a GPU.
const HANDLE_TAG: usize = 0x4E56_0000;

pub fn encode_handle(gpu: usize, slot: usize) -> nvmlDevice_t {
    ptr::without_provenance_mut::<nvmlDevice_st>(HANDLE_TAG | (gpu & 0xFF) << 8 | (slot & 0xFF))
}

pub fn decode_handle(handle: nvmlDevice_t) -> Option<(usize, usize)> {
    let value = handle.addr();
    (value & !0xFFFF == HANDLE_TAG).then_some(((value >> 8) & 0xFF, value & 0xFF))
}

/// Memory as NVML's v2 struct reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub total: u64,
    pub reserved: u64,
    pub used: u64,
    pub free: u64,
}

/// One process-list entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessEntry {
    pub pid: u32,
    pub used_memory: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// Which process-list call is being answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessList {
    Compute,
    Graphics,
    Mps,
}

impl ProcessList {
    fn includes(self, kind: ProcessKind) -> bool {
        matches!(
            (self, kind),
            (
                ProcessList::Compute,
                ProcessKind::Compute | ProcessKind::ComputeGraphics
            ) | (
                ProcessList::Graphics,
                ProcessKind::Graphics | ProcessKind::ComputeGraphics
            ) | (ProcessList::Mps, ProcessKind::Mps)
        )
    }
}

fn is_live(p: &Process, t: f64) -> bool {
    !p.dead && t >= p.start_s && p.end_s.is_none_or(|end| t < end)
}

/// A process's memory at scenario time `t`: its timeline runs from its own start.
fn process_memory(p: &Process, t: f64) -> u64 {
    p.memory.at(t - p.start_s)
}

impl Loaded {
    pub fn now(&mut self) -> f64 {
        self.clock.now()
    }

    /// Drops `real` processes on this GPU whose PID has exited, as the driver frees their
    /// memory; /proc is read only for processes that would otherwise be live. A dead process
    /// with `held_open_by` holders keeps its memory until they are all gone.
    fn reap(&mut self, gpu: usize, t: f64) {
        if let Some(g) = self.scenario.gpus.get_mut(gpu) {
            for p in g.processes.iter_mut().filter(|p| p.real && is_live(p, t)) {
                if real_process_gone(p.pid) {
                    p.dead = true;
                }
            }
            for p in g.processes.iter_mut().filter(|p| p.dead && !p.released) {
                if p.held_open_by
                    .iter()
                    .all(|holder| real_process_gone(*holder))
                {
                    p.released = true;
                }
            }
        }
    }

    /// Checks a device call: the GPU exists, is not lost, and has no fault for `func`.
    fn admit(&mut self, func: Func, gpu: usize, slot: usize, t: &mut Option<f64>) -> R {
        let g = self.scenario.gpus.get(gpu).ok_or(codes::INVALID_ARGUMENT)?;
        if slot > 0 && (slot > g.mig_instances.len() || !g.mig_enabled()) {
            return Err(codes::INVALID_ARGUMENT);
        }
        if let Some(lost_at) = g.lost_at_s {
            let now = *t.get_or_insert_with(|| self.clock.now());
            if now >= lost_at {
                return Err(codes::GPU_IS_LOST);
            }
        }
        match self.scenario.gpus[gpu].faults.get(func) {
            Some(code) => Err(code),
            None => Ok(()),
        }
    }

    /// The handle for GPU `gpu`, MIG slot `slot`, if a call to `func` may return it.
    pub fn handle_for(&mut self, func: Func, gpu: usize, slot: usize) -> R<nvmlDevice_t> {
        self.admit(func, gpu, slot, &mut None)?;
        Ok(encode_handle(gpu, slot))
    }

    /// The GPU and MIG slot whose UUID is `uuid`.
    pub fn find_uuid(&self, uuid: &str) -> Option<(usize, usize)> {
        self.scenario.gpus.iter().enumerate().find_map(|(i, g)| {
            if g.uuid.as_deref() == Some(uuid) {
                return Some((i, 0));
            }
            g.mig_instances
                .iter()
                .position(|m| m.uuid.as_deref() == Some(uuid))
                .map(|slot| (i, slot + 1))
        })
    }

    /// The processes `FAKE_NVML_PROCESS_DIR` announces now, read afresh (none without it).
    fn dir_processes(&mut self) -> Vec<DirProcess> {
        self.process_dir
            .as_mut()
            .map(ProcessDir::live)
            .unwrap_or_default()
    }

    /// The name `nvmlSystemGetProcessName` gives a PID: a live scenario process's `name`,
    /// or a live `real` (or process-directory) process's /proc comm.
    pub fn process_name(&mut self, pid: u32) -> R<String> {
        let t = self.now();
        for gpu in 0..self.scenario.gpus.len() {
            self.reap(gpu, t);
            let found = self.scenario.gpus[gpu]
                .processes
                .iter()
                .find(|p| p.pid == pid && is_live(p, t));
            if let Some(p) = found {
                if let Some(name) = &p.name {
                    return Ok(name.clone());
                }
                if p.real {
                    if let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
                        return Ok(comm.trim_end().to_owned());
                    }
                }
            }
        }
        let gpus = self.scenario.gpus.len();
        let announced = self
            .dir_processes()
            .iter()
            .any(|p| p.pid == pid && p.gpus.iter().any(|(g, _)| *g < gpus));
        if announced && let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
            return Ok(comm.trim_end().to_owned());
        }
        Err(codes::NOT_FOUND)
    }
}

/// A device call in progress: the loaded scenario, the GPU, and which MIG device if any.
pub struct Device<'a> {
    pub loaded: &'a mut Loaded,
    pub gpu: usize,
    /// `Some(i)`: the handle is the MIG device `gpu.mig_instances[i]`.
    pub mig: Option<usize>,
    t: Option<f64>,
}

/// Runs a device call: locks the state, checks init, the handle, loss and faults, then `f`.
pub fn with_device<T>(
    func: Func,
    handle: nvmlDevice_t,
    f: impl FnOnce(&mut Device<'_>) -> R<T>,
) -> R<T> {
    crate::calls::count(func);
    let mut state = lock();
    let loaded = state.session()?;
    let (gpu, slot) = decode_handle(handle).ok_or(codes::INVALID_ARGUMENT)?;
    let mut t = None;
    loaded.admit(func, gpu, slot, &mut t)?;
    let mut device = Device {
        loaded,
        gpu,
        mig: slot.checked_sub(1),
        t,
    };
    f(&mut device)
}

impl Device<'_> {
    /// The scenario time, read once per call.
    pub fn t(&mut self) -> f64 {
        match self.t {
            Some(t) => t,
            None => *self.t.insert(self.loaded.clock.now()),
        }
    }

    pub fn gpu(&self) -> &Gpu {
        &self.loaded.scenario.gpus[self.gpu]
    }

    pub fn mig_instance(&self) -> Option<&MigInstance> {
        self.mig.and_then(|i| self.gpu().mig_instances.get(i))
    }

    /// The GPU, for calls a MIG device handle does not answer (NOT_SUPPORTED).
    pub fn whole_gpu(&self) -> R<&Gpu> {
        match self.mig {
            Some(_) => Err(codes::NOT_SUPPORTED),
            None => Ok(self.gpu()),
        }
    }

    /// Live processes of this device (all of the GPU's, or one MIG device's).
    fn live_processes(&mut self) -> impl Iterator<Item = &Process> {
        let t = self.t();
        self.loaded.reap(self.gpu, t);
        let mig = self.mig;
        self.loaded.scenario.gpus[self.gpu]
            .processes
            .iter()
            .filter(move |p| is_live(p, t) && (mig.is_none() || p.mig_slot == mig))
    }

    /// `(pid, bytes)` of the `FAKE_NVML_PROCESS_DIR` processes on this device, read
    /// afresh. Only the whole GPU lists them (a file names no MIG device); a PID the scenario
    /// already lists live on this GPU keeps the scenario's entry, as the driver lists a PID
    /// once.
    fn announced_processes(&mut self) -> Vec<(u32, u64)> {
        if self.mig.is_some() {
            return Vec::new();
        }
        let announced = self.loaded.dir_processes();
        if announced.is_empty() {
            return Vec::new();
        }
        let scenario_pids: Vec<u32> = self.live_processes().map(|p| p.pid).collect();
        let gpu = self.gpu;
        announced
            .iter()
            .filter(|p| !scenario_pids.contains(&p.pid))
            .filter_map(|p| p.on_gpu(gpu).map(|bytes| (p.pid, bytes)))
            .collect()
    }

    /// Memory info in v2 terms (`total = reserved + used + free`), faults applied.
    pub fn memory(&mut self) -> R<Memory> {
        let t = self.t();
        let announced = self.announced_processes();
        // NVML_VALUE_NOT_AVAILABLE entries carry no number to add up.
        let listed: u64 = self
            .live_processes()
            .map(|p| process_memory(p, t))
            .chain(announced.iter().map(|(_, bytes)| *bytes))
            .filter(|m| *m != u64::MAX)
            .fold(0, u64::saturating_add);
        // Exited processes whose descriptors live on in a holder: still used, no longer
        // listed (what "nvidia-smi shows memory but no process" looks like).
        let mig = self.mig;
        let held: u64 = self
            .gpu()
            .processes
            .iter()
            .filter(|p| p.dead && !p.released && (mig.is_none() || p.mig_slot == mig))
            .map(|p| process_memory(p, t))
            .filter(|m| *m != u64::MAX)
            .fold(0, u64::saturating_add);
        let processes = listed.saturating_add(held);
        let (total, reserved, extra, fault) = match self.mig_instance() {
            Some(m) => (
                m.memory_total,
                m.memory_reserved.0,
                m.memory_extra_used.at(t),
                None,
            ),
            None => {
                let g = self.gpu();
                // The parent's used memory includes what its MIG devices use.
                let extra = g
                    .mig_instances
                    .iter()
                    .map(|m| m.memory_extra_used.at(t))
                    .fold(g.memory_extra_used.at(t), u64::saturating_add);
                (
                    g.memory_total,
                    g.memory_reserved.0,
                    extra,
                    g.memory_info_fault,
                )
            }
        };
        let total = total.ok_or(codes::NOT_SUPPORTED)?.0;
        // A scenario may ask for more than fits; the driver cannot, so clamp and keep
        // total = reserved + used + free (absurd answers are what memory_info_fault is for).
        let capacity = total.saturating_sub(reserved);
        let used = processes.saturating_add(extra).min(capacity);
        let mut memory = Memory {
            total,
            reserved,
            used,
            free: capacity - used,
        };
        match fault {
            None => {}
            Some(MemoryInfoFault::UsedExceedsTotal) => {
                memory.used = total.saturating_add(1 << 30);
                memory.free = 0;
            }
            Some(MemoryInfoFault::U64Max) => {
                memory.used = u64::MAX;
                memory.free = 0;
            }
        }
        Ok(memory)
    }

    /// The entries of one process list.
    pub fn processes(&mut self, list: ProcessList) -> Vec<ProcessEntry> {
        let t = self.t();
        let mig_on = self.gpu().mig_enabled();
        // Announced processes are compute processes (what a CUDA job is).
        let announced = match list {
            ProcessList::Compute => self.announced_processes(),
            ProcessList::Graphics | ProcessList::Mps => Vec::new(),
        };
        self.live_processes()
            .filter(|p| list.includes(p.kind))
            .map(|p| ProcessEntry {
                pid: p.pid,
                used_memory: process_memory(p, t),
                gpu_instance_id: if mig_on {
                    p.gpu_instance_id.unwrap_or(NO_INSTANCE)
                } else {
                    NO_INSTANCE
                },
                compute_instance_id: if mig_on {
                    p.compute_instance_id.unwrap_or(NO_INSTANCE)
                } else {
                    NO_INSTANCE
                },
            })
            .chain(announced.iter().map(|&(pid, used_memory)| ProcessEntry {
                pid,
                used_memory,
                gpu_instance_id: NO_INSTANCE,
                compute_instance_id: NO_INSTANCE,
            }))
            .collect()
    }

    /// Per-process utilization samples newer than `last_seen_us`: `(pid, timestamp µs,
    /// sm %, mem %)`.
    pub fn utilization_samples(&mut self, last_seen_us: u64) -> Vec<(u32, u64, u32, u32)> {
        let t = self.t();
        // The driver stamps samples with the wall clock, which steps where the scenario's
        // `wall_steps` say while `t` goes on.
        let wall_s = t + self.loaded.scenario.clock.wall_offset_s(t);
        let timestamp = self
            .loaded
            .epoch_us
            .saturating_add_signed((wall_s * 1e6) as i64);
        if timestamp <= last_seen_us {
            return Vec::new();
        }
        let announced = self.announced_processes();
        self.live_processes()
            .map(|p| {
                let local = t - p.start_s;
                (
                    p.pid,
                    timestamp,
                    percent(p.sm_util.at(local)),
                    percent(p.mem_util.at(local)),
                )
            })
            // An announced process is a scenario process with no utilization timelines: 0 %.
            .chain(announced.iter().map(|&(pid, _)| (pid, timestamp, 0, 0)))
            .collect()
    }
}

/// Utilization is a percentage; a timeline may say more.
pub fn percent(value: u64) -> u32 {
    u32::try_from(value.min(100)).unwrap_or(100)
}

/// A reading that NVML passes as `unsigned int`.
pub fn as_u32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// Runs a system call that needs NVML initialised: locks, checks init and the call's
/// top-level fault, then `f`.
pub fn with_system<T>(func: Func, f: impl FnOnce(&mut Loaded) -> R<T>) -> R<T> {
    crate::calls::count(func);
    let mut state = lock();
    let loaded = state.session()?;
    if let Some(code) = loaded.scenario.system_faults.get(func) {
        return Err(code);
    }
    f(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_reject_strays() {
        for (gpu, slot) in [(0, 0), (7, 0), (3, 2), (63, 7)] {
            let h = encode_handle(gpu, slot);
            assert!(!h.is_null());
            assert_eq!(decode_handle(h), Some((gpu, slot)));
        }
        assert_eq!(decode_handle(ptr::null_mut()), None);
        assert_eq!(decode_handle(ptr::without_provenance_mut(0x1000)), None);
        assert_eq!(
            decode_handle(ptr::without_provenance_mut(HANDLE_TAG + 0x1_0000)),
            None
        );
    }

    fn loaded(text: &str, t: f64) -> Loaded {
        Loaded {
            scenario: Scenario::parse(text, "t.toml").expect("valid"),
            clock: Clock::Fixed { t },
            epoch_us: 1_000_000,
            broken: None,
            process_dir: None,
        }
    }

    fn device(loaded: &mut Loaded, gpu: usize, mig: Option<usize>) -> Device<'_> {
        Device {
            loaded,
            gpu,
            mig,
            t: None,
        }
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn memory_adds_up() {
        let mut l = loaded(
            r#"
            [[gpu]]
            memory_total = "100 GiB"
            memory_reserved = "1 GiB"
            memory_extra_used = "2 GiB"
            [[gpu.process]]
            pid = 1
            memory = "10 GiB"
            [[gpu.process]]
            pid = 2
            start_s = 5.0
            memory = { ramp = { from = "1 GiB", rate_per_s = "1 GiB" } }
            [[gpu.process]]
            pid = 3
            memory = "18446744073709551615"
            [[gpu.process]]
            pid = 4
            end_s = 1.0
            memory = "50 GiB"
            "#,
            8.0,
        );
        let m = device(&mut l, 0, None).memory().expect("memory");
        // 10 + (1 + 3 s * 1) + 2 extra; pid 3 is "not available", pid 4 has ended.
        assert_eq!(m.used, 16 * GIB);
        assert_eq!(m.reserved, GIB);
        assert_eq!(m.total, 100 * GIB);
        assert_eq!(m.total, m.reserved + m.used + m.free);
        let procs = device(&mut l, 0, None).processes(ProcessList::Compute);
        let pids: Vec<u32> = procs.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [1, 2, 3]);
        assert_eq!(procs[1].used_memory, 4 * GIB);
        assert_eq!(procs[2].used_memory, u64::MAX);
        assert_eq!(procs[0].gpu_instance_id, NO_INSTANCE);
    }

    #[test]
    fn memory_overcommit_is_clamped_and_faults_are_absurd() {
        let text = r#"
            [[gpu]]
            memory_total = "10 GiB"
            memory_reserved = "1 GiB"
            [[gpu.process]]
            pid = 1
            memory = "20 GiB"
            [[gpu]]
            memory_total = "10 GiB"
            memory_info_fault = "used_exceeds_total"
            [[gpu]]
            memory_total = "10 GiB"
            memory_info_fault = "u64_max"
            [[gpu]]
            "#;
        let mut l = loaded(text, 0.0);
        let m = device(&mut l, 0, None).memory().expect("memory");
        assert_eq!((m.used, m.free), (9 * GIB, 0));
        let m = device(&mut l, 1, None).memory().expect("memory");
        assert!(m.used > m.total);
        let m = device(&mut l, 2, None).memory().expect("memory");
        assert_eq!(m.used, u64::MAX);
        assert_eq!(device(&mut l, 3, None).memory(), Err(codes::NOT_SUPPORTED));
    }

    #[test]
    fn mig_memory_and_lists() {
        let text = r#"
            [[gpu]]
            memory_total = "80 GiB"
            mig = { current = 1, pending = 1 }
            [[gpu.mig_instance]]
            gpu_instance_id = 1
            memory_total = "20 GiB"
            memory_extra_used = "1 GiB"
            [[gpu.mig_instance]]
            gpu_instance_id = 2
            memory_total = "20 GiB"
            [[gpu.process]]
            pid = 10
            gpu_instance_id = 1
            memory = "3 GiB"
            [[gpu.process]]
            pid = 20
            gpu_instance_id = 2
            memory = "5 GiB"
            "#;
        let mut l = loaded(text, 0.0);
        let parent = device(&mut l, 0, None).memory().expect("parent");
        assert_eq!(parent.used, 9 * GIB);
        let first = device(&mut l, 0, Some(0)).memory().expect("mig 0");
        assert_eq!((first.total, first.used), (20 * GIB, 4 * GIB));
        let second = device(&mut l, 0, Some(1)).processes(ProcessList::Compute);
        assert_eq!(second.len(), 1);
        assert_eq!(
            (
                second[0].pid,
                second[0].gpu_instance_id,
                second[0].compute_instance_id
            ),
            (20, 2, 0)
        );
        assert_eq!(
            device(&mut l, 0, None)
                .processes(ProcessList::Compute)
                .len(),
            2
        );
    }

    #[test]
    fn kinds_pick_lists() {
        let text = r#"
            [[gpu]]
            [[gpu.process]]
            pid = 1
            kind = "graphics"
            [[gpu.process]]
            pid = 2
            kind = "compute_graphics"
            [[gpu.process]]
            pid = 3
            kind = "mps"
            [[gpu.process]]
            pid = 4
            "#;
        let mut l = loaded(text, 0.0);
        let pids = |l: &mut Loaded, list| -> Vec<u32> {
            device(l, 0, None)
                .processes(list)
                .iter()
                .map(|p| p.pid)
                .collect()
        };
        assert_eq!(pids(&mut l, ProcessList::Compute), [2, 4]);
        assert_eq!(pids(&mut l, ProcessList::Graphics), [1, 2]);
        assert_eq!(pids(&mut l, ProcessList::Mps), [3]);
    }

    #[test]
    fn real_processes_are_checked_in_proc() {
        // PID 0 never has a /proc entry, so a `real` PID 0 reads as exited.
        let text = "[[gpu]]\nmemory_total = 100\n[[gpu.process]]\npid = 0\nreal = true\nmemory = 10\n\
                    [[gpu.process]]\npid = 1\nmemory = 5\n";
        let mut l = loaded(text, 0.0);
        let m = device(&mut l, 0, None).memory().expect("memory");
        assert_eq!(m.used, 5);
        assert!(l.scenario.gpus[0].processes[0].dead);
        let own = std::process::id();
        let text = format!("[[gpu]]\n[[gpu.process]]\npid = {own}\nreal = true\n");
        let mut l = loaded(&text, 0.0);
        assert_eq!(
            device(&mut l, 0, None)
                .processes(ProcessList::Compute)
                .len(),
            1
        );
        assert!(
            !l.scenario.gpus[0].processes[0].dead,
            "this test process is alive"
        );
        assert!(!l.process_name(own).expect("comm").is_empty());
        assert_eq!(l.process_name(12345678), Err(codes::NOT_FOUND));
    }

    #[test]
    fn memory_held_open_by_a_survivor_stays_used_unlisted() {
        // PID 0 reads as exited; our own PID as a live holder, then a PID that is gone.
        let own = std::process::id();
        let text = format!(
            "[[gpu]]\nmemory_total = 100\n[[gpu.process]]\npid = 0\nreal = true\nmemory = 10\n\
             held_open_by = [{own}]\n"
        );
        let mut l = loaded(&text, 0.0);
        assert!(
            device(&mut l, 0, None)
                .processes(ProcessList::Compute)
                .is_empty(),
            "the exited process is not listed"
        );
        assert_eq!(device(&mut l, 0, None).memory().expect("memory").used, 10);
        assert!(!l.scenario.gpus[0].processes[0].released);

        let text = "[[gpu]]\nmemory_total = 100\n[[gpu.process]]\npid = 0\nreal = true\n\
                    memory = 10\nheld_open_by = [0]\n";
        let mut l = loaded(text, 0.0);
        assert_eq!(device(&mut l, 0, None).memory().expect("memory").used, 0);
        assert!(l.scenario.gpus[0].processes[0].released);
    }

    #[test]
    fn announced_processes_count_on_the_gpus_they_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let own = std::process::id();
        // Our own PID: on GPU 0 (the scenario lists it too, with MIG off), GPU 1 (MIG on)
        // and GPU 5, which does not exist: that line names no device, and nothing fails.
        std::fs::write(dir.path().join(own.to_string()), "0 7\n1 40\n5 1\n").expect("write");
        let text = format!(
            "[[gpu]]\nmemory_total = 100\n[[gpu.process]]\npid = {own}\nreal = true\nmemory = 3\n\
             [[gpu]]\nmemory_total = 100\nmig = {{ current = 1, pending = 1 }}\n\
             [[gpu.mig_instance]]\ngpu_instance_id = 1\nmemory_total = 50\n"
        );
        let mut l = loaded(&text, 0.0);
        l.process_dir = Some(ProcessDir::new(dir.path().to_path_buf()));
        // The scenario's entry wins on GPU 0: the driver lists a PID once.
        let gpu0 = device(&mut l, 0, None).processes(ProcessList::Compute);
        assert_eq!(gpu0.len(), 1);
        assert_eq!(gpu0[0].used_memory, 3);
        assert_eq!(device(&mut l, 0, None).memory().expect("memory").used, 3);
        // GPU 1: listed on the whole GPU, compute only, in no MIG device.
        let gpu1 = device(&mut l, 1, None).processes(ProcessList::Compute);
        assert_eq!(
            gpu1,
            [ProcessEntry {
                pid: own,
                used_memory: 40,
                gpu_instance_id: NO_INSTANCE,
                compute_instance_id: NO_INSTANCE
            }]
        );
        assert_eq!(device(&mut l, 1, None).memory().expect("memory").used, 40);
        assert!(
            device(&mut l, 1, None)
                .processes(ProcessList::Graphics)
                .is_empty()
        );
        assert!(
            device(&mut l, 1, Some(0))
                .processes(ProcessList::Compute)
                .is_empty()
        );
        assert_eq!(device(&mut l, 1, Some(0)).memory().expect("mig").used, 0);
        assert_eq!(
            device(&mut l, 1, None).utilization_samples(0),
            [(own, 1_000_000, 0, 0)]
        );
        assert!(!l.process_name(own).expect("comm").is_empty());
        std::fs::remove_file(dir.path().join(own.to_string())).expect("remove");
        assert!(
            device(&mut l, 1, None)
                .processes(ProcessList::Compute)
                .is_empty()
        );
    }

    #[test]
    fn lost_and_faults() {
        let text = r#"
            [[gpu]]
            lost_at_s = 10.0
            not_supported = ["nvmlDeviceGetPowerUsage"]
            "#;
        let mut l = loaded(text, 9.0);
        assert_eq!(l.admit(Func::nvmlDeviceGetName, 0, 0, &mut None), Ok(()));
        assert_eq!(
            l.admit(Func::nvmlDeviceGetPowerUsage, 0, 0, &mut None),
            Err(codes::NOT_SUPPORTED)
        );
        assert_eq!(
            l.admit(Func::nvmlDeviceGetName, 1, 0, &mut None),
            Err(codes::INVALID_ARGUMENT)
        );
        assert_eq!(
            l.admit(Func::nvmlDeviceGetName, 0, 1, &mut None),
            Err(codes::INVALID_ARGUMENT)
        );
        l.clock.set(10.0);
        assert_eq!(
            l.admit(Func::nvmlDeviceGetName, 0, 0, &mut None),
            Err(codes::GPU_IS_LOST)
        );
    }

    #[test]
    fn utilization_samples_are_newer_than_last_seen() {
        let text = "[[gpu]]\n[[gpu.process]]\npid = 9\nsm_util = 150\nmem_util = 20\n";
        let mut l = loaded(text, 2.0);
        let samples = device(&mut l, 0, None).utilization_samples(0);
        assert_eq!(samples, [(9, 3_000_000, 100, 20)]);
        assert!(
            device(&mut l, 0, None)
                .utilization_samples(3_000_000)
                .is_empty()
        );
    }

    #[test]
    fn a_wall_step_moves_sample_timestamps_and_nothing_else() {
        let text = "[clock]\nmode = \"fixed\"\nwall_steps = [[10.0, -3600.0], [20.0, 60.0]]\n\
                    [[gpu]]\nmemory_total = \"8 GiB\"\n\
                    [[gpu.process]]\npid = 9\nsm_util = 5\nmemory = { ramp = { rate_per_s = \"1 MiB\" } }\n";
        let epoch = 10_000_000_000_u64;
        let stamp = |t: f64| {
            let mut l = loaded(text, t);
            l.epoch_us = epoch;
            let samples = device(&mut l, 0, None).utilization_samples(0);
            let used = device(&mut l, 0, None).memory().expect("memory").used;
            (samples[0].1, used)
        };
        let mib = 1 << 20;
        assert_eq!(stamp(9.0), (epoch + 9_000_000, 9 * mib));
        // Stepped back an hour: the driver's clock says earlier, memory goes on with `t`.
        assert_eq!(stamp(11.0), (epoch + 11_000_000 - 3_600_000_000, 11 * mib));
        // Steps add up.
        assert_eq!(stamp(21.0), (epoch + 21_000_000 - 3_540_000_000, 21 * mib));
    }
}
