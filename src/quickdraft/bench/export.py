"""``quickdraft export --to ENGINE TARGET DRAFT``: the speculative configuration quickdraft measured,
written in another engine's own terms.

A ``SpecPlan`` is what carries over: the method (a draft model, or n-gram lookup with
``DRAFT = ngram``), K, the dynamic tree shape where the doctor predicted that a tree pays, whether
the doctor ran the draft with int8 or int4 weights, and whether quickdraft would look the last n-gram
up before running the draft (its default). It comes from ``quickdraft doctor --json``
(``--from-doctor``) or from quickdraft's defaults. Each engine's writer turns it into that
engine's flags, JSON or keyword arguments, and says what does not carry over.

Flag names were checked against each engine's documentation and source (docs/scale-out.md cites
them; tests/fixtures/engine_flags.json lists them for the tests):

* vLLM: ``vllm serve TARGET --speculative-config JSON`` with ``method`` (``draft_model``, ``ngram``),
  ``model``, ``num_speculative_tokens``, ``prompt_lookup_max`` / ``prompt_lookup_min``.
* SGLang: ``--speculative-algorithm STANDALONE|NGRAM``, ``--speculative-draft-model-path``,
  ``--speculative-num-steps`` (depth), ``--speculative-eagle-topk`` (branching),
  ``--speculative-num-draft-tokens`` (tokens verified per step, the last accepted one included),
  ``--speculative-ngram-*``.
* llama.cpp ``llama-server``: ``-md`` (draft GGUF), ``--spec-draft-n-max`` / ``--spec-draft-n-min``,
  ``--spec-type ngram-simple,draft-simple`` and ``--spec-ngram-simple-size-n`` / ``-size-m``.
* transformers ``generate``: ``assistant_model``, ``num_assistant_tokens``,
  ``num_assistant_tokens_schedule``, ``assistant_confidence_threshold``, ``prompt_lookup_num_tokens``,
  ``max_matching_ngram_size``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from quickdraft.errors import QuickdraftError

ENGINES = ("vllm", "sglang", "llama.cpp", "transformers")
NGRAM = "ngram"
# quickdraft's prompt lookup matches the last 3 tokens down to 1 (PromptLookupDrafter's defaults).
NGRAM_MAX, NGRAM_MIN = 3, 1
# The doctor's predictions are for one sequence (batch 1); what to check before trusting them at scale.
MEASURE = ("measure it where it runs, with and without speculation: quickdraft bench --endpoint URL "
           "--endpoint BASELINE_URL --concurrency 1,4,16 (docs/scale-out.md)")


class ExportError(QuickdraftError):
    """The configuration cannot be exported as asked (the message says why and what to do)."""


@dataclass(frozen=True)
class TreeShape:
    """A dynamic tree as quickdraft grows it: ``budget`` nodes, ``depth`` deep, ``branch`` nodes
    expanded per depth and children per node (``quickdraft.tree.TreeSpec``)."""

    budget: int
    depth: int
    branch: int


@dataclass(frozen=True)
class SpecPlan:
    """The configuration to hand over.

    Attributes:
        target: the target as the engine should load it (passed through as given).
        draft: the draft model, or None for n-gram lookup (no draft model).
        k: tokens drafted per step (a chain; a tree's depth is ``tree.depth``).
        tree: the dynamic tree the doctor predicted to beat the best chain, or None.
        draft_quantization: "int8" or "int4" where the doctor measured the draft with such weights
            (quickdraft's own layers), else "none".
        lookup_first: quickdraft looks the last n-gram up before running the draft model.
        source: where the figures come from, for the output's first line.
        predicted_speedup: the doctor's prediction at batch 1, greedy, if any.
    """

    target: str
    draft: str | None
    k: int
    tree: TreeShape | None = None
    draft_quantization: str = "none"
    lookup_first: bool = False
    source: str = "quickdraft's defaults"
    predicted_speedup: float | None = None


@dataclass(frozen=True)
class Export:
    """One engine's configuration: ``command`` to run (shell, or Python for transformers),
    ``settings`` (its JSON / flags / kwargs as data), what does not carry over (``lost``) and what
    to check (``notes``)."""

    engine: str
    command: str
    settings: dict
    lost: tuple[str, ...]
    notes: tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# Plans


def default_plan(target: str, draft: str, k: int | None) -> SpecPlan:
    """Without a doctor report: quickdraft's default K and, for a draft model, lookup in front."""
    from quickdraft.engine import DEFAULT_NUM_SPECULATIVE_TOKENS

    k = DEFAULT_NUM_SPECULATIVE_TOKENS if k is None else k
    if draft == NGRAM:
        return SpecPlan(target, None, k)
    return SpecPlan(target, draft, k, lookup_first=True)


def plan_from_doctor(report: dict, target: str, draft: str, k: int | None, source: str) -> tuple[SpecPlan, list[str]]:
    """The plan the doctor's JSON supports, and what was decided on its behalf (printed as notes).

    A pair the doctor found unusable (tokenizers differ) or predicted slower than the target
    alone is exported as n-gram lookup, the doctor's own advice; an explicit ``-k`` wins over
    its recommended K. The tree is the doctor's best dynamic tree at its lowest temperature when
    it predicted a gain of ``TREE_MARGIN`` or more over the best chain.
    """
    from quickdraft.bench.doctor import TREE_MARGIN

    try:
        usable = bool(report["usable"])
        recommended = int(report["recommended_k"]) if usable else None
        predicted = float(report["recommended_speedup"]) if usable else None
        trees = report.get("tree_predictions") or []
        quantized = re.search(r"\b(int8|int4) weights", str(report.get("draft_dtype", "")))
        draft_quantization = quantized.group(1) if quantized else "none"
    except (KeyError, TypeError, ValueError) as error:
        raise ExportError(f"{source} is not the output of 'quickdraft doctor --json' (missing or bad {error}): "
                          "rerun the doctor with --json and save what it prints") from None
    decided = [f"the doctor measured {report.get('target')} with draft {report.get('draft')} "
               f"({report.get('draft_dtype', '?')}) on {report.get('device', '?')}"]
    lookup = default_plan(target, NGRAM, k)
    if draft == NGRAM:
        decided.append(f"the doctor's figures are its draft model's: n-gram lookup is exported with K={lookup.k}")
        return lookup, decided
    if not usable:
        decided.append("the doctor found that this draft cannot speculate for this target (tokenizers differ): "
                       "n-gram lookup is exported instead, which needs no draft model")
        return lookup, decided
    if predicted < 1.0:
        decided.append(f"the doctor predicted this draft SLOWER than the target alone ({predicted:.2f}x at best, "
                       f"K={recommended}): n-gram lookup is exported instead, as the doctor advises; measure the "
                       "draft model anyway with bench --endpoint if you doubt it")
        return lookup, decided
    tree = None
    greedy = [row for row in trees if row.get("kind") == "all"]
    if greedy:
        row = min(greedy, key=lambda r: float(r["temperature"]))
        if row["gain"] >= TREE_MARGIN:
            t = row["tree"]
            tree = TreeShape(budget=int(t["budget"]), depth=int(t["depth"]), branch=int(t["branch"]))
            decided.append(f"the doctor predicted a tree (N={tree.budget}, D={tree.depth}, B={tree.branch}) "
                           f"{row['gain']:+.0%} over the best chain at T={float(row['temperature']):g}")
    plan = SpecPlan(target, draft, k or recommended, tree=tree, draft_quantization=draft_quantization, lookup_first=True,
                    source=source, predicted_speedup=predicted)
    return plan, decided


# ---------------------------------------------------------------------------------------------
# Engines


def _quantization_lost(plan: SpecPlan, engine_way: str) -> str:
    return (f"the draft's {plan.draft_quantization} weights (quickdraft quantizes its linear layers itself, at load "
            f"time) do not carry over: {engine_way}")


def _lookup_lost(engine: str, compare: str = "run an n-gram server too and compare them with bench --endpoint") -> str:
    return (f"prompt lookup in front of the draft model does not carry over: {engine} drafts with one method; "
            f"the draft model is exported ({compare})")


def to_vllm(plan: SpecPlan) -> Export:
    if plan.draft is None:
        settings = {"method": "ngram", "num_speculative_tokens": plan.k,
                    "prompt_lookup_max": NGRAM_MAX, "prompt_lookup_min": NGRAM_MIN}
    else:
        settings = {"method": "draft_model", "model": plan.draft, "num_speculative_tokens": plan.k}
    lost = []
    if plan.tree:
        lost.append("the dynamic tree does not carry over: vLLM's speculative_token_tree is a static tree for "
                    "EAGLE-style drafters; the chain of K is exported")
    if plan.draft_quantization != "none":
        lost.append(_quantization_lost(plan, "vLLM's 'quantization' key names how a checkpoint was quantized (fp8, awq, gptq); "
                               "give a pre-quantized draft checkpoint and its method there"))
    if plan.lookup_first:
        lost.append(_lookup_lost("vLLM"))
    notes = ("as the batch grows, num_speculative_tokens_per_batch_size (a list of [first, last, K] batch-size "
             "ranges, K = 0 turns speculation off) lowers K; quickdraft measured one sequence at a time",
             "/metrics: vllm:spec_decode_num_drafts_total, vllm:spec_decode_num_draft_tokens_total, "
             "vllm:spec_decode_num_accepted_tokens_total (quickdraft bench --endpoint reads them)", MEASURE)
    command = f"vllm serve {shlex.quote(plan.target)} --speculative-config {shlex.quote(json.dumps(settings))}"
    return Export("vllm", command, settings, tuple(lost), notes)


def to_sglang(plan: SpecPlan) -> Export:
    lost = []
    if plan.draft is None:
        # A chain of K lookups: breadth 1 at every step; K + 1 verified tokens counts the last accepted one.
        settings = {"--speculative-algorithm": "NGRAM", "--speculative-num-draft-tokens": plan.k + 1,
                    "--speculative-ngram-max-match-window-size": NGRAM_MAX,
                    "--speculative-ngram-min-match-window-size": NGRAM_MIN,
                    "--speculative-ngram-max-bfs-breadth": 1, "--speculative-ngram-min-bfs-breadth": 1}
    elif plan.tree:
        settings = {"--speculative-algorithm": "STANDALONE", "--speculative-draft-model-path": plan.draft,
                    "--speculative-num-steps": plan.tree.depth, "--speculative-eagle-topk": plan.tree.branch,
                    "--speculative-num-draft-tokens": plan.tree.budget + 1}
    else:
        settings = {"--speculative-algorithm": "STANDALONE", "--speculative-draft-model-path": plan.draft,
                    "--speculative-num-steps": plan.k, "--speculative-eagle-topk": 1,
                    "--speculative-num-draft-tokens": plan.k + 1}
    if plan.draft_quantization != "none":
        lost.append(_quantization_lost(plan, "--speculative-draft-model-quantization takes SGLang's methods (fp8, awq, ...)"))
    if plan.lookup_first:
        lost.append(_lookup_lost("SGLang"))
    notes = ["SGLang expands a tree by --speculative-eagle-topk candidates per step and verifies the best "
             "--speculative-num-draft-tokens - 1 nodes: close to, not the same as, quickdraft's dynamic tree",
             "/metrics needs --enable-metrics: sglang:spec_accept_length and sglang:spec_accept_rate (running "
             "averages; quickdraft bench --endpoint reads them)", MEASURE]
    if plan.draft is None:
        notes.insert(0, "SGLang's NGRAM runs on CUDA only")
    flags = " ".join(f"{flag} {shlex.quote(str(value))}" for flag, value in settings.items())
    command = f"python -m sglang.launch_server --model-path {shlex.quote(plan.target)} {flags} --enable-metrics"
    return Export("sglang", command, settings, tuple(lost), tuple(notes))


def to_llama_cpp(plan: SpecPlan) -> Export:
    lookup = {"--spec-ngram-simple-size-n": NGRAM_MAX, "--spec-ngram-simple-size-m": plan.k}
    if plan.draft is None:
        settings = {"--spec-type": "ngram-simple", **lookup}
    else:
        settings = {"-md": plan.draft, "--spec-draft-n-max": plan.k, "--spec-draft-n-min": 0}
        if plan.lookup_first:  # llama-server mixes them, the draftless one first: quickdraft's order
            settings = {"--spec-type": "ngram-simple,draft-simple", **settings, **lookup}
    lost = []
    if plan.tree:
        lost.append("the tree does not carry over: llama-server drafts chains; the chain of K is exported")
    if plan.draft_quantization != "none":
        lost.append(_quantization_lost(plan, "quantize the draft GGUF instead (Q8_0, or Q4_K_M like the demo models)"))
    notes = ("TARGET and DRAFT must be GGUF files; options as of llama.cpp's server README at commit 00dc805 "
             "(older builds spell --spec-draft-n-max as --draft-max and the n-gram sizes --spec-ngram-size-n/-m)",
             "-np N serves N requests at once: each slot drafts on its own",
             "the doctor timed quickdraft's forwards, not llama.cpp's: on this project's 2-core CPU llama.cpp's Q4 "
             "kernels verified 5 tokens at 3.9x the cost of one and the demo draft slowed the target down "
             "(docs/scale-out.md)", MEASURE)
    flags = " ".join(f"{flag} {shlex.quote(str(value))}" for flag, value in settings.items())
    command = f"llama-server -m {shlex.quote(plan.target)} {flags} --metrics"
    return Export("llama.cpp", command, settings, tuple(lost), notes)


def to_transformers(plan: SpecPlan) -> Export:
    if plan.draft is None:
        settings = {"prompt_lookup_num_tokens": plan.k, "max_matching_ngram_size": NGRAM_MAX}
        load = ""
    else:
        # As quickdraft bench's hf-assisted-k: exactly K drafts a step, no confidence stop.
        settings = {"num_assistant_tokens": plan.k, "num_assistant_tokens_schedule": "constant",
                    "assistant_confidence_threshold": 0.0}
        load = f"draft = AutoModelForCausalLM.from_pretrained({plan.draft!r})\n"
    kwargs = "".join(f", {name}={value!r}" for name, value in settings.items())
    assistant = ", assistant_model=draft" if plan.draft else ""
    command = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
               f"tokenizer = AutoTokenizer.from_pretrained({plan.target!r})\n"
               f"model = AutoModelForCausalLM.from_pretrained({plan.target!r})\n{load}"
               'inputs = tokenizer("def fibonacci(n):", return_tensors="pt")\n'
               f"output = model.generate(**inputs{assistant}{kwargs}, max_new_tokens=128)\n"
               "print(tokenizer.decode(output[0]))")
    lost = []
    if plan.tree:
        lost.append("the tree does not carry over: generate() drafts chains; the chain of K is exported")
    if plan.draft_quantization != "none":
        lost.append(_quantization_lost(plan, "transformers runs the draft checkpoint as loaded"))
    if plan.lookup_first:
        lost.append(_lookup_lost("generate()", "quickdraft bench compares both as hf-assisted-k and hf-ngram"))
    notes = ("quickdraft bench measures these settings (hf-assisted-k, hf-ngram) beside quickdraft's own",)
    return Export("transformers", command, settings, tuple(lost), notes)


WRITERS: dict[str, Callable[[SpecPlan], Export]] = {
    "vllm": to_vllm, "sglang": to_sglang, "llama.cpp": to_llama_cpp, "transformers": to_transformers,
}


def format_export(export: Export, plan: SpecPlan, decided: list[str]) -> str:
    """The export as text: the command, then what was decided, what is lost and what to check."""
    shape = "n-gram lookup" if plan.draft is None else f"draft model {plan.draft}"
    head = f"# {export.engine}: {shape}, K={plan.k}"
    if plan.tree and export.engine == "sglang" and plan.draft:
        head += f", tree N={plan.tree.budget} D={plan.tree.depth} B={plan.tree.branch}"
    head += f" (from {plan.source}"
    head += f"; predicted {plan.predicted_speedup:.2f}x at batch 1)" if plan.predicted_speedup else ")"
    out = [head, export.command, ""]
    for title, items in (("Decided", decided), ("Does not carry over", export.lost), ("Check", export.notes)):
        if items:
            out += [f"{title}:"] + [f"  - {item}" for item in items] + [""]
    return "\n".join(out).rstrip()


# ---------------------------------------------------------------------------------------------
# Command


def add_export_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``export`` on the ``quickdraft`` command."""
    parser = subparsers.add_parser(
        "export", help="write a measured speculative configuration as vLLM, SGLang, llama.cpp or transformers settings",
        description="Turn the configuration quickdraft measured for TARGET and DRAFT (quickdraft doctor --json, or "
                    "quickdraft's defaults) into another engine's own flags, JSON or generate() arguments, and say "
                    "what does not carry over. See docs/scale-out.md.",
    )
    parser.add_argument("target", help="the target as the engine loads it (hub id, folder, or .gguf for llama.cpp)")
    parser.add_argument("draft", help="the draft model as the engine loads it, or 'ngram' for n-gram lookup")
    parser.add_argument("--to", required=True, choices=ENGINES, help="the engine to write the configuration for")
    parser.add_argument("--from-doctor", default=None, metavar="FILE",
                        help="the JSON 'quickdraft doctor TARGET DRAFT --json' printed: its recommended K, tree "
                             "and draft quantization (default: quickdraft's defaults, K=5)")
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=None,
                        help="tokens drafted per step (default: the doctor's recommended K, else 5)")
    parser.add_argument("--json", action="store_true", help="print the configuration as JSON")
    parser.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    if args.num_speculative_tokens is not None and args.num_speculative_tokens < 1:
        raise ExportError(f"-k must be >= 1, got {args.num_speculative_tokens}")
    if args.draft == "none":
        raise ExportError("nothing to export for plain decoding: give a draft model or 'ngram'")
    decided: list[str] = []
    if args.from_doctor:
        path = Path(args.from_doctor)
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise ExportError(f"cannot read {path}: {error.strerror}") from None
        except json.JSONDecodeError as error:
            raise ExportError(f"{path} is not JSON ({error}): save what 'quickdraft doctor ... --json' prints") from None
        if not isinstance(report, dict):
            raise ExportError(f"{path} is not the output of 'quickdraft doctor --json'")
        plan, decided = plan_from_doctor(report, args.target, args.draft, args.num_speculative_tokens,
                                         f"quickdraft doctor, {path.name}")
    else:
        plan = default_plan(args.target, args.draft, args.num_speculative_tokens)
    export = WRITERS[args.to](plan)
    if args.json:
        json.dump({"engine": export.engine, "command": export.command, "settings": export.settings,
                   "plan": asdict(plan), "decided": decided, "lost": export.lost, "notes": export.notes},
                  sys.stdout, indent=2)
        print()
    else:
        print(format_export(export, plan, decided))
    return 0
