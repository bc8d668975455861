//! `vramctl info`: hardware diagnostics per device, like GPU-Z's Graphics Card tab.
//!
//! Everything comes from NVML at the time of the call; what NVML does not report is shown
//! as not reported with the driver's reason, never guessed. Derived figures (memory and
//! PCIe bandwidth) are computed only from reported inputs.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::Context;
use serde::Serialize;
use vramctl_core::topology::{
    GpuPair, NvLinkRemote, active_count, describe_p2p, inactive_links, same_bus_id,
};
use vramctl_core::types::{
    DeviceDiagnostics, DriverInfo, MigInstanceInfo, NVLINKS_KEY, Unavailable,
};

use vramctl_observe::gpu_selection::GpuFilter;

use super::open_sampler;
use crate::cli::{GlobalArgs, InfoArgs};
use crate::exit::Exit;
use crate::output::emit::{Format, Lines, emit};
use crate::output::style::{Styles, paint};
use vramctl_observe::units;

/// Version of the JSON below.
pub const SCHEMA: u32 = 1;

#[derive(Debug, Serialize)]
struct InfoReport {
    schema: u32,
    driver: DriverInfo,
    devices: Vec<DeviceInfoReport>,
    unopened: Vec<UnopenedInfo>,
    /// Every two devices shown, lower index first (none with fewer than two: left out).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    topology: Vec<PairReport>,
}

/// Two GPUs as `nvidia-smi topo -m` and `topo -p2p` see them.
#[derive(Debug, Serialize)]
struct PairReport {
    #[serde(flatten)]
    pair: GpuPair,
    /// `nvidia-smi topo -m`'s cell: `NV18`, `PIX`, `PXB`, `PHB`, `NODE`, `SYS`.
    smi_label: Option<String>,
}

#[derive(Debug, Serialize)]
struct UnopenedInfo {
    index: u32,
    reason: String,
}

#[derive(Debug, Serialize)]
struct DeviceInfoReport {
    index: u32,
    uuid: String,
    name: Option<String>,
    pci_bus_id: Option<String>,
    minor_number: Option<u32>,
    /// `ok`, `lost` or `error`.
    state: &'static str,
    error: Option<String>,
    #[serde(flatten)]
    diagnostics: Option<DeviceDiagnostics>,
    memory_bandwidth_bytes_per_sec: Option<u64>,
    pcie_current_bytes_per_sec: Option<u64>,
    pcie_max_bytes_per_sec: Option<u64>,
    mig_instances: Vec<MigInstanceInfo>,
    /// amdgpu's GTT and CPU-visible VRAM (`gtt_total`, `gtt_used`, `visible_vram_total`,
    /// `visible_vram_used`, bytes), where sysfs has them; absent elsewhere (docs/vendors.md).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    amdgpu_memory_bytes: std::collections::BTreeMap<&'static str, u64>,
}

/// Runs `info`.
pub fn run(global: &GlobalArgs, args: &InfoArgs) -> anyhow::Result<Exit> {
    let mut sampler = open_sampler(global)?;
    let filter = GpuFilter::new(&args.gpu.selectors, sampler.devices())?;
    sampler.read_cuda_driver_version();
    let driver = (**sampler.driver()).clone();
    // As enumerated at start-up: a whole tick (every reading of every GPU) is not needed.
    let unopened = sampler.unopened().to_vec();
    let drm_root = global
        .drm_root
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("/"));
    let chosen: Vec<_> = sampler
        .diagnostics()
        .into_iter()
        .filter(|(info, _)| filter.matches(info))
        .collect();
    let topology = sampler
        .gpu_pairs(&chosen)
        .into_iter()
        .map(|pair| PairReport {
            smi_label: pair.smi_label(),
            pair,
        })
        .collect();
    let devices = chosen
        .into_iter()
        .map(|(info, result)| {
            let (state, error, diagnostics) = match result {
                Ok(d) => ("ok", None, Some(d)),
                Err(vramctl_gpu::DeviceError::Lost(e)) => ("lost", Some(e), None),
                Err(e) => ("error", Some(e.to_string()), None),
            };
            DeviceInfoReport {
                index: info.index,
                uuid: info.uuid.clone(),
                name: info.name.clone(),
                pci_bus_id: info.pci_bus_id.clone(),
                minor_number: info.minor_number,
                state,
                error,
                memory_bandwidth_bytes_per_sec: diagnostics
                    .as_ref()
                    .and_then(DeviceDiagnostics::memory_bandwidth_bytes_per_sec),
                pcie_current_bytes_per_sec: diagnostics
                    .as_ref()
                    .and_then(DeviceDiagnostics::pcie_current_bytes_per_sec),
                pcie_max_bytes_per_sec: diagnostics
                    .as_ref()
                    .and_then(DeviceDiagnostics::pcie_max_bytes_per_sec),
                diagnostics,
                mig_instances: info.mig_instances.clone(),
                amdgpu_memory_bytes: if info.uuid.starts_with("PCI-1002-") {
                    vramctl_gpu::backend::drm::amdgpu_extra_memory(&info, &drm_root)
                        .into_iter()
                        .collect()
                } else {
                    std::collections::BTreeMap::new()
                },
            }
        })
        .collect();
    let report = InfoReport {
        schema: SCHEMA,
        driver,
        devices,
        unopened: unopened
            .iter()
            .map(|u| UnopenedInfo {
                index: u.index,
                reason: u.reason.to_string(),
            })
            .collect(),
        topology,
    };
    let mut out = std::io::stdout().lock();
    emit(
        &mut out,
        args.print.format(Format::JsonPretty),
        || &report,
        || Lines::Styled(render(&report, &Styles::for_stdout(global.color))),
    )?;
    out.flush().context("cannot write to stdout")?;
    Ok(Exit::Ok)
}

/// Formats one value, or "not reported (why)".
struct Fields<'a> {
    missing: &'a BTreeMap<String, Unavailable>,
    lines: Vec<String>,
}

impl Fields<'_> {
    fn section(&mut self, title: &str, styles: &Styles) {
        self.lines
            .push(format!("  {}", paint(styles.heading, title)));
    }

    fn row(&mut self, label: &str, value: String) {
        self.lines.push(format!("    {label:<22}{value}"));
    }

    /// `value` when present, else why the keys it depends on are missing.
    fn opt(&mut self, label: &str, value: Option<String>, keys: &[&str]) {
        let text = value.unwrap_or_else(|| self.why(keys));
        self.row(label, text);
    }

    fn why(&self, keys: &[&str]) -> String {
        let reasons: Vec<String> = keys
            .iter()
            .filter_map(|k| self.missing.get(*k).map(|why| format!("{k}: {why}")))
            .collect();
        if reasons.is_empty() {
            "not reported".into()
        } else {
            format!("not reported ({})", reasons.join("; "))
        }
    }
}

fn yes_no(value: bool) -> &'static str {
    if value { "enabled" } else { "disabled" }
}

fn render(report: &InfoReport, styles: &Styles) -> Vec<String> {
    let mut lines = Vec::new();
    for device in &report.devices {
        lines.push(paint(
            styles.heading,
            &format!(
                "GPU {}  {}",
                device.index,
                device.name.as_deref().unwrap_or("(name not reported)")
            ),
        ));
        let Some(d) = &device.diagnostics else {
            lines.push(format!(
                "  {}",
                paint(
                    styles.bad,
                    &format!(
                        "{}: {}",
                        device.state,
                        device.error.as_deref().unwrap_or("")
                    )
                )
            ));
            lines.push(String::new());
            continue;
        };
        let mut f = Fields {
            missing: &d.missing,
            lines: Vec::new(),
        };
        f.section("Identity", styles);
        f.row("UUID", device.uuid.clone());
        f.opt("Serial", d.serial.clone(), &["serial"]);
        f.opt("VBIOS", d.vbios_version.clone(), &["vbios_version"]);
        f.opt(
            "Board part number",
            d.board_part_number.clone(),
            &["board_part_number"],
        );
        f.opt("PCI bus id", device.pci_bus_id.clone(), &["pci"]);
        f.opt(
            "PCI device id",
            d.pci_device_id.map(|id| match d.pci_subsystem_id {
                Some(sub) => format!("0x{id:08X} (subsystem 0x{sub:08X})"),
                None => format!("0x{id:08X}"),
            }),
            &["pci"],
        );
        f.opt("Brand", d.brand.clone(), &["brand"]);
        f.opt("Architecture", d.architecture.clone(), &["architecture"]);
        f.opt(
            "Compute capability",
            d.compute_capability.map(|c| c.to_string()),
            &["compute_capability"],
        );
        if let Some(minor) = device.minor_number {
            f.row("Device node", format!("/dev/nvidia{minor}"));
        }

        f.section("Memory", styles);
        f.opt(
            "Total",
            d.memory
                .map(|m| format!("{} ({} bytes)", units::bytes(m.total_bytes), m.total_bytes)),
            &["memory"],
        );
        f.opt(
            "Used / reserved",
            d.memory.map(|m| {
                format!(
                    "{} used, {} reserved, {} free",
                    units::bytes(m.used_bytes),
                    units::bytes(m.reserved_bytes),
                    units::bytes(m.free_bytes)
                )
            }),
            &["memory"],
        );
        f.opt(
            "Bus width",
            d.memory_bus_width_bits.map(|b| format!("{b} bit")),
            &["memory_bus_width"],
        );
        f.opt(
            "Max memory clock",
            d.max_memory_clock_mhz.map(|c| format!("{c} MHz")),
            &["max_memory_clock"],
        );
        f.opt(
            "Memory clock now",
            d.memory_clock_mhz.map(|c| format!("{c} MHz")),
            &["memory_clock"],
        );
        f.opt(
            "Bandwidth",
            device.memory_bandwidth_bytes_per_sec.map(|bw| {
                format!(
                    "{} theoretical (2 × {} MHz × {} bit / 8)",
                    units::rate(bw),
                    d.max_memory_clock_mhz.unwrap_or_default(),
                    d.memory_bus_width_bits.unwrap_or_default()
                )
            }),
            &["memory_bus_width", "max_memory_clock"],
        );
        f.opt(
            "BAR1",
            d.bar1_total_bytes.map(|total| {
                format!(
                    "{} total, {} used",
                    units::bytes(total),
                    units::opt_bytes(d.bar1_used_bytes)
                )
            }),
            &["bar1"],
        );
        f.opt(
            "ECC",
            d.ecc_enabled.map(|on| match d.ecc_pending {
                Some(pending) if pending != on => {
                    format!("{} (pending: {})", yes_no(on), yes_no(pending))
                }
                _ => yes_no(on).to_owned(),
            }),
            &["ecc_mode"],
        );
        let count = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |n| n.to_string());
        if d.ecc_corrected_volatile.is_some() || d.ecc_corrected_aggregate.is_some() {
            f.row(
                "ECC errors",
                format!(
                    "volatile {} corrected / {} uncorrected, aggregate {} / {}",
                    count(d.ecc_corrected_volatile),
                    count(d.ecc_uncorrected_volatile),
                    count(d.ecc_corrected_aggregate),
                    count(d.ecc_uncorrected_aggregate)
                ),
            );
        } else {
            f.opt("ECC errors", None, &["ecc_corrected_volatile"]);
        }

        for (label, total, used) in [
            ("GTT", "gtt_total", "gtt_used"),
            (
                "CPU-visible VRAM",
                "visible_vram_total",
                "visible_vram_used",
            ),
        ] {
            let m = &device.amdgpu_memory_bytes;
            if let (Some(total), Some(used)) = (m.get(total), m.get(used)) {
                f.row(
                    label,
                    format!("{} used of {}", units::bytes(*used), units::bytes(*total)),
                );
            }
        }
        f.section("PCIe", styles);
        f.opt(
            "Link now",
            d.pcie_gen_current.zip(d.pcie_width_current).map(|(g, w)| {
                let bw = device
                    .pcie_current_bytes_per_sec
                    .map(units::rate)
                    .unwrap_or_default();
                format!("gen {g} ×{w}, {bw} per direction")
            }),
            &["pcie_gen_current", "pcie_width_current"],
        );
        f.opt(
            "Link max",
            d.pcie_gen_max.zip(d.pcie_width_max).map(|(g, w)| {
                let bw = device
                    .pcie_max_bytes_per_sec
                    .map(units::rate)
                    .unwrap_or_default();
                format!("gen {g} ×{w}, {bw} per direction")
            }),
            &["pcie_gen_max", "pcie_width_max"],
        );

        nvlink_section(&mut f, d, report, styles);

        f.section("Modes", styles);
        f.opt(
            "Persistence",
            d.persistence_mode.map(|p| yes_no(p).to_owned()),
            &["persistence_mode"],
        );
        f.opt("Compute mode", d.compute_mode.clone(), &["compute_mode"]);
        f.opt(
            "MIG",
            d.mig_current.map(|on| match d.mig_pending {
                Some(pending) if pending != on => {
                    format!("{} (pending: {})", yes_no(on), yes_no(pending))
                }
                _ => yes_no(on).to_owned(),
            }),
            &["mig_mode"],
        );
        for mig in &device.mig_instances {
            let ids = match (mig.gpu_instance_id, mig.compute_instance_id) {
                (Some(gi), Some(ci)) => format!("GI {gi} CI {ci}  "),
                _ => String::new(),
            };
            f.row(
                "  instance",
                format!("{ids}{}  {}", mig.name.as_deref().unwrap_or("?"), mig.uuid),
            );
        }
        f.opt(
            "Performance state",
            d.performance_state.clone(),
            &["performance_state"],
        );

        f.section("Power and temperature", styles);
        f.opt(
            "Power limit",
            d.power_limit_mw.map(|p| {
                let mut text = units::watts(p);
                if let Some(e) = d.enforced_power_limit_mw {
                    text.push_str(&format!(", enforced {}", units::watts(e)));
                }
                if let Some(def) = d.default_power_limit_mw {
                    text.push_str(&format!(", default {}", units::watts(def)));
                }
                text
            }),
            &["power_limit"],
        );
        f.opt(
            "Temperature",
            d.temperature_c.map(|t| format!("{t}°C")),
            &["temperature"],
        );
        let thresholds: Vec<String> = [
            ("slowdown", d.temperature_slowdown_c),
            ("shutdown", d.temperature_shutdown_c),
            ("GPU max", d.temperature_gpu_max_c),
            ("memory max", d.temperature_memory_max_c),
        ]
        .iter()
        .filter_map(|(name, t)| t.map(|t| format!("{name} {t}°C")))
        .collect();
        f.opt(
            "Thresholds",
            (!thresholds.is_empty()).then(|| thresholds.join(", ")),
            &["temperature_slowdown", "temperature_shutdown"],
        );
        lines.append(&mut f.lines);
        lines.push(String::new());
    }
    lines.extend(topology_lines(report, styles));
    for unopened in &report.unopened {
        lines.push(paint(
            styles.bad,
            &format!(
                "GPU {}  could not be opened: {}",
                unopened.index, unopened.reason
            ),
        ));
        lines.push(String::new());
    }
    let v = |s: &Option<String>| s.clone().unwrap_or_else(|| "not reported".into());
    lines.push(format!(
        "Driver {} · NVML {} · CUDA driver {}",
        v(&report.driver.driver_version),
        v(&report.driver.nvml_version),
        v(&report.driver.cuda_driver_version)
    ));
    lines
}

/// The GPU's NVLinks, where NVML reports any (a GPU without NVLink has no section): how many
/// are active, which are not, and where the active ones go.
fn nvlink_section(f: &mut Fields<'_>, d: &DeviceDiagnostics, report: &InfoReport, styles: &Styles) {
    let links = match &d.nvlinks {
        Some(links) if !links.is_empty() => links,
        Some(_) => return,
        None => {
            if d.missing.contains_key(NVLINKS_KEY) {
                f.section("NVLink", styles);
                f.opt("Links", None, &[NVLINKS_KEY]);
            }
            return;
        }
    };
    f.section("NVLink", styles);
    let active = active_count(links);
    let down: Vec<String> = inactive_links(links)
        .iter()
        .map(ToString::to_string)
        .collect();
    let mut text = format!("{active} of {} active", links.len());
    if !down.is_empty() && active > 0 {
        text.push_str(&format!(", inactive: {}", down.join(", ")));
    }
    f.row("Links", text);
    // Where the active links go, in link order: "18 to NVSwitch", "4 to GPU 1".
    let mut ends: Vec<(String, usize)> = Vec::new();
    for link in links.iter().filter(|l| l.active) {
        let end = match (link.remote_device, link.remote_pci_bus_id.as_deref()) {
            (Some(NvLinkRemote::Switch), _) => "NVSwitch".to_owned(),
            (_, Some(bus)) => report
                .devices
                .iter()
                .find(|g| g.pci_bus_id.as_deref().is_some_and(|b| same_bus_id(b, bus)))
                .map_or_else(|| bus.to_owned(), |g| format!("GPU {}", g.index)),
            (Some(NvLinkRemote::Gpu), None) => "a GPU".to_owned(),
            (Some(NvLinkRemote::IbmNpu), None) => "an IBM NPU".to_owned(),
            _ => "not reported".to_owned(),
        };
        match ends.iter_mut().find(|(e, _)| *e == end) {
            Some((_, n)) => *n += 1,
            None => ends.push((end, 1)),
        }
    }
    if !ends.is_empty() {
        let to: Vec<String> = ends.iter().map(|(e, n)| format!("{n} to {e}")).collect();
        f.row("Connected", to.join(", "));
    }
    let mut versions: Vec<u32> = links.iter().filter_map(|l| l.version).collect();
    versions.sort_unstable();
    versions.dedup();
    if !versions.is_empty() {
        let v: Vec<String> = versions.iter().map(ToString::to_string).collect();
        f.row("Version (NVML)", v.join(", "));
    }
}

/// `nvidia-smi topo -m`'s matrix for the GPUs shown, and each pair's P2P support, where
/// NVML answered anything about them (nothing is printed otherwise).
fn topology_lines(report: &InfoReport, styles: &Styles) -> Vec<String> {
    let pairs = &report.topology;
    if pairs.iter().all(|p| p.smi_label.is_none()) {
        return Vec::new();
    }
    let mut indices: Vec<u32> = pairs.iter().flat_map(|p| p.pair.gpus).collect();
    indices.sort_unstable();
    indices.dedup();
    let cell = |a: u32, b: u32| -> String {
        if a == b {
            return "X".to_owned();
        }
        pairs
            .iter()
            .find(|p| p.pair.gpus == [a.min(b), a.max(b)])
            .and_then(|p| p.smi_label.clone())
            .unwrap_or_else(|| "?".to_owned())
    };
    let names: Vec<String> = indices.iter().map(|i| format!("GPU{i}")).collect();
    let width = pairs
        .iter()
        .filter_map(|p| p.smi_label.as_ref().map(String::len))
        .chain(names.iter().map(String::len))
        .max()
        .unwrap_or(4)
        + 2;
    let mut lines = vec![paint(styles.heading, "Topology (nvidia-smi topo -m)")];
    let header: String = names.iter().map(|n| format!("{n:<width$}")).collect();
    lines.push(format!("  {:<width$}{}", "", header.trim_end()));
    for (row, name) in indices.iter().zip(&names) {
        let cells: String = indices
            .iter()
            .map(|col| format!("{:<width$}", cell(*row, *col)))
            .collect();
        lines.push(format!("  {name:<width$}{}", cells.trim_end()));
    }
    lines.push(
        "  NV#: # NVLinks · PIX: at most one PCIe bridge · PXB: several bridges · PHB: a host bridge"
            .to_owned(),
    );
    lines.push("  NODE: host bridges within a NUMA node · SYS: across NUMA nodes".to_owned());
    let answered: Vec<&PairReport> = pairs
        .iter()
        .filter(|p| p.pair.facts.p2p_read.is_some() || p.pair.facts.p2p_write.is_some())
        .collect();
    if !answered.is_empty() {
        lines.push(format!(
            "  {}",
            paint(styles.heading, "P2P (nvidia-smi topo -p2p r, w, n)")
        ));
        for p in answered {
            let [a, b] = p.pair.gpus;
            let between = format!("GPU {a} - GPU {b}");
            lines.push(format!(
                "    {between:<22}read {}, write {}, NVLink {}",
                describe_p2p(p.pair.facts.p2p_read),
                describe_p2p(p.pair.facts.p2p_write),
                describe_p2p(p.pair.facts.p2p_nvlink)
            ));
        }
    }
    lines.push(String::new());
    lines
}
