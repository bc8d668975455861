//! The DRM client usage stats in `/proc/PID/fdinfo/FD`, as the kernel's
//! `Documentation/gpu/drm-usage-stats.rst` specifies them: one `key: value` pair per line,
//! keys prefixed `drm-`, numbers with an optional unit.
//!
//! Hand-written because it is a dozen lines of splitting and the one crate that parses
//! fdinfo (procfs) stops at `pos`/`flags`/`mnt_id`; every line that does not fit the format is
//! skipped and counted ([`Fdinfo::malformed_lines`]), never a panic.

use std::collections::BTreeMap;

/// One memory region's figures for one client, in bytes; each only where the driver prints it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegionBytes {
    /// `drm-resident-<region>`: buffers with their backing store present.
    pub resident: Option<u64>,
    /// `drm-memory-<region>`: the deprecated alias of `resident` (amdgpu prints both).
    pub memory: Option<u64>,
    /// `drm-total-<region>`: every buffer created, resident or not.
    pub total: Option<u64>,
}

impl RegionBytes {
    /// What the client holds in the region now: resident, else its old alias, else the
    /// total (a driver that prints only totals: its buffers are counted as placed).
    pub fn held_bytes(&self) -> Option<u64> {
        self.resident.or(self.memory).or(self.total)
    }
}

/// What one DRM file descriptor's fdinfo says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fdinfo {
    /// `drm-driver`: absent when the file is not a DRM client (or prints no stats).
    pub driver: Option<String>,
    /// `drm-pdev`: the PCI slot, `0000:03:00.0`.
    pub pdev: Option<String>,
    /// `drm-client-id`: the `struct drm_file` behind the descriptor; several descriptors
    /// (dup, fork, SCM_RIGHTS) share one.
    pub client_id: Option<u64>,
    /// `drm-engine-<name>`: busy nanoseconds per engine.
    pub engine_ns: BTreeMap<String, u64>,
    /// `drm-engine-capacity-<name>`: how many engines of the class (1 when absent).
    pub engine_capacity: BTreeMap<String, u64>,
    /// `drm-cycles-<name>`: busy GPU cycles per engine class (xe).
    pub cycles: BTreeMap<String, u64>,
    /// `drm-total-cycles-<name>`: the GPU's timestamp in cycles at the read (xe).
    pub total_cycles: BTreeMap<String, u64>,
    /// Memory per region name (`vram`, `gtt`, `vram0`, `local0`, `system0`, …).
    pub regions: BTreeMap<String, RegionBytes>,
    /// Lines that are not `key: value` or whose `drm-` value does not parse.
    pub malformed_lines: u32,
}

/// Parses one fdinfo file's text.
pub fn parse(text: &str) -> Fdinfo {
    let mut out = Fdinfo::default();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            out.malformed_lines += 1;
            continue;
        };
        let key = key.trim();
        let value = value.trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            out.malformed_lines += 1;
            continue;
        }
        // `pos`, `flags`, `mnt_id`, `ino`, amdgpu's `pasid` and `amd-*`: not ours.
        let Some(name) = key.strip_prefix("drm-") else {
            continue;
        };
        if !record(&mut out, name, value) {
            out.malformed_lines += 1;
        }
    }
    out
}

/// Stores one `drm-` pair; `false` when its value does not fit its key.
fn record(out: &mut Fdinfo, name: &str, value: &str) -> bool {
    match name {
        "driver" => return set_word(&mut out.driver, value),
        "pdev" => return set_word(&mut out.pdev, value),
        "client-id" => {
            return number(value, &[])
                .map(|id| out.client_id = Some(id))
                .is_some();
        }
        // Strings or figures we do not use.
        "client-name" => return true,
        _ => {}
    }
    // Prefixes that contain other prefixes come first (`total-cycles-` before `total-`,
    // `engine-capacity-` before `engine-`).
    if let Some(engine) = name.strip_prefix("engine-capacity-") {
        return insert(&mut out.engine_capacity, engine, number(value, &[]));
    }
    if let Some(engine) = name.strip_prefix("engine-") {
        return insert(&mut out.engine_ns, engine, number(value, &[("ns", 1)]));
    }
    if let Some(engine) = name.strip_prefix("total-cycles-") {
        return insert(&mut out.total_cycles, engine, number(value, &[]));
    }
    if let Some(engine) = name.strip_prefix("cycles-") {
        return insert(&mut out.cycles, engine, number(value, &[]));
    }
    if name.starts_with("maxfreq-") || name.starts_with("curfreq-") {
        return number(value, &[("Hz", 1), ("KHz", 1), ("MHz", 1)]).is_some();
    }
    for (prefix, slot) in [
        ("resident-", Slot::Resident),
        ("memory-", Slot::Memory),
        ("total-", Slot::Total),
    ] {
        if let Some(region) = name.strip_prefix(prefix) {
            let Some(bytes) = number(value, SIZE_UNITS) else {
                return false;
            };
            let entry = out.regions.entry(region.to_owned()).or_default();
            match slot {
                Slot::Resident => entry.resident = Some(bytes),
                Slot::Memory => entry.memory = Some(bytes),
                Slot::Total => entry.total = Some(bytes),
            }
            return true;
        }
    }
    for prefix in ["shared-", "active-", "purgeable-"] {
        if name.starts_with(prefix) {
            return number(value, SIZE_UNITS).is_some();
        }
    }
    // A key from a later kernel: not malformed, only unknown.
    true
}

enum Slot {
    Resident,
    Memory,
    Total,
}

/// The size units the kernel prints (`drm_fdinfo_print_size`: none, `KiB`, `MiB`; `GiB`
/// from later kernels).
const SIZE_UNITS: &[(&str, u64)] = &[
    ("B", 1),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
];

fn set_word(slot: &mut Option<String>, value: &str) -> bool {
    if value.is_empty() || value.contains(char::is_whitespace) {
        return false;
    }
    *slot = Some(value.to_owned());
    true
}

fn insert(map: &mut BTreeMap<String, u64>, key: &str, value: Option<u64>) -> bool {
    match value {
        Some(v) if !key.is_empty() => {
            map.insert(key.to_owned(), v);
            true
        }
        _ => false,
    }
}

/// `<uint>` or `<uint> <unit>` with the unit one of `units` (scaled by its factor).
fn number(value: &str, units: &[(&str, u64)]) -> Option<u64> {
    let mut words = value.split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    let scale = match words.next() {
        None => 1,
        Some(unit) => units.iter().find(|(u, _)| *u == unit)?.1,
    };
    if words.next().is_some() {
        return None;
    }
    n.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    // amdgpu as printed after the drm-total/-resident patches (Tvrtko Ursulin's series on
    // dri-devel; testdata/drm/SOURCES.md), with its `drm-memory-gtt: \t` space-then-tab.
    const AMDGPU: &str = "pos:\t0\nflags:\t02100002\nmnt_id:\t24\nino:\t1239\n\
        drm-driver:\tamdgpu\ndrm-client-id:\t4\ndrm-pdev:\t0000:04:00.0\npasid:\t32771\n\
        drm-total-gtt:\t2392 KiB\ndrm-resident-gtt:\t2392 KiB\ndrm-total-vram:\t44564 KiB\n\
        drm-shared-vram:\t31952 KiB\ndrm-resident-vram:\t44564 KiB\ndrm-memory-vram:\t44564 KiB\n\
        drm-memory-gtt: \t2392 KiB\namd-memory-visible-vram:\t44564 KiB\n\
        drm-engine-compute:\t46464671 ns\n";

    #[test]
    fn amdgpu_keys_old_and_new_parse_to_one_region_each() {
        let f = parse(AMDGPU);
        assert_eq!(f.driver.as_deref(), Some("amdgpu"));
        assert_eq!(f.pdev.as_deref(), Some("0000:04:00.0"));
        assert_eq!(f.client_id, Some(4));
        assert_eq!(f.regions["vram"].held_bytes(), Some(44_564 * 1024));
        assert_eq!(f.regions["vram"].memory, Some(44_564 * 1024));
        assert_eq!(f.regions["gtt"].held_bytes(), Some(2392 * 1024));
        assert_eq!(f.engine_ns["compute"], 46_464_671);
        assert_eq!(f.malformed_lines, 0);
    }

    #[test]
    fn xe_cycles_are_not_taken_for_a_memory_region() {
        let f = parse(
            "drm-driver:\txe\ndrm-total-cycles-rcs:\t7655183225\ndrm-cycles-rcs:\t28257900\n\
             drm-engine-capacity-vcs:\t2\ndrm-total-vram0:\t23992 KiB\ndrm-shared-vram0:\t16 MiB\n",
        );
        assert_eq!(f.total_cycles["rcs"], 7_655_183_225);
        assert_eq!(f.cycles["rcs"], 28_257_900);
        assert_eq!(f.engine_capacity["vcs"], 2);
        assert_eq!(f.regions.keys().collect::<Vec<_>>(), ["vram0"]);
        assert_eq!(f.regions["vram0"].held_bytes(), Some(23_992 * 1024));
    }

    #[test]
    fn malformed_lines_are_counted_and_skipped() {
        let f = parse(
            "drm-driver:\ti915\nno colon here\ndrm-engine-render:\tlots ns\n\
             drm-total-local0:\t12 parsecs\ndrm bad key:\t1\ndrm-client-id:\t-3\n\
             drm-resident-local0:\t2 MiB\n\n",
        );
        assert_eq!(f.malformed_lines, 5);
        assert_eq!(f.driver.as_deref(), Some("i915"));
        assert_eq!(f.client_id, None);
        assert!(f.engine_ns.is_empty());
        assert_eq!(f.regions["local0"].resident, Some(2 << 20));
        assert_eq!(f.regions["local0"].total, None);
    }

    #[test]
    fn a_file_that_is_not_a_drm_client_has_no_driver() {
        let f = parse("pos:\t0\nflags:\t0100002\nmnt_id:\t11\nino:\t40\n");
        assert_eq!(f, Fdinfo::default());
    }

    #[test]
    fn sizes_that_overflow_are_malformed_not_wrapped() {
        let f = parse("drm-driver:\txe\ndrm-total-vram0:\t18446744073709551615 KiB\n");
        assert_eq!(f.malformed_lines, 1);
        assert!(f.regions.is_empty());
    }
}
