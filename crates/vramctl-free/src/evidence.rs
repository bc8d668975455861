//! Where `reap`'s idle evidence comes from: the recorded history, analysed by the same scan
//! as `leaks` (`vramctl_history::leak_scan::analyse`), or `FleetTracker` fed by `reap --every` itself.
//!
//! History evidence counts for a process on a GPU when the history knows that process (same
//! boot, PID and start time) and its series reaches the present: its last sample is at most
//! [`FRESH`] old. Between that sample and now, the CPU-time counter bridges the gap: the
//! process's CPU time now is compared with the history's last reading.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use vramctl_leaks::analysis::{LeakConfig, SeriesReport};
use vramctl_store::TimeRange;

use vramctl_history::leak_scan::analyse;

/// Evidence older than this does not speak for now: the analysis's own limit between two
/// pieces of idle evidence (`LeakConfig::max_evidence_gap`).
pub const FRESH: Duration = Duration::from_secs(60);

/// One process's series on one GPU in the history.
#[derive(Debug, Clone)]
pub struct HistorySeries {
    /// Its start time as recorded (identity with the PID and the boot).
    pub start_time_ticks: Option<u64>,
    /// The boot it was recorded in.
    pub boot_id: Option<String>,
    /// The analysis.
    pub report: SeriesReport,
    /// The last recorded CPU time: `(unix ms, ms of CPU)`.
    pub last_cpu: Option<(i64, u64)>,
}

/// What the history had to say this round.
#[derive(Debug, Clone)]
pub struct History {
    /// The database read.
    pub database: PathBuf,
    /// Whether it exists.
    pub exists: bool,
    /// Its newest sample.
    pub last_sample_unix_ms: Option<i64>,
    /// By (GPU UUID, PID).
    pub series: HashMap<(String, u32), Vec<HistorySeries>>,
}

impl History {
    /// The series of the process `(pid, start)` of this boot on the GPU `uuid`, when it
    /// reaches `now` within [`FRESH`].
    pub fn find(
        &self,
        uuid: &str,
        pid: u32,
        start_time_ticks: Option<u64>,
        boot_id: Option<&str>,
        now_unix_ms: i64,
    ) -> Option<&HistorySeries> {
        let fresh_ms = i64::try_from(FRESH.as_millis()).unwrap_or(i64::MAX);
        self.series.get(&(uuid.to_owned(), pid))?.iter().find(|s| {
            start_time_ticks.is_some()
                && s.start_time_ticks == start_time_ticks
                && (s.boot_id.is_none() || boot_id.is_none() || s.boot_id.as_deref() == boot_id)
                && s.report.last_unix_ms >= now_unix_ms.saturating_sub(fresh_ms)
        })
    }

    /// Why a process has no history evidence, in words, for the plan.
    pub fn missing(&self, now_unix_ms: i64, time: &dyn Fn(i64) -> String) -> String {
        if !self.exists {
            return format!(
                "no history at '{}' (start `vramctl record` or `serve --record`)",
                self.database.display()
            );
        }
        match self.last_sample_unix_ms {
            None => format!("the history '{}' has no samples", self.database.display()),
            Some(t) if t < now_unix_ms - i64::try_from(FRESH.as_millis()).unwrap_or(0) => {
                format!(
                    "the history '{}' ends at {}, more than {} s ago (is the recorder running?)",
                    self.database.display(),
                    time(t),
                    FRESH.as_secs()
                )
            }
            Some(_) => "the history does not cover it up to now".to_owned(),
        }
    }
}

/// Reads the history at `path` over `[now - lookback, now]` for the processes `pids` (on
/// the GPUs now) and analyses each of their series.
///
/// # Errors
/// A database that exists but cannot be read (not ours, newer, damaged).
pub fn read_history(
    path: &Path,
    now_unix_ms: i64,
    lookback: Duration,
    pids: &[u32],
    cfg: &LeakConfig,
) -> anyhow::Result<History> {
    let mut history = History {
        database: path.to_owned(),
        exists: path.exists(),
        last_sample_unix_ms: None,
        series: HashMap::new(),
    };
    if !history.exists || pids.is_empty() {
        return Ok(history);
    }
    let mut store = vramctl_history::sample_source::open_history(path)
        .context("cannot read the history for idle evidence")?;
    let Some((_, last)) = store.time_bounds()? else {
        return Ok(history);
    };
    history.last_sample_unix_ms = Some(last);
    let lookback_ms = i64::try_from(lookback.as_millis()).unwrap_or(i64::MAX);
    let range = TimeRange {
        from_ms: now_unix_ms.saturating_sub(lookback_ms),
        to_ms: now_unix_ms,
    };
    let devices = store.devices()?;
    let findings = analyse(&mut store, range, &devices, pids, cfg)?;
    let ticks_per_second = procfs::ticks_per_second().max(1);
    for f in findings {
        let Some(process) = f.process else { continue };
        let last_cpu = store
            .process_cpu(process.id, range)?
            .last()
            .map(|p| (p.unix_ms, p.last.saturating_mul(1000) / ticks_per_second));
        history
            .series
            .entry((f.device.meta.uuid.clone(), process.meta.key.pid))
            .or_default()
            .push(HistorySeries {
                start_time_ticks: process.meta.key.start_time_ticks,
                boot_id: process.meta.key.boot_id.clone(),
                report: f.report,
                last_cpu,
            });
    }
    Ok(history)
}
