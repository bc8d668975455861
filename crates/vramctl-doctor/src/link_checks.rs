//! The checks of how GPUs connect: a GPU's NVLinks (`nvlink`) and P2P between two GPUs a
//! job uses together (`p2p`). Pure functions of the facts; only what NVML said is judged.
//!
//! Neither check says anything where NVML has nothing to say (a PCIe-only GPU has no
//! NVLink; a driver that does not answer P2P status): no finding then, so a host without
//! these facts reads as before.

use std::collections::{BTreeMap, BTreeSet};

use vramctl_core::topology::{GpuPair, P2pStatus, active_count, describe_p2p, inactive_links};
use vramctl_core::types::{DeviceDiagnostics, NVLINKS_KEY};

use super::{Finding, GpuFacts, Status};

/// `nvlink`: links NVML reports down while others of the same GPU are up. `None` for a GPU
/// without NVLink.
pub fn nvlink(diag: &DeviceDiagnostics, subject: &str, index: u32) -> Option<Finding> {
    let id = "nvlink";
    let Some(links) = &diag.nvlinks else {
        return diag.missing.get(NVLINKS_KEY).map(|why| {
            Finding::new(id, subject, Status::Skipped, format!("NVLinks: {why}")).gpu(index)
        });
    };
    if links.is_empty() {
        return None;
    }
    let active = active_count(links);
    let down = inactive_links(links);
    let total = links.len();
    let finding = |status, summary| {
        Finding::new(id, subject, status, summary)
            .gpu(index)
            .fact("links", total)
            .fact("active", active)
            .fact("inactive_links", &down)
    };
    Some(if down.is_empty() {
        finding(Status::Ok, format!("{active} of {total} NVLinks active"))
    } else if active == 0 {
        // A card with NVLink and no bridge, or a board whose links are not wired: nothing
        // says a link should be up.
        finding(
            Status::Skipped,
            format!("no NVLink active (0 of {total}): none connected, not judged"),
        )
    } else {
        let which = down
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let noun = if down.len() == 1 { "link" } else { "links" };
        finding(
            Status::Warn,
            format!(
                "NVLink {noun} {which} inactive while {active} of {total} are active: less \
                 bandwidth to its peers"
            ),
        )
        .fix(format!(
            "compare nvidia-smi nvlink -s -i {index}; look for Xid 74 (NVLink error) in the \
             kernel log; a GPU reset or a reboot retrains the links, else report the board"
        ))
    })
}

/// `p2p`: P2P reads or writes NVML says do not work between two GPUs, judged by whether a
/// job uses both: one process listed on both GPUs, or two processes of one parent (the
/// ranks of `torchrun`, `deepspeed`, `mpirun`) one on each. `parents` maps a listed PID to
/// its parent's, where /proc showed it. `None` where NVML gave no P2P status.
pub fn p2p(pair: &GpuPair, gpus: &[GpuFacts], parents: &BTreeMap<u32, u32>) -> Option<Finding> {
    let id = "p2p";
    let (read, write) = (pair.facts.p2p_read, pair.facts.p2p_write);
    if read.is_none() && write.is_none() {
        return None;
    }
    let [a, b] = pair.gpus;
    let subject = format!("GPU {a},{b}");
    let path = pair
        .smi_label()
        .map_or_else(String::new, |l| format!(", path {l}"));
    let shared = shared_jobs(pair, gpus, parents);
    let finding = |status, summary| {
        Finding::new(id, subject.as_str(), status, summary)
            .fact("gpus", pair.gpus)
            .fact("p2p_read", read)
            .fact("p2p_write", write)
            .fact("level", pair.facts.level)
            .fact("nvlinks", pair.nvlinks)
            .fact("shared_pids", &shared)
    };
    let what = if read == write {
        format!("P2P read and write {}", describe_p2p(read))
    } else {
        format!(
            "P2P read {}, write {}",
            describe_p2p(read),
            describe_p2p(write)
        )
    };
    if read == Some(P2pStatus::Ok) && write == Some(P2pStatus::Ok) {
        return Some(finding(Status::Ok, format!("{what}{path}")));
    }
    if shared.is_empty() {
        return Some(finding(
            Status::Ok,
            format!("{what}{path}; no job uses both GPUs now"),
        ));
    }
    Some(
        finding(
            Status::Warn,
            format!(
                "{what}{path}, and {}: its transfers between them go through host memory",
                evidence(pair, gpus, parents, &shared)
            ),
        )
        .fix(
            "place the job on GPUs that nvidia-smi topo -p2p r and -p2p w mark OK; the \
             reason above is NVML's",
        ),
    )
}

/// What says one job uses both GPUs, in words: a process listed on both, or processes of
/// one parent split over them (which is how `torchrun`'s ranks look, but also two jobs one
/// shell started: said as "likely").
fn evidence(
    pair: &GpuPair,
    gpus: &[GpuFacts],
    parents: &BTreeMap<u32, u32>,
    shared: &[u32],
) -> String {
    let join = |pids: &[u32]| {
        pids.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (on_a, on_b) = (listed(gpus, pair.gpus[0]), listed(gpus, pair.gpus[1]));
    let (on_both, siblings): (Vec<u32>, Vec<u32>) = shared
        .iter()
        .partition(|pid| on_a.contains(pid) && on_b.contains(pid));
    let mut parts = Vec::new();
    if !on_both.is_empty() {
        let noun = if on_both.len() == 1 { "PID" } else { "PIDs" };
        parts.push(format!(
            "a job uses both GPUs ({noun} {} on both)",
            join(&on_both)
        ));
    }
    let mut by_parent: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for pid in siblings {
        if let Some(&parent) = parents.get(&pid) {
            by_parent.entry(parent).or_default().push(pid);
        }
    }
    for (parent, pids) in by_parent {
        parts.push(format!(
            "PIDs {} on the two GPUs are children of PID {parent}, likely ranks of one job",
            join(&pids)
        ));
    }
    parts.join("; ")
}

/// The listed PIDs by which a job spans both GPUs of `pair`: a PID on both, or on either
/// GPU a PID whose parent also has a child on the other.
fn shared_jobs(pair: &GpuPair, gpus: &[GpuFacts], parents: &BTreeMap<u32, u32>) -> Vec<u32> {
    let (on_a, on_b) = (listed(gpus, pair.gpus[0]), listed(gpus, pair.gpus[1]));
    // Parent 0 is outside our namespace, 1 is init: neither makes two processes one job.
    let parent = |pid: &u32| parents.get(pid).copied().filter(|p| *p > 1);
    let parents_a: BTreeSet<u32> = on_a.iter().filter_map(parent).collect();
    let parents_b: BTreeSet<u32> = on_b.iter().filter_map(parent).collect();
    on_a.union(&on_b)
        .copied()
        .filter(|pid| {
            (on_a.contains(pid) && on_b.contains(pid))
                || parent(pid).is_some_and(|p| parents_a.contains(&p) && parents_b.contains(&p))
        })
        .collect()
}

/// The PIDs NVML lists on the GPU of `index`.
fn listed(gpus: &[GpuFacts], index: u32) -> BTreeSet<u32> {
    gpus.iter()
        .filter(|g| g.id.index == index)
        .filter_map(|g| g.reading.as_ref())
        .flat_map(|r| r.processes.iter().flatten().map(|p| p.pid))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::GpuIdentity;
    use super::*;
    use vramctl_core::topology::{NvLink, NvLinkRemote, PairFacts, TopologyLevel};
    use vramctl_core::types::{DeviceReading, ProcessKind, ProcessUsage, Unavailable};

    fn links(down: &[u32]) -> Vec<NvLink> {
        (0..18)
            .map(|link| {
                let active = !down.contains(&link);
                NvLink {
                    link,
                    active,
                    version: None,
                    remote_pci_bus_id: None,
                    remote_device: active.then_some(NvLinkRemote::Switch),
                }
            })
            .collect()
    }

    fn diag(nvlinks: Option<Vec<NvLink>>) -> DeviceDiagnostics {
        DeviceDiagnostics {
            nvlinks,
            ..DeviceDiagnostics::default()
        }
    }

    #[test]
    fn a_link_down_beside_active_ones_is_a_warning() {
        let f = nvlink(&diag(Some(links(&[7]))), "GPU 1", 1).expect("a finding");
        assert_eq!(f.status, Status::Warn);
        assert_eq!(
            f.summary,
            "NVLink link 7 inactive while 17 of 18 are active: less bandwidth to its peers"
        );
        assert_eq!(f.facts["inactive_links"], serde_json::json!([7]));
        assert!(f.fix.expect("a fix").contains("nvidia-smi nvlink -s -i 1"));
        let ok = nvlink(&diag(Some(links(&[]))), "GPU 0", 0).expect("a finding");
        assert_eq!(
            (ok.status, ok.summary.as_str()),
            (Status::Ok, "18 of 18 NVLinks active")
        );
    }

    #[test]
    fn no_link_up_is_not_judged_and_no_nvlink_says_nothing() {
        let all_down: Vec<u32> = (0..18).collect();
        let f = nvlink(&diag(Some(links(&all_down))), "GPU 0", 0).expect("a finding");
        assert_eq!(f.status, Status::Skipped);
        assert_eq!(nvlink(&diag(None), "GPU 0", 0), None, "a PCIe-only GPU");
        let mut failed = diag(None);
        failed.missing.insert(
            NVLINKS_KEY.into(),
            Unavailable::Error("unknown error".into()),
        );
        let f = nvlink(&failed, "GPU 0", 0).expect("a finding");
        assert_eq!(
            (f.status, f.summary.as_str()),
            (Status::Skipped, "NVLinks: unknown error")
        );
    }

    fn gpu(index: u32, pids: &[u32]) -> GpuFacts {
        GpuFacts {
            id: GpuIdentity {
                index,
                uuid: format!("GPU-{index}"),
                name: None,
                minor_number: Some(index),
                pci_bus_id: None,
            },
            diagnostics: Ok(DeviceDiagnostics::default()),
            health: Ok(None),
            reading: Some(DeviceReading {
                processes: Some(
                    pids.iter()
                        .map(|pid| ProcessUsage {
                            pid: *pid,
                            used_bytes: Some(1 << 30),
                            kind: ProcessKind::Compute,
                            gpu_instance_id: None,
                            compute_instance_id: None,
                        })
                        .collect(),
                ),
                ..DeviceReading::default()
            }),
        }
    }

    fn pair(read: Option<P2pStatus>, write: Option<P2pStatus>) -> GpuPair {
        GpuPair {
            gpus: [0, 1],
            uuids: ["GPU-0".into(), "GPU-1".into()],
            facts: PairFacts {
                level: Some(TopologyLevel::System),
                p2p_read: read,
                p2p_write: write,
                ..PairFacts::default()
            },
            nvlinks: Some(0),
        }
    }

    #[test]
    fn p2p_off_between_gpus_a_process_uses_together_is_a_warning() {
        let p = pair(Some(P2pStatus::Ok), Some(P2pStatus::ChipsetNotSupported));
        let gpus = [gpu(0, &[100, 200]), gpu(1, &[100])];
        let f = p2p(&p, &gpus, &BTreeMap::new()).expect("a finding");
        assert_eq!(f.status, Status::Warn);
        assert_eq!(f.subject, "GPU 0,1");
        assert_eq!(
            f.summary,
            "P2P read ok, write not supported (chipset), path SYS, and a job uses both GPUs \
             (PID 100 on both): its transfers between them go through host memory"
        );
        assert_eq!(f.facts["shared_pids"], serde_json::json!([100]));
    }

    #[test]
    fn ranks_of_one_launcher_are_one_job_and_strangers_are_not() {
        let p = pair(Some(P2pStatus::NotSupported), Some(P2pStatus::NotSupported));
        let gpus = [gpu(0, &[101, 300]), gpu(1, &[102, 301])];
        // 101 and 102: torchrun's (50) ranks; 300 and 301: children of init and of a
        // parent outside our namespace.
        let parents = BTreeMap::from([(101, 50), (102, 50), (300, 1), (301, 0)]);
        let f = p2p(&p, &gpus, &parents).expect("a finding");
        assert_eq!(f.status, Status::Warn);
        assert_eq!(f.facts["shared_pids"], serde_json::json!([101, 102]));
        assert_eq!(
            f.summary,
            "P2P read and write not supported, path SYS, and PIDs 101, 102 on the two GPUs \
             are children of PID 50, likely ranks of one job: its transfers between them go \
             through host memory"
        );
        let strangers = BTreeMap::from([(101, 50), (102, 51)]);
        let f = p2p(&p, &gpus, &strangers).expect("a finding");
        assert_eq!(f.status, Status::Ok);
        assert_eq!(
            f.summary,
            "P2P read and write not supported, path SYS; no job uses both GPUs now"
        );
    }

    #[test]
    fn p2p_that_works_is_ok_and_no_answer_is_no_finding() {
        let mut p = pair(Some(P2pStatus::Ok), Some(P2pStatus::Ok));
        p.nvlinks = Some(18);
        let f = p2p(&p, &[gpu(0, &[7]), gpu(1, &[7])], &BTreeMap::new()).expect("a finding");
        assert_eq!(
            (f.status, f.summary.as_str()),
            (Status::Ok, "P2P read and write ok, path NV18")
        );
        assert_eq!(p2p(&pair(None, None), &[], &BTreeMap::new()), None);
    }
}
