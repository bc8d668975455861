#!/usr/bin/env bash
# The crates as `cargo publish` would upload them (docs/packaging.md; .ci/run calls it):
#
#   scripts/check-crates.sh            # the lists, then `cargo package` with its verify build
#   scripts/check-crates.sh --no-verify
#
# Checks each published crate's file list (`cargo package --list`): no tests, benchmarks,
# examples or test data, and what the code compiles in is there (the agent's Python
# sources in vramctl-agent, the chart font and build.rs in vramctl); fake-nvml is never
# published. Then `cargo package` packs the eight crates together (this cargo resolves
# their dependencies on each other among the packed crates) and, unless --no-verify,
# builds the packed vramctl as `cargo install vramctl` would build it from crates.io.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "scripts/check-crates.sh: error: $*" >&2; exit 1; }
verify=()
case "${1:-}" in
  "") ;;
  --no-verify) verify=(--no-verify) ;;
  *) echo "usage: scripts/check-crates.sh [--no-verify]" >&2; exit 2 ;;
esac

# Every publishable workspace crate, each after the crates it depends on (cargo metadata),
# so a crate added to the workspace is packed and verified without editing this list.
mapfile -t crates < <(cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
meta = json.load(sys.stdin)
ours = {p["name"]: p for p in meta["packages"] if p.get("publish") != []}
done, order = set(), []
def visit(name):
    if name in done:
        return
    done.add(name)
    for d in ours[name]["dependencies"]:
        if d["name"] in ours and d["kind"] is None:
            visit(d["name"])
    order.append(name)
for name in sorted(ours):
    visit(name)
print(*order, sep=chr(10))')
[ "${#crates[@]}" -ge 2 ] || fail "cargo metadata listed no publishable crates"
for crate in "${crates[@]}"; do
  list=$(cargo package -p "$crate" --list --allow-dirty 2>/dev/null)
  if leaked=$(grep -E '^(tests|benches|examples|testdata|fixtures)/|fake|\.(db|pickle|gz)$' <<<"$list"); then
    fail "$crate would publish: $leaked"
  fi
  grep -qE '^src/(lib|main).rs$' <<<"$list" || fail "$crate's list has neither src/lib.rs nor src/main.rs"
  echo "$crate: $(wc -l <<<"$list") files"
done
cargo package -p vramctl-agent --list --allow-dirty 2>/dev/null | grep -qx 'agent-sources/_ops.py' ||
  fail "vramctl-agent would publish without the agent's sources (agent-sources/)"
for file in build.rs assets/fonts/DejaVuSans-subset.ttf src/main.rs; do
  cargo package -p vramctl --list --allow-dirty 2>/dev/null | grep -qx "$file" || fail "vramctl would publish without $file"
done
publish=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print([p["publish"] for p in json.load(sys.stdin)["packages"] if p["name"] == "fake-nvml"][0])')
[ "$publish" = "[]" ] || fail "fake-nvml is publishable (publish = $publish)"

# The verify build resolves the packed crates through a local registry whose sources cargo
# unpacks under $CARGO_HOME/registry/src/ and reuses by name and version: an earlier run's
# vramctl-core 0.1.0 was built instead of this one (a function added since was "not found").
# So our crates' unpacked copies are removed first; cargo unpacks the new ones.
version=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print([p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "vramctl-core"][0])')
for crate in "${crates[@]}"; do
  rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$crate-$version"
done
args=()
for crate in "${crates[@]}"; do args+=(-p "$crate"); done
cargo package "${args[@]}" --allow-dirty --locked "${verify[@]}" 2>&1 |
  grep -v '^warning: ignoring \(example\|test\|benchmark\) ' || fail "cargo package failed"
ls -l target/package/*.crate
