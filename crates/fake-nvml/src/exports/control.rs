//! Non-NVML symbols for tests that load the library in-process: move the fake clock
//! without sleeping. Fetch them with `dlsym` (libloading) from the same .so that
//! nvml-wrapper loaded: a copy linked in through the rlib has its own, separate state.

use std::ffi::c_double;

use crate::codes::{self, Ret};
use crate::ffi::guard;
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
