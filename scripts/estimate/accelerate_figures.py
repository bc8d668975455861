"""accelerate's `estimate-memory` figures for the truth set's models, from its own functions.

    python3 scripts/estimate/accelerate_figures.py      (prints one JSON line per config)

`accelerate estimate-memory` needs the Hub; this builds the same empty (meta) model from the
local config.json and calls the functions the command calls (`calculate_maximum_sizes`,
`estimate_training_usage`), so the figures are accelerate's, not a re-derivation. Prints
"accelerate not installed" when it is not.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cases import CASES  # noqa: E402

try:
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes
except ImportError as e:
    print(f"accelerate not installed ({e})")
    raise SystemExit(0)
import torch  # noqa: E402
import transformers  # noqa: E402

for path in sorted({c["config"] for c in CASES}):
    raw = json.load(open(path))
    model_type = raw.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **raw)
    cls = {"bert": transformers.AutoModelForMaskedLM, "t5": transformers.AutoModelForSeq2SeqLM}.get(
        model_type, transformers.AutoModelForCausalLM)
    with init_empty_weights():
        try:
            model = cls.from_config(config, dtype=torch.float32)
        except TypeError:
            model = cls.from_config(config, torch_dtype=torch.float32)
    total, largest = calculate_maximum_sizes(model)
    row = {"config": path, "total_size_fp32": total,
           "train_fp32": max(estimate_training_usage(total, "float32").values()),
           "train_fp16": max(estimate_training_usage(total, "float16").values()),
           "infer_fp16": total // 2}
    print(json.dumps(row), flush=True)
