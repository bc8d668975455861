#!/usr/bin/env bash
# Installs the built .deb, checks what it put where, and removes and purges it (as root;
# docs/packaging.md; .ci/run calls it after scripts/build-deb.sh):
#
#   scripts/test-deb.sh [DEB]        # default: the newest .dist/vramctl_*.deb
#
# install: /usr/bin/vramctl names this commit and runs the README's first command; a man
#   page per command, the three completions and both units are installed; the `vramctl`
#   system user exists with no login shell; the units are not enabled.
# dpkg -r: binary, pages, completions and units are gone; the user stays.
# dpkg -P: /var/lib/vramctl is gone and dpkg forgets the package; the user still stays
#   (Debian leaves system users in place, docs/packaging.md).
# Then, where it made the user itself: installs again beside an admin's own `vramctl` group
#   (docs/socket.md), and the user joins that group.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "scripts/test-deb.sh: error: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "run as root (it installs the package with dpkg)"

deb=${1:-$(ls -t .dist/vramctl_*.deb 2>/dev/null | head -1 || true)}
[ -n "$deb" ] || fail "no .dist/vramctl_*.deb; run scripts/build-deb.sh first"
if dpkg-query -W -f='${Status}' vramctl 2>/dev/null | grep -q 'install ok'; then
  fail "vramctl is already installed here; remove it first (dpkg -r vramctl) so the test starts clean"
fi

# The `vramctl` user and group stay after a purge (Debian policy), but this test removes
# them again if it made them: a `vramctl` group changes how root's daemon socket is shared
# (0660, docs/socket.md), which the integration tests expect absent (0600).
had_user=0
getent passwd vramctl >/dev/null && had_user=1
cleanup() {
  dpkg -P vramctl >/dev/null 2>&1 || true
  if [ "$had_user" = 0 ] && getent passwd vramctl >/dev/null; then
    userdel vramctl
    ! getent group vramctl >/dev/null || groupdel vramctl
  fi
}
trap cleanup EXIT

units_dir=""
dpkg -i "$deb"
for dir in /usr/lib/systemd/system /lib/systemd/system; do
  [ -f "$dir/vramctl-record.service" ] && units_dir=$dir && break
done
[ -n "$units_dir" ] || fail "vramctl-record.service is not installed"
[ -f "$units_dir/vramctl-serve.service" ] || fail "vramctl-serve.service is not installed"
grep -q '^ExecStart=/usr/bin/vramctl record ' "$units_dir/vramctl-record.service" ||
  fail "vramctl-record.service does not start /usr/bin/vramctl"
if systemctl is-enabled vramctl-record.service >/dev/null 2>&1; then
  fail "vramctl-record.service was enabled on install"
fi

version=$(/usr/bin/vramctl --version)
echo "$version"
if head=$(git rev-parse HEAD 2>/dev/null); then
  [[ "$version" == *"commit ${head:0:12},"* ]] || fail "--version does not name HEAD ${head:0:12}: '$version'"
fi
leaks=$(/usr/bin/vramctl --db examples/h200-recording.db leaks --since all --idle-for 1m --tz UTC)
grep -q 'PID 681 .*leak .*leaks' <<<"$leaks" || fail "the README's first command printed: $leaks"

# A page per command `vramctl --help` lists (and the top page).
for command in vramctl $(/usr/bin/vramctl --help | sed -n '/^Commands:/,/^$/p' | awk '/^  [a-z]/ && $1 != "help" {print "vramctl-" $1}'); do
  [ -f "/usr/share/man/man1/$command.1.gz" ] || fail "no man page /usr/share/man/man1/$command.1.gz"
done
[ -f /usr/share/man/man1/vramctl-snapshot-diff.1.gz ] || fail "no man page of snapshot diff"
for file in /usr/share/bash-completion/completions/vramctl /usr/share/zsh/vendor-completions/_vramctl \
  /usr/share/fish/vendor_completions.d/vramctl.fish; do
  grep -q status "$file" || fail "no completions in $file"
done
bash -n /usr/share/bash-completion/completions/vramctl

getent passwd vramctl >/dev/null || fail "no vramctl user after install"
[[ "$(getent passwd vramctl | cut -d: -f7)" == */nologin ]] || fail "the vramctl user has a login shell"
uid=$(id -u vramctl)
[ "$uid" -lt 1000 ] || fail "the vramctl user is no system user (uid $uid)"

# The recorder's state directory, as systemd's StateDirectory would make it.
mkdir -p /var/lib/vramctl && touch /var/lib/vramctl/history.db

dpkg -r vramctl
[ ! -e /usr/bin/vramctl ] || fail "/usr/bin/vramctl is left after dpkg -r"
[ ! -e "$units_dir/vramctl-record.service" ] || fail "the unit is left after dpkg -r"
[ ! -e /usr/share/man/man1/vramctl.1.gz ] || fail "man pages are left after dpkg -r"
getent passwd vramctl >/dev/null || fail "dpkg -r removed the vramctl user"
[ -e /var/lib/vramctl/history.db ] || fail "dpkg -r removed the recorded history (only purge may)"

dpkg -P vramctl
[ ! -e /var/lib/vramctl ] || fail "/var/lib/vramctl is left after dpkg -P"
if dpkg-query -W vramctl >/dev/null 2>&1; then
  fail "dpkg still knows vramctl after dpkg -P: $(dpkg-query -W -f='${Status}' vramctl)"
fi
getent passwd vramctl >/dev/null || fail "dpkg -P removed the vramctl user (Debian keeps system users)"

# The package installs where the admin made a `vramctl` group first, as docs/socket.md
# tells them to (issue 29: useradd --user-group exited 9 there and dpkg -i failed). Only
# when this test made the user, so an admin's real user and group are never touched.
if [ "$had_user" = 0 ]; then
  userdel vramctl
  ! getent group vramctl >/dev/null || groupdel vramctl
  groupadd --system vramctl
  gid=$(getent group vramctl | cut -d: -f3)
  dpkg -i "$deb" || fail "dpkg -i failed where a vramctl group already exists"
  getent passwd vramctl >/dev/null || fail "no vramctl user after install beside an existing group"
  [ "$(id -g vramctl)" = "$gid" ] || fail "the vramctl user did not join the existing vramctl group (gid $(id -g vramctl), group $gid)"
  dpkg -P vramctl
fi
echo "scripts/test-deb.sh: ok: $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB) installed, removed and purged"
