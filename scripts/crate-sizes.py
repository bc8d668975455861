#!/usr/bin/env python3
"""Non-test lines and public items per crate (ARCHITECTURE.md "Rules the tests enforce").

    python3 scripts/crate-sizes.py

A line counts when it is not blank, not only a comment, and not inside a `#[cfg(test)]`
item; files under `tests/`, `benches/` and `examples/` and `tests.rs` files are left out.
Public items: lines declaring `pub fn|struct|enum|trait|type|const|static|mod|use` (methods
included, `pub(crate)` not). The architecture test checks the binary's share in Rust; this is
the quick look.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates")
PUB = re.compile(r"\s*pub (fn|struct|enum|trait|type|const|static|mod|use|async fn|unsafe fn) ")


def code_lines(src):
    out, skip, depth, pending = [], False, 0, False
    for line in src.split("\n"):
        s = line.strip()
        if skip:
            depth += line.count("{") - line.count("}")
            if depth <= 0:
                skip = False
            continue
        if s.startswith("#[cfg(test)]"):
            pending = True
            continue
        if pending:
            pending = False
            if s.endswith(";") and "{" not in s:
                continue
            depth = line.count("{") - line.count("}")
            skip = depth > 0
            continue
        if s and not s.startswith("//"):
            out.append(line)
    return out


def main():
    rows = []
    for crate in sorted(os.listdir(ROOT)):
        src = os.path.join(ROOT, crate, "src")
        if not os.path.isdir(src):
            continue
        lines = items = 0
        for d, _, files in os.walk(src):
            if os.sep + "tests" in d[len(src):]:
                continue
            for f in files:
                if f.endswith(".rs") and f != "tests.rs":
                    with open(os.path.join(d, f), encoding="utf-8") as fh:
                        code = code_lines(fh.read())
                    lines += len(code)
                    items += sum(1 for l in code if PUB.match(l))
        rows.append((crate, lines, items))
    total = sum(r[1] for r in rows)
    for crate, lines, items in rows:
        print(f"{crate:18} {lines:7} lines {100 * lines / total:5.1f} %  {items:4} public items")
    print(f"{'workspace':18} {total:7} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
