#!/usr/bin/env bash
# Issue 29 (safe on a shared server) on a real H200, in one device call. Each part compares
# with nvidia-smi in the same run; each prints PASS/FAIL lines and the whole is summed up in
# $OUT/summary.txt (everything else is packed into $OUT/issue29.tar.gz, since a device call
# brings back only a few files).
#
#   OUT=/some/dir scripts/check-issue29-h200.sh        (binary: .dist/vramctl, as root)
#
# Parts:
#   real     scripts/check-real-gpu.sh: status/info against nvidia-smi and pynvml (no regression
#            from the new sanity bounds, escaping or identity reads)
#   attach   scripts/attach-safety-h200.sh: reclaim --attach on a real PyTorch process works
#            or refuses in one line; no file of the target's user is ever run (items 1-2)
#   jobctl   scripts/jobctl-h200.sh: run --timeout ends a CUDA job with a SIGTERM-ignoring
#            child and a double-forked daemon; kill refuses a non-holder (items 8, 11)
#   escape   a CUDA holder whose argv carries terminal escapes: ps/status list the same PIDs
#            as nvidia-smi and print none of its control bytes (item 6)
#   disk     record on the real driver into a 16 MiB tmpfs that fills and is freed: a gap
#            with the lost ticks, samples again afterwards, integrity ok (item 3)
#   serve    scripts/bench-serve-attack.sh against serve on the real driver, 10 s a run (item 7)
set -uo pipefail
cd "$(dirname "$0")/.."
VRAMCTL=$(readlink -f "${VRAMCTL:-.dist/vramctl}")
OUT=${OUT:?set OUT}
mkdir -p "$OUT/parts"
summary="$OUT/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
fails=0
pass() { say "PASS $1"; }
fail() { say "FAIL $1: $2"; fails=$((fails + 1)); }

say "vramctl: $("$VRAMCTL" --version 2>&1 | head -1)"
say "driver: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
say "kernel: $(uname -r)"

# SKIP="real attach ...": parts not to run (a second call after a first one that ran them).
SKIP=" ${SKIP:-} "
skipped() { [[ $SKIP == *" $1 "* ]] && say "== $1: skipped (SKIP)"; }
part() { # part NAME COMMAND...: runs a part's script, its output kept, its result line kept
  local name=$1
  shift
  skipped "$name" && return
  say "== $name"
  "$@" > "$OUT/parts/$name.log" 2>&1
  local rc=$?
  grep -E '^(PASS|FAIL|FAILED|ok|MISMATCH|[0-9]+ mismatches|attach-safety|jobctl-h200|---|scrapes|latency)' "$OUT/parts/$name.log" | tee -a "$summary"
  [ "$rc" = 0 ] && pass "$name (exit 0)" || fail "$name" "exit $rc, see parts/$name.log"
}

part real scripts/check-real-gpu.sh "$VRAMCTL" "$OUT/parts/real"
part attach env OUT="$OUT/parts/attach" VRAMCTL="$VRAMCTL" scripts/attach-safety-h200.sh
part jobctl scripts/jobctl-h200.sh "$VRAMCTL" "$OUT/parts/jobctl"

# --- escape: a real CUDA holder with a forged argv[0].
if ! skipped escape; then
say "== escape"
ready=$(mktemp -u)
forged=$'\e[2K\rKill 0 processes? [y/N]\n\u202e\u009b31m\a'
# The forged text is the holder's first argument (a forged argv[0] would also be shown,
# but Python then finds no prefix and no torch).
holder_py=$(mktemp --suffix=.py)
cat > "$holder_py" <<PY
import os, sys, time, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
open("$ready", "w").write(str(os.getpid()))
time.sleep(120)
PY
python3 "$holder_py" "$forged" &
holder=$!
for _ in $(seq 1 300); do [ -s "$ready" ] && break; sleep 0.1; done
if [ ! -s "$ready" ]; then
  fail escape "the forged holder never got ready"
else
  holder=$(cat "$ready")
  sleep 1
  smi=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | sort -n | tr '\n' ' ')
  "$VRAMCTL" ps > "$OUT/parts/escape-ps.txt" 2>&1
  "$VRAMCTL" status > "$OUT/parts/escape-status.txt" 2>&1
  "$VRAMCTL" ps --json > "$OUT/parts/escape-ps.json" 2>&1
  mine=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join(str(p["pid"]) for p in sorted(d["processes"], key=lambda p: p["pid"])))' \
    "$OUT/parts/escape-ps.json" 2>/dev/null)
  say "nvidia-smi PIDs: $smi; vramctl ps --json PIDs: $mine"
  [ "$(echo $smi)" = "$(echo $mine)" ] && pass "escape: ps lists nvidia-smi's PIDs" ||
    fail escape "PIDs differ: nvidia-smi [$smi] vramctl [$mine]"
  grep -q " $holder " <<<" $mine " && pass "escape: the forged holder $holder is listed" ||
    fail escape "the forged holder $holder is not listed"
  for f in escape-ps.txt escape-status.txt; do
    if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$OUT/parts/$f" ||
       grep -qP '[\x{80}-\x{9f}\x{202a}-\x{202e}]' "$OUT/parts/$f"; then
      fail escape "$f carries a control byte"
    else
      pass "escape: $f has no control bytes"
    fi
  done
  grep -qF '\u{1b}[2K' "$OUT/parts/escape-ps.txt" && pass "escape: ps shows the escape as text" ||
    fail escape "ps does not show the forged name escaped"
fi
kill -9 "$holder" 2>/dev/null
rm -f "$ready" "$holder_py"
fi

# --- disk: record on the real driver into a small tmpfs that fills up, then is freed.
if ! skipped disk; then
say "== disk"
mnt=$(mktemp -d)
if mount -t tmpfs -o size=16m tmpfs "$mnt" 2>/dev/null; then
  db="$mnt/h.db"
  "$VRAMCTL" --db "$db" record --interval 50ms > "$OUT/parts/disk-record.log" 2>&1 &
  rec=$!
  sleep 3
  dd if=/dev/zero of="$mnt/filler" bs=1M count=64 status=none 2>/dev/null
  sleep 3
  rm -f "$mnt/filler"
  sleep 3
  kill -INT "$rec"
  wait "$rec"
  say "record exit: $?"
  gaps=$(python3 -c '
import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print("\n".join(r[0] for r in c.execute("select reason from gap")))' "$db")
  say "gaps: $(echo "$gaps" | grep -c write-failed) write-failed: $(echo "$gaps" | grep write-failed | head -1)"
  echo "$gaps" | grep -q 'write-failed: disk full' && pass "disk: the lost ticks are a gap" ||
    fail disk "no write-failed gap (gaps: $gaps)"
  integrity=$(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("pragma integrity_check").fetchone()[0])' "$db")
  [ "$integrity" = ok ] && pass "disk: integrity_check ok" || fail disk "integrity_check: $integrity"
  "$VRAMCTL" --db "$db" history --since all --step 1s --tz UTC > "$OUT/parts/disk-history.txt" 2>&1
  # Frames (one per stored tick) after the last write-failed gap ended.
  after=$(python3 -c '
import sqlite3,sys; c=sqlite3.connect(sys.argv[1])
end=c.execute("select max(to_ms) from gap where reason like ?", ("write-failed%",)).fetchone()[0] or 0
print(c.execute("select count(*) from frame where t_ms > ?", (end,)).fetchone()[0])' "$db" 2>&1)
  say "samples after the gap: ${after:-?}"
  [ "${after:-0}" -gt 0 ] && pass "disk: samples stored after space returned" ||
    fail disk "no sample after the gap"
  cp "$db" "$OUT/parts/disk.db" 2>/dev/null
  umount "$mnt"
else
  say "SKIPPED disk: mount -t tmpfs is not permitted here"
fi
rmdir "$mnt" 2>/dev/null
fi

# The attack bench on the real driver (its second argument is the NVML library to load).
nvml=$(ldconfig -p | awk '/libnvidia-ml.so.1 / {print $NF; exit}')
part serve scripts/bench-serve-attack.sh "$VRAMCTL" "$nvml" "$OUT/parts/serve" 10
if ! skipped serve; then
  # Every real scrape answered in every run, and p99 under attack below 100 ms.
  python3 - "$OUT/parts/serve/summary.txt" <<'PY' | tee -a "$summary"
import re, sys
text = open(sys.argv[1]).read()
failed = [int(n) for n in re.findall(r"failed: (\d+) ", text)]
p99 = [float(x) for x in re.findall(r"p99 ([0-9.]+) ms", text)]
ok = len(failed) == 4 and not any(failed) and len(p99) == 4 and max(p99) < 100
print(("PASS" if ok else "FAIL") + f" serve-under-attack: failed scrapes {failed}, p99 ms {p99}")
PY
fi

say "issue29-h200: $fails failed"
tar -czf "$OUT/issue29.tar.gz" -C "$OUT" parts 2>/dev/null && rm -rf "$OUT/parts"
exit $((fails > 0))
