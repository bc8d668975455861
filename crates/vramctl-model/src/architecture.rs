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
}

impl Family {
    /// Every family, in the order the docs and errors list them.
    pub const ALL: [Family; 12] = [
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
/// a token goes to `top_k` of them; Qwen-MoE adds a shared expert to every token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Moe {
    pub experts: u64,
    pub top_k: u64,
    pub expert_intermediate: u64,
    pub shared_expert_intermediate: u64,
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

    /// Width of the keys (and of the values) of all KV heads together.
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads * self.head_dim
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
        matrix(&mut inv, h, self.q_dim(), attention_sets);
        matrix(&mut inv, h, self.kv_dim(), 2 * attention_sets);
        matrix(&mut inv, self.q_dim(), h, attention_sets);
        if self.linear_bias {
            inv.vector_params += (self.q_dim() + 2 * self.kv_dim() + h) * attention_sets;
        } else if self.qkv_bias {
            inv.vector_params += (self.q_dim() + 2 * self.kv_dim()) * attention_sets;
        }
        if self.qk_norm {
            inv.vector_params += 2 * self.head_dim * attention_sets;
        }
        // MLP per block.
        let blocks = self.total_layers();
        match self.moe {
            Some(moe) => {
                matrix(
                    &mut inv,
                    h,
                    moe.expert_intermediate,
                    3 * moe.experts * blocks,
                );
                matrix(&mut inv, h, moe.experts, blocks); // router
                if moe.shared_expert_intermediate > 0 {
                    matrix(&mut inv, h, moe.shared_expert_intermediate, 3 * blocks);
                    matrix(&mut inv, h, 1, blocks); // the shared expert's gate
                }
            }
            None => {
                let count = match self.mlp {
                    Mlp::Plain => 2,
                    Mlp::Gated => 3,
                };
                matrix(&mut inv, h, self.intermediate, count * blocks);
                if self.linear_bias {
                    inv.vector_params += (self.intermediate + h) * blocks;
                }
            }
        }
        // Norms: per block, T5's decoder a third one for cross-attention, a final one per stack.
        let norm_vectors = match self.norm {
            Norm::LayerNorm => 2,
            Norm::RmsNorm => 1,
        };
        let stacks = if self.decoder_layers > 0 { 2 } else { 1 };
        let norms = self.norms_per_layer * blocks + self.decoder_layers + stacks;
        inv.vector_params += norm_vectors * h * norms;
        // Embeddings.
        inv.embedding_params += self.vocab * h;
        inv.factored_state_elements += self.vocab + h;
        if self.learned_positions {
            inv.embedding_params += self.max_positions.unwrap_or(0) * h;
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
            norms_per_layer: if family == Family::Gemma2 { 4 } else { 2 },
            mlp: conv.mlp,
            activation: conv.activation.to_owned(),
            linear_bias: conv.linear_bias,
            qkv_bias: false,
            qk_norm: false,
            hidden_dropout: matches!(family, Family::Gpt2 | Family::Bert | Family::T5),
            attention_dropout: matches!(family, Family::Gpt2 | Family::Bert),
            dtype: None,
            sliding_window: None,
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
        assert_eq!(Family::from_model_type("falcon"), None);
    }
}
