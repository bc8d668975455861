//! The recordings a labeled set is scored on, and where the labeled H200 leak set lives.
//!
//! A source is named and is one of:
//! - `NAME=db:PATH`: a history database (`vramctl record`);
//! - `NAME=files:PATH[,PATH…]`: log files `vramctl leaks` reads (nvidia-smi
//!   `--query-compute-apps` / `--query-gpu` CSV, vramctl NDJSON, GPU-Z logs), through its
//!   importers into an in-memory store;
//! - `NAME=thin:MS:OTHER`: the source `OTHER` as a recorder sampling every `MS` ms would
//!   have recorded it ([`super::replay::thin`]), written to a temporary database.
//!
//! Paths ending in `.gz` are decompressed into a temporary directory first.
//!
//! The leak set of issue 13 (`--leakset DIR`, `scripts/record-leakset-h200.sh`'s output,
//! kept in `testdata/h200/leakset/`): one recording of all 26 workloads side by side, the
//! halves told apart by their labels (`half` in `labels.jsonl`), so both halves share one
//! GPU, one recorder and one clock. Its sources: `100ms` (`leakset-100ms.db`), `1s-thin`
//! and `10s-thin` (the 100 ms recording thinned), `10s` (`leakset-10s.db`, a real 10 s
//! recorder) and `smi-1s` (`smi-apps.csv` + `smi-gpu.csv`, `nvidia-smi -l 1`); each file
//! may be gzip'd.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use jiff::tz::TimeZone;
use vramctl_store::Store;
use vramctl_store::format::{ImportOptions, import_files};

use super::batch::Input;
use super::replay::{Recording, thin};

/// How a source is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    Db(PathBuf),
    Files(Vec<PathBuf>),
    Thin { interval_ms: i64, of: String },
}

/// A named source as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSpec {
    pub name: String,
    pub spec: Spec,
}

/// Parses `NAME=db:PATH`, `NAME=files:PATH,PATH` or `NAME=thin:MS:OTHER`.
///
/// # Errors
/// Anything else, with the text.
pub fn parse_spec(text: &str) -> anyhow::Result<SourceSpec> {
    let usage = || {
        anyhow!(
            "source '{text}' is not NAME=db:PATH, NAME=files:PATH[,PATH...] or NAME=thin:MS:OTHER"
        )
    };
    let (name, rest) = text.split_once('=').ok_or_else(usage)?;
    let (kind, arg) = rest.split_once(':').ok_or_else(usage)?;
    if name.is_empty() || arg.is_empty() {
        return Err(usage());
    }
    let spec = match kind {
        "db" => Spec::Db(PathBuf::from(arg)),
        "files" => Spec::Files(arg.split(',').map(PathBuf::from).collect()),
        "thin" => {
            let (ms, of) = arg.split_once(':').ok_or_else(usage)?;
            let interval_ms: i64 = ms
                .parse()
                .map_err(|_| anyhow!("source '{text}': '{ms}' is not a number of milliseconds"))?;
            if interval_ms <= 0 {
                bail!("source '{text}': the interval must be positive");
            }
            Spec::Thin {
                interval_ms,
                of: of.to_owned(),
            }
        }
        _ => return Err(usage()),
    };
    Ok(SourceSpec {
        name: name.to_owned(),
        spec,
    })
}

/// The labels and sources of a leak-set directory (see the module docs). Files that are
/// not there leave their source out, with a note.
///
/// # Errors
/// When the directory has no `labels.jsonl` (plain or gzip'd).
pub fn leakset(dir: &Path) -> anyhow::Result<(PathBuf, Vec<SourceSpec>, Vec<String>)> {
    let find = |name: &str| {
        [dir.join(name), dir.join(format!("{name}.gz"))]
            .into_iter()
            .find(|p| p.is_file())
    };
    let labels = find("labels.jsonl").ok_or_else(|| {
        anyhow!(
            "no labels.jsonl in '{}'; a leak set is what scripts/record-leakset-h200.sh writes",
            dir.display()
        )
    })?;
    let mut specs = Vec::new();
    let mut notes = Vec::new();
    match find("leakset-100ms.db") {
        Some(p) => {
            specs.push(SourceSpec {
                name: "100ms".into(),
                spec: Spec::Db(p),
            });
            for (name, ms) in [("1s-thin", 1_000), ("10s-thin", 10_000)] {
                specs.push(SourceSpec {
                    name: name.into(),
                    spec: Spec::Thin {
                        interval_ms: ms,
                        of: "100ms".into(),
                    },
                });
            }
        }
        None => notes.push("no leakset-100ms.db: no 100ms, 1s-thin, 10s-thin".to_owned()),
    }
    match find("leakset-10s.db") {
        Some(p) => specs.push(SourceSpec {
            name: "10s".into(),
            spec: Spec::Db(p),
        }),
        None => notes.push("no leakset-10s.db: no 10s".to_owned()),
    }
    match (find("smi-apps.csv"), find("smi-gpu.csv")) {
        (Some(apps), gpu) => {
            if gpu.is_none() {
                notes.push("no smi-gpu.csv: smi-1s has no device totals".to_owned());
            }
            specs.push(SourceSpec {
                name: "smi-1s".into(),
                spec: Spec::Files(std::iter::once(apps).chain(gpu).collect()),
            });
        }
        (None, _) => notes.push("no smi-apps.csv: no smi-1s".to_owned()),
    }
    Ok((labels, specs, notes))
}

/// A source ready to be read by both paths.
#[derive(Debug, Clone)]
pub struct Source {
    pub name: String,
    /// What it is, for the report.
    pub what: String,
    /// What `vramctl leaks` reads.
    pub input: Input,
}

/// Where decompressed and thinned files go, and how logs are read.
pub struct Workspace {
    dir: tempfile::TempDir,
    pub tz: TimeZone,
}

impl Workspace {
    /// A fresh temporary directory.
    ///
    /// # Errors
    /// When it cannot be made.
    pub fn new(tz: TimeZone) -> anyhow::Result<Self> {
        Ok(Self {
            dir: tempfile::Builder::new()
                .prefix("evaluate-leakset-")
                .tempdir()
                .context("cannot make a temporary directory")?,
            tz,
        })
    }

    /// `path` itself, or for `x.gz` the decompressed `x` in the workspace (under
    /// `prefix`, so two sources' files do not collide).
    ///
    /// # Errors
    /// When it cannot be read or written.
    pub fn plain(&self, path: &Path, prefix: &str) -> anyhow::Result<PathBuf> {
        if path.extension().is_none_or(|e| e != "gz") {
            return Ok(path.to_path_buf());
        }
        let stem = path
            .file_stem()
            .ok_or_else(|| anyhow!("'{}' has no file name", path.display()))?;
        let out = self
            .dir
            .path()
            .join(format!("{prefix}-{}", stem.to_string_lossy()));
        let file = std::fs::File::open(path)
            .with_context(|| format!("cannot read '{}'", path.display()))?;
        let mut bytes = Vec::new();
        flate2::read::GzDecoder::new(file)
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot decompress '{}'", path.display()))?;
        std::fs::write(&out, bytes).with_context(|| format!("cannot write '{}'", out.display()))?;
        Ok(out)
    }

    /// Makes every source of `specs` (in order: a thinned source names an earlier one).
    ///
    /// # Errors
    /// A source that cannot be read or made.
    pub fn sources(&self, specs: &[SourceSpec]) -> anyhow::Result<Vec<Source>> {
        let mut out: Vec<Source> = Vec::new();
        for s in specs {
            if out.iter().any(|o| o.name == s.name) {
                bail!("two sources are named '{}'", s.name);
            }
            let source = match &s.spec {
                Spec::Db(p) => Source {
                    name: s.name.clone(),
                    what: format!("history database {}", p.display()),
                    input: Input::Db(self.plain(p, &s.name)?),
                },
                Spec::Files(files) => Source {
                    name: s.name.clone(),
                    what: format!(
                        "log files {}",
                        files
                            .iter()
                            .map(|f| f.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    input: Input::Files(
                        files
                            .iter()
                            .map(|f| self.plain(f, &s.name))
                            .collect::<anyhow::Result<_>>()?,
                    ),
                },
                Spec::Thin { interval_ms, of } => {
                    let base = out
                        .iter()
                        .find(|o| &o.name == of)
                        .ok_or_else(|| {
                            anyhow!(
                                "source '{}' thins '{of}', which is not named before it",
                                s.name
                            )
                        })?
                        .clone();
                    let dst = self.dir.path().join(format!("{}.db", s.name));
                    let mut rec = self.recording(&base.input)?;
                    let kept = thin(&mut rec, &dst, *interval_ms)?;
                    Source {
                        name: s.name.clone(),
                        what: format!(
                            "'{of}' thinned to {interval_ms} ms ({} of {} ticks)",
                            kept.kept_ticks, kept.source_ticks
                        ),
                        input: Input::Db(dst),
                    }
                }
            };
            out.push(source);
        }
        Ok(out)
    }

    /// The recording of `input` for the live path: the database read-only, or the files
    /// read into an in-memory store by the importers `vramctl leaks` uses (strict: a bad
    /// row stops it, as it stops `leaks`).
    ///
    /// # Errors
    /// When it cannot be read.
    pub fn recording(&self, input: &Input) -> anyhow::Result<Recording> {
        match input {
            Input::Db(p) => Recording::open(p),
            Input::Files(files) => {
                let mut store = Store::open_in_memory()?;
                let options = ImportOptions {
                    strict: true,
                    tz: self.tz.clone(),
                    ..ImportOptions::default()
                };
                import_files(&mut store, files, &options).context("cannot import the logs")?;
                Recording::new(store)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_specs_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_spec("100ms=db:a.db").unwrap(),
            SourceSpec {
                name: "100ms".into(),
                spec: Spec::Db("a.db".into())
            }
        );
        assert_eq!(
            parse_spec("smi=files:a.csv,b.csv").unwrap().spec,
            Spec::Files(vec!["a.csv".into(), "b.csv".into()])
        );
        assert_eq!(
            parse_spec("1s=thin:1000:100ms").unwrap().spec,
            Spec::Thin {
                interval_ms: 1000,
                of: "100ms".into()
            }
        );
        for bad in ["x", "x=y", "x=db:", "x=thin:0:y", "x=thin:1s:y", "=db:a"] {
            let err = parse_spec(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("'{bad}'")), "{err}");
        }
    }
}
