"""A two-rank DDP training whose ranks use visibly different memory, for `vramctl run` (issue 15).

    torchrun --nproc_per_node 2 scripts/fit/ddp.py --batch N [--steps 2] [--rank1-factor 8] [--hold-s 3]

Each rank trains the same MLP (4 Linear 8192x8192 layers with GELU: 1 GiB of fp32 weights, so
weights + grads + AdamW state + DDP buckets are ~6 GiB per rank) on its own GPU (LOCAL_RANK),
nccl backend, bf16 autocast, --steps AdamW steps. Rank 0 feeds N x 1024 rows, rank 1
N x 1024 x --rank1-factor rows, so rank 1's activations are several GiB larger (by estimate
~2 GiB against ~15 GiB at N=8, factor 8): the peak `run` attributes to each GPU must differ by that
much, the larger one on rank 1's GPU. DDP averages the gradients whatever the local batch is.

After the steps every rank keeps its memory for --hold-s seconds (PyTorch's cache would keep
it until exit anyway; the hold makes the peak last long enough for nvidia-smi's 200 ms samples
to see it beside `run`'s), then each prints on stdout:
    ok rank=R local_rank=L pid=PID gpu_uuid=GPU-... batch=SAMPLES peak_allocated=BYTES peak_reserved=BYTES
(`pid` ties the line to the rank's entry in `vramctl run`'s report.)
"""
import argparse
import os
import time

# NVLink multicast stays off whatever environment this was started with: on the shared GPU
# hosts a program using it can put the host's GPUs out of service (device KINDS notes).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402  (after the variables, before NCCL reads them)
import torch.distributed as dist  # noqa: E402

SEED = 0
WIDTH = 8192
DEPTH = 4
ROWS_PER_SAMPLE = 1024


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", required=True, type=int)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--rank1-factor", type=int, default=8, help="rank 1's batch is this many times rank 0's")
    p.add_argument("--hold-s", type=float, default=3.0, help="seconds to keep the memory after the steps")
    args = p.parse_args()
    if args.batch < 1 or args.steps < 1 or args.rank1_factor < 1:
        p.error("--batch, --steps and --rank1-factor must be at least 1")
    return args


def main():
    args = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    # DDP_ONE_GPU=1: every rank on GPU 0 over gloo (NCCL refuses two ranks on one GPU), for
    # a machine with one GPU: the ranks' memory is then told apart by process, not by GPU.
    one_gpu = os.environ.get("DDP_ONE_GPU") == "1"
    torch.cuda.set_device(0 if one_gpu else local_rank)
    dist.init_process_group(backend="gloo" if one_gpu else "nccl")
    rank = dist.get_rank()
    dev = torch.device("cuda", 0 if one_gpu else local_rank)

    torch.manual_seed(SEED)  # the same initial weights on both ranks (DDP broadcasts rank 0's anyway)
    with dev:
        layers = []
        for _ in range(DEPTH):
            layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
        model = torch.nn.Sequential(*layers)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    batch = args.batch * (args.rank1_factor if rank == 1 else 1)
    gen = torch.Generator(device=dev).manual_seed(SEED + rank)
    x = torch.randn(batch * ROWS_PER_SAMPLE, WIDTH, device=dev, generator=gen)

    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    dist.barrier()
    time.sleep(args.hold_s)

    uuid = getattr(torch.cuda.get_device_properties(dev), "uuid", None)
    print(
        f"ok rank={rank} local_rank={local_rank} pid={os.getpid()} gpu_uuid={'GPU-' + str(uuid) if uuid else '-'} "
        f"batch={batch} peak_allocated={torch.cuda.max_memory_allocated(dev)} "
        f"peak_reserved={torch.cuda.max_memory_reserved(dev)}",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
