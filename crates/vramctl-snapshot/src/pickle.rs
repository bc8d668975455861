//! A pickle reader made for allocator snapshots: the opcodes that Python's `pickle.dump`
//! (protocols 2–5) and the C++ TorchScript pickler write for plain data, with shared
//! references kept shared, and no code execution: the only globals accepted are a short
//! allow-list of constructors that build plain data (`collections.OrderedDict`, the
//! `torch.jit._pickle` list builders), handled here without importing anything.
//!
//! `serde-pickle` cannot read snapshots: Python memoizes every container and the snapshot
//! shares one frame list between many blocks and trace entries, which serde-pickle treats
//! as recursion (research-pytorch-memory.md §1.4).
//!
//! **How it is built for speed** (a 200 MB snapshot holds ~50 M opcodes): values are
//! 16-byte [`V`]s that are `Copy`; containers live in one [`Arena`] and are referred to by
//! index, so a memo GET is a copy of 16 bytes, never a reference count; strings are
//! interned once (keys and actions then compare as integers); the input is decoded from a
//! slice of a chunk buffer, refilled only when an opcode would cross its end. A
//! [`ListSink`] takes the items appended to the lists at `top[key][i]` while the pickle is
//! read (the model turns trace entries into typed ones there and frees their dicts), so a
//! million-entry trace never lives as generic values; what the sink took is frozen
//! ([`Obj::Taken`]): changing it later is an error, so what was read is what the file holds.
//! [`read_parallel`] decodes a streamed list's batches on several threads where a file's
//! FRAMEs allow it, with the same result (`pickle/parallel.rs`).
//!
//! Memory is bounded by the input: every opcode creates at most one value, a string's or
//! bytes' declared length allocates only as its bytes arrive, memo indices may not jump
//! ahead, and [`Limits`] bound the total size, lengths and MARK depth.

use std::io::Read;
use std::sync::Arc;

mod parallel;
pub use parallel::{
    FileSource, Parallelism, PartValues, Source, SplitSink, read_parallel, reframe,
};

use hashbrown::HashMap;

/// Bounds on what one pickle may make the reader do.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes read from the stream (after decompression).
    pub max_total_bytes: u64,
    /// Elements of one list, tuple or dict, and of the stack and memo.
    pub max_container_len: usize,
    /// Nesting depth of MARKs.
    pub max_depth: usize,
    /// A `.gz` file decompresses to at most this many times its own size ...
    pub max_gzip_ratio: u64,
    /// ... or to this many bytes, whichever is more (a small file of a real snapshot may
    /// compress better than the ratio; this much is cheap to read whatever it holds).
    pub gzip_allowance_bytes: u64,
}

impl Default for Limits {
    /// 16 GiB of pickle (snapshots "can easily be in the GB range"), 2^28 elements, depth
    /// 256 (a snapshot nests 6 deep: dict → list → segment → list → block → frames); a
    /// `.gz` at most 200 times its size or 64 MiB (real snapshots compress 10 to 25 times:
    /// docs/snapshot.md; deflate's own maximum, ~1032:1, would let a 2 MB file become 2 GB).
    fn default() -> Self {
        Self {
            max_total_bytes: 16 << 30,
            max_container_len: 1 << 28,
            max_depth: 256,
            max_gzip_ratio: 200,
            gzip_allowance_bytes: 64 << 20,
        }
    }
}

/// Why a pickle was refused.
#[derive(Debug, thiserror::Error)]
pub enum PickleError {
    /// The I/O error is in the message and not a `source`: a report of the whole chain
    /// (anyhow's `{:#}`) would say it twice.
    #[error("cannot read the pickle: {0}")]
    Io(std::io::Error),
    #[error("the pickle ends early, at byte {0} (truncated file?)")]
    Truncated(u64),
    #[error("unknown or unsupported pickle opcode 0x{opcode:02x} at byte {at}")]
    BadOpcode { opcode: u8, at: u64 },
    #[error("pickle protocol {0} is not supported (2 to 5 are)")]
    Protocol(u8),
    #[error(
        "global '{module}.{name}' at byte {at} is not allowed (a snapshot holds plain data only; nothing is executed)"
    )]
    GlobalNotAllowed {
        module: String,
        name: String,
        at: u64,
    },
    #[error("malformed pickle at byte {at}: {what}")]
    Malformed { what: &'static str, at: u64 },
    #[error("pickle exceeds the limit on {what} ({limit}) at byte {at}")]
    Limit {
        what: &'static str,
        limit: u64,
        at: u64,
    },
}

impl From<std::io::Error> for PickleError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// Index into [`Arena`]'s containers.
pub type ObjId = u32;
/// Index into [`Arena`]'s interned strings.
pub type StrId = u32;

/// A value of the pickle: scalars inline, strings and containers by index into the
/// [`Arena`]. The same container wherever the pickle refers to the same object.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum V {
    None,
    Bool(bool),
    Int(i64),
    /// An integer wider than 64 bits (little-endian two's complement), index into
    /// [`Arena::bytes`].
    BigInt(u32),
    Float(f64),
    Str(StrId),
    /// Index into [`Arena::bytes`].
    Bytes(u32),
    List(ObjId),
    Tuple(ObjId),
    Dict(ObjId),
    /// An allow-listed constructor pushed by GLOBAL/STACK_GLOBAL, waiting for its REDUCE.
    Callable(Global),
    /// A value another part of a parallel reading holds, by its memo index: a part of the
    /// trace read on another thread refers to what it did not read this way, and the
    /// reading resolves it when it is used (`parallel.rs`). Never in a [`Document`].
    Elsewhere(u32),
    /// A memo slot that was never stored; never on the stack.
    Unset,
}

impl V {
    pub fn as_int(self) -> Option<i64> {
        match self {
            Self::Int(i) => Some(i),
            Self::Bool(b) => Some(i64::from(b)),
            _ => None,
        }
    }
    pub fn as_f64(self) -> Option<f64> {
        match self {
            Self::Float(f) => Some(f),
            #[allow(clippy::cast_precision_loss)]
            Self::Int(i) => Some(i as f64),
            _ => None,
        }
    }
    pub fn as_bool(self) -> Option<bool> {
        match self {
            Self::Bool(b) => Some(b),
            Self::Int(i) => Some(i != 0),
            _ => None,
        }
    }
}

/// A container of the pickle.
#[derive(Debug, Clone, PartialEq)]
pub enum Obj {
    List(Vec<V>),
    Tuple(Vec<V>),
    /// Pairs in insertion order (keys of a snapshot dict are few, so lookup is a scan).
    Dict(Vec<(V, V)>),
    /// Read by a consumer of the pickle (the model) in some role — a trace entry, a frame,
    /// a frame list — and its contents freed: `role` and `id` are the consumer's. The
    /// reader refuses any later change to it.
    Taken {
        role: u8,
        id: u32,
    },
}

/// Strings, each stored once: equal strings have equal ids.
#[derive(Debug, Default)]
pub struct Interner {
    ids: HashMap<Arc<str>, StrId>,
    strings: Vec<Arc<str>>,
    /// How many strings [`Interner::with_known`] was given: ids below it mean the same
    /// string in every interner made from the same list.
    known: StrId,
}

impl Interner {
    /// An interner whose first ids are `known`'s, in order (duplicates keep the first id).
    pub fn with_known(known: &[&str]) -> Self {
        let mut i = Self::default();
        for k in known {
            i.intern(k);
        }
        i.known = StrId::try_from(i.strings.len()).unwrap_or(StrId::MAX);
        i
    }

    /// The strings [`Interner::with_known`] was given (an interner for another thread).
    pub fn known(&self) -> Vec<String> {
        self.strings[..self.known as usize]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    pub fn intern(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = StrId::try_from(self.strings.len()).unwrap_or(StrId::MAX);
        let rc: Arc<str> = Arc::from(s);
        self.strings.push(Arc::clone(&rc));
        self.ids.insert(rc, id);
        id
    }

    /// [`Interner::intern`] for bytes of the pickle: UTF-8 as Python writes it, surrogates
    /// as-is ('surrogatepass'), which a lossy decode turns into U+FFFD so reading goes on.
    /// Valid text (nearly all of it) is checked by `from_utf8`, several times faster than
    /// the lossy decode's chunking.
    pub fn intern_utf8(&mut self, raw: &[u8]) -> StrId {
        match std::str::from_utf8(raw) {
            Ok(s) => self.intern(s),
            Err(_) => self.intern(&String::from_utf8_lossy(raw)),
        }
    }

    /// The string of `id` (ids come from this interner, so it exists).
    pub fn get(&self, id: StrId) -> &Arc<str> {
        &self.strings[id as usize]
    }

    /// The id of `s`, when some string equal to it was interned.
    pub fn id_of(&self, s: &str) -> Option<StrId> {
        self.ids.get(s).copied()
    }
}

/// Everything a pickle made: its containers, strings and byte strings.
#[derive(Debug, Default)]
pub struct Arena {
    objs: Vec<Obj>,
    pub strings: Interner,
    /// Byte strings and wide integers.
    pub bytes: Vec<Box<[u8]>>,
    /// Emptied item and pair buffers of taken containers, handed to the next new ones: a
    /// trace is a million containers of much the same size, made and taken batch after
    /// batch, so in a steady state nothing is allocated or freed per entry.
    spare_items: Vec<Vec<V>>,
    spare_pairs: Vec<Vec<(V, V)>>,
    /// Set when [`Arena::seq`] or [`Arena::pairs`] met a taken container: a value the
    /// consumer took in one role was looked at again as plain data, which a consumer that
    /// must give what the file holds treats as an error ([`Arena::touched_taken`]).
    touched_taken: std::cell::Cell<bool>,
}

/// How many emptied buffers of each kind [`Arena::recycle`] keeps: a batch of APPENDS
/// (1,000 entries from Python's pickler) is made before the model takes any of it, and
/// each entry has a dict and a frame list.
const SPARE_BUFFERS: usize = 4096;
/// A buffer larger than this is freed, not kept (one huge list must not stay allocated).
const SPARE_MAX_ITEMS: usize = 4096;

impl Arena {
    pub fn obj(&self, id: ObjId) -> &Obj {
        &self.objs[id as usize]
    }

    /// Puts `with` in place of container `id` and gives back what was there.
    pub fn replace(&mut self, id: ObjId, with: Obj) -> Obj {
        std::mem::replace(&mut self.objs[id as usize], with)
    }

    pub fn len(&self) -> usize {
        self.objs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objs.is_empty()
    }

    /// Gives back the buffer of what [`Arena::replace`] returned, for new containers.
    pub fn recycle(&mut self, o: Obj) {
        match o {
            Obj::List(mut v) | Obj::Tuple(mut v)
                if self.spare_items.len() < SPARE_BUFFERS && v.capacity() <= SPARE_MAX_ITEMS =>
            {
                v.clear();
                self.spare_items.push(v);
            }
            Obj::Dict(mut v)
                if self.spare_pairs.len() < SPARE_BUFFERS && v.capacity() <= SPARE_MAX_ITEMS =>
            {
                v.clear();
                self.spare_pairs.push(v);
            }
            _ => {}
        }
    }

    #[inline]
    fn new_list(&mut self) -> Obj {
        Obj::List(self.spare_items.pop().unwrap_or_default())
    }

    #[inline]
    fn new_dict(&mut self) -> Obj {
        Obj::Dict(self.spare_pairs.pop().unwrap_or_default())
    }

    /// A new dict of `pairs` (a value made by a consumer of the reading, not read).
    pub fn add_dict(&mut self, pairs: Vec<(V, V)>) -> V {
        V::Dict(self.add(Obj::Dict(pairs)))
    }

    fn add(&mut self, o: Obj) -> ObjId {
        let id = ObjId::try_from(self.objs.len()).unwrap_or(ObjId::MAX);
        self.objs.push(o);
        id
    }

    pub fn str(&self, v: V) -> Option<&Arc<str>> {
        match v {
            V::Str(id) => Some(self.strings.get(id)),
            _ => None,
        }
    }

    /// The elements of a list or tuple (None for anything else, a taken one included).
    pub fn seq(&self, v: V) -> Option<&[V]> {
        match v {
            V::List(o) | V::Tuple(o) => match self.obj(o) {
                Obj::List(items) | Obj::Tuple(items) => Some(items),
                _ => {
                    self.touched_taken.set(true);
                    None
                }
            },
            _ => None,
        }
    }

    /// The pairs of a dict (None for anything else, a taken one included).
    pub fn pairs(&self, v: V) -> Option<&[(V, V)]> {
        match v {
            V::Dict(o) => match self.obj(o) {
                Obj::Dict(pairs) => Some(pairs),
                _ => {
                    self.touched_taken.set(true);
                    None
                }
            },
            _ => None,
        }
    }

    /// Whether [`Arena::seq`] or [`Arena::pairs`] was asked for a taken container.
    pub fn touched_taken(&self) -> bool {
        self.touched_taken.get()
    }

    /// `dict[key]` for a string key; a later SETITEM of the same key wins, as in Python.
    pub fn get(&self, v: V, key: &str) -> Option<V> {
        let id = self.strings.id_of(key)?;
        self.get_id(v, id)
    }

    /// [`Arena::get`] with the key's id.
    pub fn get_id(&self, v: V, key: StrId) -> Option<V> {
        self.pairs(v)?
            .iter()
            .rev()
            .find(|(k, _)| *k == V::Str(key))
            .map(|(_, v)| *v)
    }
}

/// What a pickle read into: its top value and the arena it refers to.
#[derive(Debug)]
pub struct Document {
    pub arena: Arena,
    pub top: V,
    /// How many parts of the pickle were decoded on other threads ([`read_parallel`]).
    pub parts: usize,
}

/// Takes the items appended to the lists at `top[key][i]` (top the outermost dict, `key`
/// [`ListSink::key`]) while the pickle is read. It is given a list's items only while that
/// list has no items of its own, so what it took always precedes what is left in the list.
pub trait ListSink {
    /// The id (in the interner the reader was given) of the key whose lists are streamed.
    fn key(&self) -> StrId;
    /// `items` were appended to `list`; `at` is the byte of the APPEND(S), for errors.
    ///
    /// # Errors
    /// Whatever makes the items unreadable to the sink; the whole read fails with it.
    fn take(
        &mut self,
        arena: &mut Arena,
        list: ObjId,
        items: &[V],
        at: u64,
    ) -> Result<(), PickleError>;
}

/// Reads one pickle from `input` (stops at STOP; what follows is not read), with strings
/// interned in `strings` (pass [`Interner::with_known`] to know the ids of keys ahead).
///
/// # Errors
/// Any [`PickleError`]: I/O, truncation, an opcode outside the supported set, a global
/// outside the allow-list, a structure that is not well formed, a limit exceeded, or what
/// the sink refused.
pub fn read<R: Read>(
    input: R,
    limits: Limits,
    strings: Interner,
    sink: Option<&mut dyn ListSink>,
) -> Result<Document, PickleError> {
    let mut input = Input::new(input, limits.max_total_bytes);
    let mut m = Machine::new(limits, strings, sink);
    // Without a limit on the input nor a handoff asked for, the only step is the end.
    match m.run::<_, false>(&mut input)? {
        Step::Stop(top) => Ok(Document {
            arena: m.arena,
            top,
            parts: 0,
        }),
        Step::Paused | Step::Handoff | Step::Boundary => Err(stopped_early(input.offset())),
    }
}

/// The machine stopped where only a parallel reading's steps stop it: a bug of the reader,
/// reported rather than looped on.
fn stopped_early(at: u64) -> PickleError {
    PickleError::Malformed {
        what: "the reader stopped before STOP where nothing asked it to (a bug of vramctl)",
        at,
    }
}

/// Reads a pickle from a byte slice, nothing streamed.
///
/// # Errors
/// As [`read`].
pub fn from_slice(bytes: &[u8], limits: Limits) -> Result<Document, PickleError> {
    read(bytes, limits, Interner::default(), None)
}

/// The bytes of a [`Read`] in a buffer that the decoder reads as a slice.
struct Input<R> {
    src: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Stream offset of `buf[0]`.
    base: u64,
    eof: bool,
    max_total: u64,
    /// Whether the end of `src` is where a parallel reading pauses, not the pickle's end.
    at_limit: bool,
}

/// What a refill asks for at least: the read call takes as much as the buffer holds.
const CHUNK_BYTES: usize = 1 << 20;
/// The longest module or name a GLOBAL opcode may have.
const GLOBAL_NAME_BYTES: usize = 256;

impl<R: Read> Input<R> {
    fn new(src: R, max_total: u64) -> Self {
        Self::starting_at(src, 0, max_total, false)
    }

    /// An input whose first byte is byte `base` of the pickle.
    fn starting_at(src: R, base: u64, max_total: u64, at_limit: bool) -> Self {
        Self {
            src,
            buf: Vec::new(),
            pos: 0,
            end: 0,
            base,
            eof: false,
            max_total,
            at_limit,
        }
    }

    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Makes `need` bytes ready at `pos` unless the stream ends first (then fewer are),
    /// reading in chunks. The buffer grows only when it is full of bytes that arrived, so
    /// a hostile declared length never allocates more than twice what the file holds.
    fn fill(&mut self, need: usize) -> Result<(), PickleError> {
        if self.end - self.pos >= need {
            return Ok(());
        }
        if self.offset().saturating_add(need as u64) > self.max_total {
            return Err(PickleError::Limit {
                what: "total size",
                limit: self.max_total,
                at: self.offset(),
            });
        }
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        while self.end < need && !self.eof {
            if self.end == self.buf.len() {
                let grown = (self.buf.len() * 2).max(CHUNK_BYTES);
                self.buf.resize(grown, 0);
            }
            // Never past the total-size limit: bytes beyond it are not read at all.
            let room = usize::try_from(self.max_total.saturating_sub(self.base))
                .unwrap_or(usize::MAX)
                .min(self.buf.len());
            if self.end >= room {
                return Err(PickleError::Limit {
                    what: "total size",
                    limit: self.max_total,
                    at: self.base + self.end as u64,
                });
            }
            match self.src.read(&mut self.buf[self.end..room]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.end += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

fn le_usize(b: &[u8]) -> usize {
    let mut a = [0u8; 8];
    a[..b.len()].copy_from_slice(b);
    usize::try_from(u64::from_le_bytes(a)).unwrap_or(usize::MAX)
}

/// Where [`Machine::run`] stopped, when it did not fail.
enum Step {
    /// STOP, with the pickle's value.
    Stop(V),
    /// The input's limit was reached (a parallel reading's next part may start there).
    Paused,
    /// The first batch of a streamed list was taken (a parallel reading starts its parts).
    Handoff,
    /// A part of a parallel reading reached its end (`parallel.rs`).
    Boundary,
}

struct Machine<'s, S: ListSink + ?Sized> {
    limits: Limits,
    /// The stack length and MARK depth at which the machine refuses more: the limits, less
    /// what a part of a parallel reading leaves for the reading it continues.
    max_stack: usize,
    max_depth: usize,
    stack: Vec<V>,
    /// Stack lengths at each MARK.
    marks: Vec<usize>,
    /// Memo entries from index `memo_base` on (0 but in a parallel reading: in a part, its
    /// first; in the main reading, after the parts it took in, whose entries they hold).
    memo: Vec<V>,
    memo_base: usize,
    /// In a parallel reading, the main reading's memo as it stood at the handoff: in a
    /// part, in the part's terms; in the main reading once it took parts in, a copy of its
    /// first entries, so GETs of them stay on the fast path ([`parallel`]). Else empty.
    outer_memo: Vec<V>,
    /// Whether a memo index was skipped (BINPUT ahead), leaving entries unset.
    memo_holes: bool,
    arena: Arena,
    stream_key: Option<StrId>,
    sink: Option<&'s mut S>,
    /// A part of a parallel reading: the list its batches stream to, standing in for the
    /// list of the main reading that the part continues.
    seed: Option<ObjId>,
    /// The main reading of a parallel one: return [`Step::Handoff`] after the first batch
    /// a sink takes.
    handoff_armed: bool,
    /// A part of a parallel reading: where it ends, and whether it stands between two
    /// batches (`parallel.rs`).
    part: Option<parallel::PartView>,
    /// The main reading of a parallel one: the parts it took in, which the memo refers to.
    parts: Option<Box<parallel::Parts>>,
}

impl<'s, S: ListSink + ?Sized> Machine<'s, S> {
    fn new(limits: Limits, strings: Interner, sink: Option<&'s mut S>) -> Self {
        Self {
            limits,
            max_stack: limits.max_container_len,
            max_depth: limits.max_depth,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Vec::new(),
            memo_base: 0,
            outer_memo: Vec::new(),
            memo_holes: false,
            arena: Arena {
                strings,
                ..Arena::default()
            },
            stream_key: sink.as_ref().map(|s| s.key()),
            sink,
            seed: None,
            handoff_armed: false,
            part: None,
            parts: None,
        }
    }

    fn malformed(what: &'static str, at: u64) -> PickleError {
        PickleError::Malformed { what, at }
    }

    fn limit(&self, what: &'static str, at: u64) -> PickleError {
        PickleError::Limit {
            what,
            limit: self.limits.max_container_len as u64,
            at,
        }
    }

    #[inline(always)]
    fn push(&mut self, v: V, at: u64) -> Result<(), PickleError> {
        if self.stack.len() >= self.max_stack {
            return Err(self.limit("stack length", at));
        }
        self.stack.push(v);
        Ok(())
    }

    #[inline]
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    #[inline]
    fn pop(&mut self, at: u64) -> Result<V, PickleError> {
        if self.stack.len() <= self.floor() {
            return Err(Self::malformed(
                "pop from an empty stack (or across a MARK)",
                at,
            ));
        }
        self.stack
            .pop()
            .ok_or_else(|| Self::malformed("pop from an empty stack", at))
    }

    #[inline]
    fn top(&self, at: u64) -> Result<V, PickleError> {
        if self.stack.len() <= self.floor() {
            return Err(Self::malformed("no value on the stack", at));
        }
        self.stack
            .last()
            .copied()
            .ok_or_else(|| Self::malformed("no value on the stack", at))
    }

    /// The MARK removed; the values above it stay on the stack from the returned index.
    fn pop_mark(&mut self, at: u64) -> Result<usize, PickleError> {
        self.marks
            .pop()
            .ok_or_else(|| Self::malformed("no MARK to pop to", at))
    }

    /// The memo index the next MEMOIZE stores at.
    #[inline(always)]
    fn memo_next(&self) -> usize {
        self.memo_base + self.memo.len()
    }

    #[inline(always)]
    fn memo_put(&mut self, idx: usize, at: u64) -> Result<(), PickleError> {
        let v = self.top(at)?;
        if idx == self.memo_next() {
            if idx >= self.limits.max_container_len {
                return Err(self.limit("memo length", at));
            }
            self.memo.push(v);
            return Ok(());
        }
        // Writers number memo entries 0, 1, 2, …; a jump ahead would let a few bytes
        // allocate a huge memo.
        if idx > self.memo_next() + 1024 {
            return Err(Self::malformed(
                "a memo index far beyond the entries so far",
                at,
            ));
        }
        if idx >= self.limits.max_container_len {
            return Err(self.limit("memo length", at));
        }
        // Below the base: a part does not change what it did not read (the reading then goes
        // on without the part); the main reading keeps what it stores over there.
        let Some(local) = idx.checked_sub(self.memo_base) else {
            // The main reading stores over an entry of its past (its parts hold some).
            if let Some(parts) = self.parts.as_deref_mut() {
                parts.store_over(idx, v);
                if let Some(slot) = self.outer_memo.get_mut(idx) {
                    *slot = v;
                }
                return Ok(());
            }
            return Err(Self::malformed(
                "a memo entry stored again outside this part of the reading",
                at,
            ));
        };
        if local >= self.memo.len() {
            self.memo.resize(local + 1, V::Unset);
            self.memo_holes = true;
        }
        self.memo[local] = v;
        Ok(())
    }

    #[inline(always)]
    fn memo_get(&mut self, idx: usize, at: u64) -> Result<(), PickleError> {
        let v = match self.memo.get(idx.wrapping_sub(self.memo_base)) {
            Some(&v) => v,
            // A part of a parallel reading: what it did not read is elsewhere.
            None if idx < self.memo_base => self
                .outer_memo
                .get(idx)
                .copied()
                .unwrap_or(V::Elsewhere(u32::try_from(idx).unwrap_or(u32::MAX))),
            None => V::Unset,
        };
        let v = match v {
            V::Unset => {
                return Err(Self::malformed(
                    "a memo reference to an entry never stored",
                    at,
                ));
            }
            // The main reading resolves what its parts read, once (`parallel.rs`).
            V::Elsewhere(i) if self.parts.is_some() => self.resolve_elsewhere(i, at)?,
            v => v,
        };
        self.push(v, at)
    }

    /// Pushes the memo values of the BINGET/LONG_BINGET opcodes at the start of `buf`, as
    /// many as are whole there and refer to stored entries, and gives the bytes they took
    /// (0 leaves the first one, and any error, to the opcode-by-opcode path).
    ///
    /// A part of a parallel reading (`PART`) pushes what lies elsewhere as it is; the main
    /// reading leaves it to [`Machine::memo_get`], which resolves it.
    #[inline(always)]
    fn memo_get_run<const PART: bool>(&mut self, buf: &[u8]) -> usize {
        let mut i = 0;
        loop {
            let (idx, len) = match buf.get(i..) {
                Some([b'h', idx, ..]) => (usize::from(*idx), 2),
                Some([b'j', a, b, c, d, ..]) => (u32::from_le_bytes([*a, *b, *c, *d]) as usize, 5),
                _ => return i,
            };
            // One reading (and the main one before it took parts in): the loop it had
            // before parallel reading, ~3 instructions per GET fewer than the general one
            // below (16 M of 383 M on an 18 MB file, callgrind).
            if !PART && self.memo_base == 0 {
                match self.memo.get(idx) {
                    Some(&v)
                        if !matches!(v, V::Unset | V::Elsewhere(_))
                            && self.stack.len() < self.max_stack =>
                    {
                        self.stack.push(v);
                        i += len;
                        continue;
                    }
                    _ => return i,
                }
            }
            let v = match self.memo.get(idx.wrapping_sub(self.memo_base)) {
                Some(&v) => v,
                None if idx < self.memo_base => match self.outer_memo.get(idx) {
                    Some(&v) => v,
                    None if PART => V::Elsewhere(u32::try_from(idx).unwrap_or(u32::MAX)),
                    None => return i,
                },
                None => return i,
            };
            if matches!(v, V::Unset)
                || (!PART && matches!(v, V::Elsewhere(_)))
                || self.stack.len() >= self.max_stack
            {
                return i;
            }
            self.stack.push(v);
            i += len;
        }
    }

    fn check_len(&self, len: usize, at: u64) -> Result<(), PickleError> {
        if len > self.limits.max_container_len {
            return Err(self.limit("container length", at));
        }
        Ok(())
    }

    /// Whether the list at `stack[n - 1]` is `top_dict[key][i]` (the streamed key) while the
    /// pickle is being read, `n` being the stack's length without the values being added:
    /// the stack then holds the top dict at 0 (its SETITEMS MARK at 1), the key at an even
    /// offset from that MARK, the outer list, and the per-device list either right after
    /// the outer list or in the batch above the outer list's APPENDS MARK.
    fn in_streamed_list(&self, key: StrId, n: usize) -> bool {
        let is_key = |k: usize| {
            k >= 1
                && (k - 1) % 2 == 0
                && matches!(self.stack[0], V::Dict(_))
                && self.stack[k] == V::Str(key)
        };
        let outer_is_list = |o: usize| matches!(self.stack[o], V::List(_));
        match self.marks.as_slice() {
            [1] => n >= 3 && outer_is_list(n - 2) && is_key(n - 3),
            [1, m] => *m >= 3 && *m < n && outer_is_list(*m - 1) && is_key(*m - 2),
            _ => false,
        }
    }

    /// The container at `stack[from - 1]`, which the values from `from` on are added to; it
    /// must be above the innermost MARK.
    fn target(&self, from: usize, at: u64) -> Result<V, PickleError> {
        if from == 0 || from - 1 < self.floor() {
            return Err(Self::malformed("no container below the values to add", at));
        }
        Ok(self.stack[from - 1])
    }

    /// Appends `stack[from..]` to the list below them, then drops them from the stack;
    /// gives whether a sink took them.
    fn extend_list(&mut self, from: usize, at: u64) -> Result<bool, PickleError> {
        let V::List(o) = self.target(from, at)? else {
            return Err(Self::malformed(
                "APPEND to something that is not a list",
                at,
            ));
        };
        let count = self.stack.len() - from;
        let streamed = match (&self.arena.objs[o as usize], self.stream_key) {
            (Obj::List(l), Some(key)) => {
                l.is_empty()
                    && self.sink.is_some()
                    && (self.seed == Some(o) || self.in_streamed_list(key, from))
            }
            _ => false,
        };
        if streamed {
            self.check_len(count, at)?;
            if let Some(sink) = self.sink.as_mut() {
                sink.take(&mut self.arena, o, &self.stack[from..], at)?;
            }
        } else {
            let max = self.limits.max_container_len;
            match &mut self.arena.objs[o as usize] {
                Obj::List(l) => {
                    if l.len() + count > max {
                        return Err(self.limit("container length", at));
                    }
                    l.extend_from_slice(&self.stack[from..]);
                }
                Obj::Taken { .. } => {
                    return Err(Self::malformed(
                        "APPEND to a list already read (as a trace entry, a frame or a frame list)",
                        at,
                    ));
                }
                _ => {
                    return Err(Self::malformed(
                        "APPEND to something that is not a list",
                        at,
                    ));
                }
            }
        }
        self.stack.truncate(from);
        Ok(streamed)
    }

    /// Sets the pairs `stack[from..]` in the dict below them, then drops them.
    fn set_items(&mut self, from: usize, at: u64) -> Result<(), PickleError> {
        let count = self.stack.len() - from;
        if count % 2 != 0 {
            return Err(Self::malformed("SETITEMS with an odd number of values", at));
        }
        let V::Dict(o) = self.target(from, at)? else {
            return Err(Self::malformed(
                "SETITEM on something that is not a dict",
                at,
            ));
        };
        let max = self.limits.max_container_len;
        match &mut self.arena.objs[o as usize] {
            Obj::Dict(pairs) => {
                if pairs.len() + count / 2 > max {
                    return Err(self.limit("container length", at));
                }
                pairs.extend(self.stack[from..].chunks_exact(2).map(|kv| (kv[0], kv[1])));
            }
            Obj::Taken { .. } => {
                return Err(Self::malformed(
                    "SETITEM on a dict already read (as a trace entry, a frame or a frame list)",
                    at,
                ));
            }
            _ => {
                return Err(Self::malformed(
                    "SETITEM on something that is not a dict",
                    at,
                ));
            }
        }
        self.stack.truncate(from);
        Ok(())
    }

    fn string(&mut self, raw: &[u8]) -> V {
        V::Str(self.arena.strings.intern_utf8(raw))
    }

    fn blob(&mut self, raw: &[u8], big_int: bool) -> V {
        let id = u32::try_from(self.arena.bytes.len()).unwrap_or(u32::MAX);
        self.arena.bytes.push(Box::from(raw));
        if big_int { V::BigInt(id) } else { V::Bytes(id) }
    }

    /// LONG1/LONG4: little-endian two's complement; wider than 64 bits kept as bytes.
    fn long(&mut self, raw: &[u8]) -> V {
        if raw.len() <= 8 {
            long_inline(raw)
        } else {
            self.blob(raw, true)
        }
    }

    /// Reads opcodes until STOP. The inner loop decodes from a slice of the buffer with its
    /// position in a register; an opcode whose bytes are not all there yet leaves it with
    /// how many it needs, the buffer is refilled, and decoding goes on where it stopped.
    ///
    /// `PART` is true for a part of a parallel reading, which stops at its boundary.
    fn run<R: Read, const PART: bool>(
        &mut self,
        input: &mut Input<R>,
    ) -> Result<Step, PickleError> {
        // Bytes the next opcode needs at `input.pos`: 1 to start, more when one was cut.
        let mut need = 1;
        loop {
            input.fill(need)?;
            let (base, end, mut p) = (input.base, input.end, input.pos);
            if end - p < need && input.eof {
                if input.at_limit {
                    return Ok(Step::Paused);
                }
                return Err(PickleError::Truncated(base + end as u64));
            }
            let buf = &input.buf[..end];
            need = loop {
                let at = base + p as u64;
                let Some(&op) = buf.get(p) else {
                    break 1;
                };
                if PART
                    && let Some(part) = &mut self.part
                    && part.between
                    && part.ends_before(op, at)
                {
                    input.pos = p;
                    return Ok(Step::Boundary);
                }
                // `arg!(n)`: the n bytes after the opcode, or leave for a refill.
                macro_rules! arg {
                    ($n:expr) => {{
                        let n: usize = $n;
                        match buf.get(p + 1..(p + 1).saturating_add(n)) {
                            Some(b) => b,
                            None => break 1usize.saturating_add(n),
                        }
                    }};
                }
                match op {
                    // BINGET, LONG_BINGET, MEMOIZE: most of a snapshot's opcodes.
                    b'h' | b'j' => {
                        // A run of GETs (a frame list is ~30 in a row) in one loop.
                        let run = self.memo_get_run::<PART>(&buf[p..]);
                        if run > 0 {
                            p += run;
                            continue;
                        }
                        let (idx, len) = if op == b'h' {
                            (usize::from(arg!(1)[0]), 2)
                        } else {
                            let b = arg!(4);
                            (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize, 5)
                        };
                        p += len;
                        self.memo_get(idx, at)?;
                    }
                    0x94 => {
                        p += 1;
                        let idx = self.memo_next();
                        self.memo_put(idx, at)?;
                    }
                    b'q' => {
                        let idx = usize::from(arg!(1)[0]);
                        p += 2;
                        self.memo_put(idx, at)?;
                    }
                    b'r' => {
                        let b = arg!(4);
                        let idx = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
                        p += 5;
                        self.memo_put(idx, at)?;
                    }
                    b'(' => {
                        p += 1;
                        if self.marks.len() >= self.max_depth {
                            return Err(PickleError::Limit {
                                what: "nesting depth",
                                limit: self.limits.max_depth as u64,
                                at,
                            });
                        }
                        self.marks.push(self.stack.len());
                    }
                    b'K' => {
                        let v = i64::from(arg!(1)[0]);
                        p += 2;
                        self.push(V::Int(v), at)?;
                    }
                    b'M' => {
                        let b = arg!(2);
                        let v = i64::from(u16::from_le_bytes([b[0], b[1]]));
                        p += 3;
                        self.push(V::Int(v), at)?;
                    }
                    b'J' => {
                        let b = arg!(4);
                        let v = i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                        p += 5;
                        self.push(V::Int(v), at)?;
                    }
                    // LONG1, LONG4
                    0x8a | 0x8b => {
                        let width = if op == 0x8a { 1 } else { 4 };
                        let n = le_usize(arg!(width));
                        let raw = &arg!(width.saturating_add(n))[width..];
                        let v = if raw.len() == 8 {
                            // The addresses and times of a trace: no call to copy them.
                            let mut a = [0u8; 8];
                            a.copy_from_slice(raw);
                            V::Int(i64::from_le_bytes(a))
                        } else {
                            self.long(raw)
                        };
                        p += 1 + width + n;
                        self.push(v, at)?;
                    }
                    b'G' => {
                        let b = arg!(8);
                        let mut a = [0u8; 8];
                        a.copy_from_slice(b);
                        p += 9;
                        self.push(V::Float(f64::from_be_bytes(a)), at)?;
                    }
                    // SHORT_BINUNICODE, BINUNICODE, BINUNICODE8 and the three BINBYTES.
                    0x8c | b'X' | 0x8d | b'C' | b'B' | 0x8e => {
                        let width = match op {
                            0x8c | b'C' => 1,
                            b'X' | b'B' => 4,
                            _ => 8,
                        };
                        let n = le_usize(arg!(width));
                        if at
                            .saturating_add((1 + width) as u64)
                            .saturating_add(n as u64)
                            > self.limits.max_total_bytes
                        {
                            return Err(PickleError::Limit {
                                what: "total size",
                                limit: self.limits.max_total_bytes,
                                at,
                            });
                        }
                        let raw = &arg!(width.saturating_add(n))[width..];
                        let v = if matches!(op, 0x8c | b'X' | 0x8d) {
                            self.string(raw)
                        } else {
                            self.blob(raw, false)
                        };
                        p += 1 + width + n;
                        self.push(v, at)?;
                    }
                    b'}' => {
                        p += 1;
                        let d = self.arena.new_dict();
                        let o = self.arena.add(d);
                        self.push(V::Dict(o), at)?;
                    }
                    b']' => {
                        p += 1;
                        let l = self.arena.new_list();
                        let o = self.arena.add(l);
                        self.push(V::List(o), at)?;
                    }
                    b')' => {
                        p += 1;
                        let o = self.arena.add(Obj::Tuple(Vec::new()));
                        self.push(V::Tuple(o), at)?;
                    }
                    b'e' => {
                        p += 1;
                        let from = self.pop_mark(at)?;
                        let streamed = self.extend_list(from, at)?;
                        if self.after_append::<PART>(streamed) {
                            input.pos = p;
                            return Ok(Step::Handoff);
                        }
                    }
                    b'a' => {
                        p += 1;
                        if self.stack.len() < self.floor() + 2 {
                            return Err(Self::malformed("APPEND without a list and a value", at));
                        }
                        let streamed = self.extend_list(self.stack.len() - 1, at)?;
                        if self.after_append::<PART>(streamed) {
                            input.pos = p;
                            return Ok(Step::Handoff);
                        }
                    }
                    b'u' => {
                        p += 1;
                        let from = self.pop_mark(at)?;
                        self.set_items(from, at)?;
                    }
                    b's' => {
                        p += 1;
                        if self.stack.len() < self.floor() + 3 {
                            return Err(Self::malformed(
                                "SETITEM without a dict, key and value",
                                at,
                            ));
                        }
                        self.set_items(self.stack.len() - 2, at)?;
                    }
                    b'd' => {
                        p += 1;
                        let from = self.pop_mark(at)?;
                        if (self.stack.len() - from) % 2 != 0 {
                            return Err(Self::malformed("DICT with an odd number of values", at));
                        }
                        let pairs = self.stack[from..]
                            .chunks_exact(2)
                            .map(|kv| (kv[0], kv[1]))
                            .collect();
                        self.stack.truncate(from);
                        let o = self.arena.add(Obj::Dict(pairs));
                        self.push(V::Dict(o), at)?;
                    }
                    b'l' | b't' => {
                        p += 1;
                        let from = self.pop_mark(at)?;
                        let items = self.stack.split_off(from);
                        let (o, v): (Obj, fn(ObjId) -> V) = if op == b'l' {
                            (Obj::List(items), V::List)
                        } else {
                            (Obj::Tuple(items), V::Tuple)
                        };
                        let id = self.arena.add(o);
                        self.push(v(id), at)?;
                    }
                    0x85..=0x87 => {
                        p += 1;
                        let n = usize::from(op - 0x84);
                        if self.stack.len() < self.floor() + n {
                            return Err(Self::malformed("TUPLE1/2/3 with too few values", at));
                        }
                        let items = self.stack.split_off(self.stack.len() - n);
                        let o = self.arena.add(Obj::Tuple(items));
                        self.push(V::Tuple(o), at)?;
                    }
                    b'N' => {
                        p += 1;
                        self.push(V::None, at)?;
                    }
                    0x88 | 0x89 => {
                        p += 1;
                        self.push(V::Bool(op == 0x88), at)?;
                    }
                    0x80 => {
                        let proto = arg!(1)[0];
                        p += 2;
                        if !(2..=5).contains(&proto) {
                            return Err(PickleError::Protocol(proto));
                        }
                    }
                    // FRAME: a length hint for buffering; the stream is read the same either way.
                    0x95 => {
                        arg!(8);
                        p += 9;
                    }
                    b'.' => {
                        p += 1;
                        input.pos = p;
                        let v = self.pop(at)?;
                        if !self.marks.is_empty() {
                            return Err(Self::malformed("STOP inside a MARK", at));
                        }
                        return Ok(Step::Stop(v));
                    }
                    b'0' => {
                        p += 1;
                        self.pop(at)?;
                    }
                    b'1' => {
                        p += 1;
                        let from = self.pop_mark(at)?;
                        self.stack.truncate(from);
                    }
                    b'2' => {
                        p += 1;
                        let v = self.top(at)?;
                        self.push(v, at)?;
                    }
                    b'c' => {
                        // Two lines, module and name, each at most 256 bytes.
                        let rest = &buf[p + 1..];
                        let window = &rest[..rest.len().min(2 * GLOBAL_NAME_BYTES + 2)];
                        let mut lines = window.split_inclusive(|&b| b == b'\n');
                        let (Some(module), Some(name)) = (lines.next(), lines.next()) else {
                            if window.len() > 2 * GLOBAL_NAME_BYTES + 1 {
                                return Err(Self::malformed(
                                    "a GLOBAL name longer than 256 bytes",
                                    at,
                                ));
                            }
                            break rest.len() + 2;
                        };
                        let (Some(module), Some(name)) =
                            (module.strip_suffix(b"\n"), name.strip_suffix(b"\n"))
                        else {
                            if window.len() > 2 * GLOBAL_NAME_BYTES + 1 {
                                return Err(Self::malformed(
                                    "a GLOBAL name longer than 256 bytes",
                                    at,
                                ));
                            }
                            break rest.len() + 2;
                        };
                        if module.len() > GLOBAL_NAME_BYTES || name.len() > GLOBAL_NAME_BYTES {
                            return Err(Self::malformed("a GLOBAL name longer than 256 bytes", at));
                        }
                        let text = |b: &[u8]| {
                            std::str::from_utf8(b)
                                .map(str::to_owned)
                                .map_err(|_| Self::malformed("a GLOBAL name that is not UTF-8", at))
                        };
                        let (module_len, name_len) = (module.len(), name.len());
                        let (module, name) = (text(module)?, text(name)?);
                        p += 1 + module_len + 1 + name_len + 1;
                        let g = Global::allowed(&module, &name)
                            .ok_or(PickleError::GlobalNotAllowed { module, name, at })?;
                        self.push(V::Callable(g), at)?;
                    }
                    0x93 => {
                        p += 1;
                        let name = self.pop(at)?;
                        let module = self.pop(at)?;
                        let (Some(module), Some(name)) =
                            (self.arena.str(module), self.arena.str(name))
                        else {
                            return Err(Self::malformed(
                                "STACK_GLOBAL of values that are not strings",
                                at,
                            ));
                        };
                        let g = Global::allowed(module, name).ok_or_else(|| {
                            PickleError::GlobalNotAllowed {
                                module: module.to_string(),
                                name: name.to_string(),
                                at,
                            }
                        })?;
                        self.push(V::Callable(g), at)?;
                    }
                    b'R' => {
                        p += 1;
                        let args = self.pop(at)?;
                        let V::Callable(g) = self.pop(at)? else {
                            return Err(Self::malformed(
                                "REDUCE of something that is not a global",
                                at,
                            ));
                        };
                        let args = self
                            .arena
                            .seq(args)
                            .ok_or_else(|| {
                                Self::malformed("REDUCE arguments that are not a tuple", at)
                            })?
                            .to_vec();
                        let v = self.call(g, &args).ok_or_else(|| {
                            Self::malformed("arguments the allow-listed global does not take", at)
                        })?;
                        self.push(v, at)?;
                    }
                    _ => return Err(PickleError::BadOpcode { opcode: op, at }),
                }
            };
            input.pos = p;
        }
    }

    /// After an APPEND(S) (`streamed`: a sink took the items): whether the main reading of
    /// a parallel one hands off now; a part notes when it is between two batches.
    #[inline]
    fn after_append<const PART: bool>(&mut self, streamed: bool) -> bool {
        if PART {
            if self.stack.len() == 1
                && self.marks.len() == 1
                && let Some(part) = &mut self.part
            {
                part.between = true;
            }
            false
        } else if streamed && self.handoff_armed {
            self.handoff_armed = false;
            true
        } else {
            false
        }
    }

    fn call(&mut self, g: Global, args: &[V]) -> Option<V> {
        match (g, args) {
            (Global::OrderedDict, []) => Some(V::Dict(self.arena.add(Obj::Dict(Vec::new())))),
            (Global::BuildList, [l @ V::List(_)]) => Some(*l),
            (Global::RestoreTypeTag, [v, V::Str(_)]) => Some(*v),
            _ => None,
        }
    }
}

/// LONG1 of at most 8 bytes: little-endian two's complement.
fn long_inline(raw: &[u8]) -> V {
    let Some(&last) = raw.last() else {
        return V::Int(0);
    };
    let mut a = [if last & 0x80 != 0 { 0xff } else { 0 }; 8];
    a[..raw.len()].copy_from_slice(raw);
    V::Int(i64::from_le_bytes(a))
}

/// The constructors a snapshot may use, each doing what Python would, here, on plain data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Global {
    /// `collections.OrderedDict()`: an empty dict (SETITEMS fill it).
    OrderedDict,
    /// `torch.jit._pickle.build_intlist(list)` and friends (TorchScript's typed lists):
    /// the list itself.
    BuildList,
    /// `torch.jit._pickle.restore_type_tag(value, type_str)`: the value itself.
    RestoreTypeTag,
}

impl Global {
    fn allowed(module: &str, name: &str) -> Option<Self> {
        match (module, name) {
            ("collections", "OrderedDict") => Some(Self::OrderedDict),
            (
                "torch.jit._pickle",
                "build_intlist" | "build_doublelist" | "build_boollist" | "build_stringlist",
            ) => Some(Self::BuildList),
            ("torch.jit._pickle", "restore_type_tag") => Some(Self::RestoreTypeTag),
            _ => None,
        }
    }
}
