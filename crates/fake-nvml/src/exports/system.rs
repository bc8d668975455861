//! Init, shutdown, system queries, device enumeration.

use std::ffi::{CStr, c_char, c_int};
use std::os::raw::c_uint;
use std::panic::{AssertUnwindSafe, catch_unwind};

use nvml_wrapper_sys::bindings::nvmlDevice_t;

use crate::codes::{self, Ret};
use crate::ffi::{CBuf, Out, guard};
use crate::func::Func;
use crate::state::{lock, with_system};

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> Ret {
    crate::calls::count(Func::nvmlInit_v2);
    guard(|| lock().init())
}

/// The flags (NO_GPUS, NO_ATTACH, FORCE_INIT) change nothing in the fake: a scenario with no
/// GPUs already initialises, and there is nothing to attach.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    crate::calls::count(Func::nvmlInitWithFlags);
    guard(|| lock().init())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> Ret {
    crate::calls::count(Func::nvmlShutdown);
    guard(|| lock().shutdown())
}

/// Static strings, valid for the life of the process, like NVML's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    catch_unwind(AssertUnwindSafe(|| codes::error_string(result)))
        .unwrap_or(c"Unknown Error")
        .as_ptr()
}

/// A system string query.
///
/// # Safety
/// `buf` is NULL or valid for writing `length` bytes.
unsafe fn system_string(
    func: Func,
    buf: *mut c_char,
    length: c_uint,
    get: impl FnOnce(&crate::scenario::Scenario) -> Option<&String>,
) -> Ret {
    guard(|| {
        // SAFETY: per this function's contract.
        let buf = unsafe { CBuf::new(buf, length) }?;
        with_system(func, |loaded| {
            buf.write(get(&loaded.scenario).ok_or(codes::NOT_SUPPORTED)?)
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    // SAFETY: NVML's contract for `version`/`length`.
    unsafe {
        system_string(Func::nvmlSystemGetDriverVersion, version, length, |s| {
            s.driver_version.as_ref()
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    // SAFETY: NVML's contract for `version`/`length`.
    unsafe {
        system_string(Func::nvmlSystemGetNVMLVersion, version, length, |s| {
            s.nvml_version.as_ref()
        })
    }
}

/// # Safety
/// `out` is NULL or valid for writing an `int`.
unsafe fn cuda_version(func: Func, out: *mut c_int) -> Ret {
    guard(|| {
        // SAFETY: per this function's contract.
        let out = unsafe { Out::new(out) }?;
        let version = with_system(func, |loaded| {
            loaded
                .scenario
                .cuda_driver_version
                .ok_or(codes::NOT_SUPPORTED)
        })?;
        out.set(version);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(cuda_driver_version: *mut c_int) -> Ret {
    // SAFETY: NVML's contract for `cudaDriverVersion`.
    unsafe { cuda_version(Func::nvmlSystemGetCudaDriverVersion, cuda_driver_version) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(cuda_driver_version: *mut c_int) -> Ret {
    // SAFETY: NVML's contract for `cudaDriverVersion`.
    unsafe { cuda_version(Func::nvmlSystemGetCudaDriverVersion_v2, cuda_driver_version) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    guard(|| {
        // SAFETY: NVML's contract for `name`/`length`.
        let buf = unsafe { CBuf::new(name, length) }?;
        let found = with_system(Func::nvmlSystemGetProcessName, |loaded| {
            loaded.process_name(pid)
        })?;
        buf.write_truncated(&found);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> Ret {
    guard(|| {
        // SAFETY: NVML's contract for `deviceCount`.
        let out = unsafe { Out::new(device_count) }?;
        let count = with_system(Func::nvmlDeviceGetCount_v2, |loaded| {
            // vramctl calls this once per sample: the `step` clock ticks here.
            loaded.clock.on_device_count();
            Ok(loaded.scenario.gpus.len())
        })?;
        out.set(c_uint::try_from(count).map_err(|_| codes::UNKNOWN)?);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> Ret {
    guard(|| {
        // SAFETY: NVML's contract for `device`.
        let out = unsafe { Out::new(device) }?;
        crate::calls::count(Func::nvmlDeviceGetHandleByIndex_v2);
        let mut state = lock();
        let loaded = state.session()?;
        let index = usize::try_from(index).map_err(|_| codes::INVALID_ARGUMENT)?;
        if index >= loaded.scenario.gpus.len() {
            return Err(codes::INVALID_ARGUMENT);
        }
        out.set(loaded.handle_for(Func::nvmlDeviceGetHandleByIndex_v2, index, 0)?);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> Ret {
    guard(|| {
        // SAFETY: NVML's contract for `device`.
        let out = unsafe { Out::new(device) }?;
        crate::calls::count(Func::nvmlDeviceGetHandleByUUID);
        if uuid.is_null() {
            return Err(codes::INVALID_ARGUMENT);
        }
        // SAFETY: NVML's contract: `uuid` is a NUL-terminated string.
        let uuid = unsafe { CStr::from_ptr(uuid) }
            .to_str()
            .map_err(|_| codes::INVALID_ARGUMENT)?;
        let mut state = lock();
        let loaded = state.session()?;
        let (gpu, slot) = loaded.find_uuid(uuid).ok_or(codes::NOT_FOUND)?;
        out.set(loaded.handle_for(Func::nvmlDeviceGetHandleByUUID, gpu, slot)?);
        Ok(())
    })
}
