//! Memory repair state and clock event reasons: what `vramctl doctor` asks beyond `info`.
//!
//! Each answers NOT_SUPPORTED when the scenario leaves its table out, as a real GPU of the
//! other generation does (page retirement before Ampere, row remapping from Ampere on).

use std::os::raw::{c_int, c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::*;

use super::{device_out, fact};
use crate::codes::{self, Ret};
use crate::ffi::{Out, guard};
use crate::func::Func;
use crate::state::with_device;

/// The fake's page addresses: page `i` of a cause at a fixed, distinct address (real ones
/// are physical addresses, which nothing here interprets).
fn page_address(cause: nvmlPageRetirementCause_t, i: c_uint) -> c_ulonglong {
    0x1_0000_0000 * (c_ulonglong::from(cause) + 1) + 0x1000 * c_ulonglong::from(i)
}

/// `nvmlDeviceGetRetiredPages` and `_v2`: the count query (`*pageCount == 0`, or too small:
/// INSUFFICIENT_SIZE with the count) or the addresses (and timestamps: the fake's are 0).
///
/// # Safety
/// `page_count` is NULL or valid for reading and writing a `c_uint`; `addresses` and
/// `timestamps` are NULL or valid for writing `*page_count` values.
unsafe fn retired_pages(
    func: Func,
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    page_count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Ret {
    guard(|| {
        // SAFETY: NVML's contract for `pageCount`.
        let count = unsafe { Out::new(page_count)? };
        let pages = with_device(func, device, |d| fact(d, |g| g.retired_pages))?;
        let n = match cause {
            nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS => {
                pages.single_bit
            }
            nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR => {
                pages.double_bit
            }
            _ => return Err(codes::INVALID_ARGUMENT),
        };
        let room = count.get();
        count.set(n);
        if room < n {
            // NVML: "Set to 0 to query the size"; a query of nothing is a success.
            return if n == 0 {
                Ok(())
            } else {
                Err(codes::INSUFFICIENT_SIZE)
            };
        }
        if n > 0 && addresses.is_null() {
            return Err(codes::INVALID_ARGUMENT);
        }
        for i in 0..n {
            let at = usize::try_from(i).map_err(|_| codes::INVALID_ARGUMENT)?;
            // SAFETY: `addresses` (and a non-null `timestamps`) hold `room >= n` values per
            // this function's contract.
            unsafe {
                addresses.add(at).write(page_address(cause, i));
                if !timestamps.is_null() {
                    timestamps.add(at).write(0);
                }
            }
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    page_count: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> Ret {
    // SAFETY: NVML's contract, as `retired_pages` states it.
    unsafe {
        retired_pages(
            Func::nvmlDeviceGetRetiredPages,
            device,
            cause,
            page_count,
            addresses,
            std::ptr::null_mut(),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    page_count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Ret {
    // SAFETY: NVML's contract, as `retired_pages` states it.
    unsafe {
        retired_pages(
            Func::nvmlDeviceGetRetiredPages_v2,
            device,
            cause,
            page_count,
            addresses,
            timestamps,
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: nvmlDevice_t,
    is_pending: *mut nvmlEnableState_t,
) -> Ret {
    // SAFETY: NVML's contract for `isPending`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetRetiredPagesPendingStatus,
            device,
            is_pending,
            |d| {
                fact(d, |g| {
                    g.retired_pages.map(|p| {
                        if p.pending {
                            nvmlEnableState_enum_NVML_FEATURE_ENABLED
                        } else {
                            nvmlEnableState_enum_NVML_FEATURE_DISABLED
                        }
                    })
                })
            },
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nvmlDevice_t,
    corr_rows: *mut c_uint,
    unc_rows: *mut c_uint,
    is_pending: *mut c_uint,
    failure_occurred: *mut c_uint,
) -> Ret {
    guard(|| {
        // SAFETY: NVML's contract for the four out-pointers.
        let (corr, unc, pending, failure) = unsafe {
            (
                Out::new(corr_rows)?,
                Out::new(unc_rows)?,
                Out::new(is_pending)?,
                Out::new(failure_occurred)?,
            )
        };
        let rows = with_device(Func::nvmlDeviceGetRemappedRows, device, |d| {
            fact(d, |g| g.remapped_rows)
        })?;
        corr.set(rows.correctable);
        unc.set(rows.uncorrectable);
        pending.set(c_uint::from(rows.pending));
        failure.set(c_uint::from(rows.failure));
        Ok(())
    })
}

/// The four clock-reason functions: the current or the supported bits.
///
/// # Safety
/// `reasons` is NULL or valid for writing a `c_ulonglong`.
unsafe fn clock_reasons(
    func: Func,
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
    supported: bool,
) -> Ret {
    // SAFETY: per this function's contract.
    unsafe {
        device_out(func, device, reasons, |d| {
            fact(d, |g| {
                g.clock_event_reasons.map(|r| {
                    if supported {
                        r.supported.unwrap_or(r.current)
                    } else {
                        r.current
                    }
                })
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> Ret {
    // SAFETY: NVML's contract for `clocksEventReasons`.
    unsafe {
        clock_reasons(
            Func::nvmlDeviceGetCurrentClocksEventReasons,
            device,
            reasons,
            false,
        )
    }
}

/// The name before driver 535 (still exported, deprecated).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> Ret {
    // SAFETY: NVML's contract for `clocksThrottleReasons`.
    unsafe {
        clock_reasons(
            Func::nvmlDeviceGetCurrentClocksThrottleReasons,
            device,
            reasons,
            false,
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksEventReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> Ret {
    // SAFETY: NVML's contract for `supportedClocksEventReasons`.
    unsafe {
        clock_reasons(
            Func::nvmlDeviceGetSupportedClocksEventReasons,
            device,
            reasons,
            true,
        )
    }
}

/// The name before driver 535 (still exported, deprecated).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> Ret {
    // SAFETY: NVML's contract for `supportedClocksThrottleReasons`.
    unsafe {
        clock_reasons(
            Func::nvmlDeviceGetSupportedClocksThrottleReasons,
            device,
            reasons,
            true,
        )
    }
}

/// The one field the fake answers: the GPU recovery action (230).
const FIELD_RECOVERY_ACTION: c_uint = 230;

/// `nvmlDeviceGetFieldValues`: each requested field gets its own `nvmlReturn`; the fake
/// knows only the recovery action (from `recovery_action`), every other field answers
/// NOT_SUPPORTED in its slot while the call succeeds, as NVML does.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    values_count: c_int,
    values: *mut nvmlFieldValue_t,
) -> Ret {
    guard(|| {
        let n = usize::try_from(values_count).map_err(|_| codes::INVALID_ARGUMENT)?;
        if values.is_null() || !values.is_aligned() {
            return Err(codes::INVALID_ARGUMENT);
        }
        let action = with_device(Func::nvmlDeviceGetFieldValues, device, |d| {
            Ok(d.whole_gpu()?.recovery_action)
        })?;
        // SAFETY: NVML's contract: `values` holds `valuesCount` entries the caller filled
        // with field ids.
        let slots = unsafe { std::slice::from_raw_parts_mut(values, n) };
        for slot in slots {
            slot.timestamp = 0;
            slot.latencyUsec = 0;
            match (slot.fieldId, action) {
                (FIELD_RECOVERY_ACTION, Some(a)) => {
                    slot.valueType = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
                    slot.value = nvmlValue_t { uiVal: a };
                    slot.nvmlReturn = codes::SUCCESS;
                }
                _ => slot.nvmlReturn = codes::NOT_SUPPORTED,
            }
        }
        Ok(())
    })
}
