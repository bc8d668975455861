#!/usr/bin/env bash
# `vramctl reclaim --attach` for real: sys.remote_exec (PEP 768) into a Python 3.14 process
# that has no agent. Needs python3.14 on PATH (this project's CI has none) and a vramctl
# binary; torch is the real one when python3.14 can import it, else the stand-in of
# python/tests/fakes (no GPU needed for that one, but vramctl still reads NVML: on a machine
# without a driver, set VRAMCTL_NVML_LIB to target/debug/libfake_nvml.so and
# FAKE_NVML_SCENARIO to a scenario file).
#
#   scripts/attach-check.sh [VRAMCTL]        (default: target/debug/vramctl)
#
# Checks: a process holding 2 GiB of cache is reclaimed (status reclaimed, released ≥ 2 GiB,
# exit 0), the audit log has the record, and PYTHON_DISABLE_REMOTE_DEBUG=1 makes it
# not_attachable (exit 1). Prints the JSON and the time the attach took.
set -euo pipefail
cd "$(dirname "$0")/.."
VRAMCTL=${1:-target/debug/vramctl}
command -v python3.14 >/dev/null || { echo "attach-check: no python3.14 on PATH" >&2; exit 2; }
work=$(mktemp -d)
# The targets are started in command substitutions: their PIDs are kept in a file to end them.
trap 'kill $(cat "$work/pids" 2>/dev/null) 2>/dev/null || true; rm -rf "$work"' EXIT
if python3.14 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  pythonpath=""
else
  pythonpath="$PWD/python/tests/fakes/torch_pkg"
  echo "attach-check: using the stand-in torch"
fi
target() {  # target NAME [env VAR=...]
  local name=$1; shift
  PYTHONPATH="$pythonpath" "${@:-env}" python3.14 -c '
import time, torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); del x
print("ready", flush=True)
while True:
    time.sleep(0.05)   # returns to the interpreter 20 times a second: safe points
' > "$work/ready.$name" &
  echo $! | tee -a "$work/pids"
}
wait_ready() { for _ in $(seq 100); do [ -s "$work/ready.$1" ] && return; sleep 0.1; done; echo "target did not start" >&2; exit 2; }

pid=$(target plain); wait_ready plain
start=$(date +%s.%N)
set +e; "$VRAMCTL" reclaim --attach "$pid" --json --db "$work/h.db" > "$work/out.json"; code=$?; set -e
end=$(date +%s.%N)
cat "$work/out.json"; echo
echo "exit $code, $(python3 -c "print(round($end - $start, 3))") s"
python3 - "$work/out.json" "$code" <<'PY'
import json, sys
doc, code = json.load(open(sys.argv[1])), int(sys.argv[2])
p = doc["processes"][0]
assert code == 0, (code, p)
assert p["status"] == "reclaimed", p
assert p["released_bytes"] >= 2 << 30, p
print("attach: reclaimed", p["released_bytes"], "bytes; NVML returned", p["nvml_returned_bytes"])
PY
"$VRAMCTL" history --audit --db "$work/h.db" | tail -2

pid=$(target disabled env PYTHON_DISABLE_REMOTE_DEBUG=1); wait_ready disabled
set +e; "$VRAMCTL" reclaim --attach "$pid" --json --db "$work/h.db" > "$work/off.json"; code=$?; set -e
python3 - "$work/off.json" "$code" <<'PY'
import json, sys
doc, code = json.load(open(sys.argv[1])), int(sys.argv[2])
p = doc["processes"][0]
assert code == 1 and p["error"]["code"] == "remote_debug_disabled", (code, p)
print("disabled: not_attachable,", p["error"]["message"])
PY
echo "attach-check: ok"
