//! Which GPUs a command works on: `--gpu` selectors (an index, a UUID, a MIG UUID or a UUID
//! prefix of at least 8 characters after `GPU-`/`MIG-`) matched by one rule,
//! [`GpuSelector::names`], against the devices NVML lists now ([`GpuFilter`]) and against
//! the devices a history recorded ([`select_devices`]), so that a selector picks the same
//! GPU in `status` and in `history`.

use std::sync::Arc;

use anyhow::bail;
use vramctl_core::types::DeviceInfo;
use vramctl_store::DeviceRecord;

/// One `--gpu` value, settled: an index, or a full or shortened UUID (`GPU-…` or `MIG-…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelector {
    /// NVML's index of a GPU.
    Index(u32),
    /// A UUID, or a prefix of one (lower case).
    Uuid(String),
}

impl GpuSelector {
    /// The selector a `--gpu` value means (surrounding blanks ignored).
    pub fn parse(text: &str) -> Self {
        let text = text.trim();
        text.parse::<u32>()
            .map_or_else(|_| Self::Uuid(text.to_ascii_lowercase()), Self::Index)
    }

    /// Whether this selector names the device with `index` and `uuid` itself: the one
    /// matching rule of live and recorded devices.
    pub fn names(&self, index: Option<u32>, uuid: &str) -> bool {
        match self {
            Self::Index(wanted) => index == Some(*wanted),
            Self::Uuid(wanted) => {
                let uuid = uuid.to_ascii_lowercase();
                // A UUID prefix of at least 8 characters after `GPU-` or `MIG-`, as people
                // paste them short.
                uuid == *wanted || (wanted.len() >= 12 && uuid.starts_with(wanted.as_str()))
            }
        }
    }

    /// Whether this selector names a GPU NVML lists now: the GPU itself or one of its MIG
    /// instances (a live view shows an instance under its GPU).
    pub fn selects_live(&self, device: &DeviceInfo) -> bool {
        self.names(Some(device.index), &device.uuid)
            || device
                .mig_instances
                .iter()
                .any(|m| self.names(None, &m.uuid))
    }

    /// Whether this selector names a recorded device among `devices`: the device itself,
    /// or for a MIG instance its GPU (selecting a GPU selects its instances, as live).
    pub fn selects_recorded(&self, device: &DeviceRecord, devices: &[DeviceRecord]) -> bool {
        self.names(device.meta.index, &device.meta.uuid)
            || device.meta.parent_uuid.as_deref().is_some_and(|parent| {
                devices
                    .iter()
                    .filter(|d| d.meta.uuid == parent)
                    .any(|d| self.names(d.meta.index, &d.meta.uuid))
            })
    }
}

/// Devices chosen with `--gpu` (index or UUID); all when none was given.
#[derive(Debug, Clone, Default)]
pub struct GpuFilter {
    selectors: Vec<GpuSelector>,
}

impl GpuFilter {
    /// Checks every selector names one of `devices`.
    ///
    /// # Errors
    /// A selector that matches no device, with the devices that exist.
    pub fn new(selectors: &[String], devices: &[Arc<DeviceInfo>]) -> anyhow::Result<Self> {
        let parsed = parse_all(selectors);
        for (text, selector) in selectors.iter().zip(&parsed) {
            if !devices.iter().any(|d| selector.selects_live(d)) {
                let known: Vec<String> = devices
                    .iter()
                    .map(|d| format!("{} ({})", d.index, d.uuid))
                    .collect();
                bail!(
                    "no GPU matches '{text}'; use an index or UUID of: {}",
                    if known.is_empty() {
                        "none found".to_owned()
                    } else {
                        known.join(", ")
                    }
                );
            }
        }
        Ok(Self { selectors: parsed })
    }

    /// Whether `device` was chosen.
    pub fn matches(&self, device: &DeviceInfo) -> bool {
        self.selectors.is_empty() || self.selectors.iter().any(|s| s.selects_live(device))
    }

    /// Whether one of `selectors` (indexes, UUIDs, UUID prefixes) names `device`.
    pub fn selects(selectors: &[String], device: &DeviceInfo) -> bool {
        selectors
            .iter()
            .any(|s| GpuSelector::parse(s).selects_live(device))
    }
}

fn parse_all(selectors: &[String]) -> Vec<GpuSelector> {
    selectors.iter().map(|s| GpuSelector::parse(s)).collect()
}

/// Devices matching `--gpu` selectors (index, UUID, MIG UUID or a UUID prefix of 8+
/// characters); a GPU brings its MIG instances.
///
/// # Errors
/// A selector that names no recorded device, with the devices recorded.
pub fn select_devices(
    devices: Vec<DeviceRecord>,
    selectors: &[String],
) -> anyhow::Result<Vec<DeviceRecord>> {
    if selectors.is_empty() {
        return Ok(devices);
    }
    let parsed = parse_all(selectors);
    for (text, selector) in selectors.iter().zip(&parsed) {
        if !devices
            .iter()
            .any(|d| selector.selects_recorded(d, &devices))
        {
            let known: Vec<String> = devices
                .iter()
                .map(|d| match d.meta.index {
                    Some(i) => format!("{i} ({})", d.meta.uuid),
                    None => d.meta.uuid.clone(),
                })
                .collect();
            bail!(
                "no recorded GPU matches '{text}'; recorded: {}",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            );
        }
    }
    let chosen: Vec<bool> = devices
        .iter()
        .map(|d| parsed.iter().any(|s| s.selects_recorded(d, &devices)))
        .collect();
    Ok(devices
        .into_iter()
        .zip(chosen)
        .filter_map(|(d, keep)| keep.then_some(d))
        .collect())
}

#[cfg(test)]
mod tests {
    use vramctl_core::types::MigInstanceInfo;
    use vramctl_store::DeviceMeta;

    use super::*;

    const GPU: &str = "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2";
    const MIG: &str = "MIG-5c1f3a9e-8b2d-5e47-a1c6-3d9f0b7e2a41";
    const OTHER: &str = "GPU-93a0e6c2-4f1b-6d8e-b0c7-1e2f3a4b5c6d";

    fn live(index: u32, uuid: &str, migs: &[&str]) -> Arc<DeviceInfo> {
        Arc::new(DeviceInfo {
            index,
            uuid: uuid.to_owned(),
            name: None,
            pci_bus_id: None,
            minor_number: None,
            mig_enabled: Some(!migs.is_empty()),
            mig_instances: migs
                .iter()
                .map(|m| MigInstanceInfo {
                    uuid: (*m).to_owned(),
                    name: None,
                    gpu_instance_id: None,
                    compute_instance_id: None,
                })
                .collect(),
        })
    }

    fn recorded(id: i64, index: Option<u32>, uuid: &str, parent: Option<&str>) -> DeviceRecord {
        DeviceRecord {
            id,
            meta: DeviceMeta {
                uuid: uuid.to_owned(),
                index,
                parent_uuid: parent.map(str::to_owned),
                ..DeviceMeta::default()
            },
            first_seen_ms: 0,
        }
    }

    fn history() -> Vec<DeviceRecord> {
        vec![
            recorded(1, Some(0), GPU, None),
            recorded(2, Some(1), OTHER, None),
            recorded(3, None, MIG, Some(GPU)),
        ]
    }

    fn chosen(selector: &str) -> Vec<i64> {
        select_devices(history(), &[selector.to_owned()])
            .expect("a recorded device matches")
            .iter()
            .map(|d| d.id)
            .collect()
    }

    #[test]
    fn a_recorded_mig_uuid_or_its_prefix_selects_the_instance_alone() {
        assert_eq!(chosen(MIG), [3]);
        assert_eq!(chosen(&MIG.to_ascii_uppercase()), [3]);
        assert_eq!(chosen("MIG-5c1f3a9e-8b2d"), [3]);
    }

    #[test]
    fn a_recorded_gpu_brings_its_mig_instances_as_live() {
        assert_eq!(chosen("0"), [1, 3]);
        assert_eq!(chosen(GPU), [1, 3]);
        assert_eq!(chosen("1"), [2]);
    }

    #[test]
    fn a_live_mig_uuid_or_its_prefix_selects_its_gpu() {
        let devices = [live(0, GPU, &[MIG]), live(1, OTHER, &[])];
        for selector in [MIG, "MIG-5c1f3a9e-8b2d", " mig-5C1F3A9E-8b2d "] {
            let filter = GpuFilter::new(&[selector.to_owned()], &devices)
                .expect("the MIG instance is found");
            assert!(filter.matches(&devices[0]), "{selector}");
            assert!(!filter.matches(&devices[1]), "{selector}");
        }
    }

    #[test]
    fn short_prefixes_and_unknown_selectors_match_nothing() {
        let devices = [live(0, GPU, &[MIG])];
        let err = GpuFilter::new(&["GPU-7778".to_owned()], &devices)
            .expect_err("under 8 characters after GPU- is no prefix");
        assert!(
            err.to_string().starts_with("no GPU matches 'GPU-7778'"),
            "{err}"
        );
        let err = select_devices(history(), &["7".to_owned()]).expect_err("no GPU 7");
        assert!(
            err.to_string()
                .starts_with("no recorded GPU matches '7'; recorded: 0 ("),
            "{err}"
        );
    }
}
