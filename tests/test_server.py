"""The HTTP server, end to end: real uvicorn servers on 127.0.0.1 in background threads, tiny
random Llamas and a tiny word-level tokenizer with a chat template, clients speaking HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

pytest.register_assert_rewrite("server_support")  # before its import: its asserts explain themselves too
from server_support import (  # noqa: E402  (first: it skips this module without the server and dev extras)
    API_KEY,
    CHAT_TEMPLATE,
    CONTEXT,
    K,
    KV_BUDGET_TOKENS,
    MESSAGES,
    MODEL,
    PROMPT,
    auth,
    first_sse_with_text,
    httpx,
    openai,
    plain_greedy,
    rss_bytes,
    serve,
    speculative,
    wait_for,
)

from quickdraft import LoadedModel, SamplingParams
from quickdraft.cli import main
from quickdraft.prompts import chat_prompt_ids
from quickdraft.server.loadgen import Result

pytest_plugins = ("server_support",)  # its fixtures: tokenizer, target, draft, server, slow_server, client

# -- the OpenAI client, and equality with plain greedy decoding ----------------------------------


def test_completion_equals_plain_greedy_through_the_openai_client(client, target):
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0)
    choice = response.choices[0]
    assert choice.text == plain_greedy(target, PROMPT, 40)
    assert choice.finish_reason in ("stop", "length")
    prompt_tokens = len(target.tokenizer(PROMPT)["input_ids"])
    assert response.usage.prompt_tokens == prompt_tokens
    assert response.usage.total_tokens == prompt_tokens + response.usage.completion_tokens
    stats = response.model_extra["quickdraft"]
    assert stats["steps"] >= 1 and stats["drafted_tokens"] >= stats["accepted_tokens"] >= 0
    assert sum(stats["accepted_by_position"]) == stats["accepted_tokens"]


def test_a_request_decoded_without_speculation_drafts_nothing_and_gives_the_same_text(client, target):
    extension = {"extra_body": {"num_speculative_tokens": 0}}
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, **extension)
    assert plain.choices[0].text == plain_greedy(target, PROMPT, 40)
    stats = plain.model_extra["quickdraft"]
    assert stats["drafted_tokens"] == 0 and stats["steps"] == plain.usage.completion_tokens
    one = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0,
                                    extra_body={"num_speculative_tokens": 1})
    assert one.choices[0].text == plain.choices[0].text
    assert len(one.model_extra["quickdraft"]["drafted_by_position"]) <= 1  # one token a step at most


def test_streamed_completion_equals_plain_greedy(client, target):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == plain_greedy(target, PROMPT, 40)
    assert [c.choices[0].finish_reason is not None for c in chunks].count(True) == 1
    assert chunks[-1].choices[0].finish_reason is not None
    assert all(c.usage is None for c in chunks)  # usage comes only with stream_options.include_usage
    assert len({c.id for c in chunks}) == 1


def test_chat_equals_plain_greedy_streamed_and_not(client, target, tokenizer):
    expected = plain_greedy(target, chat_prompt_ids(tokenizer, MESSAGES), 30)
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=30, temperature=0)
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == expected
    assert whole.usage.prompt_tokens == len(chat_prompt_ids(tokenizer, MESSAGES))
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=30, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_default_max_tokens_stays_within_the_kv_budget(client, tokenizer):
    """Chat defaults to 256 tokens; with room for 163 the default shrinks instead of failing."""
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == KV_BUDGET_TOKENS - len(chat_prompt_ids(tokenizer, MESSAGES))
    assert reply.choices[0].finish_reason == "length"


def test_token_id_prompt_and_stop_string(client, target):
    ids = target.tokenizer(PROMPT)["input_ids"]
    response = client.completions.create(model=MODEL, prompt=ids, max_tokens=20, temperature=0)
    reference = plain_greedy(target, ids, 20)
    assert response.choices[0].text == reference
    stop = reference.split()[3]  # a word the greedy continuation reaches
    stopped = client.completions.create(model=MODEL, prompt=ids, max_tokens=20, temperature=0, stop=[stop, "zzz"])
    assert stopped.choices[0].text == plain_greedy(target, ids, 20, stop=(stop, "zzz"))
    assert stop not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"


def test_seeded_sampling_reproduces_the_library(client, target, draft):
    """temperature, top_p, top_k and seed reach the decoder: the same draws as the library's, and
    the same again after other requests (a fixed K keeps no state between requests)."""
    params = {"temperature": 0.9, "top_p": 0.95, "seed": 1234}
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, extra_body={"top_k": 20},
                                         **params)
    reference = speculative(target, draft).generate(
        PROMPT, SamplingParams(max_new_tokens=30, top_k=20, **params))
    assert response.choices[0].text == reference.text
    again = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, extra_body={"top_k": 20}, **params)
    assert again.choices[0].text == response.choices[0].text


def test_models_health_and_api_key(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"  # no key needed
    for path in ("/v1/models", "/metrics"):
        response = httpx.get(f"{server.url}{path}", headers=auth("wrong"))
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    response = httpx.post(f"{server.url}/v1/completions", json={"prompt": PROMPT})
    assert response.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0).models.list()


# -- bad input: an OpenAI error body, a 4xx, and the server keeps serving --------------------------

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
OK = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4}
CHAT_OK = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}
LONG_PROMPT = " ".join(["cat"] * (CONTEXT + 10))


@pytest.mark.parametrize(
    "route,body,status,param",
    [
        (COMPLETIONS, b'{"prompt": "hello", ', 400, None),  # malformed JSON
        (COMPLETIONS, b"[1, 2]", 400, None),  # not an object
        (COMPLETIONS, {**OK, "max_tokens": "4"}, 400, "max_tokens"),  # wrong types
        (COMPLETIONS, {**OK, "temperature": "hot"}, 400, "temperature"),
        (COMPLETIONS, {**OK, "stream": "yes"}, 400, "stream"),
        (COMPLETIONS, {**OK, "prompt": {"text": "hi"}}, 400, "prompt"),
        (COMPLETIONS, {"model": MODEL, "max_tokens": 4}, 400, "prompt"),  # missing prompt
        (COMPLETIONS, {**OK, "prompt": ""}, 400, "prompt"),
        (COMPLETIONS, {**OK, "prompt": [1, 99999]}, 400, "prompt"),  # ids outside the vocabulary
        (COMPLETIONS, {**OK, "prompt": ["one", "two"]}, 400, "prompt"),  # a batch
        (COMPLETIONS, {**OK, "max_tokens": 0}, 400, "max_tokens"),
        (COMPLETIONS, {**OK, "max_tokens": -5}, 400, "max_tokens"),
        (COMPLETIONS, {**OK, "max_tokens": CONTEXT}, 400, "max_tokens"),  # beyond the context
        (COMPLETIONS, {**OK, "prompt": LONG_PROMPT}, 400, "prompt"),  # prompt longer than the context
        (COMPLETIONS, {**OK, "max_tokens": KV_BUDGET_TOKENS}, 400, "max_tokens"),  # over the KV budget
        (COMPLETIONS, {**OK, "temperature": -0.5}, 400, "temperature"),
        (COMPLETIONS, {**OK, "top_p": 0}, 400, "top_p"),
        (COMPLETIONS, {**OK, "top_p": 1.5}, 400, "top_p"),
        (COMPLETIONS, {**OK, "top_k": -3}, 400, "top_k"),
        (COMPLETIONS, {**OK, "stop": ["ok", ""]}, 400, "stop"),
        (COMPLETIONS, {**OK, "n": 0}, 400, "n"),
        (COMPLETIONS, {**OK, "logprobs": 21}, 400, "top_logprobs"),
        (COMPLETIONS, {**OK, "presence_penalty": 2.5}, 400, "presence_penalty"),
        (COMPLETIONS, {**OK, "logit_bias": {"3": 101}}, 400, "logit_bias"),
        (COMPLETIONS, {**OK, "logit_bias": {"99999": 1}}, 400, "logit_bias"),  # outside the vocabulary
        (COMPLETIONS, {**OK, "min_p": 2}, 400, "min_p"),
        (COMPLETIONS, {**OK, "response_format": {"type": "yaml"}}, 400, "response_format"),
        (COMPLETIONS, {**OK, "num_speculative_tokens": -1}, 400, "num_speculative_tokens"),
        (COMPLETIONS, {**OK, "num_speculative_tokens": "2"}, 400, "num_speculative_tokens"),
        (COMPLETIONS, {**OK, "model": "gpt-4"}, 404, "model"),  # unknown model
        (CHAT, {"model": MODEL, "max_tokens": 4}, 400, "messages"),  # missing messages
        (CHAT, {**CHAT_OK, "messages": []}, 400, "messages"),
        (CHAT, {**CHAT_OK, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
        (CHAT, {**CHAT_OK, "messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content"),
        (CHAT, {**CHAT_OK, "n": 1000}, 400, "n"),
        (CHAT, {**CHAT_OK, "top_logprobs": 2}, 400, "top_logprobs"),  # without logprobs
        # this test server's word-level tokenizer is not one llguidance reads: a clear 400
        (CHAT, {**CHAT_OK, "response_format": {"type": "json_object"}}, 400, "response_format"),
        (CHAT, {**CHAT_OK, "max_tokens": 0}, 400, "max_tokens"),
        (CHAT, {**CHAT_OK, "stream": True, "model": "nope"}, 404, "model"),
    ],
)
def test_bad_input_gets_an_openai_error(server, route, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{server.url}{route}", content=content,
                          headers={**auth(), "Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_errors_name_the_problem_and_the_server_keeps_serving(server, client):
    bad = httpx.post(f"{server.url}{COMPLETIONS}", headers=auth(), json={**OK, "max_tokens": KV_BUDGET_TOKENS})
    assert bad.json()["error"]["code"] == "kv_cache_budget_exceeded"
    assert "--kv-cache-budget-mb" in bad.json()["error"]["message"]
    bad = httpx.post(f"{server.url}{COMPLETIONS}", headers=auth(), json={**OK, "prompt": LONG_PROMPT})
    assert bad.json()["error"]["code"] == "context_length_exceeded"
    too_big = httpx.post(f"{server.url}{COMPLETIONS}", headers=auth(),
                         json={**OK, "prompt": "cat " * 300_000})  # 1.2 MB > the 1 MiB default
    assert too_big.status_code == 413 and "--max-body-bytes" in too_big.json()["error"]["message"]
    unknown = httpx.get(f"{server.url}/v1/nothing", headers=auth())
    assert unknown.status_code == 404 and "error" in unknown.json()
    with pytest.raises(openai.BadRequestError, match="n must be"):
        client.completions.create(model=MODEL, prompt=PROMPT, n=0)
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3).usage.completion_tokens >= 1


def test_a_serving_process_s_collections_leave_the_models_out(target, draft):
    """While a server runs, the cycle collector does not scan what it loaded (``freeze_long_lived``):
    with the demo pair each full collection, run whenever the batch empties, took 180 ms of a
    lone client's next request. Once the server stops, they are the collector's again."""
    def scanned() -> bool:
        return any(o is target.module for o in gc.get_objects())

    with serve(speculative(target, draft)) as running:
        assert httpx.get(f"{running.url}/health", timeout=10).status_code == 200
        assert not scanned()
    assert scanned()


# -- the scheduler: a bounded queue, cancellation (a batch of one: ``slow_server``) -----------------



def test_disconnect_mid_stream_cancels_and_frees_the_decoder(slow_server):
    long = {"model": MODEL, "prompt": PROMPT, "max_tokens": 240, "ignore_eos": True, "stream": True}
    before = slow_server.metrics()
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{slow_server.url}{COMPLETIONS}", json=long) as r:
        assert r.status_code == 200
        first_sse_with_text(r.iter_lines())
    # 240 tokens take >= 7 s here; the cancelled generation gives the decoder back at once.
    start = time.monotonic()
    response = httpx.post(f"{slow_server.url}{COMPLETIONS}", json={**long, "stream": False, "max_tokens": 5},
                          timeout=30)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 5
    assert time.monotonic() - start < 2.5
    cancelled = ("quickdraft_generations_total", (("outcome", "cancelled"),))
    assert slow_server.metrics()[cancelled] == before.get(cancelled, 0) + 1


def test_queue_full_gets_429_and_queued_clients_can_leave(slow_server):
    long = {"model": MODEL, "prompt": PROMPT, "max_tokens": 240, "ignore_eos": True, "stream": True}
    with contextlib.ExitStack() as stack:
        http = stack.enter_context(httpx.Client(timeout=30))
        running = stack.enter_context(http.stream("POST", f"{slow_server.url}{COMPLETIONS}", json=long))
        lines = running.iter_lines()  # kept: a dropped, half-read iterator closes the connection
        first_sse_with_text(lines)  # the decoder is busy with it
        queued = stack.enter_context(http.stream("POST", f"{slow_server.url}{COMPLETIONS}", json=long))
        assert queued.status_code == 200  # streams start at once; its tokens wait for the decoder
        wait_for(lambda: httpx.get(f"{slow_server.url}/health").json()["waiting"] == 1)
        start = time.monotonic()  # the event loop answers while the worker decodes
        assert httpx.get(f"{slow_server.url}/health").json() == {"status": "ok", "waiting": 1, "running": 1}
        assert time.monotonic() - start < 0.5
        refused = httpx.post(f"{slow_server.url}{COMPLETIONS}", json=long, timeout=30)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "queue_full"
        assert "--max-queue" in refused.json()["error"]["message"]
    # Both clients left: the running job stops, the queued one is skipped, the server is idle.
    wait_for(lambda: httpx.get(f"{slow_server.url}/health").json() == {"status": "ok", "waiting": 0, "running": 0})
    ok = httpx.post(f"{slow_server.url}{COMPLETIONS}", json={**long, "stream": False, "max_tokens": 3}, timeout=30)
    assert ok.status_code == 200


def test_a_non_streaming_client_that_times_out_cancels_its_generation(slow_server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 240, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{slow_server.url}{COMPLETIONS}", json=body, timeout=0.5)
    wait_for(lambda: httpx.get(f"{slow_server.url}/health").json()["running"] == 0, timeout=3)
    closed = ("quickdraft_requests_total", (("route", COMPLETIONS), ("status", "499")))
    wait_for(lambda: slow_server.metrics().get(closed, 0) >= 1, timeout=3)


async def _stream_one(http: httpx.AsyncClient, url: str, body: dict) -> tuple[int, str, int]:
    """(status, text or error code, completion tokens) of one streamed request."""
    async with http.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            return response.status_code, json.loads(await response.aread())["error"]["code"], 0
        text, tokens, done = [], 0, False
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                text += [c["text"] for c in chunk["choices"]]
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        assert done and tokens == 12, "an incomplete stream"
        return 200, "".join(text), tokens


def test_load_32_streaming_clients_nothing_lost_and_metrics_add_up(target, draft):
    """96 requests from 32 concurrent clients against a batch whose KV-cache budget holds 4 rows
    and a queue of 16: each is answered in full or refused with a 429, the batch's cache stays
    under its budget, memory stays flat, and /metrics counts exactly what the clients saw."""
    requests, clients = 96, 32
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    decoder = speculative(target, draft)

    async def load(url: str) -> list[tuple[int, str, int]]:
        todo = list(range(requests))
        results: list[tuple[int, str, int]] = []

        async def one_client(http: httpx.AsyncClient) -> None:
            while todo:
                todo.pop()
                results.append(await _stream_one(http, url, body))
                if results[-1][0] == 429:
                    await asyncio.sleep(0.05)  # a polite client backs off (the 429 says Retry-After)

        limits = httpx.Limits(max_connections=clients)
        async with httpx.AsyncClient(timeout=30, limits=limits) as http:
            await asyncio.wait_for(asyncio.gather(*(one_client(http) for _ in range(clients))), timeout=45)
        return results

    budget_mb = 0.1  # 4 rows of 64 slots x 256 bytes; 8 would take 0.125 MiB
    with serve(decoder, max_queue=16, api_key=None, max_batch_size=8, batch_kv_cache_mb=budget_mb) as running:
        rss_before = rss_bytes()
        results = asyncio.run(load(f"{running.url}{COMPLETIONS}"))
        rss_after = rss_bytes()
        metrics = running.metrics()

    assert len(results) == requests
    served = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] != 200]
    assert all(r[:2] == (429, "queue_full") for r in refused)
    assert served and refused, "the load should both fill the queue and be served"
    assert len({text for _, text, _ in served}) == 1  # greedy: every answer is the same, and complete
    if rss_before is not None:
        assert rss_after - rss_before < 200 * 2**20

    def value(name: str, **labels) -> float:
        return metrics.get((name, tuple(sorted(labels.items()))), 0.0)

    assert value("quickdraft_requests_total", route=COMPLETIONS, status="200") == len(served)
    assert value("quickdraft_requests_total", route=COMPLETIONS, status="429") == len(refused)
    assert value("quickdraft_rejected_requests_total", reason="queue_full") == len(refused)
    assert value("quickdraft_generations_total", outcome="finished") == len(served)
    assert value("quickdraft_generation_tokens_total") == 12 * len(served)
    assert value("quickdraft_prompt_tokens_total") == len(served) * len(PROMPT.split())
    assert value("quickdraft_request_duration_seconds_count", route=COMPLETIONS) == requests
    assert value("quickdraft_time_to_first_token_seconds_count") == len(served)
    steps, accepted = value("quickdraft_spec_steps_total"), value("quickdraft_spec_accepted_tokens_total")
    assert steps + accepted == 12 * len(served)  # each step emits its accepted drafts + one target token
    assert value("quickdraft_spec_drafted_tokens_total") >= accepted
    assert value("quickdraft_spec_lookup_steps_total") <= steps
    by_position = [v for (name, _), v in metrics.items() if name == "quickdraft_spec_accepted_tokens_by_position_total"]
    assert len(by_position) == K
    assert sum(by_position) == accepted
    assert value("quickdraft_spec_mean_accepted_length") == pytest.approx((accepted + steps) / steps)
    assert value("quickdraft_queue_depth") == 0 and value("quickdraft_running_requests") == 0
    # Requests shared steps, within the budget, and the last one to leave freed the cache.
    batched_steps = sum(v for (name, _), v in metrics.items() if name == "quickdraft_batch_steps_total")
    assert value("quickdraft_batch_drafted_tokens_per_row_count") > 1.5 * batched_steps  # rows per step
    assert 0 < value("quickdraft_kv_cache_peak_bytes") <= budget_mb * 2**20
    assert value("quickdraft_kv_cache_bytes") == 0


# -- the command line ------------------------------------------------------------------------------


@pytest.mark.parametrize("args,message", [(["-k", "0"], "-k must be >= 1"), (["--max-queue", "0"], "--max-queue"),
                                          (["--kv-cache-budget-mb", "0"], "--kv-cache-budget-mb"),
                                          (["--max-prompt-tokens", "0"], "--max-prompt-tokens must be >= 1"),
                                          (["--body-timeout", "0"], "--body-timeout must be > 0"),
                                          (["--shutdown-timeout", "-1"], "--shutdown-timeout must be >= 0"),
                                          (["--num-speculative-tokens-per-batch-size", "9-:0", "--scheduler", "sequential"],
                                           "drop it, or use --scheduler batch")])
def test_serve_refuses_bad_options_before_loading(capsys, args, message):
    assert main(["serve", "--target", "/no/such/model", *args]) == 2
    assert message in capsys.readouterr().err


def test_serve_refuses_malformed_k_by_batch_size_with_the_form_to_use(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["serve", "--target", "/no/such/model", "--num-speculative-tokens-per-batch-size", "1-8"])
    assert exit.value.code == 2
    assert "'1-8' is not FIRST-LAST:K" in capsys.readouterr().err


def test_loadgen_against_a_server(server, tmp_path):
    out = tmp_path / "load.json"
    code = main(["loadgen", "--url", server.url, "--api-key", API_KEY, "--concurrency", "1,3",
                 "--requests", "3", "--max-tokens", "6", "--json", str(out)])
    assert code == 0
    levels = json.loads(out.read_text())["levels"]
    assert [level["level"]["ok"] for level in levels] == [3, 3]
    assert all(r["completion_tokens"] == 6 and r["ttft"] is not None for level in levels for r in level["results"])
    # TPOT: each request's time after its first chunk over its 5 tokens after the first.
    first = levels[0]
    tpots = sorted((r["total"] - r["ttft"]) / 5 for r in first["results"])
    assert first["level"]["tpot_p50"] == round(tpots[1], 3) and first["level"]["tpot_p99"] == round(tpots[2], 3)
    # Speculation off in the same server: every request says so, and the server drafts nothing for it.
    code = main(["loadgen", "--url", server.url, "--api-key", API_KEY, "--concurrency", "2", "--requests", "2",
                 "--max-tokens", "6", "--num-speculative-tokens", "0", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["body"]["num_speculative_tokens"] == 0 and report["levels"][0]["level"]["ok"] == 2
    assert all(r["mean_tokens_per_step"] == 1.0 for r in report["levels"][0]["results"])
    assert main(["loadgen", "--url", server.url, "--num-speculative-tokens", "-1"]) == 2


def test_tpot_is_the_time_per_token_after_the_first():
    assert Result(status=200, ttft=0.5, total=2.0, completion_tokens=4).tpot == 0.5
    assert Result(status=200, ttft=0.5, total=0.5, completion_tokens=1).tpot is None
    assert Result(status=503).tpot is None


@pytest.mark.parametrize("kind", ["model", "suffix"])
def test_quickdraft_serve_command_starts_logs_memory_and_answers(target, draft, tmp_path, kind):
    """The real command in a subprocess, on tiny models saved to folders: a draft model, or the
    suffix cache alone (--draft suffix, over a store of --suffix-cache-mb)."""
    for model in (target, draft):
        model.module.save_pretrained(tmp_path / model.name)
        model.tokenizer.save_pretrained(tmp_path / model.name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "quickdraft", "serve", "--target", str(tmp_path / target.name),
               "--draft", str(tmp_path / draft.name) if kind == "model" else "suffix", "--suffix-cache-mb", "2",
               "-k", "2", "--dtype", "float32", "--device", "cpu",
               "--port", str(port), "--served-model-name", MODEL, "--kv-cache-budget-mb", "1"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stderr.read()
            assert time.monotonic() < deadline, "quickdraft serve did not start"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            time.sleep(0.2)
        response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30,
                              json={"model": MODEL, "messages": MESSAGES, "max_tokens": 5, "temperature": 0})
        assert response.json()["choices"][0]["message"]["content"] == plain_greedy(
            target, chat_prompt_ids(target.tokenizer, MESSAGES), 5)
        limit = "quickdraft_suffix_cache_limit_bytes 2.097152e+06"
        assert limit in httpx.get(f"http://127.0.0.1:{port}/metrics").text  # in front of the model, or alone
    finally:
        process.terminate()
        log = process.communicate(timeout=30)[1]
    assert process.returncode in (0, -signal.SIGTERM), log  # uvicorn re-raises the signal it handled
    assert "target" in log and "draft" in log and "weights" in log and "KV cache budget 1 MiB" in log


def test_metrics_count_a_generation_s_steps_by_kind_and_position():
    from prometheus_client.parser import text_string_to_metric_families

    from quickdraft.server.metrics import ServerMetrics
    from quickdraft.stats import DecodeStats

    stats = DecodeStats(new_tokens=10)
    for drafted, accepted, lookup in [(3, 3, True), (3, 1, False), (2, 0, False), (3, 2, True)]:
        stats.record_step(drafted, accepted, lookup)
    metrics = ServerMetrics()
    metrics.record_generation(stats)
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}
    assert values[("quickdraft_spec_steps_total", ())] == 4
    assert values[("quickdraft_spec_lookup_steps_total", ())] == 2
    assert values[("quickdraft_spec_accepted_tokens_total", ())] == 6
    assert [values[("quickdraft_spec_accepted_tokens_by_position_total", (("position", str(i)),))]
            for i in range(3)] == [3, 2, 1]
    assert values[("quickdraft_spec_mean_accepted_length", ())] == pytest.approx((6 + 4) / 4)


# -- every sampling option through the official client ------------------------------------------

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
          "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture(scope="module")
def json_pair() -> tuple[LoadedModel, LoadedModel]:
    """Tiny models over JSON's characters, with a byte-level tokenizer llguidance reads."""
    from conftest import json_model

    target, draft = json_model(11), json_model(12)
    target.tokenizer.chat_template = draft.tokenizer.chat_template = CHAT_TEMPLATE
    return target, draft


@pytest.fixture(scope="module")
def options_client(json_pair) -> Iterator[openai.OpenAI]:
    with serve(speculative(*json_pair), max_queue=8) as running:
        yield openai.OpenAI(base_url=f"{running.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)


def test_the_openai_client_drives_every_sampling_option(options_client, json_pair):
    target, draft = json_pair
    prompt = '{"a":1,"b":[true]}'
    options = dict(temperature=0.9, top_p=0.95, presence_penalty=0.5, frequency_penalty=0.3, seed=7,
                   logit_bias={"5": -2.0, "9": 1.5})
    extra = dict(top_k=12, min_p=0.02, repetition_penalty=1.2, stop_token_ids=[8])
    out = options_client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, n=2, logprobs=2,
                                            extra_body=extra, **options)
    library = speculative(target, draft).generate_choices(prompt, SamplingParams(
        max_new_tokens=10, n=2, logprobs=True, top_logprobs=2, **{**options, **extra, "stop_token_ids": (8,)}))
    assert [c.index for c in out.choices] == [0, 1]
    for choice, expected in zip(out.choices, library):
        assert choice.text == expected.text and choice.finish_reason == expected.finish_reason
        # The server's batch attends its rows with a mask, the library's verification one position
        # at a time: the same logits up to float32 rounding (a few units in the last place).
        assert choice.logprobs.token_logprobs == pytest.approx([e.logprob for e in expected.logprobs], abs=1e-5)
        assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
    assert out.usage.completion_tokens == sum(len(e.token_ids) for e in library)

    # chat, a JSON schema, logprobs, two choices: whole and streamed
    messages = [{"role": "user", "content": "a b"}]
    response_format = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}
    chat = options_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, n=2, seed=1,
                                                  temperature=1.0, response_format=response_format, logprobs=True,
                                                  top_logprobs=3)
    for choice in chat.choices:
        doc = json.loads(choice.message.content)
        assert set(doc) == {"a", "b"} and 0 <= doc["a"] <= 99 and len(doc["b"]) <= 2
        # one entry per generated token, the end token included (as vLLM reports them)
        assert "".join(t.token for t in choice.logprobs.content) == choice.message.content + "</s>"
        assert all(len(t.top_logprobs) == 3 for t in choice.logprobs.content)
    streamed = options_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, n=2, seed=1,
                                                      temperature=1.0, response_format=response_format, stream=True)
    texts = ["", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in chat.choices]

    # json_object, and the regex extension
    obj = options_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0,
                                                 response_format={"type": "json_object"},
                                                 logit_bias={str(target.tokenizer.convert_tokens_to_ids("}")): 8})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    regex = options_client.completions.create(model=MODEL, prompt="ab", max_tokens=8, temperature=1.0, seed=3,
                                              extra_body={"regex": "[ab]{2,4}"})
    assert regex.choices[0].text and set(regex.choices[0].text) <= {"a", "b"} and 2 <= len(regex.choices[0].text) <= 4

    # what cannot be compiled, or is out of range, is a 400 naming the parameter
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}
    with pytest.raises(openai.BadRequestError, match="nope") as error:
        options_client.chat.completions.create(model=MODEL, messages=messages, response_format=bad_schema)
    assert error.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError, match="regular|compiled") as error:
        options_client.completions.create(model=MODEL, prompt="ab", extra_body={"regex": "("})
    with pytest.raises(openai.BadRequestError, match="logit_bias") as error:
        options_client.completions.create(model=MODEL, prompt="ab", logit_bias={"3": 150})
    assert error.value.body["param"] == "logit_bias"


def test_loadgen_workloads_build_code_edits_and_second_turns_after_the_first_answers():
    from quickdraft.bench.workloads import humaneval_problems
    from quickdraft.server.loadgen import workload_messages

    asked: list[list[dict]] = []
    turns = workload_messages("multi-turn", 3, lambda history: asked.append(history) or f"answer {len(asked)}")
    assert [[m["role"] for m in t] for t in turns] == [["user", "assistant", "user"]] * 3
    assert [t[1]["content"] for t in turns] == ["answer 1", "answer 2", "answer 3"]
    assert [t[0] for t in turns] == [h[0] for h in asked]  # each first turn asked once, as sent
    edits = workload_messages("code-edit", 2, lambda history: "")
    first = humaneval_problems()[0]
    assert first["prompt"] + first["canonical_solution"] in edits[0][0]["content"]
    passages = workload_messages("extraction", 2, lambda history: "")
    assert len(passages) == 2 and all(p[0]["content"].startswith("Extract from this news passage") for p in passages)
    assert passages[0][0]["content"] != passages[1][0]["content"]


def test_loadgen_multi_turn_against_a_real_server(server, tmp_path):
    out = tmp_path / "turns.json"
    code = main(["loadgen", "--url", server.url, "--api-key", API_KEY, "--workload", "multi-turn",
                 "--concurrency", "2", "--requests", "2", "--max-tokens", "4", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["workload"] == "multi-turn" and report["levels"][0]["level"]["ok"] == 2
