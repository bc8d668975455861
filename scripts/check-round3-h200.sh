#!/usr/bin/env bash
# Round 3's checks on a real H200, in as few device calls as the 30-minute budget allows.
# Each part compares with nvidia-smi, pynvml or PyTorch's own counters in the same run and
# prints PASS/FAIL lines; the whole is summed up in $OUT/summary.txt, each part's output in
# $OUT/parts/NAME.log (and its files under $OUT/parts/NAME/).
#
#   OUT=/some/dir scripts/check-round3-h200.sh     (binary: $VRAMCTL or .dist/vramctl)
#   SKIP="oom-kinds leakset" ...                   parts not to run (a second call)
#   ONLY="pidns31 inside31" ...                    the only parts to run (safer in a device call)
#
# Parts (issue: what it settles):
#   real        scripts/check-real-gpu.sh: status/info against nvidia-smi and pynvml (no
#               regression from round 3's changes)
#   bench30     scripts/bench-status-vs-smi-h200.sh: status vs nvidia-smi --query-gpu, ps vs
#               status with a GPU process, both through a recorder (issue 30's figures)
#   exit30      scripts/nvml-exit-probe.py: what a one-shot NVML program's exit costs, with and
#               without nvmlShutdown and the libraries' destructors (issue 30, ~30 s)
#   nvml30      scripts/nvml-parallel-probe.py: whether the driver answers status's slow NVML
#               queries (utilization, power, MIG mode, process lists) faster at once than one
#               after another, with pynvml, warm and (since its first run) as first calls in
#               fresh processes (issue 30's next lever; ~20 s)
#   pidns31     a PyTorch holder in its own PID namespace (unshare): ps on the host names it
#               with the PID nvidia-smi gives, its user and command; --by user sums it (issue 31)
#   inside31    scripts/inside-namespace-h200.sh: ps inside a PyTorch holder's PID namespace
#               through a host record daemon: its namespace PID, nvidia-smi's bytes, the
#               outer holder only as "others"; without the daemon `driver_numbered` where NVML
#               numbers PIDs in the caller's namespace (driver 580), else cannot_map (issue 31)
#   oom-kinds   scripts/oom-kinds-h200.sh: the eight OOM kinds, each fix re-run (issue 33)
#   oom-live    scripts/oom-live-h200.sh: the agent's observer, run's verdict, its delay and
#               cost (issue 33), where the script exists
#   oom-top     scripts/oom-top-h200.sh: a running process's OOM in ps --json and serve's
#               /api/now within 15 s, the cause vramctl snapshot gives on the kept file (issue 33)
#   estimate34  estimate --gpu's inverse answers against a real generation job: the most
#               concurrent sequences it says fit do, one more is reported not to (issue 34)
#   estimate34b scripts/estimate34b-h200.sh: round 4's 14 cases (2 tuning, 12 held back before
#               any was measured) against NVML's per-process peak, and two --gpu answers run
#               for real (issue 34, ~5 min)
#   est5train   the same script with ROUND=5-train: round 5's 8 training cases, held back on
#               2026-12-05 before any was measured (issue 34, ~3 min)
#   est5infer   ROUND=5-infer: round 5's 6 generation cases and two --gpu answers, held back
#               the same day (issue 34, ~3 min)
#   census34    truth.py's census (TRUTH_PHASES=1) of round 5's Pythia and OPT training rows:
#               what autograd saves per module, to read (issue 34, ~1.5 min)
#   est6        ROUND=6: three OPT training jobs held back for the ReLU count (issue 34, ~1 min)
#   est7        ROUND=7: five GPT-NeoX jobs held back for a program of its own (issue 34, ~2 min)
#   est8        ROUND=8: six generation jobs (five GPT-NeoX, Phi-2) held back for GPT-NeoX's
#               generation program (issue 34, ~2 min)
#   est9        ROUND=9: six generation jobs held back for generation's per-token epilogue
#               (issue 34, ~2 min)
#   inv4        ROUND=4-inverse: round 4's two --gpu answers run for real, no case (~1 min)
#   families34  scripts/estimate-families-h200.sh: the families estimate reads since issue 34
#               (gpt_neox, opt, falcon, phi, starcoder2, olmo, olmo2, gemma3_text,
#               deepseek_v2/v3, llama4_text) built from their configs: parameters and KV cache
#               bytes exact against transformers, a training step's peak as a figure
#   web32       serve on the real driver with a PyTorch holder: /api/now's memory and PIDs
#               against nvidia-smi in the same moment, SSE ticks arrive (issue 32)
#   leak35      scripts/leak35-agent-h200.sh: leaks --watch judges a leak inside a reserved cache
#               on the agent's live tensors and names its allocation site (--where); a growing
#               cache over flat tensors is no leak; against the jobs' own torch counters
#               (issue 35 item 5, ~2.5 min)
#   fit34       scripts/fit-h200.sh check: fit's trace predictor on ResNet-50 and a 1.1B Llama
#               with and without checkpointing (recorded truths where the machine matches);
#               ~6 min: run it in a call of its own (issue 34). Elsewhere (an H100) each case
#               is bisected for its truth: three parts, fit34 (resnet), fit34llama (llama)
#               and fit34ckpt (llama-ckpt), ~4-8 min each, each in a call of its own
#   fit34seq    the same for GPT-2's sequence length (eager attention), bisected for the truth,
#               then scripts/fit/check34.py over all four (~3 min)
#   fit34cnx    fit's allocated-bound stop rule on a held-out CNN (torchvision convnext_tiny
#               batch size, bf16 autocast): bisected for its truth, then fit, judged by
#               check34.py (trials <= 4, within 2 %, never above, <= 0.40 x bisection's
#               time); ~4-6 min, a call of its own
#   fit34vit    the same for a ViT (torchvision vit_b_16), held out too (~4-6 min)
#   fit34eff    the same for torchvision efficientnet_b0, held out for the change made after
#               convnext and vit missed (chosen before it; ~4-6 min)
#   fit34swin   the same for torchvision swin_t (~4-6 min)
#   fit34neox   the same for a Pythia-410M-shaped GPT-NeoX batch size, held out for fit as it
#               stands on 2026-12-06 (~4-6 min); fit34neoxckpt with gradient checkpointing;
#               fit34qseq a Qwen2-0.5B-shaped model's sequence length (batch 2, 256-token units)
#   leakset     scripts/record-leakset-h200.sh for 300 s, then evaluate_leakset on it
#               (issue 35's re-score; long: run it in a call of its own). On a smaller GPU
#               than the H200 the set's sizes scale (0.314 on an H100: the script says why)
set -uo pipefail
cd "$(dirname "$0")/.."
VRAMCTL=$(readlink -f "${VRAMCTL:-.dist/vramctl}")
export VRAMCTL
OUT=${OUT:?set OUT}
. scripts/lib-check-parts.sh

say "vramctl: $("$VRAMCTL" --version 2>&1 | head -1)"
say "driver: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
say "torch: $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1 | tail -1)"

part real scripts/check-real-gpu.sh "$VRAMCTL" "$OUT/parts/real"
part bench30 scripts/bench-status-vs-smi-h200.sh "$VRAMCTL" "$OUT/parts/bench30" 21
part nvml30 python3 scripts/nvml-parallel-probe.py 101
part exit30 python3 scripts/nvml-exit-probe.py 21

# --- pidns31: a holder in its own PID namespace, seen from the host.
pidns31() {
  local dir=$OUT/parts/pidns31 ready
  ready=$(mktemp -u)
  unshare --pid --fork --mount-proc python3 -c "
import time, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()
open('$ready', 'w').close(); time.sleep(120)" &
  local outer=$!
  for _ in $(seq 300); do [ -e "$ready" ] && break; sleep 0.1; done
  [ -e "$ready" ] || { echo "FAIL the namespaced holder never got its memory"; kill $outer; return 1; }
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$dir/smi.csv"
  "$VRAMCTL" ps --json > "$dir/ps.json"
  "$VRAMCTL" ps --by user --json > "$dir/by-user.json"
  python3 - "$dir" <<'EOF'
import json, sys
d = sys.argv[1]
smi = {int(l.split(",")[0]): int(l.split(",")[1]) for l in open(f"{d}/smi.csv") if l.strip()}
ps = json.load(open(f"{d}/ps.json"))
rows = ps.get("processes", ps) if isinstance(ps, dict) else ps
seen = {int(p["pid"]): p for p in rows if "pid" in p}
bad = 0
for pid, mib in smi.items():
    p = seen.get(pid)
    if p is None:
        print(f"FAIL nvidia-smi's PID {pid} is not in ps"); bad += 1; continue
    cmd = p.get("command") or ""
    print(f"ok PID {pid}: nvidia-smi {mib} MiB, ps user={p.get('user')} command={cmd[:60]!r}")
    if "python3" in cmd and not p.get("user"):
        print(f"FAIL PID {pid} has no user"); bad += 1
print("PASS namespaced holder named on the host" if bad == 0 else f"FAIL {bad} mismatches")
sys.exit(1 if bad else 0)
EOF
  local rc=$?
  # SIGKILL to the namespace's init (the holder) ends the namespace; a SIGTERM to unshare
  # left the holder sleeping out its 120 s on the first GPU run (the part took 125 s).
  local child
  for child in $(cat /proc/"$outer"/task/*/children 2> /dev/null); do kill -KILL "$child"; done
  kill -KILL "$outer" 2> /dev/null
  wait "$outer" 2> /dev/null
  rm -f "$ready"
  return $rc
}
part pidns31 pidns31
part inside31 env OUT="$OUT/parts/inside31" scripts/inside-namespace-h200.sh

part oom-kinds scripts/oom-kinds-h200.sh "$OUT/parts/oom-kinds"
if [ -x scripts/oom-live-h200.sh ]; then
  part oom-live scripts/oom-live-h200.sh "$OUT/parts/oom-live"
fi
part oom-top scripts/oom-top-h200.sh "$OUT/parts/oom-top"

# --- estimate34: the most concurrent sequences estimate says fit, tried for real.
estimate34() {
  local dir=$OUT/parts/estimate34
  local capacity=$((24 * 1024 * 1024 * 1024))
  "$VRAMCTL" estimate testdata/model/configs/gpt2.json --infer --batch 1 --seq 1024 --gen 64 \
    --precision fp32 --gpu "${capacity}B" --json > "$dir/estimate.json" || return 1
  python3 - "$dir" "$capacity" <<'EOF'
import json, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
d, capacity = sys.argv[1], int(sys.argv[2])
e = json.load(open(f"{d}/estimate.json"))
n = e["gpu"]["largest_batch"]
print(f"estimate: most concurrent sequences {n}, margin {e['gpu']['largest_batch_margin_bytes']}")
cfg = GPT2Config.from_json_file("testdata/model/configs/gpt2.json")
model = GPT2LMHeadModel(cfg).cuda().eval()
free, total = torch.cuda.mem_get_info()
# The process may use `capacity` bytes: the rest of the device is out of its reach.
torch.cuda.set_per_process_memory_fraction(min(1.0, capacity / total))
def peak(batch):
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    ids = torch.randint(0, cfg.vocab_size, (batch, 1024), device="cuda")
    try:
        with torch.no_grad():
            model.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=0)
        return torch.cuda.max_memory_reserved()
    except torch.OutOfMemoryError:
        return None
at_n, at_more = peak(n), peak(n + max(1, n // 10))
print(f"measured: batch {n} -> {at_n}, batch {n + max(1, n // 10)} -> {at_more}")
print("PASS the answer runs" if at_n is not None else "FAIL the answer ran out of memory")
sys.exit(0 if at_n is not None else 1)
EOF
}
part estimate34 estimate34
part estimate34b env OUT="$OUT/parts/estimate34b" scripts/estimate34b-h200.sh
part est5train env OUT="$OUT/parts/est5train" ROUND=5-train scripts/estimate34b-h200.sh
part est5infer env OUT="$OUT/parts/est5infer" ROUND=5-infer scripts/estimate34b-h200.sh
part inv4 env OUT="$OUT/parts/inv4" ROUND=4-inverse scripts/estimate34b-h200.sh
part est6 env OUT="$OUT/parts/est6" ROUND=6 scripts/estimate34b-h200.sh
part est7 env OUT="$OUT/parts/est7" ROUND=7 scripts/estimate34b-h200.sh
part est8 env OUT="$OUT/parts/est8" ROUND=8 scripts/estimate34b-h200.sh
part est9 env OUT="$OUT/parts/est9" ROUND=9 scripts/estimate34b-h200.sh

part families34 env OUT="$OUT/parts/families34" scripts/estimate-families-h200.sh

# What autograd saves per module (truth.py's census, TRUTH_PHASES=1) for round 5's two
# training rows that missed most: Pythia (-3.5 %: counted tensors 1 GB under torch's
# allocated peak) and OPT (+7.1 %, ReLU counted once since), to read, not to judge.
census34() {
  local dir=$OUT/parts/census34 c
  for c in pythia-1b-bf16-b8x1024 opt-1.3b-ampbf16-b4x1024; do
    HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TRUTH_PHASES=1 timeout 150 \
      python3 scripts/estimate/truth.py "$c" > "$dir/$c.jsonl" 2> "$dir/$c.err" || return 1
  done
}
part census34 census34

# --- web32: the page's live API on the real driver, against nvidia-smi.
web32() {
  local dir=$OUT/parts/web32 ready port=19835
  ready=$(mktemp -u)
  python3 -c "
import time, torch
x = torch.empty(3 << 30, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()
open('$ready', 'w').close(); time.sleep(90)" &
  local holder=$!
  for _ in $(seq 300); do [ -e "$ready" ] && break; sleep 0.1; done
  "$VRAMCTL" serve --listen "127.0.0.1:$port" 2> "$dir/serve.log" &
  local serve=$!
  sleep 4
  curl -fsS "http://127.0.0.1:$port/api/now" > "$dir/now.json"
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits > "$dir/smi-gpu.csv"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$dir/smi-apps.csv"
  timeout 5 curl -fsSN "http://127.0.0.1:$port/api/events" > "$dir/events.txt" 2> /dev/null
  curl -fsS "http://127.0.0.1:$port/" > "$dir/index.html"
  kill "$serve" "$holder" 2> /dev/null
  wait "$serve" "$holder" 2> /dev/null
  rm -f "$ready"
  python3 - "$dir" <<'EOF'
import json, sys
d = sys.argv[1]
now = json.load(open(f"{d}/now.json"))
smi = {int(l.split(",")[0]): int(l.split(",")[1]) for l in open(f"{d}/smi-gpu.csv") if l.strip()}
apps = {int(l.split(",")[0]): int(l.split(",")[1]) for l in open(f"{d}/smi-apps.csv") if l.strip()}
bad = 0
for g in now["gpus"]:
    used_mib = (g["used_bytes"] or 0) / 2**20
    want = smi.get(g["index"])
    # The holder is steady: the two readings may differ only by what other processes did.
    ok = want is not None and abs(used_mib - want) <= max(64, 0.01 * want)
    print(f"{'ok' if ok else 'MISMATCH'} GPU {g['index']}: page {used_mib:.0f} MiB, nvidia-smi {want} MiB")
    bad += not ok
    pids = {p["pid"] for p in g["processes"]}
    for pid in apps:
        if pid not in pids:
            print(f"MISMATCH nvidia-smi's PID {pid} not on the page")
            bad += 1
ticks = open(f"{d}/events.txt").read().count("event: tick")
print(f"ok {ticks} SSE ticks in 5 s" if ticks >= 3 else f"MISMATCH {ticks} SSE ticks in 5 s")
bad += ticks < 3
print("PASS the page agrees with nvidia-smi" if bad == 0 else f"FAIL {bad} mismatches")
sys.exit(1 if bad else 0)
EOF
}
part web32 web32

part leak35 env OUT="$OUT/parts/leak35" scripts/leak35-agent-h200.sh

# Asked only when a fit part may run (it imports torch); SKIP naming fit34 skips all three.
if is_skipped fit34 && is_skipped fit34llama && is_skipped fit34ckpt; then
  say "== fit34, fit34llama, fit34ckpt: skipped"
elif [[ $SKIP == *" fit34 "* ]]; then
  say "== fit34, fit34llama, fit34ckpt: skipped (SKIP names fit34)"
elif [ "$(scripts/fit-h200.sh reuse 2>&1)" = yes ]; then
  part fit34 scripts/fit-h200.sh check "$VRAMCTL" "$OUT/parts/fit34-run" "resnet llama llama-ckpt"
else
  # No recorded truth applies (not the recorded H200 and torch 2.11): each case bisects
  # before its fit, ~14 trials of 11-25 s, so 4-8 min a case and 15-20 min for the three,
  # past a 10-minute device call (the first H100 run's call limit). One part a case, each
  # in a call of its own; check34.py judges each, and fit34seq all four.
  say "fit34: recorded truths do not apply ($(scripts/fit-h200.sh reuse 2>&1)): one part per case, each bisected"
  part fit34 scripts/fit-h200.sh check "$VRAMCTL" "$OUT/parts/fit34-run" resnet
  part fit34llama scripts/fit-h200.sh check "$VRAMCTL" "$OUT/parts/fit34-run" llama
  part fit34ckpt scripts/fit-h200.sh check "$VRAMCTL" "$OUT/parts/fit34-run" llama-ckpt
fi
if ! skipped fit34seq; then
  part fit34seq bash -c 'scripts/fit-h200.sh check "$0" "$1" gpt2-seq &&
    python3 scripts/fit/check34.py "$1" resnet llama llama-ckpt gpt2-seq' "$VRAMCTL" "$OUT/parts/fit34-run"
fi

# Held out for fit's allocated-bound stop rule (ResNet-50 tuned it): each case bisected for
# its truth, then fit; a directory of their own, apart from the tuning case.
part fit34cnx scripts/fit-h200.sh check "$VRAMCTL" "$OUT/parts/fit34-heldout" convnext
part fit34vit scripts/fit-h200.sh check "$VRAMCTL" "$OUT/parts/fit34-heldout" vit
# Held out for whatever changes after convnext and vit missed (2026-12-05, H100): chosen
# before any such change, never replayed while choosing it.
part fit34eff scripts/fit-h200.sh check "$VRAMCTL" "$OUT/parts/fit34-heldout2" efficientnet
part fit34swin scripts/fit-h200.sh check "$VRAMCTL" "$OUT/parts/fit34-heldout2" swin
# Held out for fit as it stands on 2026-12-06 (the alignment, the allocated bound, the
# step down after a miss; nothing changed since efficientnet and swin met the goal): two
# transformer batch searches, with and without checkpointing, and a sequence-length search.
part fit34neox scripts/fit-h200.sh check "$VRAMCTL" "$OUT/parts/fit34-heldout3" neox
part fit34neoxckpt scripts/fit-h200.sh check "$VRAMCTL" "$OUT/parts/fit34-heldout3" neox-ckpt
part fit34qseq scripts/fit-h200.sh check "$VRAMCTL" "$OUT/parts/fit34-heldout3" qwen2-seq

if ! skipped leakset; then
  part leakset scripts/record-leakset-h200.sh "$VRAMCTL" "$OUT/parts/leakset" 300
fi

say "== $fails part(s) failed"
# A device call brings back only so many files from $OUT (the leak set's nvidia-smi logs and
# most of oom-live's answers were left out on 2026-12-05): one archive of every part's files
# comes back whatever their number.
tar czf "$OUT/parts.tar.gz" -C "$OUT" parts 2> /dev/null || say "could not archive $OUT/parts"
exit $((fails > 0))
