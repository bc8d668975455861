#!/usr/bin/env bash
# Issue 35 item 5 on a real GPU: the leak verdict judged on the agent's live tensors, and the
# leak's "where" from two allocator snapshots, against PyTorch's own counters logged by the
# jobs themselves in the same run. On the H200 machine:
#
#   OUT=/some/dir scripts/leak35-agent-h200.sh            (binary: $VRAMCTL or .dist/vramctl)
#
# Three PyTorch jobs, each logging time, torch.cuda.memory_allocated and memory_reserved once
# a second to $OUT/JOB.csv:
#   leak    the agent; an 8 GiB cache reserved first, then 8 MiB of live tensors kept every
#           0.5 s (16 MiB/s) from `leaky_step`, inside that cache: NVML's figure stays flat;
#           a transient 256 MiB "step" every 0.5 s beside it
#   cache   the agent; 1 GiB of live tensors, and each second a transient tensor 2 MiB
#           larger than the last (freed at once): the cache grows ~100 MiB/s, live tensors
#           stay flat
#   plain   the leak job without the agent: what NVML's memory alone says of it
# and `vramctl leaks --watch --json --interval 1s --where --where-after 10s` for 110 s.
# PASS lines:
#   leak-live     the leak job is judged `leak` on basis `allocated`, its reason naming live
#                 tensors, while its own log shows allocated rising and reserved flat
#   leak-where    its `where` names leaky_step first, with growth within 25 % of what the
#                 job's own memory_allocated gained between the two snapshots
#   cache-no-leak the cache job never judged `leak`, while its own log shows reserved rising
#                 and allocated flat
# and a `figure` line for the plain job's verdict (NVML alone; informational). About 2.5 min
# of GPU time. Writes $OUT/watch.ndjson, $OUT/*.csv, $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
VRAMCTL=$(readlink -f "${VRAMCTL:-.dist/vramctl}")
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
RUN_S=${RUN_S:-125}
WATCH_S=${WATCH_S:-110}

job() { # job NAME AGENT(0|1) KIND
  python3 - "$OUT/$1.csv" "$2" "$3" "$RUN_S" > "$OUT/$1.log" 2>&1 <<'PY' &
import sys, time
import torch
path, agent, kind, run_s = sys.argv[1], sys.argv[2] == "1", sys.argv[3], float(sys.argv[4])
MiB = 1 << 20
if agent:
    import vramctl_agent
    vramctl_agent.start()
log = open(path, "w", buffering=1)
log.write("t,allocated,reserved\n")
kept = []

def leaky_step():
    kept.append(torch.empty(8 * MiB, dtype=torch.uint8, device="cuda"))

if kind == "leak":
    x = torch.empty(8 << 30, dtype=torch.uint8, device="cuda"); del x   # the cache, reserved
else:
    base = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
t0 = time.time(); k = 0; next_log = t0
while time.time() - t0 < run_s:
    if kind == "leak":
        step = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda"); step.fill_(1); del step
        leaky_step()
        time.sleep(0.5)
    else:
        k += 1
        t = torch.empty((64 + 2 * k) * MiB, dtype=torch.uint8, device="cuda"); t.fill_(1); del t
        time.sleep(1.0)
    torch.cuda.synchronize()
    if time.time() >= next_log:
        log.write(f"{time.time():.3f},{torch.cuda.memory_allocated()},{torch.cuda.memory_reserved()}\n")
        next_log += 1.0
PY
}

job leak 1 leak; leak=$!
job cache 1 cache; cache=$!
job plain 0 leak; plain=$!
echo "$leak $cache $plain" > "$OUT/pids.txt"
sleep 5   # CUDA contexts up, the agents' sockets made
timeout -s TERM "$WATCH_S" "$VRAMCTL" leaks --watch --json --interval 1s --where --where-after 10s \
  > "$OUT/watch.ndjson" 2> "$OUT/watch.err"
echo "watch exit $?" >> "$OUT/watch.err"
wait "$leak" "$cache" "$plain"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1

python3 - "$OUT" "$leak" "$cache" "$plain" <<'PY' | tee "$OUT/summary.txt"
import csv, json, sys
from datetime import datetime
out, leak, cache, plain = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
events = [json.loads(l) for l in open(f"{out}/watch.ndjson") if l.strip()]
def rows(name):
    return [(float(r["t"]), int(r["allocated"]), int(r["reserved"])) for r in csv.DictReader(open(f"{out}/{name}.csv"))]
def verdicts(pid):
    return [e for e in events if e.get("event") == "verdict" and e.get("pid") == pid]
def ts(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
MB = 1e6
fails = 0
def result(ok, name, why):
    global fails
    print(f"{'PASS' if ok else 'FAIL'} {name}: {why}")
    fails += not ok

L = rows("leak")
alloc_rate = (L[-1][1] - L[0][1]) / (L[-1][0] - L[0][0]) / MB
reserved_change = (L[-1][2] - L[5][2]) / MB if len(L) > 5 else float("nan")
lv = verdicts(leak)
first = next((e for e in lv if e["verdict"] == "leak"), None)
ok = (first is not None and first.get("basis") == "allocated"
      and "live tensors" in first.get("explanation", "") and alloc_rate > 10 and abs(reserved_change) < 600)
result(ok, "leak-live", f"torch's own log: allocated {alloc_rate:+.1f} MB/s, reserved {reserved_change:+.0f} MB after 5 s; "
       f"vramctl: {'leak at ' + first['at'] + ' basis ' + str(first.get('basis')) + ': ' + first['explanation'] if first else 'never leak: ' + str([e['verdict'] for e in lv])}")

w = next((e["where"] for e in events if e.get("event") == "where" and e["where"]["pid"] == leak), None)
if w is None or w.get("error") or not w.get("sites"):
    result(False, "leak-where", f"no sites: {w}")
else:
    a, b = ts(w["from"]), ts(w["to"])
    near = lambda t: min(L, key=lambda r: abs(r[0] - t))[1]
    own = near(b) - near(a)
    site = w["sites"][0]
    ok = "leaky_step" in site["site"] and own > 0 and abs(site["grew_bytes"] - own) <= 0.25 * own
    result(ok, "leak-where", f"first site {site['site']!r} grew {site['grew_bytes']/MB:.0f} MB in {b-a:.1f} s; "
           f"torch's memory_allocated gained {own/MB:.0f} MB then; agent time {w.get('agent_ms')} ms; "
           f"recording started by the probe: {w.get('started_recording')}")

C = rows("cache")
c_alloc = (C[-1][1] - C[0][1]) / MB
c_res = (C[-1][2] - C[0][2]) / (C[-1][0] - C[0][0]) / MB
cv = verdicts(cache)
ok = bool(cv) and all(e["verdict"] != "leak" for e in cv) and c_res > 10 and abs(c_alloc) < 64
last = cv[-1] if cv else {}
result(ok, "cache-no-leak", f"torch's own log: reserved {c_res:+.1f} MB/s, allocated {c_alloc:+.0f} MB in all; "
       f"vramctl verdicts {[e['verdict'] for e in cv]}, last: {last.get('explanation')}")

pv = verdicts(plain)
print(f"figure plain (no agent, NVML alone): verdicts {[e['verdict'] for e in pv]}, basis {pv[-1].get('basis') if pv else None}")
sys.exit(1 if fails else 0)
PY
