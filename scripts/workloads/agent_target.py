"""AGENT TARGETS for scripts/agent-h200.sh: PyTorch processes with the vramctl agent.

  agent_target.py MODE CONTROL_DIR

  cached    allocates 20 GiB on cuda:0 and frees the tensor (the cache stays reserved)
  keeps     allocates 4 GiB and keeps it (nothing to reclaim)
  pinned    allocates 8 GiB and frees it; on CONTROL_DIR/pinned.go allocates a 4 MiB tensor,
            which the allocator places inside the cached 8 GiB segment (best fit), pinning it
  capture   captures a CUDA graph and stays inside the capture from CONTROL_DIR/capture.arm
            until CONTROL_DIR/capture.go; then replays it, checks the result and frees 1 GiB
            (the cache to reclaim after it; torch.cuda.graph empties the cache as it begins)
  ipython   an IPython shell with `%load_ext vramctl_agent`: a displayed 1 GiB tensor (the
            output cache) and a cell that fails holding 2 GiB in a frame (the traceback)

Each starts the agent (vramctl_agent.start(), or the extension) and writes
CONTROL_DIR/MODE.ready (JSON: pid, socket, ...) once its memory is in place; it exits when
CONTROL_DIR/stop appears or its parent goes away.
"""

import json
import os
import sys
import time

GiB = 1 << 30
MiB = 1 << 20


def write(control, name, obj):
    path = os.path.join(control, name)
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.rename(path + ".tmp", path)


def wait_for(control, name, timeout_s=50.0):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(os.path.join(control, name)):
        if time.monotonic() > deadline or os.getppid() == 1:
            sys.exit(3)
        time.sleep(0.02)


def idle(control):
    wait_for(control, "stop", timeout_s=120.0)


def load_batch(torch):
    # The frame the pinned segment's stack should name.
    return torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")


def main():
    mode, control = sys.argv[1], sys.argv[2]
    if mode == "ipython":
        return ipython(control)
    import torch

    import vramctl_agent

    if mode == "cached":
        x = torch.empty(20 * GiB, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        del x
        write(control, "cached.ready", {"pid": os.getpid(), "socket": vramctl_agent.start()})
        idle(control)
    elif mode == "keeps":
        kept = torch.empty(4 * GiB, dtype=torch.uint8, device="cuda")
        kept.fill_(1)
        torch.cuda.synchronize()
        write(control, "keeps.ready", {"pid": os.getpid(), "socket": vramctl_agent.start()})
        idle(control)
        del kept
    elif mode == "pinned":
        big = torch.empty(8 * GiB, dtype=torch.uint8, device="cuda")
        big.fill_(1)
        torch.cuda.synchronize()
        del big
        write(control, "pinned.ready", {"pid": os.getpid(), "socket": vramctl_agent.start()})
        wait_for(control, "pinned.go")
        small = load_batch(torch)
        small.fill_(2)
        torch.cuda.synchronize()
        segments = [s for s in torch.cuda.memory_snapshot() if s["total_size"] >= 8 * GiB]
        write(control, "pinned.done", {"small_in_big_segment": bool(segments and segments[0]["active_size"] == 4 * MiB)})
        idle(control)
        del small
    elif mode == "capture":
        static_in = torch.ones(1 << 20, device="cuda")
        # Warm up on a side stream, as the CUDA graphs docs ask before a capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            static_out = static_in * 2
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        socket_path = vramctl_agent.start()
        write(control, "capture.ready", {"pid": os.getpid(), "socket": socket_path})
        wait_for(control, "capture.arm")
        graph = torch.cuda.CUDAGraph()
        error = None
        try:
            with torch.cuda.graph(graph):
                static_out = static_in * 3
                write(control, "capture.capturing", {"pid": os.getpid()})
                wait_for(control, "capture.go")
        except Exception as err:  # noqa: BLE001 - reported to the orchestrator
            error = f"{type(err).__name__}: {err}"
        replay_ok = None
        if error is None:
            static_in.fill_(5)
            graph.replay()
            torch.cuda.synchronize()
            replay_ok = bool((static_out == 15).all().item())
        # The cache to reclaim after the capture, made after it: `torch.cuda.graph` empties
        # the cache itself as the capture begins (seen on the H200: a 1 GiB cache made
        # before the capture was gone by its end, reserved 1.1 GB at peak, 64 MiB after).
        x = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        del x
        torch.cuda.synchronize()
        write(control, "capture.done", {"capture_error": error, "replay_ok": replay_ok})
        idle(control)
    else:
        sys.exit(f"unknown mode {mode!r}")


def ipython(control):
    try:
        from IPython.core.interactiveshell import InteractiveShell
    except ImportError as err:
        write(control, "ipython.ready", {"pid": os.getpid(), "skipped": f"IPython is not installed ({err})"})
        idle(control)
        return
    import contextlib
    import io

    shell = InteractiveShell.instance()
    out = io.StringIO()

    def cell(code):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            return shell.run_cell(code, store_history=True)

    cell("%load_ext vramctl_agent")
    cell(f"import torch\nGiB = {GiB}")
    cell("torch.ones(GiB // 4, device='cuda')")  # displayed: kept by the output cache
    cell(
        "def step():\n"
        "    activations = torch.ones(GiB // 2, device='cuda')\n"
        "    raise RuntimeError('CUDA out of memory (simulated)')\n"
        "step()"
    )
    import vramctl_agent

    write(control, "ipython.ready", {"pid": os.getpid(), "socket": vramctl_agent.socket_path(), "shell_output": out.getvalue()[-2000:]})
    idle(control)


if __name__ == "__main__":
    main()
