//! The batch path: `vramctl leaks --json` itself, run on the recording (`--db`) or on log
//! files (read by its importers into an in-memory store), over everything up to a time
//! (`--since all --until T`). Run as a separate process, so the verdicts are exactly what
//! a user of that binary gets: the same store scan (`cmd/leaks/scan.rs`), process starts,
//! device labels and evidence.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, anyhow, bail};
use serde_json::Value;
use vramctl_store::format::rfc3339;

use super::live::{Change, SeriesId, verdict_named};

/// What `vramctl leaks` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// `--db PATH`.
    Db(PathBuf),
    /// `leaks FILE...`: nvidia-smi CSV, vramctl NDJSON, GPU-Z logs.
    Files(Vec<PathBuf>),
}

/// The binary and the settings every run gets.
#[derive(Debug, Clone)]
pub struct Vramctl {
    pub bin: PathBuf,
    /// `--idle-for`, as the CLI takes it (`60s`).
    pub idle_for: String,
    /// `--tz` for nvidia-smi's local times.
    pub tz: String,
}

/// One series of a `leaks --json` document.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub id: SeriesId,
    pub first_ms: i64,
    pub last_ms: i64,
    pub change: Change,
}

impl Vramctl {
    /// The binary beside this program (`target/<profile>/vramctl` for
    /// `target/<profile>/examples/evaluate_leakset`), unless `bin` names one.
    ///
    /// # Errors
    /// When there is none.
    pub fn locate(bin: Option<&Path>) -> anyhow::Result<PathBuf> {
        let path = match bin {
            Some(p) => p.to_path_buf(),
            None => {
                let exe = std::env::current_exe().context("cannot find this program's path")?;
                let dir = exe
                    .parent()
                    .and_then(Path::parent)
                    .ok_or_else(|| anyhow!("cannot find the target directory"))?;
                dir.join("vramctl")
            }
        };
        if !path.is_file() {
            bail!(
                "no vramctl binary at '{}'; build it with 'cargo build --release -p vramctl' or name one with --vramctl",
                path.display()
            );
        }
        Ok(path)
    }

    /// `vramctl leaks --json` over `input`, up to `until_ms` (everything when `None`).
    ///
    /// # Errors
    /// When the binary fails or prints something that is not its documented JSON.
    pub fn findings(&self, input: &Input, until_ms: Option<i64>) -> anyhow::Result<Vec<Finding>> {
        let mut cmd = Command::new(&self.bin);
        cmd.env_remove("VRAMCTL_DB").env("NO_COLOR", "1");
        match input {
            Input::Db(path) => {
                cmd.arg("--db").arg(path).arg("leaks");
            }
            Input::Files(files) => {
                cmd.arg("leaks").args(files);
            }
        }
        cmd.args(["--since", "all", "--json", "--idle-for", &self.idle_for]);
        cmd.args(["--tz", &self.tz]);
        if let Some(t) = until_ms {
            cmd.args(["--until", &rfc3339(t)]);
        }
        let output = cmd
            .output()
            .with_context(|| format!("cannot run '{}'", self.bin.display()))?;
        if !output.status.success() {
            bail!(
                "'vramctl leaks' failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let doc: Value = serde_json::from_slice(&output.stdout)
            .context("'vramctl leaks --json' printed something that is not JSON")?;
        parse(&doc)
    }

    /// The batch verdicts of `input` at each of `cutoffs` (stored tick times): what
    /// `vramctl leaks` run at that moment would have said. One timeline per series, its
    /// changes at the cutoffs where its verdict changed.
    ///
    /// # Errors
    /// As [`Vramctl::findings`].
    pub fn timelines(
        &self,
        input: &Input,
        cutoffs: &[i64],
    ) -> anyhow::Result<BTreeMap<SeriesId, super::live::Timeline>> {
        let mut out: BTreeMap<SeriesId, super::live::Timeline> = BTreeMap::new();
        for &t in cutoffs {
            for f in self.findings(input, Some(t))? {
                let timeline = out
                    .entry(f.id.clone())
                    .or_insert_with(|| super::live::Timeline {
                        first_ms: f.first_ms,
                        last_ms: f.last_ms,
                        changes: Vec::new(),
                        last_report: None,
                    });
                timeline.last_ms = f.last_ms;
                if timeline.changes.last().map(|c| c.verdict) != Some(f.change.verdict) {
                    timeline.changes.push(f.change);
                }
            }
        }
        Ok(out)
    }
}

/// The series of a `leaks --json` document (schema 1, `docs/json.md`); device series
/// (no PID) are left out.
///
/// # Errors
/// When the document is not that.
pub fn parse(doc: &Value) -> anyhow::Result<Vec<Finding>> {
    if doc.get("schema").and_then(Value::as_u64) != Some(1) {
        bail!("'vramctl leaks --json' wrote a schema other than 1");
    }
    let series = doc
        .get("series")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("no 'series' in the leaks document"))?;
    let mut out = Vec::with_capacity(series.len());
    for s in series {
        let Some(pid) = s.get("pid").and_then(Value::as_u64) else {
            continue;
        };
        let text = |name: &str| s.get(name).and_then(Value::as_str);
        let time = |name: &str| -> anyhow::Result<i64> {
            let v = text(name).ok_or_else(|| anyhow!("a series without '{name}'"))?;
            let ts: jiff::Timestamp = v
                .parse()
                .with_context(|| format!("'{name}' is not a time: '{v}'"))?;
            Ok(ts.as_millisecond())
        };
        let verdict = text("verdict")
            .and_then(verdict_named)
            .ok_or_else(|| anyhow!("a series without a known verdict"))?;
        let last_ms = time("last_sample")?;
        out.push(Finding {
            id: SeriesId {
                gpu_uuid: text("gpu_uuid").unwrap_or_default().to_owned(),
                pid: u32::try_from(pid).context("a PID out of range")?,
                start_time_ticks: s.get("start_time_ticks").and_then(Value::as_u64),
            },
            first_ms: time("first_sample")?,
            last_ms,
            change: Change {
                t_ms: last_ms,
                verdict,
                rule: text("rule").map(str::to_owned),
                checks: s.get("checks").cloned().unwrap_or_default(),
                explanation: text("explanation").unwrap_or_default().to_owned(),
            },
        });
    }
    Ok(out)
}
