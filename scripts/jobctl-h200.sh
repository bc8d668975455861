#!/usr/bin/env bash
# Issue 29, items 8 and 11, on a real GPU: `run --timeout` ends the whole job (CUDA holders
# included, nvidia-smi lists none of them afterwards), and `kill` refuses a PID that holds
# no GPU memory and an identity (PID@START:ID) that is not the process's.
#
#   scripts/jobctl-h200.sh .dist/vramctl "$OUT"
#
# Writes OUTDIR/jobctl.log and OUTDIR/run.json; prints one `PASS name` or `FAIL name: why`
# line per check and ends with `jobctl-h200: N failed` (0 expected). Needs python3 with
# torch and a CUDA GPU; under a minute; changes no GPU setting.
set -uo pipefail
bin="$(realpath "${1:?usage: jobctl-h200.sh BINARY OUTDIR}")"
out="$(realpath -m "${2:?usage: jobctl-h200.sh BINARY OUTDIR}")"
mkdir -p "$out"
exec 2> >(tee -a "$out/jobctl.log" >&2)
failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
# Running, with the start time it had when it wrote its PID (a reused PID is not it).
running() { local st; st=$(awk '{print $3, $22}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ ${st% *} != Z && ${st#* } == "$2" ]]; }
start_of() { awk '{print $22}' "/proc/$1/stat"; }

# 1. run --timeout: a CUDA holder, a child of it that ignores SIGTERM and holds memory too,
# and a double-forked daemon that ignores SIGTERM; run stops them all.
pids="$out/run.pids"; : > "$pids"
cat > "$out/job.py" <<'PY'
import os, signal, subprocess, sys, time, torch
pids = sys.argv[1]
def note():
    with open(pids, "a") as f: f.write(f"{os.getpid()}\n")
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # 1 GiB
note()
child = "import os,signal,time,torch; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
        "y=torch.empty(1<<29,dtype=torch.uint8,device='cuda'); torch.cuda.synchronize(); " \
        f"open({pids!r},'a').write(f'{{os.getpid()}}\\n'); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", child])
subprocess.Popen(["sh", "-c", f"( setsid sh -c 'trap \"\" TERM HUP; echo $$ >> {pids}; exec sleep 600' & )"])
time.sleep(600)
PY
"$bin" run --timeout 20s --grace 2s --json --report "$out/run.json" -- \
  python3 "$out/job.py" "$pids" > /dev/null 2>> "$out/jobctl.log"
echo "run exit $?" >&2
n=$(wc -l < "$pids")
alive=""
while read -r p; do [[ -d /proc/$p ]] && [[ $(awk '{print $3}' /proc/$p/stat) != Z ]] && alive+=" $p"; done < "$pids"
if [[ $n -ge 3 && -z $alive ]]; then pass "run-timeout-ends-the-whole-job ($n processes, $(grep -o '"containment": "[a-z]*"' "$out/run.json"))"
else fail run-timeout-ends-the-whole-job "$n PIDs written, still running:$alive"; fi
sleep 1
held=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr -d ' ' | grep -xFf "$pids" || true)
if [[ -z $held ]]; then pass run-job-holds-no-gpu-memory-after
else fail run-job-holds-no-gpu-memory-after "nvidia-smi still lists $held"; fi
while read -r p; do kill -KILL "$p" 2>/dev/null; done < "$pids"

# 2. kill: a CUDA holder is planned, a plain sleep (no GPU memory) refused, and the
# holder's exact identity from ps --json accepted while another ID is refused.
python3 -c "import torch,time; x=torch.empty(1<<30,dtype=torch.uint8,device='cuda'); torch.cuda.synchronize(); print('ready', flush=True); time.sleep(600)" > "$out/holder.out" &
holder=$!
sleep 600 & bystander=$!
for _ in $(seq 300); do grep -q ready "$out/holder.out" && break; sleep 0.1; done
sleep 1
plan() { "$bin" kill --dry-run --json "$@" 2>> "$out/jobctl.log"; }
outcome() { python3 -c 'import json,sys; d=json.load(sys.stdin); t=d["targets"][0]; print(t["outcome"], t.get("detail") or "")'; }
o=$(plan "$holder" | outcome); [[ $o == would_signal* ]] && pass kill-plans-a-gpu-holder || fail kill-plans-a-gpu-holder "$o"
o=$(plan "$bystander" | outcome)
[[ $o == "refused"*"holds no GPU memory"* ]] && pass kill-refuses-a-pid-without-gpu-memory || fail kill-refuses-a-pid-without-gpu-memory "$o"
id=$("$bin" ps --json --no-daemon 2>> "$out/jobctl.log" | python3 -c "import json,sys; print(next((p['pidfd_id'] for p in json.load(sys.stdin)['processes'] if p['pid']==$holder), None))")
start=$(start_of "$holder")
if [[ $id == None ]]; then fail ps-prints-the-pidfd-id "null for the holder (kernel $(uname -r); needs 6.9+)"
else
  pass ps-prints-the-pidfd-id
  o=$(plan "$holder@$start:$id" | outcome); [[ $o == would_signal* ]] && pass kill-accepts-the-exact-identity || fail kill-accepts-the-exact-identity "$o"
  o=$(plan "$holder@$start:$((id + 1))" | outcome)
  [[ $o == "refused"*"now names another process"* ]] && pass kill-refuses-another-pidfd-id || fail kill-refuses-another-pidfd-id "$o"
fi
running "$bystander" "$(start_of "$bystander")" && pass the-bystander-lives || fail the-bystander-lives "gone"
kill -KILL "$holder" "$bystander" 2>/dev/null
# Only these two: a bare `wait` also waits for the `>(tee …)` above, which holds stderr open.
wait "$holder" "$bystander" 2>/dev/null
echo "jobctl-h200: $failed failed"
