"""What the goodput policy saw and chose at each step of the batched engine alone, interleaved
with an engine without a draft model as ``../2026-12-06-continuous-k/phases_16.py`` runs them:
CLIENTS requests in flight, each client sending PER_CLIENT requests one after another (loadgen
prompts, 32 greedy tokens), REPEATS rounds. A line per step of the drafting engine: decoding
rows, rows joining, the k chosen, each row's lag behind the draft model and running acceptance,
the factor on drafting's rate (``Realized.gain``), the price of a catch-up over 1 / 3 / 10
positions (``BatchCosts.catch_up``) and the phases' seconds; then each round's wall seconds.

Usage (from this folder): PYTHONPATH=SRC python policy_steps.py CLIENTS PER_CLIENT REPEATS
"""
import sys

sys.path.insert(0, "../2026-12-05-batching-waves")
from demo_setup import PARAMS, TracingPolicy, load_demo, serve_clients  # noqa: E402
from quickdraft import SamplingParams  # noqa: E402
from quickdraft.batch.engine import BatchEngine  # noqa: E402


target, draft, ids = load_demo()
CLIENTS, PER_CLIENT, REPEATS = (int(a) for a in sys.argv[1:4])
policy = TracingPolicy(5)
engines = {"goodput": BatchEngine(target, draft, policy=policy), "none": BatchEngine(target, None)}
for engine in engines.values():
    engine.generate_batch(ids[:2], SamplingParams(max_new_tokens=4, temperature=0.0))  # warm-up
    engine.generate_batch(ids[:1], PARAMS)  # one request alone first, as phases_16.py
step = 0


def record(events) -> None:
    global step
    engine = engines["goodput"]
    prices = {n: round(policy.costs.catch_up(n) or 0.0, 3) for n in (1, 3, 10)}
    seconds = {phase: round(s, 3) for phase, s in engine.last_seconds.items()}
    print(f"step {step}: rows {len(policy.shown)} joining {policy.joining} k {policy.last_k}"
          f"{' probe' if policy.probing else ''} drafts {policy.drafts} (behind, acceptance) {policy.shown}"
          f" gain {policy.gain:.3f} catch-up price {prices} seconds {seconds}")
    step += 1


walls = {name: [] for name in engines}
for round_ in range(REPEATS):
    for name in (["goodput", "none"] if round_ % 2 == 0 else ["none", "goodput"]):
        print(f"# round {round_ + 1}: {name}")
        walls[name].append(serve_clients(engines[name], ids, CLIENTS, PER_CLIENT,
                                         record if name == "goodput" else None)[2])
for name, seconds in walls.items():
    print(f"{name}: wall {sum(seconds):.2f} s ({', '.join(f'{s:.2f}' for s in seconds)})")
