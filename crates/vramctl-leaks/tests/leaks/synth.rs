//! Synthetic labeled traces that mimic `scripts/workloads/*.py` as NVML would see them.
//!
//! The memory a process shows in NVML is its CUDA context plus what its caching allocator
//! reserved, so the workloads drive a small model of PyTorch's CUDA caching allocator
//! (`CachingAllocator`: 512 B rounding, a small pool of 2 MiB segments for requests
//! ≤ 1 MiB, 20 MiB segments for 1–10 MiB, 2 MiB-rounded segments above; best-fit reuse,
//! splitting, coalescing of neighbours, `empty_cache` freeing whole free segments). The
//! sampler reads it every 100 ms with a few ms of jitter. Shared by the tests, the
//! `evaluate_leaks` example and the `leaks` bench (included with `#[path]`).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};

use vramctl_leaks::analysis::{CpuSample, DeviceActivitySample, Sample};

use super::labeled::{Label, LabeledSeries, LabeledTrace};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;
/// An H200 as NVML reports it.
pub const H200_TOTAL: u64 = 150_754_820_096;
/// Start of every synthetic process (2023-11-14 22:13:20 UTC).
pub const T0: i64 = 1_700_000_000_000;

/// SplitMix64: small, deterministic, good enough for jitter and shapes.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi].
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        let span = u64::try_from(hi - lo + 1).unwrap_or(1);
        lo + i64::try_from(self.next_u64() % span).unwrap_or(0)
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u1.max(1e-300).ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

#[derive(Debug, Clone, Copy)]
struct Block {
    size: u64,
    free: bool,
}

#[derive(Debug, Clone)]
struct Segment {
    pool: usize,
    size: u64,
    blocks: BTreeMap<u64, Block>,
}

/// A model of PyTorch's native CUDA caching allocator (one stream, no private pools).
#[derive(Debug, Default)]
pub struct CachingAllocator {
    segments: HashMap<u64, Segment>,
    free: [BTreeSet<(u64, u64, u64)>; 2],
    live: HashMap<u64, (u64, u64)>,
    next_id: u64,
    pub reserved: u64,
    pub allocated: u64,
}

const SMALL: usize = 0;
const LARGE: usize = 1;

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

impl CachingAllocator {
    pub fn alloc(&mut self, bytes: u64) -> u64 {
        let size = round_up(bytes.max(1), 512);
        let pool = if size <= MIB { SMALL } else { LARGE };
        let found = self.free[pool].range((size, 0, 0)..).next().copied();
        let (seg, offset, block_size) = if let Some(key) = found {
            self.free[pool].remove(&key);
            (key.1, key.2, key.0)
        } else {
            let seg_size = if pool == SMALL {
                2 * MIB
            } else if size < 10 * MIB {
                20 * MIB
            } else {
                round_up(size, 2 * MIB)
            };
            self.next_id += 1;
            let id = self.next_id;
            let mut blocks = BTreeMap::new();
            blocks.insert(
                0,
                Block {
                    size: seg_size,
                    free: true,
                },
            );
            self.segments.insert(
                id,
                Segment {
                    pool,
                    size: seg_size,
                    blocks,
                },
            );
            self.reserved += seg_size;
            (id, 0, seg_size)
        };
        let remainder = block_size - size;
        let split = if pool == SMALL {
            remainder >= 512
        } else {
            remainder > MIB
        };
        let segment = self.segments.get_mut(&seg).expect("segment");
        let used = if split { size } else { block_size };
        segment.blocks.insert(
            offset,
            Block {
                size: used,
                free: false,
            },
        );
        if split {
            segment.blocks.insert(
                offset + size,
                Block {
                    size: remainder,
                    free: true,
                },
            );
            self.free[pool].insert((remainder, seg, offset + size));
        }
        self.next_id += 1;
        let id = self.next_id;
        self.live.insert(id, (seg, offset));
        self.allocated += used;
        id
    }

    pub fn free(&mut self, id: u64) {
        let Some((seg, offset)) = self.live.remove(&id) else {
            return;
        };
        let segment = self.segments.get_mut(&seg).expect("segment");
        let pool = segment.pool;
        let block = segment.blocks.remove(&offset).expect("block");
        self.allocated -= block.size;
        let (mut start, mut size) = (offset, block.size);
        let next_off = offset + block.size;
        if let Some(next) = segment.blocks.get(&next_off).copied() {
            if next.free {
                segment.blocks.remove(&next_off);
                self.free[pool].remove(&(next.size, seg, next_off));
                size += next.size;
            }
        }
        if let Some((&prev_off, &prev)) = segment.blocks.range(..offset).next_back() {
            if prev.free && prev_off + prev.size == offset {
                segment.blocks.remove(&prev_off);
                self.free[pool].remove(&(prev.size, seg, prev_off));
                start = prev_off;
                size += prev.size;
            }
        }
        segment.blocks.insert(start, Block { size, free: true });
        self.free[pool].insert((size, seg, start));
    }

    /// Frees every segment that holds no live block.
    pub fn empty_cache(&mut self) {
        let empty: Vec<u64> = self
            .segments
            .iter()
            .filter(|(_, s)| s.blocks.len() == 1 && s.blocks.values().all(|b| b.free))
            .map(|(&id, _)| id)
            .collect();
        for id in empty {
            let s = self.segments.remove(&id).expect("segment");
            self.free[s.pool].remove(&(s.size, id, 0));
            self.reserved -= s.size;
        }
    }
}

/// A process as the sampler sees it: context + reserved, sampled every `interval_ms`.
pub struct Sim {
    pub t_ms: i64,
    next_sample: i64,
    interval_ms: i64,
    jitter_ms: i64,
    rng: Rng,
    context: u64,
    pub alloc: CachingAllocator,
    pub samples: Vec<Sample>,
    pub cpu: Vec<CpuSample>,
    pub device: Vec<DeviceActivitySample>,
    cpu_ms: u64,
    /// CPU use while running (fraction of a core) and whether the GPU is busy.
    pub cpu_load: f64,
    pub gpu_busy: bool,
}

impl Sim {
    pub fn new(seed: u64, interval_ms: i64) -> Self {
        Self {
            t_ms: 0,
            next_sample: 0,
            interval_ms,
            jitter_ms: 3,
            rng: Rng::new(seed),
            context: 14 * MIB,
            alloc: CachingAllocator::default(),
            samples: Vec::new(),
            cpu: Vec::new(),
            device: Vec::new(),
            cpu_ms: 0,
            cpu_load: 1.0,
            gpu_busy: true,
        }
    }

    /// The CUDA context comes up (NVML showed 14 MiB, then ~580 MiB on the H200).
    pub fn init_cuda(&mut self) {
        self.wait(100);
        self.context = 580 * MIB;
    }

    pub fn nvml_bytes(&self) -> u64 {
        self.context + self.alloc.reserved
    }

    /// Lets time pass, taking the samples that fall into it.
    pub fn wait(&mut self, dt_ms: i64) {
        let end = self.t_ms + dt_ms;
        while self.next_sample <= end {
            let t = self.next_sample;
            self.samples.push(Sample::new(T0 + t, self.nvml_bytes()));
            self.cpu.push(CpuSample {
                t_unix_ms: T0 + t,
                cpu_time_ms: self.cpu_ms + (self.cpu_load * (t - self.t_ms) as f64) as u64,
            });
            self.device.push(DeviceActivitySample {
                t_unix_ms: T0 + t,
                utilization_gpu_percent: if self.gpu_busy { 70 } else { 0 },
                processes_on_device: 1,
            });
            let jitter = self.rng.range(-self.jitter_ms, self.jitter_ms);
            self.next_sample += self.interval_ms + jitter;
        }
        self.cpu_ms += (self.cpu_load * dt_ms as f64) as u64;
        self.t_ms = end;
    }

    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }
}

/// Parameters, gradients and AdamW state of an MLP of `depth` square layers.
struct Mlp {
    width: u64,
    depth: u64,
    params: Vec<u64>,
    grads: Vec<u64>,
    adam: Vec<u64>,
}

impl Mlp {
    fn new(sim: &mut Sim, width: u64, depth: u64) -> Self {
        let mut params = Vec::new();
        for _ in 0..depth {
            params.push(sim.alloc.alloc(width * width * 4));
            params.push(sim.alloc.alloc(width * 4));
        }
        Self {
            width,
            depth,
            params,
            grads: Vec::new(),
            adam: Vec::new(),
        }
    }

    /// Forward activations for `rows` rows: one linear and one GELU output per layer.
    fn forward(&self, sim: &mut Sim, rows: u64) -> Vec<u64> {
        let mut acts = Vec::new();
        acts.push(sim.alloc.alloc(rows * self.width * 4));
        for _ in 0..self.depth {
            acts.push(sim.alloc.alloc(rows * self.width * 4));
            acts.push(sim.alloc.alloc(rows * self.width * 4));
        }
        acts.push(sim.alloc.alloc(4));
        acts
    }

    /// A training step: forward, backward (frees the graph), AdamW (lazy state at step 1).
    fn train_step(&mut self, sim: &mut Sim, rows: u64) {
        for g in self.grads.drain(..) {
            sim.alloc.free(g);
        }
        let acts = self.forward(sim, rows);
        let mut temps = Vec::new();
        for _ in 0..2 {
            temps.push(sim.alloc.alloc(rows * self.width * 4));
        }
        for _ in 0..self.depth {
            self.grads
                .push(sim.alloc.alloc(self.width * self.width * 4));
            self.grads.push(sim.alloc.alloc(self.width * 4));
        }
        for a in acts {
            sim.alloc.free(a);
        }
        for t in temps {
            sim.alloc.free(t);
        }
        if self.adam.is_empty() {
            for _ in 0..self.depth {
                for _ in 0..2 {
                    self.adam.push(sim.alloc.alloc(self.width * self.width * 4));
                    self.adam.push(sim.alloc.alloc(self.width * 4));
                }
            }
        }
        let scratch = sim.alloc.alloc(self.width * self.width * 4);
        sim.alloc.free(scratch);
    }
}

fn series(name: &str, role: &str, label: Label, sim: Sim, activity: bool) -> LabeledSeries {
    LabeledSeries {
        pid: 1000,
        role: role.to_owned(),
        name: name.to_owned(),
        label,
        process_start_unix_ms: Some(T0),
        samples: sim.samples,
        sm: Vec::new(),
        device: if activity { sim.device } else { Vec::new() },
        cpu: if activity { sim.cpu } else { Vec::new() },
    }
}

fn trace(name: &str, s: LabeledSeries) -> LabeledTrace {
    LabeledTrace {
        name: name.to_owned(),
        capacity_bytes: Some(H200_TOTAL),
        // Free memory of an otherwise empty H200 (v2 reserved is 615 MiB).
        device_free_bytes: None,
        series: vec![s],
    }
}

/// `leak_graph.py`: training plus a validation pass whose graph is kept after `warmup_s`
/// (~4 MiB of 512 KiB activations per step, 4 steps per second ≈ 16 MB/s).
pub fn leak_graph(duration_s: i64, seed: u64, interval_ms: i64) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let mut model = Mlp::new(&mut sim, 2048, 4);
    let mut kept = Vec::new();
    let warmup_ms = 45_000;
    let mut leak_start = None;
    while sim.t_ms < duration_s * 1000 {
        model.train_step(&mut sim, 256);
        let val = model.forward(&mut sim, 64);
        if sim.t_ms >= warmup_ms {
            leak_start.get_or_insert(T0 + sim.t_ms);
            kept.extend(val);
        } else {
            for v in val {
                sim.alloc.free(v);
            }
        }
        sim.wait(250);
    }
    let label = Label::Leak {
        leak_start_unix_ms: leak_start.unwrap_or(T0 + warmup_ms),
    };
    trace(
        "leak_graph",
        series("leak_graph", "leak-graph", label, sim, false),
    )
}

/// `leak_staircase.py`: 1 GiB at start, then 256 MiB every 8 s from 30 s on.
pub fn leak_staircase(duration_s: i64, seed: u64, interval_ms: i64) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let _base = sim.alloc.alloc(GIB);
    let mut next = 30_000;
    let mut kept = Vec::new();
    while sim.t_ms < duration_s * 1000 {
        if sim.t_ms >= next {
            kept.push(sim.alloc.alloc(256 * MIB));
            next += 8000;
        }
        sim.wait(50);
    }
    let label = Label::Leak {
        leak_start_unix_ms: T0 + 30_000,
    };
    trace(
        "leak_staircase",
        series("leak_staircase", "leak-staircase", label, sim, false),
    )
}

/// `leak_fast.py`: inference that keeps every 32 MiB output after 60 s (≈134 MB/s).
pub fn leak_fast(duration_s: i64, seed: u64, interval_ms: i64) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let _weights: Vec<u64> = (0..2)
        .flat_map(|_| [sim.alloc.alloc(4096 * 4096 * 4), sim.alloc.alloc(4096 * 4)])
        .collect();
    let mut outputs = Vec::new();
    let mut leak_start = None;
    while sim.t_ms < duration_s * 1000 {
        let x = sim.alloc.alloc(32 * MIB);
        let h1 = sim.alloc.alloc(32 * MIB);
        let h2 = sim.alloc.alloc(32 * MIB);
        sim.alloc.free(x);
        let h3 = sim.alloc.alloc(32 * MIB);
        sim.alloc.free(h1);
        let y = sim.alloc.alloc(32 * MIB);
        sim.alloc.free(h2);
        sim.alloc.free(h3);
        if sim.t_ms >= 60_000 {
            leak_start.get_or_insert(T0 + sim.t_ms);
            outputs.push(y);
        } else {
            sim.alloc.free(y);
        }
        sim.wait(250);
    }
    let label = Label::Leak {
        leak_start_unix_ms: leak_start.unwrap_or(T0 + 60_000),
    };
    trace(
        "leak_fast",
        series("leak_fast", "leak-fast", label, sim, false),
    )
}

/// `dyn_shapes.py`: training on random batch sizes whose maximum grows over 90 s.
pub fn dyn_shapes(duration_s: i64, seed: u64, interval_ms: i64) -> LabeledTrace {
    dyn_shapes_ramp(duration_s, seed, interval_ms, 90.0)
}

/// `dyn_shapes` with the largest batch growing for `ramp_s` instead of 90 s (the sweep of
/// issue 13: warm-ups that go on for minutes). Same random draws as `dyn_shapes` for the
/// same seed, so `ramp_s = 90` is `dyn_shapes`.
pub fn dyn_shapes_ramp(duration_s: i64, seed: u64, interval_ms: i64, ramp_s: f64) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let mut model = Mlp::new(&mut sim, 2048, 6);
    while sim.t_ms < duration_s * 1000 {
        let elapsed = sim.t_ms as f64 / 1000.0;
        let max_len = (256.0 + elapsed.min(ramp_s) / ramp_s * 3840.0) as i64;
        let n = sim.rng().range(128, max_len);
        let input = sim.alloc.alloc(u64::try_from(n).unwrap_or(128) * 2048 * 4);
        model.train_step(&mut sim, u64::try_from(n).unwrap_or(128));
        sim.alloc.free(input);
        sim.wait(100 + n / 100);
    }
    trace(
        "dyn_shapes",
        series("dyn_shapes", "dyn-shapes", Label::NotLeak, sim, false),
    )
}

/// `sawtooth_infer.py`: 2 GiB of weights; per request 8 × 512 MiB built over 2 s, held
/// 2 s, freed with `empty_cache`, then 3 s idle.
pub fn sawtooth_infer(duration_s: i64, seed: u64, interval_ms: i64) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let _weights = sim.alloc.alloc(2 * GIB);
    while sim.t_ms < duration_s * 1000 {
        let mut kv = Vec::new();
        for _ in 0..8 {
            kv.push(sim.alloc.alloc(512 * MIB));
            sim.wait(250);
        }
        sim.wait(2000);
        for b in kv {
            sim.alloc.free(b);
        }
        sim.alloc.empty_cache();
        sim.wait(3000);
    }
    trace(
        "sawtooth_infer",
        series("sawtooth_infer", "sawtooth", Label::NotLeak, sim, false),
    )
}

/// `steady_train.py`: an MLP 4096×8 trained on a fixed batch.
pub fn steady_train(duration_s: i64, seed: u64, interval_ms: i64) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let mut model = Mlp::new(&mut sim, 4096, 8);
    while sim.t_ms < duration_s * 1000 {
        let input = sim.alloc.alloc(1024 * 4096 * 4);
        model.train_step(&mut sim, 1024);
        sim.alloc.free(input);
        sim.wait(120);
    }
    trace(
        "steady_train",
        series("steady_train", "steady", Label::NotLeak, sim, false),
    )
}

/// `idle_holder.py`: 12 GiB, a few seconds of matmuls, then sleep; with CPU time and
/// device utilization (alone on the device) as evidence.
pub fn idle_holder(duration_s: i64, seed: u64, interval_ms: i64) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let _held = sim.alloc.alloc(12 * GIB);
    let _a = sim.alloc.alloc(8192 * 8192 * 4);
    sim.wait(3000);
    let idle_start = T0 + sim.t_ms;
    sim.cpu_load = 0.001;
    sim.gpu_busy = false;
    while sim.t_ms < duration_s * 1000 {
        sim.wait(1000);
    }
    let label = Label::Idle {
        idle_start_unix_ms: idle_start,
    };
    trace(
        "idle_holder",
        series("idle_holder", "idle-holder", label, sim, true),
    )
}

/// Harder cases beyond the seven scripts. Not a leak: training whose first eval pass (at
/// 60 s) caches 1 GiB more, then repeats every 60 s reusing it.
pub fn train_with_eval(duration_s: i64, seed: u64, interval_ms: i64) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let mut model = Mlp::new(&mut sim, 4096, 4);
    let mut next_eval = 60_000;
    while sim.t_ms < duration_s * 1000 {
        if sim.t_ms >= next_eval {
            let mut cache = Vec::new();
            for _ in 0..8 {
                cache.push(sim.alloc.alloc(128 * MIB));
                sim.wait(375);
            }
            for b in cache {
                sim.alloc.free(b);
            }
            next_eval += 60_000;
        }
        let input = sim.alloc.alloc(512 * 4096 * 4);
        model.train_step(&mut sim, 512);
        sim.alloc.free(input);
        sim.wait(150);
    }
    trace(
        "train_with_eval",
        series("train_with_eval", "train-eval", Label::NotLeak, sim, false),
    )
}

/// Not a leak: an inference server with requests of random size (1–6 GiB, built over
/// 1–3 s, held 1–2 s, released with `empty_cache`, 1–4 s apart).
pub fn infer_variable(duration_s: i64, seed: u64, interval_ms: i64) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let _weights = sim.alloc.alloc(4 * GIB);
    while sim.t_ms < duration_s * 1000 {
        let chunks = sim.rng().range(2, 12);
        let build_ms = sim.rng().range(1000, 3000);
        let mut kv = Vec::new();
        for _ in 0..chunks {
            kv.push(sim.alloc.alloc(512 * MIB));
            sim.wait(build_ms / chunks);
        }
        let hold = sim.rng().range(1000, 2000);
        sim.wait(hold);
        for b in kv {
            sim.alloc.free(b);
        }
        sim.alloc.empty_cache();
        let pause = sim.rng().range(1000, 4000);
        sim.wait(pause);
    }
    trace(
        "infer_variable",
        series(
            "infer_variable",
            "infer-variable",
            Label::NotLeak,
            sim,
            false,
        ),
    )
}

/// Not a leak: 30 s of data preparation holding only the context, then 20 GiB of weights
/// loaded in 5 s, then steady inference.
pub fn late_model_load(duration_s: i64, seed: u64, interval_ms: i64) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    sim.wait(30_000);
    let mut weights = Vec::new();
    for _ in 0..20 {
        weights.push(sim.alloc.alloc(GIB));
        sim.wait(250);
    }
    while sim.t_ms < duration_s * 1000 {
        let x = sim.alloc.alloc(64 * MIB);
        let y = sim.alloc.alloc(64 * MIB);
        sim.alloc.free(x);
        sim.alloc.free(y);
        sim.wait(200);
    }
    trace(
        "late_model_load",
        series("late_model_load", "late-load", Label::NotLeak, sim, false),
    )
}

/// A slow leak: ~2 MB/s of 512 KiB tensors (small pool, 2 MiB segments) after 60 s.
pub fn leak_slow(duration_s: i64, seed: u64, interval_ms: i64) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let mut model = Mlp::new(&mut sim, 1024, 4);
    let mut kept = Vec::new();
    let mut leak_start = None;
    while sim.t_ms < duration_s * 1000 {
        model.train_step(&mut sim, 128);
        if sim.t_ms >= 60_000 {
            leak_start.get_or_insert(T0 + sim.t_ms);
            kept.push(sim.alloc.alloc(512 * KIB));
        }
        sim.wait(250);
    }
    let label = Label::Leak {
        leak_start_unix_ms: leak_start.unwrap_or(T0 + 60_000),
    };
    trace(
        "leak_slow",
        series("leak_slow", "leak-slow", label, sim, false),
    )
}

/// A leak for the sweeps of issue 13: a small model trained every 250 ms (1024 × 4 MLP,
/// AdamW: its state appears at the first step) that also keeps `tensor_bytes` tensors so
/// that the kept bytes grow at `rate_bytes_per_sec` from `start_after_ms` (from the first
/// step when `None`). NVML sees the allocator's segments: 2 MiB for tensors ≤ 1 MiB, 20 MiB
/// for 1–10 MiB, the tensor rounded to 2 MiB above. The process ends (as with an
/// out-of-memory error) when it would hold all but 2 GiB of an H200.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeakSpec {
    pub rate_bytes_per_sec: f64,
    pub tensor_bytes: u64,
    pub start_after_ms: Option<i64>,
}

pub fn paced_leak(duration_s: i64, seed: u64, interval_ms: i64, spec: &LeakSpec) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let mut model = Mlp::new(&mut sim, 1024, 4);
    let mut kept: Vec<u64> = Vec::new();
    let mut leak_start: Option<i64> = None;
    while sim.t_ms < duration_s * 1000 && sim.nvml_bytes() < H200_TOTAL - 2 * GIB {
        model.train_step(&mut sim, 256);
        if spec.start_after_ms.is_none_or(|s| sim.t_ms >= s) {
            let start = *leak_start.get_or_insert(sim.t_ms);
            // Keep whole tensors as the kept bytes' target passes them.
            let target = spec.rate_bytes_per_sec * (sim.t_ms - start) as f64 / 1000.0;
            let due = (target / spec.tensor_bytes as f64) as usize + 1;
            while kept.len() < due {
                kept.push(sim.alloc.alloc(spec.tensor_bytes));
            }
        }
        sim.wait(250);
    }
    let label = Label::Leak {
        leak_start_unix_ms: T0 + leak_start.unwrap_or(spec.start_after_ms.unwrap_or(0)),
    };
    trace(
        "paced_leak",
        series("paced_leak", "paced-leak", label, sim, false),
    )
}

/// Trains `model` every 250 ms for `duration_s` and keeps a block from `first_ms` on each
/// time the next one is due: `step` gives its size and when the one after it is due (called
/// as the block is kept, so its draws come in that order). Ends early (out of memory) once
/// a block of `largest_step_bytes` would leave less than 2 GiB of an H200. When the first
/// block was kept.
fn train_keeping_steps(
    sim: &mut Sim,
    model: &mut Mlp,
    duration_s: i64,
    largest_step_bytes: u64,
    first_ms: i64,
    mut step: impl FnMut(&mut Sim) -> (u64, i64),
) -> Option<i64> {
    let mut next_ms = first_ms;
    let mut kept: Vec<u64> = Vec::new();
    let mut leak_start: Option<i64> = None;
    while sim.t_ms < duration_s * 1000
        && sim.nvml_bytes() + largest_step_bytes < H200_TOTAL - 2 * GIB
    {
        model.train_step(sim, 256);
        if sim.t_ms >= next_ms {
            leak_start.get_or_insert(sim.t_ms);
            let (bytes, next) = step(sim);
            kept.push(sim.alloc.alloc(bytes));
            next_ms = next;
        }
        sim.wait(250);
    }
    leak_start
}

/// Issue 35: a leak in rare big steps. A small model trained every 250 ms keeps one
/// `step_bytes` tensor every `period_ms` from `start_after_ms` (the first at the start
/// when `None`), the steps starting at a phase the seed draws within the first period
/// after the start, so runs do not all step on the same sample. Steps that would leave
/// less than 2 GiB of an H200 end the process (out of memory).
pub fn step_leak(
    duration_s: i64,
    seed: u64,
    interval_ms: i64,
    step_bytes: u64,
    period_ms: i64,
    start_after_ms: Option<i64>,
) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let mut model = Mlp::new(&mut sim, 1024, 4);
    let phase_ms = sim.rng().range(0, period_ms / 4);
    let first_ms = start_after_ms.unwrap_or(0) + phase_ms;
    let mut next_ms = first_ms;
    let leak_start = train_keeping_steps(
        &mut sim,
        &mut model,
        duration_s,
        step_bytes,
        first_ms,
        |_| {
            next_ms += period_ms;
            (step_bytes, next_ms)
        },
    );
    let label = Label::Leak {
        leak_start_unix_ms: T0 + leak_start.unwrap_or(first_ms),
    };
    trace(
        "step_leak",
        series("step_leak", "step-leak", label, sim, false),
    )
}

/// Issue 35's flips on the batch path: an irregular staircase, as the H200 leak set's
/// `staircase-eval` (an evaluation pass every few training steps keeps its results).
/// From the first step, each kept block is `mean_step_bytes` × U(0.25, 1.75) (rounded to
/// 2 MiB, as the allocator's segments are) and the gap to the next is `mean_gap_ms` ×
/// U(0.25, 1.75): on average a steady leak, in steps whose size and spacing vary, so that
/// the steadiness windows see two steps in one window now and then.
pub fn irregular_step_leak(
    duration_s: i64,
    seed: u64,
    interval_ms: i64,
    mean_step_bytes: u64,
    mean_gap_ms: i64,
) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let mut model = Mlp::new(&mut sim, 1024, 4);
    let first_ms = sim.rng().range(0, mean_gap_ms);
    let granule = 2 * MIB;
    let largest = 2 * mean_step_bytes;
    let leak_start =
        train_keeping_steps(&mut sim, &mut model, duration_s, largest, first_ms, |sim| {
            let factor = sim.rng().range(250, 1750) as f64 / 1000.0;
            let bytes = ((mean_step_bytes as f64 * factor) as u64 / granule).max(1) * granule;
            let gap = sim.rng().range(mean_gap_ms / 4, mean_gap_ms * 7 / 4);
            (bytes, sim.t_ms + gap.max(1))
        });
    let label = Label::Leak {
        leak_start_unix_ms: T0 + leak_start.unwrap_or(first_ms),
    };
    trace(
        "irregular_step_leak",
        series("irregular_step_leak", "irregular-steps", label, sim, false),
    )
}

/// Issue 35: training whose optimizer is created lazily at `step_at_ms` (one
/// `step_bytes` step), then flat to the end: not a leak.
pub fn one_step_then_flat(
    duration_s: i64,
    seed: u64,
    interval_ms: i64,
    step_at_ms: i64,
    step_bytes: u64,
) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let mut model = Mlp::new(&mut sim, 1024, 4);
    let mut state: Option<u64> = None;
    while sim.t_ms < duration_s * 1000 {
        model.train_step(&mut sim, 256);
        if state.is_none() && sim.t_ms >= step_at_ms {
            state = Some(sim.alloc.alloc(step_bytes));
        }
        sim.wait(250);
    }
    trace(
        "one_step_then_flat",
        series("one_step_then_flat", "one-step", Label::NotLeak, sim, false),
    )
}

/// Issue 35: inference with 1 GiB of weights whose per-request KV cache grows to
/// `kv_bytes` in 64 MiB blocks over the first 60 % of each `period_ms`, is held, then freed
/// with `empty_cache`; each request also keeps `leak_bytes` (from the first request; none
/// with 0: a plain sawtooth, not a leak). The period varies by ±10 % with the seed.
pub fn sawtooth_leak(
    duration_s: i64,
    seed: u64,
    interval_ms: i64,
    period_ms: i64,
    kv_bytes: u64,
    leak_bytes: u64,
) -> LabeledTrace {
    let mut sim = Sim::new(seed, interval_ms);
    sim.init_cuda();
    let _weights = sim.alloc.alloc(GIB);
    let mut kept: Vec<u64> = Vec::new();
    let blocks = (kv_bytes / (64 * MIB)).max(1);
    let mut leak_start: Option<i64> = None;
    while sim.t_ms < duration_s * 1000 && sim.nvml_bytes() + kv_bytes < H200_TOTAL - 2 * GIB {
        let period = period_ms + sim.rng().range(-period_ms / 10, period_ms / 10);
        let build_ms = period * 6 / 10;
        let step_ms = (build_ms / blocks as i64).max(1);
        if leak_bytes > 0 {
            leak_start.get_or_insert(sim.t_ms);
            kept.push(sim.alloc.alloc(leak_bytes));
        }
        let mut kv = Vec::new();
        for _ in 0..blocks {
            kv.push(sim.alloc.alloc(64 * MIB));
            sim.wait(step_ms);
        }
        sim.wait(period / 5);
        for b in kv {
            sim.alloc.free(b);
        }
        sim.alloc.empty_cache();
        sim.wait(period - build_ms - period / 5);
    }
    let label = match leak_start {
        Some(t) => Label::Leak {
            leak_start_unix_ms: T0 + t,
        },
        None => Label::NotLeak,
    };
    let role = if leak_bytes > 0 {
        "sawtooth-leak"
    } else {
        "sawtooth"
    };
    trace(
        "sawtooth_leak",
        series("sawtooth_leak", role, label, sim, false),
    )
}

/// Adds Gaussian noise of standard deviation `sigma_bytes` (rounded to MiB, as NVML
/// reports) to every memory sample: what other processes' churn does to a device total.
pub fn with_noise(mut trace: LabeledTrace, sigma_bytes: f64, seed: u64) -> LabeledTrace {
    if sigma_bytes <= 0.0 {
        return trace;
    }
    let mut rng = Rng::new(seed ^ 0x005E_ED0F_401E);
    for s in &mut trace.series {
        for sample in &mut s.samples {
            let noise = (rng.normal() * sigma_bytes / MIB as f64).round() as i64;
            let bytes = i64::try_from(sample.bytes).unwrap_or(i64::MAX);
            sample.bytes =
                u64::try_from(bytes.saturating_add(noise * MIB as i64).max(0)).unwrap_or(0);
        }
    }
    trace
}

/// The harder cases, sampled every `interval_ms`.
pub fn extras(duration_s: i64, seed: u64, interval_ms: i64) -> Vec<LabeledTrace> {
    vec![
        train_with_eval(duration_s, seed, interval_ms),
        infer_variable(duration_s, seed + 1, interval_ms),
        late_model_load(duration_s, seed + 2, interval_ms),
        leak_slow(duration_s, seed + 3, interval_ms),
    ]
}

/// All seven, as the lead will record them (`DURATION` = `duration_s`), at 10 Hz.
pub fn workloads(duration_s: i64, seed: u64) -> Vec<LabeledTrace> {
    workloads_at(duration_s, seed, 100)
}

/// All seven, sampled every `interval_ms`.
pub fn workloads_at(duration_s: i64, seed: u64, interval_ms: i64) -> Vec<LabeledTrace> {
    vec![
        leak_graph(duration_s, seed, interval_ms),
        leak_staircase(duration_s, seed + 1, interval_ms),
        leak_fast(duration_s, seed + 2, interval_ms),
        dyn_shapes(duration_s, seed + 3, interval_ms),
        sawtooth_infer(duration_s, seed + 4, interval_ms),
        steady_train(duration_s, seed + 5, interval_ms),
        idle_holder(duration_s, seed + 6, interval_ms),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_rounds_into_segments_and_reuses_blocks() {
        let mut a = CachingAllocator::default();
        let s = a.alloc(100);
        assert_eq!(a.reserved, 2 * MIB);
        let m = a.alloc(5 * MIB);
        assert_eq!(a.reserved, 22 * MIB);
        let l = a.alloc(33 * MIB);
        assert_eq!(a.reserved, 56 * MIB);
        a.free(l);
        // The freed 34 MiB block serves a 30 MiB request without a new segment.
        let l2 = a.alloc(30 * MIB);
        assert_eq!(a.reserved, 56 * MIB);
        a.free(l2);
        a.free(m);
        a.free(s);
        assert_eq!(a.allocated, 0);
        a.empty_cache();
        assert_eq!(a.reserved, 0);
    }

    #[test]
    fn dyn_shapes_with_a_90_s_ramp_is_dyn_shapes() {
        let a = dyn_shapes(120, 4, 100);
        let b = dyn_shapes_ramp(120, 4, 100, 90.0);
        assert_eq!(a.series[0].samples, b.series[0].samples);
    }

    /// The memory at `sec` seconds from the start.
    fn bytes_at(t: &LabeledTrace, sec: i64) -> u64 {
        t.series[0]
            .samples
            .iter()
            .rev()
            .find(|x| x.t_unix_ms <= T0 + sec * 1000)
            .unwrap()
            .bytes
    }

    #[test]
    fn a_longer_ramp_keeps_the_reserve_growing_for_longer() {
        for seed in [4, 14, 24] {
            let short = dyn_shapes_ramp(600, seed, 100, 90.0);
            let long = dyn_shapes_ramp(600, seed, 100, 300.0);
            let grown = |t: &LabeledTrace| bytes_at(t, 600) - bytes_at(t, 150);
            assert!(
                grown(&short) <= 64 * MIB,
                "seed {seed}: {} MiB",
                grown(&short) / MIB
            );
            assert!(
                grown(&long) >= 512 * MIB,
                "seed {seed}: {} MiB",
                grown(&long) / MIB
            );
        }
    }

    #[test]
    fn a_paced_leak_grows_at_its_rate_from_its_start() {
        let spec = LeakSpec {
            rate_bytes_per_sec: 20e6,
            tensor_bytes: 2 * MIB,
            start_after_ms: Some(60_000),
        };
        let t = paced_leak(300, 1, 100, &spec);
        let s = &t.series[0];
        let at = |sec: i64| bytes_at(&t, sec);
        // Flat from the end of the first step until the leak starts.
        assert_eq!(at(10), at(59));
        let Label::Leak { leak_start_unix_ms } = s.label else {
            panic!("a leak");
        };
        assert!((60_000..60_400).contains(&(leak_start_unix_ms - T0)));
        // 20 MB/s, within one 20 MiB segment, over 200 s.
        let grown = (at(290) - at(90)) as f64;
        assert!((grown - 200.0 * 20e6).abs() <= 21.0 * MIB as f64, "{grown}");
        // From the first step: it starts with the first training step.
        let first = paced_leak(
            60,
            1,
            100,
            &LeakSpec {
                start_after_ms: None,
                ..spec
            },
        );
        let Label::Leak { leak_start_unix_ms } = first.series[0].label else {
            panic!("a leak");
        };
        assert!(leak_start_unix_ms - T0 <= 200);
    }

    #[test]
    fn a_paced_leak_ends_before_it_fills_the_gpu() {
        let spec = LeakSpec {
            rate_bytes_per_sec: 500e6,
            tensor_bytes: 2 * MIB,
            start_after_ms: None,
        };
        let t = paced_leak(600, 1, 1000, &spec);
        let last = t.series[0].samples.last().unwrap();
        assert!(last.bytes <= H200_TOTAL - 2 * GIB + 20 * MIB);
        assert!(
            last.t_unix_ms - T0 < 300_000,
            "ends at its OOM, about 280 s in"
        );
    }

    #[test]
    fn noise_has_the_standard_deviation_asked_in_whole_mib() {
        let clean = steady_train(300, 6, 100);
        let noisy = with_noise(clean.clone(), 16.0 * MIB as f64, 1);
        let d: Vec<f64> = clean.series[0]
            .samples
            .iter()
            .zip(&noisy.series[0].samples)
            .map(|(a, b)| (b.bytes as f64 - a.bytes as f64) / MIB as f64)
            .collect();
        assert!(d.iter().all(|x| x.fract() == 0.0));
        let n = d.len() as f64;
        let mean = d.iter().sum::<f64>() / n;
        let sd = (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(
            mean.abs() < 1.0 && (sd - 16.0).abs() < 1.0,
            "mean {mean}, sd {sd}"
        );
        assert_eq!(
            with_noise(clean.clone(), 0.0, 1).series[0].samples,
            clean.series[0].samples
        );
    }

    #[test]
    fn freed_neighbours_coalesce() {
        let mut a = CachingAllocator::default();
        let x = a.alloc(12 * MIB);
        a.free(x);
        // One 12 MiB segment; split into 4 + 8 MiB, both freed, then 12 MiB fits again.
        let p = a.alloc(4 * MIB);
        let q = a.alloc(8 * MIB);
        a.free(p);
        a.free(q);
        let r = a.alloc(12 * MIB);
        assert_eq!(a.reserved, 12 * MIB);
        a.free(r);
    }
}
