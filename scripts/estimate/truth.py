"""Run one case of the `vramctl estimate` truth set on the GPU (issue 16).

    python3 scripts/estimate/truth.py CASE        (from the repository root; CASE from cases.py)

Random weights built from the case's config.json directly on the GPU in the job's dtype (the
GPU machine has no network, and building in fp32 first would leave a fp32 copy's worth of
memory in PyTorch's cache, which is not what a user's job holds). Then, as people run it:

  train  transformers' model with its default loss on all tokens (causal LM: labels = input
         ids; BERT: BertForMaskedLM with labels on every token; T5: a decoder as long as the
         encoder), torch.optim.AdamW (foreach, the default on CUDA), zero_grad(set_to_none),
         3 optimizer steps (step 0 is not the peak: the states appear during its step());
         amp-bf16 = fp32 weights under torch.autocast(bfloat16); bf16 = pure bf16 weights and
         states; --checkpointing = gradient_checkpointing_enable(use_reentrant=False);
         LoRA = PEFT's LoraConfig(r, target_modules q_proj/v_proj, no dropout) when PEFT is
         installed, else the same adapters written here (the line says which).
  infer  model.generate(greedy, exactly `gen` new tokens, KV cache on) under inference_mode.

Prints one JSON line on stdout: the case, torch's max_memory_allocated / max_memory_reserved,
the parameter count, versions, times. NVML's per-process peak comes from `vramctl run`, which
runs this script (scripts/estimate-h200.sh).

A sharded case (cases.SHARDED, issue 36) runs under `torchrun --nproc_per_node GPUS`, one
rank per GPU (LOCAL_RANK), NCCL, the same step with `batch` per rank and each rank's own
inputs: ddp wraps the model built on the rank's GPU in DistributedDataParallel with its
defaults; fsdp builds it on the meta device, applies FSDP2's `fully_shard` to every block
(the model's `_no_split_modules`) and then the root, and materialises only the rank's shards
(`to_empty`, weights drawn again, the buffers - RoPE's inv_freq and the like, computed by
the constructors - copied from a one-block build on the CPU). Each rank samples NVML's
per-process figure for its own PID every 20 ms on a thread (nvml_peak.py: the figure
nvidia-smi shows; on its own GPU, and apart on any other, where a stray context would show), beside torch's
max_memory_allocated/reserved; rank 0 gathers the ranks' records and prints one line with
"ranks": [...] and the max over ranks. TRUTH_SMOKE=1 shrinks the model to 2 blocks and a
512-token vocabulary at batch 1 x 32 (the path, not a measurement: the line says "smoke"),
TRUTH_DEVICE=cpu runs on the CPU over gloo (no NVML): what can be checked without GPUs.

Environment (training cases; none of it allocates GPU memory or changes what is allocated):

  TRUTH_PHASES=1  mark every phase of every step: after zero_grad ("start"), the forward,
                  the loss's backward (a hook on the logits' gradient: the loss and its
                  upcasts are done, the blocks' backward and recompute not yet), the whole
                  backward, optimizer.step(). Each mark holds the allocated and reserved
                  bytes now and at their peak since the previous mark, and counters of
                  torch.cuda.memory_stats() that tell fragmentation apart (STATS); peaks are
                  reset at each mark, so the line's own peak_allocated_bytes is the last
                  phase's and run_peak_allocated_bytes the run's. Round 1's keys for the last
                  step (static_bytes, after_forward_bytes, ...) are kept. Without
                  checkpointing it adds a census of the saved tensors: one more forward after
                  the measured steps (under saved_tensors_hooks that return each tensor
                  unchanged; its graph is dropped without a backward) counting the bytes
                  autograd keeps per module and dtype, each storage once.
  TRUTH_TRACE=P   record the caching allocator's history (alloc, free, segment alloc/free,
                  sizes and addresses; no stack traces) from before the model is built, and
                  write it with the final segments to P (gzipped JSON): what a replay of the
                  allocator needs to explain reserved minus allocated.
"""
import gzip
import json
import os
import re
import sys
import time

T_START = time.monotonic()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# NVLink multicast stays off whatever environment this was started with (the GPU machines'
# rule: a program using it can put a host's shared GPUs out of service); NCCL reads these
# when a sharded case's process group starts.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402
import transformers  # noqa: E402

from cases import BY_NAME  # noqa: E402

STEPS = 3
SEED = 0
DTYPES = {"fp32": torch.float32, "amp-bf16": torch.float32, "bf16": torch.bfloat16}
PHASES = os.environ.get("TRUTH_PHASES") == "1"
TRACE = os.environ.get("TRUTH_TRACE")
TRACE_MAX_ENTRIES = 2_000_000
# memory_stats() counters recorded at each phase mark: cudaMalloc/cudaFree calls and
# retries, free bytes inside split blocks (what a larger request cannot use), requested
# versus rounded bytes, segments per pool.
STATS = ("num_alloc_retries", "num_device_alloc", "num_device_free",
         "inactive_split_bytes.all.current", "inactive_split_bytes.all.peak",
         "inactive_split.all.current", "requested_bytes.all.peak", "active_bytes.all.peak",
         "segment.all.current", "segment.large_pool.current",
         "reserved_bytes.large_pool.current", "reserved_bytes.small_pool.current")


LAYER_KEYS = ("n_layer", "num_hidden_layers")
TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id")


def shrink(raw, layers, vocab):
    """The config with `layers` blocks and a `vocab`-token vocabulary (widths unchanged);
    special token ids past the new vocabulary point at its last token."""
    raw = dict(raw)
    for key in LAYER_KEYS:
        if key in raw:
            raw[key] = layers
    raw["vocab_size"] = vocab
    for key in TOKEN_ID_KEYS:
        ids = raw.get(key)
        if isinstance(ids, int) and ids >= vocab:
            raw[key] = vocab - 1
        elif isinstance(ids, list):
            raw[key] = [min(i, vocab - 1) for i in ids]
    return raw


def build(c, device="cuda", layers=None, vocab=None):
    """The case's model with random weights, built on `device` ("meta": no memory at all);
    layers/vocab shrink it (the sharded cases' buffer donor and smoke run)."""
    with open(c["config"]) as f:
        raw = json.load(f)
    if layers is not None:
        raw = shrink(raw, layers, vocab)
    model_type = raw.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **raw)
    if c["mode"] == "train":
        config.use_cache = False
    if model_type == "bert" and c["mode"] == "train":
        cls = transformers.AutoModelForMaskedLM
    elif model_type == "t5":
        cls = transformers.AutoModelForSeq2SeqLM
    else:
        cls = transformers.AutoModelForCausalLM
    dtype = DTYPES[c["precision"]]
    # cast: built in fp32, then `.to(dtype)` (issue 34, round 4): the fp32 copy is freed
    # parameter by parameter and stays reserved.
    final = dtype
    if c.get("cast"):
        dtype = torch.float32
    # The default dtype makes every parameter in the job's dtype as it is created; the
    # keyword (`dtype` in transformers 5, `torch_dtype` before) is given as well.
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            try:
                model = cls.from_config(config, attn_implementation=c["attention"], dtype=dtype)
            except TypeError:
                model = cls.from_config(config, attn_implementation=c["attention"], torch_dtype=dtype)
    finally:
        torch.set_default_dtype(torch.float32)
    if final is not dtype:
        model = model.to(final)
    attn = getattr(model.config, "_attn_implementation", None)
    if attn != c["attention"]:
        raise SystemExit(f"error: built with attention '{attn}', not '{c['attention']}'")
    return model, config


class HandLora(torch.nn.Module):
    """PEFT's LoRA forward (base(x) + B(A(dropout(x))) * alpha/r) with fp32 adapters, for
    machines without PEFT; PEFT casts the input to the adapters' dtype the same way."""

    def __init__(self, base, r, dropout=0.0):
        super().__init__()
        self.base = base
        self.a = torch.nn.Linear(base.in_features, r, bias=False, device=base.weight.device)
        self.b = torch.nn.Linear(r, base.out_features, bias=False, device=base.weight.device)
        torch.nn.init.zeros_(self.b.weight)
        self.drop = torch.nn.Dropout(dropout) if dropout > 0 else torch.nn.Identity()
        self.scale = 1.0

    def forward(self, x):
        out = self.base(x)
        return out + (self.b(self.a(self.drop(x.to(self.a.weight.dtype)))) * self.scale).to(out.dtype)


ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def add_lora(model, r, targets="q-v", dropout=0.0):
    """targets: q-v (PEFT's default here) or all-linear (issue 34, round 4)."""
    names = ("q_proj", "v_proj") if targets == "q-v" else ALL_LINEAR
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        for p in model.parameters():
            p.requires_grad_(False)
        for module in list(model.modules()):
            for name in names:
                child = getattr(module, name, None)
                if isinstance(child, torch.nn.Linear):
                    setattr(module, name, HandLora(child, r, dropout))
        return model, "hand"
    cfg = LoraConfig(r=r, lora_alpha=r, lora_dropout=dropout,
                     target_modules=["q_proj", "v_proj"] if targets == "q-v" else "all-linear",
                     task_type="CAUSAL_LM")
    return get_peft_model(model, cfg), "peft"


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(c, model, config, device=torch.device("cuda"), wrap=None, seed=SEED):
    """wrap: a sharded case's DDP or FSDP, applied once checkpointing is set on the model."""
    lora_impl = None
    if c["lora"]:
        model, lora_impl = add_lora(model, c["lora"], c.get("lora_targets", "q-v"),
                                    0.05 if c.get("lora_dropout") else 0.0)
    if c["ckpt"] == "default":
        # As issue 34's held-out jobs called it: transformers' own default.
        model.gradient_checkpointing_enable()
    elif c["ckpt"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if wrap is not None:
        model = wrap(model)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    # fused: AdamW(fused=True), the Trainer's default since torch 2.8 (issue 34, round 4).
    opt = torch.optim.AdamW(trainable, lr=1e-4, fused=True if c.get("fused") else None)
    gen = torch.Generator(device=device).manual_seed(seed)
    vocab = config.vocab_size
    ids = torch.randint(0, vocab, (c["batch"], c["seq"]), device=device, generator=gen)
    kwargs = {"input_ids": ids, "labels": ids}
    if config.model_type == "t5":
        # target: T5's decoder length when it is not the input's (issue 34, round 4)
        kwargs["labels"] = torch.randint(0, vocab, (c["batch"], c.get("target") or c["seq"]), device=device,
                                         generator=gen)
    amp = c["precision"] == "amp-bf16"
    synchronize(device)
    t_ready = time.monotonic()
    marks = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        if PHASES:
            marks.append(mark("start", step))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            out = model(**kwargs)
        loss = out.loss
        if PHASES:
            mark_at_logits_gradient(out, marks, step)
        # The output holds the logits; a job that keeps only the loss lets them go here,
        # before the forward's mark (as round 1 measured it).
        del out
        if PHASES:
            marks.append(mark("forward", step))
        loss.backward()
        if PHASES:
            marks.append(mark("backward", step))
        opt.step()
        if PHASES:
            marks.append(mark("step", step))
    synchronize(device)
    if not torch.isfinite(loss.detach()).item():
        raise SystemExit(f"error: loss is not finite ('{loss.item()}')")
    del loss
    extra = {"lora_impl": lora_impl, "trainable_params": sum(p.numel() for p in trainable)}
    if PHASES:
        extra["phases"] = phases_of(marks)
        extra["run_peak_allocated_bytes"] = max(m["allocated_peak"] for m in marks)
    extra["model"] = model  # wrapped by PEFT with LoRA; taken out before the line is printed
    return t_ready, extra


def mark(at, step):
    """Allocated and reserved bytes now and at their peak since the last mark, a few
    allocator counters, then a new mark (peaks reset)."""
    torch.cuda.synchronize()
    s = torch.cuda.memory_stats()
    rec = {"step": step, "at": at, "t_us": time.time_ns() // 1000,
           "allocated_peak": s.get("allocated_bytes.all.peak", 0),
           "allocated": s.get("allocated_bytes.all.current", 0),
           "reserved_peak": s.get("reserved_bytes.all.peak", 0),
           "reserved": s.get("reserved_bytes.all.current", 0)}
    rec.update({k: s.get(k) for k in STATS})
    torch.cuda.reset_peak_memory_stats()
    return rec


def mark_at_logits_gradient(out, marks, step):
    """Marks the moment the logits' gradient is made: the loss's backward (its fp32 upcast,
    log-softmax and their gradients) is over and the blocks' backward has not begun. The
    hook holds no reference to the logits."""
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor) and logits.requires_grad:
        logits.register_hook(lambda _grad: marks.append(mark("loss_backward", step)))


def phases_of(marks):
    """Round 1's keys for the last step (its `static_bytes` is the peak before the last
    forward), the last step's loss-backward peak, and every mark."""
    last = STEPS - 1
    at = {m["at"]: m for m in marks if m["step"] == last}
    before = [m for m in marks if m["step"] < last or m["at"] == "start"]
    backward = [at[k]["allocated_peak"] for k in ("loss_backward", "backward") if k in at]
    return {
        "static_bytes": max(m["allocated_peak"] for m in before),
        "after_forward_bytes": at["forward"]["allocated"],
        "forward_peak_bytes": at["forward"]["allocated_peak"],
        "loss_backward_peak_bytes": at["loss_backward"]["allocated_peak"] if "loss_backward" in at else None,
        "after_backward_bytes": at["backward"]["allocated"],
        "backward_peak_bytes": max(backward),
        "step_peak_bytes": at["step"]["allocated_peak"],
        "marks": marks,
    }


def census(c, model, config):
    """The bytes autograd saves in one forward, per module (layer indices as *) and dtype,
    each storage counted once and given to the first module that saves it; parameters and
    autocast's cached weight casts apart. Run after the measured steps: a forward whose
    graph is dropped without a backward, so it holds less than a training step (the
    gradients are let go first, as zero_grad does, and the optimizer is gone)."""
    model.zero_grad(set_to_none=True)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    names = {id(m): re.sub(r"\.\d+(?=\.|$)", ".*", n) or "(model)" for n, m in model.named_modules()}
    stack = []
    saved = {}
    weight_casts = 0

    def pre(module, _args):
        stack.append(names.get(id(module), type(module).__name__))

    def post(_module, _args, _out):
        if stack:
            stack.pop()

    def pack(t):
        nonlocal weight_casts
        if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
            return t
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in params or ptr in saved:
            return t
        fn = t.grad_fn
        if fn is not None and type(fn).__name__ == "ToCopyBackward0" and any(
                f is not None and type(f).__name__ == "AccumulateGrad" for f, _ in fn.next_functions):
            weight_casts += storage.nbytes()
            saved[ptr] = None
            return t
        saved[ptr] = (stack[-1] if stack else "(outside modules)", str(t.dtype).removeprefix("torch."),
                      storage.nbytes())
        return t

    tokens = c["batch"] * c["seq"]
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    ids = torch.randint(0, config.vocab_size, (c["batch"], c["seq"]), device="cuda", generator=gen)
    kwargs = {"input_ids": ids, "labels": ids}
    if config.model_type == "t5":
        kwargs["labels"] = torch.randint(0, config.vocab_size, (c["batch"], c["seq"]), device="cuda",
                                         generator=gen)
    reserved_before = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    hooks = [torch.nn.modules.module.register_module_forward_pre_hook(pre),
             torch.nn.modules.module.register_module_forward_hook(post)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=c["precision"] == "amp-bf16"):
                loss = model(**kwargs).loss
    finally:
        for h in hooks:
            h.remove()
    del loss
    torch.cuda.synchronize()
    by_module = {}
    for entry in saved.values():
        if entry is None:
            continue
        module, dtype, nbytes = entry
        by_module.setdefault(module, {}).setdefault(dtype, 0)
        by_module[module][dtype] += nbytes
    total = sum(sum(d.values()) for d in by_module.values())
    return {
        "tokens": tokens,
        "saved_bytes": total,
        "saved_bytes_per_token": round(total / tokens, 1),
        "weight_cast_bytes": weight_casts,
        "by_module": dict(sorted(by_module.items(), key=lambda kv: -sum(kv[1].values()))),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "reserved_growth_bytes": torch.cuda.memory_reserved() - reserved_before,
    }


def write_trace(path):
    """The allocator's recorded history and its segments now, compactly: events as
    [action, address, size, time_us] (a alloc, f free requested, F free completed, S/s
    segment alloc/free, M/m segment map/unmap, o OOM), segments as [address, total,
    allocated, [[block size, a(ctive)/p(ending free)/i(nactive)], ...]]."""
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    codes = {"alloc": "a", "free_requested": "f", "free_completed": "F", "segment_alloc": "S",
             "segment_free": "s", "segment_map": "M", "segment_unmap": "m", "oom": "o", "snapshot": "n"}
    device = torch.cuda.current_device()
    traces = snap.get("device_traces", [])
    events = [[codes.get(e["action"], e["action"]), e.get("addr", 0), e.get("size", 0), e.get("time_us", 0)]
              for e in (traces[device] if device < len(traces) else [])]
    segments = [[seg["address"], seg["total_size"], seg["allocated_size"],
                 [[b["size"], b["state"][:1] if b["state"] != "active_pending_free" else "p"]
                  for b in seg["blocks"]]]
                for seg in snap.get("segments", []) if seg.get("device", device) == device]
    with gzip.open(path, "wt") as f:
        json.dump({"max_entries": TRACE_MAX_ENTRIES, "events": events, "segments": segments}, f,
                  separators=(",", ":"))
    return len(events)


def infer(c, model, config):
    model.eval()
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    ids = torch.randint(0, config.vocab_size, (c["batch"], c["seq"]), device="cuda", generator=gen)
    mask = torch.ones_like(ids)
    torch.cuda.synchronize()
    t_ready = time.monotonic()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=c["gen"],
                             min_new_tokens=c["gen"], do_sample=False, use_cache=True,
                             pad_token_id=0)
    torch.cuda.synchronize()
    made = out.shape[1] - c["seq"]
    if made != c["gen"]:
        raise SystemExit(f"error: generated {made} tokens, not {c['gen']}")
    cache = type(getattr(model, "_cache", None)).__name__
    return t_ready, {"generated": made, "cache": cache}


SMOKE = os.environ.get("TRUTH_SMOKE") == "1"
SMOKE_LAYERS, SMOKE_VOCAB, SMOKE_BATCH, SMOKE_SEQ = 2, 512, 1, 32
# The donor of a meta-built model's buffers: one block, a small vocabulary.
DONOR_LAYERS, DONOR_VOCAB = 1, 512
DDP_DEFAULTS = {"bucket_cap_mb": 25, "gradient_as_bucket_view": False, "find_unused_parameters": False}


def layer_pattern(name):
    return re.sub(r"\.\d+(?=\.|$)", ".*", name)


def donor_buffers(c):
    """The model's buffers (RoPE's inv_freq, masks): its constructors compute them from the
    config, so a model built on the meta device has none. One block of the same config built
    on the CPU has them all, named with block indices as '*'."""
    donor, _ = build(c, "cpu", layers=DONOR_LAYERS, vocab=DONOR_VOCAB)
    return {layer_pattern(n): b.detach().clone() for n, b in donor.named_buffers()}


def draw_weights(model, gen):
    """Random weights for a model materialised by `to_empty` (values do not matter to memory,
    only a finite loss does): N(0, 0.02) for matrices, norms' weights 1, biases 0, each rank
    drawing its own shard."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if local.dim() >= 2:
                local.normal_(0.0, 0.02, generator=gen)
            elif name.endswith("bias"):
                local.zero_()
            else:
                local.fill_(1.0)


def fsdp_wrap(c, device, world, rank):
    """FSDP2 as cases.py describes it: every block (`_no_split_modules`) a unit, then the
    root; the block units reshard after the forward (the root keeps FSDP2's own default),
    no mixed-precision policy (weights are gathered in their own dtype)."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch before 2.6
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    buffers = donor_buffers(c)

    def wrap(model):
        mesh = init_device_mesh(device.type, (world,))
        kinds = set(getattr(model, "_no_split_modules", None) or ())
        units = [m for m in model.modules() if type(m).__name__ in kinds]
        if not units:
            raise SystemExit(f"error: {type(model).__name__} names no block to shard (_no_split_modules)")
        for unit in units:
            fully_shard(unit, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh)
        model.to_empty(device=device)
        draw_weights(model, torch.Generator(device=device).manual_seed(SEED + rank))
        with torch.no_grad():
            for name, b in model.named_buffers():
                src = buffers.get(layer_pattern(name))
                if src is None or src.shape != b.shape:
                    raise SystemExit(f"error: no buffer '{name}' {tuple(b.shape)} in the one-block build")
                b.copy_(src)
        wrap.units = len(units)
        return model

    return wrap


def sharded_main(c):
    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if world != c["gpus"]:
        raise SystemExit(f"error: case '{c['name']}' is for {c['gpus']} ranks, torchrun started {world}")
    if PHASES or TRACE:
        raise SystemExit("error: TRUTH_PHASES and TRUTH_TRACE are single-GPU only")
    if SMOKE:
        c = {**c, "batch": SMOKE_BATCH, "seq": SMOKE_SEQ}
    on_cpu = os.environ.get("TRUTH_DEVICE") == "cpu"
    nvml = None
    if on_cpu:
        device = torch.device("cpu")
        uuid = None
    else:
        if torch.cuda.device_count() < world:
            raise SystemExit(f"error: {world} ranks need {world} GPUs, {torch.cuda.device_count()} visible")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        uuid = "GPU-" + str(torch.cuda.get_device_properties(local_rank).uuid)
        from nvml_peak import NvmlPeak
        nvml = NvmlPeak(uuid)
        nvml.start()
    dist.init_process_group(backend="gloo" if on_cpu else "nccl")
    torch.manual_seed(SEED)
    shrunk = {"layers": SMOKE_LAYERS, "vocab": SMOKE_VOCAB} if SMOKE else {}
    if c["sharding"] == "ddp":
        model, config = build(c, device, **shrunk)

        def wrap(m):
            from torch.nn.parallel import DistributedDataParallel
            return DistributedDataParallel(m, device_ids=None if on_cpu else [local_rank], **DDP_DEFAULTS)
    else:
        model, config = build(c, "meta", **shrunk)
        wrap = fsdp_wrap(c, device, world, rank)
    params = sum(p.numel() for p in model.parameters())
    t_ready, extra = train(c, model, config, device=device, wrap=wrap, seed=SEED + rank)
    model = extra.pop("model")
    t_end = time.monotonic()
    mine = {
        "rank": rank,
        "local_rank": local_rank,
        "pid": os.getpid(),
        "gpu_uuid": uuid,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device) if not on_cpu else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device) if not on_cpu else None,
        "local_params": sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters()),
        "init_s": round(t_ready - T_START, 2),
        "work_s": round(t_end - t_ready, 2),
    }
    # NVML's sampling ends before the gather, whose buffers are not the job's.
    if nvml is not None:
        mine.update(nvml.stop())
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        def most(key):
            values = [r[key] for r in ranks if r.get(key) is not None]
            return max(values) if len(values) == len(ranks) else None

        line = {
            "case": c["name"],
            "gpus": world,
            "sharding": c["sharding"],
            "backend": dist.get_backend(),
            "wrapper": ({"ddp": {"class": "DistributedDataParallel", **DDP_DEFAULTS}}
                        if c["sharding"] == "ddp" else
                        {"fsdp": {"api": "fully_shard", "units": getattr(wrap, "units", None) + 1,
                                  "reshard_after_forward": "blocks True, root default"}}),
            "nvml_peak_bytes": most("nvml_peak_bytes"),
            "peak_allocated_bytes": most("peak_allocated_bytes"),
            "peak_reserved_bytes": most("peak_reserved_bytes"),
            "params": params,
            "ranks": ranks,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if not on_cpu else None,
            "transformers": transformers.__version__,
            **({"smoke": True, "smoke_shape": {**shrunk, "batch": SMOKE_BATCH, "seq": SMOKE_SEQ}} if SMOKE else {}),
            **extra,
        }
        print(json.dumps(line), flush=True)
    dist.destroy_process_group()


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in BY_NAME:
        raise SystemExit(f"usage: truth.py CASE (one of: {', '.join(BY_NAME)})")
    c = BY_NAME[sys.argv[1]]
    if c.get("gpus", 1) > 1:
        if "LOCAL_RANK" not in os.environ:
            raise SystemExit(f"error: case '{c['name']}' is sharded over {c['gpus']} GPUs: run it under "
                             f"torchrun --nproc_per_node {c['gpus']} (scripts/estimate/runner.py --sharded does)")
        return sharded_main(c)
    torch.manual_seed(SEED)
    torch.cuda.set_device(0)
    if TRACE:
        torch.cuda.memory._record_memory_history(enabled="all", context=None,
                                                 max_entries=TRACE_MAX_ENTRIES)
    model, config = build(c)
    params = sum(p.numel() for p in model.parameters())
    t_ready, extra = (train if c["mode"] == "train" else infer)(c, model, config)
    model = extra.pop("model", model)
    t_end = time.monotonic()
    line = {
        "case": c["name"],
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "params": params,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "init_s": round(t_ready - T_START, 2),
        "work_s": round(t_end - t_ready, 2),
        **extra,
    }
    # After torch's peaks are read: neither adds to them (the census's own peak and any
    # growth of reserved memory are in its record).
    # Neither may cost the case its line: a failure is recorded instead.
    if TRACE:
        try:
            line["trace_events"] = write_trace(TRACE)
        except Exception as e:  # noqa: BLE001
            line["trace_error"] = repr(e)
    if PHASES and c["mode"] == "train" and not c["ckpt"]:
        try:
            line["census"] = census(c, model, config)
        except Exception as e:  # noqa: BLE001
            line["census_error"] = repr(e)
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
