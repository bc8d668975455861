//! DRM devices in sysfs: which cards are GPUs vramctl shows, who they are, and what their
//! driver and hwmon publish. Every path is under the backend's root prefix, so tests point
//! it at a directory tree (`testdata/drm/`).

use std::fs;
use std::path::{Path, PathBuf};

/// The kernel drivers whose cards vramctl reads through DRM.
///
/// Everything else is left out on purpose: `ast`/`mgag200` (a server's BMC display),
/// `simpledrm`/`efifb` (firmware framebuffers), `virtio_gpu`, and NVIDIA's cards, which
/// NVML reads (the PCI device's driver is `nvidia`; counting them here too would show the
/// same GPU twice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Driver {
    /// AMD Radeon and Instinct, dGPUs and APUs.
    Amdgpu,
    /// Intel graphics before Xe2 (integrated, DG1/DG2 Arc).
    I915,
    /// Intel's newer driver (Lunar Lake, Battlemage, and DG2 when opted in).
    Xe,
}

impl Driver {
    /// From the name of the PCI device's driver (`device/driver` link).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "amdgpu" => Some(Self::Amdgpu),
            "i915" => Some(Self::I915),
            "xe" => Some(Self::Xe),
            _ => None,
        }
    }

    /// The driver's name, as `drm-driver` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Amdgpu => "amdgpu",
            Self::I915 => "i915",
            Self::Xe => "xe",
        }
    }
}

/// A DRM card that is a GPU vramctl shows, as found in sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Card {
    /// `card0`.
    pub name: String,
    /// `<root>/sys/class/drm/card0`.
    pub dir: PathBuf,
    /// The PCI slot, `0000:03:00.0` (the basename of the `device` link's target).
    pub pci_bus_id: String,
    /// Which driver runs it.
    pub driver: Driver,
    /// PCI vendor id (`0x1002` AMD, `0x8086` Intel).
    pub vendor_id: u16,
    /// PCI device id.
    pub device_id: Option<u16>,
}

impl Card {
    /// `<card>/device`, the PCI device's directory.
    pub fn device_dir(&self) -> PathBuf {
        self.dir.join("device")
    }

    /// The stable identity of a device without a UUID: vendor and PCI slot, e.g.
    /// `PCI-1002-0000:03:00.0`. Survives reboots as long as the card stays in its slot.
    pub fn stable_id(&self) -> String {
        format!("PCI-{:04x}-{}", self.vendor_id, self.pci_bus_id)
    }

    /// Whether the card is still there and still the same device.
    pub fn present(&self) -> bool {
        pci_slot(&self.dir).as_deref() == Some(self.pci_bus_id.as_str())
    }
}

/// `<root>/sys/class/drm`.
pub fn class_dir(root: &Path) -> PathBuf {
    root.join("sys/class/drm")
}

/// The GPU cards under `root`, ordered by PCI slot (the order stays when a card comes or
/// goes elsewhere), each once; connectors (`card0-DP-1`) and render nodes are not cards.
pub fn discover(root: &Path) -> Vec<Card> {
    let Ok(entries) = fs::read_dir(class_dir(root)) else {
        return Vec::new();
    };
    let mut cards: Vec<Card> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let number = name.strip_prefix("card")?;
            if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            card(&e.path(), name)
        })
        .collect();
    cards.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id).then(a.name.cmp(&b.name)));
    cards.dedup_by(|a, b| a.pci_bus_id == b.pci_bus_id);
    cards
}

fn card(dir: &Path, name: String) -> Option<Card> {
    let device = dir.join("device");
    let driver_link = fs::read_link(device.join("driver")).ok()?;
    let driver = Driver::from_name(driver_link.file_name()?.to_str()?)?;
    let pci_bus_id = pci_slot(dir)?;
    let vendor_id = read_hex(&device.join("vendor"))?;
    Some(Card {
        name,
        dir: dir.to_path_buf(),
        pci_bus_id,
        driver,
        vendor_id,
        device_id: read_hex(&device.join("device")),
    })
}

/// The PCI slot a DRM node's `device` link points at (`0000:03:00.0`).
pub fn pci_slot(node_dir: &Path) -> Option<String> {
    let target = fs::read_link(node_dir.join("device")).ok()?;
    let slot = target.file_name()?.to_str()?.to_owned();
    // `dddd:bb:dd.f`.
    (slot.len() == 12 && slot.as_bytes()[4] == b':' && slot.as_bytes()[7] == b':').then_some(slot)
}

/// A file's trimmed text.
pub fn read_text(path: &Path) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// A decimal number file (`mem_info_vram_used`, hwmon's `temp1_input`).
pub fn read_u64(path: &Path) -> Option<u64> {
    read_text(path)?.parse().ok()
}

/// A `0x1002`-style file.
pub fn read_hex(path: &Path) -> Option<u16> {
    let text = read_text(path)?;
    u16::from_str_radix(text.trim_start_matches("0x"), 16).ok()
}

/// The card's first hwmon directory (`device/hwmon/hwmon3`).
pub fn hwmon_dir(card: &Card) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(card.device_dir().join("hwmon"))
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs.into_iter().next()
}

/// The highest level of an amdgpu `pp_dpm_*` table (`2: 2575Mhz *`) and the level in use
/// (the one marked `*`), in MHz.
pub fn dpm_levels_mhz(text: &str) -> (Option<u32>, Option<u32>) {
    let mut max = None;
    let mut current = None;
    for line in text.lines() {
        let Some((_, rest)) = line.split_once(':') else {
            continue;
        };
        let rest = rest.trim();
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(mhz) = digits.parse::<u32>() else {
            continue;
        };
        if !rest[digits.len()..].to_ascii_lowercase().starts_with("mhz") {
            continue;
        }
        max = Some(max.map_or(mhz, |m: u32| m.max(mhz)));
        if rest.ends_with('*') {
            current = Some(mhz);
        }
    }
    (max, current)
}

/// PCIe generation from a link speed file (`16.0 GT/s PCIe`).
pub fn pcie_generation(text: &str) -> Option<u32> {
    let rate: f64 = text.split_whitespace().next()?.parse().ok()?;
    // 2.5, 5, 8, 16, 32, 64 GT/s are generations 1 to 6.
    [
        (2.5, 1),
        (5.0, 2),
        (8.0, 3),
        (16.0, 4),
        (32.0, 5),
        (64.0, 6),
    ]
    .into_iter()
    .find(|(r, _)| (rate - r).abs() < 0.01)
    .map(|(_, generation)| generation)
}

/// The device's name from a `pci.ids` file under `root` (`/usr/share/hwdata`, then
/// `/usr/share/misc`), e.g. `Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]`.
pub fn pci_ids_name(root: &Path, vendor: u16, device: u16) -> Option<String> {
    for path in ["usr/share/hwdata/pci.ids", "usr/share/misc/pci.ids"] {
        if let Ok(text) = fs::read_to_string(root.join(path)) {
            return pci_ids_lookup(&text, vendor, device);
        }
    }
    None
}

/// A device's line in `pci.ids` text: a vendor line `1002  Name`, its devices after it as
/// `\t73bf  Name` (subsystems are `\t\t`).
pub fn pci_ids_lookup(text: &str, vendor: u16, device: u16) -> Option<String> {
    let vendor_tag = format!("{vendor:04x}  ");
    let device_tag = format!("\t{device:04x}  ");
    let mut in_vendor = false;
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if !line.starts_with('\t') {
            if in_vendor {
                return None;
            }
            in_vendor = line.starts_with(&vendor_tag);
            continue;
        }
        if in_vendor && let Some(name) = line.strip_prefix(&device_tag) {
            return Some(name.trim().to_owned());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpm_tables_give_the_top_level_and_the_one_in_use() {
        let sclk = "0: 500Mhz\n1: 1800Mhz *\n2: 2575Mhz\n";
        assert_eq!(dpm_levels_mhz(sclk), (Some(2575), Some(1800)));
        assert_eq!(dpm_levels_mhz("garbage\n"), (None, None));
    }

    #[test]
    fn link_speeds_map_to_generations() {
        assert_eq!(pcie_generation("16.0 GT/s PCIe"), Some(4));
        assert_eq!(pcie_generation("2.5 GT/s PCIe"), Some(1));
        assert_eq!(pcie_generation("Unknown"), None);
    }

    #[test]
    fn pci_ids_finds_the_device_under_its_vendor_only() {
        let text = "# comment\n1002  Advanced Micro Devices, Inc. [AMD/ATI]\n\
                    \t73bf  Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]\n\
                    \t\t1002 0e3a  Radeon RX 6900 XT\n8086  Intel Corporation\n\t73bf  Not this\n";
        assert_eq!(
            pci_ids_lookup(text, 0x1002, 0x73bf).as_deref(),
            Some("Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]")
        );
        assert_eq!(pci_ids_lookup(text, 0x1002, 0x1234), None);
    }
}
