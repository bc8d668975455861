//! Why an `oom` event of a snapshot's trace happened, and a fix only where a replay says it
//! works (docs/snapshot.md, "Causes of an OOM").
//!
//! The evidence is the state right before the OOM ([`Replay`]), the request, the free bytes
//! cudaMemGetInfo gave the allocator at that moment (`device_free`), the allocator's
//! settings, and the trace before it. The causes, in the order they are tried:
//!
//! - `leak`: the floor of live memory rose window after window of a loop that frees most
//!   of what it allocates (thresholds below), so the OOM is where it met the ceiling;
//! - `process-limit`: the device had room for the segment the allocator wanted, yet the
//!   allocator refused it and the live memory plus the request do not fit in what it
//!   had: a `set_per_process_memory_fraction` (or cgroup / MPS) limit;
//! - `other-process`: live memory plus the request are more than the process could get,
//!   but less than that plus what other processes held (known only with the device's total
//!   memory: [`OomContext`]);
//! - `shortage`: live memory plus the request are more than the process could get;
//! - `cached-elsewhere`: they fit, but only counting free memory cached on another stream
//!   or in a private pool (CUDA graph, MemPool) in segments the allocator cannot release;
//! - `fragmentation`: they fit, the free memory is the request's own, but no block holds it.
//!
//! A fix for `fragmentation` or `cached-elsewhere` comes from a counterfactual replay: the
//! trace up to the OOM through [`LimitedAllocator`] under the snapshot's settings must
//! fail at this OOM (the model reproduces it), and under the candidate it must succeed,
//! with the least memory the evidence allows. What the process may use is `reserved +
//! device_free` at the OOM; when the device had room and the allocator refused anyway, the
//! limit is only known to lie between the highest reserved of the trace and reserved + the
//! segment wanted: candidates are tried at the former, the settings reproduced at the
//! latter.

use std::collections::HashMap;

use serde::Serialize;
use vramctl_model::caching_allocator::{round_size, segment_size};
use vramctl_model::limited_allocator::{Capacity, Handle, LimitedAllocator, Settings};

use crate::model::{Action, Pool, Snapshot, StackId};
use crate::replay::{self, Replay};
use crate::size_text::human;
use crate::top;

/// Leak: the trace before the OOM is cut in this many windows of equal event counts.
/// Chosen on the generated choosing set (scripts/oom-snapshots.py, seeds 1-20).
pub const LEAK_WINDOWS: usize = 8;
/// Leak: of the successive live-memory floors of the windows after the first (which holds
/// the program's start: weights being loaded, its floor is what was there before), at
/// least this many steps must rise (of `LEAK_WINDOWS - 2`).
pub const LEAK_MIN_RISING_STEPS: usize = 5;
/// Leak: the floor's rise, first window to last, as a share of the live memory at the OOM.
pub const LEAK_MIN_GROWTH_SHARE: f64 = 0.25;
/// Leak: every window frees at least this share of what it allocates (a loop, not a model
/// being loaded, whose floor also rises).
pub const LEAK_MIN_FREED_SHARE: f64 = 0.5;
/// Counterfactual replays are run for the newest OOMs of a device only (each is a pass over
/// the trace per candidate setting).
pub const MAX_REPLAYED_OOMS_PER_DEVICE: usize = 3;
/// Free memory within this of a request does not show a limit: the driver keeps headroom
/// (page tables, its own allocations), so a request close to the free memory can fail with
/// no limit at all. Not chosen on data: the size of a CUDA context's reserve on current
/// GPUs, rounded up.
pub const LIMIT_HEADROOM_BYTES: u64 = 1 << 30;

/// The `max_split_size_mb` values tried, smallest first (PyTorch requires more than 20).
pub const MAX_SPLIT_CANDIDATES_MB: [u64; 7] = [32, 64, 128, 256, 512, 1024, 2048];

/// What the snapshot does not carry: the device's total memory (for `other-process`).
#[derive(Debug, Clone, Copy, Default)]
pub struct OomContext {
    pub device_total_bytes: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    Shortage,
    Fragmentation,
    OtherProcess,
    ProcessLimit,
    CachedElsewhere,
    Leak,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Shortage => "shortage",
            Cause::Fragmentation => "fragmentation",
            Cause::OtherProcess => "other-process",
            Cause::ProcessLimit => "process-limit",
            Cause::CachedElsewhere => "cached-elsewhere",
            Cause::Leak => "leak",
        }
    }
}

/// One counterfactual replay.
#[derive(Debug, Clone, Serialize)]
pub struct Counterfactual {
    /// The `PYTORCH_CUDA_ALLOC_CONF` tried (or `same stream`).
    pub setting: String,
    /// `succeeds`, `fails` (at this OOM), or `fails earlier` (at an earlier request).
    pub outcome: &'static str,
    pub capacity_bytes: u64,
}

/// Free memory cached where this request cannot use it.
#[derive(Debug, Clone, Serialize)]
pub struct CachedElsewhere {
    pub stream: i64,
    pub pool_id: (i64, i64),
    pub free_bytes: u64,
}

/// A stack whose live memory grew before the OOM.
#[derive(Debug, Clone, Serialize)]
pub struct Grown {
    pub stack: String,
    pub grew_bytes: u64,
}

/// The numbers a verdict rests on.
#[derive(Debug, Clone, Serialize)]
pub struct Evidence {
    /// The request rounded as the allocator rounds it.
    pub block_bytes: u64,
    /// What the allocator had to get from the driver for it (a new segment, or pages).
    pub new_memory_bytes: u64,
    /// Active bytes on the device right before the OOM.
    pub live_bytes: u64,
    pub reserved_bytes: u64,
    /// The least and most the process may have been allowed to reserve.
    pub usable_min_bytes: u64,
    pub usable_max_bytes: u64,
    /// Live + block − most usable, when positive.
    pub short_by_bytes: u64,
    /// Free in the request's own stream and pool, and its largest block.
    pub free_in_pool_bytes: u64,
    pub largest_free_block_bytes: u64,
    pub cached_elsewhere: Vec<CachedElsewhere>,
    /// Device total − reserved − free, where the total is known.
    pub other_processes_bytes: Option<u64>,
    /// Leak: the rise of the live floor before the OOM.
    pub live_floor_growth_bytes: Option<u64>,
    pub grew: Vec<Grown>,
    pub counterfactuals: Vec<Counterfactual>,
}

/// The cause of an OOM, its fix, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub cause: Cause,
    /// What would have avoided the OOM; None when nothing the job can set does.
    pub fix: Option<String>,
    /// One sentence with the numbers.
    pub why: String,
    pub evidence: Evidence,
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The allocator settings of the snapshot (defaults where it has none).
pub fn settings_of(snap: &Snapshot) -> Settings {
    let s = snap.allocator_settings.as_ref();
    let expandable = s.and_then(|s| s.expandable_segments).unwrap_or_else(|| {
        snap.segments.iter().any(|seg| seg.is_expandable)
            || s.and_then(|s| s.alloc_conf.as_deref()).is_some_and(|c| {
                conf_value(c, "expandable_segments").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            })
    });
    Settings {
        max_split_size_bytes: s.and_then(|s| s.max_split_size_bytes),
        garbage_collection_threshold: s
            .and_then(|s| s.garbage_collection_threshold)
            .filter(|t| *t > 0.0 && *t < 1.0),
        expandable_segments: expandable,
    }
}

/// `key`'s value in a `PYTORCH_CUDA_ALLOC_CONF` string (`a:b,c:d`).
pub fn conf_value<'c>(conf: &'c str, key: &str) -> Option<&'c str> {
    conf.split(',').find_map(|kv| {
        let (k, v) = kv.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// The trace through the OOM: live floors, peak reserved, and what each window allocated
/// and freed; one forward pass from the state before the first event.
struct History {
    peak_reserved_bytes: u64,
    /// Per window: (min live, allocated bytes, freed bytes, event index of the min).
    windows: Vec<(u64, u64, u64, usize)>,
}

fn history(snap: &Snapshot, device: i64, start: &Replay<'_>, oom_at: usize) -> History {
    let trace = replay::trace(snap, device);
    let mut live = start.live_bytes();
    let mut reserved = start.reserved_bytes();
    let mut peak = reserved;
    let mut sizes: HashMap<u64, u64> = start
        .segments()
        .flat_map(|s| s.blocks.iter().map(|(&a, b)| (a, b.size)))
        .collect();
    let n = oom_at.max(1);
    let per = n.div_ceil(LEAK_WINDOWS).max(1);
    let mut windows = Vec::new();
    let mut cur = (live, 0u64, 0u64, 0usize);
    for (i, e) in trace.iter().enumerate().take(oom_at) {
        match e.action {
            Action::Alloc => {
                let size = round_size(e.size);
                if let Some(addr) = e.addr {
                    sizes.insert(addr, size);
                }
                live = live.saturating_add(size);
                cur.1 = cur.1.saturating_add(size);
            }
            Action::FreeCompleted | Action::Free => {
                let size = e
                    .addr
                    .and_then(|a| sizes.remove(&a))
                    .unwrap_or_else(|| round_size(e.size));
                live = live.saturating_sub(size);
                cur.2 = cur.2.saturating_add(size);
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                reserved = reserved.saturating_add(e.size);
                peak = peak.max(reserved);
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                reserved = reserved.saturating_sub(e.size);
            }
            _ => {}
        }
        if live < cur.0 {
            cur.0 = live;
            cur.3 = i;
        }
        if (i + 1) % per == 0 {
            windows.push(cur);
            cur = (live, 0, 0, i);
        }
    }
    if cur.1 > 0 || cur.2 > 0 {
        windows.push(cur);
    }
    History {
        peak_reserved_bytes: peak,
        windows,
    }
}

/// The rise of the live floor when it looks like a leak (the thresholds above).
fn leak_growth(h: &History, live_at_oom: u64) -> Option<(u64, usize)> {
    if h.windows.len() < LEAK_WINDOWS {
        return None;
    }
    let looped = &h.windows[1..];
    let floors: Vec<u64> = looped.iter().map(|w| w.0).collect();
    let rising = floors.windows(2).filter(|p| p[1] > p[0]).count();
    let growth = floors.last()?.saturating_sub(floors[0]);
    #[allow(clippy::cast_precision_loss)]
    let share = growth as f64 / live_at_oom.max(1) as f64;
    #[allow(clippy::cast_precision_loss)]
    let loops = looped
        .iter()
        .all(|w| w.1 > 0 && w.2 as f64 >= LEAK_MIN_FREED_SHARE * w.1 as f64);
    (rising >= LEAK_MIN_RISING_STEPS && share >= LEAK_MIN_GROWTH_SHARE && loops)
        .then_some((growth, looped[0].3))
}

/// Live bytes per folded stack (its innermost user frame first).
fn live_by_stack(snap: &Snapshot, state: &Replay<'_>) -> HashMap<String, u64> {
    let mut out: HashMap<StackId, u64> = HashMap::new();
    for b in state.live_blocks() {
        *out.entry(b.stack).or_default() += b.size;
    }
    let mut named: HashMap<String, u64> = HashMap::new();
    for (stack, bytes) in out {
        *named
            .entry(top::folded(snap, stack).join(" < "))
            .or_default() += bytes;
    }
    named
}

/// A scenario for [`replay_to`].
struct Scenario {
    settings: Settings,
    capacity: Capacity,
    /// Every allocation on the OOM's stream.
    one_stream: bool,
}

enum Outcome {
    Succeeds,
    Fails,
    FailsEarlier,
}

impl Outcome {
    fn as_str(&self) -> &'static str {
        match self {
            Outcome::Succeeds => "succeeds",
            Outcome::Fails => "fails",
            Outcome::FailsEarlier => "fails earlier",
        }
    }
}

/// The trace from `start` through the OOM at `oom_at`, replayed under `sc`.
fn replay_to(
    snap: &Snapshot,
    device: i64,
    start: &Replay<'_>,
    private: &[(u64, u64, (i64, i64))],
    oom_at: usize,
    sc: &Scenario,
) -> Outcome {
    let trace = replay::trace(snap, device);
    let oom = &trace[oom_at];
    let stream_of = |s: i64| if sc.one_stream { oom.stream } else { s };
    let mut a = LimitedAllocator::new(sc.settings, sc.capacity);
    let mut handles: HashMap<u64, Handle> = HashMap::new();
    for s in start.segments() {
        let live: Vec<(u64, u64)> = s
            .blocks
            .iter()
            .map(|(&addr, b)| (addr.saturating_sub(s.start), b.size))
            .collect();
        let key = (stream_of(s.stream), s.pool_id, s.pool == Pool::Small);
        let made = a.insert_segment(key, s.end - s.start, &live);
        for (&addr, h) in s.blocks.keys().zip(made) {
            handles.insert(addr, h);
        }
    }
    let pool_of = |addr: u64| {
        let i = private.partition_point(|p| p.0 <= addr);
        i.checked_sub(1)
            .map(|i| private[i])
            .filter(|p| addr < p.1)
            .map_or((0, 0), |p| p.2)
    };
    for e in trace.iter().take(oom_at) {
        match e.action {
            Action::Alloc => {
                let Some(addr) = e.addr else { continue };
                match a.malloc(stream_of(e.stream), pool_of(addr), e.size) {
                    Ok(h) => {
                        handles.insert(addr, h);
                    }
                    Err(_) => return Outcome::FailsEarlier,
                }
            }
            Action::FreeCompleted | Action::Free => {
                if let Some(h) = e.addr.and_then(|addr| handles.remove(&addr)) {
                    a.free(h);
                }
            }
            _ => {}
        }
    }
    match a.malloc(oom.stream, (0, 0), oom.size) {
        Ok(_) => Outcome::Succeeds,
        Err(_) => Outcome::Fails,
    }
}

/// The verdict of the OOM at trace index `oom_at` of `device`; `before` is the state right
/// before it (the state after it: an `oom` changes nothing), `start` the state before the
/// trace's first event; `replays`: whether to run counterfactual replays for it.
#[allow(clippy::too_many_lines)]
pub fn classify(
    snap: &Snapshot,
    device: i64,
    oom_at: usize,
    before: &Replay<'_>,
    start: &Replay<'_>,
    ctx: OomContext,
    replays: bool,
) -> Verdict {
    let trace = replay::trace(snap, device);
    let oom = &trace[oom_at];
    let settings = settings_of(snap);
    let block = round_size(oom.size);
    let small = block <= vramctl_model::caching_allocator::SMALL_REQUEST_BYTES;
    let pool = if small { Pool::Small } else { Pool::Large };
    let new_memory = if settings.expandable_segments {
        let page = if small { 2 << 20 } else { 20 << 20 };
        block.div_ceil(page).saturating_mul(page)
    } else {
        segment_size(block)
    };
    let live = before.live_bytes();
    let reserved = before.reserved_bytes();
    let (free_in_pool, largest, _, _) = before.free_on(oom.stream, pool);
    let h = history(snap, device, start, oom_at);
    // The device had room for what the allocator asked the driver for, and it failed all
    // the same: a limit of the process's own.
    // Within the driver's headroom of it, a refusal is no evidence of a limit.
    let limited = oom
        .device_free
        .is_some_and(|f| f >= new_memory.saturating_add(LIMIT_HEADROOM_BYTES));
    let usable_min = match oom.device_free {
        Some(f) if !limited => reserved.saturating_add(f),
        _ => h.peak_reserved_bytes.max(reserved),
    };
    let usable_max = match oom.device_free {
        Some(f) if !limited => reserved.saturating_add(f),
        _ => reserved
            .saturating_add(new_memory)
            .saturating_sub(1)
            .max(usable_min),
    };
    let needed = live.saturating_add(block);
    let short_by = needed.saturating_sub(usable_max);
    let other = ctx
        .device_total_bytes
        .zip(oom.device_free)
        .map(|(total, f)| total.saturating_sub(reserved).saturating_sub(f));
    // Free memory this request cannot use: other streams' and private pools' segments that
    // the retry cannot release (they hold a live block, or belong to a private pool).
    let mut elsewhere: Vec<CachedElsewhere> = Vec::new();
    for s in before.segments() {
        let own = s.stream == oom.stream
            && s.pool_id == (0, 0)
            && (s.pool == pool || s.pool == Pool::Unknown);
        let releasable = s.blocks.is_empty() && s.pool_id == (0, 0);
        let free = s.free_bytes();
        if own || releasable || free == 0 {
            continue;
        }
        match elsewhere
            .iter_mut()
            .find(|c| c.stream == s.stream && c.pool_id == s.pool_id)
        {
            Some(c) => c.free_bytes = c.free_bytes.saturating_add(free),
            None => elsewhere.push(CachedElsewhere {
                stream: s.stream,
                pool_id: s.pool_id,
                free_bytes: free,
            }),
        }
    }
    elsewhere.sort_by_key(|c| std::cmp::Reverse(c.free_bytes));
    let elsewhere_bytes = elsewhere
        .iter()
        .fold(0u64, |a, c| a.saturating_add(c.free_bytes));
    let mut evidence = Evidence {
        block_bytes: block,
        new_memory_bytes: new_memory,
        live_bytes: live,
        reserved_bytes: reserved,
        usable_min_bytes: usable_min,
        usable_max_bytes: usable_max,
        short_by_bytes: short_by,
        free_in_pool_bytes: free_in_pool,
        largest_free_block_bytes: largest,
        cached_elsewhere: elsewhere.clone(),
        other_processes_bytes: other,
        live_floor_growth_bytes: None,
        grew: Vec::new(),
        counterfactuals: Vec::new(),
    };
    let request = format!("the {} request", human(oom.size));

    if let Some((growth, early_event)) = leak_growth(&h, live) {
        evidence.live_floor_growth_bytes = Some(growth);
        let early = Replay::after_event(snap, device, Some(early_event));
        let then = live_by_stack(snap, &early);
        let mut grew: Vec<Grown> = live_by_stack(snap, before)
            .into_iter()
            .filter_map(|(stack, now)| {
                let was = then.get(&stack).copied().unwrap_or(0);
                (now > was).then(|| Grown {
                    stack,
                    grew_bytes: now - was,
                })
            })
            .collect();
        grew.sort_by(|a, b| b.grew_bytes.cmp(&a.grew_bytes).then(a.stack.cmp(&b.stack)));
        grew.truncate(3);
        let fix = match grew.first() {
            Some(g) if g.stack != top::NO_STACK => format!(
                "release what keeps the tensors allocated at {} alive across iterations (they \
                 grew by {})",
                g.stack,
                human(g.grew_bytes)
            ),
            _ => "find what keeps tensors alive across iterations: record allocation history \
                  (`_record_memory_history`) to name the stacks that grew"
                .to_owned(),
        };
        evidence.grew = grew;
        return Verdict {
            cause: Cause::Leak,
            fix: Some(fix),
            why: format!(
                "live memory's floor rose by {} over {} windows of the trace before {request}, \
                 which met the ceiling at {} live",
                human(growth),
                h.windows.len(),
                human(live)
            ),
            evidence,
        };
    }

    if limited && needed > usable_min {
        let f = oom.device_free.unwrap_or(0);
        let named = snap
            .allocator_settings
            .as_ref()
            .and_then(|s| s.alloc_conf.as_deref())
            .and_then(|c| conf_value(c, "per_process_memory_fraction"))
            .map(|v| format!(" (per_process_memory_fraction:{v})"))
            .unwrap_or_default();
        return Verdict {
            cause: Cause::ProcessLimit,
            fix: Some(format!(
                "raise the process's memory limit{named} (set_per_process_memory_fraction, or \
                 the container's or MPS limit) to at least {}: the device had {} free",
                human(needed),
                human(f)
            )),
            why: format!(
                "{request} needed {} more from the driver and the device had {} free, yet the \
                 allocator refused: the process may reserve less than {}, and {} live + {} \
                 requested is {}",
                human(new_memory),
                human(f),
                human(usable_max.saturating_add(1)),
                human(live),
                human(block),
                human(needed)
            ),
            evidence,
        };
    }

    if needed > usable_max {
        if let Some(o) = other.filter(|&o| o > 0 && needed <= usable_max.saturating_add(o)) {
            return Verdict {
                cause: Cause::OtherProcess,
                fix: Some(format!(
                    "free the {} other processes hold on this GPU (stop or move them, see \
                     `vramctl status`), or run where {} are free",
                    human(o),
                    human(needed)
                )),
                why: format!(
                    "{request} and {} live need {}, the process could get {}, and other \
                     processes held {}",
                    human(live),
                    human(needed),
                    human(usable_max),
                    human(o)
                ),
                evidence,
            };
        }
        return Verdict {
            cause: Cause::Shortage,
            fix: None,
            why: format!(
                "{request} and {} live need {}, {} more than the {} the process could get: no \
                 allocator setting makes it fit; the job itself must need less (batch, \
                 precision, activation checkpointing)",
                human(live),
                human(needed),
                human(short_by),
                human(usable_max)
            ),
            evidence,
        };
    }

    // The bytes exist. Whose are they?
    let headroom = usable_max.saturating_sub(reserved);
    let own_reach = free_in_pool.saturating_add(headroom);
    let cached_elsewhere = elsewhere_bytes > 0 && block > own_reach;
    let private = private_ranges(snap, device, start);
    let run = |sc: &Scenario| replay_to(snap, device, start, &private, oom_at, sc);
    let at = |bytes: u64| Capacity {
        bytes,
        fraction_set: limited,
    };
    let mut fix = None;
    if replays {
        let base = run(&Scenario {
            settings,
            capacity: at(usable_max),
            one_stream: false,
        });
        evidence.counterfactuals.push(Counterfactual {
            setting: "as recorded".to_owned(),
            outcome: base.as_str(),
            capacity_bytes: usable_max,
        });
        if matches!(base, Outcome::Fails) {
            let mut candidates: Vec<(String, Settings, bool)> = Vec::new();
            if cached_elsewhere {
                candidates.push(("the same stream".to_owned(), settings, true));
            } else {
                if !settings.expandable_segments {
                    candidates.push((
                        "expandable_segments:True".to_owned(),
                        Settings {
                            expandable_segments: true,
                            max_split_size_bytes: None,
                            ..settings
                        },
                        false,
                    ));
                    for mb in MAX_SPLIT_CANDIDATES_MB {
                        if settings.max_split_size_bytes != Some(mb << 20) {
                            candidates.push((
                                format!("max_split_size_mb:{mb}"),
                                Settings {
                                    max_split_size_bytes: Some(mb << 20),
                                    ..settings
                                },
                                false,
                            ));
                        }
                    }
                }
                if limited && settings.garbage_collection_threshold.is_none() {
                    candidates.push((
                        "garbage_collection_threshold:0.8".to_owned(),
                        Settings {
                            garbage_collection_threshold: Some(0.8),
                            ..settings
                        },
                        false,
                    ));
                }
            }
            // Each replay is a pass over the trace: candidates run a few at a time on
            // this machine's cores, and are read in their order, up to the first that
            // succeeds (so the answer and its evidence do not depend on the core count).
            let width = std::thread::available_parallelism()
                .map_or(1, std::num::NonZero::get)
                .clamp(1, 8);
            'chunks: for chunk in candidates.chunks(width) {
                let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
                    let handles: Vec<_> = chunk
                        .iter()
                        .map(|(_, s, one_stream)| {
                            let sc = Scenario {
                                settings: *s,
                                capacity: at(usable_min),
                                one_stream: *one_stream,
                            };
                            let run = &run;
                            scope.spawn(move || run(&sc))
                        })
                        .collect();
                    handles
                        .into_iter()
                        // A replay that panicked (a bug) counts as a failure, no fix.
                        .map(|h| h.join().unwrap_or(Outcome::Fails))
                        .collect()
                });
                for ((name, _, _), outcome) in chunk.iter().zip(outcomes) {
                    let works = matches!(outcome, Outcome::Succeeds);
                    evidence.counterfactuals.push(Counterfactual {
                        setting: name.clone(),
                        outcome: outcome.as_str(),
                        capacity_bytes: usable_min,
                    });
                    if works {
                        fix = Some(name.clone());
                        break 'chunks;
                    }
                }
            }
        }
    }
    if cached_elsewhere {
        let top_c = &elsewhere[0];
        let graph = top_c.pool_id != (0, 0);
        let fix = if graph {
            Some(format!(
                "free the CUDA graph (or MemPool) whose private pool {:?} caches {} (`del` the \
                 graph, then empty_cache()), or capture into a shared pool; empty_cache() alone \
                 does not return it while the graph lives",
                top_c.pool_id,
                human(top_c.free_bytes)
            ))
        } else {
            fix.map(|_| {
                format!(
                    "allocate on the stream that freed the memory (stream {} caches {} in \
                     segments still partly in use), or free its remaining tensors; \
                     empty_cache() does not help: the allocator already released what it could",
                    top_c.stream,
                    human(top_c.free_bytes)
                )
            })
        };
        return Verdict {
            cause: Cause::CachedElsewhere,
            fix,
            why: format!(
                "{request} and {} live fit in the {} the process could get, but {} of the free \
                 memory is cached {} where this request cannot use it; its own stream and pool \
                 had {} free and {} more could be had",
                human(live),
                human(usable_max),
                human(elsewhere_bytes),
                if graph {
                    "in a private pool (CUDA graph / MemPool)"
                } else {
                    "on another stream"
                },
                human(free_in_pool),
                human(headroom)
            ),
            evidence,
        };
    }
    let fix_text = fix.as_ref().map_or_else(
        || {
            if replays {
                "no setting tried fixed it in the replay".to_owned()
            } else {
                "not replayed (an older OOM)".to_owned()
            }
        },
        |f| format!("PYTORCH_CUDA_ALLOC_CONF={f} succeeds in the replay"),
    );
    Verdict {
        cause: Cause::Fragmentation,
        fix: fix.map(|f| format!("PYTORCH_CUDA_ALLOC_CONF={f}")),
        why: format!(
            "{request} and {} live fit in the {} the process could get, and its stream and \
             pool had {} free, but the largest free block was {} and a new {} did not fit: {}",
            human(live),
            human(usable_max),
            human(free_in_pool),
            human(largest),
            human(new_memory),
            fix_text
        ),
        evidence,
    }
}

/// Address ranges of private-pool segments (at the start and at the end), sorted: trace
/// entries (≤ 2.11) do not name their pool, the segment an address lies in does.
fn private_ranges(snap: &Snapshot, device: i64, start: &Replay<'_>) -> Vec<(u64, u64, (i64, i64))> {
    let mut out: Vec<(u64, u64, (i64, i64))> = snap
        .segments
        .iter()
        .filter(|s| s.device == device && s.pool_id != (0, 0))
        .map(|s| (s.address, s.address.saturating_add(s.total_size), s.pool_id))
        .chain(
            start
                .segments()
                .filter(|s| s.pool_id != (0, 0))
                .map(|s| (s.start, s.end, s.pool_id)),
        )
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// `n` with its noun.
pub fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", plural(n))
}
