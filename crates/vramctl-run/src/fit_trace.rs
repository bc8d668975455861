//! `vramctl fit`'s trace predictor (issue 34): where the edge lies, from the caching
//! allocator's traces of two small trials, before a trial near it is run.
//!
//! A line through two NVML peaks extrapolates badly (docs/fit.md: −20.6 % to +10.5 % on
//! the H200) because a job's memory is not one line: the pool's fragmentation changes with
//! the value, a checkpointed model is convex, ResNet-50's allocator frees its cache near the
//! capacity. What *is* simple is each allocation: a tensor's size is fixed, or a multiple of
//! the value (batch), or of its square (eager attention over the sequence length). So:
//!
//! 1. **Match** the allocations of the two traces (values `v1 < v2`): the k-th allocation
//!    from one (stream, first Python frame) in one trace with the k-th from the same
//!    (stream, frame) in the other; where the two made different numbers of them (the
//!    backward's, when cuDNN's algorithms change with the value), the two sequences are
//!    aligned instead (`align`). More than [`MAX_UNMATCHED_SHARE`] of either trace's
//!    allocations without a partner: the job is not the same program at both values
//!    (chunking by the value, another code path), and the predictor refuses.
//! 2. **Classify** each matched pair of sizes: fixed (equal), `c·v`, `c·v²` (each within
//!    the allocator's 512-byte rounding), else affine `a + b·v` through both points.
//! 3. **Synthesize** the trace at a candidate `v`: the larger trial's order of events, each
//!    size at `v` (an unmatched allocation keeps its size).
//! 4. **Replay** it through `vramctl_model::limited_allocator` (PyTorch's allocator, byte
//!    exact without a capacity; with one, its free-and-retry path): without a margin, `v`
//!    fits when the replay under `capacity − other` raises no OOM; with a margin, when the
//!    replay's reserved peak + `other` stays under the usable share (the real allocator
//!    does not know the margin, so it frees nothing to stay under it). `other` is what lies
//!    outside the allocator's pool (NVML's peak − torch's reserved peak: the CUDA context,
//!    kernels loaded lazily, libraries' own `cudaMalloc`s), the largest of the two trials.
//! 5. **Search** the largest `v` in `(v2, high]` that fits (bisection over replays; memory
//!    is assumed monotone in the value, as the search assumes).
//!
//! Checks before any extrapolation: each trace, replayed as recorded, must give the reserved
//! peak torch measured in its trial (within [`MAX_REPLAY_ERROR`]): otherwise the trace is
//! incomplete (the recording's ring buffer wrapped, an allocation before the recording
//! began) or the allocator ran under settings the replay does not model, and the
//! prediction would be built on the wrong pool. Every refusal says why ([`Refusal`]); the
//! search then falls back to the line model.
//!
//! Pure: no I/O; the agent's file is parsed by [`TraceFile::parse`], the caller reads it.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use vramctl_model::limited_allocator::{Capacity, Handle, LimitedAllocator, Settings};

/// The environment variable that asks the agent for the trace (`1`).
pub const TRACE_ENV: &str = "VRAMCTL_FIT_TRACE";
/// The largest trace file read: the agent writes none larger (`MAX_TRACE_BYTES` in
/// `python/vramctl_agent/_alloc_trace.py`); at ~30 bytes an event it holds ~2 M events.
pub const MAX_TRACE_BYTES: u64 = 64 << 20;
/// Allocations of either trace without a partner in the other, at most (a share of the
/// count). Argued, not fitted: one allocation in twenty that exists at one value and not at
/// the other is a different code path, not the same program at another size.
pub const MAX_UNMATCHED_SHARE: f64 = 0.05;
/// How far a trace's replay may be from the reserved peak torch measured. The goal is an
/// answer within 2 %: a replay further off than that on a trial it saw cannot be trusted
/// on one it did not.
pub const MAX_REPLAY_ERROR: f64 = 0.02;
/// The allocator's rounding of a request ([`vramctl_model::caching_allocator::MIN_BLOCK_BYTES`]).
const ROUND_BYTES: u64 = vramctl_model::caching_allocator::MIN_BLOCK_BYTES;
/// A capacity no replay reaches (the unlimited allocator).
const UNLIMITED_BYTES: u64 = u64::MAX / 4;

/// The agent's trace file (`<pid>.trace.json`), as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TraceFile {
    pub version: u32,
    pub devices: Vec<DeviceTraceFile>,
}

/// One device of a trace file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DeviceTraceFile {
    /// torch's device index.
    pub index: i64,
    /// Its UUID as torch gives it (without NVML's `GPU-`), when known.
    #[serde(default)]
    pub uuid: Option<String>,
    /// The recording's ring buffer was full: the oldest events are missing.
    #[serde(default)]
    pub truncated: bool,
    /// First Python frame of the events ("file:line function"), indexed by the events.
    #[serde(default)]
    pub frames: Vec<String>,
    /// `[kind, size_bytes, stream, address, frame]`: kind 0 an allocation, 1 a completed
    /// free, 2 a segment released to the driver (`empty_cache`), 3 an allocation made in
    /// torch's convolution module (`torch/nn/modules/conv.py`, its innermost Python frame);
    /// frame −1 when the event had none.
    pub events: Vec<(u8, u64, i64, u64, i64)>,
}

impl TraceFile {
    /// Parses the agent's JSON.
    ///
    /// # Errors
    /// Not JSON of this shape, or a version this reader does not know.
    pub fn parse(bytes: &[u8]) -> Result<TraceFile, String> {
        let file: TraceFile =
            serde_json::from_slice(bytes).map_err(|e| format!("not a trace file: {e}"))?;
        if file.version != 1 {
            return Err(format!("trace file version {} is not 1", file.version));
        }
        Ok(file)
    }
}

/// One allocation of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Alloc {
    size_bytes: u64,
    stream: i64,
    /// Interned frame (per trace); 0: none (the autograd engine's thread).
    frame: u32,
    /// Made inside torch's convolution module.
    conv: bool,
    /// May give way under pressure (see [`AllocTrace::from_file`]).
    yields: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Alloc(usize),
    Free(usize),
    /// The allocator released its free segments (`torch.cuda.empty_cache()`: the trace's
    /// `segment_free` entries, one run of them per call).
    Release,
}

/// One device's allocations and frees in order, frees paired with their allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocTrace {
    allocs: Vec<Alloc>,
    events: Vec<Event>,
    frames: Vec<String>,
}

impl AllocTrace {
    /// From a device of the agent's file; a free of an address not allocated in the trace
    /// (allocated before the recording began) is dropped (the reserved-peak check catches
    /// a trace that misses what mattered).
    ///
    /// An allocation **yields** when it is cuDNN's convolution workspace: freed right after
    /// it was made (nothing in between), and made by a convolution (or, in a job with
    /// convolutions, with no Python frame: the autograd thread's backward convolutions).
    /// PyTorch's cuDNN paths catch the OOM of a workspace and go on with a smaller one
    /// (aten/src/ATen/native/cudnn/Conv_v8.cpp: the workspace is halved until it fits;
    /// `try_plans` moves to the next plan), so a replay must not count its failure as the
    /// job's: it halves the request until it fits, or drops it. This is what made
    /// ResNet-50's NVML peak flatten near the capacity on the H200 (docs/fit.md).
    ///
    /// # Errors
    /// The ring buffer wrapped (the trace lacks its beginning) or it has no allocation.
    pub fn from_file(device: &DeviceTraceFile) -> Result<AllocTrace, String> {
        if device.truncated {
            return Err(format!(
                "device {}'s trace is truncated (the recording's buffer was full)",
                device.index
            ));
        }
        let mut frames: Vec<String> = vec![String::new()];
        let mut interned: HashMap<i64, u32> = HashMap::new();
        let mut live: HashMap<(i64, u64), usize> = HashMap::new();
        let mut allocs = Vec::new();
        let mut events = Vec::new();
        for &(kind, size, stream, addr, frame) in &device.events {
            match kind {
                0 | 3 => {
                    let next = u32::try_from(frames.len()).unwrap_or(u32::MAX);
                    let id = if frame < 0 {
                        0
                    } else {
                        *interned.entry(frame).or_insert_with(|| {
                            let name = usize::try_from(frame)
                                .ok()
                                .and_then(|i| device.frames.get(i))
                                .cloned()
                                .unwrap_or_else(|| format!("frame {frame}"));
                            frames.push(name);
                            next
                        })
                    };
                    live.insert((stream, addr), allocs.len());
                    events.push(Event::Alloc(allocs.len()));
                    allocs.push(Alloc {
                        size_bytes: size,
                        stream,
                        frame: id,
                        conv: kind == 3,
                        yields: false,
                    });
                }
                1 => {
                    if let Some(a) = live.remove(&(stream, addr)) {
                        events.push(Event::Free(a));
                    }
                }
                2 if events.last() != Some(&Event::Release) => events.push(Event::Release),
                _ => {}
            }
        }
        if allocs.is_empty() {
            return Err(format!("device {}'s trace has no allocation", device.index));
        }
        let convolutions = allocs.iter().any(|a| a.conv);
        for pair in events.windows(2) {
            if let [Event::Alloc(i), Event::Free(j)] = *pair
                && i == j
                && (allocs[i].conv || (convolutions && allocs[i].frame == 0))
            {
                allocs[i].yields = true;
            }
        }
        Ok(AllocTrace {
            allocs,
            events,
            frames,
        })
    }

    /// Allocations in the trace.
    #[must_use]
    pub fn allocations(&self) -> usize {
        self.allocs.len()
    }

    fn key(&self, a: &Alloc) -> (i64, &str) {
        (a.stream, self.frames[a.frame as usize].as_str())
    }

    /// The reserved peak of the trace as recorded (`None`: it ran out of `capacity_bytes`).
    fn replay(&self, sizes: &[u64], capacity_bytes: u64) -> Option<u64> {
        let mut allocator = LimitedAllocator::new(
            Settings::default(),
            Capacity {
                bytes: capacity_bytes,
                fraction_set: false,
            },
        );
        let mut handles: Vec<Option<Handle>> = vec![None; self.allocs.len()];
        for event in &self.events {
            match *event {
                Event::Alloc(i) => {
                    let a = &self.allocs[i];
                    let mut size = sizes[i];
                    handles[i] = loop {
                        match allocator.malloc(a.stream, (0, 0), size) {
                            Ok(h) => break Some(h),
                            // A workspace gives way: halved, then none.
                            Err(_) if a.yields && size > ROUND_BYTES => size /= 2,
                            Err(_) if a.yields => break None,
                            Err(_) => return None,
                        }
                    };
                }
                Event::Free(i) => {
                    if let Some(h) = handles[i].take() {
                        allocator.free(h);
                    }
                }
                Event::Release => allocator.release_cached(),
            }
        }
        Some(allocator.peak_reserved)
    }
}

/// How one allocation's size depends on the value.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scaling {
    Fixed(u64),
    /// `c·v`.
    Linear(f64),
    /// `c·v²`.
    Quadratic(f64),
    /// `a + b·v`.
    Affine(f64, f64),
}

impl Scaling {
    /// From sizes `s1` at `v1` and `s2` at `v2` (`v1 < v2`), the simplest form that gives
    /// both within the allocator's rounding (a size is the request rounded up to 512 B, so
    /// `c·v ≤ s < c·v + 512`).
    #[allow(clippy::cast_precision_loss)]
    fn classify(s1: u64, v1: u64, s2: u64, v2: u64) -> Scaling {
        if s1 == s2 {
            return Scaling::Fixed(s2);
        }
        let r = ROUND_BYTES as f64;
        let (s1f, s2f, v1f, v2f) = (s1 as f64, s2 as f64, v1 as f64, v2 as f64);
        // c's interval from each point, for v^p: [(s − r)/v^p, s/v^p]; both must meet.
        let meets = |p: i32| {
            let (a1, b1) = ((s1f - r) / v1f.powi(p), s1f / v1f.powi(p));
            let (a2, b2) = ((s2f - r) / v2f.powi(p), s2f / v2f.powi(p));
            a1.max(a2) <= b1.min(b2)
        };
        if meets(1) {
            Scaling::Linear(s2f / v2f)
        } else if meets(2) {
            Scaling::Quadratic(s2f / (v2f * v2f))
        } else {
            let b = (s2f - s1f) / (v2f - v1f);
            Scaling::Affine(s2f - b * v2f, b)
        }
    }

    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    fn at(self, v: u64) -> u64 {
        let v = v as f64;
        let bytes = match self {
            Scaling::Fixed(s) => return s,
            Scaling::Linear(c) => c * v,
            Scaling::Quadratic(c) => c * v * v,
            Scaling::Affine(a, b) => a + b * v,
        };
        // Rounded up, as the request was; a shrinking affine size stays a real request.
        bytes.ceil().clamp(1.0, UNLIMITED_BYTES as f64) as u64
    }
}

/// One trial as the predictor needs it.
#[derive(Debug, Clone, Copy)]
pub struct TracedTrial<'a> {
    pub value: u64,
    pub trace: &'a AllocTrace,
    /// torch's `max_memory_reserved` in that trial (the agent's counters).
    pub reserved_peak_bytes: Option<u64>,
    /// NVML's peak of the trial's processes on the device.
    pub nvml_peak_bytes: Option<u64>,
}

/// What the job may use on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// total − driver-reserved − other processes (the latest trial's).
    pub capacity_bytes: u64,
    /// `(1 − margin)·capacity`; `None` without a margin.
    pub usable_bytes: Option<u64>,
    /// The range's top.
    pub high: u64,
}

/// The predictor's answer for one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TracePrediction {
    /// The largest value predicted to fit (at least the larger trial's value).
    pub value: u64,
    /// The replay's reserved peak at it.
    pub reserved_peak_bytes: u64,
    /// Memory outside the allocator's pool (NVML − reserved), added to the replay.
    pub other_bytes: u64,
    /// Matched allocations by how their size depends on the value.
    pub fixed: usize,
    pub linear: usize,
    pub quadratic: usize,
    pub affine: usize,
    /// Allocations of the larger trial without a partner (kept at their size).
    pub unmatched: usize,
}

/// Why the traces were not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the two trials' values are not increasing ({v1} then {v2})")]
    Values { v1: u64, v2: u64 },
    #[error(
        "the traces do not line up: {unmatched} of {total} allocations at value {value} have no partner at the other value (more than {share_percent}%)"
    )]
    Unmatched {
        value: u64,
        unmatched: usize,
        total: usize,
        share_percent: u32,
    },
    #[error(
        "the trace of value {value} replays to a reserved peak of {replayed_bytes} B, torch measured {measured_bytes} B (more than 2% apart)"
    )]
    Replay {
        value: u64,
        replayed_bytes: u64,
        measured_bytes: u64,
    },
    #[error("torch's reserved peak of the trial at value {value} is unknown")]
    NoReservedPeak { value: u64 },
    #[error("the replay at value {value}, which ran, does not fit the capacity (or the margin)")]
    KnownValueDoesNotFit { value: u64 },
}

/// The largest value predicted to fit on one device (the module's docs).
///
/// # Errors
/// [`Refusal`] when the traces cannot be trusted or matched.
pub fn predict(
    a: TracedTrial<'_>,
    b: TracedTrial<'_>,
    limits: Limits,
) -> Result<TracePrediction, Refusal> {
    if a.value >= b.value {
        return Err(Refusal::Values {
            v1: a.value,
            v2: b.value,
        });
    }
    for t in [&a, &b] {
        let measured = t
            .reserved_peak_bytes
            .ok_or(Refusal::NoReservedPeak { value: t.value })?;
        let sizes: Vec<u64> = t.trace.allocs.iter().map(|x| x.size_bytes).collect();
        let replayed = t.trace.replay(&sizes, UNLIMITED_BYTES).unwrap_or(u64::MAX);
        #[allow(clippy::cast_precision_loss)]
        let off = replayed.abs_diff(measured) as f64 > MAX_REPLAY_ERROR * measured as f64;
        if off {
            return Err(Refusal::Replay {
                value: t.value,
                replayed_bytes: replayed,
                measured_bytes: measured,
            });
        }
    }
    let (scalings, counts) = matched(a, b)?;
    let other_bytes = [a, b]
        .iter()
        .filter_map(|t| Some(t.nvml_peak_bytes?.saturating_sub(t.reserved_peak_bytes?)))
        .max()
        .unwrap_or(0);
    let replay_at = |v: u64, capacity: u64| -> Option<u64> {
        let sizes: Vec<u64> = scalings.iter().map(|s| s.at(v)).collect();
        b.trace.replay(&sizes, capacity)
    };
    // Whether `v` fits, and the replay's peak there.
    let fits = |v: u64| -> Option<u64> {
        match limits.usable_bytes {
            Some(usable) => {
                let peak = replay_at(v, UNLIMITED_BYTES)?;
                (peak.saturating_add(other_bytes) <= usable).then_some(peak)
            }
            None => replay_at(v, limits.capacity_bytes.saturating_sub(other_bytes)),
        }
    };
    let Some(mut best_peak) = fits(b.value) else {
        return Err(Refusal::KnownValueDoesNotFit { value: b.value });
    };
    let (mut lo, mut hi) = (b.value, limits.high.max(b.value));
    if let Some(peak) = fits(hi) {
        lo = hi;
        best_peak = peak;
    } else {
        // lo fits, hi does not.
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match fits(mid) {
                Some(peak) => {
                    lo = mid;
                    best_peak = peak;
                }
                None => hi = mid,
            }
        }
    }
    Ok(TracePrediction {
        value: lo,
        reserved_peak_bytes: best_peak,
        other_bytes,
        ..counts
    })
}

/// Each allocation of `b`'s trace with how its size scales, and the counts by kind.
///
/// Allocations are paired per key (stream, first Python frame outside torch) in order:
/// the k-th of a key in one trace with the k-th in the other when the key made as many
/// allocations in both. Where the counts differ — the allocations with no Python frame,
/// made by the autograd engine's thread in backward, whose kernels (cuDNN's algorithms,
/// their workspaces) change with the batch — pairing by position matches unrelated
/// allocations from the first difference on, and an affine line through two unrelated
/// sizes extrapolates to nonsense (ConvNeXt-T on the H100: the backward's allocations
/// replayed at batch 1282 to 551 GB of requests against 344 GB recorded there, a reserved
/// peak of 106 GB against 82 GB). There the two sequences are aligned ([`align`]): the most
/// pairs, in order, whose sizes scale simply between the values; the rest keep their size.
fn matched<'t>(
    a: TracedTrial<'t>,
    b: TracedTrial<'t>,
) -> Result<(Vec<Scaling>, TracePrediction), Refusal> {
    let mut in_a: HashMap<(i64, &str), Vec<usize>> = HashMap::new();
    for (i, x) in a.trace.allocs.iter().enumerate() {
        in_a.entry(a.trace.key(x)).or_default().push(i);
    }
    let mut in_b: HashMap<(i64, &str), Vec<usize>> = HashMap::new();
    for (i, y) in b.trace.allocs.iter().enumerate() {
        in_b.entry(b.trace.key(y)).or_default().push(i);
    }
    // b's allocation → its partner in a.
    let mut partner: Vec<Option<usize>> = vec![None; b.trace.allocs.len()];
    let mut cells_left = MAX_ALIGN_CELLS;
    for (key, ys) in &in_b {
        let Some(xs) = in_a.get(key) else { continue };
        let aligned = if xs.len() == ys.len() {
            None
        } else {
            let sizes = |t: &AllocTrace, is: &[usize]| -> Vec<u64> {
                is.iter().map(|&i| t.allocs[i].size_bytes).collect()
            };
            align(
                &sizes(a.trace, xs),
                a.value,
                &sizes(b.trace, ys),
                b.value,
                &mut cells_left,
            )
        };
        match aligned {
            Some(pairs) => {
                for (i, j) in pairs {
                    partner[ys[j]] = Some(xs[i]);
                }
            }
            // As many in both, or too long to align: by position.
            None => {
                for (&x, &y) in xs.iter().zip(ys) {
                    partner[y] = Some(x);
                }
            }
        }
    }
    let mut counts = TracePrediction {
        value: 0,
        reserved_peak_bytes: 0,
        other_bytes: 0,
        fixed: 0,
        linear: 0,
        quadratic: 0,
        affine: 0,
        unmatched: 0,
    };
    let mut matched_in_a = 0usize;
    let scalings: Vec<Scaling> = b
        .trace
        .allocs
        .iter()
        .zip(&partner)
        .map(|(y, partner)| {
            let Some(i) = *partner else {
                counts.unmatched += 1;
                return Scaling::Fixed(y.size_bytes);
            };
            matched_in_a += 1;
            let s = Scaling::classify(a.trace.allocs[i].size_bytes, a.value, y.size_bytes, b.value);
            match s {
                Scaling::Fixed(_) => counts.fixed += 1,
                Scaling::Linear(_) => counts.linear += 1,
                Scaling::Quadratic(_) => counts.quadratic += 1,
                Scaling::Affine(..) => counts.affine += 1,
            }
            s
        })
        .collect();
    let unmatched_a = a.trace.allocs.len() - matched_in_a;
    for (value, unmatched, total) in [
        (b.value, counts.unmatched, b.trace.allocs.len()),
        (a.value, unmatched_a, a.trace.allocs.len()),
    ] {
        #[allow(clippy::cast_precision_loss)]
        if unmatched as f64 > MAX_UNMATCHED_SHARE * total as f64 {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            return Err(Refusal::Unmatched {
                value,
                unmatched,
                total,
                share_percent: (MAX_UNMATCHED_SHARE * 100.0).round() as u32,
            });
        }
    }
    Ok((scalings, counts))
}

/// The most table cells the alignments of one prediction may fill together (two sequences
/// of ~4,500 allocations; 80 MB at most at once, a fraction of a second): past it, keys are
/// paired by position. A budget for all keys, not one per key, so a trace of many keys
/// with differing counts stays as bounded in time as one.
const MAX_ALIGN_CELLS: usize = 20_000_000;

/// Aligns one key's allocation sizes at `v1` (`xs`) and `v2` (`ys`): pairs in order in both
/// (a weighted longest common subsequence), the most pairs whose sizes scale as a fixed
/// size, `c·v` or `c·v²` does first (weight 2), then pairs that only fit a line `a + b·v`
/// (weight 1: two sizes fit some line, so such a pair is evidence only where the simple
/// pairs around it anchor the alignment — cuDNN's workspaces between the same layers);
/// `None` when the table would exceed the `cells_left` of the budget ([`MAX_ALIGN_CELLS`]),
/// which it draws from.
fn align(
    xs: &[u64],
    v1: u64,
    ys: &[u64],
    v2: u64,
    cells_left: &mut usize,
) -> Option<Vec<(usize, usize)>> {
    let (n, m) = (xs.len(), ys.len());
    let cells = (n + 1).checked_mul(m + 1)?;
    *cells_left = cells_left.checked_sub(cells)?;
    let weight = |i: usize, j: usize| -> u32 {
        if matches!(Scaling::classify(xs[i], v1, ys[j], v2), Scaling::Affine(..)) {
            1
        } else {
            2
        }
    };
    // best[i][j]: the heaviest alignment of xs[i..] and ys[j..], row-major (n + 1) × (m + 1).
    let w = m + 1;
    let mut best = vec![0_u32; (n + 1) * w];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            let pair = best[(i + 1) * w + j + 1] + weight(i, j);
            best[i * w + j] = pair.max(best[(i + 1) * w + j]).max(best[i * w + j + 1]);
        }
    }
    let mut pairs = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n && j < m {
        if best[i * w + j] == best[(i + 1) * w + j + 1] + weight(i, j) {
            pairs.push((i, j));
            i += 1;
            j += 1;
        } else if best[i * w + j] == best[(i + 1) * w + j] {
            i += 1;
        } else {
            j += 1;
        }
    }
    Some(pairs)
}

#[cfg(test)]
pub(crate) mod synthetic {
    //! Synthetic allocator traces: a training step's pattern (weights, optimizer state,
    //! activations kept for backward, a temporary per layer, gradients), the sizes as a
    //! job at a value would request them. The test double of a real job's trace.

    use super::{AllocTrace, DeviceTraceFile, UNLIMITED_BYTES};

    const MIB: u64 = 1 << 20;

    /// A synthetic trial: whether the job's own trace fits a pool of `pool_bytes` (the
    /// allocator's free-and-retry included), and its reserved peak.
    pub struct Ran {
        pub fits: bool,
        pub reserved_peak_bytes: u64,
    }

    pub fn run(job: Job, value: u64, pool_bytes: u64) -> Ran {
        let trace = AllocTrace::from_file(&trace(job, value)).expect("synthetic trace");
        let sizes: Vec<u64> = trace.allocs.iter().map(|a| a.size_bytes).collect();
        let limited = trace.replay(&sizes, pool_bytes);
        let reserved_peak_bytes = limited.unwrap_or_else(|| {
            trace
                .replay(&sizes, UNLIMITED_BYTES)
                .unwrap_or(u64::MAX)
                .min(pool_bytes)
        });
        Ran {
            fits: limited.is_some(),
            reserved_peak_bytes,
        }
    }

    /// The largest value whose trace fits `pool_bytes`, by bisection over whole traces.
    pub fn true_edge(job: Job, pool_bytes: u64) -> u64 {
        let (mut lo, mut hi) = (0u64, 1 << 20);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if run(job, mid, pool_bytes).fits {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// How a synthetic job's activations grow with the value.
    #[derive(Debug, Clone, Copy)]
    pub struct Job {
        pub layers: u64,
        /// Bytes per value of one layer's kept activation.
        pub act_per_value: u64,
        /// Bytes per value² of one layer's attention scores (0: none; a temporary).
        pub scores_per_value2: u64,
        /// Weights of one layer.
        pub weight_bytes: u64,
        /// A fixed odd-sized buffer, to exercise the small pool.
        pub small_bytes: u64,
    }

    impl Job {
        pub fn gpt_like() -> Job {
            Job {
                layers: 12,
                act_per_value: 24 * MIB + 4096,
                scores_per_value2: 0,
                weight_bytes: 28 * MIB,
                small_bytes: 3000,
            }
        }
    }

    /// The trace of two training steps at `value`.
    pub fn trace(job: Job, value: u64) -> DeviceTraceFile {
        let mut events = Vec::new();
        let mut next_addr = 1u64 << 40;
        let mut alloc = |events: &mut Vec<(u8, u64, i64, u64, i64)>, size: u64, frame: i64| {
            next_addr += 1 << 36;
            events.push((0, size, 0, next_addr, frame));
            next_addr
        };
        let free = |events: &mut Vec<(u8, u64, i64, u64, i64)>, addr: u64| {
            events.push((1, 0, 0, addr, 0));
        };
        let weights: Vec<u64> = (0..job.layers)
            .map(|_| alloc(&mut events, job.weight_bytes, 0))
            .collect();
        let mut state = Vec::new();
        for step in 0..2 {
            let mut kept = Vec::new();
            for _ in 0..job.layers {
                let small = alloc(&mut events, job.small_bytes, 1);
                if job.scores_per_value2 > 0 {
                    let s = alloc(&mut events, job.scores_per_value2 * value * value, 3);
                    free(&mut events, s);
                }
                kept.push(alloc(&mut events, job.act_per_value * value, 2));
                let tmp = alloc(&mut events, job.act_per_value * value / 2 + 777, 4);
                free(&mut events, tmp);
                free(&mut events, small);
            }
            let grads: Vec<u64> = (0..job.layers)
                .map(|_| {
                    let g = alloc(&mut events, job.weight_bytes, 5);
                    if let Some(a) = kept.pop() {
                        free(&mut events, a);
                    }
                    g
                })
                .collect();
            if step == 0 {
                for _ in 0..2 * job.layers {
                    state.push(alloc(&mut events, job.weight_bytes, 6));
                }
            }
            for g in grads {
                free(&mut events, g);
            }
        }
        let _ = (weights, state);
        DeviceTraceFile {
            index: 0,
            uuid: Some("00000000-0000-0000-0000-000000000000".to_owned()),
            truncated: false,
            frames: (0..7)
                .map(|i| format!("train.py:{} f{i}", 10 + i))
                .collect(),
            events,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::synthetic::{Job, trace};
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    const CONTEXT: u64 = 600 * MIB;

    fn parsed(job: Job, value: u64) -> AllocTrace {
        AllocTrace::from_file(&trace(job, value)).expect("trace")
    }

    /// The true reserved peak at `value` (the replay of that value's own trace).
    fn reserved(job: Job, value: u64) -> u64 {
        let t = parsed(job, value);
        let sizes: Vec<u64> = t.allocs.iter().map(|a| a.size_bytes).collect();
        t.replay(&sizes, UNLIMITED_BYTES).expect("unlimited")
    }

    fn trial(trace: &AllocTrace, job: Job, value: u64) -> TracedTrial<'_> {
        let r = reserved(job, value);
        TracedTrial {
            value,
            trace,
            reserved_peak_bytes: Some(r),
            nvml_peak_bytes: Some(r + CONTEXT),
        }
    }

    /// The true edge: the largest value whose own trace fits under `capacity` (replayed
    /// with free-and-retry), found by trying every value.
    fn true_edge(job: Job, capacity: u64, high: u64) -> u64 {
        (1..=high)
            .take_while(|&v| {
                let t = parsed(job, v);
                let sizes: Vec<u64> = t.allocs.iter().map(|a| a.size_bytes).collect();
                t.replay(&sizes, capacity - CONTEXT).is_some()
            })
            .last()
            .unwrap_or(0)
    }

    #[test]
    fn sizes_are_classified_fixed_linear_quadratic_or_affine() {
        assert_eq!(Scaling::classify(4096, 8, 4096, 16), Scaling::Fixed(4096));
        // 1000 B per value, rounded up to 512: 8000 → 8192, 16000 → 16384.
        assert!(matches!(
            Scaling::classify(8192, 8, 16384, 16),
            Scaling::Linear(_)
        ));
        // 100 B per value²: 6400 → 6656, 25600 → 25600.
        assert!(matches!(
            Scaling::classify(6656, 8, 25600, 16),
            Scaling::Quadratic(_)
        ));
        // 1 MiB + 1000 B per value.
        let s = Scaling::classify(MIB + 8192, 8, MIB + 16384, 16);
        assert!(matches!(s, Scaling::Affine(..)), "{s:?}");
        assert_eq!(s.at(32), MIB + 32768);
        assert_eq!(Scaling::classify(6656, 8, 25600, 16).at(32), 102_400);
    }

    #[test]
    fn a_linear_job_is_predicted_at_its_true_edge_from_two_small_trials() {
        let job = Job::gpt_like();
        let capacity = 80 * GIB;
        let (t8, t40) = (parsed(job, 8), parsed(job, 40));
        let p = predict(
            trial(&t8, job, 8),
            trial(&t40, job, 40),
            Limits {
                capacity_bytes: capacity,
                usable_bytes: None,
                high: 4096,
            },
        )
        .expect("predicted");
        let truth = true_edge(job, capacity, 400);
        assert_eq!(p.value, truth, "{p:?}");
        assert_eq!(p.other_bytes, CONTEXT);
        assert_eq!(p.unmatched, 0);
        assert!(p.linear > 0 && p.fixed > 0 && p.quadratic == 0, "{p:?}");
    }

    #[test]
    fn a_quadratic_sequence_length_is_detected_and_extrapolated() {
        let job = Job {
            layers: 4,
            act_per_value: 64 * 1024,
            scores_per_value2: 32,
            weight_bytes: 8 * MIB,
            small_bytes: 1024,
        };
        let capacity = 8 * GIB;
        let (a, b) = (parsed(job, 512), parsed(job, 1024));
        let p = predict(
            trial(&a, job, 512),
            trial(&b, job, 1024),
            Limits {
                capacity_bytes: capacity,
                usable_bytes: None,
                high: 65536,
            },
        )
        .expect("predicted");
        assert!(p.quadratic > 0, "{p:?}");
        let truth = true_edge_search(job, capacity);
        assert_eq!(p.value, truth, "{p:?}");
    }

    /// The true edge by bisection over whole traces (for large ranges).
    fn true_edge_search(job: Job, capacity: u64) -> u64 {
        let fits = |v: u64| {
            let t = parsed(job, v);
            let sizes: Vec<u64> = t.allocs.iter().map(|a| a.size_bytes).collect();
            t.replay(&sizes, capacity - CONTEXT).is_some()
        };
        let (mut lo, mut hi) = (1u64, 1 << 20);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) { lo = mid } else { hi = mid }
        }
        lo
    }

    #[test]
    fn a_margin_compares_the_unlimited_peak_with_the_usable_share() {
        let job = Job::gpt_like();
        let capacity = 80 * GIB;
        let usable = capacity / 10 * 9;
        let (t8, t40) = (parsed(job, 8), parsed(job, 40));
        let p = predict(
            trial(&t8, job, 8),
            trial(&t40, job, 40),
            Limits {
                capacity_bytes: capacity,
                usable_bytes: Some(usable),
                high: 4096,
            },
        )
        .expect("predicted");
        assert!(reserved(job, p.value) + CONTEXT <= usable);
        assert!(reserved(job, p.value + 1) + CONTEXT > usable);
    }

    #[test]
    fn traces_that_do_not_line_up_or_do_not_replay_are_refused_with_why() {
        let job = Job::gpt_like();
        let limits = Limits {
            capacity_bytes: 80 * GIB,
            usable_bytes: None,
            high: 4096,
        };
        // Another program at the larger value: every frame differs.
        let mut other = trace(job, 40);
        for f in &mut other.frames {
            f.push_str(" (chunked)");
        }
        let (t8, t40) = (
            parsed(job, 8),
            AllocTrace::from_file(&other).expect("trace"),
        );
        let err = predict(trial(&t8, job, 8), trial(&t40, job, 40), limits).expect_err("refused");
        assert!(matches!(err, Refusal::Unmatched { value: 40, .. }), "{err}");
        assert!(
            err.to_string().starts_with("the traces do not line up: "),
            "{err}"
        );

        // torch measured another peak than the trace gives: the trace missed allocations.
        let t40 = parsed(job, 40);
        let mut b = trial(&t40, job, 40);
        b.reserved_peak_bytes = b.reserved_peak_bytes.map(|r| r + 4 * GIB);
        let err = predict(trial(&t8, job, 8), b, limits).expect_err("refused");
        assert!(matches!(err, Refusal::Replay { value: 40, .. }), "{err}");

        // No reserved peak (agent's counters missing), values not increasing.
        let mut b = trial(&t40, job, 40);
        b.reserved_peak_bytes = None;
        assert_eq!(
            predict(trial(&t8, job, 8), b, limits),
            Err(Refusal::NoReservedPeak { value: 40 })
        );
        assert_eq!(
            predict(trial(&t40, job, 40), trial(&t8, job, 8), limits),
            Err(Refusal::Values { v1: 40, v2: 8 })
        );
    }

    #[test]
    fn an_empty_cache_in_the_trace_releases_the_free_segments_in_the_replay() {
        let file = |release: bool| {
            let mut events = vec![(0, 100 * MIB, 0, 1 << 40, -1), (1, 0, 0, 1 << 40, -1)];
            if release {
                events.push((2, 100 * MIB, 0, 1 << 40, -1));
                events.push((2, 2 * MIB, 0, 1 << 41, -1));
            }
            events.push((0, 60 * MIB, 0, 1 << 42, -1));
            events.push((0, 60 * MIB, 0, 1 << 43, -1));
            DeviceTraceFile {
                index: 0,
                uuid: None,
                truncated: false,
                frames: Vec::new(),
                events,
            }
        };
        let peak = |release| {
            let t = AllocTrace::from_file(&file(release)).expect("trace");
            let sizes: Vec<u64> = t.allocs.iter().map(|a| a.size_bytes).collect();
            t.replay(&sizes, UNLIMITED_BYTES).expect("unlimited")
        };
        // Without it the first 60 MiB splits the cached 100 MiB segment and the second
        // needs a segment of its own; after it both get new ones.
        assert_eq!(peak(false), 160 * MIB);
        assert_eq!(peak(true), 120 * MIB);
        // One release per run of segment_free entries.
        let t = AllocTrace::from_file(&file(true)).expect("trace");
        assert_eq!(t.events.iter().filter(|e| **e == Event::Release).count(), 1);
    }

    #[test]
    fn a_convolution_workspace_gives_way_under_pressure_other_allocations_do_not() {
        // 1 GiB kept, then a transient 512 MiB (a workspace if made by a convolution),
        // then a transient 256 MiB from the autograd thread (no frame).
        let file = |kind: u8| DeviceTraceFile {
            index: 0,
            uuid: None,
            truncated: false,
            frames: vec!["model.py:3 forward".to_owned()],
            events: vec![
                (0, GIB, 0, 1 << 40, 0),
                (kind, 512 * MIB, 0, 2 << 40, 0),
                (1, 0, 0, 2 << 40, 0),
                (0, 256 * MIB, 0, 3 << 40, -1),
                (1, 0, 0, 3 << 40, -1),
            ],
        };
        let fits = |kind: u8, pool: u64| {
            let t = AllocTrace::from_file(&file(kind)).expect("trace");
            let sizes: Vec<u64> = t.allocs.iter().map(|a| a.size_bytes).collect();
            t.replay(&sizes, pool)
        };
        // A convolution's: the job goes on (with a 128 MiB workspace, halved twice).
        assert_eq!(fits(3, GIB + 200 * MIB), Some(GIB + 128 * MIB));
        // Any other allocation's OOM is the job's.
        assert_eq!(fits(0, GIB + 200 * MIB), None);
        // Without room even for the smallest, the workspace is dropped.
        assert_eq!(fits(3, GIB), Some(GIB));
    }

    #[test]
    fn a_truncated_or_empty_trace_is_refused_and_files_parse_or_say_why() {
        let mut t = trace(Job::gpt_like(), 8);
        t.truncated = true;
        assert!(
            AllocTrace::from_file(&t)
                .expect_err("truncated")
                .contains("truncated")
        );
        t.truncated = false;
        t.events.clear();
        assert!(
            AllocTrace::from_file(&t)
                .expect_err("empty")
                .contains("no allocation")
        );

        let json = br#"{"version":1,"devices":[{"index":0,"uuid":"abc","truncated":false,
            "frames":["t.py:3 f"],"events":[[0,1024,0,4096,0],[1,1024,0,4096,0],[7,1,0,0,-1]]}]}"#;
        let f = TraceFile::parse(json).expect("parses");
        let t = AllocTrace::from_file(&f.devices[0]).expect("trace");
        assert_eq!(t.allocations(), 1);
        assert_eq!(t.events, vec![Event::Alloc(0), Event::Free(0)]);
        assert!(
            TraceFile::parse(br#"{"version":2,"devices":[]}"#)
                .expect_err("version")
                .contains("version 2")
        );
        assert!(
            TraceFile::parse(b"[")
                .expect_err("json")
                .starts_with("not a trace file")
        );
    }

    #[test]
    fn an_allocation_only_one_trace_made_is_skipped_not_paired_with_the_next() {
        // At 2 and 4: a workspace (7 KiB) the larger trial's algorithm needed in the middle.
        let kib = 1024;
        let xs = [2 * kib, 100 * kib, 6 * kib];
        let ys = [4 * kib, 200 * kib, 7 * kib, 12 * kib];
        assert_eq!(
            align(&xs, 2, &ys, 4, &mut 100),
            Some(vec![(0, 0), (1, 1), (2, 3)])
        );
        // By position the last two would pair 6 KiB with 7 KiB (a line) and leave 12 KiB.
        // Where nothing scales simply, affine pairs fill in, in order.
        assert_eq!(
            align(&[3 * kib], 2, &[5 * kib, 9 * kib], 4, &mut 100),
            Some(vec![(0, 0)])
        );
        // The tables of one prediction share a budget: (3 + 1) × (4 + 1) cells once, then
        // nothing left for a second.
        let mut left = 25;
        assert!(align(&xs, 2, &ys, 4, &mut left).is_some());
        assert_eq!((left, align(&xs, 2, &ys, 4, &mut left)), (5, None));
    }
}

/// The H100's recorded calibration traces (2026-12-05, `scripts/fit/capture-traces.py`,
/// testdata/h100/round5/traces): the tuning data of the alignment in [`matched`].
#[cfg(test)]
mod h100_traces {
    use super::*;

    const CONVNEXT_8: &str =
        include_str!("../../../testdata/h100/round5/traces/convnext-8.trace.json");
    const CONVNEXT_37: &str =
        include_str!("../../../testdata/h100/round5/traces/convnext-37.trace.json");
    const VIT_8: &str = include_str!("../../../testdata/h100/round5/traces/vit-8.trace.json");
    const VIT_30: &str = include_str!("../../../testdata/h100/round5/traces/vit-30.trace.json");
    /// The fit run's device capacity and memory outside the pool (its JSON).
    const CAPACITY_BYTES: u64 = 85_017_493_504;
    const OTHER_BYTES: u64 = 796_917_760;

    fn trace(json: &str) -> AllocTrace {
        let file = TraceFile::parse(json.as_bytes()).expect("a recorded trace");
        AllocTrace::from_file(&file.devices[0]).expect("its device")
    }

    fn prediction(small: (&str, u64, u64), large: (&str, u64, u64)) -> TracePrediction {
        let (a, b) = (trace(small.0), trace(large.0));
        let trial = |trace, value, reserved: u64| TracedTrial {
            value,
            trace,
            reserved_peak_bytes: Some(reserved),
            nvml_peak_bytes: Some(reserved + OTHER_BYTES),
        };
        let limits = Limits {
            capacity_bytes: CAPACITY_BYTES,
            usable_bytes: None,
            high: 4096,
        };
        predict(
            trial(&a, small.1, small.2),
            trial(&b, large.1, large.2),
            limits,
        )
        .expect("a prediction")
    }

    #[test]
    fn convnext_s_backward_aligned_predicts_its_edge_within_the_tolerance() {
        // Batch 8 and 37: the backward (no Python frame) made 1,527 allocations at 37 and
        // fewer at 8; paired by position, the prediction was 1284 (−4.9 %; truth 1350 by
        // bisection on the same H100).
        let p = prediction(
            (CONVNEXT_8, 8, 1_134_559_232),
            (CONVNEXT_37, 37, 3_158_310_912),
        );
        assert!((1323..=1377).contains(&p.value), "{p:?}");
        // The traces differ by 124 allocations; the alignment pairs the rest.
        assert_eq!(p.unmatched, 124, "{p:?}");
    }

    #[test]
    fn vit_s_large_batches_chunk_what_the_small_ones_did_whole_which_no_two_traces_show() {
        // Equal counts at 8 and 30, so nothing to align: at 1113 the backward made 1,699
        // allocations of 394 GB where the calibration's pattern extrapolates 1,287 of 659
        // GB (large tensors split into chunks). The prediction stays 4.3 % low (truth 1175):
        // an open miss of issue 34, pinned.
        let p = prediction((VIT_8, 8, 2_076_180_480), (VIT_30, 30, 3_705_667_584));
        assert_eq!((p.value, p.unmatched), (1125, 0), "{p:?}");
    }
}
