//! How GPUs connect, through NVML: each GPU's NVLinks (for `diagnostics`) and, between two
//! GPUs, the PCIe path and P2P support (for `gpu_pair`). What `nvidia-smi nvlink -s`,
//! `topo -m` and `topo -p2p` show.
//!
//! A driver may lack any of these calls (an old library: the symbol is missing; a PCIe-only
//! card: NOT_SUPPORTED): that is a capability, so the value is `None`, never an error of the
//! command. Only a lost GPU or a lost session fails, as everywhere in this backend.
//!
//! # What it costs
//!
//! Per GPU: one `nvmlDeviceGetNvLinkState` on a GPU without NVLink (its NOT_SUPPORTED is
//! for the whole device, so link 0 answers for all); otherwise one per link index up to
//! [`NVLINK_MAX_LINKS`] (an index the GPU lacks answers INVALID_ARGUMENT and is skipped),
//! and three more per active link (version, far end's PCI info, far end's type): 72 on a
//! GPU with 18 active links. Per pair of GPUs: four (the common ancestor, P2P read, write
//! and NVLink).

use std::collections::BTreeMap;

use nvml_wrapper::enum_wrappers::device::{
    P2pCapabilitiesIndex, P2pStatus as NvmlP2pStatus, TopologyLevel as NvmlTopologyLevel,
};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU,
    nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_IBMNPU,
    nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH,
};

use super::super::DeviceError;
use super::{describe, raw, timed, unavailable};
use vramctl_core::topology::{
    NVLINK_MAX_LINKS, NvLink, NvLinkRemote, P2pStatus, PairFacts, TopologyLevel,
};
use vramctl_core::types::{NVLINKS_KEY, Unavailable};

/// The GPU's NVLinks: `None` for a GPU without NVLink (nothing in `missing`), or when NVML
/// failed otherwise (its reason in `missing` under [`NVLINKS_KEY`]).
pub(super) fn read_links(
    nvml: &Nvml,
    device: &Device<'_>,
    missing: &mut BTreeMap<String, Unavailable>,
) -> Result<Option<Vec<NvLink>>, DeviceError> {
    let mut links = Vec::new();
    for link in 0..NVLINK_MAX_LINKS {
        let wrapper = device.link_wrapper_for(link);
        let active = match timed("nvmlDeviceGetNvLinkState", || wrapper.is_active()) {
            Ok(active) => active,
            Err(err) => match settle(err)? {
                // NVML's header: NOT_SUPPORTED "if the device doesn't support this
                // feature", i.e. the whole GPU; so link 0 answers for every link.
                Settled::Absent if link == 0 => return Ok(None),
                // INVALID_ARGUMENT: the GPU has no link of this index (an A100 has 12).
                Settled::Absent => continue,
                Settled::Failed(why) => {
                    missing.insert(NVLINKS_KEY.to_owned(), why);
                    return Ok(None);
                }
            },
        };
        let mut entry = NvLink {
            link,
            active,
            version: None,
            remote_pci_bus_id: None,
            remote_device: None,
        };
        // An inactive link has no far end, and NVML answers nothing useful about it.
        if active {
            entry.version = soft(timed("nvmlDeviceGetNvLinkVersion", || wrapper.version()))?;
            entry.remote_pci_bus_id = soft(timed("nvmlDeviceGetNvLinkRemotePciInfo_v2", || {
                wrapper.remote_pci_info()
            }))?
            .map(|pci| pci.bus_id);
            entry.remote_device = soft(timed("nvmlDeviceGetNvLinkRemoteDeviceType", || {
                raw::nvlink_remote_device_type(nvml, device, link)
            }))?
            .map(remote_kind);
        }
        links.push(entry);
    }
    Ok(Some(links))
}

/// What NVML says about two GPUs, read from `first` to `second`.
pub(super) fn read_pair(
    nvml: &Nvml,
    first: &Device<'_>,
    second_index: u32,
) -> Result<PairFacts, DeviceError> {
    let second = nvml
        .device_by_index(second_index)
        .map_err(super::device_error)?;
    let mut missing = BTreeMap::new();
    let mut p2p = |key: &str, index| -> Result<Option<P2pStatus>, DeviceError> {
        let answer = timed("nvmlDeviceGetP2PStatus", || {
            first.p2p_status(&second, index)
        });
        Ok(value(&mut missing, key, answer)?.map(p2p_status))
    };
    let p2p_read = p2p("p2p_read", P2pCapabilitiesIndex::Read)?;
    let p2p_write = p2p("p2p_write", P2pCapabilitiesIndex::Write)?;
    let p2p_nvlink = p2p("p2p_nvlink", P2pCapabilitiesIndex::NvLink)?;
    // nvml-wrapper takes the second device by value here; it is the last use.
    let level = timed("nvmlDeviceGetTopologyCommonAncestor", || {
        first.topology_common_ancestor(second)
    });
    let level = value(&mut missing, "level", level)?.map(topology_level);
    Ok(PairFacts {
        level,
        p2p_read,
        p2p_write,
        p2p_nvlink,
        missing,
    })
}

/// An NVML error, sorted: a device or session failure ends the read (`Err`); the rest is
/// a capability this driver or GPU lacks, or a failure of this one value.
enum Settled {
    /// NOT_SUPPORTED, a missing symbol or function, INVALID_ARGUMENT (no such link).
    Absent,
    /// Anything else, with its reason.
    Failed(Unavailable),
}

fn settle(err: NvmlError) -> Result<Settled, DeviceError> {
    match err {
        NvmlError::GpuLost => Err(DeviceError::Lost(describe(&NvmlError::GpuLost))),
        NvmlError::Uninitialized | NvmlError::DriverNotLoaded => {
            Err(DeviceError::SessionLost(describe(&err)))
        }
        NvmlError::NotSupported
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::FunctionNotFound
        | NvmlError::InvalidArg => Ok(Settled::Absent),
        other => Ok(Settled::Failed(unavailable(&other))),
    }
}

/// One value of a link: `None` whatever NVML's reason, unless the GPU or session is gone.
fn soft<T>(answer: Result<T, NvmlError>) -> Result<Option<T>, DeviceError> {
    match answer {
        Ok(v) => Ok(Some(v)),
        Err(err) => settle(err).map(|_| None),
    }
}

/// One value of a pair: `None` with its reason under `key` in `missing`.
fn value<T>(
    missing: &mut BTreeMap<String, Unavailable>,
    key: &str,
    answer: Result<T, NvmlError>,
) -> Result<Option<T>, DeviceError> {
    match answer {
        Ok(v) => Ok(Some(v)),
        Err(err) => {
            let why = match settle(err)? {
                Settled::Absent => Unavailable::NotSupported,
                Settled::Failed(why) => why,
            };
            missing.insert(key.to_owned(), why);
            Ok(None)
        }
    }
}

fn remote_kind(code: u32) -> NvLinkRemote {
    #[allow(non_upper_case_globals, reason = "the header's constant names")]
    match code {
        nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU => NvLinkRemote::Gpu,
        nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_IBMNPU => NvLinkRemote::IbmNpu,
        nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH => NvLinkRemote::Switch,
        _ => NvLinkRemote::Unknown,
    }
}

fn p2p_status(status: NvmlP2pStatus) -> P2pStatus {
    match status {
        NvmlP2pStatus::Ok => P2pStatus::Ok,
        NvmlP2pStatus::ChipsetNotSupported => P2pStatus::ChipsetNotSupported,
        NvmlP2pStatus::GpuNotSupported => P2pStatus::GpuNotSupported,
        NvmlP2pStatus::IohTopologyNotSupported => P2pStatus::IohTopologyNotSupported,
        NvmlP2pStatus::DisabledByRegkey => P2pStatus::DisabledByRegkey,
        NvmlP2pStatus::NotSupported => P2pStatus::NotSupported,
        NvmlP2pStatus::Unknown => P2pStatus::Unknown,
    }
}

fn topology_level(level: NvmlTopologyLevel) -> TopologyLevel {
    match level {
        NvmlTopologyLevel::Internal => TopologyLevel::Internal,
        NvmlTopologyLevel::Single => TopologyLevel::Single,
        NvmlTopologyLevel::Multiple => TopologyLevel::Multiple,
        NvmlTopologyLevel::HostBridge => TopologyLevel::HostBridge,
        NvmlTopologyLevel::Node => TopologyLevel::Node,
        NvmlTopologyLevel::System => TopologyLevel::System,
    }
}
