"""The batched engine alone as a loaded server drives it (../2026-12-05-batching-waves/
continuous_engine.py): CLIENTS requests in flight, each client sending PER_CLIENT requests one
after another (loadgen prompts, 32 greedy tokens); no draft, and the goodput policy with each
MARGIN given (the share by which drafting must be expected to beat plain decoding);
REPEATS interleaved rounds, tokens/s and ratios to no draft, paired by round.

Usage (from this folder): PYTHONPATH=SRC python margin_engine.py CLIENTS PER_CLIENT REPEATS MARGIN...
"""
import statistics
import sys

sys.path.insert(0, "../2026-12-05-batching-waves")
from demo_setup import interleaved, load_demo, serve_clients  # noqa: E402
from quickdraft import SamplingParams  # noqa: E402
from quickdraft.batch.engine import BatchEngine  # noqa: E402
from quickdraft.batch.policy import GoodputPolicy  # noqa: E402
from quickdraft.engine import DEFAULT_NUM_SPECULATIVE_TOKENS as K  # noqa: E402

target, draft, ids = load_demo()
CLIENTS, PER_CLIENT, REPEATS = (int(a) for a in sys.argv[1:4])
MARGINS = [float(m) for m in sys.argv[4:]]
engines = {"none": BatchEngine(target, None)}
for margin in MARGINS:
    engines[f"margin {margin}"] = BatchEngine(target, draft, policy=GoodputPolicy(K, margin=margin))


def serve(engine: BatchEngine) -> tuple[float, float]:
    """(tokens/s, tokens a step) of one round."""
    tokens, steps, seconds = serve_clients(engine, ids, CLIENTS, PER_CLIENT)
    return tokens / seconds, tokens / steps


for engine in engines.values():
    engine.generate_batch(ids[:2], SamplingParams(max_new_tokens=4, temperature=0.0))  # warm-up
results = {name: [] for name in engines}
for name in interleaved(list(engines), REPEATS):
    results[name].append(serve(engines[name]))
for name, rounds in results.items():
    rates = [r for r, _ in rounds]
    ratios = [r / n for (r, _), (n, _) in zip(rounds, results["none"])]
    print(f"{name:12s} tok/s {[round(r, 1) for r in rates]} median {statistics.median(rates):.1f}; "
          f"tokens a step {statistics.mean(t for _, t in rounds):.2f}; vs none {[round(x, 2) for x in ratios]} "
          f"median {statistics.median(ratios):.3f}")
