"""Issue 34 probes on a GPU (tuning measurements only: every job here was already reported
in the issue or OOMed in estimate34; nothing held back is run). Prints one JSON line per job:
torch's max_memory_allocated/reserved, and for generation the allocator trace's summary.

  python3 scripts/estimate/probe34.py ckpt|gen|all OUTDIR
"""
import json, sys, time, os
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

CONFIGS = "testdata/model/configs"


def reset():
    import gc
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def line(**kw):
    print(json.dumps(kw), flush=True)


def ckpt_job(config, batch, seq, mode, steps=3, trace=None):
    """amp-bf16 training with checkpointing: mode none|default|reentrant|nonreentrant."""
    reset()
    cfg = AutoConfig.from_pretrained(f"{CONFIGS}/{config}.json")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).cuda()
    if mode == "default":
        model.gradient_checkpointing_enable()
    elif mode == "reentrant":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    elif mode == "nonreentrant":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
    if trace:
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids)
        loss = out.loss
        del out
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    if trace:
        torch.cuda.memory._dump_snapshot(trace)
        torch.cuda.memory._record_memory_history(enabled=None)
    line(job=f"{config}-ampbf16-ckpt-{mode}-b{batch}x{seq}", allocated=torch.cuda.max_memory_allocated(),
         reserved=torch.cuda.max_memory_reserved())
    del model, opt, ids, loss


def gen_job(config, batch, seq, gen, dtype, trace=None):
    reset()
    cfg = AutoConfig.from_pretrained(f"{CONFIGS}/{config}.json")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).cuda().eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
    mask = torch.ones_like(ids)
    if trace:
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    before = torch.cuda.memory_allocated()
    try:
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=gen, min_new_tokens=gen,
                                 do_sample=False, pad_token_id=0)
        ok = True
    except torch.OutOfMemoryError:
        ok = False
    torch.cuda.synchronize()
    if trace:
        torch.cuda.memory._dump_snapshot(trace)
        torch.cuda.memory._record_memory_history(enabled=None)
    line(job=f"{config}-{str(dtype).split('.')[-1]}-infer-b{batch}x{seq}+{gen}", ok=ok, before=before,
         allocated=torch.cuda.max_memory_allocated(), reserved=torch.cuda.max_memory_reserved())
    del model


def main():
    what, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    line(torch=torch.__version__, transformers=transformers.__version__, gpu=torch.cuda.get_device_name())
    if what in ("ckpt", "all"):
        for mode in ("default", "reentrant", "nonreentrant"):
            ckpt_job("gpt2", 8, 1024, mode, trace=f"{out}/gpt2-ckpt-{mode}.pickle" if mode != "reentrant" else None)
    if what in ("gen", "all"):
        for b in (32, 96, 192):
            gen_job("gpt2", b, 1024, 64, torch.float32, trace=f"{out}/gpt2-gen-b{b}.pickle" if b == 32 else None)
        gen_job("tinyllama-1.1b", 32, 512, 128, torch.bfloat16, trace=f"{out}/tinyllama-gen-b32.pickle")


main()
