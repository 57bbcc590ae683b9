"""Teacher-forced greedy agreement of the draft with the target's greedy continuation, by draft context window."""
import json, sys, time
import torch
from quickdraft import SpeculativeDecoder, SamplingParams
from quickdraft.models.loading import load_model
from quickdraft.bench.workloads import load_workload, prompt_ids

torch.set_num_threads(2)
target = load_model("qwen2.5-coder-1.5b-instruct")
draft = load_model("qwen2.5-coder-0.5b-instruct", dtype="float32", quantization="int8")
plain = SpeculativeDecoder(target, None)
per = int(sys.argv[1]) if len(sys.argv) > 1 else 2
N = 64
windows = [16, 32, 64, 128, 256, None]
out = []
for prompt in load_workload(["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "code"], per):
    ids = prompt_ids(prompt, target.tokenizer, True)
    gen = plain.generate(ids, SamplingParams(max_new_tokens=N, temperature=0.0, ignore_eos=True)).token_ids
    row = {"category": prompt.category, "prompt_tokens": len(ids)}
    for w in windows:
        ctx = ids if w is None or w >= len(ids) else ids[-w:]
        seq = torch.tensor([ctx + gen[:-1]])
        t = time.perf_counter()
        with torch.no_grad():
            logits = draft.module(seq).logits[0, len(ctx) - 1:]
        pred = logits.argmax(-1).tolist()
        row[str(w)] = sum(p == g for p, g in zip(pred, gen)) / len(gen)
    out.append(row)
    print(json.dumps(row), flush=True)
json.dump(out, open("window_agreement.json", "w"))
