"""NOT A LEAK: dynamic input shapes. The caching allocator's reserve steps up each time a new
largest batch arrives, then plateaus once the cache covers the peak."""
import random
import time

import torch

from common import duration, label, mlp

ROLE = "dyn-shapes"
random.seed(1)
model = mlp(2048, 6)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
label(ROLE, "start")
t0 = time.time()
while time.time() - t0 < duration():
    elapsed = time.time() - t0
    # The largest sequence length seen grows over the first ~90 s, then the range is fixed.
    max_len = int(256 + min(elapsed, 90.0) / 90.0 * 3840)
    n = random.randint(128, max_len)
    x = torch.randn(n, 2048, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    _ = loss.item()
    time.sleep(0.1)
label(ROLE, "end")
