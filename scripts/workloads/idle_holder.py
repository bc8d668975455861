"""IDLE HOLDER: allocates 12 GiB, computes briefly, then sleeps holding it (a forgotten
notebook kernel)."""
import time

import torch

from common import blob, duration, label, mib

ROLE = "idle-holder"
label(ROLE, "start")
held = blob(mib(12 * 1024))
a = torch.randn(8192, 8192, device="cuda")
for _ in range(50):
    a = (a @ a).tanh()
torch.cuda.synchronize()
label(ROLE, "idle_start")
t0 = time.time()
while time.time() - t0 < duration():
    time.sleep(1.0)
label(ROLE, "end")
