"""``quickdraft export``: a doctor report (written by the real doctor on tiny models) turned into each
engine's configuration, checked against the option names the engines document
(tests/fixtures/engine_flags.json), and transformers' keyword arguments run through generate()."""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig

from conftest import make_tiny_model
from quickdraft.bench.doctor import DoctorConfig, DoctorPrompt, diagnose
from quickdraft.bench.export import ENGINES, WRITERS, SpecPlan, TreeShape
from quickdraft.cli import main

FLAGS = json.loads((Path(__file__).parent / "fixtures" / "engine_flags.json").read_text())
FAST = DoctorConfig(context=256, max_new_tokens=8, temperatures=(0.0, 0.7), max_k=4, repeats=1)
PLANS = {
    "draft": SpecPlan("org/target", "org/draft", 4, lookup_first=True),
    "ngram": SpecPlan("org/target", None, 6),
    "tree, int8": SpecPlan("org/target", "org/draft", 3, tree=TreeShape(budget=8, depth=3, branch=2), draft_quantization="int8",
                           lookup_first=True),
}


@pytest.fixture(scope="module")
def doctor_report() -> dict:
    """What ``quickdraft doctor --json`` prints for a tiny pair (the same dict, through JSON)."""
    target = make_tiny_model(seed=1, vocab_size=16, context=256, name="t")
    draft = make_tiny_model(seed=2, vocab_size=16, context=256, hidden_size=8, num_layers=1, name="d")
    prompts = [DoctorPrompt("code", (1, 2, 3, 4)), DoctorPrompt("prose", (5, 6, 7))]
    return json.loads(json.dumps(diagnose(target, draft, FAST, prompts), default=str))


def doctor_file(tmp_path: Path, report: dict) -> str:
    path = tmp_path / "doctor.json"
    path.write_text(json.dumps(report))
    return str(path)


def run_export(capsys, *args: str) -> dict:
    assert main(["export", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# -- each engine's documented syntax -------------------------------------------------------------------


def options(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("-")]


@pytest.mark.parametrize("kind", PLANS)
def test_vllm_speculative_config_uses_documented_keys(kind):
    plan, spec = PLANS[kind], FLAGS["vllm"]
    argv = shlex.split(WRITERS["vllm"](plan).command)
    assert argv[:3] == [*spec["command"], "org/target"] and argv[3] == spec["flag"] and len(argv) == 5
    config = json.loads(argv[4])
    assert set(config) <= set(spec["keys"]) and config["method"] in spec["methods"]
    assert config["num_speculative_tokens"] == plan.k
    if plan.draft:
        assert config == {"method": "draft_model", "model": "org/draft", "num_speculative_tokens": plan.k}
    else:
        assert config["method"] == "ngram" and config["prompt_lookup_max"] >= config["prompt_lookup_min"] >= 1


@pytest.mark.parametrize("kind", PLANS)
def test_sglang_flags_are_documented(kind):
    plan, spec = PLANS[kind], FLAGS["sglang"]
    argv = shlex.split(WRITERS["sglang"](plan).command)
    assert argv[:3] == spec["command"] and set(options(argv[3:])) <= set(spec["flags"])
    values = dict(zip(argv[3::2], argv[4::2]))
    assert values["--model-path"] == "org/target" and values["--speculative-algorithm"] in spec["algorithms"]
    if plan.tree:  # depth, branching, and the tree's nodes plus the last accepted token
        assert (values["--speculative-num-steps"], values["--speculative-eagle-topk"],
                values["--speculative-num-draft-tokens"]) == ("3", "2", "9")
    elif plan.draft:  # a chain: one candidate per step, K drafts + the last accepted token verified
        assert (values["--speculative-num-steps"], values["--speculative-eagle-topk"],
                values["--speculative-num-draft-tokens"]) == ("4", "1", "5")
    else:
        assert values["--speculative-algorithm"] == "NGRAM" and values["--speculative-num-draft-tokens"] == "7"


@pytest.mark.parametrize("kind", PLANS)
def test_llama_cpp_flags_are_current_and_documented(kind):
    plan, spec = PLANS[kind], FLAGS["llama.cpp"]
    argv = shlex.split(WRITERS["llama.cpp"](plan).command)
    assert argv[:1] == spec["command"] and set(options(argv)) <= set(spec["flags"])
    assert not set(options(argv)) & set(spec["removed"])
    values = dict(zip(argv[1::2], argv[2::2]))
    assert values["-m"] == "org/target"
    assert set(values["--spec-type"].split(",")) <= set(spec["spec_types"])
    if plan.draft:  # quickdraft's lookup in front of the draft: llama-server mixes the two
        assert values["-md"] == "org/draft" and values["--spec-draft-n-max"] == str(plan.k)
        assert values["--spec-type"] == "ngram-simple,draft-simple"
    else:
        assert values["--spec-type"] == "ngram-simple" and values["--spec-ngram-simple-size-m"] == str(plan.k)


@pytest.mark.parametrize("kind", PLANS)
def test_transformers_kwargs_are_generation_config_fields(kind):
    export = WRITERS["transformers"](PLANS[kind])
    ast.parse(export.command)  # the snippet is Python
    assert set(export.settings) <= set(FLAGS["transformers"]["generate_kwargs"])
    config = GenerationConfig(**export.settings)
    assert all(getattr(config, name) == value for name, value in export.settings.items())


@pytest.mark.parametrize("kind", ["draft", "ngram"])
def test_transformers_kwargs_drive_generate_losslessly(kind):
    """The exported kwargs, given to generate() with tiny models: greedy output = the target alone."""
    export = WRITERS["transformers"](PLANS[kind])
    target = make_tiny_model(seed=1, vocab_size=16, context=64).module
    prompt = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])
    extra = {"assistant_model": make_tiny_model(seed=2, vocab_size=16, context=64).module} if kind == "draft" else {}
    common = {"max_new_tokens": 12, "do_sample": False, "eos_token_id": None, "pad_token_id": 0}
    plain = target.generate(prompt, **common)
    speculative = target.generate(prompt, **common, **extra, **export.settings)
    assert torch.equal(plain, speculative)


def test_what_does_not_carry_over_is_said_per_engine():
    plan = PLANS["tree, int8"]
    lost = {engine: " ".join(WRITERS[engine](plan).lost) for engine in ENGINES}
    for engine in ("vllm", "llama.cpp", "transformers"):
        assert "tree does not carry over" in lost[engine]
    assert "tree" not in lost["sglang"]  # SGLang grows trees: depth, branching and node budget are exported
    assert all("int8 weights" in text for text in lost.values())
    for engine in ("vllm", "sglang", "transformers"):
        assert "prompt lookup in front of the draft model does not carry over" in lost[engine]
    assert "prompt lookup" not in lost["llama.cpp"]
    assert all(not WRITERS[engine](PLANS["ngram"]).lost for engine in ENGINES)


# -- from the doctor's JSON ------------------------------------------------------------------------------


def test_doctor_recommendation_is_exported(doctor_report, tmp_path, capsys):
    path = doctor_file(tmp_path, dict(doctor_report, recommended_k=3, recommended_speedup=1.8))
    out = run_export(capsys, "--to", "vllm", "org/t", "org/d", "--from-doctor", path)
    assert out["settings"] == {"method": "draft_model", "model": "org/d", "num_speculative_tokens": 3}
    assert out["plan"]["predicted_speedup"] == 1.8 and "the doctor measured t with draft d" in out["decided"][0]
    assert run_export(capsys, "--to", "vllm", "org/t", "org/d", "--from-doctor", path,
                      "-k", "7")["settings"]["num_speculative_tokens"] == 7  # -k wins


def test_a_tree_the_doctor_predicts_to_pay_goes_to_sglang(doctor_report, tmp_path, capsys):
    rows = [dict(row, gain=0.2 if row["kind"] == "all" else -0.1) for row in doctor_report["tree_predictions"]]
    report = dict(doctor_report, recommended_speedup=1.5, tree_predictions=rows)
    tree = min((r for r in rows if r["kind"] == "all"), key=lambda r: float(r["temperature"]))["tree"]
    out = run_export(capsys, "--to", "sglang", "org/t", "org/d", "--from-doctor", doctor_file(tmp_path, report))
    assert out["plan"]["tree"] == {"budget": tree["budget"], "depth": tree["depth"], "branch": tree["branch"]}
    assert out["settings"]["--speculative-num-steps"] == tree["depth"]
    assert out["settings"]["--speculative-eagle-topk"] == tree["branch"]
    assert out["settings"]["--speculative-num-draft-tokens"] == tree["budget"] + 1
    no_gain = doctor_file(tmp_path, dict(report, tree_predictions=[dict(r, gain=0.01) for r in rows]))
    assert run_export(capsys, "--to", "sglang", "org/t", "org/d", "--from-doctor", no_gain)["plan"]["tree"] is None


@pytest.mark.parametrize("change, reason", [
    ({"recommended_speedup": 0.8}, "SLOWER than the target alone"),
    ({"usable": False}, "tokenizers differ"),
])
def test_a_draft_the_doctor_advises_against_is_exported_as_ngram(doctor_report, tmp_path, capsys, change, reason):
    path = doctor_file(tmp_path, dict(doctor_report, **change))
    out = run_export(capsys, "--to", "llama.cpp", "t.gguf", "d.gguf", "--from-doctor", path)
    assert out["plan"]["draft"] is None and out["settings"]["--spec-type"] == "ngram-simple"
    assert any(reason in line for line in out["decided"])


def test_defaults_and_text_output(capsys):
    assert main(["export", "--to", "sglang", "org/t", "ngram"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# sglang: n-gram lookup, K=5 (from quickdraft's defaults)")
    assert "--speculative-algorithm NGRAM" in text and "Check:" in text and "CUDA only" in text


@pytest.mark.parametrize("content, message", [
    (None, "cannot read"),
    ("not json", "is not JSON"),
    ('{"usable": true}', "is not the output of 'quickdraft doctor --json'"),
    ("[1, 2]", "is not the output of 'quickdraft doctor --json'"),
])
def test_bad_doctor_files_get_clear_errors(tmp_path, capsys, content, message):
    path = tmp_path / "doctor.json"
    if content is not None:
        path.write_text(content)
    assert main(["export", "--to", "vllm", "t", "d", "--from-doctor", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_bad_arguments_get_clear_errors(capsys):
    assert main(["export", "--to", "vllm", "t", "none"]) == 2
    assert "nothing to export for plain decoding" in capsys.readouterr().err
    assert main(["export", "--to", "vllm", "t", "d", "-k", "0"]) == 2
    assert "-k must be >= 1" in capsys.readouterr().err
