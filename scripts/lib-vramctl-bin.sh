# Sourced by the *-h200.sh scripts: sets $bin to the vramctl binary to check. The device
# machine has no Rust toolchain, so the binary is built elsewhere and carried in .dist/
# ($VRAMCTL names another); cargo builds it only where cargo exists. Exits 2 without one.
bin="${VRAMCTL:-.dist/vramctl}"
if [ ! -x "$bin" ]; then
  if command -v cargo > /dev/null; then
    cargo build --release -p vramctl
    bin=target/release/vramctl
  else
    echo "no vramctl binary at $bin (build it with cargo build --release and copy it there)" >&2
    exit 2
  fi
fi
