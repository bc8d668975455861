#!/usr/bin/env bash
# `vramctl serve`'s leak and idle verdicts on a real GPU, with nothing else running:
#
#   scripts/serve-verdicts-h200.sh path/to/vramctl OUTDIR
#
# A PyTorch process holding 2 GiB and sleeping, a busy matmul loop, and
# `serve --interval 1 --idle-for 60s`; at 10 s one scrape and nvidia-smi's
# --query-compute-apps side by side (OUTDIR/metrics-10s.txt, smi-10s.csv); then a scrape
# every 5 s for 110 s of the verdict series (OUTDIR/scrapes.txt: the holder's
# vramctl_process_idle_holder should turn 1 after about 60-80 s, the busy loop stay 0);
# OUTDIR/pids.txt has the PIDs and the daemon's CPU ticks over the run. About 2 minutes.
set -uo pipefail
V=$(realpath "$1"); O=$2; mkdir -p "$O"
python3 -c "import torch,time; x=torch.ones(2*1024**3//4, device='cuda'); torch.cuda.synchronize(); time.sleep(130)" & H=$!
python3 -c "import torch,time; a=torch.randn(4096,4096,device='cuda'); t=time.time()
while time.time()-t<130: a=(a@a).tanh(); torch.cuda.synchronize(); time.sleep(0.02)" & B=$!
"$V" serve --listen 127.0.0.1:19400 --interval 1 --idle-for 60s 2> "$O/serve.err" & S=$!
trap 'kill $S $H $B 2>/dev/null || true' EXIT
echo "holder $H busy $B" > "$O/pids.txt"
sleep 10
curl -s http://127.0.0.1:19400/metrics > "$O/metrics-10s.txt"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$O/smi-10s.csv"
for _ in $(seq 22); do
  echo "# $(date +%s)" >> "$O/scrapes.txt"
  curl -s http://127.0.0.1:19400/metrics | grep -E '^vramctl_process_(idle|leak)' \
    | sed -E 's/\{.*pid="([0-9]+)".*\}/ pid=\1/' >> "$O/scrapes.txt"
  sleep 5
done
echo "serve cpu ticks $(awk '{print $14+$15}' "/proc/$S/stat") over ~120 s" >> "$O/pids.txt"
tail -12 "$O/scrapes.txt"
grep -E "^vramctl_process_memory_used_bytes" "$O/metrics-10s.txt" | sed -E 's/\{.*pid="([0-9]+)".*\}/ pid=\1/'
cat "$O/smi-10s.csv" "$O/pids.txt"
