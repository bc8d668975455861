#!/usr/bin/env python3
"""Drives the web view of a running `vramctl serve` in a real headless Chromium and reports
what the page showed, as JSON, for the integration test (crates/vramctl/tests/integration/
web.rs) to check against the server's own answers. Saves screenshots under --out.

    python3 scripts/web-test/cdp_check.py --url http://127.0.0.1:PORT/ --out DIR [--report FILE]

What it does, in order: loads the page at 1280x800 and waits for the GPUs and their
tables; records every request the page makes (Network events) and every console error or
CSP report; waits for a live tick to arrive over the event stream; zooms out to the whole
history and reads the charts; zooms to 5 min, then drags across a chart to zoom in;
opens a process's detail; walks the controls with Tab; runs axe-core on the main view;
then takes the phone-width screenshot. Exit status 0 when it could do all that (the test
judges the report), 1 on a failure to drive the page (with the reason in the report).
"""

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cdp import Browser, requests_and_console, write_report, CdpError  # noqa: E402

AXE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor", "axe-core", "axe.min.js")
AXE_VERSION = "4.14.1"

TABLES = """
Array.from(document.querySelectorAll('#panel-live article.gpu')).map((a) => ({
  uuid: a.dataset.uuid,
  title: a.querySelector('h2').textContent,
  now: a.querySelector('.now').textContent,
  chart_label: a.querySelector('.chart').getAttribute('aria-label'),
  rows: Array.from(a.querySelectorAll('table.procs tbody tr')).map((r) => Array.from(r.children).map((c) => c.textContent)),
  html_in_cells: Array.from(a.querySelectorAll('table.procs tbody td')).filter((c) => c.children.length > 0 && !c.querySelector('button')).length,
}))
"""

FOCUS = """
(() => { const e = document.activeElement; if (!e) return null;
  const label = e.getAttribute('aria-label') || e.textContent.trim().slice(0, 40);
  return e.tagName.toLowerCase() + (e.getAttribute('role') ? '[' + e.getAttribute('role') + ']' : '') + ':' + label; })()
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", required=True, help="folder for the screenshots")
    parser.add_argument("--report", help="write the JSON report here (default: stdout)")
    parser.add_argument("--expect-gpus", type=int, default=1)
    parser.add_argument("--history-range", help="FROM_MS,TO_MS: also open the page zoomed there (#live?from=&to=)")
    parser.add_argument("--zoom-gpu", help="UUID: in --history-range, drag across this GPU's chart to zoom in")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {"requests": [], "console": [], "steps": []}

    def step(name):
        report["steps"].append(name)

    try:
        with Browser() as b:
            b.on(requests_and_console(report))
            b.viewport(1280, 800)
            b.navigate(args.url)
            step("loaded")
            b.wait_for("document.querySelectorAll('#panel-live article.gpu').length >= %d && document.querySelector('#panel-live').dataset.loadedMs" % args.expect_gpus, 30)
            b.wait_for("document.querySelectorAll('#panel-live table.procs tbody tr').length > 0", 30)
            report["first_load_ms"] = b.evaluate("Number(document.querySelector('#panel-live').dataset.loadedMs)")
            report["tables"] = b.evaluate(TABLES)
            report["now"] = b.evaluate("fetch('/api/now').then((r) => r.json())")
            # Markup in a command line must stay text: nothing it holds may have run.
            report["pwned"] = b.evaluate("typeof window.pwned")
            step("tables")
            b.screenshot(os.path.join(args.out, "live-1280x800.png"), full_page=False)

            # A live tick: the sequence number shown moves on.
            seq0 = b.evaluate("Number(document.querySelector('#panel-live').dataset.seq || 0)")
            b.wait_for("Number(document.querySelector('#panel-live').dataset.seq || 0) > %d" % seq0, 20)
            report["live"] = {
                "seq_before": seq0,
                "seq_after": b.evaluate("Number(document.querySelector('#panel-live').dataset.seq)"),
                "last_text": b.evaluate("document.getElementById('live-last').textContent"),
            }
            step("live tick")

            # The whole history.
            before = b.evaluate("Number(document.querySelector('#panel-live').dataset.loadedMs)")
            b.evaluate("document.querySelector('button[data-zoom=null]').click()")
            b.wait_for("document.querySelector('button[data-zoom=null]').getAttribute('aria-pressed') === 'true'", 5)
            time.sleep(0.5)
            b.wait_for("window.vramctl.liveCharts().every((c) => c.points > 0)", 30)
            report["all"] = b.evaluate("window.vramctl.liveCharts()")
            b.screenshot(os.path.join(args.out, "live-all-history-1280x800.png"), full_page=True)
            step("zoom all")

            # 5 minutes, then a drag across the first chart.
            b.evaluate("document.querySelector('button[data-zoom=\"300000\"]').click()")
            time.sleep(1.0)
            b.wait_for("window.vramctl.liveCharts().length > 0 && window.vramctl.liveCharts()[0].scale", 20)
            report["five_min"] = b.evaluate("window.vramctl.liveCharts()")
            box = b.evaluate("(() => { const r = document.querySelector('#panel-live .u-over').getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()")
            b.evaluate("window.scrollTo(0, 0)")
            box = b.evaluate("(() => { const r = document.querySelector('#panel-live .u-over').getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()")
            n_requests = len(report["requests"])
            # The right end: the server has been sampling for seconds only.
            b.drag(box[0] + box[2] * 0.70, box[1] + box[3] / 2, box[0] + box[2] * 0.99)
            b.wait_for("document.querySelector('button[data-live]').getAttribute('aria-pressed') === 'false'", 10)
            time.sleep(1.0)
            report["zoomed"] = b.evaluate("window.vramctl.liveCharts()")
            report["zoom_requests"] = [u for u in report["requests"][n_requests:] if "/api/history" in u]
            b.screenshot(os.path.join(args.out, "live-zoomed-1280x800.png"), full_page=False)
            step("zoom drag")
            b.evaluate("document.querySelector('button[data-live]').click()")
            time.sleep(1.0)

            # A process's detail.
            b.evaluate("document.querySelector('#panel-live table.procs tbody button[data-pid]').click()")
            b.wait_for("!document.querySelector('#panel-live .detail').hidden && document.querySelector('#panel-live .detail .chart').dataset.points", 20)
            report["detail"] = b.evaluate("({title: document.querySelector('#detail-title').textContent, points: Number(document.querySelector('#panel-live .detail .chart').dataset.points), focused: document.activeElement && document.activeElement.id})")
            b.evaluate("document.querySelector('#panel-live .detail').scrollIntoView()")
            b.screenshot(os.path.join(args.out, "live-detail-1280x800.png"), full_page=False)
            step("detail")

            # The keyboard: focus from the top of the page through the controls.
            b.evaluate("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0)")
            focus = []
            for _ in range(12):
                b.key("Tab", "Tab", 9)
                focus.append(b.evaluate(FOCUS))
            report["focus_order"] = focus
            step("keyboard")

            # axe-core on the main view.
            with open(AXE, encoding="utf-8") as f:
                b.evaluate(f.read() + "\n;true")
            axe = b.evaluate("axe.run(document, {resultTypes: ['violations']}).then((r) => r.violations.map((v) => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 5).map((n) => n.target.join(' '))})))", timeout=120)
            report["axe"] = {"version": b.evaluate("axe.version"), "violations": axe}
            step("axe")

            # A link to a recorded range.
            if args.history_range:
                start, end = args.history_range.split(",")
                b.navigate("about:blank")
                b.navigate(args.url.rstrip("/") + "/#live?from=%s&to=%s" % (start, end))
                b.wait_for("document.querySelector('#panel-live').dataset.loadedMs && document.querySelector('#panel-live').dataset.marks", 60)
                time.sleep(0.5)
                report["recorded"] = {
                    "charts": b.evaluate("window.vramctl.liveCharts()"),
                    "marks": b.evaluate("Number(document.querySelector('#panel-live').dataset.marks)"),
                    "labels": b.evaluate("Array.from(document.querySelectorAll('#panel-live .chart[role=img]')).map((c) => c.getAttribute('aria-label'))"),
                }
                b.screenshot(os.path.join(args.out, "live-recorded-range-1280x800.png"), full_page=False)
                if args.zoom_gpu:
                    over = "#panel-live article[data-uuid='%s'] .u-over" % args.zoom_gpu
                    b.evaluate("document.querySelector(\"%s\").scrollIntoView({block: 'center'})" % over)
                    box = b.evaluate("(() => { const r = document.querySelector(\"%s\").getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()" % over)
                    n_requests = len(report["requests"])
                    b.drag(box[0] + box[2] * 0.10, box[1] + box[3] / 2, box[0] + box[2] * 0.45)
                    b.wait_for("location.hash.indexOf('from=%s') < 0" % start, 10)
                    time.sleep(1.0)
                    b.wait_for("document.querySelector('#panel-live').dataset.loadedMs", 20)
                    report["recorded_zoomed"] = b.evaluate("window.vramctl.liveCharts()")
                    report["recorded_zoom_requests"] = [u for u in report["requests"][n_requests:] if "/api/history" in u]
                    b.screenshot(os.path.join(args.out, "live-recorded-zoomed-1280x800.png"), full_page=False)
                step("recorded range")

            # Phone width.
            b.viewport(390, 844, mobile=True)
            b.navigate(args.url)
            b.wait_for("document.querySelectorAll('#panel-live table.procs tbody tr').length > 0 && document.querySelector('#panel-live').dataset.loadedMs", 30)
            time.sleep(0.5)
            report["phone"] = b.evaluate("({scroll_width: document.documentElement.scrollWidth, client_width: document.documentElement.clientWidth})")
            b.screenshot(os.path.join(args.out, "live-phone-390.png"), full_page=False)
            step("phone")
        report["ok"] = True
    except (CdpError, OSError, KeyError, TypeError, ValueError) as err:
        report["ok"] = False
        report["error"] = "%s: %s" % (type(err).__name__, err)
        report["trace"] = traceback.format_exc()
    return write_report(report, args.report)


if __name__ == "__main__":
    sys.exit(main())
