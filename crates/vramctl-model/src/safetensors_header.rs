//! `.safetensors` headers and `model.safetensors.index.json` shards → parameter count and
//! bytes per dtype. A file is an 8-byte little-endian header length, that many bytes of
//! JSON, then the tensors' bytes; only the first two are read. The `safetensors` crate's
//! `Metadata` parses and validates the JSON (offsets contiguous, each tensor's size its
//! shape times its dtype); we check that the offsets end where the file does.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// The same bound the `safetensors` crate applies (`MAX_HEADER_SIZE`); real headers of
/// models with thousands of tensors are a few MB.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// An index larger than this is not an index (a 405B model's is about 100 KB).
pub const MAX_INDEX_BYTES: u64 = 64 * 1024 * 1024;

/// More shards than this is not a model anyone ships.
pub const MAX_SHARDS: usize = 10_000;

/// Parameters and bytes of one dtype.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DtypeCount {
    pub params: u64,
    pub bytes: u64,
}

/// What the headers say about the weights.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WeightsInfo {
    pub params: u64,
    pub bytes: u64,
    /// By the format's dtype name (`BF16`, `F32`, `Q4_K`, ...).
    pub by_dtype: BTreeMap<String, DtypeCount>,
    pub tensors: u64,
    pub files: u64,
}

impl WeightsInfo {
    pub(crate) fn add(&mut self, dtype: &str, params: u64, bytes: u64) {
        self.params = self.params.saturating_add(params);
        self.bytes = self.bytes.saturating_add(bytes);
        self.tensors += 1;
        let entry = self.by_dtype.entry(dtype.to_owned()).or_default();
        entry.params = entry.params.saturating_add(params);
        entry.bytes = entry.bytes.saturating_add(bytes);
    }

    fn merge(&mut self, other: WeightsInfo) {
        self.params = self.params.saturating_add(other.params);
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.tensors += other.tensors;
        self.files += other.files;
        for (dtype, count) in other.by_dtype {
            let entry = self.by_dtype.entry(dtype).or_default();
            entry.params = entry.params.saturating_add(count.params);
            entry.bytes = entry.bytes.saturating_add(count.bytes);
        }
    }
}

/// Why a header could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SafetensorsError {
    #[error("cannot read '{path}'")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "'{path}' is too short for a safetensors header ({len} bytes); is it a safetensors file?"
    )]
    TooShort { path: PathBuf, len: u64 },
    #[error(
        "'{path}' declares a {declared}-byte header, more than the {MAX_HEADER_BYTES} allowed; \
         the file is damaged or not safetensors"
    )]
    HeaderTooLarge { path: PathBuf, declared: u64 },
    #[error("'{path}' is truncated: its header needs {needed} bytes, the file has {len}")]
    Truncated {
        path: PathBuf,
        needed: u64,
        len: u64,
    },
    #[error("'{path}' has a bad header: {reason}")]
    BadHeader { path: PathBuf, reason: String },
    #[error("'{path}' is a bad index: {reason}")]
    BadIndex { path: PathBuf, reason: String },
}

/// Reads one `.safetensors` file's header.
///
/// # Errors
/// The file cannot be read, is short, truncated, declares a huge header, or its JSON is
/// not a valid safetensors header.
pub fn read_file(path: &Path) -> Result<WeightsInfo, SafetensorsError> {
    let io = |source| SafetensorsError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len < 8 {
        return Err(SafetensorsError::TooShort {
            path: path.to_owned(),
            len,
        });
    }
    let mut reader = std::io::BufReader::new(file);
    let mut prefix = [0_u8; 8];
    reader.read_exact(&mut prefix).map_err(io)?;
    let declared = u64::from_le_bytes(prefix);
    if declared > MAX_HEADER_BYTES {
        return Err(SafetensorsError::HeaderTooLarge {
            path: path.to_owned(),
            declared,
        });
    }
    if declared > len - 8 {
        return Err(SafetensorsError::Truncated {
            path: path.to_owned(),
            needed: declared + 8,
            len,
        });
    }
    // Bounded above: at most MAX_HEADER_BYTES, and no more than the file holds.
    let mut header = Vec::new();
    reader.take(declared).read_to_end(&mut header).map_err(io)?;
    let bad = |reason: String| SafetensorsError::BadHeader {
        path: path.to_owned(),
        reason,
    };
    let metadata: safetensors::tensor::Metadata =
        serde_json::from_slice(&header).map_err(|e| bad(e.to_string()))?;
    let data_bytes = u64::try_from(metadata.data_len()).unwrap_or(u64::MAX);
    let expected = data_bytes.saturating_add(8 + declared);
    if expected != len {
        return Err(bad(format!(
            "its tensors end at byte {expected} but the file has {len}; the file is truncated or damaged"
        )));
    }
    let mut info = WeightsInfo {
        files: 1,
        ..WeightsInfo::default()
    };
    for tensor in metadata.tensors().values() {
        // Validated by Metadata: the products did not overflow usize.
        let elements: u64 = tensor
            .shape
            .iter()
            .map(|d| u64::try_from(*d).unwrap_or(u64::MAX))
            .fold(1, u64::saturating_mul);
        let bytes =
            u64::try_from(tensor.data_offsets.1 - tensor.data_offsets.0).unwrap_or(u64::MAX);
        info.add(&format!("{:?}", tensor.dtype), elements, bytes);
    }
    Ok(info)
}

#[derive(serde::Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

/// Reads `model.safetensors.index.json` and the header of every shard it names (each a
/// plain file name beside the index).
///
/// # Errors
/// The index is unreadable, too large, not an index, names a shard outside its directory
/// or too many; a shard's header fails as in [`read_file`].
pub fn read_index(path: &Path) -> Result<WeightsInfo, SafetensorsError> {
    let io = |source| SafetensorsError::Io {
        path: path.to_owned(),
        source,
    };
    let bad = |reason: String| SafetensorsError::BadIndex {
        path: path.to_owned(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut text = Vec::new();
    file.take(MAX_INDEX_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(io)?;
    if text.len() as u64 > MAX_INDEX_BYTES {
        return Err(bad(format!("larger than {MAX_INDEX_BYTES} bytes")));
    }
    let index: Index = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    let shards: std::collections::BTreeSet<&str> =
        index.weight_map.values().map(String::as_str).collect();
    if shards.is_empty() {
        return Err(bad("its weight_map names no shard".to_owned()));
    }
    if shards.len() > MAX_SHARDS {
        return Err(bad(format!(
            "it names {} shards, more than {MAX_SHARDS}",
            shards.len()
        )));
    }
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let mut total = WeightsInfo::default();
    for shard in shards {
        let plain = Path::new(shard)
            .file_name()
            .is_some_and(|name| name == std::ffi::OsStr::new(shard));
        if !plain || shard == ".." {
            return Err(bad(format!(
                "shard '{shard}' is not a file name beside the index"
            )));
        }
        total.merge(read_file(&dir.join(shard))?);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.join(name);
        let mut file = std::fs::File::create(&path).expect("create");
        file.write_all(bytes).expect("write");
        path
    }

    fn file_with(header: &str, data_len: usize) -> Vec<u8> {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend(std::iter::repeat_n(0_u8, data_len));
        bytes
    }

    #[test]
    fn a_hand_written_header_counts_params_and_bytes_per_dtype() {
        let dir = tempfile::tempdir().expect("tempdir");
        let header = r#"{"__metadata__":{"format":"pt"},
            "a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},
            "b":{"dtype":"F32","shape":[4],"data_offsets":[12,28]}}"#;
        let path = write(dir.path(), "m.safetensors", &file_with(header, 28));
        let info = read_file(&path).expect("read");
        assert_eq!(info.params, 10);
        assert_eq!(info.bytes, 28);
        assert_eq!(
            info.by_dtype["BF16"],
            DtypeCount {
                params: 6,
                bytes: 12
            }
        );
        assert_eq!(
            info.by_dtype["F32"],
            DtypeCount {
                params: 4,
                bytes: 16
            }
        );
    }

    #[test]
    fn a_huge_declared_header_is_refused_without_allocating_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut bytes = u64::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        let path = write(dir.path(), "huge.safetensors", &bytes);
        let err = read_file(&path).unwrap_err();
        assert!(
            matches!(err, SafetensorsError::HeaderTooLarge { .. }),
            "{err}"
        );
    }

    #[test]
    fn a_header_longer_than_the_file_is_truncated() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut bytes = 1000_u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        let path = write(dir.path(), "t.safetensors", &bytes);
        assert!(matches!(
            read_file(&path).unwrap_err(),
            SafetensorsError::Truncated {
                needed: 1008,
                len: 10,
                ..
            }
        ));
        let short = write(dir.path(), "s.safetensors", b"abc");
        assert!(matches!(
            read_file(&short).unwrap_err(),
            SafetensorsError::TooShort { .. }
        ));
    }

    #[test]
    fn bad_json_offsets_and_missing_data_are_bad_headers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cases = [
            (file_with("{not json", 0), "json"),
            (
                file_with(
                    r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}}"#,
                    8,
                ),
                "size mismatch",
            ),
            (
                file_with(
                    r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
                    4,
                ),
                "data missing",
            ),
            (
                file_with(
                    r#"{"a":{"dtype":"F32","shape":[18446744073709551615,18446744073709551615],"data_offsets":[0,16]}}"#,
                    16,
                ),
                "overflow",
            ),
        ];
        for (i, (bytes, what)) in cases.iter().enumerate() {
            let path = write(dir.path(), &format!("{i}.safetensors"), bytes);
            let err = read_file(&path).unwrap_err();
            assert!(
                matches!(err, SafetensorsError::BadHeader { .. }),
                "{what}: {err}"
            );
        }
    }

    #[test]
    fn an_index_may_not_name_shards_outside_its_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write(
            dir.path(),
            "model.safetensors.index.json",
            br#"{"metadata":{},"weight_map":{"a":"../../etc/passwd"}}"#,
        );
        let err = read_index(&path).unwrap_err();
        assert!(err.to_string().contains("'../../etc/passwd'"), "{err}");
    }
}
