#!/usr/bin/env bash
# `vramctl doctor` on a real GPU, beside what nvidia-smi and torch say (issue 18).
#
#   scripts/doctor-h200.sh BIN OUTDIR
#
# Runs `BIN doctor` and `BIN doctor --json` (each timed), then records for comparison
# `nvidia-smi -q`, an `nvidia-smi --query-gpu` CSV of the facts doctor judges, the CUDA
# version nvidia-smi prints, the kernel module's version, and
# `python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'` (the import is
# the comparison; doctor itself never imports a framework). summary.md holds the run
# times, the exit codes and a PASS/FAIL per comparison: driver version, CUDA version,
# torch's CUDA as doctor read it from the wheel, PCIe generation and width, ECC mode,
# persistence mode, compute mode, MIG mode.
#
# Writes 6 files into OUTDIR: doctor.txt, doctor.json, nvidia-smi-q.txt,
# nvidia-smi-query.csv, versions.txt, summary.md. Under a minute. Needs nvidia-smi and
# python3 (torch optional: its comparison then says so).
set -uo pipefail
bin="$(realpath "${1:?usage: doctor-h200.sh BIN OUTDIR}")"
out="$(realpath -m "${2:?usage: doctor-h200.sh BIN OUTDIR}")"
mkdir -p "$out"

now_ms() { date +%s%3N; }

t0=$(now_ms)
timeout 60 "$bin" doctor >"$out/doctor.txt" 2>&1
table_rc=$?
t1=$(now_ms)
timeout 60 "$bin" doctor --json >"$out/doctor.json" 2>"$out/.doctor-json.err"
json_rc=$?
t2=$(now_ms)
if [ -s "$out/.doctor-json.err" ]; then
  { echo; echo "--- stderr of doctor --json ---"; cat "$out/.doctor-json.err"; } >>"$out/doctor.txt"
fi
rm -f "$out/.doctor-json.err"

nvidia-smi -q >"$out/nvidia-smi-q.txt" 2>&1

# Every field doctor judges; a driver that does not know one refuses the whole query, so
# fall back to the fields every supported driver has, and say so in the file.
wide="index,uuid,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,utilization.gpu,temperature.gpu,persistence_mode,compute_mode,ecc.mode.current,ecc.mode.pending,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total,retired_pages.pending,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure,clocks_event_reasons.active,mig.mode.current,mig.mode.pending,power.limit,power.default_limit"
narrow="index,uuid,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,utilization.gpu,temperature.gpu,persistence_mode,compute_mode,ecc.mode.current,ecc.mode.pending,mig.mode.current,mig.mode.pending"
if ! nvidia-smi --query-gpu="$wide" --format=csv >"$out/nvidia-smi-query.csv" 2>&1; then
  { echo "# the full field list was refused:"; sed 's/^/# /' "$out/nvidia-smi-query.csv"; } >"$out/.refused"
  nvidia-smi --query-gpu="$narrow" --format=csv >"$out/.narrow" 2>&1
  cat "$out/.refused" "$out/.narrow" >"$out/nvidia-smi-query.csv"
  rm -f "$out/.refused" "$out/.narrow"
fi

{
  echo "nvidia-smi: $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -1)"
  echo "kernel module: $(head -1 /proc/driver/nvidia/version 2>/dev/null || echo 'no /proc/driver/nvidia/version')"
  echo "torch: $(timeout 120 python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1 | tail -1)"
  echo "python3: $(command -v python3) $(python3 -V 2>&1)"
} >"$out/versions.txt"

python3 - "$out" "$table_rc" "$json_rc" "$((t1 - t0))" "$((t2 - t1))" <<'PY'
import csv, io, json, re, sys
out, table_rc, json_rc, table_ms, json_ms = sys.argv[1], *map(int, sys.argv[2:])
lines = [f"# vramctl doctor on a real GPU\n",
         f"- `doctor`: exit {table_rc}, {table_ms} ms wall (whole process)",
         f"- `doctor --json`: exit {json_rc}, {json_ms} ms wall",
         ""]
checks = []
def check(name, ok, detail):
    checks.append(f"| {name} | {'PASS' if ok else 'FAIL'} | {detail} |")
try:
    report = json.load(open(f"{out}/doctor.json"))
except Exception as e:
    report = None
    lines.append(f"doctor.json is not JSON: {e}")
versions = open(f"{out}/versions.txt").read()
rows = [r for r in csv.reader(io.StringIO("".join(
    l for l in open(f"{out}/nvidia-smi-query.csv") if not l.startswith("#"))))]
smi = [dict(zip([h.strip() for h in rows[0]], [v.strip() for v in r])) for r in rows[1:]] if rows else []
if report:
    lines.append(f"- doctor's own elapsed_ms: {report.get('elapsed_ms')}; counts: {report.get('counts')}")
    by = {}
    for c in report["checks"]:
        by.setdefault(c["id"], []).append(c)
    drv = by.get("driver", [{}])[0].get("facts", {})
    if smi:
        check("driver version", drv.get("driver_version") == smi[0].get("driver_version"),
              f"doctor {drv.get('driver_version')} / nvidia-smi {smi[0].get('driver_version')}")
    m = re.search(r"CUDA Version: *([0-9.]+)", versions)
    check("CUDA version", m is not None and drv.get("cuda_driver_version") == m.group(1),
          f"doctor {drv.get('cuda_driver_version')} / nvidia-smi {m.group(1) if m else '?'}")
    t = re.search(r"^torch: (\S+) (\S+)$", versions, re.M)
    if t:
        seen = [(w["version"], w["cuda"]) for f in by.get("frameworks", [])
                for w in f["facts"].get("wheels", []) if w["name"] == "torch"]
        # torch.__version__ carries the wheel's local tag (2.11.0+cu130); the dist-info
        # version doctor reads may not (the H200 run of 2026-12-02 compared them whole).
        public = t.group(1).split("+")[0]
        check("torch's CUDA (wheel metadata vs torch.version.cuda)",
              any(v.split("+")[0] == public and c == t.group(2) for v, c in seen),
              f"doctor {seen} / import {t.group(1)} {t.group(2)}")
    else:
        lines.append("- torch could not be imported here (versions.txt says why): no torch comparison")
    for row in smi:
        i = int(row["index"])
        facts = {c["id"]: c for c in report["checks"] if c.get("gpu") == i}
        p = facts.get("pcie_link", {}).get("facts", {})
        if p:
            check(f"GPU {i} PCIe gen/width", (str(p.get("gen_current")), str(p.get("width_current"))) ==
                  (row["pcie.link.gen.current"], row["pcie.link.width.current"]),
                  f"doctor Gen{p.get('gen_current')} x{p.get('width_current')} / nvidia-smi Gen{row['pcie.link.gen.current']} x{row['pcie.link.width.current']} (both sampled at different moments)")
        e = facts.get("ecc", {}).get("facts", {})
        if "ecc_enabled" in e:
            check(f"GPU {i} ECC mode", ("Enabled" if e["ecc_enabled"] else "Disabled") == row["ecc.mode.current"],
                  f"doctor {e['ecc_enabled']} / nvidia-smi {row['ecc.mode.current']}")
        pm = facts.get("persistence", {}).get("facts", {})
        if "persistence_mode" in pm:
            check(f"GPU {i} persistence", ("Enabled" if pm["persistence_mode"] else "Disabled") == row["persistence_mode"],
                  f"doctor {pm['persistence_mode']} / nvidia-smi {row['persistence_mode']}")
        cm = facts.get("compute_mode", {}).get("facts", {})
        if "compute_mode" in cm:
            check(f"GPU {i} compute mode", cm["compute_mode"] == row["compute_mode"],
                  f"doctor {cm['compute_mode']} / nvidia-smi {row['compute_mode']}")
        mg = facts.get("mig", {}).get("facts", {})
        if "mig_current" in mg:
            check(f"GPU {i} MIG mode", ("Enabled" if mg["mig_current"] else "Disabled") == row["mig.mode.current"],
                  f"doctor {mg['mig_current']} / nvidia-smi {row['mig.mode.current']}")
    lines.append("\nEvery check and its status:\n")
    for c in report["checks"]:
        lines.append(f"- {c['status']:<7} {c['id']} ({c['subject']}): {c['summary']}")
lines += ["", "| comparison | result | detail |", "| --- | --- | --- |", *checks]
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
ls "$out"
