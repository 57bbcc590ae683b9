"""Speculation on against off in one process: the demo pair loaded once, two batched engines on
the same target (one drafting with the draft model and prompt lookup as `quickdraft serve` does,
one without a draft, as `--draft none`), waves of 16 and 32 clients (two requests each, 32 greedy
tokens) taken in turn. Two server processes' plain steps differed by up to ±6% a run in
../2026-12-07-zen4-waves-leveled; here both engines share the process, its weights and its
memory. Before the waves, the drafting engine serves two waves of 1 and of 4 clients, as in the
servers' runs, so that its acceptance is what it would be.

Prints each wave's tokens per second, the pairs' ratios, and the median seconds of each engine's
plain steps (verification and acceptance) by width.

Usage: PYTHONPATH=SRC python same_process.py [ROUNDS_16] [ROUNDS_32]
"""
import statistics
import sys

sys.path.insert(0, "../2026-12-05-batching-waves")
from demo_setup import interleaved, load_demo, serve_clients
from quickdraft.batch.engine import BatchEngine

rounds = {16: int(sys.argv[1]) if len(sys.argv) > 1 else 6, 32: int(sys.argv[2]) if len(sys.argv) > 2 else 4}
target, draft, ids = load_demo()
engines = {"draft": BatchEngine(target, draft), "none": BatchEngine(target, None)}
plain_steps = {name: {} for name in engines}  # name -> width -> [seconds]
drafted_steps = {name: 0 for name in engines}


def recorder(name):
    engine = engines[name]

    def on_step(events):
        width = len(engine.last_drafted)
        if any(engine.last_drafted) or engine.policy.probing:
            drafted_steps[name] += 1
        elif width:
            seconds = engine.last_seconds["draft"] + engine.last_seconds["verify"] + engine.last_seconds["accept"]
            plain_steps[name].setdefault(width, []).append(seconds)
    return on_step


for clients in (1, 4):
    for _ in range(2):
        tokens, steps, seconds = serve_clients(engines["draft"], ids, clients, 2)
        print(f"draft, {clients} clients (before): {tokens / seconds:.1f} tok/s", flush=True)
for clients in (16, 32):
    for name in engines:  # a first wave each, not counted: the first forwards of a new shape build kernels
        serve_clients(engines[name], ids, clients, 1)
    rates = {name: [] for name in engines}
    drafted_steps = {name: 0 for name in engines}
    plain_steps = {name: {} for name in engines}
    for name in interleaved(list(engines), rounds[clients]):
        tokens, steps, seconds = serve_clients(engines[name], ids, clients, 2, recorder(name))
        rates[name].append(tokens / seconds)
        print(f"{name}, {clients} clients: {tokens} tokens, {steps} steps, {tokens / seconds:.1f} tok/s", flush=True)
    ratios = sorted(d / n for d, n in zip(rates["draft"], rates["none"]))
    print(f"{clients} clients: draft / none median {statistics.median(ratios):.3f}x, pairs "
          + ", ".join(f"{r:.3f}" for r in ratios))
    for name in engines:
        widths = sorted(plain_steps[name], key=lambda w: -len(plain_steps[name][w]))[:2]
        print(f"  {name}: steps that drafted or probed {drafted_steps[name]}; plain steps' median seconds "
              + ", ".join(f"{w} rows {statistics.median(plain_steps[name][w]):.4f} ({len(plain_steps[name][w])})"
                          for w in sorted(widths)), flush=True)
