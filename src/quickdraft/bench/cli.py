"""``quickdraft bench`` and ``quickdraft doctor``: parse, call the benchmark and the doctor, print."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from quickdraft.cli_common import comma_list

# Defaults of the full benchmark and of --quick (CI's smoke test: a 135M model drafting for
# itself, which exercises every method's code path in about a minute on 2 cores).
FULL = {
    "target": "qwen2.5-coder-1.5b-instruct", "draft": "qwen2.5-coder-0.5b-instruct",
    "prompts_per_category": 3, "max_new_tokens": 64,
    "k_sweep": "1,2,4,6,8", "k_sweep_categories": "code,summarization",
    "temperatures": "0,0.3,0.7,1.0", "top_p": "1.0", "temperature_categories": "code,qa",
    "sweep_prompts": 2, "check_prompts": 1, "check_max_new_tokens": 32,
}
QUICK = {
    "target": "smollm2-135m-instruct", "draft": "smollm2-135m-instruct",
    "prompts_per_category": 1, "max_new_tokens": 16,
    "k_sweep": "1,4", "k_sweep_categories": "code",
    "temperatures": "0,0.7", "top_p": "1.0", "temperature_categories": "code",
    "sweep_prompts": 1, "check_prompts": 1, "check_max_new_tokens": 16,
}


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip()) if text not in ("", "none") else ()


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip()) if text not in ("", "none") else ()


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bench``, ``doctor`` and ``export``."""
    from quickdraft.bench.export import add_export_parser

    _add_bench(subparsers)
    _add_doctor(subparsers)
    add_export_parser(subparsers)


def _add_bench(subparsers: argparse._SubParsersAction) -> None:
    from quickdraft.bench.endpoint import add_endpoint_arguments
    from quickdraft.bench.methods import DEFAULT_TREE_BUDGET
    from quickdraft.cli_common import add_model_arguments
    from quickdraft.tree import DEFAULT_BRANCH

    parser = subparsers.add_parser(
        "bench", help="benchmark speculative decoding against plain decoding and transformers",
        description=(
            "Compare quickdraft's plain decoding, draft-model and prompt-lookup speculation and "
            "transformers' generate() (alone, assisted, prompt lookup) on Spec-Bench and HumanEval "
            "prompts, after checking that their greedy outputs agree. Writes results.json, "
            "report.md and PNG plots into --output. See docs/bench.md."
        ),
    )
    add_model_arguments(parser, policy=False)
    # None = the full or --quick default (FULL / QUICK above).
    parser.set_defaults(target=None, draft=None)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test of a minute or two: smollm2-135m-instruct drafting for itself, "
                             "1 prompt per category, 16 tokens, small sweeps (explicit options still win)")
    parser.add_argument("--methods", default=None,
                        help="comma-separated methods (default: plain, default, draft, draft-adaptive, tree, eagle, "
                             "eagle-adaptive, eagle-tree (with --eagle), medusa, medusa-adaptive (with --medusa), ngram, "
                             "hf-plain, hf-assisted, hf-ngram; "
                             "'all' adds default-tree, ngram-adaptive and hf-assisted-k)")
    parser.add_argument("--no-peer", action="store_true", help="leave out the transformers methods")
    parser.add_argument("--peer", default="transformers", choices=["transformers", "llama.cpp", "both", "none"],
                        help="the other engines timed beside quickdraft: transformers' generate() (methods hf-*), "
                             "and/or llama.cpp plain decoding of the target's GGUF file (method llama.cpp-plain, "
                             "through llama-cpp-python in the interpreter --llama-python names; the target must "
                             "be a GGUF file or a demo model made from one) (default: transformers)")
    parser.add_argument("--llama-python", default=None, metavar="PYTHON",
                        help="the Python that has llama-cpp-python, for --peer llama.cpp (default: "
                             "$QUICKDRAFT_LLAMA_PYTHON, else this one)")
    parser.add_argument("--eagle", default=None, metavar="DIR",
                        help="also benchmark the EAGLE head trained for the target into DIR (methods 'eagle', "
                             "'eagle-adaptive' and 'eagle-tree'; see docs/trained_drafters.md)")
    parser.add_argument("--medusa", default=None, metavar="DIR",
                        help="also benchmark the Medusa heads trained for the target into DIR (methods 'medusa' "
                             "and 'medusa-adaptive')")
    parser.add_argument("--categories", default=None,
                        help="comma-separated: mt_bench, translation, summarization, qa, math_reasoning, rag, code "
                             "(or an MT-Bench kind such as writing), or code_edit (a whole function to return with "
                             "type hints); default: the first seven")
    parser.add_argument("--prompts", default=None, metavar="FILE.jsonl",
                        help="your own prompts, one JSON object a line: {\"prompt\": ..., \"category\": ...}")
    parser.add_argument("--prompts-per-category", type=int, default=None, help="default: 3 (quick: 1)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="tokens per run (default: 64, quick: 16)")
    parser.add_argument("--repeats", type=int, default=1, help="times each run is repeated, interleaved (default: 1)")
    parser.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                        help="wrap prompts in the tokenizer's chat template (default: on)")
    parser.add_argument("--k-sweep", default=None, help="K values of the K sweep (default: 1,2,4,6,8; '' skips)")
    parser.add_argument("--k-sweep-categories", default=None, help="default: code,summarization")
    parser.add_argument("--temperatures", default=None, help="temperature sweep (default: 0,0.3,0.7,1.0; '' skips)")
    parser.add_argument("--top-p", default=None, help="top-p values crossed with every temperature > 0 (default: 1.0)")
    parser.add_argument("--temperature-categories", default=None, help="default: code,qa")
    parser.add_argument("--sweep-prompts", type=int, default=None, help="prompts per category in each sweep (default: 2)")
    parser.add_argument("--sweep-methods", default="draft,tree,ngram",
                        help="methods swept (default: draft,tree,ngram)")
    parser.add_argument("--tree-budget", type=int, default=DEFAULT_TREE_BUDGET, metavar="N",
                        help=f"nodes of the tree methods' dynamic trees (default: {DEFAULT_TREE_BUDGET}; "
                             "quickdraft doctor predicts which pays)")
    parser.add_argument("--tree-branch", type=int, default=DEFAULT_BRANCH, metavar="B",
                        help=f"nodes expanded per depth and children per node in those trees (default: {DEFAULT_BRANCH})")
    parser.add_argument("--check-dtype", default="float32", choices=["float32", "bfloat16", "none"],
                        help="dtype of the greedy check run before the timed runs (default: float32)")
    parser.add_argument("--check-prompts", type=int, default=None, help="prompts per category in the check (default: 1)")
    parser.add_argument("--check-max-new-tokens", type=int, default=None, help="default: 32 (quick: 16)")
    parser.add_argument("--seed", type=int, default=0, help="base seed of the sampled runs (default: 0)")
    parser.add_argument("--quiet-wait", type=float, default=0.0, metavar="SECONDS",
                        help="before each timed run, wait up to SECONDS for other processes to leave the CPU "
                             "(shared machines; default: 0, no waiting; their load is reported either way)")
    parser.add_argument("--plain-formats", default="",
                        help="also time plain decoding of the target as float32, float32-packed, bfloat16 and/or bfloat16-packed "
                             "(comma-separated; methods plain-FORMAT), so that the baseline is the fastest plain "
                             "decoding on this machine whatever --dtype chose (default: none)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--output", default="bench-out", help="folder for results.json, report.md, plots")
    parser.add_argument("--report-from", default=None, metavar="RESULTS.json",
                        help="no runs: rebuild report.md and the plots from an earlier results.json")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_endpoint_arguments(parser)
    parser.set_defaults(func=run_bench)


def _resolve(args: argparse.Namespace) -> None:
    defaults = QUICK if args.quick else FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def bench_config(args: argparse.Namespace):
    """The ``BenchConfig`` the command line asks for."""
    from quickdraft.bench.runner import BenchConfig

    return BenchConfig(
        dtype=args.dtype, max_new_tokens=args.max_new_tokens, k=args.num_speculative_tokens,
        repeats=args.repeats, chat=args.chat,
        methods=comma_list(args.methods) if args.methods else None,
        peer=not args.no_peer and args.peer in ("transformers", "both"),
        llama_cpp=_llama_cpp_file(args) if args.peer in ("llama.cpp", "both") else None,
        llama_python=args.llama_python, threads=args.threads,
        k_sweep=_ints(args.k_sweep), k_sweep_categories=comma_list(args.k_sweep_categories),
        temperatures=_floats(args.temperatures), top_ps=_floats(args.top_p) or (1.0,),
        temperature_categories=comma_list(args.temperature_categories), sweep_prompts=args.sweep_prompts,
        sweep_methods=comma_list(args.sweep_methods),
        check_dtype=None if args.check_dtype == "none" else args.check_dtype,
        check_prompts=args.check_prompts, check_max_new_tokens=args.check_max_new_tokens, seed=args.seed,
        quiet_wait=args.quiet_wait, eagle=args.eagle, medusa=args.medusa,
        tree_budget=args.tree_budget, tree_branch=args.tree_branch, plain_formats=comma_list(args.plain_formats),
    )


def _llama_cpp_file(args: argparse.Namespace) -> str:
    """The GGUF file llama.cpp runs for --peer llama.cpp: --target's, or the demo target's."""
    from quickdraft.errors import InvalidParameterError
    from quickdraft.models.demo import DEMO_MODELS, demo_gguf_file

    if args.target in DEMO_MODELS:
        return str(demo_gguf_file(args.target))
    if str(args.target).lower().endswith(".gguf") and Path(args.target).is_file():
        return str(Path(args.target).resolve())
    raise InvalidParameterError(f"--peer llama.cpp runs a GGUF file: {args.target} is not one (nor a demo model)")


def write_outputs(results: dict, folder: Path) -> dict:
    """Summarise ``results`` and write results.json, report.md and the plots into ``folder``."""
    from quickdraft.bench.plots import write_plots
    from quickdraft.bench.report import markdown_report, summarize

    folder.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
    results["summary"] = summary
    (folder / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    plots = [p.name for p in write_plots(summary, folder)]
    (folder / "report.md").write_text(markdown_report(results, summary, plots), encoding="utf-8")
    return summary


def run_bench(args: argparse.Namespace) -> int:
    import torch
    import transformers

    from quickdraft.bench.measure import environment, load_average
    from quickdraft.bench.report import terminal_report
    from quickdraft.bench.runner import run_benchmark
    from quickdraft.bench.workloads import CATEGORIES, load_workload
    from quickdraft.cli_common import load_models, report_machine
    from quickdraft.models.loading import resolve_device

    folder = Path(args.output)
    if args.report_from:
        results = json.loads(Path(args.report_from).read_text(encoding="utf-8"))
        results.pop("summary", None)
        if results.get("kind") == "endpoint":  # written by bench --endpoint
            from quickdraft.bench.endpoint import rebuild_endpoint_report

            return rebuild_endpoint_report(results, folder)
        summary = write_outputs(results, folder)
        print(terminal_report(results, summary))
        print(f"\nwrote {folder}/report.md and plots", file=sys.stderr)
        return 0

    _resolve(args)
    if args.endpoint:
        from quickdraft.bench.endpoint import run_endpoint_bench

        return run_endpoint_bench(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.dtype == "auto":  # the results name the dtype it chose
        from quickdraft.models.loading import block_file

        # A target run from its GGUF blocks computes in float32, whatever the machine's dtype.
        machine = report_machine(device).dtype
        args.dtype = "float32" if block_file(args.target, args.quantization, "auto", device) else machine
    config = bench_config(args)
    transformers.logging.set_verbosity_error()  # generate()'s advice would bury the progress bar
    categories = comma_list(args.categories) if args.categories else CATEGORIES
    prompts = load_workload(categories, args.prompts_per_category, args.prompts)

    def load_pair(dtype: str, pack: bool | None, with_draft: bool):
        return load_models(args, device, dtype, pack, with_draft)

    env = environment(device)
    log = (lambda message: print(message, file=sys.stderr))
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / "results.partial.json"

    def checkpoint(data: dict) -> None:  # raw data so far, in case the run is interrupted
        partial.write_text(json.dumps({**data, "environment": env, "partial": True}), encoding="utf-8")

    results = run_benchmark(load_pair, prompts, config, progress=not args.no_progress, log=log,
                            checkpoint=checkpoint)
    results["environment"] = env
    if "bench" in sys.argv[1:2]:  # run from the command line (not through main(argv) in a test)
        results["command"] = "quickdraft " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    results["arguments"] = {k: v for k, v in vars(args).items() if k != "func"}
    results["load_average_end"] = load_average()
    summary = write_outputs(results, folder)
    partial.unlink(missing_ok=True)
    print(terminal_report(results, summary))
    print(f"\nwrote {folder}/results.json, report.md and plots", file=sys.stderr)
    return 0


def _add_doctor(subparsers: argparse._SubParsersAction) -> None:
    from quickdraft.bench.doctor import add_doctor_parser

    add_doctor_parser(subparsers)

