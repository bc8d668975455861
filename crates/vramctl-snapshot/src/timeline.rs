//! Live memory over a device's trace, stacked by allocation stack — what the browser
//! viewer's "active memory timeline" shows: after each event the active bytes (allocated
//! and pending free), split into the `n` folded stacks (as `--top --by stack` names them)
//! holding the most at the peak of live memory, and the rest as "other"; the reserved bytes
//! beside them. Every state comes from [`Replay`], walked back once from the end.
//!
//! A long trace is thinned to at most `max_points` points: the events are cut into equal
//! runs and each run keeps the event where live memory was highest (peaks survive the
//! thinning; the last event is always kept).

use std::collections::HashMap;

use serde::Serialize;

use crate::model::{Action, Snapshot, StackId};
use crate::replay::{self, Replay};
use crate::top;

/// Label of the live bytes outside the top stacks.
pub const OTHER: &str = "other";

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelinePoint {
    /// Index into the device's trace; the state is the one right after this event.
    pub event: usize,
    pub time_us: Option<i64>,
    /// Σ sizes of active blocks (`active_bytes.all.current` at that moment).
    pub live_bytes: u64,
    pub reserved_bytes: u64,
    /// Live bytes per entry of [`DeviceTimeline::stacks`], in that order.
    pub stack_bytes: Vec<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceTimeline {
    pub device: i64,
    /// Events in the device's trace.
    pub events: usize,
    /// The series: the top folded stacks at the peak, largest first, then [`OTHER`].
    pub stacks: Vec<String>,
    /// The event after which live memory was highest (the first such event), and how high.
    pub peak_event: usize,
    pub peak_live_bytes: u64,
    /// Live and reserved bytes before the first event: 0 and 0 when the trace covers the
    /// whole life of the allocator (else the ring buffer dropped older events).
    pub live_bytes_before_trace: u64,
    pub reserved_bytes_before_trace: u64,
    /// Indices of the `oom` events.
    pub oom_events: Vec<usize>,
    /// False when an undone event named memory the state did not have.
    pub replayed: bool,
    pub points: Vec<TimelinePoint>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    /// Devices with a trace, by ordinal.
    pub devices: Vec<DeviceTimeline>,
}

/// The devices with at least one trace event.
pub fn traced_devices(snap: &Snapshot) -> Vec<i64> {
    snap.device_traces
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.is_empty())
        .filter_map(|(d, _)| i64::try_from(d).ok())
        .collect()
}

/// The timeline of every device with a trace: the `top_n` stacks at each device's peak
/// and at most `max_points` points per device (at least 2).
pub fn timeline(snap: &Snapshot, top_n: usize, max_points: usize) -> Timeline {
    Timeline {
        devices: traced_devices(snap)
            .into_iter()
            .map(|d| device_timeline(snap, d, top_n, max_points.max(2)))
            .collect(),
    }
}

fn signed_update(value: &mut u64, added: u64, removed: u64) {
    *value = value.saturating_add(added).saturating_sub(removed);
}

fn device_timeline(
    snap: &Snapshot,
    device: i64,
    top_n: usize,
    max_points: usize,
) -> DeviceTimeline {
    let trace = replay::trace(snap, device);
    let n = trace.len();
    // Pass 1: live bytes after each event, to find the peak.
    let mut state = Replay::at_end(snap, device);
    let mut live = state.live_bytes();
    let (mut peak_event, mut peak_live_bytes) = (n.saturating_sub(1), live);
    let mut i = n;
    while let Some(u) = state.undo_last() {
        i -= 1;
        // State after event i is `live` before this undo; ≥ keeps the first peak.
        if live >= peak_live_bytes {
            peak_event = i;
            peak_live_bytes = live;
        }
        signed_update(&mut live, u.live_added_bytes, u.live_removed_bytes);
    }
    // The top stacks at the peak.
    let at_peak = Replay::after_event(snap, device, Some(peak_event));
    // Bytes per stack id first: a stack is folded once, not once per block that has it
    // (blocks sharing one long frame list would cost blocks × frames).
    let mut by_stack_id: HashMap<StackId, u64> = HashMap::new();
    for b in at_peak.live_blocks() {
        let e = by_stack_id.entry(b.stack).or_default();
        *e = e.saturating_add(b.size);
    }
    let mut groups: HashMap<String, u64> = HashMap::new();
    for (stack, bytes) in by_stack_id {
        let e = groups
            .entry(top::folded(snap, stack).join(" < "))
            .or_default();
        *e = e.saturating_add(bytes);
    }
    let mut ranked: Vec<(String, u64)> = groups.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut stacks: Vec<String> = ranked.into_iter().take(top_n).map(|(k, _)| k).collect();
    let other = stacks.len();
    stacks.push(OTHER.to_owned());
    let index_of: HashMap<&str, usize> = stacks[..other]
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_str(), i))
        .collect();
    let mut series_of: HashMap<StackId, usize> = HashMap::new();
    let mut series = |stack: StackId| {
        *series_of.entry(stack).or_insert_with(|| {
            let key = top::folded(snap, stack).join(" < ");
            index_of.get(key.as_str()).copied().unwrap_or(other)
        })
    };

    // Pass 2: the points, newest first.
    let mut state = Replay::at_end(snap, device);
    let mut by_stack = vec![0u64; stacks.len()];
    for b in state.live_blocks() {
        let s = series(b.stack);
        by_stack[s] = by_stack[s].saturating_add(b.size);
    }
    let mut live = state.live_bytes();
    let mut reserved = state.reserved_bytes();
    let run = n.div_ceil(max_points - 1).max(1);
    let mut points: Vec<TimelinePoint> = Vec::new();
    let mut best: Option<TimelinePoint> = None;
    let mut i = n;
    loop {
        let point = i.checked_sub(1).map(|event| TimelinePoint {
            event,
            time_us: trace[event].time_us,
            live_bytes: live,
            reserved_bytes: reserved,
            stack_bytes: by_stack.clone(),
        });
        let Some(point) = point else { break };
        if point.event + 1 == n {
            points.push(point);
        } else {
            if let Some(b) = &best {
                if b.event / run != point.event / run {
                    points.extend(best.take());
                }
            }
            if best
                .as_ref()
                .is_none_or(|b| point.live_bytes >= b.live_bytes)
            {
                best = Some(point);
            }
        }
        let Some(u) = state.undo_last() else { break };
        i -= 1;
        signed_update(&mut live, u.live_added_bytes, u.live_removed_bytes);
        signed_update(
            &mut reserved,
            u.reserved_added_bytes,
            u.reserved_removed_bytes,
        );
        let s = series(u.stack);
        signed_update(&mut by_stack[s], u.live_added_bytes, u.live_removed_bytes);
    }
    points.extend(best);
    points.reverse();
    DeviceTimeline {
        device,
        events: n,
        stacks,
        peak_event,
        peak_live_bytes,
        live_bytes_before_trace: live,
        reserved_bytes_before_trace: reserved,
        oom_events: trace
            .iter()
            .enumerate()
            .filter(|(_, e)| e.action == Action::Oom)
            .map(|(i, _)| i)
            .collect(),
        replayed: state.consistent,
        points,
    }
}

/// Which event `--at` names: an index from the start (0 is the first event), from the end
/// when negative (-1 is the last), or `oom` for the first OOM event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventRef {
    Index(i64),
    FirstOom,
}

impl std::str::FromStr for EventRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("oom") {
            return Ok(Self::FirstOom);
        }
        s.parse::<i64>().map(Self::Index).map_err(|_| {
            format!("'{s}' is not an event: give an index (0 is the first, -1 the last) or 'oom'")
        })
    }
}

/// Why an [`EventRef`] names no event of a trace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("event {index} is outside the trace of device {device} (events 0 to {last}, or -1 to -{len})", last = .len - 1)]
    OutOfRange { device: i64, index: i64, len: usize },
    #[error("the trace of device {device} has no oom event")]
    NoOom { device: i64 },
}

/// The trace index `at` names on `device` (whose trace is not empty).
///
/// # Errors
/// The index is outside the trace, or `oom` with no OOM event.
pub fn resolve(snap: &Snapshot, device: i64, at: EventRef) -> Result<usize, EventError> {
    let trace = replay::trace(snap, device);
    let len = trace.len();
    match at {
        EventRef::FirstOom => trace
            .iter()
            .position(|e| e.action == Action::Oom)
            .ok_or(EventError::NoOom { device }),
        EventRef::Index(index) => {
            let from_start = if index < 0 {
                i64::try_from(len).ok().map(|l| l + index)
            } else {
                Some(index)
            };
            from_start
                .and_then(|i| usize::try_from(i).ok())
                .filter(|&i| i < len)
                .ok_or(EventError::OutOfRange { device, index, len })
        }
    }
}
