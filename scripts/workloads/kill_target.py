"""KILL TARGETS for scripts/kill-h200.sh: processes for `vramctl kill` to end.

  kill_target.py holder GIB READY        holds GIB GiB and sleeps
  kill_target.py loader GIB READY        holds GIB GiB, runs a DataLoader with 4 forked
                                         workers that never touch CUDA (they inherit the
                                         trainer's /dev/nvidia* descriptors, as usual)
  kill_target.py cuda-loader GIB READY   the same with 4 spawned workers that each allocate
                                         256 MiB: every worker has a CUDA context of its own

READY is written (JSON: pid, worker pids) once everything is allocated.
"""
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

WORKER_MIB = 256
_held = None


class Endless(Dataset):
    def __init__(self, cuda_workers):
        self.cuda_workers = cuda_workers

    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        global _held
        if self.cuda_workers and _held is None:
            _held = torch.ones(WORKER_MIB * 1024 * 1024 // 4, device="cuda")
            torch.cuda.synchronize()
        time.sleep(0.005)
        return torch.zeros(4)


def main():
    mode, gib, ready = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    held = torch.ones(int(gib * 1024**3) // 4, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    workers = []
    if mode in ("loader", "cuda-loader"):
        cuda_workers = mode == "cuda-loader"
        loader = DataLoader(
            Endless(cuda_workers),
            batch_size=1,
            num_workers=4,
            persistent_workers=True,
            prefetch_factor=2,
            multiprocessing_context="spawn" if cuda_workers else "fork",
        )
        it = iter(loader)
        # Enough batches that every worker has produced (and, with CUDA, allocated).
        for _ in range(64):
            next(it)
        workers = [w.pid for w in it._workers]
    elif mode != "holder":
        sys.exit(f"unknown mode {mode!r}")
    with open(ready + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "workers": workers, "held_bytes": held.numel() * 4}, f)
    os.rename(ready + ".tmp", ready)
    time.sleep(3600)


if __name__ == "__main__":
    main()
