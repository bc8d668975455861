"""The second labeled leak set (issue 13): PyTorch workloads that nobody tuned the leak
analysis to. Run one with `python3 leakset.py NAME`; `scripts/record-leakset-h200.sh` runs
them all side by side on one GPU while vramctl and nvidia-smi record.

Each workload appends its ground truth to $LABELS (see common.py): "start" (with the
workload's half, its mechanism, whether it leaks and the leak rate it aims at), "leak_start"
for a leak (at the first step for most: the commonest leak in the wild), "idle_start" for an
idle holder, and "end" (with a reason: "done", or "oom-cap" when a leak reached the memory
cap that stands in for the GPU running out, and the process exits as a real job would).

Leak rates are aimed, not assumed: a leak's step keeps whatever its bug keeps (a graph, an
output, a gradient copy); the bytes one step keeps are measured over the first steps with
torch.cuda.memory_allocated(), and the step period is set so that the retained bytes grow
at the aimed rate. What NVML sees is the caching allocator's reserve, which follows the
retained bytes in segment-sized steps (2 MiB small, 20 MiB and up large).

The halves: "tune" workloads may be used to choose the analysis's thresholds, "holdout"
workloads may not (they only report). The two halves use different leak mechanisms and
different warm-up shapes, so a threshold that fits one mechanism is tested on another.
"""
import math
import os
import random
import sys
import time

import torch

from common import blob, label, mib

DURATION_S = float(os.environ.get("DURATION", "540"))
DEV = "cuda"
# The set was sized for one H200 (143771 MiB), where all 31 side by side peaked at 111.7 GiB.
# On a smaller GPU scripts/record-leakset-h200.sh sets LEAKSET_MEMORY_SCALE below 1 (0.31 on
# an H100 80GB) and every size the set chooses scales by it: each leak's cap (the stand-in for
# the GPU running out), the idle holders' 6 and 4 GiB and kv-fixed's 3 GiB. Rates, timings,
# shapes and mechanisms stay; a capped leak ends (`oom-cap`) sooner, as on a smaller GPU.
# The `start` label carries the scale when it is not 1.
try:
    MEMORY_SCALE = float(os.environ.get("LEAKSET_MEMORY_SCALE", "1"))
except ValueError:
    MEMORY_SCALE = -1.0
if not 0 < MEMORY_SCALE <= 1:
    print(f"leakset.py: error: LEAKSET_MEMORY_SCALE '{os.environ.get('LEAKSET_MEMORY_SCALE')}' "
          "is not a number in (0, 1]", file=sys.stderr)
    sys.exit(2)


def scaled_mib(n):
    """n MiB of the H200 set, at this run's memory scale."""
    return mib(n * MEMORY_SCALE)


# The H200 recording (testdata/h200/leakset, smi-apps.csv replayed with the caps scaled):
# ~43 GiB of its peak does not scale (37 CUDA contexts, the models and activations,
# cudnn-autotune's ~15 GiB), ~66 GiB does (leaks up to their caps, idle holders, the KV
# cache); its peak was 80 % of the GPU (111.7 of 140.4 GiB). Below a scale of 0.2 (a GPU
# under ~70 GiB) the capped leaks would end within seconds: not the same set any more.
PEAK_SHARE = 0.8
FIXED_GIB = 43.0
SCALED_GIB = 66.0
MIN_SCALE = 0.2


def scale_for_gpu(total_mib):
    """The memory scale that keeps the set's peak at 80 % of a GPU of `total_mib` (nvidia-smi's
    memory.total): 1 on an H200 (143771 MiB gives 1.05, so 1), 0.314 on an H100 80GB (81559
    MiB: a peak of ~67 GiB of 79.6). None below MIN_SCALE."""
    scale = min(1.0, round((PEAK_SHARE * total_mib / 1024 - FIXED_GIB) / SCALED_GIB, 3))
    return scale if scale >= MIN_SCALE else None


class Run:
    """Clock, labels and the memory cap of one workload."""

    def __init__(self, name, half, mechanism, leaks, rate_mb_s=None, cap_gib=None, **extra):
        self.name = name
        self.t0 = time.monotonic()
        self.cap_bytes = int(cap_gib * MEMORY_SCALE * 2**30) if cap_gib else None
        self.base_allocated = 0
        if MEMORY_SCALE != 1:
            extra["memory_scale"] = MEMORY_SCALE
        label(name, "start", half=half, mechanism=mechanism, leaks=leaks,
              rate_mb_s=rate_mb_s, **extra)

    def elapsed(self):
        return time.monotonic() - self.t0

    def running(self):
        return self.elapsed() < DURATION_S

    def leak_start(self, **extra):
        label(self.name, "leak_start", **extra)

    def over_cap(self):
        """Whether the leaked bytes passed the cap: the stand-in for an out-of-memory crash."""
        if self.cap_bytes is None:
            return False
        return torch.cuda.memory_allocated() - self.base_allocated > self.cap_bytes

    def end(self, reason="done"):
        torch.cuda.synchronize()
        label(self.name, "end", reason=reason)
        sys.exit(0)


def mlp(width, depth):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).to(DEV)


def paced_leak(run, step, rate_mb_s, min_period_s=0.02, max_period_s=4.0):
    """Runs `step()` (which keeps its bug's bytes) with a period that makes the retained
    bytes grow at `rate_mb_s`: after one step (which also creates optimizer state and
    gradients, kept or not), the next three measure what one step keeps."""
    torch.cuda.synchronize()
    run.base_allocated = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    per_step = max(1, (torch.cuda.memory_allocated() - before) // 3)
    period = min(max(per_step / (rate_mb_s * 1e6), min_period_s), max_period_s)
    label(run.name, "paced", bytes_per_step=per_step, period_s=period,
          aimed_mb_s=per_step / period / 1e6)
    next_at = time.monotonic()
    while run.running():
        if run.over_cap():
            run.end("oom-cap")
        step()
        torch.cuda.synchronize()
        next_at += period
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_at = time.monotonic()
    run.end()


def train_step(model, opt, x):
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


# ---------------------------------------------------------------------------------------
# Tune half: leaks


def total_loss():
    """`total_loss += loss` without .item(): every step's graph, with its saved
    activations, stays alive through the running sum (the commonest leak in the wild)."""
    run = Run("total-loss", "tune", "sum of losses keeps every graph", True, 20, 8)
    model = mlp(1024, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    state = {"total": 0.0}

    def step():
        x = torch.randn(512, 1024, device=DEV)
        loss = train_step_keep_graph(model, opt, x)
        state["total"] = state["total"] + loss  # the bug

    run.leak_start(at="first step")
    paced_leak(run, step, 20)


def train_step_keep_graph(model, opt, x):
    """A step whose loss is computed twice: once for backward (freed), once for logging that
    keeps its graph as long as the loss is referenced."""
    train_step(model, opt, x)
    return model(x).square().mean()


def kept_outputs():
    """Validation without torch.no_grad() keeping its outputs in a list for a metric at
    the end of the epoch: outputs and their graphs live on."""
    run = Run("kept-outputs", "tune", "list of outputs with their graphs", True, 60, 8)
    model = mlp(2048, 3)
    outputs = []

    def step():
        outputs.append(model(torch.randn(256, 2048, device=DEV)))  # the bug

    run.leak_start(at="first step")
    paced_leak(run, step, 60)


def detached_cache():
    """An unbounded memo of per-batch embeddings (detached, no graph): a slow leak."""
    run = Run("detached-cache", "tune", "unbounded memo of detached tensors", True, 3, 4)
    model = mlp(1024, 2)
    cache = {}
    counter = [0]

    def step():
        with torch.no_grad():
            emb = model(torch.randn(64, 1024, device=DEV))
        cache[counter[0]] = emb.detach()  # the bug: never evicted
        counter[0] += 1

    run.leak_start(at="first step")
    paced_leak(run, step, 3)


def grad_history():
    """Keeps a copy of every parameter's gradient each step for 'later analysis': a fast
    leak that fills the GPU in about a minute."""
    run = Run("grad-history", "tune", "clone of gradients every step", True, 400, 12)
    model = mlp(2048, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    history = []

    def step():
        train_step(model, opt, torch.randn(256, 2048, device=DEV))
        history.append([p.grad.clone() for p in model.parameters()])  # the bug

    run.leak_start(at="first step")
    paced_leak(run, step, 400)


def after_plateau():
    """Clean training for 90 s (warm-up done, memory flat), then a code path starts keeping
    its predictions (a leak that begins late)."""
    run = Run("after-plateau", "tune", "predictions kept after 90 s", True, 30, 8,
              leak_after_s=90)
    model = mlp(1536, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kept = []
    while run.elapsed() < 90:
        train_step(model, opt, torch.randn(256, 1536, device=DEV))
        torch.cuda.synchronize()
        time.sleep(0.1)

    def step():
        loss = train_step(model, opt, torch.randn(256, 1536, device=DEV))
        kept.append(model(torch.randn(128, 1536, device=DEV)))  # the bug
        del loss

    run.leak_start(at="after 90 s")
    paced_leak(run, step, 30)


def staircase_eval():
    """Every 3 to 9 s (irregular) an evaluation's results, 64 to 256 MiB, are appended to a
    list that is never cleared: a staircase from the first minute."""
    run = Run("staircase-eval", "tune", "irregular kept eval results", True, 28, 8)
    rng = random.Random(7)
    base = blob(mib(512))
    kept = []
    run.base_allocated = torch.cuda.memory_allocated()
    run.leak_start(at="first step")
    next_at = run.elapsed() + rng.uniform(3, 9)
    while run.running():
        if run.over_cap():
            run.end("oom-cap")
        if run.elapsed() >= next_at:
            kept.append(blob(mib(rng.choice([64, 128, 192, 256]))))
            next_at += rng.uniform(3, 9)
        time.sleep(0.05)
    del base
    run.end()


def fast_logits():
    """Every step's logits (a 256 x 32000 vocabulary, with their graph) appended to a list
    'for the epoch's metrics': 500 MB/s, out of memory in about 20 s."""
    run = Run("fast-logits", "tune", "logits of every step kept with their graph", True,
              500, 10)
    head = torch.nn.Linear(1024, 32000).to(DEV)
    kept = []

    def step():
        kept.append(head(torch.randn(256, 1024, device=DEV)))  # the bug

    run.leak_start(at="first step")
    paced_leak(run, step, 500)


def slow_norms():
    """Per-step gradient norms kept as GPU tensors (with the reduction's inputs) in a
    list: about 1 MB/s, the kind of leak that takes a day to fill a GPU."""
    run = Run("slow-norms", "tune", "gradient statistics kept as GPU tensors", True, 1, 2)
    model = mlp(512, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    norms = []

    def step():
        train_step(model, opt, torch.randn(128, 512, device=DEV))
        norms.append(torch.cat([p.grad.flatten() for p in model.parameters()]).clone())

    run.leak_start(at="first step")
    paced_leak(run, step, 1, max_period_s=4.0)


def ema_copies():
    """An 'EMA' that deep-copies the model every few steps into a list instead of updating
    one copy: a staircase of 64 MiB steps."""
    run = Run("ema-copies", "tune", "model copies appended every few steps", True, 50, 8)
    model = mlp(2048, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    copies = []

    def step():
        for _ in range(4):
            train_step(model, opt, torch.randn(128, 2048, device=DEV))
        copies.append([p.detach().clone() for p in model.parameters()])  # the bug

    run.leak_start(at="first step")
    paced_leak(run, step, 50)


# Tune half: not leaks


def dyn_lognormal():
    """Sequence lengths from a heavy-tailed (log-normal) distribution for the whole run: a
    new longest batch keeps arriving, ever more rarely, and the cache grows each time."""
    run = Run("dyn-lognormal", "tune", "log-normal sequence lengths", False)
    rng = random.Random(11)
    model = mlp(1024, 6)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    while run.running():
        n = min(int(rng.lognormvariate(6.0, 0.8)), 16384)
        train_step(model, opt, torch.randn(max(n, 8), 1024, device=DEV))
        torch.cuda.synchronize()
        time.sleep(0.08)
    run.end()


def grad_accum():
    """Gradient accumulation over 8 micro-batches: gradients build up, then the step."""
    run = Run("grad-accum", "tune", "gradient accumulation", False)
    model = mlp(2048, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    micro = 0
    while run.running():
        loss = model(torch.randn(512, 2048, device=DEV)).square().mean() / 8
        loss.backward()
        micro += 1
        if micro == 8:
            opt.step()
            opt.zero_grad(set_to_none=True)
            micro = 0
        torch.cuda.synchronize()
        time.sleep(0.05)
    run.end()


def periodic_eval():
    """Training with an evaluation pass every 40 s on a 4x larger batch under no_grad: the
    cache steps up at the first evaluation and is reused after."""
    run = Run("periodic-eval", "tune", "eval pass every 40 s", False)
    model = mlp(2048, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    next_eval = 40.0
    while run.running():
        train_step(model, opt, torch.randn(256, 2048, device=DEV))
        if run.elapsed() >= next_eval:
            with torch.no_grad():
                for _ in range(20):
                    model(torch.randn(1024 + random.randint(0, 512), 2048, device=DEV))
            next_eval += 40.0
        torch.cuda.synchronize()
        time.sleep(0.1)
    run.end()


def layer_loader():
    """A model loaded layer by layer, 24 layers of 128 MiB over about 20 s (reading a
    checkpoint shard by shard), then trained with constant memory."""
    run = Run("layer-loader", "tune", "24 layers loaded over 20 s", False)
    layers = []
    for _ in range(24):
        layers.append(torch.nn.Linear(5792, 5792, bias=False).to(DEV))
        torch.cuda.synchronize()
        time.sleep(0.8)
    model = torch.nn.Sequential(*layers[:4])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    label(run.name, "loaded")
    while run.running():
        train_step(model, opt, torch.randn(64, 5792, device=DEV))
        torch.cuda.synchronize()
        time.sleep(0.2)
    run.end()


def cudnn_autotune():
    """A conv net with cudnn.benchmark on images of six sizes: each new size autotunes
    (workspaces come and go) until every size has been seen."""
    run = Run("cudnn-autotune", "tune", "cudnn.benchmark, 6 image sizes", False)
    torch.backends.cudnn.benchmark = True
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(128, 128, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10),
    ).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    rng = random.Random(3)
    sizes = [96, 128, 160, 192, 224, 256]
    while run.running():
        s = rng.choice(sizes)
        train_step(model, opt, torch.randn(32, 3, s, s, device=DEV))
        torch.cuda.synchronize()
        time.sleep(0.1)
    run.end()


def idle_holder_tune():
    """Holds 6 GiB (at the memory scale) after a short computation and sleeps (a forgotten
    notebook)."""
    run = Run("idle-holder-a", "tune", "idle holder", False, idle=True)
    held = blob(scaled_mib(6 * 1024))
    a = torch.randn(4096, 4096, device=DEV)
    for _ in range(20):
        a = (a @ a).tanh()
    torch.cuda.synchronize()
    label(run.name, "idle_start")
    while run.running():
        time.sleep(1.0)
    del held
    run.end()


# ---------------------------------------------------------------------------------------
# Holdout half: leaks


def retained_graph():
    """`loss.backward(retain_graph=True)` every step, and the losses kept in a list for a
    plot: each retained graph keeps its saved activations."""
    run = Run("retained-graph", "holdout", "retain_graph=True and kept losses", True, 50, 8)
    model = mlp(1536, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []

    def step():
        loss = model(torch.randn(384, 1536, device=DEV)).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward(retain_graph=True)  # the bug, with the list below
        opt.step()
        losses.append(loss)

    run.leak_start(at="first step")
    paced_leak(run, step, 50)


def hook_activations():
    """A forward hook left in from debugging stores every layer's activations."""
    run = Run("hook-activations", "holdout", "forward hook storing activations", True, 120, 8)
    model = mlp(2048, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    store = []
    for m in model:
        if isinstance(m, torch.nn.Linear):
            m.register_forward_hook(lambda _m, _i, out: store.append(out.detach()))

    def step():
        train_step(model, opt, torch.randn(128, 2048, device=DEV))

    run.leak_start(at="first step")
    paced_leak(run, step, 120)


def kv_unbounded():
    """An inference loop that keeps every request's key/value tensors in a dict keyed by
    request id and never evicts them."""
    run = Run("kv-unbounded", "holdout", "KV cache never evicted", True, 8, 5)
    heads, dim = 16, 128
    proj = torch.nn.Linear(heads * dim, 2 * heads * dim).to(DEV).half()
    cache = {}
    rid = [0]

    def step():
        with torch.no_grad():
            n = 64
            kv = proj(torch.randn(n, heads * dim, device=DEV, dtype=torch.half))
            cache[rid[0]] = kv.view(n, 2, heads, dim).clone()  # the bug
        rid[0] += 1

    run.leak_start(at="first step")
    paced_leak(run, step, 8)


def tiny_metrics():
    """Per-step outputs kept as GPU tensors for a metric instead of reduced to floats:
    1 MiB a step, one step every 0.7 s, 1.5 MB/s."""
    run = Run("tiny-metrics", "holdout", "metrics kept as GPU tensors", True, 1.5, 2)
    model = mlp(1024, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    metrics = []

    def step():
        x = torch.randn(256, 1024, device=DEV)
        train_step(model, opt, x)
        with torch.no_grad():
            metrics.append(model(x).clone())  # the bug

    run.leak_start(at="first step")
    paced_leak(run, step, 1.5, max_period_s=4.0)


def dyn_and_leak():
    """Dynamic shapes (uniform lengths up to 4096) and a per-step tensor kept: the leak
    hides inside a warm-up-like staircase."""
    run = Run("dyn-and-leak", "holdout", "dynamic shapes plus kept tensors", True, 10, 6)
    rng = random.Random(5)
    model = mlp(1024, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kept = []

    def step():
        n = rng.randint(64, 4096)
        x = torch.randn(n, 1024, device=DEV)
        train_step(model, opt, x)
        kept.append(x[:256].clone())  # the bug: 1 MiB a step

    run.leak_start(at="first step")
    paced_leak(run, step, 10)


def late_hook():
    """Clean for 120 s, then a profiling hook switched on by a config flag stores each
    output: a late, fast leak."""
    run = Run("late-hook", "holdout", "hook switched on after 120 s", True, 200, 14,
              leak_after_s=120)
    model = mlp(2048, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    while run.elapsed() < 120:
        train_step(model, opt, torch.randn(256, 2048, device=DEV))
        torch.cuda.synchronize()
        time.sleep(0.1)
    store = []
    model[-2].register_forward_hook(lambda _m, _i, out: store.append(out.detach()))

    def step():
        train_step(model, opt, torch.randn(1024, 2048, device=DEV))

    run.leak_start(at="after 120 s")
    paced_leak(run, step, 200)


def exception_frames():
    """Every failed batch's exception is kept in a list for a report at the end; each
    traceback keeps its frames alive, and with them the batch's activations."""
    run = Run("exception-frames", "holdout", "kept exceptions keep their frames' tensors",
              True, 30, 6)
    model = mlp(1536, 3)
    errors = []

    def failing_step():
        x = torch.randn(256, 1536, device=DEV)
        hidden = model(x)  # lives in this frame
        raise ValueError(f"bad batch, loss {hidden.shape}")

    def step():
        try:
            failing_step()
        except ValueError as e:
            errors.append(e)  # the bug: e.__traceback__ keeps failing_step's frame

    run.leak_start(at="first step")
    paced_leak(run, step, 30)


def batch_cache():
    """A dataset wrapper that caches every batch it has moved to the GPU, keyed by index,
    over a stream that never repeats: 250 MB/s."""
    run = Run("batch-cache", "holdout", "GPU copies of every batch cached", True, 250, 8)
    model = mlp(1024, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    cache = {}
    index = [0]

    def step():
        batch = torch.randn(2048, 1024).to(DEV)
        cache[index[0]] = batch  # the bug: a cache with no bound
        index[0] += 1
        train_step(model, opt, batch)

    run.leak_start(at="first step")
    paced_leak(run, step, 250)


# Holdout half: not leaks


def dyn_pareto():
    """Sequence lengths from a Pareto distribution (alpha 2, scale 128, truncated at 6144
    tokens as a tokenizer's max length would) on a transformer layer: the longest batch so
    far keeps growing for minutes (the maximum of N draws grows like sqrt(N)) until the
    truncation is reached, about four minutes in."""
    run = Run("dyn-pareto", "holdout", "Pareto sequence lengths, transformer layer", False)
    rng = random.Random(13)
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True).to(DEV)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-4)
    while run.running():
        n = min(int(128 * rng.paretovariate(2.0)), 6144)
        x = torch.randn(4, n, 512, device=DEV)
        loss = layer(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        time.sleep(0.08)
    run.end()


def kv_fixed():
    """A KV cache that fills as requests arrive, up to 3 GiB over about 45 s (at the memory
    scale: 1 GiB over 15 s at 0.31), then evicts the oldest entries: memory rises steadily and
    then stays."""
    run = Run("kv-fixed", "holdout", "KV cache filling to a fixed size", False)
    block = mib(16)
    capacity = int(3 * 1024 * MEMORY_SCALE) // 16
    cache = []
    while run.running():
        cache.append(blob(block))
        if len(cache) > capacity:
            cache.pop(0)
        time.sleep(0.23)
    run.end()


def compile_warmup():
    """torch.compile's first steps: compilation and autotuning allocate, then steady."""
    run = Run("compile-warmup", "holdout", "torch.compile first steps", False)
    model = mlp(2048, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    try:
        compiled = torch.compile(model)
    except Exception as e:  # no compiler on this machine: still a valid steady workload
        label(run.name, "compile_unavailable", error=str(e)[:200])
        compiled = model
    while run.running():
        loss = compiled(torch.randn(512, 2048, device=DEV)).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        time.sleep(0.1)
    run.end()


def pinned_loader():
    """A DataLoader with pinned host memory and two workers feeding a steady model."""
    run = Run("pinned-loader", "holdout", "DataLoader with pin_memory", False)
    ds = torch.utils.data.TensorDataset(torch.randn(20000, 1024), torch.randn(20000, 1))
    loader = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True, num_workers=2,
                                         pin_memory=True, persistent_workers=True)
    model = mlp(1024, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    while run.running():
        for x, _y in loader:
            if not run.running():
                break
            train_step(model, opt, x.to(DEV, non_blocking=True))
            torch.cuda.synchronize()
            time.sleep(0.05)
    run.end()


def sawtooth_empty_cache():
    """Inference on large batches with torch.cuda.empty_cache() every 25 requests: the
    reserve climbs to the peak and drops back, over and over."""
    run = Run("sawtooth-empty-cache", "holdout", "empty_cache every 25 requests", False)
    model = mlp(4096, 3).half()
    i = 0
    while run.running():
        with torch.no_grad():
            n = random.randint(1024, 8192)
            model(torch.randn(n, 4096, device=DEV, dtype=torch.half))
        i += 1
        if i % 25 == 0:
            torch.cuda.empty_cache()
        torch.cuda.synchronize()
        time.sleep(0.1)
    run.end()


def lazy_optimizer():
    """Adam's state appears at the first step (a step up of twice the parameters), a
    checkpoint is written to host memory every 60 s, and memory stays flat after."""
    run = Run("lazy-optimizer", "holdout", "optimizer state at step one, checkpoints", False)
    model = mlp(3072, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    next_ckpt = 60.0
    while run.running():
        train_step(model, opt, torch.randn(256, 3072, device=DEV))
        if run.elapsed() >= next_ckpt:
            _host = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
            next_ckpt += 60.0
        torch.cuda.synchronize()
        time.sleep(0.1)
    run.end()


def rare_big_batch():
    """Steady training with a batch twice the usual size every ~100 steps (a bucketed
    sampler's longest bucket): one step up of the cache, then reuse."""
    run = Run("rare-big-batch", "holdout", "occasional double batch", False)
    model = mlp(2048, 6)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(17)
    while run.running():
        n = 1024 if rng.random() < 0.01 else 512
        train_step(model, opt, torch.randn(n, 2048, device=DEV))
        torch.cuda.synchronize()
        time.sleep(0.1)
    run.end()


def idle_then_exit():
    """Holds 4 GiB (at the memory scale) idle for most of the run, then exits a minute before
    the end: its idle span must survive its exit in the batch verdict."""
    run = Run("idle-then-exit", "holdout", "idle holder that exits", False, idle=True)
    held = blob(scaled_mib(4 * 1024))
    torch.cuda.synchronize()
    label(run.name, "idle_start")
    while run.elapsed() < DURATION_S - 60:
        time.sleep(1.0)
    del held
    run.end()


WORKLOADS = {f.__name__.replace("_", "-"): f for f in [
    total_loss, kept_outputs, detached_cache, grad_history, after_plateau, staircase_eval,
    fast_logits, slow_norms, ema_copies, exception_frames, batch_cache,
    dyn_lognormal, grad_accum, periodic_eval, layer_loader, cudnn_autotune, idle_holder_tune,
    retained_graph, hook_activations, kv_unbounded, tiny_metrics, dyn_and_leak, late_hook,
    dyn_pareto, kv_fixed, compile_warmup, pinned_loader, sawtooth_empty_cache,
    lazy_optimizer, rare_big_batch, idle_then_exit,
]}

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--scale-for-mib":
        # record-leakset-h200.sh's question: the scale for GPU 0's memory.total.
        try:
            total = int(sys.argv[2])
        except ValueError:
            print(f"leakset.py: error: memory.total '{sys.argv[2]}' is not a number of MiB", file=sys.stderr)
            sys.exit(2)
        scale = scale_for_gpu(total)
        if scale is None:
            print(f"leakset.py: error: a GPU of '{sys.argv[2]}' MiB is too small for the leak set "
                  f"(its memory scale would be under {MIN_SCALE}; about 70 GiB is the least)", file=sys.stderr)
            sys.exit(2)
        print(scale)
        sys.exit(0)
    if len(sys.argv) != 2 or sys.argv[1] not in WORKLOADS:
        print("usage: leakset.py NAME | --scale-for-mib MIB; names: " + " ".join(WORKLOADS), file=sys.stderr)
        sys.exit(2)
    torch.manual_seed(0)
    random.seed(0)
    WORKLOADS[sys.argv[1]]()
