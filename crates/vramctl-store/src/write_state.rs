//! The writer's state that the store holds between ticks, and the ticks not written. Kept
//! apart from `writer` (which appends through the `Store` of `db`) so that `db` names this
//! file, not `writer`'s, and the two never name each other.

use std::collections::HashMap;

use crate::codec::State;
use crate::model::{Gap, ProcessKey};

/// Start of the reason of a gap over ticks that could not be written (`write-failed: disk
/// full; 12 samples not written`).
pub const WRITE_FAILED: &str = "write-failed";

/// Ticks [`Store::append`](crate::Store::append) failed to write since the last one it wrote. They are recorded
/// as one gap over every device, from the first to the last of them, reason
/// [`WRITE_FAILED`]`: CAUSE; N samples not written`, in the same transaction as the next
/// tick written (or by [`Store::record_unwritten_gap`](crate::Store::record_unwritten_gap)): the gap is stored exactly when
/// something after it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unwritten {
    /// Time of the first tick not written.
    pub from_ms: i64,
    /// Time of the last tick not written.
    pub to_ms: i64,
    /// How many ticks were not written.
    pub ticks: u64,
    /// Why the first of them failed (`disk full`, or the error).
    pub cause: String,
}

impl Unwritten {
    /// The gap to record with a tick written at `t`: all of them when `t` is after them;
    /// when `t` is one of their times again (a caller retrying a failed tick; the recorder
    /// never does), only those before it, without a count; none when it retries the first.
    pub(crate) fn gap_before(&self, t: i64) -> Option<Gap> {
        if t > self.to_ms {
            return Some(self.gap());
        }
        (self.from_ms < t).then(|| Gap {
            to_ms: t - 1,
            reason: format!("{WRITE_FAILED}: {}", self.cause),
            ..self.gap()
        })
    }

    /// The gap these ticks are.
    pub fn gap(&self) -> Gap {
        let plural = if self.ticks == 1 { "" } else { "s" };
        Gap {
            device_uuid: None,
            metric: None,
            from_ms: self.from_ms,
            to_ms: self.to_ms,
            open: false,
            reason: format!(
                "{WRITE_FAILED}: {}; {} sample{plural} not written",
                self.cause, self.ticks
            ),
        }
    }
}

/// Gap scope: (device id or all, metric code or the whole device).
pub(crate) type GapKey = (Option<i64>, Option<i64>);

/// The writer's memory of what it wrote last.
#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) session_id: i64,
    pub(crate) state: State,
    pub(crate) last_t_ms: Option<i64>,
    pub(crate) last_key_ms: Option<i64>,
    pub(crate) key_interval_ms: i64,
    pub(crate) processes: HashMap<ProcessKey, i64>,
    /// Process ids of the PIDs on a GPU after the last tick: a tick names a process's
    /// identity only when it first appears (or its CPU time is read).
    pub(crate) pids: HashMap<u32, i64>,
    pub(crate) open_gaps: HashMap<GapKey, (i64, String)>,
    pub(crate) buf: Vec<u8>,
    /// Per rollup resolution: the last imported bucket's state and key time.
    pub(crate) rollups: HashMap<i64, (State, Option<i64>)>,
    /// What the last written frame holds, when `state` has changed since without a frame
    /// (a stored frame folded into the next tick of a merge): the next frame's delta is
    /// encoded against it.
    pub(crate) pending_base: Option<State>,
}
