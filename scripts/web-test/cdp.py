"""A small Chrome DevTools Protocol client over --remote-debugging-pipe (standard library only).

Chromium reads commands from file descriptor 3 and writes answers and events to 4, each a
JSON message ended by a NUL byte: no websocket, no port, nothing another user on the
machine can connect to. One page target, attached in flat mode (commands carry its
sessionId).
"""

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time


class CdpError(Exception):
    pass


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """A headless Chromium driven over the pipe; use as a context manager."""

    def __init__(self, chromium=None, width=1280, height=800):
        self.chromium = chromium or find_chromium()
        if not self.chromium:
            raise CdpError("chromium is not installed (apt-get install chromium)")
        self.profile = tempfile.mkdtemp(prefix="vramctl-cdp-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # The child's ends above 4, so the shell's moves to 3 and 4 never close one of them.
        to_chrome_r = self._high(to_chrome_r)
        from_chrome_w = self._high(from_chrome_w)
        args = [
            "--headless=new", "--remote-debugging-pipe", "--user-data-dir=" + self.profile,
            "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-default-apps", "--disable-domain-reliability", "--metrics-recording-only",
            "--mute-audio", "--disable-gpu", "--hide-scrollbars",
            "--window-size=%d,%d" % (width, height),
        ]
        if os.geteuid() == 0:
            # Chromium refuses to run its sandbox as root; CI runs as root.
            args.append("--no-sandbox")
        # bash (dash takes one-digit descriptors only) puts the pipe ends on 3 and 4, where
        # Chromium expects them.
        script = 'exec "$0" "$@" 3<&%d 4>&%d %d<&- %d>&-' % (
            to_chrome_r, from_chrome_w, to_chrome_r, from_chrome_w)
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", script, self.chromium] + args + ["about:blank"],
            pass_fds=(to_chrome_r, from_chrome_w),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id = 0
        self._lock = threading.Lock()
        self._waiting = {}
        self.events = queue.Queue()
        self._listeners = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._stderr = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.session = None

    @staticmethod
    def _high(fd):
        moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(fd)
        return moved

    def _drain_stderr(self):
        for line in self.proc.stderr:
            if len(self._stderr) < 200:
                self._stderr.append(line.decode("utf-8", "replace").rstrip())

    def _read(self):
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_chrome, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                for slot in list(self._waiting.values()):
                    slot.put({"error": {"message": "chromium closed the pipe"}})
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                message = json.loads(raw.decode("utf-8"))
                if "id" in message:
                    slot = self._waiting.pop(message["id"], None)
                    if slot:
                        slot.put(message)
                else:
                    for listener in list(self._listeners):
                        listener(message)
                    self.events.put(message)

    def on(self, listener):
        """Calls listener(message) for every event, on the reader thread."""
        self._listeners.append(listener)

    def send(self, method, params=None, session=True, timeout=60):
        with self._lock:
            self._next_id += 1
            mid = self._next_id
            slot = queue.Queue(1)
            self._waiting[mid] = slot
            message = {"id": mid, "method": method, "params": params or {}}
            if session and self.session:
                message["sessionId"] = self.session
            data = json.dumps(message).encode("utf-8") + b"\0"
            while data:
                data = data[os.write(self._to_chrome, data):]
        try:
            answer = slot.get(timeout=timeout)
        except queue.Empty:
            raise CdpError("%s: no answer in %s s" % (method, timeout))
        if "error" in answer:
            raise CdpError("%s: %s" % (method, answer["error"].get("message")))
        return answer.get("result", {})

    def open_page(self):
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)
        attached = self.send("Target.attachToTarget",
                             {"targetId": target["targetId"], "flatten": True}, session=False)
        self.session = attached["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log", "Performance"):
            self.send(domain + ".enable")

    def wait_event(self, method, timeout=30, predicate=None):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError("no %s event in %s s" % (method, timeout))
            try:
                message = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if message.get("method") == method and (predicate is None or predicate(message["params"])):
                return message["params"]

    def navigate(self, url, timeout=30):
        while not self.events.empty():
            self.events.get_nowait()
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired", timeout)

    def evaluate(self, expression, timeout=60):
        result = self.send("Runtime.evaluate", {
            "expression": expression, "awaitPromise": True, "returnByValue": True,
            "userGesture": True}, timeout=timeout)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CdpError("page error: %s" % text)
        return result["result"].get("value")

    def wait_for(self, expression, timeout=30, interval=0.1):
        """Polls until `expression` is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.evaluate(expression)
            if last:
                return last
            time.sleep(interval)
        raise CdpError("timed out after %s s waiting for %s (last: %r)" % (timeout, expression, last))

    def viewport(self, width, height, mobile=False):
        self.send("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile})

    def screenshot(self, path, full_page=True):
        params = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = self.send("Page.captureScreenshot", params)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def mouse(self, kind, x, y, buttons=0, button="none"):
        self.send("Input.dispatchMouseEvent", {
            "type": kind, "x": x, "y": y, "button": button, "buttons": buttons, "clickCount": 1})

    def drag(self, x0, y, x1, steps=8):
        self.mouse("mouseMoved", x0, y)
        self.mouse("mousePressed", x0, y, buttons=1, button="left")
        for k in range(1, steps + 1):
            self.mouse("mouseMoved", x0 + (x1 - x0) * k / steps, y, buttons=1, button="left")
        self.mouse("mouseReleased", x1, y, buttons=0, button="left")

    def key(self, key, code=None, key_code=0, shift=False):
        params = {"key": key, "code": code or key, "windowsVirtualKeyCode": key_code,
                  "modifiers": 8 if shift else 0}
        self.send("Input.dispatchKeyEvent", dict(params, type="rawKeyDown"))
        self.send("Input.dispatchKeyEvent", dict(params, type="keyUp"))

    def metrics(self):
        return {m["name"]: m["value"] for m in self.send("Performance.getMetrics")["metrics"]}

    def close(self):
        try:
            self.send("Browser.close", session=False, timeout=5)
        except CdpError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        self.open_page()
        return self

    def __exit__(self, *exc):
        self.close()


def requests_and_console(report):
    """A listener for `Browser.on` that keeps every request's URL in report["requests"]
    (the checks prove none leaves loopback) and every exception, console error or warning in
    report["console"] (the checks want none)."""
    def listen(message):
        method = message.get("method")
        params = message.get("params", {})
        if method == "Network.requestWillBeSent":
            report["requests"].append(params["request"]["url"])
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            report["console"].append("exception: " + str(details.get("exception", {}).get("description") or details.get("text")))
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            if entry.get("level") in ("error", "warning"):
                report["console"].append("%s: %s %s" % (entry.get("level"), entry.get("text"), entry.get("url", "")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
            report["console"].append("console.%s: %s" % (params.get("type"), " ".join(str(a.get("value", a.get("description"))) for a in params.get("args", []))))
    return listen


def write_report(report, path):
    """Writes a check's report as JSON to `path` (stdout without one); the check's exit code:
    0 when report["ok"]."""
    text = json.dumps(report, indent=1)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text)
    return 0 if report["ok"] else 1
