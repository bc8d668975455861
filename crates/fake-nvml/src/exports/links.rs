//! NVLinks of a GPU and what two GPUs share (PCIe common ancestor, P2P), from the
//! scenario's `nvlink` per GPU and `[topology]`. A GPU without `nvlink` answers
//! NOT_SUPPORTED to every link call (a PCIe-only card), and a scenario without
//! `[topology]` NOT_SUPPORTED to every pair call, so older scenarios read as before.

use std::os::raw::c_uint;

use nvml_wrapper_sys::bindings::*;

use super::device_out;
use crate::codes::{self, Ret};
use crate::func::Func;
use crate::scenario::{LinkEnd, Named, NvLinkSpec, PairAnswers, PciAddress};
use crate::state::{Device, R, decode_handle};

/// The GPU's NVLinks and link `link`'s far end: NOT_SUPPORTED without NVLink (or on a MIG
/// handle), INVALID_ARGUMENT for a link index it does not have.
fn link_end<'a>(d: &'a Device<'_>, link: c_uint) -> R<(&'a NvLinkSpec, LinkEnd)> {
    let spec = d.whole_gpu()?.nvlink.as_ref().ok_or(codes::NOT_SUPPORTED)?;
    let end = spec.end(link).ok_or(codes::INVALID_ARGUMENT)?;
    Ok((spec, end))
}

/// An active link's far end; an inactive one has none (NOT_SUPPORTED).
fn active_end<'a>(d: &'a Device<'_>, link: c_uint) -> R<(&'a NvLinkSpec, LinkEnd)> {
    let (spec, end) = link_end(d, link)?;
    if spec.active(link) {
        Ok((spec, end))
    } else {
        Err(codes::NOT_SUPPORTED)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    is_active: *mut nvmlEnableState_t,
) -> Ret {
    // SAFETY: NVML's contract for `isActive`.
    unsafe {
        device_out(Func::nvmlDeviceGetNvLinkState, device, is_active, |d| {
            let (spec, _) = link_end(d, link)?;
            Ok(if spec.active(link) {
                nvmlEnableState_enum_NVML_FEATURE_ENABLED
            } else {
                nvmlEnableState_enum_NVML_FEATURE_DISABLED
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkVersion(
    device: nvmlDevice_t,
    link: c_uint,
    version: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `version`.
    unsafe {
        device_out(Func::nvmlDeviceGetNvLinkVersion, device, version, |d| {
            let (spec, _) = link_end(d, link)?;
            spec.version.ok_or(codes::NOT_SUPPORTED)
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> Ret {
    // SAFETY: NVML's contract for `pci`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetNvLinkRemotePciInfo_v2,
            device,
            pci,
            |d| {
                let (spec, end) = active_end(d, link)?;
                match end {
                    LinkEnd::Gpu(peer) => {
                        let g = d
                            .loaded
                            .scenario
                            .gpus
                            .get(peer as usize)
                            .ok_or(codes::UNKNOWN)?;
                        let address = g.pci.ok_or(codes::NOT_SUPPORTED)?;
                        Ok(pci_info(
                            address,
                            g.pci_device_id.unwrap_or(0),
                            g.pci_subsystem_id.unwrap_or(0),
                        ))
                    }
                    LinkEnd::Named(Named::Switch) => {
                        let address = spec.switch_pci.ok_or(codes::NOT_SUPPORTED)?;
                        Ok(pci_info(address, 0, 0))
                    }
                }
            },
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nvmlDevice_t,
    link: c_uint,
    kind: *mut nvmlIntNvLinkDeviceType_t,
) -> Ret {
    // SAFETY: NVML's contract for `pNvLinkDeviceType`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetNvLinkRemoteDeviceType,
            device,
            kind,
            |d| {
                Ok(match active_end(d, link)?.1 {
                    LinkEnd::Gpu(_) => nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU,
                    LinkEnd::Named(Named::Switch) => {
                        nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
                    }
                })
            },
        )
    }
}

/// What the scenario answers for `d`'s GPU and the one `other` names: INVALID_ARGUMENT for
/// a handle that names no GPU or the same one, NOT_SUPPORTED on a MIG handle.
fn pair(d: &Device<'_>, other: nvmlDevice_t) -> R<PairAnswers> {
    d.whole_gpu()?;
    let (peer, slot) = decode_handle(other).ok_or(codes::INVALID_ARGUMENT)?;
    if peer == d.gpu || peer >= d.loaded.scenario.gpus.len() {
        return Err(codes::INVALID_ARGUMENT);
    }
    if slot != 0 {
        return Err(codes::NOT_SUPPORTED);
    }
    Ok(d.loaded
        .scenario
        .topology
        .as_ref()
        .map(|t| t.answers(d.gpu, peer))
        .unwrap_or_default())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    path_info: *mut nvmlGpuTopologyLevel_t,
) -> Ret {
    // SAFETY: NVML's contract for `pathInfo`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetTopologyCommonAncestor,
            device1,
            path_info,
            |d| {
                let level = pair(d, device2)?.level.ok_or(codes::NOT_SUPPORTED)?;
                Ok(level.to_c())
            },
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetP2PStatus(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    p2p_index: nvmlGpuP2PCapsIndex_t,
    p2p_status: *mut nvmlGpuP2PStatus_t,
) -> Ret {
    // SAFETY: NVML's contract for `p2pStatus`.
    unsafe {
        device_out(Func::nvmlDeviceGetP2PStatus, device1, p2p_status, |d| {
            let answers = pair(d, device2)?;
            let status = match p2p_index {
                nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_READ => answers.p2p_read,
                nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_WRITE => answers.p2p_write,
                nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_NVLINK => answers.p2p_nvlink,
                // Atomics and the P2P property: not modelled.
                nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_ATOMICS
                | nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_PROP => None,
                _ => return Err(codes::INVALID_ARGUMENT),
            };
            Ok(status.ok_or(codes::NOT_SUPPORTED)?.to_c())
        })
    }
}

/// `nvmlPciInfo_t` for a device at `address`, as `nvmlDeviceGetPciInfo_v3` fills it.
pub(super) fn pci_info(address: PciAddress, device_id: u32, subsystem_id: u32) -> nvmlPciInfo_t {
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: address.domain,
        bus: address.bus,
        device: address.device,
        pciDeviceId: device_id,
        pciSubSystemId: subsystem_id,
        busId: [0; 32],
    };
    crate::ffi::fill_array(&mut info.busIdLegacy, &address.bus_id_legacy());
    crate::ffi::fill_array(&mut info.busId, &address.bus_id());
    info
}
