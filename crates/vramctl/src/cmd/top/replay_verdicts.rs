//! Verdicts at `top --replay`'s cursor.
//!
//! A replay's cursor jumps both ways, so a live tracker fed in order does not fit; instead
//! each moment gets what `vramctl leaks` says of the recording over the span before it:
//! the same one-pass store scan (`cmd/leaks/scan.rs`) and batch analysis, over
//! `[cursor − span, cursor]`. Cost grows with the span and the number of series (not
//! measured for this use; `leaks --db` takes 0.6–0.9 s for a day of 8 GPUs × 30 processes
//! at 1 s in `docs/benchmarks.md`, so an hour should be a few tens of ms), on the replay
//! thread; the span is an hour, or `--idle-for` plus ten minutes when that is longer
//! (an idle holder needs its whole idle time in view).

use std::collections::HashMap;
use std::path::Path;

use vramctl_leaks::analysis::LeakConfig;
use vramctl_observe::observation::Observation;
use vramctl_observe::verdict::{ReplayJudge, Verdicts, verdict_of};
use vramctl_store::{Store, TimeRange};

use vramctl_history::leak_scan::{Finding, analyse, device_label};

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
    time_zone: jiff::tz::TimeZone,
}

impl StoreJudge {
    /// Opens `path` read-only (its own handle: the replay thread's source keeps its own).
    ///
    /// # Errors
    /// When the database cannot be opened.
    pub fn open(path: &Path, cfg: LeakConfig) -> anyhow::Result<Self> {
        let idle_ms = i64::try_from(cfg.idle_for.as_millis()).unwrap_or(i64::MAX);
        Ok(Self {
            store: crate::cmd::open_history(path)?,
            span_ms: idle_ms.saturating_add(IDLE_MARGIN_MS).max(MIN_SPAN_MS),
            cfg,
            warned: false,
            time_zone: jiff::tz::TimeZone::UTC,
        })
    }

    /// Times in the verdicts' explanations in `tz` (default UTC).
    #[must_use]
    pub fn with_time_zone(mut self, tz: jiff::tz::TimeZone) -> Self {
        self.time_zone = tz;
        self
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
            Ok(findings) => verdicts_at(observation, &findings, &self.time_zone),
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
fn verdicts_at(
    observation: &Observation,
    findings: &[Finding],
    tz: &jiff::tz::TimeZone,
) -> Verdicts {
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
        let device = device_label(&finding.device);
        verdicts.insert(pid, &uuid, verdict_of(&finding.report, &device, tz));
    }
    verdicts
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vramctl_core::types::{DriverInfo, Snapshot};
    use vramctl_observe::verdict::VerdictKind;
    use vramctl_store::{
        DeviceMeta, DeviceSample, DeviceSampleState, Metric, Observed, ProcessKey, ProcessList,
        ProcessMeta, ProcessOnDevice, ProcessSample, TickSample,
    };

    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const T0: i64 = 1_795_984_200_000;

    /// One GPU "GPU-a" at `T0 + t_s`: PID 1 flat at 4 GiB for 60 s, then 64 MiB/s more;
    /// PID 2 flat at 2 GiB. Start time = PID.
    fn tick(t_s: i64) -> TickSample {
        let grown = u64::try_from((t_s - 60).max(0)).unwrap_or(0) * 64 * MIB;
        let procs = [(1_u32, 4 * GIB + grown), (2, 2 * GIB)];
        let used: u64 = procs.iter().map(|p| p.1).sum();
        TickSample {
            at_unix_ms: T0 + t_s * 1000,
            devices: vec![DeviceSample {
                device: DeviceMeta {
                    uuid: "GPU-a".into(),
                    index: Some(0),
                    ..DeviceMeta::default()
                },
                state: DeviceSampleState::Read {
                    metrics: vec![
                        (Metric::UsedBytes, Observed::Value(used)),
                        (Metric::FreeBytes, Observed::Value(140 * GIB - used)),
                        (Metric::TotalBytes, Observed::Value(140 * GIB)),
                    ],
                    processes: ProcessList::Observed(
                        procs
                            .iter()
                            .map(|&(pid, bytes)| ProcessOnDevice {
                                pid,
                                used_bytes: Some(bytes),
                                sm_percent: None,
                                agent: None,
                            })
                            .collect(),
                    ),
                },
            }],
            processes: procs
                .iter()
                .map(|&(pid, _)| ProcessSample {
                    meta: ProcessMeta {
                        key: ProcessKey {
                            boot_id: Some("b".into()),
                            pid,
                            start_time_ticks: Some(u64::from(pid)),
                        },
                        ..ProcessMeta::default()
                    },
                    cpu_ticks: None,
                })
                .collect(),
            ..TickSample::default()
        }
    }

    /// The moment on screen at `T0 + t_s`, with PID 1 shown with `start` as its start time.
    fn at(t_s: i64, start: u64) -> Observation {
        let mut o = Observation::bare(Snapshot {
            taken_at_unix_ms: T0 + t_s * 1000,
            monotonic_ms: T0 + t_s * 1000,
            driver: Arc::new(DriverInfo::default()),
            devices: Vec::new(),
            unopened: Vec::new(),
        });
        let mut host = vramctl_observe::observation::HostProcess {
            pid: 1,
            ppid: None,
            user: None,
            command: String::new(),
            state: None,
            start_time_ticks: Some(start),
            started_at_unix_ms: None,
            cpu_percent: None,
            cpu_time_ms: None,
            ..vramctl_observe::observation::HostProcess::default()
        };
        o.hosts.insert(1, host.clone());
        host.pid = 2;
        host.start_time_ticks = Some(2);
        o.hosts.insert(2, host);
        o
    }

    #[test]
    fn verdicts_at_the_cursor_see_only_the_recording_before_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("h.db");
        {
            let mut store = Store::open(&path, vramctl_store::OpenMode::Append).expect("store");
            for t in 0..300 {
                store.append(&tick(t)).expect("append");
            }
        }
        let mut judge = StoreJudge::open(&path, LeakConfig::default()).expect("open");
        let kind = |v: &Verdicts, pid: u32| v.get(pid, "GPU-a").map(|v| v.kind);
        // Five minutes in: the growth after the plateau is a leak; the flat one is not.
        let late = judge.judge_at(&at(299, 1));
        assert_eq!(kind(&late, 1), Some(VerdictKind::Leak));
        assert_eq!(kind(&late, 2), Some(VerdictKind::Stable));
        // Back before the growth began: no leak yet (the cursor moves both ways).
        let early = judge.judge_at(&at(55, 1));
        assert_eq!(kind(&early, 1), Some(VerdictKind::Stable));
        // A PID on screen that is another process than the recorded one gets nothing.
        let reused = judge.judge_at(&at(299, 99));
        assert_eq!(kind(&reused, 1), None);
        assert_eq!(kind(&reused, 2), Some(VerdictKind::Stable));
    }
}
