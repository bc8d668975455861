"""Compares vramctl's JSON with nvidia-smi's CSV and pynvml; prints one line per check."""
import csv
import json
import os
import sys

import pynvml

out, holder = sys.argv[1], int(sys.argv[2])
status = json.load(open(f"{out}/status.json"))
info = json.load(open(f"{out}/info.json"))
smi = list(csv.reader(open(f"{out}/smi-gpu.csv"), skipinitialspace=True))
apps = list(csv.reader(open(f"{out}/smi-apps.csv"), skipinitialspace=True))
MiB = 1024 * 1024
failures = 0


def check(what, ours, theirs, ok):
    global failures
    verdict = "ok" if ok else "MISMATCH"
    if not ok:
        failures += 1
    print(f"{verdict:8} {what}: vramctl={ours} other={theirs}")


pynvml.nvmlInit()
for row in smi:
    (index, uuid, name, serial, vbios, bus_id, total, reserved, used, free, gen_cur, gen_max,
     width_cur, width_max, ecc, persistence, compute_mode, mig, power_limit, driver) = row
    dev = next(d for d in status["devices"] if d["uuid"] == uuid)
    di = next(d for d in info["devices"] if d["uuid"] == uuid)
    mem = dev["memory"]
    # nvidia-smi prints MiB rounded down.
    for key, smi_mib in [("total_bytes", total), ("reserved_bytes", reserved), ("used_bytes", used), ("free_bytes", free)]:
        ours = mem[key] // MiB
        check(f"GPU {index} memory {key} (MiB)", ours, smi_mib, abs(ours - int(smi_mib)) <= 1)
    check(f"GPU {index} v2 sum", mem["used_bytes"] + mem["reserved_bytes"] + mem["free_bytes"], mem["total_bytes"],
          mem["used_bytes"] + mem["reserved_bytes"] + mem["free_bytes"] == mem["total_bytes"])
    check(f"GPU {index} name", dev["name"], name, dev["name"] == name)
    check(f"GPU {index} serial", di.get("serial"), serial, di.get("serial") == serial)
    check(f"GPU {index} vbios", di.get("vbios_version"), vbios, (di.get("vbios_version") or "").upper() == vbios.upper())
    check(f"GPU {index} pci bus id", dev["pci_bus_id"], bus_id, dev["pci_bus_id"].upper() == bus_id.upper())
    check(f"GPU {index} pcie gen now/max", (di.get("pcie_gen_current"), di.get("pcie_gen_max")), (gen_cur, gen_max),
          str(di.get("pcie_gen_current")) == gen_cur and str(di.get("pcie_gen_max")) == gen_max)
    check(f"GPU {index} pcie width now/max", (di.get("pcie_width_current"), di.get("pcie_width_max")), (width_cur, width_max),
          str(di.get("pcie_width_current")) == width_cur and str(di.get("pcie_width_max")) == width_max)
    check(f"GPU {index} ecc", di.get("ecc_enabled"), ecc, di.get("ecc_enabled") == (ecc == "Enabled"))
    check(f"GPU {index} persistence", di.get("persistence_mode"), persistence, di.get("persistence_mode") == (persistence == "Enabled"))
    check(f"GPU {index} driver", status["driver"]["driver_version"], driver, status["driver"]["driver_version"] == driver)

    h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    check(f"GPU {index} bus width (pynvml)", di.get("memory_bus_width_bits"), pynvml.nvmlDeviceGetMemoryBusWidth(h),
          di.get("memory_bus_width_bits") == pynvml.nvmlDeviceGetMemoryBusWidth(h))
    mclk = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)
    check(f"GPU {index} max memory clock (pynvml)", di.get("max_memory_clock_mhz"), mclk, di.get("max_memory_clock_mhz") == mclk)
    bar1 = pynvml.nvmlDeviceGetBAR1MemoryInfo(h)
    check(f"GPU {index} BAR1 total (pynvml)", di.get("bar1_total_bytes"), bar1.bar1Total, di.get("bar1_total_bytes") == bar1.bar1Total)
    print(f"info    GPU {index} bandwidth {di.get('memory_bandwidth_bytes_per_sec')} B/s, pcie now {di.get('pcie_current_bytes_per_sec')} B/s")

    ours = {p["pid"]: p["used_bytes"] for p in dev["processes"] or []}
    theirs = {int(pid): int(m) for (u, pid, m) in apps if u == uuid}
    check(f"GPU {index} PIDs", sorted(ours), sorted(theirs), set(ours) == set(theirs))
    for pid, m in theirs.items():
        if pid in ours and ours[pid] is not None:
            check(f"GPU {index} pid {pid} memory (MiB)", ours[pid] // MiB, m, abs(ours[pid] // MiB - m) <= 1)
    nv = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
    check(f"GPU {index} PIDs (pynvml)", sorted(ours), sorted(nv), set(ours) == set(nv))

# NVLinks: the same comparison as the two-GPU check (scripts/two_gpu/checks.py), link by link.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "two_gpu"))
import checks as two_gpu_checks  # noqa: E402

links = two_gpu_checks.Report()
try:
    nvlink_text = open(f"{out}/nvlink.txt").read()
except OSError:
    nvlink_text = None
if nvlink_text is None:
    check("nvidia-smi nvlink -s captured", False, True, False)
else:
    two_gpu_checks.compare_nvlinks(links, info, nvlink_text)
    failures += links.bad

check("holder PID listed", holder in {p["pid"] for d in status["devices"] for p in d["processes"] or []}, True,
      holder in {p["pid"] for d in status["devices"] for p in d["processes"] or []})
print(f"{failures} mismatches")
sys.exit(1 if failures else 0)
