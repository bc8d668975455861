#!/usr/bin/env bash
# CPU of `vramctl top` at 1 s refresh with 8 GPUs x 30 processes (the fake NVML library's
# eight-gpus-30-procs scenario), measured as the utime+stime the real binary accumulates in
# /proc/PID/stat over SECONDS (default 60) while it runs in a 120x40 tmux pane.
#
#   scripts/top-cpu.sh target/release/vramctl target/release/libfake_nvml.so [SECONDS]
#
# Prints one line: CPU seconds used, wall seconds, and the percentage of one core.
set -euo pipefail
vramctl=$(realpath "$1")
lib=$(realpath "$2")
seconds=${3:-60}
here=$(cd "$(dirname "$0")/.." && pwd)
scenario=$here/examples/scenarios/eight-gpus-30-procs.toml
sock=$(mktemp -u /tmp/vramctl-top-cpu.XXXXXX)
tmux=(tmux -S "$sock" -f /dev/null)
cleanup() { "${tmux[@]}" kill-server 2>/dev/null || true; }
trap cleanup EXIT

# `exec` so that the pane's process is vramctl itself.
"${tmux[@]}" new-session -d -s top -x 120 -y 40 \
  "exec env -i PATH=\"\$PATH\" TERM=\"\$TERM\" VRAMCTL_NVML_LIB='$lib' FAKE_NVML_SCENARIO='$scenario' '$vramctl' top --interval 1"
pid=$("${tmux[@]}" display-message -p -t top '#{pane_pid}')
# Let it start (NVML init, first samples) before measuring the steady state.
sleep 5
ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
t0=$(date +%s.%N); c0=$(ticks)
sleep "$seconds"
t1=$(date +%s.%N); c1=$(ticks)
"${tmux[@]}" capture-pane -p -t top | head -3 >&2
awk -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" -v hz="$hz" 'BEGIN {
  cpu = (c1 - c0) / hz; wall = t1 - t0;
  printf "cpu %.2f s over %.1f s wall = %.2f%% of one core\n", cpu, wall, 100 * cpu / wall }'
