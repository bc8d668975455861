#!/usr/bin/env python3
"""Turn a terminal screen captured with `tmux capture-pane -p -e` (text with ANSI colour
escapes) into a PNG, for docs/.

    python3 scripts/pane-to-png.py screen.ansi screen.png [--font-size 16]

Needs Pillow (Debian: python3-pil; PyPI: pillow) and a monospace TTF with box drawing,
block and braille characters (DejaVu Sans Mono: Debian fonts-dejavu-core). Handles SGR
bold, dim, reverse, the 16 basic colours, the 256-colour palette and 24-bit colour; other
escapes are dropped.
"""

import argparse
import re
import sys

from PIL import Image, ImageDraw, ImageFont

FONT_DIRS = [
    "/usr/share/fonts/truetype/dejavu/",
    "/usr/share/fonts/TTF/",
    "/usr/share/fonts/dejavu/",
]
BG = (24, 24, 27)
FG = (212, 212, 216)
# xterm-like 16 colours, tuned for a dark background.
BASIC = [
    (0, 0, 0), (205, 49, 49), (13, 188, 121), (229, 229, 16),
    (36, 114, 200), (188, 63, 188), (17, 168, 205), (229, 229, 229),
    (102, 102, 102), (241, 76, 76), (35, 209, 139), (245, 245, 67),
    (59, 142, 234), (214, 112, 214), (41, 184, 219), (255, 255, 255),
]


def palette(n):
    if n < 16:
        return BASIC[n]
    if n < 232:
        n -= 16
        steps = [0, 95, 135, 175, 215, 255]
        return (steps[n // 36], steps[(n // 6) % 6], steps[n % 6])
    level = 8 + 10 * (n - 232)
    return (level, level, level)


class Pen:
    def __init__(self):
        self.reset()

    def reset(self):
        self.fg = None
        self.bg = None
        self.bold = False
        self.dim = False
        self.reverse = False
        self.underline = False

    def apply(self, params):
        codes = [int(p) if p else 0 for p in params.split(";")] if params else [0]
        i = 0
        while i < len(codes):
            c = codes[i]
            if c == 0:
                self.reset()
            elif c == 1:
                self.bold = True
            elif c == 2:
                self.dim = True
            elif c == 4:
                self.underline = True
            elif c == 7:
                self.reverse = True
            elif c == 22:
                self.bold = self.dim = False
            elif c == 24:
                self.underline = False
            elif c == 27:
                self.reverse = False
            elif 30 <= c <= 37:
                self.fg = BASIC[c - 30]
            elif 90 <= c <= 97:
                self.fg = BASIC[c - 90 + 8]
            elif 40 <= c <= 47:
                self.bg = BASIC[c - 40]
            elif 100 <= c <= 107:
                self.bg = BASIC[c - 100 + 8]
            elif c == 39:
                self.fg = None
            elif c == 49:
                self.bg = None
            elif c in (38, 48) and i + 1 < len(codes):
                if codes[i + 1] == 5 and i + 2 < len(codes):
                    colour = palette(codes[i + 2])
                    i += 2
                elif codes[i + 1] == 2 and i + 4 < len(codes):
                    colour = tuple(codes[i + 2:i + 5])
                    i += 4
                else:
                    colour = None
                if c == 38:
                    self.fg = colour
                else:
                    self.bg = colour
            i += 1

    def colours(self):
        fg = self.fg or FG
        bg = self.bg or BG
        if self.dim:
            fg = tuple((a + b) // 2 for a, b in zip(fg, bg))
        if self.reverse:
            fg, bg = bg, fg
        return fg, bg


ESCAPE = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b[()][0-9A-Za-z]|\x1b.")


def parse(text):
    """Lines of (char, fg, bg, bold, underline) cells."""
    pen = Pen()
    lines = []
    for raw in text.split("\n"):
        cells = []
        pos = 0
        for m in ESCAPE.finditer(raw):
            for ch in raw[pos:m.start()]:
                fg, bg = pen.colours()
                cells.append((ch, fg, bg, pen.bold, pen.underline))
            if m.group(2) == "m":
                pen.apply(m.group(1))
            pos = m.end()
        for ch in raw[pos:]:
            fg, bg = pen.colours()
            cells.append((ch, fg, bg, pen.bold, pen.underline))
        lines.append(cells)
    while lines and not lines[-1]:
        lines.pop()
    return lines


# Braille dot bits (U+2800 + bits) and their (column, row) in the 2x4 cell.
BRAILLE_DOTS = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (0, 3), (1, 3)]


def draw_braille(draw, c, x0, y0, cw, ch, fg):
    """Braille patterns drawn as dots: many monospace fonts lack them (charts use them)."""
    bits = ord(c) - 0x2800
    r = max(1, cw // 6)
    for bit, (col, row) in enumerate(BRAILLE_DOTS):
        if bits & (1 << bit):
            cx = x0 + (col * 2 + 1) * cw / 4
            cy = y0 + (row * 2 + 1) * ch / 8
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fg)


def font(name, size):
    for d in FONT_DIRS:
        try:
            return ImageFont.truetype(d + name, size)
        except OSError:
            continue
    sys.exit(f"pane-to-png: font {name} not found in {FONT_DIRS}; install fonts-dejavu-core")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("capture")
    ap.add_argument("png")
    ap.add_argument("--font-size", type=int, default=16)
    ap.add_argument("--columns", type=int, default=0, help="pad or cut lines to this width")
    args = ap.parse_args()
    with open(args.capture, encoding="utf-8", errors="replace") as f:
        lines = parse(f.read())
    regular = font("DejaVuSansMono.ttf", args.font_size)
    bold = font("DejaVuSansMono-Bold.ttf", args.font_size)
    cw = round(regular.getlength("M"))
    ascent, descent = regular.getmetrics()
    ch = ascent + descent
    cols = args.columns or max((len(l) for l in lines), default=1)
    pad = 8
    img = Image.new("RGB", (cols * cw + 2 * pad, len(lines) * ch + 2 * pad), BG)
    draw = ImageDraw.Draw(img)
    for y, cells in enumerate(lines):
        for x, (c, fg, bg, is_bold, underline) in enumerate(cells[:cols]):
            x0, y0 = pad + x * cw, pad + y * ch
            if bg != BG:
                draw.rectangle([x0, y0, x0 + cw - 1, y0 + ch - 1], fill=bg)
            if 0x2800 < ord(c) <= 0x28FF:
                draw_braille(draw, c, x0, y0, cw, ch, fg)
            elif c != " ":
                draw.text((x0, y0), c, font=bold if is_bold else regular, fill=fg)
            if underline:
                draw.line([x0, y0 + ch - 2, x0 + cw - 1, y0 + ch - 2], fill=fg)
    img.save(args.png)


if __name__ == "__main__":
    main()
