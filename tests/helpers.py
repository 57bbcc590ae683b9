"""Helpers that several test modules share (fixtures live in conftest.py)."""

from __future__ import annotations

import string
from collections.abc import Callable

import torch

from conftest import char_tokenizer, make_tiny_model
from quickdraft import FixedK, SamplingParams, SpeculativeDecoder
from quickdraft.models.base import LoadedModel
from quickdraft.training import TrainConfig

# ---- batch costs --------------------------------------------------------------------------------


class Curve:
    """Batch costs given as functions (``quickdraft.costs.BatchCosts``): ``verify(positions)``,
    ``draft(rows)`` and, if given, ``catch_up(positions)``; nothing is learned."""

    def __init__(self, verify: Callable[[int], float], draft: Callable[[int], float] = lambda rows: 0.0,
                 catch_up: Callable[[int], float] | None = None) -> None:
        self.verify = verify
        self.draft = draft
        self._catch_up = catch_up

    def catch_up(self, positions: int) -> float | None:
        return None if self._catch_up is None else self._catch_up(positions)  # None: from verify and draft

    def observe(self, *timings) -> None:
        pass

    def observe_catch_up(self, positions: int, seconds: float) -> None:
        pass

    def observe_start_up(self, verify, draft) -> None:
        pass


# ---- greedy reference ---------------------------------------------------------------------------

PROMPTS = [[1, 2, 3], [5], [0, 7, 7, 1, 2, 6, 3, 3, 4]]


def plain_greedy(model, prompt, n):
    """Reference: the target's own greedy decoding, by full forwards with no cache at all."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            logits = model.module(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]


# ---- whole continuations sampled against their exact distribution --------------------------------

# With a vocabulary of 8 and 3 new tokens (so at most K = 2 drafts per step: the loop never
# drafts past ``max_new_tokens``) there are 512 continuations.
PROMPT = [3, 1]
LENGTH = 3
SAMPLES = 3000


def sample_counts(decoder, params_for_seed, vocab, lookup_steps: list[int] | None = None,
                  samples: int = SAMPLES) -> torch.Tensor:
    """Counts of each continuation over ``samples`` seeded runs; adds each run's prompt-lookup
    steps to ``lookup_steps``."""
    counts = torch.zeros(vocab**LENGTH)
    for seed in range(samples):
        out = decoder.generate(PROMPT, params_for_seed(seed))
        ids = out.token_ids
        if lookup_steps is not None:
            lookup_steps.append(out.stats.lookup_steps)
        assert len(ids) == LENGTH
        index = 0
        for token in ids:
            index = index * vocab + token
        counts[index] += 1
    return counts


# ---- model folders for the command line ---------------------------------------------------------

CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"


def save_tiny_model(folder, seed: int, alphabet: str = string.printable) -> str:
    """A tiny random Llama with a character tokenizer and a chat template, saved as a model folder."""
    tokenizer = char_tokenizer(alphabet)
    tokenizer.chat_template = CHAT_TEMPLATE
    model = make_tiny_model(seed=seed, vocab_size=len(tokenizer), context=2048)
    model.module.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


# ---- trained heads (EAGLE, Medusa) ----------------------------------------------------------------

# Under a second of training on 4k tokens of the target's own samples: enough to learn from.
CONFIG = TrainConfig(tokens=4096, seq_len=64, epochs=4, batch_size=4, lr=3e-3, warmup_steps=5,
                     feature_noise=0.0, save_every=5)


def random_documents(seed: int, count: int = 64, length: int = 64, vocab: int = 8) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(count)]


@torch.inference_mode()
def target_samples(model: LoadedModel, seed: int, count: int = 64, length: int = 64) -> list[list[int]]:
    """``count`` sequences sampled from ``model`` (temperature 1) after 2 random tokens: text
    like what it decodes, as self-distillation data would be."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.vocab_size, (count, 2), generator=generator)  # [count, t]
    while ids.shape[1] < length:
        probs = torch.softmax(model.module(input_ids=ids).logits[:, -1], dim=-1)  # [count, V]
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], dim=1)
    return ids.tolist()


def quiet(message: str) -> None:
    pass


def greedy_acceptance(target: LoadedModel, folder, prompts: list[list[int]], kind: str = "eagle") -> float:
    # The head's own acceptance: no prompt lookup in front of it.
    decoder = SpeculativeDecoder(target, f"{kind}:{folder}", num_speculative_tokens=3, policy=FixedK(3),
                                 prompt_lookup=False)
    rates = [decoder.generate(p, SamplingParams(max_new_tokens=32)).stats.acceptance_rate for p in prompts]
    return sum(rates) / len(rates)


def assert_greedy_output_is_the_target_s(target: LoadedModel, draft: str, k: int):
    """Decode three prompts with ``draft`` and K fixed at ``k``; return the last output's stats."""
    decoder = SpeculativeDecoder(target, draft, num_speculative_tokens=k, policy=FixedK(k))
    plain = SpeculativeDecoder(target, None)
    for prompt in ([3], [3, 1, 4], random_documents(7, count=1, length=20)[0]):
        params = SamplingParams(max_new_tokens=40)
        out = decoder.generate(prompt, params)
        assert out.token_ids == plain.generate(prompt, params).token_ids
    assert out.stats.accepted_tokens > 0
    return out.stats
