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
"""
import json
import os
import sys
import time

T_START = time.monotonic()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import transformers  # noqa: E402

from cases import BY_NAME  # noqa: E402

STEPS = 3
SEED = 0
DTYPES = {"fp32": torch.float32, "amp-bf16": torch.float32, "bf16": torch.bfloat16}


def build(c):
    with open(c["config"]) as f:
        raw = json.load(f)
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
    # The default dtype makes every parameter in the job's dtype as it is created; the
    # keyword (`dtype` in transformers 5, `torch_dtype` before) is given as well.
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda"):
            try:
                model = cls.from_config(config, attn_implementation=c["attention"], dtype=dtype)
            except TypeError:
                model = cls.from_config(config, attn_implementation=c["attention"], torch_dtype=dtype)
    finally:
        torch.set_default_dtype(torch.float32)
    attn = getattr(model.config, "_attn_implementation", None)
    if attn != c["attention"]:
        raise SystemExit(f"error: built with attention '{attn}', not '{c['attention']}'")
    return model, config


class HandLora(torch.nn.Module):
    """PEFT's LoRA forward (base(x) + B(A(x)) * alpha/r) with fp32 adapters, for machines
    without PEFT; PEFT casts the input to the adapters' dtype the same way."""

    def __init__(self, base, r):
        super().__init__()
        self.base = base
        self.a = torch.nn.Linear(base.in_features, r, bias=False, device=base.weight.device)
        self.b = torch.nn.Linear(r, base.out_features, bias=False, device=base.weight.device)
        torch.nn.init.zeros_(self.b.weight)
        self.scale = 1.0

    def forward(self, x):
        out = self.base(x)
        return out + (self.b(self.a(x.to(self.a.weight.dtype))) * self.scale).to(out.dtype)


def add_lora(model, r):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        for p in model.parameters():
            p.requires_grad_(False)
        for module in list(model.modules()):
            for name in ("q_proj", "v_proj"):
                child = getattr(module, name, None)
                if isinstance(child, torch.nn.Linear):
                    setattr(module, name, HandLora(child, r))
        return model, "hand"
    cfg = LoraConfig(r=r, lora_alpha=r, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                     task_type="CAUSAL_LM")
    return get_peft_model(model, cfg), "peft"


def train(c, model, config):
    lora_impl = None
    if c["lora"]:
        model, lora_impl = add_lora(model, c["lora"])
    if c["ckpt"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    vocab = config.vocab_size
    ids = torch.randint(0, vocab, (c["batch"], c["seq"]), device="cuda", generator=gen)
    kwargs = {"input_ids": ids, "labels": ids}
    if config.model_type == "t5":
        kwargs["labels"] = torch.randint(0, vocab, (c["batch"], c["seq"]), device="cuda", generator=gen)
    amp = c["precision"] == "amp-bf16"
    torch.cuda.synchronize()
    t_ready = time.monotonic()
    phases = {}
    for step in range(STEPS):
        # With TRUTH_PHASES=1 the last step is measured phase by phase (the peaks are then
        # not the whole run's: max_memory_allocated is reset between phases).
        measure = os.environ.get("TRUTH_PHASES") == "1" and step == STEPS - 1
        opt.zero_grad(set_to_none=True)
        if measure:
            phases["static_bytes"] = mark()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = model(**kwargs).loss
        if measure:
            phases["after_forward_bytes"] = torch.cuda.memory_allocated()
            phases["forward_peak_bytes"] = mark()
        loss.backward()
        if measure:
            phases["after_backward_bytes"] = torch.cuda.memory_allocated()
            phases["backward_peak_bytes"] = mark()
        opt.step()
        if measure:
            phases["step_peak_bytes"] = mark()
    torch.cuda.synchronize()
    if not torch.isfinite(loss.detach()).item():
        raise SystemExit(f"error: loss is not finite ('{loss.item()}')")
    return t_ready, {"lora_impl": lora_impl, "trainable_params": sum(p.numel() for p in trainable),
                     "phases": phases or None}


def mark():
    """The allocated peak since the last mark, then a new mark."""
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    return peak


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


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in BY_NAME:
        raise SystemExit(f"usage: truth.py CASE (one of: {', '.join(BY_NAME)})")
    c = BY_NAME[sys.argv[1]]
    torch.manual_seed(SEED)
    torch.cuda.set_device(0)
    model, config = build(c)
    params = sum(p.numel() for p in model.parameters())
    t_ready, extra = (train if c["mode"] == "train" else infer)(c, model, config)
    t_end = time.monotonic()
    print(json.dumps({
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
    }), flush=True)


if __name__ == "__main__":
    main()
