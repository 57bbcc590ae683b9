"""``quickdraft doctor TARGET DRAFT``: is this draft worth running with this target, and at which K?

It measures, on this machine and in this dtype:

1. **tokenizers**: identical vocabularies; or different ones and how many tokens they share (the
   draft then proposes only those: docs/cross_tokenizer.md; acceptance and cost are measured as
   generation runs it, and trees are not predicted: such a draft drafts chains); or too few
   shared (a verdict, not a crash);
2. **size**: the draft's parameters as a share of the target's (about 1/20 to 1/4 is usual);
3. **memory**: both models' weights and KV caches at ``--context`` tokens x ``--batch``;
4. **cost**: ``c``, the time of one draft step over one target step, and ``v_K``, the time of a
   target forward over K+1 new tokens (verification) over one of 1 token, with a KV cache
   holding a real prompt (median of ``--repeats``);
5. **acceptance** on a few prompts (HumanEval and Spec-Bench by default): the target decodes
   greedily, then both models score that text (teacher forcing: the target in one forward, the
   draft a token at a time as generation feeds it). At
   temperature 0, ``a`` is the share of positions where the draft's argmax is the target's; at
   T > 0 it is the expected acceptance of speculative sampling, ``sum_x min(p(x), q(x))``, with
   p and q after temperature and top-p. Cost and acceptance take the draft as generation runs
   it: a draft with a vocabulary over 64k tokens computes logits for its most frequent tokens
   and the prompt's only (``quickdraft.drafters.vocabulary``);
6. **prediction**: ``(1 - a^(K+1)) / ((1 - a)(K c + v_K))`` for K = 1..8 and each temperature
   (with ``v_K = 1`` it is the textbook formula of Leviathan et al.), and the best K;
7. **trees**: the cost of verifying a tree of up to 31 nodes and of a draft forward over a
   level of nodes (both with the tree mask), how often the target takes the draft's r-th most
   probable token, and from these the best dynamic tree's predicted speedup against the best
   chain's (``quickdraft.bench.tree_plan``), here and where width would cost nothing.

Exit status: 0 when the pair can speculate (even if it is predicted to be slow: that is a
warning), 1 when it cannot (too few tokens shared), 2 on errors (model not found, ...).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from quickdraft.allocator import give_back_memory
from quickdraft.bench.measure import other_cpu, peak_rss_bytes, reset_peak_rss, rss_bytes
from quickdraft.bench.report import CONTENDED
from quickdraft.bench.tree_plan import CostCurve, best_plans
from quickdraft.config import SamplingParams
from quickdraft.drafters.cross_tokenizer import CrossTokenizerDrafter
from quickdraft.drafters.draft_model import reset_draft_runner
from quickdraft.drafters.dynamic_tree import draft_scores
from quickdraft.drafters.registry import draft_vocabulary_size
from quickdraft.drafters.vocabulary import draft_vocabulary
from quickdraft.engine import SpeculativeDecoder
from quickdraft.errors import InvalidParameterError, TokenizerMismatchError
from quickdraft.hardware import detect_hardware, draft_format, machine_config
from quickdraft.memory import kv_bytes_per_token, weight_bytes
from quickdraft.models.base import LoadedModel
from quickdraft.models.tokenizers import shares_token_ids
from quickdraft.costs import expected_tokens
from quickdraft.runner import ModelRunner
from quickdraft.sampling import logits_to_probs
from quickdraft.tree import DEFAULT_BRANCH

USUAL_RATIO = (1 / 20, 1 / 4)
EXIT_OK, EXIT_INCOMPATIBLE = 0, 1
# Target, draft and caches are expected to fit in this many times the target's weights.
MEMORY_LIMIT = 1.5
# A tree predicted to beat the best chain by less than this is reported as not paying: the
# prediction is a static estimate, and a tree adds bookkeeping a chain does not.
TREE_MARGIN = 0.05


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
    tree_positions: tuple[int, ...] = (12, 16, 24, 32)  # verification sizes timed beyond max_k + 1
    level_nodes: tuple[int, ...] = (2, 4, 8)  # draft level sizes timed
    max_branch: int = DEFAULT_BRANCH
    ranks: int = 8  # draft ranks whose hits are measured
    # Seconds the acceptance prompts and the timings may each take, roughly: where steps are
    # slow, fewer prompts (at least one of each kind) and fewer repeats (at least 2) are run.
    time_budget: float = 120.0


@dataclass(frozen=True)
class DoctorPrompt:
    """A prompt as token ids, and the kind it is reported under (``code``, ``prose``)."""

    kind: str
    token_ids: tuple[int, ...]


def default_prompts(tokenizer, max_tokens: int) -> list[DoctorPrompt]:
    """Through the chat template: two HumanEval stubs (code); two MT-Bench requests (writing,
    roleplay) and the first question of each other Spec-Bench category (prose: translation,
    summarization, QA, math, retrieval), so that "prose" is not one kind of text. Prompts
    longer than ``max_tokens`` (a short context window) are left out."""
    from quickdraft.bench.workloads import SPEC_BENCH_SINGLE_TURN, load_category, prompt_ids

    prose = load_category("mt_bench", 2) + [p for c in SPEC_BENCH_SINGLE_TURN for p in load_category(c, 1)]
    chosen = [("code", p) for p in load_category("code", 2)] + [("prose", p) for p in prose]
    prompts = [DoctorPrompt(kind, tuple(prompt_ids(p, tokenizer, chat=True))) for kind, p in chosen]
    return [p for p in prompts if len(p.token_ids) <= max_tokens]


# ---------------------------------------------------------------------------------------------
# Measurements


def _forward_seconds(model: LoadedModel, context: list[int], chain: list[int], tree: list[int], repeats: int,
                     rows: torch.Tensor | None = None, verify: bool = True, budget: float | None = None,
                     log: Callable[[str], None] = lambda message: None) -> tuple[dict[int, float], dict[int, float]]:
    """Median seconds of forwards with a KV cache holding ``context``, cut back after each.

    For each n in ``chain``, a forward over n new tokens; for each n in ``tree``, a tree forward
    over n positions: the root and n - 1 nodes below it (``verify``: what the target checks), or
    n nodes below the cached sequence (``verify=False``: one level of a draft's tree). The tree is
    flat; its mask costs what any tree's of that size does. The shapes take turns within each
    of ``repeats`` rounds, after a round that warms each one up, so that the machine's drift
    hits every shape alike. ``rows``: the token ids the output layer computes (None: all).
    ``budget``: seconds the timed rounds may take, judged from the warm-up round (at least 2
    rounds are timed); ``log`` hears of each round.

    Returns the medians for ``chain`` and for ``tree``, by n.
    """
    runner = ModelRunner(model)
    runner.restrict_vocabulary(rows)
    runner.forward(context)
    any_tokens = [context[i % len(context)] for i in range(max(chain + tree, default=0))]  # costs do not depend on which
    root = context + context[-1:] if verify else context
    forwards = {("chain", n): (lambda n=n: runner.forward(any_tokens[:n])) for n in chain}
    for n in tree:
        nodes = any_tokens[: n - 1 if verify else n]
        forwards[("tree", n)] = lambda n=n, nodes=nodes: runner.forward_tree(root, nodes, [-1] * len(nodes), num_logits=n)
    times: dict[tuple[str, int], list[float]] = {key: [] for key in forwards}
    rounds, round_ = repeats, 0
    while round_ <= rounds:
        started = time.perf_counter()
        for key, forward in forwards.items():
            start = time.perf_counter()
            forward()
            if round_:  # round 0 is the warm-up
                times[key].append(time.perf_counter() - start)
            runner.truncate(len(context))
        if round_ == 0 and budget is not None:
            rounds = max(2, min(repeats, int(budget / (time.perf_counter() - started))))
        log(f"{model.name}: {'warm-up' if round_ == 0 else f'round {round_}/{rounds}'} "
            f"({time.perf_counter() - started:.1f} s)")
        round_ += 1
    medians = {key: statistics.median(t) for key, t in times.items()}
    return ({n: medians[("chain", n)] for n in chain}, {n: medians[("tree", n)] for n in tree})


def measure_costs(target: LoadedModel, draft: LoadedModel, context: list[int], max_k: int,
                  repeats: int, vocabulary_size: int | None = None,
                  tree_positions: tuple[int, ...] = (), level_nodes: tuple[int, ...] = (),
                  budget: float | None = None, log: Callable[[str], None] = lambda message: None,
                  cross: CrossTokenizerDrafter | None = None) -> dict:
    """``c`` and ``v_K`` from forwards with a KV cache holding ``context`` (median of ``repeats``),
    and the costs a tree adds: verification over ``tree_positions`` and draft levels of
    ``level_nodes`` nodes, both through the tree mask.

    The draft is timed as the engine runs it: over its ``vocabulary_size`` most frequent
    tokens and the context's (``draft_vocabulary``), or over all of them for None; a draft with
    another tokenizer (``cross``) reads the context's text in its own tokens and computes the
    rows it proposes from (``CrossTokenizerDrafter.rows``). ``budget``:
    seconds for all the timings, roughly (three quarters for the target's).

    Returns ``{"target_step": s, "draft_step": s, "c": draft_step / target_step,
    "verify": {K: seconds of a K+1-token forward}, "v": {K: verify[K] / target_step},
    "tree_verify": {n: seconds of a tree forward over n positions}, "draft_level": {m: seconds
    of a draft forward over m nodes} (m = 1: the draft step)}``.
    """
    with torch.inference_mode(), other_cpu() as others:
        target_seconds, tree_verify = _forward_seconds(
            target, context, list(range(1, max_k + 2)), [n for n in tree_positions if n > max_k + 1], repeats,
            budget=None if budget is None else 0.75 * budget, log=log)
        if cross is None:
            draft_context, rows = context, draft_vocabulary(draft, vocabulary_size, context)
        else:
            cross.begin(context)
            draft_context, rows = cross.context(context), cross.rows
        draft_seconds, levels = _forward_seconds(draft, draft_context, [1], [m for m in level_nodes if m > 1], repeats,
                                                 rows, verify=False, budget=None if budget is None else 0.25 * budget,
                                                 log=log)
    draft_step = draft_seconds[1]
    target_step = target_seconds[1]
    verify = {k: target_seconds[k + 1] for k in range(1, max_k + 1)}
    return {
        "context_tokens": len(context),
        "target_step": target_step,
        "draft_step": draft_step,
        "c": draft_step / target_step,
        "verify": verify,
        "v": {k: s / target_step for k, s in verify.items()},
        "tree_verify": tree_verify,
        "draft_level": {1: draft_step, **levels},
        "other_cpu_cores": others["cores"],
    }


def cost_curves(costs: dict) -> tuple[CostCurve, CostCurve]:
    """The target's forward over n positions and the draft's over m nodes, from ``measure_costs``,
    fitted non-decreasing (``CostCurve.monotone``)."""
    verify = CostCurve.monotone([(1, costs["target_step"]), *((k + 1, s) for k, s in costs["verify"].items()),
                                 *costs["tree_verify"].items()])
    return verify, CostCurve.monotone(list(costs["draft_level"].items()))


def _draft_logits(draft: LoadedModel, prompt: list[int], continuation: list[int],
                  vocabulary_size: int | None) -> torch.Tensor:
    """``[N, V]`` float32 draft logits predicting each of the N continuation tokens, read as
    generation reads them: the prompt in one forward, then a token at a time (an int8 draft
    quantizes each forward's activations with one scale, so scoring the whole text in one
    forward would understate it), over the draft's vocabulary (-inf elsewhere)."""
    runner = ModelRunner(draft)
    reset_draft_runner(runner, vocabulary_size, None, prompt)
    if len(prompt) > 1:
        runner.forward(prompt[:-1])
    full = prompt + continuation
    return torch.cat([runner.forward([token]) for token in full[len(prompt) - 1:-1]]).float()


@torch.inference_mode()
def measure_acceptance(target: LoadedModel, draft: LoadedModel, prompts: list[DoctorPrompt],
                       config: DoctorConfig, vocabulary_size: int | None = None,
                       log: Callable[[str], None] = lambda message: None,
                       cross: CrossTokenizerDrafter | None = None) -> dict:
    """Acceptance by temperature, teacher-forced on the target's own greedy continuation.

    The draft's distribution is the engine's: restricted to its ``vocabulary_size`` most
    frequent tokens and the prompt's (``draft_vocabulary``), or over all of them for None. A draft
    with another tokenizer (``cross``) reads each prefix's text in its own tokens, and its q is
    over the tokens it shares with the target (``CrossTokenizerDrafter.next_logits``).

    Also the **rank hits** a tree is predicted from (``tree_plan``): ``h_r``, the mean over
    positions of ``p(x_r)``, with ``x_r`` the draft's r-th most probable token (ranked as a
    tree's children are, ``draft_scores``) and ``p`` the target's distribution after the sampling
    parameters (at T = 0: 1 where ``x_r`` is the target's argmax).

    The prompts are taken in turn by kind (code, prose, code, ...) until ``config.time_budget``
    is spent, once every kind has one.

    Returns ``{"positions": {kind: n}, "by_temperature": {T: {kind: a, ..., "all": a}},
    "rank_hits": {T: {kind: [h_1, ..., h_R], ..., "all": [...]}}, "prompts": n}`` with
    R = ``config.ranks``.
    """
    plain = SpeculativeDecoder(target, None)
    sums: dict[float, dict[str, float]] = {t: {} for t in config.temperatures}
    hit_sums: dict[float, dict[str, torch.Tensor]] = {t: {} for t in config.temperatures}
    counts: dict[str, int] = {}
    started, used = time.perf_counter(), 0
    ordered = _alternate_kinds(prompts)
    for index, prompt in enumerate(ordered):
        elapsed = time.perf_counter() - started
        if elapsed > config.time_budget and counts.keys() >= {p.kind for p in prompts}:
            log(f"acceptance: {index} of {len(ordered)} prompts within the time budget ({elapsed:.0f} s)")
            break
        log(f"acceptance: prompt {index + 1}/{len(ordered)} ({prompt.kind}, {len(prompt.token_ids)} tokens)")
        used += 1
        ids = list(prompt.token_ids)
        # Each forward over a whole prompt (0.15-0.22 GiB of working memory for 709 tokens on the
        # demo pair) is freed into glibc's heap, which keeps the pages: handed back after each,
        # they do not add up into the peak the memory verdict reads, which is then the models'
        # and one forward's, as in a generation.
        out = plain.generate(ids, SamplingParams(max_new_tokens=config.max_new_tokens)).token_ids
        give_back_memory()
        full = ids + out
        # Row i predicts out[i]: positions len(ids) - 1 ... len(full) - 2.
        feed = torch.tensor([full[:-1]], dtype=torch.long)
        p_logits = target.module(input_ids=feed.to(target.device), logits_to_keep=len(out),
                                 use_cache=False).logits[0].float()  # [N, V]
        give_back_memory()
        if cross is None:
            q_logits = _draft_logits(draft, ids, out, vocabulary_size).to(p_logits.device)  # [N, V]
        else:
            cross.begin(ids)
            q_logits = torch.stack([cross.next_logits(full[:n]) for n in range(len(ids), len(full))])  # [N, V]
            q_logits = q_logits.to(p_logits.device)
        counts[prompt.kind] = counts.get(prompt.kind, 0) + len(out)
        for t in config.temperatures:
            params = SamplingParams(temperature=t, top_p=config.top_p if t > 0 else 1.0)
            if t == 0:
                agree = (p_logits.argmax(-1) == q_logits.argmax(-1)).float()  # [N]
                p = torch.nn.functional.one_hot(p_logits.argmax(-1), p_logits.shape[-1]).float()  # [N, V]
            else:
                p, q = logits_to_probs(p_logits, params), logits_to_probs(q_logits, params)  # [N, V]
                agree = torch.minimum(p, q).sum(-1)  # [N]: P(accept) of speculative sampling
            sums[t][prompt.kind] = sums[t].get(prompt.kind, 0.0) + float(agree.sum())
            top = torch.topk(draft_scores(q_logits, params), min(config.ranks, q_logits.shape[-1]), dim=-1)  # [N, R]
            # A token the draft's filters removed is never proposed: it hits nothing.
            hits = (p.gather(-1, top.indices) * (top.values > float("-inf"))).sum(0)  # [R]
            hit_sums[t][prompt.kind] = hit_sums[t].get(prompt.kind, 0) + hits
        give_back_memory()
    by_temperature, rank_hits = {}, {}
    for t, by_kind in sums.items():
        row = {kind: total / counts[kind] for kind, total in by_kind.items()}
        row["all"] = sum(by_kind.values()) / sum(counts.values())
        by_temperature[t] = row
        hits = {kind: (total / counts[kind]).tolist() for kind, total in hit_sums[t].items()}
        hits["all"] = (sum(hit_sums[t].values()) / sum(counts.values())).tolist()
        rank_hits[t] = hits
    return {"positions": counts, "by_temperature": by_temperature, "rank_hits": rank_hits,
            "prompts": used}


def _alternate_kinds(prompts: list[DoctorPrompt]) -> list[DoctorPrompt]:
    """``prompts`` reordered to take each kind in turn, so that a cut keeps every kind."""
    by_kind: dict[str, list[DoctorPrompt]] = {}
    for prompt in prompts:
        by_kind.setdefault(prompt.kind, []).append(prompt)
    columns = list(by_kind.values())
    return [column[i] for i in range(max(map(len, columns))) for column in columns if i < len(column)]


def predicted_speedup(a: float, k: int, c: float, v: float = 1.0) -> float:
    """``(1 - a^(K+1)) / ((1 - a)(K c + v))``: expected tokens per step over the step's cost."""
    return expected_tokens(a, k) / (k * c + v)


# ---------------------------------------------------------------------------------------------
# The diagnosis


def diagnose(target: LoadedModel, draft: LoadedModel, config: DoctorConfig = DoctorConfig(),
             prompts: list[DoctorPrompt] | None = None, log: Callable[[str], None] = lambda message: None,
             rss_before: int | None = None) -> dict:
    """Everything the doctor reports, as a JSON-ready dict (``verdicts``: (level, text) pairs).
    ``log`` hears of its progress, a line at a time. ``rss_before``: this process's resident
    memory before the models were loaded (Python's, PyTorch's and transformers' own), if known."""
    report = _measure(target, draft, config, prompts, log)
    # What this process has held at most, models and every forward included, read last: a
    # float32 model's weights map its file and become resident as the forwards touch them.
    memory = report["memory"]
    memory["peak_rss"] = peak_rss_bytes() if target.device.type == "cpu" else None
    memory["rss_before"] = rss_before if memory["peak_rss"] is not None else None
    # The models, their caches and the forwards' working memory: what the limit bounds. Below a
    # few hundred MiB of weights, Python's and torch's own memory is most of the peak.
    held = memory["peak_rss"] - (rss_before or 0) if memory["peak_rss"] is not None else None
    if held is not None and memory["target_weights"] >= 2**28 and held > MEMORY_LIMIT * memory["target_weights"]:
        what = "this process held" if rss_before is None else "the models and their forwards held"
        report["verdicts"].insert(0, ("warning", f"{what} {held / 2**30:.1f} GiB at the peak, "
                                                 f"{held / memory['target_weights']:.1f}x the target's weights"))
    return report


def _measure(target: LoadedModel, draft: LoadedModel, config: DoctorConfig = DoctorConfig(),
             prompts: list[DoctorPrompt] | None = None, log: Callable[[str], None] = lambda message: None) -> dict:
    """Everything the doctor reports, as a JSON-ready dict (``verdicts``: (level, text) pairs).
    ``log`` hears of its progress, a line at a time."""
    hardware = detect_hardware()
    report: dict = {"target": target.name, "draft": draft.name, "dtype": target.precision,
                    "draft_dtype": draft.precision, "device": str(target.device), "config": asdict(config),
                    "hardware": hardware.to_dict(), "machine_config": machine_config(target.device.type).to_dict(),
                    "verdicts": []}
    verdicts = report["verdicts"]

    cross = None  # the drafter of a draft with another tokenizer
    try:
        if shares_token_ids(target, draft):
            size = len(target.tokenizer.get_vocab()) if target.tokenizer is not None else target.vocab_size
            report["tokenizers"] = {"compatible": True, "detail": f"identical vocabularies ({size:,} tokens)"}
        else:
            cross = CrossTokenizerDrafter(draft, target, draft_vocabulary_size(draft))
            shared = cross.vocabulary
            report["tokenizers"] = {
                "compatible": True, "shared_tokens": len(shared), "shared_fraction": shared.shared_fraction,
                "detail": f"different vocabularies sharing {len(shared):,} tokens ({shared.shared_fraction:.0%} of the "
                          "smaller one): the draft proposes only those (docs/cross_tokenizer.md)"}
    except TokenizerMismatchError as error:
        report["tokenizers"] = {"compatible": False, "detail": str(error)}
        verdicts.append(("error", "this draft cannot speculate for this target: its vocabulary shares too few "
                                  "tokens with the target's (see above). Use a draft of the target's family, or "
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

    if prompts is None:
        room = min(target.context_length, draft.context_length) - config.max_new_tokens
        prompts = default_prompts(target.tokenizer, room)
        if not prompts:
            raise InvalidParameterError(
                f"no acceptance prompt fits the context window with --max-new-tokens {config.max_new_tokens}: "
                f"ask for fewer new tokens")
    vocabulary_size = draft_vocabulary_size(draft)
    report["draft_vocabulary"] = vocabulary_size
    acceptance = measure_acceptance(target, draft, prompts, config, vocabulary_size, log, cross)
    report["acceptance"] = acceptance
    context = list(prompts[0].token_ids)
    costs = measure_costs(target, draft, context, config.max_k, config.repeats, vocabulary_size,
                          config.tree_positions, config.level_nodes, config.time_budget, log, cross)
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
        a = acceptance["by_temperature"][greedy["temperature"]]["all"]
        verdicts.append(("warning", f"speculation with this draft is predicted to be SLOWER than the target alone "
                                    f"(best {greedy['best']:.2f}x at K={greedy['best_k']}, T={greedy['temperature']:g}) "
                                    f"on this {hardware.isa_level} machine: {why_it_cannot_pay(a, costs)}. The default "
                                    "policy then decodes plainly, drafting only where prompt lookup's copies pay"))
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
    if cross is None:
        report["tree_predictions"] = predict_trees(acceptance, costs, config)
        verdicts.append(tree_verdict(report["tree_predictions"], greedy["temperature"]))
    return report


def why_it_cannot_pay(a: float, costs: dict) -> str:
    """Why no K pays, in numbers: what one drafted token costs and what it would need to be accepted."""
    c, v1 = costs["c"], costs["v"][1]
    needed = c + v1 - 1  # E(1) = 1 + a must exceed a step drafting one token: c + v_1
    return (f"verifying 2 positions costs {v1:.2f} target steps and a draft step {c:.2f}, so one drafted token "
            f"pays only if accepted more than {needed:.0%} of the time (measured: {a:.0%})")


def predict_trees(acceptance: dict, costs: dict, config: DoctorConfig) -> list[dict]:
    """For each temperature and kind of prompt, the best chain and the best dynamic tree
    (``tree_plan.best_plans``), with this machine's costs and with width for free (every
    forward at the price of the cheapest of its kind). A chain accepts what the chain table
    says (at T > 0 it samples), a tree's children are the draft's top tokens."""
    verify, level = cost_curves(costs)
    free = (CostCurve.flat(verify(1)), CostCurve.flat(level(1)))  # monotone: the cheapest
    max_nodes = max((1 + config.max_k, *config.tree_positions)) - 1  # a tree of N nodes verifies N + 1
    rows = []
    for t, by_kind in acceptance["rank_hits"].items():
        for kind, hits in by_kind.items():
            a = acceptance["by_temperature"][t][kind]
            chain, tree = best_plans(hits, verify, level, max_nodes, config.max_k, config.max_branch, a)
            free_chain, ceiling = best_plans(hits, *free, max_nodes, config.max_k, config.max_branch, a)
            rows.append({"temperature": t, "kind": kind, "hits": hits, "chain": asdict(chain), "tree": asdict(tree),
                         "gain": tree.speedup / chain.speedup - 1, "free_width_tree": asdict(ceiling),
                         "free_width_gain": ceiling.speedup / free_chain.speedup - 1})
    return rows


def tree_verdict(tree_predictions: list[dict], temperature: float) -> tuple[str, str]:
    """Whether a tree is worth drafting here, from the prediction over all prompts at ``temperature``."""
    row = next(r for r in tree_predictions if r["temperature"] == temperature and r["kind"] == "all")
    tree, chain = row["tree"], row["chain"]
    shape = f"--tree-budget {tree['budget']} -k {tree['depth']} --tree-branch {tree['branch']}"
    against = f"{tree['speedup']:.2f}x against {chain['speedup']:.2f}x for a chain at K={chain['depth']}"
    if row["gain"] >= TREE_MARGIN:
        return ("ok", f"a tree is predicted to beat the best chain by {row['gain']:.0%} at T={temperature:g}: {shape} "
                      f"({against}); measure it with quickdraft bench")
    return ("ok", f"trees are not predicted to pay on this machine: the best, {shape}, {against} "
                  f"(T={temperature:g}); where verifying and drafting more positions cost nothing extra, a tree "
                  f"would gain {row['free_width_gain']:+.0%}")


# ---------------------------------------------------------------------------------------------
# Output


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def format_report(report: dict) -> str:
    """The doctor's report as text for a terminal."""
    lines = [f"quickdraft doctor: target {report['target']} ({report['dtype']}), draft {report['draft']} "
             f"({report['draft_dtype']}), {report['device']}"]
    if report.get("hardware"):
        hw = report["hardware"]
        gpu = f", GPU {hw['gpu']}" if hw.get("gpu") else ""
        lines.append(f"Machine      {hw['cpu']}: {hw['isa_level']} ({' '.join(hw['flags'])}), {hw['cores']} cores, "
                     f"{hw['threads']} threads{gpu}"
                     + "".join(f", {k}={v}" for k, v in hw.get("restrictions", {}).items()))
        chosen = report["machine_config"]
        lines.append(f"             dtype=auto here: target {chosen['dtype']}{' packed' if chosen['pack_weights'] else ''}, "
                     f"draft {draft_format(chosen['draft_quantization'], chosen['draft_dtype'])}")
    lines.append("")
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
    if mem.get("peak_rss") is not None:
        lines.append(f"             measured: this process's peak resident memory {_gib(mem['peak_rss'])}, "
                     f"{mem['peak_rss'] / mem['target_weights']:.2f}x the target's weights")
    if mem.get("rss_before") is not None:
        held = mem["peak_rss"] - mem["rss_before"]
        lines.append(f"             of it {_gib(held)} ({held / mem['target_weights']:.2f}x) models, caches and "
                     f"forwards, above the {_gib(mem['rss_before'])} held before loading the models")
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
        if cost.get("tree_verify"):
            lines.append("             a tree forward over n positions / 1 token: "
                         + ", ".join(f"n={n}: {s / cost['target_step']:.2f}" for n, s in cost["tree_verify"].items()))
        if len(cost.get("draft_level", {})) > 1:
            lines.append("             a draft forward over a level of m nodes / the draft step: "
                         + ", ".join(f"m={m}: {s / cost['draft_step']:.2f}" for m, s in cost["draft_level"].items()
                                     if int(m) > 1))
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
    if report.get("tree_predictions"):
        lines.append("")
        lines.append("Predicted trees  the best dynamic tree (budget N, depth D, branch B) from how often the target takes")
        lines.append("                 the draft's r-th token (h_r), against the best chain; 'width free': if every")
        lines.append("                 forward cost what one position does (docs/trees.md)")
        lines.append("                 (costs fitted non-decreasing in positions, so the chains can differ from the table above)")
        lines.append(f"  {'T':<5} {'prompts':<7} {'h_1..h_4':<20} {'chain':>11}  {'tree':<22} {'vs chain':>8}  width free")
        for row in report["tree_predictions"]:
            tree, free, chain = row["tree"], row["free_width_tree"], row["chain"]
            hits = " ".join(f"{h:.2f}" for h in row["hits"][:4])
            lines.append(f"  {float(row['temperature']):<5g} {row['kind']:<7} {hits:<20} "
                         f"{'K=%d %.2fx' % (chain['depth'], chain['speedup']):>11}  "
                         f"{'N=%d D=%d B=%d %.2fx' % (tree['budget'], tree['depth'], tree['branch'], tree['speedup']):<22} "
                         f"{row['gain']:>+8.0%}  N={free['budget']} D={free['depth']} B={free['branch']} "
                         f"{free['speedup']:.2f}x ({row['free_width_gain']:+.0%})")
    lines.append("")
    lines.append("Verdict")
    marks = {"ok": "  ok      ", "warning": "  WARNING ", "error": "  ERROR   "}
    for level, text in report["verdicts"]:
        lines.append(marks[level] + text)
    return "\n".join(lines)


def read_report(path: str | Path) -> dict:
    """A report that ``--json`` wrote, ready for ``format_report``: JSON turned its numeric keys
    (K, positions, temperatures) into strings; they are numbers again."""
    return json.loads(Path(path).read_text(encoding="utf-8"), object_hook=_numeric_keys)


def _numeric_keys(obj: dict) -> dict:
    return {(float(k) if "." in k else int(k)) if _NUMBER.fullmatch(k) else k: v for k, v in obj.items()}


_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def add_doctor_parser(subparsers: argparse._SubParsersAction) -> None:
    from quickdraft.cli_common import add_draft_quantization_argument, add_dtype_argument

    parser = subparsers.add_parser(
        "doctor", help="check a target/draft pair: tokenizers, size, memory, cost, acceptance, best K",
        description=__doc__.split("\n\n")[0] + " Exit status: 0 usable pair, 1 vocabularies share too little, 2 error.",
    )
    parser.add_argument("target", nargs="?", help="target model (demo name, folder, .gguf, cached hub id)")
    parser.add_argument("draft", nargs="?", help="draft model")
    add_dtype_argument(parser)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    add_draft_quantization_argument(parser)
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence for the KV memory (default: 4096)")
    parser.add_argument("--batch", type=int, default=1, help="sequences for the KV memory (default: 1)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per acceptance prompt (default: 32)")
    parser.add_argument("--temperatures", default="0,0.3,0.7,1.0", help="default: 0,0.3,0.7,1.0")
    parser.add_argument("--top-p", type=float, default=1.0, help="top-p for T > 0 (default: 1.0)")
    parser.add_argument("--max-k", type=int, default=8, help="largest K predicted (default: 8)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per forward, median (default: 5)")
    parser.add_argument("--time-budget", type=float, default=DoctorConfig.time_budget, metavar="SECONDS",
                        help="seconds the acceptance prompts and the timings may each take, roughly: where steps "
                             "are slow, fewer prompts (one of each kind at least) and repeats (2 at least) "
                             f"(default: {DoctorConfig.time_budget:g})")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--report-from", default=None, metavar="REPORT.json",
                        help="no measurements: print the text report of an earlier --json report")
    parser.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from quickdraft.cli_common import load_models, report_machine
    from quickdraft.drafters.registry import names_a_kind
    from quickdraft.models.loading import resolve_device, resolve_source

    if args.report_from:
        print(format_report(read_report(args.report_from)))
        return EXIT_OK
    if not (args.target and args.draft):
        raise InvalidParameterError("quickdraft doctor needs a target and a draft model (or --report-from REPORT.json)")
    config = DoctorConfig(
        context=args.context, batch=args.batch, max_new_tokens=args.max_new_tokens,
        temperatures=tuple(float(t) for t in args.temperatures.split(",") if t.strip()),
        top_p=args.top_p, max_k=args.max_k, repeats=args.repeats, time_budget=args.time_budget,
    )
    device = resolve_device(args.device)
    report_machine(device)
    # One-time work is not what the pair holds when it runs: this machine's probe above (where
    # none is cached: 1 GiB of layers in four formats) and a demo model's first conversion
    # (resolve_source). The memory verdict's peak is counted from here.
    for source in (args.target, args.draft):
        if not names_a_kind(source):
            resolve_source(source)
    reset_peak_rss()
    rss_before = rss_bytes()
    target, draft = load_models(args, device)
    report = diagnose(target, draft, config, log=lambda message: print(f"doctor: {message}", file=sys.stderr,
                                                                       flush=True), rss_before=rss_before)
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        print()
    else:
        print(format_report(report))
    return EXIT_OK if report["usable"] else EXIT_INCOMPATIBLE
