//! `serve --metrics-compat dcgm`: device memory (and the few other device figures vramctl
//! reads) also under dcgm-exporter's metric and label names, so dashboards and alerts
//! written for dcgm-exporter fill from vramctl unchanged. These series come beside the
//! `vramctl_*` ones, never instead of them (the fleet view and vramctl's own dashboard read
//! those).
//!
//! Names, types, units and help texts are dcgm-exporter's (its `etc/default-counters.csv`
//! and `etc/dcp-metrics-included.csv`): memory in MiB (whole MiB, as DCGM reports them),
//! power in W, temperature in °C, utilization in percent. Labels are those of its
//! exposition template: `gpu`, `UUID`, `pci_bus_id`, `device` (`nvidiaN`), `modelName`,
//! `Hostname`, and on a MIG instance's rows `GPU_I_PROFILE` and `GPU_I_ID`. Which panels
//! of dcgm-exporter's dashboard fill, and which cannot, is in docs/metrics.md.

use super::{Device, Family, Kind, Out};

macro_rules! dcgm_families {
    ($($ident:ident = $name:literal, $help:literal;)*) => {
        $(
            #[doc = $help]
            pub const $ident: Family = Family { name: $name, kind: Kind::Gauge, help: $help };
        )*
        /// Every dcgm-exporter family `--metrics-compat dcgm` can emit, in output order.
        #[cfg(test)]
        pub const DCGM_FAMILIES: &[&Family] = &[$(&$ident),*];
    };
}

dcgm_families! {
    GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).";
    POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).";
    GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).";
    MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).";
    FB_FREE = "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).";
    FB_USED = "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).";
    FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).";
    FB_TOTAL = "DCGM_FI_DEV_FB_TOTAL", "Total framebuffer memory (in MiB).";
}

/// What the dcgm-compatible series say about the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcgmLabels {
    /// The `Hostname` label: dcgm-exporter's is the node name (`NODE_NAME` in its
    /// DaemonSet) or the host name.
    pub hostname: String,
}

impl DcgmLabels {
    /// As dcgm-exporter finds it: `NODE_NAME` when set (its Kubernetes DaemonSet sets it
    /// to the node's name), else the kernel's host name.
    pub fn from_environment() -> Self {
        let hostname = std::env::var("NODE_NAME")
            .ok()
            .filter(|n| !n.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .unwrap_or_default();
        Self { hostname }
    }
}

const MIB: u64 = 1 << 20;

/// dcgm-exporter's labels of a whole GPU.
fn gpu_labels<'a>(
    d: &'a Device<'a>,
    device: &'a str,
    host: &'a DcgmLabels,
) -> Vec<(&'a str, &'a str)> {
    vec![
        ("gpu", d.gpu.as_str()),
        ("UUID", d.info.uuid.as_str()),
        ("pci_bus_id", d.info.pci_bus_id.as_deref().unwrap_or("")),
        ("device", device),
        ("modelName", d.info.name.as_deref().unwrap_or("")),
        ("Hostname", host.hostname.as_str()),
    ]
}

/// The MIG profile of an instance's name (`NVIDIA H200 MIG 1g.18gb` → `1g.18gb`), as
/// dcgm-exporter's `GPU_I_PROFILE`.
fn mig_profile(name: Option<&str>) -> &str {
    name.and_then(|n| n.rsplit_once("MIG ").map(|(_, p)| p.trim()))
        .unwrap_or("")
}

pub(super) fn render(out: &mut Out, devices: &[Device<'_>], host: &DcgmLabels) {
    let device_names: Vec<String> = devices
        .iter()
        .map(|d| {
            d.info
                .minor_number
                .map(|m| format!("nvidia{m}"))
                .unwrap_or_default()
        })
        .collect();
    let each =
        |f: &mut super::Rows<'_>,
         pick: &dyn Fn(&vramctl_core::types::DeviceReading) -> Option<super::Value>| {
            for (d, device) in devices.iter().zip(&device_names) {
                if let Some(value) = d.reading().and_then(pick) {
                    f.row(&gpu_labels(d, device, host), value);
                }
            }
        };
    out.family(&GPU_TEMP, |f| {
        each(f, &|r| r.temperature_c.map(super::Value::from))
    });
    out.family(&POWER_USAGE, |f| {
        each(f, &|r| {
            r.power_mw
                .map(|mw| super::Value::from(f64::from(mw) / 1000.0))
        });
    });
    out.family(&GPU_UTIL, |f| {
        each(f, &|r| r.utilization_gpu_percent.map(super::Value::from))
    });
    out.family(&MEM_COPY_UTIL, |f| {
        each(f, &|r| r.utilization_memory_percent.map(super::Value::from));
    });
    let memory = |pick: fn(&vramctl_core::types::MemoryReading) -> u64| {
        let device_names = &device_names;
        move |f: &mut super::Rows<'_>| {
            for (d, device) in devices.iter().zip(device_names) {
                let Some(reading) = d.reading() else { continue };
                if let Some(m) = reading.memory {
                    f.row(&gpu_labels(d, device, host), pick(&m) / MIB);
                }
                // A MIG instance's own rows, labelled as dcgm-exporter labels a GPU
                // instance: the parent's labels plus its profile and GPU instance id.
                for instance in &d.info.mig_instances {
                    let Some(m) = reading.mig_memory(&instance.uuid) else {
                        continue;
                    };
                    let gi = instance
                        .gpu_instance_id
                        .map(|i| i.to_string())
                        .unwrap_or_default();
                    let mut labels = gpu_labels(d, device, host);
                    labels.insert(5, ("GPU_I_PROFILE", mig_profile(instance.name.as_deref())));
                    labels.insert(6, ("GPU_I_ID", gi.as_str()));
                    f.row(&labels, pick(&m) / MIB);
                }
            }
        }
    };
    out.family(&FB_FREE, memory(|m| m.free_bytes));
    out.family(&FB_USED, memory(|m| m.used_bytes));
    out.family(&FB_RESERVED, memory(|m| m.reserved_bytes));
    out.family(&FB_TOTAL, memory(|m| m.total_bytes));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_profiles_come_from_the_instance_name() {
        assert_eq!(mig_profile(Some("NVIDIA H200 MIG 1g.18gb")), "1g.18gb");
        assert_eq!(mig_profile(Some("NVIDIA H200")), "");
        assert_eq!(mig_profile(None), "");
    }

    #[test]
    fn names_and_help_are_dcgm_exporters() {
        for family in DCGM_FAMILIES {
            assert!(family.name.starts_with("DCGM_FI_DEV_"), "{}", family.name);
            assert!(family.help.ends_with(").") || family.help.ends_with('.'));
        }
    }
}
