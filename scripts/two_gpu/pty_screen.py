"""A terminal program's screen as text, without tmux: runs it in a pseudo-terminal of a given
size, keeps a small screen model of what it draws, and writes the screen at a chosen moment
(standard library only; for scripts/check-two-gpu-h200x2.sh's `top` checks, on machines
where tmux is not installed).

    python3 pty_screen.py --cols 160 --rows 50 --ready TEXT --out PREFIX
                          [--hook CMD] [--settle-s 1.5] [--timeout-s 30] -- PROGRAM ARGS...

Waits (at most --timeout-s) until the screen shows TEXT, then --settle-s more; runs
`CMD before` (a shell command: e.g. reading nvidia-smi), waits for the first line of the
screen to change (top's header holds the time of the sample on screen, so a changed header
is a sample drawn after CMD started) and for the output to go quiet, writes PREFIX.txt,
runs `CMD after`, then types `q` and waits for the program to end (SIGTERM after 5 s).
PREFIX.rc holds its exit status. Exit status: 0, or 1 when TEXT never showed.

The screen model (`Screen`) understands what a full-screen program drawn with crossterm
sends: cursor addressing (CUP/HVP, CHA, VPA, relative moves), erase in display and in line,
carriage return, line feed, backspace, tabs, the alternate screen, and it answers the two
queries a program may wait on (cursor position, device attributes). Colours, titles and
modes are read and dropped.
"""
import argparse
import codecs
import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

CSI = re.compile(r"\x1b\[([?>=!]?)([0-9;:]*)([ -/]*)([@-~])")


class Screen:
    """The cells of a rows x cols terminal and its cursor, fed text as the program wrote it."""

    def __init__(self, rows, cols):
        self.rows, self.cols = rows, cols
        self.clear()
        self.replies = []  # answers to queries, for the caller to write back
        self._pending = ""
        self._saved = (0, 0)

    def clear(self):
        self.grid = [[" "] * self.cols for _ in range(self.rows)]
        self.row = self.col = 0

    def text(self):
        return "\n".join("".join(line).rstrip() for line in self.grid) + "\n"

    def line(self, n):
        return "".join(self.grid[n]).rstrip()

    def _put(self, ch):
        if self.col >= self.cols:  # autowrap
            self.col = 0
            self._linefeed()
        self.grid[self.row][self.col] = ch
        self.col += 1

    def _linefeed(self):
        if self.row + 1 < self.rows:
            self.row += 1
        else:  # scroll up
            self.grid.pop(0)
            self.grid.append([" "] * self.cols)

    def _move(self, row, col):
        self.row = max(0, min(self.rows - 1, row))
        self.col = max(0, min(self.cols - 1, col))

    def _csi(self, private, params, final):
        nums = [int(p) if p.isdigit() else 0 for p in params.replace(":", ";").split(";")] if params else []

        def n(i, default=1):
            return nums[i] if len(nums) > i and nums[i] else default

        if private == "?":
            if final in "hl" and any(p in (47, 1047, 1049) for p in nums):
                self.clear()  # entering or leaving the alternate screen: a blank page
            return
        if final in "Hf":
            self._move(n(0) - 1, n(1) - 1)
        elif final == "A":
            self._move(self.row - n(0), self.col)
        elif final in "Be":
            self._move(self.row + n(0), self.col)
        elif final in "Ca":
            self._move(self.row, self.col + n(0))
        elif final == "D":
            self._move(self.row, self.col - n(0))
        elif final == "E":
            self._move(self.row + n(0), 0)
        elif final == "F":
            self._move(self.row - n(0), 0)
        elif final in "G`":
            self._move(self.row, n(0) - 1)
        elif final == "d":
            self._move(n(0) - 1, self.col)
        elif final == "J":
            mode = nums[0] if nums else 0
            if mode == 0:
                self.grid[self.row][self.col :] = [" "] * (self.cols - self.col)
                for r in range(self.row + 1, self.rows):
                    self.grid[r] = [" "] * self.cols
            elif mode == 1:
                for r in range(self.row):
                    self.grid[r] = [" "] * self.cols
                self.grid[self.row][: self.col + 1] = [" "] * (self.col + 1)
            else:
                self.grid = [[" "] * self.cols for _ in range(self.rows)]
        elif final == "K":
            mode = nums[0] if nums else 0
            line = self.grid[self.row]
            if mode == 0:
                line[self.col :] = [" "] * (self.cols - self.col)
            elif mode == 1:
                line[: self.col + 1] = [" "] * (self.col + 1)
            else:
                self.grid[self.row] = [" "] * self.cols
        elif final == "X":
            for c in range(self.col, min(self.cols, self.col + n(0))):
                self.grid[self.row][c] = " "
        elif final == "n" and nums[:1] == [6]:
            self.replies.append(f"\x1b[{self.row + 1};{self.col + 1}R")
        elif final == "c" and private == "":
            self.replies.append("\x1b[?62;22c")
        elif final == "s":
            self._saved = (self.row, self.col)
        elif final == "u" and private == "":
            self.row, self.col = self._saved
        # m (colours), r (scroll region), t (window ops), private modes: nothing to draw

    def feed(self, text):
        text = self._pending + text
        self._pending = ""
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\x1b":
                if i + 1 >= len(text):
                    self._pending = text[i:]
                    return
                nxt = text[i + 1]
                if nxt == "[":
                    m = CSI.match(text, i)
                    if m is None:
                        if re.fullmatch(r"\x1b\[[?>=!]?[0-9;:]*[ -/]*", text[i:]):
                            self._pending = text[i:]  # cut in the middle: wait for the rest
                            return
                        i += 2
                        continue
                    self._csi(m.group(1), m.group(2), m.group(4))
                    i = m.end()
                elif nxt == "]":  # OSC: to BEL or ST
                    end = min((j for j in (text.find("\x07", i), text.find("\x1b\\", i)) if j != -1), default=-1)
                    if end == -1:
                        self._pending = text[i:]
                        return
                    i = end + (1 if text[end] == "\x07" else 2)
                elif nxt in "()*+":
                    if i + 2 >= len(text):
                        self._pending = text[i:]
                        return
                    i += 3
                elif nxt == "7":
                    self._saved = (self.row, self.col)
                    i += 2
                elif nxt == "8":
                    self.row, self.col = self._saved
                    i += 2
                else:  # ESC =, ESC >, ESC M ...: modes, nothing drawn
                    i += 2
            elif ch == "\r":
                self.col = 0
                i += 1
            elif ch == "\n":
                self._linefeed()
                i += 1
            elif ch == "\b":
                self.col = max(0, self.col - 1)
                i += 1
            elif ch == "\t":
                self.col = min(self.cols - 1, (self.col // 8 + 1) * 8)
                i += 1
            elif ch < " " or ch == "\x7f":
                i += 1
            else:
                self._put(ch)
                i += 1


class Session:
    """PROGRAM in a pseudo-terminal, its output fed to a Screen."""

    def __init__(self, argv, rows, cols, env=None):
        self.screen = Screen(rows, cols)
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its terminal
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            try:
                os.execvpe(argv[0], argv, env if env is not None else os.environ)
            except OSError as e:
                os.write(2, f"cannot run {argv[0]}: {e}\n".encode())
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.status = None

    def pump(self, seconds):
        """Reads what the program draws for up to `seconds`; True while it runs."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return True
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # EIO: the program closed the terminal
                data = b""
            if not data:
                self.wait(0.0)
                return False
            self.screen.feed(self.decoder.decode(data))
            for reply in self.screen.replies:
                os.write(self.fd, reply.encode())
            self.screen.replies.clear()

    def quiet(self, gap_s=0.15, limit_s=3.0):
        """Reads until nothing came for gap_s (a frame is drawn whole), at most limit_s."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], gap_s)
            if not ready:
                return
            self.pump(0.01)

    def wait_for(self, predicate, timeout_s):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self.screen):
                return True
            if not self.pump(0.05):
                return predicate(self.screen)
        return False

    def type(self, keys):
        os.write(self.fd, keys.encode())

    def wait(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        while self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() >= deadline:
                break
            self.pump(0.05)
        return self.status

    def stop(self):
        if self.wait(5.0) is None:
            os.kill(self.pid, signal.SIGTERM)
            if self.wait(3.0) is None:
                os.kill(self.pid, signal.SIGKILL)
                self.wait(3.0)
        os.close(self.fd)
        return self.status


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cols", type=int, default=160)
    p.add_argument("--rows", type=int, default=50)
    p.add_argument("--ready", required=True, help="text the screen shows once it is drawn")
    p.add_argument("--out", required=True, help="PREFIX: PREFIX.txt is the screen, PREFIX.rc the exit status")
    p.add_argument("--hook", help="shell command run with 'before' and 'after' around the capture")
    p.add_argument("--settle-s", type=float, default=1.5)
    p.add_argument("--timeout-s", type=float, default=30.0)
    p.add_argument("argv", nargs="+")
    args = p.parse_args()
    env = dict(os.environ, TERM=os.environ.get("TERM_FOR_PTY", "xterm-256color"), NO_COLOR="1")
    s = Session(args.argv, args.rows, args.cols, env)
    ok = s.wait_for(lambda sc: args.ready in sc.text(), args.timeout_s)
    if ok:
        s.pump(args.settle_s)
        header = s.screen.line(0)
        if args.hook:
            subprocess.run(f"{args.hook} before", shell=True, check=False)
        # A frame drawn after the hook began: its sample is at least as new as the hook's.
        s.wait_for(lambda sc: sc.line(0) != header, 5.0)
        s.quiet()
    with open(args.out + ".txt", "w") as f:
        f.write(s.screen.text())
    if ok and args.hook:
        subprocess.run(f"{args.hook} after", shell=True, check=False)
    s.type("q")
    status = s.stop()
    with open(args.out + ".rc", "w") as f:
        f.write(f"{status}\n")
    if not ok:
        print(f"pty_screen: {args.ready!r} never showed in {args.timeout_s:.0f} s", file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
