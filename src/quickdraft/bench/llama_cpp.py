"""The llama.cpp peer: the same GGUF file run by llama.cpp (through llama-cpp-python), greedy.

llama-cpp-python is not a dependency of quickdraft and is best built for the machine's
instruction set apart from it (docs/quickdraft.md gives the build line), so it runs in its own
Python: ``python`` names that interpreter (default ``$QUICKDRAFT_LLAMA_PYTHON``, else this one).
One worker process loads the model once and serves each generation over a pipe; while it waits
for the next request it computes nothing, so its threads and quickdraft's take turns, and the
runs of both interleave in one benchmark.

Each run feeds the prompt's token ids (no tokenization on either side) and decodes exactly
``max_new_tokens`` tokens with llama.cpp's sampler, end-of-sequence tokens included, as
quickdraft's ``ignore_eos`` does: the token counts compare like for like. Greedy runs are
llama.cpp's argmax; sampled runs use llama.cpp's own random stream (seeded), so their tokens
differ from quickdraft's and only their speed compares.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from quickdraft.bench.generation import Generation
from quickdraft.config import SamplingParams
from quickdraft.errors import InvalidParameterError

PYTHON_ENV = "QUICKDRAFT_LLAMA_PYTHON"

# The worker: argv = model path, threads, context length; one JSON request a line on stdin.
_WORKER = r"""
import json, sys, time
from llama_cpp import Llama
path, threads, context = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=path, n_ctx=context, n_threads=threads, n_threads_batch=threads, verbose=False)
print(json.dumps({"ready": llm.n_vocab()}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    llm.set_seed(request["seed"])
    tokens, start = [], time.perf_counter()
    for token in llm.generate(request["prompt"], temp=request["temperature"], top_k=request["top_k"],
                              top_p=request["top_p"], min_p=0.0, repeat_penalty=1.0, reset=True):
        tokens.append(int(token))
        if len(tokens) == request["max_new_tokens"]:
            break
    print(json.dumps({"tokens": tokens, "seconds": time.perf_counter() - start}), flush=True)
"""


class LlamaCppMethod:
    """Greedy decoding of a GGUF file by llama.cpp, in a worker process (module docstring).

    Args:
        name, description: as in ``Method``.
        gguf_path: the model file (the one quickdraft runs from its blocks).
        threads: llama.cpp's threads, for the prompt and for each token.
        python: the interpreter that has ``llama_cpp`` (default ``$QUICKDRAFT_LLAMA_PYTHON``, else
            this one).
        context: the context length llama.cpp allocates.
    """

    family = "llama.cpp"
    plain = True

    def __init__(self, name: str, description: str, gguf_path: Path, threads: int, python: str | None = None,
                 context: int = 4096) -> None:
        self.name, self.description = name, description
        python = python or os.environ.get(PYTHON_ENV) or sys.executable
        self._process = subprocess.Popen([python, "-c", _WORKER, str(gguf_path), str(threads), str(context)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self._process.stdout.readline()
        if not ready:
            raise InvalidParameterError(
                f"the llama.cpp worker did not start with {python} (is llama-cpp-python installed there? set "
                f"{PYTHON_ENV} to the interpreter that has it)")

    def generate(self, prompt_ids: list[int], params: SamplingParams, k: int) -> Generation:
        greedy = params.greedy
        request = {"prompt": list(prompt_ids), "max_new_tokens": params.max_new_tokens,
                   "temperature": 0.0 if greedy else params.temperature, "top_k": 1 if greedy else params.top_k,
                   "top_p": params.top_p, "seed": params.seed if params.seed is not None else 0}
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        reply = self._process.stdout.readline()
        if not reply:
            raise RuntimeError(f"{self.name}: the llama.cpp worker ended (exit status {self._process.poll()})")
        return Generation(json.loads(reply)["tokens"])

    def close(self) -> None:
        """End the worker."""
        if self._process.poll() is None:
            self._process.stdin.close()
            self._process.wait(timeout=30)
