//! What `vramctl snapshot FILE` reports: per device and per (stream, pool) the sums that
//! PyTorch's `memory_stats()` keeps (`<name>.all.current`), the free space and how it is
//! split, the OOM events of the trace with the largest free block at that moment, and
//! advice only where these numbers support it. docs/snapshot.md says what each means.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::{Action, BlockState, Pool, Segment, Snapshot};
use crate::replay::{self, Replay};

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
    /// release them) = `inactive_split_bytes.all.current`.
    pub inactive_split_bytes: u64,
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
                if split {
                    self.inactive_split_bytes = self.inactive_split_bytes.saturating_add(b.size);
                    self.inactive_split_blocks += 1;
                }
            }
        }
        if !any_active {
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
    pub oom: Vec<OomEvent>,
    pub advice: Vec<Advice>,
    pub trace_entries: u64,
    /// `allocator_settings.PYTORCH_CUDA_ALLOC_CONF` where the file has it.
    pub alloc_conf: Option<String>,
}

const SMALL_SIZE: u64 = 1 << 20;

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
    for (device, trace) in snap.device_traces.iter().enumerate() {
        let device = i64::try_from(device).unwrap_or(i64::MAX);
        for (i, e) in trace.iter().enumerate() {
            if e.action == Action::Oom {
                oom.push(oom_at(snap, device, i));
            }
        }
    }
    let advice = advise(snap, &devices, &oom);
    Summary {
        trace_entries: snap.device_traces.iter().map(|t| t.len() as u64).sum(),
        alloc_conf: snap
            .allocator_settings
            .as_ref()
            .and_then(|s| s.alloc_conf.clone()),
        devices,
        oom,
        advice,
    }
}

/// The state at an `oom` event (rebuilt by [`Replay`]: the later events undone), measured
/// on the OOM's stream and in the pool its size goes to.
fn oom_at(snap: &Snapshot, device: i64, at: usize) -> OomEvent {
    let e = &replay::trace(snap, device)[at];
    let state = Replay::after_event(snap, device, Some(at));
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
    }
}

fn advise(snap: &Snapshot, devices: &[DeviceSummary], oom: &[OomEvent]) -> Vec<Advice> {
    let expandable = snap
        .allocator_settings
        .as_ref()
        .and_then(|s| s.expandable_segments)
        .unwrap_or_else(|| devices.iter().any(|d| d.expandable_segments));
    let mut out = Vec::new();
    for o in oom {
        let device_free = o.device_free_bytes.unwrap_or(0);
        if o.requested_bytes > o.free_bytes.saturating_add(device_free) {
            out.push(Advice {
                setting: "none".to_owned(),
                reason: format!(
                    "the {} request at event {} of device {} was larger than all free memory \
                     ({} reserved but unallocated on its stream and pool + {} free on the \
                     device): a true shortage, no allocator setting makes it fit",
                    human(o.requested_bytes),
                    o.event,
                    o.device,
                    human(o.free_bytes),
                    human(device_free),
                ),
            });
        } else if !expandable
            && o.requested_bytes > o.largest_free_block_bytes
            && o.requested_bytes <= o.inactive_split_bytes.saturating_add(device_free)
        {
            out.push(Advice {
                setting: "expandable_segments:True".to_owned(),
                reason: format!(
                    "would have let the {} request at event {} of device {} succeed: {} \
                     inactive split across {} segment{} (largest free block {}) + {} free on \
                     the device",
                    human(o.requested_bytes),
                    o.event,
                    o.device,
                    human(o.inactive_split_bytes),
                    o.inactive_split_segments,
                    if o.inactive_split_segments == 1 {
                        ""
                    } else {
                        "s"
                    },
                    human(o.largest_free_block_bytes),
                    human(device_free),
                ),
            });
        }
    }
    out
}

/// Binary units with two decimals, as PyTorch's `format_size` prints them.
#[allow(clippy::cast_precision_loss)]
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
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
    if s.devices.is_empty() {
        out.push("no segments: the allocator held no memory when the snapshot was taken".into());
    }
    for d in &s.devices {
        out.extend(device_lines(d));
    }
    out.extend(oom_lines(s));
    for a in &s.advice {
        out.push(format!("advice: {}: {}", a.setting, a.reason));
    }
    out
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
