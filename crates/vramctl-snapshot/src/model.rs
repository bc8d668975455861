//! Typed snapshot: segments, blocks, trace entries and allocator settings, read from the
//! pickle's plain values across torch versions (research-pytorch-memory.md §1.3, §1.5):
//! every field optional, unknown keys ignored, block addresses derived when missing,
//! legacy (≤ 2.0) `history[0]` as the block's requested size and frames, a top-level list
//! (`torch.cuda.memory_snapshot()`) as segments only.
//!
//! Stacks are interned: the snapshot shares frames and frame lists between many blocks and
//! trace entries, so each distinct frame becomes one [`FrameId`] and each distinct list one
//! [`StackId`], which keeps a GB-scale file small in memory.
//!
//! Reading is one pass: trace entries become [`TraceEntry`]s while the pickle is read
//! (the model is the reader's [`ListSink`] for `device_traces`), and the dicts and frame
//! lists they came from are freed there and then; segments, a few thousand values, are
//! converted once the pickle is read.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashMap;
use serde::Serialize;

use crate::pickle::{
    self, Arena, Document, FileSource, Interner, Limits, ListSink, Obj, ObjId, Parallelism,
    PartValues, PickleError, Source, SplitSink, StrId, V,
};

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
    pub filename: Arc<str>,
    pub line: i64,
    pub name: Arc<str>,
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

/// One device's trace entries, oldest first, kept as the lists the reading made them in:
/// a parallel reading's parts each make one, and joining a million entries into one list
/// would cost a copy and the page faults of its new memory (docs/benchmarks.md, issue 17).
#[derive(Debug, Clone, Default)]
pub struct Trace {
    chunks: Vec<Vec<TraceEntry>>,
    /// The index of each chunk's first entry.
    starts: Vec<usize>,
    len: usize,
}

impl Trace {
    /// No entries.
    pub const EMPTY: Self = Self {
        chunks: Vec::new(),
        starts: Vec::new(),
        len: 0,
    };

    /// The entries of `chunks`, in order.
    pub fn from_chunks(chunks: Vec<Vec<TraceEntry>>) -> Self {
        let chunks: Vec<Vec<TraceEntry>> = chunks.into_iter().filter(|c| !c.is_empty()).collect();
        let mut starts = Vec::with_capacity(chunks.len());
        let mut len = 0;
        for c in &chunks {
            starts.push(len);
            len += c.len();
        }
        Self {
            chunks,
            starts,
            len,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, i: usize) -> Option<&TraceEntry> {
        let c = self.starts.partition_point(|&s| s <= i).checked_sub(1)?;
        self.chunks[c].get(i - self.starts[c])
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &TraceEntry> + Clone {
        self.into_iter()
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut TraceEntry> {
        self.chunks.iter_mut().flatten()
    }
}

impl From<Vec<TraceEntry>> for Trace {
    fn from(entries: Vec<TraceEntry>) -> Self {
        Self::from_chunks(vec![entries])
    }
}

/// Entry `i`, as a slice's index: out of range is a bug of the caller and panics.
impl std::ops::Index<usize> for Trace {
    type Output = TraceEntry;

    fn index(&self, i: usize) -> &TraceEntry {
        match self.get(i) {
            Some(e) => e,
            None => panic!("trace entry {i} of {}", self.len),
        }
    }
}

impl<'a> IntoIterator for &'a Trace {
    type Item = &'a TraceEntry;
    type IntoIter = std::iter::Flatten<std::slice::Iter<'a, Vec<TraceEntry>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.chunks.iter().flatten()
    }
}

/// As the list of its entries.
impl Serialize for Trace {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
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

/// Whether a reading keeps the stacks of trace entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceStacks {
    /// Every trace entry with its stack (`snapshot timeline`, `--at`).
    #[default]
    Read,
    /// Trace entries with the empty stack (0), except those whose frame list a block or
    /// segment also holds: the summary, `--top`, flame graphs and `diff` use blocks' stacks
    /// only, and interning a million entries' frame lists is reading work none of them uses
    /// (docs/benchmarks.md, issue 17).
    Skip,
}

#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    pub format: Format,
    pub segments: Vec<Segment>,
    /// One list per device ordinal, oldest first.
    pub device_traces: Vec<Trace>,
    /// Whether the trace entries' stacks were read ([`TraceStacks::Skip`]: they are 0).
    #[serde(skip)]
    pub trace_stacks: TraceStacks,
    pub allocator_settings: Option<AllocatorSettings>,
    pub frames: Vec<Frame>,
    pub stacks: Vec<Vec<FrameId>>,
    /// How many parts of the trace were decoded on other threads ([`read_parallel`]).
    #[serde(skip)]
    pub parallel_parts: usize,
    /// Sizes of segments and blocks that the file gives as negative numbers (read as
    /// missing); the summary flags such a file as damaged (`summary::damage`).
    #[serde(skip)]
    pub negative_sizes: u64,
}

/// Opens a snapshot file (`.gz` or plain, told by its first bytes) and reads it in one
/// pass, trace entries typed while they are read.
///
/// # Errors
/// The file cannot be opened or read, is not a pickle the reader accepts, or not a snapshot.
pub fn open(path: &Path, limits: Limits) -> Result<Snapshot, SnapshotError> {
    open_with(path, limits, TraceStacks::Read)
}

/// [`open`], with the trace entries' stacks read or not.
///
/// # Errors
/// As [`open`].
pub fn open_with(
    path: &Path,
    limits: Limits,
    trace_stacks: TraceStacks,
) -> Result<Snapshot, SnapshotError> {
    let file = File::open(path).map_err(|source| SnapshotError::Open {
        path: path.display().to_string(),
        source,
    })?;
    // Without trace stacks, a plain file is read on this machine's cores (its trace is
    // nearly all of the work; `pickle/parallel.rs`). Pipes, `.gz` and a machine of one
    // core (nothing to split) are read in one pass.
    let par = Parallelism::of_this_machine();
    if trace_stacks == TraceStacks::Skip
        && par.threads > 1
        && file.metadata().is_ok_and(|m| m.is_file())
    {
        let src = FileSource::new(file).map_err(PickleError::Io)?;
        let mut magic = [0u8; 2];
        let n = src.read_at(&mut magic, 0).map_err(PickleError::Io)?;
        if magic[..n] != GZIP_MAGIC {
            return read_parallel(&src, limits, par);
        }
        return read_streamed(reader(src.into_file(), limits)?, limits, trace_stacks);
    }
    read_streamed(reader(file, limits)?, limits, trace_stacks)
}

/// Reads a snapshot the way [`open_with`] reads a plain file with [`TraceStacks::Skip`]:
/// the trace decoded on `par.threads` threads where the file allows it; the same snapshot
/// as [`read_streamed`] with [`TraceStacks::Skip`] gives.
///
/// # Errors
/// As [`open`].
pub fn read_parallel(
    src: &dyn Source,
    limits: Limits,
    par: Parallelism,
) -> Result<Snapshot, SnapshotError> {
    let mut b = Builder {
        trace_stacks: TraceStacks::Skip,
        ..Builder::default()
    };
    let doc = pickle::read_parallel(src, limits, Interner::with_known(KNOWN), &mut b, par)?;
    convert(doc, b)
}

/// Reads a snapshot held in memory the way [`open`] reads a file.
///
/// # Errors
/// As [`open`].
pub fn from_slice(bytes: &[u8], limits: Limits) -> Result<Snapshot, SnapshotError> {
    read_streamed(bytes, limits, TraceStacks::Read)
}

/// Reads a snapshot from any reader (plain pickle) the way [`open_with`] does.
///
/// # Errors
/// As [`open`].
pub fn read_streamed<R: Read>(
    input: R,
    limits: Limits,
    trace_stacks: TraceStacks,
) -> Result<Snapshot, SnapshotError> {
    let mut b = Builder {
        trace_stacks,
        ..Builder::default()
    };
    let doc = pickle::read(input, limits, Interner::with_known(KNOWN), Some(&mut b))?;
    convert(doc, b)
}

/// Reads the whole pickle as generic values first and converts it afterwards: the
/// reference the one-pass reading is checked against (the fuzz harness compares both).
///
/// # Errors
/// As [`open`].
pub fn read<R: Read>(input: R, limits: Limits) -> Result<Snapshot, SnapshotError> {
    let doc = pickle::read(input, limits, Interner::with_known(KNOWN), None)?;
    convert(doc, Builder::default())
}

/// The first bytes of a gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The file, decompressed when it starts like a gzip stream, no further than `limits`
/// allow ([`BoundedGz`]).
fn reader(file: File, limits: Limits) -> Result<Box<dyn Read>, SnapshotError> {
    // A regular file's size bounds what it may decompress to from the first byte; a pipe's
    // bound grows with what was read of it.
    let known_len = file
        .metadata()
        .ok()
        .filter(std::fs::Metadata::is_file)
        .map(|m| m.len());
    let consumed = Arc::new(AtomicU64::new(0));
    // Large reads pass a BufReader's buffer by; it is here to look at the first bytes.
    let mut buffered = BufReader::with_capacity(
        1 << 16,
        Counted {
            inner: file,
            consumed: Arc::clone(&consumed),
        },
    );
    let gz = buffered
        .fill_buf()
        .map_err(PickleError::Io)?
        .starts_with(&GZIP_MAGIC);
    Ok(if gz {
        Box::new(BoundedGz {
            inner: flate2::bufread::MultiGzDecoder::new(buffered),
            consumed,
            known_len,
            out_bytes: 0,
            limits,
        })
    } else {
        Box::new(buffered)
    })
}

/// A reader that counts the bytes read through it.
struct Counted<R> {
    inner: R,
    consumed: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.consumed.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A gzip stream decompressed no further than [`Limits::max_gzip_ratio`] times the
/// compressed bytes (the file's size, or what was read of a pipe) or
/// [`Limits::gzip_allowance_bytes`], whichever is more: a 2 MB gzip bomb would otherwise
/// make gigabytes of pickle (issue 29). [`Limits::max_total_bytes`] bounds it too (the
/// pickle reader counts the decompressed bytes). Each read asks for no more than the bound
/// leaves, so the decoder never writes past it.
struct BoundedGz<R: BufRead> {
    inner: flate2::bufread::MultiGzDecoder<R>,
    consumed: Arc<AtomicU64>,
    known_len: Option<u64>,
    out_bytes: u64,
    limits: Limits,
}

impl<R: BufRead> Read for BoundedGz<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let compressed_bytes = self
            .known_len
            .unwrap_or(0)
            .max(self.consumed.load(Ordering::Relaxed));
        let bound_bytes = compressed_bytes
            .saturating_mul(self.limits.max_gzip_ratio)
            .max(self.limits.gzip_allowance_bytes);
        // One byte past the bound is asked for, to tell a stream that ends exactly there
        // from one that goes on.
        let room = bound_bytes.saturating_sub(self.out_bytes).saturating_add(1);
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.out_bytes = self.out_bytes.saturating_add(n as u64);
        if self.out_bytes > bound_bytes {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "the gzip stream decompresses to more than {} ({} times its {} compressed, \
                     or {}): a gzip bomb or not a snapshot; refused (docs/snapshot.md, limits)",
                    crate::size_text::human(bound_bytes),
                    self.limits.max_gzip_ratio,
                    crate::size_text::human(compressed_bytes),
                    crate::size_text::human(self.limits.gzip_allowance_bytes),
                ),
            ));
        }
        Ok(n)
    }
}

/// Declares the strings the reader interns first (`KNOWN`, in order) and, for each, a
/// constant holding its id, which is its index: one list, so the two cannot drift apart.
macro_rules! known_strings {
    ($($name:ident = $text:literal,)*) => {
        const KNOWN: &[&str] = &[$($text),*];
        known_strings!(@ids 0, $($name,)*);
    };
    (@ids $n:expr, $name:ident, $($rest:ident,)*) => {
        const $name: StrId = $n;
        known_strings!(@ids $n + 1, $($rest,)*);
    };
    (@ids $n:expr,) => {};
}

known_strings! {
    UNKNOWN_NAME = "??",
    ACTION = "action",
    ADDR = "addr",
    SIZE = "size",
    STREAM = "stream",
    TIME_US = "time_us",
    DEVICE_FREE = "device_free",
    FRAMES = "frames",
    FILENAME = "filename",
    LINE = "line",
    NAME = "name",
    SEGMENTS = "segments",
    DEVICE_TRACES = "device_traces",
    ALLOCATOR_SETTINGS = "allocator_settings",
    BLOCKS = "blocks",
    HISTORY = "history",
    A_ALLOC = "alloc",
    A_FREE_REQUESTED = "free_requested",
    A_FREE_COMPLETED = "free_completed",
    A_FREE = "free",
    A_SEGMENT_ALLOC = "segment_alloc",
    A_SEGMENT_FREE = "segment_free",
    A_SEGMENT_MAP = "segment_map",
    A_SEGMENT_UNMAP = "segment_unmap",
    A_SNAPSHOT = "snapshot",
    A_OOM = "oom",
    REAL_SIZE = "real_size",
}

/// The roles in which the model takes a container from the reader ([`Obj::Taken`]).
const ROLE_ENTRY: u8 = 1;
const ROLE_FRAME: u8 = 2;
const ROLE_STACK: u8 = 3;
/// A trace entry's frame list freed without being read ([`TraceStacks::Skip`]).
const ROLE_STACK_SKIPPED: u8 = 4;
/// A segment dict, a segment's block list and a block dict, once converted: torch writes
/// each once, so a second reference to one is refused ([`SHARED`]) rather than read again.
const ROLE_SEGMENT: u8 = 5;
const ROLE_BLOCKS: u8 = 6;
const ROLE_BLOCK: u8 = 7;

/// Why a value cannot be read in the role the file puts it in a second time.
const REUSED: &str = "the pickle uses one of its segments, blocks, trace entries, frames or frame lists a second \
     time as something else (torch never writes that: the file was edited or is damaged)";

/// Why a segment, block list or block met a second time is refused: torch writes each once
/// (only frames and frame lists are shared), and reading one again for every reference
/// would let a few bytes of memo GETs stand for the same memory many times over — a 40 KB
/// file describing terabytes, at a cost that grows with the square of the file (issue 29).
const SHARED: &str = "the pickle refers to one segment, block list or block from two places \
     (torch writes each once: the file was edited or is damaged)";

fn action_of(arena: &Arena, id: StrId) -> Action {
    match id {
        A_ALLOC => Action::Alloc,
        A_FREE_REQUESTED => Action::FreeRequested,
        A_FREE_COMPLETED => Action::FreeCompleted,
        A_FREE => Action::Free,
        A_SEGMENT_ALLOC => Action::SegmentAlloc,
        A_SEGMENT_FREE => Action::SegmentFree,
        A_SEGMENT_MAP => Action::SegmentMap,
        A_SEGMENT_UNMAP => Action::SegmentUnmap,
        A_SNAPSHOT => Action::Snapshot,
        A_OOM => Action::Oom,
        other => Action::Other(arena.strings.get(other).to_string()),
    }
}

/// Converts what the reader made into a [`Snapshot`]; `b` holds the trace entries taken
/// while reading, if any.
fn convert(doc: Document, mut b: Builder) -> Result<Snapshot, SnapshotError> {
    let Document {
        mut arena,
        top,
        parts,
    } = doc;
    let arena = &mut arena;
    let (format, segments_value) = match top {
        V::Dict(_) => (
            Format::Snapshot,
            arena
                .get_id(top, SEGMENTS)
                .ok_or(SnapshotError::NotASnapshot("a dict without 'segments'"))?,
        ),
        V::List(_) => (Format::SegmentsOnly, top),
        _ => {
            return Err(SnapshotError::NotASnapshot(
                "neither a dict nor a list of segments at the top",
            ));
        }
    };
    let seq = arena
        .seq(segments_value)
        .ok_or(SnapshotError::NotASnapshot("'segments' is not a list"))?
        .to_vec();
    let mut segments = Vec::with_capacity(seq.len());
    for s in seq {
        if let V::Dict(o) = s
            && matches!(
                arena.obj(o),
                Obj::Taken {
                    role: ROLE_SEGMENT,
                    ..
                }
            )
        {
            return Err(SnapshotError::NotASnapshot(SHARED));
        }
        if arena.pairs(s).is_none() {
            return Err(SnapshotError::NotASnapshot("a segment that is not a dict"));
        }
        segments.push(b.segment(arena, s).map_err(SnapshotError::NotASnapshot)?);
        // Taken once read, so that a second reference to it is seen (and its pairs freed).
        if let V::Dict(o) = s {
            let pairs = arena.replace(
                o,
                Obj::Taken {
                    role: ROLE_SEGMENT,
                    id: 0,
                },
            );
            arena.recycle(pairs);
        }
    }
    let mut device_traces = Vec::new();
    if let Some(traces) = arena.get_id(top, DEVICE_TRACES)
        && let Some(per_device) = arena.seq(traces).map(<[V]>::to_vec)
    {
        for dev in per_device {
            let (V::List(o) | V::Tuple(o)) = dev else {
                device_traces.push(Trace::default());
                continue;
            };
            if matches!(arena.obj(o), Obj::Taken { .. }) {
                return Err(SnapshotError::NotASnapshot(REUSED));
            }
            // Entries the reader streamed come first: it streams only while the list has
            // no items of its own.
            let mut chunks = b.take_streamed(o);
            let mut entries = Vec::new();
            let items = arena.seq(dev).map(<[V]>::to_vec).unwrap_or_default();
            for e in items {
                match b
                    .trace_entry(arena, e)
                    .map_err(SnapshotError::NotASnapshot)?
                {
                    Entry::Typed(entry) => entries.push(entry),
                    Entry::Skipped => {}
                    // Only a part of a parallel reading meets values held elsewhere.
                    Entry::Deferred(_) => return Err(SnapshotError::NotASnapshot(ELSEWHERE)),
                }
            }
            chunks.push(entries);
            device_traces.push(Trace::from_chunks(chunks));
        }
    }
    let allocator_settings = arena
        .get_id(top, ALLOCATOR_SETTINGS)
        .map(|s| AllocatorSettings {
            alloc_conf: arena
                .get(s, "PYTORCH_CUDA_ALLOC_CONF")
                .and_then(|v| arena.str(v).map(|x| x.to_string())),
            max_split_size_bytes: arena
                .get(s, "max_split_size")
                .and_then(V::as_int)
                .and_then(|v| u64::try_from(v).ok()),
            garbage_collection_threshold: arena
                .get(s, "garbage_collection_threshold")
                .and_then(V::as_f64),
            expandable_segments: arena.get(s, "expandable_segments").and_then(V::as_bool),
        });
    // A container taken while reading (a trace entry, a frame, a frame list) that the file
    // also uses as something else was just read as missing: refuse rather than give a
    // snapshot that differs from the file.
    if arena.touched_taken() {
        return Err(SnapshotError::NotASnapshot(REUSED));
    }
    let (frames, stacks) = renumber(&b, &mut segments, &mut device_traces);
    Ok(Snapshot {
        format,
        segments,
        device_traces,
        trace_stacks: b.trace_stacks,
        allocator_settings,
        frames,
        stacks,
        parallel_parts: parts,
        negative_sizes: b.negative_sizes,
    })
}

/// Numbers stacks and frames in the order of their first use by segments, blocks, then
/// trace entries — the order a reading of the whole tree gives — whatever order they were
/// interned in (streamed trace entries are interned before the segments are read), so
/// that the output does not depend on how the file was read.
fn renumber(
    b: &Builder,
    segments: &mut [Segment],
    device_traces: &mut [Trace],
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

fn uint(v: Option<V>) -> Option<u64> {
    v.and_then(V::as_int).and_then(|x| u64::try_from(x).ok())
}

fn int(v: Option<V>) -> Option<i64> {
    v.and_then(V::as_int)
}

/// The model being built: frames and stacks interned by content, and the trace entries
/// taken while the pickle was read.
struct Builder {
    frames: Vec<Frame>,
    /// A frame by its filename, line and name (strings are interned: equal ids, equal text).
    frame_ids: HashMap<(StrId, i64, StrId), FrameId>,
    /// 0 is the empty stack.
    stacks: Vec<Box<[FrameId]>>,
    stack_ids: HashMap<Box<[FrameId]>, StackId>,
    /// A stack's frames while it is being looked up (no allocation when it is known).
    scratch: Vec<FrameId>,
    /// Trace entries taken from the per-device lists while reading, by list: the entries
    /// taken here, and the lists of the parts taken in, in order.
    streamed: Vec<(ObjId, Vec<Vec<TraceEntry>>)>,
    trace_stacks: TraceStacks,
    /// The containers made after the first streamed per-device list: what the trace made,
    /// which no block or segment (read before it) holds.
    first_trace_obj: Option<ObjId>,
    /// A part of a parallel reading: the entries whose key, action or number lies in
    /// another part, by position in the part's list (a placeholder there until
    /// [`SplitSink::absorb`]), with the APPENDS' byte and the entry's pairs.
    deferred: Vec<Deferred>,
    /// Frame lists another part holds, in the order first used; an entry that uses one
    /// has `stack = PENDING | its index here`.
    pending: Vec<Pending>,
    pending_ids: HashMap<u32, u32>,
    /// The position and byte of the entry being typed.
    position: u32,
    at: u64,
    /// Segment and block sizes the file gives as negative ([`Snapshot::negative_sizes`]).
    negative_sizes: u64,
}

/// A trace entry's stack that a part of a parallel reading left to resolve (module doc of
/// `pickle/parallel.rs`): the low bits index [`Builder::pending`].
const PENDING: StackId = 1 << 31;

/// Why a value held elsewhere was met where none can be.
const ELSEWHERE: &str = "a value of another part of a parallel reading where none can be";

/// A trace entry a part of a parallel reading could not type: its position in the part's
/// list, the byte of its APPENDS, and its pairs.
struct Deferred {
    position: u32,
    at: u64,
    pairs: Vec<(V, V)>,
}

/// A frame list a part of a parallel reading met in another part: its memo index, and
/// the position in the part's list and APPENDS' byte of the first entry that used it.
struct Pending {
    idx: u32,
    position: u32,
    at: u64,
}

/// What a trace entry's dict gives.
enum Entry {
    Typed(TraceEntry),
    /// No string `action`: not an entry (skipped, as torch's viewer does).
    Skipped,
    /// In a part of a parallel reading: the pairs, some of whose keys or values lie in
    /// another part.
    Deferred(Vec<(V, V)>),
}

impl TraceEntry {
    /// What stands in a part's list for an entry typed when it is taken in.
    fn placeholder() -> Self {
        Self {
            action: Action::Snapshot,
            addr: None,
            size: 0,
            stream: 0,
            time_us: None,
            device_free: None,
            stack: 0,
        }
    }
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            stacks: vec![Box::from([])],
            stack_ids: HashMap::new(),
            scratch: Vec::new(),
            streamed: Vec::new(),
            trace_stacks: TraceStacks::Read,
            first_trace_obj: None,
            deferred: Vec::new(),
            pending: Vec::new(),
            pending_ids: HashMap::new(),
            position: 0,
            at: 0,
            negative_sizes: 0,
        }
    }
}

impl ListSink for Builder {
    fn key(&self) -> StrId {
        DEVICE_TRACES
    }

    fn take(
        &mut self,
        arena: &mut Arena,
        list: ObjId,
        items: &[V],
        at: u64,
    ) -> Result<(), PickleError> {
        if self.first_trace_obj.is_none() {
            self.first_trace_obj = Some(list.saturating_add(1));
        }
        let slot = match self.streamed.iter().position(|(l, _)| *l == list) {
            Some(i) => i,
            None => {
                self.streamed.push((list, Vec::new()));
                self.streamed.len() - 1
            }
        };
        let chunks = &mut self.streamed[slot].1;
        if chunks.is_empty() {
            chunks.push(Vec::new());
        }
        let last = chunks.len() - 1;
        let mut entries = std::mem::take(&mut chunks[last]);
        entries.reserve(items.len());
        for &v in items {
            self.position = u32::try_from(entries.len()).unwrap_or(u32::MAX);
            self.at = at;
            match self.trace_entry(arena, v) {
                Ok(Entry::Typed(e)) => entries.push(e),
                Ok(Entry::Skipped) => {}
                Ok(Entry::Deferred(pairs)) => {
                    self.deferred.push(Deferred {
                        position: self.position,
                        at,
                        pairs,
                    });
                    entries.push(TraceEntry::placeholder());
                }
                Err(what) => return Err(PickleError::Malformed { what, at }),
            }
        }
        if let Some(last) = self.streamed[slot].1.last_mut() {
            *last = entries;
        }
        Ok(())
    }
}

impl SplitSink for Builder {
    type Part = Self;

    /// A builder for a part of the trace read on another thread: trace stacks skipped
    /// (only [`TraceStacks::Skip`] reads in parallel), everything it makes trace-made.
    fn part(&self) -> Self {
        Self {
            trace_stacks: TraceStacks::Skip,
            first_trace_obj: Some(0),
            ..Self::default()
        }
    }

    fn first_key(&self) -> StrId {
        ACTION
    }

    fn absorb(
        &mut self,
        arena: &mut Arena,
        list: ObjId,
        mut part: Self,
        values: &mut dyn PartValues,
    ) -> Result<(), PickleError> {
        let mut entries: Vec<TraceEntry> = part
            .streamed
            .pop()
            .map(|(_, mut chunks)| match chunks.len() {
                // A part's sink takes one list into one chunk: moved, not copied.
                1 => chunks.pop().unwrap_or_default(),
                _ => chunks.into_iter().flatten().collect(),
            })
            .unwrap_or_default();
        // What the part left to resolve, in the order of the entries that met it (so
        // frame lists are taken in the order one reading takes them).
        let mut stacks = vec![0; part.pending.len()];
        let mut dropped = Vec::new();
        let mut deferred = part.deferred.into_iter().peekable();
        let mut pending = part.pending.iter().enumerate().peekable();
        loop {
            let next_deferred = deferred.peek().map(|d| d.position);
            let next_pending = pending.peek().map(|(_, p)| p.position);
            match (next_deferred, next_pending) {
                (Some(d), p) if p.is_none_or(|p| d < p) => {
                    let Some(Deferred {
                        position: pos,
                        at,
                        pairs,
                    }) = deferred.next()
                    else {
                        break;
                    };
                    let mut main = Vec::with_capacity(pairs.len());
                    for (k, v) in pairs {
                        main.push((values.in_main(arena, k, at)?, values.in_main(arena, v, at)?));
                    }
                    let dict = arena.add_dict(main);
                    let typed = self
                        .trace_entry(arena, dict)
                        .map_err(|what| PickleError::Malformed { what, at })?;
                    match typed {
                        Entry::Typed(e) => entries[pos as usize] = e,
                        Entry::Skipped => dropped.push(pos as usize),
                        Entry::Deferred(_) => {
                            return Err(PickleError::Malformed {
                                what: ELSEWHERE,
                                at,
                            });
                        }
                    }
                }
                (_, Some(_)) => {
                    let Some((slot, &Pending { idx, at, .. })) = pending.next() else {
                        break;
                    };
                    stacks[slot] = if values.take_list_in_place(idx, ROLE_STACK_SKIPPED) {
                        0
                    } else {
                        let v = values.in_main(arena, V::Elsewhere(idx), at)?;
                        self.trace_stack(arena, Some(v))
                            .map_err(|what| PickleError::Malformed { what, at })?
                    };
                }
                _ => break,
            }
        }
        if !stacks.is_empty() {
            for e in &mut entries {
                if e.stack & PENDING != 0 {
                    e.stack = stacks[(e.stack & !PENDING) as usize];
                }
            }
        }
        if !dropped.is_empty() {
            // `dropped` is in order of position.
            let mut i = 0;
            entries.retain(|_| {
                i += 1;
                dropped.binary_search(&(i - 1)).is_err()
            });
        }
        // The part's list is kept as it is, a chunk of the device's trace; entries taken
        // here later go to a chunk after it.
        match self.streamed.iter_mut().find(|(l, _)| *l == list) {
            Some((_, chunks)) => chunks.extend([entries, Vec::new()]),
            None => self.streamed.push((list, vec![entries, Vec::new()])),
        }
        Ok(())
    }
}

impl Builder {
    fn take_streamed(&mut self, list: ObjId) -> Vec<Vec<TraceEntry>> {
        self.streamed
            .iter_mut()
            .find(|(l, _)| *l == list)
            .map(|(_, e)| std::mem::take(e))
            .unwrap_or_default()
    }

    /// The frame of a frame dict (`??` for what the file leaves out); the dict is taken.
    fn frame(&mut self, arena: &mut Arena, v: V) -> Result<FrameId, &'static str> {
        let (mut filename, mut line, mut name) = (None, None, None);
        if let V::Dict(o) = v {
            match arena.obj(o) {
                Obj::Taken {
                    role: ROLE_FRAME,
                    id,
                } => return Ok(*id),
                Obj::Dict(pairs) => {
                    // A later key wins, as in Python.
                    for &(k, val) in pairs {
                        match k {
                            V::Str(FILENAME) => filename = Some(val),
                            V::Str(LINE) => line = Some(val),
                            V::Str(NAME) => name = Some(val),
                            _ => {}
                        }
                    }
                }
                _ => return Err(REUSED),
            }
        }
        let text = |s: Option<V>| match s {
            Some(V::Str(id)) => id,
            _ => UNKNOWN_NAME,
        };
        let key = (text(filename), int(line).unwrap_or(0), text(name));
        let next = FrameId::try_from(self.frames.len()).unwrap_or(FrameId::MAX);
        let id = *self.frame_ids.entry(key).or_insert_with(|| {
            self.frames.push(Frame {
                filename: Arc::clone(arena.strings.get(key.0)),
                line: key.1,
                name: Arc::clone(arena.strings.get(key.2)),
            });
            next
        });
        if let V::Dict(o) = v {
            arena.replace(
                o,
                Obj::Taken {
                    role: ROLE_FRAME,
                    id,
                },
            );
        }
        Ok(id)
    }

    /// The stack of a frame list (0, the empty stack, for anything but a list or tuple);
    /// the list is taken, so a file that refers to it again gets the id without a lookup.
    fn stack(&mut self, arena: &mut Arena, frames: Option<V>) -> Result<StackId, &'static str> {
        let Some(V::List(o) | V::Tuple(o)) = frames else {
            return Ok(0);
        };
        let items = match arena.replace(
            o,
            Obj::Taken {
                role: ROLE_STACK,
                id: 0,
            },
        ) {
            Obj::List(items) | Obj::Tuple(items) => items,
            taken @ Obj::Taken {
                role: ROLE_STACK, ..
            } => {
                let Obj::Taken { id, .. } = taken else {
                    return Ok(0);
                };
                arena.replace(o, taken);
                return Ok(id);
            }
            other => {
                arena.replace(o, other);
                return Err(REUSED);
            }
        };
        let id = self.intern_stack(arena, o, &items);
        arena.recycle(Obj::List(items));
        id
    }

    /// A trace entry's stack: with [`TraceStacks::Skip`], a frame list the trace made is
    /// freed unread (the empty stack); one that a block or segment holds too is read.
    fn trace_stack(
        &mut self,
        arena: &mut Arena,
        frames: Option<V>,
    ) -> Result<StackId, &'static str> {
        if let Some(V::Elsewhere(idx)) = frames {
            // A part of a parallel reading: resolved when the part is taken in.
            let next = u32::try_from(self.pending.len()).unwrap_or(u32::MAX);
            let slot = *self.pending_ids.entry(idx).or_insert_with(|| {
                self.pending.push(Pending {
                    idx,
                    position: self.position,
                    at: self.at,
                });
                next
            });
            return Ok(PENDING | slot);
        }
        if self.trace_stacks == TraceStacks::Skip
            && let Some(V::List(o) | V::Tuple(o)) = frames
            && self.first_trace_obj.is_some_and(|first| o >= first)
        {
            match arena.obj(o) {
                Obj::List(_) | Obj::Tuple(_) => {
                    let items = arena.replace(
                        o,
                        Obj::Taken {
                            role: ROLE_STACK_SKIPPED,
                            id: 0,
                        },
                    );
                    arena.recycle(items);
                    return Ok(0);
                }
                Obj::Taken {
                    role: ROLE_STACK_SKIPPED,
                    ..
                } => return Ok(0),
                _ => {}
            }
        }
        self.stack(arena, frames)
    }

    /// Interns the frames of list `o` (taken, its items given) and marks it read.
    fn intern_stack(
        &mut self,
        arena: &mut Arena,
        o: ObjId,
        items: &[V],
    ) -> Result<StackId, &'static str> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        for &f in items {
            // Most frames of a real file are dicts already read (torch caches its frame
            // dicts, the pickler refers to them again): their id without a call.
            if let V::Dict(d) = f
                && let Obj::Taken {
                    role: ROLE_FRAME,
                    id,
                } = arena.obj(d)
            {
                scratch.push(*id);
                continue;
            }
            match self.frame(arena, f) {
                Ok(id) => scratch.push(id),
                Err(e) => {
                    self.scratch = scratch;
                    return Err(e);
                }
            }
        }
        let id = if scratch.is_empty() {
            0
        } else if let Some(&id) = self.stack_ids.get(&scratch[..]) {
            id
        } else {
            let id = StackId::try_from(self.stacks.len()).unwrap_or(StackId::MAX);
            let frames: Box<[FrameId]> = Box::from(&scratch[..]);
            self.stacks.push(frames.clone());
            self.stack_ids.insert(frames, id);
            id
        };
        self.scratch = scratch;
        arena.replace(
            o,
            Obj::Taken {
                role: ROLE_STACK,
                id,
            },
        );
        Ok(id)
    }

    /// A size: a non-negative integer; a negative one is counted (a damaged file) and read
    /// as missing.
    fn size(&mut self, v: Option<V>) -> Option<u64> {
        let i = v.and_then(V::as_int)?;
        let size = u64::try_from(i).ok();
        if size.is_none() {
            self.negative_sizes += 1;
        }
        size
    }

    fn segment(&mut self, arena: &mut Arena, s: V) -> Result<Segment, &'static str> {
        let address = uint(arena.get(s, "address")).unwrap_or(0);
        let mut blocks = Vec::new();
        let mut offset = address;
        // The block list and each block are taken as they are read (a second reference
        // to one is an error, not a second reading of it: [`SHARED`]).
        let block_values = match arena.get_id(s, BLOCKS) {
            Some(V::List(l) | V::Tuple(l)) => match arena.replace(
                l,
                Obj::Taken {
                    role: ROLE_BLOCKS,
                    id: 0,
                },
            ) {
                Obj::List(items) | Obj::Tuple(items) => items,
                taken @ Obj::Taken {
                    role: ROLE_BLOCKS, ..
                } => {
                    arena.replace(l, taken);
                    return Err(SHARED);
                }
                other => {
                    arena.replace(l, other);
                    return Err(REUSED);
                }
            },
            _ => Vec::new(),
        };
        for &bv in &block_values {
            if let V::Dict(o) = bv {
                match arena.obj(o) {
                    Obj::Dict(_) => {}
                    Obj::Taken {
                        role: ROLE_BLOCK, ..
                    } => return Err(SHARED),
                    _ => return Err(REUSED),
                }
            }
            let size = self.size(arena.get_id(bv, SIZE)).unwrap_or(0);
            let state = match arena.get(bv, "state").and_then(|v| arena.str(v)) {
                Some(s) if &**s == "active_allocated" => BlockState::ActiveAllocated,
                Some(s) if &**s == "active_pending_free" || &**s == "active_awaiting_free" => {
                    BlockState::ActivePendingFree
                }
                Some(s) if &**s == "inactive" => BlockState::Inactive,
                _ => BlockState::Unknown,
            };
            // ≤ 2.0: the first history entry holds what 2.1 put on the block.
            let legacy = arena
                .get_id(bv, HISTORY)
                .and_then(|h| arena.seq(h).and_then(|l| l.first().copied()));
            let requested_size = self
                .size(arena.get(bv, "requested_size"))
                .or_else(|| legacy.and_then(|h| uint(arena.get_id(h, REAL_SIZE))));
            let frames = arena
                .get_id(bv, FRAMES)
                .or_else(|| legacy.and_then(|h| arena.get_id(h, FRAMES)));
            let address = uint(arena.get(bv, "address")).unwrap_or(offset);
            let stack = self.stack(arena, frames)?;
            blocks.push(Block {
                address,
                size,
                requested_size,
                state,
                stack,
            });
            offset = offset.saturating_add(size);
            if let V::Dict(o) = bv {
                let pairs = arena.replace(
                    o,
                    Obj::Taken {
                        role: ROLE_BLOCK,
                        id: 0,
                    },
                );
                arena.recycle(pairs);
            }
        }
        arena.recycle(Obj::List(block_values));
        let sum = |f: &dyn Fn(&Block) -> bool| -> u64 {
            blocks
                .iter()
                .filter(|b| f(b))
                .fold(0u64, |a, b| a.saturating_add(b.size))
        };
        let allocated_size = self
            .size(arena.get(s, "allocated_size"))
            .unwrap_or_else(|| sum(&|b| b.state == BlockState::ActiveAllocated));
        let active_size = self
            .size(arena.get(s, "active_size"))
            .unwrap_or_else(|| sum(&|b| b.state.is_active()));
        let requested_size = self.size(arena.get(s, "requested_size")).or_else(|| {
            blocks
                .iter()
                .filter(|b| b.state.is_active())
                .try_fold(0u64, |a, b| Some(a.saturating_add(b.requested_size?)))
        });
        let pool = match arena.get(s, "segment_type").and_then(|v| arena.str(v)) {
            Some(t) if &**t == "small" => Pool::Small,
            Some(t) if &**t == "large" => Pool::Large,
            _ => Pool::Unknown,
        };
        let pool_id = arena
            .get(s, "segment_pool_id")
            .and_then(|p| {
                arena.seq(p).map(|t| {
                    (
                        t.first().and_then(|v| v.as_int()).unwrap_or(0),
                        t.get(1).and_then(|v| v.as_int()).unwrap_or(0),
                    )
                })
            })
            .unwrap_or((0, 0));
        let total_size = self
            .size(arena.get(s, "total_size"))
            .unwrap_or_else(|| blocks.iter().fold(0u64, |a, b| a.saturating_add(b.size)));
        let device = int(arena.get(s, "device")).unwrap_or(0);
        let stream = int(arena.get_id(s, STREAM)).unwrap_or(0);
        let is_expandable = arena
            .get(s, "is_expandable")
            .and_then(V::as_bool)
            .unwrap_or(false);
        let frames = arena.get_id(s, FRAMES);
        let stack = self.stack(arena, frames)?;
        Ok(Segment {
            device,
            address,
            total_size,
            allocated_size,
            active_size,
            requested_size,
            stream,
            pool,
            pool_id,
            is_expandable,
            blocks,
            stack,
        })
    }

    /// The entry of a trace entry dict (not one without a string `action`); the dict is
    /// taken and its pairs freed.
    fn trace_entry(&mut self, arena: &mut Arena, e: V) -> Result<Entry, &'static str> {
        let V::Dict(o) = e else {
            return Ok(Entry::Skipped);
        };
        let pairs = match arena.replace(
            o,
            Obj::Taken {
                role: ROLE_ENTRY,
                id: 0,
            },
        ) {
            Obj::Dict(pairs) => pairs,
            other => {
                arena.replace(o, other);
                return Err(REUSED);
            }
        };
        let (mut action, mut addr, mut size, mut stream, mut time_us, mut device_free, mut frames) =
            (None, None, None, None, None, None, None);
        let mut elsewhere = false;
        // A later key wins, as in Python.
        for &(k, v) in &pairs {
            match k {
                V::Elsewhere(_) => elsewhere = true,
                V::Str(ACTION) => action = Some(v),
                V::Str(ADDR) => addr = Some(v),
                V::Str(SIZE) => size = Some(v),
                V::Str(STREAM) => stream = Some(v),
                V::Str(TIME_US) => time_us = Some(v),
                V::Str(DEVICE_FREE) => device_free = Some(v),
                V::Str(FRAMES) => frames = Some(v),
                _ => {}
            }
        }
        let is_elsewhere = |v: Option<V>| matches!(v, Some(V::Elsewhere(_)));
        if elsewhere
            || [action, addr, size, stream, time_us, device_free]
                .into_iter()
                .any(is_elsewhere)
        {
            return Ok(Entry::Deferred(pairs));
        }
        arena.recycle(Obj::Dict(pairs));
        let Some(V::Str(action)) = action else {
            return Ok(Entry::Skipped);
        };
        Ok(Entry::Typed(TraceEntry {
            action: action_of(arena, action),
            addr: uint(addr),
            size: uint(size).unwrap_or(0),
            stream: int(stream).unwrap_or(0),
            time_us: int(time_us),
            device_free: uint(device_free),
            stack: self.trace_stack(arena, frames)?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interner gives the known strings their indices as ids (so the constants name
    /// them), which fails if a string were listed twice.
    #[test]
    fn known_ids_are_the_known_strings() {
        let i = Interner::with_known(KNOWN);
        for (id, s) in KNOWN.iter().enumerate() {
            assert_eq!(i.id_of(s), Some(StrId::try_from(id).expect("few")), "{s}");
        }
        assert_eq!((ACTION, A_OOM), (1, 25));
        assert_eq!(i.id_of("not known"), None);
    }
}
