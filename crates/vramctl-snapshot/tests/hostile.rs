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
enum P {
    I(i64),
    S(&'static str),
    L(Vec<P>),
    D(Vec<(&'static str, P)>),
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
    assert_eq!(s.advice.len(), 1);
    assert_eq!(s.advice[0].setting, "expandable_segments:True");
    assert!(
        s.advice[0].reason.contains("10.00 MiB request"),
        "{}",
        s.advice[0].reason
    );
    assert!(
        s.advice[0]
            .reason
            .contains("8.00 MiB inactive split across 1 segment")
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
