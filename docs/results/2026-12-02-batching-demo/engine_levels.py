"""The batched engine alone, as a server runs it: one engine through levels of ROWS rows kept busy
(a request joins as soon as one ends), max(8, 4 x ROWS) requests of 32 greedy tokens a level on
the loadgen's chat prompts; with the demo draft (goodput policy) or without (CONFIG draft / none).

Usage: python engine_levels.py CONFIG ROWS [ROWS ...]. Prints per level: tok/s (prefill included),
the seconds, and the steps by the policy's choice (``k2``; ``k1p`` a probe): count / seconds.
"""

import collections
import sys
import time

from quickdraft import SamplingParams, load_model
from quickdraft.batch.engine import BatchEngine
from quickdraft.hardware import machine_config
from quickdraft.server.loadgen import PROMPTS

config, levels = sys.argv[1], [int(rows) for rows in sys.argv[2:]]
machine = machine_config("cpu")
draft = None
if config == "draft":
    draft = load_model("qwen2.5-coder-0.5b-instruct", dtype="float32", quantization=machine.draft_quantization)
target = load_model("qwen2.5-coder-1.5b-instruct", dtype=machine.dtype, pack_weights=machine.pack_weights)
chat = [target.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in PROMPTS]
params = SamplingParams(max_new_tokens=32, temperature=0.0, ignore_eos=True)
engine = BatchEngine(target, draft)
for rows in levels:
    requests = max(8, 4 * rows)
    sent = tokens = 0
    steps: collections.Counter = collections.Counter()
    seconds: collections.Counter = collections.Counter()
    start = time.perf_counter()
    while sent < requests or engine.rows:
        while sent < requests and engine.rows < rows:
            engine.add(chat[sent % len(chat)], params)
            sent += 1
        clock = time.perf_counter()
        events = engine.step()
        choice = f"k{engine.policy.last_k}{'p' if engine.policy.probing else ''}"
        steps[choice] += 1
        seconds[choice] += time.perf_counter() - clock
        tokens += sum(len(event.chunk.token_ids) for event in events)
    total = time.perf_counter() - start
    print(f"{config} rows {rows}: {tokens / total:.2f} tok/s {total:.1f} s  "
          + " ".join(f"{choice}:{steps[choice]}/{seconds[choice]:.1f}s" for choice in sorted(steps)), flush=True)
