//! A pasted out-of-memory message (PyTorch, JAX/XLA, TensorFlow) read for its figures, and
//! the cause those figures alone support, with what they cannot tell (`vramctl
//! explain-oom`, docs/explain-oom.md).
//!
//! The PyTorch message is built in c10/cuda/CUDACachingAllocator.cpp (`malloc`, when no block
//! can be had after the free-and-retry path): "Tried to allocate" is the size the allocator
//! asked the driver for (the request's segment), "of which X is free" is cudaMemGetInfo's
//! free memory at that moment, the "Process N has X memory in use" lines and "Including
//! non-PyTorch memory, this process has X" come from NVML, "X allowed;" appears under
//! `set_per_process_memory_fraction`, and the allocated / "reserved by PyTorch but
//! unallocated" figures are the allocator's own. Its last sentence suggests
//! `expandable_segments` whatever the figures (and whether or not it is on): it is read
//! as a hint, never as evidence. Sizes are printed with two decimals, so every figure here
//! is within 0.5 % of the truth.
//!
//! The text is hostile: it is read to at most [`MAX_MESSAGE_BYTES`], matched by regular
//! expressions (linear time), and nothing of it is printed unescaped.

use std::sync::LazyLock;

use regex::Regex;
use serde::Serialize;

use crate::oom_cause::{Cause, LIMIT_HEADROOM_BYTES};
use crate::size_text::human;

/// The most of a message that is read.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    Pytorch,
    Jax,
    Tensorflow,
}

/// Another process the message names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessLine {
    pub pid: u32,
    pub bytes: u64,
}

/// The figures of a message; None where it does not give one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OomFigures {
    pub device: Option<u32>,
    /// What the failed allocation asked for (PyTorch: the segment it wanted).
    pub tried_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    /// `set_per_process_memory_fraction`'s limit.
    pub allowed_bytes: Option<u64>,
    pub allocated_bytes: Option<u64>,
    pub reserved_unallocated_bytes: Option<u64>,
    /// ≤ 2.0 messages: reserved in total.
    pub reserved_bytes: Option<u64>,
    pub private_pools_bytes: Option<u64>,
    /// "Including non-PyTorch memory, this process has X".
    pub this_process_bytes: Option<u64>,
    pub other_processes: Vec<ProcessLine>,
    /// The message's own suggestion (`expandable_segments:True` or `max_split_size_mb`).
    pub hint: Option<String>,
    /// TensorFlow: the tensor's shape and dtype, and its BFC allocator's stats.
    pub tensor_shape: Option<String>,
    pub dtype: Option<String>,
    pub bfc_limit_bytes: Option<u64>,
    pub bfc_in_use_bytes: Option<u64>,
    /// A timestamp at the start of a log line, as written (`2018-06-08 17:26:00.908082`).
    pub logged_at: Option<String>,
}

/// A recognized message.
#[derive(Debug, Clone, Serialize)]
pub struct OomMessage {
    pub framework: Framework,
    #[serde(flatten)]
    pub figures: OomFigures,
}

/// A process that held the device at the time (from the history).
#[derive(Debug, Clone, Serialize)]
pub struct Holder {
    pub pid: u32,
    pub bytes: u64,
    pub user: Option<String>,
    pub command: Option<String>,
    pub container: Option<String>,
}

/// What the history says about the device at the message's time.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HeldThen {
    pub at_unix_ms: i64,
    pub device_total_bytes: Option<u64>,
    pub holders: Vec<Holder>,
}

/// The cause the message supports, its fix, and what it cannot tell.
#[derive(Debug, Clone, Serialize)]
pub struct MessageVerdict {
    /// None when the figures support no cause.
    pub cause: Option<Cause>,
    pub fix: Option<String>,
    pub why: String,
    pub cannot_tell: Vec<String>,
}

fn re(pattern: &str) -> Regex {
    // The patterns are literals of this file; a bad one is a bug the tests catch.
    Regex::new(pattern).unwrap_or_else(|e| panic!("bad pattern {pattern}: {e}"))
}

const SIZE: &str = r"([0-9]+(?:\.[0-9]+)?) ?(bytes|B|KiB|MiB|GiB|TiB)";

static TRIED: LazyLock<Regex> = LazyLock::new(|| re(&format!(r"Tried to allocate {SIZE}")));
static NEW_GPU: LazyLock<Regex> = LazyLock::new(|| {
    re(&format!(
        r"GPU (\d+) has a total capac(?:i)?ty of {SIZE} of which {SIZE} is free"
    ))
});
static OLD_GPU: LazyLock<Regex> =
    LazyLock::new(|| re(&format!(r"\(GPU (\d+); {SIZE} total capacity")));
static OLD_ALLOCATED: LazyLock<Regex> =
    LazyLock::new(|| re(&format!(r"; {SIZE} already allocated")));
static OLD_FREE: LazyLock<Regex> = LazyLock::new(|| re(&format!(r"; {SIZE} free")));
static OLD_RESERVED: LazyLock<Regex> = LazyLock::new(|| {
    re(&format!(
        r"; {SIZE} (?:reserved in total by PyTorch|cached)"
    ))
});
static PROCESS: LazyLock<Regex> =
    LazyLock::new(|| re(&format!(r"Process (\d+) has {SIZE} memory in use")));
static THIS_PROCESS: LazyLock<Regex> = LazyLock::new(|| {
    re(&format!(
        r"Including non-PyTorch memory, this process has {SIZE} memory in use"
    ))
});
static ALLOWED: LazyLock<Regex> = LazyLock::new(|| re(&format!(r"{SIZE} allowed;")));
static ALLOCATED: LazyLock<Regex> = LazyLock::new(|| {
    re(&format!(
        r"Of the allocated memory {SIZE} is allocated by PyTorch"
    ))
});
static PRIVATE: LazyLock<Regex> =
    LazyLock::new(|| re(&format!(r"with {SIZE} allocated in private pools")));
static UNALLOCATED: LazyLock<Regex> = LazyLock::new(|| {
    re(&format!(
        r"and {SIZE} is reserved by PyTorch but unallocated"
    ))
});
static HINT: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"try setting (?:PYTORCH_(?:CUDA_)?ALLOC_CONF=)?(expandable_segments:True|max_split_size_mb)",
    )
});
static XLA: LazyLock<Regex> = LazyLock::new(|| {
    re(r"(?i)RESOURCE_EXHAUSTED: Out of memory (?:while trying to allocate|allocating) (\d+) bytes")
});
static TF: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"OOM when allocating tensor (?:with|of) shape ?\[([0-9, ]*)\](?: and type (\w+))?(?: on \S*device:GPU:(\d+))?",
    )
});
static BFC_LIMIT: LazyLock<Regex> = LazyLock::new(|| re(r"Limit:\s+(\d+)"));
static BFC_IN_USE: LazyLock<Regex> = LazyLock::new(|| re(r"InUse:\s+(\d+)"));
static LOGGED_AT: LazyLock<Regex> = LazyLock::new(|| {
    re(r"(?m)^\[?(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)")
});

fn size(number: &str, unit: &str) -> Option<u64> {
    let value: f64 = number.parse().ok()?;
    let mult: f64 = match unit {
        "bytes" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1_048_576.0,
        "GiB" => 1_073_741_824.0,
        "TiB" => 1_099_511_627_776.0,
        _ => return None,
    };
    let bytes = (value * mult).round();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    (bytes.is_finite() && (0.0..1.8e19).contains(&bytes)).then_some(bytes as u64)
}

fn size_at(re: &Regex, text: &str, group: usize) -> Option<u64> {
    let c = re.captures(text)?;
    size(c.get(group)?.as_str(), c.get(group + 1)?.as_str())
}

/// Bytes per element of a TensorFlow dtype name.
fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "double" | "int64" | "uint64" | "complex64" => 8,
        "float" | "int32" | "uint32" => 4,
        "half" | "bfloat16" | "int16" | "uint16" => 2,
        "int8" | "uint8" | "bool" => 1,
        "complex128" => 16,
        _ => return None,
    })
}

/// Reads a message; None when it is not an OOM message of a known framework.
pub fn parse(text: &str) -> Option<OomMessage> {
    let text = match text.char_indices().nth(MAX_MESSAGE_BYTES) {
        Some((cut, _)) => &text[..cut],
        None => text,
    };
    let logged_at = LOGGED_AT
        .captures(text)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_owned());
    if let Some(tried) = size_at(&TRIED, text, 1) {
        let mut f = OomFigures {
            tried_bytes: Some(tried),
            logged_at,
            ..OomFigures::default()
        };
        if let Some(c) = NEW_GPU.captures(text) {
            f.device = c[1].parse().ok();
            f.total_bytes = size(&c[2], &c[3]);
            f.free_bytes = size(&c[4], &c[5]);
        } else if let Some(c) = OLD_GPU.captures(text) {
            f.device = c[1].parse().ok();
            f.total_bytes = size(&c[2], &c[3]);
            f.allocated_bytes = size_at(&OLD_ALLOCATED, text, 1);
            f.free_bytes = size_at(&OLD_FREE, text, 1);
            f.reserved_bytes = size_at(&OLD_RESERVED, text, 1);
        }
        f.other_processes = PROCESS
            .captures_iter(text)
            .filter_map(|c| {
                Some(ProcessLine {
                    pid: c[1].parse().ok()?,
                    bytes: size(&c[2], &c[3])?,
                })
            })
            .take(256)
            .collect();
        f.this_process_bytes = size_at(&THIS_PROCESS, text, 1);
        f.allowed_bytes = size_at(&ALLOWED, text, 1);
        if f.allocated_bytes.is_none() {
            f.allocated_bytes = size_at(&ALLOCATED, text, 1);
        }
        f.private_pools_bytes = size_at(&PRIVATE, text, 1);
        f.reserved_unallocated_bytes = size_at(&UNALLOCATED, text, 1);
        if f.reserved_bytes.is_none() {
            f.reserved_bytes = f
                .allocated_bytes
                .zip(f.reserved_unallocated_bytes)
                .map(|(a, u)| a.saturating_add(u));
        } else if f.reserved_unallocated_bytes.is_none() {
            f.reserved_unallocated_bytes = f
                .reserved_bytes
                .zip(f.allocated_bytes)
                .map(|(r, a)| r.saturating_sub(a));
        }
        f.hint = HINT.captures(text).map(|c| c[1].to_owned());
        return Some(OomMessage {
            framework: Framework::Pytorch,
            figures: f,
        });
    }
    if let Some(c) = XLA.captures(text) {
        return Some(OomMessage {
            framework: Framework::Jax,
            figures: OomFigures {
                tried_bytes: c[1].parse().ok(),
                logged_at,
                ..OomFigures::default()
            },
        });
    }
    if let Some(c) = TF.captures(text) {
        let shape = c[1].to_owned();
        let dtype = c.get(2).map(|m| m.as_str().to_owned());
        let elements = shape
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .try_fold(1u64, |a, d| a.checked_mul(d.parse().ok()?));
        let tried = elements
            .zip(dtype.as_deref().and_then(dtype_bytes))
            .and_then(|(n, b)| n.checked_mul(b));
        return Some(OomMessage {
            framework: Framework::Tensorflow,
            figures: OomFigures {
                device: c.get(3).and_then(|m| m.as_str().parse().ok()),
                tried_bytes: tried,
                tensor_shape: Some(format!("[{shape}]")),
                dtype,
                bfc_limit_bytes: BFC_LIMIT.captures(text).and_then(|c| c[1].parse().ok()),
                bfc_in_use_bytes: BFC_IN_USE.captures(text).and_then(|c| c[1].parse().ok()),
                logged_at,
                ..OomFigures::default()
            },
        });
    }
    None
}

const NO_LEAK: &str = "whether live memory grew before the OOM (a leak): a message is one moment; \
                       a snapshot with history or the recorder's curve shows it";

/// The cause the message's figures (and what held the device then) support.
#[allow(clippy::too_many_lines)]
pub fn explain(m: &OomMessage, then: Option<&HeldThen>) -> MessageVerdict {
    let f = &m.figures;
    let mut cannot_tell = vec![NO_LEAK.to_owned()];
    let others_from_message: u64 = f
        .other_processes
        .iter()
        .fold(0u64, |a, p| a.saturating_add(p.bytes));
    // The holder that is the OOM's own process: the one whose memory is within 10 % of
    // what the message says this process had (NVML's figure, else PyTorch's reserved plus
    // a CUDA context of 512 MiB); the history does not know which PID raised the message.
    let own_pid = then.and_then(|t| {
        let expected = f
            .this_process_bytes
            .or_else(|| f.reserved_bytes.map(|r| r.saturating_add(512 << 20)))?;
        t.holders
            .iter()
            .min_by_key(|h| h.bytes.abs_diff(expected))
            .filter(|h| h.bytes.abs_diff(expected) <= expected / 10)
            .map(|h| h.pid)
    });
    let others_then: Vec<&Holder> = then
        .map(|t| {
            t.holders
                .iter()
                .filter(|h| Some(h.pid) != own_pid)
                .collect()
        })
        .unwrap_or_default();
    // Each process the message names, with who it was when the history saw it.
    let named: Vec<String> = f
        .other_processes
        .iter()
        .map(|p| {
            let seen = then.and_then(|t| t.holders.iter().find(|h| h.pid == p.pid));
            match seen {
                Some(h) => format!(
                    "PID {} ({}, {} {})",
                    p.pid,
                    human(p.bytes),
                    h.user.as_deref().unwrap_or("?"),
                    h.command.as_deref().unwrap_or("?")
                ),
                None => format!("PID {} ({})", p.pid, human(p.bytes)),
            }
        })
        .collect();
    match m.framework {
        Framework::Pytorch => {
            let Some(tried) = f.tried_bytes else {
                return unknown("the message gives no request size", cannot_tell);
            };
            let free = f.free_bytes.unwrap_or(0);
            let unallocated = f.reserved_unallocated_bytes.unwrap_or(0);
            let total = f
                .total_bytes
                .or_else(|| then.and_then(|t| t.device_total_bytes));
            if let Some(t) = total.filter(|&t| tried > t) {
                return MessageVerdict {
                    cause: Some(Cause::Shortage),
                    fix: None,
                    why: format!(
                        "the request for {} is more than the GPU's {}: nothing but a smaller \
                         request fits",
                        human(tried),
                        human(t)
                    ),
                    cannot_tell,
                };
            }
            if let Some(allowed) = f.allowed_bytes {
                let reserved = f.reserved_bytes.unwrap_or(0);
                if reserved.saturating_add(tried) > allowed {
                    let need = f.allocated_bytes.unwrap_or(reserved).saturating_add(tried);
                    return MessageVerdict {
                        cause: Some(Cause::ProcessLimit),
                        fix: Some(format!(
                            "raise set_per_process_memory_fraction so that at least {} are \
                             allowed{}",
                            human(need),
                            total
                                .map(|t| format!(
                                    " (a fraction of {:.2} of {})",
                                    ratio(need, t),
                                    human(t)
                                ))
                                .unwrap_or_default()
                        )),
                        why: format!(
                            "{} reserved + the {} asked for pass the {} allowed; the GPU had {} \
                             free",
                            human(reserved),
                            human(tried),
                            human(allowed),
                            human(free)
                        ),
                        cannot_tell,
                    };
                }
            }
            if f.free_bytes.is_some() && free >= tried.saturating_add(LIMIT_HEADROOM_BYTES) {
                cannot_tell.push(
                    "which limit: PyTorch names only set_per_process_memory_fraction's".to_owned(),
                );
                return MessageVerdict {
                    cause: Some(Cause::ProcessLimit),
                    fix: Some(
                        "raise the limit the process runs under (a container's or MPS's \
                         memory limit, a MIG slice): the GPU itself had the memory"
                            .to_owned(),
                    ),
                    why: format!(
                        "the GPU had {} free, more than the {} asked for, yet the driver refused \
                         it: a limit of the process's own",
                        human(free),
                        human(tried)
                    ),
                    cannot_tell,
                };
            }
            if unallocated >= tried {
                cannot_tell.push(
                    "whether a setting would fix it: only a replay of the allocator's trace says \
                     (take a snapshot: `vramctl snapshot --pid PID -o FILE` with history \
                     recorded, then `vramctl snapshot FILE`)"
                        .to_owned(),
                );
                cannot_tell.push(
                    "whether the unallocated memory is on another stream or in a CUDA graph's \
                     pool (cached-elsewhere) rather than in fragments"
                        .to_owned(),
                );
                if f.hint.is_some() {
                    cannot_tell.push(
                        "whether expandable_segments is already on: the message suggests it \
                         either way"
                            .to_owned(),
                    );
                }
                return MessageVerdict {
                    cause: Some(Cause::Fragmentation),
                    fix: None,
                    why: format!(
                        "PyTorch held {} reserved but unallocated, at least the {} asked for, in \
                         pieces none of which held it (the allocator had already returned every \
                         whole free segment)",
                        human(unallocated),
                        human(tried)
                    ),
                    cannot_tell,
                };
            }
            let missing = tried.saturating_sub(free.saturating_add(unallocated));
            let history_others: u64 = others_then
                .iter()
                .fold(0u64, |a, h| a.saturating_add(h.bytes));
            let others = if others_from_message > 0 {
                others_from_message
            } else {
                // Without process lines: what was neither this process's nor free.
                total
                    .zip(f.this_process_bytes)
                    .map_or(0, |(t, p)| t.saturating_sub(p).saturating_sub(free))
                    .max(history_others)
            };
            if missing == 0 {
                return MessageVerdict {
                    cause: Some(Cause::Shortage),
                    fix: None,
                    why: format!(
                        "the GPU was full: its last {} free (within {} of the {} asked for) \
                         could not be had, the driver keeps some for itself",
                        human(free),
                        human(LIMIT_HEADROOM_BYTES),
                        human(tried)
                    ),
                    cannot_tell,
                };
            }
            if others > 0 && others >= missing {
                let who = if named.is_empty() {
                    Some(
                        others_then
                            .iter()
                            .map(|h| {
                                format!(
                                    "PID {} ({}, {} {})",
                                    h.pid,
                                    human(h.bytes),
                                    h.user.as_deref().unwrap_or("?"),
                                    h.command.as_deref().unwrap_or("?")
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(", "),
                    )
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "other processes".to_owned())
                } else {
                    named.join(", ")
                };
                return MessageVerdict {
                    cause: Some(Cause::OtherProcess),
                    fix: Some(format!("free the GPU of {who}, or run where it is free")),
                    why: format!(
                        "{} more was needed than the GPU had free ({}) and PyTorch held unused \
                         ({}); other processes held {}",
                        human(missing),
                        human(free),
                        human(unallocated),
                        human(others)
                    ),
                    cannot_tell,
                };
            }
            MessageVerdict {
                cause: Some(Cause::Shortage),
                fix: None,
                why: format!(
                    "the {} asked for is {} more than the GPU had free ({}) plus what PyTorch \
                     held unused ({}): the job needs less memory (batch, precision, activation \
                     checkpointing)",
                    human(tried),
                    human(missing),
                    human(free),
                    human(unallocated)
                ),
                cannot_tell,
            }
        }
        Framework::Jax => {
            cannot_tell.push(
                "how much XLA itself held: JAX preallocates 75 % of the GPU \
                 (XLA_PYTHON_CLIENT_MEM_FRACTION) and its message gives only the request"
                    .to_owned(),
            );
            let tried = f.tried_bytes.unwrap_or(0);
            if let Some(t) = then
                .and_then(|t| t.device_total_bytes)
                .filter(|&t| tried > t)
            {
                return MessageVerdict {
                    cause: Some(Cause::Shortage),
                    fix: None,
                    why: format!(
                        "the request for {} is more than the GPU's {}",
                        human(tried),
                        human(t)
                    ),
                    cannot_tell,
                };
            }
            unknown(
                &format!("XLA could not allocate {}", human(tried)),
                cannot_tell,
            )
        }
        Framework::Tensorflow => {
            let (Some(limit), Some(in_use), Some(tried)) =
                (f.bfc_limit_bytes, f.bfc_in_use_bytes, f.tried_bytes)
            else {
                cannot_tell.push(
                    "how full TensorFlow's allocator was: paste its `Stats:` lines (Limit, \
                     InUse) with the message"
                        .to_owned(),
                );
                return unknown(
                    &format!(
                        "TensorFlow could not allocate a tensor of shape {}{}",
                        f.tensor_shape.as_deref().unwrap_or("?"),
                        f.tried_bytes
                            .map(|b| format!(" ({})", human(b)))
                            .unwrap_or_default()
                    ),
                    cannot_tell,
                );
            };
            if in_use.saturating_add(tried) > limit {
                MessageVerdict {
                    cause: Some(Cause::Shortage),
                    fix: None,
                    why: format!(
                        "{} in use + the {} tensor pass the allocator's {} limit",
                        human(in_use),
                        human(tried),
                        human(limit)
                    ),
                    cannot_tell,
                }
            } else {
                MessageVerdict {
                    cause: Some(Cause::Fragmentation),
                    fix: None,
                    why: format!(
                        "{} in use + the {} tensor fit in the {} limit, but no free chunk held it",
                        human(in_use),
                        human(tried),
                        human(limit)
                    ),
                    cannot_tell,
                }
            }
        }
    }
}

#[allow(clippy::cast_precision_loss)]
fn ratio(a: u64, b: u64) -> f64 {
    (a as f64 / b.max(1) as f64).min(1.0)
}

fn unknown(why: &str, cannot_tell: Vec<String>) -> MessageVerdict {
    MessageVerdict {
        cause: None,
        fix: None,
        why: format!("{why}; the message alone supports no cause"),
        cannot_tell,
    }
}
