//! `MODEL` as the user names it (a directory, `config.json`, `.safetensors`, the shard
//! index, `.gguf`) → one [`Model`]: the architecture and, where weights headers exist,
//! the exact parameter count and bytes.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::architecture::{Architecture, Family, synthesize};
use crate::gguf::{self, GgufError};
use crate::hf_config::{self, ConfigError, MAX_CONFIG_BYTES};
use crate::safetensors_header::{self, SafetensorsError};

pub use crate::safetensors_header::WeightsInfo;

/// Where the model's facts came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// `config.json` alone: parameters counted from the shapes.
    Config,
    /// `config.json` and safetensors headers: parameters exact.
    ConfigAndSafetensors,
    /// Safetensors headers, the shape synthesised from their count and `--arch`.
    Safetensors,
    Gguf,
    /// `--params N --arch A`.
    Synthesized,
}

/// A model as the memory model needs it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Model {
    pub source: SourceKind,
    pub path: Option<PathBuf>,
    pub architecture: Architecture,
    /// From the weights' headers, when there are any.
    pub weights: Option<WeightsInfo>,
}

impl Model {
    /// Parameters: the headers' count where read, else counted from the architecture.
    pub fn params(&self) -> u64 {
        self.weights
            .as_ref()
            .map_or_else(|| self.architecture.params(), |w| w.params)
    }

    /// `--params N --arch A`: the count as given, a shape of that size.
    pub fn synthesized(params: u64, family: Family) -> Model {
        let architecture = synthesize(params, family);
        Model {
            source: SourceKind::Synthesized,
            path: None,
            architecture,
            weights: Some(WeightsInfo {
                params,
                ..WeightsInfo::default()
            }),
        }
    }
}

/// Why `MODEL` could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("cannot read '{path}'")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("'{path}' is not a config.json this reads")]
    Config { path: PathBuf, source: ConfigError },
    #[error("'{path}' is larger than {MAX_CONFIG_BYTES} bytes; it is not a config.json")]
    ConfigTooLarge { path: PathBuf },
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("'{path}': {why}; give --arch A to size it as that family")]
    NoArchitecture { path: PathBuf, why: String },
    #[error(
        "'{path}' has no config.json; name a config.json, .safetensors, index or .gguf file, \
         or give --params N --arch A"
    )]
    NoConfig { path: PathBuf },
    #[error(
        "'{path}' is not a model this reads; name a directory, config.json, .safetensors, \
         model.safetensors.index.json or .gguf file, or give --params N --arch A"
    )]
    NotAModel { path: PathBuf },
}

/// Reads `MODEL`. `arch` (`--arch`) sizes a model whose files carry no architecture
/// (a bare `.safetensors`), or overrides a GGUF's.
///
/// # Errors
/// Unreadable or malformed files, an unsupported `model_type`, no architecture.
pub fn read_model(path: &Path, arch: Option<Family>) -> Result<Model, ModelError> {
    let io = |source| ModelError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.is_dir() {
        let config = path.join("config.json");
        if !config.is_file() {
            return Err(ModelError::NoConfig {
                path: path.to_owned(),
            });
        }
        let architecture = read_config(&config)?;
        let index = path.join("model.safetensors.index.json");
        let single = path.join("model.safetensors");
        let weights = if index.is_file() {
            Some(safetensors_header::read_index(&index)?)
        } else if single.is_file() {
            Some(safetensors_header::read_file(&single)?)
        } else {
            None
        };
        return Ok(with_weights(path, architecture, weights));
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let beside = |file: &str| path.parent().map(|dir| dir.join(file));
    if name.ends_with(".safetensors.index.json") || name.ends_with(".safetensors") {
        let weights = if name.ends_with(".json") {
            safetensors_header::read_index(path)?
        } else {
            safetensors_header::read_file(path)?
        };
        let config = beside("config.json").filter(|c| c.is_file());
        return match (config, arch) {
            (Some(config), _) => Ok(with_weights(path, read_config(&config)?, Some(weights))),
            (None, Some(family)) => Ok(Model {
                source: SourceKind::Safetensors,
                path: Some(path.to_owned()),
                architecture: synthesize(weights.params, family),
                weights: Some(weights),
            }),
            (None, None) => Err(ModelError::NoArchitecture {
                path: path.to_owned(),
                why: "a safetensors header has no architecture and no config.json is beside it"
                    .to_owned(),
            }),
        };
    }
    if name.ends_with(".json") {
        return Ok(Model {
            source: SourceKind::Config,
            path: Some(path.to_owned()),
            architecture: read_config(path)?,
            weights: None,
        });
    }
    if name.ends_with(".gguf") {
        let info = gguf::read_file(path)?;
        let architecture = match (arch, info.architecture()) {
            (Some(family), _) => synthesize(info.weights.params, family),
            (None, Ok(architecture)) => architecture,
            (None, Err(why)) => {
                return Err(ModelError::NoArchitecture {
                    path: path.to_owned(),
                    why,
                });
            }
        };
        return Ok(Model {
            source: SourceKind::Gguf,
            path: Some(path.to_owned()),
            architecture,
            weights: Some(info.weights),
        });
    }
    Err(ModelError::NotAModel {
        path: path.to_owned(),
    })
}

fn with_weights(path: &Path, architecture: Architecture, weights: Option<WeightsInfo>) -> Model {
    Model {
        source: if weights.is_some() {
            SourceKind::ConfigAndSafetensors
        } else {
            SourceKind::Config
        },
        path: Some(path.to_owned()),
        architecture,
        weights,
    }
}

fn read_config(path: &Path) -> Result<Architecture, ModelError> {
    let io = |source| ModelError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() > MAX_CONFIG_BYTES {
        return Err(ModelError::ConfigTooLarge {
            path: path.to_owned(),
        });
    }
    hf_config::parse_config(&text).map_err(|source| ModelError::Config {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::architecture::Mlp;

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/model")
            .join(name)
    }

    /// Each supported model_type from a real model's config.json (testdata/model/configs),
    /// counted to the parameters its checkpoint has.
    #[test]
    fn every_model_type_counts_its_published_parameters() {
        let cases = [
            ("gpt2.json", Family::Gpt2, 124_439_808),
            ("llama-3-8b.json", Family::Llama, 8_030_261_248),
            ("mistral-7b.json", Family::Mistral, 7_241_732_096),
            ("qwen2-7b.json", Family::Qwen2, 7_615_616_512),
            ("qwen3-8b.json", Family::Qwen3, 8_190_735_360),
            ("gemma-2b.json", Family::Gemma, 2_506_172_416),
            ("gemma-2-9b.json", Family::Gemma2, 9_241_705_984),
            ("phi-3-mini.json", Family::Phi3, 3_821_079_552),
            // BertForMaskedLM: the encoder without pooler, the MLM head's transform and bias.
            ("bert-base.json", Family::Bert, 109_514_298),
            ("t5-small.json", Family::T5, 60_506_624),
            ("mixtral-8x7b.json", Family::Mixtral, 46_702_792_704),
            ("qwen1.5-moe-a2.7b.json", Family::Qwen2Moe, 14_315_784_192),
            // The counts below are transformers' `model.num_parameters()` of each
            // *ForCausalLM built from the config, written from the modeling files
            // (src/transformers/models/<family>/modeling_<family>.py) term by term:
            // GPTNeoXForCausalLM: 16 × (2 LayerNorms 4·2048 + query_key_value 2048·6144 +
            // 6144 + dense 2048² + 2048 + MLP 2·2048·8192 + 8192 + 2048) + embed_in and
            // embed_out 2 · 50,304 · 2048 + final LayerNorm 4096 (the Pythia paper's
            // 1,011,781,632).
            ("pythia-1b.json", Family::GptNeox, 1_011_781_632),
            // OPTForCausalLM: 24 × (q, k, v, out_proj with bias 4 · (2048² + 2048) + fc1,
            // fc2 2 · 2048 · 8192 + 8192 + 2048 + 2 LayerNorms) + embed_tokens 50,272 · 2048
            // (lm_head tied) + embed_positions (2048 + 2) · 2048 + final_layer_norm.
            ("opt-1.3b.json", Family::Opt, 1_315_758_080),
            // FalconForCausalLM, multi_query: 32 × (input_layernorm 2 · 4544 +
            // query_key_value 4544 · (4544 + 2 · 64) + dense 4544² + MLP 2 · 4544 · 18,176),
            // no biases, + word_embeddings 65,024 · 4544 (tied) + ln_f.
            ("falcon-7b.json", Family::Falcon, 6_921_720_704),
            // PhiForCausalLM: 32 × (input_layernorm + q, k, v, dense with bias + fc1, fc2
            // with bias) + embed_tokens + lm_head 51,200 · 2560 with its bias 51,200 +
            // final_layernorm.
            ("phi-2.json", Family::Phi, 2_779_683_840),
            // Starcoder2ForCausalLM: 30 × (q, o 3072² + 3072, k, v 3072 · 256 + 256, c_fc,
            // c_proj with bias, 2 LayerNorms) + embed_tokens (tied) + norm.
            ("starcoder2-3b.json", Family::Starcoder2, 3_030_371_328),
            // OlmoForCausalLM: OlmoLayerNorm has no parameters; 16 × (4 · 2048² +
            // 3 · 2048 · 8192) + embed_tokens 50,304 · 2048 (tied).
            ("olmo-1b.json", Family::Olmo, 1_176_764_416),
            // Olmo2ForCausalLM: 16 × (4 · 2048² + 3 · 2048 · 8192 + post_attention and
            // post_feedforward RMSNorms 2 · 2048 + q_norm, k_norm 2 · 2048) + embed_tokens
            // and lm_head 2 · 100,352 · 2048 + norm.
            ("olmo-2-1b.json", Family::Olmo2, 1_484_916_736),
            // Gemma3ForCausalLM: 26 × (q 1152 · 1024, k, v 1152 · 256, o 1024 · 1152,
            // q_norm, k_norm 2 · 256, MLP 3 · 1152 · 6912, 4 RMSNorms) + embed_tokens
            // 262,144 · 1152 (tied) + norm.
            ("gemma-3-1b.json", Family::Gemma3, 999_885_952),
            // DeepseekV2ForCausalLM (modular_deepseek_v2.py), q_lora_rank null: 27 ×
            // (q_proj 2048 · 16 · 192 + kv_a_proj_with_mqa 2048 · 576 + kv_a_layernorm 512 +
            // kv_b_proj 512 · 16 · 256 + o_proj 2048 · 2048 + 2 RMSNorms) + layer 0's dense
            // MLP 3 · 2048 · 10,944 + 26 × (64 experts 3 · 2048 · 1408 + shared experts
            // 3 · 2048 · 2816 + gate 64 · 2048) + embed_tokens, lm_head + norm.
            ("deepseek-v2-lite.json", Family::DeepseekV2, 15_706_484_224),
            // DeepseekV3ForCausalLM (modeling_deepseek_v3.py): q_a_proj, q_a_layernorm,
            // q_b_proj; 3 dense layers, 58 of 256 experts + 1 shared expert. The router's
            // e_score_correction_bias is a buffer, so this is the published 671,026,419,200
            // less 58 × 256; the multi-token-prediction layer 61 is not built.
            ("deepseek-v3.json", Family::DeepseekV3, 671_026_404_352),
            // Llama4ForCausalLM (modeling_llama4.py): 48 × (q, o 5120², k, v 5120 · 1024,
            // 2 RMSNorms; Llama4TextL2Norm has no weight; 16 experts 3 · 5120 · 8192 in
            // gate_up_proj and down_proj + shared_expert 3 · 5120 · 8192 + router 16 · 5120)
            // + embed_tokens, lm_head 2 · 202,048 · 5120 + norm.
            ("llama-4-scout-text.json", Family::Llama4, 107_769_861_120),
        ];
        assert_eq!(cases.len(), Family::ALL.len(), "one case per family");
        for (file, family, params) in cases {
            let model = read_model(&testdata(&format!("configs/{file}")), None).expect(file);
            assert_eq!(model.source, SourceKind::Config, "{file}");
            assert_eq!(model.architecture.family, family, "{file}");
            assert_eq!(model.params(), params, "{file}");
        }
    }

    /// The two Pythia sizes held back in round 7 (scripts/estimate/cases.py), written from
    /// their published values: GPT-NeoX's terms (above) at 24 × 1024 (16 heads, MLP 4096)
    /// and 32 × 2560 (32 heads, 10240) give Pythia's published 405,334,016 and
    /// 2,775,208,960, so the configs describe those checkpoints.
    #[test]
    fn pythia_configs_count_their_published_parameters() {
        for (file, params) in [
            ("pythia-410m.json", 405_334_016),
            ("pythia-2.8b.json", 2_775_208_960),
            ("pythia-160m.json", 162_322_944),
            ("pythia-1.4b.json", 1_414_647_808),
            ("pythia-6.9b.json", 6_857_302_016),
        ] {
            let model = read_model(&testdata(&format!("configs/{file}")), None).expect(file);
            assert_eq!(model.architecture.family, Family::GptNeox, "{file}");
            assert_eq!(model.params(), params, "{file}");
        }
    }

    #[test]
    fn config_fields_land_where_the_memory_model_reads_them() {
        let llama = read_model(&testdata("configs/llama-3-8b.json"), None).expect("llama");
        let a = &llama.architecture;
        assert_eq!(
            (a.layers, a.hidden, a.heads, a.kv_heads, a.head_dim),
            (32, 4096, 32, 8, 128)
        );
        assert_eq!(a.kv_dim(), 1024);
        assert_eq!(a.max_positions, Some(8192));
        assert!(!a.tied_embeddings);
        assert_eq!(a.dtype, Some(crate::Dtype::Bf16));
        let gpt2 = read_model(&testdata("configs/gpt2.json"), None).expect("gpt2");
        assert_eq!(gpt2.architecture.mlp, Mlp::Plain);
        assert!(gpt2.architecture.hidden_dropout && gpt2.architecture.attention_dropout);
        let t5 = read_model(&testdata("configs/t5-small.json"), None).expect("t5");
        assert_eq!(
            (t5.architecture.layers, t5.architecture.decoder_layers),
            (6, 6)
        );
        assert_eq!(t5.architecture.kv_cache_layers(), 6);
        let mixtral = read_model(&testdata("configs/mixtral-8x7b.json"), None).expect("mixtral");
        let moe = mixtral.architecture.moe.expect("experts");
        assert_eq!((moe.experts, moe.top_k), (8, 2));
    }

    /// tiny-llama/ was written by the safetensors package (make.py): the header's count
    /// and the config's shapes agree, and the bytes are float16's.
    #[test]
    fn a_directory_reads_the_config_and_the_safetensors_header_which_agree() {
        let model = read_model(&testdata("tiny-llama"), None).expect("tiny-llama");
        assert_eq!(model.source, SourceKind::ConfigAndSafetensors);
        let weights = model.weights.as_ref().expect("header read");
        assert_eq!(weights.params, 26_784);
        assert_eq!(weights.params, model.architecture.params());
        assert_eq!(weights.bytes, 2 * 26_784);
        assert_eq!(weights.by_dtype.keys().collect::<Vec<_>>(), ["F16"]);
        assert_eq!(weights.tensors, 21);
        let sharded = read_model(&testdata("sharded"), None).expect("sharded");
        let shards = sharded.weights.as_ref().expect("index read");
        assert_eq!(shards.files, 2);
        assert_eq!(
            (shards.params, shards.bytes),
            (weights.params, weights.bytes)
        );
        let index =
            read_model(&testdata("sharded/model.safetensors.index.json"), None).expect("index");
        assert_eq!(index.params(), 26_784);
    }

    #[test]
    fn a_safetensors_file_counts_bytes_per_dtype() {
        // No config.json beside it: it needs --arch.
        let err = read_model(&testdata("mixed.safetensors"), None).unwrap_err();
        assert!(err.to_string().contains("--arch"), "{err}");
        let model = read_model(&testdata("mixed.safetensors"), Some(Family::Llama)).expect("mixed");
        let w = model.weights.expect("header");
        assert_eq!(w.params, 32 + 16 + 15);
        assert_eq!(w.by_dtype["F32"].bytes, 128);
        assert_eq!(w.by_dtype["F16"].bytes, 32);
        assert_eq!(w.by_dtype["I8"].bytes, 15);
        assert_eq!(model.source, SourceKind::Safetensors);
    }

    /// tiny-llama.gguf was written by the gguf package (make.py, gguf-py 0.19.0); its
    /// byte counts per type are those gguf-py's own reader reports.
    #[test]
    fn a_gguf_file_gives_its_architecture_and_tensor_bytes() {
        let model = read_model(&testdata("tiny-llama.gguf"), None).expect("gguf");
        let w = model.weights.as_ref().expect("tensors");
        assert_eq!(w.params, 26_784);
        assert_eq!(w.by_dtype["F16"].bytes, 28_672);
        assert_eq!(w.by_dtype["Q8_0"].bytes, 13_056);
        assert_eq!(w.by_dtype["F32"].bytes, 640);
        let a = &model.architecture;
        assert_eq!(a.family, Family::Llama);
        assert_eq!(
            (a.layers, a.hidden, a.intermediate, a.heads, a.kv_heads),
            (2, 32, 64, 4, 2)
        );
        assert_eq!(a.vocab, 128, "from the tokenizer's token array");
        assert_eq!(a.max_positions, Some(256));
        assert!(!a.tied_embeddings, "it has output.weight");
        assert_eq!(a.params(), w.params);
    }

    /// The message held the OS error and anyhow's chain added it again:
    /// "cannot read 'x': No such file ... (os error 2): No such file ... (os error 2)".
    #[test]
    fn an_unreadable_model_leaves_the_os_error_to_the_source_chain() {
        let err = read_model(Path::new("/nonexistent/config.json"), None).unwrap_err();
        assert_eq!(err.to_string(), "cannot read '/nonexistent/config.json'");
        let source = std::error::Error::source(&err).expect("the io error as source");
        assert!(source.to_string().contains("os error 2"), "{source}");
    }

    #[test]
    fn paths_that_are_no_model_say_what_to_give_instead() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = read_model(dir.path(), None).unwrap_err();
        assert!(matches!(err, ModelError::NoConfig { .. }), "{err}");
        assert!(err.to_string().contains("--params N --arch A"), "{err}");
        let other = dir.path().join("weights.bin");
        std::fs::write(&other, b"x").expect("write");
        assert!(matches!(
            read_model(&other, None).unwrap_err(),
            ModelError::NotAModel { .. }
        ));
        let missing = read_model(&dir.path().join("nope.json"), None).unwrap_err();
        assert!(matches!(missing, ModelError::Io { .. }));
        let huge = dir.path().join("config.json");
        std::fs::write(&huge, vec![b' '; MAX_CONFIG_BYTES + 1]).expect("write");
        assert!(matches!(
            read_model(&huge, None).unwrap_err(),
            ModelError::ConfigTooLarge { .. }
        ));
    }
}
