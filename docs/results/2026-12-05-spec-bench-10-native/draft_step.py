"""One-token forwards of the demo pair's draft, int4 against int8 weights, beside the target's
(bfloat16, packed as dtype=auto chose here), in one process, interleaved: the c of the bench's
report is the draft's step over the target's. Each round feeds a 200-token context then times
STEPS one-token forwards of each model in turn. Usage: python draft_step.py ROUNDS STEPS"""
import statistics, sys, time

import torch
from transformers import DynamicCache

from quickdraft.models.loading import load_model

torch.set_num_threads(2)
ROUNDS, STEPS = int(sys.argv[1]), int(sys.argv[2])
models = {
    "target bfloat16 packed": load_model("qwen2.5-coder-1.5b-instruct", dtype="bfloat16"),
    "draft int4": load_model("qwen2.5-coder-0.5b-instruct", dtype="float32", quantization="int4"),
    "draft int8": load_model("qwen2.5-coder-0.5b-instruct", dtype="float32", quantization="int8"),
}
context = torch.randint(100, 20000, (1, 200))
times = {name: [] for name in models}
with torch.inference_mode():
    for round_ in range(ROUNDS):
        order = list(models) if round_ % 2 == 0 else list(reversed(models))
        for name in order:
            module = models[name].module
            cache = DynamicCache()
            out = module(context, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            for _ in range(STEPS):
                start = time.perf_counter()
                out = module(token, past_key_values=cache, use_cache=True)
                times[name].append(time.perf_counter() - start)
                token = out.logits[:, -1:].argmax(-1)
target = statistics.median(times["target bfloat16 packed"])
for name, t in times.items():
    median = statistics.median(t)
    print(f"{name:24s} median {1000 * median:6.1f} ms  (p10 {1000 * sorted(t)[len(t) // 10]:6.1f}, "
          f"p90 {1000 * sorted(t)[9 * len(t) // 10]:6.1f})  over the target's: {median / target:.3f}")
