"""Structured JSON output on extraction prompts: plain decoding against speculation.

Each prompt asks the model to extract fields from a text into JSON under a schema; the output
is constrained to the schema (``response_format``). Two workloads: ``short`` (``PROMPTS``: a
sentence or two about a person, an event or a product, each kind its own schema) and
``extraction`` (news passages and one schema, ``bench.workloads.extraction_requests``). Greedy decoding: speculative output
must equal plain output token for token before any speed is reported, and must parse and carry
the schema's required keys. Methods run interleaved, prompt by prompt, best of ``--repeats``,
after an untimed warm-up.

    python -m quickdraft.bench.structured --output bench-structured   # the demo pair
    python -m quickdraft.bench.structured --workload extraction --prompts 4

writes ``results.json`` and ``report.md`` into the output folder (docs/sampling.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from quickdraft.bench.measure import environment
from quickdraft.bench.report import hardware_line
from quickdraft.bench.workloads import EXTRACTION_SCHEMA, extraction_requests
from quickdraft.config import SamplingParams
from quickdraft.engine import SpeculativeDecoder
from quickdraft.hardware import machine_config
from quickdraft.models import load_model
from quickdraft.prompts import chat_prompt_ids

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
EVENT = {"type": "object", "properties": {"title": {"type": "string"}, "date": {"type": "string"},
                                          "attendees": {"type": "array", "items": {"type": "string"}}},
         "required": ["title", "date", "attendees"], "additionalProperties": False}
PRODUCT = {"type": "object", "properties": {"product": {"type": "string"}, "price": {"type": "number"},
                                            "in_stock": {"type": "boolean"},
                                            "tags": {"type": "array", "items": {"type": "string"}}},
           "required": ["product", "price", "in_stock", "tags"], "additionalProperties": False}
INSTRUCTION = "Extract the information from the text as JSON with the keys {keys}.\n\nText: {text}"
PROMPTS = [
    (PERSON, "Maria Lopez, 34, moved from Seville to Berlin last spring, where she now lives and works as a nurse."),
    (PERSON, "Our new colleague is Kenji Watanabe. He is 41 years old and commutes every day from Yokohama."),
    (EVENT, "The quarterly planning meeting is on 12 March 2025; Ana, Bruno, Chen and Dara will attend."),
    (EVENT, "Reminder: the team offsite 'Roadmap 2026' takes place on 3 October. Invited: Eve, Farid and Gita."),
    (PRODUCT, "The UltraLight trail shoe costs 129.99 euros, is currently in stock, and is sold as running, "
              "outdoor and lightweight."),
    (PRODUCT, "Sorry, the Barista Pro espresso machine (449 dollars) is sold out; categories: kitchen, coffee."),
]


def _generate(decoder: SpeculativeDecoder, ids: list[int], params: SamplingParams, repeats: int) -> tuple[list[int], float, dict]:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = decoder.generate(ids, params)
        best = min(best, time.perf_counter() - start)
    return out.token_ids, best, out.stats.to_dict()


def cases(workload: str, count: int) -> list[tuple[str, dict]]:
    """The user message and schema of the first ``count`` prompts of ``workload``."""
    if workload == "extraction":
        return [(message, EXTRACTION_SCHEMA) for message in extraction_requests(count)]
    return [(INSTRUCTION.format(keys=", ".join(schema["required"]), text=text), schema)
            for schema, text in PROMPTS[:count]]


def run(target_name: str, draft_name: str, dtype: str, max_new_tokens: int, repeats: int,
        count: int, workload: str = "short") -> dict:
    target = load_model(target_name, dtype=dtype)
    draft = load_model(draft_name, quantization=machine_config(target.device.type).draft_quantization)
    plain, speculative = SpeculativeDecoder(target), SpeculativeDecoder(target, draft)
    # Warm-up, untimed: the first generations pay one-off costs (llguidance's view of the
    # vocabulary, about a second; the kernels' first calls), which belong to neither method.
    warm = SamplingParams(max_new_tokens=4, response_format={"type": "json_object"})
    for decoder in (plain, speculative):
        decoder.generate("{}", warm)
    rows = []
    for message, schema in cases(workload, count):
        ids = chat_prompt_ids(target.tokenizer, [{"role": "user", "content": message}])
        params = SamplingParams(max_new_tokens=max_new_tokens, response_format={
            "type": "json_schema", "json_schema": {"name": "extraction", "schema": schema}})
        plain_ids, plain_s, _ = _generate(plain, ids, params, repeats)
        spec_ids, spec_s, stats = _generate(speculative, ids, params, repeats)
        if spec_ids != plain_ids:
            raise SystemExit(f"speculative output differs from plain output on {message[:60]!r}: not lossless")
        output = target.tokenizer.decode(plain_ids, skip_special_tokens=True)
        document = json.loads(output)
        assert set(schema["required"]) <= set(document), output
        rows.append({"text": message, "output": output, "tokens": len(plain_ids), "plain_s": plain_s,
                     "speculative_s": spec_s, "speedup": plain_s / spec_s,
                     "acceptance_rate": stats["acceptance_rate"], "mean_tokens_per_step": stats["mean_tokens_per_step"],
                     "forced_share": stats["grammar_accepted_tokens"] / max(1, len(plain_ids))})
        print(f"{len(plain_ids):4d} tokens  plain {plain_s:6.2f} s  speculative {spec_s:6.2f} s  "
              f"x{plain_s / spec_s:.2f}  {output}", file=sys.stderr)
    total_plain = sum(r["plain_s"] for r in rows)
    total_spec = sum(r["speculative_s"] for r in rows)
    return {"workload": workload, "target": target_name, "draft": draft_name, "dtype": target.precision, "draft_dtype": draft.precision,
            "max_new_tokens": max_new_tokens, "repeats": repeats, "environment": environment(target.device),
            "rows": rows, "speedup": total_plain / total_spec}


def report(results: dict) -> str:
    env = results["environment"]
    lines = [f"# Structured JSON output: {results['target']} ({results['dtype']}) with {results['draft']} "
             f"({results['draft_dtype']})", "",
             f"Machine: {env['cpu']}, {env['torch_threads']} threads; {hardware_line(env)}.", "",
             "Greedy, JSON schema constrained; speculative output identical to plain output on every prompt.",
             "Forced: the share of the output drafted as the grammar's forced tokens (and accepted).",
             "", "| tokens | plain s | speculative s | speedup | acceptance | tokens/step | forced | output |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["rows"]:
        lines.append(f"| {r['tokens']} | {r['plain_s']:.2f} | {r['speculative_s']:.2f} | {r['speedup']:.2f}x | "
                     f"{r['acceptance_rate']:.2f} | {r['mean_tokens_per_step']:.2f} | {r['forced_share']:.2f} | "
                     f"`{r['output']}` |")
    lines += ["", f"Overall: {results['speedup']:.2f}x (total plain time / total speculative time)."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quickdraft.bench.structured", description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="target model (default: %(default)s)")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct", help="draft model (default: %(default)s)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                        help="the target's dtype; auto: the fastest on this machine (default: auto)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="tokens per output at most (default: 96)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per prompt and method, best kept (default: 1)")
    parser.add_argument("--workload", choices=("short", "extraction"), default="short",
                        help="short: six sentences, three schemas; extraction: news passages, one schema "
                             "(default: short)")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many prompts (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--output", default="bench-structured", help="folder for results.json and report.md")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = run(args.target, args.draft, args.dtype, args.max_new_tokens, args.repeats, args.prompts,
                  args.workload)
    folder = Path(args.output)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    (folder / "report.md").write_text(report(results), encoding="utf-8")
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
