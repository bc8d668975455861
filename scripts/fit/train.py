"""One short training run at a given batch size: the trial command of `vramctl fit` (issue 15).

    python3 scripts/fit/train.py --model {gpt2,llama,neox,qwen2,resnet,convnext,vit,efficientnet,swin} --batch N [--steps 2]
                                 [--seq L] [--seq-unit U] [--attn {sdpa,eager}] [--checkpointing]

--seq-unit U multiplies --seq by U (a sequence-length search in steps of U tokens: `--seq {}
--seq-unit 64`); --attn eager materializes the attention scores (memory quadratic in the
sequence: the sequence-length case of issue 34's held-out check).

Models (random weights, built from a config: the GPU machine has no internet):
  gpt2    transformers GPT2LMHeadModel(GPT2Config()), 124M, seq 1024, labels = input ids
  llama   transformers LlamaForCausalLM, TinyLlama-1.1B shapes (hidden 2048, intermediate
          5632, 22 layers, 32 heads, 4 kv heads, vocab 32000), seq 2048, attention sdpa;
          --checkpointing turns on gradient checkpointing
  neox    transformers GPTNeoXForCausalLM, Pythia-410M shapes (hidden 1024, intermediate
          4096, 24 layers, 16 heads, rotary over a quarter of each head, parallel residual,
          vocab 50304), seq 1024, attention sdpa; --checkpointing as llama
  qwen2   transformers Qwen2ForCausalLM, Qwen2-0.5B shapes (hidden 896, intermediate 4864,
          24 layers, 14 heads, 2 kv heads, q/k/v biases, tied embeddings, vocab 151936),
          seq 1024, attention sdpa (neox and qwen2 chosen 2026-12-06 as held-out cases for
          fit as it stands: never run before)
  resnet  torchvision resnet50(), 224x224 random images, 1000 classes, cross-entropy
  convnext torchvision convnext_tiny(), the same images and loss (held out for issue 34's
          stop rule: added after ResNet-50 tuned it)
  vit     torchvision vit_b_16(), the same images (--seq sets the image side) and loss
          (held out as convnext)
  efficientnet torchvision efficientnet_b0(), the same images and loss; swin: torchvision
          swin_t(), the same (both chosen 2026-12-05, before any change made after the
          convnext and vit runs, and held out for it)
Every model: fp32 weights built directly on the GPU, bf16 autocast, AdamW, --steps optimizer
steps (default 2: the optimizer state appears at the first step(), so step 0 alone is not the
peak), random data made on the GPU, seed 0.

On success it prints one line on stdout and exits 0:
    ok batch=N peak_allocated=BYTES peak_reserved=BYTES model=M seq=L steps=S attn=A init_s=X steps_s=Y
(peaks from torch.cuda.max_memory_allocated/reserved; init_s is process start -> model and
optimizer ready, steps_s the training steps). An out-of-memory error is NOT caught: PyTorch's
torch.OutOfMemoryError and its message go to stderr and the exit status is non-zero, which is
what `vramctl fit` classifies as "does not fit".
"""
import argparse
import time

T_START = time.monotonic()

import torch  # noqa: E402  (after T_START so init_s includes the import)

SEED = 0
DEFAULT_SEQ = {"gpt2": 1024, "llama": 2048, "neox": 1024, "qwen2": 1024, "resnet": 224, "convnext": 224, "vit": 224, "efficientnet": 224, "swin": 224}
# Image classifiers: random images of side --seq, 1000 classes, cross-entropy.
IMAGE_MODELS = ("resnet", "convnext", "vit", "efficientnet", "swin")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, choices=sorted(DEFAULT_SEQ))
    p.add_argument("--batch", required=True, type=int)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seq", type=int, help="sequence length (image side for resnet); default per model")
    p.add_argument("--seq-unit", type=int, default=1, help="--seq is in units of this many tokens")
    p.add_argument("--attn", choices=["sdpa", "eager"], help="attention implementation (the transformers models)")
    p.add_argument("--checkpointing", action="store_true", help="gradient checkpointing (the transformers models)")
    args = p.parse_args()
    if args.seq_unit < 1:
        p.error(f"--seq-unit must be at least 1, got '{args.seq_unit}'")
    if args.attn and args.model in IMAGE_MODELS:
        p.error(f"--attn is for the transformers models (gpt2, llama, neox, qwen2), not '{args.model}'")
    if args.batch < 1:
        p.error(f"--batch must be at least 1, got '{args.batch}'")
    if args.steps < 1:
        p.error(f"--steps must be at least 1, got '{args.steps}'")
    if args.checkpointing and args.model in IMAGE_MODELS:
        p.error(f"--checkpointing is for the transformers models (gpt2, llama, neox, qwen2), not '{args.model}'")
    args.seq = args.seq * args.seq_unit if args.seq else DEFAULT_SEQ[args.model]
    return args


def warm_up_library_handles():
    """Create the cuBLAS/cuBLASLt/cuDNN handles while the GPU is still empty.

    Those handles (and their small device buffers) are allocated outside PyTorch's caching
    allocator on the first matmul/conv of each thread, backward's autograd thread included. Made
    lazily on a nearly full GPU they fail as CUBLAS_STATUS_ALLOC_FAILED / a cuDNN status instead
    of torch.OutOfMemoryError, which would read as "some other failure" to `fit`. A tiny forward
    and backward through a Linear and a Conv2d under the same autocast makes them now.
    """
    lin = torch.nn.Linear(8, 8)
    conv = torch.nn.Conv2d(3, 8, 3)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = lin(conv(x).mean(dim=(2, 3))).float().sum()
    y.backward()
    torch.cuda.synchronize()


def build_gpt2(args):
    from transformers import GPT2Config, GPT2LMHeadModel

    # use_cache off: a training step has no use for the key/value cache.
    config = GPT2Config(n_positions=max(1024, args.seq), use_cache=False)
    if args.attn:
        config._attn_implementation = args.attn
    model = GPT2LMHeadModel(config)
    return model, config.vocab_size


def causal_lm(config_class, model_class, args, **shape):
    """A transformers causal LM of `shape`, no KV cache (a training step has no use for it),
    attention sdpa unless --attn says otherwise."""
    config = config_class(**shape, use_cache=False)
    # Set on the config rather than as a constructor keyword: the attribute works across
    # transformers 4.4x-5.x; main() checks the built model really uses it.
    config._attn_implementation = args.attn or "sdpa"
    return model_class(config), config.vocab_size


def build_llama(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    return causal_lm(LlamaConfig, LlamaForCausalLM, args, hidden_size=2048, intermediate_size=5632,
                     num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                     max_position_embeddings=max(2048, args.seq), rms_norm_eps=1e-5, tie_word_embeddings=False)


def build_neox(args):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    return causal_lm(GPTNeoXConfig, GPTNeoXForCausalLM, args, hidden_size=1024, intermediate_size=4096,
                     num_hidden_layers=24, num_attention_heads=16, rotary_pct=0.25, vocab_size=50304,
                     max_position_embeddings=max(2048, args.seq), use_parallel_residual=True,
                     tie_word_embeddings=False)


def build_qwen2(args):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return causal_lm(Qwen2Config, Qwen2ForCausalLM, args, hidden_size=896, intermediate_size=4864,
                     num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                     max_position_embeddings=max(32768, args.seq), tie_word_embeddings=True)


def build_resnet(_args):
    from torchvision.models import resnet50

    return resnet50(num_classes=1000), 1000


def build_convnext(_args):
    from torchvision.models import convnext_tiny

    return convnext_tiny(num_classes=1000), 1000


def build_vit(args):
    from torchvision.models import vit_b_16

    return vit_b_16(num_classes=1000, image_size=args.seq), 1000


def build_efficientnet(_args):
    from torchvision.models import efficientnet_b0

    return efficientnet_b0(num_classes=1000), 1000


def build_swin(_args):
    from torchvision.models import swin_t

    return swin_t(num_classes=1000), 1000


BUILDERS = {
    "gpt2": build_gpt2,
    "llama": build_llama,
    "neox": build_neox,
    "qwen2": build_qwen2,
    "resnet": build_resnet,
    "convnext": build_convnext,
    "vit": build_vit,
    "efficientnet": build_efficientnet,
    "swin": build_swin,
}


def main():
    args = parse_args()
    torch.manual_seed(SEED)
    # cudnn.benchmark tries algorithms with different workspaces: the peak would then vary
    # from run to run at the same batch, and fit needs one answer per value.
    torch.backends.cudnn.benchmark = False
    torch.cuda.set_device(0)

    with torch.device("cuda"):
        warm_up_library_handles()
        # Built on the GPU directly: a 1.1B init on the CPU alone takes ~10 s.
        model, classes = BUILDERS[args.model](args)
    # fp32 master weights under bf16 autocast (a no-op when the config already gave fp32).
    model = model.to(dtype=torch.float32)
    model.train()
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None) or "-"
    wanted = args.attn or ("sdpa" if args.model in ("llama", "neox", "qwen2") else None)
    if wanted and attn != wanted:
        raise SystemExit(f"error: {args.model} was built with attention '{attn}', not '{wanted}'")
    if args.checkpointing:
        # Non-reentrant: the recommended form, and the same behaviour across transformers versions.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # Default AdamW (foreach on CUDA): its step makes a parameter-sized fp32 temporary, part
    # of the real peak at small batches.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    gen = torch.Generator(device="cuda").manual_seed(SEED)
    if args.model in IMAGE_MODELS:
        inputs = torch.randn(args.batch, 3, args.seq, args.seq, device="cuda", generator=gen)
        targets = torch.randint(0, classes, (args.batch,), device="cuda", generator=gen)
        loss_fn = torch.nn.CrossEntropyLoss()

        def loss_of():
            return loss_fn(model(inputs), targets)

    else:
        ids = torch.randint(0, classes, (args.batch, args.seq), device="cuda", generator=gen)

        def loss_of():
            return model(input_ids=ids, labels=ids).loss

    torch.cuda.synchronize()
    t_ready = time.monotonic()
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    t_end = time.monotonic()
    if not torch.isfinite(loss.detach()).item():
        raise SystemExit(f"error: loss is not finite ('{loss.item()}')")

    print(
        f"ok batch={args.batch} peak_allocated={torch.cuda.max_memory_allocated()} "
        f"peak_reserved={torch.cuda.max_memory_reserved()} model={args.model}"
        f"{'-ckpt' if args.checkpointing else ''} seq={args.seq} steps={args.steps} attn={attn} "
        f"init_s={t_ready - T_START:.2f} steps_s={t_end - t_ready:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
