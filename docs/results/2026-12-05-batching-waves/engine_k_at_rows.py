"""The batched engine alone at ROWS rows (loadgen prompts, 32 greedy tokens): no draft, FixedBatchK(1),
FixedBatchK(2) (no prompt lookup) and the default goodput policy, REPEATS interleaved rounds.
Usage: python engine_k_at_rows.py ROWS REPEATS"""
import sys, time, statistics
from quickdraft import SamplingParams
from quickdraft.batch.engine import BatchEngine
from quickdraft.batch.policy import FixedBatchK
from demo_setup import PARAMS as params, interleaved, load_demo

target, draft, ids = load_demo()
ROWS = int(sys.argv[1]); REPEATS = int(sys.argv[2])
engines = {"none": BatchEngine(target, None), "k1": BatchEngine(target, draft, policy=FixedBatchK(1), prompt_lookup=False),
           "k2": BatchEngine(target, draft, policy=FixedBatchK(2), prompt_lookup=False),
           "goodput": BatchEngine(target, draft)}
prompts = [ids[i % len(ids)] for i in range(ROWS)]
for e in engines.values():
    e.generate_batch(prompts[:2], SamplingParams(max_new_tokens=4, temperature=0.0))  # warm-up
res = {k: [] for k in engines}
for name in interleaved(list(engines), REPEATS):
    start = time.perf_counter()
    outs = engines[name].generate_batch(prompts, params)
    res[name].append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start))
for name, v in res.items():
    print(f"{name:8s} tok/s median {statistics.median(v):.1f}  each {[round(x, 1) for x in v]}  vs none {statistics.median(a / b for a, b in zip(v, res['none'])):.2f}")
