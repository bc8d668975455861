"""NOT A LEAK: steady training with constant memory after the first step."""
import time

import torch

from common import duration, label, mlp

ROLE = "steady"
model = mlp(4096, 8)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
label(ROLE, "start")
t0 = time.time()
while time.time() - t0 < duration():
    x = torch.randn(1024, 4096, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    _ = loss.item()
label(ROLE, "end")
