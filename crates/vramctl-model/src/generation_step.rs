//! The allocations of a `generate()` job, in the order transformers and PyTorch make them,
//! replayed through the caching allocator ([`crate::caching_allocator`]): what
//! `max_memory_reserved()` becomes, as [`crate::training_step`] does for training
//! (`docs/estimate.md`, "The allocator (generation)").
//!
//! The program, read from transformers 5.25's `generate` (greedy `_sample`), its
//! `DynamicCache` and the families' modeling files:
//!
//! - the weights, each layer's matrices a tensor of their own, then the prompt's ids and
//!   attention mask (int64);
//! - the **prefill**, block by block over the whole prompt: the norm (RMSNorm upcasts to
//!   fp32 and squares, two fp32 transients), q/k/v (rotary embeddings make three q-sized and
//!   three k-sized transients), the cache's first `torch.cat` (a copy of the block's keys and
//!   of its values, kept), SDPA's output and its contiguous transpose, the output
//!   projection, the residual add; the MLP: gated `down(act(gate(x)) * up(x))` holds three
//!   intermediates at once, GPT-2's `gelu_new` (`0.5 * x * (1 + tanh(...))`, Python
//!   arithmetic) four, another plain activation two (GPT-NeoX's block is its own:
//!   `Gen::gpt_neox_block`); then the last position's logits (`logits_to_keep=1`);
//! - after each forward, what `_sample` does with the logits (`Gen::sample`): the masks and
//!   `input_ids` one token longer, the fp32 copy and the scores kept until the next token,
//!   the two logits processors that `min_new_tokens` adds;
//! - each **generated token**: the same blocks over one token per sequence, where each
//!   layer's `DynamicLayer.update` does `self.keys = torch.cat([self.keys, k])`: the new
//!   keys (one token longer) are allocated while the old are alive, then the old are freed,
//!   and the same for the values — the growing cache walks through the allocator's blocks;
//!   a windowed layer (`DynamicSlidingWindowLayer`) concatenates its last `window − 1` tokens
//!   with the new one. The ids and the mask grow by `torch.cat` too.
//!
//! A long generation replays its first and last 64 tokens and an even spread of at most 128
//! in between, each replayed token standing for the ones skipped before it (the cache grows
//! by their tokens at once), so that a replay stays under ~50k cache allocations per layer
//! count; the peak of a growing cache is at its end, which is replayed token by token.

use crate::architecture::{Architecture, Family, Mlp, Norm};
use crate::caching_allocator::{BlockId, CachingAllocator};
use crate::training_step::CUBLAS_WORKSPACE_BYTES;

/// Generated tokens replayed one by one at the start and at the end of a long generation.
const EDGE_TOKENS: u64 = 64;
/// Generated tokens replayed in between, evenly spread.
const MIDDLE_TOKENS: u64 = 128;

/// The most block forwards (layers × replayed forwards) a replay runs: 126 layers (the
/// largest Llama) over the 257 forwards of a long generation is 32,382.
const MAX_LAYER_FORWARDS: u64 = 1_000_000;

/// What the program needs to know of a generation job.
#[derive(Debug, Clone, PartialEq)]
pub struct GenJob {
    pub batch: u64,
    /// Prompt tokens per sequence.
    pub seq: u64,
    pub generated: u64,
    /// Bytes of an activation (the compute dtype).
    pub act_bytes: u64,
    /// Bytes of a cached key or value element.
    pub kv_bytes: u64,
    /// Bytes of all the weights as loaded.
    pub weight_bytes: u64,
    /// Eager attention: the scores and their fp32 softmax are materialised.
    pub eager: bool,
    /// The weights were made in fp32, then cast with `.to()` parameter by parameter: the
    /// fp32 copy is freed as each cast is made, and stays reserved.
    pub cast_from_fp32: bool,
    /// cuBLAS's 32 MiB workspace comes from PyTorch's allocator (on a GPU).
    pub cublas_workspace: bool,
}

/// The replay's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenReplay {
    /// `max_memory_allocated()` of the replay.
    pub peak_allocated: u64,
    /// `max_memory_reserved()` of the replay.
    pub peak_reserved: u64,
    /// Allocations made.
    pub allocations: u64,
    /// Segments cut.
    pub segments: u64,
}

/// Replays `job` on `arch`; `None` for sizes past what is counted (an absurd job) or an
/// encoder-decoder (T5's generation is not replayed).
pub fn replay(arch: &Architecture, job: &GenJob) -> Option<GenReplay> {
    let tokens = job.batch.checked_mul(job.seq)?;
    let widest = arch
        .intermediate
        .max(arch.hidden)
        .max(arch.q_dim_saturating())
        .max(moe_width(arch));
    let context = job.seq.checked_add(job.generated)?;
    let forwards = replayed_steps(job.generated.saturating_sub(1)).len() as u64 + 1;
    if tokens == 0
        || arch.layers == 0
        || arch.family == Family::T5
        || tokens.checked_mul(widest)?.checked_mul(16)? > 1 << 60
        || job.batch.checked_mul(arch.vocab)?.checked_mul(16)? > 1 << 60
        || job
            .batch
            .checked_mul(context)?
            .checked_mul(arch.kv_cache_width().max(8))?
            .checked_mul(16)?
            > 1 << 60
        // Bounded work: a config with absurdly many layers is not replayed.
        || arch.layers.saturating_mul(forwards) > MAX_LAYER_FORWARDS
    {
        return None;
    }
    if job.eager {
        job.batch
            .checked_mul(arch.heads)?
            .checked_mul(job.seq.checked_mul(job.seq.checked_add(job.generated)?)?)?
            .checked_mul(16)
            .filter(|&b| b < 1 << 60)?;
    }
    let mut g = Gen::new(arch, job);
    g.run();
    Some(GenReplay {
        peak_allocated: g.alloc.peak_allocated,
        peak_reserved: g.alloc.peak_reserved,
        allocations: g.allocations,
        segments: g.alloc.segments,
    })
}

/// The MLP width one token passes through in a MoE layer: its top-k experts (and the
/// shared expert), as a gated MLP of that width.
fn moe_width(arch: &Architecture) -> u64 {
    arch.moe.map_or(0, |m| {
        m.top_k.saturating_mul(m.expert_intermediate) + m.shared_expert_intermediate
    })
}

/// The tensors `generate()` keeps from one token to the next (`None` before the first).
#[derive(Default)]
struct Kept {
    mask: Option<BlockId>,
    inputs_mask: Option<BlockId>,
    /// The older mask, held by the model inputs until the next step prepares its own.
    previous_inputs_mask: Option<BlockId>,
    logits_fp32: Option<BlockId>,
    scores: Option<BlockId>,
    input_ids: Option<BlockId>,
}

struct Gen<'a> {
    arch: &'a Architecture,
    job: &'a GenJob,
    alloc: CachingAllocator,
    allocations: u64,
    /// Each cache layer's keys and values, and the tokens they hold.
    cache: Vec<(BlockId, BlockId, u64)>,
    /// Whether cuBLAS's workspace is taken (at the first matmul).
    workspace: bool,
}

impl<'a> Gen<'a> {
    fn new(arch: &'a Architecture, job: &'a GenJob) -> Self {
        Gen {
            arch,
            job,
            alloc: CachingAllocator::new(),
            allocations: 0,
            cache: Vec::new(),
            workspace: !job.cublas_workspace,
        }
    }

    fn malloc(&mut self, bytes: u64) -> BlockId {
        self.allocations += 1;
        self.alloc.malloc(bytes.max(1))
    }

    fn free(&mut self, b: BlockId) {
        self.alloc.free(b);
    }

    fn run(&mut self) {
        let job = self.job;
        self.weights();
        let (b, s) = (job.batch, job.seq);
        // The caller's input_ids and attention mask (int64), alive through the job.
        self.malloc(b * s * 8);
        self.malloc(b * s * 8);
        let mut kept = Kept::default();
        // The prefill; its logits give the first generated token.
        let logits = self.forward(s, s);
        self.sample(logits, s + 1, &mut kept);
        // Each further token is a forward over one token per sequence; a replayed token
        // stands for those skipped before it (the cache grows by their tokens at once).
        let mut done = 0;
        for replayed in replayed_steps(job.generated.saturating_sub(1)) {
            let grow = replayed - done;
            done = replayed;
            // The next step's model inputs replace the last's, which held the older mask.
            if let Some(old) = kept.previous_inputs_mask.take() {
                self.free(old);
            }
            let logits = self.forward(grow.min(1), s + replayed);
            self.sample(logits, s + replayed + 1, &mut kept);
        }
    }

    /// What `_sample` does with a forward's logits in transformers 5 (greedy, exactly N
    /// tokens: `min_new_tokens` adds `MinLengthLogitsProcessor` and
    /// `MinNewTokensLengthLogitsProcessor`), read from the allocator's trace of Pythia-160M's
    /// generation on an H100 (2026-12-06): `_update_model_kwargs_for_generation` makes the
    /// attention mask one token longer, twice (the older of one is let go at once, of the
    /// other when the next step's model inputs replace it); the fp32 copy of the last
    /// position's logits, kept until the next; each processor's `arange` of the vocabulary,
    /// its end-of-sequence mask, a `clone` of the scores and their `torch.where`; the scores
    /// kept until the next; `input_ids` one token longer by `torch.cat`; then the outputs
    /// (the logits) let go. `length` is the tokens per sequence after this token. With a
    /// large batch these tensors are tens of MB and split the cache's free blocks, which
    /// decides how many segments its `torch.cat`s cut (round 8's Pythia-160M b128: 23 %).
    fn sample(&mut self, logits: BlockId, length: u64, kept: &mut Kept) {
        let (b, v) = (self.job.batch, self.arch.vocab);
        let mask = self.malloc(b * length * 8);
        let inputs_mask = self.malloc(b * length * 8);
        if let Some(old) = kept.mask.replace(mask) {
            self.free(old);
        }
        kept.previous_inputs_mask = kept.inputs_mask.replace(inputs_mask);
        let copy = self.malloc(b * v * 4);
        if let Some(old) = kept.logits_fp32.replace(copy) {
            self.free(old);
        }
        // MinLengthLogitsProcessor: the vocabulary's ids, the EOS mask, then the scores'
        // clone and the masked scores.
        let ids = self.malloc(v * 8);
        let eos = self.malloc(v);
        let clone = self.malloc(b * v * 4);
        let first = self.malloc(b * v * 4);
        self.free(clone);
        self.free(ids);
        self.free(eos);
        // MinNewTokensLengthLogitsProcessor: the clone first, then the same.
        let clone = self.malloc(b * v * 4);
        let ids = self.malloc(v * 8);
        let eos = self.malloc(v);
        let second = self.malloc(b * v * 4);
        self.free(clone);
        self.free(ids);
        self.free(eos);
        self.free(first);
        if let Some(old) = kept.scores.replace(second) {
            self.free(old);
        }
        let input_ids = self.malloc(b * length * 8);
        if let Some(old) = kept.input_ids.replace(input_ids) {
            self.free(old);
        }
        // `del outputs`.
        self.free(logits);
    }

    /// The model's weights: the embedding, each layer's matrices, the head when untied,
    /// scaled so that they add up to the job's weight bytes.
    fn weights(&mut self) {
        let arch = self.arch;
        let (h, v) = (arch.hidden, arch.vocab);
        let layers = arch.total_layers().max(1);
        let mlp = match arch.moe {
            Some(m) => vec![
                m.experts * 2 * m.expert_intermediate * h,
                m.experts * m.expert_intermediate * h,
                3 * m.shared_expert_intermediate * h,
            ],
            None => match arch.mlp {
                Mlp::Gated => vec![arch.intermediate * h; 3],
                Mlp::Plain => vec![arch.intermediate * h; 2],
            },
        };
        let per_norm: usize = if arch.norm == Norm::LayerNorm { 2 } else { 1 };
        let norms = std::iter::repeat_n(h, arch.norms_per_layer as usize * per_norm);
        let (q, kv) = (arch.q_dim_saturating(), arch.kv_dim());
        let per_layer: Vec<u64> = if arch.family == Family::GptNeox {
            // GPTNeoXLayer makes its two LayerNorms first, then query_key_value (one
            // matrix) and dense, then the MLP, every linear with its bias: counted, so that
            // each matrix is its exact bytes (a 24 MiB query_key_value scaled up by
            // biases it did not count would cut a 26 MiB segment).
            let i = arch.intermediate;
            norms
                .chain([h * (q + 2 * kv), q + 2 * kv, q * h, h, i * h, i, i * h, h])
                .collect()
        } else {
            // The norms' weights (and LayerNorm's biases), after the MLP as the modules
            // are made: counted, so that the matrices are not scaled up by what they would
            // hold — a 1 MiB projection scaled past 1 MiB is cut from the large pool's
            // 20 MiB segments instead of the small pool's 2 MiB ones (TinyLlama: 88 MiB
            // more reserved).
            [h * q, h * kv, h * kv, q * h]
                .into_iter()
                .chain(mlp)
                .chain(norms)
                .collect()
        };
        let head = if arch.tied_embeddings { 0 } else { v * h };
        // The final norm, as the layers' (none where the layers have none).
        let last_norm: Vec<u64> = if arch.norms_per_layer > 0 {
            vec![h; per_norm]
        } else {
            Vec::new()
        };
        let elements: u64 =
            v * h + head + layers * per_layer.iter().sum::<u64>() + last_norm.iter().sum::<u64>();
        let scale = self.job.weight_bytes as f64 / elements.max(1) as f64;
        let bytes = |e: u64| ((e as f64) * scale).ceil() as u64;
        let mut sizes = vec![v * h];
        for _ in 0..layers {
            sizes.extend(per_layer.iter().copied().filter(|&e| e > 0));
        }
        sizes.extend(last_norm);
        if head > 0 {
            sizes.push(head);
        }
        if self.job.cast_from_fp32 {
            // Built in fp32 (every parameter), then `.to(dtype)`: each cast allocated, then
            // its fp32 parameter freed; the fp32 blocks stay in the cache.
            let fp32: Vec<BlockId> = sizes.iter().map(|&e| self.malloc(e * 4)).collect();
            for (&e, old) in sizes.iter().zip(fp32) {
                self.malloc(bytes(e));
                self.free(old);
            }
        } else {
            for &e in &sizes {
                self.malloc(bytes(e));
            }
        }
    }

    /// One forward over `new` tokens per sequence (the prompt, or 1), the cache holding
    /// `context` tokens after it; returns the last position's logits. The order and
    /// lifetimes are those of transformers 5.25's modeling code as a CPU allocation trace
    /// shows them (`docs/estimate.md`, "The allocator (generation)"): the embedding's
    /// output is the model's `inputs_embeds` (GPT-2: `inputs_embeds` and `position_embeds`,
    /// both batch × seq, and their sum), held until the model returns; a block's input is
    /// held by the caller's loop until the block returns.
    fn forward(&mut self, new: u64, context: u64) -> BlockId {
        let arch = self.arch;
        let a = self.job.act_bytes;
        let b = self.job.batch;
        let t = b * new;
        let h = arch.hidden;
        let mut held = vec![self.malloc(t * h * a)];
        // The attention mask's preparation: a bool copy of the [batch, length] mask and an
        // int64 temporary of its shape, both let go before the first block (a large-pool
        // block once batch × length passes 128 Ki).
        let padding = self.malloc(b * context);
        let temporary = self.malloc(b * context * 8);
        self.free(temporary);
        self.free(padding);
        let mut x = held[0];
        if arch.learned_positions {
            held.push(self.malloc(t * h * a));
            x = self.malloc(t * h * a);
        }
        // RoPE's cos and sin for the new positions, alive through the forward.
        let rope = (!arch.learned_positions).then(|| self.rope_tables(t));
        for layer in 0..arch.layers as usize {
            let out = self.block(layer, new, context);
            if !held.contains(&x) {
                self.free(x);
            }
            x = out;
        }
        let n = self.norm(t);
        self.free(x);
        for e in held {
            self.free(e);
        }
        if let Some((c, s)) = rope {
            self.free(c);
            self.free(s);
        }
        // Only the last position's logits (logits_to_keep=1), which `sample` takes.
        let logits = self.malloc(self.job.batch * arch.vocab * a);
        self.free(n);
        logits
    }

    /// cuBLAS's workspace, taken from PyTorch's allocator at the first matmul and never
    /// given back (training_step::CUBLAS_WORKSPACE_BYTES); not on a CPU.
    fn first_matmul(&mut self) {
        if !self.workspace {
            self.workspace = true;
            self.malloc(CUBLAS_WORKSPACE_BYTES);
        }
    }

    /// The rotary embedding's cos and sin for `t` positions, as transformers' `*RotaryEmbedding.
    /// forward` makes them in fp32 (autocast off): the positions as floats, `inv_freq @
    /// positions` (the model's first matmul, so cuBLAS's workspace comes here, before any
    /// block's tensor), `cat(freqs, freqs)`, `cos()` and `* attention_scaling` (a new tensor
    /// even at 1.0, the unscaled one let go), the same for sin, each cast to the compute
    /// dtype (no copy in fp32); the fp32 temporaries are let go and the casts kept through
    /// the forward. Read from an H200 trace of TinyLlama's `generate()` (2026-12-05): these
    /// temporaries cut their own small segments before the first block, and the workspace
    /// its own, which decides how the blocks' tensors share the pool afterwards.
    fn rope_tables(&mut self, t: u64) -> (BlockId, BlockId) {
        // A partial rotary (GPT-NeoX, Phi) makes its tables as wide as the dimensions it turns.
        let d = self.arch.rotary_dims.unwrap_or(self.arch.head_dim);
        let a = self.job.act_bytes;
        let positions = self.malloc(t * 4);
        let freqs = self.malloc(t * (d / 2).max(1) * 4);
        self.first_matmul();
        let emb = self.malloc(t * d * 4);
        let mut scaled = || {
            let raw = self.malloc(t * d * 4);
            let scaled = self.malloc(t * d * 4);
            self.free(raw);
            scaled
        };
        let (cos, sin) = (scaled(), scaled());
        let tables = if a == 4 {
            (cos, sin)
        } else {
            (self.malloc(t * d * a), self.malloc(t * d * a))
        };
        self.free(positions);
        self.free(freqs);
        self.free(emb);
        if a != 4 {
            self.free(cos);
            self.free(sin);
        }
        tables
    }

    /// A norm's output. RMSNorm as transformers writes it: `x.to(float32)` (a copy unless
    /// already fp32), `pow(2)`, its mean, `x * rsqrt(...)` (the fp32 input let go), the cast
    /// back, `weight * ...`.
    fn norm(&mut self, t: u64) -> BlockId {
        let (a, h) = (self.job.act_bytes, self.arch.hidden);
        match self.arch.norm {
            Norm::RmsNorm => {
                let up = (a != 4).then(|| self.malloc(t * h * 4));
                let sq = self.malloc(t * h * 4);
                let var = self.malloc(t * 4);
                self.free(sq);
                let scaled = self.malloc(t * h * 4);
                if let Some(u) = up {
                    self.free(u);
                }
                let down = (a != 4).then(|| self.malloc(t * h * a));
                let out = self.malloc(t * h * a);
                if let Some(d) = down {
                    self.free(d);
                }
                self.free(scaled);
                self.free(var);
                out
            }
            Norm::LayerNorm => self.malloc(t * h * a),
        }
    }

    /// `(x * cos) + (rotate_half(x) * sin)`: x·cos, the halves' negation and their cat, ·sin.
    fn rotary(&mut self, n: u64) -> BlockId {
        let xc = self.malloc(n);
        let neg = self.malloc(n / 2);
        let cat = self.malloc(n);
        self.free(neg);
        let xs = self.malloc(n);
        self.free(cat);
        let out = self.malloc(n);
        self.free(xc);
        self.free(xs);
        out
    }

    /// One decoder block over the hidden states (which the caller frees after it returns).
    fn block(&mut self, layer: usize, new: u64, context: u64) -> BlockId {
        if self.arch.family == Family::GptNeox {
            return self.gpt_neox_block(layer, new, context);
        }
        let arch = self.arch;
        let a = self.job.act_bytes;
        let b = self.job.batch;
        let t = b * new;
        let (h, q, kv) = (arch.hidden, arch.q_dim_saturating(), arch.kv_dim());
        // GPT-2's block names its branches' outputs (`attn_output`, `feed_forward_hidden_
        // states`), so they live until it returns; Llama-style blocks reassign
        // `hidden_states`, which lets each go at its residual add.
        let named_branches = arch.family == Family::Gpt2;
        // Attention: the norm, q/k/v (one fused projection where the model fuses it).
        let n1 = self.norm(t);
        self.first_matmul();
        let fused = arch.learned_positions;
        let (qkv, parts) = if fused {
            (Some(self.malloc(t * (q + 2 * kv) * a)), None)
        } else {
            let qt = self.malloc(t * q * a);
            let kt = self.malloc(t * kv * a);
            let vt = self.malloc(t * kv * a);
            (None, Some((qt, kt, vt)))
        };
        let mut roped = None;
        if let Some((qt, kt, vt)) = parts {
            let qr = self.rotary(t * q * a);
            let kr = self.rotary(t * kv * a);
            self.free(qt);
            self.free(kt);
            roped = Some((qr, kr, vt));
        }
        self.cache_update(layer, new, context);
        if let Some((_, kr, vt)) = roped {
            self.free(kr);
            self.free(vt);
        }
        // SDPA's output (its kernels write it as [batch, seq, heads, dim], so transformers'
        // `.transpose(1, 2).contiguous()` copies nothing); eager materialises the scores.
        let scores = self.job.eager.then(|| {
            let n = b * arch.heads * new * context;
            (self.malloc(n * 4), self.malloc(n * a))
        });
        let attn = self.malloc(t * q * a);
        // The kernel's log-sum-exp, fp32 per head and query, let go when SDPA returns.
        let lse = self.malloc(b * arch.heads * new * 4);
        self.free(lse);
        if let Some((s32, s16)) = scores {
            self.free(s32);
            self.free(s16);
        }
        let o = self.malloc(t * h * a);
        self.free(attn);
        if let Some((qr, _, _)) = roped {
            self.free(qr);
        }
        if let Some(f) = qkv {
            self.free(f);
        }
        let x1 = self.malloc(t * h * a);
        self.free(n1);
        if !named_branches {
            self.free(o);
        }
        // The MLP.
        let n2 = self.norm(t);
        let i = if arch.moe.is_some() {
            moe_width(arch)
        } else {
            arch.intermediate
        };
        let m = t * i * a;
        let out_in = match (arch.moe.is_some(), arch.mlp) {
            (true, _) | (false, Mlp::Gated) => {
                let gate = self.malloc(m);
                let act = self.malloc(m);
                self.free(gate);
                let up = self.malloc(m);
                let prod = self.malloc(m);
                self.free(act);
                self.free(up);
                prod
            }
            (false, Mlp::Plain) if arch.activation == "gelu_new" => {
                // 0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3))), left to right.
                let fc = self.malloc(m);
                let half = self.malloc(m);
                let cube = self.malloc(m);
                let scaled = self.malloc(m);
                self.free(cube);
                let mut cur = scaled;
                for _ in 0..4 {
                    let next = self.malloc(m);
                    self.free(cur);
                    cur = next;
                }
                let out = self.malloc(m);
                self.free(cur);
                self.free(half);
                self.free(fc);
                out
            }
            (false, Mlp::Plain) => {
                let fc = self.malloc(m);
                let act = self.malloc(m);
                self.free(fc);
                act
            }
        };
        let down = self.malloc(t * h * a);
        self.free(out_in);
        if !named_branches {
            self.free(n2);
        }
        let x2 = self.malloc(t * h * a);
        if named_branches {
            self.free(n2);
            self.free(o);
        }
        self.free(down);
        self.free(x1);
        x2
    }

    /// `GPTNeoXLayer` as transformers 5 writes it, read from the allocator's trace of
    /// Pythia-1B's `generate()` on an H100 (2026-12-06, `testdata/h100/round7/call1/
    /// pythia-gen.trace.json.gz`): one fused `query_key_value` output, split into views; the
    /// rotary over each head's first `rotary_dims` only (its temporaries a quarter of q's
    /// width for Pythia), both rotations before q and k are concatenated back to whole heads
    /// (`torch.cat([q_embed, q_pass])`: new tensors in [b, heads, s, d] order, the rotated
    /// parts let go); the cache copies k and v (v a view of the fused output); SDPA's output
    /// has q's [b, heads, s, d] layout, so `.transpose(1, 2).contiguous()` copies it over a
    /// prompt (one token per sequence needs no copy); `dense`, then the fused output, q and
    /// the first norm let go. The parallel residual (`use_parallel_residual`, Pythia's):
    /// the MLP reads the second norm of the block's input, and `mlp + attn + x` makes two
    /// sums. Without it, `attn + x` then `mlp(norm(that)) + that`.
    fn gpt_neox_block(&mut self, layer: usize, new: u64, context: u64) -> BlockId {
        let arch = self.arch;
        let a = self.job.act_bytes;
        let t = self.job.batch * new;
        let (h, q, kv, i) = (
            arch.hidden,
            arch.q_dim_saturating(),
            arch.kv_dim(),
            arch.intermediate,
        );
        let rot = arch.rotary_dims.unwrap_or(arch.head_dim);
        // LayerNorm's kernel also returns its fp32 mean and rstd per token, let go at once.
        let layer_norm = |g: &mut Self| {
            let out = g.norm(t);
            let (mean, rstd) = (g.malloc(t * 4), g.malloc(t * 4));
            g.free(mean);
            g.free(rstd);
            out
        };
        let n1 = layer_norm(self);
        self.first_matmul();
        let qkv = self.malloc(t * (q + 2 * kv) * a);
        let q_rot = self.rotary(t * arch.heads * rot * a);
        let k_rot = self.rotary(t * arch.kv_heads * rot * a);
        let query = self.malloc(t * q * a);
        self.free(q_rot);
        let key = self.malloc(t * kv * a);
        self.free(k_rot);
        self.cache_update(layer, new, context);
        self.free(key);
        let mut attn = self.malloc(t * q * a);
        if new > 1 {
            let contiguous = self.malloc(t * q * a);
            self.free(attn);
            attn = contiguous;
        }
        let dense = self.malloc(t * h * a);
        self.free(attn);
        self.free(qkv);
        self.free(query);
        self.free(n1);
        let mlp = |g: &mut Self| {
            let n2 = layer_norm(g);
            let fc = g.malloc(t * i * a);
            let act = g.malloc(t * i * a);
            g.free(fc);
            let down = g.malloc(t * h * a);
            g.free(act);
            g.free(n2);
            down
        };
        if arch.norms_share_input {
            let down = mlp(self);
            let sum = self.malloc(t * h * a);
            let out = self.malloc(t * h * a);
            self.free(sum);
            self.free(dense);
            self.free(down);
            out
        } else {
            let x1 = self.malloc(t * h * a);
            self.free(dense);
            let down = mlp(self);
            let out = self.malloc(t * h * a);
            self.free(down);
            self.free(x1);
            out
        }
    }

    /// `DynamicLayer.update`: keys then values, each `torch.cat([old, new])`; a windowed
    /// layer keeps `window − 1` tokens of the concatenation (a view: the storage is the
    /// concatenation's).
    fn cache_update(&mut self, layer: usize, new: u64, context: u64) {
        let arch = self.arch;
        let b = self.job.batch;
        let width = arch.kv_cache_width();
        // MLA caches a compressed latent: the width per token and layer is the cache's.
        let per_token = b * width * self.job.kv_bytes;
        let window = arch
            .sliding_window
            .filter(|_| (layer as u64) < arch.kv_cache_layers() && layer_windowed(arch, layer))
            .map(|w| w.tokens);
        let tokens = match (window, self.cache.get(layer)) {
            (Some(w), Some(&(_, _, held))) => held.min(w.saturating_sub(1)) + new,
            (_, Some(&(_, _, held))) => held + new,
            (_, None) => context,
        };
        let _ = context;
        // Keys (half the width), then values.
        let half = per_token * tokens / 2;
        let k = self.malloc(half);
        if let Some(&(old_k, _, _)) = self.cache.get(layer) {
            self.free(old_k);
        }
        let v = self.malloc(per_token * tokens - half);
        if let Some(&(_, old_v, _)) = self.cache.get(layer) {
            self.free(old_v);
        }
        if layer < self.cache.len() {
            self.cache[layer] = (k, v, tokens);
        } else {
            self.cache.push((k, v, tokens));
        }
    }
}

/// Whether decoder layer `layer` has a windowed cache, as
/// [`crate::memory_model::kv_cache_layer_tokens`] counts them: the first `window.layers`
/// of an evenly interleaved pattern are spread over the layers.
fn layer_windowed(arch: &Architecture, layer: usize) -> bool {
    let Some(w) = arch.sliding_window else {
        return false;
    };
    let layers = arch.kv_cache_layers().max(1);
    let windowed = w.layers.min(layers);
    // Spread `windowed` of `layers` evenly: layer i is windowed when the count of windowed
    // layers before it grows at i.
    let l = layer as u64;
    (l + 1) * windowed / layers > l * windowed / layers
}

/// The generated tokens (after the first) whose forward is replayed, as counts of tokens
/// done after it: all of them when there are few, else the first and last
/// [`EDGE_TOKENS`] and [`MIDDLE_TOKENS`] evenly between.
fn replayed_steps(steps: u64) -> Vec<u64> {
    if steps <= 2 * EDGE_TOKENS + MIDDLE_TOKENS {
        return (1..=steps).collect();
    }
    let mut out: Vec<u64> = (1..=EDGE_TOKENS).collect();
    let (from, to) = (EDGE_TOKENS, steps - EDGE_TOKENS);
    for k in 1..=MIDDLE_TOKENS {
        let spread = u128::from(to - from) * u128::from(k) / u128::from(MIDDLE_TOKENS + 1);
        out.push(from + u64::try_from(spread).unwrap_or(to - from));
    }
    out.extend(steps - EDGE_TOKENS + 1..=steps);
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arch(config: &str) -> Architecture {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/model/configs")
            .join(config);
        let text = std::fs::read_to_string(path).expect("config");
        crate::hf_config::parse_config(&text).expect("a config")
    }

    /// A bf16 generation job of a model with `params` parameters, on a GPU.
    fn bf16_generation(batch: u64, seq: u64, generated: u64, params: u64) -> GenJob {
        GenJob {
            batch,
            seq,
            generated,
            act_bytes: 2,
            kv_bytes: 2,
            weight_bytes: params * 2,
            eager: false,
            cast_from_fp32: false,
            cublas_workspace: true,
        }
    }

    /// Pythia-160M bf16 generating 256 tokens after 128 × 1024 on an H100 (2026-12-06, round
    /// 8's held-back case that missed by −23.5 %, so tuning now): torch reserved
    /// 52,684,652,544 B over 7,625,753,600 allocated — the cache's `torch.cat`s cut 233
    /// segments because each token's logits, their fp32 copies, the processors' clones and
    /// the [batch, length] int64 masks split its free blocks (trace:
    /// testdata/h100/round7/call4/pythia160m-gen.trace.json.gz). Without `sample`'s
    /// epilogue the program reserved 40.15 GB.
    #[test]
    fn pythia_160m_generation_reserves_what_torch_reserved_on_the_h100() {
        let a = arch("pythia-160m.json");
        let r = replay(&a, &bf16_generation(128, 1024, 256, 162_322_944)).expect("replayed");
        assert!(within(r.peak_allocated, 7_625_753_600, 0.003), "{r:?}");
        assert!(within(r.peak_reserved, 52_684_652_544, 0.005), "{r:?}");
    }

    fn within(got: u64, want: u64, share: f64) -> bool {
        (got as f64 - want as f64).abs() <= want as f64 * share
    }

    fn gpt2_fp32(batch: u64) -> GenJob {
        GenJob {
            batch,
            seq: 1024,
            generated: 64,
            act_bytes: 4,
            kv_bytes: 4,
            weight_bytes: 124_439_808 * 4,
            eager: false,
            cast_from_fp32: false,
            cublas_workspace: true,
        }
    }

    /// The program against transformers 5.25's own allocations: `python3
    /// scripts/estimate/cpu_generation_trace.py CONFIG B S G DTYPE` records `generate()`'s
    /// allocations and frees on a CPU (torch 2.15's profiler, `profile_memory`) and replays
    /// them through the allocator's rules (`replay_traces.py`). With 2 layers and weights
    /// left out (the trace starts after the model is built), GPT-2 fp32 8 × (512 + 64) had
    /// 327,221,348 B live at its peak and replays to 392,167,424 reserved; 32 × (128 + 200)
    /// 327,221,540 and 394,264,576; TinyLlama bf16 8 × (512 + 64) 215,023,704 and
    /// 297,795,584. The program allocates the same bytes within 16 KiB (its ids, mask and
    /// 512-B stand-ins for the weights and norms) and reserves the same to the byte for
    /// GPT-2, 0.7 % (2 MiB) less for TinyLlama (1.4 % before the rotary embedding's fp32
    /// temporaries were replayed).
    #[test]
    fn the_program_allocates_what_transformers_generate_allocates() {
        let cases = [
            ("gpt2.json", 8, 512, 64, 4, 327_221_348, 392_167_424, 0),
            ("gpt2.json", 32, 128, 200, 4, 327_221_540, 394_264_576, 0),
            (
                "tinyllama-1.1b.json",
                8,
                512,
                64,
                2,
                215_023_704,
                297_795_584,
                5_000_000,
            ),
        ];
        for (config, batch, seq, generated, act, live, reserved, slack) in cases {
            let mut a = arch(config);
            a.layers = 2;
            let r = replay(
                &a,
                &GenJob {
                    batch,
                    seq,
                    generated,
                    act_bytes: act,
                    kv_bytes: act,
                    weight_bytes: 0,
                    eager: false,
                    cast_from_fp32: false,
                    cublas_workspace: false,
                },
            )
            .expect("replayed");
            assert!(
                r.peak_allocated.abs_diff(live) < 16 << 10,
                "{config}: {r:?} against {live} live"
            );
            assert!(
                r.peak_reserved.abs_diff(reserved) <= slack,
                "{config}: {r:?} against {reserved} reserved"
            );
        }
    }

    /// TinyLlama bf16 generating 256 tokens after 64 × 1024 on the H200 (2026-12-05, the
    /// held-back case of round 4 that missed by −8.1 %, so tuning now): torch's
    /// `max_memory_reserved()` 8,533,311,488 and `max_memory_allocated()` 7,019,355,648;
    /// its allocator trace (testdata/h200/round5/tinyllama-gen.trace.json.gz, replayed
    /// through `scripts/estimate/replay_traces.py`'s rules) reserves the same to the byte, and
    /// its peak is the prefill's, set before the first token is generated. The program
    /// reserved 7,782,531,072 (−8.8 %) until it replayed the rotary embedding's fp32
    /// temporaries and cuBLAS's workspace at the model's first matmul (the rotary's), and
    /// made the projections their exact bytes by counting the norms.
    #[test]
    fn tinyllama_generation_reserves_what_torch_reserved_on_the_h200() {
        let a = arch("tinyllama-1.1b.json");
        let r = replay(&a, &bf16_generation(64, 1024, 256, 1_100_048_384)).expect("replayed");
        assert!(within(r.peak_allocated, 7_019_355_648, 0.001), "{r:?}");
        assert!(within(r.peak_reserved, 8_533_311_488, 0.005), "{r:?}");
    }

    /// Pythia-1B bf16 generating 128 tokens after 32 × 1024 on an H100 (2026-12-06, round
    /// 5's held-back case that missed by +11.6 %, so tuning now): torch's
    /// `max_memory_reserved()` 15,151,923,200 and `max_memory_allocated()` 7,973,187,072;
    /// its allocator trace (testdata/h100/round7/call1/pythia-gen.trace.json.gz) replays
    /// through the allocator's rules to the same reserved bytes. Its peak is the cache's at
    /// the end of the generation: each `torch.cat` of a layer's keys or values outgrows its
    /// block every 16 tokens (2 MiB), and the prefill's free blocks decide how many new
    /// segments that cuts. The Llama-shaped program reserved 16.98 GB.
    #[test]
    fn pythia_generation_reserves_what_torch_reserved_on_the_h100() {
        let a = arch("pythia-1b.json");
        let r = replay(&a, &bf16_generation(32, 1024, 128, 1_011_781_632)).expect("replayed");
        assert!(within(r.peak_allocated, 7_973_187_072, 0.003), "{r:?}");
        assert!(within(r.peak_reserved, 15_151_923_200, 0.01), "{r:?}");
    }

    /// Sizes past what is counted, or absurdly many layers, are not replayed (the estimate
    /// falls back to its 5 % allowance) rather than overflowing or running for hours.
    #[test]
    fn absurd_jobs_are_not_replayed() {
        let a = arch("gpt2.json");
        let mut job = gpt2_fp32(1);
        job.generated = u64::MAX / 2;
        assert_eq!(replay(&a, &job), None);
        job.generated = 64;
        job.batch = 0;
        assert_eq!(replay(&a, &job), None);
        let mut deep = a.clone();
        deep.layers = 100_000;
        assert_eq!(replay(&deep, &gpt2_fp32(1)), None);
    }

    #[test]
    fn replayed_steps_keep_the_ends_token_by_token() {
        assert_eq!(replayed_steps(3), vec![1, 2, 3]);
        let long = replayed_steps(4095);
        assert_eq!(long.len() as u64, 2 * EDGE_TOKENS + MIDDLE_TOKENS);
        assert_eq!(long.last(), Some(&4095));
        assert!(long.windows(2).all(|w| w[0] < w[1]));
    }

    /// estimate34 on the H200 (2026-12-05): GPT-2 fp32, 1024 + 64 tokens, 192 sequences
    /// ran out of a 24 GiB allocator limit, as did 211. The replay reserves more than 24 GiB
    /// there (allocated alone passes it: the prefill's gelu_new holds four fc-wide fp32
    /// tensors at once), and the cache's growth by torch.cat leaves the allocator some
    /// reserve beyond the tensors.
    #[test]
    fn gpt2_generation_at_estimate34s_answer_passes_24_gib() {
        let a = arch("gpt2.json");
        let r = replay(&a, &gpt2_fp32(192)).expect("replayed");
        assert!(r.peak_allocated > 24 << 30, "{r:?}");
        assert!(r.peak_reserved > r.peak_allocated, "{r:?}");
        let small = replay(&a, &gpt2_fp32(32)).expect("replayed");
        assert!(small.peak_reserved < r.peak_reserved);
    }
}
