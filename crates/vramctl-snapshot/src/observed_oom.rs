//! An OOM seen by PyTorch's OOM observer (the agent's `_oom.py`, issue 33's live path),
//! classified by the one classifier of this crate.
//!
//! The observer is told `(device, alloc_size, allowed or total, device_free)` and the
//! agent keeps `torch.cuda.memory._snapshot()` at that moment. With history recorded, the
//! snapshot's trace ends with the allocator's own `oom` event. Without (the default: it
//! costs a stack per allocation), the trace is empty and the observer's figures are the
//! `oom` event the allocator would have recorded: the state at the OOM is the snapshot's
//! segments, the size is what the allocator asked the driver for (the observer is not told
//! the request), and no counterfactual can be replayed, so no allocator setting is given
//! as a fix.

use crate::model::{Action, TraceEntry};
use crate::oom_cause::OomContext;
use crate::summary::{self, OomEvent};
use crate::{Limits, model};

/// What the observer was told, and the device's total (from the same API as the free
/// bytes: torch's `total_memory`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Observed {
    /// The CUDA device ordinal.
    pub device: i64,
    /// `alloc_size`: what the allocator asked the driver for.
    pub segment_bytes: u64,
    pub device_free_bytes: Option<u64>,
    pub device_total_bytes: Option<u64>,
    pub unix_ms: Option<i64>,
}

/// The devices a snapshot of the observer may name: a bound on the traces made up.
const MAX_DEVICE: usize = 64;

/// The verdict on the observed OOM: the newest `oom` event of its device, after adding
/// the observer's own when the trace has none.
///
/// # Errors
/// The snapshot cannot be read, or names no OOM of the device.
pub fn verdict(snapshot: &[u8], observed: Observed) -> Result<OomEvent, String> {
    let mut snap = model::from_slice(snapshot, Limits::default()).map_err(|e| e.to_string())?;
    let device = usize::try_from(observed.device)
        .ok()
        .filter(|d| *d <= MAX_DEVICE)
        .ok_or_else(|| format!("device {} is not one a snapshot can have", observed.device))?;
    if snap.device_traces.len() <= device {
        snap.device_traces.resize_with(device + 1, Default::default);
    }
    let trace = &snap.device_traces[device];
    if !trace.iter().any(|e| e.action == Action::Oom) {
        let mut entries: Vec<TraceEntry> = trace.iter().cloned().collect();
        entries.push(TraceEntry {
            action: Action::Oom,
            addr: None,
            size: observed.segment_bytes,
            stream: 0,
            time_us: observed.unix_ms.map(|t| t.saturating_mul(1000)),
            device_free: observed.device_free_bytes,
            stack: 0,
        });
        snap.device_traces[device] = entries.into();
    }
    let ctx = OomContext {
        device_total_bytes: observed.device_total_bytes,
    };
    summary::summarize_with(&snap, ctx)
        .oom
        .into_iter()
        .rev()
        .find(|o| o.device == observed.device)
        .ok_or_else(|| "the snapshot has no OOM of the device".to_owned())
}
