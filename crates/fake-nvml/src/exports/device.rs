//! Static device facts: identity, PCI, clocks, limits, ECC, modes.
//!
//! A MIG device handle answers only its name and UUID here; every other fact is a property
//! of the whole GPU and answers NOT_SUPPORTED on a MIG handle (consumers ask the parent).

use std::ffi::{c_char, c_int};
use std::os::raw::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::*;

use super::{device_out, device_string, fact};
use crate::codes::{self, Ret};
use crate::ffi::{Out, guard};
use crate::func::Func;
use crate::state::{as_u32, with_device};

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `name`/`length`.
    unsafe {
        device_string(Func::nvmlDeviceGetName, device, name, length, |d| {
            Ok(match d.mig_instance() {
                Some(m) => m.name.clone(),
                None => d.gpu().name.clone(),
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `uuid`/`length`.
    unsafe {
        device_string(Func::nvmlDeviceGetUUID, device, uuid, length, |d| {
            Ok(match d.mig_instance() {
                Some(m) => m.uuid.clone(),
                None => d.gpu().uuid.clone(),
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `serial`/`length`.
    unsafe {
        device_string(Func::nvmlDeviceGetSerial, device, serial, length, |d| {
            Ok(d.whole_gpu()?.serial.clone())
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(
    device: nvmlDevice_t,
    version: *mut c_char,
    length: c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `version`/`length`.
    unsafe {
        device_string(
            Func::nvmlDeviceGetVbiosVersion,
            device,
            version,
            length,
            |d| Ok(d.whole_gpu()?.vbios.clone()),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBoardPartNumber(
    device: nvmlDevice_t,
    part_number: *mut c_char,
    length: c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `partNumber`/`length`.
    unsafe {
        device_string(
            Func::nvmlDeviceGetBoardPartNumber,
            device,
            part_number,
            length,
            |d| Ok(d.whole_gpu()?.board_part_number.clone()),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> Ret {
    // SAFETY: NVML's contract for `pci`.
    unsafe {
        device_out(Func::nvmlDeviceGetPciInfo_v3, device, pci, |d| {
            let g = d.whole_gpu()?;
            let address = g.pci.ok_or(codes::NOT_SUPPORTED)?;
            Ok(super::links::pci_info(
                address,
                g.pci_device_id.unwrap_or(0),
                g.pci_subsystem_id.unwrap_or(0),
            ))
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device: nvmlDevice_t,
    type_: *mut nvmlBrandType_t,
) -> Ret {
    // SAFETY: NVML's contract for `type`.
    unsafe {
        device_out(Func::nvmlDeviceGetBrand, device, type_, |d| {
            fact(d, |g| g.brand.map(|b| b.to_c()))
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut nvmlDeviceArchitecture_t,
) -> Ret {
    // SAFETY: NVML's contract for `arch`.
    unsafe {
        device_out(Func::nvmlDeviceGetArchitecture, device, arch, |d| {
            fact(d, |g| g.architecture.map(|a| a.to_c()))
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    guard(|| {
        // SAFETY: NVML's contract for `major` and `minor`.
        let (major, minor) = unsafe { (Out::new(major)?, Out::new(minor)?) };
        let [ma, mi] = with_device(Func::nvmlDeviceGetCudaComputeCapability, device, |d| {
            fact(d, |g| g.compute_capability)
        })?;
        major.set(ma);
        minor.set(mi);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> Ret {
    // SAFETY: NVML's contract for `index`.
    unsafe {
        device_out(Func::nvmlDeviceGetIndex, device, index, |d| {
            d.whole_gpu()?;
            c_uint::try_from(d.gpu).map_err(|_| codes::UNKNOWN)
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor_number: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `minorNumber`.
    unsafe {
        device_out(Func::nvmlDeviceGetMinorNumber, device, minor_number, |d| {
            let index = c_uint::try_from(d.gpu).map_err(|_| codes::UNKNOWN)?;
            Ok(d.whole_gpu()?.minor_number.unwrap_or(index))
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryBusWidth(
    device: nvmlDevice_t,
    bus_width: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `busWidth`.
    unsafe {
        device_out(Func::nvmlDeviceGetMemoryBusWidth, device, bus_width, |d| {
            fact(d, |g| g.memory_bus_width_bits)
        })
    }
}

/// Checks a `nvmlClockType_t`: graphics, SM, memory and video exist.
fn clock_type(type_: nvmlClockType_t) -> Result<nvmlClockType_t, Ret> {
    if type_ < nvmlClockType_enum_NVML_CLOCK_COUNT {
        Ok(type_)
    } else {
        Err(codes::INVALID_ARGUMENT)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    type_: nvmlClockType_t,
    clock: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `clock`.
    unsafe {
        device_out(Func::nvmlDeviceGetMaxClockInfo, device, clock, |d| {
            let type_ = clock_type(type_)?;
            fact(d, |g| match type_ {
                nvmlClockType_enum_NVML_CLOCK_GRAPHICS => g.max_graphics_clock_mhz,
                nvmlClockType_enum_NVML_CLOCK_SM => g.max_sm_clock_mhz,
                nvmlClockType_enum_NVML_CLOCK_MEM => g.max_memory_clock_mhz,
                _ => g.max_video_clock_mhz,
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    type_: nvmlClockType_t,
    clock: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `clock`.
    unsafe {
        device_out(Func::nvmlDeviceGetClockInfo, device, clock, |d| {
            let type_ = clock_type(type_)?;
            let t = d.t();
            fact(d, |g| {
                match type_ {
                    nvmlClockType_enum_NVML_CLOCK_GRAPHICS => g.graphics_clock_mhz.as_ref(),
                    nvmlClockType_enum_NVML_CLOCK_SM => g.sm_clock_mhz.as_ref(),
                    nvmlClockType_enum_NVML_CLOCK_MEM => g.memory_clock_mhz.as_ref(),
                    _ => g.video_clock_mhz.as_ref(),
                }
                .map(|timeline| as_u32(timeline.at(t)))
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    device: nvmlDevice_t,
    max_link_gen: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `maxLinkGen`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetMaxPcieLinkGeneration,
            device,
            max_link_gen,
            |d| fact(d, |g| g.pcie.and_then(|p| p.gen_max)),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    device: nvmlDevice_t,
    max_link_width: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `maxLinkWidth`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetMaxPcieLinkWidth,
            device,
            max_link_width,
            |d| fact(d, |g| g.pcie.and_then(|p| p.width_max)),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    device: nvmlDevice_t,
    curr_link_gen: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `currLinkGen`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetCurrPcieLinkGeneration,
            device,
            curr_link_gen,
            |d| fact(d, |g| g.pcie.and_then(|p| p.gen_current)),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    device: nvmlDevice_t,
    curr_link_width: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `currLinkWidth`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetCurrPcieLinkWidth,
            device,
            curr_link_width,
            |d| fact(d, |g| g.pcie.and_then(|p| p.width_current)),
        )
    }
}

/// Answers the `NVML_PCIE_LINK_MAX_SPEED_*` code, which is what the header's enum and
/// nvml-wrapper expect, for the scenario's MB/s figure.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieLinkMaxSpeed(
    device: nvmlDevice_t,
    max_speed: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `maxSpeed`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetPcieLinkMaxSpeed,
            device,
            max_speed,
            |d| fact(d, |g| g.pcie.and_then(|p| p.max_speed_code())),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(
    device: nvmlDevice_t,
    bar1_memory: *mut nvmlBAR1Memory_t,
) -> Ret {
    // SAFETY: NVML's contract for `bar1Memory`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetBAR1MemoryInfo,
            device,
            bar1_memory,
            |d| {
                fact(d, |g| {
                    g.bar1.map(|b| nvmlBAR1Memory_t {
                        bar1Total: b.total.0,
                        bar1Free: b.total.0 - b.used.0,
                        bar1Used: b.used.0,
                    })
                })
            },
        )
    }
}

fn enable_state(on: bool) -> nvmlEnableState_t {
    if on {
        nvmlEnableState_enum_NVML_FEATURE_ENABLED
    } else {
        nvmlEnableState_enum_NVML_FEATURE_DISABLED
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: nvmlDevice_t,
    current: *mut nvmlEnableState_t,
    pending: *mut nvmlEnableState_t,
) -> Ret {
    guard(|| {
        // SAFETY: NVML's contract for `current` and `pending`.
        let (current, pending) = unsafe { (Out::new(current)?, Out::new(pending)?) };
        let ecc = with_device(Func::nvmlDeviceGetEccMode, device, |d| fact(d, |g| g.ecc))?;
        current.set(enable_state(ecc.current));
        pending.set(enable_state(ecc.pending.unwrap_or(ecc.current)));
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    error_type: nvmlMemoryErrorType_t,
    counter_type: nvmlEccCounterType_t,
    ecc_counts: *mut c_ulonglong,
) -> Ret {
    // SAFETY: NVML's contract for `eccCounts`.
    unsafe {
        device_out(Func::nvmlDeviceGetTotalEccErrors, device, ecc_counts, |d| {
            let ecc = fact(d, |g| g.ecc)?;
            match (error_type, counter_type) {
                (
                    nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED,
                    nvmlEccCounterType_enum_NVML_VOLATILE_ECC,
                ) => Ok(ecc.corrected_volatile),
                (
                    nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nvmlEccCounterType_enum_NVML_VOLATILE_ECC,
                ) => Ok(ecc.uncorrected_volatile),
                (
                    nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED,
                    nvmlEccCounterType_enum_NVML_AGGREGATE_ECC,
                ) => Ok(ecc.corrected_aggregate),
                (
                    nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nvmlEccCounterType_enum_NVML_AGGREGATE_ECC,
                ) => Ok(ecc.uncorrected_aggregate),
                _ => Err(codes::INVALID_ARGUMENT),
            }
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: nvmlDevice_t,
    mode: *mut nvmlEnableState_t,
) -> Ret {
    // SAFETY: NVML's contract for `mode`.
    unsafe {
        device_out(Func::nvmlDeviceGetPersistenceMode, device, mode, |d| {
            fact(d, |g| g.persistence_mode.map(enable_state))
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: nvmlDevice_t,
    mode: *mut nvmlComputeMode_t,
) -> Ret {
    // SAFETY: NVML's contract for `mode`.
    unsafe {
        device_out(Func::nvmlDeviceGetComputeMode, device, mode, |d| {
            fact(d, |g| g.compute_mode.map(|m| m.to_c()))
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `limit`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetPowerManagementLimit,
            device,
            limit,
            |d| fact(d, |g| g.power_limit_mw),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `limit`.
    unsafe {
        device_out(Func::nvmlDeviceGetEnforcedPowerLimit, device, limit, |d| {
            fact(d, |g| g.enforced_power_limit_mw)
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementDefaultLimit(
    device: nvmlDevice_t,
    default_limit: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `defaultLimit`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetPowerManagementDefaultLimit,
            device,
            default_limit,
            |d| fact(d, |g| g.default_power_limit_mw),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: nvmlDevice_t,
    threshold_type: nvmlTemperatureThresholds_t,
    temp: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `temp`.
    unsafe {
        device_out(Func::nvmlDeviceGetTemperatureThreshold, device, temp, |d| {
            if threshold_type >= nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_COUNT {
                return Err(codes::INVALID_ARGUMENT);
            }
            // Acoustic and GPS thresholds are valid types the fake has no values for.
            fact(d, |g| {
                let t = g.temperature_thresholds?;
                match threshold_type {
                    nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SHUTDOWN => {
                        t.shutdown_c
                    }
                    nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SLOWDOWN => {
                        t.slowdown_c
                    }
                    nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_MEM_MAX => {
                        t.mem_max_c
                    }
                    nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_GPU_MAX => {
                        t.gpu_max_c
                    }
                    _ => None,
                }
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    device: nvmlDevice_t,
    p_state: *mut nvmlPstates_t,
) -> Ret {
    // SAFETY: NVML's contract for `pState`.
    unsafe {
        device_out(Func::nvmlDeviceGetPerformanceState, device, p_state, |d| {
            fact(d, |g| g.pstate)
        })
    }
}
