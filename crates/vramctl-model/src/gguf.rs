//! `.gguf` (v2, v3) metadata and tensor table, never the tensor data. Layout (ggml's
//! `docs/gguf.md`): magic `GGUF`, version u32, tensor count u64, key-value count u64, the
//! key-values (a string key, a u32 type, a typed value; arrays carry an element type and a
//! u64 length), then per tensor its name, dimension count u32, dimensions u64 each, ggml
//! type u32 and offset u64. All little-endian; strings are a u64 length and UTF-8 bytes.
//!
//! Hostile files are bounded: counts, string and array lengths are checked against limits
//! and against the bytes the file has left before anything is allocated or skipped.

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::architecture::{Architecture, Family, Mlp, Moe, Norm};
use crate::safetensors_header::WeightsInfo;

/// The families whose GGUF metadata this reads (llama.cpp's names equal the `model_type`s).
const GGUF_FAMILIES: [Family; 12] = [
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

/// More tensors than this is not a model (a 405B GGUF has about 1,100).
pub const MAX_TENSORS: u64 = 1_000_000;
/// More key-values than this is not a model's metadata (real files have 20–60).
pub const MAX_KEY_VALUES: u64 = 1_000_000;
/// Longest key or tensor name accepted.
pub const MAX_NAME_BYTES: u64 = 64 * 1024;
/// String values longer than this are skipped (chat templates are a few KB), not kept.
pub const MAX_KEPT_STRING_BYTES: u64 = 1024 * 1024;
/// ggml's `GGML_MAX_DIMS` is 4; a little slack for newer writers.
pub const MAX_DIMS: u32 = 8;
/// Arrays inside arrays deeper than this are refused.
pub const MAX_ARRAY_DEPTH: u32 = 3;

/// A metadata value as kept: scalars and short strings; arrays by their length only.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Value {
    Uint(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Text(String),
    /// An array (or a string too long to keep), its length.
    Skipped {
        length: u64,
    },
}

impl Value {
    fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Uint(v) => Some(*v),
            Value::Int(v) => u64::try_from(*v).ok(),
            _ => None,
        }
    }
}

/// What a GGUF file says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GgufInfo {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub weights: WeightsInfo,
    /// `token_embd.weight`'s rows (the vocabulary) where present.
    pub embedding_rows: Option<u64>,
    /// An `output.weight` tensor: the output projection is not tied to the embeddings.
    pub has_output_tensor: bool,
}

/// Why a GGUF file could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    #[error("cannot read '{path}'")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("'{path}' is not a GGUF file (its first bytes are not 'GGUF')")]
    Magic { path: PathBuf },
    #[error("'{path}' is GGUF version {version}; versions 2 and 3 are read")]
    Version { path: PathBuf, version: u32 },
    #[error("'{path}' is truncated or damaged: {what}")]
    Truncated { path: PathBuf, what: String },
    #[error("'{path}' is damaged: {what}")]
    Bad { path: PathBuf, what: String },
}

/// ggml tensor types: (block elements, bytes per block), from the `gguf` Python package's
/// `GGML_QUANT_SIZES` (gguf-py 0.x, the writer of the test files).
fn type_size(ggml_type: u32) -> Option<(&'static str, u64, u64)> {
    Some(match ggml_type {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 18),
        3 => ("Q4_1", 32, 20),
        6 => ("Q5_0", 32, 22),
        7 => ("Q5_1", 32, 24),
        8 => ("Q8_0", 32, 34),
        9 => ("Q8_1", 32, 40),
        10 => ("Q2_K", 256, 84),
        11 => ("Q3_K", 256, 110),
        12 => ("Q4_K", 256, 144),
        13 => ("Q5_K", 256, 176),
        14 => ("Q6_K", 256, 210),
        15 => ("Q8_K", 256, 292),
        16 => ("IQ2_XXS", 256, 66),
        17 => ("IQ2_XS", 256, 74),
        18 => ("IQ3_XXS", 256, 98),
        19 => ("IQ1_S", 256, 50),
        20 => ("IQ4_NL", 32, 18),
        21 => ("IQ3_S", 256, 110),
        22 => ("IQ2_S", 256, 82),
        23 => ("IQ4_XS", 256, 136),
        24 => ("I8", 1, 1),
        25 => ("I16", 1, 2),
        26 => ("I32", 1, 4),
        27 => ("I64", 1, 8),
        28 => ("F64", 1, 8),
        29 => ("IQ1_M", 256, 56),
        30 => ("BF16", 1, 2),
        34 => ("TQ1_0", 256, 54),
        35 => ("TQ2_0", 256, 66),
        39 => ("MXFP4", 32, 17),
        _ => return None,
    })
}

struct Reader<R> {
    inner: R,
    position: u64,
    len: u64,
    path: PathBuf,
}

impl<R: Read + Seek> Reader<R> {
    fn truncated(&self, what: impl Into<String>) -> GgufError {
        GgufError::Truncated {
            path: self.path.clone(),
            what: what.into(),
        }
    }

    fn bad(&self, what: impl Into<String>) -> GgufError {
        GgufError::Bad {
            path: self.path.clone(),
            what: what.into(),
        }
    }

    fn left(&self) -> u64 {
        self.len.saturating_sub(self.position)
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut buf = [0_u8; N];
        self.inner
            .read_exact(&mut buf)
            .map_err(|_| self.truncated(format!("the file ends inside {what}")))?;
        self.position += N as u64;
        Ok(buf)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.bytes::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.bytes::<8>(what).map(u64::from_le_bytes)
    }

    fn skip(&mut self, n: u64, what: &str) -> Result<(), GgufError> {
        if n > self.left() {
            return Err(self.truncated(format!("{what} needs {n} bytes, {} are left", self.left())));
        }
        let offset = i64::try_from(n).map_err(|_| self.bad(format!("{what} is too long")))?;
        self.inner
            .seek_relative(offset)
            .map_err(|_| self.truncated(format!("cannot skip {what}")))?;
        self.position += n;
        Ok(())
    }

    /// A string of at most `keep` bytes, or `None` (skipped) when longer but in the file.
    fn string(&mut self, keep: u64, what: &str) -> Result<Result<String, u64>, GgufError> {
        let len = self.u64(what)?;
        if len > self.left() {
            return Err(self.truncated(format!(
                "{what} declares {len} bytes, {} are left",
                self.left()
            )));
        }
        if len > keep {
            self.skip(len, what)?;
            return Ok(Err(len));
        }
        let mut buf = Vec::new();
        (&mut self.inner)
            .take(len)
            .read_to_end(&mut buf)
            .map_err(|_| self.truncated(format!("the file ends inside {what}")))?;
        self.position += len;
        String::from_utf8(buf)
            .map(Ok)
            .map_err(|_| self.bad(format!("{what} is not UTF-8")))
    }

    fn name(&mut self, what: &str) -> Result<String, GgufError> {
        match self.string(MAX_NAME_BYTES, what)? {
            Ok(text) => Ok(text),
            Err(len) => Err(self.bad(format!(
                "{what} is {len} bytes long (limit {MAX_NAME_BYTES})"
            ))),
        }
    }

    /// One value of `value_type`; arrays are skipped element by element only where the
    /// element has a variable size (strings, arrays), else in one seek.
    fn value(&mut self, value_type: u32, depth: u32, what: &str) -> Result<Value, GgufError> {
        let fixed = |t: u32| match t {
            0 | 1 | 7 => Some(1),
            2 | 3 => Some(2),
            4..=6 => Some(4),
            10..=12 => Some(8),
            _ => None,
        };
        Ok(match value_type {
            0 => Value::Uint(u64::from(self.bytes::<1>(what)?[0])),
            1 => Value::Int(i64::from(i8::from_le_bytes(self.bytes::<1>(what)?))),
            2 => Value::Uint(u64::from(u16::from_le_bytes(self.bytes::<2>(what)?))),
            3 => Value::Int(i64::from(i16::from_le_bytes(self.bytes::<2>(what)?))),
            4 => Value::Uint(u64::from(self.u32(what)?)),
            5 => Value::Int(i64::from(i32::from_le_bytes(self.bytes::<4>(what)?))),
            6 => Value::Float(f64::from(f32::from_le_bytes(self.bytes::<4>(what)?))),
            7 => Value::Bool(self.bytes::<1>(what)?[0] != 0),
            8 => match self.string(MAX_KEPT_STRING_BYTES, what)? {
                Ok(text) => Value::Text(text),
                Err(length) => Value::Skipped { length },
            },
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(
                        self.bad(format!("{what} nests arrays deeper than {MAX_ARRAY_DEPTH}"))
                    );
                }
                let element = self.u32(what)?;
                let length = self.u64(what)?;
                if let Some(size) = fixed(element) {
                    let total = length
                        .checked_mul(size)
                        .ok_or_else(|| self.bad(format!("{what} is too long")))?;
                    self.skip(total, what)?;
                } else if element == 8 || element == 9 {
                    // Every element takes at least 8 bytes (its length): a count the file
                    // cannot hold is refused before the loop.
                    if length > self.left() / 8 {
                        return Err(self.truncated(format!("{what} declares {length} elements")));
                    }
                    for _ in 0..length {
                        self.value(element, depth + 1, what)?;
                    }
                } else {
                    return Err(self.bad(format!("{what} has unknown element type {element}")));
                }
                Value::Skipped { length }
            }
            10 => Value::Uint(self.u64(what)?),
            11 => Value::Int(i64::from_le_bytes(self.bytes::<8>(what)?)),
            12 => Value::Float(f64::from_le_bytes(self.bytes::<8>(what)?)),
            other => return Err(self.bad(format!("{what} has unknown value type {other}"))),
        })
    }
}

/// Reads a `.gguf` file's metadata and tensor table.
///
/// # Errors
/// Unreadable, wrong magic, unsupported version, truncated, or over a limit.
pub fn read_file(path: &Path) -> Result<GgufInfo, GgufError> {
    let io = |source| GgufError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut r = Reader {
        inner: BufReader::new(file),
        position: 0,
        len,
        path: path.to_owned(),
    };
    let magic = r.bytes::<4>("the magic").map_err(|_| GgufError::Magic {
        path: path.to_owned(),
    })?;
    if &magic != b"GGUF" {
        return Err(GgufError::Magic {
            path: path.to_owned(),
        });
    }
    let version = r.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::Version {
            path: path.to_owned(),
            version,
        });
    }
    let tensor_count = r.u64("the tensor count")?;
    let kv_count = r.u64("the key-value count")?;
    if tensor_count > MAX_TENSORS {
        return Err(r.bad(format!(
            "it declares {tensor_count} tensors (limit {MAX_TENSORS})"
        )));
    }
    if kv_count > MAX_KEY_VALUES {
        return Err(r.bad(format!(
            "it declares {kv_count} key-values (limit {MAX_KEY_VALUES})"
        )));
    }
    let mut metadata = BTreeMap::new();
    for i in 0..kv_count {
        let key = r.name(&format!("key {i}"))?;
        let value_type = r.u32(&format!("the type of '{key}'"))?;
        let value = r.value(value_type, 0, &format!("the value of '{key}'"))?;
        metadata.insert(key, value);
    }
    let mut weights = WeightsInfo {
        files: 1,
        ..WeightsInfo::default()
    };
    let mut embedding_rows = None;
    let mut has_output_tensor = false;
    for i in 0..tensor_count {
        let name = r.name(&format!("the name of tensor {i}"))?;
        let n_dims = r.u32(&format!("the dimensions of '{name}'"))?;
        if n_dims > MAX_DIMS {
            return Err(r.bad(format!(
                "tensor '{name}' has {n_dims} dimensions (limit {MAX_DIMS})"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(r.u64(&format!("the shape of '{name}'"))?);
        }
        let ggml_type = r.u32(&format!("the type of '{name}'"))?;
        let _offset = r.u64(&format!("the offset of '{name}'"))?;
        let elements = dims
            .iter()
            .try_fold(1_u64, |acc, d| acc.checked_mul(*d))
            .ok_or_else(|| r.bad(format!("tensor '{name}' has a shape too large")))?;
        let (type_name, block, block_bytes) = type_size(ggml_type)
            .ok_or_else(|| r.bad(format!("tensor '{name}' has unknown ggml type {ggml_type}")))?;
        if elements % block != 0 {
            return Err(r.bad(format!(
                "tensor '{name}' has {elements} elements, not whole {type_name} blocks of {block}"
            )));
        }
        let bytes = (elements / block)
            .checked_mul(block_bytes)
            .ok_or_else(|| r.bad(format!("tensor '{name}' is too large")))?;
        if name == "token_embd.weight" {
            embedding_rows = dims.get(1).copied();
        }
        if name == "output.weight" {
            has_output_tensor = true;
        }
        weights.add(type_name, elements, bytes);
    }
    Ok(GgufInfo {
        version,
        metadata,
        weights,
        embedding_rows,
        has_output_tensor,
    })
}

impl GgufInfo {
    fn meta_u64(&self, key: &str) -> Option<u64> {
        self.metadata
            .get(key)
            .and_then(Value::as_u64)
            .filter(|v| *v > 0)
    }

    /// `general.architecture`.
    pub fn architecture_name(&self) -> Option<&str> {
        match self.metadata.get("general.architecture") {
            Some(Value::Text(name)) => Some(name),
            _ => None,
        }
    }

    /// The architecture from `{arch}.*` keys, for the families this crate models.
    /// `Err` holds what is missing, for the caller's message.
    pub fn architecture(&self) -> Result<Architecture, String> {
        let name = self
            .architecture_name()
            .ok_or_else(|| "it has no 'general.architecture'".to_owned())?;
        let experts = self.meta_u64(&format!("{name}.expert_count"));
        let family = match (name, experts) {
            ("llama", Some(_)) => Family::Mixtral,
            ("qwen2moe", _) => Family::Qwen2Moe,
            // The families added for config.json (issue 34) have GGUF metadata of their
            // own shape (fused QKV, MLA ranks, expert strides) that is not read here.
            (other, _) => Family::from_model_type(other)
                .filter(|f| GGUF_FAMILIES.contains(f))
                .ok_or_else(|| {
                    format!(
                        "its architecture '{other}' is not modelled from GGUF metadata (supported: {})",
                        GGUF_FAMILIES.map(Family::model_type).join(", ")
                    )
                })?,
        };
        let key = |suffix: &str| format!("{name}.{suffix}");
        let need = |suffix: &str| {
            self.meta_u64(&key(suffix))
                .ok_or_else(|| format!("it has no '{}'", key(suffix)))
        };
        let hidden = need("embedding_length")?;
        let heads = need("attention.head_count")?;
        let kv_heads = self
            .meta_u64(&key("attention.head_count_kv"))
            .unwrap_or(heads);
        let head_dim = self
            .meta_u64(&key("attention.key_length"))
            .unwrap_or(hidden / heads.max(1));
        let vocab = self
            .meta_u64(&key("vocab_size"))
            .or(match self.metadata.get("tokenizer.ggml.tokens") {
                Some(Value::Skipped { length }) => Some(*length),
                _ => None,
            })
            .or(self.embedding_rows)
            .ok_or_else(|| "it says nothing of the vocabulary".to_owned())?;
        let moe = match experts {
            Some(experts) => Some(Moe {
                experts,
                top_k: self.meta_u64(&key("expert_used_count")).unwrap_or(2),
                expert_intermediate: self
                    .meta_u64(&key("expert_feed_forward_length"))
                    .map_or_else(|| need("feed_forward_length"), Ok)?,
                shared_expert_intermediate: self
                    .meta_u64(&key("expert_shared_feed_forward_length"))
                    .unwrap_or(0),
                dense_layers: 0,
                shared_expert_gate: family == Family::Qwen2Moe,
            }),
            None => None,
        };
        let plain = matches!(family, Family::Gpt2 | Family::Bert | Family::T5);
        let architecture = Architecture {
            family,
            layers: need("block_count")?,
            decoder_layers: 0,
            hidden,
            intermediate: self
                .meta_u64(&key("feed_forward_length"))
                .or(moe.map(|m| m.expert_intermediate))
                .ok_or_else(|| format!("it has no '{}'", key("feed_forward_length")))?,
            heads,
            kv_heads,
            head_dim,
            vocab,
            tied_embeddings: !self.has_output_tensor,
            moe,
            max_positions: self.meta_u64(&key("context_length")),
            learned_positions: matches!(family, Family::Gpt2 | Family::Bert),
            norm: if plain {
                Norm::LayerNorm
            } else {
                Norm::RmsNorm
            },
            norms_per_layer: if family == Family::Gemma2 { 4 } else { 2 },
            norms_share_input: false,
            mlp: if plain { Mlp::Plain } else { Mlp::Gated },
            activation: if plain { "gelu" } else { "silu" }.to_owned(),
            linear_bias: plain,
            qkv_bias: matches!(family, Family::Qwen2 | Family::Qwen2Moe),
            qk_norm: family == Family::Qwen3,
            hidden_dropout: false,
            attention_dropout: false,
            dtype: None,
            sliding_window: None,
            mla: None,
            rotary_dims: None,
        };
        crate::hf_config::check(&architecture).map_err(|e| format!("its metadata: {e}"))?;
        Ok(architecture)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gguf_string(out: &mut Vec<u8>, text: &str) {
        out.extend_from_slice(&(text.len() as u64).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }

    fn header(tensors: u64, kvs: u64) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3_u32.to_le_bytes());
        out.extend_from_slice(&tensors.to_le_bytes());
        out.extend_from_slice(&kvs.to_le_bytes());
        out
    }

    fn read(bytes: &[u8]) -> Result<GgufInfo, GgufError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.gguf");
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(bytes))
            .expect("write");
        read_file(&path)
    }

    #[test]
    fn a_hand_written_file_gives_its_metadata_and_tensor_sizes() {
        let mut bytes = header(2, 2);
        gguf_string(&mut bytes, "general.architecture");
        bytes.extend_from_slice(&8_u32.to_le_bytes());
        gguf_string(&mut bytes, "llama");
        gguf_string(&mut bytes, "llama.block_count");
        bytes.extend_from_slice(&4_u32.to_le_bytes());
        bytes.extend_from_slice(&2_u32.to_le_bytes());
        for (name, dims, ggml_type) in [("a", [64_u64, 4], 8_u32), ("b", [64, 1], 0)] {
            gguf_string(&mut bytes, name);
            bytes.extend_from_slice(&2_u32.to_le_bytes());
            for d in dims {
                bytes.extend_from_slice(&d.to_le_bytes());
            }
            bytes.extend_from_slice(&ggml_type.to_le_bytes());
            bytes.extend_from_slice(&0_u64.to_le_bytes());
        }
        let info = read(&bytes).expect("read");
        assert_eq!(info.architecture_name(), Some("llama"));
        assert_eq!(info.metadata["llama.block_count"], Value::Uint(2));
        assert_eq!(info.weights.params, 256 + 64);
        // Q8_0: 8 blocks of 32 at 34 bytes; F32: 64 × 4.
        assert_eq!(info.weights.by_dtype["Q8_0"].bytes, 8 * 34);
        assert_eq!(info.weights.by_dtype["F32"].bytes, 256);
    }

    /// A GGUF's `{arch}.*` sizes went into the parameter count unchecked: a block count of
    /// 2^62 overflowed it.
    #[test]
    fn hostile_architecture_metadata_is_refused_not_counted() {
        let mut bytes = header(0, 5);
        gguf_string(&mut bytes, "general.architecture");
        bytes.extend_from_slice(&8_u32.to_le_bytes());
        gguf_string(&mut bytes, "llama");
        for (key, value) in [
            ("llama.block_count", 1_u64 << 62),
            ("llama.embedding_length", 4096),
            ("llama.attention.head_count", 32),
            ("llama.feed_forward_length", 11008),
        ] {
            gguf_string(&mut bytes, key);
            bytes.extend_from_slice(&10_u32.to_le_bytes());
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        let info = read(&bytes).expect("the file itself is well formed");
        let info = GgufInfo {
            embedding_rows: Some(32_000),
            ..info
        };
        let err = info.architecture().unwrap_err();
        assert!(
            err.contains("'num_hidden_layers' is 4611686018427387904"),
            "{err}"
        );
    }

    #[test]
    fn wrong_magic_and_versions_are_named() {
        assert!(matches!(
            read(b"GGML\x03\0\0\0").unwrap_err(),
            GgufError::Magic { .. }
        ));
        assert!(matches!(read(b"GG").unwrap_err(), GgufError::Magic { .. }));
        let mut v1 = b"GGUF".to_vec();
        v1.extend_from_slice(&1_u32.to_le_bytes());
        assert!(matches!(
            read(&v1).unwrap_err(),
            GgufError::Version { version: 1, .. }
        ));
    }

    #[test]
    fn hostile_counts_and_lengths_are_refused_before_allocating() {
        assert!(matches!(
            read(&header(u64::MAX, 0)).unwrap_err(),
            GgufError::Bad { .. }
        ));
        assert!(matches!(
            read(&header(0, u64::MAX)).unwrap_err(),
            GgufError::Bad { .. }
        ));
        // A key declaring 2^63 bytes.
        let mut bytes = header(0, 1);
        bytes.extend_from_slice(&(1_u64 << 63).to_le_bytes());
        assert!(matches!(
            read(&bytes).unwrap_err(),
            GgufError::Truncated { .. }
        ));
        // A string array of 2^60 elements in a tiny file.
        let mut bytes = header(0, 1);
        gguf_string(&mut bytes, "tokenizer.ggml.tokens");
        bytes.extend_from_slice(&9_u32.to_le_bytes());
        bytes.extend_from_slice(&8_u32.to_le_bytes());
        bytes.extend_from_slice(&(1_u64 << 60).to_le_bytes());
        assert!(matches!(
            read(&bytes).unwrap_err(),
            GgufError::Truncated { .. }
        ));
        // A u32 array whose byte length overflows.
        let mut bytes = header(0, 1);
        gguf_string(&mut bytes, "x");
        bytes.extend_from_slice(&9_u32.to_le_bytes());
        bytes.extend_from_slice(&4_u32.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(read(&bytes).is_err());
        // Truncated in the middle of the counts.
        assert!(matches!(
            read(&header(1, 1)[..14]).unwrap_err(),
            GgufError::Truncated { .. }
        ));
    }

    #[test]
    fn a_tensor_with_a_shape_that_overflows_or_an_unknown_type_is_damaged() {
        let mut bytes = header(1, 0);
        gguf_string(&mut bytes, "t");
        bytes.extend_from_slice(&2_u32.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend_from_slice(&0_u32.to_le_bytes());
        bytes.extend_from_slice(&0_u64.to_le_bytes());
        assert!(matches!(read(&bytes).unwrap_err(), GgufError::Bad { .. }));
        let mut bytes = header(1, 0);
        gguf_string(&mut bytes, "t");
        bytes.extend_from_slice(&1_u32.to_le_bytes());
        bytes.extend_from_slice(&32_u64.to_le_bytes());
        bytes.extend_from_slice(&999_u32.to_le_bytes());
        bytes.extend_from_slice(&0_u64.to_le_bytes());
        let err = read(&bytes).unwrap_err();
        assert!(err.to_string().contains("unknown ggml type 999"), "{err}");
    }
}
