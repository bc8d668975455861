//! MIG: modes, MIG device handles and their identity.
//!
//! A GPU without `mig` in its scenario does not support MIG (NOT_SUPPORTED). With MIG on,
//! `nvmlDeviceGetMigDeviceHandleByIndex` hands out one handle per `mig_instance`, in file
//! order; indices below `max_devices` without an instance answer NOT_FOUND, which is what
//! consumers looping to `nvmlDeviceGetMaxMigDeviceCount` expect and skip.

use std::os::raw::c_uint;

use nvml_wrapper_sys::bindings::nvmlDevice_t;

use super::device_out;
use crate::codes::{self, Ret};
use crate::ffi::{Out, guard};
use crate::func::Func;
use crate::state::{encode_handle, with_device};

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current_mode: *mut c_uint,
    pending_mode: *mut c_uint,
) -> Ret {
    guard(|| {
        // SAFETY: NVML's contract for `currentMode` and `pendingMode`.
        let (current, pending) = unsafe { (Out::new(current_mode)?, Out::new(pending_mode)?) };
        let mig = with_device(Func::nvmlDeviceGetMigMode, device, |d| {
            d.whole_gpu()?.mig.ok_or(codes::NOT_SUPPORTED)
        })?;
        current.set(mig.current);
        pending.set(mig.pending);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `count`.
    unsafe {
        device_out(Func::nvmlDeviceGetMaxMigDeviceCount, device, count, |d| {
            let mig = d.whole_gpu()?.mig.ok_or(codes::NOT_SUPPORTED)?;
            // "returns zero if MIG is not supported or enabled" (NVML header).
            Ok(if mig.current == 1 { mig.max_devices } else { 0 })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> Ret {
    // SAFETY: NVML's contract for `migDevice`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetMigDeviceHandleByIndex,
            device,
            mig_device,
            |d| {
                if d.mig.is_some() {
                    return Err(codes::INVALID_ARGUMENT);
                }
                let g = d.gpu();
                let mig = g
                    .mig
                    .filter(|m| m.current == 1)
                    .ok_or(codes::NOT_SUPPORTED)?;
                if index >= mig.max_devices {
                    return Err(codes::INVALID_ARGUMENT);
                }
                let slot = usize::try_from(index).map_err(|_| codes::INVALID_ARGUMENT)?;
                if slot >= g.mig_instances.len() {
                    return Err(codes::NOT_FOUND);
                }
                Ok(encode_handle(d.gpu, slot + 1))
            },
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> Ret {
    // SAFETY: NVML's contract for `device`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
            mig_device,
            device,
            |d| {
                // A whole GPU is not a MIG device handle: an invalid argument here.
                d.mig.ok_or(codes::INVALID_ARGUMENT)?;
                Ok(encode_handle(d.gpu, 0))
            },
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig_device: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `isMigDevice`.
    unsafe {
        device_out(
            Func::nvmlDeviceIsMigDeviceHandle,
            device,
            is_mig_device,
            |d| Ok(c_uint::from(d.mig.is_some())),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> Ret {
    // SAFETY: NVML's contract for `id`.
    unsafe {
        device_out(Func::nvmlDeviceGetGpuInstanceId, device, id, |d| {
            // A whole GPU has no instance id: the feature is not supported on it.
            d.mig_instance()
                .map(|m| m.gpu_instance_id)
                .ok_or(codes::NOT_SUPPORTED)
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `id`.
    unsafe {
        device_out(Func::nvmlDeviceGetComputeInstanceId, device, id, |d| {
            d.mig_instance()
                .map(|m| m.compute_instance_id)
                .ok_or(codes::NOT_SUPPORTED)
        })
    }
}
