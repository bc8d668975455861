//! The browser viewer's model of one snapshot file (issue 32): built once when the file is
//! opened, then asked for what the screen needs, so that a GB-scale file is never shipped
//! to the browser.
//!
//! Opening walks each device's trace back once from the end with [`Replay`] and keeps, per
//! event, the live (active) and reserved bytes after it, and every allocation of the trace
//! as one [`Allocation`] (the event that made it, the event that freed it, its block size
//! and stack) — about 40 bytes per event, against ~150 bytes per event in the file. The
//! queries then cost one pass over an event range or over the allocations, never a
//! reading of the file:
//!
//! - [`SnapshotView::timeline`]: an event range cut into at most `width` buckets; each
//!   bucket is drawn at its event of highest live memory (peaks survive), with the min and
//!   max of live and reserved bytes over the bucket; the `bands` allocations covering the
//!   most of the chart (bytes × buckets live) as bands, everything else as one "other"
//!   series, so that the bands and "other" add up to the live bytes of each bucket;
//! - [`SnapshotView::state_at`]: segments and blocks right after one event (a replay from
//!   the end, bounded in what it returns);
//! - the OOM events with the lines `vramctl snapshot FILE` prints about them.
//!
//! Stacks go out interned: each answer carries the frames and frame lists it names, once,
//! and refers to them by index. Strings from the file are hostile input: they leave here
//! as JSON strings, bounded in length, and the page writes them as text only.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use crate::model::{Action, BlockState, Pool, Snapshot, SnapshotError, StackId};
use crate::replay::{self, Replay};
use crate::summary::{self, OomEvent, Summary};
use crate::{Limits, TraceStacks};

/// `begin`/`end` of an [`Allocation`] that lies outside the trace: made before its first
/// event, or still live after its last.
const OUTSIDE: u32 = u32::MAX;

/// The most buckets and bands one timeline answer holds (a screen is a few thousand
/// pixels wide; each band is a polygon the page draws).
pub const MAX_BUCKETS: usize = 8192;
pub const MAX_BANDS: usize = 2000;
/// The most segments and blocks one [`SnapshotView::state_at`] answer holds.
pub const MAX_SEGMENTS: usize = 4096;
pub const MAX_BLOCKS: usize = 50_000;
/// The frames of one stack sent to the page, innermost first; deeper ones are counted.
pub const MAX_FRAMES_PER_STACK: usize = 64;
/// Characters of a frame's file or function name sent to the page.
pub const MAX_NAME_CHARS: usize = 300;

/// One allocation of the trace: live in the states after events `begin..end`.
#[derive(Debug, Clone, Copy)]
struct Allocation {
    /// Its `alloc` event ([`OUTSIDE`]: before the trace).
    begin: u32,
    /// Its `free_completed` (or ≤ 2.0 `free`) event ([`OUTSIDE`]: live at the end).
    end: u32,
    size: u64,
    stack: StackId,
}

/// One device's index.
#[derive(Debug)]
struct DeviceIndex {
    device: i64,
    /// Live (active) bytes right after each event.
    live_after: Vec<u64>,
    reserved_after: Vec<u64>,
    live_before_trace: u64,
    reserved_before_trace: u64,
    /// Ordered by `begin`, those made before the trace first.
    allocations: Vec<Allocation>,
    /// Indices of the `oom` events.
    oom_events: Vec<u32>,
    replayed: bool,
}

/// A snapshot file opened for the viewer.
pub struct SnapshotView {
    snap: Snapshot,
    summary: Summary,
    /// The file's name as given (shown to the user; never used to open anything again).
    name: String,
    file_bytes: u64,
    devices: Vec<DeviceIndex>,
}

/// Its name and size only: the index is millions of numbers.
impl std::fmt::Debug for SnapshotView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotView")
            .field("name", &self.name)
            .field("file_bytes", &self.file_bytes)
            .field("devices", &self.devices.len())
            .finish_non_exhaustive()
    }
}

/// Why the viewer cannot show a file.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(
        "the trace of device {device} has {events} events, more than the viewer indexes ({max})"
    )]
    TooManyEvents {
        device: i64,
        events: usize,
        max: u32,
    },
}

/// Why a query names nothing the file has (the page asked for something out of range).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("device {0} has no trace in this snapshot")]
    NoDevice(i64),
    #[error("event {event} is outside the trace of device {device} ({events} events)")]
    NoEvent {
        device: i64,
        event: u64,
        events: usize,
    },
}

impl SnapshotView {
    /// Reads `path` (every trace entry's stack: the hover shows them) and indexes it.
    ///
    /// # Errors
    /// The file is not a snapshot the reader accepts, or its trace is too long to index.
    pub fn open(path: &Path, limits: Limits) -> Result<Self, ViewError> {
        let snap = crate::open_with(path, limits, TraceStacks::Read)?;
        let file_bytes = std::fs::metadata(path).map_or(0, |m| m.len());
        Self::new(snap, path.display().to_string(), file_bytes)
    }

    /// Indexes a snapshot already read; `name` and `file_bytes` are what the page shows.
    ///
    /// # Errors
    /// A device's trace is too long to index (≥ 2^32 − 1 events).
    pub fn new(snap: Snapshot, name: String, file_bytes: u64) -> Result<Self, ViewError> {
        let summary = summary::summarize(&snap);
        let devices = crate::timeline::traced_devices(&snap)
            .into_iter()
            .map(|d| index_device(&snap, d))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            snap,
            summary,
            name,
            file_bytes,
            devices,
        })
    }

    /// The summary `vramctl snapshot FILE --json` gives of this file.
    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    fn device(&self, device: i64) -> Result<&DeviceIndex, QueryError> {
        self.devices
            .iter()
            .find(|d| d.device == device)
            .ok_or(QueryError::NoDevice(device))
    }

    /// What the page shows first: the file, its devices and traces, the summary's lines.
    pub fn info(&self) -> FileInfo<'_> {
        FileInfo {
            name: self.name.clone(),
            file_bytes: self.file_bytes,
            format: self.snap.format,
            devices: self
                .devices
                .iter()
                .map(|d| DeviceInfo {
                    device: d.device,
                    events: d.live_after.len(),
                    allocations: d.allocations.len(),
                    oom_events: d.oom_events.len(),
                    replayed: d.replayed,
                })
                .collect(),
            summary_lines: summary::table(&self.summary),
            summary: &self.summary,
        }
    }

    /// The timeline of `device` over events `from..to` (clamped to the trace; `to` None:
    /// the end) in at most `width` buckets with the `bands` allocations covering the most of
    /// the chart (bytes × buckets live) as bands.
    ///
    /// # Errors
    /// The device has no trace.
    pub fn timeline(
        &self,
        device: i64,
        from: u64,
        to: Option<u64>,
        width: usize,
        bands: usize,
    ) -> Result<TimelineView<'_>, QueryError> {
        let d = self.device(device)?;
        let n = d.live_after.len();
        let to = to
            .map_or(n, |t| usize::try_from(t).unwrap_or(n).min(n))
            .max(1);
        let from = usize::try_from(from).unwrap_or(n).min(to.saturating_sub(1));
        let len = to - from;
        let width = width.clamp(1, MAX_BUCKETS).min(len.max(1));
        let bands = bands.min(MAX_BANDS);
        let trace = replay::trace(&self.snap, device);

        let mut buckets = Buckets::default();
        for b in 0..width {
            let lo = from + b * len / width;
            let hi = (from + (b + 1) * len / width).max(lo + 1).min(to);
            let live = &d.live_after[lo..hi];
            let reserved = &d.reserved_after[lo..hi];
            // The first event of highest live memory in the bucket.
            let (peak, &peak_live) = live
                .iter()
                .enumerate()
                .rev()
                .max_by_key(|(_, v)| **v)
                .unwrap_or((0, &0));
            let event = lo + peak;
            buckets.event.push(event);
            buckets
                .time_us
                .push(trace.get(event).and_then(|e| e.time_us));
            buckets.live_bytes.push(peak_live);
            buckets
                .live_min_bytes
                .push(live.iter().copied().min().unwrap_or(0));
            buckets
                .reserved_bytes
                .push(d.reserved_after.get(event).copied().unwrap_or(0));
            buckets
                .reserved_max_bytes
                .push(reserved.iter().copied().max().unwrap_or(0));
            buckets
                .reserved_min_bytes
                .push(reserved.iter().copied().min().unwrap_or(0));
        }
        let reps: Vec<u32> = buckets
            .event
            .iter()
            .map(|&e| u32::try_from(e).unwrap_or(OUTSIDE - 1))
            .collect();
        // The first bucket whose drawn event is at or after `e`.
        let bucket_at = |e: u32| reps.partition_point(|&r| r < e);

        // The buckets an allocation is live in: `first..end`.
        let span = |a: &Allocation| {
            let first = if a.begin == OUTSIDE {
                0
            } else {
                bucket_at(a.begin)
            };
            let end = if a.end == OUTSIDE {
                width
            } else {
                bucket_at(a.end)
            };
            (first, end.max(first))
        };
        // Those live at some drawn event, ranked by the area they cover on the chart (bytes
        // × buckets): at a wide zoom a long-lived allocation is a band and a brief one is
        // "other", zoomed in the brief ones become bands too. Ties to the older one.
        let mut shown: Vec<(usize, &Allocation, (usize, usize))> = d
            .allocations
            .iter()
            .enumerate()
            .map(|(i, a)| (i, a, span(a)))
            .filter(|(_, _, (first, end))| first < end)
            .collect();
        let candidates = shown.len();
        let area = |x: &(usize, &Allocation, (usize, usize))| {
            u128::from(x.1.size) * (x.2.1 - x.2.0) as u128
        };
        if shown.len() > bands {
            shown.select_nth_unstable_by(bands, |x, y| area(y).cmp(&area(x)).then(x.0.cmp(&y.0)));
            shown.truncate(bands);
        }
        shown.sort_by_key(|(i, _, _)| *i);

        let mut stacks = StackTable::default();
        let mut in_bands = vec![0i128; width + 1];
        let band_views: Vec<BandView> = shown
            .iter()
            .map(|&(_, a, (first, last))| {
                in_bands[first] += i128::from(a.size);
                in_bands[last] -= i128::from(a.size);
                BandView {
                    alloc_event: (a.begin != OUTSIDE).then_some(a.begin),
                    free_event: (a.end != OUTSIDE).then_some(a.end),
                    size_bytes: a.size,
                    first_bucket: first,
                    end_bucket: last,
                    stack: stacks.add(&self.snap, a.stack),
                }
            })
            .collect();
        let mut running = 0i128;
        buckets.other_bytes = buckets
            .live_bytes
            .iter()
            .zip(&in_bands)
            .map(|(&live, &delta)| {
                running += delta;
                u64::try_from(i128::from(live) - running).unwrap_or(0)
            })
            .collect();
        let (peak_event, peak_live_bytes) = d
            .live_after
            .iter()
            .enumerate()
            .rev()
            .max_by_key(|(_, v)| **v)
            .map_or((0, 0), |(i, &v)| (i, v));
        Ok(TimelineView {
            device,
            events: n,
            from,
            to,
            peak_event,
            peak_live_bytes,
            live_bytes_before_trace: d.live_before_trace,
            reserved_bytes_before_trace: d.reserved_before_trace,
            replayed: d.replayed,
            buckets,
            allocations_in_range: candidates,
            bands: band_views,
            oom: self.oom_views(d),
            frames: stacks.frames,
            stacks: stacks.stacks,
        })
    }

    fn oom_views(&self, d: &DeviceIndex) -> Vec<OomView<'_>> {
        d.oom_events
            .iter()
            .map(|&e| {
                let measured = self
                    .summary
                    .oom
                    .iter()
                    .find(|o| o.device == d.device && o.event == e as usize);
                OomView {
                    event: e,
                    line: measured.map(summary::oom_line),
                    advice: measured.map(|o| {
                        let a = summary::advice_for_oom(o);
                        format!("{}: {}", a.setting, a.reason)
                    }),
                    oom: measured,
                }
            })
            .collect()
    }

    /// Segments and blocks of `device` right after event `event`: at most
    /// [`MAX_SEGMENTS`] segments and [`MAX_BLOCKS`] blocks, in address order.
    ///
    /// # Errors
    /// The device has no trace, or the event is outside it.
    pub fn state_at(&self, device: i64, event: u64) -> Result<StateView, QueryError> {
        let d = self.device(device)?;
        let n = d.live_after.len();
        let at = usize::try_from(event)
            .ok()
            .filter(|&e| e < n)
            .ok_or(QueryError::NoEvent {
                device,
                event,
                events: n,
            })?;
        let state = Replay::after_event(&self.snap, device, Some(at));
        let segment_count = state.segment_count();
        let mut stacks = StackTable::default();
        let mut blocks_left = MAX_BLOCKS;
        let mut blocks_omitted = 0usize;
        let mut largest_free_block_bytes = 0u64;
        let mut free_bytes = 0u64;
        let mut segments = Vec::new();
        for (k, s) in state.file_segments(usize::MAX).into_iter().enumerate() {
            let mut blocks = Vec::new();
            for b in &s.blocks {
                if b.state == BlockState::Inactive {
                    free_bytes = free_bytes.saturating_add(b.size);
                    largest_free_block_bytes = largest_free_block_bytes.max(b.size);
                }
                if k >= MAX_SEGMENTS {
                    continue;
                }
                if blocks_left == 0 {
                    blocks_omitted += 1;
                    continue;
                }
                blocks_left -= 1;
                blocks.push(BlockView {
                    address: b.address,
                    size_bytes: b.size,
                    requested_bytes: b.requested_size,
                    state: b.state,
                    stack: (b.state.is_active()).then(|| stacks.add(&self.snap, b.stack)),
                });
            }
            if k >= MAX_SEGMENTS {
                continue;
            }
            segments.push(SegmentView {
                address: s.address,
                total_bytes: s.total_size,
                allocated_bytes: s.allocated_size,
                active_bytes: s.active_size,
                stream: s.stream,
                pool: s.pool,
                pool_id: s.pool_id,
                is_expandable: s.is_expandable,
                blocks,
            });
        }
        let trace = replay::trace(&self.snap, device);
        let entry = trace.get(at).map(|e| EventView {
            action: action_name(&e.action),
            addr: e.addr,
            size_bytes: e.size,
            stream: e.stream,
            time_us: e.time_us,
            stack: stacks.add(&self.snap, e.stack),
        });
        Ok(StateView {
            device,
            event: at,
            entry,
            live_bytes: d.live_after[at],
            reserved_bytes: d.reserved_after[at],
            free_bytes,
            largest_free_block_bytes,
            replayed: state.consistent,
            segments_total: segment_count,
            segments_omitted: segment_count.saturating_sub(MAX_SEGMENTS),
            blocks_omitted,
            segments,
            frames: stacks.frames,
            stacks: stacks.stacks,
        })
    }
}

fn action_name(a: &Action) -> String {
    match a {
        Action::Alloc => "alloc",
        Action::FreeRequested => "free_requested",
        Action::FreeCompleted => "free_completed",
        Action::Free => "free",
        Action::SegmentAlloc => "segment_alloc",
        Action::SegmentFree => "segment_free",
        Action::SegmentMap => "segment_map",
        Action::SegmentUnmap => "segment_unmap",
        Action::Snapshot => "snapshot",
        Action::Oom => "oom",
        Action::Other(s) => return bounded(s),
    }
    .to_owned()
}

/// A file's string cut to [`MAX_NAME_CHARS`] characters.
fn bounded(s: &str) -> String {
    match s.char_indices().nth(MAX_NAME_CHARS) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Walks one device's trace back from the end once: the bytes after each event and the
/// allocations.
fn index_device(snap: &Snapshot, device: i64) -> Result<DeviceIndex, ViewError> {
    let trace = replay::trace(snap, device);
    let n = trace.len();
    let too_many = || ViewError::TooManyEvents {
        device,
        events: n,
        max: OUTSIDE - 1,
    };
    if u32::try_from(n).map_or(true, |n| n == OUTSIDE) {
        return Err(too_many());
    }
    let mut state = Replay::at_end(snap, device);
    let mut live = state.live_bytes();
    let mut reserved = state.reserved_bytes();
    let mut live_after = vec![0u64; n];
    let mut reserved_after = vec![0u64; n];
    // Blocks freed later in the trace whose `alloc` the walk has not met yet: address →
    // (free event, size, stack).
    let mut freed_later: HashMap<u64, (u32, u64, StackId)> = HashMap::new();
    let mut allocations: Vec<Allocation> = Vec::new();
    let mut oom_events = Vec::new();
    for i in (0..n).rev() {
        live_after[i] = live;
        reserved_after[i] = reserved;
        let Some(u) = state.undo_last() else { break };
        let e = &trace[i];
        #[allow(clippy::cast_possible_truncation)] // n < u32::MAX, checked above
        let event = i as u32;
        match (&e.action, e.addr) {
            (Action::FreeCompleted | Action::Free, Some(addr)) => {
                if let Some((end, size, stack)) =
                    freed_later.insert(addr, (event, u.live_added_bytes, u.stack))
                {
                    // Two frees of one address with no alloc between (a damaged trace):
                    // the later one's block is shown from here.
                    allocations.push(Allocation {
                        begin: event,
                        end,
                        size,
                        stack,
                    });
                }
            }
            (Action::Alloc, Some(addr)) => {
                let end = freed_later.remove(&addr).map_or(OUTSIDE, |(end, _, _)| end);
                allocations.push(Allocation {
                    begin: event,
                    end,
                    size: u.live_removed_bytes,
                    stack: u.stack,
                });
            }
            (Action::Oom, _) => oom_events.push(event),
            _ => {}
        }
        live = live
            .saturating_add(u.live_added_bytes)
            .saturating_sub(u.live_removed_bytes);
        reserved = reserved
            .saturating_add(u.reserved_added_bytes)
            .saturating_sub(u.reserved_removed_bytes);
    }
    // Blocks live before the first event: freed in the trace, or live throughout.
    let mut before: Vec<Allocation> = state
        .live_blocks_by_address()
        .map(|(addr, b)| Allocation {
            begin: OUTSIDE,
            end: freed_later.get(&addr).map_or(OUTSIDE, |f| f.0),
            size: b.size,
            stack: b.stack,
        })
        .collect();
    before.sort_by_key(|a| a.end);
    allocations.reverse();
    before.append(&mut allocations);
    oom_events.reverse();
    Ok(DeviceIndex {
        device,
        live_after,
        reserved_after,
        live_before_trace: live,
        reserved_before_trace: reserved,
        allocations: before,
        oom_events,
        replayed: state.consistent,
    })
}

/// The frames and frame lists one answer names, each once.
#[derive(Debug, Default)]
struct StackTable {
    frames: Vec<FrameView>,
    stacks: Vec<StackView>,
    frame_index: HashMap<u32, u32>,
    stack_index: HashMap<StackId, u32>,
}

impl StackTable {
    /// The answer's index of the snapshot's stack `id`.
    fn add(&mut self, snap: &Snapshot, id: StackId) -> u32 {
        if let Some(&i) = self.stack_index.get(&id) {
            return i;
        }
        let ids: &[u32] = snap.stacks.get(id as usize).map_or(&[], Vec::as_slice);
        let mut frames = Vec::with_capacity(ids.len().min(MAX_FRAMES_PER_STACK));
        for &f in ids.iter().take(MAX_FRAMES_PER_STACK) {
            let Some(frame) = snap.frames.get(f as usize) else {
                continue;
            };
            let next = u32::try_from(self.frames.len()).unwrap_or(u32::MAX);
            let local = *self.frame_index.entry(f).or_insert_with(|| {
                self.frames.push(FrameView {
                    filename: bounded(&frame.filename),
                    line: frame.line,
                    name: bounded(&frame.name),
                });
                next
            });
            frames.push(local);
        }
        let i = u32::try_from(self.stacks.len()).unwrap_or(u32::MAX);
        self.stacks.push(StackView {
            frames,
            frames_omitted: ids.len().saturating_sub(MAX_FRAMES_PER_STACK),
        });
        self.stack_index.insert(id, i);
        i
    }
}

/// The answer to the page's first question (docs/json.md, "snapshot view").
#[derive(Debug, Serialize)]
pub struct FileInfo<'a> {
    pub name: String,
    pub file_bytes: u64,
    pub format: crate::model::Format,
    pub devices: Vec<DeviceInfo>,
    /// The lines `vramctl snapshot FILE` prints.
    pub summary_lines: Vec<String>,
    /// What `vramctl snapshot FILE --json` gives (without its `schema` and `file`).
    pub summary: &'a Summary,
}

#[derive(Debug, Serialize)]
pub struct DeviceInfo {
    pub device: i64,
    pub events: usize,
    pub allocations: usize,
    pub oom_events: usize,
    /// False when the trace did not replay cleanly from the final state.
    pub replayed: bool,
}

/// Per bucket of a timeline, as parallel arrays (one value per bucket each).
#[derive(Debug, Default, Serialize)]
pub struct Buckets {
    /// The event each bucket is drawn at: its first event of highest live memory.
    pub event: Vec<usize>,
    pub time_us: Vec<Option<i64>>,
    /// Live bytes after that event: the bucket's highest.
    pub live_bytes: Vec<u64>,
    /// The lowest live bytes over the bucket.
    pub live_min_bytes: Vec<u64>,
    /// Reserved bytes after the drawn event, and their extremes over the bucket.
    pub reserved_bytes: Vec<u64>,
    pub reserved_min_bytes: Vec<u64>,
    pub reserved_max_bytes: Vec<u64>,
    /// `live_bytes` minus the bands live at the drawn event.
    pub other_bytes: Vec<u64>,
}

/// One allocation drawn as a band: live in buckets `first_bucket..end_bucket`.
#[derive(Debug, Serialize)]
pub struct BandView {
    /// None: made before the trace's first event.
    pub alloc_event: Option<u32>,
    /// None: still live at the end.
    pub free_event: Option<u32>,
    pub size_bytes: u64,
    pub first_bucket: usize,
    pub end_bucket: usize,
    /// Index into the answer's `stacks`.
    pub stack: u32,
}

#[derive(Debug, Serialize)]
pub struct FrameView {
    pub filename: String,
    pub line: i64,
    pub name: String,
}

#[derive(Debug, Serialize)]
pub struct StackView {
    /// Indices into the answer's `frames`, innermost first.
    pub frames: Vec<u32>,
    /// Frames deeper than [`MAX_FRAMES_PER_STACK`], not sent.
    pub frames_omitted: usize,
}

/// An `oom` event of the trace and what the summary says of it.
#[derive(Debug, Serialize)]
pub struct OomView<'a> {
    pub event: u32,
    /// The `oom:` line of `vramctl snapshot FILE` (None: older than the events measured).
    pub line: Option<String>,
    /// The `advice:` line about this event, if any.
    pub advice: Option<String>,
    /// Its numbers (docs/json.md, "snapshot FILE": `oom`).
    pub oom: Option<&'a OomEvent>,
}

#[derive(Debug, Serialize)]
pub struct TimelineView<'a> {
    pub device: i64,
    pub events: usize,
    /// The event range drawn: `from..to`.
    pub from: usize,
    pub to: usize,
    /// Over the whole trace.
    pub peak_event: usize,
    pub peak_live_bytes: u64,
    pub live_bytes_before_trace: u64,
    pub reserved_bytes_before_trace: u64,
    pub replayed: bool,
    pub buckets: Buckets,
    /// Allocations live at some drawn event; those covering the most of the chart (bytes ×
    /// buckets) are `bands`.
    pub allocations_in_range: usize,
    /// In the order they were made (the page stacks them in it, "other" below).
    pub bands: Vec<BandView>,
    pub oom: Vec<OomView<'a>>,
    pub frames: Vec<FrameView>,
    pub stacks: Vec<StackView>,
}

#[derive(Debug, Serialize)]
pub struct BlockView {
    pub address: u64,
    pub size_bytes: u64,
    pub requested_bytes: Option<u64>,
    pub state: BlockState,
    /// Active blocks only: index into the answer's `stacks`.
    pub stack: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct SegmentView {
    pub address: u64,
    pub total_bytes: u64,
    pub allocated_bytes: u64,
    pub active_bytes: u64,
    pub stream: i64,
    pub pool: Pool,
    pub pool_id: (i64, i64),
    pub is_expandable: bool,
    pub blocks: Vec<BlockView>,
}

#[derive(Debug, Serialize)]
pub struct EventView {
    pub action: String,
    pub addr: Option<u64>,
    pub size_bytes: u64,
    pub stream: i64,
    pub time_us: Option<i64>,
    pub stack: u32,
}

#[derive(Debug, Serialize)]
pub struct StateView {
    pub device: i64,
    pub event: usize,
    /// The trace entry of that event.
    pub entry: Option<EventView>,
    pub live_bytes: u64,
    pub reserved_bytes: u64,
    /// Σ and largest of the inactive blocks of all segments (also those not sent).
    pub free_bytes: u64,
    pub largest_free_block_bytes: u64,
    pub replayed: bool,
    pub segments_total: usize,
    /// Beyond [`MAX_SEGMENTS`], not sent.
    pub segments_omitted: usize,
    /// Beyond [`MAX_BLOCKS`], not sent (their sizes are in the sums above).
    pub blocks_omitted: usize,
    pub segments: Vec<SegmentView>,
    pub frames: Vec<FrameView>,
    pub stacks: Vec<StackView>,
}
