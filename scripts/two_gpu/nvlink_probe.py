#!/usr/bin/env python3
"""What NVML answers about NVLink, topology and P2P on this host, call by call, with each
call's time: the facts `vramctl info`'s NVLink section rests on, beside nvidia-smi's own
`topo -m`, `topo -p2p rw` and `nvlink -s`. Reads only (pynvml); changes nothing.

    python3 scripts/two_gpu/nvlink_probe.py > probe.txt
"""
import subprocess
import time

import pynvml as n


def timed(f, *a):
    t = time.perf_counter()
    try:
        v = f(*a)
        err = None
    except n.NVMLError as e:
        v, err = None, str(e)
    return v, err, (time.perf_counter() - t) * 1e6


def field(h, fid, scope=0):
    fv = n.c_nvmlFieldValue_t()
    fv.fieldId = fid
    fv.scopeId = scope
    arr = (n.c_nvmlFieldValue_t * 1)(fv)
    t = time.perf_counter()
    fn = n._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    ret = fn(h, 1, arr)
    us = (time.perf_counter() - t) * 1e6
    r = arr[0]
    return ret, r.nvmlReturn, r.valueType, r.value.uiVal, r.value.ullVal, us


def main():
    for cmd in (["nvidia-smi", "-L"], ["nvidia-smi", "topo", "-m"], ["nvidia-smi", "topo", "-p2p", "rw"],
                ["nvidia-smi", "topo", "-p2p", "n"], ["nvidia-smi", "nvlink", "-s"], ["nvidia-smi", "nvlink", "-c"]):
        print("$", " ".join(cmd))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        print(p.stdout + p.stderr)
    n.nvmlInit()
    count = n.nvmlDeviceGetCount()
    hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    for i, h in enumerate(hs):
        print(f"GPU {i} {n.nvmlDeviceGetName(h)} bus {n.nvmlDeviceGetPciInfo(h).busId}")
        for fid, name in ((90, "SPEED_MBPS_COMMON"), (91, "LINK_COUNT"), (84, "SPEED_MBPS_L0")):
            print("  field", name, field(h, fid))
        for link in range(18):
            st, e1, t1 = timed(n.nvmlDeviceGetNvLinkState, h, link)
            ver, e2, t2 = timed(n.nvmlDeviceGetNvLinkVersion, h, link)
            rp, e3, t3 = timed(n.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            rt, e4, t4 = timed(n.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
            sp = field(h, 164, link)
            bus = rp.busId if rp is not None else None
            print(f"  link {link}: state {st} {e1} {t1:.0f}us | version {ver} {e2} {t2:.0f}us | "
                  f"remote {bus} {e3} {t3:.0f}us | type {rt} {e4} {t4:.0f}us | speed164 {sp}")
    for i in range(count):
        for j in range(count):
            if i == j:
                continue
            lv, e, t = timed(n.nvmlDeviceGetTopologyCommonAncestor, hs[i], hs[j])
            print(f"pair {i}->{j}: topology {lv} {e} {t:.0f}us")
            for idx, name in ((0, "read"), (1, "write"), (2, "nvlink"), (3, "atomics"), (4, "prop")):
                s, e, t = timed(n.nvmlDeviceGetP2PStatus, hs[i], hs[j], idx)
                print(f"  p2p {name}: {s} {e} {t:.0f}us")
    n.nvmlShutdown()


main()
