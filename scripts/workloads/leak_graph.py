"""LEAK: a validation loop run without torch.no_grad() that keeps every loss tensor, and with
it the autograd graph and its saved activations (the classic `val_losses.append(loss)` bug).

Training itself is clean (backward frees its graph); after a warm-up of clean validation
(`loss.item()`), each validation step leaves ~4 MiB of activations alive, 4 steps/s.
"""
import time

import torch

from common import duration, label, mlp

ROLE = "leak-graph"
torch.manual_seed(0)
model = mlp(2048, 4)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
label(ROLE, "start")
t0 = time.time()
val_losses = []
warmup_s = 45.0
leaking = False
while time.time() - t0 < duration():
    x = torch.randn(256, 2048, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    _ = loss.item()
    # Validation without no_grad(): the graph lives as long as `val` is referenced.
    val = model(torch.randn(64, 2048, device="cuda")).square().mean()
    if time.time() - t0 >= warmup_s:
        if not leaking:
            leaking = True
            label(ROLE, "leak_start")
        val_losses.append(val)  # the bug
    else:
        _ = val.item()
    torch.cuda.synchronize()
    time.sleep(0.25)
label(ROLE, "end")
