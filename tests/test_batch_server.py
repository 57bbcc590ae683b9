"""The server's continuous batching: concurrent requests share steps and each gets the answer it
would get alone; a client that leaves frees its row while the others go on."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from server_support import (  # noqa: E402  (first: it skips this module without the server and dev extras)
    MODEL,
    PROMPT,
    first_sse_with_text,
    httpx,
    plain_greedy,
    serve,
    speculative,
    tiny,
    wait_for,
)
from quickdraft import SpeculativeDecoder
from quickdraft.batch.engine import PHASES
from quickdraft.batch.limits import KByBatchSize
from quickdraft.server.app import ServerConfig

pytest_plugins = ("server_support",)  # its fixtures: tokenizer, target, draft

COMPLETIONS = "/v1/completions"
PROMPTS = [PROMPT, "the cat sat on the mat", "one two three", "def return if else for while print list code"]


def health(url: str) -> dict:
    return httpx.get(f"{url}/health").json()


def ask_all(url: str, lengths: list[int]) -> list[dict]:
    """The replies to ``PROMPTS``, greedy, ``lengths`` tokens each, all sent at once."""
    async def ask() -> list[dict]:
        async with httpx.AsyncClient(timeout=30) as http:
            replies = await asyncio.gather(*(
                http.post(f"{url}{COMPLETIONS}", json={"model": MODEL, "prompt": prompt, "max_tokens": n, "temperature": 0})
                for prompt, n in zip(PROMPTS, lengths)))
        return [reply.json() for reply in replies]

    return asyncio.run(ask())


@pytest.mark.parametrize("drafter", ["draft model", "ngram"])
def test_concurrent_requests_share_steps_and_each_gets_its_greedy_answer(target, draft, drafter):
    decoder = speculative(target, draft) if drafter == "draft model" else SpeculativeDecoder(target, "ngram")
    lengths = [30, 5, 17, 24]
    with serve(decoder, api_key=None) as running:
        texts = [reply["choices"][0]["text"] for reply in ask_all(running.url, lengths)]
        metrics = running.metrics()
    assert texts == [plain_greedy(target, prompt, n) for prompt, n in zip(PROMPTS, lengths)]
    rows = metrics[("quickdraft_batch_drafted_tokens_per_row_count", ())]
    steps = sum(v for (name, _), v in metrics.items() if name == "quickdraft_batch_steps_total")
    assert rows > steps  # some steps decoded more than one request
    source = "model" if drafter == "draft model" else "lookup"
    assert 0 <= metrics[("quickdraft_batch_acceptance", (("source", source),))] <= 1
    assert metrics[("quickdraft_batch_realized_gain", ())] > 0
    phases = {labels: v for (name, labels), v in metrics.items() if name == "quickdraft_batch_step_seconds_total"}
    assert {dict(labels)["phase"] for labels in phases} == set(PHASES)
    verify = sum(v for labels, v in phases.items() if dict(labels)["phase"] == "verify")
    assert verify > 0 and all(v >= 0 for v in phases.values())


def test_a_client_that_disconnects_mid_stream_frees_its_row_and_the_others_go_on(tokenizer):
    slow = tiny(1, tokenizer, "tiny-slow", delay=0.03)
    long = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stream": True}
    with serve(SpeculativeDecoder(slow, None), api_key=None) as running, httpx.Client(timeout=30) as http:
        url = f"{running.url}{COMPLETIONS}"
        with contextlib.ExitStack() as stack:
            staying = stack.enter_context(http.stream("POST", url, json=long))
            lines = staying.iter_lines()
            first_sse_with_text(lines)
            with http.stream("POST", url, json=long) as leaving:
                leaving_lines = leaving.iter_lines()  # kept: a dropped, half-read iterator closes the connection
                first_sse_with_text(leaving_lines)
                assert health(running.url)["running"] == 2
                cache_with_two = running.metrics()[("quickdraft_kv_cache_bytes", ())]
            # The client left: its row goes within a step, the other stream goes on.
            wait_for(lambda: health(running.url)["running"] == 1, timeout=2)
            assert running.metrics()[("quickdraft_generations_total", (("outcome", "cancelled"),))] == 1
            assert first_sse_with_text(lines)["choices"][0]["text"]
            assert running.metrics()[("quickdraft_kv_cache_bytes", ())] <= cache_with_two
        wait_for(lambda: health(running.url) == {"status": "ok", "waiting": 0, "running": 0}, timeout=3)
        assert running.metrics()[("quickdraft_kv_cache_bytes", ())] == 0


def test_k_by_batch_size_zero_serves_every_request_plainly(target, draft):
    lengths = [12, 5, 9, 7]
    with serve(speculative(target, draft), api_key=None, k_by_batch_size=KByBatchSize.parse("1-:0")) as running:
        replies = ask_all(running.url, lengths)
        metrics = running.metrics()
    assert [r["choices"][0]["text"] for r in replies] == [plain_greedy(target, p, n) for p, n in zip(PROMPTS, lengths)]
    assert all(r["quickdraft"]["drafted_tokens"] == 0 for r in replies)
    assert metrics[("quickdraft_batch_drafted_tokens_per_row_sum", ())] == 0
    assert metrics[("quickdraft_batch_drafted_tokens_per_row_count", ())] >= sum(lengths)


def test_the_sequential_scheduler_stays_selectable(target):
    with serve(SpeculativeDecoder(target, "ngram"), api_key=None, scheduler="sequential") as running:
        reply = httpx.post(f"{running.url}{COMPLETIONS}", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0})
        assert reply.json()["choices"][0]["text"] == plain_greedy(target, PROMPT, 6)
        assert not [name for name, _ in running.metrics() if name == "quickdraft_batch_steps_total"]


def test_bad_batching_options_are_refused():
    with pytest.raises(ValueError, match="scheduler must be one of"):
        ServerConfig(model_name=MODEL, scheduler="fifo")
    with pytest.raises(ValueError, match="must fit the batch alone"):
        ServerConfig(model_name=MODEL, kv_cache_budget_mb=100, batch_kv_cache_mb=10)
    with pytest.raises(ValueError, match="needs the batch scheduler"):
        ServerConfig(model_name=MODEL, scheduler="sequential", k_by_batch_size=KByBatchSize.parse("9-:0"))
