//! How often each exported function was called: what a consumer asks the driver per tick
//! is a cost on a real GPU (an ioctl each, 0.2–3 ms on an H200 under a sandboxed kernel),
//! so tests count the calls instead of timing them.
//!
//! A call is counted when it reaches the library's state, i.e. after its pointer checks
//! (a call rejected for a NULL out-pointer is not counted); `nvmlErrorString` and the
//! control symbols are not counted. The counts are process-wide and run from the moment
//! the library is loaded (or last reset), across inits and shutdowns. Two ways to read
//! them: the control symbol `fakeNvmlGetCallCount` (tests that load the library in-process)
//! and `FAKE_NVML_CALL_COUNTS=<path>` (a child process such as `vramctl record`: the file is
//! rewritten at every `nvmlShutdown` that takes the init count to 0).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::func::Func;

/// Names a file to write the call counts to at every final `nvmlShutdown`.
pub const ENV_CALL_COUNTS: &str = "FAKE_NVML_CALL_COUNTS";

static COUNTS: [AtomicU64; Func::COUNT] = [const { AtomicU64::new(0) }; Func::COUNT];

/// Counts one call of `func`.
pub fn count(func: Func) {
    COUNTS[func.index()].fetch_add(1, Ordering::Relaxed);
}

/// Calls of `func` since the library was loaded or the counts were reset.
pub fn get(func: Func) -> u64 {
    COUNTS[func.index()].load(Ordering::Relaxed)
}

/// Sets every count back to 0.
pub fn reset() {
    for c in &COUNTS {
        c.store(0, Ordering::Relaxed);
    }
}

/// `name count` per line, in the fixed order of [`Func::ALL`], for the functions called at
/// least once.
pub fn render() -> String {
    let mut out = String::new();
    for f in Func::ALL {
        let n = get(*f);
        if n > 0 {
            let _ = writeln!(out, "{} {n}", f.name());
        }
    }
    out
}

/// Writes [`render`] to the file `FAKE_NVML_CALL_COUNTS` names, if set. A file that cannot
/// be written gets one line on stderr; the NVML call itself still succeeds.
pub fn dump_if_asked() {
    let Some(path) = std::env::var_os(ENV_CALL_COUNTS).filter(|p| !p.is_empty()) else {
        return;
    };
    if let Err(err) = std::fs::write(&path, render()) {
        eprintln!(
            "fake-nvml: cannot write the call counts to {}: {err}",
            std::path::Path::new(&path).display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_and_render_only_what_was_called() {
        // Other unit tests in this binary do not call exports, so these counts are ours.
        let before = get(Func::nvmlDeviceGetPowerUsage);
        count(Func::nvmlDeviceGetPowerUsage);
        count(Func::nvmlDeviceGetPowerUsage);
        assert_eq!(get(Func::nvmlDeviceGetPowerUsage), before + 2);
        assert!(render().contains(&format!("nvmlDeviceGetPowerUsage {}\n", before + 2)));
        assert!(!render().contains("nvmlDeviceGetSerial"));
    }
}
