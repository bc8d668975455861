//! The history (or an imported file) → one leak/idle report per process and device.
//!
//! One pass over the store (`Store::scan`), whatever the number of series: every process's
//! memory goes into its own `SeriesFold` (bounded: at most 1,112 points each) together with
//! its evidence — SM activity where the driver reported it, the device's utilization with
//! the number of processes on it at that tick, and the process's CPU time — and each fold
//! is analysed once at the end. A day of 240 series at 1 s stays within a few MB.

use std::collections::HashMap;

use vramctl_core::analysis::{
    CpuSample, DeviceActivitySample, LeakConfig, Sample, SeriesContext, SeriesFold, SeriesReport,
    SmSample,
};
use vramctl_store::{DeviceRecord, Metric, ProcessRecord, SeriesRef, Store, TimeRange};

/// CPU time is recorded every 10 s (`record`) and carried between reads, so a repeated
/// value is only taken as a new reading this long after the last one taken.
const CPU_HEARTBEAT_MS: i64 = 10_000;

/// One analysed series: a process on a device, or a device's own used memory when no
/// process was recorded on it (an nvidia-smi `--query-gpu` log).
#[derive(Debug, Clone)]
pub struct Finding {
    /// The device.
    pub device: DeviceRecord,
    /// Its installed memory, when recorded.
    pub total_bytes: Option<u64>,
    /// The process; `None` for a device series.
    pub process: Option<ProcessRecord>,
    /// The analysis.
    pub report: SeriesReport,
}

/// What a series id of the store is to this analysis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A process's memory on a device: index into `procs`.
    Memory(usize),
    /// A process's SM activity on a device: index into `procs`.
    Sm(usize),
    /// A process's CPU time (process row id).
    Cpu(i64),
    /// A device metric: index into `devices`.
    Device(usize, Metric),
    Skip,
}

/// One process on one device.
struct ProcAcc {
    process: i64,
    device: usize,
    fold: SeriesFold,
    /// Index of the last frame that pushed a sample (per device's observing frames).
    last_frame: Option<u64>,
    free_at_last: Option<u64>,
    cpu_pushed: Option<(i64, u64)>,
}

/// One device.
struct DevAcc {
    record: DeviceRecord,
    total: Option<u64>,
    /// The device's used memory, analysed when no process was recorded on it.
    fold: SeriesFold,
    /// Index of the previous and of this frame that observed the process list.
    prev_obs_frame: Option<u64>,
    // Per frame, reset each time:
    util: Option<u32>,
    free: Option<u64>,
    used: Option<(u64, u64, u64)>,
    procs_now: u32,
    obs_metrics: bool,
    obs_procs: bool,
}

/// Analyses every process in `range` on `devices` (all of `pids`, or every process when
/// `pids` is empty).
///
/// # Errors
/// When the store fails, or the settings are invalid.
pub fn analyse(
    store: &mut Store,
    range: TimeRange,
    devices: &[DeviceRecord],
    pids: &[u32],
    cfg: &LeakConfig,
) -> anyhow::Result<Vec<Finding>> {
    cfg.validate()?;
    let processes: HashMap<i64, ProcessRecord> = store
        .all_processes()?
        .into_iter()
        .filter(|(_, p)| pids.is_empty() || pids.contains(&p.meta.key.pid))
        .collect();
    let history_start = store.time_bounds()?.map(|(lo, _)| lo);
    let ticks_per_second = procfs::ticks_per_second().max(1);

    let mut devs: Vec<DevAcc> = Vec::with_capacity(devices.len());
    for d in devices {
        devs.push(DevAcc {
            record: d.clone(),
            total: None,
            fold: SeriesFold::new(cfg.clone())?,
            prev_obs_frame: None,
            util: None,
            free: None,
            used: None,
            procs_now: 0,
            obs_metrics: false,
            obs_procs: false,
        });
    }
    let dev_index: HashMap<i64, usize> = devs
        .iter()
        .enumerate()
        .map(|(i, d)| (d.record.id, i))
        .collect();
    let mut procs: Vec<ProcAcc> = Vec::new();
    let mut proc_index: HashMap<(i64, usize), usize> = HashMap::new();
    let mut roles: Vec<Option<Role>> = Vec::new();
    let mut failure: Option<anyhow::Error> = None;
    // Reused per frame: present memory, SM and CPU entries.
    let mut memory_now: Vec<(usize, (u64, u64, u64))> = Vec::new();
    let mut sm_now: HashMap<usize, u64> = HashMap::new();
    let mut cpu_now: HashMap<i64, u64> = HashMap::new();
    let mut frame_no: u64 = 0;

    store.scan(range, |frame| {
        if failure.is_some() {
            return;
        }
        frame_no += 1;
        let t = frame.t_ms;
        for d in &mut devs {
            (d.obs_metrics, d.obs_procs) = frame.observed(d.record.id);
            d.util = None;
            d.free = None;
            d.used = None;
            d.procs_now = 0;
        }
        memory_now.clear();
        sm_now.clear();
        cpu_now.clear();
        for (id, entry) in frame.entries() {
            let i = usize::try_from(id).unwrap_or(usize::MAX);
            if i >= roles.len() {
                roles.resize(i.saturating_add(1), None);
            }
            let role = match roles[i] {
                Some(role) => role,
                None => {
                    let role = match resolve(
                        frame.series(id),
                        &dev_index,
                        &processes,
                        &mut procs,
                        &mut proc_index,
                        cfg,
                    ) {
                        Ok(role) => role,
                        Err(e) => {
                            failure = Some(e);
                            return;
                        }
                    };
                    roles[i] = Some(role);
                    role
                }
            };
            let Some(value) = entry.min_max_last() else {
                continue;
            };
            match role {
                Role::Memory(p) => memory_now.push((p, value)),
                Role::Sm(p) => {
                    sm_now.insert(p, value.2);
                }
                Role::Cpu(process) => {
                    cpu_now.insert(process, value.2);
                }
                Role::Device(d, metric) => {
                    let dev = &mut devs[d];
                    match metric {
                        Metric::UtilizationGpuPercent => {
                            dev.util = Some(u32::try_from(value.2).unwrap_or(u32::MAX));
                        }
                        Metric::FreeBytes => dev.free = Some(value.2),
                        Metric::TotalBytes => dev.total = Some(value.2),
                        Metric::UsedBytes => dev.used = Some(value),
                        _ => {}
                    }
                }
                Role::Skip => {}
            }
        }
        for &(p, _) in &memory_now {
            let d = procs[p].device;
            devs[d].procs_now = devs[d].procs_now.saturating_add(1);
        }
        for &(p, (min, max, last)) in &memory_now {
            let acc = &mut procs[p];
            let dev = &devs[acc.device];
            // An imported log may carry a process list over from an earlier time.
            if !dev.obs_procs {
                continue;
            }
            if let Some(&sm) = sm_now.get(&p) {
                acc.fold.push_sm(SmSample {
                    t_unix_ms: t,
                    sm_percent: u32::try_from(sm).unwrap_or(u32::MAX),
                });
            }
            if let (true, Some(util)) = (dev.obs_metrics, dev.util) {
                acc.fold.push_device(DeviceActivitySample {
                    t_unix_ms: t,
                    utilization_gpu_percent: util,
                    processes_on_device: dev.procs_now,
                });
            }
            if let Some(&ticks) = cpu_now.get(&acc.process) {
                let due = acc.cpu_pushed.is_none_or(|(at, value)| {
                    value != ticks || t.saturating_sub(at) >= CPU_HEARTBEAT_MS
                });
                if due {
                    acc.cpu_pushed = Some((t, ticks));
                    acc.fold.push_cpu(CpuSample {
                        t_unix_ms: t,
                        cpu_time_ms: ticks.saturating_mul(1000) / ticks_per_second,
                    });
                }
            }
            let mut sample = Sample::new(t, last);
            if frame.span_ms > 0 {
                sample.min_bytes = Some(min);
                sample.max_bytes = Some(max);
            }
            // Absent from an observed process list since its last sample: a gap.
            sample.gap_before = acc.last_frame.is_some() && acc.last_frame != dev.prev_obs_frame;
            acc.fold.push(&sample);
            acc.last_frame = Some(frame_no);
            acc.free_at_last = dev.free;
        }
        for dev in &mut devs {
            if dev.obs_procs {
                dev.prev_obs_frame = Some(frame_no);
            }
            if let (true, Some((min, max, last))) = (dev.obs_metrics, dev.used) {
                let mut sample = Sample::new(t, last);
                if frame.span_ms > 0 {
                    sample.min_bytes = Some(min);
                    sample.max_bytes = Some(max);
                }
                dev.fold.push(&sample);
            }
        }
    })?;
    if let Some(e) = failure {
        return Err(e);
    }

    let mut findings = Vec::new();
    let label = super::device_label;
    for acc in &procs {
        let dev = &devs[acc.device];
        let Some(process) = processes.get(&acc.process) else {
            continue;
        };
        // The first time the store saw the process is its start, unless it was already
        // there when the history begins.
        let start = Some(process.first_seen_ms).filter(|&t| history_start.is_none_or(|h| t > h));
        let ctx = SeriesContext {
            capacity_bytes: dev.total,
            free_bytes: acc.free_at_last,
            process_start_unix_ms: start,
            device_label: Some(label(&dev.record)),
        };
        let Ok(report) = acc.fold.report(&ctx) else {
            continue;
        };
        findings.push(Finding {
            device: dev.record.clone(),
            total_bytes: dev.total,
            process: Some(process.clone()),
            report,
        });
    }
    for dev in &devs {
        if procs
            .iter()
            .any(|p| devs[p.device].record.id == dev.record.id)
            || !pids.is_empty()
        {
            continue;
        }
        let ctx = SeriesContext {
            capacity_bytes: dev.total,
            free_bytes: dev.free,
            process_start_unix_ms: None,
            device_label: Some(label(&dev.record)),
        };
        if let Ok(report) = dev.fold.report(&ctx) {
            findings.push(Finding {
                device: dev.record.clone(),
                total_bytes: dev.total,
                process: None,
                report,
            });
        }
    }
    Ok(findings)
}

/// What series `id` is to this analysis; creates the process's fold on first sight.
fn resolve(
    series: Option<SeriesRef>,
    dev_index: &HashMap<i64, usize>,
    processes: &HashMap<i64, ProcessRecord>,
    procs: &mut Vec<ProcAcc>,
    proc_index: &mut HashMap<(i64, usize), usize>,
    cfg: &LeakConfig,
) -> anyhow::Result<Role> {
    let Some(s) = series else {
        return Ok(Role::Skip);
    };
    let device = s.device_id.and_then(|d| dev_index.get(&d).copied());
    Ok(match (s.metric, s.process_id, device) {
        (Metric::ProcessCpuTicks, Some(p), _) => Role::Cpu(p),
        (Metric::ProcessUsedBytes | Metric::ProcessSmPercent, Some(p), Some(d))
            if processes.contains_key(&p) =>
        {
            let acc = match proc_index.get(&(p, d)) {
                Some(&i) => i,
                None => {
                    procs.push(ProcAcc {
                        process: p,
                        device: d,
                        fold: SeriesFold::new(cfg.clone())?,
                        last_frame: None,
                        free_at_last: None,
                        cpu_pushed: None,
                    });
                    proc_index.insert((p, d), procs.len() - 1);
                    procs.len() - 1
                }
            };
            if s.metric == Metric::ProcessUsedBytes {
                Role::Memory(acc)
            } else {
                Role::Sm(acc)
            }
        }
        (
            m @ (Metric::UtilizationGpuPercent
            | Metric::FreeBytes
            | Metric::TotalBytes
            | Metric::UsedBytes),
            None,
            Some(d),
        ) => Role::Device(d, m),
        _ => Role::Skip,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use vramctl_core::analysis::{Evidence, Verdict};
    use vramctl_store::{
        DeviceMeta, DeviceSample, DeviceSampleState, Observed, ProcessKey, ProcessList,
        ProcessMeta, ProcessOnDevice, ProcessSample, TickSample,
    };

    use super::*;

    const GIB: u64 = 1 << 30;
    const T0: i64 = 1_795_984_200_000;

    /// One GPU (total 100 GiB, utilization `util`) with `(pid, bytes, cpu ticks)`.
    fn tick(t: i64, util: u64, procs: &[(u32, u64, Option<u64>)]) -> TickSample {
        let used: u64 = procs.iter().map(|p| p.1).sum();
        TickSample {
            at_unix_ms: t,
            devices: vec![DeviceSample {
                device: DeviceMeta {
                    uuid: "GPU-a".into(),
                    index: Some(0),
                    name: Some("NVIDIA H200".into()),
                    ..DeviceMeta::default()
                },
                state: DeviceSampleState::Read {
                    metrics: vec![
                        (Metric::UsedBytes, Observed::Value(used)),
                        (Metric::FreeBytes, Observed::Value(100 * GIB - used)),
                        (Metric::TotalBytes, Observed::Value(100 * GIB)),
                        (Metric::UtilizationGpuPercent, Observed::Value(util)),
                    ],
                    processes: ProcessList::Observed(
                        procs
                            .iter()
                            .map(|&(pid, bytes, _)| ProcessOnDevice {
                                pid,
                                used_bytes: Some(bytes),
                                sm_percent: None,
                            })
                            .collect(),
                    ),
                },
            }],
            processes: procs
                .iter()
                .map(|&(pid, _, cpu)| ProcessSample {
                    meta: ProcessMeta {
                        key: ProcessKey {
                            boot_id: Some("b".into()),
                            pid,
                            start_time_ticks: Some(u64::from(pid)),
                        },
                        command: Some(format!("job {pid}")),
                        ..ProcessMeta::default()
                    },
                    cpu_ticks: cpu,
                })
                .collect(),
            ..TickSample::default()
        }
    }

    fn run(store: &mut Store, cfg: &LeakConfig) -> Vec<Finding> {
        let devices = store.devices().unwrap();
        analyse(store, TimeRange::ALL, &devices, &[], cfg).unwrap()
    }

    fn finding(findings: &[Finding], pid: u32) -> &Finding {
        findings
            .iter()
            .find(|f| f.process.as_ref().map(|p| p.meta.key.pid) == Some(pid))
            .unwrap()
    }

    #[test]
    fn cpu_time_read_every_10_s_is_idle_evidence_and_absence_is_a_gap() {
        let mut store = Store::open_in_memory().unwrap();
        // 300 s at 1 s on a busy shared GPU. PID 1 holds 4 GiB and uses no CPU (its CPU
        // time is read every 10 s, as `record` does); PID 2 uses a core; PID 2 is missing
        // from the list for 5 s in the middle.
        for i in 0..300 {
            let cpu_due = i % 10 == 0;
            let mut procs = vec![(1, 4 * GIB, cpu_due.then_some(500))];
            if !(100..105).contains(&i) {
                procs.push((
                    2,
                    2 * GIB,
                    cpu_due.then_some(100 * u64::try_from(i).unwrap()),
                ));
            }
            store.append(&tick(T0 + i * 1000, 90, &procs)).unwrap();
        }
        let cfg = LeakConfig {
            idle_for: Duration::from_secs(120),
            ..LeakConfig::default()
        };
        let findings = run(&mut store, &cfg);
        assert_eq!(findings.len(), 2);
        let idle = &finding(&findings, 1).report;
        assert_eq!(idle.verdict, Verdict::IdleHolder, "{}", idle.explanation);
        assert_eq!(idle.idle.evidence, vec![Evidence::CpuTime]);
        assert_eq!(idle.samples, 300);
        assert_eq!(idle.gaps, 0);
        let busy = &finding(&findings, 2).report;
        assert_eq!(busy.verdict, Verdict::Stable, "{}", busy.explanation);
        assert_eq!(busy.gaps, 1);
        assert_eq!(busy.samples, 295);
        // Process start: both were there when the history began.
        assert_eq!(finding(&findings, 1).total_bytes, Some(100 * GIB));
        // Time to full uses the device's free memory at the process's last sample.
        assert_eq!(busy.time_to_full_sec, None);
    }

    #[test]
    fn a_process_first_seen_before_the_range_is_judged_as_settled() {
        let mut store = Store::open_in_memory().unwrap();
        // PID 7 appears at 10 s and grows 2 MB/s (in 2 MiB steps) from then on, never
        // plateauing. Over 700..900 s it has been running for more than the longest
        // warm-up (10 min), so its growth is a leak; were its start unknown, the range's
        // first sample would be its start and the growth warm-up.
        for i in 0..900 {
            let mut procs = vec![(1, GIB, None)];
            if i >= 10 {
                let grown = u64::try_from(i - 10).unwrap() * 2_000_000 / (2 << 20) * (2 << 20);
                procs.push((7, GIB + grown, None));
            }
            store.append(&tick(T0 + i * 1000, 50, &procs)).unwrap();
        }
        let devices = store.devices().unwrap();
        let range = TimeRange {
            from_ms: T0 + 700_000,
            to_ms: T0 + 900_000,
        };
        let findings = analyse(&mut store, range, &devices, &[], &LeakConfig::default()).unwrap();
        let r = &finding(&findings, 7).report;
        assert_eq!(r.verdict, Verdict::Leak, "{}", r.explanation);
        assert_eq!(r.rule, Some(vramctl_core::analysis::LeakRule::SinceWarmUp));
        // PID 1 was there when the history began: its start is unknown.
        assert_eq!(finding(&findings, 1).report.verdict, Verdict::Stable);
    }

    #[test]
    fn a_device_without_processes_is_judged_by_its_own_memory() {
        let mut store = Store::open_in_memory().unwrap();
        for i in 0..100 {
            let mut t = tick(T0 + i * 1000, 0, &[]);
            if let DeviceSampleState::Read { processes, metrics } = &mut t.devices[0].state {
                *processes = ProcessList::NotObserved;
                metrics[0].1 = Observed::Value(10 * GIB);
            }
            store.append(&t).unwrap();
        }
        let findings = run(&mut store, &LeakConfig::default());
        assert_eq!(findings.len(), 1);
        assert!(findings[0].process.is_none());
        assert_eq!(findings[0].report.verdict, Verdict::Stable);
        assert_eq!(findings[0].report.current_bytes, 10 * GIB);
        // Asked for PIDs: no device series.
        let devices = store.devices().unwrap();
        let none = analyse(
            &mut store,
            TimeRange::ALL,
            &devices,
            &[42],
            &LeakConfig::default(),
        )
        .unwrap();
        assert!(none.is_empty());
    }
}
