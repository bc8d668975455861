#!/usr/bin/env python3
"""Issue 32's goal for the snapshot viewer: a 1 GB snapshot opens in < 10 s with the
server's RSS < 2x the file. One command, no GPU:

    python3 scripts/snapshot-view-bench.py --bin target/release/vramctl --out /tmp/view-bench

Makes the big snapshot first (unless --file names one): a training loop of --entries trace
entries (default 6,000,000: ~1.07 GB) with the stacks of the H200 fixture
testdata/h200/snapshots/snapshot-train.pickle, by scripts/snapshot-training-synthetic.py,
whose trace replays exactly (a fresh dict and frame list per entry sharing the frame dicts,
as torch's own files are).

Then starts `BIN snapshot view FILE --listen 127.0.0.1:0`, and measures:
- the open time: from the start to the line with the URL (the file read and indexed);
- the answers the page asks for first (files, the timeline at 1,600 buckets and 400 bands,
  a zoom to 10,000 events, the segments at the peak), their time and JSON size;
- the server's peak RSS (VmHWM of /proc/PID/status) after those answers.
Writes results.json into --out. Exit 0 when the goal is met, 1 when not, 2 when a step
failed.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request


def get(url):
    t0 = time.monotonic()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
    return time.monotonic() - t0, body


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--file", help="an existing snapshot instead of making one")
    ap.add_argument("--entries", type=int, default=6_000_000)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    big = a.file
    if big is None:
        src = os.path.join(here, "..", "testdata", "h200", "snapshots", "snapshot-train.pickle")
        big = os.path.join(a.out, "big.pickle")
        subprocess.run([sys.executable, os.path.join(here, "snapshot-training-synthetic.py"),
                        src, big, str(a.entries)], check=True)
    size = os.path.getsize(big)
    t0 = time.monotonic()
    proc = subprocess.Popen([a.bin, "snapshot", "view", big, "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = None
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        m = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        if m:
            url = m.group(1)
            break
    open_s = time.monotonic() - t0
    if url is None:
        print("no URL printed:\n" + "\n".join(lines), file=sys.stderr)
        return 2
    results = {"file": big, "file_bytes": size, "open_s": round(open_s, 3), "answers": {}}
    try:
        def ask(name, path):
            secs, body = get(url + path.lstrip("/"))
            results["answers"][name] = {"path": path, "s": round(secs, 3), "json_bytes": len(body)}
            return json.loads(body)

        files = ask("files", "/api/snapshot/files")
        events = files["files"][0]["devices"][0]["events"]
        tl = ask("timeline", "/api/snapshot/timeline?file=0&device=0&width=1600&bands=400")
        mid = events // 2
        ask("zoom", f"/api/snapshot/timeline?file=0&device=0&from={mid}&to={mid + 10000}&width=1600&bands=400")
        ask("state at the peak", f"/api/snapshot/state?file=0&device=0&event={tl['peak_event']}")
        ask("state at the last event", f"/api/snapshot/state?file=0&device=0&event={events - 1}")
        with open(f"/proc/{proc.pid}/status") as f:
            status = f.read()
        hwm_kb = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))
        rss_kb = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))
        results["events"] = events
        results["peak_rss_bytes"] = hwm_kb * 1024
        results["rss_after_bytes"] = rss_kb * 1024
        results["peak_rss_over_file"] = round(hwm_kb * 1024 / size, 3)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    results["goal_met"] = results["open_s"] < 10 and results["peak_rss_over_file"] < 2
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results, indent=1))
    return 0 if results["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
