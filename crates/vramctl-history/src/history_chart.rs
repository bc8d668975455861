//! The history's memory as chart panels (`plot`): one panel per GPU with the device's used
//! memory and each process's, bucketed by a round step ([`nice_step`], also the `history`
//! table's default step), each bucket at its highest value so a spike stays visible.

use std::collections::{BTreeMap, HashMap};

use vramctl_store::{DeviceRecord, Metric, ProcessRecord, Store, TimeRange};

/// A round step near `ms`: 1s, 2s, 5s, 10s, 15s, 30s, 1m, 2m, 5m, 10m, 15m, 30m, 1h, …
pub fn nice_step(ms: i64) -> i64 {
    const STEPS: [i64; 16] = [
        1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000, 900_000,
        1_800_000, 3_600_000, 7_200_000, 21_600_000, 86_400_000,
    ];
    if ms <= 1_000 {
        return 0;
    }
    STEPS.into_iter().find(|&s| s >= ms).unwrap_or(86_400_000)
}

/// A recorded GPU as `history` and chart titles name it: its index, else its UUID.
pub fn gpu_label(dev: &DeviceRecord) -> String {
    dev.meta
        .index
        .map_or_else(|| dev.meta.uuid.clone(), |i| i.to_string())
}

/// `(unix ms, bytes)`; `None` breaks the line.
pub type PlotPoint = (i64, Option<u64>);

/// One panel of a memory chart, in the renderer's terms but without naming it
/// (`output/chart.rs` maps it one to one: `plot` is the only caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlotPanel {
    /// The device's UUID.
    pub device_uuid: String,
    /// `GPU 0 · NVIDIA H200 · GPU-7778da7f…`.
    pub title: String,
    /// Installed memory, drawn as the ceiling.
    pub ceiling_bytes: Option<u64>,
    /// Device memory used, `None` where a gap breaks the line.
    pub device: Vec<PlotPoint>,
    /// Per process: its PID, a label (`python train.py [4242]`) and its points.
    pub processes: Vec<(u32, String, Vec<PlotPoint>)>,
    /// Gaps on this device: `(from ms, to ms, reason)`.
    pub gaps: Vec<(i64, i64, String)>,
}

/// Memory per device and per process for a chart of at most about `max_points` points a
/// series: bucketed by a round step, each bucket drawn at its highest value so a spike
/// stays visible; a bucket where a series is absent between two present ones is a `None`
/// (a break in the line, never a drop to zero).
///
/// # Errors
/// When the store fails.
pub fn plot_panels(
    store: &mut Store,
    range: TimeRange,
    devices: &[DeviceRecord],
    pids: &[u32],
    max_points: i64,
) -> anyhow::Result<Vec<PlotPanel>> {
    let (lo, hi) = store.time_bounds()?.unwrap_or((0, 0));
    let span = range.to_ms.min(hi).saturating_sub(range.from_ms.max(lo));
    let step = nice_step(span / max_points.max(1)).max(1);
    let processes: HashMap<i64, ProcessRecord> = store
        .all_processes()?
        .into_iter()
        .filter(|(_, p)| pids.is_empty() || pids.contains(&p.meta.key.pid))
        .collect();
    let wanted: HashMap<i64, &DeviceRecord> = devices.iter().map(|d| (d.id, d)).collect();
    // Bucket times in order, and per (device, process or None) the max per bucket. What a
    // series id is to the chart is resolved once: a day of 240 series is 20 M entries.
    #[derive(Clone, Copy)]
    enum Use {
        Line(usize),
        Total(i64),
        Skip,
    }
    let mut buckets: Vec<i64> = Vec::new();
    let mut uses: Vec<Option<Use>> = Vec::new();
    let mut keys: Vec<(i64, Option<i64>)> = Vec::new();
    let mut values: Vec<Vec<(i64, u64)>> = Vec::new();
    let mut totals: HashMap<i64, u64> = HashMap::new();
    store.scan(range, |frame| {
        let b = frame.t_ms.div_euclid(step) * step;
        if buckets.last() != Some(&b) {
            buckets.push(b);
        }
        for (id, e) in frame.entries() {
            let i = usize::try_from(id).unwrap_or(usize::MAX);
            if i >= uses.len() {
                uses.resize(i.saturating_add(1), None);
            }
            let usage = *uses[i].get_or_insert_with(|| {
                let Some(s) = frame.series(id) else {
                    return Use::Skip;
                };
                let Some(d) = s.device_id.filter(|d| wanted.contains_key(d)) else {
                    return Use::Skip;
                };
                let key = match (s.metric, s.process_id) {
                    (Metric::UsedBytes, None) => (d, None),
                    (Metric::TotalBytes, None) => return Use::Total(d),
                    (Metric::ProcessUsedBytes, Some(p)) if processes.contains_key(&p) => {
                        (d, Some(p))
                    }
                    _ => return Use::Skip,
                };
                let k = keys.iter().position(|k| *k == key).unwrap_or_else(|| {
                    keys.push(key);
                    values.push(Vec::new());
                    keys.len() - 1
                });
                Use::Line(k)
            });
            let Some((_, max, last)) = e.min_max_last() else {
                continue;
            };
            match usage {
                Use::Line(k) => match values[k].last_mut() {
                    Some((at, peak)) if *at == b => *peak = (*peak).max(max),
                    _ => values[k].push((b, max)),
                },
                Use::Total(d) => {
                    totals.insert(d, last);
                }
                Use::Skip => {}
            }
        }
    })?;
    let peaks: BTreeMap<(i64, Option<i64>), BTreeMap<i64, u64>> = keys
        .into_iter()
        .zip(values)
        .map(|(key, points)| (key, points.into_iter().collect()))
        .collect();
    let line = |values: &BTreeMap<i64, u64>| -> Vec<PlotPoint> {
        let (Some(first), Some(last)) = (values.keys().next(), values.keys().next_back()) else {
            return Vec::new();
        };
        buckets
            .iter()
            .filter(|b| (*first..=*last).contains(*b))
            .map(|b| (*b, values.get(b).copied()))
            .collect()
    };
    let gaps = store.gaps(range)?;
    let mut panels = Vec::new();
    for dev in devices {
        let title = match &dev.meta.name {
            Some(name) => format!("GPU {} · {name} · {}", gpu_label(dev), dev.meta.uuid),
            None => format!("GPU {} · {}", gpu_label(dev), dev.meta.uuid),
        };
        let device = peaks.get(&(dev.id, None)).map(line).unwrap_or_default();
        let mut procs = Vec::new();
        for ((d, p), values) in &peaks {
            let (Some(p), true) = (p, *d == dev.id) else {
                continue;
            };
            let Some(record) = processes.get(p) else {
                continue;
            };
            let pid = record.meta.key.pid;
            let label = match record.meta.command.as_deref() {
                Some(command) if !command.is_empty() => format!("{command} [{pid}]"),
                _ => format!("PID {pid}"),
            };
            procs.push((pid, label, line(values)));
        }
        let dev_gaps = gaps
            .iter()
            .filter(|g| {
                g.device_uuid.as_ref().is_none_or(|u| *u == dev.meta.uuid)
                    && matches!(g.metric, None | Some(Metric::UsedBytes))
            })
            .map(|g| (g.from_ms, g.to_ms, g.reason.clone()))
            .collect();
        if device.is_empty() && procs.is_empty() {
            continue;
        }
        panels.push(PlotPanel {
            device_uuid: dev.meta.uuid.clone(),
            title,
            ceiling_bytes: totals.get(&dev.id).copied(),
            device,
            processes: procs,
            gaps: dev_gaps,
        });
    }
    Ok(panels)
}

#[cfg(test)]
mod tests {
    use vramctl_store::{
        DeviceMeta, DeviceSample, DeviceSampleState, Observed, OpenMode, ProcessList,
        ProcessOnDevice, TickSample,
    };

    use super::*;

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(500), 0);
        assert_eq!(nice_step(20_000), 30_000);
        assert_eq!(nice_step(86_400_000 / 30), 3_600_000);
    }

    fn tick(t: i64, used: Option<u64>) -> TickSample {
        TickSample {
            at_unix_ms: t,
            devices: vec![DeviceSample {
                device: DeviceMeta {
                    uuid: "GPU-a".into(),
                    index: Some(0),
                    name: Some("NVIDIA H200".into()),
                    ..DeviceMeta::default()
                },
                state: match used {
                    Some(u) => DeviceSampleState::Read {
                        metrics: vec![
                            (Metric::UsedBytes, Observed::Value(u)),
                            (Metric::TotalBytes, Observed::Value(100)),
                        ],
                        processes: ProcessList::Observed(vec![ProcessOnDevice {
                            pid: 7,
                            used_bytes: Some(u),
                            sm_percent: None,
                            agent: None,
                        }]),
                    },
                    None => DeviceSampleState::Unreadable("GPU lost".into()),
                },
            }],
            ..TickSample::default()
        }
    }

    #[test]
    fn gaps_break_lines_and_spikes_survive_bucketing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        let t0 = 1_795_984_200_000; // on a minute boundary
        // 0..59 s: 10, with a spike of 90 at 30 s; 60..119 s: lost; 120..179 s: 20.
        for i in 0..180 {
            let used = match i {
                30 => Some(90),
                0..60 => Some(10),
                60..120 => None,
                _ => Some(20),
            };
            store.append(&tick(t0 + i * 1000, used)).unwrap();
        }
        let devices = store.devices().unwrap();
        let panels = plot_panels(&mut store, TimeRange::ALL, &devices, &[], 3).unwrap();
        assert_eq!(panels.len(), 1);
        let p = &panels[0];
        assert_eq!(p.ceiling_bytes, Some(100));
        assert_eq!(
            p.device,
            vec![
                (t0, Some(90)),
                (t0 + 60_000, None),
                (t0 + 120_000, Some(20))
            ]
        );
        assert_eq!(p.processes.len(), 1);
        assert_eq!(p.processes[0].0, 7);
        assert_eq!(p.processes[0].1, "PID 7");
        assert_eq!(p.title, "GPU 0 · NVIDIA H200 · GPU-a");
        assert_eq!(p.gaps.len(), 1);
        assert_eq!(p.gaps[0].2, "GPU lost");
    }
}
