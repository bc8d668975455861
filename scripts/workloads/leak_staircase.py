"""LEAK (staircase): an evaluation cache that grows by a fixed block every few seconds and is
never evicted. Memory is flat between steps, so a naive slope over a short window sees
nothing; the steps never stop."""
import time

from common import blob, duration, label, mib

ROLE = "leak-staircase"
base = blob(mib(1024))
label(ROLE, "start")
t0 = time.time()
cache = {}
warmup_s = 30.0
step = 0
next_at = t0 + warmup_s
started = False
while time.time() - t0 < duration():
    now = time.time()
    if now >= next_at:
        if not started:
            started = True
            label(ROLE, "leak_start")
        cache[step] = blob(mib(256))  # 256 MiB every 8 s ≈ 33.5 MB/s on average
        step += 1
        next_at += 8.0
    time.sleep(0.05)
label(ROLE, "end")
