//! The checks of the host as a whole: the driver, the frameworks' CUDA, the variables that
//! decide what CUDA sees, the container, what we may see of other processes, the kernel
//! log. Pure functions of [`Facts`](super::Facts)' parts.

use std::collections::BTreeMap;

use super::cuda_compat::{self, CudaVersion, Verdict};
use super::python_env::PythonFacts;
use super::xid::{self, XidSeverity};
use super::{
    DriverFacts, EnvFacts, Finding, GpuFacts, GpuIdentity, HolderFacts, HostFacts, KernelLog,
    Status,
};

const HOST: &str = "host";

/// `driver`: NVML started, with its versions; or why not (the command exits 3).
pub fn driver(driver: &DriverFacts) -> Vec<Finding> {
    match driver {
        DriverFacts::Ready(ready) => {
            let mut status = Status::Ok;
            let mut summary = format!(
                "driver {}, NVML {}, CUDA {} supported",
                ready.driver_version.as_deref().unwrap_or("?"),
                ready.nvml_version.as_deref().unwrap_or("?"),
                ready.cuda_driver_version.as_deref().unwrap_or("?")
            );
            let mut fix = None;
            if !ready.unopened.is_empty() {
                status = Status::Warn;
                let list: Vec<String> = ready
                    .unopened
                    .iter()
                    .map(|(i, why)| format!("GPU {i}: {why}"))
                    .collect();
                summary.push_str(&format!("; cannot open {}", list.join(", ")));
                fix = Some(
                    "look at the kernel log (dmesg | grep NVRM) for the GPU that cannot be opened"
                        .to_owned(),
                );
            }
            let mut finding = Finding::new("driver", HOST, status, summary)
                .fact("driver_version", &ready.driver_version)
                .fact("nvml_version", &ready.nvml_version)
                .fact("cuda_driver_version", &ready.cuda_driver_version)
                .fact("kernel_module_version", &ready.kernel_module_version)
                .fact("unopened", &ready.unopened);
            finding.fix = fix;
            vec![finding]
        }
        DriverFacts::Unusable(no) => {
            let module = no.kernel_module_version.as_deref();
            let summary = match (no.code, module) {
                ("library_not_loaded", Some(v)) => format!(
                    "the kernel module {v} is loaded but the NVML library cannot be loaded: {}",
                    no.reason
                ),
                ("library_not_loaded", None) => format!(
                    "no NVIDIA driver: the kernel module is not loaded (/proc/driver/nvidia/version absent) and the NVML library cannot be loaded ({})",
                    no.reason
                ),
                ("driver_not_loaded", _) => {
                    "the NVML library loads but the NVIDIA kernel module is not loaded".to_owned()
                }
                ("version_mismatch", Some(v)) => format!(
                    "the kernel module is {v} and the NVML library is another version ({})",
                    no.reason
                ),
                ("version_mismatch", None) => format!(
                    "the NVML library and the loaded kernel module are different versions ({})",
                    no.reason
                ),
                (_, _) => no.reason.clone(),
            };
            vec![
                Finding::new("driver", HOST, Status::Fail, summary)
                    .fact("code", no.code)
                    .fact("reason", &no.reason)
                    .fact("kernel_module_version", module)
                    .fix(no.hint),
            ]
        }
    }
}

/// The driver's CUDA version and branch, when NVML started.
fn driver_cuda(driver: &DriverFacts) -> Option<(CudaVersion, Option<u32>, String)> {
    let DriverFacts::Ready(ready) = driver else {
        return None;
    };
    let cuda = CudaVersion::parse(ready.cuda_driver_version.as_deref()?)?;
    let branch = ready
        .driver_version
        .as_deref()
        .and_then(cuda_compat::driver_branch);
    Some((
        cuda,
        branch,
        ready.driver_version.clone().unwrap_or_default(),
    ))
}

/// `frameworks`: one finding per site-packages directory that holds a CUDA framework or
/// runtime wheel, judged against the CUDA version the driver supports.
pub fn frameworks(driver: &DriverFacts, python: &PythonFacts) -> Vec<Finding> {
    let driver_cuda = driver_cuda(driver);
    let mut out = Vec::new();
    for site in &python.site_packages {
        let mut runs = Vec::new();
        let mut limited = Vec::new();
        // By the CUDA major they need.
        let mut broken: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        let mut other_broken = Vec::new();
        for wheel in &site.wheels {
            let Some(built) = wheel.cuda.as_deref().and_then(CudaVersion::parse) else {
                if wheel.name == "torch" {
                    runs.push(format!("{} {} (CPU build)", wheel.name, wheel.version));
                }
                continue;
            };
            let label = format!("{} {} (CUDA {built})", wheel.name, wheel.version);
            let Some((cuda, branch, _)) = &driver_cuda else {
                runs.push(label);
                continue;
            };
            match cuda_compat::judge(built, *cuda, *branch) {
                Verdict::Runs => runs.push(label),
                Verdict::RunsLimited => limited.push(label),
                // A newer major: one sentence for all of them, with the branch it needs.
                Verdict::DoesNotRun(_) if built.major > cuda.major => {
                    broken.entry(built.major).or_default().push(label);
                }
                Verdict::DoesNotRun(why) => other_broken.push(format!("{label}: {why}")),
            }
        }
        if runs.is_empty() && limited.is_empty() && broken.is_empty() && other_broken.is_empty() {
            continue;
        }
        let mut parts = Vec::new();
        let mut fixes = Vec::new();
        let mut status = Status::Ok;
        if let Some((cuda, _, version)) = &driver_cuda {
            for (major, labels) in &broken {
                status = Status::Fail;
                let branch = cuda_compat::major_range(*major)
                    .map(|m| format!(" ({} or newer)", m.minimum_driver_branch))
                    .unwrap_or_default();
                parts.push(format!(
                    "do not run, they need a CUDA {major} driver{branch} and this one ({version}) supports CUDA {cuda}: {}",
                    labels.join(", ")
                ));
                fixes.push(format!(
                    "install a driver for CUDA {major}{branch}, or wheels built for CUDA {cuda} or older (torch: pip install torch --index-url https://download.pytorch.org/whl/cuXYZ for such a CUDA)"
                ));
            }
            if !other_broken.is_empty() {
                status = Status::Fail;
                parts.push(format!("do not run: {}", other_broken.join("; ")));
                fixes.push("update the driver".to_owned());
            }
            if !limited.is_empty() {
                status = status.max(Status::Warn);
                parts.push(format!(
                    "newer than the driver's CUDA {cuda}, run through minor version compatibility (no PTX JIT of newer code, some APIs fail): {}",
                    limited.join(", ")
                ));
                fixes.push("update the driver to one that supports the wheels' CUDA (nvidia-smi shows the CUDA a driver supports)".to_owned());
            }
            if !runs.is_empty() {
                parts.push(format!(
                    "run on this driver (CUDA {cuda}): {}",
                    runs.join(", ")
                ));
            }
        } else {
            status = Status::Skipped;
            parts.push(format!(
                "not judged, no driver to compare with: {}",
                runs.join(", ")
            ));
        }
        let mut finding = Finding::new(
            "frameworks",
            site.path.display().to_string(),
            status,
            parts.join("; "),
        )
        .fact("site_packages", &site.path)
        .fact("found_by", &site.found_by)
        .fact("wheels", &site.wheels);
        if !fixes.is_empty() {
            finding.fix = Some(fixes.join("; "));
        }
        out.push(finding);
    }
    // An interpreter that did not say where its packages are: its frameworks are unknown.
    for (interpreter, why) in &python.failed {
        out.push(
            Finding::new(
                "frameworks",
                interpreter.clone(),
                Status::Warn,
                format!("cannot ask it where its packages are: {why}"),
            )
            .fact("interpreter", interpreter)
            .fix("name its environment or site-packages directory with --python PATH"),
        );
    }
    if out.is_empty() {
        let looked: Vec<String> = python
            .site_packages
            .iter()
            .map(|s| s.path.display().to_string())
            .collect();
        out.push(
            Finding::new(
                "frameworks",
                HOST,
                Status::Skipped,
                if looked.is_empty() {
                    "no Python environment found (name one with --python PATH)".to_owned()
                } else {
                    format!("no CUDA framework in {}", looked.join(", "))
                },
            )
            .fact("site_packages", looked),
        );
    }
    out
}

/// How `CUDA_VISIBLE_DEVICES` resolves against the GPUs present.
#[derive(Debug, PartialEq, Eq)]
struct Visible {
    /// NVML indices of the GPUs CUDA sees, in CUDA's order.
    gpus: Vec<u32>,
    /// The first entry that names no GPU (CUDA ignores it and everything after it).
    invalid: Option<String>,
    /// Whether entries are indices (which count in CUDA's order, not nvidia-smi's).
    by_index: bool,
}

fn resolve_visible(value: &str, gpus: &[GpuIdentity]) -> Visible {
    let mut out = Visible {
        gpus: Vec::new(),
        invalid: None,
        by_index: false,
    };
    for token in value.split(',').map(str::trim) {
        let found = if let Ok(i) = token.parse::<u32>() {
            out.by_index = true;
            gpus.iter().find(|g| g.index == i)
        } else if token.len() >= 5 {
            // CUDA accepts a UUID prefix (`GPU-7778da7f`) as long as it is unique.
            let token_lower = token.to_ascii_lowercase();
            let matching: Vec<&GpuIdentity> = gpus
                .iter()
                .filter(|g| g.uuid.to_ascii_lowercase().starts_with(&token_lower))
                .collect();
            (matching.len() == 1).then(|| matching[0])
        } else {
            None
        };
        match found {
            Some(g) if !out.gpus.contains(&g.index) => out.gpus.push(g.index),
            _ => {
                out.invalid = Some(token.to_owned());
                break;
            }
        }
    }
    out
}

/// `visible_devices`: `CUDA_VISIBLE_DEVICES` against the GPUs present and the ones asked
/// about with `--gpu`.
pub fn visible_devices(
    driver: &DriverFacts,
    env: &EnvFacts,
    all: &[GpuIdentity],
    selected: &[GpuFacts],
) -> Finding {
    let base = |status, summary: String| {
        Finding::new("visible_devices", HOST, status, summary)
            .fact("cuda_visible_devices", &env.cuda_visible_devices)
            .fact("nvidia_visible_devices", &env.nvidia_visible_devices)
            .fact("cuda_device_order", &env.cuda_device_order)
    };
    let Some(value) = env.cuda_visible_devices.as_deref() else {
        let summary = if matches!(driver, DriverFacts::Unusable(_)) {
            "CUDA_VISIBLE_DEVICES is unset: CUDA programs would see every GPU".to_owned()
        } else {
            format!(
                "CUDA_VISIBLE_DEVICES is unset: CUDA programs see every GPU ({})",
                all.len()
            )
        };
        return base(Status::Ok, summary);
    };
    if value.trim().is_empty() {
        return base(
            Status::Fail,
            "CUDA_VISIBLE_DEVICES is set but empty: CUDA programs see no GPU".to_owned(),
        )
        .fix("unset CUDA_VISIBLE_DEVICES, or set it to the GPUs to use (e.g. 0 or a GPU UUID)");
    }
    if matches!(driver, DriverFacts::Unusable(_)) {
        return base(
            Status::Skipped,
            format!("CUDA_VISIBLE_DEVICES='{value}': not judged, no driver lists the GPUs"),
        );
    }
    let visible = resolve_visible(value, all);
    let shown: Vec<String> = visible.gpus.iter().map(|i| format!("GPU {i}")).collect();
    let mut finding = match (&visible.invalid, visible.gpus.is_empty()) {
        (Some(bad), true) => base(
            Status::Fail,
            format!(
                "CUDA_VISIBLE_DEVICES='{value}': '{bad}' names no GPU here, so CUDA programs see no GPU"
            ),
        )
        .fix(format!(
            "use indices 0..{} or UUIDs of: {}",
            all.len().saturating_sub(1),
            all.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>().join(", ")
        )),
        (Some(bad), false) => base(
            Status::Warn,
            format!(
                "CUDA_VISIBLE_DEVICES='{value}': '{bad}' names no GPU here; CUDA stops there and sees only {}",
                shown.join(", ")
            ),
        )
        .fix("remove the entries that name no GPU (nvidia-smi -L lists them)"),
        (None, _) => base(
            Status::Ok,
            format!(
                "CUDA_VISIBLE_DEVICES='{value}': CUDA programs see {} of {}",
                shown.join(", "),
                all.len()
            ),
        ),
    };
    // A GPU the user asks about that CUDA programs cannot see.
    let asked_hidden: Vec<u32> = selected
        .iter()
        .map(|g| g.id.index)
        .filter(|i| selected.len() < all.len() && !visible.gpus.contains(i))
        .collect();
    if !asked_hidden.is_empty() && finding.status < Status::Warn {
        finding.status = Status::Warn;
        finding.summary.push_str(&format!(
            "; GPU {} that you asked about is hidden from CUDA programs",
            asked_hidden
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
        finding.fix = Some("add it to CUDA_VISIBLE_DEVICES, or unset the variable".to_owned());
    }
    // Indices count in CUDA's order, fastest first, unless CUDA_DEVICE_ORDER says PCI order;
    // with different models that is not nvidia-smi's order.
    let mixed = {
        let mut names: Vec<&str> = all.iter().filter_map(|g| g.name.as_deref()).collect();
        names.sort_unstable();
        names.dedup();
        names.len() > 1
    };
    if visible.by_index
        && mixed
        && env.cuda_device_order.as_deref() != Some("PCI_BUS_ID")
        && finding.status < Status::Warn
    {
        finding.status = Status::Warn;
        finding.summary.push_str(
            "; with different GPU models, CUDA counts indices fastest first, not in nvidia-smi's order",
        );
        finding.fix = Some("set CUDA_DEVICE_ORDER=PCI_BUS_ID, or name GPUs by UUID".to_owned());
    }
    finding.fact("cuda_sees", &visible.gpus)
}

/// `container`: inside a container, whether the NVIDIA device files were given to it.
pub fn container(host: &HostFacts, env: &EnvFacts) -> Finding {
    let Some(evidence) = &host.container else {
        return Finding::new(
            "container",
            HOST,
            Status::Skipped,
            "not in a container".to_owned(),
        );
    };
    let has_control = host.device_files.iter().any(|f| f == "/dev/nvidiactl");
    let has_gpu = host
        .device_files
        .iter()
        .any(|f| f["/dev/nvidia".len().min(f.len())..].parse::<u32>().is_ok());
    let base = |status, summary| {
        Finding::new("container", HOST, status, summary)
            .fact("evidence", evidence)
            .fact("device_files", &host.device_files)
            .fact("nvidia_visible_devices", &env.nvidia_visible_devices)
    };
    if has_control && has_gpu {
        return base(
            Status::Ok,
            format!("in a container ({evidence}) with the NVIDIA device files"),
        );
    }
    let nvd = env
        .nvidia_visible_devices
        .as_deref()
        .map(|v| format!(" (NVIDIA_VISIBLE_DEVICES='{v}')"))
        .unwrap_or_default();
    base(
        Status::Fail,
        format!(
            "in a container ({evidence}) that sees no /dev/nvidia{} file: the NVIDIA container toolkit did not give it a GPU{nvd}",
            if has_control { "N" } else { "*" }
        ),
    )
    .fix(
        "start it with the NVIDIA runtime: docker run --gpus all (or --runtime=nvidia), podman --device nvidia.com/gpu=all, or a nvidia.com/gpu resource in Kubernetes",
    )
}

/// `process_visibility`: whether we may see which processes hold the GPUs.
pub fn process_visibility(host: &HostFacts, holders: &HolderFacts) -> Finding {
    let base = |status, summary| {
        Finding::new("process_visibility", HOST, status, summary)
            .fact("euid", host.euid)
            .fact("proc_hidepid", host.proc_hidepid)
            .fact("unreadable_processes", holders.unreadable)
            .fact("initial_pid_namespace", holders.initial_pid_namespace)
    };
    if host.proc_hidepid && host.euid != 0 {
        return base(
            Status::Warn,
            "/proc is mounted with hidepid: other users' processes are invisible, and so are their GPU holders".to_owned(),
        )
        .fix("run as root (sudo vramctl doctor) to see every process");
    }
    if host.euid != 0 && holders.unreadable > 0 {
        return base(
            Status::Warn,
            format!(
                "not root: the open files of {} processes are unreadable, so a GPU holder among them is not found",
                holders.unreadable
            ),
        )
        .fix("run as root (sudo vramctl doctor) to see every holder of /dev/nvidia*");
    }
    base(
        Status::Ok,
        if host.euid == 0 {
            "root: every process's open files are readable".to_owned()
        } else {
            "every process's open files are readable".to_owned()
        },
    )
}

/// `0000:3b:00` of `00000000:3B:00.0` (the form Xid lines use).
fn xid_pci(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.split_once(':')?;
    let rest = rest.split('.').next()?;
    let domain = &domain[domain.len().saturating_sub(4)..];
    Some(format!("{domain}:{rest}").to_ascii_lowercase())
}

/// `kernel_log`: Xid events since boot, each named, the worst deciding the status.
pub fn kernel_log(log: &Result<KernelLog, String>, gpus: &[GpuIdentity]) -> Finding {
    let log = match log {
        Ok(log) => log,
        Err(why) => {
            return Finding::new(
                "kernel_log",
                HOST,
                Status::Skipped,
                format!("the kernel log is not readable: {why}"),
            )
            .fix("run as root, or let users read it (sysctl kernel.dmesg_restrict=0)");
        }
    };
    if log.events.is_empty() {
        return Finding::new(
            "kernel_log",
            HOST,
            Status::Ok,
            format!("no Xid events since boot ({})", log.source),
        )
        .fact("source", &log.source);
    }
    let gpu_of = |pci: &str| {
        gpus.iter()
            .find(|g| {
                g.pci_bus_id.as_deref().and_then(xid_pci).as_deref()
                    == Some(pci.to_ascii_lowercase().as_str())
            })
            .map(|g| g.index)
    };
    let mut status = Status::Ok;
    let mut by_code: BTreeMap<u32, (usize, Option<u32>)> = BTreeMap::new();
    let mut worst: Option<(XidSeverity, &'static str)> = None;
    let mut events = Vec::new();
    for event in &log.events {
        let meaning = xid::meaning(event.code);
        let gpu = gpu_of(&event.pci);
        let entry = by_code.entry(event.code).or_insert((0, gpu));
        entry.0 += 1;
        let event_status = match meaning.map(|m| m.severity) {
            Some(XidSeverity::Application) => Status::Ok,
            Some(XidSeverity::Reset) | None => Status::Warn,
            Some(XidSeverity::Hardware) => Status::Fail,
        };
        status = status.max(event_status);
        if let Some(m) = meaning {
            if worst.is_none_or(|(s, _)| m.severity > s) {
                worst = Some((m.severity, m.action));
            }
        }
        events.push(serde_json::json!({
            "code": event.code,
            "pci": event.pci,
            "gpu": gpu,
            "since_boot_us": event.since_boot_us,
            "meaning": meaning.map(|m| m.meaning),
            "action": meaning.map(|m| m.action),
            "recovery_action": (event.code == 154).then(|| xid::recovery_action(&event.details)).flatten(),
            "details": event.details,
        }));
    }
    let parts: Vec<String> = by_code
        .iter()
        .map(|(code, (n, gpu))| {
            let what = xid::meaning(*code)
                .map_or("not in vramctl's table: see NVIDIA's Xid catalog", |m| {
                    m.meaning
                });
            let on = gpu.map(|g| format!(", GPU {g}")).unwrap_or_default();
            format!("Xid {code} ×{n} ({what}{on})")
        })
        .collect();
    let mut finding = Finding::new(
        "kernel_log",
        HOST,
        status,
        format!(
            "{} Xid event{} since boot: {}",
            log.events.len(),
            if log.events.len() == 1 { "" } else { "s" },
            parts.join("; ")
        ),
    )
    .fact("source", &log.source)
    .fact("events", events);
    if status > Status::Ok {
        finding.fix = Some(worst.map_or_else(
            || {
                "look the code up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)"
                    .to_owned()
            },
            |(_, action)| action.to_owned(),
        ));
    }
    finding
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, name: &str) -> GpuIdentity {
        GpuIdentity {
            index,
            uuid: format!("GPU-{index}{index}{index}{index}aaaa-0000"),
            name: Some(name.to_owned()),
            minor_number: Some(index),
            pci_bus_id: Some(format!("00000000:0{index}:00.0")),
        }
    }

    #[test]
    fn cuda_stops_at_the_first_entry_that_names_no_gpu() {
        let gpus = [gpu(0, "H200"), gpu(1, "H200")];
        assert_eq!(
            resolve_visible("1,7,0", &gpus),
            Visible {
                gpus: vec![1],
                invalid: Some("7".into()),
                by_index: true
            }
        );
        let by_uuid = resolve_visible("GPU-1111", &gpus);
        assert_eq!(by_uuid.gpus, vec![1]);
        assert!(!by_uuid.by_index);
        // A prefix two GPUs share is ambiguous, as CUDA treats it.
        assert_eq!(resolve_visible("GPU-", &gpus).gpus, Vec::<u32>::new());
    }

    #[test]
    fn indices_on_mixed_models_warn_about_cuda_order() {
        let gpus = [gpu(0, "H200"), gpu(1, "L4")];
        let env = EnvFacts {
            cuda_visible_devices: Some("0".into()),
            ..EnvFacts::default()
        };
        let ready = DriverFacts::Ready(super::super::DriverReady::default());
        let f = visible_devices(&ready, &env, &gpus, &[]);
        assert_eq!(f.status, Status::Warn);
        let env = EnvFacts {
            cuda_device_order: Some("PCI_BUS_ID".into()),
            ..env
        };
        assert_eq!(visible_devices(&ready, &env, &gpus, &[]).status, Status::Ok);
    }

    #[test]
    fn xid_addresses_match_nvml_bus_ids() {
        assert_eq!(xid_pci("00000000:3B:00.0").as_deref(), Some("0000:3b:00"));
    }

    #[test]
    fn application_xids_alone_are_ok_and_a_fallen_gpu_fails() {
        let log = |codes: &[u32]| {
            Ok(KernelLog {
                source: "/dev/kmsg".into(),
                events: codes
                    .iter()
                    .map(|&code| xid::XidEvent {
                        code,
                        pci: "0000:00:00".into(),
                        since_boot_us: None,
                        details: String::new(),
                    })
                    .collect(),
            })
        };
        assert_eq!(kernel_log(&log(&[31, 43]), &[]).status, Status::Ok);
        assert_eq!(kernel_log(&log(&[31, 94]), &[]).status, Status::Warn);
        let fallen = kernel_log(&log(&[31, 79]), &[gpu(0, "H200")]);
        assert_eq!(fallen.status, Status::Fail);
        assert!(
            fallen
                .summary
                .contains("Xid 79 ×1 (GPU has fallen off the bus, GPU 0)"),
            "{}",
            fallen.summary
        );
        assert!(
            fallen
                .fix
                .as_deref()
                .is_some_and(|f| f.starts_with("reboot"))
        );
    }

    #[test]
    fn not_root_with_unreadable_processes_warns() {
        let host = HostFacts {
            euid: 1000,
            ..HostFacts::default()
        };
        let holders = HolderFacts {
            unreadable: 12,
            ..HolderFacts::default()
        };
        assert_eq!(process_visibility(&host, &holders).status, Status::Warn);
        let root = HostFacts::default();
        assert_eq!(process_visibility(&root, &holders).status, Status::Ok);
    }

    #[test]
    fn a_container_without_device_files_fails_with_the_toolkit_hint() {
        let host = HostFacts {
            container: Some("/.dockerenv".into()),
            ..HostFacts::default()
        };
        let f = container(&host, &EnvFacts::default());
        assert_eq!(f.status, Status::Fail);
        assert!(f.fix.as_deref().is_some_and(|x| x.contains("--gpus all")));
        let with = HostFacts {
            device_files: vec!["/dev/nvidia0".into(), "/dev/nvidiactl".into()],
            ..host
        };
        assert_eq!(container(&with, &EnvFacts::default()).status, Status::Ok);
    }
}
