#!/usr/bin/env python3
"""Writes the small model files the vramctl-model tests read, with the formats' own
libraries (pip install safetensors==0.8.0 gguf==0.19.0 numpy, as used to make the committed files):

- tiny-llama/: a Llama-shaped config.json and its model.safetensors (float16, the tensor
  names transformers writes), so the parameter count from the header can be checked
  against the count from the config's shapes.
- sharded/: the same tensors in two shards with model.safetensors.index.json.
- mixed.safetensors: float32, float16 and int8 tensors (bytes per dtype).
- tiny-llama.gguf: the same shapes as GGUF v3 with llama.* metadata, a tokenizer token
  array, F32 norms, F16 and Q8_0 matrices.

Deterministic: zeros, fixed shapes. Run from this directory: python3 make.py
"""

import json
import os

import numpy as np
from safetensors.numpy import save_file
import gguf

HIDDEN, LAYERS, HEADS, KV_HEADS, INTER, VOCAB = 32, 2, 4, 2, 64, 128
HEAD_DIM = HIDDEN // HEADS
KV_DIM = KV_HEADS * HEAD_DIM


def llama_tensors(dtype):
    t = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,),
         "lm_head.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = (HIDDEN, HIDDEN)
        t[p + "self_attn.k_proj.weight"] = (KV_DIM, HIDDEN)
        t[p + "self_attn.v_proj.weight"] = (KV_DIM, HIDDEN)
        t[p + "self_attn.o_proj.weight"] = (HIDDEN, HIDDEN)
        t[p + "mlp.gate_proj.weight"] = (INTER, HIDDEN)
        t[p + "mlp.up_proj.weight"] = (INTER, HIDDEN)
        t[p + "mlp.down_proj.weight"] = (HIDDEN, INTER)
        t[p + "input_layernorm.weight"] = (HIDDEN,)
        t[p + "post_attention_layernorm.weight"] = (HIDDEN,)
    return {name: np.zeros(shape, dtype=dtype) for name, shape in t.items()}


def config():
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
        "max_position_embeddings": 256, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "torch_dtype": "float16",
    }


def main():
    os.makedirs("tiny-llama", exist_ok=True)
    with open("tiny-llama/config.json", "w") as f:
        json.dump(config(), f, indent=2)
    tensors = llama_tensors(np.float16)
    save_file(tensors, "tiny-llama/model.safetensors", metadata={"format": "pt"})

    os.makedirs("sharded", exist_ok=True)
    with open("sharded/config.json", "w") as f:
        json.dump(config(), f, indent=2)
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for shard, part in (("model-00001-of-00002.safetensors", names[:half]),
                        ("model-00002-of-00002.safetensors", names[half:])):
        save_file({n: tensors[n] for n in part}, f"sharded/{shard}", metadata={"format": "pt"})
        weight_map.update({n: shard for n in part})
    total = sum(t.nbytes for t in tensors.values())
    with open("sharded/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)

    save_file({"a": np.zeros((4, 8), np.float32), "b": np.zeros((16,), np.float16),
               "c": np.zeros((3, 5), np.int8)}, "mixed.safetensors")

    w = gguf.GGUFWriter("tiny-llama.gguf", "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    Q8 = gguf.GGMLQuantizationType.Q8_0
    for name, array in llama_tensors(np.float32).items():
        gname = (name.replace("model.embed_tokens", "token_embd").replace("lm_head", "output")
                 .replace("model.norm", "output_norm").replace("model.layers.", "blk.")
                 .replace("self_attn.q_proj", "attn_q").replace("self_attn.k_proj", "attn_k")
                 .replace("self_attn.v_proj", "attn_v").replace("self_attn.o_proj", "attn_output")
                 .replace("mlp.gate_proj", "ffn_gate").replace("mlp.up_proj", "ffn_up")
                 .replace("mlp.down_proj", "ffn_down").replace("input_layernorm", "attn_norm")
                 .replace("post_attention_layernorm", "ffn_norm"))
        if array.ndim == 1:
            w.add_tensor(gname, array)
        elif "ffn" in gname:
            w.add_tensor(gname, gguf.quants.quantize(array, Q8), raw_dtype=Q8)
        else:
            w.add_tensor(gname, array.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
