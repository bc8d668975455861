//! `kill --job ID`, `--pod NAMESPACE/NAME`, `--container ID-OR-NAME`: the GPU processes an
//! owner selector picks, from one observation of the machine (`vramctl_observe::owners`).
//!
//! Each is handed to `kill` as a named PID *with the start time it had when observed*, so
//! the safe path (`vramctl_procs::signal::inspect`, then the pidfd re-check) refuses it if
//! the PID has since passed to another process; every other rule of kill applies to it as
//! to a PID typed by hand.

use vramctl_core::types::Snapshot;
use vramctl_observe::observation::Observer;
use vramctl_observe::owners::{OwnerSelector, select};

/// A process an owner selector picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedTarget {
    /// Its PID.
    pub pid: u32,
    /// Its start time when observed (clock ticks after boot); `None` when /proc did not
    /// give it.
    pub start_time_ticks: Option<u64>,
}

/// The GPU processes of `snapshot` that every one of `selectors` selects, by PID. /proc is
/// read once for them (and the kubelet asked, where it runs, for pod names); a process
/// this PID namespace cannot see has no owner here and is never selected.
pub fn select_targets(snapshot: Snapshot, selectors: &[OwnerSelector]) -> Vec<OwnedTarget> {
    if selectors.is_empty() {
        return Vec::new();
    }
    let mut observer = Observer::builder().agents(None).ancestors(false).build();
    let observation = observer.observe(snapshot, |_| None);
    select(selectors, &observation.hosts)
        .into_iter()
        .map(|h| OwnedTarget {
            pid: h.pid,
            start_time_ticks: h.start_time_ticks,
        })
        .collect()
}
