"""The batched engine's time per decoding step outside the target's forward, at ROWS rows (loadgen
prompts, 32 greedy tokens), with the draft loaded (the goodput policy) and without: REPEATS
interleaved rounds. Usage: python step_overhead.py ROWS REPEATS"""
import sys, time, statistics
from quickdraft.batch.engine import BatchEngine
from demo_setup import PARAMS as params, interleaved, load_demo

target, draft, ids = load_demo()
ROWS = int(sys.argv[1]); REPEATS = int(sys.argv[2])
engines = {"none": BatchEngine(target, None), "goodput": BatchEngine(target, draft)}
fwd = {}
for name, e in engines.items():
    runner = e._target; orig = runner.forward_tails; fwd[name] = []
    def timed(*a, _orig=orig, _name=name, **k):
        t = time.perf_counter(); out = _orig(*a, **k); fwd[_name].append(time.perf_counter() - t); return out
    runner.forward_tails = timed
prompts = [ids[i % len(ids)] for i in range(ROWS)]
res = {k: [] for k in engines}
for name in interleaved(list(engines), REPEATS):
    e = engines[name]
    for p in prompts: e.add(p, params)
    steps = []
    fwd[name].clear()
    while e.rows:
        t = time.perf_counter(); e.step(); steps.append(time.perf_counter() - t)
    # The steps that decoded (one target forward_tails each) are the last n. The first of them
    # also fed the prompts: its outside time is the prefill, in the totals but not the medians.
    n = len(fwd[name]); dec = steps[-n:]
    other = [s - f for s, f in zip(dec, fwd[name])]
    res[name].append((statistics.median(dec), statistics.median(fwd[name]), statistics.median(other), sum(other), n))
for name, v in res.items():
    print(name, "step ms", [round(x[0]*1000) for x in v], "forward ms", [round(x[1]*1000) for x in v],
          "outside ms (median)", [round(x[2]*1000, 1) for x in v], "outside s total", [round(x[3], 2) for x in v], "steps", [x[4] for x in v])
