#!/usr/bin/env bash
# Issue 34, round 4: the estimate's two fixes on a real GPU (docs/estimate.md, "Round 4").
#
#   OUT=DIR [VRAMCTL=.dist/vramctl] [ROUND=4|5|5-train|5-infer|6|7|8|9|4-inverse] scripts/estimate34b-h200.sh
#
# ROUND picks the cases (default 4: cases.ROUND4; 5: cases.ROUND5, held back on 2026-12-05,
# and its two halves ROUND5_TRAIN, ROUND5_INFER) and the inverse questions of that round;
# 6: cases.ROUND6, three OPT jobs held back for the ReLU count; 7: cases.ROUND7, five
# GPT-NeoX jobs held back for a program of its own; 8: cases.ROUND8, six generation jobs
# (five GPT-NeoX, Phi-2) held back for GPT-NeoX's generation program; 9: cases.ROUND9, six
# generation jobs held back for generation's per-token epilogue; 4-inverse runs round 4's
# inverse questions alone (no case).
#
# 1. The cases of scripts/estimate/cases.py's ROUND4 (2 tuning, 12 held back, all committed
#    before anything of them was measured), through scripts/estimate-h200.sh (each a fresh
#    process under `vramctl run`, NVML's per-process peak sampled every 20 ms, torch's
#    max_memory_reserved on the case's line): one PASS/FAIL line per case, within 10 % of
#    NVML's peak (the goal is 5 %, said on the line), and torch's reserved beside the
#    estimate less its CUDA context term.
# 2. The inverse question, run for real: `estimate --gpu SIZE` names the most concurrent
#    sequences for GPT-2 fp32 (24 GiB: estimate34's job, which chose the fix) and TinyLlama
#    bf16 (16 GiB, held back); each answer is generated in a fresh process whose allocator
#    may use SIZE less the estimate's CUDA context term (set_per_process_memory_fraction):
#    PASS when it does not run out of memory; the answer + 10 % is tried too and reported
#    (how much the 5 % kept for the model's error costs).
# About 4-6 minutes of GPU time on an H200 (cases 4 at once). Nothing changes a GPU setting.
#
# On a smaller GPU (an H100 80GB: 81559 MiB against the H200's 143771) the cases are packed
# within the same share of its memory (120 GB of the H200's 150.7 GB, so 68 GB on an H100);
# a case whose estimate is above the GPU's whole memory is not run (runner.py prints
# `skip CASE: needs N GiB, this GPU has M`), and one that runs out of memory where its
# estimate + 10 % (the pass band) is above the GPU's memory cannot be judged there either:
# both are counted as not run (a `skip` line each), never as a pass. The cases, committed
# before any was measured, stay as they are.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
VRAMCTL="${VRAMCTL:-.dist/vramctl}"
: "${OUT:?set OUT to a directory for the results}"
mkdir -p "$OUT"
export PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
ROUND="${ROUND:-4}"
case "$ROUND" in
  4) list=ROUND4 ;; 5) list=ROUND5 ;; 5-train) list=ROUND5_TRAIN ;; 5-infer) list=ROUND5_INFER ;;
  6) list=ROUND6 ;; 7) list=ROUND7 ;; 8) list=ROUND8 ;; 9) list=ROUND9 ;; 4-inverse) list=NONE ;;
  *) echo "ROUND must be 4, 5, 5-train, 5-infer, 6, 7, 8, 9 or 4-inverse, not '$ROUND'" >&2; exit 2 ;;
esac
export ROUND_LIST="$list" ROUND
names=$(python3 -c "import sys; sys.path.insert(0, 'scripts/estimate'); import cases; print(' '.join(getattr(cases, '$list', [])))")
total_mib=$(nvidia-smi -i 0 --query-gpu=memory.total --format=csv,noheader,nounits 2> /dev/null | head -1 | tr -d ' ')
case "$total_mib" in '' | *[!0-9]*) total_mib=143771 ;; esac   # no answer: the H200's figures
# 120 GB of estimates at once on the H200 (143771 MiB), the same share elsewhere.
budget=$(awk -v m="$total_mib" 'BEGIN { printf "%.0f", 120 * m / 143771 }')
echo "GPU 0: $total_mib MiB; estimates summed within $budget GB"
rc_cases=0
if [ -n "$names" ]; then
# shellcheck disable=SC2086
timeout 300 scripts/estimate-h200.sh -j 4 --budget-gb "$budget" "$VRAMCTL" "$OUT/cases" $names \
  > "$OUT/cases.log" 2>&1
echo "cases: exit $? (log $OUT/cases.log)"
python3 - "$VRAMCTL" "$OUT" "$total_mib" <<'PY'
import json, os, statistics, subprocess, sys
sys.path.insert(0, "scripts/estimate")
import cases
ROUND_CASES = getattr(cases, os.environ["ROUND_LIST"], [])
vramctl, out, total = sys.argv[1], sys.argv[2], int(sys.argv[3]) << 20
rows = {}
try:
    for line in open(f"{out}/cases/truth-raw.jsonl"):
        r = json.loads(line)
        rows[r["case"]] = r
except OSError:
    pass
bad = 0
not_run = 0
errors = []
GiB = 1 << 30
for name in ROUND_CASES:
    c = cases.BY_NAME[name]
    e = json.loads(subprocess.run([vramctl, "estimate", *cases.estimate_args(c), "--json"],
                                  capture_output=True, text=True, check=True).stdout)
    est = e["total_bytes"]
    context = next((t["bytes"] for t in e["terms"] if t["name"] == "CUDA context"), 0)
    r = rows.get(name)
    if r and r.get("skipped"):
        # runner.py's: the estimate is above the GPU's whole memory.
        print(f"{r['skipped']} ({c['set']}; not run)")
        not_run += 1
        continue
    oom = r and r.get("exit_code") != 0 and (r.get("oom") or "OutOfMemoryError" in (r.get("stderr_tail") or ""))
    if oom and est * 1.10 > total:
        # Out of memory on a GPU smaller than what the pass band allows: the truth may be
        # within 10 % of the estimate and still not fit here, so this says nothing of it.
        print(f"skip {name}: needs up to {est * 1.10 / GiB:.1f} GiB (estimate + 10 %), this GPU has "
              f"{total / GiB:.1f}: it ran out of memory here ({c['set']}; not run)")
        not_run += 1
        continue
    if not r or r.get("exit_code") != 0 or not r.get("nvml_peak_bytes"):
        print(f"FAIL {name} ({c['set']}): not measured ({r and r.get('exit_code')})")
        bad += 1
        continue
    nvml = r["nvml_peak_bytes"]
    err = (est - nvml) / nvml * 100
    reserved = (r.get("torch") or {}).get("peak_reserved_bytes")
    rerr = f"{((est - context) - reserved) / reserved * 100:+.1f} %" if reserved else "?"
    ok = abs(err) <= 10
    bad += not ok
    errors.append((c["set"], abs(err)))
    goal = "within the 5 % goal" if abs(err) <= 5 else "outside the 5 % goal"
    print(f"{'PASS' if ok else 'FAIL'} {name} ({c['set']}): estimate {est / 2**30:.2f} GiB, "
          f"NVML {nvml / 2**30:.2f} GiB, {err:+.1f} % ({goal}); reserved vs estimate less context {rerr}")
for set_ in ("tuning", "held_back"):
    e = sorted(x for s_, x in errors if s_ == set_)
    if e:
        print(f"SUMMARY {set_}: {len(e)} measured, {sum(x <= 10 for x in e)} within 10 %, "
              f"{sum(x <= 5 for x in e)} within 5 %, median |error| {statistics.median(e):.1f} %, max {e[-1]:.1f} %")
if not_run:
    print(f"SUMMARY not run: {not_run} of {len(ROUND_CASES)} case(s) too large for this GPU "
          f"({total / GiB:.1f} GiB): neither passed nor failed; an H200 runs them")
sys.exit(1 if bad else 0)
PY
rc_cases=$?
fi
python3 - "$VRAMCTL" "$OUT" <<'PY'
import json, os, subprocess, sys
vramctl, out = sys.argv[1], sys.argv[2]
JOB = r'''
import sys, torch, transformers
config, dtype, batch, seq, gen, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
free, total = torch.cuda.mem_get_info()
torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total))
cfg = transformers.AutoConfig.from_pretrained(config)
dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
with torch.device("cuda"):
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dt).eval()
ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
try:
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=gen,
                       min_new_tokens=gen, do_sample=False, pad_token_id=0)
    print("RAN", torch.cuda.max_memory_reserved())
except torch.OutOfMemoryError:
    print("OOM", torch.cuda.max_memory_reserved())
'''
bad = 0
INVERSE = {
    "4": [("testdata/model/configs/gpt2.json", "fp32", 960, 64, 24, "tuning"),
          ("testdata/model/configs/tinyllama-1.1b.json", "bf16", 1024, 256, 16, "held back")],
    # Round 5's, held back on 2026-12-05 with its cases: a 7B with GQA and a plain-MLP 1B.
    "5": [("testdata/model/configs/llama-3-8b.json", "bf16", 1024, 256, 40, "held back"),
          ("testdata/model/configs/pythia-1b.json", "bf16", 512, 128, 12, "held back")],
}
INVERSE["5-infer"] = INVERSE["5"]
INVERSE["4-inverse"] = INVERSE["4"]
for config, dtype, seq, gen, gib, set_ in INVERSE.get(os.environ["ROUND"], []):
    cap = gib << 30
    e = json.loads(subprocess.run([vramctl, "estimate", config, "--infer", "--batch", "1", "--seq", str(seq),
                                   "--gen", str(gen), "--precision", dtype, "--gpu", f"{cap}B", "--json"],
                                  capture_output=True, text=True).stdout)
    g = e["gpu"]
    n = g["largest_batch"]
    context = next((t["bytes"] for t in e["terms"] if t["name"] == "CUDA context"), 0)
    limit = cap - context
    def run(b):
        p = subprocess.run([sys.executable, "-c", JOB, config, dtype, str(b), str(seq), str(gen), str(limit)],
                           capture_output=True, text=True, timeout=240)
        last = (p.stdout.strip().splitlines() or ["ERROR " + p.stderr.strip()[-200:]])[-1]
        return last
    at_n = run(n)
    more = n + max(1, n // 10)
    at_more = run(more)
    ok = at_n.startswith("RAN")
    bad += not ok
    print(f"{'PASS' if ok else 'FAIL'} inverse {config.split('/')[-1]} {dtype} {gib} GiB ({set_}): most concurrent "
          f"sequences answered {n} (margin {g['largest_batch_margin_bytes'] / 2**30:.2f} GiB, of which "
          f"{g['safety_margin_bytes'] / 2**30:.2f} kept for the model's error); at {n}: {at_n}; at {more}: {at_more}")
sys.exit(1 if bad else 0)
PY
rc_inverse=$?
[ "$rc_cases" = 0 ] && [ "$rc_inverse" = 0 ]
