"""Plain steps of a decoder with a drafter (FixedK(0): never drafts, still looks up and asks behind) against the plain decoder, rag prompt, 64 tokens, greedy, interleaved."""
import statistics, torch
from quickdraft import SpeculativeDecoder, SamplingParams, FixedK
from quickdraft.models.loading import load_model
from quickdraft.hardware import machine_config
from quickdraft.bench.workloads import load_workload, prompt_ids
torch.set_num_threads(2)
m = machine_config("cpu")
target = load_model("qwen2.5-coder-1.5b-instruct")
draft = load_model("qwen2.5-coder-0.5b-instruct", dtype="float32", quantization=m.draft_quantization)
decs = {"plain": SpeculativeDecoder(target, None), "drafter-k0": SpeculativeDecoder(target, draft, policy=FixedK(0))}
ids = prompt_ids(load_workload(["rag"], 1)[0], target.tokenizer, True)
p = SamplingParams(max_new_tokens=64, temperature=0.0, ignore_eos=True)
res = {k: [] for k in decs}
for i in range(4):
    for name in (list(decs) if i % 2 == 0 else list(decs)[::-1]):
        s = decs[name].generate(ids, p).stats
        res[name].append((s.time_verify, s.time_draft, s.time_other, s.target_forwards))
for k, v in res.items():
    print(k, "verify", [round(x[0], 2) for x in v], "draft", [round(x[1], 3) for x in v], "other", [round(x[2], 3) for x in v], "fw", v[0][3])
