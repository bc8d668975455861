#!/usr/bin/env bash
# Builds vramctl's Debian package into .dist/ (docs/packaging.md) with cargo-deb:
#
#   scripts/build-deb.sh              # cargo build --release, then the package
#   scripts/build-deb.sh --no-build   # package the binary scripts/build-wheel.sh built
#                                     # (target/x86_64-unknown-linux-gnu/release, glibc 2.17)
#
# The package holds /usr/bin/vramctl, a man page per command and the bash, zsh and fish
# completions, all made here by that same binary (`vramctl man`, `vramctl completions`), the
# systemd units of deploy/systemd (ExecStart in /usr/bin; installed, not enabled), the
# maintainer scripts of deploy/debian (the `vramctl` system user), README, CHANGELOG and
# the Prometheus/Grafana/Kubernetes files as examples. cargo-deb is installed with
# `cargo install` if missing (about a minute on 2 cores). SOURCE_DATE_EPOCH is the
# commit's time unless set, so the package's file times and `--version`'s date are the
# commit's.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0
no_build=0
case "${1:-}" in
  "") ;;
  --no-build) no_build=1 ;;
  *) echo "usage: scripts/build-deb.sh [--no-build]" >&2; exit 2 ;;
esac

if ! cargo deb --version 2>/dev/null | grep -qx "cargo-deb $CARGO_DEB_VERSION"; then
  echo "scripts/build-deb.sh: installing cargo-deb $CARGO_DEB_VERSION" >&2
  cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked
fi

if [ -z "${SOURCE_DATE_EPOCH:-}" ] && commit_time=$(git log -1 --format=%ct 2>/dev/null); then
  export SOURCE_DATE_EPOCH=$commit_time
fi

target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
if [ "$no_build" = 1 ]; then
  target=x86_64-unknown-linux-gnu
  binary=$target_dir/$target/release/vramctl
  if [ ! -x "$binary" ]; then
    echo "scripts/build-deb.sh: error: no '$binary'; run scripts/build-wheel.sh first, or drop --no-build" >&2
    exit 2
  fi
  target_args=(--target "$target")
else
  cargo build --release --locked -p vramctl
  binary=$target_dir/release/vramctl
  target_args=()
fi

# What the binary makes of itself, and the units with the packaged binary's path
# (crates/vramctl/Cargo.toml's [package.metadata.deb] names these paths).
stage=.packaging/deb
rm -rf "$stage"
mkdir -p "$stage/completions" "$stage/systemd"
"$binary" man --dir "$stage/man" >/dev/null
"$binary" completions bash >"$stage/completions/vramctl.bash"
"$binary" completions zsh >"$stage/completions/_vramctl"
"$binary" completions fish >"$stage/completions/vramctl.fish"
for unit in deploy/systemd/*.service; do
  {
    echo "# Installed by vramctl's Debian package: the binary is /usr/bin/vramctl."
    sed 's|^ExecStart=/usr/local/bin/vramctl|ExecStart=/usr/bin/vramctl|' "$unit"
  } >"$stage/systemd/$(basename "$unit")"
  grep -q '^ExecStart=/usr/bin/vramctl ' "$stage/systemd/$(basename "$unit")" || {
    echo "scripts/build-deb.sh: error: '$unit' has no ExecStart=/usr/local/bin/vramctl to point at /usr/bin" >&2
    exit 2
  }
done

mkdir -p .dist
cargo deb -p vramctl --no-build "${target_args[@]}" --output .dist/
