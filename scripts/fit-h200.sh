#!/usr/bin/env bash
# `vramctl fit` (model-based search) against an exhaustive bisection, on a real GPU (issue 15).
#
#   scripts/fit-h200.sh BINARY OUTDIR [CASES]        (run from anywhere; cd's to the repo root)
#
# For each case (default: gpt2 llama llama-ckpt resnet; or $FIT_CASES; or the 3rd argument)
# it runs, each trial a fresh python3 scripts/fit/train.py process:
#   1. BINARY fit --strategy bisect --range R --tolerance 0 --margin 0 --json -- ... --batch {}
#      the exhaustive bisection: the true largest batch, the baseline;
#   2. BINARY fit --range R --margin 0 --json -- ... --batch {}
#      the model-based search (default tolerance 2 %);
# with R = $FIT_RANGE (default 1..4096). It measures the largest batch each finds, its trials
# and the wall time of each whole search (date +%s.%N around it, beside the JSON's own wall_s).
#
# Writes to OUTDIR: <case>-bisect.json, <case>-fit.json (vramctl's --json, verbatim),
# <case>-{bisect,fit}.log (its stderr), wall.tsv (case, search, exit status, seconds; appended),
# failures.log (searches that exited non-zero), env.txt (GPU, driver, library versions) and
# summary.md (scripts/fit/summarize.py: case, answers, trials, times, within 2 %?, time ratio,
# then every trial). summary.md covers every case in OUTDIR, so the cases can be run in
# separate calls into one OUTDIR (one call is limited to 10 minutes on the device machine).
# With FIT_RUN_CHECK=1 it also runs
#   BINARY run --json --report OUTDIR/run-gpt2.json -- python3 scripts/fit/train.py --model gpt2 --batch 8
# (its stdout, with train.py's peak_allocated/peak_reserved, in run-gpt2.stdout) so summary.md
# puts run's peaks beside PyTorch's own.
#
# A case that fails is logged and the next one runs. Each search is capped by FIT_TIMEOUT_S
# (default 540 s). Nothing here changes a GPU setting: it only runs workloads and reads nvidia-smi.
#
# Issue 34's held-out check of the trace predictor (about 6-8 minutes of GPU time):
#
#   scripts/fit-h200.sh check BINARY OUTDIR [CASES]   (default: resnet llama llama-ckpt gpt2-seq)
#
# For each case it runs `fit` (defaults: the trace predictor) and takes the truth from, in
# order: a bisection (`--strategy bisect --tolerance 0`) when FIT_BISECT=1 or when the recorded
# truth does not apply; else the truth recorded on the H200 in testdata/h200/fit/ for the same
# job (resnet 3296 by bisection; llama 22 from fit's 22 ok / 23 OOM; llama-ckpt 94 ok / 96 OOM,
# settled here by one trial at 95), which applies only when nvidia-smi reports the recorded
# 143771 MiB and torch is 2.11 (OUTDIR/reuse.txt says yes or why not). gpt2-seq (GPT-2, eager
# attention, batch 4, a sequence-length search in units of 64 tokens over 8..1024, 512 to 65,536 tokens) has no
# recorded truth: its bisection always runs. Then scripts/fit/check34.py prints PASS/FAIL per
# case for trials <= 4, within 2 %, never above, time <= 0.40 x bisection, trace predictor used.
# Cases can be run in separate calls into one OUTDIR; check34.py judges the cases given.
# convnext (torchvision convnext_tiny) and vit (vit_b_16), batch size over 1..4096, bf16
# autocast, are the held-out cases of the allocated-bound stop rule (ResNet-50 of 2026-12-05
# tuned it, docs/fit.md): no recorded truth, so each bisects first (~14 trials) then fits;
# about 4-6 minutes a case on an H200 or H100: one case per call.
# neox, neox-ckpt (a Pythia-410M-shaped GPT-NeoX batch size, without and with gradient
# checkpointing) and qwen2-seq (a Qwen2-0.5B-shaped model's sequence length at batch 2, in
# units of 256 tokens over 1..512, i.e. 256 to 131,072 tokens) are held out for fit as it
# stands on 2026-12-06 (chosen before any of them ran): bisected first, one case per call.
# Where the recorded truths do not apply (an H100, another torch) each case bisects first:
# about 14 trials of 11-25 s, so 4-8 minutes a case with its `fit`, 15-20 minutes for the
# three: run one case per device call there (check-round3-h200.sh's fit34 parts do).
#
#   scripts/fit-h200.sh reuse       prints `yes` (exit 0) when the recorded truths apply here,
#                                   else `no: why` (exit 1); needs no binary
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

# Whether the truths recorded on the H200 apply to this machine: the same GPU memory and
# torch, and no FIT_BISECT=1. Prints `yes` or `no: why`.
reuse_verdict() {
  local total torch_version
  total="$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null | tr -d ' ')"
  torch_version="$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"
  if [ "$total" = 143771 ] && [ "${torch_version#2.11}" != "$torch_version" ] && [ "${FIT_BISECT:-0}" != 1 ]; then
    echo yes
  else
    echo "no: GPU memory.total '$total' MiB, torch '$torch_version', FIT_BISECT=${FIT_BISECT:-0} (recorded: 143771, 2.11, 0)"
  fi
}

if [ "${1:-}" = reuse ]; then
  verdict="$(reuse_verdict)"
  echo "$verdict"
  [ "$verdict" = yes ]
  exit
fi
mode=search
if [ "${1:-}" = check ]; then
  mode=check
  shift
fi
bin="$(realpath "${1:?usage: fit-h200.sh BINARY OUTDIR [CASES]}")"
out="$(realpath -m "${2:?usage: fit-h200.sh BINARY OUTDIR [CASES]}")"
if [ "$mode" = check ]; then
  cases="${3:-${FIT_CASES:-resnet llama llama-ckpt gpt2-seq}}"
else
  cases="${3:-${FIT_CASES:-gpt2 llama llama-ckpt resnet}}"
fi
range="${FIT_RANGE:-1..4096}"
timeout_s="${FIT_TIMEOUT_S:-540}"
mkdir -p "$out"
cd "$here/.."
export PYTHONDONTWRITEBYTECODE=1
[ -s "$out/wall.tsv" ] || printf 'case\tsearch\texit\twall_s\n' > "$out/wall.tsv"

if [ ! -s "$out/env.txt" ]; then
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import sys, torch, torchvision, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "torchvision", torchvision.__version__, "transformers", transformers.__version__)'
    "$bin" --version
  } > "$out/env.txt" 2>&1
fi

# The trial's arguments, with the value's placeholder.
train_args() {
  case "$1" in
    gpt2) echo "--model gpt2 --batch {}" ;;
    llama) echo "--model llama --batch {}" ;;
    llama-ckpt) echo "--model llama --checkpointing --batch {}" ;;
    resnet) echo "--model resnet --batch {}" ;;
    convnext) echo "--model convnext --batch {}" ;;
    vit) echo "--model vit --batch {}" ;;
    efficientnet) echo "--model efficientnet --batch {}" ;;
    swin) echo "--model swin --batch {}" ;;
    gpt2-seq) echo "--model gpt2 --attn eager --batch 4 --seq-unit 64 --seq {}" ;;
    neox) echo "--model neox --batch {}" ;;
    neox-ckpt) echo "--model neox --checkpointing --batch {}" ;;
    qwen2-seq) echo "--model qwen2 --batch 2 --seq-unit 256 --seq {}" ;;
    *) return 1 ;;
  esac
}

case_range() {
  case "$1" in
    gpt2-seq) echo "8..1024" ;;
    qwen2-seq) echo "1..512" ;;
    *) echo "$range" ;;
  esac
}

# search CASE NAME FIT-OPTIONS... : one whole `vramctl fit`, timed, its JSON and stderr kept.
search() {
  local c="$1" name="$2"; shift 2
  local args t0 t1 rc
  args="$(train_args "$c")"
  echo "== $c $name: $bin fit $* --json -- python3 scripts/fit/train.py $args" >&2
  t0="$(date +%s.%N)"
  # shellcheck disable=SC2086  # $args is a list of words on purpose
  set -f  # the {} in $args is not a glob
  timeout -k 10 "$timeout_s" "$bin" fit "$@" --json -- python3 scripts/fit/train.py $args \
    > "$out/$c-$name.json" 2> "$out/$c-$name.log"
  rc=$?
  set +f
  t1="$(date +%s.%N)"
  local wall; wall="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')"
  printf '%s\t%s\t%s\t%s\n' "$c" "$name" "$rc" "$wall" >> "$out/wall.tsv"
  echo "   exit $rc after ${wall} s" >&2
  if [ "$rc" -ne 0 ]; then
    local why=""
    case "$rc" in 124 | 137) why=" (stopped at FIT_TIMEOUT_S=${timeout_s} s)" ;; esac
    echo "$(date -Is) $c $name: exit $rc after ${wall} s$why; tail of $c-$name.log:" >> "$out/failures.log"
    tail -n 20 "$out/$c-$name.log" >> "$out/failures.log"
  fi
}

if [ "$mode" = check ]; then
  reuse_verdict > "$out/reuse.txt"
  echo "reuse the recorded truths: $(cat "$out/reuse.txt")" >&2
  for c in $cases; do
    if ! train_args "$c" > /dev/null; then
      echo "$(date -Is) unknown case '$c' (resnet, llama, llama-ckpt, gpt2-seq, gpt2, convnext, vit, efficientnet, swin, neox, neox-ckpt, qwen2-seq): skipped" | tee -a "$out/failures.log" >&2
      continue
    fi
    r="$(case_range "$c")"
    if [ "$(cat "$out/reuse.txt")" != yes ] || ! { [ "$c" = resnet ] || [ "$c" = llama ] || [ "$c" = llama-ckpt ]; }; then
      search "$c" bisect --strategy bisect --range "$r" --tolerance 0 --margin 0
    elif [ "$c" = llama-ckpt ] && [ ! -s "$out/llama-ckpt-settle.txt" ]; then
      # The recorded 94 ok / 96 OOM leaves 95 open: one trial settles it.
      echo "== llama-ckpt: one trial at 95 to settle the recorded 94 ok / 96 OOM" >&2
      timeout -k 10 "$timeout_s" python3 scripts/fit/train.py --model llama --checkpointing --batch 95 \
        > "$out/llama-ckpt-settle.log" 2>&1
      rc=$?
      if [ "$rc" -eq 0 ]; then
        echo ok > "$out/llama-ckpt-settle.txt"
      elif grep -qi 'out of memory' "$out/llama-ckpt-settle.log"; then
        echo oom > "$out/llama-ckpt-settle.txt"
      else
        echo "$(date -Is) llama-ckpt settle trial: exit $rc, not an OOM (see llama-ckpt-settle.log)" >> "$out/failures.log"
      fi
    fi
    search "$c" fit --range "$r" --margin 0
  done
  python3 scripts/fit/check34.py "$out" $cases | tee "$out/check34.txt"
  exit "${PIPESTATUS[0]}"
fi

for c in $cases; do
  if ! train_args "$c" > /dev/null; then
    echo "$(date -Is) unknown case '$c' (gpt2, llama, llama-ckpt, resnet): skipped" | tee -a "$out/failures.log" >&2
    continue
  fi
  search "$c" bisect --strategy bisect --range "$range" --tolerance 0 --margin 0
  search "$c" fit --range "$range" --margin 0
done

if [ "${FIT_RUN_CHECK:-0}" = 1 ]; then
  echo "== run check: $bin run --json --report $out/run-gpt2.json -- python3 scripts/fit/train.py --model gpt2 --batch 8" >&2
  timeout -k 10 "$timeout_s" "$bin" run --json --report "$out/run-gpt2.json" -- \
    python3 scripts/fit/train.py --model gpt2 --batch 8 > "$out/run-gpt2.stdout" 2> "$out/run-gpt2.log"
  rc=$?
  echo "   exit $rc" >&2
  [ "$rc" -eq 0 ] || echo "$(date -Is) run check: exit $rc (see run-gpt2.log)" >> "$out/failures.log"
fi

python3 scripts/fit/summarize.py fit "$out" || echo "$(date -Is) summarize.py failed" >> "$out/failures.log"
cat "$out/summary.md" 2>/dev/null | sed -n '1,20p'
