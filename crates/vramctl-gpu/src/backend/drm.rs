//! The DRM backend: AMD (`amdgpu`) and Intel (`i915`, `xe`) GPUs through sysfs and DRM
//! fdinfo, with no vendor library.
//!
//! - **Devices**: `/sys/class/drm/cardN` whose PCI device's driver is one of
//!   [`Driver`](sysfs::Driver) (`sysfs::discover`); a BMC display (`ast`), a firmware
//!   framebuffer and NVIDIA's cards are not shown here (NVML shows NVIDIA's). Identity is
//!   vendor + PCI slot (`PCI-1002-0000:03:00.0`): these devices have no UUID.
//! - **Device memory**: amdgpu's `mem_info_vram_total`/`_used` (bytes; its own reservations
//!   are inside `used`, so `reserved` is 0). xe publishes only the VRAM size
//!   (`tileN/physical_vram_size_bytes`) and i915 nothing, so there memory is not reported
//!   (`None`, never a guess); `info` shows what there is (GTT and visible VRAM on amdgpu).
//! - **Utilization**: amdgpu's `gpu_busy_percent`/`mem_busy_percent`; elsewhere the busiest
//!   engine's share of the time between two ticks, summed over clients from fdinfo
//!   (`drm-engine-*` nanoseconds, or xe's `drm-cycles-*` over `drm-total-cycles-*`), over
//!   `drm-engine-capacity-*` engines. The first tick has none.
//! - **Temperature, power, clocks**: the card's hwmon (`temp1_input`, `power1_average` or
//!   `power1_input`, else `energy1_input` between ticks) and amdgpu's `pp_dpm_*`, i915's
//!   `gt_*_freq_mhz`.
//! - **Processes**: one walk of `/proc` per tick (`clients::scan`), each client once
//!   (`drm-client-id`); a process's memory is what its clients hold resident in the
//!   device's own memory (`vram*`, `local*` regions; on an integrated Intel GPU, which has
//!   none, every region but `cpu`). Processes this user may not read are counted and
//!   reported (a `dropped` entry), and malformed fdinfo lines too.
//!
//! Every path is under a root prefix ([`DrmBackend::with_root`]), so tests run on
//! directory trees laid out as `/sys` and `/proc` (`testdata/drm/`, `docs/vendors.md`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::{Backend, DeviceError, Enumeration};
use vramctl_core::clock::ClockTime;
use vramctl_core::types::{
    DeviceDiagnostics, DeviceInfo, DeviceReading, DriverInfo, Dropped, Field, MemoryReading,
    ProcessKind, ProcessUsage, Unavailable,
};

pub mod clients;
pub mod fdinfo;
pub mod sysfs;

use clients::{ClientKey, Scan};
use sysfs::{Card, Driver, read_text, read_u64};

/// The environment variable that moves the DRM backend's root (`/` by default): for tests,
/// which point it at `testdata/drm/...`, and for reading a host's `/sys` and `/proc`
/// mounted elsewhere.
pub const ROOT_ENV: &str = "VRAMCTL_DRM_ROOT";

/// Reads AMD and Intel GPUs through sysfs and DRM fdinfo.
#[derive(Debug)]
pub struct DrmBackend {
    root: PathBuf,
    cards: Vec<Card>,
    /// DRM node name → PCI slot, for clients that print no `drm-pdev`.
    minor_slots: HashMap<String, String>,
    /// The current tick's time ([`Backend::begin_tick`]).
    tick: Option<ClockTime>,
    /// This tick's walk of /proc, with the tick it belongs to.
    scan: Option<(Option<ClockTime>, Scan)>,
    /// The previous tick's engine counters per client, and when they were read.
    engines_before: Option<(ClockTime, BTreeMap<ClientKey, EngineCounters>)>,
    /// Per PCI slot, the busiest engine's share between the last two walks.
    engine_percent: HashMap<String, u32>,
    /// Per PCI slot, the last `energy1_input` (µJ) and when it was read.
    energy_before: HashMap<String, (ClockTime, u64)>,
    /// Devices whose clients showed device-local memory regions (an i915 dGPU says so
    /// only there).
    local_memory_seen: HashSet<String>,
}

/// One client's engine counters.
#[derive(Debug, Clone, Default)]
struct EngineCounters {
    ns: BTreeMap<String, u64>,
    cycles: BTreeMap<String, u64>,
    total_cycles: BTreeMap<String, u64>,
    capacity: BTreeMap<String, u64>,
}

impl DrmBackend {
    /// The backend over `/`, or over [`ROOT_ENV`] when it is set.
    pub fn open() -> Self {
        let root = std::env::var_os(ROOT_ENV)
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from("/"), PathBuf::from);
        Self::with_root(root)
    }

    /// The backend over `root` (`root/sys`, `root/proc`).
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let cards = sysfs::discover(&root);
        let minor_slots = clients::minor_slots(&root);
        Self {
            root,
            cards,
            minor_slots,
            tick: None,
            scan: None,
            engines_before: None,
            engine_percent: HashMap::new(),
            energy_before: HashMap::new(),
            local_memory_seen: HashSet::new(),
        }
    }

    /// The root it reads under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// How many GPUs it found at the last enumeration.
    pub fn card_count(&self) -> usize {
        self.cards.len()
    }

    fn card(&self, device: &DeviceInfo) -> Result<&Card, DeviceError> {
        self.cards
            .iter()
            .find(|c| c.stable_id() == device.uuid)
            .ok_or_else(|| DeviceError::Failed(format!("no DRM device '{}'", device.uuid)))
    }

    /// This tick's walk of /proc, made on the first read of the tick.
    fn scan(&mut self) -> &Scan {
        let fresh = matches!(&self.scan, Some((at, _)) if at.is_some() && *at == self.tick);
        if !fresh {
            let scan = clients::scan(&self.root, &self.minor_slots);
            for client in scan.clients.values() {
                if client.info.regions.keys().any(|r| is_local_region(r)) {
                    self.local_memory_seen.insert(client.pci_bus_id.clone());
                }
            }
            self.measure_engines(&scan);
            self.scan = Some((self.tick, scan));
        }
        let tick = self.tick;
        &self.scan.get_or_insert_with(|| (tick, Scan::default())).1
    }

    /// The busiest engine's share per device between the previous walk and `scan`.
    fn measure_engines(&mut self, scan: &Scan) {
        let Some(now) = self.tick else {
            self.engine_percent.clear();
            return;
        };
        let mut counters: BTreeMap<ClientKey, EngineCounters> = scan
            .clients
            .iter()
            .map(|(key, c)| {
                (
                    key.clone(),
                    EngineCounters {
                        ns: c.info.engine_ns.clone(),
                        cycles: c.info.cycles.clone(),
                        total_cycles: c.info.total_cycles.clone(),
                        capacity: c.info.engine_capacity.clone(),
                    },
                )
            })
            .collect();
        self.engine_percent.clear();
        if let Some((before_at, before)) = &self.engines_before {
            let elapsed_ns = (now.monotonic_ms - before_at.monotonic_ms).saturating_mul(1_000_000);
            if elapsed_ns > 0 {
                self.engine_percent = engine_percent(
                    before,
                    &mut counters,
                    &scan.clients,
                    elapsed_ns,
                    &self.cards,
                );
            }
        }
        self.engines_before = Some((now, counters));
    }

    fn memory(card: &Card, reading: &mut DeviceReading) {
        let device = card.device_dir();
        match card.driver {
            Driver::Amdgpu => {
                let total = read_u64(&device.join("mem_info_vram_total"));
                let used = read_u64(&device.join("mem_info_vram_used"));
                match (total, used) {
                    (Some(total_bytes), Some(used_bytes)) => {
                        reading.memory = Some(MemoryReading {
                            total_bytes,
                            used_bytes,
                            // amdgpu counts what it sets aside inside `used`.
                            reserved_bytes: 0,
                            free_bytes: total_bytes.saturating_sub(used_bytes),
                        });
                    }
                    _ => {
                        reading
                            .missing
                            .insert(Field::Memory, Unavailable::NotSupported);
                    }
                }
            }
            Driver::I915 | Driver::Xe => {
                // Neither publishes used device memory outside debugfs.
                reading
                    .missing
                    .insert(Field::Memory, Unavailable::NotSupported);
            }
        }
    }

    fn utilization(&self, card: &Card, reading: &mut DeviceReading) {
        let device = card.device_dir();
        if card.driver == Driver::Amdgpu {
            reading.utilization_gpu_percent =
                read_u64(&device.join("gpu_busy_percent")).and_then(|v| u32::try_from(v).ok());
            reading.utilization_memory_percent =
                read_u64(&device.join("mem_busy_percent")).and_then(|v| u32::try_from(v).ok());
        }
        if reading.utilization_gpu_percent.is_none() {
            reading.utilization_gpu_percent = self.engine_percent.get(&card.pci_bus_id).copied();
        }
        if reading.utilization_gpu_percent.is_none() {
            reading.missing.insert(
                Field::Utilization,
                Unavailable::Error(
                    "measured from DRM fdinfo between two ticks; this is the first".into(),
                ),
            );
        }
    }

    fn sensors(&mut self, card: &Card, reading: &mut DeviceReading) {
        let Some(hwmon) = sysfs::hwmon_dir(card) else {
            reading
                .missing
                .insert(Field::Temperature, Unavailable::NotSupported);
            reading
                .missing
                .insert(Field::Power, Unavailable::NotSupported);
            return;
        };
        reading.temperature_c = ["temp1_input", "temp2_input"]
            .iter()
            .find_map(|f| read_u64(&hwmon.join(f)))
            .and_then(|milli| u32::try_from(milli / 1000).ok());
        if reading.temperature_c.is_none() {
            reading
                .missing
                .insert(Field::Temperature, Unavailable::NotSupported);
        }
        reading.power_mw = ["power1_average", "power1_input"]
            .iter()
            .find_map(|f| read_u64(&hwmon.join(f)))
            .and_then(|micro| u32::try_from(micro / 1000).ok());
        if reading.power_mw.is_none()
            && let Some(energy_uj) = read_u64(&hwmon.join("energy1_input"))
        {
            reading.power_mw = self.power_from_energy(card, energy_uj);
            if reading.power_mw.is_none() {
                reading.missing.insert(
                    Field::Power,
                    Unavailable::Error(
                        "measured from the energy counter between two ticks; this is the first"
                            .into(),
                    ),
                );
            }
        } else if reading.power_mw.is_none() {
            reading
                .missing
                .insert(Field::Power, Unavailable::NotSupported);
        }
    }

    /// Mean power since the previous tick's energy reading (µJ per ms is mW).
    fn power_from_energy(&mut self, card: &Card, energy_uj: u64) -> Option<u32> {
        let now = self.tick?;
        let before = self
            .energy_before
            .insert(card.pci_bus_id.clone(), (now, energy_uj));
        let (at, before_uj) = before?;
        let elapsed_ms = u64::try_from(now.monotonic_ms - at.monotonic_ms).ok()?;
        if elapsed_ms == 0 {
            // The same tick read twice: keep the earlier reading.
            self.energy_before
                .insert(card.pci_bus_id.clone(), (at, before_uj));
            return None;
        }
        u32::try_from(energy_uj.checked_sub(before_uj)? / elapsed_ms).ok()
    }

    fn processes(&mut self, card: &Card, reading: &mut DeviceReading) {
        let integrated = card.driver != Driver::Amdgpu
            && !self.local_memory_seen.contains(&card.pci_bus_id)
            && xe_vram_bytes(card).is_none();
        let scan = self.scan();
        let mut by_pid: BTreeMap<u32, Option<u64>> = BTreeMap::new();
        for client in scan
            .clients
            .values()
            .filter(|c| c.pci_bus_id == card.pci_bus_id)
        {
            let held = client_bytes(&client.info, integrated);
            let slot = by_pid.entry(client.pid).or_insert(Some(0));
            *slot = match (*slot, held) {
                (Some(sum), Some(bytes)) => Some(sum.saturating_add(bytes)),
                _ => None,
            };
        }
        reading.processes = Some(
            by_pid
                .into_iter()
                .map(|(pid, used_bytes)| ProcessUsage {
                    pid,
                    used_bytes,
                    // DRM does not tell compute from graphics contexts.
                    kind: ProcessKind::Graphics,
                    gpu_instance_id: None,
                    compute_instance_id: None,
                })
                .collect(),
        );
        if scan.denied_pids > 0 {
            reading.dropped.push(Dropped {
                field: Field::Process,
                what: format!(
                    "{} process{}",
                    scan.denied_pids,
                    if scan.denied_pids == 1 { "" } else { "es" }
                ),
                reason: "their /proc/PID/fdinfo is not readable by this user (permission denied), \
                         so their GPU memory is not listed; run as root or as their owner"
                    .into(),
            });
        }
        if scan.malformed_lines > 0 {
            reading.dropped.push(Dropped {
                field: Field::Process,
                what: format!("{} fdinfo line(s)", scan.malformed_lines),
                reason: "not in the DRM usage-stats format (key: value [unit]); skipped".into(),
            });
        }
        reading
            .missing
            .insert(Field::ProcessUtilization, Unavailable::NotSupported);
    }
}

/// Device-local memory regions: amdgpu/xe `vram`, `vram0`…, i915 `local0`….
fn is_local_region(region: &str) -> bool {
    region.starts_with("vram") || region.starts_with("local")
}

/// What a client holds on its device: its device-local regions, or on an integrated GPU
/// every region but `cpu` (amdgpu's CPU domain, not the GPU's); `None` when it prints no
/// memory at all (an older kernel), which is unknown, not zero.
fn client_bytes(info: &fdinfo::Fdinfo, integrated: bool) -> Option<u64> {
    if info.regions.is_empty() {
        return None;
    }
    Some(
        info.regions
            .iter()
            .filter(|(name, _)| {
                if integrated {
                    name.as_str() != "cpu"
                } else {
                    is_local_region(name)
                }
            })
            .filter_map(|(_, bytes)| bytes.held_bytes())
            .fold(0u64, u64::saturating_add),
    )
}

/// xe's physical VRAM, summed over tiles (`tileN/physical_vram_size_bytes`, or under
/// `tileN/memory/` on some kernels).
fn xe_vram_bytes(card: &Card) -> Option<u64> {
    if card.driver != Driver::Xe {
        return None;
    }
    let device = card.device_dir();
    let mut total: Option<u64> = None;
    for tile in 0..16 {
        let dir = device.join(format!("tile{tile}"));
        if !dir.exists() {
            break;
        }
        let bytes = read_u64(&dir.join("physical_vram_size_bytes"))
            .or_else(|| read_u64(&dir.join("memory/physical_vram_size_bytes")));
        if let Some(bytes) = bytes {
            total = Some(total.unwrap_or(0).saturating_add(bytes));
        }
    }
    total
}

/// Per device, the busiest engine's busy share of `elapsed_ns` in percent (0–100), from
/// the counters before and now. A counter lower than before stays at the earlier value
/// (the usage-stats spec: it must catch up), so `now` is raised to it.
fn engine_percent(
    before: &BTreeMap<ClientKey, EngineCounters>,
    now: &mut BTreeMap<ClientKey, EngineCounters>,
    clients: &BTreeMap<ClientKey, clients::Client>,
    elapsed_ns: i64,
    cards: &[Card],
) -> HashMap<String, u32> {
    // (slot, engine) → busy ns; (slot, engine) → (busy cycles, elapsed cycles).
    let mut busy_ns: HashMap<(String, String), (u64, u64)> = HashMap::new();
    let mut busy_cycles: HashMap<(String, String), (u64, u64, u64)> = HashMap::new();
    for (key, counters) in now.iter_mut() {
        let Some(slot) = clients.get(key).map(|c| c.pci_bus_id.clone()) else {
            continue;
        };
        let Some(prev) = before.get(key) else {
            continue;
        };
        for (engine, value) in &mut counters.ns {
            let was = prev.ns.get(engine).copied().unwrap_or(*value);
            *value = (*value).max(was);
            let capacity = counters.capacity.get(engine).copied().unwrap_or(1).max(1);
            let entry = busy_ns
                .entry((slot.clone(), engine.clone()))
                .or_insert((0, capacity));
            entry.0 = entry.0.saturating_add(*value - was);
        }
        for (engine, value) in &mut counters.cycles {
            let was = prev.cycles.get(engine).copied().unwrap_or(*value);
            *value = (*value).max(was);
            let ticks = match (
                counters.total_cycles.get(engine),
                prev.total_cycles.get(engine),
            ) {
                (Some(now_total), Some(was_total)) => now_total.saturating_sub(*was_total),
                _ => 0,
            };
            let capacity = counters.capacity.get(engine).copied().unwrap_or(1).max(1);
            let entry = busy_cycles
                .entry((slot.clone(), engine.clone()))
                .or_insert((0, 0, capacity));
            entry.0 = entry.0.saturating_add(*value - was);
            entry.1 = entry.1.max(ticks);
        }
    }
    let elapsed_ns = u64::try_from(elapsed_ns).unwrap_or(u64::MAX).max(1);
    let mut out: HashMap<String, u32> = cards.iter().map(|c| (c.pci_bus_id.clone(), 0)).collect();
    let mut raise = |slot: &str, percent: u64| {
        let percent = u32::try_from(percent.min(100)).unwrap_or(100);
        let entry = out.entry(slot.to_owned()).or_insert(0);
        *entry = (*entry).max(percent);
    };
    for ((slot, _), (ns, capacity)) in &busy_ns {
        raise(
            slot,
            ns.saturating_mul(100) / elapsed_ns.saturating_mul(*capacity),
        );
    }
    for ((slot, _), (cycles, ticks, capacity)) in &busy_cycles {
        if *ticks > 0 {
            raise(
                slot,
                cycles.saturating_mul(100) / ticks.saturating_mul(*capacity),
            );
        }
    }
    out
}

impl Backend for DrmBackend {
    fn driver(&mut self) -> DriverInfo {
        DriverInfo {
            // The DRM drivers ship with the kernel: its release is their version.
            driver_version: read_text(&self.root.join("proc/sys/kernel/osrelease")),
            nvml_version: None,
            cuda_driver_version: None,
        }
    }

    fn enumerate(&mut self) -> Result<Enumeration, DeviceError> {
        self.cards = sysfs::discover(&self.root);
        self.minor_slots = clients::minor_slots(&self.root);
        let devices = self
            .cards
            .iter()
            .enumerate()
            .map(|(index, card)| DeviceInfo {
                index: u32::try_from(index).unwrap_or(u32::MAX),
                uuid: card.stable_id(),
                name: device_name(&self.root, card),
                pci_bus_id: Some(card.pci_bus_id.clone()),
                minor_number: None,
                mig_enabled: None,
                mig_instances: Vec::new(),
            })
            .collect();
        Ok(Enumeration {
            devices,
            unopened: Vec::new(),
        })
    }

    fn device_count(&mut self) -> Result<u32, DeviceError> {
        Ok(u32::try_from(sysfs::discover(&self.root).len()).unwrap_or(u32::MAX))
    }

    fn begin_tick(&mut self, now: ClockTime) {
        self.tick = Some(now);
    }

    fn read(&mut self, device: &DeviceInfo) -> Result<DeviceReading, DeviceError> {
        let card = self.card(device)?.clone();
        if !card.present() {
            return Err(DeviceError::Lost(format!(
                "the DRM device {} ({}) is gone",
                card.pci_bus_id, card.name
            )));
        }
        let mut reading = DeviceReading::default();
        Self::memory(&card, &mut reading);
        // The walk first: utilization from fdinfo is measured by it.
        self.scan();
        self.utilization(&card, &mut reading);
        self.sensors(&card, &mut reading);
        self.processes(&card, &mut reading);
        Ok(reading)
    }

    fn diagnostics(&mut self, device: &DeviceInfo) -> Result<DeviceDiagnostics, DeviceError> {
        let card = self.card(device)?.clone();
        if !card.present() {
            return Err(DeviceError::Lost(format!(
                "the DRM device {} ({}) is gone",
                card.pci_bus_id, card.name
            )));
        }
        Ok(diagnostics(&card))
    }
}

/// The kernel's board name (amdgpu `product_name`), else the `pci.ids` name.
fn device_name(root: &Path, card: &Card) -> Option<String> {
    read_text(&card.device_dir().join("product_name"))
        .or_else(|| sysfs::pci_ids_name(root, card.vendor_id, card.device_id?))
}

fn diagnostics(card: &Card) -> DeviceDiagnostics {
    let device = card.device_dir();
    let mut d = DeviceDiagnostics {
        brand: Some(
            match card.vendor_id {
                0x1002 => "AMD",
                0x8086 => "Intel",
                _ => card.driver.as_str(),
            }
            .to_owned(),
        ),
        ..DeviceDiagnostics::default()
    };
    let hex32 = |path: &Path| sysfs::read_hex(path).map(u32::from);
    if let (Some(vendor), Some(dev)) =
        (hex32(&device.join("vendor")), hex32(&device.join("device")))
    {
        // NVML's layout: device id in the high half, vendor in the low.
        d.pci_device_id = Some(dev << 16 | vendor);
    }
    if let (Some(vendor), Some(dev)) = (
        hex32(&device.join("subsystem_vendor")),
        hex32(&device.join("subsystem_device")),
    ) {
        d.pci_subsystem_id = Some(dev << 16 | vendor);
    }
    d.vbios_version = read_text(&device.join("vbios_version"));
    d.serial = read_text(&device.join("serial_number"));
    d.board_part_number = read_text(&device.join("product_number"));
    d.pcie_gen_current =
        read_text(&device.join("current_link_speed")).and_then(|s| sysfs::pcie_generation(&s));
    d.pcie_gen_max =
        read_text(&device.join("max_link_speed")).and_then(|s| sysfs::pcie_generation(&s));
    d.pcie_width_current =
        read_u64(&device.join("current_link_width")).and_then(|v| u32::try_from(v).ok());
    d.pcie_width_max = read_u64(&device.join("max_link_width")).and_then(|v| u32::try_from(v).ok());
    match card.driver {
        Driver::Amdgpu => {
            if let (Some(total_bytes), Some(used_bytes)) = (
                read_u64(&device.join("mem_info_vram_total")),
                read_u64(&device.join("mem_info_vram_used")),
            ) {
                d.memory = Some(MemoryReading {
                    total_bytes,
                    used_bytes,
                    reserved_bytes: 0,
                    free_bytes: total_bytes.saturating_sub(used_bytes),
                });
            }
            let sclk = read_text(&device.join("pp_dpm_sclk")).map(|t| sysfs::dpm_levels_mhz(&t));
            let mclk = read_text(&device.join("pp_dpm_mclk")).map(|t| sysfs::dpm_levels_mhz(&t));
            d.max_sm_clock_mhz = sclk.and_then(|(max, _)| max);
            if let Some((max, current)) = mclk {
                d.max_memory_clock_mhz = max;
                d.memory_clock_mhz = current;
            }
        }
        Driver::I915 => {
            d.max_sm_clock_mhz = read_u64(&card.dir.join("gt_max_freq_mhz"))
                .or_else(|| read_u64(&card.dir.join("gt_RP0_freq_mhz")))
                .and_then(|v| u32::try_from(v).ok());
        }
        Driver::Xe => {
            d.max_sm_clock_mhz = read_u64(&device.join("tile0/gt0/freq0/max_freq"))
                .and_then(|v| u32::try_from(v).ok());
        }
    }
    if let Some(hwmon) = sysfs::hwmon_dir(card) {
        let celsius = |name: &str| {
            read_u64(&hwmon.join(name)).and_then(|milli| u32::try_from(milli / 1000).ok())
        };
        let milliwatts = |name: &str| {
            read_u64(&hwmon.join(name)).and_then(|micro| u32::try_from(micro / 1000).ok())
        };
        d.temperature_c = celsius("temp1_input");
        d.temperature_gpu_max_c = celsius("temp1_crit");
        d.temperature_shutdown_c = celsius("temp1_emergency");
        d.temperature_memory_max_c = celsius("temp3_crit");
        d.power_limit_mw = milliwatts("power1_cap").or_else(|| milliwatts("power1_max"));
        d.default_power_limit_mw =
            milliwatts("power1_cap_default").or_else(|| milliwatts("power1_rated_max"));
    }
    for (name, missing) in [
        ("memory", d.memory.is_none()),
        ("temperature", d.temperature_c.is_none()),
        ("power_limit", d.power_limit_mw.is_none()),
        // No DRM driver publishes the memory bus width in sysfs.
        ("memory_bus_width", true),
    ] {
        if missing {
            d.missing.insert(name.to_owned(), Unavailable::NotSupported);
        }
    }
    d
}

/// What `info` can add on amdgpu that has no field of its own: GTT and CPU-visible VRAM.
pub fn amdgpu_extra_memory(device: &DeviceInfo, root: &Path) -> Vec<(&'static str, u64)> {
    let Some(slot) = device.pci_bus_id.as_deref() else {
        return Vec::new();
    };
    let Some(card) = sysfs::discover(root)
        .into_iter()
        .find(|c| c.pci_bus_id == slot && c.driver == Driver::Amdgpu)
    else {
        return Vec::new();
    };
    let dir = card.device_dir();
    [
        ("gtt_total", "mem_info_gtt_total"),
        ("gtt_used", "mem_info_gtt_used"),
        ("visible_vram_total", "mem_info_vis_vram_total"),
        ("visible_vram_used", "mem_info_vis_vram_used"),
    ]
    .into_iter()
    .filter_map(|(name, file)| read_u64(&dir.join(file)).map(|v| (name, v)))
    .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::fs;

    pub(crate) fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/drm")
            .join(name)
    }

    /// A copy of a fixture tree a test may change (symlinks kept as links).
    pub(crate) fn scratch(name: &str) -> tempfile::TempDir {
        fn copy(from: &Path, to: &Path) {
            fs::create_dir_all(to).unwrap();
            for entry in fs::read_dir(from).unwrap() {
                let entry = entry.unwrap();
                let target = to.join(entry.file_name());
                let kind = entry.file_type().unwrap();
                if kind.is_symlink() {
                    std::os::unix::fs::symlink(fs::read_link(entry.path()).unwrap(), &target)
                        .unwrap();
                } else if kind.is_dir() {
                    copy(&entry.path(), &target);
                } else {
                    fs::copy(entry.path(), &target).unwrap();
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        copy(&fixture(name), dir.path());
        dir
    }

    fn at(ms: i64) -> ClockTime {
        ClockTime {
            unix_ms: 1_700_000_000_000 + ms,
            monotonic_ms: ms,
        }
    }

    fn only_device(backend: &mut DrmBackend) -> DeviceInfo {
        let e = backend.enumerate().unwrap();
        assert_eq!(e.devices.len(), 1, "{:?}", e.devices);
        e.devices.into_iter().next().unwrap()
    }

    fn tick(backend: &mut DrmBackend, device: &DeviceInfo, ms: i64) -> DeviceReading {
        backend.begin_tick(at(ms));
        backend.read(device).unwrap()
    }

    fn used(reading: &DeviceReading) -> Vec<(u32, Option<u64>)> {
        reading
            .processes
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| (p.pid, p.used_bytes))
            .collect()
    }

    #[test]
    fn a_bmc_display_and_connectors_are_not_gpus() {
        let mut backend = DrmBackend::with_root(fixture("amdgpu-dgpu"));
        let device = only_device(&mut backend);
        assert_eq!(device.uuid, "PCI-1002-0000:04:00.0");
        assert_eq!(device.pci_bus_id.as_deref(), Some("0000:04:00.0"));
        assert_eq!(
            device.name.as_deref(),
            Some("Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]")
        );
        assert_eq!(backend.device_count().unwrap(), 1);
        assert_eq!(
            backend.driver().driver_version.as_deref(),
            Some("6.8.0-51-generic")
        );
    }

    #[test]
    fn one_client_behind_several_descriptors_and_a_fork_is_counted_once() {
        let mut backend = DrmBackend::with_root(fixture("amdgpu-dgpu"));
        let device = only_device(&mut backend);
        let reading = tick(&mut backend, &device, 0);
        // pid 4100: client 4 behind fds 5 and 6 (and its child 4101's fd 3), client 30 on
        // fd 7; pid 2217: the old `drm-memory-vram` key only.
        assert_eq!(
            used(&reading),
            [
                (2217, Some(2068 << 10)),
                (4100, Some((44_564 + 544_428) << 10))
            ]
        );
        assert!(reading.dropped.is_empty(), "{:?}", reading.dropped);
    }

    #[test]
    fn amdgpu_reports_vram_busy_percent_and_hwmon() {
        let mut backend = DrmBackend::with_root(fixture("amdgpu-dgpu"));
        let device = only_device(&mut backend);
        let reading = tick(&mut backend, &device, 0);
        let memory = reading.memory.unwrap();
        assert_eq!(memory.total_bytes, 17_163_091_968);
        assert_eq!(memory.used_bytes, 1_386_127_360);
        assert_eq!(memory.used_bytes + memory.free_bytes, memory.total_bytes);
        assert_eq!(reading.utilization_gpu_percent, Some(97));
        assert_eq!(reading.utilization_memory_percent, Some(12));
        assert_eq!(reading.temperature_c, Some(46));
        assert_eq!(reading.power_mw, Some(9103));
        let diag = backend.diagnostics(&device).unwrap();
        assert_eq!(diag.pci_device_id, Some(0x73bf_1002));
        assert_eq!(diag.max_sm_clock_mhz, Some(2575));
        assert_eq!(diag.memory_clock_mhz, Some(1000));
        assert_eq!(diag.pcie_gen_current, Some(4));
        assert_eq!(diag.power_limit_mw, Some(220_000));
        assert_eq!(diag.temperature_gpu_max_c, Some(89));
        assert_eq!(diag.vbios_version.as_deref(), Some("113-D4120100-100"));
        assert_eq!(
            amdgpu_extra_memory(&device, &fixture("amdgpu-dgpu")),
            [
                ("gtt_total", 16_777_216_000),
                ("gtt_used", 1_051_754_496),
                ("visible_vram_total", 268_435_456),
                ("visible_vram_used", 40_157_184)
            ]
        );
    }

    #[test]
    fn an_apu_shows_its_vram_carve_out_and_no_name_without_pci_ids() {
        let mut backend = DrmBackend::with_root(fixture("amdgpu-apu"));
        let device = only_device(&mut backend);
        assert_eq!(device.name, None);
        let reading = tick(&mut backend, &device, 0);
        assert_eq!(reading.memory.map(|m| m.total_bytes), Some(512 << 20));
        // The process's VRAM share, like the device's figure; its GTT is in `info`.
        assert_eq!(used(&reading), [(5100, Some(5348 << 10))]);
        assert_eq!(
            reading.power_mw,
            Some(9103),
            "power1_input where no average"
        );
    }

    #[test]
    fn integrated_intel_counts_system_memory_and_unknown_stays_unknown() {
        let mut backend = DrmBackend::with_root(fixture("i915"));
        let device = only_device(&mut backend);
        assert_eq!(
            device.name.as_deref(),
            Some("TigerLake-LP GT2 [Iris Xe Graphics]")
        );
        let reading = tick(&mut backend, &device, 0);
        assert_eq!(reading.memory, None);
        assert_eq!(
            reading.missing.get(&Field::Memory),
            Some(&Unavailable::NotSupported)
        );
        // 7296's kernel printed no memory keys: unknown, not 0.
        assert_eq!(used(&reading), [(6100, Some(6044 << 10)), (7296, None)]);
        assert_eq!(reading.temperature_c, None);
        assert!(reading.missing.contains_key(&Field::Temperature));
        assert_eq!(reading.utilization_gpu_percent, None, "first tick");
        let diag = backend.diagnostics(&device).unwrap();
        assert_eq!(diag.max_sm_clock_mhz, Some(1350));
    }

    #[test]
    fn engine_time_between_ticks_is_utilization_over_capacity() {
        let dir = scratch("i915");
        let mut backend = DrmBackend::with_root(dir.path());
        let device = only_device(&mut backend);
        tick(&mut backend, &device, 0);
        let fdinfo = dir.path().join("proc/6100/fdinfo/12");
        let text = fs::read_to_string(&fdinfo).unwrap();
        // 0.25 s of render in 1 s: 25 %; 1.2 s of video on 2 engines: 60 %.
        let text = text
            .replace("render:      346249 ns", "render:      250346249 ns")
            .replace("video:       0 ns", "video:       1200000000 ns");
        fs::write(&fdinfo, text).unwrap();
        let reading = tick(&mut backend, &device, 1000);
        assert_eq!(reading.utilization_gpu_percent, Some(60));
        // A counter that goes back stays at its earlier value: nothing busy after.
        let text = fs::read_to_string(&fdinfo)
            .unwrap()
            .replace("video:       1200000000 ns", "video:       0 ns");
        fs::write(&fdinfo, text).unwrap();
        assert_eq!(
            tick(&mut backend, &device, 2000).utilization_gpu_percent,
            Some(0)
        );
    }

    #[test]
    fn xe_cycles_give_utilization_and_energy_gives_power() {
        let dir = scratch("xe");
        let mut backend = DrmBackend::with_root(dir.path());
        let device = only_device(&mut backend);
        assert_eq!(device.name.as_deref(), Some("DG2 [Arc A770 Graphics]"));
        let first = tick(&mut backend, &device, 0);
        assert_eq!(first.power_mw, None);
        assert!(first.missing.contains_key(&Field::Power));
        let fdinfo = dir.path().join("proc/8100/fdinfo/4");
        let text = fs::read_to_string(&fdinfo)
            .unwrap()
            .replace("drm-cycles-rcs: 28257900", "drm-cycles-rcs: 78257900")
            .replace(
                "drm-total-cycles-rcs:   7655183225",
                "drm-total-cycles-rcs:   7855183225",
            );
        fs::write(&fdinfo, text).unwrap();
        let energy = dir
            .path()
            .join("sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0/hwmon/hwmon3/energy1_input");
        // 45 J in 500 ms: 90 W.
        fs::write(&energy, "1330401000\n").unwrap();
        let second = tick(&mut backend, &device, 500);
        assert_eq!(second.utilization_gpu_percent, Some(25));
        assert_eq!(second.power_mw, Some(90_000));
    }

    #[test]
    fn malformed_fdinfo_lines_are_skipped_and_reported() {
        let mut backend = DrmBackend::with_root(fixture("xe"));
        let device = only_device(&mut backend);
        let reading = tick(&mut backend, &device, 0);
        let used = used(&reading);
        assert!(used.contains(&(8100, Some(23_992 << 10))), "{used:?}");
        assert!(used.contains(&(8200, Some(23_992 << 10))), "{used:?}");
        let malformed: Vec<&Dropped> = reading
            .dropped
            .iter()
            .filter(|d| d.what.contains("fdinfo line"))
            .collect();
        assert_eq!(malformed.len(), 1, "{:?}", reading.dropped);
        // "drm-total-vram0 oops", the pasted line, and the key cut short at the end.
        assert_eq!(malformed[0].what, "3 fdinfo line(s)");
    }

    #[test]
    fn processes_without_permission_are_counted_not_hidden() {
        use std::os::unix::fs::PermissionsExt;
        if rustix::process::geteuid().is_root() {
            // Root reads every fd/ directory; the integration test runs this as nobody.
            eprintln!("skipped: root is never denied");
            return;
        }
        let dir = scratch("xe");
        fs::set_permissions(
            dir.path().join("proc/8300/fd"),
            fs::Permissions::from_mode(0o000),
        )
        .unwrap();
        let mut backend = DrmBackend::with_root(dir.path());
        let device = only_device(&mut backend);
        let reading = tick(&mut backend, &device, 0);
        assert!(
            reading.dropped.iter().any(|d| d.what == "1 process"),
            "{:?}",
            reading.dropped
        );
    }

    #[test]
    fn a_device_that_disappears_is_lost_not_a_panic() {
        let dir = scratch("amdgpu-dgpu");
        let mut backend = DrmBackend::with_root(dir.path());
        let device = only_device(&mut backend);
        tick(&mut backend, &device, 0);
        fs::remove_file(dir.path().join("sys/class/drm/card0")).unwrap();
        backend.begin_tick(at(1000));
        assert!(matches!(backend.read(&device), Err(DeviceError::Lost(_))));
        assert!(matches!(
            backend.diagnostics(&device),
            Err(DeviceError::Lost(_))
        ));
        assert_eq!(backend.device_count().unwrap(), 0);
    }

    #[test]
    fn no_drm_tree_means_no_devices() {
        let dir = tempfile::tempdir().unwrap();
        let mut backend = DrmBackend::with_root(dir.path());
        assert!(backend.enumerate().unwrap().devices.is_empty());
        assert_eq!(backend.device_count().unwrap(), 0);
    }

    #[test]
    fn every_fixture_keeps_the_backend_contract() {
        for name in ["amdgpu-dgpu", "amdgpu-apu", "i915", "xe"] {
            let mut backend = DrmBackend::with_root(fixture(name));
            crate::backend::contract::check_contract(&mut backend);
        }
    }
}
