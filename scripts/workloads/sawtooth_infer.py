"""NOT A LEAK (sawtooth): an inference server that allocates a large per-request cache and
releases it (empty_cache) after each request."""
import time

import torch

from common import blob, duration, label, mib

ROLE = "sawtooth"
weights = blob(mib(2048))
label(ROLE, "start")
t0 = time.time()
while time.time() - t0 < duration():
    kv = [blob(mib(512)) for _ in range(8)]  # 4 GiB per-request cache, built over ~2 s
    for _ in range(20):
        torch.cuda.synchronize()
        time.sleep(0.1)
    del kv
    torch.cuda.empty_cache()
    time.sleep(3.0)
label(ROLE, "end")
