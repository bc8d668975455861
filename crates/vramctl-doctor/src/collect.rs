//! The collectors: one per source of facts. Each reads and returns data; none judges.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use vramctl_core::topology::GpuPair;
use vramctl_core::types::DeviceState;
use vramctl_procs::procinfo::{self, ProcError};

use super::{
    DriverReady, EnvFacts, GpuFacts, GpuIdentity, Holder, HolderFacts, HostFacts, KernelLog, xid,
};
use vramctl_observe::gpu_selection::GpuFilter;
use vramctl_observe::live_loop::LiveSampler;

/// What NVML says: the versions, every GPU's identity, the chosen GPUs' facts (one tick
/// for the readings, `info`'s diagnostics, the health facts) and how they connect.
pub fn nvml(
    sampler: &mut LiveSampler,
    filter: &GpuFilter,
) -> (DriverReady, Vec<GpuIdentity>, Vec<GpuFacts>, Vec<GpuPair>) {
    sampler.read_cuda_driver_version();
    let driver = sampler.driver();
    let ready = DriverReady {
        driver_version: driver.driver_version.clone(),
        nvml_version: driver.nvml_version.clone(),
        cuda_driver_version: driver.cuda_driver_version.clone(),
        kernel_module_version: kernel_module_version(),
        unopened: sampler
            .unopened()
            .iter()
            .map(|u| (u.index, u.reason.to_string()))
            .collect(),
    };
    let all: Vec<GpuIdentity> = sampler
        .devices()
        .iter()
        .map(|d| GpuIdentity {
            index: d.index,
            uuid: d.uuid.clone(),
            name: d.name.clone(),
            minor_number: d.minor_number,
            pci_bus_id: d.pci_bus_id.clone(),
        })
        .collect();
    let snapshot = sampler.tick();
    let mut gpus = Vec::new();
    let chosen: Vec<_> = sampler
        .diagnostics()
        .into_iter()
        .filter(|(info, _)| filter.matches(info))
        .collect();
    let pairs = sampler.gpu_pairs(&chosen);
    for (info, diagnostics) in chosen {
        let reading = snapshot
            .devices
            .iter()
            .find(|d| d.info.uuid == info.uuid)
            .and_then(|d| match &d.state {
                DeviceState::Ok(r) => Some(r.clone()),
                _ => None,
            });
        let health = sampler
            .backend_mut()
            .health(&info)
            .map_err(|e| e.to_string());
        gpus.push(GpuFacts {
            id: GpuIdentity {
                index: info.index,
                uuid: info.uuid.clone(),
                name: info.name.clone(),
                minor_number: info.minor_number,
                pci_bus_id: info.pci_bus_id.clone(),
            },
            diagnostics: diagnostics.map_err(|e| e.to_string()),
            health,
            reading,
        });
    }
    (ready, all, gpus, pairs)
}

/// The parent PID of each process the GPUs list, where /proc has it. Only meaningful in
/// NVML's PID namespace (the host's); the caller decides.
pub fn parents(gpus: &[GpuFacts]) -> BTreeMap<u32, u32> {
    gpus.iter()
        .filter_map(|g| g.reading.as_ref())
        .flat_map(|r| r.processes.iter().flatten().map(|p| p.pid))
        .filter_map(|pid| procinfo::read_stat(pid).ok().map(|s| (pid, s.ppid)))
        .collect()
}

/// The loaded kernel module's version from `/proc/driver/nvidia/version` (`None`: the
/// module is not loaded, or this is not Linux).
pub fn kernel_module_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    parse_module_version(&text)
}

/// `580.159.04` of `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build …`.
pub fn parse_module_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|word| {
            word.contains('.')
                && word.chars().all(|c| c.is_ascii_digit() || c == '.')
                && word.chars().next().is_some_and(|c| c.is_ascii_digit())
        })
        .map(str::to_owned)
}

/// Every process with `/dev/nvidia*` open that we may look at (vramctl itself left out),
/// and how many we may not.
pub fn holders() -> HolderFacts {
    let own = std::process::id();
    let mut facts = HolderFacts {
        initial_pid_namespace: procinfo::PidNamespace::current().is_initial(),
        ..HolderFacts::default()
    };
    for pid in procinfo::all_pids() {
        if pid == own {
            continue;
        }
        match procinfo::gpu_device_files(pid) {
            Ok(files) if !files.is_empty() => {
                let stat = procinfo::read_stat(pid).ok();
                let uid = procinfo::read_status(pid).ok().and_then(|s| s.uid_real);
                facts.holders.push(Holder {
                    pid,
                    command: stat.as_ref().map(|s| s.comm.clone()).unwrap_or_default(),
                    uid,
                    state: stat.as_ref().map(|s| s.state),
                    files,
                });
            }
            Ok(_) | Err(ProcError::NotFound { .. }) => {}
            Err(_) => facts.unreadable += 1,
        }
    }
    facts
}

/// How long `journalctl -k` may take.
const JOURNAL_TIMEOUT: Duration = Duration::from_secs(10);

/// The Xid events since boot: `file` when given (`--kernel-log`), else `/dev/kmsg`, else
/// `journalctl -k -b`; `Err` says why none could be read.
pub fn kernel_log(file: Option<&Path>) -> Result<KernelLog, String> {
    if let Some(file) = file {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read '{}': {e}", file.display()))?;
        return Ok(KernelLog {
            source: file.display().to_string(),
            events: xid::parse_log(&text),
        });
    }
    let kmsg = match read_kmsg() {
        Ok(text) => {
            return Ok(KernelLog {
                source: "/dev/kmsg".into(),
                events: xid::parse_log(&text),
            });
        }
        Err(e) => e,
    };
    match read_journal() {
        Ok(text) => Ok(KernelLog {
            source: "journalctl -k -b".into(),
            events: xid::parse_log(&text),
        }),
        Err(journal) => Err(format!("/dev/kmsg: {kmsg}; journalctl: {journal}")),
    }
}

/// Every record in the kernel's ring buffer, without waiting for new ones.
fn read_kmsg() -> Result<String, String> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(
        "/dev/kmsg",
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| e.to_string())?;
    let mut text = String::new();
    // One record per read; a record is at most 8 KiB (the kernel's CONSOLE_EXT_LOG_MAX).
    let mut buf = vec![0_u8; 8192];
    loop {
        match rustix::io::read(&fd, &mut buf) {
            Ok(0) => break,
            Ok(n) => {
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
                if !text.ends_with('\n') {
                    text.push('\n');
                }
            }
            // EPIPE: records were overwritten while we read; the next read goes on.
            Err(rustix::io::Errno::PIPE | rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => break,
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(text)
}

/// `journalctl -k -b` with a timeout.
fn read_journal() -> Result<String, String> {
    let mut child = std::process::Command::new("journalctl")
        .args(["-k", "-b", "--no-pager", "-q", "-o", "short-monotonic"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run it: {e}"))?;
    // Read while it runs (a full pipe would stall it), on a thread, so the wait can time out.
    let mut stdout = child.stdout.take().ok_or("no output")?;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > JOURNAL_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} s", JOURNAL_TIMEOUT.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(e.to_string()),
        }
    };
    let text = reader
        .join()
        .map_err(|_| "its reader failed".to_owned())?
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("exited with {status}"));
    }
    Ok(text)
}

/// The variables that decide which GPUs CUDA sees.
pub fn env() -> EnvFacts {
    let var = |name| std::env::var(name).ok();
    EnvFacts {
        cuda_visible_devices: var("CUDA_VISIBLE_DEVICES"),
        nvidia_visible_devices: var("NVIDIA_VISIBLE_DEVICES"),
        cuda_device_order: var("CUDA_DEVICE_ORDER"),
    }
}

/// The host: container evidence, `/dev/nvidia*`, our uid, `/proc`'s `hidepid`.
pub fn host() -> HostFacts {
    let container = if Path::new("/.dockerenv").exists() {
        Some("/.dockerenv".to_owned())
    } else if Path::new("/run/.containerenv").exists() {
        Some("/run/.containerenv".to_owned())
    } else if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        Some("KUBERNETES_SERVICE_HOST".to_owned())
    } else {
        std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|t| procinfo::parse_cgroup(&t).container_id)
            .map(|id| format!("cgroup {}", &id[..id.len().min(12)]))
    };
    let mut device_files: Vec<String> = std::fs::read_dir("/dev")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("nvidia"))
                .map(|n| format!("/dev/{n}"))
                .collect()
        })
        .unwrap_or_default();
    device_files.sort();
    HostFacts {
        container,
        device_files,
        euid: rustix::process::geteuid().as_raw(),
        proc_hidepid: std::fs::read_to_string("/proc/self/mountinfo")
            .is_ok_and(|t| proc_hidepid(&t)),
    }
}

/// Whether `/proc` is mounted with `hidepid=` other than 0 (`off`), from mountinfo.
pub fn proc_hidepid(mountinfo: &str) -> bool {
    mountinfo.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(4) == Some(&"/proc")
            && line.split([' ', ',']).any(|opt| {
                opt.strip_prefix("hidepid=")
                    .is_some_and(|v| v != "0" && v != "off")
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_versions_of_both_kernel_module_flavours() {
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)  Mon Jun  2 13:13:04 UTC 2025\nGCC version:  gcc version 12.3.0\n";
        assert_eq!(parse_module_version(open).as_deref(), Some("580.159.04"));
        let closed = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n";
        assert_eq!(parse_module_version(closed).as_deref(), Some("535.183.01"));
        assert_eq!(parse_module_version("garbage"), None);
    }

    #[test]
    fn hidepid_is_read_from_procs_mount_options() {
        let hidden = "22 28 0:20 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw,hidepid=invisible\n";
        assert!(proc_hidepid(hidden));
        let plain = "22 28 0:20 / /proc rw,nosuid shared:12 - proc proc rw\n";
        assert!(!proc_hidepid(plain));
        let off = "22 28 0:20 / /proc rw - proc proc rw,hidepid=0\n";
        assert!(!proc_hidepid(off));
    }
}
