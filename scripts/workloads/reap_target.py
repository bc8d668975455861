"""REAP TARGETS for scripts/reap-h200.sh: one idle holder and one busy one.

  reap_target.py idle GIB READY   allocates GIB GiB on cuda:0, then sleeps (no kernels,
                                  no CPU): what `vramctl reap` should end
  reap_target.py busy GIB READY   allocates GIB GiB, then multiplies matrices in a loop
                                  (SM busy, CPU busy launching): what it must leave alone

READY is written (JSON: pid) once the memory is allocated.
"""
import json
import os
import sys
import time

import torch


def main():
    mode, gib, ready = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    held = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    held.fill_(1)
    torch.cuda.synchronize()
    with open(ready + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "mode": mode}, f)
    os.rename(ready + ".tmp", ready)
    if mode == "idle":
        while True:
            time.sleep(3600)
    a = torch.randn(4096, 4096, device="cuda")
    while True:
        for _ in range(50):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
