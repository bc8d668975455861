//! What the PIDs of an observation mean, and the host daemon's answer for a caller in
//! another PID namespace (a container, a pod, an `unshare --pid` shell).
//!
//! Drivers differ in how NVML numbers processes for a caller in another PID namespace. The
//! peers' reports (up to driver 550) say host PIDs, which nothing inside a container maps
//! back: the container's /proc lists its own PIDs, and since Linux 4.14 `/proc/PID/sched`
//! shows those too. Driver 580 numbers them in the caller's namespace and leaves out the
//! others' (measured on an H200, docs/owners.md). Which one a driver does is checked, not
//! assumed: [`rows_held_here`] accepts NVML's rows as this namespace's only when each is a
//! process here holding that GPU's device file open ([`PidView::DriverNumbered`]).
//!
//! The host can always map: its /proc gives every process's PID
//! namespace (`/proc/PID/ns/pid`) and its PID in each namespace from the host's down to its
//! own (`NSpid:`), and `SO_PEERCRED` gives the caller's host PID, so its namespace. A host
//! daemon ([`crate::daemon_socket`]) therefore answers a caller in another namespace with
//! [`map_for_namespace`]: only the processes whose PID namespace is the caller's, each
//! under its PID there, and everything else on a device as one figure with no PID, user or
//! command. Without either the caller cannot map and says so ([`PidView::CannotMap`]).
//!
//! docs/owners.md "Inside a container" says which setups each method works in.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use vramctl_core::types::{DeviceState, Snapshot};
use vramctl_procs::procinfo::{self, PidNamespace};

/// What the PIDs of an observation are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum PidView {
    /// NVML's PIDs are this /proc's: vramctl runs in the host's PID namespace, or its /proc
    /// is the host's, or a daemon in its own namespace answered.
    #[default]
    Same,
    /// A host daemon answered for this PID namespace: the listed processes are this
    /// namespace's, under its PIDs; the rest is one figure per device.
    Mapped(NamespaceView),
    /// No daemon answered, and the driver numbered NVML's rows in this namespace: every PID
    /// NVML lists is a process here holding that GPU's device file open ([`rows_held_here`]).
    /// Driver 580 does this (measured on an H200: inside an `unshare --pid` namespace NVML
    /// listed the holder as PID 2 and left out the host's processes); the check, not the
    /// driver's version, decides. Other namespaces' processes are not listed at all, so
    /// there is no "others" figure.
    DriverNumbered(DriverNumbered),
    /// NVML's PIDs could not be matched with this namespace's processes, and no daemon
    /// mapped them: the processes are listed under NVML's PIDs, marked as host PIDs, with
    /// no /proc facts.
    CannotMap(Unmapped),
}

impl PidView {
    /// NVML's (the host's) PID of `pid` as listed, where it differs from `pid` or cannot
    /// be mapped; `None` where `pid` is NVML's and this namespace's alike.
    pub fn host_pid(&self, pid: u32) -> Option<u32> {
        match self {
            Self::Same => None,
            Self::Mapped(view) => view.host_pids.get(&pid).copied(),
            Self::DriverNumbered(_) => None,
            Self::CannotMap(_) => Some(pid),
        }
    }

    /// Whether the PIDs are NVML's and this /proc's alike (serde's `skip_serializing_if`).
    pub fn is_same(&self) -> bool {
        matches!(self, Self::Same)
    }

    /// Whether the listed PIDs may be looked up in this /proc.
    pub fn pids_are_ours(&self) -> bool {
        !matches!(self, Self::CannotMap(_))
    }

    /// The word JSON uses: `same`, `mapped`, `driver_numbered`, `cannot_map`.
    pub fn mode(&self) -> &'static str {
        match self {
            Self::Same => "same",
            Self::Mapped(_) => "mapped",
            Self::DriverNumbered(_) => "driver_numbered",
            Self::CannotMap(_) => "cannot_map",
        }
    }

    /// Memory of processes outside this namespace on the device `index`, with a mapped view.
    pub fn others_on(&self, index: u32) -> Option<&OtherHolders> {
        match self {
            Self::Mapped(view) => view.others.iter().find(|o| o.index == index),
            _ => None,
        }
    }
}

/// The daemon's answer for one PID namespace (in the reply as `mapped`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceView {
    /// The inode of the caller's PID namespace the answer was made for: a client uses the
    /// answer only when it is its own.
    pub pid_namespace: u64,
    /// The namespace's PID → the host's (NVML's) PID, of each process listed.
    pub host_pids: BTreeMap<u32, u32>,
    /// Per device where processes outside the namespace hold memory: how many and how much.
    pub others: Vec<OtherHolders>,
}

/// Memory held on one device by processes of other containers or of the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OtherHolders {
    /// The device's index.
    pub index: u32,
    /// The device's UUID.
    pub uuid: String,
    /// How many processes.
    pub processes: u32,
    /// Their memory; `None` when the driver reports any of it "not available".
    pub used_bytes: Option<u64>,
}

/// What showed that the driver numbered NVML's rows in this namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverNumbered {
    /// The rows checked: each a process here with its GPU's device file open.
    pub rows_checked: u32,
}

/// Whether NVML's rows in `snapshot` can be this namespace's processes, from what this
/// namespace sees by itself: `files_of(pid)` gives the NVIDIA device files the process with
/// that PID here has open (`None`: no such process, or its descriptors cannot be read).
/// `Ok(rows)` when every PID NVML lists on a device is a process here holding that device's
/// `/dev/nvidia<minor>` open; `Err(why)` for the first row that is not, or when nothing can
/// be checked (no rows, a device whose minor number NVML does not give). Only the listed
/// PIDs are read.
///
/// Why this is evidence and not a guess: a driver that reports host PIDs passes only if
/// every host PID it lists happens to be the number, here, of a process holding that same
/// GPU open. A process that holds the device but has no context (a forked DataLoader worker
/// inherits the descriptors) does not matter: only NVML's rows are checked, not the
/// holders. A process whose descriptors cannot be read (another user's, for a caller that
/// is not root) fails the check, so the answer falls back to "cannot map".
///
/// `held_before` are the PIDs an earlier check of the same loop accepted. One of them that
/// no longer holds any NVIDIA device file here (gone, or exiting with its descriptors
/// closed) still passes: at exit the kernel closes a process's descriptors, and its parent
/// may reap it, a tick or two before the driver lets go of its context, so NVML lists it
/// one last time (measured on an H100, driver 580: `run`'s job was one such tick). Such a
/// row is this namespace's by the earlier check; a driver that numbers host PIDs never
/// passed one.
pub fn rows_held_here(
    snapshot: &Snapshot,
    files_of: &mut dyn FnMut(u32) -> Option<Vec<String>>,
    held_before: &BTreeSet<u32>,
) -> Result<u32, String> {
    let mut rows = 0_u32;
    for device in &snapshot.devices {
        let DeviceState::Ok(reading) = &device.state else {
            continue;
        };
        let Some(processes) = reading.processes.as_ref().filter(|p| !p.is_empty()) else {
            continue;
        };
        let Some(minor) = device.info.minor_number else {
            return Err(format!(
                "NVML gives no minor number for GPU {}, so its device file is unknown",
                device.info.index
            ));
        };
        let file = format!("/dev/nvidia{minor}");
        for p in processes {
            let files = files_of(p.pid);
            let departing =
                held_before.contains(&p.pid) && files.as_ref().is_none_or(|files| files.is_empty());
            if !departing && !files.is_some_and(|files| files.contains(&file)) {
                return Err(format!(
                    "NVML lists PID {} on GPU {}, and no process here with that PID holds {file} \
                     open (or its descriptors cannot be read)",
                    p.pid, device.info.index
                ));
            }
            rows = rows.saturating_add(1);
        }
    }
    if rows == 0 {
        return Err("NVML lists no process here to check".into());
    }
    Ok(rows)
}

/// What NVML's PIDs are when NVML is read here. Whether this /proc is the host's is read
/// once ([`LocalPids::here`]); a loop keeps one and asks [`LocalPids::view`] per snapshot,
/// which remembers the PIDs it last accepted as driver-numbered (so a process's last
/// listing after its exit is still this namespace's: [`rows_held_here`]).
#[derive(Debug, Clone)]
pub struct LocalPids {
    /// This /proc lists the host's PIDs, which are NVML's.
    host: bool,
    /// The PIDs of the last view accepted as [`PidView::DriverNumbered`].
    accepted: BTreeSet<u32>,
}

impl LocalPids {
    /// This process's PID namespace, read now.
    pub fn here() -> Self {
        Self {
            host: PidNamespace::current().proc_shows_host_pids(),
            accepted: BTreeSet::new(),
        }
    }

    /// Whether this /proc lists the host's PIDs (then every view is [`PidView::Same`]).
    pub fn is_host(&self) -> bool {
        self.host
    }

    /// What the PIDs of `snapshot`, read from NVML here, are: ours where this /proc lists
    /// the host's PIDs; this namespace's where the driver numbered them so (each row a
    /// process here holding that GPU open: [`rows_held_here`], which reads only the listed
    /// PIDs' descriptors); otherwise PIDs that cannot be mapped, with no device holders
    /// listed ([`local_pid_view`] adds them for a command that shows them).
    pub fn view(&mut self, snapshot: &Snapshot) -> PidView {
        if self.host {
            return PidView::Same;
        }
        let mut files_of = |pid: u32| procinfo::gpu_device_files(pid).ok();
        match rows_held_here(snapshot, &mut files_of, &self.accepted) {
            Ok(rows_checked) => {
                self.accepted = vramctl_procs::process_catalog::listed_pids(snapshot)
                    .into_iter()
                    .collect();
                PidView::DriverNumbered(DriverNumbered { rows_checked })
            }
            Err(why) => PidView::CannotMap(Unmapped {
                reason: format!(
                    "this PID namespace is not the host's, no host daemon answered for it, and \
                     NVML's PIDs could not be checked against this namespace's processes \
                     ({why}): they are shown as NVML gives them (host PIDs on drivers that \
                     number processes in the host's namespace)"
                ),
                gpu_device_holders: Vec::new(),
            }),
        }
    }
}

/// [`LocalPids::view`] for a one-shot command (`ps`, `status`), and where the PIDs cannot
/// be mapped, the processes of this namespace that hold an NVIDIA device file open (what
/// the namespace can tell by itself; every process's descriptors are read for it).
pub fn local_pid_view(snapshot: &Snapshot) -> PidView {
    let mut view = LocalPids::here().view(snapshot);
    if let PidView::CannotMap(unmapped) = &mut view {
        unmapped.gpu_device_holders = procinfo::holders_of(procinfo::GPU_DEVICE_PREFIX)
            .into_iter()
            .map(|(pid, files)| DeviceHolder { pid, files })
            .collect();
    }
    view
}

/// What a namespace sees without a mapping.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unmapped {
    /// Why no mapping: the words a user reads.
    pub reason: String,
    /// The processes of this namespace that hold an NVIDIA device file open (`/dev/nvidia*`),
    /// with those files: this namespace's GPU users, whose memory NVML lists under host
    /// PIDs that cannot be told apart here. Listed for a one-shot command that shows them
    /// ([`local_pid_view`]); empty in a loop's views ([`LocalPids::view`]).
    pub gpu_device_holders: Vec<DeviceHolder>,
}

/// A process of this namespace with NVIDIA device files open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceHolder {
    /// Its PID here.
    pub pid: u32,
    /// The device files (`/dev/nvidia0`, `/dev/nvidiactl`, …).
    pub files: Vec<String>,
}

/// Keeps in `snapshot` only the processes `members` names (host PID → PID in the caller's
/// namespace), renumbered to the caller's PIDs, and sums every other process per device
/// into [`OtherHolders`]. Drops what would name another process otherwise: per-process
/// activity of non-members and the `dropped` notes (which quote PIDs). Device-wide figures
/// (memory used, utilisation) stay: the caller's own NVML shows them too.
pub fn map_for_namespace(
    snapshot: &mut Snapshot,
    pid_namespace: u64,
    members: &BTreeMap<u32, u32>,
) -> NamespaceView {
    let mut view = NamespaceView {
        pid_namespace,
        ..NamespaceView::default()
    };
    for device in &mut snapshot.devices {
        let DeviceState::Ok(reading) = &mut device.state else {
            continue;
        };
        reading.dropped.clear();
        if let Some(activity) = reading.process_activity.as_mut() {
            activity.retain(|a| members.contains_key(&a.pid));
            for a in activity.iter_mut() {
                a.pid = members.get(&a.pid).copied().unwrap_or(a.pid);
            }
        }
        let Some(processes) = reading.processes.as_mut() else {
            continue;
        };
        let mut other_pids = BTreeSet::new();
        let mut other_bytes = Some(0_u64);
        processes.retain(|p| {
            if members.contains_key(&p.pid) {
                return true;
            }
            other_pids.insert(p.pid);
            other_bytes = match (other_bytes, p.used_bytes) {
                (Some(sum), Some(used)) => Some(sum.saturating_add(used)),
                _ => None,
            };
            false
        });
        for p in processes.iter_mut() {
            if let Some(&ns_pid) = members.get(&p.pid) {
                view.host_pids.insert(ns_pid, p.pid);
                p.pid = ns_pid;
            }
        }
        if !other_pids.is_empty() {
            view.others.push(OtherHolders {
                index: device.info.index,
                uuid: device.info.uuid.clone(),
                processes: u32::try_from(other_pids.len()).unwrap_or(u32::MAX),
                used_bytes: other_bytes,
            });
        }
    }
    view
}

/// Who among `listed` (host PIDs) runs in the PID namespace `caller`, with its PID there:
/// `namespace_of(pid)` is its namespace's inode and `nspid_of(pid)` its `NSpid:` chain as
/// the host's /proc reads them. A process either cannot be read for is left out (it becomes
/// part of the others' figure), and so is one nested deeper (a namespace inside the
/// caller's): telling a nested namespace from a sibling's needs the kernel's namespace
/// parent, which /proc does not give.
pub fn members_of(
    listed: &[u32],
    caller: u64,
    namespace_of: &mut dyn FnMut(u32) -> Option<u64>,
    nspid_of: &mut dyn FnMut(u32) -> Option<Vec<u32>>,
) -> BTreeMap<u32, u32> {
    let mut members = BTreeMap::new();
    for &pid in listed {
        if namespace_of(pid) != Some(caller) {
            continue;
        }
        // The last entry is the PID in the process's own namespace, which is the caller's.
        if let Some(&ns_pid) = nspid_of(pid).as_ref().and_then(|chain| chain.last()) {
            // Read again: a PID reused between the two reads by a process elsewhere must
            // not lend it its NSpid.
            if namespace_of(pid) == Some(caller) {
                members.insert(pid, ns_pid);
            }
        }
    }
    members
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vramctl_core::types::{
        DeviceInfo, DeviceReading, DeviceSnapshot, DriverInfo, MemoryReading, ProcessActivity,
        ProcessKind, ProcessUsage,
    };

    use super::*;

    fn usage(pid: u32, bytes: Option<u64>) -> ProcessUsage {
        ProcessUsage {
            pid,
            used_bytes: bytes,
            kind: ProcessKind::Compute,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    fn snapshot(devices: Vec<Vec<ProcessUsage>>) -> Snapshot {
        Snapshot {
            taken_at_unix_ms: 1,
            monotonic_ms: 1,
            driver: Arc::new(DriverInfo::default()),
            devices: devices
                .into_iter()
                .enumerate()
                .map(|(i, processes)| DeviceSnapshot {
                    info: Arc::new(DeviceInfo::new(
                        u32::try_from(i).expect("small"),
                        format!("GPU-{i}"),
                    )),
                    state: DeviceState::Ok(DeviceReading {
                        memory: Some(MemoryReading {
                            total_bytes: 1000,
                            used_bytes: 600,
                            reserved_bytes: 0,
                            free_bytes: 400,
                        }),
                        process_activity: Some(
                            processes
                                .iter()
                                .map(|p| ProcessActivity {
                                    pid: p.pid,
                                    sm_percent: 1,
                                    memory_percent: 1,
                                })
                                .collect(),
                        ),
                        processes: Some(processes),
                        ..DeviceReading::default()
                    }),
                })
                .collect(),
            unopened: Vec::new(),
        }
    }

    fn processes(s: &Snapshot, index: usize) -> Vec<(u32, Option<u64>)> {
        match &s.devices[index].state {
            DeviceState::Ok(r) => r
                .processes
                .iter()
                .flatten()
                .map(|p| (p.pid, p.used_bytes))
                .collect(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn only_members_stay_under_their_namespace_pids_and_the_rest_is_one_figure() {
        // Host PIDs 1001, 1002 are the caller's (its PIDs 7 and 9); 2001 another
        // container's, 3001 the host's.
        let mut s = snapshot(vec![
            vec![
                usage(1001, Some(100)),
                usage(2001, Some(200)),
                usage(3001, Some(50)),
            ],
            vec![usage(1002, Some(10))],
            vec![usage(2001, Some(300))],
        ]);
        let members = BTreeMap::from([(1001, 7), (1002, 9)]);
        let view = map_for_namespace(&mut s, 42, &members);
        assert_eq!(view.pid_namespace, 42);
        assert_eq!(processes(&s, 0), [(7, Some(100))]);
        assert_eq!(processes(&s, 1), [(9, Some(10))]);
        assert_eq!(processes(&s, 2), []);
        assert_eq!(view.host_pids, BTreeMap::from([(7, 1001), (9, 1002)]));
        assert_eq!(
            view.others,
            [
                OtherHolders {
                    index: 0,
                    uuid: "GPU-0".into(),
                    processes: 2,
                    used_bytes: Some(250)
                },
                OtherHolders {
                    index: 2,
                    uuid: "GPU-2".into(),
                    processes: 1,
                    used_bytes: Some(300)
                },
            ]
        );
        // No PID of another process survives anywhere in the answer.
        let text = serde_json::to_string(&s).expect("json");
        for pid in ["2001", "3001", "1001", "1002"] {
            assert!(!text.contains(pid), "{pid} leaked: {text}");
        }
    }

    #[test]
    fn an_unavailable_figure_makes_the_others_sum_unknown_not_smaller() {
        let mut s = snapshot(vec![vec![usage(5, Some(10)), usage(6, None)]]);
        let view = map_for_namespace(&mut s, 1, &BTreeMap::new());
        assert_eq!(view.others[0].used_bytes, None);
        assert_eq!(view.others[0].processes, 2);
        assert!(processes(&s, 0).is_empty());
    }

    #[test]
    fn a_process_on_two_devices_or_listed_twice_counts_once_per_device() {
        let mut s = snapshot(vec![vec![usage(5, Some(10)), usage(5, Some(1))]]);
        let view = map_for_namespace(&mut s, 1, &BTreeMap::new());
        assert_eq!(view.others[0].processes, 1);
        assert_eq!(view.others[0].used_bytes, Some(11));
    }

    #[test]
    fn members_are_those_of_the_callers_namespace_only() {
        let ns = BTreeMap::from([(1001, 42), (2001, 43), (3001, 42)]);
        let nspid = BTreeMap::from([(1001, vec![1001, 7]), (2001, vec![2001, 7])]);
        let members = members_of(
            &[1001, 2001, 3001, 4001],
            42,
            &mut |pid| ns.get(&pid).copied(),
            &mut |pid| nspid.get(&pid).cloned(),
        );
        // 3001 is in the namespace but its NSpid could not be read: left out, never guessed.
        assert_eq!(members, BTreeMap::from([(1001, 7)]));
    }

    #[test]
    fn a_pid_that_moves_namespace_between_reads_is_left_out() {
        let mut calls = 0;
        let members = members_of(
            &[1001],
            42,
            &mut |_| {
                calls += 1;
                Some(if calls == 1 { 42 } else { 43 })
            },
            &mut |_| Some(vec![1001, 7]),
        );
        assert!(members.is_empty());
    }

    /// `snapshot` with each device's minor number = its index (as on most single-board
    /// machines: GPU 0 is /dev/nvidia0).
    fn with_minors(mut s: Snapshot) -> Snapshot {
        for d in &mut s.devices {
            let mut info = (*d.info).clone();
            info.minor_number = Some(info.index);
            d.info = Arc::new(info);
        }
        s
    }

    fn holders(list: &[(u32, &[&str])]) -> BTreeMap<u32, Vec<String>> {
        list.iter()
            .map(|(pid, files)| (*pid, files.iter().map(|f| (*f).to_owned()).collect()))
            .collect()
    }

    #[test]
    fn rows_are_this_namespaces_only_when_each_holds_its_own_gpu_open() {
        // As driver 580 answered inside a namespace on the H200: the holder as PID 2.
        let snap = with_minors(snapshot(vec![
            vec![usage(2, Some(1 << 30))],
            vec![usage(7, None)],
        ]));
        let ctl = "/dev/nvidiactl";
        let ok = holders(&[
            (2, &[ctl, "/dev/nvidia0"]),
            (7, &[ctl, "/dev/nvidia1"]),
            (9, &[ctl]),
        ]);
        let check = |snap: &Snapshot, map: &BTreeMap<u32, Vec<String>>| {
            rows_held_here(snap, &mut |pid| map.get(&pid).cloned(), &BTreeSet::new())
        };
        assert_eq!(check(&snap, &ok), Ok(2));
        // A host PID that happens to be a process here holding another GPU, or only the
        // control device (nvidia-smi), or nothing: not this namespace's row.
        for wrong in [
            holders(&[(2, &[ctl, "/dev/nvidia1"]), (7, &[ctl, "/dev/nvidia1"])]),
            holders(&[(2, &[ctl]), (7, &[ctl, "/dev/nvidia1"])]),
            holders(&[(7, &[ctl, "/dev/nvidia1"])]),
        ] {
            let why = check(&snap, &wrong).expect_err("must not map");
            assert!(why.contains("PID 2 on GPU 0"), "{why}");
        }
        // Nothing to check, or no minor number to name the device file: no claim.
        assert!(check(&with_minors(snapshot(vec![vec![]])), &ok).is_err());
        assert!(check(&snapshot(vec![vec![usage(2, None)]]), &ok).is_err());
        // A forked worker holding the device with no context is not a row: it changes nothing.
        let with_worker = holders(&[
            (2, &[ctl, "/dev/nvidia0"]),
            (3, &[ctl, "/dev/nvidia0"]),
            (7, &[ctl, "/dev/nvidia1"]),
        ]);
        assert_eq!(check(&snap, &with_worker), Ok(2));
    }

    #[test]
    fn a_row_accepted_before_passes_once_its_process_has_let_go_of_the_device() {
        // The H100's `run` inside a namespace: the job exited and was reaped, and NVML
        // listed it one tick more.
        let snap = with_minors(snapshot(vec![vec![usage(52, Some(1 << 30))]]));
        let gone = holders(&[]);
        let exiting = holders(&[(52, &[])]);
        let accepted = BTreeSet::from([52]);
        for here in [&gone, &exiting] {
            let mut files_of = |pid: u32| here.get(&pid).cloned();
            assert_eq!(rows_held_here(&snap, &mut files_of, &accepted), Ok(1));
            // Never accepted before: a host PID missing here proves nothing.
            let mut files_of = |pid: u32| here.get(&pid).cloned();
            assert!(rows_held_here(&snap, &mut files_of, &BTreeSet::new()).is_err());
        }
        // Accepted before, but now a process here holding only another GPU: not ours.
        let elsewhere = holders(&[(52, &["/dev/nvidiactl", "/dev/nvidia1"])]);
        let mut files_of = |pid: u32| elsewhere.get(&pid).cloned();
        assert!(rows_held_here(&snap, &mut files_of, &accepted).is_err());
    }

    #[test]
    fn host_pids_follow_the_view() {
        assert_eq!(PidView::Same.host_pid(5), None);
        assert_eq!(PidView::CannotMap(Unmapped::default()).host_pid(5), Some(5));
        let mapped = PidView::Mapped(NamespaceView {
            pid_namespace: 1,
            host_pids: BTreeMap::from([(7, 1001)]),
            others: Vec::new(),
        });
        assert_eq!(mapped.host_pid(7), Some(1001));
        assert!(mapped.pids_are_ours());
        assert!(!PidView::CannotMap(Unmapped::default()).pids_are_ours());
        let numbered = PidView::DriverNumbered(DriverNumbered { rows_checked: 1 });
        assert!(numbered.pids_are_ours());
        assert_eq!(
            (numbered.host_pid(2), numbered.mode()),
            (None, "driver_numbered")
        );
    }
}
