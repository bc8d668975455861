"""LEAK (fast): an inference loop that appends every output to a list."""
import time

import torch

from common import duration, label, mlp

ROLE = "leak-fast"
model = mlp(4096, 2)
label(ROLE, "start")
t0 = time.time()
outputs = []
warmup_s = 60.0
started = False
with torch.no_grad():
    while time.time() - t0 < duration():
        y = model(torch.randn(2048, 4096, device="cuda"))  # 32 MiB of output
        if time.time() - t0 >= warmup_s:
            if not started:
                started = True
                label(ROLE, "leak_start")
            outputs.append(y)  # the bug: 32 MiB kept per step, 4 steps/s ≈ 134 MB/s
        torch.cuda.synchronize()
        time.sleep(0.25)
label(ROLE, "end")
