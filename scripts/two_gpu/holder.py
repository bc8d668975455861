"""A PyTorch process that holds memory on one GPU, steady or growing, for the two-GPU checks
(scripts/check-two-gpu-h200x2.sh, part `views`).

    python3 holder.py --gpu N --gib G --ready FILE [--grow-mib M --every-s 1 --max-steps K]
                      [--hold-s S] [--agent]

Holds G GiB on CUDA device N (with CUDA_DEVICE_ORDER=PCI_BUS_ID, set by the caller, CUDA's
N is NVML's N; the ready file names the UUID torch used, so a mismatch is seen, not
assumed). With --grow-mib it then allocates M MiB more every --every-s seconds and keeps
all of it (a leak: live tensors, so the agent's `allocated` grows too), at most K times.
Large allocations (> 1 MiB) each get a segment of their own rounded to 2 MiB, so NVML's
figure for the process grows by M MiB per step.

Once the first G GiB are held it writes FILE (JSON, written whole then renamed):
{"pid", "gpu", "gpu_uuid", "allocated_bytes", "reserved_bytes", "step_mib", "every_s",
 "started_unix_ms"}, and exits after --hold-s seconds (default 600: the script kills it).
--agent starts vramctl's in-process agent when `import vramctl_agent` works (the caller puts
python/ on PYTHONPATH), so ps/status/top can show the framework's own figures per GPU.
"""
import argparse
import json
import os
import time

import torch

MIB = 1 << 20


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpu", type=int, required=True)
    p.add_argument("--gib", type=float, required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--grow-mib", type=int, default=0)
    p.add_argument("--every-s", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--hold-s", type=float, default=600.0)
    p.add_argument("--agent", action="store_true")
    args = p.parse_args()

    dev = f"cuda:{args.gpu}"
    torch.cuda.set_device(args.gpu)  # nothing of this process on another GPU
    agent = None
    if args.agent:
        try:
            import vramctl_agent

            agent = vramctl_agent.start()
        except Exception as e:  # the check runs without the agent then, and says so
            agent = f"not started: {e}"
    held = [torch.ones(int(args.gib * 1024) * MIB, dtype=torch.uint8, device=dev)]
    torch.cuda.synchronize(dev)
    uuid = getattr(torch.cuda.get_device_properties(args.gpu), "uuid", None)
    ready = {
        "pid": os.getpid(),
        "gpu": args.gpu,
        "gpu_uuid": f"GPU-{uuid}" if uuid else None,
        "allocated_bytes": torch.cuda.memory_allocated(dev),
        "reserved_bytes": torch.cuda.memory_reserved(dev),
        "step_mib": args.grow_mib,
        "every_s": args.every_s,
        "agent": agent,
        "started_unix_ms": int(time.time() * 1000),
    }
    tmp = args.ready + ".tmp"
    with open(tmp, "w") as f:
        json.dump(ready, f)
    os.replace(tmp, args.ready)

    end = time.monotonic() + args.hold_s
    steps = 0
    next_step = time.monotonic() + args.every_s
    while time.monotonic() < end:
        if args.grow_mib and steps < args.max_steps and time.monotonic() >= next_step:
            held.append(torch.ones(args.grow_mib * MIB, dtype=torch.uint8, device=dev))
            torch.cuda.synchronize(dev)
            steps += 1
            next_step += args.every_s
        time.sleep(0.05)


if __name__ == "__main__":
    main()
