"""``quickdraft serve`` and ``quickdraft loadgen``: parse arguments, build, run."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from quickdraft.errors import QuickdraftError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``serve`` and ``loadgen`` on the ``quickdraft`` command."""
    from quickdraft.cli import add_model_arguments
    from quickdraft.server.loadgen import add_loadgen_parser

    parser = subparsers.add_parser(
        "serve", help="run an OpenAI-compatible HTTP server",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics. "
                    "One worker thread decodes one request at a time, in arrival order (see docs/server.md).",
    )
    add_model_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="default: 8000")
    parser.add_argument("--served-model-name", default=None,
                        help="the model id clients send and /v1/models lists (default: the --target value)")
    parser.add_argument("--max-queue", type=int, default=64,
                        help="requests that may wait for the decoder; one more gets HTTP 429 (default: 64)")
    parser.add_argument("--kv-cache-budget-mb", type=float, default=1024.0,
                        help="KV cache one request may need (target + draft, prompt + max_tokens), in MiB; "
                             "larger requests get HTTP 400 (default: 1024)")
    parser.add_argument("--max-body-bytes", type=int, default=2**20,
                        help="largest request body; larger ones get HTTP 413 (default: 1048576)")
    parser.add_argument("--default-max-tokens", type=int, default=256,
                        help="max_tokens of chat requests that give none (default: 256; completions: 16)")
    parser.add_argument("--api-key", default=os.environ.get("QUICKDRAFT_API_KEY"),
                        help="require 'Authorization: Bearer KEY' on every route but /health "
                             "(default: $QUICKDRAFT_API_KEY, else no key)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run_serve)
    add_loadgen_parser(subparsers)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from quickdraft.server.app import ServerConfig, create_app

    # Checked before loading gigabytes of weights.
    if args.num_speculative_tokens < 1:
        raise QuickdraftError(f"-k must be >= 1, got {args.num_speculative_tokens}")
    for name in ("max_queue", "max_body_bytes", "default_max_tokens"):
        if getattr(args, name) < 1:
            raise QuickdraftError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.kv_cache_budget_mb <= 0:
        raise QuickdraftError(f"--kv-cache-budget-mb must be > 0, got {args.kv_cache_budget_mb}")
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s",
                        stream=sys.stderr)
    from quickdraft.cli import build_decoder

    decoder = build_decoder(args)
    logging.getLogger("quickdraft.server").info(
        "speculation: %s, K = %d, policy %s", args.draft, args.num_speculative_tokens, type(decoder.policy).__name__)
    config = ServerConfig(
        model_name=args.served_model_name or args.target,
        max_queue=args.max_queue,
        kv_cache_budget_mb=args.kv_cache_budget_mb,
        max_body_bytes=args.max_body_bytes,
        api_key=args.api_key,
        default_max_tokens=args.default_max_tokens,
    )
    app = create_app(decoder, config)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
