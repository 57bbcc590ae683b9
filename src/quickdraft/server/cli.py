"""``quickdraft serve`` and ``quickdraft loadgen``: parse arguments, build, run."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from quickdraft.batch.limits import KByBatchSize
from quickdraft.cli_common import add_model_arguments, build_decoder
from quickdraft.drafters.suffix_cache import SuffixCacheStore, SuffixDrafter
from quickdraft.errors import InvalidParameterError, QuickdraftError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``serve`` and ``loadgen`` on the ``quickdraft`` command."""
    from quickdraft.server.loadgen import add_loadgen_parser

    parser = subparsers.add_parser(
        "serve", help="run an OpenAI-compatible HTTP server",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics. "
                    "Requests are decoded together by continuous batching, or one at a time with --scheduler "
                    "sequential (see docs/server.md).",
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
    batching = parser.add_argument_group("batching (docs/batching.md)")
    batching.add_argument("--scheduler", choices=["batch", "sequential"], default="batch",
                          help="batch: requests join and leave one batch between decoding steps; sequential: one "
                               "request at a time, in arrival order (default: batch; trees and trained heads are "
                               "always served one at a time)")
    batching.add_argument("--max-batch-size", metavar="N", type=int, default=32,
                          help="the most requests decoded together (default: 32)")
    batching.add_argument("--num-speculative-tokens-per-batch-size", metavar="RANGES", type=_k_by_batch_size,
                          default=None,
                          help="the most tokens a request drafts per step by the number of running requests, as "
                               "FIRST-LAST:K ranges joined by commas, the last open-ended (e.g. 1-8:5,9-16:1,17-:0; "
                               "K 0: no speculation there, not even a probe); sizes no range covers keep -k. "
                               "Default: -k at every size, the goodput policy choosing below it (docs/batching.md)")
    batching.add_argument("--batch-kv-cache-mb", metavar="MIB", type=float, default=4096.0,
                          help="KV cache all running requests may reserve together (target + draft, prompt + "
                               "max_tokens each); requests beyond it wait in the queue (default: 4096)")
    parser.add_argument("--max-body-bytes", type=int, default=2**20,
                        help="largest request body; larger ones get HTTP 413 (default: 1048576)")
    parser.add_argument("--default-max-tokens", type=int, default=256,
                        help="max_tokens of chat requests that give none (default: 256; completions: 16)")
    parser.add_argument("--api-key", default=os.environ.get("QUICKDRAFT_API_KEY"),
                        help="require 'Authorization: Bearer KEY' on every route but /health; several keys "
                             "separated by commas (default: $QUICKDRAFT_API_KEY, else no key)")
    suffix = parser.add_argument_group("suffix cache: drafts from earlier requests (docs/drafters.md)")
    suffix.add_argument("--suffix-cache-mb", metavar="MIB", type=float, default=256.0,
                        help="memory for the recent requests' tokens the server drafts from, in front of a "
                             "draft model or head (prompt lookup included) and for --draft suffix; the oldest "
                             "go first; 0: prompt lookup alone in front (default: 256)")
    suffix.add_argument("--suffix-cache-scope", choices=["server", "key"], default="server",
                        help="server: every request drafts from every earlier one; key: only from those sent "
                             "with the same API key (tenants share nothing, not even timing) (default: server)")
    limits = parser.add_argument_group("limits against slow, stuck or hostile clients (docs/server.md)")
    limits.add_argument("--max-prompt-tokens", metavar="N", type=int, default=4096,
                        help="longest prompt, in tokens; longer ones get HTTP 400 (default: 4096)")
    limits.add_argument("--prefill-chunk-tokens", metavar="N", type=int, default=512,
                        help="feed prompts to the model this many tokens at a time; a request whose client "
                             "leaves stops after the current chunk (default: 512)")
    limits.add_argument("--header-timeout", metavar="SECONDS", type=float, default=10.0,
                        help="seconds a connection has to send a request's headers; closed after (default: 10)")
    limits.add_argument("--body-timeout", metavar="SECONDS", type=float, default=30.0,
                        help="seconds a client has to send its whole request body; HTTP 408 after (default: 30)")
    limits.add_argument("--keep-alive-timeout", metavar="SECONDS", type=float, default=5.0,
                        help="seconds an idle kept-alive connection stays open (default: 5)")
    limits.add_argument("--max-connections", metavar="N", type=int, default=256,
                        help="open connections served at once; requests on more get HTTP 503 (default: 256)")
    limits.add_argument("--shutdown-timeout", metavar="SECONDS", type=float, default=30.0,
                        help="on SIGTERM/SIGINT, seconds the queued and running requests get to finish while new "
                             "ones get HTTP 503; what is left then ends with a 503 (default: 30)")
    browser = parser.add_argument_group("browser safety (docs/server.md)")
    browser.add_argument("--allowed-hosts", metavar="HOSTS", type=_names, default=None,
                         help="comma-separated host names the Host header may carry, '*' for any; others get "
                              "HTTP 421 (default: the --host address, localhost, 127.0.0.1, [::1])")
    browser.add_argument("--cors-origins", metavar="ORIGINS", type=_names, default=(),
                         help="comma-separated web origins (https://app.example) whose pages may call the "
                              "server, '*' for any (default: none)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run_serve)
    add_loadgen_parser(subparsers)


def _k_by_batch_size(value: str) -> KByBatchSize:
    """--num-speculative-tokens-per-batch-size, parsed (argparse reports the error)."""
    try:
        return KByBatchSize.parse(value)
    except InvalidParameterError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _names(value: str) -> tuple[str, ...]:
    """A comma-separated option as a tuple of its non-empty entries."""
    return tuple(name.strip() for name in value.split(",") if name.strip())


def _check_options(args: argparse.Namespace) -> None:
    """Refuse bad options before loading gigabytes of weights."""
    if args.num_speculative_tokens < 1:
        raise QuickdraftError(f"-k must be >= 1, got {args.num_speculative_tokens}")
    for name in ("max_queue", "max_batch_size", "max_body_bytes", "default_max_tokens", "max_prompt_tokens", "prefill_chunk_tokens",
                 "max_connections"):
        if getattr(args, name) < 1:
            raise QuickdraftError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.batch_kv_cache_mb < args.kv_cache_budget_mb:
        raise QuickdraftError(f"--batch-kv-cache-mb ({args.batch_kv_cache_mb:g}) must be at least --kv-cache-budget-mb "
                              f"({args.kv_cache_budget_mb:g}): a request the server takes must fit the batch alone")
    for name in ("kv_cache_budget_mb", "header_timeout", "body_timeout", "keep_alive_timeout"):
        if getattr(args, name) <= 0:
            raise QuickdraftError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.shutdown_timeout < 0:
        raise QuickdraftError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
    if args.suffix_cache_mb < 0:
        raise QuickdraftError(f"--suffix-cache-mb must be >= 0, got {args.suffix_cache_mb:g}")
    if args.draft == "suffix" and args.suffix_cache_mb == 0:
        raise QuickdraftError("--draft suffix drafts from the suffix cache: give --suffix-cache-mb above 0")
    if args.suffix_cache_scope == "key" and args.scheduler != "batch":
        raise QuickdraftError("--suffix-cache-scope key keeps each key's requests apart in the batched engine: "
                              "use --scheduler batch")
    if args.num_speculative_tokens_per_batch_size is not None and args.scheduler != "batch":
        raise QuickdraftError("--num-speculative-tokens-per-batch-size sets K by the size of a batch: "
                              "drop it, or use --scheduler batch")


def _warn_if_exposed(args: argparse.Namespace, allowed_hosts: tuple[str, ...]) -> None:
    """Say what is missing when the server listens beyond this machine."""
    from quickdraft.server.app import LOCAL_HOSTS

    if args.host in LOCAL_HOSTS:
        return
    log = logging.getLogger("quickdraft.server")
    if args.api_key is None:
        log.warning("listening on %s without an API key: anyone who can reach the port can use the server "
                    "(set --api-key or $QUICKDRAFT_API_KEY)", args.host)
    if args.allowed_hosts is None:
        log.warning("only requests whose Host header is one of %s are answered: add the names and addresses "
                    "clients use with --allowed-hosts", ", ".join(allowed_hosts))


def run_serve(args: argparse.Namespace) -> int:
    from quickdraft.server.app import LOCAL_HOSTS, ServerConfig, create_app
    from quickdraft.server.http import HTTPLimits, make_server

    _check_options(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s",
                        stream=sys.stderr)
    allowed_hosts = args.allowed_hosts or (args.host, *LOCAL_HOSTS)
    _warn_if_exposed(args, allowed_hosts)
    lookup = None
    if args.draft == "suffix":
        args.draft = f"suffix:{args.suffix_cache_mb:g}"  # the registry's kind, over a store of this size
    elif args.suffix_cache_mb > 0:
        lookup = SuffixDrafter(SuffixCacheStore(int(args.suffix_cache_mb * (1 << 20))))
    decoder = build_decoder(args, lookup)
    logging.getLogger("quickdraft.server").info(
        "speculation: %s, K = %d, policy %s", args.draft, args.num_speculative_tokens, type(decoder.policy).__name__)
    config = ServerConfig(
        model_name=args.served_model_name or args.target,
        max_queue=args.max_queue,
        kv_cache_budget_mb=args.kv_cache_budget_mb,
        max_body_bytes=args.max_body_bytes,
        api_key=args.api_key,
        default_max_tokens=args.default_max_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        prefill_chunk_tokens=args.prefill_chunk_tokens,
        body_timeout=args.body_timeout,
        allowed_hosts=allowed_hosts,
        cors_origins=args.cors_origins,
        scheduler=args.scheduler,
        max_batch_size=args.max_batch_size,
        batch_kv_cache_mb=args.batch_kv_cache_mb,
        k_by_batch_size=args.num_speculative_tokens_per_batch_size,
        suffix_cache_scope=args.suffix_cache_scope,
    )
    limits = HTTPLimits(header_timeout=args.header_timeout, keep_alive_timeout=args.keep_alive_timeout,
                        max_connections=args.max_connections, shutdown_timeout=args.shutdown_timeout)
    make_server(create_app(decoder, config), limits, args.host, args.port, args.log_level).run()
    return 0
