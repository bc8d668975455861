//! What `vramctl snapshot FILE` reports: per device and per (stream, pool) the sums that
//! PyTorch's `memory_stats()` keeps (`<name>.all.current`), the free space and how it is
//! split, the OOM events of the trace with the largest free block at that moment, and
//! advice only where these numbers support it. docs/snapshot.md says what each means.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::{Action, BlockState, Pool, Segment, Snapshot};
use crate::oom_cause::{self, OomContext, Verdict};
use crate::replay::{self, Replay};
pub use crate::size_text::human;

/// Sums over a set of segments.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Σ `total_size` = `reserved_bytes.all.current`.
    pub reserved_bytes: u64,
    /// Σ sizes of `active_allocated` blocks = `allocated_bytes.all.current`.
    pub allocated_bytes: u64,
    /// Σ sizes of active blocks (allocated + pending free) = `active_bytes.all.current`.
    pub active_bytes: u64,
    /// Σ `requested_size` of active blocks = `requested_bytes.all.current` (None for files
    /// that do not record it, ≤ 1.13).
    pub requested_bytes: Option<u64>,
    /// Σ inactive blocks of segments that also hold other blocks (the allocator cannot
    /// release them) = `inactive_split_bytes.all.current`. Blocks of expandable segments
    /// are left out, as the allocator leaves them out of the statistic (`free_block`:
    /// "fully free pages of expandable blocks can always be freed"), so this is 0 for
    /// them whatever their blocks: their free memory is [`Totals::mapped_free_bytes`].
    pub inactive_split_bytes: u64,
    /// Σ inactive blocks of expandable segments: physical pages mapped but holding no
    /// tensor. Pages wholly inside such a block are what `empty_cache()` unmaps
    /// ([`Totals::unmappable_bytes`]); the rest share a page with a live block. Memory
    /// an expandable segment has unmapped is not reserved and not in the snapshot.
    pub mapped_free_bytes: u64,
    /// The whole pages (2 MiB small pool, 20 MiB large) inside inactive blocks of
    /// expandable segments: what `empty_cache()` would unmap and give back.
    pub unmappable_bytes: u64,
    /// Σ (size − requested_size) of active blocks: rounding waste.
    pub internal_waste_bytes: Option<u64>,
    /// Σ inactive blocks (reserved but unallocated).
    pub free_bytes: u64,
    /// Σ sizes of segments with no active block: what `empty_cache()` would return.
    pub releasable_bytes: u64,
    pub largest_free_block_bytes: u64,
    /// 1 − largest free block / free bytes; None when nothing is free.
    pub fragmentation: Option<f64>,
    /// = `segment.all.current`.
    pub segments: u64,
    /// = `active.all.current` is the active ones; this counts all blocks.
    pub blocks: u64,
    pub active_blocks: u64,
    /// Inactive blocks in split segments = `inactive_split.all.current`.
    pub inactive_split_blocks: u64,
}

impl Totals {
    fn add_segment(&mut self, s: &Segment) {
        self.reserved_bytes = self.reserved_bytes.saturating_add(s.total_size);
        self.allocated_bytes = self.allocated_bytes.saturating_add(s.allocated_size);
        self.active_bytes = self.active_bytes.saturating_add(s.active_size);
        self.requested_bytes = match (self.requested_bytes, s.requested_size) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            _ => None,
        };
        self.segments += 1;
        let split = s.blocks.len() > 1;
        let mut any_active = false;
        for b in &s.blocks {
            self.blocks += 1;
            if b.state.is_active() {
                any_active = true;
                self.active_blocks += 1;
                self.internal_waste_bytes = match (self.internal_waste_bytes, b.requested_size) {
                    (Some(w), Some(r)) => Some(w.saturating_add(b.size.saturating_sub(r))),
                    _ => None,
                };
            }
            if b.state == BlockState::Inactive {
                self.free_bytes = self.free_bytes.saturating_add(b.size);
                self.largest_free_block_bytes = self.largest_free_block_bytes.max(b.size);
                if s.is_expandable {
                    self.mapped_free_bytes = self.mapped_free_bytes.saturating_add(b.size);
                    self.unmappable_bytes = self.unmappable_bytes.saturating_add(whole_pages(
                        b.address.saturating_sub(s.address),
                        b.size,
                        page_of(s.pool),
                    ));
                } else if split {
                    self.inactive_split_bytes = self.inactive_split_bytes.saturating_add(b.size);
                    self.inactive_split_blocks += 1;
                }
            }
        }
        // An expandable segment's empty pages are counted in `unmappable_bytes` above.
        if !any_active && !s.is_expandable {
            self.releasable_bytes = self.releasable_bytes.saturating_add(s.total_size);
        }
        self.fragmentation = fragmentation(self.largest_free_block_bytes, self.free_bytes);
    }

    fn new() -> Self {
        Self {
            requested_bytes: Some(0),
            internal_waste_bytes: Some(0),
            ..Self::default()
        }
    }
}

/// The page an expandable segment maps at a time: 2 MiB for the small pool, 20 MiB for
/// the large (the allocator's kSmallBuffer and kLargeBuffer, `ExpandableSegment`'s
/// `segment_size`).
pub fn page_of(pool: Pool) -> u64 {
    match pool {
        Pool::Small => 2 << 20,
        Pool::Large | Pool::Unknown => 20 << 20,
    }
}

/// Bytes of the whole pages inside [offset, offset + size) of a segment (offsets from its
/// start, which is page-aligned: mapped ranges begin at a page): the part of a free block
/// of an expandable segment that unmapping can return (`unmap_block` rounds the block's
/// start up and its end down to the segment's page).
pub fn whole_pages(address: u64, size: u64, page: u64) -> u64 {
    if page == 0 {
        return 0;
    }
    let first = address.div_ceil(page).saturating_mul(page);
    let end = address.saturating_add(size) / page * page;
    end.saturating_sub(first)
}

#[allow(clippy::cast_precision_loss)]
fn fragmentation(largest: u64, total: u64) -> Option<f64> {
    (total > 0).then(|| 1.0 - largest as f64 / total as f64)
}

/// One (stream, pool) of a device: free blocks are reused only within it.
#[derive(Debug, Clone, Serialize)]
pub struct PoolSummary {
    pub stream: i64,
    pub pool: Pool,
    /// `segment_pool_id`; (0, 0) is the default pool.
    pub pool_id: (i64, i64),
    #[serde(flatten)]
    pub totals: Totals,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceSummary {
    pub device: i64,
    #[serde(flatten)]
    pub totals: Totals,
    /// Any segment made with `expandable_segments:True`.
    pub expandable_segments: bool,
    pub pools: Vec<PoolSummary>,
}

/// An `oom` event of the trace.
#[derive(Debug, Clone, Serialize)]
pub struct OomEvent {
    pub device: i64,
    /// Position in the device's trace.
    pub event: usize,
    pub stream: i64,
    pub time_us: Option<i64>,
    pub requested_bytes: u64,
    /// cudaMemGetInfo's free bytes at the OOM.
    pub device_free_bytes: Option<u64>,
    /// Reserved but unallocated on this stream and pool at that moment.
    pub free_bytes: u64,
    /// In split segments (an inactive block beside an active one) at that moment.
    pub inactive_split_bytes: u64,
    pub inactive_split_segments: u64,
    /// The largest free block on this stream and pool at that moment.
    pub largest_free_block_bytes: u64,
    /// The state at the OOM was rebuilt from the final one by undoing the later events;
    /// false when the trace did not allow it (an event names memory the replay lacks).
    pub replayed: bool,
    /// Its cause, fix and evidence (`cause`, `fix`, `why`, `evidence`).
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// A setting that would have helped, with the numbers that say so.
#[derive(Debug, Clone, Serialize)]
pub struct Advice {
    /// The `PYTORCH_CUDA_ALLOC_CONF` option, or `empty_cache` / `none`.
    pub setting: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub devices: Vec<DeviceSummary>,
    /// The `oom` events of the trace, oldest first: the newest
    /// [`MAX_OOM_EVENTS_PER_DEVICE`] of each device.
    pub oom: Vec<OomEvent>,
    /// `oom` events older than those in [`Summary::oom`], not measured.
    #[serde(skip_serializing_if = "is_zero")]
    pub oom_events_not_analyzed: u64,
    pub advice: Vec<Advice>,
    /// Why the file's numbers cannot be true (empty when nothing says so): a block beyond
    /// its segment, blocks or allocated/active/requested bytes larger than their segment,
    /// a negative or absurd size. The sums above are the file's, as it gives them.
    pub damaged: Vec<String>,
    pub trace_entries: u64,
    /// `allocator_settings.PYTORCH_CUDA_ALLOC_CONF` where the file has it.
    pub alloc_conf: Option<String>,
}

const SMALL_SIZE: u64 = 1 << 20;

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// (stream, pool, `segment_pool_id`): the set within which free blocks are reused.
type PoolKey = (i64, Pool, (i64, i64));

/// The pool an allocation of `size` bytes goes to (allocator's kSmallSize = 1 MiB).
fn pool_of_request(size: u64) -> Pool {
    if size <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// Summarizes a snapshot.
pub fn summarize(snap: &Snapshot) -> Summary {
    summarize_with(snap, OomContext::default())
}

/// Summarizes a snapshot, with what the file does not say about its GPU.
pub fn summarize_with(snap: &Snapshot, ctx: OomContext) -> Summary {
    let mut per_device: BTreeMap<i64, (Totals, bool, BTreeMap<PoolKey, Totals>)> = BTreeMap::new();
    for s in &snap.segments {
        let (totals, expandable, pools) = per_device
            .entry(s.device)
            .or_insert_with(|| (Totals::new(), false, BTreeMap::new()));
        totals.add_segment(s);
        *expandable |= s.is_expandable;
        pools
            .entry((s.stream, s.pool, s.pool_id))
            .or_insert_with(Totals::new)
            .add_segment(s);
    }
    let devices: Vec<DeviceSummary> = per_device
        .into_iter()
        .map(
            |(device, (totals, expandable_segments, pools))| DeviceSummary {
                device,
                totals,
                expandable_segments,
                pools: pools
                    .into_iter()
                    .map(|((stream, pool, pool_id), totals)| PoolSummary {
                        stream,
                        pool,
                        pool_id,
                        totals,
                    })
                    .collect(),
            },
        )
        .collect();
    let mut oom = Vec::new();
    let mut oom_events_not_analyzed = 0u64;
    for (device, trace) in snap.device_traces.iter().enumerate() {
        let device = i64::try_from(device).unwrap_or(i64::MAX);
        let mut events: Vec<usize> = trace
            .iter()
            .enumerate()
            .filter(|(_, e)| e.action == Action::Oom)
            .map(|(i, _)| i)
            .collect();
        // Each OOM measures the free space of its device (a pass over its blocks): a
        // file of many OOM entries and many blocks would cost their product, so only the
        // newest ones are measured (the last is the one that ended the program).
        let skip = events.len().saturating_sub(MAX_OOM_EVENTS_PER_DEVICE);
        oom_events_not_analyzed += skip as u64;
        events.drain(..skip);
        oom.extend(oom_states(snap, device, &events, ctx));
    }
    let advice = advise(&oom);
    Summary {
        trace_entries: snap.device_traces.iter().map(|t| t.len() as u64).sum(),
        alloc_conf: snap
            .allocator_settings
            .as_ref()
            .and_then(|s| s.alloc_conf.clone()),
        devices,
        oom,
        oom_events_not_analyzed,
        advice,
        damaged: damage(snap),
    }
}

/// A size no GPU's allocator reports (1 PiB: a thousand times an H200's memory); the
/// 49-bit virtual address space of current GPUs is half of it.
pub const ABSURD_BYTES: u64 = 1 << 50;

/// Why `snap`'s numbers cannot be true: one line per kind of impossibility, with how many
/// segments have it and the first of them, so that a damaged or edited file is not read
/// as a plausible one ("allocated 30.52 TiB" in a 16 MiB segment, issue 29).
pub fn damage(snap: &Snapshot) -> Vec<String> {
    // Per kind: how many segments, and the first one's details.
    let mut kinds: Vec<(&'static str, u64, String)> = Vec::new();
    let mut note = |kind: &'static str, first: &dyn Fn() -> String| match kinds
        .iter_mut()
        .find(|(k, _, _)| *k == kind)
    {
        Some(k) => k.1 += 1,
        None => kinds.push((kind, 1, first())),
    };
    for s in &snap.segments {
        let at = || format!("device {} segment {:#x}", s.device, s.address);
        let end = s.address.checked_add(s.total_size);
        if s.total_size >= ABSURD_BYTES || s.blocks.iter().any(|b| b.size >= ABSURD_BYTES) {
            note("of absurd size (1 PiB or more)", &|| {
                format!("{}: {}", at(), human(s.total_size))
            });
        }
        for (what, value) in [
            ("allocated", Some(s.allocated_size)),
            ("active", Some(s.active_size)),
            ("requested", s.requested_size),
        ] {
            if let Some(v) = value.filter(|&v| v > s.total_size) {
                note(
                    "whose allocated, active or requested bytes exceed the segment's size",
                    &|| format!("{}: {what} {} of {}", at(), human(v), human(s.total_size)),
                );
                break;
            }
        }
        let blocks_bytes = s.blocks.iter().fold(0u64, |a, b| a.saturating_add(b.size));
        if blocks_bytes > s.total_size {
            note(
                "whose blocks add up to more than the segment's size",
                &|| {
                    format!(
                        "{}: {} in blocks of {}",
                        at(),
                        human(blocks_bytes),
                        human(s.total_size)
                    )
                },
            );
        }
        let outside = s.blocks.iter().find(|b| {
            b.address < s.address
                || match (b.address.checked_add(b.size), end) {
                    (Some(b_end), Some(end)) => b_end > end,
                    _ => true,
                }
        });
        if let Some(b) = outside {
            note("with a block outside the segment", &|| {
                format!("{}: block {:#x} of {}", at(), b.address, human(b.size))
            });
        }
    }
    let mut out: Vec<String> = kinds
        .into_iter()
        .map(|(kind, n, first)| {
            format!(
                "{n} segment{} {kind} (first: {first})",
                if n == 1 { "" } else { "s" }
            )
        })
        .collect();
    if snap.negative_sizes > 0 {
        out.push(format!(
            "{} negative size{} (read as missing)",
            snap.negative_sizes,
            if snap.negative_sizes == 1 { "" } else { "s" }
        ));
    }
    out
}

/// The most `oom` events of one device that the summary measures ([`Summary::oom`]).
pub const MAX_OOM_EVENTS_PER_DEVICE: usize = 100;

/// The states at the `oom` events `at` (trace indices, ascending) of a device, rebuilt by
/// one [`Replay`] that undoes the trace once, newest first (not once per event, which
/// would cost the trace's length for each), each measured on the OOM's stream and in the
/// pool its size goes to.
fn oom_states(snap: &Snapshot, device: i64, at: &[usize], ctx: OomContext) -> Vec<OomEvent> {
    if at.is_empty() {
        return Vec::new();
    }
    let start = Replay::after_event(snap, device, None);
    let mut state = Replay::at_end(snap, device);
    let mut out: Vec<OomEvent> = at
        .iter()
        .rev()
        .enumerate()
        .map(|(k, &i)| {
            state.undo_to(Some(i));
            let replays = k < oom_cause::MAX_REPLAYED_OOMS_PER_DEVICE;
            let verdict = oom_cause::classify(snap, device, i, &state, &start, ctx, replays);
            oom_at(snap, device, i, &state, verdict)
        })
        .collect();
    out.reverse();
    out
}

/// The OOM event `at` of a device, measured in `state` (the state right after it).
fn oom_at(
    snap: &Snapshot,
    device: i64,
    at: usize,
    state: &Replay<'_>,
    verdict: Verdict,
) -> OomEvent {
    let e = &replay::trace(snap, device)[at];
    let (free_bytes, largest, inactive_split_bytes, inactive_split_segments) =
        state.free_on(e.stream, pool_of_request(e.size));
    OomEvent {
        device,
        event: at,
        stream: e.stream,
        time_us: e.time_us,
        requested_bytes: e.size,
        device_free_bytes: e.device_free,
        free_bytes,
        inactive_split_bytes,
        inactive_split_segments,
        largest_free_block_bytes: largest,
        replayed: state.consistent,
        verdict,
    }
}

/// One advice per OOM: its verdict's fix (the setting a replay found to work), or `none`.
fn advise(oom: &[OomEvent]) -> Vec<Advice> {
    oom.iter().map(advice_for_oom).collect()
}

/// The advice for one OOM event, from its verdict (`crate::oom_cause`): the setting a
/// counterfactual replay found to work, `none` where nothing does, or the cause's name for
/// a fix that is not an allocator setting; the reason is the verdict's.
pub fn advice_for_oom(o: &OomEvent) -> Advice {
    Advice {
        setting: match &o.verdict.fix {
            None => "none".to_owned(),
            Some(f) => f
                .strip_prefix("PYTORCH_CUDA_ALLOC_CONF=")
                .map_or_else(|| o.verdict.cause.as_str().to_owned(), str::to_owned),
        },
        reason: format!(
            "{} at event {} of device {}: {}",
            o.verdict.cause.as_str(),
            o.event,
            o.device,
            o.verdict.why
        ),
    }
}

fn pool_name(pool: Pool, pool_id: (i64, i64)) -> String {
    let base = match pool {
        Pool::Small => "small",
        Pool::Large => "large",
        Pool::Unknown => "?",
    };
    if pool_id == (0, 0) {
        base.to_owned()
    } else {
        format!("{base} ({},{})", pool_id.0, pool_id.1)
    }
}

fn opt_human(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), human)
}

fn frag(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |f| format!("{f:.3}"))
}

/// The text `vramctl snapshot FILE` prints.
pub fn table(s: &Summary) -> Vec<String> {
    let mut out = Vec::new();
    for d in &s.damaged {
        out.push(format!(
            "damaged: {d}: the numbers below are the file's and cannot all be true"
        ));
    }
    out.extend(verdict_lines(s));
    if s.devices.is_empty() {
        out.push("no segments: the allocator held no memory when the snapshot was taken".into());
    }
    for d in &s.devices {
        out.extend(device_lines(d));
    }
    out.extend(oom_lines(s));
    out
}

/// The verdict of each OOM, newest last: cause, fix, why. The text leads with them.
pub fn verdict_lines(s: &Summary) -> Vec<String> {
    s.oom
        .iter()
        .flat_map(|o| {
            [
                format!(
                    "oom at event {} of device {}: {} — fix: {}",
                    o.event,
                    o.device,
                    o.verdict.cause.as_str(),
                    o.verdict.fix.as_deref().unwrap_or("none")
                ),
                format!("  why: {}", o.verdict.why),
            ]
        })
        .collect()
}

/// The lines of one device: its totals and its table of streams and pools.
pub fn device_lines(d: &DeviceSummary) -> Vec<String> {
    let mut out = Vec::new();
    {
        let t = &d.totals;
        out.push(format!(
            "device {}: reserved {}, allocated {}, active {}, requested {} (internal waste {})",
            d.device,
            human(t.reserved_bytes),
            human(t.allocated_bytes),
            human(t.active_bytes),
            opt_human(t.requested_bytes),
            opt_human(t.internal_waste_bytes),
        ));
        out.push(format!(
            "  free {}: inactive split {} in {} block{}, releasable {} (empty_cache); largest free \
             block {}, fragmentation {}",
            human(t.free_bytes),
            human(t.inactive_split_bytes),
            t.inactive_split_blocks,
            if t.inactive_split_blocks == 1 {
                ""
            } else {
                "s"
            },
            human(t.releasable_bytes),
            human(t.largest_free_block_bytes),
            frag(t.fragmentation),
        ));
        if d.expandable_segments {
            out.push(format!(
                "  expandable: {} mapped but free, of which {} in whole pages that empty_cache() \
                 would unmap; memory_stats() counts none of it as inactive split",
                human(t.mapped_free_bytes),
                human(t.unmappable_bytes),
            ));
        }
        out.push(format!(
            "  {} segment{}, {} block{} ({} active); expandable segments: {}",
            t.segments,
            if t.segments == 1 { "" } else { "s" },
            t.blocks,
            if t.blocks == 1 { "" } else { "s" },
            t.active_blocks,
            if d.expandable_segments { "yes" } else { "no" },
        ));
        let rows: Vec<[String; 10]> = d
            .pools
            .iter()
            .map(|p| {
                let t = &p.totals;
                [
                    p.stream.to_string(),
                    pool_name(p.pool, p.pool_id),
                    human(t.reserved_bytes),
                    human(t.allocated_bytes),
                    human(t.active_bytes),
                    human(t.inactive_split_bytes),
                    human(t.largest_free_block_bytes),
                    frag(t.fragmentation),
                    t.segments.to_string(),
                    t.blocks.to_string(),
                ]
            })
            .collect();
        let head = [
            "STREAM",
            "POOL",
            "RESERVED",
            "ALLOCATED",
            "ACTIVE",
            "INACTIVE SPLIT",
            "LARGEST FREE",
            "FRAG",
            "SEGMENTS",
            "BLOCKS",
        ];
        let mut widths = head.map(str::len);
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.len());
            }
        }
        let line = |cells: &[&str]| {
            let mut l = String::from("  ");
            for (i, c) in cells.iter().enumerate() {
                if i > 1 {
                    l.push_str(&format!("{c:>w$}  ", w = widths[i]));
                } else {
                    l.push_str(&format!("{c:<w$}  ", w = widths[i]));
                }
            }
            l.trim_end().to_owned()
        };
        out.push(line(&head));
        for r in &rows {
            out.push(line(&r.each_ref().map(String::as_str)));
        }
    }
    out
}

/// The `oom:` lines: each OOM event, or that the trace has none.
pub fn oom_lines(s: &Summary) -> Vec<String> {
    let mut out = Vec::new();
    if s.oom.is_empty() {
        out.push(format!(
            "oom: none in the trace ({} entries)",
            s.trace_entries
        ));
    }
    if s.oom_events_not_analyzed > 0 {
        out.push(format!(
            "oom: {} older oom event{} not measured (the newest {} of each device are)",
            s.oom_events_not_analyzed,
            if s.oom_events_not_analyzed == 1 {
                ""
            } else {
                "s"
            },
            MAX_OOM_EVENTS_PER_DEVICE
        ));
    }
    for o in &s.oom {
        out.push(oom_line(o));
    }
    out
}

/// One OOM event as a line.
pub fn oom_line(o: &OomEvent) -> String {
    {
        format!(
            "oom: device {} event {} stream {}: requested {}, largest free block {} of {} free \
             on its stream and pool ({} inactive split in {} segment{}), device free {}{}",
            o.device,
            o.event,
            o.stream,
            human(o.requested_bytes),
            human(o.largest_free_block_bytes),
            human(o.free_bytes),
            human(o.inactive_split_bytes),
            o.inactive_split_segments,
            if o.inactive_split_segments == 1 {
                ""
            } else {
                "s"
            },
            opt_human(o.device_free_bytes),
            if o.replayed {
                ""
            } else {
                " (approximate: the trace did not replay cleanly)"
            },
        )
    }
}
