//! Snapshots made up in tests — this crate's, and other crates' with the `test-support`
//! feature — so that each test module does not spell out a segment of its own.

use std::sync::Arc;

use crate::model::{
    Block, BlockState, Format, Frame, FrameId, Pool, Segment, Snapshot, TraceStacks,
};

/// One segment of live blocks `(size, stack)` on device 0: stack `n ≥ 1` is the one frame
/// `frames[n - 1]` (`(file, line, function)`), stack 0 none (allocated before a recording).
pub fn live_blocks(blocks: &[(u64, u32)], frames: &[(&str, i64, &str)]) -> Snapshot {
    let frames: Vec<Frame> = frames
        .iter()
        .map(|&(file, line, name)| Frame {
            filename: Arc::from(file),
            line,
            name: Arc::from(name),
        })
        .collect();
    let stacks = std::iter::once(Vec::new())
        .chain((0..frames.len()).map(|i| vec![FrameId::try_from(i).unwrap_or(FrameId::MAX)]))
        .collect();
    Snapshot {
        format: Format::SegmentsOnly,
        trace_stacks: TraceStacks::Read,
        parallel_parts: 0,
        negative_sizes: 0,
        segments: vec![Segment {
            device: 0,
            address: 0,
            total_size: blocks.iter().map(|b| b.0).sum(),
            allocated_size: 0,
            active_size: 0,
            requested_size: None,
            stream: 0,
            pool: Pool::Large,
            pool_id: (0, 0),
            is_expandable: false,
            blocks: blocks
                .iter()
                .map(|&(size, stack)| Block {
                    address: 0,
                    size,
                    requested_size: Some(size),
                    state: BlockState::ActiveAllocated,
                    stack,
                })
                .collect(),
            stack: 0,
        }],
        device_traces: Vec::new(),
        allocator_settings: None,
        frames,
        stacks,
    }
}
