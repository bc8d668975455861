//! Reading a snapshot's trace on several threads.
//!
//! A 200 MB snapshot is a million trace entries, one after another in a few lists, and
//! decoding them is nearly all of the reading. Python's pickler (protocol 4 and 5) cuts
//! its output into FRAMEs of 64 KiB that begin on opcode boundaries, and writes a list
//! in batches of 1,000 items (`MARK … APPENDS`), so:
//!
//! 1. The main reading decodes the pickle as [`read`](super::read) does until a sink has
//!    taken its first batch of a streamed list (`device_traces[i]`); it hands off there.
//! 2. The FRAME headers, hopped over from the start, give opcode boundaries; the rest of
//!    the file is cut at some of them into one chunk per thread.
//! 3. Each chunk is walked (opcode lengths only, no values) on its own thread: how many
//!    memo entries it stores, and where its first batch of trace entries starts (`APPENDS
//!    MARK EMPTY_DICT MEMOIZE MARK BINGET(key)`, the key every entry starts with).
//! 4. Each part, from its chunk's first batch on, is decoded on its own thread by the
//!    same machine, standing on a stand-in list with the memo numbered from the count of
//!    everything before it. What it refers to but did not read is [`V::Elsewhere`]:
//!    scalars and the known strings of the memo as it stood at the handoff are taken as
//!    they are, anything else is left to resolve. It ends at the first batch that starts
//!    in the next chunk (or where the list ends).
//! 5. The main reading goes on, and when it stands exactly at a part's start, between two
//!    batches of the list it is streaming, with as many memo entries as the part counted,
//!    it takes the part in ([`SplitSink::absorb`]) and jumps to the part's end — chained
//!    through parts that end where the next begins. Anywhere else it reads on itself.
//!
//! So a part is used only where it is the reading of the same bytes from the same state:
//! its stand-in list and MARK are never popped (checked at its end), its memo indices are
//! checked against the main reading's, its limits are tighter by what the main reading's
//! stack and MARKs hold there, and a part that met anything else (an error, a GET of an
//! entry another part holds used as a container, a limit) is dropped and its bytes read by
//! the main reading. Values a part left [`V::Elsewhere`] are copied into the main arena
//! when something uses them, each container once, so shared references stay shared.

use std::io::Read;

use hashbrown::HashMap;

use super::{
    Arena, Document, Input, Interner, Limits, ListSink, Machine, Obj, ObjId, PickleError, Step,
    StrId, V, le_usize,
};

/// Stack length and MARK depth that a part leaves for the main reading it continues: a
/// part is taken in only where the main reading's stack and MARKs are within these, and
/// its own limits are lower by them, so a part never accepts what one reading refuses.
const STACK_RESERVE: usize = 64;
const DEPTH_RESERVE: usize = 16;
/// Bytes the walk wants in its buffer for one opcode's header (GLOBAL: two lines of 256).
const HEADER_BYTES: usize = 2 * 256 + 8;
/// The walk's buffer.
const WALK_BYTES: usize = 1 << 20;

/// Bytes a reading can take from any offset: a file (positioned reads) or a slice.
pub trait Source: Sync {
    fn size(&self) -> u64;
    /// Like [`std::os::unix::fs::FileExt::read_at`].
    ///
    /// # Errors
    /// The read failed.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize>;
}

impl Source for [u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.len());
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

impl Source for Vec<u8> {
    fn size(&self) -> u64 {
        self.as_slice().size()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.as_slice().read_at(buf, offset)
    }
}

/// A file and its size, taken once.
pub struct FileSource {
    file: std::fs::File,
    size: u64,
}

impl FileSource {
    /// # Errors
    /// The file's size cannot be read.
    pub fn new(file: std::fs::File) -> std::io::Result<Self> {
        let size = file.metadata()?.len();
        Ok(Self { file, size })
    }

    /// The file, for a reading in one pass after all.
    pub fn into_file(self) -> std::fs::File {
        self.file
    }
}

impl Source for FileSource {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(&self.file, buf, offset)
    }
}

/// A [`Read`] of `src` from `pos` to `end`.
struct At<'a> {
    src: &'a dyn Source,
    pos: u64,
    end: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let room = usize::try_from(self.end.saturating_sub(self.pos))
            .unwrap_or(usize::MAX)
            .min(buf.len());
        if room == 0 {
            return Ok(0);
        }
        let n = self.src.read_at(&mut buf[..room], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// `buf.len()` bytes of `src` at `offset`, fewer only at its end or on an error.
fn read_full(src: &dyn Source, buf: &mut [u8], offset: u64) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match src.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    got
}

/// How many threads a reading may use, and the least bytes worth a thread.
#[derive(Debug, Clone, Copy)]
pub struct Parallelism {
    pub threads: usize,
    pub min_chunk_bytes: u64,
}

impl Parallelism {
    /// This machine's cores, at most 16, and chunks of at least 4 MiB (a floor chosen, not
    /// tuned: a file of a few MiB is read in one pass).
    pub fn of_this_machine() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(16)),
            min_chunk_bytes: 4 << 20,
        }
    }
}

/// A [`ListSink`] whose work can be split: parts of a streamed list are taken by
/// [`SplitSink::Part`]s on other threads, then taken in, in order.
pub trait SplitSink: ListSink {
    type Part: ListSink + Send;
    /// A sink for one part, read on another thread. It meets [`V::Elsewhere`] values
    /// where the part refers to what it did not read.
    fn part(&self) -> Self::Part;
    /// The key (in the reader's interner, one of its known strings) that every item of a
    /// streamed list starts with: parts start at batches whose first item starts with it.
    fn first_key(&self) -> StrId;
    /// Takes in what `part` took, as if this sink had taken it from `list`, in order:
    /// `values` gives what the part left [`V::Elsewhere`], and the part's own values, as
    /// values of `arena` (the main reading's).
    ///
    /// # Errors
    /// What the sink refuses in what the part took (as [`ListSink::take`] would).
    fn absorb(
        &mut self,
        arena: &mut Arena,
        list: ObjId,
        part: Self::Part,
        values: &mut dyn PartValues,
    ) -> Result<(), PickleError>;
}

/// The values of a part being taken in ([`SplitSink::absorb`]).
pub trait PartValues {
    /// `v`, a value of the part or one it left [`V::Elsewhere`], as a value of the main
    /// reading's `arena`; containers are copied there once, so later uses share the copy.
    ///
    /// # Errors
    /// The value refers to a memo entry never stored (`at`: the byte the error names).
    fn in_main(&mut self, arena: &mut Arena, v: V, at: u64) -> Result<V, PickleError>;
    /// When memo entry `idx` is a list or tuple that another part made and the main
    /// reading has not copied, marks it taken in `role` where it is (or finds it taken in
    /// that role already): true. False for anything else, which the caller takes through
    /// [`PartValues::in_main`].
    fn take_list_in_place(&mut self, idx: u32, role: u8) -> bool;
}

/// Where a part of a parallel reading ends.
pub(super) struct PartView {
    /// The part ends at the first batch that starts at or after this byte.
    not_before: u64,
    /// Whether the last opcode closed a batch of the stand-in list.
    pub(super) between: bool,
}

/// The main reading's memo at the handoff (`outer`, its strings in `strings`) in the terms
/// of a part's arena: scalars as they are, strings interned there, containers (the part
/// must not change them) left [`V::Elsewhere`].
fn outer_memo(outer: &[V], strings: &Interner, arena: &mut Arena) -> Vec<V> {
    outer
        .iter()
        .enumerate()
        .map(|(idx, &v)| match v {
            V::Str(id) if id < strings.known => V::Str(id),
            V::Str(id) => V::Str(arena.strings.intern(strings.get(id))),
            V::None | V::Bool(_) | V::Int(_) | V::Float(_) | V::Callable(_) | V::Unset => v,
            _ => V::Elsewhere(u32::try_from(idx).unwrap_or(u32::MAX)),
        })
        .collect()
}

impl PartView {
    /// Called between two batches with the next opcode: whether the part ends before it
    /// (a batch that starts in the next chunk, or anything but a batch: the list's end).
    pub(super) fn ends_before(&mut self, op: u8, at: u64) -> bool {
        match op {
            0x95 => false,
            b'(' if at >= self.not_before => true,
            b'(' | b'}' => {
                self.between = false;
                false
            }
            _ => true,
        }
    }
}

/// The memo entries the main reading does not hold itself once it took parts in: the
/// parts', and its own from before each part (values of the main arena).
#[derive(Default)]
pub(super) struct Parts {
    /// In the order taken in: by memo index.
    list: Vec<PartData>,
    /// The main reading's memo before each run of parts, with its first index.
    main: Vec<(usize, Vec<V>)>,
    /// Entries stored over later (BINPUT of an earlier index), in the main arena's terms.
    overrides: HashMap<usize, V>,
    /// A part's container → its copy in the main arena.
    copies: HashMap<(u32, ObjId), ObjId>,
}

struct PartData {
    /// Memo index of `memo[0]`.
    base: usize,
    memo: Vec<V>,
    arena: Arena,
}

impl Parts {
    /// The part holding memo entry `idx`.
    fn owner(&self, idx: usize) -> Option<usize> {
        let i = self
            .list
            .partition_point(|p| p.base <= idx)
            .checked_sub(1)?;
        (idx < self.list[i].base + self.list[i].memo.len()).then_some(i)
    }

    /// Memo entry `idx`, below the main reading's own, as a value of the main `arena`.
    fn resolve(&mut self, arena: &mut Arena, idx: usize) -> Option<V> {
        if let Some(&v) = self.overrides.get(&idx) {
            return Some(v);
        }
        if let Some(p) = self.owner(idx) {
            let v = self.list[p].memo[idx - self.list[p].base];
            return self.in_main(arena, p, v);
        }
        let i = self.main.partition_point(|m| m.0 <= idx).checked_sub(1)?;
        let (base, memo) = &self.main[i];
        match memo.get(idx - base) {
            Some(V::Unset | V::Elsewhere(_)) | None => None,
            Some(&v) => Some(v),
        }
    }

    /// BINPUT of `idx`, below the main reading's own entries.
    pub(super) fn store_over(&mut self, idx: usize, v: V) {
        self.overrides.insert(idx, v);
    }

    /// Value `v` of part `p` as a value of the main `arena`.
    fn in_main(&mut self, arena: &mut Arena, p: usize, v: V) -> Option<V> {
        // Containers are copied from a work list, not by recursion: a part may hold lists
        // nested a million deep.
        let mut work = Vec::new();
        let top = self.shallow(arena, p, v, &mut work)?;
        while let Some((p, o, copy)) = work.pop() {
            let made = match self.list[p].arena.obj(o).clone() {
                Obj::List(items) => Obj::List(self.shallow_all(arena, p, items, &mut work)?),
                Obj::Tuple(items) => Obj::Tuple(self.shallow_all(arena, p, items, &mut work)?),
                Obj::Dict(pairs) => {
                    let mut out = Vec::with_capacity(pairs.len());
                    for (k, v) in pairs {
                        out.push((
                            self.shallow(arena, p, k, &mut work)?,
                            self.shallow(arena, p, v, &mut work)?,
                        ));
                    }
                    Obj::Dict(out)
                }
                taken @ Obj::Taken { .. } => taken,
            };
            arena.replace(copy, made);
        }
        Some(top)
    }

    fn shallow_all(
        &mut self,
        arena: &mut Arena,
        p: usize,
        items: Vec<V>,
        work: &mut Vec<(usize, ObjId, ObjId)>,
    ) -> Option<Vec<V>> {
        items
            .into_iter()
            .map(|v| self.shallow(arena, p, v, work))
            .collect()
    }

    /// `v` of part `p` in the main arena, a container as its copy (made empty and queued
    /// on `work` to be filled, the first time).
    fn shallow(
        &mut self,
        arena: &mut Arena,
        p: usize,
        v: V,
        work: &mut Vec<(usize, ObjId, ObjId)>,
    ) -> Option<V> {
        let key = |o: ObjId| (u32::try_from(p).unwrap_or(u32::MAX), o);
        Some(match v {
            V::List(o) | V::Tuple(o) | V::Dict(o) => {
                let copy = match self.copies.get(&key(o)) {
                    Some(&c) => c,
                    None => {
                        let c = arena.add(Obj::Tuple(Vec::new()));
                        self.copies.insert(key(o), c);
                        work.push((p, o, c));
                        c
                    }
                };
                match v {
                    V::List(_) => V::List(copy),
                    V::Tuple(_) => V::Tuple(copy),
                    _ => V::Dict(copy),
                }
            }
            V::Str(id) => {
                let strings = &self.list[p].arena.strings;
                if id < strings.known {
                    V::Str(id)
                } else {
                    V::Str(arena.strings.intern(strings.get(id)))
                }
            }
            V::Bytes(id) | V::BigInt(id) => {
                let raw = self.list[p].arena.bytes.get(id as usize)?.clone();
                let new = u32::try_from(arena.bytes.len()).unwrap_or(u32::MAX);
                arena.bytes.push(raw);
                if matches!(v, V::Bytes(_)) {
                    V::Bytes(new)
                } else {
                    V::BigInt(new)
                }
            }
            V::Elsewhere(i) => self.resolve(arena, i as usize)?,
            V::Unset => return None,
            V::None | V::Bool(_) | V::Int(_) | V::Float(_) | V::Callable(_) => v,
        })
    }

    fn take_list_in_place(&mut self, idx: usize, role: u8) -> bool {
        let Some(p) = self.owner(idx) else {
            return false;
        };
        match self.list[p].memo[idx - self.list[p].base] {
            V::List(o) | V::Tuple(o) => {
                if self
                    .copies
                    .contains_key(&(u32::try_from(p).unwrap_or(u32::MAX), o))
                {
                    return false;
                }
                let arena = &mut self.list[p].arena;
                match arena.obj(o) {
                    Obj::List(_) | Obj::Tuple(_) => {
                        let items = arena.replace(o, Obj::Taken { role, id: 0 });
                        arena.recycle(items);
                        true
                    }
                    Obj::Taken { role: r, .. } => *r == role,
                    Obj::Dict(_) => false,
                }
            }
            V::Elsewhere(j) => self.take_list_in_place(j as usize, role),
            _ => false,
        }
    }
}

/// [`PartValues`] of part `part`.
struct Resolver<'a> {
    parts: &'a mut Parts,
    part: usize,
}

impl PartValues for Resolver<'_> {
    fn in_main(&mut self, arena: &mut Arena, v: V, at: u64) -> Result<V, PickleError> {
        self.parts
            .in_main(arena, self.part, v)
            .ok_or(PickleError::Malformed {
                what: "a memo reference to an entry never stored",
                at,
            })
    }

    fn take_list_in_place(&mut self, idx: u32, role: u8) -> bool {
        self.parts.take_list_in_place(idx as usize, role)
    }
}

impl<S: ListSink + ?Sized> Machine<'_, S> {
    /// Memo entry `idx`, below the main reading's own: the value, in the main arena.
    pub(super) fn resolve_elsewhere(&mut self, idx: u32, at: u64) -> Result<V, PickleError> {
        self.parts
            .as_deref_mut()
            .and_then(|parts| parts.resolve(&mut self.arena, idx as usize))
            .ok_or(PickleError::Malformed {
                what: "a memo reference to an entry never stored",
                at,
            })
    }

    /// The list on top of the stack when the reading stands between two of its batches
    /// and a sink takes them.
    fn streamed_list_here(&self) -> Option<ObjId> {
        let key = self.stream_key?;
        let V::List(o) = *self.stack.last()? else {
            return None;
        };
        (self.sink.is_some()
            && matches!(self.arena.obj(o), Obj::List(l) if l.is_empty())
            && self.in_streamed_list(key, self.stack.len()))
        .then_some(o)
    }
}

/// Reads one pickle from `src` as [`read`](super::read) does, with streamed lists decoded
/// on `par.threads` threads where the file allows (module doc); the same [`Document`], and
/// the same items taken by `sink`, in the same order.
///
/// # Errors
/// As [`read`](super::read); a part read in parallel that fails is read again by the main
/// reading, so the errors are those of one reading, but for what [`SplitSink::absorb`]
/// refuses (then the first such part's error).
pub fn read_parallel<S: SplitSink>(
    src: &dyn Source,
    limits: Limits,
    strings: Interner,
    sink: &mut S,
    par: Parallelism,
) -> Result<Document, PickleError> {
    let size = src.size();
    let mut m: Machine<'_, S> = Machine::new(limits, strings, Some(sink));
    m.handoff_armed = par.threads > 1
        && size <= limits.max_total_bytes
        && limits.max_depth > 2 * DEPTH_RESERVE
        && limits.max_container_len > 2 * STACK_RESERVE;
    let mut plan: Option<Plan<S::Part>> = None;
    let mut at = 0;
    let mut limit = None;
    loop {
        let mut input = Input::starting_at(
            At {
                src,
                pos: at,
                end: limit.unwrap_or(size),
            },
            at,
            limits.max_total_bytes,
            limit.is_some(),
        );
        let step = m.run::<_, false>(&mut input)?;
        at = input.offset();
        match step {
            Step::Stop(top) => {
                return Ok(Document {
                    top,
                    parts: m.parts.as_ref().map_or(0, |p| p.list.len()),
                    arena: m.arena,
                });
            }
            Step::Handoff => plan = Plan::read(src, &m, at, par, limits),
            Step::Paused => {
                if let Some(plan) = &mut plan
                    && let Some(end) = plan.take_in(&mut m, at)?
                {
                    at = end;
                }
            }
            // Only a part stops at a boundary.
            Step::Boundary => return Err(super::stopped_early(at)),
        }
        limit = plan.as_mut().and_then(|p| p.next_start(at));
    }
}

/// The FRAME headers' offsets, hopped over from the start (empty for protocols 2 and 3,
/// which have none; the hop ends at anything that is not a FRAME).
fn frame_starts(src: &dyn Source) -> Vec<u64> {
    let size = src.size();
    let mut h = [0u8; 9];
    if read_full(src, &mut h[..2], 0) < 2 || h[0] != 0x80 || h[1] < 4 {
        return Vec::new();
    }
    let mut starts = Vec::new();
    let mut pos = 2u64;
    while pos < size && read_full(src, &mut h, pos) == 9 && h[0] == 0x95 {
        starts.push(pos);
        let n = u64::from_le_bytes([h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]]);
        match pos.checked_add(9).and_then(|p| p.checked_add(n)) {
            Some(next) => pos = next,
            None => break,
        }
    }
    starts
}

/// The length of the opcode at the start of `b`, from its header alone (None: unknown,
/// or its header is not all in `b`).
fn op_len(b: &[u8]) -> Option<usize> {
    let arg = |w: usize| b.get(1..1 + w).map(le_usize);
    Some(match *b.first()? {
        b'}' | b']' | b')' | b'(' | b'e' | b'a' | b'u' | b's' | b'd' | b'l' | b't' | 0x85
        | 0x86 | 0x87 | b'N' | 0x88 | 0x89 | b'.' | b'0' | b'1' | b'2' | 0x93 | b'R' | 0x94 => 1,
        b'h' | b'q' | b'K' | 0x80 => 2,
        b'M' => 3,
        b'j' | b'r' | b'J' => 5,
        b'G' | 0x95 => 9,
        0x8a | 0x8c | b'C' => 2usize.checked_add(arg(1)?)?,
        0x8b | b'X' | b'B' => 5usize.checked_add(arg(4)?)?,
        0x8d | 0x8e => 9usize.checked_add(arg(8)?)?,
        b'c' => {
            let rest = b.get(1..)?;
            let m = rest.iter().position(|&c| c == b'\n')?;
            let n = rest.get(m + 1..)?.iter().position(|&c| c == b'\n')?;
            m + n + 3
        }
        _ => return None,
    })
}

/// The length of each opcode that has one length (0: any other, or unknown), as
/// [`op_len`] gives it; BINPUT and LONG_BINPUT are left out, the walk refuses them.
const FIXED_LEN: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut op = 0;
    while op < 256 {
        t[op] = match op as u8 {
            b'}' | b']' | b')' | b'(' | b'e' | b'a' | b'u' | b's' | b'd' | b'l' | b't' | 0x85
            | 0x86 | 0x87 | b'N' | 0x88 | 0x89 | b'.' | b'0' | b'1' | b'2' | 0x93 | b'R' | 0x94 => {
                1
            }
            b'h' | b'K' | 0x80 => 2,
            b'M' => 3,
            b'j' | b'J' => 5,
            b'G' | 0x95 => 9,
            _ => 0,
        };
        op += 1;
    }
    t
};

/// What walking a chunk found.
struct Walked {
    /// MEMOIZEs in the chunk.
    memoized: usize,
    /// The first batch of trace entries: its MARK's offset, and the MEMOIZEs before it.
    start: Option<(u64, usize)>,
}

/// Walks the opcodes of `[from, to)` by their lengths (None: an opcode unknown, or one
/// that crosses `to`, or a memo index given explicitly (BINPUT), which would make the
/// counts of MEMOIZEs not the memo's length). `key` is the memo index of the string each
/// trace entry starts with; once the first batch is found, the walk only counts.
fn walk(src: &dyn Source, from: u64, to: u64, key: Option<usize>) -> Option<Walked> {
    let mut buf = vec![0u8; WALK_BYTES];
    let mut pos = from;
    let mut memoized = 0usize;
    let mut start = None;
    let mut finding = key.is_some();
    // How much of `APPENDS MARK EMPTY_DICT MEMOIZE MARK BINGET(key)` was just seen.
    let (mut seen, mut candidate) = (0u8, (0u64, 0usize));
    while pos < to {
        let want = usize::try_from(to - pos)
            .unwrap_or(usize::MAX)
            .min(WALK_BYTES);
        let filled = read_full(src, &mut buf[..want], pos);
        if filled == 0 {
            return None;
        }
        let b = &buf[..filled];
        // Opcodes whose header lies wholly in the buffer are walked from it.
        let safe = if pos + filled as u64 == to {
            filled
        } else {
            filled - HEADER_BYTES.min(filled)
        };
        let mut i = 0usize;
        while i < safe && finding {
            let op = b[i];
            let len = op_len(&b[i..])?;
            seen = match op {
                0x95 => seen,
                b'e' => 1,
                b'(' if seen == 1 => {
                    candidate = (pos + i as u64, memoized);
                    2
                }
                b'(' if seen == 4 => 5,
                b'}' if seen == 2 => 3,
                0x94 => {
                    memoized += 1;
                    if seen == 3 { 4 } else { 0 }
                }
                b'h' | b'j' if seen == 5 => {
                    let idx = if op == b'h' {
                        usize::from(b[i + 1])
                    } else {
                        le_usize(&b[i + 1..i + 5])
                    };
                    if Some(idx) == key {
                        start = Some(candidate);
                        finding = false;
                    }
                    0
                }
                b'q' | b'r' => return None,
                _ => 0,
            };
            i += len;
        }
        // The rest only counts MEMOIZEs: opcodes of one length by a table, the others by
        // their header.
        while i < safe {
            let op = b[i];
            memoized += usize::from(op == 0x94);
            i += match FIXED_LEN[usize::from(op)] {
                0 => match op {
                    0x8a | 0x8c => 2 + usize::from(*b.get(i + 1)?),
                    b'q' | b'r' => return None,
                    _ => op_len(&b[i..])?,
                },
                n => usize::from(n),
            };
        }
        if i == 0 {
            return None;
        }
        pos += i as u64;
    }
    (pos == to).then_some(Walked { memoized, start })
}

/// Runs each job on its own thread and gives their results in order (None for a job that
/// gave none, or panicked).
fn each_on_a_thread<T: Send, F: FnOnce() -> Option<T> + Send>(jobs: Vec<F>) -> Vec<Option<T>> {
    std::thread::scope(|s| {
        let threads: Vec<_> = jobs.into_iter().map(|job| s.spawn(job)).collect();
        threads
            .into_iter()
            .map(|t| t.join().ok().flatten())
            .collect()
    })
}

/// A chunk and the part read from it.
struct Chunk<P> {
    /// Where its first batch starts, and the memo index there.
    start: Option<(u64, usize)>,
    part: Option<PartRead<P>>,
}

/// A part as its thread read it.
struct PartRead<P> {
    /// Where it ended: the start of the next part, or the end of the list.
    end: u64,
    memo: Vec<V>,
    arena: Arena,
    sink: P,
}

struct Plan<P> {
    chunks: Vec<Chunk<P>>,
    /// The next chunk the main reading may take in.
    next: usize,
}

impl<P: ListSink + Send> Plan<P> {
    /// At the handoff (`at`, after the first batch of a streamed list), cuts the rest of
    /// the file into chunks and reads a part of each on its own thread; None when the file
    /// gives no place to cut.
    fn read<S: SplitSink<Part = P>>(
        src: &dyn Source,
        m: &Machine<'_, S>,
        at: u64,
        par: Parallelism,
        limits: Limits,
    ) -> Option<Self> {
        let sink = m.sink.as_deref()?;
        let key = m.memo.iter().position(|v| *v == V::Str(sink.first_key()))?;
        if m.memo_holes || m.memo_base != 0 {
            return None;
        }
        let size = src.size();
        let target = ((size - at) / par.threads as u64)
            .max(par.min_chunk_bytes)
            .max(1);
        let mut bounds = Vec::new();
        for f in frame_starts(src).into_iter().filter(|&f| f > at) {
            if bounds.last().is_none_or(|&b| f >= b + target) {
                bounds.push(f);
            }
        }
        if bounds.len() < 2 {
            return None;
        }
        let head = walk(src, at, bounds[0], None)?.memoized;
        let ends: Vec<u64> = bounds.iter().skip(1).copied().chain([size]).collect();
        let walked: Vec<Option<Walked>> = each_on_a_thread(
            bounds
                .iter()
                .zip(&ends)
                .map(|(&from, &to)| move || walk(src, from, to, Some(key)))
                .collect(),
        );
        // Memo indices are known up to the first chunk that could not be walked.
        let mut count = m.memo.len() + head;
        let mut chunks = Vec::new();
        let mut froms = Vec::new();
        for (w, &from) in walked.iter().zip(&bounds) {
            let Some(w) = w else { break };
            chunks.push(Chunk {
                start: w.start.map(|(s, before)| (s, count + before)),
                part: None,
            });
            froms.push(from);
            count += w.memoized;
        }
        // A part ends at the first batch that starts in the next chunk that has one.
        let mut not_before = vec![u64::MAX; chunks.len()];
        let mut next = u64::MAX;
        for (k, c) in chunks.iter().enumerate().rev() {
            not_before[k] = next;
            if c.start.is_some() {
                next = froms[k];
            }
        }
        let known = m.arena.strings.known();
        let (outer, strings) = (&m.memo[..], &m.arena.strings);
        let parts: Vec<Option<PartRead<P>>> = each_on_a_thread(
            chunks
                .iter()
                .zip(&not_before)
                .map(|(c, &not_before)| {
                    let (start, known, part) = (c.start, &known, sink.part());
                    move || {
                        let (from, base) = start?;
                        let outer = (outer, strings);
                        read_part(src, limits, known, outer, part, from, base, not_before)
                    }
                })
                .collect(),
        );
        for (c, p) in chunks.iter_mut().zip(parts) {
            c.part = p;
        }
        Some(Self { chunks, next: 0 })
    }

    /// Where the main reading should pause next, from `at` on: the next part's start.
    fn next_start(&mut self, at: u64) -> Option<u64> {
        while let Some(c) = self.chunks.get(self.next) {
            match c.start {
                Some((s, _)) if s >= at && c.part.is_some() => return Some(s),
                _ => self.next += 1,
            }
        }
        None
    }

    /// The main reading paused at `at`: when a part starts there and the reading stands as
    /// the part assumed, takes it in (and the parts chained to it) and gives where the
    /// reading goes on.
    fn take_in<S: SplitSink<Part = P>>(
        &mut self,
        m: &mut Machine<'_, S>,
        at: u64,
    ) -> Result<Option<u64>, PickleError> {
        // The reading paused at the limit `next_start` gave: elsewhere, an opcode crossed it.
        if self
            .chunks
            .get(self.next)
            .and_then(|c| c.start)
            .map(|(s, _)| s)
            != Some(at)
        {
            self.next += 1;
            return Ok(None);
        }
        let mut end = None;
        while let Some(c) = self.chunks.get_mut(self.next) {
            let Some((start, base)) = c.start else { break };
            if start != end.unwrap_or(at) {
                break;
            }
            let Some(part) = c.part.take() else { break };
            let here = m.streamed_list_here();
            let Some(list) = here.filter(|_| {
                !m.memo_holes
                    && m.memo_next() == base
                    && m.stack.len() <= STACK_RESERVE
                    && !m.marks.is_empty()
                    && m.marks.len() <= DEPTH_RESERVE
            }) else {
                break;
            };
            self.next += 1;
            let Machine {
                parts,
                memo,
                memo_base,
                outer_memo,
                arena,
                sink,
                ..
            } = &mut *m;
            let parts = parts.get_or_insert_with(Box::default);
            // The main reading's memo so far moves to `parts`; its own goes on after the part.
            let len = part.memo.len();
            if !memo.is_empty() {
                // The first entries (segments, the first batch: what the rest refers to
                // most) stay on the GET's fast path too.
                if *memo_base == 0 {
                    outer_memo.clone_from(memo);
                }
                parts.main.push((*memo_base, std::mem::take(memo)));
            }
            *memo_base = base + len;
            parts.list.push(PartData {
                base,
                memo: part.memo,
                arena: part.arena,
            });
            let p = parts.list.len() - 1;
            if let Some(sink) = sink.as_deref_mut() {
                let mut values = Resolver { parts, part: p };
                sink.absorb(arena, list, part.sink, &mut values)?;
            }
            end = Some(part.end);
        }
        // A part not taken in where it starts is not taken in later.
        if end.is_none() {
            self.next += 1;
        }
        Ok(end)
    }
}

/// Reads one part: from `from` (a batch's MARK) with memo index `base` there, until the
/// first batch at or after `not_before` or the end of the list; None when it cannot be
/// used (module doc).
#[allow(clippy::too_many_arguments)]
fn read_part<P: ListSink>(
    src: &dyn Source,
    limits: Limits,
    known: &[String],
    (outer, strings): (&[V], &Interner),
    mut sink: P,
    from: u64,
    base: usize,
    not_before: u64,
) -> Option<PartRead<P>> {
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    let (end, memo, arena) = {
        let mut m = Machine::new(limits, Interner::with_known(&known), Some(&mut sink));
        m.max_stack = limits.max_container_len - STACK_RESERVE;
        m.max_depth = limits.max_depth - DEPTH_RESERVE;
        let seed = m.arena.add(Obj::List(Vec::new()));
        m.seed = Some(seed);
        m.stack.push(V::List(seed));
        m.marks.push(0);
        m.memo_base = base;
        m.outer_memo = outer_memo(outer, strings, &mut m.arena);
        m.part = Some(PartView {
            not_before,
            between: true,
        });
        let mut input = Input::starting_at(
            At {
                src,
                pos: from,
                end: src.size(),
            },
            from,
            limits.max_total_bytes,
            false,
        );
        let step = m.run::<_, true>(&mut input).ok()?;
        let whole = matches!(step, Step::Boundary)
            && m.stack == [V::List(seed)]
            && m.marks == [0]
            && !m.memo_holes
            && !m.arena.touched_taken();
        if !whole {
            return None;
        }
        (input.offset(), m.memo, m.arena)
    };
    Some(PartRead {
        end,
        memo,
        arena,
        sink,
    })
}

/// `pickle` (protocol 4 or 5) with its FRAMEs redrawn every `frame_bytes` or so, as
/// Python's pickler draws them every 64 KiB: the same opcodes, so the same value. The
/// tests use small frames to read small files in many parts. None when an opcode is
/// unknown or cut.
pub fn reframe(pickle: &[u8], frame_bytes: usize) -> Option<Vec<u8>> {
    let (head, body) = (pickle.get(..2)?, pickle.get(2..)?);
    if head[0] != 0x80 || head[1] < 4 {
        return None;
    }
    let mut ops = Vec::with_capacity(body.len());
    let mut p = 0;
    while p < body.len() {
        let len = op_len(&body[p..])?;
        let op = body.get(p..p.checked_add(len)?)?;
        if op[0] != 0x95 {
            ops.extend_from_slice(op);
        }
        p += len;
    }
    let mut out = head.to_vec();
    let mut p = 0;
    while p < ops.len() {
        let mut end = p;
        while end < ops.len() && end - p < frame_bytes.max(1) {
            end += op_len(&ops[end..])?;
        }
        out.push(0x95);
        out.extend_from_slice(&((end - p) as u64).to_le_bytes());
        out.extend_from_slice(&ops[p..end]);
        p = end;
    }
    Some(out)
}
