#!/usr/bin/env bash
# Where `vramctl snapshot` spends its time on the GPU machine (issue 17), one call, from the
# repository root, with the release binary and the read_snapshot example in .dist/:
#
#   cargo build --release -p vramctl -p vramctl-snapshot --example read_snapshot
#   cp target/release/vramctl target/release/examples/read_snapshot .dist/
#   bash scripts/snapshot-profile-h200.sh .dist OUTDIR
#
# Makes a real >= 200 MB snapshot as scripts/snapshot-h200.py does (1,300,000 entries), then
# writes OUTDIR/log.txt: `/usr/bin/time -v` of `vramctl snapshot FILE --json` three times
# (user, system, peak RSS, page faults), the read_snapshot example's phase timer three times
# without and once with the trace stacks, and `/usr/bin/time -v` of a bare pickle.load;
# OUTDIR/make.json (the snapshot's memory_stats()); and the snapshot itself as xz, split in
# 15 MiB parts (OUTDIR/big.xz.NN; `cat big.xz.* | xz -dc > FILE` restores it), which is how
# testdata/h200/snapshot-run/real-206MB.pickle.xz came here. Changes no GPU setting.
set -u
dist="$(realpath "${1:?usage: snapshot-profile-h200.sh DIST OUTDIR}")"
out="$(realpath -m "${2:?usage: snapshot-profile-h200.sh DIST OUTDIR}")"
cd "$(dirname "$0")/.."
mkdir -p "$out"
big=$(mktemp -d)/big.pickle
PYTHONUNBUFFERED=1 python3 -c "
import importlib.util, json, sys
s = importlib.util.spec_from_file_location('s', 'scripts/snapshot-h200.py')
m = importlib.util.module_from_spec(s); s.loader.exec_module(m)
print(json.dumps(m.make_snapshot(sys.argv[1], 100, 1300000)))" "$big" > "$out/make.json" 2>&1
log="$out/log.txt"
ls -la "$big" > "$log"
for _ in 1 2 3; do
  /usr/bin/time -v "$dist/vramctl" snapshot "$big" --json 2>&1 >/dev/null |
    grep -E "Elapsed|User time|System time|Maximum resident|page faults" >> "$log"
  echo -- >> "$log"
done
for _ in 1 2 3; do "$dist/read_snapshot" "$big" >> "$log" 2>&1; done
VRAMCTL_TRACE_STACKS=1 "$dist/read_snapshot" "$big" >> "$log" 2>&1
/usr/bin/time -v python3 -c "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))" "$big" 2>&1 |
  grep -E "Elapsed|User time|System time|Maximum resident|page faults" >> "$log"
if command -v xz >/dev/null; then
  xz -T16 -6 -k "$big"
else
  python3 -c "
import lzma, sys
with open(sys.argv[1], 'rb') as f, lzma.open(sys.argv[1] + '.xz', 'wb', preset=6) as g:
    for b in iter(lambda: f.read(1 << 24), b''): g.write(b)" "$big"
fi
split -b 15M -d "$big.xz" "$out/big.xz."
rm -rf "$(dirname "$big")"
cat "$log"
