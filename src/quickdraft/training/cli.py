"""``quickdraft train-drafter``: parse, load the target, call ``train_drafter``, print."""

from __future__ import annotations

import argparse
import json
import sys

from quickdraft.cli_common import DEFAULT_TARGET
from quickdraft.training.data import BUNDLED, DEFAULT_SOURCES
from quickdraft.training.trainer import TrainConfig

_DEFAULTS = TrainConfig()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``train-drafter`` on the ``quickdraft`` command."""
    parser = subparsers.add_parser(
        "train-drafter", help="train an EAGLE or Medusa draft head for a target model",
        description="Collect the target's features over a corpus, train an EAGLE (or Medusa) head on them and "
                    "save it into --out, for --draft eagle:DIR (medusa:DIR). Rerun the same command to resume an "
                    "interrupted run. See docs/trained_drafters.md.",
    )
    parser.add_argument("--target", default=DEFAULT_TARGET, help=f"target model (default: {DEFAULT_TARGET})")
    parser.add_argument("--kind", default=_DEFAULTS.kind, choices=["eagle", "medusa"],
                        help="eagle: one decoder layer drafting token by token from the target's features; medusa: "
                             f"--heads residual blocks drafting all tokens from the last feature (default: {_DEFAULTS.kind})")
    parser.add_argument("--heads", type=int, default=_DEFAULTS.heads,
                        help=f"Medusa heads: the most tokens drafted a step (default: {_DEFAULTS.heads})")
    parser.add_argument("--data", default=",".join(DEFAULT_SOURCES),
                        help=f"comma-separated sources: {', '.join(BUNDLED)} (their training splits), "
                             "self:humaneval and self:spec-bench (the target's own replies to those training "
                             f"prompts), text or .jsonl files, folders (default: {','.join(DEFAULT_SOURCES)})")
    parser.add_argument("--out", required=True, help="folder for the checkpoint and the resumable work")
    parser.add_argument("--reply-prompts", type=int, default=40,
                        help="prompts each self: source asks the target to answer (default: 40)")
    parser.add_argument("--reply-tokens", type=int, default=128,
                        help="longest reply of a self: source, in tokens (default: 128)")
    parser.add_argument("--tokens", type=int, default=_DEFAULTS.tokens,
                        help=f"target tokens to collect features for (default: {_DEFAULTS.tokens})")
    parser.add_argument("--seq-len", type=int, default=_DEFAULTS.seq_len,
                        help=f"tokens per training chunk (default: {_DEFAULTS.seq_len})")
    parser.add_argument("--epochs", type=int, default=_DEFAULTS.epochs,
                        help=f"passes over the data; raise it when resuming to train further (default: {_DEFAULTS.epochs})")
    parser.add_argument("--batch-size", type=int, default=_DEFAULTS.batch_size,
                        help=f"chunks per optimizer step (default: {_DEFAULTS.batch_size})")
    parser.add_argument("--lr", type=float, default=_DEFAULTS.lr, help=f"learning rate (default: {_DEFAULTS.lr})")
    parser.add_argument("--intermediate-size", type=int, default=0,
                        help="width of the head's MLP, 0 = 4/3 of the target's hidden size or its own width if "
                             "narrower (2048 for the demo target)")
    parser.add_argument("--feature-weight", type=float, default=_DEFAULTS.feature_weight,
                        help="weight of EAGLE-1's feature-regression term beside the cross-entropy; 10 is "
                             f"EAGLE-1's loss (default: {_DEFAULTS.feature_weight})")
    parser.add_argument("--unroll", type=int, default=_DEFAULTS.unroll,
                        help="drafting steps trained per anchor: 1 = teacher forcing only; K > 1 also trains steps "
                             f"2..K on the head's own features, as it drafts them (default: {_DEFAULTS.unroll})")
    parser.add_argument("--anchors", type=int, default=_DEFAULTS.anchors or 0,
                        help="positions per chunk, drawn at random each step, that the unrolled steps or the Medusa "
                             f"heads are trained to draft from, 0 = every position (default: {_DEFAULTS.anchors or 0})")
    parser.add_argument("--vocabulary", type=int, default=_DEFAULTS.vocabulary_size,
                        help="most frequent token ids the loss covers and the head drafts over, 0 = all "
                             f"(default: {_DEFAULTS.vocabulary_size})")
    parser.add_argument("--seed", type=int, default=_DEFAULTS.seed, help=f"default: {_DEFAULTS.seed}")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="the target's dtype while collecting features (default: bfloat16; the head trains in float32)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run_train_drafter)


def run_train_drafter(args: argparse.Namespace) -> int:
    import torch

    from quickdraft.errors import QuickdraftError
    from quickdraft.models import load_model
    from quickdraft.models.loading import resolve_device
    from quickdraft.training import train_drafter
    from quickdraft.training.data import source_documents
    from quickdraft.training.replies import SELF_PREFIX, check_self_source, self_source

    config = TrainConfig(kind=args.kind, heads=args.heads, tokens=args.tokens, seq_len=args.seq_len, epochs=args.epochs, batch_size=args.batch_size,
                         lr=args.lr, feature_weight=args.feature_weight, unroll=args.unroll,
                         anchors=args.anchors or None,
                         intermediate_size=args.intermediate_size or None, vocabulary_size=args.vocabulary or None,
                         seed=args.seed)
    names = [name.strip() for name in args.data.split(",") if name.strip()]
    if not names:
        raise QuickdraftError("--data names no source")
    for name in names:
        if name.startswith(SELF_PREFIX):
            check_self_source(name, args.reply_prompts, args.reply_tokens)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    print(f"loading target {args.target} ({args.dtype}, {device})", file=sys.stderr)
    target = load_model(args.target, dtype=args.dtype, device=device)
    if target.tokenizer is None:
        raise QuickdraftError(f"{target.name} has no tokenizer: train from Python with token ids "
                              "(quickdraft.training.train_drafter)")
    sources = [self_source(name, target, args.out, args.reply_prompts, args.reply_tokens, not args.no_progress)
               if name.startswith(SELF_PREFIX) else source_documents(name, target.tokenizer) for name in names]
    record = train_drafter(target, sources, args.out, config, progress=not args.no_progress,
                           log=lambda message: print(message, file=sys.stderr), record={"sources": names})
    print(json.dumps(record["history"][-1] if record["history"] else record, indent=1))
    print(f"saved the head in {args.out}: use it with --draft {args.kind}:{args.out}", file=sys.stderr)
    return 0
