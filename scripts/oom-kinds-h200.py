#!/usr/bin/env python3
"""Issue 33's held-out set, for the GPU session: eight kinds of CUDA OOM made on purpose on
one H200, each deterministic, a snapshot dumped at each OOM, the truth recorded (the cause,
and whether the fix works when the case is run again with it), and vramctl scored on them.

    python3 scripts/oom-kinds-h200.py --bin target/release/vramctl --out $OUT/oom-kinds

(scripts/oom-kinds-h200.sh builds vramctl and runs this.) Not run here: no GPU.

Each case runs in a fresh Python process (a clean CUDA context), records allocation history
from its first allocation (`_record_memory_history`, Python stacks), and dumps
`_dump_snapshot` when `torch.OutOfMemoryError` is raised. The cases:

  shortage          live tensors + the request are more than the GPU
  frag-expandable   a cached block cut in 512 MiB pieces, every other one freed, the GPU
                    otherwise full: a 1.5 GiB request fits in no hole (expandable segments
                    unmap the holes and map them again at the end)
  frag-max-split    a cached 20 GiB block split by 30 MiB requests, the GPU otherwise full,
                    then a 20 GiB request (max_split_size_mb keeps the block whole)
  other-process     a second process holds most of the GPU
  process-limit     set_per_process_memory_fraction: 16 GiB allowed, 12 GiB live, 6 GiB asked
  other-stream      memory freed on a side stream, in segments still partly used there, is
                    what the default stream's request needs
  graph-pool        a live CUDA graph's private pool caches what an eager request needs
  leak              each step keeps 512 MiB alive until the GPU is full

For each case: `base` (the OOM, its snapshot), `fix` (the case's own remedy: no other
process, a raised fraction, the same stream, the graph deleted, nothing kept — and for the
fragmentation cases the setting named), and, for every allocator setting vramctl proposes, a
run with that setting. The truth of "a setting fixes it" is that run. Writes under --out:
truth.json (per case: cause, fix kind, which settings were tried and whether the OOM
went away), vramctl.json (vramctl's verdict per case), score.json (cause right, fix right,
wrong allocator advice), score.md, and the snapshots (small: each case makes few
allocations). Exit 0 when every run completed, 2 when one failed to run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

GiB = 1 << 30
MiB = 1 << 20

CASES = ["shortage", "frag-expandable", "frag-max-split", "other-process", "process-limit",
         "other-stream", "graph-pool", "leak"]
TRUTH = {
    "shortage": ("shortage", None),
    "frag-expandable": ("fragmentation", "expandable_segments:True"),
    "frag-max-split": ("fragmentation", "max_split_size_mb:1024"),
    "other-process": ("other-process", "stop-other"),
    "process-limit": ("process-limit", "raise-limit"),
    "other-stream": ("cached-elsewhere", "same-stream"),
    "graph-pool": ("cached-elsewhere", "free-graph"),
    "leak": ("leak", "stop-keeping"),
}
# The words a fix of that kind has in vramctl's text.
FIX_WORDS = {
    "stop-other": "other processes", "raise-limit": "raise", "same-stream": "stream",
    "free-graph": "graph", "stop-keeping": "release",
}


def case_main(case: str, variant: str, snapshot: str) -> None:
    """One run of one case, in this process; prints one JSON line."""
    import torch

    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    dev = torch.device("cuda", 0)
    total = torch.cuda.mem_get_info()[1]
    keep: list = []

    def empty(n: int, stream=None):
        if stream is None:
            return torch.empty(n, dtype=torch.uint8, device=dev)
        with torch.cuda.stream(stream):
            return torch.empty(n, dtype=torch.uint8, device=dev)

    def fill(leave: int):
        """A balloon leaving `leave` bytes free on the device."""
        free = torch.cuda.mem_get_info()[0]
        if free > leave:
            keep.append(empty(free - leave))

    oom = False
    try:
        if case == "shortage":
            keep.append(empty(int(total * 0.6)))
            keep.append(empty(int(total * 0.5)))
        elif case == "frag-expandable":
            big = empty(60 * 512 * MiB)
            del big
            pieces = [empty(512 * MiB) for _ in range(60)]
            for i in range(0, 60, 2):
                pieces[i] = None
            keep.append(pieces)
            fill(200 * MiB)
            keep.append(empty(3 * 512 * MiB))
        elif case == "frag-max-split":
            big = empty(20 * GiB)
            del big
            small = [empty(30 * MiB) for _ in range(8)]
            keep.append(small[::2])
            del small
            fill(800 * MiB)
            keep.append(empty(20 * GiB))
        elif case == "other-process":
            holder = None
            if variant != "fix":
                holder = subprocess.Popen([sys.executable, "-c",
                    "import torch,sys,time;x=torch.empty(int(sys.argv[1]),dtype=torch.uint8,device='cuda');"
                    "print('ready',flush=True);time.sleep(600)", str(int(total * 0.7))],
                    stdout=subprocess.PIPE, text=True)
                holder.stdout.readline()
            try:
                keep.append(empty(int(total * 0.15)))
                keep.append(empty(int(total * 0.2)))
            finally:
                if holder:
                    holder.kill()
                    holder.wait()
        elif case == "process-limit":
            allowed = 16 * GiB if variant != "fix" else 20 * GiB
            torch.cuda.set_per_process_memory_fraction(allowed / total)
            keep.append(empty(12 * GiB))
            keep.append(empty(6 * GiB))
        elif case == "other-stream":
            side = torch.cuda.Stream()
            whole = empty(40 * GiB, side)
            del whole
            x = empty(30 * GiB, side)
            keep.append(empty(10 * GiB - 30 * MiB, side))
            del x
            torch.cuda.synchronize()
            fill(500 * MiB)
            keep.append(empty(20 * GiB, side if variant == "fix" else None))
        elif case == "graph-pool":
            g = torch.cuda.CUDAGraph()
            static = empty(1024)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                with torch.cuda.graph(g):
                    tmp = empty(30 * GiB)
                    out = empty(2 * GiB)
                    del tmp
            torch.cuda.current_stream().wait_stream(s)
            # The balloon first, so that what the fix frees is the graph's pool alone.
            fill(500 * MiB)
            if variant == "fix":
                del g, out
                torch.cuda.empty_cache()
            else:
                keep.append((g, static, out))
            keep.append(empty(20 * GiB))
        elif case == "leak":
            held = []
            for step in range(400):
                acts = [empty(256 * MiB * (1 + (step + i) % 3)) for i in range(4)]
                if variant != "fix":
                    held.append(empty(512 * MiB))
                del acts
            keep.append(held)
        else:
            raise SystemExit(f"unknown case {case}")
    except torch.OutOfMemoryError as e:
        oom = True
        message = str(e)
        if snapshot:
            torch.cuda.memory._dump_snapshot(snapshot)
    print(json.dumps({"case": case, "variant": variant, "oom": oom, "total_bytes": total,
                      "message": message if oom else None,
                      "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}))


def run_case(case: str, variant: str, snapshot: str = "", conf: str = "") -> dict:
    env = dict(os.environ)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    p = subprocess.run([sys.executable, __file__, "--case", case, "--variant", variant,
                        "--snapshot", snapshot], env=env, capture_output=True, text=True,
                       timeout=600)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"case": case, "variant": variant, "error": p.stderr[-2000:], "rc": p.returncode}
    return json.loads(lines[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case")
    ap.add_argument("--variant", default="base")
    ap.add_argument("--snapshot", default="")
    ap.add_argument("--bin")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.case:
        case_main(a.case, a.variant, a.snapshot)
        return 0
    os.makedirs(a.out, exist_ok=True)
    truth, verdicts, failed = {}, {}, False
    for case in CASES:
        snap = os.path.join(a.out, f"{case}.pickle")
        t0 = time.time()
        base = run_case(case, "base", snap)
        if "error" in base or not base["oom"]:
            truth[case] = {"error": base.get("error", "no OOM in the base run")}
            failed = True
            continue
        cause, fix_kind = TRUTH[case]
        tried = {}
        if fix_kind and ":" in fix_kind:
            tried[fix_kind] = not run_case(case, "base", conf=fix_kind).get("oom", True)
        else:
            fixed = run_case(case, "fix")
            tried["own-remedy"] = not fixed.get("oom", True)
        # Whether expandable_segments would have helped, for every case: the count of wrong
        # expandable advice needs it.
        tried.setdefault("expandable_segments:True",
                         not run_case(case, "base", conf="expandable_segments:True").get("oom", True))
        out = subprocess.run([a.bin, "snapshot", snap, "--json", "--device-memory",
                              str(base["total_bytes"])], capture_output=True, text=True)
        v = json.loads(out.stdout)["oom"][-1] if out.returncode == 0 else {"error": out.stderr}
        proposed = v.get("fix")
        if proposed and proposed.startswith("PYTORCH_CUDA_ALLOC_CONF="):
            setting = proposed.split("=", 1)[1]
            if setting not in tried:
                tried[setting] = not run_case(case, "base", conf=setting).get("oom", True)
        msg = subprocess.run([a.bin, "explain-oom", "--json"], input=base["message"],
                             capture_output=True, text=True)
        truth[case] = {"cause": cause, "fix_kind": fix_kind, "settings_tried": tried,
                       "message": base["message"], "seconds": round(time.time() - t0, 1)}
        verdicts[case] = {"snapshot": v, "explain_oom": json.loads(msg.stdout) if msg.returncode == 0 else None}
    score = {"cases": len(CASES), "cause_right": 0, "fix_right": 0, "wrong_allocator_advice": 0,
             "wrong_expandable_advice": 0, "explain_oom_cause_right": 0, "per_case": {}}
    for case, t in truth.items():
        if "error" in t:
            score["per_case"][case] = {"error": t["error"][-300:]}
            continue
        v = verdicts[case]["snapshot"]
        got_cause, fix = v.get("cause"), v.get("fix")
        right_cause = got_cause == t["cause"]
        if fix and fix.startswith("PYTORCH_CUDA_ALLOC_CONF="):
            setting = fix.split("=", 1)[1]
            works = t["settings_tried"].get(setting, False)
            right_fix = works
            if not works:
                score["wrong_allocator_advice"] += 1
                if setting.startswith("expandable_segments"):
                    score["wrong_expandable_advice"] += 1
        elif fix:
            right_fix = t["fix_kind"] in FIX_WORDS and FIX_WORDS[t["fix_kind"]] in fix
        else:
            right_fix = t["fix_kind"] is None
        e = verdicts[case]["explain_oom"] or {}
        score["cause_right"] += right_cause
        score["fix_right"] += right_fix
        score["explain_oom_cause_right"] += e.get("cause") == t["cause"]
        score["per_case"][case] = {"truth": t["cause"], "got": got_cause, "fix": fix,
                                   "fix_right": right_fix, "explain_oom": e.get("cause")}
    for name, doc in [("truth.json", truth), ("vramctl.json", verdicts), ("score.json", score)]:
        with open(os.path.join(a.out, name), "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
    with open(os.path.join(a.out, "score.md"), "w") as f:
        f.write(f"| case | truth | snapshot cause | fix | fix right | explain-oom |\n|---|---|---|---|---|---|\n")
        for case, row in score["per_case"].items():
            f.write(f"| {case} | {row.get('truth')} | {row.get('got')} | {row.get('fix')} | "
                    f"{row.get('fix_right')} | {row.get('explain_oom')} |\n")
        f.write(f"\ncause right {score['cause_right']}/{score['cases']}, fix right "
                f"{score['fix_right']}/{score['cases']}, wrong allocator advice "
                f"{score['wrong_allocator_advice']} (expandable {score['wrong_expandable_advice']})\n")
    print(json.dumps(score, indent=1))
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
