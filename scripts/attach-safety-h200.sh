#!/usr/bin/env bash
# `vramctl reclaim --attach` run by root on a GPU server (issue 29, items 1-2): against a
# real PyTorch process it either works or refuses with one line, and no file of the target's
# user is ever run. Needs root (it creates a user and removes it), a GPU, python3 with torch.
# Python 3.14 need not exist here: then the real attach refuses (`too_old`), and the attacks
# still run against a copy of this machine's Python whose `Py_Version` says 3.14.
#
#   OUT=/some/dir scripts/attach-safety-h200.sh            (binary: .dist/vramctl)
#
# Writes under $OUT: attach-safety.txt (the summary, also printed), *.json (vramctl's
# answers), execve-*.log (every program vramctl and its children started, when strace is
# here). Exit 0 when every check held; 1 with "FAILED: ..." otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
VRAMCTL=${VRAMCTL:-$PWD/.dist/vramctl}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
summary="$OUT/attach-safety.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
failed=0
fail() { say "FAILED: $*"; failed=1; }

[ "$(id -u)" = 0 ] || { say "attach-safety: needs root (it attaches as root and creates a user)"; exit 2; }
[ -x "$VRAMCTL" ] || { say "attach-safety: no $VRAMCTL"; exit 2; }
user="vrsafe$$"
useradd --no-create-home --user-group --shell /bin/false "$user" || { say "useradd failed"; exit 2; }
uid=$(id -u "$user"); gid=$(id -g "$user")
evil=$(mktemp -d /tmp/vramctl-evil.XXXXXX)
chown "$user:$user" "$evil"; chmod 755 "$evil"
victim=$(mktemp /tmp/vramctl-victim.XXXXXX); echo "root's own" > "$victim"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  sleep 0.2
  rm -rf "$evil" "$victim"
  userdel "$user" 2>/dev/null; groupdel "$user" 2>/dev/null
}
trap cleanup EXIT
# An array, not a function: started with `&`, its PID is the program's own.
as_user=(setpriv --reuid="$uid" --regid="$gid" --clear-groups --)
strace_bin=$(command -v strace || true)
before=$(ls -d /tmp/vramctl-attach-* 2>/dev/null)
VRAMCTL=$(readlink -f "$VRAMCTL")
say "vramctl: $("$VRAMCTL" --version 2>&1 | head -1)"
say "kernel.yama.ptrace_scope: $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo absent)"
say "python3.14 here: $(command -v python3.14 || echo none)"

# vramctl reclaim --attach PID as root (PATH with DIR first), its execve calls traced.
attach() {  # attach NAME PID [DIR]
  local name=$1 pid=$2 first=${3:-/nonexistent}
  # Absolute paths only: PATH starts with the user's directory.
  local run=("$VRAMCTL" reclaim --attach "$pid" --json --timeout 10s)
  if [ -n "$strace_bin" ]; then
    run=("$strace_bin" -f -qq -e trace=execve -o "$OUT/execve-$name.log" "${run[@]}")
  fi
  env PATH="$first:$PATH" "${run[@]}" > "$OUT/$name.json" 2> "$OUT/$name.stderr"
  echo $?
}
# "exit N, STATUS CODE: MESSAGE" from an answer; checks the message is one line.
describe() {  # describe NAME EXIT
  python3 - "$OUT/$1.json" "$2" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
p = doc["processes"][0]
err = p.get("error") or {}
msg = err.get("message", "")
assert "\n" not in msg, "a message of more than one line"
print(f"exit {sys.argv[2]}, {p['status']} {err.get('code', '')}: {msg or p.get('released_bytes')}")
PY
}
no_user_exec() {  # no_user_exec NAME: nothing under $evil was started
  if [ -f "$OUT/execve-$1.log" ]; then
    if grep -F "$evil" "$OUT/execve-$1.log" | grep -v ENOENT >/dev/null; then
      fail "$1: a file of the target's user was executed: $(grep -F "$evil" "$OUT/execve-$1.log" | head -3)"
    else
      say "  execve of the user's files: none ($(grep -c execve "$OUT/execve-$1.log") execve in all)"
    fi
  fi
  [ -e "$evil/ran" ] && fail "$1: a trap ran: $(cat "$evil/ran")"
}

# 1. A real PyTorch process of the test user (or root's own where the user cannot import
#    torch from here) holding 2 GiB of cache.
torch_py=$(command -v python3.14 2>/dev/null || command -v python3)
target_src='import time, torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); del x
print("ready", flush=True)
while True:
    time.sleep(0.05)'
runner=("${as_user[@]}"); who=$user
if ! "${as_user[@]}" "$torch_py" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  runner=(); who=root
  say "  (user $user cannot import torch with $torch_py: the PyTorch target runs as root)"
fi
"${runner[@]}" "$torch_py" -c "$target_src" > "$evil/ready" 2>"$evil/torch.err" &
tpid=$!; pids+=("$tpid"); disown "$tpid"
for _ in $(seq 300); do [ -s "$evil/ready" ] && break; sleep 0.1; done
[ -s "$evil/ready" ] || { say "torch target did not start: $(tail -2 "$evil/torch.err")"; exit 2; }
say "torch target: pid $tpid as $who, $($torch_py -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)')"
code=$(attach torch "$tpid")
line=$(describe torch "$code") || fail "torch: no valid answer: $(cat "$OUT/torch.json" "$OUT/torch.stderr")"
say "attach (real PyTorch): $line"
case "$line" in
  "exit 0, reclaimed"*|"exit 1, nothing_reclaimed"*|"exit 1, not_attachable "*) ;;
  *) fail "torch: neither reclaimed nor refused in one line" ;;
esac
no_user_exec torch

# 2. The issue's attacks: the user's own copy of Python named python3.14, deleted while it
#    runs; a script at "<exe> (deleted)" and at its name, first on root's PATH, that marks
#    who ran it. Once with its true version, once with Py_Version patched to 3.14.
patch_py_version() {  # patch_py_version FILE [check]: Py_Version := 3.14.0 final (ELF64 LE)
  python3 - "$@" <<'PY'
import struct, sys
f = open(sys.argv[1], "rb" if sys.argv[2:] else "r+b"); d = f.read()
shoff, = struct.unpack_from("<Q", d, 0x28); shentsize, shnum = struct.unpack_from("<HH", d, 0x3a)
sh = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
dyn = next(s for s in sh if s[1] == 11); strs = sh[dyn[6]]
for i in range(dyn[5] // 24):
    name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", d, dyn[4] + i * 24)
    if d[strs[4] + name: strs[4] + name + 11] == b"Py_Version\0":
        if sys.argv[2:]: sys.exit(0)
        home = sh[shndx]; f.seek(home[4] + value - home[3]); f.write(struct.pack("<Q", 0x030E00F0)); sys.exit(0)
sys.exit("no Py_Version")
PY
}
# A Python binary whose copy runs as the user (a copy of one linked to a libpython the user
# cannot read does not), preferably one with Py_Version in itself (statically linked), whose
# copy can be made to say 3.14.
real_py=""
for want in with-py-version any; do
  for c in "$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null)" /usr/bin/python3 /usr/local/bin/python3 /usr/bin/python3.1*; do
    c=$(readlink -f "$c" 2>/dev/null) || continue
    [ -f "$c" ] || continue
    [ $want = any ] || patch_py_version "$c" check 2>/dev/null || continue
    cp "$c" "$evil/probe"; chown "$user:$user" "$evil/probe"
    if "${as_user[@]}" "$evil/probe" -c pass 2>/dev/null; then real_py=$c; break 2; fi
  done
done
rm -f "$evil/probe"
[ -n "$real_py" ] || fail "no Python binary here runs as $user when copied: the attacks were not tried"
say "attack target: copies of $real_py"
for variant in true-version as-3.14; do
  [ -n "$real_py" ] || break
  rm -f "$evil/ran" "$evil/python3.14" "$evil/python3.14 (deleted)"
  cp "$real_py" "$evil/python3.14"; chown "$user:$user" "$evil/python3.14"
  if [ $variant = as-3.14 ]; then patch_py_version "$evil/python3.14" || { say "  (cannot patch $real_py: skipped)"; continue; }; fi
  "${as_user[@]}" "$evil/python3.14" -c 'import time
print("ready", flush=True)
while True: time.sleep(0.05)' > "$evil/ready.$variant" 2>/dev/null &
  apid=$!; pids+=("$apid"); disown "$apid"
  for _ in $(seq 100); do [ -s "$evil/ready.$variant" ] && break; sleep 0.1; done
  [ -s "$evil/ready.$variant" ] || { say "  ($variant: a copy of $real_py does not run as $user: skipped)"; continue; }
  rm "$evil/python3.14"
  for name in "python3.14 (deleted)" python3.14; do
    printf '#!/bin/sh\necho "$(id -u) %s" >> %s/ran\necho 3 14 True\n' "$name" "$evil" > "$evil/$name"
    chown "$user:$user" "$evil/$name"; chmod 755 "$evil/$name"
  done
  say "attack ($variant): /proc/$apid/exe -> $(readlink "/proc/$apid/exe")"
  code=$(attach "attack-$variant" "$apid" "$evil")
  line=$(describe "attack-$variant" "$code") || fail "attack-$variant: no valid answer"
  say "  $line"
  case "$line" in *", reclaimed "*) fail "attack-$variant: a process not really 3.14 was reclaimed" ;; esac
  no_user_exec "attack-$variant"
  kill -9 "$apid" 2>/dev/null
done

# 3. Meanwhile nothing was planted through the work directory: root's file is intact and
#    no attach directory is left.
[ "$(cat "$victim")" = "root's own" ] || fail "root's file changed"
left=$(comm -13 <(echo "$before") <(ls -d /tmp/vramctl-attach-* 2>/dev/null) | grep -c . || true)
say "attach directories left in /tmp: $left"
[ "$left" = 0 ] || fail "attach directories left behind"
[ $failed = 0 ] && say "attach-safety: ok" || say "attach-safety: FAILED"
exit $failed
