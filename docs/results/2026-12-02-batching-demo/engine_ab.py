"""The batched engine alone, with the demo draft (goodput policy) and without, on the loadgen's
chat prompts, one process, alternating: what a server's engine does without the server around it.

Usage: python engine_ab.py ROWS [ROWS ...]. Prints per run: tok/s over the whole batch (prefill
included), time to the first token, steps, the policy's choices {(k, probe): steps}.
"""

import collections
import sys
import time

from quickdraft import SamplingParams, load_model
from quickdraft.batch.engine import BatchEngine
from quickdraft.hardware import machine_config
from quickdraft.server.loadgen import PROMPTS

config = machine_config("cpu")
target = load_model("qwen2.5-coder-1.5b-instruct", dtype=config.dtype, pack_weights=config.pack_weights)
draft = load_model("qwen2.5-coder-0.5b-instruct", dtype="float32", quantization=config.draft_quantization)
chat = [target.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in PROMPTS]
params = SamplingParams(max_new_tokens=32, temperature=0.0, ignore_eos=True)
for rows in [int(r) for r in sys.argv[1:]] or [1, 4]:
    for name, engine in [("draft", BatchEngine(target, draft)), ("none", BatchEngine(target, None))] * 2:
        choices: collections.Counter = collections.Counter()
        for i in range(rows):
            engine.add(chat[i % len(chat)], params)
        start, tokens, steps, first = time.perf_counter(), 0, 0, None
        while engine.rows:
            events = engine.step()
            tokens += sum(len(e.chunk.token_ids) for e in events)
            steps += 1
            if events and first is None:
                first = time.perf_counter() - start
            choices[engine.policy.last_k, engine.policy.probing] += 1
        seconds = time.perf_counter() - start
        print(f"rows {rows} {name:5s} {tokens / seconds:6.2f} tok/s  first token {first:.2f} s  steps {steps}  "
              f"k {dict(choices)}", flush=True)
