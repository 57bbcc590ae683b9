"""The demo pair's forwards through transformers' decoder and through quickdraft's lean forward
(``quickdraft.models.lean``), interleaved: one-token steps and six-position forwards after a
prompt of CONTEXT tokens, the models as the defaults load them (``dtype=auto``, int4 draft).

Usage: PYTHONPATH=SRC python forward_steps.py [CONTEXT ...]   (default: 100 700)
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from transformers import DynamicCache

from quickdraft import load_model

ROUNDS, STEPS = 6, 16


def forwards(model, forward, context: int) -> tuple[list[float], list[float]]:
    """Seconds of STEPS one-token steps, then of STEPS six-position forwards, after ``context``."""
    cache = DynamicCache(config=model.module.config)
    with torch.inference_mode():
        forward(torch.arange(1000, 1000 + context)[None], cache, torch.arange(context)[None])
        length, steps, sixes = context, [], []
        for width, times in ((1, steps), (6, sixes)):
            for _ in range(STEPS):
                ids = torch.full((1, width), 500)
                positions = torch.arange(length, length + width)[None]
                start = time.perf_counter()
                forward(ids, cache, positions)
                times.append(time.perf_counter() - start)
                length += width
    return steps, sixes


def main() -> None:
    torch.set_num_threads(2)
    contexts = [int(c) for c in sys.argv[1:]] or [100, 700]
    models = {
        "target": load_model("qwen2.5-coder-1.5b-instruct"),
        "draft": load_model("qwen2.5-coder-0.5b-instruct", quantization="int4"),
    }
    print("| model | context | transformers step ms | lean step ms | ratio | transformers 6 positions ms | lean 6 positions ms | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, model in models.items():
        decoder, lean = model.module.get_decoder(), model.lean
        assert lean is not None, f"{model.name} has no lean forward"
        paths = {
            "transformers": lambda ids, cache, pos: decoder(input_ids=ids, cache=cache, use_cache=True, position_ids=pos),
            "lean": lambda ids, cache, pos: lean(ids, cache, pos),
        }
        for context in contexts:
            times = {path: ([], []) for path in paths}
            for round_ in range(ROUNDS):  # interleaved, each path first in every other round
                for path in (list(paths) if round_ % 2 == 0 else list(paths)[::-1]):
                    steps, sixes = forwards(model, paths[path], context)
                    times[path][0].extend(steps)
                    times[path][1].extend(sixes)
            (hf_step, hf_six), (lean_step, lean_six) = (
                (statistics.median(times[p][0]) * 1e3, statistics.median(times[p][1]) * 1e3) for p in paths)
            print(f"| {name} ({model.precision}) | {context} | {hf_step:.1f} | {lean_step:.1f} | {lean_step / hf_step:.2f} "
                  f"| {hf_six:.1f} | {lean_six:.1f} | {lean_six / hf_six:.2f} |", flush=True)


if __name__ == "__main__":
    main()
