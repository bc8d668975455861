#!/usr/bin/env bash
# `vramctl top` with an in-process agent on a real GPU (issue 14): its ALLOC and CACHED
# columns against torch's own counters, and the R key against nvidia-smi. On the H200:
#
#   scripts/top-agent-h200.sh path/to/vramctl OUTDIR
#
# A PyTorch process with the agent keeps 1 GiB and caches 20 GiB; `vramctl top` runs in a
# pseudo-terminal (200x50) until its screen shows ALLOC, then R is pressed with the holder
# selected (the only GPU process) and the screen read until it says what was released;
# nvidia-smi's figure for the PID before and 3 s after. Writes OUTDIR/top-agent.txt (the
# figures, PASS/FAIL) and OUTDIR/top-agent-screen.txt (the last screen, escapes removed).
# About 40 s.
set -euo pipefail
VRAMCTL=$(realpath "$1")
OUT=$(realpath -m "$2")
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUT"
export PYTHONPATH="$here/../python${PYTHONPATH:+:$PYTHONPATH}"
exec timeout -k 2 90 python3 - "$VRAMCTL" "$OUT" <<'PY'
import fcntl, json, os, pty, re, select, struct, subprocess, sys, tempfile, termios, time
vramctl, out = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp(prefix="top-agent-")
ready = os.path.join(work, "ready.json")
holder = subprocess.Popen([sys.executable, "-c", r'''
import json, os, sys, time, torch, vramctl_agent
GiB = 1 << 30
keep = torch.empty(GiB, dtype=torch.uint8, device="cuda"); keep.fill_(1)
c = torch.empty(20 * GiB, dtype=torch.uint8, device="cuda"); c.fill_(1); del c
torch.cuda.synchronize(); vramctl_agent.start()
path = sys.argv[1]
while True:
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}, f)
    os.replace(path + ".tmp", path)
    time.sleep(0.5)
''', ready])
lines, checks = [], []
def say(*a): lines.append(" ".join(str(x) for x in a))
def check(name, ok, detail=""): checks.append(ok); say("PASS" if ok else "FAIL", name, detail)
def smi(pid):
    rows = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    for r in rows.splitlines():
        p, m = [x.strip() for x in r.split(",")]
        if int(p) == pid: return int(m)
    return None
try:
    for _ in range(200):
        if os.path.exists(ready): break
        time.sleep(0.1)
    info = json.load(open(ready)); pid = info["pid"]
    say("holder", json.dumps(info)); before = smi(pid); say("nvidia_smi_before_mib", before)
    child_pid, fd = pty.fork()
    if child_pid == 0:
        os.environ["TERM"] = "xterm-256color"
        os.execv(vramctl, [vramctl, "top", "--no-daemon", "--db", os.path.join(work, "none.db")])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    buf = b""
    def read_for(seconds, until=None):
        global buf
        end = time.time() + seconds
        while time.time() < end:
            r, _, _ = select.select([fd], [], [], 0.2)
            if r:
                try: buf += os.read(fd, 65536)
                except OSError: return False
            if until and until(screen()): return True
        return False
    ansi = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]")
    def screen(): return ansi.sub(b" ", buf[-200000:]).decode("utf-8", "replace")
    t0 = time.time()
    shown = read_for(25, lambda s: "ALLOC" in s and "CACHED" in s)
    check("top shows ALLOC and CACHED for the agent's process", shown, f"after {time.time()-t0:.1f} s")
    read_for(1.5)
    s = screen()
    m = re.findall(r"(\d+(?:\.\d+)?)G\s+(\d+(?:\.\d+)?)G\s+(\d+(?:\.\d+)?)G", s)
    say("row_figures_G (mem alloc cached), last seen", m[-1] if m else None)
    if m:
        mem, al, ca = (float(x) for x in m[-1])
        check("ALLOC is torch's allocated (1.0G)", abs(al - info["allocated"] / 2**30) < 0.05, al)
        check("CACHED is torch's reserved - allocated (20.0G)", abs(ca - (info["reserved"] - info["allocated"]) / 2**30) < 0.05, ca)
        check("MEM is nvidia-smi's figure", before is not None and abs(mem - before / 1024) < 0.06, f"{mem}G vs {before} MiB")
    buf = b""
    t1 = time.time(); os.write(fd, b"R")
    said = read_for(15, lambda s: "released" in s)
    took = time.time() - t1
    text = re.findall(r"PID \d+: released[^\n│]*", screen())
    check("R says what was released", said, (text[-1].strip() if text else "") + f" ({took:.2f} s)")
    time.sleep(3)
    after = smi(pid); now = json.load(open(ready))
    say("nvidia_smi_after_mib", after, "torch reserved now", now["reserved"])
    check("nvidia-smi dropped by the 20 GiB cache (±64 MiB)", before is not None and after is not None and abs((before - after) - 20480) <= 64, f"{before} -> {after} MiB")
    os.write(fd, b"q"); read_for(2)
    open(os.path.join(out, "top-agent-screen.txt"), "w").write(screen()[-20000:])
    audit = subprocess.run([vramctl, "--db", os.path.join(work, "none.db"), "history", "--audit", "--json"], capture_output=True, text=True)
    say("audit", audit.returncode, audit.stdout[:400].replace("\n", " "))
finally:
    holder.kill()
    say("RESULT", "PASS" if checks and all(checks) else "FAIL")
    open(os.path.join(out, "top-agent.txt"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
PY
