"""The defaults with an int8 draft against the same with an int4 draft, and plain decoding, interleaved
per HumanEval problem in one process (the bench runs one draft format a run).

Usage: python ab_int8_int4.py PROBLEMS TOKENS OUT.json   (the project .venv's python)
Each problem runs plain, int8 and int4 in a rotating order; prints per-problem ratios and medians.
"""
import json, statistics, sys, time

import torch

from quickdraft import SamplingParams, SpeculativeDecoder, load_model
from quickdraft.bench.workloads import load_category, prompt_ids

problems, tokens, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(2)
target = load_model("qwen2.5-coder-1.5b-instruct")
drafts = {q: load_model("qwen2.5-coder-0.5b-instruct", quantization=q) for q in ("int8", "int4")}
decoders = {"plain": SpeculativeDecoder(target, None), **{q: SpeculativeDecoder(target, d) for q, d in drafts.items()}}
params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
warm = prompt_ids(load_category("code", 1)[0], target.tokenizer, chat=True)
for decoder in decoders.values():  # each decoder's first forwards build oneDNN's kernels
    decoder.generate(warm, SamplingParams(max_new_tokens=8, ignore_eos=True))
rows = []
names = list(decoders)
with torch.inference_mode():
    for i, prompt in enumerate(load_category("code", problems)):
        ids = prompt_ids(prompt, target.tokenizer, chat=True)
        row = {"prompt": prompt.id}
        order = names[i % 3:] + names[:i % 3]
        outputs = {}
        for name in order:
            start = time.perf_counter()
            result = decoders[name].generate(ids, params)
            row[name] = time.perf_counter() - start
            outputs[name] = result.token_ids
            row[f"{name}_tokens_per_forward"] = result.stats.mean_tokens_per_step if name != "plain" else 1.0
        row["identical"] = {q: outputs[q] == outputs["plain"] for q in drafts}
        rows.append(row)
        print(f"{prompt.id}: plain {row['plain']:.2f}s int8 {row['int8']:.2f}s int4 {row['int4']:.2f}s "
              f"plain/int8 {row['plain'] / row['int8']:.2f} plain/int4 {row['plain'] / row['int4']:.2f} "
              f"int8/int4 {row['int8'] / row['int4']:.2f}", flush=True)
summary = {f"median {a}/{b}": statistics.median(r[a] / r[b] for r in rows)
           for a, b in (("plain", "int8"), ("plain", "int4"), ("int8", "int4"))}
print(json.dumps(summary, indent=1))
json.dump({"rows": rows, "summary": summary, "tokens": tokens}, open(out, "w"), indent=1)
