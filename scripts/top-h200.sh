#!/usr/bin/env bash
# `vramctl top` on a real GPU, for docs/ and for checking its numbers against nvidia-smi.
#
#   scripts/top-h200.sh path/to/vramctl OUTDIR [CAPTURES] [EVERY_S]
#
# Starts `vramctl top --interval 1` in a private 120x40 tmux session (start the labeled
# workloads of scripts/workloads/ yourself, before or while this runs), then CAPTURES times
# (default 6), EVERY_S seconds apart (default 10), writes at the same moment:
#   OUTDIR/screen-N.txt        the pane as text          (tmux capture-pane -p)
#   OUTDIR/screen-N.ansi       the pane with its colours  (tmux capture-pane -p -e -N)
#   OUTDIR/smi-apps-N.csv      nvidia-smi --query-compute-apps=pid,used_memory (MiB)
#   OUTDIR/smi-gpu-N.csv       nvidia-smi --query-gpu=index,memory.used,memory.total (MiB)
#   OUTDIR/compare-N.txt       each nvidia-smi PID and its MEM cell in top's table
# The last capture is taken with the detail pane of the top row open (Enter), and one more
# with the tree view (t). Then `q` quits and OUTDIR/exit.txt records top's exit status and
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
cleanup() { "${tmux[@]}" kill-server 2>/dev/null || true; }
trap cleanup EXIT

"${tmux[@]}" new-session -d -s top -x 120 -y 40 \
  "exec '$vramctl' top --interval 1 2> '$out/top.stderr'"
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
"${tmux[@]}" send-keys -t top Escape t
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
ls "$out"
