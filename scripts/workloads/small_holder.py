"""SMALL HOLDER: one of many small PyTorch processes on a GPU (the recorder benchmark's
crowd): allocates $HOLD_MIB MiB (default 512), runs a small kernel every
$WORK_EVERY_S seconds (default 2; a process that sleeps for good is idle_holder.py), and
stays until killed or $DURATION seconds pass. Prints "ready" once its memory is held."""
import os
import sys
import time

import torch

from common import blob, duration, label, mib

ROLE = "small-holder"
label(ROLE, "start")
held = blob(mib(int(os.environ.get("HOLD_MIB", "512"))))
a = torch.randn(512, 512, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
every = float(os.environ.get("WORK_EVERY_S", "2"))
t0 = time.time()
while time.time() - t0 < duration():
    a = (a @ a).tanh()
    torch.cuda.synchronize()
    time.sleep(every)
label(ROLE, "end")
print("done", file=sys.stderr, flush=True)
