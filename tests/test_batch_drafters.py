"""Every drafter kind served batched: 8 concurrent streamed greedy requests, each answered with
plain decoding's text, in steps that decode several of them together; a tree, which the batched
engine does not verify, is served one request at a time and the server says so."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest
import torch

from server_support import (  # noqa: E402  (first: it skips this module without the server and dev extras)
    API_KEY,
    MODEL,
    PROMPT,
    WORDS,
    httpx,
    plain_greedy,
    serve,
    tiny,
)
from quickdraft import SamplingParams, SpeculativeDecoder, TreeSpec
from quickdraft.drafters import Draft, DrafterBase, EagleHead, MedusaHeads
from quickdraft.drafters.eagle_head import head_decoder_config
from quickdraft.drafters.head_checkpoint import save_head
from quickdraft.drafters.suffix_cache import SERVER_SCOPE, SuffixCacheStore, SuffixDrafter
from quickdraft.server.app import key_scope

pytest_plugins = ("server_support",)  # its fixtures: tokenizer, target, draft

K = 3
PROMPTS = [PROMPT, "the cat sat on the mat", "one two three", "def return if else for while print list code",
           "red blue green red blue", "hello world hello world hello", "the lazy dog jumps over", "print list for"]
LENGTHS = [20, 9, 14, 17, 12, 20, 6, 15]


class RepeatDrafter(DrafterBase):
    """A user's drafter: the sequence's last token, k times (docs/drafters.md's example)."""

    name = "repeat"

    def propose(self, sequence: Sequence[int], k, params, generator, processor) -> Draft:
        return Draft(tokens=torch.full((k,), sequence[-1], dtype=torch.long))


def stream_all(url: str) -> list[str]:
    """The texts of ``PROMPTS``, greedy, streamed, all sent at once."""
    async def one(http: httpx.AsyncClient, prompt: str, n: int) -> str:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True}
        pieces = []
        async with http.stream("POST", f"{url}/v1/completions", json=body) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    pieces.extend(choice["text"] for choice in json.loads(line[6:])["choices"])
        return "".join(pieces)

    async def ask() -> list[str]:
        async with httpx.AsyncClient(timeout=60) as http:
            return list(await asyncio.gather(*(one(http, p, n) for p, n in zip(PROMPTS, LENGTHS))))

    return asyncio.run(ask())


def renumbered(seed: int):
    """A tiny model whose tokenizer spells the same words with other ids: a draft of another tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["<unk>", "<s>", "</s>", *reversed(WORDS)])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")
    other = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    return tiny(seed, other, "tiny-renumbered")


@pytest.fixture(scope="module")
def decoders(target, draft, tmp_path_factory) -> dict[str, SpeculativeDecoder]:
    eagle = tmp_path_factory.mktemp("eagle")
    torch.manual_seed(0)
    save_head(EagleHead(head_decoder_config(target.module.config)), target, eagle, {})
    medusa = tmp_path_factory.mktemp("medusa")
    heads = MedusaHeads(target.module.config.hidden_size, K)
    for block in heads.blocks:  # an untrained head repeats the target's guess: random blocks draft more
        torch.nn.init.normal_(block.weight, std=0.5)
        torch.nn.init.normal_(block.bias, std=0.5)
    save_head(heads, target, medusa, {})
    return {
        "none": SpeculativeDecoder(target, None, K),
        "draft model": SpeculativeDecoder(target, draft, K),
        "ngram": SpeculativeDecoder(target, "ngram", K),
        "eagle": SpeculativeDecoder(target, f"eagle:{eagle}", K),
        "medusa": SpeculativeDecoder(target, f"medusa:{medusa}", K),
        "another tokenizer": SpeculativeDecoder(target, renumbered(2), K),
        "custom": SpeculativeDecoder(target, RepeatDrafter(), K),
        "suffix": SpeculativeDecoder(target, "suffix", K),
        "draft model, suffix cache in front": SpeculativeDecoder(
            target, draft, K, lookup=SuffixDrafter(SuffixCacheStore(1 << 20))),
    }


@pytest.mark.parametrize("kind", ["none", "draft model", "ngram", "eagle", "medusa", "another tokenizer", "custom",
                                  "suffix", "draft model, suffix cache in front"])
def test_every_drafter_serves_eight_concurrent_streams_batched_each_with_plain_greedy_text(target, decoders, kind):
    with serve(decoders[kind], api_key=None, max_queue=16) as running:
        card = httpx.get(f"{running.url}/v1/models").json()["data"][0]
        texts = stream_all(running.url)
        metrics = running.metrics()
    assert card["batched"] is True and "not_batched_because" not in card
    assert texts == [plain_greedy(target, prompt, n) for prompt, n in zip(PROMPTS, LENGTHS)]
    rows = metrics[("quickdraft_batch_drafted_tokens_per_row_count", ())]
    steps = sum(v for (name, _), v in metrics.items() if name == "quickdraft_batch_steps_total")
    assert rows > steps  # some steps decoded several requests together
    drafted = metrics[("quickdraft_batch_drafted_tokens_per_row_sum", ())]
    assert drafted == 0 if kind == "none" else drafted > 0


def test_a_tree_is_served_one_request_at_a_time_and_the_server_says_why(target, draft, caplog):
    decoder = SpeculativeDecoder(target, draft, tree=TreeSpec(widths=(2, 1)))
    with caplog.at_level("WARNING", logger="quickdraft.server"), serve(decoder, api_key=None) as running:
        card = httpx.get(f"{running.url}/v1/models").json()["data"][0]
        texts = stream_all(running.url)
    assert card["batched"] is False and "trees" in card["not_batched_because"]
    assert [r.getMessage() for r in caplog.records if "not batched" in r.getMessage()] == [
        f"not batched: {card['not_batched_because']}"]
    assert texts == [plain_greedy(target, prompt, n) for prompt, n in zip(PROMPTS, LENGTHS)]


def stream_one_among(url: str, body: dict, others: list[dict]) -> str:
    """The streamed text of ``body``, sent together with ``others``."""
    async def one(http: httpx.AsyncClient, request: dict) -> str:
        pieces = []
        async with http.stream("POST", f"{url}/v1/completions", json={**request, "stream": True}) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    pieces.extend(choice["text"] for choice in json.loads(line[6:])["choices"])
        return "".join(pieces)

    async def ask() -> str:
        async with httpx.AsyncClient(timeout=60) as http:
            return (await asyncio.gather(*(one(http, r) for r in [body, *others])))[0]

    return asyncio.run(ask())


@pytest.mark.parametrize("kind", ["draft model", "ngram", "eagle"])
def test_a_seed_gives_one_text_from_generate_stream_and_the_server_alone_or_among_seven(decoders, kind):
    """The seed rule (``quickdraft.engine.SEEDED_RULE``) with the default, adaptive policy."""
    decoder = decoders[kind]
    params = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=24, seed=1234)
    generated = decoder.generate(PROMPT, params).text
    streamed = "".join(chunk.text for chunk in decoder.stream(PROMPT, params))
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "temperature": 0.9, "top_p": 0.95, "seed": 1234}
    others = [{"model": MODEL, "prompt": prompt, "max_tokens": n, "temperature": 0.7 if i % 2 else 0}
              for i, (prompt, n) in enumerate(zip(PROMPTS[1:], LENGTHS[1:]))]
    with serve(decoder, api_key=None, max_queue=16) as running:
        alone = stream_one_among(running.url, body, [])
        crowded = stream_one_among(running.url, body, others)
    assert generated and generated == streamed == alone == crowded


@pytest.mark.parametrize("scope", ["key", "server"])
def test_a_key_s_text_drafts_for_another_key_only_where_the_cache_is_shared(target, scope):
    """``--suffix-cache-scope key``: what one API key sent never drafts for another; with the
    server's one scope (the control) it does."""
    store = SuffixCacheStore(1 << 20)
    decoder = SpeculativeDecoder(target, SuffixDrafter(store), K)
    secret = "red blue green red blue green the lazy dog jumps over the cat"
    with serve(decoder, api_key=f"{API_KEY},key-a,key-b", suffix_cache_scope=scope, max_queue=4) as running:
        for key, prompt in (("key-a", secret), ("key-b", "one two three")):
            reply = httpx.post(f"{running.url}/v1/completions", headers={"Authorization": f"Bearer {key}"},
                               json={"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0}, timeout=60)
            assert reply.status_code == 200
        metrics = running.metrics()
    assert metrics[("quickdraft_suffix_cache_sequences", ())] == 2
    assert 0 < metrics[("quickdraft_suffix_cache_bytes", ())] <= metrics[("quickdraft_suffix_cache_limit_bytes", ())]
    tokens = target.tokenizer(secret)["input_ids"]
    scope_b = store.scope(key_scope("key-b") if scope == "key" else SERVER_SCOPE)
    found = scope_b.draft(tokens[:6], 3).tokens
    assert found == (tokens[6:9] if scope == "server" else [])
