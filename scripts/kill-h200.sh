#!/usr/bin/env bash
# `vramctl ps` and `vramctl kill` on a real GPU, measured against nvidia-smi in the same run.
#
#   scripts/kill-h200.sh path/to/vramctl OUTDIR
#
# Cases (PyTorch on cuda:0):
#   holder        one process holding 20 GiB                          kill PID
#   loader-tree   trainer (8 GiB) + 4 forked DataLoader workers       kill --tree PID
#   loader-parent the same, only the trainer is named: the workers
#                 inherited its /dev/nvidia* descriptors, so its
#                 memory may stay held until they go ("who still
#                 holds it")                                          kill PID
#   cuda-loader   trainer (8 GiB) + 4 spawned workers with their own
#                 CUDA contexts (256 MiB each)                        kill --tree PID
#
# For each: `ps`, `ps --tree` and `ps --json` before the kill, `kill --yes --json` (with
# the audit log in OUTDIR), and nvidia-smi's memory.used polled every 50 ms in the
# background the whole time. OUTDIR/comparison.md lines up the bytes freed and the
# time-to-free vramctl measured with what nvidia-smi saw.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vramctl="$(realpath "${1:?usage: kill-h200.sh path/to/vramctl OUTDIR}")"
out="$(realpath -m "${2:?usage: kill-h200.sh path/to/vramctl OUTDIR}")"
mkdir -p "$out"
# The audit log is the history database's audit table, plus a JSON-lines copy.
export VRAMCTL_DB="$out/history.db"
export VRAMCTL_AUDIT_LOG="$out/audit.jsonl"

nvidia-smi --query-gpu=timestamp,uuid,memory.used --format=csv,noheader,nounits -lms 50 \
  > "$out/smi.csv" &
smi=$!
workload=""
cleanup() {
  [ -n "$workload" ] && kill -KILL -- "-$workload" 2>/dev/null || true
  kill "$smi" 2>/dev/null || true
}
trap cleanup EXIT

run_case() {
  local name="$1" tree="$2" mode="$3" gib="$4"
  local ready="$out/$name.ready"
  rm -f "$ready"
  echo "== $name: starting $mode ($gib GiB)" >&2
  # Own session, so whatever is left can be ended as a group afterwards.
  setsid python3 "$here/workloads/kill_target.py" "$mode" "$gib" "$ready" \
    > "$out/$name.workload.log" 2>&1 &
  workload=$!
  for _ in $(seq 1 1200); do [ -e "$ready" ] && break; sleep 0.1; done
  [ -e "$ready" ] || { echo "$name: workload never got ready; see $out/$name.workload.log" >&2; exit 1; }
  local pid
  pid="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$ready")"
  sleep 1 # a baseline for nvidia-smi
  "$vramctl" ps > "$out/$name.ps.txt"
  "$vramctl" ps --tree > "$out/$name.ps-tree.txt"
  "$vramctl" ps --json > "$out/$name.ps.json"
  echo "== $name: vramctl kill --yes --json $tree $pid" >&2
  set +e
  # shellcheck disable=SC2086 # $tree is empty or one flag
  "$vramctl" kill --yes --json --timeout 30 $tree "$pid" > "$out/$name.kill.json" 2> "$out/$name.kill.err"
  echo $? > "$out/$name.kill.rc"
  set -e
  sleep 6 # after: the workers' own watchdog (5 s) and nvidia-smi's view settle
  date -u +%Y-%m-%dT%H:%M:%S.%3NZ > "$out/$name.end"
  kill -KILL -- "-$workload" 2>/dev/null || true
  wait "$workload" 2>/dev/null || true
  workload=""
  sleep 2
}

run_case holder "" holder 20
run_case loader-tree --tree loader 8
run_case loader-parent "" loader 8
run_case cuda-loader --tree cuda-loader 8
kill "$smi" 2>/dev/null || true

python3 - "$out" <<'PY'
import datetime as dt, json, os, sys

out = sys.argv[1]

def parse_smi(line):
    ts, uuid, used = [x.strip() for x in line.split(",")]
    t = dt.datetime.strptime(ts, "%Y/%m/%d %H:%M:%S.%f").timestamp()  # local time
    return t, uuid, int(used)

samples = []
for line in open(os.path.join(out, "smi.csv")):
    try:
        samples.append(parse_smi(line))
    except ValueError:
        pass

def iso(s):
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()

MIB = 1024 * 1024
rows = []
notes = []
for case in ["holder", "loader-tree", "loader-parent", "cuda-loader"]:
    path = os.path.join(out, f"{case}.kill.json")
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        rows.append(f"| {case} | (no kill output: see {case}.kill.err) |||||||")
        continue
    k = json.load(open(path))
    rc = open(os.path.join(out, f"{case}.kill.rc")).read().strip()
    t0 = iso(k["signalled_at"]) if k.get("signalled_at") else None
    end = iso(open(os.path.join(out, f"{case}.end")).read().strip())
    for d in k["devices"] or [{"uuid": None}]:
        uuid = d.get("uuid")
        mine = [(t, u) for t, uid, u in samples if uid == uuid]
        before = [u for t, u in mine if t0 and t < t0]
        after = [u for t, u in mine if t0 and t0 <= t <= end]
        smi_before = before[-1] if before else None
        smi_final = after[-1] if after else None
        smi_freed = (smi_before - smi_final) if smi_before is not None and smi_final is not None else None
        smi_t = None
        if smi_freed and smi_freed > 0:
            target = smi_final + 0.05 * smi_freed
            for t, u in mine:
                if t >= t0 and u <= target:
                    smi_t = t - t0
                    break
        def show(x, spec):
            return "-" if x is None else format(x, spec)

        v_held = d.get("held_bytes")
        v_freed = d.get("freed_bytes")
        cells = [
            case,
            rc,
            show(None if v_held is None else v_held / MIB, ".0f"),
            show(None if v_freed is None else v_freed / MIB, ".0f"),
            str(d.get("released")),
            show(d.get("released_after_s"), ".3f"),
            show(smi_freed, "d"),
            show(smi_t, ".3f"),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    for t in k["targets"]:
        notes.append(
            f"- {case}: PID {t['pid']} {t['outcome']} signals={t['signals']} "
            f"escalated={t['escalated']} exited_after_s={t['exited_after_s']}"
            + (f" ({t['detail']})" if t.get("detail") else "")
        )
    for s in k.get("still_held", []):
        for h in s["holders"]:
            notes.append(f"- {case}: still held on {s['uuid']}: PID {h['pid']} ({h['command']}): {h['why']}")

table = [
    "# vramctl kill vs nvidia-smi",
    "",
    "vramctl: `held` = what NVML attributed to the ended targets, `freed` = used before - used",
    "after, `t` = first signal to the 50 ms sample that showed the memory gone. nvidia-smi:",
    "memory.used (MiB) polled every 50 ms, `freed` = last sample before the signal - last",
    "sample of the case, `t` = first sample within 5 % of the final value.",
    "",
    "| case | exit | vramctl held MiB | vramctl freed MiB | released | vramctl t (s) | smi freed MiB | smi t (s) |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
] + rows + ["", "## Targets", ""] + notes
text = "\n".join(table) + "\n"
open(os.path.join(out, "comparison.md"), "w").write(text)
print(text)
PY
