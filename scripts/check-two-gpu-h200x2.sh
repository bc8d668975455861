#!/usr/bin/env bash
# Issue 36 items 2 and 3 on the two-GPU machine (nvidia-h200-x2; any host with 2+ NVIDIA
# GPUs), in one device call of under 8 minutes (about 2.5). Each part compares with
# nvidia-smi or PyTorch's own counters in the same run and prints PASS/FAIL lines; the whole
# is summed up in $OUT/summary.txt, each part's output in $OUT/parts/NAME.log, its files in
# $OUT/parts.tar.gz (the device returns at most 8 files: KEEP_PARTS=1 keeps the folders too).
#
#   OUT=/some/dir scripts/check-two-gpu-h200x2.sh     (binary: $VRAMCTL or .dist/vramctl)
#   SKIP="views" ...                                  parts not to run
#
# Exit: 0 every part passed, 1 a part failed, 2 fewer than 2 GPUs (nothing run).
# NVLink multicast stays off (the device machines' rule): NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 for everything started here.
#
# Parts (issue 36 item: what it settles):
#   ddp-run  (2)  scripts/run-ddp-h200.sh: `run -- torchrun --nproc_per_node 2 ddp.py`, then
#                 scripts/two_gpu/checks.py ddp: each rank's PID in run's report under its own
#                 GPU; run's peak per rank and per GPU = nvidia-smi's per-PID peak over its
#                 200 ms samples within 2 MiB per process (both read NVML's per-process
#                 counter; the peak is a plateau held 3 s, PyTorch's cache returns nothing
#                 during the steps, so only nvidia-smi's whole MiB is left); the agent's
#                 allocated/reserved peaks per rank = the rank's torch.cuda counters to the
#                 byte (run injects the agent into torchrun's ranks itself); the larger peak
#                 on rank 1's GPU. ~40 s.
#   views    (3)  two busy GPUs: a 3 GiB PyTorch holder on GPU 0, a 7 GiB one on GPU 1 (both
#                 with vramctl's agent, PYTHONPATH=python) and one on GPU 1 that grows 32 MiB
#                 a second (a leak; no agent, so it is judged on NVML's memory at 1 s). While
#                 `record --interval 1s` writes a fresh history for 55 s and `serve` runs:
#                 status --json (through record's daemon and --no-daemon), ps --json, top
#                 (headless, scripts/two_gpu/pty_screen.py), serve's /api/now, each between
#                 two nvidia-smi readings; -i 0, -i 1, --gpu UUID and --gpu UUID-prefix on
#                 status, ps and top; doctor --json (and --gpu 1), info --json; nvidia-smi
#                 topo -m, nvlink -s and topo -p2p r/w/n beside them, and info --json timed
#                 (5 runs). Then history and leaks on the recording
#                 (whole, --gpu 1, --gpu 0), /api/now again. scripts/two_gpu/checks.py views:
#                 every figure within max(64 MiB, 1 %) of the nvidia-smi range around it,
#                 exactly nvidia-smi's PIDs per GPU, only the selected GPU under a selection,
#                 the agent's allocated bytes = the holder's torch counter, the leak only on
#                 GPU 1 (the grower) and nothing leaking on GPU 0; and (checks.py
#                 topology) info's NVLinks per GPU = nvidia-smi nvlink -s link by link,
#                 its matrix cell = topo -m's (NV18, NODE, ...), P2P read/write/NVLink ok
#                 exactly where topo -p2p r/w/n says OK. ~90 s.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# Lines that are an index only: a driver that fails prints its complaint on stdout.
ngpu=$(nvidia-smi --query-gpu=index --format=csv,noheader 2> /dev/null | grep -cE '^[0-9]+$')
if [ "${ngpu:-0}" -lt 2 ]; then
  echo "check-two-gpu-h200x2.sh: needs 2 GPUs, nvidia-smi lists ${ngpu:-0}; nothing run"
  exit 2
fi
VRAMCTL=$(readlink -f "${VRAMCTL:-.dist/vramctl}")
export VRAMCTL
OUT=${OUT:?set OUT}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
PART_RESULT_LINES='^(PASS|FAIL|MISMATCH|figure)'
. scripts/lib-check-parts.sh

say "vramctl: $("$VRAMCTL" --version 2>&1 | head -1)"
say "driver: $(nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tr '\n' ';')"
say "torch: $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), "GPUs")' 2>&1 | tail -1)"

# --- ddp-run (item 2) -------------------------------------------------------------------
# shellcheck disable=SC2329  # called through part
ddp_run() {
  local dir=$OUT/parts/ddp-run rc
  scripts/run-ddp-h200.sh "$VRAMCTL" "$dir"
  rc=$?
  python3 scripts/two_gpu/checks.py ddp "$dir" || return 1
  return "$rc"
}
part ddp-run ddp_run

# --- views (item 3) -----------------------------------------------------------------------
# shellcheck disable=SC2329  # called through part
views() {
  local d=$OUT/parts/views rt port=19836 uuid0 uuid1 prefix0 n p
  rt=$(mktemp -d /tmp/vramctl-two-gpu.XXXXXX)
  local -a pids=()
  : > "$d/captures.tsv"

  # The holders: steady ones with the agent, the grower without (NVML's 1 s steps judge it).
  PYTHONPATH=$PWD/python python3 scripts/two_gpu/holder.py --gpu 0 --gib 3 --agent \
    --ready "$d/holder-h0.json" > "$d/holder-h0.log" 2>&1 &
  pids+=($!)
  PYTHONPATH=$PWD/python python3 scripts/two_gpu/holder.py --gpu 1 --gib 7 --agent \
    --ready "$d/holder-h1.json" > "$d/holder-h1.log" 2>&1 &
  pids+=($!)
  python3 scripts/two_gpu/holder.py --gpu 1 --gib 1 --grow-mib 32 --every-s 1 --max-steps 400 \
    --ready "$d/holder-grow.json" > "$d/holder-grow.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 900); do
    [ -e "$d/holder-h0.json" ] && [ -e "$d/holder-h1.json" ] && [ -e "$d/holder-grow.json" ] && break
    sleep 0.1
  done
  cat "$d"/holder-*.json; echo
  scripts/two_gpu/smi-read.sh "$d/start" before
  scripts/two_gpu/smi-read.sh "$d/start" after
  uuid0=$(awk -F', ' '$1 == 0 { print $2 }' "$d/start.smi-before-gpu.csv")
  uuid1=$(awk -F', ' '$1 == 1 { print $2 }' "$d/start.smi-before-gpu.csv")
  # The shortest prefix of GPU 0's UUID (at least GPU- and 8 characters) no other GPU shares.
  for n in $(seq 12 40); do
    prefix0=${uuid0:0:$n}
    [ "$(grep -c ", $prefix0" "$d/start.smi-before-gpu.csv")" = 1 ] && break
  done
  echo "GPU 0 $uuid0 (prefix $prefix0), GPU 1 $uuid1"

  # A history of its own and a daemon socket of its own (status/ps ask it first).
  VRAMCTL_RUNTIME_DIR=$rt/record "$VRAMCTL" --db "$d/record.db" record --interval 1s --duration 55s \
    2> "$d/record.log" &
  local rec=$!
  VRAMCTL_RUNTIME_DIR=$rt/serve "$VRAMCTL" serve --listen "127.0.0.1:$port" --interval 1s \
    2> "$d/serve.log" &
  pids+=($!)
  export VRAMCTL_RUNTIME_DIR=$rt/record
  for _ in $(seq 100); do
    [ -S "$rt/record/daemon.sock" ] && curl -fsS -o /dev/null "http://127.0.0.1:$port/api/now" 2> /dev/null && break
    sleep 0.1
  done

  capture() { # capture NAME KIND SELECTED COMMAND...: stdout to NAME.json between two readings
    local name=$1 kind=$2 sel=$3
    shift 3
    scripts/two_gpu/smi-read.sh "$d/$name" before
    "$@" > "$d/$name.json" 2> "$d/$name.err"
    scripts/two_gpu/smi-read.sh "$d/$name" after
    printf '%s\t%s\t%s\n' "$name" "$kind" "$sel" >> "$d/captures.tsv"
  }
  top_capture() { # top_capture NAME SELECTED TOP-ARGS...: the screen between two readings
    local name=$1 sel=$2
    shift 2
    python3 scripts/two_gpu/pty_screen.py --cols 160 --rows 50 --ready COMMAND --out "$d/$name" \
      --hook "scripts/two_gpu/smi-read.sh '$d/$name'" -- "$VRAMCTL" top --readonly --interval 1s "$@"
    printf '%s\t%s\t%s\n' "$name" top "$sel" >> "$d/captures.tsv"
  }
  local t0=$SECONDS
  capture status status all "$VRAMCTL" status --json
  capture status-nd status all "$VRAMCTL" status --json --no-daemon
  capture status-i0 status 0 "$VRAMCTL" status --json -i 0
  capture status-i1 status 1 "$VRAMCTL" status --json -i 1
  capture status-uuid1 status 1 "$VRAMCTL" status --json --gpu "$uuid1"
  capture status-prefix0 status 0 "$VRAMCTL" status --json --gpu "$prefix0"
  capture ps ps all "$VRAMCTL" ps --json
  capture ps-nd ps all "$VRAMCTL" ps --json --no-daemon
  capture ps-i0 ps 0 "$VRAMCTL" ps --json -i 0
  capture ps-i1 ps 1 "$VRAMCTL" ps --json -i 1
  capture ps-uuid1 ps 1 "$VRAMCTL" ps --json --gpu "$uuid1"
  capture ps-prefix0 ps 0 "$VRAMCTL" ps --json --gpu "$prefix0"
  capture now now all curl -fsS "http://127.0.0.1:$port/api/now"
  top_capture top all
  top_capture top-i1 1 -i 1
  top_capture top-prefix0 0 --gpu "$prefix0"
  scripts/two_gpu/smi-read.sh "$d/doctor" before
  "$VRAMCTL" doctor --json > "$d/doctor.json" 2> "$d/doctor.err"
  "$VRAMCTL" info --json > "$d/info.json" 2> "$d/info.err"
  scripts/two_gpu/smi-read.sh "$d/doctor" after
  "$VRAMCTL" doctor --json --gpu 1 > "$d/doctor-i1.json" 2> "$d/doctor-i1.err"
  nvidia-smi topo -m > "$d/topo.txt" 2>&1
  nvidia-smi nvlink -s > "$d/nvlink.txt" 2>&1
  for flag in r w n; do nvidia-smi topo -p2p "$flag" > "$d/p2p-$flag.txt" 2>&1; done
  # info's cost with its NVLink and pair reads (72 NVML calls per GPU with 18 active links,
  # 4 per pair): the median of 5 runs.
  local runs=() t
  for _ in 1 2 3 4 5; do
    t=$(date +%s%N)
    "$VRAMCTL" info --json > /dev/null 2>&1
    runs+=($((($(date +%s%N) - t) / 1000000)))
  done
  echo "figure info --json on $(nvidia-smi -L | grep -c '^GPU') GPUs: median $(printf '%s\n' "${runs[@]}" | sort -n | sed -n 3p) ms of ${runs[*]} ms"
  echo "captures took $((SECONDS - t0)) s"

  wait "$rec"
  echo "record exit $?"
  scripts/two_gpu/smi-read.sh "$d/record-end" before
  scripts/two_gpu/smi-read.sh "$d/record-end" after
  capture now-end now all curl -fsS "http://127.0.0.1:$port/api/now"
  "$VRAMCTL" --db "$d/record.db" history --since all --format json > "$d/history.json" 2> "$d/history.err"
  "$VRAMCTL" --db "$d/record.db" history --since all --format json --gpu "$uuid1" > "$d/history-i1.json" 2>> "$d/history.err"
  {
    "$VRAMCTL" --db "$d/record.db" leaks --since all --json > "$d/leaks.json"
    "$VRAMCTL" --db "$d/record.db" leaks --since all --json --gpu 0 > "$d/leaks-gpu0.json"
    "$VRAMCTL" --db "$d/record.db" leaks --since all --json --gpu 1 > "$d/leaks-gpu1.json"
    "$VRAMCTL" --db "$d/record.db" leaks --since all > "$d/leaks.txt"
  } 2> "$d/leaks.err"
  cat "$d/leaks.txt"
  unset VRAMCTL_RUNTIME_DIR
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null; done
  wait 2> /dev/null
  rm -rf "$rt"
  python3 scripts/two_gpu/checks.py views "$d"
}
part views views

# The device returns at most 8 files: the parts' folders go into one archive.
tar czf "$OUT/parts.tar.gz" -C "$OUT" parts 2> /dev/null
if [ "${KEEP_PARTS:-0}" != 1 ]; then
  find "$OUT/parts" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
fi
say "== $fails part(s) failed"
exit $((fails > 0))
