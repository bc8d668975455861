#!/usr/bin/env bash
# `vramctl reap` on a real GPU: an idle PyTorch holder is reaped, a busy one is left alone,
# and nvidia-smi agrees that the idle one's memory came back.
#
#   scripts/reap-h200.sh path/to/vramctl OUTDIR
#
# 1. `vramctl record --interval 1s` into OUTDIR/history.db (reap's idle evidence);
# 2. two workloads on cuda:0 (scripts/workloads/reap_target.py): `idle` holds IDLE_GIB
#    (default 2) and sleeps, `busy` holds BUSY_GIB (default 2) and multiplies matrices;
# 3. after WATCH_S (default 90) seconds: `reap` dry run (text and --json), then
#    `reap --apply --json`, both limited to these two (--match reap_target) so nothing
#    else on the machine can be touched, --idle-for 1m, --min-mem 1GiB;
# 4. `nvidia-smi --query-compute-apps` before and after, its memory.used every 100 ms the
#    whole time, and `vramctl history --audit`.
# OUTDIR/summary.md says what reap chose, what it freed and what nvidia-smi saw.
# About 2.5 minutes (WATCH_S + PyTorch start-up + the kill and checks).
#
# The H200 answers nvmlDeviceGetProcessUtilization with NOT_FOUND, so per-process SM
# activity is missing there; with two processes on the GPU device utilization cannot be
# attributed either; the evidence is CPU time (the busy one uses a core launching
# kernels, the idle one none).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vramctl="$(realpath "${1:?usage: reap-h200.sh path/to/vramctl OUTDIR}")"
out="$(realpath -m "${2:?usage: reap-h200.sh path/to/vramctl OUTDIR}")"
idle_gib="${IDLE_GIB:-2}"
busy_gib="${BUSY_GIB:-2}"
watch_s="${WATCH_S:-90}"
mkdir -p "$out"
export VRAMCTL_DB="$out/history.db"
export VRAMCTL_AUDIT_LOG="$out/audit.jsonl"
started=$(date +%s)

nvidia-smi --query-gpu=timestamp,uuid,memory.used --format=csv,noheader,nounits -lms 100 \
  > "$out/smi.csv" &
smi=$!
"$vramctl" record --interval 1s > "$out/record.log" 2>&1 &
recorder=$!
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  kill "$recorder" "$smi" 2>/dev/null || true
}
trap cleanup EXIT

# Sets $started_pid (not a $(...) subshell: the workload must stay in this shell's list).
start() {
  local mode="$1" gib="$2" ready="$out/$1.ready"
  rm -f "$ready"
  python3 "$here/workloads/reap_target.py" "$mode" "$gib" "$ready" > "$out/$mode.log" 2>&1 &
  pids+=("$!")
  for _ in $(seq 1 1200); do [ -e "$ready" ] && break; sleep 0.1; done
  [ -e "$ready" ] || { echo "$mode never got ready; see $out/$mode.log" >&2; exit 1; }
  started_pid="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$ready")"
}
start idle "$idle_gib"
idle_pid="$started_pid"
start busy "$busy_gib"
busy_pid="$started_pid"
echo "idle $idle_pid, busy $busy_pid; watching ${watch_s}s" >&2
echo "$idle_pid" > "$out/idle.pid"
echo "$busy_pid" > "$out/busy.pid"
sleep "$watch_s"

policy=(--match 'reap_target\.py' --idle-for 1m --min-mem 1GiB --tz UTC)
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$out/smi-apps-before.csv"
"$vramctl" ps > "$out/ps-before.txt"
set +e
"$vramctl" reap "${policy[@]}" > "$out/reap-dry-run.txt" 2> "$out/reap-dry-run.err"
echo $? > "$out/reap-dry-run.rc"
"$vramctl" reap "${policy[@]}" --json > "$out/reap-dry-run.json" 2>> "$out/reap-dry-run.err"
before_apply=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
"$vramctl" reap "${policy[@]}" --apply --json --timeout 30 > "$out/reap-apply.json" 2> "$out/reap-apply.err"
echo $? > "$out/reap-apply.rc"
set -e
sleep 3 # nvidia-smi's view settles
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$out/smi-apps-after.csv"
"$vramctl" ps > "$out/ps-after.txt"
"$vramctl" history --audit --tz UTC > "$out/audit.txt"
busy_alive=no; kill -0 "$busy_pid" 2>/dev/null && busy_alive=yes
idle_alive=no; kill -0 "$idle_pid" 2>/dev/null && idle_alive=yes
cleanup
trap - EXIT
wait 2>/dev/null || true
elapsed=$(( $(date +%s) - started ))

python3 - "$out" "$idle_pid" "$busy_pid" "$idle_alive" "$busy_alive" "$before_apply" "$elapsed" <<'PY'
import csv, datetime as dt, json, os, sys

out, idle, busy, idle_alive, busy_alive, before_apply, elapsed = sys.argv[1:]
idle, busy = int(idle), int(busy)

def apps(name):
    rows = {}
    with open(os.path.join(out, name)) as f:
        for r in csv.DictReader(f, skipinitialspace=True):
            # The header names the field as queried: "used_gpu_memory [MiB]".
            used = next(k for k in r if k.startswith("used"))
            rows[int(r["pid"])] = r[used]
    return rows

def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError):
        return None

dry, apply = load("reap-dry-run.json"), load("reap-apply.json")
before, after = apps("smi-apps-before.csv"), apps("smi-apps-after.csv")
lines = ["# reap on a real GPU", ""]
lines.append(f"idle PID {idle}, busy PID {busy}; script took {elapsed} s")
lines.append("")
if dry:
    lines.append(f"dry run (exit {open(os.path.join(out, 'reap-dry-run.rc')).read().strip()}): "
                 f"candidates {[c['pid'] for c in dry['candidates']]}")
    for c in dry["candidates"]:
        lines.append(f"  PID {c['pid']}: {c['why']}")
    for e in dry["excluded"]:
        lines.append(f"  left alone PID {e['pid']} ({e['stage']}): {e['reason']}")
if apply:
    lines.append(f"apply (exit {open(os.path.join(out, 'reap-apply.rc')).read().strip()}): "
                 f"ok {apply['ok']}, freed {apply['freed_bytes'] / 2**30:.2f} GiB")
    for c in apply["candidates"]:
        lines.append(f"  PID {c['pid']}: {c['outcome']}, signals {c['signals']}, "
                     f"exited after {c['exited_after_s']} s, freed {c['freed_bytes']}")
    for d in apply["devices"]:
        lines.append(f"  GPU {d['index']}: released {d['released']} after {d['released_after_s']} s, "
                     f"used {d['used_before_bytes']} -> {d['used_after_bytes']} (freed {d['freed_bytes']})")
lines.append("")
lines.append("nvidia-smi --query-compute-apps (MiB): before / after")
for pid, name in [(idle, "idle"), (busy, "busy")]:
    lines.append(f"  {name} {pid}: {before.get(pid, '-')} / {after.get(pid, '-')}")
lines.append(f"still running afterwards: idle {idle_alive}, busy {busy_alive}")
ok = (apply is not None and [c["pid"] for c in apply["candidates"]] == [idle]
      and apply["ok"] and idle not in after and busy in after and busy_alive == "yes")
lines.append("")
lines.append("PASS: the idle holder was reaped and its memory came back; the busy one was left alone"
             if ok else "FAIL: see the files beside this one")
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
