#!/usr/bin/env bash
# The `vramctl estimate` truth set on a real GPU (issue 16).
#
#   scripts/estimate-h200.sh BINARY OUTDIR [CASE...]      (default: every case of cases.py)
#
# Each case is a fresh `python3 scripts/estimate/truth.py CASE` under
#   BINARY run --json --report R --interval 20ms -- python3 ...
# so NVML's per-process peak is sampled every 20 ms (the tree's bytes as nvidia-smi counts
# them) beside torch's own max_memory_allocated/reserved (the script's stdout line; the
# agent's exit report in R as well). Appends one JSON line per case to OUTDIR/truth-raw.jsonl
# ({"case", "nvml_peak_bytes", "exit_code", "run": {...run's device 0...}, "torch": {...}}),
# writes OUTDIR/env.txt (GPU, driver, versions, and accelerate's own estimate figures when
# accelerate is installed: scripts/estimate/accelerate_figures.py) and OUTDIR/failures.log.
# Nothing here changes a GPU setting.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(realpath "${1:?usage: estimate-h200.sh BINARY OUTDIR [CASE...]}")"
out="$(realpath -m "${2:?usage: estimate-h200.sh BINARY OUTDIR [CASE...]}")"
shift 2
cd "$here/.."
mkdir -p "$out/runs"
export PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
  mapfile -t cases < <(python3 -c 'import sys; sys.path.insert(0, "scripts/estimate"); from cases import CASES; print("\n".join(c["name"] for c in CASES))')
fi
if [ ! -s "$out/env.txt" ]; then
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvidia-smi | sed -n 3p
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
    python3 -c 'import peft; print("peft", peft.__version__)' 2>&1 | tail -1
    python3 -c 'import accelerate; print("accelerate", accelerate.__version__)' 2>&1 | tail -1
    python3 -c 'import bitsandbytes; print("bitsandbytes", bitsandbytes.__version__)' 2>&1 | tail -1
    python3 scripts/estimate/accelerate_figures.py 2>&1 | tail -40
  } > "$out/env.txt"
fi
for c in "${cases[@]}"; do
  t0=$(date +%s.%N)
  "$bin" run --json --report "$out/runs/$c.json" --interval 20ms -- \
    python3 scripts/estimate/truth.py "$c" > "$out/runs/$c.out" 2> "$out/runs/$c.err"
  rc=$?
  t1=$(date +%s.%N)
  python3 - "$c" "$rc" "$out" "$t0" "$t1" >> "$out/truth-raw.jsonl" <<'PY'
import json, sys
case, rc, out, t0, t1 = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
rec = {"case": case, "exit_code": rc, "wall_s": round(t1 - t0, 2)}
try:
    run = json.load(open(f"{out}/runs/{case}.json"))
    dev = run["devices"][0] if run.get("devices") else {}
    rec["nvml_peak_bytes"] = dev.get("peak_bytes")
    rec["run_device"] = dev
    rec["oom"] = run.get("oom")
except Exception as e:  # a failed case still gets its line
    rec["run_error"] = repr(e)
lines = [l for l in open(f"{out}/runs/{case}.out").read().splitlines() if l.startswith("{")]
rec["torch"] = json.loads(lines[-1]) if lines else None
if not lines:
    rec["stderr_tail"] = open(f"{out}/runs/{case}.err").read()[-1500:]
print(json.dumps(rec))
PY
  if [ "$rc" -ne 0 ]; then echo "$c exit $rc" >> "$out/failures.log"; tail -5 "$out/runs/$c.err" >> "$out/failures.log"; fi
  awk -v c="$c" -v rc="$rc" -v a="$t0" -v b="$t1" 'BEGIN { printf "%s rc=%s %.1f s\n", c, rc, b - a }' >&2
done
