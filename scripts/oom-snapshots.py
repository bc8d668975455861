#!/usr/bin/env python3
"""Generated allocator snapshots that end in an OOM of a known cause: a test double at the
PyTorch boundary (no GPU here). Each file has the exact structure `torch.cuda.memory.
_snapshot()` pickles (a dict of `segments`, `device_traces`, `allocator_settings`,
`external_annotations`; the keys in torch 2.11's order; see
/work/shared/research/research-pytorch-memory.md §1.3), made by a small caching allocator
written here independently of vramctl's (best fit per stream and pool, the 512 B rounding,
2 MiB / 20 MiB / rounded segments, the split rules, release of unsplit free segments and
one retry before an OOM, a capacity).

    python3 scripts/oom-snapshots.py OUT_DIR --seeds 1-20

writes OUT_DIR/<seed>-<kind>.pickle and OUT_DIR/truth.json: per file the cause, the fixes
that are right (an empty list: none is), and the device's total memory. The truth of a
generated file is by construction (the scenario is built to have that cause); the real
check is scripts/oom-kinds-h200.py on the H200, which re-runs each case with the fix.

Seeds 1-20 are the choosing set (the leak thresholds of crates/vramctl-snapshot/src/
oom_cause.rs were chosen on them); seeds 101-140 the checking set the tests report on.
"""
from __future__ import annotations

import json
import pickle
import random
import sys
from pathlib import Path

MiB = 1 << 20
GiB = 1 << 30
SMALL = 1 * MiB


def round_size(n: int) -> int:
    return max(512, (n + 511) // 512 * 512)


def segment_size(n: int) -> int:
    if n <= SMALL:
        return 2 * MiB
    if n < 10 * MiB:
        return 20 * MiB
    return (n + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)


class Allocator:
    """The default caching allocator, one device."""

    def __init__(self, device_total: int, others: int = 0, limit: int | None = None, conf: str = ""):
        self.total = device_total
        self.others = others  # bytes other processes hold
        self.limit = limit  # set_per_process_memory_fraction's bytes
        self.conf = conf
        self.segments: list[dict] = []
        self.trace: list[dict] = []
        self.next_addr = 0x7F0000000000
        self.clock = 1_700_000_000_000_000

    def reserved(self) -> int:
        return sum(s["total_size"] for s in self.segments)

    def device_free(self) -> int:
        return max(self.total - self.others - self.reserved(), 0)

    def _event(self, action: str, addr: int | None, size: int, stream: int, frames: list) -> None:
        self.clock += 17
        e = {"action": action}
        if action == "oom":
            e["device_free"] = self.device_free()
        else:
            e["addr"] = addr
        e.update({"size": size, "stream": stream, "time_us": self.clock, "compile_context": "N/A",
                  "user_metadata": "", "frames": frames})
        self.trace.append(e)

    def _fits_new(self, size: int) -> bool:
        if self.limit is not None and self.reserved() + size > self.limit:
            return False
        return size <= self.device_free()

    def _release(self) -> None:
        keep = []
        for s in self.segments:
            if len(s["blocks"]) == 1 and s["blocks"][0]["state"] == "inactive" and s["segment_pool_id"] == (0, 0):
                self._event("segment_free", s["address"], s["total_size"], s["stream"], [])
            else:
                keep.append(s)
        self.segments = keep

    def malloc(self, n: int, stream: int = 0, frames: list | None = None, pool=(0, 0)) -> int | None:
        frames = frames or []
        size = round_size(n)
        small = size <= SMALL
        best = None
        for s in self.segments:
            if s["stream"] != stream or s["segment_pool_id"] != pool or (s["segment_type"] == "small") != small:
                continue
            for i, b in enumerate(s["blocks"]):
                if b["state"] == "inactive" and b["size"] >= size:
                    if best is None or (b["size"], b["address"]) < (best[0]["blocks"][best[1]]["size"], best[0]["blocks"][best[1]]["address"]):
                        best = (s, i)
        if best is None:
            seg = segment_size(size)
            if not self._fits_new(seg):
                self._release()
            if not self._fits_new(seg):
                self._event("oom", None, n, stream, frames)
                return None
            addr = self.next_addr
            self.next_addr += seg + 64 * MiB
            s = {"device": 0, "address": addr, "total_size": seg, "stream": stream,
                 "segment_type": "small" if small else "large", "segment_pool_id": pool,
                 "is_expandable": False, "frames": frames,
                 "blocks": [{"address": addr, "size": seg, "requested_size": 0, "state": "inactive", "frames": []}]}
            self.segments.append(s)
            self.segments.sort(key=lambda s: s["address"])
            self._event("segment_alloc", addr, seg, stream, frames)
            best = (s, 0)
        s, i = best
        b = s["blocks"][i]
        rest = b["size"] - size
        split = rest >= 512 if small else rest > SMALL
        if split:
            s["blocks"].insert(i + 1, {"address": b["address"] + size, "size": rest, "requested_size": 0,
                                       "state": "inactive", "frames": []})
            b["size"] = size
        b.update(state="active_allocated", requested_size=n, frames=frames)
        self._event("alloc", b["address"], n, stream, frames)
        return b["address"]

    def free(self, addr: int) -> None:
        for s in self.segments:
            for i, b in enumerate(s["blocks"]):
                if b["address"] == addr and b["state"] == "active_allocated":
                    self._event("free_requested", addr, b["requested_size"], s["stream"], b["frames"])
                    self._event("free_completed", addr, b["requested_size"], s["stream"], b["frames"])
                    b.update(state="inactive", requested_size=0, frames=[])
                    blocks = s["blocks"]
                    if i + 1 < len(blocks) and blocks[i + 1]["state"] == "inactive":
                        b["size"] += blocks.pop(i + 1)["size"]
                    if i > 0 and blocks[i - 1]["state"] == "inactive":
                        blocks[i - 1]["size"] += blocks.pop(i)["size"]
                    return
        raise KeyError(hex(addr))

    def snapshot(self) -> dict:
        segments = []
        for s in self.segments:
            active = [b for b in s["blocks"] if b["state"] != "inactive"]
            segments.append({
                "device": 0, "address": s["address"], "total_size": s["total_size"],
                "allocated_size": sum(b["size"] for b in active),
                "active_size": sum(b["size"] for b in active),
                "requested_size": sum(b["requested_size"] for b in active),
                "stream": s["stream"], "segment_type": s["segment_type"],
                "segment_pool_id": s["segment_pool_id"], "is_expandable": False,
                "blocks": [dict(b) for b in s["blocks"]], "frames": s["frames"],
            })
        return {
            "segments": segments,
            "device_traces": [list(self.trace)],
            "allocator_settings": {
                "PYTORCH_CUDA_ALLOC_CONF": self.conf, "max_split_size": -1,
                "garbage_collection_threshold": 0.0, "expandable_segments": False,
                "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                "pinned_use_cuda_host_register": False, "roundup_power2_divisions": {},
            },
            "external_annotations": [],
        }


def frame(name: str, line: int, filename: str = "train.py") -> list:
    return [{"filename": filename, "line": line, "name": name}]


def warmup(a: Allocator, rng: random.Random, weights: int, steps: int) -> list[int]:
    """Weights, then `steps` iterations whose activations are all freed: a stable floor."""
    kept = [a.malloc(weights, frames=frame("load", 10))]
    for _ in range(steps):
        acts = [a.malloc(rng.randrange(20, 200) * MiB, frames=frame("forward", 30)) for _ in range(rng.randrange(3, 8))]
        for x in acts:
            if x is not None:
                a.free(x)
    return kept


def shortage(rng):
    total = rng.choice([16, 24, 40]) * GiB
    a = Allocator(total)
    warmup(a, rng, rng.randrange(4, 8) * GiB, rng.randrange(10, 30))
    a.malloc(total, frames=frame("forward", 31))  # more than the device
    return a, "shortage", [], total


def fragmentation(rng):
    """One large segment cut into 100 MiB tensors, every other one freed: a request of
    three tensors fits in no hole; the device has little left. Whole 20 MiB pages in the
    holes: expandable segments can unmap and map them again at the end."""
    total = 8 * GiB
    a = Allocator(total, others=0)
    n = rng.randrange(20, 40)
    piece = 100 * MiB
    big = a.malloc(n * piece, frames=frame("warm", 5))
    a.free(big)
    pieces = [a.malloc(piece, frames=frame("cache", 12)) for _ in range(n)]
    for p in pieces[::2]:
        a.free(p)
    # Fill the device so a new segment cannot be had.
    a.others = total - a.reserved() - rng.randrange(50, 250) * MiB
    a.malloc(3 * piece, frames=frame("step", 40))
    return a, "fragmentation", ["expandable_segments:True"], total


def fragmentation_split(rng):
    """A cached 2 GiB block split by 30 MiB requests (the default splits large blocks), some
    kept: the next 2 GiB request finds it cut. max_split_size_mb below 2 GiB keeps the block
    whole; expandable segments too."""
    total = 8 * GiB
    a = Allocator(total)
    big = a.malloc(2 * GiB, frames=frame("embed", 8))
    a.free(big)
    small = [a.malloc(30 * MiB, frames=frame("small", 20)) for _ in range(rng.randrange(4, 10))]
    for s in small[1::2]:
        a.free(s)
    a.others = total - a.reserved() - rng.randrange(400, 1000) * MiB
    a.malloc(2 * GiB, frames=frame("embed", 9))
    fixes = [f"max_split_size_mb:{m}" for m in (32, 64, 128, 256, 512, 1024, 2048)] + ["expandable_segments:True"]
    return a, "fragmentation", fixes, total


def other_process(rng):
    total = 16 * GiB
    others = rng.randrange(6, 10) * GiB
    a = Allocator(total, others=others)
    warmup(a, rng, rng.randrange(2, 4) * GiB, rng.randrange(5, 15))
    # More than the process can get (total - others), less than live + that + others.
    a.malloc(total - others + rng.randrange(256, 1024) * MiB, frames=frame("forward", 33))
    return a, "other-process", ["free-others"], total


def process_limit(rng):
    """The issue's case scaled: a per-process limit, the device mostly free."""
    total = 140 * GiB
    limit = 16 * GiB
    a = Allocator(total, limit=limit, conf="")
    live = [a.malloc(12 * GiB, frames=frame("model", 3))]
    for _ in range(rng.randrange(3, 10)):
        x = a.malloc(rng.randrange(100, 900) * MiB, frames=frame("forward", 30))
        a.free(x)
    a.malloc(6 * GiB, frames=frame("forward", 34))
    return a, "process-limit", ["raise-limit"], total


def cached_other_stream(rng):
    """Stream 7 frees most of a segment it still partly uses; stream 0 then needs it."""
    total = 8 * GiB
    a = Allocator(total)
    whole = a.malloc(4 * GiB, stream=7, frames=frame("side", 50))
    a.free(whole)
    x = a.malloc(3 * GiB, stream=7, frames=frame("side", 51))
    a.malloc(1 * GiB - 30 * MiB, stream=7, frames=frame("side", 52))
    a.free(x)
    a.others = total - a.reserved() - rng.randrange(100, 500) * MiB
    a.malloc(2 * GiB, stream=0, frames=frame("main", 60))
    return a, "cached-elsewhere", ["same-stream"], total


def cached_graph_pool(rng):
    total = 8 * GiB
    a = Allocator(total)
    pool = (1, 0)
    whole = a.malloc(3 * GiB, frames=frame("capture", 70), pool=pool)
    a.free(whole)
    keep = a.malloc(512 * MiB, frames=frame("capture", 71), pool=pool)
    a.others = total - a.reserved() - rng.randrange(100, 400) * MiB
    a.malloc(2 * GiB, frames=frame("eager", 80))
    del keep
    return a, "cached-elsewhere", ["free-graph"], total


def leak(rng):
    total = rng.choice([8, 12]) * GiB
    a = Allocator(total)
    a.malloc(2 * GiB, frames=frame("load", 10))
    leak_size = rng.randrange(40, 120) * MiB
    for _ in range(400):
        acts = [a.malloc(rng.randrange(50, 300) * MiB, frames=frame("forward", 30)) for _ in range(4)]
        if any(x is None for x in acts):
            break
        kept = a.malloc(leak_size, frames=frame("log_loss", 88, "metrics.py"))
        for x in acts:
            a.free(x)
        if kept is None:
            break
    return a, "leak", ["leak-stack"], total


KINDS = [shortage, fragmentation, fragmentation_split, other_process, process_limit,
         cached_other_stream, cached_graph_pool, leak]


def seeds(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> None:
    out = Path(sys.argv[1])
    chosen = seeds(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--seeds" else list(range(101, 141))
    out.mkdir(parents=True, exist_ok=True)
    truth = {}
    for seed in chosen:
        for kind in KINDS:
            rng = random.Random(seed * 1000 + KINDS.index(kind))
            a, cause, fixes, total = kind(rng)
            if not any(e["action"] == "oom" for e in a.trace):
                raise SystemExit(f"{kind.__name__} seed {seed}: no OOM")
            name = f"{seed}-{kind.__name__}.pickle"
            (out / name).write_bytes(pickle.dumps(a.snapshot(), protocol=4))
            truth[name] = {"cause": cause, "fixes": fixes, "device_total_bytes": total,
                           "scenario": kind.__name__}
    (out / "truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
