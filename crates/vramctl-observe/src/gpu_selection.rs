//! Which GPUs a command works on: `--gpu` selectors (an index, a UUID, a MIG UUID or a UUID
//! prefix of at least 8 characters after `GPU-`) matched against the devices NVML lists now
//! ([`GpuFilter`]) or against the devices a history recorded ([`select_devices`]).

use std::sync::Arc;

use anyhow::bail;
use vramctl_core::types::DeviceInfo;
use vramctl_store::DeviceRecord;

/// Devices chosen with `--gpu` (index or UUID); all when none was given.
#[derive(Debug, Clone, Default)]
pub struct GpuFilter {
    selectors: Vec<String>,
}

impl GpuFilter {
    /// Checks every selector names one of `devices`.
    ///
    /// # Errors
    /// A selector that matches no device, with the devices that exist.
    pub fn new(selectors: &[String], devices: &[Arc<DeviceInfo>]) -> anyhow::Result<Self> {
        for selector in selectors {
            if !devices.iter().any(|d| selector_matches(selector, d)) {
                let known: Vec<String> = devices
                    .iter()
                    .map(|d| format!("{} ({})", d.index, d.uuid))
                    .collect();
                bail!(
                    "no GPU matches '{selector}'; use an index or UUID of: {}",
                    if known.is_empty() {
                        "none found".to_owned()
                    } else {
                        known.join(", ")
                    }
                );
            }
        }
        Ok(Self {
            selectors: selectors.to_vec(),
        })
    }

    /// Whether `device` was chosen.
    pub fn matches(&self, device: &DeviceInfo) -> bool {
        self.selectors.is_empty() || Self::selects(&self.selectors, device)
    }

    /// Whether one of `selectors` (indexes, UUIDs, UUID prefixes) names `device`.
    pub fn selects(selectors: &[String], device: &DeviceInfo) -> bool {
        selectors.iter().any(|s| selector_matches(s, device))
    }
}

fn selector_matches(selector: &str, device: &DeviceInfo) -> bool {
    let selector = selector.trim();
    selector.parse::<u32>().is_ok_and(|i| i == device.index)
        || device.uuid.eq_ignore_ascii_case(selector)
        || device.mig_instances.iter().any(|m| m.uuid.eq_ignore_ascii_case(selector))
        // A UUID prefix of at least 8 characters after `GPU-`, as people paste them short.
        || (selector.len() >= 12
            && device.uuid.to_ascii_lowercase().starts_with(&selector.to_ascii_lowercase()))
}

/// Devices matching `--gpu` selectors (index, UUID or a UUID prefix of 8+ characters).
pub fn select_devices(
    devices: Vec<DeviceRecord>,
    selectors: &[String],
) -> anyhow::Result<Vec<DeviceRecord>> {
    if selectors.is_empty() {
        return Ok(devices);
    }
    let matches = |sel: &str, d: &DeviceRecord| {
        let sel = sel.trim();
        sel.parse::<u32>().is_ok_and(|i| Some(i) == d.meta.index)
            || d.meta.uuid.eq_ignore_ascii_case(sel)
            || (sel.len() >= 12
                && d.meta
                    .uuid
                    .to_ascii_lowercase()
                    .starts_with(&sel.to_ascii_lowercase()))
    };
    for sel in selectors {
        if !devices.iter().any(|d| matches(sel, d)) {
            let known: Vec<String> = devices
                .iter()
                .map(|d| match d.meta.index {
                    Some(i) => format!("{i} ({})", d.meta.uuid),
                    None => d.meta.uuid.clone(),
                })
                .collect();
            bail!(
                "no recorded GPU matches '{sel}'; recorded: {}",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            );
        }
    }
    Ok(devices
        .into_iter()
        .filter(|d| selectors.iter().any(|s| matches(s, d)))
        .collect())
}
