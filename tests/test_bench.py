"""The benchmark: its arithmetic on synthetic timings, its workloads, and whole runs on tiny models."""

from __future__ import annotations

import json
from dataclasses import replace
import string

import pytest
import torch

from conftest import char_tokenizer, make_tiny_model, make_tiny_qwen2
from helpers import CHAT_TEMPLATE, save_tiny_model
from quickdraft.bench.cli import write_outputs
from quickdraft.bench.report import (
    fit_acceptance,
    median,
    overall_table,
    paired_ratios,
    summarize,
    theoretical_speedup,
)
from quickdraft.bench.runner import BenchConfig, _peer_pair, first_difference, run_benchmark
from quickdraft.bench.workloads import (
    CATEGORIES,
    MT_BENCH_KINDS,
    Prompt,
    humaneval_problems,
    load_category,
    load_prompts_file,
    load_workload,
    prompt_ids,
)
from quickdraft.cli import main
from quickdraft.config import SamplingParams
from quickdraft.errors import InvalidParameterError
from quickdraft.costs import expected_tokens
from quickdraft.models.loading import load_model
from quickdraft.models.packing import can_pack, has_packed_layers
from quickdraft.models.quantize import quantize
from quickdraft.policy import AdaptiveK, FixedK
from quickdraft.tree import TreeSpec

# ---------------------------------------------------------------------------------------------
# Arithmetic


def test_expected_tokens_per_step_edges_and_a_value():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


@pytest.mark.parametrize("a", [0.1, 0.5, 0.75, 0.95])
@pytest.mark.parametrize("k", [1, 4, 8, 2.5])
def test_fit_acceptance_inverts_the_expected_length(a, k):
    assert fit_acceptance(expected_tokens(a, k), k) == pytest.approx(a, abs=1e-9)


def test_fit_acceptance_clamps():
    assert fit_acceptance(1.0, 4) == 0.0  # nothing accepted
    assert fit_acceptance(5.0, 4) == 1.0  # everything accepted
    assert fit_acceptance(3.0, 0) == 0.0  # nothing drafted


def test_theoretical_speedup_formula():
    # (1 - 0.8^5) / ((1 - 0.8)(4 * 0.1 + 1)) = 0.67232 / 0.28
    assert theoretical_speedup(0.8, 4, 0.1) == pytest.approx(0.67232 / 0.28)
    assert theoretical_speedup(1.0, 4, 0.0) == 5.0
    assert theoretical_speedup(0.0, 4, 0.5) == pytest.approx(1 / 3)  # drafting for nothing costs


def test_median_ignores_missing_values():
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([]) is None


def test_paired_ratios_pair_on_prompt_repeat_and_sampling_not_on_k():
    def run(prompt, repeat, tps, k=1, t=0.0):
        return {"prompt_id": prompt, "repeat": repeat, "temperature": t, "top_p": 1.0, "k": k,
                "tokens_per_second": tps}

    base = [run("a", 0, 10.0), run("b", 0, 20.0), run("a", 0, 5.0, t=0.7)]
    method = [run("a", 0, 15.0, k=4), run("b", 0, 10.0, k=4), run("a", 0, 10.0, k=4, t=0.7), run("c", 0, 1.0)]
    assert sorted(paired_ratios(method, base)) == [0.5, 1.5, 2.0]


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def _synthetic_run(method, family, category, prompt, seconds, *, new_tokens=64, stats=None, target=(), draft=(),
                   phase="main", k=4, temperature=0.0):
    return {
        "phase": phase, "method": method, "family": family, "category": category, "prompt_id": prompt,
        "prompt_tokens": 10, "repeat": 0, "k": k, "temperature": temperature, "top_p": 1.0, "seed": None,
        "new_tokens": new_tokens, "seconds": seconds, "tokens_per_second": new_tokens / seconds,
        "forwards": {"target": [list(f) for f in target], "draft": [list(f) for f in draft]},
        "stats": stats, "memory": {"rss_before": 1000, "peak_rss": 1500, "cuda_peak": None},
        "load_average": 0.5, "token_ids": [],
    }


def _stats(steps, drafted, accepted, drafted_by_position, accepted_by_position, time_draft=0.0):
    return {"steps": steps, "drafted_tokens": drafted, "accepted_tokens": accepted,
            "drafted_by_position": drafted_by_position, "accepted_by_position": accepted_by_position,
            "time_draft": time_draft}


def _synthetic_results():
    """Two categories, two prompts each: plain at 8 s, hf-plain at 6.4 s (the faster: baseline),
    draft at 4 s; draft forwards 0.02 s, plain target steps 0.1 s (c = 0.2)."""
    runs = []
    for category in ("code", "qa"):
        for prompt in (f"{category}/1", f"{category}/2"):
            plain_stats = _stats(64, 0, 0, [], [])
            runs.append(_synthetic_run("plain", "quickdraft", category, prompt, 8.0, stats=plain_stats,
                                       target=[(9, 0.5)] + [(1, 0.1)] * 64))
            runs.append(_synthetic_run("hf-plain", "transformers", category, prompt, 6.4,
                                       target=[(10, 0.5)] + [(1, 0.09)] * 63))
            # 16 steps of K = 4, 48 accepted: 4 tokens per step.
            draft_stats = _stats(16, 64, 48, [16, 16, 16, 16], [14, 12, 12, 10], time_draft=1.3)
            runs.append(_synthetic_run("draft", "quickdraft", category, prompt, 4.0, stats=draft_stats,
                                       target=[(9, 0.5)] + [(5, 0.12)] * 16, draft=[(9, 0.1)] + [(1, 0.02)] * 64))
    methods = [{"name": "plain", "family": "quickdraft", "plain": True, "description": ""},
               {"name": "hf-plain", "family": "transformers", "plain": True, "description": ""},
               {"name": "draft", "family": "quickdraft", "plain": False, "description": ""}]
    return {"config": {"k": 4, "max_new_tokens": 64, "repeats": 1, "chat": True, "seed": 0}, "methods": methods,
            "baseline": "hf-plain", "runs": runs}


def test_summary_speedups_are_over_the_fastest_plain_decoding():
    summary = summarize(_synthetic_results())
    rows = {(r["method"], r["category"]): r for r in summary["main"]}
    assert summary["baseline"] == "hf-plain" and summary["baseline_family"] == "transformers"
    assert summary["baseline_tokens_per_second"] == pytest.approx(10.0)
    assert rows[("hf-plain", "all")]["speedup"] == pytest.approx(1.0)
    assert rows[("plain", "code")]["speedup"] == pytest.approx(0.8)
    assert rows[("draft", "qa")]["speedup"] == pytest.approx(1.6)
    assert rows[("draft", "all")]["speedup"] == pytest.approx(1.6)
    assert rows[("draft", "all")]["speedup_over_own_plain"] == pytest.approx(2.0)
    assert rows[("draft", "code")]["tokens_per_second"] == pytest.approx(16.0)


def test_summary_acceptance_costs_and_theory():
    summary = summarize(_synthetic_results())
    row = next(r for r in summary["main"] if r["method"] == "draft" and r["category"] == "code")
    assert row["tokens_per_forward"] == pytest.approx((2 * 48 + 2 * 16) / (2 * 16))  # 4.0, bonus counted
    assert row["acceptance_rate"] == pytest.approx(0.75)
    assert row["acceptance_by_position"] == pytest.approx([14 / 16, 12 / 16, 12 / 16, 10 / 16])
    assert row["mean_draft_length"] == pytest.approx(4.0)
    assert row["c"] == pytest.approx(0.2)
    assert row["v"] == pytest.approx(1.2)
    a = fit_acceptance(4.0, 4)
    assert row["a"] == pytest.approx(a)
    assert expected_tokens(a, 4) == pytest.approx(4.0)
    assert row["theory"] == pytest.approx(4.0 / (4 * 0.2 + 1))
    assert row["achieved"] == pytest.approx(2.0 / row["theory"])
    # the plain decoders emit one token per forward
    plain = {r["method"]: r for r in summary["main"] if r["category"] == "all"}
    assert plain["plain"]["tokens_per_forward"] == 1.0
    assert plain["hf-plain"]["tokens_per_forward"] == pytest.approx(1.0)
    # time shares from the forward timings: draft 2 * (0.1 + 64 * 0.02) / (2 * 4) per category
    assert row["share_draft"] == pytest.approx((0.1 + 64 * 0.02) / 4.0)
    assert row["share_target"] == pytest.approx((0.5 + 16 * 0.12) / 4.0)


def test_summary_of_prompt_lookup_in_front_of_a_model_and_of_trees():
    results = _synthetic_results()
    for category in ("code", "qa"):
        for prompt in (f"{category}/1", f"{category}/2"):
            # Half the 16 steps drafted by lookup (free): the model's 0.64 s over all 64 drafted
            # tokens is 0.01 s a token, c = 0.1, not the 0.2 of one draft forward.
            stats = {**_stats(16, 64, 48, [16] * 4, [14, 12, 12, 10], time_draft=0.64), "lookup_steps": 8}
            results["runs"].append(_synthetic_run("default", "quickdraft", category, prompt, 3.0, stats=stats,
                                                  target=[(9, 0.5)] + [(5, 0.12)] * 16,
                                                  draft=[(9, 0.1)] + [(1, 0.02)] * 32))
            # A tree verifies 17 positions (16 nodes) most steps, fewer near the end.
            stats = _stats(14, 56, 50, [14] * 4, [14, 13, 12, 11], time_draft=1.5)
            results["runs"].append(_synthetic_run("tree", "quickdraft", category, prompt, 4.0, stats=stats,
                                                  target=[(9, 0.5)] + [(17, 0.15)] * 12 + [(6, 0.13)] * 2,
                                                  draft=[(9, 0.1)] + [(1, 0.02)] * 56))
    results["methods"] += [{"name": "default", "family": "quickdraft", "plain": False, "description": ""},
                           {"name": "tree", "family": "quickdraft", "plain": False, "description": ""}]
    rows = {(r["method"], r["category"]): r for r in summarize(results)["main"]}
    assert rows[("default", "all")]["lookup_share"] == pytest.approx(0.5)
    assert rows[("default", "code")]["c"] == pytest.approx(0.1)
    assert rows[("draft", "code")]["lookup_share"] is None
    assert rows[("tree", "code")]["v"] == pytest.approx(1.5)
    assert "lookup" in overall_table(summarize(results))


def test_summary_sweeps_pair_with_the_baseline_in_the_same_phase():
    results = _synthetic_results()
    for k, seconds in ((1, 6.0), (4, 4.0)):
        results["runs"].append(_synthetic_run("draft", "quickdraft", "code", "code/1", seconds, phase="k_sweep", k=k,
                                              stats=_stats(16, 16 * k, 8 * k, [16] * k, [8] * k)))
    results["runs"].append(_synthetic_run("hf-plain", "transformers", "code", "code/1", 8.0, phase="k_sweep"))
    for t, seconds in ((0.0, 5.0), (0.7, 10.0)):
        results["runs"].append(_synthetic_run("hf-plain", "transformers", "qa", "qa/1", 6.0, phase="temperature",
                                              temperature=t))
        results["runs"].append(_synthetic_run("draft", "quickdraft", "qa", "qa/1", seconds, phase="temperature",
                                              temperature=t, stats=_stats(16, 64, 32, [16] * 4, [8] * 4)))
    summary = summarize(results)
    sweep = {r["k"]: r for r in summary["k_sweep"]}
    assert sweep[1]["speedup"] == pytest.approx(8.0 / 6.0)
    assert sweep[4]["speedup"] == pytest.approx(2.0)
    temps = {(r["temperature"], r["category"]): r for r in summary["temperature"] if r["method"] == "draft"}
    assert temps[(0.0, "qa")]["speedup"] == pytest.approx(6.0 / 5.0)
    assert temps[(0.7, "all")]["speedup"] == pytest.approx(0.6)


def test_cpu_competition_is_measured_and_waiting_is_bounded():
    from quickdraft.bench.measure import other_cpu, wait_for_quiet

    with other_cpu() as figures:
        sum(range(10**5))
    assert figures["cores"] is None or figures["cores"] >= 0.0
    assert wait_for_quiet(0) == 0.0  # never waits when asked not to


# ---------------------------------------------------------------------------------------------
# Workloads


def test_every_category_loads_and_mt_bench_goes_round_robin():
    for category in CATEGORIES:
        prompts = load_category(category, 3)
        assert len(prompts) == 3 and all(p.category == category and p.text for p in prompts)
        assert len({p.id for p in prompts}) == 3
    kinds = load_category("mt_bench", 8)
    assert [p.id for p in kinds] == [f"spec_bench/{81 + 10 * i}" for i in range(8)]  # one of each kind
    assert len(load_category("writing", 20)) == 10  # an MT-Bench kind is a category too
    assert len(MT_BENCH_KINDS) == 8
    code = load_category("code", 1)[0]
    assert code.id == "humaneval/HumanEval/0" and "def has_close_elements" in code.text
    assert code.chat_text.startswith("Complete the following Python function")
    edit = load_category("code_edit", 2)
    solution = humaneval_problems()[1]["canonical_solution"]
    assert edit[1].id == "code_edit/HumanEval/1" and solution in edit[1].text and "type hints" in edit[1].text


def test_unknown_category_is_refused():
    with pytest.raises(InvalidParameterError, match="unknown category"):
        load_category("poetry", 1)


def test_prompts_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    lines = [{"prompt": "one", "category": "a"}, {"turns": ["two", "ignored"], "category": "a"},
             {"prompt": "three", "category": "a"}, {"token_ids": [1, 2, 3], "id": "x"}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    prompts = load_prompts_file(path, count=2)
    assert [(p.id, p.category, p.text) for p in prompts[:2]] == [("mine/1", "a", "one"), ("mine/2", "a", "two")]
    assert prompts[2] == Prompt("mine/x", "custom", token_ids=(1, 2, 3))
    assert load_workload(["qa"], 2, prompts_file=path) == prompts
    path.write_text('{"text": "no"}\n')
    with pytest.raises(InvalidParameterError, match="needs 'prompt'"):
        load_prompts_file(path)


def test_prompt_ids_with_and_without_chat_template():
    tokenizer = char_tokenizer(string.printable)
    tokenizer.chat_template = CHAT_TEMPLATE
    prompt = Prompt("p", "qa", text="hi")
    assert tokenizer.decode(prompt_ids(prompt, tokenizer, chat=True)) == "<user>hi\n<assistant>"
    assert tokenizer.decode(prompt_ids(prompt, tokenizer, chat=False)) == "hi"
    with pytest.raises(InvalidParameterError, match="no tokenizer"):
        prompt_ids(prompt, None, chat=False)


# ---------------------------------------------------------------------------------------------
# Whole runs on tiny models


def _tiny_pair(dtype: str, packed: bool = True, with_draft: bool = True):
    """A tiny target and draft (different random weights), in ``dtype``: the benchmark's loader."""
    target = make_tiny_model(seed=1, vocab_size=16, context=512, name="tiny-target")
    draft = make_tiny_model(seed=2, vocab_size=16, context=512, name="tiny-draft")
    return (load_model(target.module, dtype=dtype, pack_weights=packed),
            load_model(draft.module, dtype=dtype, pack_weights=packed) if with_draft else None)


@pytest.mark.skipif(not can_pack(torch.bfloat16, torch.device("cpu")), reason="no bfloat16 oneDNN kernels")
def test_the_transformers_methods_reload_only_the_packed_models():
    """A packed target is loaded again with stock layers; an int8 draft (never packed) is shared."""
    calls = []

    def loader(dtype: str, packed: bool, with_draft: bool):
        calls.append((dtype, packed, with_draft))
        target = load_model(make_tiny_model(seed=1, vocab_size=16).module, dtype=dtype, pack_weights=packed)
        return target, quantize(make_tiny_model(seed=2, vocab_size=16), "int8") if with_draft else None

    pair = loader("bfloat16", True, True)
    peer = _peer_pair(loader, "bfloat16", pair, TINY_CONFIG, log=lambda _: None)
    assert calls == [("bfloat16", True, True), ("bfloat16", False, False)]
    assert has_packed_layers(pair[0]) and not has_packed_layers(peer[0])
    assert peer[1] is pair[1]
    # A packed draft is loaded again too; stock models are not loaded again at all.
    packed_pair = _tiny_pair("bfloat16")
    assert all(m is not None and not has_packed_layers(m) for m in _peer_pair(_tiny_pair, "bfloat16", packed_pair,
                                                                             TINY_CONFIG, log=lambda _: None))
    calls.clear()
    assert _peer_pair(loader, "float32", loader("float32", False, True), TINY_CONFIG, log=lambda _: None) is None
    assert calls == [("float32", False, True)]


TINY_CONFIG = BenchConfig(
    max_new_tokens=12, k=3, k_sweep=(1, 3), k_sweep_categories=("a",), temperatures=(0.0, 0.8),
    temperature_categories=("b",), sweep_prompts=1, check_max_new_tokens=10, warmup_tokens=2,
    methods=("plain", "draft", "draft-adaptive", "tree", "default-tree", "ngram", "hf-plain", "hf-assisted",
             "hf-ngram"),
    tree_budget=5, tree_branch=2,
)


def test_run_benchmark_in_memory_and_outputs(tmp_path):
    prompts = [Prompt("t/1", "a", token_ids=(1, 2, 3, 1, 2, 3, 1)), Prompt("t/2", "a", token_ids=(4, 5, 6)),
               Prompt("t/3", "b", token_ids=(7, 7, 8, 9, 7, 7))]
    results = run_benchmark(_tiny_pair, prompts, TINY_CONFIG, progress=False, log=lambda _: None)
    main_runs = [r for r in results["runs"] if r["phase"] == "main"]
    n = len(TINY_CONFIG.methods)
    assert len(main_runs) == 3 * n
    assert all(r["new_tokens"] == 12 == len(r["token_ids"]) for r in results["runs"])
    assert {r["phase"] for r in results["runs"]} == {"main", "k_sweep", "temperature"}
    # interleaved: one prompt's methods run back to back, and the order rotates
    assert [r["prompt_id"] for r in main_runs[:n]] == ["t/1"] * n
    assert [r["method"] for r in main_runs[:n]] != [r["method"] for r in main_runs[n:2 * n]]
    # float32 check: every method decodes what plain decoding does
    check = results["check"]
    assert check["dtype"] == "float32" and len(check["comparisons"]) == 2 * (n - 1)
    assert all(c["verdict"] == "identical" for c in check["comparisons"])
    assert all(c["verdict"] in ("identical", "near-tie", "MISMATCH") for c in results["greedy_agreement"])
    # sampled runs reuse one seed per prompt for every method
    seeds = {(r["prompt_id"], r["method"]): r["seed"] for r in results["runs"] if r["temperature"] > 0}
    assert len(set(seeds.values())) == 1

    summary = write_outputs(results, tmp_path)
    assert summary["check"]["passed"] and summary["check"]["peer_passed"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["summary"]["baseline"] in ("plain", "hf-plain")
    rows = {(r["method"], r["category"]): r for r in saved["summary"]["main"]}
    assert rows[(saved["summary"]["baseline"], "all")]["speedup"] == pytest.approx(1.0)
    assert rows[("plain", "all")]["tokens_per_forward"] == 1.0
    assert rows[("draft", "a")]["mean_draft_length"] <= 3
    assert 0 <= rows[("draft", "all")]["acceptance_rate"] <= 1
    assert {r["k"] for r in saved["summary"]["k_sweep"]} == {1, 3}
    report = (tmp_path / "report.md").read_text()
    assert "## Speedup by category" in report and "hf-assisted" in report and "PASSED" in report
    for name in ("speedup_by_category", "k_sweep", "temperature", "acceptance_by_position"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_command_on_tiny_model_folders(tmp_path, capsys):
    target = save_tiny_model(tmp_path / "target", seed=1)
    draft = save_tiny_model(tmp_path / "draft", seed=2)
    out = tmp_path / "out"
    code = main(["bench", "--quick", "--target", target, "--draft", draft, "--categories", "qa,code",
                 "--max-new-tokens", "8", "--check-max-new-tokens", "6", "--temperature-categories", "qa",
                 "--output", str(out), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "Greedy check (float32" in printed and "PASSED" in printed and "Speedup over the fastest plain" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["environment"]["torch_threads"] >= 1 and results["environment"]["cpu"]
    assert results["models"]["target"]["dtype"] == "bfloat16"
    assert {p["category"] for p in results["prompts"]} == {"qa", "code"}
    assert results["config"]["chat"] is True
    assert (out / "report.md").exists() and (out / "k_sweep.png").exists()

    # the report can be rebuilt from results.json alone
    again = tmp_path / "again"
    assert main(["bench", "--report-from", str(out / "results.json"), "--output", str(again)]) == 0
    assert (again / "report.md").read_text() == (out / "report.md").read_text()


def test_the_tree_methods_draft_the_shape_asked_for(tiny_target, tiny_draft):
    from quickdraft.bench.methods import build_methods
    from quickdraft.drafters import PromptLookupFirst

    methods = build_methods(tiny_target, tiny_draft, ["tree", "default-tree"], peer=False, tree_budget=5, tree_branch=2)
    for method in methods:
        method.generate([1, 2, 3], SamplingParams(max_new_tokens=4), k=3)
        (decoder,) = method._decoders.values()
        assert decoder.tree == TreeSpec(budget=5, depth=3, branch=2)
        assert "5 nodes, branch 2" in method.description
    tree, default_tree = (m._decoders[3] for m in methods)
    # The default path keeps prompt lookup and the adaptive policy; the plain tree method drafts alone.
    assert not isinstance(tree.drafter, PromptLookupFirst) and isinstance(default_tree.drafter, PromptLookupFirst)
    assert isinstance(tree.policy, FixedK) and isinstance(default_tree.policy, AdaptiveK)


def test_bench_refuses_unknown_methods_and_categories(tmp_path, capsys):
    target = save_tiny_model(tmp_path / "target", seed=1)
    assert main(["bench", "--target", target, "--draft", "ngram", "--methods", "draft", "--check-dtype", "none",
                 "--output", str(tmp_path / "o"), "--no-progress", "--categories", "qa"]) == 2
    assert "unknown or unavailable method" in capsys.readouterr().err
    assert main(["bench", "--target", target, "--categories", "poetry", "--output", str(tmp_path / "o")]) == 2
    assert "unknown category" in capsys.readouterr().err


@pytest.mark.parametrize("lean", [True, False])
def test_forward_timer_counts_each_forward_once_whichever_module_is_called(lean):
    from quickdraft.bench.measure import ForwardTimer
    from quickdraft.runner import ModelRunner

    # A Llama runs its lean forward alone; a sliding-window Qwen2 the whole model (its decoder
    # call nested), then the decoder alone.
    model = make_tiny_model(seed=1, vocab_size=16) if lean else make_tiny_qwen2(seed=1, sliding_window=4)
    assert (model.lean is not None) == lean
    timer = ForwardTimer({"draft": model.forward_modules()})
    runner = ModelRunner(model)
    with timer.recording() as calls:
        runner.forward([1, 2, 3])
        runner.restrict_vocabulary(torch.arange(8))
        runner.forward([4])
    assert [(label, positions) for label, positions, _ in calls] == [("draft", 3), ("draft", 1)]
    assert all(seconds > 0 for _, _, seconds in calls)


def test_plain_decoding_in_other_formats_joins_the_baseline_candidates():
    calls = []

    def loader(dtype: str, pack: bool | None, with_draft: bool):
        calls.append((dtype, pack, with_draft))
        return _tiny_pair(dtype, pack, with_draft)

    config = replace(TINY_CONFIG, methods=("plain", "draft"), plain_formats=("float32", "bfloat16"), peer=False,
                     k_sweep=(), temperatures=(), check_dtype=None)
    results = run_benchmark(loader, [Prompt("t/1", "a", token_ids=(1, 2, 3, 1, 2))], config, progress=False,
                            log=lambda _: None)
    assert calls[1:] == [("float32", False, False), ("bfloat16", False, False)]
    assert {m["name"] for m in results["methods"]} == {"plain", "draft", "plain-float32", "plain-bfloat16"}
    assert all(m["plain"] for m in results["methods"] if m["name"].startswith("plain"))
    assert "bfloat16" in next(m["description"] for m in results["methods"] if m["name"] == "plain-bfloat16")
    assert results["baseline"] in ("plain", "plain-float32", "plain-bfloat16")
    with pytest.raises(InvalidParameterError, match="unknown plain format"):
        replace(TINY_CONFIG, plain_formats=("int4",))
