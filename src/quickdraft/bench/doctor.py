"""``quickdraft doctor TARGET DRAFT``: is this draft worth running with this target, and at which K?

It measures, on this machine and in this dtype:

1. **tokenizers**: identical vocabularies, or what differs (a verdict, not a crash);
2. **size**: the draft's parameters as a share of the target's (about 1/20 to 1/4 is usual);
3. **memory**: both models' weights and KV caches at ``--context`` tokens x ``--batch``;
4. **cost**: ``c``, the time of one draft step over one target step, and ``v_K``, the time of a
   target forward over K+1 new tokens (verification) over one of 1 token, with a KV cache
   holding a real prompt (median of ``--repeats``);
5. **acceptance** on a few prompts (HumanEval and MT-Bench by default): the target decodes
   greedily, then both models score that text (teacher forcing: the target in one forward, the
   draft a token at a time as generation feeds it). At
   temperature 0, ``a`` is the share of positions where the draft's argmax is the target's; at
   T > 0 it is the expected acceptance of speculative sampling, ``sum_x min(p(x), q(x))``, with
   p and q after temperature and top-p. Cost and acceptance take the draft as generation runs
   it: a draft with a vocabulary over 64k tokens computes logits for its most frequent tokens
   and the prompt's only (``quickdraft.drafters.vocabulary``);
6. **prediction**: ``(1 - a^(K+1)) / ((1 - a)(K c + v_K))`` for K = 1..8 and each temperature
   (with ``v_K = 1`` it is the textbook formula of Leviathan et al.), and the best K.

Exit status: 0 when the pair can speculate (even if it is predicted to be slow: that is a
warning), 1 when it cannot (tokenizers differ), 2 on errors (model not found, ...).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

from quickdraft.bench.measure import other_cpu
from quickdraft.bench.report import CONTENDED, expected_tokens_per_step
from quickdraft.config import SamplingParams
from quickdraft.drafters.draft_model import begin_draft_runner
from quickdraft.drafters.vocabulary import draft_vocabulary
from quickdraft.engine import SpeculativeDecoder, draft_vocabulary_size
from quickdraft.errors import TokenizerMismatchError
from quickdraft.memory import kv_bytes_per_token, weight_bytes
from quickdraft.models.base import LoadedModel
from quickdraft.models.tokenizers import check_tokenizers_compatible
from quickdraft.runner import ModelRunner
from quickdraft.sampling import logits_to_probs

USUAL_RATIO = (1 / 20, 1 / 4)
EXIT_OK, EXIT_INCOMPATIBLE = 0, 1


@dataclass(frozen=True)
class DoctorConfig:
    """What the doctor measures: see the module docstring."""

    context: int = 4096
    batch: int = 1
    max_new_tokens: int = 32
    temperatures: tuple[float, ...] = (0.0, 0.3, 0.7, 1.0)
    top_p: float = 1.0
    max_k: int = 8
    repeats: int = 5


@dataclass(frozen=True)
class DoctorPrompt:
    """A prompt as token ids, and the kind it is reported under (``code``, ``prose``)."""

    kind: str
    token_ids: tuple[int, ...]


def default_prompts(tokenizer) -> list[DoctorPrompt]:
    """Two HumanEval stubs and two MT-Bench requests (writing, roleplay), through the chat template."""
    from quickdraft.bench.workloads import load_category, prompt_ids

    chosen = [("code", p) for p in load_category("code", 2)] + [("prose", p) for p in load_category("mt_bench", 2)]
    return [DoctorPrompt(kind, tuple(prompt_ids(p, tokenizer, chat=True))) for kind, p in chosen]


# ---------------------------------------------------------------------------------------------
# Measurements


def _median_seconds(action, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _forward_seconds(model: LoadedModel, context: list[int], positions: list[int], repeats: int,
                     rows: torch.Tensor | None = None) -> dict[int, float]:
    """Median seconds of a forward over n new tokens, for each n in ``positions``, with a KV
    cache holding ``context``; the cache is cut back after each forward, so every repeat sees
    the same length. ``rows``: the token ids the output layer computes (None: all)."""
    runner = ModelRunner(model)
    runner.restrict_vocabulary(rows)
    runner.forward(context)
    seconds = {}
    for n in positions:
        tail = (context * n)[-n:]  # any n tokens: the cost does not depend on which

        def step():
            runner.forward(tail)
            runner.truncate(len(context))

        step()  # warm-up at this shape
        seconds[n] = _median_seconds(step, repeats)
    return seconds


def measure_costs(target: LoadedModel, draft: LoadedModel, context: list[int], max_k: int,
                  repeats: int, vocabulary_size: int | None = None) -> dict:
    """``c`` and ``v_K`` from forwards with a KV cache holding ``context`` (median of ``repeats``).

    The draft step is timed as the engine runs it: over its ``vocabulary_size`` most frequent
    tokens and the context's (``draft_vocabulary``), or over all of them for None.

    Returns ``{"target_step": s, "draft_step": s, "c": draft_step / target_step,
    "verify": {K: seconds of a K+1-token forward}, "v": {K: verify[K] / target_step}}``.
    """
    with torch.inference_mode(), other_cpu() as others:
        target_seconds = _forward_seconds(target, context, list(range(1, max_k + 2)), repeats)
        rows = draft_vocabulary(draft, vocabulary_size, context)
        draft_step = _forward_seconds(draft, context, [1], repeats, rows)[1]
    target_step = target_seconds[1]
    verify = {k: target_seconds[k + 1] for k in range(1, max_k + 1)}
    return {
        "context_tokens": len(context),
        "target_step": target_step,
        "draft_step": draft_step,
        "c": draft_step / target_step,
        "verify": verify,
        "v": {k: s / target_step for k, s in verify.items()},
        "other_cpu_cores": others["cores"],
    }


def _draft_logits(draft: LoadedModel, prompt: list[int], continuation: list[int],
                  vocabulary_size: int | None) -> torch.Tensor:
    """``[N, V]`` float32 draft logits predicting each of the N continuation tokens, read as
    generation reads them: the prompt in one forward, then a token at a time (an int8 draft
    quantizes each forward's activations with one scale, so scoring the whole text in one
    forward would understate it), over the draft's vocabulary (-inf elsewhere)."""
    runner = ModelRunner(draft)
    begin_draft_runner(runner, vocabulary_size, None, prompt)
    full = prompt + continuation
    return torch.cat([runner.forward([token]) for token in full[len(prompt) - 1:-1]]).float()


@torch.inference_mode()
def measure_acceptance(target: LoadedModel, draft: LoadedModel, prompts: list[DoctorPrompt],
                       config: DoctorConfig, vocabulary_size: int | None = None) -> dict:
    """Acceptance by temperature, teacher-forced on the target's own greedy continuation.

    The draft's distribution is the engine's: restricted to its ``vocabulary_size`` most
    frequent tokens and the prompt's (``draft_vocabulary``), or over all of them for None.

    Returns ``{"positions": {kind: n}, "by_temperature": {T: {kind: a, ..., "all": a}}}``.
    """
    plain = SpeculativeDecoder(target, None)
    sums: dict[float, dict[str, float]] = {t: {} for t in config.temperatures}
    counts: dict[str, int] = {}
    for prompt in prompts:
        ids = list(prompt.token_ids)
        out = plain.generate(ids, SamplingParams(max_new_tokens=config.max_new_tokens)).token_ids
        full = ids + out
        # Row i predicts out[i]: positions len(ids) - 1 ... len(full) - 2.
        feed = torch.tensor([full[:-1]], dtype=torch.long)
        p_logits = target.module(input_ids=feed.to(target.device), logits_to_keep=len(out)).logits[0].float()  # [N, V]
        q_logits = _draft_logits(draft, ids, out, vocabulary_size).to(p_logits.device)  # [N, V]
        counts[prompt.kind] = counts.get(prompt.kind, 0) + len(out)
        for t in config.temperatures:
            if t == 0:
                agree = (p_logits.argmax(-1) == q_logits.argmax(-1)).float()  # [N]
            else:
                params = SamplingParams(temperature=t, top_p=config.top_p)
                p, q = logits_to_probs(p_logits, params), logits_to_probs(q_logits, params)  # [N, V]
                agree = torch.minimum(p, q).sum(-1)  # [N]: P(accept) of speculative sampling
            sums[t][prompt.kind] = sums[t].get(prompt.kind, 0.0) + float(agree.sum())
    by_temperature = {}
    for t, by_kind in sums.items():
        row = {kind: total / counts[kind] for kind, total in by_kind.items()}
        row["all"] = sum(by_kind.values()) / sum(counts.values())
        by_temperature[t] = row
    return {"positions": counts, "by_temperature": by_temperature}


def predicted_speedup(a: float, k: int, c: float, v: float = 1.0) -> float:
    """``(1 - a^(K+1)) / ((1 - a)(K c + v))``: expected tokens per step over the step's cost."""
    return expected_tokens_per_step(a, k) / (k * c + v)


# ---------------------------------------------------------------------------------------------
# The diagnosis


def diagnose(target: LoadedModel, draft: LoadedModel, config: DoctorConfig = DoctorConfig(),
             prompts: list[DoctorPrompt] | None = None) -> dict:
    """Everything the doctor reports, as a JSON-ready dict (``verdicts``: (level, text) pairs)."""
    report: dict = {"target": target.name, "draft": draft.name, "dtype": target.precision,
                    "draft_dtype": draft.precision, "device": str(target.device), "config": asdict(config), "verdicts": []}
    verdicts = report["verdicts"]

    try:
        check_tokenizers_compatible(target, draft)
        size = len(target.tokenizer.get_vocab()) if target.tokenizer is not None else target.vocab_size
        report["tokenizers"] = {"compatible": True, "detail": f"identical vocabularies ({size:,} tokens)"}
    except TokenizerMismatchError as error:
        report["tokenizers"] = {"compatible": False, "detail": str(error)}
        verdicts.append(("error", "the tokenizers differ: this draft cannot speculate for this target "
                                  "(its token ids mean other tokens). Use a draft of the target's family, or "
                                  "prompt lookup, which needs no draft model (--draft ngram)."))

    n_target, n_draft = target.num_parameters(), draft.num_parameters()
    ratio = n_draft / n_target
    report["parameters"] = {"target": n_target, "draft": n_draft, "ratio": ratio}
    if ratio > USUAL_RATIO[1]:
        verdicts.append(("warning", f"the draft has {ratio:.2f} of the target's parameters (more than 1/4): "
                                    "each draft step costs a large share of a target step"))
    elif ratio < USUAL_RATIO[0]:
        verdicts.append(("warning", f"the draft has {ratio:.3f} of the target's parameters (less than 1/20): "
                                    "cheap, but expect low acceptance"))

    tokens = config.context * config.batch
    memory = {"target_weights": weight_bytes(target), "draft_weights": weight_bytes(draft),
              "target_kv": tokens * kv_bytes_per_token(target), "draft_kv": tokens * kv_bytes_per_token(draft),
              "context": config.context, "batch": config.batch}
    memory["total"] = memory["target_weights"] + memory["draft_weights"] + memory["target_kv"] + memory["draft_kv"]
    memory["draft_share"] = (memory["draft_weights"] + memory["draft_kv"]) / (memory["target_weights"] + memory["target_kv"])
    report["memory"] = memory

    if not report["tokenizers"]["compatible"]:
        report["usable"] = False
        return report
    report["usable"] = True

    prompts = prompts if prompts is not None else default_prompts(target.tokenizer)
    vocabulary_size = draft_vocabulary_size(draft)
    report["draft_vocabulary"] = vocabulary_size
    acceptance = measure_acceptance(target, draft, prompts, config, vocabulary_size)
    report["acceptance"] = acceptance
    context = list(prompts[0].token_ids)
    costs = measure_costs(target, draft, context, config.max_k, config.repeats, vocabulary_size)
    report["costs"] = costs
    if costs["other_cpu_cores"] is not None and costs["other_cpu_cores"] >= CONTENDED:
        verdicts.append(("warning", f"other processes used {costs['other_cpu_cores']:.1f} cores while the forwards "
                                    "were timed: c and v_K (and the predictions) are unreliable; rerun on a quiet machine"))

    predictions = {}
    for t, by_kind in acceptance["by_temperature"].items():
        for kind, a in by_kind.items():
            predictions[(t, kind)] = {k: predicted_speedup(a, k, costs["c"], costs["v"][k])
                                      for k in range(1, config.max_k + 1)}
    report["predictions"] = [{"temperature": t, "kind": kind, "speedup": speedups,
                              "best_k": max(speedups, key=speedups.get), "best": max(speedups.values())}
                             for (t, kind), speedups in predictions.items()]
    greedy = next(p for p in report["predictions"] if p["temperature"] == min(config.temperatures) and p["kind"] == "all")
    report["recommended_k"] = greedy["best_k"]
    report["recommended_speedup"] = greedy["best"]
    if greedy["best"] < 1.0:
        verdicts.append(("warning", f"speculation with this draft is predicted to be SLOWER than the target alone "
                                    f"(best {greedy['best']:.2f}x at K={greedy['best_k']}, T={greedy['temperature']:g}): "
                                    "use no draft, or prompt lookup (--draft ngram)"))
    else:
        verdicts.append(("ok", f"recommended K = {greedy['best_k']}: predicted {greedy['best']:.2f}x at "
                               f"T={greedy['temperature']:g} on these prompts"))
    for p in report["predictions"]:
        if p["kind"] != "all" and p["temperature"] == greedy["temperature"] and p["best"] < 1.0:
            verdicts.append(("warning", f"on {p['kind']} prompts it is predicted to be slower "
                                        f"(best {p['best']:.2f}x at K={p['best_k']})"))
    slow = [p for p in report["predictions"] if p["kind"] == "all" and p["best"] < 1.0 and p is not greedy]
    if slow and greedy["best"] >= 1.0:
        temps = ", ".join(f"{p['temperature']:g}" for p in slow)
        verdicts.append(("warning", f"predicted slower than the target alone at temperature {temps}"))
    return report


# ---------------------------------------------------------------------------------------------
# Output


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def format_report(report: dict) -> str:
    """The doctor's report as text for a terminal."""
    lines = [f"quickdraft doctor: target {report['target']} ({report['dtype']}), draft {report['draft']} "
             f"({report['draft_dtype']}), {report['device']}", ""]
    tok = report["tokenizers"]
    lines.append("Tokenizers   " + ("compatible: " + tok["detail"] if tok["compatible"]
                                    else "INCOMPATIBLE\n" + "\n".join("             " + l for l in tok["detail"].splitlines())))
    par = report["parameters"]
    lines.append(f"Parameters   target {par['target'] / 1e6:,.0f}M, draft {par['draft'] / 1e6:,.0f}M: "
                 f"the draft is {par['ratio']:.3f} of the target (usual: 0.05 to 0.25)")
    mem = report["memory"]
    lines.append(f"Memory       weights: target {_gib(mem['target_weights'])}, draft {_gib(mem['draft_weights'])}; "
                 f"KV cache at {mem['context']:,} tokens x batch {mem['batch']}: target {_gib(mem['target_kv'])}, "
                 f"draft {_gib(mem['draft_kv'])}")
    lines.append(f"             total {_gib(mem['total'])}; the draft adds {mem['draft_share']:.0%} to the target's memory")
    if report.get("costs"):
        cost = report["costs"]
        v = cost["v"]
        lines.append(f"Cost         with {cost['context_tokens']} tokens cached: target step "
                     f"{1000 * cost['target_step']:.0f} ms, draft step {1000 * cost['draft_step']:.0f} ms: "
                     f"c = {cost['c']:.2f}"
                     + ("" if cost.get("other_cpu_cores") is None
                        else f" (other processes used {cost['other_cpu_cores']:.1f} cores meanwhile)"))
        if report.get("draft_vocabulary") is not None:
            lines.append(f"             the draft computes logits for its {report['draft_vocabulary']:,} most frequent "
                         "tokens and the prompt's, as generation does (FR-Spec)")
        lines.append("             verifying K+1 tokens / 1 token (v_K): "
                     + ", ".join(f"K={k}: {v[k]:.2f}" for k in sorted(v)))
    if report.get("acceptance"):
        acc = report["acceptance"]
        positions = ", ".join(f"{n} {kind}" for kind, n in acc["positions"].items())
        lines.append(f"Acceptance   teacher-forced on the target's greedy output ({positions} positions);"
                     " T=0: argmax agreement, T>0: sum min(p, q)")
        for t, row in acc["by_temperature"].items():
            lines.append(f"             T={t:<4g} " + ", ".join(f"{kind} {a:.2f}" for kind, a in row.items()))
    if report.get("predictions"):
        ks = sorted(report["predictions"][0]["speedup"])
        lines.append("")
        lines.append("Predicted speedup  (1 - a^(K+1)) / ((1 - a)(K c + v_K))")
        lines.append("  T     prompts " + "".join(f"{'K=' + str(k):>7}" for k in ks) + "   best")
        for p in report["predictions"]:
            lines.append(f"  {p['temperature']:<5g} {p['kind']:<7} " + "".join(f"{p['speedup'][k]:>7.2f}" for k in ks)
                         + f"   K={p['best_k']} {p['best']:.2f}x")
    lines.append("")
    lines.append("Verdict")
    marks = {"ok": "  ok      ", "warning": "  WARNING ", "error": "  ERROR   "}
    for level, text in report["verdicts"]:
        lines.append(marks[level] + text)
    return "\n".join(lines)


def add_doctor_parser(subparsers: argparse._SubParsersAction) -> None:
    from quickdraft.cli import add_draft_quantization_argument

    parser = subparsers.add_parser(
        "doctor", help="check a target/draft pair: tokenizers, size, memory, cost, acceptance, best K",
        description=__doc__.split("\n\n")[0] + " Exit status: 0 usable pair, 1 tokenizers differ, 2 error.",
    )
    parser.add_argument("target", help="target model (demo name, folder, .gguf, cached hub id)")
    parser.add_argument("draft", help="draft model")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="default: bfloat16")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    add_draft_quantization_argument(parser)
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence for the KV memory (default: 4096)")
    parser.add_argument("--batch", type=int, default=1, help="sequences for the KV memory (default: 1)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per acceptance prompt (default: 32)")
    parser.add_argument("--temperatures", default="0,0.3,0.7,1.0", help="default: 0,0.3,0.7,1.0")
    parser.add_argument("--top-p", type=float, default=1.0, help="top-p for T > 0 (default: 1.0)")
    parser.add_argument("--max-k", type=int, default=8, help="largest K predicted (default: 8)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per forward, median (default: 5)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from quickdraft.cli import load_draft, resolve_device
    from quickdraft.models import load_model

    config = DoctorConfig(
        context=args.context, batch=args.batch, max_new_tokens=args.max_new_tokens,
        temperatures=tuple(float(t) for t in args.temperatures.split(",") if t.strip()),
        top_p=args.top_p, max_k=args.max_k, repeats=args.repeats,
    )
    device = resolve_device(args.device)
    print(f"loading {args.target} ({args.dtype}, {device})", file=sys.stderr)
    target = load_model(args.target, dtype=args.dtype, device=device)
    draft = load_draft(args, args.dtype, device)
    report = diagnose(target, draft, config)
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        print()
    else:
        print(format_report(report))
    return EXIT_OK if report["usable"] else EXIT_INCOMPATIBLE
