//! Who holds DRM clients: one walk of `/proc/*/fd` per tick, reading the fdinfo only of
//! descriptors that are DRM nodes (`/dev/dri/*`), so a host of many processes with many
//! plain files costs one `readlink` per descriptor and no more.
//!
//! A client (`drm-client-id`, per device) is counted once however many descriptors share
//! it — `dup`, a fork, a descriptor passed over a socket —, under the lowest PID that holds
//! it. A process whose descriptors this user may not list is counted, not skipped
//! silently ([`Scan::denied_pids`]).

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::fdinfo::{self, Fdinfo};
use super::sysfs;

/// A client's identity: the device and the `drm-client-id` (unique per device, the spec
/// says, when `drm-pdev` is printed); without a client id, the one descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClientKey {
    /// `drm-client-id` on the device.
    Id {
        /// PCI slot.
        pci_bus_id: String,
        /// The id.
        client_id: u64,
    },
    /// A driver without client ids: each descriptor its own client.
    Fd {
        /// PCI slot.
        pci_bus_id: String,
        /// Holder.
        pid: u32,
        /// Descriptor number.
        fd: u32,
    },
}

/// One DRM client as this tick's walk found it.
#[derive(Debug, Clone)]
pub struct Client {
    /// The lowest PID holding it.
    pub pid: u32,
    /// Its PCI slot.
    pub pci_bus_id: String,
    /// What its fdinfo said.
    pub info: Fdinfo,
}

/// One walk of `/proc`.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Every client, once.
    pub clients: BTreeMap<ClientKey, Client>,
    /// Processes whose descriptors could not be listed or read (permission denied).
    pub denied_pids: u32,
    /// fdinfo lines that did not parse, over all clients read.
    pub malformed_lines: u32,
    /// Descriptors that were DRM nodes but named no device we could place.
    pub unplaced_fds: u32,
}

/// Walks `<root>/proc`. `minor_slots` maps DRM node names (`card0`, `renderD128`) to PCI
/// slots, for a driver too old to print `drm-pdev`.
pub fn scan(root: &Path, minor_slots: &HashMap<String, String>) -> Scan {
    let mut out = Scan::default();
    let proc_dir = root.join("proc");
    let Ok(entries) = fs::read_dir(&proc_dir) else {
        return out;
    };
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    // Lowest PID first, so a shared client lands on the parent of a fork.
    pids.sort_unstable();
    for pid in pids {
        scan_process(&proc_dir.join(pid.to_string()), pid, minor_slots, &mut out);
    }
    out
}

fn scan_process(dir: &Path, pid: u32, minor_slots: &HashMap<String, String>, out: &mut Scan) {
    let entries = match fs::read_dir(dir.join("fd")) {
        Ok(entries) => entries,
        Err(err) if err.kind() == ErrorKind::PermissionDenied => {
            out.denied_pids += 1;
            return;
        }
        // Exited between the listing and now, or a kernel thread.
        Err(_) => return,
    };
    let mut denied = false;
    for entry in entries.filter_map(Result::ok) {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(target) = fs::read_link(entry.path()) else {
            continue;
        };
        let Some(node) = drm_node(&target) else {
            continue;
        };
        let text = match fs::read_to_string(dir.join("fdinfo").join(fd.to_string())) {
            Ok(text) => text,
            Err(err) if err.kind() == ErrorKind::PermissionDenied => {
                denied = true;
                continue;
            }
            Err(_) => continue,
        };
        let info = fdinfo::parse(&text);
        out.malformed_lines += info.malformed_lines;
        if info.driver.is_none() {
            continue;
        }
        let Some(pci_bus_id) = info.pdev.clone().or_else(|| minor_slots.get(node).cloned()) else {
            out.unplaced_fds += 1;
            continue;
        };
        let key = match info.client_id {
            Some(client_id) => ClientKey::Id {
                pci_bus_id: pci_bus_id.clone(),
                client_id,
            },
            None => ClientKey::Fd {
                pci_bus_id: pci_bus_id.clone(),
                pid,
                fd,
            },
        };
        // Every descriptor of one client prints the same figures: the first is kept.
        out.clients.entry(key).or_insert(Client {
            pid,
            pci_bus_id,
            info,
        });
    }
    if denied {
        out.denied_pids += 1;
    }
}

/// `renderD128` for `/dev/dri/renderD128`; `None` for anything that is not a DRM node.
fn drm_node(target: &Path) -> Option<&str> {
    let name = target.strip_prefix("/dev/dri").ok()?.to_str()?;
    (name.starts_with("card") || name.starts_with("renderD")).then_some(name)
}

/// DRM node name → PCI slot for every node under `<root>/sys/class/drm`.
pub fn minor_slots(root: &Path) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let Ok(entries) = fs::read_dir(sysfs::class_dir(root)) else {
        return out;
    };
    for entry in entries.filter_map(Result::ok) {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if name.contains('-') {
            continue;
        }
        if let Some(slot) = sysfs::pci_slot(&entry.path()) {
            out.insert(name, slot);
        }
    }
    out
}

/// `<root>/proc`.
pub fn proc_dir(root: &Path) -> PathBuf {
    root.join("proc")
}
