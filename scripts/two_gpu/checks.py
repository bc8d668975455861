"""The checks of scripts/check-two-gpu-h200x2.sh, on files it captured (standard library only,
so that python/tests/test_two_gpu_checks.py runs them on a CPU over made-up captures).

    python3 checks.py ddp OUTDIR     scripts/run-ddp-h200.sh's files (issue 36 item 2)
    python3 checks.py views DIR      the views part's captures (issue 36 item 3)
    python3 checks.py topology DIR   info.json against nvidia-smi nvlink -s, topo -m, topo -p2p

Prints `ok ...`, `MISMATCH ...` and `figure ...` lines, then one `PASS`/`FAIL` line per
subject; exit status 1 when any MISMATCH was printed.

How "the same moment" is read: each vramctl capture NAME sits between two nvidia-smi
readings, NAME.smi-before-{gpu,apps}.csv and NAME.smi-after-{gpu,apps}.csv
(`--query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,pcie.link.gen.max,
pcie.link.width.max` and `--query-compute-apps=gpu_uuid,pid,used_memory`, both
`--format=csv,noheader,nounits`). A figure of vramctl's must lie in the range the two
readings span, widened by TOL: max(64 MiB, 1 %) (the issue's allowance for steady holders;
it also covers one 32 MiB step of the growing holder taken between a daemon's sample and
the first nvidia-smi read, and nvidia-smi's whole MiB). A steady holder's two readings are
equal, so for it this is "within 1 % or 64 MiB".
"""
import csv
import json
import os
import re
import sys

MIB = 1 << 20
TOL_FLOOR_MIB = 64.0
TOL_FRACTION = 0.01
# run's per-process and per-GPU peaks against nvidia-smi's 200 ms samples: both read NVML's
# per-process counter, and the peak is a plateau held for ddp.py's --hold-s (3 s; PyTorch's
# cache gives nothing back to the driver during the steps), so the coarser samples see it
# too. What is left is nvidia-smi's whole MiB: 2 MiB per process (1 each side).
DDP_PEAK_TOL_MIB = 2


def tol_mib(mib):
    return max(TOL_FLOOR_MIB, TOL_FRACTION * mib)


class Report:
    """Counts mismatches; each check prints one line."""

    def __init__(self):
        self.bad = 0
        self.subject_bad = 0

    def check(self, ok, text):
        print(f"{'ok' if ok else 'MISMATCH'} {text}")
        if not ok:
            self.bad += 1
            self.subject_bad += 1
        return ok

    def figure(self, text):
        print(f"figure {text}")

    def verdict(self, subject):
        print(f"PASS {subject}" if self.subject_bad == 0 else f"FAIL {subject}: {self.subject_bad} mismatch(es)")
        self.subject_bad = 0


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def mib_of(cell):
    m = re.match(r"\s*(\d+(?:\.\d+)?)", cell or "")
    return float(m.group(1)) if m else None


# --- nvidia-smi readings ------------------------------------------------------------------

GPU_FIELDS = ["index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used", "pcie.link.gen.max", "pcie.link.width.max"]


def read_smi_gpus(path):
    """{uuid: {field: text}} from a --query-gpu=GPU_FIELDS noheader,nounits CSV."""
    gpus = {}
    try:
        with open(path) as f:
            for row in csv.reader(f, skipinitialspace=True):
                if len(row) >= 2 and row[1].startswith("GPU-"):
                    gpus[row[1]] = dict(zip(GPU_FIELDS, (c.strip() for c in row)))
    except OSError:
        pass
    return gpus


def read_smi_apps(path):
    """{(uuid, pid): MiB} from a --query-compute-apps=gpu_uuid,pid,used_memory CSV."""
    apps = {}
    try:
        with open(path) as f:
            for row in csv.reader(f, skipinitialspace=True):
                if len(row) >= 3 and row[0].startswith("GPU-") and row[1].strip().isdigit():
                    apps[(row[0].strip(), int(row[1]))] = mib_of(row[2])
    except OSError:
        pass
    return apps


class Moment:
    """Two nvidia-smi readings around one capture."""

    def __init__(self, prefix):
        self.gpus = [read_smi_gpus(f"{prefix}.smi-{w}-gpu.csv") for w in ("before", "after")]
        self.apps = [read_smi_apps(f"{prefix}.smi-{w}-apps.csv") for w in ("before", "after")]
        self.read = all(self.gpus)

    def uuids(self):
        return sorted(self.gpus[0], key=lambda u: int(self.gpus[0][u]["index"]))

    def index(self, uuid):
        g = self.gpus[0].get(uuid) or self.gpus[1].get(uuid)
        return int(g["index"]) if g else None

    def gpu_range(self, uuid, field="memory.used"):
        vals = [mib_of(g[uuid][field]) for g in self.gpus if uuid in g]
        vals = [v for v in vals if v is not None]
        return (min(vals), max(vals)) if vals else None

    def app_range(self, uuid, pid):
        vals = [a[(uuid, pid)] for a in self.apps if (uuid, pid) in a and a[(uuid, pid)] is not None]
        return (min(vals), max(vals)) if vals else None

    def pids(self, uuid):
        """(PIDs in both readings, PIDs in either) on the GPU."""
        sets = [{p for (u, p) in a if u == uuid} for a in self.apps]
        return sets[0] & sets[1], sets[0] | sets[1]


def within(shown, smi_range):
    """Whether a shown (lo, hi) MiB interval meets nvidia-smi's range widened by TOL."""
    lo, hi = smi_range
    t = tol_mib(hi)
    return shown[0] <= hi + t and shown[1] >= lo - t


def fmt_range(r):
    return f"{r[0]:.0f}" if r[0] == r[1] else f"{r[0]:.0f}..{r[1]:.0f}"


# --- what each view showed, as {uuid: {"index", "used": (lo, hi) MiB, "processes": {pid: (lo, hi)}}}


def exact(nbytes):
    if nbytes is None:
        return None
    v = nbytes / MIB
    return (v, v)


def devices_of_status(doc):
    out = {}
    for d in (doc or {}).get("devices", []):
        mem = d.get("memory") or {}
        out[d["uuid"]] = {
            "index": d.get("index"),
            "used": exact(mem.get("used_bytes")),
            "processes": {p["pid"]: exact(p.get("used_bytes")) for p in d.get("processes") or []},
            "agent": {p["pid"]: (p.get("agent") or {}).get("allocated_bytes") for p in d.get("processes") or []},
        }
    return out


def devices_of_now(doc):
    out = {}
    for g in (doc or {}).get("gpus", []):
        out[g["uuid"]] = {
            "index": g.get("index"),
            "used": exact(g.get("used_bytes")),
            "processes": {p["pid"]: exact(p.get("used_bytes")) for p in g.get("processes") or []},
            "agent": {p["pid"]: p.get("allocated_bytes") for p in g.get("processes") or []},
            "verdicts": {p["pid"]: p.get("verdict") for p in g.get("processes") or []},
        }
    return out


def devices_of_ps(doc):
    """ps lists processes with their GPUs; device used memory is not in it."""
    out = {}
    for p in (doc or {}).get("processes", []):
        for g in p.get("gpus") or []:
            d = out.setdefault(g["uuid"], {"index": g.get("index"), "used": None, "processes": {}, "agent": {}})
            d["processes"][p["pid"]] = exact(g.get("used_bytes"))
            if len(p.get("gpus") or []) == 1:  # ps sums the agent's figures over devices
                d["agent"][p["pid"]] = (p.get("agent") or {}).get("allocated_bytes")
    return out


UNIT = {"B": 1 / MIB, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2, "P": 1024.0**3}
SIZE = r"(\d+(?:\.\d+)?)([BKMGTP])"


def shown_size(number, unit):
    """The MiB interval a size top printed stands for (rounded to its last digit)."""
    decimals = len(number.split(".")[1]) if "." in number else 0
    half = 0.5 * 10**-decimals
    v = float(number)
    return ((v - half) * UNIT[unit], (v + half) * UNIT[unit])


def devices_of_top(screen_text):
    """GPU lines (`GPU 0 H200 [bar] 22.9G/140G ...`) and process rows (`PID USER GPU MEM ...`)."""
    out = {}
    by_index = {}
    in_table = False
    for line in screen_text.splitlines():
        m = re.match(rf"^GPU (\d+) .*?\]\s+{SIZE}/{SIZE}", line)
        if m:
            idx = int(m.group(1))
            by_index[idx] = {"index": idx, "used": shown_size(m.group(2), m.group(3)), "processes": {}, "agent": {}}
            continue
        if re.match(r"^\s*PID\s+USER\s+GPU\s+MEM", line):
            in_table = True
            continue
        if in_table:
            m = re.match(rf"^\s*(\d+)\s+\S+\s+(\d+)(?:/g\d+)?\s+{SIZE}\s", line)
            if m:
                idx = int(m.group(2))
                d = by_index.setdefault(idx, {"index": idx, "used": None, "processes": {}, "agent": {}})
                d["processes"][int(m.group(1))] = shown_size(m.group(3), m.group(4))
    for idx, d in by_index.items():
        out[f"index:{idx}"] = d  # top shows indices, not UUIDs: matched by index below
    return out


def compare_view(r, name, shown, moment, selected, holders, agent_may_lag=False):
    """One view against the nvidia-smi readings around it: per GPU its used memory, its PIDs
    and each PID's memory; with a selection, that GPU alone; the agent's figures of the
    steady holders equal their own torch counters (`agent_may_lag`: a view that asks agents
    every 10 s, serve, may not have asked yet: then a missing figure is said, not failed)."""
    uuids = moment.uuids()
    by_index = {moment.index(u): u for u in uuids}
    # Views that show indices only (top): put them under their UUIDs by nvidia-smi's index.
    shown = {(by_index.get(d["index"]) if k.startswith("index:") else k): d for k, d in shown.items()}
    want = uuids if selected is None else [by_index.get(selected)]
    r.check(
        sorted(k for k in shown if k) == sorted(want) and None not in shown,
        f"{name}: GPUs shown {sorted(moment.index(k) if k else k for k in shown)}, "
        f"expected {sorted(moment.index(u) for u in want)}",
    )
    for uuid in want:
        d = shown.get(uuid)
        idx = moment.index(uuid)
        if d is None:
            continue
        if d.get("used") is not None:
            smi = moment.gpu_range(uuid)
            r.check(
                smi is not None and within(d["used"], smi),
                f"{name}: GPU {idx} used {fmt_range(d['used'])} MiB, nvidia-smi {fmt_range(smi) if smi else '-'} MiB",
            )
        both, either = moment.pids(uuid)
        listed = set(d["processes"])
        r.check(
            both <= listed <= either,
            f"{name}: GPU {idx} PIDs {sorted(listed)}, nvidia-smi {sorted(either)}",
        )
        for pid in sorted(listed & either):
            got = d["processes"][pid]
            smi = moment.app_range(uuid, pid)
            if got is None or smi is None:
                r.check(False, f"{name}: GPU {idx} PID {pid} memory {got} against nvidia-smi {smi}")
                continue
            r.check(within(got, smi), f"{name}: GPU {idx} PID {pid} {fmt_range(got)} MiB, nvidia-smi {fmt_range(smi)} MiB")
        for h in holders:
            if h.get("gpu_uuid") != uuid or h["pid"] not in d.get("agent", {}) or h.get("step_mib"):
                continue
            if not isinstance(h.get("agent"), str) or not h["agent"].startswith("/"):
                continue  # no agent in that holder (said once, in the holders' lines)
            got = d["agent"][h["pid"]]
            if got is None and agent_may_lag:
                r.figure(f"{name}: GPU {idx} PID {h['pid']}: no agent figure yet (asked every 10 s)")
                continue
            r.check(
                got == h["allocated_bytes"],
                f"{name}: GPU {idx} PID {h['pid']} agent allocated {got}, torch.cuda.memory_allocated {h['allocated_bytes']}",
            )
    # Every process a view shows under a GPU it was not asked for is wrong, whatever it is.
    for uuid, d in shown.items():
        if uuid not in want and d and d["processes"]:
            r.check(False, f"{name}: processes {sorted(d['processes'])} shown on unselected GPU {moment.index(uuid)}")


# --- the views part ---------------------------------------------------------------------


def read_manifest(d):
    """captures.tsv: NAME<TAB>KIND<TAB>SELECTED (an index, or 'all')."""
    rows = []
    try:
        with open(os.path.join(d, "captures.tsv")) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 3:
                    rows.append((parts[0], parts[1], None if parts[2] == "all" else int(parts[2])))
    except OSError:
        pass
    return rows


def read_holders(d):
    out = {}
    for role in ("h0", "h1", "grow"):
        h = load_json(os.path.join(d, f"holder-{role}.json"))
        if h:
            out[role] = h
    return out


def check_views(d):
    r = Report()
    holders = read_holders(d)
    for role in ("h0", "h1", "grow"):
        h = holders.get(role)
        r.check(h is not None, f"holder {role} ready" + (f": PID {h['pid']} on {h['gpu_uuid']}, agent {h.get('agent')}" if h else ""))
    hl = list(holders.values())
    topline = Moment(os.path.join(d, "start"))
    if holders.get("h0") and holders.get("grow") and topline.read:
        u = topline.uuids()
        r.check(
            len(u) >= 2 and holders["h0"]["gpu_uuid"] == u[0] and holders["h1"]["gpu_uuid"] == u[1] == holders["grow"]["gpu_uuid"],
            "torch's cuda:0/cuda:1 are nvidia-smi's GPU 0/1 (CUDA_DEVICE_ORDER=PCI_BUS_ID)",
        )
    r.verdict("holders on their GPUs")

    for name, kind, selected in read_manifest(d):
        base = os.path.join(d, name)
        moment = Moment(base)
        if not moment.read:
            r.check(False, f"{name}: no nvidia-smi reading around it")
            r.verdict(name)
            continue
        if kind == "top":
            try:
                with open(base + ".txt") as f:
                    screen = f.read()
            except OSError:
                screen = ""
            r.check("PID" in screen, f"{name}: a table was drawn")
            shown = devices_of_top(screen)
        else:
            doc = load_json(base + ".json")
            r.check(doc is not None, f"{name}: its JSON was read")
            shown = {"status": devices_of_status, "ps": devices_of_ps, "now": devices_of_now}[kind](doc)
        compare_view(r, name, shown, moment, selected, hl, agent_may_lag=kind == "now" and not name.endswith("end"))
        if kind == "now" and name.endswith("end"):
            now_verdicts(r, name, shown, holders)
        r.verdict(name)

    check_history(r, d, holders)
    check_leaks(r, d, holders)
    check_doctor(r, d)
    check_topology(r, d)
    return r.bad


def now_verdicts(r, name, shown, holders):
    """serve's live analysis at the end of the recording: nothing on GPU 0 leaks; the grower's
    verdict as a figure (the live judge needs ~40 s of growth, about what it had)."""
    grow = holders.get("grow") or {}
    for uuid, d in shown.items():
        for pid, v in d.get("verdicts", {}).items():
            if v == "leak" and not (pid == grow.get("pid") and uuid == grow.get("gpu_uuid")):
                r.check(False, f"{name}: PID {pid} judged a leak on GPU {d['index']}")
    g = shown.get(grow.get("gpu_uuid"), {}).get("verdicts", {}).get(grow.get("pid"))
    r.figure(f"{name}: the growing holder's live verdict on its GPU: {g}")


def check_history(r, d, holders):
    hist = load_json(os.path.join(d, "history.json"))
    moment = Moment(os.path.join(d, "record-end"))
    if not r.check(hist is not None and moment.read, "history: the recording and the nvidia-smi reading at its end were read"):
        r.verdict("history")
        return
    uuids = moment.uuids()
    recorded = {dev["uuid"]: dev for dev in hist.get("devices", [])}
    for uuid in uuids:
        dev = recorded.get(uuid)
        r.check(dev is not None and len(dev.get("samples") or []) >= 30, f"history: GPU {moment.index(uuid)} recorded, {len((dev or {}).get('samples') or [])} samples")
    where = {}
    for p in hist.get("processes", []):
        where.setdefault(p["pid"], []).append(p)
    for role, h in sorted(holders.items()):
        entries = where.get(h["pid"], [])
        r.check(
            [e["gpu_uuid"] for e in entries] == [h["gpu_uuid"]],
            f"history: holder {role} (PID {h['pid']}) recorded on GPU(s) {[moment.index(e['gpu_uuid']) for e in entries]} only, expected [{moment.index(h['gpu_uuid'])}]",
        )
        if len(entries) != 1 or not entries[0].get("samples"):
            continue
        values = [s["used_bytes"] / MIB for s in entries[0]["samples"] if s.get("used_bytes") is not None]
        smi = moment.app_range(h["gpu_uuid"], h["pid"])
        if not values or smi is None:
            r.check(False, f"history: holder {role} has no recorded or no nvidia-smi figure")
            continue
        last = values[-1]
        if h.get("step_mib"):
            rising = all(b >= a for a, b in zip(values, values[1:]))
            r.check(rising and values[-1] > values[0], f"history: growing holder rose {values[0]:.0f} -> {last:.0f} MiB, never fell")
            # The last sample is at most one interval before the reading: a step or two lower.
            r.check(last <= smi[1] + tol_mib(smi[1]) and last >= smi[0] - 2 * h["step_mib"] - tol_mib(smi[0]),
                    f"history: growing holder's last sample {last:.0f} MiB, nvidia-smi at the end {fmt_range(smi)} MiB")
        else:
            r.check(within((last, last), smi), f"history: holder {role} last sample {last:.0f} MiB, nvidia-smi {fmt_range(smi)} MiB")
    sel = load_json(os.path.join(d, "history-i1.json"))
    if r.check(sel is not None, "history --gpu GPU 1's UUID was read"):
        devs = [x["uuid"] for x in sel.get("devices", [])]
        procs = {p["gpu_uuid"] for p in sel.get("processes", [])}
        r.check(devs == uuids[1:2] and procs <= set(uuids[1:2]), f"history --gpu UUID1: devices {devs}, process GPUs {sorted(procs)}")
    r.verdict("history")


def check_leaks(r, d, holders):
    grow = holders.get("grow")
    full = load_json(os.path.join(d, "leaks.json"))
    moment = Moment(os.path.join(d, "record-end"))
    if not r.check(full is not None and grow is not None and moment.read, "leaks: the report was read"):
        r.verdict("leaks")
        return
    uuids = moment.uuids()
    leaks = [(s["pid"], s["gpu_uuid"]) for s in full.get("series", []) if s.get("verdict") == "leak"]
    r.check(leaks == [(grow["pid"], grow["gpu_uuid"])], f"leaks: leak verdicts {leaks}, expected only the growing holder {grow['pid']} on GPU 1")
    for s in full.get("series", []):
        print(f"figure leaks: GPU {s.get('gpu_index')} PID {s.get('pid')} {s.get('verdict')} ({s.get('rule')}): {s.get('explanation')}")
        if s.get("gpu_uuid") == uuids[0]:
            r.check(s.get("verdict") in ("stable", "idle-holder"), f"leaks: GPU 0 PID {s.get('pid')} is {s.get('verdict')}")
    for sel, want in (("0", []), ("1", [grow["pid"]])):
        doc = load_json(os.path.join(d, f"leaks-gpu{sel}.json"))
        if not r.check(doc is not None, f"leaks --gpu {sel} was read"):
            continue
        got = [s["pid"] for s in doc.get("series", []) if s.get("verdict") == "leak"]
        on = {s["gpu_uuid"] for s in doc.get("series", [])}
        r.check(got == want and on <= {uuids[int(sel)]}, f"leaks --gpu {sel}: leaking {got}, expected {want}; series on GPU(s) {sorted(moment.index(u) for u in on)}")
    r.verdict("leaks")


def check_doctor(r, d):
    moment = Moment(os.path.join(d, "doctor"))
    doc = load_json(os.path.join(d, "doctor.json"))
    info = load_json(os.path.join(d, "info.json"))
    if not r.check(doc is not None and info is not None and moment.read, "doctor and info were read"):
        r.verdict("doctor")
        return
    for uuid in moment.uuids():
        idx = moment.index(uuid)
        smi = moment.gpus[0][uuid]
        mine = [c for c in doc.get("checks", []) if c.get("gpu") == idx]
        r.check(len(mine) > 0, f"doctor: {len(mine)} checks on GPU {idx}")
        link = next((c for c in mine if c.get("id") == "pcie_link"), None)
        if link and link.get("facts"):
            f = link["facts"]
            r.check(
                str(f.get("gen_max")) == smi["pcie.link.gen.max"] and str(f.get("width_max")) == smi["pcie.link.width.max"],
                f"doctor: GPU {idx} PCIe max Gen{f.get('gen_max')} x{f.get('width_max')}, nvidia-smi Gen{smi['pcie.link.gen.max']} x{smi['pcie.link.width.max']}",
            )
        un = next((c for c in mine if c.get("id") == "unaccounted_memory"), None)
        if un and un.get("facts") and un["facts"].get("used_bytes") is not None:
            got = exact(un["facts"]["used_bytes"])
            smi_used = moment.gpu_range(uuid)
            r.check(within(got, smi_used), f"doctor: GPU {idx} used {fmt_range(got)} MiB, nvidia-smi {fmt_range(smi_used)} MiB")
            both, either = moment.pids(uuid)
            listed = set(un["facts"].get("listed_pids") or [])
            r.check(both <= listed <= either, f"doctor: GPU {idx} listed PIDs {sorted(listed)}, nvidia-smi {sorted(either)}")
        dev = next((x for x in info.get("devices", []) if x.get("uuid") == uuid), None)
        if r.check(dev is not None, f"info: GPU {idx} ({uuid}) listed"):
            total = (dev.get("memory") or {}).get("total_bytes")
            r.check(
                dev.get("index") == idx
                and (dev.get("pci_bus_id") or "").upper() == smi["pci.bus_id"].upper()
                and total is not None
                and abs(total // MIB - int(smi["memory.total"])) <= 1,
                f"info: GPU {idx} index {dev.get('index')}, bus {dev.get('pci_bus_id')}, total {None if total is None else total // MIB} MiB; "
                f"nvidia-smi {smi['pci.bus_id']}, {smi['memory.total']} MiB",
            )
    sel = load_json(os.path.join(d, "doctor-i1.json"))
    if r.check(sel is not None, "doctor --gpu 1 was read"):
        gpus = {c.get("gpu") for c in sel.get("checks", []) if c.get("gpu") is not None}
        r.check(gpus == {1}, f"doctor --gpu 1: per-GPU checks on GPU(s) {sorted(gpus)}")
    r.verdict("doctor")


# --- topology: info's NVLinks, matrix and P2P against nvidia-smi ---------------------------

GPU_NAME = re.compile(r"^GPU(\d+)$")
# vramctl's P2P status -> nvidia-smi topo -p2p's cell (its legend: OK, CNS, GNS, TNS, NS, U).
P2P_SMI = {
    "ok": "OK", "chipset_not_supported": "CNS", "gpu_not_supported": "GNS",
    "ioh_topology_not_supported": "TNS", "disabled_by_regkey": "NS", "not_supported": "NS", "unknown": "U",
}


def parse_smi_matrix(text):
    """`nvidia-smi topo -m` or `topo -p2p X`: {(row, column): cell} over the GPUs. The header
    is the first line starting with GPU0 that is not GPU0's row (whose next word is X, self);
    its leading GPUn words are the columns. A row starts with GPUn and its first cells are the
    GPU columns (CPU/NUMA affinity and NIC columns follow and are left)."""
    columns, cells = None, {}
    for line in (text or "").splitlines():
        words = line.split()
        if not words:
            continue
        if columns is None:
            if words[0] == "GPU0" and (len(words) == 1 or words[1] != "X"):
                columns = []
                for w in words:
                    m = GPU_NAME.match(w)
                    if not m:
                        break
                    columns.append(int(m.group(1)))
            continue
        m = GPU_NAME.match(words[0])
        if not m:
            continue
        row = int(m.group(1))
        for col, cell in zip(columns, words[1:1 + len(columns)]):
            cells[(row, col)] = cell
    return cells


def parse_smi_nvlink(text):
    """`nvidia-smi nvlink -s`: {uuid: {"index": n, "links": {link: active}}}. A GPU whose links
    are all down may list no link (\"all links are inActive\")."""
    gpus, cur = {}, None
    for line in (text or "").splitlines():
        m = re.match(r"^GPU (\d+): .*\(UUID: (GPU-[^)]+)\)", line)
        if m:
            cur = gpus.setdefault(m.group(2), {"index": int(m.group(1)), "links": {}})
            continue
        m = re.match(r"^\s+Link (\d+): (.*)$", line)
        if m and cur is not None:
            cur["links"][int(m.group(1))] = "inactive" not in m.group(2).lower()
    return gpus


def compare_nvlinks(r, info, nvlink_text, where="info"):
    """Each GPU's NVLinks in info --json against nvidia-smi nvlink -s: the same link indices,
    each active or not alike. A GPU nvidia-smi lists no active link for must have no NVLink
    in vramctl either, or only inactive ones."""
    smi = parse_smi_nvlink(nvlink_text)
    devices = {d.get("uuid"): d for d in (info or {}).get("devices", [])}
    if not r.check(bool(devices), f"{where}: devices listed"):
        return
    for uuid, dev in devices.items():
        idx = dev.get("index")
        ours = {l["link"]: bool(l["active"]) for l in dev.get("nvlinks") or []}
        theirs = (smi.get(uuid) or {}).get("links", {})
        up = sorted(k for k, v in ours.items() if v)
        if theirs:
            r.check(ours == theirs, f"{where}: GPU {idx} NVLinks active {up} of {len(ours)}; "
                                    f"nvidia-smi nvlink -s active {sorted(k for k, v in theirs.items() if v)} of {len(theirs)}")
        else:
            r.check(not up, f"{where}: GPU {idx} NVLinks active {up}; nvidia-smi nvlink -s lists none active")
        why = (dev.get("missing") or {}).get("nvlinks")
        if why:
            r.figure(f"{where}: GPU {idx} NVLinks not reported: {why}")


def compare_topology(r, info, topo_text, p2p_texts):
    """info --json's pairs against nvidia-smi: topo -m's cell (NV#, PIX, PXB, PHB, NODE, SYS)
    equal to smi_label; for P2P read, write and NVLink, OK exactly where vramctl says ok (the
    reason of a not-OK cell is shown beside, not judged: NVML's wording and nvidia-smi's
    abbreviations are not one-to-one)."""
    topo = parse_smi_matrix(topo_text)
    gpus = sorted({a for a, _ in topo})
    pairs = {tuple(p.get("gpus") or ()): p for p in (info or {}).get("topology", [])}
    if not r.check(len(gpus) >= 2, f"topology: nvidia-smi topo -m read, GPUs {gpus}"):
        return
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            pair = pairs.get((a, b))
            if not r.check(pair is not None, f"topology: GPU {a}-{b} in info --json"):
                continue
            cell = topo.get((a, b))
            r.check(pair.get("smi_label") == cell, f"topology: GPU {a}-{b} vramctl {pair.get('smi_label')}, nvidia-smi topo -m {cell}")
            for key, flag in (("p2p_read", "r"), ("p2p_write", "w"), ("p2p_nvlink", "n")):
                text = p2p_texts.get(flag)
                if text is None:
                    continue
                smi_cell = parse_smi_matrix(text).get((a, b))
                ours = pair.get(key)
                r.check(smi_cell is not None and (ours == "ok") == (smi_cell == "OK"),
                        f"topology: GPU {a}-{b} {key} vramctl {ours}, nvidia-smi topo -p2p {flag} {smi_cell}")
                if ours not in (None, "ok") and smi_cell not in (None, "OK") and P2P_SMI.get(ours) != smi_cell:
                    r.figure(f"topology: GPU {a}-{b} {key}: vramctl's reason {ours}, nvidia-smi's {smi_cell}")


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def check_topology(r, d):
    """DIR's info.json against nvlink.txt (nvidia-smi nvlink -s), topo.txt (topo -m) and
    p2p-r.txt, p2p-w.txt, p2p-n.txt (topo -p2p r, w, n); one verdict."""
    info = load_json(os.path.join(d, "info.json"))
    if r.check(info is not None, "topology: info --json was read"):
        compare_nvlinks(r, info, read_text(os.path.join(d, "nvlink.txt")) or "")
        p2p = {f: read_text(os.path.join(d, f"p2p-{f}.txt")) for f in "rwn"}
        compare_topology(r, info, read_text(os.path.join(d, "topo.txt")), {k: v for k, v in p2p.items() if v is not None})
    r.verdict("topology")


# --- the ddp-run part -------------------------------------------------------------------


def ok_fields(line):
    return dict(re.findall(r"(\w+)=(\S+)", line)) if line.startswith("ok ") else None


def smi_peaks(path):
    """{(uuid, pid): peak MiB} over nvidia-smi's --query-compute-apps=pid,gpu_uuid,used_memory samples."""
    peaks = {}
    try:
        with open(path) as f:
            for row in csv.reader(f, skipinitialspace=True):
                if len(row) < 3 or not row[0].strip().isdigit():
                    continue  # the header, "[N/A]", a line cut by the kill
                used = mib_of(row[2])
                if used is None:
                    continue
                key = (row[1].strip(), int(row[0]))
                peaks[key] = max(peaks.get(key, 0), used)
    except OSError:
        pass
    return peaks


def check_ddp(out):
    r = Report()
    rep = load_json(os.path.join(out, "ddp-run.json"))
    ranks = []
    try:
        with open(os.path.join(out, "ddp-run.stdout")) as f:
            ranks = [x for x in (ok_fields(ln) for ln in f) if x and "rank" in x]
    except OSError:
        pass
    index = {}
    try:
        with open(os.path.join(out, "gpus.csv")) as f:
            for row in csv.reader(f, skipinitialspace=True):
                if len(row) >= 2 and row[1].startswith("GPU-"):
                    index[row[1]] = row[0]
    except OSError:
        pass
    peaks = smi_peaks(os.path.join(out, "ddp-smi.csv"))
    if not r.check(rep is not None, "run's report (ddp-run.json) was read"):
        r.verdict("ddp-run")
        return r.bad
    r.check(rep.get("exit_code") == 0, f"the job exited {rep.get('exit_code')} ({rep.get('ending')})")
    ranks.sort(key=lambda x: int(x["rank"]))
    r.check([x["rank"] for x in ranks] == ["0", "1"], f"both ranks printed their counters: ranks {[x['rank'] for x in ranks]}")
    r.check(len({x.get("gpu_uuid") for x in ranks}) == len(ranks) == 2, "the two ranks ran on two different GPUs")
    procs = rep.get("processes") or []
    by_pid = {}
    for p in procs:
        by_pid.setdefault(p["pid"], []).append(p)
    for x in ranks:
        uuid, rank = x.get("gpu_uuid"), x["rank"]
        pid = int(x["pid"]) if x.get("pid", "").isdigit() else None
        if pid is None:  # an older ddp.py: the one process run saw on the rank's GPU
            on_gpu = [p["pid"] for p in procs if p["uuid"] == uuid]
            pid = on_gpu[0] if len(on_gpu) == 1 else None
        entries = by_pid.get(pid, [])
        mine = [p for p in entries if p["uuid"] == uuid]
        r.check(len(mine) == 1, f"rank {rank} (PID {pid}) in run's report under its GPU {index.get(uuid, '?')} ({uuid})")
        others = [p["uuid"] for p in entries if p["uuid"] != uuid]
        if others:
            r.figure(f"rank {rank} (PID {pid}) also listed on GPU(s) {[index.get(u, u) for u in others]}")
        if not mine:
            continue
        p = mine[0]
        smi = peaks.get((uuid, pid))
        got = p["peak_bytes"] / MIB
        r.check(
            smi is not None and abs(got - smi) <= DDP_PEAK_TOL_MIB,
            f"rank {rank} peak: run {got:,.1f} MiB, nvidia-smi {smi if smi is None else f'{smi:,.0f}'} MiB (200 ms samples; within {DDP_PEAK_TOL_MIB} MiB)",
        )
        # The agent's figures: the ranks' own counters, read by the agent at exit.
        for field, mine_field in (("peak_allocated", "allocated_peak_bytes"), ("peak_reserved", "reserved_peak_bytes")):
            want = int(x[field]) if x.get(field, "").isdigit() else None
            r.check(p.get(mine_field) is not None and p.get(mine_field) == want,
                    f"rank {rank} agent {mine_field} {p.get(mine_field)}, torch {field} {want}")
        if p.get("reserved_peak_bytes"):
            r.figure(f"rank {rank}: NVML peak - torch reserved = {(p['peak_bytes'] - p['reserved_peak_bytes']) / MIB:,.0f} MiB (CUDA context, NCCL)")
    r.check(rep.get("agent_injected") is True, f"run injected the agent: {rep.get('agent_injected')}")
    # nvidia-smi saw exactly the job's processes, where run says they were.
    theirs = set(peaks)
    ours = {(p["uuid"], p["pid"]) for p in procs}
    r.check(theirs == ours, f"(GPU, PID) pairs: run {sorted((index.get(u, u), p) for u, p in ours)}, nvidia-smi {sorted((index.get(u, u), p) for u, p in theirs)}")
    for dev in rep.get("devices") or []:
        uuid = dev.get("uuid")
        on = [k for k in peaks if k[0] == uuid]
        smi_sum = sum(peaks[k] for k in on)
        got = (dev.get("peak_bytes") or 0) / MIB
        r.check(
            bool(on) and abs(got - smi_sum) <= DDP_PEAK_TOL_MIB * len(on),
            f"GPU {dev.get('index')} peak: run {got:,.1f} MiB, nvidia-smi {smi_sum:,.0f} MiB (sum of its PIDs' plateaus)",
        )
        fw = dev.get("framework") or {}
        ranks_here = [x for x in ranks if x.get("gpu_uuid") == uuid]
        want = sum(int(x["peak_allocated"]) for x in ranks_here) if ranks_here else None
        r.check(fw.get("allocated_peak_bytes") == want and fw.get("processes") == len(ranks_here),
                f"GPU {dev.get('index')} framework allocated peak {fw.get('allocated_peak_bytes')} over {fw.get('processes')} process(es), ranks' {want}")
    sizes = {x.get("gpu_uuid"): next((p["peak_bytes"] for p in procs if p["uuid"] == x.get("gpu_uuid")), 0) for x in ranks}
    if len(ranks) == 2:
        r.check(sizes.get(ranks[1].get("gpu_uuid"), 0) > sizes.get(ranks[0].get("gpu_uuid"), 0), "the larger peak is on rank 1's GPU")
    r.verdict("ddp-run")
    return r.bad


def check_topology_only(d):
    r = Report()
    check_topology(r, d)
    return r.bad


if __name__ == "__main__":
    modes = {"ddp": check_ddp, "views": check_views, "topology": check_topology_only}
    if len(sys.argv) != 3 or sys.argv[1] not in modes:
        sys.exit("usage: checks.py {ddp|views|topology} DIR")
    sys.exit(1 if modes[sys.argv[1]](sys.argv[2]) else 0)
