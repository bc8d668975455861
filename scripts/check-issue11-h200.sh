#!/usr/bin/env bash
# The real-GPU checks of issue 11's repairs, each compared with nvidia-smi in the same run:
#
#   scripts/check-issue11-h200.sh path/to/vramctl OUTDIR
#
# 1. status/info against nvidia-smi and pynvml (scripts/check-real-gpu.sh) while a PyTorch
#    process holds 4 GiB; `status` at 80 columns and `--compact`; `ps`, `ps --user nosuch`.
# 2. serve answers before NVML's first tick: time to the first /healthz and /metrics answer
#    after start; then memory per GPU and per PID from /metrics against nvidia-smi.
# 3. A closed stderr does not stop the recorder: `record --interval 100ms 2>&1 | head -1`
#    for 5 s, then the frames in its history.
# 4. A reader that cannot write the history (another uid, a 0444 file in a 0555 directory)
#    reads root's recorder history while the recorder runs.
# Everything lands in OUTDIR/summary.txt (and the raw outputs beside it).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
V=$(realpath "$1"); out=$(realpath -m "$2")
mkdir -p "$out"
say() { echo "$*" | tee -a "$out/summary.txt"; }
: > "$out/summary.txt"

python3 - <<'PY' &
import time, torch
x = torch.ones(4 * 1024**3 // 4, device="cuda")
torch.cuda.synchronize()
open("/tmp/vramctl-i11.ready", "w").close()
time.sleep(300)
PY
holder=$!
trap 'kill $holder 2>/dev/null; rm -f /tmp/vramctl-i11.ready' EXIT
for _ in $(seq 1 600); do [ -e /tmp/vramctl-i11.ready ] && break; sleep 0.1; done

say "== 1. status, info, ps against nvidia-smi and pynvml"
"$here/check-real-gpu.sh" "$V" "$out/check" > "$out/check.txt" 2>&1
say "check-real-gpu rc=$? ($(tail -1 "$out/check.txt"))"
COLUMNS=80 "$V" status > "$out/status-80.txt" 2>&1
say "status at 80 columns: widest line $(python3 -c 'import sys; print(max(len(l.rstrip("\n")) for l in open(sys.argv[1], encoding="utf-8")))' "$out/status-80.txt") characters"
"$V" status --compact > "$out/status-compact.txt" 2>&1
cat "$out/status-compact.txt" >> "$out/summary.txt"
"$V" ps > "$out/ps.txt" 2>&1; say "ps rc=$?"; cat "$out/ps.txt" >> "$out/summary.txt"
"$V" ps --user nosuchuser > "$out/ps-nosuch.txt" 2>&1; say "ps --user nosuchuser rc=$? $(cat "$out/ps-nosuch.txt")"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >> "$out/summary.txt"

say "== 2. serve: first answers, then values against nvidia-smi"
t0=$(date +%s.%N)
"$V" serve --listen 127.0.0.1:19835 --interval 1s 2> "$out/serve.err" &
serve=$!
first_health=""; first_metrics=""
for _ in $(seq 1 400); do
  if [ -z "$first_health" ] && curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:19835/healthz > "$out/health-code.txt" 2>/dev/null; then
    first_health="$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }') s (HTTP $(cat "$out/health-code.txt"))"
  fi
  if [ -z "$first_metrics" ] && curl -sf http://127.0.0.1:19835/metrics > "$out/metrics-first.txt" 2>/dev/null; then
    first_metrics="$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }') s"
  fi
  [ -n "$first_health" ] && [ -n "$first_metrics" ] && break
  sleep 0.01
done
say "first /healthz answer after $first_health; first /metrics after $first_metrics"
say "first scrape: $(grep -E '^vramctl_nvml_up' "$out/metrics-first.txt")"
sleep 3
curl -sf http://127.0.0.1:19835/metrics > "$out/metrics.txt"
nvidia-smi --query-gpu=uuid,memory.total,memory.used,memory.free --format=csv,noheader,nounits > "$out/serve-smi-gpu.csv"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$out/serve-smi-apps.csv"
kill $serve; wait $serve 2>/dev/null
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import re, sys
out = sys.argv[1]
metrics = open(f"{out}/metrics.txt").read()
def gauge(name, **labels):
    for line in metrics.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None
MiB = 1024 * 1024
ok = True
for row in open(f"{out}/serve-smi-gpu.csv"):
    uuid, total, used, free = [x.strip() for x in row.split(",")]
    for name, smi in [("vramctl_device_memory_total_bytes", total), ("vramctl_device_memory_used_bytes", used), ("vramctl_device_memory_free_bytes", free)]:
        v = gauge(name, uuid=uuid)
        same = v is not None and abs(v / MiB - float(smi)) < 2
        ok &= same
        print(f"{name} {uuid}: vramctl {v and v / MiB:.1f} MiB, nvidia-smi {smi} MiB -> {'AGREE' if same else 'DIFFER'}")
for row in open(f"{out}/serve-smi-apps.csv"):
    pid, used = [x.strip() for x in row.split(",")]
    v = gauge("vramctl_process_memory_used_bytes", pid=pid)
    same = v is not None and abs(v / MiB - float(used)) < 2
    ok &= same
    print(f"process {pid}: vramctl {v and v / MiB:.1f} MiB, nvidia-smi {used} MiB -> {'AGREE' if same else 'DIFFER'}")
print("serve vs nvidia-smi:", "AGREE" if ok else "DIFFER")
PY

say "== 3. record with a closed stderr"
rm -f "$out"/closed.db*
( "$V" --db "$out/closed.db" record --interval 100ms --duration 5s 2>&1 | head -1 > "$out/closed-first-line.txt"
  echo "${PIPESTATUS[0]}" > "$out/closed-rc.txt" )
say "record 2>&1 | head -1: record's exit status $(cat "$out/closed-rc.txt"); first line: $(cat "$out/closed-first-line.txt")"
sleep 1
say "frames in its history: $("$V" --db "$out/closed.db" export --json 2>&1 | grep -c '"type":"frame"')"

say "== 4. another uid reads root's running recorder's history"
mkdir -p /tmp/i11-hist && chmod 755 /tmp/i11-hist
rm -f /tmp/i11-hist/h.db*
"$V" --db /tmp/i11-hist/h.db record --interval 200ms 2> "$out/rec4.err" &
rec=$!
sleep 3
cp "$V" /tmp/i11-hist/vramctl && chmod 755 /tmp/i11-hist/vramctl
if command -v setpriv >/dev/null 2>&1; then
  as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
else
  as_nobody() { su -s /bin/sh nobody -c "$(printf '%q ' "$@")"; }
fi
as_nobody /tmp/i11-hist/vramctl --db /tmp/i11-hist/h.db history --since all --step 1s > "$out/reader-running.txt" 2>&1
say "another uid, recorder running: rc=$? $(head -c 300 "$out/reader-running.txt" | head -3)"
kill $rec; wait $rec 2>/dev/null
chmod 444 /tmp/i11-hist/h.db; chmod 555 /tmp/i11-hist
as_nobody /tmp/i11-hist/vramctl --db /tmp/i11-hist/h.db leaks --since all > "$out/reader-0444.txt" 2>&1
say "another uid, 0444 file in a 0555 directory: rc=$? $(tail -1 "$out/reader-0444.txt")"
chmod 755 /tmp/i11-hist
