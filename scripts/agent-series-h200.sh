#!/usr/bin/env bash
# The agent's figures outside `ps` on a real GPU (issue 14): `status`, `serve`'s metrics,
# `record`'s series and what one poll costs, against PyTorch's own counters and nvidia-smi
# in the same run. On the H200 machine:
#
#   scripts/agent-series-h200.sh path/to/vramctl path/to/agent_stats_cost OUTDIR
#
# One PyTorch process with the agent (2 GiB allocated, 4 GiB more freed and cached) writes
# its own torch.cuda.memory_allocated/memory_reserved to OUTDIR's raw log; then, while it
# holds them: `vramctl status --json` (its `agent` object), `vramctl serve` for 15 s (the
# two series of /metrics), `vramctl record --interval 1s --duration 15s` and `history
# --json` (the stored series), `vramctl snapshot` (read back with pickle), `reclaim --attach`
# (not available: the process has the agent), `agent_stats_cost PID 2000` (a poll's cost),
# nvidia-smi's figure for the PID. Writes OUTDIR/agent-series.txt (`name value` lines with
# AGREE/DIFFER) and OUTDIR/agent-series-raw.txt. About 60 s.
set -euo pipefail
VRAMCTL=$(realpath "$1")
COST=$(realpath "$2")
OUT=$(realpath -m "$3")
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUT"
work=$(mktemp -d)
raw="$OUT/agent-series-raw.txt"
sum="$OUT/agent-series.txt"
: > "$raw"; : > "$sum"
export PYTHONPATH="$here/../python${PYTHONPATH:+:$PYTHONPATH}"
python3 - "$work" > "$work/holder.log" 2>&1 <<'PY' &
import json, sys, time, os
import torch, vramctl_agent
GiB = 1 << 30
keep = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda"); keep.fill_(1)
cache = torch.empty(4 * GiB, dtype=torch.uint8, device="cuda"); cache.fill_(1); del cache
torch.cuda.synchronize()
path = vramctl_agent.start()
with open(os.path.join(sys.argv[1], "ready.json"), "w") as f:
    json.dump({"pid": os.getpid(), "socket": path,
               "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}, f)
time.sleep(120)
PY
holder=$!
serve=
# Never `kill 0` (the whole process group) for a serve that is not running.
trap 'kill $holder 2>/dev/null || true; [ -n "$serve" ] && kill "$serve" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -s "$work/ready.json" ] && break; sleep 0.2; done
cat "$work/ready.json" >> "$raw"; echo >> "$raw"
pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$work/ready.json")
echo "pid $pid" >> "$sum"
smi=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p="$pid" '$1==p {print $2}')
echo "nvidia_smi_used_mib $smi" >> "$sum"

# status --json
"$VRAMCTL" status --json --no-daemon > "$work/status.json"
cat "$work/status.json" >> "$raw"
python3 - "$work/ready.json" "$work/status.json" "$smi" >> "$sum" <<'PY'
import json, sys
ready = json.load(open(sys.argv[1])); st = json.load(open(sys.argv[2])); smi = int(sys.argv[3])
p = next(p for d in st["devices"] for p in (d["processes"] or []) if p["pid"] == ready["pid"])
a = p.get("agent") or {}
def verdict(x, y): return "AGREE" if x == y else "DIFFER"
print("status_used_mib", p["used_bytes"] >> 20, verdict(p["used_bytes"] >> 20, smi), "nvidia-smi", smi)
print("status_allocated_bytes", a.get("allocated_bytes"), verdict(a.get("allocated_bytes"), ready["allocated"]), "torch", ready["allocated"])
cached = ready["reserved"] - ready["allocated"]
print("status_cached_bytes", a.get("cached_bytes"), verdict(a.get("cached_bytes"), cached), "torch reserved-allocated", cached)
PY

# vramctl snapshot through the agent, read back with pickle
snap="$work/snap/live.pickle"; mkdir -p "$work/snap"
if "$VRAMCTL" snapshot --pid "$pid" -o "$snap" --json > "$work/snapshot.json" 2>>"$raw"; then
  cat "$work/snapshot.json" >> "$raw"; echo >> "$raw"
  python3 - "$snap" "$work/ready.json" >> "$sum" <<'PY'
import pickle, sys, json
d = pickle.load(open(sys.argv[1], "rb")); ready = json.load(open(sys.argv[2]))
segs = d.get("segments", [])
total = sum(s.get("total_size", 0) for s in segs)
print("snapshot_segments", len(segs), "segment_bytes", total, "AGREE" if total == ready["reserved"] else "DIFFER", "torch reserved", ready["reserved"])
PY
else
  echo "snapshot_failed $?" >> "$sum"
fi
# reclaim --attach on a process that has the agent (and is Python 3.12): not available, and why
set +e
"$VRAMCTL" reclaim --attach "$pid" --json > "$work/attach.json" 2>>"$raw"; rc=$?
set -e
echo "attach_exit $rc $(head -c 600 "$work/attach.json" | tr '\n' ' ')" >> "$sum"

# serve's metrics
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$VRAMCTL" serve --listen "127.0.0.1:$port" --interval 1s --process-details proc > "$work/serve.log" 2>&1 &
serve=$!
sleep 13
python3 - "$port" "$work/ready.json" >> "$sum" 2>>"$raw" <<'PY'
import json, sys, urllib.request
port, ready = sys.argv[1], json.load(open(sys.argv[2]))
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
def value(name):
    for line in text.splitlines():
        if line.startswith(name + "{") and f'pid="{ready["pid"]}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return None
al, re_ = value("vramctl_process_allocated_bytes"), value("vramctl_process_reserved_bytes")
print("serve_allocated_bytes", al, "AGREE" if al == ready["allocated"] else "DIFFER", "torch", ready["allocated"])
print("serve_reserved_bytes", re_, "AGREE" if re_ == ready["reserved"] else "DIFFER", "torch", ready["reserved"])
PY
kill $serve; wait $serve 2>/dev/null || true; serve=
grep -E 'agent|Agent' "$work/serve.log" | tail -5 >> "$raw" || true

# record's series
"$VRAMCTL" --db "$work/h.db" record --interval 1s --duration 15s > "$work/record.log" 2>&1 || echo "record_failed $?" >> "$sum"
"$VRAMCTL" --db "$work/h.db" history --since all --json > "$work/history.json" || echo "history_failed $?" >> "$sum"
python3 - "$work/history.json" "$work/ready.json" >> "$sum" 2>>"$raw" <<'PY'
import json, sys
h = json.load(open(sys.argv[1])); ready = json.load(open(sys.argv[2]))
found = {"allocated_bytes": set(), "reserved_bytes": set()}
def walk(x):
    if isinstance(x, dict):
        if x.get("pid") == ready["pid"]:
            for s in x.get("samples", []) if isinstance(x.get("samples"), list) else []:
                for k in found:
                    if isinstance(s, dict) and s.get(k) is not None: found[k].add(s[k])
            for k in found:
                if x.get(k) is not None: found[k].add(x[k])
        for v in x.values(): walk(v)
    elif isinstance(x, list):
        for v in x: walk(v)
walk(h)
for k, torch_v in (("allocated_bytes", ready["allocated"]), ("reserved_bytes", ready["reserved"])):
    vals = sorted(found[k])
    print("history_" + k, vals[:3], "AGREE" if vals == [torch_v] else "DIFFER", "torch", torch_v)
PY

# a poll's cost with real torch
"$COST" "$pid" 2000 >> "$sum" 2>&1 || echo "cost_failed $?" >> "$sum"
cat "$work/holder.log" >> "$raw"
cat "$sum"
