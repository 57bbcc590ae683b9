"""Where the steps of ``continuous_k.py``'s rounds go, for each engine of ``ARMS`` named (comma-separated;
default all): seconds by phase (``BatchEngine.last_seconds``), split
into steps that drafted and steps that did not, summed over REPEATS interleaved rounds.

Usage (from this folder): PYTHONPATH=SRC python phases_16.py CLIENTS PER_CLIENT REPEATS [ARM,ARM...]
"""
import sys
import time
from collections import defaultdict

sys.path.insert(0, "../2026-12-05-batching-waves")
from demo_setup import PARAMS, interleaved, load_demo, serve_clients  # noqa: E402
from quickdraft import SamplingParams  # noqa: E402
from quickdraft.batch.engine import PHASES, BatchEngine  # noqa: E402
from quickdraft.batch.policy import FixedBatchK  # noqa: E402

target, draft, ids = load_demo()
CLIENTS, PER_CLIENT, REPEATS = (int(a) for a in sys.argv[1:4])
ARMS = {
    "none": lambda: BatchEngine(target, None),
    "none again": lambda: BatchEngine(target, None),  # an A/A control
    "draft k0": lambda: BatchEngine(target, draft, policy=FixedBatchK(0), prompt_lookup=False),
    "goodput": lambda: BatchEngine(target, draft),
    "goodput no lookup": lambda: BatchEngine(target, draft, prompt_lookup=False),
    "k1": lambda: BatchEngine(target, draft, policy=FixedBatchK(1), prompt_lookup=False),
    "k2": lambda: BatchEngine(target, draft, policy=FixedBatchK(2), prompt_lookup=False),
}
engines = {name: ARMS[name]() for name in (sys.argv[4].split(",") if len(sys.argv) > 4 else ARMS)}
seconds = {name: defaultdict(float) for name in engines}
steps = {name: defaultdict(int) for name in engines}
wall = defaultdict(float)


def serve(name: str) -> None:
    engine = engines[name]
    clock = [time.perf_counter()]

    def record(events) -> None:
        drafted = "drafted" if any(engine.last_drafted) else "plain"
        steps[name][drafted] += 1
        for phase, s in engine.last_seconds.items():
            seconds[name][drafted, phase] += s
        now = time.perf_counter()
        seconds[name][drafted, "outside phases"] += now - clock[0] - sum(engine.last_seconds.values())
        clock[0] = now

    wall[name] += serve_clients(engine, ids, CLIENTS, PER_CLIENT, record)[2]


for engine in engines.values():
    engine.generate_batch(ids[:2], SamplingParams(max_new_tokens=4, temperature=0.0))  # warm-up
    engine.generate_batch(ids[:1], PARAMS)  # one request alone first, as continuous_k.py
for name in interleaved(list(engines), REPEATS):
    serve(name)
for name in engines:
    print(f"{name}: wall {wall[name]:.2f} s")
    for kind in ("plain", "drafted"):
        if steps[name][kind]:
            print(f"  {kind:8s} {steps[name][kind]:4d} steps: " + ", ".join(
                f"{phase} {seconds[name][kind, phase]:.2f}" for phase in (*PHASES, "outside phases")))
