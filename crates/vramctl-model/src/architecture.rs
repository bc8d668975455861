//! The one description of a model every reader produces and the memory model reads: its
//! shape (layers, widths, heads, vocabulary, experts) and what its blocks are made of
//! (norm, MLP kind, biases, dropout), from which the parameter inventory is counted.

use serde::Serialize;

/// The model families `config.json` is read for (`model_type`), and `--arch` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Family {
    Gpt2,
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma,
    Gemma2,
    Phi3,
    Bert,
    T5,
    Mixtral,
    Qwen2Moe,
    /// Pythia, GPT-NeoX-20B.
    GptNeox,
    Opt,
    Falcon,
    /// phi-1, phi-1.5, phi-2 (`model_type: phi`; Phi-3 is `phi3`).
    Phi,
    Starcoder2,
    Olmo,
    Olmo2,
    /// Gemma 3's text model (`gemma3_text`).
    Gemma3,
    DeepseekV2,
    DeepseekV3,
    /// Llama 4's text model (`llama4_text`).
    Llama4,
}

impl Family {
    /// Every family, in the order the docs and errors list them.
    pub const ALL: [Family; 23] = [
        Family::Gpt2,
        Family::Llama,
        Family::Mistral,
        Family::Qwen2,
        Family::Qwen3,
        Family::Gemma,
        Family::Gemma2,
        Family::Phi3,
        Family::Bert,
        Family::T5,
        Family::Mixtral,
        Family::Qwen2Moe,
        Family::GptNeox,
        Family::Opt,
        Family::Falcon,
        Family::Phi,
        Family::Starcoder2,
        Family::Olmo,
        Family::Olmo2,
        Family::Gemma3,
        Family::DeepseekV2,
        Family::DeepseekV3,
        Family::Llama4,
    ];

    /// The `model_type` of its `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gemma => "gemma",
            Family::Gemma2 => "gemma2",
            Family::Phi3 => "phi3",
            Family::Bert => "bert",
            Family::T5 => "t5",
            Family::Mixtral => "mixtral",
            Family::Qwen2Moe => "qwen2_moe",
            Family::GptNeox => "gpt_neox",
            Family::Opt => "opt",
            Family::Falcon => "falcon",
            Family::Phi => "phi",
            Family::Starcoder2 => "starcoder2",
            Family::Olmo => "olmo",
            Family::Olmo2 => "olmo2",
            Family::Gemma3 => "gemma3_text",
            Family::DeepseekV2 => "deepseek_v2",
            Family::DeepseekV3 => "deepseek_v3",
            Family::Llama4 => "llama4_text",
        }
    }

    /// The family of a `model_type` (or `--arch`) value, `None` when not supported.
    pub fn from_model_type(text: &str) -> Option<Family> {
        Family::ALL
            .into_iter()
            .find(|f| f.model_type().eq_ignore_ascii_case(text))
    }

    /// `gpt2, llama, ...` for error messages.
    pub fn supported_list() -> String {
        Family::ALL.map(Family::model_type).join(", ")
    }
}

/// Element types of weights, activations and caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    F8,
    I8,
    /// 4-bit weights (scales not included; the memory model adds them).
    I4,
}

impl Dtype {
    /// Bytes per element; 4-bit is half a byte.
    pub fn bytes(self) -> f64 {
        match self {
            Dtype::F32 => 4.0,
            Dtype::F16 | Dtype::Bf16 => 2.0,
            Dtype::F8 | Dtype::I8 => 1.0,
            Dtype::I4 => 0.5,
        }
    }

    /// `torch_dtype` / `dtype` of a `config.json` (`bfloat16`, `float16`, `float32`).
    pub fn from_torch_name(text: &str) -> Option<Dtype> {
        match text {
            "float32" | "fp32" => Some(Dtype::F32),
            "float16" | "fp16" | "half" => Some(Dtype::F16),
            "bfloat16" | "bf16" => Some(Dtype::Bf16),
            _ => None,
        }
    }
}

/// Normalisation layers: LayerNorm has a bias and saves its input in the compute dtype;
/// RMSNorm as transformers implements it (Llama, T5) upcasts its input to fp32 first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Norm {
    LayerNorm,
    RmsNorm,
}

/// A plain MLP (`fc2(act(fc1 x))`) or a gated one (`down(act(gate x) * up x)`, SwiGLU/GeGLU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mlp {
    Plain,
    Gated,
}

/// Mixture of experts: each MoE layer holds `experts` gated MLPs of `expert_intermediate`,
/// a token goes to `top_k` of them; Qwen-MoE, DeepSeek and Llama 4 add a shared expert to
/// every token (Qwen-MoE's behind a sigmoid gate of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Moe {
    pub experts: u64,
    pub top_k: u64,
    pub expert_intermediate: u64,
    pub shared_expert_intermediate: u64,
    /// Blocks with a dense MLP of the architecture's `intermediate` instead of experts
    /// (DeepSeek's `first_k_dense_replace`, Llama 4's layers between `moe_layers`).
    pub dense_layers: u64,
    /// The shared expert's output is scaled by a learned gate (`h × 1`, Qwen-MoE).
    pub shared_expert_gate: bool,
}

impl Moe {
    /// Experts-free, for bounds checks of dense models.
    pub const NONE: Moe = Moe {
        experts: 0,
        top_k: 0,
        expert_intermediate: 0,
        shared_expert_intermediate: 0,
        dense_layers: 0,
        shared_expert_gate: false,
    };
}

/// Multi-head latent attention (DeepSeek-V2/V3): keys and values come from a rank-
/// `kv_lora_rank` compression of the hidden state, queries (with `q_lora_rank` > 0) from a
/// rank-`q_lora_rank` one. Each head's key is `qk_nope_head_dim` from the decompression and
/// `qk_rope_head_dim` of rotary key shared by the heads; its value is `v_head_dim`.
/// transformers ≥ 5.15 caches the compressed latent and the shared rotary key, one "head"
/// each (`modeling_deepseek_v3.py`: `kv_nope, k_rot = cache.update(kv_nope, k_rot, ...)`,
/// "Cache read / write is performed while latent KV is still compressed"); up to 5.14 it
/// cached the decompressed per-head keys and values, (nope + rope + v) × heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mla {
    /// 0 where the config's `q_lora_rank` is null (a plain `q_proj`, DeepSeek-V2-Lite).
    pub q_lora_rank: u64,
    pub kv_lora_rank: u64,
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
}

/// The shape of a model, as read from its files or synthesised.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Architecture {
    pub family: Family,
    /// Transformer blocks (for T5 the encoder's; `decoder_layers` holds the decoder's).
    pub layers: u64,
    /// T5: decoder blocks (with cross-attention); 0 for decoder-only and encoder-only models.
    pub decoder_layers: u64,
    pub hidden: u64,
    /// The dense MLP width (for MoE models without dense layers, the expert width).
    pub intermediate: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub vocab: u64,
    pub tied_embeddings: bool,
    pub moe: Option<Moe>,
    /// Longest sequence the model was configured for; `None` where positions are relative.
    pub max_positions: Option<u64>,
    /// Learned absolute position embeddings (GPT-2, BERT), counted as parameters.
    pub learned_positions: bool,
    pub norm: Norm,
    /// Norm layers per block (Gemma 2 has four: pre and post attention and MLP).
    pub norms_per_layer: u64,
    /// The block's norms all read its input (a parallel residual with a LayerNorm each for
    /// attention and MLP: GPT-NeoX's `use_parallel_residual`, Falcon's new architecture
    /// with two), so autograd saves that input once, not once per norm.
    pub norms_share_input: bool,
    pub mlp: Mlp,
    /// The MLP's activation as the config names it (`gelu_new`, `silu`, `relu`, ...).
    pub activation: String,
    /// Biases on every linear layer (GPT-2, BERT).
    pub linear_bias: bool,
    /// Biases on q, k and v only (Qwen2, Qwen2-MoE).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of q and k (Qwen3).
    pub qk_norm: bool,
    /// Dropout on the residual branches in training (masks are saved, one byte each).
    pub hidden_dropout: bool,
    /// Dropout on attention probabilities in training.
    pub attention_dropout: bool,
    /// The dtype the checkpoint is stored in, where the config says.
    pub dtype: Option<Dtype>,
    /// Sliding-window attention (Mistral's `sliding_window`, Gemma 2's local layers);
    /// `None` when every layer attends to the whole context.
    pub sliding_window: Option<SlidingWindow>,
    /// Multi-head latent attention (DeepSeek); `None` for q/k/v projections per head.
    /// With it `heads` = `kv_heads` and `head_dim` is the query/key head width
    /// (`qk_nope_head_dim + qk_rope_head_dim`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mla: Option<Mla>,
    /// The dimensions of each head the rotary embedding turns, where fewer than `head_dim`
    /// (GPT-NeoX's `rotary_pct`, Phi's `partial_rotary_factor`): the rotary tables and the
    /// rotation's temporaries are that wide. `None` where every dimension turns or the
    /// positions are learned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotary_dims: Option<u64>,
}

/// Layers that attend only to the last `tokens` tokens, whose KV cache therefore stops
/// growing there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SlidingWindow {
    /// The window (`sliding_window` of the config), in tokens.
    pub tokens: u64,
    /// How many of the decoder's layers are windowed (all of Mistral's, every other one
    /// of Gemma 2's); the rest attend globally.
    pub layers: u64,
}

/// Parameters by what they are, for quantisation (only block linears are quantised) and
/// optimizer states (Adafactor factors matrices).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Inventory {
    /// Weights of the blocks' linear layers (attention, MLP, experts, router).
    pub linear_params: u64,
    /// Token (and position, token-type) embeddings.
    pub embedding_params: u64,
    /// An untied output projection (0 when tied to the embeddings).
    pub lm_head_params: u64,
    /// Norm weights, biases and other vectors.
    pub vector_params: u64,
    /// Adafactor's factored second moment: rows + columns of every matrix.
    pub factored_state_elements: u64,
}

impl Inventory {
    pub fn total(&self) -> u64 {
        self.linear_params + self.embedding_params + self.lm_head_params + self.vector_params
    }
}

impl Architecture {
    /// Width of all query heads together (differs from `hidden` in Gemma, T5 v1.1, Qwen3).
    pub fn q_dim(&self) -> u64 {
        self.heads * self.head_dim
    }

    /// [`Self::q_dim`] without overflow, for checking hostile shapes.
    pub fn q_dim_saturating(&self) -> u64 {
        self.heads.saturating_mul(self.head_dim)
    }

    /// Width of the keys (and, without MLA, of the values) of all KV heads together.
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads * self.head_dim
    }

    /// Width of the values of all KV heads together (MLA: heads × `v_head_dim`).
    pub fn v_dim(&self) -> u64 {
        match self.mla {
            Some(mla) => self.heads * mla.v_head_dim,
            None => self.kv_dim(),
        }
    }

    /// Elements one token adds to one layer's KV cache: its keys and values as
    /// transformers' cache layers store them (`[batch, kv heads, seq, head dim]` each).
    /// GQA/MQA store the KV heads only; partial rotary (Phi, GPT-NeoX) changes no width;
    /// MLA (transformers ≥ 5.15) stores the latent and the shared rotary key.
    pub fn kv_cache_width(&self) -> u64 {
        match self.mla {
            Some(mla) => mla.kv_lora_rank + mla.qk_rope_head_dim,
            None => 2 * self.kv_dim(),
        }
    }

    /// Parameters of the per-head or per-projection q/k norms of one attention.
    fn qk_norm_params(&self) -> u64 {
        if !self.qk_norm {
            return 0;
        }
        match self.family {
            // RMSNorm over all heads together (Olmo2Attention's q_norm, k_norm).
            Family::Olmo2 => self.q_dim() + self.kv_dim(),
            // Llama4TextL2Norm has no weight.
            Family::Llama4 => 0,
            // PhiAttention's q_layernorm and k_layernorm: LayerNorm(head_dim), with bias.
            Family::Phi => 4 * self.head_dim,
            // Per head, shared by the heads (Qwen3, Gemma 3).
            _ => 2 * self.head_dim,
        }
    }

    /// Every block of the model, decoder and encoder together.
    pub fn total_layers(&self) -> u64 {
        self.layers + self.decoder_layers
    }

    /// Blocks that hold a KV cache in generation (the decoder's).
    pub fn kv_cache_layers(&self) -> u64 {
        match self.family {
            Family::T5 => self.decoder_layers,
            _ => self.layers,
        }
    }

    /// The parameter count by kind, from the shapes (matches the checkpoints' own counts
    /// for the configs in the tests: GPT-2 124,439,808; Llama-3-8B 8,030,261,248).
    pub fn inventory(&self) -> Inventory {
        let mut inv = Inventory {
            linear_params: 0,
            embedding_params: 0,
            lm_head_params: 0,
            vector_params: 0,
            factored_state_elements: 0,
        };
        let h = self.hidden;
        let matrix = |inv: &mut Inventory, rows: u64, cols: u64, count: u64| {
            inv.linear_params += rows * cols * count;
            inv.factored_state_elements += (rows + cols) * count;
        };
        // Attention: q, k, v, o (T5 decoders have a second, cross-attention, set).
        let attention_sets = self.layers + 2 * self.decoder_layers;
        match self.mla {
            Some(mla) => {
                // DeepseekV3Attention: q_proj (or q_a_proj, q_a_layernorm, q_b_proj),
                // kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj.
                if mla.q_lora_rank == 0 {
                    matrix(&mut inv, h, self.q_dim(), attention_sets);
                } else {
                    matrix(&mut inv, h, mla.q_lora_rank, attention_sets);
                    matrix(&mut inv, mla.q_lora_rank, self.q_dim(), attention_sets);
                    inv.vector_params += mla.q_lora_rank * attention_sets;
                }
                let kv_a = mla.kv_lora_rank + mla.qk_rope_head_dim;
                matrix(&mut inv, h, kv_a, attention_sets);
                inv.vector_params += mla.kv_lora_rank * attention_sets;
                let kv_b = self.heads * (mla.qk_nope_head_dim + mla.v_head_dim);
                matrix(&mut inv, mla.kv_lora_rank, kv_b, attention_sets);
                matrix(&mut inv, self.v_dim(), h, attention_sets);
                if self.qkv_bias {
                    // attention_bias: q_a_proj, kv_a_proj_with_mqa and o_proj.
                    let q_a = if mla.q_lora_rank == 0 {
                        0
                    } else {
                        mla.q_lora_rank
                    };
                    inv.vector_params += (q_a + kv_a + h) * attention_sets;
                }
            }
            None => {
                matrix(&mut inv, h, self.q_dim(), attention_sets);
                matrix(&mut inv, h, self.kv_dim(), 2 * attention_sets);
                matrix(&mut inv, self.q_dim(), h, attention_sets);
                if self.linear_bias {
                    inv.vector_params += (self.q_dim() + 2 * self.kv_dim() + h) * attention_sets;
                } else if self.qkv_bias {
                    inv.vector_params += (self.q_dim() + 2 * self.kv_dim()) * attention_sets;
                }
            }
        }
        inv.vector_params += self.qk_norm_params() * attention_sets;
        // MLP per block.
        let blocks = self.total_layers();
        let dense_mlp = |inv: &mut Inventory, count_blocks: u64| {
            let count = match self.mlp {
                Mlp::Plain => 2,
                Mlp::Gated => 3,
            };
            matrix(inv, h, self.intermediate, count * count_blocks);
            if self.linear_bias {
                inv.vector_params += (self.intermediate + h) * count_blocks;
            }
        };
        match self.moe {
            Some(moe) => {
                let dense = moe.dense_layers.min(blocks);
                let moe_blocks = blocks - dense;
                dense_mlp(&mut inv, dense);
                matrix(
                    &mut inv,
                    h,
                    moe.expert_intermediate,
                    3 * moe.experts * moe_blocks,
                );
                matrix(&mut inv, h, moe.experts, moe_blocks); // router
                if moe.shared_expert_intermediate > 0 {
                    matrix(&mut inv, h, moe.shared_expert_intermediate, 3 * moe_blocks);
                    if moe.shared_expert_gate {
                        matrix(&mut inv, h, 1, moe_blocks);
                    }
                }
            }
            None => dense_mlp(&mut inv, blocks),
        }
        // Norms: per block, T5's decoder a third one for cross-attention, a final one per stack.
        let norm_vectors = match (self.norm, self.family) {
            // OlmoLayerNorm is F.layer_norm without weight or bias.
            (_, Family::Olmo) => 0,
            (Norm::LayerNorm, _) => 2,
            (Norm::RmsNorm, _) => 1,
        };
        let stacks = if self.decoder_layers > 0 { 2 } else { 1 };
        let norms = self.norms_per_layer * blocks + self.decoder_layers + stacks;
        inv.vector_params += norm_vectors * h * norms;
        // Embeddings.
        inv.embedding_params += self.vocab * h;
        inv.factored_state_elements += self.vocab + h;
        if self.learned_positions {
            inv.embedding_params += self.max_positions.unwrap_or(0) * h;
            if self.family == Family::Opt {
                // OPTLearnedPositionalEmbedding keeps 2 rows beyond the positions (offset 2).
                inv.embedding_params += 2 * h;
            }
        }
        match self.family {
            Family::Bert => {
                // Token types (2), the embeddings' LayerNorm (counted with the final-norm
                // slot above), and the MLM head: a dense h×h with bias, a LayerNorm, and
                // the output bias (the output matrix is tied to the embeddings).
                inv.embedding_params += 2 * h;
                matrix(&mut inv, h, h, 1);
                inv.vector_params += h + 2 * h + self.vocab;
            }
            Family::T5 => {
                // Relative position biases: 32 buckets per head, one table per stack.
                inv.vector_params += 32 * self.heads * stacks;
            }
            _ => {}
        }
        if !self.tied_embeddings {
            inv.lm_head_params += self.vocab * h;
            inv.factored_state_elements += self.vocab + h;
        }
        if self.family == Family::Phi {
            // PhiForCausalLM's lm_head has a bias.
            inv.vector_params += self.vocab;
        }
        inv
    }

    /// Total parameters.
    pub fn params(&self) -> u64 {
        self.inventory().total()
    }
}

/// Defaults of a family where nothing else says: the published shape conventions
/// (Llama: head dim 128, SwiGLU width ≈ 8/3·h rounded to 256; GPT-2/BERT: MLP 4h, head dim 64).
struct Conventions {
    head_dim: u64,
    vocab: u64,
    mlp: Mlp,
    norm: Norm,
    activation: &'static str,
    tied: bool,
    learned_positions: bool,
    linear_bias: bool,
    max_positions: Option<u64>,
}

fn conventions(family: Family) -> Conventions {
    let decoder = |vocab, tied| Conventions {
        head_dim: 128,
        vocab,
        mlp: Mlp::Gated,
        norm: Norm::RmsNorm,
        activation: "silu",
        tied,
        learned_positions: false,
        linear_bias: false,
        max_positions: Some(4096),
    };
    match family {
        Family::Gpt2 => Conventions {
            head_dim: 64,
            vocab: 50_257,
            mlp: Mlp::Plain,
            norm: Norm::LayerNorm,
            activation: "gelu_new",
            tied: true,
            learned_positions: true,
            linear_bias: true,
            max_positions: Some(1024),
        },
        Family::Bert => Conventions {
            head_dim: 64,
            vocab: 30_522,
            mlp: Mlp::Plain,
            norm: Norm::LayerNorm,
            activation: "gelu",
            tied: true,
            learned_positions: true,
            linear_bias: true,
            max_positions: Some(512),
        },
        Family::T5 => Conventions {
            head_dim: 64,
            vocab: 32_128,
            mlp: Mlp::Plain,
            norm: Norm::RmsNorm,
            activation: "relu",
            tied: true,
            learned_positions: false,
            linear_bias: false,
            max_positions: None,
        },
        Family::Llama | Family::Mistral | Family::Mixtral => decoder(32_000, false),
        Family::Qwen2 | Family::Qwen3 | Family::Qwen2Moe => decoder(151_936, false),
        Family::Gemma | Family::Gemma2 => Conventions {
            head_dim: 256,
            activation: "gelu_pytorch_tanh",
            ..decoder(256_000, true)
        },
        Family::Phi3 => decoder(32_064, false),
        Family::Olmo => decoder(50_304, true),
        Family::Olmo2 => decoder(100_352, false),
        Family::DeepseekV2 => decoder(102_400, false),
        Family::DeepseekV3 => decoder(129_280, false),
        Family::Llama4 => decoder(202_048, false),
        Family::Gemma3 => Conventions {
            head_dim: 256,
            activation: "gelu_pytorch_tanh",
            ..decoder(262_144, true)
        },
        // The plain-MLP, LayerNorm decoders with biases.
        Family::GptNeox | Family::Opt | Family::Falcon | Family::Phi | Family::Starcoder2 => {
            let (head_dim, vocab, activation, tied, bias, max_positions) = match family {
                Family::GptNeox => (128, 50_304, "gelu", false, true, 2048),
                Family::Opt => (64, 50_272, "relu", true, true, 2048),
                Family::Falcon => (64, 65_024, "gelu", true, false, 2048),
                Family::Phi => (80, 51_200, "gelu_new", false, true, 2048),
                _ => (128, 49_152, "gelu_pytorch_tanh", true, true, 16_384),
            };
            Conventions {
                head_dim,
                vocab,
                mlp: Mlp::Plain,
                norm: Norm::LayerNorm,
                activation,
                tied,
                learned_positions: family == Family::Opt,
                linear_bias: bias,
                max_positions: Some(max_positions),
            }
        }
    }
}

/// An architecture of `family` with about `params` parameters (`--params 7B --arch
/// llama`): blocks with `hidden = 128 · layers` (the aspect of Llama-2-7B/13B, 4096/32 and
/// 5120/40), the family's MLP width convention (4h plain, 8/3·h gated, rounded to 256),
/// MHA, the family's vocabulary; `layers` is the smallest whose count reaches `params`.
/// The memory model then takes the weights as exactly `params`; the shape only sizes
/// activations, logits and the KV cache, and is approximate (the docs say so).
pub fn synthesize(params: u64, family: Family) -> Architecture {
    let conv = conventions(family);
    let build = |layers: u64| {
        let hidden = 128 * layers;
        let intermediate = match conv.mlp {
            Mlp::Plain => 4 * hidden,
            Mlp::Gated => (8 * hidden / 3).div_ceil(256) * 256,
        };
        let head_dim = conv.head_dim.min(hidden);
        let heads = (hidden / head_dim).max(1);
        let is_t5 = family == Family::T5;
        Architecture {
            family,
            layers,
            decoder_layers: if is_t5 { layers } else { 0 },
            hidden,
            intermediate,
            heads,
            kv_heads: heads,
            head_dim,
            vocab: conv.vocab,
            tied_embeddings: conv.tied,
            moe: None,
            max_positions: conv.max_positions,
            learned_positions: conv.learned_positions,
            norm: conv.norm,
            norms_per_layer: match family {
                Family::Gemma2 | Family::Gemma3 => 4,
                Family::Phi | Family::Falcon => 1,
                _ => 2,
            },
            // Pythia's (GPT-NeoX's default) parallel residual.
            norms_share_input: family == Family::GptNeox,
            mlp: conv.mlp,
            activation: conv.activation.to_owned(),
            linear_bias: conv.linear_bias,
            qkv_bias: false,
            qk_norm: false,
            hidden_dropout: matches!(family, Family::Gpt2 | Family::Bert | Family::T5),
            attention_dropout: matches!(family, Family::Gpt2 | Family::Bert),
            dtype: None,
            sliding_window: None,
            mla: None,
            // GPT-NeoX's and Phi's config defaults (rotary_pct 0.25, partial_rotary_factor 0.5).
            rotary_dims: match family {
                Family::GptNeox => Some(head_dim / 4),
                Family::Phi => Some(head_dim / 2),
                _ => None,
            },
        }
    };
    // 1,024 blocks of 131,072 wide is far above any model; the loop ends well before.
    let mut layers = 1;
    while layers < 1024 && build(layers).params() < params {
        layers += 1;
    }
    build(layers)
}

/// Parses a parameter count as people write it: `7B`, `1.5b`, `350M`, `124439808`.
///
/// # Errors
/// A message naming the text and the forms accepted.
pub fn parse_param_count(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let (number, scale) = match trimmed.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let scale = match c.to_ascii_lowercase() {
                'k' => 1e3,
                'm' => 1e6,
                'b' | 'g' => 1e9,
                't' => 1e12,
                _ => return Err(format!("unknown suffix in '{text}'; use K, M, B or T")),
            };
            (&trimmed[..i], scale)
        }
        _ => (trimmed, 1.0),
    };
    let value: f64 = number.trim().parse().map_err(|_| {
        format!("'{text}' is not a parameter count; write it like 7B, 350M or 124439808")
    })?;
    let count = value * scale;
    if !(count.is_finite() && (1.0..1e15).contains(&count)) {
        return Err(format!(
            "'{text}' is out of range; a parameter count is between 1 and 1000T"
        ));
    }
    // In range above, so the cast neither truncates nor wraps.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(count.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_parse_as_people_write_them() {
        assert_eq!(parse_param_count("7B"), Ok(7_000_000_000));
        assert_eq!(parse_param_count("1.5b"), Ok(1_500_000_000));
        assert_eq!(parse_param_count("350M"), Ok(350_000_000));
        assert_eq!(parse_param_count("124439808"), Ok(124_439_808));
        assert!(parse_param_count("7X").is_err());
        assert!(parse_param_count("-3B").is_err());
        assert!(parse_param_count("abc").is_err());
        assert!(parse_param_count("1e30").is_err());
    }

    #[test]
    fn synthesis_reaches_the_count_asked_with_the_family_shape() {
        let arch = synthesize(7_000_000_000, Family::Llama);
        assert!(arch.params() >= 7_000_000_000);
        assert!(arch.params() < 7_800_000_000, "{}", arch.params());
        assert_eq!(arch.hidden, 128 * arch.layers);
        assert_eq!(arch.head_dim, 128);
        assert_eq!(arch.mlp, Mlp::Gated);
        let gpt = synthesize(124_000_000, Family::Gpt2);
        assert_eq!(gpt.mlp, Mlp::Plain);
        assert_eq!(gpt.intermediate, 4 * gpt.hidden);
    }

    #[test]
    fn every_family_round_trips_through_its_model_type() {
        for family in Family::ALL {
            assert_eq!(Family::from_model_type(family.model_type()), Some(family));
        }
        assert_eq!(Family::from_model_type("mamba"), None);
    }
}
