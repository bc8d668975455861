//! A pickle reader made for allocator snapshots: the opcodes that Python's `pickle.dump`
//! (protocols 2–5) and the C++ TorchScript pickler write for plain data, with shared
//! references kept shared (`Rc`), and no code execution: the only globals accepted are a
//! short allow-list of constructors that build plain data (`collections.OrderedDict`, the
//! `torch.jit._pickle` list builders), handled here without importing anything.
//!
//! `serde-pickle` cannot read snapshots: Python memoizes every container and the snapshot
//! shares one frame list between many blocks and trace entries, which serde-pickle treats
//! as recursion (research-pytorch-memory.md §1.4).
//!
//! Memory is bounded by the input: every opcode byte creates at most one value, string and
//! byte lengths are checked against [`Limits`] before anything is allocated, memo indices
//! may not jump ahead, and nested values are dropped iteratively (no stack overflow on a
//! deeply nested hostile file).

use std::cell::{Cell, RefCell};
use std::io::{BufRead, Read};
use std::rc::Rc;

/// Bounds on what one pickle may make the reader do.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes read from the stream (after decompression).
    pub max_total_bytes: u64,
    /// Elements of one list, tuple or dict, and of the stack and memo.
    pub max_container_len: usize,
    /// Nesting depth of containers (and of MARKs).
    pub max_depth: usize,
}

impl Default for Limits {
    /// 16 GiB of pickle (snapshots "can easily be in the GB range"), 2^28 elements, depth
    /// 256 (a snapshot nests 6 deep: dict → list → segment → list → block → frames).
    fn default() -> Self {
        Self {
            max_total_bytes: 16 << 30,
            max_container_len: 1 << 28,
            max_depth: 256,
        }
    }
}

/// Why a pickle was refused.
#[derive(Debug, thiserror::Error)]
pub enum PickleError {
    #[error("cannot read the pickle: {0}")]
    Io(#[from] std::io::Error),
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

/// A list or dict or tuple cell. Its `Drop` takes its children apart iteratively, so a
/// deeply nested value never recurses in drop glue.
/// The second field is set once the reader has handed the value to a [`TraceSink`]: a
/// later change to it is refused, so what the sink read is what the file holds.
#[derive(Debug, Default)]
pub struct Items(pub RefCell<Vec<Value>>, Cell<bool>);

/// A dict: pairs in insertion order (keys of a snapshot dict are few, so lookup is a scan).
#[derive(Debug, Default)]
pub struct Pairs(pub RefCell<Vec<(Value, Value)>>, Cell<bool>);

/// A value of the pickle. Containers are shared: the same `Rc` wherever the pickle refers
/// to the same object.
#[derive(Debug, Clone)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer wider than 64 bits (little-endian two's complement), kept as bytes.
    BigInt(Rc<[u8]>),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    List(Rc<Items>),
    Tuple(Rc<Items>),
    Dict(Rc<Pairs>),
    /// An allow-listed constructor pushed by GLOBAL/STACK_GLOBAL, waiting for its REDUCE.
    Callable(Global),
}

impl Value {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Self::Int(i) => Some(*i),
            Self::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Self::Float(f) => Some(*f),
            #[allow(clippy::cast_precision_loss)]
            Self::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Self::Bool(b) => Some(*b),
            Self::Int(i) => Some(*i != 0),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&Rc<str>> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }
    /// The elements of a list or tuple.
    pub fn as_seq(&self) -> Option<&Rc<Items>> {
        match self {
            Self::List(l) | Self::Tuple(l) => Some(l),
            _ => None,
        }
    }
    pub fn as_dict(&self) -> Option<&Rc<Pairs>> {
        match self {
            Self::Dict(d) => Some(d),
            _ => None,
        }
    }
    /// `dict[key]` for a string key.
    pub fn get(&self, key: &str) -> Option<Value> {
        let d = self.as_dict()?;
        let pairs = d.0.borrow();
        pairs
            .iter()
            .rev() // a later SETITEM of the same key wins, as in Python
            .find(|(k, _)| k.as_str().is_some_and(|s| &**s == key))
            .map(|(_, v)| v.clone())
    }
}

/// Marks a trace entry, its frame list and the frames in it as read (three levels are
/// what a trace entry nests), so that a later APPEND or SETITEM on them is an error.
fn freeze(v: &Value, depth: u8) {
    match v {
        Value::List(l) | Value::Tuple(l) => {
            l.1.set(true);
            if depth > 0 {
                for c in l.0.borrow().iter() {
                    freeze(c, depth - 1);
                }
            }
        }
        Value::Dict(d) => {
            d.1.set(true);
            if depth > 0 {
                for (_, c) in d.0.borrow().iter() {
                    freeze(c, depth - 1);
                }
            }
        }
        _ => {}
    }
}

/// Where completed trace entries go while the pickle is still being read, so that a
/// million entries (each a dict with its frame list) never live as generic values all at
/// once. The reader calls it for the items appended to a list that sits at
/// `top_dict["device_traces"][i]`; it is given the items only while that list has no
/// items of its own, so entries taken by the sink always precede those left in the list.
pub trait TraceSink {
    /// `list` is the per-device list the `items` were appended to (the key under which
    /// the sink files them); the items are frozen (see [`Items`]).
    fn trace_items(&mut self, list: &Rc<Items>, items: Vec<Value>);
}

/// Memo indices that a GET refers to anywhere in the pickle (a bit per index), found by
/// a first pass over the opcodes ([`scan_fetched`]). An entry no GET refers to is not
/// kept in the memo, so a value the file never refers to again is freed as soon as its
/// parent is.
#[derive(Debug, Clone, Default)]
pub struct Fetched(Vec<u64>);

impl Fetched {
    fn mark(&mut self, idx: usize) {
        let word = idx / 64;
        if word >= self.0.len() {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= 1 << (idx % 64);
    }
    fn contains(&self, idx: usize) -> bool {
        self.0
            .get(idx / 64)
            .is_some_and(|w| w & (1 << (idx % 64)) != 0)
    }
}

/// The first pass: walks the opcodes without building anything and records which memo
/// indices are fetched. It stops at STOP, at an opcode it does not know, or at the end of
/// the input (the second pass reports what is wrong with the pickle).
///
/// # Errors
/// I/O errors and the limits on total size and memo length.
pub fn scan_fetched<R: BufRead>(mut input: R, limits: Limits) -> Result<Fetched, PickleError> {
    let mut fetched = Fetched::default();
    let mut pos: u64 = 0;
    let mut memo_len: usize = 0;
    let skip = |input: &mut R, n: u64, pos: &mut u64| -> Result<bool, PickleError> {
        if pos.saturating_add(n) > limits.max_total_bytes {
            return Err(PickleError::Limit {
                what: "total size",
                limit: limits.max_total_bytes,
                at: *pos,
            });
        }
        let got = std::io::copy(&mut input.take(n), &mut std::io::sink())?;
        *pos += got;
        Ok(got == n)
    };
    let arg = |input: &mut R, n: usize, pos: &mut u64| -> Result<Option<u64>, PickleError> {
        let mut a = [0u8; 8];
        match input.read_exact(&mut a[..n]) {
            Ok(()) => {
                *pos += n as u64;
                Ok(Some(u64::from_le_bytes(a)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(e.into()),
        }
    };
    loop {
        // Fast path: the common opcodes decoded straight from the buffer, many per call;
        // whatever it does not take (STOP, GLOBAL, an opcode near the buffer's end, an
        // odd GET) goes through the opcode-by-opcode path below.
        let buf = input.fill_buf()?;
        let mut i = 0;
        while let Some(step) = scan_one(&buf[i..], &mut fetched, &mut memo_len, limits) {
            i += step;
        }
        if i > 0 {
            input.consume(i);
            pos += i as u64;
            if pos > limits.max_total_bytes {
                return Err(PickleError::Limit {
                    what: "total size",
                    limit: limits.max_total_bytes,
                    at: pos,
                });
            }
            continue;
        }
        let Some(op) = arg(&mut input, 1, &mut pos)? else {
            return Ok(fetched);
        };
        let ok = match op as u8 {
            b'.' => return Ok(fetched),
            0x80 | b'K' => arg(&mut input, 1, &mut pos)?.is_some(),
            b'M' => arg(&mut input, 2, &mut pos)?.is_some(),
            b'J' => arg(&mut input, 4, &mut pos)?.is_some(),
            0x95 | b'G' => arg(&mut input, 8, &mut pos)?.is_some(),
            0x8a | 0x8c | b'C' => match arg(&mut input, 1, &mut pos)? {
                Some(n) => skip(&mut input, n, &mut pos)?,
                None => false,
            },
            0x8b | b'X' | b'B' => match arg(&mut input, 4, &mut pos)? {
                Some(n) => skip(&mut input, n, &mut pos)?,
                None => false,
            },
            0x8d | 0x8e => match arg(&mut input, 8, &mut pos)? {
                Some(n) => skip(&mut input, n, &mut pos)?,
                None => false,
            },
            0x94 => {
                memo_len += 1;
                true
            }
            b'q' | b'r' => match arg(&mut input, if op as u8 == b'q' { 1 } else { 4 }, &mut pos)? {
                Some(idx) => {
                    let idx = usize::try_from(idx).unwrap_or(usize::MAX);
                    memo_len = memo_len.max(idx.saturating_add(1));
                    true
                }
                None => false,
            },
            b'h' | b'j' => match arg(&mut input, if op as u8 == b'h' { 1 } else { 4 }, &mut pos)? {
                Some(idx) => {
                    let idx = usize::try_from(idx).unwrap_or(usize::MAX);
                    if idx >= limits.max_container_len || idx > memo_len + 1024 {
                        // The second pass refuses this GET; nothing to record.
                        return Ok(fetched);
                    }
                    fetched.mark(idx);
                    true
                }
                None => false,
            },
            b'c' => {
                // Two lines (module, name); the second pass bounds their length.
                let mut lines = 0;
                while lines < 2 {
                    match arg(&mut input, 1, &mut pos)? {
                        Some(b) if b == u64::from(b'\n') => lines += 1,
                        Some(_) => {}
                        None => return Ok(fetched),
                    }
                }
                true
            }
            op if is_bare_for_the_first_pass(op) => true,
            _ => return Ok(fetched),
        };
        if !ok {
            return Ok(fetched);
        }
    }
}

/// Opcodes without an argument that the first pass only steps over: marks, pops, the
/// container builders, tuples, None, STACK_GLOBAL and REDUCE (their memo effects, if any,
/// come from the MEMOIZE/PUT that follows).
fn is_bare_for_the_first_pass(op: u8) -> bool {
    matches!(
        op,
        b'(' | b'0' | b'1' | b'2' | b'}' | b']' | b')' | b'd' | b'l' | b't' | 0x85
            ..=0x89 | b'a' | b'e' | b's' | b'u' | b'N' | 0x93 | b'R'
    )
}

/// One opcode of the first pass decoded from `buf` when it is whole there and common:
/// its length, or None to leave it to the slow path.
fn scan_one(
    buf: &[u8],
    fetched: &mut Fetched,
    memo_len: &mut usize,
    limits: Limits,
) -> Option<usize> {
    let op = *buf.first()?;
    let need = |n: usize| (buf.len() >= n).then_some(n);
    let le = |from: usize, n: usize| -> Option<usize> {
        let b = buf.get(from..from + n)?;
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(b);
        usize::try_from(u64::from_le_bytes(a)).ok()
    };
    match op {
        op if is_bare_for_the_first_pass(op) => Some(1),
        0x94 => {
            *memo_len += 1;
            Some(1)
        }
        0x80 | b'K' => need(2),
        b'M' => need(3),
        b'J' => need(5),
        0x95 | b'G' => need(9),
        0x8a | 0x8c | b'C' => need(2 + le(1, 1)?),
        0x8b | b'X' | b'B' => need(5usize.checked_add(le(1, 4)?)?),
        b'q' | b'r' => {
            let w = if op == b'q' { 1 } else { 4 };
            let idx = le(1, w)?;
            *memo_len = (*memo_len).max(idx.saturating_add(1));
            Some(1 + w)
        }
        b'h' | b'j' => {
            let w = if op == b'h' { 1 } else { 4 };
            let idx = le(1, w)?;
            if idx >= limits.max_container_len || idx > *memo_len + 1024 {
                return None;
            }
            fetched.mark(idx);
            Some(1 + w)
        }
        _ => None,
    }
}

/// Moves the children of containers no one else holds onto an explicit stack, so dropping
/// a value nested N deep takes O(1) native stack.
fn dismantle(mut pending: Vec<Value>) {
    while let Some(v) = pending.pop() {
        match v {
            Value::List(rc) | Value::Tuple(rc) => {
                if let Ok(items) = Rc::try_unwrap(rc) {
                    pending.append(&mut items.0.borrow_mut());
                }
            }
            Value::Dict(rc) => {
                if let Ok(pairs) = Rc::try_unwrap(rc) {
                    for (k, v) in pairs.0.borrow_mut().drain(..) {
                        pending.push(k);
                        pending.push(v);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Whether dropping `v` may recurse: a container that no one else holds. Leaves (strings,
/// numbers) and shared containers drop without recursion, so a dict of them — a frame, a
/// trace entry — is dropped in place without building a work list.
fn owns_container(v: &Value) -> bool {
    match v {
        Value::List(rc) | Value::Tuple(rc) => Rc::strong_count(rc) == 1,
        Value::Dict(rc) => Rc::strong_count(rc) == 1,
        _ => false,
    }
}

impl Drop for Items {
    fn drop(&mut self) {
        if !self.0.get_mut().iter().any(owns_container) {
            return;
        }
        dismantle(std::mem::take(self.0.get_mut()));
    }
}

impl Drop for Pairs {
    fn drop(&mut self) {
        if !self
            .0
            .get_mut()
            .iter()
            .any(|(k, v)| owns_container(k) || owns_container(v))
        {
            return;
        }
        let pairs = std::mem::take(self.0.get_mut());
        dismantle(pairs.into_iter().flat_map(|(k, v)| [k, v]).collect());
    }
}

/// Reads one pickle from `input` (stops at STOP; what follows is not read).
///
/// # Errors
/// Any [`PickleError`]: I/O, truncation, an opcode outside the supported set, a global
/// outside the allow-list, a structure that is not well formed, a limit exceeded.
pub fn read<R: BufRead>(input: R, limits: Limits) -> Result<Value, PickleError> {
    Machine::new(input, limits).run()
}

/// Reads one pickle as [`read`] does, keeping in the memo only the entries in `fetched`
/// (from [`scan_fetched`] over the same bytes) and handing completed device-trace
/// entries to `sink` as they are read. A GET of an entry that was not kept is an error
/// (the input differed from what the first pass read), never a wrong value.
///
/// # Errors
/// As [`read`], and [`PickleError::Malformed`] when a value given to the sink is changed
/// afterwards.
pub fn read_streaming<R: BufRead>(
    input: R,
    limits: Limits,
    fetched: Fetched,
    sink: &mut dyn TraceSink,
) -> Result<Value, PickleError> {
    let mut m = Machine::new(input, limits);
    m.fetched = Some(fetched);
    m.sink = Some(sink);
    m.run()
}

/// Reads a pickle from a byte slice.
///
/// # Errors
/// As [`read`].
pub fn from_slice(bytes: &[u8], limits: Limits) -> Result<Value, PickleError> {
    read(bytes, limits)
}

struct Machine<'s, R> {
    input: R,
    /// When set, memo entries outside it are not kept.
    fetched: Option<Fetched>,
    sink: Option<&'s mut dyn TraceSink>,
    pos: u64,
    limits: Limits,
    stack: Vec<Value>,
    /// Stack lengths at each MARK.
    marks: Vec<usize>,
    memo: Vec<Option<Value>>,
}

impl<R: BufRead> Machine<'_, R> {
    fn new(input: R, limits: Limits) -> Self {
        Self {
            input,
            fetched: None,
            sink: None,
            pos: 0,
            limits,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Vec::new(),
        }
    }

    fn malformed(&self, what: &'static str) -> PickleError {
        PickleError::Malformed { what, at: self.pos }
    }

    fn limit(&self, what: &'static str, limit: u64) -> PickleError {
        PickleError::Limit {
            what,
            limit,
            at: self.pos,
        }
    }

    fn advance(&mut self, n: u64) -> Result<(), PickleError> {
        self.pos += n;
        if self.pos > self.limits.max_total_bytes {
            return Err(self.limit("total size", self.limits.max_total_bytes));
        }
        Ok(())
    }

    fn byte(&mut self) -> Result<u8, PickleError> {
        let buf = self.input.fill_buf()?;
        let Some(&b) = buf.first() else {
            return Err(PickleError::Truncated(self.pos));
        };
        self.input.consume(1);
        self.advance(1)?;
        Ok(b)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        let mut a = [0u8; N];
        match self.input.read_exact(&mut a) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(PickleError::Truncated(self.pos));
            }
            Err(e) => return Err(e.into()),
        }
        self.advance(N as u64)?;
        Ok(a)
    }

    /// `n` bytes, read in pieces so that a hostile length allocates no more than the
    /// bytes actually present.
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, PickleError> {
        if self.pos.saturating_add(n) > self.limits.max_total_bytes {
            return Err(self.limit("total size", self.limits.max_total_bytes));
        }
        let mut out = Vec::with_capacity(usize::try_from(n.min(1 << 16)).unwrap_or(1 << 16));
        let got = (&mut self.input).take(n).read_to_end(&mut out)?;
        self.advance(got as u64)?;
        if (got as u64) < n {
            return Err(PickleError::Truncated(self.pos));
        }
        Ok(out)
    }

    fn string(&mut self, n: u64) -> Result<Value, PickleError> {
        let raw = self.bytes(n)?;
        // Python writes surrogates as-is ('surrogatepass'); a lossy decode keeps reading.
        // `from_utf8_lossy` borrows valid text, so a valid string is copied once, into the Rc.
        Ok(Value::Str(Rc::from(&*String::from_utf8_lossy(&raw))))
    }

    fn line(&mut self) -> Result<String, PickleError> {
        let mut out = Vec::new();
        loop {
            let b = self.byte()?;
            if b == b'\n' {
                break;
            }
            if out.len() >= 256 {
                return Err(self.malformed("a GLOBAL name longer than 256 bytes"));
            }
            out.push(b);
        }
        String::from_utf8(out).map_err(|_| self.malformed("a GLOBAL name that is not UTF-8"))
    }

    fn push(&mut self, v: Value) -> Result<(), PickleError> {
        if self.stack.len() >= self.limits.max_container_len {
            return Err(self.limit("stack length", self.limits.max_container_len as u64));
        }
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self) -> Result<Value, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.malformed("pop from an empty stack (or across a MARK)"));
        }
        self.stack
            .pop()
            .ok_or_else(|| self.malformed("pop from an empty stack"))
    }

    fn top(&self) -> Result<&Value, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.malformed("no value on the stack"));
        }
        self.stack
            .last()
            .ok_or_else(|| self.malformed("no value on the stack"))
    }

    /// The values above the last MARK, and the MARK removed.
    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let Some(at) = self.marks.pop() else {
            return Err(self.malformed("no MARK to pop to"));
        };
        Ok(self.stack.split_off(at))
    }

    fn memo_put(&mut self, idx: usize) -> Result<(), PickleError> {
        let v = self.top()?.clone();
        // Writers number memo entries 0, 1, 2, …; a jump ahead would let a few bytes
        // allocate a huge memo.
        if idx > self.memo.len() + 1024 {
            return Err(self.malformed("a memo index far beyond the entries so far"));
        }
        if idx >= self.limits.max_container_len {
            return Err(self.limit("memo length", self.limits.max_container_len as u64));
        }
        if idx >= self.memo.len() {
            self.memo.resize(idx + 1, None);
        }
        let keep = self.fetched.as_ref().is_none_or(|f| f.contains(idx));
        self.memo[idx] = keep.then_some(v);
        Ok(())
    }

    fn memo_get(&mut self, idx: usize) -> Result<(), PickleError> {
        let v = self
            .memo
            .get(idx)
            .and_then(Clone::clone)
            .ok_or_else(|| {
                self.malformed("a memo reference to an entry never stored (or not kept because the first pass saw no reference to it: did the file change while being read?)")
            })?;
        self.push(v)
    }

    fn check_len(&self, len: usize) -> Result<(), PickleError> {
        if len > self.limits.max_container_len {
            return Err(self.limit("container length", self.limits.max_container_len as u64));
        }
        Ok(())
    }

    /// Whether the list on top of the stack is `top_dict["device_traces"][i]` while the
    /// pickle is being read: the stack then holds the top dict at 0 (its SETITEMS MARK at
    /// 1), the key `device_traces` at an even offset from that MARK, the outer list, and
    /// the per-device list either right after the outer list or in the batch above the
    /// outer list's APPENDS MARK.
    fn in_device_traces(&self) -> bool {
        let n = self.stack.len();
        let is_key = |k: usize| {
            k >= 1
                && (k - 1) % 2 == 0
                && matches!(&self.stack[0], Value::Dict(_))
                && self.stack[k]
                    .as_str()
                    .is_some_and(|s| &**s == "device_traces")
        };
        let outer_is_list = |o: usize| matches!(&self.stack[o], Value::List(_));
        match self.marks.as_slice() {
            [1] => n >= 3 && outer_is_list(n - 2) && is_key(n - 3),
            [1, m] => *m >= 3 && *m < n && outer_is_list(*m - 1) && is_key(*m - 2),
            _ => false,
        }
    }

    fn extend_list(&mut self, items: Vec<Value>) -> Result<(), PickleError> {
        let target = self.top()?.clone();
        match target {
            Value::List(l) => {
                if l.1.get() {
                    return Err(self.malformed("APPEND to a list already read as a trace entry"));
                }
                if self.sink.is_some() && l.0.borrow().is_empty() && self.in_device_traces() {
                    self.check_len(items.len())?;
                    for it in &items {
                        freeze(it, 3);
                    }
                    if let Some(sink) = self.sink.as_mut() {
                        sink.trace_items(&l, items);
                    }
                    return Ok(());
                }
                let mut v = l.0.borrow_mut();
                self.check_len(v.len() + items.len())?;
                v.extend(items);
                Ok(())
            }
            _ => Err(self.malformed("APPEND to something that is not a list")),
        }
    }

    fn set_items(&mut self, items: Vec<Value>) -> Result<(), PickleError> {
        if items.len() % 2 != 0 {
            return Err(self.malformed("SETITEMS with an odd number of values"));
        }
        let target = self.top()?.clone();
        match target {
            Value::Dict(d) => {
                if d.1.get() {
                    return Err(self.malformed("SETITEM on a dict already read as a trace entry"));
                }
                let mut pairs = d.0.borrow_mut();
                self.check_len(pairs.len() + items.len() / 2)?;
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    pairs.push((k, v));
                }
                Ok(())
            }
            _ => Err(self.malformed("SETITEM on something that is not a dict")),
        }
    }

    fn tuple(items: Vec<Value>) -> Value {
        Value::Tuple(Rc::new(Items(RefCell::new(items), Cell::new(false))))
    }

    fn run(mut self) -> Result<Value, PickleError> {
        loop {
            let at = self.pos;
            let op = self.byte()?;
            match op {
                0x80 => {
                    let proto = self.byte()?;
                    if !(2..=5).contains(&proto) {
                        return Err(PickleError::Protocol(proto));
                    }
                }
                // FRAME: a length hint for buffering; the stream is read the same either way.
                0x95 => {
                    self.array::<8>()?;
                }
                b'.' => {
                    // STOP
                    let v = self.pop()?;
                    if !self.marks.is_empty() {
                        return Err(self.malformed("STOP inside a MARK"));
                    }
                    return Ok(v);
                }
                b'(' => {
                    if self.marks.len() >= self.limits.max_depth {
                        return Err(self.limit("nesting depth", self.limits.max_depth as u64));
                    }
                    self.marks.push(self.stack.len());
                }
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = self.top()?.clone();
                    self.push(v)?;
                }
                b'}' => self.push(Value::Dict(Rc::default()))?,
                b']' => self.push(Value::List(Rc::default()))?,
                b')' => self.push(Self::tuple(Vec::new()))?,
                b'd' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Dict(Rc::default()))?;
                    self.set_items(items)?;
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Value::List(Rc::new(Items(
                        RefCell::new(items),
                        Cell::new(false),
                    ))))?;
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Self::tuple(items))?;
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return Err(self.malformed("TUPLE1/2/3 with too few values"));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.push(Self::tuple(items))?;
                }
                b'a' => {
                    let v = self.pop()?;
                    self.extend_list(vec![v])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.extend_list(items)?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.set_items(items)?;
                }
                b'N' => self.push(Value::None)?,
                0x88 => self.push(Value::Bool(true))?,
                0x89 => self.push(Value::Bool(false))?,
                b'J' => {
                    let v = i32::from_le_bytes(self.array()?);
                    self.push(Value::Int(i64::from(v)))?;
                }
                b'K' => {
                    let v = self.byte()?;
                    self.push(Value::Int(i64::from(v)))?;
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.array()?);
                    self.push(Value::Int(i64::from(v)))?;
                }
                0x8a => {
                    let n = self.byte()?;
                    let raw = self.bytes(u64::from(n))?;
                    self.push(long(&raw))?;
                }
                0x8b => {
                    let n = u32::from_le_bytes(self.array()?);
                    let raw = self.bytes(u64::from(n))?;
                    self.push(long(&raw))?;
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.array()?);
                    self.push(Value::Float(v))?;
                }
                0x8c => {
                    let n = self.byte()?;
                    let s = self.string(u64::from(n))?;
                    self.push(s)?;
                }
                b'X' => {
                    let n = u32::from_le_bytes(self.array()?);
                    let s = self.string(u64::from(n))?;
                    self.push(s)?;
                }
                0x8d => {
                    let n = u64::from_le_bytes(self.array()?);
                    let s = self.string(n)?;
                    self.push(s)?;
                }
                b'C' => {
                    let n = self.byte()?;
                    let b = self.bytes(u64::from(n))?;
                    self.push(Value::Bytes(Rc::from(b)))?;
                }
                b'B' => {
                    let n = u32::from_le_bytes(self.array()?);
                    let b = self.bytes(u64::from(n))?;
                    self.push(Value::Bytes(Rc::from(b)))?;
                }
                0x8e => {
                    let n = u64::from_le_bytes(self.array()?);
                    let b = self.bytes(n)?;
                    self.push(Value::Bytes(Rc::from(b)))?;
                }
                0x94 => {
                    let idx = self.memo.len();
                    self.memo_put(idx)?;
                }
                b'q' => {
                    let idx = self.byte()?;
                    self.memo_put(usize::from(idx))?;
                }
                b'r' => {
                    let idx = u32::from_le_bytes(self.array()?);
                    self.memo_put(idx as usize)?;
                }
                b'h' => {
                    let idx = self.byte()?;
                    self.memo_get(usize::from(idx))?;
                }
                b'j' => {
                    let idx = u32::from_le_bytes(self.array()?);
                    self.memo_get(idx as usize)?;
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    let g = Global::allowed(&module, &name)
                        .ok_or(PickleError::GlobalNotAllowed { module, name, at })?;
                    self.push(Value::Callable(g))?;
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (Some(module), Some(name)) = (module.as_str(), name.as_str()) else {
                        return Err(self.malformed("STACK_GLOBAL of values that are not strings"));
                    };
                    let g = Global::allowed(module, name).ok_or_else(|| {
                        PickleError::GlobalNotAllowed {
                            module: module.to_string(),
                            name: name.to_string(),
                            at,
                        }
                    })?;
                    self.push(Value::Callable(g))?;
                }
                b'R' => {
                    let args = self.pop()?;
                    let Value::Callable(g) = self.pop()? else {
                        return Err(self.malformed("REDUCE of something that is not a global"));
                    };
                    let args = args
                        .as_seq()
                        .map(|a| a.0.borrow().clone())
                        .ok_or_else(|| self.malformed("REDUCE arguments that are not a tuple"))?;
                    let v = g.call(args).ok_or_else(|| {
                        self.malformed("arguments the allow-listed global does not take")
                    })?;
                    self.push(v)?;
                }
                _ => return Err(PickleError::BadOpcode { opcode: op, at }),
            }
        }
    }
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

    fn call(self, args: Vec<Value>) -> Option<Value> {
        match (self, args.as_slice()) {
            (Self::OrderedDict, []) => Some(Value::Dict(Rc::default())),
            (Self::BuildList, [l @ Value::List(_)]) => Some(l.clone()),
            (Self::RestoreTypeTag, [v, Value::Str(_)]) => Some(v.clone()),
            _ => None,
        }
    }
}

/// LONG1/LONG4: little-endian two's complement.
fn long(raw: &[u8]) -> Value {
    if raw.is_empty() {
        return Value::Int(0);
    }
    if raw.len() <= 8 {
        let fill = if raw[raw.len() - 1] & 0x80 != 0 {
            0xff
        } else {
            0
        };
        let mut a = [fill; 8];
        a[..raw.len()].copy_from_slice(raw);
        return Value::Int(i64::from_le_bytes(a));
    }
    Value::BigInt(Rc::from(raw))
}
