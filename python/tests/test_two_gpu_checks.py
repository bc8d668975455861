"""scripts/check-two-gpu-h200x2.sh's checking logic on a CPU (issue 36 items 2 and 3): the
comparisons of scripts/two_gpu/checks.py fed made-up captures (every PID, UUID and figure
below is invented, in the shape of the real files), the headless screen of
scripts/two_gpu/pty_screen.py fed escape sequences, and the script's refusal on a host with
fewer than two GPUs (a stand-in nvidia-smi on PATH, as test_scripts.py does for cargo)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from harness import PYTHON_DIR

REPO = os.path.dirname(PYTHON_DIR)
sys.path.insert(0, os.path.join(REPO, "scripts", "two_gpu"))

import checks  # noqa: E402
import pty_screen  # noqa: E402

MiB = 1 << 20
UUID0 = "GPU-00000000-fake-0000-0000-000000000000"
UUID1 = "GPU-11111111-fake-1111-1111-111111111111"
H0, H1, GROW = 4100, 4101, 4102


def run_quiet(fn, *args):
    """fn(*args) with its printed lines returned beside its result."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        result = fn(*args)
    return result, buf.getvalue().splitlines()


class FakeViews:
    """A views capture directory: two GPUs, a 3 GiB holder on GPU 0, a 7 GiB one and a
    grower (1 GiB + 32 MiB per second) on GPU 1, each capture between two readings."""

    def __init__(self, root):
        self.d = root
        self.t = 0  # seconds of growth so far
        self.agent_bytes = {H0: 3 << 30, H1: 7 << 30}
        for role, pid, uuid, gib, step in (("h0", H0, UUID0, 3, 0), ("h1", H1, UUID1, 7, 0), ("grow", GROW, UUID1, 1, 32)):
            self.write(f"holder-{role}.json", json.dumps({
                "pid": pid, "gpu": 0 if uuid == UUID0 else 1, "gpu_uuid": uuid,
                "allocated_bytes": gib << 30, "reserved_bytes": gib << 30, "step_mib": step,
                "every_s": 1.0, "agent": None if step else f"/tmp/fake/agent-{pid}.sock",
            }))
        self.smi("start", "before")
        self.smi("start", "after")
        self.manifest = []

    def write(self, name, text):
        with open(os.path.join(self.d, name), "w") as f:
            f.write(text)

    def proc_mib(self):
        # NVML counts the CUDA context too: 500 MiB each.
        return {(UUID0, H0): 3072 + 500, (UUID1, H1): 7168 + 500, (UUID1, GROW): 1024 + 500 + 32 * self.t}

    def used_mib(self, uuid):
        return sum(m for (u, _), m in self.proc_mib().items() if u == uuid)

    def smi(self, prefix, phase):
        rows = [f"{i}, {u}, NVIDIA H200, 00000000:{18 + i:02X}:00.0, 143771, {self.used_mib(u)}, 5, 16" for i, u in enumerate((UUID0, UUID1))]
        self.write(f"{prefix}.smi-{phase}-gpu.csv", "\n".join(rows) + "\n")
        apps = [f"{u}, {p}, {m}" for (u, p), m in self.proc_mib().items()]
        self.write(f"{prefix}.smi-{phase}-apps.csv", "\n".join(apps) + "\n")

    def status(self, sel=None):
        devices = []
        for i, u in enumerate((UUID0, UUID1)):
            if sel is not None and sel != i:
                continue
            procs = [{"pid": p, "used_bytes": m * MiB, **({"agent": {"allocated_bytes": self.agent_bytes[p]}} if p in self.agent_bytes else {})}
                     for (uu, p), m in self.proc_mib().items() if uu == u]
            devices.append({"index": i, "uuid": u, "memory": {"used_bytes": self.used_mib(u) * MiB}, "processes": procs})
        return {"schema": 1, "devices": devices}

    def ps(self, sel=None):
        procs = []
        for (u, p), m in self.proc_mib().items():
            i = 0 if u == UUID0 else 1
            if sel is not None and sel != i:
                continue
            row = {"pid": p, "used_bytes": m * MiB, "gpus": [{"index": i, "uuid": u, "used_bytes": m * MiB}]}
            if p in self.agent_bytes:
                row["agent"] = {"allocated_bytes": self.agent_bytes[p]}
            procs.append(row)
        return {"schema": 1, "processes": procs}

    def now(self, verdicts=None):
        gpus = []
        for i, u in enumerate((UUID0, UUID1)):
            procs = [{"pid": p, "used_bytes": m * MiB, "allocated_bytes": self.agent_bytes.get(p), "verdict": (verdicts or {}).get(p)}
                     for (uu, p), m in self.proc_mib().items() if uu == u]
            gpus.append({"index": i, "uuid": u, "used_bytes": self.used_mib(u) * MiB, "processes": procs})
        return {"seq": 3, "gpus": gpus}

    def top(self, sel=None):
        def g(mib):
            return f"{mib / 1024:.1f}G"

        lines = [" vramctl top  LIVE every 1s 12:00:00 UTC driver 570.0 zoom 5m no history db"]
        for i, u in enumerate((UUID0, UUID1)):
            if sel is None or sel == i:
                lines.append(f"GPU {i} H200       [██░░░░░░░░]  {g(self.used_mib(u))}/140G   0% util  30°C  120W")
        lines.append("    PID USER      GPU     MEM▼   Δ/MIN  CPU%   IDLE FLAGS COMMAND")
        for (u, p), m in sorted(self.proc_mib().items(), key=lambda kv: -kv[1]):
            i = 0 if u == UUID0 else 1
            if sel is None or sel == i:
                lines.append(f"{p:>7} root      {i:<6} {g(m):>6}       0     0     0s       python3 holder.py")
        return "\n".join(lines) + "\n"

    def capture(self, name, kind, sel, body=None, step=True):
        self.smi(name, "before")
        if kind == "top":
            self.write(f"{name}.txt", body if body is not None else self.top(sel))
        else:
            doc = body if body is not None else {"status": self.status, "ps": self.ps}.get(kind, lambda sel: self.now())(sel)
            self.write(f"{name}.json", json.dumps(doc))
        if step:
            self.t += 1  # the grower moved between the two readings
        self.smi(name, "after")
        self.manifest.append(f"{name}\t{kind}\t{'all' if sel is None else sel}")
        self.write("captures.tsv", "\n".join(self.manifest) + "\n")

    def finish(self, leak_series=None, history_procs=None):
        """The recording's files: history, leaks (whole, --gpu 0, --gpu 1), doctor, info."""
        self.smi("record-end", "before")
        self.smi("record-end", "after")
        ends = self.proc_mib()
        samples = lambda values: [{"used_bytes": v * MiB} for v in values]  # noqa: E731
        procs = history_procs or [
            {"pid": H0, "gpu_uuid": UUID0, "samples": samples([ends[(UUID0, H0)]] * 40)},
            {"pid": H1, "gpu_uuid": UUID1, "samples": samples([ends[(UUID1, H1)]] * 40)},
            {"pid": GROW, "gpu_uuid": UUID1, "samples": samples([ends[(UUID1, GROW)] - 32 * k for k in range(40, 0, -1)])},
        ]
        devs = [{"uuid": u, "index": i, "samples": [{}] * 40} for i, u in enumerate((UUID0, UUID1))]
        self.write("history.json", json.dumps({"devices": devs, "processes": procs}))
        self.write("history-i1.json", json.dumps({"devices": devs[1:], "processes": [p for p in procs if p["gpu_uuid"] == UUID1]}))
        series = leak_series or [
            {"gpu_uuid": UUID0, "gpu_index": 0, "pid": H0, "verdict": "stable"},
            {"gpu_uuid": UUID1, "gpu_index": 1, "pid": H1, "verdict": "stable"},
            {"gpu_uuid": UUID1, "gpu_index": 1, "pid": GROW, "verdict": "leak", "rule": "steady-growth"},
        ]
        self.write("leaks.json", json.dumps({"series": series}))
        for i, u in enumerate((UUID0, UUID1)):
            self.write(f"leaks-gpu{i}.json", json.dumps({"series": [s for s in series if s["gpu_uuid"] == u]}))
        self.smi("doctor", "before")
        checks_ = []
        for i, u in enumerate((UUID0, UUID1)):
            listed = [p for (uu, p) in self.proc_mib() if uu == u]
            checks_ += [
                {"id": "pcie_link", "gpu": i, "facts": {"gen_max": 5, "width_max": 16}},
                {"id": "unaccounted_memory", "gpu": i, "facts": {"used_bytes": self.used_mib(u) * MiB, "listed_pids": listed}},
            ]
        self.write("doctor.json", json.dumps({"schema": 1, "checks": [{"id": "driver", "gpu": None}] + checks_}))
        self.write("doctor-i1.json", json.dumps({"schema": 1, "checks": [c for c in checks_ if c["gpu"] == 1]}))
        info = [{"index": i, "uuid": u, "pci_bus_id": f"00000000:{18 + i:02X}:00.0", "memory": {"total_bytes": 143771 * MiB},
                 "nvlinks": nvlinks()} for i, u in enumerate((UUID0, UUID1))]
        self.write("info.json", json.dumps({"devices": info, "topology": [pair()]}))
        self.smi("doctor", "after")
        write_topology_captures(self.write)


def nvlinks(down=()):
    """info --json's nvlinks of an HGX H200: 18 links to the NVSwitches."""
    return [{"link": i, "active": i not in down, "version": 4, "remote_pci_bus_id": None,
             "remote_device": None if i in down else "switch"} for i in range(18)]


def pair(**facts):
    p = {"gpus": [0, 1], "uuids": [UUID0, UUID1], "level": "node", "p2p_read": "ok", "p2p_write": "ok",
         "p2p_nvlink": "ok", "missing": {}, "nvlinks": 18, "smi_label": "NV18"}
    p.update(facts)
    return p


def smi_nvlink(down=(), gpus=(UUID0, UUID1)):
    """`nvidia-smi nvlink -s` as a driver of the 580 branch prints it (made up)."""
    out = []
    for i, u in enumerate(gpus):
        out.append(f"GPU {i}: NVIDIA H200 (UUID: {u})")
        out += [f"\t Link {k}: <inactive>" if (i, k) in down else f"\t Link {k}: 26.562 GB/s" for k in range(18)]
    return "\n".join(out) + "\n"


def smi_p2p(cell):
    return (" \tGPU0\tGPU1\t\n GPU0\tX\t{c}\t\n GPU1\t{c}\tX\t\n\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n"
            "  CNS  = Chipset not supported\n  NS   = Not supported\n  U    = Unknown\n").format(c=cell)


def smi_topo(cell):
    return ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            f"GPU0\t X \t{cell}\t0-47\t0\t\tN/A\nGPU1\t{cell}\t X \t0-47\t0\t\tN/A\n\n"
            "Legend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect\n"
            "  NV#  = Connection traversing a bonded set of # NVLinks\n")


def write_topology_captures(write, topo="NV18", p2p="OK", nvlink_down=()):
    write("topo.txt", smi_topo(topo))
    write("nvlink.txt", smi_nvlink(nvlink_down))
    for flag in "rwn":
        write(f"p2p-{flag}.txt", smi_p2p(p2p))


class ViewsChecks(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="vramctl-two-gpu-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.v = FakeViews(self.dir)

    def all_captures(self):
        v = self.v
        for name, kind, sel in (("status", "status", None), ("status-i0", "status", 0), ("status-i1", "status", 1),
                                ("ps", "ps", None), ("ps-i1", "ps", 1), ("now", "now", None),
                                ("top", "top", None), ("top-i1", "top", 1)):
            v.capture(name, kind, sel)

    def views(self):
        bad, lines = run_quiet(checks.check_views, self.dir)
        return bad, lines

    def test_views_that_agree_with_nvidia_smi_pass(self):
        self.all_captures()
        self.v.capture("now-end", "now", None, self.v.now({GROW: "leak"}))
        self.v.finish()
        bad, lines = self.views()
        self.assertEqual(bad, 0, "\n".join(lines))
        for subject in ("status", "status-i1", "ps-i1", "top", "top-i1", "now-end", "history", "leaks", "doctor", "topology"):
            self.assertIn(f"PASS {subject}", lines)
        self.assertIn("ok topology: GPU 0-1 vramctl NV18, nvidia-smi topo -m NV18", lines)

    def test_a_process_under_the_wrong_gpu_fails(self):
        doc = self.v.status()
        moved = doc["devices"][1]["processes"].pop()  # the grower...
        doc["devices"][0]["processes"].append(moved)  # ...shown on GPU 0
        self.v.capture("status", "status", None, doc)
        self.v.finish()
        bad, lines = self.views()
        self.assertGreater(bad, 0)
        self.assertTrue(any(ln.startswith("MISMATCH status: GPU 0 PIDs") for ln in lines), lines)

    def test_a_selection_showing_the_other_gpu_fails(self):
        self.v.capture("status-i1", "status", 1, self.v.status())  # -i 1 that printed both
        self.v.capture("top-i1", "top", 1, self.v.top())
        self.v.finish()
        bad, lines = self.views()
        self.assertIn("FAIL status-i1: 2 mismatch(es)", lines)
        self.assertTrue(any(ln.startswith("FAIL top-i1") for ln in lines), lines)

    def test_steady_memory_within_64_mib_passes_and_beyond_fails(self):
        for off_mib, ok in ((60, True), (100, False)):
            with self.subTest(off_mib=off_mib):
                doc = self.v.status()
                doc["devices"][0]["processes"][0]["used_bytes"] += off_mib * MiB
                self.v.manifest.clear()
                self.v.capture("status", "status", None, doc)
                _, lines = self.views()
                self.assertEqual("PASS status" in lines, ok, lines)

    def test_the_agents_figure_must_equal_the_holders_own_counter(self):
        doc = self.v.ps()
        doc["processes"][0]["agent"]["allocated_bytes"] -= 1
        self.v.capture("ps", "ps", None, doc)
        _, lines = self.views()
        self.assertTrue(any("agent allocated" in ln and ln.startswith("MISMATCH") for ln in lines), lines)

    def test_a_leak_on_gpu_0_fails_and_a_missed_one_on_gpu_1_fails(self):
        for series in (
            [{"gpu_uuid": UUID0, "gpu_index": 0, "pid": H0, "verdict": "leak"},
             {"gpu_uuid": UUID1, "gpu_index": 1, "pid": GROW, "verdict": "leak"}],
            [{"gpu_uuid": UUID1, "gpu_index": 1, "pid": GROW, "verdict": "growing"}],
        ):
            with self.subTest(series=series):
                self.v.finish(leak_series=series)
                _, lines = self.views()
                self.assertTrue(any(ln.startswith("FAIL leaks") for ln in lines), lines)

    def test_a_holder_recorded_on_both_gpus_fails(self):
        ends = self.v.proc_mib()
        procs = [
            {"pid": H0, "gpu_uuid": UUID0, "samples": [{"used_bytes": ends[(UUID0, H0)] * MiB}]},
            {"pid": H0, "gpu_uuid": UUID1, "samples": [{"used_bytes": 500 * MiB}]},
        ]
        self.v.finish(history_procs=procs)
        _, lines = self.views()
        self.assertTrue(any(ln.startswith("MISMATCH history: holder h0") for ln in lines), lines)

    def test_live_leak_on_gpu_0_fails(self):
        self.v.capture("now-end", "now", None, self.v.now({H0: "leak"}))
        _, lines = self.views()
        self.assertIn(f"MISMATCH now-end: PID {H0} judged a leak on GPU 0", lines)

    def test_top_sizes_are_read_as_the_interval_they_round(self):
        self.assertEqual(checks.shown_size("3.5", "G"), (3.45 * 1024, 3.55 * 1024))
        self.assertEqual(checks.shown_size("140", "G"), (139.5 * 1024, 140.5 * 1024))
        shown = checks.devices_of_top(self.v.top(1))
        self.assertEqual(sorted(shown), ["index:1"])
        self.assertEqual(sorted(shown["index:1"]["processes"]), [H1, GROW])


class TopologyChecks(unittest.TestCase):
    """info --json's NVLinks, matrix and P2P against made-up nvidia-smi captures."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="vramctl-topology-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def write(self, name, text):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(text)

    def run_check(self, info, **captures):
        self.write("info.json", json.dumps(info))
        write_topology_captures(self.write, **captures)
        return run_quiet(checks.check_topology_only, self.dir)

    def info(self, down=(), **facts):
        devices = [{"index": i, "uuid": u, "nvlinks": nvlinks(down if i == 1 else ())} for i, u in enumerate((UUID0, UUID1))]
        return {"devices": devices, "topology": [pair(**facts)]}

    def test_agreeing_captures_pass(self):
        bad, lines = self.run_check(self.info())
        self.assertEqual(bad, 0, "\n".join(lines))
        self.assertIn("PASS topology", lines)
        self.assertIn("ok topology: GPU 0-1 p2p_read vramctl ok, nvidia-smi topo -p2p r OK", lines)
        self.assertIn("ok info: GPU 1 NVLinks active " + str(list(range(18))) + " of 18; nvidia-smi nvlink -s active "
                      + str(list(range(18))) + " of 18", lines)

    def test_a_link_state_nvidia_smi_does_not_share_fails(self):
        bad, lines = self.run_check(self.info(down=(7,)))
        self.assertEqual(bad, 1, "\n".join(lines))
        self.assertTrue(any(ln.startswith("MISMATCH info: GPU 1 NVLinks active") for ln in lines), lines)
        bad, lines = self.run_check(self.info(down=(7,)), nvlink_down=((1, 7),))
        self.assertEqual(bad, 0, "\n".join(lines))

    def test_another_matrix_cell_or_p2p_answer_fails(self):
        bad, lines = self.run_check(self.info(smi_label="NODE", nvlinks=0))
        self.assertEqual(bad, 1, "\n".join(lines))
        self.assertIn("MISMATCH topology: GPU 0-1 vramctl NODE, nvidia-smi topo -m NV18", lines)
        bad, lines = self.run_check(self.info(p2p_write="chipset_not_supported"))
        self.assertEqual(bad, 1, "\n".join(lines))
        self.assertIn("MISMATCH topology: GPU 0-1 p2p_write vramctl chipset_not_supported, nvidia-smi topo -p2p w OK", lines)

    def test_not_supported_alike_passes_and_a_differing_reason_is_only_shown(self):
        info = self.info(p2p_read="chipset_not_supported", p2p_write="not_supported", p2p_nvlink="not_supported",
                         smi_label="SYS", nvlinks=0, level="system")
        for d in info["devices"]:
            d.pop("nvlinks")
        self.write("info.json", json.dumps(info))
        self.write("topo.txt", smi_topo("SYS"))
        self.write("nvlink.txt", "GPU 0: NVIDIA L40S (UUID: %s)\nNVML: Unable to retrieve NVLink information as all links are inActive\n" % UUID0)
        for flag in "rwn":
            self.write(f"p2p-{flag}.txt", smi_p2p("CNS"))
        bad, lines = run_quiet(checks.check_topology_only, self.dir)
        self.assertEqual(bad, 0, "\n".join(lines))
        self.assertIn("figure topology: GPU 0-1 p2p_write: vramctl's reason not_supported, nvidia-smi's CNS", lines)

    def test_a_missing_pair_or_capture_fails(self):
        info = self.info()
        info["topology"] = []
        bad, lines = self.run_check(info)
        self.assertIn("MISMATCH topology: GPU 0-1 in info --json", lines)
        os.remove(os.path.join(self.dir, "topo.txt"))
        bad, lines = run_quiet(checks.check_topology_only, self.dir)
        self.assertTrue(any(ln.startswith("MISMATCH topology: nvidia-smi topo -m read") for ln in lines), lines)

    def test_the_matrix_parser_reads_nvidia_smis_layouts(self):
        self.assertEqual(checks.parse_smi_matrix(smi_topo("NV18")),
                         {(0, 0): "X", (0, 1): "NV18", (1, 0): "NV18", (1, 1): "X"})
        one = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-47\t0\t\tN/A\n"
        self.assertEqual(checks.parse_smi_matrix(one), {(0, 0): "X"})
        self.assertEqual(checks.parse_smi_matrix(smi_p2p("NS"))[(1, 0)], "NS")
        self.assertEqual(checks.parse_smi_matrix("No devices were found\n"), {})


class DdpChecks(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="vramctl-ddp-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.report = {
            "agent_injected": True, "exit_code": 0, "ending": "exited",
            "devices": [
                {"index": 0, "uuid": UUID0, "peak_bytes": 9000 * MiB, "framework": {"allocated_peak_bytes": 7000 * MiB, "processes": 1}},
                {"index": 1, "uuid": UUID1, "peak_bytes": 27000 * MiB, "framework": {"allocated_peak_bytes": 25000 * MiB, "processes": 1}},
            ],
            "processes": [
                {"pid": 5000, "uuid": UUID0, "peak_bytes": 9000 * MiB, "allocated_peak_bytes": 7000 * MiB, "reserved_peak_bytes": 8000 * MiB},
                {"pid": 5001, "uuid": UUID1, "peak_bytes": 27000 * MiB, "allocated_peak_bytes": 25000 * MiB, "reserved_peak_bytes": 26000 * MiB},
            ],
        }
        self.stdout = [
            f"ok rank=0 local_rank=0 pid=5000 gpu_uuid={UUID0} batch=8 peak_allocated={7000 * MiB} peak_reserved={8000 * MiB}",
            f"ok rank=1 local_rank=1 pid=5001 gpu_uuid={UUID1} batch=64 peak_allocated={25000 * MiB} peak_reserved={26000 * MiB}",
        ]
        self.smi = [(5000, UUID0, m) for m in (14, 518, 8000, 9000, 9000)] + [(5001, UUID1, m) for m in (14, 20000, 27000, 27000)]

    def check(self):
        with open(os.path.join(self.dir, "ddp-run.json"), "w") as f:
            json.dump(self.report, f)
        with open(os.path.join(self.dir, "ddp-run.stdout"), "w") as f:
            f.write("\n".join(self.stdout) + "\n")
        with open(os.path.join(self.dir, "ddp-smi.csv"), "w") as f:
            f.write("pid, gpu_uuid, used_gpu_memory [MiB]\n")
            f.write("".join(f"{p}, {u}, {m} MiB\n" for p, u, m in self.smi))
        with open(os.path.join(self.dir, "gpus.csv"), "w") as f:
            f.write(f"index, uuid, name\n0, {UUID0}, NVIDIA H200\n1, {UUID1}, NVIDIA H200\n")
        return run_quiet(checks.check_ddp, self.dir)

    def test_agreeing_files_pass(self):
        bad, lines = self.check()
        self.assertEqual(bad, 0, "\n".join(lines))
        self.assertIn("PASS ddp-run", lines)

    def test_a_peak_off_by_more_than_the_sampling_tolerance_fails(self):
        self.report["processes"][1]["peak_bytes"] += 3 * MiB
        bad, lines = self.check()
        self.assertTrue(any(ln.startswith("MISMATCH rank 1 peak") for ln in lines), lines)

    def test_missing_agent_figures_fail(self):
        self.report["processes"][0]["allocated_peak_bytes"] = None
        bad, lines = self.check()
        self.assertTrue(any(ln.startswith("MISMATCH rank 0 agent allocated_peak_bytes") for ln in lines), lines)

    def test_ranks_on_one_gpu_or_a_rank_run_missed_fail(self):
        self.smi.append((5002, UUID1, 600))  # a process nvidia-smi saw that run did not attribute
        self.stdout[1] = self.stdout[1].replace(UUID1, UUID0)
        bad, lines = self.check()
        self.assertIn("MISMATCH the two ranks ran on two different GPUs", lines)
        self.assertTrue(any(ln.startswith("MISMATCH (GPU, PID) pairs") for ln in lines), lines)

    def test_the_one_gpu_recording_of_issue_15_reads(self):
        """The real files of DDP_ONE_GPU=1 (testdata/h200/fit): both ranks on one GPU, so the
        two-GPU check fails there, and says so, while the per-rank peaks agree."""
        src = os.path.join(REPO, "testdata", "h200", "fit")
        for name in ("ddp-run.json", "ddp-smi.csv"):
            shutil.copy(os.path.join(src, name), self.dir)
        bad, lines = run_quiet(checks.check_ddp, self.dir)
        self.assertGreater(bad, 0)
        self.assertIn("MISMATCH both ranks printed their counters: ranks []", lines)


class HeadlessScreen(unittest.TestCase):
    def test_addressing_erasing_and_split_sequences(self):
        s = pty_screen.Screen(5, 20)
        s.feed("\x1b[?1049h\x1b[2J\x1b[1;1Hhello\x1b[3;5Hworld")
        s.feed("\x1b[")  # a sequence cut between two reads
        s.feed("2;1Hxy\x1b]0;title\x07\x1b[38;5;12mz\x1b[0m")
        self.assertEqual(s.text().splitlines()[:3], ["hello", "xyz", "    world"])
        s.feed("\x1b[1;3H\x1b[K")
        self.assertEqual(s.line(0), "he")
        s.feed("\x1b[6n\x1b[c")
        self.assertEqual(s.replies, ["\x1b[1;3R", "\x1b[?62;22c"])

    def test_wrap_and_scroll(self):
        s = pty_screen.Screen(2, 4)
        s.feed("abcdef\r\nxy\r\nzz")
        self.assertEqual(s.text(), "xy\nzz\n")


class Refusal(unittest.TestCase):
    def test_fewer_than_two_gpus_is_one_line_and_exit_2(self):
        script = os.path.join(REPO, "scripts", "check-two-gpu-h200x2.sh")
        no_driver = "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"; exit 9"
        for body, count in (("echo 0", 1), (no_driver, 0)):
            with self.subTest(gpus=count):
                fakes = tempfile.mkdtemp(prefix="vramctl-smi-")
                self.addCleanup(shutil.rmtree, fakes, True)
                with open(os.path.join(fakes, "nvidia-smi"), "w") as f:
                    f.write(f"#!/bin/sh\n{body}\n")
                os.chmod(os.path.join(fakes, "nvidia-smi"), 0o755)
                env = dict(os.environ, PATH=fakes + os.pathsep + "/usr/bin:/bin", OUT=os.path.join(fakes, "out"))
                done = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=30)
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertEqual(done.stdout, f"check-two-gpu-h200x2.sh: needs 2 GPUs, nvidia-smi lists {count}; nothing run\n")
                self.assertFalse(os.path.exists(os.path.join(fakes, "out")))


if __name__ == "__main__":
    unittest.main()
