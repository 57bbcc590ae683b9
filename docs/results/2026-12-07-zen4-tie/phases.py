"""Where the engine alone spends its time with and without a draft, as continuous_k.py drives it
(../2026-12-06-continuous-k): CLIENTS requests in flight, two from each client in turn, no draft
and the goodput engine, six interleaved rounds; each phase's seconds a round (``BatchEngine.step``'s
``last_seconds``), the rest of each step, the time between steps, and each round's seconds.

Usage (from this folder): PYTHONPATH=SRC python phases.py CLIENTS
"""
import sys
import time

sys.path.insert(0, "../2026-12-05-batching-waves")
from demo_setup import PARAMS, interleaved, load_demo, serve_clients  # noqa: E402
from quickdraft import SamplingParams  # noqa: E402
from quickdraft.batch.engine import BatchEngine  # noqa: E402

ROUNDS = 6
target, draft, ids = load_demo()
CLIENTS = int(sys.argv[1])
engines = {"none": BatchEngine(target, None), "goodput": BatchEngine(target, draft)}
for engine in engines.values():  # warm-up, and one request alone first (as continuous_k.py)
    engine.generate_batch(ids[:2], SamplingParams(max_new_tokens=4, temperature=0.0))
    engine.generate_batch(ids[:1], PARAMS)
seconds = {}  # (engine, phase) -> seconds over all rounds
rounds = {name: [] for name in engines}
for name in interleaved(list(engines), ROUNDS):
    engine, steps = engines[name], []
    step = engine.step

    def timed_step(step=step):
        start = time.perf_counter()
        events = step()
        steps.append(time.perf_counter() - start)
        return events

    def on_step(events, engine=engine, name=name):
        for phase, spent in engine.last_seconds.items():
            seconds[name, phase] = seconds.get((name, phase), 0.0) + spent
        rest = steps[-1] - sum(engine.last_seconds.values())
        seconds[name, "rest of the step"] = seconds.get((name, "rest of the step"), 0.0) + rest

    engine.step = timed_step
    _, _, took = serve_clients(engine, ids, CLIENTS, 2, on_step)
    del engine.step
    rounds[name].append(took)
    seconds[name, "between steps"] = seconds.get((name, "between steps"), 0.0) + took - sum(steps)
print(f"{CLIENTS} clients, seconds a round (mean of {ROUNDS}):")
print("| phase | " + " | ".join(engines) + " |")
print("| --- | " + " | ".join("---:" for _ in engines) + " |")
for phase in ("prefill", "draft", "verify", "accept", "rest of the step", "between steps"):
    print(f"| {phase} | " + " | ".join(f"{seconds[name, phase] / ROUNDS:.3f}" for name in engines) + " |")
print("each round's seconds: " + "; ".join(f"{name} {[round(s, 2) for s in took]}" for name, took in rounds.items()))
