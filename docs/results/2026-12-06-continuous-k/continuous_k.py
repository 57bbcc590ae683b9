"""The batched engine alone as a loaded server drives it (../2026-12-06-margin/margin_engine.py):
CLIENTS requests in flight, each client sending PER_CLIENT requests one after another (loadgen
prompts, 32 greedy tokens), after one request alone; no draft, the default goodput policy, and every row drafting a fixed
k (``FixedBatchK``, no prompt lookup) for each K given; REPEATS interleaved rounds, tokens/s and
ratios to no draft, paired by round, and how many tokens a step emitted.

Usage (from this folder): PYTHONPATH=SRC python continuous_k.py CLIENTS PER_CLIENT REPEATS K...
"""
import statistics
import sys

sys.path.insert(0, "../2026-12-05-batching-waves")
from demo_setup import PARAMS, interleaved, load_demo, serve_clients  # noqa: E402
from quickdraft import SamplingParams  # noqa: E402
from quickdraft.batch.engine import BatchEngine  # noqa: E402
from quickdraft.batch.policy import FixedBatchK  # noqa: E402

target, draft, ids = load_demo()
CLIENTS, PER_CLIENT, REPEATS = (int(a) for a in sys.argv[1:4])
engines = {"none": BatchEngine(target, None), "goodput": BatchEngine(target, draft)}
for k in sys.argv[4:]:
    engines[f"k{k}"] = BatchEngine(target, draft, policy=FixedBatchK(int(k)), prompt_lookup=False)


def serve(engine: BatchEngine) -> tuple[float, float, float]:
    """(tokens/s, tokens a step, share of steps that drafted) of one round."""
    drafted = []
    tokens, steps, seconds = serve_clients(engine, ids, CLIENTS, PER_CLIENT,
                                           lambda events: drafted.append(any(engine.last_drafted)))
    return tokens / seconds, tokens / steps, sum(drafted) / steps


for engine in engines.values():
    engine.generate_batch(ids[:2], SamplingParams(max_new_tokens=4, temperature=0.0))  # warm-up
    # One request alone first, as a server's first client: the goodput policy measures the
    # draft's acceptance where drafting pays (one row), not from a probe's token or two.
    engine.generate_batch(ids[:1], PARAMS)
results = {name: [] for name in engines}
for name in interleaved(list(engines), REPEATS):
    results[name].append(serve(engines[name]))
for name, rounds in results.items():
    rates = [r for r, _, _ in rounds]
    ratios = [r / n for (r, _, _), (n, _, _) in zip(rounds, results["none"])]
    print(f"{name:8s} tok/s {[round(r, 1) for r in rates]} median {statistics.median(rates):.1f}; "
          f"tokens a step {statistics.mean(t for _, t, _ in rounds):.2f}; steps drafted "
          f"{statistics.mean(d for _, _, d in rounds):.0%}; vs none {[round(x, 2) for x in ratios]} "
          f"median {statistics.median(ratios):.3f}", flush=True)
