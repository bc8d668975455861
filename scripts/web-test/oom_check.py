#!/usr/bin/env python3
"""Opens the live page of a running `vramctl serve` in a real headless Chromium and reports
what it shows of one process's out-of-memory errors, as JSON, for the integration test
(crates/vramctl/tests/integration/web.rs) to check against the server's `/api/now`.

    python3 scripts/web-test/oom_check.py --url http://127.0.0.1:PORT/ --pid PID --out DIR [--report FILE]

Waits (up to --wait seconds) until the process's row in the table names a classified OOM
cause, reads the row, clicks the process and reads the detail's OOM sentence, screenshots
both. Exit status 0 when it could do all that (the test judges the report), 1 on a failure
to drive the page (with the reason in the report).
"""

import argparse
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cdp import Browser, requests_and_console, write_report, CdpError  # noqa: E402

ROW = "document.querySelector('#panel-live table.procs tbody tr[data-pid=\"%d\"]')"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--out", required=True, help="folder for the screenshots")
    parser.add_argument("--report", help="write the JSON report here (default: stdout)")
    parser.add_argument("--wait", type=float, default=60)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {"requests": [], "console": [], "steps": []}
    row = ROW % args.pid
    try:
        with Browser() as b:
            b.on(requests_and_console(report))
            b.viewport(1280, 800)
            b.navigate(args.url)
            b.wait_for("!!%s" % row, 30)
            report["steps"].append("row")
            # The cause arrives with a later tick: the agent's poll, then the worker.
            b.wait_for("!!%s.querySelector('td.oom') && !/classifying/.test(%s.querySelector('td.oom').textContent)" % (row, row), args.wait)
            report["row"] = b.evaluate("Array.from(%s.children).map((c) => c.textContent)" % row)
            report["row_html_in_cells"] = b.evaluate("Array.from(%s.children).slice(1).filter((c) => c.children.length > 0).length" % row)
            b.screenshot(os.path.join(args.out, "live-oom-row-1280x800.png"), full_page=False)
            report["steps"].append("cause in the row")
            b.evaluate("%s.querySelector('button[data-pid]').click()" % row)
            b.wait_for("!document.querySelector('#panel-live .detail').hidden && !!document.querySelector('#panel-live .detail p.oom')", 20)
            report["detail"] = b.evaluate("document.querySelector('#panel-live .detail p.oom').textContent")
            b.evaluate("document.querySelector('#panel-live .detail').scrollIntoView()")
            b.screenshot(os.path.join(args.out, "live-oom-detail-1280x800.png"), full_page=False)
            report["steps"].append("detail")
            report["now"] = b.evaluate("fetch('/api/now').then((r) => r.json())")
        report["ok"] = True
    except (CdpError, OSError, KeyError, TypeError, ValueError, json.JSONDecodeError) as err:
        report["ok"] = False
        report["error"] = "%s: %s" % (type(err).__name__, err)
        report["trace"] = traceback.format_exc()
    return write_report(report, args.report)


if __name__ == "__main__":
    sys.exit(main())
