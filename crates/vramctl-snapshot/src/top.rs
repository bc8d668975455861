//! Who holds the memory: live bytes (active blocks: allocated and pending free) grouped by
//! allocation stack, by the innermost frame of user code, or by its file. Torch-internal
//! frames are folded: a stack keeps the Python frames of user code (a `.py` file outside
//! the torch package) and shows the frames inside torch and C++ before them as `[torch]`,
//! so allocations made through different kernels from one line of user code group
//! together.

use std::collections::HashMap;

use serde::Serialize;

use crate::model::{Frame, Snapshot, StackId};

/// What `--by` groups on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    Stack,
    Frame,
    File,
}

#[derive(Debug, Clone, Serialize)]
pub struct TopRow {
    /// The group: a folded stack (innermost first, joined by " < "), a frame, or a file.
    pub key: String,
    pub bytes: u64,
    pub blocks: u64,
}

/// Label of blocks allocated before history recording was on (the file has no stack).
pub const NO_STACK: &str = "[no stack: allocated before recording started]";
/// Label of stacks without a user frame.
pub const NO_USER_FRAME: &str = "[torch: no Python frame of user code]";

/// Whether a frame's file is Python source: a `.py` file, or code Python names in angle
/// brackets — `<stdin>` (`python3 - <<EOF`), `<string>` (`python -c`, `exec`),
/// `<ipython-input-3-…>` (older notebooks; newer ones name a `.py` file). Torch's C++ frames
/// have `??` or a `.cpp`/`.h` file. Frozen standard-library modules (`<frozen runpy>`) are
/// Python but never the program's own code, so they do not count.
pub fn is_python_file(filename: &str) -> bool {
    filename.ends_with(".py")
        || (filename.starts_with('<')
            && filename.ends_with('>')
            && !filename.starts_with("<frozen "))
}

/// Whether a frame's file is Python code of the user's program: Python, not inside the torch
/// package (the allocation's line in the program, not the kernel torch called for it).
pub fn is_user_python_file(filename: &str) -> bool {
    is_python_file(filename) && !filename.contains("/torch/") && !filename.starts_with("torch/")
}

fn is_user_frame(f: &Frame) -> bool {
    is_user_python_file(&f.filename)
}

fn frame_label(f: &Frame) -> String {
    format!("{} ({}:{})", f.name, f.filename, f.line)
}

/// The folded stack of `stack`, innermost first: `[torch]` (when frames inside torch or
/// C++ come before the first user frame), then the user frames; or one label for a block
/// without a stack or without a user frame.
pub fn folded(snap: &Snapshot, stack: StackId) -> Vec<String> {
    let Some(ids) = snap.stacks.get(stack as usize).filter(|s| !s.is_empty()) else {
        return vec![NO_STACK.to_owned()];
    };
    let frames: Vec<&Frame> = ids
        .iter()
        .filter_map(|&i| snap.frames.get(i as usize))
        .collect();
    let Some(first_user) = frames.iter().position(|f| is_user_frame(f)) else {
        return vec![NO_USER_FRAME.to_owned()];
    };
    let mut parts = Vec::new();
    if first_user > 0 {
        parts.push("[torch]".to_owned());
    }
    parts.extend(
        frames[first_user..]
            .iter()
            .filter(|f| is_user_frame(f))
            .map(|f| frame_label(f)),
    );
    parts
}

fn key(snap: &Snapshot, stack: StackId, by: By) -> String {
    let parts = folded(snap, stack);
    match by {
        By::Stack => parts.join(" < "),
        // The innermost user frame (after `[torch]`), or the one label.
        By::Frame | By::File => {
            let Some(ids) = snap.stacks.get(stack as usize) else {
                return parts.join(" < ");
            };
            let user = ids
                .iter()
                .filter_map(|&i| snap.frames.get(i as usize))
                .find(|f| is_user_frame(f));
            match (user, by) {
                (Some(f), By::File) => f.filename.to_string(),
                (Some(f), _) => frame_label(f),
                (None, _) => parts.join(" < "),
            }
        }
    }
}

/// Live bytes and blocks (active blocks) per stack id, over all devices.
pub fn live_by_stack(snap: &Snapshot) -> HashMap<StackId, (u64, u64)> {
    let mut by_stack: HashMap<StackId, (u64, u64)> = HashMap::new();
    for s in &snap.segments {
        for b in s.blocks.iter().filter(|b| b.state.is_active()) {
            let e = by_stack.entry(b.stack).or_default();
            e.0 = e.0.saturating_add(b.size);
            e.1 += 1;
        }
    }
    by_stack
}

/// Live bytes and blocks per group of `by`.
pub fn live_by(snap: &Snapshot, by: By) -> HashMap<String, (u64, u64)> {
    let mut groups: HashMap<String, (u64, u64)> = HashMap::new();
    for (stack, (bytes, blocks)) in live_by_stack(snap) {
        let e = groups.entry(key(snap, stack, by)).or_default();
        e.0 = e.0.saturating_add(bytes);
        e.1 += blocks;
    }
    groups
}

/// The `n` groups holding the most live bytes, largest first (ties by key), and the total
/// over all groups (= Σ active block sizes).
pub fn top(snap: &Snapshot, by: By, n: usize) -> (Vec<TopRow>, u64) {
    let groups = live_by(snap, by);
    let total = groups.values().fold(0u64, |a, g| a.saturating_add(g.0));
    let mut rows: Vec<TopRow> = groups
        .into_iter()
        .map(|(key, (bytes, blocks))| TopRow { key, bytes, blocks })
        .collect();
    rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.key.cmp(&b.key)));
    rows.truncate(n);
    (rows, total)
}

/// A frame as a collapsed-stack field: `;` separates frames and a line ends the record,
/// so both are replaced (a Python file or function name may hold either).
fn collapsed_frame(label: &str) -> String {
    label.replace([';', '\n', '\r'], ",")
}

/// Collapsed-stack lines (`root;…;leaf bytes`, the format of Brendan Gregg's
/// `stackcollapse` scripts that flamegraph tools read): the folded stacks of `--top --by
/// stack`, root first (the outermost user frame, `[torch]` last), live bytes per stack,
/// sorted by stack. Their counts add up to Σ active block sizes.
pub fn collapsed(snap: &Snapshot) -> Vec<String> {
    let mut stacks: HashMap<String, u64> = HashMap::new();
    for (stack, (bytes, _)) in live_by_stack(snap) {
        let line = folded(snap, stack)
            .iter()
            .rev()
            .map(|f| collapsed_frame(f))
            .collect::<Vec<_>>()
            .join(";");
        let e = stacks.entry(line).or_default();
        *e = e.saturating_add(bytes);
    }
    let mut lines: Vec<(String, u64)> = stacks.into_iter().filter(|(_, b)| *b > 0).collect();
    lines.sort();
    lines
        .into_iter()
        .map(|(stack, bytes)| format!("{stack} {bytes}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::{Block, BlockState, Format, Pool, Segment};

    fn frame(filename: &str, line: i64, name: &str) -> Frame {
        Frame {
            filename: Arc::from(filename),
            line,
            name: Arc::from(name),
        }
    }

    /// Two blocks allocated from one line of user code through different torch paths; one
    /// allocated before recording.
    fn snapshot() -> Snapshot {
        let block = |size, stack| Block {
            address: 0,
            size,
            requested_size: Some(size),
            state: BlockState::ActiveAllocated,
            stack,
        };
        Snapshot {
            format: Format::SegmentsOnly,
            trace_stacks: crate::model::TraceStacks::Read,
            parallel_parts: 0,
            negative_sizes: 0,
            segments: vec![Segment {
                device: 0,
                address: 0,
                total_size: 7,
                allocated_size: 7,
                active_size: 7,
                requested_size: Some(7),
                stream: 0,
                pool: Pool::Small,
                pool_id: (0, 0),
                is_expandable: false,
                blocks: vec![block(1, 1), block(2, 2), block(4, 0)],
                stack: 0,
            }],
            device_traces: Vec::new(),
            allocator_settings: None,
            frames: vec![
                frame("??", 0, "at::empty"),
                frame(
                    "/usr/lib/python3/site-packages/torch/nn/modules/linear.py",
                    125,
                    "forward",
                ),
                frame("/home/u/train.py", 42, "step"),
                frame("/home/u/train.py", 80, "main"),
                frame("??", 0, "at::native::randn"),
            ],
            stacks: vec![vec![], vec![0, 1, 2, 3], vec![4, 0, 2, 3]],
        }
    }

    #[test]
    fn torch_frames_fold_so_one_user_line_is_one_group() {
        let (rows, total) = top(&snapshot(), By::Stack, 10);
        assert_eq!(total, 7);
        assert_eq!(rows[0].key, NO_STACK);
        assert_eq!(rows[0].bytes, 4);
        assert_eq!(
            rows[1].key,
            "[torch] < step (/home/u/train.py:42) < main (/home/u/train.py:80)"
        );
        assert_eq!((rows[1].bytes, rows[1].blocks), (3, 2));
        let (rows, _) = top(&snapshot(), By::File, 1);
        assert_eq!(rows.len(), 1);
        let (rows, _) = top(&snapshot(), By::Frame, 10);
        assert!(
            rows.iter()
                .any(|r| r.key == "step (/home/u/train.py:42)" && r.bytes == 3)
        );
    }

    #[test]
    fn code_from_stdin_a_string_or_a_notebook_cell_is_the_programs_own() {
        // leak35 on the H200 ran its workload as `python3 - <<PY`: every frame was `<stdin>`,
        // and the leak's site came out as "no Python frame of user code".
        for user in [
            "<stdin>",
            "<string>",
            "<ipython-input-3-5d1f2a>",
            "/tmp/ipykernel_7/1.py",
        ] {
            assert!(is_user_python_file(user), "{user}");
        }
        for not_user in [
            "??",
            "/pytorch/c10/cuda/CUDACachingAllocator.cpp",
            "<frozen runpy>",
            "/usr/lib/python3/site-packages/torch/nn/modules/linear.py",
            "torch/_tensor.py",
        ] {
            assert!(!is_user_python_file(not_user), "{not_user}");
        }
        let mut snap = snapshot();
        snap.frames[2] = frame("<stdin>", 42, "leaky_step");
        let (rows, _) = top(&snap, By::Frame, 10);
        assert!(
            rows.iter()
                .any(|r| r.key == "leaky_step (<stdin>:42)" && r.bytes == 3),
            "{rows:?}"
        );
    }

    #[test]
    fn collapsed_stacks_are_root_first_and_add_up_to_live_bytes() {
        let lines = collapsed(&snapshot());
        assert_eq!(
            lines,
            vec![
                format!("{NO_STACK} 4"),
                "main (/home/u/train.py:80);step (/home/u/train.py:42);[torch] 3".to_owned(),
            ]
        );
    }

    #[test]
    fn a_semicolon_in_a_frame_cannot_split_a_collapsed_stack() {
        let mut snap = snapshot();
        snap.frames[2].name = Arc::from("step;x\ny");
        let lines = collapsed(&snap);
        assert!(
            lines
                .iter()
                .any(|l| l.contains("step,x,y (/home/u/train.py:42);[torch] 3")),
            "{lines:?}"
        );
        assert!(lines.iter().all(|l| l.matches(';').count() <= 2));
    }
}
