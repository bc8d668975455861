#!/usr/bin/env bash
# inside-namespace-h200.sh: `vramctl ps` inside a PID namespace on the real driver (issue 31).
#
# A PyTorch process holds 1 GiB inside `unshare --pid --fork --mount-proc`; a second one holds
# 512 MiB outside it, on the host. A host `vramctl record` answers on its socket. Then, run
# inside the namespace (`nsenter --target <holder> --pid --mount`):
#   - `ps --json` through the daemon lists exactly the namespace's holder, under its PID there
#     (NSpid's last entry), with host_pid = the PID nvidia-smi gives and bytes equal to
#     nvidia-smi's used_memory for it (MiB, to the MiB); the outer holder is not listed, its
#     memory is in `other_holders` (the sum of nvidia-smi's other entries on that GPU);
#   - `ps --json --no-daemon`: where the driver numbers NVML's PIDs in the caller's namespace
#     (driver 580 does; the script asks NVML itself inside), `driver_numbered` with exactly
#     the holder under its namespace PID, its command and nvidia-smi's bytes; otherwise
#     `cannot_map` with NVML's host PIDs as such, with no user or command;
#   - `ps --json` on the host names the namespaced holder with its host PID (python3);
#   - `ps --json` as uid 65534 inside: mapped through containers.sock (record --containers-socket);
#   - `run` inside on a 768 MiB job: with the daemon its peak equals nvidia-smi's for the job;
#     without one, `driver_numbered` and the same peak where the driver numbers PIDs here,
#     else `cannot_map` and nothing attributed.
# Prints PASS/FAIL lines; exit 1 on any FAIL. Needs root (unshare, nsenter), torch, nvidia-smi.
# Usage: OUT=dir [VRAMCTL=path] scripts/inside-namespace-h200.sh   (about 45 s)
set -uo pipefail
cd "$(dirname "$0")/.."
VRAMCTL=$(readlink -f "${VRAMCTL:-.dist/vramctl}")
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
work=$(mktemp -d)
# mktemp's 0700 would keep uid 65534 from the sockets under it (the containers.sock check
# below failed so on the first GPU run, 2026-12-05): the runtime directory must be reachable
# as it is on a real host (/run/vramctl).
chmod 755 "$work"
runtime="$work/run"
pids=()
# A process and everything under it, with SIGKILL: util-linux's unshare may outlive a SIGTERM
# or leave its child running, and a holder left sleeping made `wait` take its whole 300 s.
kill_tree() {
  local child
  for child in $(cat /proc/"$1"/task/*/children 2> /dev/null); do kill_tree "$child"; done
  kill -KILL "$1" 2> /dev/null
}
cleanup() {
  for p in "${pids[@]}"; do kill_tree "$p"; done
  wait 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT

hold() { # hold MiB READY-FILE: a PyTorch process holding MiB until killed
  python3 -c "
import time, torch
x = torch.empty($1 << 20, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()
open('$2', 'w').close(); time.sleep(300)"
}
export -f hold

unshare --pid --fork --mount-proc --kill-child bash -c "hold 1024 $work/inner.ready" &
outer_ns=$!
pids+=("$outer_ns")
hold 512 "$work/outer.ready" &
outer_holder=$!
pids+=("$outer_holder")
for _ in $(seq 600); do [ -e "$work/inner.ready" ] && [ -e "$work/outer.ready" ] && break; sleep 0.1; done
if ! [ -e "$work/inner.ready" ] || ! [ -e "$work/outer.ready" ]; then
  echo "FAIL the holders never got their memory"
  exit 1
fi
# The namespaced python: unshare's child (bash, PID 1 there) and its child.
children() { cat /proc/"$1"/task/*/children 2> /dev/null; }
inner_bash=$(children "$outer_ns" | awk '{print $1}')
inner=$(children "$inner_bash" | awk '{print $1}')
[ -z "$inner" ] && inner=$inner_bash # bash may exec python directly
inner_nspid=$(awk '/^NSpid:/ {print $NF}' /proc/"$inner"/status)
echo "namespaced holder: host PID $inner, PID $inner_nspid in its namespace; outer holder $outer_holder"

VRAMCTL_RUNTIME_DIR=$runtime VRAMCTL_LOG=info "$VRAMCTL" --db "$work/history.db" record --interval 1s --containers-socket \
  2> "$OUT/record.log" &
pids+=("$!")
for _ in $(seq 100); do grep -q "NVML" "$OUT/record.log" 2> /dev/null && [ -S "$runtime/daemon.sock" ] && break; sleep 0.1; done
sleep 1

nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits > "$OUT/smi.csv"
inside() {
  VRAMCTL_RUNTIME_DIR=$runtime VRAMCTL_LOG=vramctl=debug \
    nsenter --target "$inner" --pid --mount -- "$VRAMCTL" "$@"
}
inside ps --json > "$OUT/inside.json" 2> "$OUT/inside.log"
inside ps > "$OUT/inside.txt" 2> /dev/null
inside ps --json --no-daemon > "$OUT/inside-no-daemon.json" 2> /dev/null
"$VRAMCTL" ps --json --no-daemon > "$OUT/host.json"
# As nobody (uid 65534) inside the namespace: daemon.sock is closed to it, containers.sock not.
VRAMCTL_RUNTIME_DIR=$runtime VRAMCTL_LOG=vramctl=debug \
  nsenter --target "$inner" --pid --mount --setuid 65534 --setgid 65534 -- "$VRAMCTL" ps --json \
  > "$OUT/inside-nobody.json" 2> "$OUT/inside-nobody.log"
# `run` inside the namespace on a job holding 768 MiB for 3 s, with the host daemon and without
# one; nvidia-smi polled meanwhile for the job's own figure.
job='import time, torch; x = torch.empty(768 << 20, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); time.sleep(3)'
for mode in daemon alone; do
  rt=$runtime; [ "$mode" = alone ] && rt="$work/no-daemon"
  ( for _ in $(seq 40); do nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits; sleep 0.25; done ) \
    > "$OUT/run-$mode-smi.csv" 2> /dev/null &
  poll=$!
  VRAMCTL_RUNTIME_DIR=$rt nsenter --target "$inner" --pid --mount -- \
    "$VRAMCTL" run --no-agent --json --report "$OUT/run-$mode.json" -- python3 -c "$job" 2> "$OUT/run-$mode.log"
  kill "$poll" 2> /dev/null; wait "$poll" 2> /dev/null
done
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits > "$OUT/smi-after.csv"
cat "$OUT/inside.txt"
# Which numbering NVML itself gives inside the namespace, with no vramctl in between. The open
# kernel modules' RM converts each process's PID into the *caller's* PID namespace and leaves
# out processes not in it (gpu_rmapi.c: _gpuConvertPid -> os_find_ns_pid -> pid_vnr); if this
# driver does, NVML's PIDs inside are the namespace's own and `cannot_map`'s "host PID" label
# is wrong. As root and as uid 65534, beside the host's answer.
nvml_pids='import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); print(sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)))'
echo "figure nvml-pids host: $(python3 -c "$nvml_pids" 2>&1 | tail -1)"
nsenter --target "$inner" --pid --mount -- python3 -c "$nvml_pids" 2>&1 | tail -1 > "$OUT/nvml-inside-root.txt"
echo "figure nvml-pids inside root: $(cat "$OUT/nvml-inside-root.txt")"
echo "figure nvml-pids inside nobody: $(cd / && nsenter --target "$inner" --pid --mount --setuid 65534 --setgid 65534 -- python3 -c "$nvml_pids" 2>&1 | tail -1)"
echo "figure NVML numbering inside: the holder is $inner on the host and $inner_nspid in its namespace; the outer holder $outer_holder is not in it"

python3 - "$OUT" "$inner" "$inner_nspid" "$outer_holder" << 'EOF'
import json, sys
out, inner, inner_ns, outer = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
MIB = 1 << 20
smi = {}
for line in open(f"{out}/smi.csv"):
    if line.strip():
        pid, uuid, mib = (x.strip() for x in line.split(","))
        smi[int(pid)] = (uuid, int(mib))
bad = 0
def check(ok, what):
    global bad
    print(("PASS " if ok else "FAIL ") + what)
    bad += 0 if ok else 1
inside = json.load(open(f"{out}/inside.json"))
log = open(f"{out}/inside.log").read()
check("Answered by the daemon." in log, "the host daemon answered the namespace's ps")
check(inside.get("pid_mapping") == "mapped", f"pid_mapping is mapped ({inside.get('pid_mapping')})")
rows = inside.get("processes", [])
check(len(rows) == 1, f"exactly one process listed inside ({[r.get('pid') for r in rows]})")
row = next((r for r in rows if r.get("pid") == inner_ns), None)
check(row is not None, f"the holder is listed under its namespace PID {inner_ns}")
if row is not None and inner in smi:
    check(row.get("host_pid") == inner, f"host_pid {row.get('host_pid')} = nvidia-smi's PID {inner}")
    mib = row["used_bytes"] / MIB
    check(abs(mib - smi[inner][1]) <= 1, f"bytes {mib:.1f} MiB = nvidia-smi {smi[inner][1]} MiB")
    check("python" in (row.get("command") or ""), f"its command from its own /proc: {row.get('command')!r}")
check(all(r.get("host_pid") != outer and r.get("pid") != outer for r in rows),
      f"the outer holder {outer} is not attributed to the namespace")
uuid = smi.get(inner, ("?", 0))[0]
others = {o["uuid"]: o for o in inside.get("other_holders", [])}
expect = sum(m for p, (u, m) in smi.items() if u == uuid and p != inner)
got = others.get(uuid, {}).get("used_bytes") or 0
n = sum(1 for p, (u, _) in smi.items() if u == uuid and p != inner)
check(abs(got / MIB - expect) <= n + 1, f"other_holders {got / MIB:.0f} MiB = nvidia-smi's others {expect} MiB ({n} processes)")
text = json.dumps(inside)
check(f'"pid": {outer}' not in text and f'"host_pid": {outer}' not in text, "no PID of the outer holder in the answer")
nod = json.load(open(f"{out}/inside-no-daemon.json"))
nod_pids = sorted(r.get("pid") for r in nod.get("processes", []))
# Which numbering this driver gives inside, as NVML itself answered (driver 580 on the H200,
# 2026-12-05: the namespace's own PIDs, others left out).
try:
    nvml_inside = json.loads(open(f"{out}/nvml-inside-root.txt").read().strip())
except Exception:
    nvml_inside = None
driver_numbers_here = nvml_inside == [inner_ns]
print(f"figure driver numbering inside: {'the namespace' if driver_numbers_here else 'not the namespace'} (NVML inside: {nvml_inside})")
if driver_numbers_here:
    check(nod.get("pid_mapping") == "driver_numbered",
          f"without the daemon, the driver numbering here: pid_mapping {nod.get('pid_mapping')} (driver_numbered)")
    nrow = next((r for r in nod.get("processes", []) if r.get("pid") == inner_ns), None)
    check(nod_pids == [inner_ns] and nrow is not None and nrow.get("visible")
          and "python" in (nrow.get("command") or ""),
          f"without the daemon: exactly the holder under its namespace PID {inner_ns}, with its command ({nod_pids})")
    if nrow is not None and inner in smi:
        mib = nrow["used_bytes"] / MIB
        check(abs(mib - smi[inner][1]) <= 1, f"without the daemon: bytes {mib:.1f} MiB = nvidia-smi {smi[inner][1]} MiB")
else:
    check(nod.get("pid_mapping") == "cannot_map", f"without the daemon: pid_mapping {nod.get('pid_mapping')}")
    check(all(r.get("host_pid") == r.get("pid") and r.get("user") is None and not r.get("visible")
              for r in nod.get("processes", [])), "without the daemon: NVML's PIDs marked host PIDs, no user")
    # The label is only true if the driver gave host PIDs: they must be nvidia-smi's on the host.
    check(nod_pids == sorted(smi), f"without the daemon: the PIDs marked host PIDs {nod_pids} are the host's {sorted(smi)}")
host = json.load(open(f"{out}/host.json"))
hrow = next((r for r in host.get("processes", []) if r.get("pid") == inner), None)
check(hrow is not None and "python" in (hrow.get("command") or ""), "the host's ps names the namespaced holder")
nobody = json.load(open(f"{out}/inside-nobody.json"))
check(nobody.get("pid_mapping") == "mapped"
      and [r.get("pid") for r in nobody.get("processes", [])] == [inner_ns],
      f"as uid 65534 through containers.sock: {nobody.get('pid_mapping')}, "
      f"{[r.get('pid') for r in nobody.get('processes', [])]}")
if nobody.get("pid_mapping") != "mapped":
    # The files under $OUT may not all come back from a device call: say here what was seen.
    for r in nobody.get("processes", []):
        print(f"  nobody's row: {json.dumps(r)[:300]}")
    for line in open(f"{out}/inside-nobody.log").read().splitlines()[-8:]:
        print(f"  nobody's log: {line[:220]}")
def job_smi_peak(mode):
    peak = 0
    for line in open(f"{out}/run-{mode}-smi.csv"):
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[1].isdigit() and int(parts[0]) not in (inner, outer):
            peak = max(peak, int(parts[1]))
    return peak
for mode in ("daemon", "alone"):
    try:
        rep = json.load(open(f"{out}/run-{mode}.json"))
    except Exception as e:
        check(False, f"run inside ({mode}): no report ({e})")
        continue
    procs = rep.get("processes", [])
    peak = max((p.get("peak_bytes", 0) for p in procs), default=0) / MIB
    if mode == "daemon":
        check(rep.get("pid_mapping") == "mapped", f"run inside with the daemon: pid_mapping {rep.get('pid_mapping')}")
        check(len(procs) == 1 and abs(peak - job_smi_peak(mode)) <= 1,
              f"run inside: the job's peak {peak:.0f} MiB = nvidia-smi's {job_smi_peak(mode)} MiB")
    elif driver_numbers_here:
        check(rep.get("pid_mapping") == "driver_numbered" and len(procs) == 1
              and abs(peak - job_smi_peak(mode)) <= 1,
              f"run inside without a daemon, the driver numbering here: {rep.get('pid_mapping')}, "
              f"job's peak {peak:.0f} MiB = nvidia-smi's {job_smi_peak(mode)} MiB")
    else:
        check(rep.get("pid_mapping") == "cannot_map" and not procs,
              f"run inside without a daemon: {rep.get('pid_mapping')}, {len(procs)} processes attributed (none)")
print("PASS inside31" if bad == 0 else f"FAIL inside31: {bad} checks failed")
sys.exit(1 if bad else 0)
EOF
