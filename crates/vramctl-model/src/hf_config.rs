//! A Hugging Face `config.json` into an [`Architecture`]: each supported `model_type`
//! with its own field names (GPT-2's `n_embd`, T5's `d_model`, ...) and the defaults
//! transformers' config classes apply when a field is absent.

use serde_json::{Map, Value};

use crate::architecture::{Architecture, Dtype, Family, Mla, Mlp, Moe, Norm, SlidingWindow};

/// A config larger than this is not a config (real ones are a few KiB; some carry
/// quantisation tables of a few hundred KiB).
pub const MAX_CONFIG_BYTES: usize = 16 * 1024 * 1024;

/// Why a config could not be read as a model.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("not valid JSON: {0}")]
    Json(String),
    #[error("no 'model_type' field; is this a transformers config.json?")]
    NoModelType,
    #[error(
        "model_type '{0}' is not supported (supported: {list}); give --params N --arch A instead",
        list = Family::supported_list()
    )]
    UnsupportedModelType(String),
    #[error(
        "model_type '{0}' is a vision-language config; its text model is model_type '{1}' \
         (save its text_config as a config.json of its own), or give --params N --arch A"
    )]
    VisionLanguage(String, &'static str),
    #[error("field '{field}': {why}, which is not modelled; give --params N --arch A instead")]
    NotModelled {
        field: &'static str,
        why: &'static str,
    },
    #[error("field '{0}' is missing or not a positive whole number")]
    Field(&'static str),
    #[error("field '{field}' is {value}, which does not fit the model ({why})")]
    Inconsistent {
        field: &'static str,
        value: u64,
        why: &'static str,
    },
}

/// Parses the text of a `config.json`.
///
/// # Errors
/// Bad JSON, no or an unsupported `model_type`, a missing or inconsistent field.
pub fn parse_config(text: &str) -> Result<Architecture, ConfigError> {
    let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
    let config = value
        .as_object()
        .ok_or_else(|| ConfigError::Json("the top level is not an object".to_owned()))?;
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or(ConfigError::NoModelType)?;
    match model_type {
        "gemma3" => {
            return Err(ConfigError::VisionLanguage(
                model_type.to_owned(),
                "gemma3_text",
            ));
        }
        "llama4" => {
            return Err(ConfigError::VisionLanguage(
                model_type.to_owned(),
                "llama4_text",
            ));
        }
        _ => {}
    }
    let family = Family::from_model_type(model_type)
        .ok_or_else(|| ConfigError::UnsupportedModelType(model_type.to_owned()))?;
    let c = Fields(config);
    let dtype = c
        .text("torch_dtype")
        .or_else(|| c.text("dtype"))
        .and_then(Dtype::from_torch_name);
    let arch = match family {
        Family::Gpt2 => {
            let hidden = c.int("n_embd")?;
            let heads = c.int("n_head")?;
            Architecture {
                family,
                layers: c.int("n_layer")?,
                decoder_layers: 0,
                hidden,
                intermediate: c.opt_int("n_inner").unwrap_or(4 * hidden),
                heads,
                kv_heads: heads,
                head_dim: per_head(hidden, heads)?,
                vocab: c.int("vocab_size")?,
                tied_embeddings: c.flag("tie_word_embeddings").unwrap_or(true),
                moe: None,
                max_positions: Some(c.int("n_positions")?),
                learned_positions: true,
                norm: Norm::LayerNorm,
                norms_per_layer: 2,
                norms_share_input: false,
                mlp: Mlp::Plain,
                activation: c
                    .text("activation_function")
                    .unwrap_or("gelu_new")
                    .to_owned(),
                linear_bias: true,
                qkv_bias: false,
                qk_norm: false,
                hidden_dropout: c.positive("resid_pdrop", 0.1),
                attention_dropout: c.positive("attn_pdrop", 0.1),
                dtype,
                sliding_window: None,
                mla: None,
                rotary_dims: None,
            }
        }
        Family::Bert => {
            let hidden = c.int("hidden_size")?;
            let heads = c.int("num_attention_heads")?;
            Architecture {
                family,
                layers: c.int("num_hidden_layers")?,
                decoder_layers: 0,
                hidden,
                intermediate: c.int("intermediate_size")?,
                heads,
                kv_heads: heads,
                head_dim: per_head(hidden, heads)?,
                vocab: c.int("vocab_size")?,
                tied_embeddings: true,
                moe: None,
                max_positions: Some(c.opt_int("max_position_embeddings").unwrap_or(512)),
                learned_positions: true,
                norm: Norm::LayerNorm,
                norms_per_layer: 2,
                norms_share_input: false,
                mlp: Mlp::Plain,
                activation: c.text("hidden_act").unwrap_or("gelu").to_owned(),
                linear_bias: true,
                qkv_bias: false,
                qk_norm: false,
                hidden_dropout: c.positive("hidden_dropout_prob", 0.1),
                attention_dropout: c.positive("attention_probs_dropout_prob", 0.1),
                dtype,
                sliding_window: None,
                mla: None,
                rotary_dims: None,
            }
        }
        Family::T5 => {
            let layers = c.int("num_layers")?;
            let projection = c.text("feed_forward_proj").unwrap_or("relu");
            let gated = projection.starts_with("gated-");
            Architecture {
                family,
                layers,
                decoder_layers: c.opt_int("num_decoder_layers").unwrap_or(layers),
                hidden: c.int("d_model")?,
                intermediate: c.int("d_ff")?,
                heads: c.int("num_heads")?,
                kv_heads: c.int("num_heads")?,
                head_dim: c.int("d_kv")?,
                vocab: c.int("vocab_size")?,
                tied_embeddings: c.flag("tie_word_embeddings").unwrap_or(true),
                moe: None,
                max_positions: None,
                learned_positions: false,
                norm: Norm::RmsNorm,
                norms_per_layer: 2,
                norms_share_input: false,
                mlp: if gated { Mlp::Gated } else { Mlp::Plain },
                activation: projection.trim_start_matches("gated-").to_owned(),
                linear_bias: false,
                qkv_bias: false,
                qk_norm: false,
                hidden_dropout: c.positive("dropout_rate", 0.1),
                attention_dropout: c.positive("dropout_rate", 0.1),
                dtype,
                sliding_window: None,
                mla: None,
                rotary_dims: None,
            }
        }
        Family::GptNeox | Family::Opt | Family::Falcon | Family::Phi | Family::Starcoder2 => {
            plain_decoder(family, &c, dtype)?
        }
        Family::DeepseekV2 | Family::DeepseekV3 => deepseek(family, &c, dtype)?,
        _ => decoder(family, &c, dtype)?,
    };
    check(&arch)?;
    Ok(arch)
}

/// The Llama-like decoders: one set of field names (`hidden_size`, `num_key_value_heads`,
/// ...), differing in defaults, biases, norms and experts.
fn decoder(
    family: Family,
    c: &Fields<'_>,
    dtype: Option<Dtype>,
) -> Result<Architecture, ConfigError> {
    let hidden = c.int("hidden_size")?;
    let heads = c.int("num_attention_heads")?;
    let kv_heads = c.opt_int("num_key_value_heads").unwrap_or(heads);
    let head_dim = match c.opt_int("head_dim") {
        Some(d) => d,
        None => per_head(hidden, heads)?,
    };
    // transformers' defaults for tie_word_embeddings: Gemma ties, the others do not
    // unless their config says so (Qwen2-0.5B does).
    let tied_default = matches!(family, Family::Gemma | Family::Gemma2 | Family::Gemma3);
    let layers = c.int("num_hidden_layers")?;
    let moe = match family {
        Family::Mixtral => Some(Moe {
            experts: c.int("num_local_experts")?,
            top_k: c.int("num_experts_per_tok")?,
            expert_intermediate: c.int("intermediate_size")?,
            shared_expert_intermediate: 0,
            dense_layers: 0,
            shared_expert_gate: false,
        }),
        Family::Qwen2Moe => Some(Moe {
            experts: c.int("num_experts")?,
            top_k: c.int("num_experts_per_tok")?,
            expert_intermediate: c.int("moe_intermediate_size")?,
            shared_expert_intermediate: c.opt_int("shared_expert_intermediate_size").unwrap_or(0),
            dense_layers: 0,
            shared_expert_gate: true,
        }),
        // Llama4TextMoe: experts and a shared expert of intermediate_size, a router
        // without bias; the layers not in moe_layers have a dense Llama4TextMLP of
        // intermediate_size_mlp (configuration_llama4.py, modeling_llama4.py).
        Family::Llama4 => {
            let width = c.opt_int("intermediate_size").unwrap_or(8192);
            Some(Moe {
                experts: c.opt_int("num_local_experts").unwrap_or(16),
                top_k: c.opt_int("num_experts_per_tok").unwrap_or(1),
                expert_intermediate: width,
                shared_expert_intermediate: width,
                dense_layers: layers.saturating_sub(llama4_moe_layers(c, layers)?),
                shared_expert_gate: false,
            })
        }
        _ => None,
    };
    let intermediate = match (family, moe) {
        (Family::Llama4, Some(m)) if m.dense_layers > 0 => {
            c.opt_int("intermediate_size_mlp").unwrap_or(16_384)
        }
        (Family::Llama4, Some(m)) => m.expert_intermediate,
        _ => c.int("intermediate_size")?,
    };
    let default_act = match family {
        Family::Gemma | Family::Gemma2 | Family::Gemma3 => "gelu_pytorch_tanh",
        _ => "silu",
    };
    Ok(Architecture {
        family,
        layers,
        decoder_layers: 0,
        hidden,
        intermediate,
        heads,
        kv_heads,
        head_dim,
        vocab: c.int("vocab_size")?,
        tied_embeddings: c.flag("tie_word_embeddings").unwrap_or(tied_default),
        moe,
        max_positions: c.opt_int("max_position_embeddings"),
        learned_positions: false,
        // OLMo's LayerNorm has no parameters (counted as such in the inventory).
        norm: if family == Family::Olmo {
            Norm::LayerNorm
        } else {
            Norm::RmsNorm
        },
        norms_per_layer: if matches!(family, Family::Gemma2 | Family::Gemma3) {
            4
        } else {
            2
        },
        norms_share_input: false,
        mlp: Mlp::Gated,
        activation: c
            .text("hidden_act")
            .or_else(|| c.text("hidden_activation"))
            .unwrap_or(default_act)
            .to_owned(),
        linear_bias: false,
        qkv_bias: matches!(family, Family::Qwen2 | Family::Qwen2Moe)
            || c.flag("attention_bias").unwrap_or(false),
        qk_norm: match family {
            Family::Qwen3 | Family::Gemma3 | Family::Olmo2 => true,
            Family::Llama4 => c.flag("use_qk_norm").unwrap_or(true),
            _ => false,
        },
        // Decoders train without dropout by default (attention_dropout 0.0).
        hidden_dropout: false,
        attention_dropout: c.positive("attention_dropout", 0.0),
        dtype,
        sliding_window: sliding_window(family, c, layers)?,
        mla: None,
        rotary_dims: None,
    })
}

/// How many of Llama 4's layers hold experts: `moe_layers` as written, else
/// Llama4TextConfig's `range(step - 1, layers, step)` with `interleave_moe_layer_step`.
fn llama4_moe_layers(c: &Fields<'_>, layers: u64) -> Result<u64, ConfigError> {
    if let Some(list) = c.0.get("moe_layers").and_then(Value::as_array) {
        let inside = list
            .iter()
            .filter(|v| v.as_u64().is_some_and(|i| i < layers))
            .count();
        return Ok(u64::try_from(inside).unwrap_or(u64::MAX));
    }
    let step = c.opt_int("interleave_moe_layer_step").unwrap_or(1);
    if step > layers {
        return Err(ConfigError::Inconsistent {
            field: "interleave_moe_layer_step",
            value: step,
            why: "it is larger than the number of layers",
        });
    }
    Ok((layers - step + 1).div_ceil(step))
}

/// The plain-MLP, LayerNorm decoders with their own field names: GPT-NeoX (Pythia), OPT,
/// Falcon, Phi (phi-1/1.5/2) and StarCoder2, with the defaults of their config classes.
fn plain_decoder(
    family: Family,
    c: &Fields<'_>,
    dtype: Option<Dtype>,
) -> Result<Architecture, ConfigError> {
    let hidden = c.int("hidden_size")?;
    let heads = c
        .opt_int("num_attention_heads")
        .or_else(|| c.opt_int("n_head"))
        .ok_or(ConfigError::Field("num_attention_heads"))?;
    let layers = c
        .opt_int("num_hidden_layers")
        .or_else(|| c.opt_int("n_layer"))
        .ok_or(ConfigError::Field("num_hidden_layers"))?;
    let head_dim = per_head(hidden, heads)?;
    let mut arch = Architecture {
        family,
        layers,
        decoder_layers: 0,
        hidden,
        intermediate: 0,
        heads,
        kv_heads: heads,
        head_dim,
        vocab: c.int("vocab_size")?,
        tied_embeddings: false,
        moe: None,
        max_positions: Some(c.opt_int("max_position_embeddings").unwrap_or(2048)),
        learned_positions: false,
        norm: Norm::LayerNorm,
        norms_per_layer: 2,
        norms_share_input: false,
        mlp: Mlp::Plain,
        activation: String::new(),
        linear_bias: true,
        qkv_bias: false,
        qk_norm: false,
        hidden_dropout: false,
        attention_dropout: c.positive("attention_dropout", 0.0),
        dtype,
        sliding_window: None,
        mla: None,
        rotary_dims: None,
    };
    let act = |key: &str, default: &str| c.text(key).unwrap_or(default).to_owned();
    match family {
        // GPTNeoXConfig: fused query_key_value and dense with bias (attention_bias), the
        // MLP with bias, two LayerNorms per layer (parallel residual or not), an untied
        // embed_out. rotary_pct rotates part of each head; the cache keeps whole heads.
        Family::GptNeox => {
            if c.flag("attention_bias") == Some(false) {
                return Err(ConfigError::NotModelled {
                    field: "attention_bias",
                    why: "GPT-NeoX without attention biases",
                });
            }
            arch.intermediate = c.int("intermediate_size")?;
            arch.tied_embeddings = c.flag("tie_word_embeddings").unwrap_or(false);
            arch.activation = act("hidden_act", "gelu");
            arch.hidden_dropout = c.positive("hidden_dropout", 0.0);
            // attention(ln1(x)) + mlp(ln2(x)) + x: both norms read x.
            arch.norms_share_input = c.flag("use_parallel_residual").unwrap_or(true);
            // GPTNeoXConfig's default rotary_pct (transformers 5 may write it as
            // partial_rotary_factor).
            let pct = c
                .fraction("partial_rotary_factor")
                .or_else(|| c.fraction("rotary_pct"));
            arch.rotary_dims = partial_rotary(arch.head_dim, pct.unwrap_or(0.25));
        }
        // OPTConfig: q, k, v, out_proj, fc1, fc2 with bias (enable_bias), learned
        // positions with 2 extra rows, embeddings tied to lm_head.
        Family::Opt => {
            if c.opt_int("word_embed_proj_dim")
                .is_some_and(|w| w != hidden)
            {
                return Err(ConfigError::NotModelled {
                    field: "word_embed_proj_dim",
                    why: "OPT's projected embeddings (opt-350m) differ from hidden_size",
                });
            }
            if c.flag("do_layer_norm_before") == Some(false)
                || c.flag("_remove_final_layer_norm") == Some(true)
                || c.flag("layer_norm_elementwise_affine") == Some(false)
            {
                return Err(ConfigError::NotModelled {
                    field: "do_layer_norm_before",
                    why: "OPT without its final or affine LayerNorm",
                });
            }
            arch.intermediate = c.int("ffn_dim")?;
            arch.tied_embeddings = c.flag("tie_word_embeddings").unwrap_or(true);
            arch.learned_positions = true;
            arch.activation = act("activation_function", "relu");
            arch.linear_bias = c.flag("enable_bias").unwrap_or(true);
            arch.hidden_dropout = c.positive("dropout", 0.1);
        }
        // FalconConfig / FalconAttention: num_kv_heads is config.num_kv_heads with the new
        // decoder architecture or without multi_query, else 1 (one shared K and V head:
        // query_key_value is h → h + 2 × head_dim); layer norms: ln_attn and ln_mlp with
        // the new architecture (num_ln_in_parallel_attn 2, its default), else
        // input_layernorm, and post_attention_layernorm unless parallel_attn.
        Family::Falcon => {
            let new_arch = c.flag("new_decoder_architecture").unwrap_or(false);
            let multi_query = c.flag("multi_query").unwrap_or(true);
            let parallel = c.flag("parallel_attn").unwrap_or(true);
            let config_kv = c
                .opt_int("num_kv_heads")
                .or_else(|| c.opt_int("n_head_kv"))
                .unwrap_or(heads);
            arch.kv_heads = match (new_arch, multi_query) {
                (true, _) => config_kv,
                (false, true) => 1,
                (false, false) => heads,
            };
            arch.norms_per_layer =
                if new_arch && c.opt_int("num_ln_in_parallel_attn").unwrap_or(2) == 2 {
                    2
                } else if parallel {
                    1
                } else {
                    2
                };
            // ln_attn and ln_mlp both read the block's input.
            arch.norms_share_input = new_arch && arch.norms_per_layer == 2;
            arch.intermediate = c.opt_int("ffn_hidden_size").unwrap_or(4 * hidden);
            arch.tied_embeddings = c.flag("tie_word_embeddings").unwrap_or(true);
            arch.activation = act("activation", "gelu");
            arch.linear_bias = c.flag("bias").unwrap_or(false);
            arch.hidden_dropout = c.positive("hidden_dropout", 0.0);
        }
        // PhiConfig: q, k, v, dense, fc1, fc2 with bias; one LayerNorm per layer (attention
        // and MLP in parallel); lm_head with bias; partial_rotary_factor rotates part of
        // each head (the cache keeps whole heads); qk_layernorm optional.
        Family::Phi => {
            arch.kv_heads = c.opt_int("num_key_value_heads").unwrap_or(heads);
            arch.intermediate = c.int("intermediate_size")?;
            arch.tied_embeddings = c.flag("tie_word_embeddings").unwrap_or(false);
            arch.norms_per_layer = 1;
            arch.activation = act("hidden_act", "gelu_new");
            arch.qk_norm = c.flag("qk_layernorm").unwrap_or(false);
            arch.hidden_dropout = c.positive("resid_pdrop", 0.0);
            // PhiConfig's default partial_rotary_factor.
            let pct = c.fraction("partial_rotary_factor").unwrap_or(0.5);
            arch.rotary_dims = partial_rotary(arch.head_dim, pct);
        }
        // Starcoder2Config: GQA, biases everywhere (use_bias), LayerNorms, c_fc/c_proj,
        // tied embeddings, a sliding window on every layer when set.
        _ => {
            arch.kv_heads = c.opt_int("num_key_value_heads").unwrap_or(2);
            arch.intermediate = c.int("intermediate_size")?;
            arch.tied_embeddings = c.flag("tie_word_embeddings").unwrap_or(true);
            arch.max_positions = Some(c.opt_int("max_position_embeddings").unwrap_or(4096));
            arch.activation = act("hidden_act", "gelu_pytorch_tanh");
            arch.linear_bias = c.flag("use_bias").unwrap_or(true);
            arch.hidden_dropout = c.positive("residual_dropout", 0.0);
            arch.sliding_window = sliding_window(family, c, layers)?;
        }
    }
    Ok(arch)
}

/// DeepSeek-V2/V3 (`modeling_deepseek_v3.py`, `modular_deepseek_v2.py`): MLA attention, the
/// first `first_k_dense_replace` layers with a dense SwiGLU of `intermediate_size`, the
/// others with `n_routed_experts` experts of `moe_intermediate_size` and shared experts of
/// `moe_intermediate_size × n_shared_experts` (no gate); the router is a bias-free
/// h × experts weight (V3's `e_score_correction_bias` is a buffer, not a parameter).
/// Defaults are each config class's (V2: DeepSeek-V2-Lite's, V3: DeepSeek-V3's).
fn deepseek(
    family: Family,
    c: &Fields<'_>,
    dtype: Option<Dtype>,
) -> Result<Architecture, ConfigError> {
    let v3 = family == Family::DeepseekV3;
    let hidden = c.int("hidden_size")?;
    let heads = c.int("num_attention_heads")?;
    let layers = c.int("num_hidden_layers")?;
    let q_lora_rank = match c.0.get("q_lora_rank") {
        None => 1536,
        Some(Value::Null) => 0,
        Some(_) => c.int("q_lora_rank")?,
    };
    let mla = Mla {
        q_lora_rank,
        kv_lora_rank: c.opt_int("kv_lora_rank").unwrap_or(512),
        qk_nope_head_dim: c.opt_int("qk_nope_head_dim").unwrap_or(128),
        qk_rope_head_dim: c.opt_int("qk_rope_head_dim").unwrap_or(64),
        v_head_dim: c.opt_int("v_head_dim").unwrap_or(128),
    };
    let moe = match c.0.get("n_routed_experts") {
        Some(Value::Null) => None,
        _ => {
            let expert = c
                .opt_int("moe_intermediate_size")
                .unwrap_or(if v3 { 2048 } else { 1407 });
            let shared = match c.0.get("n_shared_experts") {
                Some(Value::Null) => 0,
                _ => c
                    .opt_int("n_shared_experts")
                    .unwrap_or(if v3 { 1 } else { 2 }),
            };
            let dense = match c.0.get("first_k_dense_replace").and_then(Value::as_u64) {
                Some(k) => k,
                None if v3 => 3,
                None => 0,
            };
            Some(Moe {
                experts: c
                    .opt_int("n_routed_experts")
                    .unwrap_or(if v3 { 256 } else { 64 }),
                top_k: match c.opt_int("num_experts_per_tok") {
                    Some(k) => k,
                    None if v3 => 8,
                    None => return Err(ConfigError::Field("num_experts_per_tok")),
                },
                expert_intermediate: expert,
                shared_expert_intermediate: expert.saturating_mul(shared),
                dense_layers: dense.min(layers),
                shared_expert_gate: false,
            })
        }
    };
    let head_dim = mla.qk_nope_head_dim.saturating_add(mla.qk_rope_head_dim);
    Ok(Architecture {
        family,
        layers,
        decoder_layers: 0,
        hidden,
        intermediate: c.int("intermediate_size")?,
        heads,
        kv_heads: heads,
        head_dim,
        vocab: c.int("vocab_size")?,
        tied_embeddings: c.flag("tie_word_embeddings").unwrap_or(false),
        moe,
        max_positions: c.opt_int("max_position_embeddings"),
        learned_positions: false,
        norm: Norm::RmsNorm,
        norms_per_layer: 2,
        norms_share_input: false,
        mlp: Mlp::Gated,
        activation: c.text("hidden_act").unwrap_or("silu").to_owned(),
        linear_bias: false,
        qkv_bias: c.flag("attention_bias").unwrap_or(false),
        qk_norm: false,
        hidden_dropout: false,
        attention_dropout: c.positive("attention_dropout", 0.0),
        dtype,
        sliding_window: None,
        // Only the decoupled rotary part of q and k turns (MLA's `qk_rope_head_dim`).
        rotary_dims: Some(mla.qk_rope_head_dim).filter(|&r| r < head_dim),
        mla: Some(mla),
    })
}

/// Which layers attend to a window only, as transformers' config classes say: Mistral
/// (and Mixtral, the same attention) window every layer when `sliding_window` is set
/// (MistralConfig's default is 4096, an explicit `null` turns it off; Mixtral's default is
/// off); Gemma 2 windows every other layer from the first (`layer_types`, or
/// Gemma2Config's default: layer i is local when i is even, window 4096); Gemma 3 five of
/// every six (Gemma3TextConfig: layer i is local unless (i + 1) % `sliding_window_pattern`
/// is 0, window 4096 by default); StarCoder2 every layer when `sliding_window` is set; Llama
/// 4 its RoPE layers (`chunked_attention`: all but every `no_rope_layer_interval`-th), whose
/// cache DynamicCache keeps as sliding-window layers of `attention_chunk_size` tokens
/// (`cache_utils.py`: `sliding_window or attention_chunk_size`). A config's own
/// `layer_types` list is counted as written. Qwen2's `use_sliding_window` is not read:
/// transformers itself warns that its SDPA path ignores it.
fn sliding_window(
    family: Family,
    c: &Fields<'_>,
    layers: u64,
) -> Result<Option<SlidingWindow>, ConfigError> {
    const DEFAULT_WINDOW: u64 = 4096;
    const LLAMA4_DEFAULT_CHUNK: u64 = 8192;
    let (key, default) = match family {
        Family::Mistral | Family::Gemma2 | Family::Gemma3 => {
            ("sliding_window", Some(DEFAULT_WINDOW))
        }
        Family::Mixtral | Family::Starcoder2 => ("sliding_window", None),
        Family::Llama4 => ("attention_chunk_size", Some(LLAMA4_DEFAULT_CHUNK)),
        _ => return Ok(None),
    };
    let tokens = match c.0.get(key) {
        None => default,
        Some(Value::Null) => None,
        Some(_) => Some(c.int(key)?),
    };
    let Some(tokens) = tokens else {
        return Ok(None);
    };
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    let windowed = match c.0.get("layer_types").and_then(Value::as_array) {
        Some(types) => {
            if count(types.len()) != layers {
                return Err(ConfigError::Inconsistent {
                    field: "layer_types",
                    value: count(types.len()),
                    why: "it must name one type per hidden layer",
                });
            }
            count(
                types
                    .iter()
                    .filter(|t| {
                        matches!(t.as_str(), Some("sliding_attention" | "chunked_attention"))
                    })
                    .count(),
            )
        }
        // Gemma 2: layers 0, 2, 4, ... are local.
        None if family == Family::Gemma2 => layers.div_ceil(2),
        None if family == Family::Gemma3 => {
            let pattern = c.opt_int("sliding_window_pattern").unwrap_or(6);
            layers - layers / pattern
        }
        None if family == Family::Llama4 => {
            match c.0.get("no_rope_layers").and_then(Value::as_array) {
                // 1 = the layer uses RoPE (and chunked attention).
                Some(list) if !list.is_empty() => count(
                    list.iter()
                        .take(usize::try_from(layers).unwrap_or(usize::MAX))
                        .filter(|v| v.as_u64() == Some(1))
                        .count(),
                ),
                _ => {
                    let interval = c.opt_int("no_rope_layer_interval").unwrap_or(4);
                    layers - layers / interval
                }
            }
        }
        None => layers,
    };
    Ok((windowed > 0).then_some(SlidingWindow {
        tokens,
        layers: windowed,
    }))
}

fn per_head(hidden: u64, heads: u64) -> Result<u64, ConfigError> {
    if hidden % heads != 0 {
        return Err(ConfigError::Inconsistent {
            field: "num_attention_heads",
            value: heads,
            why: "the hidden size is not a multiple of it",
        });
    }
    Ok(hidden / heads)
}

/// Refuses shapes no model has: GQA heads that do not divide, more experts chosen than
/// exist, and sizes beyond any model (which would overflow the parameter count).
///
/// # Errors
/// The first field out of bounds.
pub fn check(arch: &Architecture) -> Result<(), ConfigError> {
    if arch.kv_heads == 0 || arch.heads % arch.kv_heads != 0 {
        return Err(ConfigError::Inconsistent {
            field: "num_key_value_heads",
            value: arch.kv_heads,
            why: "the query heads are not a multiple of it",
        });
    }
    if let Some(moe) = arch.moe {
        if moe.top_k > moe.experts || moe.top_k == 0 {
            return Err(ConfigError::Inconsistent {
                field: "num_experts_per_tok",
                value: moe.top_k,
                why: "a token cannot go to more experts than there are",
            });
        }
    }
    // Sizes far beyond any model would overflow the parameter count. With widths ≤ 2^18,
    // blocks ≤ 2^12 and experts ≤ 2^10, the largest product (h × expert width × 3 ×
    // experts × blocks) is 2^60 and the ten-odd terms of the count add below 2^64.
    // Real models stay far inside (Llama-3-405B: h 16,384, MLP 53,248, 126 blocks).
    const WIDTH: u64 = 1 << 18;
    let moe = arch.moe.unwrap_or(Moe::NONE);
    let mla = arch.mla.unwrap_or(Mla {
        q_lora_rank: 0,
        kv_lora_rank: 0,
        qk_nope_head_dim: 0,
        qk_rope_head_dim: 0,
        v_head_dim: 0,
    });
    for (field, value, limit) in [
        ("hidden_size", arch.hidden, WIDTH),
        ("intermediate_size", arch.intermediate, WIDTH),
        ("head_dim", arch.head_dim, WIDTH),
        ("num_attention_heads", arch.heads, WIDTH),
        (
            "query width (heads × head_dim)",
            arch.q_dim_saturating(),
            WIDTH,
        ),
        ("moe_intermediate_size", moe.expert_intermediate, WIDTH),
        (
            "shared_expert_intermediate_size",
            moe.shared_expert_intermediate,
            WIDTH,
        ),
        ("num_experts", moe.experts, 1 << 10),
        ("q_lora_rank", mla.q_lora_rank, WIDTH),
        ("kv_lora_rank", mla.kv_lora_rank, WIDTH),
        ("qk_rope_head_dim", mla.qk_rope_head_dim, WIDTH),
        ("v_head_dim", mla.v_head_dim, WIDTH),
        (
            "value width (heads × v_head_dim)",
            arch.heads.saturating_mul(mla.v_head_dim),
            WIDTH,
        ),
        (
            "num_hidden_layers",
            arch.layers
                .saturating_add(arch.decoder_layers.saturating_mul(2)),
            1 << 12,
        ),
        ("vocab_size", arch.vocab, 1 << 22),
        (
            "max_position_embeddings",
            arch.max_positions.unwrap_or(0),
            1 << 24,
        ),
        (
            "sliding_window",
            arch.sliding_window.map_or(0, |w| w.tokens),
            1 << 24,
        ),
    ] {
        if value > limit {
            return Err(ConfigError::Inconsistent {
                field,
                value,
                why: "larger than any model",
            });
        }
    }
    Ok(())
}

/// The dimensions of a `head_dim`-wide head that a `fraction` of rotary turns, as
/// transformers computes them (`int(head_dim * fraction)`); `None` when that is all of them.
fn partial_rotary(head_dim: u64, fraction: f64) -> Option<u64> {
    let dims = (head_dim as f64 * fraction.clamp(0.0, 1.0)) as u64;
    (dims < head_dim).then_some(dims)
}

/// Typed access to a config's fields.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn opt_int(&self, key: &'static str) -> Option<u64> {
        self.0.get(key).and_then(Value::as_u64).filter(|v| *v > 0)
    }

    fn int(&self, key: &'static str) -> Result<u64, ConfigError> {
        self.opt_int(key).ok_or(ConfigError::Field(key))
    }

    fn text(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    fn flag(&self, key: &str) -> Option<bool> {
        self.0.get(key).and_then(Value::as_bool)
    }

    /// A number in [0, 1] (a share of something); `None` when absent or outside.
    fn fraction(&self, key: &str) -> Option<f64> {
        self.0
            .get(key)
            .and_then(Value::as_f64)
            .filter(|f| (0.0..=1.0).contains(f))
    }

    /// Whether a probability field (dropout) is above 0, with transformers' default.
    fn positive(&self, key: &str, default: f64) -> bool {
        self.0.get(key).and_then(Value::as_f64).unwrap_or(default) > 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_model_type_names_the_supported_ones_and_the_fallback() {
        let err = parse_config(r#"{"model_type": "mamba"}"#).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("'mamba'"), "{text}");
        assert!(text.contains("gpt_neox, opt, falcon, phi"), "{text}");
        assert!(text.contains("gpt2, llama"), "{text}");
        assert!(text.contains("--params N --arch A"), "{text}");
    }

    /// The partial rotary's width as transformers computes it (`int(head_dim * fraction)`),
    /// with each config class's default; absent where every dimension turns.
    #[test]
    fn partial_rotary_dims_follow_the_config_and_its_class_default() {
        let neox = r#""model_type":"gpt_neox","hidden_size":2048,"num_attention_heads":8,
            "num_hidden_layers":2,"intermediate_size":8192,"vocab_size":50304"#;
        let dims = |extra: &str| {
            parse_config(&format!("{{{neox}{extra}}}"))
                .expect("config")
                .rotary_dims
        };
        assert_eq!(dims(""), Some(64));
        assert_eq!(dims(r#","rotary_pct":0.5"#), Some(128));
        assert_eq!(dims(r#","partial_rotary_factor":1.0"#), None);
        let phi = r#"{"model_type":"phi","hidden_size":2560,"num_attention_heads":32,
            "num_hidden_layers":2,"intermediate_size":10240,"vocab_size":51200,
            "partial_rotary_factor":0.4}"#;
        assert_eq!(parse_config(phi).expect("phi").rotary_dims, Some(32));
        let llama = r#"{"model_type":"llama","hidden_size":2048,"num_attention_heads":16,
            "num_hidden_layers":2,"intermediate_size":5632,"vocab_size":32000}"#;
        assert_eq!(parse_config(llama).expect("llama").rotary_dims, None);
    }

    fn window_of(text: &str) -> Option<SlidingWindow> {
        parse_config(text).expect("config").sliding_window
    }

    /// Which layers are windowed follows transformers' config classes: Mistral's default
    /// window 4096 on every layer, an explicit null none, Gemma 2's even layers, Mixtral
    /// off unless set, `layer_types` counted as written; Llama never.
    #[test]
    fn sliding_windows_are_read_with_the_config_classes_defaults() {
        let shape = r#""hidden_size":4096,"num_attention_heads":32,"num_key_value_heads":8,
            "num_hidden_layers":5,"intermediate_size":14336,"vocab_size":32000"#;
        let cfg = |extra: &str| format!(r#"{{{shape}{extra}}}"#);
        let w = |tokens, layers| Some(SlidingWindow { tokens, layers });
        assert_eq!(window_of(&cfg(r#","model_type":"mistral""#)), w(4096, 5));
        assert_eq!(
            window_of(&cfg(r#","model_type":"mistral","sliding_window":null"#)),
            None
        );
        assert_eq!(
            window_of(&cfg(r#","model_type":"mistral","sliding_window":1024"#)),
            w(1024, 5)
        );
        assert_eq!(window_of(&cfg(r#","model_type":"gemma2""#)), w(4096, 3));
        assert_eq!(
            window_of(&cfg(
                r#","model_type":"mixtral","num_local_experts":8,"num_experts_per_tok":2"#
            )),
            None
        );
        assert_eq!(
            window_of(&cfg(
                r#","model_type":"gemma2","sliding_window":512,"layer_types":["full_attention","sliding_attention","full_attention","full_attention","sliding_attention"]"#
            )),
            w(512, 2)
        );
        assert_eq!(
            window_of(&cfg(r#","model_type":"llama","sliding_window":4096"#)),
            None
        );
        assert!(matches!(
            parse_config(&cfg(
                r#","model_type":"gemma2","layer_types":["sliding_attention"]"#
            )),
            Err(ConfigError::Inconsistent {
                field: "layer_types",
                ..
            })
        ));
        assert_eq!(
            parse_config(&cfg(r#","model_type":"mistral","sliding_window":"wide""#)),
            Err(ConfigError::Field("sliding_window"))
        );
    }

    #[test]
    fn configs_without_a_model_type_or_fields_are_refused_by_name() {
        assert_eq!(parse_config("{}"), Err(ConfigError::NoModelType));
        assert_eq!(
            parse_config(r#"{"model_type": "llama", "hidden_size": 64}"#),
            Err(ConfigError::Field("num_attention_heads"))
        );
        assert!(matches!(parse_config("[1,2"), Err(ConfigError::Json(_))));
    }

    #[test]
    fn hostile_sizes_are_refused_before_counting() {
        let text = r#"{"model_type":"llama","hidden_size":4096,"num_attention_heads":32,
            "num_hidden_layers":32,"intermediate_size":11008,"vocab_size":18446744073709551615}"#;
        assert!(matches!(
            parse_config(text),
            Err(ConfigError::Inconsistent {
                field: "vocab_size",
                ..
            })
        ));
    }

    /// Experts and max positions were not bounded: 2^40 experts overflowed the count.
    #[test]
    fn hostile_expert_counts_and_positions_are_refused_before_counting() {
        let text = r#"{"model_type":"mixtral","hidden_size":4096,"num_attention_heads":32,
            "num_hidden_layers":32,"intermediate_size":14336,"vocab_size":32000,
            "num_local_experts":1099511627776,"num_experts_per_tok":2}"#;
        assert!(matches!(
            parse_config(text),
            Err(ConfigError::Inconsistent {
                field: "num_experts",
                ..
            })
        ));
        let text = r#"{"model_type":"gpt2","n_embd":768,"n_head":12,"n_layer":12,
            "vocab_size":50257,"n_positions":1152921504606846976}"#;
        assert!(matches!(
            parse_config(text),
            Err(ConfigError::Inconsistent {
                field: "max_position_embeddings",
                ..
            })
        ));
    }

    #[test]
    fn gqa_heads_that_do_not_divide_are_refused() {
        let text = r#"{"model_type":"llama","hidden_size":4096,"num_attention_heads":32,
            "num_key_value_heads":5,"num_hidden_layers":2,"intermediate_size":11008,"vocab_size":32000}"#;
        assert!(matches!(
            parse_config(text),
            Err(ConfigError::Inconsistent {
                field: "num_key_value_heads",
                ..
            })
        ));
    }

    fn arch_of(text: &str) -> Architecture {
        parse_config(text).expect("config")
    }

    /// Falcon's KV heads as FalconAttention sets num_kv_heads: the config's with the new
    /// decoder architecture or without multi_query, else 1; its layer norms per layer.
    #[test]
    fn falcon_kv_heads_and_norms_follow_multi_query_and_the_new_architecture() {
        let base = r#""model_type":"falcon","hidden_size":8192,"num_attention_heads":128,
            "num_hidden_layers":2,"vocab_size":65024"#;
        let cfg = |extra: &str| format!("{{{base}{extra}}}");
        let mq = arch_of(&cfg(""));
        assert_eq!((mq.kv_heads, mq.head_dim, mq.norms_per_layer), (1, 64, 1));
        let mha = arch_of(&cfg(r#","multi_query":false,"parallel_attn":false"#));
        assert_eq!((mha.kv_heads, mha.norms_per_layer), (128, 2));
        // Falcon-40B: new_decoder_architecture, num_kv_heads 8, ln_attn and ln_mlp.
        let new = arch_of(&cfg(r#","new_decoder_architecture":true,"num_kv_heads":8"#));
        assert_eq!((new.kv_heads, new.norms_per_layer), (8, 2));
        let one_ln = arch_of(&cfg(
            r#","new_decoder_architecture":true,"num_kv_heads":8,"num_ln_in_parallel_attn":1"#,
        ));
        assert_eq!(one_ln.norms_per_layer, 1);
        // The legacy RefinedWeb names transformers maps.
        let legacy = arch_of(
            r#"{"model_type":"falcon","hidden_size":4544,"n_head":71,"n_layer":32,"vocab_size":65024}"#,
        );
        assert_eq!((legacy.heads, legacy.layers), (71, 32));
    }

    /// Gemma 3: (i + 1) % sliding_window_pattern ≠ 0 is local, or layer_types as written;
    /// Llama 4: RoPE layers are chunked (all but every 4th), or no_rope_layers' 1s;
    /// StarCoder2: every layer when sliding_window is set.
    #[test]
    fn hybrid_layers_are_counted_as_the_config_classes_derive_them() {
        let w = |tokens, layers| Some(SlidingWindow { tokens, layers });
        let gemma3 = r#""model_type":"gemma3_text","hidden_size":1152,"num_attention_heads":4,
            "num_key_value_heads":1,"head_dim":256,"num_hidden_layers":26,
            "intermediate_size":6912,"vocab_size":262144"#;
        assert_eq!(window_of(&format!("{{{gemma3}}}")), w(4096, 22));
        assert_eq!(
            window_of(&format!(
                r#"{{{gemma3},"sliding_window":512,"sliding_window_pattern":2}}"#
            )),
            w(512, 13)
        );
        let types: Vec<&str> = (0..26)
            .map(|i| {
                if i < 20 {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
            })
            .collect();
        let listed = format!(
            r#"{{{gemma3},"sliding_window":512,"layer_types":{}}}"#,
            serde_json::to_string(&types).expect("json")
        );
        assert_eq!(window_of(&listed), w(512, 20));
        let llama4 = r#""model_type":"llama4_text","hidden_size":5120,"num_attention_heads":40,
            "num_key_value_heads":8,"num_hidden_layers":48,"vocab_size":202048"#;
        assert_eq!(window_of(&format!("{{{llama4}}}")), w(8192, 36));
        assert_eq!(
            window_of(&format!(
                r#"{{{llama4},"attention_chunk_size":1024,"no_rope_layers":[1,0,1,1]}}"#
            )),
            w(1024, 3)
        );
        assert_eq!(
            window_of(&format!(r#"{{{llama4},"attention_chunk_size":null}}"#)),
            None
        );
        let sc2 = r#""model_type":"starcoder2","hidden_size":3072,"num_attention_heads":24,
            "num_key_value_heads":2,"num_hidden_layers":30,"intermediate_size":12288,
            "vocab_size":49152"#;
        assert_eq!(window_of(&format!("{{{sc2}}}")), None);
        assert_eq!(
            window_of(&format!(r#"{{{sc2},"sliding_window":4096}}"#)),
            w(4096, 30)
        );
    }

    /// Llama 4 Maverick's interleaved experts: moe_layers = range(1, 48, 2), the other 24
    /// layers dense of intermediate_size_mlp.
    #[test]
    fn llama4_interleaved_experts_leave_dense_layers_of_the_mlp_width() {
        let a = arch_of(
            r#"{"model_type":"llama4_text","hidden_size":5120,"num_attention_heads":40,
            "num_key_value_heads":8,"num_hidden_layers":48,"vocab_size":202048,
            "num_local_experts":128,"interleave_moe_layer_step":2,
            "intermediate_size":8192,"intermediate_size_mlp":16384}"#,
        );
        let moe = a.moe.expect("experts");
        assert_eq!((moe.experts, moe.dense_layers), (128, 24));
        assert_eq!(a.intermediate, 16384);
        // From modeling_llama4.py: 24 MoE layers (128 experts + shared expert + router),
        // 24 dense layers of 3 · 5120 · 16,384; attention and norms on all 48.
        let attention = 2 * 5120 * 5120 + 2 * 5120 * 1024 + 2 * 5120;
        let moe_layer = 128 * 3 * 5120 * 8192 + 3 * 5120 * 8192 + 128 * 5120;
        let dense_layer = 3 * 5120 * 16_384;
        assert_eq!(
            a.params(),
            48 * attention + 24 * moe_layer + 24 * dense_layer + 2 * 202_048 * 5120 + 5120
        );
        assert_eq!(a.params(), 400_711_848_960);
    }

    #[test]
    fn vision_language_configs_and_unmodelled_variants_are_refused_by_name() {
        let err = parse_config(r#"{"model_type":"gemma3"}"#).unwrap_err();
        assert!(err.to_string().contains("'gemma3_text'"), "{err}");
        let err = parse_config(r#"{"model_type":"llama4"}"#).unwrap_err();
        assert!(err.to_string().contains("'llama4_text'"), "{err}");
        // opt-350m projects 512-wide embeddings to 1024.
        let err = parse_config(
            r#"{"model_type":"opt","hidden_size":1024,"num_attention_heads":16,
            "num_hidden_layers":24,"ffn_dim":4096,"vocab_size":50272,"word_embed_proj_dim":512}"#,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            ConfigError::NotModelled {
                field: "word_embed_proj_dim",
                ..
            }
        ));
        assert!(err.to_string().contains("--params N --arch A"), "{err}");
    }

    /// DeepSeek's MLA: the query/key head is nope + rope wide, the value v_head_dim; a
    /// null q_lora_rank is a plain q_proj, an absent one the config class's 1536.
    #[test]
    fn deepseek_mla_fields_and_defaults() {
        let base = r#""model_type":"deepseek_v3","hidden_size":7168,"num_attention_heads":128,
            "num_hidden_layers":4,"intermediate_size":18432,"vocab_size":129280"#;
        let a = arch_of(&format!("{{{base}}}"));
        let mla = a.mla.expect("mla");
        assert_eq!(mla.q_lora_rank, 1536);
        assert_eq!((a.head_dim, a.kv_heads, a.v_dim()), (192, 128, 128 * 128));
        // The latent and the rotary key are cached, not the 128 heads' keys and values.
        assert_eq!(a.kv_cache_width(), 512 + 64);
        let moe = a.moe.expect("experts");
        assert_eq!((moe.experts, moe.top_k, moe.dense_layers), (256, 8, 3));
        let plain_q = arch_of(&format!(r#"{{{base},"q_lora_rank":null}}"#));
        assert_eq!(plain_q.mla.expect("mla").q_lora_rank, 0);
        let dense = arch_of(&format!(r#"{{{base},"n_routed_experts":null}}"#));
        assert_eq!(dense.moe, None);
    }
}
