#!/usr/bin/env bash
# `vramctl leaks` on a real GPU: the seven labeled PyTorch workloads of scripts/workloads/
# run side by side for DURATION seconds (default 300) while
#   - `vramctl leaks --watch --json --interval 100ms --idle-for 60s` prints verdict changes
#     live (real NVML: per-process SM where the driver has it; /proc start and CPU time),
#   - `vramctl record --interval 100ms` writes a history (CPU time every 10 s),
#   - nvidia-smi logs `--query-compute-apps` every 500 ms.
# Afterwards: `leaks` on the history and on the nvidia-smi log, `plot` of the history, and a
# score of the live events against the labels (leaks found, delay from leak_start, false
# alarms, the idle holder and the evidence used), in OUTDIR/summary.txt.
#
#   scripts/leaks-h200.sh path/to/vramctl OUTDIR [DURATION]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vramctl="$1"; out="$2"; export DURATION="${3:-300}"
mkdir -p "$out"
export LABELS="$out/labels.jsonl"
: > "$LABELS"
rm -f "$out/history.db"*

"$vramctl" leaks --watch --json --interval 100ms --idle-for 60s > "$out/watch.ndjson" 2> "$out/watch.err" &
watch=$!
"$vramctl" --db "$out/history.db" record --interval 100ms 2> "$out/record.err" &
rec=$!
nvidia-smi --query-compute-apps=timestamp,gpu_uuid,pid,process_name,used_memory \
  --format=csv -lms 500 > "$out/smi-query-compute-apps.csv" 2>&1 &
smi=$!
sleep 2

cd "$here/workloads"
pids=()
for w in steady_train leak_graph leak_staircase leak_fast dyn_shapes sawtooth_infer idle_holder; do
  python3 "$w.py" 2> "$out/$w.log" &
  pids+=($!)
done
cd - > /dev/null
for p in "${pids[@]}"; do wait "$p"; done
sleep 2
# TERM, not INT: a background job of a non-interactive shell starts with SIGINT ignored.
kill -TERM "$watch" 2>/dev/null
kill -TERM "$rec" "$smi" 2>/dev/null
wait 2>/dev/null

"$vramctl" --db "$out/history.db" leaks --since all --idle-for 60s > "$out/leaks-db.txt" 2>&1
echo "rc=$?" >> "$out/leaks-db.txt"
"$vramctl" --db "$out/history.db" leaks --since all --idle-for 60s --json > "$out/leaks-db.json" 2> "$out/leaks-db.err"
"$vramctl" leaks "$out/smi-query-compute-apps.csv" > "$out/leaks-smi.txt" 2>&1
echo "rc=$?" >> "$out/leaks-smi.txt"
"$vramctl" --db "$out/history.db" plot --since all --idle-for 60s -o "$out/plot.png" > "$out/plot.txt" 2>&1
echo "rc=$?" >> "$out/plot.txt"

python3 - "$out" > "$out/summary.txt" <<'EOF'
import json, sys, datetime
out = sys.argv[1]
labels = [json.loads(l) for l in open(f"{out}/labels.jsonl") if l.strip()]
role = {l["pid"]: l["role"] for l in labels}
leak_start = {l["pid"]: l["t"] for l in labels if l["event"] == "leak_start"}
idle_start = {l["pid"]: l["t"] for l in labels if l["event"] == "idle_start"}
def ts(s): return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
events = [json.loads(l) for l in open(f"{out}/watch.ndjson") if l.strip()]
print(f"live (leaks --watch, 100 ms): {len(events)} events")
found, false = {}, []
idle = {}
for e in events:
    if e.get("event") != "verdict":
        continue
    pid, v, at = e["pid"], e["verdict"], ts(e["at"])
    if v == "leak":
        if pid in leak_start and at >= leak_start[pid]:
            found.setdefault(pid, at - leak_start[pid])
        else:
            false.append((pid, role.get(pid, "?"), e["at"]))
    if v == "idle-holder":
        idle.setdefault(pid, (at - idle_start.get(pid, at), e["idle"]["evidence"]))
for pid, t0 in sorted(leak_start.items()):
    d = found.get(pid)
    print(f"  {role[pid]:15} PID {pid}: " + (f"leak found {d:.1f} s after leak_start" if d is not None else "MISSED"))
print(f"  false alarms: {false or 'none'}")
for pid, t0 in sorted(idle_start.items()):
    got = idle.get(pid)
    print(f"  {role[pid]:15} PID {pid}: " + (f"idle-holder {got[0]:.1f} s after idle_start, evidence {got[1]}" if got else "not flagged idle"))
others = [pid for pid in idle if pid not in idle_start]
print(f"  other processes called idle: {others or 'none'}")
db = json.load(open(f"{out}/leaks-db.json"))
print("history (leaks --db --since all --idle-for 60s):")
for s in db["series"]:
    print(f"  PID {s['pid']} {role.get(s['pid'], '?'):15} {s['verdict']:12} evidence {s['idle']['evidence']}")
EOF
cat "$out/summary.txt"
