//! Malformed and hostile pickles: a clear error, never a panic, memory bounded by the input;
//! a proptest harness over random bytes and mutated fixtures (bounded cases, run in CI).
//! Also the OOM replay on a hand-made trace.

use proptest::prelude::*;
use vramctl_snapshot::pickle::{
    self, Arena, Document, Limits, ListSink, Obj, ObjId, PickleError, V,
};
use vramctl_snapshot::{Snapshot, TraceStacks, model, summarize};

fn read(bytes: &[u8]) -> Result<Document, PickleError> {
    pickle::from_slice(bytes, Limits::default())
}

#[test]
fn unknown_opcode_is_an_error_naming_it() {
    let err = read(b"\x80\x04\xff.").expect_err("bad opcode");
    assert!(
        matches!(
            err,
            PickleError::BadOpcode {
                opcode: 0xff,
                at: 2
            }
        ),
        "{err}"
    );
}

#[test]
fn protocol_outside_two_to_five_is_refused() {
    assert!(matches!(read(b"\x80\x06N."), Err(PickleError::Protocol(6))));
}

#[test]
fn globals_outside_the_allow_list_are_refused_not_called() {
    let err = read(b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.").expect_err("os.system");
    assert!(
        matches!(&err, PickleError::GlobalNotAllowed { module, name, .. } if module == "os" && name == "system"),
        "{err}"
    );
    assert!(err.to_string().contains("'os.system'"));
    // STACK_GLOBAL (protocol 4) too.
    let err = read(b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93.").expect_err("eval");
    assert!(matches!(err, PickleError::GlobalNotAllowed { .. }), "{err}");
    // BUILD, NEWOBJ, INST, OBJ are not in the reader at all.
    for op in [b'b', 0x81, b'i', b'o'] {
        assert!(read(&[0x80, 4, b']', op, b'.']).is_err());
    }
}

#[test]
fn ordered_dict_is_built_without_importing_anything() {
    let d = read(b"\x80\x04\x8c\x0bcollections\x8c\x0bOrderedDict\x93)R\x8c\x01kK\x01s.")
        .expect("OrderedDict");
    assert_eq!(d.arena.get(d.top, "k").and_then(V::as_int), Some(1));
}

#[test]
fn every_truncation_of_a_fixture_is_an_error() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/h200/snapshots/snap.pickle"
    );
    let bytes = std::fs::read(path).expect("fixture");
    for cut in (0..bytes.len() - 1).step_by(389) {
        let err = read(&bytes[..cut]).expect_err("truncated");
        assert!(matches!(err, PickleError::Truncated(_)), "cut {cut}: {err}");
    }
    assert!(read(&bytes).is_ok());
}

#[test]
fn huge_declared_lengths_allocate_only_what_is_there() {
    // BINUNICODE8 / BINBYTES8 of 2^60 bytes with 3 bytes behind: over the total-size limit.
    for op in [0x8d, 0x8e] {
        let mut p = vec![0x80, 4, op];
        p.extend_from_slice(&(1u64 << 60).to_le_bytes());
        p.extend_from_slice(b"abc");
        assert!(matches!(read(&p), Err(PickleError::Limit { .. })));
    }
    // 1 GiB declared, within the limit, 3 bytes present: truncated, not a 1 GiB buffer.
    let mut p = vec![0x80, 4, 0x8d];
    p.extend_from_slice(&(1u64 << 30).to_le_bytes());
    p.extend_from_slice(b"abc");
    assert!(matches!(read(&p), Err(PickleError::Truncated(_))));
}

#[test]
fn a_memo_index_far_ahead_is_refused() {
    let err = read(b"\x80\x02]r\xff\xff\xff\xff.").expect_err("memo jump");
    assert!(matches!(err, PickleError::Malformed { .. }), "{err}");
    assert!(read(b"\x80\x02h\x05.").is_err(), "BINGET of nothing stored");
}

#[test]
fn deep_nesting_is_dropped_without_overflowing_the_stack() {
    // A million lists, each appended into the one below: nested a million deep.
    let depth = 1_000_000;
    let mut p = vec![0x80, 4];
    p.extend(std::iter::repeat_n(b']', depth));
    p.extend(std::iter::repeat_n(b'a', depth - 1));
    p.push(b'.');
    let d = read(&p).expect("nested lists are data");
    assert_eq!(d.arena.len(), depth);
    drop(d);
    // MARKs nest as deep as the limit only.
    let mut p = vec![0x80, 4];
    p.extend(std::iter::repeat_n(b'(', 10_000));
    assert!(matches!(read(&p), Err(PickleError::Limit { .. })));
}

#[test]
fn total_size_limit_holds() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/h200/snapshots/snap.pickle"
    );
    let bytes = std::fs::read(path).expect("fixture");
    let limits = Limits {
        max_total_bytes: 50_000,
        ..Limits::default()
    };
    assert!(matches!(
        pickle::from_slice(&bytes, limits),
        Err(PickleError::Limit { .. })
    ));
}

#[test]
fn container_length_limit_holds() {
    let limits = Limits {
        max_container_len: 3,
        ..Limits::default()
    };
    let err = pickle::from_slice(b"\x80\x04](K\x01K\x02K\x03K\x04e.", limits).expect_err("4 > 3");
    assert!(matches!(err, PickleError::Limit { .. }), "{err}");
}

#[test]
fn shared_references_stay_shared() {
    // pickle.dumps([a, a], protocol=4) with a = ['x']: the case serde-pickle refuses.
    let d = read(b"\x80\x04\x95\x0e\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94\x8c\x01x\x94ah\x01e.")
        .expect("shared list");
    let items = d.arena.seq(d.top).expect("list");
    let [V::List(a), V::List(b)] = items else {
        panic!("two lists: {items:?}");
    };
    assert_eq!(a, b, "one list, referred to twice");
}

#[test]
fn a_self_containing_list_does_not_hang() {
    // l = []; l.append(l)
    let p = b"\x80\x04]\x94h\x00a.";
    let d = read(p).expect("recursive list");
    assert_eq!(d.arena.seq(d.top), Some(&[d.top][..]));
    // Its element is a list, not a segment dict.
    assert!(model::read(&p[..], Limits::default()).is_err());
}

#[test]
fn non_snapshot_pickles_are_refused_clearly() {
    let err = model::read(&b"\x80\x04K\x01."[..], Limits::default()).expect_err("int");
    assert!(
        err.to_string().starts_with("not an allocator snapshot"),
        "{err}"
    );
    let err = model::read(&b"\x80\x04}."[..], Limits::default()).expect_err("{}");
    assert!(err.to_string().contains("'segments'"), "{err}");
}

/// A tiny protocol-4 writer for hand-made snapshots.
#[derive(Clone)]
enum P {
    I(i64),
    S(&'static str),
    L(Vec<P>),
    D(Vec<(&'static str, P)>),
    /// The value, stored in the memo at this index (LONG_BINPUT; indices from 0 in order).
    Put(u32, Box<P>),
    /// The value stored at this memo index (LONG_BINGET): a shared reference.
    Get(u32),
}

fn emit(p: &P, out: &mut Vec<u8>) {
    match p {
        P::I(i) => {
            out.push(0x8a);
            out.push(8);
            out.extend_from_slice(&i.to_le_bytes());
        }
        P::S(s) => {
            out.push(0x8c);
            out.push(u8::try_from(s.len()).expect("short"));
            out.extend_from_slice(s.as_bytes());
        }
        P::L(items) => {
            out.push(b']');
            if !items.is_empty() {
                out.push(b'(');
                items.iter().for_each(|i| emit(i, out));
                out.push(b'e');
            }
        }
        P::D(pairs) => {
            out.push(b'}');
            out.push(b'(');
            for (k, v) in pairs {
                emit(&P::S(k), out);
                emit(v, out);
            }
            out.push(b'u');
        }
        P::Put(idx, v) => {
            emit(v, out);
            out.push(b'r');
            out.extend_from_slice(&idx.to_le_bytes());
        }
        P::Get(idx) => {
            out.push(b'j');
            out.extend_from_slice(&idx.to_le_bytes());
        }
    }
}

fn pickle_of(p: &P) -> Vec<u8> {
    let mut out = vec![0x80, 4];
    emit(p, &mut out);
    out.push(b'.');
    out
}

const MIB: i64 = 1 << 20;
const A: i64 = 0x7f00_0000_0000;

fn event(action: &'static str, addr: i64, size: i64) -> P {
    P::D(vec![
        ("action", P::S(action)),
        ("addr", P::I(addr)),
        ("size", P::I(size)),
        ("stream", P::I(0)),
    ])
}

/// One 20 MiB segment, wholly free at the end; at the OOM an 8 MiB and a 4 MiB block were
/// live at its start, so only 8 MiB were contiguous for a 10 MiB request.
fn fragmented_oom(expandable: bool) -> Vec<u8> {
    pickle_of(&P::D(vec![
        (
            "segments",
            P::L(vec![P::D(vec![
                ("device", P::I(0)),
                ("address", P::I(A)),
                ("total_size", P::I(20 * MIB)),
                ("allocated_size", P::I(0)),
                ("active_size", P::I(0)),
                ("requested_size", P::I(0)),
                ("stream", P::I(0)),
                ("segment_type", P::S("large")),
                (
                    "blocks",
                    P::L(vec![P::D(vec![
                        ("address", P::I(A)),
                        ("size", P::I(20 * MIB)),
                        ("requested_size", P::I(0)),
                        ("state", P::S("inactive")),
                    ])]),
                ),
            ])]),
        ),
        (
            "device_traces",
            P::L(vec![P::L(vec![
                event("segment_alloc", A, 20 * MIB),
                event("alloc", A, 8 * MIB),
                event("alloc", A + 8 * MIB, 4 * MIB),
                P::D(vec![
                    ("action", P::S("oom")),
                    ("size", P::I(10 * MIB)),
                    ("device_free", P::I(4 * MIB)),
                    ("stream", P::I(0)),
                ]),
                event("free_requested", A, 8 * MIB),
                event("free_completed", A, 8 * MIB),
                event("free_completed", A + 8 * MIB, 4 * MIB),
            ])]),
        ),
        (
            "allocator_settings",
            P::D(vec![(
                "PYTORCH_CUDA_ALLOC_CONF",
                P::S(if expandable {
                    "expandable_segments:True"
                } else {
                    ""
                }),
            )]),
        ),
    ]))
}

#[test]
fn oom_measures_the_free_block_at_the_oom_not_at_the_end() {
    let snap = model::read(&fragmented_oom(false)[..], Limits::default()).expect("snapshot");
    let s = summarize(&snap);
    assert_eq!(
        s.devices[0].totals.largest_free_block_bytes,
        20 << 20,
        "at the end"
    );
    let o = &s.oom[0];
    assert!(o.replayed);
    assert_eq!(o.largest_free_block_bytes, 8 << 20);
    assert_eq!(o.free_bytes, 8 << 20);
    assert_eq!(o.inactive_split_bytes, 8 << 20);
    assert_eq!(o.inactive_split_segments, 1);
    // 12 MiB live + the 10 MiB request fit in the 24 MiB the process could get (20
    // reserved + 4 free on the device), but no block holds 10 MiB: fragmentation. No fix:
    // the replay says the default allocator fails here, and so would expandable segments
    // (the next 20 MiB page does not fit in the 4 MiB the device had) and max_split_size
    // (the segment is the only one). The advice this test once expected,
    // expandable_segments:True, counted the 8 MiB and the 4 MiB as one block (issue 33).
    assert_eq!(o.verdict.cause.as_str(), "fragmentation", "{:?}", o.verdict);
    assert_eq!(o.verdict.fix, None, "{:?}", o.verdict);
    let tried: Vec<(&str, &str)> = o
        .verdict
        .evidence
        .counterfactuals
        .iter()
        .map(|c| (c.setting.as_str(), c.outcome))
        .collect();
    assert_eq!(
        tried[0],
        ("as recorded", "fails"),
        "the model reproduces the OOM"
    );
    assert!(
        tried.contains(&("expandable_segments:True", "fails")),
        "{tried:?}"
    );
    assert_eq!(s.advice.len(), 1);
    assert_eq!(s.advice[0].setting, "none");
    assert!(
        s.advice[0].reason.contains("10.00 MiB request"),
        "{}",
        s.advice[0].reason
    );
}

/// Cases per property: the default (what CI runs on every push, a few seconds) times
/// `VRAMCTL_FUZZ_SCALE` for a longer run (docs/snapshot.md gives the figure of one).
/// The one-pass reading (trace entries typed while read, their dicts freed) never panics,
/// and when it gives a snapshot, it is the one the whole-tree reading gives.
/// Reading without the trace entries' stacks gives the same snapshot but for those stacks
/// (empty, or the same frames where a block holds the list too) whenever both readings
/// succeed (what it does not read, it cannot find wrong: a broken trace stack fails only
/// the full reading).
fn streamed_agrees(bytes: &[u8]) {
    if let Ok(streamed) = model::from_slice(bytes, Limits::default()) {
        let whole = model::read(bytes, Limits::default()).expect("streamed read, whole did not");
        assert_eq!(
            serde_json::to_string(&streamed).expect("json"),
            serde_json::to_string(&whole).expect("json")
        );
    }
    if let (Ok(skipped), Ok(full)) = (
        model::read_streamed(bytes, Limits::default(), TraceStacks::Skip),
        model::read(bytes, Limits::default()),
    ) {
        same_but_trace_stacks(&skipped, &full);
    }
}

/// The frames of a stack, as text.
fn frames_of(s: &Snapshot, stack: u32) -> Vec<String> {
    s.stacks[stack as usize]
        .iter()
        .map(|&f| format!("{:?}", s.frames[f as usize]))
        .collect()
}

pub fn same_but_trace_stacks(skipped: &Snapshot, full: &Snapshot) {
    assert_eq!(
        serde_json::to_string(&summarize(skipped)).expect("json"),
        serde_json::to_string(&summarize(full)).expect("json")
    );
    assert_eq!(skipped.segments.len(), full.segments.len());
    for (a, b) in skipped.segments.iter().zip(&full.segments) {
        assert_eq!(frames_of(skipped, a.stack), frames_of(full, b.stack));
        assert_eq!(a.blocks.len(), b.blocks.len());
        for (x, y) in a.blocks.iter().zip(&b.blocks) {
            assert_eq!(frames_of(skipped, x.stack), frames_of(full, y.stack));
        }
    }
    assert_eq!(skipped.device_traces.len(), full.device_traces.len());
    for (a, b) in skipped.device_traces.iter().zip(&full.device_traces) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(
                (
                    &x.action,
                    x.addr,
                    x.size,
                    x.stream,
                    x.time_us,
                    x.device_free
                ),
                (
                    &y.action,
                    y.addr,
                    y.size,
                    y.stream,
                    y.time_us,
                    y.device_free
                )
            );
            let fx = frames_of(skipped, x.stack);
            assert!(fx.is_empty() || fx == frames_of(full, y.stack));
        }
    }
}

fn cases(default: u32) -> u32 {
    let scale = std::env::var("VRAMCTL_FUZZ_SCALE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1);
    default.saturating_mul(scale.max(1))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(512), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(snap) = model::read(&bytes[..], Limits::default()) {
            let _ = summarize(&snap);
        }
        streamed_agrees(&bytes);
    }

    #[test]
    fn random_bytes_after_a_header_never_panic(bytes in proptest::collection::vec(
        prop_oneof![Just(b']'), Just(b'}'), Just(b'('), Just(b'e'), Just(b'u'), Just(b'a'),
                    Just(b's'), Just(0x94u8), Just(b'h'), Just(b'K'), Just(0x8c), Just(b'.'),
                    Just(0x85), Just(0x86), Just(b'N'), Just(0x8a), any::<u8>()],
        0..256)) {
        let mut p = vec![0x80, 4];
        p.extend(bytes);
        let _ = model::read(&p[..], Limits::default()).map(|s| summarize(&s));
        streamed_agrees(&p);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(64), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_fixtures_never_panic(edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut bytes = fragmented_oom(false);
        for (at, b) in &edits {
            let i = at % bytes.len();
            bytes[i] = *b;
        }
        if let Ok(snap) = model::read(&bytes[..], Limits::default()) {
            let _ = summarize(&snap);
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/h200/snapshots/snap.pickle");
        let mut big = std::fs::read(path).expect("fixture");
        for (at, b) in &edits {
            let i = at % big.len();
            big[i] = *b;
        }
        streamed_agrees(&bytes);
        streamed_agrees(&big);
        if let Ok(snap) = model::read(&big[..], Limits::default()) {
            let _ = summarize(&snap);
            // The replay behind timeline and --at, over whatever trace survived.
            let _ = vramctl_snapshot::timeline::timeline(&snap, 4, 64);
        }
    }
}

#[test]
fn sizes_near_the_integer_limit_saturate_instead_of_overflowing() {
    let seg = |addr: i64| {
        P::D(vec![
            ("address", P::I(addr)),
            ("total_size", P::I(i64::MAX)),
            ("allocated_size", P::I(i64::MAX)),
            ("active_size", P::I(i64::MAX)),
            (
                "blocks",
                P::L(vec![
                    P::D(vec![("size", P::I(i64::MAX)), ("state", P::S("inactive"))]),
                    P::D(vec![("size", P::I(i64::MAX)), ("state", P::S("inactive"))]),
                ]),
            ),
        ])
    };
    let p = pickle_of(&P::D(vec![(
        "segments",
        P::L(vec![seg(i64::MAX), seg(i64::MAX - 1), seg(0)]),
    )]));
    let snap = model::read(&p[..], Limits::default()).expect("snapshot");
    let s = summarize(&snap);
    assert_eq!(s.devices[0].totals.reserved_bytes, u64::MAX);
    assert_eq!(s.devices[0].totals.free_bytes, u64::MAX);
}

/// Counts what the reader streams, keeping nothing.
struct Counting(usize);

impl ListSink for Counting {
    fn key(&self) -> u32 {
        0 // "device_traces", the first known string
    }
    fn take(&mut self, _: &mut Arena, _: ObjId, items: &[V], _: u64) -> Result<(), PickleError> {
        self.0 += items.len();
        Ok(())
    }
}

#[test]
fn trace_entries_are_handed_to_the_sink_and_not_kept_in_the_arena() {
    let bytes = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/h200/snapshots/snap.pickle"),
    )
    .expect("fixture");
    let mut sink = Counting(0);
    let d = pickle::read(
        &bytes[..],
        Limits::default(),
        pickle::Interner::with_known(&["device_traces"]),
        Some(&mut sink),
    )
    .expect("pickle");
    assert_eq!(sink.0, 436, "every entry of device_traces[0]");
    let traces = d.arena.get(d.top, "device_traces").expect("device_traces");
    let dev0 = d.arena.seq(traces).expect("list")[0];
    assert_eq!(d.arena.seq(dev0), Some(&[][..]));
    // Segments are not trace entries: they stay in the arena.
    let segs = d.arena.get(d.top, "segments").expect("segments");
    assert_eq!(d.arena.seq(segs).expect("list").len(), 7);
}

/// top = {'device_traces': [[entry]]}, then the entry is fetched from the memo and given
/// one more key after the model has read it: refused, so the one-pass reading never
/// differs from the file's final value.
#[test]
fn a_trace_entry_changed_after_it_was_streamed_is_refused() {
    let mut p =
        b"\x80\x04}\x94(\x8c\x0ddevice_traces]]}\x94\x8c\x06action\x8c\x05allocsaa".to_vec();
    p.extend_from_slice(b"h\x01\x8c\x04sizeK\x05s0u.");
    // Read whole, the pickle is fine (the entry has both keys).
    let whole = read(&p).expect("whole");
    let traces = whole
        .arena
        .get(whole.top, "device_traces")
        .expect("device_traces");
    let dev0 = whole.arena.seq(traces).expect("list")[0];
    let entry = whole.arena.seq(dev0).expect("list")[0];
    assert_eq!(whole.arena.get(entry, "size").and_then(V::as_int), Some(5));
    let err = model::from_slice(&p, Limits::default()).expect_err("changed after read");
    assert!(err.to_string().contains("already read"), "{err}");
    assert!(matches!(whole.arena.obj(0), Obj::Dict(_)));
}

/// Streamed frame lists are freed once their entry is converted: stacks are told apart by
/// their frames' content, and each frame list read as a stack keeps its id.
#[test]
fn frame_lists_freed_while_streaming_are_not_confused_by_their_address() {
    let entries: Vec<P> = (0..3000)
        .map(|i| {
            P::D(vec![
                ("action", P::S("alloc")),
                ("addr", P::I(A + i * MIB)),
                ("size", P::I(MIB)),
                (
                    "frames",
                    P::L(vec![P::D(vec![
                        ("filename", P::S("train.py")),
                        ("line", P::I(i % 97)),
                        ("name", P::S("step")),
                    ])]),
                ),
            ])
        })
        .collect();
    let bytes = pickle_of(&P::D(vec![
        ("segments", P::L(vec![])),
        ("device_traces", P::L(vec![P::L(entries)])),
    ]));
    let file = std::env::temp_dir().join(format!("vramctl-stream-{}.pickle", std::process::id()));
    std::fs::write(&file, &bytes).expect("write");
    let streamed = model::open(&file, Limits::default()).expect("open");
    let _ = std::fs::remove_file(&file);
    let whole = model::read(&bytes[..], Limits::default()).expect("read");
    assert_eq!(
        streamed.stacks.len(),
        98,
        "97 distinct stacks and the empty one"
    );
    assert_eq!(
        serde_json::to_string(&streamed).expect("json"),
        serde_json::to_string(&whole).expect("json")
    );
    for (i, e) in streamed.device_traces[0].iter().enumerate() {
        let frame = streamed.stacks[e.stack as usize][0] as usize;
        assert_eq!(streamed.frames[frame].line, (i % 97) as i64);
    }
}

/// The synthetic 6,000-entry snapshot (testdata/h200/snapshots/synthetic-6000.pickle.gz)
/// in frames of 2 KiB, so that a reading on a few threads takes many parts in.
fn framed_synthetic() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/h200/snapshots/synthetic-6000.pickle.gz"
        );
        let raw = std::fs::read(path).expect("fixture");
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(&raw[..]), &mut bytes)
            .expect("gzip");
        pickle::reframe(&bytes, 2048).expect("protocol 4")
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(64), failure_persistence: None, ..ProptestConfig::default() })]

    /// Damaged anywhere, a snapshot read on several threads gives what one reading gives:
    /// the same snapshot, or an error where one reading has one too (a part that meets
    /// anything unusual is dropped and its bytes read by the main reading).
    #[test]
    fn the_parallel_reading_of_damaged_files_agrees_with_one_reading(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        threads in 2usize..6,
    ) {
        let mut bytes = framed_synthetic().to_vec();
        let len = bytes.len();
        for (at, b) in &edits {
            bytes[at % len] = *b;
        }
        let par = pickle::Parallelism { threads, min_chunk_bytes: 1 };
        let parallel = model::read_parallel(&bytes, Limits::default(), par);
        let one = model::read_streamed(&bytes[..], Limits::default(), TraceStacks::Skip);
        match (parallel, one) {
            (Ok(p), Ok(o)) => assert_eq!(
                serde_json::to_string(&p).expect("json"),
                serde_json::to_string(&o).expect("json")
            ),
            (Err(_), Err(_)) => {}
            (p, o) => panic!("parallel: {:?}, one reading: {:?}", p.err(), o.err()),
        }
    }
}

/// Counts the bytes each thread allocates, so that a test measures the memory a reading
/// and its analysis take (on the test's own thread: `model::read` and the analyses run on
/// the caller's thread) without the other tests running beside it.
struct CountingAlloc;

thread_local! {
    static ALLOCATED_BYTES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn count(bytes: usize) {
    // `try_with`: nothing to count once the thread's locals are gone.
    let _ = ALLOCATED_BYTES.try_with(|a| a.set(a.get().saturating_add(bytes as u64)));
}

// Safety: every call is passed on to the system allocator unchanged; counting touches a
// thread-local `Cell` that neither allocates nor has a destructor.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size());
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        count(new.saturating_sub(layout.size()));
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// What `f` returns, and the bytes this thread allocated while it ran.
fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = ALLOCATED_BYTES.with(std::cell::Cell::get);
    let out = f();
    (out, ALLOCATED_BYTES.with(std::cell::Cell::get) - before)
}

/// Everything `vramctl snapshot FILE` and `snapshot timeline` compute from a file: the
/// reading, the summary (with its OOM replay), `--top` by each grouping, the collapsed
/// stacks and the timeline. Its error, when the reading refuses the file.
fn analyse(bytes: &[u8]) -> Result<usize, String> {
    use vramctl_snapshot::top::{self, By};
    let snap = model::read(bytes, Limits::default()).map_err(|e| e.to_string())?;
    let s = summarize(&snap);
    let mut n = s.oom.len() + s.damaged.len();
    for by in [By::Stack, By::Frame, By::File] {
        n += top::top(&snap, by, 20).0.len();
    }
    n += top::collapsed(&snap).len();
    n += vramctl_snapshot::timeline::timeline(&snap, 5, 200)
        .devices
        .len();
    Ok(n)
}

fn block(i: i64, frames: Option<P>) -> P {
    let mut pairs = vec![
        ("address", P::I(A + 512 * i)),
        ("size", P::I(512)),
        ("requested_size", P::I(500)),
        ("state", P::S("active_allocated")),
    ];
    if let Some(f) = frames {
        pairs.push(("frames", f));
    }
    P::D(pairs)
}

fn segment(address: i64, n_blocks: i64, blocks: P) -> P {
    P::D(vec![
        ("device", P::I(0)),
        ("address", P::I(address)),
        ("total_size", P::I(512 * n_blocks)),
        ("stream", P::I(0)),
        ("segment_type", P::S("large")),
        ("blocks", blocks),
    ])
}

fn snapshot_of(segments: Vec<P>, trace: Vec<P>) -> Vec<u8> {
    pickle_of(&P::D(vec![
        ("segments", P::L(segments)),
        ("device_traces", P::L(vec![P::L(trace)])),
    ]))
}

/// The hostile shapes of issue 29, each with `n` shared references (the file grows
/// linearly with `n`), and whether torch could have written it (then it must be read).
fn shared_reference_files(n: i64) -> Vec<(&'static str, Vec<u8>, bool)> {
    let blocks = |n| P::L((0..n).map(|i| block(i, None)).collect());
    // One frame list of n frames, memo index 0, then referred to again.
    let frames = P::Put(
        0,
        Box::new(P::L(
            (0..n)
                .map(|i| {
                    P::D(vec![
                        ("filename", P::S("/home/u/train.py")),
                        ("line", P::I(i)),
                        ("name", P::S("step")),
                    ])
                })
                .collect(),
        )),
    );
    vec![
        (
            // One segment of n blocks, listed n times.
            "one segment listed n times",
            snapshot_of(
                std::iter::once(P::Put(0, Box::new(segment(A, n, blocks(n)))))
                    .chain((1..n).map(|_| P::Get(0)))
                    .collect(),
                Vec::new(),
            ),
            false,
        ),
        (
            // n segments sharing one list of n blocks.
            "one block list in n segments",
            snapshot_of(
                std::iter::once(segment(A, n, P::Put(0, Box::new(blocks(n)))))
                    .chain((1..n).map(|i| segment(A + (i << 32), n, P::Get(0))))
                    .collect(),
                Vec::new(),
            ),
            false,
        ),
        (
            // One block listed n times in its segment.
            "one block listed n times",
            snapshot_of(
                vec![segment(
                    A,
                    n,
                    P::L(
                        std::iter::once(P::Put(0, Box::new(block(0, None))))
                            .chain((1..n).map(|_| P::Get(0)))
                            .collect(),
                    ),
                )],
                Vec::new(),
            ),
            false,
        ),
        (
            // What torch does share, taken to the extreme: n blocks and n trace entries
            // holding one frame list of n frames.
            "one frame list of n frames in n blocks and n trace entries",
            snapshot_of(
                vec![segment(
                    A,
                    n,
                    P::L(
                        std::iter::once(block(0, Some(frames)))
                            .chain((1..n).map(|i| block(i, Some(P::Get(0)))))
                            .collect(),
                    ),
                )],
                (0..n)
                    .map(|i| {
                        P::D(vec![
                            ("action", P::S("alloc")),
                            ("addr", P::I(A + 512 * i)),
                            ("size", P::I(512)),
                            ("stream", P::I(0)),
                            ("frames", P::Get(0)),
                        ])
                    })
                    .collect(),
            ),
            true,
        ),
        (
            // n OOM events against n blocks: each measures the free space of the device.
            "n oom events and n blocks",
            snapshot_of(
                vec![segment(A, n, blocks(n))],
                (0..n)
                    .map(|_| {
                        P::D(vec![
                            ("action", P::S("oom")),
                            ("size", P::I(1 << 40)),
                            ("stream", P::I(0)),
                            ("device_free", P::I(0)),
                        ])
                    })
                    .collect(),
            ),
            true,
        ),
    ]
}

#[test]
fn shared_references_cost_linear_time_and_memory() {
    // Issue 29: a 40 KB file of shared references took 3.7 GB and 11 s, growing with the
    // square of the count. Ten times the references must cost about ten times as much
    // (allocated bytes per byte of file, small and the same at both sizes), not a hundred.
    let small = shared_reference_files(400);
    let large = shared_reference_files(4000);
    for ((what, small, torch_could), (_, large, _)) in small.into_iter().zip(large) {
        let (small_out, small_alloc) = allocated_by(|| analyse(&small));
        let (large_out, large_alloc) = allocated_by(|| analyse(&large));
        if torch_could {
            small_out.unwrap_or_else(|e| panic!("{what}: {e}"));
            large_out.unwrap_or_else(|e| panic!("{what}: {e}"));
        } else {
            for out in [small_out, large_out] {
                let err = out.expect_err(what);
                assert!(err.contains("from two places"), "{what}: {err}");
                assert!(!err.contains('\n'), "{what}: one line: {err}");
            }
        }
        let per_byte = |alloc: u64, file: &[u8]| alloc / file.len() as u64;
        let (small_per_byte, large_per_byte) =
            (per_byte(small_alloc, &small), per_byte(large_alloc, &large));
        eprintln!(
            "{what}: {} B file: {small_alloc} B allocated; {} B file: {large_alloc} B allocated",
            small.len(),
            large.len()
        );
        // Linear: the larger file costs at most 3 times as much per byte as the smaller
        // (quadratic would be 10 times), and never more than 200 bytes per byte of file.
        assert!(
            large_per_byte <= 3 * small_per_byte.max(1) && large_per_byte <= 200,
            "{what}: {small_per_byte} B/B at {} B, {large_per_byte} B/B at {} B",
            small.len(),
            large.len()
        );
    }
}

#[test]
fn only_the_newest_oom_events_of_a_device_are_measured() {
    let n = vramctl_snapshot::summary::MAX_OOM_EVENTS_PER_DEVICE + 5;
    let (_, file, _) = shared_reference_files(i64::try_from(n).expect("small"))
        .into_iter()
        .find(|(w, _, _)| w.contains("oom"))
        .expect("oom file");
    let s = summarize(&model::read(&file[..], Limits::default()).expect("snapshot"));
    assert_eq!(s.oom.len(), n - 5);
    assert_eq!(s.oom_events_not_analyzed, 5);
    assert_eq!(s.oom[0].event, 5, "the newest, oldest first");
    let lines = vramctl_snapshot::summary::oom_lines(&s);
    assert!(
        lines[0].contains("5 older oom events not measured"),
        "{lines:?}"
    );
}

/// A gzip bomb shaped as a snapshot: a pickle that declares a `members` MiB byte string
/// and holds it, zeros, as `members` gzip members of 1 MiB each (a member compresses
/// to about 1 KB; the decoder reads concatenated members as one stream, as gzip does).
fn gzip_bomb(members: usize) -> Vec<u8> {
    use std::io::Write;
    let gz = |bytes: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(bytes).expect("in memory");
        e.finish().expect("in memory")
    };
    let mut head = vec![0x80, 4, 0x8e];
    head.extend_from_slice(&((members as u64) << 20).to_le_bytes());
    let mut out = gz(&head);
    let member = gz(&vec![0u8; 1 << 20]);
    for _ in 0..members {
        out.extend_from_slice(&member);
    }
    out
}

/// An error and its sources, as a report of the whole chain prints them.
fn out_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// `bytes` in a file of its own, removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, bytes: &[u8]) -> Self {
        let path = std::env::temp_dir().join(format!(
            "vramctl-snapshot-test-{}-{name}",
            std::process::id()
        ));
        std::fs::write(&path, bytes).expect("temp file");
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn gzip_bomb_is_refused_with_one_line() {
    // Issue 29: a 2 MB .gz reached 6.3 GB resident, a 4 MB one asked for 8 GiB. 300 KB
    // that decompress to 300 MiB: refused once 64 MiB (the allowance, more than 200 times
    // the file) have come out, having allocated a small multiple of that.
    let bomb = TempFile::new("bomb.pickle.gz", &gzip_bomb(300));
    assert!(std::fs::metadata(&bomb.0).expect("bomb").len() < 400_000);
    let (out, allocated) = allocated_by(|| model::open(&bomb.0, Limits::default()));
    let err = out.expect_err("a gzip bomb").to_string();
    assert!(err.contains("gzip bomb"), "{err}");
    assert!(err.contains("64.00 MiB"), "{err}");
    assert!(!err.contains('\n'), "one line: {err}");
    assert!(allocated < 256 << 20, "allocated {allocated} B");
    // Said once, also where the whole chain of causes is printed (the CLI's one line).
    let chain = out_chain(&model::open(&bomb.0, Limits::default()).expect_err("bomb"));
    assert_eq!(chain.matches("gzip bomb").count(), 1, "{chain}");
    // Beyond the allowance the ratio bounds it: 200 times a 50 KB file is 10 MB.
    let limits = Limits {
        gzip_allowance_bytes: 1 << 20,
        ..Limits::default()
    };
    let bomb = TempFile::new("small-bomb.pickle.gz", &gzip_bomb(50));
    let err = model::open(&bomb.0, limits).expect_err("bomb").to_string();
    assert!(err.contains("200 times"), "{err}");
    // Real snapshots compress 10 to 25 times: read as before, with the allowance made
    // small enough that the ratio decides.
    for f in [
        "snap.pickle.gz",
        "synthetic-2dev.pickle.gz",
        "synthetic-6000.pickle.gz",
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/h200/snapshots")
            .join(f);
        model::open(&path, limits).unwrap_or_else(|e| panic!("{f}: {e}"));
    }
}

#[test]
fn impossible_totals_mark_the_snapshot_damaged() {
    let seg = |address: i64, allocated: i64, blocks: Vec<P>| {
        P::D(vec![
            ("device", P::I(0)),
            ("address", P::I(address)),
            ("total_size", P::I(16 * MIB)),
            ("allocated_size", P::I(allocated)),
            ("blocks", P::L(blocks)),
        ])
    };
    let blk = |address: i64, size: i64| {
        P::D(vec![
            ("address", P::I(address)),
            ("size", P::I(size)),
            ("state", P::S("active_allocated")),
        ])
    };
    let b = 1i64 << 40;
    let file = pickle_of(&P::D(vec![(
        "segments",
        P::L(vec![
            // Issue 29's file: "allocated 30.52 TiB" in a 16 MiB segment.
            seg(A, 30 * b + b / 2, vec![blk(A, 16 * MIB)]),
            // A block beyond its segment's end.
            seg(A + b, 8 * MIB, vec![blk(A + b + 12 * MIB, 8 * MIB)]),
            // Blocks adding up to more than the segment, and a negative size.
            seg(
                A + 2 * b,
                16 * MIB,
                vec![
                    blk(A + 2 * b, 16 * MIB),
                    blk(A + 2 * b, 16 * MIB),
                    blk(A, -5),
                ],
            ),
        ]),
    )]));
    let s = summarize(&model::read(&file[..], Limits::default()).expect("snapshot"));
    let damaged = s.damaged.join("\n");
    for want in [
        "2 segments whose allocated, active or requested bytes exceed the segment's size \
         (first: device 0 segment 0x7f0000000000: allocated 30.50 TiB of 16.00 MiB)",
        "2 segments with a block outside the segment (first: device 0 segment 0x800000000000: \
         block 0x800000c00000 of 8.00 MiB)",
        "1 segment whose blocks add up to more than the segment's size (first: device 0 \
         segment 0x810000000000: 32.00 MiB in blocks of 16.00 MiB)",
        "1 negative size (read as missing)",
    ] {
        assert!(damaged.contains(want), "{want}\nnot in\n{damaged}");
    }
    let table = vramctl_snapshot::summary::table(&s);
    assert!(table[0].starts_with("damaged: "), "{table:?}");
    let json = serde_json::to_value(&s).expect("json");
    assert_eq!(json["damaged"].as_array().map(Vec::len), Some(4));
    // A file torch wrote is not damaged.
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/h200/snapshots/snap.pickle"
    );
    let snap = model::open(std::path::Path::new(fixture), Limits::default()).expect("fixture");
    assert_eq!(summarize(&snap).damaged, Vec::<String>::new());
}
