//! The exported C functions. Each one checks its pointers, runs under [`guard`] so that no
//! panic crosses the ABI, and answers from the loaded scenario.
//!
//! Safety contract, for all of them: NVML's. Pointer arguments are NULL (rejected with
//! NVML_ERROR_INVALID_ARGUMENT) or valid for the reads and writes the NVML header describes;
//! buffer lengths are what the caller really allocated.

#![allow(
    clippy::missing_safety_doc,
    reason = "the safety contract is NVML's header, stated once in this module's docs"
)]
#![allow(
    non_upper_case_globals,
    reason = "matches use the bindings' C constant names, which are what the header says"
)]

mod control;
mod device;
mod health;
mod links;
mod mig;
mod readings;
mod system;

use std::ffi::c_char;
use std::os::raw::c_uint;

use nvml_wrapper_sys::bindings::nvmlDevice_t;

use crate::codes::Ret;
use crate::ffi::{CBuf, Out, guard};
use crate::func::Func;
use crate::state::{Device, R, with_device};

/// A device query that writes one value to `out`.
///
/// # Safety
/// `out` is NULL or valid for writing a `T`.
unsafe fn device_out<T>(
    func: Func,
    device: nvmlDevice_t,
    out: *mut T,
    get: impl FnOnce(&mut Device<'_>) -> R<T>,
) -> Ret {
    guard(|| {
        // SAFETY: per this function's contract.
        let out = unsafe { Out::new(out) }?;
        out.set(with_device(func, device, get)?);
        Ok(())
    })
}

/// A device query that answers a string (`NOT_SUPPORTED` when the scenario has none).
///
/// # Safety
/// `buf` is NULL or valid for writing `length` bytes.
unsafe fn device_string(
    func: Func,
    device: nvmlDevice_t,
    buf: *mut c_char,
    length: c_uint,
    get: impl FnOnce(&mut Device<'_>) -> R<Option<String>>,
) -> Ret {
    guard(|| {
        // SAFETY: per this function's contract.
        let buf = unsafe { CBuf::new(buf, length) }?;
        let value = with_device(func, device, get)?;
        buf.write(&value.ok_or(crate::codes::NOT_SUPPORTED)?)
    })
}

/// A whole-GPU fact that the scenario may leave out (then NOT_SUPPORTED).
fn fact<T>(device: &Device<'_>, get: impl FnOnce(&crate::scenario::Gpu) -> Option<T>) -> R<T> {
    get(device.whole_gpu()?).ok_or(crate::codes::NOT_SUPPORTED)
}
