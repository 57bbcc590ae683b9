"""EAGLE heads: the target's features, training, drafting, losslessness, checkpoints, the CLI."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from transformers import DynamicCache

from conftest import chi_square_p_value, char_tokenizer, make_tiny_model
from quickdraft import CheckpointMismatchError, FixedK, InvalidParameterError, SamplingParams, SpeculativeDecoder, TreeSpec
from quickdraft.bench.workloads import CATEGORIES, MT_BENCH_KINDS, load_category
from quickdraft.cli import main
from quickdraft.drafters import EagleDrafter, EagleHead, load_eagle_head
from quickdraft.drafters.eagle_head import head_decoder_config
from quickdraft.drafters.head_checkpoint import save_head
from quickdraft.runner import ModelRunner
from quickdraft.training import TrainConfig, train_drafter
from quickdraft.training import features as features_module
from quickdraft.training import trainer as trainer_module
from quickdraft.training.data import pack_chunks, training_prompts
from helpers import (CONFIG, LENGTH, PROMPT, assert_greedy_output_is_the_target_s, greedy_acceptance, quiet,
                     random_documents, sample_counts, target_samples)
from conftest import exact_continuation_probs

@pytest.fixture(scope="module")
def documents(tiny_target) -> list[list[int]]:
    return target_samples(tiny_target, seed=0)


@pytest.fixture(scope="module")
def trained(tiny_target, documents, tmp_path_factory):
    """(folder, training record) of a head trained for ``tiny_target``."""
    folder = tmp_path_factory.mktemp("eagle")
    record = train_drafter(tiny_target, [documents], folder, CONFIG, progress=False, log=quiet)
    return folder, record


@pytest.fixture(scope="module")
def untrained(tiny_target, tmp_path_factory):
    """A randomly initialised head for ``tiny_target``, saved as a checkpoint."""
    folder = tmp_path_factory.mktemp("untrained")
    torch.manual_seed(0)
    save_head(EagleHead(head_decoder_config(tiny_target.module.config)), tiny_target, folder, {})
    return folder


# ---- the target's features -----------------------------------------------------------------


def test_the_runner_keeps_features_aligned_with_its_cache(tiny_target):
    sequence = [3, 1, 4, 1, 5, 2, 6, 5, 3, 5]
    with torch.inference_mode():
        fresh = tiny_target.module.get_decoder()(input_ids=torch.tensor([sequence])).last_hidden_state[0]  # [L, H]
    plain, runner = ModelRunner(tiny_target), ModelRunner(tiny_target, keep_features=True)
    runner.forward(sequence[:4])
    runner.forward_tail(sequence[:6] + [7, 7])  # two tokens that get rolled back
    logits = runner.forward_tail(sequence, num_logits=3)
    assert torch.allclose(runner.features(len(sequence)), fresh, atol=1e-5)
    # Keeping the features computes the same logits (the decoder and the output layer, in turn),
    # fed as the runner above was.
    plain.forward(sequence[:4])
    plain.forward_tail(sequence[:6] + [7, 7])
    assert torch.allclose(plain.forward_tail(sequence, num_logits=3), logits, atol=1e-6)


def test_a_tree_keeps_the_features_of_its_accepted_path(tiny_target):
    sequence, tokens, parents = [3, 1, 4], [5, 6, 2, 7], [-1, -1, 1, 2]  # path 1 -> 2 -> 3: 6 2 7
    runner = ModelRunner(tiny_target, keep_features=True)
    runner.forward(sequence[:-1])
    runner.forward_tree(sequence, tokens, parents, num_logits=len(tokens) + 1)
    runner.keep_tree_path([1, 2, 3])
    path = sequence + [6, 2, 7]
    with torch.inference_mode():
        fresh = tiny_target.module.get_decoder()(input_ids=torch.tensor([path])).last_hidden_state[0]
    assert runner.cached_ids == path
    assert torch.allclose(runner.features(len(path)), fresh, atol=1e-5)


# ---- training --------------------------------------------------------------------------------


def test_training_lowers_the_loss_and_raises_acceptance(tiny_target, trained, untrained):
    folder, record = trained
    history = record["history"]
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]
    assert history[-1]["loss"] < 0.7 * history[0]["loss"]
    assert history[-1]["top1_agreement"] > history[0]["top1_agreement"] + 0.15
    prompts = random_documents(1, count=6, length=5)
    # About 0.45 against 0.12 for a random head.
    assert greedy_acceptance(tiny_target, folder, prompts) > greedy_acceptance(tiny_target, untrained, prompts) + 0.2
    config = json.loads((folder / "config.json").read_text())
    assert config["target"]["name"] == "tiny-target" and config["training"]["epochs_done"] == 4


def test_an_interrupted_run_resumes_where_it_stopped(tiny_target, documents, trained, tmp_path, monkeypatch):
    shards, steps = [], []
    real_save, real_loss = features_module._save_atomic, trainer_module._loss

    def save_then_stop(tensors, path):  # the second feature shard never gets written
        if path.name.startswith("features"):
            if len(shards) == 1:
                raise KeyboardInterrupt
            shards.append(path)
        real_save(tensors, path)

    def loss_then_stop(*args):  # training stops during the 13th step (checkpoints every 5)
        if len(steps) == 12:
            raise KeyboardInterrupt
        steps.append(1)
        return real_loss(*args)

    monkeypatch.setattr(features_module, "SHARD_TOKENS", 1024)
    documents = [documents]
    monkeypatch.setattr(features_module, "_save_atomic", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        train_drafter(tiny_target, documents, tmp_path, CONFIG, progress=False, log=quiet)
    first_shard = shards[0].stat().st_mtime_ns
    monkeypatch.setattr(features_module, "_save_atomic", real_save)
    monkeypatch.setattr(trainer_module, "_loss", loss_then_stop)
    messages: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        train_drafter(tiny_target, documents, tmp_path, CONFIG, progress=False, log=messages.append)
    assert messages[0].startswith("found 1 of 4 feature shards")
    monkeypatch.setattr(trainer_module, "_loss", real_loss)
    messages.clear()
    record = train_drafter(tiny_target, documents, tmp_path, CONFIG, progress=False, log=messages.append)
    assert shards[0].stat().st_mtime_ns == first_shard  # collected once
    assert messages[0].startswith("found 4 of 4 feature shards")
    assert messages[1] == "resuming training at epoch 1, step 10"
    # The resumed run is the uninterrupted one: same data order, noise and optimizer state.
    for resumed, whole in zip(record["history"], trained[1]["history"]):
        assert resumed["loss"] == pytest.approx(whole["loss"], rel=1e-4)
    with pytest.raises(CheckpointMismatchError, match="new --out"):
        train_drafter(tiny_target, [random_documents(5)], tmp_path, CONFIG, progress=False, log=quiet)


def test_unrolled_training_learns_the_later_steps(tiny_target, documents, tmp_path):
    config = dataclasses.replace(CONFIG, unroll=3, anchors=16)
    record = train_drafter(tiny_target, [documents], tmp_path, config, progress=False, log=quiet)
    first, last = record["history"][0], record["history"][-1]
    assert last["later_top1_agreement"] > first["later_top1_agreement"] + 0.1
    assert last["top1_agreement"] > first["top1_agreement"] + 0.1


def test_the_head_s_mlp_is_narrower_than_the_target_s_unless_asked(tiny_target):
    target_config = tiny_target.module.config
    hidden, width = target_config.hidden_size, target_config.intermediate_size
    assert head_decoder_config(target_config).intermediate_size == min(width, 4 * hidden // 3)
    assert head_decoder_config(target_config, 24).intermediate_size == 24
    assert head_decoder_config(target_config).num_hidden_layers == 1


@pytest.mark.parametrize("setting, message", [
    ({"intermediate_size": 0}, "feature_weight >= 0"), ({"feature_weight": -1.0}, "feature_weight >= 0"),
    ({"batch_size": 0}, "feature_weight >= 0"), ({"unroll": 0}, "unroll, heads, anchors"),
    ({"anchors": 0}, "unroll, heads, anchors"), ({"unroll": 8, "seq_len": 8}, "chunks of more than 8 tokens"),
    ({"kind": "medusa", "heads": 0}, "unroll, heads, anchors"), ({"kind": "medusa", "unroll": 2}, "apply to EAGLE"),
    ({"kind": "medusa", "heads": 8, "seq_len": 8}, "chunks of more than 8"), ({"kind": "hydra"}, "'eagle' or 'medusa'"),
])
def test_impossible_training_settings_are_refused(setting, message):
    with pytest.raises(InvalidParameterError, match=message):
        TrainConfig(**setting)


def test_unrolled_steps_compute_what_drafting_computes(tiny_target):
    """Step k of the training-time test, node by node, against the head run as ``EagleDrafter``
    runs it: the anchor's prefix with the target's features, then one position a token, fed
    the previous position's output, in the same cache."""
    torch.manual_seed(0)
    head = EagleHead(head_decoder_config(tiny_target.module.config)).float().eval()
    length, hidden = 12, tiny_target.module.config.hidden_size
    embeddings, features = torch.randn(1, length, hidden), torch.randn(1, length, hidden)
    anchors = torch.tensor([0, 3, 4, 9])  # 9: the last anchor with room for 3 steps
    with torch.no_grad():
        unrolled = trainer_module.unrolled_predictions(head, embeddings, features, 3, anchors)
        for node, anchor in enumerate(anchors.tolist()):
            cache = DynamicCache(config=head.config)
            drafted = head(embeddings[:, : anchor + 1], features[:, : anchor + 1], cache)[:, -1:]  # [1, 1, H]
            assert torch.allclose(drafted[0, 0], unrolled[0][0, anchor], atol=1e-5)
            for step in (2, 3):
                drafted = head(embeddings[:, anchor + step - 1 : anchor + step], drafted, cache)
                assert torch.allclose(drafted[0, 0], unrolled[step - 1][0, node], atol=1e-5), (anchor, step)


def test_training_prompts_are_not_benchmark_prompts():
    training = {p.id for source in ("humaneval", "spec-bench") for p in training_prompts(source)}
    assert len(training) == 124 + 350
    benchmark = {p.id for c in CATEGORIES + MT_BENCH_KINDS for p in load_category(c, 10)}
    benchmark |= {p.id for p in load_category("code", 40)}
    assert not training & benchmark


def test_chunks_are_taken_from_each_source_in_turn():
    chunks = pack_chunks([[[1] * 10], [[2] * 3, [3] * 3], [[4] * 2]], seq_len=2, tokens=10)
    assert chunks.tolist() == [[1, 1], [2, 2], [4, 4], [1, 1], [2, 3], [1, 1], [3, 3], [1, 1], [1, 1]][:5]


# ---- drafting -------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_output_is_the_target_s(tiny_target, trained, k):
    assert_greedy_output_is_the_target_s(tiny_target, f"eagle:{trained[0]}", k)


@pytest.mark.parametrize("tree", [None, TreeSpec(budget=6, depth=3, branch=2)], ids=["chain", "tree"])
def test_greedy_output_with_penalties_and_bias_is_the_target_s(tiny_target, trained, tree):
    # The head drafts through the same LogitsProcessor (each row counting its own drafted prefix).
    params = SamplingParams(max_new_tokens=24, repetition_penalty=1.4, frequency_penalty=0.5, logit_bias={0: 1.0})
    decoder = SpeculativeDecoder(tiny_target, f"eagle:{trained[0]}", num_speculative_tokens=3, tree=tree,
                                 policy=FixedK(3))
    out = decoder.generate([3, 1, 4], params)
    assert out.token_ids == SpeculativeDecoder(tiny_target, None).generate([3, 1, 4], params).token_ids
    assert out.stats.accepted_tokens > 0


@pytest.mark.parametrize("budget,depth", [(4, 3), (12, 4)])
def test_greedy_output_with_a_tree_is_the_target_s(tiny_target, trained, budget, depth):
    tree = TreeSpec(budget=budget, depth=depth, branch=2)
    decoder = SpeculativeDecoder(tiny_target, f"eagle:{trained[0]}", tree=tree, policy=FixedK(depth))
    plain = SpeculativeDecoder(tiny_target, None)
    accepted = 0
    for prompt in ([3], [3, 1, 4], random_documents(7, count=1, length=20)[0]):
        params = SamplingParams(max_new_tokens=40)
        out = decoder.generate(prompt, params)
        assert out.token_ids == plain.generate(prompt, params).token_ids
        accepted += out.stats.accepted_tokens
    assert accepted > 0


def test_a_tree_accepts_more_than_a_chain(tiny_target, trained):
    def accepted_per_step(tree: TreeSpec | None) -> float:
        decoder = SpeculativeDecoder(tiny_target, f"eagle:{trained[0]}", num_speculative_tokens=3, tree=tree,
                                     policy=FixedK(3), prompt_lookup=False)
        stats = [decoder.generate(p, SamplingParams(max_new_tokens=32)).stats for p in random_documents(1, 6, 5)]
        return sum(s.accepted_tokens for s in stats) / sum(s.steps for s in stats)

    assert accepted_per_step(TreeSpec(budget=12, depth=3)) > accepted_per_step(None) + 0.2


@pytest.mark.slow
def test_sampling_with_a_head_keeps_the_target_distribution(tiny_target, trained):
    params = lambda seed: SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=LENGTH, seed=seed)  # noqa: E731
    exact = exact_continuation_probs(tiny_target, PROMPT, LENGTH, params(0))
    decoder = SpeculativeDecoder(tiny_target, f"eagle:{trained[0]}", num_speculative_tokens=2, policy=FixedK(2))
    counts = sample_counts(decoder, params, tiny_target.vocab_size)
    assert chi_square_p_value(counts, exact) > 1e-3


@pytest.mark.slow
def test_sampling_with_a_head_s_tree_keeps_the_target_distribution(tiny_target, trained):
    params = lambda seed: SamplingParams(temperature=1.0, max_new_tokens=LENGTH, seed=seed)  # noqa: E731
    exact = exact_continuation_probs(tiny_target, PROMPT, LENGTH, params(0))
    tree = TreeSpec(budget=5, depth=2, branch=3)
    decoder = SpeculativeDecoder(tiny_target, f"eagle:{trained[0]}", tree=tree, policy=FixedK(2))
    counts = sample_counts(decoder, params, tiny_target.vocab_size)
    assert chi_square_p_value(counts, exact) > 1e-3


def test_a_head_drafts_dynamic_trees_only(tiny_target, trained):
    with pytest.raises(InvalidParameterError, match="budget"):
        SpeculativeDecoder(tiny_target, f"eagle:{trained[0]}", tree=TreeSpec(widths=(2, 2)))


def test_a_head_trained_for_another_target_is_refused(trained, tiny_draft):
    with pytest.raises(CheckpointMismatchError, match="trained for the target 'tiny-target'.*train-drafter --target tiny-draft"):
        SpeculativeDecoder(tiny_draft, f"eagle:{trained[0]}")


def test_the_head_is_a_drafter_of_its_own(tiny_target, trained):
    head = load_eagle_head(trained[0], tiny_target)
    decoder = SpeculativeDecoder(tiny_target, EagleDrafter(head, tiny_target), num_speculative_tokens=3)
    assert decoder.generate([3, 1, 4], SamplingParams(max_new_tokens=16)).token_ids == (
        SpeculativeDecoder(tiny_target, None).generate([3, 1, 4], SamplingParams(max_new_tokens=16)).token_ids)


# ---- the command line --------------------------------------------------------------------------


def test_train_drafter_on_the_command_line(tmp_path, capsys):
    tokenizer = char_tokenizer("abcd ")
    model = make_tiny_model(seed=9, vocab_size=len(tokenizer), name="tiny-chars")
    target_dir = tmp_path / "target"
    model.module.save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    text = tmp_path / "corpus.txt"
    text.write_text(" ".join("abcd"[i % 4] * (1 + i % 3) for i in range(400)))
    out = tmp_path / "head"
    command = ["train-drafter", "--target", str(target_dir), "--data", str(text), "--out", str(out),
               "--tokens", "512", "--seq-len", "32", "--epochs", "2", "--batch-size", "4", "--lr", "0.003",
               "--dtype", "float32", "--no-progress"]
    assert main(command) == 0
    assert json.loads(capsys.readouterr().out)["epoch"] == 2
    assert main(command) == 0  # everything done: nothing to collect or train again
    assert "found 1 of 1 feature shards" in capsys.readouterr().err
    assert main(["generate", "--target", str(target_dir), "--draft", f"eagle:{out}", "--prompt", "abc",
                 "--max-new-tokens", "8", "--dtype", "float32", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) == 8
    assert sorted(os.listdir(out)) == ["config.json", "data", "head.safetensors", "train"]


def test_the_benchmark_runs_the_head_as_a_method(tiny_target, trained):
    from quickdraft.bench.methods import build_methods

    plain, *eagle = build_methods(tiny_target, None, ["plain", "eagle", "eagle-adaptive", "eagle-tree"], peer=False,
                                  eagle=str(trained[0]))
    params = SamplingParams(max_new_tokens=12)
    reference = plain.generate([3, 1, 4], params, k=3).token_ids
    for method in eagle:
        out = method.generate([3, 1, 4], params, k=3)
        assert out.token_ids == reference and len(out.token_ids) == 12
        assert out.stats.drafted_tokens > 0


def test_the_server_counts_a_head_s_weights_and_caches(tiny_target, untrained):
    from quickdraft.server.app import ServerConfig, cache_bytes_per_token, memory_report

    decoder = SpeculativeDecoder(tiny_target, f"eagle:{untrained}")
    config = tiny_target.module.config
    element = tiny_target.dtype.itemsize
    head_dim = config.hidden_size // config.num_attention_heads
    # One layer's keys and values, and the target's feature kept for the head, per token.
    head_bytes = 2 * config.num_key_value_heads * head_dim * element + config.hidden_size * element
    assert cache_bytes_per_token(decoder) == cache_bytes_per_token(SpeculativeDecoder(tiny_target)) + head_bytes
    weights = sum(p.numel() * p.element_size() for p in decoder.drafter.inner.head.parameters())
    line = next(line for line in memory_report(decoder, ServerConfig(model_name="tiny")) if "EAGLE head" in line)
    assert f"{weights / 2**20:,.1f} MiB" in line
