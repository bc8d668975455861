#!/usr/bin/env bash
# The project's one test command (README "Tests"; `.ci/run` calls it too):
#
#   scripts/test.sh [ARGS FOR cargo test ...]
#
# Besides the Rust toolchain the integration tests drive two programs for real:
# - promtool and prometheus (Debian's `prometheus` package): the exporter's tests lint its
#   output and alert rules and scrape it with a real Prometheus;
# - tmux: the `top` end-to-end test types keys into the real terminal UI;
# - podman and runc (with busybox-static for an image built from local files): the container
#   test runs a real container and checks that `ps` names it; it needs root.
# - slurmctld, slurmd, sbatch (Debian's `slurm-wlm`) and munged (`munge`): the Slurm tests
#   start a one-node cluster as root and run real jobs (they skip themselves, saying so, when
#   not root or when these are missing, unless VRAMCTL_TEST_STRICT=1).
# - chromium (Debian's `chromium`): the web view's test loads `serve`'s page in a real headless
#   browser over the DevTools protocol (scripts/web-test/; screenshots in
#   target/web-screenshots/); it skips itself, saying so, without it unless VRAMCTL_TEST_STRICT=1.
#   The fleet test renders the fleet view with `chromium --headless --dump-dom` and skips
#   only that part under VRAMCTL_SKIP_CHROMIUM=1 (set here when chromium is missing).
# Before them, the in-process agent's tests (python/tests, standard-library unittest, real
# interpreters with stand-in frameworks; as root they also act as other users) need python3.
# Both suites run whatever the other's result (exit status 1 if either failed; one summary
# line each at the end). They pass from a checkout other users cannot read (a 0700 home)
# and under `nohup`: what other users run is copied somewhere they can read it, and the
# tests' child processes start with SIGHUP/SIGINT/SIGTERM at their defaults.
# As root, a missing package is installed with apt-get. Otherwise this says which packages
# are missing, and the tests that need them are skipped (VRAMCTL_SKIP_PROMETHEUS=1,
# VRAMCTL_SKIP_TMUX=1) so that the rest still runs and passes; CI runs as root and never
# skips: it sets VRAMCTL_TEST_STRICT=1, which makes a program still missing after the install
# an error. VRAMCTL_TEST_NO_INSTALL=1 skips instead of installing, even as root.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian package per program the tests need.
declare -A package_of=([promtool]=prometheus [prometheus]=prometheus [tmux]=tmux
  [podman]=podman [runc]=runc [busybox]=busybox-static
  [slurmctld]=slurm-wlm [slurmd]=slurm-wlm [sbatch]=slurm-wlm [munged]=munge
  [chromium]=chromium)
# slurmctld, slurmd and munged live in /usr/sbin, not on every user's PATH.
PATH=$PATH:/usr/sbin:/sbin
missing=()
for program in promtool prometheus tmux podman runc busybox slurmctld slurmd sbatch munged chromium; do
  if ! command -v "$program" >/dev/null 2>&1; then
    package=${package_of[$program]}
    [[ " ${missing[*]} " == *" $package "* ]] || missing+=("$package")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && [ "${VRAMCTL_TEST_NO_INSTALL:-0}" != 1 ] && command -v apt-get >/dev/null 2>&1; then
    echo "scripts/test.sh: installing ${missing[*]} (Debian packages the integration tests drive)" >&2
    { apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } ||
      echo "scripts/test.sh: apt-get could not install ${missing[*]}" >&2
  else
    echo "scripts/test.sh: missing Debian package(s) ${missing[*]}; install them" \
      "(sudo apt-get install ${missing[*]}) to run every test — skipping the tests that need them" >&2
  fi
fi
# Whatever is still missing (not root, no apt-get, an install that failed) is skipped, loudly,
# or under VRAMCTL_TEST_STRICT=1 fails the run.
skip() {
  if [ "${VRAMCTL_TEST_STRICT:-0}" = 1 ]; then
    echo "scripts/test.sh: error: $1 is missing and VRAMCTL_TEST_STRICT=1" >&2
    exit 2
  fi
  echo "scripts/test.sh: skipping the tests that need $1" >&2
}
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  skip "promtool/prometheus"
  export VRAMCTL_SKIP_PROMETHEUS=1
fi
if ! command -v tmux >/dev/null 2>&1; then
  skip "tmux"
  export VRAMCTL_SKIP_TMUX=1
fi
if ! command -v podman >/dev/null 2>&1 || ! command -v busybox >/dev/null 2>&1; then
  skip "podman/busybox-static"
  export VRAMCTL_SKIP_PODMAN=1
elif [ "$(id -u)" != 0 ]; then
  # The container test runs rootful Podman; not a missing package, so never an error.
  echo "scripts/test.sh: skipping the podman test (it needs root)" >&2
  export VRAMCTL_SKIP_PODMAN=1
fi
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 ||
  ! command -v sbatch >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  skip "slurm-wlm/munge"
  export VRAMCTL_SKIP_SLURM=1
fi
if ! command -v chromium >/dev/null 2>&1; then
  # The web test skips itself without chromium, and fails under VRAMCTL_TEST_STRICT=1.
  skip "chromium"
  export VRAMCTL_SKIP_CHROMIUM=1
fi

# Both suites always run, so that a failure in one never hides the other's result; each
# ends with one summary line, and the exit status is 1 if either failed.
python_result="passed"
if command -v python3 >/dev/null 2>&1; then
  if python3 -m unittest discover -s python/tests -t python/tests; then
    python_result="passed"
  else
    python_result="FAILED (exit $?)"
  fi
elif [ "${VRAMCTL_TEST_STRICT:-0}" = 1 ]; then
  echo "scripts/test.sh: error: python3 is missing and VRAMCTL_TEST_STRICT=1" >&2
  python_result="FAILED (python3 is missing)"
else
  skip "python3"
  python_result="skipped (python3 is missing)"
fi

if cargo test --workspace "$@"; then
  rust_result="passed"
else
  rust_result="FAILED (exit $?)"
fi

echo "scripts/test.sh: python tests (python/tests): $python_result"
echo "scripts/test.sh: rust tests (cargo test --workspace $*): $rust_result"
case "$python_result $rust_result" in
  *FAILED*) exit 1 ;;
esac
