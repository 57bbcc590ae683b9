"""Self-distillation data: the target's own greedy replies, batched, cached and resumable."""

from __future__ import annotations

import json

import pytest
import torch

from quickdraft import InvalidParameterError
from quickdraft.bench.workloads import Prompt
from quickdraft.training import replies as replies_module
from quickdraft.training.data import training_prompts
from quickdraft.training.replies import reply_documents, reply_prompts, self_source

NEW_TOKENS = 6


def prompts() -> list[Prompt]:
    # Lengths 3, 5 and 4: a batch of 2 pads one of its prompts on the left.
    ids = [[5, 1, 2], [7, 1, 3, 0, 4], [6, 6, 2, 3]]
    return [Prompt(id=f"p{i}", category="test", text="", token_ids=t) for i, t in enumerate(ids)]


@torch.inference_mode()
def greedy_continuation(model, ids: list[int], count: int) -> list[int]:
    """The target's greedy continuation, one full forward a token, no batch and no cache."""
    ids = list(ids)
    for _ in range(count):
        ids.append(int(model.module(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids


def test_a_document_is_the_prompt_and_the_target_s_greedy_reply(tiny_target, tmp_path):
    documents = list(reply_documents(tiny_target, prompts(), tmp_path / "r.jsonl", NEW_TOKENS, batch_size=2,
                                     progress=False))
    by_length = sorted(prompts(), key=lambda p: len(p.token_ids))  # the order they are generated in
    assert documents == [greedy_continuation(tiny_target, p.token_ids, NEW_TOKENS) for p in by_length]


def test_a_reply_ends_with_the_target_s_end_token(tiny_target, tmp_path, monkeypatch):
    prompt = prompts()[0].token_ids
    reply = greedy_continuation(tiny_target, prompt, NEW_TOKENS)[len(prompt):]
    end = reply[1]  # make the reply's second token an end token: the reply stops at its first
    monkeypatch.setattr(tiny_target.module.generation_config, "eos_token_id", end)
    (document,) = reply_documents(tiny_target, prompts()[:1], tmp_path / "r.jsonl", NEW_TOKENS, progress=False)
    assert document == prompt + reply[: reply.index(end) + 1]
    assert len(document) < len(prompt) + NEW_TOKENS


def test_a_rerun_reads_the_replies_it_finds_and_generates_the_rest(tiny_target, tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    whole = list(reply_documents(tiny_target, prompts(), path, NEW_TOKENS, batch_size=2, progress=False))
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    path.write_text("\n".join(lines[:2]) + "\n")  # as if stopped before the last batch
    real_generate, batches = replies_module._generate, []

    def counting(target, batch, max_new_tokens):
        batches.append(batch)
        return real_generate(target, batch, max_new_tokens)

    monkeypatch.setattr(replies_module, "_generate", counting)
    assert list(reply_documents(tiny_target, prompts(), path, NEW_TOKENS, batch_size=2, progress=False)) == whole
    assert batches == [[json.loads(lines[2])["ids"][:-NEW_TOKENS]]]
    assert len(path.read_text().splitlines()) == 3


def test_reply_prompts_cover_every_category_of_the_training_split():
    chosen = reply_prompts("spec-bench", 10)
    assert len({p.category for p in chosen[:5]}) == 5
    assert {p.id for p in chosen} <= {p.id for p in training_prompts("spec-bench")}
    assert [p.id for p in reply_prompts("humaneval", 3)] == [p.id for p in training_prompts("humaneval")[:3]]


@pytest.mark.parametrize("name, count, message", [
    ("self:stdlib", 4, "self:humaneval or self:spec-bench"), ("self:humaneval", 0, "--reply-prompts"),
])
def test_an_unknown_self_source_or_no_prompt_is_refused(tiny_target, tmp_path, name, count, message):
    with pytest.raises(InvalidParameterError, match=message):
        self_source(name, tiny_target, tmp_path, count, NEW_TOKENS)


def test_the_command_refuses_an_unknown_self_source_before_loading_anything(tmp_path, capsys):
    from quickdraft.cli import main

    out = tmp_path / "head"
    assert main(["train-drafter", "--target", str(tmp_path / "no-such-model"), "--data", "stdlib,self:stdlib",
                 "--out", str(out)]) == 2
    assert "self:humaneval or self:spec-bench" in capsys.readouterr().err
    assert not out.exists()
