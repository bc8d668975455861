#!/usr/bin/env bash
# `vramctl top` on a real GPU, for docs/ and for checking its numbers against nvidia-smi.
#
#   scripts/top-h200.sh path/to/vramctl OUTDIR [CAPTURES] [EVERY_S]
#
# Starts four PyTorch workloads of scripts/workloads/ (DURATION=480 s each; WORKLOADS=0 to
# start none and bring your own): leak_fast (flat after a 60 s warm-up, then keeps 134 MB/s
# of outputs), idle_holder (12 GiB, then sleeps), steady_train (flat, busy) and a kill
# target (kill_target.py holder 4 GiB). Then `vramctl top --interval 1 --idle-for 60s` in a
# private 120x40 tmux session, with VRAMCTL_AUDIT_LOG=OUTDIR/audit.jsonl and
# XDG_STATE_HOME=OUTDIR/state. Then CAPTURES times (default 6), EVERY_S seconds apart
# (default 10), writes at the same moment:
#   OUTDIR/screen-N.txt        the pane as text          (tmux capture-pane -p)
#   OUTDIR/screen-N.ansi       the pane with its colours  (tmux capture-pane -p -e -N)
#   OUTDIR/smi-apps-N.csv      nvidia-smi --query-compute-apps=pid,used_memory (MiB)
#   OUTDIR/smi-gpu-N.csv       nvidia-smi --query-gpu=index,memory.used,memory.total (MiB)
#   OUTDIR/compare-N.txt       each nvidia-smi PID and its MEM cell in top's table
# The last capture is taken with the detail pane of the top row open (Enter). With the
# workloads, then (up to 300 s) until leak_fast's row has the L flag and idle_holder's the
# I flag: OUTDIR/screen-verdicts.* (leak_fast's detail pane open: the verdict and its
# numbers) and OUTDIR/verdicts.txt (both rows, and how long after top started each flag
# showed). Then the kill key on the kill target: filter to it, K, OUTDIR/screen-kill-confirm.*,
# y, OUTDIR/screen-kill-result.* once the dialog says done (or not done), and
# OUTDIR/kill.txt: whether the PID is gone from /proc and from nvidia-smi, nvidia-smi's used
# memory before and after, and the audit log's lines. Then one more capture with the tree
# view (t). Then `q` quits and OUTDIR/exit.txt records top's exit status and
# whether the terminal left the alternate screen. PNGs of the screens are made with
# scripts/pane-to-png.py where Pillow is installed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
vramctl=$(realpath "$1")
out=$2
captures=${3:-6}
every=${4:-10}
mkdir -p "$out"
out=$(realpath "$out")
sock=$(mktemp -u /tmp/vramctl-top-h200.XXXXXX)
tmux=(tmux -S "$sock" -f /dev/null)
workloads=${WORKLOADS:-1}
leak_pid=; idle_pid=; target_pid=; wpids=()
if [ "$workloads" = 1 ]; then
  export LABELS="$out/labels.jsonl" DURATION=${DURATION:-480}
  ready="$out/kill-target.json"
  (
    cd "$here/workloads"
    python3 leak_fast.py 2> "$out/leak_fast.log" & echo $! > "$out/leak_fast.pid"
    python3 idle_holder.py 2> "$out/idle_holder.log" & echo $! > "$out/idle_holder.pid"
    python3 steady_train.py 2> "$out/steady_train.log" & echo $! > "$out/steady_train.pid"
    setsid python3 kill_target.py holder 4 "$ready" 2> "$out/kill_target.log" &
  )
  for _ in $(seq 1200); do [ -s "$ready" ] && break; sleep 0.1; done
  leak_pid=$(cat "$out/leak_fast.pid"); idle_pid=$(cat "$out/idle_holder.pid")
  target_pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$ready")
  wpids=("$leak_pid" "$idle_pid" "$(cat "$out/steady_train.pid")" "$target_pid")
  echo "workloads: leak_fast $leak_pid, idle_holder $idle_pid, kill target $target_pid" \
    | tee "$out/workloads.txt"
fi
cleanup() {
  "${tmux[@]}" kill-server 2>/dev/null || true
  for p in "${wpids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

"${tmux[@]}" new-session -d -s top -x 120 -y 40 \
  "exec env VRAMCTL_AUDIT_LOG='$out/audit.jsonl' XDG_STATE_HOME='$out/state' \
   '$vramctl' top --interval 1 --idle-for 60s 2> '$out/top.stderr'"
started=$(date +%s)
"${tmux[@]}" set-option -t top remain-on-exit on > /dev/null

# Wait (at most 60 s) for the first table.
for _ in $(seq 600); do
  "${tmux[@]}" capture-pane -p -t top | grep -q 'COMMAND' && break
  sleep 0.1
done

capture() {
  local n=$1
  "${tmux[@]}" capture-pane -p -t top > "$out/screen-$n.txt"
  "${tmux[@]}" capture-pane -p -e -N -t top > "$out/screen-$n.ansi"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits \
    > "$out/smi-apps-$n.csv" 2>&1
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits \
    > "$out/smi-gpu-$n.csv" 2>&1
  python3 - "$out/screen-$n.txt" "$out/smi-apps-$n.csv" > "$out/compare-$n.txt" <<'PY'
import sys
screen, smi = (open(p).read() for p in sys.argv[1:3])
rows = {}
table = False
for line in screen.splitlines():
    if "COMMAND" in line and "PID" in line:
        table = True
        continue
    parts = line.split()
    if table and len(parts) >= 4 and parts[0].isdigit():
        # PID USER GPU MEM ...: MEM is the fourth cell.
        rows.setdefault(parts[0], []).append(parts[3])
for line in smi.splitlines():
    bits = [b.strip() for b in line.split(",")]
    if len(bits) == 2 and bits[0].isdigit():
        print(f"pid {bits[0]}: nvidia-smi {bits[1]} MiB, top {rows.get(bits[0], ['(not in the rows shown)'])}")
print(f"{len(rows)} PIDs in top's visible rows")
PY
}

for n in $(seq 1 "$captures"); do
  if [ "$n" -eq "$captures" ]; then
    "${tmux[@]}" send-keys -t top g Enter
    sleep 1.5
  fi
  capture "$n"
  [ "$n" -lt "$captures" ] && sleep "$every"
done
"${tmux[@]}" send-keys -t top Escape

# The row of PID $1 on screen has flag $2 in its FLAGS cell (the cell before the command).
has_flag() {
  "${tmux[@]}" capture-pane -p -t top \
    | grep -qE "^ *$1 .* [LIZH]*$2[LIZH]* +python"
}
if [ "$workloads" = 1 ]; then
  leak_at=; idle_at=
  for _ in $(seq 300); do
    [ -z "$leak_at" ] && has_flag "$leak_pid" L && leak_at=$(( $(date +%s) - started ))
    [ -z "$idle_at" ] && has_flag "$idle_pid" I && idle_at=$(( $(date +%s) - started ))
    [ -n "$leak_at" ] && [ -n "$idle_at" ] && break
    sleep 1
  done
  # leak_fast's detail pane: filter to it, keep the filter, open the details.
  "${tmux[@]}" send-keys -t top / && "${tmux[@]}" send-keys -t top -l leak_fast
  "${tmux[@]}" send-keys -t top Enter g Enter
  sleep 1.5
  capture verdicts
  # Two separate Escapes (detail pane, then the filter): sent together they arrive as one
  # Alt-Escape, and the filter stayed.
  "${tmux[@]}" send-keys -t top Escape; sleep 0.3; "${tmux[@]}" send-keys -t top Escape
  sleep 1.5
  {
    echo "L on leak_fast ($leak_pid): ${leak_at:-never} s after top started (leak starts 60 s after the workload)"
    echo "I on idle_holder ($idle_pid): ${idle_at:-never} s after top started (--idle-for 60s)"
    "${tmux[@]}" capture-pane -p -t top | grep -E "PID|^ *($leak_pid|$idle_pid) "
  } > "$out/verdicts.txt"

  # The kill key on the kill target.
  before=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  "${tmux[@]}" send-keys -t top / C-u && "${tmux[@]}" send-keys -t top -l kill_target
  "${tmux[@]}" send-keys -t top Enter g K
  for _ in $(seq 100); do
    "${tmux[@]}" capture-pane -p -t top | grep -q 'kill this process?' && break
    sleep 0.1
  done
  capture kill-confirm
  "${tmux[@]}" send-keys -t top y
  for _ in $(seq 300); do
    "${tmux[@]}" capture-pane -p -t top | grep -qE 'kill: (done|not done)' && break
    sleep 0.1
  done
  capture kill-result
  after=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  {
    [ -e "/proc/$target_pid" ] && echo "PID $target_pid still in /proc" || echo "PID $target_pid gone from /proc"
    nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qx "$target_pid" \
      && echo "nvidia-smi still lists $target_pid" || echo "nvidia-smi no longer lists $target_pid"
    echo "GPU 0 memory.used (MiB): before the kill $before, after $after (leak_fast keeps growing)"
    echo "audit log ($out/audit.jsonl):"
    cat "$out/audit.jsonl" 2>/dev/null || echo "(none)"
  } > "$out/kill.txt"
  "${tmux[@]}" send-keys -t top x Escape
  sleep 1.5
fi
"${tmux[@]}" send-keys -t top t
sleep 1.5
capture tree
"${tmux[@]}" send-keys -t top q
for _ in $(seq 100); do
  [ "$("${tmux[@]}" display-message -p -t top '#{pane_dead}')" = 1 ] && break
  sleep 0.1
done
{
  echo "exit status: $("${tmux[@]}" display-message -p -t top '#{pane_dead_status}')"
  echo "alternate screen after exit: $("${tmux[@]}" display-message -p -t top '#{alternate_on}')"
  echo "mouse capture after exit: $("${tmux[@]}" display-message -p -t top '#{mouse_any_flag}')"
} > "$out/exit.txt"

if python3 -c 'import PIL' 2> /dev/null; then
  for f in "$out"/screen-*.ansi; do
    python3 "$here/pane-to-png.py" "$f" "${f%.ansi}.png" --columns 120
  done
else
  echo "Pillow is not installed: no PNGs (pip install pillow, then scripts/pane-to-png.py)" >&2
fi
cat "$out/exit.txt"
[ "$workloads" = 1 ] && cat "$out/verdicts.txt" "$out/kill.txt"
ls "$out"
