#!/usr/bin/env bash
# Builds the `vramctl` wheel (pyproject.toml; docs/packaging.md) into .dist/:
#
#   scripts/build-wheel.sh [TARGET ...]     # default: x86_64-unknown-linux-gnu
#   scripts/build-wheel.sh x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu
#
# One wheel per target, manylinux2014 (glibc 2.17 and later: RHEL/CentOS 7+, Ubuntu
# 18.04+, Debian 9+): maturin links with zig (the `ziglang` package from PyPI) against
# glibc 2.17's symbols, so no manylinux container is needed, and cross-compiles aarch64
# the same way (its Rust target is added with rustup if missing). maturin and ziglang are
# installed, pinned, into a virtual environment under target/ (VRAMCTL_PACKAGING_VENV).
#
# The x86-64 build leaves its binary in target/x86_64-unknown-linux-gnu/release/vramctl,
# which `scripts/build-deb.sh --no-build` packages: one release build for both.
# SOURCE_DATE_EPOCH is the commit's time unless set, so `vramctl --version`'s date and the
# wheel's file times are the commit's.
set -euo pipefail
cd "$(dirname "$0")/.."

MATURIN_VERSION=1.16.0
ZIGLANG_VERSION=0.17.1
venv=$(realpath -m "${VRAMCTL_PACKAGING_VENV:-target/packaging-venv}")
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(x86_64-unknown-linux-gnu)

if ! "$venv/bin/maturin" --version 2>/dev/null | grep -qx "maturin $MATURIN_VERSION" ||
  ! "$venv/bin/python" -m ziglang version >/dev/null 2>&1; then
  echo "scripts/build-wheel.sh: installing maturin $MATURIN_VERSION and ziglang $ZIGLANG_VERSION into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "maturin==$MATURIN_VERSION" "ziglang==$ZIGLANG_VERSION"
fi

if [ -z "${SOURCE_DATE_EPOCH:-}" ] && commit_time=$(git log -1 --format=%ct 2>/dev/null); then
  export SOURCE_DATE_EPOCH=$commit_time
fi

mkdir -p .dist
for target in "${targets[@]}"; do
  if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target"
  fi
  # maturin finds zig through the venv's `python -m ziglang`: the venv's bin goes first.
  # No --strip: the binary links with no symbols to strip (`strip` takes 16 bytes off
  # its 15.8 MB).
  PATH="$venv/bin:$PATH" "$venv/bin/maturin" build --release --zig \
    --compatibility manylinux2014 --target "$target" --out .dist
done
ls -l .dist/*.whl
