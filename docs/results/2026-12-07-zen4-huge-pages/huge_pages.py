"""Plain batched decoding of the demo target with torch's large allocations on 4 KiB pages
against transparent huge pages (THP_MEM_ALLOC_ENABLE=0 / 1, read by torch at its first
allocation), each in a process of its own, the two taken in turn.

Each process: the target as `quickdraft serve` loads it (packed bfloat16, 2 threads), an engine
without a draft, a first wave at each width not counted, then waves of 1, 16 and 32 clients (two
requests each, the loadgen's prompts, 32 greedy tokens); it prints the median seconds of the
steps over all rows of each width (verification and acceptance) and the memory on huge pages.

Usage: PYTHONPATH=SRC python huge_pages.py [PAIRS]
"""
import json
import os
import statistics
import subprocess
import sys

WIDTHS = (1, 16, 32)


def child() -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../2026-12-05-batching-waves"))
    import torch
    from demo_setup import serve_clients
    from quickdraft.batch.engine import BatchEngine
    from quickdraft.models.loading import load_model
    from quickdraft.prompts import chat_prompt_ids
    from quickdraft.server.loadgen import PROMPTS

    torch.set_num_threads(2)
    target = load_model("qwen2.5-coder-1.5b-instruct")
    ids = [chat_prompt_ids(target.tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
    engine = BatchEngine(target, None)
    medians = {}
    for clients in WIDTHS:
        serve_clients(engine, ids, clients, 1)
        steps = []

        def on_step(events, clients=clients):
            if len(engine.last_drafted) == clients:
                steps.append(engine.last_seconds["verify"] + engine.last_seconds["accept"])
        for _ in range(2):
            serve_clients(engine, ids, clients, 2, on_step)
        medians[clients] = statistics.median(steps)
    huge = next(int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages"))
    print(json.dumps({"seconds": medians, "huge_pages_mib": huge // 1024}))


def main(pairs: int) -> None:
    results = {"0": [], "1": []}
    for pair in range(pairs):
        for flag in ("0", "1") if pair % 2 == 0 else ("1", "0"):
            env = dict(os.environ, THP_MEM_ALLOC_ENABLE=flag)
            out = subprocess.run([sys.executable, __file__, "child"], env=env, capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            results[flag].append(result)
            print(f"THP_MEM_ALLOC_ENABLE={flag}: " + ", ".join(
                f"{w} rows {s:.4f} s" for w, s in result["seconds"].items()) + f"; on huge pages {result['huge_pages_mib']} MiB", flush=True)
    print("\n| rows | 4 KiB pages, median s | huge pages, median s | huge / 4 KiB, per pair (sorted) |")
    print("| ---: | ---: | ---: | --- |")
    for w in map(str, WIDTHS):
        small = [r["seconds"][w] for r in results["0"]]
        huge = [r["seconds"][w] for r in results["1"]]
        ratios = sorted(h / s for h, s in zip(huge, small))
        print(f"| {w} | {statistics.median(small):.4f} | {statistics.median(huge):.4f} | "
              + ", ".join(f"{r:.3f}" for r in ratios) + " |")


if __name__ == "__main__":
    if sys.argv[1:] == ["child"]:
        child()
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
