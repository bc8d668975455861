"""The agent's build, standard library only.

As a PEP 517 backend (pyproject.toml names it), so that `pip install ./python` works with
no network and no setuptools:
    pip install ./python
As a command, for a wheel to publish or copy (the `vramctl` binary embeds the same
sources itself, `vramctl_agent::agent_package`):
    python3 python/build_wheel.py OUTDIR      # prints OUTDIR/vramctl_agent-<v>-py3-none-any.whl

The wheel holds the `vramctl_agent` package and `vramctl_agent.pth` at the root of
site-packages (the `VRAMCTL_AGENT=1` hook). It is reproducible: files in sorted order, fixed
timestamps and modes, so the same sources give the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import sys
import tarfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "vramctl_agent"
DIST = "vramctl_agent"  # the wheel's file-name form of the project name
PROJECT = "vramctl-agent"
PTH = "vramctl_agent.pth"
# Fixed member timestamps (zip cannot store earlier than 1980).
EPOCH = (1980, 1, 1, 0, 0, 0)


def version() -> str:
    with open(os.path.join(HERE, PACKAGE, "_ops.py"), encoding="utf-8") as source:
        match = re.search(r'^AGENT_VERSION = "([^"]+)"', source.read(), re.M)
    if match is None:
        raise RuntimeError("AGENT_VERSION not found in vramctl_agent/_ops.py")
    return match.group(1)


def _sources() -> list[tuple[str, bytes]]:
    files = []
    for root, dirs, names in os.walk(os.path.join(HERE, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    files.append((os.path.relpath(path, HERE).replace(os.sep, "/"), f.read()))
    with open(os.path.join(HERE, PTH), "rb") as f:
        files.append((PTH, f.read()))
    return sorted(files)


def _metadata() -> bytes:
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {PROJECT}\n"
        f"Version: {version()}\n"
        "Summary: vramctl's in-process agent: allocator counters, cache release and snapshots over a Unix socket\n"
        "License: MIT OR Apache-2.0\n"
        "Requires-Python: >=3.8\n"
        "Classifier: Operating System :: POSIX :: Linux\n"
    ).encode()


def _wheel_info() -> bytes:
    return b"Wheel-Version: 1.0\nGenerator: vramctl build_wheel.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _dist_info() -> str:
    return f"{DIST}-{version()}.dist-info"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _add(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=EPOCH)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    name = f"{DIST}-{version()}-py3-none-any.whl"
    dist_info = _dist_info()
    members = _sources() + [
        (f"{dist_info}/METADATA", _metadata()),
        (f"{dist_info}/WHEEL", _wheel_info()),
        (f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode()),
    ]
    record = "\n".join(_record_line(n, d) for n, d in members) + f"\n{dist_info}/RECORD,,\n"
    os.makedirs(wheel_directory, exist_ok=True)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for member, data in members:
            _add(archive, member, data)
        _add(archive, f"{dist_info}/RECORD", record.encode())
    with open(os.path.join(wheel_directory, name), "wb") as out:
        out.write(buffer.getvalue())
    return name


def get_requires_for_build_wheel(config_settings=None) -> list:
    return []


def get_requires_for_build_sdist(config_settings=None) -> list:
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None) -> str:
    dist_info = _dist_info()
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    for name, data in (("METADATA", _metadata()), ("WHEEL", _wheel_info())):
        with open(os.path.join(metadata_directory, dist_info, name), "wb") as out:
            out.write(data)
    return dist_info


def build_sdist(sdist_directory, config_settings=None) -> str:
    base = f"{DIST}-{version()}"
    name = f"{base}.tar.gz"
    members = _sources() + [(p, open(os.path.join(HERE, p), "rb").read()) for p in ("pyproject.toml", "build_wheel.py")]
    members.append(("PKG-INFO", _metadata()))
    os.makedirs(sdist_directory, exist_ok=True)
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as archive:
        for member, data in sorted(members):
            info = tarfile.TarInfo(f"{base}/{member}")
            info.size, info.mode, info.mtime = len(data), 0o644, 315532800
            archive.addfile(info, io.BytesIO(data))
    return name


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python3 python/build_wheel.py OUTDIR", file=sys.stderr)
        sys.exit(2)
    print(os.path.join(sys.argv[1], build_wheel(sys.argv[1])))
