"""Incremental text and stop strings, alone and through the decoding loop."""

from __future__ import annotations

import pytest

from conftest import char_tokenizer
from quickdraft import FixedK, SamplingParams, SpeculativeDecoder
from quickdraft.text import Detokenizer

TOKENIZER = char_tokenizer("abcd \n")


def ids(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


def test_text_is_handed_out_once_and_in_order():
    detok = Detokenizer(TOKENIZER)
    pieces = [detok.add(ids(part))[0] for part in ("ab", " c", "d\n")]
    assert "".join(pieces) + detok.flush() == "ab cd\n"


def test_a_stop_string_inside_one_step_cuts_text_and_tokens():
    detok = Detokenizer(TOKENIZER, stop=("c d",))
    text, keep = detok.add(ids("abc dab"))
    assert detok.stopped
    assert text + detok.flush() == "ab"
    assert keep == len("abc d")  # tokens up to the one completing the stop string


def test_a_stop_string_across_steps_is_never_streamed():
    detok = Detokenizer(TOKENIZER, stop=("dd",))
    first, _ = detok.add(ids("abd"))
    assert first == "ab"  # the trailing "d" is held back: it may start the stop string
    second, keep = detok.add(ids("dc"))
    assert detok.stopped and keep == 1 and first + second + detok.flush() == "ab"


def test_the_earliest_of_several_stop_strings_wins():
    detok = Detokenizer(TOKENIZER, stop=("cd", "b"))
    text, keep = detok.add(ids("abcd"))
    assert text + detok.flush() == "a" and keep == 2


def _plain_text(model, prompt, n):
    return SpeculativeDecoder(model, None).generate(prompt, SamplingParams(max_new_tokens=n, ignore_eos=True))


@pytest.mark.parametrize("drafter", [None, "ngram", "self"])
def test_generation_stops_at_a_stop_string_mid_run(char_model, drafter):
    reference = _plain_text(char_model, "ab", 30)
    stop = reference.text[9:11]
    cut = reference.text.index(stop)
    draft = char_model if drafter == "self" else drafter
    out = SpeculativeDecoder(char_model, draft, num_speculative_tokens=6, policy=FixedK(6)).generate(
        "ab", SamplingParams(max_new_tokens=30, stop=(stop,), ignore_eos=True)
    )
    assert out.finish_reason == "stop"
    assert out.text == reference.text[:cut]
    tokenizer = char_model.tokenizer
    completes = next(m for m in range(1, 31) if stop in tokenizer.decode(reference.token_ids[:m], skip_special_tokens=True))
    assert out.token_ids == reference.token_ids[:completes]
    assert out.stats.new_tokens == len(out.token_ids)


def test_streamed_text_adds_up_to_the_final_text(char_model):
    decoder = SpeculativeDecoder(char_model, char_model, num_speculative_tokens=4, policy=FixedK(4))
    params = SamplingParams(temperature=0.8, seed=3, max_new_tokens=25, stop=("dd",))
    streamed = "".join(c.text for c in decoder.stream("abc", params))
    assert streamed == decoder.generate("abc", params).text
