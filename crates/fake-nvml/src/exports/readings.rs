//! Readings that change with the fake clock: memory, utilization, temperature, power, and
//! the process lists with NVML's count-query protocol.

use std::mem::size_of;
use std::os::raw::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::*;

use super::{device_out, fact};
use crate::codes::{self, Ret};
use crate::ffi::{Out, guard};
use crate::func::Func;
use crate::state::{ProcessEntry, ProcessList, as_u32, percent, with_device};

/// `nvmlMemory_v2` = `NVML_STRUCT_VERSION(Memory, 2)` = `sizeof(nvmlMemory_v2_t) | 2 << 24`.
pub const MEMORY_V2_VERSION: u32 = size_of::<nvmlMemory_v2_t>() as u32 | 2 << 24;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> Ret {
    guard(|| {
        // SAFETY: NVML's contract for `memory`.
        let out = unsafe { Out::new(memory) }?;
        // SAFETY: `out` is valid; the caller sets `version` before the call (that is the
        // point of the field), and only that field is read.
        let version = unsafe { std::ptr::addr_of!((*out.as_ptr()).version).read() };
        if version != MEMORY_V2_VERSION {
            return Err(codes::ARGUMENT_VERSION_MISMATCH);
        }
        let m = with_device(Func::nvmlDeviceGetMemoryInfo_v2, device, |d| d.memory())?;
        out.set(nvmlMemory_v2_t {
            version,
            total: m.total,
            reserved: m.reserved,
            free: m.free,
            used: m.used,
        });
        Ok(())
    })
}

/// The v1 struct has no `reserved`: its `used` includes the reserved memory, as an H200
/// answered (total = used + free).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> Ret {
    // SAFETY: NVML's contract for `memory`.
    unsafe {
        device_out(Func::nvmlDeviceGetMemoryInfo, device, memory, |d| {
            let m = d.memory()?;
            Ok(nvmlMemory_t {
                total: m.total,
                free: m.free,
                used: m.used.saturating_add(m.reserved),
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> Ret {
    // SAFETY: NVML's contract for `utilization`.
    unsafe {
        device_out(
            Func::nvmlDeviceGetUtilizationRates,
            device,
            utilization,
            |d| {
                let t = d.t();
                // MIG devices have no utilization counters (NVML answers NOT_SUPPORTED).
                fact(d, |g| {
                    if g.utilization_gpu.is_none() && g.utilization_memory.is_none() {
                        return None;
                    }
                    let at = |timeline: &Option<crate::timeline::Timeline<_>>| {
                        timeline.as_ref().map_or(0, |tl| percent(tl.at(t)))
                    };
                    Some(nvmlUtilization_t {
                        gpu: at(&g.utilization_gpu),
                        memory: at(&g.utilization_memory),
                    })
                })
            },
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor_type: nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> Ret {
    // SAFETY: NVML's contract for `temp`.
    unsafe {
        device_out(Func::nvmlDeviceGetTemperature, device, temp, |d| {
            if sensor_type != nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
                return Err(codes::INVALID_ARGUMENT);
            }
            let t = d.t();
            fact(d, |g| g.temperature_c.as_ref().map(|tl| as_u32(tl.at(t))))
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: nvmlDevice_t, power: *mut c_uint) -> Ret {
    // SAFETY: NVML's contract for `power`.
    unsafe {
        device_out(Func::nvmlDeviceGetPowerUsage, device, power, |d| {
            let t = d.t();
            fact(d, |g| g.power_mw.as_ref().map(|tl| as_u32(tl.at(t))))
        })
    }
}

/// Writes `entries` as the R535 driver did: 32-byte `nvmlProcessDetail_v1_t` records into a
/// buffer the caller sized for `capacity` 24-byte entries. The real driver overran such a
/// buffer; the fake writes only the bytes that fit, so the caller sees the same shifted,
/// garbled entries without memory corruption.
///
/// # Safety
/// `infos` is valid for writing `capacity` `nvmlProcessInfo_t`s.
unsafe fn write_stride_32(
    infos: *mut nvmlProcessInfo_t,
    capacity: usize,
    entries: &[ProcessEntry],
) {
    let mut image = Vec::with_capacity(entries.len() * 32);
    for e in entries {
        // Field by field, so the padding at offset 4 is defined (zero) bytes.
        image.extend_from_slice(&e.pid.to_ne_bytes());
        image.extend_from_slice(&[0; 4]);
        image.extend_from_slice(&e.used_memory.to_ne_bytes());
        image.extend_from_slice(&e.gpu_instance_id.to_ne_bytes());
        image.extend_from_slice(&e.compute_instance_id.to_ne_bytes());
        image.extend_from_slice(&0u64.to_ne_bytes()); // usedGpuCcProtectedMemory
    }
    let room = capacity.saturating_mul(size_of::<nvmlProcessInfo_t>());
    let n = image.len().min(room);
    // SAFETY: `n` bytes fit in the caller's buffer per this function's contract.
    unsafe { std::ptr::copy_nonoverlapping(image.as_ptr(), infos.cast::<u8>(), n) };
}

/// The `…RunningProcesses_v3` protocol, from the NVML header: "call this function with
/// *infoCount = 0. The return code will be NVML_ERROR_INSUFFICIENT_SIZE, or NVML_SUCCESS if
/// none are running. For this call infos is allowed to be NULL." A buffer too small gets the
/// needed count and INSUFFICIENT_SIZE. nvml-wrapper reads SUCCESS on the count query as
/// "no processes", so answering SUCCESS with a count (as some fakes do) would hide them all.
///
/// # Safety
/// `info_count` is NULL or valid for reading and writing; `infos` is NULL or valid for
/// writing `*info_count` entries.
unsafe fn running_processes(
    func: Func,
    list: ProcessList,
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Ret {
    guard(|| {
        // SAFETY: per this function's contract.
        let count = unsafe { Out::new(info_count) }?;
        let capacity = usize::try_from(count.get()).map_err(|_| codes::INVALID_ARGUMENT)?;
        if capacity > 0 && (infos.is_null() || !infos.is_aligned()) {
            return Err(codes::INVALID_ARGUMENT);
        }
        let (entries, hidden, stride) = with_device(func, device, |d| {
            let entries = d.processes(list);
            let g = d.gpu();
            Ok((
                entries,
                g.processes_appear_between_calls as usize,
                d.loaded.scenario.process_info_stride,
            ))
        })?;
        let set_count = |n: usize| -> Result<(), Ret> {
            count.set(c_uint::try_from(n).map_err(|_| codes::UNKNOWN)?);
            Ok(())
        };
        if capacity == 0 {
            let reported = entries.len().saturating_sub(hidden);
            set_count(reported)?;
            return if reported == 0 {
                Ok(())
            } else {
                Err(codes::INSUFFICIENT_SIZE)
            };
        }
        if capacity < entries.len() {
            set_count(entries.len())?;
            return Err(codes::INSUFFICIENT_SIZE);
        }
        if stride == 32 {
            // SAFETY: `infos` holds `capacity` entries (checked non-null and aligned above).
            unsafe { write_stride_32(infos, capacity, &entries) };
        } else {
            for (i, e) in entries.iter().enumerate() {
                // SAFETY: `i < entries.len() <= capacity`, the caller's buffer length.
                unsafe {
                    infos.add(i).write(nvmlProcessInfo_t {
                        pid: e.pid,
                        usedGpuMemory: e.used_memory,
                        gpuInstanceId: e.gpu_instance_id,
                        computeInstanceId: e.compute_instance_id,
                    });
                }
            }
        }
        set_count(entries.len())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Ret {
    // SAFETY: NVML's contract for `infoCount`/`infos`.
    unsafe {
        running_processes(
            Func::nvmlDeviceGetComputeRunningProcesses_v3,
            ProcessList::Compute,
            device,
            info_count,
            infos,
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Ret {
    // SAFETY: NVML's contract for `infoCount`/`infos`.
    unsafe {
        running_processes(
            Func::nvmlDeviceGetGraphicsRunningProcesses_v3,
            ProcessList::Graphics,
            device,
            info_count,
            infos,
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Ret {
    // SAFETY: NVML's contract for `infoCount`/`infos`.
    unsafe {
        running_processes(
            Func::nvmlDeviceGetMPSComputeRunningProcesses_v3,
            ProcessList::Mps,
            device,
            info_count,
            infos,
        )
    }
}

/// Per-process utilization samples newer than `lastSeenTimeStamp` (µs). With `utilization`
/// NULL the call reports the number of samples with INSUFFICIENT_SIZE; no samples at all is
/// NOT_FOUND, as NVML documents (and as an H200 mostly answered).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    utilization: *mut nvmlProcessUtilizationSample_t,
    process_samples_count: *mut c_uint,
    last_seen_time_stamp: c_ulonglong,
) -> Ret {
    guard(|| {
        // SAFETY: NVML's contract for `processSamplesCount`.
        let count = unsafe { Out::new(process_samples_count) }?;
        let capacity = usize::try_from(count.get()).map_err(|_| codes::INVALID_ARGUMENT)?;
        if !utilization.is_null() && !utilization.is_aligned() {
            return Err(codes::INVALID_ARGUMENT);
        }
        let samples = with_device(Func::nvmlDeviceGetProcessUtilization, device, |d| {
            let g = d.whole_gpu()?;
            if g.process_utilization == crate::scenario::ProcessUtilizationMode::NotFound {
                return Err(codes::NOT_FOUND);
            }
            Ok(d.utilization_samples(last_seen_time_stamp))
        })?;
        if samples.is_empty() {
            return Err(codes::NOT_FOUND);
        }
        let n = c_uint::try_from(samples.len()).map_err(|_| codes::UNKNOWN)?;
        if utilization.is_null() || capacity < samples.len() {
            count.set(n);
            return Err(codes::INSUFFICIENT_SIZE);
        }
        for (i, (pid, time_stamp, sm, mem)) in samples.into_iter().enumerate() {
            // SAFETY: `i < samples.len() <= capacity`, the caller's buffer length.
            unsafe {
                utilization.add(i).write(nvmlProcessUtilizationSample_t {
                    pid,
                    timeStamp: time_stamp,
                    smUtil: sm,
                    memUtil: mem,
                    encUtil: 0,
                    decUtil: 0,
                });
            }
        }
        count.set(n);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_v2_version_matches_the_header_macro() {
        assert_eq!(MEMORY_V2_VERSION, 0x0200_0028);
    }

    #[test]
    fn stride_32_stays_inside_the_buffer() {
        let entries: Vec<ProcessEntry> = (0..4)
            .map(|i| ProcessEntry {
                pid: 100 + i,
                used_memory: 1 << 30,
                gpu_instance_id: u32::MAX,
                compute_instance_id: u32::MAX,
            })
            .collect();
        // 4 entries of 24 bytes = 96 bytes of room, then a guard entry that must stay intact.
        let guard_entry = nvmlProcessInfo_t {
            pid: 0xDEAD,
            usedGpuMemory: 0xBEEF,
            gpuInstanceId: 1,
            computeInstanceId: 2,
        };
        let mut buffer = [guard_entry; 5];
        // SAFETY: the first 4 entries of `buffer` are the capacity passed.
        unsafe { write_stride_32(buffer.as_mut_ptr(), 4, &entries) };
        assert_eq!(buffer[0].pid, 100);
        assert_eq!(buffer[0].usedGpuMemory, 1 << 30);
        // The second 24-byte entry starts at byte 24: the first record's cc-protected
        // memory (0) is read as its pid and padding, the second record's pid as its memory.
        assert_eq!(buffer[1].pid, 0);
        assert_eq!(buffer[1].usedGpuMemory, 101);
        assert_eq!(buffer[4].pid, 0xDEAD, "nothing written past the buffer");
        assert_eq!(buffer[4].usedGpuMemory, 0xBEEF);
    }
}
