#!/usr/bin/env bash
# Installs the built wheel into a fresh virtual environment and runs what pip users run
# (docs/packaging.md; .ci/run calls it after scripts/build-wheel.sh):
#
#   scripts/test-wheel.sh [WHEEL]     # default: .dist/vramctl-*-manylinux*_x86_64.whl
#
# Checks: the install needs no network (--no-index), `vramctl --version` names this
# commit, `import vramctl_agent` works and the VRAMCTL_AGENT=1 hook (.pth) is installed,
# the installed vramctl runs the README's first command on the shipped recording, the
# binary asks for no glibc newer than 2.17 (manylinux2014), and the wheel holds no tests.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "scripts/test-wheel.sh: error: $*" >&2; exit 1; }

wheel=${1:-}
if [ -z "$wheel" ]; then
  wheel=$(ls -t .dist/vramctl-*-manylinux*_x86_64.whl 2>/dev/null | head -1) ||
    true
  [ -n "$wheel" ] || fail "no .dist/vramctl-*-manylinux*_x86_64.whl; run scripts/build-wheel.sh first"
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
venv=$scratch/venv

python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --no-index --disable-pip-version-check "$wheel"

version=$("$venv/bin/vramctl" --version)
echo "$version"
[[ "$version" =~ ^vramctl\ [0-9]+\.[0-9]+\.[0-9]+\ \(commit\ ([0-9a-f]{12}|unknown),\ built\ [0-9]{4}-[0-9]{2}-[0-9]{2}\)$ ]] ||
  fail "unexpected --version: '$version'"
if head=$(git rev-parse HEAD 2>/dev/null); then
  [[ "$version" == *"commit ${head:0:12},"* ]] || fail "--version does not name HEAD ${head:0:12}: '$version'"
fi

"$venv/bin/python" - <<'PY' || fail "vramctl_agent is not installed as it should be"
import os, sysconfig
import vramctl_agent, vramctl_agent.client  # the package and its client
site = sysconfig.get_paths()["purelib"]
assert vramctl_agent.__file__.startswith(site), vramctl_agent.__file__
assert os.path.isfile(os.path.join(site, "vramctl_agent.pth")), "no vramctl_agent.pth"
print("import vramctl_agent:", os.path.dirname(vramctl_agent.__file__))
PY

# The README's first command, with the installed binary (no GPU, the shipped recording).
leaks=$("$venv/bin/vramctl" --db examples/h200-recording.db leaks --since all --idle-for 1m --tz UTC)
grep -q 'PID 681 .*leak .*leaks' <<<"$leaks" || fail "the README's first command printed: $leaks"
echo "README's first command: $(grep -c 'PID ' <<<"$leaks") processes judged"

newest_glibc=$(objdump -T "$venv/bin/vramctl" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
[ "$(printf '%s\n' "$newest_glibc" GLIBC_2.17 | sort -V | tail -1)" = GLIBC_2.17 ] ||
  fail "the binary needs $newest_glibc, newer than manylinux2014's GLIBC_2.17"
echo "newest glibc symbol version: $newest_glibc"

if "$venv/bin/python" -m zipfile -l "$wheel" | grep -E '(^|/)tests?/'; then
  fail "the wheel holds tests"
fi
echo "scripts/test-wheel.sh: ok: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"
