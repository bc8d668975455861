//! PyTorch's CUDA caching allocator, replayed: what `torch.cuda.max_memory_reserved()` becomes
//! for a given order of allocations and frees (`docs/estimate.md`, "The allocator").
//!
//! The rules are CUDACachingAllocator's defaults (no `max_split_size`, no expandable segments,
//! no garbage collection, one stream), as read from its source and checked on the H200 traces
//! of `testdata/h200/estimate/round2-traces.tar` (`scripts/estimate/replay_traces.py` replays
//! them: the peak reserved of all 19 traced cases to the byte):
//!
//! - a request is rounded up to a multiple of 512 B;
//! - up to 1 MiB it is served from the small pool, whose segments are 2 MiB; above, from the
//!   large pool, whose segments are 20 MiB for requests below 10 MiB and otherwise the request
//!   rounded up to 2 MiB;
//! - a request takes the free block of its pool with the smallest size that fits, the lowest
//!   address among equal sizes (best fit), and splits it when what remains is more than 1 MiB
//!   (large pool) or at least 512 B (small pool);
//! - a freed block merges with free neighbours of its segment; segments are never returned to
//!   the driver, so reserved memory only grows;
//! - new segments get ever lower addresses, as the driver handed them out on the H200 (which
//!   block wins among free blocks of equal size depends on it).

use std::collections::BTreeSet;

/// Requests are rounded up to this.
pub const MIN_BLOCK_BYTES: u64 = 512;
/// Largest request served from the small pool.
pub const SMALL_REQUEST_BYTES: u64 = 1 << 20;
/// Segment size of the small pool.
pub const SMALL_SEGMENT_BYTES: u64 = 2 << 20;
/// Segment size of the large pool for requests below [`MIN_LARGE_ALLOC_BYTES`].
pub const LARGE_SEGMENT_BYTES: u64 = 20 << 20;
/// Requests from this size on get a segment of their own size, rounded to
/// [`LARGE_ROUND_BYTES`].
pub const MIN_LARGE_ALLOC_BYTES: u64 = 10 << 20;
/// Rounding of large segments.
pub const LARGE_ROUND_BYTES: u64 = 2 << 20;

/// A block handed out by [`CachingAllocator::malloc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockId(usize);

#[derive(Debug, Clone)]
struct Block {
    addr: u64,
    size: u64,
    small: bool,
    free: bool,
    prev: Option<usize>,
    next: Option<usize>,
}

/// The allocator's state: blocks of every segment, the free ones by (size, address) per pool,
/// and the byte counts PyTorch's `memory_stats()` reports.
#[derive(Debug, Clone, Default)]
pub struct CachingAllocator {
    blocks: Vec<Block>,
    free_large: BTreeSet<(u64, u64, usize)>,
    free_small: BTreeSet<(u64, u64, usize)>,
    next_segment_end: u64,
    reserved: u64,
    allocated: u64,
    /// `max_memory_reserved()`.
    pub peak_reserved: u64,
    /// `max_memory_allocated()` (rounded request sizes, as PyTorch counts them).
    pub peak_allocated: u64,
    /// Segments cut (`num_device_alloc`).
    pub segments: u64,
}

/// A request's size as the allocator rounds it.
pub fn round_size(bytes: u64) -> u64 {
    bytes
        .max(MIN_BLOCK_BYTES)
        .div_ceil(MIN_BLOCK_BYTES)
        .saturating_mul(MIN_BLOCK_BYTES)
}

/// The size of the segment a rounded request that finds no free block causes.
pub fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_REQUEST_BYTES {
        SMALL_SEGMENT_BYTES
    } else if rounded < MIN_LARGE_ALLOC_BYTES {
        LARGE_SEGMENT_BYTES
    } else {
        rounded
            .div_ceil(LARGE_ROUND_BYTES)
            .saturating_mul(LARGE_ROUND_BYTES)
    }
}

impl CachingAllocator {
    /// An empty allocator (nothing reserved).
    pub fn new() -> Self {
        CachingAllocator {
            next_segment_end: 1 << 62,
            ..Default::default()
        }
    }

    /// Bytes reserved now.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Bytes allocated now.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    fn pool(&mut self, small: bool) -> &mut BTreeSet<(u64, u64, usize)> {
        if small {
            &mut self.free_small
        } else {
            &mut self.free_large
        }
    }

    /// Serves a request of `bytes`: best fit among the free blocks of its pool, else a new
    /// segment; splits what is left over.
    pub fn malloc(&mut self, bytes: u64) -> BlockId {
        let size = round_size(bytes);
        let small = size <= SMALL_REQUEST_BYTES;
        let found = self.pool(small).range((size, 0, 0)..).next().copied();
        let id = match found {
            Some(key) => {
                self.pool(small).remove(&key);
                key.2
            }
            None => {
                let seg = segment_size(size);
                self.next_segment_end = self
                    .next_segment_end
                    .saturating_sub(seg.saturating_add(1 << 20));
                let addr = self.next_segment_end;
                self.reserved = self.reserved.saturating_add(seg);
                self.peak_reserved = self.peak_reserved.max(self.reserved);
                self.segments += 1;
                self.blocks.push(Block {
                    addr,
                    size: seg,
                    small,
                    free: true,
                    prev: None,
                    next: None,
                });
                self.blocks.len() - 1
            }
        };
        let remaining = self.blocks[id].size - size;
        let split = if small {
            remaining >= MIN_BLOCK_BYTES
        } else {
            remaining > SMALL_REQUEST_BYTES
        };
        if split {
            let rest = Block {
                addr: self.blocks[id].addr + size,
                size: remaining,
                small,
                free: true,
                prev: Some(id),
                next: self.blocks[id].next,
            };
            self.blocks.push(rest);
            let rest_id = self.blocks.len() - 1;
            if let Some(n) = self.blocks[id].next {
                self.blocks[n].prev = Some(rest_id);
            }
            self.blocks[id].next = Some(rest_id);
            self.blocks[id].size = size;
            let rest_addr = self.blocks[rest_id].addr;
            self.pool(small).insert((remaining, rest_addr, rest_id));
        }
        self.blocks[id].free = false;
        self.allocated = self.allocated.saturating_add(self.blocks[id].size);
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        BlockId(id)
    }

    /// Returns a block: merged with its free neighbours, kept in its pool.
    pub fn free(&mut self, block: BlockId) {
        let mut id = block.0;
        if self.blocks[id].free {
            return;
        }
        self.blocks[id].free = true;
        self.allocated = self.allocated.saturating_sub(self.blocks[id].size);
        let small = self.blocks[id].small;
        if let Some(p) = self.blocks[id].prev
            && self.blocks[p].free
        {
            let key = (self.blocks[p].size, self.blocks[p].addr, p);
            self.pool(small).remove(&key);
            self.blocks[p].size += self.blocks[id].size;
            self.blocks[p].next = self.blocks[id].next;
            if let Some(n) = self.blocks[id].next {
                self.blocks[n].prev = Some(p);
            }
            id = p;
        }
        if let Some(n) = self.blocks[id].next
            && self.blocks[n].free
        {
            let key = (self.blocks[n].size, self.blocks[n].addr, n);
            self.pool(small).remove(&key);
            self.blocks[id].size += self.blocks[n].size;
            self.blocks[id].next = self.blocks[n].next;
            if let Some(nn) = self.blocks[n].next {
                self.blocks[nn].prev = Some(id);
            }
        }
        let key = (self.blocks[id].size, self.blocks[id].addr, id);
        self.pool(small).insert(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn requests_round_to_512_bytes_and_segments_by_pool() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(segment_size(MIB), 2 * MIB, "1 MiB is still small");
        assert_eq!(segment_size(MIB + 512), 20 * MIB);
        assert_eq!(segment_size(10 * MIB), 10 * MIB);
        assert_eq!(segment_size(10 * MIB + 512), 12 * MIB);
    }

    /// A freed block is reused by a smaller request (split), and merges back when both go.
    #[test]
    fn best_fit_splits_and_merges() {
        let mut a = CachingAllocator::new();
        let big = a.malloc(100 * MIB);
        assert_eq!(a.reserved(), 100 * MIB);
        a.free(big);
        let x = a.malloc(40 * MIB);
        let y = a.malloc(40 * MIB);
        assert_eq!(a.reserved(), 100 * MIB, "both fit in the freed segment");
        // 20 MiB are left: a 30 MiB request needs a new segment.
        let z = a.malloc(30 * MIB);
        assert_eq!(a.reserved(), 130 * MIB);
        a.free(x);
        a.free(y);
        a.free(z);
        let again = a.malloc(100 * MIB);
        assert_eq!(
            a.reserved(),
            130 * MIB,
            "x, y and the rest merged back into 100 MiB"
        );
        a.free(again);
        assert_eq!(a.peak_allocated, 110 * MIB);
        assert_eq!(a.peak_reserved, 130 * MIB);
        assert_eq!(a.segments, 2);
    }

    /// The smallest free block that fits wins, not the first freed.
    #[test]
    fn the_smallest_fitting_block_is_taken() {
        let mut a = CachingAllocator::new();
        let b64 = a.malloc(64 * MIB);
        let b32 = a.malloc(32 * MIB);
        a.free(b64);
        a.free(b32);
        let _c = a.malloc(30 * MIB);
        let _d = a.malloc(60 * MIB);
        assert_eq!(a.reserved(), 96 * MIB, "30 went to the 32, 60 to the 64");
        let _e = a.malloc(8 * MIB);
        assert_eq!(
            a.reserved(),
            116 * MIB,
            "the 2 and 4 MiB remainders are too small: a new 20 MiB segment"
        );
    }

    /// A remainder of exactly 1 MiB stays with the block (large pool splits only above it).
    #[test]
    fn a_large_block_splits_only_above_one_mib() {
        let mut a = CachingAllocator::new();
        let s = a.malloc(12 * MIB);
        a.free(s);
        let t = a.malloc(11 * MIB);
        a.free(t);
        let _u = a.malloc(11 * MIB);
        let _v = a.malloc(MIB + 512);
        assert_eq!(
            a.reserved(),
            32 * MIB,
            "no 1 MiB piece left in the 12 MiB segment"
        );
    }
}
