//! The browser viewer's model (`view`, issue 32) against the H200 fixtures
//! (testdata/h200/snapshots): its figures must be those `vramctl snapshot FILE --json`
//! (the summary) and `snapshot timeline` (the timeline module) already give, its bands and
//! "other" must add up to the live bytes, its answers must stay within their bounds.

use std::path::PathBuf;

use vramctl_snapshot::model::BlockState;
use vramctl_snapshot::view::{MAX_BUCKETS, QueryError, SnapshotView};
use vramctl_snapshot::{Limits, summarize};

fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/h200/snapshots")
        .join(name)
}

fn view(name: &str) -> SnapshotView {
    SnapshotView::open(&path(name), Limits::default()).expect(name)
}

const WITH_TRACE: [&str; 5] = [
    "snapshot-train.pickle",
    "snap.pickle",
    "snapx.pickle",
    "synthetic-6000.pickle.gz",
    "synthetic-2dev.pickle.gz",
];

#[test]
fn the_last_event_is_the_summarys_totals() {
    for name in WITH_TRACE {
        let v = view(name);
        let info = v.info();
        for d in &info.devices {
            // A device with a trace and no segments (synthetic-2dev's copy of device 0's
            // trace) ends with nothing, as its summary would say.
            let Some(s) = info.summary.devices.iter().find(|s| s.device == d.device) else {
                let state = v.state_at(d.device, (d.events - 1) as u64).expect("state");
                assert_eq!((state.live_bytes, state.reserved_bytes), (0, 0), "{name}");
                assert!(state.segments.is_empty());
                continue;
            };
            let last = (d.events - 1) as u64;
            let state = v.state_at(d.device, last).expect("state");
            assert_eq!(state.live_bytes, s.totals.active_bytes, "{name}");
            assert_eq!(state.reserved_bytes, s.totals.reserved_bytes, "{name}");
            assert_eq!(state.free_bytes, s.totals.free_bytes, "{name}");
            assert_eq!(
                state.largest_free_block_bytes, s.totals.largest_free_block_bytes,
                "{name}"
            );
            assert_eq!(state.segments_total as u64, s.totals.segments, "{name}");
            let reserved: u64 = state.segments.iter().map(|s| s.total_bytes).sum();
            assert_eq!(reserved, s.totals.reserved_bytes, "{name}");
            let active: u64 = state
                .segments
                .iter()
                .flat_map(|s| &s.blocks)
                .filter(|b| b.state.is_active())
                .map(|b| b.size_bytes)
                .sum();
            assert_eq!(active, s.totals.active_bytes, "{name}");
            // One bucket per event: the last is the end of the trace.
            let t = v
                .timeline(d.device, 0, None, d.events, 10)
                .expect("timeline");
            assert_eq!(t.buckets.event.len(), d.events, "{name}");
            assert_eq!(t.buckets.live_bytes.last(), Some(&s.totals.active_bytes));
            assert_eq!(
                t.buckets.reserved_bytes.last(),
                Some(&s.totals.reserved_bytes)
            );
        }
    }
}

#[test]
fn the_curve_is_the_timeline_commands_and_keeps_its_peak() {
    use vramctl_snapshot::timeline::timeline;
    for name in WITH_TRACE {
        let v = view(name);
        let snap = vramctl_snapshot::open(&path(name), Limits::default()).expect(name);
        let full = timeline(&snap, 3, 1_000_000);
        for d in &full.devices {
            // Every event: the same live and reserved bytes as `snapshot timeline`.
            let t = v.timeline(d.device, 0, None, d.events, 0).expect("t");
            for p in &d.points {
                assert_eq!(t.buckets.live_bytes[p.event], p.live_bytes, "{name}");
                assert_eq!(t.buckets.reserved_bytes[p.event], p.reserved_bytes);
            }
            assert_eq!(t.peak_event, d.peak_event, "{name}");
            assert_eq!(t.peak_live_bytes, d.peak_live_bytes, "{name}");
            assert_eq!(t.live_bytes_before_trace, d.live_bytes_before_trace);
            // Thinned to 37 buckets, the highest bucket is still the peak, and each bucket's
            // min/max bound the events it covers.
            let thin = v.timeline(d.device, 0, None, 37, 5).expect("thin");
            assert_eq!(thin.buckets.event.len(), 37.min(d.events));
            assert_eq!(
                thin.buckets.live_bytes.iter().max(),
                Some(&d.peak_live_bytes),
                "{name}"
            );
            for (b, &e) in thin.buckets.event.iter().enumerate() {
                assert_eq!(thin.buckets.live_bytes[b], t.buckets.live_bytes[e]);
                assert!(thin.buckets.live_min_bytes[b] <= thin.buckets.live_bytes[b]);
                assert!(thin.buckets.reserved_min_bytes[b] <= thin.buckets.reserved_bytes[b]);
                assert!(thin.buckets.reserved_bytes[b] <= thin.buckets.reserved_max_bytes[b]);
            }
        }
    }
}

/// The bands live in each bucket plus "other" are the bucket's live bytes; with every
/// allocation a band, "other" is empty: each live byte of each state is one allocation's.
#[test]
fn bands_and_other_add_up_and_every_live_byte_is_an_allocations() {
    for name in WITH_TRACE {
        let v = view(name);
        for d in &v.info().devices {
            for (width, bands) in [(d.events, usize::MAX), (200, 12), (7, 3)] {
                let t = v.timeline(d.device, 0, None, width, bands).expect("t");
                assert!(t.bands.len() <= bands.min(2000));
                let nb = t.buckets.event.len();
                for b in 0..nb {
                    let in_bands: u64 = t
                        .bands
                        .iter()
                        .filter(|x| x.first_bucket <= b && b < x.end_bucket)
                        .map(|x| x.size_bytes)
                        .sum();
                    assert_eq!(
                        in_bands + t.buckets.other_bytes[b],
                        t.buckets.live_bytes[b],
                        "{name} width {width} bucket {b}"
                    );
                    if bands == usize::MAX && d.replayed && t.allocations_in_range <= 2000 {
                        assert_eq!(t.buckets.other_bytes[b], 0, "{name} bucket {b}");
                    }
                }
                for x in &t.bands {
                    assert!(x.first_bucket < x.end_bucket && x.end_bucket <= nb);
                    if let (Some(a), Some(f)) = (x.alloc_event, x.free_event) {
                        assert!(a < f, "{name}: freed after it was made");
                    }
                    // Interned: the band's stack and its frames are in the answer.
                    let s = &t.stacks[x.stack as usize];
                    assert!(s.frames.iter().all(|&f| (f as usize) < t.frames.len()));
                }
                // Bands come in the order they were made.
                let begins: Vec<i64> = t
                    .bands
                    .iter()
                    .map(|x| x.alloc_event.map_or(-1, i64::from))
                    .collect();
                assert!(begins.windows(2).all(|w| w[0] <= w[1]), "{name}");
                // The shown ones cover the most of the chart (bytes × buckets live) of those
                // in range.
                if bands == 3 && t.allocations_in_range > 3 && t.allocations_in_range <= 2000 {
                    let area = |x: &vramctl_snapshot::view::BandView| {
                        u128::from(x.size_bytes) * (x.end_bucket - x.first_bucket) as u128
                    };
                    let all = v.timeline(d.device, 0, None, width, 2000).expect("all");
                    assert_eq!(all.bands.len(), t.allocations_in_range);
                    let mut areas: Vec<u128> = all.bands.iter().map(area).collect();
                    areas.sort_unstable_by(|a, b| b.cmp(a));
                    let mut shown: Vec<u128> = t.bands.iter().map(area).collect();
                    shown.sort_unstable_by(|a, b| b.cmp(a));
                    assert_eq!(shown, areas[..3].to_vec(), "{name}");
                }
            }
        }
    }
}

#[test]
fn a_zoomed_range_is_drawn_from_its_own_events() {
    let v = view("snapshot-train.pickle");
    let full = v.timeline(0, 0, None, 100_000, 0).expect("full");
    let z = v.timeline(0, 500, Some(700), 50, 20).expect("zoom");
    assert_eq!((z.from, z.to), (500, 700));
    assert_eq!(z.buckets.event.len(), 50);
    assert!(z.buckets.event.iter().all(|&e| (500..700).contains(&e)));
    for (b, &e) in z.buckets.event.iter().enumerate() {
        assert_eq!(z.buckets.live_bytes[b], full.buckets.live_bytes[e]);
        let lo = 500 + b * 200 / 50;
        let hi = 500 + (b + 1) * 200 / 50;
        assert_eq!(
            Some(&z.buckets.live_bytes[b]),
            full.buckets.live_bytes[lo..hi].iter().max()
        );
    }
    // Out of range: clamped, never a panic; the width is bounded.
    let c = v
        .timeline(0, u64::MAX, Some(u64::MAX), usize::MAX, usize::MAX)
        .expect("c");
    assert!(c.buckets.event.len() <= MAX_BUCKETS && !c.buckets.event.is_empty());
    assert_eq!(
        v.timeline(7, 0, None, 10, 10).err(),
        Some(QueryError::NoDevice(7))
    );
}

#[test]
fn oom_markers_carry_the_summarys_oom_line_and_advice() {
    for name in ["snap.pickle", "snapx.pickle"] {
        let v = view(name);
        let snap = vramctl_snapshot::open(&path(name), Limits::default()).expect(name);
        let s = summarize(&snap);
        let t = v.timeline(0, 0, None, 100, 10).expect("t");
        assert_eq!(t.oom.len(), s.oom.len(), "{name}");
        for (m, o) in t.oom.iter().zip(&s.oom) {
            assert_eq!(m.event as usize, o.event);
            assert_eq!(
                m.line.as_deref(),
                Some(vramctl_snapshot::summary::oom_line(o).as_str())
            );
            // The 1 TiB request of these files is a true shortage (fixtures.rs).
            let advice = m.advice.as_deref().expect("advice");
            assert!(advice.starts_with("none: "), "{advice}");
            assert!(s.advice.iter().any(|a| advice.ends_with(&a.reason)));
        }
        // The state at the OOM: the event is the oom entry itself.
        let st = v.state_at(0, t.oom[0].event.into()).expect("state");
        let entry = st.entry.expect("entry");
        assert_eq!(entry.action, "oom");
        assert_eq!(entry.size_bytes, s.oom[0].requested_bytes);
    }
    let train = view("snapshot-train.pickle");
    let t = train.timeline(0, 0, None, 10, 1).expect("t");
    assert!(t.oom.is_empty());
}

#[test]
fn a_state_at_an_event_is_the_replay_and_names_its_stacks() {
    use vramctl_snapshot::replay::Replay;
    let v = view("snapshot-train.pickle");
    let snap =
        vramctl_snapshot::open(&path("snapshot-train.pickle"), Limits::default()).expect("snap");
    for event in [0u64, 100, 873, 1746] {
        let st = v.state_at(0, event).expect("state");
        let r = Replay::after_event(&snap, 0, Some(event as usize));
        assert_eq!(st.live_bytes, r.live_bytes(), "event {event}");
        assert_eq!(st.reserved_bytes, r.reserved_bytes());
        assert_eq!(st.segments.len(), r.segment_count());
        for b in st.segments.iter().flat_map(|s| &s.blocks) {
            match b.stack {
                Some(i) => {
                    assert!(b.state != BlockState::Inactive);
                    assert!((i as usize) < st.stacks.len());
                }
                None => assert_eq!(b.state, BlockState::Inactive),
            }
        }
        let json = serde_json::to_string(&st).expect("json");
        // Each frame once: no file name is repeated more than the frames table holds it.
        assert!(json.len() < 400_000, "{}", json.len());
    }
    assert!(matches!(
        v.state_at(0, 1747),
        Err(QueryError::NoEvent { events: 1747, .. })
    ));
}
