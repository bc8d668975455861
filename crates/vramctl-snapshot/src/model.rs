//! Typed snapshot: segments, blocks, trace entries and allocator settings, read from the
//! pickle's plain values across torch versions (research-pytorch-memory.md §1.3, §1.5):
//! every field optional, unknown keys ignored, block addresses derived when missing,
//! legacy (≤ 2.0) `history[0]` as the block's requested size and frames, a top-level list
//! (`torch.cuda.memory_snapshot()`) as segments only.
//!
//! Stacks are interned: the snapshot shares one frame list between many blocks and trace
//! entries, so each distinct list becomes one [`StackId`] (by pointer first, then by
//! content), which keeps a GB-scale file small in memory.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::rc::Rc;

use serde::Serialize;

use crate::pickle::{self, Items, Limits, PickleError, TraceSink, Value};

/// Why a file is not a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("cannot open '{path}'")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Pickle(#[from] PickleError),
    #[error("not an allocator snapshot: {0}")]
    NotASnapshot(&'static str),
}

/// Index into [`Snapshot::stacks`]; 0 is the empty stack.
pub type StackId = u32;
/// Index into [`Snapshot::frames`].
pub type FrameId = u32;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Frame {
    pub filename: Rc<str>,
    pub line: i64,
    pub name: Rc<str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    ActiveAllocated,
    /// Freed by the program, not yet reusable (another stream, events).
    ActivePendingFree,
    Inactive,
    Unknown,
}

impl BlockState {
    pub fn is_active(self) -> bool {
        matches!(self, Self::ActiveAllocated | Self::ActivePendingFree)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    /// Bytes the caller asked for (2.1+; legacy: `history[0].real_size`).
    pub requested_size: Option<u64>,
    pub state: BlockState,
    pub stack: StackId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    /// ≤ 1 MiB allocations, 2 MiB segments.
    Small,
    Large,
    Unknown,
}

#[derive(Debug, Clone, Serialize)]
pub struct Segment {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    /// The file's value, else Σ sizes of `active_allocated` blocks.
    pub allocated_size: u64,
    /// The file's value, else Σ sizes of active blocks.
    pub active_size: u64,
    /// The file's value, else Σ `requested_size` of active blocks (None when unknown).
    pub requested_size: Option<u64>,
    pub stream: i64,
    pub pool: Pool,
    /// `segment_pool_id`: (0, 0) is the default pool; others are private (graphs, MemPool).
    pub pool_id: (i64, i64),
    pub is_expandable: bool,
    pub blocks: Vec<Block>,
    pub stack: StackId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    /// ≤ 2.0 files: one event for both.
    Free,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    Other(String),
}

impl Action {
    fn parse(s: &str) -> Self {
        match s {
            "alloc" => Self::Alloc,
            "free_requested" => Self::FreeRequested,
            "free_completed" => Self::FreeCompleted,
            "free" => Self::Free,
            "segment_alloc" => Self::SegmentAlloc,
            "segment_free" => Self::SegmentFree,
            "segment_map" => Self::SegmentMap,
            "segment_unmap" => Self::SegmentUnmap,
            "snapshot" => Self::Snapshot,
            "oom" => Self::Oom,
            other => Self::Other(other.to_owned()),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TraceEntry {
    pub action: Action,
    /// Absent for `oom`.
    pub addr: Option<u64>,
    pub size: u64,
    pub stream: i64,
    pub time_us: Option<i64>,
    /// `oom` only: free bytes cudaMemGetInfo reported.
    pub device_free: Option<u64>,
    pub stack: StackId,
}

/// `allocator_settings` (2.3+).
#[derive(Debug, Clone, Default, Serialize)]
pub struct AllocatorSettings {
    pub alloc_conf: Option<String>,
    /// None when unlimited (the file says -1).
    pub max_split_size_bytes: Option<u64>,
    pub garbage_collection_threshold: Option<f64>,
    pub expandable_segments: Option<bool>,
}

/// Which shape the file had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// `_dump_snapshot()` / `_snapshot()`: a dict with `segments` (and traces, settings).
    Snapshot,
    /// `torch.cuda.memory_snapshot()`: the list of segments alone.
    SegmentsOnly,
}

#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    pub format: Format,
    pub segments: Vec<Segment>,
    /// One list per device ordinal, oldest first.
    pub device_traces: Vec<Vec<TraceEntry>>,
    pub allocator_settings: Option<AllocatorSettings>,
    pub frames: Vec<Frame>,
    pub stacks: Vec<Vec<FrameId>>,
}

/// Opens a snapshot file (`.gz` or plain, told by its first bytes) and reads it streamed.
///
/// # Errors
/// The file cannot be opened or read, is not a pickle the reader accepts, or not a snapshot.
///
/// The file is read twice: a first pass over the opcodes finds which memo entries are
/// referenced again ([`pickle::scan_fetched`]), so that the second pass keeps only those,
/// and trace entries become [`TraceEntry`]s while they are read; the generic values of a
/// million-entry trace are then never all alive at once (docs/benchmarks.md, issue 17).
pub fn open(path: &Path, limits: Limits) -> Result<Snapshot, SnapshotError> {
    let fetched = pickle::scan_fetched(reader(path)?, limits)?;
    let mut sink = Streamed::default();
    let value = pickle::read_streaming(reader(path)?, limits, fetched, &mut sink)?;
    convert(&value, sink)
}

/// Reads a snapshot held in memory the way [`open`] reads a file: two passes, trace
/// entries streamed into the model.
///
/// # Errors
/// As [`open`].
pub fn from_slice(bytes: &[u8], limits: Limits) -> Result<Snapshot, SnapshotError> {
    let fetched = pickle::scan_fetched(bytes, limits)?;
    let mut sink = Streamed::default();
    let value = pickle::read_streaming(bytes, limits, fetched, &mut sink)?;
    convert(&value, sink)
}

/// The file, decompressed when it starts like a gzip stream.
fn reader(path: &Path) -> Result<Box<dyn BufRead>, SnapshotError> {
    let file = File::open(path).map_err(|source| SnapshotError::Open {
        path: path.display().to_string(),
        source,
    })?;
    let mut buffered = BufReader::with_capacity(1 << 16, file);
    let gz = buffered
        .fill_buf()
        .map_err(PickleError::Io)?
        .starts_with(&[0x1f, 0x8b]);
    Ok(if gz {
        let decoder = flate2::bufread::MultiGzDecoder::new(buffered);
        Box::new(BufReader::with_capacity(1 << 16, decoder))
    } else {
        Box::new(buffered)
    })
}

/// Trace entries taken from the pickle while it is read, by the per-device list they were
/// appended to (the list's `Rc` is kept so its address cannot be reused by another list).
struct Streamed {
    b: Builder,
    lists: HashMap<usize, (Rc<Items>, Vec<TraceEntry>)>,
}

impl Default for Streamed {
    fn default() -> Self {
        let mut b = Builder::default();
        // Stack 0 is the empty stack, before anything is interned.
        b.stacks.push(Vec::new());
        Self {
            b,
            lists: HashMap::new(),
        }
    }
}

impl TraceSink for Streamed {
    fn trace_items(&mut self, list: &Rc<Items>, items: Vec<Value>) {
        let ptr = Rc::as_ptr(list) as usize;
        let (_, entries) = self
            .lists
            .entry(ptr)
            .or_insert_with(|| (Rc::clone(list), Vec::new()));
        for e in &items {
            if let Some(entry) = self.b.trace_entry(e) {
                entries.push(entry);
            }
        }
    }
}

/// Reads a snapshot from any reader (plain pickle).
///
/// # Errors
/// As [`open`].
pub fn read<R: Read>(input: R, limits: Limits) -> Result<Snapshot, SnapshotError> {
    let value = pickle::read(BufReader::new(input), limits)?;
    from_value(&value)
}

/// Converts a pickle's values into a [`Snapshot`].
///
/// # Errors
/// [`SnapshotError::NotASnapshot`] when the top level is neither a dict with `segments`
/// nor a list of segment dicts.
pub fn from_value(top: &Value) -> Result<Snapshot, SnapshotError> {
    convert(top, Streamed::default())
}

/// [`from_value`] for a pickle whose trace entries may already be in `streamed`.
fn convert(top: &Value, streamed: Streamed) -> Result<Snapshot, SnapshotError> {
    let Streamed { mut b, lists } = streamed;
    let (format, segments_value) = match top {
        Value::Dict(_) => (
            Format::Snapshot,
            top.get("segments")
                .ok_or(SnapshotError::NotASnapshot("a dict without 'segments'"))?,
        ),
        Value::List(_) => (Format::SegmentsOnly, top.clone()),
        _ => {
            return Err(SnapshotError::NotASnapshot(
                "neither a dict nor a list of segments at the top",
            ));
        }
    };
    let seq = segments_value
        .as_seq()
        .ok_or(SnapshotError::NotASnapshot("'segments' is not a list"))?;
    let mut segments = Vec::with_capacity(seq.0.borrow().len());
    for s in seq.0.borrow().iter() {
        if s.as_dict().is_none() {
            return Err(SnapshotError::NotASnapshot("a segment that is not a dict"));
        }
        segments.push(b.segment(s));
    }
    let mut device_traces = Vec::new();
    if let Some(traces) = top.get("device_traces") {
        if let Some(per_device) = traces.as_seq() {
            for dev in per_device.0.borrow().iter() {
                let mut entries = Vec::new();
                if let Some(list) = dev.as_seq() {
                    // Entries the reader streamed come first: it streams only while the
                    // list has no items of its own.
                    if let Some((_, streamed)) = lists.get(&(Rc::as_ptr(list) as usize)) {
                        entries.extend(streamed.iter().cloned());
                    }
                    for e in list.0.borrow().iter() {
                        if let Some(entry) = b.trace_entry(e) {
                            entries.push(entry);
                        }
                    }
                }
                device_traces.push(entries);
            }
        }
    }
    let allocator_settings = top.get("allocator_settings").map(|s| AllocatorSettings {
        alloc_conf: s
            .get("PYTORCH_CUDA_ALLOC_CONF")
            .and_then(|v| v.as_str().map(|x| x.to_string())),
        max_split_size_bytes: s
            .get("max_split_size")
            .and_then(|v| v.as_int())
            .and_then(|v| u64::try_from(v).ok()),
        garbage_collection_threshold: s
            .get("garbage_collection_threshold")
            .and_then(|v| v.as_f64()),
        expandable_segments: s.get("expandable_segments").and_then(|v| v.as_bool()),
    });
    let (frames, stacks) = renumber(b, &mut segments, &mut device_traces);
    Ok(Snapshot {
        format,
        segments,
        device_traces,
        allocator_settings,
        frames,
        stacks,
    })
}

/// Numbers stacks and frames in the order of their first use by segments, blocks, then
/// trace entries — the order a reading of the whole tree gives — whatever order they were
/// interned in (streamed trace entries are interned before the segments are read), so
/// that the output does not depend on how the file was read.
fn renumber(
    b: Builder,
    segments: &mut [Segment],
    device_traces: &mut [Vec<TraceEntry>],
) -> (Vec<Frame>, Vec<Vec<FrameId>>) {
    let mut stack_map: Vec<Option<StackId>> = vec![None; b.stacks.len()];
    let mut frame_map: Vec<Option<FrameId>> = vec![None; b.frames.len()];
    let mut stacks: Vec<Vec<FrameId>> = vec![Vec::new()];
    let mut frames: Vec<Frame> = Vec::new();
    if let Some(slot) = stack_map.first_mut() {
        *slot = Some(0);
    }
    let mut map = |id: &mut StackId| {
        let old = *id as usize;
        if let Some(Some(new)) = stack_map.get(old) {
            *id = *new;
            return;
        }
        let new_frames: Vec<FrameId> = b.stacks[old]
            .iter()
            .map(|&f| {
                let f = f as usize;
                *frame_map[f].get_or_insert_with(|| {
                    frames.push(b.frames[f].clone());
                    u32::try_from(frames.len() - 1).unwrap_or(u32::MAX)
                })
            })
            .collect();
        let new = u32::try_from(stacks.len()).unwrap_or(u32::MAX);
        stacks.push(new_frames);
        stack_map[old] = Some(new);
        *id = new;
    };
    for s in segments.iter_mut() {
        for blk in &mut s.blocks {
            map(&mut blk.stack);
        }
        map(&mut s.stack);
    }
    for t in device_traces.iter_mut() {
        for e in t.iter_mut() {
            map(&mut e.stack);
        }
    }
    (frames, stacks)
}

fn uint(v: &Value, key: &str) -> Option<u64> {
    v.get(key)
        .and_then(|x| x.as_int())
        .and_then(|x| u64::try_from(x).ok())
}

fn int(v: &Value, key: &str) -> Option<i64> {
    v.get(key).and_then(|x| x.as_int())
}

/// A frame by the addresses of its filename and name strings, and its line.
type FramePtrKey = (usize, i64, usize);

#[derive(Default)]
struct Builder {
    frames: Vec<Frame>,
    stacks: Vec<Vec<FrameId>>,
    frame_ids: HashMap<Frame, FrameId>,
    /// By the addresses of a frame's two strings (kept alive here, so an address is never
    /// reused): the strings are memoized by Python's pickler, so most frames hit here
    /// without hashing their text.
    frame_by_ptr: HashMap<FramePtrKey, (FrameId, Rc<str>, Rc<str>)>,
    /// By the address of a frame list that someone else holds too (the memo, for a list
    /// the file refers to again); the `Rc` is kept so the address is never reused.
    stack_by_ptr: HashMap<usize, (StackId, Rc<Items>)>,
    stack_by_content: HashMap<Vec<FrameId>, StackId>,
}

impl Builder {
    fn stack(&mut self, frames: Option<Value>) -> StackId {
        let Some(list) = frames.as_ref().and_then(Value::as_seq) else {
            return 0;
        };
        let ptr = Rc::as_ptr(list) as usize;
        if let Some(&(id, _)) = self.stack_by_ptr.get(&ptr) {
            return id;
        }
        // `frames` is a clone taken from the parent dict, so 2 owners are the parent and
        // this call; a third (the memo, another block or entry) means the file refers to
        // the list again and the address is worth remembering.
        let shared = Rc::strong_count(list) > 2;
        let mut ids = Vec::new();
        for f in list.0.borrow().iter() {
            let given_filename = f.get("filename").and_then(|v| v.as_str().cloned());
            let given_name = f.get("name").and_then(|v| v.as_str().cloned());
            // Only frames with both strings in the file are looked up by address (a
            // fallback string is new each time and would only grow the table).
            let by_ptr = given_filename.is_some() && given_name.is_some();
            let filename = given_filename.unwrap_or_else(|| Rc::from("??"));
            let line = int(f, "line").unwrap_or(0);
            let name = given_name.unwrap_or_else(|| Rc::from("??"));
            let key = (
                Rc::as_ptr(&filename).cast::<u8>() as usize,
                line,
                Rc::as_ptr(&name).cast::<u8>() as usize,
            );
            if let Some(&(id, _, _)) = self.frame_by_ptr.get(&key) {
                ids.push(id);
                continue;
            }
            let frame = Frame {
                filename: Rc::clone(&filename),
                line,
                name: Rc::clone(&name),
            };
            let next = u32::try_from(self.frames.len()).unwrap_or(u32::MAX);
            let id = *self.frame_ids.entry(frame.clone()).or_insert_with(|| {
                self.frames.push(frame);
                next
            });
            if by_ptr {
                self.frame_by_ptr.insert(key, (id, filename, name));
            }
            ids.push(id);
        }
        let id = if ids.is_empty() {
            0
        } else {
            let next = u32::try_from(self.stacks.len()).unwrap_or(u32::MAX);
            match self.stack_by_content.get(&ids) {
                Some(&id) => id,
                None => {
                    self.stack_by_content.insert(ids.clone(), next);
                    self.stacks.push(ids);
                    next
                }
            }
        };
        if shared {
            self.stack_by_ptr.insert(ptr, (id, Rc::clone(list)));
        }
        id
    }

    fn segment(&mut self, s: &Value) -> Segment {
        let address = uint(s, "address").unwrap_or(0);
        let mut blocks = Vec::new();
        let mut offset = address;
        if let Some(list) = s.get("blocks").as_ref().and_then(Value::as_seq) {
            for bv in list.0.borrow().iter() {
                let size = uint(bv, "size").unwrap_or(0);
                let state = match bv.get("state").as_ref().and_then(Value::as_str) {
                    Some(s) if &**s == "active_allocated" => BlockState::ActiveAllocated,
                    Some(s) if &**s == "active_pending_free" || &**s == "active_awaiting_free" => {
                        BlockState::ActivePendingFree
                    }
                    Some(s) if &**s == "inactive" => BlockState::Inactive,
                    _ => BlockState::Unknown,
                };
                // ≤ 2.0: the first history entry holds what 2.1 put on the block.
                let legacy = bv
                    .get("history")
                    .and_then(|h| h.as_seq().and_then(|l| l.0.borrow().first().cloned()));
                let requested_size = uint(bv, "requested_size")
                    .or_else(|| legacy.as_ref().and_then(|h| uint(h, "real_size")));
                let frames = bv
                    .get("frames")
                    .or_else(|| legacy.as_ref().and_then(|h| h.get("frames")));
                let stack = self.stack(frames);
                blocks.push(Block {
                    address: uint(bv, "address").unwrap_or(offset),
                    size,
                    requested_size,
                    state,
                    stack,
                });
                offset = offset.saturating_add(size);
            }
        }
        let sum = |f: &dyn Fn(&Block) -> bool| -> u64 {
            blocks
                .iter()
                .filter(|b| f(b))
                .fold(0u64, |a, b| a.saturating_add(b.size))
        };
        let allocated_size = uint(s, "allocated_size")
            .unwrap_or_else(|| sum(&|b| b.state == BlockState::ActiveAllocated));
        let active_size = uint(s, "active_size").unwrap_or_else(|| sum(&|b| b.state.is_active()));
        let requested_size = uint(s, "requested_size").or_else(|| {
            blocks
                .iter()
                .filter(|b| b.state.is_active())
                .try_fold(0u64, |a, b| Some(a.saturating_add(b.requested_size?)))
        });
        let pool = match s.get("segment_type").as_ref().and_then(Value::as_str) {
            Some(t) if &**t == "small" => Pool::Small,
            Some(t) if &**t == "large" => Pool::Large,
            _ => Pool::Unknown,
        };
        let pool_id = s
            .get("segment_pool_id")
            .and_then(|p| {
                p.as_seq().map(|t| {
                    let t = t.0.borrow();
                    (
                        t.first().and_then(Value::as_int).unwrap_or(0),
                        t.get(1).and_then(Value::as_int).unwrap_or(0),
                    )
                })
            })
            .unwrap_or((0, 0));
        let stack = self.stack(s.get("frames"));
        Segment {
            device: int(s, "device").unwrap_or(0),
            address,
            total_size: uint(s, "total_size")
                .unwrap_or_else(|| blocks.iter().fold(0u64, |a, b| a.saturating_add(b.size))),
            allocated_size,
            active_size,
            requested_size,
            stream: int(s, "stream").unwrap_or(0),
            pool,
            pool_id,
            is_expandable: s
                .get("is_expandable")
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            blocks,
            stack,
        }
    }

    fn trace_entry(&mut self, e: &Value) -> Option<TraceEntry> {
        let action = Action::parse(e.get("action")?.as_str()?);
        Some(TraceEntry {
            action,
            addr: uint(e, "addr"),
            size: uint(e, "size").unwrap_or(0),
            stream: int(e, "stream").unwrap_or(0),
            time_us: int(e, "time_us"),
            device_free: uint(e, "device_free"),
            stack: self.stack(e.get("frames")),
        })
    }
}
