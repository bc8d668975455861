//! Non-NVML symbols for tests that load the library in-process: move the fake clock
//! without sleeping, and count the calls a consumer makes. Fetch them with `dlsym`
//! (libloading) from the same .so that nvml-wrapper loaded: a copy linked in through the
//! rlib has its own, separate state.

use std::ffi::{CStr, c_char, c_double};
use std::os::raw::c_ulonglong;

use crate::codes::{self, Ret};
use crate::ffi::{Out, guard};
use crate::func::Func;
use crate::state::lock;

fn set_clock(secs: c_double, advance: bool) -> Ret {
    guard(|| {
        if !secs.is_finite() {
            return Err(codes::INVALID_ARGUMENT);
        }
        let mut state = lock();
        let clock = &mut state.loaded()?.clock;
        if advance {
            clock.advance(secs);
        } else {
            clock.set(secs);
        }
        Ok(())
    })
}

/// Stands the clock at `secs` (fixed mode from now on). Returns NVML_SUCCESS, or
/// NVML_ERROR_UNINITIALIZED when no scenario is loaded, NVML_ERROR_INVALID_ARGUMENT for a
/// NaN or infinite time. Negative times count as 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fakeNvmlSetTime(secs: c_double) -> Ret {
    set_clock(secs, false)
}

/// Moves the clock `secs` later than it is now (fixed mode from now on); same answers as
/// `fakeNvmlSetTime`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fakeNvmlAdvanceTime(secs: c_double) -> Ret {
    set_clock(secs, true)
}

/// Writes to `count` how many times the exported function `name` (its C name, e.g.
/// `nvmlDeviceGetComputeRunningProcesses_v3`) was called since the library was loaded or
/// `fakeNvmlResetCallCounts` (see `calls.rs` for what counts). Works with or without init.
/// NVML_ERROR_INVALID_ARGUMENT for a NULL pointer or a name the library does not export.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fakeNvmlGetCallCount(name: *const c_char, count: *mut c_ulonglong) -> Ret {
    guard(|| {
        // SAFETY: the caller passes NULL or a pointer valid for writing a `c_ulonglong`.
        let out = unsafe { Out::new(count) }?;
        if name.is_null() {
            return Err(codes::INVALID_ARGUMENT);
        }
        // SAFETY: the caller passes a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| codes::INVALID_ARGUMENT)?;
        let func = Func::by_name(name).ok_or(codes::INVALID_ARGUMENT)?;
        out.set(crate::calls::get(func));
        Ok(())
    })
}

/// Sets every call count back to 0. Always NVML_SUCCESS.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fakeNvmlResetCallCounts() -> Ret {
    guard(|| {
        crate::calls::reset();
        Ok(())
    })
}
