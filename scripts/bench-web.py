#!/usr/bin/env python3
"""Measures the web view's goals (issue 32) in a real headless Chromium; figures go to
docs/benchmarks.md ("Issue 32"). Standard library only (scripts/web-test/cdp.py).

    cargo build --release -p vramctl -p fake-nvml -p vramctl-store --example synth_history
    python3 scripts/bench-web.py --out /tmp/bench-web

What it sets up: a history of 24 h at 1 s for 8 GPUs x 30 processes ending now
(`synth_history --end-now`, 240 process series), and `vramctl serve --interval 1s --record`
on it over the fake NVML's 8 x 30 scenario with the history's GPU UUIDs (so the live GPUs
are the recorded ones). Then:
- the server: `/api/history` for the last 24 h in 640 buckets (what the 24 h zoom asks),
  time and size, five runs;
- the page, each run a fresh browser (empty cache): opened at its default (15 min) and at
  `#live?window=86400000` (24 h): first contentful paint, charts drawn (the page's
  `vramctl-charts` mark: every chart drawn with its history), page weight (bytes received
  over the network up to then, compressed size as sent: no compression here);
- live: how long after its sample each tick is on screen (`data-lag-ms`), 60 ticks;
- the page's CPU: Chromium's Performance metrics (TaskDuration: the renderer's main-thread
  work) over 60 s at a 1 s tick, as a fraction of one core, at both zooms.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "web-test"))
from cdp import Browser  # noqa: E402

ROOT = os.path.dirname(HERE)
DAY_MS = 24 * 3600 * 1000


def start_serve(vramctl, lib, scenario, db):
    env = dict(os.environ, FAKE_NVML_SCENARIO=scenario)
    proc = subprocess.Popen(
        [vramctl, "--nvml-lib", lib, "serve", "--listen", "127.0.0.1:0", "--interval", "1s",
         "--record", db, "--retain", "raw=3650d"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    address = None
    for line in proc.stderr:
        m = re.match(r"vramctl: serving http://([0-9.:]+)/metrics", line)
        if m:
            address = m.group(1)
        if line.startswith("vramctl: the first collection is served"):
            break
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    if not address:
        raise SystemExit("serve did not start")
    return proc, "http://%s/" % address


def fetch(url):
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as response:
        body = response.read()
    return time.perf_counter() - started, len(body)


def page_load(url, label):
    """One cold load: first contentful paint, charts drawn, bytes received."""
    with Browser() as b:
        received = {}
        finished = {}

        def listen(message):
            method = message.get("method")
            params = message.get("params", {})
            if method == "Network.dataReceived":
                received[params["requestId"]] = received.get(params["requestId"], 0) + params.get("encodedDataLength", 0)
            elif method == "Network.loadingFinished":
                finished[params["requestId"]] = params.get("encodedDataLength", 0)
        b.on(listen)
        b.viewport(1280, 800)
        b.send("Network.setCacheDisabled", {"cacheDisabled": True})
        b.navigate(url)
        b.wait_for("performance.getEntriesByName('vramctl-charts').length > 0", 120)
        time.sleep(0.3)
        timing = b.evaluate("""({
          fcp: (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime,
          charts: performance.getEntriesByName('vramctl-charts')[0].startTime,
          gpus: document.querySelectorAll('#panel-live article.gpu').length,
          points: window.vramctl.liveCharts().map((c) => c.points),
          series: window.vramctl.liveCharts().map((c) => c.series.length),
        })""")
        weight = sum(max(finished.get(r, 0), n) for r, n in received.items())
        weight += sum(n for r, n in finished.items() if r not in received)
        return dict(timing, weight_bytes=weight, label=label)


def live_and_cpu(url, seconds):
    with Browser() as b:
        b.viewport(1280, 800)
        b.navigate(url)
        b.wait_for("performance.getEntriesByName('vramctl-charts').length > 0", 120)
        time.sleep(3)
        lags = []
        seen = None
        before = b.metrics()
        wall0 = time.monotonic()
        while time.monotonic() - wall0 < seconds:
            state = b.evaluate("[document.querySelector('#panel-live').dataset.seq, Number(document.querySelector('#panel-live').dataset.lagMs)]")
            if state[0] != seen:
                seen = state[0]
                lags.append(state[1])
            time.sleep(0.2)
        after = b.metrics()
        wall = time.monotonic() - wall0
        return {
            "lags_ms": lags[1:],
            "task_s": after["TaskDuration"] - before["TaskDuration"],
            "script_s": after["ScriptDuration"] - before["ScriptDuration"],
            "wall_s": wall,
        }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--vramctl", default=os.path.join(ROOT, "target/release/vramctl"))
    parser.add_argument("--fake-lib", default=os.path.join(ROOT, "target/release/libfake_nvml.so"))
    parser.add_argument("--synth", default=os.path.join(ROOT, "target/release/examples/synth_history"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cpu-seconds", type=int, default=60)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="bench-web-")
    db = os.path.join(work, "day.db")
    started = time.perf_counter()
    subprocess.run([args.synth, db, "--end-now"], check=True)
    print("history written in %.0f s (%.1f MB)" % (time.perf_counter() - started, os.path.getsize(db) / 1e6))
    # The scenario with the history's GPU UUIDs (synth_history: GPU-{g:08x}-0000-...).
    with open(os.path.join(ROOT, "examples/scenarios/eight-gpus-30-procs.toml"), encoding="utf-8") as f:
        text = f.read()
    uuids = re.findall(r'^uuid = "(GPU-[^"]+)"', text, flags=re.M)
    for g, uuid in enumerate(uuids):
        text = text.replace(uuid, "GPU-%08x-0000-0000-0000-000000000000" % g)
    scenario = os.path.join(work, "scenario.toml")
    with open(scenario, "w", encoding="utf-8") as f:
        f.write(text)
    proc, url = start_serve(args.vramctl, args.fake_lib, scenario, db)
    results = {"url": url}
    try:
        time.sleep(3)
        now = json.load(urllib.request.urlopen(url + "api/now"))
        to = now["t_ms"]
        api = [fetch(url + "api/history?from=%d&to=%d&points=640" % (to - DAY_MS, to)) for _ in range(5)]
        marks = [fetch(url + "api/marks?from=%d&to=%d&points=640" % (to - DAY_MS, to)) for _ in range(2)]
        results["api_history_24h"] = {"seconds": [round(s, 3) for s, _ in api], "bytes": api[0][1]}
        results["api_marks_24h"] = {"seconds": [round(s, 3) for s, _ in marks], "bytes": marks[0][1]}
        results["loads"] = []
        for label, address in (("15 min", url), ("24 h", url + "#live?window=86400000")):
            for _ in range(args.runs):
                results["loads"].append(page_load(address, label))
        results["live_15min"] = live_and_cpu(url, args.cpu_seconds)
        results["live_24h"] = live_and_cpu(url + "#live?window=86400000", args.cpu_seconds)
        rss = open("/proc/%d/status" % proc.pid).read()
        results["serve_rss_kb"] = int(re.search(r"VmRSS:\s+(\d+)", rss).group(1))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(args.out, "bench-web.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print("api/history 24 h, 640 buckets: %s s, %d bytes" % (results["api_history_24h"]["seconds"], results["api_history_24h"]["bytes"]))
    print("api/marks 24 h (the leak scan): %s s" % results["api_marks_24h"]["seconds"])
    for load in results["loads"]:
        print("%-6s first contentful paint %6.0f ms, charts drawn %6.0f ms, weight %7.0f kB, %d GPUs, series %s" % (
            load["label"], load["fcp"] or -1, load["charts"], load["weight_bytes"] / 1e3, load["gpus"], load["series"][:1]))
    for key in ("live_15min", "live_24h"):
        live = results[key]
        lags = sorted(live["lags_ms"])
        print("%s: tick on screen after its sample: median %.0f ms, max %.0f ms (%d ticks); page CPU %.1f %% of a core (script %.1f %%)" % (
            key, statistics.median(lags) if lags else -1, lags[-1] if lags else -1, len(lags),
            100 * live["task_s"] / live["wall_s"], 100 * live["script_s"] / live["wall_s"]))
    print("serve RSS %.0f MB" % (results["serve_rss_kb"] / 1e3))


if __name__ == "__main__":
    main()
