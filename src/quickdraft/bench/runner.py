"""Running the benchmark: a greedy check, a warm-up, then interleaved timed runs and sweeps.

Phases, in order:

1. **check**: every method decodes greedily in ``check_dtype`` (float32 by default) and its
   tokens are compared with quickdraft's plain decoding, prompt by prompt.
2. **warmup**: one short generation per method, not counted.
3. **main**: every method on every prompt at K = ``config.k``, greedy. Runs are interleaved
   (prompt 1: A B C ..., prompt 2: B C ... A, ...; repeats likewise) so that drift of the machine
   hits every method alike; the order of the methods rotates from prompt to prompt.
4. **k_sweep**: ``sweep_methods`` at each K of ``k_sweep``, plus the baseline, on a few prompts.
5. **temperature**: ``sweep_methods`` and the baseline at each temperature x top-p.

The baseline of the sweeps is the plain method that was fastest in the main phase.
Sampled runs use a seed fixed by prompt and repeat, the same for every method.
Every method produces exactly ``max_new_tokens`` tokens (end-of-sequence tokens do not stop
generation), so tokens per second are comparable without normalising.
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from quickdraft.bench.measure import ForwardTimer, load_average, other_cpu, peak_memory, wait_for_quiet
from quickdraft.bench.methods import DEFAULT_TREE_BUDGET, Method, build_methods, plain_method
from quickdraft.bench.workloads import Prompt, prompt_ids
from quickdraft.config import SamplingParams
from quickdraft.errors import InvalidParameterError
from quickdraft.models.base import LoadedModel
from quickdraft.models.packing import has_packed_layers
from quickdraft.tree import DEFAULT_BRANCH, TreeSpec

# A greedy mismatch is a near-tie when, at the first differing position, the target's logits
# of the two competing tokens are this close (in the dtype of the run). bfloat16 keeps 8
# significant bits: logits of 16-32 are spaced 0.125 apart, and a K+1-token forward and a
# 1-token forward round differently through every layer.
NEAR_TIE_GAP = {"float32": 0.01, "bfloat16": 0.5}

ModelPair = tuple[LoadedModel, LoadedModel | None]
# (dtype, pack, with_draft) -> (target, draft or None): pack True packs the weights, False
# keeps stock layers, None does as ``load_model`` does on this machine; with_draft=False skips
# loading the draft.
LoadPair = Callable[[str, bool | None, bool], ModelPair]
# Plain decoding in each weights' format: ``BenchConfig.plain_formats`` -> (dtype, pack).
PLAIN_FORMATS = {"float32": ("float32", False), "float32-packed": ("float32", True),
                 "bfloat16": ("bfloat16", False), "bfloat16-packed": ("bfloat16", True)}


@dataclass(frozen=True)
class BenchConfig:
    """What to run. Lists are tuples; an empty sweep list skips that sweep.

    ``eagle``, ``medusa``: the folder of an EAGLE head (Medusa heads) trained for the target,
    benchmarked as the ``eagle*`` (``medusa*``) methods.

    ``tree_budget``, ``tree_branch``: the shape of every tree method's dynamic tree (K deep).

    ``quiet_wait``: before each timed run, wait up to this many seconds for other processes to
    use less than 0.3 of a core (0: never wait; the competition is measured and reported anyway).

    ``llama_cpp``: a GGUF file (the target's) that llama.cpp decodes plainly beside quickdraft's
    methods, as the timed method ``llama.cpp-plain`` (``bench.llama_cpp``; ``llama_python``: the
    interpreter with llama-cpp-python; ``threads``: its threads, default torch's).

    ``plain_formats``: also time plain decoding of the target loaded in each of these formats
    (``PLAIN_FORMATS``), as methods ``plain-<format>``: the baseline is the fastest plain
    decoding of the run, so a default dtype that is not the fastest here shows.
    """

    dtype: str = "bfloat16"
    max_new_tokens: int = 64
    k: int = 5
    repeats: int = 1
    chat: bool = True
    methods: tuple[str, ...] | None = None
    peer: bool = True
    k_sweep: tuple[int, ...] = (1, 2, 4, 6, 8)
    k_sweep_categories: tuple[str, ...] = ("code", "summarization")
    temperatures: tuple[float, ...] = (0.0, 0.3, 0.7, 1.0)
    top_ps: tuple[float, ...] = (1.0,)
    temperature_categories: tuple[str, ...] = ("code", "qa")
    sweep_prompts: int = 2
    sweep_methods: tuple[str, ...] = ("draft", "tree", "ngram")
    check_dtype: str | None = "float32"
    check_prompts: int = 1
    check_max_new_tokens: int = 32
    warmup_tokens: int = 8
    seed: int = 0
    quiet_wait: float = 0.0
    eagle: str | None = None
    medusa: str | None = None
    tree_budget: int = DEFAULT_TREE_BUDGET
    tree_branch: int = DEFAULT_BRANCH
    plain_formats: tuple[str, ...] = ()
    llama_cpp: str | None = None
    llama_python: str | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 2 or self.k < 1 or self.repeats < 1:
            raise InvalidParameterError("need max_new_tokens >= 2, k >= 1 and repeats >= 1")
        if any(k < 1 for k in self.k_sweep):
            raise InvalidParameterError(f"every K of the sweep must be >= 1, got {self.k_sweep}")
        for t in self.temperatures:
            SamplingParams(temperature=t)  # validates
        for p in self.top_ps:
            SamplingParams(top_p=p)
        TreeSpec(budget=self.tree_budget, branch=self.tree_branch)  # validates
        unknown = [f for f in self.plain_formats if f not in PLAIN_FORMATS]
        if unknown:
            raise InvalidParameterError(f"unknown plain format(s) {', '.join(unknown)}; choose from {', '.join(PLAIN_FORMATS)}")


@dataclass
class RunRecord:
    """One timed generation. Times in seconds, memory in bytes.

    ``forwards`` lists every forward of each model as ``[positions fed, seconds]``; ``stats``
    is quickdraft's ``DecodeStats.to_dict()`` (``None`` for transformers methods).
    ``other_load`` is the CPU (in cores) other processes used during the run, ``waited`` the
    seconds spent waiting for them to go quiet before it (``quiet_wait``).
    """

    phase: str
    method: str
    family: str
    category: str
    prompt_id: str
    prompt_tokens: int
    repeat: int
    k: int
    temperature: float
    top_p: float
    seed: int | None
    new_tokens: int
    seconds: float
    forwards: dict[str, list[list[float]]]
    stats: dict | None
    memory: dict
    load_average: float | None
    other_load: float | None
    waited: float
    token_ids: list[int] = field(repr=False)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (a length difference counts)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class _Executor:
    """Runs single generations on one model pair and records them."""

    def __init__(self, target: LoadedModel, draft: LoadedModel | None, methods: list[Method],
                 prompts: list[Prompt], config: BenchConfig) -> None:
        self.target = target
        self.methods = {m.name: m for m in methods}
        self.config = config
        modules = {"target": target.forward_modules()}
        if draft is not None:
            modules["draft"] = draft.forward_modules()
        self.timer = ForwardTimer(modules)
        self.prompts = {p.id: p for p in prompts}
        self.ids = {p.id: prompt_ids(p, target.tokenizer, config.chat) for p in prompts}

    def run(self, phase: str, method: str, prompt: Prompt, k: int, params: SamplingParams,
            repeat: int = 0, timed: bool = True) -> RunRecord:
        ids = self.ids[prompt.id]
        chosen = self.methods[method]
        waited = wait_for_quiet(self.config.quiet_wait) if timed and self.config.quiet_wait > 0 else 0.0
        with other_cpu() as others, peak_memory(self.target.device) as memory, self.timer.recording() as calls:
            load = load_average()
            start = time.perf_counter()
            out = chosen.generate(ids, params, k)
            if self.target.device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        forwards: dict[str, list[list[float]]] = {}
        for label, positions, spent in calls:
            forwards.setdefault(label, []).append([positions, round(spent, 6)])
        return RunRecord(
            phase=phase, method=method, family=chosen.family, category=prompt.category,
            prompt_id=prompt.id, prompt_tokens=len(ids), repeat=repeat, k=k,
            temperature=params.temperature, top_p=params.top_p, seed=params.seed,
            new_tokens=len(out.token_ids), seconds=seconds, forwards=forwards,
            stats=None if out.stats is None else out.stats.to_dict(), memory=memory,
            load_average=load, other_load=others["cores"], waited=waited, token_ids=out.token_ids,
        )

    @torch.inference_mode()
    def logit_gap(self, prompt_id: str, reference: list[int], other: list[int], at: int) -> dict:
        """The target's logits where ``other`` first leaves ``reference``: one full forward.

        Returns the gap between the reference's token and the other's token, the gap between
        the top two tokens, and both tokens (in the dtype of the model).
        """
        ids = self.ids[prompt_id] + reference[:at]
        tensor = torch.tensor([ids], dtype=torch.long, device=self.target.device)
        logits = self.target.module(input_ids=tensor, logits_to_keep=1).logits[0, -1].float()  # [V]
        top = torch.topk(logits, 2).values
        gap = float(logits[reference[at]] - logits[other[at]]) if at < min(len(reference), len(other)) else None
        return {"position": at, "reference_token": reference[at] if at < len(reference) else None,
                "other_token": other[at] if at < len(other) else None,
                "gap": gap, "top2_gap": float(top[0] - top[1])}


def _compare(executor: _Executor, records: list[RunRecord], dtype: str, reference_method: str = "plain") -> list[dict]:
    """Compare every greedy run's tokens with the reference method's on the same prompt."""
    reference = {}
    for r in records:
        if r.method == reference_method and r.temperature == 0.0:
            reference.setdefault((r.prompt_id, r.new_tokens), r.token_ids)
    limit = NEAR_TIE_GAP.get(dtype, 0.5)
    rows = []
    seen: dict[tuple, dict] = {}
    for r in records:
        if r.temperature != 0.0 or r.method == reference_method:
            continue
        ref = reference.get((r.prompt_id, r.new_tokens))
        if ref is None:
            continue
        at = first_difference(ref, r.token_ids)
        row = {"phase": r.phase, "method": r.method, "family": r.family, "category": r.category,
               "prompt_id": r.prompt_id, "k": r.k, "repeat": r.repeat, "dtype": dtype,
               "identical": at is None, "first_difference": at, "near_tie_limit": limit}
        if at is None:
            row["verdict"] = "identical"
        else:
            key = (r.prompt_id, tuple(ref[: at + 1]), r.token_ids[at] if at < len(r.token_ids) else None)
            if key not in seen:
                seen[key] = executor.logit_gap(r.prompt_id, ref, r.token_ids, at)
            row.update(seen[key])
            gap = row["gap"]
            row["verdict"] = "near-tie" if gap is not None and abs(gap) <= limit else "MISMATCH"
        rows.append(row)
    return rows


def _rotate(items: list, by: int) -> list:
    by %= max(len(items), 1)
    return items[by:] + items[:by]


def _first_per_category(prompts: list[Prompt], categories: Sequence[str] | None, count: int) -> list[Prompt]:
    chosen, taken = [], {}
    for p in prompts:
        if categories is not None and p.category not in categories:
            continue
        if taken.get(p.category, 0) < count:
            taken[p.category] = taken.get(p.category, 0) + 1
            chosen.append(p)
    return chosen


def run_check(pair: ModelPair, prompts: list[Prompt], config: BenchConfig, progress: bool = True,
              peer_pair: ModelPair | None = None) -> dict:
    """Phase 1: greedy outputs of every method against plain decoding, in the pair's dtype.

    ``peer_pair``: the models the transformers methods run (``None``: ``pair``).
    """
    target, draft = pair
    methods = build_methods(target, draft, config.methods, config.peer, config.eagle, peer_pair, config.medusa,
                            config.tree_budget, config.tree_branch)
    if "plain" not in [m.name for m in methods]:  # the reference every output is compared with
        methods.insert(0, build_methods(target, draft, ["plain"], peer=False)[0])
    chosen = _first_per_category(prompts, None, config.check_prompts)
    executor = _Executor(target, draft, methods, chosen, config)
    params = SamplingParams(max_new_tokens=config.check_max_new_tokens)
    records = []
    bar = tqdm(total=len(chosen) * len(methods), desc="greedy check", disable=not progress, leave=False)
    for prompt in chosen:
        for method in methods:
            bar.set_postfix_str(f"{prompt.category} {method.name}")
            records.append(executor.run("check", method.name, prompt, config.k, params, timed=False))
            bar.update()
    bar.close()
    dtype = str(target.dtype).replace("torch.", "")
    rows = _compare(executor, records, dtype)
    return {"dtype": dtype, "max_new_tokens": config.check_max_new_tokens,
            "comparisons": rows, "runs": [_record_dict(r) for r in records]}


def run_timed(pair: ModelPair, prompts: list[Prompt], config: BenchConfig, progress: bool = True,
              checkpoint: Callable[[list[dict]], None] | None = None, peer_pair: ModelPair | None = None,
              plain_targets: dict[str, LoadedModel] | None = None) -> dict:
    """Phases 2-5 on the pair (in the run dtype): warm-up, main, K sweep, temperature sweep.

    ``checkpoint(runs)`` is called with the runs so far after each phase. ``peer_pair``: the
    models the transformers methods run (``None``: ``pair``). ``plain_targets``: the target in
    other formats, by format name, each timed as the plain method ``plain-<format>``.
    """
    target, draft = pair
    methods = build_methods(target, draft, config.methods, config.peer, config.eagle, peer_pair, config.medusa,
                            config.tree_budget, config.tree_branch)
    methods += [plain_method(f"plain-{name}", model) for name, model in (plain_targets or {}).items()]
    if config.llama_cpp:
        from quickdraft.bench.llama_cpp import LlamaCppMethod

        threads = config.threads or torch.get_num_threads()
        methods.append(LlamaCppMethod("llama.cpp-plain", f"llama.cpp, target alone ({Path(config.llama_cpp).name}, "
                                      f"{threads} threads)", Path(config.llama_cpp), threads, config.llama_python))
    executor = _Executor(target, draft, methods, prompts, config)
    names = [m.name for m in methods]
    plain_names = [m.name for m in methods if m.plain]
    if not plain_names:
        raise InvalidParameterError("the methods compared must include a plain one (plain or hf-plain)")
    sweep_methods = [n for n in config.sweep_methods if n in executor.methods and not executor.methods[n].plain]
    k_prompts = _first_per_category(prompts, config.k_sweep_categories, config.sweep_prompts) if config.k_sweep else []
    t_prompts = (_first_per_category(prompts, config.temperature_categories, config.sweep_prompts)
                 if config.temperatures else [])
    grid = [(t, p) for t in config.temperatures for p in (config.top_ps if t > 0 else (1.0,))]
    grid = list(dict.fromkeys(grid))
    total = (len(names) + config.repeats * len(prompts) * len(names)
             + config.repeats * len(k_prompts) * (1 + len(config.k_sweep) * len(sweep_methods))
             + config.repeats * len(t_prompts) * len(grid) * (1 + len(sweep_methods)))
    bar = tqdm(total=total, desc="benchmark", disable=not progress)
    records: list[RunRecord] = []
    started = {}

    def run(phase, method, prompt, k, params, repeat):
        bar.set_postfix_str(f"{phase} {prompt.category} {method} K={k} T={params.temperature:g}")
        record = executor.run(phase, method, prompt, k, params, repeat)
        bar.update()
        return record

    def seed_for(index: int, repeat: int) -> int:
        return config.seed + 1009 * index + repeat

    started["warmup"] = time.time()
    warm = SamplingParams(max_new_tokens=min(config.warmup_tokens, config.max_new_tokens))
    for name in names:
        run("warmup", name, prompts[0], config.k, warm, 0)  # not kept

    started["main"] = time.time()
    greedy = SamplingParams(max_new_tokens=config.max_new_tokens)
    for repeat in range(config.repeats):
        for index, prompt in enumerate(prompts):
            for name in _rotate(names, index + repeat):
                records.append(run("main", name, prompt, config.k, greedy, repeat))

    save = (lambda: checkpoint([_record_dict(r) for r in records])) if checkpoint else (lambda: None)
    save()
    baseline = max(plain_names, key=lambda n: statistics.median(
        r.tokens_per_second for r in records if r.method == n))

    started["k_sweep"] = time.time()
    for repeat in range(config.repeats):
        for index, prompt in enumerate(k_prompts):
            runs = [(baseline, config.k)] + [(n, k) for k in config.k_sweep for n in sweep_methods]
            for name, k in _rotate(runs, index + repeat):
                records.append(run("k_sweep", name, prompt, k, greedy, repeat))
    save()

    started["temperature"] = time.time()
    for repeat in range(config.repeats):
        for index, prompt in enumerate(t_prompts):
            for temperature, top_p in grid:
                params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=config.max_new_tokens,
                                        seed=seed_for(index, repeat) if temperature > 0 else None)
                for name in _rotate([baseline] + sweep_methods, index + repeat):
                    records.append(run("temperature", name, prompt, config.k, params, repeat))
    bar.close()
    started["end"] = time.time()

    dtype = str(target.dtype).replace("torch.", "")
    agreement = _compare(executor, [r for r in records if r.phase in ("main", "k_sweep")], dtype)
    return {
        "baseline": baseline,
        "methods": [{"name": m.name, "family": m.family, "plain": m.plain, "description": m.description}
                    for m in methods],
        "prompts": [{"id": p.id, "category": p.category, "prompt_tokens": len(executor.ids[p.id]),
                     "preview": (p.text or "")[:80]} for p in prompts],
        "phase_started": started,
        "runs": [_record_dict(r) for r in records],
        "greedy_agreement": agreement,
    }


def _record_dict(record: RunRecord) -> dict:
    data = asdict(record)
    data["tokens_per_second"] = record.tokens_per_second
    return data


def _peer_pair(load_pair: LoadPair, dtype: str, pair: ModelPair, config: BenchConfig,
               log: Callable[[str], None]) -> ModelPair | None:
    """The models for the transformers methods: stock ones, as transformers users run them, when
    ``pair`` holds packed layers (``models.packing``); ``None`` when ``pair`` itself is stock.

    Only the packed models are loaded again: an int8 draft is never packed, so the transformers
    methods share it, and the run holds one copy of it, not two.
    """
    target, draft = pair
    draft_packed = draft is not None and has_packed_layers(draft)
    if not config.peer or not (has_packed_layers(target) or draft_packed):
        return None
    log(f"loading the {'models' if draft_packed else 'target'} again in {dtype} with stock transformers "
        "layers, for the transformers methods")
    stock_target, stock_draft = load_pair(dtype, False, draft_packed)
    return stock_target, stock_draft if draft_packed else draft


def run_benchmark(load_pair: LoadPair, prompts: list[Prompt], config: BenchConfig,
                  progress: bool = True, log: Callable[[str], None] = print,
                  checkpoint: Callable[[dict], None] | None = None) -> dict:
    """The whole benchmark: the check in ``config.check_dtype``, then the timed phases.

    ``load_pair(dtype, pack, with_draft)`` returns ``(target, draft or None)`` in that dtype
    (``LoadPair``): quickdraft's methods run what ``load_model`` loads on this machine, the
    transformers methods stock layers; the draft only when ``with_draft``. The check's models are released before the run's are loaded.
    ``checkpoint(partial_results)`` is called after each phase, so that an interrupted run
    leaves its data behind. Returns the raw results (``report.summarize``
    turns them into tables).
    """
    if not prompts:
        raise InvalidParameterError("no prompts to run")
    results: dict = {"format": 1, "config": asdict(config)}
    if config.check_dtype:
        log(f"greedy check in {config.check_dtype}: loading models")
        pair = load_pair(config.check_dtype, None, True)
        peer_pair = _peer_pair(load_pair, config.check_dtype, pair, config, log)
        results["check"] = run_check(pair, prompts, config, progress, peer_pair)
        del pair, peer_pair
        gc.collect()
        if checkpoint:
            checkpoint(results)
    log(f"timed runs in {config.dtype}: loading models")
    pair = load_pair(config.dtype, None, True)
    peer_pair = _peer_pair(load_pair, config.dtype, pair, config, log)
    plain_targets = {}
    for name in config.plain_formats:
        log(f"loading the target as {name} for plain decoding")
        plain_targets[name] = load_pair(*PLAIN_FORMATS[name], False)[0]
    results["models"] = {
        role: None if model is None else {
            "name": model.name, "parameters": model.num_parameters(),
            "dtype": model.precision, "vocab_size": model.vocab_size,
        }
        for role, model in zip(("target", "draft"), pair)
    }
    on_phase = (lambda runs: checkpoint({**results, "runs": runs})) if checkpoint else None
    results.update(run_timed(pair, prompts, config, progress, on_phase, peer_pair, plain_targets))
    return results
