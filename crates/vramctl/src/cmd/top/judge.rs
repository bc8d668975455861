//! Verdicts at `top --replay`'s cursor.
//!
//! A replay's cursor jumps both ways, so a live tracker fed in order does not fit; instead
//! each moment gets what `vramctl leaks` says of the recording over the span before it:
//! the same one-pass store scan (`cmd/leaks/scan.rs`) and batch analysis, over
//! `[cursor − span, cursor]`. Cost grows with the span and the number of series (about
//! 25–40 ms for an hour of 8 GPUs × 30 processes at 1 s, `docs/benchmarks.md`), on the
//! replay thread; the span is an hour, or `--idle-for` plus ten minutes when that is longer
//! (an idle holder needs its whole idle time in view).

use std::collections::HashMap;
use std::path::Path;

use vramctl::tui::observe::Observation;
use vramctl::tui::verdict::{ReplayJudge, Verdicts, verdict_of};
use vramctl_core::analysis::LeakConfig;
use vramctl_store::{OpenMode, Store, TimeRange};

use crate::cmd::leaks::{Finding, analyse};

/// Least span of recording analysed before the cursor.
const MIN_SPAN_MS: i64 = 3_600_000;
/// Added to `--idle-for` for the span.
const IDLE_MARGIN_MS: i64 = 600_000;

/// The batch analysis of a recording, at a replay's cursor.
pub struct StoreJudge {
    store: Store,
    cfg: LeakConfig,
    span_ms: i64,
    warned: bool,
}

impl StoreJudge {
    /// Opens `path` read-only (its own handle: the replay thread's source keeps its own).
    ///
    /// # Errors
    /// When the database cannot be opened.
    pub fn open(path: &Path, cfg: LeakConfig) -> anyhow::Result<Self> {
        let idle_ms = i64::try_from(cfg.idle_for.as_millis()).unwrap_or(i64::MAX);
        Ok(Self {
            store: Store::open(path, OpenMode::ReadOnly)?,
            span_ms: idle_ms.saturating_add(IDLE_MARGIN_MS).max(MIN_SPAN_MS),
            cfg,
            warned: false,
        })
    }

    fn findings(&mut self, to_ms: i64) -> anyhow::Result<Vec<Finding>> {
        let devices = self.store.devices()?;
        let range = TimeRange {
            from_ms: to_ms.saturating_sub(self.span_ms),
            to_ms,
        };
        analyse(&mut self.store, range, &devices, &[], &self.cfg)
    }
}

impl ReplayJudge for StoreJudge {
    fn judge_at(&mut self, observation: &Observation) -> Verdicts {
        match self.findings(observation.taken_at_unix_ms()) {
            Ok(findings) => verdicts_at(observation, &findings),
            Err(err) => {
                if !self.warned {
                    self.warned = true;
                    tracing::warn!(error = %format!("{err:#}"), "No verdicts in this replay.");
                }
                Verdicts::default()
            }
        }
    }
}

/// The findings of the processes on screen, by PID and GPU: for each, the series of the
/// same process (its start time, when both know it), the one seen last when several.
fn verdicts_at(observation: &Observation, findings: &[Finding]) -> Verdicts {
    let mut best: HashMap<(u32, String), &Finding> = HashMap::new();
    for finding in findings {
        let Some(process) = &finding.process else {
            continue;
        };
        let key = &process.meta.key;
        let shown = observation
            .hosts
            .get(&key.pid)
            .and_then(|h| h.start_time_ticks);
        if shown
            .zip(key.start_time_ticks)
            .is_some_and(|(shown, stored)| shown != stored)
        {
            continue;
        }
        // Rows are per GPU: a process on a MIG instance is shown on its GPU.
        let meta = &finding.device.meta;
        let uuid = meta
            .parent_uuid
            .clone()
            .unwrap_or_else(|| meta.uuid.clone());
        best.entry((key.pid, uuid))
            .and_modify(|f| {
                if finding.report.last_unix_ms > f.report.last_unix_ms {
                    *f = finding;
                }
            })
            .or_insert(finding);
    }
    let mut verdicts = Verdicts::default();
    for ((pid, uuid), finding) in best {
        verdicts.insert(pid, &uuid, verdict_of(&finding.report));
    }
    verdicts
}
