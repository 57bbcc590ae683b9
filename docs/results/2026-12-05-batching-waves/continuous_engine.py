"""The batched engine alone as a loaded server drives it: CLIENTS requests in flight, each client
sending PER_CLIENT requests one after another (loadgen prompts, 32 greedy tokens), with the draft
(goodput policy) and without, REPEATS interleaved rounds; tokens/s of each round.
Usage: python continuous_engine.py CLIENTS PER_CLIENT REPEATS"""
import sys, statistics
from quickdraft import SamplingParams
from quickdraft.batch.engine import BatchEngine
from demo_setup import interleaved, load_demo, serve_clients

target, draft, ids = load_demo()
CLIENTS, PER_CLIENT, REPEATS = (int(a) for a in sys.argv[1:4])
engines = {"none": BatchEngine(target, None), "goodput": BatchEngine(target, draft)}


def serve(engine: BatchEngine) -> float:
    tokens, _, seconds = serve_clients(engine, ids, CLIENTS, PER_CLIENT)
    return tokens / seconds


for e in engines.values():
    e.generate_batch(ids[:2], SamplingParams(max_new_tokens=4, temperature=0.0))  # warm-up
res = {k: [] for k in engines}
for name in interleaved(list(engines), REPEATS):
    res[name].append(serve(engines[name]))
ratios = [g / n for g, n in zip(res["goodput"], res["none"])]
for name, v in res.items():
    print(f"{name:8s} tok/s {[round(x, 1) for x in v]} median {statistics.median(v):.1f}")
print("goodput / none, paired:", [round(x, 2) for x in ratios], "median", round(statistics.median(ratios), 3))
