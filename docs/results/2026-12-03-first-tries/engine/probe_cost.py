"""The batched engine alone at ROWS rows kept busy (engine_levels.py's workload), logging each probe:
its estimated extra cost (GoodputPolicy._probe_cost) and the step's measured seconds against the
median plain step. Usage: python probe_cost.py CONFIG ROWS [ROWS ...] (CONFIG draft / none)."""
import collections, statistics, sys, time
from quickdraft import SamplingParams, load_model
from quickdraft.batch.engine import BatchEngine
from quickdraft.batch.policy import GoodputPolicy
from quickdraft.hardware import machine_config
from quickdraft.server.loadgen import PROMPTS

config, levels = sys.argv[1], [int(r) for r in sys.argv[2:]]
machine = machine_config("cpu")
draft = load_model("qwen2.5-coder-0.5b-instruct", dtype="float32", quantization=machine.draft_quantization) if config == "draft" else None
target = load_model("qwen2.5-coder-1.5b-instruct", dtype=machine.dtype, pack_weights=machine.pack_weights)
chat = [target.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True) for p in PROMPTS]
params = SamplingParams(max_new_tokens=32, temperature=0.0, ignore_eos=True)
estimates = []
original = GoodputPolicy._probe_cost
def logged(self, rows):
    cost = original(self, rows)
    estimates.append(cost)
    return cost
GoodputPolicy._probe_cost = logged
engine = BatchEngine(target, draft)
for rows in levels:
    requests = max(8, 4 * rows)
    sent = tokens = 0
    steps = collections.defaultdict(list)
    probes = []
    trace = []
    start = time.perf_counter()
    while sent < requests or engine.rows:
        while sent < requests and engine.rows < rows:
            engine.add(chat[sent % len(chat)], params)
            sent += 1
        before = len(estimates)
        clock = time.perf_counter()
        events = engine.step()
        seconds = time.perf_counter() - clock
        choice = f"k{engine.policy.last_k}{'p' if engine.policy.probing else ''}"
        steps[choice].append(seconds)
        trace.append((choice, round(seconds, 4), engine.rows))
        if engine.policy.probing:
            probes.append((len(steps["k0"]), estimates[-1] if len(estimates) > before else None, seconds, engine.rows))
        tokens += sum(len(e.chunk.token_ids) for e in events)
    total = time.perf_counter() - start
    plain = statistics.median(steps["k0"]) if steps["k0"] else float("nan")
    print(f"{config} rows {rows}: {tokens / total:.2f} tok/s {total:.1f} s  "
          + " ".join(f"{c}:{len(s)}/{sum(s):.1f}s" for c, s in sorted(steps.items())) + f"  plain step median {plain:.3f} s", flush=True)
    import json; json.dump(trace, open(f"trace-{config}-{rows}.json", "w"))
    for after, estimate, seconds, n in probes:
        est = "scheduled at start" if estimate is None else f"estimated +{estimate:.3f} s"
        print(f"  probe after {after} plain steps, {n} rows: {est}, step {seconds:.3f} s (+{seconds - plain:.3f} s)", flush=True)
