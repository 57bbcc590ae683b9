"""Engines alone through the concurrency levels as ../2026-12-05-batching-waves/run.sh drives its
servers: for each level a warm-up wave of CLIENTS requests, then REPEATS waves of CLIENTS x
PER_CLIENT (loadgen prompts, 32 greedy tokens), each engine kept throughout, so that what it
learns at one level is what it starts the next with; each wave runs on every engine of ARMS
(comma-separated), the order rotated wave by wave. A line per engine and wave: steps, steps that
drafted, seconds, tokens/s; at each level, each engine's tokens/s over no draft's, paired by
wave (median and each), and for the goodput engines the policy's state at its end (running
acceptance, ``Realized.gain`` at 1 / 4 / 16 rows, draft forward over 1 / 4 rows, verification
over 4 / 12 positions). TRACE=1 prints the first goodput engine's steps.

Arms: none (no draft), goodput (``quickdraft serve``'s default policy), budget3 (the goodput
policy with ``catch_up_budget=3``), k1 / k2 (every row drafts k, ``FixedBatchK``, no lookup).

Usage (from this folder): PYTHONPATH=SRC python levels.py "LEVELS" REPEATS PER_CLIENT ARMS
"""
import os
import statistics
import sys

sys.path.insert(0, "../2026-12-05-batching-waves")
from demo_setup import TracingPolicy, load_demo, serve_clients  # noqa: E402
from quickdraft import SamplingParams  # noqa: E402
from quickdraft.batch.engine import BatchEngine  # noqa: E402
from quickdraft.batch.policy import FixedBatchK, GoodputPolicy  # noqa: E402


target, draft, ids = load_demo()
LEVELS = [int(c) for c in sys.argv[1].split()]
REPEATS, PER_CLIENT = int(sys.argv[2]), int(sys.argv[3])
ARMS = {
    "none": lambda: BatchEngine(target, None),
    "goodput": lambda: BatchEngine(target, draft, policy=TracingPolicy(5)),
    "budget3": lambda: BatchEngine(target, draft, policy=TracingPolicy(5, catch_up_budget=3.0)),
    "k1": lambda: BatchEngine(target, draft, policy=FixedBatchK(1), prompt_lookup=False),
    "k2": lambda: BatchEngine(target, draft, policy=FixedBatchK(2), prompt_lookup=False),
}
engines = {name: ARMS[name]() for name in sys.argv[4].split(",")}
for engine in engines.values():  # as a server's start-up
    engine.generate_batch(ids[:2], SamplingParams(max_new_tokens=4, temperature=0.0))
traced = next((name for name, engine in engines.items() if isinstance(engine.policy, TracingPolicy)), None)
TRACE = os.environ.get("TRACE") == "1"


def state(engine: BatchEngine) -> str:
    policy, costs = engine.policy, engine.policy.costs
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    return (f"acceptance {engine.acceptance.get('model', float('nan')):.2f} gain "
            + "/".join(f"{policy.realized.gain(n):.2f}" for n in (1, 4, 16))
            + f" draft(1/4) {fmt(costs.draft(1))}/{fmt(costs.draft(4))}"
            + f" verify(4/12) {fmt(costs.verify(4))}/{fmt(costs.verify(12))}")


def serve(name: str, clients: int, per_client: int) -> tuple[float, int, int, float]:
    """(tokens/s, steps, steps that drafted, seconds) of one wave on engine ``name``."""
    engine = engines[name]
    drafted = [0]

    def record(events) -> None:
        drafted[0] += any(engine.last_drafted)
        if TRACE and name == traced:
            policy = engine.policy
            seconds = {phase: round(s, 3) for phase, s in engine.last_seconds.items() if s > 0.005}
            print(f"  rows {len(policy.shown)} joining {policy.joining} k {policy.last_k}"
                  f"{' probe' if policy.probing else ''} drafts {policy.drafts} (behind, acceptance)"
                  f" {policy.shown} gain {policy.gain:.3f} seconds {seconds}")

    tokens, steps, seconds = serve_clients(engine, ids, clients, per_client, record)
    return tokens / seconds, steps, drafted[0], seconds


names = list(engines)
for clients in LEVELS:
    rates = {name: [] for name in names}
    for wave in range(REPEATS + 1):
        order = names[wave % len(names):] + names[:wave % len(names)]
        for name in order:
            label = "warm-up" if wave == 0 else f"r{wave}"
            if TRACE and name == traced:
                print(f"# {clients} clients {label} {name}")
            rate, steps, drafted, seconds = serve(name, clients, 1 if wave == 0 else PER_CLIENT)
            print(f"{clients} clients {label} {name}: {steps} steps, {drafted} drafted, {seconds:.2f} s, {rate:.1f} tok/s")
            if wave:
                rates[name].append(rate)
    print(f"## {clients} clients, tokens/s over none, paired by wave:")
    for name in names:
        line = f"##   {name}: {statistics.median(rates[name]):.1f} tok/s"
        if "none" in rates and name != "none":
            ratios = [r / n for r, n in zip(rates[name], rates["none"])]
            line += f", {statistics.median(ratios):.3f}x ({', '.join(f'{r:.2f}' for r in ratios)})"
        if isinstance(engines[name].policy, GoodputPolicy):
            line += f"; {state(engines[name])}"
        print(line)
