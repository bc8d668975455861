//! The allocator's state at any event of a device's trace, rebuilt from the final state (the
//! snapshot's segments) by undoing, newest first, the events after it — the way the
//! browser viewer's "allocator state history" works. One model for the OOM events of the
//! summary, `snapshot timeline` and `--at EVENT`.
//!
//! Undoing an `alloc` removes its block, a `free_completed` makes its block live again
//! (pending free until its `free_requested` is undone), a `segment_alloc`/`segment_map`
//! removes the memory, a `segment_free`/`segment_unmap` adds it back. Blocks live at the end
//! have their exact size; a block made live again by the undo has only the trace's size,
//! which is the request, so its block size is the request rounded the way the allocator
//! rounds (512 B multiples, at least 512 B; `round_size`), capped to the free room at its
//! address. Segments freed after the event go to the small pool when ≤ 2 MiB (kSmallBuffer),
//! else the large.

use std::collections::BTreeMap;

use crate::model::{
    Action, Block, BlockState, Pool, Segment, Snapshot, StackId, Trace, TraceEntry,
};

/// The allocator's kMinBlockSize: every block is a multiple of it.
const MIN_BLOCK_BYTES: u64 = 512;
/// The allocator's kSmallBuffer: the segment size of the small pool.
const SMALL_SEGMENT_BYTES: u64 = 2 << 20;

/// An active block in the replay.
#[derive(Debug, Clone, Copy)]
pub struct LiveBlock {
    pub size: u64,
    pub requested_size: Option<u64>,
    pub state: BlockState,
    pub stack: StackId,
}

#[derive(Debug, Clone)]
struct ReplaySegment {
    end: u64,
    stream: i64,
    pool: Pool,
    pool_id: (i64, i64),
    is_expandable: bool,
    /// Index into the snapshot's segments while unchanged by the undo (then the file's own
    /// numbers are used as they are).
    original: Option<usize>,
    blocks: BTreeMap<u64, LiveBlock>,
}

/// A segment of a [`Replay`]'s state.
#[derive(Debug, Clone, Copy)]
pub struct SegmentView<'r> {
    pub start: u64,
    pub end: u64,
    pub stream: i64,
    pub pool: Pool,
    pub pool_id: (i64, i64),
    pub is_expandable: bool,
    /// Active blocks by address.
    pub blocks: &'r BTreeMap<u64, LiveBlock>,
}

impl SegmentView<'_> {
    /// Bytes not in an active block.
    pub fn free_bytes(&self) -> u64 {
        let live = self
            .blocks
            .values()
            .fold(0u64, |a, b| a.saturating_add(b.size));
        (self.end - self.start).saturating_sub(live)
    }
}

/// What undoing one event changed (for curves kept up to date event by event).
#[derive(Debug, Clone, Copy, Default)]
pub struct Undone {
    pub stack: StackId,
    pub live_added_bytes: u64,
    pub live_removed_bytes: u64,
    pub reserved_added_bytes: u64,
    pub reserved_removed_bytes: u64,
}

/// One device's memory as it was after some event of its trace.
#[derive(Debug, Clone)]
pub struct Replay<'a> {
    snap: &'a Snapshot,
    pub device: i64,
    segs: BTreeMap<u64, ReplaySegment>,
    /// The trace index whose state this is: after event `at - 1`; `trace.len()` is the end.
    at: usize,
    /// False once an undone event named memory the state did not have (a file edited by
    /// hand; a ring buffer that dropped older events is fine).
    pub consistent: bool,
}

/// `round_size` of the allocator (without `roundup_power2_divisions`).
fn rounded(requested: u64) -> u64 {
    if requested < MIN_BLOCK_BYTES {
        MIN_BLOCK_BYTES
    } else {
        requested.div_ceil(MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
    }
}

impl<'a> Replay<'a> {
    /// The state at the end of the trace: the snapshot's segments of `device`.
    pub fn at_end(snap: &'a Snapshot, device: i64) -> Self {
        let mut segs = BTreeMap::new();
        for (i, s) in snap.segments.iter().enumerate() {
            if s.device != device {
                continue;
            }
            let blocks = s
                .blocks
                .iter()
                .filter(|b| b.state.is_active())
                .map(|b| {
                    (
                        b.address,
                        LiveBlock {
                            size: b.size,
                            requested_size: b.requested_size,
                            state: b.state,
                            stack: b.stack,
                        },
                    )
                })
                .collect();
            segs.insert(
                s.address,
                ReplaySegment {
                    end: s.address.saturating_add(s.total_size),
                    stream: s.stream,
                    pool: s.pool,
                    pool_id: s.pool_id,
                    is_expandable: s.is_expandable,
                    original: Some(i),
                    blocks,
                },
            );
        }
        Self {
            snap,
            device,
            segs,
            at: trace(snap, device).len(),
            consistent: true,
        }
    }

    /// The state right after event `event` of the device's trace (`None`: before the
    /// first event).
    pub fn after_event(snap: &'a Snapshot, device: i64, event: Option<usize>) -> Self {
        let mut r = Self::at_end(snap, device);
        r.undo_to(event);
        r
    }

    /// Undoes events until the state is the one right after `event` (`None`: before the
    /// first); a state already older stays as it is.
    pub fn undo_to(&mut self, event: Option<usize>) {
        let stop = event.map_or(0, |e| e.saturating_add(1));
        while self.at > stop {
            self.undo_last();
        }
    }

    /// Undoes the newest event not undone yet; `None` when the start is reached.
    pub fn undo_last(&mut self) -> Option<Undone> {
        let i = self.at.checked_sub(1)?;
        self.at = i;
        let e = &trace(self.snap, self.device)[i];
        Some(self.undo(e))
    }

    fn segment_at(&mut self, addr: u64) -> Option<&mut ReplaySegment> {
        self.segs
            .range_mut(..=addr)
            .next_back()
            .map(|(_, s)| s)
            .filter(|s| addr < s.end)
    }

    fn undo(&mut self, e: &TraceEntry) -> Undone {
        let mut out = Undone {
            stack: e.stack,
            ..Undone::default()
        };
        let Some(addr) = e.addr else { return out };
        match e.action {
            Action::Alloc => match self.segment_at(addr) {
                Some(s) => match s.blocks.remove(&addr) {
                    Some(b) => {
                        s.original = None;
                        out.stack = b.stack;
                        out.live_removed_bytes = b.size;
                    }
                    None => self.consistent = false,
                },
                None => self.consistent = false,
            },
            Action::FreeRequested => match self.segment_at(addr).and_then(|s| {
                s.original = None;
                s.blocks.get_mut(&addr)
            }) {
                Some(b) => b.state = BlockState::ActiveAllocated,
                None => self.consistent = false,
            },
            Action::FreeCompleted | Action::Free => {
                let state = if e.action == Action::Free {
                    BlockState::ActiveAllocated
                } else {
                    BlockState::ActivePendingFree
                };
                match self.segment_at(addr) {
                    Some(s) if !s.blocks.contains_key(&addr) => {
                        let room = s
                            .blocks
                            .range(addr..)
                            .next()
                            .map_or(s.end, |(&next, _)| next)
                            .saturating_sub(addr);
                        let size = rounded(e.size).min(room);
                        s.original = None;
                        s.blocks.insert(
                            addr,
                            LiveBlock {
                                size,
                                requested_size: Some(e.size),
                                state,
                                stack: e.stack,
                            },
                        );
                        out.live_added_bytes = size;
                    }
                    _ => self.consistent = false,
                }
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                // Undo: the memory was not there before. A map of part of an expandable
                // segment shrinks it; a whole segment goes away.
                if let Some(s) = self.segs.get(&addr) {
                    if s.end <= addr.saturating_add(e.size) {
                        if !s.blocks.is_empty() {
                            self.consistent = false;
                        }
                        out.reserved_removed_bytes = s.end - addr;
                        self.segs.remove(&addr);
                        return out;
                    }
                }
                match self.segs.range_mut(..=addr).next_back() {
                    Some((_, s)) if addr < s.end && addr.saturating_add(e.size) >= s.end => {
                        out.reserved_removed_bytes = s.end - addr;
                        s.end = addr;
                        s.original = None;
                    }
                    _ => self.consistent = false,
                }
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                // Undo: a segment (or mapped range) of free memory existed.
                out.reserved_added_bytes = e.size;
                let grows = self
                    .segs
                    .range_mut(..=addr)
                    .next_back()
                    .filter(|(_, s)| s.end == addr && s.stream == e.stream);
                match grows {
                    Some((_, s)) if e.action == Action::SegmentUnmap => {
                        s.end = addr.saturating_add(e.size);
                        s.original = None;
                    }
                    _ => {
                        self.segs.insert(
                            addr,
                            ReplaySegment {
                                end: addr.saturating_add(e.size),
                                stream: e.stream,
                                pool: if e.size <= SMALL_SEGMENT_BYTES {
                                    Pool::Small
                                } else {
                                    Pool::Large
                                },
                                pool_id: (0, 0),
                                is_expandable: e.action == Action::SegmentUnmap,
                                original: None,
                                blocks: BTreeMap::new(),
                            },
                        );
                    }
                }
            }
            _ => {}
        }
        out
    }

    /// The segments of the state, in address order.
    pub fn segments(&self) -> impl Iterator<Item = SegmentView<'_>> {
        self.segs.iter().map(|(&start, s)| SegmentView {
            start,
            end: s.end,
            stream: s.stream,
            pool: s.pool,
            pool_id: s.pool_id,
            is_expandable: s.is_expandable,
            blocks: &s.blocks,
        })
    }

    /// The active blocks, in address order.
    pub fn live_blocks(&self) -> impl Iterator<Item = &LiveBlock> {
        self.segs.values().flat_map(|s| s.blocks.values())
    }

    /// The active blocks with their addresses, in address order.
    pub fn live_blocks_by_address(&self) -> impl Iterator<Item = (u64, &LiveBlock)> {
        self.segs
            .values()
            .flat_map(|s| s.blocks.iter().map(|(&a, b)| (a, b)))
    }

    /// How many segments the state has.
    pub fn segment_count(&self) -> usize {
        self.segs.len()
    }

    /// The trace index whose state this is: the state after event `at() - 1` (0: before
    /// the first event).
    pub fn at(&self) -> usize {
        self.at
    }

    /// Σ sizes of the active blocks.
    pub fn live_bytes(&self) -> u64 {
        self.live_blocks()
            .fold(0u64, |a, b| a.saturating_add(b.size))
    }

    /// Σ sizes of the segments.
    pub fn reserved_bytes(&self) -> u64 {
        self.segs
            .iter()
            .fold(0u64, |a, (&start, s)| a.saturating_add(s.end - start))
    }

    /// Σ sizes of the segments without an active block: what `empty_cache()` would return.
    pub fn releasable_bytes(&self) -> u64 {
        self.segs
            .iter()
            .filter(|(_, s)| s.blocks.is_empty())
            .fold(0u64, |a, (&start, s)| a.saturating_add(s.end - start))
    }

    /// Free space on one stream, in the default pool a request of `pool` goes to (private
    /// pools left out): (free bytes,
    /// the largest contiguous free range, free bytes in segments that also hold an active
    /// block, how many such segments).
    pub fn free_on(&self, stream: i64, pool: Pool) -> (u64, u64, u64, u64) {
        let (mut free, mut largest, mut split, mut split_segments) = (0u64, 0u64, 0u64, 0u64);
        for (&start, s) in &self.segs {
            // A private pool's (CUDA graph, MemPool) free blocks serve only its own
            // allocations, not the default pool's.
            if s.stream != stream
                || (s.pool != pool && s.pool != Pool::Unknown)
                || s.pool_id != (0, 0)
            {
                continue;
            }
            let mut cursor = start;
            let mut seg_free: u64 = 0;
            for (&a, b) in &s.blocks {
                let gap = a.saturating_sub(cursor);
                seg_free = seg_free.saturating_add(gap);
                largest = largest.max(gap);
                cursor = cursor.max(a.saturating_add(b.size));
            }
            let tail = s.end.saturating_sub(cursor);
            seg_free = seg_free.saturating_add(tail);
            largest = largest.max(tail);
            free = free.saturating_add(seg_free);
            // memory_stats() leaves expandable segments out of inactive split: their
            // free whole pages can be unmapped and mapped again where needed.
            if !s.blocks.is_empty() && seg_free > 0 && !s.is_expandable {
                split = split.saturating_add(seg_free);
                split_segments += 1;
            }
        }
        (free, largest, split, split_segments)
    }

    /// The state as a snapshot of this device alone (no trace), which the summary, `--top`
    /// and the flame graph read like any file. Segments the undo did not change are the
    /// file's own; changed ones are rebuilt from their active blocks, the gaps between
    /// them inactive blocks (the allocator merges neighbouring free blocks, so one gap is
    /// one block).
    pub fn to_snapshot(&self) -> Snapshot {
        let segments = self.file_segments(usize::MAX);
        Snapshot {
            format: self.snap.format,
            segments,
            device_traces: Vec::new(),
            trace_stacks: self.snap.trace_stacks,
            parallel_parts: 0,
            negative_sizes: self.snap.negative_sizes,
            allocator_settings: self.snap.allocator_settings.clone(),
            frames: self.snap.frames.clone(),
            stacks: self.snap.stacks.clone(),
        }
    }
}

impl Replay<'_> {
    /// The first `max` segments of the state in address order, as [`Replay::to_snapshot`]
    /// makes them (the file's own where the undo did not change them), without copying the
    /// frames and stacks a whole snapshot carries.
    pub fn file_segments(&self, max: usize) -> Vec<Segment> {
        self.segs
            .iter()
            .take(max)
            .map(|(&start, s)| match s.original {
                Some(i) => self.snap.segments[i].clone(),
                None => rebuilt_segment(self.device, start, s),
            })
            .collect()
    }
}

fn rebuilt_segment(device: i64, start: u64, s: &ReplaySegment) -> Segment {
    let mut blocks = Vec::with_capacity(s.blocks.len() * 2 + 1);
    let mut cursor = start;
    let gap = |from: u64, to: u64| Block {
        address: from,
        size: to - from,
        requested_size: None,
        state: BlockState::Inactive,
        stack: 0,
    };
    for (&a, b) in &s.blocks {
        if a > cursor {
            blocks.push(gap(cursor, a));
        }
        blocks.push(Block {
            address: a,
            size: b.size,
            requested_size: b.requested_size,
            state: b.state,
            stack: b.stack,
        });
        cursor = cursor.max(a.saturating_add(b.size));
    }
    if s.end > cursor {
        blocks.push(gap(cursor, s.end));
    }
    let sum = |f: &dyn Fn(&Block) -> bool| {
        blocks
            .iter()
            .filter(|b| f(b))
            .fold(0u64, |a, b| a.saturating_add(b.size))
    };
    let allocated_size = sum(&|b| b.state == BlockState::ActiveAllocated);
    let active_size = sum(&|b| b.state.is_active());
    let requested_size = blocks
        .iter()
        .filter(|b| b.state.is_active())
        .try_fold(0u64, |a, b| Some(a.saturating_add(b.requested_size?)));
    Segment {
        device,
        address: start,
        total_size: s.end - start,
        allocated_size,
        active_size,
        requested_size,
        stream: s.stream,
        pool: s.pool,
        pool_id: s.pool_id,
        is_expandable: s.is_expandable,
        blocks,
        stack: 0,
    }
}

/// The trace of `device` (empty when the file has none for it).
pub fn trace(snap: &Snapshot, device: i64) -> &Trace {
    static EMPTY: Trace = Trace::EMPTY;
    usize::try_from(device)
        .ok()
        .and_then(|d| snap.device_traces.get(d))
        .unwrap_or(&EMPTY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_block_made_live_again_is_its_request_rounded_as_the_allocator_does() {
        assert_eq!(rounded(4), 512);
        assert_eq!(rounded(512), 512);
        assert_eq!(rounded(513), 1024);
        assert_eq!(rounded(4 << 20), 4 << 20);
    }
}
