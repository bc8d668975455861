//! How GPUs are connected: each GPU's NVLinks and, between two GPUs, the PCIe path and
//! whether peer-to-peer (P2P) reads and writes work — the facts of `nvidia-smi topo -m`,
//! `nvidia-smi topo -p2p rw` and `nvidia-smi nvlink -s`, as NVML answers them.
//!
//! What NVML does not answer is `None` (never "no link", never "P2P ok"). The one derived
//! figure, the number of NVLinks between two GPUs ([`nvlinks_between`]), is counted from
//! the links NVML reported and nothing else.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

// The link types live beside `DeviceDiagnostics`, which holds them; named here too.
use crate::types::Unavailable;
pub use crate::types::{NvLink, NvLinkRemote};

/// NVML's `NVML_NVLINK_MAX_LINKS`: link indices a GPU may have (0..18). Bounds the reads.
pub const NVLINK_MAX_LINKS: u32 = 18;

/// `nvmlGpuTopologyLevel_t`: the closest common ancestor of two GPUs on the PCIe tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopologyLevel {
    /// On one board (e.g. Tesla K80).
    Internal,
    /// Through at most a single PCIe switch.
    Single,
    /// Through several PCIe switches, without a host bridge.
    Multiple,
    /// Through one PCIe host bridge (typically the CPU).
    HostBridge,
    /// Within one NUMA node, across host bridges.
    Node,
    /// Across NUMA nodes (the SMP interconnect, e.g. UPI).
    System,
}

impl TopologyLevel {
    /// `nvidia-smi topo -m`'s legend for this level. Its legend has no symbol of its own for
    /// a board-internal path, which goes through at most one bridge: `PIX`.
    pub fn smi_label(self) -> &'static str {
        match self {
            Self::Internal | Self::Single => "PIX",
            Self::Multiple => "PXB",
            Self::HostBridge => "PHB",
            Self::Node => "NODE",
            Self::System => "SYS",
        }
    }
}

/// `nvmlGpuP2PStatus_t`: whether one P2P capability works between two GPUs, and if not,
/// NVML's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum P2pStatus {
    /// Supported.
    Ok,
    /// The chipset does not support it.
    ChipsetNotSupported,
    /// The GPU does not support it.
    GpuNotSupported,
    /// The I/O hub topology does not support it.
    IohTopologyNotSupported,
    /// Turned off by a driver registry key.
    DisabledByRegkey,
    /// Not supported, no reason given.
    NotSupported,
    /// NVML does not know.
    Unknown,
}

impl P2pStatus {
    /// `nvidia-smi topo -p2p`'s cell for this status (its legend: OK, CNS, GNS, TNS, NS, U).
    /// `nvidia-smi` shows a registry-key block as not supported.
    pub fn smi_label(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::ChipsetNotSupported => "CNS",
            Self::GpuNotSupported => "GNS",
            Self::IohTopologyNotSupported => "TNS",
            Self::DisabledByRegkey | Self::NotSupported => "NS",
            Self::Unknown => "U",
        }
    }

    /// Words for a person: `ok`, `not supported (chipset)`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ChipsetNotSupported => "not supported (chipset)",
            Self::GpuNotSupported => "not supported (GPU)",
            Self::IohTopologyNotSupported => "not supported (I/O hub topology)",
            Self::DisabledByRegkey => "not supported (disabled by a registry key)",
            Self::NotSupported => "not supported",
            Self::Unknown => "unknown",
        }
    }
}

/// [`P2pStatus::describe`] of a status NVML may not have reported: `not reported` then.
pub fn describe_p2p(status: Option<P2pStatus>) -> &'static str {
    status.map_or("not reported", P2pStatus::describe)
}

impl fmt::Display for P2pStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// What NVML says about two GPUs, read with the lower index first (`nvmlDeviceGetP2PStatus`
/// from the first to the second).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PairFacts {
    /// `nvmlDeviceGetTopologyCommonAncestor`.
    pub level: Option<TopologyLevel>,
    /// `nvmlDeviceGetP2PStatus(NVML_P2P_CAPS_INDEX_READ)`.
    pub p2p_read: Option<P2pStatus>,
    /// `…(NVML_P2P_CAPS_INDEX_WRITE)`.
    pub p2p_write: Option<P2pStatus>,
    /// `…(NVML_P2P_CAPS_INDEX_NVLINK)`: P2P over NVLink (how GPUs on NVSwitches reach
    /// each other).
    pub p2p_nvlink: Option<P2pStatus>,
    /// Why each absent value is absent: `level`, `p2p_read`, `p2p_write`, `p2p_nvlink`.
    pub missing: BTreeMap<String, Unavailable>,
}

/// Two GPUs: who they are, what NVML said, and the NVLinks counted between them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPair {
    /// NVML indices, lower first.
    pub gpus: [u32; 2],
    /// Their UUIDs, in the same order.
    pub uuids: [String; 2],
    /// What NVML answered.
    #[serde(flatten)]
    pub facts: PairFacts,
    /// Active NVLinks between them ([`nvlinks_between`]); `None` when the first GPU's links
    /// are not known.
    pub nvlinks: Option<u32>,
}

impl GpuPair {
    /// The `nvidia-smi topo -m` cell: `NV#` over NVLinks, else the PCIe level's symbol;
    /// `None` when NVML gave neither.
    pub fn smi_label(&self) -> Option<String> {
        match self.nvlinks {
            Some(n) if n > 0 => Some(format!("NV{n}")),
            _ => self.facts.level.map(|l| l.smi_label().to_owned()),
        }
    }

    /// Whether P2P reads and writes both work (`None`: NVML did not say for one of them).
    pub fn p2p_read_write_ok(&self) -> Option<bool> {
        let read = self.facts.p2p_read?;
        let write = self.facts.p2p_write?;
        Some(read == P2pStatus::Ok && write == P2pStatus::Ok)
    }
}

/// Active NVLinks from a GPU with `links` (`None`: not known) to the GPU at `peer_bus_id`:
/// the links whose far end is that GPU's PCI bus id; where there are none, but the first
/// GPU's links go to NVSwitches and NVML says P2P over NVLink works between the two
/// (`p2p_nvlink`), every active link to a switch — what `nvidia-smi topo -m` shows as `NV18`
/// between two H200s of an HGX board.
pub fn nvlinks_between(
    links: Option<&[NvLink]>,
    peer_bus_id: Option<&str>,
    p2p_nvlink: Option<P2pStatus>,
) -> Option<u32> {
    let links = links?;
    let active = || links.iter().filter(|l| l.active);
    let direct = peer_bus_id.map_or(0, |peer| {
        active()
            .filter(|l| {
                l.remote_pci_bus_id
                    .as_deref()
                    .is_some_and(|remote| same_bus_id(remote, peer))
            })
            .count()
    });
    let count = if direct > 0 {
        direct
    } else if p2p_nvlink == Some(P2pStatus::Ok) {
        active()
            .filter(|l| l.remote_device == Some(NvLinkRemote::Switch))
            .count()
    } else {
        0
    };
    Some(u32::try_from(count).unwrap_or(u32::MAX))
}

/// PCI bus ids compare without regard to case or the domain's width (`0000:18:00.0` is
/// `00000000:18:00.0`): NVML writes the 8-digit form, some tools the legacy 4-digit one.
pub fn same_bus_id(a: &str, b: &str) -> bool {
    fn normal(id: &str) -> Option<(u64, &str)> {
        let (domain, rest) = id.trim().split_once(':')?;
        Some((u64::from_str_radix(domain, 16).ok()?, rest))
    }
    match (normal(a), normal(b)) {
        (Some((da, ra)), Some((db, rb))) => da == db && ra.eq_ignore_ascii_case(rb),
        _ => a.trim().eq_ignore_ascii_case(b.trim()),
    }
}

/// How many of `links` are active.
pub fn active_count(links: &[NvLink]) -> usize {
    links.iter().filter(|l| l.active).count()
}

/// The indices of the links of `links` that are not active, in link order.
pub fn inactive_links(links: &[NvLink]) -> Vec<u32> {
    links.iter().filter(|l| !l.active).map(|l| l.link).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(link: u32, active: bool, remote: &str, kind: NvLinkRemote) -> NvLink {
        NvLink {
            link,
            active,
            version: active.then_some(4),
            remote_pci_bus_id: active.then(|| remote.to_owned()),
            remote_device: active.then_some(kind),
        }
    }

    #[test]
    fn direct_links_are_counted_by_the_peers_bus_id() {
        let links = [
            link(0, true, "00000000:19:00.0", NvLinkRemote::Gpu),
            link(1, true, "00000000:19:00.0", NvLinkRemote::Gpu),
            link(2, true, "00000000:1A:00.0", NvLinkRemote::Gpu),
            link(3, false, "", NvLinkRemote::Gpu),
        ];
        assert_eq!(
            nvlinks_between(Some(&links), Some("0000:19:00.0"), None),
            Some(2)
        );
        assert_eq!(
            nvlinks_between(Some(&links), Some("00000000:1a:00.0"), None),
            Some(1)
        );
        assert_eq!(
            nvlinks_between(Some(&links), Some("00000000:99:00.0"), None),
            Some(0)
        );
        assert_eq!(nvlinks_between(None, Some("00000000:19:00.0"), None), None);
    }

    #[test]
    fn links_to_switches_count_only_where_p2p_over_nvlink_works() {
        let links: Vec<NvLink> = (0..18)
            .map(|i| link(i, i != 5, "00000000:00:00.0", NvLinkRemote::Switch))
            .collect();
        let peer = Some("00000000:5D:00.0");
        assert_eq!(
            nvlinks_between(Some(&links), peer, Some(P2pStatus::Ok)),
            Some(17)
        );
        assert_eq!(
            nvlinks_between(Some(&links), peer, Some(P2pStatus::NotSupported)),
            Some(0)
        );
        assert_eq!(nvlinks_between(Some(&links), peer, None), Some(0));
    }

    #[test]
    fn the_matrix_cell_is_nv_links_else_the_pcie_level() {
        let mut pair = GpuPair {
            gpus: [0, 1],
            uuids: ["GPU-a".into(), "GPU-b".into()],
            facts: PairFacts {
                level: Some(TopologyLevel::System),
                ..PairFacts::default()
            },
            nvlinks: Some(18),
        };
        assert_eq!(pair.smi_label().as_deref(), Some("NV18"));
        pair.nvlinks = Some(0);
        assert_eq!(pair.smi_label().as_deref(), Some("SYS"));
        pair.nvlinks = None;
        pair.facts.level = None;
        assert_eq!(pair.smi_label(), None);
        for (level, label) in [
            (TopologyLevel::Internal, "PIX"),
            (TopologyLevel::Single, "PIX"),
            (TopologyLevel::Multiple, "PXB"),
            (TopologyLevel::HostBridge, "PHB"),
            (TopologyLevel::Node, "NODE"),
            (TopologyLevel::System, "SYS"),
        ] {
            assert_eq!(level.smi_label(), label);
        }
    }

    #[test]
    fn p2p_read_write_needs_both_answers() {
        let mut pair = GpuPair {
            gpus: [0, 1],
            uuids: ["GPU-a".into(), "GPU-b".into()],
            facts: PairFacts::default(),
            nvlinks: None,
        };
        assert_eq!(pair.p2p_read_write_ok(), None);
        pair.facts.p2p_read = Some(P2pStatus::Ok);
        pair.facts.p2p_write = Some(P2pStatus::ChipsetNotSupported);
        assert_eq!(pair.p2p_read_write_ok(), Some(false));
        pair.facts.p2p_write = Some(P2pStatus::Ok);
        assert_eq!(pair.p2p_read_write_ok(), Some(true));
        assert_eq!(P2pStatus::ChipsetNotSupported.smi_label(), "CNS");
        assert_eq!(
            serde_json::to_value(P2pStatus::IohTopologyNotSupported).unwrap(),
            "ioh_topology_not_supported"
        );
    }

    #[test]
    fn bus_ids_compare_across_domain_widths_and_case() {
        assert!(same_bus_id("00000000:1a:00.0", "0000:1A:00.0"));
        assert!(!same_bus_id("00000001:1A:00.0", "0000:1A:00.0"));
        assert!(!same_bus_id("00000000:1B:00.0", "00000000:1A:00.0"));
        assert!(same_bus_id("odd", "ODD"));
    }
}
