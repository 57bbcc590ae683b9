"""What the ``quickdraft`` subcommands share: model and sampling options, loading, the decoder.

The subcommands (cli.py's generate, server/cli.py, bench/cli.py, bench/doctor.py,
training/cli.py) import this module; none of them imports another's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from quickdraft.drafters.lookup_first import Lookup
from quickdraft.config import SamplingParams
from quickdraft.drafters.registry import DEFAULT_DRAFT_MODELS, default_draft, names_a_kind
from quickdraft.engine import DEFAULT_NUM_SPECULATIVE_TOKENS, SpeculativeDecoder
from quickdraft.errors import InvalidParameterError, QuickdraftError
from quickdraft.hardware import MachineConfig, detect_hardware, machine_config
from quickdraft.models import LoadedModel, load_model
from quickdraft.models.loading import resolve_device
from quickdraft.policy import FixedK
from quickdraft.tree import DEFAULT_BRANCH, TreeSpec

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"


def add_draft_quantization_argument(parser: argparse.ArgumentParser) -> None:
    """--draft-quantization, read by ``load_draft``."""
    parser.add_argument("--draft-quantization", default="auto", choices=["auto", "int4", "int8", "none"],
                        help="int4 / int8: the draft model's linear layers hold 4-bit weights (a scale per 64 "
                             "inputs, a compiled kernel; x86 with AVX2) or torch's dynamic int8 weights, its "
                             "embedding and output layer bfloat16 (float32 activations): a fraction of a bfloat16 "
                             "draft step on a CPU; the output stays exactly the target's. auto: int4 where its "
                             "kernel runs and the CPU computes in bfloat16 (AMX, AVX-512 BF16), else int8 on a CPU "
                             "that runs int8 layers, none on a GPU (default: auto)")


def add_quantization_argument(parser: argparse.ArgumentParser) -> None:
    """--quantization, the target's weights, read by ``load_target``."""
    parser.add_argument("--quantization", default="auto", choices=["auto", "int4", "int8", "none"],
                        help="the target's weights. auto / int4: a GGUF file of 4-bit (or 8-bit) blocks, or the "
                             "demo target, runs from its own blocks, the model llama.cpp runs (float32 "
                             "activations; docs/quantized.md); auto keeps any other model's stored weights, int4 "
                             "and int8 re-quantize them at load. none: dequantize a GGUF file (default: auto)")


def add_dtype_argument(parser: argparse.ArgumentParser) -> None:
    """--dtype, read by ``load_models``."""
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                        help="the target's dtype. auto: the fastest on this machine, from its processor's "
                             "instructions and a probe of a few seconds, cached (docs/hardware.md) (default: auto)")


def add_model_arguments(parser: argparse.ArgumentParser, policy: bool = True) -> None:
    """--target, --draft, -k, --dtype, --device: shared by every subcommand that decodes.

    ``policy`` adds --fixed-k and --prompt-lookup, which choose how one decoder drafts (the
    benchmark compares fixed sets of methods instead).
    """
    parser.add_argument("--target", default=DEFAULT_TARGET,
                        help="target model: demo name, model directory, .gguf file or cached hub id "
                             f"(default: {DEFAULT_TARGET})")
    parser.add_argument("--draft", default=None,
                        help="draft: a model (as for --target), 'ngram' for prompt lookup, 'eagle:DIR' or "
                             "'medusa:DIR' for a head trained for the target (quickdraft train-drafter), or 'none' "
                             "for plain decoding (default: the target's smaller sibling where one is known, as "
                             f"{DEFAULT_DRAFT_MODELS[DEFAULT_TARGET]} for {DEFAULT_TARGET}; else ngram)")
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=DEFAULT_NUM_SPECULATIVE_TOKENS,
                        help="most tokens drafted per step, K >= 1; each step drafts the 0..K with the "
                             f"best expected speed (default: {DEFAULT_NUM_SPECULATIVE_TOKENS})")
    add_dtype_argument(parser)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    add_quantization_argument(parser)
    add_draft_quantization_argument(parser)
    if policy:
        parser.add_argument("--fixed-k", action="store_true", help="always draft K tokens per step")
        parser.add_argument("--prompt-lookup", action=argparse.BooleanOptionalAction, default=None,
                            help="before the draft model or head, try prompt lookup: where the text's last "
                                 "n-gram occurred before, draft the K tokens that followed it, for free "
                                 "(default: on for a draft model or EAGLE head)")
        parser.add_argument("--tree", default=None, metavar="W1,W2,...",
                            help="draft a static tree: children per node at each depth, e.g. 3,2,2,1 "
                                 "(see docs/trees.md)")
        parser.add_argument("--tree-budget", type=int, default=None, metavar="N",
                            help="draft a dynamic tree of N nodes, -k deep (EAGLE-2 style)")
        parser.add_argument("--tree-branch", type=int, default=None, metavar="B",
                            help=f"with --tree-budget: nodes expanded per depth and children per node "
                                 f"(default: {DEFAULT_BRANCH}; quickdraft doctor predicts the best)")


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default: 1)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens, 0 = off (default: 0)")
    parser.add_argument("--seed", type=int, default=None, help="random seed for reproducible sampling")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="default: 128")
    parser.add_argument("--min-p", type=float, default=0.0, help="drop tokens under min_p x the top one (default: 0)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0,
                        help="transformers' penalty on prompt and output tokens, 1 = off (default: 1)")
    parser.add_argument("--presence-penalty", type=float, default=0.0, help="OpenAI's, in [-2, 2] (default: 0)")
    parser.add_argument("--frequency-penalty", type=float, default=0.0, help="OpenAI's, in [-2, 2] (default: 0)")
    parser.add_argument("--logit-bias", action="append", default=[], metavar="TOKEN_ID=BIAS",
                        help="add BIAS in [-100, 100] to a token's logit (repeatable)")
    parser.add_argument("--stop-token-id", action="append", type=int, default=[], metavar="ID",
                        help="token id that ends generation (repeatable)")
    parser.add_argument("--logprobs", type=int, default=None, metavar="N",
                        help="report each token's log-probability and the N most likely (0-20) in --json output")
    structured = parser.add_mutually_exclusive_group()
    structured.add_argument("--json-object", action="store_true", help="constrain the output to a JSON object")
    structured.add_argument("--json-schema", default=None, metavar="SCHEMA",
                            help="constrain the output to JSON valid under this schema (JSON text, or @FILE)")
    structured.add_argument("--regex", default=None, help="constrain the output to match this regular expression")
    structured.add_argument("--grammar", default=None, metavar="FILE", help="constrain the output to a Lark grammar file")


def sampling_params_from_args(args: argparse.Namespace) -> SamplingParams:
    """The generate command's sampling options as ``SamplingParams`` (raises on bad values)."""
    bias: dict[str, float] = {}
    for item in args.logit_bias:
        token, _, value = item.partition("=")
        try:
            bias[token] = float(value)
        except ValueError:
            raise InvalidParameterError(f"--logit-bias takes TOKEN_ID=BIAS, got {item!r}") from None
    response_format = {"type": "json_object"} if args.json_object else None
    try:
        if args.json_schema is not None:
            text = Path(args.json_schema[1:]).read_text() if args.json_schema.startswith("@") else args.json_schema
            response_format = {"type": "json_schema", "json_schema": {"name": "cli", "schema": json.loads(text)}}
        grammar = None if args.grammar is None else Path(args.grammar).read_text()
    except (OSError, json.JSONDecodeError) as error:
        raise InvalidParameterError(f"--json-schema / --grammar: {error}") from None
    return SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        max_new_tokens=args.max_new_tokens, seed=args.seed, stop=tuple(args.stop),
        stop_token_ids=tuple(args.stop_token_id), repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty, logit_bias=bias,
        logprobs=args.logprobs is not None, top_logprobs=args.logprobs or 0, response_format=response_format,
        regex=args.regex, grammar=grammar,
    )


def report_machine(device: str | torch.device) -> MachineConfig:
    """Print, once, what this machine is and what ``dtype="auto"`` chose on it and why."""
    config = machine_config(torch.device(device).type)
    print(f"machine: {detect_hardware().describe()}\nauto: {config.describe()}", file=sys.stderr)
    return config


def load_models(args: argparse.Namespace, device: str | torch.device, dtype: str | None = None,
                pack_weights: bool | None = None, with_draft: bool = True) -> tuple[LoadedModel, LoadedModel | None]:
    """The target of --target and the draft model of --draft (None where --draft names a kind of
    drafter, or without ``with_draft``), in ``dtype`` (default --dtype).

    The draft is loaded first: an int8 draft is read in float32 before its embedding and output
    layer are narrowed to bfloat16 (``quantize.hold_in_bfloat16``), and that float32 copy would
    otherwise sit next to the target's weights and raise the peak.
    """
    resolve_draft(args)
    draft = None
    if with_draft and not names_a_kind(args.draft):
        draft = load_draft(args, dtype or args.dtype, device, pack_weights)
    return load_target(args, device, dtype, pack_weights), draft


def resolve_draft(args: argparse.Namespace) -> None:
    """Set --draft to the registry's default for --target where it was not given, and say which."""
    if args.draft is None:
        args.draft, note = default_draft(args.target)
        print(note, file=sys.stderr)


def load_target(args: argparse.Namespace, device: str | torch.device, dtype: str | None = None,
                pack_weights: bool | None = None) -> LoadedModel:
    """The target model of --target in ``dtype`` (default --dtype; ``auto``: this machine's fastest),
    with the weights --quantization asks for (a 4-bit GGUF: its own blocks, float32 activations)."""
    dtype = dtype or args.dtype
    quantization = getattr(args, "quantization", "auto")
    print(f"loading target {args.target} ({dtype}, {quantization} weights, {device})", file=sys.stderr)
    return load_model(args.target, dtype=dtype, device=device, quantization=quantization, pack_weights=pack_weights)


def load_draft(args: argparse.Namespace, dtype: str, device: str | torch.device,
               pack_weights: bool | None = None) -> LoadedModel:
    """The draft model of --draft in ``dtype``, or with int4 or int8 layers as --draft-quantization
    says (``auto`` for either: what this machine's ``machine_config`` chose)."""
    config = machine_config(torch.device(device).type)
    quantization = config.draft_quantization if args.draft_quantization == "auto" else args.draft_quantization
    if quantization != "none":
        dtype = "float32"  # the activations of the quantized layers
    elif dtype == "auto":
        dtype = config.draft_dtype
    weights = "" if quantization == "none" else f" + {quantization} weights"
    print(f"loading draft {args.draft} ({dtype}{weights})", file=sys.stderr)
    return load_model(args.draft, dtype=dtype, device=device, quantization=quantization, pack_weights=pack_weights)


def build_decoder(args: argparse.Namespace, lookup: Lookup | None = None) -> SpeculativeDecoder:
    """Load the models named by ``add_model_arguments``' options and build a decoder (drafting
    the tree of --tree / --tree-budget if given; checked before any weights are loaded);
    ``lookup`` drafts the free copies in front of a draft model or head (``SpeculativeDecoder``)."""
    if args.num_speculative_tokens < 1:
        raise QuickdraftError(f"-k must be >= 1, got {args.num_speculative_tokens}")
    resolve_draft(args)
    tree = tree_from_args(args)
    device = resolve_device(args.device)
    report_machine(device)
    target, draft_model = load_models(args, device)
    draft: object = args.draft if draft_model is None else draft_model
    k = args.num_speculative_tokens if tree is None else tree.max_depth  # a tree's depth is its K
    return SpeculativeDecoder(target, draft, num_speculative_tokens=k, policy=FixedK(k) if args.fixed_k else None,
                              tree=tree, prompt_lookup=args.prompt_lookup, lookup=lookup)


def tree_from_args(args: argparse.Namespace) -> TreeSpec | None:
    """The TreeSpec of --tree / --tree-budget, or None for chain drafting."""
    if args.tree is not None and args.tree_budget is not None:
        raise QuickdraftError("give --tree or --tree-budget, not both")
    if (args.tree is not None or args.tree_budget is not None) and args.draft == "none":
        raise QuickdraftError("a tree needs a draft: a model, ngram or eagle:DIR, not --draft none")
    if args.tree is not None:
        try:
            widths = tuple(int(w) for w in args.tree.split(","))
        except ValueError:
            raise QuickdraftError(f"--tree takes comma-separated integers such as 3,2,2,1, got {args.tree!r}") from None
        return TreeSpec(widths=widths)
    if args.tree_branch is not None and args.tree_budget is None:
        raise QuickdraftError("--tree-branch shapes a dynamic tree: give --tree-budget N with it")
    if args.tree_budget is not None:
        branch = DEFAULT_BRANCH if args.tree_branch is None else args.tree_branch
        return TreeSpec(budget=args.tree_budget, depth=args.num_speculative_tokens, branch=branch)
    return None


def comma_list(text: str) -> tuple[str, ...]:
    """A comma-separated option's entries; ``""`` and ``"none"`` are none."""
    return tuple(x.strip() for x in text.split(",") if x.strip()) if text not in ("", "none") else ()
