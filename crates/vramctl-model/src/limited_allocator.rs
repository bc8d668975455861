//! PyTorch's CUDA caching allocator with what decides whether a request fails: a capacity
//! (the memory the process may get), streams and private pools (free blocks serve only
//! their own), the free-and-retry path, and the settings `max_split_size_mb`,
//! `garbage_collection_threshold` and `expandable_segments`. `vramctl snapshot` replays a
//! trace through it under a candidate setting to say whether that setting would have
//! avoided an OOM (docs/snapshot.md, "Causes of an OOM").
//!
//! [`crate::caching_allocator`] is the default allocator alone, checked to the byte on the
//! H200 (estimate's peak reserved); this model follows the same rules and adds, as read
//! from c10/cuda/CUDACachingAllocator.cpp (`malloc`, `get_free_block`, `should_split`,
//! `alloc_block`, `release_cached_blocks`, `try_allocate_expandable_block`,
//! `garbage_collect_cached_blocks`):
//!
//! - a request looks for a free block of its (stream, pool, small/large) only;
//! - with `max_split_size`, a request below it never takes a block at or above it, a
//!   request at or above it takes no block more than 20 MiB (`max_non_split_rounding`)
//!   larger, and blocks of the large pool are split only for requests below it;
//! - a new segment is refused when reserved + its size would pass the capacity (cudaMalloc
//!   failing, or the `set_per_process_memory_fraction` check, which is the same sum);
//! - on a refusal every unsplit free segment of the default pools (all streams) is
//!   released and the request retried once; then it is an OOM;
//! - `garbage_collection_threshold` (only with a memory fraction set, as in PyTorch): before
//!   a new segment, unsplit free segments are released, least recently freed first, until
//!   reserved is under the threshold's share of the capacity;
//! - expandable segments: one growing address range per (stream, pool); a request that
//!   finds no free block maps pages (2 MiB small, 20 MiB large) at the lowest free address
//!   range that, with a free block just before it, holds it; blocks split whenever 512 B
//!   remain; the retry releases every whole free page.
//!
//! What it does not model: `roundup_power2_divisions`, events and `record_stream` (a block
//! is reusable at `free`), memory other processes take or give back during the run (the
//! capacity is one number).

use std::collections::{BTreeSet, HashMap};

use crate::caching_allocator::{
    MIN_BLOCK_BYTES, SMALL_REQUEST_BYTES, SMALL_SEGMENT_BYTES, round_size, segment_size,
};

/// `max_non_split_rounding_mb`'s default (kLargeBuffer): how much larger than a request at
/// or above `max_split_size` a cached block may be and still serve it.
pub const MAX_NON_SPLIT_ROUNDING_BYTES: u64 = 20 << 20;
/// The page an expandable segment of the large pool maps at a time (kLargeBuffer).
pub const LARGE_PAGE_BYTES: u64 = 20 << 20;
/// An expandable segment's address range: far more than any GPU's memory, so that the end
/// of the range always has room (PyTorch reserves 1⅛ of the device's memory).
const EXPANDABLE_RANGE_BYTES: u64 = 1 << 46;

/// The allocator settings a replay runs under (`PYTORCH_CUDA_ALLOC_CONF`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Settings {
    /// `max_split_size_mb`, in bytes; None: unlimited (the default).
    pub max_split_size_bytes: Option<u64>,
    /// `garbage_collection_threshold` (0..1); acts only with a memory fraction.
    pub garbage_collection_threshold: Option<f64>,
    pub expandable_segments: bool,
}

/// What the process may reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub bytes: u64,
    /// The limit is `set_per_process_memory_fraction`'s (garbage collection acts only then).
    pub fraction_set: bool,
}

/// (stream, private pool id, small pool): the set within which free blocks are reused.
pub type PoolKey = (i64, (i64, i64), bool);

/// A block handed out by [`LimitedAllocator::malloc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(usize);

/// A request the allocator could not serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory {
    pub requested_bytes: u64,
    /// Reserved after the free-and-retry path released what it could.
    pub reserved_bytes: u64,
}

#[derive(Debug, Clone)]
struct Block {
    addr: u64,
    size: u64,
    key: PoolKey,
    segment: usize,
    allocated: bool,
    /// Backed by physical pages (always, outside expandable segments).
    mapped: bool,
    prev: Option<usize>,
    next: Option<usize>,
    /// Order of the last free (for garbage collection's "oldest first").
    freed_at: u64,
}

#[derive(Debug, Clone)]
struct Segment {
    base: u64,
    expandable: bool,
    released: bool,
}

/// The allocator's state.
#[derive(Debug, Clone)]
pub struct LimitedAllocator {
    settings: Settings,
    capacity: Capacity,
    blocks: Vec<Block>,
    segments: Vec<Segment>,
    /// Mapped free blocks, by (size, address), per pool.
    free: HashMap<PoolKey, BTreeSet<(u64, u64, usize)>>,
    expandable: HashMap<PoolKey, usize>,
    /// Unmapped blocks of expandable segments, by address, per pool (PyTorch's
    /// `pool.unmapped`): where pages can be mapped, without walking a segment's blocks.
    unmapped: HashMap<PoolKey, BTreeSet<(u64, usize)>>,
    reserved: u64,
    next_base: u64,
    clock: u64,
    pub peak_reserved: u64,
}

fn page_of(small: bool) -> u64 {
    if small {
        SMALL_SEGMENT_BYTES
    } else {
        LARGE_PAGE_BYTES
    }
}

impl LimitedAllocator {
    pub fn new(settings: Settings, capacity: Capacity) -> Self {
        Self {
            settings,
            capacity,
            blocks: Vec::new(),
            segments: Vec::new(),
            free: HashMap::new(),
            expandable: HashMap::new(),
            unmapped: HashMap::new(),
            reserved: 0,
            next_base: 1 << 62,
            clock: 0,
            peak_reserved: 0,
        }
    }

    /// Bytes reserved now (mapped pages of expandable segments).
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    fn add_reserved(&mut self, bytes: u64) {
        self.reserved = self.reserved.saturating_add(bytes);
        self.peak_reserved = self.peak_reserved.max(self.reserved);
    }

    fn new_segment(&mut self, key: PoolKey, size: u64, expandable: bool, mapped: bool) -> usize {
        // New segments get ever lower addresses, as the driver handed them out on the H200
        // and as `caching_allocator` places them: which of two free blocks of one size wins
        // depends on it.
        self.next_base = self.next_base.saturating_sub(size.saturating_add(1 << 20));
        let base = self.next_base;
        self.segments.push(Segment {
            base,
            expandable,
            released: false,
        });
        let segment = self.segments.len() - 1;
        self.blocks.push(Block {
            addr: base,
            size,
            key,
            segment,
            allocated: false,
            mapped,
            prev: None,
            next: None,
            freed_at: 0,
        });
        let id = self.blocks.len() - 1;
        self.reindex_unmapped(id);
        id
    }

    /// Keeps block `id` in the unmapped index exactly when it is a free unmapped block.
    fn reindex_unmapped(&mut self, id: usize) {
        let b = &self.blocks[id];
        let entry = (b.addr, id);
        let wanted = !b.mapped && !b.allocated && b.size > 0;
        let set = self.unmapped.entry(b.key).or_default();
        if wanted {
            set.insert(entry);
        } else {
            set.remove(&entry);
        }
    }

    fn insert_free(&mut self, id: usize) {
        let b = &self.blocks[id];
        if b.mapped && !b.allocated {
            let entry = (b.size, b.addr, id);
            self.free.entry(b.key).or_default().insert(entry);
        }
    }

    fn remove_free(&mut self, id: usize) {
        let b = &self.blocks[id];
        let entry = (b.size, b.addr, id);
        if let Some(set) = self.free.get_mut(&b.key) {
            set.remove(&entry);
        }
    }

    /// A segment that existed before the replay began, with its live blocks at their
    /// offsets (`live`: (offset, size), ascending): it is reserved whatever the capacity.
    /// Returns the live blocks' handles, in the order given.
    pub fn insert_segment(&mut self, key: PoolKey, size: u64, live: &[(u64, u64)]) -> Vec<Handle> {
        let mut id = self.new_segment(key, size, false, true);
        let mut made = vec![id];
        self.add_reserved(size);
        let base = self.blocks[id].addr;
        let mut out = Vec::with_capacity(live.len());
        for &(offset, len) in live {
            // `id` is the free block covering the rest of the segment.
            let start = base.saturating_add(offset);
            let b_end = self.blocks[id].addr.saturating_add(self.blocks[id].size);
            if start < self.blocks[id].addr || start.saturating_add(len) > b_end || len == 0 {
                continue;
            }
            if start > self.blocks[id].addr {
                let gap = start - self.blocks[id].addr;
                id = self.split_off(id, gap);
                made.push(id);
            }
            let rest = self.blocks[id].size - len;
            let live_id = id;
            if rest > 0 {
                id = self.split_off(live_id, len);
                made.push(id);
            }
            self.blocks[live_id].allocated = true;
            out.push(Handle(live_id));
            if rest == 0 {
                break;
            }
        }
        for i in made {
            if !self.blocks[i].allocated {
                self.insert_free(i);
            }
        }
        out
    }

    /// Cuts block `id` (not in a free set) after `size` bytes; returns the new block after it.
    fn split_off(&mut self, id: usize, size: u64) -> usize {
        let rest = Block {
            addr: self.blocks[id].addr.saturating_add(size),
            size: self.blocks[id].size - size,
            prev: Some(id),
            next: self.blocks[id].next,
            ..self.blocks[id].clone()
        };
        self.blocks.push(rest);
        let rest_id = self.blocks.len() - 1;
        if let Some(n) = self.blocks[id].next {
            self.blocks[n].prev = Some(rest_id);
        }
        self.blocks[id].next = Some(rest_id);
        self.blocks[id].size = size;
        self.reindex_unmapped(rest_id);
        rest_id
    }

    /// Serves a request of `bytes` on `stream` in `pool_id` ((0, 0): the default pool) the
    /// way `malloc` does, free-and-retry included.
    ///
    /// # Errors
    /// [`OutOfMemory`] when even after releasing the cache no block can be had.
    pub fn malloc(
        &mut self,
        stream: i64,
        pool_id: (i64, i64),
        bytes: u64,
    ) -> Result<Handle, OutOfMemory> {
        let size = round_size(bytes);
        let small = size <= SMALL_REQUEST_BYTES;
        let key = (stream, pool_id, small);
        if let Some(id) = self.free_block(key, size) {
            return Ok(self.take(id, size));
        }
        if self.capacity.fraction_set
            && let Some(t) = self.settings.garbage_collection_threshold
        {
            self.garbage_collect(t);
        }
        if let Some(id) = self.grow(key, size) {
            return Ok(self.take(id, size));
        }
        self.release_cached();
        if let Some(id) = self.free_block(key, size).or_else(|| self.grow(key, size)) {
            return Ok(self.take(id, size));
        }
        Err(OutOfMemory {
            requested_bytes: bytes,
            reserved_bytes: self.reserved,
        })
    }

    /// `get_free_block`: the smallest mapped free block of the pool that fits, refused
    /// under the `max_split_size` rules (PyTorch looks at that one block only).
    fn free_block(&self, key: PoolKey, size: u64) -> Option<usize> {
        let &(block_size, _, id) = self.free.get(&key)?.range((size, 0, 0)..).next()?;
        if let (Some(max_split), false) = (
            self.settings.max_split_size_bytes,
            self.settings.expandable_segments,
        ) {
            if size < max_split && block_size >= max_split {
                return None;
            }
            if size >= max_split && block_size >= size.saturating_add(MAX_NON_SPLIT_ROUNDING_BYTES)
            {
                return None;
            }
        }
        Some(id)
    }

    /// Hands out free block `id` for `size` bytes, splitting off what `should_split` says.
    fn take(&mut self, id: usize, size: u64) -> Handle {
        self.remove_free(id);
        let small = self.blocks[id].key.2;
        let remaining = self.blocks[id].size - size;
        let expandable = self.segments[self.blocks[id].segment].expandable;
        let split = if small || expandable {
            remaining >= MIN_BLOCK_BYTES
        } else {
            size < self.settings.max_split_size_bytes.unwrap_or(u64::MAX)
                && remaining > SMALL_REQUEST_BYTES
        };
        if split {
            let rest = self.split_off(id, size);
            self.insert_free(rest);
        }
        self.blocks[id].allocated = true;
        Handle(id)
    }

    /// A free block of at least `size` made by the driver: a new segment, or pages mapped
    /// into the pool's expandable segment; None when the capacity does not allow it.
    fn grow(&mut self, key: PoolKey, size: u64) -> Option<usize> {
        if self.settings.expandable_segments {
            return self.grow_expandable(key, size);
        }
        let seg = segment_size(size);
        if self.reserved.saturating_add(seg) > self.capacity.bytes {
            return None;
        }
        let id = self.new_segment(key, seg, false, true);
        self.add_reserved(seg);
        Some(id)
    }

    fn grow_expandable(&mut self, key: PoolKey, size: u64) -> Option<usize> {
        if !self.expandable.contains_key(&key) {
            let id = self.new_segment(key, EXPANDABLE_RANGE_BYTES, true, false);
            self.expandable.insert(key, self.blocks[id].segment);
        }
        let page = page_of(key.2);
        // The lowest unmapped block that, with a free block just before it and the free
        // blocks after it, spans the request.
        let candidates: Vec<usize> = self
            .unmapped
            .get(&key)
            .map(|set| set.iter().map(|e| e.1).collect())
            .unwrap_or_default();
        for u in candidates {
            let start = match self.blocks[u].prev {
                Some(p) if !self.blocks[p].allocated => p,
                _ => u,
            };
            let mut span = 0u64;
            let mut walk = Some(start);
            let mut to_map = 0u64;
            while let Some(b) = walk {
                if self.blocks[b].allocated || span >= size {
                    break;
                }
                if !self.blocks[b].mapped {
                    let want = size - span;
                    to_map = to_map.saturating_add(
                        want.div_ceil(page)
                            .saturating_mul(page)
                            .min(self.blocks[b].size),
                    );
                }
                span = span.saturating_add(self.blocks[b].size);
                walk = self.blocks[b].next;
            }
            if span < size {
                continue;
            }
            if self.reserved.saturating_add(to_map) > self.capacity.bytes {
                return None;
            }
            return Some(self.map_from(start, size));
        }
        None
    }

    /// Maps pages from `start` on until one free mapped block there holds `size`; returns it.
    fn map_from(&mut self, start: usize, size: u64) -> usize {
        let page = page_of(self.blocks[start].key.2);
        let mut cur = start;
        loop {
            if self.blocks[cur].mapped {
                if self.blocks[cur].size >= size {
                    return cur;
                }
                let Some(n) = self.blocks[cur].next else {
                    return cur;
                };
                // The next one is unmapped (free mapped neighbours are merged).
                let want = (size - self.blocks[cur].size)
                    .div_ceil(page)
                    .saturating_mul(page)
                    .min(self.blocks[n].size);
                self.map_prefix(n, want);
                cur = self.merge_free(cur);
            } else {
                let want = size
                    .div_ceil(page)
                    .saturating_mul(page)
                    .min(self.blocks[cur].size);
                self.map_prefix(cur, want);
                cur = self.merge_free(cur);
            }
        }
    }

    /// Maps the first `bytes` of unmapped block `id` (splitting it).
    fn map_prefix(&mut self, id: usize, bytes: u64) {
        if bytes < self.blocks[id].size {
            self.split_off(id, bytes);
        }
        self.blocks[id].mapped = true;
        self.reindex_unmapped(id);
        self.add_reserved(bytes);
        self.insert_free(id);
    }

    /// Returns a block: merged with free neighbours in the same mapped state.
    pub fn free(&mut self, handle: Handle) {
        let id = handle.0;
        if !self.blocks[id].allocated {
            return;
        }
        self.blocks[id].allocated = false;
        self.clock += 1;
        self.blocks[id].freed_at = self.clock;
        let id = self.merge_free(id);
        self.insert_free(id);
    }

    /// Merges free block `id` (in or out of its free set) with free neighbours of the same
    /// mapped state; returns the merged block, in its free set when mapped.
    fn merge_free(&mut self, mut id: usize) -> usize {
        self.remove_free(id);
        if let Some(p) = self.blocks[id].prev
            && !self.blocks[p].allocated
            && self.blocks[p].mapped == self.blocks[id].mapped
        {
            self.remove_free(p);
            self.absorb_next(p);
            id = p;
        }
        if let Some(n) = self.blocks[id].next
            && !self.blocks[n].allocated
            && self.blocks[n].mapped == self.blocks[id].mapped
        {
            self.remove_free(n);
            self.absorb_next(id);
        }
        self.insert_free(id);
        id
    }

    /// Block `id` takes in its next block.
    fn absorb_next(&mut self, id: usize) {
        let Some(n) = self.blocks[id].next else {
            return;
        };
        self.blocks[id].size = self.blocks[id].size.saturating_add(self.blocks[n].size);
        self.blocks[id].freed_at = self.blocks[id].freed_at.max(self.blocks[n].freed_at);
        self.blocks[id].next = self.blocks[n].next;
        if let Some(nn) = self.blocks[n].next {
            self.blocks[nn].prev = Some(id);
        }
        self.blocks[n].size = 0;
        self.blocks[n].prev = None;
        self.blocks[n].next = None;
        self.blocks[n].allocated = true; // a dead slot: never free, never merged
        self.reindex_unmapped(n);
    }

    /// `release_cached_blocks`: every unsplit free segment of the default pools, and the
    /// whole free pages of expandable segments.
    pub fn release_cached(&mut self) {
        let candidates: Vec<usize> = self
            .free
            .iter()
            .filter(|(k, _)| k.1 == (0, 0))
            .flat_map(|(_, s)| s.iter().map(|e| e.2))
            .collect();
        for id in candidates {
            self.release_block(id);
        }
    }

    fn release_block(&mut self, id: usize) {
        let segment = self.blocks[id].segment;
        if self.segments[segment].expandable {
            self.unmap_whole_pages(id);
        } else if self.blocks[id].prev.is_none() && self.blocks[id].next.is_none() {
            self.remove_free(id);
            self.reserved = self.reserved.saturating_sub(self.blocks[id].size);
            self.segments[segment].released = true;
            self.blocks[id].allocated = true; // dead
        }
    }

    /// Unmaps the whole pages inside free block `id` of an expandable segment.
    fn unmap_whole_pages(&mut self, id: usize) {
        let seg_base = self.segments[self.blocks[id].segment].base;
        let page = page_of(self.blocks[id].key.2);
        let off = self.blocks[id].addr - seg_base;
        let first = off.div_ceil(page) * page;
        let end = (off + self.blocks[id].size) / page * page;
        if end <= first {
            return;
        }
        self.remove_free(id);
        let mut mid = id;
        if first > off {
            mid = self.split_off(id, first - off);
            self.insert_free(id);
        }
        let mid_len = end - first;
        if self.blocks[mid].size > mid_len {
            let tail = self.split_off(mid, mid_len);
            self.insert_free(tail);
        }
        self.blocks[mid].mapped = false;
        self.reindex_unmapped(mid);
        self.reserved = self.reserved.saturating_sub(mid_len);
        self.merge_free(mid);
    }

    /// `garbage_collect_cached_blocks`, approximated: unsplit free segments, least recently
    /// freed first, until reserved is under `threshold` × capacity.
    fn garbage_collect(&mut self, threshold: f64) {
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let target = (self.capacity.bytes as f64 * threshold) as u64;
        if self.reserved <= target {
            return;
        }
        let mut whole: Vec<(u64, usize)> = self
            .free
            .iter()
            .filter(|(k, _)| k.1 == (0, 0))
            .flat_map(|(_, s)| s.iter().map(|e| e.2))
            .filter(|&id| self.blocks[id].prev.is_none() && self.blocks[id].next.is_none())
            .filter(|&id| !self.segments[self.blocks[id].segment].expandable)
            .map(|id| (self.blocks[id].freed_at, id))
            .collect();
        whole.sort_unstable();
        for (_, id) in whole {
            if self.reserved <= target {
                break;
            }
            self.release_block(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn alloc(settings: Settings, capacity: u64) -> LimitedAllocator {
        LimitedAllocator::new(
            settings,
            Capacity {
                bytes: capacity,
                fraction_set: false,
            },
        )
    }

    /// Interleaved frees leave holes no larger request fits; the default allocator fails
    /// at the capacity, expandable segments unmap the holes' pages and map them at the end.
    #[test]
    fn holes_between_live_blocks_fail_by_default_and_fit_with_expandable_segments() {
        let run = |settings: Settings| {
            let mut a = alloc(settings, 400 * MIB);
            let whole = a.malloc(0, (0, 0), 400 * MIB).expect("fits");
            a.free(whole);
            let blocks: Vec<Handle> = (0..10)
                .map(|_| a.malloc(0, (0, 0), 40 * MIB).expect("fits"))
                .collect();
            for b in blocks.iter().step_by(2) {
                a.free(*b);
            }
            a.malloc(0, (0, 0), 100 * MIB)
        };
        assert!(
            run(Settings::default()).is_err(),
            "200 MiB free in 40 MiB holes"
        );
        assert!(
            run(Settings {
                expandable_segments: true,
                ..Settings::default()
            })
            .is_ok()
        );
    }

    /// Whole free segments are given back by the retry: no OOM though the cache was full.
    #[test]
    fn the_retry_releases_unsplit_free_segments_of_every_stream() {
        let mut a = alloc(Settings::default(), 100 * MIB);
        let x = a.malloc(7, (0, 0), 80 * MIB).expect("fits");
        a.free(x);
        assert_eq!(a.reserved(), 80 * MIB);
        assert!(
            a.malloc(0, (0, 0), 90 * MIB).is_ok(),
            "stream 7's cache released"
        );
        assert_eq!(a.reserved(), 90 * MIB);
    }

    /// A split segment on another stream stays: its free part serves only that stream.
    #[test]
    fn free_memory_of_another_stream_in_a_split_segment_is_unusable() {
        let mut a = alloc(Settings::default(), 100 * MIB);
        let whole = a.malloc(7, (0, 0), 80 * MIB).expect("fits");
        a.free(whole);
        let x = a.malloc(7, (0, 0), 60 * MIB).expect("fits");
        let _y = a
            .malloc(7, (0, 0), 19 * MIB)
            .expect("the rest of the segment");
        assert_eq!(a.reserved(), 80 * MIB);
        a.free(x);
        assert!(
            a.malloc(0, (0, 0), 50 * MIB).is_err(),
            "60 MiB free, on stream 7"
        );
        assert!(
            a.malloc(7, (0, 0), 50 * MIB).is_ok(),
            "on its own stream it fits"
        );
    }

    /// max_split_size keeps large blocks whole: a small request takes no oversize block.
    #[test]
    fn max_split_size_keeps_oversize_blocks_for_large_requests() {
        let s = Settings {
            max_split_size_bytes: Some(64 * MIB),
            ..Settings::default()
        };
        let mut a = alloc(s, 1 << 40);
        let big = a.malloc(0, (0, 0), 200 * MIB).expect("fits");
        a.free(big);
        let _small = a.malloc(0, (0, 0), 30 * MIB).expect("fits");
        assert_eq!(
            a.reserved(),
            200 * MIB + 30 * MIB,
            "a new segment, not a split"
        );
        let mut d = alloc(Settings::default(), 1 << 40);
        let big = d.malloc(0, (0, 0), 200 * MIB).expect("fits");
        d.free(big);
        let _small = d.malloc(0, (0, 0), 30 * MIB).expect("fits");
        assert_eq!(d.reserved(), 200 * MIB, "the default splits it");
    }

    /// With no limit and the default settings on one stream, the model is the byte-exact
    /// `caching_allocator` (checked on the H200's traces): the same reserved bytes after
    /// every step of random sequences of requests and frees.
    #[test]
    fn unlimited_and_default_it_is_the_checked_allocator() {
        use crate::caching_allocator::CachingAllocator;
        for seed in 1..=200u64 {
            let mut x = seed;
            let mut next = move || {
                // xorshift64: a fixed sequence per seed.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let mut a = alloc(Settings::default(), u64::MAX);
            let mut b = CachingAllocator::new();
            let mut live: Vec<(Handle, crate::caching_allocator::BlockId)> = Vec::new();
            for step in 0..300 {
                if live.is_empty() || next() % 3 != 0 {
                    let size = match next() % 4 {
                        0 => next() % (1 << 20) + 1,
                        1 => next() % (10 << 20) + 1,
                        _ => next() % (64 << 20) + 1,
                    };
                    let h = a.malloc(0, (0, 0), size).expect("no limit");
                    live.push((h, b.malloc(size)));
                } else {
                    let i = usize::try_from(next() % live.len() as u64).expect("index");
                    let (h, id) = live.swap_remove(i);
                    a.free(h);
                    b.free(id);
                }
                assert_eq!(a.reserved(), b.reserved(), "seed {seed} step {step}");
            }
            assert_eq!(a.peak_reserved, b.peak_reserved, "seed {seed}");
        }
    }

    /// A segment from before the replay keeps its live blocks where they were.
    #[test]
    fn an_inserted_segment_keeps_its_live_blocks_and_its_holes() {
        let mut a = alloc(Settings::default(), 80 * MIB);
        let live = a.insert_segment((0, (0, 0), false), 60 * MIB, &[(20 * MIB, 20 * MIB)]);
        assert_eq!(live.len(), 1);
        assert!(
            a.malloc(0, (0, 0), 20 * MIB).is_ok(),
            "a 20 MiB hole each side"
        );
        assert!(
            a.malloc(0, (0, 0), 30 * MIB).is_err(),
            "60 + 30 > 80 and no 30 MiB hole"
        );
        a.free(live[0]);
        assert!(a.malloc(0, (0, 0), 30 * MIB).is_ok());
    }
}
