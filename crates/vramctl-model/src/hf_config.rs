//! A Hugging Face `config.json` into an [`Architecture`]: each supported `model_type`
//! with its own field names (GPT-2's `n_embd`, T5's `d_model`, ...) and the defaults
//! transformers' config classes apply when a field is absent.

use serde_json::{Map, Value};

use crate::architecture::{Architecture, Dtype, Family, Mlp, Moe, Norm, SlidingWindow};

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
                mlp: Mlp::Plain,
                activation: c.text("hidden_act").unwrap_or("gelu").to_owned(),
                linear_bias: true,
                qkv_bias: false,
                qk_norm: false,
                hidden_dropout: c.positive("hidden_dropout_prob", 0.1),
                attention_dropout: c.positive("attention_probs_dropout_prob", 0.1),
                dtype,
                sliding_window: None,
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
                mlp: if gated { Mlp::Gated } else { Mlp::Plain },
                activation: projection.trim_start_matches("gated-").to_owned(),
                linear_bias: false,
                qkv_bias: false,
                qk_norm: false,
                hidden_dropout: c.positive("dropout_rate", 0.1),
                attention_dropout: c.positive("dropout_rate", 0.1),
                dtype,
                sliding_window: None,
            }
        }
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
    let tied_default = matches!(family, Family::Gemma | Family::Gemma2);
    let moe = match family {
        Family::Mixtral => Some(Moe {
            experts: c.int("num_local_experts")?,
            top_k: c.int("num_experts_per_tok")?,
            expert_intermediate: c.int("intermediate_size")?,
            shared_expert_intermediate: 0,
        }),
        Family::Qwen2Moe => Some(Moe {
            experts: c.int("num_experts")?,
            top_k: c.int("num_experts_per_tok")?,
            expert_intermediate: c.int("moe_intermediate_size")?,
            shared_expert_intermediate: c.opt_int("shared_expert_intermediate_size").unwrap_or(0),
        }),
        _ => None,
    };
    let default_act = match family {
        Family::Gemma | Family::Gemma2 => "gelu_pytorch_tanh",
        _ => "silu",
    };
    let layers = c.int("num_hidden_layers")?;
    Ok(Architecture {
        family,
        layers,
        decoder_layers: 0,
        hidden,
        intermediate: c.int("intermediate_size")?,
        heads,
        kv_heads,
        head_dim,
        vocab: c.int("vocab_size")?,
        tied_embeddings: c.flag("tie_word_embeddings").unwrap_or(tied_default),
        moe,
        max_positions: c.opt_int("max_position_embeddings"),
        learned_positions: false,
        norm: Norm::RmsNorm,
        norms_per_layer: if family == Family::Gemma2 { 4 } else { 2 },
        mlp: Mlp::Gated,
        activation: c
            .text("hidden_act")
            .or_else(|| c.text("hidden_activation"))
            .unwrap_or(default_act)
            .to_owned(),
        linear_bias: false,
        qkv_bias: matches!(family, Family::Qwen2 | Family::Qwen2Moe)
            || c.flag("attention_bias").unwrap_or(false),
        qk_norm: family == Family::Qwen3,
        // Decoders train without dropout by default (attention_dropout 0.0).
        hidden_dropout: false,
        attention_dropout: c.positive("attention_dropout", 0.0),
        dtype,
        sliding_window: sliding_window(family, c, layers)?,
    })
}

/// Which layers attend to a window only, as transformers' config classes say: Mistral
/// (and Mixtral, the same attention) window every layer when `sliding_window` is set
/// (MistralConfig's default is 4096, an explicit `null` turns it off; Mixtral's default is
/// off); Gemma 2 windows every other layer from the first (`layer_types`, or
/// Gemma2Config's default: layer i is local when i is even, window 4096). A config's own
/// `layer_types` list is counted as written. Qwen2's `use_sliding_window` is not read:
/// transformers itself warns that its SDPA path ignores it.
fn sliding_window(
    family: Family,
    c: &Fields<'_>,
    layers: u64,
) -> Result<Option<SlidingWindow>, ConfigError> {
    const GEMMA2_AND_MISTRAL_DEFAULT_WINDOW: u64 = 4096;
    let default = match family {
        Family::Mistral | Family::Gemma2 => Some(GEMMA2_AND_MISTRAL_DEFAULT_WINDOW),
        Family::Mixtral => None,
        _ => return Ok(None),
    };
    let tokens = match c.0.get("sliding_window") {
        None => default,
        Some(Value::Null) => None,
        Some(_) => Some(c.int("sliding_window")?),
    };
    let Some(tokens) = tokens else {
        return Ok(None);
    };
    let windowed = match c.0.get("layer_types").and_then(Value::as_array) {
        Some(types) => {
            if u64::try_from(types.len()).ok() != Some(layers) {
                return Err(ConfigError::Inconsistent {
                    field: "layer_types",
                    value: u64::try_from(types.len()).unwrap_or(u64::MAX),
                    why: "it must name one type per hidden layer",
                });
            }
            let sliding = types
                .iter()
                .filter(|t| t.as_str() == Some("sliding_attention"))
                .count();
            u64::try_from(sliding).unwrap_or(u64::MAX)
        }
        // Gemma 2: layers 0, 2, 4, ... are local.
        None if family == Family::Gemma2 => layers.div_ceil(2),
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
    let moe = arch.moe.unwrap_or(Moe {
        experts: 0,
        top_k: 0,
        expert_intermediate: 0,
        shared_expert_intermediate: 0,
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
        let err = parse_config(r#"{"model_type": "falcon"}"#).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("'falcon'"), "{text}");
        assert!(text.contains("gpt2, llama"), "{text}");
        assert!(text.contains("--params N --arch A"), "{text}");
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
}
