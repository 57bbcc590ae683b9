"""The ``quickdraft`` command: parses arguments, calls the library, prints.

Subcommands live in their own modules (``add_parser``); what they share is in
``quickdraft.cli_common``. This module holds ``generate``, dispatches and reports a
``QuickdraftError``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from quickdraft.bench.cli import add_parsers as add_bench_parsers
from quickdraft.cli_common import add_model_arguments, add_sampling_arguments, build_decoder, sampling_params_from_args
from quickdraft.errors import QuickdraftError
from quickdraft.prompts import chat_prompt_ids
from quickdraft.server.cli import add_parser as add_server_parsers
from quickdraft.training.cli import add_parser as add_training_parser

GREEN, DIM, RESET = "\033[32m", "\033[2m", "\033[0m"


def _add_generate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate", help="generate a continuation with speculative decoding",
        description="Stream a continuation of --prompt and print one line of statistics.",
    )
    parser.add_argument("--prompt", required=True, help="prompt text, or - to read it from stdin")
    add_model_arguments(parser)
    add_sampling_arguments(parser)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    parser.add_argument("--trace", action="store_true",
                        help="mark tokens: accepted drafts in green, target tokens dimmed "
                             "(without a terminal: target tokens in [brackets])")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    parser.set_defaults(func=_run_generate)


def _run_generate(args: argparse.Namespace) -> int:
    params = sampling_params_from_args(args)
    decoder = build_decoder(args)  # checks -k and the tree before loading weights
    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    prompt: str | list[int] = chat_prompt_ids(decoder.target.tokenizer, [{"role": "user", "content": text}]) if args.chat else text
    tokenizer = decoder.target.tokenizer
    trace: list[dict] = []
    colour = sys.stdout.isatty()
    pieces: list[str] = []
    logprobs: list[dict] = []
    for chunk in decoder.stream(prompt, params):
        logprobs.extend({"token_id": e.token_id, "logprob": e.logprob, "top": [list(t) for t in e.top]}
                        for e in chunk.logprobs or [])
        if args.trace or args.json:
            for i, token in enumerate(chunk.token_ids):
                piece = tokenizer.decode([token]) if tokenizer is not None else f" {token}"
                source = "draft" if i < chunk.from_draft else "target"
                trace.append({"token_id": token, "text": piece, "source": source})
                if args.trace and not args.json:
                    if colour:
                        print((GREEN if source == "draft" else DIM) + piece + RESET, end="", flush=True)
                    else:
                        print(piece if source == "draft" else f"[{piece}]", end="", flush=True)
        elif not args.json:
            print(chunk.text, end="", flush=True)
        pieces.append(chunk.text)
    stats = chunk.stats
    if args.json:
        json.dump({"text": "".join(pieces), "token_ids": [t["token_id"] for t in trace],
                   "finish_reason": chunk.finish_reason, "trace": trace,
                   **({"logprobs": logprobs} if params.logprobs else {}),
                   "stats": stats.to_dict()}, sys.stdout, indent=2)
    print()
    print(stats.summary(), file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quickdraft",
        description="Lossless speculative decoding: faster generation, same output distribution.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_generate(subparsers)
    add_server_parsers(subparsers)
    add_bench_parsers(subparsers)
    add_training_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except QuickdraftError as error:
        print(f"quickdraft: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
