"""A/B of FIRST_TRY_SHARE (0.5 = the rule, 1.0 = before it) on the bench's 7 Spec-Bench/HumanEval
prompts in the bench's order, T=0, 64 tokens, one decoder per setting (each learns across prompts
as the bench's does), prompt by prompt interleaved with plain decoding. Logs each step's choice."""
import json, sys, time
import torch
import quickdraft.policy as policy_module
from quickdraft import SpeculativeDecoder, SamplingParams, AdaptiveK
from quickdraft.models.loading import load_model
from quickdraft.hardware import machine_config
from quickdraft.bench.workloads import load_workload, prompt_ids

torch.set_num_threads(2)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
machine = machine_config("cpu")
target = load_model("qwen2.5-coder-1.5b-instruct")
draft = load_model("qwen2.5-coder-0.5b-instruct", dtype="float32", quantization=machine.draft_quantization)

class Logged(AdaptiveK):
    def begin(self):
        super().begin(); self.log = []
    def choose(self, *a, **kw):
        c = super().choose(*a, **kw); self.log.append([c.source[0], c.k, None]); return c
    def observe(self, source, drafted, accepted, d, v):
        super().observe(source, drafted, accepted, d, v)
        if self.log and drafted: self.log[-1][2] = accepted

shares = (0.5, 1.0)
decoders = {s: SpeculativeDecoder(target, draft, policy=Logged(5)) for s in shares}
plain = SpeculativeDecoder(target, None)
prompts = load_workload(["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "code"], 1)
params = SamplingParams(max_new_tokens=64, temperature=0.0, ignore_eos=True)
warm = prompt_ids(prompts[0], target.tokenizer, True)
for s in shares:  # the decoder's first generation measures its costs (as the bench's greedy check does)
    policy_module.FIRST_TRY_SHARE = s
    decoders[s].generate(warm, SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True))
out = []
for rnd in range(rounds):
    for p in prompts:
        ids = prompt_ids(p, target.tokenizer, True)
        row = {"round": rnd, "category": p.category}
        order = ["plain", *shares] if rnd % 2 == 0 else [*shares[::-1], "plain"]
        for name in order:
            if name != "plain":
                policy_module.FIRST_TRY_SHARE = name
            dec = plain if name == "plain" else decoders[name]
            r = dec.generate(ids, params)
            row[str(name)] = r.stats.time_total
            if name != "plain":
                row[f"log{name}"] = "".join(f" {s}{k}" + ("" if a is None else f"/{a}") for s, k, a in dec.policy.log if k)
        print(json.dumps(row), flush=True)
        out.append(row)
json.dump(out, open("first_tries.json", "w"))
