"""Shared bits of the labeled GPU workloads: label events and timing.

Each workload appends JSON lines to $LABELS (or labels.jsonl): one per event, with the wall
time, the PID as the driver sees it, the role and what happened ("start", "leak_start",
"idle_start", "end"). The labels are the ground truth the leak detector is scored against.
"""
import json
import os
import sys
import time

import torch


def label(role, event, **extra):
    rec = {"t": time.time(), "pid": os.getpid(), "role": role, "event": event}
    rec.update(extra)
    path = os.environ.get("LABELS", "labels.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps(rec), file=sys.stderr, flush=True)


def duration():
    return float(os.environ.get("DURATION", "300"))


def mib(n):
    return int(n) * 1024 * 1024


def blob(nbytes, dev="cuda"):
    """A tensor of exactly nbytes (float32 elements), filled so pages are touched."""
    return torch.ones(nbytes // 4, dtype=torch.float32, device=dev)


def mlp(width, depth, dev="cuda"):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).to(dev)
