"""The pair doctor on tiny models: verdicts, measured figures, predictions, exit codes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from conftest import char_tokenizer, make_tiny_model, requires_demo
from quickdraft.bench.doctor import (
    EXIT_INCOMPATIBLE,
    EXIT_OK,
    DoctorConfig,
    DoctorPrompt,
    diagnose,
    format_report,
    measure_acceptance,
    measure_costs,
    predicted_speedup,
    read_report,
    why_it_cannot_pay,
)
from quickdraft import SamplingParams, SpeculativeDecoder
from quickdraft.bench.measure import reset_peak_rss
from quickdraft.cli import main
from quickdraft.drafters.vocabulary import draft_vocabulary
from quickdraft.runner import ModelRunner
from quickdraft.models.base import LoadedModel
from helpers import save_tiny_model

FAST = DoctorConfig(context=256, max_new_tokens=8, temperatures=(0.0, 0.7), max_k=4, repeats=1)
PROMPTS = [DoctorPrompt("code", (1, 2, 3, 4)), DoctorPrompt("prose", (5, 6, 7))]


def test_predicted_speedup_is_the_textbook_formula_when_verifying_is_free():
    assert predicted_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / ((1 - 0.8) * (4 * 0.1 + 1)))
    assert predicted_speedup(0.8, 4, 0.1, v=1.5) == pytest.approx((1 - 0.8**5) / ((1 - 0.8) * (4 * 0.1 + 1.5)))
    assert predicted_speedup(1.0, 3, 0.0) == 4.0


def test_compatible_pair_gets_costs_acceptance_and_a_recommended_k(tmp_path):
    target = make_tiny_model(seed=1, vocab_size=16, context=256, name="t")
    draft = make_tiny_model(seed=2, vocab_size=16, context=256, hidden_size=8, num_layers=1, name="d")
    report = diagnose(target, draft, FAST, PROMPTS)
    assert report["usable"] and report["tokenizers"]["compatible"]
    assert report["parameters"]["ratio"] == pytest.approx(draft.num_parameters() / target.num_parameters())
    memory = report["memory"]
    assert memory["target_kv"] == 256 * 2 * 2 * 1 * 8 * 4  # tokens x K,V x layers x kv heads x head dim x fp32
    assert memory["total"] == sum(memory[k] for k in ("target_weights", "draft_weights", "target_kv", "draft_kv"))
    costs = report["costs"]
    assert costs["c"] == pytest.approx(costs["draft_step"] / costs["target_step"])
    assert sorted(costs["v"]) == [1, 2, 3, 4]
    acceptance = report["acceptance"]
    assert acceptance["positions"] == {"code": 8, "prose": 8}
    for row in acceptance["by_temperature"].values():
        assert set(row) == {"code", "prose", "all"} and all(0.0 <= a <= 1.0 for a in row.values())
    assert {(p["temperature"], p["kind"]) for p in report["predictions"]} == {
        (t, kind) for t in (0.0, 0.7) for kind in ("code", "prose", "all")}
    assert 1 <= report["recommended_k"] <= 4
    text = format_report(report)
    assert "Predicted speedup" in text and f"K={report['recommended_k']}" in text
    # Trees: one prediction per row of the chain table, from hits that are probabilities.
    assert sorted(costs["tree_verify"]) == [12, 16, 24, 32] and sorted(costs["draft_level"]) == [1, 2, 4, 8]
    trees = report["tree_predictions"]
    assert [(r["temperature"], r["kind"]) for r in trees] == [(p["temperature"], p["kind"]) for p in report["predictions"]]
    for row in trees:
        assert len(row["hits"]) == FAST.ranks and all(0 <= h <= 1 for h in row["hits"]) and sum(row["hits"]) <= 1 + 1e-6
        assert row["tree"]["branch"] >= 2 and row["free_width_tree"]["speedup"] >= row["tree"]["speedup"] - 1e-9
        assert row["chain"]["branch"] == 1 and row["gain"] == pytest.approx(row["tree"]["speedup"] / row["chain"]["speedup"] - 1)
    # At T = 0 the draft's first choice is taken exactly when its argmax agrees.
    greedy = acceptance["rank_hits"][0.0]
    assert greedy["all"][0] == pytest.approx(acceptance["by_temperature"][0.0]["all"])
    assert "Predicted trees" in text and "tree" in report["verdicts"][-1][1]
    # --json's file gives the same text report back (JSON turns the numeric keys into strings)
    (tmp_path / "report.json").write_text(json.dumps(report, default=str))
    assert format_report(read_report(tmp_path / "report.json")) == text


def test_a_draft_identical_to_the_target_is_always_accepted():
    target = make_tiny_model(seed=3, vocab_size=16, context=256)
    twin = make_tiny_model(seed=3, vocab_size=16, context=256)
    report = diagnose(target, twin, FAST, PROMPTS)
    assert report["acceptance"]["by_temperature"][0.0]["all"] == 1.0
    assert report["acceptance"]["by_temperature"][0.7]["all"] == pytest.approx(1.0, abs=1e-5)
    # Its first choice is always the target's: a sibling is never taken, so no tree beats the chain.
    assert report["acceptance"]["rank_hits"][0.0]["all"] == [1.0] + [0.0] * (FAST.ranks - 1)
    greedy = next(r for r in report["tree_predictions"] if r["temperature"] == 0.0 and r["kind"] == "all")
    assert greedy["gain"] <= 1e-9
    assert "trees are not predicted to pay" in report["verdicts"][-1][1]


def test_tokenizer_mismatch_is_a_verdict_not_a_crash():
    # A draft with another tokenizer is measured (tests/test_cross_tokenizer.py) unless the two
    # vocabularies share too little: here the space alone.
    a, b = char_tokenizer("abcd "), char_tokenizer("wxyz ")
    target = make_tiny_model(seed=1, vocab_size=len(a))
    draft = make_tiny_model(seed=2, vocab_size=len(b))
    report = diagnose(LoadedModel(target.module, a, "ta"), LoadedModel(draft.module, b, "tb"), FAST, PROMPTS)
    assert not report["usable"] and not report["tokenizers"]["compatible"]
    assert "shares only 1 text tokens" in report["tokenizers"]["detail"]  # the figure
    assert report["verdicts"][0][0] == "error" and "--draft ngram" in report["verdicts"][0][1]
    assert "costs" not in report and "memory" in report
    assert "INCOMPATIBLE" in format_report(report)


def test_doctor_command_exit_codes(tmp_path, capsys):
    target = save_tiny_model(tmp_path / "target", seed=1)
    draft = save_tiny_model(tmp_path / "draft", seed=2)
    other = save_tiny_model(tmp_path / "other", seed=3, alphabet="αβγδεζηθ ")  # shares the space alone
    fast = ["--max-new-tokens", "4", "--repeats", "1", "--max-k", "3", "--temperatures", "0,1", "--context", "512"]
    assert main(["doctor", target, draft, *fast, "--json"]) == EXIT_OK
    printed = capsys.readouterr().out
    report = json.loads(printed)
    assert report["usable"] and report["recommended_k"] in (1, 2, 3)
    assert report["memory"]["context"] == 512
    (tmp_path / "report.json").write_text(printed)
    assert main(["doctor", "--report-from", str(tmp_path / "report.json")]) == EXIT_OK
    assert "Predicted speedup" in capsys.readouterr().out
    assert main(["doctor", target]) == 2  # a draft is needed unless --report-from
    assert main(["doctor", target, other, *fast]) == EXIT_INCOMPATIBLE
    out = capsys.readouterr().out
    assert "INCOMPATIBLE" in out and "shares only 1 text tokens" in out
    assert main(["doctor", target, str(tmp_path / "missing")]) == 2


@pytest.mark.real_model
@requires_demo("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct")
def test_doctor_on_demo_models_with_different_tokenizers(capsys):
    code = main(["doctor", "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "--max-new-tokens", "8",
                 "--repeats", "1", "--max-k", "3", "--temperatures", "0,1"])
    assert code == EXIT_OK
    assert "different vocabularies sharing" in capsys.readouterr().out


def test_acceptance_takes_the_draft_over_the_vocabulary_generation_gives_it():
    # A twin of the target agrees with it wherever the target's greedy token is among the
    # draft's rows (its most frequent tokens, the special ones and the prompt's), nowhere else.
    target = make_tiny_model(seed=3, vocab_size=16, context=256)
    twin = make_tiny_model(seed=3, vocab_size=16, context=256)
    config = DoctorConfig(max_new_tokens=12, temperatures=(0.0,))
    prompts = [DoctorPrompt("code", (1, 2, 3, 4)), DoctorPrompt("prose", (5, 6, 7))]
    inside = total = 0
    for prompt in prompts:
        rows = set(draft_vocabulary(twin, 2, prompt.token_ids).tolist())
        out = SpeculativeDecoder(target, None).generate(list(prompt.token_ids), SamplingParams(max_new_tokens=12)).token_ids
        inside += sum(token in rows for token in out)
        total += len(out)
    assert 0 < inside < total, "the seed must put some greedy tokens outside the rows"
    restricted = measure_acceptance(target, twin, prompts, config, vocabulary_size=2)
    assert restricted["by_temperature"][0.0]["all"] == pytest.approx(inside / total)
    assert measure_acceptance(target, twin, prompts, config)["by_temperature"][0.0]["all"] == 1.0


def test_draft_cost_is_timed_over_the_draft_vocabulary(monkeypatch):
    target = make_tiny_model(seed=1, vocab_size=16, context=256)
    draft = make_tiny_model(seed=2, vocab_size=16, context=256, hidden_size=8, num_layers=1)
    restricted = []  # (model, rows) of every runner the doctor times
    original = ModelRunner.restrict_vocabulary
    def record(self, rows):
        restricted.append((self.model, None if rows is None else rows.tolist()))
        original(self, rows)
    monkeypatch.setattr(ModelRunner, "restrict_vocabulary", record)
    costs = measure_costs(target, draft, [1, 2, 3], max_k=2, repeats=1, vocabulary_size=2,
                          tree_positions=(6,), level_nodes=(2,))
    assert costs["c"] == pytest.approx(costs["draft_step"] / costs["target_step"])
    rows = draft_vocabulary(draft, 2, [1, 2, 3]).tolist()
    # The target's chain and tree forwards over every row, the draft's step and level over its own.
    assert restricted == [(target, None), (draft, rows)]
    assert sorted(costs["tree_verify"]) == [6] and sorted(costs["draft_level"]) == [1, 2]
    assert costs["draft_level"][1] == costs["draft_step"]


def test_the_report_states_the_machine_and_what_dtype_auto_chose_there():
    target = make_tiny_model(seed=1, vocab_size=16, context=256, name="t")
    report = diagnose(target, make_tiny_model(seed=2, vocab_size=16, context=256, name="d"), FAST, PROMPTS)
    assert report["hardware"]["isa_level"] and report["machine_config"]["dtype"] in ("float32", "bfloat16")
    assert report["memory"]["peak_rss"] > 0
    text = format_report(report)
    assert "Machine      " in text and "dtype=auto here" in text and "peak resident memory" in text


def test_the_memory_limit_bounds_what_the_models_hold_above_the_runtime(monkeypatch):
    """Peak RSS 10 GiB for 2 GiB of target weights: 5x for the process, but the models and their
    forwards hold 1.25x above a runtime of 7.5 GiB (no warning) and 4.75x above 0.5 GiB (warned)."""
    import quickdraft.bench.doctor as doctor
    monkeypatch.setattr(doctor, "peak_rss_bytes", lambda: 10 * 2**30)
    monkeypatch.setattr(doctor, "weight_bytes", lambda model: 2 * 2**30)
    target = make_tiny_model(seed=1, vocab_size=16, context=256, name="t")
    draft = make_tiny_model(seed=2, vocab_size=16, context=256, name="d")
    fast = replace(FAST, temperatures=(0.0,))
    warnings = lambda report: [t for level, t in report["verdicts"] if "at the peak" in t]  # noqa: E731
    within = diagnose(target, draft, fast, PROMPTS, rss_before=int(7.5 * 2**30))
    assert warnings(within) == []
    assert "of it 2.50 GiB (1.25x) models, caches and forwards" in format_report(within)
    beyond = diagnose(target, draft, fast, PROMPTS, rss_before=2**29)
    assert warnings(beyond) == ["the models and their forwards held 9.5 GiB at the peak, 4.8x the target's weights"]
    unknown = diagnose(target, draft, fast, PROMPTS)
    assert warnings(unknown) == ["this process held 10.0 GiB at the peak, 5.0x the target's weights"]


def test_the_memory_peak_leaves_out_the_one_time_work_before_the_models_load(tmp_path, capsys, monkeypatch):
    """The machine probe (1 GiB of layers where none is cached) runs before the models load: a
    spike there is not what the pair holds, so the peak the verdict reads starts after it."""
    import quickdraft.cli_common as cli_common
    if not reset_peak_rss():
        pytest.skip("this kernel does not let a process reset its peak resident memory")
    spike = 512 * 2**20

    def probing_machine(device):
        torch.ones(spike // 4).sum()  # touched, then freed (a block that size is unmapped)

    monkeypatch.setattr(cli_common, "report_machine", probing_machine)
    target = save_tiny_model(tmp_path / "target", seed=1)
    draft = save_tiny_model(tmp_path / "draft", seed=2)
    fast = ["--max-new-tokens", "4", "--repeats", "1", "--max-k", "2", "--temperatures", "0", "--context", "256"]
    assert main(["doctor", target, draft, *fast, "--json"]) == EXIT_OK
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory["peak_rss"] - memory["rss_before"] < spike / 2


def test_a_time_budget_keeps_one_prompt_of_each_kind_and_bounds_the_timing_rounds():
    target = make_tiny_model(seed=1, vocab_size=16, context=256, name="t")
    draft = make_tiny_model(seed=2, vocab_size=16, context=256, name="d")
    prompts = [DoctorPrompt("code", (1, 2, 3)), DoctorPrompt("code", (2, 3, 4)),
               DoctorPrompt("prose", (5, 6, 7)), DoctorPrompt("prose", (6, 7, 8))]
    heard = []
    acceptance = measure_acceptance(target, draft, prompts, replace(FAST, time_budget=0.0), log=heard.append)
    assert acceptance["prompts"] == 2 and set(acceptance["positions"]) == {"code", "prose"}
    assert heard[0].startswith("acceptance: prompt 1/4 (code") and heard[1].startswith("acceptance: prompt 2/4 (prose")
    heard.clear()
    measure_costs(target, draft, [1, 2, 3], 2, repeats=9, budget=0.0, log=heard.append)
    assert [line.split(": ")[1].split(" (")[0] for line in heard] == ["warm-up", "round 1/2", "round 2/2"] * 2


def test_a_pair_that_cannot_pay_is_told_why_in_numbers():
    costs = {"c": 0.2, "v": {1: 1.68}}
    assert why_it_cannot_pay(0.6, costs) == (
        "verifying 2 positions costs 1.68 target steps and a draft step 0.20, so one drafted token pays only if "
        "accepted more than 88% of the time (measured: 60%)")
