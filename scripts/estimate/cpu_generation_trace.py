"""generate()'s allocations on a CPU, replayed through the caching allocator's rules
(issue 34, round 4: checks crates/vramctl-model/src/generation_step.rs without a GPU).

    python3 scripts/estimate/cpu_generation_trace.py CONFIG BATCH SEQ GEN fp32|bf16 [LAYERS]

Builds the model from CONFIG (random weights; LAYERS overrides its layer count), records
`generate()` (greedy, exactly GEN tokens, KV cache on) with torch's profiler
(`profile_memory=True`: every allocation and free with its address, in order) and prints
one JSON line: the events, the bytes live at the peak, and the peak reserved and allocated
of the trace replayed through scripts/estimate/replay_traces.py's allocator (new segments
at decreasing addresses). The trace starts after the model is built: weights not included.
The test generation_step::the_program_allocates_what_transformers_generate_allocates pins
what it gave with torch 2.15 and transformers 5.25 (2 layers of gpt2.json and
tinyllama-1.1b.json).
"""
import json
import os
import sys
import tempfile

import torch
import transformers
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import replay_traces as rt  # noqa: E402


def main():
    cfgp, b, s, g, dt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[dt]
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.from_pretrained(cfgp)
    if len(sys.argv) > 6:
        for key in ("num_hidden_layers", "n_layer"):
            if hasattr(cfg, key):
                setattr(cfg, key, int(sys.argv[6]))
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    mask = torch.ones_like(ids)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=g, min_new_tokens=g,
                           do_sample=False, pad_token_id=0)
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        with open(f"{tmp}/trace.json") as f:
            trace = json.load(f)
    events = sorted((e["args"]["Ev Idx"], e["args"]["Addr"], e["args"]["Bytes"])
                    for e in trace["traceEvents"] if e.get("name") == "[memory]")
    live = peak = 0
    for _, _, n in events:
        live += n
        peak = max(peak, live)
    a = rt.Allocator(descending=True)
    blocks = {}
    for _, addr, n in events:
        if n > 0:
            blocks[addr] = a.malloc(n)
        elif addr in blocks:
            a.free(blocks.pop(addr))
    print(json.dumps(dict(events=len(events), peak_live=peak, replay_reserved=a.peak_reserved,
                          replay_allocated=a.peak_allocated)))


main()
