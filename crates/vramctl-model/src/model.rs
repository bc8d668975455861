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
    #[error("cannot read '{path}': {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("'{path}': {source}")]
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
