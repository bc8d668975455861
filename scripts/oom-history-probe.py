"""Where the time goes between a failing CUDA request and the end of the job, with and
without allocation history (issue 33's shortage-history case: 6.40 s from the request to
run's verdict on the H200, against 0.70 s without history), without vramctl: the job is the
oom-live case (70 % of the GPU kept, 45 % more asked), run with the agent injected as
`vramctl run` injects it (a private PYTHONPATH with the package and `_run_site.py` as
sitecustomize, VRAMCTL_AGENT=1, VRAMCTL_RUN_REPORT_DIR) or bare. The cases tell torch's own
cost of recording from the agent's:

- `agent-history` / `agent`: with the agent, VRAMCTL_OOM_HISTORY=1 or not;
- `plain-history` / `bare`: no agent; the job records history itself
  (`_record_memory_history(max_entries=100000, stacks="python")`, as the agent does) or not;
- `*-inprocess`: the same, then the job times `_snapshot()`, `pickle.dumps`,
  `memory_stats()` and a segments-only snapshot again after the OOM, three times each;
- `*-profile`: the job's first `_snapshot()` after the OOM under cProfile (its top 25 by
  cumulative time printed as `profile` lines), then torch's C++ snapshot alone;
- `plain-history-prewarm-profile`: the same after importing `torch._inductor.codecache`
  first (what the agent's warm-up imports).

Moments are seconds from the failing request (`stamp`): `observer_in`/`observer_kept` (the
agent's observer), `snapshot_in`/`snapshot_out` (torch's `_snapshot()` in it), `caught`
(the error in the job's code), `atexit_last` (the interpreter's exit began), `exited`
(the process ended, as its parent saw it).

    python3 scripts/oom-history-probe.py --out DIR [--cases a,b,...]

Prints `figure <case> <stage> <seconds>` lines; keeps each case's OOM pickle in DIR. Needs
torch with CUDA (or the stand-in torch of python/tests/fakes on PYTHONPATH, for a dry run).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

JOB = r"""
import os, sys, time, json, atexit
times = {}
def mark(k):
    times[k] = time.time()
mark('start')
import torch
mark('torch_imported')
GiB = 1 << 30
if os.environ.get('PROBE_PLAIN_HISTORY') == '1':
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks='python')
else:
    torch.cuda.init()
mark('cuda_init')
if os.environ.get('PROBE_PREWARM') == '1':
    # What the agent imports on its own thread when its recording starts.
    import torch._inductor.codecache
    mark('prewarmed')
try:
    import vramctl_agent._oom as o
    orig_keep = o._keep
    def keep(*a):
        mark('observer_in')
        r = orig_keep(*a)
        mark('observer_kept')
        return r
    o._keep = keep
    orig_snap = torch.cuda.memory._snapshot
    def snap(*a, **k):
        mark('snapshot_in')
        r = orig_snap(*a, **k)
        mark('snapshot_out')
        times['trace_entries'] = sum(len(t) for t in r.get('device_traces') or [])
        return r
    torch.cuda.memory._snapshot = snap
except Exception as e:
    print('no agent:', e, file=sys.stderr)
total = torch.cuda.get_device_properties(0).total_memory / GiB
keep = torch.empty(int(total * 0.70) * GiB, dtype=torch.uint8, device='cuda')
mark('stamp')
def at_exit():
    mark('atexit_last')
    with open(os.environ['PROBE_TIMES'], 'w') as f:
        json.dump(times, f)
atexit.register(at_exit)  # registered last of ours before the OOM: runs first at exit
try:
    more = torch.empty(int(total * 0.45) * GiB, dtype=torch.uint8, device='cuda')
except Exception as e:  # torch.OutOfMemoryError (the stand-in torch raises its own)
    mark('caught')
    if os.environ.get('PROBE_PROFILE') == '1':
        # The first snapshot after the OOM under cProfile (a first-call cost shows only
        # here), then torch's C++ entry alone, again.
        import cProfile, pstats, io
        prof = cProfile.Profile()
        t = time.time(); prof.runcall(torch.cuda.memory._snapshot); times['profiled_snapshot_0'] = time.time() - t
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats('cumulative').print_stats(25)
        with open(os.environ['PROBE_TIMES'] + '.profile.txt', 'w') as f:
            f.write(buf.getvalue())
        try:
            t = time.time(); torch._C._cuda_memorySnapshot(None); times['cxx_snapshot_1'] = time.time() - t
        except Exception as err:
            times['cxx_snapshot_error'] = str(err)[:200]
    if os.environ.get('PROBE_INPROCESS') == '1':
        for i in range(3):
            t = time.time(); s = orig_snap() if 'orig_snap' in dir() else torch.cuda.memory._snapshot(); times[f'again_snapshot_{i}'] = time.time() - t
            import pickle
            t = time.time(); d = pickle.dumps(s, protocol=4); times[f'again_pickle_{i}'] = time.time() - t
            times['again_pickle_bytes'] = len(d)
            t = time.time(); torch.cuda.memory_stats(); times[f'memory_stats_{i}'] = time.time() - t
            t = time.time(); torch.cuda.memory_snapshot(include_traces=False); times[f'segments_only_{i}'] = time.time() - t
    mark('raise')
    raise
"""


def run_case(name, out, agent, history, plain_history=False, inprocess=False, profile=False, prewarm=False):
    work = tempfile.mkdtemp(prefix=f"probe-{name}-")
    site = os.path.join(work, "python")
    reports = os.path.join(work, "reports")
    os.makedirs(reports)
    os.makedirs(site)
    shutil.copytree(os.path.join(REPO, "python", "vramctl_agent"), os.path.join(site, "vramctl_agent"))
    shutil.copy(os.path.join(REPO, "python", "vramctl_agent", "_run_site.py"), os.path.join(site, "sitecustomize.py"))
    times_file = os.path.join(work, "times.json")
    env = dict(os.environ, PROBE_TIMES=times_file)
    if agent:
        env.update(PYTHONPATH=os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p), VRAMCTL_AGENT="1", VRAMCTL_RUN_REPORT_DIR=reports)
    if history:
        env["VRAMCTL_OOM_HISTORY"] = "1"
    if plain_history:
        env["PROBE_PLAIN_HISTORY"] = "1"
    if inprocess:
        env["PROBE_INPROCESS"] = "1"
    if profile:
        env["PROBE_PROFILE"] = "1"
    if prewarm:
        env["PROBE_PREWARM"] = "1"
    t0 = time.time()
    done = subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True, text=True, timeout=300)
    ended = time.time()
    try:
        with open(times_file) as f:
            times = json.load(f)
    except (OSError, ValueError):
        print(f"figure {name} failed: {done.stderr[-2000:]}", flush=True)
        return
    if os.path.exists(times_file + ".profile.txt"):
        shutil.copy(times_file + ".profile.txt", os.path.join(out, f"{name}.profile.txt"))
        with open(times_file + ".profile.txt") as f:
            for line in f.read().splitlines()[:40]:
                print(f"profile {name} {line}", flush=True)
    stamp = times["stamp"]
    # Moments (seconds from the failing request, in order), then the measured durations.
    moments = sorted((v, k) for k, v in times.items() if isinstance(v, float) and v > 1e9)
    for v, k in moments:
        print(f"figure {name} {k} {v - stamp:+.3f}", flush=True)
    for k, v in times.items():
        if not (isinstance(v, float) and v > 1e9):
            print(f"figure {name} {k} {v}", flush=True)
    print(f"figure {name} exited {ended - stamp:+.3f} (spawned at {t0 - stamp:+.3f})", flush=True)
    for f in os.listdir(reports):
        path = os.path.join(reports, f)
        st = os.stat(path)
        print(f"figure {name} file {f} {st.st_size} B mtime {st.st_mtime - stamp:+.3f}", flush=True)
        if f.endswith(".oom.json"):
            with open(path) as fh:
                rec = json.load(fh)
            print(f"figure {name} record snapshot {rec.get('snapshot')} error {rec.get('snapshot_error')}", flush=True)
        if f.endswith(".oom.pickle"):
            shutil.copy(path, os.path.join(out, f"{name}.oom.pickle"))
    print(f"figure {name} stderr-tail {done.stderr.strip().splitlines()[-1:]}", flush=True)
    shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="agent-history,agent,plain-history,bare,agent-history-inprocess")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cases = {
        "agent-history": dict(agent=True, history=True),
        "agent": dict(agent=True, history=False),
        "plain-history": dict(agent=False, history=False, plain_history=True),
        "bare": dict(agent=False, history=False),
        "agent-history-inprocess": dict(agent=True, history=True, inprocess=True),
        "plain-history-inprocess": dict(agent=False, history=False, plain_history=True, inprocess=True),
        "plain-history-profile": dict(agent=False, history=False, plain_history=True, profile=True),
        "bare-profile": dict(agent=False, history=False, profile=True),
        "plain-history-prewarm-profile": dict(agent=False, history=False, plain_history=True, profile=True, prewarm=True),
    }
    for name in args.cases.split(","):
        run_case(name, args.out, **cases[name])


if __name__ == "__main__":
    main()
