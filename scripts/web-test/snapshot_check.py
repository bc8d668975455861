#!/usr/bin/env python3
"""Drives the snapshot mode of a running `vramctl snapshot view FILE` in a real headless
Chromium and reports what the page showed, as JSON, for the integration test
(crates/vramctl/tests/integration/snapshot_view.rs) to check against the server's own
answers. Saves screenshots under --out.

    python3 scripts/web-test/snapshot_check.py --url http://127.0.0.1:PORT/ --out DIR [--report FILE]

In order: loads the page at 1280x800 and waits for the timeline; records every request the
page makes and every console error or CSP report; reads the chart's canvas (how many
pixels are neither white nor transparent); hovers over the tallest bucket's bands and reads
the stack shown; clicks there and waits for the segments at that event; opens the state
at the first OOM event from its button; drags across the chart to zoom; walks the controls
with Tab; then the phone width. Exit status 0 when it could do all that (the test judges
the report), 1 on a failure to drive the page (with the reason in the report).
"""

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cdp import Browser, requests_and_console, write_report, CdpError  # noqa: E402

PANEL = "document.querySelector('#panel-snapshot')"

# Pixels of the chart's canvas that are drawn (not white, not transparent), sampled.
DRAWN = """
(() => { const c = document.querySelector('#panel-snapshot .uplot canvas'); if (!c) return 0;
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
  for (let i = 0; i < d.length; i += 4 * 7) { if (d[i + 3] > 0 && (d[i] < 245 || d[i + 1] < 245 || d[i + 2] < 245)) n++; }
  return n; })()
"""

FOCUS = """
(() => { const e = document.activeElement; if (!e) return null;
  const label = e.getAttribute('aria-label') || e.textContent.trim().slice(0, 40);
  return e.tagName.toLowerCase() + ':' + label; })()
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", required=True, help="folder for the screenshots")
    parser.add_argument("--report", help="write the JSON report here (default: stdout)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {"requests": [], "console": [], "steps": []}
    url = args.url.split("#")[0] + "#snapshot"

    def step(name):
        report["steps"].append(name)

    try:
        with Browser() as b:
            b.on(requests_and_console(report))
            b.viewport(1280, 800)
            t0 = time.monotonic()
            b.navigate(url)
            b.wait_for(PANEL + ".dataset.loaded", 60)
            report["first_timeline_s"] = round(time.monotonic() - t0, 3)
            time.sleep(0.3)
            report["drawn"] = b.evaluate("Object.assign({}, %s.dataset)" % PANEL)
            report["drawn_pixels"] = b.evaluate(DRAWN)
            report["range_text"] = b.evaluate("document.querySelector('#panel-snapshot p.status').textContent")
            report["timeline"] = b.evaluate("fetch('/api/snapshot/timeline?file=0&device=0&width=' + %s.dataset.buckets + '&bands=' + 400).then((r) => r.json()).then((t) => ({peak_event: t.peak_event, events: t.events, bands: t.bands.length, oom: t.oom.map((o) => ({event: o.event, line: o.line, advice: o.advice}))}))" % PANEL)
            step("timeline")
            b.screenshot(os.path.join(args.out, "snapshot-1280x800.png"), full_page=True)

            # Hover over the tallest bucket, a third of the way up its live bytes: inside a band.
            box = b.evaluate("(() => { const r = document.querySelector('#panel-snapshot .u-over').getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()")
            report["over_box"] = box
            # The chart's x scale is the event index: aim at the peak's bucket by its share.
            peak = report["timeline"]["peak_event"]
            events = max(1, report["timeline"]["events"] - 1)
            x = box[0] + box[2] * peak / events
            y = box[1] + box[3] * 0.85
            b.mouse("mouseMoved", x, y)
            time.sleep(0.3)
            report["hover"] = b.evaluate("document.getElementById('snapshot-hover').textContent")
            b.screenshot(os.path.join(args.out, "snapshot-hover-1280x800.png"), full_page=False)
            step("hover")

            # A click there: the segments at that event.
            b.mouse("mousePressed", x, y, buttons=1, button="left")
            b.mouse("mouseReleased", x, y, buttons=0, button="left")
            b.wait_for(PANEL + ".dataset.stateEvent !== undefined", 30)
            report["clicked_state_event"] = int(b.evaluate(PANEL + ".dataset.stateEvent"))
            report["state_head"] = b.evaluate("document.getElementById('snapshot-state-head').textContent")
            report["segment_canvas_rows_px"] = b.evaluate("document.querySelector('#panel-snapshot .detail canvas').height")
            b.evaluate("document.getElementById('snapshot-state-head').scrollIntoView()")
            b.screenshot(os.path.join(args.out, "snapshot-segments-1280x800.png"), full_page=False)
            step("segments")

            # The first OOM's button, if any.
            report["oom_text"] = b.evaluate("Array.from(document.querySelectorAll('#snapshot-oom pre')).map((p) => p.textContent)")
            if b.evaluate("!!document.querySelector('#snapshot-oom button')"):
                b.evaluate("document.querySelector('#snapshot-oom button').click()")
                first = report["timeline"]["oom"][0]["event"]
                b.wait_for(PANEL + ".dataset.stateEvent === '%d'" % first, 30)
                report["oom_state_head"] = b.evaluate("document.getElementById('snapshot-state-head').textContent")
                b.evaluate("document.getElementById('snapshot-oom').scrollIntoView()")
                b.screenshot(os.path.join(args.out, "snapshot-oom-1280x800.png"), full_page=False)
                step("oom")

            # Zoom: drag across the middle half of the chart.
            b.evaluate("window.scrollTo(0, 0)")
            box = b.evaluate("(() => { const r = document.querySelector('#panel-snapshot .u-over').getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()")
            before = b.evaluate(PANEL + ".dataset.loaded")
            n = len(report["requests"])
            b.drag(box[0] + box[2] * 0.25, box[1] + box[3] / 2, box[0] + box[2] * 0.75)
            b.wait_for(PANEL + ".dataset.loaded !== '%s'" % before, 30)
            report["zoomed"] = b.evaluate("Object.assign({}, %s.dataset)" % PANEL)
            report["zoom_requests"] = [u for u in report["requests"][n:] if "/api/snapshot/timeline" in u]
            b.screenshot(os.path.join(args.out, "snapshot-zoomed-1280x800.png"), full_page=False)
            step("zoom")

            # The address keeps the zoom: a fresh load of it draws the same range.
            link = b.evaluate("location.href")
            report["zoom_link"] = link
            b.navigate("about:blank")
            b.navigate(link)
            b.wait_for(PANEL + ".dataset.loaded", 60)
            report["link_restored"] = b.evaluate("Object.assign({}, %s.dataset)" % PANEL)
            step("link")

            # The keyboard reaches the controls.
            b.evaluate("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0)")
            focus = []
            for _ in range(8):
                b.key("Tab", "Tab", 9)
                focus.append(b.evaluate(FOCUS))
            report["focus_order"] = focus
            step("keyboard")

            # axe-core (vendored beside cdp.py by the web view's tests) on the snapshot view.
            axe_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor", "axe-core", "axe.min.js")
            if os.path.isfile(axe_path):
                with open(axe_path, encoding="utf-8") as f:
                    b.evaluate(f.read() + "\n;true")
                report["axe"] = b.evaluate("axe.run(document, {resultTypes: ['violations']}).then((r) => r.violations.map((v) => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 5).map((n) => n.target.join(' '))})))", timeout=120)
                step("axe")

            b.viewport(390, 844, mobile=True)
            # Only the fragment would not change: a real load needs another page between.
            b.navigate("about:blank")
            b.navigate(url)
            b.wait_for(PANEL + ".dataset.loaded", 60)
            time.sleep(0.5)
            report["phone"] = b.evaluate("({scroll_width: document.documentElement.scrollWidth, client_width: document.documentElement.clientWidth})")
            b.screenshot(os.path.join(args.out, "snapshot-phone-390.png"), full_page=False)
            step("phone")
        report["ok"] = True
    except (CdpError, OSError, KeyError, TypeError, ValueError, IndexError) as err:
        report["ok"] = False
        report["error"] = "%s: %s" % (type(err).__name__, err)
        report["trace"] = traceback.format_exc()
    return write_report(report, args.report)


if __name__ == "__main__":
    sys.exit(main())
