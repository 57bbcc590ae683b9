"""The demo target from its GGUF blocks against its other formats and llama.cpp, interleaved.

    python scripts/bench_blocks.py decode --formats blocks,blocks-avx2,bf16,int4 --llama-python PY
    python scripts/bench_blocks.py forward --formats blocks,bf16,int4
    python scripts/bench_blocks.py products --formats blocks --threads 1 --baseline OTHER/block_rows.c

``decode``: plain greedy tokens per second (prompt included, EOS ignored) of each format, and
llama.cpp's on the same GGUF file (``quickdraft.bench.llama_cpp``), taking turns run by run; the
medians, their ratios to llama.cpp, and how many leading tokens each format shares with llama.cpp.
``forward``: one target forward over n new positions with a KV cache (the doctor's ``v_K``: n =
K + 1), medians over rounds in which every format and n take turns.
``products``: the block kernel alone over every matrix of the target (its part of a forward) for n
rows, on both of its paths, in CPU seconds of the process: with ``--threads 1``, the work itself,
not the waits for threads that other processes' load causes on a shared machine. ``--baseline``: a
``block_rows.c`` (another checkout's) built and timed beside this one, taking turns.

Formats: ``blocks`` (the file's Q4_K/Q6_K blocks, the kernel's best path here), ``blocks-avx2``
(the same on the AVX2 path), ``bf16`` (dequantized to bfloat16), ``int4`` (re-quantized to
quickdraft's draft int4 format). Each run waits up to --quiet-wait seconds for other processes
to leave the CPU (shared machines).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import statistics
import time
from pathlib import Path

import torch

from quickdraft import SamplingParams, SpeculativeDecoder, load_model
from quickdraft.bench.llama_cpp import LlamaCppMethod
from quickdraft.bench.measure import wait_for_quiet
from quickdraft.kernels import BlockKernel, block_kernel, build
from quickdraft.models.blocks import BlockLinear
from quickdraft.models.demo import demo_gguf_file, demo_model_dir
from quickdraft.runner import ModelRunner

TARGET = "qwen2.5-coder-1.5b-instruct"
PROMPTS = ("Write a Python function that checks whether a number is prime.",
           "Explain what a hash map is in two sentences.")


def load(fmt: str):
    if fmt.startswith("blocks"):
        return load_model(TARGET)
    if fmt == "bf16":
        return load_model(TARGET, dtype="bfloat16", quantization="none")
    # The dequantized copy, re-quantized: the GGUF itself would run from its blocks.
    return load_model(demo_model_dir(TARGET), dtype="float32", quantization="int4")


def on_path(fmt: str) -> None:
    """Point the shared block kernel at the path ``fmt`` names."""
    kernel = block_kernel()
    if kernel is not None:
        kernel.vnni = fmt == "blocks" and on_path.vnni
on_path.vnni = bool(block_kernel() and block_kernel().vnni)  # noqa: E305


def decode(args, models) -> None:
    tokenizer = next(iter(models.values())).tokenizer
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=True) for text in PROMPTS]
    prompts = [p["input_ids"] if hasattr(p, "keys") else list(p) for p in prompts]
    params = SamplingParams(max_new_tokens=args.tokens, ignore_eos=True)
    decoders = {fmt: SpeculativeDecoder(model, None) for fmt, model in models.items()}
    runs = list(decoders)
    if args.llama_python is not None:
        runs.append("llama.cpp")
        llama = LlamaCppMethod("llama.cpp", "", demo_gguf_file(TARGET), torch.get_num_threads(), args.llama_python)
    rates = {name: [] for name in runs}
    tokens = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for index, prompt in enumerate(prompts):
            for name in runs[round_ % len(runs):] + runs[: round_ % len(runs)]:
                wait_for_quiet(args.quiet_wait)
                on_path(name)
                start = time.perf_counter()
                out = llama.generate(prompt, params, 1) if name == "llama.cpp" else decoders[name].generate(prompt, params)
                seconds = time.perf_counter() - start
                tokens[(name, index)] = out.token_ids
                if round_:
                    rates[name].append(args.tokens / seconds)
    base = statistics.median(rates["llama.cpp"]) if "llama.cpp" in rates else None
    for name, values in rates.items():
        median = statistics.median(values)
        # Paired: each run against llama.cpp's run of the same prompt in the same round (the
        # neighbour in time), so that other processes' busy spells hit both alike.
        paired = [v / b for v, b in zip(values, rates["llama.cpp"])] if base else []
        ratio = (f", {median / base:.2f}x llama.cpp (paired runs: median {statistics.median(paired):.2f}x)"
                 if base else "")
        shared = ""
        if base and name != "llama.cpp":
            same = [next((i for i, (a, b) in enumerate(zip(tokens[(name, p)], tokens[("llama.cpp", p)])) if a != b),
                         args.tokens) for p in range(len(prompts))]
            shared = f"; first tokens equal to llama.cpp's: {same} of {args.tokens}"
        print(f"{name}: median {median:.2f} tok/s over {len(values)} runs (min {min(values):.2f}, "
              f"max {max(values):.2f}){ratio}{shared}")


def forward(args, models) -> None:
    sizes = [int(n) for n in args.positions.split(",")]
    tokenizer = next(iter(models.values())).tokenizer
    context = tokenizer(PROMPTS[0]).input_ids
    runners = {fmt: ModelRunner(model) for fmt, model in models.items()}
    times = {(fmt, n): [] for fmt in runners for n in sizes}
    with torch.inference_mode():
        for fmt, runner in runners.items():
            on_path(fmt)
            runner.forward(context)
        for round_ in range(args.rounds + 1):
            for fmt, runner in runners.items():
                on_path(fmt)
                for n in sizes:
                    wait_for_quiet(args.quiet_wait)
                    start = time.perf_counter()
                    runner.forward(context[:n])
                    if round_:
                        times[(fmt, n)].append(time.perf_counter() - start)
                    runner.truncate(len(context))
    for fmt in runners:
        one = statistics.median(times[(fmt, 1)])
        cells = ", ".join(f"{n}: {statistics.median(times[(fmt, n)]) * 1e3:.0f} ms "
                          f"({statistics.median(times[(fmt, n)]) / one:.2f}x)" for n in sizes)
        print(f"{fmt}: {cells}")


def products(args, models) -> None:
    layers = [layer for layer in models["blocks"].module.modules() if isinstance(layer, BlockLinear)]
    sizes = [int(n) for n in args.positions.split(",")]
    this = block_kernel()
    sources = {"this": this}
    if args.baseline is not None:
        sources["baseline"] = BlockKernel(ctypes.CDLL(str(build(Path(args.baseline)))), vnni=this.vnni)
    kernels = {}
    for source, kernel in sources.items():
        for path in ("vnni", "avx2") if this.vnni else ("avx2",):
            kernels[(source, path)] = copy.copy(kernel)
            kernels[(source, path)].vnni = path == "vnni"
    times = {(key, n): [] for key in kernels for n in sizes}
    generator = torch.Generator().manual_seed(0)
    inputs = {(layer.in_features, n): torch.randn(n, layer.in_features, generator=generator)
              for layer in layers for n in sizes}
    for round_ in range(args.rounds + 1):
        order = list(kernels)[round_ % len(kernels):] + list(kernels)[: round_ % len(kernels)]
        for key in order:
            for n in sizes:
                start = time.process_time()
                for layer in layers:
                    kernels[key].linear(inputs[(layer.in_features, n)], layer.blocks, layer.kind)
                if round_:
                    times[(key, n)].append(time.process_time() - start)
    for key in kernels:
        one = statistics.median(times[(key, 1)])
        cells = ", ".join(f"{n}: {statistics.median(times[(key, n)]) * 1e3:.0f} ms "
                          f"({statistics.median(times[(key, n)]) / one:.2f}x)" for n in sizes)
        print(f"{key[0]} kernel, {key[1]} path: {cells} (CPU time)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["decode", "forward", "products"])
    parser.add_argument("--formats", default="blocks,bf16,int4")
    parser.add_argument("--llama-python", default=None, help="decode: also run llama.cpp with this Python")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--positions", default="1,2,4,6,8,16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quiet-wait", type=float, default=0.0)
    parser.add_argument("--baseline", default=None, help="products: another block_rows.c to time beside this one")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {}
    for fmt in args.formats.split(","):
        models[fmt] = models.get("blocks") if fmt.startswith("blocks") and "blocks" in models else load(fmt)
        print(f"{fmt}: {models[fmt].precision}", flush=True)
    {"decode": decode, "forward": forward, "products": products}[args.mode](args, models)


if __name__ == "__main__":
    main()
