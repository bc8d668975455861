//! Checks on what the driver answers, before anything believes it.
//!
//! Drivers have returned garbage: when the `_v3` process struct grew on R535 without a
//! version bump, nvitop users saw PIDs `0` and `4294967295` (which become `kill(0)` and
//! `kill(-1)` if cast to `pid_t`), and `u64::MAX` memory is a known driver bug. Such an
//! entry is dropped, logged, and listed in [`DeviceReading::dropped`] so that output can say
//! what was ignored and why.

use crate::types::{DeviceReading, Dropped, Field, Unavailable};

/// The kernel's ceiling on PIDs when `/proc/sys/kernel/pid_max` cannot be read (the largest
/// value Linux allows on 64-bit).
pub const PID_MAX_LIMIT: u32 = 4_194_304;

/// No memory figure of a GPU can reach this: NVIDIA GPUs address memory with 49-bit
/// virtual addresses (Pascal and later), so 2^50 bytes (1 PiB) is above anything a device
/// can have or a process can hold, with room to spare, and far below what the known bugs
/// give (2^63, 2^64-1). The largest GPU on sale in 2025 has 288 GB.
pub const MAX_MEMORY_BYTES: u64 = 1 << 50;

/// No utilization the driver reports is above 100 % (a share of its sample window).
pub const MAX_PERCENT: u64 = 100;

/// Above this a temperature is not one a GPU's sensor can mean: GPUs slow down near 90 °C
/// and shut down near 100 °C, silicon is rated to about 105–125 °C; 150 °C leaves room
/// for a memory sensor on a bad day. A log saying 900 °C is damaged or forged.
pub const MAX_TEMPERATURE_C: u64 = 150;

/// Above this a power draw is not one a GPU can mean: the largest boards in 2025 draw about
/// 1.2 kW (B200), a GB200 superchip 2.7 kW; 10 kW leaves room for what comes next. NVML
/// reports milliwatts in 32 bits, so a bad figure can reach 4.29 MW.
pub const MAX_POWER_MW: u64 = 10_000_000;

/// Limits a reading is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SanityLimits {
    /// Largest PID this kernel hands out.
    pub pid_max: u32,
}

impl SanityLimits {
    /// Reads `pid_max` from this machine's kernel.
    pub fn from_system() -> Self {
        let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(PID_MAX_LIMIT);
        Self { pid_max }
    }
}

/// Drops the entries of `reading` that cannot be true.
pub fn sanitize(reading: &mut DeviceReading, limits: SanityLimits) {
    if let Some(memory) = reading.memory {
        let why = memory_problem(
            Some(memory.total_bytes),
            Some(memory.used_bytes),
            &[memory.reserved_bytes, memory.free_bytes],
        );
        if let Some(why) = why {
            tracing::warn!(reason = %why, "Dropped the device memory reading.");
            reading.memory = None;
            reading
                .missing
                .insert(Field::Memory, Unavailable::Insane(why));
        }
    }
    let checks: [(Field, Option<String>); 3] = [
        (
            Field::Utilization,
            [
                reading.utilization_gpu_percent,
                reading.utilization_memory_percent,
            ]
            .into_iter()
            .flatten()
            .find_map(|p| percent_problem(u64::from(p))),
        ),
        (
            Field::Temperature,
            reading
                .temperature_c
                .and_then(|c| temperature_problem(u64::from(c))),
        ),
        (
            Field::Power,
            reading.power_mw.and_then(|p| power_problem(u64::from(p))),
        ),
    ];
    for (field, why) in checks {
        let Some(why) = why else { continue };
        tracing::warn!(field = field.as_str(), reason = %why, "Dropped a reading.");
        match field {
            Field::Utilization => {
                reading.utilization_gpu_percent = None;
                reading.utilization_memory_percent = None;
            }
            Field::Temperature => reading.temperature_c = None,
            _ => reading.power_mw = None,
        }
        reading.missing.insert(field, Unavailable::Insane(why));
    }
    let total = reading.memory.map(|m| m.total_bytes);
    if let Some(processes) = reading.processes.as_mut() {
        processes.retain(
            |p| match process_problem(p.pid, p.used_bytes, total, limits) {
                None => true,
                Some(reason) => {
                    tracing::warn!(pid = p.pid, reason = %reason, "Dropped a process entry.");
                    reading.dropped.push(Dropped {
                        field: Field::Process,
                        what: format!("pid {}", p.pid),
                        reason,
                    });
                    false
                }
            },
        );
    }
    if let Some(activity) = reading.process_activity.as_mut() {
        activity.retain(|a| pid_problem(a.pid, limits).is_none());
    }
}

/// Why a device's memory figures cannot be true, if they cannot: one is 2^64-1 (a driver
/// bug) or above [`MAX_MEMORY_BYTES`], or used is more than the total. `others` are the
/// remaining figures (reserved, free). A figure not known is `None` and checks nothing.
/// Live readings and imported logs are checked by this one rule.
pub fn memory_problem(total: Option<u64>, used: Option<u64>, others: &[u64]) -> Option<String> {
    let figures = total.iter().chain(used.iter()).chain(others.iter());
    if figures.clone().any(|&v| v == u64::MAX) {
        return Some("a memory figure is 2^64-1, a known driver bug".to_owned());
    }
    if let Some(v) = figures.copied().find(|&v| v > MAX_MEMORY_BYTES) {
        return Some(format!(
            "{v} bytes is more than any GPU has (2^50 bytes, 1 PiB)"
        ));
    }
    match (used, total) {
        (Some(used), Some(total)) if used > total => Some(format!(
            "used {used} bytes is more than the total {total} bytes"
        )),
        _ => None,
    }
}

/// Why a process entry cannot be true, if it cannot: a PID that is no process (0, above
/// `pid_max`), or memory above the device's total or above [`MAX_MEMORY_BYTES`].
pub fn process_problem(
    pid: u32,
    used: Option<u64>,
    device_total: Option<u64>,
    limits: SanityLimits,
) -> Option<String> {
    pid_problem(pid, limits).or_else(|| match (used, device_total) {
        (Some(used), _) if used > MAX_MEMORY_BYTES => Some(format!(
            "{used} bytes is more than any GPU has (2^50 bytes, 1 PiB)"
        )),
        (Some(used), Some(total)) if used > total => Some(format!(
            "{used} bytes is more than the device's {total} bytes"
        )),
        _ => None,
    })
}

/// Why a utilization (GPU, memory controller, a process's SM share) cannot be true, if it
/// cannot: above [`MAX_PERCENT`].
pub fn percent_problem(percent: u64) -> Option<String> {
    (percent > MAX_PERCENT).then(|| format!("{percent} % is more than 100 %"))
}

/// Why a GPU temperature cannot be true, if it cannot: above [`MAX_TEMPERATURE_C`].
pub fn temperature_problem(celsius: u64) -> Option<String> {
    (celsius > MAX_TEMPERATURE_C)
        .then(|| format!("{celsius} °C is hotter than any GPU runs (above {MAX_TEMPERATURE_C} °C)"))
}

/// Why a power draw cannot be true, if it cannot: above [`MAX_POWER_MW`].
pub fn power_problem(milliwatts: u64) -> Option<String> {
    (milliwatts > MAX_POWER_MW).then(|| {
        format!(
            "{} W is more than any GPU draws (above {} W)",
            milliwatts / 1000,
            MAX_POWER_MW / 1000
        )
    })
}

/// Why `pid` cannot be a process, if it cannot.
pub fn pid_problem(pid: u32, limits: SanityLimits) -> Option<String> {
    if pid == 0 {
        Some("pid 0 is not a process (kill(0) would signal our own process group)".into())
    } else if pid > limits.pid_max {
        Some(format!(
            "pid {pid} is above this kernel's pid_max {}",
            limits.pid_max
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{MemoryReading, ProcessKind, ProcessUsage};

    const LIMITS: SanityLimits = SanityLimits { pid_max: 32_768 };

    fn process(pid: u32, used: Option<u64>) -> ProcessUsage {
        ProcessUsage {
            pid,
            used_bytes: used,
            kind: ProcessKind::Compute,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    fn memory(total: u64, used: u64) -> MemoryReading {
        MemoryReading {
            total_bytes: total,
            used_bytes: used,
            reserved_bytes: 0,
            free_bytes: total.saturating_sub(used),
        }
    }

    #[test]
    fn bad_pids_and_memory_are_dropped_with_reasons() {
        let mut reading = DeviceReading {
            memory: Some(memory(1000, 500)),
            processes: Some(vec![
                process(0, Some(1)),
                process(u32::MAX, Some(1)),
                process(40_000, Some(1)),
                process(100, Some(2000)),
                process(101, None),
                process(102, Some(100)),
            ]),
            ..DeviceReading::default()
        };
        sanitize(&mut reading, LIMITS);
        let kept: Vec<u32> = reading
            .processes
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(kept, vec![101, 102]);
        assert_eq!(reading.dropped.len(), 4);
        assert!(reading.dropped[0].reason.contains("pid 0"));
        assert!(reading.dropped[1].reason.contains("pid_max"));
        assert!(reading.dropped[3].reason.contains("more than the device"));
    }

    #[test]
    fn absurd_device_memory_is_dropped() {
        let mut reading = DeviceReading {
            memory: Some(memory(1000, 2000)),
            ..Default::default()
        };
        sanitize(&mut reading, LIMITS);
        assert_eq!(reading.memory, None);
        assert!(matches!(
            reading.missing.get(&Field::Memory),
            Some(Unavailable::Insane(_))
        ));

        let mut reading = DeviceReading {
            memory: Some(MemoryReading {
                free_bytes: u64::MAX,
                ..memory(1000, 10)
            }),
            ..Default::default()
        };
        sanitize(&mut reading, LIMITS);
        assert_eq!(reading.memory, None);
    }

    #[test]
    fn memory_no_gpu_can_have_is_insane() {
        assert!(memory_problem(Some(1 << 63), Some(1), &[]).is_some());
        assert!(memory_problem(None, Some(1 << 63), &[]).is_some());
        assert!(process_problem(100, Some(1 << 63), None, LIMITS).is_some());
        // An H200's figures pass.
        assert_eq!(
            memory_problem(Some(150_754_820_096), Some(1 << 30), &[644_939_776]),
            None
        );
    }

    #[test]
    fn utilization_temperature_and_power_no_gpu_can_mean_are_dropped_with_reasons() {
        let mut reading = DeviceReading {
            memory: Some(memory(1000, 500)),
            utilization_gpu_percent: Some(250),
            utilization_memory_percent: Some(10),
            temperature_c: Some(900),
            power_mw: Some(u32::MAX),
            ..DeviceReading::default()
        };
        sanitize(&mut reading, LIMITS);
        assert_eq!(reading.utilization_gpu_percent, None);
        assert_eq!(reading.temperature_c, None);
        assert_eq!(reading.power_mw, None);
        for field in [Field::Utilization, Field::Temperature, Field::Power] {
            assert!(
                matches!(reading.missing.get(&field), Some(Unavailable::Insane(_))),
                "{field:?}"
            );
        }
        // The edges are kept: 100 %, 150 °C, 10 kW.
        assert_eq!(percent_problem(100), None);
        assert_eq!(temperature_problem(150), None);
        assert_eq!(power_problem(10_000_000), None);
        assert!(power_problem(99_999_999_000).is_some());
    }

    #[test]
    fn a_sane_reading_is_untouched() {
        let mut reading = DeviceReading {
            memory: Some(memory(1000, 500)),
            processes: Some(vec![process(1234, Some(400))]),
            ..DeviceReading::default()
        };
        let before = reading.clone();
        sanitize(&mut reading, LIMITS);
        assert_eq!(reading, before);
    }
}
