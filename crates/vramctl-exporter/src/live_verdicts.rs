//! Leak and idle-holder verdicts in the exporter: the live analysis as a [`TickConsumer`].
//!
//! Every observation goes into one `AnalysisJudge` (`vramctl_observe::verdict`: the
//! `FleetTracker` `leaks --watch` and `top` run), with each process's start and CPU time
//! from the collector's observation (/proc's stat at most once a second) as its identity
//! and idle evidence, and the per-process SM
//! activity the source reads for every GPU. After each tick the [`ProcessVerdicts`] the
//! renderer reads are rebuilt from the processes listed in that tick, so the verdict series
//! of a process that ended disappear with its memory series.
//!
//! The analysis is pure and costs about 3 ms per tick for 240 processes at a 1 s interval
//! (`docs/benchmarks.md`, "Live analysis: FleetTracker per tick"); it runs on the sampler
//! thread, never in a scrape.

use vramctl_leaks::analysis::live::FleetConfig;
use vramctl_leaks::analysis::{
    AnalysisError, Cadence, IdleState, LeakConfig, SeriesReport, Verdict,
};
use vramctl_observe::observation::{Observation, Observer};
use vramctl_observe::verdict::AnalysisJudge;

use super::collector::TickConsumer;
use super::metadata::ProcessMetadata;
use super::render::{ProcessVerdict, ProcessVerdicts};

/// The live leak and idle analysis of every process the exporter sees.
#[derive(Debug)]
pub struct LiveAnalysis {
    judge: AnalysisJudge,
}

impl LiveAnalysis {
    /// An analysis with `cfg`'s thresholds.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidConfig`] for bad thresholds.
    pub fn new(cfg: LeakConfig) -> Result<Self, AnalysisError> {
        Ok(Self {
            // Scraped every 15-60 s: re-analysing each series at most every 10 s keeps
            // the daemon near its 0.5 % CPU goal with 240 processes (every second it grew
            // to 0.8 % of a core after two minutes on the 8 x 30 scenario).
            judge: AnalysisJudge::with_fleet_config(FleetConfig {
                leak: cfg,
                cadence: Cadence::SCRAPED,
                ..FleetConfig::default()
            })?,
        })
    }
}

impl TickConsumer for LiveAnalysis {
    fn on_snapshot(
        &mut self,
        observation: &Observation,
        _observer: &Observer,
        _metadata: &ProcessMetadata,
        verdicts: &mut ProcessVerdicts,
    ) {
        // Outside the host's PID namespace (`--process-details nvml|none`) the observer reads
        // no /proc, and every process is "not visible".
        self.judge.track(observation);
        verdicts.clear();
        for (key, _place, report) in self.judge.fleet().current() {
            if let Some(report) = report {
                verdicts.insert((key.device_uuid.clone(), key.pid), verdict_of(report));
            }
        }
    }
}

/// The exported numbers of one report.
pub fn verdict_of(report: &SeriesReport) -> ProcessVerdict {
    let idle = &report.idle;
    ProcessVerdict {
        leaking: Some(report.verdict == Verdict::Leak),
        leak_slope_bytes_per_second: Some(report.slope_bytes_per_sec),
        idle_holder: Some(report.verdict == Verdict::IdleHolder),
        // The analysis's reading of its evidence (`IdleReport::state`, as `top` shows it):
        // idle for the span, active for 0 s; without evidence either way no sample, since
        // absence of evidence is not idleness.
        idle_seconds: match idle.state() {
            IdleState::Idle { .. } => idle.idle_sec,
            IdleState::Active => Some(0.0),
            IdleState::NoEvidence | IdleState::Unknown => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use vramctl_core::types::{
        DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, MemoryReading,
        ProcessActivity, ProcessKind, ProcessUsage,
    };

    use std::sync::Arc;

    use vramctl_core::types::Snapshot;

    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const T0: i64 = 1_700_000_000_000;

    /// One GPU at `t_s` seconds: PID 1 leaking 20 MiB/s after 30 s, PID 2 holding 4 GiB
    /// without SM activity, PID 3 steady and busy; PID 3 is gone from 60 s on.
    fn snapshot(t_s: i64) -> Arc<Snapshot> {
        let leak = GIB + u64::try_from((t_s - 30).max(0)).unwrap_or(0) * 20 * MIB;
        let mut processes = vec![(1, leak, 40), (2, 4 * GIB, 0)];
        if t_s < 60 {
            processes.push((3, 2 * GIB, 70));
        }
        Arc::new(Snapshot {
            taken_at_unix_ms: T0 + t_s * 1000,
            monotonic_ms: T0 + t_s * 1000,
            driver: Arc::new(DriverInfo::default()),
            devices: vec![DeviceSnapshot {
                info: Arc::new(DeviceInfo::new(0, "GPU-a")),
                state: DeviceState::Ok(DeviceReading {
                    memory: Some(MemoryReading {
                        total_bytes: 141 * GIB,
                        used_bytes: 10 * GIB,
                        reserved_bytes: 0,
                        free_bytes: 131 * GIB,
                    }),
                    utilization_gpu_percent: Some(50),
                    processes: Some(
                        processes
                            .iter()
                            .map(|&(pid, bytes, _)| ProcessUsage {
                                pid,
                                used_bytes: Some(bytes),
                                kind: ProcessKind::Compute,
                                gpu_instance_id: None,
                                compute_instance_id: None,
                            })
                            .collect(),
                    ),
                    process_activity: Some(
                        processes
                            .iter()
                            .map(|&(pid, _, sm)| ProcessActivity {
                                pid,
                                sm_percent: sm,
                                memory_percent: 0,
                            })
                            .collect(),
                    ),
                    ..DeviceReading::default()
                }),
            }],
            unopened: Vec::new(),
        })
    }

    #[test]
    fn verdicts_follow_the_processes_of_each_tick() {
        let cfg = LeakConfig {
            idle_for: std::time::Duration::from_secs(60),
            ..LeakConfig::default()
        };
        let mut analysis = LiveAnalysis::new(cfg).unwrap();
        // No /proc (as with `--process-details nvml`): the PIDs are made up.
        let mut observer = Observer::builder()
            .facts(vramctl_procs::process_catalog::FactsSource::Driver)
            .agents(None)
            .ancestors(false)
            .build();
        let mut tick = |t: i64, verdicts: &mut ProcessVerdicts, analysis: &mut LiveAnalysis| {
            let observation = observer.observe((*snapshot(t)).clone(), |_| None);
            analysis.on_snapshot(
                &observation,
                &observer,
                &ProcessMetadata::default(),
                verdicts,
            );
        };
        let mut verdicts = ProcessVerdicts::new();
        let key = |pid: u32| ("GPU-a".to_owned(), pid);
        for t in 0..=50 {
            tick(t, &mut verdicts, &mut analysis);
        }
        assert_eq!(verdicts.len(), 3);
        let steady = &verdicts[&key(3)];
        assert_eq!(steady.leaking, Some(false));
        assert_eq!(steady.idle_holder, Some(false));
        assert_eq!(steady.idle_seconds, Some(0.0), "busy by its SM activity");
        // Past 60 s: PID 3 is gone, and so are its verdicts; the leak and the holder show.
        for t in 51..=120 {
            tick(t, &mut verdicts, &mut analysis);
        }
        assert_eq!(verdicts.len(), 2, "{verdicts:?}");
        assert!(!verdicts.contains_key(&key(3)));
        let leak = &verdicts[&key(1)];
        assert_eq!(leak.leaking, Some(true));
        let slope = leak.leak_slope_bytes_per_second.unwrap();
        assert!(
            (slope / (20.0 * MIB as f64) - 1.0).abs() < 0.05,
            "slope {slope}"
        );
        let holder = &verdicts[&key(2)];
        assert_eq!(holder.leaking, Some(false));
        assert_eq!(holder.idle_holder, Some(true));
        let idle = holder.idle_seconds.unwrap();
        assert!((60.0..=120.0).contains(&idle), "idle {idle}");
    }

    #[test]
    fn bad_thresholds_are_refused() {
        let cfg = LeakConfig {
            alpha: 2.0,
            ..LeakConfig::default()
        };
        assert!(LiveAnalysis::new(cfg).is_err());
    }
}
