//! A Slurm job's GPU memory peak per device, read back from the history after the job ended
//! (what a Slurm epilog reports): the most the job's processes held together on each
//! device at one recorded time, at the recorder's resolution.
//!
//! A job's processes are those whose `slurm_job_id` the recorder stored when it first saw
//! them (schema 3). A history without that column, or a job none of whose processes were
//! seen, has no peak: an empty answer, never a guess from users or times.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use crate::db::Store;
use crate::error::StoreError;
use crate::model::{Metric, TimeRange};

/// One device's peak of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobPeak {
    /// The device's row id ([`Store::devices`] names it).
    pub device_id: i64,
    /// The most the job's processes held together on the device (NVML's per-process
    /// figures), in bytes.
    pub peak_bytes: u64,
    /// When (sample time, or start of a downsampled bucket).
    pub at_unix_ms: i64,
    /// 0 for a raw sample; else the bucket's length, and the peak is the sum of each
    /// process's maximum in the bucket (an upper bound when they peaked apart).
    pub span_ms: i64,
    /// At that time, the bytes in live tensors of the job's processes with an agent (the
    /// in-process agent's figure), when any had one.
    pub allocated_bytes: Option<u64>,
    /// At that time, the bytes the allocators of those processes held from the driver.
    pub reserved_bytes: Option<u64>,
    /// How many of the job's processes held memory on the device then.
    pub processes: usize,
}

impl Store {
    /// The row ids of the processes stored with Slurm job `job_id`, and the first time any
    /// of them was seen. Empty for a history older than schema 3.
    ///
    /// # Errors
    /// When SQLite fails.
    pub fn job_processes(&self, job_id: u32) -> Result<(Vec<i64>, Option<i64>), StoreError> {
        if !self.slurm_column {
            return Ok((Vec::new(), None));
        }
        let err = |e| StoreError::sqlite(&self.path, "cannot read a job's processes", e);
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id, first_seen_ms FROM process WHERE slurm_job_id = ?1")
            .map_err(err)?;
        let rows: Vec<(i64, i64)> = stmt
            .query_map([job_id], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect())
            .map_err(err)?;
        let first = rows.iter().map(|r| r.1).min();
        Ok((rows.into_iter().map(|r| r.0).collect(), first))
    }

    /// Job `job_id`'s peak on each device it used, by device id; empty when the history
    /// knows no process of that job.
    ///
    /// # Errors
    /// When SQLite fails or a frame is damaged.
    pub fn job_peaks(&mut self, job_id: u32) -> Result<Vec<JobPeak>, StoreError> {
        let (ids, first_seen) = self.job_processes(job_id)?;
        let Some(from_ms) = first_seen else {
            return Ok(Vec::new());
        };
        let ids: HashSet<i64> = ids.into_iter().collect();
        let mut peaks: BTreeMap<i64, JobPeak> = BTreeMap::new();
        self.scan(
            TimeRange {
                from_ms,
                to_ms: i64::MAX,
            },
            |frame| {
                // device id → (used, processes, allocated, reserved) of the job now.
                let mut now: BTreeMap<i64, (u64, usize, Option<u64>, Option<u64>)> =
                    BTreeMap::new();
                for (series, entry) in frame.iter() {
                    let (Some(process), Some(device)) = (series.process_id, series.device_id)
                    else {
                        continue;
                    };
                    if !ids.contains(&process) {
                        continue;
                    }
                    let Some((_, max, _)) = entry.min_max_last() else {
                        continue;
                    };
                    let slot = now.entry(device).or_default();
                    match series.metric {
                        Metric::ProcessUsedBytes => {
                            slot.0 = slot.0.saturating_add(max);
                            slot.1 += 1;
                        }
                        Metric::ProcessAllocatedBytes => {
                            slot.2 = Some(slot.2.unwrap_or(0).saturating_add(max));
                        }
                        Metric::ProcessReservedBytes => {
                            slot.3 = Some(slot.3.unwrap_or(0).saturating_add(max));
                        }
                        _ => {}
                    }
                }
                for (device, (used, processes, allocated, reserved)) in now {
                    if processes == 0 {
                        continue;
                    }
                    let better = peaks.get(&device).is_none_or(|p| used > p.peak_bytes);
                    if better {
                        peaks.insert(
                            device,
                            JobPeak {
                                device_id: device,
                                peak_bytes: used,
                                at_unix_ms: frame.t_ms,
                                span_ms: frame.span_ms,
                                allocated_bytes: allocated,
                                reserved_bytes: reserved,
                                processes,
                            },
                        );
                    }
                }
            },
        )?;
        Ok(peaks.into_values().collect())
    }
}

#[cfg(test)]
mod tests {
    use crate::OpenMode;
    use crate::model::{
        DeviceSample, DeviceSampleState, Observed, ProcessList, ProcessOnDevice, SessionInfo,
        TickSample,
    };
    use crate::writer::tests::{GIB, T0, gpu, process};

    use super::*;

    /// One GPU; `(pid, job, bytes)` per process.
    fn tick(t: i64, procs: &[(u32, Option<u32>, u64)]) -> TickSample {
        TickSample {
            at_unix_ms: t,
            unavailable: None,
            devices: vec![DeviceSample {
                device: gpu("GPU-a", 0),
                state: DeviceSampleState::Read {
                    metrics: vec![(
                        Metric::UsedBytes,
                        Observed::Value(procs.iter().map(|p| p.2).sum()),
                    )],
                    processes: ProcessList::Observed(
                        procs
                            .iter()
                            .map(|&(pid, _, b)| ProcessOnDevice {
                                pid,
                                used_bytes: Some(b),
                                sm_percent: None,
                                agent: None,
                            })
                            .collect(),
                    ),
                },
            }],
            processes: procs
                .iter()
                .map(|&(pid, job, _)| {
                    let mut sample = process(pid, 1000 + u64::from(pid));
                    sample.meta.slurm_job_id = job;
                    sample
                })
                .collect(),
        }
    }

    #[test]
    fn a_jobs_peak_is_its_processes_together_at_one_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.db");
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        store.begin_session(&SessionInfo::default()).unwrap();
        // Job 7: processes 10 and 11; 12 belongs to job 8, 13 to none. Each of 10 and 11
        // peaks alone at another time (3 GiB, 4 GiB); together they peak at t+2 (5 GiB).
        let j = |pid| match pid {
            10 | 11 => Some(7),
            12 => Some(8),
            _ => None,
        };
        let ticks: [&[(u32, u64)]; 4] = [
            &[(10, 3), (11, 1), (12, 9), (13, 20)],
            &[(10, 1), (11, 1), (12, 9), (13, 20)],
            &[(10, 2), (11, 3), (12, 1), (13, 20)],
            &[(10, 0), (11, 4), (13, 20)],
        ];
        for (i, procs) in ticks.iter().enumerate() {
            let procs: Vec<_> = procs.iter().map(|&(p, g)| (p, j(p), g * GIB)).collect();
            store.append(&tick(T0 + 1000 * i as i64, &procs)).unwrap();
        }
        store.close().unwrap();

        let mut reader = Store::open(&path, OpenMode::ReadOnly).unwrap();
        let device = reader.devices().unwrap()[0].id;
        let peaks = reader.job_peaks(7).unwrap();
        assert_eq!(
            peaks,
            [JobPeak {
                device_id: device,
                peak_bytes: 5 * GIB,
                at_unix_ms: T0 + 2000,
                span_ms: 0,
                allocated_bytes: None,
                reserved_bytes: None,
                processes: 2,
            }]
        );
        assert_eq!(reader.job_peaks(8).unwrap()[0].peak_bytes, 9 * GIB);
        assert_eq!(reader.job_peaks(9).unwrap(), [], "no process of job 9");
        let stored = reader.all_processes().unwrap();
        let job_of = |pid| {
            stored
                .values()
                .find(|p| p.meta.key.pid == pid)
                .and_then(|p| p.meta.slurm_job_id)
        };
        assert_eq!(
            (job_of(10), job_of(12), job_of(13)),
            (Some(7), Some(8), None)
        );
    }
}
