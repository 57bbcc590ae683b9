"""The demo 1.5B target (bfloat16, packed as `load_model` packs it) with its linear layers as AMX
tiles and as oneDNN's packed layout, one model of each in the process: a 512-token prompt, then
one-token steps, and forwards over 6 positions (a verification of 5 drafts), through `ModelRunner`
(the lean forward); interleaved, ROUNDS rounds, medians in ms.

Usage: PYTHONPATH=SRC python target_steps.py [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from quickdraft import load_model
from quickdraft.models import packing
from quickdraft.runner import ModelRunner


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    torch.set_num_threads(2)
    tiles = load_model("qwen2.5-coder-1.5b-instruct", dtype="bfloat16", pack_weights=True)
    kernel = packing.bf16_tiles_kernel
    packing.bf16_tiles_kernel = lambda: None
    onednn = load_model("qwen2.5-coder-1.5b-instruct", dtype="bfloat16", pack_weights=True)
    packing.bf16_tiles_kernel = kernel
    layer = lambda m: type(m.module.model.layers[0].mlp.down_proj).__name__
    models = {layer(tiles): tiles, layer(onednn): onednn}
    prompt = [(i * 7919) % 30000 + 100 for i in range(512)]
    times: dict[tuple[str, str], list[float]] = {}
    for round_ in range(rounds):
        for name in (models if round_ % 2 == 0 else reversed(list(models))):
            runner = ModelRunner(models[name])
            start = time.perf_counter()
            runner.forward(prompt, 1)
            times.setdefault((name, "prompt 512"), []).append(time.perf_counter() - start)
            for what, width in (("step", 1), ("6 positions", 6)):
                for i in range(8):
                    start = time.perf_counter()
                    runner.forward([300 + i] * width, width)
                    times.setdefault((name, what), []).append(time.perf_counter() - start)
                    runner.truncate(len(prompt))
    print(f"| forward | {' | '.join(models)} | ratio |")
    print("| --- |" + " ---: |" * (len(models) + 1))
    for what in ("prompt 512", "step", "6 positions"):
        ms = [statistics.median(times[name, what]) * 1e3 for name in models]
        print(f"| {what} | " + " | ".join(f"{m:.1f}" for m in ms) + f" | {ms[0] / ms[1]:.2f} |")


if __name__ == "__main__":
    main()
