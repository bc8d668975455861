//! The history store downsampled for a chart: the range cut into at most `points` equal
//! buckets, and per GPU the device's used memory as the lowest and highest value in each
//! bucket (a spike and a dip both survive), each process's highest value, and the sum of
//! the processes not drawn one by one. The browser gets a few hundred values per series,
//! never the raw samples (24 h at 1 s is 86 400 per series).

use std::collections::HashMap;

use serde::Serialize;
use vramctl_store::{Metric, ProcessRecord, Store, TimeRange};

/// Most buckets a chart may ask for (about one per pixel of a wide screen).
pub const MAX_POINTS: usize = 2000;
/// Processes drawn one by one per GPU, the biggest by their peak in the range; the rest are
/// one "others" series.
pub const MAX_STACKED: usize = 8;

/// What a chart asks for.
#[derive(Debug, Clone, Copy)]
pub struct SeriesRequest<'a> {
    /// GPU UUID, or `None` for every GPU.
    pub gpu: Option<&'a str>,
    /// The range; clamped to the history's.
    pub range: Option<TimeRange>,
    /// Buckets wanted (1 to [`MAX_POINTS`]).
    pub points: usize,
    /// Only this process (its store row id): its own curve.
    pub process: Option<i64>,
}

/// One process's curve.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessSeries {
    /// The store's id of the process (what `process=` takes).
    pub id: i64,
    /// PID.
    pub pid: u32,
    /// User, untrusted text.
    pub user: Option<String>,
    /// Command line, untrusted text.
    pub command: Option<String>,
    /// Highest value in the range.
    pub peak_bytes: u64,
    /// Highest value per bucket; `None` where the process held nothing recorded.
    pub max: Vec<Option<u64>>,
    /// With `process=`: the agent's allocated bytes per bucket (highest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocated_max: Option<Vec<Option<u64>>>,
    /// With `process=`: the agent's reserved bytes per bucket (highest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_max: Option<Vec<Option<u64>>>,
}

/// One GPU's curves.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GpuSeries {
    /// UUID.
    pub uuid: String,
    /// NVML index when recorded.
    pub index: Option<u32>,
    /// Product name.
    pub name: Option<String>,
    /// Installed memory (the last value seen).
    pub total_bytes: Option<u64>,
    /// Lowest used memory per bucket.
    pub used_min: Vec<Option<u64>>,
    /// Highest used memory per bucket.
    pub used_max: Vec<Option<u64>>,
    /// The biggest processes, biggest first.
    pub processes: Vec<ProcessSeries>,
    /// Sum of the other processes' highest values per bucket (an upper bound); `None`
    /// when there are no others.
    pub others_max: Option<Vec<Option<u64>>>,
}

/// A gap in the recording.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GapMark {
    /// GPU UUID, `None` for all.
    pub gpu: Option<String>,
    /// Start, ms.
    pub from_ms: i64,
    /// End, ms.
    pub to_ms: i64,
}

/// The answer of `/api/history`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HistorySeries {
    /// The whole history's first and last sample times (what zooming out can reach).
    pub bounds: Option<(i64, i64)>,
    /// The range drawn.
    pub from_ms: i64,
    /// The range drawn.
    pub to_ms: i64,
    /// Bucket length.
    pub step_ms: i64,
    /// Bucket start times.
    pub t: Vec<i64>,
    /// The GPUs.
    pub gpus: Vec<GpuSeries>,
    /// Gaps within the range.
    pub gaps: Vec<GapMark>,
}

#[derive(Clone, Copy)]
enum Use {
    Used(usize),
    Total(usize),
    Process(usize),
    /// The one process's agent figures (with `process=`; ask with `gpu=` too when it
    /// used several GPUs, else they are merged).
    Allocated,
    Reserved,
    Skip,
}

/// Lowest and highest per bucket of one series.
#[derive(Clone)]
struct Buckets {
    min: Vec<Option<u64>>,
    max: Vec<Option<u64>>,
}

impl Buckets {
    fn new(n: usize) -> Self {
        Self {
            min: vec![None; n],
            max: vec![None; n],
        }
    }

    fn add(&mut self, i: usize, min: u64, max: u64) {
        if let Some(slot) = self.min.get_mut(i) {
            *slot = Some(slot.map_or(min, |v| v.min(min)));
        }
        if let Some(slot) = self.max.get_mut(i) {
            *slot = Some(slot.map_or(max, |v| v.max(max)));
        }
    }
}

/// The downsampled curves of `store` for `request`.
///
/// # Errors
/// When the store cannot be read.
pub fn history_series(
    store: &mut Store,
    request: SeriesRequest<'_>,
) -> anyhow::Result<HistorySeries> {
    let bounds = store.time_bounds()?;
    let points = request.points.clamp(1, MAX_POINTS);
    let Some((lo, hi)) = bounds else {
        return Ok(HistorySeries {
            bounds,
            from_ms: 0,
            to_ms: 0,
            step_ms: 0,
            t: Vec::new(),
            gpus: Vec::new(),
            gaps: Vec::new(),
        });
    };
    let wanted = request.range.unwrap_or(TimeRange {
        from_ms: lo,
        to_ms: hi,
    });
    let range = TimeRange {
        from_ms: wanted.from_ms.max(lo).min(hi),
        to_ms: wanted.to_ms.min(hi).max(lo),
    };
    let range = TimeRange {
        from_ms: range.from_ms,
        to_ms: range.to_ms.max(range.from_ms),
    };
    let span = range.to_ms - range.from_ms + 1;
    let points_i64 = i64::try_from(points).unwrap_or(1);
    // No bucket shorter than two sample intervals (their average where the range holds
    // samples): finer buckets would leave every other one empty, and a line broken at each
    // empty bucket draws nothing.
    let ticks = i64::try_from(store.tick_count(range)?).unwrap_or(i64::MAX);
    let min_step = match (
        store.time_after(range.from_ms.saturating_sub(1))?,
        store.time_at_or_before(range.to_ms)?,
    ) {
        (Some(first), Some(last)) if ticks > 1 && last > first => {
            (2 * (last - first) + ticks - 2) / (ticks - 1)
        }
        _ => 1,
    };
    let step = ((span + points_i64 - 1) / points_i64).max(min_step).max(1);
    let n = usize::try_from((span + step - 1) / step)
        .unwrap_or(1)
        .max(1);
    let t: Vec<i64> = (0..n)
        .map(|i| range.from_ms + i64::try_from(i).unwrap_or(0) * step)
        .collect();

    let devices: Vec<_> = store
        .devices()?
        .into_iter()
        .filter(|d| request.gpu.is_none_or(|g| d.meta.uuid == g))
        .collect();
    let device_slot: HashMap<i64, usize> =
        devices.iter().enumerate().map(|(i, d)| (d.id, i)).collect();
    let processes: HashMap<i64, ProcessRecord> = store.all_processes()?.into_iter().collect();
    let mut used: Vec<Buckets> = vec![Buckets::new(n); devices.len()];
    let mut totals: Vec<Option<u64>> = vec![None; devices.len()];
    // Per device: process row id → its buckets (index into `proc_buckets`).
    let mut proc_index: Vec<HashMap<i64, usize>> = vec![HashMap::new(); devices.len()];
    let mut proc_buckets: Vec<(i64, Buckets, u64)> = Vec::new();
    let mut allocated = Buckets::new(n);
    let mut reserved = Buckets::new(n);
    let mut uses: Vec<Option<Use>> = Vec::new();
    let mut last_bucket: Option<usize> = None;
    store.scan(range, |frame| {
        let Ok(b) = usize::try_from((frame.t_ms - range.from_ms) / step) else {
            return;
        };
        if b >= n {
            return;
        }
        // Within one bucket, a series whose entry did not change adds nothing to its
        // lowest and highest: only the changed ones are visited (a day of mostly steady
        // processes is mostly unchanged frames). A new bucket takes every series.
        let whole = last_bucket != Some(b) || frame.changed().is_none();
        last_bucket = Some(b);
        let visited: Box<dyn Iterator<Item = _>> = match frame.changed() {
            Some(ids) if !whole => Box::new(
                ids.iter()
                    .filter_map(|&id| frame.entry(id).map(|entry| (id, entry))),
            ),
            _ => Box::new(frame.entries()),
        };
        for (id, entry) in visited {
            let i = usize::try_from(id).unwrap_or(usize::MAX);
            if i >= uses.len() {
                uses.resize(i.saturating_add(1), None);
            }
            let usage = *uses[i].get_or_insert_with(|| {
                let Some(s) = frame.series(id) else {
                    return Use::Skip;
                };
                let Some(&d) = s.device_id.and_then(|d| device_slot.get(&d)) else {
                    return Use::Skip;
                };
                match (s.metric, s.process_id) {
                    (Metric::UsedBytes, None) => Use::Used(d),
                    (Metric::TotalBytes, None) => Use::Total(d),
                    (Metric::ProcessUsedBytes, Some(p)) => match request.process {
                        Some(only) if only != p => Use::Skip,
                        _ => {
                            let k = *proc_index[d].entry(p).or_insert_with(|| {
                                proc_buckets.push((p, Buckets::new(n), 0));
                                proc_buckets.len() - 1
                            });
                            Use::Process(k)
                        }
                    },
                    (Metric::ProcessAllocatedBytes, Some(p)) if request.process == Some(p) => {
                        Use::Allocated
                    }
                    (Metric::ProcessReservedBytes, Some(p)) if request.process == Some(p) => {
                        Use::Reserved
                    }
                    _ => Use::Skip,
                }
            });
            let Some((min, max, last)) = entry.min_max_last() else {
                continue;
            };
            match usage {
                Use::Used(d) => used[d].add(b, min, max),
                Use::Total(d) => totals[d] = Some(last),
                Use::Process(k) => {
                    let (_, buckets, peak) = &mut proc_buckets[k];
                    buckets.add(b, min, max);
                    *peak = (*peak).max(max);
                }
                Use::Allocated => allocated.add(b, min, max),
                Use::Reserved => reserved.add(b, min, max),
                Use::Skip => {}
            }
        }
    })?;
    let gaps = store
        .gaps(range)?
        .into_iter()
        .filter(|g| {
            g.device_uuid
                .as_deref()
                .is_none_or(|u| devices.iter().any(|d| d.meta.uuid == u))
        })
        .map(|g| GapMark {
            gpu: g.device_uuid,
            from_ms: g.from_ms,
            to_ms: g.to_ms,
        })
        .collect();
    let detail = request.process.is_some();
    let gpus = devices
        .iter()
        .enumerate()
        .filter(|(d, _)| !detail || !proc_index[*d].is_empty())
        .map(|(d, device)| {
            let mut procs: Vec<(i64, &Buckets, u64)> = proc_index[d]
                .values()
                .map(|&k| {
                    let (p, buckets, peak) = &proc_buckets[k];
                    (*p, buckets, *peak)
                })
                .collect();
            procs.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
            let rest = procs.split_off(procs.len().min(MAX_STACKED));
            let others_max = (!rest.is_empty()).then(|| {
                (0..n)
                    .map(|i| {
                        rest.iter()
                            .filter_map(|(_, b, _)| b.max[i])
                            .reduce(u64::saturating_add)
                    })
                    .collect()
            });
            GpuSeries {
                uuid: device.meta.uuid.clone(),
                index: device.meta.index,
                name: device.meta.name.clone(),
                total_bytes: totals[d],
                used_min: used[d].min.clone(),
                used_max: used[d].max.clone(),
                processes: procs
                    .into_iter()
                    .map(|(id, buckets, peak)| {
                        let meta = processes.get(&id).map(|p| &p.meta);
                        ProcessSeries {
                            id,
                            pid: meta.map_or(0, |m| m.key.pid),
                            user: meta.and_then(|m| m.user.clone()),
                            command: meta.and_then(|m| m.command.clone()),
                            peak_bytes: peak,
                            max: buckets.max.clone(),
                            allocated_max: detail.then(|| allocated.max.clone()),
                            reserved_max: detail.then(|| reserved.max.clone()),
                        }
                    })
                    .collect(),
                others_max,
            }
        })
        .collect();
    Ok(HistorySeries {
        bounds,
        from_ms: range.from_ms,
        to_ms: range.to_ms,
        step_ms: step,
        t,
        gpus,
        gaps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Store {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/h200-recording.db");
        Store::open(&path, vramctl_store::OpenMode::ReadOnly).expect("the example recording")
    }

    fn extremes(series: &HistorySeries) -> (u64, u64) {
        let gpu = &series.gpus[0];
        let max = gpu.used_max.iter().flatten().copied().max().expect("a max");
        let min = gpu.used_min.iter().flatten().copied().min().expect("a min");
        (min, max)
    }

    #[test]
    fn peaks_and_dips_survive_any_number_of_buckets() {
        let mut store = example();
        let request = |points| SeriesRequest {
            gpu: None,
            range: None,
            points,
            process: None,
        };
        let fine = history_series(&mut store, request(MAX_POINTS)).expect("fine");
        for points in [1, 7, 60, 500] {
            let coarse = history_series(&mut store, request(points)).expect("coarse");
            assert!(coarse.t.len() <= points);
            assert_eq!(coarse.gpus[0].used_max.len(), coarse.t.len());
            assert_eq!(extremes(&coarse), extremes(&fine), "{points} buckets");
            let peak = |s: &HistorySeries, pid: u32| {
                s.gpus[0]
                    .processes
                    .iter()
                    .find(|p| p.pid == pid)
                    .map(|p| p.peak_bytes)
            };
            // leak_fast.py's peak (examples/README.md) whatever the bucketing.
            assert_eq!(peak(&coarse, 681), peak(&fine, 681));
        }
        // 2000 buckets asked of 1 080 samples: no bucket shorter than two sample intervals.
        let samples = store
            .tick_count(TimeRange {
                from_ms: fine.from_ms,
                to_ms: fine.to_ms,
            })
            .expect("ticks");
        assert!(samples > 1000, "{samples}");
        let buckets = u64::try_from(fine.t.len()).expect("len");
        // (Within 2 %: the buckets cover the range, the samples' average interval is
        // measured between the first and the last.)
        assert!(
            buckets * 2 * 100 <= samples * 102,
            "{buckets} buckets of {samples} samples"
        );
        let empty = fine.gpus[0].used_max.iter().filter(|v| v.is_none()).count();
        assert!(
            empty * 20 < fine.t.len(),
            "{empty} empty buckets of {}",
            fine.t.len()
        );
    }

    #[test]
    fn only_the_biggest_processes_are_drawn_one_by_one() {
        let mut store = example();
        let series = history_series(
            &mut store,
            SeriesRequest {
                gpu: None,
                range: None,
                points: 100,
                process: None,
            },
        )
        .expect("series");
        let gpu = &series.gpus[0];
        let recorded = store.all_processes().expect("processes").len();
        assert_eq!(recorded, 8, "examples/README.md's eight processes");
        assert_eq!(gpu.processes.len(), recorded.min(MAX_STACKED));
        assert_eq!(gpu.others_max.is_some(), recorded > MAX_STACKED);
        assert!(
            gpu.processes
                .windows(2)
                .all(|w| w[0].peak_bytes >= w[1].peak_bytes)
        );
    }

    #[test]
    fn one_process_gets_its_own_curve() {
        let mut store = example();
        let all = history_series(
            &mut store,
            SeriesRequest {
                gpu: None,
                range: None,
                points: 50,
                process: None,
            },
        )
        .expect("series");
        let leak = all.gpus[0]
            .processes
            .iter()
            .find(|p| p.pid == 681)
            .expect("leak_fast.py");
        let one = history_series(
            &mut store,
            SeriesRequest {
                gpu: None,
                range: None,
                points: 50,
                process: Some(leak.id),
            },
        )
        .expect("one");
        assert_eq!(one.gpus[0].processes.len(), 1);
        assert_eq!(one.gpus[0].processes[0].max, leak.max);
        assert!(one.gpus[0].processes[0].allocated_max.is_some());
    }
}
